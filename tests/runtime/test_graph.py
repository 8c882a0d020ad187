"""RuntimeGraph: wiring by name, topological order, shared buffers, release, custom layers,
shape plans, input rules, several inputs and outputs."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infer import (GraphError, GraphState, Layer, LayerError, LayerRegisterer, Param,
                   RegistryError, RuntimeGraph, ShapeError, UnsupportedOperatorError,
                   register_layer)
from layers.base import as_float
from support import write_pnnx


class Scale(Layer):
    """y = x * factor: a custom layer, registered per graph in these tests."""

    PARAMS = {"factor": Param(2.0, as_float)}

    def forward_one(self, x):
        return x * np.float32(self.factor)


class SplitHalves(Layer):
    """Two outputs: the first and second half of the channel dim."""

    one_blob_only = False

    def infer_shapes(self, shapes):
        (n, c, *rest) = shapes[0]
        return [(n, c // 2, *rest), (n, c - c // 2, *rest)]

    def forward(self, inputs):
        x = inputs[0]
        half = x.shape[1] // 2
        return [x[:, :half], x[:, half:]]


class Recorder(Layer):
    """Identity that remembers the arrays it saw (to test buffer sharing and release)."""

    seen: list = []

    def forward_one(self, x):
        Recorder.seen.append(x)
        return x


CHAIN = """
7767517
5 5
pnnx.Input   in0   0 1 a #a=(1,4,3,3)f32
my.Scale     s1    1 1 a b factor=3.0
my.Scale     s2    1 1 b c factor=0.5
my.Split     sp    1 2 c d e
pnnx.Output  out0  2 0 d e
"""


def build(tmp_path, text, customs=None, weights=None, name="model"):
    param, binary = write_pnnx(tmp_path, text, weights, name=name)
    graph = RuntimeGraph(param, binary)
    for type_name, layer_class in (customs or {}).items():
        graph.register_custom_layer(type_name, layer_class)
    return graph.build()


def test_custom_layers_several_outputs_and_states(tmp_path):
    param, binary = write_pnnx(tmp_path, CHAIN)
    graph = RuntimeGraph(param, binary)
    assert graph.state is GraphState.NEED_INIT
    with pytest.raises(GraphError, match="build"):
        graph.forward(np.zeros((1, 4, 3, 3), np.float32))
    graph.register_custom_layer("my.Scale", Scale)
    graph.register_custom_layer("my.Split", SplitHalves)
    graph.build()
    assert graph.state is GraphState.COMPLETE
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    d, e = graph.forward(x)
    np.testing.assert_allclose(d, x[:, :2] * 1.5, rtol=1e-6)
    np.testing.assert_allclose(e, x[:, 2:] * 1.5, rtol=1e-6)
    with pytest.raises(GraphError, match="before build"):
        graph.register_custom_layer("my.Other", Scale)


def test_custom_layer_is_per_graph(tmp_path):
    assert not LayerRegisterer().has("my.Scale")
    with pytest.raises(UnsupportedOperatorError) as info:
        build(tmp_path, CHAIN)
    message = str(info.value)
    assert "model.pnnx.param:4" in message and "my.Scale" in message and "my.Split" in message


def test_unknown_operator_names_closest_types(tmp_path):
    text = """
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(1,2)f32
    nn.ReLu     act  1 1 a b
    pnnx.Output out0 1 0 b
    """
    with pytest.raises(UnsupportedOperatorError, match=r"nn\.ReLU") as info:
        build(tmp_path, text)
    assert info.value.operator == "nn.ReLu act"


def test_registry_lists_types_and_refuses_duplicates():
    registry = LayerRegisterer()
    assert registry is LayerRegisterer()
    types = registry.types()
    for name in ("nn.Conv2d", "nn.ReLU", "pnnx.Expression", "pnnx.Input", "nn.Linear"):
        assert name in types
    with pytest.raises(RegistryError, match="already registered"):
        register_layer("nn.ReLU")(Scale)
    register_layer("test.Scale")(Scale)
    try:
        assert registry.create("test.Scale", "s").factor == 2.0
    finally:
        registry.unregister("test.Scale")


def test_lines_out_of_order_are_sorted(tmp_path):
    text = """
    7767517
    5 4
    pnnx.Output out0 1 0 c
    my.Scale    s2   1 1 b c factor=0.5
    my.Scale    s1   1 1 a b factor=3.0
    pnnx.Input  in0  0 1 a #a=(2,3)f32
    pnnx.Expression add 2 1 a a z expr=add(@0,@1)
    """
    graph = build(tmp_path, text, {"my.Scale": Scale})
    order = [op.name for op in graph.operators]
    assert order.index("in0") < order.index("s1") < order.index("s2") < order.index("out0")
    for op in graph.operators:                    # every producer runs before its consumers
        for src in op.inputs:
            assert order.index(src.producer.name) < order.index(op.name)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(graph.forward(x)[0], x * 1.5)


def test_topological_order_can_be_watched_step_by_step(tmp_path):
    text = """
    7767517
    5 4
    pnnx.Input  in0  0 1 a #a=(2,3)f32
    my.Scale    s1   1 1 a b factor=3.0
    my.Scale    s2   1 1 a c factor=0.5
    pnnx.Expression add 2 1 b c d expr=add(@0,@1)
    pnnx.Output out0 1 0 d
    """
    param, binary = write_pnnx(tmp_path, text)
    graph = RuntimeGraph(param, binary)          # not even init(): the sort reads the file
    events = []
    order = graph.topological_order(on_visit=lambda event, op: events.append((event, op.name)))
    # depth first from in0: s1 leads to add and out0; s2 meets add again, already finished
    assert events == [("enter", "in0"), ("enter", "s1"), ("enter", "add"), ("enter", "out0"),
                      ("finish", "out0"), ("finish", "add"), ("finish", "s1"),
                      ("enter", "s2"), ("seen", "add"), ("finish", "s2"), ("finish", "in0")]
    finished = [name for event, name in events if event == "finish"]
    assert [op.name for op in order] == finished[::-1] == ["in0", "s2", "s1", "add", "out0"]
    graph.register_custom_layer("my.Scale", Scale)
    graph.build()                                # build() runs the same sort
    assert [op.name for op in graph.operators] == finished[::-1]
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(graph.forward(x)[0], x * 3.5)


def test_cycle_is_refused_naming_an_operator(tmp_path):
    text = """
    7767517
    4 3
    pnnx.Input  in0  0 1 a #a=(2,3)f32
    pnnx.Expression e1 2 1 a c b expr=add(@0,@1)
    my.Scale    s1   1 1 b c
    pnnx.Output out0 1 0 c
    """
    with pytest.raises(GraphError, match="cycle") as info:
        build(tmp_path, text, {"my.Scale": Scale})
    assert info.value.operator in ("pnnx.Expression e1", "my.Scale s1")


def test_operand_never_produced_and_produced_twice(tmp_path):
    never = """
    7767517
    2 2
    pnnx.Input  in0  0 1 a
    pnnx.Output out0 1 0 zz
    """
    with pytest.raises(GraphError, match=r"model\.pnnx\.param:4: operand 'zz'"):
        build(tmp_path, never)
    twice = """
    7767517
    3 1
    pnnx.Input  in0  0 1 a
    pnnx.Input  in1  0 1 a
    pnnx.Output out0 1 0 a
    """
    with pytest.raises(GraphError, match="produced twice"):
        build(tmp_path, twice, name="twice")


def test_consumer_reads_producer_array_and_intermediates_are_released(tmp_path):
    """b is read by r1 and r2 (the very array s1 returned) and dropped after r2, its last
    consumer: when the last operator runs, nothing holds b any more."""
    text = """
    7767517
    6 5
    pnnx.Input  in0  0 1 a #a=(1,2)f32
    my.Scale    s1   1 1 b_src b
    my.Record   r1   1 1 b c
    my.Record   r2   1 1 b d
    my.Check    s3   2 1 c d e
    pnnx.Output out0 1 0 e
    """.replace("b_src", "a")
    produced, alive_at_check = [], []

    class Tracked(Scale):
        def forward_one(self, x):
            y = super().forward_one(x)
            produced.append(weakref.ref(y))
            return y

    class Copy(Layer):
        def forward_one(self, x):
            return x.copy()

    class Check(Layer):
        one_blob_only = False

        def infer_shapes(self, shapes):
            return [shapes[0]]

        def forward(self, inputs):
            gc.collect()
            alive_at_check.append(produced[-1]() is not None)
            return [inputs[0] + inputs[1]]

    graph = build(tmp_path, text, {"my.Scale": Tracked, "my.Record": Copy, "my.Check": Check})
    x = np.ones((1, 2), np.float32)
    captured = []

    class Capture(Copy):
        def forward_one(self, x):
            captured.append((x, produced[-1]()))
            return x.copy()

    graph.forward(x)
    assert alive_at_check == [False]          # released after r2, its last consumer
    graph = build(tmp_path / "2", text, {"my.Scale": Tracked, "my.Record": Capture,
                                          "my.Check": Check})
    out = graph.forward(x)[0]
    np.testing.assert_allclose(out, 4.0)
    (seen1, made1), (seen2, made2) = captured
    assert seen1 is made1 and seen2 is made1  # both consumers got the array s1 returned


def test_inplace_layer_never_writes_the_callers_input(tmp_path):
    text = """
    7767517
    4 3
    pnnx.Input  in0  0 1 a #a=(2,5)f32
    nn.ReLU     r1   1 1 a b
    nn.ReLU     r2   1 1 b c
    pnnx.Output out0 1 0 c
    """
    graph = build(tmp_path, text)
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    before = x.copy()
    (y,) = graph.forward(x)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(y, np.maximum(before, 0))


def test_input_rules(tmp_path):
    graph = build(tmp_path, CHAIN, {"my.Scale": Scale, "my.Split": SplitHalves})
    x = np.random.default_rng(1).standard_normal((1, 4, 3, 3))
    with pytest.raises(ShapeError, match="takes 1 input"):
        graph.forward(x, x)
    with pytest.raises(ShapeError, match="rank"):
        graph.forward(x[0])
    with pytest.raises(ShapeError, match="int64"):
        graph.forward(x.astype(np.int64))
    with pytest.raises(ShapeError, match="numpy array"):
        graph.forward(x.tolist())
    d64, _ = graph.forward(x)                                 # float64 is cast to float32
    assert d64.dtype == np.float32
    strided = np.asfortranarray(x.astype(np.float32))         # non-contiguous works
    d, e = graph.forward(strided)
    np.testing.assert_allclose(d, x[:, :2] * 1.5, rtol=1e-6)


def test_nan_and_inf_propagate(tmp_path):
    graph = build(tmp_path, CHAIN, {"my.Scale": Scale, "my.Split": SplitHalves})
    x = np.zeros((1, 4, 3, 3), np.float32)
    x[0, 0, 0, 0], x[0, 3, 1, 1] = np.nan, np.inf
    d, e = graph.forward(x)
    assert np.isnan(d[0, 0, 0, 0]) and np.isinf(e[0, 1, 1, 1])


def test_layer_errors_name_the_operator(tmp_path):
    class Broken(Layer):
        def forward_one(self, x):
            return x.reshape(7, 7)        # a bug: numpy raises ValueError

    text = """
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(2,3)f32
    my.Broken   oops 1 1 a b
    pnnx.Output out0 1 0 b
    """
    graph = build(tmp_path, text, {"my.Broken": Broken})
    with pytest.raises(LayerError, match="my.Broken oops") as info:
        graph.forward(np.zeros((2, 3), np.float32))
    assert isinstance(info.value.__cause__, ValueError)


def test_two_inputs_three_outputs_against_torch(pnnx_export):
    class Model(torch.nn.Module):
        def forward(self, x, y):
            a = torch.relu(x) * 2.0 + y
            return a, torch.sigmoid(a - 1.0), F.adaptive_avg_pool2d(x, 1) * 3.0 - 1.0

    torch.manual_seed(0)
    x, y = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    param, binary = pnnx_export(Model(), (x, y), "two_in_three_out")
    graph = RuntimeGraph(param, binary).build()
    outs = graph.forward(x.numpy(), y.numpy())
    want = Model()(x, y)
    assert len(outs) == 3
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5, rtol=1e-5)


def test_outputs_are_writeable_without_touching_inputs_or_constants(tmp_path):
    """A flatten of the input (a read-only view) and a constant (a view of the bin file) come
    out as arrays the caller may change, as torch's outputs are."""
    text = """
    7767517
    4 3
    pnnx.Input     in0   0 1 a #a=(2,3)f32
    torch.flatten  flat  1 1 a b end_dim=-1 start_dim=0
    pnnx.Attribute const 0 1 c @data=(2)f32
    pnnx.Output    out0  2 0 b c
    """
    graph = build(tmp_path, text, weights={"const.data": np.array([1, 2], np.float32)})
    x = np.zeros((2, 3), np.float32)
    flat, const = graph.forward(x)
    flat += 1
    const *= 10
    assert (x == 0).all()
    np.testing.assert_array_equal(graph.forward(x)[1], [1, 2])


