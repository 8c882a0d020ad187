"""One kernel call shared between the calling thread and helper threads, without locks.

A job is a kernel call whose work is a list of ``units`` (output planes, blocks of channels,
products of a stack): it is cut into ``chunks`` ranges of consecutive units, and every thread
takes the next chunk nobody has taken until none is left, so a thread that runs late (or a
helper that is asleep) simply takes fewer. The calling thread publishes the job, takes chunks
like the helpers, and returns once every chunk is done.

Everything the threads share lives in three small arrays, written and read with atomics
(layers/fast/atomics.py):

    control (int64)  TICKET = job << 40 | chunks << 20 | next chunk to take
                     DONE   chunks of this job finished;  STOP  1: the helpers return
    record  (int64)  KIND, UNITS, arrays as address + shape, integer arguments
    reals (float64)  floating-point arguments

A thread takes chunk ``next`` by a compare-and-swap of TICKET to ``next + 1``: it fails if
another thread took it first, or if the ticket now belongs to another job. The record is
written before the ticket is published and not touched until every chunk is done, so a
thread that holds a chunk reads the right arguments. Python (layers/fast/workers.py) fills
the record with a job's entry (``_depthwise_job`` ...), then runs it with ``_work``, which
is also the helpers' loop.
"""

from __future__ import annotations

import numpy as np

# kernel modules as modules: some of them (gemm, winograd) import this one through workers.py
from layers.fast import (depthwise, epilogue, gemm, pointwise, pointwise_transposed, winograd,
                         winograd_f2)
from layers.fast.atomics import (NO_TRANS, TRANS, add, compare_swap, float_array, load, pause,
                                 sgemm, sgemv, store)
from layers.fast.backend import FLOAT, INT, array, kernel

TICKET, DONE, STOP = 0, 8, 16        # control's slots, one 64-byte cache line apart
CONTROL_SIZE = 24
FIELD = 1 << 20                      # chunks and next chunk: 20 bits each in the ticket

KIND, UNITS = 0, 1                   # record's slots
ARRAYS = np.array((2, 7, 12, 17, 22, 27))   # address, then up to four sizes (an array, so
                                            # that its items are run-time ints: see _work)
INTS = 32                            # the integer arguments from here
RECORD_SIZE, REALS_SIZE = 64, 4

DEPTHWISE, DEPTHWISE_BLOCKS, EPILOGUE, GEMM, IM2COL = 1, 2, 3, 4, 5      # kinds
WINOGRAD_IN, WINOGRAD_OUT, WINOGRAD_F2_IN, WINOGRAD_F2_OUT, POINTWISE = 6, 7, 8, 9, 10
POINTWISE_TRANSPOSED = 11
BY_PRODUCT, BY_ROWS, BY_COLUMNS = 0, 1, 2                      # how GEMM units are cut
ALIGN = 16                           # GEMM row and column cuts: multiples of this

CONTROL, RECORD, REALS = array(1, "i8"), array(1, "i8"), array(1, "f8")


