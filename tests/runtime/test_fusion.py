"""Operator fusion (infer/fusion.py): what folds, what must not, and that a fused graph computes
what the reference graph (``reference=True``, no fusion) and torch compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infer import RuntimeGraph
from layers.expression import affine_form
from parser.expression import parse_expression
from parser.errors import GraphError, LayerError, ShapeError
from support import write_pnnx

rng = np.random.default_rng(0)


def conv_line(name, src, dst, c_in=4, c_out=4, k=3, pad=1, stride=1, groups=1):
    return (f"nn.Conv2d {name} 1 1 {src} {dst} bias=True dilation=(1,1) groups={groups} "
            f"in_channels={c_in} kernel_size=({k},{k}) out_channels={c_out} "
            f"padding=({pad},{pad}) padding_mode=zeros stride=({stride},{stride}) "
            f"@bias=({c_out})f32 @weight=({c_out},{c_in // groups},{k},{k})f32")


def conv_weights(name, c_in=4, c_out=4, k=3, groups=1):
    return {f"{name}.weight": rng.standard_normal((c_out, c_in // groups, k, k)).astype(np.float32),
            f"{name}.bias": rng.standard_normal(c_out).astype(np.float32)}


def param_text(lines):
    """A .pnnx.param file: the magic, the operator and operand counts, the lines."""
    operands = set()
    for line in lines:
        tokens = line.split()
        operands.update(tokens[4:4 + int(tokens[2]) + int(tokens[3])])
    return "\n".join(["7767517", f"{len(lines)} {len(operands)}", *lines])


def graph_pair(tmp_path, lines, weights):
    """The same file built fused (default) and as the reference (no fusion)."""
    param, binary = write_pnnx(tmp_path, param_text(lines), weights)
    return RuntimeGraph(param, binary).build(), RuntimeGraph(param, binary, reference=True).build()


def torch_conv(x, weights, name, padding=1, groups=1):
    return F.conv2d(x, torch.from_numpy(weights[f"{name}.weight"]),
                    torch.from_numpy(weights[f"{name}.bias"]), 1, padding, 1, groups)


def test_pad_conv_add_relu_fold_into_one_operator(tmp_path):
    lines = ["pnnx.Input in0 0 1 a",
             conv_line("conv1", "a", "b"),
             "nn.ZeroPad2d pad 1 1 b c padding=(0,1,2,0)",
             conv_line("conv2", "c", "d", pad=0),
             "pnnx.Expression add 2 1 d e f expr=add(@0,@1)",
             "nn.ReLU relu 1 1 f g",
             "pnnx.Output out0 1 0 g"]
    # e: the residual; conv2 shrinks the 7x6 image padded to 9x7 to 7x5
    lines.insert(1, "pnnx.Input in1 0 1 e")
    weights = {**conv_weights("conv1"), **conv_weights("conv2")}
    fused, reference = graph_pair(tmp_path, lines, weights)

    assert [op.name for op in fused.operators if op.type == "nn.Conv2d"] == ["conv1", "conv2"]
    assert fused.operator("conv2").fused == ["pad", "add", "relu"]
    assert {"pad", "add", "relu"}.isdisjoint(op.name for op in fused.operators)
    assert {"c", "d", "f"}.isdisjoint(fused.operands)            # the folded intermediates
    assert len(reference.operators) == len(fused.operators) + 3
    assert all(not op.fused for op in reference.operators)

    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    r = rng.standard_normal((2, 4, 7, 5)).astype(np.float32)
    (got,) = fused.forward(x, r)
    (want,) = reference.forward(x, r)
    b = torch_conv(torch.from_numpy(x), weights, "conv1")
    d = torch_conv(F.pad(b, (0, 1, 2, 0)), weights, "conv2", padding=0)
    np.testing.assert_allclose(got, F.relu(d + torch.from_numpy(r)).numpy(), atol=1e-4)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert fused.infer_shapes((2, 4, 7, 6), (2, 4, 7, 5))["g"] == (2, 4, 7, 5)
    with pytest.raises(ShapeError, match="residual"):
        fused.forward(x, r[:, :, :6])


def test_nothing_folds_across_a_tensor_someone_else_reads(tmp_path):
    lines = ["pnnx.Input in0 0 1 a",
             conv_line("conv1", "a", "b"),
             "nn.ReLU relu1 1 1 b c",                  # b is also a graph output
             conv_line("conv2", "c", "d"),
             "nn.ReLU relu2 1 1 d e",                  # d is read twice
             "nn.Sigmoid sig 1 1 d f",
             conv_line("conv3", "e", "g"),
             "nn.Softmax soft 1 1 g h dim=1",          # not an activation the kernels know
             "pnnx.Output out0 3 0 b f h"]
    weights = {**conv_weights("conv1"), **conv_weights("conv2"), **conv_weights("conv3")}
    fused, reference = graph_pair(tmp_path, lines, weights)
    assert all(not op.fused for op in fused.operators)
    assert len(fused.operators) == len(reference.operators)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    for got, want in zip(fused.forward(x), reference.forward(x)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_residual_that_broadcasts_still_adds_like_torch(tmp_path):
    lines = ["pnnx.Input in0 0 1 a",
             "pnnx.Input in1 0 1 r",
             conv_line("conv", "a", "b"),
             "pnnx.Expression add 2 1 r b c expr=add(@0,@1)",
             "nn.Hardswish act 1 1 c d",
             "pnnx.Output out0 1 0 d"]
    weights = conv_weights("conv")
    fused, reference = graph_pair(tmp_path, lines, weights)
    assert fused.operator("conv").fused == ["add", "act"]
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    for r_shape in [(2, 4, 5, 5), (1, 4, 1, 1), (3, 2, 4, 5, 5)]:
        r = rng.standard_normal(r_shape).astype(np.float32)
        (got,) = fused.forward(x, r)
        (want,) = reference.forward(x, r)
        torch_want = F.hardswish(torch.from_numpy(r) + torch_conv(torch.from_numpy(x), weights,
                                                                  "conv"))
        assert got.shape == want.shape == tuple(torch_want.shape)
        np.testing.assert_allclose(got, torch_want.numpy(), atol=1e-4)
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_linear_takes_its_activation(tmp_path):
    lines = ["pnnx.Input in0 0 1 a",
             "nn.Linear fc 1 1 a b bias=True in_features=6 out_features=3 @bias=(3)f32 "
             "@weight=(3,6)f32",
             "nn.LeakyReLU act 1 1 b c negative_slope=0.1",
             "pnnx.Output out0 1 0 c"]
    weights = {"fc.weight": rng.standard_normal((3, 6)).astype(np.float32),
               "fc.bias": rng.standard_normal(3).astype(np.float32)}
    fused, reference = graph_pair(tmp_path, lines, weights)
    assert fused.operator("fc").fused == ["act"]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    want = F.leaky_relu(F.linear(torch.from_numpy(x), torch.from_numpy(weights["fc.weight"]),
                                 torch.from_numpy(weights["fc.bias"])), 0.1).numpy()
    np.testing.assert_allclose(fused.forward(x)[0], want, atol=1e-5)
    np.testing.assert_allclose(reference.forward(x)[0], want, atol=1e-5)


class Blocks(nn.Module):
    """Every activation the kernels fuse, after regular, depthwise and residual convolutions."""

    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.stem = nn.Conv2d(3, 8, 3, stride=2)
        self.acts = nn.ModuleList([nn.ReLU6(), nn.Hardswish(), nn.SiLU(), nn.LeakyReLU(0.2),
                                   nn.Sigmoid(), nn.Tanh(), nn.Hardtanh(-0.5, 0.5),
                                   nn.Hardsigmoid()])
        self.convs = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1, groups=g)
                                    for g in (1, 8, 1, 8, 1, 2, 1, 8)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.stem(self.pad(x)))
        for i, (conv, act) in enumerate(zip(self.convs, self.acts)):
            x = act(conv(x) + x) if i % 2 else act(conv(x))
        return torch.relu(self.fc(torch.flatten(self.pool(x), 1)))


def test_exported_model_fuses_and_matches_torch(pnnx_export):
    torch.manual_seed(0)
    model = Blocks().eval()
    example = torch.rand(1, 3, 32, 32)
    param, binary = pnnx_export(model, (example,), "fusion_blocks", dynamic=True)
    fused = RuntimeGraph(param, binary).build()
    reference = RuntimeGraph(param, binary, reference=True).build()
    folded = [name for op in fused.operators for name in op.fused]
    assert len(folded) == len(reference.operators) - len(fused.operators) >= 13
    for shape in [(1, 3, 32, 32), (2, 3, 40, 36)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(x).numpy()
        (got,) = fused.forward(x.numpy())
        (ref,) = reference.forward(x.numpy())
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(ref, want, atol=1e-5)


@pytest.mark.parametrize("reference", [False, True])
def test_intermediates_are_released_after_their_last_reader(tmp_path, reference):
    """Liveness sees the fused graph: the residual is dropped after the conv that adds it."""
    lines = ["pnnx.Input in0 0 1 a",
             conv_line("conv1", "a", "b"),
             "nn.ReLU relu1 1 1 b c",
             conv_line("conv2", "c", "d"),
             "pnnx.Expression add 2 1 d c e expr=add(@0,@1)",
             "nn.ReLU relu2 1 1 e f",
             "pnnx.Output out0 1 0 f"]
    weights = {**conv_weights("conv1"), **conv_weights("conv2")}
    param, binary = write_pnnx(tmp_path, param_text(lines), weights)
    graph = RuntimeGraph(param, binary, reference=reference).build()
    freed = {op.name: names for op, names in zip(graph.operators, graph._free_after)}
    if reference:
        assert "c" in freed["add"]
    else:
        assert graph.operator("conv2").fused == ["add", "relu2"]
        assert sorted(freed["conv2"]) == ["c"]
        assert graph.operator("conv1").fused == ["relu1"]


@pytest.mark.parametrize("type_name, params, weights, words", [
    ("nn.Conv2d", dict(in_channels=2, out_channels=2, kernel_size=(1, 1), bias=False),
     {"weight": np.ones((2, 2, 1, 1), np.float32)}, "this convolution"),
    ("nn.Linear", dict(in_features=2, out_features=2, bias=False),
     {"weight": np.ones((2, 2), np.float32)}, "this linear layer")])
@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
def test_one_activation_is_fused_and_a_second_is_refused(type_name, params, weights, words,
                                                         fast):
    from helpers import make_layer
    from layers.activation import ReLU, Sigmoid

    layer = make_layer(type_name, params, weights, fast=fast)
    relu = ReLU()
    assert layer.can_fuse_activation(relu)
    layer.fuse_activation(relu)
    assert not layer.can_fuse_activation(Sigmoid())
    with pytest.raises(LayerError, match=f"cannot fuse Sigmoid into {words}"):
        layer.fuse_activation(Sigmoid())


class Excitations(nn.Module):
    """Squeeze-and-excitation as torchvision writes it (pool, conv, ReLU, conv, Hardsigmoid,
    scale * x) and as timm does (x.mean keeping dims, SiLU, sigmoid, x * gate), then a block
    whose gate is also an output (which must not fold)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.ModuleList([nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1), nn.Conv2d(16, 8, 1),
                                 nn.Conv2d(8, 16, 1), nn.Conv2d(16, 4, 1),
                                 nn.Conv2d(4, 16, 1)])

    def forward(self, x):
        x = F.relu(self.stem(x))
        scale = F.hardsigmoid(self.fc[1](F.relu(self.fc[0](self.pool(x)))))
        x = scale * x
        gate = torch.sigmoid(self.fc[3](F.silu(self.fc[2](x.mean((2, 3), keepdim=True)))))
        x = x * gate
        seen = torch.sigmoid(self.fc[5](F.relu(self.fc[4](self.pool(x)))))
        return x * seen, seen


