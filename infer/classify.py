"""Image classification with a shipped model: opencv preprocessing, a forward pass, softmax.

A model in ``model_file/NAME/`` is described by its ``model.json``:

    {"param": "efficientnet_lite0.pnnx.param", "bin": "efficientnet_lite0.pnnx.bin",
     "labels": "../imagenet_classes.txt",
     "preprocess": {"resize": 256, "crop": 224, "mean": [0.485, 0.456, 0.406],
                    "std": [0.229, 0.224, 0.225]}}

Preprocessing, as torchvision's classification presets do it: read as RGB, resize so the shorter
side is ``resize``, cut the centre ``crop`` x ``crop`` square, scale to [0, 1], subtract ``mean``
and divide by ``std`` per channel, and lay out as (1, 3, crop, crop). (An image longer than 4:1
is first cut to its centre 4:1 part, which holds the crop: see ``centre_part``.)
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from model_file import MODEL_DIR
from parser.errors import ImageError, InferError
from infer.graph import RuntimeGraph

DEFAULT_MODEL = "efficientnet_lite0"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_ASPECT = 4        # longer images are cut to their centre 4:1 part first (centre_part)


@dataclass
class Preprocess:
    """How a model wants its pixels: shorter side resized, centre crop, per-channel mean/std."""

    resize: int = 256
    crop: int = 224
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD

    def __call__(self, image_rgb: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 RGB (or grey / RGBA, see ``as_rgb``) -> (1, 3, crop, crop) float32."""
        import cv2

        image_rgb = centre_part(as_rgb(image_rgb), MAX_ASPECT)
        h, w = image_rgb.shape[:2]
        scale = self.resize / min(h, w)
        size = (max(self.crop, round(w * scale)), max(self.crop, round(h * scale)))
        shrinking = scale < 1
        resized = cv2.resize(image_rgb, size,
                             interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
        top = (resized.shape[0] - self.crop) // 2
        left = (resized.shape[1] - self.crop) // 2
        crop = resized[top:top + self.crop, left:left + self.crop]          # (crop, crop, 3)
        x = crop.astype(np.float32) / 255.0
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1)[None])             # (1, 3, crop, crop)


def centre_part(image: np.ndarray, max_aspect: float) -> np.ndarray:
    """The centre of ``image`` whose long side is at most ``max_aspect`` times the short side
    (a view). Resizing the short side of a 1 x 40000 banner to 256 would make a 256 x 10
    million image (8 GB) only to keep its centre 224 x 224; the centre part gives the same crop
    (up to a sub-pixel shift from rounding the resized size)."""
    h, w = image.shape[:2]
    if max(h, w) <= min(h, w) * max_aspect:
        return image
    limit = math.ceil(min(h, w) * max_aspect)
    top, left = max(h - limit, 0) // 2, max(w - limit, 0) // 2
    return image[top:top + limit, left:left + limit]


def read_image(path: str | Path) -> np.ndarray:
    """An image file as (H, W, 3) uint8 RGB (opencv reads BGR; grey and alpha are converted).
    An ImageError says why not: no such file, a folder, not readable, empty, or bytes OpenCV
    cannot decode. The file is read here and decoded with ``cv2.imdecode`` with OpenCV's log
    quiet, so OpenCV's own warnings ("can't open/read file", "PNG input buffer is
    incomplete") do not reach the terminal beside the error."""
    import cv2

    try:
        data = np.fromfile(str(path), np.uint8)                       # (bytes,)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ImageError(f"{path}: is a folder, not an image file") from None
    except OSError as exc:
        raise ImageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if data.size == 0:
        raise ImageError(f"{path}: empty file")
    with _opencv_quiet():
        image = cv2.imdecode(data, cv2.IMREAD_COLOR)                  # (H, W, 3) BGR
    if image is None:
        raise ImageError(f"{path}: cannot decode this file as an image (damaged, or not a "
                         f"format OpenCV reads: png, jpg, bmp, tiff, webp, ...)")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


@contextmanager
def _opencv_quiet() -> Iterator[None]:
    """OpenCV's log at errors only for the length of the block (its warnings go straight to
    stderr; the caller reports the failure itself)."""
    from cv2.utils import logging as cv_log

    level = cv_log.getLogLevel()
    cv_log.setLogLevel(min(level, cv_log.LOG_LEVEL_ERROR))
    try:
        yield
    finally:
        cv_log.setLogLevel(level)


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An image array as (H, W, 3) uint8 RGB, as ``read_image`` gives it: grey (H, W) or
    (H, W, 1) is repeated to three channels, RGBA (H, W, 4) loses its alpha. Other shapes and
    other dtypes (a float image in [0, 1] would silently be scaled wrong) are an ImageError."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        kind = image.dtype if isinstance(image, np.ndarray) else type(image).__name__
        raise ImageError(f"expects a uint8 image array (0..255), got {kind}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or 0 in image.shape:
        raise ImageError(f"expects an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image, got "
                         f"shape {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return image[:, :, :3]


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)): probabilities from logits, without overflow."""
    shifted = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def read_labels(path: str | Path) -> list[str]:
    """One label per line; InferError if the file cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InferError(f"{path}: cannot read the labels: {exc}") from None
    return [line.rstrip("\n") for line in text.splitlines()]


