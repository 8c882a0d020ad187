"""infer.threads: a forward's thread cap is applied and undone, costs no library scan per
call, and leaves pools alone that already have the wanted size."""

from __future__ import annotations

import threading

import numba
import pytest
from threadpoolctl import threadpool_info

from infer import threads
from layers.fast import workers


def pool_sizes() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info()]


@pytest.fixture(autouse=True)
def no_helpers(monkeypatch):
    """The caps alone: with helper threads (layers/fast/workers.py), a forward of two or more
    threads caps BLAS at one (test_helpers_take_over_blas_threads)."""
    monkeypatch.setenv("PNNX_INFER_HELPERS", "0")


def test_limit_caps_blas_and_numba_and_restores_them():
    threads.prepare()            # finds every library loaded by now (numba's OpenMP, torch's)
    assert any(pool.user_api == "blas" for pool in threads._thread_pools())
    before, numba_before = pool_sizes(), numba.get_num_threads()
    with threads.limit(1):
        assert set(pool_sizes()) == {1}
        assert numba.get_num_threads() == 1
        with threads.limit(1):                       # nested: still capped
            assert set(pool_sizes()) == {1}
        assert set(pool_sizes()) == {1}
    assert pool_sizes() == before
    assert numba.get_num_threads() == numba_before
    with threads.limit(None):                        # no cap: nothing changes
        assert pool_sizes() == before


def test_helpers_take_over_blas_threads(monkeypatch):
    """With helper threads, a forward of 2 threads, or of every core (None), runs the matrix
    products on the team, so BLAS's own pool is capped at one thread inside and restored
    after; the team is this thread's only inside."""
    monkeypatch.delenv("PNNX_INFER_HELPERS")
    if workers.usable_cores() < 2:
        pytest.skip("one core: no helper threads")
    threads.prepare()
    before = pool_sizes()
    for cap in (2, None):
        with threads.limit(cap):
            assert workers.current() is not None
            assert set(pool_sizes()) == {1}
        assert workers.current() is None
        assert pool_sizes() == before


class CountingPool:
    """Stands in for a threadpoolctl library controller, counting the calls it gets."""

    def __init__(self, size: int):
        self.size, self.gets, self.sets = size, 0, 0

    def get_num_threads(self) -> int:
        self.gets += 1
        return self.size

    def set_num_threads(self, n: int) -> None:
        self.sets += 1
        self.size = n


@pytest.fixture
def counting_pools(monkeypatch):
    pools = [CountingPool(2), CountingPool(4)]
    monkeypatch.setattr(threads, "_pools", pools)
    return pools


def test_a_pool_of_the_right_size_is_not_touched(counting_pools):
    small, large = counting_pools
    for _ in range(3):
        with threads.limit(2):
            pass
    assert small.sets == 0                                # already 2 threads
    assert large.sets == 6 and large.size == 4            # capped, then restored, each call
    assert small.gets == large.gets == 3                  # asked once per call, on entry


def test_threads_running_at_once_restore_the_sizes_at_the_end(counting_pools):
    inside = threading.Barrier(4)
    seen = []

    def run():
        with threads.limit(1):
            inside.wait(timeout=10)                       # all four are inside together
            seen.append([pool.size for pool in counting_pools])

    runners = [threading.Thread(target=run) for _ in range(4)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    assert seen == [[1, 1]] * 4
    assert [pool.size for pool in counting_pools] == [2, 4]
    assert [pool.sets for pool in counting_pools] == [2, 2]   # one cap, one restore each
