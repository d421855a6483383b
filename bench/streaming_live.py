"""How long the eviction view's StreamingLLM experiment (`ui.runs.sink_experiment`) takes the first time on a quiet
server, and what it finds, on both embedded models: one torch thread, as a page computes it.

    HF_HUB_OFFLINE=1 python3 bench/streaming_live.py

Prints per model: the seconds to compute every configuration, and the mean NLL past the cache for the full cache
and each configuration (sinks, and whether positions are numbered inside the cache).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import engine  # noqa: E402
from engine.loader import AUTO  # noqa: E402
from ui.runs.sink_experiment import CACHE, CONFIGS, TEXT_TOKENS, SinkExperiment  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    print(f"{TEXT_TOKENS} tokens through a cache of {CACHE} positions; load average {os.getloadavg()[0]:.2f}")
    for name, lang in (("embedded", "en"), ("embedded-zh", "zh")):
        model = engine.load_model(name, device="cpu", dtype=AUTO)  # each in its own dtype, as the app holds it
        experiment = SinkExperiment(model, lang)
        started = time.perf_counter()
        experiment.compute()
        seconds = time.perf_counter() - started
        mean = experiment.after_cache
        cells = "  ".join(f"{c.sinks}{' inside' if c.inside else ''} {mean(experiment.nll[c]):.3f}" for c in CONFIGS)
        print(f"{name} ({lang}, {model.info.dtype}): {seconds:.1f} s; full {mean(experiment.full):.3f}  {cells}")


if __name__ == "__main__":
    main()
