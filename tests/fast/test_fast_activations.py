"""The fast floor's activation layers and exp (layers/fast/vexp.py): sigmoid and SiLU through
the vectorised exp, and tanh, stay within 4x torch's own float32 error against float64 over
the whole float32 range, keep torch's answers at the edges (inf, -inf, NaN, overflow,
underflow), and give the same values on one thread or shared; the epilogue's piecewise
activations give torch's bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import layers.fast  # noqa: F401  (registers the fast layers)
from infer import threads
from layers.fast.epilogue import (CLAMP, LEAKY, RELU, Activation,
                                   bias_residual_activation)
from layers.fast.layers import (FastHardsigmoid, FastHardswish, FastSigmoid, FastSiLU,
                                FastTanh, KernelActivationLayer)
from layers.registry import LayerRegisterer

FAST = {            # fast layer, torch function, float64 formula
    "sigmoid": (FastSigmoid, torch.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
    "silu": (FastSiLU, F.silu, lambda v: v / (1 + np.exp(-v))),
    "hardswish": (FastHardswish, F.hardswish, lambda v: v * np.clip(v + 3, 0, 6) / 6),
    "hardsigmoid": (FastHardsigmoid, F.hardsigmoid, lambda v: np.clip(v + 3, 0, 6) / 6),
    "tanh": (FastTanh, torch.tanh, np.tanh),
}
EDGES = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30, 1e-40, 88.72, 88.73,
                    -87.33, -87.34, -103.0, -104.0, 3.0, -3.0, 1e4, -1e4])


def _sweep() -> np.ndarray:
    """Every scale of float32 that sigmoid distinguishes: a dense line over [-120, 120], and
    random values of every magnitude."""
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(100_000) * 10.0 ** rng.uniform(-8, 2, 100_000)
    return np.concatenate([np.linspace(-120, 120, 400_001), spread]).astype(np.float32)


@pytest.mark.parametrize("name", FAST)
def test_fast_activation_is_as_exact_as_torchs(name):
    """max |fast - f64| <= 4 max |torch f32 - f64|, also relative to the value (where it is
    above the smallest normal float)."""
    layer_class, torch_fn, formula = FAST[name]
    x = _sweep()
    with np.errstate(over="ignore"):
        want = formula(x.astype(np.float64))
    ours = x.copy()
    layer_class().forward_inplace(ours)
    theirs = torch_fn(torch.from_numpy(x)).numpy()
    error, torch_error = np.abs(ours - want), np.abs(theirs - want)
    assert error.max() <= 4 * torch_error.max()
    normal = np.abs(want) > np.finfo(np.float32).tiny
    scale = np.abs(want[normal])
    assert (error[normal] / scale).max() <= 4 * max((torch_error[normal] / scale).max(), 6e-8)


@pytest.mark.parametrize("name", FAST)
def test_fast_activation_edges_as_torch(name):
    layer_class, torch_fn, _ = FAST[name]
    ours = EDGES.copy()
    layer_class().forward_inplace(ours)
    want = torch_fn(torch.from_numpy(EDGES)).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(want))
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-37)
    numbers = ~np.isnan(want)                                           # -0.0 stays -0.0
    np.testing.assert_array_equal(np.signbit(ours[numbers]), np.signbit(want[numbers]))


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("shape", [(2, 3, 17, 9), (1, 80, 2100), (5,), (), (0, 4), (3, 0)])
def test_fast_activation_in_a_graph_shape_on_threads(name, shape):
    """Any shape (0-d, empty, large enough to be shared with the helper threads), on one
    thread or two: torch's values, in place, and through forward_into."""
    layer_class, torch_fn, _ = FAST[name]
    x = np.asarray(np.random.default_rng(1).standard_normal(shape) * 6, np.float32)
    want = torch_fn(torch.from_numpy(x)).numpy()
    for num_threads in (1, 2):
        with threads.limit(num_threads):
            inplace = x.copy()
            layer_class().forward_inplace(inplace)
            into = np.full(x.shape, np.nan, np.float32)
            layer_class().forward_into([x], [into])
        np.testing.assert_allclose(inplace, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(into, inplace)


@pytest.mark.parametrize("name", FAST)
def test_fast_activation_other_arrays_run_the_reference(name):
    """float64 and non-contiguous arrays run the reference layer's numpy code."""
    layer_class, torch_fn, _ = FAST[name]
    x64 = np.linspace(-9, 9, 37)
    ours = x64.copy()
    layer_class().forward_inplace(ours)
    np.testing.assert_allclose(ours, torch_fn(torch.from_numpy(x64)).numpy(), rtol=1e-12)
    base = np.linspace(-9, 9, 80, dtype=np.float32).reshape(8, 10)
    view = base[:, ::2]
    layer_class().forward_inplace(view)
    np.testing.assert_allclose(
        view, torch_fn(torch.from_numpy(np.linspace(-9, 9, 80, dtype=np.float32)
                                        .reshape(8, 10)[:, ::2].copy())).numpy(), rtol=1e-6,
        atol=1e-7)


def test_the_fast_floor_serves_every_type_of_these_activations():
    registry = LayerRegisterer()
    for pnnx_type in ("nn.Sigmoid", "F.sigmoid", "torch.sigmoid", "nn.SiLU", "F.silu",
                      "nn.Hardswish", "F.hardswish", "nn.Hardsigmoid", "F.hardsigmoid",
                      "nn.Tanh", "F.tanh", "torch.tanh"):
        fast_class = registry.layer_class(pnnx_type, fast=True)
        assert issubclass(fast_class, KernelActivationLayer), pnnx_type


PIECEWISE = {       # the epilogue's activations that keep some values as they are
    "relu": (Activation(RELU), F.relu),
    "relu6": (Activation(CLAMP, 0.0, 6.0), F.relu6),
    "leaky": (Activation(LEAKY, 0.1), lambda t: F.leaky_relu(t, 0.1)),
    "leaky, negative slope": (Activation(LEAKY, -0.5), lambda t: F.leaky_relu(t, -0.5)),
}


@pytest.mark.parametrize("name", PIECEWISE)
@pytest.mark.parametrize("residual", [False, True], ids=["alone", "after a residual"])
def test_epilogue_piecewise_activations_give_torchs_bits(name, residual):
    """ReLU, a clamp and LeakyReLU in the epilogue's own pass (``activate_row``: after a
    residual, or with no bias, where nothing is added first) give torch's values bit for
    bit: NaN stays NaN, zeros keep torch's sign (LeakyReLU: x > 0 ? x : slope * x), tiny
    negatives scale to torch's signed zero. Rows of 47 and 7 values: a vector loop and its
    tail, and a row shorter than a vector."""
    activation, torch_fn = PIECEWISE[name]
    edges = np.concatenate([EDGES, -EDGES, np.float32([-1e-45, 1e-45, 6.0, 7.5])])
    for length in (47, 7):
        y = np.resize(edges, 2 * length).reshape(1, 2, length)
        zeros = np.full(y.shape, -0.0, np.float32) if residual else None   # y + -0.0 is y
        ours = y.copy()
        bias_residual_activation(ours, None, zeros, activation)
        want = torch_fn(torch.from_numpy(y)).numpy()
        np.testing.assert_array_equal(ours.view(np.int32), want.view(np.int32))
