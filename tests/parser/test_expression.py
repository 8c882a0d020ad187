"""parser.expression: tokens, the syntax tree, reverse Polish, errors with positions (the
layer that evaluates expressions: tests/layers/test_layers_expression.py). Needs no torch."""

import math

import pytest

from parser.errors import ExpressionError
from parser.expression import (ARITY, Call,
                               Constant, ListExpr, OperandRef, Token, operand_indices,
                               parse_expression, to_rpn, to_text, tokenize)

# ----- tokens and syntax trees ------------------------------------------------------------------

def test_tokenize():
    assert tokenize("add(@0,mul(@12,-2.5e+00))") == [
        Token("name", "add", 0), Token("lparen", "(", 3), Token("operand", "@0", 4),
        Token("comma", ",", 6), Token("name", "mul", 7), Token("lparen", "(", 10),
        Token("operand", "@12", 11), Token("comma", ",", 14), Token("float", "-2.5e+00", 15),
        Token("rparen", ")", 23), Token("rparen", ")", 24)]


def test_tokenize_lists_and_dotted_names():
    kinds = [t.kind for t in tokenize("[1, torch.float(@0)]")]
    assert kinds == ["lbracket", "int", "comma", "name", "lparen", "operand", "rparen",
                     "rbracket"]


@pytest.mark.parametrize("text, value", [
    ("2", 2), ("-1", -1), ("0.5", 0.5), ("-0.5", -0.5), ("1e-05", 1e-05), ("2.5E+3", 2500.0),
    ("1.000000e-5", 1e-05), ("3.", 3.0), ("inf", math.inf), ("-inf", -math.inf),
    ("1.500000e+00-2.000000e+00j", complex(1.5, -2.0)),
    ("1.000000e+00+-2.000000e+00j", complex(1.0, -2.0)),
    ("0.000000e+00+1.000000e+00j", complex(0.0, 1.0)),
    ("True", True), ("False", False),
])
def test_constants(text, value):
    node = parse_expression(f"add(@0,{text})").args[1]
    assert node == Constant(value) and type(node.value) is type(value)


def test_nan_constant():
    assert math.isnan(parse_expression("nan").value)


def test_tree():
    assert parse_expression("add(@0,mul(@1,2.0))") == Call("add", (
        OperandRef(0), Call("mul", (OperandRef(1), Constant(2.0)))))


def test_tree_keeps_positions():
    tree = parse_expression("add(@0,mul(@1,2.0))")
    assert (tree.position, tree.args[1].position, tree.args[1].args[0].position) == (0, 7, 11)


def test_list_tree():
    tree = parse_expression("[1,size(@0,2),-1]")
    assert tree == ListExpr((Constant(1), Call("size", (OperandRef(0), Constant(2))),
                             Constant(-1)))
    assert parse_expression("[]") == ListExpr(())


@pytest.mark.parametrize("expr, rpn", [
    ("add(@0,mul(@1,2.0))", ["@0", "@1", "2.0", "mul", "add"]),
    ("sub(add(mul(@0,2.0),@1),@2)", ["@0", "2.0", "mul", "@1", "add", "@2", "sub"]),
    ("neg(@0)", ["@0", "neg"]),
    ("[1,size(@0,2)]", ["1", "@0", "2", "size/2", "[2]"]),
    ("size(@0)", ["@0", "size/1"]),
    ("mul(@0,1.5e+00-2.0e+00j)", ["@0", "1.5-2j", "mul"]),
])
def test_rpn(expr, rpn):
    assert to_rpn(parse_expression(expr)) == rpn


@pytest.mark.parametrize("expr", [
    "add(@0,mul(@1,2.0))", "[size(@0,0),-1]", "[]", "mul(@0,1.5-2.0j)", "pow(@0,1e-05)",
    "max(@0,-inf)", "torch.float(size(@1))", "and(@0,True)", "neg(@2)",
    "[add(@0,1),@1]", "sub(@0,2.5e+20)",
])
def test_to_text_is_the_inverse_of_parsing(expr):
    tree = parse_expression(expr)
    assert parse_expression(to_text(tree)) == tree
    assert to_text(parse_expression(to_text(tree))) == to_text(tree)


def test_operand_indices():
    assert operand_indices(parse_expression("add(@2,mul(@0,size(@2,1)))")) == {0, 2}
    assert operand_indices(parse_expression("[1,2]")) == set()


