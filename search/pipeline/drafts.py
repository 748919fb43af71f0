"""What every synthesizer writes: the :class:`Draft` it hands to the checks, Markdown made literal
(a document's text quoted in an answer never becomes a link or a heading), the plain decline with
the closest sources, and the gate's notes that open a partial answer.

Used by the extractive synthesizer (``search.pipeline.extractive``) and the LLM one
(``search.pipeline.synthesizer``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from search.pipeline.answer_types import missing_focus_note, missing_type_note
from search.pipeline.evidence import Evidence
from search.pipeline.gate import EMPTY_SCOPE_NOTE, NO_EVIDENCE_NOTE, NOT_FOUND_NOTE, Verdict, missing_terms_note
from search.text import neutralize_citations

CLOSEST_HEADER = "Closest, not answering:"
CLOSEST_SOURCES = 3


@dataclass
class Draft:
    """The synthesizer's answer before the checks: ``text`` as written (citations validated),
    ``cited`` the valid numbers in first-citation order, ``synthesizer`` ``"llm"`` or
    ``"extractive"``, ``removed_citations`` numbers refused, ``error`` what went wrong (an LLM
    failure answered extractively), ``answers`` whether the text sets out to answer (false for a
    decline: not found, or no evidence)."""

    text: str
    cited: list[int]
    synthesizer: str
    answers: bool
    removed_citations: list[int] = field(default_factory=list)
    error: str = ""
    note: str = ""  # the gate's notes the text opens with (partial verdicts)


# -- the answer the gate does not allow -------------------------------------------------------


CLOSEST_TITLE_CHARS = 200  # of a closest source's title (a commit's subject line can run long)


def shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, "…" marking the cut
    (unchanged when it fits); a single word longer than ``limit`` is cut inside it."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:.-") + "…"


def closest_evidence(evidence: Sequence[Evidence]) -> list[Evidence]:
    """The closest sources a decline names: the first ``CLOSEST_SOURCES`` relevant blocks (else
    the first blocks), the same in the answer's text and in the list the page shows beside it."""
    return [ev for ev in evidence if ev.is_relevant][:CLOSEST_SOURCES] or list(evidence[:CLOSEST_SOURCES])


def closest_lines(evidence: Sequence[Evidence]) -> list[str]:
    """``- title (location)`` for :func:`closest_evidence`: the closest sources, named without a
    citation because they do not support an answer."""
    lines = []
    for ev in closest_evidence(evidence):
        title = markdown_text(shortened(" ".join(neutralize_citations(ev.title).split()), CLOSEST_TITLE_CHARS))
        where = ev.location if ev.location and ev.location not in ev.title else ""
        lines.append(f"- {title}" + (f" ({code_span(where)})" if where else ""))
    return lines


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")


def markdown_text(text: str) -> str:
    """``text`` (a title, a name) escaped so that Markdown shows it as written: ``__init__.py``
    stays a file name, not bold "init"."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_quote(text: str) -> str:
    """Prose quoted from a document, made literal for Markdown: its code spans kept (they render
    as code), everything else escaped, so a document's ``[text](url)`` cannot become a link in
    the portal's own answer, nor its ``**`` a heading's style."""
    out, pos = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(markdown_text(text[pos : match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(markdown_text(text[pos:]))
    return "".join(out)


_LANGUAGE = re.compile(r"[^\w+#.-]")


def fence_language(language: object) -> str:
    """A code fence's info string from connector data: word characters, ``+#.-``, at most 30."""
    return _LANGUAGE.sub("", str(language or ""))[:30]


def code_span(text: str) -> str:
    """``text`` (a path, a location, a symbol) as a Markdown code span, fenced with enough backticks."""
    text = " ".join(text.split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def decline_text(
    evidence: Sequence[Evidence], *, no_evidence: bool = False, notes: Sequence[str] = (), empty_scope: bool = False
) -> str:
    """The plain decline: the sources do not answer (and ``notes``: what they lack); the closest
    ones named as not answering. ``empty_scope``: the scope holds nothing readable yet (says so)."""
    if empty_scope:
        return EMPTY_SCOPE_NOTE
    if no_evidence or not evidence:
        return NO_EVIDENCE_NOTE
    return "\n".join([" ".join([NOT_FOUND_NOTE, *notes]), "", CLOSEST_HEADER, *closest_lines(evidence)])


_NOTE_SPECIAL = re.compile(r"([\\`*\[\]<>#|])|(?<![^\W_])_|_(?![^\W_])")  # "_" inside a word ("kv_crc") is text


def note_text(term: str) -> str:
    """A word of the question quoted in a gate note, shown as written: a "[1]" of the asker's is no
    citation, "__init__" no bold text; an identifier's inner "_" is left as it is (Markdown reads it
    as text)."""
    return _NOTE_SPECIAL.sub(lambda m: "\\" + m.group(0), neutralize_citations(term))


def gate_notes(verdict: Verdict) -> list[str]:
    """The sentences opening a partial answer: the named things the evidence lacks, the question's
    focus its answering passages never mention, the best passage's saying the matter is still
    open, and the asked form of value it holds none of.
    After a decline (``not_found``) they say what is missing, not that the sources answer in part."""
    terms = [note_text(term) for term in verdict.missing_terms]
    partial = verdict.status != "not_found"
    notes = [missing_terms_note(terms, partial=partial)] if terms else []
    if verdict.missing_focus:
        notes.append(missing_focus_note(note_text(verdict.missing_focus), partial=partial))
    if verdict.still_open:
        notes.append(still_open_note(verdict.still_open))
    return notes + ([missing_type_note(verdict.missing_type)] if verdict.missing_type else [])


def still_open_note(sentence: str) -> str:
    """The sentence opening an answer whose best passage says the matter is still open, quoting it."""
    return f"The sources found do not answer this: they say it is not known or decided yet: “{note_text(sentence)}”"
