"""The pnnx ``.pnnx.param`` text format: one graph, one operator per line.

A param file written by pnnx looks like this::

    7767517
    4 4
    pnnx.Input      pnnx_input_0   0 1 0 #0=(1,3,?,?)f32
    nn.Conv2d       conv           1 1 0 1 kernel_size=(3,3) @weight=(8,3,3,3)f32 @bias=(8)f32
    pnnx.Expression pnnx_expr_0    2 1 1 0 2 expr=add(@0,mul(@1,2.0)) #2=(1,8,?,?)f32
    pnnx.Output     pnnx_output_0  1 0 2

Line 1 is the magic number 7767517, line 2 holds ``operator_count operand_count``, and each
further line is one operator, its fields separated by whitespace::

    type name input_count output_count input_operands... output_operands... key=value...

Operands are tensors, named by strings (often digits: ``0``, ``1``; sometimes ``conv.out``).
The ``key=value`` fields come in four kinds, told apart by the first character of the key:

    key=value        a parameter, typed as pnnx's ``Parameter::parse_from_string`` types it:
                     None () [] -> NULL; True False -> BOOL; 3 -2 -> INT; 0.5 1e-05 inf -> FLOAT;
                     1.0e+00-2.0e+00j -> COMPLEX; (1,2) -> INT_ARRAY; (0.5,2) -> FLOAT_ARRAY;
                     (a,b) -> STRING_ARRAY; anything else -> STRING. ``expr=`` is kept as raw text.
    @name=(8,3)f32   an attribute (weight) stored in the .pnnx.bin under "<op name>.<name>"
    $name=operand    the name the operator gives to one of its input operands
    #operand=(1,?)f32  the shape and dtype of an input or output operand; ? is a dynamic dim

Two operators of one name are an error (the bin stores weights under "<op name>.<attr>").
A parameter or attribute key given twice on one line is an error (pnnx writes each once);
``#`` annotations may repeat (an operand that is an input twice is annotated twice).
The reader never evaluates anything: every value is matched against a small set of patterns.
Errors are ParamFileError naming the file, the 1-based line number and the line text (cut to a
readable length, as is every value a message quotes).

What is accepted around the format: a UTF-8 byte-order mark (which editors add) is skipped;
CRLF line ends, blank lines and extra whitespace are fine; UTF-16 text, classic-Mac CR line ends
and a magic number not alone on line 1 are refused with a message saying so.

Limits, far above anything pnnx writes, so that a hostile file costs time and memory in
proportion to its size (a few tens of bytes of Python objects per byte of text at most) and
nothing beyond these:

    MAX_PARAM_BYTES   256 MiB   the file (read_param refuses pipes, devices and folders too)
    MAX_LIST_ITEMS    2**20     items of one list value, e.g. ``shape=(1,1,...)``
    MAX_RANK          64        dimensions of one shape (numpy 2's limit)
    MAX_ELEMENTS      2**62     elements of one shape (its non-zero dims multiplied)
    integers          int64     counts, dims, INT values and the items of INT_ARRAYs

Floats follow C's strtod: ``1e999999`` is inf, and so is an integer of 400 digits in a list of
floats. Values that pass are read in time in proportion to their length (one regex match per
list item, and conversion at C speed).
"""

from __future__ import annotations

import codecs
import enum
import itertools
import re
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Iterator, Literal, NamedTuple, overload

from parser.errors import ParamFileError, quote, shorten
from parser.files import MiB, read_file
from parser.numbers import int_in_range

MAGIC = 7767517
MAX_PARAM_BYTES = 256 * MiB
MAX_LIST_ITEMS = 1 << 20
MAX_RANK = 64
MAX_ELEMENTS = 1 << 62

# pnnx dtype names, in pnnx's own type-id order (type_to_string in tools/pnnx/src/ir.cpp).
DTYPE_NAMES: tuple[str, ...] = (
    "f32", "f64", "f16", "i32", "i64", "i16", "i8", "u8", "bool", "c64", "c128", "c32", "bf16")
