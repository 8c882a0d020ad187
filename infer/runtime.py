"""The runtime objects a graph is made of: one dataclass per concept (KuiperInfer's runtime_*.h).

    RuntimeParameter   a typed key=value of an operator line           stride=(2,2)
    RuntimeAttribute   a weight: shape, dtype and a view of its bytes  @weight=(64,3,7,7)f32
    RuntimeOperand     a tensor flowing between operators: its producer and its consumers
    RuntimeOperator    one line of the param file: its operands, parameters, weights and layer

Operands and operators refer to each other by object, joined by operand NAME when the graph is
built (never by position), so a line can be moved in the file without changing the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parser.param import ParamType
from layers.base import Layer


@dataclass
class RuntimeParameter:
    """One typed operator parameter, e.g. ``kernel_size=(3,3)`` -> INT_ARRAY (3, 3)."""

    name: str
    type: ParamType
    value: Any


@dataclass
class RuntimeAttribute:
    """One weight of an operator. ``data`` is a read-only view over the memory-mapped bin file."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.nbytes


@dataclass(eq=False)
class RuntimeOperand:
    """A tensor edge: produced by one operator, read by any number of consumers."""

    name: str
    shape: tuple[int | None, ...] | None = None   # as annotated in the param file; None = dynamic
    dtype: str | None = None
    producer: RuntimeOperator | None = None
    consumers: list[RuntimeOperator] = field(default_factory=list)

    def __repr__(self) -> str:
        shape = "?" if self.shape is None else "(" + ",".join(
            "?" if d is None else str(d) for d in self.shape) + ")"
        return f"RuntimeOperand({self.name} {shape}{self.dtype or ''})"

    def _repr_html_(self) -> str:
        """Jupyter: a card with the shape, dtype, producer and consumers."""
        from infer.inspection import operand_html

        return operand_html(self)


@dataclass(eq=False)
class RuntimeOperator:
    """One operator: a line of the param file and the layer that runs it."""

    type: str
    name: str
    line: int = 0
    inputs: list[RuntimeOperand] = field(default_factory=list)
    outputs: list[RuntimeOperand] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)     # '$weight=2' keys of F.* ops
    params: dict[str, RuntimeParameter] = field(default_factory=dict)
    attrs: dict[str, RuntimeAttribute] = field(default_factory=dict)
    layer: Layer | None = None
    fused: list[str] = field(default_factory=list)           # operators folded in (fusion.py)
    fused_types: set[str] = field(default_factory=set)       # and their types
    # after fusion: the folded operator whose output this one now produces (its torch twin)
    output_of: str | None = None
    # pnnx.Attribute operators this module read as inputs, copies of its own weights (a module
    # used twice, infer/rewrite.py); build checks that their data are equal
    weight_copies: list[RuntimeOperator] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How errors and listings name this operator: ``nn.Conv2d conv1`` ."""
        return f"{self.type} {self.name}"

    def param_values(self) -> dict[str, Any]:
        """The parameters as plain Python values, as a layer's load_param takes them."""
        return {key: p.value for key, p in self.params.items()}

    def weights(self) -> dict[str, np.ndarray]:
        """The weights as numpy arrays, as a layer's load_model takes them (those read from the
        bin file: all of them once the graph is built)."""
        return {key: a.data for key, a in self.attrs.items() if a.data is not None}

    def __repr__(self) -> str:
        ins = ",".join(o.name for o in self.inputs)
        outs = ",".join(o.name for o in self.outputs)
        return f"RuntimeOperator({self.label} ({ins}) -> ({outs}))"

    def _repr_html_(self) -> str:
        """Jupyter: a card with the operands, parameters, weights and layer."""
        from infer.inspection import operator_html

        return operator_html(self)
