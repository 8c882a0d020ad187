"""The command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


def test_classify_refuses_a_top_below_one():
    result = run("classify", "model_file/images/chelsea.png", "--top", "0")
    assert result.returncode == 2
    assert "--top" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, words", [
    (["nosuch"], "unknown model 'nosuch'"),
    (["no_such_package.models:make"], "cannot load 'no_such_package.models:make'"),
    (["resnet18", "--weights", "no/such.pth"], "no weights file no/such.pth"),
    (["resnet18", "--shape", "1,3,a"], "--shape: expected integers"),
], ids=str)
def test_export_reports_user_errors_without_a_traceback(args, words, tmp_path):
    result = run("export", *args, "--out", str(tmp_path))
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr


def test_ops_lists_registered_types():
    result = run("ops")
    assert result.returncode == 0
    assert "nn.Conv2d" in result.stdout and "pnnx.Expression" in result.stdout


def test_export_resnet18_with_a_checkpoint_then_run_it(tmp_path):
    """The export command loads a torchvision-style state_dict (here one saved from a seeded
    model, as the real resnet18-f37072fd.pth cannot be had here) and the files run like torch."""
    import numpy as np
    import torch

    from infer import RuntimeGraph
    from infer.export import resnet18

    model = resnet18(seed=3)
    checkpoint = tmp_path / "resnet18-test.pth"
    torch.save(model.state_dict(), checkpoint)
    assert {"conv1.weight", "bn1.running_var", "layer2.0.downsample.0.weight",
            "layer4.1.bn2.bias", "fc.weight"} <= set(model.state_dict())
    result = run("export", "resnet18", "--weights", str(checkpoint), "--shape", "1,3,64,64",
                 "--dynamic", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    param = tmp_path / "out" / "resnet18.pnnx.param"
    assert result.stdout.splitlines()[0] == str(param)
    x = torch.randn(2, 3, 96, 96)
    (got,) = RuntimeGraph(param).build().forward(x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4)


def test_classify_with_a_param_path_uses_the_model_card_beside_it():
    by_name = run("classify", "model_file/images/coffee.png", "--top", "1")
    by_path = run("classify", "model_file/images/coffee.png", "--top", "1", "--model",
                  "model_file/efficientnet_lite0/efficientnet_lite0.pnnx.param")
    assert by_path.returncode == 0, by_path.stderr
    assert by_path.stdout == by_name.stdout and by_name.stdout.startswith("espresso")
