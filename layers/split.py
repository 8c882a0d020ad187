"""Taking tensors apart and putting them together: slice / select / narrow, cat / stack, split /
chunk / tensor_split / unbind (several outputs), index_select, gather and ``x[index]``.

A slice bound the model computes from input sizes (``x[:, :, :x.size(2) // 2]``) comes as a
named input (``$end=1``), or, when pnnx fuses several slices into one operator, as a list built
by a ``pnnx.SliceIndexes`` operator (``indexes=(@0,0)``: input 0's value, then 0).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers.base import (Layer, NamedArgumentLayer, Param, Shape, as_int, as_ints,
                         normalize_dim, optional, optional_input)
from layers.registry import register_layer
from layers.shape import KnownValues, read_only_alias
from parser.errors import ExpressionError, LayerError, ShapeError
from parser.expression import Constant, ListExpr, parse_expression

NO_SELECT = 2147483647     # pnnx's INT_MAX: "this dim is sliced, not selected"; also "to the end"


def int_or_ints(value: Any) -> int | tuple[int, ...]:
    """An int stays an int (a piece size), a list becomes a tuple (the pieces' sizes)."""
    return as_ints(value) if isinstance(value, (list, tuple)) else as_int(value)


def as_index_items(value: Any) -> tuple[str, ...]:
    """pnnx.SliceIndexes' ``indexes``: each item as text, a number or ``@N``."""
    return tuple(str(i) for i in (value if isinstance(value, (list, tuple)) else (value,)))


def check_index(index: int, size: int, what: str) -> int:
    """A possibly negative index into a dim of ``size`` elements -> 0 <= index < size."""
    if not -size <= index < size:
        raise ShapeError(f"{what} {index} is out of range for a dim of size {size}")
    return index % size


def slice_length(size: int, start: int, end: int, step: int) -> int:
    """How many elements x[start:end:step] has along a dim of ``size`` (Python's clamping)."""
    return len(range(*slice(start, end, step).indices(size)))


# ----- slice / select / narrow ------------------------------------------------------------------

@register_layer("pnnx.SliceIndexes")
class SliceIndexes(KnownValues, Layer):
    """The bounds list of a fused Tensor.slice when some bounds are computed: ``indexes`` holds
    numbers and ``@k`` entries, which stand for input k's value. Output: a 1-D int64 array."""

    indexes = Param(convert=as_index_items)
    one_blob_only = False

    def check_params(self) -> None:
        for item in self.indexes:
            text = item[1:] if item.startswith("@") else item
            if not text.lstrip("-").isdigit():
                raise LayerError(f"indexes={self.indexes}: {item!r} is neither a number nor @N")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        wanted = {int(item[1:]) for item in self.indexes if item.startswith("@")}
        if wanted and max(wanted) >= len(input_shapes):
            raise ShapeError(f"indexes={self.indexes} refers to input {max(wanted)}, the "
                             f"operator has {len(input_shapes)} inputs")
        return [(len(self.indexes),)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(x) for x in inputs])
        values = [int(np.asarray(inputs[int(item[1:])]).item()) if item.startswith("@")
                  else int(item) for item in self.indexes]
        return [np.array(values, dtype=np.int64)]


