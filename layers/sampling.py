"""``F.grid_sample``: read an image at given positions (spatial transformers, optical flow),
and ``F.affine_grid``, the positions of an affine warp.

For every output position the grid gives (x, y) in [-1, 1] across the input's width and
height; they become pixel coordinates as torch computes them::

    align_corners=True    ix = (x + 1) / 2 * (W - 1)          (-1, 1: the corner pixels' centres)
    align_corners=False   ix = ((x + 1) * W - 1) / 2          (-1, 1: the corner pixels' edges)

bilinear mixes the 4 pixels around (ix, iy), nearest takes the closest (ties to even), bicubic
the 4 x 4 around with Keys' weights (a = -0.75). A position outside the image reads zeros
(padding_mode "zeros"), the nearest edge ("border") or its mirror image ("reflection"); for
bicubic the padding applies to each of the 16 taps, for the others to (ix, iy) first.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from layers.base import Layer, Param, Shape, as_bool, as_ints, as_str
from layers.registry import register_layer
from layers.resize import cubic_weights
from parser.errors import LayerError, ShapeError

MODES = ("bilinear", "nearest", "bicubic")
PADDING_MODES = ("zeros", "border", "reflection")


def unnormalize(coord: np.ndarray, size: int, align_corners: bool) -> np.ndarray:
    """Pixel coordinates, in float32 and in the order torch's CPU kernel computes them (a
    position half-way between two pixels must round as torch's does)."""
    coord = coord.astype(np.float32)
    if align_corners:
        return (coord + 1) * np.float32((size - 1) / 2)
    return (coord + 1) * np.float32(size / 2) - np.float32(0.5)


def reflect(coord: np.ndarray, twice_low: int, twice_high: int) -> np.ndarray:
    """Mirror coord into [twice_low / 2, twice_high / 2], as often as it takes."""
    if twice_low == twice_high:
        return np.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = np.abs(coord - low)
    extra, flips = np.fmod(distance, span), np.floor(distance / span)
    return np.where(flips % 2 == 0, extra + low, span - extra + low)


def pad_coordinates(coord: np.ndarray, size: int, padding_mode: str,
                    align_corners: bool) -> np.ndarray:
    """Where padding_mode sends a pixel coordinate: itself (zeros), clipped to the image
    (border), or reflected at its edges and then clipped (reflection)."""
    if padding_mode == "border":
        return np.clip(coord, 0, size - 1)
    if padding_mode == "reflection":
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return np.clip(reflect(coord, *twice), 0, size - 1)
    return coord


