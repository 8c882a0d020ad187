"""Convolutions against torch: nn.Conv1d / nn.Conv2d / nn.ConvTranspose1d / nn.ConvTranspose2d
and their F. forms, with strides, paddings (modes, 'same', 'valid'), dilation, groups, output
padding, bias; and pnnx exports of them run by RuntimeGraph."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand, torch_module
from infer import RuntimeGraph
from infer.export import export_module
from layers import LayerRegisterer
from layers.convolution import (Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d,
                                FunctionalConv1d, FunctionalConv2d, FunctionalConvTranspose1d,
                                FunctionalConvTranspose2d)
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
    "same dilated": conv_params(kernel_size=(3, 3), dilation=(2, 3), padding="same"),
    "same 4x4 dilated circular": conv_params(kernel_size=(4, 4), dilation=(2, 1),
                                             padding="same", padding_mode="circular"),
    "same replicate groups": conv_params(kernel_size=(2, 3), padding="same", groups=2,
                                         padding_mode="replicate"),
    "valid reflect": conv_params(padding="valid", padding_mode="reflect", stride=(2, 1)),
    "reflect depthwise dilated": conv_params(in_channels=4, out_channels=4, groups=4,
                                             dilation=(2, 2), padding=(2, 1),
                                             padding_mode="reflect", bias=False),
}


def test_padding_as_pnnx_writes_an_uneven_same_with_a_padding_mode():
    """pnnx writes nn.Conv2d(4, 4, (4, 3), padding='same', dilation=(1, 2), padding_mode=
    'circular') with padding=(2,2,1,2): (left, right, top, bottom); nn.Conv1d(4, 6, 4,
    padding='same', padding_mode='reflect') with padding=(), read as None."""
    params = conv_params(kernel_size=(4, 3), dilation=(1, 2), padding="same",
                         padding_mode="circular")
    conv, weights = torch_module(nn.Conv2d, **params)
    check_layer("nn.Conv2d", conv, [(2, 4, 9, 8)], {**params, "padding": (2, 2, 1, 2)}, weights)
    zeros = {**params, "padding_mode": "zeros"}
    conv, weights = torch_module(nn.Conv2d, **zeros)
    check_layer("nn.Conv2d", conv, [(2, 4, 9, 8)], {**zeros, "padding": (2, 2, 1, 2)}, weights)
    params = conv1d_params(kernel_size=(4,), padding="same", padding_mode="reflect")
    conv, weights = torch_module(nn.Conv1d, **params)
    check_layer("nn.Conv1d", conv, [(2, 4, 9)], {**params, "padding": None}, weights)


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


def test_a_convolution_fused_after_it_ran_computes_the_fused_result():
    """The fast path works its geometry out once per input shape; folding a padding or an
    activation in afterwards must not reuse the old one."""
    params = conv_params(padding=(1, 1))
    conv, weights = torch_module(nn.Conv2d, **params)
    layer = make_layer("nn.Conv2d", params, weights)
    x = rand(2, 4, 7, 6)
    layer.forward_one(x)                                  # plain, remembered for (2, 4, 7, 6)
    layer.fuse_padding(1, 0, 2, 0)                        # left, right, top, bottom
    layer.fuse_activation(make_layer("nn.ReLU"))
    want = F.relu(conv(F.pad(torch.from_numpy(x), (1, 0, 2, 0)))).detach().numpy()
    np.testing.assert_allclose(layer.forward_one(x), want, atol=1e-5)


# ----- nn.Conv1d / F.conv1d ---------------------------------------------------------------------

def conv1d_params(in_channels=4, out_channels=6, kernel_size=(3,), stride=(1,), padding=(0,),
                  dilation=(1,), groups=1, bias=True, padding_mode="zeros"):
    """nn.Conv1d parameters as pnnx writes them (1-tuples, also torch's keyword arguments)."""
    return dict(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
                stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias,
                padding_mode=padding_mode)


CASES_1D = {
    "k3": conv1d_params(),
    "stride 2 pad 1": conv1d_params(stride=(2,), padding=(1,)),
    "stride 3 pad 2 dilation 2": conv1d_params(stride=(3,), padding=(2,), dilation=(2,)),
    "groups 2": conv1d_params(groups=2, padding=(1,)),
    "depthwise": conv1d_params(in_channels=4, out_channels=8, groups=4, kernel_size=(5,)),
    "no bias": conv1d_params(bias=False),
    "k1": conv1d_params(kernel_size=(1,)),
    "same": conv1d_params(padding="same"),
    "same even kernel dilated": conv1d_params(kernel_size=(4,), dilation=(3,), padding="same"),
    "valid": conv1d_params(padding="valid", stride=(2,)),
    "reflect": conv1d_params(padding=(2,), padding_mode="reflect"),
    "replicate": conv1d_params(padding=(3,), padding_mode="replicate", stride=(2,)),
    "circular": conv1d_params(padding=(1,), padding_mode="circular", groups=2),
    "circular same even": conv1d_params(kernel_size=(2,), padding="same",
                                        padding_mode="circular"),
    "int params": dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1),
}


