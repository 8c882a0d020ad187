"""parser.param: the pnnx param text format, on hand-written lines (a real export:
test_param_export.py). Needs no torch."""

import math

import pytest

from parser.errors import ParamFileError
from parser.param import (DTYPE_NAMES, AttributeInfo, OperandInfo, ParamType, parse_param,
                          parse_value, read_param)


def graph_text(*op_lines: str, operators: int | None = None, operands: int | None = None) -> str:
    """A param file around ``op_lines``; the counts default to what the lines hold."""
    if operators is None:
        operators = len(op_lines)
    if operands is None:
        names = set()
        for line in op_lines:
            fields = line.split()
            nin, nout = int(fields[2]), int(fields[3])
            names.update(fields[4:4 + nin + nout])
        operands = len(names)
    return "\n".join(["7767517", f"{operators} {operands}", *op_lines]) + "\n"


def one_op(line: str):
    """Parse a file holding just ``line`` and return its OperatorRecord."""
    return parse_param(graph_text(line)).operators[0]


# ----- value typing -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, kind, value", [
    ("None", ParamType.NULL, None),
    ("()", ParamType.NULL, None),
    ("[]", ParamType.NULL, None),
    ("True", ParamType.BOOL, True),
    ("False", ParamType.BOOL, False),
    ("3", ParamType.INT, 3),
    ("-2", ParamType.INT, -2),
    ("2147483647", ParamType.INT, 2147483647),
    ("0.5", ParamType.FLOAT, 0.5),
    ("-350.0", ParamType.FLOAT, -350.0),
    ("1e-05", ParamType.FLOAT, 1e-05),
    ("1.000000e-5", ParamType.FLOAT, 1e-05),
    ("-3.5E+02", ParamType.FLOAT, -350.0),
    ("2.", ParamType.FLOAT, 2.0),
    ("inf", ParamType.FLOAT, math.inf),
    ("-inf", ParamType.FLOAT, -math.inf),
    ("1.500000e+00-2.000000e+00j", ParamType.COMPLEX, complex(1.5, -2.0)),
    ("1.000000e+00+-2.000000e+00j", ParamType.COMPLEX, complex(1.0, -2.0)),
    ("0.000000e+00+1.000000e+00j", ParamType.COMPLEX, complex(0.0, 1.0)),
    ("(1,2)", ParamType.INT_ARRAY, (1, 2)),
    ("(-1,3,224,224)", ParamType.INT_ARRAY, (-1, 3, 224, 224)),
    ("[7]", ParamType.INT_ARRAY, (7,)),
    ("(2.0,2.0)", ParamType.FLOAT_ARRAY, (2.0, 2.0)),
    ("(1,0.5)", ParamType.FLOAT_ARRAY, (1.0, 0.5)),
    ("(1e-05,-2.5E+3)", ParamType.FLOAT_ARRAY, (1e-05, -2500.0)),
    ("(1.0e+00+1.0e+00j,2.0e+00-1.0e+00j)", ParamType.COMPLEX_ARRAY, (1 + 1j, 2 - 1j)),
    ("(a,b)", ParamType.STRING_ARRAY, ("a", "b")),
    ("(@0,1,@1)", ParamType.STRING_ARRAY, ("@0", "1", "@1")),
    ("bilinear", ParamType.STRING, "bilinear"),
    ("torch.float", ParamType.STRING, "torch.float"),
    ("ijkl,ijkl->ij", ParamType.STRING, "ijkl,ijkl->ij"),
    ("-x", ParamType.STRING, "-x"),
    ("1x", ParamType.STRING, "1x"),
    ("%batch", ParamType.STRING, "%batch"),
    ("(1,%h)", ParamType.STRING, "(1,%h)"),
    ("", ParamType.STRING, ""),
])
def test_value_types(text, kind, value):
    parameter = parse_value(text)
    assert parameter.type is kind
    assert parameter.value == value
    assert type(parameter.value) is type(value)


def test_nan_is_a_float():
    parameter = parse_value("nan")
    assert parameter.type is ParamType.FLOAT and math.isnan(parameter.value)


def test_array_elements_have_one_type():
    assert all(type(v) is float for v in parse_value("(1,0.5,3)").value)
    assert all(type(v) is complex for v in parse_value("(1,1.0e+00+1.0e+00j)").value)


