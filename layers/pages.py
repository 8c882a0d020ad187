"""Large work buffers in fresh pages of their own, without asking for huge pages.

    buffer = fresh_pages(nbytes)     # uint8, uninitialised, page-aligned where mapped

An anonymous private mapping (mmap) that the OS fills with zero pages as they are first
written. Not np.empty: numpy asks the OS for transparent huge pages (madvise) for every
array of 4 MiB or more, and where the kernel's THP policy is "madvise" the first write to
such an array may compact memory to find 2 MiB pages: a stall of tens of milliseconds, at
random, in the first forward at a new input size. Plain pages cost one fault each, spread
over the threads that first write them. The arena of a memory plan (infer/memory.py) and
the fast kernels' work buffers (layers/fast/team.py) take their memory here.
"""

from __future__ import annotations

import mmap

import numpy as np


HUGE_PAGE_ADVICE = 4 << 20   # bytes: numpy's arrays from this size on ask for huge pages


def fresh_pages(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialised bytes (uint8); the mapping goes when the last array over it
    does. np.empty below HUGE_PAGE_ADVICE (no advice to avoid), where there is no private
    anonymous mapping (Windows), or where the OS refuses one (np.empty then raises
    MemoryError if memory is really short)."""
    if nbytes < HUGE_PAGE_ADVICE or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(max(nbytes, 0), np.uint8)
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(pages, np.uint8)
