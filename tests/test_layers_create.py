"""Tensors made from a shape against torch: zeros / ones / full / empty, their _like and new_
forms, and x.fill(value); dtypes, sizes computed in the graph, read-only outputs."""

import numpy as np
import pytest
import torch

from helpers import check_layer, make_layer, rand
from layers import LayerRegisterer
from layers import create as create_layers
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("type_name, params, torch_fn", [
    ("torch.zeros_like", {"dtype": None}, torch.zeros_like),
    ("torch.ones_like", {"dtype": None}, torch.ones_like),
    ("torch.full_like", {"dtype": None, "fill_value": 2.5}, lambda t: torch.full_like(t, 2.5)),
    ("Tensor.fill", {"value": 2}, lambda t: t.clone().fill_(2)),
    ("Tensor.new_zeros", {"dtype": None, "size": (2, 3)}, lambda t: t.new_zeros((2, 3))),
    ("Tensor.new_ones", {"dtype": None, "size": (4,)}, lambda t: t.new_ones((4,))),
], ids=str)
def test_like_forms_match_torch(type_name, params, torch_fn):
    check_layer(type_name, torch_fn, [(2, 3, 5)], params)


def test_empty_like_and_new_empty_give_zeros_of_the_right_shape():
    x = rand(2, 3)
    (y,) = make_layer("torch.empty_like", {"dtype": None}).forward([x])
    (z,) = make_layer("Tensor.new_empty", {"size": (4, 1)}).forward([x])
    assert y.shape == (2, 3) and z.shape == (4, 1) and not y.any() and not z.any()


@pytest.mark.parametrize("type_name, params, torch_fn", [
    ("torch.zeros", {"size": (2, 3), "dtype": None}, lambda: torch.zeros(2, 3)),
    ("torch.ones", {"size": (4,), "dtype": "torch.long"},
     lambda: torch.ones(4, dtype=torch.long)),
    ("torch.full", {"size": (2, 2), "fill_value": 2.0}, lambda: torch.full((2, 2), 2.0)),
    ("torch.full", {"size": (3,), "fill_value": 7}, lambda: torch.full((3,), 7)),
    ("torch.full", {"size": (1, 2), "fill_value": True}, lambda: torch.full((1, 2), True)),
    ("torch.zeros_like", {"dtype": "torch.long"}, None),
    ("torch.full_like", {"dtype": "torch.bool", "fill_value": 1}, None),
], ids=str)
def test_shapes_values_and_dtypes_match_torch(type_name, params, torch_fn):
    layer = make_layer(type_name, params)
    x = rand(2, 3)
    inputs = [x] if type_name.endswith("_like") else []
    if torch_fn is None:                                 # the _like forms with a dtype
        dtype = {"torch.long": torch.long, "torch.bool": torch.bool}[params["dtype"]]
        fill = params.get("fill_value", 0)
        want = torch.full_like(torch.from_numpy(x), fill, dtype=dtype)
    else:
        want = torch_fn()
    (y,) = layer.forward(inputs)
    assert layer.infer_shapes([a.shape for a in inputs]) == [tuple(want.shape)]
    assert y.dtype == want.numpy().dtype
    np.testing.assert_array_equal(y, want.numpy())


def test_a_computed_size_and_read_only_output():
    # torch.zeros(x.size(0), 2) -> torch.zeros 1 1 s y dtype=None $size=s
    layer = make_layer("torch.zeros", {"dtype": None})
    layer.input_names = ["size"]
    size = np.array([3, 2])
    assert layer.infer_shapes_from([(2,)], [size]) == [(3, 2)]
    (y,) = layer.forward([size])
    assert y.shape == (3, 2) and y.dtype == np.float32 and not y.flags.writeable
    new_ones = make_layer("Tensor.new_ones", {"dtype": None})
    new_ones.input_names = ["input", "size"]
    (z,) = new_ones.forward([np.zeros(2, np.int64), size])
    assert z.dtype == np.int64 and z.shape == (3, 2) and (z == 1).all()


def test_bad_creation_arguments():
    with pytest.raises(LayerError, match="dtype"):
        make_layer("torch.zeros", {"size": (2,), "dtype": "torch.cfloat"})
    with pytest.raises(ShapeError, match="negative"):
        make_layer("torch.zeros", {"size": (2, -1)}).infer_shapes([])
    with pytest.raises(ShapeError, match="needs the size"):
        make_layer("torch.ones").infer_shapes([])


@pytest.mark.parametrize("type_name, layer_class", [
    ("torch.zeros_like", create_layers.ZerosLike), ("torch.empty_like", create_layers.ZerosLike),
    ("torch.ones_like", create_layers.OnesLike), ("torch.full_like", create_layers.FullLike),
    ("Tensor.fill", create_layers.Fill), ("torch.zeros", create_layers.Zeros),
    ("torch.empty", create_layers.Zeros), ("torch.ones", create_layers.Ones),
    ("torch.full", create_layers.Full), ("Tensor.new_zeros", create_layers.NewZeros),
    ("Tensor.new_empty", create_layers.NewZeros), ("Tensor.new_ones", create_layers.NewOnes)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
