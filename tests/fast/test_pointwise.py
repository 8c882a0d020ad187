"""The 1x1 convolution kernels against torch and numpy: pointwise.py's register tiles
(channels by pixels) and pointwise_transposed.py's (pixels by channels, for small images),
each on every case: tile edges in both directions, bands of pixels, the widening layers that
pack x in strips, the narrowing ones that read it in place (rows of whole cache lines) or pack
it too (rows not whole lines, or in too few sets of the caches), slices of a long sum, every
activation, a residual, Inf and NaN; the same bits on any number of threads, and from either
kernel (but where the upright one sums a narrow tail as dot products: ``dot_tail``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from layers.fast import backend, pointwise, pointwise_transposed, winograd, winograd_f2
from layers.fast.conv import PackedConv2d
from layers.fast.epilogue import (CLAMP, GELU, HARDSIGMOID, HARDSWISH, LEAKY, NONE, RELU,
                                  SIGMOID, SILU, TANH, Activation)
from layers.fast.simd import COLUMNS, LANES, ROWS
from layers.fast.team import set_current_team

CASES = {                                     # N, C_in, C_out, H, W
    "widening, two bands of pixels": (1, 8, 30, 100, 100),
    "widening, EfficientNet's 7x7": (1, 192, 1152, 7, 7),
    "narrowing, x read in place": (2, 48, 20, 8, 8),
    "narrowing in place, a last tile of 16": (1, 40, 10, 4, 12),
    "narrowing, x packed (rows not whole lines)": (2, 48, 20, 9, 11),
    "narrowing, x packed (rows 64 KiB apart)": (1, 40, 20, 128, 128),
    "narrowing on one block of channels, in place": (1, 30, ROWS - 1, 5, 9),
    "widening, two images in bands": (2, 24, 40, 50, 70),
    "narrowing, EfficientNet's 14x14": (1, 672, 112, 14, 14),
    "13 channels by 17 pixels": (1, 5, 13, 1, 17),
    "one pixel": (3, 7, 9, 1, 1),
    "one channel in": (1, 1, 12, 6, 6),
    "one channel out": (2, 16, 1, 5, 7),
    "a whole tile": (1, 4, ROWS, 1, COLUMNS),
    "a last strip of one vector": (2, 20, 14, 1, COLUMNS + LANES),
    "widening, a tail of one vector": (1, 10, 20, 1, COLUMNS + LANES),
    "a tail of three pixels, slices of K": (1, pointwise.K_BLOCK + 37, 20, 1, 2 * COLUMNS + 3),
    "narrowing, three slices of K": (1, 2 * pointwise.K_BLOCK + 88, 40, 7, 7),
    "widening, two slices of K": (2, pointwise.K_BLOCK + 1, 270, 5, 5),
    "two bands of pixels transposed": (2, 24, 40, 1, pointwise_transposed.BAND + 7),
    "5x5: tiles of ROWS - 1 pixels only": (1, 24, 40, 5, 5),
    "7x7, two images, x copied": (2, 40, 36, 7, 7),
    "7x7, x too large to copy": (1, pointwise_transposed.COPY_MOST // 64 + 5, 20, 7, 7),
}
LAYOUTS = {"upright": "gemm", "transposed": "pointwise_transposed"}    # PackedConv2d's names
ACTIVATIONS = {                               # the kernel's, and torch's
    "none": (Activation(NONE), lambda t: t),
    "relu": (Activation(RELU), F.relu),
    "relu6": (Activation(CLAMP, 0.0, 6.0), F.relu6),
    "hardtanh": (Activation(CLAMP, -0.5, 2.0), lambda t: F.hardtanh(t, -0.5, 2.0)),
    "leaky": (Activation(LEAKY, 0.1), lambda t: F.leaky_relu(t, 0.1)),
    "sigmoid": (Activation(SIGMOID), torch.sigmoid),
    "silu": (Activation(SILU), F.silu),
    "hardswish": (Activation(HARDSWISH), F.hardswish),
    "tanh": (Activation(TANH), torch.tanh),
    "hardsigmoid": (Activation(HARDSIGMOID), F.hardsigmoid),
    "gelu": (Activation(GELU), F.gelu),
}


def dot_tail(c_in: int, c_out: int, length: int) -> np.ndarray:
    """Which of ``length`` pixels the upright kernel sums as dot products (pointwise.tail_dots:
    the last strip of a band, if it has at most LANES pixels and x is packed in strips)."""
    bands, packs = pointwise.band_plan(c_in, c_out, 1, length, False, False)
    per_band = -(-length // bands)          # any whole strips: only the last can be partial
    width = -(-per_band // COLUMNS) * COLUMNS
    tail = np.zeros(length, bool)
    for start in range(0, length, width):
        stop = min(length, start + width)
        last = start + (stop - start - 1) // COLUMNS * COLUMNS
        tail[last:stop] = packs and stop - last <= LANES
    return tail


def assert_layouts_agree(transposed: np.ndarray, upright: np.ndarray, weight: np.ndarray,
                         x: np.ndarray) -> None:
    """The transposed kernel's result (N, C_out, L) against the upright one's, both of
    weight (C_out, C_in) @ x (N, C_in, L) and an epilogue: the same bits, but where the
    upright kernel sums a narrow tail as dot products (``dot_tail``), whose sums round
    otherwise. There, where both are finite, they must agree within float32's rounding of
    the two sums, 2 C_in eps sum_k |w x|, and a few ulps of the results (the epilogue's
    own roundings, and activations whose slope passes 1); elsewhere, the same Inf or NaN."""
    c_out, c_in = weight.shape
    tail = dot_tail(c_in, c_out, upright.shape[2])
    np.testing.assert_array_equal(transposed[..., ~tail].view(np.int32),
                                  upright[..., ~tail].view(np.int32))
    got, want = transposed[..., tail].astype(np.float64), upright[..., tail].astype(np.float64)
    eps = np.finfo(np.float32).eps
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(weight.astype(np.float64)) @ np.abs(x[..., tail].astype(np.float64))
        bound = 2 * c_in * eps * magnitude + 4 * eps * np.maximum(np.abs(got), np.abs(want))
        finite = np.isfinite(got) & np.isfinite(want) & np.isfinite(bound)
        close = np.where(finite, np.abs(got - want) <= bound,
                         (got == want) | (np.isnan(got) & np.isnan(want)))
    assert close.all(), (got[~close], want[~close])


def data(case, seed=0):
    n, c_in, c_out, h, w = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c_in, h, w), dtype=np.float32)
    weight = rng.standard_normal((c_out, c_in, 1, 1), dtype=np.float32) / np.float32(
        max(c_in, 1) ** 0.5)
    bias = rng.standard_normal(c_out, dtype=np.float32)
    residual = rng.standard_normal((n, c_out, h, w), dtype=np.float32)
    return x, weight, bias, residual


def convolve(x, weight, bias, activation, residual, layout):
    """Through the runtime's convolution, made to run the kernel of ``layout``."""
    packed = PackedConv2d(weight, bias, (1, 1), (1, 1), 1)
    packed.algorithm = lambda batch, out_hw: LAYOUTS[layout]
    return packed.run(x, (0, 0, 0, 0), x.shape[2:], activation, residual)


