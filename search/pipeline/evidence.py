"""The one evidence schema every tool's rows are normalised into, numbered ``[1]..[n]``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from search.retrieval import Hit, portal_link

SNIPPET_CHARS = 1200
RELEVANT_SIMILARITY = 0.35


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
    similarity: float | None = None  # cosine similarity to the question, when dense-ranked

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
        data = asdict(self)
        data["updated_at"] = self.updated_at.isoformat() if self.updated_at else None
        data["location"] = self.location
        data["link"] = self.link
        return data


def evidence_from_hit(hit: Hit, *, tool: str) -> Evidence:
    """Normalise a retrieval hit; the text is the chunk's raw content cut to ``SNIPPET_CHARS``."""
    body = hit.content if hit.kind not in {"code_file", "doc_page"} else hit.text
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
        lexical_rank=hit.ranks.get("lexical", hit.ranks.get("lexical:file")),
        similarity=hit.similarity,
    )


_KEPT_METADATA = {"symbol", "language", "heading_path", "channel", "participants", "sha", "author", "pr_number"}


def number_evidence(groups: list[list[Evidence]], *, limit: int = 10) -> list[Evidence]:
    """Merge the tools' evidence lists: dedupe by document, interleave by rank, number 1..n.

    Interleaving (round-robin over the tools, each list best first) keeps every tool's best
    row in view; a document two tools found keeps its first position.
    """
    seen: set[int] = set()
    merged: list[Evidence] = []
    depth = max((len(g) for g in groups), default=0)
    for i in range(depth):
        for group in groups:
            if i < len(group) and group[i].document_id not in seen:
                seen.add(group[i].document_id)
                merged.append(group[i])
    merged = merged[:limit]
    for n, ev in enumerate(merged, start=1):
        ev.n = n
    return merged
