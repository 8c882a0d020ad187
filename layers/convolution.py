"""Convolution layers: nn.Conv2d (weights from the bin file) and F.conv2d (weights as inputs).

pnnx writes ``F.conv2d`` with constant weights as an ``nn.Conv2d`` line (with @weight/@bias);
an ``F.conv2d`` line is left only when the weight is computed in the graph, and then the
weight and optional bias arrive as the 2nd and 3rd inputs ($weight, $bias), not as attributes.

Two implementations of the same maths: ``kernels.conv2d`` (numpy, the reference) and, when
``use_fast_kernels`` is on, ``layers.fast`` (depthwise numba kernel, Winograd, im2col + BLAS,
weights packed once). infer/fusion.py may fold into an nn.Conv2d the zero padding before it
and the residual add and activation after it (``fuse_padding`` / ``fuse_residual`` /
``fuse_activation``); both implementations then compute the fused result.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, Param, Shape, as_bool, as_int, as_str, as_tuple, at_least,
                         bias_is_an_input, check_bias_flag, expect_shape, split_weight_inputs)
from layers.fast.conv import PackedConv2d
from layers.fast.epilogue import IDENTITY, Activation, activation_of
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
        if self.use_fast_kernels and x.ndim == weight.ndim == 4:
            # weights change from call to call: no Winograd (its packing costs a convolution)
            packed = PackedConv2d(weight, bias, self.stride, self.dilation, self.groups,
                                  winograd=False)
            out_hw = self._output_shape(x.shape, weight.shape)[2:]
            return packed.run(x, self._pads(weight.shape[2:]), out_hw, IDENTITY)
        return kernels.conv2d(x, weight, bias, self.stride, self.padding, self.dilation,
                              self.groups)

    def _pads(self, kernel: Shape) -> tuple[int, int, int, int]:
        """The zeros around the input as (top, bottom, left, right)."""
        return kernels.conv2d_padding(self.padding, tuple(kernel), self.dilation)


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

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        super().load_model(weights)
        self.packed = PackedConv2d(self.weight, self.bias, self.stride, self.dilation,
                                   self.groups)

    # ----- fusion (infer/fusion.py): what this convolution also computes ------------------
    fused_padding: tuple[int, int, int, int] = (0, 0, 0, 0)   # (left, right, top, bottom)
    fused_residual: bool = False         # a second input, added before the activation
    fused_activation: Layer | None = None

    def fuse_padding(self, left: int, right: int, top: int, bottom: int) -> None:
        """Zero-pad the input first (an nn.ZeroPad2d folded in); needs padding_mode zeros."""
        if self.padding_mode != "zeros" or min(left, right, top, bottom) < 0:
            raise LayerError("only zero padding >= 0 folds into a zero-padded convolution")
        old = self.fused_padding
        self.fused_padding = (old[0] + left, old[1] + right, old[2] + top, old[3] + bottom)

    def fuse_residual(self) -> None:
        """Take a second input (N, C_out, Ho, Wo) and add it to the output (a residual add)."""
        self.fused_residual, self.one_blob_only = True, False

    def fuse_activation(self, layer: Layer) -> None:
        """Apply an elementwise in-place activation layer to the output."""
        if not layer.support_inplace or self.fused_activation is not None:
            raise LayerError(f"cannot fuse {type(layer).__name__} into this convolution")
        self.fused_activation = layer

    @property
    def fused_kernel_activation(self) -> Activation | None:
        """The fused activation as the fast kernels take it (None: none they know)."""
        if self.fused_activation is None:
            return IDENTITY
        return activation_of(self.fused_activation)

    # ----- shapes ---------------------------------------------------------------------------
    def _padded_shape(self, shape: Shape) -> Shape:
        left, right, top, bottom = self.fused_padding
        if len(shape) < 2 or not any(self.fused_padding):
            return shape
        return (*shape[:-2], shape[-2] + top + bottom, shape[-1] + left + right)

    def infer_shape(self, shape: Shape) -> Shape:
        out = self._output_shape(self._padded_shape(shape), self.weight_shape)
        if self.use_fast_kernels:                  # pack the weights this size needs, now
            self.packed.prepare(out[0], out[2:])
        return out

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        expected = 2 if self.fused_residual else 1
        if len(input_shapes) != expected:
            raise ShapeError(f"expects {expected} input(s), got {len(input_shapes)}")
        out = self.infer_shape(tuple(input_shapes[0]))
        if self.fused_residual:
            out = _broadcast(out, tuple(input_shapes[1]))
        return [out]

    # ----- running --------------------------------------------------------------------------
    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, residual = inputs[0], (inputs[1] if self.fused_residual else None)
        if self.use_fast_kernels:
            return [self._forward_fast(x, residual)]
        return [self._forward_reference(x, residual)]

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return self.forward([x])[0]

    def _forward_reference(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        """kernels.pad, kernels.conv2d, + residual, activation: one numpy step at a time."""
        if any(self.fused_padding):
            x = kernels.pad(x, self.fused_padding)
        if self.padding_mode == "zeros":
            y = kernels.conv2d(x, self.weight, self.bias, self.stride, self.padding,
                               self.dilation, self.groups)
        else:
            top, bottom, left, right = self._pads(self.kernel_size)
            x = kernels.pad(x, (left, right, top, bottom), mode=self.padding_mode)
            y = kernels.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation,
                               self.groups)
        return self._finish(y, residual)

    def _finish(self, y: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        """The fused tail done by numpy and the activation layer itself."""
        if residual is not None:
            y = np.add(y, residual, dtype=np.float32)     # broadcasts as torch's add does
        if self.fused_activation is not None:
            self.fused_activation.forward_inplace(y)
        return y

    def _forward_fast(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        """The packed kernels, with padding, bias, residual and activation fused in."""
        if x.ndim != 4:                            # (C, H, W): the reference explains why not
            return self._forward_reference(x, residual)
        top, bottom, left, right = self._pads(self.kernel_size)
        if self.padding_mode != "zeros":
            x = kernels.pad(x, (left, right, top, bottom), mode=self.padding_mode)
            top = bottom = left = right = 0
        fl, fr, ft, fb = self.fused_padding
        pads = (top + ft, bottom + fb, left + fl, right + fr)
        out_hw = self._out_hw(x.shape, pads)
        activation = self.fused_kernel_activation
        if residual is not None and residual.shape != (x.shape[0], self.out_channels, *out_hw):
            residual_in_kernel = None                      # broadcasting: numpy does the add
        else:
            residual_in_kernel = residual
        if activation is None or (residual is not None and residual_in_kernel is None):
            y = self.packed.run(x, pads, out_hw, IDENTITY)
            return self._finish(y, residual)
        return self.packed.run(x, pads, out_hw, activation, residual_in_kernel)

    def _out_hw(self, x_shape: Shape, pads: tuple[int, int, int, int]) -> tuple[int, int]:
        """(Ho, Wo) of the convolution over x padded by pads (top, bottom, left, right)."""
        top, bottom, left, right = pads
        padded = (*x_shape[:2], x_shape[2] + top + bottom, x_shape[3] + left + right)
        return kernels.conv2d_output_shape(padded, self.weight_shape, self.stride, 0,
                                           self.dilation, self.groups)[2:]


def _broadcast(shape: Shape, other: Shape) -> Shape:
    """The shape of ``a + b`` for arrays of these shapes (numpy's = torch's rule)."""
    try:
        return tuple(np.broadcast_shapes(shape, other))
    except ValueError:
        raise ShapeError(f"the residual {other} cannot be added to the convolution's output "
                         f"{shape}") from None


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