# pnnx writes "null" for an operand or attribute whose type it does not know.
NULL_DTYPE = "null"


class ParamType(enum.Enum):
    """The type of one parameter value, as pnnx's Parameter.type numbers it."""

    NULL = 0
    BOOL = 1
    INT = 2
    FLOAT = 3
    STRING = 4
    INT_ARRAY = 5
    FLOAT_ARRAY = 6
    STRING_ARRAY = 7
    COMPLEX = 10
    COMPLEX_ARRAY = 11


class Parameter(NamedTuple):
    """One ``key=value`` parameter of an operator line, typed as pnnx types it.

    ``value`` is None, a bool, int, float, str, complex, or a tuple of ints / floats / strs /
    complexes for the array types.
    """

    type: ParamType
    value: Any                # its Python type follows ``type`` (see above)


class OperandInfo(NamedTuple):
    """What the file says about one operand: ``#0=(1,3,?,?)f32``.

    ``shape`` is None when no line annotates the operand; a None entry in it is a dynamic dim
    (``?``, or a symbolic ``%name`` dim). ``dtype`` is a pnnx dtype name, or None if unknown.
    """

    name: str
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None


class AttributeInfo(NamedTuple):
    """An attribute reference ``@weight=(8,3,3,3)f32``: its data lives in the .pnnx.bin zip under
    the entry ``"<op name>.<attr name>"``. The name may contain dots."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(slots=True)
class OperatorRecord:
    """One operator line, split into its parts, nothing interpreted beyond the value types."""

    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[str, Parameter] = field(default_factory=dict)
    attrs: dict[str, AttributeInfo] = field(default_factory=dict)
    input_names: list[str] = field(default_factory=list)  # input_names[i] names inputs[i], or ''
    line: int = 0                                          # 1-based line number in the file


@dataclass
class ParamGraph:
    """A whole param file: the operators in file order and every operand seen."""

    path: str
    operators: list[OperatorRecord]
    operands: dict[str, OperandInfo]


# ----- reading a file ---------------------------------------------------------------------------

# Byte-order marks of encodings other than UTF-8 (UTF-32 LE first: it begins with UTF-16 LE's).
_OTHER_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
               (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def read_param(path: str | PathLike[str]) -> ParamGraph:
    """Read and parse a .pnnx.param file. A path that is not a regular file, a file over
    MAX_PARAM_BYTES, and a binary or non-UTF-8 file are ParamFileErrors naming the path."""
    path = str(path)
    text = _decode(read_file(path, MAX_PARAM_BYTES,
                             lambda message: ParamFileError(message, path=path)), path)
    return parse_param(text, path)                      # (the bytes are gone by now)


def _decode(data: bytes, path: str) -> str:
    """The file's text: UTF-8, with or without a byte-order mark. UTF-16 / UTF-32 text and
    bytes that are not UTF-8 are a ParamFileError saying so."""
    for bom, encoding in _OTHER_BOMS:
        if data.startswith(bom):
            raise ParamFileError(f"the file is {encoding} text (it starts with a {encoding} "
                                 f"byte-order mark); pnnx param files are UTF-8: save it as "
                                 f"UTF-8", path=path, line=1)
    if _looks_like_utf16(data):
        raise ParamFileError("the file looks like UTF-16 text (every other byte is 0); pnnx "
                             "param files are UTF-8: save it as UTF-8", path=path, line=1)
    try:
        return data.decode("utf-8-sig")                     # -sig: skips a UTF-8 BOM
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParamFileError(f"not a text file (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start} is not UTF-8)", path=path, line=line) from None


def _looks_like_utf16(data: bytes) -> bool:
    """True when the first bytes are ASCII text with a 0 byte after (or before) each char."""
    head = data[:64]
    return len(head) >= 4 and any(
        head[zeros::2].count(0) == len(head[zeros::2]) and 0 not in head[1 - zeros::2]
        for zeros in (0, 1))


def parse_param(text: str, path: str = "<string>") -> ParamGraph:
    """Parse the text of a .pnnx.param file (see the module docstring for the format). The
    text's size is the caller's to bound (read_param refuses files over MAX_PARAM_BYTES)."""
    text = text.removeprefix("\ufeff")                   # a UTF-8 byte-order mark, decoded
    _check_text(text, path)
    first, start = _line_at(text, 0)
    second, start = _line_at(text, start)
    _check_magic(first, path)
    operator_count, operand_count = _read_header(second, path)
    _check_room(operator_count, text.count("\n", start) + 1, second, path)

    operators: list[OperatorRecord] = []
    operands: dict[str, OperandInfo] = {}
    lines_by_name: dict[str, int] = {}
    lines = _content_lines(text, start, number=3)
    for number, line in itertools.islice(lines, operator_count):
        record = _parse_operator_line(line, number, path, operands)
        if record.name in lines_by_name:
            raise ParamFileError(
                f"operator name {quote(record.name)} is already taken by line "
                f"{lines_by_name[record.name]} (an operator's weights are stored under its "
                f"name, so pnnx names each operator once)", path=path, line=number, text=line)
        lines_by_name[record.name] = number
        operators.append(record)
    found = len(operators) + sum(1 for _ in lines)       # lines beyond the count: just counted
    if found != operator_count:
        raise ParamFileError(f"the header declares {operator_count} operators but the file has "
                             f"{found} operator lines", path=path, line=2, text=second)
    if len(operands) != operand_count:
        raise ParamFileError(f"the header declares {operand_count} operands but the operator "
                             f"lines name {len(operands)} distinct operands",
                             path=path, line=2, text=second)
    return ParamGraph(path=path, operators=operators, operands=operands)


# ----- lines ------------------------------------------------------------------------------------
# The text is never split into a list of lines: a file of a hundred million empty lines would
# make a list of a hundred million strings. Lines are cut out one at a time, and runs of blank
# lines are skipped by one regex search.

_CONTENT = re.compile(r"\S")


def _line_at(text: str, start: int) -> tuple[str, int]:
    """The line beginning at offset ``start`` (without its line end) and the next line's
    offset (past the end of the text after the last line)."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    return text[start:end].rstrip("\r"), end + 1


