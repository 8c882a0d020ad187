"""Convolution layers: nn.Conv1d / nn.Conv2d and nn.ConvTranspose1d / nn.ConvTranspose2d
(weights from the bin file), and F.conv1d / F.conv2d / F.conv_transpose1d / F.conv_transpose2d
(weights as inputs).

pnnx writes ``F.conv2d`` with constant weights as an ``nn.Conv2d`` line (with @weight/@bias);
an ``F.conv2d`` line is left only when the weight is computed in the graph, and then the
weight and optional bias arrive as the 2nd and 3rd inputs ($weight, $bias), not as attributes.

The maths is ``kernels.conv2d`` (numpy). The fast backend subclasses these layers
(layers/fast/layers.py: packed weights, Winograd, register tiles) and the graph uses its
subclass unless it is built with ``reference=True``. infer/fusion.py may fold into an
nn.Conv2d the zero padding before it and the residual add and activation after it
(``fuse_padding`` / ``fuse_residual`` / ``fuse_activation``); the layer then computes the
fused result: here one numpy step at a time, in the fast subclass in one pass.

A 1-D layer is its 2-D layer over a height of 1: an (N, C, L) input runs as (N, C, 1, L), a
kernel k as (1, k), stride s as (1, s), padding p as (0, p). Its 1-D parameters (the
``_Geometry1d`` mixin's) are read by ``lifted`` converters, so after ``load_param`` they hold
that 2-D form.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, overload

import numpy as np

from layers import kernels
from layers.activation import ScaleShift
from layers.base import (FusesActivation, Layer, Param, Shape, as_bool, as_int, as_str,
                         as_tuple, at_least, bias_is_an_input, check_bias_flag, expect_shape,
                         split_weight_inputs)
from layers.kernels import conv_transpose2d_output_shape
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def as_conv_padding(value: Any, dims: int = 2) -> tuple[int, ...] | str:
    """torch's conv padding: 'same', 'valid', an int or ``dims`` ints (each >= 0). In 2-D,
    also four ints (left, right, top, bottom): pnnx writes ``nn.Conv2d(padding='same',
    padding_mode='reflect')`` with an even kernel that way (the pads torch gives F.pad)."""
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise ValueError("a string padding must be 'same' or 'valid'")
        return value
    if dims == 2 and isinstance(value, (list, tuple)) and len(value) == 4:
        return at_least(0, as_tuple(4))(value)
    return at_least(0, as_tuple(dims))(value)


@overload
def lifted(convert: Callable[[Any], tuple[int]], height_value: int
           ) -> Callable[[Any], tuple[int, int]]: ...
@overload
def lifted(convert: Callable[[Any], tuple[int, ...] | str], height_value: int
           ) -> Callable[[Any], tuple[int, ...] | str]: ...
def lifted(convert: Callable[[Any], tuple[int, ...] | str], height_value: int
           ) -> Callable[[Any], tuple[int, ...] | str]:
    """A 1-D parameter read as the 2-D one of a height-1 layer: ``convert`` the value to a
    1-tuple, then put ``height_value`` before it (kernel 3 -> (1, 3), padding 2 -> (0, 2)).
    Strings ('same', 'valid') are the same in 1-D and 2-D."""

    def convert_lifted(value: Any) -> tuple[int, ...] | str:
        result = convert(value)
        return result if isinstance(result, str) else (height_value, *result)

    return convert_lifted


def lift_shape(shape: Shape, what: str = "(N, C, L) input") -> Shape:
    """(N, C, L) -> (N, C, 1, L), the shape a 1-D layer's 2-D form reads; ShapeError if not
    3-D."""
    if len(shape) != 3:
        raise ShapeError(f"expects a 3-D {what}, got shape {tuple(shape)} (rank {len(shape)})")
    return (*shape[:2], 1, shape[2])


def lift(x: np.ndarray, what: str = "(N, C, L) input") -> np.ndarray:
    """(A, B, L) -> (A, B, 1, L), a view: a 1-D input or weight as its height-1 2-D form."""
    lift_shape(x.shape, what)
    return x[:, :, None, :]


@overload
def drop_height(x: Shape) -> Shape: ...
@overload
def drop_height(x: np.ndarray) -> np.ndarray: ...
def drop_height(x: Shape | np.ndarray) -> Shape | np.ndarray:
    """(N, C, 1, L) -> (N, C, L): a 2-D result (array or shape) back to 1-D."""
    return (*x[:2], x[3]) if isinstance(x, tuple) else x[:, :, 0, :]


def as_conv1d_padding(value: Any) -> tuple[int, ...] | str:
    """as_conv_padding in 1-D: 'same', 'valid', or one int (>= 0)."""
    return as_conv_padding(value, dims=1)


def check_same_padding(padding: Any, stride: tuple[int, ...]) -> None:
    """padding='same' is for convolutions without a stride (torch refuses it otherwise)."""
    if padding == "same" and any(s != 1 for s in stride):
        raise LayerError(f"padding='same' is not supported for strided convolutions "
                         f"(stride={stride})")


class _ConvGeometry(Layer):
    """The parameters nn.Conv2d and F.conv2d share, and their checks."""

    stride = Param(1, at_least(1, as_tuple(2)))
    padding = Param(0, as_conv_padding)
    dilation = Param(1, at_least(1, as_tuple(2)))
    groups = Param(1, at_least(1, as_int))

    def check_params(self) -> None:
        check_same_padding(self.padding, self.stride)

    def _output_shape(self, x_shape: Shape, weight_shape: Shape) -> Shape:
        return kernels.conv2d_output_shape(x_shape, weight_shape, self.stride, self.padding,
                                           self.dilation, self.groups)

    def _conv(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        return kernels.conv2d(x, weight, bias, self.stride, self.padding, self.dilation,
                              self.groups)

    def _pads(self, kernel: Shape) -> tuple[int, int, int, int]:
        """The zeros around the input as (top, bottom, left, right)."""
        kh, kw = kernel
        return kernels.conv2d_padding(self.padding, (kh, kw), self.dilation)


class _Geometry1d(Layer):
    """Mixin of the 1-D convolutions: stride, padding and dilation read in 1-D, lifted to the
    2-D form of a height-1 layer (they override the 2-D layer's)."""

    stride = Param(1, lifted(at_least(1, as_tuple(1)), 1))
    padding = Param(0, lifted(as_conv1d_padding, 0))
    dilation = Param(1, lifted(at_least(1, as_tuple(1)), 1))


class FoldsAffine(FusesActivation):
    """Mixed into a convolution (a weight and an optional bias of out_channels values): an
    affine map a * y + b after it (infer/fusion.py) folds into them, or, after a fused
    residual or activation f, becomes its activation ScaleShift(f, a, b)."""

    weight: np.ndarray
    bias: Any
    has_bias: bool
    out_channels: int
    fused_residual: bool = False

    def can_fuse_affine(self, scale: float, shift: float) -> bool:
        """Whether ``fuse_affine`` takes this map: always into the weights; after a residual
        or activation, if the layer applies the ScaleShift it makes."""
        return (self.fused_activation is None and not self.fused_residual) or (
            self.applies_activation(ScaleShift(self.fused_activation, scale, shift)))

    def fuse_affine(self, scale: float, shift: float) -> None:
        """Compute scale * conv(x) + shift: before any residual or activation, weight *
        scale and bias * scale + shift, new arrays (the old ones may be the bin file's);
        after them, as the activation ScaleShift(activation, scale, shift)."""
        if self.fused_activation is not None or self.fused_residual:
            if not self.can_fuse_affine(scale, shift):
                raise LayerError(f"cannot apply {scale} * y + {shift} after "
                                 f"{self.fused_activation!r} in {self.fused_into}")
            self.fused_activation = ScaleShift(self.fused_activation, scale, shift)
            return
        factor = np.float32(scale)
        self.weight = np.multiply(self.weight, factor, dtype=np.float32)
        bias = np.zeros(self.out_channels, np.float32) if self.bias is None else self.bias
        self.bias = np.add(np.multiply(bias, factor, dtype=np.float32), np.float32(shift),
                           dtype=np.float32)
        self.has_bias = True


class LearnedWeights(Layer):
    """What nn.Conv2d and nn.Conv3d share: the channels, bias flag and padding mode parameters
    (each class declares its kernel_size and mixes in its geometry: stride, padding, dilation,
    groups), the weights from the bin file, @weight (C_out, C_in / groups, *kernel) and an
    optional @bias (C_out,), and their checks."""

    in_channels = Param(convert=at_least(1, as_int))
    out_channels = Param(convert=at_least(1, as_int))
    # the flag from the param line; load_model replaces it by the @bias array (or None)
    bias: Param[Any] = Param(True, as_bool)
    padding_mode = Param("zeros", as_str)
    WEIGHTS = ("weight",)
    OPTIONAL_WEIGHTS = ("bias",)
    weight: np.ndarray
    has_bias: bool
    kernel_size: tuple[int, ...]                          # the class's, in its dims
    groups: int                                           # the geometry's

    def check_learned_params(self) -> None:
        self.has_bias = self.bias      # load_model replaces the flag by the array (or None)
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
        check_bias_flag(self.has_bias, self.bias)
        expect_shape("@weight", self.weight.shape, self.weight_shape)
        if self.bias is not None:
            expect_shape("@bias", self.bias.shape, (self.out_channels,))


@register_layer("nn.Conv2d")
class Conv2d(FoldsAffine, LearnedWeights, _ConvGeometry):
    """2-D convolution (cross-correlation) with learned weights, as ``torch.nn.Conv2d``::

        y[n, o] = bias[o] + sum_{c in group(o)} weight[o, c] (*) x_padded[n, c]

    x (N, C_in, H, W), weight (C_out, C_in / groups, kh, kw), bias (C_out,) -> y (N, C_out, Ho, Wo)
    Ho = floor((H + pad_top + pad_bottom - dilation_h * (kh - 1) - 1) / stride_h) + 1 (W alike).
    ``padding_mode`` other than 'zeros' pads with kernels.pad first (reflect / replicate /
    circular), then convolves without padding.
    """

    kernel_size = Param(convert=at_least(1, as_tuple(2)))

    def check_params(self) -> None:
        super().check_params()
        self.check_learned_params()

    # ----- fusion (infer/fusion.py): what this convolution also computes ------------------
    fused_padding: tuple[int, int, int, int] = (0, 0, 0, 0)   # (left, right, top, bottom)
    fused_residual: bool = False         # a second input, added before the activation
    fused_into = "this convolution"      # fused_activation: FusesActivation

    def fuse_padding(self, left: int, right: int, top: int, bottom: int) -> None:
        """Zero-pad the input first (an nn.ZeroPad2d folded in); needs padding_mode zeros."""
        if self.padding_mode != "zeros" or min(left, right, top, bottom) < 0:
            raise LayerError("only zero padding >= 0 folds into a zero-padded convolution")
        old = self.fused_padding
        self.fused_padding = (old[0] + left, old[1] + right, old[2] + top, old[3] + bottom)

    def fuse_residual(self) -> None:
        """Take a second input (N, C_out, Ho, Wo) and add it to the output (a residual add)."""
        self.fused_residual, self.one_blob_only = True, False

    # ----- shapes ---------------------------------------------------------------------------
    def _padded_shape(self, shape: Shape) -> Shape:
        left, right, top, bottom = self.fused_padding
        if len(shape) < 2 or not any(self.fused_padding):
            return shape
        return (*shape[:-2], shape[-2] + top + bottom, shape[-1] + left + right)

    def infer_shape(self, shape: Shape) -> Shape:
        return self._output_shape(self._padded_shape(shape), self.weight_shape)

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        expected = 2 if self.fused_residual else 1
        if len(input_shapes) != expected:
            raise ShapeError(f"expects {expected} input(s), got {len(input_shapes)}")
        out = self.infer_shape(tuple(input_shapes[0]))
        if self.fused_residual:
            out = residual_shape(out, tuple(input_shapes[1]))
        return [out]

    # ----- running --------------------------------------------------------------------------
    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.fused_residual:
            return [self._forward(inputs[0], inputs[1])]
        return [self.forward_one(inputs[0])]

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return self._forward(x, None)

    def _forward(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
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
        """The fused tail: the residual added (broadcasting as torch's add does), then the
        activation layer run in place."""
        if residual is not None:
            y = np.add(y, residual, dtype=np.float32)
        if self.fused_activation is not None:
            self.fused_activation.forward_inplace(y)
        return y


def residual_shape(shape: Shape, other: Shape, to: str = "the convolution's output") -> Shape:
    """The shape of ``a + b`` for arrays of these shapes (numpy's = torch's rule): a fused
    residual ``other`` added to an output of ``shape``."""
    try:
        return tuple(np.broadcast_shapes(shape, other))
    except ValueError:
        raise ShapeError(f"the residual {other} cannot be added to {to} {shape}") from None


@register_layer("F.conv2d")
class FunctionalConv2d(_ConvGeometry):
    """``F.conv2d(input, weight, bias)`` with the weight (and the bias, if any) as graph inputs.

    inputs: x (N, C_in, H, W), weight (C_out, C_in / groups, kh, kw)[, bias (C_out,)]
    """

    bias = Param(None, bias_is_an_input)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        out_shape = self._output_shape(x, weight)            # checks the weight against x
        if bias is not None:
            expect_shape("bias input", bias, (weight[0],), ShapeError)
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self._conv(*split_weight_inputs(inputs))]


# ----- 1-D convolution: the 2-D layers over a height of 1 ---------------------------------------

@register_layer("nn.Conv1d")
class Conv1d(_Geometry1d, Conv2d):
    """1-D convolution, as ``torch.nn.Conv1d``: x (N, C_in, L), weight (C_out, C_in / groups, k),
    bias (C_out,) -> y (N, C_out, Lo), Lo = floor((L + 2p - d * (k - 1) - 1) / s) + 1;
    padding 'same' / 'valid' and every padding_mode as in nn.Conv2d. It runs as nn.Conv2d on
    (N, C_in, 1, L) with a (1, k) kernel."""

    kernel_size = Param(convert=lifted(at_least(1, as_tuple(1)), 1))

    def check_params(self) -> None:
        if self.padding is None:
            # pnnx writes nn.Conv1d(padding='same', padding_mode='reflect') with an even
            # kernel as ``padding=()`` (read as None): the uneven pads of 'same' are lost
            self.padding = "same"
        super().check_params()

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        weight = weights.get("weight")
        if weight is not None:
            expect_shape("@weight", weight.shape, drop_height(self.weight_shape))
            weights = {**weights, "weight": lift(weight)}
        super().load_model(weights)

    def infer_shape(self, shape: Shape) -> Shape:
        return drop_height(super().infer_shape(lift_shape(shape)))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return drop_height(super().forward_one(lift(x)))


@register_layer("F.conv1d")
class FunctionalConv1d(_Geometry1d, FunctionalConv2d):
    """``F.conv1d(input, weight, bias)`` with the weight (and the bias, if any) as graph inputs:
    x (N, C_in, L), weight (C_out, C_in / groups, k)[, bias (C_out,)] -> (N, C_out, Lo)."""

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        lifted_shapes = [lift_shape(x), lift_shape(weight, "(C_out, C_in / groups, k) weight")]
        if bias is not None:
            lifted_shapes.append(bias)
        return [drop_height(super().infer_shapes(lifted_shapes)[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, weight, bias = split_weight_inputs(inputs)
        return [drop_height(self._conv(lift(x), lift(weight, "weight"), bias))]


# ----- transposed convolution -------------------------------------------------------------------

class _ConvTransposeGeometry(Layer):
    """The parameters nn.ConvTranspose2d and F.conv_transpose2d share, and their checks."""

    stride = Param(1, at_least(1, as_tuple(2)))
    padding = Param(0, at_least(0, as_tuple(2)))
    output_padding = Param(0, at_least(0, as_tuple(2)))
    dilation = Param(1, at_least(1, as_tuple(2)))
    groups = Param(1, at_least(1, as_int))

    def check_params(self) -> None:
        for extra, stride, dilation in zip(self.output_padding, self.stride, self.dilation):
            if extra >= max(stride, dilation):
                raise LayerError(f"output_padding {self.output_padding} must be smaller than "
                                 f"the stride {self.stride} or the dilation {self.dilation}")

    def _output_shape(self, x_shape: Shape, weight_shape: Shape) -> Shape:
        return conv_transpose2d_output_shape(x_shape, weight_shape, self.stride, self.padding,
                                             self.output_padding, self.groups, self.dilation)

    def _conv_transpose(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None
                        ) -> np.ndarray:
        return kernels.conv_transpose2d(x, weight, bias, self.stride, self.padding,
                                        self.output_padding, self.groups, self.dilation)


@register_layer("nn.ConvTranspose2d")
class ConvTranspose2d(FoldsAffine, _ConvTransposeGeometry):
    """2-D transposed convolution (the adjoint of nn.Conv2d: upsampling by the stride), as
    ``torch.nn.ConvTranspose2d``; kernels.conv_transpose2d has the maths.

    x (N, C_in, H, W), weight (C_in, C_out / groups, kh, kw), bias (C_out,) -> (N, C_out, Ho, Wo)
    Ho = (H - 1) * stride_h - 2 * padding_h + dilation_h * (kh - 1) + output_padding_h + 1.
    (A call with ``output_size=`` is written by pnnx as the output_padding it implies.)
    infer/fusion.py may fold an activation (and an affine map) after it.
    """

    in_channels = Param(convert=at_least(1, as_int))
    out_channels = Param(convert=at_least(1, as_int))
    kernel_size = Param(convert=at_least(1, as_tuple(2)))
    # the flag from the param line; load_model replaces it by the @bias array (or None)
    bias: Param[Any] = Param(True, as_bool)
    padding_mode = Param("zeros", as_str)
    WEIGHTS = ("weight",)
    OPTIONAL_WEIGHTS = ("bias",)
    weight: np.ndarray
    has_bias: bool

    def check_params(self) -> None:
        super().check_params()
        self.has_bias = self.bias
        if self.padding_mode != "zeros":
            raise LayerError(f"transposed convolutions pad with zeros only (as torch), got "
                             f"padding_mode={self.padding_mode!r}")
        for key in ("in_channels", "out_channels"):
            if getattr(self, key) % self.groups:
                raise LayerError(f"{key}={getattr(self, key)} is not divisible by "
                                 f"groups={self.groups}")

    @property
    def weight_shape(self) -> Shape:
        return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)

    def check_weights(self) -> None:
        check_bias_flag(self.has_bias, self.bias)
        expect_shape("@weight", self.weight.shape, self.weight_shape)
        if self.bias is not None:
            expect_shape("@bias", self.bias.shape, (self.out_channels,))

    def infer_shape(self, shape: Shape) -> Shape:
        return self._output_shape(shape, self.weight_shape)

    fused_into = "this transposed convolution"      # fused_activation: FusesActivation

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        y = self._conv_transpose(x, self.weight, self.bias)
        if self.fused_activation is not None:
            self.fused_activation.forward_inplace(y)
        return y


@register_layer("F.conv_transpose2d")
class FunctionalConvTranspose2d(_ConvTransposeGeometry):
    """``F.conv_transpose2d(input, weight, bias)`` with the weight (and the bias, if any) as
    graph inputs: x (N, C_in, H, W), weight (C_in, C_out / groups, kh, kw)[, bias (C_out,)].
    pnnx writes ``bias=None`` without a bias, and no bias parameter with one."""

    bias = Param(None, bias_is_an_input)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        out_shape = self._output_shape(x, weight)           # checks the weight against x
        if bias is not None:
            expect_shape("bias input", bias, (out_shape[1],), ShapeError)
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self._conv_transpose(*split_weight_inputs(inputs))]


class _TransposeGeometry1d(Layer):
    """Mixin of the 1-D transposed convolutions: their geometry read in 1-D, lifted to the 2-D
    form of a height-1 layer (it overrides the 2-D layer's)."""

    stride = Param(1, lifted(at_least(1, as_tuple(1)), 1))
    padding = Param(0, lifted(at_least(0, as_tuple(1)), 0))
    output_padding = Param(0, lifted(at_least(0, as_tuple(1)), 0))
    dilation = Param(1, lifted(at_least(1, as_tuple(1)), 1))


@register_layer("nn.ConvTranspose1d")
class ConvTranspose1d(_TransposeGeometry1d, ConvTranspose2d):
    """1-D transposed convolution, as ``torch.nn.ConvTranspose1d``: x (N, C_in, L), weight
    (C_in, C_out / groups, k) -> (N, C_out, (L - 1) * s - 2p + d * (k - 1) + output_padding + 1).
    It runs as nn.ConvTranspose2d on (N, C_in, 1, L) with a (1, k) kernel."""

    kernel_size = Param(convert=lifted(at_least(1, as_tuple(1)), 1))

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        weight = weights.get("weight")
        if weight is not None:
            expect_shape("@weight", weight.shape, drop_height(self.weight_shape))
            weights = {**weights, "weight": lift(weight)}
        super().load_model(weights)

    def infer_shape(self, shape: Shape) -> Shape:
        return drop_height(super().infer_shape(lift_shape(shape)))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return drop_height(super().forward_one(lift(x)))


@register_layer("F.conv_transpose1d")
class FunctionalConvTranspose1d(_TransposeGeometry1d, FunctionalConvTranspose2d):
    """``F.conv_transpose1d(input, weight, bias)`` with the weight (and the bias, if any) as
    graph inputs: x (N, C_in, L), weight (C_in, C_out / groups, k)[, bias (C_out,)]."""

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        lifted_shapes = [lift_shape(x), lift_shape(weight, "(C_in, C_out / groups, k) weight")]
        if bias is not None:
            lifted_shapes.append(bias)
        return [drop_height(super().infer_shapes(lifted_shapes)[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, weight, bias = split_weight_inputs(inputs)
        return [drop_height(self._conv_transpose(lift(x), lift(weight, "weight"), bias))]
