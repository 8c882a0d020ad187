"""parser.errors: messages stay readable whatever the file holds (the cutting helpers, and
the errors that use them). Needs no torch."""

import random

import pytest

from parser.errors import (MESSAGE_LINE_LIMIT, QUOTE_LIMIT, ExpressionError, InferError,
                           ParamFileError, excerpt, quote, shorten)


def test_short_text_is_shown_whole():
    assert excerpt("add(@0,1)") == ("add(@0,1)", None)
    assert excerpt("add(@0,1)", 4) == ("add(@0,1)", 4)
    assert shorten("x" * QUOTE_LIMIT) == "x" * QUOTE_LIMIT
    assert quote("a'b") == repr("a'b")


def test_long_text_keeps_its_start_and_end_and_says_how_much_is_left_out():
    text = "start" + "x" * 100_000 + "end"
    shown = shorten(text)
    assert shown.startswith("start") and shown.endswith("end")
    assert f"[{len(text) - 2 * (QUOTE_LIMIT // 2):,} characters]" in shown
    assert len(shown) < QUOTE_LIMIT + 40
    assert len(quote(text)) < QUOTE_LIMIT + 40


@pytest.mark.parametrize("length", [QUOTE_LIMIT + 1, 500, 500_000])
def test_the_caret_column_points_at_the_same_character(length):
    """Every position of a long text, shown in a window: the column holds that character."""
    rng = random.Random(length)
    text = "".join(rng.choice("abcdefgh(),@0123456789") for _ in range(length))
    for position in [0, 1, length // 2, length - 1, length] + rng.sample(range(length), 50):
        shown, column = excerpt(text, position)
        assert column is not None and len(shown) <= QUOTE_LIMIT + 6
        if position < length:
            assert shown[column] == text[position], position
        else:                                    # the end of the text: just after the last
            assert column == len(shown) and shown.endswith(text[-10:])


def test_control_characters_are_escaped_and_the_caret_follows():
    shown, column = excerpt("ab\rc\0d", 4)
    assert shown == "ab\\rc\\x00d" and shown[column:].startswith("\\x00")
    assert "\r" not in shorten("x\r" * 1000) and "\t" in shorten("a\tb")


def test_expression_error_shows_a_window_with_the_caret_under_the_problem():
    expr = "add(@0," * 20_000 + "?" + ")" * 20_000
    error = ExpressionError("unexpected character '?'", expression=expr,
                            position=expr.index("?"))
    *_, shown, caret = str(error).splitlines()
    assert len(shown) < QUOTE_LIMIT + 20
    assert shown[caret.index("^")] == "?"
    assert error.expression == expr                      # the whole text stays on the error


def test_param_file_error_cuts_the_line_it_shows():
    line = "nn.ReLU relu 1 1 0 1 " + "k=" + "9" * 300_000
    error = ParamFileError("bad", path="m.pnnx.param", line=3, text=line)
    assert len(str(error)) < 300 and error.text == line
    assert str(error).startswith("m.pnnx.param:3: bad\n    nn.ReLU relu")


def test_any_message_line_is_cut_to_a_readable_length():
    """The safety net: whatever an error is given, no line of its message runs on."""
    error = InferError("shape " + "(1, " * 200_000 + ")\nsecond line")
    lines = str(error).splitlines()
    assert [len(line) <= MESSAGE_LINE_LIMIT + 40 for line in lines] == [True, True]
    assert lines[1] == "second line" and error.message == str(error)


def test_an_operator_error_names_its_line_unless_the_message_cites_it():
    from parser.errors import ShapeError

    told = ShapeError("a shape 2:3:4, and line 12 of something else").with_operator("nn.ReLU r", 3)
    assert str(told).startswith("operator nn.ReLU r (line 3): a shape 2:3:4")
    cited = ShapeError("/m/model.pnnx.param:3: bad").with_operator("nn.ReLU r", 3)
    assert str(cited) == "operator nn.ReLU r: /m/model.pnnx.param:3: bad"
    unknown = ShapeError("bad").with_operator("nn.ReLU r")
    assert str(unknown) == "operator nn.ReLU r: bad"
