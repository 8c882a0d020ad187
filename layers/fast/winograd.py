"""Winograd convolution F(4x4, 3x3): 3x3 kernels, stride 1, dilation 1, groups 1.

A 4x4 block of outputs of a 3x3 convolution reads a 6x6 input tile d. Winograd's minimal
filtering algorithm (Lavin & Gray, 2015) computes it with 36 multiplications instead of 144::

    Y (4x4) = A^T [ (G g G^T) * (B^T d B) ] A          * elementwise, g the 3x3 filter

Summed over input channels, the elementwise products become 36 independent matrix products,
one per position k of the 6x6 transformed tile::

    U[k] = (G g G^T)[k]   (C_out, C_in)    weights, transformed once at build
    V[k] = (B^T d B)[k]   (C_in, T)        every input tile t (T = N * tiles), numba
    M[k] = U[k] @ V[k]    (C_out, T)       36 products in register tiles (pointwise.py)
    y    = A^T M A        + bias, residual, activation, written into (N, C_out, Ho, Wo)

The transforms B, G, A interpolate at the points 0, +-1/sqrt(2), +-sqrt(2) and infinity.
In float32 the error of output (i, j) grows with s_i s_j, where

    s_i^2 = sum_k A^T[i, k]^2 |G[k]|^2 |B^T[k]|^2

and these points give a largest s_i^2 within 1% of the least found for any five points and
infinity, 4.4x below that of 0, +-1, +-2. Most of the error is the float32 rounding of the
36 sums over input channels, which A amplifies: they run in chains of 16 channels, longer
with more channels (pointwise.stack_chain), and algorithms.py runs F(4x4) only with
WINOGRAD_MIN_CHANNELS to WINOGRAD_MAX_CHANNELS input channels, where its largest error
against float64 stays within 4x torch's (tests/fast/test_precision.py). The transforms run
in float32, with float32 constants. Tiles hanging over the border read zeros and write
nothing outside the output.

With helper threads (workers.py), either the threads share each step (planes of the
transforms, blocks of the products), or, for a batch that shares out by whole images or an
image tall enough for a strip of rows of tiles per thread, each thread runs the three steps
alone on its part (``strips_apart``), so that its V and M stay in its own core's cache.
"""

from __future__ import annotations

import math

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import IDENTITY, Activation, NO_ARRAY, activate_row, finish_row
from layers.fast.pointwise import in_panels, pointwise_conv2d, space_size
from layers.fast.simd import COLUMNS, ROWS
from layers.fast.team import current_team, scratch

NO_RESIDUAL = np.zeros((0, 0, 0, 0), np.float32)
CHUNK_BYTES = 8 * 2 ** 20              # bytes of V and M per chunk of a batch (images, or
                                       # strips of an image's rows of tiles: ``chunks``)
STRIPS_CHUNKS = 2                      # CHUNK_BYTES the V and M of the strips threads run
                                       # alone at once take together, at most ...
STRIP_ROWS_LEAST = 4                   # ... rows of tiles in a strip, at least, and its V
                                       # and M at least 1 / this much of the packed
STRIP_WEIGHT_RATIO = 4                 # weights' bytes
TILE, TAPS = 4, 6                      # outputs per tile side, inputs per tile side (4 + 3 - 1)
TRANSFORM_WHOLE_MOST = 12 * 2 ** 20    # bytes of transformed filters made in one product
TRANSFORM_PART = 2 * 2 ** 20           # ... and in each part of a larger packing (about)
R2 = np.sqrt(2.0)
QUARTER, HALF, TWO, FIVE_HALVES, SQRT2 = (np.float32(v) for v in (0.25, 0.5, 2, 2.5, R2))

# points p = 1/sqrt(2), -1/sqrt(2), sqrt(2), -sqrt(2) in columns 1-4, 0 in column 0,
# infinity in column 5: A^T[i, k] = p^i, G[k] = (1, p, p^2) / prod_{l != k}(p - p_l)
G = np.array([[1, 0, 0],
              [-2 / 3, -R2 / 3, -1 / 3],
              [-2 / 3, R2 / 3, -1 / 3],
              [1 / 6, R2 / 6, 1 / 3],
              [1 / 6, -R2 / 6, 1 / 3],
              [0, 0, 1]])
