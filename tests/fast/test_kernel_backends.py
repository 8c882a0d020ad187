"""The two ways the numba kernels are compiled (layers/fast/backend.py) run the same code:
ahead of time (the default: an extension module, no numba in the process) and just in time
(numba.njit). The kernels a model meets most (depthwise and 1x1 convolutions) are run both
ways on the same inputs, through the public functions that call them, and must agree bit for
bit, as must a small model's output in a process of each kind and a job shared with a helper
thread. Not every kernel: numba is slow to compile each one just in time, and both ways
compile the same source through the same numba front end, so a difference would be one of
the way (a kernel's options: the depthwise kernels' fastmath flags, the 1x1's helpers inlined
or not), not of a kernel. Every kernel is checked against the numpy references and torch in
tests/fast/test_fast_kernels.py, which runs whichever back end is bound."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layers.fast import aot, backend, workers
from layers.fast.depthwise import depthwise_conv2d, pack_channel_blocks, uses_channels_last
from layers.fast.epilogue import (CLAMP, SILU, Activation)
from layers.fast.gemm import gemm_conv2d, pack_gemm_weight
from parser.errors import InferError
from support import write_pnnx

aot_only = pytest.mark.skipif(backend.start() != "aot",
                              reason="the kernels could not be compiled ahead of time here")


@contextlib.contextmanager
def just_in_time():
    """Inside: every exported kernel is numba's just-in-time version of the same function
    (one per process: numba compiles each for the types it meets once, not once a test)."""
    backend.use_jit()                      # the helper kernels, as numba functions
    saved = []
    for k in backend.exported_kernels():
        module = sys.modules[k.func.__module__]
        saved.append((module, k.func.__name__, getattr(module, k.func.__name__)))
        setattr(module, k.func.__name__, _jitted(k))
    try:
        yield
    finally:
        for module, name, function in saved:
            setattr(module, name, function)


_JITTED: dict = {}


def _jitted(exported):
    """numba's dispatcher of an exported kernel's function, made once per process."""
    import numba

    if exported.func not in _JITTED:
        _JITTED[exported.func] = numba.njit(cache=True, **exported.options)(exported.func)
    return _JITTED[exported.func]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def depthwise_runs():
    for size, stride, k in ((13, 1, 3), (14, 2, 5), (5, 1, 5), (7, 2, 3), (30, 1, 3),
                            (40, 2, 3)):                # rows of 40: split a vector at a time
        pad = k // 2
        out = (size + 2 * pad - k) // stride + 1
        weight = rand(6, k, k, seed=1)
        if uses_channels_last(6, 6, (k, k), (stride, stride), (out, out)):
            weight = pack_channel_blocks(weight)
        yield lambda size=size, weight=weight, stride=stride, pad=pad, out=out: (
            depthwise_conv2d(rand(2, 6, size, size), weight, rand(6, seed=2), (stride, stride),
                             (pad,) * 4, (1, 1), (out, out), Activation(CLAMP, 0.0, 6.0)))


def pointwise_runs():
    for c_in, c_out in ((5, 7), (7, 5)):               # 1x1: widening (packs x), narrowing
        yield lambda c_in=c_in, c_out=c_out: gemm_conv2d(
            rand(2, c_in, 11, 9), pack_gemm_weight(rand(c_out, c_in, 1, 1, seed=6), 1),
            rand(c_out, seed=7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (11, 9),
            Activation(SILU), rand(2, c_out, 11, 9, seed=8))


@aot_only
@pytest.mark.xdist_group("just in time")   # one worker: each kernel compiled once, not twice
@pytest.mark.parametrize("run", [*depthwise_runs(), *pointwise_runs()])
def test_ahead_of_time_and_just_in_time_kernels_agree_bit_for_bit(run):
    ahead = run()
    with just_in_time():
        jit = run()
    np.testing.assert_array_equal(ahead, jit)


@contextlib.contextmanager
def team_with_a_helper():
    """A team of this thread and one helper, made here (it keeps the _work it finds: made
    inside just_in_time(), the just-in-time one) and stopped after; a skip without numpy's
    BLAS (no helper threads then)."""
    blas = workers.find_blas()
    if blas is None:
        pytest.skip("numpy's BLAS not found: no helper threads")
    team = workers.Team(1, blas)
    team.active.set()
    try:
        yield team
    finally:
        team.stop()


def upsampled(team) -> np.ndarray:
    """Nearest upsampling of 6 planes shared by ``team``: a job whose writer puts its units
    function's address in the record, and _work calls it there (atomics.units_address,
    run_units), on whichever thread takes each chunk."""
    y = np.empty((2, 3, 10, 14), np.float32)
    team.upsample(rand(2, 3, 5, 7), y, 2, 2)
    return y


@aot_only
@pytest.mark.xdist_group("just in time")
def test_a_job_shared_with_a_helper_gives_the_same_bits_either_way():
    with team_with_a_helper() as team:
        ahead = upsampled(team)
    with just_in_time(), team_with_a_helper() as team:
        jit = upsampled(team)
    np.testing.assert_array_equal(ahead, jit)
    np.testing.assert_array_equal(ahead, rand(2, 3, 5, 7).repeat(2, 2).repeat(2, 3))


@aot_only
@pytest.mark.xdist_group("just in time")
def test_a_chunk_that_raises_fails_the_shared_job_instead_of_leaving_it_half_done():
    """A units function's exception cannot reach the caller from a helper thread: run_units
    reports it, _work marks the job FAILED, and the team raises, here for a units function
    (compiled just in time) that raises from the third unit on."""
    import numba

    from layers.fast import atomics, jobs

    backend.use_jit()                                  # the intrinsics, as numba functions
    units_address = atomics.units_address

    @numba.njit
    def raising_units(record, reals, slot, first, last):
        if last > 2:
            raise ValueError("this chunk fails")

    @numba.njit
    def raising_job(record, reals, units):
        record[jobs.RUN] = units_address(raising_units)
        record[jobs.UNITS] = units

    with team_with_a_helper() as team:
        with pytest.raises(RuntimeError, match="a fast kernel failed in a shared job"):
            team._share(raising_job, 4, 4)
        y = upsampled(team)                                   # the next job runs as usual
    np.testing.assert_array_equal(y, rand(2, 3, 5, 7).repeat(2, 2).repeat(2, 3))


@aot_only
def test_a_compiled_kernel_refuses_arrays_it_was_not_compiled_for():
    """Compiled code would read a float64 or strided array wrongly (or crash): the call checks."""
    from layers.fast import pool

    y = np.empty((1, 1, 2, 2), np.float32)
    for x in (np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 4, 8), np.float32)[..., ::2],
              np.zeros((1, 4, 4), np.float32), np.zeros((1, 1, 4, 4), ">f4"), 0.0):
        with pytest.raises(TypeError, match="max_pool2d: argument 0 must be a C-contiguous"):
            pool._max_pool2d(x, y, 2, 2, 2, 2, 1, 1, 0, 0)


class Subclassed(np.ndarray):
    """An ndarray subclass, as a user's array type may be."""


