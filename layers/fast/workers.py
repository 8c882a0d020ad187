"""Helper threads that share each kernel call with the thread running the forward.

    with workers.sharing(2):               # what a forward capped at 2 threads does
        workers.current()                  # the Team: kernels called now cut their work
                                           # into chunks for 2 threads (layers/fast/jobs.py)

One Team does all the sharing: its helpers spin in compiled code, without the GIL, while a
forward runs, and take chunks of every kernel call big enough to pay for it (team.team_worth_sharing
says which; a tiny one runs on the calling thread alone), matrix products included, which each
thread runs on its band through numpy's OpenBLAS (``cblas_sgemm``, or ``cblas_sgemv`` for a
product of one row or one column, as numpy does) with OpenBLAS's own threads capped at one.
Two thread pools taking turns on the same cores (numba's and OpenBLAS's) fight over them,
and a helper that sleeps or comes back to Python between calls costs more to wake than half
a small kernel; so one team spins through a forward, spins a little after it (the next one
often follows), then sleeps until the next forward. The calling thread never waits for a
chunk nobody has taken: it takes those itself, so a helper slow to wake only means less help.

Invariants: one forward at a time uses a team (another thread's forward meanwhile runs on
one thread); a kernel gives the same bits whichever thread runs which chunk. Without numpy's
OpenBLAS (its 64-bit ``cblas_sgemm``) there is no team: the numba kernels run on the calling
thread and the products on BLAS's own threads.

The kernel modules do not import this one (it imports them, through jobs.py): they read the
calling thread's team and work buffers from layers/fast/team.py, which ``sharing`` sets, and
call the Team's methods. ``current`` and ``scratch`` are team.py's, named here as before.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import os
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from layers.fast import dense, direct, excitation, jobs, pointwise, pointwise_transposed
from layers.fast.epilogue import Activation, epilogue_operands, nothing_to_finish
from layers.fast.operands import unchecked
from layers.fast.team import current_team as current  # workers.current(), as before
from layers.fast.team import scratch as scratch  # workers.scratch, as before
from layers.fast.team import (actions_after_sharing, set_current_team, thread_cap,
                              works_alone)

log = logging.getLogger(__name__)

IDLE_POLLS = 200_000        # polls (~10 ns each) a helper spins without work before it
                            # goes back to Python to see whether a forward still runs
MIN_GEMM_WORK = 1 << 16     # multiply-adds below which a product is not shared
WIDE = 8                    # a product with this many times more columns than rows is cut
                            # into bands of columns (else of rows, where that is as even)
CHUNKS = 4                  # chunks per thread of a job: a thread that runs slower (a
                            # busy virtual CPU, an efficiency core) or starts late takes
                            # fewer, instead of the others waiting for its half


class Team:
    """``helpers`` threads that take chunks of the jobs published in ``control`` and
    ``record`` (layers/fast/jobs.py), with the thread that publishes them."""

    def __init__(self, helpers: int, blas: "Blas"):
        self.threads = helpers + 1
        self.chunks = CHUNKS * self.threads        # of a job whose units are many and even
        self.blas = blas                           # cblas_sgemm's and cblas_sgemv's addresses
        self.control = np.zeros(jobs.control_size(self.threads), np.int64)
        self.control[jobs.RUNS] = self.threads     # one run of chunks per thread
        self.record = np.zeros(jobs.RECORD_SIZE, np.int64)
        self.reals = np.zeros(jobs.REALS_SIZE, np.float64)
        # the job runner without the compiled kernels' argument checks (backend._checked):
        # these three arrays are the team's own, and it runs ~50 times a forward
        self._work = unchecked(jobs._work)
        # the jobs a caller that checked its arrays runs unchecked (``checked=False``), as
        # bound now (a job bound since, by another back end, runs as it is)
        self._trusted = {job: unchecked(job) for job in (
            jobs._pointwise_job, jobs._pointwise_transposed_job, jobs._depthwise_job,
            jobs._depthwise_blocks_job, jobs._direct_job)}
        self.in_use = threading.Lock()             # one forward at a time
        self.active = threading.Event()            # set while a forward runs: helpers spin
        self.stopped = False
        self.helpers = [threading.Thread(target=self._help, args=(i + 1,), daemon=True,
                                         name=f"pnnx-infer helper {i}") for i in range(helpers)]
        for helper in self.helpers:
            helper.start()

    def _help(self, slot: int) -> None:
        while True:
            self.active.wait()
            if self.stopped:
                return
            self._work(self.control, self.record, self.reals, 0, IDLE_POLLS, slot)

    def stop(self) -> None:
        """Let the helpers return (at exit)."""
        self.stopped = True
        self.control[jobs.STOP] = 1
        self.active.set()
        for helper in self.helpers:
            helper.join(timeout=1.0)

    # ---- the jobs: each fills the record (a writer of jobs.py), then runs it ----------
    def _share(self, job, chunks: int, *arguments) -> None:
        """Fill the record with ``job(record, reals, *arguments)`` and run it in ``chunks``
        chunks, with the helpers. A chunk whose kernel raised (an allocation that failed,
        say) leaves its part of the output unwritten: an error here, not a wrong answer."""
        if chunks <= 0:                # no units (an empty batch): nothing to run, and
            return                     # _work would take it for a helper's loop
        job(self.record, self.reals, *arguments)
        self._work(self.control, self.record, self.reals, chunks, 0, 0)
        if self.control[jobs.FAILED]:
            raise RuntimeError("a fast kernel failed in a shared job "
                               f"({getattr(job, '__name__', job)})"
                               " (out of memory?): its output is incomplete")

    def depthwise(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, y: np.ndarray,
                  stride, dilation, pads, activation: Activation, checked: bool = True) -> None:
        """layers/fast/depthwise.py's kernels (as depthwise_conv2d calls them), shared:
        planes in one chunk per thread (each chunk splits planes into buffers of its own),
        blocks of channels in up to CHUNKS chunks per thread. ``checked``: False when the
        caller checked the arrays (operands.py)."""
        if weight.ndim == 3:
            job, chunks = jobs._depthwise_job, self.threads
        else:
            job = jobs._depthwise_blocks_job
            chunks = min(x.shape[0] * weight.shape[0], self.chunks)
        self._share(self._job(job, checked), chunks, x, weight, bias, y, stride[0], stride[1],
                    dilation[0], dilation[1], pads[0], pads[2], activation.code, activation.a,
                    activation.b)

    def im2col(self, x: np.ndarray, cols: np.ndarray, kernel, stride, dilation, pads,
               out_hw) -> None:
        """gemm._im2col (one image), shared."""
        self._share(jobs._im2col_job, self.chunks, x, cols, kernel[0], kernel[1], stride[0],
                    stride[1], dilation[0], dilation[1], pads[0], pads[2], out_hw[0],
                    out_hw[1])

    def winograd_input(self, f2: bool, x: np.ndarray, v: np.ndarray, top: int, left: int,
                       tiles_h: int, tiles_w: int, row0: int) -> None:
        """A Winograd input transform (F(2x2)'s if ``f2``, else F(4x4)'s), shared."""
        self._share(jobs._winograd_input_job, self.chunks, int(f2), x, v, top, left, tiles_h,
                    tiles_w, row0)

    def winograd_output(self, f2: bool, m: np.ndarray, y: np.ndarray, bias: np.ndarray,
                        residual: np.ndarray, tiles_h: int, tiles_w: int, row0: int,
                        activation: Activation) -> None:
        """A Winograd output transform, shared (bias and residual: empty arrays for none)."""
        self._share(jobs._winograd_output_job, self.chunks, int(f2), m, y, bias, residual,
                    tiles_h, tiles_w, row0, activation.code, activation.a, activation.b)

    def winograd_strips(self, f2: bool, x: np.ndarray, packed: np.ndarray, bias: np.ndarray,
                        residual: np.ndarray, y: np.ndarray, work: np.ndarray,
                        space_floats: int, strips: int, top: int, left: int, tiles_h: int,
                        tiles_w: int, activation: Activation) -> None:
        """A whole Winograd convolution (F(2x2)'s if ``f2``, else F(4x4)'s), shared by
        strips of ``tiles_h // strips`` rows of tiles or so: each thread runs its strips
        alone, in its row of ``work`` (winograd.strip_buffers: the product's
        ``space_floats`` first; bias and residual: empty arrays for none)."""
        self._check_space(work, space_floats)
        self._share(jobs._winograd_strips_job, x.shape[0] * strips, int(f2), x, packed, bias,
                    residual, y, work, space_floats, strips, top, left, tiles_h, tiles_w,
                    activation.code, activation.a, activation.b)

    def pointwise(self, weight: np.ndarray, x: np.ndarray, bias: np.ndarray,
                  residual: np.ndarray, y: np.ndarray, space: np.ndarray,
                  geometry: np.ndarray, activation: Activation, checked: bool = True) -> None:
        """pointwise._pointwise, shared (a bias of zeros, a residual of no values for none;
        ``space``: a row of work space per thread; ``geometry``: no values for a plain
        product). ``checked``: False when the caller checked the arrays and sized ``space``
        (operands.py)."""
        c_out, c_in = weight.shape[1:]
        if checked:
            self._check_space(space, pointwise.space_size(c_in))
        bands, packed = pointwise.band_plan(c_in, c_out, y.shape[0], y.shape[2],
                                            geometry.size > 0, weight.shape[0] > 1)
        chunks = _whole_bands(y.shape[0] * bands, self.threads, self.chunks) if packed \
            else self.chunks                          # x packed band by band, or read in place
        self._share(self._job(jobs._pointwise_job, checked), chunks, weight, x, bias, residual,
                    y, space, geometry, activation.code, activation.a, activation.b)

    def pointwise_transposed(self, panels: np.ndarray, x: np.ndarray, bias: np.ndarray,
                             residual: np.ndarray, y: np.ndarray, space: np.ndarray,
                             activation: Activation, checked: bool = True) -> None:
        """pointwise_transposed._pointwise_transposed, shared: in CHUNKS per thread, or in
        whole bands where the images are cut into bands for the threads
        (pointwise_transposed.bands_for_threads)."""
        if checked:
            self._check_space(space, pointwise_transposed.space_size(x.shape[1], x.shape[2]))
        images = x.shape[0]
        _, bands = pointwise_transposed.band_plan(images, x.shape[2], y.shape[1], self.threads)
        self._share(self._job(jobs._pointwise_transposed_job, checked),
                    images * bands if bands else self.chunks, panels, x, bias, residual, y,
                    space, activation.code, activation.a, activation.b, self.threads)

    def direct(self, panels: np.ndarray, x: np.ndarray, bias: np.ndarray,
               residual: np.ndarray, y: np.ndarray, space: np.ndarray, geometry: np.ndarray,
               activation: Activation, checked: bool = True) -> None:
        """direct._direct, shared in CHUNKS per thread (x (N, C_in, H*W), y (N, C_out,
        Ho*Wo); ``space``: a row of work space per thread, direct.space_size floats)."""
        if checked:
            _, copy = direct.direct_plan(tuple(geometry), x.shape[0], panels.shape[0],
                                         self.threads)
            self._check_space(space, direct.space_size(x.shape[1], copy))
        self._share(self._job(jobs._direct_job, checked), self.chunks, panels, x, bias,
                    residual, y, space, geometry, activation.code, activation.a, activation.b,
                    self.threads)

    def _job(self, job, checked: bool):
        """``job``, or its unchecked form (as bound when the team was made) for a caller
        that checked its arrays."""
        return job if checked else self._trusted.get(job, job)

    def _check_space(self, space: np.ndarray, floats: int) -> None:
        """A job's work space has a row of ``floats`` or more for every thread of the team
        (the jobs' units functions index it by the thread's slot, and the kernels write into
        it, unchecked)."""
        if space.ndim != 2 or space.shape[0] < self.threads or space.shape[1] < floats:
            raise ValueError(f"work space of shape {space.shape} for a team of {self.threads} "
                             f"threads: one row of {floats} floats per thread needed")

    def dense(self, weight: np.ndarray, x: np.ndarray, bias: np.ndarray, y: np.ndarray,
              space: np.ndarray, activation: Activation) -> None:
        """dense._dense (``space`` of no rows: ``weight`` is panels) or dense._dense_rows (a
        row of ``space`` per thread), shared (units: bands of rows by panels)."""
        dense.check_operands(weight[0] if space.shape[0] > 0 else weight, x[0],
                             bias if bias.size else None, y[0])
        if space.shape[0] > 0:
            self._check_space(space, dense.space_size(x.shape[2]))
        self._share(jobs._dense_job, self.chunks, weight, x, bias, y, space, activation.code,
                    activation.a, activation.b)

    def split_planes(self, x: np.ndarray, phases: np.ndarray, geometry: np.ndarray) -> None:
        """gemm._split_planes, shared (units: planes)."""
        self._share(jobs._split_planes_job, self.chunks, x, phases, geometry)

    def finish(self, y: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None,
               activation: Activation) -> None:
        """epilogue.bias_residual_activation, shared."""
        if nothing_to_finish(bias, residual, activation):
            return
        self._share(jobs._epilogue_job, self.chunks, *epilogue_operands(y, bias, residual),
                    activation.code, activation.a, activation.b)

    def squeeze_excitation(self, x: np.ndarray, y: np.ndarray, reduce: np.ndarray,
                           reduce_bias: np.ndarray, activation: Activation,
                           expand: np.ndarray, expand_bias: np.ndarray, gate: Activation,
                           keep: bool, residual: np.ndarray) -> None:
        """excitation._squeeze_excitation (x, y (N, C, L); a residual of no values for
        none), shared: the means, then the scaling, by planes in one chunk per thread (as a
        depthwise convolution's planes job cuts them, so a thread often finds its planes in
        its cache); the gates between them on this thread."""
        gates = scratch("excitation_gates", x.shape[:2])
        self._share(jobs._squeeze_job, self.threads, x, gates)
        excitation.excitation_gates(gates, reduce, reduce_bias, activation.code, activation.a,
                                    activation.b, expand, expand_bias, gate.code, gate.a,
                                    gate.b)
        self._share(jobs._scale_job, self.threads, x, gates, y, int(keep), residual)

    def upsample(self, x: np.ndarray, y: np.ndarray, kh: int, kw: int) -> None:
        """upsample._upsample_nearest, shared: planes, one run of them per thread."""
        self._share(jobs._upsample_job, self.threads, x, y, kh, kw)

    def max_pool(self, x: np.ndarray, y: np.ndarray, geometry: tuple[int, ...]) -> None:
        """pool._max_pool2d, shared: planes (``geometry``: kh, kw, stride_h, stride_w,
        dil_h, dil_w, top, left)."""
        self._share(jobs._max_pool_job, self.chunks, x, y, *geometry)

    def softmax(self, x: np.ndarray) -> None:
        """softmax._softmax (x (R, D), each row in place), shared (units: rows)."""
        self._share(jobs._softmax_job, self.chunks, x)

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray,
               transposed: bool = False) -> None:
        """out[t] = a[t] @ b[t] (a (T or 1, M, K), b (T, K, N), out (T, M, N), all float32
        and C-contiguous; b (T, N, K) for b[t].T if ``transposed``): np.matmul, shared. Few
        products are cut into bands of rows or columns."""
        products, m, n = out.shape
        k = a.shape[2]
        if k == 0 or m == n == 1 or out.size == 0 or a.shape[0] not in (1, products):
            # BLAS refuses a leading dimension of 0; a dot product; a stack of A to
            # broadcast
            np.matmul(a, np.swapaxes(b, 1, 2) if transposed else b, out=out)
            return
        # one row or one column: numpy takes a matrix-vector product there, which rounds
        # otherwise than a GEMM, so the bands are GEMVs too (a forward gives the same
        # result with or without helpers). Bands of rows of A or of B^T (cblas_sgemv over
        # rows, at multiples of 16) give GEMV's bits; a row times B (over columns) does not,
        # as OpenBLAS blocks its sums by the band's width: that one is not cut.
        gemv = self.blas.sgemv if m == 1 or n == 1 else 0
        cut, parts = jobs.BY_PRODUCT, 1
        if (products < 2 * self.threads and m * n * k >= MIN_GEMM_WORK
                and not (m == 1 and not transposed)):
            # wide products by bands of columns, the others the way they cut more evenly
            parts = self.threads
            cut = _cut_kind(m, n, parts)
        self._share(jobs._gemm_job, products * parts, self.blas.sgemm, gemv, a, b, out, cut,
                    parts, int(transposed))


@functools.lru_cache(maxsize=1024)
def _whole_bands(bands: int, threads: int, most: int) -> int:
    """Chunks of a product whose x is packed band by band: the most, up to ``most``, that
    hold whole bands each (a divisor of ``bands``), so that no two threads pack the same
    band; if no divisor lies in [2 * threads, most], a band each where there are at most
    twice ``most`` of them, else ``most``."""
    for chunks in range(min(bands, most), 2 * threads - 1, -1):
        if bands % chunks == 0:
            return chunks
    return bands if 2 * threads <= bands <= 2 * most else most


@functools.lru_cache(maxsize=4096)
def _cut_kind(m: int, n: int, parts: int) -> int:
    """jobs.BY_COLUMNS or BY_ROWS for an (m, n) product cut into ``parts`` bands (cached: a
    forward asks about the same few shapes every time)."""
    by_columns = n >= WIDE * m or _evenness(n, parts) > _evenness(m, parts)
    return jobs.BY_COLUMNS if by_columns else jobs.BY_ROWS


def _evenness(size: int, parts: int) -> float:
    """How evenly ``size`` cuts into ``parts`` bands on jobs.ALIGN boundaries (where
    jobs._cut, compiled, puts them): the mean band over the largest (1: even)."""
    cuts = [size * p // parts // jobs.ALIGN * jobs.ALIGN for p in range(parts)] + [size]
    return size / parts / max(max(b - a for a, b in zip(cuts, cuts[1:])), 1)


# ----- the team of this forward (``current()``: team.py's current_team) ------------------
_teams: dict[int, Team] = {}
_teams_lock = threading.Lock()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                         # not on Linux
        return os.cpu_count() or 1


def threads_wanted(num_threads: int | None) -> int:
    """How many threads (this one and helpers) a forward capped at ``num_threads`` shares its
    kernels over: at most the usable cores (None: all of them); 1 when PNNX_INFER_HELPERS=0."""
    if os.environ.get("PNNX_INFER_HELPERS") == "0":
        return 1
    cores = usable_cores()                         # asked each time: affinity can change
    return min(num_threads or cores, cores)


@contextlib.contextmanager
def sharing(num_threads: int | None):
    """Share the kernels called in the body over ``num_threads`` threads (None: every usable
    core; either within this thread's cap, team.thread_cap), this one and helpers; yields the
    Team, or None when the work stays on this thread (one thread wanted, no team here, or
    another forward has the team)."""
    team, joined = join(num_threads)
    try:
        yield team
    finally:
        if joined:
            leave(team)


def join(num_threads: int | None) -> tuple[Team | None, bool]:
    """``sharing``'s entry, for a caller that enters and leaves without a ``with``: the team
    (or None, as sharing yields it), and whether this call took it, in which case
    ``leave(team)`` must follow. A thread sharing a team already keeps it (not taken); a
    thread that works alone (team.work_alone) takes none; a thread with a cap
    (team.thread_cap) takes none wider."""
    team = current()
    if team is not None:
        return team, False
    if works_alone():
        return None, False
    cap = thread_cap()
    if cap is not None:
        num_threads = cap if num_threads is None else min(num_threads, cap)
    team = team_for(num_threads)
    if team is None or not team.in_use.acquire(blocking=False):
        return None, False
    set_current_team(team)
    team.active.set()
    return team, True


def leave(team: Team) -> None:
    """Give back a team ``join`` took: its helpers may sleep, another forward may take it;
    then run what the forward left for after it (team.after_sharing)."""
    team.active.clear()
    set_current_team(None)
    team.in_use.release()
    for action in actions_after_sharing():        # each on its own: one that fails does
        try:                                      # not fail the forward, nor the others
            action()
        except Exception:
            log.exception("an action left for after a forward failed")


def team_for(num_threads: int | None) -> Team | None:
    """The team a forward capped at ``num_threads`` shares its work with, started on first
    use; None when one thread is wanted or numpy's BLAS was not found."""
    wanted = threads_wanted(num_threads)
    return _team(wanted - 1) if wanted >= 2 else None


def _team(helpers: int) -> Team | None:
    with _teams_lock:
        team = _teams.get(helpers)
        if team is None and helpers not in _teams:
            blas = find_blas()
            from layers.fast.backend import start

            start()                                # the compiled jobs
            team = _teams[helpers] = Team(helpers, blas) if blas else None
        return team


class Blas(NamedTuple):
    """Addresses of numpy's OpenBLAS functions that the helpers call (64-bit integers)."""
    sgemm: int
    sgemv: int


def find_blas() -> Blas | None:
    """``cblas_sgemm`` and ``cblas_sgemv`` with 64-bit integers in numpy's OpenBLAS, or None."""
    import threadpoolctl

    numpy_dir = Path(np.__file__).resolve().parent.parent
    for pool in threadpoolctl.threadpool_info():
        path = pool.get("filepath") or ""
        if pool.get("internal_api") != "openblas" or not Path(path).is_relative_to(numpy_dir):
            continue
        library = ctypes.CDLL(path)
        for prefix in ("scipy_cblas_", "cblas_"):
            functions = [getattr(library, f"{prefix}{name}64_", None)
                         for name in ("sgemm", "sgemv")]
            if None not in functions:
                return Blas(*(ctypes.cast(f, ctypes.c_void_p).value for f in functions))
    log.info("numpy's OpenBLAS (64-bit interface) not found: the kernels run on one thread")
    return None


@atexit.register
def _stop_teams() -> None:
    for team in _teams.values():
        if team is not None:
            team.stop()


def _forget_teams_after_fork() -> None:
    """A forked child has none of the parent's threads: it makes its own teams (team.py
    forgets this thread's team and buffers)."""
    global _teams_lock
    _teams.clear()
    _teams_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_teams_after_fork)
