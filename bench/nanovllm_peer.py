"""Our continuous-batching scheduler (engine/scheduler.py) against nano-vllm's own scheduler and block manager, on
the same traces of arrivals: every step's kind (prefill or decode), which requests it runs with how many tokens
each and how many each had cached, and which it preempts, must be the same. Both are plain Python over token ids;
no model runs: each request's next token is a function of its id and length, the same on both sides.

    pip install xxhash   # nano-vllm's block hashes; its checkout needs nothing else here (torch, transformers)
    python3 bench/nanovllm_peer.py --nanovllm /path/to/nano-vllm [--traces 200] [--seed 0]

nano-vllm is read from its checkout: its modules load by path, without running its package's __init__ (which
imports the GPU model runner). Its Config asserts a block size that is a multiple of 256 and a model folder, so the
scheduler gets the five fields it reads in a namespace instead; `Sequence.block_size` is set to the trace's.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.scheduler import Request, Scheduler  # noqa: E402

EOS = 2


@dataclass
class Trace:
    """Arrivals (step, prompt ids, max_tokens, ignore_eos) and the pool and limits they meet."""

    arrivals: list[tuple[int, list[int], int, bool]]
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int


def next_token(request_id: int, length: int) -> int:
    """The token a request makes at `length` tokens: the same on both sides, EOS now and then."""
    value = (request_id * 7919 + length * 104729) % 97
    return EOS if value == 0 else 3 + value


def random_trace(rng: random.Random) -> Trace:
    block_size = rng.choice([2, 4, 8, 16])
    system = [rng.randrange(3, 60) for _ in range(rng.randrange(0, 4 * block_size))]  # a shared system prompt
    arrivals = []
    for _ in range(rng.randrange(1, 12)):
        own = [rng.randrange(3, 60) for _ in range(rng.randrange(1, 5 * block_size))]
        prompt = (system if rng.random() < 0.7 else []) + own or [5]
        if arrivals and rng.random() < 0.25:  # the same prompt again, at times a whole number of blocks long
            prompt = list(rng.choice(arrivals)[1])
            if rng.random() < 0.5 and len(prompt) >= block_size:
                prompt = prompt[:len(prompt) // block_size * block_size]
        arrivals.append((rng.randrange(0, 10), prompt, rng.randrange(1, 12), rng.random() < 0.5))
    longest = max(-(-(len(p) + m) // block_size) for _, p, m, _ in arrivals)
    num_blocks = rng.randrange(longest, longest * 4 + 1)  # tight pools preempt
    return Trace(sorted(arrivals, key=lambda a: a[0]), num_blocks, block_size, rng.randrange(1, 8),
                 rng.randrange(max(len(p) for _, p, _, _ in arrivals) // 2 + 1, 80))


def load_nanovllm(checkout: Path):
    """nano-vllm's scheduler and sequence modules, loaded from `checkout` without its package __init__."""
    package = types.ModuleType("nanovllm")
    package.__path__ = [str(checkout / "nanovllm")]
    sys.modules["nanovllm"] = package
    for name in ("nanovllm.engine",):
        sub = types.ModuleType(name)
        sub.__path__ = [str(checkout / "nanovllm" / "engine")]
        sys.modules[name] = sub
    modules = {}
    for name in ("sampling_params", "engine.sequence", "engine.block_manager", "engine.scheduler"):
        path = checkout / "nanovllm" / (name.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(f"nanovllm.{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"nanovllm.{name}"] = module
        if name == "engine.scheduler":  # its `from nanovllm.config import Config` is a type only
            sys.modules.setdefault("nanovllm.config", types.SimpleNamespace(Config=object))
        spec.loader.exec_module(module)
        modules[name] = module
    return modules


def run_theirs(modules, trace: Trace) -> list[tuple]:
    Sequence = modules["engine.sequence"].Sequence
    SamplingParams = modules["sampling_params"].SamplingParams
    Sequence.block_size = trace.block_size
    config = types.SimpleNamespace(max_num_seqs=trace.max_num_seqs, max_num_batched_tokens=trace.max_num_batched_tokens,
                                   eos=EOS, kvcache_block_size=trace.block_size, num_kvcache_blocks=trace.num_blocks)
    scheduler = modules["engine.scheduler"].Scheduler(config)
    ids, log, step = {}, [], 0
    pending = list(enumerate(trace.arrivals))
    while pending or not scheduler.is_finished():
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens, ignore_eos) = pending.pop(0)
            seq = Sequence(prompt, SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=ignore_eos))
            ids[seq.seq_id] = i
            scheduler.add(seq)
        step += 1
        if scheduler.is_finished():
            continue
        before = {id(s) for s in scheduler.running}
        seqs, prefill = scheduler.schedule()
        cached = [s.num_cached_tokens for s in seqs]
        preempted = sorted(ids[s.seq_id] for s in scheduler.waiting if id(s) in before)
        log.append((prefill, [ids[s.seq_id] for s in seqs], [s.num_scheduled_tokens for s in seqs], cached,
                    preempted))
        scheduler.postprocess(seqs, [next_token(ids[s.seq_id], len(s)) for s in seqs], prefill)
    return log


def run_ours(trace: Trace) -> tuple[list[tuple], bool]:
    """The log, and whether a prefill step took only part of a prompt (a chunk)."""
    scheduler = Scheduler(trace.num_blocks, trace.block_size, trace.max_num_seqs, trace.max_num_batched_tokens, {EOS})
    log, step, chunked = [], 0, False
    pending = list(enumerate(trace.arrivals))
    while pending or not scheduler.finished:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens, ignore_eos) = pending.pop(0)
            scheduler.add(Request(i, prompt, max_tokens, ignore_eos))
        step += 1
        if scheduler.finished:
            continue
        batch = scheduler.schedule()
        chunked |= batch.prefill and any(c + t < len(r.token_ids) for r, t, c in
                                         zip(batch.requests, batch.tokens, batch.cached))
        log.append((batch.prefill, [r.id for r in batch.requests], batch.tokens, batch.cached,
                    sorted(r.id for r in batch.preempted)))
        scheduler.finish_step(batch, [next_token(r.id, len(r.token_ids)) for r in batch.requests])
    return log, chunked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanovllm", type=Path, required=True, help="a checkout of nano-vllm")
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    modules = load_nanovllm(args.nanovllm)
    rng = random.Random(args.seed)
    equal = steps = preempting = reusing = chunked = 0
    for n in range(args.traces):
        trace = random_trace(rng)
        theirs, (ours, was_chunked) = run_theirs(modules, trace), run_ours(trace)
        same = theirs == ours
        equal += same
        steps += len(ours)
        preempting += any(row[4] for row in ours)
        reusing += any(c for row in ours if row[0] for c in row[3])
        chunked += was_chunked
        if not same:
            first = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b) if len(theirs) == len(ours) else \
                min(len(theirs), len(ours))
            print(f"trace {n} differs at step {first}: theirs {theirs[first:first + 2]} ours {ours[first:first + 2]}")
    print(f"{equal}/{args.traces} traces equal ({steps} steps; {preempting} traces preempt, {reusing} reuse cached "
          f"blocks, {chunked} chunk a prefill)")


if __name__ == "__main__":
    main()
