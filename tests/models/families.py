"""The model families people bring from torchvision and timm, exported with pnnx and run here.

Not a test module (torchvision needs another torch than the tests' 2.13.0): two steps, run by
hand when pnnx, timm or torchvision change.

    # 1. in a venv with torchvision and timm (on x86_64: pip install torch==2.14.1
    #    torchvision==0.29.1 timm pnnx), from the repository:
    python tests/models/families.py export /tmp/families
    # 2. in the project's environment:
    python tests/models/families.py check /tmp/families

``export`` writes one folder per model: the pnnx files, a seeded random input and torch's
output on it (weights random: BatchNorm statistics and constant parameters such as layer
scales and zero-initialised heads too, so that every layer matters). Every torchvision
classification, segmentation, video and optical-flow family, detection backbones with their
heads, and the smallest model of every timm module that takes 3-channel images up to 256 x 256.
``check`` builds each with RuntimeGraph and prints its error against torch's, relative to the
output's largest value (ok: at most 1e-4).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4            # max |ours - torch| / max |torch|


def torchvision_models() -> dict[str, Callable[[], tuple[Any, tuple[int, ...]]]]:
    import torch
    import torchvision.models as tvm
    from torchvision.models import detection, optical_flow, segmentation, video

    class Out(torch.nn.Module):                 # a segmentation model's {"out": ...}
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]

    class BackboneAndHead(torch.nn.Module):     # a detector without its post-processing
        def __init__(self, model):
            super().__init__()
            self.backbone, self.head = model.backbone, model.head

        def forward(self, x):
            out = self.head(list(self.backbone(x).values()))
            return torch.cat([v.flatten(1) for v in out.values()], 1)

    class TwoFrames(torch.nn.Module):           # optical flow: both frames in one input
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x[:, :3], x[:, 3:], num_flow_updates=2)[-1]

    def classifier(name, size=96, **kw):
        return lambda: (getattr(tvm, name)(weights=None, **kw), (1, 3, size, size))

    none = {"weights": None, "weights_backbone": None}
    models = {f"tv_{name}": classifier(name, size, **kw) for name, size, kw in [
        ("alexnet", 96, {}), ("vgg11_bn", 64, {}), ("squeezenet1_1", 96, {}),
        ("densenet121", 96, {}), ("googlenet", 96, {"aux_logits": False, "init_weights": True}),
        ("inception_v3", 160, {"aux_logits": False, "init_weights": True}),
        ("resnext50_32x4d", 96, {}), ("wide_resnet50_2", 96, {}), ("mobilenet_v2", 96, {}),
        ("mobilenet_v3_large", 96, {}), ("mnasnet0_5", 96, {}), ("shufflenet_v2_x0_5", 96, {}),
        ("efficientnet_b0", 96, {}), ("efficientnet_v2_s", 96, {}), ("regnet_y_400mf", 96, {}),
        ("convnext_tiny", 96, {}), ("vit_b_16", 224, {}), ("swin_t", 224, {}),
        ("swin_v2_t", 256, {}), ("maxvit_t", 224, {})]}
    models.update({
        "tv_deeplabv3_mobilenet": lambda: (Out(segmentation.deeplabv3_mobilenet_v3_large(
            **none, aux_loss=False)), (1, 3, 128, 128)),
        "tv_lraspp_mobilenet": lambda: (Out(segmentation.lraspp_mobilenet_v3_large(**none)),
                                        (1, 3, 128, 128)),
        "tv_fcn_resnet50": lambda: (Out(segmentation.fcn_resnet50(**none, aux_loss=False)),
                                    (1, 3, 96, 96)),
        "tv_retinanet_heads": lambda: (BackboneAndHead(detection.retinanet_resnet50_fpn(
            **none)), (1, 3, 128, 128)),
        "tv_fcos_heads": lambda: (BackboneAndHead(detection.fcos_resnet50_fpn(**none)),
                                  (1, 3, 128, 128)),
        "tv_r3d_18": lambda: (video.r3d_18(weights=None), (1, 3, 8, 64, 64)),
        "tv_mc3_18": lambda: (video.mc3_18(weights=None), (1, 3, 8, 64, 64)),
        "tv_r2plus1d_18": lambda: (video.r2plus1d_18(weights=None), (1, 3, 8, 64, 64)),
        "tv_s3d": lambda: (video.s3d(weights=None), (1, 3, 16, 224, 224)),
        "tv_swin3d_t": lambda: (video.swin3d_t(weights=None), (1, 3, 8, 112, 112)),
        "tv_mvit_v2_s": lambda: (video.mvit_v2_s(weights=None), (1, 3, 16, 224, 224)),
        "tv_raft_small": lambda: (TwoFrames(optical_flow.raft_small(weights=None)),
                                  (1, 6, 128, 128)),
    })
    return models


def timm_models() -> dict[str, Callable[[], tuple[Any, tuple[int, ...]]]]:
    """The smallest model (by parameters, counted on the meta device) of each timm module."""
    import timm
    import torch

    models = {}
    for module in timm.list_modules():
        best = None
        for name in timm.list_models(module=module)[:40]:
            try:
                config = timm.models.get_pretrained_cfg(name)
                size = config.input_size if config is not None else (3, 224, 224)
                if size[0] != 3 or max(size[1:]) > 256:
                    continue
                with torch.device("meta"):
                    count = sum(p.numel() for p in timm.create_model(name).parameters())
            except Exception:                   # a model that needs arguments: skip it
                continue
            if best is None or count < best[1]:
                best = (name, count, size[1])
        if best is not None:
            name, _, size = best
            models[f"timm_{module}"] = (lambda name=name, size=size: (
                timm.create_model(name, pretrained=False), (1, 3, size, size)))
    return models


def randomize_everything(model) -> None:
    """Seeded random BatchNorm statistics (infer.export.randomize) and random values for
    every parameter that holds one constant (layer scales, zero-initialised heads)."""
    import torch

    from infer.export import randomize

    randomize(model, 0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                if p.dim() > 1 or float(flat[0]) == 0.0:
                    p.copy_((torch.rand(p.shape, generator=generator) - 0.5) * 0.4)
                else:
                    p.copy_(torch.rand(p.shape, generator=generator) + 0.5)


def export(folder: Path, names: list[str]) -> None:
    import torch

    from infer.export import export_module

    models = {**torchvision_models(), **timm_models()}
    for name in names or list(models):
        out = folder / name
        if (out / "output.npy").exists():
            continue
        start = time.perf_counter()
        try:
            torch.manual_seed(0)
            model, shape = models[name]()
            model.eval()
            randomize_everything(model)
            x = torch.rand(shape)
            with torch.no_grad():
                y = model(x)
            out.mkdir(parents=True, exist_ok=True)
            export_module(model, (x,), out, name)
            np.save(out / "input.npy", x.numpy())
            np.save(out / "output.npy", y.numpy())
            print(f"{name:32s} exported in {time.perf_counter() - start:.0f} s", flush=True)
        except Exception as exc:                # pnnx or tracing failed: say so, go on
            print(f"{name:32s} not exported: {type(exc).__name__}: {str(exc)[:300]}",
                  flush=True)


def check(folder: Path, names: list[str]) -> int:
    from infer import RuntimeGraph

    failed = 0
    for out in sorted(p for p in folder.iterdir() if (p / "output.npy").exists()):
        if names and out.name not in names:
            continue
        x, want = np.load(out / "input.npy"), np.load(out / "output.npy")
        try:
            graph = RuntimeGraph(out / f"{out.name}.pnnx.param",
                                 out / f"{out.name}.pnnx.bin").build()
            (got,) = graph.forward(x)
            if got.shape != want.shape:
                raise ValueError(f"output shape {got.shape}, torch's {want.shape}")
            error = float(np.max(np.abs(got - want))) / (float(np.max(np.abs(want))) + 1e-30)
            verdict = "ok" if error <= TOLERANCE else "DIFFERS"
            print(f"{out.name:32s} {verdict:8s} relative error {error:.1e}", flush=True)
            failed += verdict != "ok"
        except Exception as exc:
            print(f"{out.name:32s} {'ERROR':8s} {type(exc).__name__}: {exc}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if len(sys.argv) < 3 or sys.argv[1] not in ("export", "check"):
        sys.exit(__doc__)
    action, where, chosen = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if action == "export":
        export(where, chosen)
    else:
        sys.exit(check(where, chosen))
