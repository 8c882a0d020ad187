"""The kernels compiled ahead of time into CPython extension modules, once per machine.

    python -m layers.fast.aot           # build them now (RuntimeGraph.build does it if needed)

numba's ``pycc`` compiles each exported kernel (layers/fast/kernel.py, found by binding.py)
for its one signature, for the host CPU, and links it with numba's small C runtime into
``kernels_<key>_<part>.<ext>``. ``key`` hashes everything the machine code depends on: the
sources of the kernels, the numba, numpy and Python versions, the CPU and the width of the
register tiles (layers/fast/simd.py's LANES, which PNNX_INFER_LANES may set); a change to any
of them makes new modules, built the next time a graph is built (about a minute, once).
The kernels are dealt into PARTS modules, compiled by as many child processes side by side
(numba's compiler is single-threaded), jobs._work alone in one of them. The children keep
numba and LLVM out of the process that asked; a file lock makes processes starting
together build once.

The modules live in numba's cache directory when ``NUMBA_CACHE_DIR`` is set, else in
layers/fast/__pycache__ (beside numba's own cache), else in ~/.cache/pnnx-infer.

This module builds and loads; it does not choose. backend.py calls ``load_or_build`` and
binds what it returns, and falls back to the JIT on None. This module imports only
binding.py (the kernels, their sources, numba's binding for the build), simd.py (LANES) and
cpu.py, never backend.py, which imports it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np

from layers.fast import binding, simd
from layers.fast.cpu import cpu_description

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent


def key() -> str:
    """A hash of what the compiled code depends on (16 hex digits)."""
    digest = hashlib.sha256()
    for source in _kernel_sources():
        digest.update(source.name.encode() + source.read_bytes())
    for part in (_version("numba"), np.__version__, sys.version,
                 importlib.machinery.EXTENSION_SUFFIXES[0], cpu_description(),
                 f"lanes {simd.LANES}"):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


PARTS = 3     # modules, compiled side by side by as many child processes
ALONE = ("work",)     # compiled in a part of its own: jobs._work links in every kernel a
                      # helper may run, and takes longer than all the others together
BUILD_TIMEOUT = 600   # seconds; a build that takes longer is given up (the JIT takes over)


def module_names() -> list[str]:
    """kernels_<key>_0, kernels_<key>_1, ...: the exported kernels (``kernels_of_part``)."""
    digest = key()                     # once: it reads and hashes every kernel source
    return [f"kernels_{digest}_{part}" for part in range(PARTS)]


def cache_dir() -> Path:
    """Where the module is kept (see the module docstring)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / "pnnx_infer"
    beside = HERE / "__pycache__"
    if _writable(beside):
        return beside
    return Path.home() / ".cache" / "pnnx-infer"


def load_or_build() -> SimpleNamespace | None:
    """The compiled kernels, one attribute each: imported from the cache, built first if they
    are not there. None (after a warning) if they cannot be built here; the caller then
    compiles them just in time."""
    names, directory = module_names(), cache_dir()
    modules = [_import(directory, name) for name in names]
    if None in modules:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with _lock(directory / f"{names[0]}.lock"):
                modules = [_import(directory, name) for name in names]   # built meanwhile?
                missing = [part for part, module in enumerate(modules) if module is None]
                if missing:
                    _build_in_children(directory, missing)
                    modules = [_import(directory, name) for name in names]
                    _remove_stale(directory, names)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", None) or exc
            log.warning("could not compile the fast kernels ahead of time (%s); numba will "
                        "compile them just in time instead", str(detail).strip()[-2000:])
            return None
    return SimpleNamespace(**{name: getattr(module, name) for module in modules
                              for name in dir(module) if not name.startswith("_")})


