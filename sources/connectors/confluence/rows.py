"""One Confluence page -> a ``doc_page`` row and its ``doc_section`` rows; effective read principals.

Sections are cut by the docs connector's own functions (``sources.connectors.docs``: HTML
parsing, heading paths, merging of small sections, splitting of long ones), so a Confluence page
is split exactly like an HTML page in a docs folder.

Read restrictions are inherited in Confluence: a page is readable only by whoever every
restricted ancestor admits, and its own restriction narrows that further.
:func:`effective_principals` is the intersection of the restriction sets along the ancestor chain
(an unrestricted level admits everyone and drops out). Group membership is not known here, so a
user admitted by the child and a group admitted by the parent do not meet: the intersection is
exact for the principals named and errs towards closed. An empty intersection becomes one
principal nobody holds, never an empty list (which would mean "everyone").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bs4 import BeautifulSoup

from kbportal.emails import email_key
from sources.connectors.base import DocumentRow
from sources.connectors.docs.connector import (
    assign_heading_paths,
    link_sections,
    merge_small_sections,
    page_text,
    section_parts,
)
from sources.connectors.docs.sections import parse_page, render

# Storage-format elements that hold settings, not text (a code macro's language, a panel's colour).
_SETTING_TAGS = ("ac:parameter", "ri:attachment", "ri:user", "ri:page")


@dataclass
class Page:
    """A page as the connector saw it, whichever input it came from."""

    id: str
    title: str
    html: str  # storage format (XHTML with ac:/ri: elements) or an export's main-content HTML
    space: str = ""
    space_name: str = ""
    url: str = ""
    status: str = "current"
    version: int | None = None
    author: str = ""
    last_modifier: str = ""
    created: datetime | None = None
    updated: datetime | None = None
    ancestors: list[tuple[str, str]] = field(default_factory=list)  # (id, title), root first
    labels: list[str] = field(default_factory=list)
    restriction: frozenset[str] | None = None  # None: no read restriction of its own
    restriction_users: list[dict[str, Any]] = field(default_factory=list)  # its restriction's user objects


def effective_principals(page: Page, ancestor_restrictions: dict[str, frozenset[str] | None]) -> list[str]:
    """Who may read ``page``: ``[]`` (everyone with the source) when neither it nor an ancestor is
    restricted; else the sorted intersection of every restricted level's principals, or
    ``["confluence-page:<id>"]`` (held by nobody) when that intersection is empty."""
    levels = [ancestor_restrictions.get(aid) for aid, _ in page.ancestors] + [page.restriction]
    restricted = [level for level in levels if level is not None]
    if not restricted:
        return []
    allowed = frozenset.intersection(*restricted)
    return sorted(allowed) or [f"confluence-page:{page.id}"]


def user_principal(user: Any) -> str | None:
    """A restriction's user as a principal: ``email:<address>`` when Confluence shows the address
    (kbportal users match verified addresses), else ``confluence:<accountId or username>``."""
    if not isinstance(user, dict):
        return None
    email = email_key(str(user.get("email") or ""))
    if email:
        return f"email:{email}"
    ident = user.get("accountId") or user.get("username") or user.get("userKey")
    return f"confluence:{ident}" if ident else None


def storage_html(storage: str) -> str:
    """Storage-format XHTML with macro parameters and resource identifiers removed."""
    if "<ac:" not in storage and "<ri:" not in storage:
        return storage
    soup = BeautifulSoup(storage, "html.parser")
    for tag in soup.find_all(list(_SETTING_TAGS)):
        tag.decompose()
    return str(soup)


def page_rows(
    page: Page, principals: list[str], *, max_section_chars: int, min_section_chars: int
) -> list[DocumentRow]:
    """The page row then its section rows (external ids ``<id>`` and ``<id>#<heading/path>``)."""
    parsed = parse_page("html", storage_html(page.html))
    title = page.title
    assign_heading_paths(parsed.sections, title)
    sections = merge_small_sections(parsed.sections, min_section_chars)
    path = f"{page.space}/{page.id}" if page.space else page.id
    people = {
        "author": page.author,
        "last_modifier": page.last_modifier,
        # who_knows credits ``collaborators`` at half weight: whoever last edited someone else's page.
        "collaborators": [page.last_modifier] if page.last_modifier and page.last_modifier != page.author else [],
    }
    base_meta: dict[str, Any] = {
        "space": page.space,
        "space_name": page.space_name,
        "page_id": page.id,
        "page_title": title,
        **people,
    }
    rows: list[DocumentRow] = []
    bodies: list[str] = []
    for part in section_parts(sections, page.id, max_section_chars):
        bodies.append(part.body)
        rows.append(
            DocumentRow(
                external_id=part.external_id[:480],
                kind="doc_section",
                title=part.title,
                content=render(part.blocks),
                text=part.text,
                url=f"{page.url}#{part.anchor}" if page.url and part.anchor else page.url,
                path=path,
                parent_external_id=page.id,
                metadata={**base_meta, **part.metadata},
                principals=principals,
                created_at=page.created,
                updated_at=page.updated,
            )
        )
    link_sections(rows)
    page_row = DocumentRow(
        external_id=page.id,
        kind="doc_page",
        title=title,
        content=parsed.text,
        text=page_text(title, bodies),
        url=page.url,
        path=path,
        metadata={
            **base_meta,
            "format": "confluence",
            "status": page.status,
            "version": page.version,
            "ancestors": [t for _, t in page.ancestors],
            "ancestor_ids": [i for i, _ in page.ancestors],
            "labels": page.labels,
            "restricted": bool(principals),
            "sections": len(rows),
            "created": page.created.isoformat() if page.created else None,
            "updated": page.updated.isoformat() if page.updated else None,
        },
        principals=principals,
        created_at=page.created,
        updated_at=page.updated,
    )
    return [page_row, *rows]
