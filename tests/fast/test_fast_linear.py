"""The fast floor's nn.Linear (layers/fast/layers.py, FastLinear): from TILED_FROM rows in
register tiles with the bias as one more row of the transposed weight and the activation in
the tiles, else BLAS; torch's values either way, the same bits on one thread or two, into a
given buffer (forward_into) as into its own."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import make_layer, rand
from infer import threads
from layers.fast.layers import FastLinear

# the module itself (layers.fast binds the name ``layers`` to the top-level package)
fast_layers = importlib.import_module("layers.fast.layers")


def _layer(in_features, out_features, bias, activation=None):
    rng = np.random.default_rng(in_features * 7 + out_features)
    weight = rng.standard_normal((out_features, in_features), dtype=np.float32)
    weights = {"weight": weight}
    if bias:
        weights["bias"] = rng.standard_normal(out_features, dtype=np.float32)
    layer = make_layer("nn.Linear", dict(in_features=in_features, out_features=out_features,
                                         bias=bias), weights, fast=True)
    if activation is not None:
        act = make_layer(activation, fast=True)
        assert layer.can_fuse_activation(act)
        layer.fuse_activation(act)
    return layer, weights


@pytest.mark.parametrize("shape", [(197, 384), (1, 197, 64), (2, 8, 3, 24), (16, 5), (15, 5),
                                   (1, 40), (0, 12)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation, torch_fn", [(None, lambda t: t), ("nn.GELU", F.gelu),
                                                  ("nn.ReLU", F.relu)], ids=["none", "gelu",
                                                                               "relu"])
def test_fast_linear_matches_torch(shape, bias, activation, torch_fn):
    out_features = 48
    layer, weights = _layer(shape[-1], out_features, bias, activation)
    assert isinstance(layer, FastLinear)
    x = rand(*shape)
    want = torch_fn(F.linear(torch.from_numpy(x), torch.from_numpy(weights["weight"]),
                             None if not bias else torch.from_numpy(weights["bias"]))).numpy()
    results = []
    for num_threads in (1, 2):
        with threads.limit(num_threads):
            (got,) = layer.forward([x])
            into = np.full(want.shape, np.nan, np.float32)
            layer.forward_into([x], [into])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(into, got)
        results.append(got)
    np.testing.assert_array_equal(results[0], results[1])          # same bits


def test_tiles_and_blas_agree_and_only_many_rows_pack(monkeypatch):
    layer, _ = _layer(64, 32, True)
    few = rand(fast_layers.TILED_FROM - 1, 64)
    layer.forward([few])
    assert layer.tiled.packed is None                 # BLAS on the weight as stored
    many = rand(fast_layers.TILED_FROM, 64)
    (tiled,) = layer.forward([many])
    assert layer.tiled.packed.shape == (1, 65, 32)    # weight.T and the bias below it
    monkeypatch.setattr(fast_layers, "TILED_FROM", 10**9)
    (blas,) = layer.forward([many])
    np.testing.assert_allclose(tiled, blas, rtol=1e-5, atol=1e-5)


def test_a_nan_in_one_row_stays_in_that_row():
    layer, _ = _layer(20, 8, True)
    x = rand(32, 20)
    x[5, 3] = np.nan
    (y,) = layer.forward([x])
    assert np.isnan(y[5]).all() and np.isfinite(np.delete(y, 5, axis=0)).all()


def test_the_traced_size_packs_at_build():
    layer, _ = _layer(16, 8, True)
    layer.prepare([(1, 4, 16)])                         # 4 rows: BLAS, nothing to pack
    assert layer.tiled.packed is None
    layer.prepare([(2, 30, 16)])
    assert layer.tiled.packed is not None
