"""Activation layers. The elementwise ones work in place (ncnn's ``support_inplace``): each
implements ``forward_inplace(x)`` with numpy ``out=`` arguments, and the base class makes the
out-of-place ``forward`` from it (copy, then in place). Softmax is not elementwise."""

from __future__ import annotations

import numpy as np

from layers import kernels
from layers.base import Layer, Param, Shape, as_float, as_int, normalize_dim
from layers.registry import register_layer
from parser.errors import LayerError


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

    PARAMS = {"min_val": Param(-1.0, as_float), "max_val": Param(1.0, as_float)}

    def check_params(self) -> None:
        if self.min_val > self.max_val:
            raise LayerError(f"min_val={self.min_val} is greater than max_val={self.max_val}")

    def forward_inplace(self, x: np.ndarray) -> None:
        np.clip(x, self.min_val, self.max_val, out=x)


@register_layer("nn.ReLU6", "F.relu6")
class ReLU6(Hardtanh):
    """y = min(max(x, 0), 6), i.e. Hardtanh with min_val=0, max_val=6"""

    PARAMS = {}
    min_val, max_val = 0.0, 6.0


@register_layer("nn.LeakyReLU", "F.leaky_relu")
class LeakyReLU(_Elementwise):
    """y = x if x >= 0 else negative_slope * x"""

    PARAMS = {"negative_slope": Param(0.01, as_float)}

    def forward_inplace(self, x: np.ndarray) -> None:
        np.multiply(x, np.float32(self.negative_slope), out=x, where=x < 0)


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


@register_layer("nn.Softmax", "F.softmax", "torch.softmax")
class Softmax(Layer):
    """y = exp(x) / sum(exp(x)) along ``dim`` (negative dims count from the end).

    ``dim=None`` is torch's legacy implicit choice: dim 0 for 0-, 1- or 3-D inputs, else 1.
    """

    PARAMS = {"dim": Param(None, as_int)}

    def _dim(self, rank: int) -> int:
        if self.dim is None:
            return 0 if rank in (0, 1, 3) else 1
        return normalize_dim(self.dim, rank)

    def infer_shape(self, shape: Shape) -> Shape:
        self._dim(len(shape))                        # ShapeError if dim is out of range
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return kernels.softmax(x, self._dim(x.ndim))
