"""MTCNN on this runtime against torch: each network on random inputs, and the whole detection
against the same pipeline written with torch (tests/models/mtcnn_torch.py, whose networks are
the torch modules of model_file/mtcnn/export_mtcnn.py with the weights of the shipped bin files:
no download). Where the facenet-pytorch wheel is at hand, the bin files are checked to hold its
weights, so the chain wheel -> bin -> runtime is closed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mtcnn_torch
from infer import RuntimeGraph
from infer.detect import MTCNN_DIR, FaceDetector
from infer.images import read_image
from support import REPO

IMAGES = REPO / "model_file" / "images"


@pytest.fixture(scope="module")
def nets() -> dict[str, torch.nn.Module]:
    return mtcnn_torch.shipped_networks()


@pytest.fixture(scope="module")
def detector() -> FaceDetector:
    return FaceDetector()


def collage() -> np.ndarray:
    """The astronaut at 256, 128 (mirrored) and 64 pixels on grey: three faces, about 44, 21
    and 10 pixels wide, for one pyramid."""
    import cv2

    astronaut = read_image(IMAGES / "astronaut.png")

    def shrunk(side: int) -> np.ndarray:
        return cv2.resize(astronaut, (side, side), interpolation=cv2.INTER_AREA)

    canvas = np.full((300, 420, 3), 90, np.uint8)
    canvas[20:276, 10:266] = shrunk(256)
    canvas[20:148, 280:408] = shrunk(128)[:, ::-1]
    canvas[170:234, 290:354] = shrunk(64)
    return canvas


@pytest.mark.parametrize("name, shape", [("pnet", (1, 3, 12, 12)), ("pnet", (2, 3, 57, 83)),
                                         ("rnet", (5, 3, 24, 24)), ("onet", (3, 3, 48, 48))])
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_each_network_matches_torch_on_random_inputs(nets, name, shape, reference):
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    graph = RuntimeGraph(MTCNN_DIR / f"{name}.pnnx.param", MTCNN_DIR / f"{name}.pnnx.bin",
                         reference=reference).build()
    outputs = graph.forward(x)
    with torch.no_grad():
        expected = nets[name](torch.from_numpy(x))
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("image", ["astronaut.png", "coffee.png", "collage"])
def test_detection_matches_the_torch_pipeline(nets, detector, image):
    """With the same resizing (OpenCV's), the only difference left is the networks' arithmetic:
    the boxes and landmarks agree to a thousandth of a pixel."""
    pixels = collage() if image == "collage" else read_image(IMAGES / image)
    faces = detector.detect(pixels)
    boxes, scores, landmarks = mtcnn_torch.detect(pixels, nets, resample="opencv")
    assert len(faces) == len(boxes) == {"astronaut.png": 1, "coffee.png": 0, "collage": 3}[image]
    for face, box, score, points in zip(faces, boxes, scores, landmarks):
        np.testing.assert_allclose(face.box, box, atol=1e-3)
        np.testing.assert_allclose(face.landmarks, points, atol=1e-3)
        assert face.score == pytest.approx(score, abs=1e-5)


@pytest.mark.slow
def test_detection_is_close_to_facenet_pytorchs_resizing(nets, detector):
    """facenet-pytorch resizes with torch's area interpolation, this runtime with OpenCV's
    (infer/detect.py says why): the faces are the same, a pixel or two apart; the score of the
    10-pixel face in the collage moves by 0.02."""
    for pixels in (read_image(IMAGES / "astronaut.png"), collage()):
        faces = detector.detect(pixels)
        boxes, scores, landmarks = mtcnn_torch.detect(pixels, nets, resample="torch")
        assert len(faces) == len(boxes)
        for face, box, score, points in zip(faces, boxes, scores, landmarks):
            np.testing.assert_allclose(face.box, box, atol=3.0)
            np.testing.assert_allclose(face.landmarks, points, atol=1.5)
            assert face.score == pytest.approx(score, abs=0.05)


def test_the_bin_files_hold_facenet_pytorchs_weights(nets):
    wheel = mtcnn_torch.find_wheel()
    if wheel is None:
        pytest.skip("the facenet-pytorch wheel is not at hand (FACENET_PYTORCH_WHEEL)")
    for name, state in mtcnn_torch.export_script().state_dicts(wheel).items():
        shipped = nets[name].state_dict()
        assert shipped.keys() == state.keys()
        for key, tensor in state.items():
            assert torch.equal(shipped[key], tensor), f"{name}: {key}"


@pytest.mark.slow
def test_the_export_script_writes_the_shipped_files(nets, tmp_path):
    """export_mtcnn.export on the networks (weights from the bin files, equal to the wheel's
    where it is at hand) writes byte for byte the files model_file/mtcnn/ ships."""
    written = mtcnn_torch.export_script().export(nets, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"{n}.pnnx.{kind}" for n in ("pnet", "rnet", "onet") for kind in ("param", "bin"))
    for path in written:
        assert path.read_bytes() == (MTCNN_DIR / path.name).read_bytes(), path.name
