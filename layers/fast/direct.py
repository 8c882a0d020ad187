"""Dense convolution (one group, any kernel, stride, dilation and padding) without cols:
output channels in the vector lanes, as in pointwise_transposed.py, the input read in place
of cols::

    y[n, o, oh, ow] = bias[o] + sum_{c, i, j} w[o, c, i, j]
                                * x[n, c, oh*sh + i*dh - top, ow*sw + j*dw - left]

A register tile is ROWS output pixels of one output row by COLUMNS output channels. For each
k = (c, i, j), in the order of im2col's rows of cols, it multiplies the panel's COLUMNS
weights of k (``pack_panels`` of the (C_out, C_in*kh*kw) matrix: gemm_transposed's packing)
by ROWS input values sw apart, each one broadcast to a vector: the ROWS windows' values of
tap (i, j) of channel c. im2col would first copy every window (kh*kw/(sh*sw) times the
input) and the product read them back; here the tiles read a band's input rows, copied once
per band and thread into the work space with the padding's zeros around them
(``copy_band``), at an offset per k worked out once a call (``taps``).

Units are pointwise_transposed.py's: one image's band of output pixels (whole output rows
where they fit in BAND, else a segment of a row, whose copy holds only the columns its
windows read) by one panel of COLUMNS channels, the panel changing fastest, so that
consecutive units read the same copy; the sums, their slices of K_BLOCK, the short
tiles that cover a row without a part-filled one and the epilogue (``finish_band``) are its
too. Each output is the same chain of fused multiply-adds as in the transposed product on
im2col's cols (and in the upright one's tiles, but for a tail it sums as dot products):
the same bits, on any number of threads. A panel of at most LANES channels runs one vector
a row (half the multiply-adds).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import Activation, clamp_bounds
from layers.fast.phases import (DIL_H, DIL_W, HEIGHT, KH, KW, LEFT, OUT_H, OUT_W,
                                STRIDE_H, STRIDE_W, TOP, WIDTH, geometry_of)
from layers.fast.pointwise import (HEADER, K_BLOCK, LINE_FLOATS, NO_RESIDUAL, SHARED_FROM,
                                   _zeros, copy_run, forget_band)
from layers.fast.pointwise_transposed import BAND, finish_band, short_tiles, store_slice
from layers.fast.simd import (COLUMNS, LANES, ROWS, tile_fma, tile_fma_narrow, tile_fma_short,
                              tile_zero)
from layers.fast.operands import check, check_sizes, unchecked
from layers.fast.team import scratch, team_worth_sharing


@kernel(nogil=True, inline="always")
def copy_width(geometry, band):
    """Floats of a row of a band's copy: the padded input columns that the windows of a
    whole output row read, or (rows longer than BAND, cut into segments of ``band``) those
    of one segment."""
    out_w = band if geometry[OUT_W] > BAND else geometry[OUT_W]   # a segment: band <= OUT_W
    return (out_w - 1) * geometry[STRIDE_W] + (geometry[KW] - 1) * geometry[DIL_W] + 1


@kernel(nogil=True, inline="always")
def band_rows(geometry, first_row, last_row):
    """Padded input rows that output rows first_row .. last_row read."""
    return ((last_row - first_row) * geometry[STRIDE_H]
            + (geometry[KH] - 1) * geometry[DIL_H] + 1)


@kernel(nogil=True)
def direct_band(geometry, images, panel_count, parts):
    """Output pixels of a band: as many whole output rows as BAND holds, or, for rows
    longer than BAND, a segment of one row (the fewest of at most BAND, all as long but the
    last); cut smaller where the units (images x bands x panels) would be fewer than the
    ``parts`` threads sharing them."""
    out_h, out_w = geometry[OUT_H], max(geometry[OUT_W], 1)
    length = out_h * out_w
    few = images * panel_count                       # units of one band each
    if out_w > BAND:                                 # segments of rows
        segments = (out_w + BAND - 1) // BAND
        if few * out_h * segments < parts:
            segments = min(max(segments, (parts + few * out_h - 1) // (few * out_h)), out_w)
        return (out_w + segments - 1) // segments
    band = min(BAND // out_w * out_w, max(length, 1))
    if few * ((length + band - 1) // band) < parts and length > 1:
        wanted = min((parts + few - 1) // few, length)
        band = (length + wanted - 1) // wanted
    return band


@kernel(nogil=True, inline="always")
def band_count(geometry, band):
    """Bands of ``band`` pixels an image's output is cut into: segments of each row, for
    rows longer than BAND (``direct_band``), else runs of the flattened output."""
    out_h, out_w = geometry[OUT_H], geometry[OUT_W]
    if out_w > BAND:
        return out_h * ((out_w + band - 1) // band)
    return (out_h * out_w + band - 1) // band


@kernel(nogil=True)
def copy_floats(geometry, band):
    """Floats of a band's copy, for C_in = 1: the rows a band of ``band`` pixels can read
    (however it falls on the output rows; a segment keeps to one) by copy_width."""
    out_w = max(geometry[OUT_W], 1)
    spans = 1 if out_w > BAND else max(min((band + out_w - 2) // out_w + 1, geometry[OUT_H]), 1)
    return band_rows(geometry, 0, spans - 1) * copy_width(geometry, band)


@kernel(nogil=True, exported=(array(1, INT), INT, INT, INT, array(1, INT)))
def _direct_plan(geometry, images, panel_count, parts, plan):
    """plan[0] = direct_band, plan[1] = copy_floats of it: for the Python side."""
    plan[0] = direct_band(geometry, images, panel_count, parts)
    plan[1] = copy_floats(geometry, plan[0])


@kernel(nogil=True, inline="always")
def copy_band(xs, x0, c_in, geometry, row0, rows, col0, row_w, plane, source):
    """Padded input rows row0 .. row0 + rows - 1, columns col0 .. col0 + row_w - 1, of every
    channel of the image at xs[x0:] (C_in, H*W) into source[c * plane + r * row_w:], zeros
    where a row or column lies in the padding."""
    height, width, top, left = geometry[HEIGHT], geometry[WIDTH], geometry[TOP], geometry[LEFT]
    inside_from = min(max(left - col0, 0), row_w)                  # the copied columns
    inside_to = min(max(left + width - col0, inside_from), row_w)
    zero = np.float32(0.0)
    for c in range(c_in):
        for r in range(rows):
            at, line = c * plane + r * row_w, row0 + r - top
            if line < 0 or line >= height:
                source[at:at + row_w] = zero
                continue
            source[at:at + inside_from] = zero
            if inside_to > inside_from:
                copy_run(xs, x0 + (c * height + line) * width + col0 + inside_from - left,
                         source, at + inside_from, inside_to - inside_from)
            source[at + inside_to:at + row_w] = zero


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), array(3), array(1),
                              array(1, INT), INT, FLOAT, FLOAT))
def _direct(panels, x, bias, residual, y, space, geometry, code, a, b):
    """y (N, C_out, Ho*Wo) = activation(conv(x (N, C_in, H*W)) + bias + residual), the
    weight as ``panels``, every unit (``direct_units``; ``space``: space_size floats)."""
    forget_band(space)
    band = direct_band(geometry, x.shape[0], panels.shape[0], 1)
    direct_units(panels, x, bias, residual, y, space, geometry, code, a, b, band, np.int64(0),
                 unit_count(geometry, x.shape[0], panels.shape[0], band))


@kernel(nogil=True)
def unit_count(geometry, images, panel_count, band):
    """Units of work: every image's bands of ``band`` output pixels, by panels."""
    return images * band_count(geometry, band) * panel_count


