"""Activation layers. The elementwise ones work in place (ncnn's ``support_inplace``): each
implements ``forward_inplace(x)`` with numpy ``out=`` arguments, and the base class makes the
out-of-place ``forward`` from it (copy, then in place). Softmax / LogSoftmax are not
elementwise; PReLU and torch.clamp may take tensors as further inputs.

pnnx writes an activation module as ``nn.X`` and the functional form as ``F.x``; torch.sigmoid
and torch.tanh come out as F.sigmoid and F.tanh, F.prelu with a constant weight as nn.PReLU
(nn.LeakyReLU for a single weight), Tensor.clamp / torch.clip as torch.clamp, and
Tensor.clamp_min / clamp_max as aten::clamp_min / aten::clamp_max with the bound as an input.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import (AN_INPUT, Layer, Param, Shape, as_float, as_int, as_str, at_least,
                         bind_inputs, expect_shape, normalize_dim, or_input)
from layers.elementwise import broadcast
from layers.expression import result_dtype
from layers.kernels import erf
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


class _Elementwise(Layer):
    """One input, one output of the same shape, computed in place (or into a given array)."""

    support_inplace = True
    support_forward_into = True


@register_layer("nn.ReLU", "F.relu", "torch.relu")
class ReLU(_Elementwise):
    """y = max(x, 0)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        np.maximum(x, 0, out=x)


@register_layer("nn.Hardtanh", "F.hardtanh")
class Hardtanh(_Elementwise):
    """y = clip(x, min_val, max_val)"""

    min_val = Param(-1.0, as_float)
    max_val = Param(1.0, as_float)

    def check_params(self) -> None:
        if self.min_val > self.max_val:
            raise LayerError(f"min_val={self.min_val} is greater than max_val={self.max_val}")

    def forward_inplace(self, x: np.ndarray) -> None:
        np.clip(x, self.min_val, self.max_val, out=x)


@register_layer("nn.ReLU6", "F.relu6")
class ReLU6(Hardtanh):
    """y = min(max(x, 0), 6), i.e. Hardtanh with min_val=0, max_val=6"""

    min_val, max_val = 0.0, 6.0                     # constants, not parameters


@register_layer("nn.LeakyReLU", "F.leaky_relu")
class LeakyReLU(_Elementwise):
    """y = x if x > 0 else negative_slope * x (torch's rule: zeros and NaN take the product,
    which matters for the sign of zero with a negative slope)"""

    negative_slope = Param(0.01, as_float)

    def forward_inplace(self, x: np.ndarray) -> None:
        np.multiply(x, np.float32(self.negative_slope), out=x, where=~(x > 0))


@register_layer("nn.Sigmoid", "F.sigmoid", "torch.sigmoid")
class Sigmoid(_Elementwise):
    """y = 1 / (1 + exp(-x))"""

    def forward_inplace(self, x: np.ndarray) -> None:
        sigmoid_inplace(x)


def sigmoid_inplace(x: np.ndarray) -> None:
    """x <- 1 / (1 + exp(-x)). For x < -88 exp(-x) overflows float32 to inf, and 1 / inf = 0 is
    the right answer, so the overflow warning is silenced."""
    with np.errstate(over="ignore"):
        np.negative(x, out=x)
        np.exp(x, out=x)
        x += 1
        np.reciprocal(x, out=x)


@register_layer("nn.SiLU", "F.silu")
class SiLU(_Elementwise):
    """y = x * sigmoid(x)   (also called swish)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        s = x.copy()
        sigmoid_inplace(s)
        x *= s


@register_layer("nn.Hardsigmoid", "F.hardsigmoid")
class Hardsigmoid(_Elementwise):
    """y = relu6(x + 3) / 6   (0 below -3, 1 above 3, linear in between)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        hardsigmoid_inplace(x)


def hardsigmoid_inplace(x: np.ndarray) -> None:
    x += 3
    np.clip(x, 0, 6, out=x)
    x /= 6


@register_layer("nn.Hardswish", "F.hardswish")
class Hardswish(_Elementwise):
    """y = x * relu6(x + 3) / 6 = x * hardsigmoid(x)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        gate = x.copy()
        hardsigmoid_inplace(gate)
        x *= gate


@register_layer("nn.Tanh", "F.tanh", "torch.tanh")
class Tanh(_Elementwise):
    """y = tanh(x)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        np.tanh(x, out=x)