def _content_lines(text: str, start: int, number: int) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for each line from offset ``start`` on that is not blank;
    ``number`` is the number of the line at ``start``."""
    while start < len(text) and (found := _CONTENT.search(text, start)) is not None:
        line_end = text.rfind("\n", start, found.start())    # the one before the found char
        begin = start if line_end < 0 else line_end + 1
        number += text.count("\n", start, begin)
        line, start = _line_at(text, begin)
        yield number, line
        number += 1


def _check_text(text: str, path: str) -> None:
    """Refuse an empty file and a file with NUL characters (a binary file read as text)."""
    if _CONTENT.search(text) is None:
        raise ParamFileError("empty file (expected the magic number 7767517)", path=path, line=1)
    at = text.find("\0")
    if at >= 0:
        begin = text.rfind("\n", 0, at) + 1
        line, _ = _line_at(text, begin)
        raise ParamFileError("not a text file (contains NUL bytes)", path=path,
                             line=text.count("\n", 0, begin) + 1, text=line)


def _check_magic(first: str, path: str) -> None:
    """Line 1 must be the magic number 7767517; a ParamFileError says what is wrong."""
    if first.strip() == str(MAGIC):
        return
    if first.split("\r")[0].strip() == str(MAGIC):
        problem = ("the file ends its lines with CR alone (classic Mac); pnnx writes LF: "
                   "convert the line ends")
    elif not first.strip():
        problem = f"line 1 is blank; a pnnx param file starts with the magic number {MAGIC}"
    elif first.split()[0] == str(MAGIC):
        problem = (f"line 1 holds more than the magic number {MAGIC}; the operator and operand "
                   f"counts go on line 2")
    else:
        problem = f"bad magic number (expected {MAGIC}); not a pnnx param file"
    raise ParamFileError(problem, path=path, line=1, text=first)


def _read_header(second: str, path: str) -> tuple[int, int]:
    """``(operator_count, operand_count)`` from line 2."""
    counts = second.split()
    if len(counts) != 2 or not all(_is_count(c) for c in counts):
        raise ParamFileError("line 2 must be 'operator_count operand_count' (two integers >= 0)",
                             path=path, line=2, text=second)
    try:
        return _to_int(counts[0]), _to_int(counts[1])
    except ValueError as exc:
        raise ParamFileError(f"line 2: {exc}", path=path, line=2, text=second) from None


def _check_room(operator_count: int, lines_left: int, second: str, path: str) -> None:
    """Refuse at once a header declaring more operators than the file has lines left."""
    if operator_count > lines_left:
        raise ParamFileError(f"the header declares {operator_count} operators but the file has "
                             f"only {lines_left} lines after it", path=path, line=2, text=second)


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _to_int(text: str) -> int:
    """``int(text)`` of a decimal integer text (sign optional, leading zeros allowed);
    ValueError outside the int64 range, before Python's own limit of 4300 digits."""
    if len(text) <= 18:                                   # in range whatever the digits
        return int(text)
    value = int_in_range(text)
    if value is not None:
        return value
    raise ValueError(f"the integer {shorten(text, 40)} is out of the int64 range")


