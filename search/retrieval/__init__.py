"""Hybrid retrieval over the unified document table: lexical + dense rankings fused with RRF.

Every ranker reads only rows of ``scope.tenant_id`` whose data source is in
``scope.allowed_source_ids`` and whose ``principals`` admit the asker (empty principals: anyone
who may read the source), inside the tenant's row-level-security context.

Fusion is reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009):
``score(d) = sum over rankers r of weight_r / (k + rank_r(d))`` with ``k = 60``, weight 1.0 and
1-based ranks. Chunks are then merged back to their source (a file-level row that also hit
adds its score to the best chunk of that file) and at most ``per_group`` results per file,
page or thread are kept.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from django.db import connection

from kbportal.tenancy import tenant_context
from search.retrieval.exact import exact_ranking, promote_exact, rare_exact_terms
from sources.embeddings import get_embedder
from sources.selectors import QueryScope
from sources.text import identifier_terms

RRF_K = 60
# The lexical and dense rankers each rank at two levels, as two lists (a list name's suffix):
# passages (sections, code chunks, bursts, and rows that are a document of their own: commits,
# tickets, records) and the whole documents that have passages (pages, code files, threads and
# conversations). Every document counts once per list, at the best rank any of its rows holds
# there (``_document_score``): a page and its sections never count twice in one list.
PASSAGE_LIST, DOCUMENT_LIST = "", ":document"
PASSAGE_KINDS = ("doc_section", "code_chunk", "burst")  # parts of a document (their parent_id is it)
# A document that has parts is not a passage itself: its parts stand for it in the passage list.
LEAVES_ONLY_SQL = " AND NOT EXISTS (SELECT 1 FROM sources_document part WHERE part.parent_id = d.id)"


def _level_kinds(level: str, kinds: Sequence[str] | None) -> tuple[Sequence[str] | None, tuple[str, ...]]:
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
FILE_KINDS = {"code_file", "doc_page"}
CHUNK_KINDS = {"code_chunk", "doc_section"}
LEXICAL_SKIPPED_KINDS = {"code_file"}  # see lexical_ranking
THREAD_KINDS = {"thread", "conversation"}  # the bursts (children) of one merge into it
ALL_RANKERS = ("lexical", "dense", "symbol")
# Opt-in (``rankers=(..., "rare", "recency")``), measured on both evaluation sets: the rare-term
# IDF list lowered MRR (FastAPI 0.731 -> 0.708, ERB 0.936 -> 0.911) while raising recall@3;
# recency as an RRF list, even at weight 0.1, lowered ERB MRR 0.902 -> 0.861. Not on by default.
OPTIONAL_RANKERS = ("rare", "recency")


MAX_QUERY_CHARS = 2000
MAX_LEXICAL_TOKENS = 64  # PostgreSQL's tsquery parser recurses per operator: keep the OR chain short


class InvalidQuery(ValueError):
    """The question cannot be asked as it is; the message says why, for the asker."""


class EmptyQuery(InvalidQuery):
    """The question has no searchable text."""


class QueryTooLong(InvalidQuery):
    """The question is longer than ``MAX_QUERY_CHARS``."""


def clean_query(query: str | None) -> str:
    """The question as searched: NUL and unpaired surrogates removed, whitespace collapsed.

    The one check every path (web page, stream, API, MCP, ``manage.py ask``) applies: raises
    ``EmptyQuery`` when nothing is left and ``QueryTooLong`` (naming both lengths) when more than
    ``MAX_QUERY_CHARS`` characters are."""
    text = (query or "").replace("\x00", " ")
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = " ".join(text.split())
    if not text:
        raise EmptyQuery("the question is empty; type what you are looking for")
    if len(text) > MAX_QUERY_CHARS:
        raise QueryTooLong(f"the question is {len(text):,} characters long; at most {MAX_QUERY_CHARS:,} are allowed")
    return text


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


COMMON_DF_RATIO = 0.25  # a lexeme in more than a quarter of the scope's rows is dropped from the OR query
MAX_TERM_DF = 5000  # ... and so is one in more than 5,000 rows (IDF < 3 at 100k rows; it costs the most)
KEEP_RAREST = 3  # ... unless every lexeme is that common: then the rarest few are kept
MIN_TERM_IDF = 0.1  # a kept term every row holds still counts a little in the IDF-weighted sum
RARE_IDF = 4.0  # the design's rare-token threshold: ln(N / df) >= 4.0
MAX_RARE_TERMS = 8
ALL_TERMS_BUDGET = 2000  # rows holding every term join the champion candidates when about this many


@dataclass
class QueryTerms:
    """The question's full-text terms with their document frequencies in the scope.

    ``df`` maps each lexeme (English-stemmed words and 'simple' identifier forms) to the number
    of rows in the scope's sources holding it; ``n_rows`` is the rows in those sources.
    """

    lexemes: list[str]
    df: dict[str, int]
    n_rows: int
    phrases: str  # quoted phrases, websearch syntax
    negative: str
    # lexeme -> the scope's sources that keep no champion list for it (rank those rows directly);
    # only lexemes with a champion list in at least one source appear here
    unchampioned: dict[str, list[int]] = field(default_factory=dict)

    def championed(self, lexeme: str) -> bool:
        """True when some source in scope keeps a champion list for ``lexeme``."""
        return lexeme in self.unchampioned

    def idf(self, lexeme: str) -> float:
        """ln(N / df) (Spärck Jones, 1972); 0 for a lexeme no row holds."""
        df = self.df.get(lexeme, 0)
        return math.log(self.n_rows / df) if df and self.n_rows else 0.0

    def kept(self) -> list[str]:
        """Lexemes for the OR query: present in the scope and not near-ubiquitous."""
        present = [lx for lx in self.lexemes if self.df.get(lx)]
        if not self.n_rows:
            return self.lexemes
        kept = [
            lx
            for lx in present
            if self.df[lx] / self.n_rows <= COMMON_DF_RATIO and (self.df[lx] <= MAX_TERM_DF or self.championed(lx))
        ]
        return kept or sorted(present, key=lambda lx: self.df[lx])[:KEEP_RAREST]

    def rare(self) -> list[tuple[str, float]]:
        """``(lexeme, idf)`` with idf >= ``RARE_IDF``, rarest first, at most ``MAX_RARE_TERMS``."""
        rare = [(lx, self.idf(lx)) for lx in self.lexemes if self.df.get(lx) and self.idf(lx) >= RARE_IDF]
        return sorted(rare, key=lambda item: -item[1])[:MAX_RARE_TERMS]


def _tsquery_literal(lexemes: Iterable[str]) -> str:
    quoted = ["'" + lx.replace("\\", "\\\\").replace("'", "''") + "'" for lx in lexemes]
    return " | ".join(quoted)


def query_terms(query: str, scope: QueryScope) -> QueryTerms:
    """Parse the question and look up its lexemes' document frequencies (one query)."""
    positive, negative = _split_query(query)
    phrases = " ".join(t for t in _QUERY_TOKEN.findall(positive) if t.startswith('"'))
    plain = " ".join(t for t in _QUERY_TOKEN.findall(positive) if not t.startswith('"'))
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH lx AS (
                SELECT DISTINCT unnest(tsvector_to_array(to_tsvector('english', %(plain)s))) AS lexeme
                UNION
                SELECT unnest(tsvector_to_array(to_tsvector('simple', %(terms)s)))
            )
            SELECT lx.lexeme, coalesce(sum(t.ndoc), 0)::bigint, bool_or(t.champions IS NOT NULL),
                   array_agg(t.source_id) FILTER (WHERE t.champions IS NULL)
            FROM lx LEFT JOIN sources_termstat t ON t.lexeme = lx.lexeme AND t.source_id = ANY(%(sources)s)
            GROUP BY lx.lexeme
            """,
            {"plain": plain, "terms": identifier_terms(plain), "sources": list(scope.allowed_source_ids)},
        )
        df, unchampioned = {}, {}
        for lexeme, n, has_champions, without in cursor.fetchall():
            df[lexeme] = int(n)
            if has_champions:
                unchampioned[lexeme] = [int(x) for x in without or []]
        cursor.execute(
            "SELECT coalesce(sum(indexed_rows), 0) FROM sources_datasource WHERE id = ANY(%s)",
            [list(scope.allowed_source_ids)],
        )
        n_rows = int(cursor.fetchone()[0])
    return QueryTerms(
        lexemes=sorted(df), df=df, n_rows=n_rows, phrases=phrases, negative=negative, unchampioned=unchampioned
    )


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
    params.update(pos=_tsquery_literal(kept), phrases=terms.phrases, neg=terms.negative, limit=limit)
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
            params["direct"] = _tsquery_literal(direct)
        for i, lexeme in enumerate(championed):
            if terms.unchampioned[lexeme]:
                parts.append(
                    f"SELECT d.id FROM sources_document d WHERE d.search_vector @@ %(lx_{i})s::tsquery "
                    f"AND d.source_id = ANY(%(lx_src_{i})s) AND {{where}}"
                )
                params[f"lx_{i}"] = _tsquery_literal([lexeme])
                params[f"lx_src_{i}"] = terms.unchampioned[lexeme]
        # Rows holding every term, when they are few enough (independence estimate N * prod(df/N));
        # with any term ranked directly they are among its rows already.
        all_estimate = terms.n_rows * math.prod(terms.df[lx] / max(terms.n_rows, 1) for lx in kept)
        if len(kept) > 1 and not direct and all_estimate <= ALL_TERMS_BUDGET:
            parts.append("SELECT d.id FROM sources_document d WHERE d.search_vector @@ %(all)s::tsquery AND {where}")
            params["all"] = " & ".join(_tsquery_literal([lx]) for lx in kept)
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
        SELECT d.id FROM sources_document d, q
        WHERE numnode(q.query) > 0 AND d.search_vector @@ q.query AND {where} {candidates}
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
        params[f"idf_term_{i}"] = _tsquery_literal([lexeme])
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
        params[f"rare_{i}"] = _tsquery_literal([lexeme])
        params[f"idf_{i}"] = idf
        cases.append(f"CASE WHEN d.search_vector @@ %(rare_{i})s::tsquery THEN %(idf_{i})s ELSE 0 END")
    params.update(any_rare=_tsquery_literal(lx for lx, _ in rare), limit=limit)
    sql = f"""
        SELECT d.id FROM sources_document d
        WHERE d.search_vector @@ %(any_rare)s::tsquery AND {where}
        ORDER BY ({" + ".join(cases)}) / (1 + ln(1 + length(d.search_vector))) DESC, d.id
        LIMIT %(limit)s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


