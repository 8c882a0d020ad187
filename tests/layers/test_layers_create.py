"""Tensors made from a shape against torch: zeros / ones / full / empty, their _like and new_
forms, and x.fill(value); dtypes, sizes computed in the graph, read-only outputs; torch.arange
and torch.meshgrid (a dynamic export's grids)."""

import numpy as np
import pytest
import torch

from torch import nn

from helpers import check_layer, make_layer, rand
from support import case_id
from layers import LayerRegisterer
from layers import create as create_layers
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("type_name, params, torch_fn", [
    ("torch.zeros_like", {"dtype": None}, torch.zeros_like),
    ("torch.ones_like", {"dtype": None}, torch.ones_like),
    ("aten::zero", {}, lambda t: t.clone().zero_()),
    ("torch.full_like", {"dtype": None, "fill_value": 2.5}, lambda t: torch.full_like(t, 2.5)),
    ("Tensor.fill", {"value": 2}, lambda t: t.clone().fill_(2)),
    ("Tensor.new_zeros", {"dtype": None, "size": (2, 3)}, lambda t: t.new_zeros((2, 3))),
    ("Tensor.new_ones", {"dtype": None, "size": (4,)}, lambda t: t.new_ones((4,))),
], ids=case_id)
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
], ids=case_id)
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


# ----- arange / meshgrid ------------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    {"end": 5}, {"start": 2, "end": 9, "step": 3}, {"end": 7, "dtype": "torch.float"},
    {"start": 0.5, "end": 3.2, "step": 0.25}, {"start": 5, "end": 1, "step": -2},
    {"start": 3, "end": 3}], ids=str)
def test_arange_matches_torch(params):
    layer = make_layer("torch.arange", params)
    (y,) = layer.forward([])
    dtype = {"torch.float": torch.float32}.get(params.get("dtype"))
    want = torch.arange(params.get("start", 0), params["end"], params.get("step", 1),
                        dtype=dtype).numpy()
    assert y.dtype == want.dtype and layer.infer_shapes([]) == [want.shape]
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_arange_with_an_end_computed_in_the_graph():
    # torch.arange(x.size(2), dtype=torch.float) -> torch.arange dtype=torch.float $end=1
    layer = make_layer("torch.arange", {"dtype": "torch.float"})
    layer.input_names = ["end"]
    assert layer.infer_shapes_from([()], [np.array(6)]) == [(6,)]
    np.testing.assert_array_equal(layer.forward([np.array(6)])[0], np.arange(6.0))
    with pytest.raises(ShapeError, match="not known"):
        layer.infer_shapes([()])


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_matches_torch(indexing):
    grids = check_layer("aten::meshgrid",
                        lambda *v: torch.meshgrid(*v, indexing=indexing),
                        [(3,), (5,), np.array(2.0, np.float32)], {"indexing": indexing})
    assert len(grids) == 3


class Grid(nn.Module):
    """YOLO's cell grid and anchor points computed from the feature map's size."""

    def forward(self, x):
        ny, nx = x.shape[2], x.shape[3]
        yv, xv = torch.meshgrid(torch.arange(ny, dtype=torch.float32),
                                torch.arange(nx, dtype=torch.float32) + 0.5, indexing="ij")
        gx, gy = torch.meshgrid(torch.arange(nx), torch.arange(ny), indexing="xy")
        grid = torch.stack((xv, yv), 2).view(1, ny, nx, 2)
        return x.permute(0, 2, 3, 1)[..., :2] + grid, gx * 10 + gy


def test_pnnx_dynamic_export_of_grids_runs_at_other_sizes(pnnx_export):
    from infer import RuntimeGraph

    param, binary = pnnx_export(Grid(), (torch.rand(1, 3, 4, 6),), "grid_dynamic", dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    for shape in [(1, 3, 4, 6), (2, 3, 7, 5)]:
        x = rand(*shape)
        with torch.no_grad():
            want = Grid()(torch.from_numpy(x.copy()))
        got = graph.forward(x)
        for g, w in zip(got, want):
            assert g.dtype == w.numpy().dtype
            np.testing.assert_allclose(g, w.numpy(), atol=1e-6)
