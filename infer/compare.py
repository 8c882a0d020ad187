"""Compare a graph with PyTorch, operator by operator, and find where they part.

    report = g.compare_with_torch(x)                    # the *_pnnx.py beside the param file
    report = g.compare_with_torch(x, reference=model)   # or the torch module it came from
    report                 # headline + one row per compared operand (HTML in Jupyter)
    report.first_bad       # the first operator (in run order) whose output departs from torch
    report.culprit         # the first that departs even when fed torch's own inputs
    report.worst("act")    # the largest differences of one operand, index by index

Where torch's values come from:

* pnnx's ``*_pnnx.py``, which pnnx writes beside the .pnnx.param (``export_module(...,
  keep_extras=True)`` keeps it). Its ``forward`` has one line per operator and each local
  ``v_<operand>`` holds the operand of that name in the param file (``.`` and other non-word
  characters become ``_``). The forward is rewritten (through its syntax tree) to record every
  such local after its line, and run with the weights read from the graph's own .pnnx.bin.
  Every operand is compared: the most faithful route.
* The torch module the files came from. Forward hooks record each submodule's output; an
  operator named like a submodule (pnnx keeps module paths such as ``layer1.0.conv1``) is
  compared with it, on a module's first call (pnnx renames later calls). Operators pnnx made
  or renamed (F.* calls, expressions, a conv fused with its batch norm) have no torch twin and
  are skipped, and so is an operator another rewrite fused others into (its output is no
  longer its module's); the graph outputs are always compared.

Operands present on one side only (a graph another rewrite has fused) are skipped, not failed.

Tolerance: an element is bad when ``|ours - torch| > atol + rtol * |torch|`` (numpy.isclose;
a NaN matches only a NaN). Per operand: max |diff|; "rel", max |diff| / max |torch| (the error
relative to the operand's scale); how many elements are bad; the first bad index with both
values there; and "local", the max |diff| when our layer is fed torch's own inputs, so no error
comes in from upstream. ``first_bad`` says where the outputs start to depart; ``culprit`` is
the operator to look at: after it, errors may only be carried along.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from infer.debug import call_layer
from infer.runtime import RuntimeOperator
from infer.table import Table, fmt_shape
from parser.errors import GraphError, InferError

if TYPE_CHECKING:
    from infer.graph import RuntimeGraph

RECORDER = "__pnnx_infer_record__"


# ----------------------------------------------------------------------------- torch's side
def pnnx_py_path(graph: "RuntimeGraph") -> Path:
    """Where pnnx writes the python module for ``name.pnnx.param``: ``name_pnnx.py``."""
    param = Path(graph.param_path)
    stem = param.name[:-len(".pnnx.param")] if param.name.endswith(".pnnx.param") else param.stem
    return param.with_name(f"{stem}_pnnx.py")


def python_name(operand: str) -> str:
    """The local variable pnnx's python module holds an operand in: ``v_`` + its name with
    every non-word character made ``_``."""
    return "v_" + re.sub(r"\W", "_", operand)


def record_pnnx_forward(source: str) -> ast.Module:
    """The syntax tree of a ``*_pnnx.py`` whose ``Model.forward`` calls ``RECORDER(name,
    value)`` after each assignment, for every name it assigns."""
    tree = ast.parse(source)
    forwards = [f for c in tree.body if isinstance(c, ast.ClassDef)
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"]
    if not forwards:
        raise GraphError("the pnnx python module has no class with a forward method")
    forward = forwards[0]
    body: list[ast.stmt] = []
    for arg in forward.args.args[1:]:              # the inputs (v_0, ...), past self
        body.append(_record_call(arg.arg))
    for stmt in forward.body:
        body.append(stmt)
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for name in _assigned_names(target):
                    body.append(_record_call(name))
    forward.body = body
    return ast.fix_missing_locations(tree)


def _assigned_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _assigned_names(element)]
    return []


def _record_call(name: str) -> ast.stmt:
    return ast.Expr(ast.Call(ast.Name(RECORDER, ast.Load()),
                             [ast.Constant(name), ast.Name(name, ast.Load())], []))


def torch_values_from_pnnx_py(path: str | Path, bin_path: str | Path,
                              inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Run pnnx's python module on ``inputs`` (weights from ``bin_path``); every tensor local
    of its forward, by variable name (``v_12``)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise GraphError(f"no pnnx python module {path}: export with `python -m infer export "
                         f"... --keep-extras` (or export_module(..., keep_extras=True)), which "
                         f"keeps it beside the param file, or pass the torch module")
    source = path.read_text(encoding="utf-8")
    # pnnx wrote the path its .bin had during export; read the graph's own instead
    source = re.sub(r"zipfile\.ZipFile\((['\"]).*?\1",
                    lambda m: f"zipfile.ZipFile({str(bin_path)!r}", source)
    # an nn.Sequential's children become ``self.0 = ...``, which is no Python: ``self.m_0``
    source = re.sub(r"\bself\.(\d\w*)", r"self.m_\1", source)
    try:
        tree = record_pnnx_forward(source)
    except SyntaxError as exc:
        raise GraphError(f"the pnnx python module {path} is not valid Python (line "
                         f"{exc.lineno}: {exc.msg}); pass the torch module as reference= "
                         f"instead") from None
    recorded: dict[str, np.ndarray] = {}

    def record(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            recorded[name] = value.detach().cpu().clone().numpy()

    namespace = {"__name__": f"pnnx_reference_{path.stem}", RECORDER: record}
    code = compile(tree, str(path), "exec")
    try:
        exec(code, namespace)                       # defines Model; runs no test code
        model = namespace["Model"]().float().eval()
        with torch.no_grad():
            model(*(torch.from_numpy(np.array(x)) for x in inputs))
    except Exception as exc:                        # the module's own failure, on these inputs
        raise GraphError(f"running the pnnx python module {path} failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    return recorded


def torch_values_from_module(module, graph: "RuntimeGraph", inputs: Sequence[np.ndarray]
                             ) -> dict[str, np.ndarray]:
    """Run the torch ``module`` on ``inputs`` with forward hooks; torch's value of every graph
    operand it can name: the inputs, the outputs of operators named like a submodule, and the
    graph outputs."""
    import torch

    recorded: dict[str, np.ndarray] = {}

    def hook_for(op: RuntimeOperator):
        def hook(_module, _args, output):
            if op.outputs[0].name in recorded:          # a later call: pnnx renamed it
                return
            for operand, value in zip(op.outputs, _flatten(output)):
                recorded[operand.name] = value.detach().cpu().clone().numpy()
        return hook

    # a fused operator (conv + relu) produces what its last folded operator did: that
    # operator's module is its twin; an operator with only a pad folded in keeps its own name
    twins = {(op.output_of or op.name): op for op in graph.operators
             if op.output_of or not op.fused}
    handles = [sub.register_forward_hook(hook_for(twins[name]))
               for name, sub in module.named_modules() if name and name in twins]
    folded = _folded_conv_bn(graph)
    conv_bn: list[Any] = []                           # outputs of conv -> batch norm pairs
    if folded:
        handles += _watch_conv_bn(module, conv_bn)
    try:
        tensors = [torch.from_numpy(np.array(x)) for x in inputs]
        with torch.no_grad():
            outputs = module.eval()(*tensors)
    finally:
        for handle in handles:
            handle.remove()
    _name_folded_conv_bn(folded, conv_bn, recorded)
    for op, x in zip(graph.input_operators, inputs):
        recorded[op.outputs[0].name] = np.asarray(x)
    for operand, value in zip(graph.output_operands, _flatten(outputs)):
        recorded[operand.name] = value.detach().cpu().numpy()
    return recorded


def _watch_conv_bn(module: Any, pairs: list[Any]) -> list[Any]:
    """Hooks that append to ``pairs``, in the order torch runs them, the output of every
    BatchNorm2d whose input is the output of the Conv2d that ran just before it."""
    import torch

    last: list[Any] = [None]

    def after_conv(_module: Any, _args: Any, output: Any) -> None:
        last[0] = output

    def after_bn(_module: Any, args: Any, output: Any) -> None:
        if args and last[0] is not None and args[0] is last[0]:
            pairs.append(output.detach().clone())     # before an in-place ReLU changes it
        last[0] = None

    handles = []
    for sub in module.modules():
        if isinstance(sub, torch.nn.Conv2d):
            handles.append(sub.register_forward_hook(after_conv))
        elif isinstance(sub, torch.nn.BatchNorm2d):
            handles.append(sub.register_forward_hook(after_bn))
    return handles


def _folded_conv_bn(graph: "RuntimeGraph") -> list[RuntimeOperator]:
    """pnnx's convbn2d_<k> operators (a Conv2d and the BatchNorm2d after it, folded), by k."""
    return sorted((op for op in graph.operators if re.fullmatch(r"convbn2d_\d+", op.name)),
                  key=lambda op: int(op.name.rsplit("_", 1)[1]))


