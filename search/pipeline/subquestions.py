"""A question as the sub-questions it asks: "what watchdog did we add, and which team owns it?"
asks two things, and an answer must say both.

People write one message holding context and several questions: "Our CI builds the app later, so
startup crashes. How do I stop the check, and what happens if the folder is still missing?".
The context names the topic (which document); each question names a detail of it (which
passage). Answer extraction and the gate treat each asked clause on its own: its terms, its
focus (``answer_types.question_focus``) and the form of value it asks for
(``answer_types.asked_answer_type``). This is question decomposition for multi-part questions
(Harabagiu et al., "Answering complex questions with random walk models", SIGIR 2006;
Perez et al., "Unsupervised question decomposition for question answering", EMNLP 2020), kept to
what the syntax shows: sentences, and clauses joined by "and" before a new question word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from search.pipeline.answer_types import AnswerType, asked_answer_type, question_focus
from search.text import QUOTED

# Words that open an asking clause: a question word, or an auxiliary or modal in first place
# ("Is it expected?", "Can I keep ...?", "Does it ...?").
_WH = r"what|whats|which|who|whom|whose|whos|when|where|wheres|why|how|hows"
_AUX = r"is|are|was|were|do|does|did|can|could|will|would|should|shall|has|have|had|may|might|must"
# A preposition may lead a question word ("at what rate ...").
_LEAD = r"(?:(?:at|in|on|for|from|to|by|with|after|before|under|since|until)\s+)?"
_ASKING = re.compile(rf"^\W*(?:(?:and|or|but|so|also|then|plus)\s+)?(?:{_LEAD}(?:{_WH})|{_AUX})\b", re.I)
_WH_ANYWHERE = re.compile(rf"\b(?:{_WH})\b", re.I)
# A sentence ends at ".", "?" or "!" before a space and a capital, a digit or a quote, or before a
# question word or auxiliary in any case (chat writes "... upgrade. what was cut off?"); at a
# question mark before a space ("...? and will it ...", not "search?q=" in a link); and at a
# full-width or Arabic question mark, which needs no space after it.
_SENTENCE = re.compile(rf"(?<=\?)\s+|(?<=[？؟])\s*|(?<=[.!。！])\s+(?=[A-Z0-9\"'`(“]|(?i:{_WH}|{_AUX})\b)")
# A full stop that ends no sentence when what follows asks nothing: a title or a common abbreviation
# ("Dr. Smith approved it"), or an ordinal ("am 3. Februar"). Before a question ("... Redis etc.
# What is the TTL?", "... Postgres 14. What caused it?") it ends one.
_NO_END = re.compile(
    r"(?:\b(?:Dr|Mr|Mrs|Ms|Prof|St|Sr|Jr|vs|etc|Inc|Ltd|Co|No|approx|e\.g|i\.e|cf)|\b\d{1,2})\.$", re.I
)
# Inside a question: a clause joined by "and", ";" or a comma that opens with a new question word
# (or, after "and" or ";", an auxiliary) asks a second thing ("..., and which team owns it",
# "...; how long ...", "which PO did they add, what GL code ..."); a preposition may lead it
# ("..., and at what rate ...").
_CLAUSE = re.compile(
    rf"(?:\s*;\s*(?:and\s+)?|,?\s+and\s+(?:also\s+)?)(?={_LEAD}(?:{_WH})\b|(?:{_AUX})\b)"
    # after a bare comma, only a question with its auxiliary before the subject ("..., what GL code
    # *are* we using"): "..., which I need for X" and "..., when the job fires" relate, not ask.
    # The cost: a subject question after a bare comma ("What is the TTL, who set it?") stays in
    # the clause before it (its words still count; "and who set it" splits)
    rf"|,\s*(?:also\s+|plus\s+)?(?={_LEAD}(?:whats|wheres|hows|whos|(?:{_WH})\b(?:\s+[\w'-]+){{0,3}}?\s+(?:{_AUX}|can't|won't|don't|doesn't|didn't|isn't|aren't)\b))",
    re.I,
)
MIN_CLAUSE_WORDS = 3  # a shorter piece ("and when?") stays with the clause before it


@dataclass(frozen=True)
class SubQuestion:
    """One asked clause of a question.

    ``text`` the asking words as written (no trailing "?"; a piece too short to ask on its own,
    "when" of "Who approved it, when, and why?", joined to the clause before it with "and");
    ``context`` what leads them in their sentence and asks nothing itself ("After the Feb 3
    outage" of "After the Feb 3 outage, what did we add?": the topic, which names the document,
    not the passage); ``asked`` the form of value it asks for, or ``None``; ``focus`` the word
    naming what it asks about, or ``None``; ``index`` its place among the question's asked
    clauses (0 for the first)."""

    text: str
    index: int
    asked: AnswerType | None
    focus: str | None
    context: str = ""


def _asks(sentence: str) -> bool:
    """Whether ``sentence`` asks something: it ends with "?", or opens with a question word or an
    auxiliary (chat drops the question mark), or holds a question word after a comma ("Given
    X, what ...")."""
    bare = QUOTED.sub(" x ", sentence).strip()
    return (
        bare.endswith(("?", "？", "؟")) or bool(_ASKING.match(bare)) or bool(_WH_ANYWHERE.search(bare) and "," in bare)
    )


def _words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def sub_questions(question: str) -> list[SubQuestion]:
    """The asked clauses of ``question``, in order (:class:`SubQuestion`); a question with one
    clause, or none that the syntax shows, is one sub-question: the whole text.

    Sentences that ask nothing ("Our CI builds the app in a separate step.") are context: they
    are no sub-question (their words still count for the question as a whole). A quoted span is
    never split. Alternatives joined by "or" ("Will it serve them, or only the plain files?")
    stay one clause: answering either answers it."""
    masked, spans = _mask_quotes(question.replace("\x00", " "))  # NUL marks a masked quote
    clauses: list[tuple[str, str]] = []  # (context, asking words)
    sentences: list[str] = []
    for piece in _SENTENCE.split(masked.strip()):
        if sentences and _NO_END.search(sentences[-1]) and not _ASKING.match(piece):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    for sentence in sentences:
        if not sentence.strip() or not _asks(sentence):
            continue
        merged: list[tuple[str, str]] = []
        context = short = ""  # what asks nothing ("For the softball team") leads the next clause; "When" joins it
        for piece in (p.strip() for p in _CLAUSE.split(sentence) if p and p.strip()):
            if not _ASKING.match(piece) and not short:
                context = f"{context}, {piece}" if context else piece
            elif _words(piece) < MIN_CLAUSE_WORDS:
                short = f"{short} and {piece}" if short else piece
            else:
                merged.append((context, f"{short}, {piece}" if short else piece))
                context = short = ""
        if short or context:
            if merged:
                ctx, last = merged[-1]
                merged[-1] = (ctx, " and ".join(p for p in (last, short, context) if p))
            else:
                merged.append(("", ", ".join(p for p in (context, short) if p)))
        clauses.extend(merged)
    found = [(_unmask(c, spans).strip(), _unmask(t, spans).strip().rstrip("?？؟.!。！").strip()) for c, t in clauses]
    found = [(c, t) for c, t in found if t] or [("", question.strip().rstrip("?").strip())]
    return [
        SubQuestion(text=t, index=i, asked=asked_answer_type(t), focus=question_focus(t), context=c)
        for i, (c, t) in enumerate(found)
    ]


_PLACEHOLDER = "\x00{}\x00"


def _mask_quotes(text: str) -> tuple[str, list[str]]:
    spans: list[str] = []

    def keep(match: re.Match[str]) -> str:
        spans.append(match.group(0))
        return _PLACEHOLDER.format(len(spans) - 1)

    return QUOTED.sub(keep, text), spans


def _unmask(text: str, spans: list[str]) -> str:
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], text)
