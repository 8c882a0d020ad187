"""RuntimeGraph: from a pnnx param/bin pair to a list of output arrays.

    g = RuntimeGraph("model.pnnx.param", "model.pnnx.bin")
    g.build()                      # init() if needed, create layers, sort, check shapes
    outputs = g.forward(x)         # list of numpy arrays, one per graph output

The graph moves through three states, as KuiperInfer's does:

    NEED_INIT  --init()-->  NEED_BUILD  --build()-->  COMPLETE

init()    reads the param file into RuntimeOperators / RuntimeOperands, joined by operand name.
build()   creates each operator's layer (a graph's custom layers first, then the global
          LayerRegisterer), hands it its parameters and weights, orders the operators by a
          reverse depth-first search, and plans shapes for the traced input shapes. On a
          machine whose fast kernels are not compiled yet, it returns at once on the
          reference floor while a detached process compiles them; forward() moves the graph
          to the fast floor when they are there (``floor`` says which runs).
forward() checks the inputs, plans shapes and memory for them (re-planning for a new input
          size, as MNN does), and drains execute(): the one loop over the run list (one
          precomputed step per operator, infer/execution.py) that the debugger, hooks and the
          profiler run too. A consumer reads the very array its producer returned; an
          intermediate is dropped as soon as its last consumer has run. A layer that can write
          into a given array (forward_into) gets a buffer of the memory plan (infer.memory).
          Outputs are writeable arrays (a read-only view or constant is copied on its way out).

Weights: build() reads the bin file once into memory (``weights="memory"``), so later changes
to the file do nothing; ``weights="map"`` keeps zero-copy views of a memory map and refuses to
run once the file has changed (``_require_complete``). Every planned size is checked against
the memory budget (infer/budget.py) before it is allocated. build() is serialized by a lock,
and a build that fails leaves the graph NEED_INIT.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import math
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import layers  # noqa: F401  (registers the built-in layers)
from layers.base import Layer, at_build
from layers.registry import LayerRegisterer, unsupported_message
from parser.bin import DTYPES, PnnxBin
from parser.errors import (GraphError, LayerError, MemoryBudgetError, ShapeError,
                           UnsupportedOperatorError)
from parser.param import NULL_DTYPE, OperatorRecord, read_param
from infer.runtime import RuntimeAttribute, RuntimeOperand, RuntimeOperator, RuntimeParameter
from infer import budget, fusion, threads
from infer.execution import Execution, RunStep, operator_context
from infer.memory import (ArenaPool, MemoryPlan, counted_itemsize, keep_freed_memory,
                          plan_memory)
from infer.rewrite import rewrite_graph
from infer.tools import GraphTools

log = logging.getLogger(__name__)

Shape = tuple[int, ...]

WEIGHTS_MODES = ("memory", "map")   # where a built graph's weights live (RuntimeGraph weights=)
INPUT_TYPE = "pnnx.Input"
OUTPUT_TYPE = "pnnx.Output"
MAX_SHAPE_PLANS = 32          # input sizes whose shape plans a graph keeps
# numpy dtype kinds an input array may have, grouped: arrays are cast within a group only
INPUT_KINDS = {"f": "floating", "i": "integer", "u": "integer", "b": "bool", "c": "complex",
               "O": "object", "U": "text", "S": "text", "V": "other", "M": "time", "m": "time"}


def input_dtype(pnnx_dtype: str | None) -> np.dtype:
    """The numpy dtype a graph input is cast to: its declared pnnx dtype (float32 if none)."""
    if pnnx_dtype in (None, NULL_DTYPE):
        return np.dtype(np.float32)
    return DTYPES[pnnx_dtype]


class GraphState(enum.Enum):
    NEED_INIT = "needs init"
    NEED_BUILD = "needs build"
    COMPLETE = "complete"


class Running:
    """RuntimeGraph.running's context: the graph counted as running (``_move_to_fast_floor``
    leaves a graph alone while a pass runs), its thread cap (threads.limit, with the graph's
    thread count and floor when entered) and numpy's warnings off. Entered once."""

    __slots__ = ("graph", "limit", "quiet")

    def __init__(self, graph: RuntimeGraph):
        self.graph = graph
        self.limit: threads.limit | None = None
        self.quiet: np.errstate | None = None

    def __enter__(self) -> None:
        if self.limit is not None:
            raise RuntimeError("a RuntimeGraph.running() context is entered once: "
                               "call running() again for another pass")
        graph = self.graph
        self.limit = threads.limit(graph.num_threads, graph.helpers)
        with graph._running_lock:
            graph._running += 1
        try:
            self.limit.__enter__()
        except BaseException:
            self._counted_out()
            raise
        try:
            self.quiet = np.errstate(all="ignore")
            self.quiet.__enter__()
        except BaseException:
            self.limit.__exit__(None, None, None)
            self._counted_out()
            raise

    def __exit__(self, *exc_info: Any) -> None:
        assert self.limit is not None and self.quiet is not None
        try:
            try:
                self.quiet.__exit__(*exc_info)
            finally:
                self.limit.__exit__(*exc_info)
        finally:
            self._counted_out()

    def _counted_out(self) -> None:
        with self.graph._running_lock:
            self.graph._running -= 1


