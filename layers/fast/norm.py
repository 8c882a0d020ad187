"""Layer normalisation as a numba kernel: each row of x normalised on its own, in one pass
over the row for its statistics and one to write it::

    mean = sum(x[r]) / D        var = sum((x[r] - mean)^2) / D        (float64 sums)
    y[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias

The variance is the mean of the squared deviations (as torch computes it, not E[x^2] -
E[x]^2), and the sums are taken in float64 as torch's CPU kernel accumulates (its acc_type of
float), in vector lanes (reassociated): the statistics are exact to float32, the result within
an ulp or two of float64's.
"""

from __future__ import annotations

import math

import numpy as np

from layers.fast.epilogue import NO_ARRAY
from layers.fast.kernel import FLOAT, array, kernel


@kernel(nogil=True, fastmath={"contract", "reassoc"},     # reassoc: the sums vectorise
        exported=(array(2), array(1), array(1), FLOAT, array(2)))
def _layer_norm(x, weight, bias, eps, y):
    """x (R, D) -> y (R, D), every row normalised (the module docstring); an empty weight or
    bias (size 0) is skipped."""
    rows, size = x.shape
    has_weight, has_bias = weight.shape[0] > 0, bias.shape[0] > 0
    for r in range(rows):
        row, out = x[r], y[r]
        total = 0.0
        for i in range(size):
            total += np.float64(row[i])
        mean = total / size
        squares = 0.0
        for i in range(size):
            d = np.float64(row[i]) - mean
            squares += d * d
        scale = np.float32(1.0 / math.sqrt(squares / size + eps))
        shift = np.float32(mean)
        for i in range(size):
            out[i] = (row[i] - shift) * scale
        if has_weight:
            for i in range(size):
                out[i] *= weight[i]
        if has_bias:
            for i in range(size):
                out[i] += bias[i]


def layer_norm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
               out: np.ndarray) -> None:
    """x (..., D) float32 C-contiguous, normalised over its last dim D into ``out`` (x's
    shape); weight and bias (D,) float32 or None."""
    size = x.shape[-1]
    _layer_norm(x.reshape(-1, size), NO_ARRAY if weight is None else weight,
                NO_ARRAY if bias is None else bias, float(eps), out.reshape(-1, size))
