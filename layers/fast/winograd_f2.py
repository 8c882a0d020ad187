"""Winograd convolution F(2x2, 3x3): the small sibling of winograd.py's F(4x4, 3x3).

A 2x2 block of outputs reads a 4x4 input tile d (tiles step by 2)::

    Y (2x2) = A^T [ (G g G^T) * (B^T d B) ] A

    B^T = [1  0 -1  0]     G = [ 1    0    0 ]     A^T = [1  1  1  0]
          [0  1  1  0]         [1/2  1/2  1/2]           [0  1 -1 -1]
          [0 -1  1  0]         [1/2 -1/2  1/2]
          [0  1  0 -1]         [ 0    0    1 ]

and, summed over input channels, 16 matrix products instead of F(4x4)'s 36::

    U[k] (C_out, C_in)   V[k] (C_in, T)   M[k] = U[k] @ V[k]   k = 4 i + j,  T = N * tiles

It multiplies 2.25x fewer values than im2col (16 per 4 outputs against 36), where F(4x4)
multiplies 4x fewer, but its packed weights are 16/9 of the 3x3 weights against F(4x4)'s
36/9, and it has 4x as many tiles. So it is the better choice when the weights are big and
the image small (ResNet's 512-channel convolutions at 7x7): its 16 GEMMs have 4x more columns
to share each weight with, and 2.25x fewer weights to read (layers/fast/conv.py chooses).
All its coefficients are 0, +-1 and +-1/2, exact in float32; its largest error against
float64 stays within 4x torch's at any number of input channels (its sums, as F(4x4)'s, in
chains of 16 to 64 channels, by their count: pointwise.stack_chain; tests/fast/test_precision.py).
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import Activation, activate_row, finish_row
from layers.fast.winograd import (run_winograd, split_into_streams, stream_buffers,
                                  transform_filters)

TILE, TAPS = 2, 4                      # outputs per tile side, inputs per tile side (2 + 3 - 1)

G = np.array([[1, 0, 0],
              [1 / 2, 1 / 2, 1 / 2],
              [1 / 2, -1 / 2, 1 / 2],
              [0, 0, 1]])
GG_T_32 = np.kron(G, G).T.astype(np.float32)   # (9, 16): g (3x3, flat) -> G g G^T (4x4, flat)
B_T = np.array([[1, 0, -1, 0],
                [0, 1, 1, 0],
                [0, -1, 1, 0],
                [0, 1, 0, -1]], dtype=np.float64)
A_T = np.array([[1, 1, 1, 0],
                [0, 1, -1, -1]], dtype=np.float64)


def pack_winograd_f2_weight(weight: np.ndarray) -> np.ndarray:
    """(C_out, C_in, 3, 3) -> U (16, C_out, C_in) = G g G^T per filter, in float32: one GEMM
    with the Kronecker product of G, (16, 9) @ (9, O*C), each U[k] then in panels
    (pointwise.pack_stack)."""
    return transform_filters(weight, GG_T_32)


@kernel(nogil=True, exported=(array(4), array(3), *[INT] * 5))
def _input_transform_f2(x, v, top, left, tiles_h, tiles_w, row0):
    """x (N, C, H, W) -> v (16, C, T), every plane (``input_planes_f2``)."""
    input_planes_f2(x, v, top, left, tiles_h, tiles_w, row0, np.int64(0),
                    x.shape[0] * x.shape[1])


@kernel(nogil=True)
def input_planes_f2(x, v, top, left, tiles_h, tiles_w, row0, first, last):
    """x (N, C, H, W) -> v (16, C, T): V = B^T d B for every 4x4 tile d (T = N * tiles) of
    the rows of x from ``row0`` on (a strip of tiles_h rows of tiles: run_winograd's).

    Tile (ty, tx) reads padded rows 2ty .. 2ty+3 and columns 2tx .. 2tx+3. As in winograd.py,
    each plane is first split into *streams* (``split_into_streams``): stream (p, j) holds,
    for every padded row 2ty' + p, the column 2tx + j of each tile (tiles_h + 1 rows of
    tiles_w values, zeros in the padding). Input (i, j) of tile t = ty*tiles_w + tx is
    element ``t + (i // 2) * tiles_w`` of stream (i % 2, j), so both passes, B^T d over the
    columns and then B over the rows (straight into v), are long unit-stride loops over all
    the tiles of the plane."""
    n, channels, height, width = x.shape
    tiles = tiles_h * tiles_w
    streams, padded_row, rows, cols = stream_buffers(TILE, TAPS, tiles_h, tiles_w,
                                                      height - row0, width, top, left)
    cols_t = np.empty((TAPS, TAPS, tiles), np.float32)     # (row of B^T d, column j, tile)
    for plane in range(first, last):
        i_n, c = plane // channels, plane % channels
        split_into_streams(x[i_n, c, row0:], streams, padded_row, rows, cols, top, left,
                           tiles_w)
        for j in range(TAPS):                                # columns: B^T d
            d0, d1 = streams[0, j], streams[1, j]
            d2, d3 = streams[0, j, tiles_w:], streams[1, j, tiles_w:]
            c0, c1, c2, c3 = cols_t[0, j], cols_t[1, j], cols_t[2, j], cols_t[3, j]
            for t in range(tiles):
                c0[t], c1[t] = d0[t] - d2[t], d1[t] + d2[t]
                c2[t], c3[t] = d2[t] - d1[t], d1[t] - d3[t]
        base = i_n * tiles
        for i in range(TAPS):                                # rows: (B^T d) B
            e0, e1, e2, e3 = cols_t[i, 0], cols_t[i, 1], cols_t[i, 2], cols_t[i, 3]
            v0, v1 = v[TAPS * i, c, base:], v[TAPS * i + 1, c, base:]
            v2, v3 = v[TAPS * i + 2, c, base:], v[TAPS * i + 3, c, base:]
            for t in range(tiles):
                v0[t], v1[t] = e0[t] - e2[t], e1[t] + e2[t]
                v2[t], v3[t] = e2[t] - e1[t], e1[t] - e3[t]


@kernel(nogil=True,
        exported=(array(3), array(4), array(1), array(4), *[INT] * 4, FLOAT, FLOAT))
def _output_transform_f2(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b):
    """m (16, C_out, T) -> y (N, C_out, Ho, Wo), every plane (``output_planes_f2``)."""
    output_planes_f2(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b, np.int64(0),
                     y.shape[0] * y.shape[1])


@kernel(nogil=True)
def output_planes_f2(m, y, bias, residual, tiles_h, tiles_w, row0, code, a, b, first, last):
    """m (16, C_out, T) -> y (N, C_out, Ho, Wo) = A^T m A + bias + residual, activated, on
    the tiles_h rows of tiles from output row ``row0`` on (a strip: run_winograd's).

    Both passes are long loops over all the tiles u = ty*tiles_w + tx of a plane: A^T m over
    the columns (three values in, two out), then A over the rows, which leaves output
    (2ty + i, 2tx + j) of every tile in ``out[i, j, u]``. Each output row then interleaves its
    two column phases, and the plane is finished (bias, residual, activation: as
    winograd.output_planes)."""
    n, c_out, height, out_w = y.shape
    out_h = min(height - row0, TILE * tiles_h)
    length = tiles_h * tiles_w
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    cols_t = np.empty((TILE, TAPS, length), np.float32)   # (row i of A^T m, column j, tile)
    out = np.empty((TILE, TILE, length), np.float32)      # (tile row i, tile column j, tile)
    full = out_w // TILE                                  # tiles whose 2 columns are both in y
    ys, rs = y.reshape(y.size), residual.reshape(residual.size)
    for plane in range(first, last):
        i_n, o = plane // c_out, plane % c_out
        base = i_n * length
        for j in range(TAPS):                                # columns: A^T m
            m0, m1 = m[j, o, base:], m[TAPS + j, o, base:]
            m2, m3 = m[2 * TAPS + j, o, base:], m[3 * TAPS + j, o, base:]
            c0, c1 = cols_t[0, j], cols_t[1, j]
            for u in range(length):
                c0[u] = m0[u] + m1[u] + m2[u]
                c1[u] = m1[u] - m2[u] - m3[u]
        for i in range(TILE):                                # rows: (A^T m) A
            q0, q1, q2, q3 = cols_t[i, 0], cols_t[i, 1], cols_t[i, 2], cols_t[i, 3]
            o0, o1 = out[i, 0], out[i, 1]
            for u in range(length):
                o0[u] = q0[u] + q1[u] + q2[u]
                o1[u] = q1[u] - q2[u] - q3[u]
        shift = bias[o] if has_bias else np.float32(-0.0)      # -0.0: no shift
        if not has_residual:                                 # finished here, in one pass
            activate_row(out.reshape(out.size), code, a, b, shift)
        dst = y[i_n, o, row0:]
        for oh in range(out_h):
            ty, i = oh // TILE, oh % TILE
            row = dst[oh]
            p0, p1 = out[i, 0, ty * tiles_w:], out[i, 1, ty * tiles_w:]
            for tx in range(full):
                row[TILE * tx], row[TILE * tx + 1] = p0[tx], p1[tx]
            if out_w % TILE:                                 # the last, half tile
                row[out_w - 1] = p0[full]
        if has_residual:                                     # the plane's rows at once
            at = ((i_n * c_out + o) * height + row0) * out_w
            finish_row(ys[at:at + out_h * out_w], shift, rs[at:at + out_h * out_w], code,
                       a, b)


def winograd_f2_conv2d(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                       pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                       activation: Activation, residual: np.ndarray | None = None,
                       out: np.ndarray | None = None) -> np.ndarray:
    """x (N, C_in, H, W) float32 C-contiguous, U (16, C_out, C_in) from
    pack_winograd_f2_weight, pads (top, bottom, left, right) -> y (N, C_out, Ho, Wo)."""
    return run_winograd(_input_transform_f2, _output_transform_f2, TILE, x, packed, bias,
                        pads, out_hw, activation, residual, out)