def _name_folded_conv_bn(folded: list[RuntimeOperator], pairs: list[Any],
                         recorded: dict[str, np.ndarray]) -> None:
    """pnnx folds a Conv2d and the BatchNorm2d after it into ``convbn2d_<k>``, numbered in the
    order the trace runs them, a name torch's module does not have: its torch value is the
    k-th conv -> batch norm output. Used only when the counts agree (else the pairing would
    be a guess), and for operators that nothing was fused into after (their output is still
    the batch norm's)."""
    if not folded or len(folded) != len(pairs):
        return
    for op, value in zip(folded, pairs):
        name = op.outputs[0].name
        if op.output_of is None and name not in recorded:
            recorded[name] = value.cpu().numpy()         # cloned when it was recorded


def _flatten(value) -> list:
    """The tensors of a (nested) tuple / list / dict of outputs, in order."""
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v)]
    return [value] if hasattr(value, "detach") else []


# ----------------------------------------------------------------------------- differences
@dataclass
class OperandDiff:
    """How one operand of ours differs from torch's (see the module docstring)."""

    step: int                              # the operator's place in the run order (1-based)
    operator: RuntimeOperator
    operand: str
    shape: tuple[int, ...]
    torch_shape: tuple[int, ...] | None    # None: torch has no value for it (skipped)
    max_abs: float | None = None
    max_rel: float | None = None
    bad: int = 0                           # elements beyond the tolerance
    size: int = 0
    first_bad_index: tuple[int, ...] | None = None
    ours_at: float | None = None           # the two values at first_bad_index
    torch_at: float | None = None
    local_max_abs: float | None = None     # our layer on torch's inputs (None: not possible)
    local_bad: int | None = None

    @property
    def status(self) -> str:
        if self.torch_shape is None:
            return "skip"
        if self.torch_shape != self.shape:
            return "SHAPE"
        return "BAD" if self.bad else "ok"

    @property
    def departs(self) -> bool:
        return self.status in ("BAD", "SHAPE")

    @property
    def departs_locally(self) -> bool:
        return self.status == "SHAPE" or bool(self.local_bad)

    def describe(self) -> str:
        op = f"step {self.step}: {self.operator.label}, operand {self.operand}"
        if self.status == "SHAPE":
            return f"{op}: shape {fmt_shape(self.shape)}, torch {fmt_shape(self.torch_shape)}"
        where = (f" first at {self.first_bad_index}: ours {self.ours_at:.6g}, "
                 f"torch {self.torch_at:.6g}" if self.first_bad_index is not None else "")
        return (f"{op}: {self.bad} of {self.size} elements differ, max |diff| "
                f"{self.max_abs:.3g} (rel {self.max_rel:.3g});{where}")


