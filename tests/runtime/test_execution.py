"""One execution loop (infer/execution.py): forward, the debugger, hooks, forward_all and the
profiler call the same layer methods, and the values a debug session keeps are the ones its
steps computed, bit for bit what forward returns."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infer import GraphError, Layer, RuntimeGraph
from support import REPO, write_model, write_pnnx

CALLS: Counter = Counter()


class CountingDouble(Layer):
    """y = 2 x; counts its forward / forward_into calls."""

    support_forward_into = True

    def forward(self, inputs):
        CALLS[self.name, "forward"] += 1
        return [inputs[0] * np.float32(2)]

    def forward_into(self, inputs, outputs):
        CALLS[self.name, "forward_into"] += 1
        np.multiply(inputs[0], np.float32(2), out=outputs[0])


class CountingRelu(Layer):
    """y = max(x, 0); counts its forward / forward_inplace calls."""

    support_inplace = True

    def forward(self, inputs):
        CALLS[self.name, "forward"] += 1
        return [np.maximum(inputs[0], 0)]

    def forward_inplace(self, x):
        CALLS[self.name, "forward_inplace"] += 1
        np.maximum(x, 0, out=x)


# d1 writes into the arena, r1 overwrites d1's output in place, d2 writes the graph output
CHAIN = """
7767517
5 4
pnnx.Input  in0  0 1 a #a=(2,3,4,5)f32
my.Double   d1   1 1 a b #b=(2,3,4,5)f32
my.Relu     r1   1 1 b c #c=(2,3,4,5)f32
my.Double   d2   1 1 c d #d=(2,3,4,5)f32
pnnx.Output out0 1 0 d
"""
FORWARD_CALLS = {("d1", "forward_into"): 1, ("r1", "forward_inplace"): 1,
                 ("d2", "forward_into"): 1}


@pytest.fixture
def chain(tmp_path):
    return built_chain(tmp_path, CountingRelu)


def built_chain(tmp_path: Path, in_place: type[Layer]) -> tuple[RuntimeGraph, np.ndarray]:
    """CHAIN's graph, ``in_place`` serving my.Relu, and an input."""
    param, binary = write_pnnx(tmp_path, CHAIN)
    graph = RuntimeGraph(param, binary)
    graph.register_custom_layer("my.Double", CountingDouble)
    graph.register_custom_layer("my.Relu", in_place)
    graph.build()
    assert [(s.op.name, s.in_place, s.into) for s in graph.run_list] == [
        ("d1", False, True), ("r1", True, False), ("d2", False, True)]
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5), dtype=np.float32)
    return graph, x


def calls_of(action) -> dict:
    CALLS.clear()
    action()
    return dict(CALLS)


def test_every_way_of_running_calls_the_layer_methods_forward_calls(chain):
    g, x = chain
    assert calls_of(lambda: g.forward(x)) == FORWARD_CALLS
    assert calls_of(lambda: g.debug(x).finish()) == FORWARD_CALLS
    assert calls_of(lambda: g.forward_all(x)) == FORWARD_CALLS
    assert calls_of(lambda: g.profile(x, repeat=1, warmup=0)) == FORWARD_CALLS
    with g.add_hook(after=lambda op, xs, ys: None):
        assert calls_of(lambda: g.forward(x)) == FORWARD_CALLS
    dbg = g.debug(x)
    assert calls_of(lambda: dbg.step(2)) == {("d1", "forward_into"): 1,
                                             ("r1", "forward_inplace"): 1}


def test_kept_values_are_what_each_step_computed(chain):
    """r1 runs in place over d1's output in forward; forward_all and a debug session keep
    d1's output as d1 wrote it (r1 overwrote a copy)."""
    g, x = chain
    want = 2 * np.maximum(2 * x, 0)
    values = g.forward_all(x)
    np.testing.assert_array_equal(values["b"], 2 * x)
    assert values["b"].min() < 0                               # not rectified in place
    np.testing.assert_array_equal(values["c"], np.maximum(2 * x, 0))
    np.testing.assert_array_equal(values["d"], want)
    dbg = g.debug(x)
    step = dbg.run_to("r1")
    np.testing.assert_array_equal(step.inputs[0], 2 * x)
    assert step.outputs[0] is not step.inputs[0]
    np.testing.assert_array_equal(dbg.finish()[0], g.forward(x)[0])


def test_a_hooks_replacement_is_not_overwritten_by_an_in_place_step(chain):
    g, x = chain
    mine = np.full((2, 3, 4, 5), -1.0, np.float32)
    with g.add_hook(after=lambda op, xs, ys: [mine] if op.name == "d1" else None):
        (out,) = g.forward(x)
    np.testing.assert_array_equal(out, np.zeros_like(mine))   # relu(-1) * 2
    assert (mine == -1).all()                                 # r1 rectified a copy