def gather(x: np.ndarray, iy: np.ndarray, ix: np.ndarray) -> np.ndarray:
    """x[n, :, iy, ix] for integer (N, Ho, Wo) positions -> (N, C, Ho, Wo); zeros outside."""
    n, c, h, w = x.shape
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    positions = math.prod(ix.shape[1:])
    flat = (np.clip(iy, 0, h - 1) * w + np.clip(ix, 0, w - 1)).reshape(n, 1, positions)
    values = np.take_along_axis(x.reshape(n, c, h * w),
                                np.broadcast_to(flat, (n, c, positions)), axis=2)
    values = values.reshape(n, c, *ix.shape[1:])
    return np.where(inside[:, None], values, 0)          # a NaN at the edge stays outside


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: bool = False) -> np.ndarray:
    """(N, C, H, W) sampled at grid (N, Ho, Wo, 2) -> (N, C, Ho, Wo)."""
    h, w = x.shape[2:]
    x = np.ascontiguousarray(x)
    ix = unnormalize(grid[..., 0], w, align_corners)
    iy = unnormalize(grid[..., 1], h, align_corners)
    if mode == "bicubic":
        x0, y0 = np.floor(ix), np.floor(iy)
        wx, wy = cubic_weights(ix - x0), cubic_weights(iy - y0)      # (4, N, Ho, Wo) each
        out = np.zeros((x.shape[0], x.shape[1], *ix.shape[1:]), np.float64)
        for i in range(4):
            tap_y = pad_coordinates(y0 - 1 + i, h, padding_mode, align_corners)
            for j in range(4):
                tap_x = pad_coordinates(x0 - 1 + j, w, padding_mode, align_corners)
                out += gather(x, tap_y.astype(np.int64), tap_x.astype(np.int64)) \
                    * (wy[i] * wx[j])[:, None]
        return out.astype(x.dtype)
    ix = pad_coordinates(ix, w, padding_mode, align_corners)
    iy = pad_coordinates(iy, h, padding_mode, align_corners)
    if mode == "nearest":
        return gather(x, np.rint(iy).astype(np.int64), np.rint(ix).astype(np.int64))
    x0, y0 = np.floor(ix), np.floor(iy)
    fx, fy = (ix - x0)[:, None], (iy - y0)[:, None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    out = (gather(x, y0, x0) * ((1 - fy) * (1 - fx)) + gather(x, y0, x0 + 1) * ((1 - fy) * fx)
           + gather(x, y0 + 1, x0) * (fy * (1 - fx)) + gather(x, y0 + 1, x0 + 1) * (fy * fx))
    return out.astype(x.dtype)


@register_layer("F.grid_sample")
class GridSample(Layer):
    """``F.grid_sample(x, grid, mode, padding_mode, align_corners)`` on 4-D inputs: x (N, C,
    H, W), grid (N, Ho, Wo, 2) -> (N, C, Ho, Wo)."""

    mode = Param("bilinear", as_str)
    padding_mode = Param("zeros", as_str)
    align_corners = Param(False, as_bool)
    one_blob_only = False

    def check_params(self) -> None:
        if self.mode not in MODES:
            raise LayerError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")
        if self.padding_mode not in PADDING_MODES:
            raise LayerError(f"padding_mode={self.padding_mode!r}: expected one of "
                             f"{', '.join(PADDING_MODES)}")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs (input, grid), got {len(input_shapes)}")
        shape, grid = tuple(input_shapes[0]), tuple(input_shapes[1])
        if len(shape) == 5:
            raise ShapeError("grid_sample of a 5-D (volumetric) input is not supported; 4-D "
                             "inputs (N, C, H, W) are")
        if len(shape) != 4 or len(grid) != 4 or grid[3] != 2 or grid[0] != shape[0]:
            raise ShapeError(f"grid_sample takes input (N, C, H, W) and grid (N, Ho, Wo, 2), "
                             f"got {shape} and {grid}")
        if 0 in shape[2:]:
            raise ShapeError(f"grid_sample of an empty image {shape}")
        return [(shape[0], shape[1], grid[1], grid[2])]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([a.shape for a in inputs])
        x, grid = inputs
        return [grid_sample(x, grid, self.mode, self.padding_mode, self.align_corners)]


def base_coordinates(size: int, align_corners: bool) -> np.ndarray:
    """The [-1, 1] coordinates of `size` pixel centres (align_corners: of the corner pixels'
    centres at -1 and 1, else of their outer edges)."""
    if align_corners:
        return np.linspace(-1, 1, size) if size > 1 else np.zeros(1)
    return (np.arange(size) * 2 + 1) / size - 1


@register_layer("F.affine_grid")
class AffineGrid(Layer):
    """``F.affine_grid(theta, size, align_corners)``: theta (N, 2, 3), size (N, C, H, W) ->
    grid (N, H, W, 2), grid[n, i, j] = theta[n] @ (x_j, y_i, 1) with x, y the pixel centres'
    coordinates in [-1, 1]: the sampling grid of an affine warp, for grid_sample."""

    size = Param(convert=as_ints)
    align_corners = Param(False, as_bool)

    def infer_shape(self, shape: Shape) -> Shape:
        if len(self.size) != 4:
            raise ShapeError(f"affine_grid builds 2-D grids: size (N, C, H, W), got {self.size}")
        if tuple(shape) != (self.size[0], 2, 3):
            raise ShapeError(f"theta must be ({self.size[0]}, 2, 3) for size {self.size}, got "
                             f"{tuple(shape)}")
        return (self.size[0], self.size[2], self.size[3], 2)

    def forward_one(self, theta: np.ndarray) -> np.ndarray:
        self.infer_shape(theta.shape)
        h, w = self.size[2:]
        xs, ys = (base_coordinates(n, self.align_corners) for n in (w, h))
        base = np.stack([np.broadcast_to(xs, (h, w)), np.broadcast_to(ys[:, None], (h, w)),
                         np.ones((h, w))], axis=-1)                        # (H, W, 3)
        grid = np.einsum("hwk,nck->nhwc", base, theta.astype(np.float64))
        return grid.astype(theta.dtype)
