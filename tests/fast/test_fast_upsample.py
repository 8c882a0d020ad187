"""Nearest upsampling by whole factors on the fast floor (layers/fast/upsample.py, the
FastInterpolate layer): torch's values bit for bit (NaN and Inf copied as they are), into the
planned buffer, shared with a helper thread, and every other resizing left to the
reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import make_layer, rand
from layers.fast import upsample, workers


def _spy(monkeypatch) -> list:
    calls: list = []
    kernel = upsample.upsample_nearest
    monkeypatch.setattr(upsample, "upsample_nearest",
                        lambda *args: calls.append(args[2:]) or kernel(*args))
    return calls


@pytest.mark.parametrize("shape, params", [
    ((1, 3, 5, 7), {"scale_factor": 2.0}), ((2, 4, 3, 3), {"scale_factor": (1.0, 4.0)}),
    ((1, 2, 4, 5), {"size": (12, 10)}), ((1, 96, 17, 23), {"scale_factor": 8.0}),
    ((1, 1, 1, 1), {"scale_factor": 3.0}), ((0, 2, 3, 4), {"scale_factor": 2.0}),
    ((1, 2, 3, 4), {"scale_factor": 2.0, "mode": "nearest-exact"}),
], ids=str)
def test_whole_factors_run_the_kernel_and_copy_torchs_values(monkeypatch, shape, params):
    calls = _spy(monkeypatch)
    x = rand(*shape)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf][:x.size]
    layer = make_layer("F.interpolate", {"mode": "nearest", **params}, fast=True)
    want = F.interpolate(torch.from_numpy(x), size=params.get("size"),
                         scale_factor=params.get("scale_factor"),
                         mode=params.get("mode", "nearest")).numpy()
    (got,) = layer.forward([x])
    np.testing.assert_array_equal(got, want)
    out = np.full(want.shape, 7.0, np.float32)              # the graph's way: into a buffer
    layer.forward_into([x], [out])
    np.testing.assert_array_equal(out, want)
    assert len(calls) == 2


@pytest.mark.parametrize("factors", [(2, 2), (8, 8), (1, 3)])
def test_a_helper_thread_gives_the_same_bits(monkeypatch, team_calls, factors):
    monkeypatch.setattr(upsample, "SHARED_FROM", 1)             # every call is shared
    shared = team_calls("upsample")
    x = rand(2, 24, 9, 11)
    y = np.empty((2, 24, 9 * factors[0], 11 * factors[1]), np.float32)
    with workers.sharing(2) as team:
        if team is None:
            pytest.skip("no helper team here (numpy's OpenBLAS not found)")
        upsample.upsample_nearest(x, y, *factors)
    want = F.interpolate(torch.from_numpy(x), scale_factor=factors, mode="nearest").numpy()
    np.testing.assert_array_equal(y, want)
    assert shared == [1]


@pytest.mark.parametrize("x, params", [
    (rand(1, 2, 4, 6)[:, :, :, ::2], {"scale_factor": 2.0}),                  # strided
    (rand(1, 2, 4, 3).astype(np.float64), {"scale_factor": 2.0}),           # float64
    (rand(1, 2, 4, 3), {"scale_factor": 1.5}),                              # not whole
    (rand(1, 2, 4, 3), {"scale_factor": 2.0, "mode": "bilinear"}),
    (rand(1, 2, 3, 4, 5), {"scale_factor": 2.0}),                           # 5-D
], ids=["strided", "float64", "factor 1.5", "bilinear", "5-d"])
def test_every_other_resizing_runs_the_reference(monkeypatch, x, params):
    calls = _spy(monkeypatch)
    layer = make_layer("F.interpolate", {"mode": "nearest", **params}, fast=True)
    want = F.interpolate(torch.from_numpy(x.copy()), scale_factor=params["scale_factor"],
                         mode=params.get("mode", "nearest")).numpy()
    (got,) = layer.forward([x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.dtype == want.dtype and not calls


@pytest.mark.parametrize("type_name", ["F.upsample_nearest", "nn.UpsamplingNearest2d"])
def test_upsample_nearest_runs_the_kernel_too(monkeypatch, type_name):
    calls = _spy(monkeypatch)
    x = rand(1, 3, 4, 5)
    layer = make_layer(type_name, {"scale_factor": 2.0}, fast=True)
    (got,) = layer.forward([x])
    np.testing.assert_array_equal(got, F.interpolate(torch.from_numpy(x), scale_factor=2.0,
                                                     mode="nearest").numpy())
    assert calls == [(2, 2)]
