"""Precision of every fast kernel against float64: on the same layer and the same float32
data, no fast kernel is more than ERROR_RATIO times as far from float64 as torch's float32
is (or than a floor of FLOOR_ULPS ulps of the largest output, where torch is exact).

    error(kernel) = max |kernel(x, w) - torch64(x, w)|
    error(torch)  = max |torch32(x, w) - torch64(x, w)|

Each convolution algorithm of layers/fast/algorithms.py's table is forced on a layer it fits,
whatever the table would choose at that size, over 4 to 512 input channels (F(4x4) on the
channels it fits: the table runs it nowhere else), on standard normal inputs and on
post-ReLU ones (uniform in [0, 1): all positive, so sums over the channels do not average
out). The fast nn.Linear (numpy's BLAS, or the helpers' shared GEMM) and the fused
squeeze-and-excitation block (means and dot products in float32 lanes) are checked the same
way. Max pooling computes no sums: its results are exact (test_fast_kernels.py).

``python tests/fast/test_precision.py`` prints error(kernel) / error(torch) for every case.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from layers import kernels
from layers.fast import algorithms, workers
from layers.fast.algorithms import (BY_NAME, WINOGRAD_F2_MIN_CHANNELS, WINOGRAD_MAX_CHANNELS,
                                    WINOGRAD_MIN_CHANNELS)
from layers.fast.conv import PackedConv2d
from layers.fast.epilogue import IDENTITY

ERROR_RATIO = 4.0
# A float32 result is rounded to half an ulp whatever computes it: demanding less than 2
# ulps of the largest output would demand exactness where torch's sums happen to be exact.
FLOOR_ULPS = 2

CHANNELS = (4, 16, 64, 256, 512)
F4_CHANNELS = tuple(sorted({WINOGRAD_MIN_CHANNELS, 32, 64, 128, WINOGRAD_MAX_CHANNELS}))
INPUTS = ("normal", "post-ReLU")

# name: (algorithm, kernel size, stride, groups (0: depthwise), C_out (0: C_in), H = W)
CONVOLUTIONS = {
    "depthwise_channels_last 5x5": ("depthwise_channels_last", 5, 1, 0, 0, 4),
    "depthwise 3x3": ("depthwise", 3, 1, 0, 0, 12),
    "pointwise_transposed 1x1": ("pointwise_transposed", 1, 1, 1, 32, 7),
    "gemv 1x1 on 1x1": ("gemv", 1, 1, 1, 32, 1),
    "winograd F(4x4) 3x3": ("winograd", 3, 1, 1, 32, 16),
    "winograd_f2 F(2x2) 3x3": ("winograd_f2", 3, 1, 1, 32, 16),
    "gemm 1x1": ("gemm", 1, 1, 1, 32, 12),
    "gemm im2col 3x3": ("gemm", 3, 1, 1, 32, 16),
    "gemm im2col 3x3 stride 2": ("gemm", 3, 2, 1, 32, 16),
    "gemm_transposed im2col 3x3": ("gemm_transposed", 3, 1, 1, 32, 7),
    "gemm_transposed im2col 3x3 stride 2": ("gemm_transposed", 3, 2, 1, 32, 14),
}


def channels_of(name: str) -> tuple[int, ...]:
    algorithm = CONVOLUTIONS[name][0]
    if algorithm == "winograd_f2":                   # from WINOGRAD_F2_MIN_CHANNELS
        return tuple(c for c in CHANNELS if c >= WINOGRAD_F2_MIN_CHANNELS)
    return F4_CHANNELS if algorithm == "winograd" else CHANNELS


def generator(*key: object) -> np.random.Generator:
    """A generator seeded by the case, so each case draws the same data in any run."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def draw(rng: np.random.Generator, shape: tuple[int, ...], inputs: str) -> np.ndarray:
    if inputs == "post-ReLU":
        return rng.random(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32)


