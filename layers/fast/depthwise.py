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
(ceil(C / 128), kh, kw, 128)): for small outputs (``uses_channels_last``: 3x3 or 5x5,
C_out == C_in, at most CHANNELS_LAST_MAX_OUTPUTS outputs a plane, 2x as many strided), the
image is transposed block of CHANNEL_BLOCK channels by block into a zero-padded
(PH, PW, block) buffer, and every output pixel is one loop over the block's channels.

Both give every output's sum in a fixed order, whatever the thread that computes it; the
``*_planes`` and ``*_blocks`` range kernels do a share of the units for jobs.py.
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import Activation, NO_ARRAY, activate_row
from layers.fast.phases import phase_layout, phase_targets, split_plane


# FMA: lets the compiler fuse each multiply-add (one rounding instead of two), nothing else
_FMA = {"contract"}


@kernel(nogil=True, fastmath=_FMA)
def _taps_3x3(phases, starts, column_ok, filt, out, length, shift):
    """out[t] = shift + the 9 taps, all in one pass (each output is written once): the taps
    of each kernel column are summed, then kept where that column lies in the image."""
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


# ----- small planes: channels last --------------------------------------------------------
# With few outputs per plane (4 x 4), the loop over one plane is too short to pay for its
# set-up; laid out channels last, one output pixel is a loop over all the channels instead.

@kernel(nogil=True, inline="always")
def padded_extent(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                  top, left):
    """(padded_h, padded_w, rows, cols): a padded image that holds every window (so the loops
    that read it need no bounds checks), and the rows x cols of the image that any window
    reads (the rest is never copied)."""
    padded_h = max((out_h - 1) * stride_h + (kh - 1) * dil_h + 1, top + height)
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    return padded_h, padded_w, min(height, padded_h - top), min(width, padded_w - left)


@kernel(nogil=True, fastmath=_FMA, inline="always")
def _pixel_3x3(padded, wt, bias, out, row, col, dil_h, dil_w):
    """out[c] = bias[c] + the 9 taps of the window whose top left corner is padded[row, col],
    for every channel c at once: one loop over 18 unit-stride streams."""
    r0, r1, r2 = padded[row], padded[row + dil_h], padded[row + 2 * dil_h]
    j0, j1, j2 = col, col + dil_w, col + 2 * dil_w
    x00, x01, x02, x10, x11, x12 = r0[j0], r0[j1], r0[j2], r1[j0], r1[j1], r1[j2]
    x20, x21, x22 = r2[j0], r2[j1], r2[j2]
    w00, w01, w02, w10, w11, w12 = wt[0, 0], wt[0, 1], wt[0, 2], wt[1, 0], wt[1, 1], wt[1, 2]
    w20, w21, w22 = wt[2, 0], wt[2, 1], wt[2, 2]
    for c in range(out.shape[0]):
        out[c] = (bias[c] + w00[c] * x00[c] + w01[c] * x01[c] + w02[c] * x02[c]
                  + w10[c] * x10[c] + w11[c] * x11[c] + w12[c] * x12[c]
                  + w20[c] * x20[c] + w21[c] * x21[c] + w22[c] * x22[c])


@kernel(nogil=True, fastmath=_FMA, inline="always")
def _pixel_5x5(padded, wt, bias, out, row, col, dil_h, dil_w):
    """out[c] = bias[c] + the 25 taps of the window at padded[row, col], every channel c."""
    r0, r1, r2 = padded[row], padded[row + dil_h], padded[row + 2 * dil_h]
    r3, r4 = padded[row + 3 * dil_h], padded[row + 4 * dil_h]
    j0, j1, j2, j3, j4 = col, col + dil_w, col + 2 * dil_w, col + 3 * dil_w, col + 4 * dil_w
    x00, x01, x02, x03, x04 = r0[j0], r0[j1], r0[j2], r0[j3], r0[j4]
    x10, x11, x12, x13, x14 = r1[j0], r1[j1], r1[j2], r1[j3], r1[j4]
    x20, x21, x22, x23, x24 = r2[j0], r2[j1], r2[j2], r2[j3], r2[j4]
    x30, x31, x32, x33, x34 = r3[j0], r3[j1], r3[j2], r3[j3], r3[j4]
    x40, x41, x42, x43, x44 = r4[j0], r4[j1], r4[j2], r4[j3], r4[j4]
    w00, w01, w02, w03, w04 = wt[0, 0], wt[0, 1], wt[0, 2], wt[0, 3], wt[0, 4]
    w10, w11, w12, w13, w14 = wt[1, 0], wt[1, 1], wt[1, 2], wt[1, 3], wt[1, 4]
    w20, w21, w22, w23, w24 = wt[2, 0], wt[2, 1], wt[2, 2], wt[2, 3], wt[2, 4]
    w30, w31, w32, w33, w34 = wt[3, 0], wt[3, 1], wt[3, 2], wt[3, 3], wt[3, 4]
    w40, w41, w42, w43, w44 = wt[4, 0], wt[4, 1], wt[4, 2], wt[4, 3], wt[4, 4]
    for c in range(out.shape[0]):
        out[c] = (bias[c]
                  + w00[c] * x00[c] + w01[c] * x01[c] + w02[c] * x02[c] + w03[c] * x03[c]
                  + w04[c] * x04[c] + w10[c] * x10[c] + w11[c] * x11[c] + w12[c] * x12[c]
                  + w13[c] * x13[c] + w14[c] * x14[c] + w20[c] * x20[c] + w21[c] * x21[c]
                  + w22[c] * x22[c] + w23[c] * x23[c] + w24[c] * x24[c] + w30[c] * x30[c]
                  + w31[c] * x31[c] + w32[c] * x32[c] + w33[c] * x33[c] + w34[c] * x34[c]
                  + w40[c] * x40[c] + w41[c] * x41[c] + w42[c] * x42[c] + w43[c] * x43[c]
                  + w44[c] * x44[c])