def torch_says(x, weight, bias, function, residual, dtype=torch.float32):
    """torch's convolution, residual and activation, in ``dtype`` (float64: the exact answer
    to float32's rounding), as float32."""
    t = F.conv2d(torch.from_numpy(x).to(dtype), torch.from_numpy(weight).to(dtype),
                 None if bias is None else torch.from_numpy(bias).to(dtype))
    if residual is not None:
        t = t + torch.from_numpy(residual).to(dtype)
    return function(t).to(torch.float32).numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("extras", ["plain", "bias", "bias residual"])
def test_matches_torch_and_numpy(case, extras, layout):
    x, weight, bias, residual = data(case)
    bias = bias if "bias" in extras else None
    residual = residual if "residual" in extras else None
    got = convolve(x, weight, bias, Activation(NONE), residual, layout)
    want = torch_says(x, weight, bias, lambda t: t, residual)
    numpy = np.matmul(weight[:, :, 0, 0], x.reshape(x.shape[0], x.shape[1], -1)).reshape(
        want.shape) + (0 if bias is None else bias[:, None, None]) + (
        0 if residual is None else residual)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(got, numpy, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("case", ["widening, two bands of pixels", "narrowing, x read in place",
                                  "13 channels by 17 pixels", "widening, two slices of K"])
def test_every_activation_after_bias_and_residual(case, name, layout):
    """Against torch in float64 (the exact values to float32's rounding): torch's float32
    tanh on a worker thread was once seen 4e-5 off in a parallel test run, ours exact."""
    x, weight, bias, residual = data(case, seed=1)
    ours, theirs = ACTIVATIONS[name]
    got = convolve(x * 3, weight, bias, ours, residual, layout)
    want = torch_says(x * 3, weight, bias, theirs, residual, torch.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
@pytest.mark.parametrize("case", ["13 channels by 17 pixels", "two bands of pixels transposed",
                                  "narrowing, EfficientNet's 14x14", "one channel out",
                                  "narrowing, three slices of K"])
def test_both_layouts_give_the_same_bits_and_write_only_y(case, residual, name):
    """The transposed kernel moves its bands into y by LANES x LANES blocks (partial ones at
    the edges) and finishes each row there: the upright kernel's bits, for every activation,
    and not a value written outside y (here a view between two guard zones)."""
    x, weight, bias, r = data(case, seed=4)
    x[0, 0, 0, :2] = np.nan, -np.inf                        # and -0.0 from the products
    x[-1, 0, -1, -1] = np.inf                               # in a tail, as often as not
    activation = ACTIVATIONS[name][0]
    residual_or_none = r if residual else None
    with np.errstate(invalid="ignore", over="ignore"):
        upright = convolve(x * 3, weight, bias, activation, residual_or_none, "upright")
        packed = PackedConv2d(weight, bias, (1, 1), (1, 1), 1)
        packed.algorithm = lambda batch, out_hw: "pointwise_transposed"
        guarded = np.full(upright.size + 2 * 64, 7.5, np.float32)
        y = guarded[64:-64].reshape(upright.shape)
        packed.run(x * 3, (0, 0, 0, 0), x.shape[2:], activation, residual_or_none, y)
    n, c_out, c_in = upright.shape[0], upright.shape[1], x.shape[1]
    assert_layouts_agree(y.reshape(n, c_out, -1), upright.reshape(n, c_out, -1),
                         weight.reshape(c_out, c_in), (x * 3).reshape(n, c_in, -1))
    assert (guarded[:64] == 7.5).all() and (guarded[-64:] == 7.5).all()


def test_a_sum_that_ends_in_minus_zero_gives_the_same_bits_from_either_kernel():
    """Tiny negative products round to -0.0 (a fused multiply-add keeps the sign of the exact
    result), so a chain can end in -0.0; both kernels add it to +0.0 as every sum of chains
    is added, so with a bias of -0.0 both give +0.0."""
    x = np.full((1, 4, 4, 8), 2.0 ** -60, np.float32)
    weight = np.full((7, 4, 1, 1), -(2.0 ** -100), np.float32)
    bias = np.full(7, -0.0, np.float32)
    upright = convolve(x, weight, bias, Activation(NONE), None, "upright")
    transposed = convolve(x, weight, bias, Activation(NONE), None, "transposed")
    np.testing.assert_array_equal(upright.view(np.int32), transposed.view(np.int32))
    assert (upright == 0).all() and not np.signbit(upright).any()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["widening, two bands of pixels", "narrowing, x read in place",
                                  "narrowing, x packed (rows not whole lines)"])
@pytest.mark.parametrize("name", ["none", "relu", "relu6"])
def test_inf_and_nan_reach_the_outputs_they_reach_in_torch(case, name, layout):
    """Every output channel of a pixel reads every input channel of it: a NaN or an Inf
    there spreads to that pixel only, and the clamps keep a NaN a NaN (as torch does)."""
    x, weight, bias, _ = data(case, seed=2)
    x[0, 0, 0, 3], x[0, -1, -1, -1], x[-1, 1, 1, 0] = np.nan, np.inf, -np.inf
    ours, theirs = ACTIVATIONS[name]
    with np.errstate(invalid="ignore"):
        got = convolve(x, weight, bias, ours, None, layout)
    want = torch_says(x, weight, bias, theirs, None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)      # Infs and their signs


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_input_channels_give_the_bias(layout):
    x = np.zeros((2, 0, 3, 4), np.float32)
    weight, bias = np.zeros((5, 0, 1, 1), np.float32), np.arange(5, dtype=np.float32)
    got = convolve(x, weight, bias, Activation(CLAMP, 0.0, 3.0), None, layout)
    np.testing.assert_array_equal(got, np.broadcast_to(np.clip(bias, 0, 3)[None, :, None, None],
                                                       (2, 5, 3, 4)))


@pytest.mark.parametrize("activation", [Activation(CLAMP, 0.0, 6.0), Activation(SILU)],
                         ids=["relu6", "silu"])
@pytest.mark.parametrize("case", CASES)
def test_any_number_of_threads_gives_the_same_bits(case, activation, team):
    """Each output is the same chain of multiply-adds whichever thread computes its tile, and
    is activated once (a clamp in the tile, SiLU over the block's rows)."""
    x, weight, bias, residual = data(case, seed=3)
    n, c_in = x.shape[:2]
    x3, w2 = x.reshape(n, c_in, -1), np.ascontiguousarray(weight[:, :, 0, 0])
    r3 = residual.reshape(n, weight.shape[0], -1)
    alone = np.full_like(r3, np.nan)
    pointwise._pointwise(w2[None], x3, bias, r3, alone, np.empty(pointwise.space_size(c_in),
                         np.float32), pointwise.NO_GEOMETRY, activation.code, activation.a,
                         activation.b)
    together = np.full_like(r3, np.nan)
    space = np.empty((team.threads, pointwise.space_size(c_in)), np.float32)
    before = team.control[0]
    team.pointwise(w2[None], x3, bias, r3, together, space, pointwise.NO_GEOMETRY, activation)
    assert team.control[0] != before                       # it ran as a job
    np.testing.assert_array_equal(together, alone)
    panels = pointwise_transposed.pack_panels(w2)           # and transposed: the same bits
    transposed = np.full_like(r3, np.nan)
    space = np.empty((team.threads, pointwise_transposed.space_size(c_in, x3.shape[2])), np.float32)
    team.pointwise_transposed(panels, x3, bias, r3, transposed, space, activation)
    assert_layouts_agree(transposed, alone, w2, x3)


def transposed_calls_on_new_x(run, threads):
    """Call the transposed kernel (``run(panels, x, bias, y, space)``) three times with the
    same work space on a new x (one 7x7 image, which it copies) each time: each result must
    be that x's, not one from the copy the work space still holds of the x before (the
    first unit of each call is image 0 again, which the copy's header also names)."""
    c_in, c_out, length = 64, 96, 49
    assert pointwise_transposed.space_size(c_in, length) > pointwise_transposed.space_size(
        c_in, pointwise_transposed.COPY_BELOW)                # x is copied at this size
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((c_out, c_in), dtype=np.float32)
    panels, bias = pointwise_transposed.pack_panels(weight), np.zeros(c_out, np.float32)
    space = np.empty((threads, pointwise_transposed.space_size(c_in, length)), np.float32)
    for _ in range(3):
        x = rng.standard_normal((1, c_in, length), dtype=np.float32)
        y = np.full((1, c_out, length), np.nan, np.float32)
        run(panels, x, bias, y, space)
        assert space[0, 0] == 1.0                  # the calling thread's copy: image 0's
        np.testing.assert_allclose(y, weight @ x, rtol=1e-5, atol=1e-4)


def test_the_transposed_kernel_copies_each_x_afresh():
    transposed_calls_on_new_x(
        lambda panels, x, bias, y, space: pointwise_transposed._pointwise_transposed(
            panels, x, bias, pointwise.NO_RESIDUAL, y, space[0], NONE, 0.0, 0.0), 1)


def test_each_thread_of_a_shared_transposed_job_copies_each_x_afresh(team):
    transposed_calls_on_new_x(
        lambda panels, x, bias, y, space: team.pointwise_transposed(
            panels, x, bias, pointwise.NO_RESIDUAL, y, space, Activation(NONE)), team.threads)


CONVOLUTIONS = {   # (N, C_in, H, W), C_out, kernel, stride, (top, bottom, left, right), dilation
    "the stem: 7x7 stride 2, many bands": ((1, 3, 64, 60), 16, (7, 7), (2, 2), (3, 3, 3, 3),
                                           (1, 1)),
    "3x3 stride 2, two images": ((2, 8, 12, 11), 20, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "slices of K": ((1, 70, 9, 8), 12, (2, 2), (1, 1), (0, 1, 1, 0), (1, 1)),
    "dilated, stride (2, 3)": ((1, 4, 15, 16), 7, (3, 3), (2, 3), (2, 2, 2, 2), (2, 2)),
    "a window wider than the image": ((1, 2, 3, 2), 5, (3, 5), (1, 1), (1, 1, 4, 3), (1, 1)),
    "7x7 stride 2 unpadded, bands start mid-row": ((1, 3, 130, 130), 8, (7, 7), (2, 2),
                                                   (0, 0, 0, 0), (1, 1)),
    "2x2 unpadded, slices of K": ((1, 70, 9, 10), 12, (2, 2), (1, 1), (0, 0, 0, 0), (1, 1)),
}


@pytest.mark.parametrize("case", CONVOLUTIONS.values(), ids=CONVOLUTIONS.keys())
def test_cols_made_band_by_band_are_im2cols(case, team, monkeypatch):
    """The product that makes cols band by band (pointwise.cols_band), alone and shared, gives
    the bits of the transposed product on im2col's cols (the same sums: see the module
    docstrings), and Inf and NaN reach only the windows that hold them."""
    from layers.fast import gemm
    from layers.fast.gemm import gemm_conv2d, gemm_transposed_conv2d, pack_gemm_weight

    monkeypatch.setattr(gemm, "BANDS_FROM", 0)                # small cols too
    monkeypatch.setattr(gemm, "BANDS_MIN_PIXELS", 0)

    shape, c_out, kernel, stride, pads, dilation = case
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape, dtype=np.float32)
    x[0, 0, 1, 0], x[-1, -1, -1, -1] = np.inf, np.nan
    weight = rng.standard_normal((c_out, shape[1], *kernel), dtype=np.float32)
    bias = rng.standard_normal(c_out, dtype=np.float32)
    want = F.conv2d(F.pad(torch.from_numpy(x), (pads[2], pads[3], pads[0], pads[1])),
                    torch.from_numpy(weight), torch.from_numpy(bias), stride, 0,
                    dilation).numpy()
    relu = Activation(RELU)
    alone = gemm_conv2d(x, pack_gemm_weight(weight, 1), bias, kernel, stride, pads, dilation,
                        want.shape[2:], relu)
    set_current_team(team)
    try:
        before = team.control[0] >> 40                        # the number of the last job
        together = gemm_conv2d(x, pack_gemm_weight(weight, 1), bias, kernel, stride, pads,
                               dilation, want.shape[2:], relu)
        jobs = (team.control[0] >> 40) - before
    finally:
        set_current_team(None)
    macs = want.shape[0] * want.shape[2] * want.shape[3] * weight[0].size * c_out
    _, size = gemm._geometry(kernel, stride, dilation, pads[0], pads[2], shape[2:],
                             want.shape[2:])
    splits = shape[0] * shape[1] * size >= gemm.IM2COL_SHARED_FROM
    assert jobs == splits + (macs >= pointwise.SHARED_FROM)   # each shared when worth it
    transposed = np.empty_like(want)
    gemm_transposed_conv2d(x, pointwise_transposed.pack_panels(weight.reshape(c_out, -1)),
                           bias, kernel, stride, pads, dilation, relu, None, transposed)
    np.testing.assert_array_equal(alone, transposed)
    np.testing.assert_array_equal(together, transposed)
    want = np.maximum(want, 0, where=~np.isnan(want), out=want.copy())
    np.testing.assert_array_equal(np.isnan(alone), np.isnan(want))
    np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("turned", [False, True], ids=["upright", "transposed"])
def test_small_cols_of_a_batch_go_several_images_at_once_with_the_same_bits(monkeypatch,
                                                                         turned):
    """The cols of at most gemm.BATCHED_COLS_MOST values at a time: a batch whose small cols
    pass that goes in parts (here two images, then one), each with its residual and its
    rows of y, with the bits of one image at a time; the upright product and the transposed
    one (gemm_transposed_conv2d) alike."""
    from layers.fast import gemm, pointwise_transposed

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8, 12, 10), dtype=np.float32)
    weight = rng.standard_normal((40, 8, 1, 1), dtype=np.float32)
    residual = rng.standard_normal((3, 40, 6, 5), dtype=np.float32)
    relu, rows, length = Activation(RELU), 8, 30

    def convolve():
        if turned:
            y = np.empty((3, 40, 6, 5), np.float32)
            panels = pointwise_transposed.pack_panels(weight.reshape(40, 8))
            gemm.gemm_transposed_conv2d(x, panels, None, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1),
                                        relu, residual, y)
            return y
        return gemm.gemm_conv2d(x, gemm.pack_gemm_weight(weight, 1), None, (1, 1), (2, 2),
                                (0, 0, 0, 0), (1, 1), (6, 5), relu, residual)
    batches = []
    cols_in_batches = gemm._cols_in_batches
    monkeypatch.setattr(gemm, "_cols_in_batches", lambda *args: (
        (batches.append(j - i), (i, j, cols))[1] for i, j, cols in cols_in_batches(*args)))
    monkeypatch.setattr(gemm, "BATCHED_COLS_MOST", rows * length)         # one image
    alone = convolve()
    assert batches == [1, 1, 1]
    batches.clear()
    monkeypatch.setattr(gemm, "BATCHED_COLS_MOST", 2 * rows * length)     # two images
    np.testing.assert_array_equal(convolve(), alone)
    assert batches == [2, 1]
    want = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), None, 2)
                  + torch.from_numpy(residual)).numpy()
    np.testing.assert_allclose(alone, want, rtol=1e-5, atol=1e-5)


