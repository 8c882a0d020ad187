"""The checks a prepared kernel call makes before it calls compiled functions unchecked.

A compiled function reads its array arguments as the types it was compiled for, so the back
end puts a check of every argument in front of it (backend._checked), on every call. A call
worked out once for one shape (pointwise_transposed.transposed_product and the like) checks
the arrays it keeps when it is made, and on each call only the arrays it is given
(``check_sizes``), then calls the functions without their checks (``unchecked``): a forward then
runs a few checks per step instead of one per argument of every kernel it calls.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from parser.errors import ShapeError

FLOAT32 = np.dtype(np.float32)


def unchecked(function: Callable) -> Callable:
    """``function`` without the back end's per-call argument checks, where it has them (the
    just-in-time dispatchers check the types themselves). Taken when a call is made: a call
    made before the kernels start keeps going through the start, and one made under one
    back end (ahead of time, just in time) keeps running that back end's function."""
    return getattr(function, "unchecked", function)


def check(a: np.ndarray, shape: tuple[int, ...], what: str, writeable: bool = False) -> None:
    """Refuse ``a`` unless it is a C-contiguous, aligned float32 array of ``shape`` (and
    writeable, if ``writeable``): what the unchecked kernels may read, or write."""
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == shape):
        raise ShapeError(f"{what}: a float32 array of shape {shape} expected, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
    flags = a.flags
    if not (flags.c_contiguous and flags.aligned and (flags.writeable or not writeable)):
        raise ShapeError(f"{what}: a C-contiguous, aligned{', writeable' if writeable else ''}"
                         f" array expected (strides {a.strides})")


def check_sizes(x: np.ndarray, x_lead: tuple[int, ...], x_size: int, y: np.ndarray,
                y_lead: tuple[int, ...], y_size: int, what: str,
                residual: np.ndarray | None = None) -> None:
    """Refuse a product's x, y (written) and residual (None, or y's shape) unless each is a
    C-contiguous, aligned float32 array of that many values whose shape starts with
    ``x_lead`` / ``y_lead`` (images, channels): what the product reshapes (in place: a
    reshape that copied y would leave it unwritten) and its kernels read or write."""
    # the usual case first, in one expression (no call per array): plain, writeable,
    # C-contiguous float32 ndarrays of the sizes and leading dims (_plain's test, written out)
    if (type(x) is np.ndarray and x.dtype is FLOAT32 and x.flags.carray and x.size == x_size
            and x.shape[:len(x_lead)] == x_lead
            and type(y) is np.ndarray and y.dtype is FLOAT32 and y.flags.carray
            and y.size == y_size and y.shape[:len(y_lead)] == y_lead
            and (residual is None or (_plain(residual, y_lead, y_size)
                                      and residual.shape == y.shape))):
        return
    if residual is not None and getattr(residual, "shape", None) != getattr(y, "shape", ()):
        raise ShapeError(f"{what}: a residual of the output's shape expected, got "
                         f"{getattr(residual, 'shape', type(residual).__name__)}")
    for a, lead, size, role in ((x, x_lead, x_size, "input"), (y, y_lead, y_size, "output"),
                                (residual, y_lead, y_size, "residual")):
        if a is None:
            continue
        if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size == size
                and a.shape[:len(lead)] == lead):
            raise ShapeError(f"{what}: a float32 {role} of {size} values, {lead} first, "
                             f"expected, got "
                             f"{getattr(a, 'dtype', type(a).__name__)} "
                             f"{getattr(a, 'shape', '')}")
        flags = a.flags
        if not (flags.c_contiguous and flags.aligned and (flags.writeable or a is not y)):
            raise ShapeError(f"{what}: a C-contiguous, aligned{', writeable' if a is y else ''} "
                             f"{role} expected (strides {a.strides})")


def _plain(a: object, lead: tuple[int, ...], size: int) -> bool:
    """``a`` is what check_sizes asks for, and writeable: a plain float32 ndarray, C-contiguous
    and aligned (``carray``), of ``size`` values and a shape starting with ``lead``. False
    says only "look closer" (a read-only input, a subclass may still do)."""
    return (type(a) is np.ndarray and a.dtype is FLOAT32 and a.flags.carray
            and a.size == size and a.shape[:len(lead)] == lead)
