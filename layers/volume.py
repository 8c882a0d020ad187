"""3-D layers (video and volumes): nn.Conv3d / F.conv3d, nn.MaxPool3d, nn.AvgPool3d and
nn.AdaptiveAvgPool3d, over (N, C, D, H, W) inputs (or (C, D, H, W) unbatched).

Each is built from its 2-D counterpart, because the 3-D window is a 2-D window repeated along
depth (numpy reference code; the fast kernels are 2-D only):

    conv3d    y[:, :, d] = sum_i conv2d(x_padded[:, :, d*sd + i*dd], weight[:, :, i])
              (the output depths fold into the batch: kd 2-D convolutions in all)
    max pool  the max over the depth window of the 2-D window maxima
    avg pool  the sum over the depth window of the 2-D window sums, divided by the window
              size, which is the product of its sizes along D, H and W (counted as torch does)
    adaptive  the 2-D adaptive means of every depth slice, then the adaptive mean along depth
              (every slice of a depth bin has the same (H, W) bins, so the mean of their means
              is the mean of the box)

Along each dim the windows are counted as for 2-D layers (``kernels.window_output_size``:
ceil_mode adds a last window if it starts inside the input or the left padding).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from layers import kernels
from layers.base import (Layer, Param, Shape, as_bool, as_int, as_tuple, at_least,
                         bias_is_an_input, split_weight_inputs)
from layers.convolution import LearnedWeights, check_same_padding
from layers.normalization import _BatchNorm
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError

Triple = tuple[int, int, int]
PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def as_conv3d_padding(value: Any) -> tuple[int, ...] | str:
    """'same', 'valid', an int, three ints (d, h, w), or six ints in F.pad's order
    (w_left, w_right, h_top, h_bottom, d_front, d_back): pnnx writes that last form for a
    padding_mode other than zeros."""
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise ValueError("a string padding must be 'same' or 'valid'")
        return value
    if isinstance(value, (list, tuple)) and len(value) == 6:
        return at_least(0, as_tuple(6))(value)
    return at_least(0, as_tuple(3))(value)


def _before_after(padding: tuple[int, ...] | str, kernel: Triple, dilation: Triple
                  ) -> list[tuple[int, int]]:
    """The zeros before and after the input along D, H, W."""
    if padding == "valid":
        return [(0, 0)] * 3
    if padding == "same":                          # torch: the odd one out goes after
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in totals]
    if len(padding) == 6:
        w0, w1, h0, h1, d0, d1 = padding
        return [(d0, d1), (h0, h1), (w0, w1)]
    return [(p, p) for p in padding]


def _batched(shape: Shape) -> bool:
    if len(shape) not in (4, 5):
        raise ShapeError(f"expects (N, C, D, H, W) or (C, D, H, W), got {tuple(shape)}")
    return len(shape) == 5


# ----- convolution --------------------------------------------------------------------------

class _Conv3dGeometry(Layer):
    """The parameters nn.Conv3d and F.conv3d share, the output shape and the convolution."""

    stride = Param(1, at_least(1, as_tuple(3)))
    padding = Param(0, as_conv3d_padding)
    dilation = Param(1, at_least(1, as_tuple(3)))
    groups = Param(1, at_least(1, as_int))
    padding_mode = "zeros"                         # nn.Conv3d's is a parameter

    def check_params(self) -> None:
        check_same_padding(self.padding, self.stride)

    def _output_shape(self, x_shape: Shape, weight_shape: Shape) -> Shape:
        batched = _batched(x_shape)
        full = tuple(x_shape) if batched else (1, *x_shape)
        c_out, c_group, *kernel = weight_shape
        if full[1] != c_group * self.groups or c_out % self.groups:
            raise ShapeError(f"input has {full[1]} channels; the weight {tuple(weight_shape)} "
                             f"with groups={self.groups} needs {c_group * self.groups}")
        pads = _before_after(self.padding, tuple(kernel), self.dilation)
        out = [kernels.window_output_size(size, k, s, before, after, d)
               for size, (before, after), k, s, d in zip(full[2:], pads, kernel, self.stride,
                                                          self.dilation)]
        if min(out) <= 0:
            raise ShapeError(f"the input {tuple(x_shape)} is smaller than the kernel "
                             f"{tuple(kernel)} (dilated)")
        shape = (full[0], c_out, *out)
        return shape if batched else shape[1:]

    def _conv(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        shape = self._output_shape(x.shape, weight.shape)
        batched = x.ndim == 5
        x = x if batched else x[None]
        kernel = weight.shape[2:]
        pads = [(0, 0), (0, 0)] + _before_after(self.padding, kernel, self.dilation)
        mode = PAD_MODES[self.padding_mode]
        xp = np.pad(x, pads, mode=mode) if any(p != (0, 0) for p in pads) else x
        n, out_d = x.shape[0], shape[-3]
        (sd, sh, sw), (dd, dh, dw) = self.stride, self.dilation
        y = None
        for i in range(kernel[0]):                  # depth tap i: a 2-D conv of every slice
            planes = xp[:, :, i * dd:i * dd + sd * (out_d - 1) + 1:sd]   # (N, C, Do, Hp, Wp)
            planes = planes.transpose(0, 2, 1, 3, 4).reshape(n * out_d, *planes.shape[1:2],
                                                             *planes.shape[3:])
            part = kernels.conv2d(planes, weight[:, :, i], None, (sh, sw), 0, (dh, dw),
                                  self.groups)
            y = part if y is None else y + part
        y = y.reshape(n, out_d, *y.shape[1:]).transpose(0, 2, 1, 3, 4)
        if bias is not None:
            y = y + bias.reshape(-1, 1, 1, 1)
        y = np.ascontiguousarray(y, dtype=x.dtype)
        return y if batched else y[0]


@register_layer("nn.Conv3d")
class Conv3d(LearnedWeights, _Conv3dGeometry):
    """3-D convolution with learned weights, as ``torch.nn.Conv3d``: x (N, C_in, D, H, W),
    weight (C_out, C_in / groups, kd, kh, kw), bias (C_out,) -> y (N, C_out, Do, Ho, Wo); the
    padding mode is zeros, reflect, replicate or circular."""

    kernel_size = Param(convert=at_least(1, as_tuple(3)))

    def check_params(self) -> None:
        super().check_params()
        self.check_learned_params()

    def infer_shape(self, shape: Shape) -> Shape:
        return self._output_shape(shape, self.weight.shape)

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return self._conv(x, np.asarray(self.weight, x.dtype),
                          None if self.bias is None else np.asarray(self.bias, x.dtype))


@register_layer("F.conv3d")
class FConv3d(_Conv3dGeometry):
    """``F.conv3d(input, weight, bias)`` with the weight (and bias) computed in the graph:
    they are the 2nd and 3rd inputs."""

    bias = Param(None, bias_is_an_input)
    one_blob_only = False

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        x, weight, _ = split_weight_inputs(input_shapes)
        return [self._output_shape(x, weight)]

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, weight, bias = split_weight_inputs(inputs)
        return [self._conv(x, weight, bias)]


# ----- pooling ------------------------------------------------------------------------------

class _Pool3d(Layer):
    kernel_size = Param(convert=at_least(1, as_tuple(3)))
    stride: Param[Any] = Param(None)               # None: the kernel size (check_params)
    padding = Param(0, at_least(0, as_tuple(3)))
    ceil_mode = Param(False, as_bool)
    dilation = (1, 1, 1)                           # max pooling's is a parameter

    def check_params(self) -> None:
        self.stride = self.kernel_size if self.stride is None else \
            at_least(1, as_tuple(3))(self.stride)
        if any(p > k // 2 for p, k in zip(self.padding, self.kernel_size)):
            raise LayerError(f"padding {self.padding} must be at most half of the kernel size "
                             f"{self.kernel_size}")

    def infer_shape(self, shape: Shape) -> Shape:
        _batched(shape)                            # (N, C, D, H, W) or (C, D, H, W)
        dims = list(zip(shape[-3:], self.kernel_size, self.stride, self.padding,
                        self.dilation))
        # without ceil_mode, no position (<= 0) means the window is larger than the padded input
        if any(kernels.window_output_size(size, k, s, p, p, d) <= 0 for size, k, s, p, d in dims):
            raise ShapeError(f"the window {self.kernel_size} (dilation {self.dilation}) does "
                             f"not fit in {tuple(shape[-3:])} with padding {self.padding}")
        out = tuple(kernels.window_output_size(size, k, s, p, p, d, self.ceil_mode)
                    for size, k, s, p, d in dims)
        return (*shape[:-3], *out)

    def _slices(self, x: np.ndarray, fill: float) -> tuple[np.ndarray, int]:
        """x as (N*C, D + padding, H, W) with ``fill`` in the depth padding, and Do."""
        out_d = self.infer_shape(x.shape)[-3]
        sd, pd, kd, dd = self.stride[0], self.padding[0], self.kernel_size[0], self.dilation[0]
        need = (out_d - 1) * sd + dd * (kd - 1) + 1          # padded depth the windows read
        after = max(need - x.shape[-3] - pd, 0)
        flat = x.reshape(-1, *x.shape[-3:])
        padded = np.pad(flat, [(0, 0), (pd, after), (0, 0), (0, 0)], constant_values=fill)
        return padded, out_d

    def _pool2d_args(self):
        return (self.kernel_size[1:], self.stride[1:], self.padding[1:])

    def _over_depth(self, planes: np.ndarray, out_d: int, combine: np.ufunc) -> np.ndarray:
        """(M, Dp, Ho, Wo) 2-D window results of every padded depth slice -> (M, Do, Ho, Wo):
        ``combine`` (np.maximum, np.add) over the kd slices of each depth window."""
        sd, kd, dd = self.stride[0], self.kernel_size[0], self.dilation[0]
        y = planes[:, 0:sd * (out_d - 1) + 1:sd].copy()
        for i in range(1, kd):
            combine(y, planes[:, i * dd:i * dd + sd * (out_d - 1) + 1:sd], out=y)
        return y


@register_layer("nn.MaxPool3d", "F.max_pool3d")
class MaxPool3d(_Pool3d):
    """Max pooling, as ``torch.nn.MaxPool3d`` (no return_indices): the max of each (dilated)
    window, padding never wins."""

    dilation = Param(1, at_least(1, as_tuple(3)))     # type: ignore[assignment]
    return_indices = Param(False, as_bool)

    def check_params(self) -> None:
        super().check_params()
        if self.return_indices:
            raise LayerError("MaxPool3d with return_indices=True is not supported")

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        padded, out_d = self._slices(x, -np.inf)
        kernel, stride, padding = self._pool2d_args()
        planes = kernels.max_pool2d(padded, kernel, stride, padding, self.dilation[1:],
                                    self.ceil_mode)                    # (N*C, Dp, Ho, Wo)
        y = self._over_depth(planes, out_d, np.maximum)
        return y.reshape(*x.shape[:-3], *y.shape[1:])


@register_layer("nn.AvgPool3d", "F.avg_pool3d")
class AvgPool3d(_Pool3d):
    """Average pooling, as ``torch.nn.AvgPool3d``: each window's sum divided by
    ``divisor_override`` or its size, counting the zero padding (``count_include_pad``) or
    only the input; a window ceil_mode adds is cut at the padding."""

    count_include_pad = Param(True, as_bool)
    divisor_override = Param(None, at_least(1, as_int))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        padded, out_d = self._slices(x, 0.0)
        kernel, stride, padding = self._pool2d_args()
        sums = kernels.avg_pool2d(padded, kernel, stride, padding, self.ceil_mode, True,
                                  divisor_override=1)                   # (N*C, Dp, Ho, Wo)
        y = self._over_depth(sums, out_d, np.add)
        if self.divisor_override is not None:
            divisor = np.array(self.divisor_override, x.dtype)
        else:
            counts = [kernels.window_counts(size, out, k, s, p, self.count_include_pad)
                      for size, out, k, s, p in zip(x.shape[-3:], y.shape[1:],
                                                    self.kernel_size, self.stride,
                                                    self.padding)]
            divisor = np.einsum("i,j,k->ijk", *counts).astype(x.dtype)
        return (y / divisor).reshape(*x.shape[:-3], *y.shape[1:])


@register_layer("nn.AdaptiveAvgPool3d", "F.adaptive_avg_pool3d")
class AdaptiveAvgPool3d(Layer):
    """Adaptive average pooling to a fixed (Do, Ho, Wo), as ``torch.nn.AdaptiveAvgPool3d``
    (bins as nn.AdaptiveAvgPool2d's along each dim; None or 0 keeps that dim)."""

    output_size: Param[Any] = Param(convert=lambda v: v)

    def _sizes(self, shape: Shape) -> Triple:
        _batched(shape)
        value = self.output_size
        value = (value,) * 3 if isinstance(value, int) else tuple(value)
        if len(value) != 3:
            raise LayerError(f"output_size must be one or three sizes, got {self.output_size}")
        return tuple(shape[-3 + i] if v in (None, 0) else as_int(v) for i, v in enumerate(value))

    def infer_shape(self, shape: Shape) -> Shape:
        return (*shape[:-3], *self._sizes(shape))

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        out_d, out_h, out_w = self._sizes(x.shape)
        d = x.shape[-3]
        planes = kernels.adaptive_avg_pool2d(x.reshape(-1, d, *x.shape[-2:]), (out_h, out_w))
        depth_last = np.moveaxis(planes, 1, -1)                   # (M, Ho, Wo, D)
        y = kernels.adaptive_avg_pool2d(depth_last, (out_w, out_d))  # W kept, D binned
        y = np.moveaxis(y, -1, 1)                                  # (M, Do, Ho, Wo)
        return np.ascontiguousarray(y).reshape(*x.shape[:-3], out_d, out_h, out_w)


@register_layer("nn.BatchNorm3d")
class BatchNorm3d(_BatchNorm):
    """``nn.BatchNorm3d`` in eval mode: (N, C, D, H, W) -> same shape."""

    RANKS = (5,)
