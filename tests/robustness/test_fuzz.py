"""Property-based fuzzing of the three readers with mutated REAL files.

The shipped EfficientNet-Lite0 files and a small pnnx export are damaged the way files get
damaged (a flipped byte, a cut-off download, a deleted or doubled line, swapped or replaced
tokens, a hand edit), then read. Every outcome must be one of:

* a correct load: the param graph builds and runs; bin arrays equal the undamaged file's
  (the entries' CRC-32 catches flipped weight bytes); an expression parses and evaluates;
* an error of the project's own (``InferError`` and its subclasses),

within a time bound per example (hypothesis' ``deadline``). Anything else (a bare KeyError,
IndexError, UnicodeDecodeError, struct.error, zipfile.BadZipFile, RecursionError) fails.
The last section is malice rather than damage: numbers of thousands of digits, other encodings
and line ends, values of megabytes, expressions nested a hundred thousand deep.

How many cases run: the ``fuzz`` profile (the normal test run, ~35 s in all); for a long run

    PNNX_FUZZ=long python -m pytest tests/robustness/test_fuzz.py --hypothesis-show-statistics

(``PNNX_FUZZ_EXAMPLES=N`` sets the examples per test of either profile.)
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings, strategies as st

from infer import InferError, RuntimeGraph
from layers.expression import ExpressionLayer
from parser import PnnxBin, parse_expression, parse_param, to_text
from parser.errors import ExpressionError, ParamFileError
from support import REPO

LITE0 = REPO / "model_file" / "efficientnet_lite0" / "efficientnet_lite0.pnnx"

_COMMON = dict(database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
# examples per test: (fuzz, long). The fuzz counts keep the whole file near 20 s on one core.
_EXAMPLES = {"param_text": (300, 20000), "param_build": (250, 5000), "bin_small": (250, 20000),
             "bin_lite0": (25, 1000), "expression": (500, 50000),
             # hostile sizes, numbers and encodings (the last section of this file)
             "param_numbers": (150, 10000), "param_encoding": (100, 5000),
             "param_long_values": (60, 3000), "expression_hostile": (150, 10000)}
PROFILE = os.environ.get("PNNX_FUZZ", "fuzz")
if PROFILE not in ("fuzz", "long"):
    raise ValueError(f"PNNX_FUZZ must be 'fuzz' or 'long', got {PROFILE!r}")


def fuzz_settings(name: str, deadline_ms: int) -> settings:
    """The settings of one fuzz test: its example count for the profile, its time bound."""
    examples = _EXAMPLES[name][PROFILE == "long"]
    examples = int(os.environ.get("PNNX_FUZZ_EXAMPLES", examples))
    return settings(max_examples=examples, deadline=timedelta(milliseconds=deadline_ms),
                    **_COMMON)


# ----- the real files ---------------------------------------------------------------------------

class Mixed(nn.Module):
    """A small model touching many layers: conv, relu, two poolings, cat, sigmoid, an
    expression, adaptive pooling, reshape, linear, softmax."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        y = torch.cat((F.max_pool2d(y, 2, ceil_mode=True), F.avg_pool2d(y, 2, ceil_mode=True)), 1)
        y = y * torch.sigmoid(y) + 0.5
        y = F.adaptive_avg_pool2d(y, 1).view(x.size(0), -1)
        return torch.softmax(self.fc(y), dim=1)


class Files(tuple):
    """(param text, bin bytes, bin path); shown by its bin path in a falsifying example."""

    def __repr__(self) -> str:
        return f"Files({self[2].name})"


@pytest.fixture(scope="module")
def small(pnnx_export):
    """The Mixed model exported by pnnx (dynamic): Files(param text, bin bytes, bin path)."""
    torch.manual_seed(0)
    param, binary = pnnx_export(Mixed().eval(), (torch.rand(1, 3, 16, 16),), "fuzz_mixed",
                                dynamic=True)
    return Files((param.read_text(), binary.read_bytes(), binary))


class Text(str):
    """A file's text, shown by its name in a falsifying example."""

    def __repr__(self) -> str:
        return "Text(efficientnet_lite0.pnnx.param)"


@pytest.fixture(scope="module")
def lite0_text():
    return Text(Path(f"{LITE0}.param").read_text())


# ----- mutations --------------------------------------------------------------------------------

# Tokens a damaged or hand-edited file might hold where another token was.
ODD_TOKENS = ["-1", "0", "1", "2", "99999999999", "?", "(", ")", "()", "[]", "None", "True",
              "nan", "inf", "-inf", "f33", "i64", "=", "#0=(1)f32", "@w=(1)f32", "$x=0",
              "#1=(?,3)f32", "(1,2", "(1,?)", "expr=add(@0,@9)", "7767517", "é", "\t", "%s"]


@st.composite
def mutated_text(draw, text: str, max_mutations: int = 3) -> str:
    """``text`` after one to ``max_mutations`` mutations of whole lines, tokens or characters."""
    for _ in range(draw(st.integers(1, max_mutations))):
        lines = text.split("\n")
        kind = draw(st.sampled_from(["delete line", "duplicate line", "swap lines",
                                     "swap tokens", "replace token", "delete token",
                                     "flip char", "delete char", "truncate"]))
        i = draw(st.integers(0, len(lines) - 1))
        tokens = lines[i].split(" ")
        j, k = draw(st.integers(0, len(tokens) - 1)), draw(st.integers(0, len(tokens) - 1))
        if kind == "delete line":
            del lines[i]
        elif kind == "duplicate line":
            lines.insert(i, lines[i])
        elif kind == "swap lines":
            m = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[m] = lines[m], lines[i]
        elif kind == "swap tokens":
            tokens[j], tokens[k] = tokens[k], tokens[j]
        elif kind == "replace token":
            tokens[j] = draw(st.sampled_from(ODD_TOKENS) | st.text(max_size=6))
        elif kind == "delete token":
            del tokens[j]
        if kind in ("swap tokens", "replace token", "delete token"):
            lines[i] = " ".join(tokens)
        text = "\n".join(lines)
        if kind in ("flip char", "delete char", "truncate") and text:
            at = draw(st.integers(0, len(text) - 1))
            if kind == "flip char":
                text = text[:at] + draw(st.characters(codec="utf-8")) + text[at + 1:]
            elif kind == "delete char":
                text = text[:at] + text[at + 1:]
            else:
                text = text[:at]
    return text


@st.composite
def mutated_bytes(draw, data: bytes, region: tuple[int, int] | None = None) -> bytes:
    """``data`` with flipped bytes (within ``region`` if given), cut short, or both."""
    data = bytearray(data)
    start, stop = region or (0, len(data))
    kind = draw(st.sampled_from(["flip", "flips", "truncate", "flip and truncate", "zero run"]))
    if kind in ("flip", "flips", "flip and truncate"):
        for _ in range(draw(st.integers(1, 1 if kind != "flips" else 8))):
            at = draw(st.integers(start, stop - 1))
            data[at] ^= draw(st.integers(1, 255))
    if kind == "zero run":
        at = draw(st.integers(start, stop - 1))
        end = min(len(data), at + draw(st.integers(1, 64)))
        data[at:end] = bytes(end - at)
    if kind in ("truncate", "flip and truncate"):
        data = data[:draw(st.integers(0, len(data) - 1))]
    return bytes(data)


