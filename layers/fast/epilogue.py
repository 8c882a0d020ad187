"""What a fused operator does to its result before writing it: bias, residual, activation.

A convolution or linear layer computes ``acc = weight (*) x``; with fusion (infer/fusion.py)
it also applies, in one pass over memory and in this order::

    y = activation(acc + bias[c] + residual)

The activation is described by a small integer code and two floats, so one compiled numba
function serves every activation (no signature per activation, nothing to compile per model):

    code        y                              a, b
    NONE        x
    RELU        max(x, 0)
    CLAMP       min(max(x, a), b)              ReLU6 (0, 6), Hardtanh (min_val, max_val)
    LEAKY       x if x > 0 else a * x          LeakyReLU (negative_slope)
    SIGMOID     1 / (1 + exp(-x))              exp: vexp.py's, which vectorises
    SILU        x / (1 + exp(-x))              (libm's, per value, would not)
    HARDSWISH   x * clip(x + 3, 0, 6) / 6
    HARDSIGMOID clip(x + 3, 0, 6) / 6
    TANH        tanh(x)                        vexp.py's, which vectorises
    GELU        x / 2 * (1 + erf(x / sqrt(2)))  erf as a rational function (below)

    code + THEN_AFFINE   a * f(x) + b          f: NONE or an activation above without a and
                                               b of its own (layers.activation.ScaleShift:
                                               an expression such as add(mul(a,@0),b) folded
                                               in after the activation; rounded as torch)

GELU's erf(z), z clipped to [-4, 4] (beyond, erf is +-1 in float32), is z * P(z^2) / Q(z^2)
with P of degree 6 and Q of degree 4, fitted to float64's erf(z) / z on [0, 4] (iteratively
reweighted least squares): 2.2e-7 from erf in float64 arithmetic, and in float32 GELU is
within 1.3e-6 of float64 (torch's own float32 GELU: the same), 1.2e-7 for |x| < 1 (torch:
8.7e-8). Plain multiplies and one division: the loop vectorises (libm's erf would not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layers import activation as act
from layers.registry import is_built_in
from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.operands import unchecked
from layers.fast.simd import full_width
from layers.fast.vexp import exp32, tanh32

NONE, RELU, CLAMP, LEAKY, SIGMOID, SILU, HARDSWISH, HARDSIGMOID, TANH, GELU = range(10)
THEN_AFFINE = 16                    # a flag added to a code: then y = a * y + b

# GELU's erf(z) = z * P(z^2) / Q(z^2) on [-4, 4] (the module docstring): coefficients from z^0
ERF_P0, ERF_P1, ERF_P2, ERF_P3, ERF_P4, ERF_P5, ERF_P6 = np.float32(
    [1.1283791152760443, 0.20003904802693162, 0.05057449650047316, 0.003699660926317418,
     0.00014126193466245046, -1.94219829770339e-06, 1.9672452965473393e-08])
ERF_Q1, ERF_Q2, ERF_Q3, ERF_Q4 = np.float32(
    [0.5106117878272737, 0.11503274222546037, 0.014353691496288476, 0.0009538820782147359])
SQRT_HALF = np.float32(1 / math.sqrt(2))


@dataclass(frozen=True)
class Activation:
    """An activation as the kernels take it: ``code`` and its two parameters."""

    code: int = NONE
    a: float = 0.0
    b: float = 0.0


IDENTITY = Activation()


def activation_of(layer) -> Activation | None:
    """The Activation a fast kernel applies for this activation layer, or None if it has none.
    Only this package's layers (the reference ones and the fast floor's subclasses of them):
    a user's subclass may compute something else."""
    kind = type(layer)
    if not is_built_in(kind):
        return None
    for base in kind.__mro__:                       # ReLU6 before Hardtanh, a fast class's base
        if base in (act.ReLU6, act.Hardtanh):
            return Activation(CLAMP, layer.min_val, layer.max_val)
        if base is act.LeakyReLU:
            return Activation(LEAKY, layer.negative_slope)
        if base is act.GELU:
            return Activation(GELU) if layer.approximate == "none" else None
        if base is act.ScaleShift:
            inner = IDENTITY if layer.inner is None else activation_of(layer.inner)
            if inner is None or inner.code in (CLAMP, LEAKY) or inner.code & THEN_AFFINE:
                return None                         # its a and b are taken
            return Activation(inner.code | THEN_AFFINE, layer.scale, layer.shift)
        if base in _SIMPLE:
            return Activation(_SIMPLE[base])
    return None


