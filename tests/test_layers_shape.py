"""Flatten, reshape, padding, concatenation and the identities against torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand
from layers import LayerRegisterer
from layers import shape as shape_layers
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("start_dim, end_dim", [(0, -1), (1, -1), (1, 2), (-3, -2), (2, 2),
                                                (0, 0), (3, -1)], ids=str)
def test_flatten_matches_torch(start_dim, end_dim):
    params = {"start_dim": start_dim, "end_dim": end_dim}
    check_layer("torch.flatten", lambda t: torch.flatten(t, start_dim, end_dim),
                [(2, 3, 4, 5)], params)


def test_flatten_defaults_differ_between_function_and_module():
    check_layer("torch.flatten", torch.flatten, [(2, 3, 4)], {})
    check_layer("nn.Flatten", nn.Flatten(), [(2, 3, 4)], {})


def test_flatten_start_after_end_is_a_shape_error():
    with pytest.raises(ShapeError, match="start_dim"):
        make_layer("torch.flatten", {"start_dim": 2, "end_dim": 1}).infer_shapes([(2, 3, 4)])


@pytest.mark.parametrize("target", [(2, 60), (-1, 60), (2, -1), (5, -1, 4), (120,), (-1,),
                                    (2, 3, 4, 5, 1)], ids=str)
def test_reshape_matches_torch(target):
    check_layer("Tensor.reshape", lambda t: t.reshape(target), [(2, 3, 4, 5)],
                {"shape": target})


def test_reshape_takes_the_shape_as_a_second_input():
    # pnnx: Tensor.reshape 2 1 x s y $input=x $shape=s, s from expr=[size(@0,0),-1]
    layer = make_layer("Tensor.reshape")
    x = rand(2, 3, 4)
    (y,) = layer.forward([x, [2, -1]])
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([(2, 3, 4), (2,)])
    target = np.array([3, -1], np.int64)            # known while planning: shape arithmetic
    assert layer.infer_shapes_from([(2, 3, 4), (2,)], [None, target]) == [(3, 8)]


@pytest.mark.parametrize("target", [(7, -1), (5, 5), (-1, -1), (2, -2)], ids=str)
def test_reshape_that_does_not_fit_names_both_shapes(target):
    layer = make_layer("Tensor.view", {"shape": target})
    with pytest.raises(ShapeError) as error:
        layer.infer_shapes([(2, 3, 4)])
    assert "(2, 3, 4)" in str(error.value) and str(target) in str(error.value)


def test_views_of_the_input_are_read_only():
    x = rand(2, 3, 4)
    for type_name, params in [("Tensor.reshape", {"shape": (6, 4)}), ("torch.flatten", {}),
                              ("nn.Identity", {})]:
        (y,) = make_layer(type_name, params).forward([x])
        assert np.shares_memory(x, y) and not y.flags.writeable
        assert x.flags.writeable


# ----- padding -------------------------------------------------------------------------------

@pytest.mark.parametrize("pad, mode, value", [
    ((1, 1), "constant", None), ((1, 2, 3, 4), "constant", 0.5),
    ((0, 0, 0, 0, 1, 1), "constant", None), ((1, 0, 0, 0, 0, 2, 1, 0), "constant", -1.0),
    ((-1, 2, 0, -2), "constant", None),                         # negative pads crop
    ((1, 2, 3, 2), "reflect", None), ((1, 2), "reflect", None),
    ((1, 1, 1, 1, 1, 1), "reflect", None), ((1, 2, 3, 4), "replicate", None),
    ((2, 2, 1, 1), "circular", None), ((4, 4, 3, 3), "circular", None),
    ((7, 9, 0, 0), "replicate", None),                          # replicate: any amount
    ((3, -3), "reflect", None), ((-1, 2, 2, -1), "replicate", None),   # fill, then crop
    ((-2, 1, 1, -1), "circular", None),
], ids=str)
def test_pad_matches_torch(pad, mode, value):
    shape = (2, 3, 4, 5) if len(pad) > 2 or mode == "constant" else (3, 4, 5)
    check_layer("F.pad", lambda t: F.pad(t, pad, mode, value), [shape],
                {"pad": pad, "mode": mode, "value": value})


def test_pad_takes_the_pad_as_a_second_input():
    # a dynamic export of F.pad(x, (0, (8 - w % 8) % 8, 0, (8 - h % 8) % 8), mode="reflect")
    layer = make_layer("F.pad", {"mode": "reflect"})
    x = rand(1, 2, 5, 6)
    (y,) = layer.forward([x, np.array([0, 2, 0, 3])])
    np.testing.assert_array_equal(y, F.pad(torch.from_numpy(x), (0, 2, 0, 3), "reflect").numpy())
    assert layer.infer_shapes_from([(1, 2, 5, 6), (4,)], [None, np.array([0, 2, 0, 3])]) == \
        [(1, 2, 8, 8)]
    with pytest.raises(ShapeError, match="even length"):
        layer.infer_shapes_from([(1, 2, 5, 6), (3,)], [None, np.array([1, 2, 1])])
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([(1, 2, 5, 6), (4,)])


@pytest.mark.parametrize("type_name, module, params", [
    ("nn.ZeroPad2d", nn.ZeroPad2d((1, 2, 0, 1)), {"padding": (1, 2, 0, 1)}),
    ("nn.ZeroPad2d", nn.ZeroPad2d(2), {"padding": 2}),
    ("nn.ConstantPad2d", nn.ConstantPad2d((1, 1, 2, 2), 0.5),
     {"padding": (1, 1, 2, 2), "value": 0.5}),
    ("nn.ReflectionPad2d", nn.ReflectionPad2d((1, 2, 0, 1)), {"padding": (1, 2, 0, 1)}),
    ("nn.ReplicationPad2d", nn.ReplicationPad2d(1), {"padding": (1, 1, 1, 1)}),
], ids=str)
def test_pad_modules_match_torch(type_name, module, params):
    check_layer(type_name, module, [(2, 3, 4, 5)], params)


@pytest.mark.parametrize("params, shape", [
    ({"pad": (4, 4, 0, 0), "mode": "reflect"}, (1, 2, 3, 4)),   # reflect needs pad < size
    ({"pad": (1, 1), "mode": "reflect"}, (1, 2, 3, 4)),         # 1 dim of a 4-D input
    ({"pad": (5, 0, 0, 0), "mode": "circular"}, (1, 2, 3, 4)),
    ({"pad": (3, -2), "mode": "circular"}, (1, 2, 3, 4)),       # wraps 2 columns 3 times
    ({"pad": (1, 1, 1, 1, 1, 1, 1, 1, 1, 1)}, (1, 2, 3, 4)),    # more dims than the input
    ({"pad": (-3, -2)}, (1, 2, 3, 4)),                          # crops below zero
    ({"pad": (-5, 2)}, (1, 2, 3, 4)),                           # crops 5 of 4, then pads
], ids=str)
def test_bad_pads_for_the_input_are_shape_errors(params, shape):
    with pytest.raises(ShapeError):
        make_layer("F.pad", params).infer_shapes([shape])


@pytest.mark.parametrize("params", [
    {"pad": (1, 1, 1)}, {"pad": (1, 1), "mode": "symmetric"},
    {"pad": (1, 1), "mode": "reflect", "value": 0.5},
], ids=str)
def test_bad_pad_params_are_layer_errors(params):
    with pytest.raises(LayerError):
        make_layer("F.pad", params)


# ----- concatenation, identities -----------------------------------------------------------------

@pytest.mark.parametrize("dim, shapes", [
    (1, [(2, 3, 4), (2, 5, 4)]), (0, [(1, 3), (2, 3), (3, 3)]), (-1, [(2, 3, 1), (2, 3, 4)]),
    (2, [(1, 2, 3, 4)]),
], ids=str)
def test_cat_matches_torch(dim, shapes):
    check_layer("torch.cat", lambda *ts: torch.cat(ts, dim), shapes, {"dim": dim})


def test_cat_of_mismatched_shapes_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"\(2, 3, 4\), \(2, 3, 5\)"):
        make_layer("torch.cat", {"dim": 1}).infer_shapes([(2, 3, 4), (2, 3, 5)])
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("torch.cat", {"dim": 3}).infer_shapes([(2, 3, 4), (2, 3, 4)])


@pytest.mark.parametrize("type_name, params", [
    ("nn.Identity", {}), ("nn.Dropout", {"p": 0.5}), ("nn.Dropout2d", {}),
    ("F.dropout", {"p": 0.1, "training": False}), ("Tensor.contiguous", {})], ids=str)
def test_identities_return_their_input(type_name, params):
    check_layer(type_name, lambda t: t, [(2, 3, 4)], params)


@pytest.mark.parametrize("type_name, layer_class", [
    ("torch.flatten", shape_layers.Flatten), ("nn.Flatten", shape_layers.FlattenModule),
    ("Tensor.reshape", shape_layers.Reshape), ("Tensor.view", shape_layers.Reshape),
    ("F.pad", shape_layers.Pad), ("nn.ZeroPad2d", shape_layers.ZeroPad2d),
    ("nn.ConstantPad2d", shape_layers.ConstantPad2d),
    ("nn.ReflectionPad2d", shape_layers.ReflectionPad2d),
    ("nn.ReplicationPad2d", shape_layers.ReplicationPad2d), ("torch.cat", shape_layers.Cat),
    ("nn.Identity", shape_layers.Identity), ("nn.Dropout", shape_layers.Identity)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
