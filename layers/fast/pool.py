"""Max pooling and global average pooling as numba kernels.

Max pooling (nn.MaxPool2d without return_indices)::

    y[n, c, oh, ow] = max_{i, j} x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

with positions outside the image ignored (torch pads with -inf) and NaN winning, as in torch.
x (N, C, H, W) and y (N, C, Ho, Wo) are C-contiguous float32.

Max is separable: for each output row, first the max of its kh input rows over the whole
width (unit stride; the usual 2 or 3 rows in one pass), into a row buffer with -inf on both
sides;
then each output takes the max of its kw taps along that row. For 2x2 and 3x3 windows with
stride 2 the row is first split into its even and odd columns (``phases.split_row``), so
that the second pass reads at unit stride too. With stride 1 in both directions (a YOLO's
SPPF: 5x5), whole planes go at once, row taps then column taps, a few long loops instead of
several short ones for each row (``_stride_one_plane``). Every pass reads one array and
writes another (in place, the compiler would make masked stores of the values that change:
epilogue.activate_row). Planes are shared with the helper threads. The reference,
``kernels.max_pool2d``, pads the whole input and takes kh*kw strided maxima over it.

Global average pooling (nn.AdaptiveAvgPool2d(1), a classifier's head)::

    y[n, c, 0, 0] = sum(x[n, c]) / (H * W)

each plane summed in vector lanes in float64 (softmax.row_sum: a float32 sum of a large
plane of one sign drifts from the mean), on the calling thread: the work is one read of x,
too small to share.
"""

from __future__ import annotations

import functools

import numpy as np

from layers.fast.kernel import INT, array, kernel
from layers.fast.phases import split_row
from layers.fast.simd import full_width
from layers.fast.softmax import row_sum
from layers.fast.team import current_team


@kernel(inline="always")
def _nan_max(a, b):
    """max(a, b), NaN if either is NaN (torch's max pooling; np.maximum's rule)."""
    return a if (a > b) | (a != a) else b


@kernel(nogil=True, exported=(array(4), array(4), *[INT] * 8))
def _max_pool2d(x, y, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left):
    """y (N, C, Ho, Wo) <- the max pooling of x, plane by plane (``max_pool_planes``)."""
    max_pool_planes(x, y, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left, np.int64(0),
                    x.shape[0] * x.shape[1])                 # int64 0: see jobs.py


@kernel(inline="always")
def _max_of_taps(before, source, first, second, target):
    """target[k] = max(before[k], source[k + first], source[k + second]) for every k of
    target (no second tap if ``second`` is -1)."""
    one = source[first:first + target.shape[0]]
    if second < 0:
        for k in range(target.shape[0]):
            target[k] = _nan_max(before[k], one[k])
        return
    two = source[second:second + target.shape[0]]
    for k in range(target.shape[0]):
        target[k] = _nan_max(_nan_max(before[k], one[k]), two[k])


