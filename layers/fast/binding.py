"""Which kernels there are, and putting compiled functions in place of their declarations.

    declared_kernels(), declared_intrinsics(), exported_kernels()   every one, once imported
    kernel_sources()          the files the compiled code depends on (aot.py hashes them)
    bind({declared: function})  the function in place of the placeholder, in every module
    use_jit(stamp)            bind every kernel to numba's just-in-time dispatcher

The kernel modules (every module with a line that starts with ``@kernel`` or ``@intrinsic``,
layers/fast/kernel.py) are listed once, in ``import_kernel_modules``; a new kernel module
joins that list (tests/fast/test_algorithms.py checks that none is missing). They import
kernel.py, below this module, never this one. Both back ends bind through here: backend.py
(which chooses one) and aot.py (whose builder compiles the numba functions that ``use_jit``
binds).
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from pathlib import Path
from typing import Callable

from layers.fast.kernel import DECLARED, INTRINSICS, Declared

HERE = Path(__file__).resolve().parent
_DECLARES = re.compile(r"^@(kernel|intrinsic)\b", re.MULTILINE)


@functools.cache
def kernel_module_names() -> tuple[str, ...]:
    """The modules of layers.fast whose source declares kernels or intrinsics."""
    return tuple(sorted(path.stem for path in HERE.glob("*.py")
                        if _DECLARES.search(path.read_text(encoding="utf-8"))))


def import_kernel_modules() -> None:
    """Import every kernel module, so that all kernels are declared."""
    from layers.fast import (atomics, dense, depthwise, direct, epilogue,  # noqa: F401
                             excitation, gemm, jobs, norm, phases, pointwise,
                             pointwise_transposed, pool, simd, softmax, upsample, vexp,
                             winograd, winograd_f2)


def declared_kernels() -> list[Declared]:
    """Every kernel, in declaration order."""
    import_kernel_modules()
    return list(DECLARED)


def declared_intrinsics() -> list[Declared]:
    """Every intrinsic, in declaration order."""
    import_kernel_modules()
    return list(INTRINSICS)


def exported_kernels() -> list[Declared]:
    """The kernels that Python calls, in declaration order."""
    import_kernel_modules()
    return [k for k in DECLARED if k.exported is not None]


def kernel_sources() -> list[Path]:
    """The modules that declare kernels, and those that declare and bind them (kernel.py,
    this one): what the machine code of the kernels depends on, in this package."""
    declared = declared_kernels() + declared_intrinsics()
    modules = {sys.modules[k.func.__module__] for k in declared}
    # the paths as imported (absolute): resolving symlinks would cost a system call for
    # each part of each path, on every start
    return sorted({Path(m.__file__) for m in modules}
                  | {Path(__file__).with_name("kernel.py"), Path(__file__)})


_compiled: dict[Declared, Callable] = {}


def bound(declared: Declared) -> Callable | None:
    """The function bound to ``declared`` (by ``bind``), or None."""
    return _compiled.get(declared)


def bind(functions: dict[Declared, Callable]) -> None:
    """Put ``functions`` in place of their declarations in every kernel module, so that both
    Python callers and the kernels calling each other (numba reads module globals) see them.
    A kernel bound already stays bound to its first function (ahead of time, say) in
    ``bound``."""
    for declared, function in functions.items():
        _compiled.setdefault(declared, function)
    for module in _fast_modules():
        names = vars(module)
        for name, value in list(names.items()):
            if isinstance(value, Declared) and value in functions:
                names[name] = functions[value]


def _fast_modules() -> list:
    """The modules of layers.fast imported so far (any of them may name a kernel)."""
    return [module for name, module in list(sys.modules.items())
            if name.startswith("layers.fast.")]


_jit_lock = threading.Lock()
_jit_bound = False


def use_jit(stamp: Callable[[], str]) -> None:
    """Bind every kernel to its numba dispatcher (compiled on first call, cached on disk),
    once per process; ``stamp()`` (aot.key: a hash of every kernel source) marks their
    entries in numba's disk cache (``_stale_with_any_source``)."""
    global _jit_bound
    with _jit_lock:
        if _jit_bound:
            return
        import numba

        import_kernel_modules()
        _stale_with_any_source(stamp())
        bind({i: i.func() for i in INTRINSICS})             # first: the kernels call them
        bind({k: numba.njit(cache=True, **k.options)(k.func) for k in DECLARED})
        _jit_bound = True


def _stale_with_any_source(stamp: str) -> None:
    """Make numba's disk cache of the kernels stale whenever any kernel source changes.

    numba keeps a function's compiled code until that function's own file changes; it does
    not look at the files of the kernels and intrinsics the function calls (an edit to
    simd.py would leave pointwise.py's kernels compiled the old way, in this mode and in the
    modules built ahead of time, whose builder compiles through this cache).
    Here the kernels' cache entries carry ``stamp`` (aot.key(): a hash of every kernel source,
    and of the CPU and versions) instead. numba offers no switch for this: a cache locator of
    our own goes first in its list, for layers.fast's functions only, and finds the same
    place as numba's own; where numba's caching is laid out differently, nothing changes and
    the build still starts from an empty cache (aot._build_in_children)."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None),
                                                      list):
        return

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
