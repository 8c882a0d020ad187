"""The Ray Data job (infer/cluster.py) on a local Ray instance of two CPUs: the same answers,
in the same order, with the same errors, as the single-process run (classify_many). What
``python -m infer classify DIR --ray`` hands it is tested without Ray, in
test_classify_folder.py. Skipped without Ray (the cluster
extra: pip install -e ".[cluster]"); slow: starting Ray and its workers takes 10-20 s."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from infer.classify import Classified, ImageClassifier, list_images
from infer.cluster import classify_on_ray
from parser.errors import InferError
from support import write_model

if importlib.util.find_spec("ray") is None:      # found, not imported: importing Ray is
    pytest.skip("Ray is not installed (the cluster extra)",   # slow, in every worker that
                allow_module_level=True)                     # collects this module

pytestmark = [pytest.mark.slow,       # Ray's own settings, read when it copies its context
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
              pytest.mark.xdist_group("ray")]    # one worker runs them: one Ray instance


def write_image(path: Path, seed: int, size: tuple[int, int] = (48, 64)) -> None:
    """A small image of smooth random colours (encoded here: cv2.imwrite crashes on a name
    that is not UTF-8)."""
    import cv2

    grid = np.random.default_rng(seed).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    ok, data = cv2.imencode(path.suffix, cv2.resize(grid, size[::-1],
                                                    interpolation=cv2.INTER_CUBIC))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.tobytes())


@pytest.fixture(scope="module")
def local_ray():
    """A new local Ray instance of two CPUs ("local": not a cluster `ray start` runs here)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=80 << 20, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Eleven images in two folders, a damaged one among them, and a name that is not UTF-8."""
    root = tmp_path_factory.mktemp("ray") / "images"
    for i in range(10):
        write_image(root / ("sub" if i > 6 else ".") / f"{i:02d}.{'png' if i % 2 else 'jpg'}",
                    i, (60 + 9 * i, 100 - 3 * i))
    write_image(root / os.fsdecode(b"\xe9t\xe9.png"), 10)
    (root / "sub" / "broken.jpg").write_bytes(b"\xff\xd8\xff but no image")
    return root


def same(ours: list[Classified], theirs: list[Classified]) -> None:
    """The same paths in the same order, the same errors, the same labels, and probabilities
    within float rounding (a batch may be cut elsewhere)."""
    assert [str(r.path) for r in ours] == [str(r.path) for r in theirs]
    assert [str(r.error) for r in ours] == [str(r.error) for r in theirs]
    for a, b in zip(ours, theirs):
        assert [label for label, _ in a.top] == [label for label, _ in b.top]
        np.testing.assert_allclose([p for _, p in a.top], [p for _, p in b.top], atol=1e-6)


def test_ray_gives_the_single_process_results(local_ray, folder):
    paths = list_images(folder, recursive=True)
    alone = list(ImageClassifier.load("efficientnet_lite0").classify_many(paths, top=5, batch=4))
    assert sum(r.error is not None for r in alone) == 1 and len(alone) == 12
    on_ray = list(classify_on_ray(paths, "efficientnet_lite0", top=5, batch=4, workers=2))
    same(alone, on_ray)


def test_a_worker_error_ends_the_job_with_an_inferror(local_ray, folder, tmp_path):
    """A model whose output holds NaN: the driver loads it fine, the workers refuse its first
    answer, and the job ends with that refusal as an InferError, not Ray's traceback."""
    model = tmp_path / "nan_model"
    write_model(model, "pnnx.Input in0 0 1 0 #0=(?,3,?,?)f32",
                "torch.mean mean 1 1 0 1 dim=(2,3) keepdim=False",
                "pnnx.Expression e 1 1 1 2 expr=mul(@0,nan)", "pnnx.Output out0 1 0 2")
    (model / "labels.txt").write_text("r\ng\nb\n")
    (model / "model.json").write_text('{"param": "model.pnnx.param", "bin": "model.pnnx.bin", '
                                      '"labels": "labels.txt"}')
    with pytest.raises(InferError, match="a Ray worker failed: .*InferError: .*the model's "
                                         "output holds NaN or infinity"):
        list(classify_on_ray(list_images(folder), model, workers=1))
