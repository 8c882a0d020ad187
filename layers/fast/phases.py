"""Stride phases: one padded input plane rearranged so that every tap of a strided, dilated
kernel reads a plain unit-stride window. Shared by the depthwise kernel and im2col.

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
