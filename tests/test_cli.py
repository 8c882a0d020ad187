"""The command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)


def test_classify_prints_a_cat_first():
    result = run("classify", "model_file/images/chelsea.png", "--top", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    label, probability = lines[0].rsplit(maxsplit=1)
    assert label.strip() in {"tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat"}
    probabilities = [float(line.rsplit(maxsplit=1)[1]) for line in lines]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < probabilities[0] <= 1


def test_classify_several_images():
    result = run("classify", "model_file/images/chelsea.png", "model_file/images/coffee.png",
                 "--top", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].endswith("chelsea.png:") and lines[3].endswith("coffee.png:")
    assert lines[4].split()[0] in {"espresso", "cup"}


def test_classify_reports_a_missing_image_clearly():
    result = run("classify", "no/such/photo.png")
    assert result.returncode == 2
    assert "no/such/photo.png" in result.stderr and "Traceback" not in result.stderr


def test_ops_lists_registered_types():
    result = run("ops")
    assert result.returncode == 0
    assert "nn.Conv2d" in result.stdout and "pnnx.Expression" in result.stdout
