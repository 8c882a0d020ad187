"""A block of a matrix product kept in vector registers, as numba intrinsics (LLVM IR).

The inner loop of a fast matrix product C = A @ B keeps a small block of C in the CPU's
vector registers for the whole sum over k, and per k only reads one row of B and a few
values of A::

    for k in range(K):                                          # ROWS x COLUMNS block of C
        tile[r, :] += A[m0 + r, k] * B[k, n0 : n0 + COLUMNS]    for every r < ROWS

ROWS = 6 rows of VECTORS = 2 vectors make 12 vector accumulators: each k is 2 vector loads of
B, 6 broadcasts of A and 12 fused multiply-adds, and C is written once, at the end. A vector
holds ``LANES`` floats: 16 with AVX-512 (32 registers), else 8 (AVX2's 16 registers hold the
12 accumulators, 2 rows of B and a broadcast), so a tile is 6 x 32 or 6 x 16; wider vectors
than the registers would spill the accumulators to memory on every k. numba's arrays live in
memory, so the block is a value of its own type, an LLVM array of 12 ``<LANES x float>``
vectors that the compiler keeps in registers, and these intrinsics work on it::

    tile = tile_zero()                                    # or tile_load(c, ...): carry on
    tile = tile_fma(tile, a, a_first, a_step, rows, b, b_first, count)
    tile = tile_fma_steps(tile, ..., count, a_k, b_k)     # STEPS k at once
    tile = tile_fma_narrow(...)                           # the same, first vector only
    tile = tile_fma_short(...)                            # the same, ROWS - 1 rows only
    dots = tile_dot_pair(dots, a, ..., b_step, count)     # k in the lanes: dot products
    tile = tile_fold_dots(tile, dots, lane)               # ... summed into a narrow tile
    tile = tile_add(tile, part)                           # a sum taken in parts
    tile_store(tile, c, c_first, c_step, rows, count, bias, bias_first, residual, lo, hi)

Edges: only ``count`` columns and ``rows`` rows are real. A whole vector of B or C is read or
written with a plain load or store, a part of one with a masked one (nothing past ``count``
is touched), and a vector with no real lane not at all (masking whole vectors too is slow for
some addresses). The rows past ``rows`` read A's last real row again and are not stored.
Each value of C is the same sum wherever its block starts (chains of fused multiply-adds
over the same ranges of k, added in the same order: pointwise.py), so a product cut
differently (over more threads) gives the same bits. LLVM lowers the vectors to what the
CPU has, since aot.py compiles for the host CPU (and its key includes LANES).

Single vectors serve the channels-last depthwise kernel (depthwise.py), where LANES channels
share one: ``vector_load``, ``vector_fma``, ``vector_store``, ``vector_copy_part`` (the
first lanes of a vector, masked), and ``transpose_block`` (a LANES x LANES block, between
planes and channels last; pointwise_transposed.py's epilogue and the vector copies of
pointwise.py use them too). ``prefetch`` asks for a cache line ahead of the loads that read
it (pointwise_transposed.py's weights). ``full_width`` has LLVM vectorise a function's plain
loops (the smooth activations, the depthwise taps, max pooling) with vectors of LANES floats,
not the 8 it prefers on some AVX-512 CPUs. A vector load that crosses a cache line costs about
twice one that does not: ``aligned_empty`` (in Python) and ``aligned_array`` (in a kernel)
give arrays that start on a vector's boundary.

This module declares intrinsics (kernel.py) and reads the CPU (cpu.py); it imports no other
module of layers.fast.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from layers.fast.cpu import cpu_description
from layers.fast.kernel import intrinsic, kernel
from parser.errors import InferError


def vector_lanes() -> int:
    """Floats per vector register of this CPU: 16 with AVX-512 (its flags, from Linux's
    /proc/cpuinfo, list avx512f), else 8. ``PNNX_INFER_LANES=8`` or ``16`` overrides it (to
    test the other width; any width computes the same values, only the speed differs, but
    for pointwise.py's dot products of a narrow tail: which pixels are one, and how k falls
    in the lanes, depend on the width)."""
    wanted = os.environ.get("PNNX_INFER_LANES", "").strip()
    if wanted:
        if wanted not in ("8", "16"):
            raise InferError(f"PNNX_INFER_LANES={wanted!r}: expected 8 or 16")
        return int(wanted)
    return 16 if "avx512f" in cpu_description().split() else 8


LANES = vector_lanes()              # floats in a vector
ROWS, VECTORS = 6, 2                # a tile: ROWS rows of VECTORS vectors
COLUMNS = VECTORS * LANES


@functools.cache
def _llvm_types():
    """(float vector, tile) LLVM types and the tile's numba type, made once, on first compile."""
    from llvmlite import ir
    from numba import types
    from numba.extending import models, register_model

    vector = ir.VectorType(ir.FloatType(), LANES)
    tile_llvm = ir.ArrayType(vector, ROWS * VECTORS)

    class Tile(types.Type):
        def __init__(self):
            super().__init__(name=f"Tile{ROWS}x{COLUMNS}")

    @register_model(Tile)
    class TileModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, tile_llvm)

    return vector, tile_llvm, Tile()


