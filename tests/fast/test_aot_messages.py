"""What the ahead-of-time build of the fast kernels says (layers/fast/aot.py): its progress
at INFO level, shown even where logging is left at WARNING; one short warning, no
traceback, where it cannot build (no C compiler, no setuptools, a failed build), and the
compiler's output at DEBUG level only; ``python -m layers.fast.aot --help``."""

from __future__ import annotations

import importlib.machinery
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from layers.fast import aot
from support import REPO

NUMBA_SAYS = """Traceback (most recent call last):
  File "numba/pycc/platform.py", line 84, in __init__
    self._raise_external_compiler_error()
RuntimeError: Attempted to compile AOT function without the compiler used by `numpy.distutils`
present. If using conda try:

#> conda install gcc_linux-64 gxx_linux-64
"""


def quiet_child(code: str):
    """A stand-in for the child that builds a part: runs ``code`` (part in sys.argv[1])."""
    return lambda directory, part: [sys.executable, "-c", code, str(part)]


def run_python(script: str, env: dict | None = None, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, **options)


def test_the_build_says_which_module_is_done_how_long_it_took_and_how_many_are_left(
        monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(aot, "_child_command", quiet_child(
        "import sys, time; time.sleep(0.5 * int(sys.argv[1]))"))
    caplog.set_level(logging.INFO, logger="layers.fast.aot")
    monkeypatch.setattr(aot, "PARTS", 3)
    aot._build_in_children(tmp_path, [0, 1, 2])
    lines = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert lines[0].startswith("compiling the fast kernels for this CPU, once (about a minute)")
    names = aot.module_names()
    for done, part in enumerate((0, 1, 2), 1):             # they end in this order here
        assert lines[done].startswith(f"built fast kernels {done}/3: {names[part]} (")
        assert lines[done].endswith(" left" if done < 3 else " s")
    assert lines[1].endswith("; 2 left") and f"({aot._contents(1)})" in lines[2]
    assert lines[-1].startswith("compiled the fast kernels in ")


SHOW_PROGRESS = """
import logging, sys
from pathlib import Path
from layers.fast import aot
{setup}
aot._child_command = lambda directory, part: [sys.executable, "-c", "pass"]
aot._build_in_children(Path({directory!r}), [0, 1])
"""


@pytest.mark.parametrize("setup, shown", [
    ("", "built fast kernels 2/2: "),                        # logging never configured
    ("logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')",
     "INFO layers.fast.aot: built fast kernels 2/2: "),       # python -m infer classify
    ("logging.basicConfig(); logging.getLogger('layers.fast').setLevel(logging.WARNING)",
     None),                                                  # silenced on purpose
])
def test_the_progress_reaches_stderr_unless_a_level_is_chosen_for_it(tmp_path, setup, shown):
    done = run_python(SHOW_PROGRESS.format(setup=setup, directory=str(tmp_path)), check=True)
    if shown is None:
        assert done.stderr == ""
    else:
        assert shown in done.stderr and done.stderr.count("built fast kernels") == 2
        assert "WARNING" not in done.stderr


def test_without_a_c_compiler_one_short_warning_says_what_to_install(monkeypatch, tmp_path,
                                                                      caplog):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "c_compiler", lambda: None)

    def never(directory, parts):
        raise AssertionError("no build is tried without a compiler")

    monkeypatch.setattr(aot, "_build_in_children", never)
    assert aot.load_or_build() is None
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "no C compiler" in message and "just in time" in message
    assert "the same results" in message and "apt-get install gcc" in message


def test_without_setuptools_the_warning_says_pip_install_setuptools(monkeypatch, tmp_path,
                                                                    caplog):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    find_spec = aot.importlib.util.find_spec
    monkeypatch.setattr(aot.importlib.util, "find_spec",
                        lambda name, *a: None if name == "setuptools" else find_spec(name, *a))
    assert aot.load_or_build() is None
    (record,) = caplog.records
    assert "pip install setuptools" in record.getMessage()


