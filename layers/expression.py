"""pnnx.Expression: a fused elementwise formula, evaluated with numpy exactly as torch would.

    pnnx.Expression  pnnx_expr_0  2 1 0 1 2 expr=add(@0,mul(@1,2.0))    # y = x0 + x1 * 2.0

The text is parsed once, when the layer is configured (parser.expression), so a bad expression
fails at build time. ``forward`` then runs the syntax tree as a stack machine in reverse-Polish
order (KuiperInfer style): operands and constants are pushed, each function pops its arguments
and pushes its result. ``evaluate(tree, inputs)`` does that on its own, for a notebook.

What the values are, following torch:

- ``@N`` is the N-th input array; numbers in the text are Python numbers; ``size(@N,d)`` is a
  Python int (``d`` may be negative); ``size(@N)`` and a list ``[a,b,...]`` are 1-D int64 arrays
  (a list holds shape values; one holding a float, such as the scale factors pnnx writes
  for an antialiased resize, is a float64 array).
- Arrays broadcast as in numpy (= torch). The result dtype is torch's type promotion
  (``result_dtype``): a Python number never widens an array of its own kind (float32 * 2.0 stays
  float32), an int array meets a Python float as float32 (torch's default dtype, where numpy
  would give float64), and int64 + float32 arrays give float32.
- div is true division (ints give float32); floor_divide rounds down; remainder takes the sign
  of the divisor and fmod the sign of the dividend; round is round-half-to-even; rsqrt(x) is
  1/sqrt(x); logaddexp(a,b) = log(exp(a) + exp(b)); max/min of two values are elementwise.
- Functions that only make sense on real numbers (sqrt, exp, div, ...) turn integer inputs into
  float32 first, as torch does. and/or/xor/lshift/rshift take only integer or bool inputs.
- int() truncates a single value to a Python int; torch.float / torch.long / torch.bool / ...
  cast to float32 / int64 / bool / ... (``TORCH_DTYPES``). ``None`` (an absent optional
  argument, e.g. the dtype of ``aten::prod``) evaluates to None, and leaves the layer as a 0-d
  object array holding None; it is no operand of any function.
- erf is exact (scipy.special.erf: layers/kernels.py), as torch's.
- NaN and inf come out silently, as in torch (numpy's warnings are switched off).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

from layers.base import Layer, Param, Shape, as_str, normalize_dim
from layers.kernels import erf
from layers.registry import register_layer
from parser.errors import ExpressionError, ShapeError
from parser.expression import (ARITY, CAST_FUNCTIONS, Call, Constant, ListExpr, Node, OperandRef,
                               children, parse_expression, postorder)

Value = np.ndarray | np.generic | bool | int | float | complex  # what a node evaluates to

# ----- torch's type promotion -------------------------------------------------------------------

BOOL, INT, FLOAT, COMPLEX = range(4)  # dtype categories, in promotion order
_CATEGORY = {"b": BOOL, "i": INT, "u": INT, "f": FLOAT, "c": COMPLEX}
# The dtype a Python number gets next to arrays (torch's defaults), and among Python numbers only.
_TENSOR_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float32),
                  complex: np.dtype(np.complex64)}
_PYTHON_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}


def category(dtype) -> int:
    """BOOL < INT < FLOAT < COMPLEX."""
    return _CATEGORY[np.dtype(dtype).kind]


def promote_types(a, b) -> np.dtype:
    """torch.promote_types: the wider type within a category, else the higher category's type
    (int64 + float32 -> float32, where numpy says float64; complex64 + float64 -> complex128)."""
    a, b = np.dtype(a), np.dtype(b)
    if category(a) == category(b):
        return np.result_type(a, b)
    high, low = (a, b) if category(a) > category(b) else (b, a)
    if category(high) == COMPLEX and category(low) == FLOAT:
        return np.result_type(high, low)
    return high


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """Merge the dtype of a stronger group of operands with a weaker group's (torch's
    combine_categories): the weaker group only matters if its category is higher."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if category(higher) == COMPLEX:
        return higher
    if category(lower) == COMPLEX:
        return promote_types(higher, np.complex64) if category(higher) == FLOAT else lower
    if category(higher) == FLOAT:
        return higher
    if category(higher) == BOOL or category(lower) == FLOAT:
        return promote_types(higher, lower)
    return higher


