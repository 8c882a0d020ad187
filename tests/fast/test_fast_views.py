"""The fast floor's flatten, squeeze and unsqueeze (layers/fast/layers.py ShapeWorkedOutOnce):
torch's result for every input shape, each shape's output shape worked out once and kept,
the input's memory shared read-only as on the reference floor."""

import numpy as np
import pytest
import torch
from torch import nn

from helpers import make_layer
from layers import LayerRegisterer
from layers.fast.layers import ShapeWorkedOutOnce

CASES = [
    ("torch.flatten", {"start_dim": 1, "end_dim": -1}, lambda t: torch.flatten(t, 1)),
    ("nn.Flatten", {}, nn.Flatten()),
    ("torch.squeeze", {}, torch.squeeze),
    ("torch.squeeze", {"dim": (2,)}, lambda t: torch.squeeze(t, 2)),
    ("torch.unsqueeze", {"dim": -1}, lambda t: torch.unsqueeze(t, -1)),
]
SHAPES = [(2, 3, 1, 5), (1, 4, 1, 1), (2, 3, 1, 5), (3, 1, 2, 1), (1, 4, 1, 1)]


@pytest.mark.parametrize("type_name, params, torch_fn", CASES,
                         ids=[f"{name}{params or ''}" for name, params, _ in CASES])
def test_fast_views_give_torchs_result_for_each_shape_in_turn(type_name, params, torch_fn):
    layer = make_layer(type_name, params, fast=True)
    assert isinstance(layer, ShapeWorkedOutOnce)
    reference = make_layer(type_name, params)
    rng = np.random.default_rng(0)
    for shape in SHAPES:                      # shapes again after others: the kept ones
        x = rng.standard_normal(shape, dtype=np.float32)
        (y,) = layer.forward([x])
        want = torch_fn(torch.from_numpy(x)).numpy()
        assert y.shape == want.shape == reference.forward([x])[0].shape
        np.testing.assert_array_equal(y, want)
        assert np.shares_memory(x, y) and not y.flags.writeable   # a read-only view
        assert x.flags.writeable                                  # the input is not changed
    assert set(layer._out_shapes) == set(SHAPES)                  # one entry per shape


def test_the_fast_floor_serves_these_views():
    registry = LayerRegisterer()
    for type_name in ("torch.flatten", "Tensor.flatten", "nn.Flatten", "torch.squeeze",
                      "Tensor.squeeze", "torch.unsqueeze", "Tensor.unsqueeze"):
        assert issubclass(registry.layer_class(type_name, fast=True), ShapeWorkedOutOnce)


def test_new_parameters_forget_the_shapes_worked_out():
    layer = make_layer("torch.flatten", {}, fast=True)
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert layer.forward([x])[0].shape == (120,)
    layer.load_param({"start_dim": 1})
    assert layer.forward([x])[0].shape == (2, 60)
