"""Hostile and broken inputs to ``classify``, made here in tmp_path: images, model cards,
labels files and models. Every one ends in one ImageError or InferError naming the file (on
the command line: one line per problem, the other images go on), never in a traceback, a hang
or a decode of gigabytes. The limits are in the docstrings of infer/images.py and
infer/classify.py.

    images    not regular files (FIFO, device, folder), over MAX_IMAGE_BYTES, empty, damaged,
              over MAX_PIXELS by their PNG or JPEG header (refused, or a JPEG decoded reduced)
              or by OpenCV's own header check; and the odd but valid (1x1, 16-bit, grey+alpha)
    cards     not JSON, not an object, every field wrongly typed or out of range, all at once
    labels    empty, not text, not as many as the model's classes
    models    outputs that are not one (1, classes) array of finite numbers
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from infer import RuntimeGraph, classify, images
from infer.classify import (ImageClassifier, Preprocess, check_model_card, read_labels,
                            read_model_card)
from infer.images import image_header_size, read_image
from parser.errors import ImageError, InferError
from support import REPO, write_model

LITE0 = REPO / "model_file" / "efficientnet_lite0"
PHOTO = REPO / "model_file" / "images" / "chelsea.png"


def run_cli(*args: str, code: str = "") -> subprocess.CompletedProcess:
    """``python -m infer ARGS`` (after ``code``, run in the same process first, if given)."""
    script = f"import sys\n{code}\nfrom infer.__main__ import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120)


# ================================================================ generated image files

def png_bytes(width: int, height: int, colour: int = 2, depth: int = 8,
              rows: int | None = None) -> bytes:
    """A PNG of ``width`` x ``height`` black pixels (colour type 0 grey, 2 RGB, 4 grey+alpha,
    6 RGBA), written without holding the pixels: rows are compressed one by one. ``rows``
    writes only that many rows of pixel data (a header that claims more than it holds)."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    row = bytes(1 + math.ceil(width * channels * depth / 8))          # filter byte + pixels
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height if rows is None else rows))
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", data + packer.flush()) + _chunk(b"IEND", b""))


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def jpeg_bytes(width: int, height: int, progressive: bool = False, grey: bool = False) -> bytes:
    """A JPEG of random pixels, as OpenCV writes it."""
    import cv2

    shape = (height, width) if grey else (height, width, 3)
    pixels = np.random.default_rng(width * height).integers(0, 256, shape, dtype=np.uint8)
    ok, data = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)])
    assert ok
    return data.tobytes()


def with_jpeg_size(data: bytes, width: int, height: int) -> bytes:
    """A JPEG whose frame header claims ``width`` x ``height`` (its data stays as it was)."""
    at = data.index(b"\xff\xc0\x00\x11\x08")          # SOF0, 17 bytes, 8-bit, 3 components
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


def with_segments(data: bytes) -> bytes:
    """A JPEG with an APP1 segment (an Exif-like block holding 0xFF bytes and a fake frame
    header), junk bytes and fill bytes spliced in after SOI: the walk must skip the segment
    by its length, and the junk as libjpeg does (with a warning)."""
    app1 = b"Exif\0\0" + b"\xff\xc0\x00\x11\x08\xff\xff\xff\xff" * 20
    return (data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + b"\x00\x07junk"
            + b"\xff\xff" + data[2:])


# ================================================================ image sizes from the header

@pytest.mark.parametrize("width, height", [(1, 1), (37, 5), (640, 480), (3, 2000)])
def test_header_size_of_png_and_jpeg_is_what_opencv_decodes(width, height):
    import cv2

    cases = [png_bytes(width, height), png_bytes(width, height, colour=0, depth=16),
             jpeg_bytes(width, height), jpeg_bytes(width, height, progressive=True),
             jpeg_bytes(width, height, grey=True), with_segments(jpeg_bytes(width, height))]
    for data in cases:
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert image_header_size(data) == (width, height) == decoded.shape[1::-1]


def test_header_size_of_other_formats_is_left_to_opencv():
    import cv2

    pixels = np.zeros((20, 30, 3), np.uint8)
    for ext in (".bmp", ".tiff", ".webp", ".ppm"):
        assert image_header_size(cv2.imencode(ext, pixels)[1].tobytes()) is None


