"""Depthwise convolution (groups == C_in, one input channel per group) as numba kernels.

Output channel o reads input channel c = o // m (m = C_out / C_in) through its own filter::

    y[n, o, oh, ow] = bias[o] + sum_{i, j} w[o, i, j]
                                * x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

Plane by plane (``_depthwise``, weight (C_out, kh, kw)): each (n, c) input plane is copied
into its masked stride phases (layers/fast/phases.py), in which every tap reads a plain
window; a whole output plane is then one long loop over t = oh*R + ow, adding the taps
(3x3: all 9 in one pass, the weights in locals; 5x5: one kernel column per pass; others: a
tap per pass) and keeping each kernel column's sum only where that column lies in the
image (``column_ok``, a select, so an Inf next door does not become NaN). With R == Wo
("same" padding) the loop writes the output plane in place; otherwise rows of R values, of
which the first Wo are copied out. The activation then runs over the whole plane.

Channels last (``_depthwise_channels_last``, weight packed by ``pack_channel_blocks`` as
(ceil(C / LANES), kh, kw, LANES)), for C_out == C_in: LANES channels share a vector. Block
of channels by block, the planes are transposed into a zero-padded (PH, PW, LANES) image;
each output pixel of the block is then one chain of vector multiply-adds, a tap at a time,
and the (Ho*Wo, LANES) result is transposed back. It pays for any stride (no phases) and
kernel size, and for small planes; ``uses_channels_last`` says when.

Both give every output's sum in a fixed order, whatever the thread that computes it; the
``*_planes`` and ``*_blocks`` range kernels do a share of the units for jobs.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import Activation, NO_ARRAY, activate_row
from layers.fast.phases import phase_layout, phase_targets, split_plane
from layers.fast.simd import (LANES, aligned_array, aligned_empty, full_width, transpose_block,
                              vector_fma, vector_load, vector_store)
from layers.fast.operands import check, check_sizes, unchecked
from layers.fast.team import current_team
from parser.errors import ShapeError


# FMA: lets the compiler fuse each multiply-add (one rounding instead of two), nothing else
_FMA = {"contract"}


@kernel(nogil=True, fastmath=_FMA)
def _taps_3x3(phases, starts, column_ok, filt, out, length, shift):
    """out[t] = shift + the 9 taps, all in one pass (each output is written once): the taps
    of each kernel column are summed, then kept where that column lies in the image."""
    full_width()
    s00, s01, s02 = phases[starts[0, 0]:], phases[starts[0, 1]:], phases[starts[0, 2]:]
    s10, s11, s12 = phases[starts[1, 0]:], phases[starts[1, 1]:], phases[starts[1, 2]:]
    s20, s21, s22 = phases[starts[2, 0]:], phases[starts[2, 1]:], phases[starts[2, 2]:]
    # the weights in locals: read once, not after every store into out (which might alias)
    w00, w01, w02 = filt[0, 0], filt[0, 1], filt[0, 2]
    w10, w11, w12 = filt[1, 0], filt[1, 1], filt[1, 2]
    w20, w21, w22 = filt[2, 0], filt[2, 1], filt[2, 2]
    ok0, ok1, ok2 = column_ok[0], column_ok[1], column_ok[2]
    zero = np.float32(0.0)
    for t in range(length):
        c0 = w00 * s00[t] + w10 * s10[t] + w20 * s20[t]
        c1 = w01 * s01[t] + w11 * s11[t] + w21 * s21[t]
        c2 = w02 * s02[t] + w12 * s12[t] + w22 * s22[t]
        out[t] = (shift + (c0 if ok0[t] else zero) + (c1 if ok1[t] else zero)
                  + (c2 if ok2[t] else zero))


@kernel(nogil=True, fastmath=_FMA)
def _taps_5x5(phases, starts, column_ok, filt, out, length, shift):
    """out[t] = shift + the 25 taps, by kernel column as in _taps_3x3: one pass per column,
    which adds its 5 taps to out (25 taps in one loop kept more values live than the
    registers hold)."""
    full_width()
    zero = np.float32(0.0)
    for j in range(5):
        s0, s1, s2, s3, s4 = (phases[starts[0, j]:], phases[starts[1, j]:],
                              phases[starts[2, j]:], phases[starts[3, j]:],
                              phases[starts[4, j]:])
        w0, w1, w2, w3, w4 = filt[0, j], filt[1, j], filt[2, j], filt[3, j], filt[4, j]
        ok = column_ok[j]
        if j == 0:
            for t in range(length):
                c = w0 * s0[t] + w1 * s1[t] + w2 * s2[t] + w3 * s3[t] + w4 * s4[t]
                out[t] = shift + (c if ok[t] else zero)
        else:
            for t in range(length):
                c = w0 * s0[t] + w1 * s1[t] + w2 * s2[t] + w3 * s3[t] + w4 * s4[t]
                out[t] += c if ok[t] else zero


@kernel(nogil=True, fastmath=_FMA)
def _taps_any(phases, starts, column_ok, filt, out, length, shift):
    """Any kernel size: out = shift, then one pass per tap."""
    full_width()
    zero = np.float32(0.0)
    for t in range(length):
        out[t] = shift
    for i in range(starts.shape[0]):
        for j in range(starts.shape[1]):
            tap, src, ok = filt[i, j], phases[starts[i, j]:], column_ok[j]
            for t in range(length):
                out[t] += (tap * src[t] if ok[t] else zero)


@kernel(nogil=True, fastmath=_FMA,
        exported=(array(4), array(3), array(1), array(4), *[INT] * 7, FLOAT, FLOAT))
def _depthwise(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a, b):
    """y (N, C_out, Ho, Wo) <- the depthwise convolution of x, plane (n, o) by plane."""
    depthwise_planes(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a, b,
                     np.int64(0), y.shape[0] * y.shape[1])     # int64 0: see jobs.py


@kernel(nogil=True, fastmath=_FMA)
def depthwise_planes(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a, b,
                     first, last):
    """Output planes first .. last - 1 of _depthwise's, counted over (n, o): a share of
    the work for one thread (layers/fast/jobs.py)."""
    n, c_in, height, width = x.shape
    _, c_out, out_h, out_w = y.shape
    kh, kw = w.shape[1], w.shape[2]
    mult = c_out // c_in
    has_bias = bias.shape[0] > 0
    row_len, first_row, phase_size, tap_start, column_ok, length, size = phase_layout(
        height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left)
    phases = np.zeros(size, np.float32)
    targets = phase_targets(height, width, row_len, first_row, phase_size, stride_h, stride_w)
    in_place = row_len == out_w                    # t = oh * Wo + ow: the output plane itself
    wide = np.empty(0 if in_place else length, np.float32)
    # flat planes, reshaped once: a reshape per plane costs as much as a 14 x 14 plane's taps
    planes_in = x.reshape(n * c_in, height * width)
    planes_out = y.reshape(n * c_out, out_h * out_w)
    for plane in range(first, last):
        o = plane % c_out
        if o % mult == 0 or plane == first:        # a new input plane: split it
            split_plane(planes_in[plane // mult], height, width, phases, row_len, first_row,
                        phase_size, stride_h, stride_w, targets)
        filt = w[o]
        shift = bias[o] if has_bias else np.float32(0.0)
        out = planes_out[plane] if in_place else wide
        if kh == 3 and kw == 3:
            _taps_3x3(phases, tap_start, column_ok, filt, out, length, shift)
        elif kh == 5 and kw == 5:
            _taps_5x5(phases, tap_start, column_ok, filt, out, length, shift)
        else:
            _taps_any(phases, tap_start, column_ok, filt, out, length, shift)
        activate_row(out, code, a, b)              # one long loop
        if not in_place:                           # wide rows: keep the first Wo of each
            dst = planes_out[plane]
            for oh in range(out_h):
                row, out_row = wide[oh * row_len:], dst[oh * out_w:]
                for ow in range(out_w):
                    out_row[ow] = row[ow]


# ----- channels last, LANES channels in a vector ------------------------------------------
# One plane's pixels in the vector lanes fill them badly when the output rows are short or
# the taps strided (every stride phase is a copy of its own). With LANES channels in a vector
# instead, one output pixel of a block of channels is one chain of vector multiply-adds,
# whatever the stride, the dilation or the plane's size; the price is a transpose in and out.

@kernel(nogil=True, inline="always")
def padded_extent(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                  top, left):
    """(padded_h, padded_w): a padded image that holds the image at (top, left) and every
    window (so the loops that read it need no bounds checks)."""
    padded_h = max((out_h - 1) * stride_h + (kh - 1) * dil_h + 1, top + height)
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    return padded_h, padded_w


PIXELS = 8          # output pixels computed together: 8 chains of multiply-adds in flight
                    # (_block_pixels' a0 .. a7)


@kernel(nogil=True, fastmath=_FMA)
def _block_pixels(padded, weights, tap_offsets, starts, shift, pixels):
    """pixels[p * LANES + c] = shift[c] + sum over taps t of weights[t * LANES + c] *
    padded[starts[p] + tap_offsets[t] + c], for the LANES channels c of a block, PIXELS
    outputs at a time (each output's sum in tap order). ``starts`` has a multiple of PIXELS
    entries (the last real one repeated: computed, stored past the real pixels, not used)."""
    bias = vector_load(shift, 0)
    for p in range(0, starts.shape[0], PIXELS):
        s0, s1, s2, s3 = starts[p], starts[p + 1], starts[p + 2], starts[p + 3]
        s4, s5, s6, s7 = starts[p + 4], starts[p + 5], starts[p + 6], starts[p + 7]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = bias
        for t in range(tap_offsets.shape[0]):
            w, o = vector_load(weights, t * LANES), tap_offsets[t]
            a0 = vector_fma(w, vector_load(padded, s0 + o), a0)
            a1 = vector_fma(w, vector_load(padded, s1 + o), a1)
            a2 = vector_fma(w, vector_load(padded, s2 + o), a2)
            a3 = vector_fma(w, vector_load(padded, s3 + o), a3)
            a4 = vector_fma(w, vector_load(padded, s4 + o), a4)
            a5 = vector_fma(w, vector_load(padded, s5 + o), a5)
            a6 = vector_fma(w, vector_load(padded, s6 + o), a6)
            a7 = vector_fma(w, vector_load(padded, s7 + o), a7)
        at = p * LANES
        vector_store(a0, pixels, at)
        vector_store(a1, pixels, at + LANES)
        vector_store(a2, pixels, at + 2 * LANES)
        vector_store(a3, pixels, at + 3 * LANES)
        vector_store(a4, pixels, at + 4 * LANES)
        vector_store(a5, pixels, at + 5 * LANES)
        vector_store(a6, pixels, at + 6 * LANES)
        vector_store(a7, pixels, at + 7 * LANES)


@kernel(nogil=True, inline="always")
def _block_geometry(out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, padded_w):
    """(starts, tap_offsets): where each output's window starts in the padded block (its
    top left tap), PIXELS-aligned as _block_pixels wants, and each tap's offset from there."""
    outputs = out_h * out_w
    starts = np.empty(-(-outputs // PIXELS) * PIXELS, np.int64)
    for oh in range(out_h):
        for ow in range(out_w):
            starts[oh * out_w + ow] = (oh * stride_h * padded_w + ow * stride_w) * LANES
    for p in range(outputs, starts.shape[0]):
        starts[p] = starts[outputs - 1]
    tap_offsets = np.empty(kh * kw, np.int64)
    for i in range(kh):
        for j in range(kw):
            tap_offsets[i * kw + j] = (i * dil_h * padded_w + j * dil_w) * LANES
    return starts, tap_offsets


@kernel(nogil=True, inline="always")
def _zero_border(padded, padded_h, padded_w, top, left, height, width):
    """Zero the padded image (PH, PW, LANES) around the H x W image at (top, left), which
    every block overwrites (zeroing it all would cost as much as a small block's work)."""
    row_size = padded_w * LANES
    for r in range(padded_h):
        if r < top or r >= top + height:
            padded[r * row_size:(r + 1) * row_size] = 0.0
        else:
            padded[r * row_size:(r * padded_w + left) * LANES] = 0.0
            padded[(r * padded_w + left + width) * LANES:(r + 1) * row_size] = 0.0


@kernel(nogil=True, inline="always")
def _transpose_in(planes, first, count, height, width, image, padded, top, left, padded_w):
    """The block's ``count`` planes (planes[first:], each H*W) into the zero-padded
    (PH, PW, LANES) image: row by row, LANES pixels at a time, or for rows shorter than
    LANES the whole plane at a time into ``image`` (H*W, LANES) and its rows from there, one
    vector per pixel. transpose_block's arguments: source, its first value, its row step,
    rows and values per row to read; target, first value, row step, rows and values per
    row to write."""
    area = height * width
    if width >= LANES:
        for r in range(height):
            target = ((top + r) * padded_w + left) * LANES
            for p in range(0, width, LANES):
                transpose_block(planes, first + r * width + p, area, count, width - p,
                                padded, target + p * LANES, LANES, min(LANES, width - p),
                                LANES)
        return
    for p in range(0, area, LANES):
        transpose_block(planes, first + p, area, count, area - p, image, p * LANES, LANES,
                        LANES, LANES)
    for r in range(height):
        source, target = r * width * LANES, ((top + r) * padded_w + left) * LANES
        for v in range(0, width * LANES, LANES):       # (a plain loop is not vectorised)
            vector_store(vector_load(image, source + v), padded, target + v)


@kernel(nogil=True, fastmath=_FMA,
        exported=(array(4), array(4), array(1), array(4), *[INT] * 7, FLOAT, FLOAT))
def _depthwise_channels_last(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left,
                             code, a, b):
    """The same convolution, one output channel per input channel, channels last by blocks
    of LANES channels (``depthwise_blocks``)."""
    depthwise_blocks(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code,
                     a, b, np.int64(0), x.shape[0] * blocks.shape[0])


@kernel(nogil=True, fastmath=_FMA)
def depthwise_blocks(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a,
                     b, first, last):
    """Block of LANES channels by block: the block's planes are transposed into a
    zero-padded (PH, PW, LANES) image, every output pixel of the block is one chain of
    vector multiply-adds (``_block_pixels``) into a (Ho*Wo, LANES) buffer, which is
    activated and transposed back into y. ``blocks`` (ceil(C / LANES), kh, kw, LANES) from
    pack_channel_blocks. Only blocks first .. last - 1, counted over (image, block): a chunk
    of the work (layers/fast/jobs.py)."""
    n, channels, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    n_blocks, kh, kw = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    padded_h, padded_w = padded_extent(
        height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left)
    starts, tap_offsets = _block_geometry(out_h, out_w, kh, kw, stride_h, stride_w, dil_h,
                                          dil_w, padded_w)
    area, outputs = height * width, out_h * out_w
    # aligned: each pixel's vector in one cache line
    padded = aligned_array(padded_h * padded_w * LANES)
    _zero_border(padded, padded_h, padded_w, top, left, height, width)
    image = aligned_array(0 if width >= LANES else -(-area // LANES) * LANES * LANES)
    pixels = aligned_array(starts.shape[0] * LANES)
    shift = np.zeros(LANES, np.float32)
    has_bias = bias.shape[0] > 0
    for unit in range(first, last):
        i_n, k = unit // n_blocks, unit % n_blocks
        planes = x[i_n].reshape(-1)
        planes_out = y[i_n].reshape(-1)
        start = k * LANES
        count = min(LANES, channels - start)      # the last block may be partial: its
        if has_bias:                              # other lanes are computed, not stored
            for c in range(count):
                shift[c] = bias[start + c]
        _transpose_in(planes, start * area, count, height, width, image, padded, top, left,
                      padded_w)
        _block_pixels(padded, blocks[k].reshape(-1), tap_offsets, starts, shift, pixels)
        activate_row(pixels[:outputs * LANES], code, a, b)
        for p in range(0, outputs, LANES):        # (Ho*Wo, LANES) -> (count, Ho*Wo)
            transpose_block(pixels, p * LANES, LANES, min(LANES, outputs - p), LANES,
                            planes_out, start * outputs + p, outputs, count, outputs - p)


PLANES_FROM_OUTPUTS = {((3, 3), (1, 1)): 24 * 24, ((5, 5), (1, 1)): 40 * 40}
"""(kernel, stride): one plane at a time from this many outputs a plane: the plane kernel's
long loops then beat the transposes of channels last."""

ALIASED_PLANES_FROM_OUTPUTS = {((3, 3), (2, 2)): 1, ((5, 5), (2, 2)): 64 * 64}
"""(kernel, stride): one plane at a time from this many outputs a plane when the input
planes alias (``planes_alias``): the channels-last kernel's transposes read LANES planes
side by side, and planes a multiple of 4 KiB apart map to the same sets of the L1 cache,
which holds only a few lines per set."""


def planes_alias(out_hw: tuple[int, int], stride: tuple[int, int]) -> bool:
    """Whether the input planes of a convolution with these outputs and stride are a
    multiple of 4 KiB apart, taking them to be (Ho * sh, Wo * sw) floats (as they are for
    even sizes with "same" padding: 96 x 96 -> 48 x 48 with stride 2)."""
    return out_hw[0] * stride[0] * out_hw[1] * stride[1] * 4 % 4096 == 0


def uses_channels_last(c_in: int, c_out: int, kernel: tuple[int, int],
                       stride: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether this depthwise convolution runs the channels-last kernel rather than the one
    plane at a time: one output channel per input channel, channels that fill at least 3/4
    of their vectors' lanes (3 channels would fill 3 of 16), and any stride or kernel size
    but those of PLANES_FROM_OUTPUTS on large planes and of ALIASED_PLANES_FROM_OUTPUTS on
    planes that alias."""
    if c_out != c_in or 4 * c_in < 3 * -(-c_in // LANES) * LANES:
        return False
    outputs = out_hw[0] * out_hw[1]
    planes_from = PLANES_FROM_OUTPUTS.get((kernel, stride))
    if planes_from is not None and outputs >= planes_from:
        return False
    aliased_from = ALIASED_PLANES_FROM_OUTPUTS.get((kernel, stride))
    return aliased_from is None or outputs < aliased_from or not planes_alias(out_hw, stride)


def pack_channel_blocks(weight: np.ndarray) -> np.ndarray:
    """(C, kh, kw) -> (ceil(C / LANES), kh, kw, LANES) float32: each block's taps channels
    last, zeros past the last channel."""
    channels, kh, kw = weight.shape
    n_blocks = -(-channels // LANES)
    blocks = np.zeros((n_blocks * LANES, kh, kw), np.float32)
    blocks[:channels] = weight
    packed = aligned_empty((n_blocks, kh, kw, LANES))
    packed[...] = blocks.reshape(n_blocks, LANES, kh, kw).transpose(0, 2, 3, 1)
    return packed


def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                     stride: tuple[int, int], pads: tuple[int, int, int, int],
                     dilation: tuple[int, int], out_hw: tuple[int, int],
                     activation: Activation, out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, pads (top, bottom, left, right) -> y (N, C_out,
    Ho, Wo) with bias and activation applied. ``weight`` picks the kernel: (C_out, kh, kw)
    (the (C_out, 1, kh, kw) weight) runs one plane at a time; pack_channel_blocks' 4-D
    blocks run channels last (``uses_channels_last`` says when that pays)."""
    n = x.shape[0]
    c_out = weight.shape[0] if weight.ndim == 3 else x.shape[1]
    y = np.empty((n, c_out, *out_hw), np.float32) if out is None else out
    depthwise_product(weight, bias, x.shape[1], stride, pads, dilation, out_hw, activation,
                      shared=False)(x, y)
    return y


def depthwise_product(weight: np.ndarray, bias: np.ndarray | None, c_in: int,
                      stride: tuple[int, int], pads: tuple[int, int, int, int],
                      dilation: tuple[int, int], out_hw: tuple[int, int],
                      activation: Activation, shared: bool = True) -> Callable[..., None]:
    """depthwise_conv2d of x (N, c_in, H, W) into y (N, C_out, *out_hw), worked out once: the
    call ``product(x, y)`` checks the arrays it is given (operands.check_sizes; the filters
    and bias, which the kernels trust, are checked here) and runs the kernel without the
    per-argument checks, shared with this thread's team (layers/fast/team.py) if ``shared``
    and there is one."""
    if weight.ndim not in (3, 4):
        raise ShapeError(f"depthwise convolution: a weight of 3 or 4 dims, got {weight.shape}")
    c_out = weight.shape[0] if weight.ndim == 3 else c_in
    if weight.ndim == 3:
        fits = c_in > 0 and c_out % c_in == 0
    else:
        fits = weight.shape[0] == -(-c_in // LANES) and weight.shape[3] == LANES
    if not fits or (bias is not None and bias.shape != (c_out,)):
        raise ShapeError(f"depthwise convolution: input channels {c_in}, weight "
                         f"{weight.shape} and bias {None if bias is None else bias.shape} do "
                         f"not fit")
    check(weight, weight.shape, "depthwise convolution weight")
    bias = NO_ARRAY if bias is None else bias
    check(bias, bias.shape, "depthwise convolution bias")
    y_tail = (c_out, *out_hw)
    y_size = c_out * out_hw[0] * out_hw[1]
    kernel = unchecked(_depthwise if weight.ndim == 3 else _depthwise_channels_last)
    arguments = (stride[0], stride[1], dilation[0], dilation[1], pads[0], pads[2],
                 activation.code, activation.a, activation.b)

    def product(x: np.ndarray, y: np.ndarray) -> None:
        images = x.shape[0]
        if x.ndim != 4 or x.shape[1] != c_in:
            raise ShapeError(f"depthwise convolution: an input of {c_in} channels (N, C, H, "
                             f"W) expected, got {x.shape}")
        check_sizes(x, (images, c_in), x.size, y, (images, *y_tail), images * y_size,
                    "depthwise convolution")
        team = current_team() if shared else None
        if team is None:
            kernel(x, weight, bias, y, *arguments)
        else:
            team.depthwise(x, weight, bias, y, stride, dilation, pads, activation,
                           checked=False)
    return product
