"""Dense and grouped convolution as matrix products.

A convolution is a matrix product once every input window is laid out as a column::

    cols[(c, i, j), (oh, ow)] = x[c, oh*sh + i*dh - top, ow*sw + j*dw - left]   (0 outside)
    y[n] = weight (C_out, C_in*kh*kw) @ cols (C_in*kh*kw, Ho*Wo)                  per image

The weight is packed once, at build, as that (C_out, K) matrix (per group: (G, C_out/G, K/G)).
That is a 1x1 convolution of cols, seen as an image of K channels: layers/fast/pointwise.py
computes it, in register tiles with bias, residual and activation applied before they are
written.

* A 1x1 convolution with stride 1 and no padding needs no cols at all: the image itself,
  viewed as (C_in, H*W), is the matrix.
* A larger kernel, with one group, on cols of BANDS_FROM values or more and outputs of
  BANDS_MIN_PIXELS or more (fewer would be one band of pixels, which each chunk of the
  shared product would make whole): each input plane is split into its stride phases
  (layers/fast/phases.py: about the input's size, ``split_planes``), and the product makes
  cols from them band of pixels by band, in the work space its tiles read
  (``pointwise.cols_band``): cols (kh * kw / (sh * sw) times the input) are never written
  to memory whole and read back.
* The others take cols from a numba kernel (the masked stride phases of each channel, so
  every row of cols is one unit-stride masked copy) that writes them into a scratch buffer
  reused from call to call (``team.scratch``), an image at a time, or several where their
  cols are small (BATCHED_COLS_MOST), so that one product takes them:
  - a strided or padded 1x1, whose cols are its pixels (fewer than its phases), and cols
    that are small or one band, which stay in cache;
  - a grouped convolution: one BLAS product per group of each image (``np.matmul`` on the
    stack), then the epilogue in one pass over the images whose cols were made together;
  - one group on small outputs, where the product runs turned around, output channels in
    the vector lanes (``gemm_transposed_conv2d``: layers/fast/pointwise_transposed.py, whose
    ``transposed_pays`` says when), from the weight packed as that kernel's panels.

A convolution layer runs one group through ``im2col_product``: its case and its 1x1 product
worked out once for an output size, the arrays checked once a call.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from parser.errors import ShapeError

from layers.kernels import window_output_size
from layers.fast.kernel import INT, array, kernel
from layers.fast.epilogue import Activation, bias_residual_activation
from layers.fast.phases import (HEIGHT, STRIDE_H, STRIDE_W, WIDTH, geometry_layout, geometry_of,
                                phase_layout, phase_targets, split_plane)
from layers.fast.pointwise import pointwise_conv2d, pointwise_product
from layers.fast.operands import check, check_sizes, unchecked
from layers.fast.pointwise_transposed import transposed_product
from layers.fast.team import current_team, scratch, team_worth_sharing

if TYPE_CHECKING:
    from layers.fast.workers import Team

IM2COL_SHARED_FROM = 1 << 15   # values of cols: fewer are copied faster alone than shared
PHASES_MOST = 1 << 22          # floats of phases at a time (16 MiB): larger batches go in parts
BANDS_FROM = 1 << 16           # values of cols an image: fewer stay in cache, made at once
BANDS_MIN_PIXELS = 256         # outputs an image: fewer are one band, made by every thread
BATCHED_COLS_MOST = 1 << 19    # values of cols made for several images at once (2 MiB), and
                               # their product taken at once (a strided 1x1's, at batch 8)


@kernel(nogil=True, exported=(array(3), array(2), *[INT] * 10))
def _im2col(x, cols, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left, out_h, out_w):
    """x (C, H, W) -> cols (C*kh*kw, Ho*Wo), every channel (``im2col_channels``)."""
    im2col_channels(x, cols, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left, out_h, out_w,
                    np.int64(0), x.shape[0])                   # int64 0: see jobs.py


@kernel(nogil=True)
def im2col_channels(x, cols, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left, out_h, out_w,
                    first, last):
    """x (C, H, W) -> cols (C*kh*kw, Ho*Wo), zeros where a window reaches into the padding:
    the rows of channels first .. last - 1.

    Each channel is first split into its masked stride phases (layers/fast/phases.py), where
    every tap reads a plain window: each row of cols is then one masked copy of Ho*Wo values
    (with "same" padding; Ho copies of Wo values otherwise)."""
    channels, height, width = x.shape
    if (kh == 1 and kw == 1 and top == 0 and left == 0 and (out_h - 1) * stride_h < height
            and (out_w - 1) * stride_w < width):
        for c in range(first, last):               # a strided 1x1: just every sh-th pixel
            dst = cols[c]
            for oh in range(out_h):
                src, out_row = x[c, oh * stride_h], dst[oh * out_w:]
                for ow in range(out_w):
                    out_row[ow] = src[ow * stride_w]
        return
    row_len, first_row, phase_size, tap_start, column_ok, length, size = phase_layout(
        height, width, out_h, out_w, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left)
    phases = np.zeros(size, np.float32)
    targets = phase_targets(height, width, row_len, first_row, phase_size, stride_h, stride_w)
    planes = x.reshape(channels, height * width)
    zero = np.float32(0.0)
    for c in range(first, last):
        split_plane(planes[c], height, width, phases, row_len, first_row, phase_size,
                    stride_h, stride_w, targets)
        for i in range(kh):
            for j in range(kw):
                dst, ok = cols[(c * kh + i) * kw + j], column_ok[j]
                src = phases[tap_start[i, j]:]
                if row_len == out_w:               # the whole row of cols in one loop
                    for t in range(length):
                        dst[t] = src[t] if ok[t] else zero
                else:
                    for oh in range(out_h):
                        first = oh * row_len
                        row, row_ok, out_row = src[first:], ok[first:], dst[oh * out_w:]
                        for ow in range(out_w):
                            out_row[ow] = row[ow] if row_ok[ow] else zero


@kernel(nogil=True, exported=(array(1, INT), array(1, INT)))
def _phase_size(geometry, size):
    """size[0] = the floats of one plane's phases (phases.phase_geometry) for a convolution
    of ``geometry`` (phases.geometry_of)."""
    size[0] = geometry_layout(geometry)[5]


@kernel(nogil=True, exported=(array(3), array(3), array(1, INT)))
def _split_planes(x, phases, geometry):
    """Every plane of x (N, C, H * W) into phases (N, C, size): ``split_planes``."""
    split_planes(x, phases, geometry, np.int64(0), x.shape[0] * x.shape[1])


@kernel(nogil=True)
def split_planes(x, phases, geometry, first, last):
    """Planes first .. last - 1 of x (N, C, H * W), counted image by image, each into its row
    of phases (N, C, size): zeros, then its values where the convolution of ``geometry``
    reads them (phases.split_plane)."""
    channels, height, width = x.shape[1], geometry[HEIGHT], geometry[WIDTH]
    stride_h, stride_w = geometry[STRIDE_H], geometry[STRIDE_W]
    row_len, first_row, phase_size, _, _, _ = geometry_layout(geometry)
    targets = phase_targets(height, width, row_len, first_row, phase_size, stride_h, stride_w)
    for plane in range(first, last):
        dst = phases[plane // channels, plane % channels]
        dst[:] = 0.0
        split_plane(x[plane // channels, plane % channels], height, width, dst, row_len,
                    first_row, phase_size, stride_h, stride_w, targets)


@kernel(nogil=True, exported=(array(3), array(4), INT, INT))
def _scatter_taps(cols, y, kh, kw):
    """y[n, o, ih * kh + i, iw * kw + j] = cols[n, (i * kw + j) * C_out + o, ih * W + iw]:
    the taps of a transposed convolution whose kernel is its stride, each output row made
    at once from the kw taps of its row of windows (``scatter_taps``)."""
    images, c_out, height, width = y.shape
    in_w = width // kw
    for n in range(images):
        for o in range(c_out):
            for row in range(height):
                ih, i = row // kh, row % kh
                out = y[n, o, row]
                for j in range(kw):
                    tap = cols[n, (i * kw + j) * c_out + o, ih * in_w:(ih + 1) * in_w]
                    for iw in range(in_w):
                        out[iw * kw + j] = tap[iw]


def scatter_taps(cols: np.ndarray, y: np.ndarray, kh: int, kw: int) -> None:
    """The output y (N, C_out, H kh, W kw) of a transposed convolution whose windows do not
    overlap (kernel = stride), from the product cols (N, kh * kw * C_out, H * W) of its
    taps' rows (i, j, o) with x: each value copied to its place. Float32, C-contiguous."""
    _scatter_taps(cols, y, kh, kw)


