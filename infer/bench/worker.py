"""One engine, one model, one batch size, in a process of its own.

    python infer/bench/worker.py '{"engine": "onnxruntime", "onnx": "m.onnx", ...}'

prints one JSON line with what it measured (with ``"profile": true`` in the job, each
operator's time instead: ``profile_operators``, for infer/bench/operators.py; with ``"kind":
"folder"``, images per second through the folder pipeline: ``measure_folder``, for
infer/bench/folder.py). It is started as a script, not as a module of the ``infer`` package,
so that only the pnnx-infer worker imports the runtime (the folder pipeline's workers both
import its reading and preprocessing). A fresh process per measurement keeps the engines
apart: each has its own thread pools, which keep spinning for a while after a run and would
slow down whichever engine runs next in the same process, and its own memory, so the
process's peak resident set is that engine's. The worker imports only its own engine.

What it measures, in order:
  import   importing the engine's library (torch is slow to import; numba too)
  load     reading the model and making it runnable (RuntimeGraph.build, creating the
           onnxruntime session, torch.jit.load)
  first    the first inference (compilation, caches, memory first touched)
  runs     after a few warm-up runs, inferences until ``seconds`` have passed and at least
           ``min_runs`` are done; each one timed alone with time.perf_counter
  memory   resident set (RSS) after loading, and its peak during the inferences: Linux's
           high-water mark VmHWM is read after loading, then reset (/proc/self/clear_refs),
           so its value at the end is the inferences' peak. (Not ru_maxrss: a child
           process inherits its parent's, here the benchmark's with torch loaded.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

UNTIL_FAST_MAX_S = 900          # a cold start waits this long at most for the fast floor


def _pnnx_graph(job: dict):
    """This runtime's graph of the job's model, built, capped at the job's threads."""
    from infer import RuntimeGraph

    graph = RuntimeGraph(job["param"], job["bin"]).build()
    graph.set_num_threads(job["threads"])
    return graph


