"""Attention: ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention``.

Both compute, for queries q (L of them), keys k and values v (S of them)::

    weights = softmax(q @ k.T * scale + mask)        # (L, S): how much each query reads each key
    out     = weights @ v                            # (L, Ev)

``mask`` is additive: 0 where a query may look, -inf where it may not. A boolean mask is turned
into that form, but the two torch functions read booleans the opposite way round:
``F.scaled_dot_product_attention`` takes True = *may attend*, ``nn.MultiheadAttention`` True =
*masked out*.

How pnnx writes them (found by exporting, pnnx 20261020):

* ``F.scaled_dot_product_attention``: inputs query, key, value[, attn_mask]; parameters
  ``dropout_p``, ``is_causal``, ``scale`` (absent = 1/sqrt(E)), ``enable_gqa``, and
  ``attn_mask=None`` when there is no mask input.
* ``nn.MultiheadAttention``: its distinct input operands only: one for self-attention
  ``m(x, x, x)``, two read as (query, key = value), three as (query, key, value) -- as pnnx's
  own python re-export reads them (so ``m(x, x, y)`` is mis-exported by pnnx). A float
  ``attn_mask`` is an input named ``$attn_mask``. pnnx writes a *boolean* attn_mask or
  key_padding_mask as an unnamed first input, which its re-export then passes as the query:
  such files are refused with a ShapeError; use a float mask (0 / -inf) instead. pnnx also
  names a float key_padding_mask ``attn_mask``; a mask whose shape fits only a key padding
  mask is refused with that explanation. Dropout is never applied (inference).
  The second output, the attention weights, exists when the model uses it; they are averaged
  over the heads (``average_attn_weights=False`` is not recorded by pnnx).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, Param, Shape, as_bool, as_float, as_int, at_least,
                         check_bias_flag, expect_shape)
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


# ================================================================ kernels

def additive_mask(mask: np.ndarray, masked_value: bool) -> np.ndarray:
    """A float32 mask to add to attention scores. A boolean mask becomes -inf where it equals
    ``masked_value`` and 0 elsewhere; a float mask is returned as is."""
    if mask.dtype == np.bool_:
        return np.where(mask == masked_value, np.float32(-np.inf), np.float32(0.0))
    return mask.astype(np.float32, copy=False)


def causal_mask(length: int, source_length: int) -> np.ndarray:
    """is_causal: query i may look at keys 0..i (torch's lower-triangular ones(L, S).tril())."""
    allowed = np.tril(np.ones((length, source_length), dtype=bool))
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))