def diff_arrays(ours: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> dict[str, Any]:
    """The numbers of an OperandDiff for two arrays of one shape."""
    a, b = np.asarray(ours), np.asarray(ref)
    if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":     # integers, bools: exact
        bad_mask = a != b
    else:
        bad_mask = ~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a64 - b64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    diff[both_nan] = 0.0
    diff[np.isnan(diff)] = np.inf                    # NaN on one side only
    max_abs = float(diff.max()) if diff.size else 0.0
    finite_ref = np.abs(b64[np.isfinite(b64)])
    scale = float(finite_ref.max()) if finite_ref.size else 0.0
    numbers = {"max_abs": max_abs, "max_rel": max_abs / scale if scale > 0 else
               (0.0 if max_abs == 0 else float("inf")),
               "bad": int(bad_mask.sum()), "size": int(a.size)}
    if numbers["bad"]:
        flat = int(np.flatnonzero(bad_mask)[0])
        index = tuple(int(i) for i in np.unravel_index(flat, a.shape))
        numbers.update(first_bad_index=index, ours_at=float(a64.ravel()[flat]),
                       torch_at=float(b64.ravel()[flat]))
    return numbers


@dataclass
class Comparison:
    """The result of ``compare_with_torch``: one OperandDiff per operand, in run order."""

    rows: list[OperandDiff]
    atol: float
    rtol: float
    source: str
    ours: dict[str, np.ndarray]
    torch: dict[str, np.ndarray]
    graph: "RuntimeGraph | None" = field(default=None, repr=False)

    @property
    def compared(self) -> list[OperandDiff]:
        return [r for r in self.rows if r.status != "skip"]

    @property
    def skipped(self) -> list[OperandDiff]:
        return [r for r in self.rows if r.status == "skip"]

    @property
    def first_bad(self) -> OperandDiff | None:
        """The first operand (in run order) that departs from torch, or None."""
        return next((r for r in self.rows if r.departs), None)

    @property
    def culprit(self) -> OperandDiff | None:
        """The first operand that departs even when its operator gets torch's inputs."""
        return next((r for r in self.rows if r.departs_locally), None)

    @property
    def ok(self) -> bool:
        return self.first_bad is None

    def row(self, name: str) -> OperandDiff:
        """The row of an operand, or of an operator's first output."""
        for r in self.rows:
            if r.operand == name or r.operator.name == name:
                return r
        raise GraphError(f"no operand or operator named {name!r} in this comparison")

    def worst(self, name: str, k: int = 5) -> Table:
        """The ``k`` largest differences of one operand (or operator's first output)."""
        r = self.row(name)
        if r.status not in ("ok", "BAD"):
            raise GraphError(f"operand {r.operand} was not compared ({r.status})")
        a = self.ours[r.operand].astype(np.float64)
        b = self.torch[r.operand].astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.nan_to_num(np.abs(a - b), nan=np.inf).ravel()
        top = np.argsort(-diff, kind="stable")[:k]
        rows = [[str(tuple(int(i) for i in np.unravel_index(int(f), a.shape))),
                 float(a.ravel()[f]), float(b.ravel()[f]), float(diff[f])] for f in top]
        return Table(["index", "ours", "torch", "|diff|"], rows,
                     title=f"largest differences of operand {r.operand} ({r.operator.label})",
                     formats={c: (lambda v: f"{v:.6g}") for c in ("ours", "torch", "|diff|")})

    def headline(self) -> str:
        compared = self.compared
        if not compared:
            return f"nothing to compare: torch ({self.source}) names none of the graph's operands"
        if self.ok:
            worst = max(r.max_abs for r in compared)
            return (f"all {len(compared)} compared operands agree with torch ({self.source}) "
                    f"within atol={self.atol:g}, rtol={self.rtol:g} (max |diff| {worst:.3g}); "
                    f"{len(self.skipped)} skipped")
        lines = [f"departs from torch ({self.source}) at {self.first_bad.describe()}"]
        culprit = self.culprit
        if culprit is self.first_bad:
            lines.append("fed torch's own inputs it still departs: the fault is in this "
                         "operator")
        elif culprit is not None:
            lines.append(f"the first operator that departs on torch's own inputs: "
                         f"{culprit.describe()}")
        elif self.first_bad.local_max_abs is not None:
            lines.append("fed torch's own inputs it agrees: the difference comes in from "
                         "upstream (accumulated rounding, or an operator torch does not name)")
        return "\n".join(lines)

    def table(self, all: bool = False) -> Table:
        """One row per compared operand (``all``: skipped ones too); departing rows marked."""
        rows, marked = [], set()
        for r in self.rows if all else self.compared:
            if r.departs:
                marked.add(len(rows))
            rows.append([r.step, r.operator.type, r.operator.name, r.operand,
                         fmt_shape(r.shape), r.status, r.max_abs, r.max_rel,
                         r.bad if r.torch_shape is not None else None,
                         str(r.first_bad_index) if r.first_bad_index is not None else "",
                         r.local_max_abs])
        fmt = {c: (lambda v: f"{v:.3g}") for c in ("max |diff|", "rel", "local |diff|")}
        return Table(["step", "type", "name", "operand", "shape", "status", "max |diff|",
                      "rel", "bad", "first bad at", "local |diff|"], rows,
                     title=self.headline(), marked=marked, formats=fmt)

    def draw(self, **options):
        """The graph drawn with the operators that depart on torch's own inputs red, those
        that only carry a difference from upstream orange, and agreeing ones green."""
        from infer.draw import draw_graph

        colours: dict[str, str] = {}
        rank = {"#c8e6c9": 0, "#fdd9b5": 1, "#f4a6a6": 2}     # an operator shows its worst
        for r in self.compared:
            colour = ("#f4a6a6" if r.departs_locally or (r.departs and r.local_bad is None)
                      else "#fdd9b5" if r.departs else "#c8e6c9")
            name = r.operator.name
            if rank[colour] >= rank.get(colours.get(name, "#c8e6c9"), 0):
                colours[name] = colour
        return draw_graph(self.graph, colours=colours, **options)

    def __str__(self) -> str:
        return str(self.table())

    def __repr__(self) -> str:
        return f"<Comparison {self.headline().splitlines()[0]}>"

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def compare_with_torch(graph: "RuntimeGraph", reference: Any, *inputs: np.ndarray,
                       atol: float = 1e-4, rtol: float = 1e-3) -> Comparison:
    """Run ``graph`` and torch on ``inputs`` and compare every operand both have (see the
    module docstring). ``reference``: a torch module, a ``*_pnnx.py`` path, or None for the
    ``*_pnnx.py`` beside the graph's param file."""
    by_path = reference is None or isinstance(reference, (str, Path))
    if not by_path and not callable(getattr(reference, "named_modules", None)):
        raise GraphError(f"reference must be the torch module the files came from, the path "
                         f"of a *_pnnx.py, or None; got {type(reference).__name__}")
    run = graph.execute(*inputs, keep_all=True, hooks=False)
    with graph.running():
        run.run_all()
    ours = run.values
    arrays = [ours[op.outputs[0].name] for op in graph.input_operators]

    if by_path:
        path = Path(reference) if reference is not None else pnnx_py_path(graph)
        by_variable = torch_values_from_pnnx_py(path, graph.bin_path, arrays)
        theirs = {name: by_variable[python_name(name)] for name in graph.operands
                  if python_name(name) in by_variable}
        source = path.name
    else:
        theirs = torch_values_from_module(reference, graph, arrays)
        source = f"module {type(reference).__name__}"

    rows = []
    for step, op in enumerate((s.op for s in run.steps), start=1):
        local = _local_outputs(op, ours, theirs)
        for position, operand in enumerate(op.outputs):
            mine = ours[operand.name]
            ref = theirs.get(operand.name)
            row = OperandDiff(step, op, operand.name, tuple(np.shape(mine)),
                              None if ref is None else tuple(np.shape(ref)))
            if row.status == "ok":
                for key, value in diff_arrays(mine, ref, atol, rtol).items():
                    setattr(row, key, value)
                if local is not None and np.shape(local[position]) == np.shape(ref):
                    numbers = diff_arrays(local[position], ref, atol, rtol)
                    row.local_max_abs, row.local_bad = numbers["max_abs"], numbers["bad"]
            rows.append(row)
    return Comparison(rows, atol, rtol, source, ours, theirs, graph)


def _local_outputs(op: RuntimeOperator, ours: dict[str, np.ndarray],
                   theirs: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """``op``'s layer run on torch's values of its inputs (cast to the dtypes ours have), or
    None when torch lacks one of them or the layer refuses them."""
    if any(o.name not in theirs for o in op.inputs):
        return None
    xs = [np.ascontiguousarray(theirs[o.name], dtype=ours[o.name].dtype) for o in op.inputs]
    try:
        return call_layer(op, xs)
    except InferError:
        return None
