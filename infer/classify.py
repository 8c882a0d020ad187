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

Limits: what a user names may be hostile or a mistake, and ends in one ImageError or InferError
naming the file, never in a traceback, a hang or gigabytes of memory.

- Images are read by infer/images.py (regular files of at most 256 MiB, decoded into at most
  100 megapixels); model cards and labels files only if they are regular files (a FIFO or
  ``/dev/zero`` is refused without blocking: ``parser.files.read_file``) of at most
  MAX_CARD_BYTES (1 MiB) and MAX_LABELS_BYTES (4 MiB).
- A model.json is checked as a whole (``check_model_card``): one InferError lists every
  problem. ``param``, ``bin`` and ``labels`` name regular files, relative to the card;
  ``resize`` and ``crop`` are whole numbers from 1 to MAX_SIDE (4096), crop <= resize; ``mean``
  is three numbers within MEAN_RANGE, ``std`` three within STD_RANGE (so never 0, NaN or inf).
- The labels file holds one label per line, as many as the model has classes; the model returns
  one (1, classes) array (or (1, classes, 1, 1)) of finite numbers.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Sequence, TypeGuard

import numpy as np

from model_file import MODEL_DIR
from parser.errors import ImageError, InferError
from parser.files import MiB, check_regular, read_file
from infer.graph import RuntimeGraph
from infer.images import MAX_IMAGE_BYTES, MAX_PIXELS, as_rgb, read_image

__all__ = ["ImageClassifier", "Preprocess", "read_image", "as_rgb", "softmax", "read_labels",
           "read_model_card", "check_model_card", "shipped_models", "MODEL_DIR",
           "MAX_IMAGE_BYTES", "MAX_PIXELS", "ImageError"]

DEFAULT_MODEL = "efficientnet_lite0"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_ASPECT = 4        # longer images are cut to their centre 4:1 part first (centre_part)
MAX_CARD_BYTES = 1 * MiB
MAX_LABELS_BYTES = 4 * MiB
MAX_SIDE = 4096                   # resize and crop; (1, 3, 4096, 4096) float32 is 200 MB
MEAN_RANGE = (-1000.0, 1000.0)    # pixels are scaled to [0, 1] before mean and std apply
STD_RANGE = (0.0001, 1000.0)      # 1/255 (a model that wants 0..255) is well inside


@dataclass
class Preprocess:
    """How a model wants its pixels: shorter side resized, centre crop, per-channel mean/std.
    Values outside the limits of the module docstring are an InferError listing them."""

    resize: int = 256
    crop: int = 224
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD

    def __post_init__(self) -> None:
        problems = preprocess_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise InferError("Preprocess: " + "; ".join(problems))

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


def preprocess_problems(values: dict[str, object]) -> list[str]:
    """What is wrong with these Preprocess fields (a model card's "preprocess" object), one
    line each, or []: see the limits in the module docstring. Missing fields take Preprocess's
    defaults."""
    known = {f.name: f.default for f in fields(Preprocess)}
    problems = [f"{_shown(key)}: not a preprocessing setting (those are {', '.join(known)})"
                for key in values if key not in known]
    for key in ("resize", "crop"):
        if key in values and not _side(values[key]):
            problems.append(f"{key}: a whole number of pixels from 1 to {MAX_SIDE}, got "
                            f"{_shown(values[key])}")
    for key, (low, high) in (("mean", MEAN_RANGE), ("std", STD_RANGE)):
        if key in values and not _three_numbers(values[key], low, high):
            problems.append(f"{key}: three numbers (R, G, B) from {low:g} to {high:g}, got "
                            f"{_shown(values[key])}")
    resize, crop = values.get("resize", known["resize"]), values.get("crop", known["crop"])
    if _side(resize) and _side(crop) and crop > resize:
        problems.append(f"crop: {crop} is larger than resize ({resize}): the crop is cut from "
                        f"the image resized to that shorter side")
    return problems


