"""Packages whose public names load from their modules on first use (PEP 562).

    __getattr__, __dir__ = lazy_names(globals(), {"RuntimeGraph": "infer.graph", ...})

`import infer` or `import parser` then costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(namespace: dict[str, Any], module_of: dict[str, str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` (imports `module_of[name]` and keeps the value in
    `namespace`) and its `__dir__`."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
