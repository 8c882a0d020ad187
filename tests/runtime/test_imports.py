"""The package's structure: imports run one way, parser <- layers <- fast backend <- infer,
and no module imports one that imports it back.

Every import counts, at the top of a module or inside a function (a lazy import is still a
dependency), except those under ``if TYPE_CHECKING:`` (annotations only)."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

PACKAGES = ("parser", "layers", "infer")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES
            for path in sorted((REPO / package).rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports: ``from a.b import c`` counts as a.b.c when that is
    a module, else as a.b."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in modules and modules[name] != path}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        colour[name] = GREY
        path.append(name)
        for other in sorted(graph[name]):
            if colour[other] == GREY:
                return path[path.index(other):] + [other]
            if colour[other] == WHITE:
                cycle = visit(other)
                if cycle:
                    return cycle
        path.pop()
        colour[name] = BLACK
        return None

    for name in sorted(graph):
        if colour[name] == WHITE:
            cycle = visit(name)
            if cycle:
                return cycle
    return None


def layer(name: str) -> str:
    """Which floor of the house a module is on."""
    if name.startswith("layers.fast"):
        return "fast"
    return name.split(".")[0]


ALLOWED = {               # a module on the left may import modules on these floors
    "parser": {"parser"},
    "layers": {"parser", "layers"},
    "fast": {"parser", "layers", "fast"},
    "infer": {"parser", "layers", "fast", "infer"},
}


def test_imports_run_one_way():
    wrong = [f"{name} imports {other}" for name, imported in import_graph().items()
             for other in sorted(imported) if layer(other) not in ALLOWED[layer(name)]]
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_between_modules_is_acyclic():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_imports_inside_functions_and_skip_type_checking(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from infer.graph import RuntimeGraph\n"
                      "def f():\n    from layers.fast import conv\n")
    modules = project_modules()
    assert imported_modules(source, modules) == {"layers.fast.conv"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
