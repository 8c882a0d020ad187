"""The pnnx ``.pnnx.bin`` weight archive: a zip file whose entries are stored, never compressed.

Each attribute line of the param file, e.g. ``nn.Conv2d conv ... @weight=(8,3,3,3)f32``, has one
entry in the zip named ``"<op name>.<attr name>"`` (here ``conv.weight``) holding the raw
little-endian array bytes, C order, ``prod(shape) * itemsize`` of them. pnnx writes every entry
with a ZIP64 extra field (so archives over 4 GB work), which the standard ``zipfile`` module reads.

Layout of one entry, and how a zero-copy view finds its bytes::

    offset  size  field                    (the "local file header", signature PK\\x03\\x04)
    0       4     signature 0x04034b50
    ...     22    version, flags, method (0 = stored), time, crc32, sizes
    26      2     n = file name length
    28      2     m = extra field length   (pnnx: 32 bytes of ZIP64 sizes)
    30      n     file name                 e.g. "conv.weight"
    30+n    m     extra field
    30+n+m  size  the array bytes           <- np.frombuffer(mmap, offset=30+n+m)

The central directory at the end of the file (read with ``zipfile``) lists every entry with the
offset of its local header, its size and the CRC-32 of its bytes. ``PnnxBin`` memory-maps the
file read-only and hands out numpy views straight over the mapping: nothing is copied, and the
OS pages weights in as they are used. ``PnnxBin(path, in_memory=True)`` reads every entry into
the process's memory instead (one buffer, each entry from a multiple of ALIGNMENT bytes, views
over it): the file may then change or vanish without effect.

A memory map follows the file. If another program truncates it (``cp other.bin model.pnnx.bin``
writes over it in place), reading a mapped page past the new end kills the process with SIGBUS;
if it rewrites the bytes, views change under the arrays' users. ``changed()`` tells whether the
file's identity, size or modification time differ from when it was opened (cheap: one stat),
for callers that keep a map open for long (RuntimeGraph does, with ``weights="map"``).

An entry name that appears twice and an encrypted entry are refused when the file is opened.
A damaged file never loads silently: an entry is checked before its first view is handed out
(the local header must name the same entry as the central directory, a stored entry's sizes
must agree, entries must not overlap, and its bytes must have the CRC-32 the directory
records), so a flipped byte, a cut-off download or a shifted header is a BinFileError.

Alignment: pnnx writes each entry where the previous one ended, so a view of a memory map may
begin at an address that is not a multiple of its itemsize (``arr.flags.aligned`` is False).
numpy reads unaligned arrays correctly, only some operations are slower on them;
``np.require(arr, requirements="A")`` makes an aligned copy when a kernel needs one. Entries
read into memory are aligned.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import stat
import struct
import weakref
import zipfile
import zlib
from typing import Callable, NamedTuple

import numpy as np

from parser.errors import BinFileError, shorten
from parser.files import MiB
from parser.pages import fresh_pages
from parser.param import DTYPE_NAMES
from parser.suggest import close_matches

# Files from this size have their CRC-32s computed by zlib-ng (vector instructions, several
# times zlib's speed), below by zlib: importing zlib-ng costs more than it saves on a few MiB.
FAST_CRC_FROM = 8 * MiB


def crc32_for(file_size: int) -> Callable[[memoryview], int]:
    """The CRC-32 function (zlib's signature) to check the entries of a file of this size."""
    if file_size >= FAST_CRC_FROM:
        try:
            from zlib_ng.zlib_ng import crc32
            return crc32
        except ImportError:           # pragma: no cover - zlib-ng is a dependency
            pass
    return zlib.crc32


# pnnx dtype name -> dtype of the arrays PnnxBin.read returns.
# Two pnnx dtypes have no numpy dtype and are widened by a copy (so they are not zero-copy):
#   bf16  stored as uint16 (the top half of a float32)  -> float32
#   c32   stored as pairs of float16 (real, imaginary)  -> complex64
DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"), "f64": np.dtype("<f8"), "f16": np.dtype("<f2"),
    "bf16": np.dtype("<f4"),
    "i64": np.dtype("<i8"), "i32": np.dtype("<i4"), "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"), "u8": np.dtype("u1"), "bool": np.dtype("?"),
    "c64": np.dtype("<c8"), "c128": np.dtype("<c16"), "c32": np.dtype("<c8"),
}
assert set(DTYPES) == set(DTYPE_NAMES), "DTYPES must cover exactly the pnnx dtype names"

