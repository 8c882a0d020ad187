"""Normalization against torch: batch norm (running and batch statistics), layer norm, group
norm, instance norm, F.normalize, in their module and functional forms; and what pnnx writes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer, rand, torch_module
from layers import LayerRegisterer
from layers import normalization as norm
from layers.normalization import BatchNorm1d, BatchNorm2d
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batch_norm2d_matches_torch(affine, eps):
    params = dict(num_features=4, eps=eps, affine=affine)
    bn, weights = torch_module(nn.BatchNorm2d, **params)
    assert ("weight" in weights) == affine
    check_layer("nn.BatchNorm2d", bn, [(2, 4, 5, 6)], params, weights)


@pytest.mark.parametrize("shape", [(3, 4), (3, 4, 7)], ids=str)
def test_batch_norm1d_matches_torch(shape):
    params = dict(num_features=4, eps=1e-5, affine=True)
    bn, weights = torch_module(nn.BatchNorm1d, **params)
    check_layer("nn.BatchNorm1d", bn, [shape], params, weights)


def test_batch_norm_errors():
    params = dict(num_features=4, eps=1e-5, affine=True)
    _, weights = torch_module(nn.BatchNorm2d, **params)
    layer = make_layer("nn.BatchNorm2d", params, weights)
    with pytest.raises(ShapeError, match="3 channels"):
        layer.infer_shapes([(2, 3, 5, 5)])
    with pytest.raises(ShapeError, match="4-D"):
        layer.infer_shapes([(2, 4)])
    with pytest.raises(LayerError, match="affine"):
        stats_only = {key: weights[key] for key in ("running_mean", "running_var")}
        make_layer("nn.BatchNorm2d", params, stats_only)
    with pytest.raises(LayerError, match="running_var"):
        make_layer("nn.BatchNorm2d", params, {**weights, "running_var": np.ones(5)})


@pytest.mark.parametrize("type_name, layer_class", [
    ("nn.BatchNorm2d", BatchNorm2d), ("nn.BatchNorm1d", BatchNorm1d),
    ("F.batch_norm", norm.FunctionalBatchNorm), ("nn.LayerNorm", norm.LayerNorm),
    ("F.layer_norm", norm.FunctionalLayerNorm), ("nn.GroupNorm", norm.GroupNorm),
    ("F.group_norm", norm.FunctionalGroupNorm), ("nn.InstanceNorm1d", norm.InstanceNorm1d),
    ("nn.InstanceNorm2d", norm.InstanceNorm2d), ("F.instance_norm", norm.FunctionalInstanceNorm),
    ("aten::instance_norm", norm.AtenInstanceNorm), ("F.normalize", norm.Normalize)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


def channel_stats(channels: int = 4):
    """Running statistics and affine weights for ``channels`` channels, as numpy arrays."""
    rng = np.random.default_rng(3)
    return {"running_mean": rng.standard_normal(channels).astype(np.float32),
            "running_var": rng.uniform(0.5, 2, channels).astype(np.float32),
            "weight": rng.standard_normal(channels).astype(np.float32),
            "bias": rng.standard_normal(channels).astype(np.float32)}


# ----- F.batch_norm -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 4), (2, 4, 7), (2, 4, 5, 6)], ids=str)
@pytest.mark.parametrize("given", [("running_mean", "running_var"),
                                   ("running_mean", "running_var", "weight"),
                                   ("running_mean", "running_var", "weight", "bias"),
                                   ("weight", "bias"), ("bias",), ()], ids=str)
def test_functional_batch_norm_matches_torch(shape, given):
    """pnnx writes each absent tensor argument as name=None, the others as inputs in torch's
    order. Without running statistics, torch uses the batch's own (training=True)."""
    stats = channel_stats()
    names = ("running_mean", "running_var", "weight", "bias")
    params = {name: None for name in names if name not in given} | {"eps": 1e-3}
    arrays = [stats[name] for name in names if name in given]
    training = "running_mean" not in given

    def torch_fn(x, *tensors):
        kwargs = dict(zip(given, tensors))
        return F.batch_norm(x, kwargs.get("running_mean"), kwargs.get("running_var"),
                            kwargs.get("weight"), kwargs.get("bias"), training=training,
                            eps=1e-3)

    check_layer("F.batch_norm", torch_fn, [shape, *arrays], params, atol=1e-4)


