"""1x1 convolution (stride 1, no padding, one group) as a register-tiled matrix product.

Such a convolution is one matrix product per image, on the image as it lies in memory::

    y[n] (C_out, H*W) = activation(weight (C_out, C_in) @ x[n] (C_in, H*W) + bias + residual)

and in a network like EfficientNet or MobileNet it is most of the work. BLAS computes it by
first copying both matrices into its own blocked layouts (on every call) and leaves the
bias, residual and activation for a second pass over y. Here each block of 6 output
channels by 32 pixels (16 on an AVX2 machine: simd.COLUMNS) is summed in vector registers
over C_in (layers/fast/simd.py) and written once, finished: ReLU and ReLU6 are clamps in
the registers; other activations run on the block's rows right after it is written, while
they are in cache. The weight is read as it is (one value per row and k).

Work is cut into bands of pixels, at most X_BLOCK floats of x each (``block_width``), and
each band into blocks of 6 channels, so that a band of x stays in cache while every block of
channels reads it. A long sum (C_in > K_BLOCK: im2col's K = 9 C_in) is taken in slices of
K_BLOCK channels: every block adds one slice, stores its partial sums, and the next slice
carries on from them (``tile_load``; the epilogue comes with the last), so that the weights
are read once, not once per band (ResNet-18's 512-channel 3x3 at 7x7: 8.9 -> 6.5 ms). A
partial sum is stored as the float32 the registers hold: the result has the same bits as
one chain. The same kernel runs Winograd's products, with a weight matrix per "image"
(``weight`` (N, C_out, C_in)).

A widening convolution (C_out >= C_in: EfficientNet's expansions) first copies its band of x
into the chunk's work space: x is small there and read C_out / 6 times, and reading it in
place ran 8-18x slower for some placements of x and y in memory (both in fresh neighbouring
allocations: 9 ms against 0.5 for 96 x 16 x 12544, on an AVX-512 AMD machine); with the
copy, every placement tried ran at the same speed. A narrowing one reads x in place: its x
is the large operand, and the copy cost more than it saved (no such slowdown showed in its
placements).

The last tile of a band is usually partial (49 pixels: three tiles of 16 and one of 1). Its
rows of x are still read as whole vectors wherever the array goes on (the lanes past the
band hold the next pixels or the next row of x, or a packed band's padding): those lanes
are summed and never stored, as the lanes of any column are independent. Only at the very
end of x does a masked load read less. Masked loads on every k cost the edge tile twice a
whole one's time on AVX2, whose 16 registers leave no room to keep the mask (EfficientNet's
1152 -> 192 channels at 7x7, two threads: 0.60 -> 0.43 ms; the whole forward at batch 1:
24.5 -> 20.8 ms on the AVX2 machine). Every tile but that last one runs a k loop whose
vectors are whole by a constant count, so the compiler drops the check for a part (3-5% on
widening layers with few input channels: 16 -> 96 channels at 112x112, 1.62 -> 1.53 ms on
one thread).

Measured in whole EfficientNet-Lite0 forwards at batch 1 on two threads, on the AVX-512
machine (each 1x1 layer against OpenBLAS plus the fused epilogue, alternated forward by
forward): 1.2-1.6x faster at 112x112 to 28x28, even at 14x14 and 7x7 (where 196 and 49
pixels fill 87% and 77% of the lanes of their 32-pixel blocks), 0.89x for 672 -> 112
channels at 14x14; the forward 8.26 -> 7.75 ms. On an AVX2 machine (AMD Zen, 6 x 16 tiles)
the layers from 112x112 to 28x28 are as fast as OpenBLAS or faster, but the 7x7 ones took
1.15-1.3x OpenBLAS's time alone (0.43 against 0.34-0.38 ms; 49 pixels fill 77% of four
16-pixel blocks): they run transposed now, pixels in the tiles' rows and channels in their
lanes (layers/fast/pointwise_transposed.py, the same bits). Each value of y is the same
chain of fused multiply-adds wherever its block falls, so the result does not depend on how
many threads share the work.
"""

from __future__ import annotations

import functools

import numpy as np

from layers.fast import workers
from layers.fast.backend import FLOAT, INT, array, kernel
from layers.fast.epilogue import CLAMP, NONE, RELU, Activation, activate_row, clamp_bounds
from layers.fast.simd import COLUMNS, ROWS, tile_fma, tile_load, tile_store, tile_zero

X_BLOCK = 1 << 16      # floats of x a band of pixels reads (256 KiB)
K_BLOCK = 256          # input channels summed per pass over the output (when C_in is more)


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), array(3), array(1), INT,
                              FLOAT, FLOAT))
def _pointwise(weight, x, bias, residual, y, space, code, a, b):
    """y[n] (C_out, L) = activation(weight[n or 0] (C_out, C_in) @ x[n] (C_in, L) + bias[c] +
    residual[n]), every block (``pointwise_blocks``; ``space``: space_size(C_in) floats)."""
    pointwise_blocks(weight, x, bias, residual, y, space, code, a, b, np.int64(0),
                     block_count(x.shape[1], weight.shape[1], x.shape[0], x.shape[2]))