_SIMPLE = {act.ReLU: RELU, act.Sigmoid: SIGMOID, act.SiLU: SILU, act.Hardswish: HARDSWISH,
           act.Hardsigmoid: HARDSIGMOID, act.Tanh: TANH}


@kernel(nogil=True, inline="always")
def clamp_bounds(code, a, b):
    """(lo, hi) as float32 for the activations a register tile applies as a clamp when it is
    stored (layers/fast/simd.py's tile_store): ReLU (0, inf), CLAMP (a, b); (-inf, inf) for
    any other (applied afterwards, if at all)."""
    lo, hi = np.float32(-np.inf), np.float32(np.inf)
    if code == RELU:
        lo = np.float32(0.0)
    elif code == CLAMP:
        lo, hi = np.float32(a), np.float32(b)
    return lo, hi


@kernel(nogil=True, fastmath={"contract"})
def activate_row(row, code, a, b, shift=-0.0):
    """row <- activation ``code`` of (row + shift), in place on a 1-D float32 array, in one
    pass (a bias added in the same loop costs nothing more). No shift is -0.0, which leaves
    every value as it is (+0.0 would turn a -0.0 into +0.0: torch keeps its sign). The
    branch is taken once per row, so each loop below is a plain loop the compiler
    vectorises. Each loop stores every value it computes: a loop that left some values as
    they are (``max(v, 0)`` with a constant 0, ``v if v > 0 else ...``) is compiled to
    masked stores of the others, slow on some CPUs (BENCHMARKS.md). With THEN_AFFINE in
    ``code``, a second loop then takes a * y + b over the row, still in cache.

    A function of its own, called once per row, not inlined: numba inlines by copying a
    function's IR, and these ten loops copied into every kernel that ends in an epilogue
    made the kernels' build much longer (BENCHMARKS.md). The smooth activations run in
    ``smooth_row``."""
    n = row.shape[0]
    slope, s = np.float32(a), np.float32(shift)
    one, zero = np.float32(1.0), np.float32(0.0)
    three, six = np.float32(3.0), np.float32(6.0)
    affine, code = code & THEN_AFFINE, code & (THEN_AFFINE - 1)
    if code == NONE:
        if s != zero:
            for i in range(n):
                row[i] += s
    elif code == RELU or code == CLAMP:          # ReLU: the clamp to [0, inf)
        low, high = clamp_bounds(code, a, b)
        for i in range(n):
            row[i] = min(max(row[i] + s, low), high)
    elif code == LEAKY:
        for i in range(n):
            v = row[i] + s
            row[i] = v * (one if v > zero else slope)
    elif code == HARDSWISH:
        for i in range(n):
            v = row[i] + s
            row[i] = v * (min(max(v + three, zero), six) / six)
    elif code == HARDSIGMOID:
        for i in range(n):
            row[i] = min(max(row[i] + s + three, zero), six) / six
    elif code == SIGMOID or code == SILU or code == TANH or code == GELU:
        smooth_row(row, code, s)
    if affine:                                   # a * y + b, rounded twice as torch's:
        scale, offset = np.float32(a), np.float32(b)
        for i in range(n):                       # two loops, which the kernels compiled
            row[i] = row[i] * scale              # with contract cannot fuse into one
        for i in range(n):                       # multiply-add
            row[i] = row[i] + offset


@kernel(nogil=True, fastmath={"contract"})
def smooth_row(row, code, s):
    """row <- activation ``code`` of (row + s) for the activations computed by polynomials
    (SIGMOID, SILU, TANH, GELU), activate_row's. Compiled with contract (the polynomials as
    fused multiply-adds), whichever kernel calls it. Their loops do enough arithmetic a
    value that vectors of LANES floats pay (simd.full_width); a function of its own, because
    the width applies to a whole function, and loops that only clamp or add run no faster
    at 16 floats on short rows (Winograd's output transform finishes rows of a tile's
    width)."""
    full_width()
    n = row.shape[0]
    one = np.float32(1.0)
    if code == SIGMOID:
        for i in range(n):
            row[i] = one / (one + exp32(-(row[i] + s)))
    elif code == SILU:
        for i in range(n):
            v = row[i] + s
            row[i] = v / (one + exp32(-v))
    elif code == TANH:
        for i in range(n):
            row[i] = tanh32(row[i] + s)
    elif code == GELU:
        half, four = np.float32(0.5), np.float32(4.0)
        for i in range(n):
            v = row[i] + s
            z = min(max(v * SQRT_HALF, -four), four)
            t = z * z
            p = ((((((ERF_P6 * t + ERF_P5) * t + ERF_P4) * t + ERF_P3) * t + ERF_P2) * t
                  + ERF_P1) * t + ERF_P0)
            q = (((ERF_Q4 * t + ERF_Q3) * t + ERF_Q2) * t + ERF_Q1) * t + one
            row[i] = half * v * (one + min(max(z * p / q, -one), one))