@kernel(nogil=True, fastmath=_FMA,
        exported=(array(4), array(4), array(1), array(4), *[INT] * 7, FLOAT, FLOAT))
def _depthwise_channels_last(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left,
                             code, a, b):
    """The same convolution for a 3x3 or 5x5 kernel, channels last by blocks of channels
    (``depthwise_blocks``)."""
    depthwise_blocks(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code,
                     a, b, np.int64(0), x.shape[0] * blocks.shape[0])


@kernel(nogil=True, fastmath=_FMA)
def depthwise_blocks(x, blocks, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a,
                     b, first, last):
    """The same convolution for a 3x3 or 5x5 kernel, one output channel per input channel,
    block of channels by block: the block's planes are transposed into a zero-padded
    (PH, PW, B) buffer, every output pixel is one loop over the block's channels
    (``_pixel_*``) into a (Ho*Wo, B) buffer, which is activated in one long loop and
    transposed back into y. ``blocks`` (ceil(C / B), kh, kw, B) from pack_channel_blocks.
    Only blocks first .. last - 1, counted over (image, block): a share for one thread."""
    n, channels, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    n_blocks, kh, kw, block = blocks.shape
    padded_h, padded_w, rows, cols = padded_extent(
        height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left)
    padded = np.zeros((padded_h, padded_w, block), np.float32)
    pixels = np.empty((out_h * out_w, block), np.float32)
    shift = np.zeros(block, np.float32)                   # the block's biases
    has_bias = bias.shape[0] > 0
    for unit in range(first, last):
        i_n, k = unit // n_blocks, unit % n_blocks
        planes = x[i_n].reshape(channels, height * width)
        planes_out = y[i_n].reshape(channels, out_h * out_w)
        start = k * block
        count = min(block, channels - start)          # the last block may be partial:
        if has_bias:                                  # its other lanes are thrown away
            for c in range(count):
                shift[c] = bias[start + c]
        for r in range(rows):                         # (B, H, W) -> (PH, PW, B)
            for col in range(cols):
                dst, p = padded[top + r, left + col], r * width + col
                for c in range(count):
                    dst[c] = planes[start + c, p]
        taps = blocks[k]
        for oh in range(out_h):
            for ow in range(out_w):
                out = pixels[oh * out_w + ow]
                if kh == 3:
                    _pixel_3x3(padded, taps, shift, out, oh * stride_h, ow * stride_w,
                               dil_h, dil_w)
                else:
                    _pixel_5x5(padded, taps, shift, out, oh * stride_h, ow * stride_w,
                               dil_h, dil_w)
        activate_row(pixels.reshape(-1), code, a, b)
        for c in range(count):                        # (Ho*Wo, B) -> (B, Ho, Wo)
            dst = planes_out[start + c]
            for p in range(out_h * out_w):
                dst[p] = pixels[p, c]


CHANNELS_LAST_MAX_OUTPUTS = 16     # channels last up to this many outputs a plane (x4 strided)
CHANNEL_BLOCK = 128                # channels per block of the channels-last kernel


def uses_channels_last(c_in: int, c_out: int, kernel: tuple[int, int],
                       stride: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether this depthwise convolution runs the channels-last kernel (small outputs, 3x3
    or 5x5, one output channel per input channel) rather than the one plane at a time."""
    outputs = out_hw[0] * out_hw[1]
    strided = stride != (1, 1)
    return (c_out == c_in and kernel in ((3, 3), (5, 5))
            and outputs <= CHANNELS_LAST_MAX_OUTPUTS * (2 if strided else 1))


def pack_channel_blocks(weight: np.ndarray) -> np.ndarray:
    """(C, kh, kw) -> (ceil(C / B), kh, kw, B) float32, B = CHANNEL_BLOCK: each block's taps
    channels last, zeros past the last channel."""
    channels, kh, kw = weight.shape
    n_blocks = -(-channels // CHANNEL_BLOCK)
    blocks = np.zeros((n_blocks * CHANNEL_BLOCK, kh, kw), np.float32)
    blocks[:channels] = weight
    return np.ascontiguousarray(
        blocks.reshape(n_blocks, CHANNEL_BLOCK, kh, kw).transpose(0, 2, 3, 1))


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
    kernel_function = _depthwise if weight.ndim == 3 else _depthwise_channels_last
    kernel_function(x, weight, NO_ARRAY if bias is None else bias, y, stride[0], stride[1],
                    dilation[0], dilation[1], pads[0], pads[2], activation.code, activation.a,
                    activation.b)
    return y
