"""Reading a file a user named, safely: only regular files, and only up to a size limit.

A path may name something that is not a file: a FIFO (reading it blocks until someone writes),
``/dev/zero`` or ``/dev/urandom`` (reading never ends), a folder. ``read_file`` opens the path
without blocking, asks the open descriptor (not the path, which could change in between) what
it is, refuses anything but a regular file, and reads at most ``limit`` bytes, so a 40 GB file
named by mistake is refused rather than read into memory.

Callers turn the problem into their own error: ``fail(message)`` returns the exception to raise
(a ParamFileError for a param file, an ImageError for an image, ...).
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Callable

MiB = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_file(path: str | os.PathLike[str], limit: int,
              fail: Callable[[str], Exception]) -> bytes:
    """The bytes of the regular file at ``path``; ``fail(message)`` is raised if the path is
    missing, unreadable, not a regular file, or larger than ``limit`` bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise fail("no such file") from None
    except IsADirectoryError:
        raise fail("is a folder, not a file") from None
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    except ValueError:                          # a NUL character in the path
        raise fail("not a valid path (it contains a NUL character)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise fail(f"is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise fail(f"the file has {info.st_size:,} bytes, more than the {limit:,} this "
                       f"reader accepts")
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = _read_at_most(file, info.st_size, limit)
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:                       # the file grew while being read
        raise fail(f"the file has more than the {limit:,} bytes this reader accepts")
    return data


def _read_at_most(file: BinaryIO, size: int, limit: int) -> bytes:
    """The file's bytes, up to ``limit + 1`` of them. A read of n bytes sets n bytes aside
    first, so the first read asks for the size the file said it has (plus one, to see if it
    grew), not for the limit."""
    data = file.read(min(size, limit) + 1) or b""     # None: nothing there yet (non-blocking)
    if len(data) > size:                        # it grew (or, like /proc files, said 0)
        data += file.read(limit + 1 - len(data)) or b""
    return data


def check_regular(path: str | os.PathLike[str], fail: Callable[[str], Exception]) -> None:
    """Raise ``fail(message)`` unless ``path`` names an existing regular file (stat follows
    symbolic links; nothing is opened, so a FIFO does not block)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    except ValueError:
        raise fail("not a valid path (it contains a NUL character)") from None
    if not stat.S_ISREG(info.st_mode):
        raise fail(f"is {_kind(info.st_mode)}, not a regular file")