def _zeros():
    """(a vector of zeros, a tile of zeros) as LLVM constants."""
    from llvmlite import ir
    vector, tile_llvm, _ = _llvm_types()
    zeros = ir.Constant(vector, [0.0] * LANES)
    return zeros, ir.Constant(tile_llvm, [zeros] * (ROWS * VECTORS))


class _Emit:
    """Small pieces of LLVM IR the intrinsics share."""

    def __init__(self, context, builder, signature, args):
        from llvmlite import ir

        self.ir, self.builder, self.context = ir, builder, context
        self.signature, self.args = signature, args
        self.vector = _llvm_types()[0]
        self.i32, self.i64 = ir.IntType(32), ir.IntType(64)
        self.mask_type = ir.VectorType(ir.IntType(1), LANES)

    def int(self, index):
        """Argument ``index`` as int64."""
        from numba import types
        return self.context.cast(self.builder, self.args[index], self.signature.args[index],
                                 types.int64)

    def float(self, index):
        """Argument ``index`` as float32."""
        from numba import types
        return self.context.cast(self.builder, self.args[index], self.signature.args[index],
                                 types.float32)

    def pointer(self, index, offset):
        """&array[offset] for the float32 array that is argument ``index``."""
        ary = self.context.make_array(self.signature.args[index])(self.context, self.builder,
                                                                 self.args[index])
        return self.builder.gep(ary.data, [offset])

    def vector_at(self, index, first):
        """A vector pointer to array argument ``index`` at the offset in argument ``first``."""
        return self.builder.bitcast(self.pointer(index, self.int(first)),
                                    self.vector.as_pointer())

    def const(self, value):
        return self.ir.Constant(self.i64, value)

    def splat(self, value, element=None):
        """A vector of LANES copies of ``value`` (a float, or an ``element``-typed value)."""
        ir, b = self.ir, self.builder
        vector = self.vector if element is None else ir.VectorType(element, LANES)
        one = b.insert_element(ir.Constant(vector, None), value, ir.Constant(self.i32, 0))
        return b.shuffle_vector(one, one, ir.Constant(ir.VectorType(self.i32, LANES),
                                                      [0] * LANES))

    def mask(self, count):
        """Lanes 0 .. count - 1 on (count may be <= 0: none, or >= LANES: all)."""
        lanes = self.ir.Constant(self.ir.VectorType(self.i64, LANES), list(range(LANES)))
        return self.builder.icmp_signed("<", lanes, self.splat(count, self.i64))

    def _function(self, name, result, arguments):
        from numba.core import cgutils
        return cgutils.get_or_insert_function(
            self.builder.module, self.ir.FunctionType(result, arguments), name)

    def load(self, pointer, count):
        """The vector at ``pointer``: its first ``count`` lanes (the others 0; nothing past
        them is read): a plain load for a whole vector, a masked one for a part, none for no
        lanes (see the module docstring)."""
        ir, b, vector = self.ir, self.builder, self.vector
        f = self._function(f"llvm.masked.load.v{LANES}f32.p0v{LANES}f32", vector,
                           [vector.as_pointer(), self.i32, self.mask_type, vector])
        address = b.bitcast(pointer, vector.as_pointer())
        zeros = _zeros()[0]
        with b.if_else(b.icmp_signed(">=", count, self.const(LANES))) as (whole, part):
            with whole:
                plain = b.load(address, align=4)
                whole_block = b.block
            with part:                                # none or some lanes
                start = b.block
                with b.if_then(b.icmp_signed(">", count, self.const(0))):
                    masked = b.call(f, [address, ir.Constant(self.i32, 4), self.mask(count),
                                        zeros])
                    masked_block = b.block
                some = b.phi(vector)
                some.add_incoming(zeros, start)
                some.add_incoming(masked, masked_block)
                part_block = b.block
        value = b.phi(vector)
        value.add_incoming(plain, whole_block)
        value.add_incoming(some, part_block)
        return value

    def store(self, value, pointer, count):
        """Write the first ``count`` lanes of ``value`` at ``pointer`` (as ``load``)."""
        ir, b, vector = self.ir, self.builder, self.vector
        f = self._function(f"llvm.masked.store.v{LANES}f32.p0v{LANES}f32", ir.VoidType(),
                           [vector, vector.as_pointer(), self.i32, self.mask_type])
        address = b.bitcast(pointer, vector.as_pointer())
        with b.if_else(b.icmp_signed(">=", count, self.const(LANES))) as (whole, part):
            with whole:
                b.store(value, address, align=4)
            with part:
                with b.if_then(b.icmp_signed(">", count, self.const(0))):
                    b.call(f, [value, address, ir.Constant(self.i32, 4), self.mask(count)])

    def add_residual(self, value, has_residual, pointer, count):
        """value + the vector at ``pointer`` (``count`` lanes) if ``has_residual``, else
        value, without reading anything (see the module docstring)."""
        b = self.builder
        before = b.block
        with b.if_then(has_residual):
            added = b.fadd(value, self.load(pointer, count))
            added_block = b.block
        result = b.phi(self.vector)
        result.add_incoming(value, before)
        result.add_incoming(added, added_block)
        return result

    def fma(self, a, b, c):
        """a * b + c, rounded once."""
        f = self._function(f"llvm.fma.v{LANES}f32", self.vector, [self.vector] * 3)
        return self.builder.call(f, [a, b, c])

    def row_offsets(self, first, step, rows):
        """first + min(r, rows - 1) * step for r < ROWS: rows past the last real one repeat
        it (they are computed, never stored)."""
        b = self.builder
        last = b.sub(rows, self.const(1))
        offsets = []
        for r in range(ROWS):
            row = b.select(b.icmp_signed("<", self.const(r), rows), self.const(r), last)
            offsets.append(b.add(first, b.mul(row, step)))
        return offsets


