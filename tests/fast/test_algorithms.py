"""The table of convolution algorithms (layers/fast/algorithms.py): for every convolution and
size it chooses what the documented rules say, loads the kernels of every algorithm a size
may choose, and packs at build what the rules pack at build."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import wait

import numpy as np
import pytest

from layers.fast import algorithms, cpu, jobs, workers
from layers.fast.algorithms import (DIRECT_COPY_MOST, DIRECT_LEAST_FILL, DIRECT_LEAST_LANES,
                                    F2_OVER_DIRECT, F4_OVER_DIRECT,
                                    ONE_UNIT_PLANES_FROM, STREAMED_MACS, WINOGRAD_F2_LARGE,
                                    WINOGRAD_F2_LARGE_MIN_TILES,
                                    WINOGRAD_F2_MIN_CHANNELS, WINOGRAD_F2_MIN_TILES,
                                    WINOGRAD_MAX_CHANNELS, WINOGRAD_MAX_PACKED,
                                    WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_TILES)
from infer import RuntimeGraph
from layers.base import at_build
from layers.fast import conv as conv_module
from layers.fast.conv import PackedConv2d, kernel_layout
from layers.fast.cpu import level2_cache_bytes
from layers.fast.depthwise import uses_channels_last
from layers.fast.epilogue import IDENTITY
from layers.fast.pointwise_transposed import BAND, transposed_pays
from layers.fast.simd import COLUMNS, LANES, ROWS
from support import REPO, write_model


def weight_of(shape):
    """A weight of ``shape`` that takes no memory: the table reads only its shape."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape, (0,) * len(shape))


