"""Matrix products for the fast kernels: BLAS on one thread per call, the threads our own.

numba's parallel loops and OpenBLAS's threads take turns on the same cores. OpenBLAS's worker
threads keep spinning after each product, waiting for the next one, while numba's threads need
those cores; on a busy 2-core machine that turned a 2 ms Winograd convolution into 500 ms.
So while a fast kernel runs, OpenBLAS works single-threaded (``single_threaded_blas``), and a
product big enough to be worth it is split into independent pieces computed concurrently by a
few Python threads (numpy releases the GIL inside BLAS): nothing spins, every core is busy.

    parallel_matmul(a, b, out)      a (B, M, K) @ b (B, K, L) -> out (B, M, L), C-contiguous

The pieces are whole matrices of the stack (Winograd's 36 products) or, for a short stack,
blocks of rows of ``a`` and ``out`` (contiguous slices, so BLAS writes them in place).
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

MIN_FLOPS_TO_SPLIT = 2_000_000        # below this, one call: splitting costs more than it saves

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas_libraries: list | None = None


def _blas() -> list:
    """numpy's BLAS libraries as threadpoolctl controllers, found once."""
    global _blas_libraries
    if _blas_libraries is None:
        from threadpoolctl import ThreadpoolController

        _blas_libraries = [lib for lib in ThreadpoolController().lib_controllers
                           if lib.user_api == "blas"]
    return _blas_libraries


@contextlib.contextmanager
def single_threaded_blas():
    """Run the body with numpy's BLAS on one thread (a few microseconds to switch)."""
    libraries = _blas()
    previous = [lib.get_num_threads() for lib in libraries]
    for lib in libraries:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, count in zip(libraries, previous):
            lib.set_num_threads(count)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=numba.config.NUMBA_NUM_THREADS,
                                       thread_name_prefix="pnnx-infer-gemm")
        return _pool


def _pieces(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: int):
    """Split a (B, M, K) @ (B, K, L) product into about ``parts`` independent products."""
    stack, rows = a.shape[0], a.shape[1]
    if stack >= parts:                                  # whole matrices of the stack
        bounds = np.linspace(0, stack, parts + 1).astype(int)
        return [(a[s:e], b[s:e], out[s:e]) for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    per_matrix = -(-parts // stack)                     # blocks of rows
    bounds = np.linspace(0, rows, per_matrix + 1).astype(int)
    return [(a[i, s:e], b[i], out[i, s:e]) for i in range(stack)
            for s, e in zip(bounds[:-1], bounds[1:]) if e > s]


def parallel_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = a @ b for stacks of matrices, on numba's thread count (``numba.get_num_threads``,
    which RuntimeGraph.set_num_threads caps). Call it inside ``single_threaded_blas``."""
    threads = numba.get_num_threads()
    flops = 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if threads < 2 or flops < MIN_FLOPS_TO_SPLIT:
        return np.matmul(a, b, out=out)
    pieces = _pieces(a, b, out, threads)
    pool = _executor()
    futures = [pool.submit(np.matmul, x, y, out=z) for x, y, z in pieces[1:]]
    np.matmul(*pieces[0][:2], out=pieces[0][2])         # this thread takes the first piece
    for future in futures:
        future.result()
    return out
