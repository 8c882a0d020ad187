"""How the numba kernels become machine code: compiled ahead of time, or just in time.

Every kernel in layers/fast is an ordinary Python function marked with ``@kernel``::

    @kernel(nogil=True, exported=(array(4), array(4), INT, INT))
    def _max_pool2d(x, y, kh, kw): ...

Until the kernels are started (``start``, which RuntimeGraph.build calls), the module-level
name holds a ``Declared`` placeholder. Starting imports every module of layers.fast that
declares kernels and replaces each placeholder, in every module that names it, with its
compiled form, taken from one of two back ends:

* **ahead of time** (the default): the ``exported`` kernels (the ones Python calls) are
  compiled once per machine, with numba's ``pycc``, into CPython extension modules kept on
  disk (layers/fast/aot.py). A process that finds them imports them like any extension:
  numba and LLVM are never imported, which saves their import time and memory. Each call
  checks its array arguments first (dtype, dimensions, C order, alignment), because the
  compiled code trusts them.
* **just in time**: ``numba.njit(cache=True, **options)`` on every kernel, compiled on first
  call and cached by numba on disk. Used when ``PNNX_INFER_KERNELS=jit`` (to work on a
  kernel without rebuilding the modules), or when the modules cannot be built (no C
  compiler, or a numba without pycc).

Both run the same code: numba compiles the same functions with the same options (fastmath,
nogil) either way, and tests/test_kernel_backends.py checks that they agree bit for bit.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import re
import sys
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from parser.errors import InferError

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
        start()
        return compiled(self)(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.func.__module__}.{self.func.__name__} (not started)>"


_declared: list[Declared] = []
_intrinsics: list[Declared] = []
_compiled: dict[Declared, Callable] = {}


def kernel(*, exported: tuple[str, ...] | None = None, **options) -> Callable:
    """Mark a function as a numba kernel compiled with ``options`` (numba.njit's). Kernels
    called from Python give ``exported``: their argument types in numba's notation (``array``,
    ``INT``, ``FLOAT``), for which the ahead-of-time module compiles them."""
    def declare(func: Callable) -> Declared:
        declared = Declared(func, options, exported)
        _declared.append(declared)
        return declared
    return declare


def intrinsic(factory: Callable) -> Declared:
    """Mark ``factory`` as making a numba intrinsic (a few lines of LLVM IR that kernels call,
    such as an atomic load: layers/fast/atomics.py). It runs when numba compiles the kernels,
    so that a process running the ahead-of-time modules never imports numba."""
    declared = Declared(factory, {}, None)
    _intrinsics.append(declared)
    return declared


def declared_kernels() -> list[Declared]:
    """Every kernel, in declaration order."""
    _import_kernel_modules()
    return list(_declared)


def declared_intrinsics() -> list[Declared]:
    """Every intrinsic, in declaration order."""
    _import_kernel_modules()
    return list(_intrinsics)


def exported_kernels() -> list[Declared]:
    """The kernels that Python calls, in declaration order."""
    _import_kernel_modules()
    return [k for k in _declared if k.exported is not None]


def compiled(declared: Declared) -> Callable:
    """What runs for this kernel now (after ``start``)."""
    function = _compiled.get(declared)
    if function is None:                       # a helper run from Python: only numba has it
        use_jit()
        function = _compiled[declared]
    return function


def start() -> str:
    """Choose the back end once per process and bind the kernels; returns its name,
    "aot" or "jit" (see the module docstring)."""
    global _backend
    with _starting:
        if _backend is None:
            _backend = _bind_backend(wanted_backend())
    return _backend


def wanted_backend() -> str:
    """``PNNX_INFER_KERNELS``: "aot" (the default) or "jit"."""
    wanted = os.environ.get("PNNX_INFER_KERNELS", "aot").strip().lower()
    if wanted not in ("aot", "jit"):
        raise InferError(f"PNNX_INFER_KERNELS={wanted!r}: expected 'aot' or 'jit'")
    return wanted


_backend: str | None = None
_starting = threading.RLock()


def _bind_backend(wanted: str) -> str:
    _import_kernel_modules()
    if wanted == "aot":
        from layers.fast import aot

        kernels = aot.load_or_build()
        if kernels is not None:
            _bind({k: _checked(k, getattr(kernels, k.name)) for k in exported_kernels()})
            return "aot"
    use_jit()
    return "jit"


@functools.cache
def use_jit() -> None:
    """Bind every kernel to its numba dispatcher (compiled on first call, cached on disk)."""
    import numba

    _stale_with_any_source()
    _bind({i: i.func() for i in _intrinsics})           # first: the kernels call them
    _bind({k: numba.njit(cache=True, **k.options)(k.func) for k in _declared})


def _stale_with_any_source() -> None:
    """Make numba's disk cache of the kernels stale whenever any kernel source changes.

    numba keeps a function's compiled code until that function's own file changes; it does
    not look at the files of the kernels and intrinsics the function calls (an edit to
    simd.py would leave pointwise.py's kernels compiled the old way, in this mode and in the
    modules built ahead of time, whose builder compiles through this cache).
    Here the kernels' cache entries carry aot.key() instead, a hash of every kernel source
    (and of the CPU and versions). numba offers no switch for this: a cache locator of our
    own goes first in its list, for layers.fast's functions only, and finds the same place
    as numba's own; where numba's caching is laid out differently, nothing changes and
    the build still starts from an empty cache (aot._build_in_children)."""
    from numba.core import caching

    from layers.fast import aot

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None),
                                                      list):
        return
    stamp = aot.key()

    class KernelSourcesLocator(base):
        """numba's own locator for the function, with aot.key() as its source stamp."""

        def __init__(self, inner):
            self.inner = inner

        def ensure_cache_path(self):
            self.inner.ensure_cache_path()

        def get_cache_path(self):
            return self.inner.get_cache_path()

        def get_disambiguator(self):
            return self.inner.get_disambiguator()

        def get_source_stamp(self):
            return stamp

        @classmethod
        def from_function(cls, py_func, py_file):
            if not getattr(py_func, "__module__", "").startswith("layers.fast."):
                return None
            for other in impl._locator_classes:
                if other is not cls:
                    inner = other.from_function(py_func, py_file)
                    if inner is not None:
                        return cls(inner)
            return None

    impl._locator_classes.insert(0, KernelSourcesLocator)


