"""The one evidence schema every tool's rows are normalised into, numbered ``[1]..[n]``."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from search.retrieval import Hit, portal_link
from search.text import content_terms

SNIPPET_CHARS = 1200
BODY_CHARS = 100_000
RELEVANT_SIMILARITY = 0.35

PASSAGE_GAP = " … "
PASSAGE_UNIT_CHARS = 300  # longer lines are split at sentence ends, then at this many characters
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


_LINE = re.compile(r"[^\n]*\S[^\n]*")
_PARAGRAPH = re.compile(r"[^\n]*\S[^\n]*(?:\n[^\n]*\S[^\n]*)*")  # a run of non-blank lines
_FENCE_LINE = re.compile(r"^[ \t]*(?:```|~~~)[^\n]*$", re.M)
# A line that starts something of its own, never the continuation of a wrapped sentence: a list
# item, a heading, a quote, a table row, a "name: text" chat or log line, a dated line.
_BLOCK_START = re.compile(r"^(?=[ \t]*(?:[-*+>|#]|\d+[.)][ \t])|[^\s:][^:\n]{0,40}:[ \t]|\d{4}-\d\d-\d\d)", re.M)


def _passage_units(body: str) -> list[tuple[int, int]]:
    """``(start, end)`` spans of ``body``'s sentences: a paragraph's hard-wrapped lines are read as
    one text and cut at sentence ends (so a sentence is never cut where the source wrapped it),
    while list items, headings, chat lines and fenced code stay one unit per line. A unit over
    ``PASSAGE_UNIT_CHARS`` is cut into pieces of that size. Blank lines are left out. Linear in
    ``len(body)``: each step is one regular-expression scan."""
    units: list[tuple[int, int]] = []

    def add(start: int, end: int) -> None:
        for lo in range(start, end, PASSAGE_UNIT_CHARS):
            units.append((lo, min(end, lo + PASSAGE_UNIT_CHARS)))

    def prose(start: int, end: int) -> None:
        for paragraph in _PARAGRAPH.finditer(body, start, end):
            a, b = paragraph.span()
            starts = [m.start() for m in _BLOCK_START.finditer(body, a, b)]
            bounds = sorted({a, *starts, b})
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                cut = lo
                for match in _SENTENCE_END.finditer(body, lo, hi):
                    add(cut, match.start())
                    cut = match.end()
                add(cut, hi)

    fences = [m.span() for m in _FENCE_LINE.finditer(body)]
    pos = 0
    for i in range(0, len(fences), 2):
        open_start, open_end = fences[i]
        close_start, close_end = fences[i + 1] if i + 1 < len(fences) else (len(body), len(body))
        prose(pos, open_start)
        for line in _LINE.finditer(body, open_start, close_end):  # code: one unit per line
            add(*line.span())
        pos = close_end
    prose(pos, len(body))
    return [(a, b) for a, b in units if body[a:b].strip()]


PASSAGE_MAX_TERMS = 32  # of a question's terms looked for in a passage: the longest (most specific)


def _term_matchers(terms: set[str]) -> list[tuple[re.Pattern[str], bool]]:
    """Patterns finding ``terms`` (:func:`content_terms` keys) in text in one scan each:
    ``(pattern, is_word)``. A 6-letter word key matches any word starting with it, a shorter one
    the whole word; a digit-bearing token matches whole, trailing punctuation allowed. At most
    ``PASSAGE_MAX_TERMS`` terms, the longest: an alternation's cost grows with its branches, and a
    2,000-character question holds hundreds."""
    terms = set(sorted(terms, key=lambda t: (-len(t), t))[:PASSAGE_MAX_TERMS])
    words = sorted((t for t in terms if not any(c.isdigit() for c in t)), key=len, reverse=True)
    tokens = sorted((t for t in terms if any(c.isdigit() for c in t)), key=len, reverse=True)
    matchers = []
    if words:
        alternatives = "|".join(re.escape(w) + (r"\w*" if len(w) >= 6 else r"(?!\w)") for w in words)
        matchers.append((re.compile(rf"(?<!\w)(?:{alternatives})", re.I), True))
    if tokens:
        alternatives = "|".join(re.escape(t) for t in tokens)
        matchers.append((re.compile(rf"(?<![\w/.:-])(?:{alternatives})(?=[/.:-]*(?![\w/.:-]))", re.I), False))
    return matchers


def query_passage(query: str, body: str, budget: int) -> str:
    """At most ``budget`` characters of ``body`` chosen for ``query`` (a query-biased snippet,
    Tombros and Sanderson, SIGIR 1998): ``body`` itself when it fits, else its lines (long lines
    split into sentences) that hold the query's terms, in document order, non-adjacent pieces
    joined by ``PASSAGE_GAP`` (adjacent ones by one newline or space).

    A line scores the TF-ISF of the query terms it holds (term frequency-inverse sentence
    frequency, Neto et al. 2000): each distinct query term (:func:`content_terms`) found in it
    adds ln(1 + U / u_t), U the body's line count and u_t the lines holding t, so a word on every
    line (the product's name) weighs little. Chosen in order: lines scoring at least half the
    best; their neighbours (the line before and after, for context); the other matching lines by
    score; then the body's first lines. A body with no query term gives its first ``budget``
    characters, as does a blank ``query``. Linear in ``len(body)``: the terms are found by one
    regular-expression scan per kind of term, not line by line.
    """
    if len(body) <= budget:
        return body
    asked = content_terms(query)
    if not asked:
        return body[:budget]
    units = _passage_units(body)
    starts = [a for a, _ in units]
    held: dict[int, set[str]] = {}
    for pattern, is_word in _term_matchers(asked):
        for match in pattern.finditer(body):
            i = bisect.bisect_right(starts, match.start()) - 1
            if i >= 0 and match.start() < units[i][1]:
                key = match.group(0).lower()
                held.setdefault(i, set()).add(key[:6] if is_word else key)
    if not held:
        return body[:budget]
    spread: dict[str, int] = {}
    for terms in held.values():
        for t in terms:
            spread[t] = spread.get(t, 0) + 1
    weight = {t: math.log(1 + len(units) / u) for t, u in spread.items()}
    scores = {i: sum(weight[t] for t in terms) for i, terms in held.items()}
    best = max(scores.values())
    by_score = sorted(scores, key=lambda i: (-scores[i], i))
    chosen: set[int] = set()
    used = 0

    def take(i: int) -> None:
        nonlocal used
        if not 0 <= i < len(units) or i in chosen:
            return
        cost = units[i][1] - units[i][0] + len(PASSAGE_GAP)
        if used + cost <= budget:
            chosen.add(i)
            used += cost

    for i in by_score:
        if scores[i] >= best / 2:
            take(i)
    for i in sorted(chosen):
        take(i - 1)
        take(i + 1)
    for i in by_score:
        take(i)
    for i in range(len(units)):
        if budget - used <= len(PASSAGE_GAP):
            break
        take(i)
    pieces: list[str] = []
    previous = -2
    for i in sorted(chosen):
        a, b = units[i]
        if i == previous + 1 and pieces:
            between = body[units[previous][1] : a]
            pieces[-1] += ("\n" if "\n" in between else " ") + body[a:b].strip()
        else:
            pieces.append(body[a:b].strip())
        previous = i
    text = PASSAGE_GAP.join(p.strip() for p in pieces)
    text = ("" if 0 in chosen else PASSAGE_GAP.lstrip()) + text
    return text[:budget] if text.strip() else body[:budget]


@dataclass
class Evidence:
    """A numbered evidence block: what the synthesizer may cite as ``[n]``.

    ``text`` is the block shown to the synthesizer (at most ``SNIPPET_CHARS`` characters);
    ``url`` a real link (``path#Lstart-Lend`` for code, the permalink for a thread).
    """

    n: int
    document_id: int
    kind: str
    title: str
    url: str
    text: str
    score: float
    tool: str
    path: str = ""
    start_line: int | None = None
    end_line: int | None = None
    updated_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source_public_id: str = ""
    external_id: str = ""
    context: str = ""  # neighbouring context, shown apart from the block's own text
    lexical_rank: int | None = None  # rank in the full-text list, None when it did not match
    dense_rank: int | None = None  # rank in the embedding list, None when it was not among its candidates
    similarity: float | None = None  # cosine similarity to the question, when dense-ranked
    # Other sections or chunks of the same file merged into this block (one number per document):
    # [{document_id, title, location, link, start_line, end_line}]; their text follows this block's own.
    sections: list[dict[str, Any]] = field(default_factory=list)
    # The whole row (and merged sections), at most BODY_CHARS: what the source says beyond the
    # excerpt in ``text``, for checking an answer's names against it. Not serialised.
    body: str = field(default="", repr=False)

    @property
    def document_ids(self) -> list[int]:
        """This block's row and the rows of the sections merged into it."""
        return [self.document_id, *(s["document_id"] for s in self.sections)]

    @property
    def is_relevant(self) -> bool:
        """Matched the question's words, or is semantically close (cosine >= 0.35)."""
        return self.lexical_rank is not None or (self.similarity or 0.0) >= RELEVANT_SIMILARITY

    @property
    def link(self) -> str:
        """Where a click goes: the original http(s) url, else the portal's document page."""
        return portal_link(self.url, self.source_public_id, self.external_id, self.start_line)

    @property
    def location(self) -> str:
        if self.path and self.start_line:
            return f"{self.path}:{self.start_line}-{self.end_line}"
        return self.path or self.url

    def as_dict(self) -> dict[str, Any]:
        # What dataclasses.asdict gives (fields in order, containers copied), less ``body``,
        # without its generic deep copy: the metadata and sections are JSON values.
        data = {f.name: _json_copy(getattr(self, f.name)) for f in fields(self) if f.name != "body"}
        data["updated_at"] = self.updated_at.isoformat() if self.updated_at else None
        data["location"] = self.location
        data["link"] = self.link
        return data


def _json_copy(value: Any) -> Any:
    """``value`` with its dicts, lists and tuples copied (recursively), leaves as they are."""
    if isinstance(value, dict):
        return {_json_copy(k): _json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(v) for v in value)
    return value


CONTIGUOUS_KINDS = {"code_chunk", "code_file", "doc_page"}  # shown from their start (code reads in order)


def evidence_from_hit(hit: Hit, *, tool: str, query: str = "") -> Evidence:
    """Normalise a retrieval hit; the text is the chunk's raw content cut to ``SNIPPET_CHARS``,
    or for a longer non-code row and a ``query``, the passage of it that query picks
    (:func:`query_passage`): a long record or thread is shown where it matches, not from its head."""
    body = hit.content if hit.kind not in {"code_file", "doc_page"} else hit.text
    if query and hit.kind not in CONTIGUOUS_KINDS:
        body = query_passage(query, body, SNIPPET_CHARS)
    return Evidence(
        n=0,
        document_id=hit.document_id,
        kind=hit.kind,
        title=hit.title,
        url=hit.url,
        text=body[:SNIPPET_CHARS],
        score=hit.score,
        tool=tool,
        path=hit.path,
        start_line=hit.start_line,
        end_line=hit.end_line,
        updated_at=hit.updated_at,
        metadata={k: v for k, v in hit.metadata.items() if k in _KEPT_METADATA},
        source_public_id=hit.source_public_id,
        context=hit.context,
        external_id=hit.external_id,
        body=(hit.content or hit.text or "")[:BODY_CHARS],
        lexical_rank=_best_rank(hit.ranks, "lexical"),
        dense_rank=_best_rank(hit.ranks, "dense"),
        similarity=hit.similarity,
    )


def _best_rank(ranks: dict[str, int], ranker: str) -> int | None:
    """The hit's best rank in ``ranker``'s unrestricted lists (passages, documents, and a merged
    file row's), ``None`` when it is in none of them."""
    names = (ranker, f"{ranker}:document", f"{ranker}:file", f"{ranker}:document:file")
    found = [ranks[name] for name in names if name in ranks]
    return min(found) if found else None


_KEPT_METADATA = {"symbol", "language", "heading_path", "channel", "participants", "sha", "author", "pr_number"}


def evidence_text(evidence: Iterable[Evidence], *, whole: bool = False) -> str:
    """What the blocks say, one after another: each block's title, text and context, and a
    thread's channel as ``#name`` (a thread from #billing holds that channel even when its text
    never writes it). With ``whole``, each block's whole row (``body``) rather than its excerpt:
    what the answer checks read, since a name the excerpt left out is still in the source. The
    one text the gate's and the answer checks' value checks read."""
    parts = []
    for ev in evidence:
        channel = f"#{ev.metadata['channel']}\n" if ev.metadata.get("channel") else ""
        text = ev.body or ev.text if whole else ev.text
        parts.append(f"{channel}{ev.title}\n{text}\n{ev.context}")
    return "\n".join(parts)


FILE_KINDS = frozenset({"code_chunk", "code_file", "doc_section", "doc_page"})
MERGED_TEXT_CHARS = 2 * SNIPPET_CHARS  # a block holding several sections of one file shows at most this much


def document_key(ev: Evidence) -> str:
    """What one citation number stands for: a file or page (its sections and chunks together),
    else the row itself."""
    if ev.path and ev.kind in FILE_KINDS:
        return f"file:{ev.source_public_id}:{ev.path}"
    return f"doc:{ev.document_id}"


def _link_or_blank(ev: Evidence) -> str:
    """``ev.link``, or ``""`` for a row whose source id names no page (evidence built by hand)."""
    from django.urls import NoReverseMatch

    try:
        return ev.link
    except NoReverseMatch:
        return ""


def _merge_section(block: Evidence, other: Evidence) -> None:
    """Add ``other`` (a section or chunk of ``block``'s file) to ``block``: its text after a
    line naming it, and its place in ``block.sections``."""
    if other.document_id in block.document_ids:
        return
    block.sections.append(
        {
            "document_id": other.document_id,
            "title": other.title,
            "location": other.location,
            "link": _link_or_blank(other),
            "start_line": other.start_line,
            "end_line": other.end_line,
        }
    )
    room = MERGED_TEXT_CHARS - len(block.text)
    if room > 200:
        heading = other.title.split(" > ")[-1] if " > " in other.title else other.location
        block.text = f"{block.text}\n\n### {heading}\n{other.text}"[:MERGED_TEXT_CHARS]
    if len(block.body) < BODY_CHARS:
        block.body = f"{block.body}\n\n{other.body}"[:BODY_CHARS]
    if other.context and other.context not in block.context:
        block.context = f"{block.context}\n{other.context}".strip()
    for attr in ("lexical_rank", "dense_rank"):
        ranks = [r for r in (getattr(block, attr), getattr(other, attr)) if r is not None]
        setattr(block, attr, min(ranks) if ranks else None)
    block.similarity = max((s for s in (block.similarity, other.similarity) if s is not None), default=None)


def number_evidence(groups: list[list[Evidence]], *, limit: int = 10) -> list[Evidence]:
    """Merge the tools' evidence lists into blocks numbered 1..n, one number per document.

    Interleaving (round-robin over the tools, each list best first) keeps every tool's best
    row in view; a row two tools found keeps its first position; a section or chunk of a file
    already numbered joins that file's block (:func:`document_key`, ``Evidence.sections``), so
    one file is never cited under two numbers. At most ``limit`` blocks.
    """
    by_key: dict[str, Evidence] = {}
    merged: list[Evidence] = []
    depth = max((len(g) for g in groups), default=0)
    for i in range(depth):
        for group in groups:
            if i >= len(group):
                continue
            ev = group[i]
            key = document_key(ev)
            if key in by_key:
                _merge_section(by_key[key], ev)
            elif len(merged) < limit:
                by_key[key] = ev
                merged.append(ev)
    for n, ev in enumerate(merged, start=1):
        ev.n = n
    return merged
