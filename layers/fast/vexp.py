"""exp(x) and tanh(x) for float32 in plain arithmetic, so that a loop calling them vectorises.

A loop that calls ``np.exp`` in a numba kernel calls libm once per value (LLVM has no vector
exp to put in its place), about ten times the cost of the multiplies around it; sigmoid and
SiLU epilogues spent most of their time there. This one splits x into n ln 2 + f:

    n = round(x / ln 2)                  an integer, so 2^n is a float's exponent field
    f = x - n ln 2                       |f| <= ln 2 / 2, with ln 2 in two parts (Cody-Waite:
                                         n * LN2_HIGH is exact, so f keeps its low bits)
    e^f = 1 + f + f^2 P(f)               P of degree 5: the Taylor series' 1/2, 1/6, ...
                                         adjusted to minimise the float32 error on the range
    e^x = e^f * 2^n                      2^n built from its bits: (n + 127) << 23

The error is within 2 ulp of float64's exp over the whole float32 range (tests/fast). Edges
as libm: x above 88.72 gives inf, below -87.33 gives 0 (libm gives a subnormal of at most
1.2e-38 there), NaN gives NaN. Bit patterns are reinterpreted by ``float_from_bits``, an
intrinsic: one LLVM ``bitcast``, which vectorises like any other instruction.

tanh (libm's, per value, would not vectorise either) takes one of two forms, both computed
and one kept (a select, which vectorises)::

    |x| < TANH_SMALL   x + x z P(z), z = x^2   P of degree 5, fitted to (tanh(x) / x - 1) / z
                                               on [0, TANH_SMALL^2] by iteratively reweighted
                                               least squares for tanh's relative error
    otherwise          +-(1 - 2 / (e^(2|x|) + 1))   with x's sign; e^(2|x|) is exp32's

Within 4x torch's float32 error against float64 (tests/fast); +-inf give +-1, NaN stays
NaN, -0.0 keeps its sign.
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import intrinsic, kernel

LOG2_E = np.float32(1.4426950408889634)
LN2_HIGH = np.float32(0.693359375)              # 8 significant bits: n * LN2_HIGH is exact
LN2_LOW = np.float32(-2.12194440e-4)           # ln 2 - LN2_HIGH
EXP_P0, EXP_P1, EXP_P2, EXP_P3, EXP_P4, EXP_P5 = np.float32(
    [5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3,
     1.9875691500e-4])
EXP_OVERFLOW = np.float32(88.72283935546875)     # exp of more is inf in float32
EXP_UNDERFLOW = np.float32(-87.33654022216797)   # exp of less is below the smallest normal
TANH_SMALL = np.float32(0.625)                   # the polynomial below, the exp form above
TANH_P0, TANH_P1, TANH_P2, TANH_P3, TANH_P4, TANH_P5 = np.float32(
    [-0.33333331, 0.13333215, -0.0539478, 0.02170591, -0.00818963, 0.00215376])


@intrinsic
def float_from_bits():
    """float_from_bits(i): the float32 whose bits are the low 32 bits of the integer i."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic as numba_intrinsic

    @numba_intrinsic
    def float_from_bits(typingctx, bits):
        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[0], signature.args[0], types.int64)
            return builder.bitcast(builder.trunc(value, ir.IntType(32)), ir.FloatType())
        return types.float32(bits), codegen
    return float_from_bits


@kernel(inline="always")
def exp32(x):
    """e^x of a float32 (the module docstring has the method and its error)."""
    zero, one = np.float32(0.0), np.float32(1.0)
    clipped = min(max(x, EXP_UNDERFLOW), EXP_OVERFLOW)    # NaN and the edges: below
    n = np.floor(clipped * LOG2_E + np.float32(0.5))
    f = clipped - n * LN2_HIGH - n * LN2_LOW
    p = (((((EXP_P5 * f + EXP_P4) * f + EXP_P3) * f + EXP_P2) * f + EXP_P1) * f + EXP_P0)
    n_int = np.int32(n)
    # 2^n as two factors 2^(n - n // 2) * 2^(n // 2): n may be 128 (x near the top)
    half = n_int >> 1
    scale_a = float_from_bits((n_int - half + 127) << 23)
    scale_b = float_from_bits((half + 127) << 23)
    y = (f * f * p + f + one) * scale_a * scale_b
    if x > EXP_OVERFLOW:
        y = np.float32(np.inf)
    if x < EXP_UNDERFLOW:
        y = zero
    if x != x:                                        # NaN stays NaN
        y = x
    return y


@kernel(inline="always")
def tanh32(x):
    """tanh(x) of a float32 (the module docstring has the method and its error)."""
    one, two = np.float32(1.0), np.float32(2.0)
    a = abs(x)
    z = x * x
    p = ((((TANH_P5 * z + TANH_P4) * z + TANH_P3) * z + TANH_P2) * z + TANH_P1) * z + TANH_P0
    small = x + x * z * p
    large = one - two / (exp32(a + a) + one)        # NaN stays NaN here
    zero = np.float32(0.0)
    if x < zero:
        large = -large
    if a == zero:                                   # -0.0 (x + x z p would give +0.0)
        small = x
    return small if a < TANH_SMALL else large
