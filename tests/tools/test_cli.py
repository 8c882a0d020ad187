"""The command line, run as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support import REPO

PHOTO = "model_file/images/chelsea.png"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **env})


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
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "error: no/such/photo.png: no such file\n"


def test_classify_refuses_a_top_below_one():
    result = run("classify", "model_file/images/chelsea.png", "--top", "0")
    assert result.returncode == 2
    assert "--top" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, words", [
    (["nosuch"], "unknown model 'nosuch'"),
    (["no_such_package.models:make"], "cannot load 'no_such_package.models:make'"),
    (["resnet18", "--weights", "no/such.pth"], "no weights file no/such.pth"),
    (["resnet18", "--shape", "1,3,a"], "--shape: expected integers"),
    (["resnet18", "--weights", "w.pth", "--random-weights"],
     "--random-weights: not allowed with argument --weights"),
    (["efficientnet-lite0", "--random-weights"], "--random-weights is for resnet18 only"),
    (["efficientnet_lite0", "--random-weights"], "--random-weights is for resnet18 only"),
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


# ================================================================ export resnet18 weights

def test_export_resnet18_without_weights_is_refused(tmp_path):
    """No --weights and no checkpoint in the torch hub cache (an empty TORCH_HOME): the export
    stops and says where the checkpoint comes from, rather than exporting random weights."""
    result = run("export", "resnet18", "--out", str(tmp_path / "out"),
                 TORCH_HOME=str(tmp_path / "torch_home"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: resnet18 needs its ImageNet weights")
    for words in ("--weights resnet18-f37072fd.pth",
                  "https://download.pytorch.org/models/resnet18-f37072fd.pth",
                  "does not download", str(tmp_path / "torch_home"), "--random-weights"):
        assert words in line
    assert not (tmp_path / "out").exists()


def test_export_help_says_where_the_resnet18_checkpoint_comes_from():
    result = run("export", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "resnet18-f37072fd.pth" in text and "download.pytorch.org/models/" in text
    assert "--random-weights" in text and "downloads nothing" in text


def test_export_resnet18_with_random_weights_when_asked(tmp_path):
    """--random-weights exports the model of ``torch.manual_seed(0); resnet18()``, with a
    warning that its answers mean nothing."""
    import numpy as np
    import torch

    from infer import RuntimeGraph
    from infer.export import resnet18

    result = run("export", "resnet18", "--random-weights", "--shape", "1,3,64,64",
                 "--out", str(tmp_path), TORCH_HOME=str(tmp_path / "torch_home"))
    assert result.returncode == 0, result.stderr
    assert "seeded random weights" in result.stderr
    torch.manual_seed(0)
    model = resnet18()
    x = torch.randn(1, 3, 64, 64)
    (got,) = RuntimeGraph(tmp_path / "resnet18.pnnx.param").build().forward(x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4)


# ================================================================ classify: one bad image of many

def test_classify_goes_on_past_bad_images_and_fails_at_the_end(tmp_path):
    """A missing file, a damaged PNG, an empty file and a device: one line each on stderr,
    naming the file and why, nothing of OpenCV's own; the good photos are classified; exit 1."""
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes((REPO / PHOTO).read_bytes()[:3000])
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    result = run("classify", str(damaged), PHOTO, "no/such.png", str(empty), "/dev/null",
                 "model_file/images/coffee.png", "--top", "1")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {damaged}: cannot decode this file as an image (damaged, or not a format "
        f"OpenCV reads: png, jpg, bmp, tiff, webp, ...)",
        "error: no/such.png: no such file",
        f"error: {empty}: empty file",
        "error: /dev/null: is a device, not a regular file"]
    lines = result.stdout.splitlines()
    assert lines[0] == f"{PHOTO}:" and lines[2] == "model_file/images/coffee.png:"
    assert len(lines) == 4 and lines[3].startswith("espresso")


def test_read_image_says_why_a_file_is_no_image(tmp_path):
    from infer.classify import read_image
    from parser.errors import ImageError

    (tmp_path / "notes.png").write_text("not an image")
    for path, words in ((tmp_path / "missing.png", "no such file"),
                        (tmp_path / "notes.png", "cannot decode this file as an image")):
        with pytest.raises(ImageError, match=f"{path}: {words}"):
            read_image(path)


def test_ctrl_c_ends_with_one_line():
    """SIGINT while classifying: the line "interrupted" on stderr, exit code 130."""
    process = subprocess.Popen([sys.executable, "-m", "infer", "classify", *[PHOTO] * 500,
                                "--top", "1"], cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout.readline() == f"{PHOTO}:\n"      # built, classifying
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, stderr) == (130, "interrupted\n")   # stderr shown if not


