"""Bounded reads of the files a connector ingests: a size limit per file, lines read in pieces.

A worker reads a data source's files one at a time; without a limit one oversized file (a
300 MB log dropped in a docs folder, a JSONL export written as one line) is read whole into
memory, parsed, and embedded as tens of thousands of rows. Every file-reading connector reads
through these helpers instead:

- :func:`read_bounded` reads a whole file of at most ``limit`` bytes, checking the size on disk
  first and reading at most ``limit + 1`` bytes (a file that grows while being read is still
  refused), so no more than ``limit`` bytes are ever held;
- :func:`iter_lines_bounded` yields a file's lines holding at most ``limit`` bytes each in
  memory; a longer line is consumed in pieces of :data:`READ_PIECE_BYTES` and reported as too
  long (its length known, its bytes dropped);
- :class:`FileSourceConfig` gives a connector's configuration its ``max_file_bytes`` field.

The caller records each refusal with ``report.skip(item, exc.reason)``: the item and why, on
the run, never a silent drop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO
from zipfile import ZipFile

from pydantic import Field

from sources.connectors.base import ConnectorConfig

# 10 MB: about 2,500 sections of 4,000 characters, far above any hand-written page, an export's
# day file or a JSON document, and small enough that parsing one stays well under 1 GB of memory.
DEFAULT_MAX_FILE_BYTES = 10_000_000
READ_PIECE_BYTES = 1 << 20  # 1 MiB: how much of an over-long line is read at a time to skip it


class FileTooLarge(Exception):
    """A file or line is over the configured limit; ``size`` and ``limit`` are in bytes."""

    def __init__(
        self, size: int, limit: int, *, what: str = "file", setting: str = "max_file_bytes", at_least: bool = False
    ):
        self.size, self.limit, self.what, self.setting, self.at_least = size, limit, what, setting, at_least
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        """The skip reason recorded on the run, e.g. ``file is 314572800 bytes, over max_file_bytes (10000000)``."""
        size = f"at least {self.size}" if self.at_least else str(self.size)
        return f"{self.what} is {size} bytes, over {self.setting} ({self.limit})"


class FileSourceConfig(ConnectorConfig):
    """Base of the configuration of a connector that reads files from disk.

    ``max_file_bytes``: a file larger than this (bytes) is skipped and recorded on the run with
    its size, never read into memory.
    """

    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0)


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` when it holds at most ``limit`` bytes.

    Raises :class:`FileTooLarge` when the size on disk is over ``limit`` (nothing is read) or the
    file grew past it while being read (at most ``limit + 1`` bytes were held), and ``OSError``
    when the file cannot be read.
    """
    size = path.stat().st_size
    if size > limit:
        raise FileTooLarge(size, limit)
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(len(data), limit, at_least=True)
    return data


def read_zip_member_bounded(archive: ZipFile, name: str, limit: int) -> bytes:
    """The uncompressed bytes of member ``name`` of ``archive`` when at most ``limit`` bytes.

    The size the archive declares is checked first; the read stops at ``limit + 1`` bytes, so a
    member that declares less than it holds (a zip bomb) is refused as well. Raises
    :class:`FileTooLarge`, ``KeyError`` when there is no such member, ``zipfile.BadZipFile``.
    """
    declared = archive.getinfo(name).file_size
    if declared > limit:
        raise FileTooLarge(declared, limit)
    with archive.open(name) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(len(data), limit, at_least=True)
    return data


def iter_lines_bounded(handle: IO[bytes], limit: int) -> Iterator[tuple[int, bytes | FileTooLarge]]:
    """``(line number, line)`` for each line of ``handle``, 1-based, the line with its newline.

    A line whose bytes (its newline excluded) are over ``limit`` is read in pieces of
    :data:`READ_PIECE_BYTES` and dropped; in its place comes a :class:`FileTooLarge` with
    ``what="line"``, ``setting="max_line_bytes"`` and the line's length. Memory held: at most
    ``limit + 1`` bytes of one line at a time.
    """
    lineno = 0
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) <= limit or (len(line) == limit + 1 and line.endswith(b"\n")):
            yield lineno, line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = handle.readline(READ_PIECE_BYTES)
            if not line:
                break
            size += len(line)
        yield (
            lineno,
            FileTooLarge(size - (1 if line.endswith(b"\n") else 0), limit, what="line", setting="max_line_bytes"),
        )
