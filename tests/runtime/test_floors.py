"""Two floors: the numpy reference layers run alone, and the fast backend plugs in over them.

The graph creates, per operator, the graph's custom layer, else the fast layer (unless
``reference=True``), else the reference layer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import layers.fast  # noqa: F401  (registers the fast layers)
from infer import RuntimeGraph
from layers.activation import ReLU
from layers.convolution import Conv2d
from layers.fast.layers import FastConv2d, FastLinear
from layers.registry import LayerRegisterer, register_fast_layer
from parser.errors import RegistryError
from support import REPO, write_pnnx

LITE0 = REPO / "model_file" / "efficientnet_lite0" / "efficientnet_lite0.pnnx.param"

# one of each layer that has a fast subclass, and erf (GELU, an expression)
SMALL = """
7767517
8 7
pnnx.Input      in0   0 1 x #x=(1,3,12,12)f32
nn.Conv2d       conv  1 1 x a bias=True dilation=(1,1) groups=1 in_channels=3 kernel_size=(3,3) out_channels=8 padding=(1,1) padding_mode=zeros stride=(1,1) @weight=(8,3,3,3)f32 @bias=(8)f32
nn.MaxPool2d    pool  1 1 a b ceil_mode=False dilation=(1,1) kernel_size=(2,2) padding=(0,0) return_indices=False stride=(2,2)
F.gelu          gelu  1 1 b c approximate=none
pnnx.Expression erf   1 1 c d expr=erf(@0)
Tensor.reshape  flat  1 1 d e shape=(1,288)
nn.Linear       fc    1 1 e f bias=True in_features=288 out_features=5 @weight=(5,288)f32 @bias=(5)f32
pnnx.Output     out0  1 0 f
"""  # noqa: E501


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    rng = np.random.default_rng(3)
    weights = {"conv.weight": rng.standard_normal((8, 3, 3, 3), dtype=np.float32),
               "conv.bias": rng.standard_normal(8, dtype=np.float32),
               "fc.weight": rng.standard_normal((5, 288), dtype=np.float32) * 0.1,
               "fc.bias": rng.standard_normal(5, dtype=np.float32)}
    return write_pnnx(tmp_path_factory.mktemp("floors"), SMALL, weights)


REFERENCE_RUN = """
import importlib.abc, sys
import numpy as np

class Refuse(importlib.abc.MetaPathFinder):
    # numba, llvmlite and the fast backend cannot be imported in this process
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numba", "llvmlite") or name.startswith("layers.fast"):
            raise ImportError(f"{name} is not installed here")
        return None

sys.meta_path.insert(0, Refuse())
from infer import RuntimeGraph

results = {}
for key, param, shape in CASES:
    graph = RuntimeGraph(param, reference=True).build()
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    results[key] = graph.forward(x)[0]
np.savez(OUT, **results)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite")
                or m.startswith("layers.fast"))
