"""Operator fusion: fold the cheap operators around a convolution into it.

A ResNet block ends ``conv -> add(residual) -> relu``; run one by one, each step reads and
writes the whole tensor again. Fused, the convolution applies them while its output is still
in cache (the fast layers do it in their kernels: layers/fast/epilogue.py), and two tensors
never exist::

    before:  x --Conv2d--> a --Expression add(@0,@1)--> b --ReLU--> y
                                       r ----^
    after:   x, r --Conv2d [fused: add, relu]--> y

Patterns, tried on every nn.Conv2d (nn.ConvTranspose2d: the affine map and the activation;
nn.Linear: the activation only), in this order (the affine map before the residual and
again after the activation):

    nn.ZeroPad2d -> Conv2d      the pad folds into the convolution's zero padding
    Conv2d -> a * @0 + b        an expression of its output and numbers alone (``mul(@0,a)``,
                                ``add(mul(a,@0),b)``, ...: layers/expression.py's
                                ``affine_form``) folds into its weights and bias (rounded
                                otherwise than torch's two steps, as a batch norm folded
                                into them is), or, after a residual or an activation, joins
                                the activation (layers.activation.ScaleShift, rounded as
                                torch rounds it)
    Conv2d -> add(@0,@1)        the other operand becomes the convolution's second input
    Conv2d -> activation        one the layer can apply (``can_fuse_activation``: for the
                                fast layers ReLU, ReLU6, Hardtanh, LeakyReLU, SiLU, ...)

then, once those are folded, on every multiply, a squeeze-and-excitation block
(layers/excitation.py) becomes one operator, of type ``SqueezeExcitation``::

    x -> global average pool -> Conv2d 1x1 -> Conv2d 1x1 -> mul(gate, x)      (either order)
    |___________________________________________________^

The pool is nn.AdaptiveAvgPool2d to (1, 1) or torch.mean over dims (2, 3) keeping them; the
convolutions are 1x1, stride 1, one group, no padding (0, or "same" / "valid", which are 0
for a 1x1), with or without a folded activation, C -> S -> C. The multiply may also add x
back and then a third tensor r, in the same expression (a residual block:
``add(add(@0,mul(@0,@1)),@2)``, ``_excitation_output``). The multiply's operator survives
with the new type (its old one joins ``fused_types``), x as its input (r as its second),
and the convolutions' weights among its attributes (``reduce.weight``, ``expand.bias``,
...); the pool and the convolutions are in its ``fused``.

A pattern applies only when the tensor between the two operators has exactly one consumer and
is not a graph output (nobody else may see it), and only to the project's own layer classes,
reference or fast (a custom layer may compute something else). The folded operators leave the
graph, but their names stay on the operator that absorbed them, in order:
``op.fused == ['pnnx_expr_14', 'pnnx_unique_0']``. The graph calls ``fuse(graph)`` after
creating the layers and before ordering them, so the topological order, liveness and shape
plans see the fused graph.
``RuntimeGraph(..., reference=True)`` skips fusion: the reference graph is the file as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layers.base import Layer
from layers.excitation import SqueezeExcitation
from layers.expression import affine_form
from layers.padding import PadModule
from layers.pooling import AdaptiveAvgPool2d
from layers.reduction import Mean
from layers.registry import LayerRegisterer, is_built_in
from infer.runtime import RuntimeOperand, RuntimeOperator
from parser.expression import Call, Node, OperandRef

if TYPE_CHECKING:
    from infer.graph import RuntimeGraph

RESIDUAL_ADDS = ("add(@0,@1)", "add(@1,@0)")
EXCITATION_TYPE = "SqueezeExcitation"


def fuse(graph: "RuntimeGraph") -> int:
    """Fuse in place; returns how many operators were folded away. Linear in the operator
    count: folded operators are marked, and leave the list in one pass at the end."""
    outputs = {id(o) for o in graph.output_operands}
    folded: set[int] = set()
    registry = LayerRegisterer()
    own = {name: (registry.layer_class(name), registry.layer_class(name, fast=True))
           for name in ("nn.Conv2d", "nn.ConvTranspose2d", "nn.Linear", "pnnx.Expression",
                        "nn.AdaptiveAvgPool2d", "torch.mean")}
    for op in graph.operators:
        if id(op) in folded:                           # already folded into another
            continue
        conv = _is_own(op.layer, own["nn.Conv2d"])
        transposed = _is_own(op.layer, own["nn.ConvTranspose2d"])
        if conv:
            _fold_padding(graph, op, outputs, folded)
        if conv or transposed:
            _fold_affine(graph, op, outputs, folded, own["pnnx.Expression"])
        if conv:
            _fold_residual_add(graph, op, outputs, folded, own["pnnx.Expression"])
        if conv or transposed or _is_own(op.layer, own["nn.Linear"]):
            _fold_activation(graph, op, outputs, folded)
        if conv or transposed:
            _fold_affine(graph, op, outputs, folded, own["pnnx.Expression"])
    for op in graph.operators:
        if id(op) not in folded and _is_own(op.layer, own["pnnx.Expression"]):
            _fold_squeeze_excitation(graph, op, outputs, folded, own)
    if folded:
        graph.operators = [op for op in graph.operators if id(op) not in folded]
    return len(folded)


def _is_own(layer: Layer | None, classes: tuple[type[Layer], type[Layer]]) -> bool:
    """``layer`` is the project's own layer of a type (``classes``: the registry's reference
    and fast classes for it), not a custom one (registered on the graph or globally) nor a
    subclass of it (nn.Conv1d's layer subclasses nn.Conv2d's)."""
    return is_built_in(type(layer)) and type(layer) in classes


def _only_consumer(operand: RuntimeOperand, outputs: set[int]) -> RuntimeOperator | None:
    """The one operator reading ``operand``, if nothing else (nor the caller) can see it."""
    if id(operand) in outputs or len(operand.consumers) != 1:
        return None
    return operand.consumers[0]


def _absorb_next(graph: "RuntimeGraph", op: RuntimeOperator, nxt: RuntimeOperator,
                 folded: set[int]) -> None:
    """``op``'s output feeds only ``nxt``: ``op`` now produces ``nxt``'s output instead."""
    middle = op.outputs[0]
    op.outputs = list(nxt.outputs)
    for out in op.outputs:
        out.producer = op
    for src in nxt.inputs:                             # nxt's other inputs now feed op
        if src is not middle:
            src.consumers = [op if c is nxt else c for c in src.consumers]
            op.inputs.append(src)
    _remove(graph, nxt, middle, folded)
    op.fused.append(nxt.name)
    op.fused_types.add(nxt.type)
    op.output_of = nxt.output_of or nxt.name


def _float32(*operands: RuntimeOperand) -> bool:
    """Every operand is float32, or of a dtype the file does not give (the kernels fold in
    float32 arithmetic)."""
    return all(o.dtype in (None, "f32") for o in operands)


def _remove(graph: "RuntimeGraph", op: RuntimeOperator, operand: RuntimeOperand,
            folded: set[int]) -> None:
    """``op`` leaves the graph (from ``operators`` at the end of fuse), ``operand`` at once."""
    folded.add(id(op))
    del graph.operands[operand.name]


def _fold_padding(graph: "RuntimeGraph", op: RuntimeOperator, outputs: set[int],
                  folded: set[int]) -> None:
    """nn.ZeroPad2d (or a ConstantPad2d of 0) -> Conv2d (zeros mode): the conv pads by the sum
    of both."""
    padded = op.inputs[0]
    pad = padded.producer
    if (pad is None or type(pad.layer) is not PadModule or len(pad.inputs) != 1
            or pad.layer.mode != "constant" or pad.layer.value or len(pad.layer.pad) != 4
            or min(pad.layer.pad) < 0 or _only_consumer(padded, outputs) is not op
            or op.layer.padding_mode != "zeros"):
        return
    op.layer.fuse_padding(*pad.layer.pad)              # (left, right, top, bottom)
    source = pad.inputs[0]
    source.consumers = [op if c is pad else c for c in source.consumers]
    op.inputs[0] = source
    _remove(graph, pad, padded, folded)
    op.fused.append(pad.name)
    op.fused_types.add(pad.type)


def _fold_affine(graph: "RuntimeGraph", op: RuntimeOperator, outputs: set[int],
                 folded: set[int], expressions: tuple[type[Layer], type[Layer]]) -> None:
    """Conv2d -> a * conv + b (an expression of the conv's output and numbers only), as
    often as such expressions follow one another: into the weights and bias, or after a
    fused residual or activation f as the activation a * f + b (``FoldsAffine``), if the
    layer applies that."""
    layer = op.layer
    while len(op.outputs) == 1:
        expr = _only_consumer(op.outputs[0], outputs)
        if (expr is None or not _is_own(expr.layer, expressions) or len(expr.inputs) != 1
                or len(expr.outputs) != 1 or not _float32(*expr.inputs, *expr.outputs)):
            return
        form = affine_form(expr.layer.tree)
        if form is None or not layer.can_fuse_affine(*form):
            return
        layer.fuse_affine(*form)
        _absorb_next(graph, op, expr, folded)


def _fold_residual_add(graph: "RuntimeGraph", op: RuntimeOperator, outputs: set[int],
                       folded: set[int], expressions: tuple[type[Layer], type[Layer]]) -> None:
    """Conv2d -> add(conv, r): r becomes the conv's second input, added to its output."""
    add = _only_consumer(op.outputs[0], outputs)
    if (add is None or not _is_own(add.layer, expressions) or len(add.inputs) != 2
            or add.layer.expr.replace(" ", "") not in RESIDUAL_ADDS
            or add.inputs[0] is add.inputs[1] or len(op.outputs) != 1
            or op.layer.fused_activation is not None or op.layer.fused_residual
            or not _float32(*add.inputs, *add.outputs)):
        return
    op.layer.fuse_residual()
    _absorb_next(graph, op, add, folded)


def _fold_activation(graph: "RuntimeGraph", op: RuntimeOperator, outputs: set[int],
                     folded: set[int]) -> None:
    """Conv2d / Linear -> an elementwise activation the layer can apply."""
    act = _only_consumer(op.outputs[0], outputs)
    if (act is None or len(act.inputs) != 1 or len(op.outputs) != 1
            or not op.layer.can_fuse_activation(act.layer)):
        return
    op.layer.fuse_activation(act.layer)
    _absorb_next(graph, op, act, folded)


def _fold_squeeze_excitation(graph: "RuntimeGraph", mul: RuntimeOperator, outputs: set[int],
                             folded: set[int],
                             own: dict[str, tuple[type[Layer], type[Layer]]]) -> None:
    """pool(x) -> 1x1 -> 1x1 -> gate, then x * gate (+ x, + r): one SqueezeExcitation
    operator (the module docstring; the expression's forms: ``_excitation_output``). The
    multiply's operator survives: it produces the block's output, and the pool and
    convolutions, which it absorbs, have no output of their own any more."""
    form = _excitation_output(mul.layer.tree)
    if form is None:
        return
    first, second, kept, added = form
    read = {first, second} | ({added} if added is not None else set())
    if (len(mul.outputs) != 1 or not _float32(*mul.inputs, *mul.outputs)
            or read != set(range(len(mul.inputs)))          # every input read, none twice
            or len({id(o) for o in mul.inputs}) != len(mul.inputs)):
        return
    for x_at, gate_at in ((first, second), (second, first)):
        if kept in (None, x_at):
            block = _excitation_block(mul, mul.inputs[gate_at], mul.inputs[x_at], outputs, own)
            if block is not None:
                break
    else:
        return
    pool, reduce, expand, x = block
    gate = mul.inputs[gate_at]
    residual = None if added is None else mul.inputs[added]
    if type(reduce.layer) is own["nn.Conv2d"][0]:      # the reference floor's convolutions
        layer = SqueezeExcitation(reduce.layer, expand.layer)
    else:                                              # the fast floor's (loaded with it)
        from layers.fast.layers import FastSqueezeExcitation
        layer = FastSqueezeExcitation(reduce.layer, expand.layer)
    layer.name, layer.type = mul.name, EXCITATION_TYPE
    mul.fused_types.update({mul.type, pool.type, reduce.type, expand.type,
                            *reduce.fused_types, *expand.fused_types})
    layer.fuse_output(kept is not None, residual is not None)
    mul.type, mul.layer, mul.params = EXCITATION_TYPE, layer, {}
    mul.fused = [pool.name, reduce.name, *reduce.fused, expand.name, *expand.fused]
    for role, conv in (("reduce", reduce), ("expand", expand)):
        mul.attrs.update({f"{role}.{key}": attr for key, attr in conv.attrs.items()})
    x.consumers = [mul if c is pool else c for c in x.consumers if c is not mul]
    mul.inputs = [x] if residual is None else [x, residual]
    _remove(graph, pool, pool.outputs[0], folded)
    _remove(graph, reduce, reduce.outputs[0], folded)
    _remove(graph, expand, gate, folded)


def _excitation_output(tree: Node) -> tuple[int, int, int | None, int | None] | None:
    """(a, b, kept, added) if the expression is a product of two inputs @a * @b, maybe with
    one of them added back (``kept``: x + x * gate) and then a third input (``added``: a
    residual), each sum in either order::

        mul(@a,@b)    add(@k,mul(@a,@b))    add(add(@k,mul(@a,@b)),@r)    add(mul(@a,@b),@r)

    else None."""
    def product(node: Node) -> tuple[int, int] | None:
        if isinstance(node, Call) and node.name == "mul" and len(node.args) == 2:
            a, b = node.args
            if isinstance(a, OperandRef) and isinstance(b, OperandRef) and a.index != b.index:
                return a.index, b.index
        return None

    def summands(node: Node) -> list[tuple[int, Node]]:
        """(input, other side) for each order of a sum with an input on one side."""
        if not (isinstance(node, Call) and node.name == "add" and len(node.args) == 2):
            return []
        left, right = node.args
        return [(a.index, b) for a, b in ((left, right), (right, left))
                if isinstance(a, OperandRef)]

    def kept_product(node: Node) -> tuple[int, int, int | None] | None:
        pair = product(node)
        if pair is not None:
            return (*pair, None)
        for index, other in summands(node):
            pair = product(other)
            if pair is not None and index in pair:
                return (*pair, index)
        return None

    found = kept_product(tree)
    if found is not None:
        return (*found, None)
    for index, other in summands(tree):
        found = kept_product(other)
        if found is not None and index not in found:
            return (*found, index)
    return None


def _excitation_block(mul: RuntimeOperator, gate: RuntimeOperand, x: RuntimeOperand,
                      outputs: set[int], own: dict[str, tuple[type[Layer], type[Layer]]]
                      ) -> tuple[RuntimeOperator, RuntimeOperator, RuntimeOperator,
                                 RuntimeOperand] | None:
    """(pool, reduce, expand, x) if ``gate`` is expand(reduce(pool(x))), a squeeze-and-
    excitation's gate of x's channels that only ``mul`` reads; else None."""
    expand = _excitation_conv(gate, mul, outputs, own)
    if expand is None:
        return None
    reduce = _excitation_conv(expand.inputs[0], expand, outputs, own)
    if reduce is None:
        return None
    pool = reduce.inputs[0].producer
    if (pool is None or _only_consumer(reduce.inputs[0], outputs) is not reduce
            or pool.inputs != [x] or not _global_average_pool(pool, own)
            or reduce.layer.in_channels != expand.layer.out_channels
            or reduce.layer.out_channels != expand.layer.in_channels):
        return None
    return pool, reduce, expand, x


def _excitation_conv(operand: RuntimeOperand, reader: RuntimeOperator, outputs: set[int],
                     own: dict[str, tuple[type[Layer], type[Layer]]]) -> RuntimeOperator | None:
    """The producer of ``operand`` if it is one of the project's 1x1 convolutions of a
    squeeze-and-excitation block (stride 1, unpadded, one group, one input) and ``reader``
    alone reads its output."""
    conv = operand.producer
    if (conv is None or _only_consumer(operand, outputs) is not reader
            or not _is_own(conv.layer, own["nn.Conv2d"]) or len(conv.inputs) != 1
            or len(conv.outputs) != 1):
        return None
    layer = conv.layer
    if (layer.kernel_size != (1, 1) or layer.stride != (1, 1) or layer.groups != 1
            or layer.padding not in ((0, 0), "valid", "same") or any(layer.fused_padding)
            or layer.fused_residual):
        return None
    return conv


def _global_average_pool(pool: RuntimeOperator,
                         own: dict[str, tuple[type[Layer], type[Layer]]]) -> bool:
    """nn.AdaptiveAvgPool2d to (1, 1) (a parameter), or torch.mean over dims (2, 3) of a 4-D
    tensor (as the file annotates it, if it does), keeping them."""
    layer = pool.layer
    if len(pool.inputs) != 1 or len(pool.outputs) != 1:
        return False
    if _is_own(layer, own["nn.AdaptiveAvgPool2d"]):
        return isinstance(layer, AdaptiveAvgPool2d) and layer.output_size == (1, 1)
    shape = pool.inputs[0].shape
    return (_is_own(layer, own["torch.mean"]) and isinstance(layer, Mean) and layer.keepdim
            and layer.dim is not None and (shape is None or len(shape) == 4)
            and all(-4 <= d < 4 for d in layer.dim)
            and sorted(d % 4 for d in layer.dim) == [2, 3])
