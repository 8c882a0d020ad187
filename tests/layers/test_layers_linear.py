"""nn.Linear and F.linear on 1-D to 4-D inputs, and torch.matmul (every broadcasting case,
1-D operands), mm, mv, bmm, addmm / baddbmm (beta, alpha) and einsum against torch; pnnx
exports of them run by RuntimeGraph."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, torch_module
from layers import LayerRegisterer
from layers.linear import AddMM, BMM, MM, MV, Einsum, FunctionalLinear, Linear, MatMul
from parser.errors import LayerError, ShapeError
from test_layers_convolution import check_exported


@pytest.mark.parametrize("shape", [(6,), (2, 6), (2, 3, 6), (2, 3, 4, 6)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(shape, bias):
    params = dict(in_features=6, out_features=5, bias=bias)
    linear, weights = torch_module(nn.Linear, **params)
    check_layer("nn.Linear", linear, [shape], params, weights)


@pytest.mark.parametrize("bias", [True, False])
def test_functional_linear_takes_weights_as_inputs(bias):
    _, weights = torch_module(nn.Linear, in_features=6, out_features=5, bias=bias)
    inputs = [(2, 3, 6), weights["weight"]] + ([weights["bias"]] if bias else [])
    check_layer("F.linear", F.linear, inputs, {} if bias else {"bias": None})


def test_classifier_sized_linear_matches_torch():
    params = dict(in_features=1280, out_features=1000, bias=True)
    linear, weights = torch_module(nn.Linear, **params)
    check_layer("nn.Linear", linear, [(2, 1280)], params, weights)


def test_wrong_feature_count_is_a_shape_error():
    params = dict(in_features=6, out_features=5, bias=True)
    layer = make_layer("nn.Linear", params, torch_module(nn.Linear, **params)[1])
    with pytest.raises(ShapeError, match="7 features"):
        layer.infer_shapes([(2, 7)])
    with pytest.raises(ShapeError, match="expects 2 or 3 inputs"):
        make_layer("F.linear").infer_shapes([(2, 6)])
    with pytest.raises(ShapeError, match="bias"):
        make_layer("F.linear").infer_shapes([(2, 6), (5, 6), (6,)])


@pytest.mark.parametrize("params, weights", [
    (dict(in_features=6, out_features=5, bias=True), {"weight": np.zeros((5, 6))}),
    (dict(in_features=6, out_features=5, bias=False),
     {"weight": np.zeros((5, 6)), "bias": np.zeros(5)}),
    (dict(in_features=6, out_features=5, bias=False), {"weight": np.zeros((6, 5))}),
    (dict(in_features=0, out_features=5, bias=False), {"weight": np.zeros((5, 0))}),
], ids=["missing bias", "unexpected bias", "transposed weight", "zero features"])
def test_bad_weights_or_params_are_layer_errors(params, weights):
    with pytest.raises(LayerError):
        make_layer("nn.Linear", params, weights)


# ----- products of two operands ----------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 1, 4, 2)), ((2, 3, 0), (0, 4)), ((0, 3, 4), (4, 2)),
]


@pytest.mark.parametrize("a, b", MATMUL_SHAPES, ids=str)
def test_matmul_matches_torch(a, b):
    check_layer("torch.matmul", torch.matmul, [a, b])


def test_mm_mv_bmm_match_torch():
    check_layer("torch.mm", torch.mm, [(3, 4), (4, 5)])
    check_layer("torch.mv", torch.mv, [(3, 4), (4,)])
    check_layer("torch.bmm", torch.bmm, [(2, 3, 4), (2, 4, 5)])


@pytest.mark.parametrize("type_name, a, b", [
    ("torch.matmul", (3, 4), (5, 6)), ("torch.matmul", (2, 3, 4), (3, 4, 5)),
    ("torch.matmul", (), (3,)), ("torch.mm", (2, 3, 4), (4, 5)), ("torch.mv", (3, 4), (4, 1)),
    ("torch.bmm", (2, 3, 4), (3, 4, 5)), ("torch.bmm", (3, 4), (4, 5)),
], ids=str)
def test_product_shape_errors(type_name, a, b):
    with pytest.raises(ShapeError):
        make_layer(type_name).infer_shapes([a, b])


@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2.0), (0.0, 1.5), (2.0, 0.0), (-1, 1)])
@pytest.mark.parametrize("bias_shape", [(3, 5), (5,), (1, 5), (3, 1), ()], ids=str)
def test_addmm_matches_torch(beta, alpha, bias_shape):
    params = {"beta": beta, "alpha": alpha}                  # pnnx: alpha=1 beta=1 (ints)
    check_layer("torch.addmm", lambda c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha),
                [bias_shape, (3, 4), (4, 5)], params)


def test_addmm_with_beta_0_ignores_nan_input():
    c = np.full((3, 5), np.nan, dtype=np.float32)
    check_layer("torch.addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0), [c, (3, 4), (4, 5)],
                {"beta": 0.0, "alpha": 1.0})


@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2.0), (0.0, -1.0)])
@pytest.mark.parametrize("bias_shape", [(2, 3, 5), (3, 5), (2, 1, 5), (1,)], ids=str)
def test_baddbmm_matches_torch(beta, alpha, bias_shape):
    check_layer("torch.baddbmm",
                lambda c, a, b: torch.baddbmm(c, a, b, beta=beta, alpha=alpha),
                [bias_shape, (2, 3, 4), (2, 4, 5)], {"beta": beta, "alpha": alpha})


def test_addmm_errors():
    with pytest.raises(ShapeError, match="broadcast"):
        make_layer("torch.addmm").infer_shapes([(4, 5), (3, 4), (4, 5)])
    with pytest.raises(ShapeError, match="2-D"):
        make_layer("torch.addmm").infer_shapes([(3, 5), (2, 3, 4), (2, 4, 5)])
    with pytest.raises(ShapeError, match="3 inputs"):
        make_layer("torch.addmm").infer_shapes([(3, 4), (4, 5)])
    baddbmm = LayerRegisterer().create("torch.baddbmm")
    baddbmm.load_param({})
    with pytest.raises(ShapeError, match="3-D"):
        baddbmm.infer_shapes([(3, 5), (3, 4), (4, 5)])
    with pytest.raises(ShapeError, match="batch"):
        baddbmm.infer_shapes([(3, 5), (2, 3, 4), (3, 4, 5)])
    with pytest.raises(LayerError):
        make_layer("torch.addmm", {"beta": "one"})


@pytest.mark.parametrize("equation, shapes", [
    ("ijl,ilk->ijk", [(2, 3, 5), (2, 5, 4)]),                  # as pnnx writes bij,bjk->bik
    ("bij,bjk->bik", [(3, 1, 4), (1, 4, 5)]),                  # size-1 dims broadcast
    ("...ij,kj", [(2, 3, 5), (4, 5)]), ("ij,jk", [(2, 3), (3, 4)]), ("ii", [(3, 3)]),
    ("ii->i", [(3, 3)]), ("i,j->ij", [(3,), (4,)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("...i,...i->...", [(2, 1, 3), (4, 3)]), ("ba,ca", [(2, 3), (4, 3)]), ("ij->ji", [(2, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("Ab,bc", [(2, 3), (3, 4)]),
], ids=str)
def test_einsum_matches_torch(equation, shapes):
    check_layer("torch.einsum", lambda *xs: torch.einsum(equation, *xs), shapes,
                {"equation": equation})


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (4, 5)]), ("ij,jk->ik", [(2, 3)]), ("ijk", [(2, 3)]),
    ("...ij->ij", [(2,)]), ("ij->k", [(2, 3)]), ("...i,...i", [(2, 3), (4, 3)]),
], ids=str)
def test_einsum_shape_errors(equation, shapes):
    with pytest.raises(ShapeError):
        make_layer("torch.einsum", {"equation": equation}).infer_shapes(shapes)


def test_einsum_bad_equation_is_a_layer_error():
    with pytest.raises(LayerError, match="letters"):
        make_layer("torch.einsum", {"equation": "i1,1j->ij"})


class Products(nn.Module):
    """The products pnnx writes as their own operators. (A matmul by a constant becomes an
    nn.Linear, as does F.linear with a constant weight.)"""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 4)
        self.weight = nn.Parameter(torch.randn(5, 4))

    def forward(self, x, y, v, c, m, n, w, q):
        # x (N, 3, 5), y (N, 5, 4), v (5,), c (3, 4), m (3, 5), n (5, 4), w (4, 5), q (2, N, 3, 5)
        a = torch.matmul(x, y) + torch.matmul(x, self.weight)      # (N, 3, 4)
        b = x @ v                                                  # (N, 3)
        d = torch.bmm(x, y) + torch.baddbmm(c, x, y, beta=0.5, alpha=2.0)
        e = torch.addmm(c, m, n, beta=2.0, alpha=0.5) + torch.mm(m, n)
        f = torch.einsum("bij,bjk->bik", x, y) + torch.einsum("...ij,jk", q, n)
        g = self.linear(q) + F.linear(q, w * 2.0)                  # (2, N, 3, 4)
        return a, b, d, e, f, torch.mv(m, v * 1.0), g, v @ y, torch.matmul(q, n)


def test_pnnx_export_of_products(tmp_path):
    shapes = [(2, 3, 5), (2, 5, 4), (5,), (3, 4), (3, 5), (5, 4), (4, 5), (2, 2, 3, 5)]
    other = [(4, 3, 5), (4, 5, 4), (5,), (3, 4), (3, 5), (5, 4), (4, 5), (2, 4, 3, 5)]
    check_exported(tmp_path, Products(), "products",
                   ["torch.matmul", "torch.bmm", "torch.baddbmm", "torch.addmm", "torch.einsum",
                    "torch.mm", "torch.mv", "nn.Linear", "F.linear"], shapes, other)


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.Linear", Linear), ("F.linear", FunctionalLinear), ("torch.matmul", MatMul),
    ("torch.mm", MM), ("torch.mv", MV), ("torch.bmm", BMM), ("torch.addmm", AddMM),
    ("torch.baddbmm", AddMM), ("torch.einsum", Einsum)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
