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
Errors are ParamFileError naming the file, the 1-based line number and the line text.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Literal, overload

from parser.errors import ParamFileError

MAGIC = 7767517

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


@dataclass(frozen=True)
class Parameter:
    """One ``key=value`` parameter of an operator line, typed as pnnx types it.

    ``value`` is None, a bool, int, float, str, complex, or a tuple of ints / floats / strs /
    complexes for the array types.
    """

    type: ParamType
    value: Any                # its Python type follows ``type`` (see above)


@dataclass(frozen=True)
class OperandInfo:
    """What the file says about one operand: ``#0=(1,3,?,?)f32``.

    ``shape`` is None when no line annotates the operand; a None entry in it is a dynamic dim
    (``?``, or a symbolic ``%name`` dim). ``dtype`` is a pnnx dtype name, or None if unknown.
    """

    name: str
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class AttributeInfo:
    """An attribute reference ``@weight=(8,3,3,3)f32``: its data lives in the .pnnx.bin zip under
    the entry ``"<op name>.<attr name>"``. The name may contain dots."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
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

def read_param(path: str | PathLike[str]) -> ParamGraph:
    """Read and parse a .pnnx.param file. A binary or non-UTF-8 file is a ParamFileError."""
    path = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ParamFileError(f"cannot read the file: {exc.strerror}", path=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParamFileError(f"not a text file (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start} is not UTF-8)", path=path, line=line) from None
    return parse_param(text, path)


def parse_param(text: str, path: str = "<string>") -> ParamGraph:
    """Parse the text of a .pnnx.param file (see the module docstring for the format)."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    _check_text(lines, path)
    operator_count, operand_count = _read_header(lines, path)

    operators: list[OperatorRecord] = []
    operands: dict[str, OperandInfo] = {}
    lines_by_name: dict[str, int] = {}
    for number, line in enumerate(lines[2:], start=3):
        if line.strip():
            record = _parse_operator_line(line, number, path, operands)
            if record.name in lines_by_name:
                raise ParamFileError(
                    f"operator name {record.name!r} is already taken by line "
                    f"{lines_by_name[record.name]} (an operator's weights are stored under its "
                    f"name, so pnnx names each operator once)", path=path, line=number, text=line)
            lines_by_name[record.name] = number
            operators.append(record)

    if len(operators) != operator_count:
        raise ParamFileError(f"the header declares {operator_count} operators but the file has "
                             f"{len(operators)} operator lines", path=path, line=2, text=lines[1])
    if len(operands) != operand_count:
        raise ParamFileError(f"the header declares {operand_count} operands but the operator "
                             f"lines name {len(operands)} distinct operands",
                             path=path, line=2, text=lines[1])
    return ParamGraph(path=path, operators=operators, operands=operands)


def _check_text(lines: list[str], path: str) -> None:
    """Refuse an empty file and a file with NUL characters (a binary file read as text)."""
    if not any(line.strip() for line in lines):
        raise ParamFileError("empty file (expected the magic number 7767517)", path=path, line=1)
    for number, line in enumerate(lines, start=1):
        if "\0" in line:
            raise ParamFileError("not a text file (contains NUL bytes)", path=path, line=number,
                                 text=line.replace("\0", "\\0"))


def _read_header(lines: list[str], path: str) -> tuple[int, int]:
    """Check the magic line and return ``(operator_count, operand_count)`` from line 2."""
    if lines[0].strip() != str(MAGIC):
        raise ParamFileError(f"bad magic number (expected {MAGIC}); not a pnnx param file",
                             path=path, line=1, text=lines[0])
    counts = lines[1].split() if len(lines) > 1 else []
    if len(counts) != 2 or not all(_is_count(c) for c in counts):
        raise ParamFileError("line 2 must be 'operator_count operand_count' (two integers >= 0)",
                             path=path, line=2, text=lines[1] if len(lines) > 1 else "")
    return int(counts[0]), int(counts[1])


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit()


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
        raise fail(f"input/output counts must be integers >= 0, got {nin_text!r} {nout_text!r}")
    nin, nout = int(nin_text), int(nout_text)
    names = fields[4:4 + nin + nout]
    if len(names) < nin + nout or any("=" in n for n in names):
        listed = len([n for n in names if "=" not in n])
        raise fail(f"truncated line: it declares {nin} inputs and {nout} outputs but lists only "
                   f"{listed} operand names")

    record = OperatorRecord(type=op_type, name=name, inputs=names[:nin], outputs=names[nin:],
                            input_names=[""] * nin, line=number)
    for operand in names:
        operands.setdefault(operand, OperandInfo(operand))
    for item in fields[4 + nin + nout:]:
        try:
            _apply_key_value(record, item, operands)
        except ValueError as exc:
            raise fail(f"{item!r}: {exc}") from None
    return record


