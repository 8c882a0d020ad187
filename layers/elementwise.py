"""Elementwise operators that pnnx keeps as operators of their own rather than folding into a
pnnx.Expression: comparisons, logical and bitwise operators, torch.where, masked_fill, type
casts (Tensor.to / Tensor.type_as), and the math functions pnnx's expression writer does not
know (it leaves them as ``aten::`` operators: erfc, exp2, log2, frac, hypot, lerp, addcmul,
...).

Arrays broadcast as in numpy (= torch). A second operand that is a number is written as a
parameter (``torch.gt ... other=0.5``), a tensor as an input (``$other=1``). Result dtypes
follow torch's type promotion (``layers.expression.result_dtype``): comparisons and logical
operators give bool; a float32 tensor next to a Python float stays float32.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from layers.base import (AN_INPUT, Layer, NamedArgumentLayer, Param, Shape, as_bool, as_float,
                         as_str, bind_inputs, optional, or_input)
from layers.expression import FLOAT, INT, TORCH_DTYPES, category, result_dtype, sign
from layers.kernels import erfc
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def broadcast(*shapes: Shape) -> Shape:
    """The shape the arrays broadcast to, or ShapeError naming them."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not "
                         f"broadcast") from None


def as_scalar(value: Any) -> bool | int | float:
    """A number written as a parameter (``other=0.5``, ``value=-inf``); bools are numbers too."""
    if not isinstance(value, (bool, int, float, np.number)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return value.item() if isinstance(value, np.number) else value


def _typed(values: Sequence[Any], dtype: np.dtype) -> list[np.ndarray]:
    return [np.asarray(v, dtype=dtype) for v in values]


# ----- unary: one tensor in, one out ------------------------------------------------------------

def _frac(x: np.ndarray) -> np.ndarray:
    """x - trunc(x), with x's sign."""
    fraction: np.ndarray = x - np.trunc(x)
    return fraction


# name -> (numpy function, kind): "float" computes in a float dtype (ints become float32),
# "bool" gives a bool result, "integer" accepts integer / bool tensors only, "keep" any dtype
UNARY: dict[str, tuple[Callable[..., Any], str]] = {
    "aten::erfc": (erfc, "float"),
    "aten::exp2": (np.exp2, "float"),
    "aten::log2": (np.log2, "float"),
    "aten::frac": (_frac, "float"),
    "aten::sgn": (sign, "keep"),
    "torch.positive": (np.positive, "keep"),
    "aten::isnan": (np.isnan, "bool"),
    "aten::isinf": (np.isinf, "bool"),
    "aten::isfinite": (np.isfinite, "bool"),
    "torch.logical_not": (np.logical_not, "bool"),
    "torch.bitwise_not": (np.invert, "integer"),
}


@register_layer(*UNARY)
class Unary(Layer):
    """y = f(x) for the functions in ``UNARY`` (erfc, exp2, log2, frac, isnan, ...), as torch
    computes them; integer inputs of the float functions become float32, as in torch."""

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        function, kind = UNARY[self.type]
        if kind == "float" and category(x.dtype) < FLOAT:
            x = x.astype(np.float32)
        if kind == "integer" and category(x.dtype) > INT:
            raise LayerError(f"{self.type} takes integer or bool tensors, got {x.dtype}")
        with np.errstate(all="ignore"):
            return np.asarray(function(x))


# ----- binary: input and other ------------------------------------------------------------------

def _xlogy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x * log(y), and 0 where x == 0 (even for y == 0); nan where y is nan."""
    result = x * np.log(y)
    return np.where((x == 0) & ~np.isnan(y), 0, result).astype(result.dtype)


# name -> (numpy function, kind): "compare" computes in the promoted dtype and gives bool,
# "logical" gives bool from any dtypes, "integer" takes integer / bool only, "float" computes
# in a float dtype
BINARY: dict[str, tuple[Callable[..., Any], str]] = {
    "torch.eq": (np.equal, "compare"), "torch.ne": (np.not_equal, "compare"),
    "torch.gt": (np.greater, "compare"), "torch.ge": (np.greater_equal, "compare"),
    "torch.lt": (np.less, "compare"), "torch.le": (np.less_equal, "compare"),
    "torch.logical_and": (np.logical_and, "logical"),
    "torch.logical_or": (np.logical_or, "logical"),
    "torch.logical_xor": (np.logical_xor, "logical"),
    "torch.bitwise_and": (np.bitwise_and, "integer"),
    "torch.bitwise_or": (np.bitwise_or, "integer"),
    "torch.bitwise_xor": (np.bitwise_xor, "integer"),
    "aten::hypot": (np.hypot, "float"), "aten::copysign": (np.copysign, "float"),
    "aten::fmax": (np.fmax, "keep"), "aten::fmin": (np.fmin, "keep"),
    "aten::xlogy": (_xlogy, "float"),
}


@register_layer(*BINARY)
class Binary(Layer):
    """y = f(input, other) elementwise with broadcasting, for the functions in ``BINARY``.
    ``other`` is a parameter when it is a number, else the second input."""

    other = Param(AN_INPUT, or_input(as_scalar))
    one_blob_only = False

    def check_params(self) -> None:
        if self.other is None:
            raise LayerError("other must be a number or an input, got None")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        other = bind_inputs(self, ("other",), input_shapes)["other"]
        shapes = [input_shapes[0]] + ([other] if self.other is AN_INPUT else [])
        return [broadcast(*shapes)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        x, other = inputs[0], bind_inputs(self, ("other",), inputs)["other"]
        function, kind = BINARY[self.type]
        dtype = result_dtype([x, other])
        if kind == "integer" and category(dtype) > INT:
            raise LayerError(f"{self.type} takes integer or bool tensors, got {dtype}")
        if kind == "float" and category(dtype) < FLOAT:
            dtype = np.dtype(np.float32)
        operands = [x, other] if kind == "logical" else _typed([x, other], dtype)
        with np.errstate(all="ignore"):
            y = np.asarray(function(*operands))
        return [y if kind in ("compare", "logical") else y.astype(dtype, copy=False)]


# ----- three operands ---------------------------------------------------------------------------

@register_layer("torch.where")
class Where(Layer):
    """y = input where condition else other (broadcast together). ``input`` and ``other`` are
    parameters when they are numbers (``input=1.0``), else inputs after the condition; the
    result has their promoted dtype."""

    input = Param(AN_INPUT, or_input(as_scalar))
    other = Param(AN_INPUT, or_input(as_scalar))
    one_blob_only = False

    def _arguments(self, inputs: Sequence[Any]) -> tuple[Any, Any, Any]:
        bound = bind_inputs(self, ("input", "other"), inputs)
        return inputs[0], bound["input"], bound["other"]

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        condition, *values = self._arguments(input_shapes)
        return [broadcast(condition, *(v for v in values if isinstance(v, tuple)))]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        condition, a, b = self._arguments(inputs)
        self.infer_shapes([np.shape(x) for x in inputs])
        if condition.dtype != np.bool_:
            raise LayerError(f"the condition must be a bool tensor, got {condition.dtype}")
        # two numbers make tensors of torch's default dtypes (float32, int64): a bool array
        # among the operands gives exactly that, and changes nothing otherwise
        dtype = result_dtype([np.zeros(1, np.bool_), a, b])
        return [np.where(condition, *_typed([a, b], dtype))]


@register_layer("Tensor.masked_fill")
class MaskedFill(Layer):
    """y = value where mask else input; the mask broadcasts to the input's shape, ``value`` is
    a number parameter (or a 0-d tensor input, after the mask)."""

    value = Param(AN_INPUT, or_input(as_scalar))
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        value = self._value(input_shapes)
        shape = tuple(input_shapes[0])
        if broadcast(shape, input_shapes[1]) != shape:
            raise ShapeError(f"the mask {tuple(input_shapes[1])} does not broadcast to the "
                             f"input {shape}")
        if self.value is AN_INPUT and len(value) != 0:
            raise ShapeError(f"the value must be a 0-d tensor, got shape {tuple(value)}")
        return [shape]

    def _value(self, inputs: Sequence[Any]) -> Any:
        if len(inputs) < 2:
            raise ShapeError(f"expects the input and the mask, got {len(inputs)} input(s)")
        return bind_inputs(self, ("value",), [inputs[0], *inputs[2:]])["value"]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        x, mask = inputs[0], inputs[1]
        if mask.dtype != np.bool_:
            raise LayerError(f"the mask must be a bool tensor, got {mask.dtype}")
        value = np.asarray(self._value(inputs)).astype(x.dtype)
        return [np.where(mask, value, x)]


@register_layer("aten::lerp")
class Lerp(Layer):
    """torch.lerp(input, end, weight) = input + weight * (end - input), all broadcast; the
    weight is a tensor or a 0-d constant (pnnx writes a number weight as a pnnx.Expression)."""

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 3:
            raise ShapeError(f"expects 3 inputs (input, end, weight), got {len(input_shapes)}")
        return [broadcast(*input_shapes)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        start, end, weight = inputs
        dtype = result_dtype([start, end])
        start, end = _typed([start, end], dtype)
        return [(start + weight.astype(dtype) * (end - start)).astype(dtype, copy=False)]


@register_layer("aten::addcmul")
class AddCMul(Layer):
    """torch.addcmul(input, tensor1, tensor2, value=1) = input + value * tensor1 * tensor2,
    all broadcast (ConvNeXt-V2's GlobalResponseNorm uses it); pnnx writes the value as a 4th
    input, a 0-d pnnx.Expression constant."""

    one_blob_only = False
    divide = False                       # AddCDiv: tensor1 / tensor2

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) not in (3, 4):
            raise ShapeError(f"expects 3 or 4 inputs (input, tensor1, tensor2[, value]), got "
                             f"{len(input_shapes)}")
        if len(input_shapes) == 4 and tuple(input_shapes[3]) not in ((), (1,)):
            raise ShapeError(f"the value must be a number, got shape {tuple(input_shapes[3])}")
        return [broadcast(*input_shapes[:3])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        dtype = result_dtype(list(inputs[:3]))
        if self.divide and dtype.kind not in "fc":
            raise LayerError("addcdiv of integer tensors is refused, as torch refuses it")
        x, t1, t2 = _typed(inputs[:3], dtype)
        value = np.asarray(inputs[3] if len(inputs) == 4 else 1).astype(dtype).reshape(())
        scaled = value * t1                                     # torch: (value * t1) op t2
        y = x + (scaled / t2 if self.divide else scaled * t2)
        return [y.astype(dtype, copy=False)]


@register_layer("aten::addcdiv")
class AddCDiv(AddCMul):
    """torch.addcdiv(input, tensor1, tensor2, value=1) = input + value * tensor1 / tensor2."""

    divide = True


# ----- casts ------------------------------------------------------------------------------------

def as_torch_dtype(value: Any) -> np.dtype:
    """``torch.float`` -> float32 and so on (``TORCH_DTYPES``)."""
    name = as_str(value)
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(TORCH_DTYPES))}")
    return TORCH_DTYPES[name]


@register_layer("Tensor.to")
class To(Layer):
    """y = x.to(dtype): a cast (float -> int truncates toward zero, as torch does); ``copy``
    makes no difference here, the output is always a new array."""

    dtype = Param(convert=as_torch_dtype)
    copy = Param(False, as_bool)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return x.astype(self.dtype)                   # always a copy


@register_layer("Tensor.type_as")
class TypeAs(Layer):
    """y = input.type_as(other) = input cast to other's dtype (other's values are not read)."""

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, other), got {len(input_shapes)}")
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        with np.errstate(invalid="ignore"):
            return [inputs[0].astype(inputs[1].dtype)]


@register_layer("aten::nan_to_num")
class NanToNum(NamedArgumentLayer):
    """torch.nan_to_num(x, nan, posinf, neginf): NaN -> ``nan`` (0 by default), +inf ->
    ``posinf``, -inf -> ``neginf`` (by default the largest and smallest values of x's
    dtype); other values and integer tensors are unchanged."""

    INPUTS = ("input", "nan", "posinf", "neginf")
    nan = Param(0.0, optional(as_float))
    posinf = Param(None, optional(as_float))
    neginf = Param(None, optional(as_float))

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        if x.dtype.kind != "f":
            return [x.copy()]
        nan = self.argument("nan", inputs)
        return [np.nan_to_num(x, nan=0.0 if nan is None else nan,
                              posinf=self.argument("posinf", inputs),
                              neginf=self.argument("neginf", inputs))]
