"""MTCNN in torch, for tests/models/test_detect.py: the networks with the shipped weights, and
the detection pipeline written again with torch tensors, independently of infer/detect.py.

The networks are the torch modules of model_file/mtcnn/export_mtcnn.py, loaded with the weights
read back out of the shipped ``.pnnx.bin`` files (``shipped_networks``): the bin holds each
parameter under ``<module name>.<parameter name>``, the names of the state dicts, so no download
is needed and the test runs wherever the repository is. That the bin files hold facenet-pytorch's
weights themselves is checked against the wheel where it is at hand (``find_wheel``).

The pipeline (``detect``) follows facenet-pytorch's ``detect_face`` for one image: the same
pyramid, thresholds, NMS and box calibration, with the box arithmetic in float64 (as the original
MATLAB and numpy code; facenet-pytorch's float32 floors 9 / 0.6 to 14). ``resample`` chooses the
resizing: "torch" is facenet-pytorch's ``interpolate(mode="area")``, "opencv" the runtime's
``cv2.INTER_AREA``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from parser.bin import PnnxBin
from parser.param import read_param
from support import REPO

MTCNN_DIR = REPO / "model_file" / "mtcnn"
WHEEL_NAME = "facenet_pytorch-2.6.0-py3-none-any.whl"


def export_script():
    """model_file/mtcnn/export_mtcnn.py as a module (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("export_mtcnn", MTCNN_DIR / "export_mtcnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bin_state_dict(name: str) -> dict[str, torch.Tensor]:
    """Every weight of ``model_file/mtcnn/<name>.pnnx.bin``, by ``<operator>.<attribute>``."""
    graph = read_param(MTCNN_DIR / f"{name}.pnnx.param")
    with PnnxBin(MTCNN_DIR / f"{name}.pnnx.bin", in_memory=True) as weights:
        return {f"{op.name}.{attr.name}": torch.tensor(weights.read(f"{op.name}.{attr.name}",
                                                                    attr.shape, attr.dtype))
                for op in graph.operators for attr in op.attrs.values()}


def shipped_networks() -> dict[str, torch.nn.Module]:
    """{"pnet": PNet, ...} of export_mtcnn.py with the weights of the shipped bin files."""
    script = export_script()
    nets = {}
    for name, make in script.MODULES.items():
        module = make()
        module.load_state_dict(bin_state_dict(name))        # strict: every name must match
        nets[name] = module.eval()
    return nets


def find_wheel() -> Path | None:
    """The facenet-pytorch wheel, if at hand: $FACENET_PYTORCH_WHEEL, or in /tmp/dl/ or
    /tmp/wheels/ (where model_file/NOTICE.md downloads it)."""
    for candidate in (os.environ.get("FACENET_PYTORCH_WHEEL"), f"/tmp/dl/{WHEEL_NAME}",
                      f"/tmp/wheels/{WHEEL_NAME}"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


# ----------------------------------------------------------------------------- the pipeline
def resize(x: torch.Tensor, size: tuple[int, int], resample: str) -> torch.Tensor:
    """(N, 3, h, w) float32 -> (N, 3, *size)."""
    if resample == "torch":
        return F.interpolate(x, size=size, mode="area")
    import cv2

    pixels = x[0].permute(1, 2, 0).numpy()
    out = cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(out).permute(2, 0, 1)[None]


def scaled(x: torch.Tensor) -> torch.Tensor:
    return (x - 127.5) * 0.0078125


def torch_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float, mode: str = "union",
              plus_one: float = 0.0) -> torch.Tensor:
    """Greedy NMS (torchvision's with plus_one 0; facenet-pytorch's nms_numpy with 1), written
    as a loop over a precomputed overlap matrix: indices kept, best first."""
    order = torch.sort(scores, descending=True, stable=True).indices
    b = boxes[order]
    area = (b[:, 2] - b[:, 0] + plus_one) * (b[:, 3] - b[:, 1] + plus_one)
    lo = torch.maximum(b[:, None, :2], b[None, :, :2])
    hi = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = (hi - lo + plus_one).clamp(min=0).prod(dim=2)
    if mode == "union":
        overlap = inter / (area[:, None] + area[None, :] - inter)
    else:
        overlap = inter / torch.minimum(area[:, None], area[None, :])
    alive = torch.ones(len(b), dtype=torch.bool)
    kept = []
    for i in range(len(b)):
        if alive[i]:
            kept.append(i)
            alive &= overlap[i] <= threshold
    return order[torch.tensor(kept, dtype=torch.long)]


def bbreg(boxes: torch.Tensor, offsets: torch.Tensor, plus_one: float) -> torch.Tensor:
    w = boxes[:, 2] - boxes[:, 0] + plus_one
    h = boxes[:, 3] - boxes[:, 1] + plus_one
    return boxes + offsets * torch.stack([w, h, w, h], dim=1)


def rerec(boxes: torch.Tensor) -> torch.Tensor:
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    side = torch.maximum(w, h)
    x1 = boxes[:, 0] + w * 0.5 - side * 0.5
    y1 = boxes[:, 1] + h * 0.5 - side * 0.5
    return torch.stack([x1, y1, x1 + side, y1 + side], dim=1)


def crop_batch(image: torch.Tensor, boxes: torch.Tensor, size: int, resample: str):
    """facenet-pytorch's pad + crop: corners truncated, 1-based, clipped to the image."""
    h, w = image.shape[2:]
    c = boxes.trunc().long()
    x, y = c[:, 0].clamp(min=1), c[:, 1].clamp(min=1)
    ex, ey = c[:, 2].clamp(max=w), c[:, 3].clamp(max=h)
    kept = [k for k in range(len(boxes)) if ey[k] > y[k] - 1 and ex[k] > x[k] - 1]
    crops = [resize(image[:, :, y[k] - 1:ey[k], x[k] - 1:ex[k]], (size, size), resample)
             for k in kept]
    return scaled(torch.cat(crops)), torch.tensor(kept, dtype=torch.long)


@torch.no_grad()
def detect(image_rgb: np.ndarray, nets: dict, resample: str = "torch", min_face_size=20,
           factor=0.709, thresholds=(0.6, 0.7, 0.7)):
    """-> boxes (K, 4), scores (K,), landmarks (K, 5, 2), numpy float64, best first."""
    image = torch.from_numpy(np.ascontiguousarray(image_rgb)).permute(2, 0, 1)[None].float()
    h, w = image.shape[2:]
    m = 12.0 / min_face_size
    minl = min(h, w) * m
    scales = []
    while minl >= 12:
        scales.append(m)
        m, minl = m * factor, minl * factor

    # stage 1
    all_boxes, all_scores, all_reg = [], [], []
    for scale in scales:
        x = scaled(resize(image, (int(h * scale + 1), int(w * scale + 1)), resample))
        prob, reg = nets["pnet"](x)
        probs = prob[0, 1]
        mask = probs >= thresholds[0]
        rows, cols = mask.nonzero(as_tuple=True)
        bb = torch.stack([cols, rows], dim=1).double()
        q1 = ((2 * bb + 1) / scale).floor()
        q2 = ((2 * bb + 12) / scale).floor()
        boxes = torch.cat([q1, q2], dim=1)
        scores = probs[mask].double()
        offsets = reg[0][:, mask].T.double()
        pick = torch_nms(boxes, scores, 0.5)
        all_boxes.append(boxes[pick])
        all_scores.append(scores[pick])
        all_reg.append(offsets[pick])
    empty = (np.zeros((0, 4)), np.zeros(0), np.zeros((0, 5, 2)))
    if not scales:
        return empty
    boxes, scores, reg = torch.cat(all_boxes), torch.cat(all_scores), torch.cat(all_reg)
    pick = torch_nms(boxes, scores, 0.7)
    boxes = rerec(bbreg(boxes[pick], reg[pick], 0.0))
    if not len(boxes):
        return empty

    # stage 2
    crops, kept = crop_batch(image, boxes, 24, resample)
    prob, reg = (t.double() for t in nets["rnet"](crops))
    ipass = prob[:, 1] > thresholds[1]
    boxes, scores, reg = boxes[kept][ipass], prob[ipass, 1], reg[ipass]
    pick = torch_nms(boxes, scores, 0.7)
    boxes = rerec(bbreg(boxes[pick], reg[pick], 1.0))
    if not len(boxes):
        return empty

    # stage 3
    crops, kept = crop_batch(image, boxes, 48, resample)
    prob, reg, points = (t.double() for t in nets["onet"](crops))
    ipass = prob[:, 1] > thresholds[2]
    boxes, scores, reg, points = boxes[kept][ipass], prob[ipass, 1], reg[ipass], points[ipass]
    bw = boxes[:, 2] - boxes[:, 0] + 1
    bh = boxes[:, 3] - boxes[:, 1] + 1
    px = bw[:, None] * points[:, :5] + boxes[:, :1] - 1
    py = bh[:, None] * points[:, 5:] + boxes[:, 1:2] - 1
    landmarks = torch.stack([px, py], dim=2)
    boxes = bbreg(boxes, reg, 1.0)
    pick = torch_nms(boxes, scores, 0.7, mode="min", plus_one=1.0)
    return boxes[pick].numpy(), scores[pick].numpy(), landmarks[pick].numpy()