def test_run_all_after_some_steps_runs_each_remaining_step_once(chain):
    """A pass stepped with next, then drained by run_all (which yields no more records):
    every step runs once, the outputs are forward's and the pass is done."""
    g, x = chain
    want = g.forward(x)[0]
    with g.running():
        run = g.execute(x)
        CALLS.clear()
        step, *_ = next(run)
        assert step.op.name == "d1" and run.position == 1
        run.run_all()
        assert dict(CALLS) == FORWARD_CALLS
        assert run.done and run.position == 3 and list(run) == []
        np.testing.assert_array_equal(run.outputs()[0], want)


def test_records_name_the_step_and_its_arrays(chain):
    g, x = chain
    run = g.execute(x, keep_all=True)
    assert not run.done and run.next_step.op.name == "d1"
    with g.running():
        records = list(run)
    assert [step.op.name for step, *_ in records] == ["d1", "r1", "d2"]
    step, xs, ys, seconds = records[1]
    np.testing.assert_array_equal(xs[0], 2 * x)
    np.testing.assert_array_equal(ys[0], np.maximum(2 * x, 0))
    assert run.done and run.next_step is None and seconds == 0.0
    np.testing.assert_array_equal(run.outputs()[0], g.forward(x)[0])


class CountingAddOne(Layer):
    """y = x + 1, in place; counts its calls (run twice on the same array, it would add 2)."""

    support_inplace = True

    def forward(self, inputs):
        CALLS[self.name, "forward"] += 1
        return [inputs[0] + np.float32(1)]

    def forward_inplace(self, x):
        CALLS[self.name, "forward_inplace"] += 1
        x += np.float32(1)


@pytest.mark.parametrize("keep_all", [False, True])
def test_time_again_calls_each_layer_again_and_changes_no_value(tmp_path, keep_all):
    """time_again calls the method the loop called, once more, on the step's own arrays;
    an in-place step runs on a copy, so the pass computes what forward does."""
    g, x = built_chain(tmp_path, CountingAddOne)         # in place, and not idempotent
    want = 2 * (2 * x + 1)
    run = g.execute(x, keep_all=keep_all)
    CALLS.clear()
    with g.running():
        for step, xs, ys, _ in run:
            assert run.time_again(step, xs, ys) > 0
    assert dict(CALLS) == {name: 2 * n for name, n in FORWARD_CALLS.items()}
    np.testing.assert_array_equal(run.outputs()[0], want)
    if keep_all:
        np.testing.assert_array_equal(run.values["b"], 2 * x)
        np.testing.assert_array_equal(run.values["c"], 2 * x + 1)
    np.testing.assert_array_equal(g.forward(x)[0], want)


def test_time_again_takes_only_the_last_record(chain):
    g, x = chain
    run = g.execute(x)
    with g.running():
        first = next(run)
        next(run)
        with pytest.raises(GraphError, match="d1"):
            run.time_again(*first[:3])


def test_profile_again_adds_a_column_and_calls_each_layer_twice(chain):
    g, x = chain
    plain = g.profile(x, repeat=1, warmup=0)
    assert plain.again_seconds is None and "again ms" not in str(plain)
    CALLS.clear()
    p = g.profile(x, repeat=1, warmup=0, again=True)
    assert dict(CALLS) == {name: 2 * n for name, n in FORWARD_CALLS.items()}
    assert all(r.again_seconds > 0 for r in p.rows)
    assert p.again_seconds == pytest.approx(sum(r.again_seconds for r in p.rows))
    assert "again ms" in str(p) and "again ms" in str(p.by_type())
    assert "called again at once" in repr(p)


# ----- whole models: the debugger's outputs are forward's, bit for bit ---------------------------

