"""1x1 convolution (stride 1, no padding, one group) as a register-tiled matrix product.

Such a convolution is one matrix product per image, on the image as it lies in memory::

    y[n] (C_out, H*W) = activation(weight (C_out, C_in) @ x[n] (C_in, H*W) + bias + residual)

Each block of ROWS output channels by COLUMNS pixels (simd.py: 6 x 2 vectors) is summed in
vector registers over C_in and written once, finished: ReLU and ReLU6 are clamps in the
registers, other activations run on the block's rows right after it is written. One weight
matrix is read as it is; ``weight`` may also be a stack (N, C_out, C_in), one matrix per image
(Winograd's products, packed once at build), each laid out in panels of ROWS channels
(``pack_stack``): a tile's ROWS weights of one k are then next to each other, one cache line
for all of them and one pointer to follow, where a stack's sums, cut into chains, leave the
registers few to follow six rows.

The sum over C_in is taken in chains of fused multiply-adds, each from zero and added in
turn to the sum of those before (``tile_add``): chains of K_BLOCK channels for one matrix,
of 16 to 64 for a stack (``stack_chain``, by C_in), whose sums Winograd's output
transform amplifies (a chain's float32 error grows with the partial sums it carries; short
chains added up stay nearer the exact sum: tests/fast/test_precision.py). Where a slice of
the sum is one chain (most 1x1 layers, on whole vectors of x), the chain runs straight
into the tile and is added to zero or to the slices before it only after it has run: the
same additions as ever (a chain of tiny negative products that ends in -0.0 still gives
0 + -0.0 = +0.0), without holding a second tile while a chain runs, which would spill one
to memory on AVX2 (16 registers: one tile and its operands).

Work is cut into bands of pixels of at most X_BLOCK floats of x (``block_width``), each band
into blocks of ROWS channels, so that a band of x stays in cache while every block reads it.
A sum over more than K_BLOCK channels is taken in slices: each slice's partial sums are
stored as the float32 the registers hold and the next slice carries on from them
(``tile_load``), so the result has the bits of the uncut sum. A widening convolution
(C_out >= C_in) first copies its band of x, in strips of COLUMNS pixels (``pack_strips``:
each tile then reads one run of memory), into its thread's row of work space (``space``);
the row's header says which band it holds, so a thread that takes the next chunk of the
same band does not copy it again (the helper threads take a product whose x is packed in
chunks of whole bands where its bands allow: workers.py). A narrowing one reads x in place,
unless more than one block of ROWS channels reads rows that are not whole cache lines (7x7
and 14x14 images: vectors across two lines), or rows whose length has so large a power of
two (64x64 images: 4096 floats) that a strip's vectors, one per row, share a few cache sets
and evict each other before the next block reads them (``packs_x``); packed, its pixels are
cut into NARROWING_BANDS bands at least over all images (``least_bands``), so that the
threads sharing the product pack a band each rather than all of x each.

The rows of x may also be the cols of a k x k convolution (layers/fast/gemm.py), made band by
band straight into the work space (``cols_band``, from the stride phases of its image and
its ``geometry``, in rows of the band's width) rather than all at once into memory and read
back.

A band's last tile is usually partial. One of at most LANES columns runs one vector a row
(``tile_fma_narrow``, half the multiply-adds: 196 pixels in 16-float vectors are 13 of
them, not 14); its rows of x are still read as whole vectors where the array goes on (those
lanes are summed and never stored; a work space's are zeros: ``pack_strips``); only at
the very end of x does a masked load read less.
Where x is packed in strips (not for a stack or a convolution's cols), that last strip is
laid out along k instead and its columns are dot products, k in the lanes (``tail_dots``):
a broadcast weight per multiply-add would cost a load for every useful product (with
8-float vectors, 7x7 images end in a tail of one pixel). Each value of y is the same sum
(the same chains, added in the same order) wherever its block falls, and which pixels are a
tail depends on the product's shape only, so the result does not depend on how many
threads share the work (nor, for 1x1 convolutions, on the batch).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.epilogue import CLAMP, NONE, RELU, Activation, activate_block, clamp_bounds
from layers.fast.phases import (DIL_W, GEOMETRY, KH, KW, LEFT, OUT_H, OUT_W, STRIDE_W, WIDTH,
                                columns_inside,
                                geometry_layout)
from layers.fast.simd import (COLUMNS, LANES, ROWS, STEPS, tile_add, tile_dot_pair,
                              tile_fma, tile_fma_narrow, tile_fma_steps, tile_fold_dots,
                              tile_load, tile_store, tile_zero, vector_copy_part, vector_load,
                              vector_store)
from layers.fast.operands import check, check_sizes, unchecked
from layers.fast.team import LINE_FLOATS, scratch, team_worth_sharing
from parser.errors import ShapeError

X_BLOCK = 1 << 16      # floats of x a band of pixels reads (256 KiB)
K_BLOCK = 256          # input channels summed per pass over the output (when C_in is more)
NARROWING_BANDS = 8    # bands of a narrowing product that packs x, over all images (where it
                       # has that many strips): whole bands a chunk for teams of 2-4 threads
SHARED_FROM = 1 << 18  # multiply-adds: a smaller product runs faster alone than shared
STACK_CHAIN = 16       # channels per chain of a stack's sums (Winograd's products) ...
LONG_CHAINS_FROM = 128 # ... twice as many from this many input channels on, four times as
                       # many from twice as many (``stack_chain``)
# LINE_FLOATS (team.py): floats in a cache line; rows of x whose length is not a multiple
# of it are packed (a vector across two lines costs two)
SET_FLOATS = 1 << 14   # the cache packs_x models: ways of this many floats (64 KiB) ...
CACHE_WAYS = 8         # ... and this many ways (a 512 KiB L2: the model whose rule paid)
HEADER = 16            # floats before a row of work space's band: (band + 1, k0) it holds,
                       # read by the next chunk its thread takes (64 bytes: rows stay aligned)


@kernel(nogil=True, exported=(array(3), array(3), array(1), array(3), array(3), array(1),
                              array(1, INT), INT, FLOAT, FLOAT))
def _pointwise(weight, x, bias, residual, y, space, geometry, code, a, b):
    """y[n] (C_out, L) = activation(weight[n or 0] (C_out, C_in) @ x[n] (C_in, L) + bias[c] +
    residual[n]), every block (``pointwise_blocks``; ``space``: space_size(C_in) floats)."""
    forget_band(space)
    pointwise_blocks(weight, x, bias, residual, y, space, geometry, code, a, b, np.int64(0),
                     block_count(weight.shape[2], weight.shape[1], y.shape[0], y.shape[2],
                                 geometry.shape[0] > 0, weight.shape[0] > 1))


@kernel(nogil=True, inline="always")
def stack_chain(c_in):
    """Channels per chain of a stack's sum over ``c_in`` channels: STACK_CHAIN, times 2 from
    LONG_CHAINS_FROM channels, times 4 from twice as many. A chain ends in adding its tile to
    the sum of those before (12 vector additions, and on AVX2, whose registers do not hold
    the two tiles, loads and stores of one); with many channels the rounding of the sum
    itself grows faster than that of longer chains (tests/fast/test_precision.py)."""
    if c_in < LONG_CHAINS_FROM:
        return STACK_CHAIN
    return 2 * STACK_CHAIN if c_in < 2 * LONG_CHAINS_FROM else 4 * STACK_CHAIN


@kernel(nogil=True, inline="always")
def forget_band(space):
    """Mark a row of work space as holding no band of x: done before each call or job, so
    that a band packed from another x is never taken for this one's."""
    space[0] = np.float32(0.0)