@aot_only
def test_a_compiled_kernel_takes_read_only_and_subclassed_arrays():
    """The check's one-test common case (a plain writeable array) is not the only one it
    lets through: a read-only array (packed weights are) or an ndarray subclass is read
    as it is."""
    from layers.fast import pool

    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    expected = x.reshape(2, 2, 2, 2).max(axis=(1, 3)).reshape(1, 1, 2, 2)
    read_only = x.copy()
    read_only.flags.writeable = False
    for given in (read_only, x.view(Subclassed)):
        y = np.empty((1, 1, 2, 2), np.float32)
        pool._max_pool2d(given, y, 2, 2, 2, 2, 1, 1, 0, 0)
        np.testing.assert_array_equal(y, expected)


# a depthwise convolution added to its input: kernels of the runs above, so that numba's disk
# cache has them already (a 1x1 would add the other algorithms' kernels that a build loads,
# and a second compile of the product for read-only weights)
SMALL = """
7767517
5 4
pnnx.Input      in0   0 1 x #x=(1,8,20,20)f32
nn.Conv2d       dw    1 1 x a bias=True dilation=(1,1) groups=8 in_channels=8 kernel_size=(3,3) out_channels=8 padding=(1,1) padding_mode=zeros stride=(1,1) @weight=(8,1,3,3)f32 @bias=(8)f32
nn.ReLU6        act   1 1 a b
pnnx.Expression add   2 1 b x c expr=add(@0,@1)
pnnx.Output     out0  1 0 c
"""  # noqa: E501


