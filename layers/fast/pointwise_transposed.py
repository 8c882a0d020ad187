"""1x1 convolution on small images: pointwise.py's product turned around, output channels in
the vector lanes and pixels in the rows of the register tile::

    y[n].T (L, C_out) = x[n].T (L, C_in) @ weight.T (C_in, C_out)

Its tiles are ROWS pixels by COLUMNS output channels, which fill more lanes than pointwise.py's
ROWS channels by COLUMNS pixels when images are small (49 pixels in 6-pixel rows against
16-pixel vectors) and C_out is a multiple of COLUMNS, as in most networks
(``transposed_pays`` says when). The weight is packed once as panels of COLUMNS output
channels (``pack_panels``)::

    panels[q, k, j] = weight[q * COLUMNS + j, k]          (P, C_in, COLUMNS), zero padded

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

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import CLAMP, NONE, RELU, Activation, activate_block, clamp_bounds
from layers.fast.pointwise import K_BLOCK, NO_RESIDUAL, SHARED_FROM, _zeros
from layers.fast.simd import (COLUMNS, LANES, ROWS, tile_add, tile_fma, tile_load, tile_store,
                              tile_zero, transpose_block)
from layers.fast.team import scratch, team_worth_sharing

BAND = 40 * ROWS       # pixels of one unit of work at most (its partial sums: BAND x COLUMNS)
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
    fewer channels to pay for the epilogue)."""
    transposed = lanes_filled(length, ROWS) * lanes_filled(c_out, COLUMNS)
    upright = lanes_filled(length, COLUMNS) * lanes_filled(c_out, ROWS)
    return length <= BAND and c_in / transposed + EPILOGUE_CHANNELS < c_in / upright


def pack_panels(weight: np.ndarray) -> np.ndarray:
    """weight (C_out, C_in) -> panels (ceil(C_out / COLUMNS), C_in, COLUMNS), float32:
    panels[q, k, j] = weight[q * COLUMNS + j, k], zeros past C_out."""
    c_out, c_in = weight.shape
    whole, rest = divmod(c_out, COLUMNS)
    panels = np.empty((whole + (rest > 0), c_in, COLUMNS), np.float32)   # one copy, no more
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
    space_size() floats)."""
    transposed_units(panels, x, bias, residual, y, space, code, a, b, np.int64(0),
                     unit_count(x.shape[0], panels.shape[0], x.shape[2]))


@kernel(nogil=True)
def unit_count(images, panel_count, length):
    """Units of work: every image's bands of at most BAND pixels, by panels of channels."""
    return images * ((length + BAND - 1) // BAND) * panel_count


@kernel(nogil=True)
def transposed_units(panels, x, bias, residual, y, space, code, a, b, first, last):
    """Units first .. last - 1 of _pointwise_transposed's y. A unit is one image's band of
    pixels by one panel of COLUMNS channels; consecutive units share the band (the panel
    changes fastest), so the band of x stays in cache. ``bias`` has C_out values (zeros for
    none); ``residual`` y's shape, or no values for none; ``code``, a, b: the activation
    (layers/fast/epilogue.py); ``space``: at least BAND x COLUMNS floats. y must not overlap
    residual: a band is written into y before the residual is read."""
    images, c_in, length = x.shape
    c_out, panel_count = y.shape[1], panels.shape[0]
    bands = (length + BAND - 1) // BAND
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the epilogue: ReLU, ReLU6
    has_residual = residual.size > 0
    ws, xs, ys = panels.reshape(panels.size), x.reshape(x.size), y.reshape(y.size)
    no_bias, no_residual = np.zeros(ROWS, np.float32), xs[:0]
    for unit in range(first, last):
        image, index = unit // (bands * panel_count), unit % (bands * panel_count)
        band, panel = index // panel_count, index % panel_count
        start = band * BAND
        stop = min(length, start + BAND)
        c0 = panel * COLUMNS
        w0 = panel * c_in * COLUMNS                    # panels[panel, 0, 0]
        x0 = image * c_in * length                     # x[image, 0, 0]
        for k0 in range(0, max(c_in, 1), K_BLOCK):   # a slice of the sum over k
            k1 = min(c_in, k0 + K_BLOCK)
            for p0 in range(start, stop, ROWS):       # tile[r, j]: pixel p0 + r, channel c0 + j
                rows = min(ROWS, stop - p0)
                at = (p0 - start) * COLUMNS
                part = tile_zero()                    # the slice's chain, from zero
                for k in range(k0, k1):               # part += x[k, p0:] (x) panels[k, :]
                    part = tile_fma(part, xs, x0 + k * length + p0, 1, rows, ws,
                                    w0 + k * COLUMNS, COLUMNS)
                # carried on from the slices before, read after the chain (as pointwise.py)
                tile = part if k0 == 0 else tile_add(tile_load(space, at, COLUMNS, rows,
                                                               COLUMNS), part)
                tile_store(tile, space, at, COLUMNS, rows, COLUMNS, no_bias, 0, no_residual,
                           open_lo, open_hi)
        channels, pixels = min(COLUMNS, c_out - c0), stop - start
        for p in range(0, pixels, LANES):             # the band into y, transposed
            for j in range(0, channels, LANES):
                transpose_block(space, p * COLUMNS + j, COLUMNS, min(LANES, pixels - p),
                                LANES, ys, ((image * c_out + c0 + j) * length + start + p),
                                length, min(LANES, channels - j), min(LANES, pixels - p))
        for c in range(c0, c0 + channels):            # the epilogue, row by row
            shift, row = bias[c], y[image, c, start:stop]
            other = residual[image, c, start:stop] if has_residual else no_residual
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


def space_size() -> int:
    """Floats of work space a thread running transposed_units needs (its row)."""
    return BAND * COLUMNS


def pointwise_transposed_conv2d(panels: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                                residual: np.ndarray | None, activation: Activation,
                                y: np.ndarray) -> None:
    """y (N, C_out, L) = activation(weight @ x (N, C_in, L) + bias + residual), the weight
    given as its ``panels`` (``pack_panels``): all float32, C-contiguous; residual y's shape
    or None, and not y's memory. Shared with the team's helper threads if there is one (the
    same bits either way)."""
    bias = _zeros(y.shape[1]) if bias is None else bias
    residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
    team = team_worth_sharing(x.shape[0] * x.shape[1] * x.shape[2] * y.shape[1], SHARED_FROM)
    if team is None:
        _pointwise_transposed(panels, x, bias, residual, y,
                              scratch("pointwise_transposed", (space_size(),)),
                              activation.code, activation.a, activation.b)
    else:                                      # a row of work space per thread
        team.pointwise_transposed(panels, x, bias, residual, y,
                                  scratch("pointwise_transposed",
                                          (team.threads, space_size())), activation)
