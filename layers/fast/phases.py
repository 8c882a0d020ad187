"""Stride phases: one padded input plane rearranged so that every tap of a strided, dilated
kernel reads a plain unit-stride window. Used by im2col, by max pooling (split_row) and,
masked, by the depthwise kernel.

A kh x kw kernel with stride (sh, sw), dilation (dh, dw) and padding (top, left) reads, for
output (oh, ow) and tap (i, j), the padded plane at row ``oh*sh + i*dh``, column
``ow*sw + j*dw``. Split the padded plane into sh * sw *phases*: phase (p, q) holds the padded
rows p, p + sh, ... and columns q, q + sw, ... Writing ``i*dh = a*sh + p`` and
``j*dw = b*sw + q``, tap (i, j) reads row ``oh + a``, column ``ow + b`` of phase (p, q): a
plain window, whatever the stride and dilation (stride 1: one phase, the padded plane itself).

All phases live in one flat float32 buffer, phase after phase, each (PH, PW) row by row, so
a tap is an offset into that buffer (``tap_start``) and output (oh, ow) of that tap is element
``tap_start + oh*PW + ow``. Only the image's own positions are ever written into the buffer,
so the zeros of the padding stay from plane to plane.

**Masked phases** (``masked_layout``, the depthwise kernel's): the same phases without their
padding columns. A phase row holds just the image's columns (``row_len`` of them, at least
Wo), with zero rows above and below. A tap that reaches past a row's end reads the next
row's first values instead of zeros, so the kernel masks those columns out (``column_ok``:
a select, not a multiply by 0, so an Inf next door cannot turn into NaN). In exchange, with
stride 1 a phase is the plane itself, filled by one plain copy, and when ``row_len`` is Wo the
outputs are laid out as the output plane, so the kernel writes them in place.
"""

from __future__ import annotations

import numpy as np

from layers.fast.backend import kernel


@kernel(nogil=True, inline="always")
def padded_extent(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                  top, left):
    """(padded_h, padded_w, rows, cols): a padded plane that holds every window (so the loops
    that read it need no bounds checks), and the rows x cols of the image that any window
    reads (the rest is never copied)."""
    padded_h = max((out_h - 1) * stride_h + (kh - 1) * dil_h + 1, top + height)
    padded_w = max((out_w - 1) * stride_w + (kw - 1) * dil_w + 1, left + width)
    return padded_h, padded_w, min(height, padded_h - top), min(width, padded_w - left)


