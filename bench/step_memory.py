"""Peak memory of the worst run the app allows, for one page and for several pages at once.

    HF_HUB_OFFLINE=1 [KVSCOPE_DTYPE=bfloat16] python bench/step_memory.py [--pages 1 8] [--splits N] [--block-size B]
        [--steps 128] [--model embedded|qwen3-shape|FOLDER] [--one-link]

Each measurement runs in a fresh subprocess (the resident high-water mark, `ru_maxrss`, only grows):
load the embedded model, note the resident memory, then run `pages` browser-generation runs at once in
threads, as Streamlit does, each doing what a worst-case link asks: a 382-token prompt, the most KV
splits and the smallest block size the limits allow, `steps` decode steps, then the attention
view's full heatmap, the KV view's cached K/V and a step back past the kept traces (a replay).
Reported: the peak resident memory of the process and its growth over the loaded model (after one
short warm-up pass, which touches every weight page). Defaults
come from `ui.host.limits` (KVSCOPE_STEP_MEMORY_MB, KVSCOPE_DTYPE and the other limits), so a host can check
its own setting. `--model qwen3-shape`: random weights of Qwen3-0.6B's exact shape, saved in bfloat16 with
the embedded tokenizer (bench/engine_bench.py). `--one-link`: the pages open one link, as a class following its
teacher does, and share its run through one `RunStore` as the app's pages do. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 382  # the longest prompt the probe of issue 14 used (the default limit is 384)


def resident_mb() -> float:
    """Resident memory now, in MB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_mb() -> float:
    """The process's resident high-water mark, in MB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def prompt_of(tokenizer, tokens: int) -> str:
    """A text the tokenizer reads as exactly `tokens` tokens (no special tokens added by SmolLM2)."""
    words = " ".join(f"word{i % 97}" for i in range(tokens))
    ids = tokenizer.encode(words)[:tokens]
    text = tokenizer.decode(ids)
    assert len(tokenizer.encode(text)) == tokens, len(tokenizer.encode(text))
    return text


def one_page(model, limits, splits: int, block_size: int, steps: int, runs=None) -> None:
    """What one worst-case page costs: prefill, `steps` steps, the attention and KV views, one step back.
    runs: the RunStore pages share (None: the page's run is its own)."""
    import engine
    from ui.runs.run import RunConfig
    from ui.runs.runner import Runner

    runner = Runner(model, limits.cache_tokens, limits.full_traces, runs=runs)
    runner.configure(
        RunConfig(
            prompt=prompt_of(model.tokenizer, PROMPT_TOKENS),
            chat=False,
            sampling=engine.Sampling(),
            block_size=block_size,
            kv_splits=splits,
            policy="block",
            max_new_tokens=limits.max_new_tokens,
            max_prompt_tokens=limits.max_prompt_tokens,
        )
    )
    reached = runner.advance_to(steps)
    layer, head = model.info.layers - 1, model.info.q_heads - 1
    runner.full_attention(reached, layer, head)
    runner.cached_kv(layer, runner.generation.table.length)
    runner.trace(max(1, reached - limits.full_traces - 1))  # a slimmed step: replayed
    runner.close()


def measure(
    pages: int, splits: int | None, block_size: int | None, steps: int, spec: str = "embedded", one_link: bool = False
) -> dict:
    """In this process: load the model `spec` in the host's dtype, then run `pages` pages at once in threads
    (on one link: sharing one RunStore)."""
    import torch

    import engine
    from ui.host import memory
    from ui.host.limits import load_limits, step_limits
    from ui.runs.store import RunStore

    memory.tune_allocator()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    limits = load_limits()
    model = engine.load_model(spec, dtype=getattr(torch, limits.dtype))
    step = step_limits(limits, model.info)
    splits = splits or step.max_kv_splits
    block_size = block_size or step.min_block_size
    warm_up = engine.Generation(model, prompt_of(model.tokenizer, 16), max_new_tokens=2)
    warm_up.prefill()  # the first pass touches every weight page: a cost of the loaded server, not of a page
    warm_up.step()
    warm_up.close()
    loaded = resident_mb()
    errors: list[BaseException] = []
    runs = RunStore(limits.shared_runs_mb * 10**6) if one_link else None

    def run():
        try:
            one_page(model, limits, splits, block_size, steps, runs)
        except BaseException as error:  # noqa: BLE001 — reported below
            errors.append(error)

    start = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(pages)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {
        "model": model.info.name,
        "dtype": model.info.dtype,
        "pages": pages,
        "one_link": one_link,
        "kv_splits": splits,
        "block_size": block_size,
        "steps": steps,
        "step_memory_mb": limits.step_memory_mb,
        "loaded_mb": round(loaded),
        "peak_mb": round(peak_mb()),
        "extra_mb": round(peak_mb() - loaded),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, nargs="+", default=[1, 8], help="pages at once, one process each")
    parser.add_argument("--splits", type=int, default=None, help="default: the largest the limits allow")
    parser.add_argument("--block-size", type=int, default=None, help="default: the smallest the limits allow")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--model", default="embedded", help="embedded, qwen3-shape or a model folder")
    parser.add_argument("--one-link", action="store_true", help="the pages share one link's run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.pages[0], args.splits, args.block_size, args.steps, args.model, args.one_link)))
        return
    spec = args.model
    if spec == "qwen3-shape":
        import torch

        from bench.engine_bench import qwen3_shaped_folder
        from engine import embedded

        spec = qwen3_shaped_folder(torch.bfloat16, embedded.embedded_source())
    for pages in args.pages:
        command = [
            sys.executable,
            __file__,
            "--child",
            "--pages",
            str(pages),
            "--steps",
            str(args.steps),
            "--model",
            spec,
        ] + (["--one-link"] if args.one_link else [])
        for flag, value in (("--splits", args.splits), ("--block-size", args.block_size)):
            if value is not None:
                command += [flag, str(value)]
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        print(out.stdout.strip() or out.stderr.strip()[-2000:], flush=True)


if __name__ == "__main__":
    main()