@kernel(nogil=True)
def block_width(c_in, length):
    """Pixels per band of work: the fewest equal bands (in whole strips of COLUMNS) whose
    rows of x in one slice of K_BLOCK channels fit in X_BLOCK floats (a band of x stays in
    cache while each 6 channels' rows of y are written)."""
    most = max(1, X_BLOCK // max(min(c_in, K_BLOCK) * COLUMNS, 1)) * COLUMNS
    bands = (length + most - 1) // most
    width = (length + bands - 1) // max(bands, 1)
    return (width + COLUMNS - 1) // COLUMNS * COLUMNS


@kernel(nogil=True)
def block_count(c_in, c_out, images, length):
    """How many blocks of work (ROWS channels by block_width pixels) make y (N, C_out, L)."""
    width = max(block_width(c_in, length), 1)
    return images * ((c_out + ROWS - 1) // ROWS) * ((length + width - 1) // width)


@kernel(nogil=True)
def pointwise_blocks(weight, x, bias, residual, y, space, code, a, b, first, last):
    """Blocks first .. last - 1 of _pointwise's y: image by image, band of pixels by band
    (``block_width``), and in each band channel block by channel block, a block being
    COLUMNS-pixel tiles one after the other. ``weight`` (1 or N, C_out, C_in): one matrix
    for every image, or one each (Winograd's products). ``bias`` has C_out values (zeros for
    none); ``residual`` y's shape, or no values for none; ``code``, a, b: the activation
    (layers/fast/epilogue.py)."""
    images, c_in, length = x.shape
    c_out = weight.shape[1]
    stacked = weight.shape[0] > 1                     # a matrix per image
    panels = (c_out + ROWS - 1) // ROWS               # blocks of channels
    width = max(block_width(c_in, length), 1)
    bands = (length + width - 1) // width             # bands of pixels
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)   # no clamp
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the block: ReLU, ReLU6
    w, ys = weight.reshape(weight.size), y.reshape(y.size)
    rs = residual.reshape(residual.size)
    pack = c_out >= c_in                              # x read again for each 6 channels
    packed, xs = space[:min(c_in, K_BLOCK) * width], x.reshape(x.size)
    no_bias, no_residual = np.zeros(ROWS, np.float32), rs[:0]     # for partial sums
    for k0 in range(0, max(c_in, 1), K_BLOCK):       # a slice of the sum over k ...
        k1 = min(c_in, k0 + K_BLOCK)
        whole = k1 == c_in                            # ... the last one: finish y
        packed_band = -1
        for block in range(first, last):
            image, index = block // (panels * bands), block % (panels * bands)
            band, panel = index // panels, index % panels
            start = band * width
            stop = min(length, start + width)
            if pack:                                  # x[k, p] at source[k * step + p - start]
                if image * bands + band != packed_band:
                    packed_band = image * bands + band
                    for k in range(k0, k1):
                        at = (k - k0) * width
                        packed[at:at + stop - start] = x[image, k, start:stop]
                source, origin, step = packed, -start - k0 * width, width
            else:
                source, origin, step = xs, image * c_in * length, length
            c0 = panel * ROWS
            rows = min(ROWS, c_out - c0)
            w0 = ((image * c_out if stacked else 0) + c0) * c_in    # weight[., c0, 0]
            for p0 in range(start, stop, COLUMNS):
                count = min(COLUMNS, stop - p0)
                at = (image * c_out + c0) * length + p0
                if k0 == 0:
                    tile = tile_zero()
                else:                                 # carry on from the slices before
                    tile = tile_load(ys, at, length, rows, count)
                if origin + (k1 - 1) * step + p0 + COLUMNS <= source.size:
                    for k in range(k0, k1):           # tile += weight[c0:, k] x[k, p0:]
                        tile = tile_fma(tile, w, w0 + k, c_in, rows, source,
                                        origin + k * step + p0, COLUMNS)   # whole vectors
                else:                                 # the tile at the very end of x
                    for k in range(k0, k1):
                        at_x = origin + k * step + p0     # whole vectors up to x's end
                        tile = tile_fma(tile, w, w0 + k, c_in, rows, source, at_x,
                                        min(COLUMNS, source.size - at_x))
                if not whole:                         # a partial sum, stored as it is
                    tile_store(tile, ys, at, length, rows, count, no_bias, 0, no_residual,
                               open_lo, open_hi)
                    continue
                tile_store(tile, ys, at, length, rows, count, bias, c0, rs, lo, hi)
                if code != NONE and code != RELU and code != CLAMP:   # other activations
                    for r in range(rows):
                        activate_row(y[image, c0 + r, p0:p0 + count], code, a, b)


@functools.lru_cache(maxsize=256)
def _zeros(size: int) -> np.ndarray:
    """A bias of zeros, for a convolution without one (shared: never written)."""
    return np.zeros(size, np.float32)


NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)


def space_size(c_in: int) -> int:
    """Floats of work space one chunk of pointwise_blocks needs: a band of x, at most K_BLOCK
    rows of ``block_width`` pixels, at most X_BLOCK floats unless one strip of COLUMNS is
    more."""
    return max(X_BLOCK, min(c_in, K_BLOCK) * COLUMNS)


def pointwise_conv2d(weight: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                     residual: np.ndarray | None, activation: Activation, y: np.ndarray) -> None:
    """y (N, C_out, L) = activation(weight (C_out, C_in) @ x (N, C_in, L) + bias +
    residual): all float32, C-contiguous; residual y's shape or None. ``weight`` may also be a
    stack (N, C_out, C_in), a matrix per image: y[n] = weight[n] @ x[n] (Winograd's products).
    Shared with the team's helper threads if there is one (the bits are the same either
    way)."""
    weight = weight if weight.ndim == 3 else weight[None]      # (1 or N, C_out, C_in)
    bias = _zeros(weight.shape[1]) if bias is None else bias
    residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
    team = workers.current()
    space = workers.scratch("pointwise", (1 if team is None else team.threads,
                                          space_size(x.shape[1])))
    if team is None:
        _pointwise(weight, x, bias, residual, y, space[0], activation.code, activation.a,
                   activation.b)
    else:
        team.pointwise(weight, x, bias, residual, y, space, activation)