@intrinsic
def tile_zero():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_zero(typingctx):
        """A tile of zeros."""
        def codegen(context, builder, signature, args):
            return _zeros()[1]
        return _llvm_types()[2](), codegen
    return tile_zero


@intrinsic
def tile_load():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_load(typingctx, c, c_first, c_step, rows, count):
        """A tile holding c[c_first + r * c_step + j] for r < rows, j < count (0 elsewhere;
        nothing else read): a sum over k carried on from values stored before."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            c_first, c_step, rows, count = emit.int(1), emit.int(2), emit.int(3), emit.int(4)
            zeros, tile = _zeros()
            for r in range(ROWS):
                before = builder.block
                with builder.if_then(builder.icmp_signed(">", rows, emit.const(r))):
                    row = builder.add(c_first, builder.mul(emit.const(r), c_step))
                    loaded = [emit.load(emit.pointer(0, builder.add(row, emit.const(v * LANES))),
                                        builder.sub(count, emit.const(v * LANES)))
                              for v in range(VECTORS)]
                    loaded_block = builder.block
                values = [builder.phi(emit.vector) for _ in range(VECTORS)]   # phis first
                for v, value in enumerate(values):
                    value.add_incoming(zeros, before)
                    value.add_incoming(loaded[v], loaded_block)
                    tile = builder.insert_value(tile, value, r * VECTORS + v)
            return tile
        return _llvm_types()[2](c, c_first, c_step, rows, count), codegen
    return tile_load


def _tile_fma_codegen(vectors, computed_rows=ROWS, steps=1):
    """The code of tile_fma on the first ``vectors`` vectors of the first ``computed_rows``
    rows (the others kept); with ``steps``, that many k in turn, a and b moved on by the
    arguments 8 and 9 each."""
    def codegen(context, builder, signature, args):
        emit = _Emit(context, builder, signature, args)
        tile = args[0]
        count = emit.int(7)
        offsets = emit.row_offsets(emit.int(2), emit.int(3), emit.int(4))
        for step in range(steps):
            b_first, moved = emit.int(6), offsets
            if step:
                b_first = builder.add(b_first, builder.mul(emit.const(step), emit.int(9)))
                a_moved = builder.mul(emit.const(step), emit.int(8))
                moved = [builder.add(offset, a_moved) for offset in offsets]
            b_pointer = emit.pointer(5, b_first)
            columns = [emit.load(builder.gep(b_pointer, [emit.const(v * LANES)]),
                                 builder.sub(count, emit.const(v * LANES)))
                       for v in range(vectors)]
            for r, offset in enumerate(moved[:computed_rows]):
                a_value = emit.splat(builder.load(emit.pointer(1, offset)))
                for v in range(vectors):
                    slot = r * VECTORS + v
                    total = emit.fma(a_value, columns[v], builder.extract_value(tile, slot))
                    tile = builder.insert_value(tile, total, slot)
        return tile
    return codegen


@intrinsic
def tile_fma():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_fma(typingctx, tile, a, a_first, a_step, rows, b, b_first, count):
        """tile[r, j] += a[a_first + r * a_step] * b[b_first + j] for r < ROWS, j < COLUMNS;
        b read only for j < count (0 past it), a only for r < rows (the last row again past
        it). a and b: 1-D float32 arrays."""
        return (tile(tile, a, a_first, a_step, rows, b, b_first, count),
                _tile_fma_codegen(VECTORS))
    return tile_fma


STEPS = 4               # the k a tile_fma_steps takes


@intrinsic
def tile_fma_steps():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_fma_steps(typingctx, tile, a, a_first, a_step, rows, b, b_first, count, a_k,
                       b_k):
        """STEPS tile_fma in turn, the s-th at a_first + s * a_k and b_first + s * b_k: the
        same sums, each read at a fixed offset from the first's addresses (per k, a loop
        moves each row's address on, and those additions share the multiply-adds' ports)."""
        return (tile(tile, a, a_first, a_step, rows, b, b_first, count, a_k, b_k),
                _tile_fma_codegen(VECTORS, steps=STEPS))
    return tile_fma_steps


@intrinsic
def tile_fma_narrow():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_fma_narrow(typingctx, tile, a, a_first, a_step, rows, b, b_first, count):
        """tile_fma on the first vector of each row only (j < LANES; the others are left as
        they are): a strip of at most LANES columns at half the multiply-adds."""
        return tile(tile, a, a_first, a_step, rows, b, b_first, count), _tile_fma_codegen(1)
    return tile_fma_narrow


@intrinsic
def tile_fma_short():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_fma_short(typingctx, tile, a, a_first, a_step, rows, b, b_first, count):
        """tile_fma on the first ROWS - 1 rows only (the last is left as it is): a tile of
        ROWS - 1 rows at that many multiply-adds, so that tiles of ROWS and ROWS - 1 rows can
        cover a length exactly where ROWS alone would leave a part-filled tile."""
        return (tile(tile, a, a_first, a_step, rows, b, b_first, count),
                _tile_fma_codegen(VECTORS, ROWS - 1))
    return tile_fma_short


@intrinsic
def tile_dot_pair():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_dot_pair(typingctx, tile, a, a_first, a_step, rows, b, b_first, b_step, count):
        """Dot products with k in the lanes: for r < ROWS, v < 2, lane l < count,
        tile[r, v][l] += a[a_first + r * a_step + l] * b[b_first + v * b_step + l]: rows of
        a and two runs of b (two columns of B laid out along k), 8 loads and 12 fused
        multiply-adds for LANES values of k. ``tile_fold_dots`` sums each vector's lanes.
        Lanes past ``count`` read nothing and add 0; rows past ``rows`` read the last."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            tile, count = args[0], emit.int(8)
            first, second = emit.int(6), builder.add(emit.int(6), emit.int(7))
            columns = [emit.load(emit.pointer(5, at), count) for at in (first, second)]
            for r, offset in enumerate(emit.row_offsets(emit.int(2), emit.int(3), emit.int(4))):
                row = emit.load(emit.pointer(1, offset), count)
                for v in range(VECTORS):
                    slot = r * VECTORS + v
                    total = emit.fma(row, columns[v], builder.extract_value(tile, slot))
                    tile = builder.insert_value(tile, total, slot)
            return tile
        return tile(tile, a, a_first, a_step, rows, b, b_first, b_step, count), codegen
    return tile_dot_pair


