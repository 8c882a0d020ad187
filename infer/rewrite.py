"""Graph rewrites done by RuntimeGraph.init(), before any layer exists.

pnnx packs a model's several return values before pnnx.Output: a returned tuple becomes a
``prim::TupleConstruct`` operator, a returned list a ``pnnx.Expression`` ``[a,b]``. Neither is
an array, so both are unpacked here: pnnx.Output reads the members directly, as if the model
had returned them one by one.

    before:  a, b -> prim::TupleConstruct -> t -> pnnx.Output
    after:   a, b ----------------------------> pnnx.Output

An operator that takes a list of tensors and returns one (``aten::meshgrid``) is unpacked the
same way: it reads the list's members and produces the members of its result itself; and
``x[i]`` (Tensor.index reading x and a list ``[@0]``) reads x and the index tensors.

Two rewrites mend pnnx mis-exports. pnnx turns ``reshape -> permute -> reshape`` into
nn.PixelShuffle without checking the first reshape's input: ``F.fold`` with kernel = stride
(MobileViT-v2's patches back to an image), traced on a (B, C, P, N) tensor, comes out as a
PixelShuffle reading that tensor directly. The output annotation (B, C, H, W) keeps the truth;
the PixelShuffle's input is then read as (B, C*r*r, H/r, W/r), which is what the dropped
reshape made of it:

    before:  t (B, C, P, N) -> nn.PixelShuffle r -> y (B, C, H, W)
    after:   t -> Tensor.reshape (B, C*r*r, H/r, W/r) -> nn.PixelShuffle r -> y

A module called from two places (CoaT's shared positional encoding) comes out of pnnx as an
nn.Conv2d that has its own @weight and @bias and also reads them as inputs, from
pnnx.Attribute operators; the module reads only its data input here:

    before:  w, b (pnnx.Attribute), x -> nn.Conv2d @weight @bias -> y
    after:   x -> nn.Conv2d @weight @bias -> y     (build checks that w, b equal @weight, @bias)

Each rewrite is linear in the size of the graph (a ``Rewrite`` collects the operators to drop
and to insert and applies them to the list in one pass), a tuple operator with the wrong
number of operands is a GraphError naming its line, and a name made up for a new operator or
operand (``<name>.<i>``) is checked against every name in the file.
"""

from __future__ import annotations

import logging
import math

from parser.errors import ExpressionError, GraphError
from parser.expression import ListExpr, Node, OperandRef, parse_expression, to_text
from parser.param import ParamType
from infer.runtime import RuntimeOperand, RuntimeOperator, RuntimeParameter

log = logging.getLogger(__name__)

