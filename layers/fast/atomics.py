"""What two threads need to share work without locks, as numba intrinsics (LLVM IR).

numba has no atomics, and a plain load in a loop may be hoisted out of it by the compiler
(nothing in the loop writes the value, as far as it can tell), so a thread waiting for
another would spin forever. These few operations are written in LLVM IR instead:

    load(flags, i)                 flags[i], read atomically (sequentially consistent)
    store(flags, i, value)         flags[i] = value, atomically
    compare_swap(flags, i, old, new)   flags[i] = new if it was old; returns what it was
    add(flags, i, value)           flags[i] += value atomically; returns what it was
    pause()                        the CPU's spin-wait hint (x86 ``pause``; nothing elsewhere)
    float_array(address, size)     the float32 array of ``size`` values at ``address``
    sgemm(function, trans_b, m, n, k, a, lda, b, ldb, c, ldc)
                                   C = A @ B (B^T if trans_b is TRANS) through a cblas_sgemm
                                   pointer
    sgemv(function, trans, m, n, a, lda, x, y)
                                   y = A @ x (A^T if trans is TRANS; A is m x n) through a
                                   cblas_sgemv pointer
    units_address(function)        the address of ``function``, a job's units function: a
                                   kernel of (record, reals, slot, first, last)
    run_units(address, record, reals, slot, first, last)
                                   calls the units function at ``address``; 1, or 0 if it
                                   raised (the exception itself is dropped, and numba's
                                   record of one with run-time values is not freed)

``flags`` is an int64 array. The last five let kernels hand work over as addresses in an int64
array: an array's (float_array), BLAS's (sgemm, sgemv), a units function's (units_address
gives it, run_units calls it): how layers/fast/jobs.py hands work to a helper thread.
``units_address`` links the function's code into the kernel that asks for its address (as
numba's own calls do), so the address is valid wherever that kernel runs, compiled just in
time or ahead of time.
Each is made by a factory that runs when numba compiles the kernels (kernel.intrinsic).
"""

from __future__ import annotations

import platform

from layers.fast.kernel import intrinsic

ORDER = "seq_cst"
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112      # cblas's enums


def _operands(context, builder, signature, args):
    """An intrinsic's (flags, index, values...) as LLVM values: the pointer to flags[index],
    and the values as int64."""
    from numba import types
    from numba.core import cgutils

    flags_type = signature.args[0]
    ary = context.make_array(flags_type)(context, builder, args[0])
    pointer = cgutils.get_item_pointer(context, builder, flags_type, ary, [args[1]])
    values = [context.cast(builder, v, t, types.int64)
              for v, t in zip(args[2:], signature.args[2:])]
    return pointer, values


@intrinsic
def load():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def load(typingctx, flags, index):
        def codegen(context, builder, signature, args):
            pointer, _ = _operands(context, builder, signature, args)
            return builder.load_atomic(pointer, ORDER, 8)
        return types.int64(flags, index), codegen
    return load


@intrinsic
def store():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def store(typingctx, flags, index, value):
        def codegen(context, builder, signature, args):
            pointer, (value,) = _operands(context, builder, signature, args)
            builder.store_atomic(value, pointer, ORDER, 8)
            return context.get_dummy_value()
        return types.void(flags, index, value), codegen
    return store


@intrinsic
def compare_swap():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def compare_swap(typingctx, flags, index, old, new):
        def codegen(context, builder, signature, args):
            pointer, (old, new) = _operands(context, builder, signature, args)
            return builder.extract_value(builder.cmpxchg(pointer, old, new, ORDER, ORDER), 0)
        return types.int64(flags, index, old, new), codegen
    return compare_swap


@intrinsic
def add():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def add(typingctx, flags, index, value):
        def codegen(context, builder, signature, args):
            pointer, (value,) = _operands(context, builder, signature, args)
            return builder.atomic_rmw("add", pointer, value, ORDER)
        return types.int64(flags, index, value), codegen
    return add


@intrinsic
def pause():
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic as numba_intrinsic

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")

    @numba_intrinsic
    def pause(typingctx):
        def codegen(context, builder, signature, args):
            if x86:
                hint = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
                builder.call(hint, [])
            return context.get_dummy_value()
        return types.void(), codegen
    return pause


@intrinsic
def float_array():
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic
    from numba.np.arrayobj import populate_array

    array_type = types.Array(types.float32, 1, "C")

    @numba_intrinsic
    def float_array(typingctx, address, size):
        def codegen(context, builder, signature, args):
            address, size = (context.cast(builder, v, t, types.intp)
                             for v, t in zip(args, signature.args))
            ary = context.make_array(array_type)(context, builder)
            itemsize = context.get_constant(types.intp, 4)
            populate_array(ary, data=builder.inttoptr(address, ary.data.type), shape=[size],
                           strides=[itemsize], itemsize=itemsize, meminfo=None)
            return ary._getvalue()
        return array_type(address, size), codegen
    return float_array


