"""The one interface every connector implements, and the row shape it yields.

A connector turns a data source's configuration into :class:`DocumentRow` objects. It does not
touch the database: the ingestion service (``sources.services.ingestion``) upserts the rows,
embeds what changed and deletes what vanished. A connector:

- validates its configuration with ``config_model`` (a pydantic model);
- raises :class:`ConnectorError` with a message naming the input and the problem when the
  source as a whole cannot be read (missing path, not a git repository, malformed export);
  the run is then recorded as failed and earlier rows are left intact;
- calls ``report.skip(item, reason)`` for a single bad item (binary or undecodable file, a
  malformed day file) and goes on: the item is recorded on the run, never silently dropped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from kbportal.emails import email_key


def json_object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object (a dict), else an empty one: for reading optional
    nested fields of an API's or an export's JSON without a check at every step."""
    return value if isinstance(value, dict) else {}


class ConnectorError(Exception):
    """The data source cannot be read at all; the message names the input and the problem."""


class ConnectorConfig(BaseModel):
    """Base of every connector's configuration model: unknown keys are an error."""

    model_config = ConfigDict(extra="forbid")


_WEB_PREFIX = re.compile(r"https?://[^\s/?#@\\]+(?:[/?#]\S*)?", re.I)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def web_link_prefix(value: str) -> str:
    """``value`` without its trailing ``/``, as the prefix of the web links a connector writes
    (``{prefix}/{path}``); ``""`` for none. An ``http://`` or ``https://`` address with a host
    (no credentials), or a prefix with no scheme at all (``/docs``, ``docs.example.com``: a link
    relative to the page, as earlier configurations wrote it). Raises ``ValueError`` for any other
    scheme (``javascript:``, ``data:``, ``file:``), a protocol-relative ``//host``, or a space or
    control character: a link a reader clicks never runs script nor opens a local file."""
    value = (value or "").strip()
    if not value:
        return ""
    bad = (
        any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value)
        or value.startswith(("//", "\\"))
        or (_SCHEME.match(value) is not None and not _WEB_PREFIX.fullmatch(value))
    )
    if bad:
        raise ValueError("must be an http:// or https:// address, such as https://docs.example.com, or a path")
    return value.rstrip("/")


@dataclass
class DocumentRow:
    """One retrievable unit, in the unified table's shape.

    ``external_id`` is stable across runs (path + symbol, thread ts, commit sha); ``text`` is
    what gets embedded (empty: ``content`` is used); ``parent_external_id`` links a chunk to its
    file, a section to its page; ``position`` orders siblings under one parent; ``principals``
    lists who may read it (empty: everyone who may read the source).
    """

    external_id: str
    kind: str
    title: str
    content: str
    text: str = ""
    url: str = ""
    path: str = ""
    start_line: int | None = None
    end_line: int | None = None
    position: int = 0
    parent_external_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    principals: list[str] = field(default_factory=list)
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def embed_text(self) -> str:
        return self.text or self.content

    def content_hash(self) -> str:
        """sha256 hex of everything stored for the row; equal hash -> nothing to write or embed."""
        h = hashlib.sha256()
        for part in (
            self.kind,
            self.title,
            self.content,
            self.embed_text,
            self.url,
            self.path,
            str(self.start_line),
            str(self.end_line),
            str(self.position),
            str(self.parent_external_id),
            repr(sorted(self.metadata.items(), key=lambda kv: kv[0])),
            repr(sorted(self.principals)),
            str(self.created_at),
            str(self.updated_at),
        ):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()


class IngestReport:
    """Collects what a run skipped, with the reason, for the ``IngestionRun`` row, and the stored
    rows it kept unread (``kept``)."""

    def __init__(self) -> None:
        self.skipped: list[dict[str, str]] = []
        self.total: int | None = None  # optional: how many units (files, day files) to expect
        self.unit: str = ""  # what a unit is, plural ("files", "day files"), for the progress line
        self.done: int = 0  # units finished so far, counted by ``advance``
        self.kept: set[str] = set()  # external ids of stored rows kept, with their children, unread

    def skip(self, item: str, reason: str) -> None:
        self.skipped.append({"item": item, "reason": reason})

    def keep(self, external_id: str) -> None:
        """The stored row ``external_id`` and its children (rows whose ``parent_external_id`` it
        is) are unchanged: a full run keeps them as if yielded again. For a connector that can
        tell a unit unchanged before reading it (a file's blob id, its size and hash)."""
        self.kept.add(external_id)

    def advance(self, units: int = 1) -> None:
        """Count finished units (the same unit as ``total``) for the progress bar."""
        self.done += units


