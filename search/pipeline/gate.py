"""The answerability gate: does the evidence answer the question at all?

When it says no, the synthesizer declines ("the sources do not contain this") instead of
pointing at unrelated rows. One function, used by every surface through ``search.services``.
"""

from __future__ import annotations

from search.pipeline.evidence import Evidence


def evidence_answers(question: str, evidence: list[Evidence]) -> bool:
    """True when at least one evidence block is relevant to ``question`` (see ``Evidence.is_relevant``)."""
    return any(e.is_relevant for e in evidence)
