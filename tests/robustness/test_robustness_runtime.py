"""The runtime under stress: one graph shared by threads, thread caps that overlap, ten
thousand forwards without growing memory, and no model text ever executed."""

from __future__ import annotations

import ast
import builtins
import gc
import marshal
import os
import pickle
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from infer import Layer, RuntimeGraph
from layers.fast import workers
from support import REPO, conv_line, conv_weights, write_model

LITE0 = REPO / "model_file" / "efficientnet_lite0" / "efficientnet_lite0.pnnx.param"


@pytest.fixture(scope="module")
def lite0():
    return RuntimeGraph(LITE0).build()


def small_model(folder: Path) -> RuntimeGraph:
    """conv -> relu (in place) -> maxpool -> reshape -> linear -> softmax, on (1,3,10,10)."""
    rng = np.random.default_rng(0)
    weights = {**conv_weights(), "fc.weight": rng.standard_normal((5, 64), dtype=np.float32),
               "fc.bias": rng.standard_normal(5, dtype=np.float32)}
    param, binary = write_model(
        folder, "pnnx.Input in0 0 1 0 #0=(1,3,10,10)f32", conv_line(),
        "nn.ReLU relu 1 1 1 2",
        "nn.MaxPool2d pool 1 1 2 3 kernel_size=(2,2) stride=(2,2)",
        "Tensor.reshape flat 1 1 3 4 shape=(1,64)",
        "nn.Linear fc 1 1 4 5 bias=True in_features=64 out_features=5 @bias=(5)f32 "
        "@weight=(5,64)f32",
        "nn.Softmax softmax 1 1 5 6 dim=1", "pnnx.Output out0 1 0 6", weights=weights)
    return RuntimeGraph(param, binary).build()


# ----- threads ----------------------------------------------------------------------------------

def test_one_graph_many_threads_different_sizes():
    """Six threads share one dynamic graph, each with its own batch and image size, several
    times over: every caller gets what a lone caller gets. (The graph is capped at one thread
    each: six callers on a loaded machine are slow with spinning BLAS pools, and the caps'
    bookkeeping is then exercised by every call; limits are as before afterwards.)"""
    lite0 = RuntimeGraph(LITE0).build()
    lite0.set_num_threads(1)
    before = _blas_limits()
    rng = np.random.default_rng(0)
    inputs = [rng.random((batch, 3, size, size), dtype=np.float32)
              for batch, size in [(1, 32), (2, 48), (1, 64), (3, 40), (1, 56), (2, 32)]]
    alone = [lite0.forward(x)[0] for x in inputs]
    start = threading.Barrier(len(inputs))

    def work(index: int) -> list[np.ndarray]:
        start.wait()                                       # all begin together
        return [lite0.forward(inputs[index])[0] for _ in range(3)]

    with ThreadPoolExecutor(len(inputs)) as pool:
        results = list(pool.map(work, range(len(inputs))))
    for index, outputs in enumerate(results):
        for y in outputs:
            np.testing.assert_allclose(y, alone[index], rtol=1e-5, atol=1e-6,
                                       err_msg=f"thread {index}")
    assert _blas_limits() == before


def test_threads_with_in_place_layers_and_shared_weights(tmp_path):
    """In-place ReLU, pooling and a linear head over the same weights from eight threads:
    exact results, and no caller's input is written."""
    graph = small_model(tmp_path)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 3, 10, 10), dtype=np.float32) for _ in range(8)]
    copies = [x.copy() for x in inputs]
    alone = [graph.forward(x)[0] for x in inputs]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: [graph.forward(x)[0] for _ in range(50)], inputs))
    for x, copy, expected, outputs in zip(inputs, copies, alone, results):
        np.testing.assert_array_equal(x, copy)
        for y in outputs:
            np.testing.assert_array_equal(y, expected)


