"""The fast floor's nn.MultiheadAttention with enough tokens for the register tiles: self-
attention's three projections as one product (q, k and v views of it), the output
projection in the tiles, the softmax by softmax.py's kernel; torch's values with and without
biases, masks, extra keys and values, batch first or not, on one thread or two, and the
other attentions (cross-attention, other kdim / vdim) through the separate projections."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from helpers import mha_layer, rand, randomized
from infer import threads
from layers.fast.layers import FastMultiheadAttention


def _layer(module: nn.MultiheadAttention, input_names=(), num_outputs=1):
    layer = mha_layer(module, input_names, num_outputs, fast=True)
    assert isinstance(layer, FastMultiheadAttention)
    return layer


def _check(module, arrays, call, input_names=(), need_weights=False):
    layer = _layer(module, input_names, 2 if need_weights else 1)
    with torch.no_grad():
        want = call(module, *(torch.from_numpy(a.copy()) for a in arrays))
    want = [w.numpy() for w in want if w is not None][:layer.num_outputs]
    results = []
    for num_threads in (1, 2):
        with threads.limit(num_threads):
            got = layer.forward(arrays)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == np.float32
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)
        results.append(got)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)            # the same bits on any threads
    return layer


def _self(module, x, *mask):
    return module(x, x, x, attn_mask=mask[0] if mask else None)


@pytest.mark.parametrize("batch_first, shape", [(True, (2, 17, 32)), (False, (17, 2, 32)),
                                                (True, (20, 32)), (True, (1, 197, 32))],
                         ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_runs_one_product_for_q_k_v(batch_first, shape, bias, need_weights):
    module = randomized(nn.MultiheadAttention(32, 4, bias=bias, batch_first=batch_first))
    layer = _check(module, [rand(*shape)], _self, need_weights=need_weights)
    assert layer.tiled_qkv.packed is not None and layer.tiled_out.packed is not None


@pytest.mark.parametrize("add_bias_kv, add_zero_attn", [(True, False), (False, True)])
@pytest.mark.parametrize("boolean", [False, True])
def test_masks_and_extra_keys(add_bias_kv, add_zero_attn, boolean):
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=add_bias_kv,
                                               add_zero_attn=add_zero_attn))
    mask = rand(18, 18) if not boolean else rand(18, 18) > 1.2    # True: blocked
    _check(module, [rand(2, 18, 16), mask], _self, ["", "attn_mask"])


def test_cross_attention_and_other_widths_project_apart():
    module = randomized(nn.MultiheadAttention(16, 2, kdim=8, vdim=12, batch_first=True))
    layer = _check(module, [rand(2, 20, 16), rand(2, 24, 8), rand(2, 24, 12)],
                   lambda m, q, k, v: m(q, k, v))
    assert layer.tiled_qkv is None and layer.tiled_out.packed is not None
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True))
    layer = _check(module, [rand(2, 20, 16), rand(2, 9, 16)], lambda m, q, kv: m(q, kv, kv))
    assert layer.tiled_qkv.packed is None                  # query and key/value differ


def test_few_tokens_stay_on_blas():
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True))
    layer = _check(module, [rand(1, 5, 16)], _self)
    assert layer.tiled_qkv.packed is None and layer.tiled_out.packed is None