# ----- one operator line ------------------------------------------------------------------------

def _parse_operator_line(line: str, number: int, path: str,
                         operands: dict[str, OperandInfo]) -> OperatorRecord:
    """Parse ``type name nin nout in... out... key=value...`` into an OperatorRecord.

    Every operand named is added to ``operands``; ``#`` annotations replace its entry.
    """

    def fail(message: str) -> ParamFileError:
        return ParamFileError(message, path=path, line=number, text=line)

    fields = line.split()
    if len(fields) < 4:
        raise fail("an operator line needs at least: type name input_count output_count")
    op_type, name, nin_text, nout_text = fields[:4]
    if not (_is_count(nin_text) and _is_count(nout_text)):
        raise fail(f"input/output counts must be integers >= 0, got {quote(nin_text)} "
                   f"{quote(nout_text)}")
    try:
        nin, nout = _to_int(nin_text), _to_int(nout_text)
    except ValueError as exc:
        raise fail(f"input/output counts: {exc}") from None
    names = fields[4:4 + nin + nout]
    if len(names) < nin + nout or any("=" in n for n in names):
        listed = len([n for n in names if "=" not in n])
        raise fail(f"truncated line: it declares {nin} inputs and {nout} outputs but lists only "
                   f"{listed} operand names")

    record = OperatorRecord(type=op_type, name=name, inputs=names[:nin], outputs=names[nin:],
                            input_names=[""] * nin, line=number)
    for operand in names:
        if operand not in operands:
            operands[operand] = OperandInfo(operand)
    places = _Places(record.inputs, record.outputs)
    for item in fields[4 + nin + nout:]:
        try:
            _apply_key_value(record, item, operands, places)
        except ValueError as exc:
            raise fail(f"{quote(item)}: {exc}") from None
    return record


class _Places:
    """The operands of one operator line, for the fields that refer to them: which names are
    its operands, and which input places no ``$name=operand`` field has named yet."""

    def __init__(self, inputs: list[str], outputs: list[str]):
        self.inputs = inputs
        self.operands = set(inputs).union(outputs)
        self._unnamed: dict[str, list[int]] | None = None    # operand -> places, last first

    def take_input(self, operand: str) -> int:
        """The first input place of ``operand`` not yet named; ValueError if none is left.
        pnnx writes one $name per named input, in input order: an operand that is an input
        twice is named in the order of its places."""
        if self._unnamed is None:
            self._unnamed = {}
            for index in reversed(range(len(self.inputs))):
                self._unnamed.setdefault(self.inputs[index], []).append(index)
        places = self._unnamed.get(operand)
        if places is None:
            raise ValueError(f"names operand {quote(operand)}, which is not an input of this "
                             f"operator")
        if not places:
            raise ValueError(f"operand {quote(operand)} is named more times than it is an input")
        return places.pop()