@pytest.mark.parametrize("params", CASES_1D.values(), ids=CASES_1D.keys())
def test_conv1d_matches_torch(params):
    conv, weights = torch_module(nn.Conv1d, **params)
    check_layer("nn.Conv1d", conv, [(2, params["in_channels"], 11)], params, weights)


ZERO_PADDED_1D = {name: params for name, params in CASES_1D.items()
                  if params.get("padding_mode", "zeros") == "zeros"}


@pytest.mark.parametrize("params", ZERO_PADDED_1D.values(), ids=ZERO_PADDED_1D.keys())
def test_functional_conv1d_takes_weights_as_inputs(params):
    _, weights = torch_module(nn.Conv1d, **params)
    geometry = {key: params.get(key, default) for key, default in
                (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))}
    inputs = [(2, params["in_channels"], 11), weights["weight"]]
    if params.get("bias", True):
        inputs.append(weights["bias"])
    check_layer("F.conv1d", lambda x, w, b=None: F.conv1d(x, w, b, **geometry), inputs,
                {**geometry, "bias": None})


def test_conv1d_errors():
    params = conv1d_params()
    _, weights = torch_module(nn.Conv1d, **params)
    layer = make_layer("nn.Conv1d", params, weights)
    with pytest.raises(ShapeError, match="3-D"):
        layer.infer_shapes([(2, 4, 8, 8)])
    with pytest.raises(ShapeError, match="5 channels"):
        layer.infer_shapes([(2, 5, 8)])
    with pytest.raises(ShapeError, match="window"):
        layer.infer_shapes([(2, 4, 2)])
    with pytest.raises(LayerError, match="@weight"):                 # a 2-D weight
        make_layer("nn.Conv1d", params, {**weights, "weight": np.zeros((6, 4, 1, 3))})
    with pytest.raises(LayerError):
        make_layer("nn.Conv1d", {**params, "kernel_size": (3, 3)})
    with pytest.raises(LayerError):
        make_layer("nn.Conv1d", {**params, "padding": "same", "stride": (2,)})
    functional = make_layer("F.conv1d", {"bias": None})
    with pytest.raises(ShapeError, match="weight"):
        functional.infer_shapes([(2, 4, 8), (6, 4, 3, 3)])
    with pytest.raises(ShapeError, match="weight"):
        functional.forward([rand(2, 4, 8), rand(6, 4)])


# ----- nn.ConvTranspose2d / F.conv_transpose2d ----------------------------------------------------

def transpose_params(in_channels=4, out_channels=6, kernel_size=(3, 3), stride=(1, 1),
                     padding=(0, 0), output_padding=(0, 0), groups=1, bias=True,
                     dilation=(1, 1)):
    """nn.ConvTranspose2d parameters as pnnx writes them (also torch's keyword arguments)."""
    return dict(in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
                stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                bias=bias, dilation=dilation)


TRANSPOSE_CASES = {
    "3x3": transpose_params(),
    "stride 2": transpose_params(stride=(2, 2)),
    "stride 2 pad 1 out pad 1": transpose_params(stride=(2, 2), padding=(1, 1),
                                                 output_padding=(1, 1)),
    "unet 2x2 stride 2": transpose_params(kernel_size=(2, 2), stride=(2, 2)),
    "stride (3,1)": transpose_params(stride=(3, 1), padding=(1, 0), output_padding=(2, 0)),
    "kernel (3,2) pad (2,1)": transpose_params(kernel_size=(3, 2), padding=(2, 1)),
    "dilation 2": transpose_params(dilation=(2, 2), padding=(1, 2)),
    "out pad below dilation": transpose_params(dilation=(3, 2), output_padding=(2, 1)),
    "groups 2": transpose_params(groups=2, stride=(2, 2), padding=(1, 1)),
    "depthwise": transpose_params(in_channels=4, out_channels=4, groups=4, stride=(2, 2)),
    "groups 2 multiplier 3": transpose_params(in_channels=4, out_channels=6, groups=2,
                                              output_padding=(1, 0), stride=(2, 2)),
    "no bias": transpose_params(bias=False, stride=(2, 2), output_padding=(1, 1)),
    "1x1": transpose_params(kernel_size=(1, 1)),
    "1x1 stride 2": transpose_params(kernel_size=(1, 1), stride=(2, 2), output_padding=(1, 1)),
    "kernel 4 stride 2 pad 1": transpose_params(kernel_size=(4, 4), stride=(2, 2),
                                                padding=(1, 1)),
}