@kernel(inline="always")
def _stride_one_plane(src, dst, kh, kw, dil_h, dil_w, top, left, padded, padded_w, buffers):
    """One plane of a stride-1 max pooling in passes over the whole plane, each a long loop
    that takes two taps: the image goes into ``padded`` (PH x PW flattened, -inf around it,
    (kw - 1) * dil_w floats more at the end); the taps of a row go into ``buffers`` 0 and 1
    in turn, then the taps of a column into buffers 2 and 3. Flattened, a row's last outputs
    read the next row's first values: those (columns out_w and on) are not copied."""
    height, width = src.shape
    out_h, out_w = dst.shape
    size = buffers.shape[1]                                # PH * PW
    for r in range(height):
        start = (top + r) * padded_w + left
        padded[start:start + width] = src[r]
    across = padded[:size]
    for j in range(1, kw, 2):                              # two taps a pass
        target = buffers[(j // 2) % 2, :size]
        _max_of_taps(across, padded, j * dil_w, (j + 1) * dil_w if j + 1 < kw else -1,
                     target)
        across = target
    outputs = out_h * padded_w
    down = across[:outputs]
    step = dil_h * padded_w
    for i in range(1, kh, 2):
        target = buffers[2 + (i // 2) % 2, :outputs]
        _max_of_taps(down, across, i * step, (i + 1) * step if i + 1 < kh else -1, target)
        down = target
    for oh in range(out_h):
        dst[oh] = down[oh * padded_w:oh * padded_w + out_w]


@kernel(nogil=True)
def max_pool_planes(x, y, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left, first, last):
    """Planes first .. last - 1 of _max_pool2d's, counted over (n, c): a chunk of the work
    (layers/fast/jobs.py)."""
    full_width()
    n, channels, height, width = x.shape
    out_h, out_w = y.shape[2], y.shape[3]
    if stride_h == 1 and stride_w == 1:               # whole-plane passes
        padded_h = max(out_h + (kh - 1) * dil_h, top + height)
        padded_w = max(out_w + (kw - 1) * dil_w, left + width)
        padded = np.full(padded_h * padded_w + (kw - 1) * dil_w, -np.inf, np.float32)
        buffers = np.empty((4, padded_h * padded_w), np.float32)
        for plane in range(first, last):
            _stride_one_plane(x[plane // channels, plane % channels],
                              y[plane // channels, plane % channels], kh, kw, dil_h, dil_w,
                              top, left, padded, padded_w, buffers)
        return
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    half = padded_w // 2 + 1
    # two rows of maxima, -inf around the image: a row and the next input row go into the
    # other (not in place: no masked stores)
    lines = np.full((2, 2 * half), -np.inf, np.float32)
    whole = (lines[0], lines[1])
    inners = (lines[0, left:left + width], lines[1, left:left + width])   # the image's part
    halves = np.empty(2 * half, np.float32)          # the row's even columns, then its odd
    even, odd = halves[:half], halves[half:]
    spare = np.empty(out_w, np.float32)              # stride 1: taps alternate with out_row
    pairs = stride_w == 2 and dil_w == 1 and (kw == 2 or kw == 3)
    for plane in range(first, last):
        src, dst = x[plane // channels, plane % channels], y[plane // channels, plane % channels]
        for oh in range(out_h):
            first_row = oh * stride_h - top           # rows first_row + i * dil_h, i < kh
            current = 0
            if kh == 3 and first_row >= 0 and first_row + 2 * dil_h < height:
                r0, r1 = src[first_row], src[first_row + dil_h]
                r2 = src[first_row + 2 * dil_h]
                inner = inners[0]
                for k in range(width):                # the usual 3 rows: one pass
                    inner[k] = _nan_max(_nan_max(r0[k], r1[k]), r2[k])
            elif kh == 2 and first_row >= 0 and first_row + dil_h < height:
                r0, r1 = src[first_row], src[first_row + dil_h]
                inner = inners[0]
                for k in range(width):                # 2 rows (a UNet's 2x2): one pass
                    inner[k] = _nan_max(r0[k], r1[k])
            else:
                started = False
                for i in range(kh):
                    ih = first_row + i * dil_h
                    if ih < 0 or ih >= height:
                        continue
                    row = src[ih]
                    if not started:
                        inners[0][:] = row
                        started = True
                    else:
                        before, after = inners[current], inners[1 - current]
                        for k in range(width):
                            after[k] = _nan_max(before[k], row[k])
                        current = 1 - current
            line = whole[current]
            out_row = dst[oh]
            if pairs:                                 # stride 2: even and odd columns apart,
                split_row(line, 0, line.shape[0], halves, 0, half, 2)   # then unit-stride
                if kw == 3:
                    for ow in range(out_w):
                        out_row[ow] = _nan_max(_nan_max(even[ow], odd[ow]), even[ow + 1])
                else:
                    for ow in range(out_w):
                        out_row[ow] = _nan_max(even[ow], odd[ow])
            elif stride_w == 1:                       # tap by tap along the whole row, each
                if kw == 1:                           # pass into out_row or spare in turn,
                    out_row[:] = line[:out_w]         # the last into out_row
                source = line
                for j in range(1, kw):
                    target = out_row if (kw - 1 - j) % 2 == 0 else spare
                    shifted = line[j * dil_w:]
                    for ow in range(out_w):
                        target[ow] = _nan_max(source[ow], shifted[ow])
                    source = target
            else:
                for ow in range(out_w):
                    start = ow * stride_w
                    m = line[start]
                    for j in range(1, kw):
                        m = _nan_max(m, line[start + j * dil_w])
                    out_row[ow] = m


def max_pool2d(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
               padding: tuple[int, int], dilation: tuple[int, int],
               out_hw: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C, H, W) float32 -> y (N, C, Ho, Wo); ``out_hw`` from kernels.pool2d_output_shape
    (so ceil_mode is already in it). Every window must reach at least one input row, which
    the layer's padding <= kernel // 2 rule guarantees. ``out``: a C-contiguous float32
    array to write y into. Planes shared with the helper threads if there is a team."""
    x = np.require(x, np.float32, ("C", "A"))
    y = np.empty((*x.shape[:2], *out_hw), np.float32) if out is None else out
    geometry = (kernel[0], kernel[1], stride[0], stride[1], dilation[0], dilation[1],
                padding[0], padding[1])
    team = current_team()
    if team is None or x.shape[0] * x.shape[1] < 2:
        _max_pool2d(x, y, *geometry)
    else:
        team.max_pool(x, y, geometry)
    return y


@functools.cache
def load_kernel() -> None:
    """Run the kernel once on a tiny input so numba loads it (from its disk cache) now: at
    build, when the graph plans shapes, rather than in the first inference."""
    max_pool2d(np.zeros((1, 1, 2, 2), np.float32), (2, 2), (2, 2), (0, 0), (1, 1), (1, 1))
    global_average_pool(np.zeros((1, 1, 1, 1), np.float32))


@kernel(nogil=True, exported=(array(2), array(1)))
def _plane_means(planes, means):
    """means[p] = the mean of row p of planes (P, L), L > 0."""
    length = planes.shape[1]
    for p in range(planes.shape[0]):
        means[p] = np.float32(row_sum(planes[p]) / length)


def global_average_pool(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C, H, W) float32 of any layout, H * W > 0 -> y (N, C, 1, 1), the mean of each
    plane (into ``out``, a C-contiguous float32 array of that shape, if given)."""
    n, c, h, w = x.shape
    y = np.empty((n, c, 1, 1), np.float32) if out is None else out
    if y.shape != (n, c, 1, 1):
        raise ValueError(f"out has shape {y.shape}, the pooling gives {(n, c, 1, 1)}")
    planes = np.require(x, np.float32, ("C", "A")).reshape(n * c, h * w)
    _plane_means(planes, y.reshape(n * c))
    return y
