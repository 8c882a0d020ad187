"""The kernels compiled ahead of time into CPython extension modules, once per machine.

    python -m layers.fast.aot           # build them now (RuntimeGraph.build does it if needed)
    python -m layers.fast.aot --help    # what it does, where the modules are kept

numba's ``pycc`` compiles each exported kernel (layers/fast/kernel.py, found by binding.py)
for its one signature, for the host CPU, and links it with numba's small C runtime into
``kernels_<key>_<part>.<ext>``. ``key`` hashes everything the machine code depends on: the
sources of the kernels, the numba, numpy and Python versions, the CPU (and numba's
NUMBA_CPU_NAME and NUMBA_CPU_FEATURES, which override it) and the width of the register
tiles (layers/fast/simd.py's LANES, which PNNX_INFER_LANES may set); a change to any of them
makes new modules, built the next time a graph is built (a minute or two, once).
The kernels are grouped into PARTS modules (``kernels_of_part``), compiled by as many child
processes side by side (numba's compiler is single-threaded). The children keep numba and
LLVM out of the process that asked; a file lock makes processes starting together build
once.

The modules live in numba's cache directory when ``NUMBA_CACHE_DIR`` is set, else in
layers/fast/__pycache__ (beside numba's own cache), else in ~/.cache/pnnx-infer.

The build says what it does at INFO level on this module's logger (``layers.fast.aot``):
the modules it compiles, and each one's time as it is done. A minute of silence looks like a
hang, so those lines reach stderr even where logging is left unconfigured or at WARNING
(only the root logger's level): setting a level on ``layers.fast`` (or ``layers``, or this
logger) decides instead. Where the modules cannot be built (no C compiler, no setuptools, a
numba without pycc, a failed build), one WARNING says so and what to install, and numba
compiles the kernels just in time: a slower first run, the same results. The compiler's own
output is logged at DEBUG level only (``python -m layers.fast.aot -v`` shows it).

The modules are compiled for the instruction sets the CPU reports (``_features``), and run
once in a child process (layers/fast/check.py) before they are put where other processes
find them (``_build_checked``): a module that kills it (an instruction this CPU lacks) is
dropped, and this key's kernels run just in time from then on, instead of crashing the
user's Python.

This module builds and loads; it does not choose. backend.py calls ``load_or_build`` and
binds what it returns, and falls back to the JIT on None. This module imports only
binding.py (the kernels, their sources, numba's binding for the build), simd.py (LANES) and
cpu.py, never backend.py, which imports it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

try:                       # BLAKE2 without loading OpenSSL, as importing hashlib does
    from _blake2 import blake2b
except ImportError:        # pragma: no cover - a Python without CPython's _blake2
    from hashlib import blake2b

import numpy as np

from layers.fast import binding, simd
from layers.fast.cpu import cpu_description

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent


def key() -> str:
    """A hash of what the compiled code depends on (16 hex digits)."""
    digest = blake2b(digest_size=8)
    for source in _kernel_sources():
        digest.update(source.name.encode() + source.read_bytes())
    for part in (_version("numba"), np.__version__, sys.version,
                 importlib.machinery.EXTENSION_SUFFIXES[0], cpu_description(),
                 f"lanes {simd.LANES}", *(f"{name}={os.environ.get(name, '')}"
                                          for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"))):
        digest.update(part.encode())
    return digest.hexdigest()


PARTS = 2     # modules, compiled side by side by as many child processes: kernels_of_part's
# two groups. numba compiles a kernel in each process that compiles an exported kernel
# calling it, so the ones that call the same kernels are compiled together: the matrix
# products (pointwise_blocks and the Winograd transforms, which the 1x1, im2col, dense and
# Winograd kernels share) with their jobs in the first module, and the direct and depthwise
# convolutions (phases.py's helpers, which im2col calls too), which balances the two; all the
# other kernels (Winograd's strips job, whose inlined transforms take the most) in the second
PRODUCT_MODULES = ("pointwise", "dense", "gemm", "winograd", "winograd_f2", "direct",
                   "depthwise")
PRODUCT_JOBS = ("pointwise_job", "dense_job", "gemm_job", "im2col_job", "split_planes_job",
                "winograd_input_job", "winograd_output_job", "direct_job", "depthwise_job",
                "depthwise_blocks_job")
BUILD_TIMEOUT = 600   # seconds; a build that takes longer is given up (the JIT takes over)
STILL = 30            # seconds between the build's "still compiling" lines


def module_names() -> list[str]:
    """kernels_<key>_0, kernels_<key>_1, ...: the exported kernels (``kernels_of_part``)."""
    digest = key()                     # once: it reads and hashes every kernel source
    return [f"kernels_{digest}_{part}" for part in range(PARTS)]


_names_of_this_process: list[str] = []


def _names() -> list[str]:
    """``module_names()``, worked out once per process (the key hashes every kernel source;
    a background build is polled on every forward)."""
    if not _names_of_this_process:
        _names_of_this_process.extend(module_names())
    return _names_of_this_process


def cache_dir() -> Path:
    """Where the module is kept (see the module docstring)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / "pnnx_infer"
    beside = HERE / "__pycache__"
    if _writable(beside):
        return beside
    return Path.home() / ".cache" / "pnnx-infer"


