"""One kernel call shared between the calling thread and helper threads, without locks.

A job is a kernel call whose work is a list of ``units`` (output planes, blocks of channels,
products of a stack), cut into ``chunks`` ranges of consecutive units. The chunks are dealt
out as one run of consecutive chunks per thread of the team, in the same order every job:
the calling thread (slot 0) the first run, helper 1 the next, ... Each thread takes the
chunks of its own run in order, then the chunks nobody has taken yet from the other runs, so
a thread that runs late takes fewer. Dealt so, a thread finds in its own cache much of what
it wrote the job before, rather than what another core wrote, which is slower to read. The
calling thread publishes the job, takes chunks like the helpers, and returns once every
chunk is done. What the threads share lives in three small arrays, read and written with
atomics (layers/fast/atomics.py)::

    control (int64)  TICKET = job << 40 | chunks << 20;  DONE: chunks of this job finished;
                     STOP: 1 when the helpers return;  RUNS: how many runs (the team's threads);
                     FAILED: 1 if a chunk of this job raised (workers.Team raises then)
                     NEXT + 8 r: the ticket | next chunk to take of run r
    record  (int64)  RUN: the address of the kind's units function; UNITS; then the kind's
                     fields: arrays (address and shape, at the slots ARRAYS[field]) and
                     integers (at their own slots)
    reals (float64)  ACT_A, ACT_B: the activation's two parameters

A thread takes chunk ``next`` of run r by a compare-and-swap of NEXT + 8 r to ``next + 1``,
which fails if another thread took it first or the counter now belongs to another job. Job
numbers wrap round, so a counter carries the whole ticket: a thread that read an old ticket
and slept through 2^23 jobs finds no counter it expects, even where the job number matches.
The record is written before the job is published and not touched until every chunk is
done, so a thread that holds a chunk reads its job's arguments.

Each kind of job declares its fields once, by name (``array_fields``, ``int_fields``: plain
module-level ints, which numba reads as constants). A compiled writer (``_depthwise_job``
...) fills the record by those names and puts in RUN the address of the kind's units
function (``_depthwise_units`` ...: the same signature for every kind), which reads them
back and calls the kind's range kernel on units first .. last - 1. ``_work`` runs the job
(it is also the helpers' loop), calling the units function through its address
(atomics.run_units), so that it links in no kernel: a new kind of job is a writer and a
units function, and compiling ``_work`` does not grow with the kernels. Python calls a
writer and then ``_work`` through ``workers.Team._share``.
"""

from __future__ import annotations

import numpy as np

# the kernel modules, below this one (none imports it, nor workers.py): their range kernels
from layers.fast import (dense, depthwise, direct, epilogue, excitation, gemm, pointwise,
                         pointwise_transposed, pool, softmax, upsample, winograd, winograd_f2)
from layers.fast.phases import GEOMETRY
from layers.fast.atomics import (NO_TRANS, TRANS, add, compare_swap, float_array, load, pause,
                                 run_units, sgemm, sgemv, store, units_address)
from layers.fast.kernel import FLOAT, INT, array, kernel

TICKET, DONE, STOP, RUNS, FAILED = 0, 8, 16, 17, 24   # control's slots, 64 bytes apart (a
                                                      # cache line each; RUNS beside STOP)
NEXT = 32                            # NEXT + 8 r: run r's counter, 64 bytes apart too
FIELD = 1 << 20                      # chunks and next chunk: 20 bits each

RUN, UNITS = 0, 1                    # record's slots
ARRAYS = np.array((2, 7, 12, 17, 22, 27))   # array field i: address at ARRAYS[i], then up to
                                            # four sizes (an array, so that a slot read from
                                            # it is a run-time int: see below)
INTS = 32                            # integer fields from this slot on
RECORD_SIZE = 64
ACT_A, ACT_B = 0, 1                  # reals' slots: the activation's parameters (every kind)
REALS_SIZE = 4


def control_size(threads: int) -> int:
    """The length of a team's control array: a counter for each thread's run."""
    return NEXT + 8 * threads


def array_fields(count: int) -> tuple[int, ...]:
    """The indices into ARRAYS of a kind's ``count`` array fields."""
    if count > len(ARRAYS):
        raise ValueError(f"a job has at most {len(ARRAYS)} arrays, not {count}")
    return tuple(range(count))


def int_fields(count: int) -> tuple[int, ...]:
    """The record slots of a kind's ``count`` integer fields."""
    if INTS + count > RECORD_SIZE:
        raise ValueError(f"a job has at most {RECORD_SIZE - INTS} integers, not {count}")
    return tuple(range(INTS, INTS + count))


# ----- the kinds of job and their fields (each kind: its units function, its range kernel) -
# depthwise (_depthwise_units, _depthwise_blocks_units): depthwise.depthwise_planes / _blocks
DW_X, DW_WEIGHT, DW_BIAS, DW_Y = array_fields(4)
DW_STRIDE_H, DW_STRIDE_W, DW_DIL_H, DW_DIL_W, DW_TOP, DW_LEFT, DW_CODE = int_fields(7)

# epilogue (_epilogue_units): epilogue.finish_rows
EP_Y, EP_BIAS, EP_RESIDUAL = array_fields(3)
EP_CODE, = int_fields(1)

