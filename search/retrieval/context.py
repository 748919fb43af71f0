"""Neighbouring context attached to the final hits (adjacent sections, enclosing signature, parent thread)."""

from __future__ import annotations

from django.db import connection

from search.retrieval.hits import Hit, scope_where_sql
from sources.selectors import QueryScope

CONTEXT_CHARS = 400


def expand_context(hits: list[Hit], scope: QueryScope) -> None:
    """Attach neighbouring context to each hit's ``context`` (a separate block, never merged
    into the hit's own text): the previous and next sections of a doc section, the enclosing
    class signature of a method chunk, the parent thread of a burst. One query for all hits,
    limited to what ``scope`` may read (tenant, sources, principals: a restricted neighbour of
    a public section adds nothing), inside the caller's tenant context.
    """
    wanted: dict[int, list[tuple[str, str]]] = {}
    lookups: list[tuple[int, str]] = []  # (source_id, external_id) to fetch
    for hit in hits:
        parts: list[tuple[str, str]] = []
        if hit.kind == "code_chunk" and hit.metadata.get("enclosing_signature"):
            parts.append(("enclosing", str(hit.metadata["enclosing_signature"])))
        for key, label in (("prev_section", "previous section"), ("next_section", "next section")):
            ref = hit.metadata.get(key)
            if ref:
                parts.append((label, f"@{ref}"))
                lookups.append((hit.source_id, str(ref)))
        if hit.kind == "burst" and hit.parent_id:
            parts.append(("thread", f"#{hit.parent_id}"))
        wanted[hit.document_id] = parts
    texts: dict[str, str] = {}
    parent_ids = [int(v[1:]) for parts in wanted.values() for _, v in parts if v.startswith("#")]
    if lookups or parent_ids:
        where, params = scope_where_sql(scope, None)
        params.update(
            chars=CONTEXT_CHARS,
            ctx_sources=[s for s, _ in lookups] or [0],
            ctx_ids=[e for _, e in lookups] or [""],
            parents=parent_ids,
        )
        with connection.cursor() as cursor:
            # Two indexed lookups (by source and external id; by id), not one OR, which no
            # index serves: the OR scanned every row of the table (2.6 ms against 0.3 ms).
            columns = "d.source_id, d.external_id, d.id, d.title, left(d.content, %(chars)s)"
            cursor.execute(
                f"""
                SELECT {columns} FROM sources_document d
                WHERE (d.source_id, d.external_id) IN (
                          SELECT * FROM unnest(%(ctx_sources)s::bigint[], %(ctx_ids)s::text[]))
                  AND {where}
                UNION
                SELECT {columns} FROM sources_document d
                WHERE d.id = ANY(%(parents)s) AND {where}
                """,
                params,
            )
            for source_id, external_id, doc_id, title, content in cursor.fetchall():
                block = f"{title}: {' '.join(content.split())}"
                texts[f"@{source_id}:{external_id}"] = block
                texts[f"#{doc_id}"] = block
    for hit in hits:
        lines = []
        for label, value in wanted.get(hit.document_id, []):
            if value.startswith("@"):
                value = texts.get(f"@{hit.source_id}:{value[1:]}", "")
            elif value.startswith("#"):
                value = texts.get(value, "")
            if value:
                lines.append(f"{label}: {value}")
        hit.context = "\n".join(lines)
