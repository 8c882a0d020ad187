"""Reference kernels: plain numpy functions that compute what ``torch.nn.functional`` computes.

Each kernel is named after the torch function it mirrors and takes the same arguments with the
same defaults, so a notebook can put them side by side::

    from layers import kernels
    y = kernels.conv2d(x, w, b, stride=2, padding=1)       # == F.conv2d(x, w, b, 2, 1)

These are the *reference* implementations, the oracle: simple numpy, float32 in, float32 out,
BLAS doing the heavy lifting through ``np.matmul``. The fast backend (layers/fast/) computes
some of them faster, and its tests compare it with these.

Two ideas carry every windowed op (convolution, pooling):

* ``window_taps``: an output pixel reads a kh x kw window of the padded input. Instead of looping
  over pixels, loop over the kh*kw *taps* (9 for a 3x3 kernel): tap (i, j) of every window at
  once is a single strided view of the input. Pooling is then ``max``/``sum`` over those views.
* im2col: for a dense convolution the windows are unrolled into the columns of a matrix
  (``sliding_window_view`` + one copy), so the whole convolution becomes one matrix product.

Output sizes are computed by the ``*_output_shape`` helpers from input shapes alone; the kernels
and the layers' ``infer_shapes`` use the same helpers, so the two can never disagree.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from parser.errors import LayerError, ShapeError

Pair = tuple[int, int]


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf(x) = 2/sqrt(pi) * integral from 0 to x of exp(-t^2) dt, elementwise, in x's float
    dtype (scipy.special.erf, accurate to the last bit as torch's; numpy has no erf)."""
    from scipy import special        # on first use: a large package that few models need

    if out is None:
        return _in_float_dtype_of(x, special.erf(x))
    return special.erf(x, out=out)


