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
  one (1, classes) array (or (1, classes, 1, 1)) of finite numbers, (N, classes) for N images.

Many images (``python -m infer classify DIR``): ``list_images`` lists a folder's image files,
``ImageClassifier.classify_many`` reads and preprocesses them in a pool of threads while the
calling thread runs the model on batches of N stacked images (the graph plans each batch size
once), and yields one ``Classified`` per image, in order; ``csv_header`` / ``csv_row`` make the
CSV. infer/cluster.py runs the same ``classify_many`` on the workers of a Ray cluster.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import reprlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence, TypeGuard

import numpy as np

from model_file import MODEL_DIR
from parser.errors import ImageError, InferError
from parser.files import MiB, check_regular, read_file
from infer import images
from infer.graph import RuntimeGraph
from infer.images import MAX_IMAGE_BYTES, MAX_PIXELS, as_rgb, read_image

__all__ = ["ImageClassifier", "Classified", "Preprocess", "read_image", "as_rgb", "softmax",
           "read_labels", "read_model_card", "check_model_card", "shipped_models",
           "list_images", "image_paths", "csv_header", "csv_row", "IMAGE_EXTENSIONS", "MODEL_DIR",
           "MAX_IMAGE_BYTES", "MAX_PIXELS", "ImageError"]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "efficientnet_lite0"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_ASPECT = 4        # longer images are cut to their centre 4:1 part first (centre_part)
MAX_CARD_BYTES = 1 * MiB
MAX_LABELS_BYTES = 4 * MiB
MAX_SIDE = 4096                   # resize and crop; (1, 3, 4096, 4096) float32 is 200 MB
MEAN_RANGE = (-1000.0, 1000.0)    # pixels are scaled to [0, 1] before mean and std apply
STD_RANGE = (0.0001, 1000.0)      # 1/255 (a model that wants 0..255) is well inside
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")   # any case


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
        probs: np.ndarray = self.batch_probabilities(self.preprocess(image_rgb))[0]
        return probs

    def batch_probabilities(self, x: np.ndarray) -> np.ndarray:
        """(N, classes) class probabilities for N preprocessed images stacked as
        (N, 3, crop, crop): one forward pass, each row what that image alone would give
        (up to float rounding: a batch may sum in another order)."""
        scores = self._scores(self.graph.forward(x), len(x))
        return scores if self.outputs_probabilities else softmax(scores)

    def _scores(self, outputs: list[np.ndarray], count: int = 1) -> np.ndarray:
        """The model's one output for ``count`` images as (count, classes) float64. An
        InferError unless it is one (count, classes) array of finite numbers, or (count,
        classes, 1, 1) as from a 1x1 convolution head; probabilities
        (``outputs_probabilities``) must also lie in [0, 1]."""
        shape = outputs[0].shape if len(outputs) == 1 else ()
        if (len(shape) < 2 or shape[0] != count or shape[1] < 1
                or any(d != 1 for d in shape[2:]) or outputs[0].dtype.kind not in "fiu"):
            raise InferError(f"{self.graph.param_path}: a classifier returns one ({count}, "
                             f"classes) array of numbers, this model returns "
                             f"{_shown([f'{o.shape} {o.dtype}' for o in outputs])}")
        scores = outputs[0].reshape(count, -1).astype(np.float64)            # (N, classes)
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
        _check_count("top", top)
        image_rgb = read_image(image) if isinstance(image, (str, Path)) else image
        return self._best(self.probabilities(image_rgb), top)

    def _best(self, probs: np.ndarray, top: int) -> list[tuple[str, float]]:
        """The ``top`` (label, probability) pairs of (classes,) ``probs``, best first."""
        self._check_labels(len(probs))
        best = np.argsort(-probs, kind="stable")[:top]
        return [(self.labels[i], float(probs[i])) for i in best]

    def classify_many(self, paths: Iterable[str | Path], top: int = 5, batch: int = 8,
                      threads: int = 2) -> Iterator[Classified]:
        """One ``Classified`` per path, in the order of ``paths``: what ``classify(path, top)``
        gives (up to float rounding), or the ImageError of an image that cannot be read or
        used (the others go on).

        ``threads`` threads read and preprocess the images (``read_image``, then
        ``preprocess``: OpenCV works outside Python's lock) while the calling thread runs the
        model on ``batch`` images at a time, stacked as (batch, 3, crop, crop); the last
        batch may be smaller (the graph plans each batch size once and keeps the plan), and
        so may one among many bad files. At most 2 * batch + threads images are read ahead,
        and as many wait for their batch, so memory stays bounded however many paths there
        are. A model traced at batch 1 (exported without ``--dynamic``: its shapes may hold
        the 1) runs one image at a time. OpenCV's log is quiet for the whole job (the
        threads' own switching of it would otherwise race). An InferError (the model's
        output, the memory budget) ends the job."""
        _check_count("top", top)
        _check_count("batch", batch)
        _check_count("threads", threads)
        traced = (getattr(self.graph, "input_shapes", None) or [None])[0]
        if batch > 1 and traced and traced[0] == 1:
            log.info("%s was traced at batch 1: one image per forward pass",
                     self.graph.param_path)
            batch = 1
        waiting = iter([paths] if isinstance(paths, (str, Path)) else paths)
        most = 2 * batch + threads                                     # read ahead at most
        ahead: deque[tuple[str | Path, Future[np.ndarray]]] = deque()  # being read, in order
        group: list[tuple[str | Path, np.ndarray | ImageError]] = []     # read, not yet run
        pool = ThreadPoolExecutor(threads, thread_name_prefix="classify-read")
        try:
            with images._opencv_quiet():
                while True:
                    for path in itertools.islice(waiting, most - len(ahead)):
                        ahead.append((path, pool.submit(self._read, path)))
                    if not ahead:
                        break
                    path, future = ahead.popleft()
                    try:
                        group.append((path, future.result()))
                    except ImageError as err:
                        group.append((path, err))
                    images_read = sum(isinstance(x, np.ndarray) for _, x in group)
                    if images_read == batch or len(group) >= most:      # (many bad files)
                        yield from self._run_group(group, top)
                        group = []
                yield from self._run_group(group, top)
        finally:                     # also when the caller stops early (or Ctrl-C)
            pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, path: str | Path) -> np.ndarray:
        """One image file, read and preprocessed: (1, 3, crop, crop) float32."""
        return self.preprocess(read_image(path))

    def _run_group(self, group: list[tuple[str | Path, np.ndarray | ImageError]],
                   top: int) -> Iterator[Classified]:
        """The images of ``group`` in one forward pass, and a Classified for each entry."""
        arrays = [x for _, x in group if isinstance(x, np.ndarray)]
        probs = iter(self.batch_probabilities(np.concatenate(arrays)) if arrays else [])
        for path, x in group:                                # (N, 3, crop, crop) above
            if isinstance(x, ImageError):
                yield Classified(path, [], x)
            else:
                yield Classified(path, self._best(next(probs), top))

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


