"""How the numba kernels become machine code: compiled ahead of time, or just in time.

The kernels are declared with ``@kernel`` and ``@intrinsic`` (layers/fast/kernel.py, which
the kernel modules import); until they are started (``start``, which RuntimeGraph.build
calls), each module-level name holds a ``Declared`` placeholder. Starting imports every
module of layers.fast that declares kernels and replaces each placeholder, in every module
that names it, with its compiled form (layers/fast/binding.py), taken from one of two back
ends:

* **ahead of time** (the default): the ``exported`` kernels (the ones Python calls) are
  compiled once per machine, with numba's ``pycc``, into CPython extension modules kept on
  disk (layers/fast/aot.py); ``start(wait=False)``, which a graph's build calls, has a
  detached process build them and returns while it runs (``PNNX_INFER_BUILD``). A process
  that finds them imports them like any extension: numba and LLVM are never imported, which
  saves their import time and memory. Each call checks its array arguments first (dtype,
  dimensions, C order, alignment), because the compiled code trusts them.
* **just in time**: ``numba.njit(cache=True, **options)`` on every kernel, compiled on first
  call and cached by numba on disk. Used when ``PNNX_INFER_KERNELS=jit`` (to work on a
  kernel without rebuilding the modules), or when the modules cannot be built (no C
  compiler, or a numba without pycc).

Both run the same code: numba compiles the same functions with the same options (fastmath,
nogil) either way, and tests/fast/test_kernel_backends.py checks that they agree bit for bit.
This module is the top of the kernels' machinery: it imports kernel.py, binding.py and
aot.py, and only the package, the fast layers and their users (workers.py, infer) import it.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

import numpy as np

from layers.fast import binding
from layers.fast.binding import declared_intrinsics, declared_kernels, exported_kernels
from layers.fast.kernel import FLOAT, INT, Declared, array, intrinsic, kernel, set_first_call
from parser.errors import InferError

__all__ = ["start", "wanted_backend", "build_mode", "COMPILING", "FAILED", "compiled",
           "use_jit", "declared_kernels", "declared_intrinsics", "exported_kernels",
           # the declarations, where they were before kernel.py
           "kernel", "intrinsic", "Declared", "array", "INT", "FLOAT"]


def compiled(declared: Declared) -> Callable:
    """What runs for this kernel now (after ``start``)."""
    function = binding.bound(declared)
    if function is None:                       # a helper run from Python: only numba has it
        use_jit()
        function = binding.bound(declared)
    return function


COMPILING, FAILED = "compiling", "failed"      # start(wait=False): nothing bound yet


def start(wait: bool = True) -> str:
    """Choose the back end once per process and bind the kernels; returns its name, "aot"
    or "jit" (see the module docstring). With ``wait=False``, when the compiled modules are
    not built yet and ``PNNX_INFER_BUILD`` is "background" (the default), a detached process
    builds them (aot.build_in_background) and this returns at once: "compiling" while it
    runs, "failed" if it ended without them; a later call binds them once they are there."""
    global _backend
    with _starting:
        if _backend is None:
            wanted = wanted_backend()
            if not wait and wanted == "aot" and build_mode() == "background":
                from layers.fast import aot

                build = aot.build_in_background()
                state = "ready" if build is None else build.state()
                if state != "ready":
                    return state
            _backend = _bind_backend(wanted)
    return _backend


def wanted_backend() -> str:
    """``PNNX_INFER_KERNELS``: "aot" (the default) or "jit"."""
    wanted = os.environ.get("PNNX_INFER_KERNELS", "aot").strip().lower()
    if wanted not in ("aot", "jit"):
        raise InferError(f"PNNX_INFER_KERNELS={wanted!r}: expected 'aot' or 'jit'")
    return wanted


def build_mode() -> str:
    """``PNNX_INFER_BUILD``: "background" (the default: a graph built before the compiled
    modules exist runs on the reference floor until they do) or "wait" (its build waits for
    them, about a minute, once per machine)."""
    mode = os.environ.get("PNNX_INFER_BUILD", "background").strip().lower()
    if mode not in ("background", "wait"):
        raise InferError(f"PNNX_INFER_BUILD={mode!r}: expected 'background' or 'wait'")
    return mode


_backend: str | None = None
_starting = threading.RLock()


def _start_and_get(declared: Declared) -> Callable:
    """A placeholder's first call (kernel.py): start the kernels, then run the compiled one."""
    start()
    return compiled(declared)


set_first_call(_start_and_get)


def _bind_backend(wanted: str) -> str:
    binding.import_kernel_modules()
    if wanted == "aot":
        from layers.fast import aot        # here, not on top: ``python -m layers.fast.aot``
                                           # then runs the only copy of it

        kernels = aot.load_or_build()
        if kernels is not None:
            use_compiled(kernels)
            return "aot"
    use_jit()
    return "jit"


def use_compiled(kernels: object) -> None:
    """Bind every kernel to its compiled function, an attribute of ``kernels`` (the
    modules' kernels, aot.load_or_build), and make "aot" this process's back end."""
    global _backend
    with _starting:
        binding.import_kernel_modules()
        binding.bind({k: _checked(k, getattr(kernels, k.name)) for k in exported_kernels()})
        _backend = "aot"


def use_jit() -> None:
    """Bind every kernel to its numba dispatcher (compiled on first call, cached on disk
    under aot.key(): binding.use_jit), once per process."""
    from layers.fast import aot

    binding.use_jit(aot.key)


def _checked(declared: Declared, function: Callable) -> Callable:
    """The ahead-of-time ``function`` behind a check of its array arguments: compiled code
    reads them as the types it was compiled for, so a float64 or strided array would be
    read wrongly (or crash) instead of raising. The check runs on every call, so the common
    case is one test (a plain, writeable, C-contiguous array of the right dtype and rank:
    ``flags.carray``); anything else gets the full check (``_usable``) before it is refused."""
    arrays = [(i, np.dtype(t[:t.index("[")]), t.count(",") + 1)
              for i, t in enumerate(declared.exported) if "[" in t]
    plain = np.ndarray

    def call(*args):
        for index, dtype, ndim in arrays:
            a = args[index]
            if (type(a) is plain and a.dtype is dtype and a.ndim == ndim
                    and a.flags.carray) or _usable(a, dtype, ndim):
                continue
            raise TypeError(
                f"kernel {declared.name}: argument {index} must be a C-contiguous, aligned "
                f"{dtype} array of {ndim} dimensions, got "
                f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
        function(*args)
    call.__name__ = call.__qualname__ = declared.name
    call.__doc__ = declared.func.__doc__
    call.unchecked = function      # for callers whose arrays are their own, made right once
    return call


def _usable(a: object, dtype: np.dtype, ndim: int) -> bool:
    """What compiled code can read as an array of ``dtype`` and ``ndim``: C-contiguous and
    aligned (read-only and subclassed arrays too)."""
    if not isinstance(a, np.ndarray):
        return False
    flags = a.flags
    return a.dtype == dtype and a.ndim == ndim and flags.c_contiguous and flags.aligned
