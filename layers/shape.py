"""Layers that change a tensor's shape or the order of its elements without arithmetic: the
identities, flatten / unflatten, reshape / view, permute / transpose, squeeze / unsqueeze,
expand / repeat / tile, flip, roll and channel shuffle.

Most of them return a *view* of their input when numpy can (as torch does). Such a view is
marked read-only, so that nobody, e.g. a later in-place activation, can write through it into
the input another operator may still read.

A shape argument the model computes from input sizes (``x.view(x.size(0), -1)``) comes as a
named input instead of a parameter (see ``NamedArgumentLayer``); the graph evaluates it while it
plans shapes. These layers also pass small known values on (``KnownValues``), so shape maths
that goes through a reshape or a slice is still known in advance.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from layers.base import (ArgumentInputLayer, Layer, NamedArgumentLayer, Param, Shape, as_int,
                         as_ints, normalize_dim, optional, param_or_input)
from layers.expression import SMALL_VALUE
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def read_only_alias(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``y``, made read-only if it shares memory with the input ``x``."""
    if np.may_share_memory(x, y):
        y = y.view()
        y.flags.writeable = False
    return y


class KnownValues:
    """Mixin for layers that only move data: when every input value is known while the graph
    plans shapes (shape arithmetic, small constants), the output values are known too."""

    def infer_values(self, input_shapes: Sequence[Shape],
                     input_values: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
        if any(v is None for v in input_values) or \
                sum(np.size(v) for v in input_values) > SMALL_VALUE:
            return None
        return self.forward([np.asarray(v) for v in input_values])


def normalize_dims(dims: Sequence[int], rank: int) -> tuple[int, ...]:
    """Every dim made non-negative (ShapeError when out of range); no dim may repeat."""
    result = tuple(normalize_dim(d, rank) for d in dims)
    if len(set(result)) != len(result):
        raise ShapeError(f"dims {tuple(dims)} name a dim twice for a tensor of rank {rank}")
    return result


@register_layer("nn.Identity", "nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d",
                "nn.AlphaDropout", "nn.FeatureAlphaDropout", "F.dropout", "F.dropout1d",
                "F.dropout2d", "F.dropout3d", "F.alpha_dropout", "F.feature_alpha_dropout",
                "Tensor.contiguous", "Tensor.clone", "torch.clone")
class Identity(KnownValues, Layer):
    """y = x. Dropout is the identity at inference (eval mode); pnnx usually drops all of these
    when it exports, but a hand-written graph may still contain them. A clone may share the
    input's memory here, because the output is read-only."""

    views_input = True

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x, x)


# ----- flatten / unflatten / reshape ----------------------------------------------------------

def flatten_output_shape(shape: Shape, start_dim: int, end_dim: int) -> Shape:
    """Merge dims start_dim..end_dim (inclusive, negative from the end) into one."""
    if len(shape) == 0:
        return (1,)                                  # torch: a scalar flattens to (1,)
    start, end = normalize_dim(start_dim, len(shape)), normalize_dim(end_dim, len(shape))
    if start > end:
        raise ShapeError(f"start_dim={start_dim} comes after end_dim={end_dim} for a tensor of "
                         f"rank {len(shape)}")
    return (*shape[:start], math.prod(shape[start:end + 1]), *shape[end + 1:])


@register_layer("torch.flatten", "Tensor.flatten")
class Flatten(KnownValues, Layer):
    """``torch.flatten(x, start_dim=0, end_dim=-1)``: dims start..end become one dim, e.g.
    (N, C, H, W) with start_dim=1 -> (N, C*H*W)."""

    views_input = True

    start_dim = Param(0, as_int)
    end_dim = Param(-1, as_int)

    def infer_shape(self, shape: Shape) -> Shape:
        return flatten_output_shape(shape, self.start_dim, self.end_dim)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.reshape(self.infer_shape(x.shape)), x)


