"""The fast kernels (layers/fast) against the numpy reference kernels AND torch: depthwise,
Winograd, im2col/1x1 GEMM, the fused epilogue, and the nn.Conv2d / nn.Linear fast paths."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand, torch_module
from infer import threads
from layers import kernels
from layers.activation import (Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, ReLU, ReLU6,
                               ScaleShift, Sigmoid, SiLU, Tanh)
from layers.fast import depthwise, winograd, winograd_f2
from layers.fast import gemm
from layers.fast.algorithms import BY_NAME
from layers.fast.conv import PackedConv2d
from layers.fast.epilogue import IDENTITY, activation_of, bias_residual_activation
from parser.errors import ShapeError

ACTIVATIONS = {          # our layer, the torch function it mirrors
    "relu": (ReLU(), F.relu),
    "relu6": (ReLU6(), F.relu6),
    "hardtanh": (Hardtanh(min_val=-0.5, max_val=2.0), lambda t: F.hardtanh(t, -0.5, 2.0)),
    "leaky": (LeakyReLU(negative_slope=0.2), lambda t: F.leaky_relu(t, 0.2)),
    "sigmoid": (Sigmoid(), torch.sigmoid),
    "silu": (SiLU(), F.silu),
    "hardswish": (Hardswish(), F.hardswish),
    "hardsigmoid": (Hardsigmoid(), F.hardsigmoid),
    "tanh": (Tanh(), torch.tanh),
    # an expression folded in after the activation (infer/fusion.py)
    "hardswish, then affine": (ScaleShift(Hardswish(), 0.5, -0.25),
                               lambda t: F.hardswish(t) * 0.5 - 0.25),
    "relu, then affine": (ScaleShift(ReLU(), -1.5, 1.0), lambda t: F.relu(t) * -1.5 + 1.0),
    "affine": (ScaleShift(None, 1.25, -0.0), lambda t: t * 1.25),
}


@pytest.fixture
def winograd_from_16(monkeypatch):
    """The table without the direct convolution, as it chose before it: Winograd from 16
    input channels (the kernels' smallest case), where direct now takes 16 to 23."""
    from layers.fast import algorithms

    monkeypatch.setattr(algorithms, "DIRECT_LEAST_FILL", 2.0)


def run_packed(x, weight, bias, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
               groups=1, activation=IDENTITY, residual=None, winograd_ok=True, algorithm=None):
    """The fast kernel chosen for this convolution (or ``algorithm``, forced); padding is
    (top, bottom, left, right)."""
    top, bottom, left, right = padding
    padded = (*x.shape[:2], x.shape[2] + top + bottom, x.shape[3] + left + right)
    out_hw = kernels.conv2d_output_shape(padded, weight.shape, stride, 0, dilation, groups)[2:]
    packed = PackedConv2d(weight, bias, stride, dilation, groups, winograd=winograd_ok)
    if algorithm is not None:
        packed.algorithm = lambda batch, hw: algorithm
    return packed, packed.run(x, padding, out_hw, activation, residual)


def reference_conv(x, weight, bias, stride, padding, dilation, groups):
    """kernels.conv2d with an asymmetric (top, bottom, left, right) zero padding."""
    top, bottom, left, right = padding
    return kernels.conv2d(kernels.pad(x, (left, right, top, bottom)), weight, bias, stride, 0,
                          dilation, groups)


def torch_conv(x, weight, bias, stride, padding, dilation, groups):
    top, bottom, left, right = padding
    t = F.pad(torch.from_numpy(x.copy()), (left, right, top, bottom))
    return F.conv2d(t, torch.from_numpy(weight), None if bias is None else torch.from_numpy(bias),
                    stride, 0, dilation, groups).numpy()


def check_against_both(got, x, weight, bias, stride, padding, dilation, groups, atol=1e-4,
                       scale=1e-6):
    want_ref = reference_conv(x, weight, bias, stride, padding, dilation, groups)
    want_torch = torch_conv(x, weight, bias, stride, padding, dilation, groups)
    if want_ref.size:        # float32 errors grow with the outputs (up to ~50 here)
        atol = max(atol, scale * float(np.abs(want_ref).max()))
    assert got.shape == want_ref.shape == want_torch.shape
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want_ref, atol=atol, rtol=1e-4)
    np.testing.assert_allclose(got, want_torch, atol=atol, rtol=1e-4)


# ----- depthwise ----------------------------------------------------------------------------