class Meeting(Layer):
    """Identity that holds its forward open until the test lets it go, so the test decides
    in which order two capped forwards enter and leave; records the numba count and the BLAS
    limits it sees."""

    events: dict[str, threading.Event]
    seen: dict[str, tuple]

    def forward_one(self, x):
        name = threading.current_thread().name
        Meeting.events[f"{name} inside"].set()
        assert Meeting.events[f"{name} may look"].wait(timeout=30)
        Meeting.seen[name] = (numba.get_num_threads(), [n for _, n in _blas_limits()])
        Meeting.events[f"{name} looked"].set()
        assert Meeting.events[f"{name} may leave"].wait(timeout=30)
        return x.copy()


def test_overlapping_thread_caps(tmp_path, monkeypatch):
    """Two graphs capped at 1 and 2 threads overlap, in long-lived threads: the 1-capped
    forward enters first and leaves first. Inside, each thread has its own numba count and
    BLAS (process-wide) runs with the smaller cap; when only the 2-capped one is left, with 2.
    Afterwards every limit is what it was before. (Each forward restoring "its" previous BLAS
    limit left the process capped at 1.) Without helper threads: with them, a 2-thread
    forward caps BLAS at 1 itself (test_helper_threads_cap_blas_at_one)."""
    monkeypatch.setenv("PNNX_INFER_HELPERS", "0")
    lines = ("pnnx.Input in0 0 1 0 #0=(2,3)f32", "my.Meeting meet 1 1 0 1",
             "pnnx.Output out0 1 0 1")
    graphs = {}
    for cap in (1, 2):
        graph = RuntimeGraph(*write_model(tmp_path / str(cap), *lines))
        graph.register_custom_layer("my.Meeting", Meeting)
        graph.build().set_num_threads(cap)
        graphs[f"cap{cap}"] = graph
    before_blas, before_numba = _blas_limits(), numba.get_num_threads()
    two = min(2, *(n for _, n in before_blas))
    Meeting.seen = {}
    Meeting.events = {f"{name} {what}": threading.Event() for name in graphs
                      for what in ("inside", "may look", "looked", "may leave", "done",
                                   "may exit")}

    def work(name):                      # a long-lived worker: alive after its forward
        graphs[name].forward(np.ones((2, 3), np.float32))
        Meeting.events[f"{name} done"].set()
        Meeting.events[f"{name} may exit"].wait(timeout=30)

    threads = {name: threading.Thread(target=work, args=(name,), name=name) for name in graphs}
    event = Meeting.events
    try:
        for name in ("cap1", "cap2"):                      # enter: cap1, then cap2
            threads[name].start()
            assert event[f"{name} inside"].wait(timeout=30)
        for name in ("cap1", "cap2"):
            event[f"{name} may look"].set()
        for name in ("cap1", "cap2"):
            assert event[f"{name} looked"].wait(timeout=30)
        event["cap1 may leave"].set()                      # leave: cap1, then cap2
        assert event["cap1 done"].wait(timeout=30)
        only_cap2 = [n for _, n in _blas_limits()]
        event["cap2 may leave"].set()
        assert event["cap2 done"].wait(timeout=30)
        after = _blas_limits()
    finally:
        for name in graphs:
            for what in ("may look", "may leave", "may exit"):
                event[f"{name} {what}"].set()
            if threads[name].is_alive() or threads[name].ident:
                threads[name].join(timeout=30)
    assert Meeting.seen["cap1"][0] == 1
    assert Meeting.seen["cap2"][0] == min(2, numba.config.NUMBA_NUM_THREADS)
    assert Meeting.seen["cap1"][1] == Meeting.seen["cap2"][1] == [1] * len(before_blas)
    assert only_cap2 == [two] * len(before_blas)
    assert before_blas and after == before_blas
    assert numba.get_num_threads() == before_numba


