"""Calls worked out once for a shape (pointwise.pointwise_product, pointwise_transposed.
transposed_product, depthwise.depthwise_product, gemm.im2col_product, and FastConv2d's direct
calls, which run them): they check the arrays they are given, then run the kernels without
the per-argument checks, so a wrong array is a ShapeError, never a read or write past one;
alone and shared with helper threads they give the same bits, torch's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import make_layer
from layers.fast import backend, gemm
from layers.fast.depthwise import depthwise_product, pack_channel_blocks
from layers.fast.epilogue import IDENTITY, RELU, Activation
from layers.fast.gemm import im2col_product, in_bands, pack_gemm_weight
from layers.fast.pointwise import pointwise_product
from layers.fast.pointwise_transposed import pack_panels, transposed_product
from layers.fast.team import set_current_team
from parser.errors import ShapeError

C_IN, C_OUT, H, W = 24, 40, 7, 9
BANDED_HW = (18, 17)           # im2col's cols band by band (gemm.BANDS_FROM, BANDS_MIN_PIXELS)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def product_and_reference(kind: str):
    """(product(x, residual, y), x, y's shape, torch's y of x) of one kind, random weights."""
    bias = rand(C_OUT if kind != "depthwise" else C_IN, seed=2)
    if kind == "depthwise":
        weight = rand(C_IN, 3, 3, seed=1)
        x = rand(2, C_IN, H, W, seed=3)
        blocks = pack_channel_blocks(weight)
        call = depthwise_product(blocks, bias, C_IN, (1, 1), (1, 1, 1, 1), (1, 1), (H, W),
                                 IDENTITY)

        def product(x, residual, y):
            assert residual is None
            call(x, y)
        want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight[:, None]),
                        torch.from_numpy(bias), padding=1, groups=C_IN).numpy()
        return product, x, (2, C_IN, H, W), want
    if kind.startswith("im2col"):                      # 3x3, padding 1: one group
        h, w = (H, W) if kind == "im2col" else BANDED_HW
        weight = rand(C_OUT, C_IN, 3, 3, seed=1)
        x = rand(2, C_IN, h, w, seed=3)
        product = im2col_product(pack_gemm_weight(weight, 1), bias, (3, 3), (1, 1),
                                 (1, 1, 1, 1), (1, 1), (h, w), IDENTITY)
        assert in_bands((3, 3), 9 * C_IN, h * w) == (kind == "im2col in bands")
        want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                        padding=1).numpy()
        return product, x, (2, C_OUT, h, w), want
    weight = rand(C_OUT, C_IN, seed=1)
    x = rand(2, C_IN, H * W, seed=3)
    if kind == "transposed":
        product = transposed_product(pack_panels(weight), bias, C_IN, C_OUT, H * W, IDENTITY)
    else:
        product = pointwise_product(pack_gemm_weight(weight[:, :, None, None], 1), bias,
                                    H * W, IDENTITY)
    want = np.einsum("ok,nkl->nol", weight.astype(np.float64), x) + bias[:, None]
    return product, x, (2, C_OUT, H * W), want


KINDS = ["pointwise", "transposed", "depthwise", "im2col", "im2col in bands"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_prepared_call_computes_what_torch_does_alone_and_shared(kind, forward_with_helpers):
    product, x, y_shape, want = product_and_reference(kind)
    shared = np.empty(y_shape, np.float32)
    product(x, None, shared)                           # inside a forward with helpers
    set_current_team(None)                             # as a forward without them
    try:
        alone = np.empty(y_shape, np.float32)
        product(x, None, alone)
    finally:
        set_current_team(forward_with_helpers)
    np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(shared, alone)


@pytest.mark.parametrize("kind", KINDS)
def test_a_prepared_call_refuses_wrong_arrays_before_the_kernel_runs(kind):
    backend.start()
    product, x, y_shape, _ = product_and_reference(kind)
    n = y_shape[0]
    wide = np.zeros((*y_shape[:-1], 2 * y_shape[-1]), np.float32)
    wrong = {
        "a float64 input": (x.astype(np.float64), None, np.zeros(y_shape, np.float32)),
        "too few input channels": (x[:, 1:].copy(), None, np.zeros(y_shape, np.float32)),
        "a strided output": (x, None, wide[..., ::2]),
        "an output of another shape": (x, None, np.zeros((n + 1, *y_shape[1:]), np.float32)),
        "an output of its size, not its shape": (x, None, np.zeros((n, y_shape[1] * y_shape[2],
                                                                   *y_shape[3:]), np.float32)),
    }
    if kind != "depthwise":
        wrong["a residual of another shape"] = (x, np.zeros((n, y_shape[1], 3), np.float32),
                                                np.zeros(y_shape, np.float32))
        wrong["a strided residual"] = (x, wide[..., ::2], np.zeros(y_shape, np.float32))
        wrong["a residual of y's size, not its shape"] = (
            x, np.zeros((n, y_shape[2], y_shape[1], *y_shape[3:]), np.float32),
            np.zeros(y_shape, np.float32))
        wrong["an input of its size, not its shape"] = (
            x.reshape(n, x.shape[2], x.shape[1], *x.shape[3:]), None,
            np.zeros(y_shape, np.float32))
    if kind.startswith("im2col"):
        wrong["an input without its rows"] = (x.reshape(n, C_IN, -1), None,
                                              np.zeros(y_shape, np.float32))
    for what, (xs, residual, y) in wrong.items():
        with pytest.raises(ShapeError):
            product(xs, residual, y)
        assert not y.any() and not wide.any(), f"{what}: written"


@pytest.mark.parametrize("kind", ["im2col", "im2col in bands"])
def test_an_im2col_product_adds_a_residual_and_activates_with_its_copies_shared(
        kind, forward_with_helpers, monkeypatch):
    """The cols (or phases) copied by the helpers too (sharing from the first value), a
    residual added and ReLU applied: torch's values, on strided 3x3s of two input sizes with
    the same output size."""
    monkeypatch.setattr(gemm, "IM2COL_SHARED_FROM", 0)
    h, w = (2 * H, 2 * W) if kind == "im2col" else (2 * BANDED_HW[0], 2 * BANDED_HW[1])
    weight, bias = rand(C_OUT, C_IN, 3, 3, seed=1), rand(C_OUT, seed=2)
    product = im2col_product(pack_gemm_weight(weight, 1), bias, (3, 3), (2, 2), (1, 1, 1, 1),
                             (1, 1), (h // 2, w // 2), Activation(RELU))
    for size in ((h, w), (h - 1, w - 1)):          # both have (h / 2, w / 2) outputs
        x, residual = rand(2, C_IN, *size, seed=3), rand(2, C_OUT, h // 2, w // 2, seed=4)
        y = np.full(residual.shape, np.nan, np.float32)
        product(x, residual, y)
        want = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(weight),
                               torch.from_numpy(bias), stride=2, padding=1)
                      + torch.from_numpy(residual)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_an_im2col_product_refuses_an_input_size_or_an_output_shape_not_its_own():
    backend.start()
    product, x, y_shape, _ = product_and_reference("im2col")
    n = y_shape[0]
    wrong = {"an input of another size": (rand(n, C_IN, H + 1, W), np.zeros(y_shape, np.float32)),
             "an input turned around": (rand(n, C_IN, W, H), np.zeros(y_shape, np.float32)),
             "an output turned around": (x, np.zeros((n, C_OUT, W, H), np.float32)),
             "an output of its size, in rows": (x, np.zeros((n, C_OUT, H * W), np.float32))}
    for what, (xs, y) in wrong.items():
        with pytest.raises(ShapeError, match="im2col product"):
            product(xs, None, y)
        assert not y.any(), f"{what}: written"


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_fast_conv_runs_its_direct_call_until_a_fusion_changes_it(kernel_size):
    """FastConv2d.forward_into makes its call at the first input of a shape and runs it
    directly after that; fusing an activation forgets it."""
    weight, bias = rand(C_OUT, C_IN, kernel_size, kernel_size), rand(C_OUT, seed=1)
    conv = make_layer("nn.Conv2d", dict(in_channels=C_IN, out_channels=C_OUT,
                                        kernel_size=(kernel_size, kernel_size),
                                        padding=(kernel_size // 2,) * 2),
                      {"weight": weight, "bias": bias}, fast=True)
    x = rand(1, C_IN, H, W, seed=3)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                    padding=kernel_size // 2).numpy()
    for _ in range(2):                                 # made, then run directly
        y = np.full((1, C_OUT, H, W), np.nan, np.float32)
        conv.forward_into([x], [y])
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert x.shape in conv._direct
    conv.fuse_activation(make_layer("nn.ReLU", fast=True))
    assert x.shape not in conv._direct
    conv.forward_into([x], [y])
    np.testing.assert_allclose(y, np.maximum(want, 0), rtol=1e-4, atol=1e-4)
    strided = np.zeros((1, C_OUT, H, 2 * W), np.float32)[..., ::2]
    conv.forward_into([x], [strided])                  # not the kernels': written over
    np.testing.assert_allclose(strided, np.maximum(want, 0), rtol=1e-4, atol=1e-4)
    frozen = np.zeros((1, C_OUT, H, W), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):                    # numpy's copy refuses it
        conv.forward_into([x], [frozen])
    assert not frozen.any()


def test_an_activation_code_reaches_the_prepared_kernel():
    """The activation worked out once is the one applied (ReLU here)."""
    backend.start()
    weight, x = rand(C_OUT, C_IN, seed=1), rand(1, C_IN, H * W, seed=3)
    product = transposed_product(pack_panels(weight), None, C_IN, C_OUT, H * W,
                                 Activation(RELU))
    y = np.empty((1, C_OUT, H * W), np.float32)
    product(x, None, y)
    np.testing.assert_allclose(y, np.maximum(np.einsum("ok,nkl->nol", weight, x), 0),
                               rtol=1e-4, atol=1e-4)


def test_the_public_functions_refuse_what_their_kernels_would_read_or_write_past():
    """pointwise_conv2d checks x against the weight and y (not only x against itself), an
    output must be writeable, and PackedConv2d.run's ``out`` must be laid out as the kernels
    write it."""
    from layers.fast.conv import PackedConv2d
    from layers.fast.pointwise import pointwise_conv2d

    backend.start()
    weight = pack_gemm_weight(rand(8, 8, 1, 1), 1)
    y = np.zeros((1, 8, 10), np.float32)
    for x, out in ((rand(1, 4, 10), y), (rand(1, 8, 5), y),            # too few channels,
                   (rand(1, 8, 10), np.zeros((1, 8, 20), np.float32)),   # pixels, for y,
                   (rand(1, 4, 20), y)):                  # x's size, but not its shape
        with pytest.raises(ShapeError):
            pointwise_conv2d(weight, x, None, None, IDENTITY, out)
    frozen = np.zeros((1, 8, 10), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ShapeError, match="writeable"):
        pointwise_conv2d(weight, rand(1, 8, 10), None, None, IDENTITY, frozen)
    assert not y.any()
    packed = PackedConv2d(rand(8, 8, 1, 1), None, (1, 1), (1, 1), 1)
    for x in (rand(1, 4, 5, 5), rand(1, 16, 5, 5), rand(8, 5, 5)):    # channels, dims
        with pytest.raises(ShapeError):
            packed.run(x, (0, 0, 0, 0), (5, 5), IDENTITY)
    for algorithm_size in (2, 7, 30):                  # transposed, upright 1x1
        x = rand(1, 8, algorithm_size, algorithm_size)
        strided = np.zeros((1, 8, algorithm_size, 2 * algorithm_size), np.float32)[..., ::2]
        with pytest.raises(ShapeError):
            packed.run(x, (0, 0, 0, 0), (algorithm_size,) * 2, IDENTITY, out=strided)
        assert not strided.any()
