"""nn.Conv2d and F.conv2d against torch: strides, paddings, dilation, groups, depthwise, bias."""

import numpy as np
import pytest
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand, torch_module
from layers import LayerRegisterer
from layers.convolution import Conv2d, FunctionalConv2d
from parser.errors import LayerError, ShapeError

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


def conv_params(in_channels=4, out_channels=8, kernel_size=(3, 3), stride=(1, 1),
                padding=(0, 0), dilation=(1, 1), groups=1, bias=True, padding_mode="zeros"):
    """nn.Conv2d parameters as pnnx writes them (also torch's keyword arguments)."""
    return dict(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
                stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias,
                padding_mode=padding_mode)


CASES = {
    "3x3": conv_params(),
    "stride 2 pad 1": conv_params(stride=(2, 2), padding=(1, 1)),
    "padding (1,2)": conv_params(padding=(1, 2)),
    "stride (2,1)": conv_params(stride=(2, 1), padding=(1, 1)),
    "dilation 2": conv_params(dilation=(2, 2), padding=(2, 2)),
    "dilation (2,1)": conv_params(dilation=(2, 1)),
    "groups 2": conv_params(groups=2),
    "depthwise": conv_params(in_channels=8, out_channels=8, groups=8, padding=(1, 1)),
    "depthwise stride 2": conv_params(in_channels=8, out_channels=8, groups=8, stride=(2, 2)),
    "depthwise multiplier 2": conv_params(in_channels=4, out_channels=8, groups=4),
    "depthwise 5x5 dilated": conv_params(in_channels=8, out_channels=8, kernel_size=(5, 5),
                                         groups=8, dilation=(2, 1), padding=(2, 2)),
    "no bias": conv_params(bias=False),
    "kernel 3x1": conv_params(kernel_size=(3, 1), padding=(1, 0)),
    "kernel 1x5": conv_params(kernel_size=(1, 5), stride=(1, 2)),
    "kernel 2x2": conv_params(kernel_size=(2, 2)),
    "1x1": conv_params(kernel_size=(1, 1)),
    "1x1 stride 2": conv_params(kernel_size=(1, 1), stride=(2, 2), bias=False),
    "1x1 padded": conv_params(kernel_size=(1, 1), padding=(1, 1)),
    "1x1 groups 2": conv_params(kernel_size=(1, 1), groups=2),
    "7x7 stem": conv_params(in_channels=3, out_channels=8, kernel_size=(7, 7), stride=(2, 2),
                            padding=(3, 3)),
    "same": conv_params(padding="same"),
    "same even kernel dilated": conv_params(kernel_size=(4, 2), dilation=(1, 3), padding="same"),
    "valid": conv_params(padding="valid"),
    "reflect": conv_params(padding=(1, 2), padding_mode="reflect"),
    "replicate": conv_params(padding=(2, 1), padding_mode="replicate"),
    "circular": conv_params(padding=(1, 1), padding_mode="circular", stride=(2, 2)),
    "reflect same": conv_params(kernel_size=(2, 2), padding="same", padding_mode="reflect"),
}


@pytest.mark.parametrize("params", CASES.values(), ids=CASES.keys())
def test_conv2d_matches_torch(params):
    conv, weights = torch_module(nn.Conv2d, **params)
    check_layer("nn.Conv2d", conv, [(2, params["in_channels"], 11, 10)], params, weights)


ZERO_PADDED = {name: params for name, params in CASES.items() if params["padding_mode"] == "zeros"}


@pytest.mark.parametrize("params", ZERO_PADDED.values(), ids=ZERO_PADDED.keys())
def test_functional_conv2d_takes_weights_as_inputs(params):
    _, weights = torch_module(nn.Conv2d, **params)
    geometry = [params[key] for key in ("stride", "padding", "dilation", "groups")]
    inputs = [(2, params["in_channels"], 11, 10), weights["weight"]]
    if params["bias"]:
        inputs.append(weights["bias"])               # pnnx: 3 inputs ($input $weight $bias)
    functional = dict(zip(("stride", "padding", "dilation", "groups"), geometry),
                      bias=None)                     # pnnx writes bias=None with 2 inputs
    check_layer("F.conv2d", lambda x, w, b=None: F.conv2d(x, w, b, *geometry), inputs,
                functional)


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
def test_padding_modes_on_small_and_empty_batch_inputs(padding_mode):
    """replicate pads any amount (here 6 on a width of 4); an empty batch runs as in torch."""
    pad = (1, 6) if padding_mode == "replicate" else (1, 1)
    params = conv_params(kernel_size=(3, 3), padding=pad, padding_mode=padding_mode)
    conv, weights = torch_module(nn.Conv2d, **params)
    check_layer("nn.Conv2d", conv, [(2, params["in_channels"], 5, 4)], params, weights)
    check_layer("nn.Conv2d", conv, [(0, params["in_channels"], 5, 4)], params, weights)


