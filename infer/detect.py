"""Face detection with MTCNN: three small networks in a cascade, and the numpy around them.

    from infer.detect import FaceDetector
    from infer.images import read_image
    faces = FaceDetector().detect(read_image("model_file/images/astronaut.png"))
    faces[0].box, faces[0].score, faces[0].landmarks     # (4,) x1 y1 x2 y2, float, (5, 2) x y

MTCNN (Zhang et al. 2016) finds faces of any size with networks that see one size each. The
weights are facenet-pytorch's (model_file/mtcnn/, NOTICE.md), and so is the calibration below:
the formulas, thresholds and conventions of its ``detect_face``, itself a port of the original.

1. **Image pyramid.** P-Net looks at 12 x 12 windows. To find faces of ``min_face_size`` (20)
   pixels and larger, the image is scaled by 12 / 20, then again by ``factor`` (0.709, so each
   level has half the pixels of the last) while its shorter side is at least 12 pixels.
2. **Proposals (P-Net).** Run on every level, P-Net gives per output cell (a 12 x 12 window,
   stride 2) the probability of a face and four offsets. Windows with probability >= 0.6 are
   mapped back to the image; NMS at IoU 0.5 within each level, then at 0.7 across levels; each
   box is moved by its offsets and made square.
3. **Refinement (R-Net).** Each box is cut out and resized to 24 x 24; R-Net scores it again
   (kept if > 0.7), NMS at 0.7, moved by R-Net's offsets, made square.
4. **Output (O-Net).** The same on 48 x 48 crops (kept if > 0.7), plus five landmarks; boxes
   moved by O-Net's offsets, and a last NMS at 0.7 of intersection over the *smaller* box.

Pixels go in as RGB scaled by ``(x - 127.5) / 128``. All three networks run on this runtime:
one RuntimeGraph per network, built once; P-Net's graph re-plans its shapes for every pyramid
level (the plans are kept, so a second image of the same size plans nothing), R-Net and O-Net
take all their crops in one batch (BATCH at most).

Where this differs from facenet-pytorch:

- Images and crops are resized with OpenCV's area interpolation (``cv2.INTER_AREA``, which
  David Sandberg's TensorFlow MTCNN, whose weights facenet-pytorch ported, uses; here on float32
  pixels, as facenet-pytorch resizes floats). facenet-pytorch uses torch's
  ``interpolate(mode="area")``, an adaptive average pooling. Both average the pixels under each
  output pixel, but OpenCV weights a pixel cut by the output pixel's edge by the part inside,
  torch counts it whole (so too when a crop smaller than 24 or 48 pixels is enlarged: [0, 100,
  200] to 7 pixels is 0 0 66.7 100 133.3 200 200 in OpenCV, 0 0 50 100 150 200 200 in torch).
  On the astronaut a side of the box moves by up to 2.3 pixels, a landmark by up to 0.7
  (tests/models/test_detect_torch.py runs both).
- Box arithmetic is float64, as in the original MATLAB and numpy code; facenet-pytorch's float32
  puts some P-Net windows a pixel off (it floors 9 / 0.6 to 14, not 15).
- As in facenet-pytorch (the original pads with zeros instead), a box reaching out of the image
  is cropped to its part inside; a box with no pixel inside is dropped (facenet-pytorch would
  misalign its list). NMS keeps the earlier box of equal scores (a stable sort).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from model_file import MODEL_DIR
from parser.errors import ImageError
from infer.graph import RuntimeGraph
from infer.images import as_rgb

__all__ = ["FaceDetector", "Face", "pyramid_scales", "pyramid_sizes", "nms", "draw_boxes",
           "draw_faces", "write_image", "LANDMARKS", "MTCNN_DIR"]

MTCNN_DIR = MODEL_DIR / "mtcnn"
LANDMARKS = ("left eye", "right eye", "nose", "mouth left", "mouth right")   # as seen in the image
WINDOW, STRIDE = 12, 2        # P-Net: each output cell sees a 12 x 12 window, 2 pixels apart
BATCH = 256                   # crops per R-Net / O-Net forward
NmsStep = Callable[[int, np.ndarray, np.ndarray], None]     # nms's on_step(best, others, overlap)


@dataclass
class Face:
    """One detected face, in pixels of the image: ``box`` (4,) x1, y1, x2, y2; ``score`` O-Net's
    face probability; ``landmarks`` (5, 2) x, y of LANDMARKS."""

    box: np.ndarray
    score: float
    landmarks: np.ndarray


# ----------------------------------------------------------------------------- the pyramid
def pyramid_scales(height: int, width: int, min_face_size: float = 20,
                   factor: float = 0.709) -> list[float]:
    """The scales at which P-Net sees the image: 12 / min_face_size (a face of min_face_size
    pixels becomes P-Net's 12 x 12 window), then times ``factor`` per level, while the shorter
    side, scaled, is at least 12 pixels. A ValueError unless min_face_size > 0 and
    0 < factor < 1."""
    if not (min_face_size > 0 and 0 < factor < 1):
        raise ValueError(f"the pyramid needs min_face_size > 0 and 0 < factor < 1, got "
                         f"{min_face_size} and {factor}")
    scale = WINDOW / min_face_size
    shorter = min(height, width) * scale
    scales = []
    while shorter >= WINDOW:
        scales.append(scale)
        scale *= factor
        shorter *= factor
    return scales


def pyramid_sizes(height: int, width: int, min_face_size: float = 20,
                  factor: float = 0.709) -> list[tuple[int, int]]:
    """(height, width) of each pyramid level, as facenet-pytorch rounds them."""
    return [level_size(height, width, scale)
            for scale in pyramid_scales(height, width, min_face_size, factor)]


def level_size(height: int, width: int, scale: float) -> tuple[int, int]:
    return int(height * scale + 1), int(width * scale + 1)


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W, 3) float32 -> (height, width, 3) float32, by OpenCV's area interpolation."""
    import cv2

    resized: np.ndarray = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    return resized


def network_input(images: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) or (H, W, 3) RGB pixels -> (N, 3, H, W) float32 scaled as (x - 127.5) / 128."""
    images = images if images.ndim == 4 else images[None]
    return np.ascontiguousarray(((images - 127.5) * 0.0078125).transpose(0, 3, 1, 2),
                                dtype=np.float32)


# ------------------------------------------------------------------------------ box algebra
def window_boxes(face_probability: np.ndarray, offsets: np.ndarray, scale: float,
                 threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P-Net's output on one pyramid level -> the windows it finds a face in, as image boxes.

    face_probability (H', W'), offsets (4, H', W'). The cell at (row, col) saw the window whose
    corners are (STRIDE * col, STRIDE * row) and that + WINDOW on the level; in the image, whose
    coordinates count pixels from 1 as the original MATLAB code did, that is
    floor((STRIDE * col + 1) / scale) .. floor((STRIDE * col + WINDOW) / scale).
    Returns boxes (K, 4) x1 y1 x2 y2, scores (K,), offsets (K, 4), for probability >= threshold."""
    rows, cols = np.nonzero(face_probability >= threshold)
    corner = np.stack([cols, rows], axis=1).astype(np.float64)               # (K, 2) x, y
    top_left = np.floor((STRIDE * corner + 1) / scale)
    bottom_right = np.floor((STRIDE * corner + WINDOW) / scale)
    boxes = np.concatenate([top_left, bottom_right], axis=1)                 # (K, 4)
    return boxes, face_probability[rows, cols].astype(np.float64), offsets[:, rows, cols].T


def regress(boxes: np.ndarray, offsets: np.ndarray, inclusive: bool) -> np.ndarray:
    """Move each box's four sides by the network's offsets, in box widths and heights:
    x1 + dx1 * w, y1 + dy1 * h, x2 + dx2 * w, y2 + dy2 * h. The original counts the width as
    x2 - x1 after P-Net and as x2 - x1 + 1 (pixels, both ends included) after R-Net and O-Net:
    ``inclusive`` chooses."""
    extra = 1.0 if inclusive else 0.0
    w = boxes[:, 2] - boxes[:, 0] + extra
    h = boxes[:, 3] - boxes[:, 1] + extra
    moved: np.ndarray = boxes + offsets * np.stack([w, h, w, h], axis=1)
    return moved


def square(boxes: np.ndarray) -> np.ndarray:
    """Each box made a square around its centre, the side its longer side (x2 - x1 or
    y2 - y1): R-Net and O-Net see square crops."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    x1 = boxes[:, 0] + (w - side) / 2
    y1 = boxes[:, 1] + (h - side) / 2
    return np.stack([x1, y1, x1 + side, y1 + side], axis=1)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, mode: str = "union",
        inclusive: bool = False, on_step: NmsStep | None = None) -> np.ndarray:
    """Greedy non-maximum suppression: the indices of the boxes kept, best score first.

    Take the best box left and keep it; drop every other box that overlaps it by more than
    ``threshold``; repeat until no box is left. The overlap of two boxes is
    intersection / union (``mode="union"``, IoU) or intersection / the smaller box's area
    (``mode="min"``: a small box inside a large one counts as fully overlapping). Widths are
    x2 - x1 (torchvision's NMS), or x2 - x1 + 1 with ``inclusive`` (coordinates of pixels,
    both ends included: MTCNN's own NMS). Of equal scores the earlier box comes first.
    ``on_step(best, others, overlap)``, if given, is called at each step with the index of the
    box kept, the indices of the boxes left, and their overlaps with it (to watch it work)."""
    if mode not in ("union", "min"):
        raise ValueError(f"mode is 'union' or 'min', got {mode!r}")
    extra = 1.0 if inclusive else 0.0
    x1, y1, x2, y2 = boxes.T
    area = (x2 - x1 + extra) * (y2 - y1 + extra)
    order = np.argsort(-scores, kind="stable")            # best first
    kept = []
    while order.size:
        best, others = order[0], order[1:]
        kept.append(best)
        width = np.maximum(0.0, np.minimum(x2[best], x2[others])
                           - np.maximum(x1[best], x1[others]) + extra)
        height = np.maximum(0.0, np.minimum(y2[best], y2[others])
                            - np.maximum(y1[best], y1[others]) + extra)
        intersection = width * height
        if mode == "union":
            overlap = intersection / (area[best] + area[others] - intersection)
        else:
            overlap = intersection / np.minimum(area[best], area[others])
        if on_step is not None:
            on_step(int(best), others, overlap)
        order = others[overlap <= threshold]
    return np.array(kept, dtype=np.int64)


def crops(image: np.ndarray, boxes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut each box out of ``image`` (H, W, 3) float32 and resize it to ``size`` x ``size``:
    (K', size, size, 3), and the indices of the boxes that gave a crop (K').

    As facenet-pytorch does: the box's corners are truncated to whole pixels, read as 1-based
    (x1 = 1 is the first column, so the crop is columns x1 - 1 .. x2 - 1 counting from 0), and
    clipped to the image; a box with no pixel inside the image gives no crop."""
    h, w = image.shape[:2]
    corners = np.trunc(boxes).astype(np.int64)
    left, top = np.maximum(corners[:, 0], 1) - 1, np.maximum(corners[:, 1], 1) - 1
    right, bottom = np.minimum(corners[:, 2], w), np.minimum(corners[:, 3], h)
    inside = np.nonzero((right > left) & (bottom > top))[0]
    out = np.empty((len(inside), size, size, 3), np.float32)
    for k, i in enumerate(inside):
        out[k] = resize(image[top[i]:bottom[i], left[i]:right[i]], size, size)
    return out, inside


def place_landmarks(boxes: np.ndarray, points: np.ndarray) -> np.ndarray:
    """O-Net's landmarks (K, 10), x1..x5 then y1..y5 as fractions of the box (width
    x2 - x1 + 1), -> (K, 5, 2) x, y in pixels of the image (0-based, hence the - 1)."""
    w = boxes[:, 2:3] - boxes[:, 0:1] + 1
    h = boxes[:, 3:4] - boxes[:, 1:2] + 1
    x = boxes[:, 0:1] + w * points[:, :5] - 1
    y = boxes[:, 1:2] + h * points[:, 5:] - 1
    return np.stack([x, y], axis=2)


# ------------------------------------------------------------------------------ the detector
class FaceDetector:
    """MTCNN on this runtime: ``detect(image_rgb)`` -> faces, best score first.

    ``folder`` holds pnet / rnet / onet ``.pnnx.param`` and ``.pnnx.bin``; ``thresholds`` are the
    face probabilities each network must give a box to keep it; ``reference=True`` runs the
    graphs on the numpy reference layers. The three stages are methods of their own
    (``propose``, ``refine``, ``output``), each taking and giving boxes, to be run one by one."""

    def __init__(self, folder: str | Path = MTCNN_DIR, *, min_face_size: float = 20,
                 factor: float = 0.709, thresholds: Sequence[float] = (0.6, 0.7, 0.7),
                 reference: bool = False):
        pyramid_scales(WINDOW, WINDOW, min_face_size, factor)       # refuses bad values now
        folder = Path(folder)
        self.pnet, self.rnet, self.onet = (
            RuntimeGraph(folder / f"{name}.pnnx.param", folder / f"{name}.pnnx.bin",
                         reference=reference).build()
            for name in ("pnet", "rnet", "onet"))
        self.min_face_size = min_face_size
        self.factor = factor
        self.thresholds = tuple(thresholds)

    def set_num_threads(self, n: int | None) -> None:
        """Cap the threads each network's forward uses (None: every core)."""
        for graph in (self.pnet, self.rnet, self.onet):
            graph.set_num_threads(n)

    def detect(self, image_rgb: np.ndarray) -> list[Face]:
        """Faces in an (H, W, 3) uint8 RGB image (grey or RGBA: see ``as_rgb``), best first."""
        image = as_rgb(image_rgb).astype(np.float32)                     # (H, W, 3)
        boxes, _ = self.propose(image)
        boxes, _ = self.refine(image, boxes)
        boxes, scores, landmarks = self.output(image, boxes)
        return [Face(box, float(score), points)
                for box, score, points in zip(boxes, scores, landmarks)]

    def propose(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stage 1: P-Net over the pyramid. (H, W, 3) float32 -> square boxes (K, 4) and
        P-Net's scores (K,)."""
        h, w = image.shape[:2]
        found = []
        for scale in pyramid_scales(h, w, self.min_face_size, self.factor):
            level = resize(image, *level_size(h, w, scale))                     # (h', w', 3)
            probability, offsets = self.pnet.forward(network_input(level))     # (1, 2, ...)
            boxes, scores, shifts = window_boxes(probability[0, 1], offsets[0], scale,
                                                 self.thresholds[0])
            keep = nms(boxes, scores, 0.5)                                     # within a level
            found.append((boxes[keep], scores[keep], shifts[keep]))
        if not found:
            return np.empty((0, 4)), np.empty(0)
        boxes, scores, shifts = (np.concatenate(parts) for parts in zip(*found))
        keep = nms(boxes, scores, 0.7)                                          # across levels
        return square(regress(boxes[keep], shifts[keep], inclusive=False)), scores[keep]

    def refine(self, image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stage 2: R-Net on 24 x 24 crops. -> square boxes (K, 4), R-Net's scores (K,)."""
        pixels, inside = crops(image, boxes, 24)
        if not len(inside):
            return np.empty((0, 4)), np.empty(0)
        probability, shifts = run_batched(self.rnet, network_input(pixels))
        passed = np.nonzero(probability[:, 1] > self.thresholds[1])[0]
        boxes, scores, shifts = boxes[inside[passed]], probability[passed, 1], shifts[passed]
        keep = nms(boxes, scores, 0.7)
        return square(regress(boxes[keep], shifts[keep], inclusive=True)), scores[keep]

    def output(self, image: np.ndarray, boxes: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stage 3: O-Net on 48 x 48 crops. -> boxes (K, 4), O-Net's scores (K,), landmarks
        (K, 5, 2), best first."""
        pixels, inside = crops(image, boxes, 48)
        if not len(inside):
            return np.empty((0, 4)), np.empty(0), np.empty((0, 5, 2))
        probability, shifts, points = run_batched(self.onet, network_input(pixels))
        passed = np.nonzero(probability[:, 1] > self.thresholds[2])[0]
        boxes, scores = boxes[inside[passed]], probability[passed, 1].astype(np.float64)
        landmarks = place_landmarks(boxes, points[passed])        # from the box before moving
        boxes = regress(boxes, shifts[passed], inclusive=True)
        keep = nms(boxes, scores, 0.7, mode="min", inclusive=True)
        return boxes[keep], scores[keep], landmarks[keep]


def run_batched(graph: RuntimeGraph, x: np.ndarray) -> list[np.ndarray]:
    """``graph`` on the (N, ...) batch ``x`` (N >= 1), BATCH at a time: its outputs, each
    concatenated along N, as float64."""
    parts = [graph.forward(x[start:start + BATCH]) for start in range(0, len(x), BATCH)]
    return [np.concatenate(outputs).astype(np.float64) for outputs in zip(*parts)]


# ------------------------------------------------------------------------------ drawing
def draw_boxes(image_rgb: np.ndarray, boxes: np.ndarray, scores: Sequence[float] | None = None,
               colour: tuple[int, int, int] = (0, 255, 0)) -> np.ndarray:
    """A copy of the image with the boxes (K, 4) x1 y1 x2 y2 drawn, and their scores if given."""
    import cv2

    out = np.ascontiguousarray(as_rgb(image_rgb)).copy()
    thick = max(1, round(min(out.shape[:2]) / 300))
    for k, box in enumerate(boxes):
        x1, y1, x2, y2 = (int(round(v)) for v in box[:4])
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, thick)
        if scores is not None:
            cv2.putText(out, f"{scores[k]:.3f}", (x1, max(y1 - 3 * thick, 10)),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.4 * thick, colour, 1, cv2.LINE_AA)
    return out


def draw_faces(image_rgb: np.ndarray, faces: Sequence[Face]) -> np.ndarray:
    """A copy of the image with each face's box (green), score and landmarks (red) drawn."""
    import cv2

    out = draw_boxes(image_rgb, np.array([f.box for f in faces]).reshape(-1, 4),
                     [f.score for f in faces])
    radius = max(1, round(min(out.shape[:2]) / 250))
    for face in faces:
        for x, y in face.landmarks:
            cv2.circle(out, (int(round(x)), int(round(y))), radius, (255, 0, 0), -1)
    return out


def write_image(path: str | Path, image_rgb: np.ndarray) -> None:
    """Write an (H, W, 3) RGB image, of the type its extension names (.png, .jpg, ...); an
    ImageError naming the file if OpenCV cannot encode that type or the file cannot be written."""
    import cv2

    path = Path(path)
    try:
        ok, data = cv2.imencode(path.suffix, cv2.cvtColor(image_rgb, cv2.COLOR_RGB2BGR))
    except cv2.error:
        ok = False
    if not ok:
        raise ImageError(f"{path}: OpenCV cannot write this type of image (.png, .jpg, ...)")
    try:
        path.write_bytes(data.tobytes())
    except OSError as exc:
        raise ImageError(f"{path}: cannot write: {exc.strerror or exc}") from None
