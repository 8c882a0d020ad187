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
    LEAKY       x if x >= 0 else a * x         LeakyReLU (negative_slope)
    SIGMOID     1 / (1 + exp(-x))
    SILU        x * sigmoid(x)
    HARDSWISH   x * clip(x + 3, 0, 6) / 6
    HARDSIGMOID clip(x + 3, 0, 6) / 6
    TANH        tanh(x)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layers import activation as act
from layers.fast.kernel import FLOAT, INT, array, kernel

NONE, RELU, CLAMP, LEAKY, SIGMOID, SILU, HARDSWISH, HARDSIGMOID, TANH = range(9)


@dataclass(frozen=True)
class Activation:
    """An activation as the kernels take it: ``code`` and its two parameters."""

    code: int = NONE
    a: float = 0.0
    b: float = 0.0


IDENTITY = Activation()


def activation_of(layer) -> Activation | None:
    """The Activation a fast kernel applies for this activation layer, or None if it has none.
    Exact types only: a subclass may compute something else."""
    kind = type(layer)
    if kind is act.ReLU:
        return Activation(RELU)
    if kind in (act.ReLU6, act.Hardtanh):
        return Activation(CLAMP, layer.min_val, layer.max_val)
    if kind is act.LeakyReLU:
        return Activation(LEAKY, layer.negative_slope)
    simple = {act.Sigmoid: SIGMOID, act.SiLU: SILU, act.Hardswish: HARDSWISH,
              act.Hardsigmoid: HARDSIGMOID, act.Tanh: TANH}
    return Activation(simple[kind]) if kind in simple else None


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


@kernel(inline="always")
def activate_row(row, code, a, b, shift=0.0):
    """row <- activation ``code`` of (row + shift), in place on a 1-D float32 array, in one
    pass (a bias added in the same loop costs nothing more). The branch is taken once per
    row, so each loop below is a plain loop the compiler vectorises."""
    n = row.shape[0]
    lo, hi, s = np.float32(a), np.float32(b), np.float32(shift)
    one, zero = np.float32(1.0), np.float32(0.0)
    three, six = np.float32(3.0), np.float32(6.0)
    if code == NONE:
        if s != zero:
            for i in range(n):
                row[i] += s
    elif code == RELU:
        for i in range(n):
            row[i] = max(row[i] + s, zero)
    elif code == CLAMP:
        for i in range(n):
            row[i] = min(max(row[i] + s, lo), hi)
    elif code == LEAKY:
        for i in range(n):
            v = row[i] + s
            row[i] = v if v >= zero else v * lo
    elif code == SIGMOID:
        for i in range(n):
            row[i] = one / (one + np.exp(-(row[i] + s)))
    elif code == SILU:
        for i in range(n):
            v = row[i] + s
            row[i] = v * (one / (one + np.exp(-v)))
    elif code == HARDSWISH:
        for i in range(n):
            v = row[i] + s
            row[i] = v * (min(max(v + three, zero), six) / six)
    elif code == HARDSIGMOID:
        for i in range(n):
            row[i] = min(max(row[i] + s + three, zero), six) / six
    elif code == TANH:
        for i in range(n):
            row[i] = np.tanh(row[i] + s)


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
    """Rows first .. last - 1 of _bias_residual_activation's, counted over (n, c)."""
    c = y.shape[1]
    has_bias, has_residual = bias.shape[0] > 0, residual.shape[0] > 0
    no_residual = np.empty(0, np.float32)
    for row_index in range(first, last):
        i, k = row_index // c, row_index % c
        finish_row(y[i, k], bias[k] if has_bias else np.float32(0.0),
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


def bias_residual_activation(y: np.ndarray, bias: np.ndarray | None,
                             residual: np.ndarray | None, activation: Activation) -> None:
    """In place on a C-contiguous float32 ``y`` (N, C, ...): y = activation(y + bias + residual).
    ``residual`` has y's shape. Does nothing when there is nothing to do."""
    if nothing_to_finish(bias, residual, activation):
        return
    _bias_residual_activation(*epilogue_operands(y, bias, residual), activation.code,
                              activation.a, activation.b)
