"""The three MTCNN networks as torch modules, and their export to the pnnx files beside this script.

    pip download --no-deps -d /tmp/wheels facenet-pytorch==2.6.0
    python model_file/mtcnn/export_mtcnn.py /tmp/wheels/facenet_pytorch-2.6.0-py3-none-any.whl

MTCNN (Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded
Convolutional Networks") finds faces with a cascade of three small networks. The weights are the
state dicts ``facenet_pytorch/data/{pnet,rnet,onet}.pt`` of the facenet-pytorch 2.6.0 wheel (MIT;
ported by its author from David Sandberg's TensorFlow facenet, itself from the original Caffe
models). They are read straight out of the wheel: facenet-pytorch is neither installed nor
imported (it pins another torch). The modules below are written for this project with the
parameter names of those state dicts, so they load as they are:

- P-Net (proposal): fully convolutional, a 12 x 12 window per output cell, stride 2. On an
  (N, 3, H, W) image it gives the face probability (N, 2, H', W') (softmax over background /
  face) and box offsets (N, 4, H', W'), H' = ceil((H - 2) / 2) - 4. Exported with free batch,
  height and width: the image pyramid runs it at a dozen sizes.
- R-Net (refine): (N, 3, 24, 24) crops -> probability (N, 2), box offsets (N, 4).
- O-Net (output): (N, 3, 48, 48) crops -> probability (N, 2), box offsets (N, 4), five
  landmarks (N, 10): x1..x5 then y1..y5, as fractions of the box.

Max pools round up (``ceil_mode=True``), as Caffe's did. Before their dense layers R-Net and O-Net
flatten the feature map in (N, W, H, C) order (the layout of the TensorFlow port whose dense
weights these are), hence the ``permute(0, 3, 2, 1)``. Inputs are RGB pixels scaled as
``(x - 127.5) / 128``. This file needs torch and pnnx (export dependencies); the runtime and
``infer/detect.py`` never import it.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
WHEEL = "facenet_pytorch-2.6.0-py3-none-any.whl"
NETWORKS = ("pnet", "rnet", "onet")


class PNet(nn.Module):
    """Proposal network: (N, 3, H, W) -> face probability (N, 2, H', W'), offsets (N, 4, H', W')."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, 1)              # face / not a face, per window
        self.conv4_2 = nn.Conv2d(32, 4, 1)              # box offsets, per window

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))      # (N, 10, ceil((H-2)/2), ...)
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))    # (N, 32, H', W')
        probability = torch.softmax(self.conv4_1(x), dim=1)        # (N, 2, H', W')
        return probability, self.conv4_2(x)                        # (N, 4, H', W')


class RNet(nn.Module):
    """Refinement network: (N, 3, 24, 24) -> face probability (N, 2), box offsets (N, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))      # (N, 28, 11, 11)
        x = self.pool2(self.prelu2(self.conv2(x)))      # (N, 48, 4, 4)
        x = self.prelu3(self.conv3(x))                  # (N, 64, 3, 3)
        x = x.permute(0, 3, 2, 1).flatten(1)            # (N, 576), in (W, H, C) order
        x = self.prelu4(self.dense4(x))                 # (N, 128)
        return torch.softmax(self.dense5_1(x), dim=1), self.dense5_2(x)   # (N, 2), (N, 4)


class ONet(nn.Module):
    """Output network: (N, 3, 48, 48) -> face probability (N, 2), box offsets (N, 4),
    landmarks (N, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))      # (N, 32, 23, 23)
        x = self.pool2(self.prelu2(self.conv2(x)))      # (N, 64, 10, 10)
        x = self.pool3(self.prelu3(self.conv3(x)))      # (N, 64, 4, 4)
        x = self.prelu4(self.conv4(x))                  # (N, 128, 3, 3)
        x = x.permute(0, 3, 2, 1).flatten(1)            # (N, 1152), in (W, H, C) order
        x = self.prelu5(self.dense5(x))                 # (N, 256)
        probability = torch.softmax(self.dense6_1(x), dim=1)      # (N, 2)
        return probability, self.dense6_2(x), self.dense6_3(x)     # (N, 4), (N, 10)


MODULES: dict[str, type[nn.Module]] = {"pnet": PNet, "rnet": RNet, "onet": ONet}


def state_dicts(wheel: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """{"pnet": state dict, ...}, read out of the facenet-pytorch wheel (tensors only:
    ``weights_only=True`` unpickles no code)."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: torch.load(io.BytesIO(archive.read(f"facenet_pytorch/data/{name}.pt")),
                                 map_location="cpu", weights_only=True)
                for name in NETWORKS}


def networks(wheel: str | Path) -> dict[str, nn.Module]:
    """{"pnet": PNet with the real weights, ...}, in eval mode."""
    loaded = {}
    for name, state in state_dicts(wheel).items():
        module = MODULES[name]()
        module.load_state_dict(state)              # strict: every name must match
        loaded[name] = module.eval()
    return loaded


# Example inputs of the export: two sizes each, so the dims that differ stay free in the param
# file. P-Net: batch, height and width; R-Net and O-Net: the batch (their crops have one size).
EXAMPLE_SHAPES = {"pnet": ((1, 3, 60, 80), (2, 3, 97, 131)),
                  "rnet": ((1, 3, 24, 24), (3, 3, 24, 24)),
                  "onet": ((1, 3, 48, 48), (3, 3, 48, 48))}


def export(nets: dict[str, nn.Module], out_dir: str | Path = HERE) -> list[Path]:
    """Write ``{pnet,rnet,onet}.pnnx.param`` / ``.pnnx.bin`` of ``nets`` (as ``networks``
    gives them) into ``out_dir``, with the project's export helper; their paths."""
    from infer.export import export_module

    written: list[Path] = []
    torch.manual_seed(0)
    for name, module in nets.items():
        first, second = EXAMPLE_SHAPES[name]
        written += export_module(module, [torch.rand(first)], out_dir, name,
                                 example_inputs2=[torch.rand(second)])
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} /path/to/{WHEEL}")
    sys.path.insert(0, str(HERE.parent.parent))     # the repository, for infer.export
    for path in export(networks(sys.argv[1])):
        print(path)