def exported_pair(pnnx_export, model, name):
    """``model`` exported by pnnx (sizes free), built fused and as the reference."""
    param, binary = pnnx_export(model, (torch.rand(1, 3, 32, 32),), name, dynamic=True)
    return RuntimeGraph(param, binary).build(), RuntimeGraph(param, binary, reference=True).build()


def assert_both_match_torch(model, graphs, shapes=((1, 3, 32, 32), (2, 3, 40, 26))):
    for shape in shapes:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(x)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        for graph in graphs:
            for got, w in zip(graph.forward(x.numpy()), want, strict=True):
                np.testing.assert_allclose(got, w.numpy(), atol=1e-5, rtol=1e-4)


def test_squeeze_and_excitation_blocks_become_one_operator(pnnx_export):
    torch.manual_seed(0)
    model = Excitations().eval()
    fused, reference = exported_pair(pnnx_export, model, "excitations")
    blocks = [op for op in fused.operators if op.type == "SqueezeExcitation"]
    assert len(blocks) == 2
    for op in blocks:
        assert type(op.layer).__name__ == "FastSqueezeExcitation" and op.layer.in_kernel
        assert len(op.fused) == 5 and op.output_of is None and op.name.startswith("pnnx_expr")
        assert {"nn.Conv2d", "pnnx.Expression"} <= op.fused_types
        assert sorted(op.attrs) == ["expand.bias", "expand.weight", "reduce.bias",
                                    "reduce.weight"]
    assert {"nn.AdaptiveAvgPool2d", "torch.mean"} <= blocks[0].fused_types | blocks[1].fused_types
    assert [op.type for op in fused.operators].count("nn.AdaptiveAvgPool2d") == 1   # seen
    assert len(reference.operators) - len(fused.operators) == sum(len(op.fused)
                                                                  for op in fused.operators)
    assert_both_match_torch(model, (fused, reference))