def _apply_key_value(record: OperatorRecord, item: str, operands: dict[str, OperandInfo],
                     places: _Places) -> None:
    """Store one ``key=value`` field in ``record`` (or ``operands``); ValueError if malformed."""
    key, sep, value = item.partition("=")
    if not sep or key in ("", "@", "$", "#"):
        raise ValueError("expected key=value")
    kind, bare = key[0], key[1:]
    if (kind == "@" and bare in record.attrs) or key in record.params:
        raise ValueError(f"{shorten(key)} is given twice on this line")
    if kind == "@":
        shape, dtype = _parse_shape_dtype(value, allow_dynamic=False)
        record.attrs[bare] = AttributeInfo(bare, shape, dtype)
    elif kind == "$":
        record.input_names[places.take_input(value)] = bare
    elif kind == "#":
        if bare not in places.operands:
            raise ValueError(f"operand {quote(bare)} is not an input or output of this operator")
        dims, dtype = _parse_shape_dtype(value, allow_dynamic=True)
        operands[bare] = OperandInfo(bare, dims, None if dtype == NULL_DTYPE else dtype)
    elif key == "expr":
        record.params[key] = Parameter(ParamType.STRING, value)  # parsed by parser.expression
    else:
        record.params[key] = parse_value(value)


_SHAPE_DTYPE = re.compile(r"\((?P<dims>[^()]*)\)(?P<dtype>\w*)")
_PLAIN_DIMS = re.compile(r"\d{1,18}(?:,\d{1,18})*")        # matched once MAX_RANK is checked


@overload
def _parse_shape_dtype(text: str, allow_dynamic: Literal[False]) -> tuple[tuple[int, ...], str]: ...


@overload
def _parse_shape_dtype(text: str, allow_dynamic: bool) -> tuple[tuple[int | None, ...], str]: ...


def _parse_shape_dtype(text: str, allow_dynamic: bool) -> tuple[tuple[int | None, ...], str]:
    """``(1,3,?,?)f32`` -> ``((1, 3, None, None), "f32")``; ValueError if malformed or beyond
    MAX_RANK dims or MAX_ELEMENTS elements.

    ``?`` and symbolic ``%name`` dims become None (only where ``allow_dynamic``)."""
    match = _SHAPE_DTYPE.fullmatch(text)
    if match is None:
        raise ValueError("expected (shape)dtype, e.g. (1,3,224,224)f32")
    dtype = match["dtype"]
    if dtype not in DTYPE_NAMES and dtype != NULL_DTYPE:
        raise ValueError(f"unknown dtype {quote(dtype)} (pnnx dtypes: {' '.join(DTYPE_NAMES)})")
    if match["dims"].count(",") >= MAX_RANK:
        raise ValueError(f"a shape of {match['dims'].count(',') + 1:,} dimensions; this reader "
                         f"takes at most {MAX_RANK}")
    if _PLAIN_DIMS.fullmatch(match["dims"]):              # the common case, at C speed
        shape: list[int | None] = list(map(int, match["dims"].split(",")))
        _check_elements(shape)
        return tuple(shape), dtype
    dims = match["dims"].split(",") if match["dims"] else []
    shape = []
    for dim in dims:
        if allow_dynamic and (dim == "?" or dim.startswith("%")):
            shape.append(None)
        elif _is_count(dim):
            shape.append(_to_int(dim))
        else:
            raise ValueError(f"bad dimension {quote(dim)} in shape")
    _check_elements(shape)
    return tuple(shape), dtype


def _check_elements(shape: list[int | None]) -> None:
    """ValueError if the known non-zero dims multiply to more than MAX_ELEMENTS (sizes in
    bytes would overflow int64)."""
    elements = 1
    for dim in shape:
        elements *= dim or 1
        if elements > MAX_ELEMENTS:
            raise ValueError("a shape of more than 2**62 elements, too many for int64 sizes")