# ----- param text -------------------------------------------------------------------------------

def _parse_or_error(text: str) -> None:
    try:
        graph = parse_param(text, "fuzz.pnnx.param")
    except ParamFileError as error:
        assert error.path == "fuzz.pnnx.param" and "fuzz.pnnx.param" in str(error)
        event("ParamFileError")
        return
    event("parsed")
    assert all(isinstance(op.line, int) and op.line >= 3 for op in graph.operators)


@given(data=st.data())
@fuzz_settings("param_text", deadline_ms=1000)
def test_mutated_param_text_parses_or_is_a_param_file_error(data, lite0_text, small):
    base = data.draw(st.sampled_from([lite0_text, small[0]]), label="base")
    _parse_or_error(data.draw(mutated_text(base), label="text"))


def _small_input(graph: RuntimeGraph) -> list[np.ndarray]:
    """An input for every pnnx.Input: the traced shape, a dynamic dim as 1 (batch) or 12."""
    arrays = []
    for shape in graph.input_shapes:
        dims = [(1 if i == 0 else 12) if d is None else d for i, d in enumerate(shape or (1,))]
        arrays.append(np.random.default_rng(0).random(dims, dtype=np.float32))
    return arrays


def _build_and_run(param: Path, binary: Path) -> None:
    """Build the graph and, where its shapes stay small, run it: results or an InferError."""
    try:
        graph = RuntimeGraph(param, binary).build()
        inputs = _small_input(graph)
        plan = graph.infer_shapes(*[x.shape for x in inputs])
        if sum(int(np.prod(s, dtype=np.float64)) for s in plan.values()) > 2_000_000:
            event("built, too big to run here")
            return                                   # a huge but valid model: not run here
        outputs = graph.forward(*inputs)
    except InferError as error:
        event(type(error).__name__)
        return
    event("built and ran")
    assert all(isinstance(y, np.ndarray) for y in outputs)