def softmax_masked(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last dim where a row with every score -inf gives zeros, not NaN (as
    ``F.scaled_dot_product_attention`` does since torch 2.5)."""
    row_max = scores.max(axis=-1, keepdims=True)
    blocked = np.isneginf(row_max)
    weights = np.exp(scores - np.where(blocked, np.float32(0.0), row_max))
    total = weights.sum(axis=-1, keepdims=True)
    return weights / np.where(blocked, np.float32(1.0), total)


def scaled_dot_product_attention(query: np.ndarray, key: np.ndarray, value: np.ndarray,
                                 attn_mask: np.ndarray | None = None, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False
                                 ) -> np.ndarray:
    """``F.scaled_dot_product_attention`` without dropout: query (..., L, E), key (..., S, E),
    value (..., S, Ev), batch dims broadcasting -> (..., L, Ev). A boolean attn_mask is True
    where a query may attend; a float one is added to the scores. ``enable_gqa``: key and value
    have fewer heads (dim -3) than the query, each serving ``Hq / Hk`` query heads."""
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = np.repeat(key, repeats, axis=-3)                   # (..., Hq, S, E)
        value = np.repeat(value, repeats, axis=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = np.matmul(query, np.swapaxes(key, -1, -2)) * np.float32(scale)   # (..., L, S)
    if is_causal:
        scores = scores + causal_mask(query.shape[-2], key.shape[-2])
    if attn_mask is not None:
        scores = scores + additive_mask(attn_mask, masked_value=False)
    return np.matmul(softmax_masked(scores), value)              # (..., L, Ev)


# ================================================================ F.scaled_dot_product_attention

def _must_be_none(value: object) -> None:
    """pnnx writes ``attn_mask=None`` when there is no mask; a real mask is always an input."""
    raise ValueError("the mask is the 4th input; only attn_mask=None is accepted")


def sdpa_output_shape(query: Shape, key: Shape, value: Shape, mask: Shape | None,
                      enable_gqa: bool) -> Shape:
    """Shape of ``F.scaled_dot_product_attention``'s output, or ShapeError."""
    if min(len(query), len(key), len(value)) < 2:
        raise ShapeError(f"query, key and value need at least 2 dims (..., L, E); got "
                         f"{tuple(query)}, {tuple(key)}, {tuple(value)}")
    if query[-1] != key[-1]:
        raise ShapeError(f"query {tuple(query)} and key {tuple(key)} differ in their last dim "
                         f"(the embedding size E)")
    if key[-2] != value[-2]:
        raise ShapeError(f"key {tuple(key)} and value {tuple(value)} differ in dim -2 (the "
                         f"source length S)")
    key_batch, value_batch = tuple(key[:-2]), tuple(value[:-2])
    if enable_gqa and len(query) >= 3 and key[-3] != query[-3]:
        heads, kv_heads = query[-3], key[-3]
        if kv_heads == 0 or heads % kv_heads or value[-3] != kv_heads:
            raise ShapeError(f"enable_gqa: the query's {heads} heads must be a multiple of the "
                             f"key's and value's heads, got {tuple(key)} and {tuple(value)}")
        key_batch = (*key[:-3], heads)
        value_batch = (*value[:-3], heads)
    scores = (*_broadcast(query[:-2], key_batch, "query", "key"), query[-2], key[-2])
    if mask is not None:
        try:
            scores = np.broadcast_shapes(scores, tuple(mask))
        except ValueError:
            raise ShapeError(f"attn_mask {tuple(mask)} does not broadcast to the scores "
                             f"{scores} (..., L, S)") from None
    batch = _broadcast(scores[:-2], value_batch, "scores", "value")
    return (*batch, query[-2], value[-1])


def _broadcast(a: Sequence[int], b: Sequence[int], what_a: str, what_b: str) -> Shape:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise ShapeError(f"the batch dims of {what_a} {tuple(a)} and {what_b} {tuple(b)} do "
                         f"not broadcast") from None


@register_layer("F.scaled_dot_product_attention")
class ScaledDotProductAttention(Layer):
    """``F.scaled_dot_product_attention(query, key, value[, attn_mask])``::

        out = softmax(query @ key.T * scale + mask) @ value
        query (..., L, E), key (..., S, E), value (..., S, Ev) -> out (..., L, Ev)

    scale defaults to 1/sqrt(E); ``is_causal`` lets query i see keys 0..i only; a boolean
    attn_mask is True where a query may attend. A query row that may see no key gives zeros.
    """

    attn_mask = Param(None, _must_be_none)
    dropout_p = Param(0.0, as_float)             # not applied: inference
    is_causal = Param(False, as_bool)
    scale = Param(None, as_float)
    enable_gqa = Param(False, as_bool)
    one_blob_only = False

    def check_params(self) -> None:
        if not 0.0 <= self.dropout_p <= 1.0:
            raise LayerError(f"dropout_p={self.dropout_p} is not a probability")

    def _split(self, inputs: Sequence) -> tuple:
        if len(inputs) not in (3, 4):
            raise ShapeError(f"expects 3 or 4 inputs (query, key, value[, attn_mask]), got "
                             f"{len(inputs)}")
        query, key, value, *mask = inputs
        mask = mask[0] if mask else None
        if mask is not None and self.is_causal:
            raise ShapeError("is_causal=True and an attn_mask input cannot be used together "
                             "(torch refuses it too)")
        return query, key, value, mask

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        query, key, value, mask = self._split(input_shapes)
        return [sdpa_output_shape(query, key, value, mask, self.enable_gqa)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        query, key, value, mask = self._split(inputs)
        out = scaled_dot_product_attention(query, key, value, mask, self.is_causal, self.scale,
                                           self.enable_gqa)
        return [out.astype(np.float32, copy=False)]


# ================================================================ nn.MultiheadAttention

@register_layer("nn.MultiheadAttention")
class MultiheadAttention(Layer):
    """``nn.MultiheadAttention`` in eval mode: ``num_heads`` attentions side by side, each on a
    ``head_dim = embed_dim / num_heads`` slice of the projected inputs::

        q = query @ Wq.T + bq      k = key @ Wk.T + bk      v = value @ Wv.T + bv
        head_h = softmax(q_h @ k_h.T / sqrt(head_dim) + mask) @ v_h
        out = concat(head_1 .. head_H) @ Wo.T + bo
        query (N, L, E), key (N, S, kdim), value (N, S, vdim) -> out (N, L, E)
        [, weights (N, L, S): the softmax averaged over the heads]

    ``batch_first=False`` (the default) means (L, N, E) inputs and outputs; 2-D inputs are one
    unbatched sequence. Wq, Wk, Wv are the thirds of ``in_proj_weight`` (or ``q/k/v_proj_weight``
    when kdim or vdim differ from embed_dim). ``add_bias_kv`` appends the learnt ``bias_k`` /
    ``bias_v`` as one more key and value; ``add_zero_attn`` appends a zero key and value per
    head. attn_mask is (L, S) or (N * num_heads, L, S), additive, or boolean with True = blocked.
    """

    embed_dim = Param(convert=at_least(1, as_int))
    num_heads = Param(convert=at_least(1, as_int))
    kdim = Param(None, at_least(1, as_int))
    vdim = Param(None, at_least(1, as_int))
    bias = Param(True, as_bool)
    batch_first = Param(False, as_bool)
    add_bias_kv = Param(False, as_bool)
    add_zero_attn = Param(False, as_bool)
    WEIGHTS = ("out_proj.weight",)
    OPTIONAL_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                        "in_proj_bias", "out_proj.bias", "bias_k", "bias_v")
    one_blob_only = False
    num_outputs = 1                   # the graph sets 2 when the model reads the weights too
    input_names: Sequence[str] = ()   # the graph sets them: which input is ``$attn_mask``

    def check_params(self) -> None:
        self.kdim = self.kdim or self.embed_dim
        self.vdim = self.vdim or self.embed_dim
        if self.embed_dim % self.num_heads:
            raise LayerError(f"embed_dim={self.embed_dim} is not divisible by "
                             f"num_heads={self.num_heads}")
        self.head_dim = self.embed_dim // self.num_heads
        self.has_bias = self.bias

    def check_weights(self) -> None:
        E = self.embed_dim
        if self.in_proj_weight is not None:
            expect_shape("@in_proj_weight", self.in_proj_weight.shape, (3 * E, E))
            if (self.kdim, self.vdim) != (E, E):
                raise LayerError(f"kdim={self.kdim}, vdim={self.vdim} differ from "
                                 f"embed_dim={E}: expected @q/k/v_proj_weight, not @in_proj_weight")
            self.q_weight, self.k_weight, self.v_weight = np.split(self.in_proj_weight, 3)
        else:
            for key, width in (("q", E), ("k", self.kdim), ("v", self.vdim)):
                weight = getattr(self, f"{key}_proj_weight")
                if weight is None:
                    raise LayerError(f"missing weight @in_proj_weight (or @{key}_proj_weight)")
                expect_shape(f"@{key}_proj_weight", weight.shape, (E, width))
                setattr(self, f"{key}_weight", weight)
        self.out_weight = getattr(self, "out_proj.weight")
        self.out_bias = getattr(self, "out_proj.bias")
        expect_shape("@out_proj.weight", self.out_weight.shape, (E, E))
        check_bias_flag(self.has_bias, self.in_proj_bias)
        check_bias_flag(self.has_bias, self.out_bias)
        self.q_bias = self.k_bias = self.v_bias = None
        if self.has_bias:
            expect_shape("@in_proj_bias", self.in_proj_bias.shape, (3 * E,))
            expect_shape("@out_proj.bias", self.out_bias.shape, (E,))
            self.q_bias, self.k_bias, self.v_bias = np.split(self.in_proj_bias, 3)
        if self.add_bias_kv != (self.bias_k is not None and self.bias_v is not None):
            raise LayerError(f"add_bias_kv={self.add_bias_kv} disagrees with the @bias_k / "
                             f"@bias_v weights")
        if self.add_bias_kv:
            expect_shape("@bias_k", self.bias_k.shape, (1, 1, E))
            expect_shape("@bias_v", self.bias_v.shape, (1, 1, E))

    # ----- inputs ---------------------------------------------------------------------------
    def _split(self, inputs: Sequence) -> tuple:
        """(query, key, value, attn_mask or None) from the operator's inputs (arrays or
        shapes): the one named ``attn_mask`` is the mask, the others are the distinct
        operands of (query, key, value)."""
        names = list(self.input_names) + [""] * (len(inputs) - len(self.input_names))
        mask = [x for x, name in zip(inputs, names) if name == "attn_mask"]
        qkv = [x for x, name in zip(inputs, names) if name != "attn_mask"]
        if len(qkv) not in (1, 2, 3) or len(mask) > 1:
            raise ShapeError(f"expects 1 to 3 inputs (query[, key[, value]]) and an optional "
                             f"$attn_mask, got {len(inputs)} inputs named {names}")
        if len(qkv) == 1:
            qkv = qkv * 3                                    # self-attention m(x, x, x)
        elif len(qkv) == 2:
            qkv = [qkv[0], qkv[1], qkv[1]]                   # m(q, kv, kv)
        return (*qkv, mask[0] if mask else None)

    def _shapes(self, input_shapes: Sequence[Shape]) -> tuple[int, int, int]:
        """(N, L, S) for the operator's input shapes (N = 1 unbatched), or ShapeError. Where
        pnnx wrote a boolean mask as an unnamed first input (and may name the query
        ``attn_mask`` then), the error says so."""
        query, key, value, mask = self._split([tuple(s) for s in input_shapes])
        try:
            return self._check_shapes(query, key, value, mask)
        except ShapeError as err:
            if len(input_shapes) > 1:
                raise ShapeError(f"{err.message}. If the model passes a boolean attn_mask or "
                                 f"key_padding_mask: pnnx writes it as an unnamed first input "
                                 f"(its own re-export then passes it as the query), so give "
                                 f"the model a float mask (0 where allowed, -inf where "
                                 f"blocked) instead") from None
            raise

    def _check_shapes(self, query: Shape, key: Shape, value: Shape, mask: Shape | None
                      ) -> tuple[int, int, int]:
        """(N, L, S) for these input shapes (N = 1 unbatched), or ShapeError."""
        if len(query) not in (2, 3):
            raise ShapeError(f"expects a 3-D batched or 2-D unbatched query, got "
                             f"{tuple(query)}")
        if len(key) != len(query) or len(value) != len(query):
            raise ShapeError(f"query {tuple(query)}, key {tuple(key)} and value {tuple(value)} "
                             f"must all be batched (3-D) or all unbatched (2-D)")
        seq, batch = (0, 1) if not self.batch_first else (1, 0)
        if len(query) == 2:
            seq, batch = 0, None
        N = 1 if batch is None else query[batch]
        L, S = query[seq], key[seq]
        for what, shape, width in (("query", query, self.embed_dim), ("key", key, self.kdim),
                                   ("value", value, self.vdim)):
            if shape[-1] != width:
                raise ShapeError(f"{what} {tuple(shape)} has {shape[-1]} features in its last "
                                 f"dim, expected {width}")
            if batch is not None and shape[batch] != N:
                raise ShapeError(f"{what} {tuple(shape)} has batch size {shape[batch]}, the "
                                 f"query {N} (batch_first={self.batch_first})")
        if value[seq] != S:
            raise ShapeError(f"key {tuple(key)} and value {tuple(value)} differ in length")
        if mask is not None:
            self._check_mask(tuple(mask), N, L, S)
        return N, L, S

    def _check_mask(self, mask: Shape, N: int, L: int, S: int) -> None:
        allowed = [(L, S), (N * self.num_heads, L, S)]
        if mask not in allowed:
            hint = ""
            if mask in ((N, S), (S,)):
                hint = ("; pnnx names a float key_padding_mask 'attn_mask': fold it into an "
                        "(N * num_heads, L, S) attn_mask in the model instead")
            raise ShapeError(f"attn_mask {mask} should be {allowed[0]} or {allowed[1]}{hint}")

    # ----- shapes and forward ---------------------------------------------------------------
    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        N, L, S = self._shapes(input_shapes)
        query = tuple(self._split(input_shapes)[0])
        S += int(self.add_bias_kv) + int(self.add_zero_attn)
        shapes = [tuple(query[:-1]) + (self.embed_dim,)]
        if self.num_outputs == 2:
            shapes.append((N, L, S) if len(query) == 3 else (L, S))
        return shapes

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        N, L, S = self._shapes([x.shape for x in inputs])
        query, key, value, mask = self._split(inputs)
        batched = query.ndim == 3
        query, key, value = (self._batch_first(x) for x in (query, key, value))  # (N, len, dim)
        q, k, v = self._project_qkv(query, key, value)    # (N, L, E), (N, S, E), (N, S, E)
        bias = None if mask is None else additive_mask(mask, masked_value=True)
        if bias is not None and bias.ndim == 3:
            bias = bias.reshape(N, self.num_heads, L, S)               # (N, H, L, S)
        if self.add_bias_kv:
            k = np.concatenate([k, np.broadcast_to(self.bias_k, (N, 1, self.embed_dim))], 1)
            v = np.concatenate([v, np.broadcast_to(self.bias_v, (N, 1, self.embed_dim))], 1)
            bias = _pad_last(bias)
        q, k, v = (self._heads(x) for x in (q, k, v))                  # (N, H, len, hd)
        if self.add_zero_attn:
            zeros = np.zeros((N, self.num_heads, 1, self.head_dim), np.float32)
            k, v = np.concatenate([k, zeros], 2), np.concatenate([v, zeros], 2)
            bias = _pad_last(bias)
        scores = self._products(q * np.float32(1.0 / math.sqrt(self.head_dim)), k,
                                transposed=True)                       # (N, H, L, S')
        if bias is not None:
            scores = scores + bias
        weights = self._softmax(scores)                                # a blocked row: NaN
        out = self._products(weights, v).transpose(0, 2, 1, 3).reshape(N, L, self.embed_dim)
        out = self._project(out, self.out_weight, self.out_bias)       # (N, L, E)
        if not batched:
            out = out[0]                                               # (L, E)
        elif not self.batch_first:
            out = out.transpose(1, 0, 2)                               # (L, N, E)
        results = [np.ascontiguousarray(out)]
        if self.num_outputs == 2:
            mean = weights.mean(axis=1)                                # (N, L, S')
            results.append(mean if batched else mean[0])
        return results

    def _project_qkv(self, query: np.ndarray, key: np.ndarray, value: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The query, key and value projections (a fast layer makes one product of them
        for self-attention)."""
        return (self._project(query, self.q_weight, self.q_bias),
                self._project(key, self.k_weight, self.k_bias),
                self._project(value, self.v_weight, self.v_bias))

    def _project(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None
                 ) -> np.ndarray:
        """x @ weight.T + bias over the last dim (a fast layer shares it over threads)."""
        return kernels.linear(x, weight, bias)

    def _softmax(self, scores: np.ndarray) -> np.ndarray:
        """The softmax of the scores over the keys (the last dim; a fast layer's kernel)."""
        with np.errstate(invalid="ignore"):
            return kernels.softmax(scores, -1)

    def _products(self, a: np.ndarray, b: np.ndarray, transposed: bool = False) -> np.ndarray:
        """a @ b (a @ b^T if ``transposed``) over the last two dims, the others batched."""
        return np.matmul(a, np.swapaxes(b, -1, -2) if transposed else b)

    def _batch_first(self, x: np.ndarray) -> np.ndarray:
        """(N, len, dim) view of a batched (batch_first or not) or unbatched input."""
        if x.ndim == 2:
            return x[None]
        return x if self.batch_first else x.transpose(1, 0, 2)

    def _heads(self, x: np.ndarray) -> np.ndarray:
        """(N, len, E) -> (N, H, len, head_dim)."""
        N, length, _ = x.shape
        return x.reshape(N, length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)


def _pad_last(bias: np.ndarray | None) -> np.ndarray | None:
    """One more key: a mask gets a 0 (not blocked) column at the end, as torch pads it."""
    if bias is None:
        return None
    return np.concatenate([bias, np.zeros((*bias.shape[:-1], 1), np.float32)], axis=-1)
