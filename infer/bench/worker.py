"""One engine, one model, one batch size, in a process of its own.

    python infer/bench/worker.py '{"engine": "onnxruntime", "onnx": "m.onnx", ...}'

prints one JSON line with what it measured. It is started as a script, not as a module of the
``infer`` package, so that only the pnnx-infer worker imports the runtime. A fresh process per measurement keeps the engines
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


def _load(engine: str, job: dict):
    """Import the engine and load the model; return a function x -> first output."""
    threads = job["threads"]
    if engine == "pnnx-infer":
        from infer import RuntimeGraph

        started = time.perf_counter()
        graph = RuntimeGraph(job["param"], job["bin"]).build()
        graph.set_num_threads(threads)
        return started, lambda x: graph.forward(x)[0]
    if engine == "onnxruntime":
        import onnxruntime as ort

        started = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(job["onnx"], options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
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
            "first_s": first, "times": times, "rss_loaded_mib": rss_loaded / 1024,
            "peak_rss_mib": peak_process / 1024,
            "inference_rss_mib": max(peak_inference - rss_loaded, 0) / 1024}


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
    print(json.dumps(measure(json.loads(sys.argv[1]))))