def errors(got: np.ndarray, torch32: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """(error of got, the error allowed): ERROR_RATIO times torch's, at least the floor."""
    floor = FLOOR_ULPS * float(np.finfo(np.float32).eps) * float(np.abs(exact).max())
    error_torch = float(np.abs(torch32 - exact).max())
    return float(np.abs(got - exact).max()), max(ERROR_RATIO * error_torch, floor)


def conv_case(name: str, c_in: int, inputs: str, anywhere: bool = False
              ) -> tuple[np.ndarray, ...]:
    """(fast, torch float32, torch float64) outputs of convolution ``name`` with c_in input
    channels, its algorithm forced (``anywhere``: even where it does not fit)."""
    algorithm, k, stride, groups, c_out, size = CONVOLUTIONS[name]
    groups, c_out = groups or c_in, c_out or c_in
    rng = generator(name, c_in, inputs)
    x = draw(rng, (1, c_in, size, size), inputs)
    weight = rng.standard_normal((c_out, c_in // groups, k, k), dtype=np.float32)
    pad = k // 2
    out_hw = kernels.conv2d_output_shape((1, c_in, size + 2 * pad, size + 2 * pad),
                                         weight.shape, (stride, stride), 0, (1, 1), groups)[2:]
    packed = PackedConv2d(weight, None, (stride, stride), (1, 1), groups)
    entry = BY_NAME[algorithm]
    assert anywhere or entry.fits(packed), (name, c_in)
    got = np.empty((1, c_out, *out_hw), np.float32)
    packed.packed(algorithm)               # packed now: a large one would run im2col at first
    entry.make_call(packed, (pad,) * 4, out_hw, IDENTITY)(x, None, got)

    def torch_conv(dtype: torch.dtype) -> np.ndarray:
        return F.conv2d(torch.from_numpy(x).to(dtype), torch.from_numpy(weight).to(dtype),
                        None, stride, pad, 1, groups).numpy()
    return got, torch_conv(torch.float32), torch_conv(torch.float64)


def linear_case(in_features: int, inputs: str, shared: bool, rows: int = 64
                ) -> tuple[np.ndarray, ...]:
    """(fast, torch float32, torch float64) outputs of nn.Linear (rows, in) -> (rows, 32),
    on this thread or shared with a helper (below layers.fast.layers.SWAPPED_BELOW rows, as
    weight @ x.T)."""
    from helpers import make_layer

    rng = generator("linear", in_features, inputs, rows)
    x = draw(rng, (rows, in_features), inputs)
    weight = rng.standard_normal((32, in_features), dtype=np.float32)
    layer = make_layer("nn.Linear", dict(in_features=in_features, out_features=32,
                                         bias=False), {"weight": weight}, fast=True)
    with workers.sharing(2 if shared else 1):
        got = layer.forward([x])[0]
    want = [F.linear(torch.from_numpy(x).to(dtype), torch.from_numpy(weight).to(dtype)).numpy()
            for dtype in (torch.float32, torch.float64)]
    return got, *want


def excitation_case(channels: int, inputs: str, size: int = 14) -> tuple[np.ndarray, ...]:
    """(fast, torch float32, torch float64) outputs of a squeeze-and-excitation block,
    channels -> channels / 4 -> channels, ReLU then a sigmoid gate, on (2, C, size, size);
    weights scaled by 1 / sqrt(fan-in), so that the gates are not saturated and the errors
    of the means and the products reach the output."""
    from helpers import make_layer
    from layers.fast.layers import FastSqueezeExcitation

    rng = generator("excitation", channels, inputs, size)
    x = draw(rng, (2, channels, size, size), inputs)
    squeezed = max(1, channels // 4)
    shapes = ((squeezed, channels), (channels, squeezed))
    weights = [rng.standard_normal((*shape, 1, 1), dtype=np.float32) / np.sqrt(shape[1])
               for shape in shapes]
    biases = [rng.standard_normal(shape[0], dtype=np.float32) for shape in shapes]
    convs = [make_layer("nn.Conv2d", dict(in_channels=w.shape[1], out_channels=w.shape[0],
                                          kernel_size=(1, 1)), {"weight": w, "bias": b},
                        fast=True) for w, b in zip(weights, biases)]
    for conv, act in zip(convs, ("nn.ReLU", "nn.Sigmoid")):
        conv.fuse_activation(make_layer(act, fast=True))
    got = FastSqueezeExcitation(*convs).forward([x])[0]

    def torch_block(dtype: torch.dtype) -> np.ndarray:
        t = torch.from_numpy(x).to(dtype)
        w = [torch.from_numpy(a).to(dtype) for a in (*weights, *biases)]
        gate = torch.sigmoid(F.conv2d(F.relu(F.conv2d(F.adaptive_avg_pool2d(t, 1), w[0], w[2])),
                                      w[1], w[3]))
        return (gate * t).numpy()
    return got, torch_block(torch.float32), torch_block(torch.float64)


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("channels, size", [(c, 14) for c in CHANNELS] + [(16, 224)])
def test_squeeze_excitation_is_within_4x_torchs_error(channels, size, inputs):
    got, torch32, exact = excitation_case(channels, inputs, size)
    error, allowed = errors(got, torch32, exact)
    assert error <= allowed, (channels, inputs, error, allowed)


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("name, c_in", [(name, c) for name in CONVOLUTIONS
                                        for c in channels_of(name)])
def test_each_convolution_algorithm_is_within_4x_torchs_error(name, c_in, inputs):
    got, torch32, exact = conv_case(name, c_in, inputs)
    error, allowed = errors(got, torch32, exact)
    assert error <= allowed, (name, c_in, inputs, error, allowed)


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("in_features", CHANNELS)
@pytest.mark.parametrize("shared", [False, True], ids=["numpy", "helpers"])
@pytest.mark.parametrize("rows", [64, 8])
def test_linear_is_within_4x_torchs_error(in_features, inputs, shared, rows):
    got, torch32, exact = linear_case(in_features, inputs, shared, rows)
    error, allowed = errors(got, torch32, exact)
    assert error <= allowed, (in_features, inputs, rows, error, allowed)


@pytest.mark.parametrize("c_in", [1, 3, 8, WINOGRAD_MIN_CHANNELS - 1, WINOGRAD_MAX_CHANNELS + 1,
                                  1024])
def test_f4_never_runs_outside_its_measured_channels(c_in):
    """Outside its channel range (too few channels, or more than 256: its error passes 4x
    torch's), F(4x4) is no candidate at any size: F(2x2) takes over (the direct convolution
    below F(2x2)'s channels)."""
    packed = PackedConv2d(np.zeros((32, c_in, 3, 3), np.float32), None, (1, 1), (1, 1), 1)
    names = [a.name for a in algorithms.candidates(packed)]
    f2 = c_in >= WINOGRAD_F2_MIN_CHANNELS
    assert "winograd" not in names and ("winograd_f2" in names) == f2
    assert packed.algorithm(8, (56, 56)) == ("winograd_f2" if f2 else "direct")


def print_ratios() -> None:
    """Print error(kernel) / error(torch) for every case, kernel by channel count; F(4x4)
    on every count too, in brackets where the table does not run it."""
    columns = sorted({*CHANNELS, *F4_CHANNELS})
    print(f"{'kernel':28} {'inputs':9}" + "".join(f"{c:>8}" for c in columns))
    rows = [(name, lambda c, i, n=name: conv_case(n, c, i, anywhere=True), channels_of(name))
            for name in CONVOLUTIONS]
    rows += [(f"linear {how}", lambda c, i, s=shared: linear_case(c, i, s), CHANNELS)
             for how, shared in (("numpy", False), ("helpers", True))]
    rows.append(("squeeze-and-excitation", excitation_case, CHANNELS))
    for name, case, channels in rows:
        for inputs in INPUTS:
            cells = []
            for c in columns:
                got, torch32, exact = case(c, inputs)
                ratio = np.abs(got - exact).max() / np.abs(torch32 - exact).max()
                cells.append(f"{ratio:8.2f}" if c in channels else f"{f'({ratio:.2f})':>8}")
            print(f"{name:28} {inputs:9}" + "".join(cells))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))     # helpers.py
    print_ratios()