print("loaded:", loaded)
"""


def test_the_reference_floor_runs_without_numba_or_the_fast_backend(small_model, tmp_path):
    """In a process where numba and layers.fast cannot be imported, reference graphs build and
    run, and give what the fast graphs give."""
    cases = [("lite0", str(LITE0), (1, 3, 224, 224)), ("small", str(small_model[0]),
                                                        (1, 3, 12, 12))]
    out = tmp_path / "reference.npz"
    script = f"CASES = {cases!r}\nOUT = {str(out)!r}\n" + textwrap.dedent(REFERENCE_RUN)
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "loaded: []" in run.stdout
    reference = np.load(out)
    for key, param, shape in cases:
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        fast = RuntimeGraph(param).build().forward(x)[0]
        np.testing.assert_allclose(fast, reference[key], rtol=1e-4, atol=1e-5)


def test_import_infer_loads_no_fast_module():
    code = ("import sys, infer; print(sorted(m for m in sys.modules "
            "if m.startswith(('layers.fast', 'numba'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_the_graph_takes_custom_then_fast_then_reference(small_model):
    param, binary = small_model
    fast = RuntimeGraph(param, binary).build()
    assert type(fast.operator("conv").layer) is FastConv2d
    assert type(fast.operator("fc").layer) is FastLinear
    reference = RuntimeGraph(param, binary, reference=True).build()
    assert type(reference.operator("conv").layer) is Conv2d

    class MyConv(Conv2d):
        """A custom layer wins over both floors."""

    custom = RuntimeGraph(param, binary)
    custom.register_custom_layer("nn.Conv2d", MyConv)
    custom.build()
    assert type(custom.operator("conv").layer) is MyConv
    x = np.random.default_rng(1).random((1, 3, 12, 12), dtype=np.float32)
    want = reference.forward(x)[0]
    for graph in (fast, custom):
        np.testing.assert_allclose(graph.forward(x)[0], want, rtol=1e-4, atol=1e-5)


def test_every_fast_layer_subclasses_the_reference_layer_of_its_type():
    registry = LayerRegisterer()
    assert {"nn.Conv2d", "nn.Linear", "nn.MaxPool2d"} <= set(registry.fast_types())
    for type_name in registry.fast_types():
        fast, reference = registry.layer_class(type_name, fast=True), \
            registry.layer_class(type_name)
        assert fast is not reference and issubclass(fast, reference), type_name
        assert fast.__module__.startswith("layers.fast."), type_name
        assert not reference.__module__.startswith("layers.fast."), type_name


def test_register_fast_layer_refuses_strangers_and_doubles():
    with pytest.raises(RegistryError, match="must subclass"):
        register_fast_layer("nn.Conv2d")(ReLU)
    with pytest.raises(RegistryError, match="already registered"):
        register_fast_layer("nn.Conv2d")(type("AnotherConv", (Conv2d,), {}))
    with pytest.raises(RegistryError, match="no layer is registered"):
        register_fast_layer("nn.NoSuchLayer")(type("Stranger", (Conv2d,), {}))


GLOBAL_OVERRIDE = """
import numpy as np
from layers import LayerRegisterer, register_layer
from layers.linear import Linear
from infer import RuntimeGraph

class MyLinear(Linear):
    # a user's replacement, registered globally BEFORE any fast graph is built
    def forward_one(self, x):
        return x @ self.weight.T + self.bias

LayerRegisterer().unregister("nn.Linear")
register_layer("nn.Linear")(MyLinear)
graph = RuntimeGraph(PARAM).build()                 # imports the fast backend now
layer = graph.operator("fc").layer
x = np.random.default_rng(0).standard_normal((2, 6), dtype=np.float32)
(y,) = graph.forward(x)
want = np.maximum(x @ layer.weight.T + layer.bias, 0)
print(type(layer).__name__, [op.type for op in graph.operators], np.abs(y - want).max())
"""


def test_a_global_replacement_of_a_built_in_layer_serves_both_floors(tmp_path):
    """A user who replaces nn.Linear globally before the fast backend is imported gets the
    replacement on the fast floor too, and fusion leaves it alone (it may not apply a fused
    activation): the ReLU after it still runs."""
    text = """
    7767517
    4 3
    pnnx.Input  in0  0 1 a #a=(2,6)f32
    nn.Linear   fc   1 1 a b bias=True in_features=6 out_features=3 @weight=(3,6)f32 @bias=(3)f32
    nn.ReLU     relu 1 1 b c
    pnnx.Output out0 1 0 c
    """
    rng = np.random.default_rng(2)
    weights = {"fc.weight": rng.standard_normal((3, 6), dtype=np.float32),
               "fc.bias": rng.standard_normal(3, dtype=np.float32)}
    param, _ = write_pnnx(tmp_path, text, weights)
    script = f"PARAM = {str(param)!r}\n" + textwrap.dedent(GLOBAL_OVERRIDE)
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    name, *_, error = run.stdout.split()
    assert name == "MyLinear" and "'nn.ReLU'" in run.stdout and float(error) < 1e-5, run.stdout


BACKGROUND_RUN = """
import os, shutil, signal, numpy as np
from pathlib import Path
from infer import RuntimeGraph
from layers.fast import aot