@intrinsic
def tile_fold_dots():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_fold_dots(typingctx, tile, dots, lane):
        """``tile`` with lanes ``lane`` and ``lane + 1`` (lane even, < LANES) of each row's
        first vector set to the sums of the lanes of ``dots[r, 0]`` and ``dots[r, 1]``
        (tile_dot_pair's), each summed as a tree of halves: a narrow tile whose columns
        were computed as dot products."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            tile, dots = args[0], args[1]
            lane = builder.trunc(emit.int(2), emit.i32)
            for r in range(ROWS):
                row = builder.extract_value(tile, r * VECTORS)
                for v in range(VECTORS):
                    values = [builder.extract_element(builder.extract_value(dots, r * VECTORS + v),
                                                      emit.ir.Constant(emit.i32, i))
                              for i in range(LANES)]
                    while len(values) > 1:          # lanes i and i + half, then again
                        half = len(values) // 2
                        values = [builder.fadd(values[i], values[i + half]) for i in range(half)]
                    row = builder.insert_element(row, values[0],
                                                 builder.add(lane, emit.ir.Constant(emit.i32, v)))
                tile = builder.insert_value(tile, row, r * VECTORS)
            return tile
        return tile(tile, dots, lane), codegen
    return tile_fold_dots


@intrinsic
def tile_add():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_add(typingctx, tile, other):
        """tile + other, lane by lane: a sum over k taken in parts, one part added to the
        sum of those before."""
        def codegen(context, builder, signature, args):
            tile, other = args
            for slot in range(ROWS * VECTORS):
                total = builder.fadd(builder.extract_value(tile, slot),
                                     builder.extract_value(other, slot))
                tile = builder.insert_value(tile, total, slot)
            return tile
        return tile(tile, other), codegen
    return tile_add


@intrinsic
def deinterleave():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def deinterleave(typingctx, source, source_first, even, even_first, odd, odd_first):
        """even[even_first + k] = source[source_first + 2 k] and odd[odd_first + k] =
        source[source_first + 2 k + 1] for k < LANES: two vector loads, two shuffles, two
        stores (a stride-2 split, which LLVM does not vectorise by itself). All 1-D float32
        arrays; the caller keeps every index inside them."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            pointer = emit.vector.as_pointer()

            def at(index, offset):
                return builder.bitcast(emit.pointer(index, builder.add(
                    emit.int(index + 1), emit.const(offset))), pointer)
            low = builder.load(at(0, 0), align=4)
            high = builder.load(at(0, LANES), align=4)
            for index, parity in ((2, 0), (4, 1)):
                picks = emit.ir.Constant(emit.ir.VectorType(emit.i32, LANES),
                                         [2 * k + parity for k in range(LANES)])
                builder.store(builder.shuffle_vector(low, high, picks), at(index, 0), align=4)
            return context.get_dummy_value()
        return types.void(source, source_first, even, even_first, odd, odd_first), codegen
    return deinterleave