def test_resnet_sized_conv_matches_torch():
    params = conv_params(in_channels=64, out_channels=64, padding=(1, 1), bias=False)
    conv, weights = torch_module(nn.Conv2d, **params)
    check_layer("nn.Conv2d", conv, [(1, 64, 56, 56)], params, weights, atol=1e-4)


def test_output_does_not_alias_the_weights_or_input():
    params = conv_params(kernel_size=(1, 1), bias=False)
    _, weights = torch_module(nn.Conv2d, **params)
    layer = make_layer("nn.Conv2d", params, weights)
    x = rand(1, 4, 3, 3)
    y = layer.forward_one(x)
    assert not np.shares_memory(y, x) and not np.shares_memory(y, layer.weight)


# ----- errors --------------------------------------------------------------------------------

def test_wrong_channel_count_is_a_shape_error():
    params = conv_params()
    _, weights = torch_module(nn.Conv2d, **params)
    layer = make_layer("nn.Conv2d", params, weights)
    with pytest.raises(ShapeError, match="5 channels"):
        layer.infer_shapes([(1, 5, 8, 8)])
    with pytest.raises(ShapeError, match="5 channels"):
        layer.forward([rand(1, 5, 8, 8)])


@pytest.mark.parametrize("shape", [(4, 8, 8), (1, 4, 2, 8), (1, 4, 8, 1)],
                         ids=["rank 3", "too short", "too narrow"])
def test_bad_input_shape_is_a_shape_error(shape):
    params = conv_params()
    _, weights = torch_module(nn.Conv2d, **params)
    with pytest.raises(ShapeError):
        make_layer("nn.Conv2d", params, weights).infer_shapes([shape])


@pytest.mark.parametrize("change", [
    dict(stride=(-1, 1)), dict(stride=0), dict(kernel_size=(0, 3)), dict(dilation=(0, 1)),
    dict(padding=(-1, 0)), dict(padding="full"), dict(groups=0), dict(groups=3),
    dict(padding="same", stride=(2, 2)), dict(padding_mode="mirror"), dict(bias="yes"),
], ids=str)
def test_bad_params_are_layer_errors(change):
    with pytest.raises(LayerError):
        make_layer("nn.Conv2d", {**conv_params(), **change})


def test_missing_required_param_is_a_layer_error():
    params = conv_params()
    del params["kernel_size"]
    with pytest.raises(LayerError, match="kernel_size"):
        make_layer("nn.Conv2d", params)


@pytest.mark.parametrize("weights", [
    {"weight": np.zeros((8, 4, 3, 3))},                                  # bias=True, no @bias
    {"weight": np.zeros((8, 4, 3, 1)), "bias": np.zeros(8)},
    {"weight": np.zeros((8, 4, 3, 3)), "bias": np.zeros(4)},
    {"bias": np.zeros(8)},
], ids=["no bias", "weight shape", "bias shape", "no weight"])
def test_bad_weights_are_layer_errors(weights):
    with pytest.raises(LayerError):
        make_layer("nn.Conv2d", conv_params(), weights)


def test_functional_conv2d_input_errors():
    layer = make_layer("F.conv2d", {"bias": None})
    with pytest.raises(ShapeError, match="2 or 3 inputs"):
        layer.infer_shapes([(1, 4, 8, 8)])
    with pytest.raises(ShapeError, match="bias"):
        layer.infer_shapes([(1, 4, 8, 8), (8, 4, 3, 3), (5,)])
    with pytest.raises(ShapeError, match="channels"):
        layer.infer_shapes([(1, 3, 8, 8), (8, 4, 3, 3)])
    with pytest.raises(LayerError, match="bias"):
        make_layer("F.conv2d", {"bias": True})


# ----- registration ----------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.Conv2d", Conv2d), ("F.conv2d", FunctionalConv2d)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