@kernel(nogil=True)
def direct_units(panels, x, bias, residual, y, space, geometry, code, a, b, band, first,
                 last):
    """Units first .. last - 1 of _direct's y: one image's band of ``band`` output pixels
    (``direct_band``) by one panel of COLUMNS channels, the panel changing fastest. The
    band's input rows are copied (``copy_band``) into ``space`` after its HEADER and the
    band's sums, once per band and thread: the header says which band the space holds
    (zero for none: ``forget_band`` before each call). ``bias``: C_out values; ``residual``
    y's shape, or no values for none; ``code``, a, b: the activation. y must not overlap x
    or residual."""
    images, c_in = x.shape[0], x.shape[1]
    kh, kw, stride_h, stride_w = geometry[KH], geometry[KW], geometry[STRIDE_H], geometry[STRIDE_W]
    dil_h, dil_w, out_w = geometry[DIL_H], geometry[DIL_W], geometry[OUT_W]
    depth, length = c_in * kh * kw, geometry[OUT_H] * out_w
    c_out, panel_count = y.shape[1], panels.shape[0]
    bands = band_count(geometry, band)
    segments = (out_w + band - 1) // band if out_w > BAND else 0   # a row's, if cut
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the epilogue: ReLU, ReLU6
    ws, xs = panels.reshape(panels.size), x.reshape(x.size)
    no_bias, no_residual = np.zeros(ROWS, np.float32), xs[:0]
    held, sums = space[:HEADER], space[HEADER:HEADER + BAND * COLUMNS]
    row_w = copy_width(geometry, band)
    plane = copy_floats(geometry, band)
    source = space[HEADER + BAND * COLUMNS:HEADER + BAND * COLUMNS + c_in * plane]
    taps = np.empty(depth, np.int64)                  # k = (c, i, j): its offset in the copy
    for k in range(depth):
        c, tap = k // (kh * kw), k % (kh * kw)
        taps[k] = c * plane + tap // kw * dil_h * row_w + tap % kw * dil_w
    keep = images * bands < (1 << 24)                 # band numbers exact as float32
    for unit in range(first, last):
        image, index = unit // (bands * panel_count), unit % (bands * panel_count)
        at_band, panel = index // panel_count, index % panel_count
        if segments:                                  # a segment of one row
            start = at_band // segments * out_w + at_band % segments * band
            stop = min(start + band, (at_band // segments + 1) * out_w)
        else:
            start = at_band * band
            stop = min(length, start + band)
        first_row = start // out_w
        row0 = first_row * stride_h                   # the copy's first padded input row
        col0 = (start - first_row * out_w) * stride_w if segments else 0   # and column
        held_band = np.float32(image * bands + at_band + 1)
        if not keep or held[0] != held_band:          # not yet, by this thread
            held[0] = held_band
            copy_band(xs, image * c_in * geometry[HEIGHT] * geometry[WIDTH], c_in, geometry,
                      row0, band_rows(geometry, first_row, (stop - 1) // out_w), col0, row_w,
                      plane, source)
        c0 = panel * COLUMNS
        w0 = panel * depth * COLUMNS                  # panels[panel, 0, 0]
        narrow = c_out - c0 <= LANES                  # one vector a row is enough
        for k0 in range(0, max(depth, 1), K_BLOCK):   # a slice of the sum over k
            k1 = min(depth, k0 + K_BLOCK)
            p0 = start
            while p0 < stop:                          # tile[r, j]: pixel p0 + r, channel c0 + j
                oh = p0 // out_w
                ow = p0 - oh * out_w
                row_end = min(stop, (oh + 1) * out_w)
                full_end = row_end
                if not narrow:                        # tiles of ROWS - 1 end the row's part
                    full_end -= short_tiles(row_end - max(start, oh * out_w)) * (ROWS - 1)
                at = (p0 - start) * COLUMNS
                x0 = (oh * stride_h - row0) * row_w + ow * stride_w - col0   # tap (0, 0, 0)
                part = tile_zero()                    # the slice's chain, from zero
                # strides 1 and 2 and whole tiles pass constants: the ROWS reads of a k are
                # then fixed offsets from one address (a stride known at run time only
                # costs an address a row, every k)
                if p0 < full_end:
                    rows = min(ROWS, full_end - p0)
                    if narrow and rows == ROWS and stride_w == 1:
                        for k in range(k0, k1):
                            part = tile_fma_narrow(part, source, x0 + taps[k], 1, ROWS, ws,
                                                   w0 + k * COLUMNS, LANES)
                    elif narrow and rows == ROWS and stride_w == 2:
                        for k in range(k0, k1):
                            part = tile_fma_narrow(part, source, x0 + taps[k], 2, ROWS, ws,
                                                   w0 + k * COLUMNS, LANES)
                    elif narrow:
                        for k in range(k0, k1):
                            part = tile_fma_narrow(part, source, x0 + taps[k], stride_w, rows,
                                                   ws, w0 + k * COLUMNS, LANES)
                    elif rows == ROWS and stride_w == 1:
                        for k in range(k0, k1):
                            part = tile_fma(part, source, x0 + taps[k], 1, ROWS, ws,
                                            w0 + k * COLUMNS, COLUMNS)
                    elif rows == ROWS and stride_w == 2:
                        for k in range(k0, k1):
                            part = tile_fma(part, source, x0 + taps[k], 2, ROWS, ws,
                                            w0 + k * COLUMNS, COLUMNS)
                    else:
                        for k in range(k0, k1):
                            part = tile_fma(part, source, x0 + taps[k], stride_w, rows, ws,
                                            w0 + k * COLUMNS, COLUMNS)
                else:
                    rows = ROWS - 1
                    if stride_w == 1:
                        for k in range(k0, k1):
                            part = tile_fma_short(part, source, x0 + taps[k], 1, ROWS - 1, ws,
                                                  w0 + k * COLUMNS, COLUMNS)
                    elif stride_w == 2:
                        for k in range(k0, k1):
                            part = tile_fma_short(part, source, x0 + taps[k], 2, ROWS - 1, ws,
                                                  w0 + k * COLUMNS, COLUMNS)
                    else:
                        for k in range(k0, k1):
                            part = tile_fma_short(part, source, x0 + taps[k], stride_w, rows,
                                                  ws, w0 + k * COLUMNS, COLUMNS)
                store_slice(part, sums, at, rows, k0, no_bias, no_residual, open_lo, open_hi)
                p0 += rows
        finish_band(sums, y, bias, residual, image, c0, start, stop, lo, hi, code, a, b)


@functools.lru_cache(maxsize=1024)
def direct_plan(geometry: tuple[int, ...], images: int, panel_count: int,
                parts: int) -> tuple[int, int]:
    """(direct_band, copy_floats) of a convolution, from Python (cached)."""
    plan = np.zeros(2, np.int64)
    _direct_plan(np.array(geometry, np.int64), images, panel_count, parts, plan)
    return int(plan[0]), int(plan[1])


def row_fill(out_w: int, c_out: int) -> float:
    """The share of its tiles' pixels an output row of ``out_w`` fills (direct_units's
    tiling: ROWS, then short tiles of ROWS - 1 where they cover the row exactly; the last
    ROWS-pixel tile part-filled otherwise, and always for a panel of at most LANES
    channels): 7 in tiles of 6 fills 7/12, 10 in 5 + 5 all (no row: 0)."""
    if out_w <= 0:
        return 0.0
    tiles = -(-out_w // ROWS)
    short = (ROWS - out_w % ROWS) % ROWS
    if c_out > LANES and short * (ROWS - 1) <= out_w:
        return 1.0
    return out_w / (tiles * ROWS)


def lane_fill(c_out: int) -> float:
    """The share of its tiles' lanes ``c_out`` output channels fill: panels of COLUMNS, the
    last one a single vector of LANES if it has at most LANES channels (3 of 16 fill 3/16;
    33 of 32 + 16 fill 33/48; none: 0)."""
    whole, rest = divmod(max(c_out, 0), COLUMNS)
    used = whole * COLUMNS + (0 if rest == 0 else LANES if rest <= LANES else COLUMNS)
    return c_out / used if used else 0.0


def copy_size(kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
              out_hw: tuple[int, int]) -> int:
    """Floats of a band's copy for each input channel, on one thread (its largest band)."""
    geometry = geometry_of(kernel, stride, dilation, 0, 0, (0, 0), out_hw)
    return direct_plan(tuple(int(v) for v in geometry), 1, 1, 1)[1]


def space_size(c_in: int, copy: int) -> int:
    """Floats of work space a thread running direct_units needs (its row): a header, a
    band's sums and the copy of its input rows (``copy`` floats a channel), rounded up to
    whole cache lines (every thread's row then starts on one, as the first does)."""
    floats = HEADER + BAND * COLUMNS + c_in * copy
    return -(-floats // LINE_FLOATS) * LINE_FLOATS


def direct_product(panels: np.ndarray, bias: np.ndarray | None, c_in: int, c_out: int,
                   kernel: tuple[int, int], stride: tuple[int, int],
                   pads: tuple[int, int, int, int], dilation: tuple[int, int],
                   hw: tuple[int, int], out_hw: tuple[int, int],
                   activation: Activation) -> Callable[..., None]:
    """The direct convolution of x (N, c_in, *hw) into y (N, c_out, *out_hw), worked out
    once: ``product(x, residual, y)`` checks the arrays' sizes and runs the kernel, shared
    with the team's helpers when that pays (the same bits either way). ``panels``:
    pack_panels of the (C_out, C_in*kh*kw) weight; pads (top, bottom, left, right)."""
    depth = c_in * kernel[0] * kernel[1]
    check(panels, (-(-c_out // COLUMNS), depth, COLUMNS), "direct convolution panels")
    bias = _zeros(c_out) if bias is None else bias
    check(bias, (c_out,), "direct convolution bias")
    geometry = geometry_of(kernel, stride, dilation, pads[0], pads[2], hw, out_hw)
    plan_key = tuple(int(v) for v in geometry)     # direct_plan's cache key, made once
    in_size, length = hw[0] * hw[1], out_hw[0] * out_hw[1]
    work = depth * length * c_out                  # multiply-adds of one image
    run, code, a, b = unchecked(_direct), activation.code, activation.a, activation.b

    def product(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
        images = x.shape[0]
        check_sizes(x, (images, c_in), images * c_in * in_size, y, (images, c_out),
                    images * c_out * length, "direct convolution", residual)
        if images * length == 0:                   # no output to write
            return
        x, y = x.reshape(images, c_in, in_size), y.reshape(images, c_out, length)
        residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
        team = team_worth_sharing(images * work, SHARED_FROM)
        parts = 1 if team is None else team.threads
        _, copy = direct_plan(plan_key, images, panels.shape[0], parts)
        floats = space_size(c_in, copy)
        if team is None:
            run(panels, x, bias, residual, y, scratch("direct", (floats,)), geometry, code,
                a, b)
        else:                                      # a row of work space per thread
            team.direct(panels, x, bias, residual, y,
                        scratch("direct", (team.threads, floats)), geometry, activation,
                        checked=False)
    return product