_QUERY_TOKEN = re.compile(r'-?"[^"]*"|\S+')


def _split_query(query: str) -> tuple[str, str]:
    """``(positive, negative)`` websearch texts: ``-word`` / ``-"phrase"`` go to ``negative``.

    At most ``MAX_LEXICAL_TOKENS`` positive tokens are kept, each once; identifiers also add
    their parts (``jsonable_encoder`` -> ``jsonable encoder``) for the stemmed English match.
    """
    positive: list[str] = []
    negative: list[str] = []
    seen: set[str] = set()
    for token in _QUERY_TOKEN.findall(query):
        if token.startswith("-") and len(token) > 1:
            negative.append(token[1:])
            continue
        for piece in [token, *_identifier_pieces(token)]:
            key = piece.lower()
            if key not in seen and len(positive) < MAX_LEXICAL_TOKENS:
                seen.add(key)
                positive.append(piece)
    return " ".join(positive), " ".join(negative)


def _identifier_pieces(token: str) -> list[str]:
    if token.startswith('"'):
        return []
    pieces = [p for p in _SYMBOLS.split(token) if p]
    return pieces if len(pieces) > 1 else []


def query_identifiers(query: str) -> list[str]:
    """Code identifiers named in the question (lowercased, each once): `quoted`, snake_case,
    camelCase, CamelCase with two humps, dotted.names (their last part)."""
    names: list[str] = []
    for match in _CODE_IDENTIFIER.finditer(query):
        name = match.group(0).strip("`").rstrip("()").split(".")[-1].lower()
        if len(name) > 2 and name not in names:
            names.append(name)
    return names


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
    params.update(q=_tsquery_literal(lexemes), compounds=compound_splits(terms.lexemes), limit=limit)
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
        cursor.execute("SET LOCAL hnsw.ef_search = 100")
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute(
            f"""
            SELECT d.id, 1 - (d.embedding <=> %(vec)s::vector) AS similarity
            FROM sources_document d
            WHERE d.embedding IS NOT NULL AND {where}
            ORDER BY d.embedding <=> %(vec)s::vector
            LIMIT %(limit)s
            """,
            params,
        )
        rows = [(r[0], float(r[1])) for r in cursor.fetchall()]
    rows.sort(key=lambda r: -r[1])
    return rows