# gemm (_gemm_units): a stack of products C[t] = A[t] @ B[t] by BLAS, cut as GEMM_CUT says
GEMM_A, GEMM_B, GEMM_C = array_fields(3)
(GEMM_FUNCTION, GEMM_M, GEMM_N, GEMM_K, GEMM_STRIDE_A, GEMM_STRIDE_B, GEMM_STRIDE_C, GEMM_CUT,
 GEMM_PARTS, GEMM_TRANSPOSED, GEMM_GEMV) = int_fields(11)
BY_PRODUCT, BY_ROWS, BY_COLUMNS = 0, 1, 2        # GEMM_CUT: how a product's units are cut
ALIGN = 16                                       # row and column cuts: multiples of this

# pointwise (_pointwise_units, _pointwise_transposed_units, _direct_units):
# pointwise.pointwise_blocks / pointwise_transposed.transposed_units / direct.direct_units;
# dense (_dense_units): dense.dense_units (no residual; a work space of no rows where the
# weight is panels)
PW_WEIGHT, PW_X, PW_BIAS, PW_RESIDUAL, PW_Y, PW_SPACE = array_fields(6)
PW_CODE, PW_BAND, PW_GEOMETRY_SIZE, PW_GEOMETRY, *_ = int_fields(3 + GEOMETRY)   # then
                                # the geometry's values (pointwise.cols_band, direct's);
                                # PW_BAND: the transposed product's band
                                # (pointwise_transposed.band_pixels, direct.direct_band)

# im2col (_im2col_units): gemm.im2col_channels
IC_X, IC_COLS = array_fields(2)
(IC_KH, IC_KW, IC_STRIDE_H, IC_STRIDE_W, IC_DIL_H, IC_DIL_W, IC_TOP, IC_LEFT, IC_OUT_H,
 IC_OUT_W) = int_fields(10)

# split planes (_split_planes_units): gemm.split_planes
SP_X, SP_PHASES = array_fields(2)
SP_GEOMETRY, *_ = int_fields(GEOMETRY)                  # the geometry's values, in order

# Winograd input (_winograd_input_units, _winograd_f2_input_units): winograd.input_planes /
# winograd_f2.input_planes_f2
WI_X, WI_V = array_fields(2)
WI_TOP, WI_LEFT, WI_TILES_H, WI_TILES_W, WI_ROW0 = int_fields(5)

# Winograd output (_winograd_output_units, _winograd_f2_output_units): winograd.output_planes
# / winograd_f2.output_planes_f2
WO_M, WO_Y, WO_BIAS, WO_RESIDUAL = array_fields(4)
WO_TILES_H, WO_TILES_W, WO_ROW0, WO_CODE = int_fields(4)

# Winograd by strips (_winograd_strips_units): _winograd_strip, all three steps on a strip
# of rows of tiles of one image per unit (WS_STRIPS strips an image, 1: whole images)
WS_X, WS_PACKED, WS_BIAS, WS_RESIDUAL, WS_Y, WS_WORK = array_fields(6)
WS_F2, WS_SPACE, WS_TOP, WS_LEFT, WS_TILES_H, WS_TILES_W, WS_CODE, WS_STRIPS = int_fields(8)

# softmax (_softmax_units): softmax.softmax_rows
SM_X, = array_fields(1)

# max pool (_max_pool_units): pool.max_pool_planes
MP_X, MP_Y = array_fields(2)
MP_KH, MP_KW, MP_STRIDE_H, MP_STRIDE_W, MP_DIL_H, MP_DIL_W, MP_TOP, MP_LEFT = int_fields(8)

# squeeze, scale (_squeeze_units, _scale_units): excitation.squeeze_planes / scale_planes
SE_X, SE_GATES, SE_Y, SE_RESIDUAL = array_fields(4)    # squeeze writes the means in SE_GATES
SE_KEEP, = int_fields(1)

# upsample (_upsample_units): upsample.upsample_planes
UP_X, UP_Y = array_fields(2)
UP_KH, UP_KW = int_fields(2)

CONTROL, RECORD, REALS = array(1, "i8"), array(1, "i8"), array(1, "f8")


