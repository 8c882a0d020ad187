"""Normalization layers: batch, layer, group and instance norm, and F.normalize.

All of them compute ``(x - mean) / sqrt(var + eps)`` (biased variance) over some dims, then an
optional per-element affine ``* weight + bias``; they differ in which dims the statistics run
over and where they come from:

    batch norm      running statistics per channel (eval mode), or the batch's own statistics
                    over (N, *spatial) when there are none (track_running_stats=False)
    layer norm      each sample over its last len(normalized_shape) dims
    group norm      each sample over each group of C / G channels and the spatial dims
    instance norm   each sample over each channel's spatial dims (or running statistics)

pnnx usually folds a BatchNorm that follows a convolution into the convolution's weights, so
nn.BatchNorm* appears only for a BatchNorm with no convolution in front of it. The module
forms (nn.X) carry their weights in the bin file; the functional forms (F.x) take each tensor
argument as an input, and pnnx writes ``name=None`` for an absent one (``AN_INPUT``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import (AN_INPUT, Layer, NamedArgumentLayer, Param, Shape, as_bool, as_float,
                         as_int, as_ints, at_least, bind_inputs, expect_shape, normalize_dim,
                         optional_input, or_input)
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


class _BatchNorm(Layer):
    """Eval-mode batch norm over channel dim 1, folded into one multiply-add per channel::

        y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] + bias[c]
          = x * scale[c] + shift[c]            (scale, shift computed once, in load_model)

    weight and bias exist only when ``affine=True``.
    """

    num_features = Param(convert=at_least(1, as_int))
    eps = Param(1e-5, as_float)
    affine = Param(True, as_bool)
    WEIGHTS = ("running_mean", "running_var")
    OPTIONAL_WEIGHTS = ("weight", "bias")
    RANKS: tuple[int, ...] = ()                      # input ranks torch accepts

    def check_weights(self) -> None:
        if self.affine and (self.weight is None or self.bias is None):
            raise LayerError("affine=True but the @weight and @bias weights are missing")
        for key in self.WEIGHTS + self.OPTIONAL_WEIGHTS:
            if getattr(self, key) is not None:
                expect_shape(f"@{key}", getattr(self, key).shape, (self.num_features,))
        self.scale, self.shift = kernels.batch_norm_scale_shift(
            self.running_mean, self.running_var, self.weight, self.bias, self.eps)

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) not in self.RANKS:
            raise ShapeError(f"expects a {' or '.join(f'{r}-D' for r in self.RANKS)} input, got "
                             f"shape {tuple(shape)}")
        if shape[1] != self.num_features:
            raise ShapeError(f"input {tuple(shape)} has {shape[1]} channels, expected "
                             f"num_features={self.num_features}")
        return shape

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return kernels.channel_affine(x, self.scale, self.shift)


@register_layer("nn.BatchNorm2d")
class BatchNorm2d(_BatchNorm):
    """``nn.BatchNorm2d`` in eval mode: (N, C, H, W) -> (N, C, H, W)."""

    RANKS = (4,)


@register_layer("nn.BatchNorm1d")
class BatchNorm1d(_BatchNorm):
    """``nn.BatchNorm1d`` in eval mode: (N, C) or (N, C, L), same shape out."""

    RANKS = (2, 3)


# ----- the shared kernel ------------------------------------------------------------------------

def normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) with mean and biased variance over ``axes`` (a new array).
    The variance is the mean of the squared deviations, as torch computes it (not E[x^2] -
    E[x]^2, which cancels badly)."""
    y = x - x.mean(axis=axes, keepdims=True)
    var = np.mean(y * y, axis=axes, keepdims=True)
    var += x.dtype.type(eps)
    y /= np.sqrt(var)
    return y


def _affine(y: np.ndarray, weight, bias, shape: Sequence[int]) -> np.ndarray:
    """y * weight + bias, each reshaped to ``shape`` (None skips it); in place on y."""
    if weight is not None:
        y *= np.asarray(weight, dtype=y.dtype).reshape(shape)
    if bias is not None:
        y += np.asarray(bias, dtype=y.dtype).reshape(shape)
    return y


def _channel_shape(rank: int) -> tuple[int, ...]:
    return (-1,) + (1,) * (rank - 2)                         # (C, 1, 1) for NCHW


