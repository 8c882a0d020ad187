"""Embedding lookup: ``nn.Embedding`` (and ``F.embedding`` with a constant weight, which pnnx
writes as an ``nn.Embedding`` line).

pnnx writes ``num_embeddings``, ``embedding_dim``, ``sparse`` and the @weight. It drops
``padding_idx`` (it only affects training) and ``max_norm``: torch renormalises the rows it
looks up when max_norm is set, and the exported file does not; renormalise the weight before
exporting (``emb.weight.data = torch.renorm(emb.weight.data, 2, 0, max_norm)``).
"""

from __future__ import annotations

import numpy as np

from layers.base import Layer, Param, Shape, as_bool, as_int, at_least, expect_shape
from layers.registry import register_layer
from parser.errors import ShapeError


@register_layer("nn.Embedding")
class Embedding(Layer):
    """``nn.Embedding``: each integer index picks one row of the weight table::

        y[..., :] = weight[indices[...], :]   indices (...) int, weight (num, dim) -> y (..., dim)
    """

    num_embeddings = Param(convert=at_least(1, as_int))
    embedding_dim = Param(convert=at_least(1, as_int))
    sparse = Param(False, as_bool)                   # a training option; no effect here
    WEIGHTS = ("weight",)
    weight: np.ndarray

    def check_weights(self) -> None:
        expect_shape("@weight", self.weight.shape, (self.num_embeddings, self.embedding_dim))

    def infer_shape(self, shape: Shape) -> Shape:
        return (*shape, self.embedding_dim)

    def forward_one(self, indices: np.ndarray) -> np.ndarray:
        if indices.dtype.kind not in "iu":
            raise ShapeError(f"expects integer indices, got dtype {indices.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_embeddings):
            bad = indices[(indices < 0) | (indices >= self.num_embeddings)].flat[0]
            raise ShapeError(f"index {bad} is out of range for {self.num_embeddings} "
                             f"embeddings (0 .. {self.num_embeddings - 1})")
        rows: np.ndarray = self.weight[indices]              # (..., embedding_dim), a copy
        return rows