class RuntimeGraph(GraphTools):
    """A pnnx model ready to run. See the module docstring for the life cycle."""

    def __init__(self, param_path: str | Path, bin_path: str | Path | None = None, *,
                 reference: bool = False, fuse: bool = True, weights: str = "memory",
                 memory_budget: int | float | str | None = None):
        self.reference = reference      # True: the reference floor only (numba never loaded)
        # False: every operator of the file runs on its own (to step through each one); the
        # reference graph never fuses
        self.fuse = fuse and not reference
        # "compiling" / "failed": the fast kernels are not there yet (layers/fast/backend.py),
        # so the graph was built on the reference floor; forward() moves it once they are
        self._kernels_missing: str | None = None
        self._fast_failed = False          # its fast layers failed once: reference for good
        self._running = 0                  # forward passes under running(), now
        self._running_lock = threading.Lock()
        self.param_path = str(param_path)
        if bin_path is None:
            bin_path = _default_bin_path(self.param_path)
        self.bin_path = str(bin_path)
        if weights not in WEIGHTS_MODES:
            raise GraphError(f"weights must be one of {', '.join(map(repr, WEIGHTS_MODES))}, "
                             f"got {weights!r}")
        # "memory": build() reads the bin file once, later changes to it have no effect;
        # "map": weights are views of a memory map of the file (see _require_complete)
        self.weights = weights
        self.state = GraphState.NEED_INIT
        self.operators: list[RuntimeOperator] = []       # topological order after build()
        self.operands: dict[str, RuntimeOperand] = {}
        self.input_operators: list[RuntimeOperator] = []
        self.output_operands: list[RuntimeOperand] = []
        self.num_threads: int | None = None
        # bytes a forward pass's arrays may take (infer/budget.py); None: the default
        self.memory_budget = memory_budget
        self._custom_layers: dict[str, type[Layer]] = {}
        self._bin: PnnxBin | None = None
        self._free_after: list[list[str]] = []           # operand names to drop after each op
        self._steps: list[RunStep] = []                   # the run list (run_list)
        self._shape_plans: dict[tuple[Shape, ...], dict[str, Shape]] = {}
        self._memory_plans: dict[tuple[Shape, ...], MemoryPlan] = {}
        self._arenas = ArenaPool()      # the forward calls' buffers, for every input size
        self._plan_lock = threading.Lock()
        self._build_lock = threading.RLock()

    @property
    def floor(self) -> str:
        """What the layers run on: "fast" (the compiled kernels), "reference" (numpy), or,
        while the fast kernels are still being compiled in the background (the first build
        on a machine), "reference until the fast kernels are compiled": forward() moves the
        graph to the fast floor between two passes once they are ready."""
        if self.reference:
            return "reference"
        if self._kernels_missing == "compiling":
            return "reference until the fast kernels are compiled"
        if self._kernels_missing:
            return "reference (the fast kernels could not be compiled)"
        return "fast"

    @property
    def helpers(self) -> bool:
        """Whether forward passes share each kernel with helper threads (infer/threads.py):
        on the fast floor."""
        return self.floor == "fast"

    @property
    def memory_budget(self) -> float:
        """The bytes a forward pass's arrays may take (infer/budget.py): input shapes whose
        plan needs more are refused with a MemoryBudgetError before anything is allocated.
        Set it in bytes or as a size ("6G"); None (the default) takes PNNX_INFER_MEMORY_BUDGET
        or half the memory this process may use."""
        return self._memory_budget

    @memory_budget.setter
    def memory_budget(self, value: int | float | str | None) -> None:
        self._memory_budget = budget.default_budget() if value is None else (
            budget.parse_size(value))

    # ---------------------------------------------------------------- init: records -> objects
    def init(self) -> "RuntimeGraph":
        """Read the param file and join operators and operands by operand name."""
        with self._build_lock, _collector_paused():
            self._read()
        return self

    def _read(self) -> None:
        graph = read_param(self.param_path)
        operators: list[RuntimeOperator] = []
        operands: dict[str, RuntimeOperand] = {}

        def operand(name: str) -> RuntimeOperand:
            if name not in operands:
                info = graph.operands.get(name)
                operands[name] = RuntimeOperand(
                    name, info.shape if info else None, info.dtype if info else None)
            return operands[name]

        for rec in graph.operators:                      # pass 1: operators and producers
            self._check_io_operator(rec)
            op = RuntimeOperator(
                type=rec.type, name=rec.name, line=rec.line, input_names=list(rec.input_names),
                params={k: RuntimeParameter(k, p.type, p.value) for k, p in rec.params.items()},
                attrs={k: RuntimeAttribute(k, tuple(a.shape), a.dtype)
                       for k, a in rec.attrs.items()})
            for name in rec.outputs:
                out = operand(name)
                if out.producer is not None:
                    raise GraphError(
                        f"{self.param_path}:{rec.line}: operand {name!r} is produced twice "
                        f"(also by {out.producer.label} on line {out.producer.line})",
                        operator=op.label)
                out.producer = op
                op.outputs.append(out)
            operators.append(op)
        for rec, op in zip(graph.operators, operators):  # pass 2: consumers, joined by name
            for name in rec.inputs:
                src = operand(name)
                if src.producer is None:
                    raise GraphError(
                        f"{self.param_path}:{rec.line}: operand {name!r} is read here but no "
                        f"operator produces it", operator=op.label)
                src.consumers.append(op)
                op.inputs.append(src)

        self.operators, self.operands = operators, operands
        self._depth_first_order()       # a cycle is refused before the rewrites unpack tuples
        rewrite_graph(self.operators, self.operands, self.param_path)  # tuples, lists, ...
        self.input_operators = [op for op in self.operators if op.type == INPUT_TYPE]
        self.output_operands = [o for op in self.operators if op.type == OUTPUT_TYPE
                                for o in op.inputs]
        if not self.input_operators:
            raise GraphError(f"{self.param_path}: the graph has no pnnx.Input operator")
        if not self.output_operands:
            raise GraphError(f"{self.param_path}: the graph has no pnnx.Output operator")
        self.state = GraphState.NEED_BUILD

    def _check_io_operator(self, rec: OperatorRecord) -> None:
        """pnnx.Input reads nothing and gives one operand; pnnx.Output reads one or more and
        gives nothing."""
        reads, gives = len(rec.inputs), len(rec.outputs)
        wrong = None
        if rec.type == INPUT_TYPE and (reads or gives != 1):
            wrong = "a graph input reads none and gives one"
        elif rec.type == OUTPUT_TYPE and (gives or not reads):
            wrong = "a graph output reads one or more and gives none"
        if wrong:
            label = f"{rec.type} {rec.name}"
            raise GraphError(f"{self.param_path}:{rec.line}: {label} reads {reads} and gives "
                             f"{gives} operands; {wrong}", operator=label)

    # ---------------------------------------------------------------- custom layers
    def register_custom_layer(self, type_name: str, layer_class: type[Layer]) -> None:
        """Serve ``type_name`` on this graph only with ``layer_class`` (ncnn's
        register_custom_layer); it overrides the global registry. Call before build()."""
        if self.state is GraphState.COMPLETE:
            raise GraphError("register_custom_layer must be called before build()")
        if not (isinstance(layer_class, type) and issubclass(layer_class, Layer)):
            raise GraphError(f"custom layer for {type_name!r} must be a Layer subclass")
        self._custom_layers[type_name] = layer_class

    def _create_layer(self, op: RuntimeOperator) -> Layer:
        layer_class = self._custom_layers.get(op.type)
        if layer_class is None:                     # the fast floor's, else the reference
            layer_class = LayerRegisterer().layer_class(op.type, fast=self.floor == "fast")
        layer = layer_class()
        layer.name, layer.type = op.name, op.type
        layer.input_names = list(op.input_names)
        layer.num_outputs = len(op.outputs)
        return layer

    # ---------------------------------------------------------------- build
    def build(self) -> "RuntimeGraph":
        """Create and configure every layer, sort the operators, plan the traced shapes.
        Builds are serialized (a second thread waits, then finds the graph built); a build
        that fails leaves the graph as new (NEED_INIT), never half-built."""
        with self._build_lock, _collector_paused():
            if self.state is GraphState.COMPLETE:
                return self
            try:
                if self.state is GraphState.NEED_INIT:
                    self.init()
                self._check_supported()
                if not self.reference:          # the fast layers join the registry, and
                    from layers import fast     # their kernels are bound, not mid-forward

                    started = fast.start(wait=False)
                    if self._fast_failed:
                        started = fast.FAILED
                    self._kernels_missing = (started if started in (fast.COMPILING, fast.FAILED)
                                             else None)
                keep_freed_memory()             # the same arrays every forward: keep them mapped
                with threads.setup(self.num_threads, self.helpers):  # packing weights
                    self._build()
                if self.floor == "fast":        # now, not in the first forward
                    threads.start_helpers(self.num_threads, self.helpers)
            except BaseException:
                self.close()                    # back to NEED_INIT: init() reads the file anew
                raise
        return self

    def _build(self) -> None:
        self._bin = (PnnxBin(self.bin_path, in_memory=self.weights == "memory")
                     if self._needs_bin() else None)
        for op in self.operators:
            with operator_context(op):
                self._load_weights(op)
                self._check_weight_copies(op)
        self._make_layers()

    def _make_layers(self) -> None:
        """Create and configure every operator's layer (their weights loaded), fuse (on the
        fast floor), order, and plan the traced shapes: build() after reading the weights,
        and again to move from the reference floor to the fast one."""
        for op in self.operators:
            with operator_context(op):
                op.layer = self._create_layer(op)
                op.layer.load_param(op.param_values())
                op.layer.load_model(op.weights())
        if self.fuse and self.floor == "fast":  # conv -> add -> relu becomes one operator
            fusion.fuse(self)
        self.operators = self.topological_order()
        self._free_after = self._liveness()
        self._steps = self._run_list()
        self._shape_plans.clear()
        self._memory_plans.clear()
        self._arenas.drop()
        traced = self._traced_input_shapes()
        if traced is not None:
            with at_build():
                self._shape_plan(traced, annotated=True)
            self._memory_plan(tuple(tuple(shape) for shape in traced))   # the first forward's
        else:                                   # sizes known only at run time
            for op in self.operators:
                with operator_context(op):
                    _layer(op).prepare(None)
        self.state = GraphState.COMPLETE        # last: a forward never sees a half-built graph
        log.info("built %s: %d operators, %d operands", self.param_path, len(self.operators),
                 len(self.operands))

    def _check_supported(self) -> None:
        registry = LayerRegisterer()
        missing = [op for op in self.operators
                   if op.type not in self._custom_layers and op.type not in registry]
        if missing:
            op = missing[0]
            others = sorted({m.type for m in missing[1:]} - {op.type})
            more = f" (unsupported too: {', '.join(others)})" if others else ""
            known = set(registry.types()) | set(self._custom_layers)
            raise UnsupportedOperatorError(
                f"{self.param_path}:{op.line}: {unsupported_message(op.type, known)}{more}",
                operator=op.label)

    def _needs_bin(self) -> bool:
        return any(op.attrs for op in self.operators)

    def _load_weights(self, op: RuntimeOperator) -> None:
        """Point each attribute at its bytes: a zero-copy view of the bin file's entry, in the
        buffer it was read into (weights="memory": every entry aligned) or over the memory map
        (weights="map"). Two cases are copied once, here: f16 / bf16 / f64 weights (the layers
        compute in float32), and, mapped, entries that pnnx placed at an address no multiple
        of the itemsize (it does not pad its zip), since BLAS would otherwise copy them on
        every call."""
        if not op.attrs:
            return
        binary = self._bin
        assert binary is not None, "_build opens the bin file when an operator has attributes"
        for key, attr in op.attrs.items():
            entry = f"{op.name}.{key}"
            data = binary.read(entry, attr.shape, attr.dtype)
            if data.dtype.kind == "f" and data.dtype != np.float32:
                data = data.astype(np.float32)
                binary.release(entry)               # the file's pages are not read again
            elif not data.flags.aligned:
                data = np.require(data, requirements="A")
                data.flags.writeable = False
                binary.release(entry)
            attr.data = data

    def _check_weight_copies(self, op: RuntimeOperator) -> None:
        """The Attributes a module read as inputs (infer/rewrite.py) must hold its weights."""
        for copy in op.weight_copies:
            self._load_weights(copy)
            for attr in copy.attrs.values():
                data = attr.data
                if data is None or not any(
                        own.data is not None and own.data.shape == data.shape
                        and np.array_equal(own.data, data) for own in op.attrs.values()):
                    raise GraphError(
                        f"{self.param_path}:{op.line}: {op.label} reads {copy.label} (line "
                        f"{copy.line}) as an input, shaped as one of its weights but holding "
                        f"other values; a {op.type} takes one input", operator=op.label)

    def topological_order(self, on_visit: Callable[[str, RuntimeOperator], None] | None = None
                          ) -> list[RuntimeOperator]:
        """The operators in run order, by a reverse depth-first search (KuiperInfer): visit
        every operator reachable from the operators with no inputs (pnnx.Input,
        pnnx.Attribute), append it after all its consumers, then reverse. Meeting an operator
        still being visited means a cycle. build() stores this order in ``operators``.

        ``on_visit(event, op)``, if given, watches the search: "enter" when it reaches ``op``,
        "seen" when it meets ``op`` again as a consumer that has already finished, "finish"
        when every consumer of ``op`` is done and ``op`` joins the post order."""
        if self.state is GraphState.NEED_INIT:
            self.init()
        return self._depth_first_order(on_visit)

    def _depth_first_order(self, on_visit: Callable[[str, RuntimeOperator], None] | None = None
                           ) -> list[RuntimeOperator]:
        """topological_order's search, on ``operators`` as they are now."""
        notify = on_visit or (lambda event, op: None)
        WHITE, GREY, BLACK = 0, 1, 2
        colour = {id(op): WHITE for op in self.operators}
        post_order: list[RuntimeOperator] = []

        def visit(root: RuntimeOperator) -> None:
            stack = [(root, iter(_successors(root)))]      # iterative: deep graphs are fine
            colour[id(root)] = GREY
            notify("enter", root)
            while stack:
                op, successors = stack[-1]
                nxt = next(successors, None)
                if nxt is None:
                    stack.pop()
                    colour[id(op)] = BLACK
                    post_order.append(op)
                    notify("finish", op)
                elif colour[id(nxt)] == GREY:
                    raise GraphError(
                        f"{self.param_path}:{nxt.line}: the graph has a cycle through "
                        f"{nxt.label} (reached again from {op.label})", operator=nxt.label)
                elif colour[id(nxt)] == WHITE:
                    colour[id(nxt)] = GREY
                    notify("enter", nxt)
                    stack.append((nxt, iter(_successors(nxt))))
                else:
                    notify("seen", nxt)

        for op in self.operators:
            if not op.inputs and colour[id(op)] == WHITE:
                visit(op)
        unreached = [op for op in self.operators if colour[id(op)] == WHITE]
        if unreached:
            op = unreached[0]
            raise GraphError(
                f"{self.param_path}:{op.line}: {op.label} cannot be reached from any input "
                f"(it lies on a cycle or depends on one)", operator=op.label)
        post_order.reverse()
        return post_order

    def _liveness(self) -> list[list[str]]:
        """For each operator (in run order), the operands whose last consumer it is."""
        keep = {o.name for o in self.output_operands}
        last_use: dict[str, int] = {}
        for position, op in enumerate(self.operators):
            for src in op.inputs:
                last_use[src.name] = position
        for position, op in enumerate(self.operators):    # outputs nobody reads: at once
            for out in op.outputs:
                last_use.setdefault(out.name, position)
        free_after: list[list[str]] = [[] for _ in self.operators]
        for name, position in last_use.items():
            if name not in keep:
                free_after[position].append(name)
        return free_after

    def _run_list(self) -> list[RunStep]:
        """One RunStep per operator to run (not pnnx.Input / pnnx.Output), with all forward()
        needs worked out once. A step may run in place when its layer supports it and
        nobody else reads its input: one consumer, not a graph input (the caller's array)
        nor a graph output; at run time the array must also be writeable."""
        outputs = {o.name for o in self.output_operands}
        steps = []
        for op, free in zip(self.operators, self._free_after):
            if op.type in (INPUT_TYPE, OUTPUT_TYPE):      # fed by forward / a sink
                continue
            layer = _layer(op)
            source = op.inputs[0] if len(op.inputs) == 1 else None
            in_place = (layer.support_inplace and len(op.outputs) == 1 and source is not None
                        and len(source.consumers) == 1 and source.producer is not None
                        and source.producer.type != INPUT_TYPE and source.name not in outputs)
            steps.append(RunStep(op, layer, tuple(o.name for o in op.inputs),
                                 tuple(o.name for o in op.outputs), tuple(free), in_place,
                                 layer.support_forward_into))
        return steps

    # ---------------------------------------------------------------- shapes
    def _traced_input_shapes(self) -> list[Shape] | None:
        shapes: list[Shape] = []
        for op in self.input_operators:
            shape = op.outputs[0].shape
            if shape is None or any(d is None for d in shape):
                return None
            shapes.append(tuple(int(d) for d in shape if d is not None))
        return shapes

    def _shape_plan(self, input_shapes: Sequence[Shape], annotated: bool = False
                    ) -> dict[str, Shape]:
        """Every operand's shape for these input shapes, each layer computing its own output
        shapes (MNN's onResize). Cached per input shapes; ShapeError names the operator.
        ``annotated``: these are the traced shapes, and each operator's outputs must agree
        with the file's '#' annotations (checked as each is computed, so that a mis-exported
        operator is named, not the first one its wrong shape trips)."""
        key = tuple(input_shapes)
        plan = self._shape_plans.get(key)
        if plan is not None:
            return plan
        if len(key) != len(self.input_operators):
            names = ", ".join(op.name for op in self.input_operators)
            raise ShapeError(f"the graph takes {len(self.input_operators)} input shape(s) "
                             f"({names}), got {len(key)}")
        for op, shape in zip(self.input_operators, key):
            if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
                raise ShapeError(f"input {op.name}: a shape is a tuple of sizes >= 0, got "
                                 f"{shape}")
        with threads.setup(self.num_threads, self.helpers):  # layers pack their weights
            shapes = self._compute_shapes(input_shapes, annotated)
        with self._plan_lock:
            if len(self._shape_plans) >= MAX_SHAPE_PLANS:      # forget the oldest input size
                self._shape_plans.pop(next(iter(self._shape_plans)))
            self._shape_plans[key] = shapes
        return shapes

    def _compute_shapes(self, input_shapes: Sequence[Shape], annotated: bool = False
                        ) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {op.outputs[0].name: tuple(shape)
                                    for op, shape in zip(self.input_operators, input_shapes)}
        known: dict[str, np.ndarray] = {}    # values computable before running: shape maths
        for op in self.operators:
            if op.type in (INPUT_TYPE, OUTPUT_TYPE):      # given above / a sink
                continue
            in_shapes = [shapes[o.name] for o in op.inputs]
            in_values = [known.get(o.name) for o in op.inputs]
            layer = _layer(op)
            with operator_context(op):
                outs = layer.infer_shapes_from(in_shapes, in_values)
                if len(outs) != len(op.outputs):
                    raise LayerError(f"computes {len(outs)} output shapes for "
                                     f"{len(op.outputs)} outputs")
                outs = [self._checked_shape(out, shape) for out, shape in zip(op.outputs, outs)]
                if annotated:
                    self._check_annotations(op, outs)
                layer.prepare(in_shapes)             # pack weights for this size, now
                values = layer.infer_values(in_shapes, in_values) or []
            for out, shape in zip(op.outputs, outs):
                shapes[out.name] = shape
            for out, value in zip(op.outputs, values):
                if value is not None:
                    known[out.name] = value
        return shapes

    def _checked_shape(self, operand: RuntimeOperand, shape: Sequence[int]) -> Shape:
        """A computed output shape as a tuple of ints, refused if a size is negative (a bad
        parameter, or 64-bit arithmetic that overflowed) or the operand would not fit in the
        memory budget (before anything computes or allocates it)."""
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            raise LayerError(f"computes the shape {_short(shape)} for {operand.name}, which "
                             f"is not a tuple of integers")
        sizes = tuple(int(d) for d in shape)
        if any(d < 0 for d in sizes):
            raise ShapeError(f"computes the shape {_short(sizes)} for {operand.name}: a "
                             f"negative size (a bad parameter, or a size too large for 64-bit "
                             f"integers that overflowed)")
        nbytes = math.prod(sizes) * counted_itemsize(operand.dtype)
        if nbytes > self.memory_budget:
            raise MemoryBudgetError(budget.over_budget(
                f"output {operand.name} of shape {_short(sizes)}", nbytes, self.memory_budget))
        return sizes

    def _check_annotations(self, op: RuntimeOperator, computed: Sequence[Shape]) -> None:
        """The traced shapes a layer computes must agree with the file's '#' annotations."""
        for out, shape in zip(op.outputs, computed):
            declared = out.shape
            if declared is None or any(d is None for d in declared):
                continue
            if tuple(declared) != tuple(int(d) for d in shape):
                raise ShapeError(
                    f"{self.param_path}:{op.line}: operand {out.name} is annotated "
                    f"{tuple(declared)} but {op.label} computes {tuple(shape)} from its "
                    f"inputs (a mis-exported operator, or a layer that disagrees with torch)",
                    operator=op.label)

    def infer_shapes(self, *input_shapes: Shape) -> dict[str, Shape]:
        """Every operand's shape for the given input shapes, without running anything."""
        self._require_complete()
        return dict(self._shape_plan([tuple(s) for s in input_shapes]))

    # ---------------------------------------------------------------- memory
    def memory_plan(self, *input_shapes: Shape) -> MemoryPlan:
        """Which buffer each intermediate operand takes for these input shapes; print it for
        a table (infer.memory explains the plan)."""
        self._require_complete()
        return self._memory_plan(tuple(tuple(s) for s in input_shapes))

    def _memory_plan(self, input_shapes: tuple[Shape, ...]) -> MemoryPlan:
        """The memory plan for these input shapes (planning their shapes first, which refuses
        bad shapes); cached per input shapes as the shape plans are."""
        plan = self._memory_plans.get(input_shapes)
        if plan is None:
            shapes = self._shape_plan(input_shapes)
            keep = {o.name for o in self.output_operands}
            keep.update(op.outputs[0].name for op in self.input_operators)
            constants = {name for step in self._steps if not step.inputs
                         for name in step.outputs}
            dtypes = {name: operand.dtype for name, operand in self.operands.items()}
            inputs = [op.outputs[0].name for op in self.input_operators]
            plan = plan_memory(self._steps, shapes, dtypes, keep, constants, inputs)
            plan.arenas = self._arenas
            with self._plan_lock:
                if len(self._memory_plans) >= MAX_SHAPE_PLANS:
                    self._memory_plans.pop(next(iter(self._memory_plans)))
                self._memory_plans[input_shapes] = plan
        return plan

    # ---------------------------------------------------------------- forward
    def forward(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the graph on NCHW arrays given in pnnx.Input order; one array per output."""
        self.reach_fast_floor()
        with self.running():
            # refuses bad shapes; a new size's plan packs weights with the helpers' help
            run = self.execute(*inputs).run_all()
        return run.outputs()

    def execute(self, *inputs: np.ndarray, keep_all: bool = False, hooks: bool = True,
                timed: bool = False) -> Execution:
        """The forward pass as an iterator: inputs checked, shapes and memory planned, nothing
        run yet; each ``next`` runs one operator and yields ``(step, inputs, outputs,
        seconds)`` (infer/execution.py). ``keep_all`` keeps every operand and runs isolated:
        an in-place step writes into a copy of its input, a forward_into step into new arrays
        (not the arena, whose buffers later steps reuse), so every kept value stays what its
        step computed. ``hooks``: run the graph's hooks (add_hook, verbose) around each
        operator, isolated too. ``timed``: measure each layer call. Iterate it under
        ``running()``, as forward does."""
        self._require_complete()
        arrays = self.check_inputs(*inputs)
        memory = self._memory_plan(tuple(a.shape for a in arrays))
        hooked = self._hooks if hooks else ()
        self._check_budget(memory, arrays, keep_all, isolated=keep_all or bool(hooked))
        given = {op.outputs[0].name: x for op, x in zip(self.input_operators, arrays)}
        return Execution(self._steps, memory, given, [o.name for o in self.output_operands],
                         keep_all=keep_all, hooks=hooked, timed=timed)

    def _check_budget(self, memory: MemoryPlan, arrays: list[np.ndarray], keep_all: bool,
                      isolated: bool = False) -> None:
        """Refuse a pass whose arrays would exceed the memory budget: the plan's peak (or all
        its operands, when ``keep_all`` keeps them), or its arena if that is larger. The idle
        arenas kept for later calls count too (all of each: the one this pass reuses stays
        as large as it is), less the memory of the one it would reuse that it writes into,
        buffer by buffer (its plan's arena counted already), and are let go first when they
        are what makes the difference. An ``isolated`` pass (every operand kept, or hooks
        run) takes no arena: it reuses none."""
        needed = memory.total_bytes if keep_all else max(memory.peak_bytes, memory.arena_bytes)
        reused = 0 if isolated else self._arenas.reusable_bytes(memory.written_sizes)
        if needed + self._arenas.idle_bytes() - reused > self.memory_budget:
            self._arenas.drop()
        if needed > self.memory_budget:
            shapes = ", ".join(_short(a.shape) for a in arrays)
            what = ("keeping every operand" if keep_all
                    else f"its peak is at {memory.peak_step}")
            raise MemoryBudgetError(budget.over_budget(
                f"a forward pass on input shapes {shapes} ({what})", needed,
                self.memory_budget), operator=None if keep_all else memory.peak_step)

    def running(self) -> Running:
        """What a forward pass runs under (``with g.running():``): this graph's thread cap
        (and helper threads, on the fast floor), and numpy's floating-point warnings off (NaN
        and Inf flow through silently, as in torch)."""
        return Running(self)

    def reach_fast_floor(self) -> None:
        """Move to the fast floor if its kernels, compiled in the background since build,
        are ready now: what forward does before each pass (and profile before its own)."""
        if self._kernels_missing == "compiling":
            self._move_to_fast_floor()

    def _move_to_fast_floor(self) -> None:
        """Once the fast kernels compiled in the background are ready, remake the layers on
        the fast floor (weights as read at build, fusion, plans), between two passes: not
        while another thread runs one (the next forward tries again)."""
        from layers import fast

        started = fast.start(wait=False)
        if started in (fast.COMPILING, fast.FAILED):
            self._kernels_missing = started
            return
        with self._build_lock, self._running_lock:
            if (self._running or self._kernels_missing is None
                    or self.state is not GraphState.COMPLETE):
                return
            self._kernels_missing = None
            try:
                with threads.setup(self.num_threads, self.helpers), _collector_paused():
                    self._make_layers()
            except Exception as exc:
                # fusion may have rewired the operators: build anew from the files, on the
                # reference floor for good
                log.warning("%s stays on the reference floor: its fast layers failed (%s)",
                            self.param_path, exc)
                self._fast_failed = True
                self.close()
                self.build()
                return
        log.info("%s moved to the fast floor", self.param_path)

    @property
    def run_list(self) -> list[RunStep]:
        """The steps execute() runs, one per operator in run order (not pnnx.Input / Output)."""
        self._require_complete()
        return list(self._steps)

    def check_inputs(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """The arrays forward runs on, in pnnx.Input order. Count and rank must match; an
        array of the same kind as the input's declared dtype is cast to it (any floating array
        to a float32 input, any integer array to an i64 input); other kinds are refused (an
        int array for a float32 input, a float array for an integer input, bool, complex or
        object arrays where not declared); non-contiguous arrays are made contiguous (the
        caller's array is never written)."""
        if len(inputs) != len(self.input_operators):
            names = ", ".join(op.name for op in self.input_operators)
            raise ShapeError(f"the graph takes {len(self.input_operators)} input(s) ({names}), "
                             f"got {len(inputs)}")
        arrays = []
        for op, x in zip(self.input_operators, inputs):
            operand = op.outputs[0]
            if isinstance(x, np.generic):               # a numpy scalar: a 0-d array
                x = np.asarray(x)
            if not isinstance(x, np.ndarray):
                raise ShapeError(f"input {op.name} must be a numpy array, got "
                                 f"{type(x).__name__}", operator=op.label)
            want = input_dtype(operand.dtype)
            if INPUT_KINDS.get(x.dtype.kind, "other") != INPUT_KINDS[want.kind]:
                raise ShapeError(f"input {op.name} has dtype {x.dtype}; this input takes {want} "
                                 f"(arrays of the same kind, floating or integer, are cast; "
                                 f"others are refused)", operator=op.label)
            if operand.shape is not None and x.ndim != len(operand.shape):
                raise ShapeError(f"input {op.name} has shape {_short(x.shape)} (rank {x.ndim}); "
                                 f"the model was traced with {_fmt(operand.shape)} "
                                 f"(rank {len(operand.shape)})", operator=op.label)
            if x.dtype != want or not x.flags.c_contiguous:     # a copy: within the budget
                nbytes = x.size * want.itemsize
                if nbytes > self.memory_budget:
                    raise MemoryBudgetError(budget.over_budget(
                        f"input {op.name} of shape {_short(x.shape)} (made contiguous "
                        f"{want})", nbytes, self.memory_budget), operator=op.label)
            # np.asarray with order "C" keeps a 0-d array 0-d (ascontiguousarray makes it 1-d)
            arrays.append(np.asarray(x, dtype=want, order="C"))
        return arrays

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.forward(*inputs)

    # ---------------------------------------------------------------- threads, housekeeping
    def set_num_threads(self, n: int | None) -> None:
        """The threads this graph's forward uses: ``n`` (the calling thread and n - 1 helper
        threads sharing each kernel, layers/fast/workers.py; numba's and BLAS's own pools
        capped), or None for every usable core."""
        if n is not None and (not isinstance(n, int) or n < 1):
            raise GraphError(f"set_num_threads needs a positive integer, got {n!r}")
        self.num_threads = n
        if n is not None:
            threads.prepare()              # the one-time costs, here rather than in forward

    def _require_complete(self) -> None:
        """Refuse to run a graph that is not built, or whose memory-mapped weights file has
        changed on disk since build (weights="map"): the map would read the new bytes, or
        kill the process with SIGBUS past a truncated end."""
        if self.state is not GraphState.COMPLETE:
            raise GraphError(f"the graph {self.state.value}: call build() before forward()")
        if self._bin is not None and not self._bin.in_memory:
            why = self._bin.changed()
            if why is not None:
                raise GraphError(
                    f"{self.bin_path}: the weights file changed since build() ({why}); this "
                    f"graph maps it and would read the new bytes. Build a new RuntimeGraph "
                    f"(the default weights='memory' reads the file once and is not affected)")

    def close(self) -> None:
        """Release the weights and the bin file (the graph cannot run afterwards; build()
        starts again from the files)."""
        for op in self.operators:
            for attr in op.attrs.values():
                attr.data = None
            op.layer = None
        if self._bin is not None:
            self._bin.close()
            self._bin = None
        self._steps = []
        self._shape_plans.clear()
        self._memory_plans.clear()
        self._arenas.drop()
        self._kernels_missing = None
        self.state = GraphState.NEED_INIT

    def __enter__(self) -> "RuntimeGraph":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def input_shapes(self) -> list[tuple[int | None, ...] | None]:
        """The shapes the model was traced with (None marks a dynamic dim)."""
        return [op.outputs[0].shape for op in self.input_operators]

    def operator(self, name: str) -> RuntimeOperator:
        """The operator called ``name``."""
        for op in self.operators:
            if op.name == name:
                return op
        raise GraphError(f"no operator named {name!r} in {self.param_path}")

    def __repr__(self) -> str:
        return (f"RuntimeGraph({Path(self.param_path).name}: {len(self.operators)} operators, "
                f"{len(self.operands)} operands, {self.state.value})")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a graph is read and built: it would scan
    every object made so far again and again (half the build time of a 200k-operator graph);
    what the build makes is kept anyway. Once done, the young generations are collected
    (the build's objects move to the oldest one, which is scanned rarely): otherwise that
    scan would fall into the first inference."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(1)


def _successors(op: RuntimeOperator) -> list[RuntimeOperator]:
    seen: dict[int, RuntimeOperator] = {}
    for out in op.outputs:
        for consumer in out.consumers:
            seen.setdefault(id(consumer), consumer)
    return list(seen.values())


def _default_bin_path(param_path: str) -> str:
    if param_path.endswith(".param"):
        return param_path[: -len(".param")] + ".bin"
    return param_path + ".bin"


def _layer(op: RuntimeOperator) -> Layer:
    """The operator's layer, which build() created."""
    assert op.layer is not None, f"{op.label} has no layer before build()"
    return op.layer


def _short(shape: Sequence[object], limit: int = 80) -> str:
    """A shape for a message, cut to ``limit`` characters (a hostile shape can be huge)."""
    text = "(" + ",".join(str(d) for d in shape) + ")"
    return text if len(text) <= limit else text[:limit - 5] + ",...)"


def _fmt(shape: Sequence[int | None]) -> str:
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"
