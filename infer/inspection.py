"""Looking at arrays and graph objects: statistics of an array, HTML cards for Jupyter.

    stats = ArrayStats.of(array, "conv1_out")
    print(stats)    # conv1_out (1,8,8,8) float32  min -1.2  max 3.4  mean 0.1  std 0.9 ...

min / max / mean / std are taken over the finite values only, so one NaN does not hide the
rest; the NaN and Inf counts say how many were left out. ``operator_html`` and
``operand_html`` are what a RuntimeOperator and a RuntimeOperand show in a notebook.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infer.table import Table, fmt_bytes, fmt_shape

if TYPE_CHECKING:
    from infer.runtime import RuntimeOperand, RuntimeOperator

SHOWN_VALUES = 6        # how many leading values a summary shows


@dataclass
class ArrayStats:
    """What one array holds, in numbers a person can read."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    size: int
    nbytes: int
    min: float | None          # over the finite values; None when there are none
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    values: list[Any]          # the first few values, in C order

    @classmethod
    def of(cls, array: np.ndarray, name: str = "", count: int = SHOWN_VALUES) -> "ArrayStats":
        a = np.asarray(array)
        nan = inf = 0
        finite = a
        if a.dtype.kind in "fc":
            nan = int(np.isnan(a).sum())
            inf = int(np.isinf(a).sum())
            if nan or inf:
                finite = a[np.isfinite(a)]
        numbers = a.dtype.kind in "fiub" and finite.size > 0
        view = finite.astype(np.float64) if numbers and a.dtype.kind == "b" else finite
        return cls(
            name=name, shape=tuple(a.shape), dtype=str(a.dtype), size=int(a.size),
            nbytes=int(a.nbytes),
            min=float(view.min()) if numbers else None,
            max=float(view.max()) if numbers else None,
            mean=float(view.mean(dtype=np.float64)) if numbers else None,
            std=float(view.std(dtype=np.float64)) if numbers else None,
            nan=nan, inf=inf, values=a.ravel()[:count].tolist())

    @property
    def finite(self) -> bool:
        """True when the array holds no NaN and no Inf."""
        return self.nan == 0 and self.inf == 0

    def fields(self) -> dict[str, str]:
        """The statistics as text, one entry per field."""
        return {
            "shape": fmt_shape(self.shape), "dtype": self.dtype,
            "min": _num(self.min), "max": _num(self.max), "mean": _num(self.mean),
            "std": _num(self.std), "nan": str(self.nan), "inf": str(self.inf),
            "values": _values(self.values, self.size)}

    def __str__(self) -> str:
        f = self.fields()
        flags = "" if self.finite else f"  NaN {self.nan}  Inf {self.inf}"
        return (f"{self.name} {f['shape']} {f['dtype']}  min {f['min']}  max {f['max']}  "
                f"mean {f['mean']}  std {f['std']}{flags}  {f['values']}").strip()

    def _repr_html_(self) -> str:
        return stats_table([self])._repr_html_()


def stats_table(stats: list[ArrayStats], title: str = "", marked: set[int] | None = None
                ) -> Table:
    """One row per array: name, shape, dtype, min, max, mean, std, NaN, Inf, first values."""
    columns = ["operand", "shape", "dtype", "min", "max", "mean", "std", "nan", "inf", "values"]
    rows = []
    for s in stats:
        f = s.fields()
        rows.append([s.name, f["shape"], s.dtype, f["min"], f["max"], f["mean"], f["std"],
                     s.nan, s.inf, f["values"]])
    bad = {i for i, s in enumerate(stats) if not s.finite}
    return Table(columns, rows, title=title, marked=bad | (marked or set()))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _values(values: list[Any], size: int) -> str:
    shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values)
    return f"[{shown}{', ...' if size > len(values) else ''}]"


# ----- HTML cards for the graph objects -------------------------------------------------------

def _card(title: str, rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th style='text-align:left;vertical-align:top'>{html.escape(k)}</th>"
                   f"<td style='text-align:left;font-family:monospace'>{v}</td></tr>"
                   for k, v in rows)
    return (f"<div><b style='font-family:monospace'>{html.escape(title)}</b>"
            f"<table>{body}</table></div>")


def _operand_line(o: "RuntimeOperand") -> str:
    return html.escape(f"{o.name} {fmt_shape(o.shape)}{o.dtype or ''}")


def operator_html(op: "RuntimeOperator") -> str:
    """A card for one operator: its operands, parameters, weights and layer."""
    rows = [("type", html.escape(op.type)), ("line", str(op.line))]
    rows.append(("inputs", "<br>".join(
        _operand_line(o) + html.escape(f"  <- {o.producer.name}" if o.producer else "")
        for o in op.inputs) or "-"))
    rows.append(("outputs", "<br>".join(
        _operand_line(o) + html.escape(
            f"  -> {', '.join(c.name for c in o.consumers)}" if o.consumers else "")
        for o in op.outputs) or "-"))
    if op.params:
        rows.append(("params", "<br>".join(html.escape(f"{k}={p.value!r}")
                                           for k, p in op.params.items())))
    if op.attrs:
        rows.append(("weights", "<br>".join(
            html.escape(f"@{k} {fmt_shape(a.shape)}{a.dtype}"
                        + (f" {fmt_bytes(a.nbytes)}" if a.data is not None else ""))
            for k, a in op.attrs.items())))
    fused = getattr(op, "fused", None)
    if fused:
        rows.append(("fused", html.escape(", ".join(map(str, fused)))))
    if op.layer is not None:
        rows.append(("layer", html.escape(repr(op.layer))))
    return _card(f"{op.type} {op.name}", rows)


def operand_html(operand: "RuntimeOperand") -> str:
    """A card for one operand: shape, dtype, who makes it and who reads it."""
    rows = [("shape", html.escape(fmt_shape(operand.shape))),
            ("dtype", html.escape(operand.dtype or "?")),
            ("producer", html.escape(operand.producer.label if operand.producer else "-")),
            ("consumers", "<br>".join(html.escape(c.label) for c in operand.consumers) or "-")]
    return _card(f"operand {operand.name}", rows)
