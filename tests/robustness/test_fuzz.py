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

How many cases run: the ``fuzz`` profile (the normal test run, ~20 s in all); for a long run

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
def test_mutated_param_builds_and_runs_or_is_an_infer_error(data, small, tmp_path_factory):
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


def _read_all(path: Path, attributes) -> dict[str, np.ndarray] | None:
    """Every attribute's array, or None after a BinFileError (another error fails the test)."""
    from parser.errors import BinFileError
    try:
        with PnnxBin(path) as archive:
            return {key: archive.read(key, shape, dtype).copy()
                    for key, shape, dtype in attributes}
    except BinFileError as error:
        assert str(path) in str(error)
        event("BinFileError")
        return None


def _check_damaged_bin(folder: Path, original: Path, damaged: bytes, attributes) -> None:
    path = folder / "fuzz.pnnx.bin"
    path.write_bytes(damaged)
    arrays = _read_all(path, attributes)
    if arrays is not None:                   # read despite the damage: then it must be right
        event("read, the same arrays")
        expected = _read_all(original, attributes)
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
