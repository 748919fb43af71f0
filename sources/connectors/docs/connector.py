"""Docs folder connector: Markdown/HTML/reST/text pages -> ``doc_page`` and ``doc_section`` rows.

Per file (path relative to the configured folder, POSIX separators):

- one ``doc_page`` row, external id = the relative path; title = first H1, else the front
  matter's ``title`` (HTML: ``<title>``), else the file stem; content = the whole page (front
  matter removed); embedded text = title + the first ~1000 characters of body text;
- one ``doc_section`` row per heading, external id ``{relpath}#{slug/of/heading/path}``
  (repeats get ``-2``, ``-3``), title ``Page > H2 > H3``, the section's 1-based inclusive line
  range, parent = the page row, position = index in the page, metadata ``heading_path``,
  ``level``, ``anchor``, ``prev_section``/``next_section`` (neighbours' external ids) and
  ``page_title``. A section longer than ``max_section_chars`` is split between blocks into
  rows ``...-part2``, ``...-part3`` (metadata ``part``/``parts``).

Small sections: a heading whose body has fewer than ``min_section_chars`` characters (e.g.
``## 0.141.1`` directly followed by ``### Fixes`` in release notes) is merged into the next
section when that one is nested under it: the next section's heading path already names it,
and a row holding only a heading would be retrieved for nothing. The merged headings are listed
in the row's ``merged_headings`` metadata and its line range starts at the merged heading. A
small section followed by a sibling or a higher heading is kept as is.

Every row carries the file's modification time as ``updated_at``: a touched file rewrites its
rows (no new embeddings unless their text changed). Files that are binary (a NUL byte) or not
UTF-8, and files over ``max_file_bytes`` (never read), are skipped and recorded on the run;
hidden files and folders (``.git``...) are not searched; symbolic links are not followed.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.docs.config import DocsConfig
from sources.connectors.docs.sections import Block, Heading, ParsedPage, RawSection, parse_page, render, slug
from sources.connectors.files import FileRefused, read_bounded

# What a page's rows are made by: this module and the section parser. A page stored by other code
# is parsed again, so an upgrade that changes the rows reaches every page.
CODE_FORMAT = hashlib.sha256(
    Path(__file__).read_bytes() + (Path(__file__).parent / "sections.py").read_bytes()
).hexdigest()[:16]
PAGE_TEXT_CHARS = 1000  # embedded text of a page row: title + the start of the page
SECTION_TEXT_CHARS = 1500  # embedded text of a section row: heading path + body
MAX_EXTERNAL_ID = 480  # the column holds 512; longer ids are cut and suffixed with a hash

# File suffix -> parser; any other suffix a glob admits is read as ``DocsConfig.text_format``.
_FORMATS = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdx": "markdown",
    ".html": "html",
    ".htm": "html",
    ".rst": "rst",
}


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a path glob: ``**/`` matches zero or more folders, ``*`` and ``?`` stay in one name."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (close := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : close]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _fit_id(external_id: str) -> str:
    if len(external_id) <= MAX_EXTERNAL_ID:
        return external_id
    digest = hashlib.sha1(external_id.encode("utf-8")).hexdigest()[:12]
    return f"{external_id[: MAX_EXTERNAL_ID - 13]}-{digest}"


def assign_heading_paths(sections: list[RawSection], title: str) -> None:
    """Set each section's ``heading_path``: the page title, then every enclosing heading below it.

    The first H1 carrying the page title is the root, so its section's path is ``[title]``;
    text before the first heading also gets ``[title]``.
    """
    stack: list[Heading] = []
    root_seen = False
    for section in sections:
        head = section.heading
        if head is None:
            section.heading_path = [title]
            continue
        if not root_seen and head.level == 1 and head.text == title:
            root_seen, stack = True, []
            section.heading_path = [title]
            continue
        while stack and stack[-1].level >= head.level:
            stack.pop()
        stack.append(head)
        section.heading_path = [title, *(h.text for h in stack)]


def merge_small_sections(sections: list[RawSection], min_chars: int) -> list[RawSection]:
    """Merge each heading with a body under ``min_chars`` characters into a following nested section."""
    out: list[RawSection] = []
    pending: RawSection | None = None
    for k, section in enumerate(sections):
        if pending is not None:
            section = RawSection(
                heading=section.heading,
                blocks=pending.blocks + section.blocks,
                merged_headings=pending.merged_headings + [pending.heading.text if pending.heading else ""],
                heading_path=section.heading_path,
            )
            pending = None
        following = sections[k + 1] if k + 1 < len(sections) else None
        if (
            section.heading is not None
            and following is not None
            and following.heading is not None
            and following.heading.level > section.heading.level
            and section.body_chars < min_chars
        ):
            pending = section
            continue
        out.append(section)
    return out


def _cut_block(block: Block, max_chars: int) -> list[Block]:
    """Cut one overlong block between lines (a single overlong line between characters)."""
    out: list[Block] = []
    chunk: list[str] = []
    size, first, last = 0, 0, 0

    def line_of(index: int) -> int:
        # HTML blocks hold extracted text, whose lines are not source lines: stay in the block's range.
        return min(block.start_line + index, block.end_line)

    for index, line in enumerate(block.text.split("\n")):
        for segment in [line[i : i + max_chars] for i in range(0, len(line), max_chars)] or [""]:
            if chunk and size + len(segment) + 1 > max_chars:
                out.append(Block(line_of(first), line_of(last), "\n".join(chunk)))
                chunk, size = [], 0
            if not chunk:
                first = last = index
            chunk.append(segment)
            size += len(segment) + 1
            if segment.strip():
                last = index  # a part's line range ends at its last non-blank line
    if chunk and "".join(chunk).strip():
        out.append(Block(line_of(first), line_of(last), "\n".join(chunk)))
    return out


def split_blocks(blocks: list[Block], max_chars: int) -> list[list[Block]]:
    """Group consecutive blocks into parts of at most ``max_chars`` characters each.

    A block longer than the limit on its own (a huge code fence or list) is cut between lines;
    a heading always stays with the block after it (a part may then exceed the limit by the
    heading's length). Parts never overlap and together hold every block.
    """
    pieces: list[Block] = []
    for block in blocks:
        pieces.extend([block] if len(block.text) <= max_chars else _cut_block(block, max_chars))
    parts: list[list[Block]] = []
    size = 0
    for piece in pieces:
        glued = bool(parts) and all(b.is_heading for b in parts[-1])
        if parts and (glued or size + len(piece.text) + 1 <= max_chars):
            parts[-1].append(piece)
            size += len(piece.text) + 1
        else:
            parts.append([piece])
            size = len(piece.text) + 1
    return parts


@dataclass
class SectionPart:
    """One ``doc_section`` row's worth of a page: a section, or one part of a long one.

    ``external_id``: ``<prefix>#<slug/of/heading/path>`` (``-2``... for repeats, ``-partN`` for
    parts after the first), not yet fitted to the column. ``title``: ``Page > H2 > H3``;
    ``body``: the blocks' text without headings; ``metadata``: ``heading_path``, ``level``,
    ``anchor`` and, when they apply, ``part``/``parts`` and ``merged_headings``.
    """

    external_id: str
    title: str
    anchor: str
    blocks: list[Block]
    body: str
    metadata: dict[str, Any]

    @property
    def text(self) -> str:
        """The embedded text: heading path + body, at most ``SECTION_TEXT_CHARS`` characters."""
        return (self.title + "\n\n" + self.body)[:SECTION_TEXT_CHARS]


def section_parts(sections: list[RawSection], id_prefix: str, max_section_chars: int) -> Iterator[SectionPart]:
    """Every section of a page (heading paths assigned, small ones merged) cut into parts of at
    most ``max_section_chars`` characters, in page order; ids are under ``id_prefix``."""
    used: dict[str, int] = {}
    for section in sections:
        heading_path = section.heading_path
        base = "/".join(slug(part) or "section" for part in heading_path)
        used[base] = used.get(base, 0) + 1
        section_id = f"{id_prefix}#{base}" + (f"-{used[base]}" if used[base] > 1 else "")
        anchor = section.heading.anchor if section.heading else ""
        parts = split_blocks(section.blocks, max_section_chars)
        for number, blocks in enumerate(parts, start=1):
            metadata: dict[str, Any] = {
                "heading_path": heading_path,
                "level": section.heading.level if section.heading else 0,
                "anchor": anchor,
            }
            if len(parts) > 1:
                metadata |= {"part": number, "parts": len(parts)}
            if section.merged_headings:
                metadata["merged_headings"] = section.merged_headings
            yield SectionPart(
                external_id=section_id if number == 1 else f"{section_id}-part{number}",
                title=" > ".join(heading_path),
                anchor=anchor,
                blocks=blocks,
                body="\n".join(b.text for b in blocks if not b.is_heading).strip(),
                metadata=metadata,
            )


def link_sections(rows: list[DocumentRow]) -> None:
    """Number a page's section rows (``position``) and name each one's neighbours in its
    metadata (``prev_section``/``next_section``: external ids, ``None`` at the ends)."""
    for position, row in enumerate(rows):
        row.position = position
        row.metadata["prev_section"] = rows[position - 1].external_id if position > 0 else None
        row.metadata["next_section"] = rows[position + 1].external_id if position + 1 < len(rows) else None


def page_text(title: str, bodies: list[str]) -> str:
    """A page row's embedded text: ``title`` + the first section bodies, at most ``PAGE_TEXT_CHARS``."""
    intro: list[str] = []
    for body in bodies:
        if len(" ".join(intro)) < PAGE_TEXT_CHARS and body:
            intro.append(body)
    return (title + "\n\n" + "\n\n".join(intro))[:PAGE_TEXT_CHARS].strip()


