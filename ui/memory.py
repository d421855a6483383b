"""Keep a many-session server's resident memory close to what the sessions actually hold.

Each Streamlit session runs in its own thread; glibc's allocator gives threads their own arenas and
keeps freed buffers (a prefill's attention scores, say) mapped in them. Fewer arenas and a fixed mmap
threshold send large buffers straight back to the system when freed.
"""

import ctypes
import ctypes.util
import functools

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
