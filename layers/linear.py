"""Fully connected layers: nn.Linear (weights from the bin file) and F.linear (weights as inputs).

pnnx writes ``F.linear`` with a constant weight as an ``nn.Linear`` line; an ``F.linear`` line
is left only when the weight is computed in the graph: weight and optional bias are then inputs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, Param, Shape, as_bool, as_int, at_least, bias_is_an_input,
                         check_bias_flag, expect_shape, split_weight_inputs)
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def linear_output_shape(x_shape: Shape, weight_shape: Shape) -> Shape:
    """(..., in) input and (out, in) weight -> (..., out)."""
    if len(x_shape) < 1:
        raise ShapeError("expects an input with at least 1 dim (..., in_features), got a scalar")
    if len(weight_shape) != 2:
        raise ShapeError(f"expects a 2-D (out_features, in_features) weight, got shape "
                         f"{tuple(weight_shape)}")
    if x_shape[-1] != weight_shape[1]:
        raise ShapeError(f"input {tuple(x_shape)} has {x_shape[-1]} features in its last dim, "
                         f"the weight {tuple(weight_shape)} expects {weight_shape[1]}")
    return (*x_shape[:-1], weight_shape[0])


@register_layer("nn.Linear")
class Linear(Layer):
    """Fully connected layer, as ``torch.nn.Linear``, over the last dim, any leading dims::

        y = x @ weight.T + bias      x (..., in), weight (out, in), bias (out,) -> y (..., out)
    """

    PARAMS = {
        "in_features": Param(convert=at_least(1, as_int)),
        "out_features": Param(convert=at_least(1, as_int)),
        "bias": Param(True, as_bool),
    }
    WEIGHTS = ("weight",)
    OPTIONAL_WEIGHTS = ("bias",)

    def check_params(self) -> None:
        self.has_bias = self.bias

    def check_weights(self) -> None:
        # the parameter `bias` (True/False) is now the @bias array or None: compare with the flag
        check_bias_flag(self.has_bias, self.bias)
        expect_shape("@weight", self.weight.shape, (self.out_features, self.in_features))
        if self.bias is not None:
            expect_shape("@bias", self.bias.shape, (self.out_features,))

    def infer_shape(self, shape: Shape) -> Shape:
        return linear_output_shape(shape, (self.out_features, self.in_features))

    # fusion (infer/fusion.py): an elementwise activation applied to the output
    fused_activation: Layer | None = None

    def fuse_activation(self, layer: Layer) -> None:
        if not layer.support_inplace or self.fused_activation is not None:
            raise LayerError(f"cannot fuse {type(layer).__name__} into this linear layer")
        self.fused_activation = layer

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if self.use_fast_kernels and x.ndim >= 1 and x.dtype == np.float32:
            y = self._forward_fast(x)
        else:
            y = kernels.linear(x, self.weight, self.bias)
        if self.fused_activation is not None:
            self.fused_activation.forward_inplace(y)
        return y

    def _forward_fast(self, x: np.ndarray) -> np.ndarray:
        """One GEMM into a fresh output, then the bias in place: x (M, in) @ weight.T (in, out),
        the weight read as stored (BLAS takes the transpose as a flag, no copy)."""
        rows = x.reshape(-1, self.in_features)                  # (M, in)
        y = np.empty((rows.shape[0], self.out_features), np.float32)
        np.matmul(rows, self.weight.T, out=y)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


@register_layer("F.linear")
class FunctionalLinear(Layer):
    """``F.linear(input, weight, bias)`` with the weight (and the bias, if any) as graph inputs:
    x (..., in), weight (out, in)[, bias (out,)] -> x @ weight.T + bias (..., out)."""

    PARAMS = {"bias": Param(None, bias_is_an_input)}   # pnnx writes bias=None
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        out_shape = linear_output_shape(x, weight)
        if bias is not None:
            expect_shape("bias input", bias, (weight[0],), ShapeError)
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [kernels.linear(*split_weight_inputs(inputs))]
