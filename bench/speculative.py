"""Speculative decoding on this machine's CPU, one thread: tokens per pass and ms per token of plain decoding
(NoDraft), prompt lookup and early exit (engine/speculative.py), greedy, for k guesses a pass.

    HF_HUB_OFFLINE=1 python3 bench/speculative.py           # lookup k = 1…8, early exit k = 2 at every n (21 min)
    HF_HUB_OFFLINE=1 python3 bench/speculative.py --quick   # lookup k = 2, 4, 8; early exit at the deepest n (8 min)
    HF_HUB_OFFLINE=1 python3 bench/speculative.py --early-exit-k 1 2 3 4 5 6 7 8   # early exit's whole sweep (hours)

Models and prompts are bench/speculative_peer.py's (where each case is checked against transformers): `embedded`
(SmolLM2-135M-Instruct, 30 layers, chat template on) and `embedded-zh` (Gemma 3 270M, 18 layers, a base model), each
with a prompt whose answer quotes it (`quote`) and one whose answer does not (`free`); 48 new tokens, float32, the
engine's converted folders. Early exit drafts with the model's first n layers, n in EARLY_EXIT_LAYERS. It is the
slow part: on a CPU a guess costs n/L of a step plus a whole lm_head (Gemma's 262k-row lm_head is most of its
step), and a verify pass over k + 1 rows costs 1.5 to 3 times a one-row step (the second table), so by default it
runs at one k only. (The times: this 2-core machine, one thread.)

Each configuration is timed as the median of 3 runs; the runs are interleaved (round after round over every
configuration, with a plain run before the lookup runs and another before the early-exit runs: plain's median is
over 6), so a slow spell of the machine falls on every configuration alike. A run's first pass (the prefill, with
the first guesses) is not timed: ms/token is the wall time of the later passes over the tokens they added;
tokens/pass counts every pass. "speed-up" is plain's ms/token over the configuration's; "draft" is the draft's share
of the timed passes' time. Every run's tokens are checked equal to plain decoding's (greedy). The second table gives
the median time of a verify pass by the rows it fed (1 + guesses): what a guess costs even when it is kept.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import engine  # noqa: E402
from bench.speculative_peer import MODELS, folder  # noqa: E402
from engine.drafts import Draft, EarlyExit, NoDraft, PromptLookup  # noqa: E402
from engine.errors import KvscopeError  # noqa: E402
from engine.prompt import tokenize_prompt  # noqa: E402
from engine.speculative import SpeculativeGeneration  # noqa: E402

NEW_TOKENS = 48
REPEATS = 3
EARLY_EXIT_LAYERS = {"embedded": (4, 10, 20), "embedded-zh": (3, 6, 12)}
LOOKUP_K = tuple(range(1, 9))
EARLY_EXIT_K = (2,)
QUICK_LOOKUP_K = (2, 4, 8)  # and early exit at the deepest n only


@dataclass(frozen=True)
class Config:
    draft: str  # "none", "lookup" or "early_exit"
    k: int = 0
    layers: int = 0

    def make(self, model) -> Draft:
        if self.draft == "none":
            return NoDraft()
        if self.draft == "lookup":
            return PromptLookup(self.k)
        return EarlyExit(self.k, self.layers, model.info.layers)

    @property
    def label(self) -> str:
        return {"none": "plain", "lookup": "lookup", "early_exit": f"early exit n={self.layers}"}[self.draft]


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    passes: list  # VerifyPass
    decode_ms: float  # the wall time of every pass after the first

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / (len(self.tokens) - len(self.passes[0].added))

    @property
    def draft_share(self) -> float:
        later = self.passes[1:]
        return sum(p.draft_ms for p in later) / max(sum(p.draft_ms + p.verify_ms for p in later), 1e-9)


def timed_run(model, ids: list[int], config: Config, tokens: int) -> Run:
    with SpeculativeGeneration(model, ids, config.make(model), max_new_tokens=tokens) as generation:
        generation.step()  # the prefill's pass: not timed
        start = time.perf_counter()
        generation.run()
        return Run(list(generation.generated), list(generation.passes), 1000 * (time.perf_counter() - start))


def rounds(spec: str, lookup_k: tuple[int, ...], early_k: tuple[int, ...], deepest: bool) -> list[Config]:
    """One round's configurations, in order: a plain run before each draft's group."""
    layers = EARLY_EXIT_LAYERS[spec][-1:] if deepest else EARLY_EXIT_LAYERS[spec]
    groups = [[Config("lookup", k) for k in lookup_k], [Config("early_exit", k, n) for n in layers for k in early_k]]
    return [config for group in groups if group for config in [Config("none")] + group]


def bench(
    specs: list[str], prompts: list[str], lookup_k, early_k, deepest: bool, repeats: int, tokens: int
) -> tuple[dict, dict, dict]:
    """(model, prompt, config) → its runs; (model, rows fed) → verify ms of every timed pass; (model, prompt,
    config) → the errors of runs the engine refused (reported, not hidden: the other runs go on)."""
    models = {spec: engine.load_model(folder(spec), device="cpu", dtype=torch.float32) for spec in specs}
    ids = {
        (spec, p): tokenize_prompt(models[spec], MODELS[spec].prompts[p], MODELS[spec].chat)
        for spec in specs
        for p in prompts
    }
    for (spec, _), prompt_ids in ids.items():  # warm up: the first passes of a process are slower
        timed_run(models[spec], prompt_ids, Config("none"), 8)
    runs, verify, errors, start = defaultdict(list), defaultdict(list), defaultdict(list), time.perf_counter()
    for round_ in range(repeats):
        for (spec, prompt), prompt_ids in ids.items():
            for config in rounds(spec, lookup_k, early_k, deepest):
                try:
                    run = timed_run(models[spec], prompt_ids, config, tokens)
                except KvscopeError as error:
                    errors[spec, prompt, config].append(f"{type(error).__name__}: {error}")
                    continue
                runs[spec, prompt, config].append(run)
                for p in run.passes[1:]:
                    verify[spec, len(p.fed)].append(p.verify_ms)
            print(
                f"round {round_ + 1}/{repeats}: {spec} {prompt} done at {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs, verify, errors


def table(runs: dict, errors: dict) -> list[str]:
    lines = [
        "| model | prompt | draft | k | passes | tokens/pass | ms/token | speed-up | draft | tokens = plain's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = {
        (spec, prompt): statistics.median(r.ms_per_token for r in found)
        for (spec, prompt, config), found in runs.items()
        if config.draft == "none"
    }
    for (spec, prompt, config), found in runs.items():
        if errors.get((spec, prompt, config)):
            lines.append(
                f"| {spec} | {prompt} | {config.label} | {config.k or '–'} | "
                f"{len(errors[spec, prompt, config])} of the runs failed: {errors[spec, prompt, config][0]} |"
            )
        if not found:
            continue
        reference = runs[spec, prompt, Config("none")][0].tokens
        ms = statistics.median(r.ms_per_token for r in found)
        first = found[0]
        lines.append(
            f"| {spec} | {prompt} | {config.label} | {config.k or '–'} | {len(first.passes)} | "
            f"{len(first.tokens) / len(first.passes):.2f} | {ms:.1f} | {plain[spec, prompt] / ms:.2f}× | "
            f"{100 * statistics.median(r.draft_share for r in found):.0f}% | "
            f"{'yes' if all(r.tokens == reference for r in found) else '**no**'} |"
        )
    return lines


def verify_table(verify: dict) -> list[str]:
    specs = sorted({spec for spec, _ in verify})
    rows = sorted({fed for _, fed in verify})
    lines = [
        "| rows fed | " + " | ".join(f"{spec}: verify ms (passes)" for spec in specs) + " |",
        "|---" * (len(specs) + 1) + "|",
    ]
    for fed in rows:
        cells = [
            f"{statistics.median(verify[spec, fed]):.1f} ({len(verify[spec, fed])})" if verify.get((spec, fed)) else "–"
            for spec in specs
        ]
        lines.append(f"| {fed} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help=f"lookup k {QUICK_LOOKUP_K}, early exit at the deepest n only"
    )
    parser.add_argument("--lookup-k", type=int, nargs="*", help=f"default {LOOKUP_K}")
    parser.add_argument("--early-exit-k", type=int, nargs="*", help=f"default {EARLY_EXIT_K}")
    parser.add_argument("--models", nargs="*", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--prompts", nargs="*", choices=["quote", "free"], default=["quote", "free"])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--tokens", type=int, default=NEW_TOKENS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lookup_k = tuple(args.lookup_k if args.lookup_k is not None else QUICK_LOOKUP_K if args.quick else LOOKUP_K)
    early_k = tuple(args.early_exit_k if args.early_exit_k is not None else EARLY_EXIT_K)
    start = time.perf_counter()
    runs, verify, errors = bench(args.models, args.prompts, lookup_k, early_k, args.quick, args.repeats, args.tokens)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, {args.tokens} new tokens, greedy, median "
        f"of {args.repeats} runs; ms/token over the passes after the prefill's\n"
    )
    for key in errors:  # a configuration whose every run failed
        runs.setdefault(key, [])
    print("\n".join(table(runs, errors)))
    print()
    print("\n".join(verify_table(verify)))
    print(f"\n{time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
