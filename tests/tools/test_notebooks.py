"""Every teaching notebook runs top to bottom in a clean kernel, with no network.

The notebooks are committed with their outputs (so they read well on a code host); this test
re-executes each one from scratch, fails on the first cell that raises, and checks that the
committed text outputs (not stderr) are what the fresh run printed, numbers with a decimal
point aside (timings, errors of 1e-7), temporary paths aside, and which engine drew a graph
(graphviz's dot where it is installed, else the built-in layout: infer/draw.py); a cell
tagged ``timings`` (a table sorted by time) is not compared. Regenerate the stored outputs
after a change with (``pip install -e ".[test,notebooks]"``):

    jupyter nbconvert --to notebook --execute --inplace notebooks/*.ipynb
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
import time
from pathlib import Path

import pytest

from support import REPO

if not all(importlib.util.find_spec(name) for name in ("nbformat", "nbclient")):
    pytest.skip("nbformat and nbclient are not installed (the notebooks extra)",
                allow_module_level=True)

# one worker runs them: importing nbformat takes seconds (jsonschema builds its grammars),
# in the worker that reads a notebook only
pytestmark = pytest.mark.xdist_group("notebooks")

NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 300          # seconds: a guard against a hung cell, not a speed target
DECIMAL = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+")
TEMPORARY = re.compile(re.escape(tempfile.gettempdir()) + r"/[\w./-]+")
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
DRAWING = re.compile(r"<Drawing by \w+: \d+ characters of SVG>")   # infer/draw.py's repr


def shown(notebook) -> list[tuple[int, str]]:
    """(cell index, text it printed) for the code cells not tagged ``timings``, with
    drawings, decimal numbers, temporary paths, addresses and runs of spaces made alike."""
    texts = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or "timings" in cell.metadata.get("tags", []):
            continue
        parts = []
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stdout":
                parts.append(output.text)       # not stderr: a first run's build messages
            elif output.output_type in ("execute_result", "display_data"):
                parts.append(output.get("data", {}).get("text/plain", ""))
        # temporary paths first: their random names hold digits the decimal mask would cut
        text = DRAWING.sub("<Drawing>", "".join(parts))
        text = ADDRESS.sub("0x?", DECIMAL.sub("#", TEMPORARY.sub("<tmp>", text)))
        texts.append((index, re.sub(r"[ \t]+", " ", text)))
    return texts


def test_the_notebooks_are_there_in_teaching_order():
    numbers = [int(path.name[:2]) for path in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1)) and len(NOTEBOOKS) >= 7


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_from_a_clean_kernel(path: Path):
    import nbclient
    import nbformat

    committed = shown(nbformat.read(path, as_version=4))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    client.execute()             # raises CellExecutionError naming the cell that failed
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors
    for (index, old), (_, new) in zip(committed, shown(notebook)):
        old_lines, new_lines = old.splitlines(), new.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b),
                     min(len(old_lines), len(new_lines)))
        assert old == new, (
            f"{path.name}, cell {index}: the committed output is stale (regenerate: see this "
            f"file's docstring); line {first}: committed "
            f"{old_lines[first] if first < len(old_lines) else '<end>'!r}, fresh run "
            f"{new_lines[first] if first < len(new_lines) else '<end>'!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_with_its_outputs(path: Path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count is not None for cell in code)