@dataclass(frozen=True)
class Classified:
    """One image of ``classify_many``: its path and its ``top`` (label, probability) pairs,
    best first; or, for an image that could not be read or used, no pairs and the error."""

    path: str | Path
    top: list[tuple[str, float]]
    error: ImageError | None = None


def _check_count(name: str, value: object) -> None:
    """An InferError unless ``value`` is a whole number (not a bool) of at least 1."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise InferError(f"{name}: a whole number of at least 1, got {_shown(value)}")


def list_images(folder: str | Path, recursive: bool = False,
                on_error: Callable[[ImageError], None] | None = None) -> list[Path]:
    """The image files of ``folder`` (names ending in IMAGE_EXTENSIONS, in any case), sorted
    by name; with ``recursive`` its subfolders' too, each folder's files before its
    subfolders, in os.walk's top-down order. Symbolic links are followed, but each folder is
    listed once: a link to a folder listed already (a loop, or a second way in) is skipped.
    A folder that cannot be read is an ImageError, raised, or given to ``on_error`` and
    skipped. What the listed files hold is not checked here (``read_image`` does that: a
    broken link or a FIFO named x.png is listed, and refused when read)."""
    def failed(exc: OSError) -> None:
        err = ImageError(f"{exc.filename}: cannot list this folder: {exc.strerror or exc}")
        if on_error is None:
            raise err
        on_error(err)

    found: list[Path] = []
    seen: set[tuple[int, int]] = set()                # (device, inode) of each folder listed
    for here, folders, files in os.walk(folder, onerror=failed, followlinks=True):
        try:
            info = os.stat(here)
        except OSError as exc:                        # removed since os.walk listed it
            failed(exc)
            continue
        if (info.st_dev, info.st_ino) in seen:
            log.info("%s: a folder listed already (a link loop, or a second way in): skipped",
                     here)
            folders.clear()
            continue
        seen.add((info.st_dev, info.st_ino))
        found += [Path(here, name) for name in sorted(files)
                  if name.lower().endswith(IMAGE_EXTENSIONS)]
        if recursive:
            folders.sort()                            # os.walk goes into them in this order
        else:
            folders.clear()
    return found


def image_paths(names: Iterable[str | Path], recursive: bool = False,
                on_error: Callable[[ImageError], None] | None = None) -> list[str | Path]:
    """What ``python -m infer classify NAME...`` classifies: each name of a folder replaced by
    its images (``list_images``), the other names kept as they are (``read_image`` says what
    is wrong with them, if anything). A folder that cannot be listed, or holds no images, is
    an ImageError, raised, or given to ``on_error`` and skipped."""
    errors: list[ImageError] = []

    def failed(err: ImageError) -> None:
        if on_error is None:
            raise err
        errors.append(err)
        on_error(err)

    paths: list[str | Path] = []
    for name in names:
        if _kind(Path(name)) != "folder":
            paths.append(name)
            continue
        reported = len(errors)
        found = list_images(name, recursive, failed)
        if not found and len(errors) == reported:           # (not: unreadable, said already)
            failed(ImageError(f"{name}: no images in this folder (files named *"
                              f"{', *'.join(IMAGE_EXTENSIONS)})"
                              + ("" if recursive else "; --recursive looks in its subfolders")))
        paths += found
    return paths


def csv_header(top: int) -> list[str]:
    """The CSV columns of ``classify_many``'s results: path, then label_i and score_i for
    the i-th best class, i from 1 to ``top``."""
    return ["path"] + [f"{column}_{i}" for i in range(1, top + 1)
                       for column in ("label", "score")]


def csv_row(result: Classified, top: int) -> list[str]:
    """One CSV row of ``csv_header(top)``'s columns for an image that was classified; a model
    with fewer than ``top`` classes leaves the last cells empty. Probabilities have 6
    decimals."""
    cells = [value for label, probability in result.top[:top]
             for value in (label, f"{probability:.6f}")]
    return [str(result.path)] + cells + [""] * (2 * top - len(cells))


def _kind(path: Path) -> str | None:
    """"folder", "file" (or anything else that is there), or None: nothing there, or a path
    the system cannot look up at all (a name too long, a NUL byte)."""
    try:
        return "folder" if path.is_dir() else "file" if path.exists() else None
    except (OSError, ValueError):
        return None
