"""The rankers: each returns document ids best first over what the scope may read, inside the
caller's tenant context. Lexical and dense rank at two levels (``PASSAGE_LIST``, ``DOCUMENT_LIST``)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection

from search.retrieval.hits import Hit, scope_where_sql
from search.retrieval.query import (
    ALL_TERMS_BUDGET,
    MIN_TERM_IDF,
    QueryTerms,
    query_identifiers,
    query_terms,
    tsquery_literal,
)
from sources.selectors import QueryScope

# The lexical and dense rankers each rank at two levels, as two lists (a list name's suffix):
# passages (sections, code chunks, bursts, and rows that are a document of their own: commits,
# tickets, records) and the whole documents that have passages (pages, code files, threads and
# conversations). Every document counts once per list, at the best rank any of its rows holds
# there (``_document_score``): a page and its sections never count twice in one list.
PASSAGE_LIST, DOCUMENT_LIST = "", ":document"
PASSAGE_KINDS = ("doc_section", "code_chunk", "burst")  # parts of a document (their parent_id is it)
# A document that has parts is not a passage itself: its parts stand for it in the passage list.
LEAVES_ONLY_SQL = " AND NOT EXISTS (SELECT 1 FROM sources_document part WHERE part.parent_id = d.id)"


def kinds_of_level(level: str, kinds: Sequence[str] | None) -> tuple[Sequence[str] | None, tuple[str, ...]]:
    """``(kinds, exclude_kinds)`` of one level's list, within the caller's ``kinds``; ``([], ())``
    when the caller's kinds leave that level nothing to rank. The passage level also leaves out
    the documents that have parts (the rankers' ``leaves_only``)."""
    if level == PASSAGE_LIST:
        return kinds, ()
    wanted = [k for k in (kinds or ()) if k not in PASSAGE_KINDS]
    if kinds and not wanted:
        return [], ()
    return (wanted or None), PASSAGE_KINDS


CANDIDATES_PER_RANKER = 50


LEXICAL_SKIPPED_KINDS = {"code_file"}  # see lexical_ranking


def lexical_ranking(
    query: str,
    scope: QueryScope,
    *,
    kinds: Sequence[str] | None = None,
    limit: int = CANDIDATES_PER_RANKER,
    terms: QueryTerms | None = None,
    scoring: str = "idf",
    exclude_kinds: Sequence[str] = (),
    leaves_only: bool = False,
) -> list[int]:
    """Document ids ranked by full-text match: the question's terms OR-ed, quoted phrases kept
    as phrases, ``-term`` excluded, identifier forms included (``sources.text``).

    Terms held by more than ``COMMON_DF_RATIO`` of the scope's rows are dropped (they match
    nearly everything and cost the most to rank). ``scoring``:

    - ``"idf"`` (default): ``sum over kept terms t of idf(t) * ts_rank(row, t) / (1 + ln(1 +
      lexemes in the row))``: each term's saturating, title-weighted frequency (PostgreSQL's
      ``ts_rank``) weighted by its inverse document frequency ln(N / df) in the scope, as BM25
      does (Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond",
      2009), so "patch" counts for more than "request". Measured against cover density:
      FastAPI MRR 0.763 -> 0.834 (docs questions 0.853 -> 0.958), ERB 0.936 -> 0.982.
    - ``"cover"``: ``ts_rank_cd`` (cover density: how close together the terms occur) with
      length normalisation 1. Used for the code-restricted list, where the parts of an
      identifier sit next to each other and IDF over prose mis-weighs them (FastAPI code
      questions MRR 0.569 with cover density there, 0.447 with IDF).

    Whole code files (``code_file``) are not ranked here unless they are the only kind asked
    for: their text is the sum of their chunks, which are ranked themselves, and a long file
    matches every question, so its score only lifted whichever of its chunks ranked best
    (FastAPI code questions MRR 0.569 -> 0.620 without them). Their summaries stay in the
    dense ranking.

    Rows ranked: every row holding a term, except that for a term a large source keeps a
    champion list for (``sources.services.source_refresh_champions``), only that list's rows of
    that source are taken, plus rows holding all the terms and rows matching a quoted phrase.
    The cost then grows with the champion lists, not with the rows a common term matches.
    """
    terms = terms or query_terms(query, scope)
    kept = terms.kept()
    where, params = scope_where_sql(scope, kinds)
    if not kinds or set(kinds) - LEXICAL_SKIPPED_KINDS:
        where += " AND d.kind <> ALL(%(lexical_skipped)s)"
        params["lexical_skipped"] = sorted(LEXICAL_SKIPPED_KINDS | set(exclude_kinds))
    if leaves_only:
        where += LEAVES_ONLY_SQL
    params.update(pos=tsquery_literal(kept), phrases=terms.phrases, neg=terms.negative, limit=limit)
    championed = [lx for lx in kept if terms.championed(lx)]
    candidates = ""
    if championed:
        direct = [lx for lx in kept if not terms.championed(lx)]
        parts = [
            "SELECT unnest(t.champions) FROM sources_termstat t "
            "WHERE t.lexeme = ANY(%(champ)s) AND t.source_id = ANY(%(source_ids)s) AND t.champions IS NOT NULL"
        ]
        params["champ"] = championed
        if direct:
            parts.append("SELECT d.id FROM sources_document d WHERE d.search_vector @@ %(direct)s::tsquery AND {where}")
            params["direct"] = tsquery_literal(direct)
        for i, lexeme in enumerate(championed):
            if terms.unchampioned[lexeme]:
                parts.append(
                    f"SELECT d.id FROM sources_document d WHERE d.search_vector @@ %(lx_{i})s::tsquery "
                    f"AND d.source_id = ANY(%(lx_src_{i})s) AND {{where}}"
                )
                params[f"lx_{i}"] = tsquery_literal([lexeme])
                params[f"lx_src_{i}"] = terms.unchampioned[lexeme]
        # Rows holding every term, when they are few enough (independence estimate N * prod(df/N));
        # with any term ranked directly they are among its rows already.
        all_estimate = terms.n_rows * math.prod(terms.df[lx] / max(terms.n_rows, 1) for lx in kept)
        if len(kept) > 1 and not direct and all_estimate <= ALL_TERMS_BUDGET:
            parts.append("SELECT d.id FROM sources_document d WHERE d.search_vector @@ %(all)s::tsquery AND {where}")
            params["all"] = " & ".join(tsquery_literal([lx]) for lx in kept)
        if terms.phrases:
            parts.append(
                "SELECT d.id FROM sources_document d "
                "WHERE d.search_vector @@ websearch_to_tsquery('english', %(phrases)s) AND {where}"
            )
        candidates = "AND d.id IN (" + " UNION ".join(p.replace("{where}", where) for p in parts) + ")"
    sql = f"""
        WITH parts AS (
            SELECT %(pos)s::tsquery || websearch_to_tsquery('english', %(phrases)s) AS pos,
                   replace(websearch_to_tsquery('english', %(neg)s)::text, ' & ', ' | ')::tsquery AS neg
        ), q AS (
            SELECT CASE WHEN numnode(neg) > 0 AND numnode(pos) > 0 THEN pos && !!neg ELSE pos END AS query
            FROM parts
        )
        SELECT d.id FROM (
            -- Each matching row's vector is read out of its TOAST storage here, once: ranked
            -- on the stored column, it was decompressed again for every ts_rank term and
            -- length() (concatenating the empty vector copies it; OFFSET 0 keeps the copy).
            SELECT d.id, d.search_vector || ''::tsvector AS search_vector
            FROM sources_document d, q
            WHERE numnode(q.query) > 0 AND d.search_vector @@ q.query AND {where} {candidates}
            OFFSET 0
        ) d, q
        ORDER BY {_lexical_order(scoring, kept, terms, params)} DESC, d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _lexical_order(scoring: str, kept: Sequence[str], terms: QueryTerms, params: dict[str, Any]) -> str:
    """The ORDER BY expression of :func:`lexical_ranking` (adds its parameters to ``params``)."""
    if scoring == "cover" or not kept:
        return "ts_rank_cd(d.search_vector, q.query, 1)"
    if scoring != "idf":
        raise ValueError(f"scoring must be 'idf' or 'cover', not {scoring!r}")
    weighted = []
    for i, lexeme in enumerate(kept):
        params[f"idf_term_{i}"] = tsquery_literal([lexeme])
        params[f"idf_weight_{i}"] = max(terms.idf(lexeme), MIN_TERM_IDF)
        weighted.append(f"%(idf_weight_{i})s * ts_rank(d.search_vector, %(idf_term_{i})s::tsquery, 0)")
    return f"({' + '.join(weighted)}) / (1 + ln(1 + length(d.search_vector)))"


def rare_term_ranking(
    query: str,
    scope: QueryScope,
    *,
    kinds: Sequence[str] | None = None,
    limit: int = CANDIDATES_PER_RANKER,
    terms: QueryTerms | None = None,
) -> list[int]:
    """Rows holding the question's rare terms (IDF >= 4.0), scored by the sum of those terms'
    IDF divided by 1 + ln(1 + number of lexemes in the row): a short row built around a rare
    token ranks high; a row holding only common words is not ranked at all."""
    terms = terms or query_terms(query, scope)
    rare = terms.rare()
    if not rare:
        return []
    where, params = scope_where_sql(scope, kinds)
    cases = []
    for i, (lexeme, idf) in enumerate(rare):
        params[f"rare_{i}"] = tsquery_literal([lexeme])
        params[f"idf_{i}"] = idf
        cases.append(f"CASE WHEN d.search_vector @@ %(rare_{i})s::tsquery THEN %(idf_{i})s ELSE 0 END")
    params.update(any_rare=tsquery_literal(lx for lx, _ in rare), limit=limit)
    sql = f"""
        SELECT d.id FROM sources_document d
        WHERE d.search_vector @@ %(any_rare)s::tsquery AND {where}
        ORDER BY ({" + ".join(cases)}) / (1 + ln(1 + length(d.search_vector))) DESC, d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def symbol_ranking(
    query: str, scope: QueryScope, *, kinds: Sequence[str] | None = None, limit: int = CANDIDATES_PER_RANKER
) -> list[int]:
    """Code rows whose symbol is an identifier the question names, definitions first.

    ``Class.method`` matches ``method`` too. Empty when the question names no identifier.
    """
    names = query_identifiers(query)
    if not names:
        return []
    code_kinds = [k for k in ("code_chunk", "code_file") if not kinds or k in kinds]
    if not code_kinds:
        return []
    where, params = scope_where_sql(scope, code_kinds)
    params.update(names=names, limit=limit)
    sql = f"""
        SELECT d.id FROM sources_document d
        WHERE {where} AND (
            lower(d.metadata->>'symbol') = ANY(%(names)s)
            OR lower(regexp_replace(d.metadata->>'symbol', '^.*\\.', '')) = ANY(%(names)s)
        )
        ORDER BY (lower(d.metadata->>'symbol') = ANY(%(names)s)) DESC,
                 (d.metadata->>'symbol_kind' IN ('class', 'function', 'method')) DESC,
                 d.start_line NULLS LAST, d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


LINK_PROSE_KINDS = ("doc_section", "doc_page")
LINK_PROSE_HITS = 8  # prose hits whose code names are followed
LINK_MAX_NAMES = 6
_LINKED_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:\(\))?`")


def _backticked_names(hit: Hit) -> set[str]:
    """Code names ``hit``'s text writes in backticks: lowercased, last dotted part, 3+ characters."""
    names = {m.group(1).split(".")[-1].lower() for m in _LINKED_NAME.finditer(hit.content or "")}
    return {n for n in names if len(n) > 2}


def linked_name_weights(prose: Sequence[set[str]], idf: dict[str, float]) -> dict[str, float]:
    """``{name: weight}`` of the code names of the prose hits (best first, each given as its
    :func:`_backticked_names`): weight = sum over the hits h naming it of idf(name) / rank(h).
    ``idf`` maps a name to ln(N / df) in the scope; a name no row holds weighs 0 and is left out."""
    weights: dict[str, float] = defaultdict(float)
    for rank, names in enumerate(prose, start=1):
        for name in names:
            if idf.get(name, 0.0) > 0:
                weights[name] += idf[name] / rank
    return dict(weights)


def linked_symbol_ranking(
    fused: Sequence[Hit], scope: QueryScope, *, kinds: Sequence[str], terms: QueryTerms
) -> list[int]:
    """Definitions (class, function, method chunks) of the code names that the best prose hits
    of ``fused`` (best first) write in backticks, by :func:`linked_name_weights`, at most
    ``LINK_MAX_NAMES`` names: the docs describe in users' words what a named piece of code
    does, so a question in those words reaches the code through them. ``terms`` gives the
    scope's row count. Empty when the prose names nothing defined in the scope's code."""
    prose = [_backticked_names(h) for h in fused if h.kind in LINK_PROSE_KINDS][:LINK_PROSE_HITS]
    names = sorted(set().union(*prose)) if prose else []
    if not names or not terms.n_rows:
        return []
    where, params = scope_where_sql(scope, kinds)
    params.update(names=names, sources=list(scope.allowed_source_ids))
    with connection.cursor() as cursor:
        # a name's document frequency: of its 'simple' lexeme (CamelCase names are indexed whole)
        # or of its English stem (a plain word such as "Deferred"), whichever is larger
        cursor.execute(
            """
            SELECT n, (SELECT max(df) FROM (
                SELECT sum(t.ndoc) AS df FROM sources_termstat t
                WHERE t.source_id = ANY(%(sources)s)
                  AND t.lexeme = ANY(array[n] || tsvector_to_array(to_tsvector('english', n)))
                GROUP BY t.lexeme) per_lexeme)
            FROM unnest(%(names)s::text[]) AS n
            """,
            params,
        )
        df = {name: int(n) for name, n in cursor.fetchall() if n}
        cursor.execute(
            f"""
            SELECT d.id, lower(regexp_replace(d.metadata->>'symbol', '^.*\\.', ''))
            FROM sources_document d
            WHERE {where} AND d.metadata->>'symbol_kind' IN ('class', 'function', 'method')
              AND lower(regexp_replace(d.metadata->>'symbol', '^.*\\.', '')) = ANY(%(names)s)
            ORDER BY d.start_line NULLS LAST, d.id
            """,
            params,
        )
        defined = cursor.fetchall()
    idf = {n: math.log(terms.n_rows / d) for n, d in df.items() if terms.n_rows > d}
    weights = linked_name_weights(prose, idf)
    best = sorted({name for _, name in defined if name in weights}, key=lambda n: (-weights[n], n))[:LINK_MAX_NAMES]
    order = {name: i for i, name in enumerate(best)}
    return [doc_id for doc_id, name in sorted((r for r in defined if r[1] in order), key=lambda r: order[r[1]])]


SYMBOL_WORDS_SQL = (
    "to_tsvector('english', regexp_replace(regexp_replace(regexp_replace(coalesce(d.metadata->>'symbol', ''), "
    "'([A-Z]+)([A-Z][a-z])', '\\1 \\2', 'g'), '([a-z0-9])([A-Z])', '\\1 \\2', 'g'), '[_.]', ' ', 'g'))"
)


MAX_SPLIT_CHARS = 24  # a longer "word" is no compound of two code-name words
MAX_SPLIT_WORDS = 8  # words split per question: at most 8 x 19 phrases in the ranking's tsquery


def compound_splits(lexemes: Iterable[str], *, min_part: int = 3) -> list[str]:
    """Every split of each alphabetic lexeme into two parts of at least ``min_part`` letters,
    as "left right" strings: ``websocket`` -> ``web socket``, ``webs ocket``, ... (a code name
    writes as two words what prose writes as one). Only the first ``MAX_SPLIT_WORDS`` lexemes
    of ``2 * min_part`` to ``MAX_SPLIT_CHARS`` letters are split: every phrase is matched
    against every named definition, so the count must not grow with the question."""
    splits: list[str] = []
    words = [lx for lx in lexemes if lx.isalpha() and 2 * min_part <= len(lx) <= MAX_SPLIT_CHARS]
    for lexeme in words[:MAX_SPLIT_WORDS]:
        splits.extend(f"{lexeme[:i]} {lexeme[i:]}" for i in range(min_part, len(lexeme) - min_part + 1))
    return splits


def symbol_name_ranking(
    scope: QueryScope,
    *,
    terms: QueryTerms,
    kinds: Sequence[str],
    limit: int = CANDIDATES_PER_RANKER,
    symbol_kinds: Sequence[str] | None = None,
) -> list[int]:
    """Code definitions whose *name's words* the question uses, the best-covered names first.

    ``WebSocketRequestValidationError`` is read as "web socket request validation error", and a
    question's "websocket" also matches its adjacent "web socket" (``compound_splits``); ranked
    by ``ts_rank`` with length normalisation 1 (divide by 1 + ln(words in the name)), so a name
    matching more of the question wins over a shorter one matching less, and among names
    matching as much the shorter wins. With ``symbol_kinds`` only definitions of those kinds
    (and, for functions, a long function's parts) are ranked, as in :func:`dense_ranking`.
    """
    lexemes = [lx for lx in terms.lexemes if terms.df.get(lx)]
    if not lexemes:
        return []
    where, params = scope_where_sql(scope, kinds)
    where += _symbol_kinds_sql(symbol_kinds, params)
    params.update(q=tsquery_literal(lexemes), compounds=compound_splits(terms.lexemes), limit=limit)
    # A question's "websocket" also matches a name's adjacent words "web socket" (WebSocket...).
    query = """(%(q)s::tsquery || coalesce((
        SELECT string_agg(phraseto_tsquery('english', c)::text, ' | ')
        FROM unnest(%(compounds)s::text[]) AS c WHERE numnode(phraseto_tsquery('english', c)) = 3
    )::tsquery, ''::tsquery))"""
    sql = f"""
        SELECT d.id FROM sources_document d
        WHERE {where} AND d.metadata ? 'symbol' AND {SYMBOL_WORDS_SQL} @@ {query}
        ORDER BY ts_rank({SYMBOL_WORDS_SQL}, {query}, 1) DESC, d.start_line NULLS LAST, d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _symbol_kinds_sql(symbol_kinds: Sequence[str] | None, params: dict[str, Any]) -> str:
    """The ``AND ...`` restricting rows to definitions of ``symbol_kinds`` ("" for none); a long
    function's parts ("block" chunks carrying a part number) count as functions."""
    if not symbol_kinds:
        return ""
    params["symbol_kinds"] = list(symbol_kinds)
    parts = " OR d.metadata ? 'part'" if {"function", "method"} & set(symbol_kinds) else ""
    return f" AND (d.metadata->>'symbol_kind' = ANY(%(symbol_kinds)s){parts})"


def dense_ranking(
    query_vector: Sequence[float],
    scope: QueryScope,
    *,
    kinds: Sequence[str] | None = None,
    limit: int = CANDIDATES_PER_RANKER,
    symbol_kinds: Sequence[str] | None = None,
    exclude_kinds: Sequence[str] = (),
    leaves_only: bool = False,
) -> list[tuple[int, float]]:
    """``(document id, cosine similarity)`` ranked by the HNSW index on the embedding.

    ``exclude_kinds``: row kinds left out (``hybrid_search`` ranks passages and whole documents
    as two lists, :data:`DENSE_LISTS`).

    One copy of each embedded text is ranked (``Document.embedding_duplicate``: identical vectors
    trap an HNSW search), so a text repeated in a thousand rows is one candidate, not fifty.

    Uses pgvector's iterative index scan (``hnsw.iterative_scan = relaxed_order``) so the
    tenant/source filters do not starve the result list, then re-sorts exactly. With
    ``symbol_kinds`` (e.g. ``["class"]``) only code rows defining such a symbol are ranked.
    """
    where, params = scope_where_sql(scope, kinds)
    where += _symbol_kinds_sql(symbol_kinds, params)
    if exclude_kinds:
        where += " AND d.kind <> ALL(%(exclude_kinds)s)"
        params["exclude_kinds"] = list(exclude_kinds)
    if leaves_only:
        where += LEAVES_ONLY_SQL
    params.update(vec="[" + ",".join(f"{x:.7f}" for x in query_vector) + "]", limit=limit)
    with connection.cursor() as cursor:
        # SET LOCAL of both, in one round trip
        cursor.execute(
            "SELECT set_config('hnsw.ef_search', '100', true), set_config('hnsw.iterative_scan', 'relaxed_order', true)"
        )
        cursor.execute(
            f"""
            SELECT d.id, 1 - (d.embedding <=> %(vec)s::vector) AS similarity
            FROM sources_document d
            WHERE d.embedding IS NOT NULL AND NOT d.embedding_duplicate AND {where}
            ORDER BY d.embedding <=> %(vec)s::vector
            LIMIT %(limit)s
            """,
            params,
        )
        rows = [(r[0], float(r[1])) for r in cursor.fetchall()]
    rows.sort(key=lambda r: -r[1])
    return rows
