"""1x1 convolution on small images: the product of pointwise.py turned around, output
channels in the vector lanes and pixels in the rows of the register tile.

pointwise.py's tiles are ROWS output channels by COLUMNS pixels, so an image of L pixels
fills ceil(L / COLUMNS) tiles per 6 channels. That suits large images; a 7x7 one (49
pixels) fills 77% of four 16-pixel tiles on an AVX2 machine, and EfficientNet-Lite0 spends
more time in its 7x7 1x1 layers than in any other size. Transposed, the same product is::

    y[n].T (L, C_out) = x[n].T (L, C_in) @ weight.T (C_in, C_out)

and its tiles are ROWS pixels by COLUMNS output channels: 49 pixels fill 91% of nine
6-pixel tiles, and C_out is a multiple of COLUMNS in most networks (192, 320, 1152, 1280
are). Per k a tile broadcasts 6 neighbouring pixels of row k of x (x[n, k, p0:p0+6], one
cache line) and reads COLUMNS weights, so the weight is packed once, at build, as panels of
COLUMNS output channels (``pack_panels``)::

    panels[q, k, j] = weight[q * COLUMNS + j, k]          (P, C_in, COLUMNS), zero padded

one contiguous stream per panel where the untransposed kernel reads 6 rows of the weight.
Each value of y is the same chain of fused multiply-adds over k = 0 .. C_in - 1 as in
pointwise.py (the product x w, rounded once, is w x), then + bias, + residual and the
activation in the same order: the two kernels give the same bits, and so does any number of
threads.

The tile's rows are pixels, but y is (C_out, L): a finished tile is stored as it is into a
small work space (a band of pixels by COLUMNS channels), and the epilogue writes the band
into y transposed, adding bias and residual and applying the activation on the way. A long
sum over C_in is taken in slices of K_BLOCK channels, as in pointwise.py, whose partial sums
stay in the work space (so a panel's slice of weights, K_BLOCK x COLUMNS floats, is read from
the nearest cache by every tile of pixels).

Measured on an AVX2 machine (AMD Zen, 6 x 16 tiles), in EfficientNet-Lite0 forwards at
batch 1 on two threads: 1152 -> 192 channels at 7x7 0.39-0.40 ms against 0.53-0.61
untransposed (onnxruntime: 0.34), 192 -> 1152 0.43-0.44 against 0.55-0.65 (0.33), 320 ->
1280 0.75 against 0.90; the forward's operators 21.5 -> 19.7 ms. At 14x14 (196 pixels fill
94% of 16-pixel tiles) the two kernels ran as fast as each other, so ``transposed_pays``
asks for 10% more of the lanes filled.
"""

from __future__ import annotations

import numpy as np

from layers.fast import workers
from layers.fast.backend import FLOAT, INT, array, kernel
from layers.fast.epilogue import CLAMP, NONE, RELU, Activation, activate_row, clamp_bounds
from layers.fast.pointwise import K_BLOCK, NO_RESIDUAL, _zeros
from layers.fast.simd import COLUMNS, ROWS, tile_fma, tile_load, tile_store, tile_zero

BAND = 40 * ROWS       # pixels of one unit of work at most (its partial sums: BAND x COLUMNS)
MORE_FILLED = 0.1      # transposed when its tiles fill this much more of their lanes


def lanes_filled(size: int, width: int) -> float:
    """The share of ``width``-wide blocks that ``size`` items fill: 49 in 16s, 49/64."""
    return size / (-(-size // width) * width)


def transposed_pays(length: int, c_out: int) -> bool:
    """Whether a 1x1 convolution with images of ``length`` pixels should run transposed: small
    images (one band of pixels at most) whose tiles fill at least MORE_FILLED more of their
    lanes that way (7x7: 0.91 against 0.77). On large images the epilogue, a transposition of
    y one value at a time, costs more than the lanes save: 32 -> 16 channels at 112x112 (16
    channels fill 16-channel tiles, 89% of 6-channel ones) took 0.88 ms transposed against
    0.48 upright on one thread."""
    transposed = lanes_filled(length, ROWS) * lanes_filled(c_out, COLUMNS)
    upright = lanes_filled(length, COLUMNS) * lanes_filled(c_out, ROWS)
    return length <= BAND and transposed >= upright + MORE_FILLED


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
    (layers/fast/epilogue.py); ``space``: at least BAND x COLUMNS floats."""
    images, c_in, length = x.shape
    c_out, panel_count = y.shape[1], panels.shape[0]
    bands = (length + BAND - 1) // BAND
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the epilogue: ReLU, ReLU6
    has_residual = residual.size > 0
    ws, xs = panels.reshape(panels.size), x.reshape(x.size)
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
                if k0 == 0:
                    tile = tile_zero()
                else:                                 # carry on from the slices before
                    tile = tile_load(space, at, COLUMNS, rows, COLUMNS)
                for k in range(k0, k1):               # tile += x[k, p0:] (x) panels[k, :]
                    tile = tile_fma(tile, xs, x0 + k * length + p0, 1, rows, ws,
                                    w0 + k * COLUMNS, COLUMNS)
                tile_store(tile, space, at, COLUMNS, rows, COLUMNS, no_bias, 0, no_residual,
                           open_lo, open_hi)
        for j in range(min(COLUMNS, c_out - c0)):     # the epilogue, into y transposed
            c = c0 + j
            shift, row = bias[c], y[image, c]
            for p in range(start, stop):
                value = space[(p - start) * COLUMNS + j] + shift
                if has_residual:
                    value += residual[image, c, p]
                if value <= lo:                       # max(value, lo): a NaN stays NaN
                    value = lo
                if value >= hi:
                    value = hi
                row[p] = value
            if code != NONE and code != RELU and code != CLAMP:   # other activations
                activate_row(row[start:stop], code, a, b)


def space_size() -> int:
    """Floats of work space one chunk of transposed_units needs."""
    return BAND * COLUMNS


def pointwise_transposed_conv2d(panels: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                                residual: np.ndarray | None, activation: Activation,
                                y: np.ndarray) -> None:
    """y (N, C_out, L) = activation(weight @ x (N, C_in, L) + bias + residual), the weight
    given as its ``panels`` (``pack_panels``): all float32, C-contiguous; residual y's shape
    or None. Shared with the team's helper threads if there is one (the same bits either
    way)."""
    bias = _zeros(y.shape[1]) if bias is None else bias
    residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
    team = workers.current()
    space = workers.scratch("pointwise_transposed",
                            (1 if team is None else team.threads, space_size()))
    if team is None:
        _pointwise_transposed(panels, x, bias, residual, y, space[0], activation.code,
                              activation.a, activation.b)
    else:
        team.pointwise_transposed(panels, x, bias, residual, y, space, activation)