def test_header_size_of_every_cut_file_is_right_or_none():
    """A download cut anywhere: the header reader never fails, and never guesses."""
    for data in (png_bytes(300, 200), with_segments(jpeg_bytes(300, 200))):
        for end in range(len(data) + 1):
            assert image_header_size(data[:end]) in (None, (300, 200))


@given(tail=st.binary(max_size=64), signature=st.sampled_from([b"\x89PNG\r\n\x1a\n",
                                                               b"\xff\xd8\xff"]))
@settings(max_examples=300, database=None, deadline=None)
def test_header_size_of_junk_after_a_signature_never_fails(tail, signature):
    size = image_header_size(signature + tail)
    assert size is None or (len(size) == 2 and all(0 <= n < 2 ** 32 for n in size))


# ================================================================ the pixel budget

def test_a_png_over_the_pixel_budget_is_refused_before_decoding(tmp_path, monkeypatch):
    """A 3 KB PNG that claims 40000 x 30000 pixels (3.6 GB as RGB): refused with its size and
    the limit, and OpenCV is never asked to decode it."""
    import cv2

    path = tmp_path / "bomb.png"
    path.write_bytes(png_bytes(40000, 30000, rows=100))
    monkeypatch.setattr(cv2, "imdecode", lambda *args: pytest.fail("decoded"))
    with pytest.raises(ImageError) as info:
        read_image(path)
    assert str(info.value) == (f"{path}: the image is 40000 x 30000 pixels, more than the "
                               f"100,000,000 pixels this classifier decodes")


@pytest.mark.parametrize("width, height, colour, depth", [
    (100, 100, 2, 8), (1, 10001, 0, 8), (10001, 1, 6, 16), (200, 51, 0, 1)])
def test_a_png_is_decoded_up_to_the_budget_and_refused_past_it(tmp_path, monkeypatch,
                                                               width, height, colour, depth):
    monkeypatch.setattr(images, "MAX_PIXELS", width * height)
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(width, height, colour, depth))
    assert read_image(path).shape == (height, width, 3)
    monkeypatch.setattr(images, "MAX_PIXELS", width * height - 1)
    with pytest.raises(ImageError, match=f"{width} x {height} pixels, more than the "
                                         f"{width * height - 1:,} pixels"):
        read_image(path)


@pytest.mark.parametrize("budget, reduced_by", [(600 * 400, 1), (600 * 400 - 1, 2),
                                                (300 * 200, 2), (300 * 200 - 1, 4),
                                                (75 * 50, 8), (75 * 50 - 1, None)])
