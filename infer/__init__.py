"""Runtime: build a pnnx model into a RuntimeGraph and run it.

    from infer import RuntimeGraph
    g = RuntimeGraph("model.pnnx.param", "model.pnnx.bin").build()
    outputs = g.forward(x)

Looking inside (infer/tools.py lists them): g.debug(x), g.add_hook(...), g.verbose = True,
g.forward_all(x), g.compare_with_torch(x), g.profile(x), g.draw(), g.summary().
"""

from parser.errors import (BinFileError, ExportError, ExpressionError, GraphError, ImageError,
                           InferError, LayerError, MemoryBudgetError, ParamFileError,
                           RegistryError, ShapeError, UnsupportedOperatorError)
from layers import Layer, LayerRegisterer, Param, register_layer
from infer.runtime import RuntimeAttribute, RuntimeOperand, RuntimeOperator, RuntimeParameter
from infer.graph import GraphState, RuntimeGraph
from infer.debug import Debugger, HookHandle, Step
from infer.inspection import ArrayStats
from infer.compare import Comparison, compare_with_torch
from infer.profile import Profile
from infer.draw import Drawing
from infer.table import Table

__all__ = [
    "RuntimeGraph", "GraphState", "RuntimeOperator", "RuntimeOperand", "RuntimeParameter",
    "RuntimeAttribute", "Layer", "Param", "LayerRegisterer", "register_layer",
    "InferError", "ParamFileError", "BinFileError", "ExpressionError", "RegistryError",
    "UnsupportedOperatorError", "GraphError", "LayerError", "ShapeError", "MemoryBudgetError",
    "ImageError", "ExportError",
    "Debugger", "Step", "HookHandle", "ArrayStats", "Comparison", "compare_with_torch",
    "Profile", "Drawing", "Table",
]
