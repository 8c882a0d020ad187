"""Running a graph one operator at a time: the debugger, hooks, every intermediate.

    dbg = g.debug(x)                  # a Debugger; nothing has run yet
    dbg.step()                        # run the next operator: it becomes dbg.current
    dbg.run_to("layer1.0.conv2")      # run up to and including that operator
    dbg.break_on(type="nn.ReLU")      # stop after every ReLU ...
    dbg.continue_()                   # ... run on to the next breakpoint (None: ran to the end)
    dbg.current                       # the operator that ran last, its inputs and its outputs
    dbg.inspect("12")                 # an operand: shape, dtype, min/max/mean/std, NaN/Inf, values
    outputs = dbg.finish()            # run the rest: the arrays g.forward(x) returns

    handle = g.add_hook(before=f, after=h)   # f(op, inputs), h(op, inputs, outputs)
    handle.remove()                          # (or: with g.add_hook(...): ...)
    g.verbose = True                         # print `type name (input shapes) -> (output shapes)`
    values = g.forward_all(x)                # every operand's array, by operand name

All of these run ``g.execute(...)``, the loop ``forward`` drains (infer/execution.py): the same
input checks and plans (a bad input shape is refused before anything runs) and the same layer
calls - ``forward_inplace`` for an in-place step, ``forward_into`` for a step the memory plan
gives slots, ``forward`` otherwise - so what you step through is what runs. (A debug session
keeps every array, so each step writes arrays of its own: a cat copies its inputs, where a
plain forward may have had their producers write them into the cat's output already.)

With fusion on (the default), an operator folded into another (a ReLU into the convolution
before it) does not run on its own: ``run_to``, ``break_on`` (by its name or its type) and
``inspect`` of its name stop at, or read the output of, the operator that absorbed it; an
operator folded in the middle of a chain (the add of conv -> add -> relu) has no output of its
own, and ``RuntimeGraph(..., fuse=False)`` runs every operator of the file on its own.

What differs is where the arrays live, so that what you look at is what was computed. A debug
session and ``forward_all`` keep every intermediate, and run isolated, as ``forward`` does
while a hook is set: an in-place step overwrites a copy of its input, a forward_into step
writes into new arrays rather than the memory plan's shared buffers, and a layer gets read-only
views of its inputs (one that writes into an input is caught, named).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from infer.execution import operator_context, read_only
from infer.inspection import ArrayStats, stats_table
from infer.runtime import RuntimeOperator
from infer.table import Table, fmt_shape
from parser.errors import GraphError, LayerError

if TYPE_CHECKING:
    from infer.graph import RuntimeGraph

log = logging.getLogger(__name__)

BeforeHook = Callable[[RuntimeOperator, list[np.ndarray]], "Sequence[np.ndarray] | None"]
AfterHook = Callable[[RuntimeOperator, list[np.ndarray], list[np.ndarray]],
                     "Sequence[np.ndarray] | None"]


def call_layer(op: RuntimeOperator, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``op``'s layer on other arrays than a pass gives it (compare.py runs it on torch's):
    its ``forward`` on read-only views of ``xs``. An error names the operator."""
    with operator_context(op):
        ys = op.layer.forward([read_only(x) for x in xs])
        if len(ys) != len(op.outputs):
            raise LayerError(f"returned {len(ys)} outputs, the graph expects {len(op.outputs)}")
    return list(ys)


# ----------------------------------------------------------------------------- hooks
@dataclass(eq=False)
class Hook:
    """Functions called around every operator of a forward pass.

    ``before(op, inputs)`` runs before the layer, ``after(op, inputs, outputs)`` after it; either
    may return a list of arrays to use instead (inputs, or outputs), or None to change nothing.
    ``op`` is the RuntimeOperator; the arrays are in the order of ``op.inputs`` / ``op.outputs``.
    """

    before: BeforeHook | None = None
    after: AfterHook | None = None


