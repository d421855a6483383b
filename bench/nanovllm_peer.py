"""Our block policy against nano-vllm's own block manager and scheduler, from its checkout, in two benches.

- Scheduler (the default): our continuous-batching scheduler (engine/scheduler.py) and nano-vllm's on the same
  traces of arrivals: every step's kind (prefill or decode), which requests it runs with how many tokens each and
  how many each had cached, and which it preempts, must be the same. Both are plain Python over token ids; no model
  runs: each request's next token is a function of its id and length, the same on both sides.
- Prefix (`--prefix`): a generation's prefix cache (engine.prefix_cache, block policy) over a pool of N blocks,
  prompts one after another, each a real `Generation` on a tiny random-weight Llama (prefill, one token, close),
  against nano-vllm's BlockManager allocating, hashing and freeing the same prompts: per prompt, the tokens reused
  and the physical block table must be the same. Random traces (shared system prompts, repeats, edits; pools from
  the longest prompt's blocks to four times that), then 160 prompts through one 24-block pool.

    pip install xxhash   # nano-vllm's block hashes; its checkout needs nothing else here (torch, transformers)
    python3 bench/nanovllm_peer.py --nanovllm /path/to/nano-vllm [--traces 200] [--seed 0]
    HF_HUB_OFFLINE=1 python3 bench/nanovllm_peer.py --nanovllm /path/to/nano-vllm --prefix [--traces 200]

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

from engine.blocks import BlockManager  # noqa: E402
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
                prompt = prompt[: len(prompt) // block_size * block_size]
        arrivals.append((rng.randrange(0, 10), prompt, rng.randrange(1, 12), rng.random() < 0.5))
    longest = max(-(-(len(p) + m) // block_size) for _, p, m, _ in arrivals)
    num_blocks = rng.randrange(longest, longest * 4 + 1)  # tight pools preempt
    return Trace(
        sorted(arrivals, key=lambda a: a[0]),
        num_blocks,
        block_size,
        rng.randrange(1, 8),
        rng.randrange(max(len(p) for _, p, _, _ in arrivals) // 2 + 1, 80),
    )


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
    config = types.SimpleNamespace(
        max_num_seqs=trace.max_num_seqs,
        max_num_batched_tokens=trace.max_num_batched_tokens,
        eos=EOS,
        kvcache_block_size=trace.block_size,
        num_kvcache_blocks=trace.num_blocks,
    )
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
        log.append((prefill, [ids[s.seq_id] for s in seqs], [s.num_scheduled_tokens for s in seqs], cached, preempted))
        scheduler.postprocess(seqs, [next_token(ids[s.seq_id], len(s)) for s in seqs], prefill)
    return log


def run_ours(trace: Trace) -> tuple[list[tuple], bool]:
    """The log, and whether a prefill step took only part of a prompt (a chunk)."""
    blocks = BlockManager(trace.num_blocks, trace.block_size)
    scheduler = Scheduler(blocks, trace.max_num_seqs, trace.max_num_batched_tokens, {EOS})
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
        chunked |= batch.prefill and any(
            c + t < len(r.token_ids) for r, t, c in zip(batch.requests, batch.tokens, batch.cached)
        )
        log.append(
            (
                batch.prefill,
                [r.id for r in batch.requests],
                batch.tokens,
                batch.cached,
                sorted(r.id for r in batch.preempted),
            )
        )
        scheduler.finish_step(batch, [next_token(r.id, len(r.token_ids)) for r in batch.requests])
    return log, chunked


def random_prompts(rng: random.Random, count: int, block_size: int) -> list[list[int]]:
    """Prompts as a class types them: a shared system prompt or not, an earlier prompt repeated or edited."""
    system = [rng.randrange(3, 60) for _ in range(rng.randrange(0, 4 * block_size))]
    prompts: list[list[int]] = []
    for _ in range(count):
        own = [rng.randrange(3, 60) for _ in range(rng.randrange(1, 5 * block_size))]
        prompt = (system if rng.random() < 0.7 else []) + own
        if prompts and rng.random() < 0.3:
            prompt = list(rng.choice(prompts))
            if rng.random() < 0.5:  # edited at one position, or cut to whole blocks
                prompt[rng.randrange(len(prompt))] = rng.randrange(3, 60)
            elif len(prompt) >= block_size:
                prompt = prompt[: len(prompt) // block_size * block_size]
        prompts.append(prompt)
    return prompts


def tiny_llama(folder: Path):
    """A tiny random-weight Llama with the embedded tokenizer, loaded by the engine (its outputs do not matter here:
    only which blocks its generations take)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    import engine
    from engine import embedded

    tokenizer = AutoTokenizer.from_pretrained(embedded.embedded_source())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return engine.load_model(str(folder), device="cpu")


