"""infer.threads: a forward's thread cap is applied and undone, costs no library scan per
call, and leaves pools alone that already have the wanted size; a graph's build and shape
plans cap BLAS as its forward does."""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from infer import Layer, RuntimeGraph, threads
from layers.fast import workers
from support import write_pnnx


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


def test_setup_work_caps_blas_as_a_forward_would_without_a_team(monkeypatch):
    """threads.setup (a graph's build and new shape plans) caps BLAS at what a forward of the
    same cap gives it: one thread where helpers would run the products, the cap otherwise;
    it starts no team."""
    threads.prepare()
    before = pool_sizes()
    with threads.setup(2):                              # no helpers (the fixture): BLAS at 2
        assert set(pool_sizes()) == {min(2, size) for size in before}
    with threads.setup(1):
        assert set(pool_sizes()) == {1}
    monkeypatch.delenv("PNNX_INFER_HELPERS")
    if workers.usable_cores() < 2:
        pytest.skip("one core: no helper threads")
    for cap in (2, None):
        with threads.setup(cap):
            assert set(pool_sizes()) == {1}
            assert workers.current() is None
    assert pool_sizes() == before


class BlasWatcher(Layer):
    """Identity that notes BLAS's pool sizes when the graph builds it and plans its shapes."""

    seen: list = []

    def load_model(self, weights):
        BlasWatcher.seen.append(("build", set(pool_sizes())))

    def infer_shapes(self, shapes):
        BlasWatcher.seen.append(("plan", set(pool_sizes())))
        return list(shapes)

    def forward_one(self, x):
        return x


def test_a_graph_builds_and_plans_with_blas_capped_as_its_forward(tmp_path, monkeypatch):
    """Why: OpenBLAS's workers spin ~0.1 s after a product that ran on several threads, and
    a forward whose helper shares the cores would run beside them (threads.setup)."""
    monkeypatch.delenv("PNNX_INFER_HELPERS")
    if workers.usable_cores() < 2:
        pytest.skip("one core: no helper threads")
    threads.prepare()
    before = pool_sizes()
    param, binary = write_pnnx(tmp_path, """
    7767517
    3 2
    pnnx.Input   in0  0 1 a
    my.Watch     w    1 1 a b
    pnnx.Output  out0 1 0 b
    """)
    graph = RuntimeGraph(param, binary)                 # every core: helpers share kernels
    graph.register_custom_layer("my.Watch", BlasWatcher)
    BlasWatcher.seen = []
    graph.build()
    assert pool_sizes() == before
    x = np.ones((1, 3, 4, 4), np.float32)
    np.testing.assert_array_equal(graph.forward(x)[0], x)
    assert BlasWatcher.seen == [("build", {1}), ("plan", {1})]
    assert pool_sizes() == before


def test_openblas_with_threads_of_its_own_is_sized_by_its_own_functions(monkeypatch):
    """Such a pool is read and capped through OpenBLAS's C functions, not the controller's
    methods (their bookkeeping cost every forward more than the calls), and still restored."""
    threads.prepare()
    own = [pool for pool in threads._thread_pools() if pool.internal_api == "openblas"
           and pool.threading_layer != "openmp"]
    if not own:
        pytest.skip("no OpenBLAS with threads of its own in this process")
    assert all(threads._own_sizer(pool) is not None for pool in own)

    def refused(*args):
        raise AssertionError("the controller's method was called")

    for pool in own:
        monkeypatch.setattr(pool, "get_num_threads", refused)
        monkeypatch.setattr(pool, "set_num_threads", refused)
    before = pool_sizes()
    for _ in range(2):
        with threads.limit(1):
            assert set(pool_sizes()) == {1}
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


def test_an_error_inside_or_on_entry_undoes_the_caps_and_gives_the_team_back(
        counting_pools, monkeypatch):
    """threads.limit is entered and left by every forward (a plain class): an exception in
    the body, or in capping BLAS on entry, leaves the pool sizes and numba's count as they
    were and the helper team free for the next forward."""
    monkeypatch.delenv("PNNX_INFER_HELPERS")
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    if workers.team_for(2) is None:
        pytest.skip("no helper team here (numpy's BLAS not found)")
    numba_before = numba.get_num_threads()
    numba.set_num_threads(1)                         # so that a cap of 2 changes it
    try:
        with pytest.raises(KeyError):
            with threads.limit(2):
                team = workers.current()
                assert team is not None and team.in_use.locked()
                assert [pool.size for pool in counting_pools] == [1, 1]   # the team's
                assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
                raise KeyError("inside")
        assert [pool.size for pool in counting_pools] == [2, 4]
        assert workers.current() is None and not team.in_use.locked()
        assert numba.get_num_threads() == 1

        def failing(cap):
            raise OSError("no BLAS today")

        with monkeypatch.context() as patched:
            patched.setattr(threads, "_enter", failing)
            with pytest.raises(OSError, match="no BLAS today"):
                with threads.limit(2):
                    pass
        assert workers.current() is None and not team.in_use.locked()
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(numba_before)


def test_a_limit_or_a_running_context_is_entered_once(tmp_path):
    """Entering the same object twice (nested, or again after) is refused before it changes
    anything: caps, team and the graph's count stay as they were."""
    cap = threads.limit(1)
    with cap:
        with pytest.raises(RuntimeError, match="entered once"):
            with cap:
                pass
    with pytest.raises(RuntimeError, match="entered once"):
        with cap:
            pass
    assert threads._running == []
    graph = failing_graph(tmp_path)
    running = graph.running()
    with running:
        assert graph._running == 1
    with pytest.raises(RuntimeError, match="entered once"):
        with running:
            pass
    assert graph._running == 0 and threads._running == []


def test_a_forward_that_fails_is_no_longer_counted_as_running(tmp_path):
    """RuntimeGraph.running counts the passes under it (the move to the fast floor leaves a
    graph alone while one runs): a pass whose layer raises is counted out."""
    graph = failing_graph(tmp_path)
    with pytest.raises(Exception, match="failing on purpose"):
        graph.forward(np.ones((2, 3), np.float32))
    assert graph._running == 0
    with graph.running():
        assert graph._running == 1
    assert graph._running == 0


def failing_graph(folder) -> RuntimeGraph:
    """A built graph of one my.Failing step."""
    graph = RuntimeGraph(*write_pnnx(folder, """
    7767517
    3 2
    pnnx.Input   in0  0 1 a
    my.Failing   f    1 1 a b
    pnnx.Output  out0 1 0 b
    """))
    graph.register_custom_layer("my.Failing", Failing)
    return graph.build()


class Failing(Layer):
    one_blob_only = True

    def forward_one(self, x: np.ndarray) -> np.ndarray:
        raise ValueError("failing on purpose")