# ----- the protocol ------------------------------------------------------------------------
@kernel(nogil=True, exported=(CONTROL, RECORD, REALS, INT, INT))
def _work(control, record, reals, chunks, idle_polls):
    """The one compiled entry that runs jobs. ``chunks`` > 0: publish the job in ``record``
    as that many chunks, take chunks with the helpers, and return when all are done. Else a
    helper's loop: take chunks of whatever job is published; return after ``idle_polls``
    polls without work, or when STOP is set.

    What compiling it costs (~30 s, in a module of its own: layers/fast/aot.py). Every
    kernel a chunk may run is linked into this function, and numba optimizes all of that
    again for each function that calls another. So there is one entry; ``_take_one``,
    ``_run_units`` and ``_gemm_unit`` are inlined into it (numba's inline="always") rather
    than being three more levels that each re-optimize every kernel; and everything is
    called with run-time ints, never literals, since numba compiles a function again for
    each literal argument: the exported kernels call the range kernels with np.int64(0) as
    their start (not 0) to share one compiled version with the calls here, and the record's
    array slots (ARRAYS) are an array's items. The three measures took it from 55 to 33 s."""
    if chunks > 0:
        chunks = max(1, min(chunks, record[UNITS], FIELD - 1))
        job = (load(control, TICKET) // (FIELD * FIELD) + 1) % (1 << 23)
        store(control, DONE, 0)
        store(control, TICKET, (job * FIELD + chunks) * FIELD)
    idle = 0
    while True:
        if _take_one(control, record, reals):
            idle = 0
        elif chunks > 0:                              # none left: wait for the helpers'
            while load(control, DONE) < chunks:
                pause()
            return
        else:
            idle += 1
            if idle >= idle_polls or load(control, STOP) != 0:
                return
            pause()


@kernel(inline="always")
def _take_one(control, record, reals):
    """Take and run the next chunk of the current job; False if none is left."""
    while True:
        ticket = load(control, TICKET)
        chunks, taken = (ticket // FIELD) % FIELD, ticket % FIELD
        if taken >= chunks:
            return False
        if compare_swap(control, TICKET, ticket, ticket + 1) == ticket:
            units = record[UNITS]
            _run_units(record, reals, taken, units * taken // chunks,
                       units * (taken + 1) // chunks)
            add(control, DONE, 1)
            return True


# ----- arrays in the record ----------------------------------------------------------------
@kernel(nogil=True)
def _put(record, slot, values):
    """An array's address and shape into record[slot:]."""
    record[slot] = values.ctypes.data
    for d in range(values.ndim):
        record[slot + 1 + d] = values.shape[d]


@kernel(nogil=True)
def _get1(record, slot):
    return float_array(record[slot], record[slot + 1])


@kernel(nogil=True)
def _get2(record, slot):
    d0, d1 = record[slot + 1], record[slot + 2]
    return float_array(record[slot], d0 * d1).reshape((d0, d1))


@kernel(nogil=True)
def _get3(record, slot):
    d0, d1, d2 = record[slot + 1], record[slot + 2], record[slot + 3]
    return float_array(record[slot], d0 * d1 * d2).reshape((d0, d1, d2))


@kernel(nogil=True)
def _get4(record, slot):
    d0, d1, d2, d3 = record[slot + 1], record[slot + 2], record[slot + 3], record[slot + 4]
    return float_array(record[slot], d0 * d1 * d2 * d3).reshape((d0, d1, d2, d3))


# ----- what a chunk runs -------------------------------------------------------------------
@kernel(inline="always")
def _run_units(record, reals, chunk, first, last):
    """Units first .. last - 1 of the job in ``record``, chunk ``chunk`` of it (a job that
    needs work space has one row of it per chunk)."""
    kind, i, a = record[KIND], INTS, ARRAYS
    if kind == DEPTHWISE or kind == DEPTHWISE_BLOCKS:
        x, bias, y = _get4(record, a[0]), _get1(record, a[2]), _get4(record, a[3])
        if kind == DEPTHWISE:
            depthwise.depthwise_planes(
                x, _get3(record, a[1]), bias, y, record[i], record[i + 1], record[i + 2],
                record[i + 3], record[i + 4], record[i + 5], record[i + 6], reals[0], reals[1],
                first, last)
        else:
            depthwise.depthwise_blocks(
                x, _get4(record, a[1]), bias, y, record[i], record[i + 1], record[i + 2],
                record[i + 3], record[i + 4], record[i + 5], record[i + 6], reals[0], reals[1],
                first, last)
    elif kind == EPILOGUE:
        epilogue.finish_rows(_get3(record, a[0]), _get1(record, a[1]), _get3(record, a[2]),
                             record[i], reals[0], reals[1], first, last)
    elif kind == GEMM:
        for unit in range(first, last):
            _gemm_unit(record, reals, unit)
    elif kind == POINTWISE:
        pointwise.pointwise_blocks(_get3(record, a[0]), _get3(record, a[1]),
                                   _get1(record, a[2]), _get3(record, a[3]),
                                   _get3(record, a[4]), _get2(record, a[5])[chunk], record[i],
                                   reals[0], reals[1], first, last)
    elif kind == POINTWISE_TRANSPOSED:
        pointwise_transposed.transposed_units(
            _get3(record, a[0]), _get3(record, a[1]), _get1(record, a[2]), _get3(record, a[3]),
            _get3(record, a[4]), _get2(record, a[5])[chunk], record[i], reals[0], reals[1],
            first, last)
    elif kind == IM2COL:
        gemm.im2col_channels(_get3(record, a[0]), _get2(record, a[1]), record[i],
                             record[i + 1], record[i + 2], record[i + 3], record[i + 4],
                             record[i + 5], record[i + 6], record[i + 7], record[i + 8],
                             record[i + 9], first, last)
    elif kind == WINOGRAD_IN or kind == WINOGRAD_F2_IN:
        x, v = _get4(record, a[0]), _get3(record, a[1])
        if kind == WINOGRAD_IN:
            winograd.input_planes(x, v, record[i], record[i + 1], record[i + 2],
                                  record[i + 3], first, last)
        else:
            winograd_f2.input_planes_f2(x, v, record[i], record[i + 1], record[i + 2],
                                        record[i + 3], first, last)
    elif kind == WINOGRAD_OUT or kind == WINOGRAD_F2_OUT:
        m, y, bias, residual = (_get3(record, a[0]), _get4(record, a[1]), _get1(record, a[2]),
                                _get4(record, a[3]))
        if kind == WINOGRAD_OUT:
            winograd.output_planes(m, y, bias, residual, record[i], record[i + 1],
                                   record[i + 2], reals[0], reals[1], first, last)
        else:
            winograd_f2.output_planes_f2(m, y, bias, residual, record[i], record[i + 1],
                                         record[i + 2], reals[0], reals[1], first, last)


@kernel(nogil=True)
def _cut(size, part, parts):
    """Where part ``part`` of ``parts`` starts along ``size`` (a multiple of ALIGN)."""
    if part >= parts:
        return size
    return size * part // parts // ALIGN * ALIGN


@kernel(inline="always")
def _gemm_unit(record, reals, unit):
    """One unit of a stack of products C[t] = A[t] @ B[t] (A (M, K), B (K, N) or, transposed,
    (N, K), C (M, N), C-contiguous, t-th at t * stride floats; a stride of 0 reuses one
    matrix): the whole product t, or a band of its rows or columns. With a GEMV pointer
    (products of one row, M = 1, or one column, N = 1) each band is a matrix-vector product,
    as numpy computes those (the same kernel, so the same rounding)."""
    i = INTS
    function, m, n, k = record[i], record[i + 1], record[i + 2], record[i + 3]
    stride_a, stride_b, stride_c = record[i + 4], record[i + 5], record[i + 6]
    cut, parts, transposed, gemv = record[i + 7], record[i + 8], record[i + 9], record[i + 10]
    t, part = unit // parts, unit % parts
    row0, row1, col0, col1 = 0, m, 0, n
    if cut == BY_ROWS:
        row0, row1 = _cut(m, part, parts), _cut(m, part + 1, parts)
    elif cut == BY_COLUMNS:
        col0, col1 = _cut(n, part, parts), _cut(n, part + 1, parts)
    if row1 <= row0 or col1 <= col0:
        return
    a, b, c = record[ARRAYS[0]], record[ARRAYS[1]], record[ARRAYS[2]]
    a_first = a + 4 * (t * stride_a + row0 * k)       # row row0 of A
    ldb = k if transposed else n                      # B's row stride
    b_first = b + 4 * (t * stride_b + (col0 * k if transposed else col0))   # column col0
    c_first = c + 4 * (t * stride_c + row0 * n + col0)
    if gemv != 0 and n == 1:                          # C rows = A rows @ the vector B
        sgemv(gemv, NO_TRANS, row1 - row0, k, a_first, k, b_first, c_first)
    elif gemv != 0 and transposed:                    # C = the vector A @ B^T: B's rows
        sgemv(gemv, NO_TRANS, col1 - col0, k, b_first, ldb, a_first, c_first)
    elif gemv != 0:                                   # C = the vector A @ B: B's columns
        sgemv(gemv, TRANS, k, col1 - col0, b_first, ldb, a_first, c_first)
    else:
        sgemm(function, TRANS if transposed else NO_TRANS, row1 - row0, col1 - col0, k,
              a_first, k, b_first, ldb, c_first, n)


# ----- the jobs: each fills the record, then _work runs it ---------------------------------
@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(3), array(1), array(4),
                              *[INT] * 7, FLOAT, FLOAT))
def _depthwise_job(record, reals, x, weight, bias, y, stride_h, stride_w, dil_h, dil_w,
                   top, left, code, a, b):
    """The job of depthwise._depthwise (units: output planes)."""
    _depthwise_record(record, reals, DEPTHWISE, x, bias, y, y.shape[0] * y.shape[1], stride_h,
                      stride_w, dil_h, dil_w, top, left, code, a, b)
    _put(record, ARRAYS[1], weight)


@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(4), array(1), array(4),
                              *[INT] * 7, FLOAT, FLOAT))