graph = RuntimeGraph(PARAM).build()
print("built on:", graph.floor, graph.helpers)
build = aot._background
os.killpg(build.process.pid, signal.SIGKILL)      # the builder and the compilers it started
build.process.wait()
for module in MODULES:                            # the test brings them, or not
    shutil.copy(module, aot.cache_dir())
x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
np.save(OUT, graph(x)[0])
print("then on:", graph.floor, graph.helpers, any(op.fused for op in graph.operators))
"""


@pytest.mark.parametrize("ready", [True, False], ids=["compiled", "failed"])
def test_a_graph_built_while_the_kernels_compile_runs_then_moves(tmp_path, ready):
    """PNNX_INFER_BUILD=background: the first build on a machine returns at once on the
    reference floor while a detached process compiles the kernels; the first forward after
    they are in the cache moves the graph to the fast floor (fused); if the builder ends
    without them, the graph stays on the reference floor, with a warning. Same answers."""
    from layers import fast
    from layers.fast import aot

    fast.start()                                  # this process's modules: copied, or not
    modules = [str(aot._module_path(aot.cache_dir(), name)) for name in aot.module_names()]
    out = tmp_path / "y.npy"
    script = (f"PARAM = {str(LITE0)!r}\nSHAPE = (1, 3, 224, 224)\nOUT = {str(out)!r}\n"
              f"MODULES = {modules if ready else []!r}\n" + textwrap.dedent(BACKGROUND_RUN))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PNNX_INFER_BUILD="background")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert "built on: reference until the fast kernels are compiled False" in run.stdout
    assert "compiling the fast kernels for this CPU in the background" in run.stderr
    if ready:
        assert "then on: fast True True" in run.stdout
        assert "the fast kernels are ready" in run.stderr
    else:
        assert "then on: reference (the fast kernels could not be compiled) False False" in (
            run.stdout)
        assert "could not be built in the background" in run.stderr
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    expected = RuntimeGraph(LITE0, reference=True).build().forward(x)[0]
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-4, atol=1e-5)


def _built_while_compiling(monkeypatch, param) -> RuntimeGraph:
    """A graph built as if the fast kernels were still compiling in the background."""
    import layers.fast as fast

    real_start = fast.start
    monkeypatch.setattr(fast, "start", lambda wait=True: fast.COMPILING)
    graph = RuntimeGraph(param).build()
    monkeypatch.setattr(fast, "start", real_start)
    assert graph.floor == "reference until the fast kernels are compiled"
    return graph


def test_a_graph_whose_fast_layers_fail_stays_on_the_reference_floor(small_model, monkeypatch,
                                                                       caplog):
    """Moving to the fast floor fuses and packs; if that fails, the graph is built anew from
    its files on the reference floor (not left half fused) and answers as the reference."""
    graph = _built_while_compiling(monkeypatch, small_model[0])

    def broken(self, input_shapes):
        raise MemoryError("no room to pack")
    monkeypatch.setattr(FastConv2d, "prepare", broken)
    x = np.random.default_rng(0).random((1, 3, 12, 12), dtype=np.float32)
    got = graph(x)[0]
    assert graph.floor == "reference (the fast kernels could not be compiled)"
    assert "stays on the reference floor" in caplog.text
    assert not any(op.fused for op in graph.operators)
    want = RuntimeGraph(small_model[0], reference=True).build()(x)[0]
    np.testing.assert_array_equal(got, want)
    monkeypatch.undo()
    assert graph.floor.startswith("reference (") and graph(x)[0].shape == want.shape


def test_a_closed_graph_is_not_moved_to_the_fast_floor(small_model, monkeypatch):
    from parser.errors import GraphError

    graph = _built_while_compiling(monkeypatch, small_model[0])
    graph.close()
    with pytest.raises(GraphError, match="call build"):
        graph(np.zeros((1, 3, 12, 12), np.float32))
