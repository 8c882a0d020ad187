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
"""

from __future__ import annotations

import numpy as np

from layers import kernels
from layers.base import Layer, Shape
from layers.convolution import Conv2d
from parser.errors import ShapeError


class SqueezeExcitation(Layer):
    """y = x * gate(expand(act(reduce(mean(x))))) for x (N, C, H, W) float32; ``reduce``
    (C -> S) and ``expand`` (S -> C) are 1x1 convolutions with their activations fused in."""

    def __init__(self, reduce: Conv2d, expand: Conv2d):
        super().__init__()
        self.reduce, self.expand = reduce, expand
        self.channels = reduce.in_channels

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
        self.infer_shape(x.shape)
        squeezed = kernels.adaptive_avg_pool2d(x, (1, 1))              # (N, C, 1, 1)
        gate = self.expand.forward_one(self.reduce.forward_one(squeezed))
        return np.multiply(gate, x, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SqueezeExcitation({self.reduce!r}, {self.expand!r})"
