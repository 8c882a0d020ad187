"""Where the time goes: one row per operator (KuiperInfer's layer time log, as a table).

    p = g.profile(x)               # each operator timed: median of 5 runs after 1 warm-up
    p                              # in run order (an HTML table in Jupyter; print(p) as text)
    p.table(sort="time", top=10)   # the ten slowest
    p.by_type()                    # one row per operator type: count, time, share, FLOPs
    g.profile(x, again=True)       # and each operator called again at once ("again ms")

Each row: time (ms), share of the total, output size (bytes), and FLOPs where an operator's
arithmetic is a count of multiply-adds. A multiply-add counts as 2 FLOPs:

    convolution   2 * N * C_out * H_out * W_out * (C_in / groups * kH * kW)
                  = 2 * output.size * weight[0].size          (weight: (C_out, C_in/groups, kH, kW))
    linear        2 * (output.size / out_features) * in_features * out_features
                  = 2 * output.size * in_features
    matmul        2 * batch * M * N * K  = 2 * output.size * K   (A: (..., M, K), B: (..., K, N))

plus 1 FLOP per output element for a bias. Other operators get no FLOP count: they are bound by
memory, and their output size says what they cost. GFLOP/s = FLOPs / time.

With ``again``, each operator is also called a second time right after it ran, on the same
arrays (``Execution.time_again``): its code and data are then in cache. Inside a forward the
kernels stream weights and activations through the caches between two calls of the same
code, so a step's first call also pays for fetching back its code (the Python around the
kernels as well as the kernels') and its data; "ms" minus "again ms" is that cold start.

The timed passes run ``forward``'s loop (``g.execute(..., hooks=False, timed=True)``: in place
where it runs in place, into the memory plan's buffers), without the graph's hooks; the clock
wraps each layer call alone. So the rows add up to about what ``forward`` takes, and the copies
a step-by-step debug session makes to keep every intermediate (infer/debug.py) cost nothing here.
The warm-up passes run as forwards do, and the weights they have packed in the background
(the large ones of a size first met in a forward) are waited for: the timed runs are the
steady ones a later forward makes.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from infer.runtime import RuntimeOperator
from infer.table import Table, fmt_bytes, fmt_count, fmt_shape
from parser.errors import GraphError

if TYPE_CHECKING:
    from infer.graph import RuntimeGraph

Shape = tuple[int, ...]
log = logging.getLogger(__name__)

CONVOLUTIONS = {"nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "F.conv1d", "F.conv2d", "F.conv3d"}
TRANSPOSED = {"nn.ConvTranspose1d", "nn.ConvTranspose2d", "nn.ConvTranspose3d",
              "F.conv_transpose1d", "F.conv_transpose2d", "F.conv_transpose3d"}
LINEAR = {"nn.Linear", "F.linear"}
MATMUL = {"torch.matmul", "torch.mm", "torch.bmm", "Tensor.matmul"}


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def flops(op: RuntimeOperator, input_shapes: Sequence[Shape], output_shapes: Sequence[Shape]
          ) -> int | None:
    """FLOPs of one run of ``op`` (formulas in the module docstring); None for other types."""
    def weight_and_bias() -> tuple[Shape, bool]:
        if "weight" in op.attrs:                      # nn.*: weights from the bin file
            return tuple(op.attrs["weight"].shape), "bias" in op.attrs
        return tuple(input_shapes[1]), len(input_shapes) > 2    # F.*: weights are inputs

    if not output_shapes:
        return None
    out = _size(output_shapes[0])
    if op.type in CONVOLUTIONS:
        weight, bias = weight_and_bias()
        return 2 * out * _size(weight[1:]) + (out if bias else 0)
    if op.type in TRANSPOSED:                         # each input element scatters a kernel
        weight, bias = weight_and_bias()              # (C_in, C_out/groups, kH, kW)
        return 2 * _size(input_shapes[0]) * _size(weight[1:]) + (out if bias else 0)
    if op.type in LINEAR:
        weight, bias = weight_and_bias()              # (out_features, in_features)
        return 2 * out * weight[-1] + (out if bias else 0)
    if op.type in MATMUL and len(input_shapes) >= 2 and input_shapes[0]:
        return 2 * out * input_shapes[0][-1]
    return None


@dataclass
class OperatorTime:
    """One operator's line of the profile."""

    index: int
    operator: RuntimeOperator
    seconds: float                   # median over the timed runs
    output_bytes: int
    output_shapes: list[Shape]
    flops: int | None
    input_shapes: list[Shape] = field(default_factory=list)
    again_seconds: float | None = None   # median of calling it again at once (again=True)

    @property
    def gflops_per_second(self) -> float | None:
        if self.flops is None or self.seconds <= 0:
            return None
        return self.flops / self.seconds / 1e9


