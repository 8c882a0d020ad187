"""LayerRegisterer: the one table from pnnx operator type names to layer classes.

Layers join it by themselves when their module is imported (KuiperInfer's LayerRegistererWrapper,
ncnn's layer_registry): ``@register_layer("nn.ReLU", "F.relu")`` above a class is all it takes.
A type name may be taken once; asking for an unknown type names the closest known ones.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Callable

from parser.errors import RegistryError, UnsupportedOperatorError

if TYPE_CHECKING:
    from layers.base import Layer


class LayerRegisterer:
    """Singleton registry: ``LayerRegisterer()`` always returns the same table."""

    _instance: "LayerRegisterer | None" = None

    def __new__(cls) -> "LayerRegisterer":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._creators = {}
        return cls._instance

    def register(self, type_name: str, layer_class: type["Layer"]) -> None:
        """Serve ``type_name`` with ``layer_class``; a name already taken is an error."""
        if type_name in self._creators:
            taken = self._creators[type_name]
            raise RegistryError(
                f"layer type {type_name!r} is already registered by "
                f"{taken.__module__}.{taken.__qualname__}")
        self._creators[type_name] = layer_class

    def unregister(self, type_name: str) -> None:
        """Forget ``type_name`` (for tests and notebooks that re-run a registration cell)."""
        self._creators.pop(type_name, None)

    def has(self, type_name: str) -> bool:
        return type_name in self._creators

    def layer_class(self, type_name: str) -> type["Layer"]:
        """The class serving ``type_name``; an unknown name raises with the closest known names."""
        try:
            return self._creators[type_name]
        except KeyError:
            raise UnsupportedOperatorError(unsupported_message(type_name, self._creators)) from None

    def create(self, type_name: str, name: str = "") -> "Layer":
        """A new, unconfigured layer instance for one operator."""
        layer = self.layer_class(type_name)()
        layer.name, layer.type = name, type_name
        return layer

    def types(self) -> list[str]:
        """Every registered pnnx type name, sorted."""
        return sorted(self._creators)

    def __contains__(self, type_name: str) -> bool:
        return type_name in self._creators

    def __len__(self) -> int:
        return len(self._creators)


def unsupported_message(type_name: str, known) -> str:
    close = difflib.get_close_matches(type_name, list(known), n=3, cutoff=0.6)
    hint = f"; closest registered types: {', '.join(close)}" if close else ""
    return f"no layer is registered for operator type {type_name!r}{hint}"


def register_layer(*type_names: str) -> Callable[[type["Layer"]], type["Layer"]]:
    """Class decorator: register a Layer subclass under one or more pnnx type names."""
    if not type_names:
        raise RegistryError("register_layer needs at least one pnnx type name")

    def decorate(layer_class: type["Layer"]) -> type["Layer"]:
        registry = LayerRegisterer()
        for type_name in type_names:
            registry.register(type_name, layer_class)
        # the class's own names only: a subclass of a registered layer does not inherit them
        layer_class.pnnx_types = tuple(layer_class.__dict__.get("pnnx_types", ())) + type_names
        return layer_class

    return decorate
