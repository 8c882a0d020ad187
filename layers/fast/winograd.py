"""Winograd convolution F(4x4, 3x3): 3x3 kernels, stride 1, dilation 1, groups 1.

A 4x4 block of outputs of a 3x3 convolution reads a 6x6 input tile d. Winograd's minimal
filtering algorithm (Lavin & Gray, 2015) computes it with 36 multiplications instead of 144::

    Y (4x4) = A^T [ (G g G^T) * (B^T d B) ] A          * elementwise, g the 3x3 filter

Summed over input channels, the elementwise products become 36 independent matrix products,
one per position k of the 6x6 transformed tile::

    U[k] = (G g G^T)[k]   (C_out, C_in)    weights, transformed once at build
    V[k] = (B^T d B)[k]   (C_in, T)        every input tile t (T = N * tiles), numba
    M[k] = U[k] @ V[k]    (C_out, T)       36 GEMMs on BLAS (np.matmul on stacks)
    y    = A^T M A        + bias, residual, activation, written into (N, C_out, Ho, Wo)

The transforms B, G, A use the points 0, 1, -1, 2, -2 and infinity; they are small exact
rationals, so float32 keeps the result within a few ulps of the direct convolution at these
sizes (tests compare with torch). Tiles hanging over the border read zeros and write nothing
outside the output.
"""

from __future__ import annotations

import numba
import numpy as np

from layers.fast.epilogue import Activation, NO_ARRAY, activate_row
from layers.fast.gemm import scratch

NO_RESIDUAL = np.zeros((0, 0, 0, 0), np.float32)
F2, F4, F5, F8 = np.float32(2), np.float32(4), np.float32(5), np.float32(8)
TILE, TAPS = 4, 6                      # outputs per tile side, inputs per tile side (4 + 3 - 1)

G = np.array([[1 / 4, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6],
              [0, 0, 1]])
GG_T = np.kron(G, G).T                 # (9, 36): g (3x3, flat) -> G g G^T (6x6, flat)
B_T = np.array([[4, 0, -5, 0, 1, 0],
                [0, -4, -4, 1, 1, 0],
                [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0],
                [0, 4, 0, -5, 0, 1]], dtype=np.float64)
A_T = np.array([[1, 1, 1, 1, 1, 0],
                [0, 1, -1, 2, -2, 0],
                [0, 1, 1, 4, 4, 0],
                [0, 1, -1, 8, -8, 1]], dtype=np.float64)


def pack_winograd_weight(weight: np.ndarray) -> np.ndarray:
    """(C_out, C_in, 3, 3) -> U (36, C_out, C_in) = G g G^T per filter, in float64 then
    rounded once to float32. U[k] for k = 6 r + s is a matrix over (output, input) channels."""
    c_out, c_in = weight.shape[:2]
    # U[(r, s)] = sum_ij G[r, i] g[i, j] G[s, j]: one GEMM with the Kronecker product of G
    filters = weight.reshape(c_out * c_in, 9).astype(np.float64)          # (O*C, 9)
    u = (filters @ GG_T).astype(np.float32)                               # (O*C, 36)
    return np.ascontiguousarray(u.T).reshape(TAPS * TAPS, c_out, c_in)


