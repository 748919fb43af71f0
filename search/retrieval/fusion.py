"""Reciprocal rank fusion and what follows it: documents counted once per list, chunks merged
into their file, bursts into their thread, parts of a long function folded, a cap per file."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from search.retrieval.hits import FILE_KINDS, THREAD_KINDS, Hit

RRF_K = 60


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
