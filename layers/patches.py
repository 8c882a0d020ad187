"""Sliding-window patches: ``F.unfold`` (im2col), its inverse-by-sum ``F.fold`` (col2im), and
``Tensor.unfold`` (windows along one dim).

unfold copies every kh x kw window of a zero-padded (N, C, H, W) input into a column:

    cols[n, (c, i, j), (oh, ow)] = xpad[n, c, oh*sh + i*dh, ow*sw + j*dw]      -> (N, C*kh*kw, L)

fold puts each column back where unfold took it from and sums where windows overlap, then
crops the padding; with kernel = stride it undoes unfold exactly (MobileViT-v2's patches).
Both loop over the kh*kw taps (layers/kernels.py: window_taps), one array operation each.

``x.unfold(dimension, size, step)`` is the one-dim form: dim d of length n becomes
(n - size) // step + 1 windows, and a new last dim holds each window's ``size`` elements
(HaloNet's neighbourhoods: ``x.unfold(2, win, block).unfold(3, win, block)``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from layers.base import (Layer, NamedArgumentLayer, Param, Shape, as_int, as_tuple, at_least,
                         normalize_dim)
from layers.kernels import window_output_size, window_taps
from layers.registry import register_layer
from parser.errors import ShapeError

class _Windows(Layer):
    """The window geometry unfold and fold share (torch's argument names and defaults)."""

    kernel_size = Param(convert=at_least(1, as_tuple(2)))
    dilation = Param((1, 1), at_least(1, as_tuple(2)))
    padding = Param((0, 0), at_least(0, as_tuple(2)))
    stride = Param((1, 1), at_least(1, as_tuple(2)))

    def _blocks(self, height: int, width: int) -> tuple[int, int]:
        """Window positions along H and W of an (unpadded) height x width image."""
        blocks = tuple(window_output_size(size, k, s, p, p, d) for size, k, s, p, d in zip(
            (height, width), self.kernel_size, self.stride, self.padding, self.dilation))
        if min(blocks) <= 0:
            raise ShapeError(f"a {self.kernel_size} window (dilation {self.dilation}) does not "
                             f"fit a {height} x {width} image padded by {self.padding}")
        return blocks[0], blocks[1]

@register_layer("F.unfold", "nn.Unfold")
class Unfold(_Windows):
    """``F.unfold(x, kernel_size, dilation=1, padding=0, stride=1)``: (N, C, H, W) or
    (C, H, W) -> (N, C*kh*kw, L) or (C*kh*kw, L), L the number of windows."""

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) not in (3, 4):
            raise ShapeError(f"unfold takes (N, C, H, W) or (C, H, W), got {tuple(shape)}")
        out_h, out_w = self._blocks(shape[-2], shape[-1])
        kh, kw = self.kernel_size
        return (*shape[:-3], shape[-3] * kh * kw, out_h * out_w)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        x4 = x if x.ndim == 4 else x[None]
        n, c, h, w = x4.shape
        out_hw = self._blocks(h, w)
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        padded = np.pad(x4, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        cols = np.empty((n, c, kh, kw, *out_hw), x.dtype)
        for (i, j), tap in window_taps(padded, self.kernel_size, self.stride, self.dilation,
                                       out_hw):
            cols[:, :, i, j] = tap
        y = cols.reshape(n, c * kh * kw, out_hw[0] * out_hw[1])
        return y if x.ndim == 4 else y[0]

@register_layer("F.fold", "nn.Fold")
class Fold(_Windows):
    """``F.fold(x, output_size, kernel_size, dilation=1, padding=0, stride=1)``: (N, C*kh*kw,
    L) or (C*kh*kw, L) -> (N, C, H, W) or (C, H, W), overlapping windows summed."""

    output_size = Param(convert=at_least(1, as_tuple(2)))

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) not in (2, 3):
            raise ShapeError(f"fold takes (N, C*kh*kw, L) or (C*kh*kw, L), got {tuple(shape)}")
        (kh, kw), (height, width) = self.kernel_size, self.output_size
        out_h, out_w = self._blocks(height, width)
        columns, blocks = shape[-2], shape[-1]
        if columns % (kh * kw):
            raise ShapeError(f"fold: dim {len(shape) - 2} ({columns}) must be a multiple of "
                             f"kh*kw = {kh * kw}")
        if blocks != out_h * out_w:
            raise ShapeError(f"fold: {blocks} columns, but a {height} x {width} output has "
                             f"{out_h} x {out_w} = {out_h * out_w} windows")
        return (*shape[:-2], columns // (kh * kw), height, width)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        x3 = x if x.ndim == 3 else x[None]
        c, height, width = self.infer_shape(x3.shape)[1:]
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        out_hw = self._blocks(height, width)
        cols = x3.reshape(x3.shape[0], c, kh, kw, *out_hw)
        padded = np.zeros((x3.shape[0], c, height + 2 * ph, width + 2 * pw), x.dtype)
        for (i, j), tap in window_taps(padded, self.kernel_size, self.stride, self.dilation,
                                       out_hw):
            tap += cols[:, :, i, j]                     # tap is a view into `padded`
        y = padded[:, :, ph:ph + height, pw:pw + width]
        return np.ascontiguousarray(y if x.ndim == 3 else y[0])


@register_layer("Tensor.unfold", "aten::unfold")
class TensorUnfold(NamedArgumentLayer):
    """``x.unfold(dimension, size, step)``: dim ``dimension`` of length n -> (n - size) // step
    + 1 windows, each window's ``size`` elements in a new last dim (a 0-d x is one window)."""

    views_input = True         # windows already contiguous: a read-only view of x

    dimension = Param(None, as_int)
    size = Param(None, at_least(0, as_int))
    step = Param(None, at_least(1, as_int))
    INPUTS = ("input", "dimension", "size", "step")

    def _plan(self, shape: Shape, items: Sequence[Any]) -> tuple[int, int, int]:
        """(axis, size, step), checked as torch checks them."""
        dimension, size, step = (self.argument(name, items)
                                 for name in ("dimension", "size", "step"))
        if dimension is None or size is None or step is None:
            raise ShapeError("unfold needs dimension, size and step")
        if step < 1 or size < 0:
            raise ShapeError(f"unfold: step ({step}) must be >= 1 and size ({size}) >= 0")
        axis = normalize_dim(dimension, max(len(shape), 1))
        length = shape[axis] if shape else 1
        if size > length:
            raise ShapeError(f"unfold: a window of {size} does not fit dim {dimension} of "
                             f"{tuple(shape)}")
        return axis, size, step

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axis, size, step = self._plan(shape, input_values)
        if not shape:
            return [(size,)]
        windows = (shape[axis] - size) // step + 1
        return [shape[:axis] + (windows,) + shape[axis + 1:] + (size,)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis, size, step = self._plan(x.shape, inputs)
        if x.ndim == 0:
            return [x.reshape(1)[:size].copy()]
        windows = sliding_window_view(x, size, axis=axis)
        picked = windows[(slice(None),) * axis + (slice(None, None, step),)]
        return [np.ascontiguousarray(picked)]
