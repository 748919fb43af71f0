"""Checks after the answer: a declared list, run in order in one loop (:data:`CHECKS`).

Each check reads the synthesizer's draft (``search.pipeline.drafts.Draft``) with the
question and the evidence, and either passes or returns what it found, which changes the answer
in the way its ``action`` says. The extractive answer quotes the evidence, so the checks that
look for what a language model may invent apply to LLM drafts only (``llm_only``).

- ``declines_answered``: an LLM answer citing nothing and saying the sources do not answer,
  when the gate found they do (its evidence model and the LLM's sufficiency judgement both).
- ``uncited``: an LLM answer citing no evidence that does not say the sources lack the answer;
  each sentence a block supports gets its ``[n]``; when none is, the draft cannot stand.
- ``unsupported_names``: code, field or ``#channel`` names no evidence block (nor the question)
  holds.
- ``names_no_person``: an answer to who knows a topic naming none of the people credited for it.
- ``unstated_type``: no value of the form the question asks for (a Slack channel, a count, ...).
- ``ungrounded_values``: an asked-for channel, email, link or version none of the cited blocks
  holds.

A draft that cannot stand is **replaced by the extractive answer** (the passages that answer the
question, quoted with their ``[n]``) when the gate found the evidence answers the question
(``Verdict.answered``): the gate decides whether the sources answer, and the model's failure to
write a grounded answer from them is no reason to decline what they answer. Otherwise (a partial
verdict, or no extractive answer that passes every check) the answer opens with the check's note and counts as
declined; an uncited draft becomes a decline naming the closest sources. Grounded fallback in the
spirit of attribution-then-revision (Gao et al., "RARR", ACL 2023): what the model wrote that the
evidence does not support is not shown as an answer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from search.pipeline.answer_types import asked_answer_type, ungrounded_values_note, unstated_type_note
from search.pipeline.drafts import CLOSEST_HEADER, Draft, closest_lines
from search.pipeline.evidence import Evidence, evidence_text
from search.pipeline.extractive import extractive_answer
from search.pipeline.gate import Verdict, text_declines
from search.pipeline.synthesizer import LLM_EVIDENCE_BLOCKS, prompt_text
from search.text import content_terms

logger = logging.getLogger(__name__)

UNCITED_NOTE = (
    "The sources do not contain an answer I can cite: the language model's draft cited none of them, so it is not "
    "shown."
)


@dataclass
class Answer:
    """The final answer: ``text`` to show, ``cited`` block numbers, ``answered`` (false for any
    decline or partial answer), ``checks`` the names of the checks that changed it, ``error``
    what was changed or failed (for the page and the API's ``done.error``)."""

    text: str
    cited: list[int]
    synthesizer: str  # "llm" | "extractive"
    answered: bool
    removed_citations: list[int] = field(default_factory=list)
    error: str = ""
    checks: list[str] = field(default_factory=list)


@dataclass
class Finding:
    """What a check found: ``note`` opens the answer (a decline); ``replace`` replaces its text
    and citations (``cited``); ``declines`` marks the answer declined; ``error`` says what changed.
    ``grounded_fallback``: the draft cannot stand, and under an answered verdict the extractive
    answer replaces it (module docstring) instead of the note or replacement."""

    error: str
    note: str = ""
    replace: str | None = None
    cited: list[int] | None = None
    declines: bool = True
    grounded_fallback: bool = True


@dataclass(frozen=True)
class CheckInput:
    question: str
    evidence: Sequence[Evidence]
    verdict: Verdict
    text: str  # the draft's own words (without the gate's opening notes)
    cited: Sequence[int]
    synthesizer: str = "llm"  # who wrote ``text``: an extractive answer's words are the evidence's


@dataclass(frozen=True)
class AnswerCheck:
    name: str
    detects: str
    action: str
    run: Callable[[CheckInput], Finding | None]
    llm_only: bool = True


# -- declines_answered ----------------------------------------------------------------------------


def check_declines_answered(c: CheckInput) -> Finding | None:
    """An LLM draft that only declines, citing no evidence and saying the sources do not answer
    (``gate.text_declines``), where the gate found they do: its evidence model and the LLM's own
    yes/no sufficiency judgement both said so (``Verdict.decided_by`` "evidence and llm"). The
    gate is where answerability is decided; the draft is asked to write, and a small model
    writing from long evidence often hedges. Measured with the local 1.5B model over the test sets
    of stop 34: such drafts were wrong for 5 answerable questions and right for 1 unanswerable
    one. So the draft gives way to the extractive answer (``grounded_fallback``); when that answer
    cannot stand either, the draft's decline stays. A draft citing evidence keeps its words (a
    negative fact, "the deploy does not include a manual approval [1]", or an answer with a
    caveat, counts as declined as written), and so does one where the rule alone decided (the
    judgement failed, or no LLM judged)."""
    if c.synthesizer != "llm" or c.cited or not c.verdict.answered or "llm" not in c.verdict.decided_by:
        return None
    if not text_declines(c.text):
        return None
    logger.info("LLM answer declined under an answered verdict: %.200s", c.text)
    return Finding(error="the language model's answer said the sources do not answer, though the gate found they do")


# -- uncited -------------------------------------------------------------------------------------

ATTRIBUTION_SHARE = 0.5  # of a sentence's new terms one block must hold to be cited for it
ATTRIBUTION_MIN_TERMS = 2  # a sentence adding fewer new terms states nothing to attribute
_ANSWER_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _block_terms(question: str, ev: Evidence) -> set[str]:
    return content_terms(f"{ev.title}\n{prompt_text(question, ev)}\n{ev.context[:300]}")


def attribute_citations(question: str, text: str, evidence: Sequence[Evidence]) -> tuple[str, list[int]]:
    """Post-hoc attribution of an answer that cites nothing: each sentence whose *new* terms
    (``content_terms`` of the sentence less the question's) are at least ``ATTRIBUTION_SHARE``
    held by one evidence block, and number at least ``ATTRIBUTION_MIN_TERMS``, gets that block's
    ``[n]`` (the block holding most; ties: the lower number) before its final punctuation.
    Returns ``(text, cited numbers in order)``; ``cited`` is empty when no sentence is
    supported. Retrieval-based attribution as in Gao et al., "RARR: Researching and Revising
    What Language Models Say", ACL 2023, reduced to term overlap with the blocks the model was
    given."""
    asked = content_terms(question)
    blocks = [(ev.n, _block_terms(question, ev)) for ev in evidence[:LLM_EVIDENCE_BLOCKS]]
    cited: list[int] = []
    out: list[str] = []
    pos = 0
    for match in [*_ANSWER_SENTENCE.finditer(text), None]:
        end = match.start() if match else len(text)
        sentence = text[pos:end]
        new = content_terms(sentence) - asked
        best_n, best_held = 0, 0
        for n, terms in blocks:
            held = len(new & terms)
            if held > best_held:
                best_n, best_held = n, held
        if len(new) >= ATTRIBUTION_MIN_TERMS and best_held >= ATTRIBUTION_SHARE * len(new):
            stripped = sentence.rstrip()
            cut = len(stripped) - 1 if stripped and stripped[-1] in ".!?" else len(stripped)
            sentence = f"{stripped[:cut]} [{best_n}]{stripped[cut:]}{sentence[len(stripped) :]}"
            if best_n not in cited:
                cited.append(best_n)
        out.append(sentence)
        if match:
            out.append(match.group(0))
            pos = match.end()
    return "".join(out), cited


def check_uncited(c: CheckInput) -> Finding | None:
    if c.cited or text_declines(c.text):
        return None
    text, cited = attribute_citations(c.question, c.text, c.evidence)
    if cited:
        return Finding(
            error="the language model cited nothing; citations were attributed to the blocks holding its words",
            replace=text,
            cited=cited,
            declines=False,
            grounded_fallback=False,
        )
    logger.info("LLM answer cited no evidence; declining instead: %.200s", c.text)
    return Finding(
        error="the language model's answer cited none of the evidence, so it was replaced",
        replace="\n".join([UNCITED_NOTE, "", CLOSEST_HEADER, *closest_lines(c.evidence)]),
        cited=[],
    )


# -- unsupported names ---------------------------------------------------------------------------

_ANSWER_NAME = re.compile(
    r"`([^`\n]{2,80})`"  # back-ticked code, fields, paths
    r"|\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*[A-Za-z0-9]\b"  # snake_case
    r"|(?<![\w#&/])#[A-Za-z][A-Za-z0-9_-]*[A-Za-z0-9]"  # a Slack channel (#incidents), not an issue number
)


def _flat(value: str) -> str:
    return re.sub(r"\s+", " ", value).strip().lower()


def known_text(evidence: Sequence[Evidence], question: str = "") -> str:
    """What ``evidence`` (its whole rows, ``evidence_text(whole=True)``) and ``question`` say,
    flattened (lower case, single spaces)."""
    return _flat(f"{question}\n{evidence_text(evidence, whole=True)}")


def holds_whole(known: str, value: str) -> bool:
    """``value`` occurs in ``known`` as a whole name: "#deploys" is not "#deploys-archive"."""
    return bool(re.search(r"(?<![\w#-])" + re.escape(_flat(value)) + r"(?![\w-])", known))


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_DEFINED = re.compile(
    r"^\s*(?:async\s+)?(?:def|class|function|fn|func)\s+([A-Za-z_]\w*)"  # def / class / function NAME
    r"|^\s*(?:(?:const|let|var)\s+)?([A-Za-z_]\w*)\s*(?::\s*[\w\[\]., |]+)?\s*=(?!=)"  # NAME = ... / NAME: T = ...
    r"|\{([A-Za-z_]\w*)\}",  # a path parameter: "/items/{item_id}"
    re.M,
)
_PARAMETERS = re.compile(r"^\s*(?:async\s+)?def\s+\w+\s*\(([^)]*)\)", re.M | re.S)
# RFC 2606 reserves these names for examples: an answer's example URL claims nothing.
_EXAMPLE_HOST = re.compile(r"^(?:https?://)?(?:[\w-]+\.)*(?:example\.(?:com|org|net)|localhost|127\.0\.0\.1)\b", re.I)


_STRING_LITERAL = re.compile(r"""(["'])([^"'\n]{1,80})\1""")


def example_names(text: str) -> set[str]:
    """Names the answer's own fenced code defines (``def``/``class``/``function`` names, assigned
    variables, a ``def``'s parameters, ``{path}`` parameters) and the string literals it writes
    (a route ``"/login"``, a header ``"X-Token"``), lower case: the answer's example introduces
    them, so they claim nothing about the sources. Empty for an answer without code."""
    names: set[str] = set()
    for block in _FENCE.findall(text):
        for match in _DEFINED.finditer(block):
            names.update(g.lower() for g in match.groups() if g)
        for params in _PARAMETERS.findall(block):
            names.update(m.lower() for m in re.findall(r"(?:^|,)\s*\**([A-Za-z_]\w*)", params))
        names.update(_flat(literal) for _, literal in _STRING_LITERAL.findall(block))
    return names


def _is_illustration(name: str, own: set[str], known: str) -> bool:
    """``name`` (flattened) is the answer's own example: one of ``own`` once its quotes, brackets
    and call parentheses are dropped (``["x-token"]``, ``"/login"``), or an attribute of an object
    the example defines whose attribute the sources hold (``app.include_router()`` with ``app``
    the example's and ``include_router`` the sources')."""
    core = name.strip("[]()'\"").removesuffix("()")
    if core in own:
        return True
    head, dot, attr = core.partition(".")
    return bool(dot) and head in own and (attr in own or holds_whole(known, attr))


def invented_names(question: str, text: str, evidence: Sequence[Evidence]) -> list[str]:
    """Names the answer writes (back-ticked spans, not counting escaped backticks; ``snake_case``
    words; ``#channel`` names) that
    neither the question nor any evidence block's document (title, the whole row, context, and a
    thread's channel as ``#name``) contains, compared without case or spacing differences, in answer order, each
    once. A channel is matched with its ``#``: a thread's word "deploys" does not make
    "#deploys" a channel. Names the answer's own code example defines or writes as a string
    (:func:`example_names`, :func:`_is_illustration`) and URLs on the RFC 2606 example hosts are
    the answer's illustration, not claims, and are left out."""
    known = known_text(evidence, question)
    own = example_names(text)
    names: list[str] = []
    # A backslash-escaped backtick is a character of the text (a quoted title), not a code span's edge.
    for match in _ANSWER_NAME.finditer(text.replace("\\`", "'")):
        name = _flat(match.group(1) or match.group(0))
        if not name or name in names or _EXAMPLE_HOST.match(name) or holds_whole(known, name):
            continue
        if _is_illustration(name, own, known):
            continue
        names.append(name)
    return names


def invented_names_note(names: Sequence[str]) -> str:
    """The sentence that opens an answer naming things no source holds (it reads as a decline)."""
    listed = ", ".join(f"“{n}”" for n in names[:8])
    return f"The sources do not mention {listed}, which this answer names: treat it as unverified."


def check_unsupported_names(c: CheckInput) -> Finding | None:
    names = invented_names(c.question, c.text, c.evidence)
    if not names:
        return None
    logger.info("LLM answer names what no evidence holds: %s", names)
    return Finding(
        error="the language model's answer names what no source holds; a note says so", note=invented_names_note(names)
    )


# -- the asked form of value ----------------------------------------------------------------------


def _type_checked(c: CheckInput):
    asked = asked_answer_type(c.question)
    return asked if asked and not c.verdict.partial and not text_declines(c.text) else None


def check_unstated_type(c: CheckInput) -> Finding | None:
    asked = _type_checked(c)
    if asked is None or asked.held_by(c.text):
        return None
    logger.info("LLM answer states no %s, which the question asks for", asked.label)
    return Finding(
        error=f"the language model's answer states no {asked.label}; a note says so",
        note=unstated_type_note(asked.label),
    )


def ungrounded_values(question: str, text: str, evidence: Sequence[Evidence], cited: Sequence[int]) -> list[str]:
    """Values of the form the question asks for (a Slack channel, an email, a link, a version:
    ``AnswerType.verbatim``) that the answer gives but none of the blocks it cites holds: a
    claim its citations do not support (citation precision, Gao et al., "Enabling Large
    Language Models to Generate Text with Citations", EMNLP 2023, reduced to the asked value).
    Empty when no such form is asked for or every value is in a cited block."""
    asked = asked_answer_type(question)
    if asked is None or not asked.verbatim:
        return []
    known = known_text([ev for ev in evidence if ev.n in set(cited)])
    values = [v.rstrip(".,;:") for v in asked.values(text)]
    # "version 2.2.3" is grounded by "2.2.3": a dotted core stands for the value without its prefix
    return [
        v
        for v in values
        if not holds_whole(known, v) and not ("." in asked.core(v) and holds_whole(known, asked.core(v)))
    ]


def check_ungrounded_values(c: CheckInput) -> Finding | None:
    asked = _type_checked(c)
    if asked is None or not asked.held_by(c.text):
        return None
    values = ungrounded_values(c.question, c.text, c.evidence, c.cited)
    if not values:
        return None
    logger.info("LLM answer gives %s no cited block holds: %s", asked.label, values)
    return Finding(
        error=f"the language model's answer gives a {asked.label} its cited sources lack; a note says so",
        note=ungrounded_values_note(values, asked.label),
    )


# -- names_no_person -----------------------------------------------------------------------------


def check_names_no_person(c: CheckInput) -> Finding | None:
    """An LLM answer to who knows a topic, when the ``who_knows`` tool credited people for the
    evidence that answers it (``ScoredEvidence.credited_asking``), that names none of them (a person
    block's name, or an alias, as written): it answers another question ("the tutorial is in the
    security chapter"). Under the answered verdict the extractive answer, which names them,
    replaces it."""
    scored = c.verdict.scored
    if c.synthesizer != "llm" or not c.verdict.answered or scored is None or not scored.credited_asking:
        return None
    people = [ev for ev in c.evidence if ev.kind == "person" and ev.is_relevant]
    names = {n.casefold() for ev in people for n in [ev.title, *(ev.metadata.get("aliases") or [])] if n}
    text = c.text.casefold()
    if any(name in text for name in names):
        return None
    logger.info("LLM answer to a who-knows question names no one credited: %.200s", c.text)
    return Finding(
        error="the language model's answer names none of the people credited for the question; a note says so",
        note="The answer names none of the people the sources credit for this.",
    )


CHECKS: tuple[AnswerCheck, ...] = (
    AnswerCheck(
        "declines_answered",
        "an LLM answer citing nothing and saying the sources do not answer, when the gate and the LLM's "
        "sufficiency judgement found they do",
        "the extractive answer (under the answered verdict), else the draft's decline stands; declined",
        check_declines_answered,
    ),
    AnswerCheck(
        "uncited",
        "an LLM answer citing no evidence that does not say the sources lack the answer",
        "cites each sentence a block supports; when none is: the extractive answer under an answered verdict, "
        "else a decline naming the closest sources",
        check_uncited,
    ),
    AnswerCheck(
        "unsupported_names",
        "code, field or #channel names that no evidence block nor the question holds",
        "the extractive answer under an answered verdict, else a note naming them; declined",
        check_unsupported_names,
    ),
    AnswerCheck(
        "names_no_person",
        "an LLM answer to who knows a topic that names none of the people the who_knows tool credited for it",
        "the extractive answer under an answered verdict, else a note saying so; declined",
        check_names_no_person,
    ),
    AnswerCheck(
        "unstated_type",
        "no value of the form the question asks for (Slack channel, email, link, version, count)",
        "the extractive answer under an answered verdict, else a note saying so; declined",
        check_unstated_type,
    ),
    AnswerCheck(
        "ungrounded_values",
        "an asked-for channel, email, link or version that none of the cited blocks holds",
        "the extractive answer under an answered verdict, else a note naming them; declined",
        check_ungrounded_values,
    ),
)


def check_answer(question: str, evidence: Sequence[Evidence], verdict: Verdict, draft: Draft) -> Answer:
    """Run :data:`CHECKS` on ``draft``; the final :class:`Answer`.

    ``answered`` is true only for a draft that sets out to answer, under an ``answered`` verdict,
    whose text cites evidence and does not itself decline, and that no check marked declined.
    A check's note is added after the gate's; a replacement ends the loop (nothing is left to check).
    A finding with ``grounded_fallback`` under an answered verdict replaces the draft with the
    extractive answer when that answer passes every check, and ends the loop."""
    body = draft.text[len(draft.note) :].lstrip() if draft.note and draft.text.startswith(draft.note) else draft.text
    text, cited, synthesizer = body, list(draft.cited), draft.synthesizer
    notes: list[str] = []
    applied: list[str] = []
    errors = [draft.error] if draft.error else []
    declined = False
    for check in CHECKS:
        if check.llm_only and draft.synthesizer != "llm":
            continue
        if not draft.answers:
            break
        finding = check.run(
            CheckInput(
                question=question, evidence=evidence, verdict=verdict, text=text, cited=cited, synthesizer=synthesizer
            )
        )
        if finding is None:
            continue
        applied.append(check.name)
        if finding.grounded_fallback and verdict.answered:
            grounded = extractive_answer(question, list(evidence), verdict=verdict)
            again = CheckInput(
                question=question,
                evidence=evidence,
                verdict=verdict,
                text=grounded.text,
                cited=grounded.cited,
                synthesizer=grounded.synthesizer,
            )
            if grounded.answers and grounded.cited and not any(other.run(again) for other in CHECKS):
                logger.info("LLM answer failed check %s; answered extractively", check.name)
                errors.append(
                    f"the language model's answer failed the {check.name} check; the answer quotes the sources instead"
                )
                text, cited, synthesizer = grounded.text, list(grounded.cited), grounded.synthesizer
                break
        errors.append(finding.error)
        declined = declined or finding.declines
        if finding.note:
            notes.append(finding.note)
        if finding.replace is not None:
            text, cited = finding.replace, list(finding.cited or [])
            if finding.declines:
                break
    opening = " ".join([n for n in [draft.note] if n] + notes)
    final = f"{opening}\n\n{text}" if opening else text
    # An extractive answer quotes the evidence: a quoted "not found" is no decline of its own.
    own_decline = synthesizer == "llm" and text_declines(text)
    answered = draft.answers and verdict.answered and not declined and bool(cited) and not own_decline
    return Answer(
        text=final,
        cited=cited,
        synthesizer=synthesizer,
        answered=answered,
        removed_citations=draft.removed_citations,
        error=errors[0] if len(errors) == 1 else "; ".join(errors),
        checks=applied,
    )
