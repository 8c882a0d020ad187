"""The face detector (infer/detect.py) with the shipped MTCNN weights, on the shipped photos, and
``python -m infer detect``. No torch here: tests/models/test_detect_torch.py compares with it."""

from __future__ import annotations

import numpy as np
import pytest

from infer.__main__ import main
from infer.detect import LANDMARKS, FaceDetector, draw_faces
from infer.images import read_image
from support import REPO

IMAGES = REPO / "model_file" / "images"
# Eileen Collins' face in astronaut.png (512 x 512), marked by hand: from the hairline's edge
# at the temples to the chin, x1 y1 x2 y2
ASTRONAUT_FACE = np.array([180, 60, 268, 175])


@pytest.fixture(scope="module")
def detector() -> FaceDetector:
    return FaceDetector()


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return read_image(IMAGES / "astronaut.png")


@pytest.fixture(scope="module")
def astronaut_faces(detector, astronaut) -> list:
    return detector.detect(astronaut)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_astronaut_has_one_face_where_her_face_is(astronaut_faces):
    assert len(astronaut_faces) == 1
    face = astronaut_faces[0]
    assert face.score > 0.99
    assert iou(face.box, ASTRONAUT_FACE) > 0.8, face.box
    x1, y1, x2, y2 = face.box
    assert face.landmarks.shape == (len(LANDMARKS), 2)
    assert np.all((face.landmarks >= [x1, y1]) & (face.landmarks <= [x2, y2]))
    left_eye, right_eye, nose, mouth_left, mouth_right = face.landmarks
    assert left_eye[0] < nose[0] < right_eye[0] and mouth_left[0] < mouth_right[0]
    assert max(left_eye[1], right_eye[1]) < nose[1] < min(mouth_left[1], mouth_right[1])


@pytest.mark.parametrize("photo", ["coffee.png", "chelsea.png"])
def test_photos_without_a_person_have_no_face(detector, photo):
    assert detector.detect(read_image(IMAGES / photo)) == []


def test_images_with_nothing_to_find(detector):
    assert detector.detect(np.zeros((19, 300, 3), np.uint8)) == []      # no pyramid level
    assert detector.detect(np.full((64, 80), 128, np.uint8)) == []       # grey, flat


def test_detect_takes_grey_and_rgba_as_rgb(detector, astronaut, astronaut_faces):
    rgba = np.concatenate([astronaut, np.full((512, 512, 1), 255, np.uint8)], axis=2)
    (face,) = detector.detect(rgba)
    np.testing.assert_array_equal(face.box, astronaut_faces[0].box)
    (grey_face,) = detector.detect(astronaut.mean(axis=2).astype(np.uint8))
    assert iou(grey_face.box, face.box) > 0.8


def test_draw_faces_leaves_the_image_alone(astronaut, astronaut_faces):
    drawn = draw_faces(astronaut, astronaut_faces)
    assert drawn.shape == astronaut.shape and not np.array_equal(drawn, astronaut)
    assert np.array_equal(astronaut, read_image(IMAGES / "astronaut.png"))


# ----------------------------------------------------------------------------- command line
def test_command_prints_faces_draws_them_and_goes_on_after_a_bad_image(tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    out = tmp_path / "drawn"
    code = main(["detect", str(IMAGES / "astronaut.png"), str(bad), str(IMAGES / "coffee.png"),
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 1
    lines = printed.out.splitlines()
    assert lines[0].startswith(f"{IMAGES / 'astronaut.png'}: 1 face (drawn in ")
    assert lines[1].split()[:2] == ["score", "1.0000"] and "box" in lines[1]
    assert lines[2].split()[:2] == ["left", "eye"] and "mouth right" in lines[2]
    assert lines[3].startswith(f"{IMAGES / 'coffee.png'}: 0 faces")
    assert len(lines) == 4
    errors = printed.err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}: ")
    assert sorted(p.name for p in out.iterdir()) == ["astronaut_faces.png", "coffee_faces.png"]
    assert read_image(out / "astronaut_faces.png").shape == (512, 512, 3)


def test_command_draws_one_image_into_the_file_named(tmp_path, capsys):
    target = tmp_path / "annotated.jpg"
    assert main(["detect", str(IMAGES / "astronaut.png"), "--out", str(target)]) == 0
    assert read_image(target).shape == (512, 512, 3)
    assert capsys.readouterr().out.count("score") == 1


def test_command_refuses_an_out_it_cannot_write_before_running(tmp_path, capsys):
    astronaut = str(IMAGES / "astronaut.png")
    assert main(["detect", astronaut, "--out", str(tmp_path / "faces.xyz")]) == 2
    assert "OpenCV writes no such image type" in capsys.readouterr().err
    assert main(["detect", astronaut, "--out", str(tmp_path / "none" / "faces.png")]) == 2
    assert f"no folder {tmp_path / 'none'} to write it in" in capsys.readouterr().err
    copy = tmp_path / "other" / "astronaut.png"
    copy.parent.mkdir()
    copy.write_bytes((IMAGES / "astronaut.png").read_bytes())
    assert main(["detect", astronaut, str(copy), "--out", str(tmp_path / "out")]) == 2
    printed = capsys.readouterr()
    assert "astronaut_faces.png" in printed.err and printed.out == ""
    assert not (tmp_path / "out").exists()


def test_command_reports_an_image_over_the_memory_budget_and_goes_on(monkeypatch, capsys,
                                                                      tmp_path):
    """The astronaut at 1024 x 1024: P-Net's first level (615 x 615) makes operands of 15 MiB,
    over a budget of 6 MiB, so that image is one line on stderr; her face cut out (160 x 160)
    fits and is found."""
    import cv2

    from infer.detect import write_image

    astronaut = read_image(IMAGES / "astronaut.png")
    large, face = tmp_path / "large.png", tmp_path / "face.png"
    write_image(large, cv2.resize(astronaut, (1024, 1024)))
    write_image(face, astronaut[40:200, 145:305])
    monkeypatch.setenv("PNNX_INFER_MEMORY_BUDGET", "6M")
    code = main(["detect", str(large), str(face)])
    printed = capsys.readouterr()
    assert code == 1
    (error,) = printed.err.strip().splitlines()
    assert error.startswith(f"error: {large}: ") and "more than the memory budget" in error
    assert printed.out.startswith(f"{face}: 1 face\n")


def test_command_help_says_what_it_prints(capsys):
    with pytest.raises(SystemExit) as done:
        main(["detect", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 20)" in text and "(default: None)" not in text
    assert "box x1 y1 x2 y2" in text and "<stem>_faces.png" in text


@pytest.mark.slow
def test_python_m_infer_detect_runs_in_a_process_of_its_own(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "infer", "detect", "astronaut.png",
                             "--out", str(tmp_path / "faces.png")], cwd=IMAGES,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("astronaut.png: 1 face (drawn in ")
    assert (tmp_path / "faces.png").is_file()