def _depthwise_blocks_job(record, reals, x, blocks, bias, y, stride_h, stride_w, dil_h,
                          dil_w, top, left, code, a, b):
    """The job of depthwise._depthwise_channels_last (units: blocks of channels of each
    image)."""
    _depthwise_record(record, reals, DEPTHWISE_BLOCKS, x, bias, y,
                      x.shape[0] * blocks.shape[0], stride_h, stride_w, dil_h, dil_w, top,
                      left, code, a, b)
    _put(record, ARRAYS[1], blocks)


@kernel(inline="always")
def _depthwise_record(record, reals, kind, x, bias, y, units, stride_h, stride_w, dil_h, dil_w,
                      top, left, code, a, b):
    record[KIND], record[UNITS] = kind, units
    _put(record, ARRAYS[0], x)
    _put(record, ARRAYS[2], bias)
    _put(record, ARRAYS[3], y)
    i = INTS
    record[i], record[i + 1], record[i + 2], record[i + 3] = stride_h, stride_w, dil_h, dil_w
    record[i + 4], record[i + 5], record[i + 6] = top, left, code
    reals[0], reals[1] = a, b


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(1), array(3), INT, FLOAT,
                              FLOAT))
def _epilogue_job(record, reals, y, bias, residual, code, a, b):
    """The job of epilogue._bias_residual_activation (units: rows (n, c))."""
    record[KIND], record[UNITS] = EPILOGUE, y.shape[0] * y.shape[1]
    _put(record, ARRAYS[0], y)
    _put(record, ARRAYS[1], bias)
    _put(record, ARRAYS[2], residual)
    record[INTS] = code
    reals[0], reals[1] = a, b


