"""Jira issues -> ``ticket`` rows, through the REST API or from a CSV export.

REST (``base_url`` set, no ``path``), as Jira's REST API v2/v3 documents it:

- ``GET /rest/api/{2|3}/search?jql=...&startAt=&maxResults=&fields=...``, page by page by
  ``startAt`` (advanced by the number of issues each page returned, since Jira may return fewer
  than asked) until ``total`` is reached or a page is empty. The JQL is
  ``project in (...) AND (<jql>) AND updated >= "yyyy/MM/dd HH:mm" ORDER BY updated ASC, key ASC``
  (each part only when configured / incremental);
- ``GET /rest/api/{v}/issue/{key}/comment?startAt=&maxResults=`` when the search embedded
  fewer comments than the issue's ``comment.total``.

CSV (``path``): a file from the issue navigator's "Export CSV". Repeated columns (``Labels``,
``Comment``, ``Component/s``) are read as lists; a comment cell is
``date;author;body`` as Jira writes it. Every CSV run is a full run.

One row per issue, ``external_id`` = the issue id (stable when an issue moves and changes key;
the key when there is no id). Title ``KEY: summary``; content = the title, the description, the
environment, then each comment as ``Name (YYYY-MM-DD HH:MM): text`` in time order (the shape
``who_knows`` reads commenters from). Metadata: ``key``, ``project``, ``issue_type``, ``status``,
``resolution``, ``priority``, ``assignee``, ``reporter`` (``Display Name <email>`` when Jira
shows the address, else the display name: ``who_knows`` credits both in full), ``labels``,
``components``, ``commenters`` (other people, first appearance order; half credit),
``security_level``, ``created``, ``updated``. ``url`` = ``{base_url}/browse/KEY``. An issue with
a security level is readable by ``security_principals[level]`` when the source lists the level,
else (REST) by the level's members as Jira states them (``sources.connectors.jira.security``),
else by nobody.

Incremental runs: the ingestion service hands :meth:`JiraConnector.resume_from` the newest stored
``updated_at``; issues are listed oldest update first, so a run that stops half-way stored a
prefix and the cursor stays right. An issue without a key or summary, or with a field of the wrong
shape, is ``report.skip``-ped with the reason; the rest are ingested.
"""

from __future__ import annotations

import codecs
import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from sources.connectors.atlassian.client import AtlassianClient
from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.files import FileRefused, FileTooLarge, iter_lines_bounded, open_regular
from sources.connectors.jira.config import JiraConfig
from sources.connectors.jira.security import LEVEL_PREFIX, SecurityLevels, user_principal

FIELDS = (
    "summary",
    "description",
    "environment",
    "status",
    "priority",
    "assignee",
    "reporter",
    "labels",
    "components",
    "issuetype",
    "project",
    "created",
    "updated",
    "resolution",
    "security",
    "comment",
)
COMMENT_PAGE = 100
_ORDER_BY = re.compile(r"\border\s+by\b.*$", re.IGNORECASE | re.DOTALL)
# Jira's CSV export writes dates in the site's format, "18/Mar/25 9:12 AM" by default.
_CSV_DATE_FORMATS = ("%d/%b/%y %I:%M %p", "%d/%b/%Y %I:%M %p", "%d/%b/%y %H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")


class MalformedIssue(ValueError):
    """One issue cannot be made a row; the message says which field and why."""


@dataclass
class Comment:
    author: str
    created: datetime | None
    body: str


@dataclass
class Issue:
    """One issue, whichever input it came from."""

    id: str
    key: str
    summary: str
    description: str = ""
    environment: str = ""
    project: str = ""
    issue_type: str = ""
    status: str = ""
    resolution: str = ""
    priority: str = ""
    assignee: str = ""
    reporter: str = ""
    labels: list[str] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    security_level: str = ""
    security_level_id: str = ""
    reporter_principal: str = ""
    assignee_principal: str = ""
    created: datetime | None = None
    updated: datetime | None = None
    comments: list[Comment] = field(default_factory=list)


