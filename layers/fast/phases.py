"""Stride phases: one input plane rearranged so that every tap of a strided, dilated kernel
reads a plain unit-stride window. Used by the depthwise kernel, im2col and the product that
makes im2col's matrix band by band (gemm.split_planes, pointwise.cols_band), and split_row by
max pooling.

A kh x kw kernel with stride (sh, sw), dilation (dh, dw) and padding (top, left) reads, for
output (oh, ow) and tap (i, j), image row ``oh*sh + i*dh - top`` and column
``ow*sw + j*dw - left``. Split the image into sh * sw *phases*: phase (p, q) holds the rows
p, p + sh, ... and the columns q, q + sw, ... Writing ``i*dh - top = a*sh + p`` and
``j*dw - left = b*sw + q``, tap (i, j) reads row ``oh + a``, column ``ow + b`` of phase
(p, q): a plain window, whatever the stride and dilation (stride 1: one phase, the image).

All phases live in one flat float32 buffer, phase after phase, each row by row with rows of
``row_len`` values (the phase's columns, at least Wo), so a tap is an offset into that buffer
(``tap_start``) and output (oh, ow) of that tap is element ``tap_start + t``,
``t = oh*row_len + ow``: a whole plane of outputs is one long loop over t.

There are no padding columns. Zero rows above and below each phase stand for the top and
bottom padding, but a window that passes a row's left or right end reads the neighbouring
row's values there instead of zeros, so the kernels mask those columns out (``column_ok``,
or the run of outputs inside, ``columns_inside``: a select or a zero written rather than a
multiply by 0, so that an Inf next door cannot become NaN). In
exchange, with stride 1 the phase is the plane itself, filled by one plain copy, and with
"same" padding (row_len == Wo) t runs over the output plane exactly: the kernels read and
write whole planes, never row by row. Only the image's own values are ever written into
the buffer, so its zeros stay from plane to plane.
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import kernel
from layers.fast.simd import LANES, deinterleave


@kernel(nogil=True, inline="always")
def phase_layout(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                 top, left):
    """The phase geometry: (row_len, first_row, phase_size, tap_start (kh, kw) int64,
    column_ok (kw, >= length) bool, length, size).

    The phase's image row r is row ``first_row + r`` of its part of the buffer (phase_size
    values); ``length`` is the number of t up to the last output; ``column_ok[j, t]``: tap
    column j of output t lies inside the image; ``size``: the buffer's values (every read,
    masked or not, lies inside it)."""
    row_len, first_row, phase_size, tap_start, length, size = phase_geometry(
        height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left)
    column_ok = np.empty((kw, out_h * row_len), np.bool_)    # (the last row's tail unused)
    pattern = np.empty(row_len, np.bool_)        # one output row's; every row has the same
    for j in range(kw):
        inside_from, inside_to = columns_inside(width, row_len, stride_w, dil_w, left, j)
        for ow in range(row_len):
            pattern[ow] = inside_from <= ow < inside_to
        for oh in range(out_h):
            row = column_ok[j, oh * row_len:]
            for ow in range(row_len):
                row[ow] = pattern[ow]
    return row_len, first_row, phase_size, tap_start, column_ok, length, size


@kernel(nogil=True, inline="always")
def phase_geometry(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                   top, left):
    """phase_layout without column_ok: (row_len, first_row, phase_size, tap_start, length,
    size)."""
    row_len = max(out_w, -(-width // stride_w))
    a_min, a_max = -top // stride_h, ((kh - 1) * dil_h - top) // stride_h
    b_min = -left // stride_w
    # enough zero rows above that the first tap's first read is not before the buffer
    first_row = max(0, -a_min + (-(-max(0, -b_min) // row_len)))
    length = (out_h - 1) * row_len + out_w
    phase_size = (first_row + max(-(-height // stride_h), out_h + a_max)) * row_len
    tap_start = np.empty((kh, kw), np.int64)
    size = stride_h * stride_w * phase_size
    for i in range(kh):
        a, p = (i * dil_h - top) // stride_h, (i * dil_h - top) % stride_h
        for j in range(kw):
            b, q = (j * dil_w - left) // stride_w, (j * dil_w - left) % stride_w
            tap_start[i, j] = (p * stride_w + q) * phase_size + (first_row + a) * row_len + b
            size = max(size, tap_start[i, j] + length)
    return row_len, first_row, phase_size, tap_start, length, size


# a convolution's geometry as one int64 array (``geometry_of``), for kernels that take the
# phases of its input (gemm.split_planes, pointwise.cols_band): its slots
KH, KW, STRIDE_H, STRIDE_W, DIL_H, DIL_W, TOP, LEFT, HEIGHT, WIDTH, OUT_H, OUT_W = range(12)
GEOMETRY = 12


def geometry_of(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
                top: int, left: int, hw: tuple[int, int], out_hw: tuple[int, int]
                ) -> np.ndarray:
    """A convolution of ``kernel``, ``stride``, ``dilation``, padding ``top``, ``left``, on
    planes of ``hw`` giving ``out_hw``, as its geometry (the slots KH .. OUT_W)."""
    geometry = np.zeros(GEOMETRY, np.int64)
    geometry[KH], geometry[KW] = kernel
    geometry[STRIDE_H], geometry[STRIDE_W] = stride
    geometry[DIL_H], geometry[DIL_W] = dilation
    geometry[TOP], geometry[LEFT] = top, left
    geometry[HEIGHT], geometry[WIDTH] = hw
    geometry[OUT_H], geometry[OUT_W] = out_hw
    return geometry


@kernel(nogil=True, inline="always")
def geometry_layout(geometry):
    """phase_geometry of a convolution's ``geometry``: (row_len, first_row, phase_size,
    tap_start, length, size)."""
    g = geometry
    return phase_geometry(g[HEIGHT], g[WIDTH], g[OUT_H], g[OUT_W], g[KH], g[KW], g[STRIDE_H],
                          g[STRIDE_W], g[DIL_H], g[DIL_W], g[TOP], g[LEFT])


@kernel(nogil=True, inline="always")
def columns_inside(width, out_w, stride_w, dil_w, left, j):
    """The outputs ow < out_w whose tap column j lies inside the image (0 <= ow * sw +
    j * dw - left < W): ow from .. to - 1, one run since the column grows with ow
    (column_ok's run of True in each output row)."""
    column0 = j * dil_w - left
    inside_from = min(out_w, max(0, (stride_w - 1 - column0) // stride_w))
    inside_to = max(inside_from, min(out_w, (width - 1 - column0) // stride_w + 1))
    return inside_from, inside_to


@kernel(nogil=True, inline="always")
def split_row(values, first, cols, phases, first_dst, phase_size, stride_w):
    """Copy one image row, values[first:first + cols], into its row of the stride_w column
    phases: image column c goes to column phase c % sw, at c // sw. ``first_dst``: where this
    row starts in column phase 0 (row phase and row already counted). Flat indices, no views:
    a view per row cost more than splitting a row of 56 values."""
    if stride_w == 1:                              # one phase: a plain copy
        for k in range(cols):
            phases[first_dst + k] = values[first + k]
    elif stride_w == 2:                            # even and odd columns, LANES at a time
        odd_dst, half = first_dst + phase_size, cols // 2
        whole = half // LANES * LANES
        for k in range(0, whole, LANES):
            deinterleave(values, first + 2 * k, phases, first_dst + k, phases, odd_dst + k)
        for k in range(whole, half):
            phases[first_dst + k] = values[first + 2 * k]
            phases[odd_dst + k] = values[first + 2 * k + 1]
        if cols % 2:
            phases[first_dst + half] = values[first + cols - 1]
    else:
        for q in range(stride_w):
            dst = first_dst + q * phase_size
            for k in range((cols - q + stride_w - 1) // stride_w):
                phases[dst + k] = values[first + q + k * stride_w]


SCATTER_MAX_WIDTH = 32     # rows narrower than this are split through phase_targets' map


@kernel(nogil=True, inline="always")
def phase_targets(height, width, row_len, first_row, phase_size, stride_h, stride_w):
    """Where each value of an image plane goes in its phases (``phase_layout``), for
    split_plane: image row r to row phase r % sh, buffer row first_row + r // sh; column c to
    column phase c % sw, at c // sw. Worked out once per call, for narrow planes only (rows
    of fewer than SCATTER_MAX_WIDTH values, and not the plane itself: stride 1, rows of W),
    where one loop over this map beats short loops row by row. Wider rows are split row by
    row (their loops are long and vectorised): for them, and for the plane itself, no
    values."""
    if (stride_h == 1 and stride_w == 1 and row_len == width) or width >= SCATTER_MAX_WIDTH:
        return np.empty(0, np.int64)
    targets = np.empty(height * width, np.int64)
    for r in range(height):
        row_at = (r % stride_h) * stride_w * phase_size + (first_row + r // stride_h) * row_len
        for c in range(width):
            targets[r * width + c] = row_at + (c % stride_w) * phase_size + c // stride_w
    return targets


@kernel(nogil=True, inline="always")
def split_plane(plane, height, width, phases, row_len, first_row, phase_size, stride_h,
                stride_w, targets):
    """Write the image plane (its H * W values, flat) into its phases (``phase_layout``):
    image row r goes to row phase r % sh, buffer row first_row + r // sh, its columns split
    by split_row; through ``targets`` (``phase_targets``) if it has values."""
    if targets.shape[0] > 0:                                   # narrow: one loop, by the map
        for e in range(height * width):
            phases[targets[e]] = plane[e]
        return
    if stride_h == 1 and stride_w == 1 and row_len == width:   # one phase: one plain copy
        dst = phases[first_row * row_len:]
        for k in range(height * width):
            dst[k] = plane[k]
        return
    for r in range(height):
        first_dst = ((r % stride_h) * stride_w * phase_size
                     + (first_row + r // stride_h) * row_len)
        split_row(plane, r * width, width, phases, first_dst, phase_size, stride_w)
