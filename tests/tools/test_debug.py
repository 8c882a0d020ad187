"""The debug session, hooks, verbose mode and forward_all, on a pnnx-exported model, against
torch's own intermediates (forward hooks on the torch module)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from debug_models import (SqrtRelu, example_input, small_net, torch_outputs_by_module)
from infer import ArrayStats, GraphError
from infer.execution import Execution

ATOL = 1e-4


@pytest.fixture
def net(tmp_path_factory):
    return small_net(tmp_path_factory)


def running(graph):
    """The operators a forward pass runs, in order (no pnnx.Input / pnnx.Output)."""
    return [op for op in graph.operators if op.type not in ("pnnx.Input", "pnnx.Output")]


# ----------------------------------------------------------------------------- stepping
def test_stepping_through_every_operator_gives_forwards_outputs(net):
    model, g = net
    x = example_input()
    want = g.forward(x)
    dbg = g.debug(x)
    assert dbg.current is None and dbg.position == 0
    assert dbg.next is running(g)[0]
    seen = []
    while not dbg.done:
        step = dbg.step()
        seen.append(step.operator)
        assert dbg.current is step and step.index == len(seen) == dbg.position
        assert step.total == len(running(g))
    assert seen == running(g)
    assert dbg.next is None and dbg.step() is step          # stepping past the end: no-op
    got = dbg.finish()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_step_n_and_finish_from_the_middle(net):
    _, g = net
    x = example_input(1)
    dbg = g.debug(x)
    step = dbg.step(3)
    assert step.index == 3 and step.operator is running(g)[2]
    with pytest.raises(GraphError, match="finish"):
        _ = dbg.outputs
    for a, b in zip(dbg.finish(), g.forward(x)):
        np.testing.assert_array_equal(a, b)
    assert dbg.done and len(dbg.outputs) == 2


def test_run_to_stops_after_the_named_operator_with_torchs_values(net):
    model, g = net
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    dbg = g.debug(x)
    step = dbg.run_to("conv2")
    assert step.operator.name == "conv2" and dbg.current is step
    assert dbg.next.name == "act"
    (conv2_out,) = step.outputs
    np.testing.assert_allclose(conv2_out, torch_values["conv2"], atol=ATOL)
    np.testing.assert_allclose(step.inputs[0], torch_values["pool"], atol=ATOL)
    assert list(step.named_outputs()) == [g.operator("conv2").outputs[0].name]
    step = dbg.run_to("fc")
    np.testing.assert_allclose(step.outputs[0], torch_values["fc"], atol=ATOL)


def test_run_to_refuses_unknown_and_finished_operators(net):
    _, g = net
    dbg = g.debug(example_input())
    with pytest.raises(GraphError, match=r"no operator named 'conv' .*similar: .*conv2"):
        dbg.run_to("conv")
    with pytest.raises(GraphError, match="no operator named 'pnnx_input_0' runs"):
        dbg.run_to("pnnx_input_0")
    dbg.run_to("act")
    with pytest.raises(GraphError, match=r"nn.Hardswish act already ran \(step 5\)"):
        dbg.run_to("act")
    dbg.restart()
    assert dbg.position == 0 and dbg.run_to("act").index == 5


def test_break_on_type_stops_after_each_operator_of_that_type(net):
    _, g = net
    dbg = g.debug(example_input())
    dbg.break_on(type="nn.Conv2d")
    stops = []
    while (step := dbg.continue_()) is not None:
        stops.append(step.operator)
    assert stops == [op for op in running(g) if op.type == "nn.Conv2d"]
    assert len(stops) == 3 and dbg.done and dbg.breakpoints[0].hits == 3


def test_break_on_name_and_condition(net):
    _, g = net
    dbg = g.debug(example_input())
    dbg.break_on(name="avg")
    assert dbg.continue_().operator.name == "avg"
    dbg.clear_breakpoints()
    dbg.restart()
    # a condition on the step: the first output with a value above 5
    dbg.break_on(when=lambda s: any(y.max() > 5 for y in s.outputs))
    step = dbg.continue_()
    assert step.outputs[0].max() > 5
    earlier = running(g)[:step.index - 1]
    assert all(dbg.value(op.outputs[0].name).max() <= 5 for op in earlier)


def test_break_on_refuses_what_the_graph_does_not_have(net):
    _, g = net
    dbg = g.debug(example_input())
    with pytest.raises(GraphError, match=r"no operator of type 'nn.GELU' .*nn.Hardswish"):
        dbg.break_on(type="nn.GELU")
    with pytest.raises(GraphError, match="no operator named 'nope'"):
        dbg.break_on(name="nope")
    with pytest.raises(GraphError, match="needs a type"):
        dbg.break_on()


def test_break_on_nonfinite_finds_the_first_nan(tmp_path_factory):
    _, g = small_net(tmp_path_factory, nn__ReLU=SqrtRelu)
    x = example_input()
    dbg = g.debug(x)
    dbg.break_on(nonfinite=True)
    step = dbg.continue_()
    assert step.operator.name == "relu"                     # sqrt of the negative values
    stats = dbg.inspect("relu")
    conv_out = dbg.value("convbn2d_0")
    assert stats.nan == int((conv_out < 0).sum()) > 0 and stats.inf == 0
    assert not stats.finite
    assert all(np.isfinite(dbg.value(op.outputs[0].name)).all()
               for op in running(g)[:step.index - 1])


# ----------------------------------------------------------------------------- inspecting
def test_inspect_reports_numpys_statistics(net):
    _, g = net
    dbg = g.debug(example_input())
    dbg.run_to("conv2")
    name = g.operator("conv2").outputs[0].name
    value = dbg.value(name)
    stats = dbg.inspect(name)
    assert stats.shape == value.shape and stats.dtype == "float32"
    assert stats.min == pytest.approx(float(value.min()))
    assert stats.max == pytest.approx(float(value.max()))
    assert stats.mean == pytest.approx(float(value.astype(np.float64).mean()))
    assert stats.std == pytest.approx(float(value.astype(np.float64).std()))
    assert stats.nan == stats.inf == 0
    assert stats.values == value.ravel()[:6].tolist()
    assert dbg.inspect("conv2") == stats                   # by operator name too
    text = str(stats)
    assert name in text and "(1,8,6,6)" in text and f"{stats.max:.4g}" in text
    assert "<table>" in stats._repr_html_()


def test_array_stats_leave_out_nan_and_inf():
    a = np.array([[1.0, np.nan, -2.0], [np.inf, 4.0, -np.inf]], dtype=np.float32)
    stats = ArrayStats.of(a, "a")
    assert (stats.nan, stats.inf) == (1, 2)
    finite = np.array([1.0, -2.0, 4.0])
    assert (stats.min, stats.max) == (-2.0, 4.0)
    assert stats.mean == pytest.approx(finite.mean()) and stats.std == pytest.approx(finite.std())
    assert "NaN 1  Inf 2" in str(stats)
    empty = ArrayStats.of(np.zeros((0, 3), np.float32))
    assert empty.min is None and empty.size == 0 and "min -" in str(empty)
    ints = ArrayStats.of(np.arange(10, dtype=np.int64))
    assert (ints.min, ints.max, ints.mean) == (0.0, 9.0, 4.5) and ints.nan == 0


def test_inspect_names_what_is_missing(net):
    _, g = net
    dbg = g.debug(example_input())
    with pytest.raises(GraphError,
                       match=r"not computed yet: nn.Linear fc makes it; run_to\('fc'\)"):
        dbg.inspect("fc")
    with pytest.raises(GraphError, match="no operand or operator named 'zzz'"):
        dbg.inspect("zzz")


def test_a_debug_session_keeps_every_intermediate_untouched(net):
    """relu may run in place in forward; in a debug session it must not overwrite the conv
    output it reads, which stays as torch computed it."""
    model, g = net
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    dbg = g.debug(x)
    dbg.finish()
    conv_out = dbg.value("convbn2d_0")
    assert conv_out.min() < 0                               # not rectified in place
    values = dbg.values
    assert set(values) == set(g.operands)                   # nothing was released
    np.testing.assert_allclose(values[g.operator("relu").outputs[0].name],
                               torch_values["relu"], atol=ATOL)


def test_listing_and_repr_show_where_the_session_is(net):
    _, g = net
    dbg = g.debug(example_input())
    assert "before the first operator; next: nn.Conv2d convbn2d_0" in repr(dbg)
    dbg.run_to("act")
    assert "step 5/11" in repr(dbg) and "next: pnnx.Expression" in repr(dbg)
    table = dbg.listing(context=1)
    assert [r[3] for r in table.rows] == ["conv2", "act", "pnnx_expr_1"]
    assert table.marked == {1} and table.rows[2][1] == "next"
    text = str(dbg)
    assert "nn.Hardswish act (1,8,6,6) -> (1,8,6,6)" in text and "in  4" in text
    assert "<table>" in dbg._repr_html_()


def test_debug_refuses_bad_inputs_before_running(net):
    from infer import ShapeError

    _, g = net
    with pytest.raises(ShapeError):
        g.debug(np.zeros((1, 3, 12), np.float32))
    with pytest.raises(ShapeError):
        g.debug(np.zeros((1, 4, 12, 12), np.float32))


# ----------------------------------------------------------------------------- hooks
def test_hooks_see_every_operator_in_run_order(net):
    model, g = net
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    before, after = [], []
    handle = g.add_hook(before=lambda op, xs: before.append((op, [a.shape for a in xs])),
                        after=lambda op, xs, ys: after.append((op, [y.copy() for y in ys])))
    outputs = g.forward(x)
    assert [op for op, _ in before] == [op for op, _ in after] == running(g)
    assert dict(before)[g.operator("fc")] == [(1, 8)]
    np.testing.assert_allclose(dict(after)[g.operator("act")][0], torch_values["act"],
                               atol=ATOL)
    handle.remove()
    g.forward(x)
    assert len(after) == len(running(g))                    # removed: not called again
    handle.remove()                                         # removing twice is harmless
    for a, b in zip(outputs, g.forward(x)):
        np.testing.assert_array_equal(a, b)


def test_a_hook_may_replace_outputs_and_a_with_block_removes_it(net):
    _, g = net
    x = example_input()
    plain = g.forward(x)

    def zero_fc(op, xs, ys):
        return [np.zeros_like(ys[0])] if op.name == "fc" else None

    with g.add_hook(after=zero_fc):
        logits, side = g.forward(x)
    np.testing.assert_array_equal(logits, np.zeros((1, 5), np.float32))
    np.testing.assert_array_equal(side, plain[1])
    np.testing.assert_array_equal(g.forward(x)[0], plain[0])     # the hook is gone
    assert not g._hooks


def test_a_before_hook_may_replace_inputs(net):
    model, g = net
    x = example_input()

    def double_fc_input(op, xs):
        return [xs[0] * 2] if op.name == "fc" else None

    with g.add_hook(before=double_fc_input):
        logits, _ = g.forward(x)
    fc = model.fc
    features = g.forward_all(x)[g.operator("fc").inputs[0].name]
    want = 2 * features @ fc.weight.detach().numpy().T + fc.bias.detach().numpy()
    np.testing.assert_allclose(logits, want, atol=ATOL)


def test_add_hook_needs_a_function(net):
    _, g = net
    with pytest.raises(GraphError, match="before= or an after="):
        g.add_hook()
    with pytest.raises(GraphError, match="after= must be a function, got str"):
        g.add_hook(after="print")
    assert not g._hooks


def test_hooks_are_off_by_default_and_forward_drains_the_debuggers_loop(net, monkeypatch):
    """One loop: forward runs an Execution to its end, plain (in place, into the arena) while
    no hook is set."""
    _, g = net
    runs = []
    start = Execution.__init__

    def spy(self, *args, **kwargs):
        start(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(Execution, "__init__", spy)
    g.forward(example_input())
    assert not g._hooks and len(runs) == 1
    assert runs[0].done and not runs[0].isolated and not runs[0].keep_all
    with g.add_hook(after=lambda op, xs, ys: None):
        g.forward(example_input())
    assert len(runs) == 2 and runs[1].done and runs[1].isolated and not runs[1].keep_all
    g.debug(example_input()).finish()
    assert len(runs) == 3 and runs[2].done and runs[2].keep_all


# ----------------------------------------------------------------------------- verbose
def test_verbose_prints_type_name_and_shapes_per_operator(net, capsys):
    model, g = net
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    g.verbose = True
    assert g.verbose == "print"
    g.forward(x)
    g.verbose = False
    assert not g.verbose and not g._hooks
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(running(g))
    pattern = re.compile(r"^(\S+)\s+(\S+)\s+(.*) -> (.*)$")
    parsed = {m.group(2): m for m in map(pattern.match, lines)}
    assert parsed["conv2"].group(1) == "nn.Conv2d"
    assert parsed["conv2"].group(3) == "(1,8,6,6)"
    assert parsed["fc"].group(4) == "(" + ",".join(map(str, torch_values["fc"].shape)) + ")"
    assert parsed["pnnx_expr_1"].group(3) == "(1,8,6,6), (1,8,6,6)"
    g.forward(x)
    assert capsys.readouterr().out == ""


def test_verbose_log_mode_uses_logging(net, caplog):
    _, g = net
    g.verbose = "log"
    with caplog.at_level(logging.INFO, logger="infer.debug"):
        g.forward(example_input())
    g.verbose = False
    messages = [r.getMessage() for r in caplog.records if r.name == "infer.debug"]
    assert len(messages) == len(running(g))
    assert messages[0].split()[:2] == ["nn.Conv2d", "convbn2d_0"]
    with pytest.raises(GraphError, match="verbose takes"):
        g.verbose = "loud"


# ----------------------------------------------------------------------------- forward_all
def test_forward_all_returns_every_operand_by_name(net):
    model, g = net
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    values = g.forward_all(x)
    assert set(values) == set(g.operands)
    np.testing.assert_array_equal(values[g.input_operators[0].outputs[0].name], x)
    for module_name in ("relu", "pool", "conv2", "act", "avg", "fc", "head"):
        operand = g.operator(module_name).outputs[0].name
        np.testing.assert_allclose(values[operand], torch_values[module_name], atol=ATOL,
                                   err_msg=module_name)
    for out, want in zip(g.output_operands, g.forward(x)):
        np.testing.assert_array_equal(values[out.name], want)


def test_a_layer_that_writes_into_its_input_is_caught_naming_it(tmp_path_factory):
    """forward gives no warning when a layer scribbles over its input; a debug session (like
    any isolated pass) hands the layers read-only views, so the scribbling layer is named."""
    from infer import Layer, LayerError

    class ScribblingRelu(Layer):
        def forward_one(self, x):
            np.maximum(x, 0, out=x)                          # the bug: writes its input
            return x

    _, g = small_net(tmp_path_factory, nn__ReLU=ScribblingRelu)
    with pytest.raises(LayerError, match="nn.ReLU relu.*read-only"):
        g.debug(example_input()).run_to("relu")


# ----------------------------------------------------------------------------- a fused graph
@pytest.fixture
def fused(tmp_path_factory):
    """The small net as RuntimeGraph builds it by default: relu, act and the head's sigmoid
    are folded into the convolutions before them."""
    from debug_models import exported
    from infer import RuntimeGraph

    model, param, binary = exported(tmp_path_factory)
    graph = RuntimeGraph(param, binary).build()
    assert graph.operator("conv2").fused == ["act"]
    return model, graph


def test_break_on_the_name_of_a_fused_operator_stops_where_it_was_folded(fused):
    model, g = fused
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    dbg = g.debug(x)
    dbg.break_on(name="act")
    step = dbg.continue_()
    assert step is not None and step.operator.name == "conv2"
    np.testing.assert_allclose(step.outputs[0], torch_values["act"], atol=ATOL)
    assert dbg.continue_() is None and dbg.breakpoints[0].hits == 1


def test_break_on_a_type_fusion_folded_away_stops_at_the_operators_that_absorbed_it(fused):
    _, g = fused
    dbg = g.debug(example_input())
    assert all(op.type != "nn.Hardswish" for op in running(g))
    dbg.break_on(type="nn.Hardswish")
    assert dbg.continue_().operator.name == "conv2"
    assert dbg.continue_() is None
    dbg.restart()
    dbg.clear_breakpoints()
    dbg.break_on(type="nn.ReLU")
    assert dbg.continue_().operator.name == "convbn2d_0"
    dbg.restart()
    dbg.clear_breakpoints()
    dbg.break_on(type="nn.Conv2d")                 # still every convolution, fused or not
    stops = []
    while (step := dbg.continue_()) is not None:
        stops.append(step.operator.name)
    assert stops == ["convbn2d_0", "conv2", "head"]
    with pytest.raises(GraphError, match="no operator of type 'nn.GELU'"):
        dbg.break_on(type="nn.GELU")


def test_inspect_a_fused_operator_by_name(fused):
    model, g = fused
    x = example_input()
    torch_values = torch_outputs_by_module(model, x)
    dbg = g.debug(x)
    dbg.run_to("act")
    assert dbg.current.operator.name == "conv2"
    np.testing.assert_allclose(dbg.value("act"), torch_values["act"], atol=ATOL)
    assert dbg.inspect("act") == dbg.inspect("conv2")


def test_an_operator_fused_in_the_middle_has_no_value_and_says_why(tmp_path):
    """conv -> add(@0,@1) -> relu fuses into one operator: the add's own output never exists."""
    from infer import RuntimeGraph
    from support import conv_line, conv_weights, write_model

    param, binary = write_model(
        tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,6,6)f32", "pnnx.Input in1 0 1 1 #1=(1,4,4,4)f32",
        conv_line().replace(" 1 1 0 1 ", " 1 1 0 2 "),
        "pnnx.Expression add 2 1 2 1 3 expr=add(@0,@1)", "nn.ReLU relu 1 1 3 4",
        "pnnx.Output out0 1 0 4", weights=conv_weights())
    g = RuntimeGraph(param, binary).build()
    assert g.operator("conv").fused == ["add", "relu"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 6, 6), np.float32)
    r = rng.standard_normal((1, 4, 4, 4), np.float32)
    dbg = g.debug(x, r)
    dbg.finish()
    with pytest.raises(GraphError, match=r"'add' is fused into nn.Conv2d conv.*fuse=False"):
        dbg.inspect("add")
    np.testing.assert_array_equal(dbg.value("relu"), g.forward(x, r)[0])


def test_moving_takes_counts_and_names(net):
    _, g = net
    dbg = g.debug(example_input())
    for bad in (-1, "2", 1.5):
        with pytest.raises(GraphError, match="takes a count"):
            dbg.step(bad)
    with pytest.raises(GraphError, match="operator name is a str"):
        dbg.run_to(None)
    assert dbg.step(np.int64(2)).index == 2 and dbg.step(0).index == 2