@pytest.mark.parametrize("name", sorted(ARITY))
def test_every_function_checks_its_argument_count(name):
    fewest, most = ARITY[name]
    for count in range(fewest, most + 1):
        assert parse_expression(f"{name}({','.join(['@0'] * count)})").name == name
    for count in {fewest - 1, most + 1} - {0}:
        with pytest.raises(ExpressionError, match="takes"):
            parse_expression(f"{name}({','.join(['@0'] * count)})")
    with pytest.raises(ExpressionError):
        parse_expression(f"{name}()")


@pytest.mark.parametrize("expr, position, words", [
    ("", 0, "empty"),
    ("   ", 0, "empty"),
    ("add(@0,@1", 9, "unbalanced"),
    ("mul(@0,2.0", 10, "unbalanced"),
    ("[1,2", 4, "unbalanced"),
    ("add(@0,@1))", 10, "after the end"),
    ("add(@0,1) x", 10, "after the end"),
    ("@0 @1", 3, "after the end"),
    ("foo(@0)", 0, "unknown function 'foo'"),
    ("ad(@0,1)", 0, "did you mean"),
    ("add(@0)", 0, "takes 2 arguments, got 1"),
    ("size(@0,1,2)", 0, "takes 1 or 2 arguments"),
    ("add(@0;1)", 6, "unexpected character ';'"),
    ("add(@0,,@1)", 7, "found ','"),
    ("add(@0,x)", 7, "neither a function call nor a constant"),
    # what pnnx 20261020 writes for torch.expm1(x) + torch.log1p(y): not a valid expression
    ("add(add(add(expm1,@0),log1p),abs(@1)),@2,@3", 12, "neither"),
    ("@", 0, "unexpected character '@'"),
    (")", 0, "found ')'"),
])
def test_parse_errors_show_the_position(expr, position, words):
    with pytest.raises(ExpressionError) as info:
        parse_expression(expr)
    error = info.value
    assert (error.expression, error.position) == (expr, position)
    assert words in str(error)
    if expr.strip():
        assert f"\n    {expr}\n    {' ' * position}^" in str(error)




# ----- limits: length, depth, numbers -----------------------------------------------------------

def test_length_limit():
    from parser.expression import MAX_EXPRESSION_LENGTH
    longest = "add(@0," + " " * (MAX_EXPRESSION_LENGTH - 10) + "1)"
    assert len(longest) == MAX_EXPRESSION_LENGTH - 1
    assert parse_expression(longest + " ") == parse_expression("add(@0,1)")
    for refuse in (parse_expression, tokenize):
        with pytest.raises(ExpressionError, match="characters; this reader takes at most") as info:
            refuse(longest + "  ")
        assert info.value.position == MAX_EXPRESSION_LENGTH and len(str(info.value)) < 500


def _postorder_by_recursion(node):
    from parser.expression import children
    return [n for child in children(node) for n in _postorder_by_recursion(child)] + [node]


@pytest.mark.parametrize("expr", [
    "add(@0,mul(@1,2.0))", "[1,size(@0,2),-1]", "neg(" * 100 + "@0" + ")" * 100,
    "[" + ",".join(f"add(@{i},[{i},{i}])" for i in range(300)) + "]",
])
def test_postorder_is_children_first_left_to_right(expr):
    from parser.expression import postorder
    tree = parse_expression(expr)
    assert [id(n) for n in postorder(tree)] == [id(n) for n in _postorder_by_recursion(tree)]


@pytest.mark.parametrize("expr, position, words", [
    ("add(@0," + "1" * 30 + ")", 7, f"integer '{'1' * 30}' is outside the int64 range"),
    ("[" + "0" * 5000 + "1]", None, None),
    ("@2147483647", None, None),
    ("@2147483648", 0, "operand index '@2147483648' is above 2147483647"),
    ("add(@0," + "x" * 100_000 + ")", 7, "'xxxxxxxxxxxxxxxx"),
    ("[" + "1," * 50_000 + "foo]", 100_001, "'foo' is neither"),
], ids=["int", "zeros", "operand-max", "operand-beyond", "long-name", "late-error"])
def test_numbers_and_names_in_long_texts(expr, position, words):
    if words is None:
        parse_expression(expr)
        return
    with pytest.raises(ExpressionError) as info:
        parse_expression(expr)
    assert info.value.position == position and words in str(info.value)
    assert len(str(info.value)) < 500
