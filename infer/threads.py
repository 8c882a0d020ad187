"""Thread caps for one forward pass: numba and the BLAS / OpenMP pools (through threadpoolctl).

    with threads.limit(2):          # what RuntimeGraph.forward does when set_num_threads(2)
        ...                         # numba kernels and np.matmul use at most 2 threads

numba keeps its thread count per Python thread, so a forward sets it for its own thread and
puts it back afterwards; callers in other threads never see it. The runtime's own kernels are
serial and usually run without numba (layers/fast/backend.py): numba is capped only when
something in the process has imported it (a custom layer, or the just-in-time kernels).

The BLAS pools are process-wide. While capped forwards run, BLAS uses the smallest cap among
them (no caller runs with more BLAS threads than it asked for; a caller with a larger cap may
get fewer while a smaller-capped forward is running), and when the last one ends the sizes from
before the first one come back. Counting the running forwards is what makes this hold when they
overlap: each restoring "its" previous value would leave whichever cap happened to be set last.

What it costs. Finding the loaded BLAS libraries means scanning every shared library of the
process (threadpoolctl's ThreadpoolController: about 2 ms, more than a small model's whole
forward), so it is done once: by set_num_threads (``prepare``), or else the first capped
forward. Each call then costs a few microseconds, and a pool that already has the wanted size
is not touched. An OpenBLAS with threads of its own (not OpenMP's) is read and sized through
its own two C functions, found once per scan: threadpoolctl's methods around them hand the
role of sizing it to one Python thread at a time, bookkeeping that costs every forward more
than the calls themselves, and a role this module would take over anyway (``_set``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading

_lock = threading.Lock()
_pools: list | None = None       # threadpoolctl controllers of the loaded BLAS / OpenMP libraries
_sizers: list = []               # per pool of _sizers_of: OpenBLAS's own (get, set), or None
_sizers_of: list | None = None   # the list of pools _sizers was made for
_running: list[int] = []         # caps of the capped forwards running now, in every thread
_saved: list[int | None] = []    # each pool's size before the first of them entered
_current: list[int | None] = []  # each pool's size now, as set here (not asked again)


def _thread_pools() -> list:
    """The BLAS and OpenMP libraries loaded in this process, found once (the 2 ms scan):
    numpy's BLAS, which the kernels use, is loaded before any graph runs; a library loaded
    later is found by the next ``prepare`` (RuntimeGraph.set_num_threads)."""
    global _pools
    if _pools is None:
        from threadpoolctl import ThreadpoolController

        _pools = list(ThreadpoolController().lib_controllers)
    return _pools


def _sizer(index: int) -> tuple | None:
    """Pool ``index``'s own (get, set) functions, or None (found once per list of pools)."""
    global _sizers, _sizers_of
    if _sizers_of is not _pools:
        _sizers, _sizers_of = [_own_sizer(pool) for pool in _pools or ()], _pools
    return _sizers[index]


def _own_sizer(pool) -> tuple | None:
    """OpenBLAS's openblas_get_num_threads and openblas_set_num_threads, when ``pool`` is an
    OpenBLAS with threads of its own (with OpenMP's, threadpoolctl sizes it per thread) and
    threadpoolctl says where they are; else None: the pool's own methods then."""
    find = getattr(pool, "_get_symbol", None)
    if (getattr(pool, "internal_api", None) != "openblas" or find is None
            or getattr(pool, "threading_layer", "openmp") == "openmp"):
        return None
    get, set_ = find("openblas_get_num_threads"), find("openblas_set_num_threads")
    return (get, set_) if get is not None and set_ is not None else None


def _get(index: int, pool) -> int | None:
    sizer = _sizer(index)
    return sizer[0]() if sizer is not None else pool.get_num_threads()


def prepare() -> None:
    """Pay the one-time costs now (starting numba's threads, finding the BLAS libraries: tens
    of milliseconds) instead of in the first capped forward. It looks for the libraries
    afresh (when no forward is running), so one loaded since (say torch's OpenMP) is
    capped from then on."""
    global _pools
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.get_num_threads()        # starts numba's threading layer
    with _lock:
        if not _running:
            _pools = None
        _thread_pools()


def _workers(helpers: bool):
    """The fast backend's helper threads (layers/fast/workers.py), if wanted and loaded: a
    reference graph never imports the backend."""
    return sys.modules.get("layers.fast.workers") if helpers else None


class limit:
    """Run the body with at most ``num_threads`` threads (None: no cap). With two or more,
    and ``helpers``, the fast kernels share their work with helper threads
    (layers/fast/workers.py), which run the matrix products too: BLAS's own pool is then
    capped at one thread. A plain class rather than a generator (every forward enters one);
    each is entered once (``with threads.limit(n):``)."""

    __slots__ = ("num_threads", "workers", "entered", "team", "joined", "numba_before",
                 "team_module", "cap")

    def __init__(self, num_threads: int | None, helpers: bool = True):
        self.num_threads, self.workers = num_threads, _workers(helpers)
        self.entered, self.team, self.joined, self.numba_before = False, None, False, 0
        # the body's cap on the teams its kernels may take (team.thread_cap): the fast
        # backend's, where it is loaded
        self.team_module = sys.modules.get("layers.fast.team")
        self.cap: list | None = None

    def __enter__(self) -> None:
        if self.entered:
            raise RuntimeError("a threads.limit is entered once: make another for another "
                               "body")
        self.entered = True
        num_threads, workers = self.num_threads, self.workers
        if self.team_module is not None:
            self.cap = self.team_module.enter_cap(num_threads)
        try:
            if workers is not None:
                self.team, self.joined = workers.join(num_threads)
            self.numba_before = _cap(num_threads, self._blas_threads())
        except BaseException:
            self._leave_team()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            _uncap(self.num_threads, self._blas_threads(), self.numba_before)
        finally:
            self._leave_team()

    def _blas_threads(self) -> int | None:
        """BLAS's cap: one thread where the team runs the products, else the body's cap."""
        return 1 if self.team is not None else self.num_threads

    def _leave_team(self) -> None:
        try:
            if self.joined:
                self.joined = False
                self.workers.leave(self.team)
        finally:
            if self.cap is not None:
                self.team_module.leave_cap(self.cap)
                self.cap = None


