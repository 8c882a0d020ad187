"""Max, average and adaptive average pooling against torch, ceil_mode edge cases included."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, rand
from layers import LayerRegisterer
from layers.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from parser.errors import LayerError, ShapeError


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
], ids=str)
def test_adaptive_avg_pool2d_matches_torch(in_size, output_size):
    params = {"output_size": output_size}
    check_layer("nn.AdaptiveAvgPool2d", nn.AdaptiveAvgPool2d(output_size), [(2, 3, *in_size)],
                params)


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


# ----- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, params", [
    ("nn.MaxPool2d", pool_params((0, 2))),
    ("nn.MaxPool2d", pool_params((2, 2), (-1, 1))),
    ("nn.MaxPool2d", pool_params((2, 2), padding=(2, 0))),          # more than half the kernel
    ("nn.MaxPool2d", pool_params((3, 3), padding=(-1, 0))),
    ("nn.MaxPool2d", pool_params((3, 3), dilation=0)),
    ("nn.MaxPool2d", pool_params((3, 3), return_indices=True)),
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
], ids=str)
def test_bad_input_shapes_are_shape_errors(type_name, params, shape):
    with pytest.raises(ShapeError):
        make_layer(type_name, params).infer_shapes([shape])


# ----- registration ----------------------------------------------------------------------------

@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.MaxPool2d", MaxPool2d), ("F.max_pool2d", MaxPool2d),
    ("nn.AvgPool2d", AvgPool2d), ("F.avg_pool2d", AvgPool2d),
    ("nn.AdaptiveAvgPool2d", AdaptiveAvgPool2d), ("F.adaptive_avg_pool2d", AdaptiveAvgPool2d)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