@register_layer("nn.Flatten")
class FlattenModule(Flatten):
    """``nn.Flatten(start_dim=1, end_dim=-1)``: torch.flatten with the batch dim kept.
    (pnnx writes an nn.Flatten module as torch.flatten.)"""

    start_dim = Param(1, as_int)


def reshape_output_shape(in_shape: Shape, shape: Sequence[int]) -> Shape:
    """torch's reshape target: at most one -1, inferred so the element count stays the same."""
    total = math.prod(in_shape)
    shape = tuple(int(d) for d in shape)

    def error(why: str) -> ShapeError:
        return ShapeError(f"cannot reshape an input of shape {tuple(in_shape)} ({total} "
                          f"elements) to shape {shape}: {why}")

    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise error("only one dim may be -1, the others must be >= 0")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or total % known:
            raise error(f"no size for the -1 dim makes {total} elements")
        shape = tuple(total // known if d == -1 else d for d in shape)
    if math.prod(shape) != total:
        raise error(f"it holds {math.prod(shape)} elements")
    return shape


@register_layer("Tensor.unflatten", "torch.unflatten")
class Unflatten(KnownValues, NamedArgumentLayer):
    """``x.unflatten(dim, sizes)``: dim ``dim`` becomes the dims ``sizes`` (one may be -1),
    e.g. (N, 12, L) with dim=1, sizes=(3, -1) -> (N, 3, 4, L)."""

    views_input = True

    dim = Param(convert=as_int)
    sizes = Param(None, as_ints)
    INPUTS = ("input", "sizes")

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        dim = normalize_dim(self.dim, len(shape))
        sizes = reshape_output_shape((shape[dim],), self.argument("sizes", input_values))
        return [(*shape[:dim], *sizes, *shape[dim + 1:])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        (shape,) = self.infer_shapes_from([x.shape] + [a.shape for a in inputs[1:]], inputs)
        return [read_only_alias(x.reshape(shape), x)]


@register_layer("Tensor.reshape", "Tensor.view", "torch.reshape")
class Reshape(KnownValues, NamedArgumentLayer):
    """``x.reshape(shape)`` / ``x.view(shape)``: the same elements in row-major order, in a new
    shape; one entry may be -1 (inferred). pnnx writes the shape as the parameter ``shape``, or,
    when it depends on the input size, as a second input computed by a pnnx.Expression
    (``x.view(x.size(0), -1)`` -> ``[size(@0,0),-1]``)."""

    views_input = True

    shape = Param(None, as_ints)
    INPUTS = ("input", "shape")

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [reshape_output_shape(input_shapes[0], self._target(input_values))]

    def _target(self, items: Sequence[Any]) -> tuple[int, ...]:
        target = self.argument("shape", items)
        if target is None:
            raise ShapeError("needs the shape: a parameter or a second input")
        return target

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        shape = reshape_output_shape(x.shape, self._target(inputs))
        return [read_only_alias(x.reshape(shape), x)]


@register_layer("Tensor.reshape_as", "Tensor.view_as", "aten::view_as")
class ReshapeAs(Layer):
    """``x.reshape_as(other)`` / ``x.view_as(other)``: x's elements in other's shape."""

    views_input = True

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, other), got {len(input_shapes)}")
        return [reshape_output_shape(input_shapes[0], input_shapes[1])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        (shape,) = self.infer_shapes([a.shape for a in inputs])
        return [read_only_alias(inputs[0].reshape(shape), inputs[0])]


# ----- permute / transpose ----------------------------------------------------------------------

@register_layer("Tensor.permute", "torch.permute")
class Permute(KnownValues, Layer):
    """``x.permute(dims)``: output dim i is input dim dims[i] (negative dims count from the
    end), e.g. (N, C, H, W) with dims=(0, 2, 3, 1) -> (N, H, W, C)."""

    views_input = True

    dims = Param(convert=as_ints)

    def _axes(self, rank: int) -> tuple[int, ...]:
        if len(self.dims) != rank:
            raise ShapeError(f"dims={self.dims} has {len(self.dims)} entries for an input of "
                             f"rank {rank}")
        return normalize_dims(self.dims, rank)

    def infer_shape(self, shape: Shape) -> Shape:
        return tuple(shape[axis] for axis in self._axes(len(shape)))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.transpose(self._axes(x.ndim)), x)


@register_layer("aten::movedim")
class MoveDim(NamedArgumentLayer):
    """torch.movedim(x, source, destination): dims ``source`` (one or several) move to the
    positions ``destination``, the others keep their order; a view, as np.moveaxis. pnnx
    writes both arguments as inputs (pnnx.Expression constants)."""

    views_input = True

    INPUTS = ("input", "source", "destination")
    source = Param(None, optional(as_ints))
    destination = Param(None, optional(as_ints))

    def _order(self, items, rank: int) -> list[int]:
        source, destination = self.argument("source", items), self.argument("destination", items)
        if source is None or destination is None:
            raise ShapeError("needs its source and destination dims (inputs 1 and 2)")
        source, destination = normalize_dims(source, rank), normalize_dims(destination, rank)
        if len(source) != len(destination):
            raise ShapeError(f"source {source} and destination {destination} name different "
                             f"numbers of dims")
        rest = iter(d for d in range(rank) if d not in source)
        placed = dict(zip(destination, source))
        return [placed[i] if i in placed else next(rest) for i in range(rank)]

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        return [tuple(shape[axis] for axis in self._order(input_values, len(shape)))]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        return [read_only_alias(x.transpose(self._order(inputs, x.ndim)), x)]


@register_layer("aten::tril", "aten::triu")
class Triangle(NamedArgumentLayer):
    """torch.tril(x, diagonal) keeps the values on and below the ``diagonal``-th diagonal of
    the last two dims (triu: on and above) and zeroes the rest; a batch of matrices is done
    matrix by matrix."""

    INPUTS = ("input", "diagonal")
    diagonal = Param(0, as_int)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        if len(shape) < 2:
            raise ShapeError(f"needs a tensor of rank 2 or more, got shape {shape}")
        return [shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes_from([a.shape for a in inputs], list(inputs))
        keep = np.tril if self.type == "aten::tril" else np.triu
        return [keep(inputs[0], self.argument("diagonal", inputs))]


@register_layer("torch.transpose", "Tensor.transpose")
class Transpose(KnownValues, Layer):
    """``torch.transpose(x, dim0, dim1)``: swap two dims (negative dims count from the end)."""

    views_input = True

    dim0 = Param(convert=as_int)
    dim1 = Param(convert=as_int)

    def _axes(self, rank: int) -> list[int]:
        axes = list(range(rank))
        a, b = normalize_dim(self.dim0, rank), normalize_dim(self.dim1, rank)
        axes[a], axes[b] = axes[b], axes[a]
        return axes

    def infer_shape(self, shape: Shape) -> Shape:
        return tuple(shape[axis] for axis in self._axes(len(shape)))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.transpose(self._axes(x.ndim)), x)


@register_layer("torch.t", "Tensor.t")
class MatrixTranspose(Transpose):
    """``x.t()``: a matrix transposed; a 0-D or 1-D tensor is returned as it is."""

    dim0, dim1 = 0, -1                              # constants, not parameters

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) > 2:
            raise ShapeError(f"t() expects a tensor of at most 2 dims, got shape {shape}")
        return tuple(reversed(shape))

    def _axes(self, rank: int) -> list[int]:
        return list(reversed(range(rank)))