def _apply_key_value(record: OperatorRecord, item: str,
                     operands: dict[str, OperandInfo]) -> None:
    """Store one ``key=value`` field in ``record`` (or ``operands``); ValueError if malformed."""
    key, sep, value = item.partition("=")
    if not sep or key in ("", "@", "$", "#"):
        raise ValueError("expected key=value")
    kind, bare = key[0], key[1:]
    if (kind == "@" and bare in record.attrs) or key in record.params:
        raise ValueError(f"{key} is given twice on this line")
    if kind == "@":
        shape, dtype = _parse_shape_dtype(value, allow_dynamic=False)
        record.attrs[bare] = AttributeInfo(bare, shape, dtype)
    elif kind == "$":
        if value not in record.inputs:
            raise ValueError(f"${bare} names operand {value!r}, which is not an input of "
                             f"this operator")
        # pnnx writes one $name per named input, in input order: an operand that is an
        # input twice is named in the order of its places
        unnamed = [i for i, operand in enumerate(record.inputs)
                   if operand == value and not record.input_names[i]]
        if not unnamed:
            raise ValueError(f"operand {value!r} is named more times than it is an input")
        record.input_names[unnamed[0]] = bare
    elif kind == "#":
        if bare not in record.inputs and bare not in record.outputs:
            raise ValueError(f"operand {bare!r} is not an input or output of this operator")
        dims, dtype = _parse_shape_dtype(value, allow_dynamic=True)
        operands[bare] = OperandInfo(bare, dims, None if dtype == NULL_DTYPE else dtype)
    elif key == "expr":
        record.params[key] = Parameter(ParamType.STRING, value)  # parsed by parser.expression
    else:
        record.params[key] = parse_value(value)


_SHAPE_DTYPE = re.compile(r"\((?P<dims>[^()]*)\)(?P<dtype>\w*)")


@overload
def _parse_shape_dtype(text: str, allow_dynamic: Literal[False]) -> tuple[tuple[int, ...], str]: ...


@overload
def _parse_shape_dtype(text: str, allow_dynamic: bool) -> tuple[tuple[int | None, ...], str]: ...


def _parse_shape_dtype(text: str, allow_dynamic: bool) -> tuple[tuple[int | None, ...], str]:
    """``(1,3,?,?)f32`` -> ``((1, 3, None, None), "f32")``; ValueError if malformed.

    ``?`` and symbolic ``%name`` dims become None (only where ``allow_dynamic``)."""
    match = _SHAPE_DTYPE.fullmatch(text)
    if match is None:
        raise ValueError("expected (shape)dtype, e.g. (1,3,224,224)f32")
    dtype = match["dtype"]
    if dtype not in DTYPE_NAMES and dtype != NULL_DTYPE:
        raise ValueError(f"unknown dtype {dtype!r} (pnnx dtypes: {' '.join(DTYPE_NAMES)})")
    dims = match["dims"].split(",") if match["dims"] else []
    shape: list[int | None] = []
    for dim in dims:
        if allow_dynamic and (dim == "?" or dim.startswith("%")):
            shape.append(None)
        elif _is_count(dim):
            shape.append(int(dim))
        else:
            raise ValueError(f"bad dimension {dim!r} in shape")
    return tuple(shape), dtype


# ----- parameter values -------------------------------------------------------------------------

_INT = re.compile(r"-?\d+")
_UNSIGNED = r"(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?|inf|nan)"
_FLOAT = re.compile(rf"-?{_UNSIGNED}")           # tried after _INT, so ints never get here
# pnnx writes complex numbers as "%e+%ej": 1.000000e+00+-2.000000e+00j (older) or ...e+00-2...j
_COMPLEX = re.compile(rf"(?P<real>-?{_UNSIGNED})(?P<sign>\+-|[+-])(?P<imag>{_UNSIGNED})j")
_LIST_BRACKETS = {"(": ")", "[": "]"}


def parse_value(text: str) -> Parameter:
    """Type one parameter value text as pnnx does (see the module docstring).

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
        return Parameter(ParamType.INT, int(text))
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
    beats float beats int, and ints are widened (a list with one float is a FLOAT_ARRAY)."""
    if text[-1] != _LIST_BRACKETS[text[0]]:
        raise ValueError(f"list value is not closed with {_LIST_BRACKETS[text[0]]!r}")
    texts = text[1:-1].split(",")
    elements = [_parse_scalar(t) for t in texts]
    kinds = {e.type for e in elements}
    if ParamType.STRING in kinds:
        return Parameter(ParamType.STRING_ARRAY, tuple(texts))
    if ParamType.COMPLEX in kinds:
        return Parameter(ParamType.COMPLEX_ARRAY, tuple(complex(e.value) for e in elements))
    if ParamType.FLOAT in kinds:
        return Parameter(ParamType.FLOAT_ARRAY, tuple(float(e.value) for e in elements))
    return Parameter(ParamType.INT_ARRAY, tuple(e.value for e in elements))

