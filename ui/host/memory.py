"""Keep a many-session server's resident memory close to what the sessions actually hold.

Each Streamlit session runs in its own thread; glibc's allocator gives threads their own arenas and
keeps freed buffers (a prefill's attention scores, say) mapped in them. Fewer arenas and a fixed mmap
threshold send large buffers straight back to the system when freed.

Every minute a sweeper drops the runs no page has read for a while (`ui.runs.store.RunStore.expire`) and hands the
freed memory back (`release_free_memory`): a class that closed its tabs leaves the server as it found it.

Streamlit's full cycle collection after every script run is turned off (`.streamlit/config.toml`: one per
follower on each move of the teacher); `freeze_long_lived` keeps Python's own full collections, and the class
pool's when it is full, from walking the loaded models' objects every time.
"""

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

from ui.host import streamlit_internals

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# oneDNN (PyTorch's CPU kernels for bfloat16) keeps a compiled kernel per matrix shape it has met, up to 1,024 by
# default. Decode's attention meets a new shape at every context length: Gemma 3 in bfloat16 held ~75 MiB more
# after 117 steps of one run, and a class of explorers at many lengths several times that. The latest few shapes
# are all a step reuses (the same step time, bench/class_on_host.py's figures in docs/benchmarks.md).
KERNEL_CACHE_SHAPES = 16


@functools.cache
def tune_allocator() -> bool:
    """Once per process, before the first model is loaded (oneDNN reads its setting when it first builds a kernel;
    a host's own ONEDNN_PRIMITIVE_CACHE_CAPACITY is kept); the allocator part is a no-op (False) where the C
    library is not glibc."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(KERNEL_CACHE_SHAPES))
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, 2)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 20))


def freeze_long_lived() -> None:
    """Move every object alive now (the imported modules, a just-loaded model and its tokenizer: ~490k objects)
    out of the cycle collector's scans. Over them one full collection took ~370 ms holding the GIL, and with
    two followers polling that starved a leader's prefill from 1.4 s to 36 s. Objects created later (sessions,
    runs, traces) are collected as before; frozen ones still go when their reference count falls to zero."""
    gc.freeze()


SWEEP_SECONDS = 60.0
_sweeps: list[Callable[[], int]] = []  # each returns how many things it let go
_sweeps_lock = threading.Lock()


def release_free_memory() -> bool:
    """Hand the allocator's free pages back to the system (glibc's malloc_trim): what a class freed (runs dropped,
    sessions ended) otherwise stays counted in the server's memory, held in the arenas' free lists. It walks every
    free chunk with the arenas locked (~240 ms over a 3 GB heap, even when there is nothing to give back), so it
    runs once a sweep, never on a page's step. A no-op (False) where the C library is not glibc."""
    libc = _libc()
    return libc is not None and hasattr(libc, "malloc_trim") and bool(libc.malloc_trim(0))


@functools.cache
def _libc():
    """The C library, found once (`find_library` runs a subprocess); None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def sweep() -> None:
    """One sweep: closed tabs' sessions forgotten and every registered clean-up run (a run store dropping its idle
    runs); when they let anything go, a full collection (sessions hold reference cycles, and Streamlit's collection
    after each script run is off); then the freed memory handed back."""
    with _sweeps_lock:
        cleanups = list(_sweeps)
    if streamlit_internals.forget_closed_sessions() + sum(cleanup() or 0 for cleanup in cleanups):
        gc.collect()
    release_free_memory()


def sweep_regularly(cleanup: Callable[[], int], seconds: float = SWEEP_SECONDS) -> None:
    """Run `cleanup` in the server's sweep, every `seconds` on a daemon thread started by the first call: a server
    whose class has left does nothing on its own, so nothing else would drop what the class held."""
    with _sweeps_lock:
        _sweeps.append(cleanup)
        if len(_sweeps) > 1:
            return
    thread = threading.Thread(target=_sweep_forever, args=(seconds,), name="kvscope-sweeper", daemon=True)
    thread.start()


def _sweep_forever(seconds: float) -> None:
    while True:
        time.sleep(seconds)
        try:
            sweep()
        except Exception:  # a clean-up that failed must not end the sweeps of the others
            log.exception("a memory sweep failed")


def resident_bytes() -> int:
    """This process's resident memory (VmRSS); 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def container_limit_bytes() -> int | None:
    """The memory limit of the container this server runs in (cgroup v2, else v1), or None without one."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = open(path).read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 1 << 60:  # v1 writes a huge number for "no limit", v2 "max"
            return int(value)
    return None


def short_of_memory(host_mb: int, step_mb: int) -> bool:
    """Whether one more page's heavy step (`step_mb`, KVSCOPE_STEP_MEMORY_MB) could take the server past the host's
    memory (`host_mb`, KVSCOPE_MEMORY_MB; 0: the container's limit, if any). Pages then leave out the figures that
    cost the most to compute (the full attention heatmap, the busy pool, the timings) and say so."""
    limit = host_mb * 10**6 if host_mb else container_limit_bytes()
    return limit is not None and resident_bytes() + step_mb * 10**6 > limit
