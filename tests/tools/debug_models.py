"""Small models for the debugging tests, exported with pnnx once per test session, with the
python module pnnx writes beside the files (``*_pnnx.py``), and the faults planted in them.

    model, graph = small_net(tmp_path_factory)          # a fresh built graph each call
    graph.register_custom_layer("nn.Hardswish", WrongHardswish)   # the planted fault
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from infer import Layer, RuntimeGraph
from infer.export import export_module, randomize

INPUT_SHAPE = (1, 3, 12, 12)
_exported: dict[str, tuple[nn.Module, Path, Path]] = {}


class SmallNet(nn.Module):
    """conv+bn -> relu -> maxpool -> grouped conv -> hardswish ("act") + skip -> pool -> fc,
    and a second output: sigmoid of a 1x1 conv ("head")."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.act = nn.Hardswish()
        self.head = nn.Conv2d(8, 4, 1)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):                                     # (N, 3, H, W)
        y = self.pool(self.relu(self.bn1(self.conv1(x))))      # (N, 8, H/2, W/2)
        z = self.act(self.conv2(y)) + y                        # (N, 8, H/2, W/2)
        logits = self.fc(torch.flatten(self.avg(z), 1))        # (N, 5)
        return logits, torch.sigmoid(self.head(z))             # (N, 4, H/2, W/2)


def make_small_net() -> SmallNet:
    torch.manual_seed(0)
    model = randomize(SmallNet(), seed=0)
    with torch.no_grad():
        model.conv2.weight.mul_(3.0)          # so that act sees values beyond 3 (its upper knee)
    return model.eval()


def exported(tmp_path_factory, name: str = "small_net") -> tuple[nn.Module, Path, Path]:
    """The torch model and its pnnx files (with ``name_pnnx.py`` beside them), made once."""
    if name not in _exported:
        model = make_small_net()
        folder = tmp_path_factory.mktemp(name)
        param, binary = export_module(model, (torch.rand(*INPUT_SHAPE),), folder, name,
                                      keep_extras=True)
        _exported[name] = (model, param, binary)
    return _exported[name]


def small_net(tmp_path_factory, **custom_layers: type[Layer]) -> tuple[nn.Module, RuntimeGraph]:
    """The torch model and a new built graph of it; ``custom_layers`` maps a pnnx type with
    ``.`` written as ``__`` (nn__Hardswish) to a Layer class registered on this graph."""
    model, param, binary = exported(tmp_path_factory)
    graph = RuntimeGraph(param, binary, fuse=False)      # every operator of the file, one by one
    for type_name, layer_class in custom_layers.items():
        graph.register_custom_layer(type_name.replace("__", "."), layer_class)
    return model, graph.build()


def example_input(seed: int = 0) -> np.ndarray:
    """Values in [-4, 4): wide enough to reach both knees of hardswish."""
    rng = np.random.default_rng(seed)
    return (rng.random(INPUT_SHAPE, dtype=np.float32) * 8 - 4).astype(np.float32)


def torch_outputs_by_module(model: nn.Module, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every submodule's output on ``x`` (first call), by module path."""
    outputs: dict[str, np.ndarray] = {}
    handles = []
    for name, module in model.named_modules():
        if name:
            def hook(_m, _args, out, name=name):
                outputs.setdefault(name, out.detach().clone().numpy())
            handles.append(module.register_forward_hook(hook))
    with torch.no_grad():
        model(torch.from_numpy(x.copy()))
    for handle in handles:
        handle.remove()
    return outputs


# ----- planted faults: custom layers that look right and are subtly wrong --------------------

class WrongHardswish(Layer):
    """hardswish with its upper knee at 6.5 instead of 6: x * clip(x + 3, 0, 6.5) / 6.
    Right for x <= 3, wrong above."""

    support_inplace = False

    def forward_one(self, x):
        return (x * np.clip(x + 3.0, 0.0, 6.5) / 6.0).astype(np.float32)


class SqrtRelu(Layer):
    """A 'ReLU' written as sqrt(x)**2: NaN for every negative input."""

    def forward_one(self, x):
        with np.errstate(invalid="ignore"):
            return (np.sqrt(x) ** 2).astype(np.float32)
