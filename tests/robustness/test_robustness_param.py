"""Bad .pnnx.param files: each is one ParamFileError (or GraphError / ShapeError once the
lines are joined) naming the file and the line, never a bare Python error."""

from __future__ import annotations

import time

import numpy as np
import pytest

from infer import GraphError, ParamFileError, RuntimeGraph, ShapeError
from support import expect_error, model_text, write_model

INPUT = "pnnx.Input in0 0 1 0 #0=(1,3,4,4)f32"
RELU = "nn.ReLU relu 1 1 0 1"
OUTPUT = "pnnx.Output out0 1 0 1"


def build_text(tmp_path, text: str | bytes):
    """Write ``text`` as model.pnnx.param next to an empty bin and build the graph."""
    param = tmp_path / "model.pnnx.param"
    if isinstance(text, str):
        text = text.encode("utf-8")
    param.write_bytes(text)
    return RuntimeGraph(param, tmp_path / "model.pnnx.bin").build()


def expect_param_error(tmp_path, text, line, *words) -> ParamFileError:
    """Building from ``text`` is a ParamFileError at ``line`` naming the file."""
    error = expect_error(ParamFileError, lambda: build_text(tmp_path, text), *words)
    path = str(tmp_path / "model.pnnx.param")
    assert (error.path, error.line) == (path, line)
    assert f"{path}:{line}:" in str(error)
    return error


GOOD = model_text(INPUT, RELU, OUTPUT)


def test_the_good_file_builds_and_runs(tmp_path):
    graph = build_text(tmp_path, GOOD)
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(1, 3, 4, 4)
    np.testing.assert_array_equal(graph.forward(x)[0], np.maximum(x, 0))


def test_wrong_magic(tmp_path):
    expect_param_error(tmp_path, GOOD.replace("7767517", "7767518"), 1, "bad magic", "7767518")


def test_missing_magic(tmp_path):
    expect_param_error(tmp_path, GOOD.split("\n", 1)[1], 1, "bad magic")


def test_operator_count_disagrees_with_the_lines(tmp_path):
    expect_param_error(tmp_path, GOOD.replace("\n3 2\n", "\n4 2\n"), 2,
                       "declares 4 operators", "3 operator lines")


def test_operand_count_disagrees_with_the_lines(tmp_path):
    expect_param_error(tmp_path, GOOD.replace("\n3 2\n", "\n3 7\n"), 2,
                       "declares 7 operands", "2 distinct operands")


def test_counts_line_is_not_two_counts(tmp_path):
    expect_param_error(tmp_path, GOOD.replace("\n3 2\n", "\n3 two\n"), 2, "operator_count")


@pytest.mark.parametrize("cut", ["nn.ReLU relu 1 1 0", "nn.ReLU relu 1", "nn.ReLU"])
def test_truncated_line(tmp_path, cut):
    text = model_text(INPUT, RELU, OUTPUT).replace(RELU, cut)
    expect_param_error(tmp_path, text, 4, cut)


def test_file_cut_in_the_middle_of_a_line(tmp_path):
    """A truncated download: the last line stops half way, the counts no longer agree."""
    text = GOOD[:GOOD.index("pnnx.Output") + 8]
    expect_param_error(tmp_path, text, 5, "at least")


def test_operand_read_but_never_produced(tmp_path):
    text = model_text(INPUT, "nn.ReLU relu 1 1 9 1", OUTPUT)
    error = expect_error(GraphError, lambda: build_text(tmp_path, text),
                         "model.pnnx.param:4", "operand '9'", "no operator produces it")
    assert error.operator == "nn.ReLU relu"


def test_operand_read_before_its_producers_line_is_fine(tmp_path):
    """Lines out of order are joined by name and sorted, so this is not an error."""
    graph = build_text(tmp_path, model_text(OUTPUT, RELU, INPUT))
    x = np.full((1, 3, 4, 4), -2.0, np.float32)
    np.testing.assert_array_equal(graph.forward(x)[0], np.zeros_like(x))


def test_operand_produced_twice(tmp_path):
    text = model_text(INPUT, RELU, "nn.Sigmoid sig 1 1 0 1", OUTPUT)
    error = expect_error(GraphError, lambda: build_text(tmp_path, text),
                         "model.pnnx.param:5", "operand '1' is produced twice", "line 4")
    assert error.operator == "nn.Sigmoid sig"


def test_operator_name_given_twice(tmp_path):
    """Two operators called 'relu' would read the same bin entries and make run_to ambiguous."""
    text = model_text(INPUT, RELU, "nn.Sigmoid relu 1 1 1 2", "pnnx.Output out0 1 0 2")
    expect_param_error(tmp_path, text, 5, "operator name 'relu' is already taken by line 4")