class HookHandle:
    """What ``add_hook`` returns: ``remove()`` takes the hook off the graph (also on leaving a
    ``with`` block)."""

    def __init__(self, hooks: list[Hook], hook: Hook):
        self._hooks, self.hook = hooks, hook

    def remove(self) -> None:
        if self.hook in self._hooks:
            self._hooks.remove(self.hook)

    def __enter__(self) -> "HookHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def shape_line(op: RuntimeOperator, inputs: Sequence[np.ndarray],
               outputs: Sequence[np.ndarray]) -> str:
    """``nn.Conv2d  conv1  (1,3,8,8) -> (1,8,8,8)``: what the verbose mode prints per operator."""
    ins = ", ".join(fmt_shape(np.shape(x)) for x in inputs)
    outs = ", ".join(fmt_shape(np.shape(y)) for y in outputs)
    return f"{op.type:<24} {op.name:<24} {ins} -> {outs}"


class VerboseHook(Hook):
    """Prints (``mode="print"``, what reads best in a notebook cell) or logs at INFO level
    (``mode="log"``, logger ``infer.debug``) one ``shape_line`` per operator."""

    def __init__(self, mode: str = "print", stream=None):
        super().__init__(after=self._report)
        self.mode, self.stream = mode, stream

    def _report(self, op, inputs, outputs) -> None:
        line = shape_line(op, inputs, outputs)
        if self.mode == "log":
            log.info("%s", line)
        else:
            print(line, file=self.stream or sys.stdout)