def _onnxruntime_session(job: dict, profile: bool = False):
    """An onnxruntime session of the job's ONNX file on the job's threads, sequential; with
    ``profile``, its profiler on, writing beside the job's output."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = job["threads"]
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(job["output"]).with_suffix(""))
    session = ort.InferenceSession(job["onnx"], options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name


def _load(engine: str, job: dict):
    """Import the engine and load the model; return a function x -> first output."""
    threads = job["threads"]
    if engine == "pnnx-infer":
        import infer  # noqa: F401  (the import is timed apart from the load)

        started = time.perf_counter()
        graph = _pnnx_graph(job)

        def run(x):
            return graph.forward(x)[0]
        run.graph = graph                        # type: ignore[attr-defined]
        return started, run
    if engine == "onnxruntime":
        import onnxruntime  # noqa: F401

        started = time.perf_counter()
        session, name = _onnxruntime_session(job)
        return started, lambda x: session.run(None, {name: x})[0]
    if engine == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        started = time.perf_counter()
        module = torch.jit.load(job["torchscript"]).eval()

        def run(x):
            with torch.inference_mode():
                return module(torch.from_numpy(x)).numpy()

        return started, run
    raise SystemExit(f"unknown engine {engine!r}")


def measure(job: dict) -> dict:
    x = np.load(job["input"])
    began = time.perf_counter()
    load_started, run = _load(job["engine"], job)
    loaded = time.perf_counter()
    peak_loading = _status_kib("VmHWM")          # importing and loading
    rss_loaded = _status_kib("VmRSS")
    peak_reset = _reset_peak()

    first_started = time.perf_counter()
    y = run(x)
    first = time.perf_counter() - first_started
    np.save(job["output"], np.asarray(y))
    fast_s = None
    if job.get("until_fast"):                    # a cold start: infer until the fast floor,
        graph = run.graph                        # once a second (a user's pace, not a loop
        while graph.floor != "fast" and time.perf_counter() - began < UNTIL_FAST_MAX_S:
            time.sleep(1.0)                      # that takes the cores from the compiler)
            run(x)
        fast_s = time.perf_counter() - began
    for _ in range(job["warmup"]):
        run(x)
    times: list[float] = []
    deadline = time.perf_counter() + job["seconds"]
    while len(times) < job["max_runs"] and (len(times) < job["min_runs"]
                                            or time.perf_counter() < deadline):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)

    peak_inference = _status_kib("VmHWM")        # since the reset: the inferences
    peak_process = max(peak_loading, peak_inference)
    if not peak_reset:                           # no reset: the whole process's peak only
        peak_inference = peak_process
    return {"import_s": load_started - began, "load_s": loaded - load_started,
            "first_s": first, "fast_s": fast_s, "times": times, "rss_loaded_mib": rss_loaded / 1024,
            "peak_rss_mib": peak_process / 1024,
            "inference_rss_mib": max(peak_inference - rss_loaded, 0) / 1024}


def profile_operators(job: dict) -> dict:
    """Each operator's median time over ``min_runs`` runs after ``warmup``, in run order:
    {"operators": [{"name", "type", "output", "input" (shapes), "weight" (or None), "groups",
    "stride", "ms"}]}. pnnx-infer: RuntimeGraph.profile. onnxruntime: its own profiler
    (SessionOptions.enable_profiling), one event per node and run."""
    x = np.load(job["input"])
    runs, warmup = job["min_runs"], job["warmup"]
    if job["engine"] == "pnnx-infer":
        rows = _pnnx_graph(job).profile(x, repeat=runs, warmup=max(warmup, 1)).rows
        return {"operators": [
            {"name": r.operator.name, "type": r.operator.type,
             "output": list(r.output_shapes[0]) if r.output_shapes else [],
             "input": list(r.input_shapes[0]) if r.input_shapes else [],
             "weight": (list(r.operator.attrs["weight"].shape)
                        if "weight" in r.operator.attrs else None),
             "groups": r.operator.param_values().get("groups", 1),
             "stride": list(r.operator.param_values().get("stride", ()) or ()),
             "ms": 1e3 * r.seconds} for r in rows]}
    if job["engine"] == "onnxruntime":
        session, name = _onnxruntime_session(job, profile=True)
        for _ in range(warmup + runs):
            session.run(None, {name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
        durations: dict[str, list[float]] = {}
        nodes: dict[str, dict] = {}
        for event in events:
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            node, args = event["name"][:-len("_kernel_time")], event["args"]
            durations.setdefault(node, []).append(event["dur"] / 1e3)
            shapes = [next(iter(t.values())) for t in args.get("input_type_shape", [])]
            outputs = [next(iter(t.values())) for t in args.get("output_type_shape", [])]
            nodes.setdefault(node, {"name": node, "type": args.get("op_name", "?"),
                                    "output": outputs[0] if outputs else [],
                                    "input": shapes[0] if shapes else [],
                                    "weight": shapes[1] if len(shapes) > 1 else None,
                                    "groups": None, "stride": []})
        for node, times in durations.items():              # the warm-up runs left out
            kept = times[warmup:] or times
            nodes[node]["ms"] = float(np.median(kept))
        return {"operators": list(nodes.values())}
    raise SystemExit(f"no operator profile for engine {job['engine']!r}")


class OnnxGraph:
    """An onnxruntime session with what ImageClassifier uses of a RuntimeGraph:
    ``forward(x) -> [outputs]`` and ``param_path`` (for its messages)."""

    def __init__(self, job: dict) -> None:
        self.session, self.input_name = _onnxruntime_session(job)
        self.param_path = job["onnx"]

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        return list(self.session.run(None, {self.input_name: x}))


def measure_folder(job: dict) -> dict:
    """The folder pipeline (infer/bench/folder.py): one engine's pass over the job's folder
    through ``classify_many``, timed, after one batch of warm-up: {"seconds", "images",
    "load_s", "top": [[[label, probability] x 5] per image]}. Both engines import
    infer.classify here, for the same reading and preprocessing."""
    from infer.classify import ImageClassifier, Preprocess, list_images

    started = time.perf_counter()
    graph = _pnnx_graph(job) if job["engine"] == "pnnx-infer" else OnnxGraph(job)
    classifier = ImageClassifier(graph, job["labels"], Preprocess(**job["preprocess"]))
    loaded = time.perf_counter()
    paths = list_images(job["folder"])
    batch, threads = job["batch"], job["threads"]
    for _ in classifier.classify_many(paths[:batch], batch=batch, threads=threads):
        pass
    began = time.perf_counter()
    results = list(classifier.classify_many(paths, batch=batch, threads=threads))
    seconds = time.perf_counter() - began
    failed = [str(r.error) for r in results if r.error]
    if failed:
        raise SystemExit(f"{len(failed)} images failed, the first: {failed[0]}")
    return {"seconds": seconds, "images": len(results), "load_s": loaded - started,
            "top": [[[label, p] for label, p in r.top] for r in results]}


def _status_kib(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    if job.get("kind") == "folder":             # the folder pipeline (infer/bench/folder.py)
        print(json.dumps(measure_folder(job)))
    else:
        print(json.dumps(profile_operators(job) if job.get("profile") else measure(job)))
