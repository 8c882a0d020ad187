"""The declarations of the numba kernels: ``@kernel``, ``@intrinsic`` and the type names.

Every kernel in layers/fast is an ordinary Python function marked with ``@kernel``::

    @kernel(nogil=True, exported=(array(4), array(4), INT, INT))
    def _max_pool2d(x, y, kh, kw): ...

Until the kernels are started (layers/fast/backend.py's ``start``, which RuntimeGraph.build
calls), the module-level name holds a ``Declared`` placeholder; starting replaces it, in
every module that names it, with its compiled form. This module only declares: it imports
no other module of layers.fast (and neither numba), so every kernel module can import it,
and it records the declarations in ``DECLARED`` and ``INTRINSICS``, in declaration order.
Calling a placeholder asks the back end, through the function it installs here at import
(``set_first_call``), to start the kernels and give the compiled one.
"""

from __future__ import annotations

import functools
from typing import Callable

INT, FLOAT = "i8", "f8"


def array(ndim: int, dtype: str = "f4") -> str:
    """numba's name for a C-contiguous array of ``ndim`` dimensions: f4[:, ::1] (float32)."""
    return dtype + "[" + ":, " * (ndim - 1) + "::1]"


class Declared:
    """A kernel before the back end is chosen: calling it starts the kernels first."""

    def __init__(self, func: Callable, options: dict, exported: tuple[str, ...] | None):
        self.func, self.options, self.exported = func, options, exported
        self.name = func.__name__.lstrip("_")
        functools.update_wrapper(self, func)

    def __call__(self, *args):
        return _first_call(self)(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.func.__module__}.{self.func.__name__} (not started)>"


DECLARED: list[Declared] = []          # every @kernel, in declaration order
INTRINSICS: list[Declared] = []        # every @intrinsic, in declaration order


def kernel(*, exported: tuple[str, ...] | None = None, **options) -> Callable:
    """Mark a function as a numba kernel compiled with ``options`` (numba.njit's). Kernels
    called from Python give ``exported``: their argument types in numba's notation (``array``,
    ``INT``, ``FLOAT``), for which the ahead-of-time module compiles them. Every kernel has
    numpy's error model: a float division by zero gives inf or NaN, as in numpy, instead of
    Python's check for it, a branch that keeps a loop with a division from being vectorised."""
    def declare(func: Callable) -> Declared:
        declared = Declared(func, {"error_model": "numpy", **options}, exported)
        DECLARED.append(declared)
        return declared
    return declare


def intrinsic(factory: Callable) -> Declared:
    """Mark ``factory`` as making a numba intrinsic (a few lines of LLVM IR that kernels call,
    such as an atomic load: layers/fast/atomics.py). It runs when numba compiles the kernels,
    so that a process running the ahead-of-time modules never imports numba."""
    declared = Declared(factory, {}, None)
    INTRINSICS.append(declared)
    return declared


def _not_started(declared: Declared) -> Callable:
    raise RuntimeError(f"kernel {declared.name} called before layers.fast.backend was "
                       "imported (import layers.fast)")


_first_call: Callable[[Declared], Callable] = _not_started


def set_first_call(start_and_get: Callable[[Declared], Callable]) -> None:
    """Install what a placeholder's call runs: ``start_and_get(declared)`` starts the kernels
    and returns the compiled ``declared`` (the back end installs it when it is imported)."""
    global _first_call
    _first_call = start_and_get
