"""Elementwise operators pnnx keeps out of pnnx.Expression, against torch: comparisons,
logical / bitwise operators, where, masked_fill, casts, the aten:: math functions; with
broadcasting, number operands written as parameters, and torch's result dtypes."""

import numpy as np
import pytest
import torch
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from layers import LayerRegisterer
from layers import elementwise as ew
from parser.errors import LayerError, ShapeError

SHAPE, BROADCAST = (2, 3, 4, 5), (3, 1, 5)
RNG = np.random.default_rng(5)
INTS = RNG.integers(-4, 5, SHAPE)
SMALL_INTS = RNG.integers(-4, 5, BROADCAST)


def with_ties(shape):
    """Random float32 values with many exact ties (so == and <= are tested)."""
    return RNG.integers(-2, 3, shape).astype(np.float32) / 2


COMPARISONS = {"torch.eq": torch.eq, "torch.ne": torch.ne, "torch.gt": torch.gt,
               "torch.ge": torch.ge, "torch.lt": torch.lt, "torch.le": torch.le}


@pytest.mark.parametrize("type_name", sorted(COMPARISONS))
def test_comparisons_match_torch(type_name):
    function = COMPARISONS[type_name]
    check_layer(type_name, function, [with_ties(SHAPE), with_ties(BROADCAST)])
    check_layer(type_name, function, [with_ties(BROADCAST), with_ties(SHAPE)])
    check_layer(type_name, lambda t: function(t, 0.5), [with_ties(SHAPE)], {"other": 0.5})
    check_layer(type_name, lambda t: function(t, 1), [INTS], {"other": 1})
    check_layer(type_name, lambda t: function(t, 0.5), [INTS], {"other": 0.5})   # 0.5 stays
    check_layer(type_name, function, [INTS, with_ties(BROADCAST)])


LOGICAL = {"torch.logical_and": torch.logical_and, "torch.logical_or": torch.logical_or,
           "torch.logical_xor": torch.logical_xor}
BITWISE = {"torch.bitwise_and": torch.bitwise_and, "torch.bitwise_or": torch.bitwise_or,
           "torch.bitwise_xor": torch.bitwise_xor}


@pytest.mark.parametrize("type_name", sorted(LOGICAL))
def test_logical_operators_match_torch(type_name):
    function = LOGICAL[type_name]
    check_layer(type_name, function, [INTS > 0, SMALL_INTS > 0])
    check_layer(type_name, function, [INTS, with_ties(BROADCAST)])      # any dtype: nonzero


@pytest.mark.parametrize("type_name", sorted(BITWISE))
def test_bitwise_operators_match_torch(type_name):
    function = BITWISE[type_name]
    check_layer(type_name, function, [INTS, SMALL_INTS])
    check_layer(type_name, function, [INTS > 0, SMALL_INTS > 0])
    check_layer(type_name, lambda t: function(t, 3), [INTS], {"other": 3})
    with pytest.raises(LayerError, match="integer or bool"):
        make_layer(type_name).forward([rand(2, 3), rand(2, 3)])


UNARY = {"torch.logical_not": torch.logical_not, "torch.bitwise_not": torch.bitwise_not,
         "aten::isnan": torch.isnan, "aten::isinf": torch.isinf,
         "aten::isfinite": torch.isfinite, "aten::erfc": torch.erfc, "aten::exp2": torch.exp2,
         "aten::log2": torch.log2, "aten::frac": torch.frac, "aten::sgn": torch.sgn,
         "torch.positive": torch.positive}


@pytest.mark.parametrize("type_name", sorted(UNARY))
def test_unary_functions_match_torch(type_name):
    function = UNARY[type_name]
    special = np.float32([0, -0.0, 1.5, -2.5, 3, np.inf, -np.inf, np.nan, 1e-30, 80, -80])
    if type_name == "torch.bitwise_not":
        check_layer(type_name, function, [INTS])
        check_layer(type_name, function, [INTS > 0])
        return
    x = np.abs(rand(*SHAPE)) * 3 if type_name == "aten::log2" else rand(*SHAPE) * 3
    check_layer(type_name, function, [x], rtol=1e-5, atol=1e-6)
    check_layer(type_name, function, [special], rtol=1e-5, atol=1e-6)
    if type_name != "aten::frac":                  # torch has no frac of integers
        check_layer(type_name, function, [INTS if type_name != "aten::log2" else np.abs(INTS)])


def test_erfc_keeps_the_tail():
    x = np.float32([3, 5, 8, 9.5])
    check_layer("aten::erfc", torch.erfc, [x], rtol=1e-5, atol=0)


BINARY_MATH = {"aten::hypot": torch.hypot, "aten::copysign": torch.copysign,
               "aten::fmax": torch.fmax, "aten::fmin": torch.fmin, "aten::xlogy": torch.xlogy}


