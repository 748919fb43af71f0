"""``subsystem_index``: one summary per file of a repository, and the files whose summaries best
match a question ("which module handles X", "what does routing.py do").

Where the summaries come from, and why they are computed at query time from the ``code_file``
rows rather than stored as rows of their own:

- the git connector already writes an extractive summary into each ``code_file`` row's
  ``text`` (``GitConnector._file_summary``: the path, the module docstring or first lines, the
  top-level classes and functions) and embeds it. The ingestion service rewrites a row only
  when its content hash changes, so a changed file gets a new summary and an unchanged one
  keeps its own without any extra machinery, and the dense ranking over those embeddings *is* an
  index of the summaries;
- a second copy in its own rows would need a migration, an ingestion step and a deletion rule,
  and could drift from the file it describes. Reading ``code_file`` rows is one indexed query.

With an LLM configured (``search.llm``), the files returned get a short written summary too,
cached on disk under ``KB_WORKDIR/summaries/<source public id>/<content hash>.json``: keyed by
the row's content hash, it is written once per version of a file and reused until the file
changes. At most ``LLM_SUMMARIES_PER_CALL`` new summaries are written per call and never after
``LLM_BUDGET_SECONDS``, so a question never waits on summarising a whole repository; a file
without one (or when the LLM fails) shows its extractive summary.

Ranking a question over the files: RRF (k = 60, Cormack et al., SIGIR 2009) of the hybrid search
restricted to ``code_file`` rows (full text of the file, dense over the summary embedding),
files whose path names a word of the question (``encoders`` -> ``fastapi/encoders.py``,
``security`` -> ``fastapi/security/*``; a named path or dotted module first), and files
defining an identifier the question names (their top-level ``symbols``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db import connection

from kbportal.tenancy import tenant_context
from search.llm import llm_client, llm_configured
from search.pipeline.evidence import SNIPPET_CHARS, Evidence, evidence_from_hit
from search.retrieval import Hit, clean_query, hybrid_search, query_identifiers, rrf_fuse, scope_where_sql
from search.tools.base import register, scoped_hits
from sources.selectors import QueryScope

logger = logging.getLogger(__name__)

FILE_KINDS = ("code_file",)
CANDIDATES = 50
SUMMARY_CHARS = 800
LLM_SUMMARIES_PER_CALL = 2
LLM_BUDGET_SECONDS = 8.0
LLM_INPUT_CHARS = 6000  # of the file given to the LLM (~1,500 tokens)
LLM_SUMMARY_TOKENS = 120
MAX_SYMBOLS = 40

_PATH_TOKEN = re.compile(r"[\w./-]*[/.][\w./-]+|\w+")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_STOP = set(
    """the and for what which where does how who module modules file files package packages code class function
    implemented implement defined lives live overview handles handle handling part parts repository repo
    this that with from into about our its are is do""".split()
)
LLM_PROMPT = (
    "You write one or two plain sentences saying what a source file is for, for an engineer new to "
    "the codebase. Use only the file shown. No lists, no code, no preamble."
)


@dataclass
class ModuleSummary:
    """One file of an indexed repository and what it is for.

    ``summary`` is the LLM's when one was written for this version of the file, else the
    extractive one (``summary_kind`` says which); ``symbols`` are its top-level names (at most
    ``MAX_SYMBOLS``); ``lines`` its length in lines; ``content_hash`` the version summarised.
    """

    document_id: int
    source_public_id: str
    path: str
    language: str
    lines: int | None
    symbols: list[str]
    summary: str
    summary_kind: str  # "extractive" | "llm"
    content_hash: str
    extractive: str = ""
    hit: Hit | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, without the underlying row."""
        return {
            "document_id": self.document_id,
            "source_public_id": self.source_public_id,
            "path": self.path,
            "language": self.language,
            "lines": self.lines,
            "symbols": list(self.symbols),
            "summary": self.summary,
            "summary_kind": self.summary_kind,
            "content_hash": self.content_hash,
        }


def extractive_summary(hit: Hit) -> str:
    """The row's own summary when the git connector wrote one (``text`` != ``content``), else
    the path and the file's first non-empty lines; at most ``SUMMARY_CHARS`` characters."""
    if hit.text and hit.text != hit.content:
        return hit.text[:SUMMARY_CHARS]
    first = [line.rstrip() for line in (hit.content or "").split("\n") if line.strip()][:8]
    return "\n".join([hit.path, *first])[:SUMMARY_CHARS]


def _summary_cache(source_public_id: str, content_hash: str) -> Path | None:
    if not re.fullmatch(r"[0-9a-f]{16,128}", content_hash or "") or not re.fullmatch(r"[\w-]+", source_public_id):
        return None
    return Path(settings.KB_WORKDIR) / "summaries" / source_public_id / f"{content_hash}.json"


