"""Classifying a folder: ``list_images`` and ``image_paths`` (what is listed, in which order,
links and loops, folders that cannot be read), ``ImageClassifier.classify_many`` (batched
answers equal to one image at a time, in order, bad files skipped, bounded read-ahead), the CSV,
and ``python -m infer classify DIR`` as a user runs it (slow: a process per test).

The folders are generated here: a few small images of every extension, nested, beside files
that are not images and images that are damaged."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from cv2.utils import logging as cv_log

from infer import RuntimeGraph
from infer.classify import (IMAGE_EXTENSIONS, Classified, ImageClassifier, Preprocess,
                            csv_header, csv_row, image_paths, list_images)
from parser.errors import ImageError, InferError
from support import REPO, write_model

THROUGHPUT = re.compile(r"^(\d+) images classified, (\d+) skipped, in [\d.]+ s: [\d.]+ "
                        r"images/s \(batch \d+\)", re.M)


def write_image(path: Path, seed: int, size: tuple[int, int] = (48, 64)) -> Path:
    """A small image of smooth random colours at ``path`` (its extension gives the format).
    Encoded here and written by Python: cv2.imwrite (and imread) of a name that is not UTF-8
    (a str with surrogates) ends the process with a segmentation fault (OpenCV 5.0)."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    ok, data = cv2.imencode(path.suffix, cv2.resize(grid, size[::-1],
                                                    interpolation=cv2.INTER_CUBIC))
    assert ok
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.tobytes())
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """photos/                      a.png B.JPG c.jpeg d.bmp e.tif f.tiff g.webp, notes.txt,
        sub/h.png sub/deeper/i.jpg  data.csv, Makefile; sub/loop -> .. (a link loop)
        sub/broken.png (not an image), sub/empty.jpg (no bytes), empty/ (no files)"""
    root = tmp_path_factory.mktemp("tree") / "photos"
    for i, name in enumerate(["a.png", "B.JPG", "c.jpeg", "d.bmp", "e.tif", "f.tiff", "g.webp",
                              "sub/h.png", "sub/deeper/i.jpg"]):
        write_image(root / name, i, (40 + 8 * i, 90 - 4 * i))
    (root / "notes.txt").write_text("not an image")
    (root / "data.csv").write_text("a,b\n")
    (root / "Makefile").write_text("all:\n")
    (root / "sub" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n but damaged")
    (root / "sub" / "empty.jpg").write_bytes(b"")
    (root / "empty").mkdir()
    (root / "sub" / "loop").symlink_to("..")
    return root


@pytest.fixture(scope="module")
def classifier() -> ImageClassifier:
    return ImageClassifier.load("efficientnet_lite0")


def names(paths, root: Path) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in paths]


# ================================================================ listing

def test_a_folder_lists_its_images_sorted_and_no_other_files(tree):
    assert names(list_images(tree), tree) == ["B.JPG", "a.png", "c.jpeg", "d.bmp", "e.tif",
                                              "f.tiff", "g.webp"]
    assert {Path(n).suffix.lower() for n in names(list_images(tree), tree)} == set(
        IMAGE_EXTENSIONS)


def test_recursive_lists_subfolders_once_each_through_a_link_loop(tree):
    """Each folder's files, then its subfolders in name order; sub/loop (-> ..) is the
    top folder again: skipped, not listed twice nor forever."""
    assert names(list_images(tree, recursive=True), tree) == [
        "B.JPG", "a.png", "c.jpeg", "d.bmp", "e.tif", "f.tiff", "g.webp",
        "sub/broken.png", "sub/empty.jpg", "sub/h.png", "sub/deeper/i.jpg"]


def test_a_second_link_to_a_folder_is_listed_once(tmp_path):
    write_image(tmp_path / "real" / "x.png", 0)
    (tmp_path / "alias").symlink_to("real")
    assert names(list_images(tmp_path, recursive=True), tmp_path) == ["alias/x.png"]


