"""Tensors made from a shape and a fill value: torch.zeros / ones / full / empty, their
``_like`` forms, ``x.new_zeros`` / ``new_ones`` / ``new_empty`` and ``x.fill(value)``; and the
coordinate tensors of a grid: torch.arange and torch.meshgrid (YOLO's cell grids, which a
dynamic export computes from the feature map's size).

The output is a read-only broadcast of one value (no memory per element); the graph copies it
if it is a graph output. ``empty`` gives zeros (torch leaves it uninitialised). ``dtype``
follows torch: the ``torch.long`` etc. parameter if given, else the input's dtype for the
``_like`` / ``new_`` forms, else float32 (int64 for torch.full with an integer fill value).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from layers.base import Layer, NamedArgumentLayer, Param, Shape, as_ints, as_str
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError

TORCH_DTYPES = {
    "torch.float": np.float32, "torch.float32": np.float32, "torch.double": np.float64,
    "torch.float64": np.float64, "torch.half": np.float16, "torch.float16": np.float16,
    "torch.long": np.int64, "torch.int64": np.int64, "torch.int": np.int32,
    "torch.int32": np.int32, "torch.short": np.int16, "torch.int16": np.int16,
    "torch.int8": np.int8, "torch.uint8": np.uint8, "torch.bool": np.bool_,
}


def as_number(value: Any) -> bool | int | float:
    """A fill value: bool, int or float, kept as it is (its type can set the dtype)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"expected a number, got {value!r}")


def filled(shape: Sequence[int], value: bool | int | float, dtype) -> np.ndarray:
    """A read-only array of ``shape`` holding ``value`` everywhere."""
    if any(d < 0 for d in shape):
        raise ShapeError(f"size {tuple(shape)} has a negative dim")
    return np.broadcast_to(np.array(value, dtype=dtype), tuple(shape))


class Creation(NamedArgumentLayer):
    """Base: ``dtype`` parameter; the subclass says where the shape and the value come from."""

    dtype = Param(None, as_str)
    FILL: bool | int | float | None = 0
    VALUE_SETS_DTYPE = False           # torch.full: an int fill makes int64, a bool one bool

    def check_params(self) -> None:
        if self.dtype is not None and self.dtype not in TORCH_DTYPES:
            raise LayerError(f"unsupported dtype {self.dtype!r}")

    def _dtype(self, like: np.dtype | None, value: Any) -> np.dtype:
        if self.dtype is not None:
            return np.dtype(TORCH_DTYPES[self.dtype])
        if like is not None:
            return np.dtype(like)
        if self.VALUE_SETS_DTYPE and isinstance(value, bool):
            return np.dtype(np.bool_)
        if self.VALUE_SETS_DTYPE and isinstance(value, int):
            return np.dtype(np.int64)
        return np.dtype(np.float32)

    def _value(self, items: Sequence[Any]) -> bool | int | float:
        return self.FILL


@register_layer("torch.zeros_like", "torch.empty_like", "aten::zero")
class ZerosLike(Creation):
    """``torch.zeros_like(x, dtype=None)``: zeros of x's shape (and dtype unless given);
    ``aten::zero`` is pnnx's name for ``x.zero_()``."""

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        if len(input_shapes) < 1:
            raise ShapeError("expects the input whose shape it copies")
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, value = inputs[0], self._value(inputs)
        return [filled(x.shape, value, self._dtype(x.dtype, value))]


@register_layer("torch.ones_like")
class OnesLike(ZerosLike):
    """``torch.ones_like(x, dtype=None)``: ones of x's shape."""

    FILL = 1


@register_layer("torch.full_like")
class FullLike(ZerosLike):
    """``torch.full_like(x, fill_value, dtype=None)``: fill_value everywhere, in x's shape."""

    fill_value = Param(None, as_number)
    INPUTS = ("input", "fill_value")

    def _value(self, items: Sequence[Any]) -> bool | int | float:
        value = self.argument("fill_value", items)
        if value is None:
            raise ShapeError("needs the fill_value: a parameter or an input")
        return value


@register_layer("Tensor.fill")
class Fill(ZerosLike):
    """``x.fill(value)`` (from ``x.fill_(value)``): x's shape and dtype, holding ``value``."""

    value = Param(None, as_number)
    INPUTS = ("input", "value")
    dtype = None                       # not a parameter: x's dtype

    def _value(self, items: Sequence[Any]) -> bool | int | float:
        value = self.argument("value", items)
        if value is None:
            raise ShapeError("needs the value: a parameter or an input")
        return value


