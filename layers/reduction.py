"""Reductions: sum, mean, prod, max, min, amax, amin, argmax, argmin, logsumexp, std, var,
norm; and the operators that keep the reduced dim: cumsum / cumprod (running reductions) and
topk (the k largest or smallest along a dim, with their indices).

pnnx writes them all as ``torch.x`` (the Tensor spellings ``x.sum(1)`` too)::

    torch.sum   dim=(1,-1) keepdim=False        several dims (a tuple), negative ones count
    torch.sum                                   no dim: the whole tensor, a 0-d result
    torch.max   dim=1 keepdim=True   1 2 ...    one dim: (values, indices), or values alone
    torch.argmax dim=None keepdim=False         the index into the flattened tensor

A reduced dim is dropped, or kept with size 1 when ``keepdim``. ``torch.max`` / ``torch.min``
with a dim return (values, int64 indices); pnnx drops an unused trailing output, so the layer
returns as many outputs as the operator has (``num_outputs``). Whole-tensor ``torch.prod`` is
written as ``aten::prod`` with a second input, the dtype, which pnnx writes as ``None``.
Sums and products of integer or bool tensors are int64, as in torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, NamedArgumentLayer, Param, Shape, as_bool, as_float, as_int,
                         as_ints, normalize_dim, optional, optional_input)
from layers.create import TORCH_DTYPES
from layers.expression import FLOAT, category
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def reduced_axes(dim: Sequence[int] | int | None, rank: int) -> tuple[int, ...]:
    """The axes a ``dim`` argument names: every axis for None (or an empty list), negative
    dims counted from the end; ShapeError for a dim out of range or named twice."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(rank))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    axes = tuple(normalize_dim(d, rank) for d in dims)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"dim {dims} names a dim twice (rank {rank})")
    return axes if rank else ()


def reduced_shape(shape: Shape, axes: Sequence[int], keepdim: bool) -> Shape:
    """``shape`` without the ``axes`` (or with size 1 there, when ``keepdim``)."""
    if keepdim:
        return tuple(1 if axis in axes else size for axis, size in enumerate(shape))
    return tuple(size for axis, size in enumerate(shape) if axis not in axes)


def _dims(value) -> tuple[int, ...]:
    return as_ints(value)


class _Reduction(Layer):
    """One input reduced over ``dim`` (None: every dim) into one output."""

    dim = Param(None, _dims)
    keepdim = Param(False, as_bool)

    def axes(self, shape: Shape) -> tuple[int, ...]:
        return reduced_axes(self.dim, len(shape))

    def infer_shape(self, shape: Shape) -> Shape:
        axes = self.axes(shape)
        if any(shape[axis] == 0 for axis in axes) and not self.EMPTY_OK:
            raise ShapeError(f"cannot reduce an empty dim of shape {tuple(shape)} "
                             f"(it has no identity)")
        return reduced_shape(shape, axes, self.keepdim)

    EMPTY_OK = True                    # sum / mean / prod have identities; max / min do not

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        return np.asarray(self.reduce(x, self.axes(x.shape)))

    def reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError


def _integers_to_int64(x: np.ndarray) -> np.ndarray:
    """torch sums and multiplies bool and integer tensors in int64."""
    return x.astype(np.int64) if category(x.dtype) < FLOAT else x


def _values_and_indices(layer: Layer) -> int:
    """How many of (values, indices) the graph takes from ``layer``: both, unless pnnx wrote
    one output because only the values are used."""
    return 2 if layer.num_outputs is None else layer.num_outputs


@register_layer("torch.sum")
class Sum(_Reduction):
    """y = sum of x over ``dim``"""

    def reduce(self, x, axes):
        return np.sum(_integers_to_int64(x), axis=axes, keepdims=self.keepdim)


@register_layer("torch.mean")
class Mean(_Reduction):
    """y = sum of x over ``dim`` / the number of elements summed (floating tensors only, as in
    torch)."""

    def reduce(self, x, axes):
        if category(x.dtype) < FLOAT:
            raise LayerError(f"torch.mean takes a floating tensor, got {x.dtype}")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.mean(x, axis=axes, keepdims=self.keepdim)