@register_layer("Tensor.slice")
class Slice(KnownValues, NamedArgumentLayer):
    """``x[..., start:end:step, ...]`` along ``dim`` (torch's Tensor.slice): negative bounds
    count from the end and bounds past the ends are clamped, as in Python; step must be > 0.

    pnnx fuses consecutive slices (and selects) into one operator with lists ``dims``,
    ``starts``, ``ends``, ``steps`` and ``selects``: along dims[i], a select other than
    2147483647 picks that one index (the dim goes away), otherwise the dim is sliced. Any
    bound may instead be an input computed in the graph (``$end``, ``$starts``, ...).
    """

    views_input = True

    dim = Param(None, as_int)                        # one slice (or select)
    start = Param(None, as_int)
    end = Param(None, as_int)
    step = Param(None, as_int)
    select = Param(None, as_int)
    dims = Param(None, as_ints)                      # or a fused one: lists, one per dim
    starts = Param(None, as_ints)
    ends = Param(None, as_ints)
    steps = Param(None, as_ints)
    selects = Param(None, as_ints)

    def _index(self, shape: Shape, items: Sequence[Any]) -> tuple[Any, ...]:
        """The numpy index (slices and ints) this operator applies to an input of ``shape``."""
        if (self.dim is None) == (self.dims is None):
            raise LayerError("needs either dim (one slice) or dims (a fused slice)")
        if self.dims is not None:
            dims = self.dims
            bounds = [self.argument(key, items) for key in ("starts", "ends", "steps", "selects")]
            bounds = [values if values is not None else (default,) * len(dims)
                      for values, default in zip(bounds, (0, NO_SELECT, 1, NO_SELECT))]
        else:
            dims = (self.dim,)
            bounds = [(self.argument(key, items),) for key in ("start", "end", "step", "select")]
            bounds = [values if values != (None,) else (default,)
                      for values, default in zip(bounds, (0, NO_SELECT, 1, NO_SELECT))]
        if any(len(values) != len(dims) for values in bounds):
            raise ShapeError(f"dims {dims} and the slice bounds {bounds} differ in length")
        index: list[Any] = [slice(None)] * len(shape)
        for dim, start, end, step, select in zip(dims, *bounds):
            axis = normalize_dim(dim, len(shape))
            if select != NO_SELECT:
                index[axis] = check_index(select, shape[axis], "select index")
            elif step <= 0:
                raise ShapeError(f"slice step must be positive, got {step}")
            else:
                index[axis] = slice(start, end, step)
        return tuple(index)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        index = self._index(shape, input_values)
        return [tuple(slice_length(size, i.start, i.stop, i.step) for size, i in
                      zip(shape, index) if isinstance(i, slice))]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        return [read_only_alias(np.asarray(x[self._index(x.shape, inputs)]), x)]


@register_layer("Tensor.slice_copy")
class SliceCopy(Slice):
    """Assignment into a slice, ``x[:, 1:3] = src`` / ``y[..., 0:2] = f(y[..., 0:2])``:
    pnnx writes it as a copy of x in which the elements that Tensor.slice with the same
    parameters would take are replaced by ``src`` (broadcast to that slice's shape, cast to
    x's dtype)::

        y = x.clone(); y[index] = src        # index: dim/start/end/step/select, or the lists

    Inputs ``$self`` (x) and ``$src``; the output has x's shape and dtype."""

    INPUTS = ("self", "src")

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        if len(input_shapes) < 2:
            raise ShapeError(f"expects 2 inputs (self, src), got {len(input_shapes)}")
        target = super().infer_shapes_from(input_shapes, input_values)[0]
        try:
            np.broadcast_shapes(tuple(input_shapes[1]), target)
        except ValueError:
            raise ShapeError(f"src of shape {tuple(input_shapes[1])} cannot be assigned to a "
                             f"slice of shape {target}") from None
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes_from([np.shape(x) for x in inputs], inputs)
        x, src = inputs[0], inputs[1]
        y = np.array(x, copy=True)                          # x's shape and dtype
        y[self._index(x.shape, inputs)] = src
        return [y]