def cached_llm_summary(source_public_id: str, content_hash: str) -> str | None:
    """The LLM summary written for this version of the file, if any."""
    path = _summary_cache(source_public_id, content_hash)
    try:
        return str(json.loads(path.read_text())["summary"]) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_llm_summary(hit: Hit, content_hash: str) -> str:
    """Ask the configured LLM for the file's summary and cache it by ``content_hash``.

    Returns the summary (at most ``SUMMARY_CHARS`` characters). Raises the client's errors
    (the caller falls back to the extractive summary) and ``ValueError`` for an empty reply.
    """
    response = llm_client().chat.completions.create(
        model=settings.KB_LLM_MODEL,
        messages=[
            {"role": "system", "content": LLM_PROMPT},
            {"role": "user", "content": f"File: {hit.path}\n\n{hit.content[:LLM_INPUT_CHARS]}"},
        ],
        temperature=0,
        max_tokens=LLM_SUMMARY_TOKENS,
    )
    summary = " ".join((response.choices[0].message.content or "").split())[:SUMMARY_CHARS]
    if not summary:
        raise ValueError(f"the LLM returned an empty summary for {hit.path}")
    path = _summary_cache(hit.source_public_id, content_hash)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"summary": summary, "path": hit.path, "model": settings.KB_LLM_MODEL}))
        os.replace(tmp, path)
    return summary


def _module(hit: Hit, content_hash: str) -> ModuleSummary:
    meta = hit.metadata or {}
    extractive = extractive_summary(hit)
    llm = cached_llm_summary(hit.source_public_id, content_hash)
    return ModuleSummary(
        document_id=hit.document_id,
        source_public_id=hit.source_public_id,
        path=hit.path,
        language=str(meta.get("language") or ""),
        lines=meta.get("lines") if isinstance(meta.get("lines"), int) else hit.end_line,
        symbols=[str(s) for s in (meta.get("symbols") or [])][:MAX_SYMBOLS],
        summary=llm or extractive,
        summary_kind="llm" if llm else "extractive",
        content_hash=content_hash,
        extractive=extractive,
        hit=hit,
    )


def _load(scope: QueryScope, ids: list[int]) -> dict[int, tuple[Hit, str]]:
    """The scope's readable ``code_file`` rows by id, with their content hashes."""
    if not ids:
        return {}
    hits = scoped_hits(
        scope, kinds=FILE_KINDS, where="d.id = ANY(%(ids)s)", params={"ids": ids}, content_chars=LLM_INPUT_CHARS
    )
    hashes = _content_hashes(scope, [h.document_id for h in hits])
    return {h.document_id: (h, hashes.get(h.document_id, "")) for h in hits}


def _content_hashes(scope: QueryScope, ids: list[int]) -> dict[int, str]:
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.id, d.content_hash FROM sources_document d WHERE d.tenant_id = %s AND d.id = ANY(%s)",
            [scope.tenant_id, ids],
        )
        return dict(cursor.fetchall())


def module_summaries(*, scope: QueryScope, prefix: str = "", limit: int = 1000) -> list[ModuleSummary]:
    """Every readable file of the scope's code sources under ``prefix`` (a path prefix), by path:
    the whole index, e.g. for a page listing a repository's modules. At most ``limit`` files."""
    where, params = "", {}
    if prefix:
        where, params = "d.path LIKE %(prefix)s", {"prefix": prefix.replace("\\", "\\\\").replace("%", r"\%") + "%"}
    hits = scoped_hits(
        scope, kinds=FILE_KINDS, where=where, params=params, order_by="d.path, d.id", limit=limit, content_chars=0
    )
    hashes = _content_hashes(scope, [h.document_id for h in hits])
    return [_module(h, hashes.get(h.document_id, "")) for h in hits]


def _question_words(query: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(query) if w.lower() not in _STOP]


COMMON_WORD_SHARE = 0.25  # a question word naming more than this share of the files says little


def _paths(scope: QueryScope) -> list[tuple[int, str]]:
    """``(id, path)`` of every ``code_file`` row the scope may read (one light query)."""
    where, params = scope_where_sql(scope, FILE_KINDS)
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT d.id, d.path FROM sources_document d WHERE {where} ORDER BY d.path, d.id", params)
        return cursor.fetchall()


def _path_ranking(query: str, scope: QueryScope) -> list[int]:
    """``code_file`` rows ranked by how the question names their path: a named path or dotted
    module (``fastapi/security``, ``fastapi.routing``, ``encoders.py``) first, then the number of
    question words equal to a directory name or the file's stem (a word naming more than
    ``COMMON_WORD_SHARE`` of the files, like the top package, is ignored); shorter paths first."""
    named = [t.strip("./").replace(".", "/") for t in _PATH_TOKEN.findall(query) if "/" in t or "." in t.strip(".")]
    named = [re.sub(r"/(py|pyi|ts|tsx|js|jsx|go|rs|java|rb|md)$", "", n).lower() for n in named if n]
    words = set(_question_words(query))
    if not named and not words or not scope.allowed_source_ids:
        return []
    files = []
    for doc_id, path in _paths(scope):
        pure = PurePosixPath(path)
        parts = [p.lower() for p in pure.parent.parts] + [pure.stem.lower()]
        files.append((doc_id, path, parts, str(pure.with_suffix("")).lower()))
    counts = {w: sum(1 for *_, parts, _ in files if w in parts) for w in words}
    words = {w for w in words if counts[w] and counts[w] <= max(1, COMMON_WORD_SHARE * len(files))}
    scored = []
    for doc_id, path, parts, bare in files:
        named_hit = any(bare == n or bare.endswith("/" + n) or bare.startswith(n + "/") for n in named)
        word_hits = len(words.intersection(parts))
        if named_hit or word_hits:
            scored.append((not named_hit, -word_hits, len(parts), path, doc_id))
    return [doc_id for *_, doc_id in sorted(scored)][:CANDIDATES]