def test_functional_batch_norm_errors():
    with pytest.raises(LayerError, match="both"):
        make_layer("F.batch_norm", {"running_mean": None, "weight": None, "bias": None})
    layer = make_layer("F.batch_norm", {"weight": None, "bias": None})
    with pytest.raises(ShapeError, match="3 input"):
        layer.infer_shapes([(2, 4, 5)])
    with pytest.raises(ShapeError, match="running_var has shape"):
        layer.infer_shapes([(2, 4, 5), (4,), (3,)])
    with pytest.raises(LayerError, match="only None"):
        make_layer("F.batch_norm", {"weight": 1.0})


# ----- layer norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("normalized_shape, shape", [
    ((5,), (2, 3, 4, 5)), ((4, 5), (2, 3, 4, 5)), ((3, 4, 5), (2, 3, 4, 5)), ((7,), (7,)),
    ((6,), (2, 9, 6))], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_torch(normalized_shape, shape, affine):
    params = dict(normalized_shape=normalized_shape, eps=1e-5, elementwise_affine=affine)
    module, weights = torch_module(nn.LayerNorm, **params)
    with torch.no_grad():
        for tensor in module.parameters():
            tensor.normal_()
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    check_layer("nn.LayerNorm", module, [shape], params, weights)
    tensors = [weights["weight"], weights["bias"]] if affine else []
    f_params = {"normalized_shape": normalized_shape, "eps": 1e-3} | (
        {} if affine else {"weight": None, "bias": None})
    check_layer("F.layer_norm", lambda x, *wb: F.layer_norm(x, normalized_shape, *wb, eps=1e-3),
                [shape, *tensors], f_params)


def test_layer_norm_weight_only():
    """F.layer_norm(x, shape, weight): pnnx writes bias=None and the weight as an input."""
    weight = rand(4, 5)
    check_layer("F.layer_norm", lambda x, w: F.layer_norm(x, (4, 5), w), [(2, 3, 4, 5), weight],
                {"normalized_shape": (4, 5), "bias": None})


def test_layer_norm_errors():
    layer = make_layer("nn.LayerNorm", {"normalized_shape": (4, 5), "elementwise_affine": False})
    with pytest.raises(ShapeError, match="does not end with"):
        layer.infer_shapes([(2, 5, 4)])
    with pytest.raises(ShapeError, match="does not end with"):
        layer.infer_shapes([(5,)])
    with pytest.raises(LayerError, match="weight"):
        make_layer("nn.LayerNorm", {"normalized_shape": 5}, {"weight": np.ones(4),
                                                            "bias": np.ones(4)})
    with pytest.raises(ShapeError, match="weight"):
        make_layer("F.layer_norm", {"normalized_shape": 5, "bias": None}).infer_shapes(
            [(2, 5), (4,)])


# ----- group norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("groups, channels, shape", [
    (3, 6, (2, 6, 4, 5)), (1, 4, (2, 4, 3, 3)), (4, 4, (2, 4, 7)), (2, 4, (3, 4)),
    (2, 6, (2, 6, 2, 3, 2))], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(groups, channels, shape, affine):
    params = dict(num_groups=groups, num_channels=channels, eps=1e-5, affine=affine)
    module, weights = torch_module(nn.GroupNorm, **params)
    with torch.no_grad():
        for tensor in module.parameters():
            tensor.normal_()
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    check_layer("nn.GroupNorm", module, [shape], params, weights)
    tensors = [weights["weight"], weights["bias"]] if affine else []
    f_params = {"num_groups": groups, "eps": 1e-4} | ({} if affine else {"weight": None,
                                                                         "bias": None})
    check_layer("F.group_norm", lambda x, *wb: F.group_norm(x, groups, *wb, eps=1e-4),
                [shape, *tensors], f_params)