INPUT_TYPE = "pnnx.Input"
OUTPUT_TYPE = "pnnx.Output"
EXPRESSION_TYPE = "pnnx.Expression"
TUPLE_CONSTRUCT = "prim::TupleConstruct"
TUPLE_UNPACK = "prim::TupleUnpack"
LIST_UNPACK = "prim::ListUnpack"
MESHGRID = "aten::meshgrid"
INDEX = "Tensor.index"
MASKS = ("bool", "u8")                    # index dtypes torch reads as masks
PIXEL_SHUFFLES = ("nn.PixelShuffle", "F.pixel_shuffle")
ATTRIBUTE_TYPE = "pnnx.Attribute"
# modules with weights that take one array: pnnx writes any other input as a repeat of a weight
ONE_INPUT_MODULES = {f"nn.{name}" for name in (
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Linear", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "Embedding", "PReLU")}


class Rewrite:
    """The graph being rewritten: its operators (file order) and operands by name, with the
    edits of the current pass, which ``apply`` makes to the operator list at once."""

    def __init__(self, operators: list[RuntimeOperator], operands: dict[str, RuntimeOperand],
                 path: str = "<graph>"):
        self.operators, self.operands, self.path = operators, operands, path
        self.operator_names = {op.name for op in operators}
        self._removed: set[int] = set()
        self._inserted: dict[int, list[RuntimeOperator]] = {}    # id(anchor) -> new, before it

    def remove(self, op: RuntimeOperator) -> None:
        """Take ``op`` and its output operands out of the graph (each source once, however
        often ``op`` reads it)."""
        for src in {id(src): src for src in op.inputs}.values():
            src.consumers = [c for c in src.consumers if c is not op]
        for out in op.outputs:
            self.operands.pop(out.name, None)
        self._removed.add(id(op))

    def stop_reading(self, op: RuntimeOperator, source: RuntimeOperand) -> None:
        """``op`` no longer reads ``source`` (its inputs are set by the caller); the
        operator that produces ``source`` leaves the graph if nothing else reads it."""
        source.consumers = [c for c in source.consumers if c is not op]
        if not source.consumers and source.producer is not None:
            self.remove(source.producer)

    def insert_before(self, anchor: RuntimeOperator, op: RuntimeOperator) -> None:
        self._inserted.setdefault(id(anchor), []).append(op)
        self.operator_names.add(op.name)

    def apply(self) -> None:
        """Make this pass's removals and insertions in the operator list."""
        if not (self._removed or self._inserted):
            return
        edited: list[RuntimeOperator] = []
        for op in self.operators:
            edited.extend(self._inserted.get(id(op), ()))
            if id(op) not in self._removed:
                edited.append(op)
        self.operators[:] = edited
        self._removed.clear()
        self._inserted.clear()

    @staticmethod
    def fresh_name(base: str, taken: set[str] | dict[str, RuntimeOperand]) -> str:
        """``base`` if no name in ``taken`` is it, else ``base_1``, ``base_2``, ..."""
        name, suffix = base, 0
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
        return name

    def malformed(self, op: RuntimeOperator, what: str) -> GraphError:
        return GraphError(f"{self.path}:{op.line}: {op.label} {what}", operator=op.label)


def rewrite_graph(operators: list[RuntimeOperator], operands: dict[str, RuntimeOperand],
                  path: str = "<graph>") -> None:
    """Replace tuples and lists by their members (outputs, meshgrid, x[i, j]) and mend the two
    pnnx mis-exports (a fold's pixel shuffle, a module reading its weights), in place."""
    graph = Rewrite(operators, operands, path)
    for rewrite in (flatten_tuples, split_output_lists, absorb_tuple_unpacks, unpack_meshgrids,
                    unpack_index_lists, reshape_before_folded_pixel_shuffles,
                    drop_repeated_weight_inputs):
        rewrite(graph)
        graph.apply()


def flatten_tuples(graph: Rewrite) -> None:
    """Remove prim::TupleConstruct (and a TupleUnpack of it): consumers read the members."""
    for op in [op for op in graph.operators if op.type == TUPLE_CONSTRUCT]:
        if len(op.outputs) != 1:
            raise graph.malformed(op, f"has {len(op.outputs)} outputs; a tuple is one operand")
        (packed,) = op.outputs
        for consumer in list(packed.consumers):
            if consumer.type == TUPLE_UNPACK:           # unpack(construct(a, b)) -> a, b
                if len(consumer.inputs) != 1 or len(consumer.outputs) != len(op.inputs):
                    raise graph.malformed(
                        consumer, f"unpacks {len(consumer.outputs)} operands from the tuple of "
                        f"{len(op.inputs)} that {op.label} (line {op.line}) builds; an unpack "
                        f"reads one tuple and gives each of its members")
                for member, unpacked in zip(op.inputs, consumer.outputs):
                    replace_operand(graph.operands, unpacked, member)
                graph.remove(consumer)
        splice(packed, op.inputs)                       # output(construct(a, b)) -> output(a, b)
        graph.remove(op)


def split_output_lists(graph: Rewrite) -> None:
    """A returned list ``expr=[add(@0,1),@1]`` becomes one pnnx.Expression per item."""
    for op in list(graph.operators):
        tree = returned_list(op)
        if tree is None:
            continue
        (packed,) = op.outputs
        members = [expression_piece(graph, op, index, item)
                   for index, item in enumerate(tree.items)]
        splice(packed, members)
        graph.remove(op)


def absorb_tuple_unpacks(graph: Rewrite) -> None:
    """An operator whose one output is a tuple that only a prim::TupleUnpack reads (pnnx
    writes ``nn.AdaptiveMaxPool2d(return_indices=True)`` so) produces the members itself:

        before:  x -> op -> t -> prim::TupleUnpack -> a, b
        after:   x -> op ----------------------------> a, b
    """
    for unpack in [op for op in graph.operators if op.type == TUPLE_UNPACK]:
        if len(unpack.inputs) != 1:
            raise graph.malformed(unpack, f"reads {len(unpack.inputs)} operands; it unpacks "
                                          f"one tuple")
        (packed,) = unpack.inputs
        producer = packed.producer
        if producer is not None and producer.type in (INPUT_TYPE, OUTPUT_TYPE):
            raise graph.malformed(unpack, f"unpacks {packed.name!r}, which {producer.label} "
                                          f"gives: a graph input is one array, not a tuple")
        if (producer is None or len(producer.outputs) != 1 or len(packed.consumers) != 1
                or producer.type == TUPLE_CONSTRUCT):
            continue
        producer.outputs = list(unpack.outputs)
        for member in unpack.outputs:
            member.producer = producer
        unpack.inputs, unpack.outputs = [], []
        graph.operands.pop(packed.name, None)
        graph.remove(unpack)


def unpack_meshgrids(graph: Rewrite) -> None:
    """``torch.meshgrid(y, x, indexing="ij")`` on sizes known only at run time (a dynamic
    export of YOLO's grid) is written by pnnx on lists and a string::

        before:  y, x -> pnnx.Expression [@0,@1] -> l ┐
                         pnnx.Expression ij ----> s ┴-> aten::meshgrid -> g
                                                        -> prim::ListUnpack -> gy, gx
        after:   y, x -> aten::meshgrid indexing=ij -> gy, gx

    A meshgrid in any other form is left alone, for its layer to refuse."""
    for op in [op for op in graph.operators if op.type == MESHGRID]:
        if len(op.inputs) != 2 or len(op.outputs) != 1:
            continue
        packed, text = op.inputs
        indexing = (text.producer.params.get("expr") if text.producer is not None
                    and text.producer.type == EXPRESSION_TYPE else None)
        unpacks = op.outputs[0].consumers
        if (indexing is None or indexing.value not in ("ij", "xy") or len(unpacks) != 1
                or unpacks[0].type != LIST_UNPACK):
            continue
        members = list_members(graph, packed.producer)
        if members is None:
            continue
        for source in (packed, text):                   # read the members, not the list
            graph.stop_reading(op, source)
        op.inputs = members
        for member in members:
            member.consumers.append(op)
        op.params["indexing"] = RuntimeParameter("indexing", indexing.type, indexing.value)
        (unpack,) = unpacks
        graph.operands.pop(op.outputs[0].name, None)
        op.outputs = list(unpack.outputs)
        for member in op.outputs:
            member.producer = op
        unpack.inputs, unpack.outputs = [], []
        graph.remove(unpack)


def unpack_index_lists(graph: Rewrite) -> None:
    """``x[i, j]``: pnnx writes Tensor.index reading x and a pnnx.Expression ``[@0,@1]``;
    the operator reads x, i, j (a None item stays a None expression: that dim is whole), and
    its ``masks`` parameter lists the members annotated bool or u8."""
    for op in [op for op in graph.operators if op.type == INDEX]:
        if len(op.inputs) != 2:
            continue
        packed = op.inputs[1]
        members = list_members(graph, packed.producer)
        if members is None:
            continue
        graph.stop_reading(op, packed)
        op.inputs = [op.inputs[0], *members]
        op.input_names = []
        for member in members:
            member.consumers.append(op)
        masks = [number for number, member in enumerate(members) if member.dtype in MASKS]
        if masks:
            op.params["masks"] = RuntimeParameter("masks", ParamType.INT_ARRAY, masks)


def reshape_before_folded_pixel_shuffles(graph: Rewrite) -> None:
    """A PixelShuffle whose annotated input is F.fold's, (B, C, r*r, L) or (B, C*r*r, L) with
    L = H/r * W/r for its annotated output (B, C, H, W), as pnnx's fusion of F.fold leaves
    it, reads its input through a Tensor.reshape (module docstring). Any other disagreement
    is left for shape planning to report."""
    for op in [op for op in graph.operators if op.type in PIXEL_SHUFFLES]:
        factor = op.params.get("upscale_factor")
        if len(op.inputs) != 1 or len(op.outputs) != 1 or factor is None:
            continue
        source, result = op.inputs[0], op.outputs[0]
        r = factor.value
        shape = _known(source.shape)
        out = _known(result.shape)
        if (not isinstance(r, int) or r <= 0 or shape is None or out is None or len(out) != 4
                or out[2] % r or out[3] % r or math.prod(shape) != math.prod(out)):
            continue
        batch, channels, patches = out[0], out[1], (out[2] // r) * (out[3] // r)
        if shape not in ((batch, channels, r * r, patches), (batch, channels * r * r, patches)):
            continue                               # not what F.fold's fusion leaves
        folded = (batch, channels * r * r, out[2] // r, out[3] // r)
        reshaped = RuntimeOperand(graph.fresh_name(f"{source.name}.folded", graph.operands),
                                  shape=folded, dtype=source.dtype)
        reshape = RuntimeOperator(                 # any batch: the rest is fixed by the file
            type="Tensor.reshape", line=op.line, inputs=[source], outputs=[reshaped],
            name=graph.fresh_name(f"{op.name}.reshape", graph.operator_names),
            params={"shape": RuntimeParameter("shape", ParamType.INT_ARRAY,
                                              [-1, *folded[1:]])})
        reshaped.producer = reshape
        reshaped.consumers = [op]
        source.consumers = [reshape if c is op else c for c in source.consumers]
        op.inputs = [reshaped]
        graph.operands[reshaped.name] = reshaped
        graph.insert_before(op, reshape)
        log.info("%s:%d: %s reads %s %s as %s: pnnx wrote F.fold as a pixel shuffle without "
                 "the reshape before it", graph.path, op.line, op.label, source.name, shape,
                 folded)


def drop_repeated_weight_inputs(graph: Rewrite) -> None:
    """A one-input module with weights that also reads pnnx.Attribute operands shaped as its
    own weights reads only its data input (module docstring); an Attribute no one reads any
    more leaves the graph. The Attributes are kept in ``op.weight_copies``: build checks their
    data equal the module's weights. Any other extra input is left for the layer to refuse."""
    for op in [op for op in graph.operators if op.type in ONE_INPUT_MODULES]:
        if len(op.inputs) < 2 or not op.attrs:
            continue
        weight_shapes = {tuple(attr.shape) for attr in op.attrs.values()}
        repeats = [src for src in op.inputs if src.producer is not None
                   and src.producer.type == ATTRIBUTE_TYPE and src.shape is not None
                   and tuple(src.shape) in weight_shapes]
        if len(op.inputs) - len(repeats) != 1:
            continue
        dropped = {id(src) for src in repeats}
        if len(op.input_names) == len(op.inputs):
            op.input_names = [name for name, src in zip(op.input_names, op.inputs)
                              if id(src) not in dropped]
        op.inputs = [src for src in op.inputs if id(src) not in dropped]
        for src in {id(src): src for src in repeats}.values():
            assert src.producer is not None         # an Attribute's output, as chosen above
            op.weight_copies.append(src.producer)
            graph.stop_reading(op, src)
        log.info("%s:%d: %s reads its weights as inputs too (a module used twice): "
                 "reading only %s", graph.path, op.line, op.label, op.inputs[0].name)


def _known(shape: tuple[int | None, ...] | None) -> tuple[int, ...] | None:
    """An annotated shape whose every size is known, else None."""
    if shape is None or any(not isinstance(size, int) for size in shape):
        return None
    return tuple(int(size) for size in shape)        # type: ignore[arg-type]


def list_members(graph: Rewrite, op: RuntimeOperator | None) -> list[RuntimeOperand] | None:
    """The operands a pnnx.Expression ``[@0,add(@1,0.5)]`` packs into a list, in order: an
    item ``@N`` is the list operator's input N, any other item becomes a pnnx.Expression of
    its own (added to the graph). None for any other operator or expression."""
    if op is None or op.type != EXPRESSION_TYPE or "expr" not in op.params:
        return None
    try:
        tree = parse_expression(str(op.params["expr"].value))
    except ExpressionError:
        return None
    if not isinstance(tree, ListExpr) or any(isinstance(item, OperandRef)
                                             and item.index >= len(op.inputs)
                                             for item in tree.items):
        return None
    return [op.inputs[item.index] if isinstance(item, OperandRef)
            else expression_piece(graph, op, index, item)
            for index, item in enumerate(tree.items)]


def expression_piece(graph: Rewrite, op: RuntimeOperator, index: int,
                     item: Node) -> RuntimeOperand:
    """Item ``index`` of the list that the pnnx.Expression ``op`` builds, as a pnnx.Expression
    of its own on the same inputs, inserted before ``op``; returns its output operand, named
    ``<list operand>.<index>`` (``_1``, ``_2``, ... appended while the file has that name)."""
    expr = op.params["expr"]
    piece = RuntimeOperator(
        type=op.type, name=graph.fresh_name(f"{op.name}.{index}", graph.operator_names),
        line=op.line, input_names=list(op.input_names), inputs=list(op.inputs),
        params={"expr": RuntimeParameter("expr", expr.type, to_text(item))})
    member = RuntimeOperand(graph.fresh_name(f"{op.outputs[0].name}.{index}", graph.operands),
                            producer=piece)
    piece.outputs.append(member)
    for src in op.inputs:
        src.consumers.append(piece)
    graph.operands[member.name] = member
    graph.insert_before(op, piece)
    return member


def returned_list(op: RuntimeOperator) -> ListExpr | None:
    """The list an operator builds for pnnx.Output only (a pnnx.Expression ``[...]``), else
    None. A malformed expression is left for its layer to report at build."""
    if op.type != EXPRESSION_TYPE or len(op.outputs) != 1 or not op.outputs[0].consumers:
        return None
    if any(consumer.type != OUTPUT_TYPE for consumer in op.outputs[0].consumers):
        return None
    expr = op.params.get("expr")
    if expr is None or not isinstance(expr.value, str):
        return None
    try:
        tree = parse_expression(expr.value)
    except ExpressionError:
        return None
    return tree if isinstance(tree, ListExpr) else None


def splice(packed: RuntimeOperand, members: list[RuntimeOperand]) -> None:
    """Every remaining consumer of ``packed`` reads ``members`` in its place, in order."""
    for consumer in packed.consumers:
        position = consumer.inputs.index(packed)
        consumer.inputs[position:position + 1] = members
        for member in members:
            member.consumers.append(consumer)
    packed.consumers = []


def replace_operand(operands: dict[str, RuntimeOperand], old: RuntimeOperand,
                    new: RuntimeOperand) -> None:
    """Consumers of ``old`` read ``new`` instead; ``old`` leaves the graph."""
    for consumer in old.consumers:
        consumer.inputs = [new if o is old else o for o in consumer.inputs]
        new.consumers.append(consumer)
    operands.pop(old.name, None)