def test_a_jpeg_over_the_budget_is_decoded_reduced(tmp_path, monkeypatch, budget, reduced_by):
    """libjpeg decodes at 1/2, 1/4 or 1/8: the least reduction that fits the budget is used,
    and a JPEG that does not fit even at 1/8 is refused."""
    import cv2

    monkeypatch.setattr(images, "MAX_PIXELS", budget)
    path = tmp_path / "photo.jpg"
    path.write_bytes(jpeg_bytes(600, 400))
    if reduced_by is None:
        with pytest.raises(ImageError, match="600 x 400 pixels"):
            read_image(path)
        return
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}[reduced_by]
    want = cv2.cvtColor(cv2.imread(str(path), flag), cv2.COLOR_BGR2RGB)
    got = read_image(path)
    assert got.shape == (400 // reduced_by, 600 // reduced_by, 3)
    np.testing.assert_array_equal(got, want)


def test_a_small_jpeg_claiming_a_huge_size_is_decoded_at_one_eighth(tmp_path, monkeypatch):
    """A JPEG of 64 x 48 pixels whose header claims 6550 x 6550 (as one could claim 65500 x
    65500, 4.3 gigapixels, against the default budget): decoded at 1/8, within the budget."""
    monkeypatch.setattr(images, "MAX_PIXELS", 1_000_000)
    path = tmp_path / "claims.jpg"
    path.write_bytes(with_segments(with_jpeg_size(jpeg_bytes(64, 48), 6550, 6550)))
    assert read_image(path).shape == (819, 819, 3)


# ================================================================ odd but valid images

@pytest.mark.parametrize("make", [
    lambda: png_bytes(1, 1), lambda: png_bytes(7, 5, colour=0, depth=16),
    lambda: png_bytes(9, 4, colour=4), lambda: png_bytes(9, 4, colour=6, depth=16),
    lambda: png_bytes(33, 2, colour=0, depth=1), lambda: png_bytes(5000, 1),
    lambda: jpeg_bytes(1, 1), lambda: jpeg_bytes(2, 300, grey=True)],
    ids=["1x1", "grey16", "grey_alpha", "rgba16", "1bit", "banner", "jpeg1x1", "jpeg_grey"])
def test_odd_images_are_preprocessed_to_finite_numbers(tmp_path, make):
    path = tmp_path / "odd.img"
    path.write_bytes(make())
    image = read_image(path)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    x = Preprocess()(image)
    assert x.shape == (1, 3, 224, 224) and np.isfinite(x).all()


# ================================================================ files that are no image

@pytest.mark.slow
def test_cli_reports_each_bad_image_in_one_line_and_goes_on(tmp_path):
    """A FIFO, devices, a symlink to /dev/zero, a sparse 257 MiB file, an empty
    file, a damaged PNG and a PNG bomb, between two good photos: one line each on stderr
    naming the file, the good ones classified, exit 1, within the timeout (nothing blocks)."""
    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "zero.png").symlink_to("/dev/zero")
    with open(tmp_path / "sparse.png", "wb") as file:
        file.truncate(images.MAX_IMAGE_BYTES + 1)
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "damaged.png").write_bytes(png_bytes(300, 200)[:60])
    (tmp_path / "bomb.png").write_bytes(png_bytes(20000, 20000, rows=10))
    names = ["fifo.png", "zero.png", "sparse.png", "empty.png", "damaged.png", "bomb.png"]
    result = run_cli("classify", str(PHOTO), "/dev/zero",
                     *[str(tmp_path / name) for name in names], str(PHOTO), "--top", "1")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        "error: /dev/zero: is a device, not a regular file",
        f"error: {tmp_path}/fifo.png: is a pipe (FIFO), not a regular file",
        f"error: {tmp_path}/zero.png: is a device, not a regular file",
        f"error: {tmp_path}/sparse.png: the file has {images.MAX_IMAGE_BYTES + 1:,} bytes, "
        f"more than the {images.MAX_IMAGE_BYTES:,} this reader accepts",
        f"error: {tmp_path}/empty.png: empty file",
        f"error: {tmp_path}/damaged.png: cannot decode this file as an image (damaged, or not "
        f"a format OpenCV reads: png, jpg, bmp, tiff, webp, ...)",
        f"error: {tmp_path}/bomb.png: the image is 20000 x 20000 pixels, more than the "
        f"100,000,000 pixels this classifier decodes"]
    assert result.stdout.splitlines()[::2] == [f"{PHOTO}:"] * 2


@pytest.mark.slow
def test_cli_holds_every_format_to_the_budget_through_opencv(tmp_path):
    """Formats whose header classify does not read (here BMP and PGM) meet OpenCV's own check,
    which infer/images.py sets to MAX_PIXELS before cv2 is loaded (here lowered to 1000, as
    the environment variable would be)."""
    import cv2

    cv2.imwrite(str(tmp_path / "big.bmp"), np.zeros((40, 30, 3), np.uint8))        # 1200
    (tmp_path / "claims.pgm").write_bytes(b"P5\n60000 60000\n255\n" + bytes(100))
    (tmp_path / "small.png").write_bytes(png_bytes(40, 25))                          # 1000
    code = ("import os\nos.environ['OPENCV_IO_MAX_IMAGE_PIXELS'] = '1000'\n"
            "import infer.images\ninfer.images.MAX_PIXELS = 1000\n"
            "assert 'cv2' not in sys.modules")
    result = run_cli("classify", *[str(tmp_path / n) for n in ("big.bmp", "claims.pgm",
                                                               "small.png")],
                     "--top", "1", code=code)
    assert result.returncode == 1, result.stderr
    for name in ("big.bmp", "claims.pgm"):
        assert (f"error: {tmp_path}/{name}: the image is larger than OpenCV decodes (its check "
                f"'pixels <= CV_IO_MAX_IMAGE_PIXELS' failed") in result.stderr
    assert len(result.stderr.splitlines()) == 2 and len(result.stdout.splitlines()) == 2


# ================================================================ model cards

