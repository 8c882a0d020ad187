"""Linear algebra: nn.Linear (weights from the bin file) and F.linear (weights as inputs), and
the products of two graph operands: torch.matmul, torch.mm, torch.mv, torch.bmm, torch.addmm,
torch.baddbmm, torch.einsum.

pnnx writes ``F.linear`` with a constant weight as an ``nn.Linear`` line; an ``F.linear`` line
is left only when the weight is computed in the graph: weight and optional bias are then inputs.
Likewise ``torch.matmul(x, constant)`` becomes an nn.Linear; a torch.matmul line multiplies two
computed operands (``x.matmul(y)`` and ``x @ y`` are written as torch.matmul too).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (FusesActivation, Layer, Param, Shape, as_bool, as_float, as_int,
                         as_str, at_least, bias_is_an_input, check_bias_flag, expect_shape,
                         split_weight_inputs)
from layers.registry import register_layer
from layers.shape import read_only_alias
from parser.errors import LayerError, ShapeError


def linear_output_shape(x_shape: Shape, weight_shape: Shape) -> Shape:
    """(..., in) input and (out, in) weight -> (..., out)."""
    if len(x_shape) < 1:
        raise ShapeError("expects an input with at least 1 dim (..., in_features), got a scalar")
    if len(weight_shape) != 2:
        raise ShapeError(f"expects a 2-D (out_features, in_features) weight, got shape "
                         f"{tuple(weight_shape)}")
    if x_shape[-1] != weight_shape[1]:
        raise ShapeError(f"input {tuple(x_shape)} has {x_shape[-1]} features in its last dim, "
                         f"the weight {tuple(weight_shape)} expects {weight_shape[1]}")
    return (*x_shape[:-1], weight_shape[0])


@register_layer("nn.Linear")
class Linear(FusesActivation, Layer):
    """Fully connected layer, as ``torch.nn.Linear``, over the last dim, any leading dims::

        y = x @ weight.T + bias      x (..., in), weight (out, in), bias (out,) -> y (..., out)
    """

    in_features = Param(convert=at_least(1, as_int))
    out_features = Param(convert=at_least(1, as_int))
    fused_into = "this linear layer"     # the activation fusion may fold in: FusesActivation
    # the flag from the param line; load_model replaces it by the @bias array (or None)
    bias: Param[Any] = Param(True, as_bool)
    WEIGHTS = ("weight",)
    OPTIONAL_WEIGHTS = ("bias",)
    weight: np.ndarray
    has_bias: bool

    def check_params(self) -> None:
        self.has_bias = self.bias

    def check_weights(self) -> None:
        # the parameter `bias` (True/False) is now the @bias array or None: compare with the flag
        check_bias_flag(self.has_bias, self.bias)
        expect_shape("@weight", self.weight.shape, (self.out_features, self.in_features))
        if self.bias is not None:
            expect_shape("@bias", self.bias.shape, (self.out_features,))

    def infer_shape(self, shape: Shape) -> Shape:
        return linear_output_shape(shape, (self.out_features, self.in_features))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        y = self._linear(x)
        if self.fused_activation is not None:
            self.fused_activation.forward_inplace(y)
        return y

    def _linear(self, x: np.ndarray) -> np.ndarray:
        """x @ weight.T + bias (the fast subclass shares the product between threads)."""
        return kernels.linear(x, self.weight, self.bias)


@register_layer("F.linear")
class FunctionalLinear(Layer):
    """``F.linear(input, weight, bias)`` with the weight (and the bias, if any) as graph inputs:
    x (..., in), weight (out, in)[, bias (out,)] -> x @ weight.T + bias (..., out)."""

    bias = Param(None, bias_is_an_input)               # pnnx writes bias=None
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, bias = split_weight_inputs(input_shapes)
        out_shape = linear_output_shape(x, weight)
        if bias is not None:
            expect_shape("bias input", bias, (weight[0],), ShapeError)
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [kernels.linear(*split_weight_inputs(inputs))]


# ----- products of two operands -------------------------------------------------------------------

def matmul_output_shape(a: Shape, b: Shape) -> Shape:
    """torch.matmul's shape rules (numpy's too): a 1-D operand is a row (left) or a column
    (right) vector whose dim is dropped from the result; with both at least 2-D the last two
    dims multiply (n, m) @ (m, p) -> (n, p) and the dims before them broadcast."""
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"expects operands of at least 1 dim, got shapes {tuple(a)} and "
                         f"{tuple(b)}")
    a2 = (1, *a) if len(a) == 1 else tuple(a)                   # (..., n, m)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)                   # (..., m, p)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"cannot multiply shapes {tuple(a)} and {tuple(b)}: {a2[-1]} "
                         f"columns against {b2[-2]} rows")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ShapeError(f"the batch dims of {tuple(a)} and {tuple(b)} do not broadcast") \
            from None
    rows = (a2[-2],) if len(a) > 1 else ()
    cols = (b2[-1],) if len(b) > 1 else ()
    return (*batch, *rows, *cols)


def _check_ranks(name: str, shapes: Sequence[Shape], ranks: Sequence[int]) -> None:
    for index, (shape, rank) in enumerate(zip(shapes, ranks)):
        if len(shape) != rank:
            raise ShapeError(f"{name} expects a {rank}-D operand {index}, got shape "
                             f"{tuple(shape)}")


class _Product(Layer):
    """The product of two graph operands; ``ranks``, if set, are the ranks they must have."""

    one_blob_only = False
    ranks: tuple[int, ...] | None = None                       # None: any rank >= 1

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 2:
            raise ShapeError(f"expects 2 inputs, got {len(input_shapes)}")
        if self.ranks is not None:
            _check_ranks(self.type, input_shapes, self.ranks)
            if self.ranks == (3, 3) and input_shapes[0][0] != input_shapes[1][0]:
                raise ShapeError(f"batch sizes differ: {tuple(input_shapes[0])} and "
                                 f"{tuple(input_shapes[1])}")
        return [matmul_output_shape(*input_shapes)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(np.matmul(inputs[0], inputs[1]))]   # a 0-d array for two vectors


@register_layer("torch.matmul")
class MatMul(_Product):
    """``torch.matmul(input, other)``: matrix product with broadcast batch dims; a 1-D operand
    is a vector. (..., n, m) @ (..., m, p) -> (..., n, p); (m,) @ (..., m, p) -> (..., p);
    (..., n, m) @ (m,) -> (..., n); (m,) @ (m,) -> () (the dot product)."""


@register_layer("torch.mm")
class MM(_Product):
    """``torch.mm(input, mat2)``: (n, m) @ (m, p) -> (n, p), no broadcasting."""

    ranks = (2, 2)


@register_layer("torch.mv")
class MV(_Product):
    """``torch.mv(input, vec)``: (n, m) @ (m,) -> (n,)."""

    ranks = (2, 1)


@register_layer("torch.bmm")
class BMM(_Product):
    """``torch.bmm(input, mat2)``: batched (b, n, m) @ (b, m, p) -> (b, n, p), no
    broadcasting."""

    ranks = (3, 3)


@register_layer("torch.addmm", "torch.baddbmm")
class AddMM(Layer):
    """``torch.addmm(input, mat1, mat2, beta=1, alpha=1)`` and ``torch.baddbmm(input, batch1,
    batch2, beta=1, alpha=1)``::

        y = beta * input + alpha * (mat1 @ mat2)

    mat1 (n, m), mat2 (m, p) -> (n, p); batched (b, n, m), (b, m, p) -> (b, n, p) for baddbmm.
    ``input`` broadcasts to the result's shape; with beta = 0 it is ignored (its NaNs too).
    """

    alpha = Param(1.0, as_float)
    beta = Param(1.0, as_float)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 3:
            raise ShapeError(f"expects 3 inputs (input, mat1, mat2), got {len(input_shapes)}")
        bias, a, b = input_shapes
        rank = 3 if self.type == "torch.baddbmm" else 2
        _check_ranks(self.type, [a, b], [rank, rank])
        if rank == 3 and a[0] != b[0]:
            raise ShapeError(f"batch sizes differ: {tuple(a)} and {tuple(b)}")
        out_shape = matmul_output_shape(a, b)
        if not _broadcasts_to(bias, out_shape):
            raise ShapeError(f"input {tuple(bias)} does not broadcast to the product's shape "
                             f"{out_shape}")
        return [out_shape]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        bias, a, b = inputs
        return [kernels.addmm(bias, a, b, beta=self.beta, alpha=self.alpha)]


def _broadcasts_to(shape: Shape, target: Shape) -> bool:
    """Whether an array of ``shape`` broadcasts to ``target`` (torch's ``expand``)."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


@register_layer("torch.einsum")
class Einsum(Layer):
    """``torch.einsum(equation, *operands)``: a sum of products over the repeated subscripts,
    as np.einsum computes it (``'bij,bjk->bik'`` is a batched matmul, ``'ii'`` a trace).
    ``...`` stands for broadcast dims, as do dims of size 1 under the same subscript. Without
    ``->`` the output has the ellipsis dims, then the subscripts used once, in alphabetical
    order. pnnx renames the subscripts (``bij,bjk->bik`` is written ``ijl,ilk->ijk``)."""

    equation = Param(convert=as_str)
    one_blob_only = False
    views_input = True            # one operand only reordered: numpy's result is a view of it

    def check_params(self) -> None:
        self.equation = self.equation.replace(" ", "")
        lhs, _, rhs = self.equation.partition("->")
        for term in lhs.split(",") + [rhs]:
            if not term.replace("...", "").isalpha() and term.replace("...", ""):
                raise LayerError(f"equation {self.equation!r}: subscripts must be letters")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        return [einsum_output_shape(self.equation, input_shapes)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        y = np.asarray(np.einsum(self.equation, *inputs, optimize=len(inputs) > 2))
        return [read_only_alias(y, inputs[0])]


def einsum_output_shape(equation: str, shapes: Sequence[Shape]) -> Shape:
    """The shape torch.einsum gives for these operand shapes, or ShapeError."""
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"equation {equation!r} has {len(terms)} operands, got {len(shapes)}")
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    ellipsis_shapes = []
    for term, shape in zip(terms, shapes):
        before, has_ellipsis, after = term.partition("...")
        n_ellipsis = len(shape) - len(before) - len(after)
        if n_ellipsis < 0 or (n_ellipsis and not has_ellipsis):
            raise ShapeError(f"equation {equation!r}: subscripts {term!r} do not fit an operand "
                             f"of shape {tuple(shape)}")
        ellipsis_shapes.append(tuple(shape[len(before):len(before) + n_ellipsis]))
        labelled = zip(before + after, (*shape[:len(before)], *shape[len(before) + n_ellipsis:]))
        for letter, size in labelled:
            known = sizes.setdefault(letter, size)
            if size != known and 1 not in (size, known):
                raise ShapeError(f"equation {equation!r}: subscript {letter!r} is {known} in one "
                                 f"place and {size} in another")
            sizes[letter] = max(known, size) if 1 in (size, known) else size
            counts[letter] = counts.get(letter, 0) + 1
    try:
        ellipsis = np.broadcast_shapes(*ellipsis_shapes)
    except ValueError:
        raise ShapeError(f"equation {equation!r}: the '...' dims {ellipsis_shapes} do not "
                         f"broadcast") from None
    if not arrow:
        return (*ellipsis, *(sizes[c] for c in sorted(c for c in counts if counts[c] == 1)))
    before, _, after = rhs.partition("...")
    unknown = [c for c in before + after if c not in sizes]
    if unknown:
        raise ShapeError(f"equation {equation!r}: output subscript {unknown[0]!r} is not in "
                         f"any operand")
    return (*(sizes[c] for c in before), *(ellipsis if "..." in rhs else ()),
            *(sizes[c] for c in after))
