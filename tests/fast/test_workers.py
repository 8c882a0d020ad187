"""Helper threads (layers/fast/workers.py, jobs.py): every kernel shared between the calling
thread and helpers gives what it gives on one thread, whichever thread takes which chunk,
and a forward never waits for a helper that does not come."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from layers import kernels
from layers.fast import backend, jobs, pointwise, pointwise_transposed, winograd, workers
from layers.fast.conv import PackedConv2d
from layers.fast.epilogue import CLAMP, GELU, IDENTITY, SIGMOID, THEN_AFFINE, Activation
from layers.fast.simd import ROWS
from layers.fast.winograd import pack_winograd_weight
from layers.fast.winograd_f2 import pack_winograd_f2_weight

RELU6 = Activation(CLAMP, 0.0, 6.0)


@pytest.fixture(scope="module")
def blas():
    backend.start()
    functions = workers.find_blas()
    if functions is None:
        pytest.skip("numpy's OpenBLAS (64-bit cblas_sgemm) not found: no helper threads")
    return functions


@pytest.fixture(params=[0, 1, 2], ids=["no helper", "1 helper", "2 helpers"])
def team(request, blas):
    """A private team, its helpers spinning; with no helper the caller takes every chunk."""
    team = workers.Team(request.param, blas)
    team.active.set()
    yield team
    team.stop()


@pytest.fixture
def shared(monkeypatch, blas):
    """Run the body's kernels on a 2-thread team (``with shared(): ...``), even on one core."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)

    @__import__("contextlib").contextmanager
    def run():
        with workers.sharing(2) as team:
            assert team is not None
            yield team
    return run


def convolve(x, weight, bias, stride, pads, dilation, groups, activation, residual):
    top, bottom, left, right = pads
    padded = (*x.shape[:2], x.shape[2] + top + bottom, x.shape[3] + left + right)
    out_hw = kernels.conv2d_output_shape(padded, weight.shape, stride, 0, dilation, groups)[2:]
    packed = PackedConv2d(weight, bias, stride, dilation, groups)
    return packed.run(x, pads, out_hw, activation, residual), packed.algorithm(x.shape[0],
                                                                               out_hw)


