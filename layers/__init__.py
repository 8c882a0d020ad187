"""The operators. Importing this package registers every built-in layer with LayerRegisterer."""

from layers.base import Layer, Param, REQUIRED
from layers.registry import LayerRegisterer, register_layer

__all__ = ["Layer", "Param", "REQUIRED", "LayerRegisterer", "register_layer"]
import layers.expression  # noqa: E402,F401  (registers pnnx.Expression)
import layers.io  # noqa: E402,F401  (pnnx.Input / Output / Attribute)
import layers.activation  # noqa: E402,F401
import layers.convolution  # noqa: E402,F401
import layers.linear  # noqa: E402,F401
import layers.normalization  # noqa: E402,F401
import layers.pooling  # noqa: E402,F401
import layers.shape  # noqa: E402,F401
import layers.split  # noqa: E402,F401
import layers.padding  # noqa: E402,F401
import layers.resize  # noqa: E402,F401
import layers.patches  # noqa: E402,F401
import layers.sampling  # noqa: E402,F401
import layers.create  # noqa: E402,F401
import layers.elementwise  # noqa: E402,F401
import layers.reduction  # noqa: E402,F401
import layers.attention  # noqa: E402,F401
import layers.embedding  # noqa: E402,F401
import layers.recurrent  # noqa: E402,F401
import layers.volume  # noqa: E402,F401