CARD_KEYS = ("param", "bin", "labels")


def read_model_card(path: Path) -> dict:
    """A model.json (see the module docstring), checked: it must be a JSON object with the
    keys ``param``, ``bin`` and ``labels``, and ``preprocess`` may hold only Preprocess's
    fields. Anything else is an InferError naming the file."""
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InferError(f"{path}: cannot read the model card: {exc}") from None
    if not isinstance(card, dict) or any(key not in card for key in CARD_KEYS):
        raise InferError(f"{path}: a model card is a JSON object with the keys "
                         f"{', '.join(CARD_KEYS)}")
    preprocess, known = card.get("preprocess", {}), [f.name for f in fields(Preprocess)]
    if not isinstance(preprocess, dict) or not set(preprocess) <= set(known):
        raise InferError(f"{path}: preprocess must be an object with some of the keys "
                         f"{', '.join(known)}, got {preprocess!r}")
    return card


def shipped_models() -> list[str]:
    """The names of the models in model_file/ (each folder with a model.json)."""
    return sorted(p.parent.name for p in MODEL_DIR.glob("*/model.json"))


@dataclass
class ImageClassifier:
    """A classification model with its labels and preprocessing. ``card`` is the model.json
    they came from, None when a bare model fell back to ImageNet labels and Preprocess()."""

    graph: RuntimeGraph
    labels: list[str]
    preprocess: Preprocess = field(default_factory=Preprocess)
    outputs_probabilities: bool = False
    card: Path | None = None

    @classmethod
    def load(cls, model: str | Path = DEFAULT_MODEL) -> "ImageClassifier":
        """A model by name (a folder of model_file/, ``efficientnet-lite0`` or
        ``efficientnet_lite0``), by folder (with a model.json, or holding one .pnnx.param),
        or by .pnnx.param path. A model without a model.json gets ImageNet labels and
        torchvision's preprocessing (``card`` is None then)."""
        path = Path(model)
        if not path.exists():
            for name in (str(model), str(model).replace("-", "_")):
                if name and (MODEL_DIR / name / "model.json").exists():
                    path = MODEL_DIR / name
                    break
        if path.is_dir():
            if (path / "model.json").exists():
                return cls._from_folder(path)
            params = sorted(path.glob("*.pnnx.param"))
            if len(params) != 1:
                raise InferError(f"{path}: a model folder holds a model.json or one .pnnx.param "
                                 f"file, this one {len(params)} .pnnx.param files and no "
                                 f"model.json")
            path = params[0]
        if path.suffix == ".param" and path.exists():
            card = path.parent / "model.json"
            if card.exists() and read_model_card(card)["param"] == path.name:
                return cls._from_folder(path.parent)
            # a bare model: ImageNet labels and torchvision's preprocessing
            labels = read_labels(MODEL_DIR / "imagenet_classes.txt")
            return cls(RuntimeGraph(path).build(), labels)
        raise InferError(f"no model {str(model)!r}: give a .pnnx.param path, a folder with a "
                         f"model.json, or one of the shipped models: "
                         f"{', '.join(shipped_models())}")

    @classmethod
    def _from_folder(cls, folder: Path) -> "ImageClassifier":
        card = read_model_card(folder / "model.json")
        labels = read_labels(folder / card["labels"])
        graph = RuntimeGraph(folder / card["param"], folder / card["bin"]).build()
        return cls(graph, labels, Preprocess(**card.get("preprocess", {})),
                   card.get("outputs_probabilities", False), folder / "model.json")

    def probabilities(self, image_rgb: np.ndarray) -> np.ndarray:
        """(num_classes,) class probabilities for one RGB image."""
        outputs = self.graph.forward(self.preprocess(image_rgb))
        if len(outputs) != 1 or outputs[0].shape[0] != 1:
            raise InferError(f"{self.graph.param_path}: a classifier returns one (1, classes) "
                             f"array, this model returns shapes {[o.shape for o in outputs]}")
        scores = outputs[0].reshape(-1)                                      # (classes,)
        return scores if self.outputs_probabilities else softmax(scores)

    def classify(self, image: str | Path | np.ndarray, top: int = 5) -> list[tuple[str, float]]:
        """The ``top`` most likely (label, probability) pairs, best first."""
        image_rgb = read_image(image) if isinstance(image, (str, Path)) else image
        probs = self.probabilities(image_rgb)
        best = np.argsort(-probs, kind="stable")[:top]
        return [(self._label(i), float(probs[i])) for i in best]

    def _label(self, index: int) -> str:
        return self.labels[index] if index < len(self.labels) else f"class {index}"
