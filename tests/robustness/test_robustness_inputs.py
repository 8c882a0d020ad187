"""Inputs a caller gets wrong, or gets unusual: wrong count / rank / shape / dtype are one
ShapeError naming the input or operator before anything runs; non-contiguous arrays work and
are never written; NaN and Inf come out where torch puts them.

The dtype rule (RuntimeGraph.check_inputs, README "Using it"): an array of the same KIND as
the input's declared dtype is cast to it (any floating array for an f32 input; any integer
array for an i64/i32 input); every other kind is refused (integers or bools for a float
input, floats for an integer input, complex, object, text, dates), and so is anything that is
not a numpy array.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infer import RuntimeGraph, ShapeError
from helpers import make_layer, torch_module
from support import REPO, conv_line, conv_weights, expect_error, write_model

LITE0 = REPO / "model_file" / "efficientnet_lite0"


@pytest.fixture(scope="module")
def lite0():
    return RuntimeGraph(LITE0 / "efficientnet_lite0.pnnx.param").build()


@pytest.fixture
def conv_graph(tmp_path):
    """input (1,3,8,8) -> conv 3x3 -> relu; static shapes."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                                "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2",
                                weights=conv_weights())
    return RuntimeGraph(param, binary).build()


def reference_conv(x: np.ndarray) -> np.ndarray:
    """The convolution of conv_line() with conv_weights(), by torch."""
    w = conv_weights()
    return F.conv2d(torch.from_numpy(np.ascontiguousarray(x, np.float32)),
                    torch.from_numpy(w["conv.weight"]), torch.from_numpy(w["conv.bias"])).numpy()


def reference(x: np.ndarray) -> np.ndarray:
    """What conv_graph computes, by torch."""
    return np.maximum(reference_conv(x), 0)


X = np.random.default_rng(3).standard_normal((1, 3, 8, 8), dtype=np.float32)


# ----- count, rank, shape -----------------------------------------------------------------------

@pytest.mark.parametrize("count", [0, 2, 3])
def test_wrong_number_of_inputs(conv_graph, count):
    expect_error(ShapeError, lambda: conv_graph.forward(*[X] * count),
                 "takes 1 input(s) (in0)", f"got {count}")


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 1, 3, 8, 8), (), (192,)])
def test_wrong_rank(conv_graph, shape):
    error = expect_error(ShapeError, lambda: conv_graph.forward(np.zeros(shape, np.float32)),
                         "input in0", f"rank {len(shape)}", "(1,3,8,8)")
    assert error.operator == "pnnx.Input in0"


def test_wrong_channel_count_names_the_operator_before_running(conv_graph):
    error = expect_error(ShapeError, lambda: conv_graph.forward(np.zeros((1, 5, 8, 8),
                                                                         np.float32)))
    assert error.operator == "nn.Conv2d conv"


def test_image_smaller_than_the_kernel(conv_graph):
    expect_error(ShapeError, lambda: conv_graph.forward(np.zeros((1, 3, 2, 2), np.float32)),
                 "nn.Conv2d conv")


def test_other_batch_and_size_on_a_static_model_follow_the_layers(conv_graph):
    """The traced shape is not a cage: the layers decide what they can take, as in torch."""
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 9), dtype=np.float32)
    np.testing.assert_allclose(conv_graph.forward(x)[0], reference(x), rtol=1e-4, atol=1e-5)


def test_wrong_shape_on_a_dynamic_model(lite0):
    expect_error(ShapeError, lambda: lite0.forward(np.zeros((1, 4, 64, 64), np.float32)),
                 "nn.Conv2d convbn2d_0")
    expect_error(ShapeError, lambda: lite0.forward(np.zeros((1, 3, 64), np.float32)), "rank 3")


@pytest.mark.parametrize("shapes, words", [
    ((), r"takes 1 input shape\(s\) \(pnnx_input_0\), got 0"),
    (((1, 3, 64, 64), (1, 3, 32, 32)), r"takes 1 input shape\(s\) \(pnnx_input_0\), got 2"),
    (((1, 3, "64", 64),), "sizes >= 0"),
    (((1, 3, -1, 64),), "sizes >= 0"),
])
def test_planning_shapes_and_memory_checks_the_shapes_given(lite0, shapes, words):
    """infer_shapes / memory_plan take one shape per graph input, each of sizes >= 0."""
    with pytest.raises(ShapeError, match=words):
        lite0.infer_shapes(*shapes)
    with pytest.raises(ShapeError, match=words):
        lite0.memory_plan(*shapes)
    assert lite0.infer_shapes((2, 3, 64, 64))[lite0.output_operands[0].name] == (2, 1000)