@given(data=st.data())
@fuzz_settings("param_build", deadline_ms=4000)
def test_mutated_param_builds_and_runs_or_is_an_infer_error(data, small, started,
                                                           tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_param", numbered=True)
    lite0 = data.draw(st.booleans(), label="efficientnet")
    base = Path(f"{LITE0}.param").read_text() if lite0 else small[0]
    binary = Path(f"{LITE0}.bin") if lite0 else small[2]
    param = folder / "fuzz.pnnx.param"
    param.write_text(data.draw(mutated_text(base), label="text"), encoding="utf-8")
    _build_and_run(param, binary)


# ----- bin archive ------------------------------------------------------------------------------

ATTRIBUTE = re.compile(r"@(\S+)=\(([\d,]*)\)(\w+)")


def _attributes(param_text: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(entry name, shape, dtype) of every @attribute of a param text."""
    found = []
    for line in param_text.splitlines()[2:]:
        fields = line.split()
        for name, dims, dtype in ATTRIBUTE.findall(line):
            shape = tuple(int(d) for d in dims.split(",") if d)
            found.append((f"{fields[1]}.{name}", shape, dtype))
    return found


def _read_all(path: Path, attributes, in_memory: bool = False) -> dict[str, np.ndarray] | None:
    """Every attribute's array, mapped or read into memory, or None after a BinFileError
    (another error fails the test)."""
    from parser.errors import BinFileError
    try:
        with PnnxBin(path, in_memory=in_memory) as archive:
            return {key: archive.read(key, shape, dtype).copy()
                    for key, shape, dtype in attributes}
    except BinFileError as error:
        assert str(path) in str(error)
        event("BinFileError")
        return None


def _check_damaged_bin(folder: Path, original: Path, damaged: bytes, attributes) -> None:
    path = folder / "fuzz.pnnx.bin"
    path.write_bytes(damaged)
    mapped, in_memory = (_read_all(path, attributes, mode) for mode in (False, True))
    assert (mapped is None) == (in_memory is None), "one mode read what the other refused"
    if mapped is not None and in_memory is not None:   # read despite the damage: must be right
        event("read, the same arrays")
        expected = _read_all(original, attributes)
        assert expected is not None
        for arrays in (mapped, in_memory):
            for key, array in arrays.items():
                np.testing.assert_array_equal(array, expected[key], err_msg=key)


@given(data=st.data())
@fuzz_settings("bin_small", deadline_ms=1000)
def test_mutated_small_bin_reads_the_same_arrays_or_is_a_bin_file_error(data, small,
                                                                        tmp_path_factory):
    text, content, original = small
    damaged = data.draw(mutated_bytes(content), label="bin")
    folder = tmp_path_factory.mktemp("fuzz_bin", numbered=True)
    _check_damaged_bin(folder, original, damaged, _attributes(text))


@given(data=st.data())
@fuzz_settings("bin_lite0", deadline_ms=3000)
def test_mutated_lite0_bin_reads_the_same_arrays_or_is_a_bin_file_error(data, lite0_text,
                                                                        tmp_path_factory):
    content = Path(f"{LITE0}.bin").read_bytes()
    # the zip structure sits in the local headers (spread over the file) and the central
    # directory at its end: flip anywhere, or in the last 8 KB, or cut the file short
    region = data.draw(st.sampled_from([(0, len(content)), (len(content) - 8192, len(content))]),
                       label="region")
    damaged = data.draw(mutated_bytes(content, region), label="bin")
    folder = tmp_path_factory.mktemp("fuzz_lite0", numbered=True)
    _check_damaged_bin(folder, Path(f"{LITE0}.bin"), damaged, _attributes(lite0_text))


# ----- expressions ------------------------------------------------------------------------------

EXPRESSIONS = [
    "add(@0,@1)", "add(mul(@0,@1),0.5)", "[1,mul(3,size(@0,2)),-1]", "[size(@0,0),-1]",
    "div(sub(@0,1.000000e-05),sqrt(add(@1,2)))", "floor_divide(size(@0,-1),2)",
    "torch.float(size(@0))", "pow(neg(@1),2.5)", "max(@0,min(@1,-inf))",
    "mul(@0,1.500000e+00-2.000000e+00j)", "and(torch.bool(@0),True)", "int(size(@0,1))",
    "remainder(rsqrt(abs(@0)),fmod(@1,3))", "logaddexp(tanh(@0),erf(@1))",
]
EXPRESSION_PIECES = ["(", ")", "[", "]", ",", "@0", "@1", "@7", "@", "-", ".", "e", "j", "+",
                     "add", "size", "mul(", "True", "inf", "nan", "1e999", "torch.", " "]


@st.composite
def mutated_expression(draw) -> str:
    text = draw(st.sampled_from(EXPRESSIONS))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "replace", "truncate", "swap"]))
        piece = draw(st.sampled_from(EXPRESSION_PIECES) | st.text(max_size=3))
        if kind == "insert":
            text = text[:at] + piece + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 4)):]
        elif kind == "replace":
            text = text[:at] + piece + text[at + 1:]
        elif kind == "truncate":
            text = text[:at]
        elif text:
            other = draw(st.integers(0, len(text) - 1))
            low, high = sorted((min(at, len(text) - 1), other))
            text = text[:low] + text[high] + text[low + 1:high] + text[low] + text[high + 1:]
    return text


@given(expr=mutated_expression())
@fuzz_settings("expression", deadline_ms=1000)
def test_mutated_expression_parses_and_evaluates_or_is_an_error(expr):
    try:
        tree = parse_expression(expr)
    except ExpressionError as error:
        assert error.expression == expr
        assert error.position is None or 0 <= error.position <= len(expr)
        event("ExpressionError while parsing")
        return
    text = to_text(tree)                                   # the tree prints back to itself
    assert to_text(parse_expression(text)) == text         # (as text: nan != nan)
    layer = ExpressionLayer()
    try:
        layer.load_param({"expr": expr})
        inputs = [np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 3, 4),
                  np.full((2, 3, 4), 0.5, np.float32)]
        shapes = layer.infer_shapes([x.shape for x in inputs])
        (y,) = layer.forward(inputs)
    except InferError as error:
        event(f"{type(error).__name__} while evaluating")
        return
    event("parsed and evaluated")
    assert tuple(shapes[0]) == np.shape(y)


def test_fuzz_profile_is_known():
    """The profile named by PNNX_FUZZ sets every test's example count."""
    assert fuzz_settings("expression", 100).max_examples == int(os.environ.get(
        "PNNX_FUZZ_EXAMPLES", _EXAMPLES["expression"][PROFILE == "long"]))


# ----- hostile sizes, numbers and encodings -----------------------------------------------------
# Not damage but malice (issue 21): numbers of thousands of digits anywhere a number goes, files
# in other encodings or with odd line ends, values of hundreds of thousands of characters, and
# expressions nested a hundred thousand deep. Every outcome is a parse or the reader's own error,
# within the time bound, with a message of readable lines.

def _assert_readable(error: Exception) -> None:
    """No line of the message runs on (quoted text is cut; parser.errors)."""
    from parser.errors import MESSAGE_LINE_LIMIT
    assert max(len(line) for line in str(error).splitlines()) <= MESSAGE_LINE_LIMIT + 100


@st.composite
def hostile_numbers(draw) -> str:
    """A number text at or past a limit: int64's edges, int()'s 4300 digits, float overflow."""
    digits = draw(st.sampled_from([1, 18, 19, 20, 63, 4300, 4301, 6000]) | st.integers(1, 6000))
    kind = draw(st.sampled_from(["int", "zeros", "edge", "float", "exponent", "complex"]))
    if kind == "int":
        return draw(st.sampled_from(["", "-"])) + "9" * digits
    if kind == "zeros":
        return "0" * digits + str(draw(st.integers(0, 2**64)))
    if kind == "edge":
        return str(draw(st.sampled_from([2**31, 2**62, 2**63, 2**64])) +
                   draw(st.integers(-2, 2)) * draw(st.sampled_from([1, -1])))
    if kind == "float":
        return "9" * digits + ".5"
    if kind == "exponent":
        return f"1e{'9' * min(digits, 30)}"
    return f"{'1' * digits}.0e+00-1e{'9' * 8}j"


@given(data=st.data())
@fuzz_settings("param_numbers", deadline_ms=2000)
def test_hostile_numbers_in_a_param_file_parse_or_are_a_param_file_error(data, lite0_text):
    """One to three runs of digits of a real file (a count, an operand, a dim, a value)
    replaced by hostile numbers."""
    text = str(lite0_text)
    runs = list(re.finditer(r"\d+", text))
    for _ in range(data.draw(st.integers(1, 3), label="replacements")):
        run = data.draw(st.sampled_from(runs), label="run")
        number = data.draw(hostile_numbers(), label="number")
        text = text[:run.start()] + number + text[run.end():]
        runs = list(re.finditer(r"\d+", text))
    try:
        parse_param(text, "fuzz.pnnx.param")
    except ParamFileError as error:
        assert error.line is not None and "fuzz.pnnx.param:" in str(error)
        _assert_readable(error)
        event(f"ParamFileError: {'int64' if 'int64' in str(error) else 'other'}")
        return
    event("parsed")


LINE_ENDS = {"LF": "\n", "CRLF": "\r\n", "CR": "\r"}
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1"]


@given(data=st.data())
@fuzz_settings("param_encoding", deadline_ms=2000)
def test_any_encoding_and_line_end_reads_the_same_or_says_why_not(data, lite0_text,
                                                                  tmp_path_factory):
    """The real file saved as an editor might: a BOM, other line ends, leading blanks or
    whitespace, another encoding, a non-ASCII character. UTF-8 (with or without a BOM) with LF
    or CRLF line ends reads as the original; anything else is a ParamFileError naming the
    file and a line."""
    from parser import read_param
    line_end = data.draw(st.sampled_from(sorted(LINE_ENDS)), label="line end")
    encoding = data.draw(st.sampled_from(ENCODINGS), label="encoding")
    prefix = data.draw(st.sampled_from(["", " ", "\t", "\n", "\ufeff"]), label="prefix")
    text = prefix + str(lite0_text).replace("\n", LINE_ENDS[line_end])
    if data.draw(st.booleans(), label="non-ASCII"):
        at = data.draw(st.integers(0, len(text)), label="at")
        text = text[:at] + data.draw(st.sampled_from("éü€中\u00a0\u2028"), label="char") + text[at:]
    try:
        content = text.encode(encoding)
    except UnicodeEncodeError:
        content = text.encode(encoding, errors="replace")
    path = tmp_path_factory.mktemp("fuzz_encoding", numbered=True) / "fuzz.pnnx.param"
    path.write_bytes(content)
    plain = (encoding.startswith("utf-8") and line_end != "CR" and prefix in ("", " ", "\t",
                                                                               "\ufeff"))
    try:
        graph = read_param(path)
    except ParamFileError as error:
        assert error.path == str(path) and error.line is not None
        _assert_readable(error)
        assert not (plain and text.isascii()), f"refused a plain UTF-8 file: {error}"
        event(f"ParamFileError ({encoding}, {line_end})")
        return
    event(f"read ({encoding}, {line_end})")
    if plain and text.isascii():
        original = parse_param(str(lite0_text))
        assert [op.name for op in graph.operators] == [op.name for op in original.operators]


@st.composite
def long_fields(draw) -> str:
    """One key=value (or @, #, $) field of up to a few million characters."""
    count = draw(st.sampled_from([64, 65, 4096, 150_000, 2**20 + 1]) | st.integers(0, 150_000))
    item = draw(st.sampled_from(["1", "-7", "0.5", "1e-05", "1.0e+00-2.0e+00j", "a", "?",
                                 "123456789012345678901234", "%h"]))
    items = ",".join([item] * count)
    kind = draw(st.sampled_from(["list", "list unclosed", "shape", "attribute", "string",
                                 "key", "operand", "name"]))
    return {"list": f"v=({items})", "list unclosed": f"v=[{items}",
            "shape": f"#0=({items})f32", "attribute": f"@w=({items})f32",
            "string": "mode=" + "x" * count * 3, "key": "k" * count + "=1",
            "operand": f"$x={'y' * count}", "name": f"#{'z' * count}=(1)f32"}[kind]


@given(data=st.data())
@fuzz_settings("param_long_values", deadline_ms=2000)
def test_long_values_parse_in_proportion_or_are_a_param_file_error(data):
    """A field of up to a few MB on an operator line: read in time in proportion to its size
    (the deadline), or refused with a readable message naming line 4."""
    from support import model_text
    field = data.draw(long_fields(), label="field")
    text = model_text("pnnx.Input in0 0 1 0 #0=(1,3)f32", f"nn.ReLU relu 1 1 0 1 {field}",
                      "pnnx.Output out0 1 0 1")
    try:
        parse_param(text, "fuzz.pnnx.param")
    except ParamFileError as error:
        assert error.line == 4
        _assert_readable(error)
        event("ParamFileError")
        return
    event("parsed")


@st.composite
def hostile_expressions(draw) -> str:
    """Deep nesting (up to 100,000), long flat lists, hostile numbers, a stray character."""
    opening, closing = draw(st.sampled_from([("neg(", ")"), ("[", "]"), ("add(@0,", ")"),
                                             ("[add(", ",1)]"), ("size(", ",0)")]))
    depth = draw(st.sampled_from([99, 100, 101, 100_000]) | st.integers(0, 3000))
    atom = draw(st.sampled_from(["@0", "@1", "2.5", "[]", "True"]) | hostile_numbers())
    if draw(st.booleans()):
        atom = "[" + ",".join([atom] * draw(st.integers(0, 30_000))) + "]"
    expr = opening * depth + atom + closing * depth
    if draw(st.booleans()) and expr:
        at = draw(st.integers(0, len(expr) - 1))
        expr = expr[:at] + draw(st.sampled_from("?;)](,@ x")) + expr[at + 1:]
    return expr


@given(expr=hostile_expressions())
@fuzz_settings("expression_hostile", deadline_ms=2000)
def test_hostile_expressions_parse_or_are_an_expression_error(expr):
    """Never a RecursionError or ValueError; the caret of the (cut) message sits under the
    character it names."""
    try:
        tree = parse_expression(expr)
    except ExpressionError as error:
        assert error.expression == expr and error.position is not None
        assert 0 <= error.position <= len(expr)
        _assert_readable(error)
        *_, shown, caret = str(error).splitlines()
        if error.position < len(expr) and caret.strip() == "^":
            assert shown[caret.index("^")] == repr(expr[error.position])[1:-1][0]
        event("ExpressionError")
        return
    event("parsed")
    assert parse_expression(to_text(tree)) is not None


# ----- graphs: structure, annotations, memory budget, odd inputs --------------------------------
# Issue 21's classes at the level of the graph rather than of the text: small models written
# with support.write_model, built and run on both floors (fast and reference).
#
#   structure    random graphs of a small vocabulary with wrong operand counts and with names
#                the runtime also makes up (<operand>.<i>, <name>_1): an InferError, or the
#                outputs of an independent numpy interpreter of the same graph
#   annotations  '#' shapes and dtypes on intermediates: the unannotated result to the bit, or
#                a ShapeError about an annotation
#   budget       parameters asking for up to 2**62 elements under a budget of 1 KiB to 1 GiB:
#                a run whose outputs fit the budget, or an InferError, in time and memory
#   inputs       arrays of any dtype and rank 0..4: outputs (0-d stays 0-d) or a ShapeError

import contextlib  # noqa: E402  (this section's own imports)
import math  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from typing import Iterator  # noqa: E402

from infer import MemoryBudgetError, ShapeError  # noqa: E402
from support import conv_line, conv_weights, write_model  # noqa: E402

_EXAMPLES.update({"graph_structure": (400, 20000), "graph_annotations": (100, 5000),
                  "graph_budget": (150, 10000), "graph_inputs": (250, 20000)})


class Overrun(Exception):
    """An example still running when its time is up (a hang, or work out of proportion)."""


@contextlib.contextmanager
def bounded(seconds: float, extra_bytes: int = 2 << 30) -> Iterator[None]:
    """Run the block with at most ``extra_bytes`` more address space for this process
    (RLIMIT_AS: a runaway allocation is a MemoryError here, not the machine's out-of-memory
    killer) and at most ``seconds`` (SIGALRM: a hang is an Overrun, not a stuck test run).
    The limits are restored after the block. Linux, main thread."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(re.search(r"VmSize:\s+(\d+)", Path("/proc/self/status").read_text())[1]) << 10
    cap = mapped + extra_bytes
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)

    def overrun(signum: int, frame: object) -> None:
        raise Overrun(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, overrun)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> None:
    """Both floors started once, before any example's time bound: the first fast build on a
    machine loads (or compiles) the kernels."""
    paths = write_model(tmp_path_factory.mktemp("fuzz_start"),
                        "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32", conv_line(),
                        "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2", weights=conv_weights())
    x = np.ones((1, 3, 8, 8), np.float32)
    for reference in (False, True):
        RuntimeGraph(*paths, reference=reference).build().forward(x)


# kind -> (pnnx type, parameters, usual input count, usual output count)
VOCABULARY = {
    "input": ("pnnx.Input", "", 0, 1),
    "output": ("pnnx.Output", "", 1, 0),
    "relu": ("nn.ReLU", "", 1, 1),
    "sigmoid": ("nn.Sigmoid", "", 1, 1),
    "add": ("pnnx.Expression", "expr=add(@0,@1)", 2, 1),
    "mul": ("pnnx.Expression", "expr=mul(@0,@1)", 2, 1),
    "list": ("pnnx.Expression", "expr=[@0,@1]", 2, 1),    # a returned list: items are outputs
    "cat": ("torch.cat", "dim=1", 2, 1),
    "tuple": ("prim::TupleConstruct", "", 2, 1),
    "unpack": ("prim::TupleUnpack", "", 1, 2),
}
# Names a file may use that the runtime's rewrites make up too: a list's pieces are
# <operator>.<i> and <operand>.<i>, then <name>_1, _2, ... while those are taken.
OPERAND_NAMES = ("0", "1", "2", "x", "x.0", "x.1", "t", "t.0", "t.1", "t.0_1", "t_1", "a",
                 "a_1", "a.0", "l.0", "e.0")
OPERATOR_NAMES = ("in0", "in1", "r", "s", "e", "l", "t", "t.0", "t.1", "l.0", "l.1", "l.0_1",
                  "e.0", "x.1", "a_1", "out")
INPUT_SHAPE = (2, 3)


@dataclass(frozen=True)
class Op:
    """One operator line of a generated graph."""

    kind: str                       # a key of VOCABULARY
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def line(self, annotations: dict[str, str]) -> str:
        """The param line, with ``annotations`` (operand -> "(2,3)f32") of what it gives."""
        type_name, params = VOCABULARY[self.kind][:2]
        notes = [f"#{name}={annotations[name]}" for name in self.outputs if name in annotations]
        fields = [type_name, self.name, str(len(self.inputs)), str(len(self.outputs)),
                  *self.inputs, *self.outputs, params, *notes]
        return " ".join(field for field in fields if field)


class Graph(tuple):
    """A generated graph, a tuple of Op; shown as its param lines in a falsifying example."""

    def lines(self, annotations: dict[str, str] | None = None) -> list[str]:
        """The operator lines: graph inputs annotated (2,3)f32, other operands as given."""
        shape = f"({','.join(map(str, INPUT_SHAPE))})f32"
        given = {name: shape for op in self if op.kind == "input" for name in op.outputs}
        return [op.line({**given, **(annotations or {})}) for op in self]

    def inputs(self) -> list[np.ndarray]:
        """An array for every pnnx.Input line (in file order), each of values of its own."""
        base = np.linspace(-3, 3, math.prod(INPUT_SHAPE), dtype=np.float32).reshape(INPUT_SHAPE)
        return [base + 10 * i for i in range(sum(op.kind == "input" for op in self))]

    def __repr__(self) -> str:
        return "Graph(\n    " + "\n    ".join(self.lines()) + ")"


# ----- the numpy interpreter of that vocabulary ---------------------------------------------

class Malformed(Exception):
    """The interpreter's verdict: the runtime must refuse this graph."""


class Tup(tuple):
    """A tuple's value: its members, flattened, as the runtime splices a tuple into whatever
    reads it (infer/rewrite.py); only a prim::TupleUnpack takes it whole."""


class Lst(tuple):
    """A returned list's value ``[@0,@1]``: pnnx.Output gives its items as separate outputs;
    no other operator may read it."""


class Interpreter:
    """What a generated graph computes, by numpy, from its Op records (not the runtime's
    parser or rewrites): ``run(inputs)`` gives the outputs, or raises Malformed for a graph
    the runtime must refuse. ``must_run`` turns False where the graph is readable but the
    runtime may still refuse it: a line read before the line that writes it (the tuple
    rewrites follow the file's order), unused extra inputs of an expression, an unpack of a
    plain array (not a tuple), a returned list that no pnnx.Output reads."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.must_run = True
        self.values: dict[str, object] = {}         # operand -> array, Tup or Lst
        self.outputs: list[np.ndarray] = []
        self._read_by_output: set[int] = set()      # id() of the Lst values pnnx.Output reads

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        graph = self.graph
        if len({op.name for op in graph}) < len(graph):
            raise Malformed("two operators of one name")
        producer: dict[str, int] = {}
        for index, op in enumerate(graph):
            if op.kind == "input" and (op.inputs or len(op.outputs) != 1):
                raise Malformed("a pnnx.Input reads none and gives one")
            if op.kind == "output" and (op.outputs or not op.inputs):
                raise Malformed("a pnnx.Output reads some and gives none")
            for name in op.outputs:
                if name in producer:
                    raise Malformed("an operand is written twice")
                producer[name] = index
        for index, op in enumerate(graph):
            for name in op.inputs:
                if name not in producer:
                    raise Malformed("an operand is read, never written")
                if producer[name] >= index:
                    self.must_run = False
        feed = iter(inputs)
        for op in graph:
            if op.kind == "input":
                self.values[op.outputs[0]] = next(feed)
        done: dict[int, bool] = {}                  # index -> finished (False: on the stack)

        def visit(index: int) -> None:
            if done.get(index) is False:
                raise Malformed("a cycle")
            if index in done:
                return
            done[index] = False
            op = graph[index]
            for name in op.inputs:
                visit(producer[name])
            if op.kind != "input":
                given = self.apply(op, [self.values[name] for name in op.inputs])
                self.values.update(zip(op.outputs, given))
            done[index] = True

        for index in range(len(graph)):
            visit(index)
        if not self.outputs:
            raise Malformed("no graph outputs")
        lists = [value for value in self.values.values() if isinstance(value, Lst)]
        if any(id(value) not in self._read_by_output for value in lists):
            self.must_run = False
        return self.outputs

    def apply(self, op: Op, args: list[object]) -> list[object]:
        """The values ``op`` gives for the values it reads."""
        if op.kind == "unpack":
            if len(args) != 1:
                raise Malformed("an unpack reads one tuple")
            (packed,) = args
            if isinstance(packed, Tup):
                if len(packed) != len(op.outputs):
                    raise Malformed("an unpack gives each member of its tuple")
                return list(packed)
            if len(op.outputs) != 1:
                raise Malformed("an unpack of an array into several")
            self.must_run = False
            return [packed]
        flat = [member for value in args
                for member in (value if isinstance(value, Tup) else (value,))]
        if op.kind == "output":
            for value in flat:
                if isinstance(value, Lst):
                    self._read_by_output.add(id(value))
                self.outputs.extend(value if isinstance(value, Lst) else [value])
            return []
        if len(op.outputs) != 1:
            raise Malformed("an operator gives one operand")
        if op.kind == "tuple":
            return [Tup(flat)]
        if any(isinstance(value, Lst) for value in flat):
            raise Malformed("a list read by an operator")
        arrays = flat                                   # no tuple, no list: arrays
        least = 1 if op.kind == "cat" else VOCABULARY[op.kind][2]
        if len(arrays) < least or (op.kind in ("relu", "sigmoid") and len(arrays) > 1):
            raise Malformed("an operator reads too few or too many arrays")
        if op.kind in ("add", "mul", "list") and len(arrays) > 2:
            self.must_run = False
        a = arrays[0]
        if op.kind == "relu":
            return [np.maximum(a, np.float32(0))]
        if op.kind == "sigmoid":
            return [np.float32(1) / (np.float32(1) + np.exp(-a))]
        if op.kind == "cat":
            if any(x.shape[0] != a.shape[0] for x in arrays):
                raise Malformed("cat of arrays of other heights")
            return [np.concatenate(arrays, axis=1)]
        b = arrays[1]
        if op.kind == "list":
            return [Lst((a, b))]
        if a.shape != b.shape:
            raise Malformed("arrays of two widths")
        return [a + b if op.kind == "add" else a * b]


def interpret(graph: Graph, inputs: list[np.ndarray]) -> tuple[list[np.ndarray] | None, bool]:
    """(the outputs, whether the runtime must run the graph); (None, False) if it must refuse
    the graph."""
    interpreter = Interpreter(graph)
    try:
        return interpreter.run(inputs), interpreter.must_run
    except Malformed as why:
        event(f"malformed: {why}")
        return None, False


# ----- generated graphs -----------------------------------------------------------------------

@st.composite
def valid_graphs(draw) -> Graph:
    """A well-formed graph: one or two inputs of shape (2,3); one to six operators of the
    vocabulary, each reading operands written before it, with the right counts; one
    pnnx.Output reading every returned list and some other operands. Names are drawn from
    the pools of names the runtime makes up too."""
    ops: list[Op] = []
    widths: dict[str, int] = {}              # array operand -> its width: every array is (2, w)
    tuples: dict[str, list[int]] = {}        # tuple operand -> its (flattened) members' widths
    lists: list[str] = []
    taken: set[str] = set()

    def fresh(pool: tuple[str, ...], prefix: str) -> str:
        free = [name for name in pool if name not in taken]
        name = draw(st.sampled_from(free)) if free else f"{prefix}{len(taken)}"
        taken.add(name)
        return name

    def add(kind: str, inputs: list[str], count: int) -> tuple[str, ...]:
        outputs = tuple(fresh(OPERAND_NAMES, "v") for _ in range(count))
        ops.append(Op(kind, fresh(OPERATOR_NAMES, "op"), tuple(inputs), outputs))
        return outputs

    for _ in range(draw(st.integers(1, 2))):
        (name,) = add("input", [], 1)
        widths[name] = INPUT_SHAPE[1]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["relu", "sigmoid", "add", "mul", "cat", "tuple", "list"]
                                    + ["unpack"] * bool(tuples)))
        arrays = sorted(widths)
        a = draw(st.sampled_from(arrays))
        if kind in ("relu", "sigmoid"):
            (out,) = add(kind, [a], 1)
            widths[out] = widths[a]
        elif kind in ("add", "mul", "list"):
            b = draw(st.sampled_from([name for name in arrays if widths[name] == widths[a]]))
            (out,) = add(kind, [a, b], 1)
            if kind == "list":
                lists.append(out)
            else:
                widths[out] = widths[a]
        elif kind == "cat":
            parts = [a, *draw(st.lists(st.sampled_from(arrays), max_size=2))]
            (out,) = add(kind, parts, 1)
            widths[out] = sum(widths[part] for part in parts)
        elif kind == "tuple":
            parts = draw(st.lists(st.sampled_from(arrays + sorted(tuples)), min_size=1,
                                  max_size=3))
            (out,) = add(kind, parts, 1)
            tuples[out] = [w for part in parts
                           for w in (tuples[part] if part in tuples else [widths[part]])]
        else:
            packed = draw(st.sampled_from(sorted(tuples)))
            widths.update(zip(add("unpack", [packed], len(tuples[packed])), tuples[packed]))
    some = draw(st.lists(st.sampled_from(sorted(widths) + sorted(tuples)), min_size=1,
                         max_size=3))
    add("output", draw(st.permutations(some + lists)), 0)
    return Graph(ops)


MUTATIONS = ("drop input", "extra input", "drop output", "extra output", "rename input",
             "rename output", "rename operator", "change kind", "swap lines", "delete line",
             "insert unpack", "insert tuple")


@st.composite
def mutated_graphs(draw) -> Graph:
    """A valid graph after zero to three mutations of its lines: an operand more or less, an
    operand renamed (often to a name the runtime makes up, or to one already written), an
    operator renamed or of another kind, two lines swapped, a line deleted, or an inserted
    prim::TupleUnpack or prim::TupleConstruct that a later line reads."""
    ops = list(draw(valid_graphs()))
    for _ in range(draw(st.integers(0, 3))):
        used = {name for op in ops for name in op.inputs + op.outputs}
        names = sorted(used | set(OPERAND_NAMES))
        at = draw(st.integers(0, len(ops) - 1))
        op = ops[at]
        mutation = draw(st.sampled_from(MUTATIONS))
        field = "inputs" if "input" in mutation else "outputs"
        operands = getattr(op, field)
        if mutation.startswith(("drop", "rename ")) and mutation != "rename operator":
            if operands:
                i = draw(st.integers(0, len(operands) - 1))
                new = (draw(st.sampled_from(names)),) if mutation.startswith("rename") else ()
                ops[at] = replace(op, **{field: operands[:i] + new + operands[i + 1:]})
        elif mutation.startswith("extra"):
            i = draw(st.integers(0, len(operands)))
            new = (draw(st.sampled_from(names)),)
            ops[at] = replace(op, **{field: operands[:i] + new + operands[i:]})
        elif mutation == "rename operator":
            ops[at] = replace(op, name=draw(st.sampled_from(OPERATOR_NAMES)))
        elif mutation == "change kind":
            ops[at] = replace(op, kind=draw(st.sampled_from(sorted(VOCABULARY))))
        elif mutation == "swap lines":
            other = draw(st.integers(0, len(ops) - 1))
            ops[at], ops[other] = ops[other], ops[at]
        elif mutation == "delete line":
            if len(ops) > 1:
                del ops[at]
        else:
            unpack = mutation == "insert unpack"
            reads = draw(st.lists(st.sampled_from(op.outputs or names), min_size=int(unpack),
                                  max_size=1 if unpack else 3))
            free = [name for name in OPERAND_NAMES if name not in used] + [f"w{len(ops)}"]
            gives = tuple(draw(st.lists(st.sampled_from(free), unique=True,
                                        min_size=1, max_size=3 if unpack else 1)))
            ops.insert(at + 1, Op("unpack" if unpack else "tuple",
                                  draw(st.sampled_from(OPERATOR_NAMES)), tuple(reads), gives))
            later = [i for i in range(at + 2, len(ops)) if ops[i].inputs]
            if later:                            # a later line reads what it gives
                reader = ops[draw(st.sampled_from(later))]
                i = draw(st.integers(0, len(reader.inputs) - 1))
                ops[ops.index(reader)] = replace(
                    reader, inputs=reader.inputs[:i] + gives[:1] + reader.inputs[i + 1:])
    return Graph(ops)


def _assert_outputs(outputs: list[np.ndarray], expected: list[np.ndarray], exact: bool) -> None:
    """The same number of arrays, of the same shapes and dtypes, equal (or within float32
    rounding, where numpy's sigmoid may differ from the layer's in the last bit)."""
    assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected)):
        assert isinstance(got, np.ndarray), f"output {i} is a {type(got).__name__}"
        assert (got.shape, got.dtype) == (want.shape, want.dtype), f"output {i}"
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"output {i}")


@given(graph=mutated_graphs())
@fuzz_settings("graph_structure", deadline_ms=3000)
def test_random_graphs_compute_what_numpy_says_or_are_refused(graph, started,
                                                              tmp_path_factory):
    """Any graph of the vocabulary, on both floors: outputs equal to the numpy interpreter's
    for a well-formed graph (one it can read, and the runtime must run), an InferError for a
    malformed one, never another exception, never outputs for a graph it calls malformed."""
    inputs = graph.inputs()
    expected, must_run = interpret(graph, inputs)
    paths = write_model(tmp_path_factory.mktemp("fuzz_structure", numbered=True), *graph.lines())
    for reference in (False, True):
        try:
            with bounded(seconds=2):
                outputs = RuntimeGraph(*paths, reference=reference).build().forward(*inputs)
        except InferError as error:
            _assert_readable(error)
            assert not must_run, f"refused a well-formed graph: {type(error).__name__}: {error}"
            event(f"{type(error).__name__}{'' if expected is None else ' (may refuse)'}")
            continue
        assert expected is not None, "ran a graph the interpreter finds malformed"
        _assert_outputs(outputs, expected, exact=False)
        event("ran" if must_run else "ran (may refuse)")


# ----- '#' annotations on intermediates -------------------------------------------------------

ANNOTATION_DTYPES = ("f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64", "bool", "c64", "null")


@st.composite
def annotations(draw, graph: Graph, values: dict[str, object]) -> tuple[dict[str, str], bool]:
    """'#' annotations of some intermediate operands of ``graph`` (``values``: what each one
    holds), each of any dtype and mostly of the operand's shape (some dims maybe '?'), else
    another; and whether any shape is not the operand's (a tuple or list has none)."""
    intermediates = sorted({name for op in graph if op.kind != "input" for name in op.outputs})
    chosen = draw(st.lists(st.sampled_from(intermediates), min_size=1, unique=True))
    notes, wrong = {}, False
    for name in chosen:
        value = values[name]
        shape = value.shape if isinstance(value, np.ndarray) else None
        if shape is not None and draw(st.integers(0, 7)):
            dims = [str(d) if draw(st.integers(0, 3)) else "?" for d in shape]
        else:
            other = tuple(draw(st.lists(st.integers(0, 7), max_size=4)))
            wrong = wrong or other != shape
            dims = list(map(str, other))
        notes[name] = f"({','.join(dims)}){draw(st.sampled_from(ANNOTATION_DTYPES))}"
    return notes, wrong


@given(graph=valid_graphs(), data=st.data())
@fuzz_settings("graph_annotations", deadline_ms=3000)
def test_annotations_on_intermediates_never_change_results(graph, data, started,
                                                           tmp_path_factory):
    """A well-formed graph with '#' shapes and dtypes on some intermediates, on both floors:
    the outputs of the unannotated graph to the bit, in float32 (annotations are hints,
    never a reason to round into f16 buffers or cast), twice (the arena's second use); or,
    where an annotated shape is wrong, a ShapeError that says so."""
    inputs = graph.inputs()
    interpreter = Interpreter(graph)
    computed = interpreter.run(inputs)
    notes, wrong = data.draw(annotations(graph, interpreter.values), label="annotations")
    folder = tmp_path_factory.mktemp("fuzz_annotations", numbered=True)
    plain = write_model(folder, *graph.lines(), name="plain")
    annotated = write_model(folder, *graph.lines(notes), name="annotated")
    for reference in (False, True):
        with bounded(seconds=2):
            expected = RuntimeGraph(*plain, reference=reference).build().forward(*inputs)
            _assert_outputs(expected, computed, exact=False)
            try:
                runtime = RuntimeGraph(*annotated, reference=reference).build()
                results = [runtime.forward(*inputs) for _ in range(2)]
            except ShapeError as error:
                assert wrong and "annotated" in str(error), f"{type(error).__name__}: {error}"
                _assert_readable(error)
                event("ShapeError: a wrong annotated shape")
                continue
        for outputs in results:
            _assert_outputs(outputs, expected, exact=True)
        event("same results" + (" (a wrong shape let through)" if wrong else ""))


# ----- sizes over the memory budget -------------------------------------------------------------

@st.composite
def sizes(draw) -> int:
    """A size: mostly small, else up to 2**62, or one at an edge of int32 / int64 sizes."""
    kind = draw(st.sampled_from(["small", "small", "medium", "huge", "edge"]))
    if kind == "small":
        return draw(st.integers(0, 40))
    if kind == "medium":
        return draw(st.integers(41, 1 << 20))
    if kind == "huge":
        return draw(st.integers(1 << 20, 1 << 62))
    return draw(st.sampled_from([(1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 62) - 1,
                                 1 << 62]))


@st.composite
def hungry_operators(draw) -> tuple[str, tuple[int, ...], dict[str, np.ndarray]]:
    """(operator line, input shape, weights): an operator whose output size follows
    parameters drawn from ``sizes`` (scale factors, pads, expand / repeat / zeros sizes,
    arange's end and step, conv padding). Its output is operand 1, its input operand 0."""
    kind = draw(st.sampled_from(["upsample", "upsample_size", "pad", "expand", "repeat",
                                 "zeros", "arange", "conv"]))

    def numbers(count: int, negative: bool = False) -> str:
        values = [draw(sizes()) * (draw(st.sampled_from([1, -1])) if negative else 1)
                  for _ in range(count)]
        return ",".join(map(str, values))

    if kind == "upsample":
        scale = draw(st.sampled_from([0.5, 1.0, 2.0, 3.5]) | st.floats(0, 2.0**62)
                     | sizes().map(float))
        mode = draw(st.sampled_from(["nearest", "bilinear"]))
        return (f"nn.Upsample op 1 1 0 1 mode={mode} scale_factor=({scale!r},{scale!r})",
                (1, 2, 4, 4), {})
    if kind == "upsample_size":
        return f"nn.Upsample op 1 1 0 1 mode=nearest size=({numbers(2)})", (1, 2, 4, 4), {}
    if kind == "pad":
        return (f"F.pad op 1 1 0 1 mode=constant pad=({numbers(4, negative=True)}) value=0.0",
                (1, 2, 4, 4), {})
    if kind == "expand":
        return f"Tensor.expand op 1 1 0 1 sizes=({numbers(3)})", (1, 1, 1), {}
    if kind == "repeat":
        return f"Tensor.repeat op 1 1 0 1 sizes=({numbers(draw(st.integers(2, 4)))})", (2, 2), {}
    if kind == "zeros":
        count = draw(st.integers(1, 4))
        return f"torch.zeros op 0 1 1 size=({numbers(count)}) dtype=torch.float", (1,), {}
    if kind == "arange":
        end, step = draw(sizes()), draw(st.sampled_from([1, 2, 1e-3, 1e-9, -1]))
        return f"torch.arange op 0 1 1 start=0 end={end} step={step} dtype=torch.float", (1,), {}
    return (f"nn.Conv2d op 1 1 0 1 in_channels=2 out_channels=2 kernel_size=(1,1) "
            f"padding=({numbers(2)}) stride=(1,1) dilation=(1,1) groups=1 bias=False "
            f"padding_mode=zeros @weight=(2,2,1,1)f32", (1, 2, 4, 4),
            {"op.weight": np.ones((2, 2, 1, 1), np.float32)})


@st.composite
def budgets(draw) -> int:
    """A memory budget from 1 KiB to 1 GiB, as likely in each power of two."""
    power = draw(st.integers(10, 29))
    return draw(st.integers(1 << power, 1 << (power + 1)))


def _peak_rss() -> int:
    """The most memory this process has had resident, in bytes (Linux counts KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


@given(case=hungry_operators(), budget=budgets())
@fuzz_settings("graph_budget", deadline_ms=8000)
def test_huge_sizes_fit_the_budget_or_are_refused(case, budget, started, tmp_path_factory):
    """A one-operator model asking for up to 2**62 elements, under a budget of 1 KiB to
    1 GiB, on both floors: outputs that fit the budget, or an InferError (a
    MemoryBudgetError for sizes over it, naming the operator); never a bare MemoryError or
    OverflowError; at most 2 GiB more memory (bounded) and a few seconds."""
    line, shape, weights = case
    dims = ",".join(map(str, shape))
    paths = write_model(tmp_path_factory.mktemp("fuzz_budget", numbered=True),
                        f"pnnx.Input in0 0 1 0 #0=({dims})f32", line,
                        "pnnx.Output out0 1 0 1", weights=weights)
    x = np.ones(shape, np.float32)
    peak = _peak_rss()
    for reference in (False, True):
        try:
            with bounded(seconds=6):
                runtime = RuntimeGraph(*paths, reference=reference, memory_budget=budget)
                outputs = runtime.build().forward(x)
        except MemoryBudgetError as error:
            assert isinstance(error, MemoryError) and "memory budget" in str(error), str(error)
            assert error.operator is not None or " op" in str(error), str(error)
            _assert_readable(error)
            event("MemoryBudgetError")
            continue
        except InferError as error:
            _assert_readable(error)
            event(type(error).__name__)
            continue
        (y,) = outputs
        assert y.nbytes <= budget, f"an output of {y.nbytes} bytes under a budget of {budget}"
        event("ran")
    assert _peak_rss() - peak < 2 << 30


# ----- inputs of any dtype and rank ---------------------------------------------------------

ODD_DTYPES = (np.float16, np.float32, np.float64, np.longdouble, ">f4", np.int8, np.uint8,
              np.int32, np.int64, np.uint64, np.bool_, np.complex64, np.complex128, object,
              "U3", "S3", np.dtypes.StringDType(), "datetime64[D]", "timedelta64[s]",
              [("a", "f4")], "V4")
FLOATING = (np.float16, np.float32, np.float64, np.longdouble, ">f4")


@st.composite
def odd_arrays(draw, rank: int | None) -> np.ndarray:
    """An array of a dtype numpy has (half of them floating), of rank 0 to 4 (``rank`` half
    of the time, if given) and sizes 0 to 3: as it is, a view that is not contiguous
    (reversed, transposed, broadcast), or a rank-0 one as a numpy scalar."""
    dtype = np.dtype(draw(st.sampled_from(FLOATING) | st.sampled_from(ODD_DTYPES)))
    if rank is None or draw(st.booleans()):
        rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank)))
    values = ((np.arange(math.prod(shape), dtype=np.float64) - 2) * 0.75).reshape(shape)
    if dtype.kind == "u":
        x = np.abs(values).astype(dtype)
    elif dtype.kind in "Mm":
        x = values.astype(np.int64).astype(dtype)
    elif dtype.kind == "V":
        x = np.zeros(shape, dtype)
    else:                                # numbers, bools, objects, bytes, str, StringDType
        x = values.astype(dtype)
    view = draw(st.sampled_from(["as is", "reversed", "transposed", "broadcast", "scalar"]))
    if view == "reversed":
        x = x[(slice(None, None, -1),) * x.ndim]
    elif view == "transposed":
        x = x.T
    elif view == "broadcast" and x.size:
        x = np.broadcast_to(x.reshape(-1)[:1].reshape((1,) * x.ndim), x.shape)
    elif view == "scalar" and x.ndim == 0:
        x = x[()]
    return x


@pytest.fixture(scope="module")
def declared_graphs(tmp_path_factory):
    """``graph(declaration, reference)``: the built graph ``x -> relu -> mul 2`` (float
    input) or ``x -> mul 2 -> add 1`` (i64 input) with the input annotated ``declaration``
    ("" for none), built once."""
    folder = tmp_path_factory.mktemp("fuzz_inputs")
    built: dict[tuple[str, bool], RuntimeGraph] = {}

    def graph(declaration: str, reference: bool) -> RuntimeGraph:
        if (declaration, reference) not in built:
            first = ("pnnx.Expression e 1 1 0 1 expr=mul(@0,2)" if declaration.endswith("i64")
                     else "nn.ReLU r 1 1 0 1")
            second = ("pnnx.Expression f 1 1 1 2 expr=add(@0,1)" if declaration.endswith("i64")
                      else "pnnx.Expression e 1 1 1 2 expr=mul(@0,2)")
            name = f"m{len(built)}"
            paths = write_model(folder, f"pnnx.Input in0 0 1 0 {declaration}".strip(), first,
                                second, "pnnx.Output out0 1 0 2", name=name)
            built[declaration, reference] = RuntimeGraph(*paths, reference=reference).build()
        return built[declaration, reference]

    return graph


@st.composite
def declarations(draw) -> str:
    """The annotation of a graph input: none (a float32 input of any shape), or a rank of
    0 to 4 with sizes or '?', of f32 or i64."""
    if draw(st.booleans()):
        return ""
    dims = draw(st.lists(st.sampled_from(["?", "1", "2", "3"]), max_size=4))
    return f"#0=({','.join(dims)}){draw(st.sampled_from(['f32', 'i64']))}"


@given(data=st.data())
@fuzz_settings("graph_inputs", deadline_ms=2000)
def test_inputs_of_any_dtype_and_rank_run_or_are_a_shape_error(data, declared_graphs, started):
    """On both floors: an array of the input's kind (floating for a float32 input, integer
    for an i64 one) and of its declared rank gives the numpy result, of the input's shape
    (0-d stays 0-d; sizes other than the traced ones are fine here) and dtype; anything else
    (another kind, another rank, not an array) is a ShapeError. Never a bare exception."""
    declaration = data.draw(declarations(), label="declaration")
    rank = None if not declaration else declaration.count(",") + ("()" not in declaration)
    x = data.draw(odd_arrays(rank), label="x")
    integer = declaration.endswith("i64")
    want = np.dtype(np.int64 if integer else np.float32)
    kind = str(getattr(x, "dtype", type(x).__name__))
    takes = (isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in ("iu" if integer else "f")
             and rank in (None, np.ndim(x)))
    for reference in (False, True):
        graph = declared_graphs(declaration, reference)
        try:
            with bounded(seconds=2):
                (y,) = graph.forward(x)
        except ShapeError as error:
            assert not takes, f"refused {kind} of shape {np.shape(x)}: {error}"
            _assert_readable(error)
            event(f"ShapeError ({kind})")
            continue
        assert takes, f"ran on {kind} of shape {np.shape(x)}"
        cast = np.asarray(x).astype(want)
        expected = cast * 2 + 1 if integer else np.maximum(cast, 0) * 2
        assert isinstance(y, np.ndarray) and (y.shape, y.dtype) == (np.shape(x), want)
        np.testing.assert_array_equal(y, expected)
        event(f"ran ({'0-d' if y.ndim == 0 else f'rank {y.ndim}'})")
