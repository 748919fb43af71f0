"""Confluence pages -> ``doc_page`` and ``doc_section`` rows, through the REST API or an HTML export.

REST (``base_url``), as Confluence's REST API (``/rest/api/content``, Cloud and Server) documents it:

- ``GET /rest/api/content?type=page&spaceKey=KEY&status=current&start=0&limit=N&expand=...``
  once per configured space (or once for every readable page), following ``_links.next`` (a path
  under ``base_url``; a next link to another host is refused, so credentials never leave the
  site). The expansions: ``body.storage`` (the page's XHTML), ``version`` (number, ``when``,
  ``by``), ``history`` (``createdBy``, ``createdDate``), ``ancestors``, ``space``,
  ``metadata.labels`` and ``restrictions.read.restrictions.user`` / ``.group``;
- ``GET /rest/api/content/{id}?expand=restrictions.read.restrictions.user,restrictions.read.restrictions.group``
  for an ancestor that the listing has not shown yet (another space, or listed later).

Every run lists every page: restrictions change without a new page version, and a child's
readers depend on its ancestors, so an incremental listing could keep a page open that a parent
has since closed. Unchanged pages cost a hash each and are not re-embedded.

Rows (see :mod:`.rows`): a ``doc_page`` row per page (external id = the page id) and its
``doc_section`` rows by heading; metadata ``space``, ``version``, ``author`` (creator),
``last_modifier``, ``collaborators``, ``ancestors``, ``labels``, ``status``; ``principals`` from
the page's and its ancestors' read restrictions (users as ``email:<address>`` or
``confluence:<accountId>``, groups as ``group:<name>``). A page whose answer lacks its id,
title, storage body or restrictions is ``report.skip``-ped with the reason.

Export (``path``): a folder from "Export space -> HTML": every ``*.html`` but ``index.html``
is a page; its id comes from the file name (``Title_65541.html`` or ``65541.html``), its
ancestors from the breadcrumbs, creator and last editor from the page-metadata line, the body
from ``#main-content``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bs4 import BeautifulSoup

from sources.connectors.atlassian.client import AtlassianClient, AtlassianError
from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport, json_object
from sources.connectors.confluence.config import ConfluenceConfig
from sources.connectors.confluence.rows import Page, effective_principals, page_rows, user_principal
from sources.connectors.files import FileRefused, read_bounded
from sources.connectors.jira.connector import parse_time

RESTRICTIONS = "restrictions.read.restrictions.user,restrictions.read.restrictions.group"
EXPAND = f"body.storage,version,history,ancestors,space,metadata.labels,{RESTRICTIONS}"
_EXPORT_ID = re.compile(r"(?:^|_)(\d+)\.html?$")
_EXPORT_DATE = re.compile(r"\bon ([A-Z][a-z]{2} \d{1,2}, \d{4})")


class MalformedPage(ValueError):
    """One page cannot be made rows; the message says which field and why."""


class ConfluenceConnector(Connector):
    """Confluence pages; see the module docstring for the calls and :mod:`.rows` for the rows."""

    kind = "confluence"
    config_model = ConfluenceConfig
    config: ConfluenceConfig

    def __init__(self, config: dict[str, Any], *, include=None, exclude=None) -> None:
        super().__init__(config, include=include, exclude=exclude)
        self._client: AtlassianClient | None = None
        self.restrictions: dict[str, frozenset[str] | None] = {}  # page id -> its own read restriction

    @property
    def client(self) -> AtlassianClient:
        if self._client is None:
            self._client = AtlassianClient.from_config(self.config, product="Confluence")
        return self._client

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield each page's row then its section rows. Raises ``ConnectorError`` when the site or
        folder cannot be read (bad token, unknown space, rate limit beyond the allowed wait)."""
        pages = self._export_pages(report) if self.config.path else self._api_pages()
        seen: set[str] = set()
        for label, page in pages:
            report.advance()
            if isinstance(page, MalformedPage):
                report.skip(label, str(page))
                continue
            if page.id in seen:
                continue
            seen.add(page.id)
            if not self.path_allowed(f"{page.space}/{page.title}"):
                continue
            principals = effective_principals(page, self._ancestor_restrictions(page))
            self._record_people(page, principals)
            yield from page_rows(
                page,
                principals,
                max_section_chars=self.config.max_section_chars,
                min_section_chars=self.config.min_section_chars,
            )

        if not self.config.path:
            self._read_groups(report)

    def _record_people(self, page: Page, principals: list[str]) -> None:
        """Put the users of the page's own read restriction and the groups of its effective one
        (``principals``, which may come from an ancestor) in ``self.directory``."""
        for user in page.restriction_users:
            principal = user_principal(user)
            if principal:
                self.directory.person(principal, email=str(user.get("email") or ""), name=display_name(user))
        for principal in principals:
            if principal.startswith("group:"):
                self.directory.group(principal, name=principal.removeprefix("group:"))

    def _read_groups(self, report: IngestReport) -> None:
        """Read the members of every group a restriction named (``GET /rest/api/group/member?name=``,
        paged), into ``self.directory``. A group whose members cannot be read (no permission, a
        group that is gone) is kept with no members and ``report.skip``-ped: nobody is then taken
        to be in it, here or through another source exposing the same name, so its pages stay
        closed to everyone but the users they name."""
        for principal in sorted(self.directory.groups):
            name = principal.removeprefix("group:")
            members: set[str] = set()
            url: str = "/rest/api/group/member"
            params: dict[str, Any] | None = {"name": name, "start": 0, "limit": self.config.page_size}
            try:
                while url:
                    answer = self.client.get_json(url, params)
                    if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
                        raise ConnectorError(f"Confluence group {name!r} members: expected an object with 'results'")
                    for user in answer["results"]:
                        member = user_principal(user)
                        if member:
                            members.add(member)
                            self.directory.person(member, email=str(user.get("email") or ""), name=display_name(user))
                    url, params = self._next(answer), None
            except AtlassianError as exc:
                if exc.status not in (403, 404):
                    raise
                # Kept with no members: a source exposing the name it cannot vouch for keeps the
                # group closed everywhere (``sources.selectors.directory_principals``).
                self.directory.groups[principal].members.clear()
                reason = f"its members could not be read (HTTP {exc.status}); nobody is taken to be in it"
                report.skip(principal, reason)
                continue
            self.directory.group(principal, name=name, members=members)

    # -- REST -----------------------------------------------------------------------------------

    def _api_pages(self) -> Iterator[tuple[str, Page | MalformedPage]]:
        spaces: list[str | None] = list(self.config.space or []) or [None]
        for space in spaces:
            first: dict[str, Any] = {
                "type": "page",
                "status": "current",
                "start": 0,
                "limit": self.config.page_size,
                "expand": EXPAND,
            }
            if space:
                first["spaceKey"] = space
            params: dict[str, Any] | None = first
            url = "/rest/api/content"
            while url:
                answer = self.client.get_json(url, params)
                if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
                    raise ConnectorError(f"Confluence {url.split('?')[0]}: expected an object with 'results'")
                for number, item in enumerate(answer["results"]):
                    label = str(item.get("id") or item.get("title")) if isinstance(item, dict) else ""
                    label = label or f"result {int(answer.get('start') or 0) + number + 1}"
                    try:
                        page = self._api_page(item)
                    except MalformedPage as exc:
                        yield label, exc
                        continue
                    self.restrictions[page.id] = page.restriction
                    yield label, page
                url, params = self._next(answer), None

    def _next(self, answer: dict[str, Any]) -> str:
        """The next page of the listing as a URL under ``base_url``, ``""`` at the end."""
        following = (answer.get("_links") or {}).get("next")
        if not following:
            return ""
        if following.startswith(("https://", "http://")):
            if urlsplit(following).netloc != urlsplit(self.client.base_url).netloc:
                raise ConnectorError(
                    f"Confluence's next link points to another host ({urlsplit(following).netloc}); not followed"
                )
            return following
        return following if following.startswith("/") else f"/{following}"

    def _api_page(self, item: Any) -> Page:
        if not isinstance(item, dict):
            raise MalformedPage("not a JSON object")
        page_id, title = item.get("id"), item.get("title")
        if not isinstance(page_id, str | int) or not str(page_id).strip():
            raise MalformedPage("no 'id'")
        if not isinstance(title, str) or not title.strip():
            raise MalformedPage("no 'title'")
        storage = ((item.get("body") or {}).get("storage") or {}).get("value")
        if not isinstance(storage, str):
            raise MalformedPage("no 'body.storage.value' (was body.storage expanded?)")
        restrictions = item.get("restrictions")
        if not isinstance(restrictions, dict) or not isinstance(restrictions.get("read"), dict):
            # Without the restrictions the page's readers are unknown: never guess "everyone".
            raise MalformedPage("no 'restrictions.read' (was it expanded?)")
        version = json_object(item.get("version"))
        history = json_object(item.get("history"))
        space = json_object(item.get("space"))
        ancestors = [
            (str(a.get("id")), str(a.get("title") or ""))
            for a in item.get("ancestors") or []
            if isinstance(a, dict) and a.get("id") is not None
        ]
        labels = ((item.get("metadata") or {}).get("labels") or {}).get("results") or []
        webui = (item.get("_links") or {}).get("webui") or ""
        number = version.get("number")
        return Page(
            id=str(page_id).strip(),
            title=title.strip(),
            html=storage,
            space=str(space.get("key") or ""),
            space_name=str(space.get("name") or ""),
            url=f"{self.client.base_url}{webui}" if webui else "",
            status=str(item.get("status") or ""),
            version=number if isinstance(number, int) else None,
            author=display(history.get("createdBy")),
            last_modifier=display(version.get("by")),
            created=parse_time(history.get("createdDate")),
            updated=parse_time(version.get("when")) or parse_time(history.get("createdDate")),
            ancestors=ancestors,
            labels=[str(lb.get("name")) for lb in labels if isinstance(lb, dict) and lb.get("name")],
            restriction=read_restriction(restrictions),
            restriction_users=[
                u
                for u in (((restrictions.get("read") or {}).get("restrictions") or {}).get("user") or {}).get("results")
                or []
                if isinstance(u, dict)
            ],
        )

    def _ancestor_restrictions(self, page: Page) -> dict[str, frozenset[str] | None]:
        """Each ancestor's own read restriction, fetched once per run for one not listed yet."""
        for ancestor_id, _ in page.ancestors:
            if ancestor_id in self.restrictions or self.config.path:
                continue
            try:
                answer = self.client.get_json(f"/rest/api/content/{ancestor_id}", {"expand": RESTRICTIONS})
                restriction = read_restriction((answer or {}).get("restrictions"))
            except AtlassianError as exc:
                if exc.status not in (403, 404):
                    raise
                restriction = frozenset()  # an ancestor we may not see: its children stay closed
            except MalformedPage:
                restriction = frozenset()
            self.restrictions[ancestor_id] = restriction
        return self.restrictions

    # -- export ---------------------------------------------------------------------------------

    def _export_pages(self, report: IngestReport) -> Iterator[tuple[str, Page | MalformedPage]]:
        root = Path(self.config.path or "").expanduser()
        if not root.is_dir():
            raise ConnectorError(f"Confluence export folder {root} does not exist or is not a folder")
        files = sorted(
            str(Path(folder, name).relative_to(root))
            for folder, dirs, names in os.walk(root)
            for name in names
            if name.lower().endswith((".html", ".htm")) and name.lower() != "index.html" and not name.startswith(".")
        )
        if not files:
            raise ConnectorError(f"Confluence export folder {root} holds no .html pages")
        report.total = len(files)
        report.unit = "files"
        space_key = self.config.space[0] if self.config.space else ""
        for relpath in files:
            full = root / relpath
            if full.is_symlink():
                yield relpath, MalformedPage("symbolic link; not followed")
                continue
            try:
                html = read_bounded(full, self.config.max_file_bytes).decode("utf-8")
            except FileRefused as exc:
                yield relpath, MalformedPage(exc.reason)
                continue
            except (OSError, UnicodeDecodeError) as exc:
                yield relpath, MalformedPage(f"cannot be read as UTF-8: {exc}")
                continue
            try:
                yield relpath, export_page(relpath, html, space_key=space_key)
            except MalformedPage as exc:
                yield relpath, exc


