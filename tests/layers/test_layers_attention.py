"""F.scaled_dot_product_attention, nn.MultiheadAttention and nn.Embedding against torch: the
layers alone on random inputs, and the files pnnx writes for them run by the graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_layer, make_layer, mha_layer, rand, randomized, torch_module
from infer import RuntimeGraph
from layers import LayerRegisterer
from parser.errors import InferError, LayerError, ShapeError

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

_rng = np.random.default_rng(1)


def bool_mask(*shape: int, keep_one: bool = True) -> np.ndarray:
    """A random boolean mask; with ``keep_one`` every row keeps at least one True."""
    mask = _rng.random(shape) > 0.5
    if keep_one:
        mask[..., 0] = True
    return mask


# ================================================================ F.scaled_dot_product_attention

def sdpa(**params):
    return lambda q, k, v, *mask: F.scaled_dot_product_attention(
        q, k, v, *mask, **{k_: v_ for k_, v_ in params.items() if k_ != "attn_mask"})


@pytest.mark.parametrize("shapes", [
    [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)],        # (N, heads, L, E), S != L, Ev != E
    [(4, 8), (6, 8), (6, 3)],                          # unbatched
    [(2, 5, 8), (2, 5, 8), (2, 5, 8)],                 # self-attention shapes
    [(2, 3, 5, 8), (1, 3, 7, 8), (3, 7, 6)],           # batch dims broadcast
], ids=str)
@pytest.mark.parametrize("params", [{}, {"scale": 0.3}, {"is_causal": True},
                                    {"is_causal": True, "scale": 2.0}], ids=str)
def test_sdpa_matches_torch(shapes, params):
    check_layer("F.scaled_dot_product_attention", sdpa(**params), shapes,
                dict(params, attn_mask=None, dropout_p=0.0))


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 3, 5, 7), (2, 1, 1, 7), (3, 5, 1)],
                         ids=str)
def test_sdpa_with_a_bool_mask_true_where_attending(mask_shape):
    mask = bool_mask(*mask_shape, keep_one=mask_shape[-1] != 1)
    check_layer("F.scaled_dot_product_attention", sdpa(),
                [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), mask])


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 3, 5, 7), (1, 7)], ids=str)
def test_sdpa_with_a_float_mask_added_to_the_scores(mask_shape):
    check_layer("F.scaled_dot_product_attention", sdpa(),
                [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), rand(*mask_shape)])


def test_sdpa_a_query_that_may_see_nothing_gives_zeros_as_torch_does():
    mask = bool_mask(5, 7)
    mask[2] = False
    float_mask = np.where(bool_mask(5, 7), 0, -np.inf).astype(np.float32)
    float_mask[1] = -np.inf
    for m in (mask, float_mask):
        (out,) = check_layer("F.scaled_dot_product_attention", sdpa(),
                             [(1, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), m])
        assert np.isfinite(out).all()


def test_sdpa_causal_with_more_queries_than_keys():
    """torch's causal mask is ones(L, S).tril(): top-left aligned; with L > S, rows beyond S
    see every key."""
    check_layer("F.scaled_dot_product_attention", sdpa(is_causal=True),
                [(2, 9, 4), (2, 4, 4), (2, 4, 5)], {"is_causal": True})


def test_sdpa_grouped_query_attention():
    check_layer("F.scaled_dot_product_attention", sdpa(enable_gqa=True),
                [(2, 6, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)], {"enable_gqa": True})


@pytest.mark.parametrize("shapes, words", [
    ([(2, 5, 8), (2, 7, 6), (2, 7, 6)], "last dim"),
    ([(2, 5, 8), (2, 7, 8), (2, 6, 8)], "source length"),
    ([(2, 5, 8), (3, 7, 8), (3, 7, 8)], "do not broadcast"),
    ([(2, 5, 8), (2, 7, 8), (2, 7, 8), (4, 7)], "attn_mask"),
    ([(8,), (7, 8), (7, 8)], "at least 2 dims"),
    ([(2, 5, 8), (2, 7, 8)], "3 or 4 inputs"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_sdpa_bad_shapes_are_shape_errors(shapes, words):
    with pytest.raises(ShapeError, match=words):
        make_layer("F.scaled_dot_product_attention").infer_shapes(shapes)


def test_sdpa_gqa_needs_a_head_multiple_and_causal_refuses_a_mask():
    layer = make_layer("F.scaled_dot_product_attention", {"enable_gqa": True})
    with pytest.raises(ShapeError, match="multiple"):
        layer.infer_shapes([(1, 6, 5, 8), (1, 4, 7, 8), (1, 4, 7, 8)])
    layer = make_layer("F.scaled_dot_product_attention", {"is_causal": True})
    with pytest.raises(ShapeError, match="is_causal"):
        layer.infer_shapes([(1, 5, 8), (1, 7, 8), (1, 7, 8), (5, 7)])
    with pytest.raises(LayerError, match="attn_mask"):
        make_layer("F.scaled_dot_product_attention", {"attn_mask": 1.0})


# ================================================================ nn.MultiheadAttention

def check_mha(module, arrays, call, input_names=(), need_weights=True, atol=1e-5):
    """Run the layer on ``arrays`` and torch's ``call(module, *tensors)``; compare outputs
    (and the predicted shapes)."""
    layer = mha_layer(module, input_names, 2 if need_weights else 1)
    shapes = layer.infer_shapes([a.shape for a in arrays])
    got = layer.forward(arrays)
    with torch.no_grad():
        want = call(module, *(torch.from_numpy(a.copy()) for a in arrays))
    want = [w for w in want if w is not None][:len(got)]
    assert len(got) == len(want) == len(shapes)
    for g, w, s in zip(got, want, shapes):
        assert g.shape == tuple(w.shape) == tuple(s) and g.dtype == np.float32
        np.testing.assert_allclose(g, w.numpy(), atol=atol, rtol=1e-4)


def self_attention(module, x, *mask):
    return module(x, x, x, attn_mask=mask[0] if mask else None)


@pytest.mark.parametrize("batch_first, shape", [(True, (2, 5, 16)), (False, (5, 2, 16)),
                                                (True, (5, 16)), (False, (5, 16))], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_self_attention(batch_first, shape, bias, need_weights):
    module = randomized(nn.MultiheadAttention(16, 4, bias=bias, batch_first=batch_first))
    check_mha(module, [rand(*shape)], self_attention, need_weights=need_weights)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_cross_attention_with_other_kdim_and_vdim(batch_first):
    module = randomized(nn.MultiheadAttention(16, 2, kdim=8, vdim=12, batch_first=batch_first))
    L, S, N = 5, 7, 3
    shapes = [(N, L, 16), (N, S, 8), (N, S, 12)] if batch_first else \
        [(L, N, 16), (S, N, 8), (S, N, 12)]
    check_mha(module, [rand(*s) for s in shapes], lambda m, q, k, v: m(q, k, v))


def test_mha_two_inputs_are_query_and_key_value():
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True))
    check_mha(module, [rand(2, 5, 16), rand(2, 9, 16)], lambda m, q, kv: m(q, kv, kv))


@pytest.mark.parametrize("add_bias_kv, add_zero_attn", [(True, False), (False, True),
                                                        (True, True)])
def test_mha_extra_key_and_value(add_bias_kv, add_zero_attn):
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=add_bias_kv,
                                              add_zero_attn=add_zero_attn))
    mask = rand(5, 5)
    check_mha(module, [rand(2, 5, 16), mask], self_attention, ["", "attn_mask"])


@pytest.mark.parametrize("mask_shape", [(5, 5), (2 * 4, 5, 5)], ids=str)
@pytest.mark.parametrize("boolean", [False, True])
def test_mha_with_an_attn_mask(mask_shape, boolean):
    module = randomized(nn.MultiheadAttention(16, 4, batch_first=True))
    mask = ~bool_mask(*mask_shape) if boolean else rand(*mask_shape)   # True = blocked
    check_mha(module, [rand(2, 5, 16), mask], self_attention, ["", "attn_mask"])


def test_mha_a_fully_blocked_query_is_nan_as_in_torch():
    module = randomized(nn.MultiheadAttention(8, 2, batch_first=True))
    mask = np.zeros((4, 4), np.float32)
    mask[1] = -np.inf
    layer = mha_layer(module, ["", "attn_mask"])
    (out,) = layer.forward([rand(1, 4, 8), mask])
    assert np.isnan(out[0, 1]).all() and np.isfinite(out[0, [0, 2, 3]]).all()


@pytest.mark.parametrize("shapes, names, words", [
    ([(2, 5, 12)], [], "12 features"),
    ([(2, 5, 16), (3, 5, 16)], [], "batch size 3"),
    ([(2, 5, 16), (5, 16)], [], "all be batched"),
    ([(2, 5, 16), (2, 5)], ["", "attn_mask"], "key_padding_mask"),
    ([(2, 5, 16), (4, 5)], ["", "attn_mask"], r"should be \(5, 5\)"),
    ([(2, 5), (2, 5, 16)], ["", ""], "boolean attn_mask or key_padding_mask"),
    ([(2, 5, 16)] * 4, [], "1 to 3 inputs"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_mha_bad_inputs_are_shape_errors(shapes, names, words):
    layer = mha_layer(nn.MultiheadAttention(16, 4, batch_first=True), names)
    with pytest.raises(ShapeError, match=words):
        layer.infer_shapes(shapes)


def test_mha_bad_weights_and_params_are_layer_errors():
    module = nn.MultiheadAttention(16, 4)
    weights = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    base = dict(embed_dim=16, num_heads=4, kdim=16, vdim=16, bias=True)
    with pytest.raises(LayerError, match="divisible"):
        make_layer("nn.MultiheadAttention", dict(base, num_heads=5), weights)
    with pytest.raises(LayerError, match="bias"):
        make_layer("nn.MultiheadAttention", dict(base, bias=False), weights)
    with pytest.raises(LayerError, match="in_proj_weight"):
        make_layer("nn.MultiheadAttention", dict(base, kdim=8), weights)
    with pytest.raises(LayerError, match="bias_k"):
        make_layer("nn.MultiheadAttention", dict(base, add_bias_kv=True), weights)
    with pytest.raises(LayerError, match="out_proj.weight"):
        make_layer("nn.MultiheadAttention", base,
                   {k: v for k, v in weights.items() if k != "out_proj.weight"})


# ================================================================ nn.Embedding

@pytest.mark.parametrize("shape", [(7,), (2, 5), (2, 3, 4), ()], ids=str)
def test_embedding_matches_torch(shape):
    params = dict(num_embeddings=10, embedding_dim=6)
    module, weights = torch_module(nn.Embedding, **params)
    indices = _rng.integers(0, 10, shape)
    (out,) = check_layer("nn.Embedding", module, [indices], dict(params, sparse=False), weights)
    out[...] = 0                                              # a copy, not a view of @weight


def test_embedding_refuses_indices_out_of_range_or_not_integers():
    params = dict(num_embeddings=10, embedding_dim=6)
    layer = make_layer("nn.Embedding", params, torch_module(nn.Embedding, **params)[1])
    with pytest.raises(ShapeError, match="index 10 is out of range"):
        layer.forward([np.array([1, 10])])
    with pytest.raises(ShapeError, match="index -1"):
        layer.forward([np.array([-1, 2])])
    with pytest.raises(ShapeError, match="integer"):
        layer.forward([np.array([1.0])])
    with pytest.raises(LayerError, match="@weight"):
        make_layer("nn.Embedding", params, {"weight": np.zeros((6, 10))})


@pytest.mark.parametrize("type_name, module", [
    ("F.scaled_dot_product_attention", "layers.attention"),
    ("nn.MultiheadAttention", "layers.attention"), ("nn.Embedding", "layers.embedding")])
def test_registered_under_pnnx_names(type_name, module):
    assert LayerRegisterer().layer_class(type_name).__module__ == module


# ================================================================ through pnnx

class Call(nn.Module):
    """Wraps a module or a function so that forward(*inputs) = fn(module, *inputs)."""

    def __init__(self, fn, module: nn.Module | None = None):
        super().__init__()
        self.fn, self.inner = fn, module

    def forward(self, *inputs):
        return self.fn(self.inner, *inputs)


def run_exported(pnnx_export, model, inputs, name, dynamic=False, more_inputs=()):
    param, binary = pnnx_export(model.eval(), tuple(inputs), name, dynamic=dynamic)
    graph = RuntimeGraph(param, binary).build()
    for xs in [inputs, *more_inputs]:
        with torch.no_grad():
            want = model(*xs)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        got = graph.forward(*(x.numpy() for x in xs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), atol=1e-5, rtol=1e-4)
    return param


def _t(*shape):
    return torch.from_numpy(rand(*shape))


MHA_CASES = {
    "self_batch_first": (dict(batch_first=True), lambda m, x: m(x, x, x)[0], [(2, 5, 16)]),
    "self_seq_first_weights": (dict(), lambda m, x: m(x, x, x), [(5, 2, 16)]),
    "cross_kv": (dict(batch_first=True, kdim=8, vdim=12), lambda m, q, k, v: m(q, k, v),
                 [(2, 5, 16), (2, 7, 8), (2, 7, 12)]),
    "query_keyvalue": (dict(batch_first=True), lambda m, q, kv: m(q, kv, kv),
                       [(2, 5, 16), (2, 3, 16)]),
    "no_bias": (dict(bias=False, batch_first=True), lambda m, x: m(x, x, x)[0], [(1, 6, 16)]),
    "bias_kv_zero_attn": (dict(batch_first=True, add_bias_kv=True, add_zero_attn=True),
                          lambda m, x: m(x, x, x), [(2, 5, 16)]),
    "float_mask": (dict(batch_first=True), lambda m, x, mask: m(x, x, x, attn_mask=mask),
                   [(2, 5, 16), (5, 5)]),
    "unbatched": (dict(), lambda m, x: m(x, x, x), [(5, 16)]),
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_exported_multihead_attention(pnnx_export, case):
    kwargs, fn, shapes = MHA_CASES[case]
    model = Call(fn, randomized(nn.MultiheadAttention(16, 4, **kwargs)))
    run_exported(pnnx_export, model, [_t(*s) for s in shapes], f"mha_{case}")


def test_exported_multihead_attention_at_other_sizes(pnnx_export):
    model = Call(lambda m, x: m(x, x, x), randomized(nn.MultiheadAttention(16, 4,
                                                                           batch_first=True)))
    run_exported(pnnx_export, model, [_t(2, 5, 16)], "mha_dynamic", dynamic=True,
                 more_inputs=[[_t(3, 9, 16)], [_t(1, 1, 16)]])


@pytest.mark.parametrize("which, mask_shape", [("attn_mask", (5, 5)),
                                                ("key_padding_mask", (2, 5))])
def test_exported_multihead_attention_with_a_bool_mask_is_refused(pnnx_export, which,
                                                                  mask_shape):
    """pnnx mis-wires a boolean mask (its re-export passes it as the query, and the file names
    the real query ``$attn_mask``): the graph says so at build() instead of computing
    something else."""
    model = Call(lambda m, x, mask: m(x, x, x, **{which: mask})[0],
                 randomized(nn.MultiheadAttention(16, 4, batch_first=True)))
    param, binary = pnnx_export(model.eval(), (_t(2, 5, 16), torch.rand(*mask_shape) > 0.5),
                                f"mha_bool_{which}")
    with pytest.raises(InferError, match="boolean .*float mask"):
        RuntimeGraph(param, binary).build()


SDPA_CASES = {
    "plain": ({}, [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)]),
    "causal_scale": ({"is_causal": True, "scale": 0.25}, [(2, 3, 5, 8), (2, 3, 5, 8),
                                                          (2, 3, 5, 8)]),
    "gqa": ({"enable_gqa": True}, [(1, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8)]),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_exported_sdpa(pnnx_export, case):
    kwargs, shapes = SDPA_CASES[case]
    model = Call(lambda _, q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs))
    run_exported(pnnx_export, model, [_t(*s) for s in shapes], f"sdpa_{case}")


@pytest.mark.parametrize("boolean", [False, True])
def test_exported_sdpa_with_a_mask_input(pnnx_export, boolean):
    mask = torch.from_numpy(bool_mask(5, 7)) if boolean else _t(5, 7)
    model = Call(lambda _, q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    param = run_exported(pnnx_export, model, [_t(2, 3, 5, 8), _t(2, 3, 7, 8), _t(2, 3, 7, 6),
                                              mask], f"sdpa_mask_{boolean}")
    assert ("(5,7)bool" in param.read_text()) == boolean


def test_exported_embedding_then_attention(pnnx_export):
    """A token model: embedding lookup (integer input), self-attention, F.embedding too."""

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 16)
            self.positions = nn.Parameter(torch.randn(12, 16))
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, tokens, where):
            x = self.embed(tokens) + F.embedding(where, self.positions)
            return self.attn(x, x, x, need_weights=False)[0]

    model = randomized(Tokens())
    tokens = torch.randint(0, 20, (2, 6))
    where = torch.arange(6).repeat(2, 1)
    param = run_exported(pnnx_export, model, [tokens, where], "tokens")
    assert param.read_text().count("nn.Embedding") == 2