CONVOLUTIONS = {     # N, C_in, C_out, H, W, kernel, stride, pads, dilation, groups
    "depthwise 3x3": (1, 40, 40, 28, 28, 3, 1, (1, 1, 1, 1), 1, 40),
    "depthwise 5x5 s2 x2": (2, 24, 48, 29, 27, 5, 2, (2, 1, 2, 2), 1, 24),
    "depthwise dilated": (1, 16, 16, 30, 30, 3, 1, (2, 2, 2, 2), 2, 16),
    "depthwise 4x4 channels last": (2, 300, 300, 4, 4, 5, 1, (2, 2, 2, 2), 1, 300),
    "depthwise 5x5 s2 channels last": (2, 40, 40, 29, 27, 5, 2, (2, 1, 2, 2), 1, 40),
    "depthwise 7x7 dilated channels last": (1, 40, 40, 20, 20, 7, 1, (6, 6, 6, 6), 2, 40),
    "winograd F(4x4)": (1, 32, 48, 40, 40, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(2x2)": (2, 64, 64, 14, 14, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(4x4) x4": (4, 24, 40, 20, 19, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(4x4) x3": (3, 24, 40, 20, 19, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(4x4) x9": (9, 24, 40, 20, 19, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(4x4) few rows": (1, 64, 64, 16, 13, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd F(2x2) strips": (1, 288, 16, 18, 17, 3, 1, (1, 1, 1, 1), 1, 1),
    "direct 3x3 s2": (2, 24, 40, 30, 30, 3, 2, (1, 1, 1, 1), 1, 1),
    "direct stem 7x7": (1, 3, 16, 64, 64, 7, 2, (3, 3, 3, 3), 1, 1),
    "direct bands cut mid-row": (1, 20, 16, 13, 17, 3, 1, (1, 1, 1, 1), 1, 1),
    "im2col 3x3 s2 on 7x7": (2, 24, 40, 14, 14, 3, 2, (1, 1, 1, 1), 1, 1),
    "1x1": (3, 48, 80, 14, 14, 1, 1, (0, 0, 0, 0), 1, 1),
    "1x1 few rows": (1, 96, 24, 56, 56, 1, 1, (0, 0, 0, 0), 1, 1),
    "1x1 widening": (1, 16, 96, 40, 40, 1, 1, (0, 0, 0, 0), 1, 1),
    "1x1 strided": (1, 32, 64, 63, 63, 1, 2, (0, 0, 0, 0), 1, 1),   # cols: 2^15 values
    "grouped 3x3": (2, 32, 64, 12, 12, 3, 1, (1, 1, 1, 1), 1, 4),
    "grouped 1x1": (1, 32, 64, 9, 9, 1, 1, (0, 0, 0, 0), 1, 2),
}


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=list(CONVOLUTIONS))
@pytest.mark.parametrize("extras", ["plain", "bias relu6 residual"])
def test_shared_convolutions_give_what_one_thread_gives(case, extras, shared):
    n, c_in, c_out, h, w, k, s, pads, d, groups = CONVOLUTIONS[case]
    rng = np.random.default_rng(abs(hash((case, extras))) % 2 ** 32)
    x = rng.standard_normal((n, c_in, h, w), dtype=np.float32)
    weight = rng.standard_normal((c_out, c_in // groups, k, k), dtype=np.float32) * 0.2
    bias, residual, activation = None, None, IDENTITY
    alone, algorithm = convolve(x, weight, bias, (s, s), pads, (d, d), groups, activation,
                                residual)
    if extras != "plain":
        bias = rng.standard_normal(c_out).astype(np.float32)
        residual = rng.standard_normal(alone.shape, dtype=np.float32)
        activation = RELU6
        alone, _ = convolve(x, weight, bias, (s, s), pads, (d, d), groups, activation, residual)
    assert ("channels last" in case) == (algorithm == "depthwise_channels_last")
    with shared() as team:
        before = team.control[jobs.TICKET] >> 40
        together, _ = convolve(x, weight, bias, (s, s), pads, (d, d), groups, activation,
                               residual)
        assert team.control[jobs.TICKET] >> 40 > before      # jobs were shared
    pointwise = k == s == 1 and groups == 1 and not any(pads)    # register tiles, per tile
    if algorithm.startswith(("depthwise", "winograd", "direct")) or pointwise:
        np.testing.assert_array_equal(together, alone)       # the same numba code, per plane
    else:
        np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)


# Winograd cases of CONVOLUTIONS -> the strips a 2-thread team cuts each image into, each
# thread running all three steps alone on its strips (winograd.strips_apart), or None
WINOGRAD_STRIPS = {"winograd F(4x4)": 2, "winograd F(2x2)": 1, "winograd F(4x4) x4": 1,
                   "winograd F(4x4) x3": None, "winograd F(4x4) x9": 1,
                   "winograd F(4x4) few rows": None,
                   "winograd F(2x2) strips": 2}


def spy_on_strips(monkeypatch) -> list[int]:
    """The strips an image is cut into, for each Winograd convolution the team then runs
    in strips (Team.winograd_strips)."""
    strips, run_strips = [], workers.Team.winograd_strips

    def spy(team, f2, x, packed, bias, residual, y, work, space, count, *rest):
        strips.append(count)
        return run_strips(team, f2, x, packed, bias, residual, y, work, space, count, *rest)
    monkeypatch.setattr(workers.Team, "winograd_strips", spy)
    return strips


@pytest.mark.parametrize("case", WINOGRAD_STRIPS)
def test_winograd_runs_strips_alone_where_it_pays(case, shared, monkeypatch):
    """Whole images or a strip of one per thread, as strips_apart says; torch's answer."""
    n, c_in, c_out, h, w, k, s, pads, d, groups = CONVOLUTIONS[case]
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal((n, c_in, h, w), dtype=np.float32)
    weight = rng.standard_normal((c_out, c_in, k, k), dtype=np.float32) * 0.2
    bias = rng.standard_normal(c_out).astype(np.float32)
    residual = rng.standard_normal((n, c_out, h, w), dtype=np.float32)
    strips = spy_on_strips(monkeypatch)
    with shared():
        y, algorithm = convolve(x, weight, bias, (s, s), pads, (d, d), groups, RELU6,
                                residual)
    assert algorithm.startswith("winograd")
    expected = WINOGRAD_STRIPS[case]
    assert strips == ([] if expected is None else [expected])
    torch = pytest.importorskip("torch")
    ref = torch.clamp(torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(weight).double(),
        torch.from_numpy(bias).double(), padding=1) + torch.from_numpy(residual).double(), 0, 6)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_winograd_strips_of_three_threads_give_one_threads_bits(monkeypatch, blas):
    """One image cut into a strip for each of 3 threads (heights 4, 4 and 5 rows of tiles),
    and 4 images on 3 threads (2, 1, 1): the bits of one thread."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 3)
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((40, 24, 3, 3), dtype=np.float32) * 0.2
    for n, expected in ((1, 3), (4, None), (12, 1)):
        x = rng.standard_normal((n, 24, 52, 21), dtype=np.float32)
        alone, _ = convolve(x, weight, None, (1, 1), (1, 1, 1, 1), (1, 1), 1, RELU6, None)
        with monkeypatch.context() as patch:
            strips = spy_on_strips(patch)
            with workers.sharing(3) as team:
                assert team is not None and team.threads == 3
                together, _ = convolve(x, weight, None, (1, 1), (1, 1, 1, 1), (1, 1), 1,
                                       RELU6, None)
        assert strips == ([] if expected is None else [expected])
        np.testing.assert_array_equal(together, alone)


def test_strips_apart_rules():
    """A team runs strips alone where they share out evenly, are tall enough, fit a chunk,
    and outweigh their share of the packed weights; else it shares each step."""
    row, rows = 36 * 128 * 14 * 4, 14             # 64 channels at 56x56, F(4x4)
    small = 36 * 64 * 64 * 4                      # its packed weights
    assert winograd.strips_apart(8, rows, 2, row, small) == 1       # 4 images a thread
    assert winograd.strips_apart(9, rows, 2, row, small) == 1       # many: 5 and 4
    assert winograd.strips_apart(3, rows, 2, row, small) is None    # 2 and 1: uneven
    assert winograd.strips_apart(1, rows, 2, row, small) == 2       # a strip a thread
    assert winograd.strips_apart(1, rows, 3, row, small) == 3
    assert winograd.strips_apart(2, rows, 4, row, small) == 2
    assert winograd.strips_apart(3, rows, 4, row, small) is None
    assert winograd.strips_apart(1, 7, 2, row, small) is None        # strips of 3 rows
    assert winograd.strips_apart(8, rows, 1, row, small) is None     # no helpers
    assert winograd.strips_apart(0, rows, 2, row, small) is None     # no images
    heavy = winograd.STRIP_WEIGHT_RATIO * 7 * row + 1                # weights outweigh
    assert winograd.strips_apart(1, rows, 2, row, heavy) is None
    assert winograd.strips_apart(8, rows, 2, row, heavy) == 1        # a whole image outweighs
    tall = winograd.STRIPS_CHUNKS * winograd.CHUNK_BYTES // (2 * row) + 1    # past them
    assert winograd.strips_apart(2, tall, 2, row, small) is None
    assert winograd.strips_apart(2, tall - 1, 2, row, small) == 1
    assert winograd.strips_apart(8, 3, 2, row, small) is None        # images of 3 rows


@pytest.mark.parametrize("case", [(1, 8, 8, 4, 4, 3, 1), (1, 16, 16, 8, 8, 1, 1),
                                  (2, 4, 8, 6, 6, 3, 2)])
def test_calls_too_small_to_share_run_alone(case, shared):
    """A convolution of little work (pointwise.SHARED_FROM multiply-adds,
    gemm.IM2COL_SHARED_FROM values of cols) runs on the calling thread even in a team: no
    job is published, and the answer is the one thread's."""
    n, c_in, c_out, h, w, k, s = case
    rng = np.random.default_rng(sum(case))
    x = rng.standard_normal((n, c_in, h, w), dtype=np.float32)
    weight = rng.standard_normal((c_out, c_in, k, k), dtype=np.float32)
    pads = (k // 2,) * 4
    alone, _ = convolve(x, weight, None, (s, s), pads, (1, 1), 1, RELU6, None)
    with shared() as team:
        before = team.control[jobs.TICKET] >> 40
        together, _ = convolve(x, weight, None, (s, s), pads, (1, 1), 1, RELU6, None)
        assert team.control[jobs.TICKET] >> 40 == before
    np.testing.assert_array_equal(together, alone)


@pytest.mark.parametrize("c_out, c_in, jobs_shared", [(64, 64, 2), (48, 40, 2), (1, 3, 0)])
def test_winograd_packing_is_shared_and_gives_the_same_bits(c_out, c_in, jobs_shared, shared):
    """A new input size's plan runs inside the forward: its Winograd packings (a product
    per filter) are shared with the helpers, giving the bits one thread gives; one filter of 3
    channels is too little work to share (pointwise.SHARED_FROM)."""
    weight = np.random.default_rng(c_in).standard_normal((c_out, c_in, 3, 3), dtype=np.float32)
    alone = [pack(weight) for pack in (pack_winograd_weight, pack_winograd_f2_weight)]
    with shared() as team:
        before = team.control[jobs.TICKET] >> 40
        together = [pack(weight) for pack in (pack_winograd_weight, pack_winograd_f2_weight)]
        assert team.control[jobs.TICKET] >> 40 == before + jobs_shared
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("shape", [
    (1, 1, 7, 5, 3),            # too small to cut
    (1, 1, 200, 96, 64),        # one product: bands of rows
    (1, 1, 24, 3136, 96),       # few rows: bands of columns
    (36, 36, 64, 196, 64),      # a stack (Winograd): by product
    (5, 1, 40, 49, 33),         # several images, one weight
    (3, 3, 17, 33, 1),          # K = 1
    (2, 2, 5, 6, 0),            # K = 0: zeros
    (0, 1, 4, 4, 4),            # no product
])
def test_shared_matrix_products_match_numpy(shape, team):
    products, a_products, m, n, k = shape
    rng = np.random.default_rng(products * 1000 + m + n + k)
    a = rng.standard_normal((a_products, m, k), dtype=np.float32)
    b = rng.standard_normal((products, k, n), dtype=np.float32)
    want = np.matmul(a, b)
    out = np.full(want.shape, np.nan, np.float32)
    team.matmul(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [
    (1, 1, 1, 1000, 1280),      # a classifier at batch 1: one row, bands of columns
    (1, 1, 1, 37, 100),         # too small to cut
    (3, 1, 1, 300, 64),         # one row, a stack
    (1, 1, 300, 1, 1280),       # one column (a 1x1 convolution of a 1x1 image): bands of rows
    (2, 2, 70, 1, 33),
    (1, 1, 1, 1, 50),           # a dot product
])
@pytest.mark.parametrize("transposed", [False, True])
def test_products_of_one_row_or_column_are_numpys_bit_for_bit(shape, transposed, team):
    """One row or one column: numpy runs a matrix-vector product (GEMV), which rounds
    otherwise than a GEMM; the team runs GEMVs on its bands, giving numpy's bits, so that a
    forward's result does not depend on whether it got the helpers."""
    from threadpoolctl import threadpool_limits

    products, a_products, m, n, k = shape
    rng = np.random.default_rng(m * 7 + n + k)
    a = rng.standard_normal((a_products, m, k), dtype=np.float32)
    b = rng.standard_normal((products, n, k) if transposed else (products, k, n),
                            dtype=np.float32)
    out = np.full((products, m, n), np.nan, np.float32)
    with threadpool_limits(1):       # as in a forward with helpers (OpenBLAS's threaded
        want = np.matmul(a, np.swapaxes(b, 1, 2) if transposed else b)   # GEMV rounds
        team.matmul(a, b, out, transposed=transposed)                    # otherwise)
    np.testing.assert_array_equal(out, want)


def test_a_thousand_jobs_in_a_row_each_complete(team):
    """The job protocol under churn: many short jobs, every chunk run exactly once (a
    chunk run twice would add twice; one skipped, not at all)."""
    rng = np.random.default_rng(5)
    y = rng.standard_normal((2, 64, 9), dtype=np.float32)
    ones = np.ones(64, np.float32)
    want = y.copy()
    for _ in range(1000):
        team.finish(y, ones, None, IDENTITY)             # y += 1 on every row, once
    np.testing.assert_allclose(y, want + 1000, rtol=1e-5)


@pytest.mark.parametrize("helpers", [1, 2])
@pytest.mark.parametrize("awake", [True, False], ids=["helpers spinning", "helpers asleep"])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 100])
def test_each_thread_is_dealt_a_run_of_chunks_and_takes_what_is_left(helpers, awake, rows,
                                                                      blas):
    """The chunks are dealt as one run per thread; every chunk runs once, whether the
    helpers help or the caller takes every run itself (helpers asleep), and with fewer
    chunks than threads (empty runs, the caller's never). Each run's counter ends at the
    run's last chunk, under the job's ticket."""
    team = workers.Team(helpers, blas)
    if awake:
        team.active.set()
    try:
        y = np.zeros((1, rows, 9), np.float32)
        for _ in range(50):
            team.finish(y, np.ones(rows, np.float32), None, IDENTITY)     # y += 1, once
        np.testing.assert_array_equal(y, np.full_like(y, 50))
        ticket, chunks = team.control[jobs.TICKET], min(team.chunks, rows)
        ends = [team.control[jobs.NEXT + 8 * run] - ticket for run in range(team.threads)]
        runs = team.threads                   # as even as can be, the longer runs first
        assert ends == [-(-(run + 1) * chunks // runs) for run in range(runs)]
    finally:
        team.stop()


def test_a_job_runs_in_four_chunks_per_thread_with_a_row_of_space_per_thread(team,
                                                                             monkeypatch):
    """Each thread takes chunks until none is left (a slower one takes fewer), and the
    pointwise kernels' work space is indexed by the thread, not the chunk: CHUNKS per thread,
    as many rows as threads, the product numpy's. A thread keeps the band of x it packed for
    its next chunk of the same band, never for another call's x (the same space, reused);
    fewer rows are refused before any kernel runs past them."""
    assert team.chunks == workers.CHUNKS * team.threads
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((1, 96, 32), dtype=np.float32)      # widening: x packed
    x = rng.standard_normal((1, 32, 300), dtype=np.float32)
    y = np.empty((1, 96, 300), np.float32)
    bias, no_residual = np.zeros(96, np.float32), np.zeros((0, 0, 0), np.float32)
    space = np.zeros((team.threads, pointwise.space_size(32)), np.float32)
    team.pointwise(weight, x, bias, no_residual, y, space, pointwise.NO_GEOMETRY, IDENTITY)
    np.testing.assert_allclose(y[0], weight[0] @ x[0], rtol=1e-4, atol=1e-4)
    for seed in (7, 8):               # the same space, another x: no band of the old one
        x2 = np.random.default_rng(seed).standard_normal((1, 32, 300), dtype=np.float32)
        team.pointwise(weight, x2, bias, no_residual, y, space, pointwise.NO_GEOMETRY,
                       IDENTITY)
        np.testing.assert_allclose(y[0], weight[0] @ x2[0], rtol=1e-4, atol=1e-4)
        pointwise._pointwise(weight, x, bias, no_residual, y, space[0], pointwise.NO_GEOMETRY,
                             IDENTITY.code, IDENTITY.a, IDENTITY.b)
        np.testing.assert_allclose(y[0], weight[0] @ x[0], rtol=1e-4, atol=1e-4)
    held = [tuple(row) for row in space[:, :2]]      # (band + 1, k0) each thread holds
    assert (1, 0) in held and set(held) <= {(1, 0), (0, 0)}        # one band: band 0, k0 0
    # two images of six bands each, two slices of K, in CHUNKS chunks per thread (forced: not
    # the chunks of whole bands such products take); with one helper, chunks cut bands
    monkeypatch.setattr(workers, "_whole_bands", lambda bands, threads, most: most)
    weight = rng.standard_normal((1, 300, 290), dtype=np.float32)
    x = rng.standard_normal((2, 290, 1500), dtype=np.float32)
    y = np.empty((2, 300, 1500), np.float32)
    space = np.zeros((team.threads, pointwise.space_size(290)), np.float32)
    assert pointwise.band_count(290, 1500, 1) == 6
    team.pointwise(weight, x, np.zeros(300, np.float32), no_residual, y, space,
                   pointwise.NO_GEOMETRY, IDENTITY)
    np.testing.assert_allclose(y, weight[0] @ x, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="one row of"):
        team.pointwise(weight, x, bias, no_residual, y, space[:, :-1], pointwise.NO_GEOMETRY,
                       IDENTITY)
    if team.threads > 1:
        with pytest.raises(ValueError, match="per thread needed"):
            team.pointwise(weight, x, bias, no_residual, y, space[:1], pointwise.NO_GEOMETRY,
                           IDENTITY)


@pytest.mark.parametrize("bands, threads, most, chunks", [
    (30, 2, 8, 6), (36, 2, 8, 6), (4, 2, 8, 4), (7, 2, 8, 7), (8, 2, 8, 8), (72, 2, 8, 8),
    (13, 2, 8, 13), (17, 2, 8, 8), (3, 2, 8, 8), (1, 2, 8, 8), (12, 3, 12, 12),
    (10, 3, 12, 10)])
def test_products_packed_band_by_band_run_in_chunks_of_whole_bands(bands, threads, most,
                                                                   chunks):
    """A product whose x is packed band by band is cut into chunks of whole bands (the most
    up to ``most`` that divide the bands), so that no two threads pack the same band; where
    no such cut gives every thread two chunks, a band a chunk (up to twice ``most``), else
    ``most`` chunks as any job."""
    assert workers._whole_bands(bands, threads, most) == chunks


@pytest.mark.parametrize("c_in, c_out, length", [(1, 1, 1), (3, 64, 12544), (27, 32, 12544),
                                                 (147, 64, 12544), (576, 128, 784),
                                                 (4608, 512, 49), (64, 64, 196),
                                                 (290, 300, 1500), (256, 96, 4096),
                                                 (480, 80, 196), (672, 112, 196)])
@pytest.mark.parametrize("images", [1, 3, 8])
def test_band_plan_is_the_kernels(c_in, c_out, length, images):
    """band_plan (for the team's chunks) gives the bands and the packing pointwise_blocks
    works with: bands of block_width pixels, as many as cover the pixels, and packs_x."""
    for cols, stacked in ((False, False), (True, False), (False, True)):
        bands, packed = pointwise.band_plan(c_in, c_out, images, length, cols, stacked)
        least = pointwise.least_bands(c_in, c_out, images, length, cols, stacked)
        assert bands == -(-length // pointwise.block_width(c_in, length, least))
        assert (pointwise.block_count(c_in, c_out, images, length, cols, stacked)
                == images * -(-c_out // ROWS) * bands)
        assert packed == pointwise.packs_x(c_in, c_out, length, cols)
        assert packed or not cols


def chunks_of_each_job(team, monkeypatch) -> list[int]:
    """A list that gets the chunk count of each job the team shares from now on."""
    calls: list[int] = []
    share = team._share
    monkeypatch.setattr(team, "_share", lambda job, chunks, *args: (calls.append(chunks),
                                                                    share(job, chunks, *args)))
    return calls


# chunks for a team of 1, 2, 3 threads (4 per thread, or whole bands where x is packed)
TEAM_CUTS = [
    pytest.param((1, 300, 256), (1, 256, 1536), (3, 6, 6), id="widening, six bands"),
    pytest.param((6, 64, 64), (6, 64, 196), (3, 6, 6), id="a stack of six, a band each"),
    pytest.param((1, 96, 256), (6, 256, 196), (3, 6, 9),
                 id="narrowing on rows of 196 pixels: packed, 6 x 3 bands"),
    pytest.param((1, 32, 256), (3, 256, 1024), (4, 6, 12),
                 id="narrowing on 32x32 planes: packed, twelve bands"),
    pytest.param((1, 64, 128), (3, 128, 784), (4, 8, 12), id="narrowing, read in place")]


@pytest.mark.parametrize("weight_shape, x_shape, chunks_by_threads", TEAM_CUTS)
def test_the_team_cuts_packed_products_into_whole_bands(weight_shape, x_shape,
                                                         chunks_by_threads, team,
                                                         monkeypatch):
    """Team.pointwise gives a product whose x is packed (widening, a Winograd stack, or
    narrowing where packs_x says so) chunks that begin on band boundaries (blocks run image
    by image, band by band), and a product read in place its usual CHUNKS per thread; the
    product is numpy's either way."""
    calls = chunks_of_each_job(team, monkeypatch)
    rng = np.random.default_rng(9)
    weight = rng.standard_normal(weight_shape, dtype=np.float32)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    y = np.empty((x.shape[0], weight.shape[1], x.shape[2]), np.float32)
    space = np.zeros((team.threads, pointwise.space_size(x.shape[1])), np.float32)
    stacked = weight.shape[0] > 1                       # in panels (pointwise.pack_stack)
    team.pointwise(pointwise.pack_stack(weight) if stacked else weight, x,
                   np.zeros(y.shape[1], np.float32), np.zeros((0, 0, 0), np.float32), y, space,
                   pointwise.NO_GEOMETRY, IDENTITY)
    np.testing.assert_allclose(y, weight @ x if stacked else weight[0] @ x,
                               rtol=1e-3, atol=1e-3)
    assert calls == [chunks_by_threads[team.threads - 1]]


@pytest.mark.parametrize("c_in, c_out, length", [(480, 80, 196), (672, 112, 196),
                                                 (300, 40, 289), (256, 32, 1024)])
def test_one_image_narrowing_is_shared_in_whole_bands_with_the_same_bits(c_in, c_out, length,
                                                                          team, monkeypatch):
    """One image of a narrowing product that packs x: cut into NARROWING_BANDS bands or one
    a strip, which the team takes in chunks of whole bands (no band packed by two threads),
    with the bits of one thread's run."""
    calls = chunks_of_each_job(team, monkeypatch)
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((1, c_out, c_in), dtype=np.float32)
    x = rng.standard_normal((1, c_in, length), dtype=np.float32)
    bias = rng.standard_normal(c_out, dtype=np.float32)
    no_residual = np.zeros((0, 0, 0), np.float32)
    bands, packed = pointwise.band_plan(c_in, c_out, 1, length, False, False)
    strips = -(-length // pointwise.COLUMNS)
    assert packed and bands >= min(pointwise.NARROWING_BANDS, strips)
    y = np.empty((1, c_out, length), np.float32)
    space = np.zeros((team.threads, pointwise.space_size(c_in)), np.float32)
    team.pointwise(weight, x, bias, no_residual, y, space, pointwise.NO_GEOMETRY, IDENTITY)
    alone = np.empty_like(y)
    pointwise._pointwise(weight, x, bias, no_residual, alone, space[0], pointwise.NO_GEOMETRY,
                         IDENTITY.code, IDENTITY.a, IDENTITY.b)
    np.testing.assert_array_equal(y, alone)
    np.testing.assert_allclose(y[0], weight[0] @ x[0] + bias[:, None], rtol=1e-4, atol=1e-4)
    assert space[0, 0] == bands             # the kernel packed band number `bands` - 1 last
    if team.threads > 1:
        assert bands % calls[0] == 0                  # chunks of whole bands


@pytest.mark.parametrize("activation", [IDENTITY, Activation(SIGMOID),
                                        Activation(GELU + THEN_AFFINE, 0.5, -1.0)],
                         ids=["none", "sigmoid", "gelu then affine"])
@pytest.mark.parametrize("images, c_in, c_out, length, cut_by_threads", [
    (1, 576, 96, 196, (0, 2, 3)), (1, 384, 64, 196, (0, 2, 3)),
    (2, 576, 96, 196, (0, 0, 3)), (1, 64, 40, 49, (0, 0, 0)),       # x copied: not cut
    (1, 960, 256, 196, (0, 0, 0)), (3, 96, 32, 100, (0, 0, 0))])    # more channels; images
def test_transposed_products_are_cut_into_even_bands_with_the_same_bits(
        images, c_in, c_out, length, cut_by_threads, activation, team, monkeypatch):
    """The transposed 1x1 product of fewer images than threads, on images read in place
    that have more pixels than output channels, is cut into bands, an image's as many as
    make them a multiple of the threads (2 images on 3 threads: 3 each), one chunk a band;
    with the same bits as one thread's run, which takes BAND pixels a band, and numpy's
    product."""
    calls = chunks_of_each_job(team, monkeypatch)
    rng = np.random.default_rng(c_in)
    weight = rng.standard_normal((c_out, c_in), dtype=np.float32) / np.sqrt(c_in)
    x = rng.standard_normal((images, c_in, length), dtype=np.float32)
    bias = rng.standard_normal(c_out, dtype=np.float32)
    residual = rng.standard_normal((images, c_out, length), dtype=np.float32)
    panels = pointwise_transposed.pack_panels(weight)
    floats = pointwise_transposed.space_size(c_in, length)
    y, alone = (np.empty((images, c_out, length), np.float32) for _ in range(2))
    team.pointwise_transposed(panels, x, bias, residual, y,
                              np.zeros((team.threads, floats), np.float32), activation)
    pointwise_transposed._pointwise_transposed(panels, x, bias, residual, alone,
                                               np.zeros(floats, np.float32), activation.code,
                                               activation.a, activation.b)
    np.testing.assert_array_equal(y, alone)
    if activation == IDENTITY:
        np.testing.assert_allclose(y, weight @ x + bias[:, None] + residual, rtol=1e-4,
                                   atol=1e-4)
    bands = cut_by_threads[team.threads - 1]
    band, planned = pointwise_transposed.band_plan(images, length, c_out, team.threads)
    assert planned == bands
    assert band == (-(-length // bands) if bands else pointwise_transposed.BAND)
    if bands:
        assert calls == [images * bands]                      # a chunk a band
        assert images * bands % team.threads == 0


def test_actions_after_sharing_run_when_the_outermost_forward_gives_its_team_back(
        shared, caplog):
    """team.after_sharing: at once on a thread without a team; kept while the thread shares
    one (a nested join does not give it back), run in order by the leave that does, each on
    its own (one that raises is logged; the others run; the forward is not failed)."""
    from layers.fast.team import after_sharing

    done: list[str] = []
    after_sharing(lambda: done.append("no team"))
    assert done == ["no team"]

    def fails() -> None:
        raise ValueError("this action fails")

    with shared() as team:
        after_sharing(lambda: done.append("first"))
        inner, joined = workers.join(2)                 # the thread's own team: not taken
        assert inner is team and not joined
        after_sharing(fails)
        after_sharing(lambda: done.append("second"))
        assert done == ["no team"]
    assert done == ["no team", "first", "second"]
    assert "an action left for after a forward failed" in caplog.text
    assert "this action fails" in caplog.text


def test_forwards_in_two_threads_at_once_share_one_team(shared):
    """One forward at a time has the team; another thread's forward meanwhile runs on its
    own thread, and both give the one-thread result."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 32, 28, 28), dtype=np.float32)
    weight = rng.standard_normal((32, 1, 3, 3), dtype=np.float32)
    want, _ = convolve(x, weight, None, (1, 1), (1, 1, 1, 1), (1, 1), 32, IDENTITY, None)
    got, teams = {}, {}
    start = threading.Barrier(2)

    def run(name):
        start.wait(timeout=10)
        with workers.sharing(2) as team:
            teams[name] = team
            for _ in range(50):
                got[name], _ = convolve(x, weight, None, (1, 1), (1, 1, 1, 1), (1, 1), 32,
                                        IDENTITY, None)
            start.wait(timeout=10)                       # both inside at once
    runners = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=60)
    assert sorted(t is None for t in teams.values()) == [False, True]
    for name in got:
        np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_shared_products_with_b_transposed_match_numpy(rows, team):
    """nn.Linear's product, x @ weight.T with the weight as stored (out, in)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 1280), dtype=np.float32)
    weight = rng.standard_normal((1000, 1280), dtype=np.float32)
    out = np.full((rows, 1000), np.nan, np.float32)
    team.matmul(x[None], weight[None], out[None], transposed=True)
    np.testing.assert_allclose(out, x @ weight.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 2])
def test_a_model_gives_the_same_logits_with_or_without_helpers(batch, shared):
    """EfficientNet-Lite0 (depthwise, 1x1 and strided convolutions, the classifier) on a
    team of two and on one thread: bit for bit the same, so a forward's result does not
    depend on whether it got the helpers."""
    from infer import RuntimeGraph
    from support import REPO

    param = (REPO / "model_file" / "efficientnet_lite0"
             / "efficientnet_lite0.pnnx.param")
    graph = RuntimeGraph(param).build()
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    graph.set_num_threads(1)
    alone = graph.forward(x)[0]
    graph.set_num_threads(2)
    with shared() as team:
        before = team.control[jobs.TICKET] >> 40
        together = graph.forward(x)[0]
        assert team.control[jobs.TICKET] >> 40 >= before + 40     # the convolutions shared
    np.testing.assert_array_equal(together, alone)


def test_a_team_asked_for_inside_a_capped_body_is_no_wider_than_its_cap(monkeypatch):
    """Inside threads.limit(1) or threads.setup(1) (a forward or a planning capped at one
    thread), a kernel that asks for every core's team (a Winograd packing for a size first
    met in a forward) takes none; under a cap of 2 a team of 2 where there are more cores;
    an uncapped body inside a capped one is uncapped; the cap goes when the body ends, even
    where two bodies end in the other order than they began (generators)."""
    from infer import threads
    from layers.fast.team import thread_cap

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)
    if workers.team_for(2) is None:
        pytest.skip("no team of helper threads here (numpy's OpenBLAS not found)")
    for body in (threads.limit, threads.setup):
        with body(1):
            assert thread_cap() == 1
            with workers.sharing(None) as team:
                assert team is None
            with body(None):                           # a graph of its own, uncapped
                with workers.sharing(None) as team:
                    assert team is not None
        assert thread_cap() is None

    def stream(cap):
        with threads.limit(cap):
            yield thread_cap()
    first, second = stream(1), stream(None)
    assert (next(first), next(second)) == (1, None)
    list(first)                                        # ends before the one begun after it
    list(second)
    assert thread_cap() is None
    monkeypatch.setattr(workers, "usable_cores", lambda: 3)
    with threads.setup(2):
        with workers.sharing(None) as team:
            assert team is not None and team.threads == 2