def rrf_fuse(rankings: Mapping[str, Sequence[int]], *, k: int = RRF_K, weights: dict[str, float] | None = None):
    """Reciprocal rank fusion: ``{id: sum_r w_r / (k + rank_r)}`` with 1-based ranks.

    Returns ``(scores, ranks)`` where ``ranks[id][ranker]`` is the id's rank in that list.
    Source: Cormack, Clarke, Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and
    individual Rank Learning Methods", SIGIR 2009 (k = 60).
    """
    scores: dict[int, float] = defaultdict(float)
    ranks: dict[int, dict[str, int]] = defaultdict(dict)
    for name, ids in rankings.items():
        weight = (weights or {}).get(name, 1.0)
        for rank, doc_id in enumerate(ids, start=1):
            scores[doc_id] += weight / (k + rank)
            ranks[doc_id][name] = rank
    return dict(scores), dict(ranks)


RECENCY_WEIGHT = 0.1  # a tie-breaker: 0.1 / (60 + rank) moves only near-equal scores


def recency_ranks(hits: Iterable[Hit]) -> dict[int, int]:
    """Recency ranking of the fused candidates: newest ``updated_at`` first, 1-based.

    Rows with the same timestamp share a rank (so a corpus without real dates, such as files
    copied at one moment, gets no order from it), and rows without a date get none. Only
    candidates other rankers found are ranked: recency breaks ties, it never adds rows.
    """
    dated = sorted(
        (h for h in hits if h.updated_at is not None),
        key=lambda h: h.updated_at or datetime.min,  # every one here has a date
        reverse=True,
    )
    out: dict[int, int] = {}
    rank, previous = 0, None
    for hit in dated:
        if hit.updated_at != previous:
            rank += 1
            previous = hit.updated_at
        out[hit.document_id] = rank
    return out


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