def test_a_failed_build_warns_in_one_line_and_keeps_the_traceback_for_debug(monkeypatch,
                                                                            tmp_path, caplog):
    """numba's traceback and conda advice are logged at DEBUG level, not shown."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "_missing_tool", lambda: None)
    monkeypatch.setattr(aot, "_child_command", quiet_child(
        f"import sys; print({NUMBA_SAYS!r}, file=sys.stderr); sys.exit(1)"))
    caplog.set_level(logging.DEBUG, logger="layers.fast.aot")
    assert aot.load_or_build() is None
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    message = warning.getMessage()
    assert "\n" not in message and "Traceback" not in message and "conda" not in message
    assert "C compiler does not work" in message and "apt-get install gcc g++" in message
    assert "python -m layers.fast.aot -v" in message
    assert any("conda install gcc_linux-64" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)
    assert not list((tmp_path / "pnnx_infer").glob("*.so"))


def test_a_machine_without_a_compiler_runs_just_in_time_after_two_lines_at_most(tmp_path):
    """A fresh process, PATH without cc/gcc, an empty cache: the kernels are compiled just in
    time, and what it says is one short warning, no traceback."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "CC": ""}
    done = run_python("from layers.fast import backend; print(backend.start())", env=env,
                      check=True)
    assert done.stdout.strip() == "jit"
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert "no C compiler" in done.stderr and "apt-get install gcc" in done.stderr
    assert "Traceback" not in done.stderr and "conda" not in done.stderr


