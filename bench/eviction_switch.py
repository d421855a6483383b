"""What a change of eviction policy costs the server in the eviction view: the pair of runs (the full cache's and
the policy's, `ui.runs.eviction`) for SnapKV is computed to step N, then a page at the same step switches to each
other policy in turn; the seconds each switch takes to have its pair at step N (wall and this process's CPU). The
first figure is the first pair's: it computes the lab (every policy at the timing) or, before labs, two runs. The
last is the floor under any first pair: the prompt's greedy decode to step N over the full cache alone, recording
nothing.

    HF_HUB_OFFLINE=1 python3 bench/eviction_switch.py [--step 64] [--prompt-tokens 382] [--before /old/checkout]
        [--threads 1] [--pages]

`--pages`: what a student waits for instead, the whole page: a server of the checkout (`streamlit run`, its own
defaults) is warmed by one page of the default link, then new pages open the eviction view at step N of the prompt,
one after another on the otherwise idle server: SnapKV (the first pair), TOVA (a policy the lab lacks), SnapKV
again (one it has); each timed from the page's first message until its run ended with live step buttons, figures
included (bench/class_on_host.py's `Student`). The floor is timed in the same run: the full cache's greedy decode
of the same prompt to step N on one thread, recording nothing, in a fresh process of the checkout (the median of
`FLOOR_RUNS`).

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
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench.class_on_host and tests.server, for --pages

# The floor under any pair: the prompt's greedy decode to `step` over the full cache alone, recording nothing.
FULL_CACHE_ALONE = """
alone = engine.Generation(model, ids, max_new_tokens=step, capture=engine.NO_RECORD)
alone.prefill()
while len(alone.generated) < step:
    alone.step()
"""

MEASURE = (
    """
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
"""
    + FULL_CACHE_ALONE
    + """
times.append(["the full cache alone", time.perf_counter() - wall, time.process_time() - cpu])
import resource
times.append(["peak RSS MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0])
print(json.dumps(times))
"""
)


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


FLOOR_RUNS = 3  # the floor's median of three: this VM's speed drifts by a tenth within a minute
FLOOR = (
    """
import statistics, sys, time, torch
torch.set_num_threads(1)
import engine
from engine.prompt import tokenize_prompt
step, text, runs = int(sys.argv[1]), sys.stdin.read(), int(sys.argv[2])
model = engine.load_model("embedded", device="cpu")
ids = tokenize_prompt(model, text, chat=False)
times = []
for _ in range(runs):
    wall = time.perf_counter()
"""
    + textwrap.indent(FULL_CACHE_ALONE, "    ")
    + """
    times.append(time.perf_counter() - wall)
print(len(ids), statistics.median(times))
"""
)
PAGES = (
    ("first pair (SnapKV)", "snapkv"),
    ("a policy the lab lacks (TOVA)", "tova"),
    ("one it has (SnapKV)", "snapkv"),
)


def open_pages(root: Path, step: int, tokens: int) -> list[tuple[str, float]]:
    """Seconds until each page of `PAGES` is drawn at `step` on a server of `root`, then the floor's."""
    import tempfile
    from urllib.parse import quote

    from bench.class_on_host import Seat, Student, exact_prompt, wait_for
    from tests.server import running_server

    prompt = exact_prompt("en", tokens, 0)
    log = Path(tempfile.gettempdir()) / f"kvscope-eviction-pages-{root.name}.log"
    rows = []
    with running_server(log, root=root) as (url, _):
        warm = Student(url, "step=1", Seat("warm-up", "en", 0))
        assert wait_for(warm.ready, 600, every=0.2), "the model did not load"
        warm.close()
        for number, (label, policy) in enumerate(PAGES):
            link = f"prompt={quote(prompt)}&chat=0&step={step}&view=eviction&evict={policy}&ratio=0.5"
            start = time.perf_counter()
            page = Student(url, link, Seat("evict", "en", number))
            assert wait_for(page.ready, 600, every=0.02), f"{label}: the page did not open in 10 minutes"
            rows.append((label, time.perf_counter() - start))
            page.close()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", FLOOR, str(step), str(FLOOR_RUNS)],
        input=prompt,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    count, floor = done.stdout.split()[-2:]
    rows.append((f"the floor (the full cache alone, {count} prompt tokens, median of {FLOOR_RUNS})", float(floor)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=382)
    parser.add_argument("--before", type=Path, help="another checkout, measured first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app's default: 1 per page)")
    parser.add_argument("--pages", action="store_true", help="real pages on a server, each against the floor")
    args = parser.parse_args()
    roots = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    print(
        f"step {args.step}, a {args.prompt_tokens}-token prompt; seconds to have each policy's pair there "
        f"(wall / CPU); load average {os.getloadavg()[0]:.2f}"
    )
    if args.pages:
        for name, root in roots:
            rows = open_pages(root, args.step, args.prompt_tokens)
            floor = rows[-1][1]
            cells = "  ".join(f"{label} {seconds:.2f} s ({seconds / floor:.2f}×)" for label, seconds in rows[:-1])
            print(f"{name:6}  {cells}  {rows[-1][0]} {floor:.2f} s", flush=True)
        return
    for name, root in roots:
        started = time.perf_counter()
        rows = measure(root, args.step, args.prompt_tokens, args.threads)
        *rows, (_, peak, _) = rows
        cells = "  ".join(f"{policy} {wall:.2f}/{cpu:.2f}" for policy, wall, cpu in rows) + f"  peak RSS {peak:.0f} MiB"
        print(f"{name:6}  {cells}  (process {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
