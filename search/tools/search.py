"""Retrieval tools over the unified table: ``search``, ``search_slack``, ``recent_prs``.

The other tools live in their own modules: ``search_code`` in ``search.tools.code``, ``who_knows``
in ``search.tools.people``, ``subsystem_index`` in ``search.tools.subsystems``.
"""

from __future__ import annotations

from search.pipeline.evidence import Evidence, evidence_from_hit
from search.retrieval import hybrid_search
from search.tools.base import register
from sources.selectors import QueryScope

SLACK_KINDS = ("thread", "conversation", "burst")
HISTORY_KINDS = ("commit", "pr")


@register("search", "Hybrid search over everything the project indexed (docs, code, threads, commits).")
def search(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Top ``limit`` hits of the hybrid search as evidence (unnumbered)."""
    hits = hybrid_search(query, scope, limit=limit, rerank=True).hits
    return [evidence_from_hit(h, tool="search", query=query) for h in hits]


@register("search_slack", "Search Slack threads and conversations only.")
def search_slack(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    hits = hybrid_search(query, scope, limit=limit, kinds=SLACK_KINDS, rerank=True).hits
    return [evidence_from_hit(h, tool="search_slack", query=query) for h in hits]


@register("recent_prs", "Commits and pull requests relevant to the question, newest first among the relevant.")
def recent_prs(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    hits = hybrid_search(query, scope, limit=limit, kinds=HISTORY_KINDS).hits
    hits.sort(key=lambda h: h.updated_at.timestamp() if h.updated_at else 0.0, reverse=True)
    return [evidence_from_hit(h, tool="recent_prs", query=query) for h in hits]
