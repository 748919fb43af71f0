"""Rows of the unified table as search results (:class:`Hit`), the scope's SQL condition, and links."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from django.db import connection

from sources.selectors import QueryScope

FILE_KINDS = {"code_file", "doc_page"}
CHUNK_KINDS = {"code_chunk", "doc_section"}


THREAD_KINDS = {"thread", "conversation"}  # the bursts (children) of one merge into it


_EXTERNAL_SCHEMES = ("http://", "https://", "mailto:")


def safe_link(url: str) -> str:
    """``url`` when it may go in ``href`` as it is (http, https, mailto), else ``""``: a
    ``javascript:`` or ``data:`` URL from a source never becomes a link."""
    value = (url or "").strip()
    return value if value.lower().startswith(_EXTERNAL_SCHEMES) else ""


def portal_link(url: str, source_public_id: str, external_id: str, start_line: int | None = None) -> str:
    """The link for a row: its http(s) url, else the portal's page for the document (with a
    ``#L<n>`` anchor for code). Relative paths and ``slack://`` links resolve nowhere in a
    browser, so they go to the page that shows the row's content. With ``KB_PUBLIC_URL`` set
    (e.g. ``https://kb.example.com``) portal links are absolute, so API and MCP clients can
    open them."""
    external = safe_link(url)
    if external or not source_public_id:
        return external
    from django.conf import settings
    from django.urls import reverse

    anchor = f"#L{start_line}" if start_line else ""
    path = f"{reverse('search:document', args=[source_public_id])}?id={quote(external_id, safe='')}{anchor}"
    return settings.KB_PUBLIC_URL.rstrip("/") + path


@dataclass
class Hit:
    """One search result: a row of the unified table with its fused score and per-ranker ranks."""

    document_id: int
    source_id: int
    kind: str
    title: str
    url: str
    path: str
    start_line: int | None
    end_line: int | None
    content: str
    text: str
    metadata: dict[str, Any]
    updated_at: datetime | None
    parent_id: int | None
    external_id: str
    source_public_id: str = ""
    score: float = 0.0
    ranks: dict[str, int] = field(default_factory=dict)
    similarity: float | None = None  # cosine similarity from the dense ranker, when it ranked the row
    context: str = ""  # neighbouring context (adjacent sections, enclosing signature, parent thread)
    duplicates: list[str] = field(default_factory=list)  # external ids of near-duplicates folded into it

    @property
    def link(self) -> str:
        """Where a click goes: the original http(s) url, else the portal's document page."""
        return portal_link(self.url, self.source_public_id, self.external_id, self.start_line)

    @property
    def group_key(self) -> str:
        """What the hit merges into: its file or page (by path), else the row itself."""
        if self.path and (self.kind in FILE_KINDS or self.kind in CHUNK_KINDS):
            return f"{self.source_id}:{self.path}"
        if self.kind == "burst" and self.parent_id:
            return f"doc:{self.parent_id}"  # a burst merges with its thread or conversation
        return f"doc:{self.document_id}"


@dataclass
class SearchResult:
    hits: list[Hit]
    timings_ms: dict[str, float]
    rankers: tuple[str, ...]
    reranked_by: str = ""  # "llm", "fusion", "fusion (llm failed)"; empty without rerank


def scope_where_sql(scope: QueryScope, kinds: Sequence[str] | None) -> tuple[str, dict[str, Any]]:
    """SQL condition on ``sources_document d`` (and its named params) for what ``scope`` may read:
    its tenant, its allowed sources, rows whose principals admit the asker, optional kinds."""
    where = [
        "d.tenant_id = %(tenant_id)s",
        "d.source_id = ANY(%(source_ids)s)",
        "(d.principals = '[]'::jsonb OR d.principals ?| %(principals)s::text[])",
    ]
    params: dict[str, Any] = {
        "tenant_id": scope.tenant_id,
        "source_ids": list(scope.allowed_source_ids),
        # An empty principal never matches: a row listing "" stays restricted to no one.
        "principals": [p for p in scope.principals if p],
    }
    if kinds:
        where.append("d.kind = ANY(%(kinds)s)")
        params["kinds"] = list(kinds)
    return " AND ".join(where), params


HIT_COLUMNS = (
    "d.id, d.source_id, d.kind, d.title, d.url, d.path, d.start_line, d.end_line, d.content, d.text, "
    "d.metadata, d.updated_at, d.parent_id, d.external_id, s.public_id"
)  # select from ``sources_document d JOIN sources_datasource s``; read back with ``hit_from_row``


def hit_from_row(r: Sequence[Any]) -> Hit:
    """A :class:`Hit` (score 0) from one row selected as ``HIT_COLUMNS``."""
    return Hit(
        document_id=r[0],
        source_id=r[1],
        kind=r[2],
        title=r[3],
        url=r[4],
        path=r[5],
        start_line=r[6],
        end_line=r[7],
        content=r[8],
        text=r[9],
        # Django registers jsonb to load as text (JSONField decodes it); a raw cursor must too.
        metadata=json.loads(r[10]) if isinstance(r[10], str) else (r[10] or {}),
        updated_at=r[11],
        parent_id=r[12],
        external_id=r[13],
        source_public_id=str(r[14]),
    )


# HIT_COLUMNS without the two long texts: what fusion, the merge and the per-file cap read.
_LIGHT_COLUMNS = HIT_COLUMNS.replace("d.content, d.text", "'', ''")


def load_hits(ids: Iterable[int], *, texts: bool = True) -> dict[int, Hit]:
    """``{id: Hit}`` of the rows ``ids`` (score 0), inside the caller's tenant context.

    ``texts=False`` leaves ``content`` and ``text`` empty (``""``) until :func:`load_texts` fills
    them: of the ~150 fused candidates of a search only the few dozen that can be shown need
    them, and reading every candidate's whole text was a third of the search's database time.
    """
    ids = list(ids)
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {HIT_COLUMNS if texts else _LIGHT_COLUMNS} FROM sources_document d "
            "JOIN sources_datasource s ON s.id = d.source_id WHERE d.id = ANY(%s)",
            [ids],
        )
        return {r[0]: hit_from_row(r) for r in cursor.fetchall()}


def load_texts(hits: Iterable[Hit]) -> None:
    """Fill ``content`` and ``text`` of hits loaded with ``load_hits(..., texts=False)``, in one
    query inside the caller's tenant context."""
    by_id = {h.document_id: h for h in hits}
    if not by_id:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT d.id, d.content, d.text FROM sources_document d WHERE d.id = ANY(%s)", [list(by_id)])
        for doc_id, content, text in cursor.fetchall():
            by_id[doc_id].content, by_id[doc_id].text = content, text
