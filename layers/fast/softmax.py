"""Softmax over the last dim as a numba kernel, row by row, in place::

    y[r] = exp(x[r] - max(x[r])) / sum(exp(x[r] - max(x[r])))

Four passes over each row while it is in cache, each a loop the compiler vectorises: the
max (in eight running maxima: one would make every compare wait for the one before), the
exponentials (vexp.py's exp, in place, its polynomial as fused multiply-adds: contract),
their sum (in float64, lanes reassociated, in a function of its own so that nothing else
is reassociated) and the division. As in torch, a
NaN anywhere in a row makes the whole row NaN (its exponential joins the sum), and so does
a row of -inf (-inf - -inf).
"""

from __future__ import annotations

import numpy as np

from layers.fast.kernel import array, kernel
from layers.fast.team import team_worth_sharing
from layers.fast.vexp import exp32

SHARED_FROM = 1 << 14        # values: a smaller softmax is not worth waking the helpers


@kernel(nogil=True, exported=(array(2),))
def _softmax(x):
    """x (R, D) <- the softmax of each row, in place (``softmax_rows``)."""
    softmax_rows(x, np.int64(0), x.shape[0])                  # int64 0: see jobs.py


@kernel(nogil=True, fastmath={"contract"})
def softmax_rows(x, first, last):
    """Rows first .. last - 1 of x (R, D), each replaced by its softmax."""
    for r in range(first, last):
        row = x[r]
        top = row_max(row)
        for i in range(row.shape[0]):
            row[i] = exp32(row[i] - top)
        total = np.float32(row_sum(row))
        for i in range(row.shape[0]):
            row[i] = row[i] / total


@kernel(nogil=True)
def row_max(row):
    """The largest value of a float32 row (-inf for none), in eight independent maxima."""
    n = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    i = 0
    while i + 8 <= n:
        m0, m1 = max(m0, row[i]), max(m1, row[i + 1])
        m2, m3 = max(m2, row[i + 2]), max(m3, row[i + 3])
        m4, m5 = max(m4, row[i + 4]), max(m5, row[i + 5])
        m6, m7 = max(m6, row[i + 6]), max(m7, row[i + 7])
        i += 8
    while i < n:
        m0 = max(m0, row[i])
        i += 1
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@kernel(nogil=True, fastmath={"reassoc"})        # reassoc: the sum vectorises
def row_sum(row):
    """The sum of a float32 row, accumulated in float64."""
    total = 0.0
    for i in range(row.shape[0]):
        total += np.float64(row[i])
    return total


def softmax_last(x: np.ndarray, out: np.ndarray) -> None:
    """out <- the softmax of x over its last dim: x float32 of any layout, out a C-contiguous
    float32 array of x's shape (or x itself, then C-contiguous). Shared with the helper
    threads when the forward has them and there are SHARED_FROM values or more."""
    if out is not x:
        np.copyto(out, x)
    if out.size == 0:
        return
    rows = out.reshape(-1, out.shape[-1])
    team = team_worth_sharing(rows.size, SHARED_FROM)
    if team is None:
        _softmax(rows)
    else:
        team.softmax(rows)