# ----- the protocol ------------------------------------------------------------------------
@kernel(nogil=True, exported=(CONTROL, RECORD, REALS, INT, INT, INT))
def _work(control, record, reals, chunks, idle_polls, slot):
    """The one compiled entry that runs jobs. ``chunks`` > 0: publish the job in ``record``
    as that many chunks, take chunks with the helpers, and return when all are done. Else a
    helper's loop: take chunks of whatever job is published; return after ``idle_polls``
    polls without work, or when STOP is set. ``slot``: this thread's place in the team (0
    for the calling thread, 1, 2, ... for the helpers), its row of a job's work space.

    A chunk runs the job's units function, called through its address in the record; one
    that raises sets FAILED (its exception cannot cross threads), which the caller reads."""
    if chunks > 0:
        chunks = max(1, min(chunks, record[UNITS], FIELD - 1))
        job = (load(control, TICKET) // (FIELD * FIELD) + 1) % (1 << 23)
        store(control, DONE, 0)
        store(control, FAILED, 0)
        ticket = (job * FIELD + chunks) * FIELD
        runs = max(control[RUNS], 1)
        for run in range(runs):                       # each run's first chunk
            store(control, NEXT + 8 * run, ticket + _run_start(run, chunks, runs))
        store(control, TICKET, ticket)
    idle = 0
    while True:
        if _take_one(control, record, reals, slot):
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
def _take_one(control, record, reals, slot):
    """Take and run the next chunk of the current job on thread ``slot``: of its own run,
    else of the next run that has one left; False if none is left."""
    ticket = load(control, TICKET)
    chunks = (ticket // FIELD) % FIELD
    runs = max(control[RUNS], 1)
    for step in range(runs):
        run = (slot + step) % runs
        end = _run_start(run + 1, chunks, runs)       # the run's chunks end here
        while True:
            counter = load(control, NEXT + 8 * run)
            taken = counter % FIELD
            if counter - taken != ticket or taken >= end:
                break                                 # another job's now, or none left
            if compare_swap(control, NEXT + 8 * run, counter, counter + 1) == counter:
                units = record[UNITS]
                if not run_units(record[RUN], record, reals, slot, units * taken // chunks,
                                 units * (taken + 1) // chunks):
                    store(control, FAILED, 1)         # it raised (an allocation failed, say)
                add(control, DONE, 1)
                return True
    return False


@kernel(inline="always")
def _run_start(run, chunks, runs):
    """The first chunk of run ``run`` of ``runs`` (run ``runs``: ``chunks``, the end of the
    last). Runs differ by one chunk at most, the longer ones first, so that with fewer
    chunks than threads the calling thread (run 0), never late, has one."""
    return (run * chunks + runs - 1) // runs


# ----- arrays in the record ----------------------------------------------------------------
@kernel(nogil=True)
def _put(record, slot, values):
    """An array's address and shape into record[slot:]."""
    record[slot] = values.ctypes.data
    for d in range(values.ndim):
        record[slot + 1 + d] = values.shape[d]


@kernel(inline="always")
def _put_ints(record, slot, values):
    """Integers into record[slot:], in order."""
    for k in range(values.shape[0]):
        record[slot + k] = values[k]


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
# One units function per kind of job, all of (record, reals, slot, first, last): it reads its
# job's fields back from ``record`` and runs units first .. last - 1 on thread ``slot`` (a
# job that needs work space has a row of it per thread of the team). _work calls it through
# its address, so it returns nothing; an exception it raises is lost (run_units says only
# that it raised, and the job then fails as a whole: workers.Team._share). numba compiles a
# function again for each literal argument, so the range kernels are called with run-time
# ints only: array slots are read from ARRAYS (an array's items), integer fields from the
# record, and the exported kernels call them with np.int64(0) as their start (not 0), all to
# share one compiled version.
@kernel(nogil=True)
def _depthwise_units(record, reals, slot, first, last):
    a = ARRAYS
    depthwise.depthwise_planes(
        _get4(record, a[DW_X]), _get3(record, a[DW_WEIGHT]), _get1(record, a[DW_BIAS]),
        _get4(record, a[DW_Y]), record[DW_STRIDE_H], record[DW_STRIDE_W], record[DW_DIL_H],
        record[DW_DIL_W], record[DW_TOP], record[DW_LEFT], record[DW_CODE], reals[ACT_A],
        reals[ACT_B], first, last)


@kernel(nogil=True)
def _depthwise_blocks_units(record, reals, slot, first, last):
    a = ARRAYS
    depthwise.depthwise_blocks(
        _get4(record, a[DW_X]), _get4(record, a[DW_WEIGHT]), _get1(record, a[DW_BIAS]),
        _get4(record, a[DW_Y]), record[DW_STRIDE_H], record[DW_STRIDE_W], record[DW_DIL_H],
        record[DW_DIL_W], record[DW_TOP], record[DW_LEFT], record[DW_CODE], reals[ACT_A],
        reals[ACT_B], first, last)


@kernel(nogil=True)
def _epilogue_units(record, reals, slot, first, last):
    a = ARRAYS
    epilogue.finish_rows(_get3(record, a[EP_Y]), _get1(record, a[EP_BIAS]),
                         _get3(record, a[EP_RESIDUAL]), record[EP_CODE], reals[ACT_A],
                         reals[ACT_B], first, last)


@kernel(nogil=True)
def _gemm_units(record, reals, slot, first, last):
    for unit in range(first, last):
        _gemm_unit(record, unit)


@kernel(nogil=True)
def _pointwise_units(record, reals, slot, first, last):
    a = ARRAYS
    geometry = record[PW_GEOMETRY:PW_GEOMETRY + record[PW_GEOMETRY_SIZE]]
    pointwise.pointwise_blocks(
        _get3(record, a[PW_WEIGHT]), _get3(record, a[PW_X]), _get1(record, a[PW_BIAS]),
        _get3(record, a[PW_RESIDUAL]), _get3(record, a[PW_Y]),
        _get2(record, a[PW_SPACE])[slot], geometry, record[PW_CODE], reals[ACT_A],
        reals[ACT_B], first, last)


@kernel(nogil=True)
def _pointwise_transposed_units(record, reals, slot, first, last):
    a = ARRAYS
    pointwise_transposed.transposed_units(
        _get3(record, a[PW_WEIGHT]), _get3(record, a[PW_X]), _get1(record, a[PW_BIAS]),
        _get3(record, a[PW_RESIDUAL]), _get3(record, a[PW_Y]),
        _get2(record, a[PW_SPACE])[slot], record[PW_CODE], reals[ACT_A], reals[ACT_B],
        record[PW_BAND], first, last)


@kernel(nogil=True)
def _direct_units(record, reals, slot, first, last):
    a = ARRAYS
    geometry = record[PW_GEOMETRY:PW_GEOMETRY + record[PW_GEOMETRY_SIZE]]
    direct.direct_units(
        _get3(record, a[PW_WEIGHT]), _get3(record, a[PW_X]), _get1(record, a[PW_BIAS]),
        _get3(record, a[PW_RESIDUAL]), _get3(record, a[PW_Y]),
        _get2(record, a[PW_SPACE])[slot], geometry, record[PW_CODE], reals[ACT_A],
        reals[ACT_B], record[PW_BAND], first, last)


@kernel(nogil=True)
def _dense_units(record, reals, slot, first, last):
    a = ARRAYS
    space = _get2(record, a[PW_SPACE])
    row = space[slot] if space.shape[0] > 0 else space.reshape(space.size)
    dense.dense_units(_get3(record, a[PW_WEIGHT]), _get3(record, a[PW_X]),
                      _get1(record, a[PW_BIAS]), _get3(record, a[PW_Y]), row,
                      record[PW_CODE], reals[ACT_A], reals[ACT_B], first, last)


@kernel(nogil=True)
def _im2col_units(record, reals, slot, first, last):
    a = ARRAYS
    gemm.im2col_channels(_get3(record, a[IC_X]), _get2(record, a[IC_COLS]), record[IC_KH],
                         record[IC_KW], record[IC_STRIDE_H], record[IC_STRIDE_W],
                         record[IC_DIL_H], record[IC_DIL_W], record[IC_TOP],
                         record[IC_LEFT], record[IC_OUT_H], record[IC_OUT_W], first, last)


@kernel(nogil=True)
def _split_planes_units(record, reals, slot, first, last):
    a = ARRAYS
    gemm.split_planes(_get3(record, a[SP_X]), _get3(record, a[SP_PHASES]),
                      record[SP_GEOMETRY:SP_GEOMETRY + GEOMETRY], first, last)


@kernel(nogil=True)
def _winograd_input_units(record, reals, slot, first, last):
    a = ARRAYS
    winograd.input_planes(_get4(record, a[WI_X]), _get3(record, a[WI_V]), record[WI_TOP],
                          record[WI_LEFT], record[WI_TILES_H], record[WI_TILES_W],
                          record[WI_ROW0], first, last)


@kernel(nogil=True)
def _winograd_f2_input_units(record, reals, slot, first, last):
    a = ARRAYS
    winograd_f2.input_planes_f2(_get4(record, a[WI_X]), _get3(record, a[WI_V]),
                                record[WI_TOP], record[WI_LEFT], record[WI_TILES_H],
                                record[WI_TILES_W], record[WI_ROW0], first, last)


@kernel(nogil=True)
def _winograd_output_units(record, reals, slot, first, last):
    a = ARRAYS
    winograd.output_planes(_get3(record, a[WO_M]), _get4(record, a[WO_Y]),
                           _get1(record, a[WO_BIAS]), _get4(record, a[WO_RESIDUAL]),
                           record[WO_TILES_H], record[WO_TILES_W], record[WO_ROW0],
                           record[WO_CODE], reals[ACT_A], reals[ACT_B], first, last)


@kernel(nogil=True)
def _winograd_f2_output_units(record, reals, slot, first, last):
    a = ARRAYS
    winograd_f2.output_planes_f2(_get3(record, a[WO_M]), _get4(record, a[WO_Y]),
                                 _get1(record, a[WO_BIAS]), _get4(record, a[WO_RESIDUAL]),
                                 record[WO_TILES_H], record[WO_TILES_W], record[WO_ROW0],
                                 record[WO_CODE], reals[ACT_A], reals[ACT_B], first, last)


@kernel(nogil=True)
def _winograd_strips_units(record, reals, slot, first, last):
    a = ARRAYS
    x, packed, y = _get4(record, a[WS_X]), _get3(record, a[WS_PACKED]), _get4(record, a[WS_Y])
    bias, residual = _get1(record, a[WS_BIAS]), _get4(record, a[WS_RESIDUAL])
    work = _get2(record, a[WS_WORK])[slot]
    strips, tiles_h = record[WS_STRIPS], record[WS_TILES_H]
    for unit in range(first, last):
        image, strip = unit // strips, unit % strips
        _winograd_strip(record[WS_F2] != 0, x, packed, bias, residual, y, work,
                        record[WS_SPACE], image, strip * tiles_h // strips,
                        (strip + 1) * tiles_h // strips, record[WS_TOP], record[WS_LEFT],
                        record[WS_TILES_W], record[WS_CODE], reals[ACT_A], reals[ACT_B])


@kernel(nogil=True)
def _winograd_strip(f2, x, packed, bias, residual, y, work, space_floats, image, ty0, ty1,
                    pad_top, left, tiles_w, code, act_a, act_b):
    """Rows of tiles ty0 .. ty1 - 1 of one image of a Winograd convolution on one thread, in
    its own row of work space (winograd.strip_buffers): the input transform (F(2x2)'s if
    ``f2``, else F(4x4)'s), the stack of products, the output transform; the same sums as
    run_winograd's steps, for a strip as for a chunk of its."""
    products, c_out, c_in = packed.shape
    tile, strip = 2 if f2 else 4, ty1 - ty0
    v, m, space = winograd.strip_buffers(work, space_floats, products, c_in, c_out,
                                         strip * tiles_w)
    first_row = tile * ty0 - pad_top                  # x's row of the strip's first input
    top, row0 = max(-first_row, 0), max(first_row, 0)
    x1, y1 = x[image:image + 1], y[image:image + 1]
    r1 = residual[image:image + 1] if residual.shape[0] > 0 else residual
    if f2:
        winograd_f2.input_planes_f2(x1, v, top, left, strip, tiles_w, row0, 0, c_in)
    else:
        winograd.input_planes(x1, v, top, left, strip, tiles_w, row0, 0, c_in)
    pointwise.forget_band(space)                      # v holds another strip now
    pointwise.pointwise_blocks(
        packed, v, np.zeros(c_out, np.float32), np.zeros((0, 0, 0), np.float32), m, space,
        np.zeros(0, np.int64), epilogue.NONE, np.float32(0.0), np.float32(0.0), 0,
        pointwise.block_count(c_in, c_out, products, strip * tiles_w, False, True))
    if f2:
        winograd_f2.output_planes_f2(m, y1, bias, r1, strip, tiles_w, tile * ty0, code, act_a,
                                     act_b, 0, c_out)
    else:
        winograd.output_planes(m, y1, bias, r1, strip, tiles_w, tile * ty0, code, act_a, act_b,
                               0, c_out)


@kernel(nogil=True)
def _softmax_units(record, reals, slot, first, last):
    softmax.softmax_rows(_get2(record, ARRAYS[SM_X]), first, last)


@kernel(nogil=True)
def _upsample_units(record, reals, slot, first, last):
    a = ARRAYS
    upsample.upsample_planes(_get4(record, a[UP_X]), _get4(record, a[UP_Y]), record[UP_KH],
                             record[UP_KW], first, last)


@kernel(nogil=True)
def _squeeze_units(record, reals, slot, first, last):
    a = ARRAYS
    excitation.squeeze_planes(_get3(record, a[SE_X]), _get2(record, a[SE_GATES]), first, last)


@kernel(nogil=True)
def _scale_units(record, reals, slot, first, last):
    a = ARRAYS
    excitation.scale_planes(_get3(record, a[SE_X]), _get2(record, a[SE_GATES]),
                            _get3(record, a[SE_Y]), record[SE_KEEP],
                            _get3(record, a[SE_RESIDUAL]), first, last)


@kernel(nogil=True)
def _max_pool_units(record, reals, slot, first, last):
    a = ARRAYS
    pool.max_pool_planes(_get4(record, a[MP_X]), _get4(record, a[MP_Y]), record[MP_KH],
                         record[MP_KW], record[MP_STRIDE_H], record[MP_STRIDE_W],
                         record[MP_DIL_H], record[MP_DIL_W], record[MP_TOP], record[MP_LEFT],
                         first, last)


@kernel(nogil=True)
def _cut(size, part, parts):
    """Where part ``part`` of ``parts`` starts along ``size`` (a multiple of ALIGN)."""
    if part >= parts:
        return size
    return size * part // parts // ALIGN * ALIGN


@kernel(inline="always")
def _gemm_unit(record, unit):
    """One unit of a stack of products C[t] = A[t] @ B[t] (A (M, K), B (K, N) or, transposed,
    (N, K), C (M, N), C-contiguous, t-th at t * stride floats; a stride of 0 reuses one
    matrix): the whole product t, or a band of its rows or columns. With a GEMV pointer
    (products of one row, M = 1, or one column, N = 1) each band is a matrix-vector product,
    as numpy computes those (the same kernel, so the same rounding)."""
    function, m, n, k = record[GEMM_FUNCTION], record[GEMM_M], record[GEMM_N], record[GEMM_K]
    stride_a, stride_b = record[GEMM_STRIDE_A], record[GEMM_STRIDE_B]
    stride_c, cut, parts = record[GEMM_STRIDE_C], record[GEMM_CUT], record[GEMM_PARTS]
    transposed, gemv = record[GEMM_TRANSPOSED], record[GEMM_GEMV]
    t, part = unit // parts, unit % parts
    row0, row1, col0, col1 = 0, m, 0, n
    if cut == BY_ROWS:
        row0, row1 = _cut(m, part, parts), _cut(m, part + 1, parts)
    elif cut == BY_COLUMNS:
        col0, col1 = _cut(n, part, parts), _cut(n, part + 1, parts)
    if row1 <= row0 or col1 <= col0:
        return
    a, b = record[ARRAYS[GEMM_A]], record[ARRAYS[GEMM_B]]
    c = record[ARRAYS[GEMM_C]]
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


# ----- the writers: each fills the record with one job, by its fields' names --------------
@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(3), array(1), array(4),
                              *[INT] * 7, FLOAT, FLOAT))
def _depthwise_job(record, reals, x, weight, bias, y, stride_h, stride_w, dil_h, dil_w,
                   top, left, code, act_a, act_b):
    """Depthwise, as depthwise._depthwise (units: output planes)."""
    _depthwise_record(record, reals, units_address(_depthwise_units), x, bias, y,
                      y.shape[0] * y.shape[1], stride_h, stride_w, dil_h, dil_w, top, left,
                      code, act_a, act_b)
    _put(record, ARRAYS[DW_WEIGHT], weight)


@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(4), array(1), array(4),
                              *[INT] * 7, FLOAT, FLOAT))
