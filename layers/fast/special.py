"""Special functions numpy lacks, elementwise, with libm's accuracy (as torch computes them):

    erf(x)  = 2/sqrt(pi) * integral from 0 to x of exp(-t^2) dt
    erfc(x) = 1 - erf(x), computed directly so that a large x keeps its digits
              (1 - erf(5) is 0 in float32; erfc(5) is 1.5e-12)

float32 in float32 (libm's erff / erfcf), anything else in float64. Used by GELU
(approximate='none'), aten::erfc and the ``erf`` of pnnx expressions.
"""

from __future__ import annotations

import math

import numpy as np

from layers.fast.backend import INT, array, kernel

ERF, ERFC = 0, 1


@kernel(nogil=True, inline="always")
def _apply(x, y, function):
    if function == ERF:
        for i in range(x.shape[0]):
            y[i] = math.erf(x[i])
    else:
        for i in range(x.shape[0]):
            y[i] = math.erfc(x[i])


@kernel(nogil=True, exported=(array(1), array(1), INT))
def _special32(x, y, function):
    _apply(x, y, function)


@kernel(nogil=True, exported=(array(1, "f8"), array(1, "f8"), INT))
def _special64(x, y, function):
    _apply(x, y, function)


def _elementwise(function: int, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``function`` of every element of a float array of any shape; the result has x's dtype
    (or is written into ``out``)."""
    x = np.asarray(x)
    dtype = np.float32 if x.dtype == np.float32 else np.float64
    flat = np.require(x, dtype, ("C", "A")).reshape(-1)
    result = np.empty_like(flat)
    (_special32 if dtype == np.float32 else _special64)(flat, result, function)
    if out is None:
        return result.reshape(x.shape).astype(x.dtype, copy=False)
    out[...] = result.reshape(x.shape)
    return out


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf(x) elementwise (see the module docstring)."""
    return _elementwise(ERF, x, out)


def erfc(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erfc(x) elementwise (see the module docstring)."""
    return _elementwise(ERFC, x, out)