def run_model_in_a_process(param: Path, backend_name: str) -> tuple[bool, np.ndarray]:
    """The model of ``param`` on a fixed input in a fresh process with PNNX_INFER_KERNELS
    set, on one thread (two would compile the jobs' writers just in time too; the bits do not
    depend on the threads, test_workers.py): whether numba was imported, and the output."""
    script = ("import sys, json, numpy as np; from infer import RuntimeGraph; "
              f"g = RuntimeGraph({str(param)!r}); g.set_num_threads(1); g.build(); "
              "x = np.random.default_rng(0).random((1, 8, 20, 20), np.float32); "
              "y = g.forward(x)[0]; "
              "print(json.dumps(['numba' in sys.modules, y.ravel().tolist()]))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, env={**os.environ, "PNNX_INFER_KERNELS": backend_name})
    numba_loaded, output = json.loads(out.stdout.splitlines()[-1])
    return numba_loaded, np.array(output, np.float32)


@aot_only
@pytest.mark.xdist_group("just in time")   # after the kernels above: numba's cache has them
def test_a_model_gives_the_same_output_with_either_backend(tmp_path):
    weights = {name: rand(*shape, seed=seed) * 0.2 for seed, (name, shape) in enumerate(
        [("dw.weight", (8, 1, 3, 3)), ("dw.bias", (8,))])}
    param, _ = write_pnnx(tmp_path, SMALL, weights)
    aot_numba, aot_output = run_model_in_a_process(param, "aot")
    jit_numba, jit_output = run_model_in_a_process(param, "jit")
    assert not aot_numba and jit_numba
    np.testing.assert_array_equal(aot_output, jit_output)


def test_when_the_module_cannot_be_built_numba_compiles_just_in_time(monkeypatch, tmp_path,
                                                                     caplog):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))

    def no_compiler(directory, parts, **options):
        raise subprocess.CalledProcessError(1, "cc", stderr="error: no C compiler")

    monkeypatch.setattr(aot, "_build_in_children", no_compiler)
    assert aot.load_or_build() is None
    assert "no C compiler" in caplog.text and "just in time" in caplog.text


def test_the_parts_hold_every_exported_kernel_once_and_the_products_together():
    exported = backend.exported_kernels()
    parts = [aot.kernels_of_part(part) for part in range(aot.PARTS)]
    assert sorted(k.name for part in parts for k in part) == sorted(k.name for k in exported)
    assert set(aot.PRODUCT_JOBS) <= {k.name for k in parts[0]}      # no name gone stale
    modules = {k.func.__module__.rsplit(".", 1)[-1] for k in exported}
    assert set(aot.PRODUCT_MODULES) <= modules
    assert {k.func.__module__.rsplit(".", 1)[-1] for k in parts[1]}.isdisjoint(
        aot.PRODUCT_MODULES)


def test_the_module_name_follows_the_kernel_sources(monkeypatch):
    before = aot.key()
    monkeypatch.setattr(aot, "cpu_description", lambda: "another CPU")
    assert aot.key() != before and len(before) == 16


def test_an_unknown_backend_is_refused(monkeypatch):
    monkeypatch.setenv("PNNX_INFER_KERNELS", "gpu")
    with pytest.raises(InferError, match="PNNX_INFER_KERNELS='gpu'"):
        backend.wanted_backend()
    monkeypatch.setenv("PNNX_INFER_KERNELS", " JIT ")
    assert backend.wanted_backend() == "jit"


def test_modules_built_for_other_sources_are_removed(tmp_path):
    names = [f"kernels_new_{part}" for part in range(2)]
    for name in ("kernels_old_0.so", "kernels_old_0.lock", "kernels_new_0.so",
                 "kernels_new_1.so", "kernels_new_0.lock", "unrelated.so"):
        (tmp_path / name).touch()
    aot._remove_stale(tmp_path, names)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kernels_new_0.lock", "kernels_new_0.so", "kernels_new_1.so", "unrelated.so"]


def test_a_build_that_takes_too_long_is_stopped_and_numba_takes_over(monkeypatch, tmp_path,
                                                                     caplog):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "BUILD_TIMEOUT", 0.2)
    assert aot.load_or_build() is None
    assert "timed out" in caplog.text and "just in time" in caplog.text
    assert not list((tmp_path / "pnnx_infer").glob("*.so"))


def test_array_subclasses_pass_the_argument_check(tmp_path):
    """A compiled kernel takes an ndarray subclass (np.memmap) of the right layout as it
    takes a plain array."""
    from layers.fast import pool

    mapped = np.memmap(tmp_path / "x.f32", np.float32, "w+", shape=(1, 2, 4, 4))
    mapped[:] = rand(1, 2, 4, 4)
    y_mapped, y_plain = np.empty((2, 1, 2, 2, 2), np.float32)
    pool._max_pool2d(mapped, y_mapped, 2, 2, 2, 2, 1, 1, 0, 0)
    pool._max_pool2d(np.array(mapped), y_plain, 2, 2, 2, 2, 1, 1, 0, 0)
    np.testing.assert_array_equal(y_mapped, y_plain)