@intrinsic
def sgemm():
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    pointer = ir.IntType(8).as_pointer()
    # cblas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc),
    # 64-bit integers (numpy's OpenBLAS: the "64_" interface)
    function_type = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, pointer,
                                                     i64, pointer, i64, f32, pointer, i64])
    @numba_intrinsic
    def sgemm(typingctx, function, trans_b, m, n, k, a, lda, b, ldb, c, ldc):
        def codegen(context, builder, signature, args):
            f, trans_b, m, n, k, a, lda, b, ldb, c, ldc = (
                context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args))
            target = builder.inttoptr(f, function_type.as_pointer())
            one, zero = ir.Constant(f32, 1.0), ir.Constant(f32, 0.0)
            builder.call(target, [ir.Constant(i32, ROW_MAJOR), ir.Constant(i32, NO_TRANS),
                                  builder.trunc(trans_b, i32), m, n, k, one,
                                  builder.inttoptr(a, pointer), lda,
                                  builder.inttoptr(b, pointer), ldb, zero,
                                  builder.inttoptr(c, pointer), ldc])
            return context.get_dummy_value()
        return types.void(function, trans_b, m, n, k, a, lda, b, ldb, c, ldc), codegen
    return sgemm


@intrinsic
def sgemv():
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    pointer = ir.IntType(8).as_pointer()
    # cblas_sgemv(order, trans, M, N, alpha, A, lda, X, incX, beta, Y, incY), 64-bit integers
    function_type = ir.FunctionType(ir.VoidType(), [i32, i32, i64, i64, f32, pointer, i64,
                                                     pointer, i64, f32, pointer, i64])
    @numba_intrinsic
    def sgemv(typingctx, function, trans, m, n, a, lda, x, y):
        def codegen(context, builder, signature, args):
            f, trans, m, n, a, lda, x, y = (
                context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args))
            target = builder.inttoptr(f, function_type.as_pointer())
            one, zero = ir.Constant(f32, 1.0), ir.Constant(f32, 0.0)
            step = ir.Constant(i64, 1)
            builder.call(target, [ir.Constant(i32, ROW_MAJOR), builder.trunc(trans, i32), m, n,
                                  one, builder.inttoptr(a, pointer), lda,
                                  builder.inttoptr(x, pointer), step, zero,
                                  builder.inttoptr(y, pointer), step])
            return context.get_dummy_value()
        return types.void(function, trans, m, n, a, lda, x, y), codegen
    return sgemv


def _units_signature():
    """The argument types of every job's units function (layers/fast/jobs.py), which
    returns nothing: (record int64[::1], reals float64[::1], slot, first, last)."""
    from numba import types

    return (types.Array(types.int64, 1, "C"), types.Array(types.float64, 1, "C"),
            types.int64, types.int64, types.int64)


def _not_a_units_function(what) -> Exception:
    from numba.core.errors import TypingError

    return TypingError(f"{what}: a job's units function is a kernel of (record int64[::1], "
                       "reals float64[::1], slot, first, last) that returns nothing")


@intrinsic
def units_address():
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def units_address(typingctx, function):
        arguments = _units_signature()
        if not isinstance(function, types.Dispatcher):
            raise _not_a_units_function(function)
        typed = typingctx.resolve_function_type(function, arguments, {})   # compiles it
        if typed is None or typed.return_type != types.none:
            raise _not_a_units_function(function)

        def codegen(context, builder, signature, args):
            compiled = function.dispatcher.get_compile_result(types.none(*arguments))
            context.add_linking_libs([compiled.library])
            declared = context.declare_function(builder.module, compiled.fndesc)
            return builder.ptrtoint(declared, ir.IntType(64))
        return types.int64(function), codegen
    return units_address


@intrinsic
def run_units():
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def run_units(typingctx, address, record, reals, slot, first, last):
        arguments = _units_signature()
        if (record, reals) != arguments[:2] or not all(
                isinstance(t, types.Integer) for t in (address, slot, first, last)):
            raise _not_a_units_function((address, record, reals, slot, first, last))

        def codegen(context, builder, signature, args):
            values = [args[1], args[2]] + [
                context.cast(builder, v, t, types.int64)
                for v, t in zip(args[3:], signature.args[3:])]
            function_type = context.call_conv.get_function_type(types.none, arguments)
            target = builder.inttoptr(args[0], function_type.as_pointer())
            status, _ = context.call_conv.call_function(builder, target, types.none,
                                                        arguments, values)
            return builder.zext(status.is_ok, ir.IntType(64))
        return types.int64(address, record, reals, slot, first, last), codegen
    return run_units
