"""Global average pooling on the fast floor (pool.global_average_pool) against torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from layers.fast import pool
from layers.fast.layers import FastAdaptiveAvgPool2d
from layers.pooling import AdaptiveAvgPool2d
from layers.registry import LayerRegisterer
from parser.errors import ShapeError

SHAPES = {                                        # N, C, H, W
    "a classifier's head": (1, 1280, 7, 7),
    "a batch": (8, 512, 7, 7),
    "one pixel": (2, 3, 1, 1),
    "a large plane, odd sizes": (1, 5, 67, 65),
    "one row": (3, 4, 1, 33),
}


def layer(output_size):
    return FastAdaptiveAvgPool2d(output_size=output_size)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_matches_torch(shape):
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32) * 3 + 1
    want = F.adaptive_avg_pool2d(torch.from_numpy(x), 1).numpy()
    got = layer(1).forward([x])[0]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_within_torchs_own_error_against_float64():
    """Means of many large values, and of large planes of one sign (where a float32 sum
    drifts): as close to the exact mean as torch's own float32 kernel, or a few units of
    float32's last place."""
    rng = np.random.default_rng(1)
    for x in (rng.uniform(0, 1000, (2, 64, 56, 56)).astype(np.float32),
              rng.uniform(0, 1, (1, 2, 1024, 1024)).astype(np.float32),
              np.full((1, 1, 2048, 2048), 0.1, np.float32)):
        exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
        ours = np.abs(layer(1).forward([x])[0] - exact).max()
        theirs = np.abs(F.adaptive_avg_pool2d(torch.from_numpy(x), 1).numpy() - exact).max()
        assert ours <= max(4 * theirs, 4 * np.spacing(np.float32(exact.max())))


def test_a_non_contiguous_input_and_other_output_sizes():
    x = np.random.default_rng(2).standard_normal((2, 6, 9, 10), dtype=np.float32)
    view = x.transpose(0, 1, 3, 2)                           # (2, 6, 10, 9), strided
    np.testing.assert_allclose(layer((1, 1)).forward([view])[0],
                               F.adaptive_avg_pool2d(torch.from_numpy(view.copy()), 1).numpy(),
                               rtol=1e-5, atol=1e-6)
    for size in [(3, 2), (1, None), (None, 1), 2]:           # not global: the reference
        want = AdaptiveAvgPool2d(output_size=size).forward([x])[0]
        np.testing.assert_array_equal(layer(size).forward([x])[0], want)


def test_nan_and_inf_reach_only_their_own_plane():
    x = np.ones((1, 4, 5, 5), np.float32)
    x[0, 1, 2, 3], x[0, 2, 0, 0] = np.nan, np.inf
    got = layer(1).forward([x])[0].ravel()
    assert np.isnan(got[1]) and got[2] == np.inf and got[0] == got[3] == 1.0


def test_float64_goes_to_the_reference_and_empty_batches_and_planes_are_handled():
    x = np.random.default_rng(3).standard_normal((1, 3, 4, 4))
    got = layer(1).forward([x])[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True))
    empty = np.zeros((0, 3, 4, 4), np.float32)
    assert layer(1).forward([empty])[0].shape == (0, 3, 1, 1)
    with pytest.raises(ShapeError, match="at least 1"):
        layer(1).forward([np.zeros((1, 3, 0, 4), np.float32)])


def test_unbatched_and_unaligned_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 7), dtype=np.float32)                 # (C, H, W)
    got = layer(1).forward([x])[0]
    assert got.shape == (3, 1, 1)
    np.testing.assert_allclose(got, F.adaptive_avg_pool2d(torch.from_numpy(x), 1).numpy(),
                               rtol=1e-5, atol=1e-6)
    raw = np.zeros(2 * 3 * 4 * 5 * 4 + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, np.float32, 2 * 3 * 4 * 5, offset=1).reshape(2, 3, 4, 5)
    assert not unaligned.flags.aligned
    assert layer(1).forward([unaligned])[0].shape == (2, 3, 1, 1)


def test_forward_into_writes_the_planned_buffer():
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5), dtype=np.float32)
    out = np.full((2, 3, 1, 1), 7.0, np.float32)
    layer(1).forward_into([x], [out])
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-6, atol=1e-7)
    sized = np.full((2, 3, 2, 1), 7.0, np.float32)                    # not global: the reference
    layer((2, 1)).forward_into([x], [sized])
    np.testing.assert_array_equal(sized, AdaptiveAvgPool2d(output_size=(2, 1)).forward([x])[0])


def test_forward_into_decides_once_per_input_shape():
    """The pooling decides per input shape whether the kernel pools it (kept): sizes in
    turn, one seen again, a float64 input, and an output size that is not 1 x 1."""
    rng = np.random.default_rng(7)
    pooled = layer(1)
    for shape in [(1, 6, 7, 7), (2, 3, 4, 5), (1, 6, 7, 7), (1, 1, 1, 9)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        out = np.full((shape[0], shape[1], 1, 1), 7.0, np.float32)
        pooled.forward_into([x], [out])
        np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                                   rtol=1e-6, atol=1e-7)
    assert pooled._global_by_shape == dict.fromkeys([(1, 6, 7, 7), (2, 3, 4, 5),
                                                     (1, 1, 1, 9)], True)
    x64 = rng.standard_normal((1, 6, 7, 7))
    out = np.empty((1, 6, 1, 1), np.float32)
    pooled.forward_into([x64], [out])                 # the reference, cast into the buffer
    np.testing.assert_allclose(out, x64.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    two = layer(2)
    x = rng.standard_normal((1, 6, 7, 7), dtype=np.float32)
    out = np.empty((1, 6, 2, 2), np.float32)
    two.forward_into([x], [out])
    np.testing.assert_array_equal(out, AdaptiveAvgPool2d(output_size=2).forward([x])[0])
    assert two._global_by_shape == {(1, 6, 7, 7): False}
    two.load_param({"output_size": 1})                # a new output size: decided again
    out = np.empty((1, 6, 1, 1), np.float32)
    two.forward_into([x], [out])
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-6, atol=1e-7)


def test_the_kernel_writes_into_a_given_buffer_of_the_right_shape():
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 5), dtype=np.float32)
    out = np.full((2, 3, 1, 1), 7.0, np.float32)
    assert pool.global_average_pool(x, out) is out
    np.testing.assert_allclose(out, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="out has shape"):
        pool.global_average_pool(x, np.empty((3, 2, 1, 1), np.float32))


def test_the_fast_floor_registers_it_for_both_spellings():
    registry = LayerRegisterer()
    for name in ("nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d"):
        assert registry.layer_class(name, fast=True) is FastAdaptiveAvgPool2d
    assert registry.layer_class("nn.AdaptiveAvgPool1d", fast=True) is not FastAdaptiveAvgPool2d
