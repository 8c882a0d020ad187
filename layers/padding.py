"""Padding: ``F.pad`` and the nn padding modules (nn.ZeroPad2d, nn.ConstantPad1d, ...).

``pad`` lists (before, after) pairs from the LAST dim backwards: (left, right) pads W,
(left, right, top, bottom) pads W and H, and so on. The numpy kernel is ``kernels.pad``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import NamedArgumentLayer, Param, Shape, as_float, as_ints, as_str, as_tuple
from layers.registry import register_layer
from layers.shape import read_only_alias
from parser.errors import LayerError, ShapeError

PAD_MODES = ("constant", "reflect", "replicate", "circular")


class _Padding(NamedArgumentLayer):
    """What F.pad and the padding modules share: the checks of ``pad``, ``mode`` and
    ``value`` (parameters of F.pad; a padding module derives pad and mode) and the padding."""

    views_input = True                  # no padding at all: x itself

    pad: tuple[int, ...] | None
    mode: str
    value: float | None

    def check_params(self) -> None:
        if self.mode not in PAD_MODES:
            raise LayerError(f"mode must be one of {', '.join(PAD_MODES)}, got {self.mode!r}")
        if self.mode != "constant" and self.value:
            raise LayerError(f"padding mode {self.mode!r} does not take a value "
                             f"(value={self.value})")
        if self.pad is not None and len(self.pad) % 2:
            raise LayerError(f"pad={self.pad} must have an even length")

    def _pad(self, items: Sequence[Any]) -> tuple[int, ...]:
        """The pad parameter, or the second input's values (the kernel checks them)."""
        pad: tuple[int, ...] | None = self.argument("pad", items)
        if pad is None:
            raise ShapeError("needs the pad: a parameter or a second input")
        return pad

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return [kernels.pad_output_shape(input_shapes[0], self._pad(input_values), self.mode)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        y = kernels.pad(x, self._pad(inputs), self.mode, self.value or 0.0)
        return [read_only_alias(y, x)]


@register_layer("F.pad")
class Pad(_Padding):
    """``F.pad(x, pad, mode, value)``: mode 'constant' fills with ``value`` (None means 0);
    'reflect' mirrors without repeating the edge; 'replicate' repeats the edge; 'circular'
    wraps around. Negative pads crop.

    When the model computes ``pad`` from the input's size (padding to a multiple of 8 in a
    dynamic export), pnnx passes it as a second input instead of the parameter.
    """

    pad = Param(None, as_ints)
    mode = Param("constant", as_str)
    value = Param(None, as_float)
    INPUTS = ("input", "pad")


# The nn modules pnnx keeps: (mode, number of padded dims). pnnx writes their ``padding`` as
# the full tuple, (left, right[, top, bottom[, front, back]]); an int is repeated.
PAD_MODULES = {
    "nn.ZeroPad1d": ("constant", 1), "nn.ZeroPad2d": ("constant", 2),
    "nn.ZeroPad3d": ("constant", 3),
    "nn.ConstantPad1d": ("constant", 1), "nn.ConstantPad2d": ("constant", 2),
    "nn.ConstantPad3d": ("constant", 3),
    "nn.ReflectionPad1d": ("reflect", 1), "nn.ReflectionPad2d": ("reflect", 2),
    "nn.ReflectionPad3d": ("reflect", 3),
    "nn.ReplicationPad1d": ("replicate", 1), "nn.ReplicationPad2d": ("replicate", 2),
    "nn.ReplicationPad3d": ("replicate", 3),
    "nn.CircularPad1d": ("circular", 1), "nn.CircularPad2d": ("circular", 2),
    "nn.CircularPad3d": ("circular", 3),
}


@register_layer(*PAD_MODULES)
class PadModule(_Padding):
    """``nn.ConstantPad2d(padding, value)``, ``nn.ReflectionPad1d(padding)``, ...: F.pad with
    the mode and the number of padded dims of the module type (``PAD_MODULES``); ``value``
    only for the Constant ones (0 for Zero)."""

    padding = Param(convert=as_ints)
    value = Param(None, as_float)
    INPUTS = ("input",)

    def check_params(self) -> None:
        if self.type not in PAD_MODULES:
            raise LayerError(f"unknown padding module {self.type!r}")
        self.mode, dims = PAD_MODULES[self.type]
        try:
            self.pad = as_tuple(2 * dims)(self.padding)
        except ValueError as exc:
            raise LayerError(f"padding={self.padding}: {exc}") from None
        if self.value is not None and not self.type.startswith("nn.ConstantPad"):
            raise LayerError(f"{self.type} takes no value (value={self.value})")
        super().check_params()