def test_a_folder_that_cannot_be_read_is_reported_and_the_others_go_on(tree, monkeypatch):
    original = os.scandir

    def scandir(path="."):
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return original(path)

    monkeypatch.setattr(os, "scandir", scandir)
    errors: list[ImageError] = []
    found = list_images(tree, recursive=True, on_error=errors.append)
    assert names(found, tree)[-1] == "g.webp" and len(found) == 7
    assert [str(e) for e in errors] == [f"{tree / 'sub'}: cannot list this folder: "
                                        f"Permission denied"]
    with pytest.raises(ImageError, match="sub: cannot list this folder: Permission denied"):
        list_images(tree, recursive=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder of mode 000")
def test_a_folder_without_read_permission(tmp_path):
    write_image(tmp_path / "locked" / "x.png", 0)
    (tmp_path / "locked").chmod(0)
    try:
        errors: list[ImageError] = []
        assert list_images(tmp_path, recursive=True, on_error=errors.append) == []
        assert "locked: cannot list this folder" in str(errors[0])
    finally:
        (tmp_path / "locked").chmod(0o755)


def test_image_paths_expands_folders_and_keeps_files(tree, tmp_path):
    errors: list[ImageError] = []
    paths = image_paths([str(tree / "sub"), "no/such.png", str(tree / "a.png"),
                         str(tree / "empty"), str(tmp_path / "missing_folder/")],
                        on_error=errors.append)
    assert [str(p) for p in paths] == [str(tree / "sub" / n) for n in
                                       ("broken.png", "empty.jpg", "h.png")] + [
        "no/such.png", str(tree / "a.png"), str(tmp_path / "missing_folder/")]
    assert [str(e) for e in errors] == [
        f"{tree / 'empty'}: no images in this folder (files named *.png, *.jpg, *.jpeg, "
        f"*.bmp, *.tif, *.tiff, *.webp); --recursive looks in its subfolders"]
    with pytest.raises(ImageError, match="empty: no images in this folder"):
        image_paths([tree / "empty"], recursive=True)


# ================================================================ classify_many

def probabilities(result: Classified) -> dict[str, float]:
    return dict(result.top)


def test_batches_give_what_each_image_alone_gives(tree, classifier):
    """Every class's probability (top=1000): batch 1 is the very same computation as
    classify(); batches of 3 (3 + 3 + 1: the last batch planned anew) differ by float
    rounding only."""
    paths = list_images(tree)
    alone = [dict(classifier.classify(p, top=1000)) for p in paths]
    one = list(classifier.classify_many(paths, top=1000, batch=1))
    assert [r.path for r in one] == paths and all(r.error is None for r in one)
    assert [probabilities(r) for r in one] == alone
    three = list(classifier.classify_many(paths, top=1000, batch=3, threads=3))
    for want, got in zip(alone, three):
        assert want.keys() == probabilities(got).keys()
        np.testing.assert_allclose([probabilities(got)[k] for k in want], list(want.values()),
                                   rtol=0, atol=1e-6)
    assert [r.top[:5] for r in one] == [list(p.items())[:5] for p in alone]


def test_bad_files_are_skipped_in_place_and_the_order_kept(tree, classifier):
    paths = [tree / "a.png", tree / "sub" / "broken.png", "no/such.png", tree / "B.JPG",
             tree / "sub" / "empty.jpg", tree / "sub" / "h.png", tree / "notes.txt"]
    results = list(classifier.classify_many(paths, top=2, batch=2, threads=2))
    assert [r.path for r in results] == paths
    assert [r.error is None for r in results] == [True, False, False, True, False, True, False]
    assert [str(r.error) for r in results if r.error] == [
        f"{tree / 'sub' / 'broken.png'}: cannot decode this file as an image (damaged, or not "
        f"a format OpenCV reads: png, jpg, bmp, tiff, webp, ...)",
        "no/such.png: no such file", f"{tree / 'sub' / 'empty.jpg'}: empty file",
        f"{tree / 'notes.txt'}: cannot decode this file as an image (damaged, or not a format "
        f"OpenCV reads: png, jpg, bmp, tiff, webp, ...)"]
    assert all(len(r.top) == 2 and r.top[0][1] >= r.top[1][1] for r in results if not r.error)
    for got, path in zip([r for r in results if not r.error], (paths[0], paths[3], paths[5])):
        want = classifier.classify(path, top=2)          # alone: the same, up to rounding
        assert [label for label, _ in got.top] == [label for label, _ in want]
        np.testing.assert_allclose([p for _, p in got.top], [p for _, p in want], atol=1e-6)


def test_reads_ahead_a_bounded_number_of_images(tree, classifier):
    """A thousand paths are not all read before the first answer: at most 2 * batch + threads
    are read ahead, and as many wait for their batch."""
    taken = []

    def paths():
        for i in range(1000):
            taken.append(i)
            yield tree / "a.png" if i % 2 else f"missing_{i}.png"

    results = classifier.classify_many(paths(), top=1, batch=2, threads=1)
    first = next(results)
    assert first.error is not None and len(taken) <= 2 * (2 * 2 + 1) + 1
    results.close()                                       # the pool stops, nothing hangs


def test_a_model_traced_at_batch_1_gets_one_image_at_a_time(tree, tmp_path):
    """Its shapes may hold the 1 (a view(1, -1)): batches would be wrong, so there are none."""
    param, binary = write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32",
                                "torch.mean mean 1 1 0 1 dim=(2,3) keepdim=False",
                                "pnnx.Output out0 1 0 1")
    small = ImageClassifier(RuntimeGraph(param, binary).build(), ["r", "g", "b"],
                            Preprocess(resize=8, crop=8))
    batches = []
    small.graph.add_hook(before=lambda step, inputs: batches.append(len(inputs[0])))
    results = list(small.classify_many(list_images(tree)[:3], top=3, batch=4))
    assert batches == [1, 1, 1] and all(r.error is None for r in results)