@kernel(nogil=True, exported=(RECORD, REALS, INT, INT, array(3), array(3), array(3), INT, INT,
                              INT))
def _gemm_job(record, reals, function, gemv, a, b, c, cut, parts, transposed):
    """The job c[t] = a[t or 0] @ b[t] for every t (b[t].T if ``transposed``): units are the
    products, or ``parts`` bands of each (``cut``) when there are few. ``function``:
    cblas_sgemm's address; ``gemv``: cblas_sgemv's for products of one row or one column,
    else 0."""
    products, m, n = c.shape
    record[KIND], record[UNITS] = GEMM, products * parts
    _put(record, ARRAYS[0], a)
    _put(record, ARRAYS[1], b)
    _put(record, ARRAYS[2], c)
    i = INTS
    record[i], record[i + 1], record[i + 2], record[i + 3] = function, m, n, a.shape[2]
    record[i + 4] = m * a.shape[2] if a.shape[0] > 1 else 0
    record[i + 5], record[i + 6] = b.shape[1] * b.shape[2], m * n
    record[i + 7], record[i + 8], record[i + 9], record[i + 10] = cut, parts, transposed, gemv


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(3), array(2), INT, FLOAT, FLOAT))
def _pointwise_job(record, reals, weight, x, bias, residual, y, space, code, a, b):
    """The job of pointwise._pointwise (units: blocks of channels by pixels; ``space``: a
    row of work space per chunk)."""
    _pointwise_record(record, reals, POINTWISE,
                      pointwise.block_count(x.shape[1], weight.shape[1], x.shape[0], x.shape[2]),
                      weight, x, bias, residual, y, space, code, a, b)


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(3), array(2), INT, FLOAT, FLOAT))
def _pointwise_transposed_job(record, reals, panels, x, bias, residual, y, space, code, a, b):
    """The job of pointwise_transposed._pointwise_transposed (units: bands of pixels by
    panels of channels; ``space``: a row of work space per chunk)."""
    _pointwise_record(record, reals, POINTWISE_TRANSPOSED,
                      pointwise_transposed.unit_count(x.shape[0], panels.shape[0], x.shape[2]),
                      panels, x, bias, residual, y, space, code, a, b)


