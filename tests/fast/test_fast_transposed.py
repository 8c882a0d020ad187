"""The fast floor's transposed convolutions (layers/fast/layers.py, FastConvTranspose2d): a
kernel equal to its stride runs one register-tiled product and copies each tap to its place
(gemm.scatter_taps), and gives torch's values on one thread or two; every other geometry runs
the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from helpers import make_layer, rand
from infer import threads
from layers.fast.gemm import scatter_taps
from layers.fast.layers import FastConvTranspose1d, FastConvTranspose2d


def _module(c_in, c_out, kernel, stride, bias=True, **extra):
    torch.manual_seed(0)
    return nn.ConvTranspose2d(c_in, c_out, kernel, stride, bias=bias, **extra).eval()


def _layer(module, pnnx_type="nn.ConvTranspose2d"):
    params = dict(in_channels=module.in_channels, out_channels=module.out_channels,
                  kernel_size=module.kernel_size, stride=module.stride,
                  padding=module.padding, output_padding=module.output_padding,
                  dilation=module.dilation, groups=module.groups,
                  bias=module.bias is not None)
    weights = {"weight": module.weight.detach().numpy()}
    if module.bias is not None:
        weights["bias"] = module.bias.detach().numpy()
    return make_layer(pnnx_type, params, weights, fast=True)


@pytest.mark.parametrize("c_in, c_out, kernel, stride, shape, bias", [
    (256, 128, 2, 2, (1, 256, 16, 16), True),        # a UNet's up-convolution
    (32, 16, 2, 2, (2, 32, 9, 7), True),             # odd sizes, two images
    (5, 7, 3, 3, (1, 5, 4, 6), False),               # 3x3 stride 3, no bias
    (8, 4, (2, 3), (2, 3), (1, 8, 5, 5), True),      # a different kernel per axis
    (3, 6, 1, 1, (1, 3, 4, 4), True),                # 1x1: the product alone
    (4, 4, 2, 2, (0, 4, 3, 3), True),                # no images
], ids=str)
@pytest.mark.parametrize("num_threads", [1, 2])
def test_kernel_equal_to_stride_matches_torch(c_in, c_out, kernel, stride, shape, bias,
                                              num_threads):
    module = _module(c_in, c_out, kernel, stride, bias)
    layer = _layer(module)
    assert isinstance(layer, FastConvTranspose2d) and layer.no_overlap
    x = rand(*shape)
    with threads.limit(num_threads):
        (got,) = layer.forward([x])
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kh, kw, shape", [(2, 2, (2, 3, 5, 7)), (2, 3, (1, 4, 3, 1)),
                                            (1, 4, (1, 2, 1, 9)), (3, 1, (0, 2, 2, 2))])
def test_scatter_taps_puts_each_tap_in_its_place(kh, kw, shape):
    n, c_out, h, w = shape
    cols = rand(n, kh * kw * c_out, h * w)
    y = np.full((n, c_out, h * kh, w * kw), np.nan, np.float32)
    scatter_taps(cols, y, kh, kw)
    want = cols.reshape(n, kh, kw, c_out, h, w).transpose(0, 3, 4, 1, 5, 2)
    np.testing.assert_array_equal(y, want.reshape(y.shape))


@pytest.mark.parametrize("extra", [dict(padding=1), dict(output_padding=1),
                                   dict(dilation=2), dict(groups=2)], ids=str)
def test_other_geometries_run_the_reference(extra):
    stride = 3 if "output_padding" in extra or "dilation" in extra else 2
    module = _module(4, 6, 2, stride, **extra)
    layer = _layer(module)
    assert not layer.no_overlap
    x = rand(1, 4, 5, 6)
    (got,) = layer.forward([x])
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_nan_and_inf_stay_in_their_own_outputs():
    """Without overlapping windows an input pixel reaches only its own kh x kw block."""
    module = _module(3, 2, 2, 2)
    x = rand(1, 3, 4, 4)
    x[0, 1, 1, 2], x[0, 0, 3, 0] = np.nan, np.inf
    (got,) = _layer(module).forward([x])
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-5)


def test_conv_transpose1d_with_kernel_equal_to_stride():
    torch.manual_seed(1)
    module = nn.ConvTranspose1d(6, 3, 4, 4).eval()
    layer = make_layer("nn.ConvTranspose1d", dict(
        in_channels=6, out_channels=3, kernel_size=(4,), stride=(4,), padding=(0,),
        output_padding=(0,), dilation=(1,), groups=1, bias=True),
        {"weight": module.weight.detach().numpy(), "bias": module.bias.detach().numpy()},
        fast=True)
    assert isinstance(layer, FastConvTranspose1d) and layer.no_overlap
    x = rand(2, 6, 9)
    (got,) = layer.forward([x])
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_in_a_graph_it_writes_into_the_planned_buffer(tmp_path):
    """Two up-convolutions in a row, each into the memory plan's buffer (forward_into),
    on two threads: torch's values, and a second forward the same as the first."""
    from infer import RuntimeGraph
    from support import write_model

    first, second = _module(8, 4, 2, 2), _module(4, 2, 2, 2)
    weights = {}
    for name, module in (("up1", first), ("up2", second)):
        weights[f"{name}.weight"] = module.weight.detach().numpy()
        weights[f"{name}.bias"] = module.bias.detach().numpy()
    line = ("nn.ConvTranspose2d {name} 1 1 {a} {b} bias=True dilation=(1,1) groups=1 "
            "in_channels={i} kernel_size=(2,2) out_channels={o} output_padding=(0,0) "
            "padding=(0,0) stride=(2,2) @bias=({o})f32 @weight=({i},{o},2,2)f32")
    param, binary = write_model(
        tmp_path, "pnnx.Input in0 0 1 x #x=(1,8,5,6)f32",
        line.format(name="up1", a="x", b="h", i=8, o=4),
        line.format(name="up2", a="h", b="y", i=4, o=2),
        "pnnx.Output out0 1 0 y", weights=weights)
    graph = RuntimeGraph(str(param), str(binary))
    graph.build()
    graph.set_num_threads(2)
    assert [type(s.layer) for s in graph.run_list] == [FastConvTranspose2d] * 2
    x = rand(1, 8, 5, 6)
    (got,) = graph.forward(x)
    with torch.no_grad():
        want = second(first(torch.from_numpy(x))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(graph.forward(x)[0], got)


@pytest.mark.parametrize("channels", [5, 12])
def test_a_wrong_channel_count_is_refused_before_any_kernel_reads(channels):
    """The product reads as many input channels as the weight has: another count is the
    reference's ShapeError, in forward and forward_into alike."""
    from parser.errors import ShapeError

    layer = _layer(_module(8, 6, 2, 2))
    x = rand(1, channels, 3, 3)
    with pytest.raises(ShapeError, match="channels"):
        layer.forward([x])
    with pytest.raises(ShapeError, match="channels"):
        layer.forward_into([x], [np.empty((1, 6, 6, 6), np.float32)])
