"""Reading an image file a user names, within limits: (H, W, 3) uint8 RGB or an ImageError.

What a user names may be hostile or a mistake, and ends in one ImageError naming the file,
never in a traceback, a hang or gigabytes of memory:

- the file is read only if it is a regular file (a FIFO or ``/dev/zero`` is refused without
  blocking: ``parser.files.read_file``) of at most MAX_IMAGE_BYTES (256 MiB);
- it is decoded into at most MAX_PIXELS (100 megapixels). The header of a PNG or JPEG gives
  its size before anything is decoded: a larger JPEG is decoded at 1/2, 1/4 or 1/8 of its size
  (libjpeg scales while decoding), a larger PNG is refused. Other formats are held to OpenCV's
  own header check, ``OPENCV_IO_MAX_IMAGE_PIXELS``, which OpenCV reads when cv2 is loaded:
  this module sets it to MAX_PIXELS (if cv2 was not imported before it, and the variable is
  not set already).
"""

from __future__ import annotations

import math
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from parser.errors import ImageError
from parser.files import MiB, read_file

MAX_PIXELS = 100_000_000          # decoded image budget: 100 megapixels, 300 MB as RGB
MAX_IMAGE_BYTES = 256 * MiB

# OpenCV reads its own pixel limit once, when cv2 is first imported (by read_image, later):
# set it here so that every format OpenCV decodes is held to MAX_PIXELS, not only the PNG
# and JPEG whose headers read_image checks (unless the user set the variable, or imported
# cv2 before this module)
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_PIXELS))

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"     # as OpenCV tells a JPEG


def read_image(path: str | Path) -> np.ndarray:
    """An image file as (H, W, 3) uint8 RGB (opencv reads BGR; grey, alpha and 16-bit images are
    converted), decoded into at most MAX_PIXELS (``decode_flags``). An ImageError naming the
    file says why not: no such file, not a regular file, larger than MAX_IMAGE_BYTES, empty,
    too many pixels, or bytes OpenCV cannot decode. The file is read here and decoded with
    ``cv2.imdecode`` with OpenCV's log quiet, so OpenCV's own warnings ("can't open/read file",
    "PNG input buffer is incomplete") do not reach the terminal beside the error."""
    import cv2

    data = read_file(path, MAX_IMAGE_BYTES, lambda message: ImageError(f"{path}: {message}"))
    if not data:
        raise ImageError(f"{path}: empty file")
    image = _decode(path, data, decode_flags(path, data))              # (H, W, 3) BGR
    rgb: np.ndarray = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return rgb


def decode_flags(path: str | Path, data: bytes) -> int:
    """The ``cv2.imdecode`` flags that keep the decoded image within MAX_PIXELS:
    IMREAD_COLOR, or for a larger JPEG the IMREAD_REDUCED_COLOR_n (n = 2, 4 or 8) that fits
    (libjpeg decodes at 1/n, n times n less memory). Any other image whose header gives more
    pixels is an ImageError saying its size; one whose header is not read here (not PNG or
    JPEG, or damaged) is left to OpenCV's own check."""
    import cv2

    size = image_header_size(data)
    if size is None or size[0] * size[1] <= MAX_PIXELS:
        return int(cv2.IMREAD_COLOR)
    width, height = size
    if data.startswith(JPEG_SIGNATURE):
        for n, flag in ((2, cv2.IMREAD_REDUCED_COLOR_2), (4, cv2.IMREAD_REDUCED_COLOR_4),
                        (8, cv2.IMREAD_REDUCED_COLOR_8)):
            if math.ceil(width / n) * math.ceil(height / n) <= MAX_PIXELS:
                return int(flag)
    raise ImageError(f"{path}: the image is {width} x {height} pixels, more than the "
                     f"{MAX_PIXELS:,} pixels this classifier decodes")


def image_header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) as the header of PNG or JPEG bytes gives it, without decoding; None for
    other formats and for a header too damaged to read."""
    if data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data.startswith(JPEG_SIGNATURE):
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Walk a JPEG's marker segments (0xFF, kind, 2-byte length, body) as libjpeg does to its
    frame header (SOF0..SOF15, but not C4 DHT, C8 JPG, CC DAC), whose body starts with
    precision, height, width. Bytes between segments are skipped, as libjpeg skips them."""
    pos = 2
    while pos + 9 <= len(data):
        marker = data[pos + 1]
        if data[pos] != 0xFF:                               # junk: on to the next 0xFF
            pos = data.find(b"\xff", pos)
            if pos < 0:
                return None
        elif marker == 0xFF:                                # a fill byte before the marker
            pos += 1
        elif marker == 0xDA:                                # scan data before any frame header
            return None
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        elif 0xD0 <= marker <= 0xD9 or marker == 0x01:     # RSTn, SOI, EOI, TEM: no length
            pos += 2
        else:
            pos += 2 + struct.unpack(">H", data[pos + 2:pos + 4])[0]
    return None


def _decode(path: str | Path, data: bytes, flags: int) -> np.ndarray:
    """``cv2.imdecode`` as an (H, W, 3) BGR array; an ImageError if OpenCV cannot or will not
    (an image over its OPENCV_IO_MAX_IMAGE_PIXELS) decode it."""
    import cv2

    try:
        with _opencv_quiet():
            image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:
        if getattr(exc, "func", "") == "validateInputImageSize":
            raise ImageError(f"{path}: the image is larger than OpenCV decodes (its check "
                             f"'{getattr(exc, 'err', '')}' failed; OPENCV_IO_MAX_IMAGE_PIXELS "
                             f"sets that limit)") from None
        raise ImageError(f"{path}: OpenCV cannot decode it: "
                         f"{getattr(exc, 'err', '') or exc}") from None
    if image is None:
        raise ImageError(f"{path}: cannot decode this file as an image (damaged, or not a "
                         f"format OpenCV reads: png, jpg, bmp, tiff, webp, ...)")
    decoded: np.ndarray = image
    return decoded


@contextmanager
def _opencv_quiet() -> Iterator[None]:
    """OpenCV's log silent for the length of the block: its warnings and errors ("can't read
    header: ...", several lines) go straight to stderr, and the caller reports the failure
    itself, in one line."""
    from cv2.utils import logging as cv_log

    level = cv_log.getLogLevel()
    cv_log.setLogLevel(cv_log.LOG_LEVEL_SILENT)
    try:
        yield
    finally:
        cv_log.setLogLevel(level)


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An image array as (H, W, 3) uint8 RGB, as ``read_image`` gives it: grey (H, W) or
    (H, W, 1) is repeated to three channels, RGBA (H, W, 4) loses its alpha. Other shapes and
    other dtypes (a float image in [0, 1] would silently be scaled wrong) are an ImageError."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        kind = image.dtype if isinstance(image, np.ndarray) else type(image).__name__
        raise ImageError(f"expects a uint8 image array (0..255), got {kind}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or 0 in image.shape:
        raise ImageError(f"expects an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image, got "
                         f"shape {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return image[:, :, :3]