GG_T = np.kron(G, G).T                 # (9, 36): g (3x3, flat) -> G g G^T (6x6, flat)
GG_T_32 = GG_T.astype(np.float32)
B_T = np.array([[1, 0, -5 / 2, 0, 1, 0],
                [0, -R2, -2, R2 / 2, 1, 0],
                [0, R2, -2, -R2 / 2, 1, 0],
                [0, -R2 / 2, -1 / 2, R2, 1, 0],
                [0, R2 / 2, -1 / 2, -R2, 1, 0],
                [0, 1, 0, -5 / 2, 0, 1]])
A_T = np.array([[1, 1, 1, 1, 1, 0],
                [0, R2 / 2, -R2 / 2, R2, -R2, 0],
                [0, 1 / 2, 1 / 2, 2, 2, 0],
                [0, R2 / 4, -R2 / 4, 2 * R2, -2 * R2, 1]])


def pack_winograd_weight(weight: np.ndarray) -> np.ndarray:
    """(C_out, C_in, 3, 3) -> U (36, C_out, C_in) = G g G^T per filter, in float32. U[k] for
    k = 6 r + s is a matrix over (output, input) channels (in panels: pointwise.pack_stack).

    U[(r, s)] = sum_ij G[r, i] g[i, j] G[s, j] is one GEMM with the Kronecker product of G,
    (36, 9) @ (9, O*C), in float32, on the filters taken in panel order (about one
    rounding, 1e-7 of U's values, from float64's result: far below the products' own
    rounding)."""
    return transform_filters(weight, GG_T_32)


