"""Batch normalization in eval mode (running statistics).

pnnx usually folds a BatchNorm that follows a convolution into the convolution's weights, so
these layers appear only for a BatchNorm with no convolution in front of it.
"""

from __future__ import annotations

import numpy as np

from layers import kernels
from layers.base import Layer, Param, Shape, as_bool, as_float, as_int, at_least, expect_shape
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


class _BatchNorm(Layer):
    """Eval-mode batch norm over channel dim 1, folded into one multiply-add per channel::

        y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] + bias[c]
          = x * scale[c] + shift[c]            (scale, shift computed once, in load_model)

    weight and bias exist only when ``affine=True``.
    """

    PARAMS = {
        "num_features": Param(convert=at_least(1, as_int)),
        "eps": Param(1e-5, as_float),
        "affine": Param(True, as_bool),
    }
    WEIGHTS = ("running_mean", "running_var")
    OPTIONAL_WEIGHTS = ("weight", "bias")
    RANKS: tuple[int, ...] = ()                      # input ranks torch accepts

    def check_weights(self) -> None:
        if self.affine and (self.weight is None or self.bias is None):
            raise LayerError("affine=True but the @weight and @bias weights are missing")
        for key in self.WEIGHTS + self.OPTIONAL_WEIGHTS:
            if getattr(self, key) is not None:
                expect_shape(f"@{key}", getattr(self, key).shape, (self.num_features,))
        self.scale, self.shift = kernels.batch_norm_scale_shift(
            self.running_mean, self.running_var, self.weight, self.bias, self.eps)

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) not in self.RANKS:
            raise ShapeError(f"expects a {' or '.join(f'{r}-D' for r in self.RANKS)} input, got "
                             f"shape {tuple(shape)}")
        if shape[1] != self.num_features:
            raise ShapeError(f"input {tuple(shape)} has {shape[1]} channels, expected "
                             f"num_features={self.num_features}")
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return kernels.channel_affine(x, self.scale, self.shift)


@register_layer("nn.BatchNorm2d")
class BatchNorm2d(_BatchNorm):
    """``nn.BatchNorm2d`` in eval mode: (N, C, H, W) -> (N, C, H, W)."""

    RANKS = (4,)


@register_layer("nn.BatchNorm1d")
class BatchNorm1d(_BatchNorm):
    """``nn.BatchNorm1d`` in eval mode: (N, C) or (N, C, L), same shape out."""

    RANKS = (2, 3)
