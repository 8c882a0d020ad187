"""Graph structure a hostile or broken file can give, and what the runtime makes of it: never
a bare exception, a silent wrong answer or quadratic work.

    names        names the runtime makes up (``<operand>.<i>`` for the pieces of a returned
                 list) never take a name the file already uses
    tuples, io   prim::TupleConstruct / TupleUnpack and pnnx.Input / pnnx.Output with the
                 wrong number of operands are GraphErrors naming the line
    annotations  '#' dtypes are hints: a graph annotated with any dtypes computes what the
                 unannotated graph computes
    inputs       0-d inputs stay 0-d; inputs of dtypes numpy has but models do not take
                 (text, StringDType, dates, records, objects) are ShapeErrors
    scale        building stays linear in the operator count (fusion, the tuple rewrites)
    threads      build() from many threads builds once; a build that fails leaves the graph new
    suggestions  "did you mean" stays cheap over 10,000 long names
"""

from __future__ import annotations

import threading
import time
import zipfile

import numpy as np
import pytest

from infer import (BinFileError, GraphError, GraphState, InferError, RuntimeGraph, ShapeError,
                   UnsupportedOperatorError)
from parser.bin import PnnxBin
from parser.suggest import close_matches
from support import conv_line, conv_weights, expect_error, model_text, write_model, write_pnnx

INPUT = "pnnx.Input in0 0 1 0 #0=(1,4)f32"
X = np.array([[-2.0, -0.5, 0.5, 2.0]], np.float32)


def build(tmp_path, *lines, weights=None, **options) -> RuntimeGraph:
    return RuntimeGraph(*write_model(tmp_path, *lines, weights=weights), **options).build()


# ----- names the runtime makes up --------------------------------------------------------------

@pytest.mark.parametrize("taken", ["t.0", "t.1", "e.0", "t.0_1"])
def test_pieces_of_a_returned_list_never_take_a_files_name(tmp_path, taken):
    """pnnx.Output reads a list [2*x, 3*relu(x)]; its pieces would be named t.0, t.1 (operands)
    and e.0, e.1 (operators), which the file may use itself."""
    lines = [INPUT, f"nn.ReLU {taken} 1 1 0 {taken}",
             f"pnnx.Expression e 2 1 0 {taken} t expr=[mul(@0,2),mul(@1,3)]",
             "pnnx.Output out 1 0 t"]
    for reference in (False, True):
        graph = build(tmp_path, *lines, reference=reference)
        first, second = graph.forward(X)
        np.testing.assert_array_equal(first, X * 2)
        np.testing.assert_array_equal(second, np.maximum(X, 0) * 3)
        names = [op.name for op in graph.operators]
        assert len(names) == len(set(names)) and taken in names


def test_many_returned_lists_with_colliding_names(tmp_path):
    """Every list piece of 50 lists whose names the file has taken in advance."""
    lines = [INPUT]
    outputs = []
    for i in range(50):
        lines.append(f"nn.ReLU l{i}.0 1 1 0 l{i}.0")
        lines.append(f"pnnx.Expression l{i} 2 1 0 l{i}.0 l{i} expr=[add(@0,{i}),@1]")
        outputs.append(f"l{i}")
    lines.append(f"pnnx.Output out {len(outputs)} 0 {' '.join(outputs)}")
    results = build(tmp_path, *lines).forward(X)
    for i in range(50):
        np.testing.assert_array_equal(results[2 * i], X + i)
        np.testing.assert_array_equal(results[2 * i + 1], np.maximum(X, 0))


# ----- malformed tuples and graph inputs / outputs ---------------------------------------------

def _tuple_lines(construct_outputs: int, unpack_inputs: int, unpack_outputs: int) -> list[str]:
    """relu(x), sigmoid(x) -> TupleConstruct -> TupleUnpack -> Output, with counts changed."""
    built = " ".join(f"t{i}" for i in range(construct_outputs))
    read = " ".join((["t0"] + ["1"] * unpack_inputs)[:unpack_inputs]) if construct_outputs \
        else " ".join(["1"] * unpack_inputs)
    members = " ".join(f"m{i}" for i in range(unpack_outputs))
    lines = [INPUT, "nn.ReLU r 1 1 0 1", "nn.Sigmoid s 1 1 0 2",
             f"prim::TupleConstruct tc 2 {construct_outputs} 1 2 {built}".rstrip(),
             f"prim::TupleUnpack tu {unpack_inputs} {unpack_outputs} {read} {members}"]
    outs = members or "1"
    lines.append(f"pnnx.Output out {len(outs.split())} 0 {outs}")
    return lines


@pytest.mark.parametrize("construct_outputs, unpack_inputs, unpack_outputs", [
    (1, 1, 1), (1, 1, 3), (1, 1, 0), (2, 1, 2), (0, 1, 2), (1, 2, 2), (1, 0, 2), (3, 1, 2)])
