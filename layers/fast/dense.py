"""Fully connected layers (nn.Linear, an attention's projections) as a register-tiled matrix
product on the weight as panels::

    y (M, N) = activation(x (M, K) @ weight.T (K, N) + bias)

Each tile is ROWS rows of x by COLUMNS output features (simd.py: 6 x 2 vectors): a value of
x broadcast against COLUMNS weights of one panel, read as one run of memory. The panels are
pointwise_transposed.py's (``pack_panels``)::

    panels[q, k, j] = weight[q * COLUMNS + j, k]          (P, K, COLUMNS), zero padded

so a weight that comes from memory rather than cache (a forward reads each layer's weight
once per band of rows) streams in order, which the CPU prefetches, instead of a line from
each of many rows.
A small weight is packed once, a copy (``_dense``); a large one is read as stored, (N, K),
each unit packing its panel into the thread's work space first (``_dense_rows``, as BLAS
packs its operands): no second copy of the weight in memory.

Work is cut into units: a band of at most BAND rows of x by one panel; consecutive units
share the band (the panel changes fastest), so the band stays in cache while the panels
stream past. A sum over more than K_BLOCK features is taken in slices, as in pointwise.py:
each slice one chain of fused multiply-adds from zero, added to the partial sums held in y.
Then the bias and the activation, row by row (a clamp in the same pass; other activations in
epilogue.activate_block, a kernel of its own). Each value of y is the same sum wherever its
unit falls: the result does not depend on how many threads share the work.
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import (CLAMP, NO_ARRAY, NONE, RELU, Activation, activate_block,
                                  clamp_bounds)
from layers.fast.pointwise import K_BLOCK, SHARED_FROM
from layers.fast.simd import (COLUMNS, LANES, ROWS, tile_add, tile_fma, tile_load, tile_store,
                              tile_zero, transpose_block)
from layers.fast.team import scratch, team_worth_sharing

BAND = 40 * ROWS       # rows of x in one unit of work at most


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), INT, FLOAT, FLOAT))
def _dense(panels, x, bias, y, code, a, b):
    """y[0] (M, N) = activation(x[0] (M, K) @ weight.T + bias) from the weight's ``panels``,
    every unit (``dense_units``)."""
    dense_units(panels, x, bias, y, np.zeros(0, np.float32), code, a, b, np.int64(0),
                unit_count(x.shape[1], y.shape[2]))


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), array(1), INT, FLOAT,
                              FLOAT))
def _dense_rows(weight, x, bias, y, space, code, a, b):
    """_dense on the weight as stored, weight[0] (N, K), each unit packing its panel into
    ``space`` (space_size(K) floats) first."""
    dense_units(weight, x, bias, y, space, code, a, b, np.int64(0),
                unit_count(x.shape[1], y.shape[2]))


@kernel(nogil=True)
def unit_count(rows, width):
    """Units of work: bands of at most BAND rows by panels of COLUMNS of the width features
    of y."""
    return (rows + BAND - 1) // BAND * panel_count(width)


@kernel(nogil=True, inline="always")
def panel_count(width):
    """Panels of COLUMNS features that hold ``width`` (the last one zero padded)."""
    return (width + COLUMNS - 1) // COLUMNS


def space_size(depth: int) -> int:
    """Floats of work space a thread packing panels of ``depth`` (K) weights needs."""
    return max(depth, 1) * COLUMNS


@kernel(nogil=True, inline="always")
def pack_panel(rows, first, count, panel):
    """panel[k * COLUMNS + j] = rows[first + j, k] for j < count, 0 for count <= j < COLUMNS:
    one panel of pack_panels, from the weight (N, K) as stored, LANES x LANES blocks at a
    time (simd.py's transpose_block)."""
    depth = rows.shape[1]
    flat = rows.reshape(rows.size)
    for j0 in range(0, COLUMNS, LANES):
        lanes_in = max(0, min(LANES, count - j0))
        for k0 in range(0, depth, LANES):
            transpose_block(flat, (first + j0) * depth + k0, depth, lanes_in,
                            min(LANES, depth - k0), panel, k0 * COLUMNS + j0, COLUMNS,
                            min(LANES, depth - k0), LANES)


@kernel(nogil=True)
def dense_units(weight, x, bias, y, space, code, a, b, first, last):
    """Units first .. last - 1 of _dense's y: x (1, M, K) and y (1, M, N), float32; the
    weight as panels (ceil(N / COLUMNS), K, COLUMNS), or, with a ``space`` of space_size(K)
    floats (else empty), as stored: (1, N, K) (``check_operands``). ``bias`` N values, or none (an
    empty array); ``code``, a, b: the activation (layers/fast/epilogue.py)."""
    rows_in_x, depth = x.shape[1], x.shape[2]
    width = y.shape[2]
    packs = space.shape[0] > 0                        # the weight as stored: pack each panel
    panels = panel_count(width)
    lo, hi = clamp_bounds(code, a, b)                 # ReLU and ReLU6 are clamps
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)
    has_bias = bias.shape[0] > 0
    xs, ys = x.reshape(x.size), y.reshape(y.size)
    ws = space if packs else weight.reshape(weight.size)
    no_bias, no_residual = np.zeros(ROWS, np.float32), xs[:0]
    for unit in range(first, last):
        band, panel = unit // panels, unit % panels
        start = band * BAND
        stop = min(rows_in_x, start + BAND)
        c0 = panel * COLUMNS
        count = min(COLUMNS, width - c0)
        w0 = 0                                        # the panel packed into the space
        if packs:
            pack_panel(weight[0], c0, count, space)
        else:
            w0 = panel * depth * COLUMNS              # panels[panel, 0, 0]
        for k0 in range(0, max(depth, 1), K_BLOCK):   # a slice of the sum over k
            k1 = min(depth, k0 + K_BLOCK)
            for m0 in range(start, stop, ROWS):       # tile[r, j]: row m0 + r, column c0 + j
                rows = min(ROWS, stop - m0)
                at = m0 * width + c0
                part = tile_zero()                    # the slice's chain, from zero
                for k in range(k0, k1):               # part += x[m0:, k] (x) panels[k, :]
                    part = tile_fma(part, xs, m0 * depth + k, depth, rows, ws,
                                    w0 + k * COLUMNS, COLUMNS)
                tile = part if k0 == 0 else tile_add(tile_load(ys, at, width, rows, count),
                                                     part)
                tile_store(tile, ys, at, width, rows, count, no_bias, 0, no_residual,
                           open_lo, open_hi)
        if has_bias:                                  # the bias, then a clamp (or none)
            for m in range(start, stop):
                row, shift = y[0, m, c0:c0 + count], bias[c0:c0 + count]
                for j in range(count):
                    row[j] = min(max(row[j] + shift[j], lo), hi)
        elif code == RELU or code == CLAMP:
            for m in range(start, stop):
                row = y[0, m, c0:c0 + count]
                for j in range(count):
                    row[j] = min(max(row[j], lo), hi)
        if code != NONE and code != RELU and code != CLAMP:       # other activations
            activate_block(y, np.int64(0), start, stop - start, c0, c0 + count, code, a, b)


