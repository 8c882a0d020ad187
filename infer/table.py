"""A small table that prints as aligned text and shows as HTML in Jupyter.

The debugging tools (the summary, the profile, the comparison with torch) all answer with one:

    t = Table(["op", "ms"], [["conv1", 1.25], ["relu", 0.03]], title="profile")
    print(t)                 # aligned text; numbers right-aligned
    t.sorted("ms")           # a new table, largest first
    t                        # in Jupyter: an HTML table (marked rows tinted)

Cells keep their raw values (so sorting works on numbers); ``formats`` maps a column to the
function that turns its values into text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

MARK_COLOUR = "#ffd7d7"          # background of marked rows (a failing comparison, the current op)


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    title: str = ""
    formats: dict[str, Callable[[Any], str]] = field(default_factory=dict)
    marked: set[int] = field(default_factory=set)     # row indices shown highlighted
    footer: str = ""

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[Any]:
        """The raw values of one column."""
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def records(self) -> list[dict[str, Any]]:
        """The rows as dictionaries (column -> raw value)."""
        return [dict(zip(self.columns, row)) for row in self.rows]

    def sorted(self, by: str, descending: bool = True) -> "Table":
        """A copy ordered by column ``by`` (largest first by default; None values last)."""
        index = self.columns.index(by)
        present = [i for i, row in enumerate(self.rows) if row[index] is not None]
        missing = [i for i, row in enumerate(self.rows) if row[index] is None]
        present.sort(key=lambda i: self.rows[i][index], reverse=descending)
        order = present + missing
        position = {old: new for new, old in enumerate(order)}
        return replace(self, rows=[self.rows[i] for i in order],
                       marked={position[i] for i in self.marked})

    def head(self, n: int) -> "Table":
        """The first ``n`` rows."""
        more = len(self.rows) - n
        footer = self.footer if more <= 0 else f"... {more} more rows. {self.footer}".strip()
        return replace(self, rows=self.rows[:n], marked={i for i in self.marked if i < n},
                       footer=footer)

    # ------------------------------------------------------------------ text
    def cell(self, column: str, value: Any) -> str:
        if value is None:
            return ""
        fmt = self.formats.get(column)
        if fmt is not None:
            return fmt(value)
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    def text_rows(self) -> list[list[str]]:
        return [[self.cell(c, v) for c, v in zip(self.columns, row)] for row in self.rows]

    def __str__(self) -> str:
        cells = self.text_rows()
        widths = [max([len(c)] + [len(row[i]) for row in cells])
                  for i, c in enumerate(self.columns)]
        numeric = [_is_numeric(self.column(c)) for c in self.columns]

        def line(values: Sequence[str], mark: str = " ") -> str:
            parts = [v.rjust(w) if num else v.ljust(w)
                     for v, w, num in zip(values, widths, numeric)]
            return (mark + " " + "  ".join(parts)).rstrip()

        out = [self.title] if self.title else []
        out.append(line(self.columns))
        out.append("  " + "  ".join("-" * w for w in widths))
        out += [line(row, "*" if i in self.marked else " ") for i, row in enumerate(cells)]
        if self.footer:
            out.append(self.footer)
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    # ------------------------------------------------------------------ HTML
    def _repr_html_(self) -> str:
        cells = self.text_rows()
        numeric = [_is_numeric(self.column(c)) for c in self.columns]
        head = "".join(f"<th style='text-align:{'right' if n else 'left'}'>{html.escape(c)}</th>"
                       for c, n in zip(self.columns, numeric))
        body = []
        for i, row in enumerate(cells):
            style = f" style='background:{MARK_COLOUR}'" if i in self.marked else ""
            tds = "".join(
                f"<td style='text-align:{'right' if n else 'left'};font-family:monospace'>"
                f"{html.escape(v)}</td>" for v, n in zip(row, numeric))
            body.append(f"<tr{style}>{tds}</tr>")
        title = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        footer = f"<div>{html.escape(self.footer)}</div>" if self.footer else ""
        return (f"<div>{title}<table><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>{footer}</div>")


def _is_numeric(values: list[Any]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                 for v in present)


# ----- formatters shared by the tools ----------------------------------------------------------

def fmt_shape(shape) -> str:
    """(1, 3, 224, 224) -> '(1,3,224,224)'; None dims -> '?'; None -> '?'."""
    if shape is None:
        return "?"
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def fmt_count(n: float) -> str:
    """A large count with an SI prefix: 1.2e9 -> '1.2G'."""
    value = float(n)
    for unit in ("", "K", "M", "G", "T"):
        if abs(value) < 1000 or unit == "T":
            return f"{value:.0f}" if unit == "" else f"{value:.3g}{unit}"
        value /= 1000
    return f"{value:.3g}T"
