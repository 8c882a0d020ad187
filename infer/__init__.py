"""Runtime: build a pnnx model into a RuntimeGraph and run it.

    from infer import RuntimeGraph
    g = RuntimeGraph("model.pnnx.param", "model.pnnx.bin").build()
    outputs = g.forward(x)
"""

from parser.errors import (BinFileError, ExportError, ExpressionError, GraphError, ImageError,
                           InferError, LayerError, ParamFileError, RegistryError, ShapeError,
                           UnsupportedOperatorError)
from layers import Layer, LayerRegisterer, Param, register_layer
from infer.runtime import RuntimeAttribute, RuntimeOperand, RuntimeOperator, RuntimeParameter
from infer.graph import GraphState, RuntimeGraph

__all__ = [
    "RuntimeGraph", "GraphState", "RuntimeOperator", "RuntimeOperand", "RuntimeParameter",
    "RuntimeAttribute", "Layer", "Param", "LayerRegisterer", "register_layer",
    "InferError", "ParamFileError", "BinFileError", "ExpressionError", "RegistryError",
    "UnsupportedOperatorError", "GraphError", "LayerError", "ShapeError", "ImageError",
    "ExportError",
]