def conv(c_in, c_out, k, stride=1, dilation=1, groups=1, winograd=True):
    return PackedConv2d(weight_of((c_out, c_in // groups, k, k)), None, (stride, stride),
                        (dilation, dilation), groups, winograd)


def documented_rule(c_in, c_out, k, stride, dilation, groups, winograd, batch, out_hw):
    """The rules of algorithms.py's docstring, written out as one chain of ifs."""
    if groups == c_in and c_in // groups == 1 and groups > 1:
        one_unit = batch * -(-c_in // LANES) == 1
        if one_unit and out_hw[0] * out_hw[1] >= ONE_UNIT_PLANES_FROM:
            return "depthwise"
        if uses_channels_last(c_in, c_out, (k, k), (stride, stride), out_hw):
            return "depthwise_channels_last"
        return "depthwise"
    if k == 1 and stride == 1 and groups == 1 and out_hw == (1, 1):
        return "gemv"
    length = out_hw[0] * out_hw[1]
    if k == 1 and stride == 1 and groups == 1 and transposed_pays(length, c_in, c_out):
        return "pointwise_transposed"
    one_group_im2col = groups == 1 and not (k == 1 and stride == 1)
    lanes = LANES if c_out <= LANES else COLUMNS             # one vector, or panels
    copy = c_in * band_copy(k, stride, dilation, out_hw)
    direct = (one_group_im2col and tiles_fill(out_hw[1], c_out) >= DIRECT_LEAST_FILL
              and c_out / (-(-c_out // lanes) * lanes) >= DIRECT_LEAST_LANES
              and copy <= DIRECT_COPY_MOST)
    im2col = ("gemm_transposed" if one_group_im2col and transposed_pays(length, c_in * k * k,
                                                                       c_out) else "gemm")
    im2col = "direct" if direct else im2col
    if not (winograd and k == 3 and stride == 1 and dilation == 1 and groups == 1):
        return im2col
    tiles4 = batch * -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    tiles2 = batch * -(-out_hw[0] // 2) * -(-out_hw[1] // 2)
    large = 16 * c_out * c_in * 4 > WINOGRAD_F2_LARGE
    f2 = (c_in >= WINOGRAD_F2_MIN_CHANNELS and not (direct and c_in < F2_OVER_DIRECT)
          and tiles2 >= (WINOGRAD_F2_LARGE_MIN_TILES if large else WINOGRAD_F2_MIN_TILES))
    # F(4x4)'s packing read from beyond the level-2 cache: 20 more values than F(2x2)'s for
    # each pair of channels, paid for by the multiply-adds it saves
    streams = 36 * c_out * c_in * 4 > level2_cache_bytes()
    saves = (16 * tiles2 - 36 * tiles4) / 20
    if (WINOGRAD_MIN_CHANNELS <= c_in <= WINOGRAD_MAX_CHANNELS and tiles4 >= WINOGRAD_MIN_TILES
            and 36 * c_out * c_in * 4 <= WINOGRAD_MAX_PACKED
            and not (direct and c_in < F4_OVER_DIRECT)
            and not (f2 and streams and saves < STREAMED_MACS)):
        return "winograd"
    return "winograd_f2" if f2 else im2col


def band_copy(k, stride, dilation, out_hw):
    """Floats of a band's copy, a channel, on one thread: the input rows and columns of the
    windows of BAND // width whole output rows (wherever such a band starts, so one more),
    or of a segment of at most BAND pixels of a longer row."""
    height, width = out_hw
    span = (k - 1) * dilation + 1                            # a window's rows or columns
    if width > BAND:
        segment = -(-width // -(-width // BAND))
        return span * ((segment - 1) * stride + span)
    band = min(BAND // width * width, height * width)
    rows = min(-(-(band - 1) // width) + 1, height)
    return ((rows - 1) * stride + span) * ((width - 1) * stride + span)


def tiles_fill(width, c_out):
    """The share of pixels the direct convolution's tiles fill on an output row of ``width``:
    every one where tiles of ROWS and of ROWS - 1 cover it (not for panels of at most LANES
    channels, whose tiles all have ROWS pixels), else width over whole tiles of ROWS."""
    for short in range(ROWS):
        if c_out > LANES and (width - short * (ROWS - 1)) % ROWS == 0 \
                and width >= short * (ROWS - 1):
            return 1.0
    return width / (-(-width // ROWS) * ROWS)


def grid():
    """(c_in, c_out, k, stride, dilation, groups, winograd) over dense, grouped, depthwise
    (with a channel multiplier) and 1x1 convolutions of many widths."""
    for c, k, stride, dilation, winograd in itertools.product(
            (3, 16, 64, 192, 256, 512, 1152), (1, 3, 5, 7), (1, 2), (1, 2), (True, False)):
        for c_out in (c, 2 * c, 112, 3):                  # 3: a head (direct fills 3 lanes)
            yield c, c_out, k, stride, dilation, 1, winograd
        if c % 2 == 0:
            yield c, c, k, stride, dilation, 2, winograd                  # grouped
        yield c, c, k, stride, dilation, c, winograd                      # depthwise
        yield c, 2 * c, k, stride, dilation, c, winograd                  # multiplier 2


SIZES = [(1, (h, w)) for h, w in ((1, 1), (4, 4), (5, 5), (7, 7), (8, 8), (12, 12), (14, 14),
                                  (16, 16), (28, 28), (56, 56), (112, 112), (7, 9), (15, 4))]
SIZES += [(batch, hw) for batch in (2, 4, 8, 64) for hw in ((1, 1), (4, 4), (7, 7), (14, 14))]


def test_the_table_chooses_what_the_documented_rules_say():
    checked = 0
    for case in grid():
        packed = conv(*case)
        for batch, out_hw in SIZES:
            assert packed.algorithm(batch, out_hw) == documented_rule(*case, batch, out_hw), \
                (case, batch, out_hw)
            checked += 1
    assert checked > 10_000


def test_f4_yields_to_f2_on_few_tiles_only_where_its_packing_streams(monkeypatch):
    """256 -> 256 on one 14x14 image: F(4x4)'s 9 MiB packing read each forward costs more
    than the multiply-adds its 16 tiles save; in a level-2 cache that holds it, F(4x4) runs."""
    for level2, at_14, at_16 in ((64 << 20, "winograd", "winograd"),
                                 (256 << 10, "winograd_f2", "winograd")):
        monkeypatch.setattr(algorithms, "level2_cache_bytes", lambda size=level2: size)
        assert conv(256, 256, 3).algorithm(1, (14, 14)) == at_14
        assert conv(256, 256, 3).algorithm(1, (16, 16)) == at_16
        assert conv(256, 256, 3).algorithm(2, (14, 14)) == "winograd"
        # where F(2x2) yields to direct (fewer than F2_OVER_DIRECT channels), F(4x4) stays
        assert conv(128, 128, 3).algorithm(1, (14, 14)) == "winograd"


def test_the_level2_cache_is_read_from_sysfs(monkeypatch, tmp_path):
    """index*/level, type and size of the first core's caches; an entry that cannot be read
    is passed over; none at all: LEVEL2_UNKNOWN."""
    for index, (level, kind, size) in enumerate((("1", "Data", "48K"), ("1", "Instruction",
                                                  "32K"), ("2", "Unified", "2048K"))):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(text + "\n")
    (tmp_path / "index0" / "type").unlink()                 # an entry half there
    monkeypatch.setattr(cpu, "CACHES", tmp_path)
    cpu.level2_cache_bytes.cache_clear()
    try:
        assert cpu.level2_cache_bytes() == 2 << 20
        monkeypatch.setattr(cpu, "CACHES", tmp_path / "missing")
        cpu.level2_cache_bytes.cache_clear()
        assert cpu.level2_cache_bytes() == cpu.LEVEL2_UNKNOWN
    finally:
        cpu.level2_cache_bytes.cache_clear()
    assert [cpu._bytes(s) for s in ("512K", "1M", "4096")] == [512 << 10, 1 << 20, 4096]


# 1x1 layers whose transposed epilogue costs a little more than its lanes save with 16-float
# vectors, and less with 8 (AVX2: the upright tiles, 16 pixels wide, fill fewer lanes)
WIDTH_DEPENDENT = "gemm" if LANES == 16 else "pointwise_transposed"
RESNET18 = [   # c_in, c_out, k, stride, out size at 224x224; batch 1, batch 8
    (3, 64, 7, 2, 112, "direct", "direct"),                     # the stem
    (64, 64, 3, 1, 56, "winograd", "winograd"),
    (64, 128, 3, 2, 28, "direct", "direct"),                    # strided
    (64, 128, 1, 2, 28, "direct", "direct"),                    # downsample
    (128, 128, 3, 1, 28, "winograd", "winograd"),               # F(4x4): up to 256 channels
    (128, 256, 3, 2, 14, *["direct"] * 2),                      # rows of 14: 6 + 6 + 2 fill
    (128, 256, 1, 2, 14, *["direct"] * 2),                      # 0.78 of their pixels
    (256, 512, 1, 2, 7, *["gemm_transposed"] * 2),              # rows of 7: 0.58 filled
    (256, 256, 3, 1, 14, "winograd_f2", "winograd"),            # F(4x4)'s 9 MiB read for
                                                                # 16 tiles: F(2x2)'s 4 MiB
    (256, 512, 3, 2, 7, *["gemm_transposed"] * 2),              # panels: 4.5 MiB
    (512, 512, 3, 1, 7, "gemm_transposed", "winograd_f2"),      # F(2x2) packs 16 MiB
]
EFFICIENTNET_LITE0 = [   # c_in, c_out, k, stride, groups, out size at 224x224; batch 1, 8
    (3, 32, 3, 2, 1, 112, "direct", "direct"),                  # the stem
    (32, 32, 3, 1, 32, 112, "depthwise", "depthwise"),
    (32, 16, 1, 1, 1, 112, "gemm", "gemm"),                     # 1x1, a large image
    (144, 144, 5, 2, 144, 28, "depthwise_channels_last", "depthwise_channels_last"),
    (240, 240, 3, 2, 240, 14, "depthwise_channels_last", "depthwise_channels_last"),
    (672, 672, 5, 2, 672, 7, "depthwise_channels_last", "depthwise_channels_last"),
    (1152, 1152, 5, 1, 1152, 7, "depthwise_channels_last", "depthwise_channels_last"),
    (240, 240, 5, 1, 240, 28, "depthwise_channels_last", "depthwise_channels_last"),
    (144, 144, 3, 1, 144, 56, "depthwise", "depthwise"),
    (672, 112, 1, 1, 1, 14, *[WIDTH_DEPENDENT] * 2),
    (1152, 192, 1, 1, 1, 7, "pointwise_transposed", "pointwise_transposed"),
    (192, 1152, 1, 1, 1, 7, "pointwise_transposed", "pointwise_transposed"),
    (16, 1152, 1, 1, 1, 7, "gemm", "gemm"),                     # too few channels to pay
    (320, 1280, 1, 1, 1, 7, "pointwise_transposed", "pointwise_transposed"),
    (80, 480, 1, 1, 1, 14, "gemm", "gemm"),
]


@pytest.mark.parametrize("case", RESNET18, ids=[f"{c[0]}-{c[1]} {c[2]}x{c[2]} s{c[3]} at {c[4]}"
                                                for c in RESNET18])
def test_resnet18s_convolutions(case, monkeypatch):
    # a level-2 cache smaller than F(4x4)'s 9 MiB packing of a 256-channel layer, as every
    # CPU has (a cluster's shared one may not: the streaming rule's own test covers both)
    monkeypatch.setattr(algorithms, "level2_cache_bytes", lambda: 2 << 20)
    c_in, c_out, k, stride, size, at_1, at_8 = case
    packed = conv(c_in, c_out, k, stride)
    assert packed.algorithm(1, (size, size)) == at_1
    assert packed.algorithm(8, (size, size)) == at_8


@pytest.mark.parametrize("case", EFFICIENTNET_LITE0,
                         ids=[f"{c[0]}-{c[1]} {c[2]}x{c[2]} s{c[3]} g{c[4]} at {c[5]}"
                              for c in EFFICIENTNET_LITE0])
def test_efficientnet_lite0s_convolutions(case):
    c_in, c_out, k, stride, groups, size, at_1, at_8 = case
    packed = conv(c_in, c_out, k, stride, groups=groups)
    assert packed.algorithm(1, (size, size)) == at_1
    assert packed.algorithm(8, (size, size)) == at_8


def test_the_candidates_are_every_algorithm_some_size_may_choose():
    """load_candidate_kernels loads these: what any size may run, nothing more."""
    for case in grid():
        packed = conv(*case)
        chosen = {packed.algorithm(batch, hw) for batch, hw in SIZES}
        candidates = [a.name for a in algorithms.candidates(packed)]
        assert chosen <= set(candidates), case
        c_in, c_out, k, stride, dilation, groups, winograd = case
        if groups == c_in > 1:
            assert sorted(candidates) == ["depthwise", "depthwise_channels_last"]
        else:
            assert candidates[-1] == "gemm"
            assert ("pointwise_transposed" in candidates) == packed.pointwise
            assert ("gemm_transposed" in candidates) == (groups == 1 and not packed.pointwise)
            assert ("winograd_f2" in candidates) == (packed.winograd_ok
                                                     and c_in >= WINOGRAD_F2_MIN_CHANNELS)
            assert ("winograd" in candidates) == (packed.winograd_ok and WINOGRAD_MIN_CHANNELS
                                                  <= c_in <= WINOGRAD_MAX_CHANNELS)


def test_what_is_packed_at_build_for_sizes_known_late():
    """F(4x4) where it runs (F4_OVER_DIRECT to 256 channels, a packing within
    WINOGRAD_MAX_PACKED); F(2x2) where F(4x4) does not, or where F(4x4)'s packing is larger
    than the level-2 cache (small images run F(2x2) then), if that packing is not large and
    it has F2_OVER_DIRECT channels; else the direct convolution's panels where they are not large
    and C_out fills half their lanes (nor for a 1x1 of stride 1); a 1x1's transposed panels
    where C_out fills their lanes; both packings of a depthwise layer's few filters."""
    packs = []
    for c_in, c_out, k, stride, groups in (
            (64, 64, 3, 1, 1), (256, 512, 3, 1, 1), (512, 512, 3, 1, 1), (256, 256, 3, 1, 1),
            (8, 8, 3, 1, 1), (16, 16, 3, 1, 1), (64, 128, 3, 2, 1), (256, 512, 3, 2, 1),
            (64, 128, 1, 2, 1), (64, 2 * COLUMNS, 1, 1, 1), (64, COLUMNS // 2, 1, 1, 1),
            (96, 96, 3, 1, 96), (128, 960, 3, 1, 1), (8, 3, 3, 1, 1)):
        packed = conv(c_in, c_out, k, stride, groups=groups)
        chosen = [a.name for a in algorithms.candidates(packed)
                  if a.pack_at_build is not None and a.pack_at_build(packed)]
        packs.append(chosen)
    streams = ["winograd_f2"] if 36 * 256 * 256 * 4 > level2_cache_bytes() else []
    assert packs == [["winograd"], ["winograd_f2"], [], ["winograd", *streams], ["direct"],
                     ["direct"], ["direct"], [], ["direct"], ["pointwise_transposed"], [],
                     ["depthwise_channels_last", "depthwise"], [], []]


def test_the_first_size_lets_go_of_the_winograd_packing_it_does_not_take(monkeypatch):
    """A free-size graph packs F(4x4) at build for any size (and F(2x2) too where F(4x4)'s
    packing is larger than the level-2 cache: small images take F(2x2) then); a first size
    that takes F(2x2) (10x10: 9 tiles of 4x4) drops F(4x4), one that takes F(4x4) drops
    F(2x2), so the two are not held together after it. A later size that takes the other
    packs it again. One that takes the direct convolution (fewer channels at 10x10) drops
    F(4x4) too."""
    monkeypatch.setattr(algorithms, "level2_cache_bytes", lambda: 2 << 20)
    small_first = conv(256, 256, 3)
    small_first.prepare_for_any_size()
    assert sorted(small_first._packs) == ["winograd", "winograd_f2"]
    small_first.prepare(1, (10, 10))
    assert sorted(small_first._packs) == ["winograd_f2"]
    small_first.prepare(1, (28, 28))
    assert sorted(small_first._packs) == ["winograd", "winograd_f2"]
    large_first = conv(256, 256, 3)
    large_first.prepare_for_any_size()
    packing = large_first._packs["winograd"]
    large_first.prepare(1, (28, 28))
    assert sorted(large_first._packs) == ["winograd"]
    large_first.prepare(1, (10, 10))
    assert large_first._packs["winograd"] is packing
    assert sorted(large_first._packs) == ["winograd", "winograd_f2"]
    traced = conv(256, 256, 3)                     # a graph of known shapes packs per size
    traced.prepare(1, (10, 10))
    traced.prepare(1, (28, 28))
    assert sorted(traced._packs) == ["winograd", "winograd_f2"]
    direct_first = conv(128, 128, 3)
    direct_first.prepare_for_any_size()
    assert sorted(direct_first._packs) == ["winograd"]
    direct_first.prepare(1, (10, 10))
    assert "winograd" not in direct_first._packs
    assert sorted(direct_first._packs) == ["gemm_transposed"]      # direct reads its panels
    assert direct_first.packed("direct") is direct_first.packed("gemm_transposed")
    gemm_first = conv(128, 3, 3)                   # a head: direct fills 3 of its lanes
    gemm_first.prepare_for_any_size()
    gemm_first.prepare(1, (5, 5))                  # gemm, whose packing is the weight:
    assert sorted(gemm_first._packs) == ["gemm", "winograd"]       # F(4x4) stays


def held_panels(monkeypatch, release=None, fail=False):
    """gemm_transposed for any weight size packed in the background, its packing held until
    ``release`` is set (or failing with MemoryError); a 3x3 of 48 -> 2 * COLUMNS channels on
    7x7 that takes it, its input, torch's output and a count of the transposed product's
    calls."""
    monkeypatch.setattr(algorithms, "PACKED_IN_FORWARD", 0)
    entry = algorithms.BY_NAME["gemm_transposed"]

    def held_pack(conv):
        if fail:
            raise MemoryError("no room for the panels")
        assert release is None or release.wait(30)
        return entry.pack(conv)
    monkeypatch.setitem(algorithms.BY_NAME, "gemm_transposed", entry._replace(pack=held_pack))
    calls = []                                      # (not the tiny ones of ``warm``)
    transposed = algorithms.gemm_transposed_conv2d
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((2 * COLUMNS, 48, 3, 3), dtype=np.float32) / 20
    x = rng.standard_normal((1, 48, 7, 7), dtype=np.float32)
    monkeypatch.setattr(algorithms, "gemm_transposed_conv2d", lambda *args: (
        calls.append(1) if args[0].shape == x.shape else None, transposed(*args)))
    packed = PackedConv2d(weight, None, (1, 1), (1, 1), 1, winograd=False)
    assert packed.algorithm(1, (7, 7)) == "gemm_transposed"
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight),
                                      padding=1).numpy()
    return packed, x, want, calls


def run_7x7(packed, x):
    return packed.run(x, (1, 1, 1, 1), (7, 7), IDENTITY)


def test_large_transposed_panels_are_packed_in_the_background(monkeypatch):
    """A size first met in a forward: panels larger than PACKED_IN_FORWARD are not packed
    when it is planned; its first call runs im2col's upright product without waiting for
    them, then has them packed by a background thread (here held); the next calls run the
    upright product until they are packed, then the transposed one."""
    release = threading.Event()
    packed, x, want, calls = held_panels(monkeypatch, release)
    try:
        packed.prepare(1, (7, 7))                   # planned in a forward: not packed
        assert not packed.has_packed("gemm_transposed")
        first = run_7x7(packed, x)                  # the packing is held
        second = run_7x7(packed, x)                 # ... and not waited for
        assert not calls and not packed.packing("gemm_transposed").done()
    finally:
        release.set()
    packed.packing("gemm_transposed").result(timeout=30)
    third = run_7x7(packed, x)
    assert calls == [1] and packed.has_packed("gemm_transposed")
    for y in (first, second, third):
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_background_packings_made_waits_for_the_packings_asked(monkeypatch):
    """conv.background_packings_made returns once the packing thread has made what was asked
    before it (False while a packing is held past its timeout)."""
    release = threading.Event()
    packed, x, want, calls = held_panels(monkeypatch, release)
    try:
        packed.prepare(1, (7, 7))
        run_7x7(packed, x)                          # asks for the packing (held)
        assert not conv_module.background_packings_made(timeout=0.05)
        threading.Timer(0.1, release.set).start()
        assert conv_module.background_packings_made(timeout=30)
        assert packed.has_packed("gemm_transposed")
    finally:
        release.set()
    np.testing.assert_allclose(run_7x7(packed, x), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]


def test_profile_times_what_runs_once_background_packings_are_made(monkeypatch, tmp_path):
    """A graph whose sizes come at run time: the profile's warm-up pass asks for the large
    panels (as a forward would, when it ends) and the timed passes run the product they
    are for, as later forwards do, not the upright one that serves until they are made."""
    monkeypatch.setattr(algorithms, "PACKED_IN_FORWARD", 0)
    c_in, c_out = 48, 2 * COLUMNS
    shape = f"(?,{c_in},?,?)f32"
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((c_out, c_in, 5, 5), dtype=np.float32) / 20
    param, binary = write_model(
        tmp_path, f"pnnx.Input in0 0 1 x #x={shape}",
        f"nn.Conv2d conv 1 1 x y bias=False dilation=(1,1) groups=1 in_channels={c_in} "
        f"kernel_size=(5,5) out_channels={c_out} padding=(2,2) padding_mode=zeros "
        f"stride=(1,1) @weight=({c_out},{c_in},5,5)f32 #x={shape} #y=(?,{c_out},?,?)f32",
        f"pnnx.Output out0 1 0 y #y=(?,{c_out},?,?)f32", weights={"conv.weight": weight})
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)
    if workers.team_for(2) is None:             # the packing is asked when the team is back
        pytest.skip("no team of helper threads here (numpy's OpenBLAS not found)")
    graph = RuntimeGraph(str(param), str(binary))
    graph.build()
    graph.set_num_threads(2)
    x = rng.standard_normal((1, c_in, 7, 7), dtype=np.float32)
    packed = graph.operators[1].layer.packed
    assert packed.algorithm(1, (7, 7)) == "gemm_transposed"
    assert not packed.has_packed("gemm_transposed")
    calls = []
    transposed = algorithms.gemm_transposed_conv2d
    monkeypatch.setattr(algorithms, "gemm_transposed_conv2d", lambda *args: (
        calls.append(1) if args[0].shape == x.shape else None, transposed(*args))[1])
    graph.profile(x, repeat=2, warmup=1)
    assert packed.has_packed("gemm_transposed") and len(calls) == 2   # both timed passes


def test_large_panels_asked_in_a_shared_forward_are_packed_after_it(monkeypatch):
    """Asked during a forward whose kernels a team of helper threads shares, the background
    packing starts only once the forward gives its team back (team.after_sharing), not
    beside its later layers; once packed, the next call runs transposed."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)
    packed, x, want, calls = held_panels(monkeypatch)
    asked: list[str] = []
    packing = packed.packing
    monkeypatch.setattr(packed, "packing", lambda name: (asked.append(name), packing(name))[1])
    with workers.sharing(2) as team:
        if team is None:
            pytest.skip("no team of helper threads here (numpy's OpenBLAS not found)")
        first = run_7x7(packed, x)                  # upright, the packing queued
        assert not asked                            # ... not asked for in the forward
    assert asked == ["gemm_transposed"]             # asked once the team is given back
    packed.packing("gemm_transposed").result(timeout=30)
    second = run_7x7(packed, x)
    assert calls == [1] and packed.has_packed("gemm_transposed")
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-5)


def test_large_transposed_panels_are_packed_at_build(monkeypatch):
    """At build (``layers.base.at_build``: shapes known before any forward) the same panels
    are packed at once, and the first call runs the transposed product."""
    packed, x, want, calls = held_panels(monkeypatch)
    with at_build():
        packed.prepare(1, (7, 7))
    assert packed.has_packed("gemm_transposed")
    np.testing.assert_allclose(run_7x7(packed, x), want, rtol=1e-5, atol=1e-5)
    assert calls == [1]


def test_panels_that_cannot_be_packed_leave_the_upright_product(monkeypatch, caplog):
    """A packing that fails in the background (no memory) is said once, not again for
    another size; the upright product goes on giving the right answer."""
    packed, x, want, calls = held_panels(monkeypatch, fail=True)
    np.testing.assert_allclose(run_7x7(packed, x), want, rtol=1e-5, atol=1e-5)
    wait([packed.packing("gemm_transposed")], timeout=30)          # failed, and said by
    deadline = time.monotonic() + 30                                # its done callback
    while "no room for the panels" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(2):
        np.testing.assert_allclose(run_7x7(packed, x), want, rtol=1e-5, atol=1e-5)
    for _ in range(2):                                              # another size
        packed.run(x[:, :, :6, :6], (1, 1, 1, 1), (6, 6), IDENTITY)
    assert not calls and not packed.has_packed("gemm_transposed")
    assert caplog.text.count("no room for the panels") == 1


def test_a_large_f2_packing_is_made_in_the_background(monkeypatch):
    """F(2x2) products of more than WINOGRAD_F2_LARGE bytes (here any), at a size first met
    in a forward: not packed when the size is planned; the calls run im2col's upright
    product until a background thread has packed them (here held), alone (a team it took
    would be every core's and keep the next forward from its helpers), then F(2x2). At
    build they are packed at once."""
    from layers.fast import winograd_f2

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)   # a team to take, if it would
    monkeypatch.delenv("PNNX_INFER_HELPERS", raising=False)
    if workers.team_for(None) is None:
        pytest.skip("no team of helper threads here (numpy's OpenBLAS not found)")
    monkeypatch.setattr(algorithms, "WINOGRAD_F2_LARGE", 0)
    entry = algorithms.BY_NAME["winograd_f2"]
    release = threading.Event()

    def held_pack(conv):
        assert release.wait(30)
        return entry.pack(conv)
    monkeypatch.setitem(algorithms.BY_NAME, "winograd_f2", entry._replace(pack=held_pack))
    calls = []
    run_winograd = winograd_f2.run_winograd
    monkeypatch.setattr(winograd_f2, "run_winograd", lambda *args: (   # (not ``warm``'s)
        calls.append(1) if args[3].shape[1] == c_in else None, run_winograd(*args))[1])
    c_in = WINOGRAD_MAX_CHANNELS + 4                 # too many for F(4x4)
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((8, c_in, 3, 3), dtype=np.float32) / 40
    x = rng.standard_normal((1, c_in, 16, 16), dtype=np.float32)
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight),
                                      padding=1).numpy()
    packed = PackedConv2d(weight, None, (1, 1), (1, 1), 1)
    assert packed.algorithm(1, (16, 16)) == "winograd_f2"
    teams = []                                       # (thread, team it was given)
    join = workers.join

    def spied_join(num_threads):
        given = join(num_threads)
        teams.append((threading.current_thread().name, given[0]))
        return given
    monkeypatch.setattr(workers, "join", spied_join)
    try:
        packed.prepare(1, (16, 16))                  # planned in a forward: not packed
        assert not packed.has_packed("winograd_f2")
        first = packed.run(x, (1, 1, 1, 1), (16, 16), IDENTITY)
        second = packed.run(x, (1, 1, 1, 1), (16, 16), IDENTITY)
        assert not calls and not packed.packing("winograd_f2").done()
    finally:
        release.set()
    packed.packing("winograd_f2").result(timeout=30)
    packer = [team for name, team in teams if name.startswith("pnnx-infer-pack")]
    assert packer == [None]                          # it packed alone: no team taken
    third = packed.run(x, (1, 1, 1, 1), (16, 16), IDENTITY)
    assert calls == [1] and packed.has_packed("winograd_f2")
    for y in (first, second, third):
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    built = PackedConv2d(weight, None, (1, 1), (1, 1), 1)
    with at_build():
        built.prepare(1, (16, 16))
    assert built.has_packed("winograd_f2")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this system")
def test_a_forked_child_packs_again_what_the_parents_thread_had_not(monkeypatch):
    """A child forked while the parent's packing thread is busy has no such thread: it asks
    again for the panels the parent had not packed, and its next call does not hang."""
    release = threading.Event()
    unheld = algorithms.BY_NAME["gemm_transposed"]
    packed, x, want, calls = held_panels(monkeypatch, release)
    try:
        first = run_7x7(packed, x)                  # the parent's packing is held
        child = os.fork()
        if child == 0:                              # the child: exit 0 if it works
            ok = False
            try:
                algorithms.BY_NAME["gemm_transposed"] = unheld   # (the Event is the parent's)
                second = run_7x7(packed, x)                      # asks again, goes on
                packed.packing("gemm_transposed").result(timeout=30)
                third = run_7x7(packed, x)
                ok = packed.has_packed("gemm_transposed") and all(
                    np.allclose(y, want, rtol=1e-5, atol=1e-5) for y in (second, third))
            finally:
                os._exit(0 if ok else 1)
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child hung on a packing of the parent's thread")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_7x7(packed, x), want, rtol=1e-5, atol=1e-5)


def test_every_algorithm_is_declared_once_with_every_part():
    names = [a.name for a in algorithms.ALGORITHMS]
    assert len(set(names)) == len(names) and names[-1] == "gemm"
    assert algorithms.ALGORITHMS[-1].pays is None                  # the fallback always runs
    for algorithm in algorithms.ALGORITHMS:
        assert callable(algorithm.fits) and callable(algorithm.pack)
        assert callable(algorithm.make_call) and callable(algorithm.warm)


def test_job_fields_stay_inside_the_record():
    int_slots = [v for k, v in vars(jobs).items()
                 if k.isupper() and isinstance(v, int) and k.startswith(
                     ("DW_", "EP_", "GEMM_", "PW_", "IC_", "SP_", "WI_", "WO_"))]
    assert int_slots and all(0 <= v < max(jobs.RECORD_SIZE, len(jobs.ARRAYS)) for v in int_slots)
    assert jobs.ARRAYS[-1] + 5 <= jobs.INTS                 # address + 4 sizes before the ints
    with pytest.raises(ValueError):
        jobs.int_fields(jobs.RECORD_SIZE - jobs.INTS + 1)
    with pytest.raises(ValueError):
        jobs.array_fields(len(jobs.ARRAYS) + 1)


def test_every_module_that_declares_kernels_is_imported_by_the_binding():
    """binding.import_kernel_modules lists the kernel modules by hand: a new one must join."""
    code = ("import sys; from layers.fast import binding; binding.import_kernel_modules(); "
            "print(sorted(set(binding.kernel_module_names()) - "
            "{m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('layers.fast.')}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_kernel_layout_copies_only_what_the_kernels_cannot_take():
    """float32, C-contiguous and aligned arrays pass as they are (read-only ones too when the
    kernel only reads them); anything else becomes such a copy, with the same values."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert kernel_layout(x) is x
    read_only = x.view()
    read_only.flags.writeable = False
    assert kernel_layout(read_only, writeable=False) is read_only
    copied = kernel_layout(read_only)
    assert copied is not read_only and copied.flags.writeable
    for other in (x.astype(np.float64), x.transpose(2, 1, 0), read_only[:, :, ::2]):
        made = kernel_layout(other, writeable=False)
        assert made.dtype == np.float32 and made.flags.c_contiguous and made.flags.aligned
        np.testing.assert_array_equal(made, other.astype(np.float32))