@register_layer("torch.prod")
class Prod(_Reduction):
    """y = product of x over one ``dim`` (torch.prod takes one dim, or none: aten::prod)."""

    dim = Param(None, as_int)

    def reduce(self, x, axes):
        return np.prod(_integers_to_int64(x), axis=axes, keepdims=self.keepdim)


@register_layer("aten::prod")
class WholeProd(Prod):
    """torch.prod(x) of the whole tensor: pnnx writes it as ``aten::prod`` whose second input
    is the dtype argument, None (a pnnx.Expression ``None``)."""

    dim, keepdim = None, False                      # constants, not parameters
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, dtype), got {len(input_shapes)}")
        return [self.infer_shape(tuple(input_shapes[0]))]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, dtype = inputs
        if not (dtype is None or (dtype.dtype == object and dtype.item() is None)):
            raise LayerError("aten::prod: only dtype=None is supported")
        return [self.forward_one(x)]


@register_layer("torch.amax")
class Amax(_Reduction):
    """y = largest value of x over ``dim`` (nan wins, as in torch)."""

    EMPTY_OK = False

    def reduce(self, x, axes):
        return np.max(x, axis=axes, keepdims=self.keepdim)


@register_layer("torch.amin")
class Amin(_Reduction):
    """y = smallest value of x over ``dim`` (nan wins, as in torch)."""

    EMPTY_OK = False

    def reduce(self, x, axes):
        return np.min(x, axis=axes, keepdims=self.keepdim)