def resnet_like(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """conv -> relu -> [conv -> relu -> conv] + skip -> relu, twice: in-place ReLUs unfused,
    conv + add + relu fused."""
    rng = np.random.default_rng(1)
    lines, weights = ["pnnx.Input in0 0 1 x0 #x0=(1,4,10,10)f32"], {}

    def conv(name, src, dst, cin, cout):
        lines.append(f"nn.Conv2d {name} 1 1 {src} {dst} bias=True dilation=(1,1) groups=1 "
                     f"in_channels={cin} kernel_size=(3,3) out_channels={cout} padding=(1,1) "
                     f"padding_mode=zeros stride=(1,1) @bias=({cout})f32 "
                     f"@weight=({cout},{cin},3,3)f32 #{dst}=(1,{cout},10,10)f32")
        weights[f"{name}.weight"] = rng.standard_normal((cout, cin, 3, 3), np.float32) * 0.3
        weights[f"{name}.bias"] = rng.standard_normal(cout, np.float32) * 0.1

    def relu(name, src, dst):
        lines.append(f"nn.ReLU {name} 1 1 {src} {dst} #{dst}=(1,8,10,10)f32")

    conv("stem", "x0", "s", 4, 8)
    relu("stem_relu", "s", "h0")
    for block in range(2):
        h, out = f"h{block}", f"h{block + 1}"
        conv(f"b{block}_conv1", h, f"{h}c1", 8, 8)
        relu(f"b{block}_relu1", f"{h}c1", f"{h}r1")
        conv(f"b{block}_conv2", f"{h}r1", f"{h}c2", 8, 8)
        lines.append(f"pnnx.Expression b{block}_add 2 1 {h}c2 {h} {h}a expr=add(@0,@1) "
                     f"#{h}a=(1,8,10,10)f32")
        relu(f"b{block}_relu2", f"{h}a", out)
    lines.append("pnnx.Output out0 1 0 h2")
    param, binary = write_model(tmp_path, *lines, weights=weights, name="resnet_like")
    return param, binary, weights


def torch_resnet_like(x: np.ndarray, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    def conv(name, t):
        return F.conv2d(t, torch.from_numpy(w[f"{name}.weight"]),
                        torch.from_numpy(w[f"{name}.bias"]), padding=1)

    values = {"s": conv("stem", torch.from_numpy(x))}
    values["h0"] = F.relu(values["s"])
    for block in range(2):
        h = f"h{block}"
        values[f"{h}c1"] = conv(f"b{block}_conv1", values[h])
        values[f"{h}r1"] = F.relu(values[f"{h}c1"])
        values[f"{h}c2"] = conv(f"b{block}_conv2", values[f"{h}r1"])
        values[f"{h}a"] = values[f"{h}c2"] + values[h]
        values[f"h{block + 1}"] = F.relu(values[f"{h}a"])
    return {name: v.numpy() for name, v in values.items()}


@pytest.mark.parametrize("fuse", [False, True])
def test_resnet_like_debugger_and_forward_all_agree_with_forward_bit_for_bit(tmp_path, fuse):
    param, binary, weights = resnet_like(tmp_path)
    g = RuntimeGraph(param, binary, fuse=fuse).build()
    if fuse:
        assert g.operator("b0_conv2").fused == ["b0_add", "b0_relu2"]
    else:
        assert {s.op.name for s in g.run_list if s.in_place} >= {"b0_relu1", "b1_relu1"}
    x = np.random.default_rng(2).standard_normal((1, 4, 10, 10), dtype=np.float32)
    (want,) = g.forward(x)
    np.testing.assert_array_equal(g.debug(x).finish()[0], want)
    values = g.forward_all(x)
    np.testing.assert_array_equal(values["h2"], want)
    for name, expected in torch_resnet_like(x, weights).items():
        if name in values:                                # fused away: no value of its own
            np.testing.assert_allclose(values[name], expected, atol=1e-4, err_msg=name)
    if not fuse:                                          # read by an in-place ReLU
        assert values["h0c1"].min() < 0 and values["s"].min() < 0


def test_efficientnet_lite0_debugger_outputs_are_forwards_bit_for_bit():
    folder = REPO / "model_file" / "efficientnet_lite0"
    g = RuntimeGraph(folder / "efficientnet_lite0.pnnx.param").build()
    assert g.fuse and any(op.fused for op in g.operators)
    assert sum(s.into for s in g.run_list) > 0
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224), dtype=np.float32)
    (want,) = g.forward(x)
    dbg = g.debug(x)
    dbg.break_on(type="nn.Conv2d")
    assert dbg.continue_() is not None
    (got,) = dbg.finish()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(g.forward_all(x)[g.output_operands[0].name], want)


def test_after_a_layers_error_the_debugger_asks_for_a_restart(chain):
    from infer import GraphError, LayerError

    g, x = chain
    failing = [True]

    def fail_once(op, xs):
        if op.name == "r1" and failing:
            failing.clear()
            raise LayerError("planted", operator=op.label)

    with g.add_hook(before=fail_once):
        dbg = g.debug(x)
        with pytest.raises(LayerError, match="planted"):
            dbg.run_to("d2")
        assert dbg.position == 1 and dbg.next.name == "r1"
        with pytest.raises(GraphError, match="stopped at an error in my.Relu r1.*restart"):
            dbg.step()
        np.testing.assert_array_equal(dbg.restart().finish()[0], g.forward(x)[0])


def test_a_hook_may_replace_arrays_with_other_shapes(tmp_path):
    """A before-hook that crops the stem's input to 8x8: every later step runs on the new
    shapes (no planned buffer of the old size is forced on it), as torch would compute."""
    param, binary, weights = resnet_like(tmp_path)
    graph = RuntimeGraph(param, binary).build()
    x = np.random.default_rng(3).standard_normal((1, 4, 10, 10), np.float32)

    def crop(op, inputs):
        return [inputs[0][:, :, 1:9, 1:9].copy()] if op.name == "stem" else None

    with graph.add_hook(before=crop):
        (y,) = graph.forward(x)
    want = torch_resnet_like(x[:, :, 1:9, 1:9].copy(), weights)["h2"]
    assert y.shape == (1, 8, 8, 8)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
