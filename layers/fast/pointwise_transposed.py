"""1x1 convolution on small images: pointwise.py's product turned around, output channels in
the vector lanes and pixels in the rows of the register tile::

    y[n].T (L, C_out) = x[n].T (L, C_in) @ weight.T (C_in, C_out)

Its tiles are ROWS pixels by COLUMNS output channels, which fill more lanes than pointwise.py's
ROWS channels by COLUMNS pixels when images are small (49 pixels in 6-pixel rows against
16-pixel vectors) and C_out is a multiple of COLUMNS, as in most networks
(``transposed_pays`` says when). The weight is packed once as panels of COLUMNS output
channels (``pack_panels``)::

    panels[q, k, j] = weight[q * COLUMNS + j, k]          (P, C_in, COLUMNS), zero padded

Tiles of ROWS pixels, then up to ROWS - 1 tiles of ROWS - 1 (``short_tiles``), cover a band
exactly (49 = 4 x 6 + 5 x 5) where tiles of ROWS alone would end in a part-filled one. Images
of fewer than COPY_BELOW pixels whose rows are not whole cache lines (7x7's 49 floats) are
copied, once per image by each thread, into the work space in rows padded to whole lines
(``copies_x``); the tiles then read x from there (BENCHMARKS.md says why).

The panels are the operand that streams: a band of 49 pixels reads each of a panel's
values 9 times from the level-1 cache, but reads the panel in from memory once, COLUMNS
floats a k. With 16-float vectors (two lines a k) the weights the next slice reads (or the
next panel's) are asked for while a slice's tiles run, a line every other k (simd.py's
``prefetch``: PREFETCH_PANELS); with 8 (one line a k) they are not (BENCHMARKS.md has the
measurements of both).

A finished tile is stored into a small work space (a band of at most BAND pixels by COLUMNS
channels). The epilogue writes the band into y (C_out, L) transposed, LANES x LANES blocks at
a time (simd.py's ``transpose_block``), then adds bias and residual and applies the
activation along each row of y. A sum over more than K_BLOCK channels is
taken in slices whose partial sums stay in the work space; each slice is one chain of fused
multiply-adds, from zero, added to the slices before. Each value of y is the same sum as in
pointwise.py (a single matrix's), then bias, residual and activation in the same order: the
two kernels give the same bits, on any number of threads.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import CLAMP, NONE, RELU, Activation, activate_block, clamp_bounds
from layers.fast.pointwise import (HEADER, K_BLOCK, LINE_FLOATS, NO_RESIDUAL, SHARED_FROM,
                                   _zeros, copy_run, forget_band)
from layers.fast.simd import (COLUMNS, LANES, ROWS, aligned_empty, prefetch, tile_add,
                              tile_fma, tile_fma_short, tile_load, tile_store, tile_zero,
                              transpose_block)
from layers.fast.operands import check, check_sizes, unchecked
from layers.fast.team import scratch, team_worth_sharing

BAND = 40 * ROWS       # pixels of one unit of work at most (its partial sums: BAND x COLUMNS)
COPY_BELOW = 4 * LINE_FLOATS   # images of fewer pixels have their x copied into whole lines
COPY_MOST = 1 << 17    # floats of such a copy at most (512 KiB); a larger x is read in place
PREFETCH_PANELS = LANES == 16   # the next slice's panels asked for ahead (module docstring)
EPILOGUE_CHANNELS = 13  # what the epilogue's transposition of y costs per output value, in
                        # input channels of the product: measured with 16-float vectors only


def lanes_filled(size: int, width: int) -> float:
    """The share of ``width``-wide blocks that ``size`` items fill: 49 in 16s, 49/64."""
    return size / (-(-size // width) * width)


def transposed_pays(length: int, c_in: int, c_out: int) -> bool:
    """Whether a 1x1 convolution (C_in -> C_out) on images of ``length`` pixels should run
    transposed: small images (one band of pixels at most) on which its tiles fill enough
    more of their lanes to pay for its epilogue, a transposition of y by LANES x LANES blocks.
    Per output value the product costs C_in / (share of lanes filled) either way, plus
    EPILOGUE_CHANNELS transposed: 192 -> 1152 channels on 7x7 runs transposed (its tiles
    fill 0.91 of their lanes against 0.77), 16 -> 1152 does not (the same shares, but 12x
    fewer channels to pay for the epilogue). The shares count tiles of ROWS pixels only:
    with ``short_tiles`` the transposed kernel fills more than that (this rule errs towards
    the upright one)."""
    transposed = lanes_filled(length, ROWS) * lanes_filled(c_out, COLUMNS)
    upright = lanes_filled(length, COLUMNS) * lanes_filled(c_out, ROWS)
    return length <= BAND and c_in / transposed + EPILOGUE_CHANNELS < c_in / upright


def pack_panels(weight: np.ndarray) -> np.ndarray:
    """weight (C_out, C_in) -> panels (ceil(C_out / COLUMNS), C_in, COLUMNS), float32:
    panels[q, k, j] = weight[q * COLUMNS + j, k], zeros past C_out."""
    c_out, c_in = weight.shape
    whole, rest = divmod(c_out, COLUMNS)
    # one copy, no more, from a vector's boundary: no load of a k's COLUMNS spans two lines
    panels = aligned_empty((whole + (rest > 0), c_in, COLUMNS))
    panels[:whole] = weight[:whole * COLUMNS].reshape(whole, COLUMNS, c_in).transpose(0, 2, 1)
    if rest:
        panels[whole, :, rest:] = 0.0
        panels[whole, :, :rest] = weight[whole * COLUMNS:].T
    return panels


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), array(3), array(1), INT,
                              FLOAT, FLOAT))
def _pointwise_transposed(panels, x, bias, residual, y, space, code, a, b):
    """y[n] (C_out, L) = activation(weight (C_out, C_in) @ x[n] (C_in, L) + bias[c] +
    residual[n]) from the weight's ``panels``, every unit (``transposed_units``; ``space``:
    space_size(C_in, L) floats)."""
    forget_band(space)
    band = band_pixels(x.shape[0], x.shape[2], y.shape[1], 1)
    transposed_units(panels, x, bias, residual, y, space, code, a, b, band, np.int64(0),
                     unit_count(x.shape[0], panels.shape[0], x.shape[2], band))


@kernel(nogil=True, inline="always")
def row_of_copy(length):
    """Floats from one row of x's copy to the next: ``length`` rounded up to whole lines."""
    return (length + LINE_FLOATS - 1) // LINE_FLOATS * LINE_FLOATS


