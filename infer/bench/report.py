"""The benchmark's report: the machine it ran on and the result tables, in Markdown, written
between two marker lines of BENCHMARKS.md (the text around them is left as it is)."""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
from importlib import metadata
from pathlib import Path

from infer.bench.fixed import FIXED_COST_TARGET_MS, FIXED_OPERATORS
from infer.bench.fixed import INPUT_SHAPE as FIXED_INPUT
from infer.bench.models import BREADTH_MODELS, REAL_MODELS
from infer.bench.run import BASELINE, REFERENCE, TOLERANCE, Results

BEGIN = "<!-- benchmark results: written by python -m infer.bench -->"
END = "<!-- end of benchmark results -->"


def machine() -> list[tuple[str, str]]:
    """What the numbers depend on: CPU, cores, library versions."""
    versions = []
    for package in ("numpy", "numba", "onnxruntime", "torch", "pnnx"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return [("CPU", _cpu_model()), ("vectors", _vectors()),
            ("cores", f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable"),
            ("system", f"{platform.system()} {platform.release()} {platform.machine()}"),
            ("Python", platform.python_version()),
            ("libraries", ", ".join(versions))]


def _vectors() -> str:
    """The widest float vectors the CPU has, and the floats per vector the kernels use
    (layers/fast/simd.py's LANES: the register tiles are 6 rows of 2 vectors)."""
    from layers.fast.cpu import cpu_description
    from layers.fast.simd import LANES

    flags = cpu_description().split()
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"
    return f"{widest}; kernels use {LANES} floats per vector (tiles 6 x {2 * LANES})"


def _cpu_model() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    try:                                                # the highest clock, where Linux says
        highest = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()
        max_mhz: float | None = int(highest) / 1000     # kHz
    except (OSError, ValueError):
        max_mhz = None
    return cpu_model(cpuinfo, max_mhz) if "model name" in cpuinfo else (
        platform.processor() or "unknown")


def cpu_model(cpuinfo: str, max_mhz: float | None = None) -> str:
    """The first processor of a /proc/cpuinfo text: its name, then what tells apart CPUs
    that share a name (a virtual machine often says only "AMD EPYC"): family and model
    numbers (AMD family 25 model 1 is a Zen 3, model 17 a Zen 4), clock (``max_mhz``, else
    the clock cpuinfo reports now) and cache (L2 on AMD, L3 on Intel), e.g. "AMD EPYC
    (family 25, model 1, 2445 MHz, cache 512 KB)"."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break                                   # the first processor's block only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or "unknown"
    details = [f"{label} {fields[key]}" for key, label in
               (("cpu family", "family"), ("model", "model")) if fields.get(key)]
    try:
        mhz = float(fields["cpu MHz"]) if max_mhz is None else max_mhz
    except (KeyError, ValueError):
        mhz = math.nan
    if math.isfinite(mhz) and mhz > 0:
        details.append(f"{mhz:.0f} MHz")
    if fields.get("cache size"):
        details.append(f"cache {fields['cache size']}")
    return f"{name} ({', '.join(details)})" if details else name


def markdown(results: Results, command: str) -> str:
    s = results.settings
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"Run on {now}: `{command}`", ""]
    lines += [f"- {key}: {value}" for key, value in machine()]
    lines += [f"- settings: {s.threads} threads per engine, {_count(s.rounds, 'round')}, each "
              f"round a fresh process per engine timing at least {s.min_runs} inferences and "
              f"{s.seconds:g} s after {_count(s.warmup, 'warm-up run')}; this project's "
              f"modules byte-compiled first, as pip compiles an installed package's",
              "- ONNX export: " + "; ".join(f"{m}: {e}" for m, e in
                                             results.onnx_exporters.items()), ""]
    lines += _latency_table(results) + [""] + _cold_start_table(results) + [""]
    lines += _targets(results)
    return "\n".join(lines).rstrip() + "\n"


# latency targets of pnnx-infer, as ratios to onnxruntime in the same run: (model, batch) -> ratio
LATENCY_TARGETS = {("resnet18", 1): 0.9, ("resnet18", 8): 0.9, ("efficientnet_lite0", 1): 1.2,
                   ("efficientnet_lite0", 8): 1.1}
FIRST_TARGET = 2.0              # first inference / steady median, kernels compiled
COLD_ANSWER_TARGET_S = 30.0     # a first run on a machine: import, load, first inference
# over the breadth models, per batch: the geometric mean of the ratios, and the largest
BREADTH_MEAN_TARGET, BREADTH_MAX_TARGET = 1.3, 2.0


def _targets(results: Results) -> list[str]:
    """pnnx-infer against the targets (ratios to onnxruntime measured in this run)."""
    lines = []
    for ours in results.measurements:
        base = results.find(ours.model, ours.batch, BASELINE)
        if ours.engine != "pnnx-infer" or not (ours.ok and base and base.ok):
            continue
        where = f"{ours.model} batch {ours.batch}"
        target = LATENCY_TARGETS.get((ours.model, ours.batch))
        if target:
            ratio = ours.median_ms / base.median_ms
            lines.append(f"- {where}: latency {ratio:.2f}x {BASELINE} (target {target}x) "
                         f"{_mark(ratio <= target)}")
        start, base_start = ours.import_s + ours.load_s, base.import_s + base.load_s
        lines.append(f"- {where}: import + load {start:.3f} s vs {base_start:.3f} s "
                     f"{_mark(start <= base_start)}; peak RSS "
                     f"{ours.peak_rss_mib:.0f} vs {base.peak_rss_mib:.0f} MiB "
                     f"{_mark(ours.peak_rss_mib <= base.peak_rss_mib)}; first / "
                     f"median {ours.first_ms / ours.median_ms:.1f} (target {FIRST_TARGET:g}) "
                     f"{_mark(ours.first_ms <= FIRST_TARGET * ours.median_ms)}; outputs within "
                     f"{TOLERANCE:g} of {ours.reference} "
                     f"{'(not measured)' if ours.agrees is None else _mark(ours.agrees)}")
    lines += _group_targets(results)
    for c in results.cold_starts:
        if c.cache == "cold":
            answer = c.report["import_s"] + c.report["load_s"] + c.report["first_s"]
            lines.append(f"- {c.model} first run on a machine: first answer after {answer:.1f} "
                         f"s (target {COLD_ANSWER_TARGET_S:g} s) "
                         f"{_mark(answer <= COLD_ANSWER_TARGET_S)}")
    if results.fixed_cost:
        median_ms = 1e3 * statistics.median(results.fixed_cost["times"])
        lines.append(f"- fixed cost of a forward, {FIXED_OPERATORS} operators on "
                     f"{'x'.join(map(str, FIXED_INPUT))} (infer/bench/fixed.py): {median_ms:.3f} "
                     f"ms (target {FIXED_COST_TARGET_MS:g} ms) "
                     f"{_mark(median_ms <= FIXED_COST_TARGET_MS)}")
    if not lines:
        return []
    return ["pnnx-infer against its targets (ratios to onnxruntime measured in this run):",
            ""] + lines


def _group_targets(results: Results) -> list[str]:
    """Per group (the breadth models, the real ones) and batch, over the group's models run:
    the geometric mean of pnnx-infer's latency ratios to onnxruntime, exp(mean(log ratio)),
    and the largest ratio."""
    lines = []
    for group, models in (("breadth", BREADTH_MODELS), ("real", REAL_MODELS)):
        for batch in results.settings.batches:
            lines += _group_line(results, group, models, batch)
    return lines


def _group_line(results: Results, group: str, models: tuple[str, ...], batch: int
                ) -> list[str]:
    """The targets line of one group at one batch size (none if none of it ran)."""
    ratios = {}
    for model in models:
        ours, base = (results.find(model, batch, e) for e in ("pnnx-infer", BASELINE))
        if ours and base and ours.ok and base.ok:
            ratios[model] = ours.median_ms / base.median_ms
    if not ratios:
        return []
    mean = math.exp(statistics.fmean(math.log(r) for r in ratios.values()))
    worst = max(ratios, key=ratios.__getitem__)
    return [f"- {group} models batch {batch} ({len(ratios)} of {len(models)}):"
            f" latency geometric mean {mean:.2f}x {BASELINE} (target "
            f"{BREADTH_MEAN_TARGET}x) {_mark(mean <= BREADTH_MEAN_TARGET)}; largest "
            f"{ratios[worst]:.2f}x, {worst} (target {BREADTH_MAX_TARGET:g}x) "
            f"{_mark(ratios[worst] <= BREADTH_MAX_TARGET)}"]


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _mark(met: bool) -> str:
    return "(met)" if met else "(**not met**)"


def _latency_table(results: Results) -> list[str]:
    header = ["model", "batch", "engine", "median ms", f"x {BASELINE}", "round medians ms",
              "import s", "load s", "first ms", "first / median", "peak RSS MiB",
              "inference RSS MiB", f"max abs diff vs {REFERENCE}"]
    rows = []
    for m in results.measurements:
        if not m.ok:
            rows.append([m.model, str(m.batch), m.engine, "failed: " + (m.error or "no run")]
                        + [""] * (len(header) - 4))
            continue
        base = results.find(m.model, m.batch, BASELINE)
        ratio = f"{m.median_ms / base.median_ms:.2f}" if base and base.ok else "-"
        spread = ", ".join(f"{t:.1f}" for t in m.round_medians_ms)
        diff = "-" if m.max_diff is None else f"{m.max_diff:.1e}" + (
            "" if m.reference == REFERENCE else f" (vs {m.reference})") + (
            "" if m.agrees else f" (over {TOLERANCE:g})")
        rows.append([m.model, str(m.batch), m.engine, f"{m.median_ms:.2f}", ratio, spread,
                     f"{m.import_s:.2f}", f"{m.load_s:.3f}", f"{m.first_ms:.1f}",
                     f"{m.first_ms / m.median_ms:.1f}", f"{m.peak_rss_mib:.0f}",
                     f"{m.inference_rss_mib:.1f}", diff])
    return table(header, rows)


def _cold_start_table(results: Results) -> list[str]:
    if not results.cold_starts:
        return []
    header = ["model", "kernel cache", "import s", "load s", "first ms", "first answer s",
              "fast floor after s", "steady ms"]
    rows = []
    for c in results.cold_starts:
        r = c.report
        answer = r["import_s"] + r["load_s"] + r["first_s"]
        fast = r.get("fast_s")
        rows.append([c.model, c.cache, f"{r['import_s']:.2f}", f"{r['load_s']:.3f}",
                     f"{1e3 * r['first_s']:.1f}", f"{answer:.2f}",
                     f"{fast:.0f}" if fast is not None else f"{answer:.2f}",
                     f"{1e3 * statistics.median(r['times']):.1f}"])
    return (["pnnx-infer's start-up, batch 1, with its compiled kernels' on-disk cache "
             "(NUMBA_CACHE_DIR) empty (cold: the first inferences run on the reference floor "
             "while a detached process compiles the kernels; one inference a second until the "
             "graph is on the fast floor) and then filled (warm). *first answer s*: import, "
             "load and first inference:", ""]
            + table(header, rows))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, as lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def write(path: Path, section: str) -> None:
    """Put ``section`` between the markers of ``path`` (appending them if missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text, encoding="utf-8")
