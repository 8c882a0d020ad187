"""Runtime: build a pnnx model into a RuntimeGraph and run it.

    from infer import RuntimeGraph
    g = RuntimeGraph("model.pnnx.param", "model.pnnx.bin").build()
    outputs = g.forward(x)

Looking inside (infer/tools.py lists them): g.debug(x), g.add_hook(...), g.verbose = True,
g.forward_all(x), g.compare_with_torch(x), g.profile(x), g.draw(), g.summary().

`import infer` itself loads nothing: each name below is imported from its module the first time
it is used (PEP 562), so the command line starts at once and can catch a Ctrl-C while numpy
and the layers load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parser.lazy import lazy_names

if TYPE_CHECKING:        # for type checkers only; at run time lazy_names imports
    from infer.compare import Comparison, compare_with_torch  # noqa: F401
    from infer.debug import Debugger, HookHandle, Step  # noqa: F401
    from infer.draw import Drawing  # noqa: F401
    from infer.graph import GraphState, RuntimeGraph  # noqa: F401
    from infer.inspection import ArrayStats  # noqa: F401
    from infer.profile import Profile  # noqa: F401
    from infer.runtime import (RuntimeAttribute, RuntimeOperand, RuntimeOperator,  # noqa: F401
                               RuntimeParameter)
    from infer.table import Table  # noqa: F401
    from layers import Layer, LayerRegisterer, Param, register_layer  # noqa: F401
    from parser.errors import (BinFileError, ExportError, ExpressionError, GraphError,  # noqa: F401
                               ImageError, InferError, LayerError, MemoryBudgetError,
                               ParamFileError, RegistryError, ShapeError,
                               UnsupportedOperatorError)

_MODULE_OF = {
    **dict.fromkeys(["RuntimeGraph", "GraphState"], "infer.graph"),
    **dict.fromkeys(["RuntimeOperator", "RuntimeOperand", "RuntimeParameter",
                     "RuntimeAttribute"], "infer.runtime"),
    **dict.fromkeys(["Layer", "Param", "LayerRegisterer", "register_layer"], "layers"),
    **dict.fromkeys(["InferError", "ParamFileError", "BinFileError", "ExpressionError",
                     "RegistryError", "UnsupportedOperatorError", "GraphError", "LayerError",
                     "ShapeError", "MemoryBudgetError", "ImageError", "ExportError"],
                    "parser.errors"),
    **dict.fromkeys(["Debugger", "Step", "HookHandle"], "infer.debug"),
    "ArrayStats": "infer.inspection",
    **dict.fromkeys(["Comparison", "compare_with_torch"], "infer.compare"),
    "Profile": "infer.profile",
    "Drawing": "infer.draw",
    "Table": "infer.table",
}

__all__ = list(_MODULE_OF)

__getattr__, __dir__ = lazy_names(globals(), _MODULE_OF)
