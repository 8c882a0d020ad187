"""Fixtures and hooks for every test folder: each test's own random data, the slow and torch
markers, and pnnx exports of torch modules. What tests import (REPO, write_pnnx, ...) is in
support.py; the layer helper (check_layer) in helpers.py."""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

# A graph built before the fast kernels are compiled would run on the reference floor until
# they are (layers/fast/backend.py): the tests of the fast floor wait for them instead.
os.environ.setdefault("PNNX_INFER_BUILD", "wait")


@pytest.fixture(autouse=True)
def _random_data_of_its_own(request):
    """Each test draws its random data (``helpers.rand``) from a generator seeded by its own
    name, so its data does not depend on which tests ran before it: a failure repeats when
    the test runs alone, and adding a test changes no other test's data. The name is the
    node id without its folders (``test_x.py::test_y[case]``; basenames are unique), so moving
    a file to another folder changes no data either."""
    helpers = sys.modules.get("helpers")      # imported by the tests that use it (and torch)
    if helpers is not None:
        path, _, rest = request.node.nodeid.partition("::")
        name = f"{path.rsplit('/', 1)[-1]}::{rest}"
        helpers._rng = np.random.default_rng(zlib.crc32(name.encode()))


# The quick tier (`python -m pytest -m "not slow"`) leaves these out: whole models, zoos and
# exports, fuzzing, notebooks, the benchmark, the command line (a process per test), the two
# kernel back ends compared (the JIT compiles), the kernel build's messages (a build, a
# compiler or an interpreter started per test).
SLOW_MODULES = {"test_bench", "test_kernel_backends", "test_notebooks", "test_models",
                "test_models_zoo", "test_models_more", "test_models_user", "test_fuzz",
                "test_cli", "test_cli_convert", "test_aot_messages"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests of SLOW_MODULES and every test that exports a model with pnnx
    (the ``pnnx_export`` fixture: a torch trace and a pnnx run each), and ``torch`` the tests
    of modules that import torch (they need the test extra)."""
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if name in SLOW_MODULES or "pnnx_export" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if module is not None and "torch" in sys.modules and any(
                value is sys.modules["torch"] or getattr(value, "__module__", "") == "torch"
                for value in vars(module).values()):
            item.add_marker(pytest.mark.torch)


@pytest.fixture(scope="session")
def pnnx_export(tmp_path_factory):
    """``pnnx_export(module, inputs, name, dynamic=False) -> (param, bin)``, once per name."""
    from infer.export import export_module

    folder = tmp_path_factory.mktemp("pnnx")
    done: dict[str, tuple[Path, Path]] = {}

    def export(module, inputs, name: str, dynamic: bool = False):
        if name not in done:
            done[name] = export_module(module, inputs, folder, name, dynamic=dynamic)
        return done[name]

    return export