@pytest.mark.parametrize("type_name", sorted(BINARY_MATH))
def test_binary_math_matches_torch(type_name):
    function = BINARY_MATH[type_name]
    a, b = rand(*SHAPE), np.abs(rand(*BROADCAST)) + 0.1
    b[0, 0, 0] = 0
    a[0, 0, 0, :2] = [0, np.nan]
    check_layer(type_name, function, [a, b])
    check_layer(type_name, function, [b, a])


@pytest.mark.parametrize("condition_shape, a_shape, b_shape", [
    (SHAPE, SHAPE, SHAPE), (SHAPE, BROADCAST, (5,)), (BROADCAST, SHAPE, (1,))], ids=str)
def test_where_matches_torch(condition_shape, a_shape, b_shape):
    condition = rand(*condition_shape) > 0
    check_layer("torch.where", torch.where, [condition, a_shape, b_shape])
    check_layer("torch.where", lambda c, b: torch.where(c, 1.5, b), [condition, b_shape],
                {"input": 1.5})
    check_layer("torch.where", lambda c, a: torch.where(c, a, 0), [condition, a_shape],
                {"other": 0})


def test_where_dtypes_follow_torch():
    condition = rand(*SHAPE) > 0
    check_layer("torch.where", lambda c: torch.where(c, 2.0, -1.0), [condition],
                {"input": 2.0, "other": -1.0})                                # float32
    check_layer("torch.where", lambda c: torch.where(c, 2, -1), [condition],
                {"input": 2, "other": -1})                                    # int64
    check_layer("torch.where", lambda c, a: torch.where(c, a, 2), [condition, INTS],
                {"other": 2})                                                 # int64
    check_layer("torch.where", lambda c, a: torch.where(c, a, 0.5), [condition, INTS],
                {"other": 0.5})                                               # float32
    with pytest.raises(LayerError, match="bool"):
        make_layer("torch.where").forward([rand(2), rand(2), rand(2)])
    with pytest.raises(ShapeError, match="broadcast"):
        make_layer("torch.where").infer_shapes([(2, 3), (4, 3), (3,)])


def test_masked_fill_matches_torch():
    x = rand(*SHAPE)
    for mask_shape in [SHAPE, BROADCAST, (5,)]:
        mask = rand(*mask_shape) > 0
        for value in [1.0, float("-inf"), 0]:
            check_layer("Tensor.masked_fill", lambda t, m, v=value: t.masked_fill(m, v), [x, mask],
                        {"value": value})
    check_layer("Tensor.masked_fill", lambda t, m: t.masked_fill(m, 3), [INTS, INTS > 0],
                {"value": 3})
    check_layer("Tensor.masked_fill", lambda t, m, v: t.masked_fill(m, v),
                [x, x > 0, np.array(2.5, np.float32)])
    with pytest.raises(ShapeError, match="does not broadcast"):
        make_layer("Tensor.masked_fill", {"value": 0.0}).infer_shapes([(3, 1), (3, 4)])


def test_addcmul_and_addcdiv_match_torch():
    value = np.array(0.5, np.float32)
    check_layer("aten::addcmul", lambda x, a, b, v: torch.addcmul(x, a, b, value=0.5),
                [SHAPE, BROADCAST, SHAPE, value])
    check_layer("aten::addcmul", torch.addcmul, [SHAPE, SHAPE, BROADCAST])
    check_layer("aten::addcdiv", lambda x, a, b, v: torch.addcdiv(x, a, b, value=2.0),
                [SHAPE, BROADCAST, np.abs(rand(*SHAPE)) + 1, np.array(2.0, np.float32)])
    check_layer("aten::addcmul", lambda x, a, b, v: torch.addcmul(x, a, b, value=3),
                [INTS, INTS, INTS, np.array(3, np.int64)])
    with pytest.raises(LayerError, match="integer"):
        make_layer("aten::addcdiv").forward([INTS, INTS, INTS + 1])


def test_lerp_matches_torch():
    check_layer("aten::lerp", torch.lerp, [SHAPE, BROADCAST, np.array(0.3, np.float32)])
    check_layer("aten::lerp", torch.lerp, [SHAPE, BROADCAST, SHAPE])


@pytest.mark.parametrize("dtype", ["torch.float", "torch.double", "torch.int", "torch.long",
                                   "torch.short", "torch.int8", "torch.uint8", "torch.bool"])
def test_to_matches_torch(dtype):
    torch_dtype = getattr(torch, dtype[6:])
    x = rand(*SHAPE) * 50
    if dtype == "torch.uint8":
        x = np.abs(x)                          # negative float -> uint8 is undefined in C
    check_layer("Tensor.to", lambda t: t.to(torch_dtype), [x], {"dtype": dtype, "copy": False})
    check_layer("Tensor.to", lambda t: t.to(torch_dtype), [INTS], {"dtype": dtype})
    check_layer("Tensor.to", lambda t: t.to(torch_dtype), [INTS > 0], {"dtype": dtype})