# ----- dtypes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble, ">f4",
                                   ">f8"])
def test_floating_arrays_are_cast_to_a_float32_input(conv_graph, dtype):
    x = X.astype(dtype)
    (y,) = conv_graph.forward(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x.astype(np.float32)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_,
                                   np.complex64, np.complex128, object, "U3", "S3",
                                   "datetime64[s]", "timedelta64[s]", "V4"])
def test_other_kinds_are_refused_for_a_float_input(conv_graph, dtype):
    x = np.zeros((1, 3, 8, 8), dtype=dtype)
    expect_error(ShapeError, lambda: conv_graph.forward(x), "input in0 has dtype",
                 "takes float32")


@pytest.mark.parametrize("value", [X.tolist(), torch.from_numpy(X), 3.0, None, "image.png"])
def test_non_arrays_are_refused(conv_graph, value):
    expect_error(ShapeError, lambda: conv_graph.forward(value), "must be a numpy array")


@pytest.fixture
def int_graph(tmp_path):
    """An i64 input: y = x * 3 + 1 (integers stay integers, as in torch)."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(2,3)i64",
                                "pnnx.Expression e 1 1 0 1 expr=add(mul(@0,3),1)",
                                "pnnx.Output out0 1 0 1")
    return RuntimeGraph(param, binary).build()


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_arrays_are_cast_to_an_integer_input(int_graph, dtype):
    x = np.arange(6, dtype=dtype).reshape(2, 3)
    (y,) = int_graph.forward(x)
    expected = torch.from_numpy(x.astype(np.int64)) * 3 + 1
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, expected.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, np.complex64])
def test_other_kinds_are_refused_for_an_integer_input(int_graph, dtype):
    expect_error(ShapeError, lambda: int_graph.forward(np.zeros((2, 3), dtype)),
                 "takes int64")


# ----- non-contiguous arrays --------------------------------------------------------------------

def layouts(x: np.ndarray) -> dict[str, np.ndarray]:
    """The same values as ``x`` (N, C, H, W) laid out in memory in unusual ways."""
    big = np.zeros((x.shape[0], x.shape[1], x.shape[2] * 2, x.shape[3] * 3), x.dtype)
    big[:, :, ::2, ::3] = x
    raw = np.zeros(x.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(x.dtype).reshape(x.shape)
    unaligned[...] = x
    read_only = x.copy()
    read_only.flags.writeable = False
    return {
        "transposed": np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
        "fortran": np.asfortranarray(x),
        "negative strides": np.ascontiguousarray(x[:, ::-1, ::-1, ::-1])[:, ::-1, ::-1, ::-1],
        "sliced": big[:, :, ::2, ::3],
        "broadcast": np.broadcast_to(x[:1], x.shape) if x.shape[0] == 1 else x,
        "unaligned": unaligned,
        "read-only": read_only,
        "big-endian": x.astype(">f4"),
    }


def test_non_contiguous_arrays_give_the_same_result(lite0):
    x = np.random.default_rng(5).random((1, 3, 48, 40), dtype=np.float32)
    (expected,) = lite0.forward(x)
    for name, strange in layouts(x).items():
        np.testing.assert_array_equal(strange, x, err_msg=name)
        before = strange.copy()
        (y,) = lite0.forward(strange)
        np.testing.assert_array_equal(y, expected, err_msg=name)
        np.testing.assert_array_equal(strange, before, err_msg=f"{name}: input was written")


def test_in_place_first_layer_never_writes_a_strided_input(tmp_path):
    """ReLU right after the input could work in place; the caller's view must stay as it is."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32",
                                "nn.ReLU relu 1 1 0 1", "nn.ReLU6 relu6 1 1 1 2",
                                "pnnx.Output out0 1 0 2")
    graph = RuntimeGraph(param, binary).build()
    for name, strange in layouts(X * 10).items():
        before = strange.copy()
        (y,) = graph.forward(strange)
        np.testing.assert_array_equal(y, np.clip(before.astype(np.float32), 0, 6), err_msg=name)
        np.testing.assert_array_equal(strange, before, err_msg=name)


