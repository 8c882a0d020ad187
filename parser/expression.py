"""pnnx expressions: the ``expr=`` text of a ``pnnx.Expression`` operator.

pnnx fuses chains of small elementwise ops into one operator whose parameter is a formula over
its inputs, written in prefix (function-call) form. ``@N`` is the operator's N-th input::

    pnnx.Expression  pnnx_expr_0  2 1 0 1 2 expr=add(@0,mul(@1,2.0))       # x0 + x1 * 2.0
    pnnx.Expression  pnnx_expr_1  1 1 0 3   expr=[1,mul(3,size(@0,2)),-1]  # a shape, for view

The grammar, one rule per parse function below::

    node  := operand | number | constant | call | list
    operand  := '@' digits                      @0 @12
    number   := int | float | complex           2  -1  0.5  1.000000e-05  -inf  1.5e+00-2.0e+00j
    constant := 'True' | 'False' | 'None'     None: an absent optional argument (dtype=None)
    call  := name '(' node (',' node)* ')'     add(@0,2)   torch.float(size(@0,2))
    list  := '[' [node (',' node)*] ']'        [1,size(@0,1),-1]

Parsing is done in two steps, as a compiler does: ``tokenize`` cuts the text into tokens, then
a recursive-descent parser (one function per grammar rule) builds a syntax tree of ``OperandRef``,
``Constant``, ``Call`` and ``ListExpr`` nodes. ``to_rpn`` lists the tree in post-order, the
reverse-Polish form a stack machine evaluates (KuiperInfer's expression layer works this way)::

    add(@0,mul(@1,2.0))  ->  @0 @1 2.0 mul add

Nothing is ever evaluated with ``eval``: numbers are matched by patterns and converted by
``int()`` / ``float()`` / ``complex()``. Errors are ExpressionError with the character position
(the message shows the text, cut to a window around that position, with a caret under it),
also for what would break the parser itself or cost out of proportion, at limits far above
anything pnnx writes:

    MAX_EXPRESSION_LENGTH  2**18 characters  (parsing takes time and memory in proportion)
    MAX_DEPTH              100 calls and lists nested (the parser and the tree walkers recurse)
    integers               int64, as torch's; an operand index @N below 2**31

Tokens are cut one at a time as the parser asks for them, so no list of every token is built.
Floats follow C's strtod: ``1e999999`` is inf.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Union, cast

from parser.errors import ExpressionError, quote
from parser.numbers import INT64_MAX, INT64_MIN, int_in_range
from parser.suggest import close_matches

# ----- the functions pnnx writes ----------------------------------------------------------------
# Taken from pnnx's expression writer and Python exporter (tools/pnnx/src/pass_level3/
# fuse_expression.cpp and Graph::python in ir.cpp). All are torch functions of the same name,
# except: neg = unary minus, int = Python int() (truncates), torch.<dtype> = Tensor.to(dtype)
# (pnnx writes ``dtype + "("`` for a cast of a scalar), and/or/xor/lshift/rshift = & | ^ << >>.
CAST_FUNCTIONS: frozenset[str] = frozenset({
    "torch.float", "torch.double", "torch.half", "torch.int", "torch.long", "torch.short",
    "torch.int8", "torch.uint8", "torch.bool", "torch.complex64", "torch.complex128",
})
UNARY_FUNCTIONS: frozenset[str] = frozenset({
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf",
    "exp", "expm1", "floor", "log", "log10", "log1p", "neg", "reciprocal", "round", "rsqrt",
    "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "int",
}) | CAST_FUNCTIONS
BINARY_FUNCTIONS: frozenset[str] = frozenset({
    "add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "max", "min", "maximum",
    "minimum", "atan2", "fmod", "logaddexp", "and", "or", "xor", "lshift", "rshift",
    "size",  # size(@N, dim) -> int; pnnx also writes size(@N) -> the whole shape
})
# Allowed argument counts: (fewest, most).
ARITY: dict[str, tuple[int, int]] = {
    **{name: (1, 1) for name in UNARY_FUNCTIONS},
    **{name: (2, 2) for name in BINARY_FUNCTIONS},
    "size": (1, 2),
}
NAMED_CONSTANTS = {"True": True, "False": False, "None": None}
MAX_DEPTH = 100   # calls and lists nested deeper are refused (pnnx writes a few levels)
MAX_EXPRESSION_LENGTH = 1 << 18  # characters; a longer expression is refused
MAX_OPERAND = (1 << 31) - 1      # the largest N of @N


# ----- tokens -----------------------------------------------------------------------------------

class Token(NamedTuple):
    """One token: ``kind`` is operand | int | float | complex | name | lparen | rparen | comma |
    lbracket | rbracket; ``position`` is the index of its first character in the expression.
    (A named tuple: the tokenizer makes one per token, and tuples are the cheapest to make.)"""

    kind: str
    text: str
    position: int


_UNSIGNED = r"(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf|nan)"
_REAL = rf"(?:{_UNSIGNED}|\d+)"
_NOT_NAME = r"(?![A-Za-z0-9_.])"  # a number must not run on into a name: 'info' is a name
_TOKEN_PATTERNS = [
    ("space", r"\s+"),
    ("operand", r"@\d+"),
    ("complex", rf"-?{_REAL}(?:\+-|[+-]){_REAL}j{_NOT_NAME}"),  # 1.0e+00-2.0e+00j
    ("float", rf"-?{_UNSIGNED}{_NOT_NAME}"),                    # 0.5  1e-05  -inf
    ("int", rf"-?\d+{_NOT_NAME}"),
    ("name", r"[A-Za-z_][A-Za-z0-9_.]*"),                       # add  torch.float  True
    ("lparen", r"\("), ("rparen", r"\)"), ("comma", r","),
    ("lbracket", r"\["), ("rbracket", r"\]"),
]
_TOKEN_RE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _TOKEN_PATTERNS))


def tokenize(expr: str) -> list[Token]:
    """Cut ``expr`` into tokens (whitespace is skipped); an unknown character is an error."""
    _check_length(expr)
    return list(_scan(expr))


def _scan(expr: str) -> Iterator[Token]:
    """The tokens of ``expr``, one at a time (the parser takes them as it goes)."""
    position = 0
    while position < len(expr):
        match = _TOKEN_RE.match(expr, position)
        if match is None:
            raise ExpressionError(f"unexpected character {expr[position]!r}",
                                  expression=expr, position=position)
        kind = cast(str, match.lastgroup)      # every alternative of _TOKEN_RE is named
        if kind != "space":
            yield Token(kind, match.group(), position)
        position = match.end()


def _check_length(expr: str) -> None:
    """Refuse an expression longer than MAX_EXPRESSION_LENGTH before looking at it."""
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"an expression of {len(expr):,} characters; this reader takes "
                              f"at most {MAX_EXPRESSION_LENGTH:,}", expression=expr,
                              position=MAX_EXPRESSION_LENGTH)


# ----- the syntax tree --------------------------------------------------------------------------
# ``position`` (index in the expression text, for error messages) is left out of comparisons,
# so trees built by hand compare equal to parsed ones.

@dataclass(frozen=True, slots=True)
class OperandRef:
    """``@N``: the operator's N-th input."""

    index: int
    position: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class Constant:
    """A literal: int, float (inf and nan included), complex, bool (True / False) or None."""

    value: int | float | complex | bool | None
    position: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class Call:
    """``name(args...)``: one of the functions in ARITY, with its arguments."""

    name: str
    args: tuple[Node, ...]
    position: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class ListExpr:
    """``[a,b,...]``: a list of scalars, e.g. the shape argument of a dynamic view/reshape."""

    items: tuple[Node, ...]
    position: int = field(default=-1, compare=False)