def _bind(functions: dict[Declared, Callable]) -> None:
    """Put ``functions`` in place of their declarations in every kernel module, so that both
    Python callers and the kernels calling each other (numba reads module globals) see them."""
    for declared, function in functions.items():
        _compiled.setdefault(declared, function)  # a kernel bound ahead of time stays so
    for module in _kernel_modules():
        names = vars(module)
        for name, value in list(names.items()):
            if isinstance(value, Declared) and value in functions:
                names[name] = functions[value]


def _checked(declared: Declared, function: Callable) -> Callable:
    """The ahead-of-time ``function`` behind a check of its array arguments: compiled code
    reads them as the types it was compiled for, so a float64 or strided array would be
    read wrongly (or crash) instead of raising."""
    arrays = [(i, np.dtype(t[:t.index("[")]), t.count(",") + 1)
              for i, t in enumerate(declared.exported) if "[" in t]

    def call(*args):
        for index, dtype, ndim in arrays:
            a = args[index]
            if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim
                    and a.flags.c_contiguous and a.flags.aligned):
                raise TypeError(
                    f"kernel {declared.name}: argument {index} must be a C-contiguous, aligned "
                    f"{dtype} array of {ndim} dimensions, got "
                    f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
        function(*args)
    call.__name__ = call.__qualname__ = declared.name
    call.__doc__ = declared.func.__doc__
    call.unchecked = function      # for callers whose arrays are their own, made right once
    return call


def _import_kernel_modules() -> None:
    """Import every module of layers.fast that declares kernels or intrinsics (a line that
    starts with ``@kernel`` or ``@intrinsic``), so that all are declared: a new kernel module
    needs no entry anywhere. The others (this one, aot, conv, the layers) are left alone."""
    for name in _kernel_module_names():
        importlib.import_module(f"layers.fast.{name}")


@functools.cache
def _kernel_module_names() -> tuple[str, ...]:
    import layers.fast

    names = []
    for module in pkgutil.iter_modules(layers.fast.__path__):
        path = Path(layers.fast.__path__[0]) / f"{module.name}.py"
        if path.exists() and _DECLARES.search(path.read_text(encoding="utf-8")):
            names.append(module.name)
    return tuple(sorted(names))


_DECLARES = re.compile(r"^@(kernel|intrinsic)\b", re.MULTILINE)


def _kernel_modules() -> list:
    """The modules of layers.fast imported so far (any of them may name a kernel)."""
    return [module for name, module in list(sys.modules.items())
            if name.startswith("layers.fast.")]
