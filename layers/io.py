"""The graph's sources and sinks: pnnx.Input, pnnx.Output and pnnx.Attribute.

pnnx.Input (0 inputs, 1 output) and pnnx.Output (1 input, 0 outputs) mark where the graph's
arrays come in and go out; the graph feeds and collects them, so as layers they pass their
arrays through unchanged. pnnx.Attribute (0 inputs, 1 output) is a constant tensor of the model
(e.g. a registered buffer or parameter used in an expression), stored in the bin file under
the key ``data``: ``pnnx.Attribute buf 0 1 1 @data=(1,8,1,1)f32``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers.base import Layer, Shape
from layers.registry import register_layer
from layers.shape import read_only_alias
from parser.errors import ShapeError


class _PassThrough(Layer):
    """Outputs its inputs unchanged (read-only views of them, as every view layer)."""

    one_blob_only = False
    views_input = True

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        return [tuple(shape) for shape in input_shapes]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [read_only_alias(x, x) for x in inputs]


@register_layer("pnnx.Input")
class Input(_PassThrough):
    """A graph input: the array the caller passes in."""


@register_layer("pnnx.Output")
class Output(_PassThrough):
    """A graph output: the array handed back to the caller."""


@register_layer("pnnx.Attribute")
class Attribute(Layer):
    """A constant tensor: no inputs, one output, the @data weight. It is returned as a read-only
    view (never copied), so no in-place layer downstream can change the constant."""

    WEIGHTS = ("data",)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if input_shapes:
            raise ShapeError(f"takes no inputs, got {len(input_shapes)}")
        return [tuple(self.data.shape)]

    def infer_values(self, input_shapes, input_values) -> list[np.ndarray]:
        return self.forward([])

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if inputs:
            raise ShapeError(f"takes no inputs, got {len(inputs)}")
        out = self.data.view()
        out.flags.writeable = False
        return [out]
