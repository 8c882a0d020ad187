"""Classifying more images than one machine handles: the single-process job on Ray Data.

    pip install -e ".[cluster]"                                # Ray Data, on every machine
    python -m infer classify DIR -r --ray -o results.csv       # a Ray instance on the local machine
    ray start --head                                           # or a cluster: on the head,
    ray start --address HEAD_IP:6379                           # on each other node,
    python -m infer classify DIR -r --address auto -o results.csv       # then on the head

Ray does the distribution; this module only says what to run:

    driver   list the images (``image_paths``, as the single-process job does)
             ray.data.from_items(paths)                 a Dataset of paths, in order
             .map_batches(BatchClassifier, ...)         a pool of actors, each loading the model
                                                        once, each call classifying one batch
             .iter_rows()                               the results back, in order
    actor    BatchClassifier(batch of paths) -> ImageClassifier.classify_many(paths): the same
             reading, preprocessing, batching and errors as the single-process job

so the results equal the single-process run's (up to float rounding where a batch is formed of
other images). Why a Dataset of paths, not ``ray.data.read_images``: read_images decodes with
Pillow (not installed by ray[data]), another decoder than OpenCV's, so nothing makes its pixels
the single-process run's (JPEG decoders differ in their inverse DCT and chroma upsampling, and
the two convert grey, 16-bit and alpha images each their own way); and it reads whatever the
path names, without ``read_image``'s limits (a FIFO blocks, a 40 GB file is read), as
``read_binary_files`` does. As with read_images on local paths, every node reads the images
itself: they must be at the same path on every node (a shared file system), and this package
installed on each.

Paths travel as bytes (``os.fsencode``), so that a file name that is not UTF-8 survives Arrow's
strings. An image that cannot be read comes back as a row with its error, as in
classify_many; anything else a worker raises ends the job with an InferError.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from parser.errors import ImageError, InferError
from infer.classify import Classified, ImageClassifier

__all__ = ["BatchClassifier", "classify_on_ray"]


class BatchClassifier:
    """Ray Data's callable class: Ray creates one per actor (``ActorPoolStrategy``), which
    loads the model once; each call classifies one batch of rows {"path": bytes} and returns
    {"path", "labels" (n, top), "scores" (n, top), "error"} ("" when there is none; a failed
    image has empty labels and NaN scores)."""

    def __init__(self, model: str, top: int = 5, threads: int = 1) -> None:
        self.classifier = ImageClassifier.load(model)
        self.classifier.graph.set_num_threads(threads)
        self.top, self.threads = top, threads

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        paths = [os.fsdecode(path) for path in batch["path"]]
        results = list(self.classifier.classify_many(paths, self.top, batch=len(paths),
                                                     threads=self.threads))
        labels = np.full((len(paths), self.top), "", dtype=object)
        scores = np.full((len(paths), self.top), np.nan)
        for row, result in enumerate(results):
            for column, (label, probability) in enumerate(result.top):
                labels[row, column], scores[row, column] = label, probability
        return {"path": batch["path"], "labels": labels.astype(str), "scores": scores,
                "error": np.array([str(r.error or "") for r in results], dtype=object)}


def classify_on_ray(paths: Iterable[str | Path], model: str | Path, top: int = 5,
                    batch: int = 8, workers: int | None = None, threads: int = 1,
                    address: str | None = None) -> Iterator[Classified]:
    """``ImageClassifier.load(model).classify_many(paths, top, batch)``, on Ray: ``workers``
    actors (default: the cluster's CPUs / ``threads``) of ``threads`` CPUs each, unless
    ``ray.init`` ran already: ``ray.init(address)`` joins the cluster at ``address``
    ("host:6379"; "auto": RAY_ADDRESS, or the one ``ray start`` runs on the local machine), or
    for None that one if there is one, else starts a Ray instance on the local machine's cores
    ("local": always). Yields one Classified per path, in order."""
    try:
        import ray
    except ImportError:
        raise InferError('--ray needs Ray Data: pip install -e ".[cluster]"') from None
    items = [{"path": os.fsencode(path)} for path in paths]
    if not items:
        return
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False)
        except ConnectionError as exc:       # a cluster that stopped (or never started)
            raise InferError(f"{exc} (is it running? `ray status` says; `--address local` "
                             f"starts a new Ray instance on the local machine)") from None
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    rows = ray.data.from_items(items).map_batches(
        BatchClassifier, fn_constructor_kwargs={"model": str(model), "top": top,
                                                "threads": threads},
        batch_size=batch, compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=threads)
    try:
        for row in rows.iter_rows():
            yield _classified(row)
    except ray.exceptions.RayError as exc:
        raise InferError(f"a Ray worker failed: {_user_error(str(exc))} (Ray's log above has "
                         f"its traceback)") from None


def _classified(row: dict[str, Any]) -> Classified:
    """A row of BatchClassifier's results as classify_many gives it."""
    path = os.fsdecode(row["path"])
    if row["error"]:
        return Classified(path, [], ImageError(row["error"]))
    return Classified(path, [(str(label), float(score))
                             for label, score in zip(row["labels"], row["scores"])
                             if not np.isnan(score)])


def _user_error(text: str) -> str:
    """The worker's own exception line ("parser.errors.InferError: ...") in the text of
    Ray's error, which wraps it in Ray's exceptions; else Ray's first line."""
    for line in text.splitlines():
        found = re.match(r"\s*(?!ray\.)[\w.]*(?:Error|Exception): (.*)", line)
        if found:
            return found.group(0).strip()
    return (text.strip().splitlines() or ["(no message)"])[0]