@intrinsic
def tile_store():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def tile_store(typingctx, tile, c, c_first, c_step, rows, count, bias, bias_first,
                   residual, lo, hi):
        """For r < rows, j < count, at i = c_first + r * c_step + j:
        c[i] = min(max(tile[r, j] + bias[bias_first + r] + residual[i], lo), hi): a
        convolution's epilogue, in its order, with ReLU, ReLU6 or no activation (lo, hi =
        -inf, inf). ``residual``: laid out as c, or an empty array for none (not read)."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            tile, rows, count = args[0], emit.int(4), emit.int(5)
            c_first, c_step, bias_first = emit.int(2), emit.int(3), emit.int(7)
            lo, hi = emit.splat(emit.float(9)), emit.splat(emit.float(10))
            residual = context.make_array(signature.args[8])(context, builder, args[8])
            has_residual = builder.icmp_signed(">", builder.extract_value(residual.shape, 0),
                                               emit.const(0))
            for r in range(ROWS):
                with builder.if_then(builder.icmp_signed(">", rows, emit.const(r))):
                    shift = emit.splat(builder.load(
                        emit.pointer(6, builder.add(bias_first, emit.const(r)))))
                    row = builder.add(c_first, builder.mul(emit.const(r), c_step))
                    for v in range(VECTORS):
                        at = builder.add(row, emit.const(v * LANES))
                        lanes = builder.sub(count, emit.const(v * LANES))
                        value = builder.fadd(builder.extract_value(tile, r * VECTORS + v),
                                             shift)
                        value = emit.add_residual(value, has_residual, emit.pointer(8, at),
                                                  lanes)
                        # max(value, lo), then min(., hi); a NaN stays NaN, as in torch
                        value = builder.select(builder.fcmp_unordered(">", value, lo), value,
                                               lo)
                        value = builder.select(builder.fcmp_unordered("<", value, hi), value,
                                               hi)
                        emit.store(value, emit.pointer(1, at), lanes)
            return context.get_dummy_value()
        return types.void(tile, c, c_first, c_step, rows, count, bias, bias_first, residual,
                          lo, hi), codegen
    return tile_store


# ----- single vectors: the channels-last depthwise kernel (layers/fast/depthwise.py), ------
# ----- the transposed 1x1's epilogue and pointwise.py's copies --------------------------
# There LANES channels share a vector: one output pixel of LANES channels is a chain of
# fused multiply-adds, a vector of weights by a vector of inputs per tap. A Vector is one
# <LANES x float> value, kept in a register like the tile's.

VECTOR_BYTES = LANES * 4          # a vector load from an address that is a multiple of
                                  # this reads one cache line, not two


def aligned_empty(shape: int | tuple[int, ...]) -> np.ndarray:
    """An uninitialised float32 array whose first value starts on a VECTOR_BYTES boundary."""
    size = int(np.prod(shape))
    raw = np.empty(size + LANES, np.float32)
    skip = (-raw.ctypes.data % VECTOR_BYTES) // 4
    return raw[skip:skip + size].reshape(shape)


@kernel(nogil=True, inline="always")
def aligned_array(size):
    """aligned_empty in a kernel: ``size`` float32 values, uninitialised (1-D)."""
    raw = np.empty(size + LANES, np.float32)
    skip = (-raw.ctypes.data % VECTOR_BYTES) // 4
    return raw[skip:skip + size]


@functools.cache
def _vector_type():
    """The numba type of one vector register, made once, on first compile."""
    from numba import types
    from numba.extending import models, register_model

    class Vector(types.Type):
        def __init__(self):
            super().__init__(name=f"Vector{LANES}")

    @register_model(Vector)
    class VectorModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, _llvm_types()[0])

    return Vector()


@intrinsic
def vector_load():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def vector_load(typingctx, source, first):
        """source[first : first + LANES] (1-D float32; the caller keeps them inside it)."""
        def codegen(context, builder, signature, args):
            return builder.load(_Emit(context, builder, signature, args).vector_at(0, 1),
                                align=4)
        return _vector_type()(source, first), codegen
    return vector_load


@intrinsic
def vector_store():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def vector_store(typingctx, value, target, first):
        """target[first : first + LANES] = value (1-D float32, as vector_load)."""
        def codegen(context, builder, signature, args):
            address = _Emit(context, builder, signature, args).vector_at(1, 2)
            builder.store(args[0], address, align=4)
            return context.get_dummy_value()
        return types.void(value, target, first), codegen
    return vector_store


@intrinsic
def vector_copy_part():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def vector_copy_part(typingctx, source, source_first, target, target_first, count):
        """target[target_first + q] = source[source_first + q] for q < count: one masked
        load and store for 0 < count < LANES (nothing past count read or written), a plain
        vector for count >= LANES, nothing for count <= 0 (1-D float32 arrays)."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            count = emit.int(4)
            value = emit.load(emit.pointer(0, emit.int(1)), count)
            emit.store(value, emit.pointer(2, emit.int(3)), count)
            return context.get_dummy_value()
        return types.void(source, source_first, target, target_first, count), codegen
    return vector_copy_part