def erfc(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erfc(x) = 1 - erf(x), computed directly so that a large x keeps its digits (1 - erf(5)
    is 0 in float32; erfc(5) is 1.5e-12)."""
    from scipy import special

    if out is None:
        return _in_float_dtype_of(x, special.erfc(x))
    return special.erfc(x, out=out)


def _in_float_dtype_of(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y in x's dtype if x is a float array (scipy computes float16 in float64)."""
    dtype = np.asarray(x).dtype
    return y.astype(dtype, copy=False) if dtype.kind == "f" else y


def _pair(value: int | Sequence[int]) -> Pair:
    """torch's ``_pair``: 3 -> (3, 3); (3, 1) -> (3, 1)."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    first, second = value
    return int(first), int(second)


# ================================================================ output sizes

def window_output_size(size: int, kernel: int, stride: int, pad_before: int, pad_after: int,
                       dilation: int = 1, ceil_mode: bool = False) -> int:
    """Number of window positions along one axis (torch's conv / pooling formula)::

        span = dilation * (kernel - 1) + 1                      # extent of one window
        out  = floor((size + pad_before + pad_after - span) / stride) + 1

    With ``ceil_mode`` the division rounds up instead, but (torch's rule) the last window must
    start inside the input or the left padding: one starting in the right padding is dropped.
    A result <= 0 means the window does not fit; the callers turn that into a ShapeError.
    """
    room = size + pad_before + pad_after - (dilation * (kernel - 1) + 1)
    if ceil_mode:
        out = -(-room // stride) + 1
        if (out - 1) * stride >= size + pad_before:
            out -= 1
        return out
    return room // stride + 1


def conv2d_padding(padding: int | Sequence[int] | str, kernel: Pair, dilation: Pair
                   ) -> tuple[int, int, int, int]:
    """torch's conv ``padding`` argument -> (top, bottom, left, right).

    An int or (ph, pw) pads both sides equally. ``'valid'`` is no padding. ``'same'`` pads
    ``dilation * (kernel - 1)`` in total per axis so that output size == input size (stride 1);
    when that total is odd, the extra row/column goes at the bottom/right, as torch does.
    Four ints are per side in F.pad's order, (left, right, top, bottom): pnnx writes an odd
    'same' of a conv with a padding_mode that way (torch's ``_reversed_padding_repeated_twice``).
    """
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            total_h, total_w = (d * (k - 1) for d, k in zip(dilation, kernel))
            return total_h // 2, total_h - total_h // 2, total_w // 2, total_w - total_w // 2
        raise LayerError(f"padding must be 'same', 'valid', an int or a pair, got {padding!r}")
    if not isinstance(padding, (int, np.integer)) and len(padding) == 4:
        left, right, top, bottom = (int(p) for p in padding)
        return top, bottom, left, right
    ph, pw = _pair(padding)
    return ph, ph, pw, pw


def _check_rank(shape: Sequence[int], ranks: tuple[int, ...], what: str) -> None:
    if len(shape) not in ranks:
        names = " or ".join(f"{r}-D" for r in ranks)
        raise ShapeError(f"expects a {names} {what}, got shape {tuple(shape)} "
                         f"(rank {len(shape)})")


def _check_pool_input(shape: Sequence[int]) -> None:
    """torch's check for pooling inputs: (N, C, H, W) or (C, H, W), where only N may be 0
    (an empty H or W has no windows to pool)."""
    _check_rank(shape, (3, 4), "(N, C, H, W) or (C, H, W) input")
    if 0 in tuple(shape)[-3:]:
        raise ShapeError(f"expects C, H and W of at least 1, got shape {tuple(shape)}")


def _spatial_size(shape: Sequence[int], out_h: int, out_w: int, pads: Sequence[int],
                  kernel: Pair, dilation: Pair) -> Pair:
    """Check the window fits: ShapeError naming the input size, padding and kernel if not."""
    if out_h <= 0 or out_w <= 0:
        top, bottom, left, right = pads
        height, width = shape[-2], shape[-1]
        span_h, span_w = (d * (k - 1) + 1 for d, k in zip(dilation, kernel))
        raise ShapeError(
            f"input {height}x{width} padded to {height + top + bottom}x{width + left + right} "
            f"is smaller than the {kernel[0]}x{kernel[1]} window (dilated to {span_h}x{span_w}); "
            f"the output would be {out_h}x{out_w}")
    return out_h, out_w


def conv2d_output_shape(x_shape: Sequence[int], weight_shape: Sequence[int],
                        stride: int | Pair = 1, padding: int | Sequence[int] | str = 0,
                        dilation: int | Pair = 1, groups: int = 1) -> tuple[int, int, int, int]:
    """(N, C_in, H, W) input and (C_out, C_in / groups, kh, kw) weight -> (N, C_out, Ho, Wo)."""
    _check_rank(x_shape, (4,), "(N, C, H, W) input")
    _check_rank(weight_shape, (4,), "(C_out, C_in / groups, kh, kw) weight")
    n, c, h, w = x_shape
    c_out, c_per_group, kh, kw = weight_shape
    if c != c_per_group * groups:
        raise ShapeError(f"input has {c} channels but the weight {tuple(weight_shape)} with "
                         f"groups={groups} expects {c_per_group * groups}")
    if c_out % groups:
        raise ShapeError(f"weight {tuple(weight_shape)}: {c_out} output channels are not "
                         f"divisible by groups={groups}")
    (sh, sw), dilation = _pair(stride), _pair(dilation)
    pads = conv2d_padding(padding, (kh, kw), dilation)
    out_h = window_output_size(h, kh, sh, pads[0], pads[1], dilation[0])
    out_w = window_output_size(w, kw, sw, pads[2], pads[3], dilation[1])
    return (n, c_out, *_spatial_size(x_shape, out_h, out_w, pads, (kh, kw), dilation))


def conv_transpose2d_output_shape(x_shape: Sequence[int], weight_shape: Sequence[int],
                                  stride: int | Pair = 1, padding: int | Pair = 0,
                                  output_padding: int | Pair = 0, groups: int = 1,
                                  dilation: int | Pair = 1) -> tuple[int, int, int, int]:
    """(N, C_in, H, W) input and (C_in, C_out / groups, kh, kw) weight -> (N, C_out, Ho, Wo)::

        Ho = (H - 1) * stride_h - 2 * padding_h + dilation_h * (kh - 1) + output_padding_h + 1

    (W alike): the input size a conv2d with these settings maps back to H, plus output_padding.
    """
    _check_rank(x_shape, (4,), "(N, C, H, W) input")
    _check_rank(weight_shape, (4,), "(C_in, C_out / groups, kh, kw) weight")
    n, c, h, w = x_shape
    c_in, c_out_group, kh, kw = weight_shape
    if c != c_in:
        raise ShapeError(f"input has {c} channels but the weight {tuple(weight_shape)} expects "
                         f"{c_in}")
    if c_in % groups:
        raise ShapeError(f"weight {tuple(weight_shape)}: {c_in} input channels are not "
                         f"divisible by groups={groups}")
    if h == 0 or w == 0:
        raise ShapeError(f"expects H and W of at least 1, got shape {tuple(x_shape)}")
    out_hw = tuple((size - 1) * s - 2 * p + d * (k - 1) + extra + 1
                   for size, k, s, p, extra, d in zip(
                       (h, w), (kh, kw), _pair(stride), _pair(padding), _pair(output_padding),
                       _pair(dilation)))
    if min(out_hw) <= 0:
        raise ShapeError(f"input {h}x{w} gives an output of {out_hw[0]}x{out_hw[1]}: the "
                         f"padding {_pair(padding)} crops more than the output has")
    return (n, c_out_group * groups, *out_hw)


def pool2d_output_shape(x_shape: Sequence[int], kernel_size: int | Pair,
                        stride: int | Pair | None = None, padding: int | Pair = 0,
                        dilation: int | Pair = 1, ceil_mode: bool = False) -> tuple[int, ...]:
    """(N, C, H, W) or (C, H, W) -> same leading dims with (Ho, Wo) for a pooling window."""
    _check_pool_input(x_shape)
    kernel = _pair(kernel_size)
    (sh, sw) = kernel if stride is None else _pair(stride)
    (ph, pw), dilation = _pair(padding), _pair(dilation)
    out_h = window_output_size(x_shape[-2], kernel[0], sh, ph, ph, dilation[0], ceil_mode)
    out_w = window_output_size(x_shape[-1], kernel[1], sw, pw, pw, dilation[1], ceil_mode)
    return (*x_shape[:-2], *_spatial_size(x_shape, out_h, out_w, (ph, ph, pw, pw), kernel,
                                          dilation))


def adaptive_output_size(x_shape: Sequence[int], output_size: int | Sequence[int | None]
                         ) -> Pair:
    """torch's adaptive ``output_size``: an int, or a pair whose None entries keep that size."""
    _check_pool_input(x_shape)
    sizes = (output_size, output_size) if isinstance(output_size, (int, np.integer)) \
        else tuple(output_size)
    if len(sizes) != 2 or any(size is not None and size < 0 for size in sizes):
        raise ShapeError(f"output_size must have 2 entries >= 0, got {tuple(sizes)}")
    return tuple(int(dim if size is None else size)                  # type: ignore[return-value]
                 for size, dim in zip(sizes, x_shape[-2:]))


# ================================================================ padding

_NUMPY_PAD_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}
# the largest pad of a dim of this size that each mode can fill, as torch allows it;
# circular wraps the dim once it is cropped, so its size is what remains
_PAD_LIMIT = {"reflect": lambda size, kept: size - 1, "circular": lambda size, kept: kept,
              "replicate": lambda size, kept: math.inf if size else 0}


def pad_widths(rank: int, pad: Sequence[int]) -> list[Pair]:
    """torch's ``pad`` tuple -> numpy's per-axis (before, after) list.

    torch lists the pads from the LAST dimension backwards: (left, right, top, bottom, ...)
    pads W by (left, right), then H by (top, bottom), and so on; unlisted leading dims get 0.
    """
    if len(pad) % 2:
        raise ShapeError(f"pad {tuple(pad)} must have an even length")
    if len(pad) // 2 > rank:
        raise ShapeError(f"pad {tuple(pad)} pads {len(pad) // 2} dims, the input has {rank}")
    widths = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        widths[rank - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return widths


def pad_output_shape(shape: Sequence[int], pad: Sequence[int], mode: str = "constant"
                     ) -> tuple[int, ...]:
    """Output shape of ``F.pad``, with torch's checks: negative pads may crop at most the
    whole dim; the non-constant modes pad the last 1, 2 or 3 dims of an input with one or two
    more dims, and in a padded dim reflect needs pad < size, circular pad <= the size left
    after cropping, replicate any size but 0."""
    widths = pad_widths(len(shape), pad)
    padded = len(pad) // 2
    if mode != "constant" and (not 1 <= padded <= 3 or len(shape) not in (padded + 1,
                                                                          padded + 2)):
        raise ShapeError(f"{mode} padding of {padded} dims takes a {padded + 1}-D or "
                         f"{padded + 2}-D input, got shape {tuple(shape)}")
    for size, (before, after) in zip(shape, widths):
        kept = size + min(before, 0) + min(after, 0)      # what the negative pads leave
        if kept < 0:
            raise ShapeError(f"pad {tuple(pad)} crops {-min(before, 0) - min(after, 0)} "
                             f"elements from a dim of size {size} of input {tuple(shape)}")
        if mode != "constant" and (before or after):
            limit = _PAD_LIMIT[mode](size, kept)
            if max(before, after) > limit:
                raise ShapeError(f"{mode} padding {(before, after)} is too large for a dim of "
                                 f"size {size} (at most {limit})")
    return tuple(size + before + after for size, (before, after) in zip(shape, widths))


def pad(x: np.ndarray, pad: Sequence[int], mode: str = "constant", value: float = 0.0
        ) -> np.ndarray:
    """``F.pad``: pad the trailing dims of ``x``; a negative pad crops instead.

    mode 'constant' fills with ``value``; 'reflect' mirrors without repeating the edge
    ([1 2 3] -> 3 2 | 1 2 3 | 2 1); 'replicate' repeats the edge; 'circular' wraps around.
    In torch's order, reflect and replicate fill from the whole input and then crop (reflect
    (3, -3) of [0 1 2 3 4] is 3 2 1 0 1), circular crops and then wraps what is left
    ((2, -1): 2 3 | 0 1 2 3). Returns ``x`` itself (no copy) when every pad is 0.
    """
    pad_output_shape(x.shape, pad, mode)
    widths = pad_widths(x.ndim, pad)
    grow = [(max(before, 0), max(after, 0)) for before, after in widths]
    if not any(before or after for before, after in grow):
        return _crop(x, widths)
    if mode in ("reflect", "replicate"):
        return _crop(np.pad(x, grow, mode=_NUMPY_PAD_MODE[mode]), widths)
    x = _crop(x, widths)                             # crop first, then wrap or fill
    if mode == "circular":
        return np.pad(x, grow, mode="wrap")
    out = np.full([size + b + a for size, (b, a) in zip(x.shape, grow)], value, dtype=x.dtype)
    out[tuple(slice(b, b + size) for size, (b, _) in zip(x.shape, grow))] = x
    return out


def _crop(x: np.ndarray, widths: Sequence[Pair]) -> np.ndarray:
    """The view of ``x`` without the negative (before, after) widths of each dim."""
    return x[tuple(slice(max(-before, 0), size - max(-after, 0))
                   for size, (before, after) in zip(x.shape, widths))]


# ================================================================ windows

def window_taps(xp: np.ndarray, kernel: Pair, stride: Pair, dilation: Pair, out_hw: Pair
                ) -> Iterator[tuple[Pair, np.ndarray]]:
    """Yield ``((i, j), view)`` for each of the kh*kw kernel taps. ``view`` is what tap (i, j)
    reads in every output window of the padded input ``xp`` (no copy)::

        view[..., oh, ow] = xp[..., oh * stride_h + i * dilation_h, ow * stride_w + j * dilation_w]

    A windowed op is then a short loop over taps, each step one whole-array numpy operation.
    """
    (kh, kw), (sh, sw), (dh, dw), (out_h, out_w) = kernel, stride, dilation, out_hw
    for i in range(kh):
        for j in range(kw):
            top, left = i * dh, j * dw
            yield (i, j), xp[..., top:top + sh * (out_h - 1) + 1:sh,
                             left:left + sw * (out_w - 1) + 1:sw]


def _pool_pad(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> Pair:
    """(before, after) padding so that every one of the ``out`` windows lies inside the padded
    input; with ceil_mode the last window may need more than ``pad`` on the right."""
    needed = (out - 1) * stride + dilation * (kernel - 1) + 1
    return pad, max(needed - size - pad, 0)


def _pool_prepare(x: np.ndarray, kernel_size, stride, padding, dilation, ceil_mode, fill: float):
    """Common start of the pooling kernels: sizes, and the input padded with ``fill``."""
    kernel = _pair(kernel_size)
    stride = kernel if stride is None else _pair(stride)
    padding, dilation = _pair(padding), _pair(dilation)
    out_hw = pool2d_output_shape(x.shape, kernel, stride, padding, dilation, ceil_mode)[-2:]
    (top, bottom), (left, right) = (
        _pool_pad(x.shape[axis], out_hw[k], kernel[k], stride[k], padding[k], dilation[k])
        for k, axis in enumerate((-2, -1)))
    xp = pad(x, (left, right, top, bottom), value=fill)
    return xp, kernel, stride, padding, dilation, out_hw


# ================================================================ convolution

def conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           stride: int | Pair = 1, padding: int | Sequence[int] | str = 0, dilation: int | Pair = 1,
           groups: int = 1) -> np.ndarray:
    """``F.conv2d``: 2-D cross-correlation of an (N, C_in, H, W) input with a
    (C_out, C_in / groups, kh, kw) weight::

        y[n, o, oh, ow] = bias[o] + sum_{c, i, j} weight[o, c, i, j]
                          * xpad[n, g * C_in/groups + c, oh * sh + i * dh, ow * sw + j * dw]

    where g = o // (C_out / groups) is the group of output channel o. Three paths, same maths:
    a 1x1 kernel is a plain matrix product, a depthwise kernel (one input channel per group)
    accumulates its kh*kw taps, anything else is im2col + one matrix product per group.
    """
    n, c_out, out_h, out_w = conv2d_output_shape(x.shape, weight.shape, stride, padding,
                                                 dilation, groups)
    c_in, (kh, kw) = x.shape[1], weight.shape[2:]
    stride, dilation = _pair(stride), _pair(dilation)
    top, bottom, left, right = conv2d_padding(padding, (kh, kw), dilation)
    xp = pad(x, (left, right, top, bottom))                  # (N, C_in, Hp, Wp)
    if (kh, kw) == (1, 1) and groups == 1:
        y = _conv2d_1x1(xp, weight, stride, (out_h, out_w))
    elif groups == c_in and weight.shape[1] == 1:
        y = _conv2d_depthwise(xp, weight, stride, dilation, (out_h, out_w))
    else:
        y = _conv2d_im2col(xp, weight, groups, stride, dilation, (out_h, out_w))
    if bias is not None:
        y += bias.reshape(c_out, 1, 1)                       # broadcast over (N, C_out, Ho, Wo)
    return y


def _conv2d_1x1(xp: np.ndarray, weight: np.ndarray, stride: Pair, out_hw: Pair) -> np.ndarray:
    """A 1x1 convolution is a matrix product over channels at every (strided) pixel."""
    n, c_in = xp.shape[:2]
    c_out = weight.shape[0]
    pixels = xp[:, :, ::stride[0], ::stride[1]]              # (N, C_in, Ho, Wo), a view
    cols = pixels.reshape(n, c_in, out_hw[0] * out_hw[1])    # copies only if strided
    y = weight.reshape(c_out, c_in) @ cols                   # (C_out, C_in) @ (N, C_in, L)
    return y.reshape(n, c_out, *out_hw)


def _conv2d_depthwise(xp: np.ndarray, weight: np.ndarray, stride: Pair, dilation: Pair,
                      out_hw: Pair) -> np.ndarray:
    """One input channel per group: each output channel is a weighted sum of kh*kw shifted
    views of its input channel. A channel multiplier m (C_out = m * C_in) gives m outputs per
    input channel, output channel c*m + k using weight[c*m + k]."""
    n, c_in = xp.shape[:2]
    c_out, _, kh, kw = weight.shape
    m = c_out // c_in
    w = weight.reshape(c_in, m, kh, kw)
    y = np.zeros((n, c_in, m, *out_hw), dtype=xp.dtype)     # (N, C_in, m, Ho, Wo)
    term = np.empty_like(y)
    for (i, j), tap in window_taps(xp, (kh, kw), stride, dilation, out_hw):   # (N, C_in, Ho, Wo)
        np.multiply(tap[:, :, None], w[:, :, i, j, None, None], out=term)
        y += term
    return y.reshape(n, c_out, *out_hw)


def _conv2d_im2col(xp: np.ndarray, weight: np.ndarray, groups: int, stride: Pair,
                   dilation: Pair, out_hw: Pair) -> np.ndarray:
    """im2col: unroll every window into a column, then one matrix product per group::

        cols[n, g, (c, i, j), (oh, ow)] = xpad[n, g * C_in/groups + c, oh*sh + i*dh, ow*sw + j*dw]
        y[n, g] = weight[g] (C_out/groups, C_in/groups * kh * kw) @ cols[n, g]
    """
    n, c_in = xp.shape[:2]
    c_out, c_group, kh, kw = weight.shape
    (sh, sw), (dh, dw), (out_h, out_w) = stride, dilation, out_hw
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    # every window position: (N, C_in, Hp - span_h + 1, Wp - span_w + 1, span_h, span_w), a view
    windows = sliding_window_view(xp, span, axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]          # (N, C_in, Ho, Wo, kh, kw) view
    windows = windows.reshape(n, groups, c_group, out_h, out_w, kh, kw)
    cols = windows.transpose(0, 1, 2, 5, 6, 3, 4).reshape(  # the one copy: (N, G, K, L)
        n, groups, c_group * kh * kw, out_h * out_w)
    w = weight.reshape(groups, c_out // groups, c_group * kh * kw)            # (G, O/G, K)
    y = np.matmul(w, cols)                                   # (N, G, O/G, L)
    return y.reshape(n, c_out, out_h, out_w)


def conv_transpose2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                     stride: int | Pair = 1, padding: int | Pair = 0,
                     output_padding: int | Pair = 0, groups: int = 1,
                     dilation: int | Pair = 1) -> np.ndarray:
    """``F.conv_transpose2d``: the adjoint of conv2d. Every input pixel scatters itself, times
    the kernel, into the output (C_in, C_out / groups, kh, kw weight)::

        full[n, g * O/G + o, ih * sh + i * dh, iw * sw + j * dw]
            += sum_c x[n, g * C/G + c, ih, iw] * weight[g * C/G + c, o, i, j]
        y = full without ``padding`` rows / columns on each side, + bias

    ``output_padding`` makes ``full`` that much taller / wider at the bottom / right (rows no
    pixel reaches: they hold the bias only). One matrix product per group computes every
    (o, i, j) contribution of every pixel; then a loop over the kh*kw taps adds each one into
    its strided place, the same views of ``full`` that ``window_taps`` reads in a conv2d.
    """
    n, c_out, out_h, out_w = conv_transpose2d_output_shape(
        x.shape, weight.shape, stride, padding, output_padding, groups, dilation)
    c_in, h, w = x.shape[1:]
    _, c_out_group, kh, kw = weight.shape
    (ph, pw), stride, dilation = _pair(padding), _pair(stride), _pair(dilation)
    w_t = weight.reshape(groups, c_in // groups, c_out_group * kh * kw).transpose(0, 2, 1)
    cols = np.matmul(w_t, x.reshape(n, groups, c_in // groups, h * w))   # (N, G, O/G*kh*kw, HW)
    cols = cols.reshape(n, c_out, kh, kw, h, w)
    full = np.zeros((n, c_out, out_h + 2 * ph, out_w + 2 * pw), dtype=x.dtype)
    for (i, j), place in window_taps(full, (kh, kw), stride, dilation, (h, w)):  # (N, O, H, W)
        place += cols[:, :, i, j]
    y = np.ascontiguousarray(full[:, :, ph:ph + out_h, pw:pw + out_w])   # (N, C_out, Ho, Wo)
    if bias is not None:
        y += bias.reshape(c_out, 1, 1)
    return y


# ================================================================ pooling

def max_pool2d(x: np.ndarray, kernel_size: int | Pair, stride: int | Pair | None = None,
               padding: int | Pair = 0, dilation: int | Pair = 1, ceil_mode: bool = False
               ) -> np.ndarray:
    """``F.max_pool2d``: the largest value in each (dilated) window; padding never wins
    (it is -inf). ``stride=None`` means stride = kernel_size."""
    xp, kernel, stride, _, dilation, out_hw = _pool_prepare(
        x, kernel_size, stride, padding, dilation, ceil_mode, fill=-np.inf)
    taps = window_taps(xp, kernel, stride, dilation, out_hw)
    y = next(taps)[1].copy()                                 # (..., Ho, Wo)
    for _, tap in taps:
        np.maximum(y, tap, out=y)
    return y


def max_pool2d_with_indices(x: np.ndarray, kernel_size: int | Pair,
                            stride: int | Pair | None = None, padding: int | Pair = 0,
                            dilation: int | Pair = 1, ceil_mode: bool = False
                            ) -> tuple[np.ndarray, np.ndarray]:
    """``F.max_pool2d(..., return_indices=True)``: the max of each window and where it is, as
    the flat index ``h * W + w`` into the input's (H, W) plane (what MaxUnpool2d takes).

    As in torch, each window starts at -inf pointing at its first element inside the input;
    scanning the taps in row-major order, a value replaces it if it is larger (so the first of
    equal maxima wins) or NaN (so NaN always wins).
    """
    xp, kernel, stride, padding, dilation, out_hw = _pool_prepare(
        x, kernel_size, stride, padding, dilation, ceil_mode, fill=-np.inf)
    width = x.shape[-1]
    rows, cols = (np.arange(out) * s - p for out, s, p in zip(out_hw, stride, padding))
    first_rows, first_cols = (np.where(start < 0, start - (start // d) * d, start)
                              for start, d in ((rows, dilation[0]), (cols, dilation[1])))
    y = np.full(xp.shape[:-2] + out_hw, -np.inf, dtype=x.dtype)                # (..., Ho, Wo)
    index = np.empty(y.shape, dtype=np.int64)
    index[...] = np.add.outer(first_rows * width, first_cols)
    for (i, j), tap in window_taps(xp, kernel, stride, dilation, out_hw):
        better = (tap > y) | np.isnan(tap)
        np.copyto(y, tap, where=better)
        np.copyto(index, np.add.outer((rows + i * dilation[0]) * width,
                                      cols + j * dilation[1]), where=better)
    return y, index


def adaptive_max_pool2d(x: np.ndarray, output_size: int | Sequence[int | None],
                        return_indices: bool = False
                        ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``F.adaptive_max_pool2d``: the max of each adaptive bin (the bins of
    ``adaptive_avg_pool2d``: bin i along an axis covers [floor(i * size / out),
    ceil((i + 1) * size / out))), and with ``return_indices`` its flat index ``h * W + w``.

    Max is separable, so the values take a max over each row bin, then each column bin. The
    indices take one tap per (i, j) offset inside the bins, every bin at once (a gather);
    offsets past a shorter bin repeat its last element, which changes nothing.
    """
    out_h, out_w = adaptive_output_size(x.shape, output_size)
    height, width = x.shape[-2:]
    (start_h, end_h), (start_w, end_w) = _adaptive_bins(height, out_h), _adaptive_bins(width,
                                                                                      out_w)
    if not return_indices:
        rows = np.stack([x[..., a:b, :].max(axis=-2) for a, b in zip(start_h, end_h)], -2)
        return np.stack([rows[..., a:b].max(axis=-1) for a, b in zip(start_w, end_w)], -1)
    y = np.full((*x.shape[:-2], out_h, out_w), -np.inf, dtype=x.dtype)
    index = np.empty(y.shape, dtype=np.int64)
    index[...] = np.add.outer(start_h * width, start_w)
    for i in range(int((end_h - start_h).max(initial=0))):
        rows = np.minimum(start_h + i, end_h - 1)                          # (Ho,)
        for j in range(int((end_w - start_w).max(initial=0))):
            cols = np.minimum(start_w + j, end_w - 1)                      # (Wo,)
            tap = x[..., rows[:, None], cols[None, :]]                     # (..., Ho, Wo)
            better = (tap > y) | np.isnan(tap)
            np.copyto(y, tap, where=better)
            np.copyto(index, np.add.outer(rows * width, cols), where=better)
    return y, index


def avg_pool2d(x: np.ndarray, kernel_size: int | Pair, stride: int | Pair | None = None,
               padding: int | Pair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> np.ndarray:
    """``F.avg_pool2d``: the sum of each window divided by, per torch:

    * ``divisor_override`` if given, else
    * the window's size clipped to the padded input (``count_include_pad=True``), or
    * the number of real input elements in it (``count_include_pad=False``).

    Windows are rectangles, so the divisor is an outer product of per-axis counts.
    """
    xp, kernel, stride, padding, _, out_hw = _pool_prepare(
        x, kernel_size, stride, padding, 1, ceil_mode, fill=0.0)
    taps = window_taps(xp, kernel, stride, (1, 1), out_hw)
    y = next(taps)[1].copy()                                 # (..., Ho, Wo)
    for _, tap in taps:
        y += tap
    if divisor_override:
        y /= np.float32(divisor_override)
        return y
    count_h, count_w = (
        window_counts(x.shape[axis], out_hw[k], kernel[k], stride[k], padding[k],
                       count_include_pad) for k, axis in enumerate((-2, -1)))
    y /= np.outer(count_h, count_w).astype(y.dtype)          # (Ho, Wo) broadcast
    return y


def window_counts(size: int, out: int, kernel: int, stride: int, pad: int,
                   include_pad: bool) -> np.ndarray:
    """How many elements each window along one axis counts for the average."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, size + pad)             # clipped to the padded input
    if include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)     # clipped to the real input


GLOBAL_POOL_GEMV = 4096         # global average pooling of planes up to 64 x 64: a GEMV


def adaptive_avg_pool2d(x: np.ndarray, output_size: int | Sequence[int | None]) -> np.ndarray:
    """``F.adaptive_avg_pool2d``: split H into out_h bins (and W likewise), average each bin.
    Bin i along an axis of ``size`` covers [floor(i * size / out), ceil((i + 1) * size / out)),
    so bins may overlap when out does not divide size (7 -> 3: [0,3) [2,5) [4,7)).

    A bin's average is separable: average its rows, then its columns. Each bin sums only its
    own elements, as torch does, so a NaN or Inf reaches only the bins that hold it (a matrix
    product with 0 weights would spread it everywhere: 0 * NaN = NaN)."""
    out_h, out_w = adaptive_output_size(x.shape, output_size)
    area = x.shape[-2] * x.shape[-1]
    if (out_h, out_w) == (1, 1) and x.dtype == np.float32 and 0 < area <= GLOBAL_POOL_GEMV:
        # global pooling (a classifier head, a squeeze-and-excitation block): one
        # matrix-vector product with 1/area, 3-6x faster than np.mean; each plane's sum is
        # its own, and BLAS sums it in vector lanes: within torch's own float32 error (tests)
        planes = np.ascontiguousarray(x).reshape(-1, area)
        means = planes @ np.full(area, 1 / area, np.float32)
        return means.reshape(*x.shape[:-2], 1, 1)
    rows = _bin_means(x, -2, out_h)                          # (..., Ho, W)
    y = _bin_means(rows, -1, out_w)                          # (..., Ho, Wo)
    return y.copy() if y is x else y                         # never the input itself


def _bin_means(x: np.ndarray, axis: int, out: int) -> np.ndarray:
    """The mean of each of the ``out`` adaptive bins along ``axis`` (-2 or -1)."""
    size = x.shape[axis]
    if out == size:                                          # every bin is one element
        return x
    if out and size % out == 0:                              # equal bins: one reshaped mean
        split = (*x.shape[:x.ndim + axis], out, size // out, *x.shape[x.ndim + axis + 1:])
        return x.reshape(split).mean(axis=axis)
    start, end = _adaptive_bins(size, out)
    shape = list(x.shape)
    shape[axis] = out
    y = np.empty(shape, dtype=x.dtype)
    for i, (a, b) in enumerate(zip(start, end)):
        if axis == -2:
            y[..., i, :] = x[..., a:b, :].mean(axis=-2)
        else:
            y[..., i] = x[..., a:b].mean(axis=-1)
    return y


def _adaptive_bins(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each of the ``out`` adaptive bins over an axis of ``size``."""
    i = np.arange(out)
    start = (i * size) // out                                # floor(i * size / out)
    end = -((-(i + 1) * size) // out)                        # ceil((i + 1) * size / out)
    return start, end


# ================================================================ dense, softmax, batch norm

def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``F.linear``: y = x @ weight.T + bias over the last dim; any leading dims.
    x (..., in), weight (out, in), bias (out,) -> y (..., out)."""
    out_features, in_features = weight.shape
    y = x.reshape(-1, in_features) @ weight.T                # (M, in) @ (in, out): one GEMM
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], out_features)


def addmm(input: np.ndarray, mat1: np.ndarray, mat2: np.ndarray, beta: float = 1.0,
          alpha: float = 1.0) -> np.ndarray:
    """``torch.addmm`` (and ``torch.baddbmm`` with batched operands)::

        y = beta * input + alpha * (mat1 @ mat2)

    ``input`` broadcasts to the product's shape. As in torch, beta = 0 ignores ``input``
    (NaN and inf in it do not leak through 0 * input), and alpha = 0 the product.
    """
    product = np.matmul(mat1, mat2)                          # (..., n, p)
    y = product * alpha if alpha else np.zeros_like(product)
    if beta:
        y += input * beta                                    # broadcast over (..., n, p)
    return y


def vector_norm(x: np.ndarray, p: float, axis, keepdims: bool = False) -> np.ndarray:
    """``torch.linalg.vector_norm``: the p-norm of x over ``axis`` (an int, a tuple, or None
    for every dim), in x's dtype::

        p = 2:   sqrt(sum |x|^2)      p = inf:   max |x| (0 over nothing)
        p = 1:   sum |x|              p = -inf:  min |x|
        p = 0:   count of x != 0      other p:   (sum |x|^p)^(1/p)
    """
    magnitude = np.abs(x)
    if p == np.inf:
        return np.max(magnitude, axis=axis, keepdims=keepdims, initial=0)
    if p == -np.inf:
        return np.min(magnitude, axis=axis, keepdims=keepdims)
    if p == 0:
        return np.sum(x != 0, axis=axis, keepdims=keepdims).astype(x.dtype)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if p == 2:
            return np.sqrt(np.sum(magnitude * magnitude, axis=axis, keepdims=keepdims))
        if p == 1:
            return np.sum(magnitude, axis=axis, keepdims=keepdims)
        total = np.sum(magnitude ** x.dtype.type(p), axis=axis, keepdims=keepdims)
        return total ** x.dtype.type(1.0 / p)


def softmax(x: np.ndarray, dim: int) -> np.ndarray:
    """``F.softmax``: exp(x) / sum(exp(x)) along ``dim``. Subtracting the max first changes
    nothing mathematically and keeps every exponent <= 0, so exp never overflows."""
    y = x - x.max(axis=dim, keepdims=True)
    np.exp(y, out=y)
    y /= y.sum(axis=dim, keepdims=True)
    return y


def batch_norm_scale_shift(running_mean: np.ndarray, running_var: np.ndarray,
                           weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                           eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Eval-mode batch norm folded into one multiply-add per channel::

        (x - mean) / sqrt(var + eps) * weight + bias  ==  x * scale + shift
        scale = weight / sqrt(var + eps),   shift = bias - mean * scale
    """
    scale = 1.0 / np.sqrt(running_var.astype(np.float32) + np.float32(eps))
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    return scale.astype(np.float32), shift.astype(np.float32)


def channel_affine(x: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """x * scale[c] + shift[c] for channel dim 1 of an (N, C, ...) input."""
    per_channel = (-1,) + (1,) * (x.ndim - 2)                # (C, 1, 1) for NCHW
    y = x * scale.reshape(per_channel)
    y += shift.reshape(per_channel)
    return y


def batch_norm(x: np.ndarray, running_mean: np.ndarray, running_var: np.ndarray,
               weight: np.ndarray | None = None, bias: np.ndarray | None = None,
               eps: float = 1e-5) -> np.ndarray:
    """``F.batch_norm`` in eval mode (running statistics) over channel dim 1."""
    return channel_affine(x, *batch_norm_scale_shift(running_mean, running_var, weight, bias,
                                                     eps))