def test_group_norm_errors():
    with pytest.raises(LayerError, match="divisible"):
        make_layer("nn.GroupNorm", {"num_groups": 4, "num_channels": 6, "affine": False})
    layer = make_layer("nn.GroupNorm", {"num_groups": 2, "num_channels": 4, "affine": False})
    with pytest.raises(ShapeError, match="6 channels"):
        layer.infer_shapes([(2, 6, 3)])
    functional = make_layer("F.group_norm", {"num_groups": 4, "weight": None, "bias": None})
    with pytest.raises(ShapeError, match="groups"):
        functional.infer_shapes([(2, 6, 3)])


# ----- instance norm ----------------------------------------------------------------------------

@pytest.mark.parametrize("module_class, shape", [
    (nn.InstanceNorm1d, (2, 4, 7)), (nn.InstanceNorm1d, (4, 7)),
    (nn.InstanceNorm2d, (2, 4, 5, 6)), (nn.InstanceNorm2d, (4, 5, 6))], ids=str)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [False, True])
def test_instance_norm_matches_torch(module_class, shape, affine, track):
    params = dict(num_features=4, eps=1e-5, affine=affine, track_running_stats=track)
    module, weights = torch_module(module_class, **params)
    with torch.no_grad():
        for tensor in module.parameters():
            tensor.normal_()
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()
               if v.is_floating_point()}
    check_layer(f"nn.{module_class.__name__}", module, [shape], params, weights, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 4, 7), (2, 4, 5, 6), (1, 4, 2, 3, 3)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_functional_instance_norm_matches_torch(shape, affine):
    stats = channel_stats()
    tensors = [stats["weight"], stats["bias"]] if affine else []
    params = {"running_mean": None, "running_var": None, "eps": 1e-5} | (
        {} if affine else {"weight": None, "bias": None})
    check_layer("F.instance_norm",
                lambda x, *wb: F.instance_norm(x, None, None, *(wb or (None, None))),
                [shape, *tensors], params, atol=1e-4)


@pytest.mark.parametrize("use_input_stats", [True, False])
def test_aten_instance_norm_takes_every_argument_as_an_input(use_input_stats):
    stats = channel_stats()
    none = np.array(None)
    inputs = [(2, 4, 5, 6), stats["weight"], none, stats["running_mean"], stats["running_var"],
              np.array(use_input_stats), np.float32(0.1), np.float32(1e-5), np.array(True)]
    layer = make_layer("aten::instance_norm")
    x = rand(2, 4, 5, 6)
    [y] = layer.forward([x, *inputs[1:]])
    expected = F.instance_norm(torch.from_numpy(x), torch.from_numpy(stats["running_mean"]),
                               torch.from_numpy(stats["running_var"]),
                               torch.from_numpy(stats["weight"]), None, use_input_stats,
                               eps=1e-5)
    np.testing.assert_allclose(y, expected.numpy(), atol=1e-4)
    assert layer.infer_shapes([np.shape(a) if not isinstance(a, tuple) else a
                               for a in inputs]) == [(2, 4, 5, 6)]
    with pytest.raises(ShapeError, match="9 inputs"):
        layer.infer_shapes([(2, 4, 5)])


# ----- F.normalize ------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.5, float("inf"), float("-inf"), 0.0])
@pytest.mark.parametrize("dim", [1, 0, -1, 3])
def test_normalize_matches_torch(p, dim):
    params = {"p": p, "dim": dim, "eps": 1e-12}
    check_layer("F.normalize", lambda t: F.normalize(t, p, dim), [(2, 3, 4, 5)], params)


def test_normalize_eps_and_zero_vectors():
    x = np.zeros((2, 3), np.float32)
    x[1] = [1e-4, -2e-4, 0]
    check_layer("F.normalize", lambda t: F.normalize(t, 2.0, 1, 1e-3), [x],
                {"p": 2.0, "dim": 1, "eps": 1e-3})
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("F.normalize", {"dim": 2}).infer_shapes([(2, 3)])


# ----- what pnnx writes -------------------------------------------------------------------------

