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

Messages stay readable whatever the file holds: text quoted from a file (a line, a value, an
expression) goes through ``excerpt`` / ``shorten`` / ``quote``, which keep about QUOTE_LIMIT
characters (the start and the end, or a window around the place of the problem); and any line
of a message longer than MESSAGE_LINE_LIMIT is cut the same way when the error is created.
"""

from __future__ import annotations

import re

QUOTE_LIMIT = 120            # characters of a file's text quoted in a message
MESSAGE_LINE_LIMIT = 1000    # a longer line of a message is cut (a safety net behind QUOTE_LIMIT)


def excerpt(text: str, position: int | None = None,
            limit: int = QUOTE_LIMIT) -> tuple[str, int | None]:
    """``text`` cut to about ``limit`` characters for a message, and the column of ``position``
    in what is shown (``0 <= position <= len(text)``; None stays None).

    Text that fits is shown whole. Longer text keeps its start and its end, with the number of
    characters left out between them; given a position, it keeps a window of ``limit``
    characters around it instead, with ``...`` where it was cut. Control characters are shown
    escaped (a CR as ``\\r``), so the message prints as one clean line per line."""
    if len(text) <= limit:
        start, stop = 0, len(text)
    elif position is None:
        half = limit // 2
        cut = len(text) - 2 * half
        return f"{_visible(text[:half])} ...[{cut:,} characters]... {_visible(text[-half:])}", None
    else:
        start = min(max(0, position - limit // 2), len(text) - limit)
        stop = start + limit
    before = "..." if start > 0 else ""
    after = "..." if stop < len(text) else ""
    shown = before + _visible(text[start:stop]) + after
    if position is None:
        return shown, None
    return shown, len(before) + len(_visible(text[start:position]))


def _visible(text: str) -> str:
    """``text`` with its control characters (but tabs) escaped as Python writes them."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)


def shorten(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and end (see excerpt)."""
    return excerpt(text, None, limit)[0]


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``repr(text)`` of the shortened text: how a message quotes a name or value from a file."""
    return repr(shorten(text, limit))


def _readable(message: str) -> str:
    """The message with every line longer than MESSAGE_LINE_LIMIT shortened."""
    if len(message) <= MESSAGE_LINE_LIMIT:
        return message
    return "\n".join(shorten(line, MESSAGE_LINE_LIMIT) for line in message.split("\n"))


class InferError(Exception):
    """Base class of every error this runtime raises on purpose."""

    def __init__(self, message: str, *, operator: str | None = None):
        message = _readable(message)
        super().__init__(message)
        self.message = message
        self.operator = operator
        self.operator_line = 0       # the operator's line in the param file, when known

    def with_operator(self, operator: str, line: int = 0) -> InferError:
        """Attach the operator ("type name") this error happened in and its line in the param
        file, unless an operator is already set."""
        if self.operator is None:
            self.operator, self.operator_line = operator, line
        return self

    def __str__(self) -> str:
        if not self.operator:
            return self.message
        line = self.operator_line      # unless the message already cites it: "...param:12:"
        cited = re.search(rf"\.param:{line}:|\(line {line}\)", self.message)
        where = f" (line {line})" if line and not cited else ""
        return f"operator {shorten(self.operator)}{where}: {self.message}"


class ParamFileError(InferError):
    """A .pnnx.param file that cannot be read; names the file and line."""

    def __init__(self, message: str, *, path: str = "<string>", line: int | None = None,
                 text: str | None = None):
        self.path, self.line, self.text = path, line, text
        where = f"{path}:{line}" if line is not None else path
        full = f"{where}: {message}"
        if text is not None:
            full += f"\n    {shorten(text)}"
        super().__init__(full)


class BinFileError(InferError):
    """A .pnnx.bin weight archive that cannot be read; names the file and entry."""

    def __init__(self, message: str, *, path: str = "<bin>", entry: str | None = None):
        self.path, self.entry = path, entry
        where = f"{path} [{shorten(entry)}]" if entry else path
        super().__init__(f"{where}: {message}")


class ExpressionError(InferError):
    """A pnnx expression that cannot be parsed or evaluated; shows the position with a caret."""

    def __init__(self, message: str, *, expression: str = "", position: int | None = None):
        self.expression, self.position = expression, position
        full = message
        if expression:
            shown, column = excerpt(expression, position)
            full += f"\n    {shown}"
            if column is not None:
                full += "\n    " + " " * column + "^"
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
