"""Operator by operator: this runtime's profile beside onnxruntime's own, on the same model.

    python -m infer.bench --layers --models resnet18 --batches 1

Each engine runs in a worker process of its own (infer/bench/worker.py, ``"profile": true``):
pnnx-infer times every operator with ``RuntimeGraph.profile``, onnxruntime with its own
profiler (``SessionOptions.enable_profiling``: one event per node and run). Both report the
median of the same number of runs, on the same input and threads.

The two engines do not run the same list of operators: onnxruntime fuses differently and adds
layout changes (its NCHWc ``ReorderInput`` / ``ReorderOutput``). The lists are matched in run
order by what each operator computes and the size of its output: the key of a convolution is
("conv", kernel size, input height and width, output height and width), of a pooling
("pool", height, width), of a linear layer ("linear", features), of anything else its type's
last name in lower case (torch.flatten pairs with Flatten); ``difflib.SequenceMatcher`` pairs
equal keys in order.
An operator with no partner is listed on its side alone. The summary adds matched rows up by
the kind of our operator (depthwise 3x3, 1x1, ...), which is where a gap shows.
"""

from __future__ import annotations

import difflib
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infer.bench import report
from infer.bench.models import MODELS, prepare
from infer.bench.run import Settings, _input, _job, run_worker

CONVOLUTIONS = {"nn.Conv2d", "F.conv2d", "Conv", "FusedConv"}
POOLING = {"nn.MaxPool2d", "nn.AvgPool2d", "nn.AdaptiveAvgPool2d", "nn.AdaptiveMaxPool2d",
           "F.max_pool2d", "F.avg_pool2d", "F.adaptive_avg_pool2d", "MaxPool", "AveragePool",
           "GlobalAveragePool", "GlobalMaxPool", "ReduceMean"}
LINEAR = {"nn.Linear", "F.linear", "Gemm", "MatMul"}


def key(op: dict) -> tuple:
    """What an operator computes, as far as both engines can tell (see the module)."""
    out, kind = op["output"], op["type"]
    source = op.get("input") or []
    if kind in CONVOLUTIONS and op.get("weight") and len(out) == 4:
        return ("conv", *op["weight"][2:], *source[2:], *out[2:])
    if kind in POOLING and len(out) == 4:
        return ("pool", *out[2:])
    if kind in LINEAR and out:
        return ("linear", out[-1])
    return ("other", kind.split(".")[-1].lower())          # torch.flatten ~ Flatten


def describe(op: dict) -> str:
    """Our operator's kind for the summary: "depthwise 5x5 s2", "conv 1x1", "MaxPool2d" ..."""
    weight = op.get("weight")
    if op["type"] in CONVOLUTIONS and weight and len(weight) == 4:
        size = "x".join(str(k) for k in weight[2:])
        stride = op.get("stride") or [1]
        strided = f" s{stride[0]}" if max(stride) > 1 else ""
        depthwise = op.get("groups", 1) > 1 and weight[1] == 1
        return f"{'depthwise' if depthwise else 'conv'} {size}{strided}"
    return op["type"].split(".")[-1]


@dataclass
class Row:
    ours: dict | None
    theirs: dict | None

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.theirs is None or self.theirs["ms"] <= 0:
            return None
        return self.ours["ms"] / self.theirs["ms"]


def match(ours: list[dict], theirs: list[dict]) -> list[Row]:
    """Pair the two run lists by ``key``: in order first (difflib), then each operator left
    over with the first free one of the same key (independent branches may run in another
    order: ResNet's downsampling 1x1 before or after its block's 3x3s). Rows follow our run
    order; a node of theirs with no partner comes just before the first pair after it."""
    matcher = difflib.SequenceMatcher(a=[key(o) for o in ours], b=[key(t) for t in theirs],
                                      autojunk=False)
    partner = {a + k: b + k for a, b, size in matcher.get_matching_blocks() for k in range(size)}
    taken = set(partner.values())
    for i, op in enumerate(ours):
        if i not in partner:
            j = next((j for j, t in enumerate(theirs) if j not in taken and key(t) == key(op)),
                     None)
            if j is not None:
                partner[i] = j
                taken.add(j)
    rows, shown = [], set()

    def theirs_alone_before(limit: int) -> None:
        for j in range(limit):
            if j not in taken and j not in shown:
                rows.append(Row(None, theirs[j]))
                shown.add(j)

    for i, op in enumerate(ours):
        j = partner.get(i)
        if j is not None:
            theirs_alone_before(j)
        rows.append(Row(op, None if j is None else theirs[j]))
    theirs_alone_before(len(theirs))
    return rows