def test_a_large_batch_goes_in_parts_with_the_same_bits(monkeypatch):
    """Phases of at most gemm.PHASES_MOST floats at a time: a batch whose phases pass that
    goes in parts of fewer images (here one, then two at a time), each with its residual."""
    from layers.fast import gemm

    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 11, 10), dtype=np.float32)
    weight = rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    residual = rng.standard_normal((3, 6, 6, 5), dtype=np.float32)
    packed, relu = gemm.pack_gemm_weight(weight, 1), Activation(RELU)

    def convolve():
        return gemm.gemm_conv2d(x, packed, None, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (6, 5),
                                relu, residual)
    monkeypatch.setattr(gemm, "BANDS_FROM", 0)                # small cols too
    monkeypatch.setattr(gemm, "BANDS_MIN_PIXELS", 0)
    whole = convolve()
    _, size = gemm._geometry((3, 3), (2, 2), (1, 1), 1, 1, (11, 10), (6, 5))
    split = gemm._split_planes
    for images, parts in ((1, [1, 1, 1]), (2, [2, 1])):
        made = []
        monkeypatch.setattr(gemm, "PHASES_MOST", images * 4 * size)
        monkeypatch.setattr(gemm, "_split_planes", lambda x, *rest, made=made: (
            made.append(x.shape[0]), split(x, *rest)))
        np.testing.assert_array_equal(convolve(), whole)
        assert made == parts                                  # images split at a time
    want = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), None, 2, 1)
                  + torch.from_numpy(residual)).numpy()
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5)