@kernel(nogil=True, inline="always")
def phase_layout(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                 top, left):
    """The phase geometry: (phase_h, phase_w, tap_start (kh, kw) int64, rows, cols), rows x
    cols being the part of the image that any window reads (``padded_extent``)."""
    padded_h, padded_w, rows, cols = padded_extent(height, width, out_h, out_w, kh, kw,
                                                   stride_h, stride_w, dil_h, dil_w, top, left)
    phase_h, phase_w = -(-padded_h // stride_h), -(-padded_w // stride_w)
    phase_size = phase_h * phase_w
    tap_start = np.empty((kh, kw), np.int64)
    for i in range(kh):
        for j in range(kw):
            phase = (i * dil_h % stride_h) * stride_w + j * dil_w % stride_w
            tap_start[i, j] = (phase * phase_size + (i * dil_h // stride_h) * phase_w
                               + j * dil_w // stride_w)
    return phase_h, phase_w, tap_start, rows, cols


@kernel(nogil=True, inline="always")
def split_row(line, phases, first_dst, phase_size, left, stride_w):
    """Copy one image row into its row of the stride_w column phases: image column c goes to
    column phase (c + left) % sw, at (c + left) // sw. ``first_dst``: where this row starts
    in column phase 0 (row phase and row already counted)."""
    cols = line.shape[0]
    if stride_w == 1:                              # one phase: a plain copy
        dst = phases[first_dst + left:]
        for k in range(cols):
            dst[k] = line[k]
    elif stride_w == 2:                            # even and odd columns in one pass
        even = phases[first_dst + left % 2 * phase_size + left // 2:]
        odd = phases[first_dst + (left + 1) % 2 * phase_size + (left + 1) // 2:]
        half = cols // 2
        for k in range(half):
            even[k] = line[2 * k]
            odd[k] = line[2 * k + 1]
        if cols % 2:
            even[half] = line[cols - 1]
    else:
        for q in range(stride_w):
            first = (q - left) % stride_w          # first image column in column phase q
            dst = phases[first_dst + q * phase_size + (first + left) // stride_w:]
            for k in range((cols - first + stride_w - 1) // stride_w):
                dst[k] = line[first + k * stride_w]


@kernel(nogil=True, inline="always")
def split_plane(plane, phases, phase_h, phase_w, rows, cols, stride_h, stride_w, top, left):
    """Write the image plane (H, W) (its first rows x cols) into the phases buffer."""
    phase_size = phase_h * phase_w
    for r in range(rows):
        padded_row = top + r
        first_dst = ((padded_row % stride_h) * stride_w * phase_size
                     + padded_row // stride_h * phase_w)
        split_row(plane[r, :cols], phases, first_dst, phase_size, left, stride_w)


# ----- masked phases: no padding columns, the edges masked instead -------------------------

@kernel(nogil=True, inline="always")
def masked_layout(height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w,
                  top, left):
    """The masked phase geometry: (row_len, first_row, phase_size, tap_start (kh, kw) int64,
    column_ok (kw, >= length) bool, length, size).

    Tap (i, j) of output (oh, ow) reads image row ``oh*sh + i*dh - top = (oh + a)*sh + p`` and
    column ``(ow + b)*sw + q``: row oh + a, column ow + b of phase (p, q), which is flat element
    ``tap_start[i, j] + t`` with ``t = oh*row_len + ow`` (length: up to the last output). The
    phase's image row r is row ``first_row + r`` of the buffer: the rows above and below the
    image stay zero. ``column_ok[j, t]``: tap column j of output t lies inside the image.
    ``size``: floats in the buffer (every read lies inside it)."""
    row_len = max(out_w, -(-width // stride_w))
    a_min, a_max = -top // stride_h, ((kh - 1) * dil_h - top) // stride_h
    b_min = -left // stride_w
    # enough zero rows above that the first tap's first read is not before the buffer
    first_row = max(0, -a_min + (-(-max(0, -b_min) // row_len)))
    length = (out_h - 1) * row_len + out_w
    rows = first_row + max(-(-height // stride_h), out_h + a_max)
    phase_size = rows * row_len
    tap_start = np.empty((kh, kw), np.int64)
    size = stride_h * stride_w * phase_size
    for i in range(kh):
        a, p = (i * dil_h - top) // stride_h, (i * dil_h - top) % stride_h
        for j in range(kw):
            b, q = (j * dil_w - left) // stride_w, (j * dil_w - left) % stride_w
            tap_start[i, j] = (p * stride_w + q) * phase_size + (first_row + a) * row_len + b
            size = max(size, tap_start[i, j] + length)
    column_ok = np.empty((kw, out_h * row_len), np.bool_)    # (the last row's tail unused)
    first = np.empty(row_len, np.bool_)
    for j in range(kw):
        for ow in range(row_len):
            column = ow * stride_w + j * dil_w - left
            first[ow] = (column >= 0) & (column < width)
        for oh in range(out_h):                    # every output row: the same columns
            row = column_ok[j, oh * row_len:]
            for ow in range(row_len):
                row[ow] = first[ow]
    return row_len, first_row, phase_size, tap_start, column_ok, length, size


@kernel(nogil=True, inline="always")
def split_plane_masked(plane, height, width, phases, row_len, first_row, phase_size, stride_h,
                       stride_w):
    """Write the image plane (its H * W values, flat) into its masked phases
    (``masked_layout``): image row r goes to row phase r % sh, buffer row
    first_row + r // sh, its columns split by split_row."""
    if stride_h == 1 and stride_w == 1 and row_len == width:   # one phase: one plain copy
        dst = phases[first_row * row_len:]
        for k in range(height * width):
            dst[k] = plane[k]
        return
    for r in range(height):
        first_dst = ((r % stride_h) * stride_w * phase_size
                     + (first_row + r // stride_h) * row_len)
        split_row(plane[r * width:(r + 1) * width], phases, first_dst, phase_size, 0, stride_w)