def _side(value: object) -> TypeGuard[int]:
    """A whole number (not a bool) from 1 to MAX_SIDE."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and bool(1 <= value <= MAX_SIDE))


def _three_numbers(value: object, low: float, high: float) -> bool:
    """A list, tuple or 1-d array of three real numbers from ``low`` to ``high`` (NaN is not)."""
    if isinstance(value, np.ndarray) and value.ndim != 1:
        return False
    if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != 3:
        return False
    return all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
               and low <= v <= high for v in value)


def _shown(value: object) -> str:
    """``value`` for a message: its repr, cut short (a model card may hold anything)."""
    return reprlib.repr(value)


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)): probabilities from logits, without overflow."""
    shifted = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def read_labels(path: str | Path) -> list[str]:
    """One label per line of a UTF-8 text file (trailing blank lines dropped); an InferError
    naming the file if it cannot be read (see ``read_file``), is not text, or holds no label."""
    data = read_file(path, MAX_LABELS_BYTES,
                     lambda message: InferError(f"{path}: cannot read the labels: {message}"))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InferError(f"{path}: the labels are not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
    labels = [line.removesuffix("\r") for line in text.split("\n")]
    while labels and not labels[-1].strip():
        labels.pop()
    if not labels:
        raise InferError(f"{path}: the labels file holds no labels (one per line)")
    return labels


CARD_FILES = {"param": "the .pnnx.param file", "bin": "the .pnnx.bin file",
              "labels": "the labels file"}


def read_model_card(path: Path) -> dict:
    """A model.json (see the module docstring), read and checked as a whole: an InferError
    naming the file lists every problem ``check_model_card`` finds."""
    data = read_file(path, MAX_CARD_BYTES,
                     lambda message: InferError(f"{path}: cannot read the model card: {message}"))
    try:
        card = json.loads(data.decode("utf-8-sig"))
    except (ValueError, RecursionError) as exc:          # UnicodeDecodeError is a ValueError
        raise InferError(f"{path}: the model card is not JSON: {exc}") from None
    problems = check_model_card(card, path.parent)
    if len(problems) == 1:
        raise InferError(f"{path}: {problems[0]}")
    if problems:
        raise InferError(f"{path}: {len(problems)} problems in this model card:\n  "
                         + "\n  ".join(problems))
    return card


def check_model_card(card: object, folder: Path) -> list[str]:
    """Every problem of a parsed model.json whose files are relative to ``folder``, one line
    each, or [] for a card ImageClassifier can use. Keys it does not know (``name``,
    ``description``) are left alone."""
    if not isinstance(card, dict):
        return [f"a model card is a JSON object with the keys {', '.join(CARD_FILES)}, this "
                f"one is {_shown(card)}"]
    problems = [problem for key in CARD_FILES
                for problem in [_file_problem(card, key, folder)] if problem]
    if not isinstance(card.get("outputs_probabilities", False), bool):
        problems.append(f"outputs_probabilities: true or false, got "
                        f"{_shown(card['outputs_probabilities'])}")
    preprocess = card.get("preprocess", {})
    if not isinstance(preprocess, dict):
        return problems + [f"preprocess: an object with some of the keys "
                           f"{', '.join(f.name for f in fields(Preprocess))}, got "
                           f"{_shown(preprocess)}"]
    return problems + [f"preprocess.{problem}" for problem in preprocess_problems(preprocess)]


def _file_problem(card: dict, key: str, folder: Path) -> str | None:
    """What is wrong with the file the card names under ``key``, or None: it must be a
    non-empty path, relative to the card, of a regular file."""
    if key not in card:
        return f"{key}: missing ({CARD_FILES[key]}, as a path relative to the model card)"
    name = card[key]
    if not isinstance(name, str) or not name.strip() or "\0" in name:
        return f"{key}: {CARD_FILES[key]} as a path relative to the model card, got {_shown(name)}"
    try:
        check_regular(folder / name, InferError)
    except InferError as err:
        return f"{key}: {_shown(name)}: {err}"
    return None


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
        if _kind(path) is None:
            for name in (str(model), str(model).replace("-", "_")):
                if name and _kind(MODEL_DIR / name / "model.json"):
                    path = MODEL_DIR / name
                    break
        if _kind(path) == "folder":
            if _kind(path / "model.json"):
                return cls._from_folder(path)
            params = sorted(path.glob("*.pnnx.param"))
            if len(params) != 1:
                raise InferError(f"{path}: a model folder holds a model.json or one .pnnx.param "
                                 f"file, this one {len(params)} .pnnx.param files and no "
                                 f"model.json")
            path = params[0]
        if path.suffix == ".param" and _kind(path):
            card = path.parent / "model.json"
            if _kind(card) and read_model_card(card)["param"] == path.name:
                return cls._from_folder(path.parent)
            # a bare model: ImageNet labels and torchvision's preprocessing
            labels = read_labels(MODEL_DIR / "imagenet_classes.txt")
            return cls(RuntimeGraph(path).build(), labels)
        raise InferError(f"no model {_shown(str(model))}: give a .pnnx.param path, a folder "
                         f"with a model.json, or one of the shipped models: "
                         f"{', '.join(shipped_models())}")

    @classmethod
    def _from_folder(cls, folder: Path) -> "ImageClassifier":
        card = read_model_card(folder / "model.json")
        labels = read_labels(folder / card["labels"])
        graph = RuntimeGraph(folder / card["param"], folder / card["bin"]).build()
        return cls(graph, labels, Preprocess(**card.get("preprocess", {})),
                   card.get("outputs_probabilities", False), folder / "model.json")

    def probabilities(self, image_rgb: np.ndarray) -> np.ndarray:
        """(classes,) class probabilities for one RGB image: the softmax of the model's
        output, or the output itself if the card says ``outputs_probabilities``."""
        scores = self._scores(self.graph.forward(self.preprocess(image_rgb)))
        return scores if self.outputs_probabilities else softmax(scores)

    def _scores(self, outputs: list[np.ndarray]) -> np.ndarray:
        """The model's one output as (classes,) float64. An InferError unless it is one (1,
        classes) array of finite numbers, or (1, classes, 1, 1) as from a 1x1 convolution
        head; probabilities (``outputs_probabilities``) must also lie in [0, 1]."""
        shape = outputs[0].shape if len(outputs) == 1 else ()
        if (len(shape) < 2 or shape[0] != 1 or shape[1] < 1 or any(d != 1 for d in shape[2:])
                or outputs[0].dtype.kind not in "fiu"):
            raise InferError(f"{self.graph.param_path}: a classifier returns one (1, classes) "
                             f"array of numbers, this model returns "
                             f"{_shown([f'{o.shape} {o.dtype}' for o in outputs])}")
        scores = outputs[0].reshape(-1).astype(np.float64)                   # (classes,)
        if not np.isfinite(scores).all():
            raise InferError(f"{self.graph.param_path}: the model's output holds NaN or "
                             f"infinity (damaged weights, or inputs it was not made for)")
        if self.outputs_probabilities and not ((scores >= 0) & (scores <= 1 + 1e-6)).all():
            raise InferError(f"{self.card or self.graph.param_path}: outputs_probabilities is "
                             f"set, but the model returns values outside [0, 1] (from "
                             f"{scores.min():g} to {scores.max():g})")
        return scores

    def classify(self, image: str | Path | np.ndarray, top: int = 5) -> list[tuple[str, float]]:
        """The ``top`` (at least 1) most likely (label, probability) pairs, best first. An
        ImageError if ``image`` cannot be read or used, an InferError if the model's classes
        and the labels do not match one to one."""
        if not isinstance(top, (int, np.integer)) or isinstance(top, bool) or top < 1:
            raise InferError(f"top: a whole number of at least 1, got {_shown(top)}")
        image_rgb = read_image(image) if isinstance(image, (str, Path)) else image
        probs = self.probabilities(image_rgb)
        self._check_labels(len(probs))
        best = np.argsort(-probs, kind="stable")[:top]
        return [(self.labels[i], float(probs[i])) for i in best]

    def _check_labels(self, classes: int) -> None:
        """Labels and classes pair by position: a count that differs (a labels file of another
        model, or shifted by one) would name every answer wrongly, so it is an InferError."""
        if len(self.labels) == classes:
            return
        if self.card is not None:
            raise InferError(f"{self.card}: its labels file has {len(self.labels)} labels, but "
                             f"the model gives {classes} classes")
        raise InferError(f"{self.graph.param_path}: the model gives {classes} classes, but "
                         f"there are {len(self.labels)} labels (a model without a model.json "
                         f"gets the ImageNet labels: write one naming its labels file)")


def _kind(path: Path) -> str | None:
    """"folder", "file" (or anything else that is there), or None: nothing there, or a path
    the system cannot look up at all (a name too long, a NUL byte)."""
    try:
        return "folder" if path.is_dir() else "file" if path.exists() else None
    except (OSError, ValueError):
        return None