def test_a_grouped_convolution_takes_its_batch_in_parts_with_the_same_bits(monkeypatch):
    """A grouped 3x3's cols come a few images at a time too (BATCHED_COLS_MOST; here one,
    then two): a product per group of each image, the epilogue over the images made
    together; the bits of the whole batch at once, and torch's values."""
    from layers.fast import gemm

    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 4, 9, 8), dtype=np.float32)
    weight = rng.standard_normal((6, 2, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(6, dtype=np.float32)
    residual = rng.standard_normal((3, 6, 9, 8), dtype=np.float32)
    packed, relu = gemm.pack_gemm_weight(weight, 2), Activation(RELU)

    def convolve():
        return gemm.gemm_conv2d(x, packed, bias, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (9, 8),
                                relu, residual)
    whole = convolve()
    for images in (1, 2):
        monkeypatch.setattr(gemm, "BATCHED_COLS_MOST", images * 4 * 9 * 9 * 8)
        np.testing.assert_array_equal(convolve(), whole)
    want = F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(weight),
                           torch.from_numpy(bias), 1, 1, 1, 2)
                  + torch.from_numpy(residual)).numpy()
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c_in, c_out, length, cols, packed", [
    (32, 16, 4096, False, False), (33, 16, 4096, False, True),      # 64x64: 4 sets x 8 ways
    (128, 16, 1024, False, False), (129, 16, 1024, False, True),    # 32x32
    (144, 24, 3136, False, False),                                  # 56x56: never
    (9, ROWS, 16384, False, False), (9, ROWS + 1, 16384, False, True),   # 128x128
    (48, ROWS + 1, 49, False, True), (48, ROWS, 49, False, False),  # rows not whole lines
    (8, 30, 100, False, True), (300, 2, 49, True, True)])           # widening; cols