@dataclass
class Profile:
    """The timed operators, in run order, and the median time of a whole pass."""

    rows: list[OperatorTime]
    repeat: int
    wall_seconds: float              # median time of a whole instrumented pass

    @property
    def total_seconds(self) -> float:
        """The sum of the operators' times."""
        return sum(r.seconds for r in self.rows)

    @property
    def total_flops(self) -> int:
        return sum(r.flops or 0 for r in self.rows)

    @property
    def again_seconds(self) -> float | None:
        """The sum of the operators' times called again at once (None: not measured)."""
        if any(r.again_seconds is None for r in self.rows):
            return None
        return sum(r.again_seconds or 0.0 for r in self.rows)

    def share(self, row: OperatorTime) -> float:
        total = self.total_seconds
        return row.seconds / total if total > 0 else 0.0

    def table(self, sort: str | None = None, top: int | None = None) -> Table:
        """One row per operator; ``sort`` by "time", "bytes" or "flops" (largest first), or
        None for run order; ``top`` keeps the first rows."""
        again = self.again_seconds is not None
        rows = [[r.index, r.operator.type, r.operator.name,
                 " ".join(fmt_shape(s) for s in r.output_shapes), r.seconds * 1e3,
                 *([(r.again_seconds or 0.0) * 1e3] if again else []),
                 100 * self.share(r), r.output_bytes, r.flops, r.gflops_per_second]
                for r in self.rows]
        table = Table(["#", "type", "name", "output", "ms", *(["again ms"] if again else []),
                       "%", "bytes", "FLOPs", "GFLOP/s"],
                      rows, title=self._title(), footer=self._footer(),
                      formats=_FORMATS)
        key = {"time": "ms", "bytes": "bytes", "flops": "FLOPs", None: None}.get(sort, "?")
        if key == "?":
            raise GraphError(f"sort by 'time', 'bytes' or 'flops' (or None), not {sort!r}")
        if key is not None:
            table = table.sorted(key)
        return table.head(top) if top is not None else table

    def by_type(self, sort: str = "time") -> Table:
        """One row per operator type: how many, their time, share, bytes and FLOPs."""
        groups: dict[str, list[OperatorTime]] = {}
        for r in self.rows:
            groups.setdefault(r.operator.type, []).append(r)
        again = self.again_seconds is not None
        rows = []
        for type_name, members in groups.items():
            seconds = sum(m.seconds for m in members)
            counted = [m.flops for m in members if m.flops is not None]
            rows.append([type_name, len(members), seconds * 1e3,
                         *([sum(m.again_seconds or 0.0 for m in members) * 1e3] if again
                           else []),
                         100 * seconds / self.total_seconds if self.total_seconds else 0.0,
                         sum(m.output_bytes for m in members),
                         sum(counted) if counted else None])
        table = Table(["type", "count", "ms", *(["again ms"] if again else []), "%", "bytes",
                       "FLOPs"], rows,
                      title=self._title() + ", by type", footer=self._footer(),
                      formats=_FORMATS)
        return table.sorted({"time": "ms", "bytes": "bytes", "flops": "FLOPs"}[sort])

    def _title(self) -> str:
        return f"profile: median of {self.repeat} run(s)"

    def _footer(self) -> str:
        total, again = self.total_seconds, self.again_seconds
        rate = f", {self.total_flops / total / 1e9:.2f} GFLOP/s" if total > 0 else ""
        called_again = ("" if again is None
                        else f"; called again at once {again * 1e3:.3f} ms")
        return (f"total {total * 1e3:.3f} ms in {len(self.rows)} operators "
                f"(whole pass {self.wall_seconds * 1e3:.3f} ms), "
                f"{fmt_count(self.total_flops)} FLOPs{rate}{called_again}")

    def __str__(self) -> str:
        return str(self.table())

    def __repr__(self) -> str:
        return f"<Profile {self._footer()}>"

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


