"""The operators. Importing this package registers every built-in layer with LayerRegisterer."""

from layers.base import Layer, Param, REQUIRED
from layers.registry import LayerRegisterer, register_layer

__all__ = ["Layer", "Param", "REQUIRED", "LayerRegisterer", "register_layer"]
import layers.expression  # noqa: E402,F401  (registers pnnx.Expression)