def test_tuple_operators_with_wrong_counts(tmp_path, construct_outputs, unpack_inputs,
                                           unpack_outputs):
    lines = _tuple_lines(construct_outputs, unpack_inputs, unpack_outputs)
    graph = RuntimeGraph(*write_model(tmp_path, *lines))
    with pytest.raises(InferError) as info:
        graph.build()
    error = info.value
    assert "model.pnnx.param" in str(error) or error.operator, str(error)
    assert graph.state is GraphState.NEED_INIT


def test_tuple_unpack_of_the_right_size_runs(tmp_path):
    relu, sigmoid = build(tmp_path, *_tuple_lines(1, 1, 2)).forward(X)
    np.testing.assert_array_equal(relu, np.maximum(X, 0))
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-X)), rtol=1e-6)


@pytest.mark.parametrize("line, words", [
    ("pnnx.Input in0 0 0", ("pnnx.Input in0", "gives 0")),
    ("pnnx.Input in0 0 2 0 9", ("pnnx.Input in0", "gives 2")),
    ("pnnx.Input in0 1 1 9 0", ("pnnx.Input in0", "reads 1")),
])
def test_graph_input_with_wrong_counts(tmp_path, line, words):
    lines = [line, "nn.ReLU r 1 1 0 1", "pnnx.Output out 1 0 1"]
    if " 1 1 9 0" in line:
        lines.insert(0, "pnnx.Input src 0 1 9")
    expect_error(GraphError, lambda: build(tmp_path, *lines), "model.pnnx.param:", *words)


@pytest.mark.parametrize("line, words", [
    ("pnnx.Output out 1 1 1 2", ("gives 1",)),
    ("pnnx.Output out 0 0", ("reads 0",)),
])
def test_graph_output_with_wrong_counts(tmp_path, line, words):
    lines = [INPUT, "nn.ReLU r 1 1 0 1", line]
    if " 0 0" in line:
        lines.insert(2, "pnnx.Output real 1 0 1")
    expect_error(GraphError, lambda: build(tmp_path, *lines), "model.pnnx.param:", *words)


# ----- '#' annotations are hints -------------------------------------------------------------