# ----------------------------------------------------------------------------- steps
@dataclass
class Step:
    """One operator that has run in a debug session: its input and output arrays (in the
    order of ``operator.inputs`` / ``operator.outputs``) and the time its layer took."""

    index: int                      # 1-based, among the operators that run (not Input / Output)
    total: int
    operator: RuntimeOperator
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.operator.name

    @property
    def type(self) -> str:
        return self.operator.type

    def named_inputs(self) -> dict[str, np.ndarray]:
        return {o.name: x for o, x in zip(self.operator.inputs, self.inputs)}

    def named_outputs(self) -> dict[str, np.ndarray]:
        return {o.name: y for o, y in zip(self.operator.outputs, self.outputs)}

    def headline(self) -> str:
        line = shape_line(self.operator, self.inputs, self.outputs)
        return f"step {self.index}/{self.total}  {' '.join(line.split())}  " \
               f"({self.seconds * 1e3:.3f} ms)"

    def table(self) -> Table:
        """Statistics of every input and output; an array with NaN or Inf is marked."""
        stats = [ArrayStats.of(x, f"in  {o.name}") for o, x in zip(self.operator.inputs,
                                                                    self.inputs)]
        stats += [ArrayStats.of(y, f"out {o.name}") for o, y in zip(self.operator.outputs,
                                                                   self.outputs)]
        return stats_table(stats, title=self.headline())

    def __str__(self) -> str:
        return str(self.table())

    def __repr__(self) -> str:
        return f"<Step {self.headline()}>"

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def forward_all(graph: "RuntimeGraph", *inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Every operand's array (the inputs, each intermediate, the outputs) by operand name, in
    run order. The graph's hooks run too."""
    run = graph.execute(*inputs, keep_all=True)
    with graph.running():
        run.run_all()
    return dict(run.values)


# ----------------------------------------------------------------------------- debugger
@dataclass
class Breakpoint:
    """Stop after an operator of this ``type``, of this ``name``, for which ``when(step)`` is
    true, or (``nonfinite``) whose outputs hold a NaN or an Inf. Given conditions all hold.

    With fusion on, an operator folded into another (a ReLU into the convolution before it)
    no longer runs on its own: its type and name then match the operator that absorbed it
    (``at_type`` / ``at_name``, filled in by ``Debugger.break_on``), as ``run_to`` stops
    there too."""

    type: str | None = None
    name: str | None = None
    when: Callable[[Step], bool] | None = None
    nonfinite: bool = False
    hits: int = field(default=0, compare=False)
    at_type: frozenset[str] | None = field(default=None, compare=False, repr=False)
    at_name: str | None = field(default=None, compare=False, repr=False)

    def matches(self, step: Step) -> bool:
        if self.type is not None and step.type != self.type and step.name not in (
                self.at_type or ()):
            return False
        if self.name is not None and step.name not in (self.name, self.at_name):
            return False
        if self.nonfinite and all(
                np.isfinite(y).all() for y in step.outputs
                if isinstance(y, np.ndarray) and y.dtype.kind in "fc"):
            return False
        return self.when is None or bool(self.when(step))


class Debugger:
    """A forward pass you walk through, one operator at a time (see the module docstring).

    ``current`` is the Step that ran last (None before the first), ``next`` the operator that
    runs next (None at the end). Every intermediate is kept, so ``inspect`` and ``value`` work
    on any operand computed so far. The graph's hooks set when the session (re)starts run
    around each step."""

    def __init__(self, graph: "RuntimeGraph", *inputs: np.ndarray):
        self.graph = graph
        self.inputs = inputs
        self.breakpoints: list[Breakpoint] = []
        self.restart()

    # ------------------------------------------------------------------ state
    def restart(self) -> "Debugger":
        """Back to before the first operator (breakpoints stay)."""
        self._run = self.graph.execute(*self.inputs, keep_all=True, timed=True)
        self._shapes = self.graph.infer_shapes(*(np.shape(x) for x in self.inputs))
        self.current: Step | None = None
        self.history: list[Step] = []
        return self

    @property
    def done(self) -> bool:
        return self._run.done

    @property
    def next(self) -> RuntimeOperator | None:
        step = self._run.next_step
        return None if step is None else step.op

    @property
    def position(self) -> int:
        """How many operators have run."""
        return self._run.position

    @property
    def total(self) -> int:
        return len(self._run.steps)

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Every operand computed so far, by name."""
        return dict(self._run.values)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every operand's planned shape for these inputs (known before anything runs)."""
        return dict(self._shapes)

    # ------------------------------------------------------------------ moving
    def step(self, n: int = 1) -> Step | None:
        """Run the next ``n`` operators (fewer at the end); return the last one's Step."""
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise GraphError(f"step(n) takes a count >= 0, got {n!r}")
        with self.graph.running():
            for _ in range(n):
                if self.done:
                    break
                self._advance()
        return self.current

    def run_to(self, name: str) -> Step:
        """Run up to and including the operator called ``name``."""
        target = self._operator(name)
        ran = [s.operator for s in self.history]
        if target in ran:
            raise GraphError(f"{target.label} already ran (step {ran.index(target) + 1}); "
                             f"restart() to run it again", operator=target.label)
        with self.graph.running():
            while self._advance().operator is not target:
                pass
        return self.current

    def break_on(self, type: str | None = None, name: str | None = None, *,
                 when: Callable[[Step], bool] | None = None, nonfinite: bool = False
                 ) -> Breakpoint:
        """Add a breakpoint; ``continue_()`` stops after the next operator that matches it."""
        if type is None and name is None and when is None and not nonfinite:
            raise GraphError("break_on needs a type, a name, a when= condition or nonfinite=True")
        at_type = None
        if type is not None:
            at_type = frozenset(op.name for op in self._ops() if type in op.fused_types)
            if not at_type and all(op.type != type for op in self._ops()):
                types = sorted({op.type for op in self._ops()})
                raise GraphError(f"no operator of type {type!r} runs in this graph; its "
                                 f"types: {', '.join(types)}")
            if at_type:
                log.info("operators of type %s are fused into %s: stopping there too", type,
                         ", ".join(sorted(at_type)))
        at_name = None if name is None else self._operator(name).name
        point = Breakpoint(type, name, when, nonfinite, at_type=at_type, at_name=at_name)
        self.breakpoints.append(point)
        return point

    def clear_breakpoints(self) -> None:
        self.breakpoints.clear()

    def continue_(self) -> Step | None:
        """Run until an operator that matches a breakpoint has run and return its Step, or to
        the end (then None)."""
        with self.graph.running():
            while not self.done:
                step = self._advance()
                hit = [b for b in self.breakpoints if b.matches(step)]
                for point in hit:
                    point.hits += 1
                if hit:
                    return step
        return None

    def finish(self) -> list[np.ndarray]:
        """Run the remaining operators; the graph outputs, as ``forward`` returns them."""
        self.step(len(self._run.steps))
        return self._run.outputs()

    @property
    def outputs(self) -> list[np.ndarray]:
        """The graph outputs (only once every operator has run)."""
        if not self.done:
            raise GraphError(f"the forward pass is at step {self.position}/{self.total}: "
                             f"finish() first")
        return self._run.outputs()

    def _advance(self) -> Step:
        if self.done:
            raise GraphError("the forward pass has finished: restart() to run it again")
        record = next(self._run, None)
        if record is None:                       # the loop ended at a layer's error
            raise GraphError(f"the forward pass stopped at an error in {self.next.label}: "
                             f"restart() to run it again", operator=self.next.label)
        run_step, xs, ys, seconds = record
        step = Step(self._run.position, len(self._run.steps), run_step.op, list(xs), list(ys),
                    seconds)
        self.current = step
        self.history.append(step)
        return step

    def _ops(self) -> list[RuntimeOperator]:
        return [step.op for step in self._run.steps]

    def _operator(self, name: str) -> RuntimeOperator:
        for op in self._ops():
            if op.name == name:
                return op
        for op in self._ops():                 # folded into another by fusion
            if name in op.fused:
                log.info("%s is fused into %s: stopping there", name, op.label)
                return op
        if not isinstance(name, str):
            raise GraphError(f"an operator name is a str, got {name!r}")
        known = [op.name for op in self._ops()]
        close = [k for k in known if name in k or k in name][:5]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise GraphError(f"no operator named {name!r} runs in this graph{hint}")

    # ------------------------------------------------------------------ looking
    def value(self, name: str) -> np.ndarray:
        """The array of operand ``name`` (or of the single output of operator ``name``)."""
        operand = self._operand_name(name)
        if operand not in self._run.values:
            producer = self.graph.operands[operand].producer
            raise GraphError(f"operand {operand!r} is not computed yet: {producer.label} makes "
                             f"it; run_to({producer.name!r}) first", operator=producer.label)
        return self._run.values[operand]

    def inspect(self, name: str) -> ArrayStats:
        """Shape, dtype, min / max / mean / std, NaN and Inf counts and the first values of
        operand ``name`` (or of the single output of operator ``name``)."""
        return ArrayStats.of(self.value(name), self._operand_name(name))

    def _operand_name(self, name: str) -> str:
        if name in self.graph.operands:
            return name
        for op in self.graph.operators:
            if op.name == name:
                if len(op.outputs) != 1:
                    outs = ", ".join(o.name for o in op.outputs)
                    raise GraphError(f"{op.label} has {len(op.outputs)} outputs ({outs}): name "
                                     f"one operand", operator=op.label)
                return op.outputs[0].name
        for op in self.graph.operators:                # folded into another by fusion
            if name in op.fused:
                if op.output_of == name and len(op.outputs) == 1:
                    return op.outputs[0].name          # op now produces what it produced
                raise GraphError(f"{name!r} is fused into {op.label}, which does not keep its "
                                 f"output; RuntimeGraph(..., fuse=False) runs every operator "
                                 f"on its own", operator=op.label)
        raise GraphError(f"no operand or operator named {name!r} in this graph")

    def listing(self, context: int = 3) -> Table:
        """The operators around the current one (marked), gdb's ``list``."""
        here = self.position - 1                       # index of the current step, -1 at start
        lo = max(0, here - context)
        hi = min(len(self._run.steps), max(here, 0) + context + 1)
        rows, marked = [], set()
        for i in range(lo, hi):
            op = self._run.steps[i].op
            state = "ran" if i < self.position else "next" if i == self.position else ""
            shapes = ", ".join(fmt_shape(self._shapes.get(o.name)) for o in op.outputs)
            rows.append([i + 1, state, op.type, op.name, shapes])
            if i == here:
                marked.add(len(rows) - 1)
        return Table(["step", "", "type", "name", "output shapes"], rows, marked=marked,
                     title=f"{self.position}/{self.total} operators ran")

    def draw(self, **options):
        """The graph drawing with the current operator highlighted and the run ones shaded."""
        from infer.draw import draw_graph

        ran = [s.operator.name for s in self.history]
        current = self.current.operator.name if self.current else None
        return draw_graph(self.graph, shapes=self._shapes, highlight=current, done=ran,
                          **options)

    def __repr__(self) -> str:
        where = self.current.headline() if self.current else "before the first operator"
        nxt = f"; next: {self.next.label}" if self.next else "; finished"
        return f"<Debugger {self.position}/{self.total}: {where}{nxt}>"

    def __str__(self) -> str:
        parts = [str(self.listing())]
        if self.current is not None:
            parts.append(str(self.current))
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        parts = [self.listing()._repr_html_()]
        if self.current is not None:
            parts.append(self.current._repr_html_())
        return "".join(parts)
