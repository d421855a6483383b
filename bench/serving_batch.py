"""Decode throughput of many requests served from one pool (engine.server.Server), by batch size: B requests of
the same prompt length decode together; the milliseconds of a decode step (one forward pass for all B) and the
tokens per second it gives, beside the costs view's formula (engine.timing.decode_step_bytes: the weights once plus
B requests' K/V, read per step) over this machine's measured read bandwidth: the floor that formula puts under a
step. Where the measured curve leaves the floor, the step stops being bound by what it reads.

    HF_HUB_OFFLINE=1 python3 bench/serving_batch.py [--models embedded embedded-zh] [--batches 1 2 4 8 16 32]
        [--prompt-tokens 64] [--steps 12] [--threads 2]

Each model in the dtype the app holds it in. Each request's prompt is distinct (no shared blocks), and it ignores
EOS; max_num_seqs and the pool hold the whole batch, so every
step after the prefills decodes all B. The first decode step is not timed; the median of the others is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine  # noqa: E402
from engine.loader import AUTO  # noqa: E402
from engine.server import Server  # noqa: E402
from engine.timing import decode_step_bytes, peak_read_bandwidth  # noqa: E402

BLOCK = 16


def measure(model: engine.Model, batch: int, prompt_tokens: int, steps: int) -> float:
    """The median seconds of a decode step of `batch` requests."""
    per_request = -(-(prompt_tokens + steps + 2) // BLOCK)
    server = Server(
        model,
        num_blocks=batch * per_request + 1,
        block_size=BLOCK,
        max_num_seqs=batch,
        max_num_batched_tokens=max(512, prompt_tokens),
    )
    for i in range(batch):
        server.add(
            [(7 + 13 * i + 31 * j) % 5000 + 100 for j in range(prompt_tokens)], max_tokens=steps + 2, ignore_eos=True
        )
    times = []
    while not server.finished:
        start = time.perf_counter()
        report = server.step()
        spent = time.perf_counter() - start
        if not report.prefill and len(report.ran) == batch:
            times.append(spent)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["embedded", "embedded-zh"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bandwidth = peak_read_bandwidth()
    print(
        f"torch {torch.__version__}, {args.threads} threads, read bandwidth {bandwidth / 1e9:.1f} GB/s, "
        f"prompts of {args.prompt_tokens} tokens"
    )
    for spec in args.models:
        model = engine.load_model(spec, device="cpu", dtype=AUTO)  # as the app holds it
        info = model.info
        print(
            f"\n{info.name} ({info.dtype})\n| B | ms / decode step | tokens / s | bytes read a step (formula) | "
            f"floor: bytes ÷ bandwidth | measured ÷ floor |\n|---|---|---|---|---|---|"
        )
        for batch in args.batches:
            seconds = measure(model, batch, args.prompt_tokens, args.steps)
            read = decode_step_bytes(info, args.prompt_tokens + args.steps // 2, batch)
            floor = read / bandwidth
            print(
                f"| {batch} | {seconds * 1000:.1f} | {batch / seconds:.0f} | {read / 1e6:.1f} MB | "
                f"{floor * 1000:.1f} ms | {seconds / floor:.1f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