# ----- operator lines ---------------------------------------------------------------------------

def test_operator_line_parts():
    op = one_op("nn.Conv2d  conv1  1 1 0 1 bias=True kernel_size=(3,3) @weight=(8,3,3,3)f32 "
                "@bias=(8)f32 $input=0 #0=(1,3,?,?)f32 #1=(1,8,?,?)f32")
    assert (op.type, op.name, op.inputs, op.outputs) == ("nn.Conv2d", "conv1", ["0"], ["1"])
    assert list(op.params) == ["bias", "kernel_size"]
    assert op.params["kernel_size"].value == (3, 3)
    assert op.attrs == {"weight": AttributeInfo("weight", (8, 3, 3, 3), "f32"),
                        "bias": AttributeInfo("bias", (8,), "f32")}
    assert op.input_names == ["input"]
    assert op.line == 3


def test_params_keep_file_order():
    op = one_op("Foo f 0 1 0 zeta=1 alpha=2 mid=3")
    assert list(op.params) == ["zeta", "alpha", "mid"]


def test_input_names_fill_only_named_inputs():
    op = one_op("torch.where w 3 1 a b c d $condition=a $other=c")
    assert op.input_names == ["condition", "", "other"]


def test_expr_is_kept_as_raw_text():
    expr = "[1,mul(3,size(@0,2)),floor_divide(size(@0,3),2),-1]"
    op = one_op(f"pnnx.Expression e 1 1 0 1 expr={expr}")
    assert op.params["expr"].type is ParamType.STRING
    assert op.params["expr"].value == expr


def test_string_values_with_commas_and_brackets():
    op = one_op("torch.einsum e 2 1 0 1 2 equation=ij,jk->ik")
    assert op.params["equation"].value == "ij,jk->ik"


def test_names_with_dots_and_digits():
    op = one_op("nn.Conv2d features.0.conv 1 1 0 features.0.out "
                "@conv.weight.scale=(4)f32 #features.0.out=(1,4)f32")
    assert op.name == "features.0.conv"
    assert op.outputs == ["features.0.out"]
    assert op.attrs["conv.weight.scale"] == AttributeInfo("conv.weight.scale", (4,), "f32")


def test_operand_shapes():
    graph = parse_param(graph_text(
        "pnnx.Input in 0 1 0 #0=(1,3,?,?)f32",
        "nn.ReLU relu 1 1 0 1",
        "Tensor.view v 1 1 1 2 #2=(%batch,12)f16",
        "torch.sum s 1 1 2 3 #3=()f32"))
    assert graph.operands["0"] == OperandInfo("0", (1, 3, None, None), "f32")
    assert graph.operands["1"] == OperandInfo("1", None, None)  # never annotated
    assert graph.operands["2"] == OperandInfo("2", (None, 12), "f16")
    assert graph.operands["3"] == OperandInfo("3", (), "f32")


def test_last_operand_annotation_wins():
    graph = parse_param(graph_text("A a 0 1 x #x=(1,?)f32", "B b 1 1 x y #x=(1,5)f32"))
    assert graph.operands["x"].shape == (1, 5)


def test_null_dtype_means_unknown():
    graph = parse_param(graph_text("A a 0 1 x #x=(2)null"))
    assert graph.operands["x"] == OperandInfo("x", (2,), None)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_every_dtype(dtype):
    graph = parse_param(graph_text(f"pnnx.Attribute a 0 1 x @data=(2,3){dtype} #x=(2,3){dtype}"))
    assert graph.operands["x"].dtype == dtype
    assert graph.operators[0].attrs["data"] == AttributeInfo("data", (2, 3), dtype)


def test_scalar_attribute_shape():
    assert one_op("pnnx.Attribute a 0 1 x @data=()f32").attrs["data"].shape == ()


def test_whitespace_tabs_crlf_and_blank_lines():
    text = "7767517\r\n2 2\r\n\r\npnnx.Input\tin  0 1 a\r\nnn.ReLU   relu\t1 1 a b  \r\n\r\n"
    graph = parse_param(text)
    assert [op.name for op in graph.operators] == ["in", "relu"]
    assert [op.line for op in graph.operators] == [4, 5]


def test_same_operand_twice_as_input():
    op = one_op("torch.einsum e 2 1 0 0 1 equation=i,i->i #0=(3)f32")
    assert op.inputs == ["0", "0"]