def _depthwise_blocks_job(record, reals, x, blocks, bias, y, stride_h, stride_w, dil_h,
                          dil_w, top, left, code, act_a, act_b):
    """Depthwise on blocks of channels, as depthwise._depthwise_channels_last (units: blocks
    of channels of each image)."""
    _depthwise_record(record, reals, units_address(_depthwise_blocks_units), x, bias, y,
                      x.shape[0] * blocks.shape[0], stride_h, stride_w, dil_h, dil_w, top,
                      left, code, act_a, act_b)
    _put(record, ARRAYS[DW_WEIGHT], blocks)


@kernel(inline="always")
def _depthwise_record(record, reals, run, x, bias, y, units, stride_h, stride_w, dil_h, dil_w,
                      top, left, code, act_a, act_b):
    record[RUN], record[UNITS] = run, units
    _put(record, ARRAYS[DW_X], x)
    _put(record, ARRAYS[DW_BIAS], bias)
    _put(record, ARRAYS[DW_Y], y)
    record[DW_STRIDE_H], record[DW_STRIDE_W] = stride_h, stride_w
    record[DW_DIL_H], record[DW_DIL_W] = dil_h, dil_w
    record[DW_TOP], record[DW_LEFT], record[DW_CODE] = top, left, code
    reals[ACT_A], reals[ACT_B] = act_a, act_b


