"""What a change of eviction policy costs the server in the eviction view: the pair of runs (the full cache's and
the policy's, `ui.runs.eviction`) for SnapKV is computed to step N, then a page at the same step switches to each
other policy in turn; the seconds each switch takes to have its pair at step N (wall and this process's CPU). The
first figure is the first pair's: it computes the lab (every policy at the timing) or, before labs, two runs. The
last is the floor under any first pair: the prompt's greedy decode to step N over the full cache alone, recording
nothing.

    HF_HUB_OFFLINE=1 python3 bench/eviction_switch.py [--step 64] [--prompt-tokens 382] [--before /old/checkout]
        [--threads 1]

SmolLM2 (the embedded model) in float32, one torch thread as the app computes (`--threads`: more). With --before,
the same runs first on the code of another checkout (e.g. a `git worktree` of the previous commit), each checkout
in a fresh process, both in the same run: before and after figures from the same machine and minute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
import inspect
import engine
import engine.eviction
CHECKOUT_POLICIES = getattr(engine.eviction, "EVICTION_POLICIES", None) or getattr(engine.eviction, "POLICIES")  # older
from ui.runs.eviction import pair_for
try:  # the settings' own module since the labs take the policies pages ask for
    from ui.runs.eviction_settings import EvictionSettings
except ImportError:
    from ui.runs.eviction import EvictionSettings
step, tokens = int(sys.argv[1]), int(sys.argv[2])
model = engine.load_model("embedded", device="cpu")
ids = model.tokenizer(" ".join(["token"] * tokens))["input_ids"]
if "store" in inspect.signature(pair_for).parameters:  # the labs in the run store (a checkout before: module memos)
    from ui.runs.store import RunStore
    store = RunStore(10**10)
    get = lambda settings: pair_for(store, model, ids, settings, step, 10**6)
else:
    get = lambda settings: pair_for(model, ids, settings, step, 10**6)
times = []
for policy in ["snapkv"] + [p for p in CHECKOUT_POLICIES if p != "snapkv"]:  # the first builds the lab
    wall, cpu = time.perf_counter(), time.process_time()
    pair = get(EvictionSettings(policy, "prefill", 0.5, 32, 8, 28))
    assert pair.advance_to(step) == step
    times.append([policy, time.perf_counter() - wall, time.process_time() - cpu])
wall, cpu = time.perf_counter(), time.process_time()
alone = engine.Generation(model, ids, max_new_tokens=step, capture=engine.NO_RECORD)
alone.prefill()
while len(alone.generated) < step:
    alone.step()
times.append(["the full cache alone", time.perf_counter() - wall, time.process_time() - cpu])
import resource
times.append(["peak RSS MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0])
print(json.dumps(times))
"""


def measure(root: Path, step: int, tokens: int, threads: int) -> list:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(step), str(tokens), str(threads)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=382)
    parser.add_argument("--before", type=Path, help="another checkout, measured first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app's default: 1 per page)")
    args = parser.parse_args()
    roots = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    print(
        f"step {args.step}, a {args.prompt_tokens}-token prompt; seconds to have each policy's pair there "
        f"(wall / CPU); load average {os.getloadavg()[0]:.2f}"
    )
    for name, root in roots:
        started = time.perf_counter()
        rows = measure(root, args.step, args.prompt_tokens, args.threads)
        *rows, (_, peak, _) = rows
        cells = "  ".join(f"{policy} {wall:.2f}/{cpu:.2f}" for policy, wall, cpu in rows) + f"  peak RSS {peak:.0f} MiB"
        print(f"{name:6}  {cells}  (process {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