def test_helper_threads_cap_blas_at_one(tmp_path):
    """A 2-thread forward with helper threads (layers/fast/workers.py) runs the matrix
    products on them, one BLAS thread each: inside, BLAS is capped at 1 and numba at 2; after,
    both are back. A forward on one thread has no team."""
    lines = ("pnnx.Input in0 0 1 0 #0=(2,3)f32", "my.Look look 1 1 0 1",
             "pnnx.Output out0 1 0 1")
    seen = {}

    class Look(Layer):
        def forward_one(self, x):
            seen["team"] = workers.current() is not None
            seen["limits"] = (numba.get_num_threads(), [n for _, n in _blas_limits()])
            return x.copy()

    graph = RuntimeGraph(*write_model(tmp_path, *lines))
    graph.register_custom_layer("my.Look", Look)
    graph.build()
    before = (numba.get_num_threads(), [n for _, n in _blas_limits()])
    graph.set_num_threads(1)
    graph.forward(np.ones((2, 3), np.float32))
    assert not seen["team"] and seen["limits"] == (1, [1] * len(before[1]))
    graph.set_num_threads(2)
    graph.forward(np.ones((2, 3), np.float32))
    if workers.usable_cores() >= 2 and os.environ.get("PNNX_INFER_HELPERS") != "0":
        assert seen["team"]
        assert seen["limits"] == (min(2, numba.config.NUMBA_NUM_THREADS), [1] * len(before[1]))
    assert (numba.get_num_threads(), [n for _, n in _blas_limits()]) == before


def _blas_limits() -> list[tuple[str, int]]:
    return [(pool["filepath"], pool["num_threads"]) for pool in threadpool_info()
            if pool["user_api"] == "blas"]


# ----- memory -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_ten_thousand_forwards_do_not_grow_memory(tmp_path):
    """After a warm-up, 10 000 forwards of a small model leave the process's resident size
    where it was (a leaked 4 KB output per call would be 40 MB), and 500 forwards under
    tracemalloc leave no Python or numpy allocation behind (not even a few bytes per call)."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,18,18)f32",
                                conv_line(), "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2",
                                weights=conv_weights())
    graph = RuntimeGraph(param, binary).build()
    x = np.random.default_rng(2).standard_normal((1, 3, 18, 18), dtype=np.float32)
    for _ in range(300):
        graph.forward(x)
    gc.collect()
    rss_before = _resident_bytes()
    for _ in range(10_000):
        (y,) = graph.forward(x)
    gc.collect()
    assert _resident_bytes() - rss_before < 8 * 1024 * 1024
    tracemalloc.start()
    try:
        for _ in range(50):
            graph.forward(x)
        before = tracemalloc.take_snapshot()
        for _ in range(500):
            (y,) = graph.forward(x)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # what the runtime's own lines allocated and kept (the whole process's count also moved
    # with whatever else ran meanwhile: it once grew 20 KB in the full suite, not alone)
    ours = [tracemalloc.Filter(True, str(REPO / package / "*"))
            for package in ("infer", "layers", "parser")]
    grown = [diff for diff in after.filter_traces(ours).compare_to(before.filter_traces(ours),
                                                                   "lineno")
             if diff.size_diff > 0]
    assert sum(diff.size_diff for diff in grown) < 16 * 1024, grown[:5]


def test_many_input_sizes_keep_a_bounded_plan_cache(lite0):
    """A dynamic graph fed ever new sizes keeps at most a fixed number of shape plans."""
    from infer.graph import MAX_SHAPE_PLANS
    for size in range(32, 32 + 2 * MAX_SHAPE_PLANS):
        lite0.infer_shapes((1, 3, size, size))
    assert len(lite0._shape_plans) <= MAX_SHAPE_PLANS


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


# ----- nothing executes model text --------------------------------------------------------------

# The torch-side tools are not on the load path, and run user code by design: export.py imports
# the user's model code and torch.load(weights_only=True)s checkpoints, convert.py runs the pnnx
# program, compare.py runs the torch module pnnx wrote (only when a person asks to compare), and
# draw.py pipes DOT text to graphviz's `dot` when a person asks for a drawing, and the
# benchmark starts worker processes. layers/fast/aot.py imports the extension module this
# package compiled from its own kernels (at a path named by a hash of their sources, never by
# anything in a model file) and, once per machine, runs numba's compiler in a child process.
TOOLS = {"export.py", "convert.py", "compare.py", "draw.py", "aot.py"}
LOAD_PATH = [path for folder in ("parser", "layers", "infer")
             for path in sorted((REPO / folder).rglob("*.py"))
             if path.name not in TOOLS and "bench" not in path.relative_to(REPO).parts]
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "breakpoint", "input"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib",
                     "importlib", "runpy", "code", "codeop", "yaml", "torch", "subprocess"}
# parser/lazy.py imports a package's public names on first use: importlib.import_module of the
# module names written in that package's __init__ (a constant table), never a name from a file
IMPORTS_ALLOWED = {("parser/lazy.py", "importlib")}


def _reads_package_metadata(node: ast.ImportFrom) -> bool:
    """``from importlib import metadata`` (the installed version): it reads text files and
    runs nothing, unlike importlib's import functions."""
    return (node.module == "importlib.metadata"
            or (node.module == "importlib" and [a.name for a in node.names] == ["metadata"]))


