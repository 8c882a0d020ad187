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
    for engine, row in rows.items():
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
