"""The fast floor: layers that override the reference layers, and the kernels they run.

    layers.py      the fast layers: subclasses of layers/*.py's reference layers, registered
                   for the same pnnx types (the graph creates them unless reference=True)
    conv.py        PackedConv2d: one convolution's packed weights, a call per input shape
    algorithms.py  the table of convolution algorithms: fits, pays, pack, make_call, warm
    depthwise.py   depthwise convolution: plane by plane on stride phases, or channels last
    gemm.py        dense and grouped convolution as matrix products (im2col, 1x1)
    pointwise.py   1x1 convolution / matrix product in register tiles: channels x pixels
    pointwise_transposed.py   the same product turned around for small images: pixels x channels
    dense.py       nn.Linear's product in register tiles: rows x features, the weight as panels
    products.py    torch.matmul / bmm / mm of two operands, shared with the helper threads
    winograd.py    3x3 stride-1 convolution as Winograd F(4x4, 3x3): 36 products
    winograd_f2.py the same as F(2x2, 3x3): 16 products
    phases.py      a padded plane split into stride phases: every tap reads a unit-stride window
    epilogue.py    bias + residual + activation in one pass; the activation codes
    pool.py        max pooling, separable: rows, then columns
    excitation.py  squeeze-and-excitation: the means, the gates, the scaling
    upsample.py    nearest upsampling by whole factors, plane by plane
    norm.py        layer normalisation, row by row
    softmax.py     softmax over the last dim, row by row
    vexp.py        exp in plain arithmetic, so that loops calling it vectorise
    simd.py        a register tile of a matrix product as numba intrinsics (LLVM IR)
    atomics.py     atomics, a float array at an address, BLAS and kernels by address: numba
                   intrinsics
    jobs.py        a kernel call as a job cut into chunks that threads take without locks
    workers.py     the team of helper threads sharing each kernel call with the caller
    team.py        the calling thread's team and work buffers, as the kernels read them
    kernel.py      @kernel, @intrinsic and the type names: the declarations, bound later
    cpu.py         this CPU's model, instruction sets and level-2 cache
    binding.py     the kernel modules found and imported, compiled functions put in place
    aot.py         the kernels compiled ahead of time into extension modules, once per machine
    backend.py     start(): the choice between the compiled modules and the JIT

No module imports one that imports it back (tests/runtime/test_imports.py). The kernel modules
import the declarations from kernel.py, not backend.py, and read the helper team from
team.py, not workers.py (which imports them, through jobs.py); simd.py, aot.py and
algorithms.py read the CPU from cpu.py; binding.py finds the kernel modules on disk and
imports them by name; aot.py builds on binding.py; backend.py, which chooses and binds, is
imported only by this package, workers.py (to start the kernels) and the users outside
(infer).

Every kernel takes C-contiguous, aligned float32 arrays (NCHW) and writes into arrays it is
given. The numba kernels are compiled once per machine into extension modules that later
processes import without numba (backend.py, aot.py); ``PNNX_INFER_KERNELS=jit`` has numba
compile them just in time instead. ``start()`` (which a graph's build calls) binds them.
A forward on two or more threads shares each kernel call with helper threads (workers.py,
jobs.py); the matrix products run in this package's register tiles, or on numpy's OpenBLAS
where a layer's product is a plain matrix product (grouped convolutions, nn.Linear).
"""

from layers.fast.backend import COMPILING, FAILED, start
import layers.fast.layers  # noqa: E402,F401  (registers the fast layers)
import layers.fast.products  # noqa: E402,F401  (the products of two operands)

__all__ = ["start", "COMPILING", "FAILED"]
