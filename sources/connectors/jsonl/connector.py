"""JSON documents connector: each JSON object becomes one row of the configured kind.

The shape a custom source exports: ``{"id": ..., "title": ..., "content": ..., ...}`` per line
of a ``.jsonl`` file, or per ``.json`` file in a folder (an export of one file per document), or a
git log dumped as JSONL (``kind="commit"``).

- external id = ``str(record[id_field])``; a record without it is skipped and recorded;
- title = the record's ``title_field_name`` field, else ``title_field``, else the id;
- content = the content fields in order (a record's ``content_field_names`` win), each string
  as is, each list one item per line, later fields under a ``Field name:`` label; a record with
  no content falls back to its title. Commit rows also list their changed files in the
  content, so a lexical search for a file name finds the commits that touched it;
- embedded text = title + content fields, cut at 2000 characters (commit rows: only the first
  five changed files, on one line);
- metadata = every other small top-level scalar or list (or ``metadata_fields``), plus
  ``source_type`` (the first folder of the file's path, e.g. ``slack``) for folder sources;
  ``pr_number`` is kept as an int; commit rows always keep ``files`` (up to 1000) and ``author``;
  the names in ``person_fields`` are gathered in ``owners`` and ``participants``;
- a line that is not valid JSON, or not an object, is skipped as ``{file}:{line}``; in a folder a
  ``.json`` file that cannot be parsed is skipped; a single ``.json`` path that cannot be parsed,
  or a missing path, raises :class:`ConnectorError`.

Strings are cleaned for PostgreSQL (NUL characters and unpaired surrogates cannot be stored).
A string holding literal ``\\n`` escapes and no real newline (a double-escaped export, as in a
few pages of some exports) gets real newlines back.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from dateutil import parser as date_parser

from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.files import FileRefused, FileTooLarge, iter_lines_bounded, open_regular, read_bounded
from sources.connectors.jsonl.config import JsonDocumentsConfig

TEXT_CHARS = 2000  # embedded text: title + content start (the local model reads ~256 tokens anyway)
MAX_FILES_KEPT = 1000  # a commit's changed-file list kept in metadata and content
# Files named in a commit's embedded text: paths cost many tokens and say little to a dense
# model past the first few; the full list stays in the content for lexical search.
EMBED_FILES = 5
JSON_LIST_SUFFIXES = (".json",)
FOLDER_SUFFIXES = (".json", ".jsonl", ".ndjson")
# Record fields that describe the record's own layout, never metadata.
LAYOUT_FIELDS = {"title_field_name", "content_field_names"}
_EPOCH_STRING = re.compile(r"^\d{9,16}(\.\d+)?$")


def clean_text(value: str) -> str:
    """``value`` without NUL characters and with unpaired surrogates replaced by ``?``."""
    if "\x00" in value:
        value = value.replace("\x00", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(str(k)): _clean(v) for k, v in value.items()}
    return value


def _unescape_newlines(value: str) -> str:
    if "\n" not in value and value.count("\\n") >= 2:
        return value.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", "\t")
    return value


def render_value(value: Any) -> str:
    """Text of a field value: strings as is, lists one item per line, objects as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _unescape_newlines(value)
    if isinstance(value, list):
        return "\n".join(text for text in (render_value(v) for v in value) if text)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def parse_timestamp(value: Any) -> datetime | None:
    """An aware datetime from ISO 8601 / RFC 2822 text or unix epoch seconds (or ms, µs); else ``None``.

    Text without a zone and date-only values are taken as UTC. Out-of-range values give ``None``.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float) or (isinstance(value, str) and _EPOCH_STRING.match(value.strip())):
            seconds = float(value)
            while seconds > 1e11:  # milliseconds or microseconds since the epoch
                seconds /= 1000
            parsed = datetime.fromtimestamp(seconds, tz=UTC)
        elif isinstance(value, str) and value.strip():
            text = value.strip()
            try:
                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                parsed = date_parser.parse(text)
        else:
            return None
    except (ValueError, OverflowError, OSError, date_parser.ParserError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed if 1970 <= parsed.year <= 2200 else None


MAX_PERSON_LIST_CHARS = 10_000


def _as_list(value: Any) -> list[Any]:
    """A field's names as a list: a list as it is, a list written as text (``"['Ana', 'Lee']"``,
    as some exports serialise them) parsed, a single value alone, nothing for empty values."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str | int | float) and str(v).strip()]
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("[") and text.endswith("]"):
        try:  # a list of names is short; a huge or deeply nested "list" is not parsed at all
            parsed = ast.literal_eval(text) if len(text) <= MAX_PERSON_LIST_CHARS else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            parsed = None
        if isinstance(parsed, list):
            return [v for v in parsed if isinstance(v, str) and v.strip()]
    return [value] if isinstance(value, str | int | float) else []


def _label(field: str) -> str:
    return field.replace("_", " ").strip().capitalize()


