"""The fast floor's softmax (layers/fast/softmax.py): torch's values over the last dim within
4x torch's own float32 error against float64, torch's NaN rows (a NaN, a row of -inf, +inf),
the same values on one thread or two, and attention's softmax through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import make_layer, rand
from infer import threads
from layers.fast.layers import FastSoftmax


@pytest.mark.parametrize("shape", [(1, 6, 197, 197), (3, 5), (7,), (2, 1000), (4, 3, 1),
                                   (0, 5), (2, 0), (1, 9, 80, 80)], ids=str)
def test_fast_softmax_matches_torch_on_any_threads(shape):
    x = rand(*shape) * 8
    layer = make_layer("nn.Softmax", {"dim": -1}, fast=True)
    assert isinstance(layer, FastSoftmax)
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    got = []
    for num_threads in (1, 2):
        with threads.limit(num_threads):
            (y,) = layer.forward([x])
            into = np.full(x.shape, np.nan, np.float32)
            layer.forward_into([x], [into])
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(into, y)
        got.append(y)
    np.testing.assert_array_equal(got[0], got[1])


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_fast_softmax_is_as_exact_as_torchs(scale):
    x = (np.random.default_rng(3).standard_normal((512, 300)) * scale).astype(np.float32)
    exact = torch.softmax(torch.from_numpy(x).double(), -1).numpy()
    torch_error = np.abs(torch.softmax(torch.from_numpy(x), -1).numpy() - exact).max()
    (y,) = make_layer("nn.Softmax", {"dim": 1}, fast=True).forward([x])
    assert np.abs(y - exact).max() <= 4 * torch_error


def test_nan_and_infinite_rows_as_torch():
    x = rand(5, 6)
    x[0, 2] = np.nan
    x[1] = -np.inf
    x[2, 4] = np.inf
    x[3, 1] = -np.inf                                  # one blocked key: 0 there
    (y,) = make_layer("F.softmax", {"dim": -1}, fast=True).forward([x])
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(y[ok], want[ok], rtol=1e-6, atol=1e-7)


def test_other_dims_and_dtypes_run_the_reference():
    x = rand(3, 4, 5)
    layer = make_layer("nn.Softmax", {"dim": 1}, fast=True)
    (y,) = layer.forward([x])
    np.testing.assert_allclose(y, torch.softmax(torch.from_numpy(x), 1).numpy(), rtol=1e-6)
    x64 = x.astype(np.float64)
    (y64,) = make_layer("nn.Softmax", {"dim": -1}, fast=True).forward([x64])
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, torch.softmax(torch.from_numpy(x64), -1).numpy())
