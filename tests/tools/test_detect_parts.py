"""The parts of the face detector (infer/detect.py) one by one, on hand-made numbers: the image
pyramid and the shapes P-Net's graph plans for it, NMS, and the box algebra of MTCNN."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infer import RuntimeGraph
from infer.detect import (MTCNN_DIR, crops, nms, place_landmarks, pyramid_scales, pyramid_sizes,
                          regress, square, window_boxes)


# ----------------------------------------------------------------------------- the pyramid
def test_pyramid_of_a_512_pixel_square():
    # 12 / 20 = 0.6, then x 0.709 while 512 * scale >= 12: 307.2 * 0.709**k >= 12 for k <= 9
    scales = pyramid_scales(512, 512)
    assert len(scales) == 10
    np.testing.assert_allclose(scales, [0.6 * 0.709 ** k for k in range(10)])
    sizes = pyramid_sizes(512, 512)
    assert sizes[0] == (308, 308) and sizes[-1] == (int(512 * scales[-1] + 1),) * 2
    assert all(h >= 12 for h, _ in sizes)


def test_pyramid_follows_the_shorter_side_and_the_minimum_face():
    assert pyramid_sizes(300, 451)[0] == (181, 271)
    assert pyramid_scales(19, 1000) == []                 # no face of 20 pixels fits
    assert pyramid_scales(20, 1000) == [0.6]
    assert pyramid_scales(512, 512, min_face_size=40)[0] == pytest.approx(0.3)
    assert len(pyramid_scales(512, 512, factor=0.5)) < len(pyramid_scales(512, 512))
    for bad in ({"factor": 1.0}, {"factor": 0.0}, {"min_face_size": 0}):
        with pytest.raises(ValueError, match="0 < factor < 1"):
            pyramid_scales(512, 512, **bad)


def test_pnet_graph_plans_every_pyramid_level():
    """One graph, a plan per input size: P-Net's output is ceil((h - 2) / 2) - 4 cells high."""
    graph = RuntimeGraph(MTCNN_DIR / "pnet.pnnx.param", MTCNN_DIR / "pnet.pnnx.bin").build()
    for h, w in pyramid_sizes(300, 451):
        shapes = graph.infer_shapes((1, 3, h, w))
        out_h, out_w = math.ceil((h - 2) / 2) - 4, math.ceil((w - 2) / 2) - 4
        probability, offsets = (shapes[o.name] for o in graph.output_operands)
        assert probability == (1, 2, out_h, out_w) and offsets == (1, 4, out_h, out_w)


# ----------------------------------------------------------------------------- NMS
def brute_force_nms(boxes, scores, threshold, mode="union", inclusive=False):
    """NMS as the definition reads: walk the boxes best first, keep one if it overlaps no kept
    box by more than the threshold."""
    extra = 1.0 if inclusive else 0.0

    def area(b):
        return (b[2] - b[0] + extra) * (b[3] - b[1] + extra)

    kept: list[int] = []
    for i in sorted(range(len(boxes)), key=lambda k: (-scores[k], k)):
        a = boxes[i]
        for j in kept:
            b = boxes[j]
            w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + extra)
            h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + extra)
            inter = w * h
            union = area(a) + area(b) - inter
            overlap = inter / (union if mode == "union" else min(area(a), area(b)))
            if overlap > threshold:
                break
        else:
            kept.append(i)
    return kept


def test_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], float)
    scores = np.array([0.8, 0.9, 0.7])
    # IoU of the first two: 81 / (100 + 100 - 81) = 0.68
    assert nms(boxes, scores, 0.5).tolist() == [1, 2]
    assert nms(boxes, scores, 0.7).tolist() == [1, 0, 2]


def test_nms_min_mode_drops_a_box_inside_another():
    boxes = np.array([[0, 0, 100, 100], [40, 40, 50, 50]], float)
    scores = np.array([0.9, 0.8])
    assert nms(boxes, scores, 0.7).tolist() == [0, 1]               # IoU 0.01
    assert nms(boxes, scores, 0.7, mode="min").tolist() == [0]       # inside: overlap 1