def test_the_tile_width_follows_the_cpu_or_the_setting(monkeypatch):
    from layers.fast import simd

    monkeypatch.delenv("PNNX_INFER_LANES", raising=False)
    flags = next((line.split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), []) if Path("/proc/cpuinfo").exists() else []
    assert simd.vector_lanes() == (16 if "avx512f" in flags else 8)
    for wanted in ("8", "16"):
        monkeypatch.setenv("PNNX_INFER_LANES", wanted)
        assert simd.vector_lanes() == int(wanted)
    monkeypatch.setenv("PNNX_INFER_LANES", "12")
    with pytest.raises(InferError, match="PNNX_INFER_LANES='12'"):
        simd.vector_lanes()


def test_full_width_has_llvm_vectorise_a_loop_at_the_tiles_width():
    """The smooth activations' loops ask for vectors of LANES floats (simd.full_width): LLVM,
    which takes 8-float vectors for the loops it vectorises on CPUs it tunes for 256-bit ones
    (Intel AVX-512 servers), then takes 16 where the tiles do. The values are the same."""
    import llvmlite.binding as llvm
    import numba
    from numba.core import config

    from layers.fast import epilogue, simd

    backend.use_jit()                      # what smooth_row calls, as numba functions
    declared = next(k for k in backend.declared_kernels() if k.name == "smooth_row")
    smooth_row = numba.njit(**declared.options)(declared.func)    # compiled here: its IR
    row = np.linspace(-4, 4, 100, dtype=np.float32)
    expected = row / (1 + np.exp(-row.astype(np.float64)))
    smooth_row(row, epilogue.SILU, np.float32(-0.0))
    np.testing.assert_allclose(row, expected, rtol=1e-6, atol=1e-7)
    ir = "".join(smooth_row.inspect_llvm().values())
    assert f'"prefer-vector-width"="{simd.LANES * 32}"' in ir
    # the width itself where the target's vectors hold LANES floats (not PNNX_INFER_LANES=16
    # on an AVX2 machine, nor NEON's 4)
    features = (config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()).split(",")
    native = 16 if "+avx512f" in features else 8 if "+avx" in features else None
    if native == simd.LANES:
        assert f"<{simd.LANES} x float>" in ir


def test_the_module_name_follows_the_tile_width(monkeypatch):
    from layers.fast import simd

    before = aot.key()
    monkeypatch.setattr(simd, "LANES", 24 - simd.LANES)
    assert aot.key() != before


def test_numba_keeps_the_kernels_code_only_while_no_kernel_source_changes():
    """numba's cache would keep pointwise.py's compiled kernels after an edit to simd.py,
    which they call: the kernels' cache entries carry the key of every source instead."""
    from numba.core import caching

    from layers.fast import pointwise

    backend.use_jit()
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl     # older numba
    locator_class = impl._locator_classes[0]
    kernel_function = backend.declared_kernels()[0].func
    blocks = next(k.func for k in backend.declared_kernels() if k.func.__name__ ==
                  "pointwise_blocks")
    locator = locator_class.from_function(blocks, pointwise.__file__)
    assert locator is not None and locator.get_source_stamp() == aot.key()
    assert locator_class.from_function(test_the_module_name_follows_the_tile_width,
                                       __file__) is None             # not a kernel: numba's
    assert kernel_function.__module__.startswith("layers.fast.")


def test_the_build_starts_from_an_empty_numba_cache(monkeypatch, tmp_path):
    """The children that compile the modules get a numba cache of their own, new and
    removed afterwards, so no code compiled before an edit is linked in."""
    seen = []

    class Child:
        returncode = 0

        def __init__(self, args, env, **options):
            seen.append(env["NUMBA_CACHE_DIR"])
            assert Path(env["NUMBA_CACHE_DIR"]).is_dir()
            assert not any(Path(env["NUMBA_CACHE_DIR"]).iterdir())

        def communicate(self, timeout=None):
            return "", ""

        def poll(self):
            return 0

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "users"))
    monkeypatch.setattr(subprocess, "Popen", Child)
    aot._build_in_children(tmp_path, [0, 1])
    assert len(seen) == 2 and seen[0] == seen[1]
    assert Path(seen[0]).parent == tmp_path and not Path(seen[0]).exists()
