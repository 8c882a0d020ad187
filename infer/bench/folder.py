"""The folder benchmark: images per second through ``python -m infer classify DIR``'s pipeline,
with this runtime and with onnxruntime doing the forward passes.

    python -m infer.bench --folder            # 300 generated images, EfficientNet-Lite0
    python -m infer.bench --folder --quick    # 16 images, the tiny model: a check, seconds

The same pipeline for both engines: ``ImageClassifier.classify_many`` (read_image and the
model's Preprocess in a pool of threads, batches of N images stacked, softmax, top 5), only
the classifier's graph differs: this runtime's RuntimeGraph, or ``OnnxGraph`` (worker.py), an
onnxruntime session of the same model (the benchmark's ONNX export, models.py) with
RuntimeGraph's ``forward``. The images are generated once into a scratch folder
(``make_images``: smooth random colours, sides of 256 to 1280 pixels, half PNG and half JPEG),
the same files for both. As in the rest of the benchmark, each engine runs in a worker process
of its own (worker.py, ``measure_folder`` there), every thread pool capped at ``--threads``
(the reading threads too), the engines take turns round after round, and the median is
reported. A worker first classifies one batch (planning that batch size, warming the caches),
then times one pass over the folder. Both engines' top-5 answers are compared: the same
labels, probabilities within 1e-4.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from infer.bench.models import MODELS, REPO, prepare
from infer.bench.run import Settings, run_worker

FOLDER_IMAGES = 300                 # --folder without a number
QUICK_IMAGES = 16                   # with --quick
FOLDER_MODELS = ("efficientnet_lite0",)
ENGINES = ("pnnx-infer", "onnxruntime")
TOLERANCE = 1e-4                    # |p_pnnx - p_onnxruntime| of each top-5 probability


def make_images(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` image files of random content in ``folder``: a few random colours on a coarse
    grid, smoothly enlarged (so they compress as photos do, not as noise), sides of 256 to
    1280 pixels, every other one a PNG, the others JPEGs of quality 90."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        height, width = (int(side) for side in rng.integers(256, 1281, 2))
        grid = rng.integers(0, 256, (int(rng.integers(3, 17)), int(rng.integers(3, 17)), 3),
                            dtype=np.uint8)
        image = cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)
        if i % 2 == 0:
            path = folder / f"image_{i:04d}.png"
            cv2.imwrite(str(path), image)
        else:
            path = folder / f"image_{i:04d}.jpg"
            cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        paths.append(path)
    return paths


@dataclass
class FolderRun:
    """One engine over all rounds."""

    engine: str
    rounds: list[dict] = field(default_factory=list)
    error: str | None = None

    @property
    def images_per_s(self) -> float:
        return statistics.median(r["images"] / r["seconds"] for r in self.rounds)


@dataclass
class FolderResults:
    model: str
    images: int
    batch: int
    threads: int
    runs: list[FolderRun]
    max_diff: float | None = None          # max |p_pnnx - p_onnxruntime| over every top-5
    same_labels: bool | None = None


def run_folder_benchmark(settings: Settings, count: int, say: Callable[[str], None] = print
                         ) -> list[FolderResults]:
    """Every model of ``settings`` on ``count`` generated images, at batch max(batches),
    each engine of ENGINES (that ``settings.engines`` names) in its worker, round after
    round."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pnnx_folder_") as scratch:
        workdir = Path(settings.workdir or scratch)
        folder = Path(scratch) / "images"
        made = time.perf_counter()
        make_images(folder, count)
        say(f"generated {count} images in {folder} ({time.perf_counter() - made:.1f} s)")
        engines = [e for e in ENGINES if e in settings.engines]
        batch = max(settings.batches)
        everything = []
        for name in settings.models:
            model = MODELS[name]
            say(f"preparing {name} (pnnx and ONNX files) in {workdir}")
            files = prepare(model, workdir / name, settings.onnx_exporter)
            labels, preprocess = _labels_and_preprocess(model)
            job = {"kind": "folder", "param": str(files.param), "bin": str(files.bin),
                   "onnx": str(files.onnx), "folder": str(folder), "labels": labels,
                   "preprocess": preprocess, "batch": batch, "threads": settings.threads}
            runs = {engine: FolderRun(engine) for engine in engines}
            for round_index in range(settings.rounds):
                shift = round_index % len(engines)
                for engine in engines[shift:] + engines[:shift]:
                    run = runs[engine]
                    if run.error:
                        continue
                    try:
                        report = run_worker({**job, "engine": engine}, None)
                    except RuntimeError as exc:
                        run.error = str(exc)
                        say(f"  {name} folder {engine}: FAILED {exc}")
                        continue
                    run.rounds.append(report)
                    say(f"  {name} folder of {count}, batch {batch}, round {round_index + 1}/"
                        f"{settings.rounds} {engine:12s} "
                        f"{report['images'] / report['seconds']:8.1f} images/s")
            everything.append(_compared(FolderResults(name, count, batch, settings.threads,
                                                      list(runs.values()))))
        return everything