@pytest.mark.parametrize("item, words", [
    ("inplace", "expected key=value"),
    ("=3", "expected key=value"),
    ("@=(3)f32", "expected key=value"),
    ("kernel_size=(3,3", "not closed"),
    ("@weight=3f32", "(shape)dtype"),
    ("@weight=(3,?)f32", "bad dimension '?'"),
    ("#1=(1,-3,4,4)f32", "bad dimension '-3'"),
    ("#5=(1)f32", "not an input or output"),
    ("$input=7", "not an input"),
    ("slope=0.1 slope=0.2", "slope is given twice"),
    ("@w=(1)f32 @w=(2)f32", "@w is given twice"),
    ("big=" + "9" * 5000, "big="),
])
def test_bad_parameter_syntax(tmp_path, item, words):
    text = model_text(INPUT, f"{RELU} {item}", OUTPUT)
    expect_param_error(tmp_path, text, 4, words)


@pytest.mark.parametrize("annotation", ["#0=(1,3,4,4)f31", "#0=(1,3,4,4)float", "#0=(1,3,4,4)"])
def test_unknown_dtype(tmp_path, annotation):
    text = model_text(INPUT.replace("#0=(1,3,4,4)f32", annotation), RELU, OUTPUT)
    expect_param_error(tmp_path, text, 3, "dtype")


def test_unknown_attribute_dtype(tmp_path):
    text = model_text(INPUT, f"{RELU} @weight=(3)float32", OUTPUT)
    expect_param_error(tmp_path, text, 4, "unknown dtype 'float32'")


def test_annotated_shape_disagrees_with_the_computed_one(tmp_path):
    text = model_text(INPUT, "nn.MaxPool2d pool 1 1 0 1 kernel_size=(2,2) #1=(1,3,4,4)f32",
                      OUTPUT)
    error = expect_error(ShapeError, lambda: build_text(tmp_path, text),
                         "model.pnnx.param:4", "annotated (1, 3, 4, 4)", "computes (1, 3, 2, 2)")
    assert error.operator == "nn.MaxPool2d pool"


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file(tmp_path, content):
    expect_param_error(tmp_path, content, 1, "empty file")


def test_binary_file(tmp_path):
    """All 256 byte values: byte 10 ends line 1, byte 0x80 on line 2 is not UTF-8."""
    expect_param_error(tmp_path, bytes(range(256)) * 4, 2, "not a text file", "0x80")


def test_bin_given_as_the_param_file(tmp_path):
    """A common slip: the two paths swapped. The zip is refused as a param file."""
    param, binary = write_model(tmp_path, INPUT, RELU, OUTPUT,
                                weights={"x.w": np.arange(300, dtype=np.float32)})
    error = expect_error(ParamFileError, RuntimeGraph(binary, param).build, str(binary))
    assert error.path == str(binary)


def test_non_utf8_text_names_its_line(tmp_path):
    text = model_text(INPUT, f"{RELU} mode=CAFE", OUTPUT).encode().replace(b"CAFE", b"caf\xe9")
    expect_param_error(tmp_path, text, 4, "not a text file", "UTF-8")


def test_missing_file(tmp_path):
    error = expect_error(ParamFileError, RuntimeGraph(tmp_path / "nope.pnnx.param").build,
                         "nope.pnnx.param", "cannot read")
    assert error.line is None


def test_no_input_or_no_output_operator(tmp_path):
    expect_error(GraphError, lambda: build_text(tmp_path, model_text(INPUT, RELU)),
                 "no pnnx.Output")
    (tmp_path / "b").mkdir()
    expect_error(GraphError, lambda: build_text(tmp_path / "b", model_text(
        "nn.ReLU relu 0 1 1", OUTPUT)), "no pnnx.Input")


def test_a_huge_file_is_read_in_linear_time(tmp_path):
    """A 500 KB line and thousands of lines are refused quickly, not in minutes."""
    long_line = f"{RELU} " + " ".join(f"k{i}=(1,2.5,a)" for i in range(30_000)) + " bad"
    start = time.perf_counter()
    expect_param_error(tmp_path, model_text(INPUT, long_line, OUTPUT), 4, "expected key=value")
    lines = [INPUT] + [f"nn.ReLU r{i} 1 1 {i} {i + 1}" for i in range(5_000)]
    text = model_text(*lines, "pnnx.Output out0 1 0 5000").replace("\n5002 ", "\n5003 ")
    expect_param_error(tmp_path, text, 2, "declares 5003 operators")
    assert time.perf_counter() - start < 10