def pack_gemm_weight(weight: np.ndarray, groups: int) -> np.ndarray:
    """(C_out, C_in/G, kh, kw) -> (G, C_out/G, C_in/G*kh*kw), C-contiguous: one matrix per
    group whose columns follow the rows of cols."""
    c_out = weight.shape[0]
    return np.ascontiguousarray(weight.reshape(groups, c_out // groups, -1), np.float32)


def gemm_conv2d(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                kernel: tuple[int, int], stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int],
                out_hw: tuple[int, int], activation: Activation,
                residual: np.ndarray | None = None, out: np.ndarray | None = None
                ) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, packed weight (G, C_out/G, K/G) ->
    y (N, C_out, Ho, Wo) = activation(conv + bias + residual)."""
    n = x.shape[0]
    groups, group_out, group_k = packed.shape
    (out_h, out_w), length = out_hw, out_hw[0] * out_hw[1]
    if out is None:
        y = np.empty((n, groups * group_out, out_h, out_w), np.float32)
    else:                                          # reshaped in place below
        check(out, (n, groups * group_out, out_h, out_w), "convolution output",
              writeable=True)
        y = out
    y_groups = y.reshape(n, groups, group_out, length)
    direct = kernel == (1, 1) and stride == (1, 1) and not any(pads)
    team = current_team()                          # helper threads to share the work with
    if direct and groups == 1:                     # the input is already the cols matrix
        pointwise_gemm(x, packed, bias, activation, residual, y)
        return y
    if direct:                                     # grouped: a product per group
        images = x.reshape(n, groups, group_k, length)
        for i in range(n):
            _matmul(team, packed, images[i], y_groups[i])
        _finish(team, y, bias, residual, activation)
        return y
    if groups == 1:
        im2col_product(packed, bias, kernel, stride, pads, dilation, out_hw,
                       activation)(x, residual, y)
        return y
    for i, j, cols in _cols_in_batches(x, groups * group_k, kernel, stride, pads, dilation,
                                       out_hw, _im2col):
        for k in range(i, j):
            _matmul(team, packed, cols[k - i].reshape(groups, group_k, length), y_groups[k])
        _finish(team, y[i:j], bias, None if residual is None else residual[i:j], activation)
    return y


def im2col_product(packed: np.ndarray, bias: np.ndarray | None, kernel: tuple[int, int],
                   stride: tuple[int, int], pads: tuple[int, int, int, int],
                   dilation: tuple[int, int], out_hw: tuple[int, int], activation: Activation
                   ) -> Callable[..., None]:
    """gemm_conv2d of one group, packed weight (1, C_out, C_in*kh*kw), worked out once: the
    call ``product(x, residual, y)`` takes x (N, C_in, H, W) of any H, W whose output is
    out_hw, y (N, C_out, Ho, Wo) and the residual (y's shape, or None), checks them
    (operands.check_sizes) and makes the 1x1 product of the images' cols (``_cols_in_batches``),
    or of their phases band by band (``in_bands``), without the kernels' per-argument checks."""
    groups, c_out, rows = packed.shape
    taps, (out_h, out_w) = kernel[0] * kernel[1], out_hw
    if groups != 1 or rows % taps:
        raise ShapeError(f"im2col product: one group of C_in * {taps} columns expected, got "
                         f"a weight of shape {packed.shape}")
    c_in, length = rows // taps, out_h * out_w
    y_shape = (c_out, out_h, out_w)
    fitting: set[tuple[int, ...]] = set()          # input sizes (H, W) whose output is out_hw

    def check_images(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> int:
        """Refuse what check_sizes refuses, x not (N, C_in, H, W) of such an H, W, and y
        not (N, C_out, Ho, Wo); the number of images N."""
        if getattr(x, "ndim", 0) != 4 or getattr(y, "shape", ())[1:] != y_shape:
            raise ShapeError(f"im2col product: images (N, {c_in}, H, W) into (N, "
                             f"{', '.join(map(str, y_shape))}) expected, got "
                             f"{getattr(x, 'shape', type(x).__name__)} into "
                             f"{getattr(y, 'shape', type(y).__name__)}")
        images, hw = x.shape[0], x.shape[2:]
        if hw not in fitting:
            if tuple(window_output_size(size, k, s, before, after, d) for size, k, s, before,
                     after, d in zip(hw, kernel, stride, pads[::2], pads[1::2], dilation)
                     ) != out_hw:
                raise ShapeError(f"im2col product: an input of {hw[0]}x{hw[1]} has no "
                                 f"{out_h}x{out_w} output")
            fitting.add(hw)
        check_sizes(x, (images, c_in), x.size, y, (images, c_out), images * c_out * length,
                    "im2col product", residual)
        return images

    if in_bands(kernel, rows, length):
        by_size: dict[tuple[int, ...], tuple[np.ndarray, int, Callable[..., None]]] = {}

        def banded(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
            check_images(x, residual, y)
            hw = x.shape[2:]
            prepared = by_size.get(hw)
            if prepared is None:                   # the phases' geometry and their product
                geometry, size = _geometry(kernel, stride, dilation, pads[0], pads[2], hw,
                                           out_hw)
                prepared = by_size[hw] = (geometry, size, pointwise_product(
                    packed, bias, length, activation, geometry).unchecked)
            _convolve_in_bands(x, *prepared, residual, y)
        return banded
    product = pointwise_product(packed, bias, length, activation).unchecked
    im2col = unchecked(_im2col)

    def im2col_then_product(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
        images = check_images(x, residual, y)
        if images == 1:                            # the usual call: no slices of y, residual
            cols = scratch("cols", (1, rows, length))
            _image_cols(x[0], cols[0], team_worth_sharing(cols.size, IM2COL_SHARED_FROM),
                        im2col, kernel, stride, pads, dilation, out_hw)
            product(cols, residual, y)             # (this thread's cols; y, residual checked)
            return
        for i, j, cols in _cols_in_batches(x, rows, kernel, stride, pads, dilation, out_hw,
                                           im2col):
            product(cols, None if residual is None else residual[i:j], y[i:j])
    return im2col_then_product


def in_bands(kernel: tuple[int, int], rows: int, length: int) -> bool:
    """Whether the im2col product of ``rows`` rows of cols and ``length`` outputs an image
    makes its cols band by band from the phases (else whole, an image at a time)."""
    return kernel != (1, 1) and rows * length >= BANDS_FROM and length >= BANDS_MIN_PIXELS


def _convolve_in_bands(x: np.ndarray, geometry: np.ndarray, size: int,
                       product: Callable[..., None], residual: np.ndarray | None,
                       y: np.ndarray) -> None:
    """im2col_product's band by band case (checked arrays): each image split into its stride
    phases (``geometry``: ``size`` floats a plane), whose 1x1 ``product``
    (pointwise_product with that geometry, unchecked) makes cols band by band."""
    n, c_in = x.shape[:2]
    planes = x.reshape(n, c_in, x.shape[2] * x.shape[3])
    step = max(1, PHASES_MOST // max(c_in * size, 1))     # images at a time
    for i in range(0, n, step):
        j = min(n, i + step)
        phases = scratch("phases", (j - i, c_in, size))
        splitter = team_worth_sharing(phases.size, IM2COL_SHARED_FROM)
        if splitter is None:
            _split_planes(planes[i:j], phases, geometry)
        else:
            splitter.split_planes(planes[i:j], phases, geometry)
        product(phases, None if residual is None else residual[i:j], y[i:j])


def pointwise_gemm(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                   activation: Activation, residual: np.ndarray | None, y: np.ndarray) -> None:
    """gemm_conv2d of a stride-1 1x1 without padding, in one group, into y (N, C_out, Ho,
    Wo): x (N, C_in, H, W) is already the product's operand (C_in, H * W) of each image."""
    n, _, h, w = x.shape
    _, c_out, c_in = packed.shape
    pointwise_conv2d(packed, x.reshape(n, c_in, h * w), bias, residual, activation,
                     y.reshape(n, c_out, h * w))


def gemm_transposed_conv2d(x: np.ndarray, panels: np.ndarray, bias: np.ndarray | None,
                           kernel: tuple[int, int], stride: tuple[int, int],
                           pads: tuple[int, int, int, int], dilation: tuple[int, int],
                           activation: Activation, residual: np.ndarray | None,
                           y: np.ndarray) -> None:
    """gemm_conv2d of one group into y (N, C_out, Ho, Wo), the weight given as the panels of
    its (C_out, K) matrix (pointwise_transposed.pack_panels): the images' cols
    (``_cols_in_batches``) times the panels, output channels in the vector lanes."""
    c_out, out_h, out_w = y.shape[1:]
    rows, length = panels.shape[1], out_h * out_w
    check(y, y.shape, "im2col convolution's output", writeable=True)   # reshaped in place
    product = transposed_product(panels, bias, rows, c_out, length, activation)
    for i, j, cols in _cols_in_batches(x, rows, kernel, stride, pads, dilation, (out_h, out_w),
                                       _im2col):
        product(cols, None if residual is None else residual[i:j].reshape(j - i, c_out, length),
                y[i:j].reshape(j - i, c_out, length))


@functools.lru_cache(maxsize=1024)
def _geometry(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
              top: int, left: int, hw: tuple[int, int], out_hw: tuple[int, int]
              ) -> tuple[np.ndarray, int]:
    """A convolution's geometry as pointwise.cols_band reads it (shared: never written), and
    the floats of one plane's phases."""
    geometry = geometry_of(kernel, stride, dilation, top, left, hw, out_hw)
    size = np.zeros(1, np.int64)
    _phase_size(geometry, size)
    return geometry, int(size[0])


def _cols_in_batches(x: np.ndarray, rows: int, kernel: tuple[int, int],
                     stride: tuple[int, int], pads: tuple[int, int, int, int],
                     dilation: tuple[int, int], out_hw: tuple[int, int],
                     im2col: Callable[..., None]) -> Iterator[tuple[int, int, np.ndarray]]:
    """(i, j, cols (j - i, rows, Ho*Wo)): the im2col of images i .. j - 1, as many at once as
    keep their cols within BATCHED_COLS_MOST values (one at least), so that their product
    runs at once (small cols: a strided 1x1's), in one scratch buffer reused from batch to
    batch (each batch's cols are overwritten by the next: use them before asking for it);
    each image's shared with the team's helpers when that pays. ``im2col``: _im2col or its
    unchecked form, for a caller that checked x."""
    length = out_hw[0] * out_hw[1]
    step = max(1, min(x.shape[0], BATCHED_COLS_MOST // max(rows * length, 1)))
    batch = scratch("cols", (step, rows, length))
    copier = team_worth_sharing(rows * length, IM2COL_SHARED_FROM)
    for i in range(0, x.shape[0], step):
        j = min(x.shape[0], i + step)
        for k in range(i, j):
            _image_cols(x[k], batch[k - i], copier, im2col, kernel, stride, pads, dilation,
                        out_hw)
        yield i, j, batch[:j - i]


def _image_cols(image: np.ndarray, cols: np.ndarray, copier: Team | None,
                im2col: Callable[..., None], kernel: tuple[int, int], stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int],
                out_hw: tuple[int, int]) -> None:
    """cols (rows, Ho*Wo) <- the im2col of one image (C, H, W): by the team ``copier``, or
    by ``im2col`` on this thread (_im2col, or its unchecked form for a caller that checked
    the image) when it is None."""
    if copier is None:
        im2col(image, cols, kernel[0], kernel[1], stride[0], stride[1], dilation[0],
               dilation[1], pads[0], pads[2], out_hw[0], out_hw[1])
    else:
        copier.im2col(image, cols, kernel, stride, dilation, pads, out_hw)


def _matmul(team: Team | None, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """np.matmul(a, b, out=out), shared with the team's helpers if there is a team."""
    if team is None:
        np.matmul(a, b, out=out)
    else:
        team.matmul(a, b, out)


def _finish(team: Team | None, y: np.ndarray, bias: np.ndarray | None,
            residual: np.ndarray | None, activation: Activation) -> None:
    """bias_residual_activation, shared with the team's helpers if there is a team."""
    if team is None:
        bias_residual_activation(y, bias, residual, activation)
    else:
        team.finish(y, bias, residual, activation)
