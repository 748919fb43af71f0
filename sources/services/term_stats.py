"""Term statistics of a source: lexeme document frequencies (IDF in retrieval), the source's row
count, champion lists for very common lexemes, and their adjustment row by row between full runs."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import connection


def source_refresh_term_stats(source_id: int) -> int:
    """Recompute the source's lexeme document frequencies and row count; returns the row count.

    Runs inside the caller's tenant context. Source: PostgreSQL ``ts_stat`` over the rows'
    generated ``search_vector``; the counts feed IDF in retrieval.
    """
    source_id = int(source_id)  # ts_stat takes SQL text: the id is an int literal, nothing else
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM sources_termstat WHERE source_id = %s", [source_id])
        cursor.execute(
            f"""
            INSERT INTO sources_termstat (tenant_id, source_id, lexeme, ndoc)
            SELECT s.tenant_id, s.id, st.word, st.ndoc
            FROM sources_datasource s,
                 ts_stat('SELECT search_vector FROM sources_document WHERE source_id = {source_id}') AS st
            WHERE s.id = %s AND length(st.word) <= 255
            """,
            [source_id],
        )
        cursor.execute(
            "UPDATE sources_datasource SET indexed_rows = "
            "(SELECT count(*) FROM sources_document WHERE source_id = %s) WHERE id = %s RETURNING indexed_rows",
            [source_id, source_id],
        )
        row = cursor.fetchone()
        # Fresh planner statistics, or the champion-list update below and the first searches
        # after a large refresh are planned as if the table were still empty
        # (bench/search_latency.py at 100k rows: term lookup median 110 ms before autovacuum's
        # ANALYZE, 2.7 ms after; the champion update ran for over 12 minutes instead of
        # seconds, see source_refresh_champions). Needs MAINTAIN (granted on PostgreSQL 17+ by
        # kbportal.apps.grant_app_role); without it PostgreSQL only warns.
        cursor.execute("ANALYZE sources_termstat")
    source_refresh_champions(source_id)
    return int(row[0]) if row else 0


def source_refresh_embedding_duplicates(source_id: int, text_hashes: Collection[str] | None = None) -> int:
    """Mark every embedded row of the source whose text (and so vector) an earlier row of the
    source, with the same principals, already holds: ``Document.embedding_duplicate``, left out of
    the HNSW index. ``text_hashes`` (``md5`` hex of row texts) limits the pass to the rows with
    those texts (a partial update's rows, before and after it); ``None`` reads every row of the
    source (after a run). Returns how many rows changed mark. Runs inside the caller's tenant
    context.

    Identical vectors trap an HNSW graph search: the heuristic that prunes a node's links keeps
    every copy (each is as close to the others as to the node), so copies link only to each
    other and a search that enters the group cannot leave it (pgvector#837; qdrant#10239). The
    remedy the FAISS FAQ gives is one copy per vector in the index. Grouping by principals too
    keeps a restricted row from standing for a readable one."""
    only = "" if text_hashes is None else "AND md5(text) = ANY(%(hashes)s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE sources_document d SET embedding_duplicate = g.duplicate
            FROM (
                SELECT id, embedding IS NOT NULL AND row_number() OVER (
                    PARTITION BY embedding IS NOT NULL, kind, md5(text), principals ORDER BY id
                ) > 1 AS duplicate
                FROM sources_document WHERE source_id = %(source)s {only}
            ) g
            WHERE d.id = g.id AND d.embedding_duplicate <> g.duplicate
            """,
            {"source": int(source_id), "hashes": list(text_hashes or [])},
        )
        return cursor.rowcount


CHAMPION_MIN_DF = 5000  # a lexeme in more of one source's rows than this gets a champion list (retrieval's MAX_TERM_DF)
CHAMPIONS_PER_TERM = 400  # ... of this many rows
BM25_K1, BM25_B = 1.2, 0.75


def source_refresh_champions(
    source_id: int, *, min_df: int = CHAMPION_MIN_DF, per_term: int = CHAMPIONS_PER_TERM
) -> int:
    """Store, for each of the source's common lexemes (``ndoc > min_df``), the ids of the
    ``per_term`` rows where it weighs most: ``TermStat.champions``, best first. Returns how many
    lexemes got a list. Runs inside the caller's tenant context; one pass over the source's rows.

    Weight of lexeme t in row d: the BM25 term-frequency part (Robertson & Zaragoza, "The
    Probabilistic Relevance Framework: BM25 and Beyond", 2009, eq. 3.15),
    ``tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avg|d|))`` with k1 = 1.2, b = 0.75, where tf counts
    the lexeme's positions, a title position as 10 and a path position as 4 (PostgreSQL's
    default A/B/D weights 1.0/0.4/0.1, relative to body text), and ``|d|`` is the row's number of
    distinct lexemes. These are the "champion lists" of Manning, Raghavan & Schütze,
    *Introduction to Information Retrieval*, 2008, section 7.1.3: retrieval ranks only them for a
    lexeme too common to rank every row holding it.
    """
    source_id = int(source_id)
    params: dict[str, Any] = {"s": source_id, "min_df": min_df, "n": per_term, "k1": BM25_K1, "b": BM25_B}
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE sources_termstat SET champions = NULL WHERE source_id = %s AND champions IS NOT NULL", [source_id]
        )
        # The common lexemes and the average length are computed first and passed as values: as
        # subqueries of the one statement, the planner (misjudging a freshly written term table)
        # re-ran them for every row and the update took over 12 minutes at 25k rows.
        cursor.execute(
            "SELECT coalesce(array_agg(lexeme), '{}') FROM sources_termstat "
            "WHERE source_id = %(s)s AND ndoc > %(min_df)s",
            params,
        )
        params["common"] = list(cursor.fetchone()[0])
        if not params["common"]:
            return 0
        cursor.execute(
            "SELECT greatest(avg(length(search_vector)), 1)::float8 FROM sources_document WHERE source_id = %(s)s",
            params,
        )
        params["avglen"] = float(cursor.fetchone()[0])
        cursor.execute(
            """
            WITH tf AS (
                SELECT u.lexeme, d.id, length(d.search_vector)::float8 AS len,
                       (cardinality(u.positions) + 9 * cardinality(array_positions(u.weights, 'A'))
                        + 3 * cardinality(array_positions(u.weights, 'B')))::float8 AS tf
                FROM sources_document d, unnest(d.search_vector) AS u
                WHERE d.source_id = %(s)s AND u.lexeme = ANY(%(common)s::text[])
            ), ranked AS (
                SELECT tf.lexeme, tf.id, row_number() OVER (
                    PARTITION BY tf.lexeme
                    ORDER BY tf.tf * (%(k1)s + 1)
                             / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * tf.len / %(avglen)s)) DESC,
                             tf.id
                ) AS r
                FROM tf
            )
            UPDATE sources_termstat AS t SET champions = c.ids
            FROM (SELECT lexeme, array_agg(id ORDER BY r) AS ids FROM ranked WHERE r <= %(n)s GROUP BY lexeme) AS c
            WHERE t.source_id = %(s)s AND t.lexeme = c.lexeme
            """,
            params,
        )
        return cursor.rowcount


