"""Helpers of the robustness tests: write a model from its operator lines, expect an error.

    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3)f32", ...)
    error = expect_error(ParamFileError, RuntimeGraph(param, binary).build)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from infer import InferError
from tests.conftest import write_pnnx


def header(lines: list[str]) -> str:
    """'operator_count operand_count' for these operator lines, as pnnx writes line 2."""
    operands: set[str] = set()
    for line in lines:
        fields = line.split()
        count = int(fields[2]) + int(fields[3])
        operands.update(fields[4:4 + count])
    return f"{len(lines)} {len(operands)}"


def model_text(*lines: str) -> str:
    """A whole param text: the magic line, the counts, the operator lines."""
    return "\n".join(["7767517", header(list(lines)), *lines]) + "\n"


def write_model(folder: Path, *lines: str, weights: dict[str, np.ndarray] | None = None,
                name: str = "model") -> tuple[Path, Path]:
    """Write ``name.pnnx.param`` from operator lines (counts computed) and its bin."""
    return write_pnnx(folder, model_text(*lines), weights, name=name)


def expect_error(kind: type[InferError], action: Callable[[], object], *words: str
                 ) -> InferError:
    """Run ``action``; it must raise exactly an error of ``kind`` (the project's own) whose
    message holds every one of ``words``. Returns the error."""
    with pytest.raises(InferError) as info:
        action()
    error = info.value
    assert isinstance(error, kind), f"{type(error).__name__}: {error}"
    for word in words:
        assert word in str(error), f"{word!r} not in: {error}"
    return error


def conv_line(**changes: str) -> str:
    """An nn.Conv2d line (3 -> 4 channels, 3x3) with some parameters changed."""
    params = {"bias": "True", "dilation": "(1,1)", "groups": "1", "in_channels": "3",
              "kernel_size": "(3,3)", "out_channels": "4", "padding": "(0,0)",
              "padding_mode": "zeros", "stride": "(1,1)", **changes}
    text = " ".join(f"{k}={v}" for k, v in params.items())
    return f"nn.Conv2d conv 1 1 0 1 {text} @bias=(4)f32 @weight=(4,3,3,3)f32"


def conv_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"conv.weight": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
            "conv.bias": rng.standard_normal(4, dtype=np.float32)}
