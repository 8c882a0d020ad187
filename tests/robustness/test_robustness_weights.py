"""The bin file changing under a built graph: it never kills the process and never changes
answers silently.

By default (``weights="memory"``) build() reads the bin file once; afterwards any change to
the file (truncated in place as ``cp`` does, rewritten with the same size, replaced, deleted)
leaves the graph's answers as they were. With ``weights="map"`` the weights are views of a
memory map: the graph refuses to run once the file's identity, size or modification time has
changed, instead of reading new bytes or dying with SIGBUS past a truncated end. Each change
is tried on both floors, on a convolution model (packed weights on the fast floor) and on the
shipped EfficientNet-Lite0."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from infer import BinFileError, GraphError, InferError, RuntimeGraph
from parser.bin import PnnxBin
from support import REPO, conv_line, conv_weights, expect_error, write_model

LITE0 = REPO / "model_file" / "efficientnet_lite0"


def _truncate(path: Path) -> None:
    """What ``cp other.bin model.pnnx.bin`` does: the same file, cut and written again."""
    with open(path, "r+b") as file:
        file.truncate(100)


def _rewrite_same_size(path: Path) -> None:
    """Every byte changed, the size kept (a re-export of the same architecture)."""
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(b ^ 0x5A for b in data))


def _rewrite_keeping_mtime(path: Path) -> None:
    """The same size and modification time: nothing cheap can see this change."""
    info = os.stat(path)
    _rewrite_same_size(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _replace(path: Path) -> None:
    """Another file moved over it (a new inode, as an atomic save does)."""
    other = path.with_suffix(".new")
    other.write_bytes(b"PK\x05\x06" + bytes(18))          # an empty zip
    os.replace(other, path)


def _delete(path: Path) -> None:
    path.unlink()


CHANGES = [_truncate, _rewrite_same_size, _replace, _delete]


def _conv_model(folder: Path) -> tuple[Path, Path]:
    return write_model(folder, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                       "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2",
                       weights=conv_weights())


def _lite0(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("efficientnet_lite0.pnnx.param", "efficientnet_lite0.pnnx.bin"):
        shutil.copy(LITE0 / name, folder / name)
    return (folder / "efficientnet_lite0.pnnx.param", folder / "efficientnet_lite0.pnnx.bin")


def _input(graph: RuntimeGraph) -> np.ndarray:
    shape = [1, 3, 8, 8] if graph.input_shapes[0] == (1, 3, 8, 8) else [1, 3, 224, 224]
    return np.random.default_rng(0).random(shape, dtype=np.float32)


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("model", [pytest.param(_conv_model, id="conv"),
                                   pytest.param(_lite0, id="lite0", marks=pytest.mark.slow)])
def test_a_changed_file_changes_nothing_in_a_built_graph(tmp_path, model, change, reference):
    param, binary = model(tmp_path)
    graph = RuntimeGraph(param, binary, reference=reference).build()
    x = _input(graph)
    before = graph.forward(x)[0]
    change(binary)
    assert np.array_equal(graph.forward(x)[0], before)
    assert np.array_equal(graph.forward(x[..., ::-1, :])[0],     # new buffers, same weights
                          RuntimeGraph(*model(tmp_path / "fresh"), reference=reference)
                          .build().forward(x[..., ::-1, :])[0])


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_a_mapped_graph_refuses_to_run_once_its_file_changed(tmp_path, change, reference):
    param, binary = _conv_model(tmp_path)
    graph = RuntimeGraph(param, binary, reference=reference, weights="map").build()
    x = _input(graph)
    graph.forward(x)
    change(binary)
    for _ in range(2):                            # and it stays refused
        error = expect_error(GraphError, lambda: graph.forward(x), "changed since build",
                             "weights='memory'")
        assert str(binary) in str(error)
    expect_error(GraphError, lambda: graph.infer_shapes((1, 3, 16, 16)), "changed")


def test_a_mapped_graph_cannot_see_a_change_that_keeps_size_and_time(tmp_path):
    """The documented limit of weights='map' (README, 'Errors'): the default is immune."""
    param, binary = _conv_model(tmp_path)
    in_memory = RuntimeGraph(param, binary).build()
    x = _input(in_memory)
    before = in_memory.forward(x)[0]
    _rewrite_keeping_mtime(binary)
    assert np.array_equal(in_memory.forward(x)[0], before)


def test_a_mapped_graph_runs_while_the_file_is_unchanged(tmp_path):
    param, binary = _conv_model(tmp_path)
    mapped = RuntimeGraph(param, binary, weights="map").build()
    x = _input(mapped)
    os.utime(param)                               # the param file is not watched
    assert np.array_equal(mapped.forward(x)[0], RuntimeGraph(param, binary).build()
                          .forward(x)[0])


def test_rebuilding_after_a_change_reads_the_new_file(tmp_path):
    param, binary = _conv_model(tmp_path)
    graph = RuntimeGraph(param, binary, weights="map").build()
    x = _input(graph)
    weights = {k: -v for k, v in conv_weights().items()}
    write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2", weights=weights)
    expect_error(GraphError, lambda: graph.forward(x), "changed")
    graph.close()
    rebuilt = graph.build().forward(x)[0]
    assert np.array_equal(rebuilt, RuntimeGraph(param, binary).build().forward(x)[0])


def test_weights_mode_is_checked(tmp_path):
    expect_error(GraphError, lambda: RuntimeGraph(*_conv_model(tmp_path), weights="mmap"),
                 "'memory'", "'map'")


@pytest.mark.parametrize("in_memory", [False, True])
def test_bin_reader_in_memory_reads_what_the_map_reads(tmp_path, in_memory):
    _, binary = _conv_model(tmp_path)
    with PnnxBin(binary) as mapped, PnnxBin(binary, in_memory=in_memory) as other:
        for entry, shape in (("conv.weight", (4, 3, 3, 3)), ("conv.bias", (4,))):
            a, b = mapped.read(entry, shape, "f32"), other.read(entry, shape, "f32")
            assert np.array_equal(a, b) and not b.flags.writeable
        assert mapped.changed() is None and other.changed() is None
        _truncate(binary)
        assert "size changed" in mapped.changed()
        if in_memory:                             # its bytes are its own
            assert np.array_equal(other.read("conv.bias", (4,), "f32"),
                                  conv_weights()["conv.bias"])


@pytest.mark.parametrize("in_memory", [False, True])
def test_bin_path_that_is_not_a_regular_file(tmp_path, in_memory):
    fifo = tmp_path / "model.pnnx.bin"
    os.mkfifo(fifo)                               # reading it would block forever
    expect_error(BinFileError, lambda: PnnxBin(fifo, in_memory=in_memory), "regular file")
    expect_error(BinFileError, lambda: PnnxBin("/dev/zero", in_memory=in_memory))
    expect_error(BinFileError, lambda: PnnxBin(tmp_path, in_memory=in_memory))


def test_graph_over_a_fifo_bin_is_an_error_not_a_hang(tmp_path):
    param, binary = _conv_model(tmp_path)
    binary.unlink()
    os.mkfifo(binary)
    with pytest.raises(InferError, match="regular file"):
        RuntimeGraph(param, binary).build()