Node = Union[OperandRef, Constant, Call, ListExpr]


# ----- the parser -------------------------------------------------------------------------------

def parse_expression(expr: str) -> Node:
    """Parse a pnnx expression into its syntax tree; ExpressionError if it is not valid."""
    _check_length(expr)
    parser = _Parser(expr)
    if parser.peek() is None:
        raise ExpressionError("empty expression", expression=expr, position=0)
    node = parser.node()
    token = parser.peek()
    if token is not None:
        raise ExpressionError(f"unexpected {quote(token.text)} after the end of the expression",
                              expression=expr, position=token.position)
    return node


class _Parser:
    """Recursive descent over the tokens: one method per grammar rule, one token of look-ahead."""

    def __init__(self, expr: str):
        self.expr = expr
        self.tokens = _scan(expr)
        self.next = next(self.tokens, None)             # the look-ahead token
        self.depth = 0                                  # calls and lists open around here

    def peek(self) -> Token | None:
        return self.next

    def take(self, *kinds: str) -> Token:
        """Consume the next token, which must be of one of ``kinds``."""
        token = self.next
        if token is None or token.kind not in kinds:
            wanted = _describe(kinds)
            found = "the end of the expression" if token is None else quote(token.text)
            hint = " (unbalanced brackets?)" if token is None else ""
            raise self.error(f"expected {wanted} but found {found}{hint}", token)
        self.next = next(self.tokens, None)
        return token

    def error(self, message: str, token: Token | None) -> ExpressionError:
        position = len(self.expr) if token is None else token.position
        return ExpressionError(message, expression=self.expr, position=position)

    # node := operand | number | constant | call | list
    def node(self) -> Node:
        token = self.take("operand", "int", "float", "complex", "name", "lbracket")
        if token.kind == "operand":
            return OperandRef(self.integer(token, token.text[1:], 0, MAX_OPERAND),
                              token.position)
        if token.kind == "int":
            return Constant(self.integer(token, token.text, INT64_MIN, INT64_MAX),
                            token.position)
        if token.kind == "float":
            return Constant(float(token.text), token.position)
        if token.kind == "complex":
            return Constant(_complex(token.text), token.position)
        if token.kind == "lbracket":
            return ListExpr(self.nested(token, "rbracket", allow_empty=True), token.position)
        return self.name(token)

    def integer(self, token: Token, text: str, low: int, high: int) -> int:
        """``int(text)`` if it lies in [low, high], else an error at the token."""
        value = int_in_range(text, low, high)
        if value is None:
            shown = quote(token.text, 40)
            raise self.error(f"operand index {shown} is above {high}" if token.kind == "operand"
                             else f"integer {shown} is outside the int64 range", token)
        return value

    def nested(self, opening: Token, close: str, allow_empty: bool) -> tuple[Node, ...]:
        """The items of a call or list opened by ``opening``, at most MAX_DEPTH deep."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"calls and lists nested more than {MAX_DEPTH} deep", opening)
        items = self.items(close, allow_empty)
        self.depth -= 1
        return items

    # constant := True | False ;  call := name '(' node (',' node)* ')'
    def name(self, token: Token) -> Node:
        following = self.peek()
        if following is None or following.kind != "lparen":
            if token.text in NAMED_CONSTANTS:
                return Constant(NAMED_CONSTANTS[token.text], token.position)
            raise self.error(f"{quote(token.text)} is neither a function call nor a constant",
                             token)
        if token.text not in ARITY:
            close = close_matches(token.text, ARITY)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise self.error(f"unknown function {quote(token.text)}{hint}", token)
        self.take("lparen")
        args = self.nested(token, "rparen", allow_empty=False)
        fewest, most = ARITY[token.text]
        if not fewest <= len(args) <= most:
            wanted = str(fewest) if fewest == most else f"{fewest} or {most}"
            raise self.error(f"{token.text}() takes {wanted} argument{'s' * (most > 1)}, "
                             f"got {len(args)}", token)
        return Call(token.text, args, token.position)

    # node (',' node)* up to the closing bracket ``close``
    def items(self, close: str, allow_empty: bool) -> tuple[Node, ...]:
        following = self.peek()
        if allow_empty and following is not None and following.kind == close:
            self.take(close)
            return ()
        items = [self.node()]
        while self.take("comma", close).kind == "comma":
            items.append(self.node())
        return tuple(items)


_DESCRIBE = {"operand": "an operand", "int": "a number", "float": "a number",
             "complex": "a number", "name": "a name", "lbracket": "'['", "rbracket": "']'",
             "lparen": "'('", "rparen": "')'", "comma": "','"}


def _describe(kinds: tuple[str, ...]) -> str:
    """("operand", "int", "lbracket") -> "an operand, a number or '['"."""
    words = list(dict.fromkeys(_DESCRIBE[kind] for kind in kinds))
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _complex(text: str) -> complex:
    """'1.5e+00-2.0e+00j' (or pnnx's older '1.5e+00+-2.0e+00j') -> complex(1.5, -2.0)."""
    return complex(text.replace("+-", "-"))


# ----- looking at a tree ------------------------------------------------------------------------

def children(node: Node) -> tuple[Node, ...]:
    """The argument nodes of a call, the items of a list, nothing for operands and constants."""
    if isinstance(node, Call):
        return node.args
    if isinstance(node, ListExpr):
        return node.items
    return ()


def postorder(node: Node) -> list[Node]:
    """The nodes children-first: the order a stack machine evaluates them in.

    Walked with a stack, in time proportional to the number of nodes: a node is listed
    before its children from the last child back, and the list is reversed at the end."""
    order, stack = [], [node]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(children(current))
    order.reverse()
    return order


def label(node: Node) -> str:
    """One node as an RPN word: '@0', '2.0', 'add', '[3]' (make a list of the 3 values below).

    A function that takes a varying number of arguments shows it: 'size/1', 'size/2'."""
    if isinstance(node, OperandRef):
        return f"@{node.index}"
    if isinstance(node, Constant):
        return repr(node.value).strip("()")  # complex reprs come in brackets: (1.5-2j)
    if isinstance(node, ListExpr):
        return f"[{len(node.items)}]"
    fewest, most = ARITY[node.name]
    return node.name if fewest == most else f"{node.name}/{len(node.args)}"


def to_rpn(node: Node) -> list[str]:
    """Reverse-Polish listing, e.g. add(@0,mul(@1,2.0)) -> ['@0', '@1', '2.0', 'mul', 'add']."""
    return [label(n) for n in postorder(node)]


def to_text(node: Node) -> str:
    """The expression text of a tree, as pnnx writes it (no spaces); the inverse of
    ``parse_expression``: ``parse_expression(to_text(tree)) == tree``."""
    if isinstance(node, OperandRef):
        return f"@{node.index}"
    if isinstance(node, Constant):
        value = node.value
        if isinstance(value, complex):
            return f"{value.real!r}{value.imag:+}j"           # 1.5-2.0j
        return repr(value)                                    # 2  0.5  1e-05  inf  True
    if isinstance(node, ListExpr):
        return "[" + ",".join(to_text(item) for item in node.items) + "]"
    return f"{node.name}(" + ",".join(to_text(arg) for arg in node.args) + ")"


def operand_indices(node: Node) -> set[int]:
    """Every N that the expression uses as @N."""
    return {n.index for n in postorder(node) if isinstance(n, OperandRef)}
