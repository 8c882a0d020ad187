"""The per-operator profile: rows in run order, shares, output sizes, and FLOPs checked against
torch's own FLOP counter; and the Table the tools print."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from debug_models import example_input, small_net, torch_outputs_by_module
from infer import GraphError, Profile, Table
from infer.profile import flops
from infer.runtime import RuntimeAttribute, RuntimeOperator


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    model, g = small_net(tmp_path_factory)
    x = example_input()
    return model, g, x, g.profile(x, repeat=3, warmup=1)


def torch_flops(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn(*args)
    return counter.get_total_flops()


def test_one_row_per_operator_in_run_order(profiled):
    _, g, x, p = profiled
    ops = [op for op in g.operators if op.type not in ("pnnx.Input", "pnnx.Output")]
    assert isinstance(p, Profile) and [r.operator for r in p.rows] == ops
    assert [r.index for r in p.rows] == list(range(1, len(ops) + 1))
    assert all(r.seconds > 0 for r in p.rows)
    assert p.total_seconds == pytest.approx(sum(r.seconds for r in p.rows))
    assert sum(p.share(r) for r in p.rows) == pytest.approx(1.0)
    assert p.wall_seconds >= p.total_seconds * 0.5
    values = g.forward_all(x)
    for r in p.rows:
        assert r.output_bytes == sum(values[o.name].nbytes for o in r.operator.outputs)
        assert r.output_shapes == [values[o.name].shape for o in r.operator.outputs]


def test_conv_and_linear_flops_match_torchs_counter_plus_bias(profiled):
    model, g, x, p = profiled
    inputs = torch_outputs_by_module(model, x)
    rows = {r.operator.name: r for r in p.rows}
    for name, module, given in (("conv2", model.conv2, inputs["pool"]),
                                ("head", model.head, None), ("fc", model.fc, None)):
        if given is None:                                  # the module's own input
            given = g.forward_all(x)[g.operator(name).inputs[0].name]
        counted = torch_flops(module, torch.from_numpy(given.copy()))
        out_size = int(np.prod(rows[name].output_shapes[0]))
        assert rows[name].flops == counted + out_size, name      # + one add per output: bias
    assert rows["relu"].flops is None and rows["act"].flops is None
    assert p.total_flops == sum(r.flops or 0 for r in p.rows)
    assert rows["conv2"].gflops_per_second == pytest.approx(
        rows["conv2"].flops / rows["conv2"].seconds / 1e9)


@pytest.mark.parametrize("groups,bias", [(1, True), (3, False)])
def test_flops_of_weights_given_as_inputs(groups, bias):
    """F.conv2d and F.linear take their weights as graph inputs."""
    x, w = torch.rand(2, 6, 9, 9), torch.rand(12, 6 // groups, 3, 3)
    b = torch.rand(12) if bias else None
    out = F.conv2d(x, w, b, stride=2, groups=groups)
    op = RuntimeOperator("F.conv2d", "c")
    shapes = [tuple(x.shape), tuple(w.shape)] + ([(12,)] if bias else [])
    counted = torch_flops(F.conv2d, x, w, None, 2, 0, 1, groups)
    assert flops(op, shapes, [tuple(out.shape)]) == counted + (out.numel() if bias else 0)

    x, w = torch.rand(4, 7, 10), torch.rand(3, 10)
    op = RuntimeOperator("F.linear", "l")
    out_shape = (4, 7, 3)
    assert flops(op, [(4, 7, 10), (3, 10)], [out_shape]) == torch_flops(F.linear, x, w)


def test_matmul_and_transposed_conv_flops():
    a, b = torch.rand(2, 5, 4, 6), torch.rand(2, 5, 6, 3)
    op = RuntimeOperator("torch.matmul", "m")
    assert flops(op, [tuple(a.shape), tuple(b.shape)], [(2, 5, 4, 3)]) == \
        torch_flops(torch.matmul, a, b)
    x, w = torch.rand(1, 4, 5, 5), torch.rand(4, 6, 3, 3)
    out = F.conv_transpose2d(x, w, stride=2)
    op = RuntimeOperator("nn.ConvTranspose2d", "t",
                         attrs={"weight": RuntimeAttribute("weight", (4, 6, 3, 3), "f32")})
    assert flops(op, [tuple(x.shape)], [tuple(out.shape)]) == \
        torch_flops(F.conv_transpose2d, x, w, None, 2)
    assert flops(RuntimeOperator("nn.ReLU", "r"), [(1, 2)], [(1, 2)]) is None


def test_table_sorted_by_time_and_grouped_by_type(profiled):
    _, g, _, p = profiled
    table = p.table(sort="time")
    ms = table.column("ms")
    assert ms == sorted(ms, reverse=True) and len(table) == len(p.rows)
    top = p.table(sort="time", top=3)
    assert len(top) == 3 and top.column("name") == table.column("name")[:3]
    assert "more rows" in top.footer
    assert p.table(sort="flops").column("name")[0] == max(
        p.rows, key=lambda r: r.flops or 0).operator.name
    grouped = p.by_type()
    counts = dict(zip(grouped.column("type"), grouped.column("count")))
    assert counts["nn.Conv2d"] == 3 and sum(counts.values()) == len(p.rows)
    conv_ms = sum(r.seconds for r in p.rows if r.operator.type == "nn.Conv2d") * 1e3
    assert dict(zip(grouped.column("type"), grouped.column("ms")))["nn.Conv2d"] == \
        pytest.approx(conv_ms)
    assert sum(grouped.column("%")) == pytest.approx(100.0)
    with pytest.raises(GraphError, match="sort by"):
        p.table(sort="speed")


def test_profile_text_and_html(profiled):
    _, _, _, p = profiled
    text = str(p)
    assert "conv2" in text and "GFLOP/s" in text and "total" in text
    assert "median of 3 run(s)" in text
    html = p._repr_html_()
    assert html.count("<tr") == len(p.rows) + 1
    assert "FLOPs" in repr(p)


def test_profile_checks_its_arguments(profiled):
    _, g, x, _ = profiled
    with pytest.raises(GraphError, match="repeat >= 1"):
        g.profile(x, repeat=0)


def test_profile_does_not_change_forward(profiled):
    _, g, x, _ = profiled
    before = g.forward(x)
    g.profile(x, repeat=1, warmup=0)
    for a, b in zip(before, g.forward(x)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- Table
def test_table_text_html_and_sorting():
    t = Table(["name", "ms", "note"], [["a", 2.5, None], ["b", 10.0, "x<y"], ["c", None, ""]],
              title="T", marked={1})
    lines = str(t).splitlines()
    assert lines[0] == "T"
    assert lines[4].startswith("*") and "b" in lines[4]            # the marked row
    assert lines[3].index("2.5") + 3 == lines[4].index("10") + 2   # numbers right-aligned
    s = t.sorted("ms")
    assert s.column("name") == ["b", "a", "c"] and s.marked == {0}  # None last
    assert t.sorted("ms", descending=False).column("name") == ["a", "b", "c"]
    html = t._repr_html_()
    assert "x&lt;y" in html and "background" in html
    assert t.records()[0] == {"name": "a", "ms": 2.5, "note": None}