class Norms(nn.Module):
    """The module forms pnnx keeps (no convolution in front of the batch norms)."""

    def __init__(self):
        super().__init__()
        self.bn1d, self.bn1d_2d, self.bn2d = nn.BatchNorm1d(3), nn.BatchNorm1d(3), nn.BatchNorm2d(3)
        self.bn_stats_only = nn.BatchNorm2d(3, affine=False)
        self.ln, self.ln_plain = nn.LayerNorm([4, 5]), nn.LayerNorm(5, elementwise_affine=False)
        self.gn, self.gn1 = nn.GroupNorm(3, 3), nn.GroupNorm(1, 3)
        self.in2d, self.in2d_affine = nn.InstanceNorm2d(3), nn.InstanceNorm2d(3, affine=True)
        self.in2d_tracked = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
        self.in1d = nn.InstanceNorm1d(3, affine=True)
        for module in self.modules():
            if getattr(module, "running_var", None) is not None:
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
            if getattr(module, "weight", None) is not None:
                with torch.no_grad():
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-1, 1)

    def forward(self, x, y, z):
        return (self.bn1d(y), self.bn1d_2d(z), self.bn2d(x), self.bn_stats_only(x),
                self.ln(x), self.ln_plain(x), self.gn(x), self.gn1(x),
                self.in2d(x), self.in2d_affine(x), self.in2d_tracked(x), self.in1d(y))


class Functionals(nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.rand(3)), nn.Parameter(torch.rand(3))
        self.register_buffer("mean", torch.rand(3))
        self.register_buffer("var", torch.rand(3) + 0.5)
        self.lw = nn.Parameter(torch.rand(4, 5))

    def forward(self, x):
        return (F.batch_norm(x, self.mean, self.var, self.w, self.b),
                F.batch_norm(x, self.mean, self.var), F.batch_norm(x, None, None, training=True),
                F.layer_norm(x, [4, 5], self.lw), F.layer_norm(x, [5]), F.group_norm(x, 1),
                F.group_norm(x, 3, self.w * 2, self.b), F.instance_norm(x),
                F.instance_norm(x, weight=self.w, bias=self.b), F.normalize(x),
                F.normalize(x, p=1, dim=-1, eps=1e-3), F.normalize(x, 3.0, 0),
                F.normalize(x, float("inf"), 2))


def test_pnnx_export_of_modules(pnnx_export):
    """Submodules stay modules (a top-level nn.LayerNorm without affine would be written as
    F.layer_norm, an nn.InstanceNorm2d as F.instance_norm or aten::instance_norm)."""
    check_export(pnnx_export, Norms().eval(), [(2, 3, 4, 5), (2, 3, 6), (2, 3)],
                 "norm_modules", [
        "nn.BatchNorm1d", "nn.BatchNorm2d", "nn.LayerNorm", "nn.GroupNorm",
        "nn.InstanceNorm2d", "nn.InstanceNorm1d"], atol=1e-4)


