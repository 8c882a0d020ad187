"""Squeeze-and-excitation: a per-channel gate that a block computes from its own input
(Hu et al., 2018; torchvision's ``SqueezeExcitation``)::

    s = mean of x over (H, W)                  (N, C)   squeeze
    g = gate(expand(act(reduce(s))))           (N, C)   excite: two 1x1 convolutions,
                                                         C -> S -> C, their activations
    y = x * g[:, :, None, None]                (N, C, H, W)

MobileNetV3 and the EfficientNets have one in most blocks. Exported, a block is six
operators, each working on C numbers but for the first and the last::

    x -> AdaptiveAvgPool2d(1) -> Conv2d 1x1 -> act -> Conv2d 1x1 -> gate -> mul(gate, x)
    |_______________________________________________________________________^

Run step by step, a graph pays its cost per step six times for little arithmetic.
infer/fusion.py replaces the six by this one layer, which holds the two convolutions (their
activations fused into them). It is no pnnx operator type: the registry does not list it,
and it appears only in fused graphs.

A residual block of this kind (PP-LCNet's and DBNet's) adds x back, and another tensor r
after it, in the same expression: ``add(@0,mul(@0,@1))`` or ``add(add(@0,mul(@0,@1)),@2)``.
With ``keeps_input`` the layer computes y = x + x * g, with ``adds_residual`` (a second
input r) then y + r, rounded step by step as torch rounds them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import Layer, Shape
from layers.convolution import Conv2d, residual_shape
from parser.errors import ShapeError


class SqueezeExcitation(Layer):
    """y = x * gate(expand(act(reduce(mean(x))))) for x (N, C, H, W) float32 (+ x, + r: a
    residual block, ``fuse_output``); ``reduce`` (C -> S) and ``expand`` (S -> C) are 1x1
    convolutions with their activations fused in."""

    keeps_input = False              # y = x + x * g
    adds_residual = False            # a second input r: y (+ x * g) + r

    def __init__(self, reduce: Conv2d, expand: Conv2d):
        super().__init__()
        self.reduce, self.expand = reduce, expand
        self.channels = reduce.in_channels

    def fuse_output(self, keeps_input: bool, residual: bool) -> None:
        """Add x back (x + x * g), and a second input after it (the module docstring)."""
        self.keeps_input = keeps_input
        if residual:
            self.adds_residual, self.one_blob_only = True, False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        expected = 2 if self.adds_residual else 1
        if len(input_shapes) != expected:
            raise ShapeError(f"expects {expected} input(s), got {len(input_shapes)}")
        shape = self.infer_shape(tuple(input_shapes[0]))
        if not self.adds_residual:
            return [shape]
        return [residual_shape(shape, tuple(input_shapes[1]), "the block's output")]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        y = self._excite(inputs[0])
        return [np.add(y, inputs[1], dtype=np.float32) if self.adds_residual else y]

    def infer_shape(self, shape: Shape) -> Shape:
        """x's shape, once the two convolutions have checked theirs on (N, C, 1, 1)."""
        if len(shape) != 4 or shape[1] != self.channels:
            raise ShapeError(f"squeeze-and-excitation takes (N, {self.channels}, H, W), got "
                             f"{shape}")
        gate = self.expand.infer_shape(self.reduce.infer_shape((*shape[:2], 1, 1)))
        if gate != (*shape[:2], 1, 1):
            raise ShapeError(f"the gate {gate} does not match x {shape} channel by channel")
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return self._excite(x)

    def _excite(self, x: np.ndarray) -> np.ndarray:
        """x * gate (+ x, if it keeps x), numpy step by step."""
        self.infer_shape(x.shape)
        squeezed = kernels.adaptive_avg_pool2d(x, (1, 1))              # (N, C, 1, 1)
        gate = self.expand.forward_one(self.reduce.forward_one(squeezed))
        y = np.multiply(gate, x, dtype=np.float32)
        return np.add(x, y, dtype=np.float32) if self.keeps_input else y

    def __repr__(self) -> str:
        extra = (", keeps_input=True" if self.keeps_input else "") + (
            ", adds_residual=True" if self.adds_residual else "")
        return f"SqueezeExcitation({self.reduce!r}, {self.expand!r}{extra})"
