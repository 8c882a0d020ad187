"""parser.bin: the pnnx weight archive, on hand-made zips (classic and ZIP64); a real export:
test_bin_export.py. Needs no torch."""

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from parser.bin import DTYPES, PnnxBin, release_pages, stored_itemsize
from parser.errors import BinFileError
from support import mappings

RNG = np.random.default_rng(0)
PLAIN_DTYPES = [name for name in DTYPES if name not in ("bf16", "c32")]


def write_zip(path, entries: dict[str, bytes], zip64: bool = False,
              compression: int = zipfile.ZIP_STORED):
    """A zip with ``entries`` (name -> bytes), as pnnx writes it (stored; ZIP64 on request)."""
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            with archive.open(name, "w", force_zip64=zip64) as entry:
                entry.write(data)
    return path


def random_array(dtype: np.dtype, shape=(2, 3, 4)) -> np.ndarray:
    """Random values of any numpy dtype (bool, ints, floats, complex)."""
    values = RNG.standard_normal(shape) * 50
    if dtype.kind == "c":
        values = values + 1j * RNG.standard_normal(shape)
    return values.astype(dtype) if dtype.kind != "b" else values > 0


def local_data_offset(path, name: str) -> int:
    """Where the bytes of entry ``name`` start, from its local header (for the alignment test)."""
    with zipfile.ZipFile(path) as archive:
        header = archive.getinfo(name).header_offset
    with open(path, "rb") as file:
        file.seek(header + 26)
        name_length, extra_length = struct.unpack("<HH", file.read(4))
    return header + 30 + name_length + extra_length


# ----- reading ----------------------------------------------------------------------------------

@pytest.mark.parametrize("zip64", [False, True], ids=["classic", "zip64"])
@pytest.mark.parametrize("dtype", PLAIN_DTYPES)
@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_every_dtype_round_trips(tmp_path, in_memory, dtype, zip64):
    array = random_array(DTYPES[dtype])
    path = write_zip(tmp_path / "w.pnnx.bin", {"conv.weight": array.tobytes()}, zip64=zip64)
    with PnnxBin(path, in_memory=in_memory) as weights:
        read = weights.read("conv.weight", array.shape, dtype)
        assert read.dtype == DTYPES[dtype] and read.shape == array.shape
        np.testing.assert_array_equal(read, array)
        assert not read.flags.writeable and not read.flags.owndata  # a view over the mapping


def test_zip64_local_header_has_extra_field(tmp_path):
    data = np.arange(5, dtype=np.float32).tobytes()
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.data": data}, zip64=True)
    with zipfile.ZipFile(path) as archive:
        header = archive.getinfo("a.data").header_offset
    assert local_data_offset(path, "a.data") > header + 30 + len("a.data")  # extra is skipped
    with PnnxBin(path) as weights:
        np.testing.assert_array_equal(weights.read("a.data", (5,), "f32"), np.arange(5))


def test_bfloat16_is_widened_to_float32(tmp_path):
    """bfloat16 is the upper half of a float32: 16 bits each, widened exactly."""
    bits = (RNG.standard_normal((3, 4)).astype(np.float32).view(np.uint32) >> 16)
    raw = bits.astype(np.uint16).tobytes()
    path = write_zip(tmp_path / "w.pnnx.bin", {"fc.weight": raw})
    with PnnxBin(path) as weights:
        read = weights.read("fc.weight", (3, 4), "bf16")
    assert read.dtype == np.float32
    np.testing.assert_array_equal(read, (bits << 16).astype(np.uint32).view(np.float32))


def test_complex32_is_widened_to_complex64(tmp_path):
    pairs = RNG.standard_normal((3, 2)).astype(np.float16)  # (real, imaginary) per element
    path = write_zip(tmp_path / "w.pnnx.bin", {"c.data": pairs.tobytes()})
    with PnnxBin(path) as weights:
        read = weights.read("c.data", (3,), "c32")
    assert read.dtype == np.complex64
    np.testing.assert_array_equal(read, pairs[:, 0].astype(np.float32) + 1j * pairs[:, 1])


