"""Pooling layers: max, average, adaptive average and adaptive max pooling, in 1-D over the
last dim of an (N, C, L) or (C, L) input and in 2-D over the last two of (N, C, H, W) or
(C, H, W).

A 1-D layer is its 2-D layer over a height of 1: the input runs as (N, C, 1, L), a kernel k
as (1, k), stride s as (1, s), padding p as (0, p). Its 1-D parameters (the ``_Window1d``
mixin's) are read by ``lifted`` converters, so after ``load_param`` they hold that 2-D form.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence, overload

import numpy as np

from layers import kernels
from layers.base import (ArgumentInputLayer, Layer, Param, Shape, as_bool, as_float, as_int,
                         as_tuple, at_least, param_or_input, remember)
from layers.convolution import lifted
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


class _Spatial:
    """Where 1-D and 2-D pooling differ: the input ranks, and lifting 1-D to 2-D and back."""

    dims: ClassVar[int] = 2

    def _lift_shape(self, shape: Shape) -> Shape:
        """(N, C, L) or (C, L) -> (N, C, 1, L) or (C, 1, L) for a 1-D layer; ShapeError for
        other ranks. A 2-D layer's shape is checked by the kernels."""
        if self.dims == 2:
            return tuple(shape)
        if len(shape) not in (2, 3):
            raise ShapeError(f"expects a 3-D (N, C, L) or 2-D (C, L) input, got shape "
                             f"{tuple(shape)} (rank {len(shape)})")
        return (*shape[:-1], 1, shape[-1])

    def _lift(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self._lift_shape(x.shape))

    @overload
    def _drop(self, y: Shape) -> Shape: ...
    @overload
    def _drop(self, y: np.ndarray) -> np.ndarray: ...
    def _drop(self, y: Shape | np.ndarray) -> Shape | np.ndarray:
        """A 2-D result (array or shape) back to the layer's dims."""
        if self.dims == 2:
            return y
        return (*y[:-2], y[-1]) if isinstance(y, tuple) else y[..., 0, :]


def as_pool_stride(dims: int = 2) -> Callable[[Any], tuple[int, int] | None]:
    """Converter of pooling strides (each >= 1); an empty list (torch's ``stride=[]``) means
    None: the kernel size. (pnnx writes ``stride=None`` for ``F.max_pool2d(x, 2)``.)"""
    convert = at_least(1, as_tuple(2)) if dims == 2 else lifted(at_least(1, as_tuple(1)), 1)

    def as_stride(value: Any) -> tuple[int, int] | None:
        if isinstance(value, (list, tuple)) and len(value) == 0:
            return None
        return convert(value)

    return as_stride