def export_page(relpath: str, html: str, *, space_key: str = "") -> Page:
    """A :class:`Page` from one file of an HTML space export. Raises :class:`MalformedPage`."""
    found = _EXPORT_ID.search(Path(relpath).name)
    if not found:
        raise MalformedPage("the file name carries no page id (expected Title_<id>.html)")
    soup = BeautifulSoup(html, "html.parser")
    main = soup.find(id="main-content")
    if main is None:
        raise MalformedPage("no #main-content element: not a page of a Confluence HTML export")
    crumbs = [
        (a.get("href") or "", " ".join(a.get_text(" ").split())) for a in soup.select("#breadcrumbs a") if a.get_text()
    ]
    space_name = crumbs[0][1] if crumbs else ""
    ancestors = []
    for href, text in crumbs[1:]:
        crumb_id = _EXPORT_ID.search(str(href))
        if crumb_id:
            ancestors.append((crumb_id.group(1), text))
    heading = soup.find(id="title-text") or soup.title
    title = " ".join(heading.get_text(" ").split()) if heading else ""
    if space_name and title.startswith(f"{space_name} : "):
        title = title[len(space_name) + 3 :]
    if not title:
        raise MalformedPage("no page title")
    meta = soup.select_one(".page-metadata")
    author = editor = ""
    updated = None
    if meta is not None:
        author_tag, editor_tag = meta.select_one(".author"), meta.select_one(".editor")
        author = " ".join(author_tag.get_text(" ").split()) if author_tag else ""
        editor = " ".join(editor_tag.get_text(" ").split()) if editor_tag else author
        when = _EXPORT_DATE.search(meta.get_text(" "))
        if when:
            updated = datetime.strptime(when.group(1), "%b %d, %Y").replace(tzinfo=UTC)
    return Page(
        id=found.group(1),
        title=title,
        html=main.decode_contents(),
        space=space_key or space_name,
        space_name=space_name,
        url=relpath,
        version=None,
        author=author,
        last_modifier=editor,
        updated=updated,
        ancestors=ancestors,
    )


