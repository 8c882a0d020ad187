"""Models a user brings: small networks built only of supported operators, combined as real
networks combine them, exported with pnnx (static and dynamic) and compared with torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from infer import RuntimeGraph

ATOL = 1e-4


def run_both(module: nn.Module, graph: RuntimeGraph, *shapes: tuple[int, ...]) -> None:
    """Run torch and the graph on the same random inputs; every output must agree."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
    with torch.no_grad():
        want = module(*(torch.from_numpy(x.copy()) for x in xs))
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = graph.forward(*xs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g, w.numpy(), atol=ATOL, rtol=0)


def test_sequential_with_a_dash_in_its_name(pnnx_export):
    """pnnx names an nn.Sequential's children 0, 1, 2; its python re-export (which
    pnnx.export imports) is then invalid python. Exporting must not depend on it, nor on
    pnnx's renaming of '-' in file names."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 5, 5),
                          nn.Softmax(1)).eval()
    param, binary = pnnx_export(model, (torch.rand(2, 3, 6, 7),), "user-sequential")
    assert param.name == "user-sequential.pnnx.param"
    run_both(model, RuntimeGraph(param, binary).build(), (2, 3, 6, 7))
