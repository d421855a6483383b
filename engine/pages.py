"""Give back the resident pages of a weight that was read straight from its file and then copied.

transformers maps a safetensors file into memory (one private, read-only-in-practice mapping) and its
tensors are views of it: a page becomes resident, and counts in the process's memory, when it is first
read. When we stack q/k/v (and gate/up) into one new tensor, the parts' pages were read for the copy
and would stay resident beside the copy for as long as anything keeps the mapping alive (every other
weight does), i.e. a second copy of those weights. `drop_file_pages` tells the kernel we no longer need
them (madvise MADV_DONTNEED). That is safe for a file-backed mapping whatever still points into it: the
pages were never written, so a later read faults them in again from the file, with the same bytes.
Anonymous memory is never touched (there MADV_DONTNEED would zero it). Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_PAGE = mmap.PAGESIZE


def file_backed_ranges() -> list[tuple[int, int]]:
    """(start, end) addresses of this process's mappings of regular files (/proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            # address perms offset dev inode [path]: a file has an inode ≠ 0 and a path starting with "/".
            if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def drop_file_pages(tensors: list[torch.Tensor]) -> int:
    """Release the whole pages that lie inside each CPU tensor's bytes when a file mapping holds them.

    Returns the bytes released (0 off Linux, or when the tensors live in ordinary memory).
    """
    if not sys.platform.startswith("linux") or not tensors:
        return 0
    ranges = file_backed_ranges()
    libc = ctypes.CDLL(None, use_errno=True)
    released = 0
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        first = tensor.data_ptr()
        last = first + tensor.numel() * tensor.element_size()
        if not any(start <= first and last <= end for start, end in ranges):
            continue
        aligned_first = -(-first // _PAGE) * _PAGE  # whole pages only: a shared edge page stays
        aligned_last = last // _PAGE * _PAGE
        if aligned_last > aligned_first:
            size = aligned_last - aligned_first
            if libc.madvise(ctypes.c_void_p(aligned_first), ctypes.c_size_t(size), MADV_DONTNEED) == 0:
                released += size
    return released