@register_layer("Tensor.select", "torch.select")
class Select(KnownValues, NamedArgumentLayer):
    """``x.select(dim, index)`` = ``x[..., index, ...]``: one index along ``dim`` (negative
    counts from the end); the dim goes away. The index may be an input computed in the graph."""

    views_input = True

    dim = Param(convert=as_int)
    index = Param(None, as_int)
    INPUTS = ("input", "index")

    def _where(self, shape: Shape, items: Sequence[Any]) -> tuple[int, int]:
        axis = normalize_dim(self.dim, len(shape))
        index = self.argument("index", items)
        if index is None:
            raise ShapeError("needs the index: a parameter or a second input")
        return axis, check_index(index, shape[axis], "index")

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axis, _ = self._where(shape, input_values)
        return [shape[:axis] + shape[axis + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis, index = self._where(x.shape, inputs)
        return [read_only_alias(np.asarray(x[(slice(None),) * axis + (index,)]), x)]


@register_layer("torch.narrow", "Tensor.narrow")
class Narrow(KnownValues, NamedArgumentLayer):
    """``torch.narrow(x, dim, start, length)`` = x[..., start:start + length, ...]; a negative
    start counts from the end; the range must lie inside the dim."""

    views_input = True

    dim = Param(convert=as_int)
    start = Param(None, as_int)
    length = Param(None, as_int)
    INPUTS = ("input", "start", "length")

    def _range(self, shape: Shape, items: Sequence[Any]) -> tuple[int, int, int]:
        axis = normalize_dim(self.dim, len(shape))
        start, length = self.argument("start", items), self.argument("length", items)
        size = shape[axis]
        if start is None or length is None:
            raise ShapeError("needs start and length: parameters or inputs")
        if start < 0:
            start += size
        if not (0 <= start <= size and 0 <= length <= size - start):
            raise ShapeError(f"narrow start={start} length={length} does not fit in a dim of "
                             f"size {size}")
        return axis, start, length

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axis, _, length = self._range(shape, input_values)
        return [shape[:axis] + (length,) + shape[axis + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis, start, length = self._range(x.shape, inputs)
        return [read_only_alias(x[(slice(None),) * axis + (slice(start, start + length),)], x)]


# ----- cat / stack ----------------------------------------------------------------------------

@register_layer("torch.cat")
class Cat(KnownValues, Layer):
    """``torch.cat(inputs, dim)``: join the inputs along ``dim``; every other dim must match."""

    dim = Param(0, as_int)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if not input_shapes:
            raise ShapeError("expects at least one input")
        first = tuple(input_shapes[0])
        dim = normalize_dim(self.dim, len(first))
        for shape in input_shapes[1:]:
            if len(shape) != len(first) or any(
                    a != b for i, (a, b) in enumerate(zip(shape, first)) if i != dim):
                raise ShapeError(f"cannot concatenate shapes {[tuple(s) for s in input_shapes]} "
                                 f"along dim {self.dim}: the other dims must match")
        total = sum(shape[dim] for shape in input_shapes)
        return [(*first[:dim], total, *first[dim + 1:])]

    support_forward_into = True      # the graph's float32 inputs: into its planned buffer

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([x.shape for x in inputs])
        return [np.concatenate(inputs, axis=normalize_dim(self.dim, inputs[0].ndim))]

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Into the planned buffer. Where every dim before ``dim`` has size 1, each input's
        piece of the output is contiguous, and the graph's memory plan may have had an
        input's producer write it there already: only the others are copied."""
        out = outputs[0]
        shape = self.infer_shapes([x.shape for x in inputs])[0]
        if shape != out.shape:
            raise ShapeError(f"the inputs make a {shape} output, the given array is {out.shape}")
        axis = normalize_dim(self.dim, out.ndim)
        if any(size != 1 for size in shape[:axis]) or not out.flags.c_contiguous:
            np.concatenate(inputs, axis=axis, out=out)
            return
        address, lead, start = out.ctypes.data, (slice(None),) * axis, 0
        for x in inputs:
            size = x.shape[axis]
            if not (x.flags.c_contiguous and x.ctypes.data == address + start * out.strides[axis]):
                out[lead + (slice(start, start + size),)] = x      # not in its piece yet
            start += size

    def joins_along(self, rank: int) -> int:
        return normalize_dim(self.dim, rank)


@register_layer("torch.stack")
class Stack(KnownValues, Layer):
    """``torch.stack(inputs, dim)``: inputs of one shape joined along a NEW dim ``dim`` of the
    output (-1 makes it the last), e.g. two (N, C) -> (N, 2, C) with dim=1."""

    dim = Param(0, as_int)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if not input_shapes:
            raise ShapeError("expects at least one input")
        first = tuple(input_shapes[0])
        if any(tuple(shape) != first for shape in input_shapes):
            raise ShapeError(f"cannot stack shapes {[tuple(s) for s in input_shapes]}: they "
                             f"must be equal")
        dim = normalize_dim(self.dim, len(first) + 1)
        return [(*first[:dim], len(input_shapes), *first[dim:])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([x.shape for x in inputs])
        return [np.stack(inputs, axis=normalize_dim(self.dim, inputs[0].ndim + 1))]


# ----- split / chunk / tensor_split / unbind: several outputs -------------------------------

def split_pieces(x: np.ndarray, axis: int, bounds: Sequence[int]) -> list[np.ndarray]:
    """Read-only views x[..., bounds[i]:bounds[i+1], ...] along ``axis``."""
    lead = (slice(None),) * axis
    return [read_only_alias(x[lead + (slice(a, b),)], x) for a, b in zip(bounds, bounds[1:])]


class SplitLayer(KnownValues, NamedArgumentLayer):
    """Base of the layers that cut a tensor into pieces along ``dim``: a subclass gives the
    piece boundaries ``_bounds(size, items)`` (0, b1, b2, ..., size)."""

    views_input = True

    dim: int                                         # a parameter of each subclass

    def _bounds(self, size: int, items: Sequence[Any]) -> list[int]:
        raise NotImplementedError

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axis = normalize_dim(self.dim, len(shape))
        bounds = self._bounds(shape[axis], input_values)
        return [shape[:axis] + (b - a,) + shape[axis + 1:] for a, b in zip(bounds, bounds[1:])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis = normalize_dim(self.dim, x.ndim)
        return split_pieces(x, axis, self._bounds(x.shape[axis], inputs))

    def cuts_along(self, rank: int) -> int:
        return normalize_dim(self.dim, rank)


@register_layer("torch.split", "Tensor.split")
class Split(SplitLayer):
    """``torch.split(x, split_size_or_sections, dim)``: an int cuts pieces of that size (the
    last may be smaller); a list gives each piece's size, and must add up to the dim."""

    split_size_or_sections = Param(None, int_or_ints)
    dim = Param(0, as_int)
    INPUTS = ("input", "split_size_or_sections")

    def _bounds(self, size: int, items: Sequence[Any]) -> list[int]:
        sizes = self.argument("split_size_or_sections", items)
        if sizes is None:
            raise ShapeError("needs split_size_or_sections: a parameter or a second input")
        if isinstance(sizes, int):
            if sizes <= 0:
                raise ShapeError(f"split size must be positive, got {sizes}")
            return list(range(0, size, sizes)) + [size] if size else [0, 0]
        if any(s < 0 for s in sizes) or sum(sizes) != size:
            raise ShapeError(f"split sizes {sizes} must be >= 0 and add up to the dim's size "
                             f"{size}")
        return list(np.cumsum((0,) + tuple(sizes)))


@register_layer("torch.chunk", "Tensor.chunk")
class Chunk(SplitLayer):
    """``torch.chunk(x, chunks, dim)``: pieces of ceil(size / chunks) elements, the last one
    smaller; as in torch, fewer than ``chunks`` pieces come out when they do not divide evenly
    (size 4 in 3 chunks -> 2 + 2)."""

    chunks = Param(convert=as_int)
    dim = Param(0, as_int)

    def check_params(self) -> None:
        if self.chunks <= 0:
            raise LayerError(f"chunks must be positive, got {self.chunks}")

    def _bounds(self, size: int, items: Sequence[Any]) -> list[int]:
        step = -(-size // self.chunks)
        if step == 0:
            return [0] * (self.chunks + 1)                  # an empty dim: empty chunks
        return list(range(0, size, step)) + [size]


@register_layer("torch.tensor_split", "Tensor.tensor_split")
class TensorSplit(SplitLayer):
    """``torch.tensor_split(x, sections | indices, dim)``: ``sections`` = n cuts n pieces whose
    sizes differ by at most 1 (the first size % n get one more); ``indices`` cuts before each
    index (Python slicing: x[:i0], x[i0:i1], ..., x[ik:])."""

    sections = Param(None, as_int)
    indices = Param(None, as_ints)
    dim = Param(0, as_int)

    def check_params(self) -> None:
        if self.sections is not None and self.sections <= 0:
            raise LayerError(f"sections must be positive, got {self.sections}")

    def _bounds(self, size: int, items: Sequence[Any]) -> list[int]:
        if (self.sections is None) == (self.indices is None):
            raise LayerError("needs either sections or indices")
        if self.sections is not None:
            small, extra = divmod(size, self.sections)
            sizes = [small + 1] * extra + [small] * (self.sections - extra)
            return list(np.cumsum([0] + sizes))
        # each piece is x[a:b] with Python's clamping of a and b to [0, size]
        cuts = [slice(i).indices(size)[1] for i in self.indices]
        bounds = [0, *cuts, size]
        return [min(max(b, 0), size) for b in bounds]

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        axis = normalize_dim(self.dim, len(shape))
        bounds = self._bounds(shape[axis], input_values)
        return [shape[:axis] + (max(b - a, 0),) + shape[axis + 1:]
                for a, b in zip(bounds, bounds[1:])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        axis = normalize_dim(self.dim, x.ndim)
        bounds = self._bounds(x.shape[axis], inputs)
        lead = (slice(None),) * axis
        return [read_only_alias(x[lead + (slice(a, max(a, b)),)], x)
                for a, b in zip(bounds, bounds[1:])]


@register_layer("torch.unbind", "Tensor.unbind")
class Unbind(KnownValues, Layer):
    """``torch.unbind(x, dim)``: one output per index along ``dim``, that dim removed, e.g.
    (N, 3, L) with dim=1 -> three (N, L)."""

    views_input = True

    dim = Param(0, as_int)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 1:
            raise ShapeError(f"expects 1 input, got {len(input_shapes)}")
        shape = tuple(input_shapes[0])
        axis = normalize_dim(self.dim, len(shape))
        return [shape[:axis] + shape[axis + 1:]] * shape[axis]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        (x,) = inputs
        axis = normalize_dim(self.dim, x.ndim)
        lead = (slice(None),) * axis
        return [read_only_alias(np.asarray(x[lead + (i,)]), x) for i in range(x.shape[axis])]


# ----- index_select / gather ------------------------------------------------------------------

def check_indices(index: np.ndarray, size: int, what: str) -> None:
    """Integer indices within [0, size) (torch refuses negative ones here)."""
    if index.dtype.kind not in "iu":
        raise ShapeError(f"{what} must be integers, got {index.dtype}")
    if index.size and (index.min() < 0 or index.max() >= size):
        raise ShapeError(f"{what} holds values outside [0, {size})")


@register_layer("torch.index_select", "Tensor.index_select")
class IndexSelect(Layer):
    """``torch.index_select(x, dim, index)``: the entries index[0], index[1], ... of dim
    ``dim``; ``index`` is a 1-D integer tensor (an input)."""

    dim = Param(convert=as_int)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, index), got {len(input_shapes)}")
        shape, index = tuple(input_shapes[0]), tuple(input_shapes[1])
        if len(index) > 1:
            raise ShapeError(f"index must be 1-D, got shape {index}")
        axis = normalize_dim(self.dim, len(shape))
        return [shape[:axis] + (int(np.prod(index)),) + shape[axis + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x, index = inputs
        axis = normalize_dim(self.dim, x.ndim)
        check_indices(index, x.shape[axis], "index")
        return [np.take(x, index.reshape(-1), axis=axis)]


@register_layer("torch.gather", "Tensor.gather")
class Gather(Layer):
    """``torch.gather(x, dim, index)``: out[i][j][k] = x[i][index[i][j][k]][k] for dim=1;
    the output has index's shape, which may be smaller than x's in the other dims."""

    dim = Param(convert=as_int)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, index), got {len(input_shapes)}")
        shape, index = tuple(input_shapes[0]), tuple(input_shapes[1])
        axis = normalize_dim(self.dim, len(shape))
        if len(index) != len(shape) or any(
                i > s for d, (i, s) in enumerate(zip(index, shape)) if d != axis):
            raise ShapeError(f"index of shape {index} does not fit input {shape} outside dim "
                             f"{self.dim}")
        return [index]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x, index = inputs
        axis = normalize_dim(self.dim, x.ndim)
        check_indices(index, x.shape[axis], "index")
        window = tuple(slice(None) if d == axis else slice(0, n)
                       for d, n in enumerate(index.shape))
        return [np.take_along_axis(x[window], index, axis=axis)]


def index_list_text(value: Any) -> str:
    """Tensor.index's ``expr`` as text: pnnx's param reader splits ``[None,[0,2,-1]]`` at
    its commas (a string array), which joined again gives the list back."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "[" + ",".join(value) + "]"
    raise TypeError(f"expected a list of indices, got {value!r}")


def constant_indices(text: str) -> list[Any]:
    """``[None,[0,2,-1]]`` -> [None, array([0, 2, -1])]: one index per leading dim; a list of
    True / False is a mask (a bool array)."""
    tree = parse_expression(text)
    if not isinstance(tree, ListExpr):
        raise ValueError(f"expected a list of indices, got {text!r}")

    def value(node: Any) -> Any:
        if isinstance(node, Constant) and (node.value is None
                                           or isinstance(node.value, (bool, int))):
            return node.value
        if isinstance(node, ListExpr):
            return [value(item) for item in node.items]
        raise ValueError(f"an index must be None, an integer, True / False or a list of them: "
                         f"{text!r}")

    def to_array(item: Any) -> np.ndarray | None:
        if item is None:
            return None
        leaves = np.asarray(item, dtype=object).reshape(-1)
        kinds = {isinstance(leaf, bool) for leaf in leaves}
        if len(kinds) > 1:
            raise ValueError(f"an index mixes True / False with integers: {text!r}")
        return np.asarray(item, np.bool_ if kinds == {True} else np.int64)

    return [to_array(item) for item in map(value, tree.items)]


def as_index(index: np.ndarray) -> np.ndarray:
    """An index array as torch reads it: uint8 is a mask (torch still accepts it so)."""
    return index.astype(np.bool_) if index.dtype == np.uint8 else index


@register_layer("Tensor.index")
class Index(Layer):
    """``x[i0, i1, ...]`` (aten::index): one index per leading dim, each an integer tensor, a
    bool mask, or None to keep that dim whole (``x[:, i]``). The indices are inputs after x
    (infer/rewrite.py unpacks pnnx's list ``[@0]`` and lists in ``masks`` the inputs annotated
    bool or u8) or, when pnnx folded them, the ``expr`` list. numpy's advanced indexing follows
    torch's rules: the index tensors broadcast together and their shape replaces the dims
    they index; a mask picks its True positions."""

    expr = Param(None, optional(index_list_text))
    masks = Param((), as_ints)
    one_blob_only = False

    def check_params(self) -> None:
        try:
            self._constants = None if self.expr is None else constant_indices(self.expr)
        except (ExpressionError, ValueError) as exc:
            raise LayerError(f"expr={self.expr!r}: {exc}") from None

    def _indices(self, items: Sequence[Any]) -> list[Any]:
        if len(items) > 1:
            return [None if index is None else as_index(np.asarray(index))
                    for index in map(optional_input, items[1:])]
        if self._constants is None:
            raise ShapeError("x[index] needs the tensor and at least one index")
        return self._constants

    @staticmethod
    def _take(x: np.ndarray, indices: Sequence[Any]) -> np.ndarray:
        if len(indices) > x.ndim:
            raise ShapeError(f"{len(indices)} indices for a tensor of {x.ndim} dims")
        try:
            return x[tuple(slice(None) if index is None else index for index in indices)]
        except IndexError as exc:                 # out of range, shapes that do not broadcast
            raise ShapeError(f"x[index] on {x.shape}: {exc}") from None

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        if len(input_shapes) == 1:                 # constants: the very indices
            probes = self._indices(input_shapes)
        else:                                      # an unknown value is None
            probes = []
            for number, (index_shape, value) in enumerate(zip(input_shapes[1:],
                                                               input_values[1:])):
                if value is not None:
                    probes.append(self._indices([None, value])[0])
                elif number in self.masks:
                    raise ShapeError(f"x[mask]: how many elements the bool mask (index "
                                     f"{number}) picks is known only while the graph runs, "
                                     f"and this runtime plans every shape before running")
                else:
                    probes.append(np.zeros(index_shape, np.intp))
        empty = np.broadcast_to(np.zeros((), np.uint8), shape)
        return [self._take(empty, probes).shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(self._take(inputs[0], self._indices(inputs)))]
