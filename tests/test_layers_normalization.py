"""Eval-mode batch norm against torch, with and without the affine weights."""

import numpy as np
import pytest
from torch import nn

from helpers import check_layer, make_layer, torch_module
from layers import LayerRegisterer
from layers.normalization import BatchNorm1d, BatchNorm2d
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batch_norm2d_matches_torch(affine, eps):
    params = dict(num_features=4, eps=eps, affine=affine)
    bn, weights = torch_module(nn.BatchNorm2d, **params)
    assert ("weight" in weights) == affine
    check_layer("nn.BatchNorm2d", bn, [(2, 4, 5, 6)], params, weights)


@pytest.mark.parametrize("shape", [(3, 4), (3, 4, 7)], ids=str)
def test_batch_norm1d_matches_torch(shape):
    params = dict(num_features=4, eps=1e-5, affine=True)
    bn, weights = torch_module(nn.BatchNorm1d, **params)
    check_layer("nn.BatchNorm1d", bn, [shape], params, weights)


def test_batch_norm_errors():
    params = dict(num_features=4, eps=1e-5, affine=True)
    _, weights = torch_module(nn.BatchNorm2d, **params)
    layer = make_layer("nn.BatchNorm2d", params, weights)
    with pytest.raises(ShapeError, match="3 channels"):
        layer.infer_shapes([(2, 3, 5, 5)])
    with pytest.raises(ShapeError, match="4-D"):
        layer.infer_shapes([(2, 4)])
    with pytest.raises(LayerError, match="affine"):
        stats_only = {key: weights[key] for key in ("running_mean", "running_var")}
        make_layer("nn.BatchNorm2d", params, stats_only)
    with pytest.raises(LayerError, match="running_var"):
        make_layer("nn.BatchNorm2d", params, {**weights, "running_var": np.ones(5)})


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.BatchNorm2d", BatchNorm2d), ("nn.BatchNorm1d", BatchNorm1d)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
