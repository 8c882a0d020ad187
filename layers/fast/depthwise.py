"""Depthwise convolution (groups == C_in, one input channel per group) as a numba kernel.

Each output channel o reads one input channel c = o // m (m = C_out / C_in, the channel
multiplier) through its own kh x kw filter::

    y[n, o, oh, ow] = bias[o] + sum_{i, j} w[o, i, j] * x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

There is almost no arithmetic per byte, so a GEMM does not help; what matters is reading each
input plane from cache and keeping the inner loops long, branch-free and unit-stride.

* **Phases.** The kernel copies one (n, c) plane into a small zero-padded buffer (a few KB, in
  cache), split into sh * sw *phases*: phase (p, q) holds the padded rows p, p + sh, ... and
  columns q, q + sw, ... Tap (i, j) reads padded row ``oh*sh + i*dh``; writing
  ``i*dh = a*sh + p`` (and ``j*dw = b*sw + q``) that is row ``oh + a`` of phase (p, q), column
  ``ow + b``. So in its phase every tap reads a plain, unstrided window, whatever the stride
  and dilation (stride 1: one phase, the padded plane itself).
* **Wide rows.** Flatten a phase (PH, PW) row by row. Output (oh, ow) of tap (a, b) reads flat
  element ``(oh + a)*PW + b + (oh*PW + ow)``, so with ``t = oh*PW + ow`` the whole plane of
  one tap is ONE long loop ``acc[t] += w * phase[a*PW + b + t]``: the accumulator has PW
  columns per row, of which the first Wo are outputs and the rest are thrown away. A whole
  kernel row (3 or 5 taps) is added per pass, a loop the compiler vectorises; even a 7 x 7
  plane is one loop of ~70 elements instead of 7 loops of 7.

Bias and activation are applied to each output row before it is stored. Buffers are allocated
once per call, and only the image's own positions are written into the phases, so the zeros
of the padding stay from plane to plane.
"""

from __future__ import annotations

import numba
import numpy as np

from layers.fast.epilogue import Activation, NO_ARRAY, activate_row


@numba.njit(cache=True, nogil=True)
def _depthwise(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a, b):
    """y (N, C_out, Ho, Wo) <- the depthwise convolution of x, plane (n, o) by plane."""
    n, c_in, height, width = x.shape
    _, c_out, out_h, out_w = y.shape
    kh, kw = w.shape[1], w.shape[2]
    mult = c_out // c_in
    has_bias = bias.shape[0] > 0
    # the padded plane holds every window, so the loops below need no bounds checks
    padded_h = max((out_h - 1) * stride_h + (kh - 1) * dil_h + 1, top + height)
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    phase_h, phase_w = -(-padded_h // stride_h), -(-padded_w // stride_w)
    phase_size = phase_h * phase_w
    phases = np.zeros(stride_h * stride_w * phase_size, np.float32)
    # where tap (i, j) starts reading: its phase, then row a = i*dh // sh, column b = j*dw // sw
    tap_start = np.empty((kh, kw), np.int64)
    for i in range(kh):
        for j in range(kw):
            phase = (i * dil_h % stride_h) * stride_w + j * dil_w % stride_w
            tap_start[i, j] = (phase * phase_size + (i * dil_h // stride_h) * phase_w
                               + j * dil_w // stride_w)
    rows, cols = min(height, padded_h - top), min(width, padded_w - left)
    length = (out_h - 1) * phase_w + out_w          # t = oh * PW + ow, up to the last output
    acc = np.empty(length, np.float32)
    for plane in range(n * c_out):
        i_n, o = plane // c_out, plane % c_out
        if o % mult == 0:                          # a new input plane: pad and split it
            src = x[i_n, o // mult]
            for r in range(rows):
                padded_row = top + r
                row_phase = padded_row % stride_h
                for q in range(stride_w):
                    first = (q - left) % stride_w    # first image column in column phase q
                    line = src[r, first:cols:stride_w]
                    dst_row = phases[(row_phase * stride_w + q) * phase_size
                                     + padded_row // stride_h * phase_w
                                     + (first + left) // stride_w:]
                    for k in range(line.shape[0]):
                        dst_row[k] = line[k]
        filt = w[o]
        shift = bias[o] if has_bias else np.float32(0.0)
        for t in range(length):
            acc[t] = shift
        for i in range(kh):
            starts = tap_start[i]
            if kw == 3:                                          # a whole kernel row per pass
                s0, s1, s2 = phases[starts[0]:], phases[starts[1]:], phases[starts[2]:]
                t0, t1, t2 = filt[i, 0], filt[i, 1], filt[i, 2]
                for t in range(length):
                    acc[t] += t0 * s0[t] + t1 * s1[t] + t2 * s2[t]
            elif kw == 5:
                s0, s1, s2 = phases[starts[0]:], phases[starts[1]:], phases[starts[2]:]
                s3, s4 = phases[starts[3]:], phases[starts[4]:]
                t0, t1, t2, t3, t4 = filt[i, 0], filt[i, 1], filt[i, 2], filt[i, 3], filt[i, 4]
                for t in range(length):
                    acc[t] += (t0 * s0[t] + t1 * s1[t] + t2 * s2[t] + t3 * s3[t]
                               + t4 * s4[t])
            else:                                                # one tap per pass
                for j in range(kw):
                    tap, src_row = filt[i, j], phases[starts[j]:]
                    for t in range(length):
                        acc[t] += tap * src_row[t]
        dst = y[i_n, o]
        for oh in range(out_h):
            row = acc[oh * phase_w:oh * phase_w + out_w]
            activate_row(row, code, a, b)
            dst[oh, :] = row


def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                     stride: tuple[int, int], pads: tuple[int, int, int, int],
                     dilation: tuple[int, int], out_hw: tuple[int, int],
                     activation: Activation, out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, weight (C_out, kh, kw) (the packed
    (C_out, 1, kh, kw) weight), pads (top, bottom, left, right) -> y (N, C_out, Ho, Wo) with
    bias and activation applied."""
    n = x.shape[0]
    c_out = weight.shape[0]
    y = np.empty((n, c_out, *out_hw), np.float32) if out is None else out
    _depthwise(x, weight, NO_ARRAY if bias is None else bias, y, stride[0], stride[1],
               dilation[0], dilation[1], pads[0], pads[2], activation.code, activation.a,
               activation.b)
    return y
