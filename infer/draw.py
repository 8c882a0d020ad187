"""Seeing a graph: a drawing (SVG) and a summary table.

    g.draw()                      # operators as boxes: type, name, and each output operand with
                                  # its shape; arrows from producer to consumer (SVG in Jupyter)
    g.draw((1, 3, 224, 224))      # the shapes for this input size
    g.draw().save("graph.svg")
    dbg.draw()                    # in a debug session: the current operator highlighted,
                                  # the ones that ran shaded
    g.summary()                   # the same graph as a table, one row per operator

Two layout engines draw the same boxes:

* ``dot`` (Graphviz) when the ``dot`` program is on the PATH (Debian: ``apt-get install
  graphviz``). The DOT text is written here and piped to ``dot -Tsvg``, so no Python package is
  needed. Its layout is the better one for large graphs.
* ``builtin``, a small layered layout in pure Python, used otherwise, so a drawing always works.
  Operators are put in rows by their longest path from an input (a Sugiyama-style layering);
  an edge that spans several rows gets a waypoint in each, so it is routed beside the boxes;
  a few barycentre sweeps order each row to reduce crossings.

``engine="auto"`` (the default) picks ``dot`` if present, else ``builtin``.
"""

from __future__ import annotations

import html
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from infer.table import Table, fmt_bytes, fmt_shape
from parser.errors import GraphError
from parser.suggest import close_matches

if TYPE_CHECKING:
    from infer.graph import RuntimeGraph
    from infer.runtime import RuntimeOperator

log = logging.getLogger(__name__)

HIGHLIGHT = "#ffcc4d"      # the current operator
DONE = "#dff0d8"           # operators that ran
IO_FILL = "#e8eef7"        # pnnx.Input / pnnx.Output
PLAIN = "#ffffff"
FONT_SIZE = 12
CHAR_WIDTH = 7.3           # px per character of the monospace font at FONT_SIZE
LINE_HEIGHT = 15
PAD = 8                    # px around the text in a box
ROW_GAP = 36               # px between rows
COLUMN_GAP = 24            # px between boxes in a row
MAX_LABEL = 48             # characters shown per line


# ----------------------------------------------------------------------------- node labels
def node_lines(op: "RuntimeOperator", shapes: Mapping[str, tuple] | None) -> list[str]:
    """The text of a box: type, name, then ``name (shape)`` per output operand."""
    lines = [op.type, op.name]
    fused = getattr(op, "fused", None)
    if fused:
        lines.append("+ " + ", ".join(map(str, fused)))
    for out in op.outputs:
        shape = shapes.get(out.name) if shapes else out.shape
        lines.append(f"{out.name}: {fmt_shape(shape)}")
    return [_clip(line) for line in lines]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 3] + "..."


def _edges(graph: "RuntimeGraph") -> list[tuple["RuntimeOperator", "RuntimeOperator"]]:
    """(producer, consumer) pairs, once per pair, in run order."""
    seen, edges = set(), []
    for op in graph.operators:
        for src in op.inputs:
            key = (id(src.producer), id(op))
            if src.producer is not None and key not in seen:
                seen.add(key)
                edges.append((src.producer, op))
    return edges


def _fill(op: "RuntimeOperator", highlight: str | None, done: set[str],
          colours: Mapping[str, str]) -> str:
    if op.name == highlight:
        return HIGHLIGHT
    if op.name in colours:
        return colours[op.name]
    if op.name in done:
        return DONE
    if op.type in ("pnnx.Input", "pnnx.Output"):
        return IO_FILL
    return PLAIN