def test_opencv_log_level_is_restored_after_a_job_with_bad_files(tree, classifier):
    before = cv_log.getLogLevel()
    list(classifier.classify_many([tree / "sub" / "broken.png"] * 6 + [tree / "a.png"],
                                  batch=2, threads=3))
    assert cv_log.getLogLevel() == before


@pytest.mark.parametrize("name, value", [("batch", 0), ("threads", -1), ("top", True),
                                         ("batch", 2.0)])
def test_counts_are_whole_numbers_of_at_least_one(classifier, name, value):
    with pytest.raises(InferError, match=f"{name}: a whole number of at least 1"):
        list(classifier.classify_many([], **{name: value}))


def test_one_path_given_as_a_string_is_one_image(tree, classifier):
    (result,) = classifier.classify_many(str(tree / "a.png"), top=1)
    assert result.error is None and result.path == str(tree / "a.png")


def test_csv_header_and_rows():
    assert csv_header(2) == ["path", "label_1", "score_1", "label_2", "score_2"]
    row = csv_row(Classified(Path("x/a b,c.png"), [("tabby, cat", 0.51234567), ("dog", 0.1)]), 3)
    assert row == ["x/a b,c.png", "tabby, cat", "0.512346", "dog", "0.100000", "", ""]
    text = io.StringIO()
    csv.writer(text).writerow(row)
    assert next(csv.reader(io.StringIO(text.getvalue()))) == row


# ================================================================ the command line (slow)

def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer", "classify", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=300)


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as file:
        return list(csv.reader(file))


@pytest.mark.slow
def test_cli_folder_to_csv(tree, tmp_path, classifier):
    """-r -o: the CSV holds a header and one row per image read (same answers as the
    library), the bad files are one line each on stderr, exit code 1, throughput printed."""
    out = tmp_path / "results.csv"
    result = run(str(tree), "-r", "--batch", "3", "--top", "3", "-o", str(out))
    assert result.returncode == 1 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {tree / 'sub' / 'broken.png'}: cannot decode this file as an "
                      f"image (damaged, or not a format OpenCV reads: png, jpg, bmp, tiff, "
                      f"webp, ...)", f"error: {tree / 'sub' / 'empty.jpg'}: empty file"]
    assert THROUGHPUT.search(result.stderr).groups() == ("9", "2")
    assert f"; results in {out}" in result.stderr
    rows = read_csv(out)
    assert rows[0] == ["path", "label_1", "score_1", "label_2", "score_2", "label_3", "score_3"]
    want = [r for r in classifier.classify_many(list_images(tree, recursive=True), top=3)
            if r.error is None]
    assert [row[0] for row in rows[1:]] == [str(r.path) for r in want]
    for row, r in zip(rows[1:], want):
        assert row[1::2] == [label for label, _ in r.top]
        np.testing.assert_allclose([float(s) for s in row[2::2]], [p for _, p in r.top],
                                   atol=2e-6)


