"""One convolution's weights, packed for the fast kernels, and the choice between them.

    packed = PackedConv2d(weight, bias, stride, dilation, groups)
    y = packed.run(x, pads, out_hw, activation, residual)     # (N, C_out, Ho, Wo)

Which kernel runs depends on the convolution and on the size of its input:

    depthwise     groups == C_in, one input channel per group    numba direct kernel
    depthwise_channels_last   the same, small outputs: channels last, by blocks of channels
    pointwise_transposed      1x1, stride 1, small images: channels in the vector lanes
    winograd      3x3, stride 1, dilation 1, groups 1: F(4x4, 3x3), with enough tiles
    winograd_f2   the same convolutions: F(2x2, 3x3), when F(4x4) does not pay
    gemm          everything else: 1x1 by register tiles (pointwise.py), k x k through im2col

Winograd F(4x4) multiplies 4x fewer values than im2col but reads 4x more weights (U is
36 C_out C_in floats against 9 C_out C_in), so when the image has few 4x4 tiles the weights
dominate. F(2x2) multiplies 2.25x fewer and packs 16 C_out C_in floats. Both run their
products in register tiles (pointwise.py), whose lanes are best used when the tiles T of a
product are a multiple of the tile's width (16 with AVX2). Measured on an AVX2 machine (AMD
Zen, 2 threads, caches flushed before each run as in a forward; ResNet-18's convolutions):

* F(4x4) from 16 tiles of 4x4, unless its packed weights pass 16 MiB (ResNet's 512-channel
  convolutions would pack 36 MiB each, read from memory on every run). At 14x14 (16 tiles)
  it takes 2.2 ms against 3.7 for F(2x2) (256 channels); from 28x28 up it is the faster one
  anyway.
* otherwise F(2x2) from 16 tiles of 2x2 (F(4x4) at 7x7, 4 tiles, would fill a quarter of the
  lanes). But a convolution whose F(2x2) packing passes 8 MiB (ResNet's 512-channel ones:
  16 MiB each) takes it only from 64 tiles (4 images of 7x7): at batch 1 its 3.7 ms against
  6.5-7.0 for im2col would save ~9 ms of a ResNet-18 forward, but the packing (15-35 ms
  each, of a fresh 16 MiB) made ResNet-18's load slower than onnxruntime's session (0.146
  against 0.139 s; a dynamic export packs it at build), and im2col reads the weight as it is.
  At batch 8 F(2x2) is packed in the first such forward.
* otherwise im2col (5x5 images: 9 tiles of 2x2).

Winograd's transforms add and subtract the inputs of a whole tile, so one Inf or NaN in the
input would make NaN of outputs whose windows do not reach it (inf - inf), where torch keeps
it to the windows that read it. An input that is not all finite goes through im2col instead.
The check is one BLAS dot product of the input with itself (an Inf or NaN anywhere makes it
Inf or NaN; 3x faster than its sum, ~0.15 ms per ResNet-18 forward). Finite values so large
that their squares overflow (beyond ~1e17) take im2col too: correct, only slower.

Each packing is made the first time it is needed (the graph asks for it while planning
shapes at build, when shapes are known) and kept; a Winograd packing gives back the pages of
the memory-mapped weight it was made from.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

import numpy as np

from layers.fast import workers
from layers.fast.depthwise import depthwise_conv2d, pack_channel_blocks, uses_channels_last
from layers.fast.epilogue import IDENTITY, NO_ARRAY, Activation, bias_residual_activation
from layers.fast.gemm import gemm_conv2d, pack_gemm_weight
from layers.fast.pointwise_transposed import (pack_panels, pointwise_transposed_conv2d,
                                              transposed_pays)
from layers.fast.winograd import TAPS, TILE, pack_winograd_weight, winograd_conv2d
from layers.fast.winograd_f2 import TAPS as TAPS_F2
from layers.fast.winograd_f2 import TILE as TILE_F2
from layers.fast.winograd_f2 import pack_winograd_f2_weight, winograd_f2_conv2d
from parser.bin import release_pages

Pair = tuple[int, int]
Call = Callable[[np.ndarray, "np.ndarray | None", np.ndarray], None]   # (x, residual, y)
WINOGRAD_MIN_TILES = 16                  # F(4x4): at least this many 4x4 tiles (all images)
WINOGRAD_MAX_PACKED = 16 * 2 ** 20       # F(4x4): at most this many bytes of packed weights
WINOGRAD_F2_MIN_TILES = 16               # F(2x2): at least this many 2x2 tiles
WINOGRAD_F2_LARGE = 8 * 2 ** 20          # F(2x2) packings of more bytes than this ...
WINOGRAD_F2_LARGE_MIN_TILES = 64         # ... need this many tiles (4 images of 7x7)
WINOGRAD = {                             # variant: how its weights are packed, how it runs
    "winograd": (pack_winograd_weight, winograd_conv2d),
    "winograd_f2": (pack_winograd_f2_weight, winograd_f2_conv2d),
}


class PackedConv2d:
    """The weight of one convolution in the layouts its kernels read; bias as float32."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, stride: Pair,
                 dilation: Pair, groups: int, winograd: bool = True):
        self.weight, self.stride, self.dilation, self.groups = weight, stride, dilation, groups
        self.c_out, c_group, *kernel = weight.shape
        self.c_in, self.kernel = c_group * groups, tuple(kernel)
        self.bias = None if bias is None else np.array(bias, np.float32)   # writable copy
        self.depthwise = groups == self.c_in and c_group == 1 and groups > 1
        self.pointwise = self.kernel == (1, 1) and stride == (1, 1) and groups == 1
        self.winograd_ok = winograd and (self.kernel == (3, 3) and stride == (1, 1)
                            and dilation == (1, 1) and groups == 1)
        # F(4x4)'s packed weights U (36, C_out, C_in) fit the limit (else F(2x2) runs)
        self.f4_fits = TAPS * TAPS * self.c_out * self.c_in * 4 <= WINOGRAD_MAX_PACKED
        self.f2_large = TAPS_F2 * TAPS_F2 * self.c_out * self.c_in * 4 > WINOGRAD_F2_LARGE
        self._packs: dict[str, np.ndarray] = {}
        self._calls: dict[tuple, Call] = {}      # call_for's, by input shape and geometry
        self._lock = threading.Lock()

    def algorithm(self, batch: int, out_hw: Pair) -> str:
        """'depthwise', 'depthwise_channels_last', 'pointwise_transposed', 'winograd',
        'winograd_f2' or 'gemm' for this many images of this output size (the rules are in the
        module docstring)."""
        if self.depthwise:
            if uses_channels_last(self.c_in, self.c_out, self.kernel, self.stride, out_hw):
                return "depthwise_channels_last"
            return "depthwise"
        if self.pointwise and transposed_pays(out_hw[0] * out_hw[1], self.c_out):
            return "pointwise_transposed"
        if not self.winograd_ok:
            return "gemm"
        tiles = batch * -(-out_hw[0] // TILE) * -(-out_hw[1] // TILE)
        if tiles >= WINOGRAD_MIN_TILES and self.f4_fits:
            return "winograd"
        tiles_f2 = batch * -(-out_hw[0] // TILE_F2) * -(-out_hw[1] // TILE_F2)
        if tiles_f2 >= (WINOGRAD_F2_LARGE_MIN_TILES if self.f2_large else WINOGRAD_F2_MIN_TILES):
            return "winograd_f2"
        return "gemm"

    def packed(self, algorithm: str) -> np.ndarray:
        """The weight packed for ``algorithm``, made on first use."""
        pack = self._packs.get(algorithm)
        if pack is None:
            with self._lock:
                pack = self._packs.get(algorithm)
                if pack is None:
                    pack = self._packs[algorithm] = self._pack(algorithm)
        return pack

    def _pack(self, algorithm: str) -> np.ndarray:
        if algorithm == "depthwise":                  # (C_out, 1, kh, kw) -> (C_out, kh, kw)
            return np.array(self.weight.reshape(self.c_out, *self.kernel), np.float32)
        if algorithm == "depthwise_channels_last":
            return pack_channel_blocks(self.weight.reshape(self.c_out, *self.kernel))
        if algorithm == "pointwise_transposed":
            packed = pack_panels(self.weight.reshape(self.c_out, self.c_in))
        elif algorithm in WINOGRAD:
            packed = WINOGRAD[algorithm][0](self.weight)
        else:
            return pack_gemm_weight(self.weight, self.groups)
        release_pages(self.weight)        # read again only if im2col runs it one day
        return packed

    def load_candidate_kernels(self) -> None:
        """Load the numba kernels of every algorithm this convolution may run (which one
        depends on the input size): at build, so that a graph whose shapes are known only
        when it runs does not load them in its first inference."""
        if self.depthwise:
            load_kernels("depthwise")
            load_kernels("depthwise_channels_last")
            return
        load_kernels("gemm")
        if self.pointwise:
            load_kernels("pointwise_transposed")
        if self.winograd_ok:
            for variant in WINOGRAD:
                load_kernels(variant)

    def prepare_for_any_size(self) -> None:
        """Pack now what any input size is likely to need, for a graph whose shapes are
        known only when it runs: a convolution whose F(4x4) packing would pass
        WINOGRAD_MAX_PACKED runs F(2x2) on every image of 16 or more 2x2 tiles, so its
        packing is made at build, not in the first inference; unless that packing is large
        too (then it waits for a batch that needs it)."""
        if self.winograd_ok and not self.f4_fits and not self.f2_large:
            self.packed("winograd_f2")

    def prepare(self, batch: int, out_hw: Pair) -> None:
        """Pack what ``run`` will need for this size now (at build) rather than mid-forward,
        and load its numba kernels."""
        algorithm = self.algorithm(batch, out_hw)
        self.packed(algorithm)
        load_kernels(algorithm)

    def run(self, x: np.ndarray, pads: tuple[int, int, int, int], out_hw: Pair,
            activation: Activation, residual: np.ndarray | None = None,
            out: np.ndarray | None = None) -> np.ndarray:
        """x (N, C_in, H, W) -> activation(conv(x) + bias + residual) (N, C_out, Ho, Wo);
        pads are (top, bottom, left, right) zeros around x. ``out``: a C-contiguous float32
        array of the output's shape to write into (not overlapping x or residual), or None
        for a new one."""
        x = _kernel_layout(x)
        if residual is not None:
            residual = _kernel_layout(residual)
        y = np.empty((x.shape[0], self.c_out, *out_hw), np.float32) if out is None else out
        self.call_for(x.shape, pads, out_hw, activation)(x, residual, y)
        return y

    def call_for(self, x_shape: tuple[int, ...], pads: tuple[int, int, int, int], out_hw: Pair,
                 activation: Activation) -> Call:
        """This convolution for inputs of ``x_shape``, as a call ``(x, residual, y)`` that
        writes y: the algorithm, its packed weight and the kernel's arguments are worked out
        once per shape. A forward asks for the same shapes every time, and working them out
        on every call cost ~5 us of Python a convolution (0.35 ms of an EfficientNet-Lite0
        forward, more than the microseconds suggest: Python's own data leaves the caches
        while the kernels run)."""
        key = (x_shape, pads, out_hw, activation.code, activation.a, activation.b)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self._make_call(x_shape[0], pads, out_hw, activation)
        return call

    def _make_call(self, batch: int, pads: tuple[int, int, int, int], out_hw: Pair,
                   activation: Activation) -> Call:
        algorithm = self.algorithm(batch, out_hw)
        if algorithm == "pointwise_transposed" and any(pads):
            algorithm = "gemm"                        # zeros around x: not a plain product
        weight = self.packed(algorithm)
        bias, stride, dilation, kernel = self.bias, self.stride, self.dilation, self.kernel

        def im2col(x, residual, y):
            gemm_conv2d(x, self.packed("gemm"), bias, kernel, stride, pads, dilation, out_hw,
                        activation, residual, y)

        if algorithm.startswith("depthwise"):
            def depthwise(x, residual, y):
                own = activation if residual is None else IDENTITY
                team = workers.current()
                if team is None:
                    depthwise_conv2d(x, weight, bias, stride, pads, dilation, out_hw, own, y)
                else:                                 # shared with the helper threads
                    team.depthwise(x, weight, NO_ARRAY if bias is None else bias, y, stride,
                                   dilation, pads, own)
                if residual is not None:              # rare (MobileNet blocks end in 1x1)
                    bias_residual_activation(y, None, residual, activation)
            return depthwise
        if algorithm == "pointwise_transposed":
            c_in, c_out, length = self.c_in, self.c_out, out_hw[0] * out_hw[1]

            def transposed(x, residual, y):
                images = x.shape[0]
                pointwise_transposed_conv2d(weight, x.reshape(images, c_in, length), bias,
                                            residual, activation,
                                            y.reshape(images, c_out, length))
            return transposed
        if algorithm in WINOGRAD:
            convolve = WINOGRAD[algorithm][1]

            def winograd(x, residual, y):
                if np.isfinite(np.vdot(x, x)):
                    convolve(x, weight, bias, pads, out_hw, activation, residual, y)
                else:   # the transforms would spread an Inf or NaN over whole tiles
                    im2col(x, residual, y)
            return winograd
        return im2col


def _kernel_layout(x: np.ndarray) -> np.ndarray:
    """x as the kernels take it: float32, C-contiguous, aligned, writeable (a copy if not)."""
    flags = x.flags
    if x.dtype == np.float32 and flags.c_contiguous and flags.aligned and flags.writeable:
        return x                                   # nearly always: no np.require (1 us)
    return np.require(x, np.float32, ("C", "A", "W"))


@functools.cache
def load_kernels(algorithm: str) -> None:
    """Run ``algorithm``'s kernels once in this process on a tiny convolution, so that numba
    loads them from its disk cache (a few ms each; compiling, the first time ever) while the
    graph is built rather than in its first inference. The tiny arrays have the types of the
    real calls (C-contiguous float32), so the same compiled code serves both."""
    x, bias = np.zeros((1, 2, 6, 6), np.float32), np.zeros(2, np.float32)
    if algorithm.startswith("depthwise"):              # as packed: (C_out, kh, kw) or blocks
        weight = np.zeros((2, 3, 3), np.float32)
        if algorithm == "depthwise_channels_last":
            weight = pack_channel_blocks(weight)
        depthwise_conv2d(x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), (6, 6), IDENTITY)
    elif algorithm == "pointwise_transposed":
        pointwise_transposed_conv2d(pack_panels(np.zeros((2, 2), np.float32)),
                                    x.reshape(1, 2, 36), bias, None, IDENTITY,
                                    np.zeros((1, 2, 36), np.float32))
    elif algorithm in WINOGRAD:
        pack, convolve = WINOGRAD[algorithm]
        convolve(x, pack(np.zeros((2, 2, 3, 3), np.float32)), bias, (1, 1, 1, 1), (6, 6),
                 IDENTITY)
    else:
        weight = np.zeros((2, 2, 3, 3), np.float32)
        gemm_conv2d(x, pack_gemm_weight(weight, 1), bias, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1),
                    (6, 6), IDENTITY)