@pytest.mark.parametrize("params", TRANSPOSE_CASES.values(), ids=TRANSPOSE_CASES.keys())
def test_conv_transpose2d_matches_torch(params):
    conv, weights = torch_module(nn.ConvTranspose2d, **params)
    check_layer("nn.ConvTranspose2d", conv, [(2, params["in_channels"], 5, 6)], params,
                weights)


@pytest.mark.parametrize("params", TRANSPOSE_CASES.values(), ids=TRANSPOSE_CASES.keys())
def test_functional_conv_transpose2d_takes_weights_as_inputs(params):
    _, weights = torch_module(nn.ConvTranspose2d, **params)
    geometry = {key: params[key] for key in
                ("stride", "padding", "output_padding", "groups", "dilation")}
    inputs = [(2, params["in_channels"], 5, 6), weights["weight"]]
    functional = dict(geometry)
    if params["bias"]:
        inputs.append(weights["bias"])               # pnnx: a 3rd input, no bias parameter
    else:
        functional["bias"] = None                    # pnnx writes bias=None with 2 inputs
    check_layer("F.conv_transpose2d", lambda x, w, b=None: F.conv_transpose2d(x, w, b, **geometry),
                inputs, functional)


def test_conv_transpose_of_an_empty_batch_and_a_1x1_input():
    params = transpose_params(stride=(2, 2), padding=(1, 1), output_padding=(1, 1))
    conv, weights = torch_module(nn.ConvTranspose2d, **params)
    check_layer("nn.ConvTranspose2d", conv, [(0, 4, 5, 6)], params, weights)
    check_layer("nn.ConvTranspose2d", conv, [(1, 4, 1, 1)], params, weights)


# ----- nn.ConvTranspose1d / F.conv_transpose1d ----------------------------------------------------

TRANSPOSE_CASES_1D = {
    "k3": dict(in_channels=4, out_channels=6, kernel_size=(3,)),
    "stride 2 pad 1 out pad 1": dict(in_channels=4, out_channels=6, kernel_size=(3,),
                                     stride=(2,), padding=(1,), output_padding=(1,)),
    "dilation 2 groups 2 no bias": dict(in_channels=4, out_channels=6, kernel_size=(3,),
                                        stride=(2,), dilation=(2,), groups=2, bias=False,
                                        output_padding=(1,)),
    "int params": dict(in_channels=4, out_channels=2, kernel_size=4, stride=3, padding=2),
}


@pytest.mark.parametrize("params", TRANSPOSE_CASES_1D.values(), ids=TRANSPOSE_CASES_1D.keys())
def test_conv_transpose1d_matches_torch(params):
    conv, weights = torch_module(nn.ConvTranspose1d, **params)
    check_layer("nn.ConvTranspose1d", conv, [(2, 4, 7)], params, weights)
    geometry = {key: params[key] for key in
                ("stride", "padding", "output_padding", "groups", "dilation") if key in params}
    inputs = [(2, 4, 7), weights["weight"]] + ([weights["bias"]] if "bias" in weights else [])
    check_layer("F.conv_transpose1d", lambda x, w, b=None: F.conv_transpose1d(x, w, b, **geometry),
                inputs, geometry)


@pytest.mark.parametrize("change", [
    dict(output_padding=(2, 0), stride=(2, 2)),                    # not below stride/dilation
    dict(output_padding=(1, 1)),                                   # stride 1, dilation 1
    dict(padding_mode="reflect"), dict(groups=3), dict(padding=(-1, 0)), dict(stride=0),
    dict(kernel_size=(3,)),
], ids=str)
def test_bad_conv_transpose_params_are_layer_errors(change):
    with pytest.raises(LayerError):
        make_layer("nn.ConvTranspose2d", {**transpose_params(), **change})


def test_conv_transpose_shape_and_weight_errors():
    params = transpose_params(padding=(2, 2))
    _, weights = torch_module(nn.ConvTranspose2d, **params)
    layer = make_layer("nn.ConvTranspose2d", params, weights)
    with pytest.raises(ShapeError, match="5 channels"):
        layer.infer_shapes([(1, 5, 4, 4)])
    with pytest.raises(ShapeError, match="crops"):                 # 1x1 -> -1x-1
        layer.infer_shapes([(1, 4, 1, 1)])
    with pytest.raises(ShapeError, match="at least 1"):
        layer.infer_shapes([(1, 4, 0, 4)])
    with pytest.raises(LayerError, match="@weight"):                # (C_out, C_in) order
        make_layer("nn.ConvTranspose2d", params, {**weights, "weight": np.zeros((6, 4, 3, 3))})
    functional = make_layer("F.conv_transpose2d", {"bias": None})
    with pytest.raises(ShapeError, match="bias"):
        functional.infer_shapes([(1, 4, 4, 4), (4, 3, 3, 3), (4,)])
    with pytest.raises(ShapeError, match="2 or 3 inputs"):
        functional.infer_shapes([(1, 4, 4, 4)])
    with pytest.raises(ShapeError, match="3-D"):
        make_layer("F.conv_transpose1d", {"bias": None}).infer_shapes([(1, 4, 4, 4),
                                                                      (4, 3, 3)])


