"""F.pad and the nn padding modules against torch: every mode, 1-D / 2-D / 3-D pads,
negative pads, a pad computed in the graph, and the errors for pads an input cannot take."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand
from layers import LayerRegisterer
from layers import padding as padding_layers
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("pad, mode, value", [
    ((1, 1), "constant", None), ((1, 2, 3, 4), "constant", 0.5),
    ((0, 0, 0, 0, 1, 1), "constant", None), ((1, 0, 0, 0, 0, 2, 1, 0), "constant", -1.0),
    ((-1, 2, 0, -2), "constant", None),                         # negative pads crop
    ((1, 2, 3, 2), "reflect", None), ((1, 2), "reflect", None),
    ((1, 1, 1, 1, 1, 1), "reflect", None), ((1, 2, 3, 4), "replicate", None),
    ((1, 2, 1, 0, 2, 1), "replicate", None), ((1, 1, 2, 0, 0, 1), "circular", None),
    ((2, 2, 1, 1), "circular", None), ((4, 4, 3, 3), "circular", None),
    ((7, 9, 0, 0), "replicate", None),                          # replicate: any amount
    ((3, -3), "reflect", None), ((-1, 2, 2, -1), "replicate", None),   # fill, then crop
    ((-2, 1, 1, -1), "circular", None), ((2, 1), "circular", None),
], ids=str)
def test_pad_matches_torch(pad, mode, value):
    shape = (2, 3, 4, 5) if len(pad) > 2 or mode == "constant" else (3, 4, 5)
    check_layer("F.pad", lambda t: F.pad(t, pad, mode, value), [shape],
                {"pad": pad, "mode": mode, "value": value})


def test_pad_takes_the_pad_as_a_second_input():
    # a dynamic export of F.pad(x, (0, (8 - w % 8) % 8, 0, (8 - h % 8) % 8), mode="reflect")
    layer = make_layer("F.pad", {"mode": "reflect"})
    layer.input_names = ["input", "pad"]
    x = rand(1, 2, 5, 6)
    (y,) = layer.forward([x, np.array([0, 2, 0, 3])])
    np.testing.assert_array_equal(y, F.pad(torch.from_numpy(x), (0, 2, 0, 3), "reflect").numpy())
    assert layer.infer_shapes_from([(1, 2, 5, 6), (4,)], [None, np.array([0, 2, 0, 3])]) == \
        [(1, 2, 8, 8)]
    with pytest.raises(ShapeError, match="even length"):
        layer.infer_shapes_from([(1, 2, 5, 6), (3,)], [None, np.array([1, 2, 1])])
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([(1, 2, 5, 6), (4,)])


@pytest.mark.parametrize("type_name, module, params, shape", [
    ("nn.ZeroPad2d", nn.ZeroPad2d((1, 2, 0, 1)), {"padding": (1, 2, 0, 1)}, (2, 3, 4, 5)),
    ("nn.ZeroPad2d", nn.ZeroPad2d(2), {"padding": 2}, (2, 3, 4, 5)),
    ("nn.ZeroPad1d", nn.ZeroPad1d((2, 1)), {"padding": (2, 1)}, (2, 3, 5)),
    ("nn.ConstantPad1d", nn.ConstantPad1d((1, 2), -1.0), {"padding": (1, 2), "value": -1.0},
     (2, 3, 5)),
    ("nn.ConstantPad2d", nn.ConstantPad2d((1, 1, 2, 2), 0.5),
     {"padding": (1, 1, 2, 2), "value": 0.5}, (2, 3, 4, 5)),
    ("nn.ConstantPad3d", nn.ConstantPad3d(1, 3.0), {"padding": (1, 1, 1, 1, 1, 1),
                                                    "value": 3.0}, (2, 3, 4, 5)),
    ("nn.ReflectionPad1d", nn.ReflectionPad1d((1, 2)), {"padding": (1, 2)}, (2, 3, 5)),
    ("nn.ReflectionPad2d", nn.ReflectionPad2d((1, 2, 0, 1)), {"padding": (1, 2, 0, 1)},
     (2, 3, 4, 5)),
    ("nn.ReplicationPad1d", nn.ReplicationPad1d(3), {"padding": (3, 3)}, (2, 3, 5)),
    ("nn.ReplicationPad2d", nn.ReplicationPad2d(1), {"padding": (1, 1, 1, 1)}, (2, 3, 4, 5)),
    ("nn.ReplicationPad3d", nn.ReplicationPad3d((1, 0, 0, 2, 1, 1)),
     {"padding": (1, 0, 0, 2, 1, 1)}, (2, 3, 4, 5)),
    ("nn.CircularPad2d", nn.CircularPad2d(1), {"padding": 1}, (2, 3, 4, 5)),
    ("nn.ConstantPad2d", nn.ConstantPad2d((-1, 2, 1, -2), 2.0),
     {"padding": (-1, 2, 1, -2), "value": 2.0}, (2, 3, 4, 5)),
], ids=str)
def test_pad_modules_match_torch(type_name, module, params, shape):
    check_layer(type_name, module, [shape], params)


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


@pytest.mark.parametrize("type_name, params", [
    ("F.pad", {"pad": (1, 1, 1)}), ("F.pad", {"pad": (1, 1), "mode": "symmetric"}),
    ("F.pad", {"pad": (1, 1), "mode": "reflect", "value": 0.5}),
    ("nn.ReflectionPad2d", {"padding": (1, 1, 1)}),
    ("nn.ReflectionPad1d", {"padding": 1, "value": 2.0}),
], ids=str)
def test_bad_pad_params_are_layer_errors(type_name, params):
    with pytest.raises(LayerError):
        make_layer(type_name, params)


@pytest.mark.parametrize("type_name", ["F.pad", *padding_layers.PAD_MODULES])
def test_registered_under_pnnx_names(type_name):
    expected = padding_layers.Pad if type_name == "F.pad" else padding_layers.PadModule
    assert LayerRegisterer().layer_class(type_name) is expected