def test_x_is_packed_where_its_rows_would_evict_each_other(c_in, c_out, length, cols, packed):
    """packs_x: narrowing products read x in place unless more than one block of channels
    reads rows that are not whole lines, or rows that start in too few cache sets for a
    strip's min(C_in, K_BLOCK) lines (CACHE_WAYS each); cols and widening products always
    pack."""
    assert pointwise.packs_x(c_in, c_out, length, cols) == packed


def test_bands_fit_the_work_space():
    """A chunk packs one band of x (C_in rows of block_width pixels, at most K_BLOCK rows at
    a time) into its thread's row of work space: space_size must hold it for any size."""
    backend.start()
    for c_in in (1, 3, 16, 17, 100, 2047, 2048, 5000):
        for least in (1, 2, pointwise.NARROWING_BANDS):
            for length in (1, 31, 32, 33, 49, 196, 3136, 12544, 100_000):
                width = pointwise.block_width(c_in, length, least)
                assert width % COLUMNS == 0 and width >= min(length, COLUMNS)
                assert (pointwise.HEADER + min(c_in, pointwise.K_BLOCK) * width
                        <= pointwise.space_size(c_in))


@pytest.mark.parametrize("c_in, c_out, cols", [(192, 1152, False), (20, 14, False),
                                                (3, 16, True),
                                                (pointwise.K_BLOCK + 37, 300, False)],
                         ids=["EfficientNet's 7x7 widening", "narrowing, packed", "cols",
                              "two slices of K"])
