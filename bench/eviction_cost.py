"""What KV eviction costs on the embedded models, measured by the engine (`engine.eviction`), not assumed.

    HF_HUB_OFFLINE=1 python3 -m bench.eviction_cost [--models embedded embedded-zh] [--quick] \\
        [--plot docs/eviction-nll.png] [--json PATH]

The text is ui/text/texts/one-token-at-a-time.en.txt (ours, written from docs/teaching.md's points; the eviction view
streams its start), tokenized as the tokenizer encodes it (Gemma's BOS first). Each model in the dtype the app
holds it in.
1. After the prefill (kvpress's press): PROMPTS prompts of PROMPT_TOKENS tokens cut from the text; every policy at
   each of RATIOS. The next token's KL(full ‖ evicted) on the softmax of the logits (nats), whether its top-1 is the
   full cache's, and how many of GREEDY greedy tokens equal the full cache's before the first difference.
2. During decode, teacher-forced: each prompt's first DECODE_PREFILL tokens prefilled in full, the rest fed pass by
   pass (`EvictionRun.step(input_id)`) beside the full cache fed the same, under DecodeBudget(target, INTERVAL) for
   every policy and StreamingWindow(4, target − 4); KL and top-1 of every pass from the INTERVAL-th on (the first to
   read a budget's evicted cache).
3. NLL by position (StreamingLLM's experiment): the whole text teacher-forced (`stream_nll`) through the full cache,
   a window of NLL_WINDOW positions alone, and 4 sinks plus NLL_WINDOW − 4; means per BUCKET positions, plotted.
4. Time, per pass, interleaved (every configuration's pass in turn, so load drift hits all alike): the full cache,
   each policy under DecodeBudget(TIME_TARGET, TIME_INTERVAL) (its passes that evict and those that only read the
   mask) and the streaming window, over a TIME_CONTEXT-token prompt; what compressing at ratio 0.5 adds to the
   prefill. Medians; the load average is printed beside them (a shared machine's timings move with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plotly.graph_objects as go  # noqa: E402
import torch  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

import engine  # noqa: E402
from engine.errors import InvalidSettingError  # noqa: E402
from engine.eviction import EVICTION_POLICIES, DecodeBudget, EvictionRun, Policy, StreamingWindow, stream_nll  # noqa: E402
from engine.eviction.policies import SNAPKV_SCORES  # noqa: E402
from engine.eviction.settings import check_budget  # noqa: E402
from engine.loader import AUTO  # noqa: E402

TEXT = Path(__file__).resolve().parent.parent / "ui" / "text" / "texts" / "one-token-at-a-time.en.txt"
N_SINK = 4  # kvpress's and the StreamingLLM paper's sinks
SNAPKV_WINDOW = 64  # kvpress's window_size, after a prefill; during decode INTERVAL − 1 (it must be under the interval)


@dataclass(frozen=True)
class Plan:
    prompts: int = 6
    prompt_tokens: int = 256
    ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    greedy: int = 8
    decode_prefill: int = 128
    targets: tuple[int, ...] = (32, 64)
    interval: int = 16
    decode_prompts: int = 2
    nll_window: int = 256
    bucket: int = 64
    nll_tokens: int | None = None  # None: the whole text
    time_context: int = 512
    time_target: int = 256
    time_interval: int = 4
    time_passes: int = 48
    time_prefills: int = 3


FULL_PLAN = Plan()
QUICK_PLAN = Plan(
    prompts=2, greedy=4, decode_prompts=1, targets=(32,), nll_tokens=1024, time_passes=16, time_prefills=1
)


# -- what is measured -----------------------------------------------------------------------------


def kl(full: torch.Tensor, evicted: torch.Tensor) -> float:
    """KL(full ‖ evicted) in nats: Σ p (log p − log q), p and q the softmax of each logits vector, in float64."""
    log_p, log_q = torch.log_softmax(full.double(), dim=-1), torch.log_softmax(evicted.double(), dim=-1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens a and b share before the first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def policy(name: str, decoding: bool, interval: int) -> Policy:
    if name in SNAPKV_SCORES:
        return Policy(name, window_size=interval - 1 if decoding else SNAPKV_WINDOW)
    return Policy(name, n_sink=N_SINK)


def decoding(interval: int, target: int) -> list[str]:
    """The policies that can keep a decode budget at this interval (the engine's own check): not PyramidKV's or
    AdaKV's budgets, nor expected attention with no query past its sinks."""
    names = []
    for name in EVICTION_POLICIES:
        try:
            check_budget(policy(name, True, interval), DecodeBudget(target, interval))
        except InvalidSettingError:
            continue
        names.append(name)
    return names


# -- the text --------------------------------------------------------------------------------------


def text_ids(model: engine.Model) -> tuple[list[int], list[int]]:
    """(the whole text's ids as the tokenizer encodes it, the ids it puts before the text: Gemma's BOS). Not the
    app's prompt path: that splits the added tokens a user types (Gemma's blank line, one token, would be two)."""
    text = TEXT.read_text()
    ids = model.tokenizer.encode(text)
    bare = model.tokenizer.encode(text, add_special_tokens=False)
    head = ids[: len(ids) - len(bare)]
    assert ids == head + bare, "the tokenizer adds tokens after the text too"
    return ids, head


def cut_prompts(ids: list[int], head: list[int], count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens: the tokenizer's own leading ids, then consecutive pieces of the text."""
    body, size = ids[len(head) :], length - len(head)
    if count * size > len(body):
        raise SystemExit(f"the text has {len(body)} tokens, too few for {count} prompts of {length}")
    return [head + body[i * size : (i + 1) * size] for i in range(count)]


# -- 1. after the prefill -----------------------------------------------------------------------------


def greedy(model, prompt: list[int], chosen: Policy | None, ratio: float, steps: int) -> tuple[torch.Tensor, list[int]]:
    """The first answer token's logits and `steps` greedy tokens."""
    run = EvictionRun(model, prompt, chosen, compression_ratio=ratio, max_new_tokens=steps, keep_full_steps=1)
    logits = run.prefill().logits
    while not run.finished:
        run.step()
    run.close()
    return logits, list(run.generated)


def after_prefill(model, prompts: list[list[int]], plan: Plan) -> dict:
    rows: dict[str, dict[str, list]] = {}
    for prompt in prompts:
        full_logits, full_tokens = greedy(model, prompt, None, 0.0, plan.greedy)
        for name in EVICTION_POLICIES:
            for ratio in plan.ratios:
                logits, tokens = greedy(model, prompt, policy(name, False, plan.interval), ratio, plan.greedy)
                row = rows.setdefault(f"{name}@{ratio}", {"kl": [], "top1": [], "greedy": []})
                row["kl"].append(kl(full_logits, logits))
                row["top1"].append(int(logits.argmax()) == int(full_logits.argmax()))
                row["greedy"].append(agreeing_prefix(full_tokens, tokens))
        print(f"  prompt done: {len(rows)} cases", flush=True)
    return {
        key: {
            "kl": statistics.mean(r["kl"]),
            "kl_max": max(r["kl"]),
            "top1": statistics.mean(r["top1"]),
            "greedy": statistics.mean(r["greedy"]),
            "greedy_of": plan.greedy,
            "prompts": len(r["kl"]),
        }
        for key, r in rows.items()
    }


# -- 2. during decode, teacher-forced ---------------------------------------------------------------


def during_decode(model, prompts: list[list[int]], plan: Plan) -> dict:
    scores: dict[str, dict[str, list]] = {}
    for prompt in prompts:
        head, fed = prompt[: plan.decode_prefill], prompt[plan.decode_prefill :]
        runs = {"full": EvictionRun(model, head, max_new_tokens=len(fed) + 1, keep_full_steps=1)}
        for target in plan.targets:
            for name in decoding(plan.interval, target):
                runs[f"{name}@{target}"] = EvictionRun(
                    model,
                    head,
                    policy(name, True, plan.interval),
                    budget=DecodeBudget(target, plan.interval),
                    max_new_tokens=len(fed) + 1,
                    keep_full_steps=1,
                )
            runs[f"stream@{target}"] = EvictionRun(
                model,
                head,
                budget=StreamingWindow(N_SINK, target - N_SINK),
                max_new_tokens=len(fed) + 1,
                keep_full_steps=1,
            )
        for i, token in enumerate([None, *fed]):  # None: the prefill, whose pass reads the last prompt token
            steps = {key: run.prefill() if token is None else run.step(input_id=token) for key, run in runs.items()}
            if i < plan.interval:
                continue
            full = steps.pop("full").logits
            for key, step in steps.items():
                row = scores.setdefault(key, {"kl": [], "top1": []})
                row["kl"].append(kl(full, step.logits))
                row["top1"].append(int(step.logits.argmax()) == int(full.argmax()))
        for run in runs.values():
            run.close()
        print(f"  prompt done: {len(runs)} runs, {len(fed) + 1} passes each", flush=True)
    return {
        key: {"kl": statistics.mean(r["kl"]), "top1": statistics.mean(r["top1"]), "passes": len(r["kl"])}
        for key, r in scores.items()
    }


# -- 3. NLL by position --------------------------------------------------------------------------------


def nll_by_position(model, ids: list[int], plan: Plan) -> dict:
    n = (len(ids) - 1) // plan.bucket * plan.bucket if plan.nll_tokens is None else plan.nll_tokens
    ids = ids[: n + 1]
    windows = {
        "full cache": None,
        f"window of {plan.nll_window}": StreamingWindow(0, plan.nll_window),
        f"{N_SINK} sinks + window of {plan.nll_window - N_SINK}": StreamingWindow(N_SINK, plan.nll_window - N_SINK),
    }
    out = {"positions": n, "bucket": plan.bucket, "window": plan.nll_window, "curves": {}}
    for label, window in windows.items():
        clock = time.perf_counter()
        nll = stream_nll(model, ids, window)
        out["curves"][label] = {
            "buckets": nll.view(-1, plan.bucket).mean(dim=1).tolist(),
            "before": float(nll[: plan.nll_window + 1].mean()),  # passes that read every position either way
            "after": float(nll[plan.nll_window + 1 :].mean()),
        }
        print(f"  {label}: {time.perf_counter() - clock:.1f} s", flush=True)
    return out


# -- 4. time ---------------------------------------------------------------------------------------------


def step_times(model, ids: list[int], plan: Plan) -> dict:
    prompt, fed = ids[: plan.time_context], ids[plan.time_context : plan.time_context + plan.time_passes]
    if len(fed) < plan.time_passes:
        raise SystemExit(f"the text is too short for {plan.time_passes} timed passes after {plan.time_context} tokens")
    make = {"full cache": lambda: EvictionRun(model, prompt, max_new_tokens=len(fed) + 1, keep_full_steps=1)}
    for name in decoding(plan.time_interval, plan.time_target):
        make[name] = lambda name=name: EvictionRun(
            model,
            prompt,
            policy(name, True, plan.time_interval),
            max_new_tokens=len(fed) + 1,
            keep_full_steps=1,
            budget=DecodeBudget(plan.time_target, plan.time_interval),
        )
    make["streaming window"] = lambda: EvictionRun(
        model,
        prompt,
        budget=StreamingWindow(N_SINK, plan.time_target - N_SINK),
        max_new_tokens=len(fed) + 1,
        keep_full_steps=1,
    )
    load = [os.getloadavg()[0]]
    runs = {key: build() for key, build in make.items()}
    for run in runs.values():
        run.prefill()
    passes: dict[str, dict[str, list[float]]] = {key: {"evicts": [], "reads": []} for key in runs}
    for token in fed:
        for key, run in runs.items():
            clock = time.perf_counter()
            step = run.step(input_id=token)
            ms = 1000 * (time.perf_counter() - clock)
            passes[key]["evicts" if any(e is not None for e in step.evictions) else "reads"].append(ms)
    for run in runs.values():
        run.close()
    load.append(os.getloadavg()[0])
    prefill: dict[str, list[float]] = {key: [] for key in ["none", *EVICTION_POLICIES]}
    for _ in range(plan.time_prefills):
        for key in prefill:
            chosen = None if key == "none" else policy(key, False, plan.interval)
            run = EvictionRun(
                model,
                prompt,
                chosen,
                compression_ratio=0.0 if key == "none" else 0.5,
                max_new_tokens=1,
                keep_full_steps=1,
            )
            clock = time.perf_counter()
            run.prefill()
            prefill[key].append(1000 * (time.perf_counter() - clock))
            run.close()
    load.append(os.getloadavg()[0])
    median = statistics.median
    return {
        "context": plan.time_context,
        "target": plan.time_target,
        "interval": plan.time_interval,
        "passes": plan.time_passes,
        "load": load,
        "step": {
            key: {kind: (median(ms) if ms else None) for kind, ms in p.items()}
            | {"n_evicts": len(p["evicts"]), "n_reads": len(p["reads"])}
            for key, p in passes.items()
        },
        "prefill": {key: median(ms) for key, ms in prefill.items()},
    }


# -- one model -------------------------------------------------------------------------------------------


def measure(spec: str, plan: Plan) -> dict:
    clock = time.perf_counter()
    model = engine.load_model(spec, device="cpu", dtype=AUTO)
    torch.set_grad_enabled(False)
    ids, head = text_ids(model)
    print(f"{model.info.name} ({model.info.dtype}): the text is {len(ids)} tokens", flush=True)
    prompts = cut_prompts(ids, head, plan.prompts, plan.prompt_tokens)
    result = {
        "model": model.info.name,
        "dtype": model.info.dtype,
        "text_tokens": len(ids),
        "plan": vars(plan),
        "threads": torch.get_num_threads(),
    }
    print("after the prefill", flush=True)
    result["after_prefill"] = after_prefill(model, prompts, plan)
    print("during decode", flush=True)
    result["during_decode"] = during_decode(model, prompts[: plan.decode_prompts], plan)
    print("NLL by position", flush=True)
    result["nll"] = nll_by_position(model, ids, plan)
    print("time", flush=True)
    result["time"] = step_times(model, ids, plan)
    result["seconds"] = time.perf_counter() - clock
    return result


# -- the report ------------------------------------------------------------------------------------------


def quality_table(result: dict) -> str:
    """One row per policy: KL and top-1 after a prefill eviction at each ratio, then under each decode budget."""
    plan = result["plan"]
    ratios, targets = plan["ratios"], plan["targets"]
    head = ["policy"] + [f"r={r}: KL / top-1 / greedy" for r in ratios] + [f"budget {t}: KL / top-1" for t in targets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pre, dec = result["after_prefill"], result["during_decode"]
    for name in [*EVICTION_POLICIES, "stream"]:
        cells = [name if name != "stream" else f"streaming window ({N_SINK} sinks)"]
        for r in ratios:
            row = pre.get(f"{name}@{r}")
            cells.append("—" if row is None else f"{row['kl']:.3f} / {row['top1']:.0%} / {row['greedy']:.1f}")
        for t in targets:
            row = dec.get(f"{name}@{t}")
            cells.append("—" if row is None else f"{row['kl']:.3f} / {row['top1']:.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_table(result: dict) -> str:
    t = result["time"]
    full = t["step"]["full cache"]["reads"]

    def ms(value: float | None, sign: str = "") -> str:
        return "—" if value is None else f"{value:{sign}.1f} ms"

    lines = [
        "| policy | pass that evicts | pass that only reads the mask | added by an eviction | prefill at r=0.5 "
        "(added) |",
        "|---|---|---|---|---|",
        f"| full cache | — | {ms(full)} | — | {t['prefill']['none']:.0f} ms |",
    ]
    for key in [key for key in [*EVICTION_POLICIES, "streaming window"] if key in t["step"]]:
        s = t["step"][key]
        added = None if s["evicts"] is None else s["evicts"] - full
        pre = t["prefill"].get(key)
        pre = "—" if pre is None else f"{pre:.0f} ms ({pre - t['prefill']['none']:+.0f})"
        lines.append(f"| {key} | {ms(s['evicts'])} | {ms(s['reads'])} | {ms(added, '+')} | {pre} |")
    return "\n".join(lines)


def nll_table(results: list[dict]) -> str:
    window = results[0]["nll"]["window"]
    lines = [
        f"| model | cache | mean NLL, positions 0–{window} | mean NLL, positions {window + 1}– |",
        "|---|---|---|---|",
    ]
    for result in results:
        for label, curve in result["nll"]["curves"].items():
            lines.append(f"| {result['model']} | {label} | {curve['before']:.3f} | {curve['after']:.3f} |")
    return "\n".join(lines)


def nll_figure(results: list[dict]) -> go.Figure:
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    fig = make_subplots(
        rows=1,
        cols=len(results),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=[f"{r['model']} ({r['dtype']})" for r in results],
    )
    for col, result in enumerate(results, start=1):
        nll = result["nll"]
        for (label, curve), color in zip(nll["curves"].items(), colors):
            x = [i * nll["bucket"] + nll["bucket"] / 2 for i in range(len(curve["buckets"]))]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=curve["buckets"],
                    name=label,
                    mode="lines+markers",
                    legendgroup=label,
                    showlegend=col == 1,
                    line=dict(color=color, width=2),
                    marker=dict(size=5),
                ),
                row=1,
                col=col,
            )
        fig.add_vline(x=nll["window"], line=dict(color="#888", dash="dot"), row=1, col=col)
        fig.update_xaxes(title_text="position (mean over each 64)", row=1, col=col)
    fig.update_yaxes(title_text="NLL of the next token (nats)", row=1, col=1)
    fig.update_layout(
        width=1200,
        height=520,
        template="plotly_white",
        font=dict(size=14),
        legend=dict(orientation="h", y=-0.2, x=0.5, xanchor="center"),
        margin=dict(l=70, r=20, t=50, b=110),
    )
    return fig


def render_png(fig: go.Figure, path: Path) -> None:
    """The figure drawn by plotly.js in headless Chromium (offline: the library is inlined), saved as a PNG."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        page_path = Path(folder) / "figure.html"
        page_path.write_text(fig.to_html(include_plotlyjs=True, full_html=True, config={"staticPlot": True}))
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": fig.layout.width, "height": fig.layout.height})
            page.goto(page_path.as_uri())
            page.wait_for_selector(".main-svg")
            page.locator(".plotly-graph-div").screenshot(path=str(path))
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["embedded", "embedded-zh"])
    parser.add_argument("--quick", action="store_true", help="fewer prompts, passes and positions (a minute or two)")
    parser.add_argument("--plot", default="docs/eviction-nll.png", help="the NLL-by-position PNG ('' for none)")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    results = [measure(spec, plan) for spec in args.models]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    for result in results:
        t = result["time"]
        print(f"\n## {result['model']} ({result['dtype']}), {result['seconds']:.0f} s\n\n{quality_table(result)}\n")
        print(
            f"Time: a {t['context']}-token prompt, budget {t['target']} every {t['interval']} passes, "
            f"{t['passes']} passes; load average {' → '.join(f'{x:.1f}' for x in t['load'])}\n"
        )
        print(time_table(result))
    print(f"\n{nll_table(results)}")
    if args.plot:
        render_png(nll_figure(results), Path(args.plot))
        print(f"\n{args.plot}")


if __name__ == "__main__":
    main()