class TrackedInstanceNorm(nn.Module):
    """At the top level, an nn.InstanceNorm2d with running statistics is written as
    aten::instance_norm, its flags and eps as pnnx.Expression constants (None among them)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
        self.norm.running_mean.uniform_(-1, 1)
        self.norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return F.instance_norm(x, self.norm.running_mean, self.norm.running_var,
                               self.norm.weight * 2, None, use_input_stats=False)


def test_pnnx_export_of_top_level_norms(pnnx_export):
    for module, name, types in [
            (nn.LayerNorm(5, elementwise_affine=False), "norm_ln_plain", ["F.layer_norm"]),
            (nn.InstanceNorm2d(3), "norm_in_plain", ["F.instance_norm"]),
            (nn.BatchNorm2d(3, affine=False), "norm_bn_stats_only", ["F.batch_norm"]),
            (TrackedInstanceNorm(), "norm_in_tracked", ["aten::instance_norm"])]:
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
        check_export(pnnx_export, module, [(2, 3, 4, 5)], name, types, atol=1e-4)


def test_pnnx_export_of_batch_norm_without_running_stats(pnnx_export):
    """Written as F.batch_norm with running_mean=None and the affine weights as inputs. (pnnx
    20261020 crashes on this module inside another one, so it is exported on its own.)"""
    module = nn.BatchNorm2d(3, track_running_stats=False)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-1, 1)
    check_export(pnnx_export, module, [(2, 3, 4, 5)], "norm_batch_stats", ["F.batch_norm"],
                 atol=1e-4)


def test_pnnx_export_of_functions(pnnx_export):
    check_export(pnnx_export, Functionals(), [(2, 3, 4, 5)], "norm_functions", [
        "nn.BatchNorm2d", "F.batch_norm", "F.layer_norm", "F.group_norm", "F.instance_norm",
        "nn.InstanceNorm2d", "F.normalize"], atol=1e-4)


# ----- RMS norm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("normalized_shape, eps, affine", [
    ((6,), None, True), ((5, 6), 1e-3, True), ((6,), 1e-6, False)], ids=str)
def test_rms_norm_matches_torch(normalized_shape, eps, affine):
    params = dict(normalized_shape=normalized_shape, eps=eps, elementwise_affine=affine)
    module, weights = torch_module(nn.RMSNorm, **params)
    if affine:
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
        weights = {"weight": module.weight.detach().numpy().copy()}
    check_layer("nn.RMSNorm", module, [(2, 3, 5, 6)], params, weights)


def test_functional_rms_norm_with_and_without_a_weight():
    weight = rand(4, 6)
    check_layer("F.rms_norm", lambda t, w: F.rms_norm(t, (4, 6), w, 1e-5),
                [(2, 4, 6), weight], {"normalized_shape": (4, 6), "eps": 1e-5})
    check_layer("F.rms_norm", lambda t: F.rms_norm(t, (6,)), [(2, 4, 6)],
                {"normalized_shape": (6,), "eps": None, "weight": None})


class RMSNorms(nn.Module):
    """pnnx folds F.rms_norm with a constant weight into nn.RMSNorm; a weight computed in the
    graph keeps it F.rms_norm."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(6)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x, w):
        return self.norm(x), F.rms_norm(x, (4, 6), w.abs() + 0.5, 1e-4), F.rms_norm(x, (6,))


def test_pnnx_export_of_rms_norms(pnnx_export):
    check_export(pnnx_export, RMSNorms(), [(2, 4, 6), (4, 6)], "rms_norms",
                 ["nn.RMSNorm", "F.rms_norm"])


class Cosine(torch.nn.Module):
    def forward(self, x, y):
        return (F.cosine_similarity(x, y), F.cosine_similarity(x, y[:1], dim=-1, eps=1e-3),
                F.cosine_similarity(x * 0, y, dim=2))


def test_pnnx_export_of_cosine_similarity_matches_torch(pnnx_export):
    """Broadcasting x2 against x1, another dim and eps, and an all-zero x1 (eps decides)."""
    check_export(pnnx_export, Cosine(), [(2, 3, 4, 5), (2, 3, 4, 5)], "cosine_similarity",
                 ["aten::cosine_similarity"])


class DistancesAndLRN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lrn3 = torch.nn.LocalResponseNorm(3, alpha=1e-2, beta=0.75, k=2.0)
        self.lrn4 = torch.nn.LocalResponseNorm(4)

    def forward(self, x, y):
        rows, other = x.flatten(2), y.flatten(2)
        return (self.lrn3(x), self.lrn4(x), self.lrn3(x.flatten(2)),
                torch.cdist(rows, other), torch.cdist(rows, other, p=1.0),
                torch.cdist(rows, other[:1], p=3.0), torch.cdist(rows, rows, p=0.0),
                torch.cdist(rows, other, p=float("inf")))


def test_pnnx_export_of_cdist_and_local_response_norm_matches_torch(pnnx_export):
    """cdist for p = 2, 1, 3 (a broadcast batch), 0 and inf; LRN with odd and even windows,
    on 4-D and 3-D inputs."""
    check_export(pnnx_export, DistancesAndLRN(), [(2, 5, 4, 3), (2, 6, 4, 3)],
                 "distances_and_lrn", ["aten::cdist", "nn.LocalResponseNorm"])


def test_cdist_refuses_mismatched_rows():
    with pytest.raises(ShapeError, match=r"\(\.\.\., P, M\)"):
        make_layer("aten::cdist").infer_shapes([(2, 4, 3), (2, 5, 7)])