@kernel(nogil=True, inline="always")
def short_tiles(pixels):
    """How many tiles of ROWS - 1 pixels end a band of ``pixels``, the others having ROWS, so
    that no tile is part-filled: 49 = 4 x 6 + 5 x 5 (0 where ROWS divides it, and where so
    many would not fit: then the last of the ROWS-pixel tiles is part-filled)."""
    short = (ROWS - pixels % ROWS) % ROWS
    return short if short * (ROWS - 1) <= pixels else 0


@kernel(nogil=True, inline="always")
def panel_ahead(ws, ahead, ahead_end, k):
    """Ask for the panels' line at ``ahead`` (every other k, up to ``ahead_end``, with
    PREFETCH_PANELS) and return where the next one is."""
    if PREFETCH_PANELS and k & 1 == 0 and ahead < ahead_end:
        prefetch(ws, ahead)
        return ahead + LINE_FLOATS
    return ahead


@kernel(nogil=True)
def bands_for_threads(images, length, c_out, parts):
    """Bands each image is cut into for a product shared by ``parts`` threads, or 0 for
    BAND's: where there are fewer images than threads and each image, read in place (of
    COPY_BELOW pixels or more), has more pixels than output channels. Its x is then the
    larger operand (C_in x L against the weight's C_in x C_out): a thread that takes a band
    (whole bands a chunk: workers.py) reads that band of x only. As many bands an image as
    make the images' bands a multiple of ``parts``: an even share each."""
    if not (0 < images < parts and length >= COPY_BELOW and length > c_out):
        return 0
    common, other = images, parts                     # their greatest common divisor
    while other > 0:
        common, other = other, common % other
    return max(parts // common, (length + BAND - 1) // BAND)


@kernel(nogil=True)
def band_pixels(images, length, c_out, parts):
    """Pixels of a band (a unit's) of an image of ``length`` pixels for a product shared by
    ``parts`` threads: BAND, or an even cut (``bands_for_threads``)."""
    bands = bands_for_threads(images, length, c_out, parts)
    return BAND if bands == 0 else (length + bands - 1) // bands


@kernel(nogil=True, exported=(INT, INT, INT, INT, array(1, INT)))
def _transposed_bands(images, length, c_out, parts, plan):
    """plan[0] = band_pixels, plan[1] = bands_for_threads: for the Python side
    (``band_plan``)."""
    plan[0] = band_pixels(images, length, c_out, parts)
    plan[1] = bands_for_threads(images, length, c_out, parts)


@kernel(nogil=True)
def unit_count(images, panel_count, length, band):
    """Units of work: every image's bands of ``band`` pixels, by panels of channels."""
    return images * ((length + band - 1) // band) * panel_count


@kernel(nogil=True)
def transposed_units(panels, x, bias, residual, y, space, code, a, b, band, first, last):
    """Units first .. last - 1 of _pointwise_transposed's y. A unit is one image's band of
    ``band`` pixels (at most BAND: ``band_pixels``) by one panel of COLUMNS channels;
    consecutive units share the band (the panel changes fastest), so the band of x stays in
    cache, or in the work space: each image's x
    is copied there (rows of ``row_of_copy``) when the space has room for it after the
    band's sums (``space_size`` gives that room where ``copies_x`` says).
    Tiles of ROWS pixels, then ``short_tiles`` of ROWS - 1, cover a band. ``bias`` has C_out
    values (zeros for none); ``residual`` y's shape, or no values for none; ``code``, a, b:
    the activation (layers/fast/epilogue.py); ``space``: space_size(C_in, L) floats, its
    header saying which image's x it holds (zero for none: ``forget_band`` before each
    call). y must not overlap residual: a band is written into y before the residual is
    read."""
    images, c_in, length = x.shape
    panel_count = panels.shape[0]
    bands = (length + band - 1) // band
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the epilogue: ReLU, ReLU6
    ws, xs = panels.reshape(panels.size), x.reshape(x.size)
    no_bias, no_residual = np.zeros(ROWS, np.float32), xs[:0]
    held, sums = space[:HEADER], space[HEADER:HEADER + BAND * COLUMNS]
    copy_row = row_of_copy(length)
    copy = space.size >= HEADER + BAND * COLUMNS + c_in * copy_row   # room for x's copy
    source, step = (space[HEADER + BAND * COLUMNS:], copy_row) if copy else (xs, length)
    keep = images < (1 << 24)                         # image numbers exact as float32
    for unit in range(first, last):
        image, index = unit // (bands * panel_count), unit % (bands * panel_count)
        start = index // panel_count * band
        panel = index % panel_count
        stop = min(length, start + band)
        c0 = panel * COLUMNS
        w0 = panel * c_in * COLUMNS                    # panels[panel, 0, 0]
        x0 = image * c_in * length                     # x[image, 0, 0]
        if copy and (not keep or held[0] != np.float32(image + 1)):   # not yet, this thread
            held[0] = np.float32(image + 1)
            for k in range(c_in):
                copy_run(xs, x0 + k * length, source, k * copy_row, length)
        base = 0 if copy else x0                      # x[image, k, p]: source[base + k * step + p]
        full_end = stop - short_tiles(stop - start) * (ROWS - 1)
        for k0 in range(0, max(c_in, 1), K_BLOCK):   # a slice of the sum over k
            k1 = min(c_in, k0 + K_BLOCK)
            ahead = ahead_end = w0 + k1 * COLUMNS     # the weights read next: the next
            if PREFETCH_PANELS:                       # slice's, or the next panel's
                ahead_end = min(ws.size, ahead + min(c_in, K_BLOCK) * COLUMNS)
            p0 = start
            while p0 < stop:                          # tile[r, j]: pixel p0 + r, channel c0 + j
                at = (p0 - start) * COLUMNS
                part = tile_zero()                    # the slice's chain, from zero
                if p0 < full_end:                     # part += x[k, p0:] (x) panels[k, :]
                    rows = min(ROWS, full_end - p0)
                    for k in range(k0, k1):
                        part = tile_fma(part, source, base + k * step + p0, 1, rows, ws,
                                        w0 + k * COLUMNS, COLUMNS)
                        ahead = panel_ahead(ws, ahead, ahead_end, k)
                else:
                    rows = ROWS - 1
                    for k in range(k0, k1):
                        part = tile_fma_short(part, source, base + k * step + p0, 1, rows, ws,
                                              w0 + k * COLUMNS, COLUMNS)
                        ahead = panel_ahead(ws, ahead, ahead_end, k)
                store_slice(part, sums, at, rows, k0, no_bias, no_residual, open_lo, open_hi)
                p0 += rows
        finish_band(sums, y, bias, residual, image, c0, start, stop, lo, hi, code, a, b)


@kernel(nogil=True, inline="always")
def store_slice(part, sums, at, rows, k0, no_bias, no_residual, lo, hi):
    """Store a slice's chain of sums (a tile over ``rows`` pixels from ``at`` of ``sums``),
    added to the slices before it (k0 > 0), read after the chain as pointwise.py does."""
    tile = part if k0 == 0 else tile_add(tile_load(sums, at, COLUMNS, rows, COLUMNS), part)
    tile_store(tile, sums, at, COLUMNS, rows, COLUMNS, no_bias, 0, no_residual, lo, hi)


@kernel(nogil=True)
def finish_band(sums, y, bias, residual, image, c0, start, stop, lo, hi, code, a, b):
    """A band's sums (pixels start .. stop - 1 of ``image`` by COLUMNS channels from c0, a
    row of COLUMNS a pixel, in ``sums``) into y (N, C_out, L) transposed, LANES x LANES
    blocks at a time, then bias, residual (y's shape, or no values) and the activation
    along each of y's rows, in pointwise.py's order (ReLU and ReLU6 as the clamp lo, hi)."""
    c_out, length = y.shape[1], y.shape[2]
    ys = y.reshape(y.size)
    channels, pixels = min(COLUMNS, c_out - c0), stop - start
    for p in range(0, pixels, LANES):             # the band into y, transposed
        for j in range(0, channels, LANES):
            transpose_block(sums, p * COLUMNS + j, COLUMNS, min(LANES, pixels - p),
                            LANES, ys, ((image * c_out + c0 + j) * length + start + p),
                            length, min(LANES, channels - j), min(LANES, pixels - p))
    has_residual = residual.size > 0
    for c in range(c0, c0 + channels):            # the epilogue, row by row
        shift, row = bias[c], y[image, c, start:stop]
        other = residual[image, c, start:stop] if has_residual else row[:0]
        for p in range(pixels):
            value = row[p] + shift
            if has_residual:
                value += other[p]
            if value <= lo:                       # max(value, lo): a NaN stays NaN
                value = lo
            if value >= hi:
                value = hi
            row[p] = value
    if code != NONE and code != RELU and code != CLAMP:       # other activations
        activate_block(y, image, c0, channels, start, stop, code, a, b)


def _copy_row(length: int) -> int:
    """row_of_copy's floats, in Python: ``length`` rounded up to whole cache lines."""
    return -(-length // LINE_FLOATS) * LINE_FLOATS


def copies_x(c_in: int, length: int) -> bool:
    """Whether transposed_units should copy each image's x (N, C_in, L) into its work space,
    in rows padded to whole cache lines, before its tiles read it: for images of fewer than
    COPY_BELOW pixels whose rows are not whole lines already, unless the copy would be more
    than COPY_MOST floats."""
    return (length < COPY_BELOW and length % LINE_FLOATS != 0
            and c_in * _copy_row(length) <= COPY_MOST)


@functools.lru_cache(maxsize=1024)
def band_plan(images: int, length: int, c_out: int, parts: int) -> tuple[int, int]:
    """(band_pixels, bands_for_threads) of a product, from Python (cached: a forward asks
    about the same few products every time)."""
    plan = np.zeros(2, np.int64)
    _transposed_bands(images, length, c_out, parts, plan)
    return int(plan[0]), int(plan[1])


def space_size(c_in: int, length: int) -> int:
    """Floats of work space a thread running transposed_units on x (N, C_in, L) needs (its
    row): a header, a band's partial sums, and room for x's copy where ``copies_x`` says."""
    return HEADER + BAND * COLUMNS + (c_in * _copy_row(length) if copies_x(c_in, length)
                                      else 0)


def pointwise_transposed_conv2d(panels: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                                residual: np.ndarray | None, activation: Activation,
                                y: np.ndarray) -> None:
    """y (N, C_out, L) = activation(weight @ x (N, C_in, L) + bias + residual), the weight
    given as its ``panels`` (``pack_panels``): all float32, C-contiguous; residual y's shape
    or None, and not y's memory. Shared with the team's helper threads if there is one (the
    same bits either way)."""
    product = transposed_product(panels, bias, x.shape[1], y.shape[1], x.shape[2], activation)
    product(x, None if residual is None else residual.reshape(y.shape), y)


def transposed_product(panels: np.ndarray, bias: np.ndarray | None, c_in: int, c_out: int,
                       length: int, activation: Activation) -> Callable[..., None]:
    """pointwise_transposed_conv2d of x (N, c_in, length) into y (N, c_out, length), worked
    out once: the call ``product(x, residual, y)`` takes arrays of those sizes in any shape
    that starts (N, C) (images (N, C, H, W) too), checks them (operands.check_sizes; the
    panels and bias here) and runs the kernel without the per-argument checks."""
    panels_shape = (-(-c_out // COLUMNS), c_in, COLUMNS)
    check(panels, panels_shape, "transposed 1x1 panels")
    bias = _zeros(c_out) if bias is None else bias
    check(bias, (c_out,), "transposed 1x1 bias")
    floats = space_size(c_in, length)
    work = c_in * length * c_out                   # multiply-adds of one image
    kernel, code, a, b = (unchecked(_pointwise_transposed), activation.code, activation.a,
                          activation.b)

    def product(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
        images = x.shape[0]
        check_sizes(x, (images, c_in), images * c_in * length, y, (images, c_out),
                    images * c_out * length, "transposed 1x1 product", residual)
        x, y = x.reshape(images, c_in, length), y.reshape(images, c_out, length)
        residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
        team = team_worth_sharing(images * work, SHARED_FROM)
        if team is None:
            kernel(panels, x, bias, residual, y, scratch("pointwise_transposed", (floats,)),
                   code, a, b)
        else:                                      # a row of work space per thread
            team.pointwise_transposed(panels, x, bias, residual, y,
                                      scratch("pointwise_transposed", (team.threads, floats)),
                                      activation, checked=False)
    return product