@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(4), *[INT] * 8))
def _max_pool_job(record, reals, x, y, kh, kw, stride_h, stride_w, dil_h, dil_w, top, left):
    """Max pooling, as pool._max_pool2d (units: planes)."""
    record[RUN], record[UNITS] = units_address(_max_pool_units), x.shape[0] * x.shape[1]
    _put(record, ARRAYS[MP_X], x)
    _put(record, ARRAYS[MP_Y], y)
    record[MP_KH], record[MP_KW] = kh, kw
    record[MP_STRIDE_H], record[MP_STRIDE_W] = stride_h, stride_w
    record[MP_DIL_H], record[MP_DIL_W] = dil_h, dil_w
    record[MP_TOP], record[MP_LEFT] = top, left


@kernel(nogil=True, exported=(RECORD, REALS, array(2)))
def _softmax_job(record, reals, x):
    """Softmax, as softmax._softmax (units: rows)."""
    record[RUN], record[UNITS] = units_address(_softmax_units), x.shape[0]
    _put(record, ARRAYS[SM_X], x)


@kernel(nogil=True, exported=(RECORD, REALS, array(4), array(4), INT, INT))
def _upsample_job(record, reals, x, y, kh, kw):
    """Upsampling, as upsample._upsample_nearest (units: planes)."""
    record[RUN], record[UNITS] = units_address(_upsample_units), x.shape[0] * x.shape[1]
    _put(record, ARRAYS[UP_X], x)
    _put(record, ARRAYS[UP_Y], y)
    record[UP_KH], record[UP_KW] = kh, kw


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(2)))
def _squeeze_job(record, reals, x, means):
    """Squeeze (plane means), as excitation.squeeze_planes (units: planes (n, c))."""
    record[RUN], record[UNITS] = units_address(_squeeze_units), x.shape[0] * x.shape[1]
    _put(record, ARRAYS[SE_X], x)
    _put(record, ARRAYS[SE_GATES], means)


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(2), array(3), INT, array(3)))
def _scale_job(record, reals, x, gates, y, keep, residual):
    """Scale (by the gates), as excitation.scale_planes (units: planes (n, c))."""
    record[RUN], record[UNITS] = units_address(_scale_units), x.shape[0] * x.shape[1]
    _put(record, ARRAYS[SE_X], x)
    _put(record, ARRAYS[SE_GATES], gates)
    _put(record, ARRAYS[SE_Y], y)
    _put(record, ARRAYS[SE_RESIDUAL], residual)
    record[SE_KEEP] = keep


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(1), array(3), INT, FLOAT,
                              FLOAT))