@kernel(nogil=True)
def activate_block(y, image, first, count, start, stop, code, a, b):
    """y[image, first:first + count, start:stop] <- activation ``code``, row by row
    (``activate_row``), for pointwise_blocks, transposed_units (every 1x1 product, im2col's
    and Winograd's included) and dense_units: a kernel of their own (activation code in a
    product's kernel slowed its loops: BENCHMARKS.md)."""
    for r in range(first, first + count):
        activate_row(y[image, r, start:stop], code, a, b)


@kernel(inline="always")
def finish_row(row, shift, other, code, a, b):
    """row <- activation((row + shift) + other), in place: a convolution's epilogue on one
    output row (this module's kernel and the Winograd output transforms). ``other`` is the
    residual's row, or an empty array for none: then bias and activation take one pass."""
    if other.shape[0] > 0:
        for j in range(row.shape[0]):
            row[j] = row[j] + shift + other[j]
        activate_row(row, code, a, b)
    else:
        activate_row(row, code, a, b, shift)


@kernel(nogil=True, exported=(array(3), array(1), array(3), INT, FLOAT, FLOAT))
def _bias_residual_activation(y, bias, residual, code, a, b):
    """y (N, C, L) <- activation(y + bias[c] + residual), in place; an empty bias or residual
    (size 0) is skipped; one row (n, c) at a time (``finish_row``)."""
    finish_rows(y, bias, residual, code, a, b, np.int64(0), y.shape[0] * y.shape[1])


@kernel(nogil=True)
def finish_rows(y, bias, residual, code, a, b, first, last):
    """Rows first .. last - 1 of _bias_residual_activation's, counted over (n, c): a chunk of
    the work (layers/fast/jobs.py)."""
    c = y.shape[1]
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    no_residual = np.empty(0, np.float32)
    for row_index in range(first, last):
        i, k = row_index // c, row_index % c
        finish_row(y[i, k], bias[k] if has_bias else np.float32(-0.0),
                   residual[i, k] if has_residual else no_residual, code, a, b)


NO_ARRAY = np.zeros((0,), np.float32)           # "no bias"
NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)   # "no residual"


def nothing_to_finish(bias: np.ndarray | None, residual: np.ndarray | None,
                      activation: Activation) -> bool:
    """No bias, no residual, no activation: the epilogue would leave y as it is."""
    return bias is None and residual is None and activation.code == NONE


def epilogue_operands(y: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y (N, C, ...) as the kernel's rows (N, C, L), with the bias and the residual (y's
    shape) as it takes them: empty arrays for none."""
    n, c = y.shape[:2]
    length = math.prod(y.shape[2:])                 # not -1: y may be empty
    return (y.reshape(n, c, length), NO_ARRAY if bias is None else bias,
            NO_RESIDUAL if residual is None else residual.reshape(n, c, length))


def activate(rows: np.ndarray, activation: Activation) -> None:
    """In place on ``rows`` (N, C, L) that the caller has checked (float32, C-contiguous,
    aligned, writeable): rows = activation(rows) (bias_residual_activation without the bias
    and residual to look for, and without the kernel's per-argument checks)."""
    unchecked(_bias_residual_activation)(rows, NO_ARRAY, NO_RESIDUAL, activation.code,
                                         activation.a, activation.b)


def bias_residual_activation(y: np.ndarray, bias: np.ndarray | None,
                             residual: np.ndarray | None, activation: Activation) -> None:
    """In place on a C-contiguous float32 ``y`` (N, C, ...): y = activation(y + bias + residual).
    ``residual`` has y's shape. Does nothing when there is nothing to do."""
    if nothing_to_finish(bias, residual, activation):
        return
    _bias_residual_activation(*epilogue_operands(y, bias, residual), activation.code,
                              activation.a, activation.b)
