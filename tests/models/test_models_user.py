"""Models a user brings: small networks built only of supported operators, combined as real
networks combine them, exported with pnnx (static and dynamic) and compared with torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_graph_against_torch
from infer import RuntimeGraph

ATOL = 1e-4


def run_both(module: nn.Module, graph: RuntimeGraph, *shapes: tuple[int, ...]) -> None:
    """Run torch and the graph on the same random inputs; every output must agree."""
    check_graph_against_torch(module, graph, *shapes, atol=ATOL, rtol=0)


def test_sequential_with_a_dash_in_its_name(pnnx_export):
    """pnnx names an nn.Sequential's children 0, 1, 2; its python re-export (which
    pnnx.export imports) is then invalid python. Exporting must not depend on it, nor on
    pnnx's renaming of '-' in file names."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 5, 5),
                          nn.Softmax(1)).eval()
    param, binary = pnnx_export(model, (torch.rand(2, 3, 6, 7),), "user-sequential")
    assert param.name == "user-sequential.pnnx.param"
    run_both(model, RuntimeGraph(param, binary).build(), (2, 3, 6, 7))


def test_export_of_a_model_that_fails_on_its_inputs_is_an_export_error(tmp_path):
    from infer.export import ExportError, export_module

    with pytest.raises(ExportError, match=r"trace failed on inputs of shapes \[\(1, 4\)\]"):
        export_module(nn.Linear(3, 2), (torch.rand(1, 4),), tmp_path, "bad")


class TokenMixer(nn.Module):
    """Linear layers over the last dim of an (N, L, features) input, with a residual."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):                                    # (N, L, 8)
        return self.down(torch.relu(self.up(x))) + x


def test_dynamic_export_of_a_model_that_fixes_its_last_dim(pnnx_export):
    """A dynamic export grows batch and trailing dims; a Linear over the last dim refuses
    that, so the export falls back to a second batch size and runs at any batch."""
    model = TokenMixer().eval()
    param, binary = pnnx_export(model, (torch.rand(2, 5, 8),), "token_mixer", dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    assert graph.input_shapes[0][0] is None
    for shape in [(2, 5, 8), (4, 5, 8)]:
        run_both(model, graph, shape)


def test_dynamic_export_with_given_second_inputs(tmp_path):
    """example_inputs2 says which dims vary: here batch and sequence length."""
    from infer.export import export_module

    model = TokenMixer().eval()
    param, binary = export_module(model, (torch.rand(2, 5, 8),), tmp_path, "mixer",
                                  example_inputs2=(torch.rand(3, 9, 8),))
    graph = RuntimeGraph(param, binary).build()
    assert graph.input_shapes[0] == (None, None, 8)
    run_both(model, graph, (1, 12, 8))


class PyramidPool(nn.Module):
    """Pooling to a size computed from the input's (PSPNet-style), then a classifier."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = F.adaptive_avg_pool2d(y, (y.size(2) // 2, y.size(3) // 2))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1)), y


class PadToMultiple(nn.Module):
    """Reflect-pad H and W up to a multiple of 8 (as segmentation and detection nets do), run
    a stride-8 convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 8, stride=8)

    def forward(self, x):
        h, w = x.size(2), x.size(3)
        x = F.pad(x, (0, (8 - w % 8) % 8, 0, (8 - h % 8) % 8), mode="reflect")
        return self.conv(x)


@pytest.mark.parametrize("model_class", [PyramidPool, PadToMultiple])
def test_argument_computed_from_the_input_size(pnnx_export, model_class):
    """pnnx passes a size computed from the input's as a second input of the operator."""
    model = model_class().eval()
    param, binary = pnnx_export(model, (torch.rand(1, 3, 12, 10),), model_class.__name__,
                                dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    for shape in [(1, 3, 12, 10), (2, 3, 9, 17)]:
        run_both(model, graph, shape)


class FeaturePyramid(nn.Module):
    """A backbone that returns its feature maps as a list, one of them also used inside."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, 2, 1), nn.Conv2d(4, 8, 3, 2, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = self.c2(a)
        return [a, b + 1], b.sigmoid()


@pytest.mark.filterwarnings("ignore:Encountering a list at the output of the tracer")
def test_model_returning_a_list(pnnx_export):
    """pnnx builds a returned list with one pnnx.Expression, expr=[@0,add(@1,1)]; the graph
    returns its items as outputs of their own, in order, as it does with tuple members."""
    model = FeaturePyramid().eval()
    param, binary = pnnx_export(model, (torch.rand(1, 3, 16, 12),), "feature_pyramid")
    graph = RuntimeGraph(param, binary).build()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 12), dtype=np.float32)
    with torch.no_grad():
        (a, b), c = model(torch.from_numpy(x))
    got = graph.forward(x)
    assert len(got) == 3
    for g, w in zip(got, (a, b, c)):
        np.testing.assert_allclose(g, w.numpy(), atol=ATOL, rtol=0)


@pytest.mark.filterwarnings("ignore:Encountering a list at the output of the tracer")
def test_classify_refuses_a_model_with_several_outputs(pnnx_export):
    from infer.classify import ImageClassifier
    from parser.errors import InferError

    param, binary = pnnx_export(FeaturePyramid().eval(), (torch.rand(1, 3, 16, 12),),
                                "feature_pyramid")
    classifier = ImageClassifier(RuntimeGraph(param, binary).build(), ["a", "b"])
    with pytest.raises(InferError, match="one \\(1, classes\\) array"):
        classifier.classify(np.zeros((40, 30, 3), np.uint8))


def test_randomize_and_export_batch_norms_without_affine(pnnx_export):
    """infer.export.randomize fills what a BatchNorm has: affine=False has no weight and bias
    (it used to fail on them), track_running_stats=False no running statistics. (pnnx itself
    cannot export the latter: it aborts in pass_level1.)"""
    from infer.export import randomize

    untracked = randomize(nn.BatchNorm2d(4, track_running_stats=False))
    assert untracked.running_mean is None
    model = randomize(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False),
                                    nn.ReLU())).eval()
    assert model[1].weight is None and model[1].running_var.min() >= 0.5
    param, binary = pnnx_export(model, (torch.rand(2, 3, 6, 7),), "user_bn_without_affine")
    run_both(model, RuntimeGraph(param, binary).build(), (2, 3, 6, 7))