def test_a_compiler_that_does_not_work_gives_the_same_short_warning(tmp_path):
    """The compiler is there (CC), but fails: numba's own error in the children (a
    traceback and conda advice) is not shown, one warning is."""
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nexit 1\n")
    cc.chmod(0o755)
    env = {"CC": str(cc), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    done = run_python("from layers.fast import backend; print(backend.start())", env=env,
                      check=True)
    assert done.stdout.strip() == "jit"
    (warning,) = [line for line in done.stderr.splitlines() if "just in time" in line]
    assert "C compiler does not work" in warning and "apt-get install gcc g++" in warning
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert "Traceback" not in done.stderr and "conda" not in done.stderr


def test_python_m_aot_help_says_what_it_does_and_where_without_a_runpy_warning():
    done = subprocess.run([sys.executable, "-m", "layers.fast.aot", "--help"], cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=120)
    assert done.stderr == ""                  # no "found in sys.modules after import of package"
    help_text = " ".join(done.stdout.split())
    assert help_text.startswith("usage: python -m layers.fast.aot")
    assert "PNNX_INFER_KERNELS=jit" in help_text and "NUMBA_CACHE_DIR" in help_text
    assert str(aot.cache_dir()) in done.stdout.replace("\n", "")
    refused = subprocess.run([sys.executable, "-m", "layers.fast.aot", "--nonsense"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr


def test_importing_the_package_does_not_import_the_builder():
    """Else ``python -m layers.fast.aot`` would run a second copy of it (runpy's warning)."""
    done = run_python("import sys, layers.fast, infer; "
                      "print('layers.fast.aot' in sys.modules)", check=True)
    assert done.stdout.strip() == "False"


def test_the_build_compiles_for_the_instruction_sets_the_cpu_reports(monkeypatch, tmp_path):
    """pycc's "host" target names the CPU model only, and LLVM assumes all its features: a
    virtual machine that hides AVX-512 from a Zen 4 got AVX-512 code and died of SIGILL. The
    build passes the features the CPU reports (here a made-up AVX2-only report)."""
    from numba.core import codegen
    from numba.pycc import CC

    seen = {}

    def compile_and_look(cc):
        seen["cpu"] = cc.target_cpu
        seen["host"] = codegen.AOTCPUCodegen("probe", cc.target_cpu)._tm_features
        seen["generic"] = codegen.AOTCPUCodegen("probe", "")._tm_features
        raise RuntimeError("looked")

    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.setattr(codegen, "get_host_cpu_features", lambda: "+avx2,+fma,-avx512f")
    monkeypatch.setattr(CC, "compile", compile_and_look)
    monkeypatch.setattr(aot.binding, "use_jit", lambda key: None)   # no kernels rebound
    with pytest.raises(RuntimeError, match="looked"):
        aot.build(tmp_path, 0)
    assert seen == {"cpu": "host", "host": "+avx2,+fma,-avx512f", "generic": ""}
    assert codegen.AOTCPUCodegen("after", "host")._tm_features == ""     # put back as it was


def fake_build(monkeypatch, tmp_path, check: str):
    """A build whose children only touch the module files, and whose check runs ``check``;
    the kernels' folder in tmp_path, no background build."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "_missing_tool", lambda: None)
    monkeypatch.setattr(aot, "_background", None)
    monkeypatch.setattr(aot, "BackgroundBuild", None)      # build_in_background must not start
    monkeypatch.setattr(aot, "_child_command", lambda directory, part: [
        sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()",
        str(directory / f"{aot.module_names()[part]}{suffix}")])
    monkeypatch.setattr(aot, "_check_command", lambda staging: [sys.executable, "-c", check])
    return tmp_path / "pnnx_infer", suffix


def test_modules_that_crash_when_run_are_dropped_and_not_built_again(monkeypatch, tmp_path,
                                                                     caplog):
    """New modules run once in a child process before they are put where processes look for
    them: if that child dies of SIGILL (an instruction this CPU lacks), they are dropped, a
    mark stays, and this key's kernels run just in time from then on."""
    directory, suffix = fake_build(monkeypatch, tmp_path,
                                   "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    caplog.set_level(logging.WARNING, logger="layers.fast.aot")
    assert aot.load_or_build() is None
    (warning,) = caplog.records
    assert "crashed on this CPU" in warning.getMessage()
    assert "just in time" in warning.getMessage()
    assert not list(directory.rglob(f"*{suffix}"))
    mark = directory / f"{aot.module_names()[0]}.crashed"
    assert mark.read_text() == "SIGILL\n"

    def no_build(directory, part):
        raise AssertionError("built again")
    monkeypatch.setattr(aot, "_child_command", no_build)
    caplog.clear()
    assert aot.build_in_background() is None and aot.load_or_build() is None
    assert f"Delete {mark} to try building them again" in caplog.records[0].getMessage()


@pytest.mark.parametrize("check, said", [
    ("import sys; sys.exit(3)", "failed their check (exit status 3)"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "(exit status -15)"),
])
def test_modules_that_fail_their_check_otherwise_are_dropped_without_a_mark(
        monkeypatch, tmp_path, caplog, check, said):
    directory, suffix = fake_build(monkeypatch, tmp_path, check)
    caplog.set_level(logging.WARNING, logger="layers.fast.aot")
    assert aot.load_or_build() is None
    assert said in caplog.records[0].getMessage()
    assert not list(directory.rglob(f"*{suffix}")) and not list(directory.glob("*.crashed"))


def test_modules_that_pass_their_check_are_moved_into_place(monkeypatch, tmp_path):
    directory, suffix = fake_build(monkeypatch, tmp_path, "pass")
    monkeypatch.setattr(aot, "_import", lambda folder, name: None)    # empty files
    assert aot.load_or_build() is not None
    assert sorted(p.name for p in directory.glob(f"*{suffix}")) == sorted(
        f"{name}{suffix}" for name in aot.module_names())
    assert not list(directory.glob("staging_*"))


def test_the_check_of_new_modules_runs_every_algorithm_on_them():
    """The check's own command, on this checkout's modules: it binds them and exits 0."""
    if aot.load_or_build() is None:
        pytest.skip("the kernels cannot be compiled ahead of time here")
    done = subprocess.run(aot._check_command(aot.cache_dir()), env=aot._child_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=aot.CHECK_TIMEOUT)
    assert done.returncode == 0, done.stderr


def test_the_key_follows_numbas_cpu_overrides(monkeypatch):
    """Modules compiled under NUMBA_CPU_FEATURES (or NUMBA_CPU_NAME) are not reused without
    it, nor the other way round: a crash mark left by one stays with it."""
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    plain = aot.key()
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2,-avx512f")
    features = aot.key()
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    assert len({plain, features, aot.key()}) == 3


def test_a_failed_background_build_says_why_without_the_builders_own_fallback(tmp_path):
    """The builder logs "<why>: numba compiles ... just in time instead. <advice>"; the
    process that waited for it keeps its graphs on the reference floor, so its warning
    quotes the why and the advice only."""
    build = object.__new__(aot.BackgroundBuild)
    build.log_path = tmp_path / "build.log"
    build.log_path.write_text(f"compiling ...\n{aot.CRASHED}: {aot.JIT_INSTEAD}. Delete X to "
                              f"try building them again.\n")
    assert build._last_words() == f"{aot.CRASHED}. Delete X to try building them again."
