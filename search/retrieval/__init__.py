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

import time
from collections.abc import Sequence

from kbportal.tenancy import tenant_context
from search.retrieval.context import CONTEXT_CHARS, expand_context
from search.retrieval.exact import exact_ranking, promote_exact, rare_exact_terms
from search.retrieval.fusion import RECENCY_WEIGHT, RRF_K, merge_and_cap, recency_ranks, rrf_fuse
from search.retrieval.hits import (
    CHUNK_KINDS,
    FILE_KINDS,
    HIT_COLUMNS,
    THREAD_KINDS,
    Hit,
    SearchResult,
    hit_from_row,
    load_hits,
    load_texts,
    portal_link,
    safe_link,
    scope_where_sql,
)
from search.retrieval.query import (
    MAX_QUERY_CHARS,
    RARE_IDF,
    EmptyQuery,
    InvalidQuery,
    QueryTerms,
    QueryTooLong,
    asked_symbol_kinds,
    clean_query,
    query_identifiers,
    query_intents,
    query_terms,
)
from search.retrieval.rankers import (
    CANDIDATES_PER_RANKER,
    DOCUMENT_LIST,
    LEXICAL_SKIPPED_KINDS,
    PASSAGE_LIST,
    SYMBOL_WORDS_SQL,
    compound_splits,
    dense_ranking,
    kinds_of_level,
    lexical_ranking,
    linked_name_weights,
    linked_symbol_ranking,
    rare_term_ranking,
    symbol_name_ranking,
    symbol_ranking,
)
from sources.embeddings import get_embedder
from sources.selectors import QueryScope

# What the package offers (the modules keep the rest): hybrid_search and what its callers and tests use.
__all__ = [
    "ALL_RANKERS",
    "CANDIDATES_PER_RANKER",
    "CHUNK_KINDS",
    "CONTEXT_CHARS",
    "DOCUMENT_LIST",
    "FILE_KINDS",
    "HIT_COLUMNS",
    "LEXICAL_SKIPPED_KINDS",
    "MAX_QUERY_CHARS",
    "OPTIONAL_RANKERS",
    "PASSAGE_LIST",
    "RARE_IDF",
    "RECENCY_WEIGHT",
    "RRF_K",
    "SYMBOL_WORDS_SQL",
    "THREAD_KINDS",
    "EmptyQuery",
    "Hit",
    "InvalidQuery",
    "QueryTerms",
    "QueryTooLong",
    "SearchResult",
    "asked_symbol_kinds",
    "clean_query",
    "compound_splits",
    "dense_ranking",
    "expand_context",
    "hit_from_row",
    "hybrid_search",
    "lexical_ranking",
    "linked_name_weights",
    "linked_symbol_ranking",
    "load_hits",
    "load_texts",
    "merge_and_cap",
    "portal_link",
    "query_identifiers",
    "query_intents",
    "query_terms",
    "rare_term_ranking",
    "recency_ranks",
    "rrf_fuse",
    "safe_link",
    "scope_where_sql",
    "symbol_name_ranking",
    "symbol_ranking",
]


ALL_RANKERS = ("lexical", "dense", "symbol")
# Opt-in (``rankers=(..., "rare", "recency")``), measured on both evaluation sets: the rare-term
# IDF list lowered MRR (FastAPI 0.731 -> 0.708, ERB 0.936 -> 0.911) while raising recall@3;
# recency as an RRF list, even at weight 0.1, lowered ERB MRR 0.902 -> 0.861. Not on by default.
OPTIONAL_RANKERS = ("rare", "recency")


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
                level_kinds, excluded = kinds_of_level(level, kinds)
                if level_kinds != []:
                    rankings[f"lexical{level}"] = lexical_ranking(
                        query,
                        scope,
                        kinds=level_kinds,
                        terms=terms,
                        exclude_kinds=excluded,
                        leaves_only=level == PASSAGE_LIST,
                    )
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
                level_kinds, excluded = kinds_of_level(level, kinds)
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
                    level_kinds, excluded = kinds_of_level(level, restricted)
                    if level_kinds != []:
                        dense = dense_ranking(
                            query_vector,
                            scope,
                            kinds=level_kinds,
                            exclude_kinds=excluded,
                            leaves_only=level == PASSAGE_LIST,
                        )
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
        code_kinds = intents.get("code")
        follow_links = bool(code_kinds and "symbol" in rankers and terms is not None and not query_identifiers(query))
        # Every candidate's whole text only when something reads them all (the rare exact
        # tokens looked for in each hit, the code names in the prose hits' text); otherwise
        # only the hits that can be shown get theirs, below.
        all_texts = bool(exact) or follow_links
        hits_by_id = load_hits(scores, texts=all_texts)
        timings["load"] = (time.perf_counter() - t0) * 1000
        if follow_links and terms is not None:
            # The docs name, in backticks, the code that does what the question describes in
            # the docs' own words: follow the best prose hits' names to their definitions.
            t0 = time.perf_counter()
            fused = sorted(hits_by_id.values(), key=lambda h: (-scores[h.document_id], h.document_id))
            linked = linked_symbol_ranking(fused, scope, kinds=code_kinds or (), terms=terms)
            if linked:
                rankings["linked:code"] = linked
                scores, ranks = rrf_fuse(rankings)
                hits_by_id.update(load_hits([i for i in linked if i not in hits_by_id]))
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
        from search.rerank import RERANK_CANDIDATES

        # What the collapse and rerank below read (with ``rerank``), else what is returned.
        shown = 2 * max(RERANK_CANDIDATES, limit) if rerank else limit
        if not all_texts:
            load_texts(hits[:shown])
    reranked_by = ""
    if rerank:
        from search.rerank import RERANK_CANDIDATES, collapse_near_duplicates, reranks
        from search.rerank import rerank as rerank_hits

        t0 = time.perf_counter()
        # Enough hits that 20 distinct ones remain after the collapse, in all but odd cases; the
        # scan stops at what the reranker reads, or without one at what is returned.
        pool = collapse_near_duplicates(hits[:shown], keep=max(RERANK_CANDIDATES, limit) if reranks() else limit)
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