def prefix_ours(model, prompts: list[list[int]], num_blocks: int, block_size: int) -> list[tuple[int, list[int]]]:
    import engine
    from engine.prefix_cache import PrefixCache

    cache = PrefixCache(model, policy="block", block_size=block_size, capacity_blocks=num_blocks)
    log = []
    for prompt in prompts:
        generation = engine.Generation(model, prompt, prefix_cache=cache, max_new_tokens=1)
        trace = generation.prefill()
        log.append((trace.prefix.reused_tokens, list(generation.table.blocks)))
        generation.close()
    return log


def prefix_theirs(modules, prompts: list[list[int]], num_blocks: int, block_size: int) -> list[tuple[int, list[int]]]:
    Sequence = modules["engine.sequence"].Sequence
    SamplingParams = modules["sampling_params"].SamplingParams
    Sequence.block_size = block_size
    manager = modules["engine.block_manager"].BlockManager(num_blocks, block_size)
    log = []
    for prompt in prompts:
        seq = Sequence(prompt, SamplingParams(temperature=1.0, max_tokens=1))
        cached = manager.can_allocate(seq)
        manager.allocate(seq, cached)
        log.append((seq.num_cached_tokens, list(seq.block_table)))
        seq.num_scheduled_tokens = len(prompt) - seq.num_cached_tokens  # the prefill computes the rest, then hashes
        manager.hash_blocks(seq)
        manager.deallocate(seq)
    return log


def compare_prefix(modules, traces: int, seed: int) -> None:
    import tempfile

    rng = random.Random(seed)
    cases = []
    for _ in range(traces):
        block_size = rng.choice([2, 4, 8, 16])
        prompts = random_prompts(rng, rng.randrange(2, 20), block_size)
        longest = max(-(-len(p) // block_size) for p in prompts)
        cases.append(
            (f"random, {block_size}-token blocks", prompts, rng.randrange(longest, longest * 4 + 1), block_size)
        )
    small = random_prompts(rng, 160, 4)
    cases.append(("160 prompts, 24 blocks of 4", small, max(24, max(-(-len(p) // 4) for p in small)), 4))
    with tempfile.TemporaryDirectory() as folder:
        model = tiny_llama(Path(folder))
        rows: dict[str, list[int]] = {}
        for name, prompts, num_blocks, block_size in cases:
            ours = prefix_ours(model, prompts, num_blocks, block_size)
            theirs = prefix_theirs(modules, prompts, num_blocks, block_size)
            row = rows.setdefault(name if name.startswith("160") else "random traces", [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += ours == theirs
            row[2] += sum(a[0] == b[0] for a, b in zip(ours, theirs))
            row[3] += sum(a == b for a, b in zip(ours, theirs))
            row[4] += len(prompts)
            if ours != theirs:
                first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
                print(f"{name}, {num_blocks} blocks: prompt {first} differs: ours {ours[first]} theirs {theirs[first]}")
    print("| case | traces equal | prompts: tokens reused equal | prompts: block tables equal too |")
    print("|---|---|---|---|")
    for name, (count, equal, reused_equal, prompts_equal, prompts) in rows.items():
        print(f"| {name} | {equal} of {count} | {reused_equal} of {prompts} | {prompts_equal} of {prompts} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanovllm", type=Path, required=True, help="a checkout of nano-vllm")
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", action="store_true", help="the prefix-cache bench (default: the scheduler's)")
    args = parser.parse_args()
    modules = load_nanovllm(args.nanovllm)
    if args.prefix:
        compare_prefix(modules, args.traces, args.seed)
        return
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
            first = (
                next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)
                if len(theirs) == len(ours)
                else min(len(theirs), len(ours))
            )
            print(
                f"trace {n} differs at step {first}: theirs {theirs[first : first + 2]} ours {ours[first : first + 2]}"
            )
    print(
        f"{equal}/{args.traces} traces equal ({steps} steps; {preempting} traces preempt, {reusing} reuse cached "
        f"blocks, {chunked} chunk a prefill)"
    )


if __name__ == "__main__":
    main()
