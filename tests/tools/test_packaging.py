"""What a non-editable install (`pip install .`) carries: the shipped models, labels and photos
are package data of model_file, so an installed copy finds them."""

from __future__ import annotations

import fnmatch

import pytest

from support import REPO

tomllib = pytest.importorskip("tomllib")          # Python 3.11 on


def test_every_shipped_data_file_is_package_data():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    assert "model_file" in setuptools["packages"]
    globs = setuptools["package-data"]["model_file"]
    folder = REPO / "model_file"
    data = [path.relative_to(folder).as_posix() for path in folder.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")
            and "__pycache__" not in path.parts]
    assert "efficientnet_lite0/efficientnet_lite0.pnnx.bin" in data
    missing = [name for name in data if not any(fnmatch.fnmatch(name, g) for g in globs)]
    assert not missing, f"not in pyproject.toml's package-data: {missing}"


def test_classify_finds_the_models_through_the_package():
    import model_file
    from infer.classify import MODEL_DIR

    assert MODEL_DIR == model_file.MODEL_DIR
    assert (MODEL_DIR / "efficientnet_lite0" / "model.json").is_file()