def test_wrong_input_shape_is_refused_before_running(tmp_path):
    text = """
    7767517
    4 3
    pnnx.Input  in0  0 1 a #a=(1,3,8,8)f32
    nn.Conv2d   conv 1 1 a b bias=False dilation=(1,1) groups=1 in_channels=3 kernel_size=(3,3) out_channels=4 padding=(1,1) padding_mode=zeros stride=(1,1) @weight=(4,3,3,3)f32 #b=(1,4,8,8)f32
    my.Record   rec  1 1 b c
    pnnx.Output out0 1 0 c
    """  # noqa: E501
    weights = {"conv.weight": np.ones((4, 3, 3, 3), np.float32)}
    Recorder.seen = []
    graph = build(tmp_path, text, {"my.Record": Recorder}, weights)
    with pytest.raises(ShapeError) as info:
        graph.forward(np.zeros((1, 5, 8, 8), np.float32))
    assert info.value.operator == "nn.Conv2d conv"
    assert Recorder.seen == []
    shapes = graph.infer_shapes((2, 3, 16, 16))
    assert shapes["c"] == (2, 4, 16, 16)


def test_annotation_that_disagrees_with_the_layer_is_refused(tmp_path):
    text = """
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(1,3,8,8)f32
    nn.ReLU     act  1 1 a b #b=(1,3,8,9)f32
    pnnx.Output out0 1 0 b
    """
    with pytest.raises(ShapeError, match=r"model\.pnnx\.param:4.*\(1, 3, 8, 9\)"):
        build(tmp_path, text)