def read_restriction(restrictions: Any) -> frozenset[str] | None:
    """A page's own read restriction from ``restrictions`` (the expanded ``restrictions`` object):
    ``None`` when it names no user and no group, else the principals it admits.
    Raises :class:`MalformedPage` when ``read`` is missing."""
    read = restrictions.get("read") if isinstance(restrictions, dict) else None
    if not isinstance(read, dict):
        raise MalformedPage("no 'restrictions.read'")
    # Fail closed on any other shape: a page whose restriction cannot be read is skipped, never
    # stored as open (a server that ignored the deep expand answers read without its lists).
    inner = read.get("restrictions")
    if not isinstance(inner, dict):
        raise MalformedPage("no 'restrictions.read.restrictions' (were its user and group expanded?)")
    lists = []
    for kind in ("user", "group"):
        block = inner.get(kind)
        results = block.get("results") if isinstance(block, dict) else None
        if not isinstance(results, list):
            raise MalformedPage(f"no 'restrictions.read.restrictions.{kind}.results' list")
        lists.append(results)
    users, groups = lists
    allowed = {p for p in (user_principal(u) for u in users) if p}
    allowed |= {f"group:{g['name']}" for g in groups if isinstance(g, dict) and g.get("name")}
    if not users and not groups:
        return None
    return frozenset(allowed)


def display_name(user: Any) -> str:
    """A Confluence user's name (``displayName``, else ``publicName``, else ``username``)."""
    if not isinstance(user, dict):
        return ""
    return str(user.get("displayName") or user.get("publicName") or user.get("username") or "").strip()


def display(user: Any) -> str:
    """``Display Name <email>`` from a Confluence user object (``displayName``/``publicName``,
    ``email`` when shown); ``""`` for none or an anonymous user."""
    if not isinstance(user, dict):
        return ""
    name = str(user.get("displayName") or user.get("publicName") or user.get("username") or "").strip()
    email = str(user.get("email") or "").strip()
    if name and email:
        return f"{name} <{email}>"
    return name or email
