"""Fast kernels: numba for what BLAS cannot do (and the 1x1 products), BLAS for the others.

    epilogue.py    bias + residual + activation in one pass (what fusion folds into a layer)
    phases.py      a padded plane split into stride phases: every tap reads a unit-stride window
    depthwise.py   depthwise convolution, direct numba kernel on the phases
    pointwise.py   1x1 convolution: blocks of the output summed in vector registers, finished
    simd.py        such a block of a matrix product in registers, as numba intrinsics (LLVM IR)
    gemm.py        k x k convolution through im2col (from the phases) and BLAS; grouped 1x1
    winograd.py    3x3 stride-1 convolution as Winograd F(4x4, 3x3): 36 GEMMs on BLAS
    conv.py        one convolution's packed weights and the choice of kernel per input size
    pool.py        max pooling, separable: rows then columns
    workers.py     helper threads sharing every kernel call with the calling thread
    jobs.py        a kernel call cut into chunks that threads take without locks
    atomics.py     atomic loads and stores, and a BLAS call by address, as numba intrinsics
    backend.py     @kernel, and the choice between the compiled module and numba's JIT
    aot.py         the kernels compiled ahead of time into an extension module, once per machine

A layer uses them when ``Layer.use_fast_kernels`` is True (``RuntimeGraph(reference=True)``
turns it off); layers/kernels.py holds the numpy references they are tested against.

The numba kernels are compiled once per machine, ahead of time, into an extension module that
later processes import without numba (backend.py, aot.py); ``PNNX_INFER_KERNELS=jit`` has numba
compile them just in time instead. Either way they take one array layout (C-contiguous,
aligned float32). ``start()`` (which RuntimeGraph.build calls) chooses and binds them.

Threads: a forward of two or more threads (RuntimeGraph.set_num_threads, or None for every
core) shares each kernel call with helper threads (workers.py): the call is cut into chunks
(output planes, bands of a matrix product, products of a stack) that the calling thread and
the helpers take in turn (jobs.py), the helpers spinning in compiled code between calls and
running the matrix products too, through numpy's OpenBLAS with its own pool capped at one
thread. Two pools taking turns on the same cores fight (OpenBLAS's workers spin after each
product; a parallel numba Winograd convolution alternating with BLAS went from 2 ms to
500 ms on this 2-core machine), and a helper that sleeps, or comes back to Python, between
calls costs more to wake (30-50 us) than half a small kernel saves: so one team runs both.
Without numpy's OpenBLAS, or with one thread, the numba kernels run on the calling thread and
the products on BLAS's own threads.
"""

from layers.fast.backend import start
import layers.fast.layers  # noqa: E402,F401  (registers the fast layers)

__all__ = ["start"]
