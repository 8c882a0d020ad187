"""The squeeze-and-excitation layer that fusion makes (layers/excitation.py) and its kernel
(layers/fast/excitation.py): both against torch, the fast one against the reference, on the
activation pairs real models use, batches, image sizes from 1x1 up, NaN and odd layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import make_layer
from layers.excitation import SqueezeExcitation
from layers.fast.layers import FastSqueezeExcitation
from parser.errors import ShapeError

# (reduce's activation, the gate): MobileNetV3, EfficientNet, none, others the kernels know,
# and GELU's tanh form, which they do not (the fast layer hands it to the reference)
ACTIVATIONS = [("nn.ReLU", "nn.Hardsigmoid"), ("nn.SiLU", "nn.Sigmoid"), (None, None),
               ("nn.ReLU6", "nn.Tanh"), ("nn.GELU", "nn.Hardswish"),
               ("nn.GELU approximate=tanh", "nn.Sigmoid")]


def activation(spec: str | None, fast: bool):
    """The activation layer of ``spec`` ("nn.GELU approximate=tanh": with that parameter)."""
    if spec is None:
        return None
    type_name, *params = spec.split()
    return make_layer(type_name, dict(p.split("=") for p in params), fast=fast)


def torch_activation(spec: str | None, x: torch.Tensor) -> torch.Tensor:
    functions = {"nn.ReLU": F.relu, "nn.Hardsigmoid": F.hardsigmoid, "nn.SiLU": F.silu,
                 "nn.Sigmoid": torch.sigmoid, "nn.ReLU6": F.relu6, "nn.Tanh": torch.tanh,
                 "nn.GELU": F.gelu, "nn.Hardswish": F.hardswish,
                 "nn.GELU approximate=tanh": lambda v: F.gelu(v, approximate="tanh")}
    return x if spec is None else functions[spec](x)


def block(channels: int, squeezed: int, acts, fast: bool, bias: bool = True, seed: int = 0):
    """(the layer, the torch function) of one block with random weights."""
    rng = np.random.default_rng(seed)
    convs, torch_convs = [], []
    for c_in, c_out, act in ((channels, squeezed, acts[0]), (squeezed, channels, acts[1])):
        weight = rng.standard_normal((c_out, c_in, 1, 1), dtype=np.float32) / np.sqrt(c_in)
        weights = {"weight": weight}
        if bias:
            weights["bias"] = rng.standard_normal(c_out, dtype=np.float32)
        conv = make_layer("nn.Conv2d", dict(in_channels=c_in, out_channels=c_out,
                                            kernel_size=(1, 1), bias=bias), weights, fast=fast)
        if act is not None:
            conv.fuse_activation(activation(act, fast))
        convs.append(conv)
        torch_convs.append((torch.from_numpy(weight),
                            torch.from_numpy(weights["bias"]) if bias else None, act))
    layer = (FastSqueezeExcitation if fast else SqueezeExcitation)(*convs)

    def torch_block(x: torch.Tensor) -> torch.Tensor:
        gate = F.adaptive_avg_pool2d(x, 1)
        for weight, b, act in torch_convs:
            gate = torch_activation(act, F.conv2d(gate, weight.to(x.dtype),
                                                  None if b is None else b.to(x.dtype)))
        return gate * x
    return layer, torch_block


@pytest.mark.parametrize("acts", ACTIVATIONS, ids=lambda a: f"{a[0]}-{a[1]}")
@pytest.mark.parametrize("channels, squeezed, shape", [
    (16, 8, (1, 56, 56)), (96, 24, (2, 14, 14)), (576, 144, (1, 7, 7)), (8, 2, (3, 1, 1)),
    (32, 8, (1, 112, 112)), (40, 10, (2, 9, 7))])
def test_both_floors_match_torch(acts, channels, squeezed, shape):
    n, h, w = shape
    x = np.random.default_rng(1).standard_normal((n, channels, h, w), dtype=np.float32)
    want = None
    for fast in (False, True):
        layer, torch_block = block(channels, squeezed, acts, fast)
        if want is None:
            want = torch_block(torch.from_numpy(x)).numpy()
        assert layer.infer_shapes([x.shape]) == [x.shape]
        layer.prepare([x.shape])
        got = layer.forward([x])[0]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
        if fast:
            out = np.full_like(x, np.nan)
            layer.forward_into([x], [out])               # the graph's way
            np.testing.assert_array_equal(out, got)
            assert layer.in_kernel == (acts[0] != "nn.GELU approximate=tanh")


def test_no_bias_and_a_nan_stay_as_torch_has_them():
    layer, torch_block = block(24, 6, ("nn.ReLU", "nn.Sigmoid"), fast=True, bias=False)
    x = np.random.default_rng(2).standard_normal((2, 24, 5, 5), dtype=np.float32)
    x[1, 3, 2, 2] = np.nan                  # the image's mean, so every gate of image 1
    got = layer.forward([x])[0]
    want = torch_block(torch.from_numpy(x)).numpy()
    assert np.isnan(got[1]).all() and not np.isnan(got[0]).any()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_other_layouts_and_dtypes_give_torchs_answer():
    layer, torch_block = block(12, 4, ("nn.SiLU", "nn.Sigmoid"), fast=True)
    x = np.random.default_rng(3).standard_normal((2, 12, 10, 8), dtype=np.float32)
    strided = x[:, :, ::2]                   # not C-contiguous
    want = torch_block(torch.from_numpy(strided.copy())).numpy()
    np.testing.assert_allclose(layer.forward([strided])[0], want, atol=1e-5, rtol=1e-4)
    out = np.empty(strided.shape, np.float32)
    layer.forward_into([strided], [out])
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-4)
    wide = x.astype(np.float64)              # the reference path
    np.testing.assert_allclose(layer.forward([wide])[0],
                               torch_block(torch.from_numpy(x)).numpy(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fast", [False, True])
def test_a_wrong_input_shape_is_refused(fast):
    layer, _ = block(12, 4, ("nn.ReLU", "nn.Hardsigmoid"), fast=fast)
    for shape in [(1, 8, 5, 5), (12, 5, 5), (1, 12, 5, 5, 1)]:
        x = np.zeros(shape, np.float32)
        with pytest.raises(ShapeError, match="squeeze-and-excitation"):
            layer.infer_shapes([shape])
        with pytest.raises(ShapeError, match="squeeze-and-excitation"):
            layer.forward([x])
        if fast:
            with pytest.raises(ShapeError, match="squeeze-and-excitation"):
                layer.forward_into([x], [np.empty_like(x)])


@pytest.mark.parametrize("fast", [False, True])
def test_an_empty_batch_is_empty_and_an_empty_image_refused_as_the_pool_does(fast):
    layer, torch_block = block(12, 4, ("nn.ReLU", "nn.Sigmoid"), fast=fast)
    x = np.zeros((0, 12, 5, 5), np.float32)
    assert layer.forward([x])[0].shape == torch_block(torch.from_numpy(x)).shape == x.shape
    x = np.zeros((2, 12, 0, 3), np.float32)                  # nn.AdaptiveAvgPool2d's refusal
    with pytest.raises(ShapeError, match="at least 1"):
        layer.forward([x])
    if fast:
        with pytest.raises(ShapeError, match="at least 1"):
            layer.forward_into([x], [np.empty_like(x)])


def test_convolutions_that_disagree_are_refused():
    """reduce 12 -> 4, expand built for 3 inputs: the convolutions' own error."""
    reduce, _ = block(12, 4, (None, None), fast=True)
    other, _ = block(12, 3, (None, None), fast=True)
    layer = FastSqueezeExcitation(reduce.reduce, other.expand)
    with pytest.raises(ShapeError, match="channels"):
        layer.infer_shapes([(1, 12, 5, 5)])


