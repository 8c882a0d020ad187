"""Activations against torch, out of place and in place; softmax / log_softmax along every
dim; PReLU and torch.clamp with tensor arguments; and the pnnx export of each spelling."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer
from layers import LayerRegisterer
from layers import activation as act
from parser.errors import LayerError, ShapeError

# (pnnx type, params as pnnx writes them, torch function)
ELEMENTWISE = [
    ("nn.ReLU", {}, nn.ReLU()),
    ("F.relu", {}, F.relu),
    ("nn.ReLU6", {}, nn.ReLU6()),
    ("F.relu6", {}, F.relu6),
    ("nn.Hardtanh", {"min_val": -2.0, "max_val": 3.0}, nn.Hardtanh(-2.0, 3.0)),
    ("F.hardtanh", {}, F.hardtanh),
    ("nn.Sigmoid", {}, nn.Sigmoid()),
    ("F.sigmoid", {}, torch.sigmoid),
    ("nn.SiLU", {}, nn.SiLU()),
    ("F.silu", {}, F.silu),
    ("nn.Hardswish", {}, nn.Hardswish()),
    ("nn.Hardsigmoid", {}, nn.Hardsigmoid()),
    ("nn.Tanh", {}, nn.Tanh()),
    ("nn.LeakyReLU", {"negative_slope": 0.2}, nn.LeakyReLU(0.2)),
    ("F.leaky_relu", {}, F.leaky_relu),
    ("nn.ELU", {}, nn.ELU()),
    ("nn.ELU", {"alpha": 0.5}, nn.ELU(0.5)),
    ("F.elu", {"alpha": 2}, lambda t: F.elu(t, 2.0)),
    ("nn.SELU", {}, nn.SELU()),
    ("F.selu", {}, F.selu),
    ("nn.CELU", {"alpha": 0.7}, nn.CELU(0.7)),
    ("F.celu", {}, F.celu),
    ("nn.GELU", {}, nn.GELU()),
    ("nn.GELU", {"approximate": "tanh"}, nn.GELU("tanh")),
    ("F.gelu", {"approximate": "none"}, F.gelu),
    ("F.gelu", {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
    ("nn.Mish", {}, nn.Mish()),
    ("F.mish", {}, F.mish),
    ("nn.Softplus", {}, nn.Softplus()),
    ("nn.Softplus", {"beta": 2, "threshold": 5}, nn.Softplus(2, 5)),
    ("F.softplus", {"beta": 0.5, "threshold": 1.0}, lambda t: F.softplus(t, 0.5, 1.0)),
    ("F.softplus", {"beta": -1.0, "threshold": 20}, lambda t: F.softplus(t, -1.0, 20)),
    ("nn.Softsign", {}, nn.Softsign()),
    ("F.softsign", {}, F.softsign),
    ("nn.LogSigmoid", {}, nn.LogSigmoid()),
    ("F.logsigmoid", {}, F.logsigmoid),
    ("F.tanh", {}, torch.tanh),
    ("F.hardswish", {}, F.hardswish),
    ("F.hardsigmoid", {}, F.hardsigmoid),
    ("F.hardtanh", {"min_val": 0, "max_val": 0}, lambda t: F.hardtanh(t, 0.0, 0.0)),
    ("torch.clamp", {"min": 0.1, "max": None}, lambda t: torch.clamp(t, min=0.1)),
    ("torch.clamp", {"min": None, "max": -0.5}, lambda t: torch.clamp(t, max=-0.5)),
    ("torch.clamp", {"min": -1, "max": 2}, lambda t: torch.clamp(t, -1, 2)),
    ("torch.clamp", {"min": 1.0, "max": -1.0}, lambda t: torch.clamp(t, 1.0, -1.0)),
    ("F.threshold", {"threshold": 0.1, "value": 20}, lambda t: F.threshold(t, 0.1, 20)),
    ("nn.Threshold", {"threshold": -1, "value": -2.5}, nn.Threshold(-1, -2.5)),
    ("F.hardshrink", {"lambd": 0.3}, lambda t: F.hardshrink(t, 0.3)),
    ("nn.Hardshrink", {}, nn.Hardshrink()),
    ("F.softshrink", {"lambd": 0.3}, lambda t: F.softshrink(t, 0.3)),
    ("nn.Softshrink", {}, nn.Softshrink()),
    ("F.tanhshrink", {}, F.tanhshrink),
    ("F.rrelu", {"lower": 0.125, "upper": 0.333333343}, nn.RReLU().eval()),
    ("nn.RReLU", {"lower": 0.1, "upper": 0.3}, nn.RReLU(0.1, 0.3).eval()),
]


@pytest.mark.parametrize("type_name, params, torch_fn", ELEMENTWISE,
                         ids=[case[0] for case in ELEMENTWISE])
def test_elementwise_matches_torch(type_name, params, torch_fn):
    x = np.concatenate([np.linspace(-8, 8, 161, dtype=np.float32),     # every kink and edge
                        np.array([-100, -90, 90, 100], np.float32)])    # exp overflow range
    check_layer(type_name, torch_fn, [x], params)
    check_layer(type_name, torch_fn, [(2, 3, 4, 5)], params)


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -3])
def test_softmax_matches_torch(dim):
    check_layer("nn.Softmax", nn.Softmax(dim), [(2, 3, 4, 5)], {"dim": dim})


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -2, -4])
@pytest.mark.parametrize("type_name", ["nn.LogSoftmax", "F.log_softmax"])
def test_log_softmax_matches_torch(type_name, dim):
    check_layer(type_name, lambda t: F.log_softmax(t, dim), [(2, 3, 4, 5)], {"dim": dim})
    x = np.array([[1000.0, 1001.0, -1000.0], [-1e4, 0.0, 1e4]], np.float32)  # no overflow
    check_layer(type_name, lambda t: F.log_softmax(t, -1), [x], {"dim": -1})


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3), (2, 3, 7), (2, 3, 2, 2, 2)], ids=str)
@pytest.mark.parametrize("num_parameters", [1, 3])
def test_prelu_matches_torch(shape, num_parameters):
    params = {"num_parameters": num_parameters}
    module = nn.PReLU(num_parameters, init=0.1).eval()
    with torch.no_grad():
        module.weight.uniform_(-1, 1)
    weights = {"weight": module.weight.detach().numpy().copy()}
    check_layer("nn.PReLU", module, [shape], params, weights)
    check_layer("F.prelu", F.prelu, [shape, weights["weight"]])


def test_prelu_of_rank_below_two_has_one_channel():
    check_layer("F.prelu", F.prelu, [(6,), np.float32([0.3])])
    with pytest.raises(ShapeError, match="1 channel"):
        make_layer("nn.PReLU", {"num_parameters": 3}, {"weight": np.ones(3)}).infer_shapes([(3,)])
    with pytest.raises(ShapeError, match="expected 1 or 4"):
        make_layer("nn.PReLU", {"num_parameters": 3}, {"weight": np.ones(3)}).infer_shapes(
            [(2, 4, 5)])
    with pytest.raises(LayerError, match="weight"):
        make_layer("nn.PReLU", {"num_parameters": 3}, {"weight": np.ones(4)})


@pytest.mark.parametrize("bounds, torch_fn", [
    ({"max": None}, lambda x, low: torch.clamp(x, min=low)),
    ({"min": None}, lambda x, high: torch.clamp(x, max=high)),
    ({}, lambda x, low, high: torch.clamp(x, low, high)),
], ids=["min", "max", "both"])
def test_clamp_with_tensor_bounds_matches_torch(bounds, torch_fn):
    count = 3 - len(bounds)
    shapes = [(2, 3, 4), (3, 1), (4,)][:count]
    check_layer("torch.clamp", torch_fn, shapes, bounds)


def test_clamp_keeps_torch_dtypes():
    ints = np.arange(-5, 5).reshape(2, 5)
    check_layer("torch.clamp", lambda t: torch.clamp(t, -2, 3), [ints], {"min": -2, "max": 3})
    check_layer("torch.clamp", lambda t: torch.clamp(t, min=0.5), [ints], {"min": 0.5,
                                                                          "max": None})
    with pytest.raises(LayerError, match="both are None"):
        make_layer("torch.clamp", {"min": None, "max": None})
    with pytest.raises(ShapeError, match="2 input"):
        make_layer("torch.clamp", {"max": None}).infer_shapes([(2, 3)])


@pytest.mark.parametrize("type_name, torch_fn", [
    ("aten::clamp_min", torch.clamp_min), ("aten::clamp_max", torch.clamp_max)])
def test_clamp_min_and_max_take_the_bound_as_an_input(type_name, torch_fn):
    check_layer(type_name, torch_fn, [(2, 3, 4), np.array(0.25, np.float32)])
    check_layer(type_name, torch_fn, [(2, 3, 4), (3, 4)])
    with pytest.raises(ShapeError, match="do not broadcast"):
        make_layer(type_name).infer_shapes([(2, 3), (4, 3)])
    with pytest.raises(ShapeError, match="does not broadcast"):
        make_layer(type_name).infer_shapes([(3,), (2, 3)])


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]], np.float32)
    check_layer("F.softmax", lambda t: F.softmax(t, dim=1), [x], {"dim": 1})


@pytest.mark.parametrize("shape, implicit_dim", [((5,), 0), ((2, 5), 1), ((2, 3, 4), 0),
                                                 ((2, 3, 4, 5), 1)], ids=str)
def test_softmax_without_dim_uses_torch_legacy_rule(shape, implicit_dim):
    check_layer("nn.Softmax", lambda t: F.softmax(t, implicit_dim), [shape], {})


def test_softmax_dim_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("F.softmax", {"dim": 2}).infer_shapes([(2, 3)])


@pytest.mark.parametrize("type_name, params", [
    ("nn.Hardtanh", {"min_val": 1.0, "max_val": -1.0}),
    ("nn.GELU", {"approximate": "erf"}),
    ("nn.ELU", {"alpha": "1"}),
    ("nn.CELU", {"alpha": 0}),
    ("nn.Softplus", {"beta": 0}),
    ("torch.clamp", {"min": "0", "max": None}),
    ("torch.clamp", {"min": True, "max": None}),
    ("nn.LeakyReLU", {"negative_slope": "0.1"}),
    ("nn.Softmax", {"dim": 1.5}),
], ids=str)
def test_bad_params_are_layer_errors(type_name, params):
    with pytest.raises(LayerError):
        make_layer(type_name, params)


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.ReLU", act.ReLU), ("F.relu", act.ReLU), ("nn.ReLU6", act.ReLU6), ("F.relu6", act.ReLU6),
    ("nn.Hardtanh", act.Hardtanh), ("F.hardtanh", act.Hardtanh),
    ("nn.Sigmoid", act.Sigmoid), ("F.sigmoid", act.Sigmoid), ("torch.sigmoid", act.Sigmoid),
    ("nn.Softmax", act.Softmax), ("F.softmax", act.Softmax), ("torch.softmax", act.Softmax),
    ("nn.SiLU", act.SiLU), ("F.silu", act.SiLU), ("nn.Hardswish", act.Hardswish),
    ("F.hardswish", act.Hardswish), ("nn.Hardsigmoid", act.Hardsigmoid),
    ("F.hardsigmoid", act.Hardsigmoid), ("nn.Tanh", act.Tanh), ("F.tanh", act.Tanh),
    ("nn.LeakyReLU", act.LeakyReLU), ("F.leaky_relu", act.LeakyReLU),
    ("nn.PReLU", act.PReLU), ("F.prelu", act.PReLU), ("nn.ELU", act.ELU), ("F.elu", act.ELU),
    ("nn.SELU", act.SELU), ("F.selu", act.SELU), ("nn.CELU", act.CELU), ("F.celu", act.CELU),
    ("nn.GELU", act.GELU), ("F.gelu", act.GELU), ("nn.Mish", act.Mish), ("F.mish", act.Mish),
    ("nn.Softplus", act.Softplus), ("F.softplus", act.Softplus),
    ("nn.Softsign", act.Softsign), ("F.softsign", act.Softsign),
    ("nn.LogSigmoid", act.LogSigmoid), ("F.logsigmoid", act.LogSigmoid),
    ("nn.LogSoftmax", act.LogSoftmax), ("F.log_softmax", act.LogSoftmax),
    ("torch.clamp", act.Clamp), ("aten::clamp_min", act.ClampBound),
    ("aten::clamp_max", act.ClampBound)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


# ----- what pnnx writes -------------------------------------------------------------------------

class Modules(nn.Module):
    """Every activation module, with parameters off their defaults."""

    def __init__(self):
        super().__init__()
        self.acts = nn.ModuleList([
            nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.2), nn.PReLU(3), nn.PReLU(), nn.ELU(0.5),
            nn.SELU(), nn.CELU(0.7), nn.GELU(), nn.GELU("tanh"), nn.SiLU(), nn.Mish(),
            nn.Sigmoid(), nn.Tanh(), nn.Hardswish(), nn.Hardsigmoid(), nn.Hardtanh(-2, 3),
            nn.Softplus(2, 1), nn.Softsign(), nn.LogSigmoid(), nn.Softmax(-1),
            nn.LogSoftmax(1)])
        with torch.no_grad():
            self.acts[3].weight.uniform_(-1, 1)

    def forward(self, x):
        return tuple(act(x) for act in self.acts)


class Functions(nn.Module):
    """The functional and Tensor spellings."""

    def __init__(self):
        super().__init__()
        self.slopes = nn.Parameter(torch.rand(3) - 0.5)

    def forward(self, x, y):
        return (F.relu(x), torch.relu(x), x.relu(), F.relu6(x), F.leaky_relu(x, 0.3),
                F.prelu(x, self.slopes), F.prelu(x, y.mean((0, 2, 3))), F.elu(x, 0.4),
                F.selu(x), F.celu(x, 0.6), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x),
                F.mish(x), torch.sigmoid(x), x.sigmoid(), torch.tanh(x), F.hardswish(x),
                F.hardsigmoid(x), F.hardtanh(x, -0.5, 0.5), F.softplus(x, 2, 5),
                F.softsign(x), F.logsigmoid(x), F.softmax(x, 1), torch.softmax(x, -2),
                x.softmax(0), F.log_softmax(x, -1), torch.log_softmax(x, 2),
                x.log_softmax(-3))


class Clamps(nn.Module):
    def forward(self, x, y):
        return (torch.clamp(x, min=0.1), torch.clamp(x, max=0.2), x.clamp(-0.1, 0.3),
                torch.clip(x, -0.5, 0.5), x.clip(max=0.3), x.clamp_min(0.1), x.clamp_max(-0.1),
                torch.clamp(x, min=y), torch.clamp(x, max=y), torch.clamp(x, y - 1, y),
                torch.clamp_min(x, 0.2))


def test_pnnx_export_of_modules(pnnx_export):
    written = check_export(pnnx_export, Modules(), [(2, 3, 4, 5)], "act_modules", [
        "nn.ReLU", "nn.ReLU6", "nn.LeakyReLU", "nn.PReLU", "nn.ELU", "nn.SELU", "nn.CELU",
        "nn.GELU", "nn.SiLU", "nn.Mish", "nn.Sigmoid", "nn.Tanh", "nn.Hardswish",
        "nn.Hardsigmoid", "nn.Hardtanh", "nn.Softplus", "nn.Softsign", "nn.LogSigmoid",
        "nn.Softmax", "nn.LogSoftmax"])
    assert written.count("nn.LeakyReLU") == 2          # nn.PReLU() has a single weight


def test_pnnx_export_of_functions(pnnx_export):
    check_export(pnnx_export, Functions(), [(2, 3, 4, 5), (2, 3, 4, 5)], "act_functions", [
        "F.relu", "F.relu6", "F.leaky_relu", "nn.PReLU", "F.prelu", "F.elu", "F.selu",
        "F.celu", "F.gelu", "F.silu", "F.mish", "F.sigmoid", "F.tanh", "F.hardswish",
        "F.hardsigmoid", "F.hardtanh", "F.softplus", "F.softsign", "F.logsigmoid", "F.softmax",
        "F.log_softmax"])


def test_pnnx_export_of_clamps(pnnx_export):
    check_export(pnnx_export, Clamps(), [(2, 3, 4, 5), (3, 1, 5)], "act_clamps",
                 ["torch.clamp", "aten::clamp_min", "aten::clamp_max"])


@pytest.mark.parametrize("dim", [0, 1, -1, -3])
def test_softmin_matches_torch(dim):
    check_layer("F.softmin", nn.Softmin(dim), [(2, 3, 4, 6)], {"dim": dim})


@pytest.mark.parametrize("dim", [0, 1, 3, -1, -2])
def test_glu_halves_its_dim_as_torch(dim):
    check_layer("F.glu", nn.GLU(dim), [(2, 4, 6, 8)], {"dim": dim})


def test_glu_of_an_odd_dim_is_a_shape_error():
    with pytest.raises(ShapeError, match="even"):
        make_layer("F.glu", {"dim": 1}).infer_shapes([(2, 3, 4)])


class MoreActivations(nn.Module):
    """Activations beyond issue 3's list, which pnnx writes as F.* operators."""

    def forward(self, x):
        return (nn.Threshold(0.1, 20)(x), nn.Hardshrink(0.3)(x), nn.Softshrink(0.3)(x),
                nn.Tanhshrink()(x), nn.RReLU().eval()(x), nn.Softmin(1)(x), nn.GLU(1)(x),
                F.glu(x, -1))