def test_stored_itemsizes():
    assert stored_itemsize("bf16") == 2 and stored_itemsize("c32") == 4
    assert all(stored_itemsize(name) == DTYPES[name].itemsize for name in PLAIN_DTYPES)


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_scalar_and_empty_attributes(tmp_path, in_memory):
    path = write_zip(tmp_path / "w.pnnx.bin", {"s.data": np.float32(2.5).tobytes(),
                                               "e.data": b""})
    with PnnxBin(path, in_memory=in_memory) as weights:
        scalar = weights.read("s.data", (), "f32")
        empty = weights.read("e.data", (0, 3), "f32")
    assert scalar.shape == () and scalar == 2.5
    assert empty.shape == (0, 3)


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_unaligned_entries_read_correctly(tmp_path, in_memory):
    """pnnx packs entries end to end: a view of the map may be unaligned; read into memory,
    every entry starts on a 64-byte boundary."""
    array = np.arange(6, dtype=np.float64)
    name = "odd.name"  # 8 + 30 = 38 bytes of header: the data starts 2 bytes past an 8-multiple
    path = write_zip(tmp_path / "w.pnnx.bin", {"first.x": b"abc", name: array.tobytes(),
                                               "last.y": array[:5].tobytes()})
    assert local_data_offset(path, name) % array.itemsize != 0
    with PnnxBin(path, in_memory=in_memory) as weights:
        read = weights.read(name, (2, 3), "f64")
        last = weights.read("last.y", (5,), "f64")
    assert read.flags.aligned == in_memory
    if in_memory:
        assert read.ctypes.data % 64 == 0 and last.ctypes.data % 64 == 0
    np.testing.assert_array_equal(read, array.reshape(2, 3))
    np.testing.assert_array_equal(last, array[:5])


@pytest.mark.parametrize("how", ["mapped in", "misaligned base"])
def test_entries_read_into_memory_start_on_64_bytes(tmp_path, monkeypatch, how):
    """The buffer's first entry is moved to a 64-byte boundary whatever the allocator gives:
    pages mapped in at once (as for large files), or an array that starts 1 byte off."""
    import parser.bin
    import parser.pages

    if how == "mapped in":
        monkeypatch.setattr(parser.pages, "MAPPED_FROM", 0)
    else:
        monkeypatch.setattr(parser.bin, "fresh_pages", lambda n: np.empty(n + 1, np.uint8)[1:])
    arrays = {f"e{i}.w": random_array(np.dtype("<f4"), (i + 1, 3)) for i in range(4)}
    path = write_zip(tmp_path / "w.pnnx.bin", {k: a.tobytes() for k, a in arrays.items()})
    with PnnxBin(path, in_memory=True) as weights:
        for key, array in arrays.items():
            read = weights.read(key, array.shape, "f32")
            assert read.ctypes.data % 64 == 0
            np.testing.assert_array_equal(read, array)


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_entries_whose_bytes_overlap_are_refused(tmp_path, in_memory):
    """A directory that gives the first entry a size reaching over the second entry's header
    and bytes: a crafted archive (read into memory, every such entry would be copied whole)."""
    first, second = bytes(64), bytes(range(48))
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.w": first, "b.w": second})
    data = bytearray(path.read_bytes())
    directory = data.find(b"PK\x01\x02")                  # the first entry's record: a.w
    reach = len(first) + 30 + len("b.w") + len(second)      # up to the end of b.w's bytes
    struct.pack_into("<II", data, directory + 20, reach, reach)
    path.write_bytes(bytes(data))
    with pytest.raises(BinFileError) as info:
        PnnxBin(path, in_memory=in_memory)
    check_error(info, path, entry="b.w", words="overlap")


