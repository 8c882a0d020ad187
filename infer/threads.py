"""Thread caps for one forward pass: numba and BLAS (through threadpoolctl).

numba's thread count is a setting of the calling thread: a graph sets it for the length of its
forward() and puts the caller's value back afterwards, so callers in other threads never see it.

BLAS thread pools are process-wide. While capped forwards run, BLAS uses the smallest cap among
them (no caller runs with more BLAS threads than it asked for; a caller with a larger cap may get
fewer while a smaller-capped forward is running), and when the last one ends the limits from
before the first one come back. Counting the running forwards is what makes this hold when they
overlap: each restoring "its" previous value would leave whichever cap happened to be set last.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_running: list[int] = []     # caps of the capped forwards running now, in every thread
_before = None               # threadpoolctl limiter that remembers the limits from before


@contextlib.contextmanager
def limit(num_threads: int | None):
    """Run the body with at most ``num_threads`` BLAS and numba threads (None: no change)."""
    if num_threads is None:
        yield
        return
    import numba

    with _lock:     # numba's first set_num_threads loads its threading layer: not alongside
        previous = numba.get_num_threads()       # threadpoolctl looking for libraries
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    _enter_blas(num_threads)
    try:
        yield
    finally:
        _leave_blas(num_threads)
        with _lock:
            numba.set_num_threads(previous)


def _enter_blas(cap: int) -> None:
    global _before
    from threadpoolctl import threadpool_limits

    with _lock:
        if not _running:
            _clear_blas_controller()
            _before = threadpool_limits(limits=cap)       # applies cap, remembers the old ones
        elif cap < min(_running):
            _clear_blas_controller()
            threadpool_limits(limits=cap)
        _running.append(cap)


def _leave_blas(cap: int) -> None:
    global _before
    from threadpoolctl import threadpool_limits

    with _lock:
        smallest = min(_running)
        _running.remove(cap)
        if not _running:
            _clear_blas_controller()
            _before.restore_original_limits()
            _before = None
            _clear_blas_controller()
        elif min(_running) != smallest:
            _clear_blas_controller()
            threadpool_limits(limits=min(_running))


def _clear_blas_controller() -> None:
    """threadpoolctl (3.6 on) lets one thread at a time set a process-wide (pthreads) OpenBLAS
    pool and silently ignores the others. Called under _lock before setting limits, it lets
    this thread take that role from whichever forward's thread had it; after the last
    capped forward, it leaves the role free (for the user's own threadpoolctl calls)."""
    import threadpoolctl

    controller = getattr(threadpoolctl, "OpenBLASController", None)
    clear = getattr(controller, "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)