# How the widened dtypes are stored in the file: (numpy dtype, values stored per element).
_STORED: dict[str, tuple[np.dtype, int]] = {"bf16": (np.dtype("<u2"), 1),
                                             "c32": (np.dtype("<f2"), 2)}

# What zipfile raises on a damaged archive: besides BadZipFile, a garbled version field is a
# NotImplementedError, a garbled name a UnicodeDecodeError (a ValueError), a cut-off record a
# struct.error or EOFError, a garbled offset an OSError from seek.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError,
               NotImplementedError, struct.error, OverflowError, OSError)
_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
ALIGNMENT = 64        # bytes: where each entry read into memory starts (a cache line)


def stored_itemsize(dtype: str) -> int:
    """Bytes one element of pnnx dtype ``dtype`` takes in the bin file (bf16: 2, c32: 4)."""
    stored, per_element = _STORED.get(dtype, (DTYPES[dtype], 1))
    return stored.itemsize * per_element


def _widen_bf16(raw: np.ndarray) -> np.ndarray:
    """bfloat16 is the top 16 bits of a float32: shift them back into place."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _widen_c32(raw: np.ndarray) -> np.ndarray:
    """complex32 is (real, imaginary) float16 pairs: widen both, then pair them as complex64."""
    return raw.astype(np.float32).view(np.complex64)


_WIDEN = {"bf16": _widen_bf16, "c32": _widen_c32}


class _Entry(NamedTuple):
    """Where one entry's bytes are: ``size`` bytes from ``offset``; ``method`` 0 means stored;
    ``crc`` is the CRC-32 the central directory records for them."""

    offset: int
    size: int
    method: int
    crc: int


def _encoded_name(info: zipfile.ZipInfo) -> bytes:
    """The entry name as the local header stores it (UTF-8 if flag bit 11 is set, else cp437)."""
    return info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")


class PnnxBin:
    """A read-only .pnnx.bin, memory-mapped (or, ``in_memory``, read into one buffer);
    ``read`` returns zero-copy numpy views of the map (or of the buffer).

    Use it as a context manager, or call ``close()``. Arrays already returned stay valid after
    ``close()``: the mapping is released when the last of them is garbage-collected.
    """

    def __init__(self, path: str | os.PathLike[str], in_memory: bool = False):
        self.path = str(path)
        self.in_memory = in_memory
        # the entries' bytes: a read-only memory map of the file, or (in_memory) a read-only
        # uint8 array holding each entry at an ALIGNMENT boundary (``_read_entries``)
        self._mm: mmap.mmap | np.ndarray | None = None
        self._verified: set[str] = set()           # entries whose CRC-32 has been checked
        try:
            # opened without blocking: a FIFO at the path would otherwise wait for a writer
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as file:
                info = os.fstat(file.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise BinFileError("not a regular file (a pipe, device or folder)",
                                       path=self.path)
                if info.st_size == 0:
                    raise BinFileError("empty file (not a pnnx bin zip archive)",
                                       path=self.path)
                self._identity = _identity(info)
                self._crc32 = crc32_for(info.st_size)
                if in_memory:
                    # indexed and read from the file opened (the path could name another
                    # file by now)
                    located = self._index(_FileBytes(file, info.st_size), file)
                    self._mm, self._entries = _read_entries(file, located, self.path)
                    if os.fstat(file.fileno()).st_size != info.st_size:
                        raise BinFileError("the file changed size while being read",
                                           path=self.path)
                else:
                    self._mm = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                    _FILE_MAPS.add(self._mm)
        except OSError as exc:
            raise BinFileError(f"cannot read the file: {exc.strerror or exc}",
                               path=self.path) from None
        if not in_memory:
            try:
                assert isinstance(self._mm, mmap.mmap)
                self._entries = self._index(self._mm, self._mm)
            except BinFileError:
                self.close()
                raise

    # ----- indexing ---------------------------------------------------------------------------
    def _index(self, whole: "_FileBytes | mmap.mmap",
               archive_file: "io.BufferedReader | mmap.mmap") -> dict[str, _Entry]:
        """Read the central directory with zipfile (from ``archive_file``), then each local
        header (``whole[a:b]``: the file's bytes a to b) for the data offset."""
        try:
            with zipfile.ZipFile(archive_file) as archive:  # type: ignore[arg-type]
                infos = archive.infolist()
        except _ZIP_ERRORS as exc:
            if whole[:4] == _LOCAL_HEADER:
                raise BinFileError(f"truncated or damaged zip archive ({exc})",
                                   path=self.path) from None
            raise BinFileError("not a zip archive (a pnnx bin is a store-only zip)",
                               path=self.path) from None
        entries: dict[str, _Entry] = {}
        for info in infos:
            if info.filename in entries:        # zipfile would silently keep the last one
                raise BinFileError("the archive holds this entry twice (which copy is the "
                                   "weight?)", path=self.path, entry=info.filename)
            if info.flag_bits & 0x1:
                raise BinFileError("the entry is encrypted; pnnx writes plain stored entries",
                                   path=self.path, entry=info.filename)
            entries[info.filename] = self._locate(info, whole)
        self._refuse_overlaps(entries)
        return entries

    def _refuse_overlaps(self, entries: dict[str, _Entry]) -> None:
        """pnnx writes each entry's bytes after the previous one's: two entries whose bytes
        overlap are a damaged or crafted archive (read into memory, each would be copied
        whole: a few headers could ask for many times the file's size)."""
        stored = sorted((entry.offset, entry.offset + entry.size, name)
                        for name, entry in entries.items()
                        if entry.method == zipfile.ZIP_STORED and entry.size)
        for (_, end, before), (start, _, name) in zip(stored, stored[1:]):
            if start < end:
                raise BinFileError(f"damaged zip archive: the entry's bytes overlap those of "
                                   f"{before!r}", path=self.path, entry=name)

    def _locate(self, info: zipfile.ZipInfo, whole: "_FileBytes | mmap.mmap") -> _Entry:
        """The entry's data offset: local header offset + 30 + name length + extra length."""
        header = info.header_offset
        size = len(whole)
        fixed = whole[header:header + _LOCAL_HEADER_SIZE] if header >= 0 else b""
        if len(fixed) < _LOCAL_HEADER_SIZE or fixed[:4] != _LOCAL_HEADER:
            raise BinFileError("damaged zip archive: no local file header where the central "
                               "directory points", path=self.path, entry=info.filename)
        name_length, extra_length = struct.unpack_from("<HH", fixed, 26)
        name = whole[header + _LOCAL_HEADER_SIZE:header + _LOCAL_HEADER_SIZE + name_length]
        if name != _encoded_name(info):
            raise BinFileError(f"damaged zip archive: the local header names {name!r}, the "
                               f"central directory this entry", path=self.path,
                               entry=info.filename)
        offset = header + _LOCAL_HEADER_SIZE + name_length + extra_length
        if offset + info.compress_size > size:
            raise BinFileError(f"truncated zip archive: the entry needs bytes up to "
                               f"{offset + info.compress_size}, the file has {size}",
                               path=self.path, entry=info.filename)
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise BinFileError(f"damaged zip archive: a stored entry of {info.file_size} bytes "
                               f"takes {info.compress_size}", path=self.path,
                               entry=info.filename)
        return _Entry(offset=offset, size=info.file_size, method=info.compress_type,
                      crc=info.CRC)

    # ----- public API -------------------------------------------------------------------------
    def entries(self) -> list[str]:
        """Every entry name, in archive order (``"<op name>.<attr name>"``)."""
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, key: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """The entry ``key`` as a read-only array of ``shape`` and pnnx ``dtype``.

        A zero-copy view over the mapped file or the buffer read into memory (except bf16 /
        c32, widened by a copy). The entry must hold exactly ``prod(shape) * itemsize`` bytes;
        ``shape`` () reads one scalar."""
        entry = self._entry(key)
        if dtype not in DTYPES:
            raise BinFileError(f"unknown dtype {dtype!r} (pnnx dtypes: {' '.join(DTYPES)})",
                               path=self.path, entry=key)
        shape = tuple(int(d) for d in shape)
        count = math.prod(shape)
        expected = count * stored_itemsize(dtype)
        if entry.size != expected:
            raise BinFileError(f"the entry holds {entry.size} bytes but shape {shape} x {dtype} "
                               f"needs {expected}", path=self.path, entry=key)
        stored, per_element = _STORED.get(dtype, (DTYPES[dtype], 1))
        raw = np.frombuffer(self._mapped, dtype=stored, count=count * per_element,
                            offset=entry.offset)
        if dtype in _WIDEN:
            raw = _WIDEN[dtype](raw)
        return raw.reshape(shape)

    def release(self, key: str) -> None:
        """Let the OS drop this process's copy of the entry's pages (whole pages inside the
        entry only): for an entry whose bytes were copied, so that they do not count twice in
        its memory. Views of the entry stay valid; reading one brings the pages back from the
        file. (Nothing to do for a file read into memory.)"""
        entry = self._entry(key)
        if isinstance(self._mm, mmap.mmap):
            _drop_pages(self._mm, entry.offset, entry.size)

    def changed(self) -> str | None:
        """Why the file on disk is no longer the one opened (another file now at the path, a
        new size or modification time), or None if it looks the same. A rewrite that keeps
        the size and the modification time is not seen."""
        try:
            now = _identity(os.stat(self.path))
        except OSError as exc:
            return f"it cannot be read any more ({exc.strerror or exc})"
        if now == self._identity:
            return None
        (dev, ino, size, _), (dev0, ino0, size0, _) = now, self._identity
        if (dev, ino) != (dev0, ino0):
            return "another file has replaced it"
        if size != size0:
            return f"its size changed from {size0:,} to {size:,} bytes"
        return "it was modified"

    @property
    def _mapped(self) -> mmap.mmap | np.ndarray:
        """The mapping, while the file is open (``_entry`` has refused a closed one already)."""
        if self._mm is None:
            raise BinFileError("the file is closed", path=self.path)
        return self._mm

    def _entry(self, key: str) -> _Entry:
        """The index record of ``key``; a missing or compressed entry is a BinFileError."""
        if self._mm is None:
            raise BinFileError("the file is closed", path=self.path, entry=key)
        entry = self._entries.get(key)
        if entry is None:
            raise BinFileError(f"no such entry{self._suggest(key)}", path=self.path, entry=key)
        if entry.method != zipfile.ZIP_STORED:
            raise BinFileError(f"the entry is compressed (zip method {entry.method}); pnnx "
                               f"writes stored entries only", path=self.path, entry=key)
        if key not in self._verified:
            with memoryview(self._mm) as view:  # type: ignore[arg-type]
                crc = self._crc32(view[entry.offset:entry.offset + entry.size])
            if crc != entry.crc:
                raise BinFileError(f"damaged entry: its bytes have CRC-32 {crc:08x}, the zip "
                                   f"directory records {entry.crc:08x}", path=self.path,
                                   entry=key)
            self._verified.add(key)
        return entry

    def _suggest(self, key: str) -> str:
        """'; close entries: a, b' for a missing key (or the first few entries if none is close)."""
        close = close_matches(key, self._entries, n=3, cutoff=0.5)
        if close:
            return f"; close entries: {', '.join(shorten(name, 80) for name in close)}"
        if self._entries:
            shown = list(self._entries)[:5]
            more = ", ..." if len(self._entries) > len(shown) else ""
            return f"; entries: {', '.join(shorten(name, 80) for name in shown)}{more}"
        return "; the archive is empty"

    # ----- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mapping, unless arrays still view it (then the last one releases it)."""
        if isinstance(self._mm, mmap.mmap):
            try:
                self._mm.close()
            except BufferError:
                pass  # views are alive; the mapping goes when they do
        self._mm = None

    def __enter__(self) -> PnnxBin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PnnxBin({self.path!r}, {len(self._entries)} entries)"


class _FileBytes:
    """An open file's bytes as ``_locate`` slices them (``whole[a:b]``, ``len(whole)``),
    read where asked rather than all at once."""

    def __init__(self, file: io.BufferedReader, size: int):
        self.file, self.size = file, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.size)
        self.file.seek(start)
        return self.file.read(max(stop - start, 0))