def _load_hits(ids: Iterable[int]) -> dict[int, Hit]:
    ids = list(ids)
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {HIT_COLUMNS} FROM sources_document d JOIN sources_datasource s ON s.id = d.source_id "
            "WHERE d.id = ANY(%s)",
            [ids],
        )
        return {r[0]: hit_from_row(r) for r in cursor.fetchall()}


def merge_and_cap(hits: list[Hit], *, per_group: int = 3, fold_parts: bool = True) -> list[Hit]:
    """Merge file-level rows into their best chunk, bursts into their thread or conversation,
    and keep at most ``per_group`` hits per file or thread. A file row's votes join its best
    chunk's score only from the ranked lists none of its chunks is in: a document counts once
    per list.

    ``hits`` must be sorted by descending score; the output keeps that order (scores of merged
    file rows are added to the chunk they merge into, then the list is re-sorted).
    """
    by_group: dict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        by_group[hit.group_key].append(hit)
    out: list[Hit] = []
    for group in by_group.values():
        threads = [h for h in group if h.kind in THREAD_KINDS]
        bursts = [h for h in group if h.kind == "burst"]
        if threads and bursts:  # the whole thread is the evidence; its best burst may lift it
            best = threads[0]
            # once per list: a long thread with many bursts must not outrank on their number alone
            best.score = max(best.score, _document_score([best, *bursts]))
            for b in bursts:
                for name, rank in b.ranks.items():
                    best.ranks.setdefault(f"{name}:burst", rank)
            group = [h for h in group if h.kind != "burst"]
        chunks = [h for h in group if h.kind not in FILE_KINDS]
        files = [h for h in group if h.kind in FILE_KINDS]
        if chunks and files:
            best = chunks[0]
            # The best chunk carries its file: one vote per ranked list, at the better of the
            # chunk's and the file row's ranks there (other chunks are hits of their own).
            best.score = _document_score([best, *files])
            for f in files:
                for name, rank in f.ranks.items():
                    best.ranks.setdefault(f"{name}:file", rank)
            group = chunks
        if fold_parts:
            group = _fold_function_parts(group)
        out.extend(_cap_per_unit(group, per_group))
    out.sort(key=lambda h: (-h.score, h.document_id))
    return out


