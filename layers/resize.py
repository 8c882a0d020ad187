"""Resizing: ``F.interpolate`` and its older names and modules (F.upsample, F.upsample_nearest,
F.upsample_bilinear, nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d), and
pixel_shuffle / pixel_unshuffle.

Interpolation is separable: each spatial dim is resampled on its own, every output position
reading 1 (nearest), 2 (linear) or 4 (cubic) input positions with weights. Where an output
position o reads from follows torch exactly, in float32 as torch computes it:

    scale = 1 / scale_factor when a scale factor was given, else in_size / out_size
    nearest        src = min(floor(o * scale), in - 1)
    nearest-exact  src = min(floor((o + 0.5) * scale), in - 1)
    linear / cubic src = (o + 0.5) * scale - 0.5          (align_corners=False; linear: >= 0)
                   src = o * (in - 1) / (out - 1)        (align_corners=True)

linear mixes x[floor(src)] and x[floor(src) + 1] by the fraction of src; cubic mixes the four
neighbours floor(src) - 1 .. floor(src) + 2 (clamped to the edge) with Keys' cubic convolution
weights, a = -0.75. bilinear / bicubic / trilinear are linear / cubic along each dim.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from layers.base import (Layer, NamedArgumentLayer, Param, Shape, as_bool, as_float, as_int,
                         as_ints, as_str, optional)
from layers.registry import register_layer
from layers.shape import read_only_alias
from parser.errors import LayerError, ShapeError

MODES = {"nearest": None, "nearest-exact": None, "linear": 1, "bilinear": 2, "bicubic": 2,
         "trilinear": 3}                   # mode -> the number of spatial dims it requires
CUBIC_A = -0.75


def as_floats(value: Any) -> tuple[float, ...]:
    """A number or a sequence of numbers -> tuple of floats."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.number)) for v in values):
        raise TypeError(f"expected numbers, got {value!r}")
    return tuple(float(v) for v in values)


def per_dim(values: tuple | None, dims: int, what: str) -> tuple | None:
    """One value per spatial dim: a single value is repeated."""
    if values is None:
        return None
    if len(values) == 1:
        return values * dims
    if len(values) != dims:
        raise ShapeError(f"{what}={values} has {len(values)} entries for {dims} spatial dims")
    return values


# ----- where each output position reads from ------------------------------------------------

def source_scale(in_size: int, out_size: int, scale_factor: float | None,
                 align_corners: bool = False) -> np.float32:
    """torch's input step per output step (area_pixel_compute_scale), in float32."""
    if align_corners:
        return np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 \
            else np.float32(0)
    if scale_factor is not None and scale_factor > 0:
        return np.float32(1.0 / scale_factor)
    return np.float32(in_size) / np.float32(out_size)


def nearest_taps(in_size: int, out_size: int, scale_factor: float | None, exact: bool
                 ) -> tuple[np.ndarray, None]:
    """Index of the input each output position copies (torch's nearest / nearest-exact)."""
    out = np.arange(out_size)
    if not exact and out_size == in_size:
        return out[None], None
    if not exact and out_size == 2 * in_size:
        return (out >> 1)[None], None
    scale = source_scale(in_size, out_size, scale_factor)
    offset = np.float32(0.5) if exact else np.float32(0)
    src = np.floor((out.astype(np.float32) + offset) * scale).astype(np.int64)
    return np.minimum(src, in_size - 1)[None], None


def _source_positions(in_size: int, out_size: int, scale_factor: float | None,
                      align_corners: bool) -> np.ndarray:
    scale = source_scale(in_size, out_size, scale_factor, align_corners)
    out = np.arange(out_size, dtype=np.float32)
    if align_corners:
        return out * scale
    return (out + np.float32(0.5)) * scale - np.float32(0.5)