def _labels_and_preprocess(model) -> tuple[list[str], dict]:
    """The labels and preprocessing of the shipped model's card; for the others ImageNet's
    labels (or "class i" for a model with other than 1000 classes) and torchvision's
    preprocessing at the model's image size."""
    from infer.classify import read_labels

    if model.shipped_param:
        card = json.loads((REPO / model.shipped_param).with_name("model.json").read_text())
        folder = (REPO / model.shipped_param).parent
        return read_labels(folder / card["labels"]), card.get("preprocess", {})
    size = model.input_size[0]                  # a classifier's input is square
    classes = 1000 if size == 224 else 10
    labels = (read_labels(REPO / "model_file" / "imagenet_classes.txt") if classes == 1000
              else [f"class {i}" for i in range(classes)])
    return labels, {"resize": round(size * 256 / 224), "crop": size}


def _compared(results: FolderResults) -> FolderResults:
    """Both engines' answers, image by image: the same top-5 labels, and their largest
    probability difference."""
    tops = [run.rounds[0]["top"] for run in results.runs if run.rounds]
    if len(tops) == 2:
        ours, theirs = tops                          # a near tie may swap two labels
        results.same_labels = all(la == lb or abs(p - q) <= TOLERANCE
                                  for a, b in zip(ours, theirs)
                                  for (la, p), (lb, q) in zip(a, b))
        results.max_diff = max((abs(p - q) for a, b in zip(ours, theirs)
                                for (_, p), (_, q) in zip(a, b)), default=0.0)
    return results


def markdown(everything: list[FolderResults], command: str) -> str:
    """The folder section: the machine, a table of images per second, the ratio."""
    from infer.bench.report import machine, table

    lines = [f"`{command}`", ""] + [f"- {key}: {value}" for key, value in machine()] + [""]
    for r in everything:
        lines += [f"{r.model}: {r.images} generated images (PNG and JPEG, 256-1280 px), "
                  f"batch {r.batch}, {r.threads} threads per engine (the model's and the "
                  f"reading threads), median of {max(len(x.rounds) for x in r.runs)} "
                  f"round(s):", ""]
        rows = []
        for run in r.runs:
            if not run.rounds:
                rows.append([run.engine, f"failed: {run.error or 'no run'}", "", ""])
                continue
            spread = ", ".join(f"{x['images'] / x['seconds']:.1f}" for x in run.rounds)
            rows.append([run.engine, f"{run.images_per_s:.1f}", spread,
                         f"{1e3 / run.images_per_s:.1f}"])
        lines += table(["engine", "images/s", "round values", "ms per image"], rows) + [""]
        ours = next((x for x in r.runs if x.engine == "pnnx-infer" and x.rounds), None)
        base = next((x for x in r.runs if x.engine == "onnxruntime" and x.rounds), None)
        if ours and base:
            agree = ("the same top-5 labels" if r.same_labels else "**other labels**")
            lines.append(f"folder: pnnx-infer {ours.images_per_s:.1f} images/s, onnxruntime "
                         f"{base.images_per_s:.1f} images/s: "
                         f"{ours.images_per_s / base.images_per_s:.2f}x onnxruntime's "
                         f"throughput; {agree}, probabilities within {r.max_diff:.1e}"
                         + ("" if (r.max_diff or 0) <= TOLERANCE else
                            f" (**over {TOLERANCE:g}**)"))
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def ok(everything: list[FolderResults]) -> bool:
    """Every engine ran, and they agree."""
    return all(run.rounds and not run.error for r in everything for run in r.runs) and all(
        r.same_labels is not False and (r.max_diff or 0) <= TOLERANCE for r in everything)