def transform_filters(weight: np.ndarray, gg_t: np.ndarray) -> np.ndarray:
    """(C_out, C_in, 3, 3) -> (P, C_out, C_in): every 3x3 filter g through gg_t (9, P), the
    transposed Kronecker product of a Winograd G (here and in winograd_f2.py), each of the P
    matrices in panels (pointwise.pack_stack). The product
    (P, 9) @ (9, O*C) runs in register tiles (pointwise.py), shared with the helper threads
    if the caller shares (algorithms.py packs inside workers.sharing, at build as in a
    forward), with the same bits either way (BLAS cut into bands may round differently, as
    OpenBLAS picks its kernel by the size).

    A packing of more than TRANSFORM_WHOLE_MOST bytes (F(2x2)'s of 512 channels, which the
    packing thread makes while forwards run: algorithms._once_packed) is made a part of the
    output channels at a time, about TRANSFORM_PART bytes (a part holds at least the
    channels of whole panels that fill whole strips), so that its copies of the filters and
    its part of the products stay small beside the packing; a smaller one (F(4x4)'s made at
    build, mostly) in one product, without the copy of each part into place. Such parts give
    each entry the sum it has in one product (pointwise.py: a sum does not depend on where
    its tile falls, only on whether it is the product's narrow tail, which stays the last
    part's)."""
    c_out, c_in = weight.shape[:2]
    taps = gg_t.shape[1]
    matrix = np.ascontiguousarray(gg_t.T)
    unit = math.lcm(ROWS, COLUMNS // math.gcd(c_in, COLUMNS))   # channels a part is made of
    part = max(unit, TRANSFORM_PART // (taps * c_in * 4) // unit * unit)
    if part >= c_out or taps * c_out * c_in * 4 <= TRANSFORM_WHOLE_MOST:
        return _transformed(weight, matrix).reshape(taps, c_out, c_in)
    packed = np.empty((taps, c_out * c_in), np.float32)
    for first in range(0, c_out, part):
        last = min(c_out, first + part)
        packed[:, first * c_in:last * c_in] = _transformed(weight[first:last], matrix)[0]
    return packed.reshape(taps, c_out, c_in)


def _transformed(weight: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """(1, P, O*C): ``matrix`` (P, 9) times the filters of ``weight`` (O, C, 3, 3), taken
    in the panels' order (so that the product's rows come out in panels)."""
    c_out, c_in = weight.shape[:2]
    filters = np.ascontiguousarray(in_panels(weight.reshape(1, c_out, c_in, 9))[0].T)
    out = np.empty((1, matrix.shape[0], c_out * c_in), np.float32)
    pointwise_conv2d(matrix, filters[None], None, None, IDENTITY, out)
    return out


@kernel(inline="always")
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T applied to one column of 6 values: rows 1 and 2 (3 and 4) are the sum and the
    difference of one even and one odd part, 8 multiplications (4 by powers of 2) and 12
    additions (float32 constants keep float32 arithmetic)."""
    even, odd = d4 - TWO * d2, (HALF * d3 - d1) * SQRT2
    even_2, odd_2 = d4 - HALF * d2, (d3 - HALF * d1) * SQRT2
    return (d0 - FIVE_HALVES * d2 + d4, even + odd, even - odd, even_2 + odd_2,
            even_2 - odd_2, d1 - FIVE_HALVES * d3 + d5)


@kernel(inline="always")
def _at(m0, m1, m2, m3, m4, m5):
    """A^T applied to one column of 6 values: sums and differences of the pairs of points
    (m1, m2) and (m3, m4), 7 multiplications (5 by powers of 2) and 10 additions."""
    low_sum, low_diff, high_sum, high_diff = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + low_sum + high_sum,
            (HALF * low_diff + high_diff) * SQRT2,
            HALF * low_sum + TWO * high_sum,
            (QUARTER * low_diff + TWO * high_diff) * SQRT2 + m5)


@kernel(nogil=True, inline="always")
def stream_buffers(tile, taps, tiles_h, tiles_w, height, width, top, left):
    """The buffers of ``split_into_streams`` for one convolution: the streams (zeros), the
    padded row (zeros around the image's columns), and how many image rows and columns
    any tile reads."""
    streams = np.zeros((tile, taps, (tiles_h + 1) * tiles_w), np.float32)
    padded_row = np.zeros(tile * tiles_w + taps - tile, np.float32)
    rows = min(height, tile * (tiles_h + 1) - top)
    cols = min(width, tile * tiles_w + taps - tile - left)
    return streams, padded_row, rows, cols


@kernel(nogil=True, inline="always")
def split_into_streams(plane, streams, padded_row, rows, cols, top, left, tiles_w):
    """Write an image plane into the streams of a Winograd input transform (this module's,
    tile 4 and taps 6, and winograd_f2.py's, 2 and 4): streams (tile, taps, (tiles_h + 1) *
    tiles_w), where stream (p, j) holds, for every padded row tile*ty' + p, the padded
    column tile*tx + j of each tile tx (tile = outputs per tile side, taps = inputs). Each of
    the first ``rows`` image rows goes through ``padded_row``, whose zeros around the
    image's columns stay."""
    tile = streams.shape[0]
    for r in range(rows):
        line, inner = plane[r], padded_row[left:]
        for k in range(cols):
            inner[k] = line[k]
        p, at = (top + r) % tile, (top + r) // tile * tiles_w
        if tile == 4:                            # F(4x4): all six streams in one loop
            six_streams(streams[p], padded_row, at, tiles_w)
        else:                                    # F(2x2): all four
            four_streams(streams[p], padded_row, at, tiles_w)


@kernel(nogil=True, inline="always")
def six_streams(row_streams, padded_row, at, tiles_w):
    """row_streams[j, at + tx] = padded_row[4 tx + j], j < 6: F(4x4)'s streams of a row, in
    one loop (one stream a loop reads every fourth value of the row, one at a time; six
    together read it as a whole, which the compiler turns into shuffles of vectors)."""
    s0, s1, s2 = row_streams[0, at:], row_streams[1, at:], row_streams[2, at:]
    s3, s4, s5 = row_streams[3, at:], row_streams[4, at:], row_streams[5, at:]
    for tx in range(tiles_w):
        q = 4 * tx
        s0[tx], s1[tx], s2[tx] = padded_row[q], padded_row[q + 1], padded_row[q + 2]
        s3[tx], s4[tx], s5[tx] = padded_row[q + 3], padded_row[q + 4], padded_row[q + 5]


@kernel(nogil=True, inline="always")
def four_streams(row_streams, padded_row, at, tiles_w):
    """row_streams[j, at + tx] = padded_row[2 tx + j], j < 4: F(2x2)'s (``six_streams``)."""
    s0, s1, s2, s3 = (row_streams[0, at:], row_streams[1, at:], row_streams[2, at:],
                      row_streams[3, at:])
    for tx in range(tiles_w):
        q = 2 * tx
        s0[tx], s1[tx] = padded_row[q], padded_row[q + 1]
        s2[tx], s3[tx] = padded_row[q + 2], padded_row[q + 3]


@kernel(nogil=True, exported=(array(4), array(3), *[INT] * 5))
def _input_transform(x, v, top, left, tiles_h, tiles_w, row0):
    """x (N, C, H, W) -> v (36, C, T), every plane (``input_planes``)."""
    input_planes(x, v, top, left, tiles_h, tiles_w, row0, np.int64(0),
                 x.shape[0] * x.shape[1])


@kernel(nogil=True)
def input_planes(x, v, top, left, tiles_h, tiles_w, row0, first, last):
    """x (N, C, H, W) -> v (36, C, T): V = B^T d B for every 6x6 tile d (T = N * tiles) of
    the rows of x from ``row0`` on (a strip of tiles_h rows of tiles: run_winograd's).

    Tile (ty, tx) reads padded rows 4ty .. 4ty+5 and columns 4tx .. 4tx+5. Each plane is first
    split into 4 x 6 *streams*: stream (p, s) holds, for every padded row 4ty' + p, the
    column 4tx + s of each tile (tiles_h + 1 rows of tiles_w values; zeros in the padding),
    each image row going through one zero-padded row buffer.
    Input (i, s) of tile t = ty*tiles_w + tx is then element ``t + (i // 4) * tiles_w`` of
    stream (i % 4, s): both passes are long unit-stride loops over all the tiles of the plane,
    the column pass B^T d (six inputs per column s, six outputs) and the row pass (six in,
    six out, straight into v)."""
    n, channels, height, width = x.shape
    tiles = tiles_h * tiles_w
    streams, padded_row, rows, cols = stream_buffers(TILE, TAPS, tiles_h, tiles_w,
                                                      height - row0, width, top, left)
    cols_t = np.empty((TAPS, TAPS, tiles), np.float32)    # (r of B^T d, column s, tile)
    for plane in range(first, last):
        i_n, c = plane // channels, plane % channels
        split_into_streams(x[i_n, c, row0:], streams, padded_row, rows, cols, top, left,
                           tiles_w)
        for s in range(TAPS):                                # columns: B^T d
            d0, d1 = streams[0, s], streams[1, s]
            d2, d3 = streams[2, s], streams[3, s]
            d4, d5 = streams[0, s, tiles_w:], streams[1, s, tiles_w:]
            c0, c1, c2 = cols_t[0, s], cols_t[1, s], cols_t[2, s]
            c3, c4, c5 = cols_t[3, s], cols_t[4, s], cols_t[5, s]
            for t in range(tiles):
                c0[t], c1[t], c2[t], c3[t], c4[t], c5[t] = \
                    _bt(d0[t], d1[t], d2[t], d3[t], d4[t], d5[t])
        base = i_n * tiles
        for r in range(TAPS):                                # rows: (B^T d) B
            e0, e1, e2 = cols_t[r, 0], cols_t[r, 1], cols_t[r, 2]
            e3, e4, e5 = cols_t[r, 3], cols_t[r, 4], cols_t[r, 5]
            v0, v1, v2 = v[r * TAPS, c, base:], v[r * TAPS + 1, c, base:], \
                v[r * TAPS + 2, c, base:]
            v3, v4, v5 = v[r * TAPS + 3, c, base:], v[r * TAPS + 4, c, base:], \
                v[r * TAPS + 5, c, base:]
            for t in range(tiles):
                v0[t], v1[t], v2[t], v3[t], v4[t], v5[t] = \
                    _bt(e0[t], e1[t], e2[t], e3[t], e4[t], e5[t])


@kernel(nogil=True,
        exported=(array(3), array(4), array(1), array(4), *[INT] * 4, FLOAT, FLOAT))
def _output_transform(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b):
    """m (36, C_out, T) -> y (N, C_out, Ho, Wo), every plane (``output_planes``)."""
    output_planes(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b, np.int64(0),
                  y.shape[0] * y.shape[1])


@kernel(nogil=True, fastmath={"contract"})
def output_planes(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b, first, last):
    """m (36, C_out, T) -> y (N, C_out, Ho, Wo) = A^T m A + bias + residual, activated, on
    the tiles_h rows of tiles from output row ``row0`` on (a strip: run_winograd's).

    Both passes are long loops over all the tiles u = ty*tiles_w + tx of a plane: the
    column pass A^T m (six in, four out per column), then the row pass, which gives output
    (4ty + i, 4tx + j) of every tile in ``out[i, j, u]``. Each output row then gathers its
    four column phases; then bias, residual and activation (``finish_row``) finish the
    plane's rows at once (one long loop, not a short one a row), or, without a residual,
    bias and activation its tiles before they are gathered. The same operations on each
    value either way.
    Compiled with contract: in A^T a multiply and the add after it as one fused multiply-add,
    one rounding less (the activations are epilogue.activate_row's and smooth_row's, compiled
    with it too)."""
    n, c_out, height, out_w = y.shape
    out_h = min(height - row0, TILE * tiles_h)
    length = tiles_h * tiles_w
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    cols_t = np.empty((TILE, TAPS, length), np.float32)   # (row i of A^T m, column s, tile)
    out = np.empty((TILE, TILE, length), np.float32)      # (tile row i, tile column j, tile)
    full = out_w // TILE                                  # tiles whose 4 columns are all in y
    ys, rs = y.reshape(y.size), residual.reshape(residual.size)
    for plane in range(first, last):
        i_n, o = plane // c_out, plane % c_out
        base = i_n * length
        for s in range(TAPS):                                # columns: A^T m
            m0, m1, m2 = m[s, o, base:], m[TAPS + s, o, base:], m[2 * TAPS + s, o, base:]
            m3, m4, m5 = m[3 * TAPS + s, o, base:], m[4 * TAPS + s, o, base:], \
                m[5 * TAPS + s, o, base:]
            c0, c1, c2, c3 = cols_t[0, s], cols_t[1, s], cols_t[2, s], cols_t[3, s]
            for u in range(length):
                c0[u], c1[u], c2[u], c3[u] = _at(m0[u], m1[u], m2[u], m3[u], m4[u], m5[u])
        for i in range(TILE):                                # rows: (A^T m) A
            q0, q1, q2 = cols_t[i, 0], cols_t[i, 1], cols_t[i, 2]
            q3, q4, q5 = cols_t[i, 3], cols_t[i, 4], cols_t[i, 5]
            o0, o1, o2, o3 = out[i, 0], out[i, 1], out[i, 2], out[i, 3]
            for u in range(length):
                o0[u], o1[u], o2[u], o3[u] = _at(q0[u], q1[u], q2[u], q3[u], q4[u], q5[u])
        shift = bias[o] if has_bias else np.float32(-0.0)      # -0.0: no shift
        if not has_residual:                                 # finished here, in one pass
            activate_row(out.reshape(out.size), code, a, b, shift)
        dst = y[i_n, o, row0:]
        for oh in range(out_h):
            ty, i = oh // TILE, oh % TILE
            row = dst[oh]
            p0, p1 = out[i, 0, ty * tiles_w:], out[i, 1, ty * tiles_w:]
            p2, p3 = out[i, 2, ty * tiles_w:], out[i, 3, ty * tiles_w:]
            for tx in range(full):
                k = tx * TILE
                row[k], row[k + 1], row[k + 2], row[k + 3] = p0[tx], p1[tx], p2[tx], p3[tx]
            for ow in range(full * TILE, out_w):             # the last, partial tile
                row[ow] = out[i, ow % TILE, ty * tiles_w + full]
        if has_residual:                                     # the plane's rows at once
            at = ((i_n * c_out + o) * height + row0) * out_w
            finish_row(ys[at:at + out_h * out_w], shift, rs[at:at + out_h * out_w], code,
                       a, b)


def winograd_conv2d(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                    pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                    activation: Activation, residual: np.ndarray | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, U (36, C_out, C_in) from pack_winograd_weight,
    pads (top, bottom, left, right) -> y (N, C_out, Ho, Wo)."""
    return run_winograd(_input_transform, _output_transform, TILE, x, packed, bias, pads,
                        out_hw, activation, residual, out)


def run_winograd(input_transform, output_transform, tile: int, x: np.ndarray,
                 packed: np.ndarray, bias: np.ndarray | None, pads: tuple[int, int, int, int],
                 out_hw: tuple[int, int], activation: Activation,
                 residual: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
    """One Winograd convolution with ``tile`` x ``tile`` output tiles (F(4x4) here, F(2x2) in
    winograd_f2.py): V from the input transform, M = U @ V as one stack of GEMMs, y from the
    output transform. V and M live in scratch buffers reused from call to call, made for as
    much of the batch as keeps them within CHUNK_BYTES (``chunks``): a few images at a time,
    or, when one image needs more, a strip of its rows of tiles at a time. With a team, each
    step is shared by its threads, or, where ``strips_apart`` says so, each thread runs all
    three steps alone on whole images or strips of one, in its own V and M: no thread then
    waits for the others between steps, nor reads the V and M another core wrote. Every
    tile's sums are the same whichever chunk or thread it falls in, so are the bits. ``out``
    must not overlap x (a strip reads rows of x that the strips before it have written)."""
    n, c_in = x.shape[:2]
    products, c_out = packed.shape[:2]
    tiles_h, tiles_w = -(-out_hw[0] // tile), -(-out_hw[1] // tile)
    y = np.empty((n, c_out, *out_hw), np.float32) if out is None else out
    if residual is not None and residual.shape != y.shape:    # the kernels read it unchecked
        raise ValueError(f"Winograd: residual of shape {residual.shape} for an output of "
                         f"shape {y.shape}")
    bias = NO_ARRAY if bias is None else bias
    team = current_team()
    row_bytes = products * (c_in + c_out) * tiles_w * 4      # V and M of a row of tiles
    strips = (None if team is None
              else strips_apart(n, tiles_h, team.threads, row_bytes, packed.nbytes))
    if strips is not None:            # (the buffer of the steps' V: one or the other runs)
        work = scratch("winograd_v",
                       (team.threads, strip_work_floats(products, c_in, c_out,
                                                        -(-tiles_h // strips) * tiles_w)))
        team.winograd_strips(tile != TILE, x, packed, bias,
                             NO_RESIDUAL if residual is None else residual, y, work,
                             space_size(c_in), strips, pads[0], pads[2], tiles_h, tiles_w,
                             activation)
        return y
    for i, j, ty0, ty1 in chunks(n, tiles_h, row_bytes):
        images, strip = x[i:j], ty1 - ty0
        v = scratch("winograd_v", (products, c_in, (j - i) * strip * tiles_w))
        m = scratch("winograd_m", (products, c_out, (j - i) * strip * tiles_w))
        rest = NO_RESIDUAL if residual is None else residual[i:j]
        first = tile * ty0 - pads[0]        # x's row of the strip's first (padded) input row
        top, row0 = max(-first, 0), max(first, 0)
        if team is None:
            input_transform(images, v, top, pads[2], strip, tiles_w, row0)
        else:                                            # each step shared with the helpers
            team.winograd_input(tile != TILE, images, v, top, pads[2], strip, tiles_w, row0)
        # (C_out, C_in) @ (C_in, T) each, in register tiles (shared too, if there is a team)
        pointwise_conv2d(packed, v, None, None, IDENTITY, m)
        if team is None:
            output_transform(m, y[i:j], bias, rest, strip, tiles_w, tile * ty0,
                             activation.code, activation.a, activation.b)
        else:
            team.winograd_output(tile != TILE, m, y[i:j], bias, rest, strip, tiles_w,
                                 tile * ty0, activation)
    return y


def strips_apart(images: int, tiles_h: int, threads: int, row_bytes: int,
                 weight_bytes: int) -> int | None:
    """How many strips of its rows of tiles each image is cut into where a team of
    ``threads`` runs each strip alone (``run_winograd``), or None where it shares each step
    instead. Whole images where they share out evenly (or are many: one more on some threads
    is then little); with fewer images than threads, a strip per thread of each. Either way
    only where each strip has STRIP_ROWS_LEAST rows of tiles, the V and M of all threads'
    strips (``row_bytes`` a row of tiles) fit in STRIPS_CHUNKS times CHUNK_BYTES, and a
    strip's outweigh a STRIP_WEIGHT_RATIO-th of the packed weights, which every thread reads
    whole for each of its strips (where the threads share a step, once for a chunk of
    images, half each)."""
    if threads <= 1 or images <= 0:
        return None
    if images >= threads:
        strips = 1 if images % threads == 0 or images >= 4 * threads else 0
    else:
        strips = threads // images if threads % images == 0 else 0
    rows = tiles_h // max(strips, 1)                  # the shortest strip's
    if (strips == 0 or rows < STRIP_ROWS_LEAST
            or threads * row_bytes * -(-tiles_h // strips) > STRIPS_CHUNKS * CHUNK_BYTES
            or weight_bytes > STRIP_WEIGHT_RATIO * rows * row_bytes):
        return None
    return strips


def strip_work_floats(products: int, c_in: int, c_out: int, tiles: int) -> int:
    """Floats of work space a thread needs to run a strip of ``tiles`` tiles alone
    (``strip_buffers``), in whole 64-byte lines (rows that follow one another keep the
    first one's alignment)."""
    return -(-(space_size(c_in) + products * (c_in + c_out) * tiles) // 16) * 16


@kernel(nogil=True)
def strip_buffers(work, space_floats, products, c_in, c_out, tiles):
    """A thread's row of work space as the product's work space (``space_floats``, first:
    its strips stay aligned), then the V (products, C_in, T) and M (products, C_out, T) of
    a strip of T tiles."""
    v_end = space_floats + products * c_in * tiles
    v = work[space_floats:v_end].reshape((products, c_in, tiles))
    m = work[v_end:v_end + products * c_out * tiles].reshape((products, c_out, tiles))
    return v, m, work[:space_floats]


def chunks(images: int, tiles_h: int, row_bytes: int) -> list[tuple[int, int, int, int]]:
    """How run_winograd cuts a batch of ``images`` of ``tiles_h`` rows of tiles, whose V and
    M take ``row_bytes`` a row: (first image, last + 1, first row of tiles, last + 1) per
    chunk, each within CHUNK_BYTES if it can be. Whole images while one fits (as many as
    fit), else strips of the rows of one image (one row of tiles at least, heights differing
    by one at most)."""
    image_bytes = max(row_bytes * tiles_h, 1)
    if image_bytes <= CHUNK_BYTES:
        step = max(1, min(images, CHUNK_BYTES // image_bytes))
        return [(i, min(images, i + step), 0, tiles_h) for i in range(0, images, step)]
    strips = -(-tiles_h // max(1, CHUNK_BYTES // max(row_bytes, 1)))
    cuts = [k * tiles_h // strips for k in range(strips + 1)]     # heights differ by 1 at most
    return [(i, i + 1, cuts[k], cuts[k + 1]) for i in range(images) for k in range(strips)]
