"""Bad pnnx.Expression texts: each is one ExpressionError showing the expression with a caret
under the position, raised when the graph is built (naming the operator), never at run time
and never a RecursionError or ValueError."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from infer import ExpressionError, RuntimeGraph
from parser.errors import QUOTE_LIMIT
from parser.expression import MAX_DEPTH, MAX_EXPRESSION_LENGTH, parse_expression, postorder
from support import expect_error, write_model


def build_expression(tmp_path, expr: str) -> RuntimeGraph:
    """A graph of one two-input pnnx.Expression with the text ``expr``."""
    param, binary = write_model(
        tmp_path,
        "pnnx.Input in0 0 1 0 #0=(2,3)f32",
        "pnnx.Input in1 0 1 1 #1=(2,3)f32",
        f"pnnx.Expression expr0 2 1 0 1 2 expr={expr}",
        "pnnx.Output out0 1 0 2")
    return RuntimeGraph(param, binary).build()


def expect_expression_error(tmp_path, expr: str, position: int, *words) -> ExpressionError:
    """Building fails with an ExpressionError at ``position`` of ``expr``, naming the operator;
    the message shows the text and a caret under that position."""
    error = expect_error(ExpressionError, lambda: build_expression(tmp_path, expr), *words)
    assert (error.expression, error.position) == (expr, position)
    assert error.operator == "pnnx.Expression expr0"
    *_, shown, caret = str(error).splitlines()
    if len(expr) <= QUOTE_LIMIT:
        assert shown == "    " + expr and caret == "    " + " " * position + "^"
    column = caret.index("^")
    assert set(caret[:column]) == {" "} and caret[column:] == "^"
    if position < len(expr):                            # the caret is under that character
        assert shown[column] == expr[position]
    else:                                               # or just after the end of the text
        assert column == len(shown)
    assert len(str(error)) < 600
    return error


def test_a_good_expression_builds_and_runs(tmp_path):
    graph = build_expression(tmp_path, "add(@0,mul(@1,2))")
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 3, np.float32)
    np.testing.assert_array_equal(graph.forward(a, b)[0], a + b * 2)


@pytest.mark.parametrize("expr, position", [
    ("add(@0,@1", 9),                    # a call never closed: the end of the text
    ("add(@0,mul(@1,2)", 16),
    ("[1,2", 4),
    ("add(@0,@1))", 10),                 # one ')' too many
    ("add(@0,@1]", 9),                   # closed with the wrong bracket
    ("add@0,@1)", 0),                    # never opened: 'add' is not a call
])
def test_unbalanced_brackets(tmp_path, expr, position):
    expect_expression_error(tmp_path, expr, position)


@pytest.mark.parametrize("expr, words", [
    ("sqr(@0)", "unknown function 'sqr'; did you mean sqrt"),
    ("torch.mean(@0)", "unknown function 'torch.mean'"),
    ("__import__(@0)", "unknown function '__import__'"),
])
def test_unknown_function(tmp_path, expr, words):
    expect_expression_error(tmp_path, expr, 0, words)


@pytest.mark.parametrize("expr, position, words", [
    ("add(@0)", 0, "add() takes 2 arguments, got 1"),
    ("mul(@0,@1,2)", 0, "mul() takes 2 arguments, got 3"),
    ("neg(@0,@1)", 0, "neg() takes 1 argument, got 2"),
    ("add(@0,size(@0,1,2))", 7, "size() takes 1 or 2 arguments, got 3"),
    ("add(@0,neg())", 11, "expected an operand"),
])
def test_wrong_number_of_arguments(tmp_path, expr, position, words):
    expect_expression_error(tmp_path, expr, position, words)


@pytest.mark.parametrize("expr, position", [("add(@0,@2)", 7), ("mul(@5,@0)", 4),
                                            ("add(size(@9,0),@0)", 9)])
def test_operand_beyond_the_operators_inputs(tmp_path, expr, position):
    number = expr[position + 1]
    expect_expression_error(tmp_path, expr, position, f"@{number} needs input {number}",
                            "has 2 inputs")


@pytest.mark.parametrize("expr, position, words", [
    ("add(@0,@1)x", 10, "unexpected 'x' after the end"),
    ("add(@0,@1),@0", 10, "unexpected ','"),
    ("@0@1", 2, "unexpected '@1'"),
    ("add(@0,@1);", 10, "unexpected character ';'"),
])
def test_trailing_text(tmp_path, expr, position, words):
    expect_expression_error(tmp_path, expr, position, words)


def test_empty_expression(tmp_path):
    expect_expression_error(tmp_path, "()", 0, "expected an operand")
    with pytest.raises(ExpressionError, match="empty expression"):
        parse_expression("  ")


def test_nesting_deeper_than_the_limit(tmp_path):
    """Python would hit its recursion limit; the parser stops at MAX_DEPTH with a message."""
    ok = "neg(" * MAX_DEPTH + "@0" + ")" * MAX_DEPTH
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    (y,) = build_expression(tmp_path / "ok", ok).forward(x, x)
    np.testing.assert_array_equal(y, x if MAX_DEPTH % 2 == 0 else -x)
    deep = "neg(" * 400 + "@0" + ")" * 400
    expect_expression_error(tmp_path, deep, 4 * MAX_DEPTH, f"nested more than {MAX_DEPTH}")
    expect_expression_error(tmp_path / "b", "[" * 2000 + "]" * 2000, MAX_DEPTH, "nested")


def test_number_too_long_for_int(tmp_path):
    expect_expression_error(tmp_path, "add(@0," + "9" * 5000 + ")", 7, "outside the int64")
    expect_expression_error(tmp_path / "b", "@" + "1" * 5000, 0, "operand index", "above")


def test_function_names_are_never_looked_up_in_python(tmp_path):
    """Only the fixed table of functions is known: Python names are unknown functions."""
    for name in ("eval", "exec", "open", "os.system", "np.load"):
        expect_expression_error(tmp_path / name, f"{name}(@0)", 0, f"unknown function '{name}'")


# ----- hostile sizes: refused quickly, with a short message and the caret in place --------------

TEN_MB = 10 << 20


@pytest.mark.parametrize("shape", ["nested calls", "nested lists", "flat list", "long number"])
def test_a_10_mb_expression_is_refused_at_once(tmp_path, shape):
    depth = TEN_MB // 8
    expr = {"nested calls": "add(" * depth + "@0" + ",1)" * depth,
            "nested lists": "[" * (TEN_MB // 2) + "]" * (TEN_MB // 2),
            "flat list": "[" + ",".join(["size(@0,0)"] * (TEN_MB // 11)) + "]",
            "long number": "add(@0," + "1" * TEN_MB + ")"}[shape]
    start = time.perf_counter()
    expect_expression_error(tmp_path, expr, MAX_EXPRESSION_LENGTH,
                            f"this reader takes at most {MAX_EXPRESSION_LENGTH:,}")
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
@pytest.mark.parametrize("opening, closing", [("neg(", ")"), ("[", "]"), ("add(@0,", ")"),
                                              ("[add(", ")]")])
def test_deep_nesting_is_an_error_never_a_recursion_error(opening, closing, depth):
    """Checked before each level is entered: the parser never nears Python's stack limit."""
    expr = opening * depth + "@1" + closing * depth
    if len(expr) > MAX_EXPRESSION_LENGTH:
        expr = opening * (MAX_EXPRESSION_LENGTH // (len(opening) + len(closing)) - 1) + "@1"
    with pytest.raises(ExpressionError, match=f"nested more than {MAX_DEPTH} deep") as info:
        parse_expression(expr)
    assert len(str(info.value)) < 600


@pytest.mark.slow
def test_an_expression_at_the_length_limit_parses_in_proportion():
    """The longest accepted expression, all one flat list, parses in time proportional to
    its length: at most 4x per item what a tenth of it takes (linear: ~1x; quadratic: ~10x),
    both timed here, so that a slow or busy machine cannot fail it."""
    def flat_list(items: int) -> str:
        return "[" + ",".join(["1"] * items) + "]"

    def seconds(expr: str) -> float:
        start = time.perf_counter()
        parse_expression(expr)
        return time.perf_counter() - start

    items = (MAX_EXPRESSION_LENGTH - 2) // 2
    expr = flat_list(items)
    expr += " " * (MAX_EXPRESSION_LENGTH - len(expr))
    tree = parse_expression(expr)
    assert len(tree.items) == items and len(postorder(tree)) == items + 1
    gc.disable()                  # its passes over every object made so far: not the parser's
    try:
        whole = min(seconds(expr) for _ in range(2))
        tenth = min(seconds(flat_list(items // 10)) for _ in range(3))
    finally:
        gc.enable()
    assert whole < 4 * 10 * tenth, (whole, tenth)


@pytest.mark.parametrize("where", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_an_error_in_a_long_expression_shows_a_window_with_the_caret_on_it(tmp_path, where):
    """A 200 KB expression with one bad character: the message shows a window around it."""
    expr = "[" + ",".join(["mul(@0,@1)"] * 18_000) + "]"
    position = min(int(where * len(expr)), len(expr) - 1)
    if expr[position] in "[],":
        position += 1
    bad = expr[:position] + "?" + expr[position + 1:]
    expect_expression_error(tmp_path, bad, position, "unexpected character '?'")


@pytest.mark.parametrize("number, value", [
    ("9" * 5000 + ".5", float("inf")), ("1e999999", float("inf")), ("-1e999999", float("-inf")),
    ("0" * 5000 + "7", 7), (str(2**63 - 1), 2**63 - 1), (str(-2**63), -2**63),
    ("1e999999-1e999999j", complex(float("inf"), float("-inf"))),
])
def test_huge_numbers_are_a_correct_value(number, value):
    assert parse_expression(f"add(@0,{number})").args[1].value == value


@pytest.mark.parametrize("number", [str(2**63), str(-2**63 - 1), "9" * 20, "9" * 5000,
                                    "-" + "9" * 100_000])
def test_integers_beyond_int64_are_an_error(tmp_path, number):
    expect_expression_error(tmp_path, f"add(@0,{number})", 7, "outside the int64 range")


@pytest.mark.parametrize("index", [str(2**31), "9" * 5000])
def test_operand_indices_beyond_int32_are_an_error(tmp_path, index):
    expect_expression_error(tmp_path, f"add(@{index},@0)", 4, "operand index", "above")