def build(directory: Path, part: int) -> Path:
    """Compile part ``part`` of the exported kernels (``kernels_of_part``) into
    the module ``module_names()[part]`` in ``directory`` (in this process: it imports numba
    and needs a C compiler). Returns the module's path."""
    from numba.core import cpu
    from numba.core.compiler import compile_extra
    from numba.pycc import CC
    from numba.pycc import compiler as pycc_compiler

    binding.use_jit(key)               # the kernels see each other as numba functions
    exported = kernels_of_part(part)
    name = module_names()[part]
    options = {k.func: k.options for k in exported}

    def compile_with_kernel_options(typingctx, targetctx, func, args, return_type, flags,
                                    locals, library):
        """pycc compiles every function with the same default flags; give each kernel its
        own (fastmath) and let it run without the GIL, as the just-in-time kernels do."""
        flags = flags.copy()
        flags.release_gil = True
        if options[func].get("fastmath"):
            flags.fastmath = cpu.FastMathOptions(options[func]["fastmath"])
        return compile_extra(typingctx, targetctx, func, args, return_type, flags, locals,
                             library=library)

    with tempfile.TemporaryDirectory(dir=directory) as work:
        cc = CC(name)
        cc.output_dir = work
        cc.target_cpu = "host"
        cc.verbose = False
        for k in exported:
            cc.export(k.name, f"void({', '.join(k.exported)})")(k.func)
        original = pycc_compiler.compile_extra
        pycc_compiler.compile_extra = compile_with_kernel_options
        try:
            cc.compile()
        finally:
            pycc_compiler.compile_extra = original
        built = Path(work) / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        target = directory / built.name
        os.replace(built, target)                  # appears whole, or not at all
    return target


def kernels_of_part(part: int) -> list:
    """The exported kernels compiled into part ``part``: each of ALONE in a part of its own,
    the others dealt out in turn over the remaining parts."""
    exported = binding.exported_kernels()
    alone = [[k] for k in exported if k.name in ALONE]
    others = [k for k in exported if k.name not in ALONE]
    rest = PARTS - len(alone)
    return (alone + [others[i::rest] for i in range(rest)])[part]


def _build_in_children(directory: Path, parts: list[int]) -> None:
    """Build the missing parts, each in a child process, all at once."""
    log.warning("compiling the fast kernels for this CPU, once (about a minute) ...")
    started = time.perf_counter()
    env = dict(os.environ)
    root = str(HERE.parent.parent)                 # the directory holding layers/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # an empty numba cache of their own: numba would reuse a kernel's code compiled before
    # an edit to a file it calls (binding._stale_with_any_source)
    numba_cache = tempfile.TemporaryDirectory(dir=directory, prefix="numba_cache_")
    env["NUMBA_CACHE_DIR"] = numba_cache.name
    # run from the root too: ``-m`` puts the working directory first on the path, and a
    # ``layers`` package there (another checkout) would be compiled instead of this one
    children = [subprocess.Popen([sys.executable, "-m", "layers.fast.aot", str(directory),
                                  str(part)], env=env, cwd=root, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for part in parts]
    failed = None
    try:
        for child in children:
            _, errors = child.communicate(timeout=BUILD_TIMEOUT)
            if child.returncode != 0:
                failed = subprocess.CalledProcessError(child.returncode, child.args,
                                                       stderr=errors)
    finally:
        for child in children:                     # a compiler that hangs is stopped
            if child.poll() is None:
                child.kill()
                child.wait()
        numba_cache.cleanup()
    if failed is not None:
        raise failed
    log.info("compiled the fast kernels in %.1f s into %s", time.perf_counter() - started,
             directory)


def _remove_stale(directory: Path, names: list[str]) -> None:
    """Delete the modules (and their lock files) built here for other keys: older sources or
    versions. A process still running one keeps it (the file is only unlinked)."""
    for path in directory.glob("kernels_*"):
        if not path.name.startswith(tuple(names)):
            path.unlink(missing_ok=True)


def _import(directory: Path, name: str) -> ModuleType | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.exists():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


class _lock:
    """An exclusive lock on a file (fcntl; a no-op where there is none)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "w")
        try:
            import fcntl
        except ImportError:
            return self
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.file.close()                          # closing releases the lock


def _kernel_sources() -> list[Path]:
    """The modules that declare kernels, those that declare and bind them (kernel.py,
    binding.py) and this one, which compiles them."""
    return sorted(set(binding.kernel_sources()) | {Path(__file__).resolve()})


def _version(package: str) -> str:
    """The installed version of ``package``, from the name of its dist-info folder beside it
    (cheaper than importing importlib.metadata); from importlib.metadata where there is no
    such folder."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return "none"
    beside = sorted(Path(spec.origin).parent.parent.glob(f"{package}-*.dist-info"))
    if beside:
        return beside[-1].name
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def _writable(directory: Path) -> bool:
    probe = directory if directory.exists() else directory.parent
    return os.access(probe, os.W_OK)


if __name__ == "__main__":
    if len(sys.argv) == 3:                         # a child: build one part
        build(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        kernels = load_or_build()
        print("not built: see the warning above" if kernels is None else
              f"{len(vars(kernels))} kernels in {cache_dir()}")
