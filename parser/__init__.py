"""File formats, with no runtime knowledge: pnnx param text, pnnx bin (zip store), expressions.

    parser.param       read_param(path) -> ParamGraph of OperatorRecords (typed Parameters,
                       AttributeInfo, input names, OperandInfo shapes)
    parser.bin         PnnxBin(path).read(key, shape, dtype) -> zero-copy numpy view
    parser.expression  parse_expression(text) -> syntax tree; to_rpn(tree) -> ['@0', '2', 'mul'];
                       to_text(tree) -> text
    parser.errors      the project's exception tree
"""

from parser.bin import DTYPES, PnnxBin
from parser.errors import BinFileError, ExpressionError, InferError, ParamFileError
from parser.expression import (Call, Constant, ListExpr, OperandRef, Token, operand_indices,
                               parse_expression, to_rpn, to_text, tokenize)
from parser.param import (AttributeInfo, OperandInfo, OperatorRecord, Parameter, ParamGraph,
                          ParamType, parse_param, parse_value, read_param)

__all__ = [
    "DTYPES", "PnnxBin",
    "BinFileError", "ExpressionError", "InferError", "ParamFileError",
    "Call", "Constant", "ListExpr", "OperandRef", "Token", "operand_indices", "parse_expression",
    "to_rpn", "to_text", "tokenize",
    "AttributeInfo", "OperandInfo", "OperatorRecord", "Parameter", "ParamGraph", "ParamType",
    "parse_param", "parse_value", "read_param",
]
