"""File formats, with no runtime knowledge: pnnx param text, pnnx bin (zip store), expressions.

    parser.param       read_param(path) -> ParamGraph of OperatorRecords (typed Parameters,
                       AttributeInfo, input names, OperandInfo shapes)
    parser.bin         PnnxBin(path).read(key, shape, dtype) -> zero-copy numpy view
    parser.expression  parse_expression(text) -> syntax tree; to_rpn(tree) -> ['@0', '2', 'mul'];
                       to_text(tree) -> text
    parser.errors      the project's exception tree
    parser.pages       fresh_pages(nbytes): memory mapped in at once (the bin's buffer; infer and
                       the fast kernels take their arenas and scratch here too, as imports run
                       one way and parser is the bottom of them)

The names below are imported from their module on first use (PEP 562): `parser.errors` loads
without numpy, so the command line can catch a Ctrl-C while the rest loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parser.lazy import lazy_names

if TYPE_CHECKING:        # for type checkers only; at run time lazy_names imports
    from parser.bin import DTYPES, PnnxBin  # noqa: F401
    from parser.errors import BinFileError, ExpressionError, InferError, ParamFileError  # noqa: F401
    from parser.expression import (Call, Constant, ListExpr, OperandRef, Token,  # noqa: F401
                                   operand_indices, parse_expression, to_rpn, to_text, tokenize)
    from parser.param import (AttributeInfo, OperandInfo, OperatorRecord, Parameter,  # noqa: F401
                              ParamGraph, ParamType, parse_param, parse_value, read_param)

_MODULE_OF = {
    **dict.fromkeys(["DTYPES", "PnnxBin"], "parser.bin"),
    **dict.fromkeys(["BinFileError", "ExpressionError", "InferError", "ParamFileError"],
                    "parser.errors"),
    **dict.fromkeys(["Call", "Constant", "ListExpr", "OperandRef", "Token", "operand_indices",
                     "parse_expression", "to_rpn", "to_text", "tokenize"], "parser.expression"),
    **dict.fromkeys(["AttributeInfo", "OperandInfo", "OperatorRecord", "Parameter",
                     "ParamGraph", "ParamType", "parse_param", "parse_value", "read_param"],
                    "parser.param"),
}

__all__ = list(_MODULE_OF)

__getattr__, __dir__ = lazy_names(globals(), _MODULE_OF)