def test_no_eval_exec_or_pickle_in_the_load_path_source():
    """Static scan: no call of eval/exec/compile/__import__, no import of a module that
    unpickles or runs code, and no numpy load with allow_pickle, in any module on the load
    path."""
    found = []
    for path in LOAD_PATH:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in FORBIDDEN_CALLS):
                found.append(f"{where}: {node.func.id}()")
            if isinstance(node, ast.Import):
                found += [f"{where}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] in FORBIDDEN_MODULES
                          and (path.relative_to(REPO).as_posix(), a.name) not in IMPORTS_ALLOWED]
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] \
                    in FORBIDDEN_MODULES and not _reads_package_metadata(node):
                found.append(f"{where}: from {node.module} import")
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                found.append(f"{where}: allow_pickle")
    assert LOAD_PATH and not found, found


def test_no_eval_exec_or_pickle_while_loading_and_running(monkeypatch, tmp_path):
    """Runtime check: with eval, exec, compile, __import__ of new modules, pickle and marshal
    all made to fail, real models load, build and run (and classify an image)."""
    from infer.classify import ImageClassifier  # noqa: F401  (imported before the trap)
    lite0_first = RuntimeGraph(LITE0).build()                # warm every code path up once
    lite0_first.forward(np.zeros((1, 3, 32, 32), np.float32))
    expr_param, expr_bin = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(2,3)f32",
                                       "pnnx.Expression e 1 1 0 1 expr=add(mul(@0,2),size(@0,1))",
                                       "pnnx.Output out0 1 0 1")
    calls = []

    def trap(name):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called on the load path")
        return refuse

    real_import = builtins.__import__

    def no_new_imports(name, *args, **kwargs):
        module = real_import(name, *args, **kwargs)    # already-imported modules are fine
        if name.split(".")[0] in FORBIDDEN_MODULES - {"torch"}:
            calls.append(f"import {name}")
        return module

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, trap(name))
    monkeypatch.setattr(builtins, "__import__", no_new_imports)
    for module, names in ((pickle, ("load", "loads", "Unpickler")),
                          (marshal, ("load", "loads"))):
        for name in names:
            monkeypatch.setattr(module, name, trap(f"{module.__name__}.{name}"))

    graph = RuntimeGraph(LITE0).build()
    (logits,) = graph.forward(np.random.default_rng(0).random((1, 3, 64, 64), np.float32))
    expression = RuntimeGraph(expr_param, expr_bin).build()
    (y,) = expression.forward(np.ones((2, 3), np.float32))
    monkeypatch.undo()
    assert calls == []
    np.testing.assert_array_equal(y, np.full((2, 3), 5, np.float32))
    np.testing.assert_allclose(logits, lite0_first.forward(
        np.random.default_rng(0).random((1, 3, 64, 64), np.float32))[0], rtol=1e-5)
