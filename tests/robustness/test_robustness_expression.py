"""Bad pnnx.Expression texts: each is one ExpressionError showing the expression with a caret
under the position, raised when the graph is built (naming the operator), never at run time
and never a RecursionError or ValueError."""

from __future__ import annotations

import numpy as np
import pytest

from infer import ExpressionError, RuntimeGraph
from parser.expression import MAX_DEPTH, parse_expression
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
    shown = str(error).splitlines()
    assert shown[-2].strip() == expr[:200].strip() or expr in str(error)
    assert shown[-1] == "    " + " " * position + "^"
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
    expect_expression_error(tmp_path, "add(@0," + "9" * 5000 + ")", 7, "number too long")
    expect_expression_error(tmp_path / "b", "@" + "1" * 5000, 0, "number too long")


def test_function_names_are_never_looked_up_in_python(tmp_path):
    """Only the fixed table of functions is known: Python names are unknown functions."""
    for name in ("eval", "exec", "open", "os.system", "np.load"):
        expect_expression_error(tmp_path / name, f"{name}(@0)", 0, f"unknown function '{name}'")