def test_nms_inclusive_counts_both_end_pixels():
    # x2 - x1 widths: they touch, no overlap; inclusive widths: one shared column of 1 x 2
    boxes = np.array([[0, 0, 1, 1], [1, 0, 2, 1]], float)
    scores = np.array([0.9, 0.8])
    assert nms(boxes, scores, 0.0).tolist() == [0, 1]
    assert nms(boxes, scores, 0.0, inclusive=True).tolist() == [0]


def test_nms_of_equal_scores_keeps_the_earlier_box_and_of_nothing_gives_nothing():
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
    assert nms(boxes, np.array([0.5, 0.5]), 0.5).tolist() == [0]
    kept = nms(np.empty((0, 4)), np.empty(0), 0.5)
    assert kept.shape == (0,) and kept.dtype == np.int64
    with pytest.raises(ValueError, match="mode"):
        nms(boxes, np.array([0.5, 0.5]), 0.5, mode="max")


@pytest.mark.parametrize("mode", ["union", "min"])
@pytest.mark.parametrize("inclusive", [False, True])
def test_nms_agrees_with_its_definition_on_random_boxes(mode, inclusive):
    rng = np.random.default_rng(24)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        corner = rng.uniform(0, 100, (n, 2))
        boxes = np.concatenate([corner, corner + rng.uniform(1, 40, (n, 2))], axis=1)
        scores = rng.choice([0.6, 0.7, 0.8, 0.9], n) + rng.uniform(0, 0.05, n) * (n % 2)
        threshold = float(rng.uniform(0.1, 0.8))
        assert nms(boxes, scores, threshold, mode, inclusive).tolist() == \
            brute_force_nms(boxes, scores, threshold, mode, inclusive)


# ----------------------------------------------------------------------------- box algebra
def test_window_boxes_map_cells_back_to_the_image():
    probability = np.zeros((6, 8), np.float32)
    probability[3, 5] = 0.9                               # row 3, column 5
    probability[1, 1] = 0.5                               # under the threshold
    offsets = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    boxes, scores, shifts = window_boxes(probability, offsets, 0.5, 0.6)
    # x: floor((2 * 5 + 1) / 0.5) = 22 .. floor((2 * 5 + 12) / 0.5) = 44; y: 14 .. 36
    assert boxes.tolist() == [[22, 14, 44, 36]]
    assert scores == pytest.approx([0.9])
    assert shifts.tolist() == [offsets[:, 3, 5].tolist()]


def test_regress_square_and_landmarks():
    box = np.array([[10.0, 20.0, 30.0, 60.0]])
    offsets = np.array([[0.1, -0.1, 0.0, 0.5]])
    # width 20 (x2 - x1) or 21 (inclusive), height 40 or 41
    assert regress(box, offsets, inclusive=False).tolist() == [[12, 16, 30, 80]]
    assert regress(box, offsets, inclusive=True) == pytest.approx(
        np.array([[12.1, 15.9, 30, 80.5]]))
    assert square(box).tolist() == [[0, 20, 40, 60]]     # side 40 around the centre (20, 40)
    points = np.array([[0.0] * 5 + [1.0] * 5])            # x at the box's left, y at its bottom
    assert place_landmarks(box, points).tolist() == [[[9, 60]] * 5]


def test_crops_read_boxes_one_based_and_clip_them_to_the_image():
    image = np.arange(10 * 12 * 3, dtype=np.float32).reshape(10, 12, 3)
    boxes = np.array([[1.7, 1.2, 4.9, 4.0],               # truncated: columns 0..3, rows 0..3
                      [-5.0, -5.0, 3.0, 3.0],              # clipped to rows and columns 0..2
                      [20.0, 2.0, 30.0, 8.0]])             # right of the image: no crop
    pixels, inside = crops(image, boxes, 2)
    assert inside.tolist() == [0, 1] and pixels.shape == (2, 2, 2, 3)
    # a 4 x 4 crop to 2 x 2 by area: each output pixel is the mean of a 2 x 2 block
    np.testing.assert_allclose(pixels[0, 0, 0], image[0:2, 0:2].mean(axis=(0, 1)))
    np.testing.assert_allclose(pixels[0, 1, 1], image[2:4, 2:4].mean(axis=(0, 1)))
    np.testing.assert_allclose(pixels[1].mean(axis=(0, 1)), image[0:3, 0:3].mean(axis=(0, 1)),
                               rtol=1e-6)