class _Pool(_Spatial, Layer):
    """What max and average pooling share: a window, its stride, padding and ceil_mode."""

    kernel_size = Param(convert=at_least(1, as_tuple(2)))
    stride = Param(None, as_pool_stride(2))          # None: the kernel size (check_params)
    padding = Param(0, at_least(0, as_tuple(2)))
    ceil_mode = Param(False, as_bool)
    dilation: tuple[int, int] = (1, 1)               # average pooling has no dilation
    one_blob_only = False                            # max pooling may return its indices

    @property
    def n_outputs(self) -> int:
        return 1

    def check_params(self) -> None:
        if self.stride is None:
            self.stride = self.kernel_size
        if any(p > k // 2 for p, k in zip(self.padding, self.kernel_size)):
            raise LayerError(f"padding {self.padding} must be at most half of the kernel size "
                             f"{self.kernel_size}")

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if len(input_shapes) != 1:
            raise ShapeError(f"expects 1 input, got {len(input_shapes)}")
        shape = kernels.pool2d_output_shape(self._lift_shape(input_shapes[0]), self.kernel_size,
                                            self.stride, self.padding, self.dilation,
                                            self.ceil_mode)
        return [self._drop(shape)] * self.n_outputs

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self._drop(y) for y in self._pool(self._lift(inputs[0]))]

    def _pool(self, x: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError


class _Window1d(Layer):
    """Mixin of the 1-D pooling layers: the window read in 1-D, lifted to the 2-D form of a
    height-1 layer (it overrides the 2-D layer's)."""

    kernel_size = Param(convert=lifted(at_least(1, as_tuple(1)), 1))
    stride = Param(None, as_pool_stride(1))
    padding = Param(0, lifted(at_least(0, as_tuple(1)), 0))
    ceil_mode = Param(False, as_bool)


@register_layer("nn.MaxPool2d", "F.max_pool2d")
class MaxPool2d(_Pool):
    """Max pooling, as ``torch.nn.MaxPool2d``::

        y[..., oh, ow] = max_{i, j} x_padded[..., oh * sh + i * dh, ow * sw + j * dw]

    Padding is -inf (it never wins). Ho = floor((H + 2 * ph - dh * (kh - 1) - 1) / sh) + 1;
    with ceil_mode the division rounds up, but the last window must start inside the input or
    the left padding. ``return_indices=True`` adds a second output: where each max is, as an
    int64 flat index h * W + w into the input's (H, W) plane.
    """

    dilation = Param(1, at_least(1, as_tuple(2)))
    return_indices = Param(False, as_bool)

    @property
    def n_outputs(self) -> int:
        return 2 if self.return_indices else 1

    def _pool(self, x: np.ndarray) -> list[np.ndarray]:
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        if self.return_indices:
            return list(kernels.max_pool2d_with_indices(x, *geometry))
        return [kernels.max_pool2d(x, *geometry)]


@register_layer("nn.MaxPool1d", "F.max_pool1d")
class MaxPool1d(_Window1d, MaxPool2d):
    """Max pooling over the last dim, as ``torch.nn.MaxPool1d``: nn.MaxPool2d over a height of
    1; the indices (``return_indices=True``) are positions along L."""

    dims = 1
    dilation = Param(1, lifted(at_least(1, as_tuple(1)), 1))


@register_layer("nn.AvgPool2d", "F.avg_pool2d")
class AvgPool2d(_Pool):
    """Average pooling, as ``torch.nn.AvgPool2d``: the sum of each window divided by
    ``divisor_override`` if set, else by the window size counting the zero padding
    (``count_include_pad=True``) or only the real input elements (False). With ceil_mode, a
    last window reaching past the right padding counts only up to it."""

    count_include_pad = Param(True, as_bool)
    divisor_override = Param(None, at_least(1, as_int))

    def _pool(self, x: np.ndarray) -> list[np.ndarray]:
        return [kernels.avg_pool2d(x, self.kernel_size, self.stride, self.padding,
                                   self.ceil_mode, self.count_include_pad,
                                   self.divisor_override)]


@register_layer("nn.LPPool2d", "F.lp_pool2d")
class LPPool2d(_Pool):
    """Power-average pooling, as ``torch.nn.LPPool2d``: y = (sum of x^p over the window)^(1/p)
    (p = ``norm_type``; p = 1 is sum pooling, large p tends to max pooling). As torch, it is
    the average pooling of x^p times the window area (a window cut short by ceil_mode is
    scaled the same way), and a negative sum to a fractional power is NaN; no padding."""

    norm_type = Param(convert=as_float)
    padding = (0, 0)                                 # not a parameter: no padding

    def _pool(self, x: np.ndarray) -> list[np.ndarray]:
        p = x.dtype.type(self.norm_type)
        area = x.dtype.type(self.kernel_size[0] * self.kernel_size[1])
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            mean = kernels.avg_pool2d(x ** p, self.kernel_size, self.stride, 0, self.ceil_mode)
            return [(mean * area) ** (1 / p)]


@register_layer("nn.LPPool1d", "F.lp_pool1d")
class LPPool1d(_Window1d, LPPool2d):
    """Power-average pooling over the last dim, as ``torch.nn.LPPool1d``."""

    dims = 1
    padding = (0, 0)                                 # not a parameter: no padding


@register_layer("nn.AvgPool1d", "F.avg_pool1d")
class AvgPool1d(_Window1d, AvgPool2d):
    """Average pooling over the last dim, as ``torch.nn.AvgPool1d`` (which has no
    divisor_override): nn.AvgPool2d over a height of 1."""

    dims = 1
    divisor_override = None                          # not a parameter


# ----- aten::max_pool2d / aten::avg_pool2d: every argument an input --------------------------

class _AtenPool(ArgumentInputLayer):
    """Pooling written as the aten function, every argument an input: pnnx writes this when
    the model computes the kernel from the input's size (``F.avg_pool2d(x, (h // 2, w // 2))``).
    The arguments come from pnnx.Expression operators (``[floor_divide(size(@0,2),2),...]``,
    ``[0,0]``, ``True``, ``None``), known before the graph runs; they configure the matching
    nn.* layer (``POOL``), which does the work."""

    POOL: ClassVar[type[_Pool]]
    ARGUMENTS: ClassVar[tuple[str, ...]]

    def _configured(self, values: Sequence[Any]) -> _Pool:
        if len(values) != 1 + len(self.ARGUMENTS):
            raise ShapeError(f"expects {1 + len(self.ARGUMENTS)} inputs (input, "
                             f"{', '.join(self.ARGUMENTS)}), got {len(values)}")
        params = {}
        for name, value in zip(self.ARGUMENTS, values[1:]):
            if value is None:                                  # not known while planning
                raise ShapeError(f"the {name} is an input whose value is not known before "
                                 f"the graph runs")
            value = np.asarray(value)
            value = value.item() if value.dtype == object else value.tolist()  # None: absent
            if value is not None:
                params[name] = value
        key = tuple(sorted((k, str(v)) for k, v in params.items()))
        cache: dict[tuple[tuple[str, str], ...], _Pool] = self.__dict__.setdefault("_pools", {})
        pool = cache.get(key)
        if pool is None:                                       # LayerError for bad values
            pool = remember(cache, key, self.POOL(**params))   # one per input size, at most
        return pool

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        return self._configured(input_values).infer_shapes(input_shapes[:1])

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._configured(inputs).forward(inputs[:1])


@register_layer("aten::max_pool2d")
class AtenMaxPool2d(_AtenPool):
    """``aten::max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)``:
    nn.MaxPool2d with the arguments given as inputs (stride None: the kernel size)."""

    POOL = MaxPool2d
    ARGUMENTS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")


@register_layer("aten::avg_pool2d")
class AtenAvgPool2d(_AtenPool):
    """``aten::avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override)``: nn.AvgPool2d with the arguments given as inputs."""

    POOL = AvgPool2d
    ARGUMENTS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                 "divisor_override")