def start_helpers(num_threads: int | None, helpers: bool = True) -> None:
    """Start the helper threads a forward capped at ``num_threads`` shares its kernels with
    (and find numpy's BLAS for them), so that the first forward does not pay for it."""
    workers = _workers(helpers)
    if workers is not None:
        workers.team_for(num_threads)


@contextlib.contextmanager
def setup(num_threads: int | None, helpers: bool = True):
    """For a graph's one-time work (building, packing weights for new input shapes): BLAS
    capped as a forward of ``num_threads`` caps it, without starting helpers, and the teams
    its packings take (algorithms._shared) no wider than the forward's.

    Why: after a call that ran on several threads, OpenBLAS's workers spin a while before
    they sleep, and capping the pool does not stop them: a packing product run on every core
    right before a forward would leave BLAS's threads competing with the forward's helpers
    (BENCHMARKS.md has the figures)."""
    workers = _workers(helpers)
    wanted = workers.threads_wanted(num_threads) if workers is not None else 1
    with _capped(num_threads, 1 if wanted >= 2 else num_threads), _team_cap(num_threads):
        yield


@contextlib.contextmanager
def _team_cap(num_threads: int | None):
    """The body's cap (``num_threads``, None: none) on the teams its kernels may take
    (layers/fast/team.py's thread_cap), where the fast backend is loaded."""
    team = sys.modules.get("layers.fast.team")
    if team is None:
        yield
        return
    entry = team.enter_cap(num_threads)
    try:
        yield
    finally:
        team.leave_cap(entry)


@contextlib.contextmanager
def _capped(num_threads: int | None, blas_threads: int | None):
    """At most ``num_threads`` numba threads and ``blas_threads`` BLAS threads in the body
    (None: no cap)."""
    numba_before = _cap(num_threads, blas_threads)
    try:
        yield
    finally:
        _uncap(num_threads, blas_threads, numba_before)


def _cap(num_threads: int | None, blas_threads: int | None) -> int:
    """Set the caps (_capped's and limit's entry); returns what _uncap needs back: numba's
    count before, 0 if numba was left alone."""
    numba = sys.modules.get("numba")                   # not imported: nothing to cap
    numba_before = 0
    if numba is not None and num_threads is not None:
        numba_wanted = min(num_threads, numba.config.NUMBA_NUM_THREADS)
        current = numba.get_num_threads()              # this Python thread's own setting
        if current != numba_wanted:
            numba_before = current
            numba.set_num_threads(numba_wanted)
    if blas_threads is not None:
        try:
            _enter(blas_threads)
        except BaseException:
            _uncap(num_threads, None, numba_before)
            raise
    return numba_before


def _uncap(num_threads: int | None, blas_threads: int | None, numba_before: int) -> None:
    """Take back the caps _cap set (_capped's and limit's exit)."""
    try:
        if blas_threads is not None:
            _leave(blas_threads)
    finally:
        if numba_before:
            sys.modules["numba"].set_num_threads(numba_before)


def _enter(cap: int) -> None:
    with _lock:
        pools = _thread_pools()
        if not _running:                                # save what the process had
            _saved[:] = _current[:] = [_get(index, pool) for index, pool in enumerate(pools)]
        _running.append(cap)
        _resize(pools, min(_running))


def _leave(cap: int) -> None:
    with _lock:
        _running.remove(cap)
        pools = _thread_pools()
        if _running:
            _resize(pools, min(_running))
        else:                                           # the last one out restores
            for index, (pool, before) in enumerate(zip(pools, _saved)):
                if before is not None and before != _current[index]:
                    _set(index, pool, before)
                    _current[index] = before


def _resize(pools: list, size: int) -> None:
    for index, pool in enumerate(pools):
        if _current[index] != size:
            _set(index, pool, size)
            _current[index] = size


def _set(index: int, pool, size: int) -> None:
    """Size pool ``index`` (called under _lock). OpenBLAS's own function where found; else
    the pool's method: threadpoolctl (3.6 on) lets one Python thread at a time size a
    process-wide (pthreads) OpenBLAS pool and silently ignores the others, so this takes that
    role over from whichever thread had it, sets the size, and leaves the role free again
    (for the next forward's thread, or the user's own threadpoolctl calls)."""
    sizer = _sizer(index)
    if sizer is not None:
        sizer[1](size)
        return
    _release_openblas()
    pool.set_num_threads(size)
    _release_openblas()


def _release_openblas() -> None:
    """Leave the OpenBLAS controlling-thread role free (for the next forward, or the user's own
    threadpoolctl calls)."""
    clear = _controlling_thread_release()
    if clear is not None:
        clear(force=True)


@functools.cache
def _controlling_thread_release():
    """threadpoolctl's OpenBLASController.clear_controlling_thread (3.6 on), else None."""
    import threadpoolctl

    controller = getattr(threadpoolctl, "OpenBLASController", None)
    return getattr(controller, "clear_controlling_thread", None)