@register_layer("torch.logsumexp")
class LogSumExp(_Reduction):
    """y = log(sum(exp(x))) over ``dim``, as m + log(sum(exp(x - m))) with m the max (finite),
    so that nothing overflows."""

    def reduce(self, x, axes):
        if category(x.dtype) < FLOAT:
            x = x.astype(np.float32)
        m = np.max(x, axis=axes, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        with np.errstate(divide="ignore"):
            y = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
        return y if self.keepdim else np.squeeze(y, axis=axes)


@register_layer("torch.var", "torch.std")
class Variance(_Reduction):
    """var = sum((x - mean)^2) / (n - correction) over ``dim``; std = sqrt(var). pnnx writes
    ``unbiased`` (correction 1 if True, else 0) or ``correction``."""

    unbiased = Param(True, as_bool)
    correction = Param(None, as_float)

    def reduce(self, x, axes):
        correction = self.correction if self.correction is not None else float(self.unbiased)
        count = int(np.prod([x.shape[axis] for axis in axes]))
        centred = x - np.mean(x, axis=axes, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.sum(centred * centred, axis=axes, keepdims=self.keepdim)
            y = y / x.dtype.type(max(count - correction, 0))
            return np.sqrt(y) if self.type == "torch.std" else y


@register_layer("torch.max", "torch.min")
class MaxMin(Layer):
    """torch.max / torch.min:

    * without ``dim``: the largest (smallest) value of the whole tensor, 0-d;
    * with ``dim``: (values, indices) along that dim, indices int64; pnnx writes one output
      when only the values are used.
    """

    dim = Param(None, as_int)
    keepdim = Param(False, as_bool)

    def _outputs(self) -> int:
        if self.dim is None:
            return 1
        return _values_and_indices(self)

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 1:
            raise ShapeError(f"expects 1 input, got {len(input_shapes)}")
        shape = tuple(input_shapes[0])
        if self._outputs() not in (1, 2):
            raise LayerError(f"gives values and indices; the operator has {self._outputs()} "
                             f"outputs")
        axes = reduced_axes(self.dim, len(shape))
        if any(shape[axis] == 0 for axis in axes):
            raise ShapeError(f"cannot reduce an empty dim of shape {shape}")
        return [reduced_shape(shape, axes, self.keepdim)] * self._outputs()

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x = inputs[0]
        is_max = self.type == "torch.max"
        if self.dim is None:
            return [np.asarray(x.max() if is_max else x.min())]
        axis = reduced_axes(self.dim, x.ndim)
        if not axis:                                              # a 0-d input
            return [x.copy(), np.zeros((), np.int64)][:self._outputs()]
        indices = (np.argmax if is_max else np.argmin)(x, axis=axis[0], keepdims=True)
        values = np.take_along_axis(x, indices, axis=axis[0])
        if not self.keepdim:
            values, indices = values.squeeze(axis[0]), indices.squeeze(axis[0])
        return [values, indices.astype(np.int64)][:self._outputs()]


@register_layer("torch.argmax", "torch.argmin")
class ArgMaxMin(_Reduction):
    """Index (int64) of the largest (smallest) value along ``dim``; with dim=None, the index
    into the flattened tensor (``keepdim`` then keeps every dim, with size 1)."""

    dim = Param(None, as_int)
    EMPTY_OK = False

    def reduce(self, x, axes):
        find = np.argmax if self.type == "torch.argmax" else np.argmin
        if self.dim is None:
            index = np.asarray(find(x), dtype=np.int64)
            return index.reshape((1,) * x.ndim) if self.keepdim else index
        if not axes:                                              # a 0-d input
            return np.zeros((), np.int64)
        return find(x, axis=axes[0], keepdims=self.keepdim).astype(np.int64)


def as_norm_order(value) -> float:
    """torch.norm's ``p``: a number (inf and -inf too). 'fro' is the 2-norm of the dims taken
    as one vector (pnnx writes it as p=2 already); the nuclear norm is not supported."""
    if value == "fro":
        return 2.0
    return as_float(value)


@register_layer("torch.norm")
class Norm(_Reduction):
    """The vector p-norm of x over ``dim`` (every dim when None), float32 for float32 x:

        p = 2 (default):   sqrt(sum |x|^2)        p = inf:    max |x|
        p = 0:             count of x != 0         p = -inf:   min |x|
        any other p:       (sum |x|^p)^(1/p)

    (torch.linalg.vector_norm / x.norm(dim=...) / F.normalize's denominator.)"""

    p = Param(2.0, as_norm_order)

    def reduce(self, x, axes):
        if category(x.dtype) < FLOAT:
            raise LayerError(f"torch.norm takes a floating tensor, got {x.dtype}")
        return kernels.vector_norm(x, self.p, axes, self.keepdim)


@register_layer("torch.cumsum", "torch.cumprod")
class CumulativeSum(Layer):
    """Running sum (product) along ``dim``: y[..., i, ...] = x[..., 0, ...] + ... +
    x[..., i, ...]; the shape is x's. Integer and bool inputs give int64, as in torch, unless a
    ``dtype`` is written."""

    dim = Param(convert=as_int)
    dtype = Param(None)

    def check_params(self) -> None:
        if self.dtype is not None and self.dtype not in TORCH_DTYPES:
            raise LayerError(f"unsupported dtype {self.dtype!r}")

    def infer_shape(self, shape: Shape) -> Shape:
        normalize_dim(self.dim, len(shape))
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        axis = normalize_dim(self.dim, x.ndim)
        if self.dtype is not None:
            x = x.astype(TORCH_DTYPES[self.dtype])
        else:
            x = _integers_to_int64(x)
        if x.ndim == 0:
            return x.copy()
        scan = np.cumsum if self.type == "torch.cumsum" else np.cumprod
        return scan(x, axis=axis, dtype=x.dtype)


@register_layer("torch.topk")
class TopK(Layer):
    """The ``k`` largest (``largest=False``: smallest) values along ``dim`` and their int64
    indices, best first; equal values keep their order, and NaN counts as the largest value,
    as in torch (the order of aten::sort). pnnx drops an unused indices output."""

    k = Param(convert=as_int)
    dim = Param(-1, as_int)
    largest = Param(True, as_bool)
    sorted = Param(True, as_bool)
    one_blob_only = False

    def _outputs(self) -> int:
        return _values_and_indices(self)

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 1:
            raise ShapeError(f"expects 1 input, got {len(input_shapes)}")
        if self._outputs() not in (1, 2):
            raise LayerError(f"gives values and indices; the operator has {self._outputs()} "
                             f"outputs")
        shape = tuple(input_shapes[0])
        axis = normalize_dim(self.dim, len(shape))
        size = shape[axis] if shape else 1
        if not 0 <= self.k <= size:
            raise ShapeError(f"k={self.k} is out of range for dim {self.dim} of shape {shape}")
        out = shape[:axis] + (self.k,) + shape[axis + 1:] if shape else ()
        return [out] * self._outputs()

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x = inputs[0]
        if x.ndim == 0:
            return [x.copy(), np.zeros((), np.int64)][:self._outputs()]
        axis = normalize_dim(self.dim, x.ndim)
        order = _sort_order(x, axis, descending=self.largest)
        indices = np.take(order, np.arange(self.k), axis=axis)        # (..., k, ...)
        values = np.take_along_axis(x, indices, axis=axis)
        return [values, indices.astype(np.int64)][:self._outputs()]


# ----- aten:: operators along a dim: any / all / count_nonzero, sort / argsort, cummax, diff -----
# pnnx leaves these as ``aten::`` operators whose arguments are inputs, each a pnnx.Expression
# constant (``1``, ``True``, ``None``): ``aten::sort 3 2 x dim descending values indices``.
# The layers read them by position (``INPUTS``); shapes that depend on them are planned from
# their values (NamedArgumentLayer.argument).

@register_layer("aten::any", "aten::all")
class AnyAll(NamedArgumentLayer):
    """torch.any / torch.all: whether any (every) value along ``dim`` is nonzero; bool.
    ``aten::any x`` alone reduces the whole tensor; ``aten::any x dim keepdim`` one dim or
    several."""

    INPUTS = ("input", "dim", "keepdim")
    dim = Param(None, optional(_dims))
    keepdim = Param(False, as_bool)

    def _axes(self, items, rank: int) -> tuple[tuple[int, ...], bool]:
        dim = self.argument("dim", items)
        return reduced_axes(dim, rank), self.argument("keepdim", items)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axes, keep = self._axes(input_values, len(shape))
        return [reduced_shape(shape, axes, keep)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axes, keep = self._axes(inputs, x.ndim)
        reduce = np.any if self.type == "aten::any" else np.all
        return [np.asarray(reduce(x != 0, axis=axes, keepdims=keep))]


@register_layer("aten::count_nonzero")
class CountNonzero(NamedArgumentLayer):
    """torch.count_nonzero(x, dim): how many values along ``dim`` (one or several dims; all
    when None) are nonzero, int64; the dims are dropped."""

    INPUTS = ("input", "dim")
    dim = Param(None, optional(_dims))

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axes = reduced_axes(self.argument("dim", input_values), len(shape))
        return [reduced_shape(shape, axes, False)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axes = reduced_axes(self.argument("dim", inputs), x.ndim)
        return [np.asarray(np.count_nonzero(x, axis=axes), dtype=np.int64)]


def _sort_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Indices that sort x along ``axis``, as torch: NaN counts as the largest value (last
    ascending, first descending); equal values keep their order (a stable sort)."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")      # numpy puts NaN last, as torch
    moved = np.moveaxis(x, axis, -1)
    nan = np.isnan(moved) if moved.dtype.kind == "f" else np.zeros(moved.shape, bool)
    key = np.where(nan, 0, moved)
    key = np.negative(key) if key.dtype != np.bool_ else ~key
    order = np.lexsort((key, ~nan), axis=-1)                 # NaN first, then largest first
    return np.moveaxis(order, -1, axis)


@register_layer("aten::sort", "aten::argsort")
class Sort(NamedArgumentLayer):
    """torch.sort(x, dim, descending) -> (values, int64 indices), torch.argsort -> indices;
    a stable sort, NaN as the largest value, as torch. With ``stable=True`` pnnx writes the
    other overload, (x, stable, dim, descending); the sort here is stable either way."""

    INPUTS = ("input", "dim", "descending")
    STABLE_INPUTS = ("input", "stable", "dim", "descending")      # the stable=True overload
    dim = Param(-1, as_int)
    descending = Param(False, as_bool)
    stable = Param(False, as_bool)

    def named_inputs(self, items):
        if len(items) == len(self.STABLE_INPUTS):
            return dict(zip(self.STABLE_INPUTS, items))
        return super().named_inputs(items)

    def _outputs(self) -> int:
        if self.type == "aten::argsort":
            return 1
        return _values_and_indices(self)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        if shape:
            normalize_dim(self.argument("dim", input_values), len(shape))
        return [shape] * self._outputs()

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        if x.ndim == 0:
            return [x.copy(), np.zeros((), np.int64)][-self._outputs():]
        axis = normalize_dim(self.argument("dim", inputs), x.ndim)
        order = _sort_order(x, axis, self.argument("descending", inputs))
        indices = order.astype(np.int64)
        if self.type == "aten::argsort":
            return [indices]
        return [np.take_along_axis(x, order, axis=axis), indices][:self._outputs()]


@register_layer("aten::cummax", "aten::cummin")
class CumulativeMax(NamedArgumentLayer):
    """torch.cummax(x, dim) -> (running maximum, int64 index of where it was found) along
    ``dim`` (cummin: minimum). A tie moves the index to the later position and a NaN, once
    met, stays the value, as in torch."""

    INPUTS = ("input", "dim")
    dim = Param(None, optional(as_int))

    def _axis(self, items, rank: int) -> int:
        dim = self.argument("dim", items)
        if dim is None:
            raise ShapeError("needs its dim (input 1)")
        return normalize_dim(dim, rank)

    def _outputs(self) -> int:
        return _values_and_indices(self)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        self._axis(input_values, len(shape))
        return [shape] * self._outputs()

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        outputs = self._outputs()
        axis = self._axis(inputs, x.ndim)
        if x.ndim == 0:
            return [x.copy(), np.zeros((), np.int64)][:outputs]
        running = (np.maximum if self.type == "aten::cummax" else np.minimum).accumulate(
            x, axis=axis)
        found = x == running
        if x.dtype.kind == "f":
            found |= np.isnan(x)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        positions = np.where(found, np.arange(x.shape[axis]).reshape(shape), 0)
        return [running, np.maximum.accumulate(positions, axis=axis).astype(np.int64)][:outputs]


@register_layer("aten::diff")
class Diff(NamedArgumentLayer):
    """torch.diff(x, n, dim, prepend, append): the n-th forward difference along ``dim``,
    y[i] = x[i + 1] - x[i] applied n times, after ``prepend`` / ``append`` (tensors or None)
    are joined to x along that dim. The dim shrinks by n."""

    INPUTS = ("input", "n", "dim", "prepend", "append")
    n = Param(1, as_int)
    dim = Param(-1, as_int)

    def _joined(self, items) -> list:
        named = self.named_inputs(items)
        return [optional_input(named.get(name)) for name in ("prepend", "append")]

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        if not shape:
            raise ShapeError("diff needs a tensor of rank 1 or more")
        axis = normalize_dim(self.argument("dim", input_values), len(shape))
        n = self.argument("n", input_values)
        if n < 0:
            raise ShapeError(f"n must be >= 0, got {n}")
        names = list(self.named_inputs(input_shapes))
        size = shape[axis]
        for name in ("prepend", "append"):
            if name in names:
                other = tuple(input_shapes[names.index(name)])
                if other:                                     # a tensor, not None
                    size += other[axis] if len(other) == len(shape) else 1
        return [shape[:axis] + (max(size - n, 0),) + shape[axis + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis = normalize_dim(self.argument("dim", inputs), x.ndim)
        prepend, append = self._joined(inputs)
        extra = {}
        if prepend is not None:
            extra["prepend"] = prepend
        if append is not None:
            extra["append"] = append
        return [np.diff(x, n=self.argument("n", inputs), axis=axis, **extra)]