@kernel(nogil=True)
def block_width(c_in, length, least):
    """Pixels per band of work: the fewest equal bands (in whole strips of COLUMNS) whose
    rows of x in one slice of K_BLOCK channels fit in X_BLOCK floats (a band of x stays in
    cache while each 6 channels' rows of y are written), and at least ``least`` bands where
    there are that many strips (else bands of one strip: ``least_bands``)."""
    most = max(1, X_BLOCK // max(min(c_in, K_BLOCK) * COLUMNS, 1)) * COLUMNS
    bands = (length + most - 1) // most
    width = (length + bands - 1) // max(bands, 1)
    width = (width + COLUMNS - 1) // COLUMNS * COLUMNS
    if least > 1:
        strips = (length + COLUMNS - 1) // COLUMNS
        width = min(width, max(1, strips // least) * COLUMNS)
    return width


@kernel(nogil=True)
def band_count(c_in, length, least):
    """How many bands of block_width pixels cut ``length`` pixels."""
    width = max(block_width(c_in, length, least), 1)
    return (length + width - 1) // width


@kernel(nogil=True)
def least_bands(c_in, c_out, images, length, cols, stacked):
    """Bands each image's pixels are cut into at least (``block_width``): for a narrowing
    product of one matrix whose x is packed (``packs_x``), enough for NARROWING_BANDS over
    all images; else 1. The helper threads take such a product in chunks of whole bands,
    each packing its own (workers.py), where one band an image would have each of them
    pack every image's whole x: one image of 14x14 makes a band a strip, not one band."""
    if c_out < c_in and not cols and not stacked and packs_x(c_in, c_out, length, cols):
        return (NARROWING_BANDS + images - 1) // max(images, 1)
    return 1


@kernel(nogil=True)
def packs_x(c_in, c_out, length, cols):
    """Whether pointwise_blocks copies x band by band into its work space: always for a
    convolution's cols and for a widening product (C_out >= C_in: many blocks of channels read
    each band); for a narrowing one, only where more than one block of channels reads rows
    that are not whole cache lines, or rows that start in too few sets of the cache. If 2^j
    is the largest power of two dividing the row length (``length & -length``, at least
    LINE_FLOATS here), the rows start in SET_FLOATS / 2^j different sets of a cache with
    ways of SET_FLOATS floats, each set holding CACHE_WAYS lines, while a strip reads a line
    (two neighbouring ones with 16-float vectors) from each of min(C_in, K_BLOCK) rows:
    64x64 planes are packed from 33 input channels, 32x32 from 129, 56x56 never."""
    if cols or c_out >= c_in:
        return True
    sets = SET_FLOATS // min(SET_FLOATS, max(length & -length, 1))   # length & -length: 2^j
    return c_out > ROWS and (length % LINE_FLOATS != 0
                             or min(c_in, K_BLOCK) > CACHE_WAYS * sets)


@kernel(nogil=True, exported=(INT, INT, INT, INT, INT, INT, array(1, INT)))
def _band_plan(c_in, c_out, images, length, cols, stacked, plan):
    """plan[0] = band_count, plan[1] = packs_x (1 or 0): for the Python side (``band_plan``)."""
    least = least_bands(c_in, c_out, images, length, cols != 0, stacked != 0)
    plan[0] = band_count(c_in, length, least)
    plan[1] = 1 if packs_x(c_in, c_out, length, cols != 0) else 0


@kernel(nogil=True)
def block_count(c_in, c_out, images, length, cols, stacked):
    """How many blocks of work (ROWS channels by block_width pixels) make y (N, C_out, L)."""
    least = least_bands(c_in, c_out, images, length, cols, stacked)
    return images * ((c_out + ROWS - 1) // ROWS) * band_count(c_in, length, least)


@kernel(nogil=True, inline="always")
def cols_layout(geometry):
    """(row_len, tap_start) of the phases of a convolution's ``geometry`` (no values: a plain
    product, for which (0, no taps))."""
    if geometry.shape[0] == 0:
        return 0, np.zeros((0, 0), np.int64)
    row_len, _, _, tap_start, _, _ = geometry_layout(geometry)
    return row_len, tap_start


@kernel(nogil=True, inline="always")
def cols_band(phases, image, geometry, row_len, tap_start, k0, k1, start, stop, packed, width):
    """Rows k0 .. k1 - 1 of image ``image``'s cols, pixels start .. stop - 1, into
    packed[(k - k0) * width + p - start]: for a convolution of ``geometry``,
    ``phases`` (N, C, size) holds each input plane split into its stride phases
    (layers/fast/phases.py, ``row_len`` and ``tap_start`` from cols_layout), where tap (i, j)
    of channel c reads a plain window::

        cols[(c, i, j), (oh, ow)] = phases[image, c, tap_start[i, j] + oh * row_len + ow]

    or zero where the tap's column lies outside the image (a zero written, never a product
    with one: an Inf next to the window stays out of it; the padding rows are zeros of
    the phases). A row's lanes past ``stop`` up to a whole strip of COLUMNS are zeroed
    (``pack_strips`` says why)."""
    kh, kw, out_w = geometry[KH], geometry[KW], geometry[OUT_W]
    zero = np.float32(0.0)
    filled = (stop - start + COLUMNS - 1) // COLUMNS * COLUMNS   # the strips tiles read
    for k in range(k0, k1):
        packed[(k - k0) * width + stop - start:(k - k0) * width + filled] = zero
        c, tap = k // (kh * kw), k % (kh * kw)
        i, j = tap // kw, tap % kw
        plane, at = phases[image, c], tap_start[i, j]
        inside_from, inside_to = columns_inside(geometry[WIDTH], out_w, geometry[STRIDE_W],
                                                geometry[DIL_W], geometry[LEFT], j)
        row = packed[(k - k0) * width:(k - k0) * width + stop - start]
        if row_len == out_w:                           # the band is one run of the plane
            copy_run(plane, at + start, row, 0, stop - start)
            if inside_from == 0 and inside_to == out_w:
                continue                               # no column outside the image
        p = start
        while p < stop:                                # output row by output row
            oh = p // out_w
            ow0 = p - oh * out_w
            ow1 = min(out_w, ow0 + stop - p)
            first = p - ow0 - start                    # row index of (oh, 0)
            copy_from = min(max(ow0, inside_from), ow1)
            copy_to = max(min(ow1, inside_to), copy_from)
            for ow in range(ow0, copy_from):
                row[first + ow] = zero
            if row_len != out_w:
                copy_run(plane, at + oh * row_len + copy_from, row, first + copy_from,
                         copy_to - copy_from)
            for ow in range(copy_to, ow1):
                row[first + ow] = zero
            p += ow1 - ow0


@kernel(nogil=True, inline="always")
def pack_strips(xs, first, length, k0, k1, start, stop, packed, tail_along_k):
    """Rows k0 .. k1 - 1 of x (x[k, p] at xs[first + k * length + p]), pixels start ..
    stop - 1, into ``packed`` in strips of COLUMNS pixels, each strip's rows one after the
    other::

        packed[(p - start) // COLUMNS * (k1 - k0) * COLUMNS + (k - k0) * COLUMNS
               + (p - start) % COLUMNS] = x[k, p]

    so that a tile reads one run of memory, strip after strip, rather than a vector from
    each of k1 - k0 rows (rows a multiple of 4 KiB apart, as on 32x32 images, all fall in
    the same few sets of the L1 cache). Lanes past ``stop`` in the last strip are zeroed:
    they are summed and never stored, but what the work space held there may be subnormal
    (any small integer's bits are), and a multiply-add on a subnormal takes the CPU's slow
    path (a microcode assist). With ``tail_along_k``, a last strip of at most LANES pixels
    (a narrow tile's: ``tail_dots``, which reads only its pixels, so nothing is zeroed) is
    laid out along k instead, pixel after pixel::

        packed[(p - start) // COLUMNS * (k1 - k0) * COLUMNS + (p - p_tail) * (k1 - k0)
               + k - k0] = x[k, p]"""
    depth, rows_k = (k1 - k0) * COLUMNS, k1 - k0
    tail = start + (stop - start - 1) // COLUMNS * COLUMNS      # the last strip's first pixel
    whole = tail if tail_along_k and stop - tail <= LANES else stop   # strips as they lie
    past = (tail - start) // COLUMNS * depth + stop - tail    # the last strip's lanes past stop
    for k in range(k0, k1):
        row, target = first + k * length, (k - k0) * COLUMNS
        for p in range(start, whole, COLUMNS):
            copy_run(xs, row + p, packed, target + (p - start) // COLUMNS * depth,
                     min(COLUMNS, stop - p))
        if whole == stop:
            packed[target + past:target + past + COLUMNS - (stop - tail)] = np.float32(0.0)
    if whole == tail:
        at = (tail - start) // COLUMNS * depth
        for k in range(k0, k1):
            for p in range(tail, stop):
                packed[at + (p - tail) * rows_k + k - k0] = xs[first + k * length + p]


@kernel(nogil=True, inline="never")
def tail_dots(w, w0, c_in, rows, packed, at, k0, k1, count, ys, y_at, length, whole, bias,
              c0, rs, lo, hi, no_bias):
    """A narrow tile (at most LANES pixels) over the slice k0 .. k1 - 1 (one chain: a
    single matrix's), its sums sum_k weight[c0 + r, k] x[k, j] taken as dot products from
    the tail strip pack_strips lays out along k at packed[at:] (x[k, j] at at + j * (k1 -
    k0) + k - k0), two pixels at a time, k in the lanes (``tile_dot_pair``): a broadcast
    of one weight a multiply-add would read as many values as it multiplies. Then, as
    pointwise_blocks does with a tile: added to zero or to the slices before it (read from
    y at ``y_at``), stored, finished if the slice is the last (``whole``; ``no_bias``: ROWS
    zeros, for a partial sum). A function of its own (not inlined: in the loop of the
    products, it slows the stacked ones), which takes and returns no tile (numba's
    just-in-time functions do not pass them)."""
    sums = tile_zero()
    rows_k = k1 - k0
    for j in range(0, count, 2):
        second = rows_k if j + 1 < count else 0          # a last pixel alone: read twice
        dots = tile_zero()
        for k in range(k0, k1, LANES):
            dots = tile_dot_pair(dots, w, w0 + k, c_in, rows, packed,
                                 at + j * rows_k + k - k0, second, min(LANES, k1 - k))
        sums = tile_fold_dots(sums, dots, j)
    if k0 == 0:
        tile = tile_add(tile_zero(), sums)
    else:
        tile = tile_add(tile_load(ys, y_at, length, rows, count), sums)
    if whole:
        tile_store(tile, ys, y_at, length, rows, count, bias, c0, rs, lo, hi)
    else:                                                # a partial sum, stored as it is
        tile_store(tile, ys, y_at, length, rows, count, no_bias, 0, rs[:0],
                   np.float32(-np.inf), np.float32(np.inf))


@kernel(nogil=True, inline="always")
def copy_run(source, source_first, target, target_first, count):
    """target[target_first + q] = source[source_first + q] for q < count, LANES at a time
    and the rest in one masked vector (a loop over computed indices compiles to gathers or
    to one value at a time)."""
    whole = count // LANES * LANES
    for q in range(0, whole, LANES):
        vector_store(vector_load(source, source_first + q), target, target_first + q)
    vector_copy_part(source, source_first + whole, target, target_first + whole,
                     count - whole)


@kernel(nogil=True)
def pointwise_blocks(weight, x, bias, residual, y, space, geometry, code, a, b, first, last):
    """Blocks first .. last - 1 of _pointwise's y: image by image, band of pixels by band
    (``block_width``), and in each band channel block by channel block, a block being
    COLUMNS-pixel tiles one after the other. ``weight`` (1 or N, C_out, C_in): one matrix
    for every image, as it is, or one each (Winograd's products), in panels (``pack_stack``).
    ``bias`` has C_out values (zeros for none); ``residual`` y's shape, or no values for
    none; ``geometry``: no values, or a convolution's (phases.geometry_of) whose cols are the
    rows of x, x being its image's phases (N, C, size: ``cols_band``); ``code``, a, b: the
    activation (layers/fast/epilogue.py)."""
    length = y.shape[2]
    c_out, c_in = weight.shape[1], weight.shape[2]
    cols = geometry.shape[0] > 0                      # x: a convolution's phases
    row_len, tap_start = cols_layout(geometry)
    stacked = weight.shape[0] > 1                     # a matrix per image
    panels = (c_out + ROWS - 1) // ROWS               # blocks of channels
    least = least_bands(c_in, c_out, y.shape[0], length, cols, stacked)
    width = max(block_width(c_in, length, least), 1)
    bands = band_count(c_in, length, least)           # bands of pixels
    open_lo, open_hi = np.float32(-np.inf), np.float32(np.inf)   # no clamp
    lo, hi = clamp_bounds(code, a, b)                 # clamped in the block: ReLU, ReLU6
    w, ys = weight.reshape(weight.size), y.reshape(y.size)
    rs = residual.reshape(residual.size)
    pack = packs_x(c_in, c_out, length, cols)         # x copied band by band, or in place
    # a narrow tile as dot products (``tail_dots``), where x is packed in strips and the
    # tail's pixels are the same in any call: not a stack's, whose tiles (Winograd's) fall
    # in the tail or not as its batch is cut into chunks (their bits may not depend on it);
    # a single matrix sums a slice as one chain (K_BLOCK), which tail_dots takes whole
    dots = pack and not cols and not stacked
    step = width if cols else COLUMNS if pack else length   # from x[k, p] to x[k + 1, p]
    chain = stack_chain(c_in) if stacked else K_BLOCK  # channels per chain of the sum
    held = space[:HEADER]                             # which band the work space holds
    keep = y.shape[0] * bands < (1 << 24)             # band numbers exact as float32
    packed, xs = space[HEADER:HEADER + min(c_in, K_BLOCK) * width], x.reshape(x.size)
    source = packed if pack else xs
    no_bias, no_residual = np.zeros(ROWS, np.float32), rs[:0]     # for partial sums
    for k0 in range(0, max(c_in, 1), K_BLOCK):       # a slice of the sum over k ...
        k1 = min(c_in, k0 + K_BLOCK)
        whole = k1 == c_in                            # ... the last one: finish y
        for block in range(first, last):
            image, index = block // (panels * bands), block % (panels * bands)
            band, panel = index // panels, index % panels
            start = band * width
            stop = min(length, start + width)
            if pack:                                  # x's band into the work space
                held_band, held_k0 = np.float32(image * bands + band + 1), np.float32(k0)
                if not keep or held[0] != held_band or held[1] != held_k0:   # not yet
                    held[0], held[1] = held_band, held_k0        # by this thread
                    if cols:
                        cols_band(x, image, geometry, row_len, tap_start, k0, k1, start,
                                  stop, packed, width)
                    else:
                        pack_strips(xs, image * c_in * length, length, k0, k1, start, stop,
                                    packed, dots)
            c0 = panel * ROWS
            rows = min(ROWS, c_out - c0)
            w0 = ((image * c_out if stacked else 0) + c0) * c_in    # weight[., c0, 0]
            k_step, row_step = (rows, 1) if stacked else (1, c_in)   # panels (pack_stack)
            for p0 in range(start, stop, COLUMNS):
                count = min(COLUMNS, stop - p0)
                at = (image * c_out + c0) * length + p0
                narrow = count <= LANES               # one vector a row is enough
                read = LANES if narrow else COLUMNS   # floats of x read a row
                if cols:                              # x[k, p0] at source[x0 + k * step]:
                    x0 = p0 - start - k0 * width      # rows of width pixels (cols_band)
                elif pack:
                    x0 = (p0 - start) * (k1 - k0) - k0 * COLUMNS   # strips (pack_strips)
                else:
                    x0 = image * c_in * length + p0   # x in place
                inside = x0 + (k1 - 1) * step + read <= source.size
                if narrow and dots:                   # the tail strip, along k
                    tail_dots(w, w0, c_in, rows, packed, (p0 - start) * (k1 - k0), k0, k1,
                              count, ys, at, length, whole, bias, c0, rs, lo, hi, no_bias)
                    continue
                if k1 - k0 <= chain and inside and not narrow:
                    # the common tile: the slice's sum is one chain, taken straight into it,
                    # then added to zero or to the slices before it, read only now (a
                    # second tile held while a chain runs, 24 vectors, spills on AVX2)
                    tile = tile_zero()
                    # a stack's whole panel (pack_stack) passes the constant ROWS: its rows'
                    # weights of a k then sit at fixed offsets from one pointer, where with
                    # ``rows`` known at run time only (simd.py repeats the last row past
                    # it) each row keeps a pointer of its own, which every k moves on
                    if stacked and rows == ROWS:
                        for k in range(k0, k1):
                            tile = tile_fma(tile, w, w0 + k * ROWS, 1, ROWS, source,
                                            x0 + k * step, COLUMNS)
                    elif stacked:
                        for k in range(k0, k1):
                            tile = tile_fma(tile, w, w0 + k * rows, 1, rows, source,
                                            x0 + k * step, COLUMNS)
                    elif pack and not cols:           # a matrix as it is, x in strips:
                        # STEPS k at a time (tile_fma_steps), a strip's rows COLUMNS apart
                        for k in range(k0, k1 - STEPS + 1, STEPS):
                            tile = tile_fma_steps(tile, w, w0 + k, c_in, rows, source,
                                                  x0 + k * COLUMNS, COLUMNS, 1, COLUMNS)
                        for k in range(k0 + (k1 - k0) // STEPS * STEPS, k1):
                            tile = tile_fma(tile, w, w0 + k, c_in, rows, source,
                                            x0 + k * COLUMNS, COLUMNS)
                    else:                             # x in place, or cols
                        for k in range(k0, k1):
                            tile = tile_fma(tile, w, w0 + k, c_in, rows, source,
                                            x0 + k * step, COLUMNS)
                    if k0 == 0:
                        tile = tile_add(tile_zero(), tile)
                    else:
                        tile = tile_add(tile_load(ys, at, length, rows, count), tile)
                else:
                    if k0 == 0:
                        tile = tile_zero()
                    else:                             # carry on from the slices before
                        tile = tile_load(ys, at, length, rows, count)
                    for h0 in range(k0, k1, chain):   # tile += a chain, from zero
                        part = tile_zero()
                        h1 = min(k1, h0 + chain)
                        if inside and narrow and stacked and rows == ROWS:   # (as above)
                            for k in range(h0, h1):
                                part = tile_fma_narrow(part, w, w0 + k * ROWS, 1, ROWS,
                                                       source, x0 + k * step, LANES)
                        elif inside and narrow:       # weight[c0:, k] x[k, p0:], whole vectors
                            for k in range(h0, h1):
                                part = tile_fma_narrow(part, w, w0 + k * k_step, row_step,
                                                       rows, source, x0 + k * step, LANES)
                        elif inside and stacked and rows == ROWS:   # (as above)
                            for k in range(h0, h1):
                                part = tile_fma(part, w, w0 + k * ROWS, 1, ROWS, source,
                                                x0 + k * step, COLUMNS)
                        elif inside:
                            for k in range(h0, h1):
                                part = tile_fma(part, w, w0 + k * k_step, row_step, rows,
                                                source, x0 + k * step, COLUMNS)
                        else:                         # the tile at the very end of x
                            for k in range(h0, h1):
                                at_x = x0 + k * step          # whole vectors up to x's end
                                part = tile_fma(part, w, w0 + k * k_step, row_step, rows,
                                                source, at_x, min(read, source.size - at_x))
                        tile = tile_add(tile, part)
                if not whole:                         # a partial sum, stored as it is
                    tile_store(tile, ys, at, length, rows, count, no_bias, 0, no_residual,
                               open_lo, open_hi)
                    continue
                tile_store(tile, ys, at, length, rows, count, bias, c0, rs, lo, hi)
            if whole and code != NONE and code != RELU and code != CLAMP:   # other ones,
                activate_block(y, image, c0, rows, start, stop, code, a, b)   # on the rows


@functools.lru_cache(maxsize=256)
def _zeros(size: int) -> np.ndarray:
    """A bias of zeros, for a convolution without one (shared: never written)."""
    return np.zeros(size, np.float32)


NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)
NO_GEOMETRY = np.zeros(0, np.int64)       # x's rows are x's own (not a convolution's cols)


@functools.lru_cache(maxsize=1024)
def band_plan(c_in: int, c_out: int, images: int, length: int, cols: bool,
              stacked: bool) -> tuple[int, bool]:
    """(band_count, packs_x) of a product, as pointwise_blocks works them out (cached: a
    forward asks about the same few products every time)."""
    plan = np.zeros(2, np.int64)
    _band_plan(c_in, c_out, images, length, int(cols), int(stacked), plan)
    return int(plan[0]), bool(plan[1])


def space_size(c_in: int) -> int:
    """Floats of work space a thread running pointwise_blocks needs: HEADER, then a band of x,
    at most K_BLOCK rows of ``block_width`` pixels, at most X_BLOCK floats unless one strip of
    COLUMNS is more."""
    return HEADER + max(X_BLOCK, min(c_in, K_BLOCK) * COLUMNS)


def pack_stack(weight: np.ndarray) -> np.ndarray:
    """A stack of matrices (N, C_out, C_in) as pointwise_blocks reads one: each matrix in
    panels of ROWS output channels (the last one's fewer), a panel's column k at
    c0 * C_in + k * rows, its rows one after the other. The same shape and values, moved.
    For N > 1 only: pointwise_blocks reads a single matrix (N = 1) as it is."""
    return in_panels(weight[..., None]).reshape(weight.shape)


def in_panels(entries: np.ndarray) -> np.ndarray:
    """(N, C_out, C_in, T) -> (N, C_out * C_in, T) float32: the (C_out, C_in) entries of each
    of the N matrices in pack_stack's order, the T values of an entry kept together. A
    product that computes each entry from its own values alone (Winograd's filter
    transform) can run on entries in this order and give a stack already in panels."""
    n, c_out, c_in, t = entries.shape
    moved = np.empty((n, c_out * c_in, t), np.float32)
    whole = c_out - c_out % ROWS                  # the full panels, moved in one copy
    # (each slice of ``moved`` is split along one axis: a view, so the copies land in it)
    moved[:, :whole * c_in].reshape(n, whole // ROWS, c_in, ROWS, t)[...] = (
        entries[:, :whole].reshape(n, whole // ROWS, ROWS, c_in, t).transpose(0, 1, 3, 2, 4))
    moved[:, whole * c_in:].reshape(n, c_in, c_out - whole, t)[...] = (
        entries[:, whole:].transpose(0, 2, 1, 3))
    return moved


def pointwise_conv2d(weight: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                     residual: np.ndarray | None, activation: Activation, y: np.ndarray,
                     geometry: np.ndarray = NO_GEOMETRY) -> None:
    """y (N, C_out, L) = activation(weight (C_out, C_in) @ x (N, C_in, L) + bias +
    residual): all float32, C-contiguous; residual y's shape or None. ``weight`` may also be a
    stack (N, C_out, C_in) laid out by ``pack_stack``, a matrix per image: y[n] = weight[n] @
    x[n] (Winograd's products).
    With a convolution's ``geometry`` (phases.geometry_of), x (N, C, size) is its image
    split into stride phases (gemm.split_planes) and C_in = C * kh * kw the rows of its
    cols. Shared with the team's helper threads if there is one (the bits are the same
    either way)."""
    weight = weight if weight.ndim == 3 else weight[None]      # (1 or N, C_out, C_in)
    if not geometry.size:                  # the product takes any shape of x's size
        check(x, (y.shape[0], weight.shape[2], y.shape[2]), "1x1 product's input")
    product = pointwise_product(weight, bias, y.shape[2], activation, geometry)
    product(x, None if residual is None else residual.reshape(y.shape), y)


def pointwise_product(weight: np.ndarray, bias: np.ndarray | None, length: int,
                      activation: Activation, geometry: np.ndarray = NO_GEOMETRY
                      ) -> Callable[..., None]:
    """pointwise_conv2d by ``weight`` (1 or N, C_out, C_in) into y (N, C_out, length),
    worked out once: the call ``product(x, residual, y)`` takes arrays of those sizes in any
    shape that starts (N, C) (images (N, C, H, W) too), checks them (operands.check_sizes;
    weight, bias and geometry here) and runs the kernel without the per-argument checks. x
    is (N, C_in, length), or with a ``geometry`` (N, C_in / (kh * kw), size): the phases of
    gemm.split_planes, whose size gemm._geometry gives (that one is the caller's).
    ``product.unchecked`` is the same call without the checks, for a caller that has made
    x itself and checked y and residual (gemm.im2col_product)."""
    stack, c_out, c_in = weight.shape
    check(weight, weight.shape, "1x1 weight")
    bias = _zeros(c_out) if bias is None else bias
    check(bias, (c_out,), "1x1 bias")
    if (geometry.dtype != np.int64 or not geometry.flags.c_contiguous
            or geometry.shape not in ((0,), (GEOMETRY,))
            or (geometry.size and geometry[OUT_H] * geometry[OUT_W] != length)):
        raise ShapeError(f"1x1 product: a C-contiguous int64 geometry of {GEOMETRY} values "
                         f"for {length} outputs expected, got {geometry.dtype} {geometry}")
    taps = int(geometry[KH] * geometry[KW]) if geometry.size else 1
    if taps <= 0 or c_in % taps:
        raise ShapeError(f"1x1 product: {c_in} rows of cols for {taps} taps")
    x_rows = c_in // taps
    floats, work = space_size(c_in), length * c_in * c_out     # multiply-adds of one image
    kernel, code, a, b = unchecked(_pointwise), activation.code, activation.a, activation.b

    def product(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
        images = x.shape[0]
        if stack != 1 and stack != images:
            raise ShapeError(f"1x1 product: {stack} matrices for {images} images")
        if geometry.size:                          # phases (N, C, size), as they are
            if x.ndim != 3 or x.shape[1] != x_rows:
                raise ShapeError(f"1x1 product: phases of {x_rows} planes expected, got "
                                 f"{x.shape}")
            x_size = x.size
        else:
            x_size = images * c_in * length
        check_sizes(x, (images, x_rows), x_size, y, (images, c_out), images * c_out * length,
                    "1x1 product", residual)
        run(x, residual, y)

    def run(x: np.ndarray, residual: np.ndarray | None, y: np.ndarray) -> None:
        images = x.shape[0]
        x = x if geometry.size else x.reshape(images, c_in, length)
        y = y.reshape(images, c_out, length)
        residual = NO_RESIDUAL if residual is None else residual.reshape(y.shape)
        team = team_worth_sharing(images * work, SHARED_FROM)
        if team is None:
            kernel(weight, x, bias, residual, y, scratch("pointwise", (floats,)), geometry,
                   code, a, b)
        else:                                      # a row of work space per thread
            team.pointwise(weight, x, bias, residual, y,
                           scratch("pointwise", (team.threads, floats)), geometry, activation,
                           checked=False)
    product.unchecked = run        # type: ignore[attr-defined]
    return product
