"""The products of two graph operands (torch.matmul, torch.bmm, torch.mm, and the two of
F.scaled_dot_product_attention) shared with the helper threads. A model converted from
ONNX, or written with explicit attention, has its q @ k^T and weights @ v as such
operators; on the reference floor numpy runs them, on BLAS's own pool, which a forward with
helpers caps at one thread (layers/fast/workers.py).

Here a float32 product of matrices whose batch dims are equal, or absent on one side, runs
as a stack of products through the team (``Team.matmul``: bands or whole products per
thread, OpenBLAS's sgemm or sgemv each)::

    (..., M, K) @ (..., K, N)   T = prod(...) products of (M, K) @ (K, N)
    (..., M, K) @ (K, N)        one product: (T * M, K) @ (K, N)
    (M, K) @ (..., K, N)        T products with one A

A right operand that is a transposed view of a C-contiguous array (``k.transpose(-2, -1)``)
is read as it lies, BLAS transposing it; another layout is copied first. Products of one row
or one column run as matrix-vector products, as numpy's do. Vectors, batch dims that
broadcast against each other, other dtypes, products of fewer than SHARED_FROM
multiply-adds and forwards without helpers run the reference layer.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from layers.fast import softmax, workers
from layers.fast.team import team_worth_sharing
from layers.attention import ScaledDotProductAttention
from layers.linear import BMM, MM, MatMul
from layers.registry import register_fast_layer

SHARED_FROM = workers.MIN_GEMM_WORK      # multiply-adds: a smaller product runs alone


def shared_product(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b (numpy's shapes and values, not always its bits: bands of an sgemm) through the
    helper team, or None where this does not apply (see the module docstring): then the
    caller runs numpy's. Rows of one value each against one B stay numpy's matrix-vector
    products (one GEMM of them would round otherwise)."""
    if (a.dtype != np.float32 or b.dtype != np.float32 or a.ndim < 2 or b.ndim < 2
            or a.shape[-1] != b.shape[-2] or a.size == 0 or b.size == 0):
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:                            # numpy's error, from numpy's matmul
        return None
    team = team_worth_sharing(math.prod(batch) * m * k * n, SHARED_FROM)
    if team is None:                              # before any copy of the operands
        return None
    if math.prod(batch_b) == 1 and (m > 1 or math.prod(batch_a) == 1):
        a3, products = a.reshape(1, -1, k), 1     # one B: all of A's rows in one product
        b2 = b.reshape(k, n)
    elif batch_a == batch_b or math.prod(batch_a) == 1 and len(batch_a) <= len(batch_b):
        products = math.prod(batch_b)
        a3 = a.reshape(-1, m, k)
        b2 = b.reshape(products, k, n)
    else:                                         # batch dims that broadcast (or rows of
        return None                               # one value against one B): numpy's
    out = np.empty((*batch, m, n), np.float32)
    b3 = b2 if b2.ndim == 3 else b2[None]
    b_t = np.swapaxes(b3, 1, 2)                   # (T, N, K): a transposed view read as is
    transposed = (b_t.flags.c_contiguous and b_t.flags.aligned
                  and not b3.flags.c_contiguous)
    plain = ("C", "A")                            # contiguous and aligned: what BLAS reads
    team.matmul(np.require(a3, np.float32, plain),
                b_t if transposed else np.require(b3, np.float32, plain),
                out.reshape(products, -1, n), transposed=transposed)
    return out


class SharedProduct:
    """forward of a product layer: ``shared_product`` where it applies, else the reference
    layer's."""

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = shared_product(inputs[0], inputs[1]) if len(inputs) == 2 else None
        if out is None:
            return super().forward(inputs)          # type: ignore[misc]
        return [out]


@register_fast_layer("torch.matmul")
class FastMatMul(SharedProduct, MatMul):
    """torch.matmul, shared with the helper threads (``shared_product``)."""


@register_fast_layer("torch.bmm")
class FastBMM(SharedProduct, BMM):
    """torch.bmm, shared with the helper threads (``shared_product``)."""


@register_fast_layer("torch.mm")
class FastMM(SharedProduct, MM):
    """torch.mm, shared with the helper threads (``shared_product``)."""


@register_fast_layer("F.scaled_dot_product_attention")
class FastScaledDotProductAttention(ScaledDotProductAttention):
    """F.scaled_dot_product_attention with both products shared (``shared_product``: the
    keys read transposed as they lie) and softmax.py's kernel over the scores, where there
    is no mask, no causal masking and the query, key and value are float32 with the same
    batch dims; else the reference. Scores that are not all finite (an Inf in the inputs,
    an overflow) also go to the reference: a row of -inf gives zeros there, as in torch,
    where the kernel would give NaN."""

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        query, key, value, mask = self._split(inputs)
        if (mask is None and not self.is_causal
                and min(query.ndim, key.ndim, value.ndim) >= 2
                and all(x.dtype == np.float32 for x in (query, key, value))
                and query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
            scores = shared_product(query, np.swapaxes(key, -1, -2))          # (..., L, S)
            if scores is not None:
                scale = (1.0 / math.sqrt(query.shape[-1]) if self.scale is None
                         else self.scale)
                scores *= np.float32(scale)
                if np.isfinite(scores).all():
                    softmax.softmax_last(scores, scores)
                    out = shared_product(scores, value)
                    return [np.matmul(scores, value) if out is None else out]
        return super().forward(inputs)