def test_a_mis_exported_operator_is_named_not_the_one_its_shape_trips(tmp_path):
    """A PixelShuffle whose '#' output contradicts what PixelShuffle computes (and not in the
    way pnnx's fold fusion leaves one, which infer/rewrite.py mends: here the sizes differ);
    the convolution after it would refuse its input. The error names the operator whose
    annotation its own computation contradicts."""
    text = """
    7767517
    4 3
    pnnx.Input       in0   0 1 a #a=(1,8,2,2)f32
    nn.PixelShuffle  ps    1 1 a b upscale_factor=2 #b=(1,8,4,4)f32
    nn.Conv2d        conv  1 1 b c bias=False dilation=(1,1) groups=1 in_channels=8 kernel_size=(1,1) out_channels=2 padding=(0,0) padding_mode=zeros stride=(1,1) @weight=(2,8,1,1)f32 #c=(1,2,4,4)f32
    pnnx.Output      out0  1 0 c
    """  # noqa: E501
    with pytest.raises(ShapeError, match=r"param:4: operand b is annotated \(1, 8, 4, 4\) but "
                                         r"nn.PixelShuffle ps computes \(1, 2, 4, 4\)") as info:
        build(tmp_path, text, weights={"conv.weight": np.ones((2, 8, 1, 1), np.float32)})
    assert info.value.operator == "nn.PixelShuffle ps"


