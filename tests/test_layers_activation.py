"""Activations against torch, out of place and in place; softmax along every dim."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer
from layers import LayerRegisterer
from layers import activation as act
from parser.errors import LayerError, ShapeError

# (pnnx type, params as pnnx writes them, torch function)
ELEMENTWISE = [
    ("nn.ReLU", {}, nn.ReLU()),
    ("F.relu", {}, F.relu),
    ("nn.ReLU6", {}, nn.ReLU6()),
    ("F.relu6", {}, F.relu6),
    ("nn.Hardtanh", {"min_val": -2.0, "max_val": 3.0}, nn.Hardtanh(-2.0, 3.0)),
    ("F.hardtanh", {}, F.hardtanh),
    ("nn.Sigmoid", {}, nn.Sigmoid()),
    ("F.sigmoid", {}, torch.sigmoid),
    ("nn.SiLU", {}, nn.SiLU()),
    ("F.silu", {}, F.silu),
    ("nn.Hardswish", {}, nn.Hardswish()),
    ("nn.Hardsigmoid", {}, nn.Hardsigmoid()),
    ("nn.Tanh", {}, nn.Tanh()),
    ("nn.LeakyReLU", {"negative_slope": 0.2}, nn.LeakyReLU(0.2)),
    ("F.leaky_relu", {}, F.leaky_relu),
]


@pytest.mark.parametrize("type_name, params, torch_fn", ELEMENTWISE,
                         ids=[case[0] for case in ELEMENTWISE])
def test_elementwise_matches_torch(type_name, params, torch_fn):
    x = np.concatenate([np.linspace(-8, 8, 161, dtype=np.float32),     # every kink and edge
                        np.array([-100, -90, 90, 100], np.float32)])    # exp overflow range
    check_layer(type_name, torch_fn, [x], params)
    check_layer(type_name, torch_fn, [(2, 3, 4, 5)], params)


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -3])
def test_softmax_matches_torch(dim):
    check_layer("nn.Softmax", nn.Softmax(dim), [(2, 3, 4, 5)], {"dim": dim})


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], np.float32)
    check_layer("F.softmax", lambda t: F.softmax(t, dim=1), [x], {"dim": 1})


@pytest.mark.parametrize("shape, implicit_dim", [((5,), 0), ((2, 5), 1), ((2, 3, 4), 0),
                                                 ((2, 3, 4, 5), 1)], ids=str)
def test_softmax_without_dim_uses_torch_legacy_rule(shape, implicit_dim):
    check_layer("nn.Softmax", lambda t: F.softmax(t, implicit_dim), [shape], {})


def test_softmax_dim_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("F.softmax", {"dim": 2}).infer_shapes([(2, 3)])


@pytest.mark.parametrize("type_name, params", [
    ("nn.Hardtanh", {"min_val": 1.0, "max_val": -1.0}),
    ("nn.LeakyReLU", {"negative_slope": "0.1"}),
    ("nn.Softmax", {"dim": 1.5}),
], ids=str)
def test_bad_params_are_layer_errors(type_name, params):
    with pytest.raises(LayerError):
        make_layer(type_name, params)


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.ReLU", act.ReLU), ("F.relu", act.ReLU), ("nn.ReLU6", act.ReLU6), ("F.relu6", act.ReLU6),
    ("nn.Hardtanh", act.Hardtanh), ("F.hardtanh", act.Hardtanh),
    ("nn.Sigmoid", act.Sigmoid), ("F.sigmoid", act.Sigmoid), ("torch.sigmoid", act.Sigmoid),
    ("nn.Softmax", act.Softmax), ("F.softmax", act.Softmax), ("torch.softmax", act.Softmax),
    ("nn.SiLU", act.SiLU), ("F.silu", act.SiLU), ("nn.Hardswish", act.Hardswish),
    ("F.hardswish", act.Hardswish), ("nn.Hardsigmoid", act.Hardsigmoid),
    ("F.hardsigmoid", act.Hardsigmoid), ("nn.Tanh", act.Tanh), ("F.tanh", act.Tanh),
    ("nn.LeakyReLU", act.LeakyReLU), ("F.leaky_relu", act.LeakyReLU)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