class ScaleShift(_Elementwise):
    """y = scale * f(x) + shift: an elementwise in-place layer f (None: f(x) = x), then the
    expression after it that infer/fusion.py folds in (``add(mul(a,@0),b)``:
    layers/expression.py's affine_form), rounded as torch rounds the expression, a multiply
    then an add. No pnnx operator type: it exists only as a convolution's fused activation."""

    def __init__(self, inner: Layer | None, scale: float, shift: float):
        super().__init__()
        self.inner, self.scale, self.shift = inner, scale, shift

    def forward_inplace(self, x: np.ndarray) -> None:
        if self.inner is not None:
            self.inner.forward_inplace(x)
        np.multiply(x, self.scale, out=x)
        np.add(x, self.shift, out=x)

    def __repr__(self) -> str:
        return f"ScaleShift({self.inner!r}, scale={self.scale!r}, shift={self.shift!r})"


@register_layer("nn.ELU", "F.elu")
class ELU(_Elementwise):
    """y = x if x > 0 else alpha * (exp(x) - 1)"""

    alpha = Param(1.0, as_float)

    def forward_inplace(self, x: np.ndarray) -> None:
        elu_inplace(x, self.alpha)


def elu_inplace(x: np.ndarray, alpha: float, input_scale: float = 1.0) -> None:
    """x <- x if x > 0 else alpha * expm1(x * input_scale) (expm1 keeps small x exact)."""
    negative = np.minimum(x, 0) * x.dtype.type(input_scale)
    np.expm1(negative, out=negative)
    negative *= x.dtype.type(alpha)
    np.copyto(x, negative, where=x <= 0)


@register_layer("nn.SELU", "F.selu")
class SELU(_Elementwise):
    """y = scale * (x if x > 0 else alpha * (exp(x) - 1)), with the fixed alpha and scale of
    Klambauer et al. (2017) that keep activations at zero mean and unit variance."""

    ALPHA = 1.6732632423543772848170429916717
    SCALE = 1.0507009873554804934193349852946

    def forward_inplace(self, x: np.ndarray) -> None:
        elu_inplace(x, self.ALPHA)
        x *= x.dtype.type(self.SCALE)


@register_layer("nn.CELU", "F.celu")
class CELU(_Elementwise):
    """y = x if x > 0 else alpha * (exp(x / alpha) - 1)"""

    alpha = Param(1.0, as_float)

    def check_params(self) -> None:
        if self.alpha == 0:
            raise LayerError("alpha must not be 0")

    def forward_inplace(self, x: np.ndarray) -> None:
        elu_inplace(x, self.alpha, 1.0 / self.alpha)