DEPTHWISE = {   # (N, C, H, W), multiplier, kernel, stride, (top, bottom, left, right), dilation
    "3x3 pad 1": ((2, 8, 11, 10), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3 stride 2 asym pad": ((1, 6, 12, 13), 1, (3, 3), (2, 2), (0, 1, 0, 1), (1, 1)),
    "5x5 stride 2": ((2, 5, 15, 14), 1, (5, 5), (2, 2), (1, 2, 1, 2), (1, 1)),
    "5x5 pad 2": ((1, 4, 9, 9), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "dilated (2,3)": ((1, 3, 13, 14), 1, (3, 3), (1, 2), (2, 2, 3, 3), (2, 3)),
    "multiplier 2": ((2, 4, 7, 8), 2, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "7x1 no pad": ((1, 3, 10, 6), 1, (7, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    "pad wider than kernel": ((1, 2, 4, 4), 1, (3, 3), (3, 1), (3, 3, 4, 4), (1, 1)),
    "1x1 image": ((3, 4, 1, 1), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3 stride 2 pad 1 odd width": ((1, 5, 13, 15), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "5x5 stride 2 pad 2 even width": ((1, 3, 16, 16), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    "7x7 pad 3 (ConvNeXt)": ((1, 4, 9, 11), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),
    "stride 3 pad 2": ((1, 3, 14, 17), 1, (3, 3), (3, 3), (2, 1, 2, 1), (1, 1)),
    # rows of 32 values or more are split into their phases row by row, narrower ones by a map
    "3x3 stride 2 wide rows": ((1, 4, 9, 37), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "5x5 stride 2 rows of 32": ((1, 3, 6, 32), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    # no padding: the phase rows are wider than the output rows (copied out)
    "3x3 no pad": ((2, 3, 9, 12), 1, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    "5x5 stride 2 no pad": ((1, 3, 12, 11), 1, (5, 5), (2, 2), (0, 0, 0, 0), (1, 1)),
    # left padding longer than an output row
    "left pad past the row": ((1, 2, 3, 1), 1, (3, 3), (1, 1), (1, 1, 5, 0), (1, 1)),
    # channels last by blocks of LANES channels: several blocks, the last partial
    "channel blocks 5x5": ((2, 37, 7, 7), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "channel blocks 3x3 stride 2": ((1, 133, 9, 8), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "rows of 2 vectors and a part 7x7": ((1, 19, 37, 40), 1, (7, 7), (1, 1), (3, 3, 3, 3),
                                         (1, 1)),
    "stride 2 rows wider than a vector": ((1, 5, 20, 35), 1, (3, 3), (2, 2), (1, 1, 1, 1),
                                          (1, 1)),
    "3x3 dilation 2 on 14x14": ((2, 24, 14, 14), 1, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    "7x7 stride 3 no pad": ((1, 17, 23, 23), 1, (7, 7), (3, 3), (0, 0, 0, 0), (1, 1)),
    "1x1 stride 2": ((1, 20, 9, 9), 1, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    "kernel wider than the image": ((1, 3, 2, 3), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
}


@pytest.mark.parametrize("case", DEPTHWISE.values(), ids=DEPTHWISE.keys())
@pytest.mark.parametrize("with_bias", [True, False])
def test_depthwise_matches_reference_and_torch(case, with_bias):
    shape, mult, kernel, stride, padding, dilation = case
    x = rand(*shape)
    c = shape[1]
    weight, bias = rand(c * mult, 1, *kernel), (rand(c * mult) if with_bias else None)
    packed, got = run_packed(x, weight, bias, stride, padding, dilation, groups=c)
    assert packed.algorithm(shape[0], got.shape[2:]).startswith("depthwise")
    check_against_both(got, x, weight, bias, stride, padding, dilation, c)


@pytest.mark.parametrize("case", [c for c in DEPTHWISE.values() if c[1] == 1],
                         ids=[k for k, c in DEPTHWISE.items() if c[1] == 1])
@pytest.mark.parametrize("layout", ["planes", "channels last"])
def test_both_depthwise_layouts_match_reference_and_torch(case, layout):
    """The two depthwise kernels (one plane at a time; channels last, which the dispatcher
    picks for strided layers, small planes and other kernel sizes) on every case, whichever
    the dispatcher would pick."""
    shape, _, kernel, stride, padding, dilation = case
    x, c = rand(*shape), shape[1]
    weight, bias = rand(c, 1, *kernel), rand(c)
    out_hw = reference_conv(x, weight, bias, stride, padding, dilation, c).shape[2:]
    y = np.empty((shape[0], c, *out_hw), np.float32)
    taps = np.ascontiguousarray(weight[:, 0])
    if layout == "channels last":
        depthwise._depthwise_channels_last(x, depthwise.pack_channel_blocks(taps), bias, y,
                                           *stride, *dilation, padding[0], padding[2], 0, 0.0,
                                           0.0)
    else:
        depthwise._depthwise(x, taps, bias, y, *stride, *dilation, padding[0], padding[2], 0,
                             0.0, 0.0)
    check_against_both(y, x, weight, bias, stride, padding, dilation, c)


@pytest.mark.parametrize("layout, kernel, padding", [
    ("planes", (3, 3), (1, 1, 1, 1)), ("planes", (5, 5), (2, 2, 2, 2)),
    ("planes", (7, 7), (3, 3, 3, 3)), ("channels last", (3, 3), (1, 1, 1, 1)),
    ("channels last", (5, 5), (2, 2, 2, 2)), ("channels last", (7, 7), (3, 3, 3, 3)),
], ids=["planes 3x3", "planes 5x5", "planes 7x7", "channels last 3x3", "channels last 5x5",
        "channels last 7x7"])
def test_depthwise_inf_and_nan_at_the_edges_stay_in_their_windows(layout, kernel, padding):
    """The plane kernel reads the neighbouring row where a window passes the left or right
    edge, and masks that away: an Inf or NaN in the first or last column must reach only the
    outputs whose windows hold it (as in torch), never the row next to it."""
    c = 3
    x = rand(1, c, 9, 10)
    x[0, 0, 2, -1], x[0, 1, 5, 0], x[0, 2, 4, -1], x[0, 2, 7, 0] = np.inf, np.nan, -np.inf, np.inf
    weight, bias = rand(c, 1, *kernel), rand(c)
    y = np.empty((1, c, 9, 10), np.float32)
    taps = np.ascontiguousarray(weight[:, 0])
    if layout == "channels last":
        depthwise._depthwise_channels_last(x, depthwise.pack_channel_blocks(taps), bias, y,
                                           1, 1, 1, 1, padding[0], padding[2], 0, 0.0, 0.0)
    else:
        depthwise._depthwise(x, taps, bias, y, 1, 1, 1, 1, padding[0], padding[2], 0, 0.0, 0.0)
    want = torch_conv(x, weight, bias, (1, 1), padding, (1, 1), c)
    assert np.isfinite(want).sum() > 100          # most outputs do not see them
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_depthwise_arrays_that_do_not_fit_are_refused_before_the_kernel_runs():
    """The kernels trust the shapes: a wrong output, packed weight or bias is a ShapeError,
    never a write past an array."""
    x, taps = rand(1, 17, 5, 5), rand(17, 3, 3)
    blocks = depthwise.pack_channel_blocks(taps)
    wrong = [(taps, None, np.empty((1, 16, 5, 5), np.float32)),          # too few channels
             (blocks, None, np.empty((1, 17, 4, 5), np.float32)),         # too few rows
             (blocks[:1], None, np.empty((1, 17, 5, 5), np.float32)),     # a block missing
             (blocks, rand(16), np.empty((1, 17, 5, 5), np.float32))]     # bias too short
    for weight, bias, out in wrong:
        with pytest.raises(ShapeError, match="depthwise convolution"):
            depthwise.depthwise_conv2d(x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), (5, 5),
                                       IDENTITY, out)


def test_channels_last_needs_channels_that_fill_its_lanes():
    lanes = depthwise.LANES
    assert depthwise.uses_channels_last(lanes, lanes, (3, 3), (2, 2), (56, 56))
    assert depthwise.uses_channels_last(4 * lanes + 1, 4 * lanes + 1, (3, 3), (2, 2), (7, 7))
    assert not depthwise.uses_channels_last(3, 3, (3, 3), (2, 2), (112, 112))
    assert not depthwise.uses_channels_last(lanes + 1, lanes + 1, (5, 5), (1, 1), (7, 7))
    assert not depthwise.uses_channels_last(32, 64, (3, 3), (2, 2), (7, 7))   # multiplier 2


def test_large_planes_run_plane_by_plane():
    """Stride-1 3x3 / 5x5 go plane by plane on large planes; stride 2 stays channels last at
    any size whose input planes do not alias."""
    channels = 4 * depthwise.LANES
    for kernel, stride, small, large in [((3, 3), (1, 1), (23, 23), (24, 24)),
                                         ((5, 5), (1, 1), (39, 40), (40, 40))]:
        assert depthwise.uses_channels_last(channels, channels, kernel, stride, small)
        assert not depthwise.uses_channels_last(channels, channels, kernel, stride, large)
    for kernel in ((3, 3), (5, 5)):
        assert depthwise.uses_channels_last(channels, channels, kernel, (2, 2), (75, 75))
        assert depthwise.uses_channels_last(channels, channels, kernel, (2, 2), (66, 66))


def test_input_planes_that_alias_run_plane_by_plane():
    """Channels last reads LANES input planes side by side: planes a multiple of 4 KiB apart
    (96 x 96 floats, 64 x 64, 128 x 128) share L1 sets, so a stride-2 3x3 goes plane by plane
    on them at any size, a 5x5 from 64 x 64 outputs."""
    channels = 4 * depthwise.LANES
    uses = functools.partial(depthwise.uses_channels_last, channels, channels)
    assert depthwise.planes_alias((48, 48), (2, 2)) and depthwise.planes_alias((32, 16), (2, 2))
    assert not depthwise.planes_alias((56, 56), (2, 2))         # 112 x 112: 1 KiB off
    assert not depthwise.planes_alias((32, 36), (2, 2))         # 64 x 72: 2 KiB off
    assert not uses((3, 3), (2, 2), (48, 48)) and not uses((3, 3), (2, 2), (16, 16))
    assert uses((3, 3), (2, 2), (56, 56)) and uses((3, 3), (2, 2), (40, 40))
    assert uses((5, 5), (2, 2), (48, 48)) and not uses((5, 5), (2, 2), (64, 64))
    assert not uses((5, 5), (2, 2), (80, 80)) and uses((5, 5), (2, 2), (75, 75))
    assert uses((3, 3), (1, 1), (16, 16))                      # stride 1: not by aliasing
    weight = rand(channels, 1, 3, 3)
    packed = PackedConv2d(weight, None, (2, 2), (1, 1), channels)
    x = rand(1, channels, 96, 96)
    got = packed.run(x, (1, 1, 1, 1), (48, 48), IDENTITY)
    assert packed.algorithm(1, (48, 48)) == "depthwise"
    np.testing.assert_allclose(got, torch_conv(x, weight, None, (2, 2), (1, 1, 1, 1), (1, 1),
                                               channels), rtol=1e-5, atol=1e-5)


def test_one_block_of_one_image_goes_by_plane_on_large_planes():
    """One image of at most LANES channels is one unit of channels-last work, which the
    helpers cannot share: from ONE_UNIT_PLANES_FROM outputs it goes plane by plane."""
    lanes = depthwise.LANES
    weight = rand(lanes, 1, 3, 3)
    packed = PackedConv2d(weight, None, (2, 2), (1, 1), lanes)
    assert packed.algorithm(1, (56, 56)) == "depthwise"
    assert packed.algorithm(2, (56, 56)) == "depthwise_channels_last"
    assert packed.algorithm(1, (28, 28)) == "depthwise_channels_last"
    wider = PackedConv2d(rand(2 * lanes, 1, 3, 3), None, (2, 2), (1, 1), 2 * lanes)
    assert wider.algorithm(1, (56, 56)) == "depthwise_channels_last"


# ----- Winograd -----------------------------------------------------------------------------

@pytest.mark.parametrize("variant, seed", [(winograd, 1), (winograd_f2, 2)],
                         ids=["F(4x4)", "F(2x2)"])
def test_winograd_matrices_compute_a_3x3_correlation(variant, seed):
    """A^T [(G g G^T) * (B^T d B)] A is the valid correlation of a tile d with g: 4x4 outputs
    of a 6x6 tile for F(4x4), 2x2 of a 4x4 tile for F(2x2)."""
    outputs, taps = variant.A_T.shape
    rng = np.random.default_rng(seed)
    d, g = rng.standard_normal((taps, taps)), rng.standard_normal((3, 3))
    y = variant.A_T @ ((variant.G @ g @ variant.G.T) * (variant.B_T @ d @ variant.B_T.T)) \
        @ variant.A_T.T
    direct = np.array([[np.sum(d[r:r + 3, s:s + 3] * g) for s in range(outputs)]
                       for r in range(outputs)])
    np.testing.assert_allclose(y, direct, atol=1e-12)


WINOGRAD = {   # (N, C_in, H, W), C_out, (top, bottom, left, right); each >= 16 tiles, F(4x4)'s
    "56x56 pad 1": ((1, 16, 56, 56), 16, (1, 1, 1, 1)),       # 16 to 256 input channels
    "ragged tiles": ((4, 17, 11, 10), 7, (1, 1, 1, 1)),
    "no padding": ((2, 24, 18, 17), 4, (0, 0, 0, 0)),
    "asymmetric": ((2, 19, 15, 16), 6, (0, 2, 1, 0)),
    "batch 8 small": ((8, 32, 7, 7), 8, (1, 1, 1, 1)),
    "wide channels": ((1, 64, 24, 24), 32, (1, 1, 1, 1)),
    "pad 2": ((3, 16, 9, 13), 5, (2, 2, 2, 2)),
    "tiny images": ((16, 16, 3, 5), 2, (1, 1, 1, 1)),       # 16 x 2 tiles
    "many channels, 16x16": ((2, 65, 16, 16), 8, (1, 1, 1, 1)),
    "many channels, 28x28": ((1, 96, 28, 28), 8, (1, 1, 1, 1)),
    "256 channels, 14x14": ((1, 256, 14, 14), 16, (1, 1, 1, 1)),
}


WINOGRAD_F2 = {   # 16 input channels or more, and fewer than 16 tiles of 4x4 (or channels
    # above F(4x4)'s range), at least 16 of 2x2: F(2x2) is chosen
    "7x7 pad 1": ((1, 16, 7, 7), 8, (1, 1, 1, 1)),
    "12x12": ((1, 18, 12, 12), 12, (1, 1, 1, 1)),
    "odd sizes": ((2, 21, 5, 6), 7, (1, 1, 1, 1)),
    "no padding": ((1, 16, 11, 9), 3, (0, 0, 0, 0)),
    "asymmetric": ((2, 17, 6, 7), 6, (0, 2, 1, 0)),
    "pad 2": ((1, 20, 6, 5), 5, (2, 2, 2, 2)),
    "tiny images": ((8, 16, 3, 2), 2, (1, 1, 1, 1)),
    "past F(4x4)'s channels, 16x16": ((2, 520, 16, 16), 8, (1, 1, 1, 1)),
    "past F(4x4)'s channels, 28x28": ((1, 600, 28, 28), 8, (1, 1, 1, 1)),
}


@pytest.mark.parametrize("case, algorithm",
                         [(case, "winograd") for case in WINOGRAD.values()]
                         + [(case, "winograd_f2") for case in WINOGRAD_F2.values()],
                         ids=[f"F(4x4) {name}" for name in WINOGRAD]
                         + [f"F(2x2) {name}" for name in WINOGRAD_F2])
def test_winograd_matches_reference_and_torch(case, algorithm, winograd_from_16):
    shape, c_out, padding = case
    x = rand(*shape)
    weight, bias = rand(c_out, shape[1], 3, 3), rand(c_out)
    packed, got = run_packed(x, weight, bias, padding=padding)
    assert packed.algorithm(shape[0], got.shape[2:]) == algorithm
    # Winograd's transforms cost float32 ulps of the largest output: F(4x4) with 16 to 64
    # input channels, measured against float64 over 20 draws, up to 1.2e-6 of it (torch:
    # 6.5e-7), 1.6e-6 at 512; test_precision.py holds every kernel within 4x torch's error
    check_against_both(got, x, weight, bias, (1, 1), padding, (1, 1), 1, scale=5e-6)


def chunked_winograd(monkeypatch, chunk_bytes: int, per: int) -> list[int]:
    """Set Winograd's CHUNK_BYTES; the list it returns then gets, for each chunk run, the
    tiles of its V divided by ``per`` (a chunk's images, or a strip's rows of tiles)."""
    monkeypatch.setattr(winograd, "CHUNK_BYTES", chunk_bytes)
    made, scratch = [], winograd.scratch
    monkeypatch.setattr(winograd, "scratch", lambda name, shape: (
        made.append(shape[2] // per) if name == "winograd_v" and len(shape) == 3 else None,
        scratch(name, shape))[1])
    return made


@pytest.mark.parametrize("algorithm", ["winograd", "winograd_f2"])
@pytest.mark.parametrize("chunk_images, chunks", [(1, [1] * 5), (2, [2, 2, 1]), (3, [3, 2])])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_winograd_in_chunks_of_images_gives_the_same_bits(monkeypatch, algorithm, chunk_images,
                                                          chunks, num_threads):
    """A batch whose V and M would pass CHUNK_BYTES runs a few images at a time: each tile's
    sums are the same, so the result keeps its bits, whatever the chunk (one image, or a
    last chunk smaller than the others), residual and activation included, on one thread
    or shared with a helper."""
    from layers.fast.epilogue import RELU, Activation

    x, residual = rand(5, 16, 13, 11), rand(5, 24, 13, 11)
    weight, bias = rand(24, 16, 3, 3), rand(24)
    args = dict(padding=(1, 1, 1, 1), activation=Activation(RELU), residual=residual,
                algorithm=algorithm)
    with threads.limit(num_threads):
        _, whole = run_packed(x, weight, bias, **args)
        products, tiles = (36, 4 * 3) if algorithm == "winograd" else (16, 7 * 6)
        per_image = products * (16 + 24) * tiles * 4                  # bytes of V and M
        made = chunked_winograd(monkeypatch, chunk_images * per_image, tiles)
        _, chunked = run_packed(x, weight, bias, **args)
    assert made == chunks                          # images of each chunk, in order
    np.testing.assert_array_equal(chunked, whole)
    want = torch_conv(x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), 1) + residual
    np.testing.assert_allclose(whole, np.maximum(want, 0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("algorithm", ["winograd", "winograd_f2"])
@pytest.mark.parametrize("strip_rows", [1, 2, 3])
@pytest.mark.parametrize("padding", [(1, 1, 1, 1), (0, 2, 1, 0), (3, 0, 2, 2)],
                         ids=["same", "bottom", "tall top"])
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("finish", ["relu after a residual", "gelu, no residual"])
def test_winograd_in_strips_of_rows_gives_the_same_bits(monkeypatch, algorithm, strip_rows,
                                                         padding, num_threads, finish):
    """An image whose V and M alone would pass CHUNK_BYTES runs a strip of its rows of tiles
    at a time, each strip reading its rows of x (and the padding above the first) and writing
    its rows of y: the same bits as in one piece, with a residual (rows finished as a plane)
    or without (the tiles finished before they are gathered), strips whose heights differ
    by one at most, for any padding, on one thread or shared with a helper."""
    from layers.fast.epilogue import GELU, RELU, Activation

    top, bottom, left, right = padding
    x = rand(2, 16, 21, 11)
    out_hw = (21 + top + bottom - 2, 11 + left + right - 2)
    residual, weight, bias = rand(2, 24, *out_hw), rand(24, 16, 3, 3), rand(24)
    with_residual = finish == "relu after a residual"
    args = dict(padding=padding, activation=Activation(RELU if with_residual else GELU),
                residual=residual if with_residual else None, algorithm=algorithm)
    tile, products = (4, 36) if algorithm == "winograd" else (2, 16)
    tiles_h, tiles_w = -(-out_hw[0] // tile), -(-out_hw[1] // tile)
    with threads.limit(num_threads):
        _, whole = run_packed(x, weight, bias, **args)
        row_bytes = products * (16 + 24) * tiles_w * 4                # V and M of a row
        made = chunked_winograd(monkeypatch, strip_rows * row_bytes, tiles_w)
        _, strips = run_packed(x, weight, bias, **args)
    cut = winograd.chunks(2, tiles_h, row_bytes)
    assert made == [ty1 - ty0 for _, _, ty0, ty1 in cut]      # rows of tiles of each strip
    assert max(made) <= strip_rows and max(made) - min(made) <= 1
    for image in range(2):                                   # each image's rows, in order
        rows = [(ty0, ty1) for i, j, ty0, ty1 in cut if (i, j) == (image, image + 1)]
        assert rows[0][0] == 0 and rows[-1][1] == tiles_h
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
    np.testing.assert_array_equal(strips, whole)
    want = torch_conv(x, weight, bias, (1, 1), padding, (1, 1), 1)
    if with_residual:
        want = np.maximum(want + residual, 0)
    else:
        import torch
        want = torch.nn.functional.gelu(torch.from_numpy(want)).numpy()
    np.testing.assert_allclose(whole, want, atol=1e-4, rtol=1e-4)


def test_winograd_refuses_a_residual_of_another_shape():
    """Its kernels read the residual unchecked, chunk by chunk: a residual that is not y's
    shape is refused, not read past its end or dropped from later chunks."""
    x, weight = rand(2, 16, 12, 12), rand(8, 16, 3, 3)
    packed = PackedConv2d(weight, None, (1, 1), (1, 1), 1)
    call = BY_NAME["winograd"].make_call(packed, (1, 1, 1, 1), (12, 12), IDENTITY)
    with pytest.raises(ValueError, match="residual of shape"):
        call(x, rand(1, 8, 12, 12), np.empty((2, 8, 12, 12), np.float32))


@pytest.mark.parametrize("shape, algorithm", [((2, 16, 16, 16), "winograd"),
                                              ((1, 16, 7, 7), "winograd_f2")])
@pytest.mark.parametrize("values", [(np.inf, -np.inf, np.nan), (np.nan,), (-np.inf,)],
                         ids=["inf -inf nan", "nan alone", "-inf alone"])
def test_winograd_inputs_with_inf_or_nan_give_nan_where_torch_does(shape, algorithm, values,
                                                                   winograd_from_16):
    """Winograd's transforms would turn one Inf into NaN over whole tiles (inf - inf); the
    input transform sees any one of them, such an input goes through im2col, and NaN, +Inf
    and -Inf land where torch puts them."""
    x = rand(*shape)
    for where, value in zip([(0, 1, 3, 4), (0, 2, 5, 1), (-1, 0, 2, 2)], values):
        x[where] = value
    weight, bias = rand(6, shape[1], 3, 3), rand(6)
    packed, got = run_packed(x, weight, bias, padding=(1, 1, 1, 1))
    assert packed.algorithm(shape[0], got.shape[2:]) == algorithm
    want = torch_conv(x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)      # infinities and signs


def test_a_convolution_keeps_its_calls_for_a_bounded_number_of_sizes():
    """A stream of ever new input sizes (a detector fed photos as they come) must not grow
    a layer's per-size caches without end: past MAX_SIZES they start again, and a size
    whose call was dropped is made again, right."""
    from layers.base import MAX_SIZES

    params = dict(in_channels=4, out_channels=6, kernel_size=(3, 3), padding=(1, 1))
    module, weights = torch_module(nn.Conv2d, **params)
    layer = make_layer("nn.Conv2d", dict(params, bias=True), weights, fast=True)
    sizes = [(5 + i % 9, 5 + i // 9) for i in range(MAX_SIZES + 7)]
    for size in sizes + sizes[:3]:
        x = rand(1, 4, *size)
        y = np.empty((1, 6, *size), np.float32)
        layer.prepare([x.shape])                       # as the graph plans a new size
        layer.forward_into([x], [y])
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        for cache in (layer._geometries, layer._calls, layer.packed._calls,
                      layer.packed._chosen):
            assert 0 < len(cache) <= MAX_SIZES


@pytest.mark.parametrize("kind", ["nn.Conv2d", "nn.Conv1d"])
def test_the_call_is_made_when_the_graph_plans_the_size(kind, monkeypatch):
    """prepare (the graph's build, or a new size's plan) makes the call a forward then only
    looks up: Conv1d's under its lifted (N, C, 1, L) shape."""
    two_d = kind == "nn.Conv2d"
    params = dict(in_channels=4, out_channels=6, kernel_size=(3, 3) if two_d else 3,
                  padding=(1, 1) if two_d else 1)
    module, weights = torch_module(nn.Conv2d if two_d else nn.Conv1d, **params)
    layer = make_layer(kind, dict(params, bias=True), weights, fast=True)
    x = rand(2, 4, 7, 9) if two_d else rand(2, 4, 11)
    layer.prepare([x.shape])
    assert list(layer._calls) == [x.shape if two_d else (2, 4, 1, 11)]

    def no_new_call(*args):
        raise AssertionError("the forward made a call prepare should have made")
    monkeypatch.setattr(layer.packed, "call_for", no_new_call)
    y = np.empty(module(torch.from_numpy(x)).shape, np.float32)
    layer.forward_into([x], [y])
    with torch.no_grad():
        np.testing.assert_allclose(y, module(torch.from_numpy(x)).numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_a_convolution_loads_the_kernels_it_may_run_when_it_is_loaded(monkeypatch):
    """Which kernel runs depends on the input size, unknown at build for a dynamic export;
    so load_model loads every candidate's kernels then, not the first inference."""
    from layers.fast import conv as fast_conv

    loaded = []
    monkeypatch.setattr(fast_conv, "load_kernels", loaded.append)
    make_layer("nn.Conv2d", dict(in_channels=16, out_channels=4, kernel_size=(3, 3), bias=True),
               {"weight": rand(4, 16, 3, 3), "bias": rand(4)}, fast=True)
    assert sorted(loaded) == ["direct", "gemm", "gemm_transposed", "winograd", "winograd_f2"]
    loaded.clear()
    make_layer("nn.Conv2d", dict(in_channels=96, out_channels=4, kernel_size=(3, 3),
                                 bias=True), {"weight": rand(4, 96, 3, 3), "bias": rand(4)},
               fast=True)
    assert sorted(loaded) == ["direct", "gemm", "gemm_transposed", "winograd", "winograd_f2"]
    loaded.clear()
    make_layer("nn.Conv2d", dict(in_channels=600, out_channels=4, kernel_size=(3, 3),
                                 bias=True), {"weight": rand(4, 600, 3, 3), "bias": rand(4)},
               fast=True)
    assert sorted(loaded) == ["direct", "gemm", "gemm_transposed", "winograd_f2"]   # F(4x4):
                                                                                   # to 256
    loaded.clear()
    make_layer("nn.Conv2d", dict(in_channels=4, out_channels=4, kernel_size=(3, 3), bias=True),
               {"weight": rand(4, 4, 3, 3), "bias": rand(4)}, fast=True)
    assert sorted(loaded) == ["direct", "gemm", "gemm_transposed"]   # F(2x2): 16 channels up
    loaded.clear()
    make_layer("nn.Conv2d", dict(in_channels=4, out_channels=4, kernel_size=(3, 3), groups=4,
                                 bias=False), {"weight": rand(4, 1, 3, 3)}, fast=True)
    assert sorted(loaded) == ["depthwise", "depthwise_channels_last"]


def test_the_winograd_variant_follows_the_tiles_and_the_weights(winograd_from_16):
    packed = PackedConv2d(rand(8, 16, 3, 3), None, (1, 1), (1, 1), 1)
    assert packed.algorithm(8, (7, 7)) == "winograd"          # 32 tiles of 4x4
    assert packed.algorithm(1, (28, 28)) == "winograd"        # 49
    assert packed.algorithm(1, (14, 14)) == "winograd"        # 16
    assert packed.algorithm(1, (12, 12)) == "winograd_f2"     # 9 of 4x4, 36 of 2x2
    assert packed.algorithm(1, (7, 7)) == "winograd_f2"       # 16 of 2x2
    assert packed.algorithm(1, (5, 5)) == "gemm"              # 9 of 2x2: weights dominate
    few = PackedConv2d(rand(8, 8, 3, 3), None, (1, 1), (1, 1), 1)
    assert few.algorithm(8, (56, 56)) == "gemm"               # Winograd: 16 channels up
    assert PackedConv2d(rand(8, 128, 3, 3), None, (1, 1), (1, 1), 1).algorithm(
        1, (56, 56)) == "winograd"
    assert PackedConv2d(rand(8, 1024, 3, 3), None, (1, 1), (1, 1), 1).algorithm(
        1, (56, 56)) == "winograd_f2"                          # past F(4x4)'s channels
    big = PackedConv2d(rand(512, 512, 3, 3), None, (1, 1), (1, 1), 1)
    assert big.algorithm(8, (7, 7)) == "winograd_f2"
    assert big.algorithm(64, (56, 56)) == "winograd_f2"
    assert big.algorithm(1, (7, 7)) == "gemm_transposed"     # F(2x2) packs 16 MiB: 64 tiles
    assert big.algorithm(4, (7, 7)) == "winograd_f2"
    assert big.algorithm(1, (14, 14)) == "gemm_transposed"   # 49 of 2x2
    assert big.algorithm(1, (16, 16)) == "winograd_f2"        # 64
    middle = PackedConv2d(rand(256, 512, 3, 3), None, (1, 1), (1, 1), 1)
    assert middle.algorithm(1, (7, 7)) == "winograd_f2"       # F(2x2) packs 8 MiB
    strided = PackedConv2d(rand(8, 8, 3, 3), None, (2, 2), (1, 1), 1)
    assert strided.algorithm(8, (56, 56)) == "gemm"


# ----- GEMM: 1x1 and im2col ------------------------------------------------------------------

GEMM = {   # (N, C_in, H, W), C_out, kernel, stride, (top, bottom, left, right), dilation, groups
    "1x1": ((2, 16, 9, 8), 24, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1 groups 4": ((2, 16, 5, 6), 8, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 4),
    "1x1 stride 2": ((1, 8, 9, 9), 16, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "1x1 padded": ((1, 4, 5, 5), 6, (1, 1), (1, 1), (1, 1, 2, 0), (1, 1), 1),
    "1x1 stride (3, 2), bottom/right pad": ((2, 4, 7, 8), 5, (1, 1), (3, 2), (0, 2, 0, 1),
                                            (1, 1), 1),
    "4x4 stride 4 (patch embedding)": ((1, 3, 16, 18), 8, (4, 4), (4, 4), (0, 0, 1, 1),
                                       (1, 1), 1),
    "3x3 stride 2": ((2, 8, 12, 11), 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "3x3 stride 2 wide rows": ((1, 3, 7, 35), 5, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "7x7 stem": ((1, 3, 32, 30), 8, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),
    "3x3 dilated": ((1, 4, 13, 12), 6, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),
    "groups 2": ((2, 8, 10, 9), 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "3x1 stride (2,1)": ((1, 4, 9, 7), 5, (3, 1), (2, 1), (1, 1, 0, 0), (1, 1), 1),
    "kernel 2x4 asym": ((1, 3, 8, 9), 4, (2, 4), (1, 3), (0, 1, 2, 1), (1, 1), 1),
    "small 3x3 (few tiles)": ((1, 32, 5, 5), 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "3x2 no pad (rows wider than the output)": ((1, 3, 9, 12), 4, (3, 2), (1, 1),
                                                (0, 0, 0, 0), (1, 1), 1),
    "3x2 left pad past the row": ((1, 2, 3, 1), 3, (3, 2), (1, 1), (1, 1, 5, 0), (1, 1), 1),
}


@pytest.mark.parametrize("product", ["gemm", "gemm bands", "gemm_transposed", "direct"])
@pytest.mark.parametrize("case", GEMM.values(), ids=GEMM.keys())
def test_gemm_conv_matches_reference_and_torch(case, product, monkeypatch):
    """Each case through im2col (or none, for a plain 1x1) and each product: channels by
    pixels in the register tiles, on im2col's cols or (one group) on cols made band by band
    at any size ("gemm bands"), or (one group) pixels by channels, on cols or without them
    (direct)."""
    shape, c_out, kernel, stride, padding, dilation, groups = case
    if product in ("gemm_transposed", "direct") and not BY_NAME[product].fits(
            PackedConv2d(rand(c_out, shape[1] // groups, *kernel), None, stride, dilation,
                         groups)):
        pytest.skip("the transposed product takes one group, and cols")
    if product == "gemm bands":
        monkeypatch.setattr(gemm, "BANDS_FROM", 0)
        monkeypatch.setattr(gemm, "BANDS_MIN_PIXELS", 0)
    x = rand(*shape)
    weight, bias = rand(c_out, shape[1] // groups, *kernel), rand(c_out)
    _, got = run_packed(x, weight, bias, stride, padding, dilation, groups,
                        algorithm=product.split()[0])
    check_against_both(got, x, weight, bias, stride, padding, dilation, groups)


# ----- the direct convolution (no cols) ----------------------------------------------------

DIRECT = {   # (N, C_in, H, W), C_out, kernel, stride, (top, bottom, left, right), dilation
    "3x3 s2, 2 panels, rows of 6 and 5": ((2, 12, 21, 22), 48, (3, 3), (2, 2), (1, 1, 1, 1),
                                          (1, 1)),
    "one vector of channels": ((1, 5, 17, 19), 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "a part-filled tile a row": ((2, 7, 9, 9), 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "sums in slices of K_BLOCK": ((1, 40, 10, 12), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "rows longer than a band": ((1, 3, 4, 530), 20, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "stride (2, 1), 3x1": ((1, 6, 13, 20), 18, (3, 1), (2, 1), (1, 1, 0, 0), (1, 1)),
    "stride (1, 3), dilated": ((1, 4, 11, 25), 17, (3, 3), (1, 3), (2, 2, 2, 2), (2, 2)),
    "pads wider than the kernel": ((1, 3, 5, 6), 10, (3, 3), (1, 1), (3, 4, 4, 3), (1, 1)),
    "no pads, rows wider than the windows": ((2, 4, 12, 15), 8, (2, 4), (3, 2), (0, 0, 0, 0),
                                             (1, 1)),
    "7x7 stem": ((1, 3, 38, 42), 24, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    "1x1 stride 2": ((3, 20, 11, 13), 36, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    "outputs of one pixel": ((2, 6, 3, 3), 12, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    "outputs one pixel wide": ((1, 5, 9, 1), 18, (3, 1), (1, 1), (1, 1, 0, 0), (1, 1)),
    "a left pad past the copied columns": ((1, 4, 6, 1), 20, (1, 1), (1, 3), (0, 0, 5, 0),
                                           (1, 1)),
    "strided and dilated both ways": ((1, 5, 23, 21), 24, (3, 3), (2, 3), (3, 2, 1, 4),
                                      (3, 2)),
    "a signal, rows cut into segments": ((1, 6, 1, 1000), 20, (1, 7), (1, 1), (0, 0, 3, 3),
                                         (1, 1)),
    "a dilated signal in segments": ((2, 4, 1, 613), 18, (1, 7), (1, 1), (0, 0, 15, 15),
                                     (1, 5)),
    "wide rows in segments, stride 2": ((1, 3, 5, 701), 40, (3, 3), (2, 2), (1, 1, 1, 1),
                                        (1, 1)),
    "segments with a wide left pad": ((1, 2, 2, 260), 20, (1, 3), (1, 1), (0, 0, 250, 2),
                                      (1, 1)),
}


@pytest.mark.parametrize("case", DIRECT.values(), ids=DIRECT.keys())
@pytest.mark.parametrize("team", [1, 3])
def test_direct_matches_reference_and_torch_and_the_transposed_products_bits(case, team):
    """The direct convolution against the numpy reference and torch, with bias, residual
    and ReLU6, on one thread and shared by three; each output the same chain as the
    transposed product on im2col's cols (the same panels): the same bits."""
    shape, c_out, kernel, stride, padding, dilation = case
    x = rand(*shape)
    weight, bias = rand(c_out, shape[1], *kernel), rand(c_out)
    relu6 = activation_of(ReLU6())
    want = torch_conv(x, weight, bias, stride, padding, dilation, 1)
    residual = rand(*want.shape)
    with threads.limit(team):
        _, got = run_packed(x, weight, bias, stride, padding, dilation, 1, relu6, residual,
                            algorithm="direct")
        _, cols = run_packed(x, weight, bias, stride, padding, dilation, 1, relu6, residual,
                             algorithm="gemm_transposed")
    np.testing.assert_array_equal(got, cols)
    _, plain = run_packed(x, weight, bias, stride, padding, dilation, algorithm="direct")
    check_against_both(plain, x, weight, bias, stride, padding, dilation, 1)
    np.testing.assert_allclose(got, np.clip(want + residual, 0, 6), atol=1e-4, rtol=1e-4)


def test_direct_reads_nothing_it_did_not_write(monkeypatch):
    """The work space filled with NaN before its first call (the kernel reads only what it
    wrote), then a second input of the same shape in the same space (a copy held from the
    call before must not be taken for this one's: forget_band): torch's values, on one
    thread and on three."""
    from layers.fast import direct

    scratch, poisoned = direct.scratch, set()

    def poison_once(name, shape):
        space = scratch(name, shape)
        if shape not in poisoned:
            poisoned.add(shape)
            space[...] = np.nan
        return space
    monkeypatch.setattr(direct, "scratch", poison_once)
    weight, bias = rand(40, 12, 3, 3), rand(40)
    packed = PackedConv2d(weight, bias, (2, 2), (1, 1), 1)
    for team in (1, 3):
        for x in (rand(2, 12, 21, 22), rand(2, 12, 21, 22)):
            with threads.limit(team):
                call = BY_NAME["direct"].make_call(packed, (1, 1, 1, 1), (11, 11), IDENTITY)
                y = np.empty((2, 40, 11, 11), np.float32)
                call(x, None, y)
            check_against_both(y, x, weight, bias, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert len(poisoned) == 2                            # one space, then three rows


def test_direct_through_panels_packed_in_the_background():
    """Panels of more than PACKED_IN_FORWARD bytes at a size met in a forward: the first
    calls run the upright product while they are packed in the background, then direct
    (torch's values throughout); a convolution packed for one call (F.conv2d's) packs them
    there, no background packing asked."""
    from layers.fast import algorithms

    x, weight = rand(1, 600, 12, 12), rand(256, 600, 3, 3)          # panels: 5.3 MiB
    want = torch_conv(x, weight, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    packed = PackedConv2d(weight, None, (1, 1), (1, 1), 1, winograd=False)
    assert algorithms.BY_NAME["direct"].packed_later(packed)
    assert packed.algorithm(1, (12, 12)) == "direct"
    for _ in range(3):
        got = packed.run(x, (1, 1, 1, 1), (12, 12), IDENTITY)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)
    packed.packing("direct").result(timeout=60)
    assert packed.has_packed("direct") and packed.has_packed("gemm_transposed")
    np.testing.assert_allclose(packed.run(x, (1, 1, 1, 1), (12, 12), IDENTITY), want,
                               rtol=1e-4, atol=2e-3)
    once = PackedConv2d(weight, None, (1, 1), (1, 1), 1, winograd=False, once=True)
    assert not algorithms.BY_NAME["direct"].packed_later(once)
    np.testing.assert_allclose(once.run(x, (1, 1, 1, 1), (12, 12), IDENTITY), want,
                               rtol=1e-4, atol=2e-3)
    assert once.has_packed("direct") and not once._packing


def test_the_direct_convolutions_bands():
    """Bands of whole output rows as many as BAND holds, or segments of rows longer than
    BAND, cut where the units (images x bands x panels) are fewer than the threads; the
    copy holds the rows and columns any band reads."""
    from layers.fast.direct import BAND, direct_plan
    from layers.fast.phases import geometry_of

    def plan(out_hw, images=1, panels=1, parts=1, kernel=(3, 3), stride=(1, 1)):
        hw = tuple((o - 1) * s + k - 2 for o, s, k in zip(out_hw, stride, kernel))
        return direct_plan(tuple(geometry_of(kernel, stride, (1, 1), 1, 1, hw, out_hw)),
                           images, panels, parts)
    assert plan((56, 56))[0] == BAND // 56 * 56
    assert plan((7, 7))[0] == 49                          # the whole image
    assert plan((7, 7), parts=2)[0] == 25                 # cut: one unit for two threads
    assert plan((7, 7), panels=2, parts=2)[0] == 49       # two units already
    assert plan((2, 300)) == (150, 3 * 152)               # rows longer than BAND: halves,
    assert plan((1, 300), parts=3)[0] == 100              # thirds for 3 threads; the copy
    assert plan((1, 10_000)) == (239, 3 * 241)            # holds a segment's columns only
    assert plan((1, 241), parts=100)[0] == 3              # as many segments as pixels allow
    band, copy = plan((28, 28), stride=(2, 2))            # 8 rows of 28 pixels, which
    assert band == 8 * 28 and copy == 19 * 57         # could meet 9 rows: 19 input rows of
                                                      # (28 - 1) * 2 + 3 columns


def test_every_threads_row_of_direct_work_space_starts_on_a_cache_line():
    """A thread's row (header, band sums, copy) is whole cache lines: the next thread's
    row, where its tiles store and load their sums, starts on one too."""
    from layers.fast.direct import BAND, COLUMNS, HEADER, space_size
    from layers.fast.team import LINE_FLOATS
    for c_in, copy in ((3, 19 * 57), (64, 3 * 152), (7, 1), (1, 0)):
        needed = HEADER + BAND * COLUMNS + c_in * copy
        floats = space_size(c_in, copy)
        assert floats % LINE_FLOATS == 0 and needed <= floats < needed + LINE_FLOATS


@pytest.mark.parametrize("kernel, stride, padding", [
    ((3, 3), (1, 1), (1, 1, 1, 1)), ((5, 5), (2, 2), (2, 2, 2, 2)), ((3, 3), (1, 1), (0, 0, 0, 0)),
], ids=["3x3", "5x5 stride 2", "3x3 no pad"])
@pytest.mark.parametrize("product", ["gemm", "direct"])
def test_im2col_inf_and_nan_at_the_edges_stay_in_their_windows(kernel, stride, padding,
                                                               product):
    """im2col reads the neighbouring row where a window passes the left or right edge, and
    masks that away; the direct convolution copies the rows with zeros around them: an Inf
    or NaN in the first or last column reaches only the outputs whose windows hold it, as in
    torch."""
    x = rand(1, 2, 9, 10)
    x[0, 0, 2, -1], x[0, 1, 5, 0], x[0, 1, 4, -1] = np.inf, np.nan, -np.inf
    weight, bias = rand(3, 2, *kernel), rand(3)
    with np.errstate(invalid="ignore"):                      # inf * 0 in the product
        _, got = run_packed(x, weight, bias, stride, padding, winograd_ok=False,
                            algorithm=product)
    want = torch_conv(x, weight, bias, stride, padding, (1, 1), 1)
    assert np.isfinite(want).sum() >= want.size // 3        # most outputs do not see them
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("winograd_ok", [True, False], ids=["winograd", "im2col"])
def test_empty_batch_and_awkward_inputs(winograd_ok):
    """Batch 0, a read-only input and a non-contiguous view give what the reference gives."""
    weight, bias = rand(6, 4, 3, 3), rand(6)
    for x in (np.zeros((0, 4, 9, 9), np.float32), rand(4, 9, 9, 1).transpose(3, 0, 1, 2)):
        _, got = run_packed(x, weight, bias, padding=(1, 1, 1, 1), winograd_ok=winograd_ok)
        check_against_both(got, x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    x = rand(2, 4, 9, 9)
    x.flags.writeable = False
    _, got = run_packed(x, weight, bias, padding=(1, 1, 1, 1), winograd_ok=winograd_ok)
    check_against_both(got, x, weight, bias, (1, 1), (1, 1, 1, 1), (1, 1), 1)


# ----- the epilogue: bias + residual + activation --------------------------------------------

@pytest.mark.parametrize("name", ACTIVATIONS)
def test_epilogue_activation_matches_the_layer_and_torch(name):
    layer, torch_fn = ACTIVATIONS[name]
    y = rand(2, 3, 5, 7) * 4                                 # reaches every branch (+-3, +-6)
    bias, residual = rand(3), rand(2, 3, 5, 7)
    got = y.copy()
    bias_residual_activation(got, bias, residual, activation_of(layer))
    summed = y + bias.reshape(3, 1, 1) + residual
    want_layer = summed.copy()
    layer.forward_inplace(want_layer)
    np.testing.assert_allclose(got, want_layer, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(got, torch_fn(torch.from_numpy(summed)).numpy(), atol=1e-6,
                               rtol=1e-5)


@pytest.mark.parametrize("inner", [None, ReLU()], ids=["alone", "after relu"])
def test_an_affine_map_after_the_activation_gives_torchs_bits(inner):
    """ScaleShift in the epilogue: a * y, rounded, then + b, rounded, as torch computes the
    expression (not one fused multiply-add), on rows of 47 and 7 values."""
    scale, shift = 0.1, 0.3
    activation = activation_of(ScaleShift(inner, scale, shift))
    for length in (47, 7):
        y = (rand(2, 3, length) * 1e3).astype(np.float32)
        got = y.copy()
        bias_residual_activation(got, None, None, activation)
        t = torch.from_numpy(y)
        want = (t if inner is None else F.relu(t)) * scale + shift
        np.testing.assert_array_equal(got.view(np.int32), want.numpy().view(np.int32))


def test_unknown_activations_have_no_kernel_code():
    class MyReLU(ReLU):                                      # a subclass may differ
        pass
    assert activation_of(MyReLU()) is None
    assert activation_of(make_layer("nn.Softmax", {"dim": 1})) is None
    # an affine map after an activation takes the kernels' a and b: not after one that uses
    # them, nor after a second affine map or an activation the kernels do not know
    for inner in (ReLU6(), LeakyReLU(negative_slope=0.1), ScaleShift(None, 2.0, 1.0), MyReLU()):
        assert activation_of(ScaleShift(inner, 2.0, 1.0)) is None


@pytest.mark.parametrize("algorithm_case", [
    ("winograd", (1, 32, 24, 24), (8, 32, 3, 3), 1, (1, 1)),
    ("gemm", (2, 8, 6, 6), (8, 8, 3, 3), 1, (2, 2)),
    ("gemm", (2, 8, 6, 6), (8, 8, 1, 1), 1, (1, 1)),
    ("depthwise", (2, 8, 30, 30), (8, 1, 3, 3), 8, (1, 1)),
    ("depthwise_channels_last", (2, 16, 9, 9), (16, 1, 3, 3), 16, (2, 2)),
    ("winograd_f2", (1, 16, 7, 7), (8, 16, 3, 3), 1, (1, 1)),
    ("gemm_transposed", (2, 32, 14, 14), (32, 32, 3, 3), 1, (2, 2)),
    ("direct", (2, 8, 20, 20), (40, 8, 3, 3), 1, (2, 2)),
    ("direct", (1, 16, 24, 24), (8, 16, 3, 3), 1, (1, 1)),
], ids=["winograd", "im2col", "1x1", "depthwise", "depthwise channels last", "winograd f2",
        "im2col transposed", "direct", "direct, one vector of channels"])
@pytest.mark.parametrize("name", ["relu", "relu6", "silu", "hardswish", "leaky",
                                  "hardswish, then affine", "affine"])
def test_each_kernel_fuses_residual_and_activation(algorithm_case, name):
    algorithm, shape, w_shape, groups, stride = algorithm_case
    layer, torch_fn = ACTIVATIONS[name]
    x, weight, bias = rand(*shape), rand(*w_shape), rand(w_shape[0])
    padding = (1, 1, 1, 1) if w_shape[2] == 3 else (0, 0, 0, 0)
    conv = torch_conv(x, weight, bias, stride, padding, (1, 1), groups)
    residual = rand(*conv.shape)
    packed, got = run_packed(x, weight, bias, stride, padding, (1, 1), groups,
                             activation_of(layer), residual)
    assert packed.algorithm(shape[0], got.shape[2:]) == algorithm
    want = torch_fn(torch.from_numpy(conv + residual)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# ----- the layers: fast path == reference path == torch -----------------------------------------

LAYER_CASES = {
    "3x3 winograd": dict(in_channels=8, out_channels=8, kernel_size=(3, 3), padding=(1, 1)),
    "3x3 stride 2": dict(in_channels=4, out_channels=8, kernel_size=(3, 3), stride=(2, 2),
                         padding=(1, 1)),
    "depthwise 5x5": dict(in_channels=6, out_channels=6, kernel_size=(5, 5), groups=6,
                          padding=(2, 2)),
    "1x1 no bias": dict(in_channels=8, out_channels=4, kernel_size=(1, 1), bias=False),
    "same dilated": dict(in_channels=3, out_channels=5, kernel_size=(3, 3), padding="same",
                         dilation=(2, 2)),
    "reflect": dict(in_channels=3, out_channels=5, kernel_size=(3, 3), padding=(1, 1),
                    padding_mode="reflect"),
}


@pytest.mark.parametrize("params", LAYER_CASES.values(), ids=LAYER_CASES.keys())
@pytest.mark.parametrize("batch", [1, 3])
def test_conv2d_layer_fast_and_reference_paths_agree_with_torch(params, batch):
    conv, weights = torch_module(nn.Conv2d, **params)
    x = rand(batch, params["in_channels"], 20, 18)
    fast = check_layer("nn.Conv2d", conv, [x], params, weights)[0]
    layer = make_layer("nn.Conv2d", params, weights)
    np.testing.assert_allclose(fast, layer.forward([x])[0], atol=1e-4, rtol=1e-4)


def test_functional_conv2d_fast_path_matches_torch():
    x, weight, bias = rand(2, 6, 10, 10), rand(6, 3, 3, 3), rand(6)
    params = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=2, bias=None)
    check_layer("F.conv2d", lambda a, w, b: F.conv2d(a, w, b, 1, 1, 1, 2), [x, weight, bias],
                params)


@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 16), (16,)])
def test_linear_fast_path_matches_reference_and_torch(shape):
    params = dict(in_features=16, out_features=10, bias=True)
    fc, weights = torch_module(nn.Linear, **params)
    x = rand(*shape)
    fast = check_layer("nn.Linear", fc, [x], params, weights)[0]
    layer = make_layer("nn.Linear", params, weights)
    np.testing.assert_allclose(fast, layer.forward([x])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", [None, "nn.GELU", "nn.GELU approximate=tanh", "nn.ReLU"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_16_rows_or_more_runs_the_tiles_with_its_activation(activation, bias):
    """A small weight is packed for the register tiles (bias and a kernel activation applied
    in them; GELU's tanh form, which the kernels lack, afterwards); a large one is not
    copied (dense.py packs it as the product goes)."""
    from layers.fast.layers import TILED_MAX_PACKED

    params = dict(in_features=24, out_features=40, bias=bias)
    fc, weights = torch_module(nn.Linear, **params)
    layer = make_layer("nn.Linear", params, weights, fast=True)
    want = fc
    if activation is not None:
        name, *extra = activation.split()
        act = make_layer(name, dict(e.split("=") for e in extra), fast=True)
        layer.fuse_activation(act)
        torch_act = (nn.GELU(**dict(e.split("=") for e in extra)) if name == "nn.GELU"
                     else nn.ReLU())
        want = nn.Sequential(fc, torch_act)
    x = rand(2, 9, 24)                                       # 18 rows
    layer.prepare([x.shape])
    assert layer.__dict__["_tiled"].packed is not None       # packed at prepare
    with torch.no_grad():
        expected = want(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(layer.forward([x])[0], expected, atol=1e-5, rtol=1e-5)
    big = dict(in_features=TILED_MAX_PACKED // 4 // 8 + 1, out_features=8, bias=bias)
    big_fc, big_weights = torch_module(nn.Linear, **big)
    big_layer = make_layer("nn.Linear", big, big_weights, fast=True)
    big_layer.prepare([(18, big["in_features"])])
    x = rand(18, big["in_features"])
    with torch.no_grad():
        expected = big_fc(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(big_layer.forward([x])[0], expected, atol=1e-4, rtol=1e-4)
    assert "_tiled" not in big_layer.__dict__                # no copy of a large weight


# ----- max pooling ----------------------------------------------------------------------------

MAX_POOL = {   # kernel, stride, padding, dilation, ceil_mode, (N, C, H, W)
    "resnet stem 3x3 s2 p1": ((3, 3), (2, 2), (1, 1), (1, 1), False, (1, 4, 16, 16)),
    "2x2": ((2, 2), (2, 2), (0, 0), (1, 1), False, (2, 3, 9, 8)),
    "2x2 ceil mode, a last row alone": ((2, 2), (2, 2), (0, 0), (1, 1), True, (1, 3, 9, 9)),
    "2x2 s2, rows dilated": ((2, 2), (2, 2), (0, 0), (2, 1), False, (1, 2, 11, 8)),
    "ceil mode": ((3, 3), (2, 2), (0, 0), (1, 1), True, (1, 2, 10, 11)),
    "ceil mode padded": ((3, 2), (2, 3), (1, 1), (1, 1), True, (2, 2, 9, 13)),
    "dilated": ((3, 3), (1, 2), (1, 1), (2, 2), False, (1, 3, 12, 12)),
    "3x3 s2, rows dilated": ((3, 3), (2, 2), (1, 1), (2, 1), False, (1, 3, 13, 12)),
    "5x5 s1 p2 (SPPF)": ((5, 5), (1, 1), (2, 2), (1, 1), False, (1, 2, 7, 6)),
    "1x1 image": ((3, 3), (1, 1), (1, 1), (1, 1), False, (2, 2, 1, 1)),
    "2x2 s1": ((2, 2), (1, 1), (0, 0), (1, 1), False, (1, 5, 6, 7)),
    "3x3 s1, columns dilated": ((3, 3), (1, 1), (1, 1), (1, 2), False, (2, 3, 9, 10)),
    "3x5 s1, rows dilated": ((3, 5), (1, 1), (1, 2), (2, 1), False, (1, 3, 11, 9)),
    "4x2 s1 unpadded": ((4, 2), (1, 1), (0, 0), (1, 1), False, (2, 2, 6, 17)),
    "1x3 s1": ((1, 3), (1, 1), (0, 1), (1, 1), False, (1, 2, 5, 9)),
    "3x1 s1": ((3, 1), (1, 1), (1, 0), (1, 1), False, (1, 2, 9, 5)),
    "3x4 s(2, 1)": ((3, 4), (2, 1), (1, 2), (1, 1), False, (1, 3, 11, 10)),
    "1x3 s(2, 1), one tap a column": ((1, 3), (2, 1), (0, 1), (1, 1), False, (1, 2, 9, 8)),
    "3x1 s(2, 1), one tap a row": ((3, 1), (2, 1), (1, 0), (1, 1), True, (1, 2, 10, 7)),
}


@pytest.mark.parametrize("case", MAX_POOL.values(), ids=MAX_POOL.keys())
@pytest.mark.parametrize("nan_every", [0, 7, 61], ids=["no NaN", "NaN in every row", "few NaN"])
def test_max_pool_fast_path_matches_reference_and_torch(case, nan_every):
    """NaN wins its windows, as in torch, on every path of the kernel: whole planes for
    stride 1; otherwise two or three rows in one pass or row by row, then even and odd columns for
    stride 2, tap by tap along the row for stride 1 across, the general loop over the taps."""
    kernel, stride, padding, dilation, ceil_mode, shape = case
    x = rand(*shape)
    if nan_every:
        x.reshape(-1)[:: nan_every] = np.nan
    params = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation,
                  ceil_mode=ceil_mode)
    fast_layer = make_layer("nn.MaxPool2d", params, fast=True)
    reference_layer = make_layer("nn.MaxPool2d", params)
    assert type(fast_layer) is not type(reference_layer)
    got, want = fast_layer.forward([x])[0], reference_layer.forward([x])[0]
    torch_y = F.max_pool2d(torch.from_numpy(x), kernel, stride, padding, dilation,
                           ceil_mode).numpy()
    assert got.dtype == np.float32 and got.shape == torch_y.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, torch_y)
    with threads.limit(2):                       # planes shared with a helper thread
        shared = fast_layer.forward([x])[0]
        into = np.full(got.shape, -1.0, np.float32)
        fast_layer.forward_into([x], [into])
    np.testing.assert_array_equal(shared, torch_y)
    np.testing.assert_array_equal(into, torch_y)


def test_a_dynamic_graph_packs_at_build_what_any_size_will_need(monkeypatch):
    """Shapes unknown at build: a convolution whose F(4x4) packing would be too large runs
    F(2x2) at any size worth it (with F2_OVER_DIRECT channels: fewer run direct on most), so
    that packing is made at build; one that fits F(4x4) with F4_OVER_DIRECT channels gets
    that packing; others (fewer channels, or F(2x2) too large) get the direct convolution's
    panels, which most sizes run."""
    from layers.fast import algorithms

    monkeypatch.setattr(algorithms, "WINOGRAD_MAX_PACKED", 36 * 8 * 32 * 4 - 1)
    monkeypatch.setattr(algorithms, "WINOGRAD_F2_LARGE", 16 * 8 * 48 * 4 - 1)
    monkeypatch.setattr(algorithms, "F2_OVER_DIRECT", 32)
    huge, big, middle, small, few = (PackedConv2d(rand(8, c, 3, 3), None, (1, 1), (1, 1), 1)
                                     for c in (48, 32, 24, 16, 8))
    for packed in (huge, big, middle, small, few):
        packed.prepare_for_any_size()
    assert list(big._packs) == ["winograd_f2"] and list(middle._packs) == ["winograd"]
    assert list(small._packs) == list(few._packs) == list(huge._packs) == ["gemm_transposed"]
    assert few.algorithm(8, (56, 56)) == "direct" and small.algorithm(8, (56, 56)) == "direct"
    assert big.algorithm(8, (56, 56)) == "winograd_f2"
    assert big.algorithm(8, (7, 7)) == "winograd_f2" and small.algorithm(8, (7, 7)) == "winograd"
    assert huge.algorithm(1, (7, 7)) == "gemm" and huge.algorithm(4, (7, 7)) == "winograd_f2"