def _epilogue_job(record, reals, y, bias, residual, code, act_a, act_b):
    """The epilogue, as epilogue._bias_residual_activation (units: rows (n, c))."""
    record[RUN], record[UNITS] = units_address(_epilogue_units), y.shape[0] * y.shape[1]
    _put(record, ARRAYS[EP_Y], y)
    _put(record, ARRAYS[EP_BIAS], bias)
    _put(record, ARRAYS[EP_RESIDUAL], residual)
    record[EP_CODE] = code
    reals[ACT_A], reals[ACT_B] = act_a, act_b


@kernel(nogil=True, exported=(RECORD, REALS, INT, INT, array(3), array(3), array(3), INT, INT,
                              INT))
def _gemm_job(record, reals, function, gemv, a, b, c, cut, parts, transposed):
    """BLAS products: c[t] = a[t or 0] @ b[t] for every t (b[t].T if ``transposed``): units are the
    products, or ``parts`` bands of each (``cut``) when there are few. ``function``:
    cblas_sgemm's address; ``gemv``: cblas_sgemv's for products of one row or one column,
    else 0."""
    products, m, n = c.shape
    k = a.shape[2]
    record[RUN], record[UNITS] = units_address(_gemm_units), products * parts
    _put(record, ARRAYS[GEMM_A], a)
    _put(record, ARRAYS[GEMM_B], b)
    _put(record, ARRAYS[GEMM_C], c)
    record[GEMM_FUNCTION], record[GEMM_M], record[GEMM_N], record[GEMM_K] = function, m, n, k
    record[GEMM_STRIDE_A] = m * k if a.shape[0] > 1 else 0
    record[GEMM_STRIDE_B], record[GEMM_STRIDE_C] = b.shape[1] * b.shape[2], m * n
    record[GEMM_CUT], record[GEMM_PARTS] = cut, parts
    record[GEMM_TRANSPOSED], record[GEMM_GEMV] = transposed, gemv


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(3), array(2), array(1, INT), INT, FLOAT, FLOAT))
def _pointwise_job(record, reals, weight, x, bias, residual, y, space, geometry, code, act_a,
                   act_b):
    """A 1x1 convolution, as pointwise._pointwise (units: blocks of channels by pixels; ``space``: a
    row of work space per thread of the team)."""
    _pointwise_record(record, reals, units_address(_pointwise_units),
                      pointwise.block_count(weight.shape[2], weight.shape[1], y.shape[0],
                                            y.shape[2], geometry.shape[0] > 0,
                                            weight.shape[0] > 1),
                      weight, x, bias, residual, y, space, code, act_a, act_b)
    record[PW_GEOMETRY_SIZE] = geometry.shape[0]
    _put_ints(record, PW_GEOMETRY, geometry)
    for row in range(space.shape[0]):                 # no thread holds a band of this x yet
        pointwise.forget_band(space[row])


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(3), array(2), INT, FLOAT, FLOAT, INT))
def _pointwise_transposed_job(record, reals, panels, x, bias, residual, y, space, code, act_a,
                              act_b, threads):
    """A 1x1 convolution turned around, as pointwise_transposed._pointwise_transposed (units:
    bands of pixels, band_pixels's for a team of ``threads``, by panels of channels;
    ``space``: a row of work space per thread of the team)."""
    band = pointwise_transposed.band_pixels(x.shape[0], x.shape[2], y.shape[1], threads)
    _pointwise_record(record, reals, units_address(_pointwise_transposed_units),
                      pointwise_transposed.unit_count(x.shape[0], panels.shape[0], x.shape[2],
                                                      band),
                      panels, x, bias, residual, y, space, code, act_a, act_b)
    record[PW_BAND] = band
    for row in range(space.shape[0]):                 # no thread holds a copy of this x yet
        pointwise.forget_band(space[row])


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(3), array(2), array(1, INT), INT, FLOAT, FLOAT, INT))
def _direct_job(record, reals, panels, x, bias, residual, y, space, geometry, code, act_a,
                act_b, threads):
    """A convolution without cols, as direct._direct (units: bands of output pixels,
    direct_band's for a team of ``threads``, by panels of channels; ``space``: a row of work
    space per thread of the team)."""
    band = direct.direct_band(geometry, x.shape[0], panels.shape[0], threads)
    _pointwise_record(record, reals, units_address(_direct_units),
                      direct.unit_count(geometry, x.shape[0], panels.shape[0], band),
                      panels, x, bias, residual, y, space, code, act_a, act_b)
    record[PW_BAND] = band
    record[PW_GEOMETRY_SIZE] = geometry.shape[0]
    _put_ints(record, PW_GEOMETRY, geometry)
    for row in range(space.shape[0]):                 # no thread holds a band of this x yet
        pointwise.forget_band(space[row])


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1), array(3),
                              array(2), INT, FLOAT, FLOAT))