# ----- pnnx exports run by the graph --------------------------------------------------------------

def check_exported(folder, module, name, types, shapes, *other_shapes):
    """Export ``module`` with pnnx for inputs of ``shapes`` (and dynamic over ``other_shapes``
    if given), check pnnx wrote each of ``types``, run the files with RuntimeGraph (fast and
    reference kernels) on random inputs of each set of shapes and compare with torch."""
    module = module.eval()
    examples = [tuple(torch.from_numpy(rand(*s)) for s in each) for each in (shapes,
                                                                             *other_shapes)]
    param, binary = export_module(module, examples[0], folder, name,
                                  example_inputs2=examples[1] if other_shapes else None)
    written = {line.split()[0] for line in param.read_text().splitlines()[2:]}
    assert set(types) <= written, f"pnnx wrote {sorted(written)}"
    for reference in (False, True):
        graph = RuntimeGraph(param, binary, reference=reference).build()
        for input_shapes in (shapes, *other_shapes):
            xs = [rand(*s) for s in input_shapes]
            with torch.no_grad():
                want = module(*(torch.from_numpy(x.copy()) for x in xs))
            want = [want] if isinstance(want, torch.Tensor) else list(want)
            got = graph.forward(*xs)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype
                np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-4)


class Convolutions1d(nn.Module):
    """Every 1-D convolution pnnx writes: nn.Conv1d with padding modes and 'same',
    nn.ConvTranspose1d, and F.conv1d / F.conv_transpose1d with weights computed from the
    second input (pnnx folds constant weights into nn.Conv1d / nn.ConvTranspose1d)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)
        self.reflect = nn.Conv1d(6, 6, 4, padding="same", padding_mode="reflect")   # ()
        self.replicate = nn.Conv1d(6, 6, 4, padding="same", dilation=2,
                                   padding_mode="replicate")
        self.up = nn.ConvTranspose1d(6, 4, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x, w, b):                                     # (N, 4, L), (4, 4, 3), (4,)
        y = self.up(self.replicate(self.reflect(self.conv(x))))
        y = F.conv1d(y, w * 0.5, None, 1, "same")
        return F.conv_transpose1d(y, w + 1.0, b * 2.0, stride=2, padding=1)


class Convolutions2d(nn.Module):
    """nn.Conv2d padding modes and 'same' / 'valid', nn.ConvTranspose2d with output_padding and
    groups, F.conv2d and F.conv_transpose2d with weights computed from the second input."""

    def __init__(self):
        super().__init__()
        self.circular = nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2),
                                  padding_mode="circular")
        self.replicate = nn.Conv2d(4, 4, 3, padding=(2, 1), padding_mode="replicate", bias=False)
        self.valid = nn.Conv2d(4, 8, 2, padding="valid")
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)

    def forward(self, x, w, b):                      # (N, 3, H, W), (6, 3, 3, 3), (6,)
        y = self.up(self.valid(self.replicate(self.circular(x))))
        y = F.conv_transpose2d(y, w * 0.5, None, stride=2, groups=2, dilation=2)   # 6 -> 6
        return F.conv2d(y, w - 0.1, b * 2.0, padding=(1, 0), stride=(1, 2), groups=2)


def test_pnnx_export_of_1d_convolutions(tmp_path):
    check_exported(tmp_path, Convolutions1d(), "convolutions_1d",
                   ["nn.Conv1d", "F.conv1d", "nn.ConvTranspose1d", "F.conv_transpose1d"],
                   [(2, 4, 16), (4, 4, 3), (4,)], [(3, 4, 21), (4, 4, 3), (4,)])


def test_pnnx_export_of_2d_convolutions(tmp_path):
    check_exported(tmp_path, Convolutions2d(), "convolutions_2d",
                   ["nn.Conv2d", "F.conv2d", "nn.ConvTranspose2d", "F.conv_transpose2d"],
                   [(1, 3, 10, 9), (6, 3, 3, 3), (6,)], [(2, 3, 13, 12), (6, 3, 3, 3), (6,)])


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
    ("nn.Conv2d", Conv2d), ("F.conv2d", FunctionalConv2d), ("nn.Conv1d", Conv1d),
    ("F.conv1d", FunctionalConv1d), ("nn.ConvTranspose2d", ConvTranspose2d),
    ("F.conv_transpose2d", FunctionalConvTranspose2d), ("nn.ConvTranspose1d", ConvTranspose1d),
    ("F.conv_transpose1d", FunctionalConvTranspose1d)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
