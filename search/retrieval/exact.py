"""Exact matches dominate: a row holding a rare exact token of the question ranks above rows that
only match it in meaning.

The question's exact tokens are the identifiers, codes and quoted phrases it names
(``search.text.specific_terms``: ``ZEBRA-4471``, ``max_retry_ms``, ``"connection reset by peer"``;
not words in capitals such as ``PR`` or ``README``, which are often plain words).
One is *rare* when at most ``RARE_SHARE`` of the scope's rows hold it (IDF >= ln(1 / 0.018) = 4.0,
the design's rare-token threshold): a token most rows hold says nothing about which one answers.
Rows holding a rare exact token are a ranked list of their own (so fusion sees them even when
the lexical list's other terms bury them), and after fusion and reranking they come first, in
their fused order (:func:`promote_exact`): a stable partition, never a reordering among them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import connection

from search.retrieval.hits import Hit, scope_where_sql
from search.text import holds_term, specific_terms

if TYPE_CHECKING:
    from sources.selectors import QueryScope

RARE_SHARE = math.exp(-4.0)  # 1.8% of the scope's rows: IDF >= 4.0
MAX_EXACT_TERMS = 4
EXACT_CANDIDATES = 50
MIN_RARE_ROWS = 3  # in a tiny scope a token held by up to this many rows still counts as rare


def rare_exact_terms(query: str, scope: QueryScope, *, n_rows: int) -> list[str]:
    """The question's exact tokens (at most ``MAX_EXACT_TERMS``) that some row in scope holds and
    at most ``max(MIN_RARE_ROWS, RARE_SHARE * n_rows)`` rows hold. One capped count per token
    (``LIMIT`` cap + 1, so a common token costs no more than a rare one); runs in the caller's
    tenant context."""
    terms = specific_terms(query, acronyms=False)[:MAX_EXACT_TERMS]
    if not terms:
        return []
    cap = max(MIN_RARE_ROWS, int(RARE_SHARE * n_rows))
    where, params = scope_where_sql(scope, None)
    rare = []
    with connection.cursor() as cursor:
        for term in terms:
            cursor.execute(
                f"""SELECT count(*) FROM (
                        SELECT 1 FROM sources_document d
                        WHERE d.search_vector @@ phraseto_tsquery('english', %(term)s) AND {where}
                        LIMIT %(cap)s + 1) held""",
                {**params, "term": term, "cap": cap},
            )
            held = cursor.fetchone()[0]
            if 0 < held <= cap:
                rare.append(term)
    return rare


def exact_ranking(
    terms: Sequence[str], scope: QueryScope, *, kinds: Sequence[str] | None = None, limit: int = EXACT_CANDIDATES
) -> list[int]:
    """Rows holding any of ``terms`` (phrase match on the full-text vector), those holding more
    of them first, then shorter rows (``1 + ln(1 + lexemes)``). Runs in the caller's tenant context."""
    if not terms:
        return []
    where, params = scope_where_sql(scope, kinds)
    matches = []
    for i, term in enumerate(terms):
        params[f"exact_{i}"] = term
        matches.append(f"(d.search_vector @@ phraseto_tsquery('english', %(exact_{i})s))::int")
    params["limit"] = limit
    sql = f"""
        SELECT d.id FROM sources_document d
        WHERE ({" OR ".join(m.replace("::int", "") for m in matches)}) AND {where}
        ORDER BY ({" + ".join(matches)}) DESC, length(d.search_vector), d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def holds_exact(hit: Hit, terms: Sequence[str]) -> bool:
    """Whether ``hit``'s title or content holds one of ``terms`` as a whole token (``search.text.holds_term``)."""
    text = f"{hit.title}\n{hit.content or hit.text}"
    return any(holds_term(text, term) for term in terms)


def promote_exact(hits: list[Hit], terms: Sequence[str]) -> list[Hit]:
    """``hits`` with those holding a rare exact token first; each part keeps its order."""
    if not terms:
        return hits
    holding = [h for h in hits if holds_exact(h, terms)]
    if not holding:
        return hits
    ids = {h.document_id for h in holding}
    return holding + [h for h in hits if h.document_id not in ids]