class JsonDocumentsConnector(Connector):
    """JSON/JSONL records -> rows (see the module docstring for the mapping)."""

    kind: ClassVar[str] = "jsonl"
    config_model: ClassVar[type[JsonDocumentsConfig]] = JsonDocumentsConfig
    config: JsonDocumentsConfig

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield one row per valid record, file by file in path order, lines in file order.

        Raises :class:`ConnectorError` when ``path`` does not exist, or is a single ``.json``
        file that is not valid JSON. ``report.total`` counts expected records (non-blank JSONL
        lines plus one per ``.json`` file, grown when a file holds a list); the report advances
        once per record, skipped ones included.
        """
        root = Path(self.config.path).expanduser()
        if not root.exists():
            raise ConnectorError(f"JSON documents path {root} does not exist")
        if root.is_dir():
            files = self._list_files(root)
            base = root
        else:
            files, base = [root.name], root.parent
        report.total = sum(self._expected(base / rel) for rel in files)
        report.unit = "records"
        for rel in files:
            yield from self._file_rows(base, rel, report, single=not root.is_dir())

    def _list_files(self, root: Path) -> list[str]:
        found = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            rel_folder = PurePosixPath(Path(folder).relative_to(root).as_posix())
            for name in names:
                rel = (rel_folder / name).as_posix()
                if not name.startswith(".") and name.lower().endswith(FOLDER_SUFFIXES) and self.path_allowed(rel):
                    found.append(rel)
        return sorted(found)

    def _expected(self, path: Path) -> int:
        if path.suffix.lower() in JSON_LIST_SUFFIXES:
            return 1
        try:
            # Never a link or a pipe (``/dev/zero`` would be counted forever); _file_rows skips those.
            with open_regular(path) as handle:
                lines = iter_lines_bounded(handle, self.config.max_line_bytes)
                return sum(1 for _, line in lines if not isinstance(line, bytes) or line.strip())
        except (OSError, FileRefused):
            return 0

    def _file_rows(self, base: Path, rel: str, report: IngestReport, *, single: bool) -> Iterator[DocumentRow]:
        path = base / rel
        # A link could point anywhere on the server: never follow one inside a folder source.
        if not single and path.is_symlink():
            report.skip(rel, "symbolic link; not followed")
            report.advance()
            return
        # The first folder of a record's path names its origin in a mixed export (slack/, jira/).
        source_type = PurePosixPath(rel).parts[0] if not single and len(PurePosixPath(rel).parts) > 1 else None
        if path.suffix.lower() in JSON_LIST_SUFFIXES:
            try:
                data = json.loads(
                    read_bounded(path, self.config.max_file_bytes, follow_symlinks=single).decode("utf-8-sig")
                )
            except FileRefused as exc:
                if single:
                    raise ConnectorError(f"JSON file {path} is not read: {exc.reason}") from exc
                report.skip(rel, exc.reason)
                report.advance()
                return
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                if single:
                    raise ConnectorError(f"cannot read JSON file {path}: {exc}") from exc
                report.skip(rel, f"invalid JSON: {exc}")
                report.advance()
                return
            if isinstance(data, list):
                report.total = (report.total or 0) + len(data) - 1
                records = [(f"{rel}[{i}]", item) for i, item in enumerate(data)]
            else:
                records = [(rel, data)]
            for where, record in records:
                row = self._row(record, where, rel, source_type, report)
                if row is not None:
                    yield row
            return
        try:
            handle = open_regular(path, follow_symlinks=single)
        except FileRefused as exc:
            if single:
                raise ConnectorError(f"JSONL file {path} is not read: {exc.reason}") from exc
            report.skip(rel, exc.reason)
            return
        except OSError as exc:
            if single:
                raise ConnectorError(f"cannot read JSONL file {path}: {exc.strerror or exc}") from exc
            report.skip(rel, f"cannot read: {exc.strerror or exc}")
            return
        with handle:
            for lineno, raw in iter_lines_bounded(handle, self.config.max_line_bytes):
                where = f"{rel}:{lineno}"
                if isinstance(raw, FileTooLarge):
                    report.skip(where, raw.reason)
                    report.advance()
                    continue
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw.rstrip(b"\r\n").decode("utf-8-sig" if lineno == 1 else "utf-8"))
                except UnicodeDecodeError as exc:
                    report.skip(where, f"not UTF-8: invalid byte at offset {exc.start}")
                    report.advance()
                    continue
                except json.JSONDecodeError as exc:
                    report.skip(where, f"invalid JSON: {exc.msg} at column {exc.colno}")
                    report.advance()
                    continue
                row = self._row(record, where, rel, source_type, report)
                if row is not None:
                    yield row

    def _row(
        self, record: Any, where: str, rel: str, source_type: str | None, report: IngestReport
    ) -> DocumentRow | None:
        """The row for one record, or ``None`` after recording why it was skipped."""
        report.advance()  # progress counts records, skipped ones included
        cfg = self.config
        if not isinstance(record, dict):
            report.skip(where, f"not a JSON object but {type(record).__name__}")
            return None
        raw_id = record.get(cfg.id_field)
        if raw_id is None or isinstance(raw_id, dict | list | bool) or str(raw_id).strip() == "":
            report.skip(where, f"missing id field {cfg.id_field!r}")
            return None
        external_id = clean_text(str(raw_id).strip())

        title_field = record.get("title_field_name") if isinstance(record.get("title_field_name"), str) else None
        title = ""
        for name in (title_field, cfg.title_field):
            if name and render_value(record.get(name)).strip():
                title = " ".join(render_value(record[name]).split())
                break
        title = clean_text(title or external_id)

        names = record.get("content_field_names")
        content_names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else cfg.content_fields
        pieces: list[str] = []
        for name in content_names:
            text = render_value(record.get(name)).strip()
            if text:
                pieces.append(text if not pieces else f"{_label(name)}:\n{text}")
        text_pieces = list(pieces)
        files = record.get("files") if isinstance(record.get("files"), list) else None
        if cfg.kind == "commit" and files:
            pieces.append("Files changed:\n" + "\n".join(str(f) for f in files[:MAX_FILES_KEPT]))
            more = f" and {len(files) - EMBED_FILES} more" if len(files) > EMBED_FILES else ""
            text_pieces.append("Files changed: " + ", ".join(str(f) for f in files[:EMBED_FILES]) + more)
        content = clean_text("\n\n".join(pieces) or title)
        embed_text = clean_text("\n\n".join([title, *text_pieces]))[:TEXT_CHARS]

        # The title field stays in metadata (a Slack thread's title field is its channel).
        metadata = self._metadata(record, set(content_names))
        if source_type and "source_type" not in metadata:
            metadata["source_type"] = source_type
        for role, names in self._people(record).items():
            if names:
                metadata[role] = _clean(list(dict.fromkeys([*_as_list(metadata.get(role)), *names])))
        if cfg.kind == "commit":
            if files is not None:
                metadata["files"] = _clean([str(f) for f in files[:MAX_FILES_KEPT]])
                if len(files) > MAX_FILES_KEPT:
                    metadata["files_total"] = len(files)
            if isinstance(record.get("author"), str):
                metadata["author"] = clean_text(record["author"])

        return DocumentRow(
            external_id=external_id,
            kind=cfg.kind,
            title=title,
            content=content,
            text=embed_text,
            url=self._url(record),
            path=rel,
            metadata=metadata,
            created_at=self._first_time(record, cfg.created_fields),
            updated_at=self._first_time(record, cfg.timestamp_fields),
        )

    def _metadata(self, record: dict[str, Any], used: set[str]) -> dict[str, Any]:
        cfg = self.config
        skip = {cfg.id_field, cfg.url_field, *used, *LAYOUT_FIELDS, *cfg.exclude_fields}
        if cfg.metadata_fields is not None:
            names = [n for n in cfg.metadata_fields if n in record and n not in cfg.exclude_fields]
        else:
            names = [n for n in record if n not in skip]
        metadata: dict[str, Any] = {}
        for name in names:
            value = record[name]
            if name == "pr_number":
                # Kept as an int so a filter or a join on pull request numbers compares numbers.
                try:
                    value = int(value) if value is not None and str(value).strip() else None
                except (TypeError, ValueError):
                    pass
                if value is None:
                    continue
            if cfg.metadata_fields is None:
                if isinstance(value, dict):
                    continue
                if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
                    continue
                if len(json.dumps(value, ensure_ascii=False)) >= cfg.max_metadata_chars:
                    continue
            metadata[clean_text(name)] = _clean(value)
        return metadata

    def _people(self, record: dict[str, Any]) -> dict[str, list[str]]:
        """``{"owners": [...], "participants": [...]}`` from ``person_fields``, each name once."""
        people: dict[str, list[str]] = {"owners": [], "participants": []}
        for field_name, role in self.config.person_fields.items():
            for name in _as_list(record.get(field_name)):
                name = clean_text(" ".join(str(name).split()))
                if name and name not in people[f"{role}s"]:
                    people[f"{role}s"].append(name)
        return people

    def _url(self, record: dict[str, Any]) -> str:
        cfg = self.config
        if cfg.url_field and isinstance(record.get(cfg.url_field), str) and record[cfg.url_field].strip():
            return clean_text(record[cfg.url_field].strip())
        if cfg.url_template:
            try:
                return clean_text(cfg.url_template.format_map(record))
            except (KeyError, IndexError, ValueError, AttributeError):
                return ""  # the record lacks a field the template names: no link rather than a wrong one
        return ""

    @staticmethod
    def _first_time(record: dict[str, Any], fields: list[str]) -> datetime | None:
        for name in fields:
            parsed = parse_timestamp(record.get(name))
            if parsed is not None:
                return parsed
        return None
