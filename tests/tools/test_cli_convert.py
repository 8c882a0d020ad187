"""``python -m infer convert`` (TorchScript and ONNX files through pnnx's converter) and the
README's operator table generated from the registry (``python -m infer ops --markdown``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from infer import RuntimeGraph
from infer.__main__ import TABLE_BEGIN, TABLE_END, main, operator_table, readme_with_table
from infer.convert import convert, parse_input_shape, unsupported_types
from parser.errors import ExportError, InferError
from support import REPO

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",
                                        "ignore::DeprecationWarning", "ignore::FutureWarning")


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env_path = str(REPO)
    return subprocess.run([sys.executable, "-m", "infer", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, env={"PYTHONPATH": env_path,
                                                                 "PATH": "/usr/bin:/bin"})


class SmallNet(nn.Module):
    """Convolution, pooling and a classifier: operators every path (trace, ONNX) keeps."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):                                        # (N, 3, 16, 16)
        x = self.pool(torch.relu(self.conv(x)))                  # (N, 6, 4, 4)
        return self.fc(torch.flatten(x, 1))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SmallNet().eval()


@pytest.fixture(scope="module")
def example():
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def assert_runs_like_torch(param: Path, model: nn.Module, x: torch.Tensor) -> None:
    graph = RuntimeGraph(param, param.with_name(param.name.replace(".param", ".bin"))).build()
    (got,) = graph.forward(x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


# ================================================================ conversions

def test_convert_a_traced_torchscript_file(tmp_path, model, example):
    """A traced file stores its example inputs: no shape needed. Only the two pnnx files
    appear, beside the model (the default), nothing else."""
    source = tmp_path / "small.pt"
    with torch.no_grad():
        torch.jit.trace(model, (example,)).save(str(source))
    result = run("convert", str(source))
    assert result.returncode == 0, result.stderr
    param = tmp_path / "small.pnnx.param"
    assert result.stdout.split() == [str(param), str(tmp_path / "small.pnnx.bin")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.pnnx.bin", "small.pnnx.param",
                                                          "small.pt"]
    assert result.stderr == ""                                  # every operator is supported
    assert_runs_like_torch(param, model, example)


def test_convert_an_onnx_file_with_a_free_batch_dim(tmp_path, model, example):
    """An ONNX input with a free dim takes the shapes given; a second shape keeps it free."""
    source = tmp_path / "free.onnx"
    torch.onnx.export(model, (example,), str(source), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    param, binary = convert(source, tmp_path / "out", ["3,3,16,16"], ["5,3,16,16"], name="net")
    assert (param.name, binary.name) == ("net.pnnx.param", "net.pnnx.bin")
    assert RuntimeGraph(param).build().input_shapes == [(None, 3, 16, 16)]
    assert_runs_like_torch(param, model, torch.randn(4, 3, 16, 16))


def test_converting_an_onnx_file_with_a_free_batch_says_it_is_fixed(tmp_path, model, example,
                                                                     caplog):
    """Without a second shape pnnx fixes the free batch: the conversion says so, naming the
    input, the dim and how to keep it free."""
    source = tmp_path / "free.onnx"
    torch.onnx.export(model, (example,), str(source), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    with caplog.at_level("WARNING", logger="infer.convert"):
        param, _ = convert(source, tmp_path / "out", ["2,3,16,16"])
    assert "input 'x' leaves dim(s) 0 free" in caplog.text and "--inputshape2" in caplog.text
    assert RuntimeGraph(param).build().input_shapes == [(2, 3, 16, 16)]
    caplog.clear()
    convert(source, tmp_path / "out2", ["2,3,16,16"], ["3,3,16,16"])
    assert "free" not in caplog.text


def test_a_scripted_module_that_crashes_pnnx_is_an_export_error(tmp_path):
    source = tmp_path / "scripted.pt"
    scripted = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14,
                                                                                     2))
    torch.jit.script(scripted.eval()).save(str(source))
    with pytest.raises(ExportError, match="save torch.jit.trace"):
        convert(source, tmp_path, ["1,3,16,16"])


def test_convert_with_a_second_shape_leaves_dims_free(tmp_path, model, example):
    source = tmp_path / "small.pt"
    with torch.no_grad():
        torch.jit.trace(model, (example,)).save(str(source))
    param, _ = convert(source, tmp_path, ["2,3,16,16"], ["5,3,16,16"])
    assert RuntimeGraph(param).build().input_shapes == [(None, 3, 16, 16)]
    assert_runs_like_torch(param, model, torch.randn(7, 3, 16, 16))


def test_convert_an_onnx_file(tmp_path, model, example):
    """torch's TorchScript-based ONNX exporter: one self-contained file."""
    source = tmp_path / "small.onnx"
    torch.onnx.export(model, (example,), str(source), dynamo=False)
    result = run("convert", str(source), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert_runs_like_torch(tmp_path / "out" / "small.pnnx.param", model, example)


def test_convert_an_onnx_file_with_external_weights(tmp_path, model, example):
    """Large ONNX models keep their weights in a file beside the model (torch's default
    exporter writes ``model.onnx.data``); pnnx looks for it in its working directory. It is
    found, and nothing is written into the model's folder."""
    import onnx

    folder = tmp_path / "models"
    folder.mkdir()
    torch.onnx.export(model, (example,), str(tmp_path / "inline.onnx"), dynamo=False)
    onnx.save_model(onnx.load(str(tmp_path / "inline.onnx")), str(folder / "small.onnx"),
                    save_as_external_data=True, location="small.weights", size_threshold=0)
    assert (folder / "small.weights").stat().st_size > 1000
    before = sorted(p.name for p in folder.iterdir())
    param, _ = convert(folder / "small.onnx", tmp_path / "out")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert_runs_like_torch(param, model, example)


def test_convert_names_operator_types_the_runtime_lacks(tmp_path, model, example, capsys,
                                                        monkeypatch):
    from layers import LayerRegisterer

    source = tmp_path / "small.pt"
    with torch.no_grad():
        torch.jit.trace(model, (example,)).save(str(source))
    registry = LayerRegisterer()
    monkeypatch.setattr(registry, "_creators", {k: v for k, v in registry._creators.items()
                                                if k != "nn.MaxPool2d"})
    assert main(["convert", str(source), "-o", str(tmp_path / "out")]) == 0
    assert "no layer yet for nn.MaxPool2d" in capsys.readouterr().err
    assert unsupported_types(tmp_path / "out" / "small.pnnx.param") == ["nn.MaxPool2d"]


def test_export_names_operator_types_the_runtime_lacks(tmp_path, capsys, monkeypatch):
    from layers import LayerRegisterer

    (tmp_path / "tinynet.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = LayerRegisterer()
    monkeypatch.setattr(registry, "_creators", {k: v for k, v in registry._creators.items()
                                                if k != "nn.MaxPool2d"})
    assert main(["export", "tinynet:make", "--shape", "1,3,8,8", "--out",
                 str(tmp_path / "out")]) == 0
    assert "no layer yet for nn.MaxPool2d" in capsys.readouterr().err


# ================================================================ errors

def test_convert_errors_are_export_errors(tmp_path):
    state_dict = tmp_path / "weights.pt"
    torch.save(nn.Linear(3, 2).state_dict(), state_dict)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a protobuf")
    other = tmp_path / "model.h5"
    other.write_bytes(b"")
    cases = [(tmp_path / "missing.onnx", "no model file"),
             (other, r"TorchScript file \(.pt, .pth, .torchscript\) or an ONNX file"),
             (state_dict, "not a TorchScript file .* torch.jit.trace"),
             (garbage, "pnnx could not convert the ONNX file .*garbage.onnx")]
    for path, words in cases:
        with pytest.raises(ExportError, match=words):
            convert(path, tmp_path / "out")
    with pytest.raises(ExportError, match="2 shapes for 1 inputs"):
        convert(state_dict, tmp_path, ["1,3"], ["1,3", "2,3"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, words", [
    (["no/such/model.onnx"], "error: no model file no/such/model.onnx"),
    (["model.onnx", "--inputshape", "1,3,a"], "--inputshape: expected dims >= 1"),
    (["model.onnx", "--inputshape", "1,0,4"], "--inputshape: expected dims >= 1"),
], ids=str)
def test_convert_command_reports_errors_without_a_traceback(args, words, tmp_path):
    result = run("convert", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("text, pnnx_form", [
    ("1,3,224,224", "[1,3,224,224]f32"), ("1,16i64", "[1,16]i64"), ("[2,5]bool", "[2,5]bool"),
    (" 4 , 8 f16", "[4,8]f16")])
def test_input_shapes_in_pnnx_form(text, pnnx_form):
    assert parse_input_shape(text) == pnnx_form


@pytest.mark.parametrize("text", ["", "1,,3", "1,3x", "a", "1,3i65", "[1,3"])
def test_bad_input_shapes_are_refused(text):
    with pytest.raises(ValueError, match="expected dims"):
        parse_input_shape(text)


# ================================================================ the README's operator table

def test_readme_operator_table_is_up_to_date():
    """README.md's table is what the registry says; regenerate it with
    ``python -m infer ops --update README.md``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_with_table(readme) == readme, \
        "README.md's operator table is out of date: run python -m infer ops --update README.md"


def test_operator_table_lists_every_built_in_type():
    from layers import LayerRegisterer

    table = operator_table()
    registry = LayerRegisterer()
    built_in = [t for t in registry.types() if registry.layer_class(t).__module__
                .startswith("layers.")]
    assert all(f"`{t}`" in table for t in built_in)
    assert "| `layers/attention.py` | Attention |" in table
    fast = registry.fast_types()
    assert fast and all(f"`{t}` (fast)" in table for t in fast)
    assert table.endswith(f"\n\n{len(built_in)} operator types; {len(fast)} of them also have "
                          f"a fast layer (fast).\n")


def test_ops_markdown_and_update(tmp_path):
    result = run("ops", "--markdown")
    assert result.returncode == 0 and result.stdout == operator_table()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{TABLE_BEGIN}\nold table\n{TABLE_END}\n\nrest\n")
    assert run("ops", "--update", str(readme)).returncode == 0
    assert readme.read_text() == f"# x\n\n{TABLE_BEGIN}\n{operator_table()}{TABLE_END}\n\nrest\n"
    readme.write_text("# no markers\n")
    result = run("ops", "--update", str(readme))
    assert result.returncode == 2 and "no operator table section" in result.stderr


def test_readme_without_markers_is_an_error():
    with pytest.raises(InferError, match="no operator table section"):
        readme_with_table("# nothing here\n")
