"""Layers that move or copy data without arithmetic: flatten, reshape, padding, concatenation,
and the identities (dropout in eval mode, nn.Identity, contiguous).

Flatten, reshape and the identities return a *view* of their input when numpy can (as torch
does). Such a view is marked read-only, so that nobody, e.g. a later in-place activation, can
write through it into the input another operator may still read.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (ArgumentInputLayer, Layer, Param, Shape, as_float, as_int, as_ints,
                         as_str, as_tuple, normalize_dim, param_or_input)
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def read_only_alias(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``y``, made read-only if it shares memory with the input ``x``."""
    if np.may_share_memory(x, y):
        y = y.view()
        y.flags.writeable = False
    return y


@register_layer("nn.Identity", "nn.Dropout", "nn.Dropout2d", "F.dropout", "F.dropout2d",
                "Tensor.contiguous")
class Identity(Layer):
    """y = x. Dropout is the identity at inference (eval mode); pnnx usually drops all of these
    when it exports, but a hand-written graph may still contain them."""

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x, x)


# ----- flatten / reshape --------------------------------------------------------------------

def flatten_output_shape(shape: Shape, start_dim: int, end_dim: int) -> Shape:
    """Merge dims start_dim..end_dim (inclusive, negative from the end) into one."""
    if len(shape) == 0:
        return (1,)                                  # torch: a scalar flattens to (1,)
    start, end = normalize_dim(start_dim, len(shape)), normalize_dim(end_dim, len(shape))
    if start > end:
        raise ShapeError(f"start_dim={start_dim} comes after end_dim={end_dim} for a tensor of "
                         f"rank {len(shape)}")
    return (*shape[:start], math.prod(shape[start:end + 1]), *shape[end + 1:])


@register_layer("torch.flatten")
class Flatten(Layer):
    """``torch.flatten(x, start_dim=0, end_dim=-1)``: dims start..end become one dim, e.g.
    (N, C, H, W) with start_dim=1 -> (N, C*H*W)."""

    PARAMS = {"start_dim": Param(0, as_int), "end_dim": Param(-1, as_int)}

    def infer_shape(self, shape: Shape) -> Shape:
        return flatten_output_shape(shape, self.start_dim, self.end_dim)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return read_only_alias(x.reshape(self.infer_shape(x.shape)), x)


@register_layer("nn.Flatten")
class FlattenModule(Flatten):
    """``nn.Flatten(start_dim=1, end_dim=-1)``: torch.flatten with the batch dim kept.
    (pnnx writes an nn.Flatten module as torch.flatten.)"""

    PARAMS = {"start_dim": Param(1, as_int), "end_dim": Param(-1, as_int)}


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


@register_layer("Tensor.reshape", "Tensor.view")
class Reshape(ArgumentInputLayer):
    """``x.reshape(shape)`` / ``x.view(shape)``: the same elements in row-major order, in a new
    shape; one entry may be -1 (inferred). pnnx writes the shape as the parameter ``shape``, or,
    when it depends on the input size, as a second input computed by a pnnx.Expression."""

    PARAMS = {"shape": Param(None, as_ints)}

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        target = param_or_input(self.shape, "shape", input_values)
        return [reshape_output_shape(input_shapes[0], target)]

    def forward(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        x = inputs[0]
        target = param_or_input(self.shape, "shape", inputs)
        return [read_only_alias(x.reshape(reshape_output_shape(x.shape, target)), x)]


# ----- padding ------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


@register_layer("F.pad")
class Pad(ArgumentInputLayer):
    """``F.pad(x, pad, mode, value)``: ``pad`` lists (before, after) pairs from the LAST dim
    backwards: (left, right) pads W, (left, right, top, bottom) pads W and H, and so on.

    mode 'constant' fills with ``value`` (None means 0); 'reflect' mirrors without repeating
    the edge; 'replicate' repeats the edge; 'circular' wraps around. Negative pads crop.

    When the model computes ``pad`` from the input's size (padding to a multiple of 8 in a
    dynamic export), pnnx passes it as a second input instead of the parameter.
    """

    PARAMS = {
        "pad": Param(None, as_ints),
        "mode": Param("constant", as_str),
        "value": Param(None, as_float),
    }

    def check_params(self) -> None:
        if self.mode not in _PAD_MODES:
            raise LayerError(f"mode must be one of {', '.join(_PAD_MODES)}, got {self.mode!r}")
        if self.mode != "constant" and self.value:
            raise LayerError(f"padding mode {self.mode!r} does not take a value "
                             f"(value={self.value})")
        if self.pad is not None and len(self.pad) % 2:
            raise LayerError(f"pad={self.pad} must have an even length")

    def _pad(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        """The pad parameter, or the second input's values (the kernel checks them)."""
        return tuple(int(p) for p in param_or_input(self.pad, "pad", inputs))

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [kernels.pad_output_shape(input_shapes[0], self._pad(input_values), self.mode)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        y = kernels.pad(x, self._pad(inputs), self.mode, self.value or 0.0)
        return [read_only_alias(y, x)]


@register_layer("nn.ZeroPad2d")
class ZeroPad2d(Pad):
    """``nn.ZeroPad2d(padding)``: pad W and H with zeros; padding is an int or
    (left, right, top, bottom)."""

    PARAMS = {"padding": Param(convert=as_tuple(4))}
    mode, value = "constant", None

    def check_params(self) -> None:
        self.pad = self.padding
        super().check_params()


@register_layer("nn.ConstantPad2d")
class ConstantPad2d(ZeroPad2d):
    """``nn.ConstantPad2d(padding, value)``: pad W and H with ``value``."""

    PARAMS = {"padding": Param(convert=as_tuple(4)), "value": Param(convert=as_float)}


@register_layer("nn.ReflectionPad2d")
class ReflectionPad2d(ZeroPad2d):
    """``nn.ReflectionPad2d(padding)``: pad W and H with their mirror image (edge excluded)."""

    mode = "reflect"


@register_layer("nn.ReplicationPad2d")
class ReplicationPad2d(ZeroPad2d):
    """``nn.ReplicationPad2d(padding)``: pad W and H by repeating the edge values."""

    mode = "replicate"


# ----- concatenation ------------------------------------------------------------------------

@register_layer("torch.cat")
class Cat(Layer):
    """``torch.cat(inputs, dim)``: join the inputs along ``dim``; every other dim must match."""

    PARAMS = {"dim": Param(0, as_int)}
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

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([x.shape for x in inputs])
        return [np.concatenate(inputs, axis=normalize_dim(self.dim, inputs[0].ndim))]
