"""Pooling layers over the last two dims (H, W) of an (N, C, H, W) or (C, H, W) input:
max pooling, average pooling and adaptive average pooling."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (ArgumentInputLayer, Layer, Param, Shape, as_bool, as_int, as_tuple,
                         at_least, param_or_input)
from layers.registry import register_layer
from parser.errors import LayerError


def as_pool_stride(value: Any) -> tuple[int, int] | None:
    """A pair of strides >= 1; an empty list (torch's ``stride=[]``) means None: the kernel
    size. (pnnx writes ``stride=None`` for ``F.max_pool2d(x, 2)``.)"""
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return None
    return at_least(1, as_tuple(2))(value)


class _Pool2d(Layer):
    """What max and average pooling share: a window, its stride, padding and ceil_mode."""

    PARAMS = {
        "kernel_size": Param(convert=at_least(1, as_tuple(2))),
        "stride": Param(None, as_pool_stride),
        "padding": Param(0, at_least(0, as_tuple(2))),
        "ceil_mode": Param(False, as_bool),
    }
    dilation = (1, 1)                                # average pooling has no dilation

    def check_params(self) -> None:
        if self.stride is None:
            self.stride = self.kernel_size
        if any(p > k // 2 for p, k in zip(self.padding, self.kernel_size)):
            raise LayerError(f"padding {self.padding} must be at most half of the kernel size "
                             f"{self.kernel_size}")

    def infer_shape(self, shape: Shape) -> Shape:
        return kernels.pool2d_output_shape(shape, self.kernel_size, self.stride, self.padding,
                                           self.dilation, self.ceil_mode)


@register_layer("nn.MaxPool2d", "F.max_pool2d")
class MaxPool2d(_Pool2d):
    """Max pooling, as ``torch.nn.MaxPool2d``::

        y[..., oh, ow] = max_{i, j} x_padded[..., oh * sh + i * dh, ow * sw + j * dw]

    Padding is -inf (it never wins). Ho = floor((H + 2 * ph - dh * (kh - 1) - 1) / sh) + 1;
    with ceil_mode the division rounds up, but the last window must start inside the input or
    the left padding.
    """

    PARAMS = {
        **_Pool2d.PARAMS,
        "dilation": Param(1, at_least(1, as_tuple(2))),
        "return_indices": Param(False, as_bool),
    }

    def check_params(self) -> None:
        super().check_params()
        if self.return_indices:
            raise LayerError("return_indices=True (a second output with the argmax indices) "
                             "is not supported")

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return kernels.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                  self.ceil_mode)


@register_layer("nn.AvgPool2d", "F.avg_pool2d")
class AvgPool2d(_Pool2d):
    """Average pooling, as ``torch.nn.AvgPool2d``: the sum of each window divided by
    ``divisor_override`` if set, else by the window size counting the zero padding
    (``count_include_pad=True``) or only the real input elements (False)."""

    PARAMS = {
        **_Pool2d.PARAMS,
        "count_include_pad": Param(True, as_bool),
        "divisor_override": Param(None, at_least(1, as_int)),
    }

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return kernels.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                  self.count_include_pad, self.divisor_override)


def as_output_size(value: Any) -> tuple[int | None, int | None]:
    """Adaptive ``output_size``: an int, or a pair whose None entries keep the input size.
    pnnx writes None as 0 (``(3, None)`` -> ``output_size=(3,0)``), so 0 means None here."""
    if value is None or isinstance(value, (int, np.integer)):
        value = (value, value)
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError("expected an int or a pair")
    sizes = tuple(None if v is None or v == 0 else as_int(v) for v in value)
    if any(v is not None and v < 0 for v in sizes):
        raise ValueError("sizes must be >= 0")
    return sizes                                     # type: ignore[return-value]


@register_layer("nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d")
class AdaptiveAvgPool2d(ArgumentInputLayer):
    """Adaptive average pooling, as ``torch.nn.AdaptiveAvgPool2d``: the output has a fixed size
    (Ho, Wo); output bin i along H averages rows [floor(i * H / Ho), ceil((i + 1) * H / Ho)),
    and the same along W. ``output_size=1`` is global average pooling.

    When the model computes the size from the input's (``F.adaptive_avg_pool2d(x, (h // 2,
    w // 2))`` in a dynamic export), pnnx passes it as a second input instead of the parameter.
    """

    PARAMS = {"output_size": Param(None, as_output_size)}

    def _output_size(self, inputs) -> tuple[int | None, int | None]:
        sizes = param_or_input(self.output_size, "output_size", inputs)
        if isinstance(sizes, np.ndarray):                 # computed in the graph: real sizes
            return tuple(int(v) for v in sizes)
        return sizes

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = input_shapes[0]
        out_hw = kernels.adaptive_output_size(shape, self._output_size(input_values))
        return [(*shape[:-2], *out_hw)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [kernels.adaptive_avg_pool2d(inputs[0], self._output_size(inputs))]