def _dense_job(record, reals, weight, x, bias, y, space, code, act_a, act_b):
    """A dense layer, as dense._dense (``space`` of no rows: ``weight`` is panels) or _dense_rows
    (a row of ``space`` per thread of the team) (units: bands of rows by panels)."""
    _pointwise_record(record, reals, units_address(_dense_units),
                      dense.unit_count(x.shape[1], y.shape[2]), weight, x, bias, x[:0], y,
                      space, code, act_a, act_b)                     # x[:0]: no residual


@kernel(inline="always")
def _pointwise_record(record, reals, run, units, weight, x, bias, residual, y, space, code,
                      act_a, act_b):
    record[RUN], record[UNITS] = run, units
    _put(record, ARRAYS[PW_WEIGHT], weight)
    _put(record, ARRAYS[PW_X], x)
    _put(record, ARRAYS[PW_BIAS], bias)
    _put(record, ARRAYS[PW_RESIDUAL], residual)
    _put(record, ARRAYS[PW_Y], y)
    _put(record, ARRAYS[PW_SPACE], space)
    record[PW_CODE] = code
    reals[ACT_A], reals[ACT_B] = act_a, act_b


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(2), *[INT] * 10))
def _im2col_job(record, reals, x, cols, kh, kw, stride_h, stride_w, dil_h, dil_w, top,
                left, out_h, out_w):
    """im2col, as gemm._im2col (units: input channels)."""
    record[RUN], record[UNITS] = units_address(_im2col_units), x.shape[0]
    _put(record, ARRAYS[IC_X], x)
    _put(record, ARRAYS[IC_COLS], cols)
    record[IC_KH], record[IC_KW], record[IC_STRIDE_H], record[IC_STRIDE_W] = (
        kh, kw, stride_h, stride_w)
    record[IC_DIL_H], record[IC_DIL_W], record[IC_TOP], record[IC_LEFT] = (
        dil_h, dil_w, top, left)
    record[IC_OUT_H], record[IC_OUT_W] = out_h, out_w


