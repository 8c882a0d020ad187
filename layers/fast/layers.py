"""The fast floor: subclasses of reference layers that run this package's kernels.

Each class overrides one reference layer of layers/*.py, as ncnn's x86 layers override its
generic ones, and is registered for the same pnnx types with ``@register_fast_layer``; the
graph creates it unless it is built with ``reference=True``. A fast layer takes the same
parameters and weights as its reference layer and computes the same result (the tests compare
the two); where its kernels do not apply (an unbatched input, a float64 array, indices asked
for) it hands over to the reference code with ``super()``.

    FastConv2d            nn.Conv2d: packed weights, kernel chosen per input size (conv.py);
                          fused padding, residual and activation applied in the kernels
    FastConv1d            nn.Conv1d: FastConv2d over a height of 1
    FastFunctionalConv2d  F.conv2d / F.conv1d, weights as inputs: packed on every call
    FastConvTranspose2d   nn.ConvTranspose2d / 1d whose kernel is its stride: one product in
                          register tiles, then a strided copy per tap
    FastLinear            nn.Linear: from 16 rows, register tiles on the weight's panels
                          (dense.py); fewer, BLAS, shared with the helper threads
    FastMaxPool2d         nn.MaxPool2d / nn.MaxPool1d / aten::max_pool2d: pool.py's kernel
    FastAdaptiveAvgPool2d nn.AdaptiveAvgPool2d to 1 x 1: pool.py's kernel, a sum per plane
    FastExpression        pnnx.Expression of one elementwise function (add(@0,@1), ...):
                          numpy's ufunc straight into the planned buffer
    FastGELU, FastSigmoid, FastSiLU, FastTanh, FastHardswish, FastHardsigmoid
                          the activation in one vectorised pass (epilogue.py), in place
    FastMultiheadAttention  nn.MultiheadAttention: self-attention's three projections as one
                          product in register tiles, the softmax by softmax.py's kernel, the
                          per-head products shared with the helper threads
    FastLayerNorm         nn.LayerNorm over the last dim: norm.py's kernel, row by row
    FastSoftmax           nn.Softmax / F.softmax over the last dim: softmax.py's kernel, row
                          by row, shared with the helper threads (attention's too)
    FastSqueezeExcitation the fused squeeze-and-excitation block (no pnnx type: fusion makes
                          it): excitation.py's kernels, large blocks shared by planes
    FastInterpolate, FastUpsampleNearest
                          F.interpolate / nn.Upsample / F.upsample_nearest, nearest by whole
                          factors: upsample.py's kernel, planes shared with the helpers
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from layers import kernels
from layers.base import FusesActivation, Layer, Shape, remember
from layers.convolution import (Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d,
                                FunctionalConv1d, FunctionalConv2d, lift_shape)
from layers.expression import ELEMENTWISE, ExpressionLayer
from layers.fast import excitation, norm, pool, softmax, upsample, workers
from layers.fast.algorithms import Call as ConvCall
from layers.fast.conv import PackedConv2d, kernel_layout
from layers.fast.dense import dense
from layers.fast.gemm import scatter_taps
from layers.fast.pointwise import _zeros, pointwise_conv2d
from layers.fast.pointwise_transposed import pack_panels
from layers.fast.team import scratch, team_worth_sharing
from parser.bin import release_pages
from layers.activation import GELU, Hardsigmoid, Hardswish, Sigmoid, SiLU, Softmax, Tanh
from layers.attention import MultiheadAttention
from layers.excitation import SqueezeExcitation
from layers.fast.epilogue import IDENTITY, Activation, activate, activation_of
from layers.linear import Linear
from layers.normalization import LayerNorm
from layers.pooling import AdaptiveAvgPool2d, AtenMaxPool2d, MaxPool1d, MaxPool2d
from layers.resize import Interpolate, UpsampleNearest, whole_factors
from layers.shape import Flatten, FlattenModule, Squeeze, Unsqueeze, read_only_alias
from layers.registry import register_fast_layer
from parser.expression import Call, Constant, OperandRef

Pads = tuple[int, int, int, int]


class KernelActivation(FusesActivation):
    """Fusion for a layer whose kernels apply the activation in their pass over the output
    (epilogue.py): only the activations they know are worth folding in."""

    def applies_activation(self, layer: Layer) -> bool:
        return super().applies_activation(layer) and activation_of(layer) is not None


@register_fast_layer("nn.Conv2d")
class FastConv2d(KernelActivation, Conv2d):
    """nn.Conv2d on the packed kernels: x (N, C_in, H, W) float32 -> (N, C_out, Ho, Wo), with
    the fused zero padding, residual add and activation done inside the kernel's pass over the
    output. The weights are packed for the algorithm each input size takes (``prepare``)."""

    support_forward_into = True          # the kernels write into the memory plan's buffer

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        super().load_model(weights)
        self._pack_weights()

    def _pack_weights(self) -> None:
        """The weights' PackedConv2d (packed for an algorithm only when one is chosen)."""
        self.packed = PackedConv2d(self.weight, self.bias, self.stride, self.dilation,
                                   self.groups)
        self.packed.load_candidate_kernels()
        self._forget_geometries()

    def _forget_geometries(self) -> None:
        """What _geometry and _forward_fast worked out per input shape: made again after a
        fusion changes the padding, the activation or the weights."""
        self._geometries: dict[Shape, tuple] = {}
        self._calls: dict[Shape, ConvCall] = {}
        self._direct: dict[Shape, tuple[ConvCall, Shape]] = {}   # forward_into's first try

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        """Pack the weights for the algorithm these shapes take and make the call
        _forward_fast will make (or, with shapes known only at run time, pack what any size
        is likely to need)."""
        if input_shapes is None:
            self.packed.prepare_for_any_size()
            return
        x_shape = self._kernel_shape(tuple(input_shapes[0]))
        if len(x_shape) == 4:
            pre_pad, pads, out_hw, activation, _ = self._geometry(x_shape)
            self.packed.prepare(x_shape[0], out_hw)
            if pre_pad is None and activation is not None:
                self._call_for(x_shape, pads, out_hw, activation)

    def _kernel_shape(self, shape: Shape) -> Shape:
        """The input's shape as the 2-D kernels see it."""
        return shape

    # ----- fusion: the kernels' geometry and epilogue change with what is folded in -------
    def fuse_padding(self, left: int, right: int, top: int, bottom: int) -> None:
        super().fuse_padding(left, right, top, bottom)
        self._forget_geometries()

    def fuse_activation(self, layer: Layer) -> None:
        super().fuse_activation(layer)
        self._forget_geometries()

    def fuse_affine(self, scale: float, shift: float) -> None:
        super().fuse_affine(scale, shift)
        self._pack_weights()             # the new weights (or activation): packing, geometries

    # ----- running --------------------------------------------------------------------------
    def _forward(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        if x.ndim != 4:                            # (C, H, W): the reference explains why not
            return super()._forward(x, residual)
        return self._forward_fast(x, residual)

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """The kernels write straight into ``outputs[0]``; any other path computes a new array
        and copies it over. An input shape whose call _forward_fast has made runs it at once
        (``_direct``: the fewest Python calls a step can make)."""
        x, residual = inputs[0], (inputs[1] if self.fused_residual else None)
        out = outputs[0]
        direct = self._direct.get(x.shape)
        if (direct is not None and out.shape == direct[1] and _kernel_ready(out, writeable=True)
                and (residual is None or residual.shape == direct[1])):
            direct[0](kernel_layout(x), None if residual is None else kernel_layout(residual),
                      out)
            return
        if x.ndim == 4 and out.dtype == np.float32:
            y = self._forward_fast(x, residual, out, direct=True)
        else:                                      # Conv1d's (N, C, L), (C, H, W) inputs
            y = self.forward(list(inputs))[0]
        if y is not out:
            np.copyto(out, y)

    def _forward_fast(self, x: np.ndarray, residual: np.ndarray | None,
                      out: np.ndarray | None = None, direct: bool = False) -> np.ndarray:
        """The packed kernels, with padding, bias, residual and activation fused in; into
        ``out`` where the kernels compute the whole result. ``direct``: remember the call
        for forward_into's inputs of this shape (``_direct``)."""
        pre_pad, pads, out_hw, activation, full = self._geometry(x.shape)
        if pre_pad is not None:                    # reflect, replicate or circular first
            x = kernels.pad(x, pre_pad, mode=self.padding_mode)
        if activation is None or (residual is not None and residual.shape != full):
            # no kernel code for the activation, or a residual that broadcasts: numpy adds it
            return self._finish(self.packed.run(x, pads, out_hw, IDENTITY), residual)
        if out is None or out.shape != full or not _kernel_ready(out, writeable=True):
            out = np.empty(full, np.float32)           # (forward_into copies it over)
        call = self._call_for(x.shape, pads, out_hw, activation)
        if direct and pre_pad is None and x.shape not in self._direct:
            remember(self._direct, x.shape, (call, full))
        call(kernel_layout(x), None if residual is None else kernel_layout(residual), out)
        return out

    def _call_for(self, x_shape: Shape, pads: Pads, out_hw: tuple[int, int],
                  activation: Activation) -> ConvCall:
        """PackedConv2d.call_for, looked up by the input's shape alone: the rest of its key
        follows from the shape until a fusion forgets the geometries (and these calls)."""
        call = self._calls.get(x_shape)
        if call is None:
            call = remember(self._calls, x_shape,
                            self.packed.call_for(x_shape, pads, out_hw, activation))
        return call

    def _geometry(self, x_shape: Shape) -> tuple[Pads | None, Pads, tuple[int, int],
                                                  Activation | None, Shape]:
        """(pre_pad, pads, out_hw, activation, full) for inputs of ``x_shape``, worked out once
        per shape: pre_pad is the (left, right, top, bottom) padding kernels.pad adds first for a
        padding_mode other than zeros (else None); pads the zeros (top, bottom, left, right)
        the kernels add, fused padding included; out_hw (Ho, Wo); activation the fused
        activation as the kernels take it (None if they cannot); full the output's shape
        (N, C_out, Ho, Wo)."""
        key = x_shape
        geometry = self._geometries.get(key)
        if geometry is None:
            top, bottom, left, right = self._pads(self.kernel_size)
            pre_pad = None
            if self.padding_mode != "zeros":
                pre_pad = (left, right, top, bottom)
                x_shape = (*x_shape[:2], x_shape[2] + top + bottom, x_shape[3] + left + right)
                top = bottom = left = right = 0
            fl, fr, ft, fb = self.fused_padding
            pads = (top + ft, bottom + fb, left + fl, right + fr)
            padded = (*x_shape[:2], x_shape[2] + pads[0] + pads[1],
                      x_shape[3] + pads[2] + pads[3])
            out_hw = kernels.conv2d_output_shape(padded, self.weight_shape, self.stride, 0,
                                                 self.dilation, self.groups)[2:]
            activation = (IDENTITY if self.fused_activation is None
                          else activation_of(self.fused_activation))
            full = (x_shape[0], self.out_channels, *out_hw)
            geometry = (pre_pad, pads, out_hw, activation, full)
            remember(self._geometries, key, geometry)
        return geometry


@register_fast_layer("nn.Conv1d")
class FastConv1d(Conv1d, FastConv2d):
    """nn.Conv1d: Conv1d lifts (N, C, L) to (N, C, 1, L) and FastConv2d runs it."""

    def _kernel_shape(self, shape: Shape) -> Shape:
        return lift_shape(shape)


@register_fast_layer("F.conv2d")
class FastFunctionalConv2d(FunctionalConv2d):
    """F.conv2d with the weight as an input: it may change from call to call, so it is packed
    on every call (inside it, never in the background), and never for Winograd (whose
    packing costs as much as a convolution)."""

    def _conv(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        if x.ndim != 4 or weight.ndim != 4:
            return super()._conv(x, weight, bias)
        packed = PackedConv2d(weight, bias, self.stride, self.dilation, self.groups,
                              winograd=False, once=True)
        out_hw = self._output_shape(x.shape, weight.shape)[2:]
        return packed.run(x, self._pads(weight.shape[2:]), out_hw, IDENTITY)


@register_fast_layer("F.conv1d")
class FastFunctionalConv1d(FunctionalConv1d, FastFunctionalConv2d):
    """F.conv1d: FunctionalConv1d lifts to 2-D and FastFunctionalConv2d runs it."""


@register_fast_layer("nn.ConvTranspose2d")
class FastConvTranspose2d(KernelActivation, ConvTranspose2d):
    """nn.ConvTranspose2d whose kernel equals its stride (a UNet's 2x2 stride-2 upsampling),
    without padding, dilation or groups: the windows of the input pixels do not overlap, so
    it is one matrix product and a scatter::

        cols[(i, j, o), p] = act(sum_c weight[c, o, i, j] x[c, p] + bias[o])   (pointwise.py,
                                                     in register tiles, shared over threads,
                                                     the fused activation in its epilogue)
        y[o, ih * kh + i, iw * kw + j] = cols[(i, j, o), (ih, iw)]        gemm.scatter_taps

    Every other transposed convolution runs the reference (a product, then adds per tap)."""

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        super().load_model(weights)
        self.no_overlap = (tuple(self.kernel_size) == tuple(self.stride) and self.groups == 1
                           and not any(self.padding) and not any(self.output_padding)
                           and tuple(self.dilation) == (1, 1))
        self._tap_weights()

    def fuse_affine(self, scale: float, shift: float) -> None:
        super().fuse_affine(scale, shift)
        self._tap_weights()                        # from the new weights

    def _tap_weights(self) -> None:
        c_in, c_out, kh, kw = self.weight.shape
        if self.no_overlap:          # rows (i, j, o) of the product, and their bias
            self.tap_rows = np.ascontiguousarray(
                self.weight.transpose(2, 3, 1, 0).reshape(kh * kw * c_out, c_in), np.float32)
            self.tap_bias = (None if self.bias is None
                             else np.tile(np.asarray(self.bias, np.float32), kh * kw))

    support_forward_into = True          # the taps are copied into the planned buffer

    def _conv_transpose(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None
                        ) -> np.ndarray:
        if not self._fast(x, weight):
            return super()._conv_transpose(x, weight, bias)
        n, _, h, w = x.shape
        _, c_out, kh, kw = weight.shape
        # the reference's forward_one applies the fused activation to what this returns
        return self._into(x, np.empty((n, c_out, h * kh, w * kw), np.float32), IDENTITY)

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x, out = inputs[0], outputs[0]
        activation = (IDENTITY if self.fused_activation is None
                      else activation_of(self.fused_activation))
        if x.ndim == 4 and self._fast(x, self.weight) and activation is not None:
            self._into(x, out, activation)
        else:                                      # the 1-D layer's (N, C, L), the reference
            np.copyto(out, self.forward(list(inputs))[0])

    def _fast(self, x: np.ndarray, weight: np.ndarray) -> bool:
        """Whether x runs the product: a float32 batch whose shape the layer takes (the
        reference's ShapeError otherwise, before any kernel reads it)."""
        if not (self.no_overlap and weight is self.weight and x.ndim == 4
                and x.dtype == np.float32):
            return False
        self._output_shape(x.shape, weight.shape)        # refuses a wrong channel count
        return True

    def _into(self, x: np.ndarray, y: np.ndarray, activation: Activation) -> np.ndarray:
        """y (N, C_out, H kh, W kw) <- the product's taps, activated, each copied to its
        place; the product goes to a work buffer kept between calls (team.scratch)."""
        n, c_in, h, w = x.shape
        _, c_out, kh, kw = self.weight.shape
        cols = scratch("transposed_taps", (n, kh * kw * c_out, h * w))
        pointwise_conv2d(self.tap_rows, kernel_layout(x).reshape(n, c_in, h * w),
                         self.tap_bias, None, activation, cols)
        scatter_taps(cols, y, kh, kw)
        return y


@register_fast_layer("nn.ConvTranspose1d")
class FastConvTranspose1d(ConvTranspose1d, FastConvTranspose2d):
    """nn.ConvTranspose1d: ConvTranspose1d lifts to 2-D and FastConvTranspose2d runs it."""


class TiledLinear:
    """y (M, out) = activation(x (M, in) @ weight.T + bias) in dense.py's register tiles, on
    the weight packed as panels (a copy: ``panels``), bias and activation in the same call,
    shared with the helper threads. ``weights`` (out_i, in) side by side make one product of
    them (an attention's q, k and v), with their ``biases`` (all or none). The panels are
    packed on first use and the mapped weights' pages given back: they are not read again
    here."""

    def __init__(self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray] | None):
        self.weights, self.biases = list(weights), None if biases is None else list(biases)
        self.in_features = weights[0].shape[1]
        self.out_features = sum(w.shape[0] for w in weights)
        self.packed: np.ndarray | None = None
        self.bias: np.ndarray | None = None

    def panels(self) -> np.ndarray:
        """(ceil(out / COLUMNS), in, COLUMNS): the weights' panels (pack_panels); made once."""
        packed = self.packed
        if packed is None:
            weight = (self.weights[0] if len(self.weights) == 1
                      else np.concatenate(self.weights))
            if self.biases is not None:
                self.bias = np.ascontiguousarray(np.concatenate(self.biases), np.float32)
            packed = self.packed = pack_panels(np.asarray(weight, np.float32))
            for weight in self.weights:
                release_pages(weight)
        return packed

    def run(self, x: np.ndarray, y: np.ndarray, activation: Activation = IDENTITY) -> None:
        """y (..., out) <- activation(x (..., in) @ weight.T + bias): float32, y C-contiguous."""
        panels = self.panels()
        dense(panels, kernel_layout(x.reshape(-1, self.in_features)), self.bias, activation,
              y.reshape(-1, self.out_features))


def tiles_take(x: np.ndarray) -> bool:
    """Whether a float32 x (..., in) runs the register tiles (``enough_rows``)."""
    return x.dtype == np.float32 and x.ndim >= 1 and enough_rows(x.shape)


def enough_rows(shape: Shape) -> bool:
    """Whether (..., in) has TILED_FROM rows or more: enough to fill the register tiles'
    rows (fewer: BLAS's GEMV is faster)."""
    return math.prod(shape[:-1]) >= TILED_FROM


TILED_FROM = 16        # rows of x


@register_fast_layer("nn.Linear")
class FastLinear(KernelActivation, Linear):
    """nn.Linear. From 16 rows of x, dense.py's register tiles (bias and a kernel activation
    in the same call, shared with the helper threads): on a copy of the weight packed as
    panels for a weight of at most TILED_MAX_PACKED bytes (TiledLinear), else on the weight
    as stored (float32, C-contiguous: else BLAS), each panel packed as the product goes (no
    second copy of a large weight). Fewer rows (BLAS's GEMV is faster there): one BLAS
    product x @ weight.T into a fresh output, shared with the helper threads when a forward
    has them, then the bias in place and the fused activation."""

    tile_activation: Activation | None = IDENTITY    # the fused activation as a kernel code

    def fuse_activation(self, layer: Layer) -> None:
        super().fuse_activation(layer)
        self.tile_activation = activation_of(layer)

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        if self.weight.nbytes <= TILED_MAX_PACKED and (
                input_shapes is None or enough_rows(tuple(input_shapes[0]))):
            self._tiled.panels()                      # packed now, not in the first forward

    @functools.cached_property
    def _tiled(self) -> TiledLinear:
        return TiledLinear([self.weight], None if self.bias is None else [self.bias])

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        small = self.weight.nbytes <= TILED_MAX_PACKED
        if not (tiles_take(x) and (small or _kernel_ready(self.weight))):
            return super().forward_one(x)
        y = np.empty((*x.shape[:-1], self.out_features), np.float32)
        activation = self.tile_activation or IDENTITY
        if small:
            self._tiled.run(x, y, activation)
        else:
            bias = None if self.bias is None else np.ascontiguousarray(self.bias, np.float32)
            dense(self.weight, kernel_layout(x.reshape(-1, self.in_features)), bias,
                  activation, y.reshape(-1, self.out_features))
        if self.tile_activation is None:              # not one the tiles apply
            self.fused_activation.forward_inplace(y)  # type: ignore[union-attr]
        return y

    def _linear(self, x: np.ndarray) -> np.ndarray:
        if x.ndim < 1 or x.dtype != np.float32:
            return super()._linear(x)
        return shared_linear(x, self.weight, self.bias)


TILED_MAX_PACKED = 1 << 20     # bytes: a larger weight is packed as the product goes (no copy)


SWAPPED_BELOW = 32     # rows of x: from 2 to this many, y.T = weight @ x.T (shared_linear)


def shared_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x (..., in) float32 @ weight.T (in, out) + bias: one product, shared with the helper
    threads when the forward has them (np.matmul otherwise).

    With few rows (a batch of classifier heads), BLAS spends most of x @ weight.T repacking
    the transposed weight, which it does in every call; y.T = weight @ x.T packs the weight
    as stored, at the cost of two small transposes. From SWAPPED_BELOW rows on, the product
    itself dominates and x @ weight.T is faster (BENCHMARKS.md, stop 32)."""
    out_features, in_features = weight.shape
    rows = x.reshape(-1, in_features)                           # (M, in)
    team = workers.current()
    if 1 < rows.shape[0] < SWAPPED_BELOW:
        rows_t = np.array(rows.T, order="C")                    # (in, M), a copy of its own
        y_t = np.empty((out_features, rows.shape[0]), np.float32)
        if team is not None and _kernel_ready(weight):
            team.matmul(weight[None], rows_t[None], y_t[None])
        else:
            np.matmul(weight, rows_t, out=y_t)
        y = np.empty((rows.shape[0], out_features), np.float32)
        if bias is None:
            np.copyto(y, y_t.T)
        else:
            np.add(y_t.T, bias, out=y)                          # transposed back, biased
        return y.reshape(*x.shape[:-1], out_features)
    y = np.empty((rows.shape[0], out_features), np.float32)
    if team is not None and _kernel_ready(rows) and _kernel_ready(weight):
        team.matmul(rows[None], weight[None], y[None], transposed=True)
    else:
        np.matmul(rows, weight.T, out=y)
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], out_features)


def _kernel_ready(a: np.ndarray, writeable: bool = False) -> bool:
    """float32, C-contiguous and aligned (and writeable, if ``writeable``): what the shared
    kernels take as they are."""
    flags = a.flags
    return (a.dtype == np.float32 and flags.c_contiguous and flags.aligned
            and (flags.writeable or not writeable))


@register_fast_layer("nn.MaxPool2d", "F.max_pool2d")
class FastMaxPool2d(MaxPool2d):
    """Max pooling of (N, C, H, W) float32 by the separable kernel (pool.py): rows, then
    columns. With ``return_indices`` the reference computes the indices too."""

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        if not self.return_indices:
            pool.load_kernel()                     # at build, not in the first inference

    @property
    def support_forward_into(self) -> bool:          # type: ignore[override]
        return not self.return_indices              # the indices are int64

    def _pool(self, x: np.ndarray, out: np.ndarray | None = None) -> list[np.ndarray]:
        if self.return_indices or x.ndim != 4 or x.dtype != np.float32:
            return super()._pool(x)
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        out_hw = kernels.pool2d_output_shape(x.shape, *geometry)[-2:]
        return [pool.max_pool2d(x, self.kernel_size, self.stride, self.padding,
                                self.dilation, out_hw, out)]

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x = inputs[0]
        if x.ndim == 4 and not self.return_indices and x.dtype == np.float32:
            self._pool(x, outputs[0])                # the kernel writes the planned buffer
        else:                                        # MaxPool1d's (N, C, L), the reference
            np.copyto(outputs[0], self.forward(list(inputs))[0])


@register_fast_layer("nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d")
class FastAdaptiveAvgPool2d(AdaptiveAvgPool2d):
    """Adaptive average pooling to 1 x 1 (global: a classifier's head) of (N, C, H, W) or
    (C, H, W) float32 by pool.py's kernel, a sum per plane; other sizes by the reference."""

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        pool.load_kernel()                         # at build, not in the first inference

    @property
    def support_forward_into(self) -> bool:          # type: ignore[override]
        return True

    def _global(self, x: np.ndarray, output_size: Sequence[int | None]) -> bool:
        """Whether x is pooled by the kernel: float32 (N, C, H, W) or (C, H, W) to 1 x 1."""
        return (x.ndim in (3, 4) and x.dtype == np.float32
                and kernels.adaptive_output_size(x.shape, output_size) == (1, 1))

    def check_params(self) -> None:
        super().check_params()
        self.__dict__.pop("_global_by_shape", None)  # decided with the old output size

    @functools.cached_property
    def _global_by_shape(self) -> dict[Shape, bool]:
        return {}

    def _pool(self, x: np.ndarray, output_size: Sequence[int | None]) -> list[np.ndarray]:
        if self._global(x, output_size):
            y = pool.global_average_pool(x.reshape(-1, *x.shape[-3:]))
            return [y.reshape(*x.shape[:-2], 1, 1)]
        return super()._pool(x, output_size)

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x, out = inputs[0], outputs[0]
        if len(inputs) == 1 and x.dtype == np.float32:     # output_size a parameter:
            pooled = self._global_by_shape.get(x.shape)     # decided once per input shape
            if pooled is None:
                pooled = remember(self._global_by_shape, x.shape,
                                  self._global(x, self._output_size(inputs)))
        else:
            pooled = self._global(x, self._output_size(inputs))
        if pooled and out.flags.c_contiguous:
            pool.global_average_pool(x.reshape(-1, *x.shape[-3:]),
                                     out.reshape(-1, x.shape[-3], 1, 1))
        else:
            np.copyto(out, self.forward(list(inputs))[0])


@register_fast_layer("nn.MaxPool1d", "F.max_pool1d")
class FastMaxPool1d(MaxPool1d, FastMaxPool2d):
    """nn.MaxPool1d: MaxPool1d lifts (N, C, L) to (N, C, 1, L) and FastMaxPool2d pools it."""


@register_fast_layer("aten::max_pool2d")
class FastAtenMaxPool2d(AtenMaxPool2d):
    """aten::max_pool2d: its arguments configure a FastMaxPool2d."""

    POOL = FastMaxPool2d

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        pool.load_kernel()                         # at build, not in the first inference


@register_fast_layer("F.interpolate", "F.upsample", "nn.Upsample")
class FastInterpolate(Interpolate):
    """Nearest resizing of float32 (N, C, H, W) by whole factors in one kernel pass
    (upsample.py), shared with the helper threads on large outputs; every other resizing
    runs the reference."""

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        if self.mode in ("nearest", "nearest-exact"):
            upsample.load_kernel()                 # at build, not in the first inference

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        factors = self._kernel_factors(inputs)
        if factors is None:
            return super().forward(inputs)
        y = np.empty(_upsampled(inputs[0].shape, factors), np.float32)
        upsample.upsample_nearest(inputs[0], y, *factors)
        return [y]

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        factors, (x, out) = self._kernel_factors(inputs), (inputs[0], outputs[0])
        if factors is None or not (_kernel_ready(out, writeable=True)
                                   and out.shape == _upsampled(x.shape, factors)):
            super().forward_into(inputs, outputs)
            return
        upsample.upsample_nearest(x, out, *factors)

    def _kernel_factors(self, inputs: Sequence[np.ndarray]) -> tuple[int, int] | None:
        """(kh, kw) where this is nearest resizing by whole factors of a float32 (N, C, H, W)
        array the kernel reads as it lies; None for anything else."""
        x = inputs[0]
        if (self.mode not in ("nearest", "nearest-exact") or self.antialias or x.ndim != 4
                or not _kernel_ready(x)):
            return None
        out, scales = self._plan(x.shape, inputs)  # refuses what the reference refuses
        factors = whole_factors(x.shape[2:], out, scales, self.mode)
        return None if factors is None else (factors[0], factors[1])


def _upsampled(shape: Shape, factors: tuple[int, int]) -> Shape:
    """The shape of (N, C, H, W) upsampled by (kh, kw)."""
    return (*shape[:2], shape[2] * factors[0], shape[3] * factors[1])


@register_fast_layer("F.upsample_nearest", "nn.UpsamplingNearest2d")
class FastUpsampleNearest(FastInterpolate, UpsampleNearest):
    """``F.upsample_nearest``: FastInterpolate's kernel, mode nearest."""


# functions of two values whose float32 result, for float32 arrays and Python numbers, is
# numpy's ufunc with no casting (torch's type promotion gives float32 too): the reference's
# own ufuncs for them (layers/expression.py's ELEMENTWISE)
UFUNCS = {name: ELEMENTWISE[name][0]
          for name in ("add", "sub", "mul", "div", "max", "maximum", "min", "minimum")}


class ShapeWorkedOutOnce:
    """For the layers that only give their input another shape (flatten, squeeze,
    unsqueeze): the output's shape worked out once per input shape (kept until the
    parameters change), then a reshape: a step of nothing but Python."""

    def check_params(self) -> None:
        super().check_params()                       # type: ignore[misc]
        self.__dict__.pop("_out_shapes", None)       # worked out with the old parameters

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        shape = self._out_shapes.get(x.shape)
        if shape is None:
            shape = remember(self._out_shapes, x.shape,
                             self.infer_shape(x.shape))  # type: ignore[attr-defined]
        return read_only_alias(x.reshape(shape), x)

    @functools.cached_property
    def _out_shapes(self) -> dict[Shape, Shape]:
        return {}


@register_fast_layer("torch.flatten", "Tensor.flatten")
class FastFlatten(ShapeWorkedOutOnce, Flatten):
    pass


@register_fast_layer("nn.Flatten")
class FastFlattenModule(ShapeWorkedOutOnce, FlattenModule):
    pass


@register_fast_layer("torch.squeeze", "Tensor.squeeze")
class FastSqueeze(ShapeWorkedOutOnce, Squeeze):
    pass


@register_fast_layer("torch.unsqueeze", "Tensor.unsqueeze")
class FastUnsqueeze(ShapeWorkedOutOnce, Unsqueeze):
    pass


@register_fast_layer("pnnx.Expression")
class FastExpression(ExpressionLayer):
    """An expression that is one function of UFUNCS over inputs and numbers (``add(@0,@1)``,
    ``mul(@0,0.5)``), on float32 inputs: y = ufunc(a, b), written straight into the planned
    buffer (forward_into) instead of walking the tree. Every other expression, and other
    dtypes, run the reference layer's evaluation."""

    def check_params(self) -> None:
        super().check_params()
        tree = self.tree
        self.operands: list[int | float] | None = None
        if (isinstance(tree, Call) and tree.name in UFUNCS and len(tree.args) == 2
                and all(isinstance(a, (OperandRef, Constant)) for a in tree.args)
                and any(isinstance(a, OperandRef) for a in tree.args)
                and all(isinstance(a.value, (int, float)) and not isinstance(a.value, bool)
                        for a in tree.args if isinstance(a, Constant))):
            self.ufunc = UFUNCS[tree.name]
            # an input's index, or a number (as a float: float32 arrays stay float32)
            self.operands = [a.index if isinstance(a, OperandRef) else float(a.value)
                             for a in tree.args]
        self.support_forward_into = self.operands is not None

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        first, second = self.operands or ()
        self.ufunc(inputs[first] if type(first) is int else first,
                   inputs[second] if type(second) is int else second, out=outputs[0])


class KernelActivationLayer:
    """An activation layer run by epilogue.py's activation pass: one vectorised pass over a
    float32 array, in place, shared with the helper threads when the array is large enough
    (SHARED_FROM values); other arrays, and activations without a kernel code (GELU's tanh
    form), run the reference layer."""

    def forward_inplace(self, x: np.ndarray) -> None:
        activation = self.kernel_activation
        if activation is None or not _kernel_ready(x, writeable=True):
            super().forward_inplace(x)              # type: ignore[misc]
            return
        if x.size == 0:
            return
        team = team_worth_sharing(x.size, SHARED_FROM)
        if team is not None:                    # rows to share out
            team.finish(x.reshape(1, -1, x.shape[-1]) if x.ndim >= 2
                        else x.reshape(1, 1, x.size), None, None, activation)
        else:                                   # one row: nothing differs per channel
            activate(x.reshape(1, 1, x.size), activation)

    @functools.cached_property
    def kernel_activation(self) -> Activation | None:
        """The activation as the kernels take it (epilogue.activation_of), found once."""
        return activation_of(self)


SHARED_FROM = 1 << 15        # values: below, waking the helpers costs more than it saves


@register_fast_layer("nn.GELU", "F.gelu")
class FastGELU(KernelActivationLayer, GELU):
    """GELU's erf form (epilogue.py: erf as a rational function, within torch's own float32
    error); the tanh form runs the reference."""


@register_fast_layer("nn.Sigmoid", "F.sigmoid", "torch.sigmoid")
class FastSigmoid(KernelActivationLayer, Sigmoid):
    """1 / (1 + exp(-x)) in one pass (exp: vexp.py)."""


@register_fast_layer("nn.SiLU", "F.silu")
class FastSiLU(KernelActivationLayer, SiLU):
    """x / (1 + exp(-x)) in one pass (exp: vexp.py)."""


@register_fast_layer("nn.Tanh", "F.tanh", "torch.tanh")
class FastTanh(KernelActivationLayer, Tanh):
    """tanh(x) in one pass (vexp.py: a polynomial near 0, exp beyond)."""


@register_fast_layer("nn.Hardswish", "F.hardswish")
class FastHardswish(KernelActivationLayer, Hardswish):
    """x * clip(x + 3, 0, 6) / 6 in one pass."""


@register_fast_layer("nn.Hardsigmoid", "F.hardsigmoid")
class FastHardsigmoid(KernelActivationLayer, Hardsigmoid):
    """clip(x + 3, 0, 6) / 6 in one pass."""


class FastSqueezeExcitation(SqueezeExcitation):
    """The block by excitation.py's kernels, on the 1x1 weights as the matrices the
    convolutions' gemv algorithm packs and the activations as kernel codes. Inputs other
    than float32 (N, C, H, W) with H * W > 0, and activations without a kernel code, run the
    reference layer."""

    support_forward_into = True

    def __init__(self, reduce: FastConv2d, expand: FastConv2d):
        super().__init__(reduce, expand)
        activations = [IDENTITY if conv.fused_activation is None
                       else activation_of(conv.fused_activation) for conv in (reduce, expand)]
        self.activation, self.gate = activations
        self.in_kernel = None not in activations     # both activations have a code
        self.reduce_matrix, self.expand_matrix = (conv.packed.packed("gemv")
                                                  for conv in (reduce, expand))
        self.reduce_bias, self.expand_bias = (_zeros(conv.out_channels) if conv.bias is None
                                              else conv.packed.bias for conv in (reduce, expand))

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        if self.in_kernel:
            excitation.load_kernel()
            return
        squeezed = None if input_shapes is None else [(*input_shapes[0][:2], 1, 1)]
        self.reduce.prepare(squeezed)                # the reference runs the convolutions
        self.expand.prepare(None if squeezed is None
                            else [self.reduce.infer_shape(squeezed[0])])

    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        if not (self.in_kernel and x.dtype == np.float32 and x.ndim == 4) or (
                self.adds_residual and inputs[1].shape != x.shape):   # it may broadcast y
            return super().forward(inputs)
        y = np.empty(x.shape, np.float32)
        self.forward_into(inputs, [y])
        return [y]

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        return self.forward([x])[0]

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x, y = inputs[0], outputs[0]
        residual = inputs[1] if self.adds_residual else None
        if (not self.in_kernel or x.ndim != 4 or x.shape[1] != self.channels
                or x.shape[2] * x.shape[3] == 0 or y.shape != x.shape
                or (residual is not None and residual.shape != x.shape)):
            np.copyto(y, super().forward(inputs)[0])  # the reference's answer or its error
            return
        if x.shape[0] == 0:                          # an empty batch
            return
        assert self.activation is not None and self.gate is not None
        excitation.squeeze_excitation(
            kernel_layout(x, writeable=False), y, self.reduce_matrix, self.reduce_bias,
            self.activation, self.expand_matrix, self.expand_bias, self.gate, self.keeps_input,
            None if residual is None else kernel_layout(residual, writeable=False))


@register_fast_layer("nn.MultiheadAttention")
class FastMultiheadAttention(MultiheadAttention):
    """nn.MultiheadAttention with its four projections (``shared_linear``) and its per-head
    products q @ k^T and weights @ v (a stack of N * heads products) shared with the helper
    threads, as FastLinear's product is; float32 only (else the reference)."""

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        super().load_model(weights)
        biases = None if self.q_bias is None else [self.q_bias, self.k_bias, self.v_bias]
        self.tiled_qkv = (TiledLinear([self.q_weight, self.k_weight, self.v_weight], biases)
                          if self.kdim == self.vdim == self.embed_dim else None)
        self.tiled_out = TiledLinear([self.out_weight],
                                     None if self.out_bias is None else [self.out_bias])

    def prepare(self, input_shapes: Sequence[Shape] | None) -> None:
        """Pack the tiles' panels at build: when the traced query has enough tokens, or
        when the sizes are known only at run time (self-attention on many tokens, likely)."""
        if input_shapes is None:
            self.tiled_out.panels()
            if self.tiled_qkv is not None:
                self.tiled_qkv.panels()
            return
        query, key, value, _ = self._split(input_shapes)
        if enough_rows(query):
            self.tiled_out.panels()
            if self.tiled_qkv is not None and tuple(query) == tuple(key) == tuple(value):
                self.tiled_qkv.panels()                 # self-attention, likely

    def _project_qkv(self, query: np.ndarray, key: np.ndarray, value: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Self-attention (one array as query, key and value): one product with the three
        weights side by side, in register tiles; q, k and v are views of its output."""
        if self.tiled_qkv is None or not (_same(query, key) and _same(query, value)
                                           and tiles_take(query)):
            return super()._project_qkv(query, key, value)
        E = self.embed_dim
        y = np.empty((*query.shape[:-1], 3 * E), np.float32)
        self.tiled_qkv.run(query, y)
        return y[..., :E], y[..., E:2 * E], y[..., 2 * E:]

    def _project(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None
                 ) -> np.ndarray:
        if x.dtype != np.float32 or weight.dtype != np.float32:
            return super()._project(x, weight, bias)
        if weight is self.out_weight and tiles_take(x):
            y = np.empty((*x.shape[:-1], self.embed_dim), np.float32)
            self.tiled_out.run(x, y)
            return y
        return shared_linear(np.ascontiguousarray(x), weight, bias)

    def _softmax(self, scores: np.ndarray) -> np.ndarray:
        if scores.dtype != np.float32 or not scores.flags.c_contiguous:
            return super()._softmax(scores)
        softmax.softmax_last(scores, scores)       # the scores are this call's own array
        return scores

    def _products(self, a: np.ndarray, b: np.ndarray, transposed: bool = False) -> np.ndarray:
        team = workers.current()
        if (team is None or a.dtype != np.float32 or b.dtype != np.float32
                or a.shape[:-2] != b.shape[:-2]):
            return super()._products(a, b, transposed)
        a3 = np.ascontiguousarray(a).reshape(-1, *a.shape[-2:])        # (T, M, K)
        b3 = np.ascontiguousarray(b).reshape(-1, *b.shape[-2:])        # (T, K, N) or (T, N, K)
        out = np.empty((a3.shape[0], a3.shape[1], b3.shape[1 if transposed else 2]),
                       np.float32)
        team.matmul(a3, b3, out, transposed=transposed)
        return out.reshape(*a.shape[:-1], out.shape[-1])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are the same values: one array, or views of one the same way."""
    return a is b or (a.ctypes.data == b.ctypes.data and a.shape == b.shape
                      and a.strides == b.strides and a.dtype == b.dtype)


class RowKernelLayer:
    """A layer whose kernel writes a float32 output of its input's shape (forward_into)
    where ``_kernel_takes(x)``; forward_one runs it into a new array, or the reference
    layer on what the kernel does not take."""

    support_forward_into = True

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        if not self._kernel_takes(x):
            return super().forward_one(x)           # type: ignore[misc]
        y = np.empty(x.shape, np.float32)
        self.forward_into([x], [y])                 # type: ignore[attr-defined]
        return y

    def _kernel_takes(self, x: np.ndarray) -> bool:
        raise NotImplementedError


@register_fast_layer("nn.Softmax", "F.softmax", "torch.softmax")
class FastSoftmax(RowKernelLayer, Softmax):
    """Softmax over the last dim of a float32 array by softmax.py's kernel (row by row,
    shared with the helper threads); other dims and dtypes run the reference."""

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x = inputs[0]
        if self._kernel_takes(x):
            softmax.softmax_last(x, outputs[0])      # copies x (any layout) into outputs[0]
        else:
            np.copyto(outputs[0], self.forward(list(inputs))[0])

    def _kernel_takes(self, x: np.ndarray) -> bool:
        return x.dtype == np.float32 and x.ndim >= 1 and self._dim(x.ndim) == x.ndim - 1


@register_fast_layer("nn.LayerNorm")
class FastLayerNorm(RowKernelLayer, LayerNorm):
    """nn.LayerNorm over the last dim (the usual normalized_shape of one size) of a float32
    array, by norm.py's kernel (one row at a time, float64 statistics); other shapes and
    dtypes run the reference."""

    def forward_into(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        x = inputs[0]
        if not self._kernel_takes(x):
            np.copyto(outputs[0], super().forward_one(x))
            return
        self.check_input(x.shape)
        norm.layer_norm(np.ascontiguousarray(x), self.weight, self.bias, self.eps, outputs[0])

    def _kernel_takes(self, x: np.ndarray) -> bool:
        return (x.dtype == np.float32 and len(self.normalized_shape) == 1 and x.ndim >= 1
                and x.shape[-1] > 0
                and all(w is None or w.dtype == np.float32 for w in (self.weight, self.bias)))
