"""torch.matmul, torch.bmm and torch.mm on the fast floor (layers/fast/products.py): shared
with the helper threads inside a forward, against torch, for every layout of operands it
takes (equal batch dims, one B for all, one A for all, a transposed right operand, views
that are not contiguous) and the ones it leaves to numpy (vectors, broadcast batch dims,
float64, empty operands)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layers.fast import backend, products

CASES = {                                         # shapes of a and b; "T": b given transposed
    "attention scores, b transposed": ((2, 6, 197, 64), (2, 6, 197, 64), "T"),
    "weights @ v": ((2, 6, 80, 80), (2, 6, 80, 32), ""),
    "rows @ one matrix": ((3, 50, 40), (40, 24), ""),
    "one matrix transposed for all rows": ((3, 50, 40), (24, 40), "T"),
    "one A for a stack of B": ((30, 40), (4, 40, 50), ""),
    "batch dims of one": ((1, 1, 60, 40), (1, 40, 70), ""),
    "mm": ((90, 70), (70, 80), ""),
    "one A broadcast over two batch dims": ((1, 60, 40), (2, 3, 40, 50), ""),
    "a right operand copied (neither layout)": ((4, 60, 40), (4, 40, 50), "S"),
    "one row a product": ((4, 1, 512), (4, 512, 300), ""),
    "one column a product": ((4, 300, 512), (4, 512, 1), ""),
}
LEFT_TO_NUMPY = {
    "a vector": ((40,), (40, 30)),
    "batch dims that broadcast": ((2, 1, 30, 40), (1, 3, 40, 20)),
    "no rows": ((2, 0, 40), (2, 40, 20)),
    "rows of one value against one B": ((8, 1, 768), (768, 512)),
}


def operands(case, seed=0):
    shape_a, shape_b, flag = CASES[case]
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape_a, dtype=np.float32)
    b = rng.standard_normal(shape_b, dtype=np.float32)
    if flag == "T":
        b = np.swapaxes(b, -1, -2)                # a view of a C-contiguous array
    elif flag == "S":                             # every other row: not contiguous either way
        b = np.repeat(b, 2, axis=-2)[..., ::2, :]
    return a, b


@pytest.mark.parametrize("case", CASES)
def test_shared_products_match_torch(case, forward_with_helpers):
    a, b = operands(case)
    before = forward_with_helpers.control[0]
    got = products.shared_product(a, b)
    assert got is not None and forward_with_helpers.control[0] != before   # the team ran it
    want = torch.matmul(torch.from_numpy(a),
                        torch.from_numpy(np.ascontiguousarray(b))).numpy()
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_left_operand_that_is_a_view_is_copied_first(forward_with_helpers):
    a, b = operands("weights @ v", seed=1)
    a_view = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
    got = products.shared_product(a_view, b)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", LEFT_TO_NUMPY)
def test_what_it_does_not_take_runs_numpy(case, forward_with_helpers):
    shape_a, shape_b = LEFT_TO_NUMPY[case]
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(shape_a, dtype=np.float32), rng.standard_normal(shape_b,
                                                                               dtype=np.float32)
    assert products.shared_product(a, b) is None
    a, b = operands("mm")
    assert products.shared_product(a.astype(np.float64), b) is None


@pytest.mark.parametrize("case", ["one row a product", "one column a product"])
def test_products_of_one_row_or_column_give_numpys_bits(case, forward_with_helpers):
    """As numpy, matrix-vector products: the same bits with helpers as without."""
    from threadpoolctl import threadpool_limits

    a, b = operands(case, seed=4)
    with threadpool_limits(1):
        want = np.matmul(a, b)
    np.testing.assert_array_equal(products.shared_product(a, b), want)


def test_unaligned_operands_are_copied_aligned(forward_with_helpers):
    a, b = operands("weights @ v", seed=8)
    raw = np.empty(a.nbytes + 4, np.uint8)
    unaligned = raw[1:1 + a.nbytes].view(np.float32).reshape(a.shape)   # one byte off
    unaligned[...] = a
    assert not unaligned.flags.aligned
    np.testing.assert_allclose(products.shared_product(unaligned, b), np.matmul(a, b),
                               rtol=1e-5, atol=1e-4)


def test_without_helpers_the_reference_runs():
    backend.start()
    a, b = operands("mm")
    assert products.shared_product(a, b) is None             # no forward, no team


@pytest.mark.parametrize("type_name", ["torch.matmul", "torch.bmm", "torch.mm"])
def test_layers_on_the_fast_floor(type_name, forward_with_helpers):
    """The fast layers answer as torch, through the team where it applies and through
    numpy (the reference layer) where it does not."""
    from helpers import make_layer

    layer = make_layer(type_name, {}, fast=True)
    assert isinstance(layer, products.SharedProduct)
    case = {"torch.matmul": "attention scores, b transposed",
            "torch.bmm": "weights @ v", "torch.mm": "mm"}[type_name]
    a, b = operands(case, seed=3)
    if type_name == "torch.bmm":
        a, b = a[0], b[0]
    want = torch.matmul(torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(b))).numpy()
    before = forward_with_helpers.control[0]
    np.testing.assert_allclose(layer.forward([a, b])[0], want, rtol=1e-5, atol=1e-4)
    assert forward_with_helpers.control[0] != before                 # the team ran it
    if type_name == "torch.matmul":                            # a vector: numpy's
        vector = np.ones(a.shape[-1], np.float32)
        np.testing.assert_allclose(layer.forward([a, vector])[0], a @ vector, rtol=1e-5,
                                   atol=1e-4)


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("shapes", [((2, 6, 50, 32), (2, 6, 70, 32), (2, 6, 70, 24)),
                                    ((200, 64), (150, 64), (150, 64))],
                         ids=["heads", "one matrix"])
def test_scaled_dot_product_attention_shared_matches_torch(shapes, scale,
                                                           forward_with_helpers):
    import torch.nn.functional as F
    from helpers import make_layer

    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in shapes)
    params = {} if scale is None else {"scale": scale}
    layer = make_layer("F.scaled_dot_product_attention", params, fast=True)
    before = forward_with_helpers.control[0]
    got = layer.forward([q, k, v])[0]
    assert forward_with_helpers.control[0] != before                # the team ran it
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                          scale=scale).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["a mask", "causal", "a query of -inf"])
def test_scaled_dot_product_attention_leaves_the_rest_to_the_reference(case,
                                                                       forward_with_helpers):
    """Masks, causal masking and non-finite queries run the reference (a row whose scores
    are all -inf gives zeros there, as in torch; NaN rows stay NaN)."""
    import torch.nn.functional as F
    from helpers import make_layer

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 9, 8), dtype=np.float32) for _ in range(3))
    inputs, kwargs = [q, k, v], {}
    if case == "a mask":
        mask = np.tril(np.ones((9, 9), bool))
        inputs.append(mask)
        kwargs["attn_mask"] = torch.from_numpy(mask)
    elif case == "causal":
        kwargs["is_causal"] = True
    else:
        q[0, 3] = -np.inf
    layer = make_layer("F.scaled_dot_product_attention",
                       {"is_causal": True} if case == "causal" else {}, fast=True)
    before = forward_with_helpers.control[0]
    got = layer.forward(inputs)[0]
    assert forward_with_helpers.control[0] == before                # not the team
    want = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k),
                                          torch.from_numpy(v), **kwargs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