# ----- adaptive pooling -------------------------------------------------------------------------

def as_output_size(dims: int = 2) -> Callable[[Any], tuple[int | None, int | None]]:
    """Converter of adaptive ``output_size``: an int, or ``dims`` entries where None keeps the
    input size. pnnx writes None as 0 (``(3, None)`` -> ``output_size=(3,0)``), so 0 means None
    here. A 1-D size is lifted to (1, size)."""

    def convert(value: Any) -> tuple[int | None, int | None]:
        if value is None or isinstance(value, (int, np.integer)):
            value = (value,) * dims
        if not isinstance(value, (list, tuple)) or len(value) != dims:
            raise ValueError(f"expected an int or {dims} entries")
        sizes = tuple(None if v is None or v == 0 else as_int(v) for v in value)
        if any(v is not None and v < 0 for v in sizes):
            raise ValueError("sizes must be >= 0")
        return sizes if dims == 2 else (1, *sizes)                      # type: ignore

    return convert


class _AdaptivePool(_Spatial, ArgumentInputLayer):
    """What adaptive average and max pooling share: the output size, a parameter or, when the
    model computes it from the input's size (``F.adaptive_avg_pool2d(x, (h // 2, w // 2))`` in
    a dynamic export), a second input."""

    output_size = Param(None, as_output_size(2))

    @property
    def n_outputs(self) -> int:
        return 1

    def _output_size(self, inputs: Sequence[Any]) -> Sequence[int | None]:
        value = param_or_input(self.output_size, "output_size", inputs)
        if isinstance(value, np.ndarray):                 # computed in the graph: real sizes
            sizes = tuple(int(v) for v in value)
            return sizes if self.dims == 2 else (1, *sizes)
        parameter: tuple[int | None, int | None] = value
        return parameter

    def infer_shapes_from(self, input_shapes: Sequence[Shape],
                          input_values: Sequence[np.ndarray | None]) -> list[Shape]:
        shape = self._lift_shape(input_shapes[0])
        out_hw = kernels.adaptive_output_size(shape, self._output_size(input_values))
        return [self._drop((*shape[:-2], *out_hw))] * self.n_outputs

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = self._lift(inputs[0])
        return [self._drop(y) for y in self._pool(x, self._output_size(inputs))]

    def _pool(self, x: np.ndarray, output_size: Sequence[int | None]) -> list[np.ndarray]:
        raise NotImplementedError


@register_layer("nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d")
class AdaptiveAvgPool2d(_AdaptivePool):
    """Adaptive average pooling, as ``torch.nn.AdaptiveAvgPool2d``: the output has a fixed size
    (Ho, Wo); output bin i along H averages rows [floor(i * H / Ho), ceil((i + 1) * H / Ho)),
    and the same along W. ``output_size=1`` is global average pooling."""

    def _pool(self, x: np.ndarray, output_size: Sequence[int | None]) -> list[np.ndarray]:
        return [kernels.adaptive_avg_pool2d(x, output_size)]


@register_layer("nn.AdaptiveAvgPool1d", "F.adaptive_avg_pool1d")
class AdaptiveAvgPool1d(AdaptiveAvgPool2d):
    """Adaptive average pooling over the last dim, as ``torch.nn.AdaptiveAvgPool1d``."""

    dims = 1
    output_size = Param(None, as_output_size(1))


@register_layer("nn.AdaptiveMaxPool2d", "F.adaptive_max_pool2d")
class AdaptiveMaxPool2d(_AdaptivePool):
    """Adaptive max pooling, as ``torch.nn.AdaptiveMaxPool2d``: the max of each adaptive bin
    (the bins of nn.AdaptiveAvgPool2d). ``return_indices=True`` adds a second output, the int64
    flat index h * W + w of each max; pnnx always writes F.adaptive_max_pool2d that way."""

    return_indices = Param(False, as_bool)

    @property
    def n_outputs(self) -> int:
        return 2 if self.return_indices else 1

    def _pool(self, x: np.ndarray, output_size: Sequence[int | None]) -> list[np.ndarray]:
        y = kernels.adaptive_max_pool2d(x, output_size, return_indices=self.return_indices)
        return list(y) if isinstance(y, tuple) else [y]


@register_layer("nn.AdaptiveMaxPool1d", "F.adaptive_max_pool1d")
class AdaptiveMaxPool1d(AdaptiveMaxPool2d):
    """Adaptive max pooling over the last dim, as ``torch.nn.AdaptiveMaxPool1d``; the indices
    are positions along L."""

    dims = 1
    output_size = Param(None, as_output_size(1))