@numba.njit(cache=True, inline="always")
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T applied to one column of 6 values (float32 constants keep float32 arithmetic)."""
    return (F4 * d0 - F5 * d2 + d4,
            -F4 * d1 - F4 * d2 + d3 + d4,
            F4 * d1 - F4 * d2 - d3 + d4,
            -F2 * d1 - d2 + F2 * d3 + d4,
            F2 * d1 - d2 - F2 * d3 + d4,
            F4 * d1 - F5 * d3 + d5)


@numba.njit(cache=True, inline="always")
def _at(m0, m1, m2, m3, m4, m5):
    """A^T applied to one column of 6 values."""
    return (m0 + m1 + m2 + m3 + m4,
            m1 - m2 + F2 * m3 - F2 * m4,
            m1 + m2 + F4 * m3 + F4 * m4,
            m1 - m2 + F8 * m3 - F8 * m4 + m5)


@numba.njit(cache=True, nogil=True)
def _input_transform(x, v, top, left, tiles_h, tiles_w):
    """x (N, C, H, W) -> v (36, C, T): V = B^T d B for every 6x6 tile d.

    Each plane is first copied into a zero-padded one that holds every tile whole (the zeros
    around the image are written once, then only the image part changes). Then, per row of
    tiles, the column pass B^T d runs over the full padded width at once (six rows in, six
    out: a loop the compiler vectorises), and the row pass finishes each tile."""
    n, channels, height, width = x.shape
    tiles = tiles_h * tiles_w
    padded_h, padded_w = tiles_h * TILE + 2, tiles_w * TILE + 2
    padded = np.zeros((padded_h, padded_w), np.float32)
    rows, cols = min(height, padded_h - top), min(width, padded_w - left)
    t1 = np.empty((TAPS, padded_w), np.float32)
    for plane in range(n * channels):
        i_n, c = plane // channels, plane % channels
        src = x[i_n, c]
        for r in range(rows):
            padded[top + r, left:left + cols] = src[r, :cols]
        for ty in range(tiles_h):
            d0, d1, d2 = padded[ty * TILE], padded[ty * TILE + 1], padded[ty * TILE + 2]
            d3, d4, d5 = padded[ty * TILE + 3], padded[ty * TILE + 4], padded[ty * TILE + 5]
            for col in range(padded_w):                 # columns: t1 = B^T d, all tiles
                t1[0, col], t1[1, col], t1[2, col], t1[3, col], t1[4, col], t1[5, col] = \
                    _bt(d0[col], d1[col], d2[col], d3[col], d4[col], d5[col])
            t0 = i_n * tiles + ty * tiles_w
            for r in range(TAPS):                       # rows: V = t1 B, tile by tile
                line = t1[r]
                for tx in range(tiles_w):
                    k = tx * TILE
                    e0, e1, e2, e3, e4, e5 = _bt(line[k], line[k + 1], line[k + 2],
                                                 line[k + 3], line[k + 4], line[k + 5])
                    t = t0 + tx
                    v[r * TAPS, c, t] = e0
                    v[r * TAPS + 1, c, t] = e1
                    v[r * TAPS + 2, c, t] = e2
                    v[r * TAPS + 3, c, t] = e3
                    v[r * TAPS + 4, c, t] = e4
                    v[r * TAPS + 5, c, t] = e5


@numba.njit(cache=True, nogil=True)
def _output_transform(m, y, bias, residual, tiles_h, tiles_w, code, a, b):
    """m (36, C_out, T) -> y (N, C_out, Ho, Wo) = A^T m A + bias + residual, activated.

    Per row of tiles, the column pass A^T m reads the 36 planes of m along the tiles (unit
    stride, vectorised), then the row pass writes each output row whole into a row buffer
    as wide as the tiles, which is cut to Wo, given bias, residual and activation, and
    stored."""
    n, c_out, out_h, out_w = y.shape
    tiles = tiles_h * tiles_w
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    t1 = np.empty((TILE, TAPS, tiles_w), np.float32)   # (output row r, tap column s, tile)
    line = np.empty(tiles_w * TILE, np.float32)
    for plane in range(n * c_out):
        i_n, o = plane // c_out, plane % c_out
        dst = y[i_n, o]
        shift = bias[o] if has_bias else np.float32(0.0)
        for ty in range(tiles_h):
            t0 = i_n * tiles + ty * tiles_w
            for s in range(TAPS):                       # columns: t1 = A^T m, all tiles
                m0, m1, m2 = m[s, o, t0:], m[TAPS + s, o, t0:], m[2 * TAPS + s, o, t0:]
                m3, m4, m5 = m[3 * TAPS + s, o, t0:], m[4 * TAPS + s, o, t0:], \
                    m[5 * TAPS + s, o, t0:]
                for tx in range(tiles_w):
                    t1[0, s, tx], t1[1, s, tx], t1[2, s, tx], t1[3, s, tx] = \
                        _at(m0[tx], m1[tx], m2[tx], m3[tx], m4[tx], m5[tx])
            for r in range(TILE):                       # rows: Y = t1 A, a whole output row
                oh = ty * TILE + r
                if oh >= out_h:
                    break
                q = t1[r]
                for tx in range(tiles_w):
                    e0, e1, e2, e3 = _at(q[0, tx], q[1, tx], q[2, tx], q[3, tx], q[4, tx],
                                         q[5, tx])
                    k = tx * TILE
                    line[k], line[k + 1], line[k + 2], line[k + 3] = (
                        e0 + shift, e1 + shift, e2 + shift, e3 + shift)
                row = line[:out_w]
                if has_residual:
                    other = residual[i_n, o, oh]
                    for ow in range(out_w):
                        row[ow] += other[ow]
                activate_row(row, code, a, b)
                dst[oh, :] = row


def winograd_conv2d(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                    pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                    activation: Activation, residual: np.ndarray | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, U (36, C_out, C_in) from pack_winograd_weight,
    pads (top, bottom, left, right) -> y (N, C_out, Ho, Wo)."""
    n, c_in = x.shape[:2]
    c_out = packed.shape[1]
    tiles_h, tiles_w = -(-out_hw[0] // TILE), -(-out_hw[1] // TILE)
    t = n * tiles_h * tiles_w
    v = scratch("winograd_v", (TAPS * TAPS, c_in, t))
    m = scratch("winograd_m", (TAPS * TAPS, c_out, t))
    _input_transform(x, v, pads[0], pads[2], tiles_h, tiles_w)
    np.matmul(packed, v, out=m)                          # 36 x (C_out, C_in) @ (C_in, T)
    y = np.empty((n, c_out, *out_hw), np.float32) if out is None else out
    _output_transform(m, y, NO_ARRAY if bias is None else bias,
                      NO_RESIDUAL if residual is None else residual, tiles_h, tiles_w,
                      activation.code, activation.a, activation.b)
    return y