# ----- parameter values -------------------------------------------------------------------------

_INT = re.compile(r"-?\d+")
_UNSIGNED = r"(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?|inf|nan)"
_FLOAT = re.compile(rf"-?{_UNSIGNED}")           # tried after _INT, so ints never get here
# pnnx writes complex numbers as "%e+%ej": 1.000000e+00+-2.000000e+00j (older) or ...e+00-2...j
_COMPLEX = re.compile(rf"(?P<real>-?{_UNSIGNED})(?P<sign>\+-|[+-])(?P<imag>{_UNSIGNED})j")
_FLOAT_OR_COMPLEX = re.compile(rf"-?{_UNSIGNED}(?:(?:\+-|[+-]){_UNSIGNED}j)?")
_LIST_BRACKETS = {"(": ")", "[": "]"}


def parse_value(text: str) -> Parameter:
    """Type one parameter value text as pnnx does (see the module docstring); ValueError for
    an integer outside int64 or a list of more than MAX_LIST_ITEMS items.

    Two deliberate differences from pnnx's own reader, both for values pnnx itself writes:
    ``inf``/``-inf``/``nan`` are FLOAT (pnnx would read them back as strings), and a list is
    typed by all its elements (pnnx keeps only the elements of the type of the last one).
    """
    if "%" in text:                       # symbolic values (%name) stay text, as in pnnx
        return Parameter(ParamType.STRING, text)
    if text in ("None", "()", "[]"):
        return Parameter(ParamType.NULL, None)
    if text in ("True", "False"):
        return Parameter(ParamType.BOOL, text == "True")
    if text[:1] in _LIST_BRACKETS:
        return _parse_list(text)
    return _parse_scalar(text)


def _parse_scalar(text: str) -> Parameter:
    """An int, float or complex when the text is one of those, else the text as a STRING."""
    if _INT.fullmatch(text):
        return Parameter(ParamType.INT, _to_int(text))
    if _FLOAT.fullmatch(text):
        return Parameter(ParamType.FLOAT, float(text))
    match = _COMPLEX.fullmatch(text)
    if match:
        imag = float(match["imag"]) * (-1.0 if match["sign"].endswith("-") else 1.0)
        return Parameter(ParamType.COMPLEX, complex(float(match["real"]), imag))
    return Parameter(ParamType.STRING, text)


def _parse_list(text: str) -> Parameter:
    """``(1,2)`` / ``[0.5,2]`` / ``(a,b)``: an array typed by its elements.

    Any non-number element makes a STRING_ARRAY of the raw element texts; otherwise complex
    beats float beats int, and ints are widened (a list with one float is a FLOAT_ARRAY).
    Each type is recognised by one regex match per item and converted at C speed."""
    if text[-1] != _LIST_BRACKETS[text[0]]:
        raise ValueError(f"list value is not closed with {_LIST_BRACKETS[text[0]]!r}")
    inner = text[1:-1]
    count = inner.count(",") + 1
    if count > MAX_LIST_ITEMS:
        raise ValueError(f"a list of {count:,} items; this reader takes at most "
                         f"{MAX_LIST_ITEMS:,}")
    texts = inner.split(",")
    if all(map(_INT.fullmatch, texts)):
        to_int = int if max(map(len, texts)) <= 18 else _to_int   # 18 characters fit int64
        return Parameter(ParamType.INT_ARRAY, tuple(map(to_int, texts)))
    if all(map(_FLOAT.fullmatch, texts)):
        return Parameter(ParamType.FLOAT_ARRAY, tuple(map(float, texts)))
    if all(map(_FLOAT_OR_COMPLEX.fullmatch, texts)):
        texts = inner.replace("+-", "-").split(",")         # 1e+00+-2e+00j is 1e+00-2e+00j
        return Parameter(ParamType.COMPLEX_ARRAY, tuple(map(complex, texts)))
    return Parameter(ParamType.STRING_ARRAY, tuple(texts))