@intrinsic
def vector_fma():
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def vector_fma(typingctx, a, b, c):
        """a * b + c lane by lane, rounded once."""
        def codegen(context, builder, signature, args):
            return _Emit(context, builder, signature, args).fma(*args)
        return _vector_type()(a, b, c), codegen
    return vector_fma


@intrinsic
def full_width():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def full_width(typingctx):
        """Have LLVM vectorise the loops of the function that calls this with vectors of
        LANES floats: on some CPUs with 512-bit vectors (its prefer-256-bit tuning, Intel's)
        it otherwise takes 256-bit ones for the loops it vectorises itself (the register
        tiles here are explicit, and full width anyway). A function attribute, which LLVM
        drops when it inlines the function into another, so the function is also kept from
        being inlined (a kernel declared inline="always" must not call this). It changes no
        value."""
        def codegen(context, builder, signature, args):
            attributes = builder.function.attributes
            attributes.add("noinline")
            # llvmlite knows only LLVM's enumerated attributes: a string one is added to the
            # set as it is printed in the function's definition
            set.add(attributes, f'"prefer-vector-width"="{LANES * 32}"')
            return context.get_dummy_value()
        return types.void(), codegen
    return full_width


@intrinsic
def prefetch():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def prefetch(typingctx, a, first):
        """Ask the CPU to bring the cache line holding a[first] into its level-2 cache, ahead
        of the loads that need it (1-D float32; a hint: it changes no value, and an address
        past the array's end does not fault)."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            ir = emit.ir
            byte_pointer = ir.IntType(8).as_pointer()
            f = emit._function("llvm.prefetch.p0i8", ir.VoidType(),
                               [byte_pointer, emit.i32, emit.i32, emit.i32])
            address = builder.bitcast(emit.pointer(0, emit.int(1)), byte_pointer)
            read, level_2, data = (ir.Constant(emit.i32, v) for v in (0, 2, 1))
            builder.call(f, [address, read, level_2, data])
            return context.get_dummy_value()
        return types.void(a, first), codegen
    return prefetch


@intrinsic
def transpose_block():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def transpose_block(typingctx, source, source_first, source_step, rows, lanes, target,
                        target_first, target_step, target_rows, target_lanes):
        """A LANES x LANES block transposed: with row r = source[source_first + r *
        source_step + j] for j < LANES, target[target_first + j * target_step + r] = row r's
        lane j. Only rows r < ``rows`` and their first ``lanes`` values are read (the rest
        are 0), only target rows j < ``target_rows`` and their first ``target_lanes`` values
        written. In log2(LANES) rounds of shuffles: round h swaps, in each 2h x 2h block, the
        h x h block above the diagonal with the one below it (1-D float32 arrays)."""
        def codegen(context, builder, signature, args):
            emit = _Emit(context, builder, signature, args)
            ir, zeros = emit.ir, _zeros()[0]
            first, step, rows, lanes = emit.int(1), emit.int(2), emit.int(3), emit.int(4)
            vectors = []
            for r in range(LANES):
                before = builder.block
                with builder.if_then(builder.icmp_signed(">", rows, emit.const(r))):
                    at = builder.add(first, builder.mul(emit.const(r), step))
                    loaded = emit.load(emit.pointer(0, at), lanes)
                    loaded_block = builder.block
                value = builder.phi(emit.vector)
                value.add_incoming(zeros, before)
                value.add_incoming(loaded, loaded_block)
                vectors.append(value)
            h = LANES // 2
            while h >= 1:
                low = [j if j & h == 0 else LANES + j - h for j in range(LANES)]
                high = [j + h if j & h == 0 else LANES + j for j in range(LANES)]
                for i in range(LANES):
                    if i & h == 0:
                        a, b = vectors[i], vectors[i + h]
                        for k, picks in ((i, low), (i + h, high)):
                            mask = ir.Constant(ir.VectorType(emit.i32, LANES), picks)
                            vectors[k] = builder.shuffle_vector(a, b, mask)
                h //= 2
            first, step = emit.int(6), emit.int(7)
            rows, lanes = emit.int(8), emit.int(9)
            for j in range(LANES):
                with builder.if_then(builder.icmp_signed(">", rows, emit.const(j))):
                    at = builder.add(first, builder.mul(emit.const(j), step))
                    emit.store(vectors[j], emit.pointer(5, at), lanes)
            return context.get_dummy_value()
        return types.void(source, source_first, source_step, rows, lanes, target,
                          target_first, target_step, target_rows, target_lanes), codegen
    return transpose_block
