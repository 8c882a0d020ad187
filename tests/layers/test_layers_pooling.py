"""Max, average, adaptive average and adaptive max pooling in 1-D and 2-D against torch:
ceil_mode edge cases, dilation, count_include_pad, divisor_override, returned indices,
adaptive sizes that do not divide the input; and pnnx exports of them run by RuntimeGraph."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from layers import LayerRegisterer
from layers.pooling import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d,
                            AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d)
from parser.errors import LayerError, ShapeError
from test_layers_convolution import check_exported


def pool_params(kernel_size, stride=None, padding=0, ceil_mode=False, **extra):
    return dict(kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                **extra)


# sizes 5..8 against kernel 2/3, stride 2/3, padding 0/1: ceil_mode's "last window must start
# inside the input or the left padding" rule drops a window in some of these
WINDOWS = [(size, kernel, stride, padding, ceil_mode)
           for size, kernel, stride, padding, ceil_mode in itertools.product(
               (5, 6, 7, 8), (2, 3), (2, 3), (0, 1), (False, True))]


@pytest.mark.parametrize("size, kernel, stride, padding, ceil_mode", WINDOWS)
def test_max_pool2d_matches_torch(size, kernel, stride, padding, ceil_mode):
    params = pool_params((kernel, kernel), (stride, stride), (padding, padding), ceil_mode,
                         dilation=(1, 1), return_indices=False)
    check_layer("nn.MaxPool2d", nn.MaxPool2d(**params), [(2, 3, size, size + 1)], params)


@pytest.mark.parametrize("params", [
    pool_params((3, 3), (2, 2), (1, 1), dilation=(2, 2)),
    pool_params((3, 3), (2, 2), (1, 1), True, dilation=(2, 2)),
    pool_params((2, 3), (1, 2), (1, 0), True, dilation=(3, 1)),
    pool_params((3, 3), (2, 2), (1, 1)),                            # resnet's stem pool
    pool_params((2, 2)),                                            # stride None -> kernel
], ids=["dilated", "dilated ceil", "non-square", "resnet", "stride None"])
def test_max_pool2d_dilation_and_defaults(params):
    check_layer("F.max_pool2d", lambda x: F.max_pool2d(x, **params), [(2, 3, 11, 10)], params)


def test_max_pool2d_unbatched_input():
    params = pool_params((2, 2), (2, 2))
    check_layer("nn.MaxPool2d", nn.MaxPool2d(**params), [(3, 8, 8)], params)


@pytest.mark.parametrize("size, kernel, stride, padding, ceil_mode", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_torch(size, kernel, stride, padding, ceil_mode, count_include_pad):
    params = pool_params((kernel, kernel), (stride, stride), (padding, padding), ceil_mode,
                         count_include_pad=count_include_pad, divisor_override=None)
    check_layer("nn.AvgPool2d", nn.AvgPool2d(**params), [(2, 3, size, size + 1)], params)


def test_avg_pool2d_divisor_override():
    params = pool_params((3, 3), (1, 1), (1, 1), divisor_override=2)
    check_layer("F.avg_pool2d", lambda x: F.avg_pool2d(x, **params), [(1, 2, 5, 5)], params)


@pytest.mark.parametrize("in_size, output_size", [
    ((7, 7), (3, 3)), ((10, 10), (4, 4)), ((7, 10), (3, 4)), ((9, 9), 1), ((5, 6), (5, 6)),
    ((3, 4), (5, 7)),                                               # upsampling bins
    ((7, 9), (2, None)), ((7, 9), (None, 4)),
    ((32, 32), (1, 1)), ((64, 64), 1), ((70, 59), 1),   # global: a GEMV up to 64x64, then not
], ids=str)
def test_adaptive_avg_pool2d_matches_torch(in_size, output_size):
    params = {"output_size": output_size}
    check_layer("nn.AdaptiveAvgPool2d", nn.AdaptiveAvgPool2d(output_size), [(2, 3, *in_size)],
                params)


@pytest.mark.parametrize("size", [7, 56, 64])
def test_global_avg_pool_is_as_exact_as_torchs(size):
    """The GEMV's float32 sums stay within 4x torch's error against float64, on values
    with a large common part (where rounding shows most)."""
    rng = np.random.default_rng(size)
    x = (100 + rng.standard_normal((2, 64, size, size))).astype(np.float32)
    (y,) = make_layer("nn.AdaptiveAvgPool2d", {"output_size": 1}).forward([x])
    exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    torch_error = np.abs(F.adaptive_avg_pool2d(torch.from_numpy(x), 1).numpy() - exact).max()
    assert np.abs(y - exact).max() <= 4 * max(torch_error, np.finfo(np.float32).eps * 100)


def test_global_avg_pool_keeps_a_nan_in_its_own_plane():
    x = np.ones((1, 3, 7, 7), np.float32)
    x[0, 1, 2, 3] = np.nan
    (y,) = make_layer("nn.AdaptiveAvgPool2d", {"output_size": (1, 1)}).forward([x])
    want = F.adaptive_avg_pool2d(torch.from_numpy(x), 1).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y[0, [0, 2]], want[0, [0, 2]], rtol=1e-6)


def test_adaptive_avg_pool2d_reads_pnnx_zero_as_none():
    # pnnx writes nn.AdaptiveAvgPool2d((3, None)) as output_size=(3,0)
    check_layer("F.adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, None)),
                [(2, 4, 10, 6)], {"output_size": (3, 0)})


def test_adaptive_avg_pool2d_takes_the_size_as_a_second_input():
    # a dynamic export of F.adaptive_avg_pool2d(x, (h // 2, w // 2)): pnnx writes
    # F.adaptive_avg_pool2d 2 1 x s y $input=x $output_size=s, s from
    # expr=[floor_divide(size(@0,2),2),floor_divide(size(@0,3),2)]
    layer = make_layer("F.adaptive_avg_pool2d")
    x = rand(2, 3, 10, 7)
    (y,) = layer.forward([x, np.array([5, 3])])
    np.testing.assert_allclose(y, F.adaptive_avg_pool2d(torch.from_numpy(x), (5, 3)).numpy(),
                               atol=1e-6)
    assert layer.infer_shapes_from([(2, 3, 10, 7), (2,)], [None, np.array([5, 3])]) == \
        [(2, 3, 5, 3)]
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([(2, 3, 10, 7), (2,)])
    with pytest.raises(ShapeError, match="output_size"):          # neither parameter nor input
        layer.infer_shapes([(2, 3, 10, 7)])


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [
    ((4, 5), (3, 2), (2, 2), True), ((5, 4), (4, 3), (2, 1), True), ((4, 4), (3, 3), (2, 2), False),
    ((2, 5), (1, 4), (1, 2), True), ((5, 5), (5, 5), (2, 2), True),
], ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("divisor_override", [None, 3])
def test_avg_pool2d_wide_padding_and_ceil_windows(kernel, stride, padding, ceil_mode,
                                                  count_include_pad, divisor_override):
    """Large kernels padded by half their size: with ceil_mode a last window may start in the
    input, reach past the right padding, or start inside the left padding."""
    params = pool_params(kernel, stride, padding, ceil_mode, count_include_pad=count_include_pad,
                         divisor_override=divisor_override)
    for size in [(7, 9), (8, 6), (3, 4)]:
        check_layer("nn.AvgPool2d", nn.AvgPool2d(**params), [(2, 3, *size)], params)


def check_with_indices(type_name, torch_fn, x, params):
    """A pooling layer that returns (values, int64 indices) against torch, through the same
    steps as check_layer: infer_shapes, then forward."""
    layer = make_layer(type_name, params)
    shapes = layer.infer_shapes([x.shape])
    values, indices = layer.forward([x])
    want_values, want_indices = torch_fn(torch.from_numpy(x.copy()))
    assert shapes == [values.shape, indices.shape] == [tuple(want_values.shape)] * 2
    assert values.dtype == np.float32 and indices.dtype == np.int64
    np.testing.assert_array_equal(values, want_values.numpy())
    np.testing.assert_array_equal(indices, want_indices.numpy())


def ties_and_nans(*shape):
    """Random values with many ties (small integers), a NaN and a -inf: the edge cases of
    which index torch reports."""
    x = np.random.default_rng(1).integers(-2, 3, shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[3 % flat.size], flat[17 % flat.size] = np.nan, -np.inf
    return x


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    (3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, None, 0, 1, False), (3, 1, 1, 2, True),
    ((2, 3), (1, 2), (1, 0), (3, 1), True), ((3, 2), (2, 3), (1, 1), (1, 2), False),
], ids=str)
@pytest.mark.parametrize("values", ["random", "ties"])
def test_max_pool2d_returns_indices(kernel, stride, padding, dilation, ceil_mode, values):
    params = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation,
                  ceil_mode=ceil_mode, return_indices=True)
    x = rand(2, 3, 9, 8) if values == "random" else ties_and_nans(2, 3, 9, 8)
    check_with_indices("nn.MaxPool2d", nn.MaxPool2d(**params), x, params)
    check_with_indices("F.max_pool2d", lambda t: F.max_pool2d(t, **params), x[0], params)


# ----- 1-D pooling -------------------------------------------------------------------------------

WINDOWS_1D = [(size, kernel, stride, padding, ceil_mode)
              for size, kernel, stride, padding, ceil_mode in itertools.product(
                  (5, 6, 7, 8), (2, 3, 4), (1, 2, 3), (0, 1, 2), (False, True))
              if padding <= kernel // 2]


@pytest.mark.parametrize("size, kernel, stride, padding, ceil_mode", WINDOWS_1D)
def test_pool1d_matches_torch(size, kernel, stride, padding, ceil_mode):
    """pnnx writes 1-tuples: kernel_size=(3) stride=(2) padding=(1) dilation=(1)."""
    params = pool_params((kernel,), (stride,), (padding,), ceil_mode, dilation=(1,),
                         return_indices=False)
    check_layer("nn.MaxPool1d", nn.MaxPool1d(**params), [(2, 3, size)], params)
    for include in (True, False):
        params = pool_params((kernel,), (stride,), (padding,), ceil_mode,
                             count_include_pad=include)
        check_layer("nn.AvgPool1d", nn.AvgPool1d(**params), [(2, 3, size)], params)


@pytest.mark.parametrize("params", [
    dict(kernel_size=3, stride=None, padding=0, dilation=1, ceil_mode=False),    # pnnx: None
    dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
    dict(kernel_size=2, stride=3, padding=1, dilation=3, ceil_mode=True),
], ids=str)
def test_max_pool1d_dilation_unbatched_and_indices(params):
    check_layer("F.max_pool1d", lambda x: F.max_pool1d(x, **params), [(2, 3, 11)], params)
    check_layer("F.max_pool1d", lambda x: F.max_pool1d(x, **params), [(3, 11)], params)
    with_indices = {**params, "return_indices": True}
    for x in (rand(2, 3, 11), ties_and_nans(3, 11)):
        check_with_indices("F.max_pool1d", lambda t: F.max_pool1d(t, **with_indices), x,
                           with_indices)


def test_avg_pool1d_functional_and_unbatched():
    params = pool_params(3, 2, 1, True, count_include_pad=False)
    check_layer("F.avg_pool1d", lambda x: F.avg_pool1d(x, **params), [(3, 10)], params)
    check_layer("F.avg_pool1d", lambda x: F.avg_pool1d(x, 4), [(2, 3, 10)],
                pool_params((4,), None, (0,), False, count_include_pad=True))


# ----- adaptive max pooling and 1-D adaptive pooling ----------------------------------------------

ADAPTIVE_2D = [((7, 7), (3, 3)), ((10, 9), (4, 5)), ((7, 10), (3, 4)), ((9, 9), 1),
               ((5, 6), (5, 6)), ((3, 4), (5, 7)), ((7, 9), (2, None)), ((7, 9), (None, 4)),
               ((1, 1), 2)]


@pytest.mark.parametrize("in_size, output_size", ADAPTIVE_2D, ids=str)
def test_adaptive_max_pool2d_matches_torch(in_size, output_size):
    pnnx_size = output_size if isinstance(output_size, int) else \
        tuple(0 if v is None else v for v in output_size)                # pnnx: None -> 0
    params = {"output_size": pnnx_size, "return_indices": False}
    check_layer("nn.AdaptiveMaxPool2d", nn.AdaptiveMaxPool2d(output_size), [(2, 3, *in_size)],
                params)
    for x in (rand(2, 3, *in_size), ties_and_nans(3, *in_size)):
        check_with_indices("F.adaptive_max_pool2d",
                           lambda t: F.adaptive_max_pool2d(t, output_size, True), x,
                           {"output_size": pnnx_size, "return_indices": True})


@pytest.mark.parametrize("size, output_size", [(10, 3), (7, 7), (7, 1), (3, 5), (9, 4), (1, 1)])
def test_adaptive_pool1d_matches_torch(size, output_size):
    params = {"output_size": (output_size,)}                         # pnnx: output_size=(3)
    check_layer("nn.AdaptiveAvgPool1d", nn.AdaptiveAvgPool1d(output_size), [(2, 3, size)],
                params)
    check_layer("F.adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, output_size),
                [(3, size)], params)
    check_layer("nn.AdaptiveMaxPool1d", nn.AdaptiveMaxPool1d(output_size), [(2, 3, size)],
                {**params, "return_indices": False})
    for x in (rand(2, 3, size), ties_and_nans(3, size)):
        check_with_indices("F.adaptive_max_pool1d",
                           lambda t: F.adaptive_max_pool1d(t, output_size, True), x,
                           {**params, "return_indices": True})


def test_adaptive_pooling_takes_the_size_as_a_second_input():
    x = rand(2, 3, 10, 7)
    layer = make_layer("F.adaptive_max_pool2d", {"return_indices": True})
    values, indices = layer.forward([x, np.array([4, 3])])
    want_values, want_indices = F.adaptive_max_pool2d(torch.from_numpy(x), (4, 3), True)
    np.testing.assert_array_equal(values, want_values.numpy())
    np.testing.assert_array_equal(indices, want_indices.numpy())
    assert layer.infer_shapes_from([x.shape, (2,)], [None, np.array([4, 3])]) == \
        [(2, 3, 4, 3)] * 2
    layer = make_layer("F.adaptive_avg_pool1d")
    (y,) = layer.forward([x[0], np.array([4])])
    np.testing.assert_allclose(y, F.adaptive_avg_pool1d(torch.from_numpy(x[0]), 4).numpy(),
                               atol=1e-6)
    assert layer.infer_shapes_from([(3, 10, 7), (1,)], [None, np.array([4])]) == [(3, 10, 4)]


# ----- pnnx exports run by the graph --------------------------------------------------------------

class Pooling1d(nn.Module):
    """Every 1-D pooling pnnx writes, max pooling with its indices (int64 graph outputs)."""

    def __init__(self):
        super().__init__()
        self.max = nn.MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True, return_indices=True)
        self.avg = nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.adaptive_avg = nn.AdaptiveAvgPool1d(3)
        self.adaptive_max = nn.AdaptiveMaxPool1d(4)

    def forward(self, x):                                           # (N, C, L)
        y, where = self.max(x)
        values, indices = F.adaptive_max_pool1d(x, 5, return_indices=True)
        return (self.avg(y), F.avg_pool1d(y, 2, ceil_mode=True), F.max_pool1d(x, 2),
                self.adaptive_avg(y), self.adaptive_max(x), where, values, indices)


class Pooling2d(nn.Module):
    """Every 2-D pooling pnnx writes, with indices, ceil_mode, dilation, divisor_override and
    adaptive sizes that do not divide the input."""

    def __init__(self):
        super().__init__()
        self.max = nn.MaxPool2d(3, 2, 1, dilation=(1, 2), ceil_mode=True, return_indices=True)
        self.avg = nn.AvgPool2d((3, 2), 2, (1, 1), ceil_mode=True, count_include_pad=False)
        self.divided = nn.AvgPool2d(3, 1, 1, divisor_override=4)
        self.adaptive_max = nn.AdaptiveMaxPool2d((3, None))
        self.adaptive_avg = nn.AdaptiveAvgPool2d((None, 3))
        self.adaptive_indices = nn.AdaptiveMaxPool2d(2, return_indices=True)  # a tuple, unpacked

    def forward(self, x):                                           # (N, C, H, W)
        y, where = self.max(x)
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        z, _ = F.adaptive_max_pool2d(x, (4, 3), return_indices=True)
        maxima, positions = self.adaptive_indices(x)
        return (self.avg(y), self.divided(x), self.adaptive_max(x), self.adaptive_avg(x),
                where, values, indices, z, maxima * 2.0, positions)


def test_pnnx_export_of_1d_pooling(tmp_path):
    check_exported(tmp_path, Pooling1d(), "pooling_1d",
                   ["nn.MaxPool1d", "F.max_pool1d", "nn.AvgPool1d", "F.avg_pool1d",
                    "nn.AdaptiveAvgPool1d", "nn.AdaptiveMaxPool1d", "F.adaptive_max_pool1d"],
                   [(2, 3, 17)], [(3, 3, 23)])


def test_pnnx_export_of_2d_pooling(tmp_path):
    check_exported(tmp_path, Pooling2d(), "pooling_2d",
                   ["nn.MaxPool2d", "F.max_pool2d", "nn.AvgPool2d", "nn.AdaptiveMaxPool2d",
                    "nn.AdaptiveAvgPool2d", "F.adaptive_max_pool2d"],
                   [(2, 3, 11, 10)], [(1, 3, 14, 17)])


# ----- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, params", [
    ("nn.MaxPool2d", pool_params((0, 2))),
    ("nn.MaxPool2d", pool_params((2, 2), (-1, 1))),
    ("nn.MaxPool2d", pool_params((2, 2), padding=(2, 0))),          # more than half the kernel
    ("nn.MaxPool2d", pool_params((3, 3), padding=(-1, 0))),
    ("nn.MaxPool2d", pool_params((3, 3), dilation=0)),
    ("nn.MaxPool1d", pool_params((3, 3))),
    ("nn.MaxPool1d", pool_params(3, padding=2)),
    ("nn.AvgPool1d", pool_params(0)),
    ("nn.AdaptiveMaxPool2d", {"output_size": (2, -1)}),
    ("nn.AdaptiveMaxPool1d", {"output_size": (2, 2)}),
    ("nn.AvgPool2d", pool_params((3, 3), divisor_override=0)),
    ("nn.AdaptiveAvgPool2d", {"output_size": (1, 2, 3)}),
], ids=str)
def test_bad_params_are_layer_errors(type_name, params):
    with pytest.raises(LayerError):
        make_layer(type_name, params)


@pytest.mark.parametrize("type_name, params, shape", [
    ("nn.MaxPool2d", pool_params((3, 3)), (1, 1, 2, 8)),             # window does not fit
    ("nn.MaxPool2d", pool_params((3, 3)), (8, 8)),                   # rank 2
    ("nn.AvgPool2d", pool_params((3, 3)), (1, 2, 3, 3, 3)),          # rank 5
    ("nn.AdaptiveAvgPool2d", {"output_size": 2}, (4, 4)),
    ("nn.MaxPool2d", pool_params((3, 3), (2, 2), (1, 1), True), (1, 3, 0, 4)),   # empty H
    ("nn.AvgPool2d", pool_params((1, 1)), (1, 0, 4, 4)),                       # no channels
    ("nn.AdaptiveAvgPool2d", {"output_size": 3}, (3, 4, 0)),
    ("nn.MaxPool1d", pool_params(3), (1, 2, 3, 8)),                  # rank 4
    ("nn.AvgPool1d", pool_params(3), (8,)),                          # rank 1
    ("nn.AvgPool1d", pool_params(3), (1, 2, 2)),                     # too short
    ("nn.AdaptiveMaxPool1d", {"output_size": 2}, (1, 2, 3, 4)),
    ("nn.AdaptiveMaxPool2d", {"output_size": 2}, (1, 0, 3, 4)),
], ids=str)
def test_bad_input_shapes_are_shape_errors(type_name, params, shape):
    with pytest.raises(ShapeError):
        make_layer(type_name, params).infer_shapes([shape])


# ----- registration ----------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.MaxPool2d", MaxPool2d), ("F.max_pool2d", MaxPool2d),
    ("nn.AvgPool2d", AvgPool2d), ("F.avg_pool2d", AvgPool2d),
    ("nn.AdaptiveAvgPool2d", AdaptiveAvgPool2d), ("F.adaptive_avg_pool2d", AdaptiveAvgPool2d),
    ("nn.MaxPool1d", MaxPool1d), ("F.max_pool1d", MaxPool1d),
    ("nn.AvgPool1d", AvgPool1d), ("F.avg_pool1d", AvgPool1d),
    ("nn.AdaptiveAvgPool1d", AdaptiveAvgPool1d), ("F.adaptive_avg_pool1d", AdaptiveAvgPool1d),
    ("nn.AdaptiveMaxPool2d", AdaptiveMaxPool2d), ("F.adaptive_max_pool2d", AdaptiveMaxPool2d),
    ("nn.AdaptiveMaxPool1d", AdaptiveMaxPool1d), ("F.adaptive_max_pool1d", AdaptiveMaxPool1d)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


# ----- aten::max_pool2d / aten::avg_pool2d: every argument a pnnx.Expression input ---------------

NONE = np.array(None, dtype=object)                  # what a pnnx.Expression ``None`` gives


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    ([3, 2], NONE, [0, 0], [1, 1], False), ([3, 3], [2, 1], [1, 1], [1, 2], True),
    ([7, 5], [1, 1], [0, 0], [1, 1], False),
], ids=str)
def test_aten_max_pool2d_takes_its_arguments_as_inputs(kernel, stride, padding, dilation,
                                                        ceil_mode):
    """pnnx writes ``aten::max_pool2d`` when the kernel is computed from the input size; its
    arguments are inputs (stride=None: the kernel size)."""
    x = rand(2, 3, 7, 5)
    arguments = [np.array(kernel), stride, np.array(padding), np.array(dilation),
                 np.array(ceil_mode)]
    layer = make_layer("aten::max_pool2d")
    (y,) = layer.forward([x, *arguments])
    torch_stride = None if stride is NONE else tuple(stride)
    expected = F.max_pool2d(torch.from_numpy(x), tuple(kernel), torch_stride, tuple(padding),
                            tuple(dilation), ceil_mode).numpy()
    np.testing.assert_array_equal(y, expected)
    shapes = [x.shape] + [np.shape(a) for a in arguments]
    assert layer.infer_shapes_from(shapes, [None, *arguments]) == [expected.shape]
    with pytest.raises(ShapeError, match="kernel_size is an input whose value is not known"):
        layer.infer_shapes(shapes)


@pytest.mark.parametrize("ceil_mode, count_include_pad, divisor", [
    (False, True, None), (True, False, None), (True, True, 5)])
def test_aten_avg_pool2d_takes_its_arguments_as_inputs(ceil_mode, count_include_pad, divisor):
    x = rand(1, 4, 9, 8)
    arguments = [np.array([4, 3]), np.array([3, 2]), np.array([1, 1]), np.array(ceil_mode),
                 np.array(count_include_pad), NONE if divisor is None else np.array(divisor)]
    (y,) = make_layer("aten::avg_pool2d").forward([x, *arguments])
    expected = F.avg_pool2d(torch.from_numpy(x), (4, 3), (3, 2), (1, 1), ceil_mode,
                            count_include_pad, divisor).numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_aten_pool_keeps_a_bounded_number_of_configured_pools():
    """The kernel follows the input's size, so a stream of ever new sizes configures ever new
    pools: the layer keeps at most MAX_SIZES, and a size whose pool went is configured again."""
    from layers.base import MAX_SIZES

    layer = make_layer("aten::avg_pool2d")
    sizes = [(2 + i % 10, 2 + i // 10) for i in range(MAX_SIZES + 5)]
    for h, w in sizes + sizes[:2]:
        x = rand(1, 2, 2 * h, 2 * w)
        kernel = np.array([h, w])                     # F.avg_pool2d(x, (H // 2, W // 2))
        (y,) = layer.forward([x, kernel, NONE, np.array([0, 0]), np.array(False),
                              np.array(True), NONE])
        want = F.avg_pool2d(torch.from_numpy(x), (h, w)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        assert 0 < len(layer._pools) <= MAX_SIZES


def test_aten_pool_with_bad_arguments_is_an_error():
    layer = make_layer("aten::avg_pool2d")
    with pytest.raises(ShapeError, match="expects 7 inputs"):
        layer.forward([rand(1, 2, 4, 4), np.array([2, 2])])
    with pytest.raises(LayerError, match="padding"):                # padding > kernel / 2
        layer.forward([rand(1, 2, 4, 4), np.array([2, 2]), NONE, np.array([2, 2]),
                       np.array(False), np.array(True), NONE])


class PowerPools(nn.Module):
    def __init__(self):
        super().__init__()
        self.lp2 = nn.LPPool2d(2, 3, stride=2)
        self.lp3 = nn.LPPool2d(3.0, (2, 3), stride=(1, 2), ceil_mode=True)
        self.lp1d = nn.LPPool1d(1, 3, stride=2, ceil_mode=True)

    def forward(self, x):
        return (self.lp2(x), self.lp3(x), F.lp_pool2d(x, 1.5, (2, 3)),
                self.lp1d(x.flatten(2)))


@pytest.mark.parametrize("positive", [True, False], ids=["positive", "with negatives"])
def test_pnnx_export_of_lp_pooling_matches_torch(pnnx_export, positive):
    """p = 2, 3 (ceil_mode), 1.5 (NaN where a window's sum of x^p is negative, as torch)
    and 1-D sum pooling."""
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 9)).astype(np.float32)
    check_export(pnnx_export, PowerPools(), [np.abs(x) if positive else x],
                 f"lp_pool_{positive}", ["nn.LPPool2d", "F.lp_pool2d", "nn.LPPool1d"])