def is_python_number(value) -> bool:
    """A plain Python bool/int/float/complex (not a numpy scalar, even np.float64)."""
    return type(value) in _PYTHON_DTYPES


def result_dtype(values: Sequence[Value]) -> np.dtype:
    """torch.result_type: operands rank in three groups, arrays with dims, then 0-d arrays, then
    Python numbers; each group is promoted on its own, then a weaker group only changes the
    result when its category is higher (so float32_array * 2.0 stays float32)."""
    if all(is_python_number(v) for v in values):
        return functools.reduce(promote_types, (_PYTHON_DTYPES[type(v)] for v in values))
    groups: list[list[np.dtype]] = [[], [], []]
    for value in values:
        if is_python_number(value):
            groups[2].append(_TENSOR_DTYPES[type(value)])
        else:
            groups[0 if np.ndim(value) else 1].append(value.dtype)
    dims, zero_dim, numbers = (functools.reduce(promote_types, g) if g else None for g in groups)
    return _combine(dims, _combine(zero_dim, numbers))


# torch's dtype names (Tensor.to's ``dtype=`` parameter, the torch.<dtype>() casts of an
# expression) -> numpy dtypes
TORCH_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype) for name, dtype in {
        "torch.float": np.float32, "torch.float32": np.float32, "torch.double": np.float64,
        "torch.float64": np.float64, "torch.half": np.float16, "torch.float16": np.float16,
        "torch.int": np.int32, "torch.int32": np.int32, "torch.long": np.int64,
        "torch.int64": np.int64, "torch.short": np.int16, "torch.int16": np.int16,
        "torch.int8": np.int8, "torch.uint8": np.uint8, "torch.bool": np.bool_,
        "torch.complex64": np.complex64, "torch.complex128": np.complex128,
        "torch.cfloat": np.complex64, "torch.cdouble": np.complex128,
    }.items()}


# ----- the functions ----------------------------------------------------------------------------

def sign(x: np.ndarray) -> np.ndarray:
    """sign(x) = -1, 0 or 1; torch gives 0 for nan where numpy gives nan."""
    y = np.array(np.sign(x))                  # an array even for a 0-d x
    if category(y.dtype) >= FLOAT:
        y[np.isnan(y)] = 0
    return y


def _rsqrt(x: np.ndarray) -> np.ndarray:
    """rsqrt(x) = 1 / sqrt(x)."""
    return np.reciprocal(np.sqrt(x))


