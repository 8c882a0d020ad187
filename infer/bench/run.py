"""The benchmark's main loop: prepare each model's files, then for each model and batch size
run every engine in a worker process of its own, round after round, in a rotating order."""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from infer.bench import fixed as fixed_model
from infer.bench.models import MODELS, REPO, ModelFiles, prepare

ENGINES = ("pnnx-infer", "onnxruntime", "torch")
BASELINE = "onnxruntime"            # latency ratios are to this engine
REFERENCE = "torch"                 # outputs are checked against this engine's (the
                                    # baseline's for a real model, which torch does not run)
TOLERANCE = 1e-4                    # |output - reference| <= 1e-4 + 1e-4 |reference|
WORKER = Path(__file__).resolve().parent / "worker.py"


@dataclass
class Settings:
    models: tuple[str, ...] = ("resnet18", "efficientnet_lite0")
    batches: tuple[int, ...] = (1, 8)
    engines: tuple[str, ...] = ENGINES
    rounds: int = 5
    threads: int = 2
    seconds: float = 2.0            # timed inferences per worker: at least this long ...
    min_runs: int = 5               # ... and at least this many
    max_runs: int = 2000
    warmup: int = 2
    cold_start: bool = True         # pnnx-infer's start with its kernel cache cold and warm
                                    # (compiling the kernels: about a minute per model)
    fixed_cost: bool = True         # pnnx-infer's forward on a 30-operator graph (fixed.py)
    onnx_exporter: str = "dynamo"   # or "legacy": torch.onnx.export(dynamo=False)
    workdir: Path | None = None     # exported files are kept (and reused) here; None: a temp dir


@dataclass
class Measurement:
    """One engine on one model and batch size, over all rounds."""

    model: str
    batch: int
    engine: str
    rounds: list[dict] = field(default_factory=list)    # the workers' reports
    error: str | None = None
    max_diff: float | None = None                        # max |output - reference output|
    agrees: bool | None = None
    reference: str = REFERENCE                           # the engine compared with

    def _median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rounds)

    @property
    def ok(self) -> bool:
        return bool(self.rounds) and self.error is None

    @property
    def median_ms(self) -> float:
        """The median of every timed inference of every round."""
        return 1e3 * statistics.median(t for r in self.rounds for t in r["times"])

    @property
    def round_medians_ms(self) -> list[float]:
        return [1e3 * statistics.median(r["times"]) for r in self.rounds]

    @property
    def runs(self) -> int:
        return sum(len(r["times"]) for r in self.rounds)

    import_s = property(lambda self: self._median("import_s"))
    load_s = property(lambda self: self._median("load_s"))
    first_ms = property(lambda self: 1e3 * self._median("first_s"))
    peak_rss_mib = property(lambda self: self._median("peak_rss_mib"))
    inference_rss_mib = property(lambda self: self._median("inference_rss_mib"))


@dataclass
class ColdStart:
    """pnnx-infer's start-up with its compiled kernels' cache (NUMBA_CACHE_DIR) empty, then
    filled."""

    model: str
    cache: str                      # "cold" or "warm"
    report: dict


@dataclass
class Results:
    settings: Settings
    measurements: list[Measurement]
    cold_starts: list[ColdStart]
    onnx_exporters: dict[str, str]
    fixed_cost: dict | None = None          # the worker's report on fixed.py's graph

    def find(self, model: str, batch: int, engine: str) -> Measurement | None:
        for m in self.measurements:
            if (m.model, m.batch, m.engine) == (model, batch, engine):
                return m
        return None


def byte_compile_project() -> None:
    """Write the project's bytecode (__pycache__), as pip does for an installed package:
    onnxruntime's and torch's modules load compiled, and with PYTHONDONTWRITEBYTECODE set
    (or an editable install never imported yet) ours would be compiled in every worker's
    import + load instead."""
    for package in ("parser", "layers", "infer"):
        compileall.compile_dir(REPO / package, quiet=2)


def run_benchmark(settings: Settings, say: Callable[[str], None] = print) -> Results:
    byte_compile_project()
    with tempfile.TemporaryDirectory(prefix="pnnx_bench_") as scratch:
        workdir = Path(settings.workdir or scratch)
        measurements, cold_starts, exporters = [], [], {}
        for name in settings.models:
            model = MODELS[name]
            say(f"preparing {name} (pnnx, ONNX and TorchScript files) in {workdir}")
            files = prepare(model, workdir / name, settings.onnx_exporter)
            exporters[name] = files.onnx_exporter
            engines = tuple(e for e in settings.engines         # torch runs no real model,
                            if e != "torch" or files.torchscript is not None)
            batches = settings.batches if model.onnx_file is None else tuple(
                b for b in settings.batches if b == 1)          # converted at batch 1
            if not batches:
                say(f"  {name}: converted at batch 1 only, not measured at batches "
                    f"{' '.join(map(str, settings.batches))}")
            numba_cache = None                   # the machine's own kernel cache, unless:
            if settings.cold_start and "pnnx-infer" in settings.engines:
                numba_cache = Path(tempfile.mkdtemp(prefix="numba_", dir=scratch))
                cold_starts += _cold_start(settings, model.name, model.input_size, files,
                                           numba_cache, Path(scratch), say)
            for batch in batches:
                measurements += _measure(settings, engines, name, model.input_size, batch,
                                         files, numba_cache, Path(scratch), say)
        fixed = None
        if settings.fixed_cost and "pnnx-infer" in settings.engines:
            fixed = fixed_cost(settings, Path(scratch), say)
        return Results(settings, measurements, cold_starts, exporters, fixed)


