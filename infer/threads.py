"""Thread caps for one forward pass: numba and the BLAS / OpenMP pools (through threadpoolctl).

    with threads.limit(2):          # what RuntimeGraph.forward does when set_num_threads(2)
        ...                         # numba kernels and np.matmul use at most 2 threads

numba keeps its thread count per Python thread, so a forward sets it for its own thread and
puts it back afterwards. The BLAS pools are process-wide: the first capped forward to enter
saves their sizes and applies the cap, the last to leave restores them (forwards running at
the same time with different caps share one: the latest wins).

What it costs. Finding the loaded BLAS libraries means scanning every shared library of the
process (threadpoolctl's ThreadpoolController: about 2 ms, more than a small model's whole
forward), so it is done once: by set_num_threads (``prepare``), or else the first capped
forward. Each call then costs a few microseconds, and a pool that already has the wanted
size is not touched.
"""

from __future__ import annotations

import contextlib
import threading

import numba

_lock = threading.Lock()
_pools: list | None = None       # threadpoolctl controllers of the loaded BLAS / OpenMP libraries
_active = 0                      # forwards running under a cap now
_saved: list[int | None] = []    # each pool's size before the first of them entered
_current: list[int | None] = []  # each pool's size now, as set here (not asked again)


def _thread_pools() -> list:
    """The BLAS and OpenMP libraries loaded in this process, found once (the 2 ms scan):
    numpy's BLAS, which the kernels use, is loaded before any graph runs; a library loaded
    later is found by the next ``prepare`` (RuntimeGraph.set_num_threads)."""
    global _pools
    if _pools is None:
        from threadpoolctl import ThreadpoolController

        _pools = list(ThreadpoolController().lib_controllers)
    return _pools


def prepare() -> None:
    """Pay the one-time costs now (starting numba's threads, finding the BLAS libraries: tens
    of milliseconds) instead of in the first capped forward. It looks for the libraries
    afresh (when no forward is running), so one loaded since (say torch's OpenMP) is
    capped from then on."""
    global _pools
    numba.get_num_threads()            # starts numba's threading layer
    with _lock:
        if _active == 0:
            _pools = None
        _thread_pools()


@contextlib.contextmanager
def limit(num_threads: int | None):
    """Run the body with at most ``num_threads`` BLAS and numba threads (None: no change)."""
    if num_threads is None:
        yield
        return
    numba_before = numba.get_num_threads()             # this Python thread's own setting
    numba_wanted = min(num_threads, numba.config.NUMBA_NUM_THREADS)
    if numba_before != numba_wanted:
        numba.set_num_threads(numba_wanted)
    _enter(num_threads)
    try:
        yield
    finally:
        _leave()
        if numba_before != numba_wanted:
            numba.set_num_threads(numba_before)


def _enter(num_threads: int) -> None:
    global _active
    with _lock:
        pools = _thread_pools()
        if _active == 0:                                # save what the process had
            _saved[:] = _current[:] = [pool.get_num_threads() for pool in pools]
        _active += 1
        for index, pool in enumerate(pools):
            if _current[index] != num_threads:
                pool.set_num_threads(num_threads)
                _current[index] = num_threads


def _leave() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active == 0:                                # the last one out restores
            for pool, before, now in zip(_thread_pools(), _saved, _current):
                if before is not None and before != now:
                    pool.set_num_threads(before)