def modules_present() -> bool:
    """Whether every module of the current key is in the cache (a stat each, nothing
    imported): what ``load_or_build`` would import without building."""
    directory = cache_dir()
    return all(_module_path(directory, name) is not None for name in _names())


def load_or_build() -> SimpleNamespace | None:
    """The compiled kernels, one attribute each: imported from the cache, built first if they
    are not there. None (after one warning: what happened, what to install) if they cannot
    be built here; the caller then compiles them just in time."""
    names, directory = _names(), cache_dir()
    modules = [_import(directory, name) for name in names]
    if None in modules:
        import subprocess     # only to build: loading the modules needs none of it
        try:
            missing_tool = _missing_tool() or _crashed_before(directory, names[0])
            if missing_tool:
                raise NotBuilt(*missing_tool)
            directory.mkdir(parents=True, exist_ok=True)
            with _lock(directory / f"{names[0]}.lock"):
                modules = [_import(directory, name) for name in names]   # built meanwhile?
                missing = [part for part, module in enumerate(modules) if module is None]
                crashed = _crashed_before(directory, names[0])         # ... or crashed?
                if missing and crashed:
                    raise NotBuilt(*crashed)
                if missing:
                    _build_checked(directory, names, missing)
                    modules = [_import(directory, name) for name in names]
                    _remove_stale(directory, names)
        except (OSError, subprocess.SubprocessError, NotBuilt) as exc:
            reason, advice = _why(exc)
            log.warning(f"{reason}: {JIT_INSTEAD}. {advice}".strip())
            return None
    return _kernels_of(modules)


def _kernels_of(modules: list) -> SimpleNamespace:
    """The exported kernels of ``modules``, one attribute each."""
    return SimpleNamespace(**{name: getattr(module, name) for module in modules
                              for name in dir(module) if not name.startswith("_")})


JIT_INSTEAD = ("numba compiles the fast kernels just in time instead (a slower first run, the "
               "same results)")    # what a process that cannot have the modules does


class NotBuilt(Exception):
    """The modules cannot be built here: ``reason``, and ``advice`` (what to install)."""

    def __init__(self, reason: str, advice: str):
        super().__init__(reason)
        self.reason, self.advice = reason, advice


COMPILER_ADVICE = ("To compile them ahead of time: apt-get install gcc g++ (numba's pycc "
                   "needs a C and C++ compiler), then python -m layers.fast.aot.")
SETUPTOOLS_ADVICE = ("To compile them ahead of time: pip install setuptools, then "
                     "python -m layers.fast.aot.")
DETAILS = "(python -m layers.fast.aot -v shows the compiler's output)"


def c_compiler() -> str | None:
    """The path of the C compiler numba's pycc will call (the CC variable, else the one
    Python was built with, as setuptools chooses), or None if it is not on PATH. Where
    there is no such setting (Windows: MSVC, found otherwise), the name "default"."""
    command = os.environ.get("CC") or sysconfig.get_config_var("CC")
    if not command:
        return "default"
    words = shlex.split(command)
    return shutil.which(words[0]) if words else None