def fixed_cost(settings: Settings, scratch: Path, say) -> dict | None:
    """pnnx-infer's forward on fixed.py's 30-operator graph, in a worker: the fixed cost of a
    forward (the report's median over at least 1000 inferences)."""
    param, binary = fixed_model.write_model(scratch / "fixed_cost")
    x_path = scratch / "fixed_cost_input.npy"
    np.save(x_path, np.random.default_rng(0).standard_normal(fixed_model.INPUT_SHAPE,
                                                             dtype=np.float32))
    job = {"engine": "pnnx-infer", "param": str(param), "bin": str(binary), "input": str(x_path),
           "output": str(scratch / "fixed_cost_output.npy"), "threads": settings.threads,
           "seconds": min(settings.seconds, 1.0), "min_runs": 1000, "max_runs": 20000,
           "warmup": 50}
    try:
        report = run_worker(job, None)
    except RuntimeError as exc:
        say(f"  fixed cost: FAILED {exc}")
        return None
    say(f"  fixed cost: {1e3 * statistics.median(report['times']):.3f} ms per forward of "
        f"{fixed_model.FIXED_OPERATORS} operators")
    return report


def _measure(settings: Settings, engines: tuple[str, ...], model: str, size: tuple[int, int],
             batch: int, files: ModelFiles, numba_cache: Path | None, scratch: Path, say
             ) -> list[Measurement]:
    x_path = _input(scratch, model, batch, size)
    results = {engine: Measurement(model, batch, engine) for engine in engines}
    outputs: dict[str, Path] = {}
    for round_index in range(settings.rounds):
        shift = round_index % len(engines)                      # rotate who goes first
        for engine in engines[shift:] + engines[:shift]:
            m = results[engine]
            if m.error:
                continue
            out = scratch / f"{model}_b{batch}_{engine}.npy"
            try:
                report = run_worker(_job(settings, engine, files, x_path, out), numba_cache)
            except RuntimeError as exc:
                m.error = str(exc)
                say(f"  {model} batch {batch} {engine}: FAILED {exc}")
                continue
            m.rounds.append(report)
            outputs[engine] = out
            say(f"  {model} batch {batch} round {round_index + 1}/{settings.rounds} "
                f"{engine:12s} {1e3 * statistics.median(report['times']):9.2f} ms")
    _compare_outputs(results, outputs)
    return list(results.values())


def _compare_outputs(results: dict[str, Measurement], outputs: dict[str, Path]) -> None:
    """Each engine's output against torch's (onnxruntime's where torch did not run)."""
    reference = REFERENCE if REFERENCE in results else BASELINE
    if reference not in outputs:
        return
    want = np.load(outputs[reference])
    for engine, path in outputs.items():
        got = np.load(path)
        m = results[engine]
        m.reference = reference
        if got.shape != want.shape:
            m.agrees, m.error = False, (f"output shape {got.shape}, {reference} gives "
                                        f"{want.shape}")
            continue
        m.max_diff = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
        m.agrees = bool(np.allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE))


def _cold_start(settings: Settings, model: str, size: tuple[int, int], files: ModelFiles,
                numba_cache: Path, scratch: Path, say) -> list[ColdStart]:
    """Two pnnx-infer workers at batch 1 sharing an empty NUMBA_CACHE_DIR: the first starts
    as a user's first run does (PNNX_INFER_BUILD=background: its first inferences on the
    reference floor while a detached process compiles the kernels) and infers until its graph
    is on the fast floor; the second starts from the cache that left."""
    x_path = _input(scratch, model, 1, size)
    starts = []
    for cache in ("cold", "warm"):
        job = _job(settings, "pnnx-infer", files, x_path, scratch / f"{model}_{cache}.npy")
        job.update(seconds=0.0, min_runs=3, warmup=0, until_fast=cache == "cold")
        try:
            report = run_worker(job, numba_cache, build="background")
        except RuntimeError as exc:
            say(f"  {model} kernel cache {cache}: FAILED {exc}")
            return starts
        starts.append(ColdStart(model, cache, report))
        say(f"  {model} pnnx-infer with its kernel cache {cache}: first inference "
            f"{1e3 * report['first_s']:.1f} ms")
    return starts


def _input(scratch: Path, model: str, batch: int, size: tuple[int, int]) -> Path:
    """The same seeded input for every engine, (batch, 3, height, width) = (batch, 3, *size),
    in a .npy file the workers read."""
    path = scratch / f"{model}_b{batch}_input.npy"
    if not path.exists():
        rng = np.random.default_rng(batch)
        np.save(path, rng.standard_normal((batch, 3, *size), dtype=np.float32))
    return path


def _job(settings: Settings, engine: str, files: ModelFiles, x_path: Path, out: Path) -> dict:
    return {"engine": engine, "param": str(files.param), "bin": str(files.bin),
            "onnx": str(files.onnx), "torchscript": str(files.torchscript or ""),
            "input": str(x_path), "output": str(out), "threads": settings.threads,
            "seconds": settings.seconds, "min_runs": settings.min_runs,
            "max_runs": settings.max_runs, "warmup": settings.warmup}


def run_worker(job: dict, numba_cache: Path | None, build: str = "wait") -> dict:
    """Run worker.py in a new process with every thread pool capped at ``job['threads']``,
    and with ``numba_cache`` as its compiled kernels' cache (None: the one it would use
    anyway, where the kernels are usually compiled already); its report, or RuntimeError with
    its last words. ``build`` is its PNNX_INFER_BUILD: "wait" (a graph built before the
    kernels are compiled waits for them, so every timing is of the fast floor) or
    "background" (a user's first run: the cold-start measurement)."""
    threads = str(job["threads"])
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads, NUMBA_NUM_THREADS=threads, PNNX_INFER_BUILD=build,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache)
    done = subprocess.run([sys.executable, str(WORKER), json.dumps(job)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"worker exited with {done.returncode}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])
