"""LayerRegisterer: the table from pnnx operator type names to layer classes, on two floors.

Layers join it by themselves when their module is imported (KuiperInfer's LayerRegistererWrapper,
ncnn's layer_registry): ``@register_layer("nn.ReLU", "F.relu")`` above a class is all it takes.

    reference floor   @register_layer          the numpy layers of layers/*.py (the oracle)
    fast floor        @register_fast_layer     subclasses in the fast backend (layers/fast/),
                                               as ncnn's x86 layers override its generic ones

A type name may be taken once on each floor, and a fast layer must subclass the reference
layer of its type (so it takes the same parameters and weights). ``layer_class(type,
fast=True)`` gives the fast layer where one is registered and still subclasses the type's
reference layer, else the reference one: a user who replaces a built-in layer globally
(``unregister`` then ``register_layer``) gets that layer on both floors. Asking for an
unknown type names the closest known ones. This module never imports the fast backend:
its layers appear here once something (RuntimeGraph.build) has imported ``layers.fast``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from parser.errors import RegistryError, UnsupportedOperatorError
from parser.suggest import close_matches

if TYPE_CHECKING:
    from layers.base import Layer


class LayerRegisterer:
    """Singleton registry: ``LayerRegisterer()`` always returns the same table."""

    _instance: "LayerRegisterer | None" = None

    def __new__(cls) -> "LayerRegisterer":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._creators = {}
            cls._instance._fast = {}
        return cls._instance

    _creators: dict[str, type["Layer"]]     # reference floor
    _fast: dict[str, type["Layer"]]         # fast floor: overrides of reference layers

    def register(self, type_name: str, layer_class: type["Layer"]) -> None:
        """Serve ``type_name`` with ``layer_class``; a name already taken is an error."""
        if type_name in self._creators:
            taken = self._creators[type_name]
            raise RegistryError(
                f"layer type {type_name!r} is already registered by "
                f"{taken.__module__}.{taken.__qualname__}")
        self._creators[type_name] = layer_class

    def register_fast(self, type_name: str, layer_class: type["Layer"]) -> None:
        """Serve ``type_name`` on the fast floor with ``layer_class``, a subclass of the
        built-in reference layer registered for it; a fast name already taken is an error.
        (Where a user has replaced the reference layer, the fast layer is kept but not used.)"""
        reference = self.layer_class(type_name)
        if not issubclass(layer_class, reference) and is_built_in(reference):
            raise RegistryError(
                f"fast layer {layer_class.__qualname__} for {type_name!r} must subclass its "
                f"reference layer {reference.__module__}.{reference.__qualname__}")
        if type_name in self._fast:
            taken = self._fast[type_name]
            raise RegistryError(
                f"fast layer type {type_name!r} is already registered by "
                f"{taken.__module__}.{taken.__qualname__}")
        self._fast[type_name] = layer_class

    def unregister(self, type_name: str) -> None:
        """Forget the reference layer of ``type_name`` (for tests and notebooks that re-run a
        registration cell, or to replace a built-in layer); a fast layer serves the type again
        only while the reference layer registered for it is its base."""
        self._creators.pop(type_name, None)

    def has(self, type_name: str) -> bool:
        return type_name in self._creators

    def layer_class(self, type_name: str, fast: bool = False) -> type["Layer"]:
        """The class serving ``type_name``: with ``fast``, its fast layer if one is registered
        (and subclasses the reference layer); else its reference layer. An unknown name raises
        with the closest known names."""
        try:
            reference = self._creators[type_name]
        except KeyError:
            raise UnsupportedOperatorError(unsupported_message(type_name, self._creators)) from None
        candidate = self._fast.get(type_name) if fast else None
        if candidate is not None and issubclass(candidate, reference):
            return candidate
        return reference

    def create(self, type_name: str, name: str = "", fast: bool = False) -> "Layer":
        """A new, unconfigured layer instance for one operator (see ``layer_class``)."""
        layer = self.layer_class(type_name, fast)()
        layer.name, layer.type = name, type_name
        return layer

    def types(self) -> list[str]:
        """Every registered pnnx type name, sorted."""
        return sorted(self._creators)

    def fast_types(self) -> list[str]:
        """The type names a fast layer serves (once the fast backend is imported), sorted."""
        return sorted(t for t in self._fast if self.layer_class(t, fast=True) is self._fast[t])

    def __contains__(self, type_name: str) -> bool:
        return type_name in self._creators

    def __len__(self) -> int:
        return len(self._creators)


def is_built_in(layer_class: type["Layer"]) -> bool:
    """A layer of this package (layers/), not one a user registered."""
    return layer_class.__module__.split(".")[0] == "layers"


def unsupported_message(type_name: str, known: Iterable[str]) -> str:
    """What to tell a user whose model has an operator type no layer serves: the registered
    types of the same namespace whose names are close (``nn.ReLu`` -> ``nn.ReLU``; nothing for
    ``torch.fft.rfft``, whose namespace has no layer), and how to add a layer."""
    namespace, short = _split_type(type_name)
    same = {name: _split_type(name)[1].lower() for name in known
            if _split_type(name)[0] == namespace}
    close = close_matches(short.lower(), list(same.values()), n=3, cutoff=0.75)
    names = [name for match in close for name, lowered in same.items() if lowered == match]
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    return (f"no layer is registered for operator type {type_name!r}{hint} (to run it, write "
            f"a Layer and register it: RuntimeGraph.register_custom_layer or @register_layer; "
            f"README, 'A custom layer')")


def _split_type(type_name: str) -> tuple[str, str]:
    """'torch.fft.rfft' -> ('torch.fft', 'rfft'); 'aten::addcmul' -> ('aten', 'addcmul')."""
    if "::" in type_name:
        namespace, _, short = type_name.rpartition("::")
    else:
        namespace, _, short = type_name.rpartition(".")
    return namespace, short


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


def register_fast_layer(*type_names: str) -> Callable[[type["Layer"]], type["Layer"]]:
    """Class decorator of the fast backend: serve these pnnx type names on the fast floor with
    a subclass of their reference layer (``LayerRegisterer.register_fast``)."""
    if not type_names:
        raise RegistryError("register_fast_layer needs at least one pnnx type name")

    def decorate(layer_class: type["Layer"]) -> type["Layer"]:
        registry = LayerRegisterer()
        for type_name in type_names:
            registry.register_fast(type_name, layer_class)
        return layer_class

    return decorate
