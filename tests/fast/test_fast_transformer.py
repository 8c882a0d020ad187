"""The fast floor's transformer layers: GELU (layers/fast/epilogue.py: erf as a rational
function), whose error stays within 4x torch's own float32 GELU and which fuses into nn.Linear,
and nn.MultiheadAttention with its products shared over threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import layers.fast  # noqa: F401  (registers the fast layers)
from layers.fast.layers import FastGELU
from infer import RuntimeGraph
from support import write_model


def _float64_gelu(x: np.ndarray) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64))).numpy()


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])
def test_fast_gelu_is_as_exact_as_torchs(scale):
    """max |fast - f64| <= 4 max |torch f32 - f64|, over the whole range and near 0 (where
    torch's float32 GELU is most exact, 1e-7)."""
    x = (np.random.default_rng(0).standard_normal(200_000) * scale).astype(np.float32)
    x[:5] = [0.0, -0.0, 1e-30, -5.5, 4.0]
    want = _float64_gelu(x)
    torch_error = np.abs(torch.nn.functional.gelu(torch.from_numpy(x)).numpy() - want)
    fast = x.copy()
    FastGELU().forward_inplace(fast)
    fast_error = np.abs(fast - want)
    assert fast_error.max() <= 4 * torch_error.max()
    near_zero = np.abs(x) < 1
    assert fast_error[near_zero].max() <= 4 * torch_error[near_zero].max()


def test_fast_gelu_keeps_nan_and_runs_the_reference_elsewhere():
    x = np.array([np.nan, -np.inf, -10.0, 0.0, 10.0], np.float32)
    fast = x.copy()
    FastGELU().forward_inplace(fast)
    np.testing.assert_array_equal(np.isnan(fast), [True, True, False, False, False])
    np.testing.assert_allclose(fast[2:], [0.0, 0.0, 10.0], atol=1e-6)
    tanh_form = FastGELU(approximate="tanh")           # the reference's numpy code
    y = x[2:].copy()
    tanh_form.forward_inplace(y)
    want = torch.nn.functional.gelu(torch.from_numpy(x[2:]), approximate="tanh").numpy()
    np.testing.assert_allclose(y, want, atol=1e-6)


def test_gelu_fuses_into_linear_and_matches_torch(tmp_path):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 32), dtype=np.float32) * 0.3
    bias = rng.standard_normal(64, dtype=np.float32)
    param, binary = write_model(
        tmp_path,
        "pnnx.Input in0 0 1 x #x=(3,7,32)f32",
        "nn.Linear fc 1 1 x a bias=True in_features=32 out_features=64 @weight=(64,32)f32 "
        "@bias=(64)f32",
        "nn.GELU gelu 1 1 a y approximate=none",
        "pnnx.Output out0 1 0 y", weights={"fc.weight": weight, "fc.bias": bias})
    graph = RuntimeGraph(param, binary).build()
    assert [op.fused for op in graph.operators if op.type == "nn.Linear"] == [["gelu"]]
    x = rng.standard_normal((3, 7, 32), dtype=np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x) @ torch.from_numpy(weight).T
                                    + torch.from_numpy(bias)).numpy()
    np.testing.assert_allclose(graph(x)[0], want, atol=2e-5, rtol=1e-5)


class _Block(torch.nn.Module):
    """A pre-norm transformer block, as a ViT's."""

    def __init__(self, dim: int = 48, heads: int = 4):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_transformer_block_matches_torch_on_any_number_of_threads(pnnx_export, threads):
    torch.manual_seed(0)
    block = _Block().eval()
    param, binary = pnnx_export(block, [torch.rand(2, 37, 48)], "transformer_block",
                                dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    graph.set_num_threads(threads)
    assert {type(op.layer).__name__ for op in graph.operators} >= {"FastMultiheadAttention"}
    x = np.random.default_rng(threads).standard_normal((3, 29, 48), dtype=np.float32)
    with torch.no_grad():
        want = block(torch.from_numpy(x)).numpy()
    got = graph(x)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    reference = RuntimeGraph(param, binary, reference=True).build()(x)[0]
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(197, 384), (2, 5, 1536), (3, 7)])
def test_fast_layer_norm_is_as_exact_as_torchs(shape):
    from layers.fast.layers import FastLayerNorm

    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)       # an offset mean
    weight = rng.standard_normal(shape[-1]).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    layer = FastLayerNorm(normalized_shape=(shape[-1],), eps=1e-6)
    layer.weight, layer.bias = weight, bias
    args = ((shape[-1],), torch.from_numpy(weight), torch.from_numpy(bias), 1e-6)
    want = torch.nn.functional.layer_norm(torch.from_numpy(x).double(), args[0],
                                          args[1].double(), args[2].double(), 1e-6).numpy()
    torch_error = np.abs(torch.nn.functional.layer_norm(torch.from_numpy(x), *args).numpy()
                         - want).max()
    fast = layer.forward_one(x)
    assert fast.dtype == np.float32 and fast.shape == x.shape
    assert np.abs(fast - want).max() <= 4 * torch_error + 1e-7

