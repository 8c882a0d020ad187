"""Work buffers of the fast kernels (layers/fast/team.py's ``scratch``)."""

import weakref

import numpy as np

from layers.fast import team


def test_a_scratch_buffer_is_reused_and_grows_after_the_old_one_is_gone(monkeypatch):
    """A larger request replaces the buffer; the old one's pages go first, so that a grown
    buffer (its pages mapped in when made: parser/pages.py) never sits beside the old one
    and the process's peak memory stays what the largest buffer needs."""
    first = team.scratch("test grows", (4, 8))
    assert first.shape == (4, 8) and first.dtype == np.float32
    again = team.scratch("test grows", (2, 3))
    assert again.base is first.base or np.shares_memory(again, first)   # reused, not new
    old = weakref.ref(team._local.buffers["test grows"].base)  # its pages (arrays hold them)
    del first, again

    made = team.fresh_pages
    seen = []

    def fresh(nbytes):
        seen.append(old() is None)          # the old buffer is gone before the new one
        return made(nbytes)
    monkeypatch.setattr(team, "fresh_pages", fresh)
    try:
        grown = team.scratch("test grows", (1 << 20,))          # 4 MiB: a mapping
        assert seen == [True] and grown.shape == (1 << 20,)
    finally:
        _forget("test grows")


def test_a_scratch_array_is_made_once_per_shape_and_follows_its_buffer():
    """The same name and shape give the same array object (a forward asks for the same few);
    once the buffer grows, no array over the old one is handed out again."""
    try:
        first = team.scratch("test shapes", (4, 8))
        assert team.scratch("test shapes", (4, 8)) is first
        assert team.scratch("test shapes", (8, 4)) is not first
        grown = team.scratch("test shapes", (1 << 20,))
        after = team.scratch("test shapes", (4, 8))
        assert after is not first and np.shares_memory(after, grown)
    finally:
        _forget("test shapes")


def test_every_scratch_array_starts_on_a_cache_line():
    """The kernels load vectors at multiples of 16 floats from a work array's start: each
    must lie in one cache line, not straddle two (twice the cost a load)."""
    try:
        for size in (1, 3, 17, 1000, 1 << 20):
            array = team.scratch("test lines", (size,))
            assert array.ctypes.data % (team.LINE_FLOATS * 4) == 0 and array.size == size
    finally:
        _forget("test lines")


def _forget(name):
    """Drop this thread's scratch buffer ``name`` and the arrays over it."""
    team._local.buffers.pop(name, None)
    for key in [key for key in team._local.arrays if key[0] == name]:
        del team._local.arrays[key]