def _document_score(rows: Sequence[Hit]) -> float:
    """RRF score of a document from its rows' ranks: per ranked list, ``w / (k + best rank)`` of
    any of its rows in that list (``RECENCY_WEIGHT`` for recency, 1 otherwise), summed over lists."""
    best: dict[str, int] = {}
    for row in rows:
        for name, rank in row.ranks.items():
            if name.endswith((":file", ":part", ":burst")):
                continue  # ranks a merge copied from another row, not a list of their own
            best[name] = min(rank, best.get(name, rank))
    return sum((RECENCY_WEIGHT if name == "recency" else 1.0) / (RRF_K + rank) for name, rank in best.items())


def _cap_unit(hit: Hit) -> str:
    """The unit the per-file cap counts in: a class's own chunk and its methods' chunks form
    one unit (``APIRouter``, ``APIRouter.websocket``), everything else in the file another. A
    long module holding several classes (FastAPI's 6,000-line ``routing.py``) is several units,
    as it would be several files in a codebase with one class per file."""
    symbol = str(hit.metadata.get("symbol") or "") if hit.kind == "code_chunk" else ""
    if "." in symbol or hit.metadata.get("symbol_kind") == "class":
        return symbol.split(".")[0]
    return ""


def _cap_per_unit(group: list[Hit], per_group: int) -> list[Hit]:
    """At most ``per_group`` hits of ``group`` (one file, best first) per :func:`_cap_unit`."""
    counts: dict[str, int] = defaultdict(int)
    kept = []
    for hit in group:
        unit = _cap_unit(hit)
        if counts[unit] < per_group:
            counts[unit] += 1
            kept.append(hit)
    return kept


