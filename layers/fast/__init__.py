"""Fast kernels: numba for what BLAS cannot do, BLAS (``np.matmul``) for the matrix products.

    epilogue.py    bias + residual + activation in one pass (what fusion folds into a layer)
    depthwise.py   depthwise convolution, direct numba kernel
    gemm.py        1x1 convolution straight into GEMM; k x k through im2col into a reused buffer
    winograd.py    3x3 stride-1 convolution as Winograd F(4x4, 3x3): 36 GEMMs on BLAS
    conv.py        one convolution's packed weights and the choice of kernel per input size

A layer uses them when ``Layer.use_fast_kernels`` is True (``RuntimeGraph(reference=True)``
turns it off); layers/kernels.py holds the numpy references they are tested against.

Every numba function is compiled lazily, the first time a model needs it, for one array layout
(C-contiguous, writable float32), and cached on disk (``cache=True``): later processes load it.

Threads: numba's parallel loops and OpenBLAS's GEMMs run one after the other on the same cores.
OpenMP threads that spin while waiting for the next loop would steal the cores from BLAS's
threads (and BLAS's from them), so unless the user chose otherwise, numba's OpenMP threads
sleep when idle (OMP_WAIT_POLICY=PASSIVE, read when numba starts its thread pool).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
