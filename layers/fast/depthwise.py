"""Depthwise convolution (groups == C_in, one input channel per group) as a numba kernel.

Each output channel o reads one input channel c = o // m (m = C_out / C_in, the channel
multiplier) through its own kh x kw filter::

    y[n, o, oh, ow] = bias[o] + sum_{i, j} w[o, i, j] * x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

There is almost no arithmetic per byte, so a GEMM does not help; what matters is reading each
input row a few times from cache and keeping the inner loop branch-free. The kernel copies
one (n, c) plane into a zero-padded buffer (a few KB, in cache), then for each output row
accumulates the kh*kw taps into a row accumulator. For the common 3- and 5-wide kernels at
stride 1, one pass adds a whole kernel row (3 or 5 taps) over contiguous floats, a loop the
compiler vectorises; other shapes add one tap per pass. Bias and activation are
applied to the row before it is stored.
"""

from __future__ import annotations

import numba
import numpy as np

from layers.fast.epilogue import Activation, NO_ARRAY, activate_row


@numba.njit(cache=True)
def _depthwise(x, w, bias, y, stride_h, stride_w, dil_h, dil_w, top, left, code, a, b):
    n, c_in, height, width = x.shape
    _, c_out, out_h, out_w = y.shape
    kh, kw = w.shape[1], w.shape[2]
    mult = c_out // c_in
    has_bias = bias.shape[0] > 0
    # the padded plane: every window inside it, so the loops below need no bounds checks
    padded_h = max((out_h - 1) * stride_h + (kh - 1) * dil_h + 1, top + height)
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    for plane in range(n * c_out):
        i_n, o = plane // c_out, plane % c_out
        padded = np.zeros((padded_h, padded_w), np.float32)
        rows, cols = min(height, padded_h - top), min(width, padded_w - left)
        padded[top:top + rows, left:left + cols] = x[i_n, o // mult, :rows, :cols]
        dst = y[i_n, o]
        filt = w[o]
        shift = bias[o] if has_bias else np.float32(0.0)
        acc = np.empty(out_w, np.float32)
        for oh in range(out_h):
            for ow in range(out_w):
                acc[ow] = shift
            for i in range(kh):
                src = padded[oh * stride_h + i * dil_h]
                if stride_w == 1 and dil_w == 1 and kw == 3:     # a whole kernel row per pass
                    t0, t1, t2 = filt[i, 0], filt[i, 1], filt[i, 2]
                    for ow in range(out_w):
                        acc[ow] += t0 * src[ow] + t1 * src[ow + 1] + t2 * src[ow + 2]
                elif stride_w == 1 and dil_w == 1 and kw == 5:
                    t0, t1, t2, t3, t4 = filt[i, 0], filt[i, 1], filt[i, 2], filt[i, 3], filt[i, 4]
                    for ow in range(out_w):
                        acc[ow] += (t0 * src[ow] + t1 * src[ow + 1] + t2 * src[ow + 2]
                                    + t3 * src[ow + 3] + t4 * src[ow + 4])
                elif dil_w == 1 and kw == 3:                     # strided, still one pass
                    t0, t1, t2 = filt[i, 0], filt[i, 1], filt[i, 2]
                    for ow in range(out_w):
                        k = ow * stride_w
                        acc[ow] += t0 * src[k] + t1 * src[k + 1] + t2 * src[k + 2]
                elif dil_w == 1 and kw == 5:
                    t0, t1, t2, t3, t4 = filt[i, 0], filt[i, 1], filt[i, 2], filt[i, 3], filt[i, 4]
                    for ow in range(out_w):
                        k = ow * stride_w
                        acc[ow] += (t0 * src[k] + t1 * src[k + 1] + t2 * src[k + 2]
                                    + t3 * src[k + 3] + t4 * src[k + 4])
                else:
                    for j in range(kw):
                        tap, start = filt[i, j], j * dil_w
                        for ow in range(out_w):
                            acc[ow] += tap * src[ow * stride_w + start]
            activate_row(acc, code, a, b)
            dst[oh, :] = acc


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
