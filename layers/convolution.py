"""Convolution layers: nn.Conv2d (weights from the bin file) and F.conv2d (weights as inputs).

pnnx writes ``F.conv2d`` with constant weights as an ``nn.Conv2d`` line (with @weight/@bias);
an ``F.conv2d`` line is left only when the weight is computed in the graph, and then the
weight and optional bias arrive as the 2nd and 3rd inputs ($weight, $bias), not as attributes.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, Param, Shape, as_bool, as_int, as_str, as_tuple, at_least,
                         bias_is_an_input, check_bias_flag, expect_shape, split_weight_inputs)
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def as_conv_padding(value: Any) -> tuple[int, int] | str:
    """torch's conv padding: 'same', 'valid', an int or a pair of ints (each >= 0)."""
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise ValueError("a string padding must be 'same' or 'valid'")
        return value
    return at_least(0, as_tuple(2))(value)


class _ConvGeometry(Layer):
    """The parameters nn.Conv2d and F.conv2d share, and their checks."""

    PARAMS = {
        "stride": Param(1, at_least(1, as_tuple(2))),
        "padding": Param(0, as_conv_padding),
        "dilation": Param(1, at_least(1, as_tuple(2))),
        "groups": Param(1, at_least(1, as_int)),
    }

    def check_params(self) -> None:
        if self.padding == "same" and self.stride != (1, 1):
            raise LayerError(f"padding='same' is not supported for strided convolutions "
                             f"(stride={self.stride})")

    def _output_shape(self, x_shape: Shape, weight_shape: Shape) -> Shape:
        return kernels.conv2d_output_shape(x_shape, weight_shape, self.stride, self.padding,
                                           self.dilation, self.groups)

    def _conv(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        return kernels.conv2d(x, weight, bias, self.stride, self.padding, self.dilation,
                              self.groups)


@register_layer("nn.Conv2d")
class Conv2d(_ConvGeometry):
    """2-D convolution (cross-correlation) with learned weights, as ``torch.nn.Conv2d``::

        y[n, o] = bias[o] + sum_{c in group(o)} weight[o, c] (*) x_padded[n, c]

    x (N, C_in, H, W), weight (C_out, C_in / groups, kh, kw), bias (C_out,) -> y (N, C_out, Ho, Wo)
    Ho = floor((H + pad_top + pad_bottom - dilation_h * (kh - 1) - 1) / stride_h) + 1 (W alike).
    ``padding_mode`` other than 'zeros' pads with kernels.pad first (reflect / replicate /
    circular), then convolves without padding.
    """

    PARAMS = {
        "in_channels": Param(convert=at_least(1, as_int)),
        "out_channels": Param(convert=at_least(1, as_int)),
        "kernel_size": Param(convert=at_least(1, as_tuple(2))),
        **_ConvGeometry.PARAMS,
        "bias": Param(True, as_bool),
        "padding_mode": Param("zeros", as_str),
    }
    WEIGHTS = ("weight",)
    OPTIONAL_WEIGHTS = ("bias",)

    def check_params(self) -> None:
        super().check_params()
        self.has_bias = self.bias
        if self.padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise LayerError(f"padding_mode must be zeros, reflect, replicate or circular, "
                             f"got {self.padding_mode!r}")
        for key in ("in_channels", "out_channels"):
            if getattr(self, key) % self.groups:
                raise LayerError(f"{key}={getattr(self, key)} is not divisible by "
                                 f"groups={self.groups}")

    @property
    def weight_shape(self) -> Shape:
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def check_weights(self) -> None:
        # the parameter `bias` (True/False) is now the @bias array or None: compare with the flag
        check_bias_flag(self.has_bias, self.bias)
        expect_shape("@weight", self.weight.shape, self.weight_shape)
        if self.bias is not None:
            expect_shape("@bias", self.bias.shape, (self.out_channels,))

    def infer_shape(self, shape: Shape) -> Shape:
        return self._output_shape(shape, self.weight_shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if self.padding_mode == "zeros":
            return self._conv(x, self.weight, self.bias)
        top, bottom, left, right = kernels.conv2d_padding(self.padding, self.kernel_size,
                                                          self.dilation)
        x = kernels.pad(x, (left, right, top, bottom), mode=self.padding_mode)
        return kernels.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation,
                              self.groups)


@register_layer("F.conv2d")
class FunctionalConv2d(_ConvGeometry):
    """``F.conv2d(input, weight, bias)`` with the weight (and the bias, if any) as graph inputs.

    inputs: x (N, C_in, H, W), weight (C_out, C_in / groups, kh, kw)[, bias (C_out,)]
    """

    PARAMS = {**_ConvGeometry.PARAMS, "bias": Param(None, bias_is_an_input)}
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        out_shape = self._output_shape(x, weight)            # checks the weight against x
        if bias is not None:
            expect_shape("bias input", bias, (weight[0],), ShapeError)
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self._conv(*split_weight_inputs(inputs))]