_FORMATS = {
    "ms": lambda v: f"{v:.3f}", "again ms": lambda v: f"{v:.3f}", "%": lambda v: f"{v:.1f}",
    "bytes": fmt_bytes, "FLOPs": fmt_count, "GFLOP/s": lambda v: f"{v:.2f}"}


def _background_packings_made() -> None:
    """Wait for the weights the fast backend packs in the background (large panels of a
    size first met in a forward: layers/fast/algorithms.py), so that the timed runs are
    the steady ones (nothing to wait for where the fast backend was never loaded); a
    warning if they are still being made after conv.PACKINGS_WAIT_S seconds."""
    conv = sys.modules.get("layers.fast.conv")
    if conv is not None and not conv.background_packings_made():
        log.warning("profile: weights still being packed in the background after %.0f s; "
                    "the timed passes may run the product that serves until they are",
                    conv.PACKINGS_WAIT_S)


def profile(graph: "RuntimeGraph", *inputs: np.ndarray, repeat: int = 5, warmup: int = 1,
            again: bool = False) -> Profile:
    """Run the graph ``warmup`` times, each pass as a forward without hooks, wait for the
    weights those passes had packed in the background, then ``repeat`` times timing every
    operator; with ``again``, each also called again at once (see the module). Called
    inside ``graph.running()`` on the same thread, the packings wait for that to end."""
    if repeat < 1 or warmup < 0:
        raise GraphError(f"profile needs repeat >= 1 and warmup >= 0, got {repeat}, {warmup}")
    graph.reach_fast_floor()                     # as forward does first
    times: list[list[float]] = []
    again_times: list[list[float]] = []
    walls: list[float] = []
    last: list[tuple] = []
    for _ in range(warmup):                      # each as a forward: what it asks to have
        with graph.running():                    # packed in the background is asked for
            graph.execute(*inputs, hooks=False).run_all()   # when it ends ...
    _background_packings_made()                  # ... and made before the timed runs
    with graph.running():
        for _ in range(repeat):
            steps: list[tuple] = []
            seconds_again: list[float] = []
            run = graph.execute(*inputs, hooks=False, timed=True)
            start = time.perf_counter()
            for step, xs, ys, seconds in run:      # shapes now: the buffers are reused
                steps.append((step.op, [tuple(np.shape(x)) for x in xs],
                              [tuple(np.shape(y)) for y in ys],
                              sum(int(getattr(y, "nbytes", 0)) for y in ys), seconds))
                if again:
                    seconds_again.append(run.time_again(step, xs, ys))
                del xs, ys                         # held, they would outlive their step
            wall = time.perf_counter() - start - sum(seconds_again)   # forward's own
            times.append([s[-1] for s in steps])
            again_times.append(seconds_again)
            walls.append(wall)
            last = steps
    rows = []
    for i, (op, in_shapes, out_shapes, nbytes, _) in enumerate(last):
        rows.append(OperatorTime(
            index=i + 1, operator=op, seconds=statistics.median(t[i] for t in times),
            output_bytes=nbytes, output_shapes=out_shapes,
            flops=flops(op, in_shapes, out_shapes), input_shapes=in_shapes,
            again_seconds=statistics.median(t[i] for t in again_times) if again else None))
    return Profile(rows, repeat, statistics.median(walls))
