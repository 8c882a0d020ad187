"""Reductions against torch: every dim spelling (int, negative, several, none), keepdim,
max/min with (values, indices), integer dtypes, errors; and what pnnx writes for them."""

import numpy as np
import pytest
import torch
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from layers import LayerRegisterer
from layers import reduction as red
from parser.errors import LayerError, ShapeError

SHAPE = (2, 3, 4, 5)
DIMS = [None, 0, 1, -1, -3, (1,), (1, 2), (0, -1), (3, 0, 1), (0, 1, 2, 3)]


def torch_dims(dim):
    return tuple(range(len(SHAPE))) if dim is None else dim


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS, ids=str)
@pytest.mark.parametrize("type_name, torch_fn", [
    ("torch.sum", torch.sum), ("torch.mean", torch.mean), ("torch.amax", torch.amax),
    ("torch.amin", torch.amin), ("torch.logsumexp", torch.logsumexp)])
def test_reductions_over_dims_match_torch(type_name, torch_fn, dim, keepdim):
    params = {"keepdim": keepdim} if dim is None else {"dim": dim, "keepdim": keepdim}
    check_layer(type_name, lambda t: torch_fn(t, torch_dims(dim), keepdim=keepdim), [SHAPE],
                params)


@pytest.mark.parametrize("type_name, torch_fn", [
    ("torch.sum", torch.sum), ("torch.mean", torch.mean), ("torch.amax", torch.amax),
    ("torch.amin", torch.amin)])
def test_no_dim_reduces_the_whole_tensor(type_name, torch_fn):
    """pnnx writes torch.sum(x) with no parameters at all, torch.amax(x) with dim=None."""
    check_layer(type_name, torch_fn, [SHAPE], {})
    check_layer(type_name, torch_fn, [SHAPE], {"dim": None, "keepdim": False})


@pytest.mark.parametrize("type_name, torch_fn", [
    ("torch.var", torch.var), ("torch.std", torch.std)])
@pytest.mark.parametrize("dim", [1, -1, (0, 2)], ids=str)
@pytest.mark.parametrize("unbiased", [True, False])
def test_variance_matches_torch(type_name, torch_fn, dim, unbiased):
    check_layer(type_name, lambda t: torch_fn(t, dim, unbiased=unbiased, keepdim=True),
                [SHAPE], {"dim": dim, "keepdim": True, "unbiased": unbiased})
    check_layer(type_name, lambda t: torch_fn(t, dim, correction=2), [SHAPE],
                {"dim": dim, "correction": 2})


@pytest.mark.parametrize("dim", [None, 0, 1, -1, -4])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_matches_torch(dim, keepdim):
    x = np.random.default_rng(1).uniform(0.5, 1.5, SHAPE).astype(np.float32)
    if dim is None:
        check_layer("torch.prod", torch.prod, [x], {})
        layer = make_layer("aten::prod")                 # its second input: dtype=None
        assert layer.infer_shapes([SHAPE, ()]) == [()]
        np.testing.assert_allclose(layer.forward([x, np.array(None)])[0],
                                   torch.prod(torch.from_numpy(x)).numpy(), rtol=1e-5)
        with pytest.raises(LayerError, match="dtype=None"):
            layer.forward([x, np.array(3)])
    else:
        check_layer("torch.prod", lambda t: torch.prod(t, dim, keepdim=keepdim), [x],
                    {"dim": dim, "keepdim": keepdim})


@pytest.mark.parametrize("type_name, torch_fn", [("torch.max", torch.max),
                                                 ("torch.min", torch.min)])