def test_ctrl_c_while_loading_ends_with_one_line():
    """SIGINT while numpy and the runtime load (the first half second of a command): the
    same one line. `import infer` loads nothing, so main() is running by then."""
    stop_at_numpy = ("import builtins, runpy, sys\n"
                     "real_import = builtins.__import__\n"
                     "def interrupted_import(name, *args, **kwargs):\n"
                     "    if name == 'numpy':\n"
                     "        raise KeyboardInterrupt\n"
                     "    return real_import(name, *args, **kwargs)\n"
                     "builtins.__import__ = interrupted_import\n"
                     "sys.argv = ['infer', 'classify', sys.argv[1]]\n"
                     "runpy.run_module('infer', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run([sys.executable, "-c", stop_at_numpy, str(PHOTO)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "interrupted\n")


def test_an_error_raised_while_ctrl_c_unwinds_still_ends_with_one_line(monkeypatch, capsys):
    """A library stopped by Ctrl-C may raise something else as it unwinds (tqdm's write,
    interrupted inside its lock, releases the lock unheld: RuntimeError): still the line
    "interrupted" and exit code 130; the same error without an interrupt is not hidden, and
    the project's own errors stay one line and exit code 2."""
    import infer.__main__ as cli
    from parser.errors import InferError

    def interrupted_then_broken(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock")  # noqa: B904 (as tqdm does)

    def broken(args):
        raise RuntimeError("a bug")

    def refused(args):
        raise InferError("no such model")

    monkeypatch.setattr(cli, "_ops", interrupted_then_broken)
    assert cli.main(["ops"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    monkeypatch.setattr(cli, "_ops", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["ops"])
    monkeypatch.setattr(cli, "_ops", refused)
    assert cli.main(["ops"]) == 2
    assert capsys.readouterr().err == "error: no such model\n"


def test_import_infer_loads_nothing_until_used():
    code = ("import sys, infer, parser\n"
            "assert 'numpy' not in sys.modules, 'import infer loaded numpy'\n"
            "from infer import RuntimeGraph, InferError\n"
            "assert RuntimeGraph.__module__ == 'infer.graph' and 'numpy' in sys.modules\n"
            "assert parser.read_param.__module__ == 'parser.param'\n"
            "assert {'RuntimeGraph', 'Table'} <= set(dir(infer))\n"
            "try:\n"
            "    infer.no_such_name\n"
            "except AttributeError as err:\n"
            "    assert 'no_such_name' in str(err)\n"
            "else:\n"
            "    raise SystemExit('no AttributeError')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ================================================================ command-line consistency

def test_model_names_take_either_spelling():
    by_underscore = run("classify", PHOTO, "--top", "2", "--model", "efficientnet_lite0")
    by_dash = run("classify", PHOTO, "--top", "2", "--model", "efficientnet-lite0")
    assert by_dash.returncode == 0, by_dash.stderr
    assert by_dash.stdout == by_underscore.stdout and by_dash.stderr == ""
    from infer.export import builtin_name

    assert builtin_name("efficientnet_lite0") == builtin_name("efficientnet-lite0") \
        == "efficientnet-lite0"
    assert builtin_name("resnet18") == "resnet18" and builtin_name("resnet") is None


@pytest.mark.parametrize("args", [["-v", "classify", PHOTO], ["classify", "-v", PHOTO],
                                  ["classify", PHOTO, "--verbose"]], ids=" ".join)
def test_verbose_before_or_after_the_command(args):
    result = run(*args, "--top", "1")
    assert result.returncode == 0, result.stderr
    assert "INFO infer.graph: built" in result.stderr


def test_not_verbose_logs_no_information():
    result = run("classify", PHOTO, "--top", "1")
    assert result.returncode == 0 and "INFO" not in result.stderr


def test_version(monkeypatch):
    import re
    from importlib import metadata

    from infer.__main__ import version

    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version = "(.+)"', pyproject, re.M).group(1)
    result = run("--version")
    assert result.returncode == 0 and result.stdout == f"pnnx-infer {version()}\n"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version() == declared


@pytest.mark.parametrize("command", ["classify", "ops", "convert", "export"])
def test_help_shows_defaults_and_the_shipped_models(command):
    result = run(command, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "-v, --verbose" in text
    if command == "classify":
        assert "(default: 5)" in text and "(default: efficientnet_lite0)" in text
        assert "--model MODEL a shipped model (efficientnet_lite0;" in text
    if command == "export":
        assert "default: 1,3,224,224" in text


@pytest.mark.parametrize("pick", ["folder", "param"])
def test_classify_without_a_model_card_says_what_it_falls_back_to(tmp_path, pick):
    """A folder of pnnx files (a fresh export) or a .param path with no model.json beside it:
    the preprocessing it falls back to is said on stderr, not used silently."""
    shipped = REPO / "model_file" / "efficientnet_lite0"
    for suffix in ("param", "bin"):
        (tmp_path / f"net.pnnx.{suffix}").symlink_to(shipped / f"efficientnet_lite0.pnnx.{suffix}")
    model = tmp_path if pick == "folder" else tmp_path / "net.pnnx.param"
    result = run("classify", "model_file/images/coffee.png", "--top", "1", "--model", str(model))
    assert result.returncode == 0, result.stderr
    (note,) = result.stderr.splitlines()
    assert note.startswith(f"note: {tmp_path / 'net.pnnx.param'} has no model.json beside it: "
                           f"using ImageNet labels and torchvision's preprocessing (shorter "
                           f"side 256, centre crop 224, mean 0.485,0.456,0.406, std "
                           f"0.229,0.224,0.225)")
    assert result.stdout.split()[0] in {"espresso", "cup"}


def test_a_folder_with_neither_model_card_nor_one_param_file_is_refused(tmp_path):
    result = run("classify", PHOTO, "--model", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (f"error: {tmp_path}: a model folder holds a model.json or one "
                             f".pnnx.param file, this one 0 .pnnx.param files and no "
                             f"model.json\n")


def test_export_keep_extras_keeps_what_compare_with_torch_runs(tmp_path):
    """--keep-extras keeps pnnx's *_pnnx.py beside the files, which compare_with_torch runs as
    torch's side (the message of a missing one names the flag)."""
    import numpy as np

    from infer import RuntimeGraph

    (tmp_path / "smallnet.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n")
    result = run("export", "smallnet:make", "--shape", "1,3,8,8", "--keep-extras", "--out",
                 str(tmp_path / "out"), PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    assert result.returncode == 0, result.stderr
    graph = RuntimeGraph(tmp_path / "out" / "make.pnnx.param").build()
    report = graph.compare_with_torch(np.ones((1, 3, 8, 8), np.float32))
    assert report.ok and report.compared
