"""Thread caps for one forward pass: BLAS (through threadpoolctl) and numba together.

numba's thread count and BLAS pools are process-wide, so a graph applies its own cap for the
length of its forward() and restores the previous values afterwards.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()


@contextlib.contextmanager
def limit(num_threads: int | None):
    """Run the body with at most ``num_threads`` BLAS and numba threads (None: no change)."""
    if num_threads is None:
        yield
        return
    import numba
    from threadpoolctl import threadpool_limits

    with _lock:
        previous = numba.get_num_threads()
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        with threadpool_limits(limits=num_threads):
            yield
    finally:
        with _lock:
            numba.set_num_threads(previous)
