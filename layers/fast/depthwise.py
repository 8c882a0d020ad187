"""Depthwise convolution (groups == C_in, one input channel per group) as a numba kernel.

Each output channel o reads one input channel c = o // m (m = C_out / C_in, the channel
multiplier) through its own kh x kw filter::

    y[n, o, oh, ow] = bias[o] + sum_{i, j} w[o, i, j] * x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

There is almost no arithmetic per byte, so a GEMM does not help; what matters is reading each
input row a few times from cache and keeping the inner loop branch-free. For each output row
and each tap (i, j), the output columns whose input column falls inside the image form one
interval [ow_lo, ow_hi): padding is never materialised, and the loop over that interval is a
plain multiply-add the compiler vectorises. The (n, o) planes are spread over the threads, and
the bias, residual and activation are applied to each row while it is still in cache.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from layers.fast.epilogue import Activation, NO_ARRAY, activate_row


@numba.njit(cache=True, inline="always")
def _column_range(j, dw, left, sw, width, out_w):
    """Output columns ow with 0 <= ow*sw + j*dw - left < width, as [lo, hi)."""
    offset = j * dw - left                      # input column of ow = 0
    lo = 0 if offset >= 0 else (-offset + sw - 1) // sw
    hi = (width - 1 - offset) // sw + 1 if width - 1 - offset >= 0 else 0
    return lo, max(min(hi, out_w), lo)


@numba.njit(cache=True, parallel=True)
def _depthwise(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left,
               code, a, b):
    n, c_in, height, width = x.shape
    _, c_out, out_h, out_w = y.shape
    kh, kw = w.shape[1], w.shape[2]
    mult = c_out // c_in
    has_bias = bias.shape[0] > 0
    for plane in prange(n * c_out):
        i_n, o = plane // c_out, plane % c_out
        src = x[i_n, o // mult]
        dst = y[i_n, o]
        filt = w[o]
        shift = bias[o] if has_bias else np.float32(0.0)
        for oh in range(out_h):
            row = dst[oh]
            for ow in range(out_w):
                row[ow] = shift
            for i in range(kh):
                ih = oh * stride_h + i * dil_h - top
                if ih < 0 or ih >= height:
                    continue
                src_row = src[ih]
                for j in range(kw):
                    lo, hi = _column_range(j, dil_w, left, stride_w, width, out_w)
                    tap = filt[i, j]
                    start = j * dil_w - left
                    for ow in range(lo, hi):
                        row[ow] += tap * src_row[ow * stride_w + start]
            activate_row(row, code, a, b)


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