def _rounding(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """floor/ceil/round/trunc leave integers alone (torch does; numpy would return floats)."""

    def apply(x: np.ndarray) -> np.ndarray:
        return x if category(x.dtype) < FLOAT else function(x)

    return apply


KEEP, TO_FLOAT, INTEGER = "keep", "float", "integer"
# name -> (numpy function, how inputs are typed):
#   KEEP      computed in the promoted dtype (int stays int)
#   TO_FLOAT  integer/bool inputs become float32 first (float64 if all are Python numbers)
#   INTEGER   integer or bool inputs only
ELEMENTWISE: dict[str, tuple[Callable, str]] = {
    "abs": (np.abs, KEEP), "neg": (np.negative, KEEP), "sign": (sign, KEEP),
    "square": (np.square, KEEP),
    "ceil": (_rounding(np.ceil), KEEP), "floor": (_rounding(np.floor), KEEP),
    "round": (_rounding(np.round), KEEP), "trunc": (_rounding(np.trunc), KEEP),
    "acos": (np.arccos, TO_FLOAT), "acosh": (np.arccosh, TO_FLOAT),
    "asin": (np.arcsin, TO_FLOAT), "asinh": (np.arcsinh, TO_FLOAT),
    "atan": (np.arctan, TO_FLOAT), "atanh": (np.arctanh, TO_FLOAT),
    "cos": (np.cos, TO_FLOAT), "cosh": (np.cosh, TO_FLOAT), "erf": (erf, TO_FLOAT),
    "exp": (np.exp, TO_FLOAT), "expm1": (np.expm1, TO_FLOAT), "log": (np.log, TO_FLOAT),
    "log10": (np.log10, TO_FLOAT), "log1p": (np.log1p, TO_FLOAT),
    "reciprocal": (np.reciprocal, TO_FLOAT), "rsqrt": (_rsqrt, TO_FLOAT),
    "sin": (np.sin, TO_FLOAT), "sinh": (np.sinh, TO_FLOAT), "sqrt": (np.sqrt, TO_FLOAT),
    "tan": (np.tan, TO_FLOAT), "tanh": (np.tanh, TO_FLOAT),
    "add": (np.add, KEEP), "sub": (np.subtract, KEEP), "mul": (np.multiply, KEEP),
    "floor_divide": (np.floor_divide, KEEP), "remainder": (np.remainder, KEEP),
    "fmod": (np.fmod, KEEP), "pow": (np.power, KEEP),
    "max": (np.maximum, KEEP), "maximum": (np.maximum, KEEP),
    "min": (np.minimum, KEEP), "minimum": (np.minimum, KEEP),
    "div": (np.true_divide, TO_FLOAT), "atan2": (np.arctan2, TO_FLOAT),
    "logaddexp": (np.logaddexp, TO_FLOAT),
    "and": (np.bitwise_and, INTEGER), "or": (np.bitwise_or, INTEGER),
    "xor": (np.bitwise_xor, INTEGER), "lshift": (np.left_shift, INTEGER),
    "rshift": (np.right_shift, INTEGER),
}


def _elementwise(name: str, args: list[Value]) -> Value:
    """Apply an ELEMENTWISE function with torch's dtype rules; Python numbers in, Python out."""
    function, typing = ELEMENTWISE[name]
    if any(a is None for a in args):
        raise ValueError("None is not a value it can compute with")
    python = all(is_python_number(a) for a in args)
    dtype = result_dtype(args)
    if typing == TO_FLOAT and category(dtype) < FLOAT:
        dtype = np.dtype(np.float64 if python else np.float32)
    if typing == INTEGER and category(dtype) > INT:
        raise ValueError(f"needs integer or bool operands, got {dtype}")
    result = function(*(np.asarray(a, dtype=dtype) for a in args))
    result = np.asarray(result).astype(dtype, copy=False)
    return result.item() if python else result


def _int(value: Value) -> int:
    """Python int(): one value, truncated toward zero."""
    if value is None:
        raise ValueError("None is not a number")
    if np.size(value) != 1:
        raise ValueError(f"needs a single value, got shape {np.shape(value)}")
    return int(np.asarray(value).item())


def _cast(dtype) -> Callable[[Value], np.ndarray]:
    """Tensor.float() / .long() / .bool() / ...: the value as an array of ``dtype``."""

    def cast(value: Value) -> np.ndarray:
        if value is None:
            raise ValueError("None cannot be cast")
        return np.asarray(value).astype(dtype, copy=False)

    return cast


def _size(tensor: Value, dim: Value | None = None) -> int | np.ndarray:
    """size(@N, d) = the length of dim d (negative counts from the end); size(@N) = the shape."""
    shape = np.shape(tensor)
    if not shape:
        raise ValueError("a 0-d value has no dims")
    if dim is None:
        return np.array(shape, dtype=np.int64)
    if np.size(dim) != 1 or category(np.asarray(dim).dtype) != INT:
        raise ValueError(f"the dim must be an integer, got {dim!r}")
    return shape[normalize_dim(_int(dim), len(shape))]


SPECIAL: dict[str, Callable[..., Value]] = {
    "int": _int, "size": _size,
    **{name: _cast(TORCH_DTYPES[name]) for name in CAST_FUNCTIONS},
}
assert set(ELEMENTWISE) | set(SPECIAL) == set(ARITY), "every parsed function needs a kernel"


def _make_list(items: list[Value]) -> np.ndarray:
    """[a,b,...] -> a 1-D int64 array when every item is one integer (a shape value), or a
    float64 array when one is a float (scale factors: pnnx writes ``[1.7,1.7]`` for the
    scales of an aten::_upsample_*); each item must be a single number."""
    for item in items:
        if item is None or np.size(item) != 1:
            raise ValueError(f"list items must be single numbers, got {item!r}")
    if all(category(np.asarray(item).dtype) <= INT for item in items):
        return np.array([_int(item) for item in items], dtype=np.int64)
    return np.array([float(np.asarray(item)) for item in items], dtype=np.float64)


# ----- the stack machine ------------------------------------------------------------------------

def _run(node: Node, visit: Callable[[Node, list], object]):
    """Walk ``node`` in reverse-Polish order with a stack: each node pops the values of its
    children and pushes ``visit(node, those values)``. Returns the last value left."""
    stack: list = []
    for current in postorder(node):
        count = len(children(current))
        args = stack[len(stack) - count:]
        del stack[len(stack) - count:]
        stack.append(visit(current, args))
    return stack.pop()


def _operand(node: OperandRef, items: Sequence, expression: str):
    """``items[N]`` for ``@N``, or ExpressionError if the operator has no such input."""
    if node.index >= len(items):
        raise ExpressionError(f"@{node.index} needs input {node.index}, but the operator has "
                              f"{len(items)} input{'s' * (len(items) != 1)}",
                              expression=expression, position=node.position)
    return items[node.index]


def evaluate(node: Node, inputs: Sequence[np.ndarray], expression: str = "") -> Value:
    """Evaluate a parsed expression on ``inputs`` (``@N`` is ``inputs[N]``).

    Returns an array, or a Python number when no input array takes part (``size(@0,1)``).
    ``expression`` is the source text, shown in error messages."""

    def visit(current: Node, args: list[Value]) -> Value:
        if isinstance(current, OperandRef):
            return _operand(current, inputs, expression)
        if isinstance(current, Constant):
            return current.value
        try:
            if isinstance(current, ListExpr):
                return _make_list(args)
            if current.name in SPECIAL:
                return SPECIAL[current.name](*args)
            return _elementwise(current.name, args)
        except (ValueError, TypeError, OverflowError, ShapeError) as exc:
            what = "list" if isinstance(current, ListExpr) else f"{current.name}()"
            raise ExpressionError(f"{what}: {exc}", expression=expression,
                                  position=current.position) from None

    with np.errstate(all="ignore"):
        return _run(node, visit)


def infer_shape(node: Node, input_shapes: Sequence[Shape], expression: str = "") -> Shape:
    """The shape ``evaluate`` would return, from the input shapes alone: numbers and
    size(@N,d) are (), size(@N) is (rank,), a list of n items is (n,), casts keep the shape and
    every other function broadcasts its arguments' shapes."""

    def visit(current: Node, args: list[Shape]) -> Shape:
        if isinstance(current, OperandRef):
            return tuple(_operand(current, input_shapes, expression))
        if isinstance(current, Constant):
            return ()
        if isinstance(current, ListExpr):
            return (len(args),)
        if current.name == "size":
            return () if len(args) == 2 else (len(args[0]),)
        if current.name == "int":
            return ()
        try:
            return tuple(np.broadcast_shapes(*args))
        except ValueError:
            raise ShapeError(f"{current.name}(): shapes {', '.join(map(str, args))} do not "
                             f"broadcast") from None

    return _run(node, visit)


SMALL_VALUE = 4096  # elements: larger known values are not evaluated while planning shapes


def values_read(node: Node) -> set[int]:
    """The inputs ``@N`` whose VALUES the expression reads; an input that appears only inside
    size(@N, ...) contributes its shape alone."""
    if isinstance(node, OperandRef):
        return {node.index}
    if isinstance(node, Call) and node.name == "size":
        return set().union(*(values_read(arg) for arg in node.args[1:]))
    return set().union(*(values_read(child) for child in children(node)))


def _as_array(value: Value) -> np.ndarray:
    """A Python number result becomes a 0-d array of torch's default dtype for its kind."""
    if is_python_number(value):
        return np.asarray(value, dtype=_TENSOR_DTYPES[type(value)])
    return np.asarray(value)


# ----- affine forms: what fusion and the fast floor compute in one pass ------------------------

def affine_form(node: Node) -> tuple[float, float] | None:
    """(a, b) if the expression is y = a * @0 + b in the steps torch rounds: at most one
    multiply (or a division by a power of two, whose reciprocal is exact) by a number, then
    at most one addition (or subtraction) of a number, and no other input::

        mul(@0,a)  mul(a,@0)  div(@0,4) (a = 0.25)  add(@0,b)  sub(@0,c) (b = -c)  sub(b,@0)
        add(mul(a,@0),b)  sub(div(@0,2),d)  ...

    Numbers must be finite ints or floats, a non-zero. Else None. (A longer chain, or a
    division by another number, is not taken: a * x + b computed in two steps, each rounded,
    is what torch computes then, and nothing else would be.)"""
    scale = _scale_of(node)
    if scale is not None:
        return scale, -0.0                 # -0.0: adds nothing, keeps a product's -0.0
    if not isinstance(node, Call) or node.name not in ("add", "sub") or len(node.args) != 2:
        return None
    left, right = node.args
    if node.name == "add" and _number(left) is not None:
        left, right = right, left          # add(b, x) = add(x, b)
    shift, scale = _number(right), _scale_of(left)
    if shift is not None and scale is not None:
        return scale, (shift if node.name == "add" else -shift)
    shift, scale = _number(left), _scale_of(right)
    if node.name == "sub" and shift is not None and scale is not None:
        return -scale, shift               # sub(b, a * x) = -a * x + b
    return None


def _scale_of(node: Node) -> float | None:
    """a if ``node`` is @0, mul(@0,a), mul(a,@0) or div(@0,c) (a = 1/c, c a power of two), a
    finite non-zero."""
    if isinstance(node, OperandRef):
        return 1.0 if node.index == 0 else None
    if not isinstance(node, Call) or node.name not in ("mul", "div") or len(node.args) != 2:
        return None
    left, right = node.args
    if node.name == "mul" and isinstance(right, OperandRef):
        left, right = right, left
    number = _number(right)
    if not (isinstance(left, OperandRef) and left.index == 0) or not number:
        return None
    if node.name == "div" and math.frexp(abs(number))[0] != 0.5:
        return None                        # x / 3 is not x * fl(1 / 3)
    scale = number if node.name == "mul" else 1.0 / number
    finite = abs(scale) <= float(np.finfo(np.float32).max)   # as torch's float32 factor
    return scale if finite and np.float32(scale) != 0 else None


def _number(node: Node) -> float | None:
    """The value of a finite int or float constant (not a bool), as a float; else None."""
    if not isinstance(node, Constant) or isinstance(node.value, bool):
        return None
    if not isinstance(node.value, (int, float)) or not np.isfinite(node.value):
        return None
    return float(node.value)


# ----- the layer --------------------------------------------------------------------------------

@register_layer("pnnx.Expression")
class ExpressionLayer(Layer):
    """y = expr(@0, @1, ...): any number of inputs, one output (see the module docstring)."""

    expr = Param(convert=as_str)
    one_blob_only = False

    def check_params(self) -> None:
        self.tree = parse_expression(self.expr)  # ExpressionError at build time
        self.values_read = values_read(self.tree)

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        return [infer_shape(self.tree, input_shapes, self.expr)]

    def infer_values(self, input_shapes: Sequence[Shape],
                     input_values: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
        """Shape arithmetic such as ``[size(@0,0),-1]`` is evaluated while the graph plans
        shapes: an input read only through size() needs just its shape (a zero-byte stand-in
        takes its place), any other input must be a small known value."""
        stand_ins = []
        for index, (shape, value) in enumerate(zip(input_shapes, input_values)):
            if index in self.values_read:
                if value is None or value.size > SMALL_VALUE:
                    return None
                stand_ins.append(value)
            else:
                stand_ins.append(np.broadcast_to(np.float32(0), shape))
        return self.forward(stand_ins)

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        result = _as_array(evaluate(self.tree, inputs, self.expr))
        if any(result is x for x in inputs):  # never hand out an input as the output buffer
            result = result.copy()
        return [result]