@pytest.fixture
def card_folder(tmp_path) -> Path:
    """A folder with the shipped model's files (links) and labels, and no model.json yet."""
    for suffix in ("param", "bin"):
        (tmp_path / f"m.pnnx.{suffix}").symlink_to(LITE0 / f"efficientnet_lite0.pnnx.{suffix}")
    (tmp_path / "labels.txt").symlink_to(REPO / "model_file" / "imagenet_classes.txt")
    return tmp_path


GOOD_CARD = {"param": "m.pnnx.param", "bin": "m.pnnx.bin", "labels": "labels.txt"}


def write_card(folder: Path, card: object) -> Path:
    path = folder / "model.json"
    path.write_text(card if isinstance(card, str) else json.dumps(card), encoding="utf-8")
    return path


@pytest.mark.parametrize("change, words", [
    ({"param": 5}, "param: the .pnnx.param file as a path relative to the model card, got 5"),
    ({"bin": None}, "bin: the .pnnx.bin file as a path relative to the model card, got None"),
    ({"labels": ""}, "labels: the labels file as a path relative to the model card, got ''"),
    ({"labels": ["labels.txt"]}, "labels: the labels file as a path relative"),
    ({"labels": "nope.txt"}, "labels: 'nope.txt': no such file"),
    ({"labels": "."}, "labels: '.': is a folder, not a regular file"),
    ({"bin": "/dev/zero"}, "bin: '/dev/zero': is a device, not a regular file"),
    ({"param": "m.pnnx.param\0x"}, "param: the .pnnx.param file as a path relative"),
    ({"param": "x" * 5000}, "param: 'xxxxxxxxxxxx...xxxxxxxxxxxxx': cannot read the file"),
    ({"outputs_probabilities": "yes"}, "outputs_probabilities: true or false, got 'yes'"),
    ({"preprocess": [256]}, "preprocess: an object with some of the keys resize, crop, mean"),
    ({"preprocess": {"size": 3}}, "preprocess.'size': not a preprocessing setting"),
    ({"preprocess": {"resize": "x"}}, "preprocess.resize: a whole number of pixels from 1 to "
                                      "4096, got 'x'"),
    ({"preprocess": {"resize": 256.0}}, "preprocess.resize: a whole number"),
    ({"preprocess": {"resize": True}}, "preprocess.resize: a whole number"),
    ({"preprocess": {"crop": 0}}, "preprocess.crop: a whole number of pixels from 1 to 4096"),
    ({"preprocess": {"crop": -224}}, "preprocess.crop: a whole number"),
    ({"preprocess": {"resize": 5000, "crop": 4000}}, "preprocess.resize: a whole number"),
    ({"preprocess": {"crop": 300}}, "preprocess.crop: 300 is larger than resize (256)"),
    ({"preprocess": {"mean": "abc"}}, "preprocess.mean: three numbers (R, G, B) from -1000 "
                                      "to 1000, got 'abc'"),
    ({"preprocess": {"mean": [0.5, 0.5]}}, "preprocess.mean: three numbers"),
    ({"preprocess": {"mean": [[0.5], 0.5, 0.5]}}, "preprocess.mean: three numbers"),
    ({"preprocess": {"mean": [0.5, 0.5, 1e300]}}, "preprocess.mean: three numbers"),
    ({"preprocess": {"mean": [0.5, 0.5, 10 ** 400]}}, "preprocess.mean: three numbers"),
    ({"preprocess": {"std": [0, 0, 0]}}, "preprocess.std: three numbers (R, G, B) from 0.0001 "
                                         "to 1000, got [0, 0, 0]"),
    ({"preprocess": {"std": [0.2, -0.2, 0.2]}}, "preprocess.std: three numbers"),
    ({"preprocess": {"std": [0.2, 0.2, 1e-300]}}, "preprocess.std: three numbers"),
    ({"preprocess": {"std": {"r": 1, "g": 1, "b": 1}}}, "preprocess.std: three numbers"),
], ids=lambda value: json.dumps(value)[:40] if isinstance(value, dict) else None)
def test_a_wrong_field_is_named(card_folder, change, words):
    path = write_card(card_folder, {**GOOD_CARD, **change})
    with pytest.raises(InferError) as info:
        read_model_card(path)
    assert str(info.value).startswith(f"{path}: {words}"), str(info.value)