@pytest.mark.parametrize("change", ["cut short", "grown"])
def test_a_file_changed_while_read_into_memory_is_refused(tmp_path, monkeypatch, change):
    """Entries are read after the archive is indexed: a file cut short in between leaves an
    entry short, one that grows changes its size; either is a BinFileError, not a weight of
    the wrong bytes."""
    import parser.bin

    path = write_zip(tmp_path / "w.pnnx.bin", {"a.w": bytes(4000), "b.w": bytes(4000)})
    size = path.stat().st_size
    read_entries = parser.bin._read_entries

    def changing(file, located, name):
        with open(path, "r+b") as other:
            if change == "cut short":
                other.truncate(size // 2)
            else:
                other.seek(0, 2)
                other.write(b"more")
        return read_entries(file, located, name)

    monkeypatch.setattr(parser.bin, "_read_entries", changing)
    with pytest.raises(BinFileError) as info:
        PnnxBin(path, in_memory=True)
    check_error(info, path, entry="b.w" if change == "cut short" else None,
                words="changed size while being read")


def test_released_entries_still_read_their_bytes(tmp_path):
    """release() drops the process's pages of an entry (after the graph copied it); views of
    it stay valid and read the same bytes, brought back from the file."""
    big = np.arange(3 * 4096, dtype=np.float32)             # spans whole pages
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.weight": big.tobytes(), "b.bias": b"\0" * 8})
    with PnnxBin(path) as weights:
        view = weights.read("a.weight", big.shape, "f32")
        copy = np.array(view)
        weights.release("a.weight")
        weights.release("b.bias")                             # smaller than a page: nothing
        np.testing.assert_array_equal(view, big)
        np.testing.assert_array_equal(copy, big)
        with pytest.raises(BinFileError, match="no such entry"):
            weights.release("c.weight")


def _mapped_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (Linux's /proc/self/smaps)."""
    return sum(int(fields["Rss"].split()[0]) for _, _, name, fields in mappings()
               if name.endswith(str(path)))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's smaps")
def test_release_pages_drops_the_pages_of_a_view_in_hand(tmp_path):
    """release_pages(view): what a layer calls after repacking a weight. The mapped pages
    leave the resident set, the view still reads the same values; other arrays are ignored."""
    big = np.arange(64 * 1024, dtype=np.float32)              # 256 KiB: 64 pages
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.weight": big.tobytes()})
    with PnnxBin(path) as weights:
        view = weights.read("a.weight", (256, 256), "f32")
        assert float(view.sum()) == float(big.sum())          # every page read
        before = _mapped_kib(path)
        release_pages(view.reshape(-1, 4))                    # a reshaped view works too
        after = _mapped_kib(path)
        assert before >= 240 and after <= before - 240, (before, after)
        np.testing.assert_array_equal(view.reshape(-1), big)  # read back from the file
        release_pages(np.array(view))                         # not a view of a map: no-op
        release_pages(view[:, ::2])                           # not contiguous: left alone



def test_release_pages_leaves_anonymous_memory_alone():
    """An arena buffer (parser/pages.py) is a memory map too, but of no file: dropping its
    pages would zero its values, so release_pages must not touch it."""
    from parser.pages import HUGE_PAGE_ADVICE, fresh_pages

    buffer = fresh_pages(HUGE_PAGE_ADVICE).view(np.float32)
    buffer[:] = 1.0
    release_pages(buffer)
    release_pages(buffer[: buffer.size // 2].reshape(-1, 16))
    assert np.all(buffer == 1.0)

def test_entries_and_membership(tmp_path):
    names = ["features.0.weight", "features.0.bias", "fc.weight"]
    path = write_zip(tmp_path / "w.pnnx.bin", {name: b"\0" * 4 for name in names})
    with PnnxBin(path) as weights:
        assert weights.entries() == names
        assert "fc.weight" in weights and "fc.bias" not in weights
        assert len(weights) == 3


def test_arrays_outlive_close(tmp_path):
    array = np.arange(4, dtype=np.int64)
    path = write_zip(tmp_path / "w.pnnx.bin", {"i.data": array.tobytes()})
    weights = PnnxBin(path)
    read = weights.read("i.data", (4,), "i64")
    weights.close()
    np.testing.assert_array_equal(read, array)
    with pytest.raises(BinFileError, match="closed"):
        weights.read("i.data", (4,), "i64")


# ----- errors -----------------------------------------------------------------------------------

def check_error(info, path, entry=None, words=""):
    """The error names the file (and the entry), and says what is wrong."""
    error = info.value
    assert error.path == str(path) and str(path) in str(error)
    assert error.entry == entry
    if entry is not None:
        assert f"[{entry}]" in str(error)
    assert words in str(error)


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_empty_file(tmp_path, in_memory):
    path = tmp_path / "empty.pnnx.bin"
    path.write_bytes(b"")
    with pytest.raises(BinFileError) as info:
        PnnxBin(path, in_memory=in_memory)
    check_error(info, path, words="empty file")


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_not_a_zip(tmp_path, in_memory):
    path = tmp_path / "model.pnnx.param"
    path.write_text("7767517\n0 0\n")
    with pytest.raises(BinFileError) as info:
        PnnxBin(path, in_memory=in_memory)
    check_error(info, path, words="not a zip")


@pytest.mark.parametrize("zip64", [False, True], ids=["classic", "zip64"])
@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_truncated_zip(tmp_path, in_memory, zip64):
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.data": bytes(4000)}, zip64=zip64)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(BinFileError) as info:
        PnnxBin(path, in_memory=in_memory)
    check_error(info, path, words="truncated")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pnnx.bin"
    with pytest.raises(BinFileError) as info:
        PnnxBin(path)
    check_error(info, path, words="cannot read")


def test_missing_entry_lists_close_names(tmp_path):
    path = write_zip(tmp_path / "w.pnnx.bin", {"conv1.weight": b"", "conv1.bias": b"",
                                               "fc.weight": b""})
    with PnnxBin(path) as weights, pytest.raises(BinFileError) as info:
        weights.read("conv1.weigth", (0,), "f32")
    check_error(info, path, entry="conv1.weigth", words="no such entry")
    assert "conv1.weight" in str(info.value)


def test_missing_entry_lists_some_names_when_none_is_close(tmp_path):
    path = write_zip(tmp_path / "w.pnnx.bin", {"conv1.weight": b""})
    with PnnxBin(path) as weights, pytest.raises(BinFileError) as info:
        weights.read("zzz", (0,), "f32")
    check_error(info, path, entry="zzz", words="conv1.weight")


@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_compressed_entry(tmp_path, in_memory):
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.data": bytes(400)},
                     compression=zipfile.ZIP_DEFLATED)
    with PnnxBin(path, in_memory=in_memory) as weights, pytest.raises(BinFileError) as info:
        weights.read("a.data", (100,), "f32")
    check_error(info, path, entry="a.data", words="compressed")


@pytest.mark.parametrize("shape, dtype", [((3, 3), "f32"), ((2,), "f32"), ((4,), "f64")])
@pytest.mark.parametrize("in_memory", [False, True], ids=["map", "memory"])
def test_size_mismatch(tmp_path, in_memory, shape, dtype):
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.data": bytes(16)})
    with PnnxBin(path, in_memory=in_memory) as weights, pytest.raises(BinFileError) as info:
        weights.read("a.data", shape, dtype)
    check_error(info, path, entry="a.data", words="holds 16 bytes")


def test_unknown_dtype(tmp_path):
    path = write_zip(tmp_path / "w.pnnx.bin", {"a.data": bytes(16)})
    with PnnxBin(path) as weights, pytest.raises(BinFileError) as info:
        weights.read("a.data", (4,), "float32")
    check_error(info, path, entry="a.data", words="unknown dtype")