def term_stats_adjust(tenant_id: int, source_id: int, document_ids: list[int], sign: int) -> None:
    """Add (``sign`` +1) or remove (-1) the lexemes of these rows' ``search_vector`` to the source's
    ``TermStat`` counts, so IDF stays right between full runs. Runs in the caller's tenant context."""
    if not document_ids:
        return
    counts = """
        SELECT lexeme, count(*) AS n
        FROM sources_document d, unnest(tsvector_to_array(d.search_vector)) AS lexeme
        WHERE d.id = ANY(%(ids)s) AND d.source_id = %(source)s AND length(lexeme) <= 255
        GROUP BY lexeme
    """
    params: dict[str, Any] = {"ids": list(document_ids), "source": source_id, "tenant": tenant_id}
    with connection.cursor() as cursor:
        if sign > 0:
            cursor.execute(
                f"""
                INSERT INTO sources_termstat (tenant_id, source_id, lexeme, ndoc)
                SELECT %(tenant)s, %(source)s, c.lexeme, c.n FROM ({counts}) AS c
                ON CONFLICT (source_id, lexeme) DO UPDATE SET ndoc = sources_termstat.ndoc + EXCLUDED.ndoc
                """,
                params,
            )
        else:
            cursor.execute(
                f"""
                UPDATE sources_termstat AS t SET ndoc = greatest(t.ndoc - c.n, 0)
                FROM ({counts}) AS c WHERE t.source_id = %(source)s AND t.lexeme = c.lexeme
                """,
                params,
            )
            cursor.execute("DELETE FROM sources_termstat WHERE source_id = %s AND ndoc = 0", [source_id])


def indexed_rows_adjust(source_id: int, delta: int) -> None:
    """Add ``delta`` (rows, may be negative) to the source's ``indexed_rows``, never below 0. Runs
    in the caller's tenant context and transaction."""
    if delta:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE sources_datasource SET indexed_rows = greatest(indexed_rows + %s, 0) WHERE id = %s",
                [delta, source_id],
            )