def _check_channel_vectors(names: Sequence[str], values: Sequence, channels: int) -> None:
    """Per-channel tensors (weights, statistics) must have ``channels`` elements."""
    for name, value in zip(names, values):
        if value is None:
            continue
        shape = value.shape if isinstance(value, np.ndarray) else tuple(value)
        if tuple(shape) != (channels,):
            raise ShapeError(f"{name} has shape {tuple(shape)}, expected ({channels},) for an "
                             f"input with {channels} channels")


# ----- F.batch_norm -----------------------------------------------------------------------------

@register_layer("F.batch_norm")
class FunctionalBatchNorm(Layer):
    """``F.batch_norm(input, running_mean, running_var, weight, bias, eps=eps)``: with running
    statistics, eval-mode batch norm; without (pnnx writes ``running_mean=None``: a BatchNorm
    with track_running_stats=False, or F.batch_norm(..., training=True)), the batch's own mean
    and biased variance per channel over (N, *spatial)."""

    ARGUMENTS = ("running_mean", "running_var", "weight", "bias")
    running_mean = Param(AN_INPUT, or_input())
    running_var = Param(AN_INPUT, or_input())
    weight = Param(AN_INPUT, or_input())
    bias = Param(AN_INPUT, or_input())
    eps = Param(1e-5, as_float)
    one_blob_only = False

    def check_params(self) -> None:
        if (self.running_mean is None) != (self.running_var is None):
            raise LayerError("running_mean and running_var must both be given or both be None")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        args = bind_inputs(self, self.ARGUMENTS, input_shapes)
        shape = tuple(input_shapes[0])
        if len(shape) < 2:
            raise ShapeError(f"expects an (N, C, ...) input, got shape {shape}")
        _check_channel_vectors(self.ARGUMENTS, [args[n] for n in self.ARGUMENTS], shape[1])
        return [shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x = inputs[0]
        args = bind_inputs(self, self.ARGUMENTS, inputs)
        if args["running_mean"] is not None:
            return [kernels.batch_norm(x, args["running_mean"], args["running_var"],
                                       args["weight"], args["bias"], self.eps)]
        axes = (0,) + tuple(range(2, x.ndim))                 # batch statistics per channel
        y = normalize(x, axes, self.eps)
        return [_affine(y, args["weight"], args["bias"], _channel_shape(x.ndim))]


# ----- layer norm -------------------------------------------------------------------------------

class _LayerNormBase(Layer):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, statistics of each sample over the
    last len(normalized_shape) dims; weight and bias have shape normalized_shape."""

    normalized_shape = Param(convert=at_least(1, as_ints))
    eps = Param(1e-5, as_float)

    def check_input(self, shape: Shape) -> Shape:
        tail = len(self.normalized_shape)
        if tuple(shape[len(shape) - tail:]) != self.normalized_shape or len(shape) < tail:
            raise ShapeError(f"input {tuple(shape)} does not end with normalized_shape "
                             f"{self.normalized_shape}")
        return tuple(shape)

    def layer_norm(self, x: np.ndarray, weight, bias) -> np.ndarray:
        axes = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        return _affine(normalize(x, axes, self.eps), weight, bias, self.normalized_shape)


@register_layer("nn.LayerNorm")
class LayerNorm(_LayerNormBase):
    """``nn.LayerNorm``: weight and bias (elementwise_affine=True) in the bin file."""

    elementwise_affine = Param(True, as_bool)
    OPTIONAL_WEIGHTS = ("weight", "bias")

    def check_weights(self) -> None:
        if self.elementwise_affine and self.weight is None:
            raise LayerError("elementwise_affine=True but the @weight is missing")
        for key in ("weight", "bias"):
            if getattr(self, key) is not None:
                expect_shape(f"@{key}", getattr(self, key).shape, self.normalized_shape)

    def infer_shape(self, shape: Shape) -> Shape:
        return self.check_input(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.check_input(x.shape)
        return self.layer_norm(x, self.weight, self.bias)


@register_layer("F.layer_norm")
class FunctionalLayerNorm(_LayerNormBase):
    """``F.layer_norm(input, normalized_shape, weight, bias, eps)``; weight / bias as inputs."""

    ARGUMENTS = ("weight", "bias")
    weight = Param(AN_INPUT, or_input())
    bias = Param(AN_INPUT, or_input())
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        args = bind_inputs(self, self.ARGUMENTS, input_shapes)
        for name in self.ARGUMENTS:
            if args[name] is not None:
                expect_shape(name, args[name], self.normalized_shape, ShapeError)
        return [self.check_input(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        args = bind_inputs(self, self.ARGUMENTS, inputs)
        return [self.layer_norm(inputs[0], args["weight"], args["bias"])]


# ----- RMS norm ---------------------------------------------------------------------------------

class _RMSNormBase(_LayerNormBase):
    """y = x / sqrt(mean(x^2) + eps) * weight, the mean over the last len(normalized_shape)
    dims (no centring, no bias: LLaMA-style transformers). ``eps=None`` is torch's default,
    the machine epsilon of x's dtype."""

    eps = Param(None, as_float)

    def rms_norm(self, x: np.ndarray, weight) -> np.ndarray:
        axes = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        eps = np.finfo(x.dtype).eps if self.eps is None else self.eps
        mean_square = np.mean(np.square(x), axis=axes, keepdims=True)    # (..., 1, 1)
        y = x / np.sqrt(mean_square + x.dtype.type(eps))
        return y if weight is None else y * weight


@register_layer("nn.RMSNorm")
class RMSNorm(_RMSNormBase):
    """``nn.RMSNorm``: the weight (elementwise_affine=True) in the bin file."""

    elementwise_affine = Param(True, as_bool)
    OPTIONAL_WEIGHTS = ("weight",)

    def check_weights(self) -> None:
        if self.elementwise_affine and self.weight is None:
            raise LayerError("elementwise_affine=True but the @weight is missing")
        if self.weight is not None:
            expect_shape("@weight", self.weight.shape, self.normalized_shape)

    def infer_shape(self, shape: Shape) -> Shape:
        return self.check_input(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.check_input(x.shape)
        return self.rms_norm(x, self.weight)


@register_layer("F.rms_norm")
class FunctionalRMSNorm(_RMSNormBase):
    """``F.rms_norm(input, normalized_shape, weight, eps)``; the weight as an input."""

    ARGUMENTS = ("weight",)
    weight = Param(AN_INPUT, or_input())
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        args = bind_inputs(self, self.ARGUMENTS, input_shapes)
        if args["weight"] is not None:
            expect_shape("weight", args["weight"], self.normalized_shape, ShapeError)
        return [self.check_input(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        args = bind_inputs(self, self.ARGUMENTS, inputs)
        return [self.rms_norm(inputs[0], args["weight"])]


# ----- group norm -------------------------------------------------------------------------------

class _GroupNormBase(Layer):
    """y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c], statistics of each sample over
    each of num_groups groups of C / num_groups channels and all spatial positions."""

    num_groups: int                                  # parameters of the subclasses
    eps: float

    def check_input(self, shape: Shape) -> Shape:
        if len(shape) < 2:
            raise ShapeError(f"expects an (N, C, ...) input, got shape {tuple(shape)}")
        if shape[1] % self.num_groups:
            raise ShapeError(f"input {tuple(shape)}: {shape[1]} channels do not split into "
                             f"num_groups={self.num_groups} groups")
        return tuple(shape)

    def group_norm(self, x: np.ndarray, weight, bias) -> np.ndarray:
        n, c = x.shape[:2]
        grouped = x.reshape(n, self.num_groups, -1)          # (N, G, C/G * spatial)
        y = normalize(grouped, (2,), self.eps).reshape(x.shape)
        return _affine(y, weight, bias, _channel_shape(x.ndim))


@register_layer("nn.GroupNorm")
class GroupNorm(_GroupNormBase):
    """``nn.GroupNorm``: weight and bias (affine=True) in the bin file."""

    num_groups = Param(convert=at_least(1, as_int))
    num_channels = Param(convert=at_least(1, as_int))
    eps = Param(1e-5, as_float)
    affine = Param(True, as_bool)
    OPTIONAL_WEIGHTS = ("weight", "bias")

    def check_params(self) -> None:
        if self.num_channels % self.num_groups:
            raise LayerError(f"num_channels={self.num_channels} is not divisible by "
                             f"num_groups={self.num_groups}")

    def check_weights(self) -> None:
        if self.affine and (self.weight is None or self.bias is None):
            raise LayerError("affine=True but the @weight and @bias weights are missing")
        for key in ("weight", "bias"):
            if getattr(self, key) is not None:
                expect_shape(f"@{key}", getattr(self, key).shape, (self.num_channels,))

    def infer_shape(self, shape: Shape) -> Shape:
        self.check_input(shape)
        if shape[1] != self.num_channels:
            raise ShapeError(f"input {tuple(shape)} has {shape[1]} channels, expected "
                             f"num_channels={self.num_channels}")
        return tuple(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        return self.group_norm(x, self.weight, self.bias)


@register_layer("F.group_norm")
class FunctionalGroupNorm(_GroupNormBase):
    """``F.group_norm(input, num_groups, weight, bias, eps)``; weight / bias as inputs."""

    ARGUMENTS = ("weight", "bias")
    num_groups = Param(convert=at_least(1, as_int))
    eps = Param(1e-5, as_float)
    weight = Param(AN_INPUT, or_input())
    bias = Param(AN_INPUT, or_input())
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        args = bind_inputs(self, self.ARGUMENTS, input_shapes)
        shape = self.check_input(input_shapes[0])
        _check_channel_vectors(self.ARGUMENTS, [args[n] for n in self.ARGUMENTS], shape[1])
        return [shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        args = bind_inputs(self, self.ARGUMENTS, inputs)
        return [self.group_norm(inputs[0], args["weight"], args["bias"])]


# ----- instance norm ----------------------------------------------------------------------------

def instance_norm(x: np.ndarray, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, eps: float = 1e-5) -> np.ndarray:
    """``F.instance_norm``: each (sample, channel) normalized over its spatial dims; with
    ``use_input_stats=False`` the running statistics are used instead (= eval batch norm)."""
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise LayerError("use_input_stats=False needs running_mean and running_var")
        return kernels.batch_norm(x, running_mean, running_var, weight, bias, eps)
    y = normalize(x, tuple(range(2, x.ndim)), eps)
    return _affine(y, weight, bias, _channel_shape(x.ndim))


def _check_instance_input(shape: Shape, ranks: tuple[int, ...]) -> None:
    if len(shape) not in ranks:
        raise ShapeError(f"expects a {' or '.join(f'{r}-D' for r in ranks)} input, got shape "
                         f"{tuple(shape)}")


class _InstanceNorm(Layer):
    """``nn.InstanceNorm1d/2d``: batch (N, C, *spatial) or unbatched (C, *spatial) input.
    With track_running_stats=True, eval mode uses the running statistics from the bin file."""

    num_features = Param(convert=at_least(1, as_int))
    eps = Param(1e-5, as_float)
    affine = Param(False, as_bool)
    track_running_stats = Param(False, as_bool)
    OPTIONAL_WEIGHTS = ("weight", "bias", "running_mean", "running_var")
    SPATIAL = 1

    def check_weights(self) -> None:
        if self.affine and (self.weight is None or self.bias is None):
            raise LayerError("affine=True but the @weight and @bias weights are missing")
        if self.track_running_stats and (self.running_mean is None or self.running_var is None):
            raise LayerError("track_running_stats=True but @running_mean and @running_var "
                             "are missing")
        for key in self.OPTIONAL_WEIGHTS:
            if getattr(self, key) is not None:
                expect_shape(f"@{key}", getattr(self, key).shape, (self.num_features,))

    def infer_shape(self, shape: Shape) -> Shape:
        _check_instance_input(shape, (self.SPATIAL + 1, self.SPATIAL + 2))
        channels = shape[-self.SPATIAL - 1]
        if channels != self.num_features:
            raise ShapeError(f"input {tuple(shape)} has {channels} channels, expected "
                             f"num_features={self.num_features}")
        return tuple(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        batched = x if x.ndim == self.SPATIAL + 2 else x[None]
        y = instance_norm(batched, self.running_mean, self.running_var, self.weight, self.bias,
                          not self.track_running_stats, self.eps)
        return y if x.ndim == self.SPATIAL + 2 else y[0]


@register_layer("nn.InstanceNorm1d")
class InstanceNorm1d(_InstanceNorm):
    """(N, C, L) or (C, L)"""

    SPATIAL = 1


@register_layer("nn.InstanceNorm2d")
class InstanceNorm2d(_InstanceNorm):
    """(N, C, H, W) or (C, H, W)"""

    SPATIAL = 2


@register_layer("F.instance_norm")
class FunctionalInstanceNorm(Layer):
    """``F.instance_norm(input, running_mean, running_var, weight, bias, eps=eps)`` with the
    input's own statistics; the tensor arguments are inputs (or None)."""

    ARGUMENTS = ("running_mean", "running_var", "weight", "bias")
    running_mean = Param(AN_INPUT, or_input())
    running_var = Param(AN_INPUT, or_input())
    weight = Param(AN_INPUT, or_input())
    bias = Param(AN_INPUT, or_input())
    eps = Param(1e-5, as_float)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        args = bind_inputs(self, self.ARGUMENTS, input_shapes)
        shape = tuple(input_shapes[0])
        _check_instance_input(shape, (3, 4, 5))
        _check_channel_vectors(self.ARGUMENTS, [args[n] for n in self.ARGUMENTS], shape[1])
        return [shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        args = bind_inputs(self, self.ARGUMENTS, inputs)
        return [instance_norm(inputs[0], args["running_mean"], args["running_var"],
                              args["weight"], args["bias"], True, self.eps)]


def _flag(value, name: str):
    value = np.asarray(value)
    if value.shape != () or value.dtype.kind not in "biuf":
        raise LayerError(f"{name} must be a single value, got {value!r}")
    return value.item()


@register_layer("aten::instance_norm")
class AtenInstanceNorm(Layer):
    """``aten::instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
    momentum, eps, cudnn_enabled)``: what pnnx writes for an nn.InstanceNorm with
    track_running_stats=True. Every argument is an input; the flags and numbers come from
    pnnx.Expression constants (``True``, ``1.000000e-05``, ``None`` for an absent tensor)."""

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 9:
            raise ShapeError(f"expects 9 inputs (input, weight, bias, running_mean, "
                             f"running_var, use_input_stats, momentum, eps, cudnn_enabled), "
                             f"got {len(input_shapes)}")
        _check_instance_input(input_shapes[0], (3, 4, 5))
        return [tuple(input_shapes[0])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        x, weight, bias, mean, var, use_input_stats, _, eps, _ = inputs
        weight, bias, mean, var = (optional_input(v) for v in (weight, bias, mean, var))
        _check_channel_vectors(("weight", "bias", "running_mean", "running_var"),
                               (weight, bias, mean, var), x.shape[1])
        return [instance_norm(x, mean, var, weight, bias,
                              bool(_flag(use_input_stats, "use_input_stats")),
                              float(_flag(eps, "eps")))]


# ----- F.normalize ------------------------------------------------------------------------------

@register_layer("F.normalize")
class Normalize(Layer):
    """``F.normalize``: y = x / max(||x||_p, eps) along ``dim``, with ||x||_p = (sum |x|^p)^(1/p)
    (p=inf: max |x|; p=0: the number of nonzero values, as torch.linalg.vector_norm)."""

    p = Param(2.0, as_float)
    dim = Param(1, as_int)
    eps = Param(1e-12, as_float)

    def infer_shape(self, shape: Shape) -> Shape:
        normalize_dim(self.dim, len(shape))
        return tuple(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        axis = normalize_dim(self.dim, x.ndim) if x.ndim else None
        norm = kernels.vector_norm(x, self.p, axis, keepdims=True)
        return x / np.maximum(norm, x.dtype.type(self.eps))


@register_layer("aten::cosine_similarity")
class CosineSimilarity(NamedArgumentLayer):
    """F.cosine_similarity(x1, x2, dim, eps): sum(x1 * x2) / max(||x1|| * ||x2||, eps) along
    ``dim``, after x1 and x2 broadcast to one shape; the dim is dropped."""

    INPUTS = ("x1", "x2", "dim", "eps")
    dim = Param(1, as_int)
    eps = Param(1e-8, as_float)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        if len(input_shapes) < 2:
            raise ShapeError(f"expects 2 tensors (x1, x2), got {len(input_shapes)} inputs")
        try:
            shape = tuple(np.broadcast_shapes(tuple(input_shapes[0]), tuple(input_shapes[1])))
        except ValueError:
            raise ShapeError(f"x1 {tuple(input_shapes[0])} and x2 {tuple(input_shapes[1])} do "
                             f"not broadcast") from None
        axis = normalize_dim(self.argument("dim", input_values), len(shape))
        return [shape[:axis] + shape[axis + 1:]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        (shape,) = self.infer_shapes_from([a.shape for a in inputs], list(inputs))
        x1, x2 = np.broadcast_arrays(inputs[0], inputs[1])
        axis = normalize_dim(self.argument("dim", inputs), x1.ndim)
        eps = x1.dtype.type(self.argument("eps", inputs))
        with np.errstate(all="ignore"):
            dot = np.sum(x1 * x2, axis=axis)
            norms = kernels.vector_norm(x1, 2, axis) * kernels.vector_norm(x2, 2, axis)
            return [np.asarray(dot / np.maximum(norms, eps), dtype=x1.dtype).reshape(shape)]


@register_layer("aten::cdist")
class CDist(NamedArgumentLayer):
    """torch.cdist(x1, x2, p): the p-norm distance between every row of x1 (..., P, M) and
    every row of x2 (..., R, M) -> (..., P, R), batch dims broadcast. p = 0 counts the
    differing coordinates, p = inf takes the largest difference. Computed from the
    differences themselves (torch may use a matrix product for p = 2 on large inputs, which
    differs by float32 rounding)."""

    INPUTS = ("x1", "x2", "p", "compute_mode")
    p = Param(2.0, as_float)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        if len(input_shapes) < 2:
            raise ShapeError(f"expects 2 tensors (x1, x2), got {len(input_shapes)} inputs")
        a, b = tuple(input_shapes[0]), tuple(input_shapes[1])
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-1]:
            raise ShapeError(f"x1 {a} and x2 {b} must be (..., P, M) and (..., R, M)")
        if self.argument("p", input_values) < 0:
            raise ShapeError("p must be >= 0")
        try:
            batch = tuple(np.broadcast_shapes(a[:-2], b[:-2]))
        except ValueError:
            raise ShapeError(f"the batch dims of x1 {a} and x2 {b} do not broadcast") from None
        return [batch + (a[-2], b[-2])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        (shape,) = self.infer_shapes_from([a.shape for a in inputs], list(inputs))
        x1, x2 = inputs[0], inputs[1]
        p = self.argument("p", inputs)
        batch = shape[:-2]
        x1 = np.broadcast_to(x1, batch + x1.shape[-2:]).reshape(-1, *x1.shape[-2:])
        x2 = np.broadcast_to(x2, batch + x2.shape[-2:]).reshape(-1, *x2.shape[-2:])
        dtype = np.result_type(x1, x2)
        y = np.empty((x1.shape[0], x1.shape[1], x2.shape[1]), dtype)
        with np.errstate(all="ignore"):
            for i in range(x1.shape[0]):             # one batch at a time: (P, R, M) at most
                y[i] = kernels.vector_norm(x1[i][:, None, :] - x2[i][None, :, :], p, -1)
        return [y.reshape(shape)]


@register_layer("nn.LocalResponseNorm", "F.local_response_norm")
class LocalResponseNorm(Layer):
    """``nn.LocalResponseNorm(size, alpha, beta, k)`` across channels (dim 1):
    y[c] = x[c] / (k + alpha / size * sum of x[c']^2 over the ``size`` channels around c)^beta,
    the window running from c - size // 2 to c + (size - 1) // 2, zeros past the edges."""

    size = Param(convert=at_least(1, as_int))
    alpha = Param(1e-4, as_float)
    beta = Param(0.75, as_float)
    k = Param(1.0, as_float)

    def infer_shape(self, shape: Shape) -> Shape:
        if len(shape) < 3:
            raise ShapeError(f"needs (N, C, ...) with at least 3 dims, got {tuple(shape)}")
        return tuple(shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        self.infer_shape(x.shape)
        squares = x * x
        before, after = self.size // 2, (self.size - 1) // 2
        pads = [(0, 0)] * x.ndim
        pads[1] = (before + 1, after)                 # one more zero in front, for the differences
        running = np.cumsum(np.pad(squares, pads), axis=1, dtype=np.float64)
        channels = x.shape[1]
        window = (np.take(running, np.arange(self.size, self.size + channels), axis=1)
                  - np.take(running, np.arange(channels), axis=1))
        scale = (self.k + self.alpha / self.size * window).astype(x.dtype)
        with np.errstate(all="ignore"):
            return x / scale ** x.dtype.type(self.beta)