@dataclass
class DirectoryPerson:
    """A person a connector saw: the principal its rows use, the email and name it reports."""

    principal: str
    email: str = ""
    name: str = ""


@dataclass
class DirectoryGroup:
    """A group a connector saw: the principal its rows use, its name and member principals."""

    principal: str
    name: str = ""
    members: set[str] = field(default_factory=set)


@dataclass
class ConnectionCheck:
    """What :meth:`Connector.check` saw: ``rows`` read (all of them when ``complete``), the
    connector's units (files, channels, pages) done of ``units_total`` when it counts them, and
    the items it would skip with their reasons."""

    rows: int
    complete: bool
    units_done: int = 0
    units_total: int | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        seen = f"{self.rows} rows" if self.complete else f"at least {self.rows} rows (stopped early)"
        units = f", {self.units_done} of {self.units_total} items read" if self.units_total else ""
        skips = f", {len(self.skipped)} items it would skip" if self.skipped else ""
        return f"Connected: {seen}{units}{skips}."


class Directory:
    """The people and groups a connector saw during ``iter_rows`` (``sources.models``'
    ``ExternalIdentity`` and ``ExternalGroup``, written by the ingestion service after the run).

    ``person`` merges repeated sightings (a non-empty email or name wins over an empty one; the
    first non-empty one is kept). ``group`` adds members; ``complete_groups`` says the connector
    read every group member list it names, so a full run may replace the stored lists.
    """

    def __init__(self) -> None:
        self.people: dict[str, DirectoryPerson] = {}
        self.groups: dict[str, DirectoryGroup] = {}

    def person(self, principal: str, *, email: str | None = "", name: str | None = "") -> None:
        principal = principal.strip()
        if not principal:
            return
        email = email_key(email)  # "" when it is not an address: links to nobody
        seen = self.people.setdefault(principal, DirectoryPerson(principal))
        seen.email = seen.email or email[:254]
        seen.name = seen.name or (name or "").strip()[:200]

    def group(self, principal: str, *, name: str = "", members: Iterable[str] = ()) -> None:
        principal = principal.strip()
        if not principal:
            return
        seen = self.groups.setdefault(principal, DirectoryGroup(principal))
        seen.name = seen.name or name.strip()[:255]
        seen.members.update(m.strip() for m in members if m and m.strip())

    def __bool__(self) -> bool:
        return bool(self.people or self.groups)


class Connector(ABC):
    """A data-source kind. Subclasses set ``kind``, ``config_model`` and implement ``iter_rows``."""

    kind: ClassVar[str]
    config_model: ClassVar[type[ConnectorConfig]]

    def __init__(self, config: dict[str, Any], *, include: list[str] | None = None, exclude: list[str] | None = None):
        self.config = self.config_model.model_validate(config)
        # The people and groups seen while reading (see :class:`Directory`).
        self.directory = Directory()
        self.include = list(include or [])
        self.exclude = list(exclude or [])

    def path_allowed(self, path: str) -> bool:
        """True when ``path`` matches an include glob (or there are none) and no exclude glob."""
        if self.include and not any(fnmatch.fnmatch(path, pattern) for pattern in self.include):
            return False
        return not any(fnmatch.fnmatch(path, pattern) for pattern in self.exclude)

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:  # noqa: B027 - an optional hook
        """Hook called before ``iter_rows`` with the ids of the source being ingested, for a
        connector that reads the source's own index (Slack: term statistics and the stored thread
        distillations). The default does nothing."""

    def resume_from(self, cursor: datetime | None) -> bool:
        """Hook called before ``iter_rows`` with the newest ``updated_at`` among the source's
        stored rows (``None`` when it has none), for a connector that can read only what changed
        since (GitHub, Jira). Returns true when the run will then be partial, so rows it does not
        yield must not be deleted. The default reads everything: false."""
        return False

    def check(self, *, seconds: float = 10.0, max_rows: int = 500) -> ConnectionCheck:
        """Read the source as a run would, writing nothing, for at most ``seconds`` or
        ``max_rows`` rows: reachable, credentials accepted, and what it can see. Raises
        :class:`ConnectorError` as ``iter_rows`` does. A connector with a cheaper check of its
        own (an API's auth call and a count) overrides this."""
        import time

        report = IngestReport()
        started = time.monotonic()
        rows, complete = 0, True
        for _ in self.iter_rows(report):
            rows += 1
            if rows >= max_rows or time.monotonic() - started > seconds:
                complete = False
                break
        return ConnectionCheck(
            rows=rows, complete=complete, units_done=report.done, units_total=report.total, skipped=report.skipped[:20]
        )

    @abstractmethod
    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield every row of the source. Raises :class:`ConnectorError` when it cannot be read."""
