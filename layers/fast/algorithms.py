"""The table of convolution algorithms of the fast backend, in the order they are preferred.

Each entry (``Algorithm``) is one way to compute a convolution, declared once by its parts:

    fits(conv) -> bool                    it computes this convolution (kernel, stride, groups)
    pays(conv, batch, out_hw) -> bool     it is the one to run at this size (None: always)
    pack(conv) -> array                   the weight in the layout its kernels read
    make_call(conv, pads, out_hw, activation) -> call (x, residual, y) that writes y
    warm()                                one tiny call that loads its compiled kernels

A convolution of ``batch`` images of ``out_hw`` outputs runs the first entry that fits and
pays (``choose``); ``conv`` is a PackedConv2d (layers/fast/conv.py), which keeps each
packing and each call. The rules, in order:

    depthwise_channels_last  depthwise, C_out == C_in, unless its kernel and stride
                             (stride-1 3x3 and 5x5) have planes of PLANES_FROM_OUTPUTS
                             outputs or more, or (stride-2 3x3 and 5x5) input planes a
                             multiple of 4 KiB apart and ALIASED_PLANES_FROM_OUTPUTS
                             outputs or more, or one image of at most LANES channels has
                             ONE_UNIT_PLANES_FROM: channels last, LANES channels in a
                             vector
    depthwise                groups == C_in > 1, one input channel per group: plane by plane
    gemv                     1x1, stride 1, groups 1, on 1x1 images: BLAS, then the epilogue
    pointwise_transposed     1x1, stride 1, groups 1, on images small enough that channels
                             in the vector lanes fill enough more of them to pay for its
                             epilogue (EPILOGUE_CHANNELS)
    winograd                 3x3, stride 1, dilation 1, groups 1, with WINOGRAD_MIN_CHANNELS
                             to WINOGRAD_MAX_CHANNELS input channels: F(4x4, 3x3), from
                             WINOGRAD_MIN_TILES 4x4 tiles, if its packing fits
                             WINOGRAD_MAX_PACKED, and from F4_OVER_DIRECT channels where
                             direct (below) pays; where its packing is larger than a core's
                             level-2 cache, only on tiles enough to pay for reading 36 values
                             a filter where F(2x2) reads 16, if F(2x2) would run
                             (``_f4_outruns_streaming``)
    winograd_f2              3x3, stride 1, dilation 1, groups 1, from WINOGRAD_F2_MIN_CHANNELS
                             input channels (F2_OVER_DIRECT where direct pays): F(2x2, 3x3),
                             from WINOGRAD_F2_MIN_TILES 2x2 tiles (WINOGRAD_F2_LARGE_MIN_TILES
                             if it packs more than WINOGRAD_F2_LARGE bytes; such a packing is
                             made in the background, as below, unless at build)
    direct                   groups 1, not a 1x1 of stride 1: the convolution without cols
                             (layers/fast/direct.py), where its tiles, which keep to an output
                             row, fill DIRECT_LEAST_FILL of their pixels or more (rows of 7 or
                             8 outputs do not: ``direct.row_fill``) and DIRECT_LEAST_LANES of
                             their lanes (``direct.lane_fill``), and a band's copy holds at
                             most DIRECT_COPY_MOST floats; from gemm_transposed's panels (one
                             packing for both: ``Algorithm.packing``), made in the background
                             when large, as below
    gemm_transposed          groups 1, not a 1x1 of stride 1 (those padded run im2col and
                             this product from pointwise_transposed's panels): im2col, then
                             the transposed 1x1's product where it pays (as above, with
                             C_in * kh * kw channels); panels of more than PACKED_IN_FORWARD
                             bytes are packed in the background unless at build, im2col's
                             upright product running the calls at a size until they are
                             (``_once_packed``)
    gemm                     any convolution: 1x1 in register tiles; larger kernels with
                             one group on cols made band by band (large images); strided
                             or padded 1x1, small cols and grouped ones through im2col
                             (layers/fast/gemm.py says when)

Against onnxruntime's direct NCHWc kernels, im2col's copies of every window were the cost of
the strided and few-channel convolutions; the direct convolution reads the input rows
instead. It beats F(4x4) below 24 input channels and F(2x2) below 192 (where each Winograd
tile transforms few channels: BENCHMARKS.md has the measurements), hence F4_OVER_DIRECT and
F2_OVER_DIRECT.

A forward reads every layer's weights from beyond the level-2 cache (the model's other
weights pass through it in between), and F(4x4)'s packing is 4x the weights, F(2x2)'s 16/9x:
on few tiles (one 14x14 image) the bytes F(4x4) reads cost more than the multiply-adds it
saves (BENCHMARKS.md has the measurements), hence STREAMED_MACS.

F(4x4)'s channel range is where its largest error against float64 is measured within 4x
torch's (layers/fast/winograd.py, tests/fast/test_precision.py): its output transform
amplifies the rounding of each product's sum, which dominates with few channels (a handful of
products, torch's error a few ulps: up to 3x torch's at 64 channels); with more channels
torch's own error grows faster than F(4x4)'s chains of 16 to 64 (pointwise.stack_chain:
0.3-0.8x torch's from 128 to 512 channels on AMD machines). Where torch errs less (its
AVX-512 kernels on an Intel Xeon: 6.8e-5 at 512 channels) F(4x4) reaches 3.9x torch's at 256
channels and 4.2-5x at 384 and 512, so it stops at 256. F(2x2)'s stays within it at any count.

Winograd's transforms add and subtract a whole tile's inputs, so an Inf or NaN would spread
over the tile (inf - inf) where torch keeps it in the windows that read it: an input that is
not all finite (its dot product with itself is not finite, which also catches values whose
squares overflow) runs im2col instead. A padded 1x1 convolution runs im2col too.

Winograd's packings (a product per filter) are shared with the helper threads
(``workers.sharing``), at build as in a forward, but not by the thread that packs in the
background, which works alone (team.work_alone): the kernel modules below this one only
share what their caller shares (layers/fast/team.py).
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import Future
from typing import Callable, NamedTuple, Protocol

import numpy as np

from layers.fast import workers
from layers.fast.cpu import level2_cache_bytes
from layers.fast.direct import copy_size, direct_product, lane_fill, row_fill
from layers.fast.depthwise import (depthwise_conv2d, depthwise_product, pack_channel_blocks,
                                   uses_channels_last)
from layers.fast.epilogue import IDENTITY, Activation, bias_residual_activation
from layers.fast.gemm import (gemm_conv2d, gemm_transposed_conv2d, im2col_product,
                             pack_gemm_weight)
from layers.fast.pointwise import pointwise_product
from layers.fast.pointwise_transposed import (lanes_filled, pack_panels,
                                              pointwise_transposed_conv2d, transposed_product,
                                              transposed_pays)
from layers.fast.simd import COLUMNS, LANES
from layers.fast.team import after_sharing
from layers.fast.winograd import TAPS, TILE, pack_winograd_weight, winograd_conv2d
from layers.fast.winograd_f2 import TAPS as TAPS_F2
from layers.fast.winograd_f2 import TILE as TILE_F2
from layers.fast.winograd_f2 import pack_winograd_f2_weight, winograd_f2_conv2d

log = logging.getLogger(__name__)

Pair = tuple[int, int]
Pads = tuple[int, int, int, int]                   # (top, bottom, left, right)
Call = Callable[[np.ndarray, "np.ndarray | None", np.ndarray], None]   # (x, residual, y)

WINOGRAD_MIN_CHANNELS = 16               # F(4x4): this many input channels at least ...
WINOGRAD_MAX_CHANNELS = 256              # ... and at most: its error against float64
                                         # passes 4x torch's beyond (384 and 512 channels,
                                         # where torch's AVX-512 kernels err less)
WINOGRAD_MIN_TILES = 16                  # F(4x4): at least this many 4x4 tiles (all images)
WINOGRAD_MAX_PACKED = 16 * 2 ** 20       # F(4x4): at most this many bytes of packed weights
WINOGRAD_F2_MIN_CHANNELS = 16            # F(2x2): this many input channels at least (fewer:
                                         # its transforms cost more than im2col saves)
WINOGRAD_F2_MIN_TILES = 16               # F(2x2): at least this many 2x2 tiles
WINOGRAD_F2_LARGE = 8 * 2 ** 20          # F(2x2) packings of more bytes than this ...
WINOGRAD_F2_LARGE_MIN_TILES = 64         # ... need this many tiles (4 images of 7x7)
DIRECT_LEAST_FILL = 0.7                 # direct: this share of its tiles' pixels at least,
DIRECT_LEAST_LANES = 0.5                # this share of their lanes at least,
DIRECT_COPY_MOST = 1 << 20              # and at most this many floats of a band's copy
F4_OVER_DIRECT = 24                     # F(4x4) where direct pays: this many input channels
F2_OVER_DIRECT = 192                    # F(2x2) where direct pays: this many input channels
STREAMED_MACS = 16     # F(4x4) over F(2x2) where its packing streams: multiply-adds it saves
                       # per extra packed value read, at least
ONE_UNIT_PLANES_FROM = 32 * 32          # outputs: one block of one image goes by plane
PACKED_IN_FORWARD = 2 * 2 ** 20   # bytes of weight whose gemm_transposed panels (a copy: the
                                  # weight stays too unless mapped from the bin file) are
                                  # packed inside a forward at most; more in the background
PANELS_AT_BUILD_FILL = 0.9              # transposed 1x1: panels packed at build from this


class Convolution(Protocol):
    """What the table reads of a convolution (layers/fast/conv.py's PackedConv2d)."""

    weight: np.ndarray                   # (C_out, C_in / groups, kh, kw)
    bias: np.ndarray | None              # (C_out,) float32
    c_in: int
    c_out: int
    kernel: Pair
    stride: Pair
    dilation: Pair
    groups: int
    depthwise: bool                      # groups == C_in > 1, one input channel per group
    pointwise: bool                      # 1x1, stride 1, groups 1
    winograd_ok: bool                    # 3x3, stride 1, dilation 1, groups 1, Winograd allowed
    once: bool                           # packed for one call: nothing in the background

    def packed(self, algorithm: str) -> np.ndarray: ...

    def packing(self, algorithm: str) -> Future[np.ndarray]: ...

    def has_packed(self, algorithm: str) -> bool: ...

    def packing_failed(self, algorithm: str) -> bool: ...


class Algorithm(NamedTuple):
    """One way to compute a convolution (the module docstring lists the parts)."""

    name: str
    fits: Callable[[Convolution], bool]
    pack: Callable[[Convolution], np.ndarray]
    make_call: Callable[[Convolution, Pads, Pair, Activation], Call]
    warm: Callable[[], None]
    pays: Callable[[Convolution, int, Pair], bool] | None = None
    releases_weight: bool = False        # packing gives back the pages of the mapped weight
    pack_at_build: Callable[[Convolution], bool] | None = None   # for shapes known late
    packs_later: Callable[[Convolution], bool] | None = None     # after the first call
    packing: str = ""                    # the algorithm whose packing it reads ("": its own)

    def applies(self, conv: Convolution, batch: int, out_hw: Pair) -> bool:
        """Whether ``conv`` runs this algorithm on ``batch`` images of ``out_hw`` outputs,
        unless an entry before it in ALGORITHMS applies."""
        return self.fits(conv) and (self.pays is None or self.pays(conv, batch, out_hw))

    def packed_later(self, conv: Convolution) -> bool:
        """Whether this algorithm's packing of ``conv`` is made after its first call at a size
        met in a forward (``packs_later``), not when the size is planned (nor for a
        convolution packed for one call, ``conv.once``: its packing is made there)."""
        return self.packs_later is not None and not conv.once and self.packs_later(conv)


# ----- depthwise: layers/fast/depthwise.py -------------------------------------------------
def _is_depthwise(conv: Convolution) -> bool:
    return conv.depthwise


def _channels_last_pays(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    """depthwise.uses_channels_last, except for one unit of work (one image of at most LANES
    channels) on planes of ONE_UNIT_PLANES_FROM outputs or more: the helpers cannot share a
    unit, while the plane kernel shares the planes."""
    if (batch * -(-conv.c_in // LANES) == 1
            and out_hw[0] * out_hw[1] >= ONE_UNIT_PLANES_FROM):
        return False
    return uses_channels_last(conv.c_in, conv.c_out, conv.kernel, conv.stride, out_hw)


def _depthwise_filters(conv: Convolution) -> np.ndarray:
    """(C_out, 1, kh, kw) -> (C_out, kh, kw) float32."""
    return np.array(conv.weight.reshape(conv.c_out, *conv.kernel), np.float32)


def _channel_blocks(conv: Convolution) -> np.ndarray:
    return pack_channel_blocks(conv.weight.reshape(conv.c_out, *conv.kernel))


def _depthwise_call(name: str) -> Callable[[Convolution, Pads, Pair, Activation], Call]:
    """make_call of either depthwise algorithm (the packed weight's shape picks the kernel)."""
    def make_call(conv: Convolution, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
        weight, bias, stride, dilation = conv.packed(name), conv.bias, conv.stride, conv.dilation
        # shared with the helper threads if there are; the activation after a residual
        alone = depthwise_product(weight, bias, conv.c_in, stride, pads, dilation, out_hw,
                                  activation)
        before_residual = alone if activation == IDENTITY else depthwise_product(
            weight, bias, conv.c_in, stride, pads, dilation, out_hw, IDENTITY)

        def depthwise(x, residual, y):
            if residual is None:
                alone(x, y)
            else:                                 # rare (MobileNet blocks end in 1x1)
                before_residual(x, y)
                bias_residual_activation(y, None, residual, activation)
        return depthwise
    return make_call


def _warm_depthwise(blocks: bool) -> Callable[[], None]:
    def warm() -> None:
        x, bias = np.zeros((1, 2, 6, 6), np.float32), np.zeros(2, np.float32)
        weight = np.zeros((2, 3, 3), np.float32)
        depthwise_conv2d(x, pack_channel_blocks(weight) if blocks else weight, bias, (1, 1),
                         (1, 1, 1, 1), (1, 1), (6, 6), IDENTITY)
    return warm


# ----- 1x1 on 1x1 images (a squeeze-and-excitation block's): a matrix-vector product -----
def _is_pointwise(conv: Convolution) -> bool:
    return conv.pointwise


def _one_pixel(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    return out_hw == (1, 1)


def _matrix(conv: Convolution) -> np.ndarray:
    return np.ascontiguousarray(conv.weight.reshape(conv.c_out, conv.c_in), np.float32)


def _gemv_call(conv: Convolution, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
    """y (N, C_out) = x (N, C_in) @ weight.T by BLAS (a GEMV at batch 1), then bias,
    residual and activation in one pass: the register tiles would fill one lane of 32."""
    if any(pads):                                 # zeros around x: not a plain product
        return _gemm_call(conv, pads, out_hw, activation)
    weight, bias, c_in, c_out = conv.packed("gemv"), conv.bias, conv.c_in, conv.c_out

    def gemv(x, residual, y):
        images = x.shape[0]
        np.matmul(x.reshape(images, c_in), weight.T, out=y.reshape(images, c_out))
        bias_residual_activation(y, bias, residual, activation)
    return gemv


def _warm_gemv() -> None:
    bias_residual_activation(np.zeros((1, 2, 1, 1), np.float32), np.zeros(2, np.float32),
                             None, IDENTITY)


# ----- 1x1 on small images: layers/fast/pointwise_transposed.py ----------------------------


def _lanes_fill_better(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    """transposed_pays, for the product of C_in / groups * kh * kw channels (cols' rows)."""
    depth = conv.c_in // conv.groups * conv.kernel[0] * conv.kernel[1]
    return transposed_pays(out_hw[0] * out_hw[1], depth, conv.c_out)


def _panels(conv: Convolution) -> np.ndarray:
    """The (C_out, C_in * kh * kw) matrix as pack_panels (groups 1)."""
    return pack_panels(conv.weight.reshape(conv.c_out, -1))


def _transposed_call(conv: Convolution, pads: Pads, out_hw: Pair,
                     activation: Activation) -> Call:
    if any(pads):                                 # zeros around x: not a plain product
        return _im2col_transposed_call(conv, pads, out_hw, activation, "pointwise_transposed")
    return transposed_product(conv.packed("pointwise_transposed"), conv.bias, conv.c_in,
                              conv.c_out, out_hw[0] * out_hw[1], activation)


def _one_group_im2col(conv: Convolution) -> bool:
    return conv.groups == 1 and not conv.pointwise


def _im2col_transposed_call(conv: Convolution, pads: Pads, out_hw: Pair,
                            activation: Activation, packing: str = "gemm_transposed") -> Call:
    """im2col, then the transposed product, with the panels of algorithm ``packing``."""
    if BY_NAME[packing].packed_later(conv) and not conv.has_packed(packing):
        return _once_packed(conv, packing, pads, out_hw, activation, _im2col_transposed_call)
    panels, bias = conv.packed(packing), conv.bias
    kernel, stride, dilation = conv.kernel, conv.stride, conv.dilation

    def im2col_transposed(x, residual, y):
        gemm_transposed_conv2d(x, panels, bias, kernel, stride, pads, dilation, activation,
                               residual, y)
    return im2col_transposed


def _large_panels(conv: Convolution) -> bool:
    """gemm_transposed's panels are packed in the background (unless at build): a weight of
    more than PACKED_IN_FORWARD bytes."""
    return conv.weight.size * 4 > PACKED_IN_FORWARD


def _direct_at_build(conv: Convolution) -> bool:
    """Panels that a forward would pack (not ``_large_panels``) of a convolution for which
    no Winograd packing is made at build and whose output channels fill DIRECT_LEAST_LANES
    (most sizes run direct then): at build, for a graph whose sizes come at run time."""
    return not (_large_panels(conv) or (_f4_accurate(conv) and _f4_at_build(conv))
                or (_f2_fits(conv) and _f2_at_build(conv))
                or lane_fill(conv.c_out) < DIRECT_LEAST_LANES)


def _once_packed(conv: Convolution, name: str, pads: Pads, out_hw: Pair,
                 activation: Activation, packed_call: Callable[..., Call]) -> Call:
    """Algorithm ``name`` for a weight whose packing for it is not made yet, and larger than
    a forward should wait for (``packs_later``: 9 MiB of gemm_transposed panels, 16 MiB of
    F(2x2) products for a 512-channel 3x3): the first call at a size runs im2col's upright
    product and has the packing made in the background (``conv.packing``) once its forward
    has given back its helper threads (team.after_sharing: the packing thread would take a
    core from them); the next calls run the upright product until the weight is packed,
    then ``packed_call(conv, pads, out_hw, activation)``'s. Both give torch's values to
    float32's rounding (im2col's and the transposed product's sums differ only in their
    last bits; Winograd's are other sums). If the packing fails (no memory), it is said
    once, and the upright product goes on, for this size and any other."""
    upright = _gemm_call(conv, pads, out_hw, activation)
    if conv.packing_failed(name):                 # said when it failed: im2col goes on
        return upright
    run, settled = upright, False
    queued, asked = 0, False            # the process that queued the packing; asked for it

    def ask_for_packing() -> None:
        nonlocal asked, settled
        try:
            conv.packing(name).add_done_callback(_said_if_failed(conv, name))
            asked = True
        except RuntimeError as exc:               # no new thread at interpreter exit
            log.warning("%s packing not made (%s): im2col goes on", name, exc)
            settled = True

    def once_packed(x, residual, y):
        nonlocal run, settled, queued
        # (conv.packing: the future, asked again in a forked child, where it was the parent's)
        if asked and not settled and conv.packing(name).done():
            run = upright if conv.packing_failed(name) else packed_call(conv, pads, out_hw,
                                                                        activation)
            settled = True
        run(x, residual, y)
        if not settled and queued != os.getpid():  # not yet, or in a forked child that
            queued = os.getpid()                   # never ran the parent's queued action
            after_sharing(ask_for_packing)
    return once_packed


def _said_if_failed(conv: Convolution, name: str) -> Callable[[Future], None]:
    """A done callback for a packing made in the background: a warning if it failed."""
    def said(future: Future) -> None:
        exc = future.exception()
        if exc is not None:                       # MemoryError, most likely
            log.warning("%s packing of a %s weight not made (%s): im2col goes on", name,
                        "x".join(map(str, conv.weight.shape)), exc)
    return said


def _direct_pays(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    """The convolution without cols runs where its tiles, which stay within an output row,
    fill DIRECT_LEAST_FILL of their pixels or more (direct.row_fill: not on rows of 7 or 8
    outputs, where the transposed product on cols fills every lane), their output channels
    DIRECT_LEAST_LANES of their lanes or more (direct.lane_fill: not for a head of a few
    channels, a lane each), and a thread's copy of a band's input holds at most
    DIRECT_COPY_MOST floats."""
    return (row_fill(out_hw[1], conv.c_out) >= DIRECT_LEAST_FILL
            and lane_fill(conv.c_out) >= DIRECT_LEAST_LANES
            and conv.c_in * copy_size(conv.kernel, conv.stride, conv.dilation, out_hw)
            <= DIRECT_COPY_MOST)


def _direct_call(conv: Convolution, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
    """The convolution without cols (layers/fast/direct.py), from the panels of
    gemm_transposed; a product worked out for each input size it meets."""
    if BY_NAME["direct"].packed_later(conv) and not conv.has_packed("direct"):
        return _once_packed(conv, "direct", pads, out_hw, activation, _direct_call)
    panels, bias = conv.packed("direct"), conv.bias
    products: dict[Pair, Callable[..., None]] = {}

    def direct(x, residual, y):
        hw = x.shape[2:]
        product = products.get(hw)
        if product is None:
            product = products[hw] = direct_product(
                panels, bias, conv.c_in, conv.c_out, conv.kernel, conv.stride, pads,
                conv.dilation, hw, out_hw, activation)
        product(x, residual, y)
    return direct


def _warm_direct() -> None:
    x, y = np.zeros((1, 2, 6, 6), np.float32), np.zeros((1, 2, 6, 6), np.float32)
    panels = pack_panels(np.zeros((2, 18), np.float32))
    direct_product(panels, None, 2, 2, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (6, 6), (6, 6),
                   IDENTITY)(x, None, y)


def _warm_gemm_transposed() -> None:
    x, y = np.zeros((1, 2, 6, 6), np.float32), np.zeros((1, 2, 6, 6), np.float32)
    panels = pack_panels(np.zeros((2, 18), np.float32))
    gemm_transposed_conv2d(x, panels, np.zeros(2, np.float32), (3, 3), (1, 1), (1, 1, 1, 1),
                           (1, 1), IDENTITY, None, y)


def _warm_transposed() -> None:
    x = np.zeros((1, 2, 36), np.float32)
    pointwise_transposed_conv2d(pack_panels(np.zeros((2, 2), np.float32)), x,
                                np.zeros(2, np.float32), None, IDENTITY,
                                np.zeros((1, 2, 36), np.float32))


# ----- Winograd F(4x4) and F(2x2): layers/fast/winograd.py, winograd_f2.py ----------------
def _f2_fits(conv: Convolution) -> bool:
    return conv.winograd_ok and conv.c_in >= WINOGRAD_F2_MIN_CHANNELS


def _f4_accurate(conv: Convolution) -> bool:
    """F(4x4) computes conv within 4x torch's error: Winograd's convolutions with
    WINOGRAD_MIN_CHANNELS to WINOGRAD_MAX_CHANNELS input channels."""
    return conv.winograd_ok and WINOGRAD_MIN_CHANNELS <= conv.c_in <= WINOGRAD_MAX_CHANNELS


def _tiles(batch: int, out_hw: Pair, tile: int) -> int:
    return batch * -(-out_hw[0] // tile) * -(-out_hw[1] // tile)


def _f4_fits(conv: Convolution) -> bool:
    """F(4x4)'s packed weights U (36, C_out, C_in) fit WINOGRAD_MAX_PACKED."""
    return TAPS * TAPS * conv.c_out * conv.c_in * 4 <= WINOGRAD_MAX_PACKED


def _f2_large(conv: Convolution) -> bool:
    """F(2x2)'s packed weights U (16, C_out, C_in) pass WINOGRAD_F2_LARGE."""
    return TAPS_F2 * TAPS_F2 * conv.c_out * conv.c_in * 4 > WINOGRAD_F2_LARGE


def _f4_pays(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    return (_tiles(batch, out_hw, TILE) >= WINOGRAD_MIN_TILES and _f4_fits(conv)
            and not (conv.c_in < F4_OVER_DIRECT and _direct_pays(conv, batch, out_hw))
            and (_f4_outruns_streaming(conv, batch, out_hw)
                 or not (_f2_fits(conv) and _f2_pays(conv, batch, out_hw))))


def _f4_streams(conv: Convolution) -> bool:
    """F(4x4)'s packing (36 values a pair of channels) is larger than a core's level-2 cache."""
    return TAPS * TAPS * conv.c_out * conv.c_in * 4 > level2_cache_bytes()


def _f4_outruns_streaming(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    """Whether F(4x4) pays for the bytes of its packing, which a forward reads from beyond
    the level-2 cache when it is larger (the model's other weights pass through it between
    two forwards). For each pair of input and output channels F(4x4) reads 36 packed values
    and does 36 multiply-adds a 4x4 tile, F(2x2) 16 and 16 a 2x2 tile: F(4x4) pays where it
    saves STREAMED_MACS multiply-adds or more for each of the 20 values more it reads (one
    image of 14x14: 16 x 49 - 36 x 16 = 208 saved, 10 a value; of 16x16 22, two of 14x14 21)."""
    if not _f4_streams(conv):
        return True
    saved = (TAPS_F2 * TAPS_F2 * _tiles(batch, out_hw, TILE_F2)
             - TAPS * TAPS * _tiles(batch, out_hw, TILE))
    return saved >= STREAMED_MACS * (TAPS * TAPS - TAPS_F2 * TAPS_F2)


def _f2_pays(conv: Convolution, batch: int, out_hw: Pair) -> bool:
    least = WINOGRAD_F2_LARGE_MIN_TILES if _f2_large(conv) else WINOGRAD_F2_MIN_TILES
    return (_tiles(batch, out_hw, TILE_F2) >= least
            and not (conv.c_in < F2_OVER_DIRECT and _direct_pays(conv, batch, out_hw)))


def _f4_at_build(conv: Convolution) -> bool:
    """Most sizes of WINOGRAD_MIN_TILES or more 4x4 tiles run F(4x4) where it fits (its
    channel range, a packing of at most WINOGRAD_MAX_PACKED bytes) and has F4_OVER_DIRECT
    input channels (fewer run direct on most sizes; few tiles run F(2x2) where its packing
    streams, ``_f2_at_build``): pack it at build."""
    return _f4_fits(conv) and conv.c_in >= F4_OVER_DIRECT


def _panels_at_build(conv: Convolution) -> bool:
    """Small images run the transposed 1x1 kernel when C_out fills nearly all its lanes (at
    least PANELS_AT_BUILD_FILL): pack its panels (a copy of the weight) at build, so that a
    graph whose sizes are known only when it runs does not pack them in its first inference."""
    return lanes_filled(conv.c_out, COLUMNS) >= PANELS_AT_BUILD_FILL


def _f2_at_build(conv: Convolution) -> bool:
    """Any size of 16 or more 2x2 tiles runs F(2x2) when F(4x4) never runs (too many or too
    few channels, or a packing that does not fit), and small ones (one 14x14 image) do where
    F(4x4)'s packing is larger than the level-2 cache (``_f4_outruns_streaming``), if it has
    F2_OVER_DIRECT input channels (fewer run direct on most sizes): pack it at build, beside
    F(4x4)'s in the second case (the first size planned keeps the one it takes), unless that
    packing is large too (then the first forward at a size that takes it has it made in the
    background, ``_once_packed``, and a graph whose shapes are known at build packs it then)."""
    return ((not (_f4_accurate(conv) and _f4_fits(conv)) or _f4_streams(conv))
            and not _f2_large(conv) and conv.c_in >= F2_OVER_DIRECT)


def _shared(pack: Callable) -> Callable[[Convolution], np.ndarray]:
    """A Winograd packing of conv's weight (a product per filter, winograd.transform_filters)
    shared with helper threads, at build too (the same bits): on every core the calling
    thread's cap allows (the graph's, team.thread_cap), on the packing thread alone."""
    def pack_shared(conv: Convolution) -> np.ndarray:
        with workers.sharing(None):
            return pack(conv.weight)
    return pack_shared


def _winograd_call(name: str, convolve: Callable) -> Callable[..., Call]:
    def make_call(conv: Convolution, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
        if BY_NAME[name].packed_later(conv) and not conv.has_packed(name):
            return _once_packed(conv, name, pads, out_hw, activation, make_call)
        weight, bias = conv.packed(name), conv.bias

        def winograd(x, residual, y):
            if np.isfinite(np.vdot(x, x)):
                convolve(x, weight, bias, pads, out_hw, activation, residual, y)
            else:   # the transforms would spread an Inf or NaN over whole tiles
                _gemm_call(conv, pads, out_hw, activation)(x, residual, y)
        return winograd
    return make_call


def _warm_winograd(pack: Callable, convolve: Callable) -> Callable[[], None]:
    def warm() -> None:
        x, bias = np.zeros((1, 2, 6, 6), np.float32), np.zeros(2, np.float32)
        convolve(x, pack(np.zeros((2, 2, 3, 3), np.float32)), bias, (1, 1, 1, 1), (6, 6),
                 IDENTITY)
    return warm


# ----- everything else: layers/fast/gemm.py -------------------------------------------------
def _any(conv: Convolution) -> bool:
    return True


def _gemm_weight(conv: Convolution) -> np.ndarray:
    return pack_gemm_weight(conv.weight, conv.groups)


def _gemm_call(conv: Convolution, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
    weight, bias = conv.packed("gemm"), conv.bias
    kernel, stride, dilation = conv.kernel, conv.stride, conv.dilation
    if conv.pointwise and not any(pads):          # gemm_conv2d's first case (pointwise_gemm)
        return pointwise_product(weight, bias, out_hw[0] * out_hw[1], activation)
    if conv.groups == 1:
        return im2col_product(weight, bias, kernel, stride, pads, dilation, out_hw, activation)

    def im2col(x, residual, y):
        gemm_conv2d(x, weight, bias, kernel, stride, pads, dilation, out_hw, activation,
                    residual, y)
    return im2col


def _warm_gemm() -> None:
    """A 3x3 on 32x32 (cols made band by band), a strided 1x1 and a grouped 3x3 (im2col)."""
    bias = np.zeros(2, np.float32)
    for c_in, size, kernel, stride, pad, groups in ((8, 32, (3, 3), (1, 1), 1, 1),
                                                    (2, 6, (1, 1), (2, 2), 0, 1),
                                                    (2, 6, (3, 3), (1, 1), 1, 2)):
        x = np.zeros((1, c_in, size, size), np.float32)
        out = (size + 2 * pad - kernel[0]) // stride[0] + 1
        weight = pack_gemm_weight(np.zeros((2, c_in // groups, *kernel), np.float32), groups)
        gemm_conv2d(x, weight, bias, kernel, stride, (pad,) * 4, (1, 1), (out, out), IDENTITY)


# ----- the table, in the order of preference -----------------------------------------------
ALGORITHMS: tuple[Algorithm, ...] = (
    # a depthwise layer's packings are copies of its few filters, and which one runs depends
    # on the size: a graph whose sizes come at run time packs both at build (_any), not in
    # its first inference
    Algorithm("depthwise_channels_last", fits=_is_depthwise, pays=_channels_last_pays,
              pack=_channel_blocks, make_call=_depthwise_call("depthwise_channels_last"),
              warm=_warm_depthwise(blocks=True), pack_at_build=_any),
    Algorithm("depthwise", fits=_is_depthwise,
              pack=_depthwise_filters, make_call=_depthwise_call("depthwise"),
              warm=_warm_depthwise(blocks=False), pack_at_build=_any),
    Algorithm("gemv", fits=_is_pointwise, pays=_one_pixel, pack=_matrix, make_call=_gemv_call,
              warm=_warm_gemv),
    Algorithm("pointwise_transposed", fits=_is_pointwise, pays=_lanes_fill_better,
              pack=_panels, make_call=_transposed_call, warm=_warm_transposed,
              releases_weight=True, pack_at_build=_panels_at_build),
    Algorithm("winograd", fits=_f4_accurate, pays=_f4_pays,
              pack=_shared(pack_winograd_weight),
              make_call=_winograd_call("winograd", winograd_conv2d),
              warm=_warm_winograd(pack_winograd_weight, winograd_conv2d),
              releases_weight=True, pack_at_build=_f4_at_build),
    Algorithm("winograd_f2", fits=_f2_fits, pays=_f2_pays,
              pack=_shared(pack_winograd_f2_weight),
              make_call=_winograd_call("winograd_f2", winograd_f2_conv2d),
              warm=_warm_winograd(pack_winograd_f2_weight, winograd_f2_conv2d),
              releases_weight=True, pack_at_build=_f2_at_build, packs_later=_f2_large),
    Algorithm("direct", fits=_one_group_im2col, pays=_direct_pays,
              pack=_panels, make_call=_direct_call, warm=_warm_direct, releases_weight=True,
              pack_at_build=_direct_at_build, packs_later=_large_panels,
              packing="gemm_transposed"),
    Algorithm("gemm_transposed", fits=_one_group_im2col, pays=_lanes_fill_better,
              pack=_panels, make_call=_im2col_transposed_call, warm=_warm_gemm_transposed,
              releases_weight=True, packs_later=_large_panels),
    Algorithm("gemm", fits=_any, pack=_gemm_weight, make_call=_gemm_call, warm=_warm_gemm),
)
BY_NAME = {algorithm.name: algorithm for algorithm in ALGORITHMS}


def packing_of(name: str) -> str:
    """The name under which algorithm ``name``'s packing is kept: its own, or that of the
    algorithm whose packing it reads (``Algorithm.packing``)."""
    return BY_NAME[name].packing or name


def choose(conv: Convolution, batch: int, out_hw: Pair) -> Algorithm:
    """The first algorithm of ALGORITHMS that fits ``conv`` and pays at this size."""
    return next(a for a in ALGORITHMS if a.applies(conv, batch, out_hw))


def candidates(conv: Convolution) -> list[Algorithm]:
    """Every algorithm that some input size may choose for ``conv``: those that fit, in
    order, up to the first that runs at any size."""
    found = []
    for algorithm in ALGORITHMS:
        if algorithm.fits(conv):
            found.append(algorithm)
            if algorithm.pays is None:
                break
    return found


@functools.cache
def warm(name: str) -> None:
    """Run algorithm ``name``'s kernels once in this process on a tiny convolution (of the
    types of the real calls), so that they are loaded while a graph is built rather than in
    its first inference; once per process."""
    BY_NAME[name].warm()