def _fold_function_parts(group: list[Hit]) -> list[Hit]:
    """Parts of one long definition (code chunks sharing ``symbol``, numbered by ``part``) fold
    into the lowest-numbered part present, the one holding the signature and docstring, with
    the best part's score: a question about a function is answered by its definition first,
    and the parts of one function do not take several places of the list. Best first in, best
    first out."""
    parts: dict[str, list[Hit]] = defaultdict(list)
    for hit in group:
        if hit.kind == "code_chunk" and hit.metadata.get("part") and hit.metadata.get("symbol"):
            parts[str(hit.metadata["symbol"])].append(hit)
    folded: set[int] = set()
    for siblings in parts.values():
        if len(siblings) < 2:
            continue
        head = min(siblings, key=lambda h: int(h.metadata["part"]))
        head.score = max(h.score for h in siblings)
        for other in siblings:
            if other is not head:
                folded.add(other.document_id)
                for name, rank in other.ranks.items():
                    head.ranks.setdefault(f"{name}:part", rank)
    if not folded:
        return group
    return sorted((h for h in group if h.document_id not in folded), key=lambda h: (-h.score, h.document_id))


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
            cursor.execute(
                f"""
                SELECT d.source_id, d.external_id, d.id, d.title, left(d.content, %(chars)s)
                FROM sources_document d
                WHERE ((d.source_id, d.external_id) IN (
                          SELECT * FROM unnest(%(ctx_sources)s::bigint[], %(ctx_ids)s::text[]))
                       OR d.id = ANY(%(parents)s))
                  AND {where}
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


def hybrid_search(
    query: str,
    scope: QueryScope,
    *,
    limit: int = 10,
    kinds: Sequence[str] | None = None,
    rankers: Sequence[str] = ALL_RANKERS,
    per_group: int = 3,
    expand: bool = True,
    rerank: bool = False,
    fold_parts: bool = True,
) -> SearchResult:
    """Search the scope's rows: lexical + dense rankings, RRF-fused, merged, capped per file;
    rows holding a rare exact token of the question first (``search.retrieval.exact``).

    ``fold_parts=False`` keeps the parts of a long function apart (``search_code`` fuses them
    with grep hits, which are part-precise). With ``rerank``, near-duplicates are then
    collapsed and the top 20 reranked
    (``search.rerank``: one LLM call when configured, else the fusion order). Returns at most
    ``limit`` hits, best first, with timings in milliseconds. Raises ``InvalidQuery`` for a blank
    or too long question. Runs inside the scope's tenant context (opens one).
    """
    query = clean_query(query)
    timings: dict[str, float] = {}
    if not scope.allowed_source_ids:
        return SearchResult(hits=[], timings_ms=timings, rankers=tuple(rankers))
    query_vector = None
    if "dense" in rankers:
        t0 = time.perf_counter()
        query_vector = get_embedder().embed_query(query)
        timings["embed"] = (time.perf_counter() - t0) * 1000
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        rankings: dict[str, list[int]] = {}
        similarities: dict[int, float] = {}
        terms = None
        if "lexical" in rankers or "rare" in rankers:
            t0 = time.perf_counter()
            terms = query_terms(query, scope)
            timings["terms"] = (time.perf_counter() - t0) * 1000
        if "lexical" in rankers:
            t0 = time.perf_counter()
            for level in (PASSAGE_LIST, DOCUMENT_LIST):
                level_kinds, excluded = _level_kinds(level, kinds)
                if level_kinds != []:
                    rankings[f"lexical{level}"] = lexical_ranking(
                        query, scope, kinds=level_kinds, terms=terms, exclude_kinds=excluded,
                        leaves_only=level == PASSAGE_LIST,
                    )  # fmt: skip
            timings["lexical"] = (time.perf_counter() - t0) * 1000
        exact: list[str] = []
        if terms is not None:
            t0 = time.perf_counter()
            exact = rare_exact_terms(query, scope, n_rows=terms.n_rows)
            if exact:
                rankings["exact"] = exact_ranking(exact, scope, kinds=kinds)
            timings["exact"] = (time.perf_counter() - t0) * 1000
        if "rare" in rankers:
            t0 = time.perf_counter()
            rankings["rare"] = rare_term_ranking(query, scope, kinds=kinds, terms=terms)
            timings["rare"] = (time.perf_counter() - t0) * 1000
        if query_vector is not None:
            t0 = time.perf_counter()
            for level in (PASSAGE_LIST, DOCUMENT_LIST):
                level_kinds, excluded = _level_kinds(level, kinds)
                if level_kinds != []:
                    dense = dense_ranking(
                        query_vector,
                        scope,
                        kinds=level_kinds,
                        exclude_kinds=excluded,
                        leaves_only=level == PASSAGE_LIST,
                    )
                    rankings[f"dense{level}"] = [doc_id for doc_id, _ in dense]
                    similarities.update(dense)
            timings["dense"] = (time.perf_counter() - t0) * 1000
        if "symbol" in rankers:
            t0 = time.perf_counter()
            rankings["symbol"] = symbol_ranking(query, scope, kinds=kinds)
            timings["symbol"] = (time.perf_counter() - t0) * 1000
        # A question that asks for a kind of thing (a function, a recent change) gets extra
        # rankings restricted to those kinds, so the few code rows are not drowned by prose.
        t0 = time.perf_counter()
        intents = query_intents(query)
        for family, family_kinds in intents.items():
            restricted = [k for k in family_kinds if not kinds or k in kinds]
            if not restricted:
                continue
            # "which error / function ...": the asked kind of definition gets its own lists
            wanted = asked_symbol_kinds(query) if family == "code" else ()
            if "lexical" in rankers:
                scoring = "cover" if family == "code" else "idf"
                rankings[f"lexical:{family}"] = lexical_ranking(
                    query, scope, kinds=restricted, terms=terms, scoring=scoring
                )
            if query_vector is not None:
                for level in (PASSAGE_LIST, DOCUMENT_LIST):
                    level_kinds, excluded = _level_kinds(level, restricted)
                    if level_kinds != []:
                        dense = dense_ranking(
                            query_vector, scope, kinds=level_kinds, exclude_kinds=excluded,
                            leaves_only=level == PASSAGE_LIST,
                        )  # fmt: skip
                        rankings[f"dense:{family}{level}"] = [doc_id for doc_id, _ in dense]
                        similarities.update(dense)
                if wanted:
                    dense = dense_ranking(query_vector, scope, kinds=restricted, symbol_kinds=wanted)
                    rankings["dense:" + "|".join(wanted)] = [doc_id for doc_id, _ in dense]
                    similarities.update(dense)
            if family == "code" and terms is not None:
                rankings["symbol_name:code"] = symbol_name_ranking(scope, terms=terms, kinds=restricted)
                if wanted:
                    rankings["symbol_name:" + "|".join(wanted)] = symbol_name_ranking(
                        scope, terms=terms, kinds=restricted, symbol_kinds=wanted
                    )
        if any(":" in name for name in rankings):
            timings["intents"] = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        scores, ranks = rrf_fuse(rankings)
        hits_by_id = _load_hits(scores)
        timings["load"] = (time.perf_counter() - t0) * 1000
        code_kinds = intents.get("code")
        if code_kinds and "symbol" in rankers and terms is not None and not query_identifiers(query):
            # The docs name, in backticks, the code that does what the question describes in
            # the docs' own words: follow the best prose hits' names to their definitions.
            t0 = time.perf_counter()
            fused = sorted(hits_by_id.values(), key=lambda h: (-scores[h.document_id], h.document_id))
            linked = linked_symbol_ranking(fused, scope, kinds=code_kinds, terms=terms)
            if linked:
                rankings["linked:code"] = linked
                scores, ranks = rrf_fuse(rankings)
                hits_by_id.update(_load_hits([i for i in linked if i not in hits_by_id]))
            timings["linked"] = (time.perf_counter() - t0) * 1000
    if "recency" in rankers:
        for doc_id, rank in recency_ranks(hits_by_id.values()).items():
            scores[doc_id] += RECENCY_WEIGHT / (RRF_K + rank)
            ranks[doc_id]["recency"] = rank
    hits = []
    for doc_id, score in scores.items():
        hit = hits_by_id.get(doc_id)
        if hit is None:
            continue
        hit.score = score
        hit.ranks = ranks[doc_id]
        hit.similarity = similarities.get(doc_id)
        hits.append(hit)
    hits.sort(key=lambda h: (-h.score, h.document_id))
    hits = promote_exact(merge_and_cap(hits, per_group=per_group, fold_parts=fold_parts), exact)
    reranked_by = ""
    if rerank:
        from search.rerank import RERANK_CANDIDATES, collapse_near_duplicates
        from search.rerank import rerank as rerank_hits

        t0 = time.perf_counter()
        # Enough hits that 20 distinct ones remain after the collapse, in all but odd cases.
        pool = collapse_near_duplicates(hits[: 2 * max(RERANK_CANDIDATES, limit)])
        hits, reranked_by = rerank_hits(query, pool, limit=limit)
        hits = promote_exact(hits, exact)  # a reranker's order never puts a near-miss above an exact match
        timings["rerank"] = (time.perf_counter() - t0) * 1000
    hits = hits[:limit]
    if expand:
        t0 = time.perf_counter()
        with tenant_context(scope.tenant_id, user_id=scope.user_id):
            expand_context(hits, scope)
        timings["context"] = (time.perf_counter() - t0) * 1000
    return SearchResult(hits=hits, timings_ms=timings, rankers=tuple(rankers), reranked_by=reranked_by)


_CODE_WORDS = re.compile(
    r"\b(which|what)\s+(\w+\s+)?(function|functions|class|classes|method|methods|decorator|exception|error|"
    r"module|helper|object|type)\b|\bwhere\s+(is|are|does)\b.*\b(defined|implemented|declared|lives?)\b|"
    # "where does <something> <do something>": where a behaviour lives (not "where do I ...")
    r"\bwhere\s+(does|do)\s+(?!I\b|we\b|you\b)(the\s+|a\s+|an\s+)?[\w.]+\s+[a-z]+s?\b|"
    r"\bshow me\b|\bsource code\b|\bimplementation\b",
    re.I,
)
# Identifiers are case-sensitive shapes: snake_case, camelCase, CamelCase with two humps, `quoted`.
_CODE_IDENTIFIER = re.compile(
    r"`[^`]+`|\b_*[a-z][a-z0-9]*_[a-z0-9_]+\b|\b[a-z]+[A-Z]\w*\b|\b[A-Z][a-z0-9]+[A-Z][a-z]\w*\b"
)
_HISTORY_WORDS = re.compile(
    r"\b(recent|recently|latest|last)\s+(\w+\s+)?(change|changes|fix|fixes|commit|commits|release|PRs?)\b|"
    r"\b(commits?|pull requests?|PRs?|changelog|what changed|was fixed|got fixed|regression)\b",
    re.I,
)
_INTENTS: dict[str, tuple[tuple[re.Pattern[str], ...], tuple[str, ...]]] = {
    "code": ((_CODE_WORDS, _CODE_IDENTIFIER), ("code_chunk", "code_file")),
    "history": ((_HISTORY_WORDS,), ("commit", "pr")),
}


_ASKED_KIND = re.compile(
    r"\b(?:which|what)\s+(?:\w+\s+)?(class|classes|exception|exceptions|error|errors|function|functions|"
    r"method|methods|decorator|decorators)\b",
    re.I,
)


def asked_symbol_kinds(query: str) -> tuple[str, ...]:
    """The definition kinds a "which class / function ..." question asks for: ``("class",)``
    for a class, exception or error; ``("function", "method")`` for a function, method or
    decorator; ``()`` otherwise."""
    match = _ASKED_KIND.search(query)
    if not match:
        return ()
    word = match.group(1).lower()
    return ("class",) if word.startswith(("class", "exception", "error")) else ("function", "method")


def query_intents(query: str) -> dict[str, tuple[str, ...]]:
    """Families of row kinds the question explicitly asks for: ``{"code": kinds, ...}``.

    "Which function...", "where is X defined", a named identifier -> code; "recent change",
    "commit", "PR" -> history. Matching is on the question's wording, never on a data set.
    """
    return {name: kinds for name, (patterns, kinds) in _INTENTS.items() if any(p.search(query) for p in patterns)}


_SYMBOLS = re.compile(r"[_./:()\[\]{}<>=,;`'\"]+")
