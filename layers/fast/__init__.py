"""Fast kernels: numba for what BLAS cannot do, BLAS (``np.matmul``) for the matrix products.

    epilogue.py    bias + residual + activation in one pass (what fusion folds into a layer)
    phases.py      a padded plane split into stride phases: every tap reads a unit-stride window
    depthwise.py   depthwise convolution, direct numba kernel on the phases
    gemm.py        1x1 convolution straight into GEMM; k x k through im2col (from the phases)
    winograd.py    3x3 stride-1 convolution as Winograd F(4x4, 3x3): 36 GEMMs on BLAS
    conv.py        one convolution's packed weights and the choice of kernel per input size
    pool.py        max pooling, separable: rows then columns
    backend.py     @kernel, and the choice between the compiled module and numba's JIT
    aot.py         the kernels compiled ahead of time into an extension module, once per machine

A layer uses them when ``Layer.use_fast_kernels`` is True (``RuntimeGraph(reference=True)``
turns it off); layers/kernels.py holds the numpy references they are tested against.

The numba kernels are compiled once per machine, ahead of time, into an extension module that
later processes import without numba (backend.py, aot.py); ``PNNX_INFER_KERNELS=jit`` has numba
compile them just in time instead. Either way they take one array layout (C-contiguous,
aligned float32). ``start()`` (which RuntimeGraph.build calls) chooses and binds them.

Threads: the matrix products run on BLAS's threads (numpy's OpenBLAS, capped per graph by
RuntimeGraph.set_num_threads); the numba kernels run on the calling thread. Two thread pools
taking turns on the same cores fight: OpenBLAS's workers spin after each product while
numba's OpenMP workers need those cores, and on this 2-core machine a parallel numba
Winograd convolution alternating with BLAS went from 2 ms to 500 ms. Measured end to end
(ResNet18 and EfficientNet-Lite0 at batch 1), serial numba + threaded BLAS was the fastest
and the steadiest of the arrangements tried (parallel numba + single-threaded BLAS split by
hand, both parallel, both serial); it also needs no OpenMP start-up on the first inference.
Measured again with the current kernels: a depthwise layer split into two halves of planes,
one on a helper Python thread (the kernels release the GIL), runs 30% faster alone but gives
nothing inside EfficientNet-Lite0, because OpenBLAS's worker keeps spinning on the second
core after each product (it only helps with OPENBLAS_THREAD_TIMEOUT=4, and then by ~1%).
"""

from layers.fast.backend import start

__all__ = ["start"]