@pytest.mark.parametrize("keeps, residual", [(True, False), (False, True), (True, True)],
                         ids=["x + x * g", "x * g + r", "x + x * g + r"])
@pytest.mark.parametrize("shape", [(2, 24, 9, 7), (1, 24, 1, 1)])
def test_a_residual_block_adds_x_and_r_as_torch_rounds_them(keeps, residual, shape):
    """PP-LCNet's and DBNet's blocks: y = x + x * g (+ r), each sum rounded as torch rounds
    it, on both floors; a residual of another shape (broadcast) runs the reference."""
    rng = np.random.default_rng(4)
    x, r = rng.standard_normal((2, *shape), dtype=np.float32) * 5
    for fast in (False, True):
        layer, torch_block = block(24, 6, ("nn.ReLU", "nn.Hardsigmoid"), fast=fast)
        layer.fuse_output(keeps, residual)
        inputs = [x, r] if residual else [x]
        t = torch.from_numpy(x)
        want = torch_block(t) + (t if keeps else 0) + (torch.from_numpy(r) if residual else 0)
        assert layer.infer_shapes([a.shape for a in inputs]) == [x.shape]
        got = layer.forward(inputs)[0]
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)
        if fast:
            out = np.full_like(x, np.nan)
            layer.forward_into(inputs, [out])
            np.testing.assert_array_equal(out, got)
            if residual:                                  # another shape: broadcast
                bigger = np.stack([r, r, r])                 # (3, N, C, H, W)
                (got,) = layer.forward([x, bigger])
                assert got.shape == bigger.shape
                np.testing.assert_allclose(got, (torch_block(t) + (t if keeps else 0)
                                                 + torch.from_numpy(bigger)).numpy(),
                                           atol=1e-5, rtol=1e-5)
                column = r[:, :, :, :1].copy()
                want = layer.forward([x, column])[0]
                np.testing.assert_allclose(want, (torch_block(t) + (t if keeps else 0)
                                                  + torch.from_numpy(column)).numpy(),
                                           atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keeps, residual", [(False, False), (True, True)])
@pytest.mark.parametrize("shape", [(1, 96, 14, 14), (2, 40, 30, 17), (3, 576, 7, 7)])
def test_helper_threads_give_the_same_bits(monkeypatch, team_calls, keeps, residual, shape):
    """Shared with a helper thread (the means and the scaling by planes, the gates on the
    calling thread), the block gives the bits one thread gives, and torch's answer."""
    from layers.fast import excitation, workers

    rng = np.random.default_rng(5)
    x, r = rng.standard_normal((2, *shape), dtype=np.float32) * 3
    layer, torch_block = block(shape[1], shape[1] // 4, ("nn.ReLU", "nn.Hardsigmoid"),
                               fast=True)
    layer.fuse_output(keeps, residual)
    inputs = [x, r] if residual else [x]
    alone = layer.forward(inputs)[0]
    t = torch.from_numpy(x)
    want = torch_block(t) + (t if keeps else 0) + (torch.from_numpy(r) if residual else 0)
    np.testing.assert_allclose(alone, want.numpy(), atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(excitation, "SHARED_FROM", 1)           # every block is shared
    calls = team_calls("squeeze_excitation")
    with workers.sharing(2) as team:
        if team is None:
            pytest.skip("no helper team here (numpy's OpenBLAS not found)")
        shared = layer.forward(inputs)[0]
    np.testing.assert_array_equal(shared, alone)
    assert calls == [1]