def excitation_lines(pool="nn.AdaptiveAvgPool2d pool 1 1 a s output_size=(1,1)", k=1,
                     groups=1, gate_channels=8, mul="mul(@0,@1)", outputs="y",
                     operands=None):
    """A squeeze-and-excitation block on 8 channels of ``a`` (a second input ``z``, of the same
    shape, for a pool that reads it): ``k`` the reduce's kernel size, ``groups`` its groups,
    ``gate_channels`` the expand's output channels; the multiply's inputs are (gs, a), and z
    for an expression that reads @2 (or ``operands`` = 3)."""
    operands = operands or (3 if "@2" in mul else 2)
    lines = ["pnnx.Input in0 0 1 a", "pnnx.Input in1 0 1 z", pool,
             conv_line("reduce", "s", "h", c_in=8, c_out=2, k=k, pad=k // 2, groups=groups),
             "nn.ReLU relu 1 1 h hr",
             conv_line("expand", "hr", "g", c_in=2, c_out=gate_channels, k=1, pad=0),
             "nn.Sigmoid gate 1 1 g gs",
             f"pnnx.Expression mul {operands} 1 {' gs a z'[:3 * operands]} y expr={mul}",
             f"pnnx.Output out0 {len(outputs.split())} 0 {outputs}"]
    weights = {**conv_weights("reduce", 8, 2, k=k, groups=groups),
               **conv_weights("expand", 2, gate_channels, k=1)}
    return lines, weights


@pytest.mark.parametrize("change, folds", [
    ({}, True),
    ({"mul": "mul(@1,@0)"}, True),
    ({"pool": "torch.mean pool 1 1 a s dim=(-1,-2) keepdim=True"}, True),
    ({"outputs": "y gs"}, False),                                  # the gate is seen
    ({"outputs": "y s"}, False),                                   # the means are seen
    ({"pool": "nn.AdaptiveAvgPool2d pool 1 1 z s output_size=(1,1)"}, False),   # z's gate
    ({"pool": "nn.AdaptiveAvgPool2d pool 1 1 a s output_size=(1,2)"}, False),
    ({"pool": "nn.AdaptiveMaxPool2d pool 1 1 a s output_size=(1,1)"}, False),
    ({"pool": "torch.mean pool 1 1 a s dim=(6,7) keepdim=True"}, False),  # no such dims
    ({"k": 3}, False),                                             # not a 1x1
    ({"groups": 2}, False),
    ({"gate_channels": 1}, False),                                 # one gate for all
    ({"mul": "add(@0,@1)"}, False)])
def test_what_folds_into_squeeze_and_excitation(tmp_path, change, folds):
    lines, weights = excitation_lines(**change)
    fused, reference = graph_pair(tmp_path, lines, weights)
    assert any(op.type == "SqueezeExcitation" for op in fused.operators) == folds
    x, z = rng.standard_normal((2, 2, 8, 5, 2)).astype(np.float32)
    if "dim=(6,7)" in change.get("pool", ""):                   # refused by both graphs
        for graph in (fused, reference):
            with pytest.raises(ShapeError):
                graph.forward(x, z)
        return
    for got, want in zip(fused.forward(x, z), reference.forward(x, z)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    if folds:
        (op,) = fused.operators[2:-1]
        assert op.name == "mul" and op.fused == ["pool", "reduce", "relu", "expand", "gate"]
        assert [o.name for o in op.inputs] == ["a"] and op.output_of is None
        assert {"pnnx.Expression", "nn.Conv2d", "nn.Sigmoid"} <= op.fused_types
        for graph in (fused, reference):                        # an empty batch
            assert graph.forward(x[:0], z[:0])[0].shape == (0, 8, 5, 2)
        with pytest.raises(ShapeError, match="squeeze-and-excitation"):
            fused.forward(x[:, :4], z[:, :4])
        with pytest.raises(GraphError, match="'pool' is fused into SqueezeExcitation mul"):
            fused.debug(x, z).value("pool")


@pytest.mark.parametrize("expr, keeps", [         # keeps: x added back (None: no fold)
    ("add(@1,mul(@1,@0))", True),                     # x + x * g: a residual block
    ("add(mul(@0,@1),@1)", True),
    ("add(add(@1,mul(@0,@1)),@2)", True),             # then + z
    ("add(@2,add(mul(@1,@0),@1))", True),
    ("add(mul(@0,@1),@2)", False),                    # x * g + z
    ("add(@0,mul(@0,@1))", None),                     # g + g * x: not x kept
    ("add(add(@1,@2),mul(@0,@1))", None),             # rounded in another order
    ("add(add(@1,mul(@0,@1)),@1)", None),             # x added twice
    ("sub(@1,mul(@0,@1))", None),
    ("mul(@0,@1) and z unread", None)])
def test_residual_squeeze_and_excitation_blocks_fold(tmp_path, expr, keeps):
    expr, *unread = expr.split(" and ")
    lines, weights = excitation_lines(mul=expr, operands=3 if unread else None)
    fused, reference = graph_pair(tmp_path, lines, weights)
    blocks = [op for op in fused.operators if op.type == "SqueezeExcitation"]
    folds = keeps is not None
    assert len(blocks) == folds
    x, z = rng.standard_normal((2, 2, 8, 5, 2)).astype(np.float32)
    for got, want in zip(fused.forward(x, z), reference.forward(x, z)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    if folds:
        (op,) = blocks
        assert [o.name for o in op.inputs] == (["a", "z"] if "@2" in expr else ["a"])
        assert op.layer.keeps_input == keeps
        assert fused.forward(x[:0], z[:0])[0].shape == (0, 8, 5, 2)
        if "@2" in expr:                                 # a residual of another shape
            with pytest.raises(ShapeError, match="residual"):
                fused.forward(x, z[:, :, :3])
            (got,) = fused.forward(x, z[:1])             # broadcast, as torch adds
            (want,) = reference.forward(x, z[:1])
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_a_gate_whose_convolutions_disagree_is_refused_as_unfused(tmp_path):
    """reduce gives 2 channels, expand's weight takes 3: the file is wrong, and the fused
    graph says so as the reference does (it does not fold)."""
    lines, weights = excitation_lines()
    lines[5] = conv_line("expand", "hr", "g", c_in=3, c_out=8, k=1, pad=0)
    weights.update(conv_weights("expand", 3, 8, k=1))
    fused, reference = graph_pair(tmp_path, lines, weights)
    x = rng.standard_normal((2, 8, 5, 2)).astype(np.float32)
    for graph in (fused, reference):
        with pytest.raises(ShapeError, match="nn.Conv2d expand"):
            graph.forward(x, x)


# ----- affine expressions after a convolution: into the weights, or after the activation -----

AFFINE = {                 # an expression of the conv's output and numbers alone, and torch's
    "mul(@0,1.5)": lambda t: t * 1.5,
    "add(mul(0.5,@0),-0.25)": lambda t: 0.5 * t - 0.25,
    "sub(2,div(@0,4))": lambda t: 2 - t / 4,
    "add(@0,0.75)": lambda t: t + 0.75,
}


@pytest.mark.parametrize("expr", AFFINE)
@pytest.mark.parametrize("where", ["before the activation", "after the activation",
                                   "after the residual"])
def test_an_affine_expression_folds_into_the_convolution(tmp_path, expr, where):
    """Before anything else is fused, a * conv + b goes into the weights and bias (and the
    activation after it fuses too); after a fused activation or residual, the activation
    becomes ScaleShift(activation, a, b), which the kernels apply."""
    from layers.activation import Hardswish, ScaleShift

    lines = ["pnnx.Input in0 0 1 a", "pnnx.Input in1 0 1 r", conv_line("conv", "a", "b", groups=2)]
    if where == "before the activation":
        lines += [f"pnnx.Expression e 1 1 b c expr={expr}", "nn.Hardswish act 1 1 c y"]
        folded = ["e", "act"]
    elif where == "after the activation":
        lines += ["nn.Hardswish act 1 1 b c", f"pnnx.Expression e 1 1 c y expr={expr}"]
        folded = ["act", "e"]
    else:
        lines += ["pnnx.Expression add 2 1 b r c expr=add(@0,@1)",
                  f"pnnx.Expression e 1 1 c y expr={expr}"]
        folded = ["add", "e"]
    lines.append("pnnx.Output out0 1 0 y")
    weights = conv_weights("conv", groups=2)
    fused, reference = graph_pair(tmp_path, lines, weights)
    (op,) = [op for op in fused.operators if op.type == "nn.Conv2d"]
    assert op.fused == folded and len(fused.operators) == 4
    activation = op.layer.fused_activation
    if where == "before the activation":
        assert type(activation).__name__ == "FastHardswish"
        scale, _ = affine_form(parse_expression(expr))
        np.testing.assert_array_equal(op.layer.weight, weights["conv.weight"] * np.float32(scale))
    else:
        assert isinstance(activation, ScaleShift)
        assert isinstance(activation.inner, Hardswish) or activation.inner is None
        np.testing.assert_array_equal(op.layer.weight, weights["conv.weight"])

    x, r = rng.standard_normal((2, 2, 4, 9, 7)).astype(np.float32) * 3
    t = torch_conv(torch.from_numpy(x), weights, "conv", groups=2)
    if where == "before the activation":
        want = F.hardswish(AFFINE[expr](t))
    elif where == "after the activation":
        want = AFFINE[expr](F.hardswish(t))
    else:
        want = AFFINE[expr](t + torch.from_numpy(r))
    (got,) = fused.forward(x, r)
    (ref,) = reference.forward(x, r)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ref, want.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("middle, folds", [
    (["pnnx.Expression e1 1 1 b c expr=mul(@0,2)",
      "pnnx.Expression e2 1 1 c y expr=add(@0,1)"], ["e1", "e2"]),         # one after another
    (["nn.ReLU6 act 1 1 b c", "pnnx.Expression e 1 1 c y expr=mul(@0,2)"],
     ["act"]),                                     # the clamp's bounds take the kernels' a, b
    (["pnnx.Expression e 1 1 b y expr=mul(add(@0,1),2)"], []),   # torch rounds twice: kept
    (["pnnx.Expression e 1 1 b y expr=mul(@0,@0)"], []),
    (["pnnx.Expression e 1 1 b y expr=mul(@0,0)"], []),
    (["pnnx.Expression e 1 1 b y expr=add(@0,inf)"], []),
    (["pnnx.Expression e 1 1 b y expr=mul(@0,2)", "nn.ReLU seen 1 1 b z"], []),   # b is read
])
def test_what_affine_expressions_fold(tmp_path, middle, folds):
    outputs = "y z" if any(" z" in line for line in middle) else "y"
    lines = ["pnnx.Input in0 0 1 a", conv_line("conv", "a", "b"), *middle,
             f"pnnx.Output out0 {len(outputs.split())} 0 {outputs}"]
    fused, reference = graph_pair(tmp_path, lines, conv_weights("conv"))
    assert fused.operator("conv").fused == folds
    x = rng.standard_normal((1, 4, 6, 5)).astype(np.float32)
    for got, want in zip(fused.forward(x), reference.forward(x)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


class AffineBlocks(nn.Module):
    """PP-LCNetV3's learnable affine blocks (a scalar scale and bias after a convolution and
    after its activation) and PaddlePaddle's hard sigmoid (x * 1.2 before torch's) in a
    squeeze-and-excitation gate: as such models come out of ONNX."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 24, 1)
        self.reduce, self.expand = nn.Conv2d(24, 6, 1), nn.Conv2d(6, 24, 1)
        self.scales = nn.Parameter(torch.tensor([1.3, 0.7, 0.9, 1.1, 0.8, 1.2]))
        self.shifts = nn.Parameter(torch.tensor([0.1, -0.2, 0.3, 0.05, -0.1, 0.2]))

    def lab(self, x, i):
        return self.scales[i] * x + self.shifts[i]

    def forward(self, x):
        x = self.lab(F.hardswish(self.lab(self.stem(x), 0)), 1)
        x = self.lab(F.hardswish(self.lab(self.depthwise(x), 2)), 3)
        x = self.lab(F.hardswish(self.lab(self.pointwise(x), 4)), 5)
        gate = F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))
        return x * F.hardsigmoid(self.expand(gate) * 1.2)


def test_learnable_affine_blocks_fold_and_match_torch(pnnx_export):
    torch.manual_seed(0)
    model = AffineBlocks().eval()
    fused, reference = exported_pair(pnnx_export, model, "affine_blocks")
    types = [op.type for op in fused.operators]
    assert types.count("pnnx.Expression") == 0 and types.count("SqueezeExcitation") == 1
    assert types.count("nn.Conv2d") == 3
    assert_both_match_torch(model, (fused, reference))


@pytest.mark.parametrize("kernel, stride, pad", [(2, 2, 0), (3, 2, 1)],
                         ids=["windows apart (the product)", "overlapping (the reference)"])
@pytest.mark.parametrize("chain", [["nn.ReLU"], ["add(mul(0.5,@0),-0.25)", "nn.ReLU"],
                                   ["nn.Hardswish", "sub(1,@0)"]])
def test_a_transposed_convolution_takes_its_activation_and_affine_maps(tmp_path, kernel, stride,
                                                                        pad, chain):
    lines = ["pnnx.Input in0 0 1 a",
             f"nn.ConvTranspose2d up 1 1 a b0 bias=True dilation=(1,1) groups=1 in_channels=4 "
             f"kernel_size=({kernel},{kernel}) out_channels=6 output_padding=(0,0) "
             f"padding=({pad},{pad}) stride=({stride},{stride}) @bias=(6)f32 "
             f"@weight=(4,6,{kernel},{kernel})f32"]
    for i, step in enumerate(chain):
        if step.startswith("nn."):
            lines.append(f"{step} s{i} 1 1 b{i} b{i + 1}")
        else:
            lines.append(f"pnnx.Expression s{i} 1 1 b{i} b{i + 1} expr={step}")
    lines.append(f"pnnx.Output out0 1 0 b{len(chain)}")
    weights = {"up.weight": rng.standard_normal((4, 6, kernel, kernel)).astype(np.float32),
               "up.bias": rng.standard_normal(6).astype(np.float32)}
    fused, reference = graph_pair(tmp_path, lines, weights)
    assert fused.operator("up").fused == [f"s{i}" for i in range(len(chain))]
    x = rng.standard_normal((2, 4, 5, 7)).astype(np.float32)
    t = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(weights["up.weight"]),
                           torch.from_numpy(weights["up.bias"]), stride, pad)
    torch_steps = {"nn.ReLU": F.relu, "nn.Hardswish": F.hardswish,
                   "add(mul(0.5,@0),-0.25)": lambda v: 0.5 * v - 0.25, "sub(1,@0)": lambda v: 1 - v}
    for step in chain:
        t = torch_steps[step](t)
    (got,) = fused.forward(x)
    (ref,) = reference.forward(x)
    np.testing.assert_allclose(got, t.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ref, t.numpy(), atol=1e-5, rtol=1e-5)
