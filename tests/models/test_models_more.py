"""Architectures people bring that this project does not ship (more_models.py, beside it): each is
exported with pnnx once per session (static, and dynamic where the model allows other sizes),
run by the runtime and compared with torch (|diff| <= 1e-4 + 1e-3 |torch|)."""

from __future__ import annotations

import pytest
import torch

from helpers import check_graph_against_torch
from infer import RuntimeGraph
from infer.export import randomize
from more_models import MODELS, TransformerEncPost

ATOL, RTOL = 1e-4, 1e-3
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

# other input shapes to run a dynamic export at (grown batch; grown H, W where the model allows)
DYNAMIC = {
    "shufflenetv2ish": [[(2, 3, 96, 80)]],
    "deeplabish": [[(2, 3, 80, 96)]],
    "crnnish": [[(3, 1, 32, 96)]],                 # H is fixed by the Linear after the CNN
    "transformer_pre": [[(3, 10, 12)]],
    "audionet": [[(1, 1, 2400)]],
    "superres": [[(2, 1, 40, 24)]],
    "unetish": [[(2, 3, 80, 48)]],
    "computedpool": [[(2, 3, 20, 15)], [(1, 3, 9, 31)]],
}


def model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomize(MODELS[name][0](), seed=0).eval()


def compare(net: torch.nn.Module, graph: RuntimeGraph, shapes) -> None:
    check_graph_against_torch(net, graph, *shapes, atol=ATOL, rtol=RTOL, seed=1)


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_torch(pnnx_export, name):
    net, shapes = model(name), MODELS[name][1]
    inputs = [torch.rand(shape) for shape in shapes]
    graph = RuntimeGraph(*pnnx_export(net, inputs, name)).build()
    compare(net, graph, shapes)


@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_export_matches_torch_at_other_sizes(pnnx_export, name):
    net, shapes = model(name), MODELS[name][1]
    inputs = [torch.rand(shape) for shape in shapes]
    graph = RuntimeGraph(*pnnx_export(net, inputs, name + "_dynamic", dynamic=True)).build()
    for other in [shapes, *DYNAMIC[name]]:
        compare(net, graph, other)


def test_transformer_exported_under_no_grad_is_split_into_its_ops(pnnx_export):
    """Traced without grad, nn.TransformerEncoderLayer takes torch's fused inference path
    (aten::_transformer_encoder_layer_fwd, which pnnx cannot split); the export traces with
    grad on, as pnnx.export does, even when called under torch.no_grad()."""
    net = model("transformer_post")
    assert isinstance(net, TransformerEncPost)
    with torch.no_grad():
        param, binary = pnnx_export(net, [torch.rand(2, 10, 12)], "transformer_no_grad")
    assert "aten::_transformer" not in param.read_text()
    compare(net, RuntimeGraph(param, binary).build(), [(2, 10, 12)])