def test_set_num_threads(tmp_path):
    graph = build(tmp_path, CHAIN, {"my.Scale": Scale, "my.Split": SplitHalves})
    x = np.ones((1, 4, 3, 3), np.float32)
    graph.set_num_threads(1)
    one = graph.forward(x)
    graph.set_num_threads(2)
    two = graph.forward(x)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(GraphError):
        graph.set_num_threads(0)


def test_shape_computed_in_the_graph_runs_at_any_batch(pnnx_export):
    """A dynamic export writes x.view(x.size(0), -1) as a reshape whose target shape is a
    pnnx.Expression [size(@0,0),-1]; the graph evaluates it while planning shapes."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return y.view(y.size(0), -1) * 2.0

    torch.manual_seed(0)
    model = Model().eval()
    param, binary = pnnx_export(model, (torch.rand(1, 3, 8, 8),), "dynamic_view", dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    assert any(op.type == "pnnx.Expression" and "size" in op.params["expr"].value
               for op in graph.operators)
    for shape in [(1, 3, 8, 8), (3, 3, 12, 10)]:
        x = torch.rand(*shape)
        (got,) = graph.forward(x.numpy())
        np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-5)
        out_name = graph.output_operands[0].name
        assert graph.infer_shapes(shape)[out_name] == got.shape


@pytest.mark.parametrize("mode", ["memory", "map"])
@pytest.mark.parametrize("op_name, aligned_in_file", [("conv", False), ("conv_ab", True)])
def test_weights_are_aligned_views_or_aligned_copies(tmp_path, op_name, aligned_in_file, mode):
    """An entry's bytes start 30 + len(name) bytes into this zip: 'conv.weight' lands at an
    odd address, 'conv_ab.weight' at a multiple of 4. Read into memory (the default), each
    entry starts on a 64-byte boundary of the buffer: a view either way. Mapped, the odd one is
    copied once, aligned, for BLAS; the other is a zero-copy view over the memory map. Either
    way the weight is read-only."""
    text = f"""
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(1,3,4,4)f32
    nn.Conv2d   {op_name} 1 1 a b bias=False dilation=(1,1) groups=1 in_channels=3 kernel_size=(1,1) out_channels=2 padding=(0,0) padding_mode=zeros stride=(1,1) @weight=(2,3,1,1)f32
    pnnx.Output out0 1 0 b
    """  # noqa: E501
    weight = np.arange(6, dtype=np.float32).reshape(2, 3, 1, 1)
    param, binary = write_pnnx(tmp_path, text, {f"{op_name}.weight": weight})
    graph = RuntimeGraph(param, binary, weights=mode).build()
    data = graph.operator(op_name).attrs["weight"].data
    assert data.flags.aligned and not data.flags.writeable
    assert (not data.flags.owndata) == (aligned_in_file or mode == "memory")
    if mode == "memory":
        assert data.ctypes.data % 64 == 0
    np.testing.assert_array_equal(data, weight)
    x = np.ones((1, 3, 4, 4), np.float32)
    np.testing.assert_allclose(graph.forward(x)[0][0, :, 0, 0], weight.sum(axis=(1, 2, 3)))


def test_shape_plans_are_kept_for_a_bounded_number_of_sizes(tmp_path):
    from infer.graph import MAX_SHAPE_PLANS

    text = """
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(1,?)f32
    nn.ReLU     act  1 1 a b
    pnnx.Output out0 1 0 b
    """
    graph = build(tmp_path, text)
    for width in range(1, MAX_SHAPE_PLANS + 10):
        graph.forward(np.ones((1, width), np.float32))
    assert len(graph._shape_plans) == MAX_SHAPE_PLANS


def test_integer_inputs_take_integer_arrays(tmp_path):
    text = """
    7767517
    3 2
    pnnx.Input  in0  0 1 a #a=(2,3)i64
    pnnx.Expression twice 1 1 a b expr=mul(@0,2)
    pnnx.Output out0 1 0 b
    """
    graph = build(tmp_path, text)
    (y,) = graph.forward(np.arange(6, dtype=np.int32).reshape(2, 3))     # int32 -> int64
    assert y.dtype == np.int64 and y.tolist() == [[0, 2, 4], [6, 8, 10]]
    with pytest.raises(ShapeError, match="float32.*takes int64"):
        graph.forward(np.zeros((2, 3), np.float32))


class PreparingScale(Scale):
    """Scale that records whether the graph asked it to prepare for unknown shapes."""

    prepared = 0

    def prepare(self, input_shapes):
        if input_shapes is None:
            type(self).prepared += 1


@pytest.mark.parametrize("shape, calls", [("(1,4,3,3)", 0), ("(?,4,?,?)", 1)])
def test_layers_prepare_at_build_when_the_input_shapes_are_unknown(tmp_path, shape, calls):
    """With sizes known only at run time, build() lets each layer do then what any size
    needs (infer_shape prepares for known sizes instead)."""
    PreparingScale.prepared = 0
    text = f"""
