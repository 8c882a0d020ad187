"""Bad .pnnx.bin files: each is one BinFileError naming the file and the entry (and, through
the graph, the operator whose weight it is), never a zipfile / struct / numpy error."""

from __future__ import annotations

import zipfile
import zlib

import numpy as np
import pytest

import parser.bin
from infer import BinFileError, RuntimeGraph
from support import conv_line, conv_weights, expect_error, write_model

LINES = ("pnnx.Input in0 0 1 0 #0=(1,3,6,6)f32", conv_line(), "pnnx.Output out0 1 0 1")


@pytest.fixture
def model(tmp_path):
    """(param, bin) of a one-convolution model with good weights."""
    return write_model(tmp_path, *LINES, weights=conv_weights())


def expect_bin_error(param, binary, *words) -> BinFileError:
    error = expect_error(BinFileError, RuntimeGraph(param, binary).build, str(binary), *words)
    assert error.path == str(binary)
    return error


def test_the_good_file_builds_and_runs(model):
    import torch
    weights = conv_weights()
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6), dtype=np.float32)
    (y,) = RuntimeGraph(*model).build().forward(x)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x),
                                          torch.from_numpy(weights["conv.weight"]),
                                          torch.from_numpy(weights["conv.bias"]))
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-4, atol=1e-5)


def test_not_a_zip(model):
    param, binary = model
    binary.write_text("these are not weights\n" * 20)
    expect_bin_error(param, binary, "not a zip archive")


def test_param_given_as_the_bin_file(model):
    param, _ = model
    expect_bin_error(param, param, "not a zip archive")


@pytest.mark.parametrize("keep", [0.9, 0.5, 0.1])
def test_truncated_zip(model, keep):
    param, binary = model
    data = binary.read_bytes()
    binary.write_bytes(data[:int(len(data) * keep)])
    expect_bin_error(param, binary, "truncated")


def test_missing_entry(model):
    param, binary = model
    weights = conv_weights()
    del weights["conv.bias"]
    write_model(binary.parent, *LINES, weights=weights)
    error = expect_bin_error(param, binary, "[conv.bias]", "no such entry", "conv.weight")
    assert error.entry == "conv.bias" and error.operator == "nn.Conv2d conv"


@pytest.mark.parametrize("stored", [np.zeros((4, 3, 3), np.float32),      # too few bytes
                                    np.zeros((4, 3, 3, 3), np.float64)])  # too many
def test_entry_size_disagrees_with_shape_times_dtype(model, stored):
    param, binary = model
    write_model(binary.parent, *LINES, weights={**conv_weights(), "conv.weight": stored})
    error = expect_bin_error(param, binary, "[conv.weight]", f"holds {stored.nbytes} bytes",
                             "(4, 3, 3, 3) x f32 needs 432")
    assert error.operator == "nn.Conv2d conv"


def test_compressed_entry(model):
    param, binary = model
    with zipfile.ZipFile(binary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for entry, array in conv_weights().items():
            archive.writestr(entry, array.tobytes())
    expect_bin_error(param, binary, "compressed", "[conv.bias]")


def test_empty_file(model):
    param, binary = model
    binary.write_bytes(b"")
    expect_bin_error(param, binary, "empty file")


def test_missing_file(model):
    param, binary = model
    binary.unlink()
    expect_bin_error(param, binary, "cannot read")


def test_a_directory_instead_of_a_file(model, tmp_path):
    param, _ = model
    expect_bin_error(param, tmp_path, "cannot read")


@pytest.mark.parametrize("crc", ["zlib", "zlib-ng"])
def test_flipped_weight_byte_is_caught_by_the_crc(model, monkeypatch, crc):
    """A damaged download that keeps the zip structure: the weights would be silently wrong;
    the entry's CRC-32 catches it, whichever library computes it (zlib-ng from
    FAST_CRC_FROM bytes)."""
    if crc == "zlib-ng":
        monkeypatch.setattr(parser.bin, "FAST_CRC_FROM", 0)
    param, binary = model
    data = bytearray(binary.read_bytes())
    at = data.index(conv_weights()["conv.weight"].tobytes()) + 100
    data[at] ^= 0x10
    binary.write_bytes(bytes(data))
    expect_bin_error(param, binary, "[conv.weight]", "CRC-32")


def test_both_crc_functions_agree():
    """Small files' entries are checked by zlib, large files' by zlib-ng: the same CRC-32 on
    entries starting anywhere in the file and of any length (vector code has head and tail
    cases)."""
    data = memoryview(np.random.default_rng(0).bytes(100_000))
    assert parser.bin.crc32_for(0) is zlib.crc32
    fast = parser.bin.crc32_for(parser.bin.FAST_CRC_FROM)
    assert fast is not zlib.crc32
    for start in (0, 1, 3, 7, 64):
        for length in (0, 1, 15, 16, 17, 63, 64, 65, 4099, 90_001):
            part = data[start:start + length]
            assert fast(part) == zlib.crc32(part), (start, length)


def test_shifted_local_header_is_caught(model):
    """A local header whose name length is damaged would shift the data by some bytes."""
    param, binary = model
    data = bytearray(binary.read_bytes())
    data[26] += 1                           # first entry's file name length
    binary.write_bytes(bytes(data))
    expect_bin_error(param, binary, "local header")


def test_error_closes_the_file(model):
    """A refused archive leaves no memory map open (the file can be replaced at once)."""
    param, binary = model
    data = binary.read_bytes()
    binary.write_bytes(data[:len(data) // 2])
    expect_bin_error(param, binary, "truncated")
    binary.write_bytes(data)
    assert RuntimeGraph(param, binary).build().forward(np.zeros((1, 3, 6, 6), np.float32))


def test_an_entry_stored_twice(model):
    """zipfile keeps the last of two same-named entries: the weights would silently be the
    second copy's."""
    import warnings

    param, binary = model
    with warnings.catch_warnings(), zipfile.ZipFile(binary, "a") as archive:
        warnings.simplefilter("ignore")                    # zipfile: "Duplicate name"
        archive.writestr("conv.weight", np.zeros((4, 3, 3, 3), np.float32).tobytes())
    expect_bin_error(param, binary, "[conv.weight]", "twice")


def test_an_encrypted_entry(model):
    param, binary = model
    data = bytearray(binary.read_bytes())
    central = data.index(b"PK\x01\x02")                    # first central directory record
    data[central + 8] |= 0x1                                # general purpose flag: encrypted
    binary.write_bytes(bytes(data))
    expect_bin_error(param, binary, "encrypted")
