"""Nearest upsampling by whole factors: ``F.interpolate(x, scale_factor=k)`` in nearest
mode where every output size is k times the input's (FPN and DBNet heads, YOLO's necks)::

    y[n, c, i * kh + a, j * kw + b] = x[n, c, i, j]        for a < kh, b < kw

Plane by plane: each input row is widened once into the first output row of its group
(each value kw times), then that row is copied into the kh - 1 rows below it. A copy, so
the result is the reference's (layers/resize.py ``repeat_each``) bit for bit. With helper
threads (workers.Team.upsample) the planes are shared, one run of planes per thread.
"""

from __future__ import annotations

import functools

import numpy as np

from layers.fast.kernel import INT, array, kernel
from layers.fast.team import team_worth_sharing

SHARED_FROM = 1 << 16        # values of y: a smaller copy runs faster on this thread alone


@kernel(nogil=True, exported=(array(4), array(4), INT, INT))
def _upsample_nearest(x, y, kh, kw):
    """y (N, C, H * kh, W * kw) <- x (N, C, H, W), every plane (``upsample_planes``)."""
    upsample_planes(x, y, kh, kw, np.int64(0), x.shape[0] * x.shape[1])


@kernel(nogil=True)
def upsample_planes(x, y, kh, kw, first, last):
    """Planes p = n * C + c in first .. last - 1 of x into y (the module docstring)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    for p in range(first, last):
        source, target = x[p // channels, p % channels], y[p // channels, p % channels]
        for i in range(height):
            row = target[i * kh]
            for j in range(width):
                value = source[i, j]
                for b in range(kw):
                    row[j * kw + b] = value
            for a in range(1, kh):
                copy = target[i * kh + a]
                for q in range(row.shape[0]):
                    copy[q] = row[q]


def upsample_nearest(x: np.ndarray, y: np.ndarray, kh: int, kw: int) -> None:
    """y (N, C, H * kh, W * kw) <- x (N, C, H, W) repeated (the module docstring); both
    float32 and C-contiguous. Shared with the team's helper threads if there is one."""
    team = team_worth_sharing(y.size, SHARED_FROM)
    if team is None:
        _upsample_nearest(x, y, kh, kw)
    else:
        team.upsample(x, y, kh, kw)


@functools.cache
def load_kernel() -> None:
    """Run the kernel once on a tiny input so that it is loaded now, at build."""
    _upsample_nearest(np.ones((1, 1, 1, 1), np.float32), np.empty((1, 1, 2, 2), np.float32),
                      2, 2)