def _read_entries(file: io.BufferedReader, located: dict[str, _Entry],
                  path: str) -> tuple[np.ndarray, dict[str, _Entry]]:
    """Every entry's bytes read from ``file`` into one buffer, each from a multiple of
    ALIGNMENT bytes (pnnx packs its entries end to end, at any address), and the entries as
    offsets into that buffer. The buffer's pages are mapped in by one call (parser/pages.py's
    way, for the same reason: a page fault each costs more than the read)."""
    starts, total = [], 0
    for entry in located.values():               # a compressed entry is refused when read
        starts.append(total)
        if entry.method == zipfile.ZIP_STORED:
            total += -(-entry.size // ALIGNMENT) * ALIGNMENT
    try:
        memory = fresh_pages(total + ALIGNMENT)
    except MemoryError:
        raise BinFileError(f"not enough memory to read the file ({total:,} bytes of weights) "
                           f"into memory; map it instead (RuntimeGraph(..., weights='map'))",
                           path=path) from None
    skip = -memory.ctypes.data % ALIGNMENT
    buffer = memory[skip:skip + total]
    entries: dict[str, _Entry] = {}
    for (name, entry), start in zip(located.items(), starts):
        if entry.method != zipfile.ZIP_STORED:
            entries[name] = entry
            continue
        file.seek(entry.offset)
        if file.readinto(buffer[start:start + entry.size]) != entry.size:  # type: ignore[arg-type]
            raise BinFileError("the file changed size while being read", path=path,
                               entry=name)
        entries[name] = _Entry(offset=start, size=entry.size, method=entry.method,
                               crc=entry.crc)
    buffer.flags.writeable = False
    return buffer, entries


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What ``changed`` compares: device, inode, size, modification time (ns)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


_FILE_MAPS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()   # the maps PnnxBin opened


def release_pages(array: np.ndarray) -> None:
    """``PnnxBin.release`` for an array in hand: if ``array`` is a contiguous view of a bin
    file's memory map (a weight ``read`` returned), let the OS drop the whole pages it covers,
    for a weight that a layer has repacked and will not read again soon. Anything else is left
    alone: an array over anonymous memory (an arena buffer, parser/pages.py) would lose its
    values. The view stays valid; reading it brings the pages back from the file."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    mapped = base.obj if isinstance(base, memoryview) else base
    if not (isinstance(mapped, mmap.mmap) and mapped in _FILE_MAPS
            and array.flags.c_contiguous):
        return
    offset = array.ctypes.data - np.frombuffer(mapped, np.uint8, count=1).ctypes.data
    _drop_pages(mapped, offset, array.nbytes)


def _drop_pages(mapped: mmap.mmap, offset: int, size: int) -> None:
    """madvise(DONTNEED) on the whole pages inside bytes [offset, offset + size) of a map."""
    page = mmap.PAGESIZE
    start = -(-offset // page) * page
    stop = (offset + size) // page * page
    if stop > start and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, start, stop - start)
