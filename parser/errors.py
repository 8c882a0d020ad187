"""The project's own exceptions: one hierarchy, importable by users.

Every error a user can cause (a bad file, an unknown operator, a wrong input shape, a bad
expression) is raised as one of these, carrying the place it is about: the file and line, the bin
entry, the position in an expression, or the operator.

    InferError                       base of everything this runtime raises on purpose
    ├── ParamFileError               .pnnx.param text: file, line number, line text
    ├── BinFileError                 .pnnx.bin zip: file, entry name
    ├── ExpressionError              pnnx expression text: expression, character position
    ├── RegistryError                a layer type registered twice, or an unknown type asked for
    │   └── UnsupportedOperatorError  an operator type no layer serves (with close matches)
    ├── GraphError                   graph structure: cycles, dangling operands, wrong state
    ├── LayerError                   an operator's parameters or weights are unusable
    ├── ShapeError                   input count / rank / shape / dtype an operator cannot take
    │   └── MemoryBudgetError         a shape plan that would need more memory than allowed
    ├── ImageError                   an image `classify` cannot read or use
    └── ExportError                  a torch model that cannot be loaded, traced or converted

Errors raised inside a layer are re-raised by the graph with the operator attached
(``err.operator`` holds ``"type name"``), so the message always says where it happened.
Users import them from the package: ``from infer import InferError, ShapeError``; catching
InferError catches everything the runtime refuses on purpose (a bare KeyError, IndexError,
UnicodeDecodeError, struct.error or zipfile error escaping is a bug: tests/robustness/test_fuzz.py).
"""

from __future__ import annotations


class InferError(Exception):
    """Base class of every error this runtime raises on purpose."""

    def __init__(self, message: str, *, operator: str | None = None):
        super().__init__(message)
        self.message = message
        self.operator = operator

    def with_operator(self, operator: str) -> InferError:
        """Attach the operator ("type name") this error happened in, unless one is already set."""
        if self.operator is None:
            self.operator = operator
        return self

    def __str__(self) -> str:
        if self.operator:
            return f"operator {self.operator}: {self.message}"
        return self.message


class ParamFileError(InferError):
    """A .pnnx.param file that cannot be read; names the file and line."""

    def __init__(self, message: str, *, path: str = "<string>", line: int | None = None,
                 text: str | None = None):
        self.path, self.line, self.text = path, line, text
        where = f"{path}:{line}" if line is not None else path
        full = f"{where}: {message}"
        if text is not None:
            shown = text if len(text) <= 120 else text[:117] + "..."
            full += f"\n    {shown}"
        super().__init__(full)


class BinFileError(InferError):
    """A .pnnx.bin weight archive that cannot be read; names the file and entry."""

    def __init__(self, message: str, *, path: str = "<bin>", entry: str | None = None):
        self.path, self.entry = path, entry
        where = f"{path} [{entry}]" if entry else path
        super().__init__(f"{where}: {message}")


class ExpressionError(InferError):
    """A pnnx expression that cannot be parsed or evaluated; shows the position with a caret."""

    def __init__(self, message: str, *, expression: str = "", position: int | None = None):
        self.expression, self.position = expression, position
        full = message
        if expression:
            full += f"\n    {expression}"
            if position is not None:
                full += "\n    " + " " * position + "^"
        super().__init__(full)


class RegistryError(InferError):
    """A layer type registered twice, or a type the registry does not know."""


class UnsupportedOperatorError(RegistryError):
    """An operator type that no registered layer serves."""


class GraphError(InferError):
    """A graph that cannot be built or run: a cycle, a dangling operand, a wrong state."""


class LayerError(InferError):
    """Parameters or weights a layer cannot accept (a negative stride, a missing weight)."""


class ShapeError(InferError):
    """Inputs an operator cannot take: wrong count, rank, shape or dtype."""


class MemoryBudgetError(ShapeError, MemoryError):
    """Input shapes whose plan needs more memory than the graph's budget (refused before
    allocating), or a step that ran out of memory; also a MemoryError."""


class ImageError(InferError):
    """An image file (or array) that classification cannot read or use."""


class ExportError(InferError):
    """A model that cannot be loaded, traced or converted by pnnx."""


__all__ = [
    "InferError", "ParamFileError", "BinFileError", "ExpressionError", "RegistryError",
    "UnsupportedOperatorError", "GraphError", "LayerError", "ShapeError", "MemoryBudgetError",
    "ImageError", "ExportError",
]