# ----------------------------------------------------------------------------- the drawing
@dataclass
class Drawing:
    """A drawn graph: ``svg`` text (shown by Jupyter), the ``dot_source`` it corresponds to,
    and which ``engine`` laid it out."""

    svg: str
    dot_source: str
    engine: str

    def _repr_svg_(self) -> str:
        return self.svg

    def save(self, path: str | Path) -> Path:
        """Write the SVG (or, for a ``.dot`` / ``.gv`` path, the DOT text)."""
        path = Path(path)
        text = self.dot_source if path.suffix in (".dot", ".gv") else self.svg
        path.write_text(text, encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"<Drawing by {self.engine}: {len(self.svg)} characters of SVG>"


def draw_graph(graph: "RuntimeGraph", *, shapes: Mapping[str, tuple] | None = None,
               highlight: str | None = None, done: Iterable[str] = (),
               colours: Mapping[str, str] | None = None, engine: str = "auto") -> Drawing:
    """Draw ``graph``: ``highlight`` one operator (by name), shade the ``done`` ones, fill
    others by ``colours`` (operator name -> CSS colour). See the module for the engines."""
    if not graph.operators:
        raise GraphError("the graph has no operators yet: call init() or build() first")
    if engine not in ("auto", "dot", "builtin"):
        raise GraphError(f"engine must be 'auto', 'dot' or 'builtin', not {engine!r}")
    highlight = _operator_named(graph, highlight)
    done, colours = set(done), dict(colours or {})
    fills = {op.name: _fill(op, highlight, done, colours) for op in graph.operators}
    labels = {op.name: node_lines(op, shapes) for op in graph.operators}
    source = dot_source(graph, labels, fills)
    if engine in ("auto", "dot"):
        if shutil.which("dot"):
            try:
                return Drawing(_run_dot(source), source, "dot")
            except (OSError, subprocess.SubprocessError) as exc:
                if engine == "dot":
                    raise GraphError(f"the dot program failed: {exc}") from exc
                log.warning("dot failed (%s); using the built-in layout", exc)
        elif engine == "dot":
            raise GraphError("engine='dot' needs the Graphviz 'dot' program on the PATH "
                             "(apt-get install graphviz); engine='builtin' needs nothing")
    return Drawing(builtin_svg(graph, labels, fills), source, "builtin")


def _operator_named(graph: "RuntimeGraph", name: str | None) -> str | None:
    """The name of the operator to highlight: ``name`` itself, or the operator fusion folded
    it into; an unknown name is an error (a drawing that silently highlights nothing would
    mislead)."""
    if name is None or any(op.name == name for op in graph.operators):
        return name
    for op in graph.operators:
        if name in op.fused:
            return op.name
    close = close_matches(str(name), [op.name for op in graph.operators], n=3)
    hint = f"; close: {', '.join(close)}" if close else ""
    raise GraphError(f"highlight={name!r}: no operator of that name in this graph{hint}")


def dot_source(graph: "RuntimeGraph", labels: Mapping[str, list[str]],
               fills: Mapping[str, str]) -> str:
    """The graph in Graphviz's DOT language: one box per operator, one arrow per edge."""
    def quote(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    ids = {id(op): f"n{i}" for i, op in enumerate(graph.operators)}
    lines = ["digraph pnnx {", "  rankdir=TB;",
             f'  node [shape=box, style="rounded,filled", fontname="monospace", '
             f'fontsize={FONT_SIZE}];', '  edge [arrowsize=0.6];']
    for op in graph.operators:
        label = "\\n".join(quote(line)[1:-1] for line in labels[op.name])
        lines.append(f'  {ids[id(op)]} [label="{label}", fillcolor={quote(fills[op.name])}, '
                     f'tooltip={quote(op.label)}];')
    for producer, consumer in _edges(graph):
        lines.append(f"  {ids[id(producer)]} -> {ids[id(consumer)]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _run_dot(source: str) -> str:
    result = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True,
                            timeout=60, check=True)
    svg = result.stdout
    return svg[svg.index("<svg"):] if "<svg" in svg else svg   # drop the XML prolog


# ----------------------------------------------------------------------------- built-in layout
@dataclass
class _Node:
    key: object                 # an operator, or (edge index, row) for an edge waypoint
    row: int
    width: float
    height: float
    x: float = 0.0              # centre
    y: float = 0.0              # top


def builtin_svg(graph: "RuntimeGraph", labels: Mapping[str, list[str]],
                fills: Mapping[str, str]) -> str:
    """Lay the graph out in rows (see the module docstring) and write the SVG."""
    ops = graph.operators
    row: dict[int, int] = {}
    for op in ops:                                  # run order: producers come first
        rows_in = [row[id(src.producer)] for src in op.inputs if id(src.producer) in row]
        row[id(op)] = 1 + max(rows_in) if rows_in else 0

    nodes: dict[object, _Node] = {}
    for op in ops:
        lines = labels[op.name]
        width = max(len(line) for line in lines) * CHAR_WIDTH + 2 * PAD
        nodes[id(op)] = _Node(op, row[id(op)], width, len(lines) * LINE_HEIGHT + 2 * PAD)
    paths: list[list[object]] = []                  # node keys along each edge
    for index, (producer, consumer) in enumerate(_edges(graph)):
        path: list[object] = [id(producer)]
        for r in range(row[id(producer)] + 1, row[id(consumer)]):
            key = (index, r)
            nodes[key] = _Node(key, r, 4.0, 0.0)
            path.append(key)
        path.append(id(consumer))
        paths.append(path)

    n_rows = max(row.values()) + 1
    rows: list[list[object]] = [[] for _ in range(n_rows)]
    for key, node in nodes.items():
        rows[node.row].append(key)
    above: dict[object, list[object]] = {k: [] for k in nodes}
    below: dict[object, list[object]] = {k: [] for k in nodes}
    for path in paths:
        for a, b in zip(path, path[1:]):
            below[a].append(b)
            above[b].append(a)

    _order_rows(rows, above, below)
    _place(rows, nodes, above)
    return _svg(graph, nodes, paths, labels, fills)


def _order_rows(rows: list[list[object]], above: dict, below: dict, sweeps: int = 4) -> None:
    """Barycentre heuristic: sort each row by the mean position of its neighbours in the row
    above (downward sweeps) or below (upward sweeps)."""
    for _ in range(sweeps):
        for r in range(1, len(rows)):
            rows[r] = _by_barycentre(rows[r], rows[r - 1], above)
        for r in range(len(rows) - 2, -1, -1):
            rows[r] = _by_barycentre(rows[r], rows[r + 1], below)


def _by_barycentre(keys: list[object], reference: list[object], neighbours: dict
                   ) -> list[object]:
    position = {k: i for i, k in enumerate(reference)}

    def centre(i: int) -> float:
        linked = [position[n] for n in neighbours[keys[i]] if n in position]
        return sum(linked) / len(linked) if linked else float(i)

    return [keys[i] for i in sorted(range(len(keys)), key=lambda i: (centre(i), i))]


def _place(rows: list[list[object]], nodes: dict, above: dict) -> None:
    """x: each box as near the mean x of its neighbours above as its row allows (boxes are
    pushed right, never overlapping); y: one row after the other."""
    y = float(PAD)
    for keys in rows:
        right = None                                # right edge of the last box placed
        for key in keys:
            node = nodes[key]
            linked = [nodes[n].x for n in above[key]]
            want = sum(linked) / len(linked) - node.width / 2 if linked else None
            if right is None:
                left = want if want is not None else 0.0
            else:
                left = right + COLUMN_GAP if want is None else max(right + COLUMN_GAP, want)
            node.x = left + node.width / 2
            right = left + node.width
        height = max(nodes[k].height for k in keys) if keys else 0.0
        for key in keys:
            nodes[key].y = y + (height - nodes[key].height) / 2
        y += height + ROW_GAP
    shift = PAD - min(n.x - n.width / 2 for n in nodes.values())
    for node in nodes.values():
        node.x += shift


def _svg(graph, nodes: dict, paths: list[list[object]], labels, fills) -> str:
    width = max(n.x + n.width / 2 for n in nodes.values()) + PAD
    height = max(n.y + n.height for n in nodes.values()) + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'font-family="monospace" font-size="{FONT_SIZE}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#555"/></marker></defs>']
    for path in paths:
        points = [(nodes[path[0]].x, nodes[path[0]].y + nodes[path[0]].height)]
        points += [(nodes[k].x, nodes[k].y) for k in path[1:-1]]
        points.append((nodes[path[-1]].x, nodes[path[-1]].y))
        d = f"M{points[0][0]:.1f},{points[0][1]:.1f}"
        for (x1, y1), (x2, y2) in zip(points, points[1:]):
            mid = (y1 + y2) / 2
            d += f" C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
        out.append(f'<path d="{d}" fill="none" stroke="#555" stroke-width="1.2" '
                   f'marker-end="url(#arrow)"/>')
    for op in graph.operators:
        node = nodes[id(op)]
        left = node.x - node.width / 2
        out.append(f'<g class="node" id="{html.escape(op.name, quote=True)}">'
                   f'<title>{html.escape(op.label)}</title>'
                   f'<rect x="{left:.1f}" y="{node.y:.1f}" width="{node.width:.1f}" '
                   f'height="{node.height:.1f}" rx="6" fill="{fills[op.name]}" '
                   f'stroke="#333"/>')
        for i, line in enumerate(labels[op.name]):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append(f'<text x="{node.x:.1f}" y="{node.y + PAD + (i + 0.8) * LINE_HEIGHT:.1f}"'
                       f' text-anchor="middle"{weight}>{html.escape(line)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- tables, HTML
def summary_table(graph: "RuntimeGraph", shapes: Mapping[str, tuple] | None = None) -> Table:
    """One row per operator in run order: type, name, inputs, outputs (with shapes),
    parameters, weights (and what was fused into it, where a rewrite did so)."""
    rows = []
    any_fused = any(getattr(op, "fused", None) for op in graph.operators)
    for i, op in enumerate(graph.operators):
        outs = ", ".join(f"{o.name} {fmt_shape(shapes.get(o.name) if shapes else o.shape)}"
                         for o in op.outputs)
        params = " ".join(f"{k}={_short(p.value)}" for k, p in op.params.items())
        weights = sum(a.nbytes if a.data is not None else 0 for a in op.attrs.values())
        row = [i + 1, op.type, op.name, ", ".join(o.name for o in op.inputs), outs,
               _clip(params), fmt_bytes(weights) if op.attrs else ""]
        if any_fused:
            row.append(", ".join(map(str, getattr(op, "fused", None) or [])))
        rows.append(row)
    columns = ["#", "type", "name", "inputs", "outputs", "params", "weights"]
    if any_fused:
        columns.append("fused")
    return Table(columns, rows, title=repr(graph))


def _short(value) -> str:
    text = repr(value).replace(" ", "")
    return text if len(text) <= 24 else text[:21] + "..."


def graph_html(graph: "RuntimeGraph", max_rows: int = 60) -> str:
    """What a RuntimeGraph shows in Jupyter: its file, state, inputs, outputs, operator types
    and the summary table (its first ``max_rows`` rows)."""
    from collections import Counter

    esc = html.escape
    head = [f"<b style='font-family:monospace'>{esc(repr(graph))}</b>"]
    if graph.operators:
        ins = ", ".join(f"{op.outputs[0].name} {fmt_shape(op.outputs[0].shape)}"
                        for op in graph.input_operators)
        outs = ", ".join(f"{o.name} {fmt_shape(o.shape)}" for o in graph.output_operands)
        types = Counter(op.type for op in graph.operators)
        counts = ", ".join(f"{t} x{n}" for t, n in types.most_common())
        head.append(f"<div>inputs: <code>{esc(ins)}</code>; outputs: <code>{esc(outs)}</code>"
                    f"</div><div>operator types: {esc(counts)}</div>")
        head.append(summary_table(graph).head(max_rows)._repr_html_())
    return "<div>" + "".join(head) + "</div>"