@kernel(inline="always")
def _pointwise_record(record, reals, kind, units, weight, x, bias, residual, y, space, code, a,
                      b):
    record[KIND], record[UNITS] = kind, units
    _put(record, ARRAYS[0], weight)
    _put(record, ARRAYS[1], x)
    _put(record, ARRAYS[2], bias)
    _put(record, ARRAYS[3], residual)
    _put(record, ARRAYS[4], y)
    _put(record, ARRAYS[5], space)
    record[INTS] = code
    reals[0], reals[1] = a, b


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(2), *[INT] * 10))
def _im2col_job(record, reals, x, cols, kh, kw, stride_h, stride_w, dil_h, dil_w, top,
                left, out_h, out_w):
    """The job of gemm._im2col (units: input channels)."""
    record[KIND], record[UNITS] = IM2COL, x.shape[0]
    _put(record, ARRAYS[0], x)
    _put(record, ARRAYS[1], cols)
    i = INTS
    record[i], record[i + 1], record[i + 2], record[i + 3] = kh, kw, stride_h, stride_w
    record[i + 4], record[i + 5], record[i + 6], record[i + 7] = dil_h, dil_w, top, left
    record[i + 8], record[i + 9] = out_h, out_w


@kernel(nogil=True, exported=(RECORD, REALS, INT, array(4), array(3), *[INT] * 4))
def _winograd_input_job(record, reals, kind, x, v, top, left, tiles_h, tiles_w):
    """The job of a Winograd input transform (``kind``: WINOGRAD_IN or WINOGRAD_F2_IN;
    units: input planes)."""
    record[KIND], record[UNITS] = kind, x.shape[0] * x.shape[1]
    _put(record, ARRAYS[0], x)
    _put(record, ARRAYS[1], v)
    i = INTS
    record[i], record[i + 1], record[i + 2], record[i + 3] = top, left, tiles_h, tiles_w


@kernel(nogil=True, exported=(RECORD, REALS, INT, array(3), array(4), array(1),
                              array(4), *[INT] * 3, FLOAT, FLOAT))
def _winograd_output_job(record, reals, kind, m, y, bias, residual, tiles_h, tiles_w,
                         code, a, b):
    """The job of a Winograd output transform (``kind``: WINOGRAD_OUT or WINOGRAD_F2_OUT;
    units: output planes)."""
    record[KIND], record[UNITS] = kind, y.shape[0] * y.shape[1]
    _put(record, ARRAYS[0], m)
    _put(record, ARRAYS[1], y)
    _put(record, ARRAYS[2], bias)
    _put(record, ARRAYS[3], residual)
    i = INTS
    record[i], record[i + 1], record[i + 2] = tiles_h, tiles_w, code
    reals[0], reals[1] = a, b