class JiraConnector(Connector):
    """Jira issues as ``ticket`` rows; see the module docstring for the calls and the row shape."""

    kind = "jira"
    config_model = JiraConfig
    config: JiraConfig

    def __init__(self, config: dict[str, Any], *, include=None, exclude=None) -> None:
        super().__init__(config, include=include, exclude=exclude)
        self._client: AtlassianClient | None = None
        self.since: datetime | None = None
        self._levels: SecurityLevels | None = None
        self._stored_levels: set[str] = set()

    @property
    def client(self) -> AtlassianClient:
        if self._client is None:
            self._client = AtlassianClient.from_config(self.config, product="Jira")
        return self._client

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:
        """Note the security levels the source stored before (their group principals), which an
        incremental run reads again (``sources.connectors.jira.security``)."""
        from kbportal.tenancy import tenant_context
        from sources.models import ExternalGroup

        with tenant_context(tenant_id):
            self._stored_levels = set(
                ExternalGroup.objects.filter(source_id=source_id, principal__startswith=LEVEL_PREFIX).values_list(
                    "principal", flat=True
                )
            )

    def resume_from(self, cursor: datetime | None) -> bool:
        """Take the source's cursor (newest stored ``updated_at``; ``None`` when it has no rows).

        Returns true when this run reads only issues updated at or after ``cursor`` less
        ``overlap_minutes`` (so the rows it does not yield must be kept); false for a full run
        (no cursor, ``incremental: false``, or a CSV file).
        """
        if self.config.path or not self.config.incremental or cursor is None:
            self.since = None
            return False
        self.since = cursor - timedelta(minutes=self.config.overlap_minutes)
        return True

    def jql(self) -> str:
        """The JQL this run searches with (see the module docstring)."""
        clauses = []
        if self.config.project:
            clauses.append(f"project in ({', '.join(self.config.project)})")
        user = _ORDER_BY.sub("", self.config.jql).strip()
        if user:
            clauses.append(f"({user})")
        if self.since is not None:
            clauses.append(f'updated >= "{self.since.astimezone(UTC):%Y/%m/%d %H:%M}"')
        return " AND ".join(clauses) + (" " if clauses else "") + "ORDER BY updated ASC, key ASC"

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield one ``ticket`` row per issue. Raises ``ConnectorError`` when the site or file cannot
        be read (bad token, unknown project, rate limit beyond the allowed wait, missing file)."""
        issues = self._csv_issues(report) if self.config.path else self._api_issues(report)
        if not self.config.path:
            api = f"/rest/api/{self.config.api_version}"
            self._levels = SecurityLevels(self.client, api, self.config.base_url or "", self.directory, report)
        seen: set[str] = set()
        for label, issue in issues:
            if isinstance(issue, MalformedIssue):
                report.skip(label, str(issue))
                report.advance()
                continue
            # An issue updated while the run pages moves to the end of the order and comes twice.
            if issue.id in seen:
                continue
            seen.add(issue.id)
            report.advance()
            yield self._row(issue)
        if self._levels is not None:
            # An incremental run re-reads the levels stored before too: their members may have
            # changed although no issue did. A full run sees every issue, so every level in use.
            self._levels.finish(self._stored_levels if self.since is not None else set())

    # -- REST -----------------------------------------------------------------------------------

    def _api_issues(self, report: IngestReport) -> Iterator[tuple[str, Issue | MalformedIssue]]:
        api = f"/rest/api/{self.config.api_version}"
        start = 0
        while True:
            params = {
                "jql": self.jql(),
                "startAt": start,
                "maxResults": self.config.page_size,
                "fields": ",".join(FIELDS),
            }
            page = self.client.get_json(f"{api}/search", params)
            if not isinstance(page, dict) or not isinstance(page.get("issues"), list):
                raise ConnectorError(
                    f"Jira search at {self.client.base_url}{api}/search: expected an object with 'issues'"
                )
            items = page["issues"]
            total = page.get("total")
            if report.total is None and isinstance(total, int) and not isinstance(total, bool) and total >= 0:
                report.total = total
                report.unit = "issues"
            for number, item in enumerate(items):
                label = (
                    str(item.get("key") or item.get("id") or f"search result {start + number + 1}")
                    if isinstance(item, dict)
                    else f"search result {start + number + 1}"
                )
                try:
                    issue = self._api_issue(item, api)
                except MalformedIssue as exc:
                    yield label, exc
                    continue
                yield label, issue
            start += len(items)
            total = page.get("total")
            if not items or (isinstance(total, int) and start >= total):
                return

    def _api_issue(self, item: Any, api: str) -> Issue:
        if not isinstance(item, dict):
            raise MalformedIssue("not a JSON object")
        key = item.get("key")
        fields = item.get("fields")
        if not isinstance(key, str) or not key.strip():
            raise MalformedIssue("no 'key'")
        if not isinstance(fields, dict):
            raise MalformedIssue("no 'fields' object")
        summary = fields.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise MalformedIssue("no 'fields.summary'")
        for name in ("labels", "components"):
            if fields.get(name) is not None and not isinstance(fields.get(name), list):
                raise MalformedIssue(f"'fields.{name}' is not a list")
        issue = Issue(
            id=str(item.get("id") or key),
            key=key.strip(),
            summary=summary.strip(),
            description=rich_text(fields.get("description")),
            environment=rich_text(fields.get("environment")),
            project=_name(fields.get("project"), "key"),
            issue_type=_name(fields.get("issuetype")),
            status=_name(fields.get("status")),
            resolution=_name(fields.get("resolution")),
            priority=_name(fields.get("priority")),
            assignee=person(fields.get("assignee")),
            reporter=person(fields.get("reporter")),
            labels=[str(v) for v in fields.get("labels") or [] if v],
            components=[_name(c) for c in fields.get("components") or [] if _name(c)],
            security_level=_security_level(fields.get("security")),
            security_level_id=_security_level_id(fields.get("security")),
            reporter_principal=user_principal(fields.get("reporter"), self.directory),
            assignee_principal=user_principal(fields.get("assignee"), self.directory),
            created=parse_time(fields.get("created")),
            updated=parse_time(fields.get("updated")),
        )
        block = fields.get("comment")
        if block is not None and not isinstance(block, dict):
            raise MalformedIssue("'fields.comment' is not an object")
        block = block or {}
        comments = [c for c in block.get("comments") or [] if isinstance(c, dict)]
        total = block.get("total")
        if isinstance(total, int) and total > len(comments):
            comments = list(self._all_comments(api, issue.key))
        issue.comments = [
            Comment(author=person(c.get("author")), created=parse_time(c.get("created")), body=rich_text(c.get("body")))
            for c in comments
        ]
        return issue

    def _all_comments(self, api: str, key: str) -> Iterator[dict[str, Any]]:
        start = 0
        while True:
            page = self.client.get_json(f"{api}/issue/{key}/comment", {"startAt": start, "maxResults": COMMENT_PAGE})
            items = page.get("comments") if isinstance(page, dict) else None
            if not isinstance(items, list):
                raise MalformedIssue(f"the comments of {key} are not a list")
            yield from (c for c in items if isinstance(c, dict))
            start += len(items)
            total = page.get("total")
            if not items or (isinstance(total, int) and start >= total):
                return

    # -- CSV ------------------------------------------------------------------------------------

    def _csv_issues(self, report: IngestReport) -> Iterator[tuple[str, Issue | MalformedIssue]]:
        path = Path(self.config.path or "").expanduser()
        if not path.is_file():
            raise ConnectorError(f"Jira CSV export {path} does not exist or is not a file")
        try:
            handle = open_regular(path, follow_symlinks=True)
        except FileRefused as exc:
            raise ConnectorError(f"Jira CSV export {path} is not read: {exc.reason}") from None
        except OSError as exc:
            raise ConnectorError(f"Jira CSV export {path} cannot be read: {exc}") from None
        # A cell may be as long as a line may (csv's own default stops at 128 KiB); raised only,
        # process-wide, as the limit is the csv module's.
        csv.field_size_limit(max(csv.field_size_limit(), self.config.max_file_bytes))
        # Read record by record: an export of any size holds one record in memory at a time.
        with handle:
            reader = csv.reader(self._csv_lines(path, handle))
            try:
                yield from self._csv_rows(path, reader)
            except csv.Error as exc:
                raise ConnectorError(
                    f"Jira CSV export {path} is not valid CSV at line {reader.line_num}: {exc}"
                ) from None

    def _csv_lines(self, path: Path, handle: IO[bytes]) -> Iterator[str]:
        """The export's lines, decoded one ``\\n`` line at a time and split as ``str.splitlines``
        does (old Mac and Excel exports end lines with a bare ``\\r``); ``ConnectorError`` naming
        the line when one is not UTF-8 or is over ``max_file_bytes``."""
        limit = self.config.max_file_bytes
        for lineno, raw in iter_lines_bounded(handle, limit):
            if isinstance(raw, FileTooLarge):
                raise ConnectorError(
                    f"Jira CSV export {path} line {lineno} is not read: it is {raw.size} bytes, "
                    f"over max_file_bytes ({limit})"
                )
            bom = len(codecs.BOM_UTF8) if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else 0
            try:
                text = raw[bom:].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConnectorError(
                    f"Jira CSV export {path} line {lineno} is not UTF-8: invalid byte 0x{raw[bom + exc.start]:02x} "
                    f"at column {exc.start + 1}"
                ) from None
            yield from text.splitlines(keepends=True)

    def _csv_rows(self, path: Path, reader: Any) -> Iterator[tuple[str, Issue | MalformedIssue]]:
        header = next(reader, None)
        if not header:
            raise ConnectorError(f"Jira CSV export {path} is empty")
        header = [h.strip() for h in header]
        if "Issue key" not in header or "Summary" not in header:
            raise ConnectorError(f"Jira CSV export {path}: the header has no 'Issue key' or 'Summary' column")
        end = reader.line_num
        for values in reader:
            line, end = end + 1, reader.line_num  # the record's first line (a cell may span lines)
            if not any(v.strip() for v in values):
                continue
            cells: dict[str, list[str]] = {}
            for name, value in zip(header, values, strict=False):
                if value.strip():
                    cells.setdefault(name, []).append(value.strip())
            label = (cells.get("Issue key") or [f"{path.name} line {line}"])[0]
            if len(values) > len(header):
                yield label, MalformedIssue(f"line {line} has {len(values)} cells, the header {len(header)}")
                continue
            try:
                yield label, _csv_issue(cells)
            except MalformedIssue as exc:
                yield label, MalformedIssue(f"line {line}: {exc}")

    # -- row ------------------------------------------------------------------------------------

    def _row(self, issue: Issue) -> DocumentRow:
        title = f"{issue.key}: {issue.summary}"
        comments = sorted(issue.comments, key=lambda c: c.created or datetime.min.replace(tzinfo=UTC))
        lines = [
            f"{_shown_name(c.author)} ({c.created:%Y-%m-%d %H:%M}): {_one_line(c.body)}"
            if c.created
            else f"{_shown_name(c.author)}: {_one_line(c.body)}"
            for c in comments
            if c.body.strip()
        ]
        parts = [title, issue.description.strip()]
        if issue.environment.strip():
            parts.append(f"Environment: {issue.environment.strip()}")
        if lines:
            parts.append("Comments:\n" + "\n".join(lines))
        people = {issue.reporter, issue.assignee}
        metadata: dict[str, Any] = {
            "key": issue.key,
            "project": issue.project or issue.key.rsplit("-", 1)[0],
            "issue_type": issue.issue_type,
            "status": issue.status,
            "resolution": issue.resolution,
            "priority": issue.priority,
            "assignee": issue.assignee,
            "reporter": issue.reporter,
            "labels": _unique(issue.labels),
            "components": _unique(issue.components),
            "commenters": _unique(c.author for c in comments if c.author not in people),
            "security_level": issue.security_level,
            "created": issue.created.isoformat() if issue.created else None,
            "updated": issue.updated.isoformat() if issue.updated else None,
        }
        principals: list[str] = []
        if issue.security_level:
            principals = list(self.config.security_principals.get(issue.security_level) or [])
            if not principals and self._levels is not None and issue.security_level_id:
                principals = self._levels.principals(
                    level_id=issue.security_level_id,
                    level_name=issue.security_level,
                    project=issue.project or issue.key.rsplit("-", 1)[0],
                    reporter=issue.reporter_principal,
                    assignee=issue.assignee_principal,
                )
            principals = principals or [f"jira-security-level:{issue.security_level}"]  # nobody holds it
        return DocumentRow(
            external_id=issue.id,
            kind="ticket",
            title=title,
            content="\n\n".join(p for p in parts if p),
            url=f"{self.config.base_url}/browse/{issue.key}" if self.config.base_url else "",
            metadata=metadata,
            principals=principals,
            created_at=issue.created,
            updated_at=issue.updated or issue.created,
        )


def _csv_issue(cells: dict[str, list[str]]) -> Issue:
    def one(name: str) -> str:
        return (cells.get(name) or [""])[0]

    key, summary = one("Issue key"), one("Summary")
    if not key:
        raise MalformedIssue("no 'Issue key'")
    if not summary:
        raise MalformedIssue("no 'Summary'")
    comments = []
    for cell in cells.get("Comment", []):
        when, _, rest = cell.partition(";")
        author, _, body = rest.partition(";")
        created = parse_time(when)
        if created is None or not body:  # not "date;author;body": the whole cell is the text
            comments.append(Comment(author="", created=None, body=cell))
        else:
            comments.append(Comment(author=author.strip(), created=created, body=body))
    return Issue(
        id=one("Issue id") or key,
        key=key,
        summary=summary,
        description=one("Description"),
        environment=one("Environment"),
        project=one("Project key"),
        issue_type=one("Issue Type"),
        status=one("Status"),
        resolution=one("Resolution"),
        priority=one("Priority"),
        assignee=one("Assignee"),
        reporter=one("Reporter"),
        labels=cells.get("Labels", []),
        components=cells.get("Component/s", []),
        security_level=one("Security Level"),
        created=parse_time(one("Created")),
        updated=parse_time(one("Updated")),
        comments=comments,
    )


def person(user: Any) -> str:
    """``Display Name <email>`` from a Jira user object (``displayName``, ``emailAddress``; Server's
    ``name`` or Cloud's ``accountId`` when nothing else is shown); ``""`` for none."""
    if not isinstance(user, dict):
        return ""
    name = str(user.get("displayName") or user.get("name") or user.get("accountId") or "").strip()
    email = str(user.get("emailAddress") or "").strip()
    if name and email:
        return f"{name} <{email}>"
    return name or email


def rich_text(value: Any) -> str:
    """Plain text of a v2 field (wiki-markup string) or a v3 field (Atlassian Document Format)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _adf_text(value).strip()
    raise MalformedIssue(f"expected text or an ADF document, got {type(value).__name__}")


_ADF_BLOCKS = {"paragraph", "heading", "codeBlock", "blockquote", "listItem", "rule", "panel", "tableRow"}


def _adf_text(node: dict[str, Any]) -> str:
    """Text of an Atlassian Document Format node: text nodes joined, blocks on their own lines."""
    kind = node.get("type")
    if kind == "text":
        return str(node.get("text") or "")
    if kind == "hardBreak":
        return "\n"
    if kind == "mention":
        return str((node.get("attrs") or {}).get("text") or "")
    inner = "".join(_adf_text(c) for c in node.get("content") or [] if isinstance(c, dict))
    if kind == "listItem":
        inner = "- " + inner.strip()
    return inner.strip("\n") + "\n" if kind in _ADF_BLOCKS else inner


def parse_time(value: Any) -> datetime | None:
    """A UTC-aware datetime from Jira's ``2025-03-18T09:12:00.000+0000`` or a CSV export's
    ``18/Mar/25 9:12 AM`` (naive times are taken as UTC); ``None`` for a missing or bad value."""
    if not value or not isinstance(value, str):
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
        for fmt in _CSV_DATE_FORMATS:
            try:
                parsed = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
    if parsed is None:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _name(value: Any, key: str = "name") -> str:
    if isinstance(value, dict):
        return str(value.get(key) or value.get("name") or value.get("value") or "").strip()
    return str(value).strip() if isinstance(value, str) else ""


def _security_level(value: Any) -> str:
    """The issue's security level name; a level present but unnamed (an object with only an id, a
    bare id) is still a level, named by what it has, so the issue stays closed rather than open."""
    if value is None or value == "" or value == {}:
        return ""
    name = _name(value)
    if name:
        return name
    ident = value.get("id") if isinstance(value, dict) else value
    return f"id:{ident}" if isinstance(ident, (str, int)) and str(ident).strip() else "unnamed"


def _security_level_id(value: Any) -> str:
    """The issue's security level id (``fields.security.id``); ``""`` when there is none."""
    ident = value.get("id") if isinstance(value, dict) else None
    return str(ident).strip() if isinstance(ident, (str, int)) else ""


def _shown_name(author: str) -> str:
    """The display name of ``Name <email>`` (the content shows names; metadata keeps the address)."""
    return author.split(" <", 1)[0].strip() or "Anonymous"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _unique(values: Any) -> list[str]:
    return [v for v in dict.fromkeys(values) if v]