@register_layer("aten::numpy_T", "Tensor.T")
class ReverseDims(MatrixTranspose):
    """``x.T``: all dims in reverse order."""

    def infer_shape(self, shape: Shape) -> Shape:
        return tuple(reversed(shape))


@register_layer("aten::mT", "Tensor.mT")
class SwapLastTwo(Transpose):
    """``x.mT``: the last two dims swapped (a batch of matrices transposed)."""

    dim0, dim1 = -2, -1                             # constants, not parameters

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) < 2:
            raise ShapeError(f"mT expects a tensor of at least 2 dims, got shape {shape}")
        return super().infer_shape(shape)


# ----- squeeze / unsqueeze ----------------------------------------------------------------------

@register_layer("torch.squeeze", "Tensor.squeeze")
class Squeeze(KnownValues, Layer):
    """``torch.squeeze(x, dim=None)``: drop the named dims (an int or a tuple; negative from
    the end) that have size 1, or every size-1 dim when no dim is given. A named dim of another
    size stays, as in torch."""

    views_input = True

    dim = Param(None, as_ints)

    def _axes(self, shape: Shape) -> tuple[int, ...]:
        if self.dim is None:
            return tuple(i for i, size in enumerate(shape) if size == 1)
        rank = max(len(shape), 1)                        # a 0-D tensor takes dim 0 or -1
        dims = {normalize_dim(d, rank) for d in self.dim}
        return tuple(i for i in sorted(dims) if i < len(shape) and shape[i] == 1)

    def infer_shape(self, shape: Shape) -> Shape:
        drop = self._axes(shape)
        return tuple(size for i, size in enumerate(shape) if i not in drop)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.reshape(self.infer_shape(x.shape)), x)


