"""nn.Linear and F.linear against torch, on 1-D to 4-D inputs."""

import numpy as np
import pytest
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, torch_module
from layers import LayerRegisterer
from layers.linear import FunctionalLinear, Linear
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("shape", [(6,), (2, 6), (2, 3, 6), (2, 3, 4, 6)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(shape, bias):
    params = dict(in_features=6, out_features=5, bias=bias)
    linear, weights = torch_module(nn.Linear, **params)
    check_layer("nn.Linear", linear, [shape], params, weights)


@pytest.mark.parametrize("bias", [True, False])
def test_functional_linear_takes_weights_as_inputs(bias):
    _, weights = torch_module(nn.Linear, in_features=6, out_features=5, bias=bias)
    inputs = [(2, 3, 6), weights["weight"]] + ([weights["bias"]] if bias else [])
    check_layer("F.linear", F.linear, inputs, {} if bias else {"bias": None})


def test_classifier_sized_linear_matches_torch():
    params = dict(in_features=1280, out_features=1000, bias=True)
    linear, weights = torch_module(nn.Linear, **params)
    check_layer("nn.Linear", linear, [(2, 1280)], params, weights)


def test_wrong_feature_count_is_a_shape_error():
    params = dict(in_features=6, out_features=5, bias=True)
    layer = make_layer("nn.Linear", params, torch_module(nn.Linear, **params)[1])
    with pytest.raises(ShapeError, match="7 features"):
        layer.infer_shapes([(2, 7)])
    with pytest.raises(ShapeError, match="expects 2 or 3 inputs"):
        make_layer("F.linear").infer_shapes([(2, 6)])
    with pytest.raises(ShapeError, match="bias"):
        make_layer("F.linear").infer_shapes([(2, 6), (5, 6), (6,)])


@pytest.mark.parametrize("params, weights", [
    (dict(in_features=6, out_features=5, bias=True), {"weight": np.zeros((5, 6))}),
    (dict(in_features=6, out_features=5, bias=False),
     {"weight": np.zeros((5, 6)), "bias": np.zeros(5)}),
    (dict(in_features=6, out_features=5, bias=False), {"weight": np.zeros((6, 5))}),
    (dict(in_features=0, out_features=5, bias=False), {"weight": np.zeros((5, 0))}),
], ids=["missing bias", "unexpected bias", "transposed weight", "zero features"])
def test_bad_weights_or_params_are_layer_errors(params, weights):
    with pytest.raises(LayerError):
        make_layer("nn.Linear", params, weights)


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.Linear", Linear), ("F.linear", FunctionalLinear)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