DTYPES = ["f32", "f16", "bf16", "f64", "i8", "u8", "i64", "bool", "c64", "null"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_dtype_annotations_never_change_results(tmp_path, dtype, reference):
    """The same convolution graph with every intermediate annotated ``dtype``: the result is
    the unannotated graph's, to the bit (no rounding into f16 buffers, no casts)."""
    def lines(annotation: str) -> list[str]:
        tag = lambda n: f" #{n}=(1,4,6,6){annotation}" if annotation else ""   # noqa: E731
        return ["pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line() + tag(1),
                "nn.ReLU relu 1 1 1 2" + tag(2), "nn.Sigmoid sig 1 1 2 3" + tag(3),
                "nn.Hardswish hs 1 1 1 4" + tag(4),
                "pnnx.Expression add 2 1 3 4 5 expr=add(@0,@1)" + tag(5),
                "pnnx.Output out0 1 0 5"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32) * 3.3
    plain = build(tmp_path / "plain", *lines(""), weights=conv_weights(),
                  reference=reference).forward(x)[0]
    annotated = build(tmp_path / "annotated", *lines(dtype), weights=conv_weights(),
                      reference=reference)
    for _ in range(2):                                     # the arena's second use too
        result = annotated.forward(x)[0]
        assert result.dtype == np.float32
        np.testing.assert_array_equal(result, plain)


# ----- odd inputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("annotation", ["#0=()f32", ""])
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_a_0d_input_stays_0d(tmp_path, annotation, reference):
    graph = build(tmp_path, f"pnnx.Input in0 0 1 0 {annotation}".strip(), "nn.ReLU r 1 1 0 1",
                  "pnnx.Expression e 1 1 1 2 expr=mul(@0,2)", "pnnx.Output out 1 0 2",
                  reference=reference)
    for value in (-3.0, 3.0):
        (y,) = graph.forward(np.array(value, np.float32))
        assert y.shape == () and y == max(value, 0) * 2
    for x in (np.array(1.5), np.float64(1.5), np.float32(1.5)):   # cast; a scalar is 0-d
        (y,) = graph.forward(x)
        assert y.shape == () and y.dtype == np.float32 and y == 3


@pytest.mark.parametrize("array", [
    np.array(["a", "b", "c", "d"]).reshape(1, 4),
    np.array([b"a", b"b", b"c", b"d"]).reshape(1, 4),
    np.array(["a", "b", "c", "d"], dtype=np.dtypes.StringDType()).reshape(1, 4),
    np.array(["2026-01-01"] * 4, dtype="datetime64[D]").reshape(1, 4),
    np.zeros((1, 4), dtype=[("a", "f4")]),
    np.array([[None, 1, 2.0, "x"]], dtype=object),
    np.zeros((1, 4), dtype=np.complex64),
], ids=["str", "bytes", "StringDType", "datetime", "record", "object", "complex"])
def test_inputs_of_dtypes_a_model_does_not_take(tmp_path, array):
    graph = build(tmp_path, INPUT, "nn.ReLU r 1 1 0 1", "pnnx.Output out 1 0 1")
    expect_error(ShapeError, lambda: graph.forward(array), "dtype", "float32")


# ----- scale: build stays linear ----------------------------------------------------------------

def _chain_build_seconds(folder, count: int, unit: list[str]) -> float:
    """Seconds to build ``count`` copies of ``unit`` chained one after another: lines with {i}
    (the operand read), {o} (the one written) and {n} (the copy's number); an nn.Linear in
    the unit gets 4x4 weights."""
    lines = [INPUT]
    for n in range(count):
        lines += [line.format(i=f"v{n}" if n else "0", o=f"v{n + 1}", n=n) for line in unit]
    lines.append(f"pnnx.Output out 1 0 v{count}")
    weights = {f"fc{n}.weight": np.eye(4, dtype=np.float32)
               for n in range(count)} if "Linear" in unit[0] else {}
    param, binary = write_pnnx(folder / str(count), model_text(*lines), weights)
    started = time.perf_counter()
    RuntimeGraph(param, binary).build()
    return time.perf_counter() - started


@pytest.mark.slow
@pytest.mark.parametrize("unit", [
    ["nn.ReLU r{n} 1 1 {i} {o}"],
    ["prim::TupleConstruct t{n} 1 1 {i} t{n}", "prim::TupleUnpack u{n} 1 1 t{n} {o}"],
    ["nn.Linear fc{n} 1 1 {i} a{n} bias=False in_features=4 out_features=4 "
     "@weight=(4,4)f32", "nn.ReLU r{n} 1 1 a{n} {o}"],
], ids=["relu", "tuples", "linear_relu"])
def test_build_time_grows_linearly_with_the_operator_count(tmp_path, unit):
    """Four times the operators take about four times as long (quadratic work: sixteen)."""
    _chain_build_seconds(tmp_path / "warm", 100, unit)
    ratio = (_chain_build_seconds(tmp_path, 12000, unit)
             / _chain_build_seconds(tmp_path, 3000, unit))
    assert ratio < 9, f"building 4x the operators took {ratio:.1f}x as long"


# ----- threads and failed builds ------------------------------------------------------------

def test_build_from_many_threads_builds_once(tmp_path):
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                                "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2",
                                weights=conv_weights())
    graph = RuntimeGraph(param, binary)
    x = np.ones((1, 3, 8, 8), np.float32)
    expected = RuntimeGraph(param, binary).build().forward(x)[0]
    barrier, errors, layers = threading.Barrier(8), [], set()

    def run() -> None:
        try:
            barrier.wait()
            graph.build()
            layers.add(id(graph.operator("conv").layer))
            np.testing.assert_array_equal(graph.forward(x)[0], expected)
        except Exception as exc:                # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(layers) == 1 and graph.state is GraphState.COMPLETE


def test_a_failed_build_leaves_the_graph_new(tmp_path):
    """A missing weight fails the build half-way (after some layers exist); the graph is back
    to NEED_INIT, and builds once the file is fixed."""
    lines = ["pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(), "nn.ReLU relu 1 1 1 2",
             "pnnx.Output out0 1 0 2"]
    param, binary = write_model(tmp_path, *lines, weights={"conv.weight": np.ones(3)})
    graph = RuntimeGraph(param, binary)
    expect_error(BinFileError, graph.build)
    assert graph.state is GraphState.NEED_INIT
    expect_error(GraphError, lambda: graph.forward(np.ones((1, 3, 8, 8), np.float32)),
                 "call build()")
    write_model(tmp_path, *lines, weights=conv_weights())
    assert graph.build().forward(np.ones((1, 3, 8, 8), np.float32))[0].shape == (1, 4, 6, 6)


# ----- suggestions --------------------------------------------------------------------------

def test_missing_entry_among_10000_long_names_is_reported_quickly(tmp_path):
    path = tmp_path / "model.pnnx.bin"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(10000):
            archive.writestr(f"{'layer_' * 150}{i}.weight", b"")
    with PnnxBin(path) as binary:
        for key in ("layer_" * 150 + "x.weight", "layer_" * 149 + "12.weigh", "conv.weight",
                    "x" * 100_000):
            started = time.perf_counter()
            error = expect_error(BinFileError, lambda: binary.read(key, (0,), "f32"),  # noqa: B023
                                 "no such entry")
            assert time.perf_counter() - started < 2
            assert len(str(error)) < 2000