def markdown(model: str, batch: int, threads: int, rows: list[Row]) -> str:
    """The rows as a Markdown table, then the matched rows summed by our operator's kind."""
    lines = [f"### {model}, batch {batch}, {threads} threads: each operator, pnnx-infer beside "
             f"onnxruntime", ""]
    cells = []
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])   # ours, theirs, count
    alone = [0.0, 0.0]
    for index, row in enumerate(rows, 1):
        o, t = row.ours, row.theirs
        cells.append([str(index), o["name"] if o else "", describe(o) if o else "",
                      "x".join(map(str, (o or t)["output"])), f"{o['ms']:.3f}" if o else "",
                      t["name"] if t else "", t["type"] if t else "",
                      f"{t['ms']:.3f}" if t else "",
                      f"{row.ratio:.2f}" if row.ratio is not None else ""])
        if o and t:
            total = by_kind[describe(o)]
            total[0] += o["ms"]
            total[1] += t["ms"]
            total[2] += 1
        else:
            alone[0 if o else 1] += (o or t)["ms"]
    lines += report.table(["#", "pnnx-infer operator", "kind", "output", "ms",
                           "onnxruntime node", "op", "ms", "x"], cells)
    ours_ms = sum(r.ours["ms"] for r in rows if r.ours)
    theirs_ms = sum(r.theirs["ms"] for r in rows if r.theirs)
    summary = [[kind, str(count), f"{mine:.3f}", f"{other:.3f}",
                f"{mine / other:.2f}" if other > 0 else ""]
               for kind, (mine, other, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])]
    summary.append(["(no partner)", "", f"{alone[0]:.3f}", f"{alone[1]:.3f}", ""])
    ratio = f"{ours_ms / theirs_ms:.2f}" if theirs_ms > 0 else ""
    summary.append(["**all operators**", "", f"**{ours_ms:.3f}**", f"**{theirs_ms:.3f}**",
                    f"**{ratio}**"])
    lines += [""] + report.table(["kind", "count", "pnnx-infer ms", "onnxruntime ms", "x"],
                                 summary)
    return "\n".join(lines)


def compare_layers(settings: Settings, say: Callable[[str], None] = print
                   ) -> tuple[list[str], bool]:
    """For every model and batch of ``settings``: both engines' operator profiles, matched;
    one Markdown section each, and whether every worker ran (a failed one is reported with
    its last words through ``say``, and its model and batch left out)."""
    sections, failed = [], False
    with tempfile.TemporaryDirectory(prefix="pnnx_layers_") as scratch:
        workdir = Path(settings.workdir or scratch)
        for name in settings.models:
            model = MODELS[name]
            say(f"preparing {name} (pnnx and ONNX files) in {workdir}")
            files = prepare(model, workdir / name, settings.onnx_exporter)
            for batch in settings.batches:
                x_path = _input(Path(scratch), name, batch, model.input_size)
                profiles = {}
                for engine in ("pnnx-infer", "onnxruntime"):
                    job = _job(settings, engine, files, x_path,
                               Path(scratch) / f"{name}_b{batch}_{engine}_profile.npy")
                    job["profile"] = True
                    say(f"  {name} batch {batch}: profiling {engine}")
                    try:
                        profiles[engine] = run_worker(job, None)["operators"]
                    except RuntimeError as exc:
                        say(f"  {name} batch {batch} {engine}: FAILED {exc}")
                        failed = True
                        break
                else:
                    rows = match(profiles["pnnx-infer"], profiles["onnxruntime"])
                    sections.append(markdown(name, batch, settings.threads, rows))
    return sections, not failed
