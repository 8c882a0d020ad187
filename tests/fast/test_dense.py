"""dense.py's product (nn.Linear and an attention's projections on the weight's panels, packed
once or as the product goes) against torch and a float64 product: tile edges in rows and
columns, two bands of rows, slices of a long sum, no features at all, with and without a
bias, every activation, Inf and NaN; the same bits from either layout of the weight and on
any number of threads; and the layer that runs it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from layers.fast import backend, dense, pointwise
from layers.fast.epilogue import (CLAMP, GELU, HARDSIGMOID, HARDSWISH, LEAKY, NONE, RELU,
                                  SIGMOID, SILU, TANH, Activation, IDENTITY)
from layers.fast.pointwise_transposed import pack_panels
from layers.fast.layers import TILED_MAX_PACKED
from layers.fast.simd import COLUMNS, ROWS

CASES = {                                       # M, K, N
    "ViT's q, k and v": (197, 384, 1152),
    "a text recognizer's MLP, K in slices": (80, 768, 192),
    "two bands of rows": (dense.BAND + 7, 40, 24),
    "a whole tile": (ROWS, 5, COLUMNS),
    "one row short and one column over": (ROWS - 1, 9, COLUMNS + 1),
    "one row, one feature": (1, 7, 1),
    "three slices of K, a partial panel": (13, 2 * pointwise.K_BLOCK + 31, 21),
    "one feature in": (17, 1, 40),
}
ACTIVATIONS = {                                 # the kernel's, and torch's
    "none": (Activation(NONE), lambda t: t),
    "relu": (Activation(RELU), F.relu),
    "relu6": (Activation(CLAMP, 0.0, 6.0), F.relu6),
    "leaky": (Activation(LEAKY, 0.1), lambda t: F.leaky_relu(t, 0.1)),
    "sigmoid": (Activation(SIGMOID), torch.sigmoid),
    "silu": (Activation(SILU), F.silu),
    "hardswish": (Activation(HARDSWISH), F.hardswish),
    "hardsigmoid": (Activation(HARDSIGMOID), F.hardsigmoid),
    "tanh": (Activation(TANH), torch.tanh),
    "gelu": (Activation(GELU), F.gelu),
}


def data(case, seed=0):
    m, k, n = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    weight = rng.standard_normal((n, k), dtype=np.float32) / np.float32(max(k, 1) ** 0.5)
    bias = rng.standard_normal(n, dtype=np.float32)
    return x, weight, bias


LAYOUTS = ["panels", "as stored"]


def run(x, weight, bias, activation=IDENTITY, layout="panels"):
    backend.start()
    y = np.full((x.shape[0], weight.shape[0]), np.nan, np.float32)
    dense.dense(pack_panels(weight) if layout == "panels" else weight, x, bias, activation, y)
    return y


def torch_says(x, weight, bias, function):
    t = F.linear(torch.from_numpy(x), torch.from_numpy(weight),
                 None if bias is None else torch.from_numpy(bias))
    return function(t).numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_matches_torch_and_a_float64_product(case, with_bias, layout):
    x, weight, bias = data(case)
    bias = bias if with_bias else None
    got = run(x, weight, bias, layout=layout)
    exact = x.astype(np.float64) @ weight.T.astype(np.float64)
    if bias is not None:
        exact += bias
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, torch_says(x, weight, bias, lambda t: t),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("case", ["one row short and one column over",
                                  "three slices of K, a partial panel", "two bands of rows"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
def test_every_activation_after_the_bias(case, name, with_bias):
    x, weight, bias = data(case, seed=1)
    bias = bias if with_bias else None
    ours, theirs = ACTIVATIONS[name]
    got = run(x, weight, bias, ours)
    np.testing.assert_allclose(got, torch_says(x, weight, bias, theirs), rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(run(x, weight, bias, ours, "as stored"), got)


@pytest.mark.parametrize("name", ["none", "relu", "relu6", "gelu"])
def test_inf_and_nan_reach_the_rows_they_reach_in_torch(name):
    """Every feature of a row reads every value of that row of x: a NaN or an Inf there
    spreads to that row only, and the clamps keep a NaN a NaN (as torch does). torch in
    float64: its float32 GELU of +inf is NaN with its AVX-512 kernels and inf with AVX2,
    while in float64 it is x Phi(x) on every CPU (inf at +inf, NaN at -inf), as ours."""
    x, weight, bias = data("three slices of K, a partial panel", seed=2)
    x[0, 3], x[5, -1], x[-1, 0] = np.nan, np.inf, -np.inf
    ours, theirs = ACTIVATIONS[name]
    with np.errstate(invalid="ignore"):
        got = run(x, weight, bias, ours)
    want = torch_says(*(a.astype(np.float64) for a in (x, weight, bias)), theirs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_input_features_give_the_bias(layout):
    x, weight = np.zeros((7, 0), np.float32), np.zeros((5, 0), np.float32)
    bias = np.arange(5, dtype=np.float32) - 2
    got = run(x, weight, bias, Activation(CLAMP, 0.0, 1.5), layout)
    np.testing.assert_array_equal(got, np.broadcast_to(np.clip(bias, 0, 1.5), (7, 5)))
    np.testing.assert_array_equal(run(x, weight, None, layout=layout),
                                  np.zeros((7, 5), np.float32))


def test_operands_that_disagree_are_refused():
    """The kernels read memory as the shapes say: shapes that disagree, panels of another
    width and a y that is not C-contiguous (it would be written as a copy) are refused."""
    x, weight, bias = data("a whole tile")
    with pytest.raises(ValueError, match="disagree"):
        run(x[:, 1:], weight, bias)
    with pytest.raises(ValueError, match="disagree"):
        run(x, weight, bias[1:], layout="as stored")
    wider = pack_panels(np.concatenate([weight, weight, weight]))     # panels for 3N
    with pytest.raises(ValueError, match="disagree"):
        dense.dense(wider, x, bias, IDENTITY, np.empty((x.shape[0], weight.shape[0]),
                                                       np.float32))
    y = np.empty((weight.shape[0], x.shape[0]), np.float32).T
    with pytest.raises(ValueError, match="C-contiguous"):
        dense.dense(weight, x, bias, IDENTITY, y)


@pytest.mark.parametrize("activation", [Activation(CLAMP, 0.0, 6.0), Activation(GELU)],
                         ids=["relu6", "gelu"])
@pytest.mark.parametrize("case", CASES)
def test_any_number_of_threads_gives_the_same_bits(case, activation, team):
    """Each output is the same chain of multiply-adds whichever thread computes its tile, and
    is activated once."""
    x, weight, bias = data(case, seed=3)
    panels = pack_panels(weight)
    alone = np.full((x.shape[0], weight.shape[0]), np.nan, np.float32)
    dense._dense(panels, x[None], bias, alone[None], activation.code, activation.a,
                 activation.b)
    together = np.full_like(alone, np.nan)
    before = team.control[0]
    team.dense(panels, x[None], bias, together[None], dense.NO_SPACE, activation)
    assert team.control[0] != before                       # it ran as a job
    np.testing.assert_array_equal(together, alone)
    as_stored = np.full_like(alone, np.nan)                # packed as it goes: the same bits
    space = np.full((team.threads, dense.space_size(x.shape[1])), np.nan, np.float32)
    team.dense(weight[None], x[None], bias, as_stored[None], space, activation)
    np.testing.assert_array_equal(as_stored, alone)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_forward_with_helpers_shares_it_with_the_same_bits(layout, forward_with_helpers):
    """dense() inside a forward of 2 threads (workers.sharing): the team takes the work, in
    its own work space for a weight packed as it goes, and gives the one-thread kernel's
    bits."""
    x, weight, bias = data("ViT's q, k and v", seed=5)
    gelu = ACTIVATIONS["gelu"][0]
    alone = np.full((x.shape[0], weight.shape[0]), np.nan, np.float32)
    dense._dense(pack_panels(weight), x[None], bias, alone[None], gelu.code, gelu.a, gelu.b)
    before = forward_with_helpers.control[0]
    shared = run(x, weight, bias, gelu, layout)
    assert forward_with_helpers.control[0] != before
    np.testing.assert_array_equal(shared, alone)


@pytest.mark.parametrize("in_features", [24, TILED_MAX_PACKED // 4 // 40 + 1],
                         ids=["small weight: panels", "large weight: as stored"])
@pytest.mark.parametrize("activation", [None, "nn.GELU", "nn.GELU approximate=tanh"])
def test_linear_layer_runs_dense_from_16_rows(in_features, activation):
    """From 16 rows nn.Linear runs dense.py, on a copy of a small weight packed at prepare,
    on a large one as stored (no copy); GELU's tanh form, which the kernels lack, after."""
    from helpers import make_layer, torch_module

    params = dict(in_features=in_features, out_features=40, bias=True)
    fc, weights = torch_module(torch.nn.Linear, **params)
    layer = make_layer("nn.Linear", params, weights, fast=True)
    want = fc
    if activation is not None:
        name, *extra = activation.split()
        options = dict(e.split("=") for e in extra)
        layer.fuse_activation(make_layer(name, options, fast=True))
        want = torch.nn.Sequential(fc, torch.nn.GELU(**options))
    x = np.random.default_rng(4).standard_normal((2, 9, in_features), dtype=np.float32)
    layer.prepare([x.shape])
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_dense", "_dense_rows"):
            original = getattr(dense, name)
            patch.setattr(dense, name, lambda *a, name=name, original=original: (
                calls.append(name), original(*a)))
        got = layer.forward([x])[0]
    with torch.no_grad():
        expected = want(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
    small = in_features == 24
    assert ("_tiled" in layer.__dict__) == small             # a copy of a small weight only
    assert calls == ["_dense" if small else "_dense_rows"]
