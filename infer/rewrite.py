"""Graph rewrites done by RuntimeGraph.init(), before any layer exists.

pnnx packs a model's several return values before pnnx.Output: a returned tuple becomes a
``prim::TupleConstruct`` operator, a returned list a ``pnnx.Expression`` ``[a,b]``. Neither is
an array, so both are unpacked here: pnnx.Output reads the members directly, as if the model
had returned them one by one.

    before:  a, b -> prim::TupleConstruct -> t -> pnnx.Output
    after:   a, b ----------------------------> pnnx.Output

An operator that takes a list of tensors and returns one (``aten::meshgrid``) is unpacked the
same way: it reads the list's members and produces the members of its result itself.
"""

from __future__ import annotations

from parser.errors import ExpressionError
from parser.expression import ListExpr, Node, OperandRef, parse_expression, to_text
from infer.runtime import RuntimeOperand, RuntimeOperator, RuntimeParameter

OUTPUT_TYPE = "pnnx.Output"
EXPRESSION_TYPE = "pnnx.Expression"
TUPLE_CONSTRUCT = "prim::TupleConstruct"
TUPLE_UNPACK = "prim::TupleUnpack"
LIST_UNPACK = "prim::ListUnpack"
MESHGRID = "aten::meshgrid"


def unpack_outputs(operators: list[RuntimeOperator],
                   operands: dict[str, RuntimeOperand]) -> None:
    """Replace tuples and lists of outputs by their members, in place."""
    flatten_tuples(operators, operands)
    split_output_lists(operators, operands)
    absorb_tuple_unpacks(operators, operands)
    unpack_meshgrids(operators, operands)


def unpack_meshgrids(operators: list[RuntimeOperator],
                     operands: dict[str, RuntimeOperand]) -> None:
    """``torch.meshgrid(y, x, indexing="ij")`` on sizes known only at run time (a dynamic
    export of YOLO's grid) is written by pnnx on lists and a string::

        before:  y, x -> pnnx.Expression [@0,@1] -> l ┐
                         pnnx.Expression ij ----> s ┴-> aten::meshgrid -> g
                                                        -> prim::ListUnpack -> gy, gx
        after:   y, x -> aten::meshgrid indexing=ij -> gy, gx

    A meshgrid in any other form is left alone, for its layer to refuse."""
    for op in [op for op in operators if op.type == MESHGRID]:
        if len(op.inputs) != 2 or len(op.outputs) != 1:
            continue
        packed, text = op.inputs
        indexing = (text.producer.params.get("expr") if text.producer is not None
                    and text.producer.type == EXPRESSION_TYPE else None)
        unpacks = op.outputs[0].consumers
        if (indexing is None or indexing.value not in ("ij", "xy") or len(unpacks) != 1
                or unpacks[0].type != LIST_UNPACK):
            continue
        members = list_members(packed.producer, operators, operands)
        if members is None:
            continue
        for source in (packed, text):                   # read the members, not the list
            source.consumers = [c for c in source.consumers if c is not op]
            if not source.consumers and source.producer is not None:
                remove_operator(operators, operands, source.producer)
        op.inputs = members
        for member in members:
            member.consumers.append(op)
        op.params["indexing"] = RuntimeParameter("indexing", indexing.type, indexing.value)
        (unpack,) = unpacks
        operands.pop(op.outputs[0].name, None)
        op.outputs = list(unpack.outputs)
        for member in op.outputs:
            member.producer = op
        unpack.inputs = []
        operators.remove(unpack)


def list_members(op: RuntimeOperator | None, operators: list[RuntimeOperator],
                 operands: dict[str, RuntimeOperand]) -> list[RuntimeOperand] | None:
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
            else expression_piece(op, index, item, operators, operands)
            for index, item in enumerate(tree.items)]


def expression_piece(op: RuntimeOperator, index: int, item: Node,
                     operators: list[RuntimeOperator],
                     operands: dict[str, RuntimeOperand]) -> RuntimeOperand:
    """Item ``index`` of the list that the pnnx.Expression ``op`` builds, as a pnnx.Expression
    of its own on the same inputs, inserted before ``op``; returns its output operand."""
    expr = op.params["expr"]
    piece = RuntimeOperator(
        type=op.type, name=f"{op.name}.{index}", line=op.line,
        input_names=list(op.input_names), inputs=list(op.inputs),
        params={"expr": RuntimeParameter("expr", expr.type, to_text(item))})
    member = RuntimeOperand(f"{op.outputs[0].name}.{index}", producer=piece)
    piece.outputs.append(member)
    for src in op.inputs:
        src.consumers.append(piece)
    operands[member.name] = member
    operators.insert(operators.index(op), piece)
    return member


def absorb_tuple_unpacks(operators: list[RuntimeOperator],
                         operands: dict[str, RuntimeOperand]) -> None:
    """An operator whose one output is a tuple that only a prim::TupleUnpack reads (pnnx
    writes ``nn.AdaptiveMaxPool2d(return_indices=True)`` so) produces the members itself:

        before:  x -> op -> t -> prim::TupleUnpack -> a, b
        after:   x -> op ----------------------------> a, b
    """
    for unpack in [op for op in operators if op.type == TUPLE_UNPACK]:
        (packed,) = unpack.inputs
        producer = packed.producer
        if (producer is None or len(producer.outputs) != 1 or len(packed.consumers) != 1
                or producer.type == TUPLE_CONSTRUCT):
            continue
        producer.outputs = list(unpack.outputs)
        for member in unpack.outputs:
            member.producer = producer
        operands.pop(packed.name, None)
        operators[:] = [op for op in operators if op is not unpack]


def flatten_tuples(operators: list[RuntimeOperator],
                   operands: dict[str, RuntimeOperand]) -> None:
    """Remove prim::TupleConstruct (and a TupleUnpack of it): consumers read the members."""
    for op in [op for op in operators if op.type == TUPLE_CONSTRUCT]:
        (packed,) = op.outputs
        for consumer in list(packed.consumers):
            if consumer.type == TUPLE_UNPACK:           # unpack(construct(a, b)) -> a, b
                for member, unpacked in zip(op.inputs, consumer.outputs):
                    replace_operand(operands, unpacked, member)
                remove_operator(operators, operands, consumer)
        splice(packed, op.inputs)                       # output(construct(a, b)) -> output(a, b)
        remove_operator(operators, operands, op)


def split_output_lists(operators: list[RuntimeOperator],
                       operands: dict[str, RuntimeOperand]) -> None:
    """A returned list ``expr=[add(@0,1),@1]`` becomes one pnnx.Expression per item."""
    for op in operators[:]:
        tree = returned_list(op)
        if tree is None:
            continue
        (packed,) = op.outputs
        members = [expression_piece(op, index, item, operators, operands)
                   for index, item in enumerate(tree.items)]
        splice(packed, members)
        remove_operator(operators, operands, op)


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


def remove_operator(operators: list[RuntimeOperator], operands: dict[str, RuntimeOperand],
                    op: RuntimeOperator) -> None:
    """Take ``op`` and its output operands out of the graph."""
    for src in op.inputs:
        src.consumers = [c for c in src.consumers if c is not op]
    for out in op.outputs:
        operands.pop(out.name, None)
    operators.remove(op)