7767517
3 2
pnnx.Input   in0   0 1 a #a={shape}f32
my.Scale     s1    1 1 a b factor=3.0
pnnx.Output  out0  1 0 b
"""
    graph = build(tmp_path, text, {"my.Scale": PreparingScale})
    assert PreparingScale.prepared == calls
    np.testing.assert_allclose(graph.forward(np.ones((2, 4, 3, 3), np.float32) if calls
                                             else np.ones((1, 4, 3, 3), np.float32))[0], 3)


@pytest.mark.parametrize("type_name, suggested", [
    ("nn.ReLu", "did you mean nn.ReLU"), ("nn.Conv2D", "nn.Conv2d"), ("F.Relu", "F.relu")])
def test_suggestions_come_from_the_same_namespace(type_name, suggested):
    from layers.registry import unsupported_message

    message = unsupported_message(type_name, LayerRegisterer().types())
    assert suggested in message and "register_custom_layer" in message


@pytest.mark.parametrize("type_name", ["torch.fft.rfft", "aten::bucketize", "torch.nonzero"])
def test_no_suggestion_is_noise_for_a_type_of_another_namespace(type_name):
    """torch.fft.rfft used to suggest torch.t: nothing close in its namespace, no guess."""
    from layers.registry import unsupported_message

    message = unsupported_message(type_name, LayerRegisterer().types())
    assert "did you mean" not in message and "register_custom_layer" in message


def test_the_build_leaves_the_collector_no_young_objects_to_scan(tmp_path):
    """The build runs with the cyclic collector paused, then collects the young generations
    itself, so that the first inference does not pay for scanning what the build made."""
    lines = (["pnnx.Input in 0 1 x0 #x0=(1,2)f32"]
             + [f"nn.ReLU r{i} 1 1 x{i} x{i + 1}" for i in range(300)]
             + ["pnnx.Output out 1 0 x300"])
    text = "\n".join(["7767517", f"{len(lines)} 301", *lines])
    graph = build(tmp_path, text)
    young = len(gc.get_objects(generation=0)) + len(gc.get_objects(generation=1))
    assert gc.isenabled() and young < 1000    # left young, this graph's would be about 7,800
    assert graph.forward(np.full((1, 2), -1.0, np.float32))[0].tolist() == [[0.0, 0.0]]