def _symbol_ranking(query: str, scope: QueryScope) -> list[int]:
    """``code_file`` rows whose top-level ``symbols`` include an identifier the question names."""
    names = query_identifiers(query)
    if not names:
        return []
    hits = scoped_hits(
        scope,
        kinds=FILE_KINDS,
        where="EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(d.metadata->'symbols', '[]'::jsonb)) s "
        "WHERE lower(s) = ANY(%(names)s))",
        params={"names": names},
        order_by="d.path, d.id",
        limit=CANDIDATES,
        content_chars=0,
    )
    return [h.document_id for h in hits]


def subsystem_index(*, query: str, scope: QueryScope, limit: int = 5) -> list[ModuleSummary]:
    """The files whose summaries best answer ``query`` (module docstring), best first, at most
    ``limit``. With an LLM configured, returned files without a cached LLM summary get one
    (bounded per call). Only rows ``scope`` may read. Raises ``InvalidQuery`` for a blank or too long question.

    Each module's ``hit`` carries its ranks (``hybrid`` rankers' names, ``path``, ``symbols``)
    and the cosine similarity when the dense ranker saw it.
    """
    query = clean_query(query)
    hybrid = hybrid_search(query, scope, limit=CANDIDATES, kinds=FILE_KINDS, expand=False).hits
    rankings = {
        "hybrid": [h.document_id for h in hybrid],
        "path": _path_ranking(query, scope),
        "symbols": _symbol_ranking(query, scope),
    }
    scores, ranks = rrf_fuse({name: ids for name, ids in rankings.items() if ids})
    best = sorted(scores, key=lambda d: (-scores[d], d))[:limit]
    loaded = _load(scope, best)
    by_id = {h.document_id: h for h in hybrid}
    modules = []
    for doc_id in best:
        if doc_id not in loaded:
            continue
        hit, content_hash = loaded[doc_id]
        seen = by_id.get(doc_id)
        hit.ranks = {**(seen.ranks if seen else {}), **{k: v for k, v in ranks[doc_id].items() if k != "hybrid"}}
        hit.similarity = seen.similarity if seen else None
        hit.score = scores[doc_id]
        modules.append(_module(hit, content_hash))
    if llm_configured():
        _add_llm_summaries(modules)
    return modules


def _add_llm_summaries(modules: list[ModuleSummary]) -> None:
    started, written = time.perf_counter(), 0
    for module in modules:
        if module.summary_kind == "llm" or module.hit is None or not module.content_hash:
            continue
        if written >= LLM_SUMMARIES_PER_CALL or time.perf_counter() - started > LLM_BUDGET_SECONDS:
            break
        written += 1
        try:
            module.summary = write_llm_summary(module.hit, module.content_hash)
            module.summary_kind = "llm"
        except Exception as exc:  # the extractive summary stands in
            logger.warning("LLM summary of %s failed: %s", module.path, exc)


@register(
    "subsystem_index",
    "Per-file summaries of the indexed repositories (docstring and top-level symbols): which module or file "
    "does what, where something is implemented, an overview of a package.",
)
def subsystem_index_tool(*, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Evidence rows for the pipeline: one ``code_file`` row per matching file, best first (at
    most ``min(limit, 5)``), its text the summary (the LLM's first, then the extractive one, when
    both exist), ``metadata["summary_kind"]`` and ``["symbols"]``, ``score`` the fused RRF score.
    A file the question names by path or symbol counts as a lexical match (``lexical_rank`` its
    rank in that list), so the answerability gate sees it as relevant; otherwise the hybrid
    search's own lexical rank and similarity decide."""
    rows = []
    for module in subsystem_index(query=query, scope=scope, limit=min(limit, 5)):
        assert module.hit is not None
        ev = evidence_from_hit(module.hit, tool="subsystem_index")
        text = module.summary if module.summary_kind == "extractive" else f"{module.summary}\n\n{module.extractive}"
        ev.text = text[:SNIPPET_CHARS]
        if ev.lexical_rank is None:
            ev.lexical_rank = module.hit.ranks.get("path") or module.hit.ranks.get("symbols")
        ev.metadata = {**ev.metadata, "summary_kind": module.summary_kind, "symbols": module.symbols[:20]}
        rows.append(ev)
    return rows
