"""The Layer base class: what every operator implements.

Following ncnn, a layer is configured in two separate steps and then run:

    layer.load_param(params)     # plain Python values from the param line (ncnn's ParamDict)
    layer.load_model(weights)    # numpy arrays from the bin file         (ncnn's ModelBin)
    layer.infer_shapes(shapes)   # output shapes from input shapes, before anything runs (MNN)
    layer.prepare(shapes)        # optional: get ready for these input shapes (pack weights)
    layer.forward(inputs)        # list of arrays in -> list of arrays out

A layer states its capabilities as class flags: ``one_blob_only`` (one input, one output: it
implements ``forward_one(x) -> y``), ``support_inplace`` (it can overwrite its input:
``forward_inplace(x)``) and ``support_forward_into`` (it can write into given output arrays:
``forward_into(inputs, outputs)``, so the graph's memory plan can reuse buffers). A layer
whose output may be a view of its input returns it read-only (layers/shape.py's
``read_only_alias``): the graph runs an in-place step over any writeable array it is given.
It also sets ``views_input``, so that the memory plan keeps the input's buffer for as long
as the view is read.
Parameters are declared once, as class attributes ``stride = Param(1, at_least(1, as_tuple(2)))``
(typed by their converter, so the type checker knows ``self.stride``); the class's ``PARAMS``
collects them, and ``load_param`` reads, converts and checks them all, so no layer looks values
up by hand.
A layer never sees the graph, so it can be built and run alone in a notebook cell or a test.
The layers of layers/*.py are the reference floor: plain numpy. The fast backend
(layers/fast/) subclasses some of them, and the graph picks the subclass when it creates the
layer (layers/registry.py); nothing here knows that it exists.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Generic, Iterator, Literal,
                    Sequence, TypeVar, overload)

import numpy as np

from parser.errors import LayerError, ShapeError

Shape = tuple[int, ...]
_BUILDING: contextvars.ContextVar[bool] = contextvars.ContextVar("building", default=False)


@contextlib.contextmanager
def at_build() -> Iterator[None]:
    """Within it, the graph is being built: ``building()`` is True for the layers' ``prepare``
    (the time for slow work, before any inference waits for it)."""
    token = _BUILDING.set(True)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def building() -> bool:
    """Whether ``prepare`` is called while the graph is built (``at_build``), rather than
    for a size first met in a forward."""
    return _BUILDING.get()

T = TypeVar("T")

REQUIRED: Any = object()  # marker: a parameter with no default


class Param(Generic[T]):
    """Declaration of one parameter: its default and a converter that checks and normalises it.

    Declared as a class attribute of a layer, ``stride = Param(1, at_least(1, as_tuple(2)))``;
    ``T`` is what the converter returns, so ``self.stride`` has that type for the type checker.
    At run time it is a non-data descriptor: reading the attribute on the class gives the
    declaration, and on a layer raises AttributeError until ``load_param`` stores the value in
    the instance, which is then read as any attribute is.
    """

    # T is what the converter returns; the default goes through it too, unless it is None
    # (None is never converted: then T includes None). Without a converter, T is the default's.
    @overload
    def __init__(self: Param[T | None], default: None, convert: Callable[[Any], T]) -> None: ...
    @overload
    def __init__(self, default: Any = REQUIRED, *, convert: Callable[[Any], T]) -> None: ...
    @overload
    def __init__(self, default: Any, convert: Callable[[Any], T]) -> None: ...
    @overload
    def __init__(self, default: T) -> None: ...
    def __init__(self, default: Any = REQUIRED, convert: Callable[[Any], Any] | None = None
                 ) -> None:
        self.default, self.convert, self.name = default, convert, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Param[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Param[T] | T:
        if obj is None:
            return self
        raise AttributeError(f"parameter {self.name!r} of {owner.__name__} is not loaded yet "
                             f"(load_param)")

    if TYPE_CHECKING:       # a non-data descriptor at run time: load_param's value wins
        def __set__(self, obj: object, value: T) -> None: ...

    def __repr__(self) -> str:
        default = "REQUIRED" if self.default is REQUIRED else repr(self.default)
        convert = getattr(self.convert, "__qualname__", self.convert)
        return f"Param({default}, {convert})"


def collect_params(cls: type) -> dict[str, Param[Any]]:
    """The parameters of a layer class, in MRO order, base first: the Param class attributes of
    the class and its bases, as attribute lookup finds them. A subclass's Param overrides its
    base's in place; a plain class attribute of the same name (``padding = (0, 0)``) makes it a
    constant, no longer a parameter. A class that lists ``PARAMS = {name: Param(...)}`` in its
    body (the dict form) starts over from that dict, as it always has: its list is complete."""
    params: dict[str, Param[Any]] = {}
    for klass in reversed(cls.__mro__):
        listed = vars(klass).get("_listed_params")
        if listed is not None:
            params = dict(listed)
        for name, value in vars(klass).items():
            if isinstance(value, Param):
                params[name] = value
            elif name in params and not (listed and name in listed):
                del params[name]
    return params


class Layer:
    """Base of every operator. Subclasses declare Param attributes and WEIGHTS and override the
    forward they need."""

    PARAMS: ClassVar[dict[str, Param[Any]]] = {}  # name -> Param, built by __init_subclass__
    _listed_params: ClassVar[dict[str, Param[Any]] | None] = None   # the dict form's PARAMS
    WEIGHTS: ClassVar[tuple[str, ...]] = ()       # attribute names load_model requires
    OPTIONAL_WEIGHTS: ClassVar[tuple[str, ...]] = ()
    one_blob_only: bool = True                    # a class flag (fusion may change one layer's)
    support_inplace: ClassVar[bool] = False
    support_forward_into: ClassVar[bool] = False  # can write into given arrays: forward_into
    views_input: ClassVar[bool] = False           # its outputs may show its first input's memory
    pnnx_types: ClassVar[tuple[str, ...]] = ()
    # How many outputs the operator has in the param file, set by the graph (pnnx drops unused
    # trailing outputs: ``torch.max(x, 1)[0]`` is written with one output). None: torch's count.
    num_outputs: int | None = None
    # The names the param file gives the inputs (``$input``, ``$end``: NamedArgumentLayer),
    # set by the graph; "" where it names none.
    input_names: Sequence[str] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "PARAMS" in vars(cls):               # the dict form, written in the class body
            cls._listed_params = dict(vars(cls)["PARAMS"])
        cls.PARAMS = collect_params(cls)

    def __init__(self, **params: Any):
        self.name = ""
        self.type = self.pnnx_types[0] if self.pnnx_types else type(self).__name__
        # Built by hand (a test, a notebook): configure now. Built by the registry: the graph
        # calls load_param itself with the operator's parameters.
        if params or all(spec.default is not REQUIRED for spec in self.PARAMS.values()):
            self.load_param(params)

    # ----- configuration --------------------------------------------------------------------
    def load_param(self, params: dict[str, Any]) -> None:
        """Read every declared parameter from ``params`` (missing ones take their default)."""
        for key, spec in self.PARAMS.items():
            value = params.get(key, spec.default)
            if value is REQUIRED:
                raise LayerError(f"missing parameter {key!r}")
            if spec.convert is not None and value is not None:
                try:
                    value = spec.convert(value)
                except (TypeError, ValueError) as exc:
                    raise LayerError(f"parameter {key}={value!r}: {exc}") from None
            setattr(self, key, value)
        self.check_params()

    def check_params(self) -> None:
        """Hook: raise LayerError for parameter values the layer cannot accept."""

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        """Take the weight arrays (views over the bin file; never written to)."""
        for key in self.WEIGHTS:
            if key not in weights:
                raise LayerError(f"missing weight @{key}")
        for key in self.WEIGHTS + self.OPTIONAL_WEIGHTS:
            setattr(self, key, weights.get(key))
        self.check_weights()

    def check_weights(self) -> None:
        """Hook: raise LayerError for weights whose shapes disagree with the parameters."""

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        """Hook: get ready to run on inputs of these shapes (a fast layer packs its weights
        and loads its kernels here), called by the graph after it has planned the shapes,
        so that the work is done at build rather than in the first inference. ``None``:
        the shapes are known only when the graph runs (a dynamic export); then a new size
        is prepared inside the forward that first meets it, where ``building()`` is False
        (a layer may leave its slowest work for later; it is True while the graph makes its
        layers, at build or when it moves them to the fast floor between two forwards). The
        reference layers need nothing."""

    # ----- shapes ---------------------------------------------------------------------------
    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        """Output shapes for these input shapes, or ShapeError. One-blob layers override
        ``infer_shape``."""
        if self.one_blob_only:
            if len(input_shapes) != 1:
                raise ShapeError(f"expects 1 input, got {len(input_shapes)}")
            return [tuple(self.infer_shape(tuple(input_shapes[0])))]
        raise NotImplementedError(f"{type(self).__name__} must implement infer_shapes")

    def infer_shape(self, shape: Shape) -> Shape:
        """Output shape of a one-blob layer; by default the input shape (elementwise layers)."""
        return shape

    # Shape arithmetic. A dynamic-shape export computes some shapes inside the graph, e.g.
    # ``x.view(x.size(0), -1)`` becomes a pnnx.Expression ``[size(@0,0),-1]`` feeding a
    # reshape. Such values depend on input shapes only, so the graph computes them while it
    # plans shapes, and hands them to the layers whose output shape depends on them.
    def infer_values(self, input_shapes: Sequence[Shape],
                     input_values: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
        """Output values knowable before running (shape arithmetic, small constants), or None.
        ``input_values[i]`` is None where that input is not known in advance."""
        return None

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        """``infer_shapes`` for layers whose output SHAPE depends on an input's VALUES (a
        reshape target computed in the graph); the default ignores the values."""
        return self.infer_shapes(input_shapes)

    # ----- running --------------------------------------------------------------------------
    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the layer: a list of input arrays in, a list of output arrays out."""
        if self.one_blob_only:
            return [self.forward_one(inputs[0])]
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if self.support_inplace:
            y = x.copy()
            self.forward_inplace(at_least_1d(y))
            return y
        raise NotImplementedError(f"{type(self).__name__} must implement forward_one")

    def forward_inplace(self, x: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support in-place forward")

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run the layer writing its results into ``outputs``: C-contiguous float32 arrays of
        the output shapes (buffers of the graph's memory plan) that the layer fills instead of
        allocating its own. The graph calls it only with float32 inputs (other dtypes run
        ``forward``). Layers that set ``support_forward_into`` implement it;
        a one-blob in-place layer has it already: copy the input over, then run in place."""
        if self.one_blob_only and self.support_inplace:
            np.copyto(outputs[0], inputs[0])
            self.forward_inplace(at_least_1d(outputs[0]))
            return
        raise NotImplementedError(f"{type(self).__name__} does not support forward_into")

    # ----- what the graph's memory plan may lay out in place -------------------------------
    def joins_along(self, rank: int) -> int | None:
        """The dim along which the output is the inputs laid end to end (a cat), else None.
        A layer that gives one must take, in ``forward_into``, inputs that already lie in
        their piece of the output (the plan may have had their producers write them there),
        and must do nothing else: where every input lies there, it is not called at all."""
        return None

    def cuts_along(self, rank: int) -> int | None:
        """The dim along which the outputs are read-only views of the input's consecutive
        pieces, in order (a split), else None."""
        return None

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={_short(getattr(self, k, None))}" for k in self.PARAMS)
        return f"{type(self).__name__}({shown})"


MAX_SIZES = 64      # input sizes a layer keeps per-size work for (more than the plans a
                    # graph keeps: infer/graph.py's MAX_SHAPE_PLANS)
_K = TypeVar("_K")
_V = TypeVar("_V")


def remember(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """Store ``cache[key] = value`` and return the value, for a layer's cache of work done
    per input size: one holding MAX_SIZES entries (about: two threads may each add one) is
    emptied first, so that a stream of ever new sizes does not grow it without end (what
    goes is made again when asked for)."""
    if len(cache) >= MAX_SIZES:
        cache.clear()
    cache[key] = value
    return value


def at_least_1d(x: np.ndarray) -> np.ndarray:
    """``x``, or for a 0-d array a (1,) view of the same memory: what forward_inplace is
    given, so that arithmetic inside it yields arrays, not numpy scalars (``x * 2`` of a 0-d
    array is a scalar, which ``out=`` refuses), while writes still reach ``x``."""
    return x.reshape(1) if x.ndim == 0 else x


def _short(value: Any) -> str:
    """A parameter for __repr__; an array (a weight that shares the parameter's name, like
    nn.Conv2d's bias) is shown by its shape."""
    if isinstance(value, np.ndarray):
        return f"<array {value.shape}>"
    return repr(value)


class FusesActivation:
    """Mixed into a layer that can apply the elementwise activation after it (infer/fusion.py
    folds e.g. a ReLU into nn.Conv2d / nn.Linear): the activation layer, which the layer runs
    in place on its output. ``fused_into`` names the layer in errors."""

    fused_activation: Layer | None = None
    fused_into: ClassVar[str] = "this layer"

    def can_fuse_activation(self, layer: Layer) -> bool:
        """Whether ``fuse_activation(layer)`` pays: none fused yet, and one it applies."""
        return self.fused_activation is None and self.applies_activation(layer)

    def applies_activation(self, layer: Layer) -> bool:
        """Whether this layer can apply ``layer`` to its output: an elementwise layer that
        runs in place (a fast subclass narrows this to the activations its kernels apply)."""
        return layer.support_inplace and layer.one_blob_only

    def fuse_activation(self, layer: Layer) -> None:
        """Apply an elementwise in-place activation layer to the output."""
        if not layer.support_inplace or self.fused_activation is not None:
            raise LayerError(f"cannot fuse {type(layer).__name__} into {self.fused_into}")
        self.fused_activation = layer


# ----- parameter converters: each checks a raw pnnx value and returns the normalised one -----

def as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return int(value)


def as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def as_bool(value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected True or False, got {value!r}")
    return bool(value)


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def as_ints(value: Any) -> tuple[int, ...]:
    """An int or a sequence of ints -> tuple of ints."""
    if isinstance(value, (list, tuple)):
        return tuple(as_int(v) for v in value)
    return (as_int(value),)


def optional(convert: Callable[[Any], T]) -> Callable[[Any], T | None]:
    """A converter that also lets None through (an absent optional argument, which pnnx writes
    as a ``None`` pnnx.Expression)."""

    def convert_or_none(value: Any) -> T | None:
        return None if value is None else convert(value)

    return convert_or_none


def optional_input(value: Any) -> Any:
    """An input that a pnnx.Expression ``None`` may stand for (a 0-d object array holding
    None): the array, or None."""
    if value is None or (isinstance(value, np.ndarray) and value.dtype == object
                         and value.item() is None):
        return None
    return value


@overload
def as_tuple(n: Literal[1]) -> Callable[[Any], tuple[int]]: ...
@overload
def as_tuple(n: Literal[2]) -> Callable[[Any], tuple[int, int]]: ...
@overload
def as_tuple(n: Literal[3]) -> Callable[[Any], tuple[int, int, int]]: ...
@overload
def as_tuple(n: int) -> Callable[[Any], tuple[int, ...]]: ...
def as_tuple(n: int) -> Callable[[Any], tuple[int, ...]]:
    """Converter to an n-tuple of ints; a single int is repeated (torch's _pair / _triple)."""

    def convert(value: Any) -> tuple[int, ...]:
        values = as_ints(value)
        if len(values) == 1:
            values = values * n
        if len(values) != n:
            raise ValueError(f"expected {n} integers, got {len(values)}")
        return values

    return convert


def at_least(minimum: int, convert: Callable[[Any], T]) -> Callable[[Any], T]:
    """Wrap a converter so every integer it returns is >= ``minimum`` (strides and kernels >= 1,
    paddings >= 0); strings and None pass through. ``Param(1, at_least(1, as_tuple(2)))``."""

    def checked(value: Any) -> T:
        result = convert(value)
        values = result if isinstance(result, tuple) else (result,)
        if any(isinstance(v, int) and v < minimum for v in values):
            raise ValueError(f"every value must be >= {minimum}")
        return result

    return checked


def normalize_dim(dim: int, rank: int) -> int:
    """A possibly negative dim -> 0 <= dim < rank, as torch does; ShapeError when out of range."""
    if not -rank <= dim < max(rank, 1):
        raise ShapeError(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim % rank if rank else 0


# ----- helpers for layers with weights (from the bin file, or as inputs of F.* operators) -----

def check_bias_flag(has_bias: bool, bias: np.ndarray | None) -> None:
    """nn.Conv2d / nn.Linear: the ``bias=True/False`` parameter must agree with the @bias
    weight. (pnnx names both ``bias``: after load_model the attribute is the array or None.)"""
    if has_bias and bias is None:
        raise LayerError("bias=True but no @bias weight was given")
    if not has_bias and bias is not None:
        raise LayerError("bias=False but a @bias weight was given")


def expect_shape(what: str, shape: Sequence[int], expected: Sequence[int],
                 error: type[LayerError] | type[ShapeError] = LayerError) -> None:
    """Raise ``error`` (LayerError for weights, ShapeError for inputs) unless shape == expected."""
    if tuple(shape) != tuple(expected):
        raise error(f"{what} has shape {tuple(shape)}, expected {tuple(expected)}")


def split_weight_inputs(inputs: Sequence[Any]) -> tuple[Any, Any, Any]:
    """The inputs of an F.* operator whose weights are graph inputs (F.conv2d, F.linear):
    (x, weight) or (x, weight, bias) -> (x, weight, bias or None). Works on arrays and shapes."""
    if len(inputs) not in (2, 3):
        raise ShapeError(f"expects 2 or 3 inputs (input, weight[, bias]), got {len(inputs)}")
    x, weight, *bias = inputs
    return x, weight, (bias[0] if bias else None)


def param_or_input(value: Any, name: str, inputs: Sequence[Any]) -> Any:
    """An argument pnnx writes as the parameter ``name`` when it is a constant, or as the
    second input when the model computes it from input shapes (``x.view(x.size(0), -1)``,
    ``F.adaptive_avg_pool2d(x, (h // 2, w // 2))``): a pnnx.Expression such as
    ``[size(@0,0),-1]`` then feeds it. ``inputs`` are the layer's input arrays or, while the
    graph plans shapes, the input values known so far (None where unknown). Returns the
    parameter, or the second input's values as a 1-D array."""
    if (len(inputs), value is None) not in ((1, False), (2, True)):
        raise ShapeError(f"expects 1 input and the {name} parameter, or 2 inputs (input, "
                         f"{name}) without it; got {len(inputs)} input(s) and {name}={value}")
    if len(inputs) == 1:
        return value
    if inputs[1] is None:
        raise ShapeError(f"the {name} is a second input whose value is not known before the "
                         f"graph runs")
    return np.asarray(inputs[1]).ravel()


class ArgumentInputLayer(Layer):
    """A layer with an argument that is a parameter or, computed in the graph, its second
    input (``param_or_input``): its output shape may depend on that input's VALUES, so it
    implements ``infer_shapes_from``, and ``infer_shapes`` is that with no values known."""

    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        return self.infer_shapes_from(input_shapes, [None] * len(input_shapes))


class NamedArgumentLayer(ArgumentInputLayer):
    """A layer with several arguments, each a parameter when it is a constant or a NAMED input
    when the model computes it from input sizes: pnnx writes ``x[:, :, 1:x.size(2) - 1]`` as
    ``Tensor.slice ... dim=2 start=1 step=1 $input=0 $end=1``, ``end`` being input 1 (a
    pnnx.Expression ``sub(size(@0,2),1)``). The graph sets ``input_names`` from the ``$name``
    keys; ``INPUTS`` names the inputs in order for a layer built by hand.

    ``self.argument(name, items)`` is the named input's value (a Python number or a tuple,
    checked by the parameter's converter) if there is one, else the parameter. ``items`` are
    the input arrays or, while the graph plans shapes, the input values known so far."""

    INPUTS: ClassVar[tuple[str, ...]] = ("input",)
    input_names: Sequence[str] = ()

    def named_inputs(self, items: Sequence[Any]) -> dict[str, Any]:
        names = list(self.input_names) if any(self.input_names) else list(self.INPUTS)
        if len(items) > len(names):
            raise ShapeError(f"expects at most {len(names)} inputs ({', '.join(names)}), "
                             f"got {len(items)}")
        return dict(zip(names, items))

    def argument(self, name: str, items: Sequence[Any]) -> Any:
        named = self.named_inputs(items)
        if name not in named:
            return getattr(self, name)
        if named[name] is None:
            raise ShapeError(f"the {name} is an input whose value is not known before the "
                             f"graph runs")
        value = np.asarray(named[name]).tolist()          # a Python number or a list
        value = tuple(value) if isinstance(value, list) else value
        spec = self.PARAMS.get(name)
        if spec is not None and spec.convert is not None:
            try:
                value = spec.convert(value)
            except (TypeError, ValueError) as exc:
                raise ShapeError(f"input {name}={value!r}: {exc}") from None
        return value


def bias_is_an_input(value: Any) -> None:
    """Converter of the ``bias`` parameter of F.conv2d / F.linear. pnnx writes ``bias=None``
    when there is no bias (None is never converted); a real bias is always a graph input."""
    raise ValueError("this operator takes its bias as an input; only bias=None is accepted")


# ----- tensor arguments of F.* / torch.* operators: a parameter, absent (None), or an input -----

class _InputMarker:
    """The default of a tensor argument that pnnx writes as an operator input (``$min=2``):
    when the argument is a number or absent, the param line says so instead (``min=0.5``,
    ``min=None``)."""

    def __repr__(self) -> str:
        return "<input>"


AN_INPUT = _InputMarker()


def or_input(convert: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """Converter of such an argument: AN_INPUT passes through; any other written value goes
    through ``convert`` (None: only ``name=None``, i.e. absent, may be written)."""

    def checked(value: Any) -> Any:
        if value is AN_INPUT:
            return value
        if convert is None:
            raise ValueError("this operator takes it as an input; only None can be written")
        return convert(value)

    return checked


def bind_inputs(layer: Layer, names: Sequence[str], inputs: Sequence[Any]) -> dict[str, Any]:
    """The arguments of an operator whose tensor arguments may be inputs: ``inputs[0]`` is its
    first argument, ``names`` are the others in torch's order; each name whose parameter is
    AN_INPUT takes the next input, the others keep their parameter (a number, or None when
    absent). Works on arrays and on shapes; ShapeError when the input count disagrees."""
    wanted = [name for name in names if getattr(layer, name) is AN_INPUT]
    if len(inputs) != 1 + len(wanted):
        listed = ", ".join(["input", *wanted])
        raise ShapeError(f"expects {1 + len(wanted)} input(s) ({listed}), got {len(inputs)}")
    given = dict(zip(wanted, inputs[1:]))
    return {name: given[name] if name in given else getattr(layer, name) for name in names}
