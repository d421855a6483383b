"""Keep a many-session server's resident memory close to what the sessions actually hold.

Each Streamlit session runs in its own thread; glibc's allocator gives threads their own arenas and
keeps freed buffers (a prefill's attention scores, say) mapped in them. Fewer arenas and a fixed mmap
threshold send large buffers straight back to the system when freed.

Streamlit's full cycle collection after every script run is turned off (`.streamlit/config.toml`: one per
follower on each move of the teacher); `freeze_long_lived` keeps Python's own full collections, and the class
pool's when it is full, from walking the loaded models' objects every time.
"""

import ctypes
import ctypes.util
import functools
import gc

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


@functools.cache
def tune_allocator() -> bool:
    """Once per process; a no-op (False) where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return bool(libc.mallopt(M_ARENA_MAX, 2)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 20))
    except (OSError, AttributeError, TypeError):
        return False


def freeze_long_lived() -> None:
    """Move every object alive now (the imported modules, a just-loaded model and its tokenizer: ~490k objects)
    out of the cycle collector's scans. Over them one full collection took ~370 ms holding the GIL, and with
    two followers polling that starved a leader's prefill from 1.4 s to 36 s. Objects created later (sessions,
    runs, traces) are collected as before; frozen ones still go when their reference count falls to zero."""
    gc.freeze()