class DocsConnector(Connector):
    """A folder of documentation pages (see the module docstring for the rows it yields)."""

    kind: ClassVar[str] = "docs"
    config_model: ClassVar[type[DocsConfig]] = DocsConfig
    config: DocsConfig
    stored: dict[str, tuple[str, str]] = {}  # page external id -> (file sha-256, row format), from bind_source

    @property
    def row_format(self) -> str:
        """The code and the settings a page's rows depend on, as one short hash."""
        c = self.config
        settings = f"{CODE_FORMAT}\0{c.url_base}\0{c.text_format}\0{c.min_section_chars}\0{c.max_section_chars}"
        return hashlib.sha256(settings.encode()).hexdigest()[:16]

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:
        """Note each stored page's file hash and row format, so an incremental run keeps
        unchanged files unparsed (``IngestReport.keep``)."""
        if not self.config.incremental:
            return
        from kbportal.tenancy import tenant_context
        from sources.models import Document

        with tenant_context(tenant_id):
            found = Document.objects.filter(source_id=source_id, kind="doc_page").values_list(
                "external_id", "metadata__file_sha256", "metadata__row_format"
            )
            self.stored = {eid: (str(sha or ""), str(fmt or "")) for eid, sha, fmt in found}

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield a page row then its section rows, file by file in path order.

        Raises :class:`ConnectorError` when the folder is missing or not a folder. Sets
        ``report.total`` to the number of matching files and advances the report once per file;
        an empty folder yields nothing.
        """
        root = Path(self.config.path).expanduser()
        if not root.exists():
            raise ConnectorError(f"docs folder {root} does not exist")
        if not root.is_dir():
            raise ConnectorError(f"docs path {root} is not a folder")
        files = self.list_files(root)
        report.total = len(files)
        report.unit = "files"
        for relpath in files:
            rows = self.page_rows(root, relpath, report)
            report.advance()  # progress counts files, skipped ones included
            yield from rows

    def list_files(self, root: Path) -> list[str]:
        """Relative POSIX paths under ``root`` matching a ``glob`` pattern and the include/exclude globs, sorted."""
        patterns = [glob_regex(p) for p in self.config.glob]
        found: list[str] = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            rel_folder = PurePosixPath(Path(folder).relative_to(root).as_posix())
            for name in names:
                if name.startswith("."):
                    continue
                relpath = (rel_folder / name).as_posix()
                if any(p.match(relpath) for p in patterns) and self.path_allowed(relpath):
                    found.append(relpath)
        return sorted(found)

    def page_rows(self, root: Path, relpath: str, report: IngestReport) -> list[DocumentRow]:
        """The page row and its section rows for one file; ``[]`` (and a skip) when unreadable."""
        full = root / relpath
        # A link could point anywhere on the server (a secret key, /etc/passwd): never follow.
        if full.is_symlink():
            report.skip(relpath, "symbolic link; not followed")
            return []
        try:
            data = read_bounded(full, self.config.max_file_bytes)
            mtime = datetime.fromtimestamp(full.stat().st_mtime, tz=UTC)
        except FileRefused as exc:  # too large, a link, a pipe or a device
            report.skip(relpath, exc.reason)
            return []
        except OSError as exc:
            report.skip(relpath, f"cannot read: {exc.strerror or exc}")
            return []
        digest = hashlib.sha256(data).hexdigest()
        if self.stored and self.stored.get(relpath) == (digest, self.row_format):
            report.keep(relpath)  # the same bytes make the same rows: kept unparsed
            return []
        # PostgreSQL text cannot hold NUL, and a NUL means the file is not a text page anyway.
        if b"\x00" in data:
            report.skip(relpath, "binary file (contains NUL bytes)")
            return []
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            report.skip(relpath, f"not UTF-8 text: invalid byte 0x{data[exc.start]:02x} at offset {exc.start}")
            return []
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        fmt = _FORMATS.get(PurePosixPath(relpath).suffix.lower(), self.config.text_format)
        page = parse_page(fmt, text)
        rows = self._rows(page, relpath, mtime, line_count=len(text.rstrip("\n").split("\n")))
        rows[0].metadata.update(file_sha256=digest, row_format=self.row_format)
        return rows

    def _url(self, relpath: str, anchor: str = "") -> str:
        base = f"{self.config.url_base}/{relpath}" if self.config.url_base else relpath
        return f"{base}#{anchor}" if anchor else base

    def _rows(self, page: ParsedPage, relpath: str, mtime: datetime, *, line_count: int) -> list[DocumentRow]:
        title = page.title or PurePosixPath(relpath).stem
        assign_heading_paths(page.sections, title)
        sections = merge_small_sections(page.sections, self.config.min_section_chars)
        rows: list[DocumentRow] = []
        bodies: list[str] = []
        for part in section_parts(sections, relpath, self.config.max_section_chars):
            bodies.append(part.body)
            rows.append(
                DocumentRow(
                    external_id=_fit_id(part.external_id),
                    kind="doc_section",
                    title=part.title,
                    content=render(part.blocks),
                    text=part.text,
                    url=self._url(relpath, part.anchor),
                    path=relpath,
                    start_line=part.blocks[0].start_line,
                    end_line=max(b.end_line for b in part.blocks),
                    parent_external_id=relpath,
                    metadata={**part.metadata, "page_title": title},
                    updated_at=mtime,
                )
            )
        link_sections(rows)
        page_row = DocumentRow(
            external_id=relpath,
            kind="doc_page",
            title=title,
            content=page.text,
            text=page_text(title, bodies),
            url=self._url(relpath),
            path=relpath,
            start_line=1,
            end_line=line_count,
            metadata={"format": page.format, "sections": len(rows)},
            updated_at=mtime,
        )
        return [page_row, *rows]