# ----- NaN and Inf ------------------------------------------------------------------------------

def with_specials(shape, seed=0) -> np.ndarray:
    """Random values with NaN, +Inf and -Inf sprinkled in, and one row of each."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    flat = x.reshape(-1)
    for value, count in ((np.nan, 5), (np.inf, 5), (-np.inf, 5)):
        flat[rng.choice(flat.size, count, replace=False)] = value
    x[..., 0, :] = np.inf                   # a whole row of +inf (softmax: nan, as torch)
    x[..., 1, :2] = -np.inf
    return x


def conv_case(**params):
    module, weights = torch_module(torch.nn.Conv2d, **params)
    return "nn.Conv2d", params, weights, module


SPECIAL_CASES = {
    "relu": ("nn.ReLU", {}, None, torch.relu),
    "relu6": ("nn.ReLU6", {}, None, F.relu6),
    "leaky_relu": ("nn.LeakyReLU", {"negative_slope": 0.1}, None,
                   lambda x: F.leaky_relu(x, 0.1)),
    "hardtanh": ("nn.Hardtanh", {"min_val": -2.0, "max_val": 2.0}, None,
                 lambda x: F.hardtanh(x, -2.0, 2.0)),
    "sigmoid": ("nn.Sigmoid", {}, None, torch.sigmoid),
    "tanh": ("nn.Tanh", {}, None, torch.tanh),
    "silu": ("nn.SiLU", {}, None, F.silu),
    "hardswish": ("nn.Hardswish", {}, None, F.hardswish),
    "hardsigmoid": ("nn.Hardsigmoid", {}, None, F.hardsigmoid),
    "softmax": ("nn.Softmax", {"dim": 1}, None, lambda x: torch.softmax(x, 1)),
    "softmax_last": ("F.softmax", {"dim": -1}, None, lambda x: torch.softmax(x, -1)),
    "maxpool": ("nn.MaxPool2d", {"kernel_size": 2}, None, lambda x: F.max_pool2d(x, 2)),
    "maxpool_pad_ceil": ("nn.MaxPool2d", {"kernel_size": 3, "stride": 2, "padding": 1,
                                          "ceil_mode": True}, None,
                         lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
    "avgpool": ("nn.AvgPool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, None,
                lambda x: F.avg_pool2d(x, 3, 2, 1)),
    "adaptive_avgpool_1": ("nn.AdaptiveAvgPool2d", {"output_size": 1}, None,
                           lambda x: F.adaptive_avg_pool2d(x, 1)),
    "adaptive_avgpool_3": ("nn.AdaptiveAvgPool2d", {"output_size": (3, 4)}, None,
                           lambda x: F.adaptive_avg_pool2d(x, (3, 4))),
    "conv": conv_case(in_channels=4, out_channels=6, kernel_size=3, padding=1),
    "conv_1x1": conv_case(in_channels=4, out_channels=5, kernel_size=1),
    "conv_depthwise": conv_case(in_channels=4, out_channels=4, kernel_size=3, groups=4,
                                stride=2),
    "batchnorm": ("nn.BatchNorm2d", {"num_features": 4},
                  torch_module(torch.nn.BatchNorm2d, num_features=4)[1],
                  torch_module(torch.nn.BatchNorm2d, num_features=4)[0]),
    "flatten_linear": ("nn.Linear", {"in_features": 9, "out_features": 3},
                       torch_module(torch.nn.Linear, in_features=9, out_features=3)[1],
                       torch_module(torch.nn.Linear, in_features=9, out_features=3)[0]),
    "zeropad": ("nn.ZeroPad2d", {"padding": (1, 2, 0, 1)}, None,
                lambda x: F.pad(x, (1, 2, 0, 1))),
    "expression": ("pnnx.Expression", {"expr": "add(mul(@0,2.0),max(@0,neg(@0)))"}, None,
                   lambda x: x * 2.0 + torch.maximum(x, -x)),
    "expression_math": ("pnnx.Expression", {"expr": "div(exp(@0),add(sqrt(abs(@0)),1))"},
                        None, lambda x: torch.exp(x) / (torch.sqrt(torch.abs(x)) + 1)),
    "adaptive_maxpool": ("nn.AdaptiveMaxPool2d", {"output_size": (3, 4)}, None,
                         lambda x: F.adaptive_max_pool2d(x, (3, 4))),
    "interpolate_bilinear": ("F.interpolate", {"mode": "bilinear", "scale_factor": (2.0, 2.0),
                                               "align_corners": False}, None,
                             lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")),
    "groupnorm": ("nn.GroupNorm", {"num_groups": 2, "num_channels": 4, "eps": 1e-5,
                                   "affine": False}, None, lambda x: F.group_norm(x, 2)),
    "amax": ("torch.amax", {"dim": (2, 3), "keepdim": False}, None,
             lambda x: torch.amax(x, (2, 3))),
    "argmax": ("torch.argmax", {"dim": 3, "keepdim": False}, None,
               lambda x: torch.argmax(x, 3)),          # a NaN is the largest, as in torch
    "mean": ("torch.mean", {"dim": (3,), "keepdim": False}, None, lambda x: torch.mean(x, 3)),
    "clamp": ("torch.clamp", {"min": -1.0, "max": 1.0}, None, lambda x: torch.clamp(x, -1, 1)),
    "gelu_tanh": ("nn.GELU", {"approximate": "tanh"}, None,
                  lambda x: F.gelu(x, approximate="tanh")),
    "gelu": ("nn.GELU", {}, None, F.gelu),
}


def torch_gives_nan_for_gelu_of_inf() -> bool:
    """Whether torch's CPU kernel gives gelu(+inf) = NaN (exact erf mode) on this machine:
    it depends on the vector instructions its kernel was picked for (NaN seen with AVX-512,
    +inf with AVX2)."""
    x = torch.from_numpy(with_specials((2, 4, 7, 9)))
    return bool(torch.isnan(F.gelu(x))[torch.isposinf(x)].any())


KNOWN_DIFFERENCES: dict[str, str] = {      # case -> why this runtime differs from torch
    "gelu": "torch's CPU kernel gives gelu(+inf) = NaN (exact erf mode) on this CPU; here it is "
            "+inf, the limit of x * Phi(x), as torch's own approximate='tanh' mode gives",
} if torch_gives_nan_for_gelu_of_inf() else {}


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
@pytest.mark.parametrize("case", [
    pytest.param(case, marks=pytest.mark.xfail(reason=KNOWN_DIFFERENCES[case], strict=True))
    if case in KNOWN_DIFFERENCES else case for case in SPECIAL_CASES])
def test_nan_and_inf_propagate_as_torch(case, fast):
    type_name, params, weights, torch_fn = SPECIAL_CASES[case]
    shape = (2, 4, 3, 9) if type_name == "nn.Linear" else (2, 4, 7, 9)
    x = with_specials(shape)
    layer = make_layer(type_name, params, weights, fast=fast)
    with np.errstate(all="ignore"):                  # as RuntimeGraph.forward runs layers
        (y,) = layer.forward([x.copy()])
    with torch.no_grad():
        expected = torch_fn(torch.from_numpy(x.copy())).numpy()
    assert y.shape == expected.shape
    assert (np.isnan(y) == np.isnan(expected)).all(), "NaN in other places than torch's"
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)    # Inf signs too


def test_nan_and_inf_through_a_whole_graph(lite0):
    """One NaN pixel poisons the whole EfficientNet output (a global pool mixes everything);
    a finite image stays finite. Nothing raises, nothing warns (torch does not)."""
    x = np.random.default_rng(2).random((1, 3, 40, 40), dtype=np.float32)
    assert np.isfinite(lite0.forward(x)[0]).all()
    x[0, 1, 5, 5] = np.nan
    x[0, 2, 9, 9] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = lite0.forward(x)
    assert np.isnan(y).all()


def test_inf_through_a_graph_is_silent_and_as_torch(tmp_path):
    """inf - inf and 0 * inf make NaN inside the layers: numpy would warn, torch is silent."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                                "nn.SiLU silu 1 1 1 2", "nn.Softmax softmax 1 1 2 3 dim=1",
                                "pnnx.Output out0 1 0 3", weights=conv_weights())
    graph = RuntimeGraph(param, binary).build()
    x = with_specials((1, 3, 8, 8), seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = graph.forward(x)
    expected = torch.softmax(F.silu(torch.from_numpy(reference_conv(x))), 1).numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
