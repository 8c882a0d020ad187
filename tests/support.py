"""What the tests share, torch-free (layer tests use helpers.py, which needs torch): the
repository root, and hand-made pnnx files, written whole or from their operator lines.

    param, binary = write_pnnx(tmp_path, param_text, {"conv.weight": w})
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3)f32", ...)
    error = expect_error(ParamFileError, RuntimeGraph(param, binary).build)
    for low, high, name, fields in mappings(): ...   # this process's /proc/self/smaps

Tests import it as ``support`` (pytest puts tests/, the folder of conftest.py, on sys.path);
conftest.py keeps only fixtures and hooks.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from parser.errors import InferError

REPO = Path(__file__).resolve().parent.parent          # the repository: tests/ is one level in
assert (REPO / "pyproject.toml").is_file(), f"not the repository root: {REPO}"



def mappings() -> Iterator[tuple[int, int, str, dict[str, str]]]:
    """This process's memory mappings from Linux's /proc/self/smaps: (start, end, what is
    mapped - a path, or "" for anonymous memory -, {field: value} such as "Rss" -> "12 kB",
    "VmFlags" -> "rd wr mr ..."). Nothing where there is no such file."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return
    current: tuple[int, int, str, dict[str, str]] | None = None
    for line in lines:
        head, _, rest = line.partition(" ")
        if "-" in head and all(c in "0123456789abcdef-" for c in head):   # a mapping's line
            if current is not None:
                yield current
            low, high = (int(part, 16) for part in head.split("-"))
            parts = rest.split(maxsplit=4)
            current = (low, high, parts[4].strip() if len(parts) > 4 else "", {})
        elif current is not None and ":" in head:
            current[3][head.rstrip(":")] = rest.strip()
    if current is not None:
        yield current

def case_id(value: object) -> str | None:
    """A parametrized case's id: ``str(value)``, but pytest's own name for a function (its
    repr holds a memory address, and a test id must be the same in every run: it seeds the
    test's random data and names it for ``pytest -k`` and for --lf)."""
    return None if callable(value) else str(value)


def write_pnnx(folder: Path, param_text: str, weights: dict[str, np.ndarray] | None = None,
               name: str = "model") -> tuple[Path, Path]:
    """Write ``name.pnnx.param`` (the text, dedented lines) and a store-only ``name.pnnx.bin``
    holding ``weights`` (entry name -> array), as pnnx does."""
    folder.mkdir(parents=True, exist_ok=True)
    param = folder / f"{name}.pnnx.param"
    lines = [line.strip() for line in param_text.strip().splitlines()]
    param.write_text("\n".join(lines) + "\n", encoding="utf-8")
    binary = folder / f"{name}.pnnx.bin"
    with zipfile.ZipFile(binary, "w", compression=zipfile.ZIP_STORED) as archive:
        for entry, array in (weights or {}).items():
            archive.writestr(entry, np.ascontiguousarray(array).tobytes())
    return param, binary


# ----- a model from its operator lines, and the error it must raise ---------------------------

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


def assert_plan_sound(plan) -> None:
    """A memory plan (infer.memory.MemoryPlan) never gives two operands alive at once the same
    bytes of a buffer: an in-place chain is one group with its owner, a cat's pieces one group
    with the cat's output, inside which the pieces lie side by side within the output."""
    groups: dict[str, list] = {}                    # group key -> its rows
    key_of: dict[int, str] = {}                     # buffer -> the key of its last group
    for row in plan.operands:
        assert plan.buffer_sizes[row.buffer] >= row.offset + row.nbytes
        if row.piece_of or row.how == "joined":
            key = row.piece_of or row.name
        elif row.how == "in place":
            key = key_of[row.buffer]
        else:
            key = row.name
        groups.setdefault(key, []).append(row)
        key_of[row.buffer] = key
    spans = []
    for key, rows in groups.items():
        pieces = sorted((r.offset, r.offset + r.nbytes) for r in rows
                        if r.piece_of and r.how != "in place")
        for (_, end), (start, _) in zip(pieces, pieces[1:]):
            assert end <= start, f"pieces of {key} overlap"
        spans.append((rows[0].buffer, min(r.first for r in rows), max(r.last for r in rows),
                      key))
    spans.sort()
    for (buffer, _, end, key), (other, start, _, next_key) in zip(spans, spans[1:]):
        assert buffer != other or end < start, f"{key} and {next_key} share live memory"


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