@register_layer("nn.GELU", "F.gelu")
class GELU(_Elementwise):
    """Gaussian error linear unit, y = x * Phi(x) with Phi the standard normal CDF:

        approximate='none':  y = x / 2 * (1 + erf(x / sqrt(2)))
        approximate='tanh':  y = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    """

    approximate = Param("none", as_str)

    def check_params(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise LayerError(f"approximate must be 'none' or 'tanh', got {self.approximate!r}")

    def forward_inplace(self, x: np.ndarray) -> None:
        t = x.dtype.type
        if self.approximate == "tanh":
            inner = x * x
            inner *= t(0.044715)
            inner += 1
            inner *= x
            inner *= t(math.sqrt(2 / math.pi))          # sqrt(2/pi) * (x + 0.044715 x^3)
            np.tanh(inner, out=inner)
        else:
            inner = x * t(1 / math.sqrt(2))
            erf(inner, out=inner)
        inner += 1
        inner *= t(0.5)
        x *= inner


def softplus(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's switch
    to the linear part). log1p(exp(-|z|)) + max(z, 0) is the same value without overflow."""
    z = x * x.dtype.type(beta)
    y = np.negative(np.abs(z))
    np.exp(y, out=y)
    np.log1p(y, out=y)
    y += np.maximum(z, 0)
    if beta != 1:
        y /= x.dtype.type(beta)
    np.copyto(y, x, where=z > threshold)
    return y


@register_layer("nn.Softplus", "F.softplus")
class Softplus(_Elementwise):
    """y = log(1 + exp(beta * x)) / beta; y = x where beta * x > threshold."""

    beta = Param(1.0, as_float)
    threshold = Param(20.0, as_float)

    def check_params(self) -> None:
        if self.beta == 0:
            raise LayerError("beta must not be 0")

    def forward_inplace(self, x: np.ndarray) -> None:
        x[...] = softplus(x, self.beta, self.threshold)


@register_layer("nn.Mish", "F.mish")
class Mish(_Elementwise):
    """y = x * tanh(softplus(x))"""

    def forward_inplace(self, x: np.ndarray) -> None:
        gate = softplus(x)
        np.tanh(gate, out=gate)
        x *= gate


@register_layer("nn.Softsign", "F.softsign")
class Softsign(_Elementwise):
    """y = x / (1 + |x|)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        denominator = np.abs(x)
        denominator += 1
        x /= denominator


@register_layer("nn.LogSigmoid", "F.logsigmoid")
class LogSigmoid(_Elementwise):
    """y = log(sigmoid(x)) = -softplus(-x) = min(x, 0) - log(1 + exp(-|x|)), which neither
    overflows nor loses the small values for large |x|."""

    def forward_inplace(self, x: np.ndarray) -> None:
        tail = np.negative(np.abs(x))
        np.exp(tail, out=tail)
        np.log1p(tail, out=tail)
        np.minimum(x, 0, out=x)
        x -= tail


@register_layer("nn.Threshold", "F.threshold")
class Threshold(_Elementwise):
    """y = value if x <= threshold else x   (NaN stays NaN, as in torch)"""

    threshold = Param(convert=as_float)
    value = Param(convert=as_float)

    def forward_inplace(self, x: np.ndarray) -> None:
        np.copyto(x, np.float32(self.value), where=x <= self.threshold)


@register_layer("nn.Hardshrink", "F.hardshrink")
class Hardshrink(_Elementwise):
    """y = x if |x| > lambd else 0"""

    lambd = Param(0.5, as_float)

    def forward_inplace(self, x: np.ndarray) -> None:
        np.copyto(x, 0, where=np.abs(x) <= self.lambd)


@register_layer("nn.Softshrink", "F.softshrink")
class Softshrink(_Elementwise):
    """y = x - lambd if x > lambd, x + lambd if x < -lambd, else 0"""

    lambd = Param(0.5, as_float)

    def check_params(self) -> None:
        if self.lambd < 0:
            raise LayerError(f"lambd must be >= 0, got {self.lambd}")

    def forward_inplace(self, x: np.ndarray) -> None:
        shrunk = np.abs(x)
        shrunk -= np.float32(self.lambd)
        np.maximum(shrunk, 0, out=shrunk)             # max(|x| - lambd, 0), NaN kept
        np.copysign(shrunk, x, out=x)


@register_layer("nn.Tanhshrink", "F.tanhshrink")
class Tanhshrink(_Elementwise):
    """y = x - tanh(x)"""

    def forward_inplace(self, x: np.ndarray) -> None:
        x -= np.tanh(x)


@register_layer("nn.RReLU", "F.rrelu")
class RReLU(_Elementwise):
    """At inference (eval mode, training=False) RReLU is a leaky ReLU with the mean slope:
    y = x if x > 0 else x * (lower + upper) / 2 (torch's rule for zeros and NaN)"""

    lower = Param(1.0 / 8, as_float)
    upper = Param(1.0 / 3, as_float)

    def forward_inplace(self, x: np.ndarray) -> None:
        slope = np.float32((self.lower + self.upper) / 2)
        np.multiply(x, slope, out=x, where=~(x > 0))


@register_layer("nn.PReLU", "F.prelu")
class PReLU(Layer):
    """y = x if x > 0 else weight[c] * x, with c the channel (dim 1) of x (torch's rule: zeros
    and NaN take the product); a single weight applies to every element. An input of rank
    < 2 has one channel.

    ``nn.PReLU`` carries its weight (``num_parameters`` values) in the bin file; ``F.prelu``
    takes it as a second input.
    """

    num_parameters = Param(None, at_least(1, as_int))
    OPTIONAL_WEIGHTS = ("weight",)
    one_blob_only = False

    def check_weights(self) -> None:
        if (self.num_parameters is None) != (self.weight is None):
            raise LayerError("nn.PReLU needs num_parameters and its @weight; F.prelu neither "
                             "(its weight is an input)")
        if self.weight is not None:
            expect_shape("@weight", self.weight.shape, (self.num_parameters,))

    def _split(self, inputs: Sequence) -> tuple:
        expected = 1 if self.weight is not None else 2
        if len(inputs) != expected:
            raise ShapeError(f"expects {expected} input(s), got {len(inputs)}")
        return inputs[0], (self.weight if self.weight is not None else inputs[1])

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        shape, weight = self._split(input_shapes)
        count = int(np.prod(weight.shape if isinstance(weight, np.ndarray) else weight))
        channels = shape[1] if len(shape) >= 2 else 1
        if count not in (1, channels):
            raise ShapeError(f"{count} weights for an input {tuple(shape)} with {channels} "
                             f"channel(s); expected 1 or {channels}")
        return [tuple(shape)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        x, weight = self._split(inputs)
        weight = np.asarray(weight, dtype=x.dtype).reshape(-1)
        if weight.size > 1:
            weight = weight.reshape((-1,) + (1,) * (x.ndim - 2))        # (C, 1, 1) for NCHW
        return [np.where(x > 0, x, x * weight).astype(x.dtype, copy=False)]


def as_number(value) -> int | float:
    """A bound as written: an int stays an int (clamping an int tensor by 2 keeps it int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"expected a number or None, got {type(value).__name__}")
    return value.item() if isinstance(value, np.number) else value


@register_layer("torch.clamp")
class Clamp(Layer):
    """y = min(max(x, min), max). pnnx writes a number bound as a parameter (``min=0.5``), an
    absent one as ``None``, and a tensor bound as an input (``$min``, ``$max``, broadcast
    against x). Both None is an error, as in torch; min > max gives max everywhere, as in
    torch. The result has torch's promoted dtype (an int tensor clamped by 0.5 is float32)."""

    min = Param(AN_INPUT, or_input(as_number))
    max = Param(AN_INPUT, or_input(as_number))
    one_blob_only = False

    def check_params(self) -> None:
        if self.min is None and self.max is None:
            raise LayerError("torch.clamp needs min or max (both are None)")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        bounds = bind_inputs(self, ("min", "max"), input_shapes)
        shapes = [input_shapes[0]] + [b for b in bounds.values() if isinstance(b, tuple)]
        shape = broadcast(*shapes)
        if shape != tuple(input_shapes[0]):
            raise ShapeError(f"the bounds {shapes[1:]} broadcast the input "
                             f"{tuple(input_shapes[0])} to {shape}")
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        bounds = bind_inputs(self, ("min", "max"), inputs)
        return [clamp(inputs[0], bounds["min"], bounds["max"])]


def clamp(x: np.ndarray, low, high) -> np.ndarray:
    """torch.clamp(x, low, high): max(x, low) then min(., high); None skips a bound."""
    dtype = result_dtype([x] + [b for b in (low, high) if b is not None])
    y = x.astype(dtype)                                   # a copy: never the input itself
    if low is not None:
        np.maximum(y, np.asarray(low, dtype=dtype), out=y)
    if high is not None:
        np.minimum(y, np.asarray(high, dtype=dtype), out=y)
    return y


@register_layer("aten::clamp_min", "aten::clamp_max")
class ClampBound(Layer):
    """Tensor.clamp_min(x, bound) = max(x, bound) and Tensor.clamp_max(x, bound) = min(x,
    bound); pnnx writes the bound as a second input (a 0-d constant from a pnnx.Expression,
    or a tensor)."""

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, bound), got {len(input_shapes)}")
        if broadcast(*input_shapes) != tuple(input_shapes[0]):
            raise ShapeError(f"the bound {tuple(input_shapes[1])} does not broadcast to the "
                             f"input {tuple(input_shapes[0])}")
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x, bound = inputs
        if self.type == "aten::clamp_max":
            return [clamp(x, None, bound)]
        return [clamp(x, bound, None)]


@register_layer("nn.Softmax", "F.softmax", "torch.softmax")
class Softmax(Layer):
    """y = exp(x) / sum(exp(x)) along ``dim`` (negative dims count from the end).

    ``dim=None`` is torch's legacy implicit choice: dim 0 for 0-, 1- or 3-D inputs, else 1.
    """

    dim = Param(None, as_int)

    def _dim(self, rank: int) -> int:
        if self.dim is None:
            return 0 if rank in (0, 1, 3) else 1
        return normalize_dim(self.dim, rank)

    def infer_shape(self, shape: Shape) -> Shape:
        self._dim(len(shape))                        # ShapeError if dim is out of range
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if x.ndim == 0:                              # torch: softmax of one value is 1
            return kernels.softmax(x.reshape(1), 0).reshape(())
        return kernels.softmax(x, self._dim(x.ndim))


@register_layer("nn.LogSoftmax", "F.log_softmax", "torch.log_softmax")
class LogSoftmax(Softmax):
    """y = x - log(sum(exp(x))) along ``dim`` = log(softmax(x)), computed as
    (x - max) - log(sum(exp(x - max))) so that nothing overflows."""

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        dim = self._dim(x.ndim)
        y = x - x.max(axis=dim, keepdims=True)
        y -= np.log(np.exp(y).sum(axis=dim, keepdims=True))
        return y


@register_layer("nn.Softmin", "F.softmin")
class Softmin(Softmax):
    """y = softmax(-x) along ``dim`` = exp(-x) / sum(exp(-x))."""

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return super().forward_one(np.negative(x))


@register_layer("nn.GLU", "F.glu")
class GLU(Layer):
    """Gated linear unit: x split in two halves a, b along ``dim`` (its size must be even);
    y = a * sigmoid(b), half the size of x along ``dim``."""

    dim = Param(-1, as_int)

    def infer_shape(self, shape: Shape) -> Shape:
        axis = normalize_dim(self.dim, len(shape))
        if len(shape) == 0 or shape[axis] % 2:
            raise ShapeError(f"GLU halves dim {self.dim}: its size must be even, input "
                             f"shape {tuple(shape)}")
        return shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:]

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        a, b = np.split(x, 2, axis=normalize_dim(self.dim, x.ndim))
        gate = np.array(b)                                # (..., size / 2, ...)
        sigmoid_inplace(gate)
        return a * gate
