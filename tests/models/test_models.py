"""Whole models against torch: ResNet18 (seeded random weights, torchvision's architecture)
and the shipped EfficientNet-Lite0 with its real ImageNet weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infer import RuntimeGraph
from infer.classify import ImageClassifier, read_image
from infer.export import efficientnet_lite0, resnet18
from support import REPO

CAT_CLASSES = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}
COFFEE_CLASSES = {"espresso", "cup", "coffee mug"}

# one worker runs them: the ResNet-18 export and the torch Lite0 are made once, not per worker
pytestmark = pytest.mark.xdist_group("whole models")


@pytest.fixture(scope="module")
def resnet(pnnx_export):
    model = resnet18(seed=0)
    torch.manual_seed(0)
    param, binary = pnnx_export(model, (torch.rand(1, 3, 224, 224),), "resnet18", dynamic=True)
    return model, RuntimeGraph(param, binary).build()


@pytest.mark.parametrize("shape", [(1, 3, 224, 224), (4, 3, 256, 256)])
def test_resnet18_matches_torch(resnet, shape):
    model, graph = resnet
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    (got,) = graph.forward(x.numpy())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_resnet18_keeps_torchvision_names(resnet):
    _, graph = resnet
    # fusion folds the ReLUs into the convolutions; their names stay on op.fused
    names = {name for op in graph.operators for name in (op.name, *op.fused)}
    assert {"layer1.0.relu", "layer4.1.relu", "maxpool", "avgpool", "fc"} <= names


@pytest.fixture(scope="module")
def shipped():
    return ImageClassifier.load("efficientnet_lite0")


@pytest.fixture(scope="module")
def lite0_torch():
    return efficientnet_lite0()


@pytest.mark.parametrize("photo, expected", [("chelsea.png", CAT_CLASSES),
                                             ("coffee.png", COFFEE_CLASSES)])
def test_efficientnet_lite0_gives_torch_top1(shipped, lite0_torch, photo, expected):
    x = shipped.preprocess(read_image(REPO / "model_file" / "images" / photo))
    (got,) = shipped.graph.forward(x)
    with torch.no_grad():
        want = lite0_torch(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert got.argmax() == want.argmax()
    label, probability = shipped.classify(REPO / "model_file" / "images" / photo, top=1)[0]
    assert label in expected and probability > 0.3


def test_efficientnet_lite0_runs_a_batch(shipped, lite0_torch):
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    (got,) = shipped.graph.forward(x)
    with torch.no_grad():
        want = lite0_torch(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_classify_takes_grey_and_rgba_arrays_as_read_image_does(shipped, tmp_path):
    """An array of any layout read_image can give, and an RGBA PNG written by opencv."""
    import cv2

    from infer.classify import ImageError

    rgb = read_image(REPO / "model_file" / "images" / "chelsea.png")[::4, ::4]   # (H, W, 3)
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)])
    cv2.imwrite(str(tmp_path / "rgba.png"), cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
    want = shipped.classify(rgb, top=3)
    assert shipped.classify(rgba, top=3) == want
    assert shipped.classify(tmp_path / "rgba.png", top=3) == want
    grey = rgb[:, :, 1]
    assert shipped.classify(grey, top=3) == shipped.classify(np.dstack([grey] * 3), top=3)
    for bad in (rgb.astype(np.float32) / 255, rgb[:, :, :2], np.zeros((0, 5, 3), np.uint8)):
        with pytest.raises(ImageError):
            shipped.classify(bad)


def test_preprocess_cuts_a_very_long_image_to_its_centre_first(monkeypatch):
    """A 1 x 40000 banner is not resized whole to 256 x 10 million pixels (8 GB); the centre
    4:1 part gives the crop the whole image gives."""
    import cv2

    from infer import classify

    smooth = cv2.resize(np.random.default_rng(0).integers(0, 255, (4, 8, 3), np.uint8),
                        (3000, 20), interpolation=cv2.INTER_CUBIC)             # (20, 3000, 3)
    assert classify.centre_part(smooth, 4).shape == (20, 80, 3)
    cut = classify.Preprocess()(smooth)
    monkeypatch.setattr(classify, "MAX_ASPECT", float("inf"))
    whole = classify.Preprocess()(smooth)
    np.testing.assert_allclose(cut, whole, atol=0.05)
    monkeypatch.undo()
    assert classify.Preprocess()(np.zeros((1, 40000, 3), np.uint8)).shape == (1, 3, 224, 224)


@pytest.mark.parametrize("card, words", [
    ('{"param": "m.pnnx.param", "bin": "m.pnnx.bin"}', "labels: missing"),
    ('{"param": "m.pnnx.param", "bin": "m.pnnx.bin", "labels": "l.txt", '
     '"preprocess": {"size": 3}}', "preprocess.'size': not a preprocessing setting"),
    ('{"param": ', "the model card is not JSON"),
    ('{"param": "m.pnnx.param", "bin": "m.pnnx.bin", "labels": "missing.txt"}',
     "labels: 'missing.txt': no such file"),
], ids=["no labels", "unknown preprocess key", "bad json", "labels file missing"])
def test_a_bad_model_card_is_an_infer_error_naming_the_file(tmp_path, card, words):
    from infer.classify import ImageClassifier
    from parser.errors import InferError

    (tmp_path / "l.txt").write_text("a\nb\n")
    (tmp_path / "model.json").write_text(card)
    with pytest.raises(InferError, match=words):
        ImageClassifier.load(tmp_path)