def test_graph_keeps_path_and_order(tmp_path):
    path = tmp_path / "m.pnnx.param"
    path.write_text(graph_text("pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "pnnx.Output o 1 0 1"))
    graph = read_param(path)
    assert graph.path == str(path)
    assert [op.type for op in graph.operators] == ["pnnx.Input", "nn.ReLU", "pnnx.Output"]
    assert list(graph.operands) == ["0", "1"]


# ----- errors -----------------------------------------------------------------------------------

OK_LINE = "nn.ReLU relu 1 1 0 1"


@pytest.mark.parametrize("text, line, words", [
    ("", 1, "empty file"),
    ("\n\n", 1, "empty file"),
    ("7767518\n1 2\n" + OK_LINE, 1, "magic"),
    ("7767517\n1\n" + OK_LINE, 2, "operator_count operand_count"),
    ("7767517\n1 x\n" + OK_LINE, 2, "operator_count operand_count"),
    ("7767517\n-1 2\n" + OK_LINE, 2, "operator_count operand_count"),
    ("7767517", 2, "operator_count operand_count"),
    (graph_text(OK_LINE, operators=2), 2, "declares 2 operators"),
    (graph_text(OK_LINE, operands=3), 2, "declares 3 operands"),
    (graph_text("nn.ReLU relu 1", operands=0), 3, "at least"),
    (graph_text("nn.ReLU relu x 1 0 1", operands=2), 3, "counts must be integers"),
    (graph_text("nn.ReLU relu 2 1 0 1", operands=2), 3, "truncated"),
    (graph_text("nn.ReLU relu 1 1 0 #0=(1)f32", operands=1), 3, "truncated"),
    (graph_text(OK_LINE + " inplace"), 3, "expected key=value"),
    (graph_text(OK_LINE + " =3"), 3, "expected key=value"),
    (graph_text(OK_LINE + " @=(1)f32"), 3, "expected key=value"),
    (graph_text(OK_LINE + " @w=(1)f31"), 3, "unknown dtype 'f31'"),
    (graph_text(OK_LINE + " #1=(1,3)float"), 3, "unknown dtype 'float'"),
    (graph_text(OK_LINE + " @w=(1,?)f32"), 3, "bad dimension '?'"),
    (graph_text(OK_LINE + " #1=(1,x)f32"), 3, "bad dimension 'x'"),
    (graph_text(OK_LINE + " @w=8f32"), 3, "(shape)dtype"),
    (graph_text(OK_LINE + " #7=(1)f32"), 3, "not an input or output"),
    (graph_text(OK_LINE + " $input=1"), 3, "not an input"),
    (graph_text(OK_LINE + " kernel_size=(3,3"), 3, "not closed"),
    ("7767517\n1 2\n\0\0" + OK_LINE, 3, "NUL"),
])
def test_errors_name_file_and_line(text, line, words):
    with pytest.raises(ParamFileError) as info:
        parse_param(text, "model.pnnx.param")
    error = info.value
    assert (error.path, error.line) == ("model.pnnx.param", line)
    assert f"model.pnnx.param:{line}:" in str(error)
    assert words in str(error)


def test_error_shows_the_line_text():
    bad = OK_LINE + " @w=(1)f31"
    with pytest.raises(ParamFileError) as info:
        parse_param(graph_text(bad))
    assert info.value.text == bad
    assert bad in str(info.value)


def test_binary_file(tmp_path):
    path = tmp_path / "model.pnnx.bin"
    path.write_bytes(b"PK\x03\x04\x00\x00" + bytes(range(256)))
    with pytest.raises(ParamFileError) as info:
        read_param(path)
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert "not a text file" in str(info.value)


def test_non_utf8_file_names_the_line(tmp_path):
    path = tmp_path / "latin1.pnnx.param"
    path.write_bytes(graph_text(OK_LINE + " mode=cafX").encode().replace(b"cafX", b"caf\xe9"))
    with pytest.raises(ParamFileError) as info:
        read_param(path)
    assert info.value.line == 3 and f"{path}:3:" in str(info.value)
    assert "UTF-8" in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ParamFileError) as info:
        read_param(tmp_path / "nope.pnnx.param")
    assert "nope.pnnx.param" in str(info.value)


# ----- close but wrong: encodings, byte-order marks, line ends ---------------------------------

GOOD = graph_text("pnnx.Input in 0 1 0 #0=(1,3)f32", "nn.ReLU relu 1 1 0 1",
                  "pnnx.Output out 1 0 1")


@pytest.mark.parametrize("data", [
    b"\xef\xbb\xbf" + GOOD.encode(),                       # UTF-8 with a BOM (editors add it)
    GOOD.replace("\n", "\r\n").encode(),                   # CRLF
    b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode(),
    (" \t" + GOOD).encode(),                               # whitespace before the magic
], ids=["bom", "crlf", "bom-crlf", "indented"])
def test_accepted_variants_read_like_the_plain_file(tmp_path, data):
    path = tmp_path / "m.pnnx.param"
    path.write_bytes(data)
    graph = read_param(path)
    assert [op.name for op in graph.operators] == ["in", "relu", "out"]
    assert graph.operands["0"].shape == (1, 3) and graph.operators[1].line == 4


def test_bom_in_text_is_skipped():
    assert len(parse_param("\ufeff" + GOOD).operators) == 3


@pytest.mark.parametrize("data, words", [
    (GOOD.encode("utf-16"), "UTF-16 text (it starts with a UTF-16 byte-order mark)"),
    (GOOD.encode("utf-16-le"), "looks like UTF-16"),
    (GOOD.encode("utf-16-be"), "looks like UTF-16"),
    (GOOD.encode("utf-32"), "UTF-32 text"),
    (GOOD.replace("\n", "\r").encode(), "CR alone"),
    (("\n" + GOOD).encode(), "line 1 is blank"),
    (GOOD.replace("7767517\n", "7767517 ").encode(), "holds more than the magic number"),
    (GOOD.replace("7767517", "7767518").encode(), "bad magic number"),
], ids=["utf16-bom", "utf16-le", "utf16-be", "utf32", "cr", "blank-first", "joined", "magic"])
def test_close_but_wrong_files_say_what_is_wrong(tmp_path, data, words):
    path = tmp_path / "m.pnnx.param"
    path.write_bytes(data)
    with pytest.raises(ParamFileError) as info:
        read_param(path)
    assert info.value.line == 1 and f"{path}:1:" in str(info.value)
    assert words in str(info.value)
    assert "\r" not in str(info.value)                    # shown escaped, not printed


# ----- numbers out of range and absurd sizes ----------------------------------------------------

HUGE = "9" * 5000                                         # beyond int()'s 4300 digits


@pytest.mark.parametrize("text, line, words", [
    (f"7767517\n{HUGE} 2\n{OK_LINE}\n", 2, "out of the int64 range"),
    (f"7767517\n1 {HUGE}\n{OK_LINE}\n", 2, "out of the int64 range"),
    (f"7767517\n1 {2**63}\n{OK_LINE}\n", 2, "out of the int64 range"),
    (f"7767517\n{2**40} 2\n{OK_LINE}\n", 2, "1099511627776 operators but the file has only"),
    (graph_text(f"nn.ReLU relu {HUGE} 1 0 1", operands=2), 3, "input/output counts"),
    (graph_text(OK_LINE + f" big={HUGE}"), 3, "out of the int64 range"),
    (graph_text(OK_LINE + f" big=-{2**63 + 1}"), 3, "out of the int64 range"),
    (graph_text(OK_LINE + f" shape=(1,{HUGE},3)"), 3, "out of the int64 range"),
    (graph_text(OK_LINE + f" @weight=({HUGE})f32"), 3, "out of the int64 range"),
    (graph_text(OK_LINE + f" #1=(1,{HUGE})f32"), 3, "out of the int64 range"),
    (graph_text(OK_LINE + f" #1=(1,{2**62 + 1})f32"), 3, "more than 2**62 elements"),
    (graph_text(OK_LINE + f" @w=({2**31},{2**31},2)f32"), 3, "more than 2**62 elements"),
    (graph_text(OK_LINE + " #1=(" + ",".join(["1"] * 65) + ")f32"), 3, "65 dimensions"),
], ids=["operator-count", "operand-count", "count-2**63", "count-beyond-lines", "input-count",
        "int", "int-below", "int-list", "attribute-dim",
        "annotation-dim", "dim-2**62", "elements-2**62", "rank-65"])
def test_absurd_numbers_name_the_line(text, line, words):
    with pytest.raises(ParamFileError) as info:
        parse_param(text, "m.pnnx.param")
    assert info.value.line == line and f"m.pnnx.param:{line}:" in str(info.value)
    assert words in str(info.value)
    assert len(str(info.value)) < 600


def test_numbers_at_the_edges_of_the_ranges_are_read():
    op = one_op(f"{OK_LINE} a={2**63 - 1} b=-{2**63} c={'0' * 5000}7 d=(1,{'0' * 30}2) "
                f"e=1e999999 f=(-1e999999,{'9' * 5000}.5) @w=({2**31},{2**31})f32 "
                "#1=(" + ",".join(["1"] * 64) + ")f32")
    values = {key: parameter.value for key, parameter in op.params.items()}
    assert values == {"a": 2**63 - 1, "b": -2**63, "c": 7, "d": (1, 2), "e": math.inf,
                      "f": (-math.inf, math.inf)}
    assert op.attrs["w"].shape == (2**31, 2**31)


def test_long_digit_runs_in_lists_of_other_types():
    """Only an all-integer list is int64: among floats an integer is a float (as strtod reads
    it), among strings a string."""
    assert parse_value("(x,12345678901234567890123)").value == ("x", "12345678901234567890123")
    assert parse_value("(0.5,12345678901234567890123)").value == (0.5, 1.2345678901234568e22)
    assert parse_value(f"(0.5,{HUGE})").value == (0.5, math.inf)
    assert parse_value(f"(1.0e+00+-1.0e+00j,{HUGE})").value == (1 - 1j, complex(math.inf, 0))


def test_list_values_up_to_the_limit(monkeypatch):
    from parser import param
    monkeypatch.setattr(param, "MAX_LIST_ITEMS", 1000)
    assert len(parse_value("(" + ",".join(["7"] * 1000) + ")").value) == 1000
    with pytest.raises(ValueError, match="a list of 1,001 items; this reader takes at most 1,000"):
        parse_value("(" + ",".join(["7"] * 1001) + ")")


@pytest.mark.parametrize("items, kind", [
    (["3"] * 5 + ["-4"], ParamType.INT_ARRAY),
    (["3", "0.5", "1e-05", "-inf"], ParamType.FLOAT_ARRAY),
    (["3", "1.0e+00-1.0e+00j"], ParamType.COMPLEX_ARRAY),
    (["3", "0.5", "a"], ParamType.STRING_ARRAY),
    (["3", "12345678901234567890"], None),               # 2**64 > 12345678901234567890 > 2**63
], ids=["int", "float", "complex", "string", "beyond-int64"])
def test_lists_typed_whole_and_item_by_item_agree(items, kind):
    if kind is None:
        with pytest.raises(ValueError, match="int64"):
            parse_value("(" + ",".join(items) + ")")
        return
    parameter = parse_value("(" + ",".join(items) + ")")
    assert parameter.type is kind
    if kind is not ParamType.STRING_ARRAY:
        singles = [parse_value(item).value for item in items]
        assert parameter.value == tuple(singles)


def test_many_named_inputs_are_matched_in_linear_time():
    """$name=operand for 20,000 inputs of one operand: each takes the next free place."""
    count = 20_000
    line = (f"torch.cat cat {count} 1 " + "x " * count + "y "
            + " ".join(f"$t{i}=x" for i in range(count)))
    op = one_op(line)
    assert op.input_names[:3] == ["t0", "t1", "t2"] and op.input_names[-1] == f"t{count - 1}"
    with pytest.raises(ParamFileError, match="named more times than it is an input"):
        parse_param(graph_text(line + " $extra=x"))


def test_blank_lines_cost_no_memory_per_line():
    """A million blank lines between operators: the line numbers still count them."""
    text = graph_text("pnnx.Input in 0 1 0", "nn.ReLU relu 1 1 0 1").replace(
        "\nnn.ReLU", "\n" + "\r\n" * 1_000_000 + "nn.ReLU")
    assert [op.line for op in parse_param(text).operators] == [3, 1_000_004]


def test_lines_beyond_the_declared_count_are_counted_not_parsed():
    text = graph_text(OK_LINE, "nn.ReLU relu2 1 1 1 2", "garbage", operators=1, operands=2)
    with pytest.raises(ParamFileError, match="declares 1 operators but the file has 3 operator"):
        parse_param(text)