def linear_taps(in_size: int, out_size: int, scale_factor: float | None, align_corners: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """(indices (2, out), weights (2, out)): each output mixes two neighbouring inputs."""
    out = np.arange(out_size)
    if out_size == in_size:                              # torch copies
        return np.stack([out, out]), np.stack([np.ones(out_size, np.float32),
                                               np.zeros(out_size, np.float32)])
    src = np.maximum(_source_positions(in_size, out_size, scale_factor, align_corners), 0)
    first = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    second = np.where(first < in_size - 1, first + 1, first)
    frac = np.clip(src - first.astype(np.float32), 0, 1).astype(np.float32)
    return np.stack([first, second]), np.stack([np.float32(1) - frac, frac])


def keys_cubic(x: np.ndarray, a) -> np.ndarray:
    """Keys' cubic convolution kernel at distance x: one cubic for |x| <= 1, another for
    1 < |x| < 2, zero beyond."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0))


def cubic_weights(t: np.ndarray, a: float = CUBIC_A) -> np.ndarray:
    """Keys' cubic convolution weights of the 4 neighbours at distances 1+t, t, 1-t, 2-t."""
    return keys_cubic(np.stack([t + 1, t, 1 - t, 2 - t]), np.float32(a)).astype(np.float32)


def cubic_taps(in_size: int, out_size: int, scale_factor: float | None, align_corners: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """(indices (4, out), weights (4, out)): floor(src) - 1 .. floor(src) + 2, clamped."""
    src = _source_positions(in_size, out_size, scale_factor, align_corners)
    base = np.floor(src)
    indices = base.astype(np.int64)[None] + np.arange(-1, 3)[:, None]
    return np.clip(indices, 0, in_size - 1), cubic_weights((src - base).astype(np.float32))


def antialias_taps(in_size: int, out_size: int, scale_factor: float | None,
                   align_corners: bool, cubic: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indices (K, out), weights (K, out)) of torch's antialiased bilinear / bicubic resize.

    Output o is centred on input position c = scale * (o + 0.5). When shrinking (scale > 1)
    the filter (triangle, or Keys' cubic with a = -0.5) is stretched by the scale, so every
    input under it contributes and none is skipped; its weights are normalised to sum to 1,
    and inputs past the edges are left out (not clamped)."""
    scale = float(source_scale(in_size, out_size, scale_factor, align_corners))
    half = 2.0 if cubic else 1.0                          # the filter's half-width
    support = half * scale if scale >= 1 else half
    stretch = 1.0 / scale if scale >= 1 else 1.0

    def filter_(x: np.ndarray) -> np.ndarray:
        return keys_cubic(x, -0.5) if cubic else np.maximum(1 - np.abs(x), 0)

    centre = scale * (np.arange(out_size) + 0.5)
    first = np.maximum((centre - support + 0.5).astype(np.int64), 0)
    count = np.minimum((centre + support + 0.5).astype(np.int64), in_size) - first
    taps = int(count.max())
    offsets = np.arange(taps)[:, None]                    # (K, 1)
    weights = filter_((offsets + first - centre + 0.5) * stretch)
    weights = np.where(offsets < count, weights, 0)
    total = weights.sum(axis=0)
    weights = np.where(total != 0, weights / np.where(total != 0, total, 1), 0)
    indices = np.minimum(first + offsets, in_size - 1)
    return indices, weights.astype(np.float32)


def resample_axis(x: np.ndarray, axis: int, indices: np.ndarray,
                  weights: np.ndarray | None) -> np.ndarray:
    """y[..., o, ...] = sum_k weights[k, o] * x[..., indices[k, o], ...] along ``axis``."""
    if weights is None:
        return np.take(x, indices[0], axis=axis)
    shape = [1] * x.ndim
    shape[axis] = indices.shape[1]
    y = np.take(x, indices[0], axis=axis) * weights[0].reshape(shape)
    for index, weight in zip(indices[1:], weights[1:]):
        y += np.take(x, index, axis=axis) * weight.reshape(shape)
    return y


def interpolate(x: np.ndarray, out_sizes: Sequence[int], mode: str = "nearest",
                align_corners: bool = False,
                scale_factors: Sequence[float] | None = None,
                antialias: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """``F.interpolate`` of an (N, C, *spatial) array to ``out_sizes``; ``scale_factors``
    (when the caller gave them) set the source step instead of in/out, as in torch.
    ``out``: an array of the result's shape to write it into (returned)."""
    if mode in ("nearest", "nearest-exact") and not antialias:
        factors = whole_factors(x.shape[2:], out_sizes, scale_factors, mode)
        if factors is not None:                # each input copied k times: one pass
            if out is None or (out.dtype == x.dtype and out.flags.c_contiguous):
                return repeat_each(x, factors, out)      # its last step writes into out
            np.copyto(out, repeat_each(x, factors))
            return out
    y = x
    for i, out_size in enumerate(out_sizes):
        axis, in_size = 2 + i, x.shape[2 + i]
        scale = scale_factors[i] if scale_factors is not None else None
        if antialias:
            taps = antialias_taps(in_size, out_size, scale, align_corners, mode == "bicubic")
        elif mode in ("nearest", "nearest-exact"):
            taps = nearest_taps(in_size, out_size, scale, mode == "nearest-exact")
        elif mode == "bicubic":
            taps = cubic_taps(in_size, out_size, scale, align_corners)
        else:
            taps = linear_taps(in_size, out_size, scale, align_corners)
        y = resample_axis(y, axis, *taps)
    if out is None:
        return y.astype(x.dtype, copy=False)
    np.copyto(out, y)
    return out


def whole_factors(in_sizes: Sequence[int], out_sizes: Sequence[int],
                  scale_factors: Sequence[float] | None, mode: str) -> list[int] | None:
    """For nearest resizing where every output position o along each axis copies input
    o // k (k = out / in, a whole number): the k of each axis; else None."""
    factors = []
    for i, (in_size, out_size) in enumerate(zip(in_sizes, out_sizes)):
        if in_size == 0 or out_size % in_size:
            return None
        k = out_size // in_size
        scale = scale_factors[i] if scale_factors is not None else None
        taps = nearest_taps(in_size, out_size, scale, mode == "nearest-exact")[0][0]
        if not np.array_equal(taps, np.arange(out_size) // k):
            return None
        factors.append(k)
    return factors


def repeat_each(x: np.ndarray, factors: Sequence[int], out: np.ndarray | None = None
                ) -> np.ndarray:
    """(N, C, *spatial) -> each spatial element repeated factors[i] times along axis 2 + i.
    The last axis first, as k interleaved copies (out[..., j] = x for each j < k); then each
    earlier axis, as k copies of its whole rows (a broadcast whose inner loop is long). The
    last step writes into ``out`` (C-contiguous, the result's shape and x's dtype) if given."""
    axes = [axis for axis in reversed(range(2, x.ndim)) if factors[axis - 2] != 1]
    if not axes:
        if out is None:
            return x.copy()
        np.copyto(out, x)
        return out
    y = x
    for axis in axes:
        k = factors[axis - 2]
        shape = y.shape
        expanded = (*shape[:axis + 1], k, *shape[axis + 1:])
        step = (out.reshape(expanded) if out is not None and axis == axes[-1]
                else np.empty(expanded, x.dtype))
        if axis == x.ndim - 1:
            for j in range(k):
                step[..., j] = y
        else:
            step[...] = y.reshape(*shape[:axis + 1], 1, *shape[axis + 1:])
        y = step.reshape(*shape[:axis], shape[axis] * k, *shape[axis + 1:])
    return y


# ----- the layers -------------------------------------------------------------------------------

@register_layer("F.interpolate", "F.upsample", "nn.Upsample")
class Interpolate(NamedArgumentLayer):
    """``F.interpolate(x, size=None, scale_factor=None, mode='nearest', align_corners=None)``
    on an (N, C, L), (N, C, H, W) or (N, C, D, H, W) input: the output size is ``size`` or
    floor(in * scale_factor) per spatial dim. Modes: nearest, nearest-exact, linear (3-D
    input), bilinear and bicubic (4-D), trilinear (5-D). The size may be an input computed
    in the graph (``F.interpolate(x, size=y.shape[2:])``)."""

    size = Param(None, as_ints)
    scale_factor = Param(None, as_floats)
    mode = Param("nearest", as_str)
    align_corners = Param(None, as_bool)
    recompute_scale_factor = Param(None, as_bool)
    antialias = Param(False, as_bool)
    INPUTS = ("input", "size")

    def check_params(self) -> None:
        if self.mode not in MODES:
            raise LayerError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.align_corners and MODES[self.mode] is None:
            raise LayerError(f"align_corners=True needs an interpolating mode, not {self.mode}")
        if self.antialias and self.mode not in ("bilinear", "bicubic"):
            raise LayerError(f"antialias=True needs mode bilinear or bicubic, not {self.mode}")
        if self.scale_factor is not None and any(s <= 0 for s in self.scale_factor):
            raise LayerError(f"scale_factor={self.scale_factor} must be positive")

    def _plan(self, shape: Shape, items: Sequence[Any]
              ) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
        """(output spatial sizes, the scale factors that set the source step or None)."""
        spatial = len(shape) - 2
        if spatial not in (1, 2, 3) or MODES[self.mode] not in (None, spatial):
            raise ShapeError(f"mode {self.mode} cannot resize an input of shape {tuple(shape)}")
        size = per_dim(self.argument("size", items), spatial, "size")
        scales = per_dim(self.argument("scale_factor", items), spatial, "scale_factor")
        if (size is None) == (scales is None):
            raise ShapeError("needs exactly one of size and scale_factor")
        if size is not None:
            if any(s <= 0 for s in size):
                raise ShapeError(f"size={size} must be positive")
            return tuple(size), None
        out = tuple(math.floor(n * s) for n, s in zip(shape[2:], scales))
        if any(s <= 0 for s in out):
            raise ShapeError(f"scale_factor={scales} makes an empty output from shape "
                             f"{tuple(shape)}")
        return out, (None if self.recompute_scale_factor else scales)

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        out, _ = self._plan(shape, input_values)
        return [shape[:2] + out]

    support_forward_into = True      # whole nearest factors: into the planned buffer

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        out, scales = self._plan(x.shape, inputs)
        return [interpolate(x, out, self.mode, bool(self.align_corners), scales,
                            bool(self.antialias))]

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Nearest resizing by whole factors writes its last step into ``outputs[0]`` (no
        array of its own); any other resizing is copied there."""
        x = inputs[0]
        out, scales = self._plan(x.shape, inputs)
        interpolate(x, out, self.mode, bool(self.align_corners), scales, bool(self.antialias),
                    outputs[0])


@register_layer("aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa")
class AntialiasedUpsample(NamedArgumentLayer):
    """What pnnx writes for ``F.interpolate(..., antialias=True)`` (bilinear / bicubic, 4-D):
    torch's own operator, its arguments as inputs, in one of two overloads::

        (input, output_size, align_corners, scales_h, scales_w)      5 inputs
        (input, output_size or None, align_corners, scale_factors)   4 inputs

    The output size is output_size, or floor(in * scale) per dim; a given scale also sets the
    source step, as in F.interpolate."""

    INPUTS = ("input", "output_size", "align_corners", "scales_h", "scales_w")
    VEC_INPUTS = ("input", "output_size", "align_corners", "scale_factors")
    output_size = Param(None, optional(as_ints))
    align_corners = Param(False, as_bool)
    scales_h = Param(None, optional(as_float))
    scales_w = Param(None, optional(as_float))
    scale_factors = Param(None, optional(as_floats))

    def named_inputs(self, items):
        if len(items) == len(self.VEC_INPUTS):
            return dict(zip(self.VEC_INPUTS, items))
        return super().named_inputs(items)

    def _plan(self, shape: Shape, items) -> tuple[tuple[int, ...], tuple | None]:
        if len(shape) != 4:
            raise ShapeError(f"resizes (N, C, H, W) inputs, got {tuple(shape)}")
        if len(items) == len(self.VEC_INPUTS):
            scales = self.argument("scale_factors", items)
        else:
            scales = (self.argument("scales_h", items), self.argument("scales_w", items))
            scales = None if scales == (None, None) else scales
        scales = per_dim(scales, 2, "scale_factors")
        size = self.argument("output_size", items)
        if size is None:
            if scales is None or None in scales:
                raise ShapeError("needs an output size or scale factors")
            size = tuple(math.floor(n * f) for n, f in zip(shape[2:], scales))
        size = per_dim(tuple(size), 2, "output_size")
        if any(n <= 0 for n in size):
            raise ShapeError(f"output size {size} must be positive")
        return size, scales

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = tuple(input_shapes[0])
        return [shape[:2] + self._plan(shape, input_values)[0]]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        size, scales = self._plan(x.shape, inputs)
        mode = "bicubic" if "bicubic" in self.type else "bilinear"
        return [interpolate(x, size, mode, self.argument("align_corners", inputs), scales,
                            antialias=True)]


@register_layer("F.upsample_nearest", "nn.UpsamplingNearest2d")
class UpsampleNearest(Interpolate):
    """``F.upsample_nearest(x, size, scale_factor)`` = interpolate with mode 'nearest'."""

    # constants, not parameters: F.interpolate's other arguments
    mode, align_corners, recompute_scale_factor, antialias = "nearest", None, None, False


@register_layer("F.upsample_bilinear", "nn.UpsamplingBilinear2d")
class UpsampleBilinear(Interpolate):
    """``F.upsample_bilinear(x, size, scale_factor)`` = interpolate with mode 'bilinear' and
    align_corners=True."""

    # constants, not parameters: F.interpolate's other arguments
    mode, align_corners, recompute_scale_factor, antialias = "bilinear", True, None, False


# ----- pixel shuffle ----------------------------------------------------------------------------

@register_layer("F.pixel_shuffle", "nn.PixelShuffle")
class PixelShuffle(Layer):
    """``F.pixel_shuffle(x, r)``: (*, C*r*r, H, W) -> (*, C, H*r, W*r); out[c, h*r + i, w*r + j]
    = x[c*r*r + i*r + j, h, w]."""

    views_input = True

    upscale_factor = Param(convert=as_int)

    def check_params(self) -> None:
        if self.upscale_factor <= 0:
            raise LayerError(f"upscale_factor must be positive, got {self.upscale_factor}")

    def infer_shape(self, shape: Shape) -> Shape:
        r = self.upscale_factor
        if len(shape) < 3 or shape[-3] % (r * r):
            raise ShapeError(f"pixel_shuffle by {r} needs (*, C*{r * r}, H, W), got {shape}")
        return (*shape[:-3], shape[-3] // (r * r), shape[-2] * r, shape[-1] * r)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        r, lead = self.upscale_factor, x.shape[:-3]
        c, h, w = self.infer_shape(x.shape)[-3:]
        y = x.reshape(*lead, c, r, r, h // r, w // r)             # (*, C, i, j, H, W)
        k = len(lead)
        y = y.transpose(*range(k), k, k + 3, k + 1, k + 4, k + 2)  # (*, C, H, i, W, j)
        return read_only_alias(np.ascontiguousarray(y).reshape(*lead, c, h, w), x)  # r=1: x


@register_layer("F.pixel_unshuffle", "nn.PixelUnshuffle")
class PixelUnshuffle(Layer):
    """``F.pixel_unshuffle(x, r)``: the inverse of pixel_shuffle, (*, C, H*r, W*r) ->
    (*, C*r*r, H, W)."""

    views_input = True

    downscale_factor = Param(convert=as_int)

    def check_params(self) -> None:
        if self.downscale_factor <= 0:
            raise LayerError(f"downscale_factor must be positive, got {self.downscale_factor}")

    def infer_shape(self, shape: Shape) -> Shape:
        r = self.downscale_factor
        if len(shape) < 3 or shape[-2] % r or shape[-1] % r:
            raise ShapeError(f"pixel_unshuffle by {r} needs (*, C, H*{r}, W*{r}), got {shape}")
        return (*shape[:-3], shape[-3] * r * r, shape[-2] // r, shape[-1] // r)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        r, lead = self.downscale_factor, x.shape[:-3]
        c, h, w = x.shape[-3], x.shape[-2] // r, x.shape[-1] // r
        y = x.reshape(*lead, c, h, r, w, r)                       # (*, C, H, i, W, j)
        k = len(lead)
        y = y.transpose(*range(k), k, k + 2, k + 4, k + 1, k + 3)  # (*, C, i, j, H, W)
        y = np.ascontiguousarray(y).reshape(*lead, c * r * r, h, w)
        return read_only_alias(y, x)                                # r = 1: x itself
