"""Large work buffers in fresh pages of their own, without asking for huge pages.

    buffer = fresh_pages(nbytes)     # uint8, uninitialised, page-aligned where mapped

An anonymous private mapping (mmap) whose pages the OS maps in when it is made
(MAP_POPULATE, on Linux), in one call, rather than one page fault each at its first write.
Not np.empty: numpy asks the OS for transparent huge pages (madvise) for every array of 4
MiB or more, and where the kernel's THP policy is "madvise" the first write to such an
array may compact memory to find 2 MiB pages: a stall of tens of milliseconds, at random,
in the first forward at a new input size. Smaller buffers come from np.empty, whose heap
often hands back pages already mapped. The weights read from a bin file (parser/bin.py),
the arena of a memory plan (infer/memory.py) and the fast kernels' work buffers
(layers/fast/team.py) take their memory here.
"""

from __future__ import annotations

import mmap

import numpy as np


HUGE_PAGE_ADVICE = 4 << 20   # bytes: numpy's arrays from this size on ask for huge pages
MAPPED_FROM = HUGE_PAGE_ADVICE   # bytes: smaller buffers come from np.empty
POPULATE = getattr(mmap, "MAP_POPULATE", 0)   # Linux: map every page in when mapping


def fresh_pages(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialised bytes (uint8), their pages mapped in already where the OS
    can; the mapping goes when the last array over it does. np.empty below MAPPED_FROM,
    where there is no private anonymous mapping (Windows), or where the OS refuses one
    (np.empty then raises MemoryError if memory is really short)."""
    if nbytes < MAPPED_FROM or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(max(nbytes, 0), np.uint8)
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | POPULATE)
    except OSError:
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(pages, np.uint8)
