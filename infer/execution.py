"""The execution loop: one forward pass over a graph's run list, one operator at a time.

    with g.running():                   # the graph's thread cap, numpy's warnings off
        run = g.execute(x)              # inputs checked, shapes and memory planned; nothing ran
        for step, inputs, outputs, seconds in run:    # one record per operator that has run
            ...
        outputs = run.outputs()         # the graph outputs, as forward returns them

``forward`` drains this loop; the debugger steps it with ``next``; hooks, ``forward_all``, the
profiler and the comparison with torch run it too. Each step calls the layer method forward
calls: ``forward_inplace`` for an in-place step (when its input array is writeable),
``forward_into`` for a step the memory plan gives output slots, ``forward`` otherwise (and
for every step after a hook replaced arrays: they may not have the planned shapes). One step
is not called: a cat whose every input its producer wrote into its place in the cat's output
(a join, infer/memory.py) has nothing left to do.

The layer methods are the same in both ways of running; the arrays differ:

- plain (``forward``, the profiler): an in-place step overwrites its input, a forward_into step
  writes into the arena's buffers, which later steps reuse (a join's cat may have nothing to
  do), and an operand is dropped after its last consumer. A record's arrays may change once
  the loop moves on.
- isolated (``keep_all=True``, or hooks set): an array a step reads stays as it was and an array
  it writes is its own: an in-place step runs on a copy of its input, a forward_into step writes
  into new arrays (every cat copies), and the layer gets read-only views of its inputs (a layer
  that writes into one fails, named). ``keep_all`` also keeps every operand to the end (a debug
  session).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

import numpy as np

from infer.runtime import RuntimeOperator
from parser.errors import GraphError, InferError, LayerError, MemoryBudgetError, shorten

from layers.base import at_least_1d
from infer.memory import INTO_DTYPE

if TYPE_CHECKING:
    from infer.memory import Arena, MemoryPlan, Slot
    from layers.base import Layer

# what the loop yields per operator: the step, its inputs, its outputs, its layer's seconds
Record = tuple["RunStep", list[np.ndarray], list[np.ndarray], float]


@dataclass(frozen=True, eq=False)
class RunStep:
    """One entry of the run list: an operator and what the loop needs to run it."""

    op: RuntimeOperator
    layer: "Layer"
    inputs: tuple[str, ...]          # operand names, in the layer's input order
    outputs: tuple[str, ...]
    free: tuple[str, ...]            # operands whose last consumer this step is
    in_place: bool                   # may overwrite its input (if that array is writeable)
    into: bool                       # the layer can write into given arrays (forward_into)

    @property
    def label(self) -> str:
        return self.op.label


class Execution:
    """One pass over ``steps`` (see the module docstring). ``values`` maps operand names to
    this pass's arrays, starting with the graph inputs; ``position`` counts the steps run.
    ``hooks`` have ``before(op, inputs)`` / ``after(op, inputs, outputs)`` attributes (either
    None), which may return replacement arrays; ``timed`` measures each layer call."""

    def __init__(self, steps: Sequence[RunStep], memory: "MemoryPlan",
                 inputs: dict[str, np.ndarray], output_names: Sequence[str], *,
                 keep_all: bool = False, hooks: Sequence[Any] = (), timed: bool = False):
        self.steps = steps
        self.memory = memory
        self.values = dict(inputs)
        self.output_names = list(output_names)
        self.keep_all = keep_all
        self.isolated = keep_all or bool(hooks)
        self.timed = timed
        self.position = 0
        self._befores = [h.before for h in hooks if h.before is not None]
        self._afters = [h.after for h in hooks if h.after is not None]
        self._stepwise = True               # yield a record per step (run_all: none)
        self._loop = self._run()

    def __iter__(self) -> Iterator[Record]:
        return self._loop

    def __next__(self) -> Record:
        return next(self._loop)

    @property
    def done(self) -> bool:
        return self.position >= len(self.steps)

    @property
    def next_step(self) -> RunStep | None:
        return None if self.done else self.steps[self.position]

    def run_all(self) -> "Execution":
        """Run the remaining steps, holding no record: an array held one step too long would
        outlive its last consumer (and keep its arena buffer from being reused). The loop
        then runs to the end in one resumption, yielding no record per step."""
        self._stepwise = False
        collections.deque(self._loop, maxlen=0)
        return self

    def outputs(self) -> list[np.ndarray]:
        """The graph outputs, writeable (a read-only view or constant is copied)."""
        return [_writeable(self.values[name]) for name in self.output_names]

    def _run(self) -> Iterator[Record]:
        values, keep_all, isolated, timed = self.values, self.keep_all, self.isolated, self.timed
        befores, afters = self._befores, self._afters
        # this pass's own buffers; an isolated pass gives every slot a new array instead
        arena: Arena | NewArrays = NewArrays() if isolated else self.memory.take_arena()
        started = seconds = 0.0
        planned = True                      # False once a hook has replaced arrays
        self._call = ""                     # the layer method the last step ran (time_again)
        try:
            for step, slots in zip(self.steps, self.memory.step_slots):
                xs = [values[name] for name in step.inputs]
                if befores:
                    for before in befores:
                        replaced = before(step.op, xs)
                        if replaced is not None:
                            xs, planned = list(replaced), False
                if timed:
                    started = time.perf_counter()
                try:
                    if step.in_place and xs[0].flags.writeable:
                        self._call = "inplace"
                        if isolated:
                            ys = [xs[0].copy()]
                            step.layer.forward_inplace(at_least_1d(ys[0]))
                        else:                                   # nobody else reads xs[0]
                            step.layer.forward_inplace(at_least_1d(xs[0]))
                            ys = xs
                    elif slots is not None and planned and _all_float32(xs):  # into the plan
                        self._call = "into"
                        ys = [arena.array(slot) for slot in slots]
                        if arena.joined(slots[0]):          # a cat with nothing left to copy
                            self._call = "joined"
                        else:
                            step.layer.forward_into(
                                [read_only(x) for x in xs] if isolated else xs, ys)
                    else:
                        self._call = "forward"
                        ys = step.layer.forward([read_only(x) for x in xs] if isolated else xs)
                        if len(ys) != len(step.outputs):
                            raise LayerError(f"returned {len(ys)} outputs, the graph expects "
                                             f"{len(step.outputs)}")
                except Exception as exc:                        # name the operator
                    error = operator_error(step.op, exc)
                    if error is exc:
                        raise
                    raise error from exc
                if timed:
                    seconds = time.perf_counter() - started
                if afters:
                    for after in afters:
                        replaced = after(step.op, xs, ys)
                        if replaced is not None:
                            ys, planned = list(replaced), False
                for name, y in zip(step.outputs, ys):
                    values[name] = y
                if not keep_all:
                    for name in step.free:                      # last consumer has run
                        del values[name]
                self.position += 1
                if self._stepwise:
                    yield step, xs, ys, seconds
        finally:
            if not isinstance(arena, NewArrays):
                self.memory.give_back(arena)

    def time_again(self, step: RunStep, xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
        """Seconds of calling the last step's layer again at once, as the loop called it, on
        the same arrays (``step, xs, ys`` of its record): its code and data are now in cache,
        so set against the record's seconds the difference is the step's cold start. The pass
        goes on unchanged: an in-place step runs again on a copy of its input, and a forward
        step's new arrays are dropped (a forward_into step writes the same values again). A
        joined cat, which the loop did not call, is not called again: 0."""
        if self.position == 0 or step is not self.steps[self.position - 1]:
            raise GraphError(f"time_again takes the last step's record, not {step.label}'s")
        if self._call == "joined":
            return 0.0
        inputs = [read_only(x) for x in xs] if self.isolated else xs
        copy = at_least_1d(xs[0].copy()) if self._call == "inplace" else None
        with operator_context(step.op):                         # name the operator
            started = time.perf_counter()
            if copy is not None:
                step.layer.forward_inplace(copy)
            elif self._call == "into":
                step.layer.forward_into(inputs, ys)
            else:
                step.layer.forward(inputs)
            return time.perf_counter() - started


def _all_float32(xs: list[np.ndarray]) -> bool:
    """forward_into's contract: float32 inputs (its slots are float32; anything else runs
    forward, which allocates arrays of the dtype it computes)."""
    for x in xs:                  # a loop: all() over a generator costs more, each step
        if x.dtype is not INTO_DTYPE and x.dtype != INTO_DTYPE:     # (is: the usual case)
            return False
    return True


class NewArrays:
    """Stands in for the arena in an isolated pass: every slot gets an array of its own."""

    def array(self, slot: Slot) -> np.ndarray:
        return np.empty(slot.shape, slot.dtype)

    def joined(self, slot: Slot) -> bool:
        return False


def read_only(x: Any) -> Any:
    """A read-only view of ``x``: a layer given it cannot overwrite the array."""
    if not isinstance(x, np.ndarray) or not x.flags.writeable:
        return x
    view = x.view()
    view.flags.writeable = False
    return view


def _writeable(y: np.ndarray) -> np.ndarray:
    """A graph output the caller may write to, as torch's outputs are: the read-only arrays
    (views the layers protect, constants over the bin file) are copied."""
    return y if y.flags.writeable else y.copy()


def operator_error(op: RuntimeOperator, exc: Exception) -> Exception:
    """The error to raise for ``exc`` raised while ``op`` ran: our own errors get
    ``.operator`` set and stay what they are; anything else (a numpy error, a layer bug)
    becomes a LayerError naming the operator, with numpy's wording explained where it is
    obscure; running out of memory is a MemoryBudgetError (a MemoryError too)."""
    if isinstance(exc, InferError):
        exc.with_operator(op.label, op.line)
        return exc
    if isinstance(exc, MemoryError):
        return MemoryBudgetError(
            f"ran out of memory (line {op.line}): the machine had less free memory than this "
            f"step needed; lower the memory budget (graph.memory_budget) to be told before "
            f"running, or use smaller inputs", operator=op.label)
    return LayerError(f"{type(exc).__name__}: {shorten(str(exc), 300)}{_explain(exc)} "
                      f"(line {op.line})", operator=op.label)


# numpy's messages that do not say what went wrong in a model's terms
_EXPLAINED = {
    "maximum allowed dimension exceeded": "a size computed here is too large for an array",
    "array is too big": "a size computed here is too large for an array",
    "cannot convert float infinity to integer": "a size or index computed here is infinite",
    "cannot convert float nan to integer": "a size or index computed here is NaN",
    "negative dimensions are not allowed": "a size computed here is negative",
    "Python int too large to convert": "a size or index computed here is too large",
    "iterator is too large": "a size computed here is too large for an array",
}


def _explain(exc: Exception) -> str:
    """' (meaning: ...)' for a numpy message in _EXPLAINED, else ''."""
    text = str(exc).lower()
    for words, meaning in _EXPLAINED.items():
        if words.lower() in text:
            return f" ({meaning}: check the operator's parameters and input shapes)"
    return ""


class operator_context:
    """Attach the operator to any error raised inside (see operator_error)."""

    def __init__(self, op: RuntimeOperator):
        self.op = op

    def __enter__(self) -> "operator_context":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or not isinstance(exc, Exception):    # KeyboardInterrupt, SystemExit
            return False
        error = operator_error(self.op, exc)
        if error is exc:
            return False
        raise error from exc
