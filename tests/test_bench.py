"""The benchmark (python -m infer.bench) in --quick mode on its tiny model: every engine runs
in its own worker, outputs agree with torch, the tables land between the markers of the
output file. No speed is asserted: this machine's timings mean nothing in a test."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("onnxruntime")

from infer.bench import report  # noqa: E402
from infer.bench.__main__ import main  # noqa: E402


def numbers(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_quick_run_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Our benchmarks\n\nHow we measure.\n\n" + report.BEGIN + "\nold\n"
                   + report.END + "\n\nA footnote.\n")
    code = main(["--quick", "--models", "tiny", "--batches", "2", "--output", str(out),
                 "--workdir", str(tmp_path / "files"), "--onnx-exporter", "legacy"])
    assert code == 0
    text = out.read_text()
    assert text.startswith("# Our benchmarks\n\nHow we measure.\n\n" + report.BEGIN)
    assert text.endswith(report.END + "\nA footnote.\n") and "\nold\n" not in text
    assert re.search(r"- CPU: \S+", text) and "- Python: 3." in text
    assert "`python -m infer.bench --quick --models tiny" in text

    rows = {numbers(line)[2]: numbers(line) for line in text.splitlines()
            if line.startswith("| tiny | 2 |")}
    assert set(rows) == {"pnnx-infer", "onnxruntime", "torch"}
    for row in rows.values():
        median, ratio, _, imported, load, first, _, peak, inference, diff = row[3:]
        assert float(median) > 0 and float(load) >= 0 and float(first) > 0
        assert float(peak) > float(inference) >= 0
        assert "over" not in diff                       # within 1e-4 of torch
    assert rows["onnxruntime"][4] == "1.00"
    cold = [numbers(line) for line in text.splitlines() if line.startswith("| tiny | cold |")
            or line.startswith("| tiny | warm |")]
    assert [row[1] for row in cold] == ["cold", "warm"]
    assert "batch 2 round 1/1 pnnx-infer" in capsys.readouterr().out


def test_write_appends_the_section_to_a_file_without_markers(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("# Notes\n")
    report.write(out, "first\n")
    report.write(out, "second\n")
    text = out.read_text()
    assert text == f"# Notes\n\n{report.BEGIN}\nsecond\n{report.END}\n"


def test_layers_mode_matches_each_operator_with_an_onnxruntime_node(tmp_path, capsys):
    """--layers: both engines' operator profiles, paired in run order; on the tiny model every
    convolution, the pooling and the linear layer find their onnxruntime node."""
    code = main(["--layers", "--quick", "--models", "tiny", "--batches", "1",
                 "--workdir", str(tmp_path / "files"), "--onnx-exporter", "legacy"])
    assert code == 0
    text = capsys.readouterr().out
    rows = [numbers(line) for line in text.splitlines()
            if re.match(r"\| \d+ \|", line)]
    ours = [row for row in rows if row[1]]
    kinds = [row[2] for row in ours]
    assert kinds[:3] == ["conv 3x3 s2", "depthwise 3x3", "conv 1x1"]
    paired = [row for row in ours if row[5]]
    assert {row[2] for row in paired} >= {"conv 3x3 s2", "depthwise 3x3", "conv 1x1",
                                          "AdaptiveAvgPool2d", "Linear"}
    for row in paired:
        assert float(row[4]) > 0 and float(row[7]) > 0 and float(row[8]) > 0
    assert "| **all operators** |" in text


def test_operators_are_paired_in_order_by_what_they_compute():
    from infer.bench.operators import match

    def op(name, kind, output, weight=None):
        return {"name": name, "type": kind, "output": output, "weight": weight, "ms": 1.0}

    ours = [op("conv", "nn.Conv2d", [1, 8, 4, 4], [8, 3, 3, 3]),
            op("view", "Tensor.view", [1, 128]),
            op("fc", "nn.Linear", [1, 10], [10, 128])]
    theirs = [op("Reorder", "ReorderInput", [1, 16, 4, 4]),
              op("Conv_0", "Conv", [1, 16, 4, 4], [16, 3, 3, 3]),
              op("Gemm_0", "Gemm", [1, 10])]
    pairs = [(r.ours and r.ours["name"], r.theirs and r.theirs["name"])
             for r in match(ours, theirs)]
    assert pairs == [(None, "Reorder"), ("conv", "Conv_0"), ("view", None), ("fc", "Gemm_0")]

    # independent branches in another order (ResNet's downsampling 1x1): still paired
    a = op("a", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 3, 3])
    b = op("b", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 1, 1])
    c = op("c", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 3, 3])
    a2, b2, c2 = ({**x, "name": x["name"] + "2", "type": "Conv"} for x in (a, b, c))
    pairs = [(r.ours and r.ours["name"], r.theirs and r.theirs["name"])
             for r in match([a, c, b], [b2, a2, c2])]
    assert pairs == [("a", "a2"), ("c", "c2"), ("b", "b2")]


def test_layers_mode_reports_a_failed_worker_and_exits_1(tmp_path, capsys, monkeypatch):
    from infer.bench import operators

    def broken(job, numba_cache):
        raise RuntimeError("worker exited with 1: ValueError: no such model")

    monkeypatch.setattr(operators, "run_worker", broken)
    code = main(["--layers", "--quick", "--models", "tiny", "--batches", "1",
                 "--workdir", str(tmp_path / "files"), "--onnx-exporter", "legacy"])
    out = capsys.readouterr().out
    assert code == 1
    assert "tiny batch 1 pnnx-infer: FAILED worker exited with 1: ValueError" in out
    assert "| # |" not in out