@pytest.mark.parametrize("text, words", [
    ('{"param": "m.pnnx.param", "bin": "m.pnnx.bin", "labels": "labels.txt", '
     '"preprocess": {"mean": [NaN, 0, 0], "std": [Infinity, 1, 1]}}',
     "2 problems in this model card:\n  preprocess.mean: three numbers (R, G, B) from -1000 "
     "to 1000, got [nan, 0, 0]\n  preprocess.std: three numbers (R, G, B) from 0.0001 to "
     "1000, got [inf, 1, 1]"),
    ("[1, 2]", "a model card is a JSON object with the keys param, bin, labels, this one is "
               "[1, 2]"),
    ("null", "a model card is a JSON object"),
    ("{}", "3 problems in this model card:\n  param: missing"),
    ("", "the model card is not JSON: Expecting value: line 1 column 1 (char 0)"),
    ("{" + '"a": ' * 2 + "1}}", "the model card is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "the model card is not JSON"),
    ('{"n": ' + "9" * 5000 + "}", "the model card is not JSON"),
    ("\ufeff" + json.dumps(GOOD_CARD), None),                  # a byte order mark is fine
], ids=lambda value: value[:20] if isinstance(value, str) else None)
def test_a_card_that_is_not_a_json_object_with_the_keys(card_folder, text, words):
    path = write_card(card_folder, text)
    if words is None:
        assert read_model_card(path) == GOOD_CARD
        return
    with pytest.raises(InferError) as info:
        read_model_card(path)
    assert str(info.value).startswith(f"{path}: {words}"), str(info.value)


def test_every_problem_of_a_card_is_listed_at_once(card_folder):
    path = write_card(card_folder, {
        "param": 5, "bin": "m.pnnx.bin", "labels": "nope.txt", "outputs_probabilities": 1,
        "preprocess": {"mean": "abc", "resize": "x", "std": [0, 0, 0], "crop": -3,
                       "junk": [[[{}]]]}})
    with pytest.raises(InferError) as info:
        read_model_card(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: 8 problems in this model card:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "param", "labels", "outputs_probabilities", "preprocess.'junk'", "preprocess.resize",
        "preprocess.crop", "preprocess.mean", "preprocess.std"]


def test_card_files_that_are_not_regular_files(card_folder):
    """A FIFO or /dev/zero as the card or the labels: refused without blocking or reading."""
    card = card_folder / "model.json"
    os.mkfifo(card)
    with pytest.raises(InferError, match="cannot read the model card: is a pipe"):
        read_model_card(card)
    card.unlink()
    card.symlink_to("/dev/zero")
    with pytest.raises(InferError, match="cannot read the model card: is a device"):
        read_model_card(card)
    card.unlink()
    with open(card, "wb") as file:
        file.truncate(classify.MAX_CARD_BYTES + 1)
    with pytest.raises(InferError, match="cannot read the model card: the file has 1,048,577"):
        read_model_card(card)
    with pytest.raises(InferError, match="cannot read the labels: is a device"):
        read_labels("/dev/zero")


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz_cards")
    for name in ("m.pnnx.param", "m.pnnx.bin", "labels.txt"):
        (folder / name).write_text("x")
    return folder


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)