@register_layer("torch.zeros", "torch.empty")
class Zeros(Creation):
    """``torch.zeros(size, dtype=None)``: zeros of ``size`` (a parameter, or the one input
    when the model computes it: ``torch.zeros(x.size(0), 3)``)."""

    size = Param(None, as_ints)
    INPUTS = ("size",)
    LIKE_INPUT = False                 # the new_* forms take x first and copy its dtype

    def _size(self, items: Sequence[Any]) -> tuple[int, ...]:
        size = self.argument("size", items)
        if size is None:
            raise ShapeError("needs the size: a parameter or an input")
        return size

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        size = self._size(input_values)
        filled(size, 0, np.float32)                     # checks the size
        return [tuple(size)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        value = self._value(inputs)
        like = inputs[0].dtype if self.LIKE_INPUT else None
        return [filled(self._size(inputs), value, self._dtype(like, value))]


@register_layer("torch.ones")
class Ones(Zeros):
    """``torch.ones(size, dtype=None)``."""

    FILL = 1


@register_layer("torch.full")
class Full(Zeros):
    """``torch.full(size, fill_value, dtype=None)``; an integer fill value without a dtype
    makes an int64 tensor, as in torch."""

    fill_value = Param(None, as_number)
    INPUTS = ("size", "fill_value")
    FILL, VALUE_SETS_DTYPE = None, True

    def _value(self, items: Sequence[Any]) -> bool | int | float:
        value = self.argument("fill_value", items)
        if value is None:
            raise ShapeError("needs the fill_value: a parameter or an input")
        return value


@register_layer("Tensor.new_zeros", "Tensor.new_empty")
class NewZeros(Zeros):
    """``x.new_zeros(size, dtype=None)``: zeros of ``size`` with x's dtype."""

    INPUTS = ("input", "size")
    LIKE_INPUT = True


@register_layer("Tensor.new_ones")
class NewOnes(NewZeros):
    """``x.new_ones(size, dtype=None)``."""

    FILL = 1



# ----- arange / meshgrid ------------------------------------------------------------------------

@register_layer("torch.arange")
class Arange(NamedArgumentLayer):
    """``torch.arange(start=0, end, step=1, dtype=None)``: start, start + step, ... up to
    (not including) end, ceil((end - start) / step) values. Without a dtype: int64 when every
    argument is an integer, else float32. A dynamic export computes ``end`` from an input's
    size: ``torch.arange ... dtype=torch.float $end=142``."""

    start = Param(0, as_number)
    end = Param(None, as_number)
    step = Param(1, as_number)
    dtype = Param(None, as_str)
    INPUTS = ("end",)

    def check_params(self) -> None:
        if self.dtype is not None and self.dtype not in TORCH_DTYPES:
            raise LayerError(f"unsupported dtype {self.dtype!r}")

    def _range(self, items: Sequence[Any]) -> tuple[float, float, float, np.dtype]:
        start, end, step = (self.argument(key, items) for key in ("start", "end", "step"))
        if end is None:
            raise ShapeError("needs the end: a parameter or an input")
        if step == 0:
            raise ShapeError("step must be nonzero")
        if self.dtype is not None:
            dtype = np.dtype(TORCH_DTYPES[self.dtype])
        elif all(isinstance(v, (int, np.integer)) for v in (start, end, step)):
            dtype = np.dtype(np.int64)
        else:
            dtype = np.dtype(np.float32)
        return start, end, step, dtype

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        start, end, step, _ = self._range(input_values)
        return [(max(0, math.ceil((end - start) / step)),)]

    def infer_values(self, input_shapes: Sequence[Shape],
                     input_values: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
        if any(v is None for v in input_values):
            return None
        return self.forward(input_values)

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        start, end, step, dtype = self._range(inputs)
        (length,) = self.infer_shapes_from([], inputs)[0]
        return [(start + step * np.arange(length, dtype=np.float64)).astype(dtype)]


@register_layer("aten::meshgrid", "torch.meshgrid")
class Meshgrid(Layer):
    """``torch.meshgrid(v0, v1, ..., indexing)``: n vectors (0-d or 1-d) of lengths
    L0, L1, ... give n grids of shape (L0, L1, ...), grid i holding v_i along dim i:
    grid_i[j0, j1, ...] = v_i[j_i]. ``indexing='xy'`` swaps the first two dims (Cartesian).

    pnnx writes it as ``aten::meshgrid`` over a list of tensors (a ``pnnx.Expression
    [@0,@1]``) and the indexing string, followed by a ``prim::ListUnpack``; the graph's
    rewrite (infer/rewrite.py) turns that into this operator with the vectors as its inputs,
    ``indexing`` as its parameter and one output per grid."""

    indexing = Param("ij", as_str)
    one_blob_only = False

    def check_params(self) -> None:
        if self.indexing not in ("ij", "xy"):
            raise LayerError(f"indexing must be 'ij' or 'xy', got {self.indexing!r}")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if not input_shapes or any(len(s) > 1 for s in input_shapes):
            raise ShapeError(f"expects one or more 0-d or 1-d inputs, got shapes "
                             f"{[tuple(s) for s in input_shapes]}")
        shape = [s[0] if s else 1 for s in input_shapes]
        if self.indexing == "xy" and len(shape) > 1:
            shape[0], shape[1] = shape[1], shape[0]
        return [tuple(shape)] * len(input_shapes)

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(v) for v in inputs])
        vectors = [np.atleast_1d(v) for v in inputs]
        return list(np.meshgrid(*vectors, indexing=self.indexing))
