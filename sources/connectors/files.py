"""Bounded reads of the files a connector ingests: a size limit per file, lines read in pieces.

A worker reads a data source's files one at a time; without a limit one oversized file (a
300 MB log dropped in a docs folder, a JSONL export written as one line) is read whole into
memory, parsed, and embedded as tens of thousands of rows. Every file-reading connector reads
through these helpers instead:

- :func:`open_regular` opens a file only when it is a regular one (never a link inside a
  folder, a pipe or a device, which could block or never end);
- :func:`read_bounded` reads a whole file of at most ``limit`` bytes, checking the size on disk
  first and reading at most ``limit + 1`` bytes (a file that grows while being read is still
  refused), so no more than ``limit`` bytes are ever held; :func:`read_zip_member_bounded` does
  the same for a ZIP archive's member;
- :func:`iter_lines_bounded` yields a file's lines holding at most ``limit`` bytes each in
  memory; a longer line is consumed in pieces of :data:`READ_PIECE_BYTES` and reported as too
  long (its length known, its bytes dropped);
- :class:`FileSourceConfig` gives a connector's configuration its ``max_file_bytes`` field.

The caller records each refusal with ``report.skip(item, exc.reason)``: the item and why, on
the run, never a silent drop.
"""

from __future__ import annotations

import errno
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from zipfile import BadZipFile, ZipFile

from pydantic import Field

from sources.connectors.base import ConnectorConfig

# 10 MB: about 2,500 sections of 4,000 characters, far above any hand-written page, an export's
# day file or a JSON document, and small enough that parsing one stays well under 1 GB of memory.
DEFAULT_MAX_FILE_BYTES = 10_000_000
READ_PIECE_BYTES = 1 << 20  # 1 MiB: how much of an over-long line is read at a time to skip it


class FileRefused(Exception):
    """A file a connector must not read (too large, not a regular file, unreadable ZIP member);
    ``reason`` is what the run records beside the item."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class FileTooLarge(FileRefused):
    """A file or line is over the configured limit; ``size`` and ``limit`` are in bytes."""

    def __init__(
        self, size: int, limit: int, *, what: str = "file", setting: str = "max_file_bytes", at_least: bool = False
    ):
        self.size, self.limit, self.what, self.setting, self.at_least = size, limit, what, setting, at_least
        shown = f"at least {size}" if at_least else str(size)
        # e.g. "file is 314572800 bytes, over max_file_bytes (10000000)"
        super().__init__(f"{what} is {shown} bytes, over {setting} ({limit})")


class FileSourceConfig(ConnectorConfig):
    """Base of the configuration of a connector that reads files from disk.

    ``max_file_bytes``: a file larger than this (bytes) is skipped and recorded on the run with
    its size, never read into memory.
    """

    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0)


def open_regular(path: Path, *, follow_symlinks: bool = False) -> IO[bytes]:
    """``path`` opened for reading in binary mode when it is a regular file.

    Opened without following a symbolic link (unless ``follow_symlinks``: a path the operator
    configured) and without blocking, then checked on the open descriptor, so a file swapped
    for a link or a pipe after a check is still refused. Raises :class:`FileRefused` for a
    symbolic link, a FIFO, a device or a folder (a pipe or ``/dev/zero`` would never end), and
    ``OSError`` when it cannot be opened.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefused("symbolic link; not followed") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a pipe" if stat.S_ISFIFO(mode) else "a device or socket"
        raise FileRefused(f"not a regular file ({kind}); not read")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int, *, follow_symlinks: bool = False) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes.

    Raises :class:`FileRefused` when it is not a regular file (:func:`open_regular`),
    :class:`FileTooLarge` when its size is over ``limit`` (nothing is read) or it grew past it
    while being read (at most ``limit + 1`` bytes were held), and ``OSError`` when it cannot be
    read.
    """
    with open_regular(path, follow_symlinks=follow_symlinks) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise FileTooLarge(size, limit)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(len(data), limit, at_least=True)
    return data


def read_zip_member_bounded(archive: ZipFile, name: str, limit: int) -> bytes:
    """The uncompressed bytes of member ``name`` of ``archive`` when at most ``limit`` bytes.

    The size the archive declares is checked first, and the read stops at ``limit + 1`` bytes.
    (A member that declares less than it holds, a zip bomb, stops at its declared size and fails
    its CRC check.) Raises :class:`FileTooLarge`; :class:`FileRefused` for a member that cannot
    be read (corrupt, encrypted, an unsupported compression); ``KeyError`` when there is none.
    """
    declared = archive.getinfo(name).file_size
    if declared > limit:
        raise FileTooLarge(declared, limit)
    try:
        with archive.open(name) as handle:
            data = handle.read(limit + 1)
    except (BadZipFile, RuntimeError, NotImplementedError, zlib.error, EOFError) as exc:
        raise FileRefused(f"unreadable ZIP member: {exc}") from exc
    if len(data) > limit:
        raise FileTooLarge(len(data), limit, at_least=True)
    return data


def iter_lines_bounded(handle: IO[bytes], limit: int) -> Iterator[tuple[int, bytes | FileTooLarge]]:
    """``(line number, line)`` for each line of ``handle``, 1-based, the line with its newline.

    A line whose bytes (its ``\\n`` or ``\\r\\n`` excluded) are over ``limit`` is read in pieces of
    :data:`READ_PIECE_BYTES` and dropped; in its place comes a :class:`FileTooLarge` with
    ``what="line"``, ``setting="max_line_bytes"`` and the line's length. Memory held: at most
    ``limit + 2`` bytes of one line at a time.
    """
    lineno = 0
    while True:
        line = handle.readline(limit + 2)  # room for the limit and a "\r\n"
        if not line:
            return
        lineno += 1
        ending = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
        if len(line) - ending <= limit:
            yield lineno, line
            continue
        size, tail = len(line), line[-2:]
        while not tail.endswith(b"\n"):
            piece = handle.readline(READ_PIECE_BYTES)
            if not piece:
                break
            size, tail = size + len(piece), (tail + piece)[-2:]
        ending = 2 if tail == b"\r\n" else 1 if tail.endswith(b"\n") else 0
        yield lineno, FileTooLarge(size - ending, limit, what="line", setting="max_line_bytes")