@kernel(nogil=True, exported=(RECORD, REALS, array(3), array(3), array(1, INT)))
def _split_planes_job(record, reals, x, phases, geometry):
    """Stride phases, as gemm._split_planes (units: planes)."""
    record[RUN], record[UNITS] = units_address(_split_planes_units), x.shape[0] * x.shape[1]
    _put(record, ARRAYS[SP_X], x)
    _put(record, ARRAYS[SP_PHASES], phases)
    _put_ints(record, SP_GEOMETRY, geometry)


@kernel(nogil=True, exported=(RECORD, REALS, INT, array(4), array(3), *[INT] * 5))
def _winograd_input_job(record, reals, f2, x, v, top, left, tiles_h, tiles_w, row0):
    """A Winograd input transform, F(4x4)'s or (``f2`` not 0) F(2x2)'s (units: input
    planes)."""
    record[RUN] = (units_address(_winograd_f2_input_units) if f2
                   else units_address(_winograd_input_units))
    record[UNITS] = x.shape[0] * x.shape[1]
    _put(record, ARRAYS[WI_X], x)
    _put(record, ARRAYS[WI_V], v)
    record[WI_TOP], record[WI_LEFT] = top, left
    record[WI_TILES_H], record[WI_TILES_W], record[WI_ROW0] = tiles_h, tiles_w, row0


@kernel(nogil=True, exported=(RECORD, REALS, INT, array(4), array(3), array(1), array(4),
                              array(4), array(2), *[INT] * 7, FLOAT, FLOAT))
def _winograd_strips_job(record, reals, f2, x, packed, bias, residual, y, work, space_floats,
                         strips, top, left, tiles_h, tiles_w, code, act_a, act_b):
    """A whole Winograd convolution, F(4x4)'s or (``f2`` not 0) F(2x2)'s, its ``tiles_h``
    rows of tiles cut into ``strips`` strips an image (units: strips, each run by one
    thread alone: ``_winograd_strip``; ``work``: a row per thread of the team,
    winograd.strip_work_floats long, the product's ``space_floats`` first; ``top``: the
    convolution's top padding)."""
    record[RUN], record[UNITS] = units_address(_winograd_strips_units), x.shape[0] * strips
    _put(record, ARRAYS[WS_X], x)
    _put(record, ARRAYS[WS_PACKED], packed)
    _put(record, ARRAYS[WS_BIAS], bias)
    _put(record, ARRAYS[WS_RESIDUAL], residual)
    _put(record, ARRAYS[WS_Y], y)
    _put(record, ARRAYS[WS_WORK], work)
    record[WS_F2], record[WS_SPACE], record[WS_TOP], record[WS_LEFT] = (f2, space_floats,
                                                                        top, left)
    record[WS_TILES_H], record[WS_TILES_W], record[WS_CODE] = tiles_h, tiles_w, code
    record[WS_STRIPS] = max(strips, 1)
    reals[ACT_A], reals[ACT_B] = act_a, act_b


@kernel(nogil=True, exported=(RECORD, REALS, INT, array(3), array(4), array(1),
                              array(4), *[INT] * 4, FLOAT, FLOAT))
def _winograd_output_job(record, reals, f2, m, y, bias, residual, tiles_h, tiles_w, row0,
                         code, act_a, act_b):
    """A Winograd output transform, F(4x4)'s or (``f2`` not 0) F(2x2)'s (units: output
    planes)."""
    record[RUN] = (units_address(_winograd_f2_output_units) if f2
                   else units_address(_winograd_output_units))
    record[UNITS] = y.shape[0] * y.shape[1]
    _put(record, ARRAYS[WO_M], m)
    _put(record, ARRAYS[WO_Y], y)
    _put(record, ARRAYS[WO_BIAS], bias)
    _put(record, ARRAYS[WO_RESIDUAL], residual)
    record[WO_TILES_H], record[WO_TILES_W], record[WO_CODE] = tiles_h, tiles_w, code
    record[WO_ROW0] = row0
    reals[ACT_A], reals[ACT_B] = act_a, act_b