def mostly(valid: st.SearchStrategy, wrong: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` nine times in ten; else ``wrong`` or any JSON value (a wrong type, NaN,
    nesting). Every field of a card mostly valid: a good share of whole cards is usable."""
    return st.integers(0, 9).flatmap(lambda i: valid if i < 9 else wrong | json_values)


preprocesses = st.fixed_dictionaries({}, optional={
    "resize": mostly(st.integers(1, 300), st.sampled_from([0, -1, 4097, 10 ** 30, 256.0])),
    "crop": mostly(st.integers(1, 300), st.sampled_from([0, -1, 4097, True])),
    "mean": mostly(st.lists(st.floats(-2, 2), min_size=3, max_size=3),
                   st.lists(st.floats() | st.integers(), max_size=5)),
    "std": mostly(st.lists(st.floats(0.01, 2), min_size=3, max_size=3),
                  st.lists(st.floats() | st.integers(), max_size=5)),
})
cards = mostly(st.fixed_dictionaries({
    "param": mostly(st.just("m.pnnx.param"), st.sampled_from(["nope", "", ".", "/dev/null"])),
    "bin": mostly(st.just("m.pnnx.bin"), st.sampled_from(["../m.pnnx.bin", "m.pnnx.bin\0"])),
    "labels": mostly(st.just("labels.txt"), st.sampled_from([" ", "labels.txt/"])),
}, optional={"outputs_probabilities": mostly(st.booleans(), st.sampled_from([0, 1, "true"])),
             "preprocess": mostly(preprocesses, st.lists(st.integers(), max_size=2)),
             "name": json_values}), st.lists(st.text(), max_size=3))


@given(card=cards)
@settings(max_examples=400, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_any_card_is_usable_or_refused_with_its_problems(fuzz_folder, card):
    """Whatever a card holds: read_model_card gives a card Preprocess takes and whose
    preprocessing gives finite numbers, or one InferError, one line per problem found."""
    path = fuzz_folder / "model.json"
    path.write_text(json.dumps(card), encoding="utf-8")
    problems = check_model_card(card, fuzz_folder)
    try:
        got = read_model_card(path)
    except InferError as err:
        assert problems and len(str(err).splitlines()) == (len(problems) > 1) + len(problems)
        event(f"refused: {min(len(problems), 3)}{'+' * (len(problems) >= 3)} problems")
        return
    assert not problems and json.dumps(got) == json.dumps(card)
    event("usable")
    preprocess = Preprocess(**got.get("preprocess", {}))
    if preprocess.resize <= 300:                      # up to 4096: 200 MB an example
        x = preprocess(np.full((5, 7, 3), 255, np.uint8))
        assert x.shape == (1, 3, preprocess.crop, preprocess.crop) and np.isfinite(x).all()


def test_preprocess_made_in_code_is_checked_too():
    with pytest.raises(InferError, match="Preprocess: std: three numbers .* got \\(0, 0, 0\\); "
                                         "crop: 512 is larger than resize \\(256\\)"):
        Preprocess(crop=512, std=(0, 0, 0))
    Preprocess(resize=300, crop=300, mean=np.zeros(3), std=np.ones(3, np.float32))


@pytest.mark.slow
def test_cli_says_every_problem_of_a_card_and_no_traceback(card_folder):
    path = write_card(card_folder, {**GOOD_CARD, "param": 5,
                                    "preprocess": {"mean": "abc", "std": [0, 0, 0]}})
    result = run_cli("classify", str(PHOTO), "--model", str(card_folder))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {path}: 3 problems in this model card:",
        "  param: the .pnnx.param file as a path relative to the model card, got 5",
        "  preprocess.mean: three numbers (R, G, B) from -1000 to 1000, got 'abc'",
        "  preprocess.std: three numbers (R, G, B) from 0.0001 to 1000, got [0, 0, 0]"]


# ================================================================ labels and model outputs

MEAN_OVER_PIXELS = ("pnnx.Input in0 0 1 0 #0=(?,3,?,?)f32",
                    "torch.mean mean 1 1 0 1 dim=(2,3) keepdim=False")
OUTPUTS = {                        # a model's lines after its input: what it returns
    "logits": [*MEAN_OVER_PIXELS, "pnnx.Output out0 1 0 1"],                        # (1, 3)
    "conv_head": [MEAN_OVER_PIXELS[0], "torch.mean mean 1 1 0 1 dim=(2,3) keepdim=True",
                  "pnnx.Output out0 1 0 1"],                                          # (1,3,1,1)
    "image": [MEAN_OVER_PIXELS[0], "pnnx.Output out0 1 0 0"],                  # (1,3,224,224)
    "scalar": [MEAN_OVER_PIXELS[0], "torch.mean mean 1 1 0 1", "pnnx.Output out0 1 0 1"],
    "two": [*MEAN_OVER_PIXELS, "pnnx.Output out0 2 0 0 1"],
    "nan": [*MEAN_OVER_PIXELS, "pnnx.Expression e 1 1 1 2 expr=mul(@0,nan)",
            "pnnx.Output out0 1 0 2"],
    "inf": [*MEAN_OVER_PIXELS, "pnnx.Expression e 1 1 1 2 expr=mul(@0,inf)",
            "pnnx.Output out0 1 0 2"],
}


def small_classifier(folder: Path, outputs: str, labels: list[str] | None = None,
                     **kwargs) -> ImageClassifier:
    param, binary = write_model(folder / outputs, *OUTPUTS[outputs])
    return ImageClassifier(RuntimeGraph(param, binary).build(), labels or ["r", "g", "b"],
                           **kwargs)


@pytest.mark.parametrize("outputs", ["logits", "conv_head"])
def test_logits_of_shape_1_classes_or_1_classes_1_1(tmp_path, outputs):
    image = np.zeros((8, 8, 3), np.uint8)
    image[:, :, 2] = 255                                             # blue: the largest mean
    (best, probability), *rest = small_classifier(tmp_path, outputs).classify(image, top=9)
    assert best == "b" and len(rest) == 2 and 0.4 < probability < 1


@pytest.mark.parametrize("outputs, words", [
    ("image", "returns ['(1, 3, 224, 224) float32']"), ("scalar", "returns ['() float32']"),
    ("two", "returns ['(1, 3, 224, 224) float32', '(1, 3) float32']"),
    ("nan", "the model's output holds NaN or infinity"),
    ("inf", "the model's output holds NaN or infinity")])
def test_an_output_that_is_not_finite_logits_is_refused(tmp_path, outputs, words):
    with pytest.raises(InferError, match=re.escape(words)):
        small_classifier(tmp_path, outputs).classify(np.zeros((8, 8, 3), np.uint8))


def test_probabilities_outside_0_1_are_refused(tmp_path):
    classifier = small_classifier(tmp_path, "logits", outputs_probabilities=True)
    with pytest.raises(InferError, match="outputs_probabilities is set, but the model returns "
                                         "values outside \\[0, 1\\]"):
        classifier.classify(np.zeros((8, 8, 3), np.uint8))


@pytest.mark.parametrize("labels", [["r", "g"], ["r", "g", "b", "extra"]])
def test_labels_and_classes_must_pair_one_to_one(tmp_path, labels):
    classifier = small_classifier(tmp_path, "logits", labels)
    with pytest.raises(InferError, match=f"the model gives 3 classes, but there are "
                                         f"{len(labels)} labels"):
        classifier.classify(np.zeros((8, 8, 3), np.uint8))
    classifier.card = tmp_path / "model.json"
    with pytest.raises(InferError, match=f"model.json: its labels file has {len(labels)} "
                                         f"labels, but the model gives 3 classes"):
        classifier.classify(np.zeros((8, 8, 3), np.uint8))


@pytest.mark.parametrize("top", [0, -1, 1.5, True, "3"])
def test_top_is_a_whole_number_of_at_least_one(tmp_path, top):
    with pytest.raises(InferError, match="top: a whole number of at least 1"):
        small_classifier(tmp_path, "logits").classify(np.zeros((8, 8, 3), np.uint8), top=top)


@pytest.mark.parametrize("data, want", [
    (b"a\nb\nc\n", ["a", "b", "c"]), (b"a\r\nb\r\nc\r\n\r\n\n  \n", ["a", "b", "c"]),
    ("\ufeffa\nb c\n".encode(), ["a", "b c"]), (b"a\n\nc", ["a", "", "c"]),
    (b"", "holds no labels"), (b"\n\n \n", "holds no labels"),
    (b"\xff\xfe\x00a", "the labels are not UTF-8 text (invalid start byte at byte 0)")])
def test_labels_file(tmp_path, data, want):
    path = tmp_path / "labels.txt"
    path.write_bytes(data)
    if isinstance(want, list):
        assert read_labels(path) == want
    else:
        with pytest.raises(InferError, match=re.escape(f"{path}: ") + ".*" + re.escape(want)):
            read_labels(path)


# ================================================================ the command line itself

@pytest.mark.slow
def test_cli_arguments_that_are_no_number_or_no_model():
    long_name = "m" * 5000
    result = run_cli("classify", str(PHOTO), "--top", "abc")
    assert result.returncode == 2
    assert "argument --top: expected a whole number, got 'abc'" in result.stderr
    result = run_cli("classify", str(PHOTO), "--model", long_name)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: no model 'mmmmmmmmmmmm...mmmmmmmmmmmmm': give")
    result = run_cli("classify", str(PHOTO), "--top", "9" * 30)
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1000