def dense(weight: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
          activation: Activation, y: np.ndarray) -> None:
    """y (M, N) = activation(x (M, K) @ weight.T + bias), the weight given as its panels
    (P, K, COLUMNS: pointwise_transposed.pack_panels) or as stored (N, K), packed panel by
    panel as the product goes: float32, C-contiguous; bias (N,) or None. Shared with the
    team's helper threads if there is one (the same bits either way)."""
    check_operands(weight, x, bias, y)
    (m, k), n = x.shape, y.shape[1]
    x3, y3 = x.reshape(1, m, k), y.reshape(1, m, n)
    bias = NO_ARRAY if bias is None else bias
    team = team_worth_sharing(m * k * n, SHARED_FROM)
    code, a, b = activation.code, activation.a, activation.b
    if weight.ndim == 3:                              # panels
        if team is None:
            _dense(weight, x3, bias, y3, code, a, b)
        else:
            team.dense(weight, x3, bias, y3, NO_SPACE, activation)
        return
    threads = 1 if team is None else team.threads
    space = scratch("dense", (threads, space_size(k)))
    if team is None:
        _dense_rows(weight[None], x3, bias, y3, space[0], code, a, b)
    else:
        team.dense(weight[None], x3, bias, y3, space, activation)


def check_operands(weight: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                   y: np.ndarray) -> None:
    """ValueError unless the kernels can read these as one product (they read memory as
    the shapes say, unchecked): x (M, K) and y (M, N), y C-contiguous (written in place);
    the weight (N, K), or its panels (ceil(N / COLUMNS), K, COLUMNS); bias (N,) or None."""
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"dense: x {x.shape} and y {y.shape} must be matrices")
    (m, k), n = x.shape, y.shape[1]
    fits = (weight.shape == (n, k) if weight.ndim == 2 else
            weight.shape == (-(-n // COLUMNS), k, COLUMNS))
    if not fits or y.shape[0] != m or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"dense: weight {weight.shape}, x {x.shape}, bias "
                         f"{None if bias is None else bias.shape} and y {y.shape} disagree")
    if not y.flags.c_contiguous:
        raise ValueError("dense: y must be C-contiguous (the kernel writes it in place)")


NO_SPACE = np.zeros((0, 0), np.float32)       # the weight as panels: no packing, no space