@pytest.mark.parametrize("dim", [0, 1, 3, -1, -2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_give_values_and_indices(type_name, torch_fn, dim, keepdim):
    x = rand(*SHAPE)
    values, indices = check_layer(type_name, lambda t: tuple(torch_fn(t, dim, keepdim)), [x],
                                  {"dim": dim, "keepdim": keepdim})
    assert indices.dtype == np.int64
    layer = make_layer(type_name, {"dim": dim, "keepdim": keepdim})
    layer.num_outputs = 1                            # pnnx: torch.max(x, dim)[0]
    [shape] = layer.infer_shapes([SHAPE])
    [only] = layer.forward([x])
    assert shape == only.shape
    np.testing.assert_array_equal(only, values)


@pytest.mark.parametrize("type_name, torch_fn", [("torch.max", torch.max),
                                                 ("torch.min", torch.min)])
def test_max_min_of_the_whole_tensor(type_name, torch_fn):
    check_layer(type_name, torch_fn, [SHAPE], {})


@pytest.mark.parametrize("type_name, torch_fn", [("torch.argmax", torch.argmax),
                                                 ("torch.argmin", torch.argmin)])
@pytest.mark.parametrize("dim", [None, 0, 2, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin_match_torch(type_name, torch_fn, dim, keepdim):
    check_layer(type_name, lambda t: torch_fn(t, dim, keepdim), [SHAPE],
                {"dim": dim, "keepdim": keepdim})


def test_integer_and_bool_tensors_follow_torch_dtypes():
    ints = np.random.default_rng(2).integers(-5, 5, SHAPE).astype(np.int32)
    check_layer("torch.sum", lambda t: torch.sum(t, 1), [ints], {"dim": 1})      # int64
    check_layer("torch.sum", torch.sum, [ints > 0], {})                          # int64
    check_layer("torch.prod", lambda t: torch.prod(t, 2), [ints], {"dim": 2})
    check_layer("torch.amax", lambda t: torch.amax(t, -1), [ints], {"dim": -1})  # int32
    check_layer("torch.max", lambda t: tuple(torch.max(t, 0)), [ints], {"dim": 0})
    check_layer("torch.argmin", lambda t: torch.argmin(t, 1), [ints], {"dim": 1})
    with pytest.raises(LayerError, match="floating"):
        make_layer("torch.mean").forward([ints])


def test_nan_wins_as_in_torch():
    x = np.float32([[1, np.nan, 3], [4, 5, 6]])
    check_layer("torch.amax", lambda t: torch.amax(t, 1), [x], {"dim": 1})
    check_layer("torch.max", lambda t: tuple(torch.max(t, 1)), [x], {"dim": 1})
    check_layer("torch.argmax", lambda t: torch.argmax(t, 1), [x], {"dim": 1})


def test_reducing_an_empty_dim():
    empty = np.zeros((2, 0, 3), np.float32)
    check_layer("torch.sum", lambda t: torch.sum(t, 1), [empty], {"dim": 1})
    with pytest.raises(ShapeError, match="empty"):
        make_layer("torch.amax", {"dim": 1}).infer_shapes([(2, 0, 3)])
    with pytest.raises(ShapeError, match="empty"):
        make_layer("torch.max", {"dim": 1}).infer_shapes([(2, 0, 3)])


@pytest.mark.parametrize("type_name, params, shape, words", [
    ("torch.sum", {"dim": 4}, SHAPE, "out of range"),
    ("torch.mean", {"dim": (1, -3)}, SHAPE, "twice"),
    ("torch.max", {"dim": -5}, SHAPE, "out of range"),
    ("torch.argmax", {"dim": 2}, (3, 4), "out of range"),
], ids=str)
def test_bad_dims_are_shape_errors(type_name, params, shape, words):
    with pytest.raises(ShapeError, match=words):
        make_layer(type_name, params).infer_shapes([shape])


@pytest.mark.parametrize("type_name, params", [
    ("torch.sum", {"dim": 1.5}), ("torch.sum", {"keepdim": 1}), ("torch.max", {"dim": (1, 2)}),
    ("torch.prod", {"dim": (0, 1)})], ids=str)
def test_bad_params_are_layer_errors(type_name, params):
    with pytest.raises(LayerError):
        make_layer(type_name, params)


@pytest.mark.parametrize("type_name, layer_class", [
    ("torch.sum", red.Sum), ("torch.mean", red.Mean), ("torch.prod", red.Prod),
    ("aten::prod", red.WholeProd), ("torch.amax", red.Amax), ("torch.amin", red.Amin),
    ("torch.max", red.MaxMin), ("torch.min", red.MaxMin), ("torch.argmax", red.ArgMaxMin),
    ("torch.argmin", red.ArgMaxMin), ("torch.logsumexp", red.LogSumExp),
    ("torch.var", red.Variance), ("torch.std", red.Variance)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


# ----- what pnnx writes -------------------------------------------------------------------------

class Reductions(nn.Module):
    """Each reduction in its torch and Tensor spellings, with every kind of dim."""

    def forward(self, x):
        return (torch.sum(x), torch.sum(x, 1), x.sum(-1, keepdim=True), torch.sum(x, (1, 2)),
                x.sum(dim=[0, -1]), torch.mean(x), x.mean((2, 3), keepdim=True),
                torch.mean(x, -2), torch.max(x), torch.max(x, 1)[0], torch.max(x, 1),
                x.max(-1, keepdim=True), x.min(), torch.min(x, dim=2), x.min(0)[1],
                torch.amax(x, (1, 2), keepdim=True), x.amin(-1), torch.amax(x),
                torch.prod(x), torch.prod(x, 1), x.prod(-1, keepdim=True),
                torch.argmax(x), torch.argmax(x, 1), x.argmax(-1, keepdim=True),
                torch.argmin(x, 2), x.argmin(), torch.logsumexp(x, 1),
                torch.var(x, 1), x.std((0, 2), keepdim=True, unbiased=False))


def test_pnnx_export_of_reductions(pnnx_export):
    check_export(pnnx_export, Reductions(), [SHAPE], "reductions", [
        "torch.sum", "torch.mean", "torch.max", "torch.min", "torch.amax", "torch.amin",
        "torch.prod", "aten::prod", "torch.argmax", "torch.argmin", "torch.logsumexp",
        "torch.var", "torch.std"], atol=1e-4)


# ----- norm, cumsum / cumprod, topk --------------------------------------------------------------

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 1, -1, (1, 2), (0, 3)], ids=str)
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.5, 0.0, float("inf"), float("-inf")], ids=str)
def test_norm_matches_torch(p, dim, keepdim):
    x = rand(*SHAPE)
    x[0, 0, 0, :2] = 0                                   # p = 0 counts the non-zeros
    check_layer("torch.norm", lambda t: torch.linalg.vector_norm(t, p, torch_dims(dim),
                                                                  keepdim), [x],
                {"dim": dim, "keepdim": keepdim, "p": p})


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("type_name, torch_fn", [("torch.cumsum", torch.cumsum),
                                                 ("torch.cumprod", torch.cumprod)])
def test_cumulative_sum_and_product_match_torch(type_name, torch_fn, dim):
    check_layer(type_name, lambda t: torch_fn(t, dim), [SHAPE], {"dim": dim})
    ints = np.arange(24, dtype=np.int32).reshape(2, 3, 4) % 5
    check_layer(type_name, lambda t: torch_fn(t, dim), [ints], {"dim": dim})   # int64 out


@pytest.mark.parametrize("k, dim, largest", [(1, -1, True), (3, 1, False), (5, 3, True),
                                             (0, 0, True), (2, -2, False)], ids=str)
def test_topk_values_and_indices_match_torch(k, dim, largest):
    check_layer("torch.topk", lambda t: torch.topk(t, k, dim, largest),
                [SHAPE], {"k": k, "dim": dim, "largest": largest, "sorted": True})


@pytest.mark.parametrize("largest", [True, False])
def test_topk_counts_nan_as_the_largest_value(largest):
    x = np.array([[1, np.nan, 3, -np.inf, np.inf, 0.5]], np.float32)
    values, indices = make_layer("torch.topk", {"k": 3, "dim": 1, "largest": largest}
                                 ).forward([x])
    want = torch.topk(torch.from_numpy(x), 3, dim=1, largest=largest)
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())


def test_topk_with_k_past_the_dim_is_a_shape_error():
    with pytest.raises(ShapeError, match="k=6"):
        make_layer("torch.topk", {"k": 6, "dim": -1}).infer_shapes([SHAPE])


class NormsAndScans(nn.Module):
    def forward(self, x):
        return (torch.norm(x), x.norm(p=1, dim=(1, 2)), x.norm(dim=1, keepdim=True),
                torch.linalg.vector_norm(x, float("inf"), dim=-1), x.cumsum(-1),
                torch.cumprod(x, 1), torch.topk(x, 2, dim=1), x.topk(3, largest=False)[0])


def test_pnnx_export_of_norms_scans_and_topk(pnnx_export):
    check_export(pnnx_export, NormsAndScans(), [SHAPE], "norms_scans_topk",
                 ["torch.norm", "torch.cumsum", "torch.cumprod", "torch.topk"])


# ----- aten:: any / all / count_nonzero, sort / argsort, cummax / cummin, diff ------------------

def edgy(*shape, seed=0) -> np.ndarray:
    """Random values with a NaN, both infinities and a row of ties in them."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[[3, 11, 17]] = [np.nan, np.inf, -np.inf]
    x[..., 1, :] = 0.25
    return x


class OrderAndCount(nn.Module):
    def forward(self, x):
        return (torch.any(x > 0.5), x.all(), torch.any(x > 1, dim=1, keepdim=True),
                torch.all(x < 2, dim=-1), torch.any(x > 1.5, dim=(0, 2)),
                torch.count_nonzero(x > 0),
                torch.count_nonzero(x, dim=(1, 2)), torch.sort(x, dim=1),
                torch.sort(x, dim=-1, descending=True, stable=True),
                torch.argsort(x, dim=0, descending=True), x.argsort(dim=2),
                torch.cummax(x, dim=1), torch.cummin(x, dim=-1),
                torch.diff(x, dim=-1), torch.diff(x, n=2, dim=2, prepend=x[:, :, :1],
                                                 append=x[:, :, -2:]))


def test_pnnx_export_of_any_all_sort_cummax_and_diff_matches_torch(pnnx_export):
    """NaN sorts as the largest value, ties keep their order, a NaN stays the running max,
    a tie moves cummax's index to the later position: all as torch."""
    check_export(pnnx_export, OrderAndCount(), [edgy(2, 3, 4, 5)], "order_and_count",
                 ["aten::any", "aten::all", "aten::count_nonzero", "aten::sort", "aten::argsort",
                  "aten::cummax", "aten::cummin", "aten::diff"])


@pytest.mark.parametrize("descending", [False, True])
def test_sort_of_ints_and_bools(descending):
    for x in (np.array([[3, -1, 3, 0, 7]], np.int64), np.array([[True, False, True]])):
        values, indices = make_layer("aten::sort").forward([x, np.array(1), np.array(descending)])
        want = torch.sort(torch.from_numpy(x), dim=1, descending=descending, stable=True)
        np.testing.assert_array_equal(values, want.values.numpy())
        np.testing.assert_array_equal(indices, want.indices.numpy())


def test_dim_arguments_are_checked_against_the_rank():
    with pytest.raises(ShapeError, match="dim 4"):
        make_layer("aten::cummax").infer_shapes_from([SHAPE, ()], [None, np.array(4)])
    with pytest.raises(ShapeError, match="needs its dim"):
        make_layer("aten::cummax").infer_shapes([SHAPE])
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        make_layer("aten::diff").infer_shapes([SHAPE, (), ()])
    with pytest.raises(ShapeError, match="n must be"):
        make_layer("aten::diff").infer_shapes_from([SHAPE, (), ()],
                                                   [None, np.array(-1), np.array(0)])