def test_unknown_operator_with_a_huge_type_name(tmp_path):
    name = "nn." + "Conv2" * 100_000
    started = time.perf_counter()
    error = expect_error(UnsupportedOperatorError,
                         lambda: build(tmp_path, "pnnx.Input in0 0 1 0",
                                       f"{name} op 1 1 0 1", "pnnx.Output out 1 0 1"))
    assert time.perf_counter() - started < 5 and len(str(error)) < 3000


def test_close_matches_bounds_its_work():
    names = [f"{'block_' * 40}{i}.conv" for i in range(20000)]
    started = time.perf_counter()
    assert close_matches("block_" * 40 + "19999.conv", names)[0].endswith("19999.conv")
    assert close_matches("zzz", names) == []
    assert time.perf_counter() - started < 2
    assert close_matches("nn.ReLu", ["nn.ReLU", "nn.ReLU6", "nn.GELU"], cutoff=0.75)[0] \
        == "nn.ReLU"


def test_one_operand_repeated_in_a_tuple_builds_quickly(tmp_path):
    """A tuple of n copies of one operand, read by n graph outputs: unpacking it once per
    copy would be cubic work (minutes for n = 2000 in a 55 KB file)."""
    n = 1500
    lines = [INPUT, "nn.ReLU r 1 1 0 1",
             f"prim::TupleConstruct t {n} 1 {' '.join(['1'] * n)} tup"]
    lines += [f"pnnx.Output out{i} 1 0 tup" for i in range(n)]
    started = time.perf_counter()
    outputs = build(tmp_path, *lines).forward(X)
    assert time.perf_counter() - started < 20 and len(outputs) == n * n
    np.testing.assert_array_equal(outputs[-1], np.maximum(X, 0))


ONE_INPUT_TYPES = ["nn.ReLU", "nn.GELU", "F.gelu", "nn.ELU", "nn.Softplus", "nn.Mish",
                   "nn.SiLU", "nn.Sigmoid", "nn.Tanh", "nn.Hardswish", "nn.LeakyReLU",
                   "F.softmax", "nn.Softmin", "nn.LogSoftmax", "nn.Hardsigmoid", "nn.SELU"]


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("type_name", ONE_INPUT_TYPES)
def test_elementwise_layers_on_a_0d_input(tmp_path, type_name, reference):
    """A 0-d input gives the 0-d result the (1,)-shaped input gives, on every floor."""
    results = []
    for annotation, x in (("#0=()f32", np.array(0.7, np.float32)),
                          ("#0=(1)f32", np.array([0.7], np.float32))):
        graph = build(tmp_path / str(x.ndim), f"pnnx.Input in0 0 1 0 {annotation}",
                      f"{type_name} op 1 1 0 1", "pnnx.Output out 1 0 1", reference=reference)
        results.append(graph.forward(x)[0])
    assert results[0].shape == () and results[1].shape == (1,)
    np.testing.assert_allclose(results[0].reshape(1), results[1], rtol=1e-6)


@pytest.mark.parametrize("lines", [
    ["prim::TupleConstruct t 2 1 0 a a", "pnnx.Output out 1 0 0"],
    ["prim::TupleConstruct t 1 1 a a", "pnnx.Output out 1 0 0"],
    ["prim::TupleConstruct c 2 1 x 0 p", "prim::TupleUnpack u 1 2 p x y", "pnnx.Output out 1 0 0"],
    ["prim::TupleConstruct c 2 1 x 0 p", "prim::TupleUnpack u 1 2 p y x", "pnnx.Output out 1 0 0"],
    ["nn.ReLU r 1 1 0 1", "prim::TupleUnpack u 1 1 a a", "pnnx.Output out 1 0 1"],
], ids=["reads_itself", "reads_itself_once", "unpacks_into_its_tuple", "swapped", "unpack_loop"])
def test_cycles_through_tuple_operators_are_refused_before_unpacking(tmp_path, lines):
    """Found by the fuzzer: unpacking a tuple that reads itself grew a list forever (23 GB);
    cycles are refused before the rewrites run."""
    expect_error(GraphError, lambda: build(tmp_path, "pnnx.Input in0 0 1 0 #0=(2,3)f32", *lines),
                 "model.pnnx.param:")


@pytest.mark.parametrize("outputs", ["2 0 a b", "1 0 a"])
def test_unpacking_a_graph_input_is_refused(tmp_path, outputs):
    """Found by the fuzzer: a TupleUnpack of a pnnx.Input's operand made the input give two
    operands (a bare KeyError at forward, or a silently malformed graph)."""
    expect_error(GraphError, lambda: build(tmp_path, "pnnx.Input in0 0 1 0 #0=(2,3)f32",
                                           "prim::TupleUnpack u 1 2 0 a b",
                                           f"pnnx.Output out {outputs}"),
                 "graph input is one array")
