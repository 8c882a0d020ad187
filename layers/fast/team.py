"""The calling thread's helper team and work buffers, as the kernels see them.

    team = current_team()                    # this thread's sharing Team, or None
    team = team_worth_sharing(work, least)   # the same, or None below ``least`` work
    buffer = scratch(name, shape)            # a float32 work array kept by this thread
    after_sharing(action)                    # run once this thread gives its team back
    enter_cap(n), leave_cap(entry)           # the threads a team taken here may have
    work_alone(), works_alone()              # this thread never takes a team

The kernel modules (gemm, pointwise, pointwise_transposed, winograd) read these to share
their work and to allocate nothing per call; workers.py makes the teams and sets this
thread's (``set_current_team``, inside ``workers.sharing`` or between ``workers.join`` and
``leave``). A kernel only calls the team's methods (workers.Team's), so this module imports
nothing of layers.fast, and the kernels do not import workers.py (which imports them,
through jobs.py).
"""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from parser.pages import fresh_pages

if TYPE_CHECKING:
    from layers.fast.workers import Team

_local = threading.local()


def current_team() -> Team | None:
    """The team sharing this thread's kernels now (workers.sharing, or join to leave), or
    None."""
    return getattr(_local, "team", None)


def thread_cap() -> int | None:
    """The most threads a team taken on this thread may have: the cap of the innermost
    forward or planning running on it (infer/threads.py's ``limit`` and ``setup``), None for
    none. A packing that asks for every core's team (workers.sharing(None)) inside a forward
    capped at 1 then takes none."""
    caps = getattr(_local, "caps", None)
    return caps[-1][0] if caps else None


def enter_cap(cap: int | None) -> list:
    """A body with cap ``cap`` (None: none) begins on this thread; returns its entry, for
    ``leave_cap``. Entries are taken out by identity, not in order: two bodies that end in
    the other order than they began (generators, each inside a forward) leave no cap
    behind."""
    entry = [cap]
    _local.__dict__.setdefault("caps", []).append(entry)
    return entry


def leave_cap(entry: list) -> None:
    """The body of ``entry`` (enter_cap's) ends."""
    caps = getattr(_local, "caps", [])
    for i in range(len(caps) - 1, -1, -1):
        if caps[i] is entry:
            del caps[i]
            return


def work_alone() -> None:
    """Mark this thread as one that never shares its kernels with a team (the thread that
    packs weights in the background, layers/fast/conv.py): a team it took would be every
    core's whatever the graphs' caps, its helpers spinning beside the forwards (one with
    the same cap would find it taken and run without helpers)."""
    _local.alone = True


def works_alone() -> bool:
    """Whether ``work_alone`` marked this thread."""
    return getattr(_local, "alone", False)


def team_worth_sharing(work: int, shared_from: int) -> Team | None:
    """``current_team()``, or None for a call of less than ``shared_from`` units of work
    (multiply-adds, values copied: the caller's measure): handing half of so little to a
    helper costs the calling thread more than doing it alone."""
    return current_team() if work >= shared_from else None


def set_current_team(team: Team | None) -> None:
    """Make ``team`` the one sharing this thread's kernels (None: none); workers.join's and
    leave's."""
    _local.team = team


def after_sharing(action: Callable[[], None]) -> None:
    """Run ``action`` when this thread gives back the team sharing its forward
    (workers.leave: ``actions_after_sharing``), or now if it has none: work handed to another
    thread (a background packing) that would take a core from the forward's helpers."""
    if current_team() is None:
        action()
        return
    pending = getattr(_local, "after", None)
    if pending is None:
        pending = _local.after = []
    pending.append(action)


def actions_after_sharing() -> list[Callable[[], None]]:
    """The actions ``after_sharing`` kept for this thread, handed over (and forgotten)."""
    pending = getattr(_local, "after", None) or []
    _local.after = []
    return pending


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 work array of ``shape`` (contents undefined), from a buffer that this thread
    keeps under ``name`` and grows when needed: the kernels allocate nothing per call. The
    same shape gets the same array object again (a forward asks for the same few). Every
    one starts on a cache line (LINE_FLOATS)."""
    arrays = getattr(_local, "arrays", None)          # (name, shape) -> array
    if arrays is None:
        arrays = _local.arrays = {}
    array = arrays.get((name, shape))
    if array is not None:
        return array
    if len(arrays) >= MAX_SCRATCH_ARRAYS:
        arrays.clear()
    size = math.prod(shape)
    buffers = _local.__dict__.setdefault("buffers", {})
    buffer = buffers.get(name)
    if buffer is None or buffer.size < size:
        for key in [key for key in arrays if key[0] == name]:
            del arrays[key]             # arrays over the old buffer
        buffers.pop(name, None)
        buffer = None                   # the smaller buffer's pages go before the new ones come
        raw = fresh_pages((size + LINE_FLOATS) * 4).view(np.float32)
        skip = -raw.ctypes.data % (LINE_FLOATS * 4) // 4      # from a cache line's start
        buffer = buffers[name] = raw[skip:skip + size]
    array = arrays[(name, shape)] = buffer[:size].reshape(shape)
    return array


LINE_FLOATS = 16     # floats in a 64-byte cache line: a scratch array starts on one, so that
                     # vectors at multiples of 16 floats from its start lie in one line each


MAX_SCRATCH_ARRAYS = 256    # arrays scratch keeps per thread (each shape asked for is one)


def _forget_after_fork() -> None:
    """A forked child has none of the parent's teams (workers.py forgets them too)."""
    _local.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