def test_pnnx_export_of_more_activations(pnnx_export):
    check_export(pnnx_export, MoreActivations(), [(2, 6, 4, 8)], "act_more", [
        "F.threshold", "F.hardshrink", "F.softshrink", "F.tanhshrink", "F.rrelu", "F.softmin",
        "F.glu"])


@pytest.mark.parametrize("slope", [-0.5, 0.25], ids=["negative slope", "positive slope"])
def test_leaky_slopes_keep_torchs_signed_zeros(slope):
    """LeakyReLU, PReLU and RReLU (eval) keep x only where x > 0, as torch does: with a
    negative slope, 0.0 gives -0.0 and -0.0 gives 0.0; NaN stays NaN."""
    x = np.float32([[-0.0, 0.0, -1.5, 2.0, np.nan, -1e-45]])
    t = torch.from_numpy(x)
    cases = [("nn.LeakyReLU", {"negative_slope": slope}, [x], F.leaky_relu(t, slope)),
             ("F.prelu", {}, [x, np.float32([slope])], F.prelu(t, torch.tensor([slope]))),
             ("nn.RReLU", {"lower": slope, "upper": slope}, [x],
              F.rrelu(t, slope, slope, training=False))]
    for type_name, params, inputs, want in cases:
        got = make_layer(type_name, params).forward([a.copy() for a in inputs])[0]
        np.testing.assert_array_equal(got.view(np.int32), want.numpy().view(np.int32),
                                      err_msg=type_name)