@pytest.mark.slow
def test_cli_folder_prints_a_block_per_image_and_the_throughput(tree):
    result = run(str(tree / "sub"), "--top", "2")
    assert result.returncode == 1                           # broken.png, empty.jpg
    lines = result.stdout.splitlines()
    assert lines[0] == f"{tree / 'sub' / 'h.png'}:" and len(lines) == 3
    assert lines[1].rsplit(maxsplit=1)[1].startswith("0.")
    assert THROUGHPUT.search(result.stderr).groups() == ("1", "2")


@pytest.mark.slow
def test_cli_good_folder_exits_0_and_files_keep_todays_output(tree, tmp_path):
    good = tmp_path / "good"
    write_image(good / "x.png", 1)
    write_image(good / os.fsdecode(b"caf\xe9.jpg"), 2)     # a file name that is not UTF-8
    out = tmp_path / "good.csv"
    result = run(str(good), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert THROUGHPUT.search(result.stderr).groups() == ("2", "0")
    assert [row[0] for row in read_csv(out)[1:]] == [str(good / os.fsdecode(b"caf\xe9.jpg")),
                                                     str(good / "x.png")]
    printed = run(str(good), "--top", "1")
    assert printed.returncode == 0 and "caf\\udce9.jpg:" in printed.stdout
    alone = run(str(good / "x.png"), "--top", "2")          # a file: lines as before, no more
    assert alone.returncode == 0 and alone.stderr == ""
    assert len(alone.stdout.splitlines()) == 2 and ":" not in alone.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, code, words", [
    (["{tree}/empty"], 1, "error: {tree}/empty: no images in this folder"),
    (["{tree}", "-o", "/no/such/folder/out.csv"], 2, "error: cannot write /no/such/folder/"
                                                      "out.csv: No such file or directory"),
    (["{tree}", "--workers", "2"], 2, "error: --workers: the number of Ray workers, for --ray"),
    (["{tree}", "--batch", "0"], 2, "--batch: must be at least 1"),
], ids=["empty", "output", "workers", "batch"])
def test_cli_exit_codes(tree, args, code, words):
    result = run(*(a.format(tree=tree) for a in args))
    assert result.returncode == code and words.format(tree=tree) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_benchmark_folder_line(tmp_path, capsys):
    """python -m infer.bench --folder --quick: both engines through the same pipeline on
    generated images, the same answers, and the line with both throughputs and the CPU."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from infer.bench.__main__ import main as bench

    assert bench(["--folder", "--quick", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^folder: pnnx-infer [\d.]+ images/s, onnxruntime [\d.]+ images/s: "
                     r"[\d.]+x onnxruntime's throughput; the same top-5 labels, probabilities "
                     r"within \S+$", out, re.M)
    assert re.search(r"^- CPU: \S", out, re.M) and "16 generated images" in out


def test_cli_ray_hands_the_job_to_classify_on_ray_and_writes_the_same_csv(
        tree, tmp_path, classifier, monkeypatch):
    """--ray: the listed paths and the options go to infer.cluster.classify_on_ray, whose
    answers make the same CSV and exit code as the run without it. A stand-in answers as
    classify_many does (test_cluster.py runs the real one on Ray and compares the two)."""
    from infer import cluster
    from infer.__main__ import main

    calls = []

    def on_ray(paths, model, **options):
        calls.append((list(paths), model, options))
        return classifier.classify_many(calls[-1][0], top=options["top"],
                                        batch=options["batch"])

    monkeypatch.setattr(cluster, "classify_on_ray", on_ray)
    local, ray_csv = tmp_path / "local.csv", tmp_path / "ray.csv"
    assert main(["classify", str(tree), "-r", "--top", "3", "-o", str(local)]) == 1
    assert main(["classify", str(tree), "-r", "--top", "3", "-o", str(ray_csv), "--ray",
                 "--workers", "2", "--batch", "4"]) == 1
    (paths, model, options), = calls
    assert [str(p) for p in paths] == [str(p) for p in list_images(tree, recursive=True)]
    assert model == "efficientnet_lite0"
    assert options == {"top": 3, "batch": 4, "workers": 2, "threads": 1, "address": None}
    rows = [read_csv(path) for path in (local, ray_csv)]
    assert len(rows[0]) == 10                  # the header and the 9 images read
    assert [[r[0]] + r[1::2] for r in rows[0]] == [[r[0]] + r[1::2] for r in rows[1]]
    np.testing.assert_allclose([float(x) for r in rows[0][1:] for x in r[2::2]],
                               [float(x) for r in rows[1][1:] for x in r[2::2]], atol=2e-6)