def test_to_output_is_a_new_array():
    x = rand(2, 3)
    [y] = make_layer("Tensor.to", {"dtype": "torch.float"}).forward([x])
    assert y is not x and not np.shares_memory(x, y)
    with pytest.raises(LayerError, match="unknown dtype"):
        make_layer("Tensor.to", {"dtype": "torch.float8"})


def test_type_as_matches_torch():
    check_layer("Tensor.type_as", lambda a, b: a.type_as(b), [rand(*SHAPE) * 9, INTS])
    check_layer("Tensor.type_as", lambda a, b: a.type_as(b), [INTS, rand(3)])


@pytest.mark.parametrize("type_name, layer_class", [
    *((name, ew.Binary) for name in [*COMPARISONS, *LOGICAL, *BITWISE, *BINARY_MATH]),
    *((name, ew.Unary) for name in UNARY),
    ("torch.where", ew.Where), ("Tensor.masked_fill", ew.MaskedFill), ("aten::lerp", ew.Lerp),
    ("Tensor.to", ew.To), ("Tensor.type_as", ew.TypeAs)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


# ----- what pnnx writes -------------------------------------------------------------------------

class Elementwise(nn.Module):
    """Operators pnnx leaves out of pnnx.Expression, next to ones it folds in (maximum, pow
    with a tensor exponent, abs, where's arithmetic), with broadcasting."""

    def forward(self, x, y, i, k):
        positive, j = x > 0, k > 0
        return (torch.maximum(x, y), torch.minimum(x, y), torch.pow(x.abs() + 1, y), x.abs(),
                torch.where(x > y, x, y), torch.where(positive, x, 0.0),
                torch.where(positive, 1.0, x), torch.where(positive, 2.0, -1.0),
                x >= 0.5, x < y, x <= y, x == y, x != y, 0 < x, torch.eq(i, 2),
                positive.float(), x.to(torch.int64), x.int(), x.double(), i.to(torch.float32),
                x.type_as(i), torch.logical_and(positive, y > 0), torch.logical_or(positive, j),
                torch.logical_not(positive), torch.logical_xor(positive, j), ~positive,
                torch.bitwise_and(i, j), i | 3, torch.bitwise_xor(i, j), ~i,
                x.masked_fill(positive, float("-inf")), x.masked_fill(y > 0.5, 3.0),
                torch.isnan(x), torch.isinf(x), torch.isfinite(x), torch.erfc(x),
                torch.exp2(x), torch.log2(x.abs() + 1), torch.frac(x * 3), torch.sgn(x),
                torch.positive(x), torch.hypot(x, y), torch.copysign(x, y), torch.fmax(x, y),
                torch.fmin(x, y), torch.xlogy(x.abs(), y.abs()), torch.lerp(x, y, 0.3),
                torch.lerp(x, y, x), torch.addcmul(x, y, x, value=0.5),
                torch.addcdiv(x, y, x.abs() + 1, value=2.0))


def test_pnnx_export_of_elementwise(pnnx_export):
    x, y = rand(*SHAPE), rand(*BROADCAST)
    check_export(pnnx_export, Elementwise(), [x, y, INTS, SMALL_INTS], "elementwise", [
        "pnnx.Expression", "torch.where", "torch.gt", "torch.ge", "torch.lt", "torch.le",
        "torch.eq", "torch.ne", "Tensor.to", "Tensor.type_as", "torch.logical_and",
        "torch.logical_or", "torch.logical_not", "torch.logical_xor", "torch.bitwise_not",
        "torch.bitwise_and", "torch.bitwise_xor", "Tensor.masked_fill", "aten::isnan",
        "aten::isinf", "aten::isfinite", "aten::erfc", "aten::exp2", "aten::log2",
        "aten::frac", "aten::sgn", "torch.positive", "aten::hypot", "aten::copysign",
        "aten::fmax", "aten::fmin", "aten::xlogy", "aten::lerp", "aten::addcmul",
        "aten::addcdiv"])


class NanToNum(nn.Module):
    def forward(self, x):
        return (torch.nan_to_num(x), torch.nan_to_num(x, nan=-1.0, posinf=9.0),
                x.nan_to_num(neginf=-7.5), torch.nan_to_num((x * 0).long()))


def test_pnnx_export_of_nan_to_num_matches_torch(pnnx_export):
    x = rand(2, 3, 4)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    x[1, 2, 1] = np.nan
    check_export(pnnx_export, NanToNum(), [x], "nan_to_num", ["aten::nan_to_num"])
