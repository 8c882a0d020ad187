"""Max pooling as a numba kernel (nn.MaxPool2d without return_indices)::

    y[n, c, oh, ow] = max_{i, j} x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

with positions outside the image ignored (torch pads with -inf) and NaN winning, as in torch.

Max is separable: for each output row, first the max of its kh input rows over the whole width
(unit stride, vectorised), into a row buffer with -inf on both sides; then each output takes
the max of its kw taps along that row. That second pass reads with a stride, which the compiler
vectorises only when the stride is a constant: the common 2x2 and 3x3 windows with stride 2
(ResNet's stem, VGG, U-Net) have their own loops, taken when the row holds no NaN (a plain
``a if a > b else b`` does not propagate NaN; the general loop does). The reference,
``kernels.max_pool2d``, pads the whole input and takes kh*kw strided maxima over it.
"""

from __future__ import annotations

import functools

import numpy as np

from layers.fast.backend import INT, array, kernel


@kernel(inline="always")
def _nan_max(a, b):
    """max(a, b), NaN if either is NaN (torch's max pooling; np.maximum's rule)."""
    return a if (a > b) | (a != a) else b


@kernel(inline="always")
def _plain_max(a, b):
    """max(a, b) for numbers that are not NaN: one vectorisable compare-and-select."""
    return a if a > b else b


@kernel(inline="always")
def _has_nan(line):
    """Whether a 1-D array holds a NaN: one vectorised pass, no early exit."""
    found = False
    for k in range(line.shape[0]):
        found |= line[k] != line[k]
    return found


@kernel(nogil=True, exported=(array(4), array(4), *[INT] * 8))
def _max_pool2d(x, y, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left):
    n, channels, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    line = np.full(padded_w, -np.inf, np.float32)   # one row of maxima, -inf around the image
    inner = line[left:left + width]
    for plane in range(n * channels):
        src, dst = x[plane // channels, plane % channels], y[plane // channels, plane % channels]
        for oh in range(out_h):
            first = True
            for i in range(kh):
                ih = oh * stride_h + i * dil_h - top
                if ih < 0 or ih >= height:
                    continue
                row = src[ih]
                if first:
                    inner[:] = row
                    first = False
                else:
                    for k in range(width):
                        inner[k] = _nan_max(inner[k], row[k])
            out_row = dst[oh]
            if stride_w == 2 and dil_w == 1 and (kw == 2 or kw == 3) and not _has_nan(line):
                if kw == 3:                            # a constant stride: vectorised
                    for ow in range(out_w):
                        m = _plain_max(line[2 * ow], line[2 * ow + 1])
                        out_row[ow] = _plain_max(m, line[2 * ow + 2])
                else:
                    for ow in range(out_w):
                        out_row[ow] = _plain_max(line[2 * ow], line[2 * ow + 1])
                continue
            for ow in range(out_w):
                start = ow * stride_w
                m = line[start]
                for j in range(1, kw):
                    m = _nan_max(m, line[start + j * dil_w])
                out_row[ow] = m


def max_pool2d(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
               padding: tuple[int, int], dilation: tuple[int, int],
               out_hw: tuple[int, int]) -> np.ndarray:
    """x (N, C, H, W) float32 -> y (N, C, Ho, Wo); ``out_hw`` from kernels.pool2d_output_shape
    (so ceil_mode is already in it). Every window must reach at least one input row, which
    the layer's padding <= kernel // 2 rule guarantees."""
    x = np.require(x, np.float32, ("C", "A"))
    y = np.empty((*x.shape[:2], *out_hw), np.float32)
    _max_pool2d(x, y, kernel[0], kernel[1], stride[0], stride[1], dilation[0], dilation[1],
                padding[0], padding[1])
    return y


@functools.cache
def load_kernel() -> None:
    """Run the kernel once on a tiny input so numba loads it (from its disk cache) now: at
    build, when the graph plans shapes, rather than in the first inference."""
    max_pool2d(np.zeros((1, 1, 2, 2), np.float32), (2, 2), (2, 2), (0, 0), (1, 1), (1, 1))
