"""Bad .pnnx.param files: each is one ParamFileError (or GraphError / ShapeError once the
lines are joined) naming the file and the line, never a bare Python error."""

from __future__ import annotations

import os
import re
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from infer import GraphError, InferError, ParamFileError, RuntimeGraph, ShapeError
from parser.param import parse_param
from support import expect_error, model_text, write_model, write_pnnx

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
    pytest.param("big=" + "9" * 5000, "out of the int64 range", id="big=9*5000"),
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
                         "nope.pnnx.param", "no such file")
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


# ----- what the path names, and how big the file is ---------------------------------------------

def build_in_thread(param, seconds: float = 10.0) -> BaseException | None:
    """Build the graph of ``param`` in a daemon thread; the error it raised (a thread still
    blocked after ``seconds`` fails the test instead of hanging the run)."""
    outcome: list[BaseException | None] = []

    def build() -> None:
        try:
            RuntimeGraph(param, param.parent / "model.pnnx.bin").build()
            outcome.append(None)
        except BaseException as error:                 # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"reading {param} blocked for {seconds} s"
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.pnnx.param"
    os.mkfifo(fifo)
    error = build_in_thread(fifo)
    assert isinstance(error, ParamFileError) and error.path == str(fifo)
    assert "pipe" in str(error)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_without_reading_it(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    error = build_in_thread(Path(device))
    assert isinstance(error, ParamFileError) and error.path == device
    assert "a device" in str(error)


def test_a_folder_is_refused(tmp_path):
    error = expect_error(ParamFileError, RuntimeGraph(tmp_path).build, "folder")
    assert error.path == str(tmp_path)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from parser import param
    monkeypatch.setattr(param, "MAX_PARAM_BYTES", 1000)
    text = model_text(INPUT, f"{RELU} " + " ".join(f"k{i}=1" for i in range(300)), OUTPUT)
    expect_error(ParamFileError, lambda: build_text(tmp_path, text), "model.pnnx.param",
                 f"the file has {len(text):,} bytes, more than the 1,000")


def test_the_size_limit_is_generous():
    from parser.param import MAX_PARAM_BYTES
    assert MAX_PARAM_BYTES >= 256 << 20


# ----- encodings --------------------------------------------------------------------------------

def test_a_file_saved_with_a_utf8_bom_builds_and_runs(tmp_path):
    graph = build_text(tmp_path, b"\xef\xbb\xbf" + GOOD.encode())
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(1, 3, 4, 4)
    np.testing.assert_array_equal(graph.forward(x)[0], np.maximum(x, 0))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_say_so(tmp_path, encoding):
    name = encoding.upper()[:6]
    expect_param_error(tmp_path, GOOD.encode(encoding), 1, name, "save it as UTF-8")


# ----- hostile sizes: time and memory in proportion, messages short -----------------------------

TEN_MB = 10 << 20


def _items(item: str, size: int = TEN_MB) -> str:
    """``item,item,...`` about ``size`` characters long."""
    return ",".join([item] * (size // (len(item) + 1)))


# one 10 MB field on the ReLU line: (the field, words of the error); made when a test asks
HUGE_FIELDS: dict[str, tuple[Callable[[], str], str]] = {
    "int list": (lambda: "shape=(" + _items("1") + ")", "items; this reader takes at most"),
    "float list": (lambda: "scale=[" + _items("0.5") + "]", "items; this reader takes at most"),
    "string list": (lambda: "names=(" + _items("a") + ")", "items; this reader takes at most"),
    "complex list": (lambda: "c=(" + _items("1+2j") + ")", "items; this reader takes at most"),
    "annotation": (lambda: "#1=(" + _items("1") + ")f32", "dimensions; this reader takes"),
    "attribute": (lambda: "@w=(" + _items("7") + ")f32", "dimensions; this reader takes"),
    "long integer": (lambda: "n=" + "7" * TEN_MB, "out of the int64 range"),
    "long dim": (lambda: "#1=(1," + "7" * TEN_MB + ")f32", "out of the int64 range"),
    "open list": (lambda: "shape=(" + _items("1"), "not closed"),
    "bad dtype": (lambda: "#1=(1)" + "f" * TEN_MB, "unknown dtype"),
    "dangling $": (lambda: "$x=" + "y" * TEN_MB, "which is not an input"),
}


@pytest.mark.parametrize("case", sorted(HUGE_FIELDS))
def test_a_huge_field_is_refused_quickly_with_a_short_message(tmp_path, case):
    make, words = HUGE_FIELDS[case]
    text = model_text(INPUT, f"{RELU} {make()}", OUTPUT)
    start = time.perf_counter()
    error = expect_param_error(tmp_path, text, 4, words)
    assert time.perf_counter() - start < 2.0
    assert len(str(error)) < 800, str(error)


@pytest.mark.parametrize("case", ["int list", "annotation", "long integer"])
def test_a_huge_field_costs_memory_in_proportion(case):
    """The peak while reading stays a few times the text (it was 60 times for a list)."""
    text = model_text(INPUT, f"{RELU} {HUGE_FIELDS[case][0]()}", OUTPUT)
    tracemalloc.start()
    try:
        with pytest.raises(ParamFileError):
            parse_param(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * len(text), f"{peak / len(text):.1f} bytes per character"


def test_long_values_up_to_the_limits_are_read_in_linear_time():
    """A 10 MB string value and a list of MAX_LIST_ITEMS numbers are fine, and quick."""
    from parser.param import MAX_LIST_ITEMS
    start = time.perf_counter()
    graph = parse_param(model_text(INPUT, f"{RELU} mode={'x' * TEN_MB} "
                                   f"shape=({_items('1234567', 8 * MAX_LIST_ITEMS)})", OUTPUT))
    assert time.perf_counter() - start < 3.0
    params = graph.operators[1].params
    assert len(params["mode"].value) == TEN_MB and len(params["shape"].value) == MAX_LIST_ITEMS


@pytest.mark.parametrize("name", ["operator name", "operator type", "operand", "key"])
def test_long_names_are_quoted_short(tmp_path, name):
    long = "n" * 300_000
    lines = {"operator name": (INPUT, f"nn.ReLU {long} 1 1 0 1", f"nn.ReLU {long} 1 1 1 2"),
             "operator type": (INPUT, f"{long} relu 1 1 0 1", OUTPUT),
             "operand": (INPUT, f"{RELU} #{long}=(1)f32", OUTPUT),
             "key": (INPUT, f"{RELU} {long}=1 {long}=2", OUTPUT)}[name]
    param, binary = write_model(tmp_path, *lines)
    with pytest.raises(InferError) as info:
        RuntimeGraph(param, binary).build()
    assert "model.pnnx.param:" in str(info.value) and len(str(info.value)) < 1200


def _numeric_fields(text: str) -> list[re.Match]:
    """Every run of digits in ``text`` (counts, operand names, shapes, values)."""
    return list(re.finditer(r"\d+", text))


WEIGHTS = {"relu.w": np.zeros((3, 1), np.float32)}
NUMBERED = model_text(INPUT, f"{RELU} slope=2 shape=(1,-1,3) scale=(0.5,2) @w=(3,1)f32",
                      "nn.Sigmoid sig 1 1 1 2 #2=(1,3,4,4)f32", "pnnx.Output out0 1 0 2")


@pytest.mark.parametrize("replacement", ["9" * 5000, str(2**63), str(2**62 + 1), "0" * 5000 + "1",
                                         "1" + "0" * 19], ids=["5000 digits", "2**63", "2**62+1",
                                                               "leading zeros", "1e19"])
def test_every_number_in_a_file_replaced_by_an_absurd_one(tmp_path, replacement):
    """Each digit run of a model in turn (the magic, counts, operand names, dims, values)
    becomes an absurd number: the file builds or fails with an InferError naming its line,
    never a bare ValueError, and the message stays short."""
    for index, match in enumerate(_numeric_fields(NUMBERED)):
        text = NUMBERED[:match.start()] + replacement + NUMBERED[match.end():]
        line = NUMBERED.count("\n", 0, match.start()) + 1
        param, binary = write_pnnx(tmp_path / str(index), text, WEIGHTS)
        start = time.perf_counter()
        try:
            RuntimeGraph(param, binary).build()
        except InferError as error:
            assert len(str(error)) < 1200, str(error)
            if isinstance(error, ParamFileError) and error.line not in (None, 2):
                assert error.line == line, (match.group(), str(error))
        assert time.perf_counter() - start < 2.0
