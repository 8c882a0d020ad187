"""Memory plan: which intermediate arrays can share a buffer, and the arena that holds them.

ncnn and MNN take the blobs of a forward pass from a pool that reuses memory as soon as a
blob's last consumer has run. Here the same reuse is planned ahead, from the run order, the
liveness lists and the shapes, and can be printed:

    plan = graph.memory_plan((1, 3, 224, 224))
    print(plan)        # operand, shape, bytes, buffer, live range; arena bytes vs all intermediates

Planning (``plan_memory``)
  - An intermediate operand lives from the step that writes it to the step of its last reader.
    Graph inputs and outputs, constants (operators without inputs) and operands whose dtype
    the param file does not give are not planned.
  - A step that runs in place writes its output over its input: the two share one buffer,
    which lives until the last of them has been read. A view of an operand (a reshape, a
    slice, a split: ``Layer.views_input``) shows its memory: that buffer lives until the
    last view of it has been read too.
  - Walking the steps in order, each new operand takes the smallest free buffer that is big
    enough (best fit); if none is, the largest free buffer grows to its size; if no buffer is
    free, a new one opens. After the step, every buffer whose operands are all dead is free.
    A step's outputs never take its inputs' buffers: the inputs are read while it writes.
  - Joins (a cat's inputs written in place): where every dim before a cat's dim has size 1
    (a batch-1 cat of NCHW maps along channels), each input is a contiguous piece of the
    cat's output. An input that a forward_into step writes and that nobody reads after the
    cat is planned as that piece of the output's buffer: its producer writes it there and
    the cat copies only the inputs it finds elsewhere. The pieces of a split or chunk that
    the cat takes in order are planned so too, through the operand they were cut from. The
    output's buffer lives from the step that writes its first piece to the output's last
    reader. No join where a step runs in place over the cat's output.

Running (``Arena``, ``ArenaPool``)
  A forward call takes an arena, one set of buffers, for itself alone (calls from several
  threads never share one) and gives it back to its graph's pool at the end. Only layers that
  can write into given arrays (``Layer.forward_into``) use it; a buffer is allocated the first
  time such a layer needs it, in fresh pages (parser/pages.py), so buffers reserved for layers
  that allocate their own outputs cost nothing. numpy counts the owners of every array, so a
  buffer still seen from outside the arena - through a view that outlived its operand (a
  reshape of it), or an output the caller kept - is not handed out again while it is: the
  step gets a fresh array instead. A join's pieces are written by several steps: the first
  of them checks the buffer, and then every piece (and the cat's output) gets its place in
  it, or all get fresh arrays (the cat then copies them). A cat whose every input was
  handed its place has nothing left to do: the execution loop does not call it.
  The pool's arenas serve every input size: a call at a new size takes an idle arena made
  for another and fits it to its plan (``Arena.fit``), keeping each buffer that is big
  enough. Buffer i of one size's plan is mostly buffer i of another's, scaled, so after a
  few sizes each buffer has its largest size and a new size maps no fresh pages: a graph fed
  images of many sizes (a text detector, a folder of photos) holds one arena per concurrent
  call, not one per size.

Arrays outside the plan
  Layers that return new arrays allocate the same sizes in every forward; glibc would map
  fresh pages for them each time. ``keep_freed_memory`` (once per process, at a build) asks
  it to keep freed blocks mapped instead.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from parser.pages import fresh_pages
from parser.bin import DTYPES
from parser.param import NULL_DTYPE

if TYPE_CHECKING:
    from infer.execution import RunStep

Shape = tuple[int, ...]

MAX_POOLED_ARENAS = 4        # idle arenas a graph keeps between calls (one per concurrent
                             # caller), whatever input sizes they were last used for
MAX_ARENA_ARRAYS = 1024      # slot arrays an arena keeps made (slots of many sizes' plans)
# how a step fills an operand's memory: writes into its buffer, over its input, allocates its
# own; a cat whose inputs were written into their pieces of its output (see Joins)
INTO, IN_PLACE, OWN, JOINED = "into", "in place", "layer", "joined"
# what forward_into writes: layers that write into given arrays compute in float32 (the
# execution loop calls forward_into only when the inputs are float32 too)
INTO_DTYPE = np.dtype(np.float32)


@dataclass(frozen=True, eq=False)
class Slot:
    """Where one output of a forward_into step goes: a buffer of the arena (-1: a fresh
    array, for graph outputs and operands the plan does not cover), from ``offset`` bytes on.
    ``join`` names the cat output whose piece (``piece``) or whole it is, "" for none; the
    whole's ``pieces`` counts its pieces where they are all the cat's inputs, else 0. Each
    slot is its own key (compared by identity: an arena keeps an array per slot of its
    plan)."""

    buffer: int
    shape: Shape
    dtype: np.dtype
    offset: int = 0
    join: str = ""
    piece: bool = False
    pieces: int = 0


class PlannedOperand(NamedTuple):
    """One row of the plan."""

    name: str
    shape: Shape
    dtype: np.dtype
    nbytes: int
    buffer: int
    first: int          # step that writes it
    last: int           # step of its last reader (of the last array sharing its buffer)
    how: str            # INTO: the layer writes into the buffer; IN_PLACE; OWN: it allocates;
                        # JOINED: a cat whose inputs' producers wrote its pieces
    writer: str         # the operator that writes it
    offset: int = 0     # where it starts in its buffer (bytes): a piece of a cat's output
    piece_of: str = ""  # that cat's output ("" for none)


class MemoryPlan:
    """Buffers for the intermediate operands of one set of input shapes (see the module
    docstring). ``str(plan)`` is a table; in a notebook the plan shows as an HTML table."""

    def __init__(self, operands: list[PlannedOperand], buffer_sizes: list[int],
                 step_slots: list[tuple[Slot, ...] | None],
                 live: tuple[int, str, int] = (0, "", 0)):
        self.operands = operands
        self.buffer_sizes = buffer_sizes
        self.step_slots = step_slots        # per step: where a forward_into step writes
        # what the layers write into each buffer: less than its planned size where the
        # largest operand planned in it comes from a layer that allocates its own (OWN),
        # and the arenas take no more (their pages are mapped in when made: parser/pages.py)
        self.written_sizes = [0] * len(buffer_sizes)
        for slots in step_slots:
            for slot in slots or ():
                if slot.buffer >= 0:
                    self.written_sizes[slot.buffer] = max(
                        self.written_sizes[slot.buffer],
                        slot.offset + math.prod(slot.shape) * slot.dtype.itemsize)
        # the most bytes alive at once in a forward pass, the step where that happens, and
        # the bytes of every operand together (what a pass that keeps them all holds)
        self.peak_bytes, self.peak_step, self.total_bytes = live
        # where its forward calls take their arenas: its graph's pool (shared by the plans of
        # every input size), or one of its own
        self.arenas = ArenaPool()

    @property
    def arena_bytes(self) -> int:
        """Bytes of all the buffers: the memory every intermediate would need if every layer
        wrote into the arena."""
        return sum(self.buffer_sizes)

    @property
    def intermediate_bytes(self) -> int:
        """Bytes of all intermediate operands together: what keeping every one would take."""
        return sum(o.nbytes for o in self.operands)

    # ----- the arenas of forward calls ----------------------------------------------------------
    def take_arena(self) -> "Arena":
        """An arena for one forward call, fitted to this plan (from the pool, or a new one)."""
        arena = self.arenas.take(self.written_sizes)
        arena.fitted_for = self
        arena.joins.clear()                 # a new call: none of its joins has begun
        return arena

    def give_back(self, arena: "Arena") -> None:
        self.arenas.give_back(arena)

    @property
    def pooled_bytes(self) -> int:
        """Bytes held by the idle arenas last fitted to this plan."""
        return self.arenas.idle_bytes(self)

    # ----- display -------------------------------------------------------------------------------
    HEADER = ("operand", "shape", "dtype", "bytes", "buffer", "live (steps)", "filled",
              "written by")

    def rows(self) -> list[tuple[str, ...]]:
        return [(o.name, "x".join(map(str, o.shape)) or "()", str(o.dtype), f"{o.nbytes:,}",
                 f"{o.buffer}+{o.offset:,}" if o.offset else str(o.buffer),
                 f"{o.first}..{o.last}", f"{o.how}, piece of {o.piece_of}" if o.piece_of
                 else o.how, o.writer) for o in self.operands]

    def summary(self) -> str:
        arena, total = self.arena_bytes, self.intermediate_bytes
        saving = f", {total / arena:.1f}x less" if arena else ""
        into = sum(o.how == INTO for o in self.operands)
        joined = sum(o.how == JOINED for o in self.operands)
        return (f"{len(self.operands)} intermediate operands, {_mib(total)} together; planned "
                f"arena {_mib(arena)} in {len(self.buffer_sizes)} buffers{saving}; peak of a "
                f"forward pass {_mib(self.peak_bytes)} (at {self.peak_step}). "
                f"{into} operands are written into the arena by their layers now "
                f"(forward_into); in place: {sum(o.how == IN_PLACE for o in self.operands)}"
                + (f"; cats with inputs written in place: {joined}." if joined else "."))

    def __str__(self) -> str:
        rows = [self.HEADER, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.HEADER))]
        right = {3, 4}                                     # numbers align right
        lines = ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                           for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines + ["", self.summary()])

    def _repr_html_(self) -> str:
        import html              # here: only a notebook's display needs it, not a load

        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                       for row in self.rows())
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<p>{html.escape(self.summary())}</p>")

    def __repr__(self) -> str:
        return f"MemoryPlan({self.summary()})"


ALIGNMENT = 64       # bytes: every buffer starts on a cache line, so that a vector of 16
                     # floats read from the start of a row lies in one line, not two


class Arena:
    """The buffers of one forward call at a time (see the module docstring): ``sizes`` are
    the bytes its plan writes into each (``MemoryPlan.written_sizes``)."""

    def __init__(self, sizes: Sequence[int] = ()):
        self.sizes: list[int] = []
        self.buffers: list[np.ndarray | None] = []
        # each slot's array over its buffer, made at its first use: every later call hands
        # out a view of it (one numpy call, where slicing, viewing and reshaping are three)
        self._arrays: dict[Slot, np.ndarray] = {}
        # what sys.getrefcount says of a buffer nobody outside the arena reads: the list
        # above and the argument (``_own_refs``, counted when the buffer is made), and one
        # per array of _arrays over it
        self._own_refs: list[int] = []
        self._idle_refs: list[int] = []
        # the joins this call has begun: cat output -> the pieces handed out over its
        # buffer so far, or -1 where the buffer was held (fresh arrays for all)
        self.joins: dict[str, int] = {}
        self.fitted_for: MemoryPlan | None = None      # the plan it last served (pooled_bytes)
        self.fit(sizes)

    def fit(self, sizes: Sequence[int]) -> None:
        """Serve a plan whose buffers take ``sizes`` bytes: a buffer the arena has that is big
        enough stays, with the arrays made over it; a smaller one is let go (and made at the
        new size when first used)."""
        self.sizes = list(sizes)
        missing = len(self.sizes) - len(self.buffers)
        if missing > 0:
            self.buffers += [None] * missing
            self._own_refs += [0] * missing
            self._idle_refs += [0] * missing
        for i, size in enumerate(self.sizes):
            buffer = self.buffers[i]
            if buffer is not None and buffer.nbytes < size + ALIGNMENT:
                self.buffers[i] = None
                self._arrays = {slot: a for slot, a in self._arrays.items() if slot.buffer != i}

    def holds(self, sizes: Sequence[int]) -> bool:
        """Whether every buffer of ``sizes`` is already here, big enough."""
        for i, size in enumerate(sizes):
            buffer = self.buffers[i] if i < len(self.buffers) else None
            if size and (buffer is None or buffer.nbytes < size + ALIGNMENT):
                return False
        return True

    def array(self, slot: Slot) -> np.ndarray:
        """An array of ``slot``'s shape and dtype over its buffer, or a fresh one if the
        buffer is still referenced from outside the arena (or the slot has none). The pieces
        of a join follow the first one asked for in this call."""
        if slot.buffer < 0:
            return np.empty(slot.shape, slot.dtype)
        made = self._arrays.get(slot)
        if made is None:
            if len(self._arrays) >= MAX_ARENA_ARRAYS:      # slots of plans long gone
                self._arrays.clear()             # (an array still held outside counts on)
                self._idle_refs = list(self._own_refs)
            made = self._arrays[slot] = self._make(slot)
        if not slot.join:        # the buffer is free if only the arena's own arrays hold it
            if sys.getrefcount(self.buffers[slot.buffer]) > self._idle_refs[slot.buffer]:
                return np.empty(slot.shape, slot.dtype)
            return made.view()
        given = self.joins.get(slot.join)                 # decided at the first piece
        if given is None:
            free = sys.getrefcount(self.buffers[slot.buffer]) <= self._idle_refs[slot.buffer]
            given = 0 if free else -1
        if given < 0:
            self.joins[slot.join] = given
            return np.empty(slot.shape, slot.dtype)
        self.joins[slot.join] = given + slot.piece
        return made.view()

    def joined(self, slot: Slot) -> bool:
        """Whether ``slot`` is the whole of a join whose every piece - every input of its
        cat - was handed its place in this call: the cat has nothing to copy."""
        return slot.pieces > 0 and self.joins.get(slot.join) == slot.pieces

    def _make(self, slot: Slot) -> np.ndarray:
        """``slot``'s array over its buffer (allocated now if it is the buffer's first)."""
        if self.buffers[slot.buffer] is None:   # ALIGNMENT bytes more, to start on a boundary
            self.buffers[slot.buffer] = fresh_pages(self.sizes[slot.buffer] + ALIGNMENT)
            self._own_refs[slot.buffer] = sys.getrefcount(self.buffers[slot.buffer])
            self._idle_refs[slot.buffer] = self._own_refs[slot.buffer]
        buffer = self.buffers[slot.buffer]
        assert buffer is not None
        start = -buffer.ctypes.data % ALIGNMENT + slot.offset
        nbytes = math.prod(slot.shape) * slot.dtype.itemsize
        made = buffer[start:start + nbytes].view(slot.dtype).reshape(slot.shape)
        self._idle_refs[slot.buffer] += 1   # ``made`` holds the buffer too
        return made

    @property
    def allocated_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b is not None)


class ArenaPool:
    """The idle arenas of one graph's forward calls (see the module docstring): ``take``
    one fitted to a plan's buffer sizes, ``give_back`` it after the call; the pool keeps the
    MAX_POOLED_ARENAS given back last."""

    def __init__(self) -> None:
        self._idle: list[Arena] = []
        self._lock = threading.Lock()

    def take(self, sizes: Sequence[int]) -> Arena:
        """The idle arena given back last among those that hold ``sizes`` already, else the
        one given back last, fitted to ``sizes``; a new arena if none is idle."""
        with self._lock:
            arena = self._choose(sizes, remove=True)
        if arena is None:
            return Arena(sizes)
        arena.fit(sizes)
        return arena

    def _choose(self, sizes: Sequence[int], remove: bool) -> Arena | None:
        for i in range(len(self._idle) - 1, -1, -1):
            if self._idle[i].holds(sizes):
                return self._idle.pop(i) if remove else self._idle[i]
        if not self._idle:
            return None
        return self._idle.pop() if remove else self._idle[-1]

    def give_back(self, arena: Arena) -> None:
        with self._lock:
            self._idle.append(arena)
            if len(self._idle) > MAX_POOLED_ARENAS:
                del self._idle[0]

    @property
    def idle(self) -> list[Arena]:
        """The idle arenas, the one given back last at the end."""
        with self._lock:
            return list(self._idle)

    def drop(self) -> None:
        """Let the idle arenas go (their memory returns when no call uses them)."""
        with self._lock:
            self._idle = []

    def idle_bytes(self, plan: "MemoryPlan | None" = None) -> int:
        """Bytes of the idle arenas (those last fitted to ``plan``, if given)."""
        with self._lock:
            return sum(a.allocated_bytes for a in self._idle
                       if plan is None or a.fitted_for is plan)

    def reusable_bytes(self, sizes: Sequence[int]) -> int:
        """Of the arena ``take(sizes)`` would hand out, the bytes a call that writes
        ``sizes`` would write into, buffer by buffer (0 if it would make one; the pool may
        change before the call takes it)."""
        with self._lock:
            arena = self._choose(sizes, remove=False)
            if arena is None:
                return 0
            return sum(min(buffer.nbytes, size) for buffer, size in zip(arena.buffers, sizes)
                       if buffer is not None)


# ----- planning ---------------------------------------------------------------------------------

def plan_memory(steps: Sequence[RunStep], shapes: dict[str, Shape],
                dtypes: dict[str, str | None], keep: set[str], constants: set[str],
                inputs: Sequence[str] = ()) -> MemoryPlan:
    """Assign every intermediate operand of ``steps`` (the graph's run list) a buffer, as the
    module docstring describes. ``shapes``: the shape plan; ``dtypes``: pnnx dtype names
    (None: unknown); ``keep``: graph inputs and outputs; ``constants``: outputs of steps
    without inputs; ``inputs``: the graph inputs' names. Returns the plan with, per
    forward_into step, the slots its outputs go to, and the peak (``peak_live``)."""
    planned = {name for step in steps for name in step.outputs
               if name not in keep and name not in constants and dtypes.get(name) in DTYPES}
    last = _last_reads(steps)
    group = _in_place_groups(steps, planned)          # operand -> the operand owning its memory
    end: dict[str, int] = {}                          # owner -> step after which it is free
    for name, owner in group.items():
        end[owner] = max(end.get(owner, 0), len(steps) if name in keep else last[name])
    for name, owner in _views(steps, group).items():  # views keep the memory they show
        end[owner] = max(end[owner], len(steps) if name in keep else last[name])
    pieces, complete = _plan_joins(steps, shapes, dtypes, group, end)
    joined = {cat for cat, _ in pieces.values()}      # the cats' outputs

    sizes: list[int] = []
    free: list[int] = []                              # buffer ids
    buffer_of: dict[str, int] = {}
    ending: dict[int, list[int]] = {}                 # step -> buffers free after it
    rows: list[PlannedOperand] = []
    for index, step in enumerate(steps):
        for name in step.outputs:
            if name not in planned:
                continue
            dtype = DTYPES[str(dtypes[name])]              # planned: a dtype DTYPES knows
            nbytes = math.prod(shapes[name]) * dtype.itemsize
            owner = group[name]
            if owner != name:                         # in place: the input's buffer
                buffer = buffer_of[owner]
                sizes[buffer] = max(sizes[buffer], nbytes)
                how = IN_PLACE
            elif name in pieces or name in joined:    # a piece of a cat's output, or the output
                output = pieces[name][0] if name in pieces else name
                if output not in buffer_of:           # its first piece: the output's buffer
                    buffer_of[output] = _best_fit(_float32_bytes(shapes[output]), free, sizes)
                    ending.setdefault(end[output], []).append(buffer_of[output])
                buffer = buffer_of[output]
                how = JOINED if name in joined else INTO
            else:
                buffer = _best_fit(nbytes, free, sizes)
                ending.setdefault(end[owner], []).append(buffer)
                how = INTO if step.into else OWN
            buffer_of[name] = buffer
            piece_of, offset = pieces.get(owner, ("", 0))
            rows.append(PlannedOperand(name, shapes[name], dtype, nbytes, buffer, index,
                                       end[owner], how, step.label, offset, piece_of))
        free.extend(ending.pop(index, []))

    def slot(name: str) -> Slot:
        join, offset = pieces.get(name, (name if name in joined else "", 0))
        return Slot(buffer_of.get(name, -1), shapes[name], INTO_DTYPE, offset, join,
                    name in pieces, complete.get(name, 0))

    slots = [tuple(slot(name) for name in step.outputs) if _writes_into(step, dtypes) else None
             for step in steps]
    return MemoryPlan(rows, sizes, slots, peak_live(steps, shapes, dtypes, inputs))


def _plan_joins(steps: Sequence[RunStep], shapes: dict[str, Shape],
                dtypes: dict[str, str | None], group: dict[str, str], end: dict[str, int]
                ) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """Operand -> (cat output, byte offset): the operands planned as pieces of a cat's output
    (Joins in the module docstring); and cat output -> its number of pieces, for the cats
    whose every input is (or is cut from) a piece. A piece is the owner of an input's memory
    (``group``), or of the operand a split cut the cat's consecutive inputs from; it is
    written by a forward_into step, read by nobody after the cat (``end``), and a piece of
    one cat only.
    The cat's output must be written into the arena, and nothing may run in place over it
    (that would change what views of its pieces read)."""
    into = {name for step in steps if _writes_into(step, dtypes) for name in step.outputs}
    written_over = {owner for name, owner in group.items() if name != owner}
    producer = {name: step for step in steps for name in step.outputs}
    pieces: dict[str, tuple[str, int]] = {}
    covered: tuple[str, ...]
    joined: set[str] = set()
    complete: dict[str, int] = {}
    for index, step in enumerate(steps):
        out = step.outputs[0] if step.outputs else ""
        shape = shapes.get(out, ())
        axis = step.layer.joins_along(len(shape)) if shape else None
        if (axis is None or group.get(out) != out or out not in into or out in written_over
                or math.prod(shape[:axis]) != 1):
            continue
        row_bytes = _float32_bytes(shape[axis + 1:])  # bytes of one index along the axis
        offset, i, placed, copied = 0, 0, 0, 0
        while i < len(step.inputs):
            name = step.inputs[i]
            # the operand planned as a piece, and the cat's inputs it covers: the input's
            # memory owner, or what a split cut the next inputs from, in order, wholly
            source, covered = group.get(name), (name,)
            cut = producer.get(name)
            whole = shapes.get(cut.inputs[0], ()) if cut is not None and cut.inputs else ()
            if (cut is not None and len(whole) == len(shape)
                    and cut.layer.cuts_along(len(shape)) == axis
                    and step.inputs[i:i + len(cut.outputs)] == cut.outputs
                    and whole[axis] == sum(shapes[p][axis] for p in cut.outputs)):
                source, covered = group.get(cut.inputs[0]), cut.outputs
            size = sum(shapes[p][axis] for p in covered)
            if (source is not None and source in into and source not in pieces
                    and source not in joined and end[source] <= index
                    and all(p in group and end[group[p]] <= index for p in covered)
                    and _float32_bytes(shapes[source]) == size * row_bytes):
                pieces[source] = (out, offset * row_bytes)
                joined.add(out)
                placed += 1
            else:
                copied += 1
            offset += size
            i += len(covered)
        if placed and not copied:
            complete[out] = placed
    return pieces, complete


def _writes_into(step: RunStep, dtypes: dict[str, str | None]) -> bool:
    """Whether the step gets slots: it writes its outputs into given float32 arrays."""
    return step.into and not step.in_place and _float32(step.outputs, dtypes)


def _float32_bytes(shape: Sequence[int]) -> int:
    return math.prod(shape) * INTO_DTYPE.itemsize


def peak_live(steps: Sequence[RunStep], shapes: dict[str, Shape],
              dtypes: dict[str, str | None], inputs: Sequence[str]) -> tuple[int, str, int]:
    """The most bytes of operands alive at once in a forward pass, the step at which, and the
    bytes of all operands together: each operand lives from the step that writes it to its
    last reader (graph inputs from the start, outputs to the end) and counts at least 4 bytes
    per element (float32; a '#' dtype annotation is only a hint). In-place steps share memory
    and are counted twice: more than the truth, never less, for the operands."""
    def nbytes(name: str) -> int:
        return math.prod(shapes[name]) * counted_itemsize(dtypes.get(name))

    live = total = sum(nbytes(name) for name in inputs)
    peak, where = live, "the graph inputs"
    for step in steps:
        written = sum(nbytes(name) for name in step.outputs)
        live += written
        total += written
        if live > peak:
            peak, where = live, step.label
        live -= sum(nbytes(name) for name in step.free)
    return peak, where, total


def _float32(names: Sequence[str], dtypes: dict[str, str | None]) -> bool:
    """Whether the file annotates these operands as float32 or not at all. Only such outputs
    get slots: an annotation is a hint, checked, never a reason to round results (a step whose
    outputs the file calls f16 allocates its own float32 arrays)."""
    return all(dtypes.get(name) in (None, NULL_DTYPE, "f32") for name in names)


def _last_reads(steps: Sequence[RunStep]) -> dict[str, int]:
    """Operand -> the step after which it is dead: the step whose free list names it, or the
    step that writes it when nobody reads it."""
    last = {name: index for index, step in enumerate(steps) for name in step.outputs}
    for index, step in enumerate(steps):
        for name in step.free:
            last[name] = index
    return last


def _in_place_groups(steps: Sequence[RunStep], planned: set[str]) -> dict[str, str]:
    """Operand -> the planned operand whose buffer it lives in: itself, or for the output of
    an in-place step, its input's owner (chains of in-place steps share one buffer). A graph
    output written in place over an intermediate is listed too: it keeps that buffer alive
    to the end of the call."""
    owner: dict[str, str] = {}            # only operands that live in a planned buffer
    for step in steps:
        for name in step.outputs:
            source = step.inputs[0] if step.in_place else None
            if source in owner:
                owner[name] = owner[source]
            elif name in planned:
                owner[name] = name
    return owner


def _views(steps: Sequence[RunStep], group: dict[str, str]) -> dict[str, str]:
    """View operand -> the planned operand whose buffer it shows: the outputs of view steps
    (``Layer.views_input``) whose input lives in a planned buffer (``group``), or is such a
    view itself. A view that turns out to be a copy only keeps that buffer a while longer."""
    views: dict[str, str] = {}
    for step in steps:
        if step.layer.views_input and step.inputs:
            shown = views.get(step.inputs[0], group.get(step.inputs[0]))
            if shown is not None:
                for name in step.outputs:
                    views[name] = shown
    return views


def _best_fit(nbytes: int, free: list[int], sizes: list[int]) -> int:
    """Take the smallest free buffer of at least ``nbytes``; else grow the largest free one;
    else open a new buffer."""
    fitting = [b for b in free if sizes[b] >= nbytes]
    if fitting:
        buffer = min(fitting, key=lambda b: sizes[b])
    elif free:
        buffer = max(free, key=lambda b: sizes[b])
        sizes[buffer] = nbytes
    else:
        sizes.append(nbytes)
        return len(sizes) - 1
    free.remove(buffer)
    return buffer


def counted_itemsize(pnnx_dtype: str | None) -> int:
    """Bytes per element the memory budget counts for an operand whose file annotation says
    ``pnnx_dtype``: at least float32's 4 (an annotation is a hint; most layers compute in
    float32 whatever it says)."""
    dtype = DTYPES.get(pnnx_dtype or "")
    return 4 if dtype is None else max(dtype.itemsize, 4)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


# ----- freed blocks kept mapped (glibc) ---------------------------------------------------------
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20    # bytes: smaller blocks come from the heap (glibc's largest)
TRIM_THRESHOLD = 256 << 20   # bytes: free memory at the heap's top kept mapped
# the user's own choice of these thresholds, which keep_freed_memory leaves alone
MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")   # GLIBC_TUNABLES


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks of up to MMAP_THRESHOLD bytes in its heap,
    mapped, and to give the heap's free top back to the OS only beyond TRIM_THRESHOLD; once
    per process (RuntimeGraph.build calls it).

    Layers that return a new array (a Linear's output, an attention's scores) allocate the
    same sizes in every forward. By default glibc gives such blocks back to the OS once a few
    are free (munmap, or a trim of its heap) and maps fresh pages at the next malloc: a page
    fault per 4 KiB, every forward. Other allocators (jemalloc, tcmalloc) keep them. Nothing
    is changed where PNNX_INFER_KEEP_FREED=0, where the user set either threshold itself
    (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, or their GLIBC_TUNABLES), or on another
    C library. True where mallopt accepted both settings."""
    if (os.environ.get("PNNX_INFER_KEEP_FREED") == "0"
            or any(name in os.environ for name in MALLOC_SETTINGS)
            or any(name in os.environ.get("GLIBC_TUNABLES", "") for name in TUNABLES)
            or not sys.platform.startswith("linux")):
        return False
    import ctypes                              # here: a build needs it, an import does not

    try:
        mallopt = ctypes.CDLL(None).mallopt    # the C library the interpreter runs on
    except (OSError, AttributeError):          # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
