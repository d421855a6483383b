"""The step after the one a page shows, computed while the class looks at it: → then finds it done, and only
draws (a decode step was 80–150 ms of a press's 230–320 ms wait on the 2-core test machine). Runs are
deterministic (the draw's seed is per step), so a step computed ahead is the step a press would compute.

One background thread for the server, one job per run and step, with the pages' torch thread count. A run is held
weakly: a run no page reads any more is not stepped. Plain Python (no Streamlit)."""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import cachetools
import torch

from ui.runs import Run

log = logging.getLogger("kvscope")

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-step-ahead")
_asked: cachetools.LRUCache = cachetools.LRUCache(256)  # (run, step): every page drawing a step asks once
_asked_lock = threading.Lock()


def ask(run: Run, step: int) -> None:
    """Compute `run` up to `step` in the background, once."""
    job = (weakref.ref(run), step)
    with _asked_lock:
        if job in _asked:
            return
        _asked[job] = True
    _worker.submit(_compute, job[0], step, torch.get_num_threads())


def _compute(ref: weakref.ref, step: int, threads: int) -> None:
    run = ref()
    if run is None or run.closed:
        return
    torch.set_num_threads(threads)
    try:
        run.advance_to(step)
    except Exception:  # noqa: BLE001 — ahead of any page: the page that presses → meets the fault itself
        log.warning("computing a step ahead failed", exc_info=True)


def settled() -> None:
    """Return once every step asked for so far is computed (tests: what a page computed, ahead or not)."""
    _worker.submit(lambda: None).result()