def test_a_band_is_packed_with_zeros_past_its_last_pixel(c_in, c_out, cols):
    """The lanes past a band's last pixel in the work space are summed and never stored:
    they are zeroed, not left as the space held them (a subnormal there would make every
    multiply-add that reads it a slow microcode assist: here NaN stands for it). The space
    holds the last band at the end (of the last slice of the sum: over the first slice's
    rows): its last strip's LANES + 1 pixels, then zeros."""
    backend.start()
    length = COLUMNS + LANES + 1               # a last strip of LANES + 1 pixels, as a strip
    rng = np.random.default_rng(2)
    y = np.empty((1, c_out, length), np.float32)
    space = np.full(pointwise.space_size(c_in * (9 if cols else 1)), np.nan, np.float32)
    if cols:                                   # a 3x3 convolution of a 1 x length image
        from layers.fast import gemm

        geometry, size = gemm._geometry((3, 3), (1, 1), (1, 1), 1, 1, (1, length),
                                        (1, length))
        x = np.empty((1, c_in, size), np.float32)
        gemm._split_planes(rng.standard_normal((1, c_in, length), dtype=np.float32), x,
                           geometry)
        c_in *= 9                              # the rows of its cols
    else:
        x, geometry = rng.standard_normal((1, c_in, length), dtype=np.float32), \
            pointwise.NO_GEOMETRY
    assert pointwise.packs_x(c_in, c_out, length, cols)
    width = pointwise.block_width(c_in, length, pointwise.least_bands(
        c_in, c_out, 1, length, cols, False))
    assert width % COLUMNS == 0
    weight = rng.standard_normal((1, c_out, c_in), dtype=np.float32)
    pointwise._pointwise(weight, x, np.zeros(c_out, np.float32), pointwise.NO_RESIDUAL, y,
                         space, geometry, NONE, 0.0, 0.0)
    band = space[pointwise.HEADER:pointwise.HEADER + min(c_in, pointwise.K_BLOCK) * width]
    assert np.isfinite(band).all()
    last_rows = c_in - (c_in - 1) // pointwise.K_BLOCK * pointwise.K_BLOCK
    assert ((band.reshape(-1, COLUMNS)[:, LANES + 1:] == 0).sum()
            >= last_rows * (COLUMNS - LANES - 1))
    if not cols:
        np.testing.assert_allclose(y[0], weight[0] @ x[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("images, c_in, c_out, length", [(16, 40, 13, 16), (3, 300, 7, 49),
                                                         (2, 5, 30, 1)])
def test_a_matrix_per_image(images, c_in, c_out, length):
    """A stack of weights (Winograd's products), in panels: y[n] = weight[n] @ x[n], against
    numpy."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((images, c_out, c_in)).astype(np.float32)
    x = rng.standard_normal((images, c_in, length)).astype(np.float32)
    y = np.full((images, c_out, length), np.nan, np.float32)
    pointwise.pointwise_conv2d(pointwise.pack_stack(weight), x, None, None, Activation(NONE), y)
    expected = np.einsum("noc,ncl->nol", weight.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.sqrt(c_in))


@pytest.mark.parametrize("c_out, c_in", [(1, 1), (5, 3), (6, 7), (13, 4), (64, 65), (0, 3),
                                         (4, 0)])
def test_pack_stack_puts_each_panel_k_major(c_out, c_in):
    """pack_stack's layout, entry by entry: output channel o = c0 + r of the panel starting at
    c0 (ROWS channels, the last one fewer) and column k sit at c0 * C_in + k * rows + r."""
    weight = np.arange(2 * c_out * c_in, dtype=np.float32).reshape(2, c_out, c_in)
    flat = pointwise.pack_stack(weight).reshape(2, -1)
    for o in range(c_out):
        c0 = o - o % ROWS
        rows = min(ROWS, c_out - c0)
        for k in range(c_in):
            assert (flat[:, c0 * c_in + k * rows + o - c0] == weight[:, o, k]).all()


@pytest.mark.parametrize("module", [winograd, winograd_f2])
@pytest.mark.parametrize("c_out, c_in", [(7, 3), (64, 64), (130, 17)])
def test_the_filter_transform_gives_its_stack_in_panels(module, c_out, c_in):
    """transform_filters (the product run on filters in panel order) = pack_stack of
    G g G^T computed in float64, to float32's rounding."""
    weight = np.random.default_rng(6).standard_normal((c_out, c_in, 3, 3)).astype(np.float32)
    gg_t = module.GG_T_32.astype(np.float64)                       # (9, taps)
    exact = np.einsum("kt,ock->toc", gg_t, weight.reshape(c_out, c_in, 9).astype(np.float64))
    got = module.transform_filters(weight, module.GG_T_32)
    assert got.shape == exact.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, pointwise.pack_stack(exact.astype(np.float32)),
                               rtol=1e-6, atol=1e-6 * np.abs(exact).max())


@pytest.mark.parametrize("module", [winograd, winograd_f2])
@pytest.mark.parametrize("c_out, c_in", [(97, 1), (100, 9), (50, 48), (40, 512), (31, 100)])
def test_a_filter_transform_made_in_parts_has_the_bits_of_one(monkeypatch, module, c_out,
                                                              c_in):
    """transform_filters made a few output channels at a time (TRANSFORM_PART of one byte:
    the fewest channels a part may hold) gives the bits it gives in one product."""
    weight = np.random.default_rng(7).standard_normal((c_out, c_in, 3, 3)).astype(np.float32)
    whole = module.transform_filters(weight, module.GG_T_32)
    monkeypatch.setattr(winograd, "TRANSFORM_WHOLE_MOST", 0)
    monkeypatch.setattr(winograd, "TRANSFORM_PART", 1)
    np.testing.assert_array_equal(module.transform_filters(weight, module.GG_T_32), whole)


def test_small_images_run_transposed():
    """Transposed where it fills more of the tiles' lanes: 7 x 7 images (49 pixels in 6-pixel
    tiles, not 16-pixel ones) with input channels enough to pay for the transposed epilogue;
    not large images, whose pixels fill both, even where the channels would fill more (16 of
    them: 16-channel tiles against 18 rows)."""
    def chosen(c_in, c_out, size):
        weight = np.zeros((c_out, c_in, 1, 1), np.float32)
        return PackedConv2d(weight, None, (1, 1), (1, 1), 1).algorithm(1, (size, size))
    assert chosen(1152, 192, 7) == chosen(320, 1280, 7) == "pointwise_transposed"
    assert chosen(8, 192, 7) == chosen(80, 480, 14) == "gemm"        # too few input channels
    assert chosen(512, 24, 56) == chosen(512, 96, 112) == chosen(512, 16, 112) == "gemm"
    weight = np.zeros((16, 8, 3, 3), np.float32)       # only 1x1, stride 1, one group
    assert PackedConv2d(weight, None, (1, 1), (1, 1), 1).algorithm(1, (7, 7)) != (
        "pointwise_transposed")


def test_panels_hold_the_weight_transposed_and_padded():
    weight = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    panels = pointwise_transposed.pack_panels(weight)
    assert panels.shape == (1, 3, COLUMNS) and panels.flags.c_contiguous
    np.testing.assert_array_equal(panels[0, :, :5], weight.T)
    assert not panels[0, :, 5:].any()


@pytest.mark.parametrize("c_out, c_in", [(5, 3), (64, 7), (100, 576)])
def test_panels_start_on_a_vector_boundary(c_out, c_in):
    """Each k's COLUMNS weights are whole vectors, each in one cache line (a load across two
    costs about twice as much)."""
    for _ in range(4):                           # (np.empty's addresses vary)
        panels = pointwise_transposed.pack_panels(np.ones((c_out, c_in), np.float32))
        assert panels.ctypes.data % (LANES * 4) == 0 and panels.flags.c_contiguous


def test_a_padded_1x1_runs_through_im2col():
    """A 1x1 convolution with padding (zeros around the image) is not a plain product."""
    x, weight, bias, _ = data("widening, EfficientNet's 7x7")
    packed = PackedConv2d(weight, bias, (1, 1), (1, 1), 1)
    got = packed.run(x, (1, 1, 1, 1), (9, 9), Activation(NONE))
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                    padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