def _missing_tool() -> tuple[str, str] | None:
    """(reason, advice) if something the build needs is plainly missing, else None. Cheap:
    nothing is imported (numba stays out of this process)."""
    numba_spec = importlib.util.find_spec("numba")
    if numba_spec is None or not numba_spec.origin:
        return "numba is not installed", "pip install numba"
    if not (Path(numba_spec.origin).parent / "pycc").is_dir():
        return (f"{_version('numba').removesuffix('.dist-info')} has no pycc, its ahead-of-time "
                "compiler",
                "A numba with numba.pycc (0.68 has it) compiles them ahead of time.")
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed (numba's pycc needs it)", SETUPTOOLS_ADVICE
    if c_compiler() is None:
        command = os.environ.get("CC") or sysconfig.get_config_var("CC")
        return f"no C compiler ({shlex.split(command)[0]!r} is not on PATH)", COMPILER_ADVICE
    return None


def _why(exc: BaseException) -> tuple[str, str]:
    """A failed build's reason in a few words, and what to do, from the exception and the
    output of the child that failed (never shown whole: it is logged at DEBUG level)."""
    import subprocess

    if isinstance(exc, NotBuilt):
        return exc.reason, exc.advice
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"the kernels' build timed out after {exc.timeout:g} s", DETAILS
    if isinstance(exc, subprocess.CalledProcessError):
        output = "\n".join(str(text) for text in (exc.output, exc.stderr) if text)
        if "No module named 'setuptools'" in output or "No module named 'distutils'" in output:
            return "setuptools is not installed (numba's pycc needs it)", SETUPTOOLS_ADVICE
        if ("without the compiler" in output or "CompileError" in output
                or "LinkError" in output or ("command '" in output and "failed" in output)):
            return "the C compiler does not work or is incomplete", f"{COMPILER_ADVICE} {DETAILS}"
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        last = f": {lines[-1][:200]}" if lines else ""
        return f"the kernels' build failed (exit status {exc.returncode}{last})", DETAILS
    return f"the kernels could not be built ({str(exc).strip()[:300]})", ""


def build(directory: Path, part: int) -> Path:
    """Compile part ``part`` of the exported kernels (``kernels_of_part``) into
    the module ``module_names()[part]`` in ``directory`` (in this process: it imports numba
    and needs a C compiler). Returns the module's path."""
    from numba.core import codegen, cpu
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
        own (fastmath, error model) and let it run without the GIL, as the just-in-time
        kernels do."""
        flags = flags.copy()
        flags.release_gil = True
        flags.error_model = options[func].get("error_model", "python")
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
        original = pycc_compiler.compile_extra, codegen.AOTCPUCodegen._customize_tm_features
        pycc_compiler.compile_extra = compile_with_kernel_options
        codegen.AOTCPUCodegen._customize_tm_features = _features
        try:
            cc.compile()
        finally:
            pycc_compiler.compile_extra, codegen.AOTCPUCodegen._customize_tm_features = original
        built = Path(work) / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        target = directory / built.name
        os.replace(built, target)                  # appears whole, or not at all
    return target


def _features(target) -> str:
    """The LLVM feature string ("+avx2,-avx512f,...") of numba's AOT code generator
    ``target``: for the "host" CPU, the instruction sets the CPU reports (numba's
    NUMBA_CPU_FEATURES if set), as numba's JIT uses. pycc's own gives none, so LLVM assumes
    every feature of the CPU's model: a virtual machine that hides some (AVX-512 on a Zen 4
    guest) got code its CPU cannot run."""
    return target._get_host_cpu_features() if target._cpu_name == "host" else ""


def kernels_of_part(part: int) -> list:
    """The exported kernels compiled into part ``part``: the products and their jobs
    (PRODUCT_MODULES, PRODUCT_JOBS), then the others."""
    exported = binding.exported_kernels()
    products = [k for k in exported if k.name in PRODUCT_JOBS
                or k.func.__module__.rsplit(".", 1)[-1] in PRODUCT_MODULES]
    parts = [products, [k for k in exported if k not in products]]
    return parts[part] if part < len(parts) else []


def _build_in_children(directory: Path, parts: list[int], shown: Path | None = None) -> None:
    """Build the missing parts into ``directory``, each in a child process, all at once; say
    which, and how long each took (INFO, shown: ``_progress_shown``; the folder named is
    ``shown``, if given). The children's output is kept, and logged at DEBUG level; a failure
    raises CalledProcessError (or TimeoutExpired) with it."""
    import subprocess

    names = module_names()
    with _progress_shown():
        log.info("compiling the fast kernels for this CPU, once (about a minute): %d modules "
                 "into %s", len(parts), shown or directory)
        started = time.perf_counter()
        env, root = _child_env(), str(HERE.parent.parent)
        # an empty numba cache of their own: numba would reuse a kernel's code compiled before
        # an edit to a file it calls (binding._stale_with_any_source)
        numba_cache = tempfile.TemporaryDirectory(dir=directory, prefix="numba_cache_")
        env["NUMBA_CACHE_DIR"] = numba_cache.name
        running: dict[int, tuple[subprocess.Popen, object]] = {}
        try:
            for part in parts:
                # the output goes to a file, not a pipe: a pipe nobody reads while waiting
                # would fill up and stall a talkative child
                output = tempfile.TemporaryFile("w+", dir=directory, prefix="build_output_")
                # run from the root too: ``-m`` puts the working directory first on the path,
                # and a ``layers`` package there (another checkout) would be compiled instead
                running[part] = (subprocess.Popen(_child_command(directory, part), env=env,
                                                  cwd=root, stdout=output,
                                                  stderr=subprocess.STDOUT, text=True), output)
            deadline, still = started + BUILD_TIMEOUT, started + STILL
            while running:
                for part, (child, output) in list(running.items()):
                    if child.poll() is None:
                        continue
                    del running[part]
                    output.seek(0)
                    said = output.read()
                    output.close()
                    if said.strip():
                        log.debug("%s's build said:\n%s", names[part], said.rstrip())
                    if child.returncode != 0:
                        raise subprocess.CalledProcessError(child.returncode, child.args,
                                                            output=said)
                    done = len(parts) - len(running)
                    log.info("built fast kernels %d/%d: %s (%s) in %.0f s%s", done, len(parts),
                             names[part], _contents(part), time.perf_counter() - started,
                             f"; {len(running)} left" if running else "")
                if running:
                    if time.perf_counter() > still:
                        still += STILL
                        log.info("... %d of %d modules still compiling, %.0f s so far",
                                 len(running), len(parts), time.perf_counter() - started)
                    if time.perf_counter() > deadline:
                        raise subprocess.TimeoutExpired(running[next(iter(running))][0].args,
                                                        BUILD_TIMEOUT)
                    time.sleep(0.1)
        finally:
            for child, output in running.values():     # stopped: a compiler that hangs,
                if child.poll() is None:               # or the others after a failure
                    child.kill()
                child.wait()
                output.close()
            numba_cache.cleanup()
        log.info("compiled the fast kernels in %.0f s into %s", time.perf_counter() - started,
                 shown or directory)


# ----- the build in the background ---------------------------------------------------------
class BackgroundBuild:
    """The modules built by a detached process (``python -m layers.fast.aot --log FILE``, in
    a session of its own: Ctrl-C here, or this process ending, leaves it running, and the
    next process finds the modules) while this process goes on without them. ``state()``:
    "compiling", "ready" (every module is in the cache) or "failed" (the builder ended
    without them; one warning says why, from its log)."""

    def __init__(self) -> None:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / f"{_names()[0]}_build_{os.getpid()}.log"
        self.started = time.perf_counter()
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, "-m", "layers.fast.aot", "--log", str(self.log_path)],
            env=_child_env(), cwd=HERE.parent.parent, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._state = "compiling"
        with _progress_shown():
            log.info("compiling the fast kernels for this CPU in the background, once (about a "
                     "minute; python -m layers.fast.aot waits for them and shows progress). "
                     "Until they are ready, graphs run on the reference floor: numpy, slower, "
                     "the same answers")

    def state(self) -> str:
        if self._state == "compiling":
            if modules_present():
                self._state = "ready"
                with _progress_shown():
                    log.info("the fast kernels are ready (compiled in the background in %.0f "
                             "s)", time.perf_counter() - self.started)
            elif self.process.poll() is not None and not modules_present():
                self._state = "failed"
                log.warning("the fast kernels could not be built in the background (%s); "
                            "graphs stay on the reference floor. python -m layers.fast.aot -v "
                            "builds them and shows why", self._last_words())
        return self._state

    def _last_words(self) -> str:
        """The builder's last line of log, or its exit status; without what the builder
        itself would have done instead (this process's graphs stay on the reference floor)."""
        try:
            lines = [line.strip() for line in self.log_path.read_text().splitlines()
                     if line.strip()]
        except OSError:
            lines = []
        if not lines:
            return f"exit status {self.process.returncode}"
        return lines[-1].replace(f": {JIT_INSTEAD}.", ".")[:300]


_background: BackgroundBuild | None = None


def build_in_background() -> BackgroundBuild | None:
    """This process's background build, started by the first call that finds modules
    missing; None if there is nothing to wait for (the modules are in the cache) or if they
    cannot be built here (no C compiler, ...: ``load_or_build`` then says why and numba's
    JIT takes over)."""
    global _background
    if _background is None:
        if (modules_present() or _missing_tool() is not None
                or _crashed_before(cache_dir(), _names()[0]) is not None):
            return None
        try:
            _background = BackgroundBuild()
        except OSError:                        # no cache folder, no process: build here
            return None
    return _background


CRASHED = "the compiled kernels crashed on this CPU (an instruction it lacks?)"
CRASH_SIGNALS = ("SIGILL", "SIGSEGV", "SIGBUS")   # what a module wrong for this CPU dies of
CHECK_TIMEOUT = 120   # seconds


def _crash_mark(directory: Path, name: str) -> Path:
    """The file that says the modules ``name`` (the first) crashed here (``_build_checked``)."""
    return directory / f"{name}.crashed"


def _crashed(mark: Path) -> tuple[str, str]:
    """(reason, advice) of modules that crashed, whose crash mark is ``mark``."""
    return CRASHED, f"Delete {mark} to try building them again."


def _crashed_before(directory: Path, name: str) -> tuple[str, str] | None:
    """(reason, advice) if this key's modules crashed here before, else None."""
    mark = _crash_mark(directory, name)
    return _crashed(mark) if mark.exists() else None


def _build_checked(directory: Path, names: list[str], parts: list[int]) -> None:
    """Build ``parts`` into a folder of their own, run them there once in a child process
    (layers/fast/check.py), and only then move them into ``directory``: a compiler that emits an
    instruction this CPU lacks kills that child (SIGILL), not a process of the user's, and no
    process loads them meanwhile. If the check dies of such a signal, a mark is left
    (``_crashed_before``: this key's kernels then run just in time, no rebuild); if it fails
    otherwise, nothing. Either way the new modules are dropped and NotBuilt raised."""
    import signal
    import subprocess

    with tempfile.TemporaryDirectory(dir=directory, prefix="staging_") as staging:
        _build_in_children(Path(staging), parts, shown=directory)
        child = subprocess.run(_check_command(Path(staging)), env=_child_env(),
                               cwd=HERE.parent.parent, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=CHECK_TIMEOUT)
        if child.stdout.strip():
            log.debug("the check of the new modules said:\n%s", child.stdout.rstrip())
        killed_by = {-s.value: s.name for s in signal.Signals}.get(child.returncode)
        if killed_by in CRASH_SIGNALS:
            mark = _crash_mark(directory, names[0])
            mark.write_text(f"{killed_by}\n")
            raise NotBuilt(*_crashed(mark))
        if child.returncode != 0:
            raise NotBuilt(f"the new kernels failed their check (exit status "
                           f"{child.returncode})", DETAILS)
        for part in parts:
            built = _module_path(Path(staging), names[part])
            os.replace(built, directory / built.name)


def load_from(*folders: Path) -> SimpleNamespace | None:
    """The kernels of this key's modules, each module imported from the first of ``folders``
    that holds it, without building anything; None if one is in none of them."""
    modules = []
    for name in _names():
        module = next((m for m in (_import(folder, name) for folder in folders) if m), None)
        if module is None:
            return None
        modules.append(module)
    return _kernels_of(modules)


def _check_command(staging: Path) -> list[str]:
    """The command of the child process that runs the modules in ``staging`` once
    (layers/fast/check.py)."""
    return [sys.executable, "-m", "layers.fast.check", str(staging)]


def _child_env() -> dict[str, str]:
    """The environment of a builder process: this one's, with the repository's root first on
    PYTHONPATH (the ``layers`` package of this checkout is the one compiled)."""
    env = dict(os.environ)
    root = str(HERE.parent.parent)                 # the directory holding layers/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _child_command(directory: Path, part: int) -> list[str]:
    """The command of the child process that builds part ``part`` into ``directory``."""
    return [sys.executable, "-m", "layers.fast.aot", "--part", str(part), "--into",
            str(directory)]


def _contents(part: int) -> str:
    """Part ``part``'s kernels, the first few by name: "max_pool2d, depthwise, ... 10"."""
    kernels = [k.name for k in kernels_of_part(part)]
    if len(kernels) <= 3:
        return ", ".join(kernels)
    return f"{', '.join(kernels[:3])}, ... {len(kernels)} kernels"


@contextlib.contextmanager
def _progress_shown():
    """Inside, this module's INFO lines reach stderr unless a level was chosen for them: on
    this logger or a parent below the root (``layers.fast``, ``layers``). A level set only
    on the root (logging.basicConfig(level=WARNING), as a command line does without -v) is
    passed over: the build is a minute long and happens once. Through the handlers already
    there, if any; else through one of its own for that time."""
    chosen = log
    while chosen.parent is not None and chosen.level == logging.NOTSET:
        chosen = chosen.parent
    if chosen.parent is not None or log.isEnabledFor(logging.INFO):
        yield                                     # a level chosen below the root, or INFO on
        return
    handler = None
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.setLevel(logging.NOTSET)
        if handler is not None:
            log.removeHandler(handler)


def _remove_stale(directory: Path, names: list[str]) -> None:
    """Delete the modules (and their lock files) built here for other keys: older sources or
    versions. A process still running one keeps it (the file is only unlinked)."""
    for path in directory.glob("kernels_*"):
        if not path.name.startswith(tuple(names)):
            path.unlink(missing_ok=True)


def _module_path(directory: Path, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.exists():
            return path
    return None


def _import(directory: Path, name: str) -> ModuleType | None:
    path = _module_path(directory, name)
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    return sorted(set(binding.kernel_sources()) | {Path(__file__)})


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


def main(argv: list[str] | None = None) -> int:
    """``python -m layers.fast.aot``: build the modules now (see ``--help``)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m layers.fast.aot",
        description="Compile the fast kernels (numba code) for this CPU into extension "
                    "modules now, as the first RuntimeGraph.build() would: about a minute, "
                    "once per machine and source version; later processes import them "
                    "without numba. Nothing is done if they are there already.",
        epilog=f"The modules are kept in {cache_dir()} ($NUMBA_CACHE_DIR/pnnx_infer when "
               "NUMBA_CACHE_DIR is set, else layers/fast/__pycache__ if writable, else "
               "~/.cache/pnnx-infer). PNNX_INFER_KERNELS=jit has numba compile the kernels "
               "just in time instead (no modules; for working on a kernel); so does a "
               "machine without a C compiler. PNNX_INFER_LANES=8 or 16 sets the register "
               "tiles' width (default: the CPU's vectors).")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the compiler's output")
    parser.add_argument("--part", type=int, help=argparse.SUPPRESS)     # a child: build
    parser.add_argument("--into", type=Path, help=argparse.SUPPRESS)    # this part there
    parser.add_argument("--log", type=Path, help=argparse.SUPPRESS)     # a background build
    args = parser.parse_args(argv)
    if args.part is not None:
        build(args.into, args.part)
        return 0
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(message)s", filename=args.log)
    kernels = load_or_build()
    if kernels is None:
        print("not built: see above", file=sys.stderr)
        return 1
    if args.log is not None:                    # built: nobody needs to read why not
        logging.shutdown()
        args.log.unlink(missing_ok=True)
    else:
        print(f"{len(vars(kernels))} kernels in {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