@register_layer("torch.unsqueeze", "Tensor.unsqueeze")
class Unsqueeze(KnownValues, Layer):
    """``torch.unsqueeze(x, dim)``: insert a size-1 dim at ``dim`` of the OUTPUT (-1 appends
    one at the end), e.g. (C, H, W) with dim=0 -> (1, C, H, W)."""

    views_input = True

    dim = Param(convert=as_int)

    def infer_shape(self, shape: Shape) -> Shape:
        dim = normalize_dim(self.dim, len(shape) + 1)
        return (*shape[:dim], 1, *shape[dim:])

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.reshape(self.infer_shape(x.shape)), x)


# ----- expand / repeat / tile ------------------------------------------------------------------

def expand_output_shape(shape: Shape, sizes: Sequence[int]) -> Shape:
    """torch's expand: ``sizes`` may add leading dims; -1 keeps a dim; a size-1 dim may grow to
    any size, the others must stay."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < len(shape):
        raise ShapeError(f"cannot expand shape {tuple(shape)} to {sizes}: fewer dims")
    new = len(sizes) - len(shape)
    out = []
    for i, size in enumerate(sizes):
        if i < new:
            if size < 0:
                raise ShapeError(f"cannot expand shape {tuple(shape)} to {sizes}: a new "
                                 f"leading dim cannot be {size}")
            out.append(size)
            continue
        have = shape[i - new]
        if size == -1 or size == have:
            out.append(have)
        elif have == 1 and size >= 0:
            out.append(size)
        else:
            raise ShapeError(f"cannot expand shape {tuple(shape)} to {sizes}: dim {i} has "
                             f"size {have}, which is not 1")
    return tuple(out)


@register_layer("Tensor.expand", "torch.expand")
class Expand(NamedArgumentLayer):
    """``x.expand(*sizes)``: size-1 dims broadcast to ``sizes`` (-1 keeps a dim, extra sizes
    add leading dims), e.g. (N, 1, W) with sizes=(N, 3, -1) -> (N, 3, W). No copy is made: the
    output is a read-only broadcast view. The sizes may be an input computed in the graph."""

    views_input = True

    sizes = Param(None, as_ints)
    INPUTS = ("input", "sizes")

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [expand_output_shape(input_shapes[0], self._sizes(input_values))]

    def _sizes(self, items: Sequence[Any]) -> tuple[int, ...]:
        sizes = self.argument("sizes", items)
        if sizes is None:
            raise ShapeError("needs the sizes: a parameter or a second input")
        return sizes

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        return [np.broadcast_to(x, expand_output_shape(x.shape, self._sizes(inputs)))]


@register_layer("Tensor.expand_as")
class ExpandAs(Layer):
    """``x.expand_as(other)``: x broadcast to other's shape (a read-only view)."""

    views_input = True

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, other), got {len(input_shapes)}")
        return [expand_output_shape(input_shapes[0], input_shapes[1])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        (shape,) = self.infer_shapes([a.shape for a in inputs])
        return [np.broadcast_to(inputs[0], shape)]


@register_layer("Tensor.repeat")
class Repeat(NamedArgumentLayer):
    """``x.repeat(*sizes)``: x tiled sizes[i] times along dim i; more sizes than dims add
    leading dims, e.g. (2, 3) with sizes=(2, 1, 2) -> (2, 2, 6)."""

    sizes = Param(None, as_ints)
    INPUTS = ("input", "sizes")

    def _sizes(self, rank: int, items: Sequence[Any]) -> tuple[int, ...]:
        sizes = self.argument("sizes", items)
        if sizes is None or len(sizes) < rank or any(s < 0 for s in sizes):
            raise ShapeError(f"repeat sizes {sizes} must be >= 0 and at least one per dim of "
                             f"the input (rank {rank})")
        return sizes

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        sizes = self._sizes(len(shape), input_values)
        shape = (1,) * (len(sizes) - len(shape)) + shape
        return [tuple(a * b for a, b in zip(shape, sizes))]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        return [np.tile(x, self._sizes(x.ndim, inputs))]


@register_layer("torch.repeat_interleave", "Tensor.repeat_interleave")
class RepeatInterleave(NamedArgumentLayer):
    """``torch.repeat_interleave(x, repeats, dim=None)``: each element repeated in place along
    ``dim`` (of the flattened x when dim is None), e.g. [a, b] with repeats=2 -> [a, a, b, b];
    repeats is one count, or one count per element along dim (np.repeat)."""

    repeats = Param(None, as_ints)
    dim = Param(None, optional(as_int))
    output_size = Param(None, optional(as_int))
    INPUTS = ("input", "repeats")

    def _plan(self, shape: Shape, items: Sequence[Any]) -> tuple[int | None, tuple[int, ...]]:
        """(axis or None for flattened, counts), checked as torch checks them."""
        repeats = self.argument("repeats", items)
        if repeats is None:
            raise ShapeError("repeat_interleave needs repeats")
        if self.dim is not None and not shape:
            raise ShapeError(f"a 0-d input repeats with dim=None, not dim={self.dim} (as torch)")
        dim = None if self.dim is None else normalize_dim(self.dim, len(shape))
        length = math.prod(shape) if dim is None else shape[dim]
        if any(r < 0 for r in repeats):
            raise ShapeError(f"repeats {repeats} must be >= 0")
        if len(repeats) != 1 and len(repeats) != length:
            raise ShapeError(f"repeats has {len(repeats)} counts for {length} elements along "
                             f"dim {self.dim} of {tuple(shape)}")
        return dim, repeats

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        dim, repeats = self._plan(shape, input_values)
        length = math.prod(shape) if dim is None else shape[dim]
        total = repeats[0] * length if len(repeats) == 1 else sum(repeats)
        if self.output_size is not None and self.output_size != total:
            raise ShapeError(f"output_size={self.output_size}, but the repeats make {total}")
        if dim is None:
            return [(total,)]
        return [shape[:dim] + (total,) + shape[dim + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        dim, repeats = self._plan(x.shape, inputs)
        counts = repeats[0] if len(repeats) == 1 else np.asarray(repeats)
        if dim is None:
            return [np.repeat(x.reshape(-1), counts)]
        return [np.repeat(x, counts, axis=dim)]


@register_layer("torch.tile", "Tensor.tile")
class Tile(Layer):
    """``torch.tile(x, dims)``: like repeat, but fewer dims than the input's rank are padded
    with 1s in front, e.g. (2, 3, 4) with dims=(2,) -> (2, 3, 8)."""

    dims = Param(convert=as_ints)

    def check_params(self) -> None:
        if any(d < 0 for d in self.dims):
            raise LayerError(f"dims={self.dims} must be >= 0")

    def infer_shape(self, shape: Shape) -> Shape:
        rank = max(len(shape), len(self.dims))
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        dims = (1,) * (rank - len(self.dims)) + self.dims
        return tuple(a * b for a, b in zip(shape, dims))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return np.tile(x, self.dims)


# ----- flip / roll ------------------------------------------------------------------------------

@register_layer("torch.flip", "Tensor.flip")
class Flip(KnownValues, Layer):
    """``torch.flip(x, dims)``: reverse the order of elements along each of ``dims``."""

    views_input = True

    dims = Param(convert=as_ints)

    def infer_shape(self, shape: Shape) -> Shape:
        normalize_dims(self.dims, len(shape))
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(np.flip(x, normalize_dims(self.dims, x.ndim)), x)


@register_layer("torch.roll", "Tensor.roll")
class Roll(KnownValues, Layer):
    """``torch.roll(x, shifts, dims=None)``: y[..., (i + shift) % n, ...] = x[..., i, ...]
    along each of ``dims``; without dims, x is rolled as one flat sequence and reshaped back."""

    shifts = Param(convert=as_ints)
    dims = Param(None, as_ints)

    def check_params(self) -> None:
        if self.dims is None and len(self.shifts) != 1:
            raise LayerError(f"shifts={self.shifts} needs dims, one per shift")
        if self.dims is not None and len(self.dims) != len(self.shifts):
            raise LayerError(f"shifts={self.shifts} and dims={self.dims} differ in length")

    def infer_shape(self, shape: Shape) -> Shape:
        if self.dims is not None:
            for dim in self.dims:
                normalize_dim(dim, len(shape))
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if self.dims is None:
            return np.roll(x.reshape(-1), self.shifts[0]).reshape(x.shape)
        axes = tuple(normalize_dim(d, x.ndim) for d in self.dims)
        return np.roll(x, self.shifts, axis=axes)


@register_layer("nn.ChannelShuffle", "aten::channel_shuffle")
class ChannelShuffle(ArgumentInputLayer):
    """``nn.ChannelShuffle(groups)`` (ShuffleNet): (N, C, *) with C = g * k channels read as
    a (g, k) grid and written out transposed: y[:, j * g + i] = x[:, i * k + j]. pnnx writes
    nn.ChannelShuffle for the module and for the ``view, transpose(1, 2), view`` idiom it
    recognises; ``F.channel_shuffle(x, g)`` becomes ``aten::channel_shuffle`` with the groups
    as a second input."""

    views_input = True

    groups = Param(None, as_int)

    def _groups(self, inputs: Sequence[Any]) -> int:
        groups = param_or_input(self.groups, "groups", inputs)
        groups = int(groups[0]) if isinstance(groups, np.ndarray) else groups
        if groups <= 0:
            raise LayerError(f"groups must be positive, got {groups}")
        return groups

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [self._checked(tuple(input_shapes[0]), self._groups(input_values))]

    @staticmethod
    def _checked(shape: Shape, groups: int) -> Shape:
        if len(shape) < 3:
            raise ShapeError(f"channel shuffle expects (N, C, *) of rank > 2, got {shape}")
        if shape[1] % groups:
            raise ShapeError(f"{shape[1]} channels cannot be split into {groups} groups")
        return shape

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, groups = inputs[0], self._groups(inputs)
        n, c, *rest = self._checked(x.shape, groups)
        y = x.reshape(n, groups, c // groups, *rest).swapaxes(1, 2)    # (N, k, g, *)
        # one group or one channel a group: the same order, x itself
        return [read_only_alias(np.ascontiguousarray(y).reshape(x.shape), x)]
