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
    u = np.kron(G, G) @ filters.T                                         # (36, O*C)
    return np.ascontiguousarray(u.reshape(TAPS * TAPS, c_out, c_in), np.float32)


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


@numba.njit(cache=True)
def _input_transform(x, v, top, left, tiles_h, tiles_w):
    """x (N, C, H, W) -> v (36, C, T): V = B^T d B for every 6x6 tile d."""
    n, channels, height, width = x.shape
    tiles = tiles_h * tiles_w
    zero = np.float32(0.0)
    for plane in range(n * channels):
        i_n, c = plane // channels, plane % channels
        src = x[i_n, c]
        d = np.empty((TAPS, TAPS), np.float32)
        t1 = np.empty((TAPS, TAPS), np.float32)
        for ty in range(tiles_h):
            row0 = ty * TILE - top
            for tx in range(tiles_w):
                col0 = tx * TILE - left
                if row0 >= 0 and col0 >= 0 and row0 + TAPS <= height and col0 + TAPS <= width:
                    for r in range(TAPS):
                        for s in range(TAPS):
                            d[r, s] = src[row0 + r, col0 + s]
                else:                                   # a border tile: zeros outside
                    for r in range(TAPS):
                        ih = row0 + r
                        for s in range(TAPS):
                            iw = col0 + s
                            inside = 0 <= ih < height and 0 <= iw < width
                            d[r, s] = src[ih, iw] if inside else zero
                for s in range(TAPS):                   # columns: t1 = B^T d
                    col = _bt(d[0, s], d[1, s], d[2, s], d[3, s], d[4, s], d[5, s])
                    for r in range(TAPS):
                        t1[r, s] = col[r]
                t = i_n * tiles + ty * tiles_w + tx
                for r in range(TAPS):                   # rows: V = t1 B
                    row = _bt(t1[r, 0], t1[r, 1], t1[r, 2], t1[r, 3], t1[r, 4], t1[r, 5])
                    for s in range(TAPS):
                        v[r * TAPS + s, c, t] = row[s]


@numba.njit(cache=True)
def _output_transform(m, y, bias, residual, tiles_h, tiles_w, code, a, b):
    """m (36, C_out, T) -> y (N, C_out, Ho, Wo) = A^T m A + bias + residual, activated."""
    n, c_out, out_h, out_w = y.shape
    tiles = tiles_h * tiles_w
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    for plane in range(n * c_out):
        i_n, o = plane // c_out, plane % c_out
        dst = y[i_n, o]
        shift = bias[o] if has_bias else np.float32(0.0)
        t1 = np.empty((TILE, TAPS), np.float32)
        for ty in range(tiles_h):
            for tx in range(tiles_w):
                t = i_n * tiles + ty * tiles_w + tx
                for s in range(TAPS):                   # columns: t1 = A^T m
                    col = _at(m[s, o, t], m[TAPS + s, o, t], m[2 * TAPS + s, o, t],
                              m[3 * TAPS + s, o, t], m[4 * TAPS + s, o, t],
                              m[5 * TAPS + s, o, t])
                    for r in range(TILE):
                        t1[r, s] = col[r]
                for r in range(TILE):                   # rows: Y = t1 A
                    oh = ty * TILE + r
                    if oh >= out_h:
                        break
                    row = _at(t1[r, 0], t1[r, 1], t1[r, 2], t1[r, 3], t1[r, 4], t1[r, 5])
                    for s in range(TILE):
                        ow = tx * TILE + s
                        if ow < out_w:
                            dst[oh, ow] = row[s] + shift
        if has_residual:
            dst += residual[i_n, o]
        for oh in range(out_h):
            activate_row(dst[oh], code, a, b)


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
