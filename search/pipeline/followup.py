"""Follow-up questions: rewrite a question that leans on earlier turns into one that stands alone.

In a conversation, "and for websockets?" or "how do I test it?" means nothing to retrieval on
its own. :func:`rewrite_followup` returns the question the pipeline answers instead:

- with an LLM configured: one short call (strict JSON ``{"question": ...}``, its own timeout
  ``KB_LLM_REWRITE_TIMEOUT`` seconds) given the last turns; any failure falls back to the rule;
- without: the rule. A question *leans on* the earlier turns when it opens as a continuation
  ("and ...", "what about ...", "same for ..."), holds an anaphor ("it", "that", "those"; not a
  pronoun that points at nothing: "is it possible", "make sure that"), or names at most one
  content word of its own; one naming an identifier of its own ("where is APIRouter defined?")
  does not, unless it opens as a continuation. Then the earlier
  question's key words (its content words: no stop, function or question words) are carried
  forward, except those the follow-up already says and a *sibling modifier*: the word before a
  head word both questions share ("query parameters" after "path parameter" drops "path").
  A question that does not lean on history is left exactly as asked (a change of topic).

The rewrite is shown to the asker, so the rule's output reads as the question plus what it was
taken to be about: ``"and for websockets? (about: dependency yield cleanup)"``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from search.llm import llm_client, llm_configured
from search.pipeline.passages import FUNCTION_WORDS
from search.text import STOP_WORDS, WORD, content_terms, specific_terms

logger = logging.getLogger(__name__)

RewriteMethod = Literal["none", "rules", "llm"]

HISTORY_TURNS = 3  # earlier turns the LLM sees (the rule reads the last one, which carries what it leaned on)
ANSWER_CHARS = 400  # of each earlier answer the LLM sees
MAX_CARRIED = 8  # key words carried forward at most (the earlier question's first ones)

# A follow-up that opens as a continuation of what came before.
_CONTINUATION = re.compile(
    r"^\s*(?:and|also|plus|or|but|so|then|what\s+about|how\s+about|what\s+if|same\s+(?:thing\s+)?(?:for|with|but|in)"
    r"|the\s+same\s+(?:for|with|in)|and\s+(?:for|with|in|on|if|what|how|why|where|when|which|who))\b",
    re.I,
)
# Words that point back at something named earlier.
ANAPHORS = frozenset("it its itself this that these those they them their theirs same such former latter".split())
# "Is it possible to ...", "is there a way": a pronoun that points at nothing.
_DUMMY = re.compile(
    r"\b(?:is|was|would|will)\s+(?:it|this|that)\s+(?:be\s+)?(?:possible|ok|okay|safe|true|better|worth|necessary|"
    r"recommended|good|bad|wise)\b|\bit(?:'s|’s|\s+is)\s+(?:possible|ok|okay|safe|true|better|worth|necessary|"
    r"recommended)\b|\b(?:make\s+sure|ensure|so)\s+that\b",
    re.I,
)
QUESTION_WORDS = frozenset("what which who whom whose when where why how".split())


@dataclass(frozen=True)
class Turn:
    """An earlier turn of the conversation: what was asked, what the pipeline answered
    (``standalone``, the rewrite or the question itself) and the answer's text."""

    question: str
    standalone: str
    answer: str = ""


@dataclass(frozen=True)
class Rewrite:
    """``standalone`` is what the pipeline answers; ``method`` how it was made (``none``: the
    question as asked); ``carried`` the earlier words the rule added; ``error`` why the LLM
    rewrite fell back to the rule."""

    question: str
    standalone: str
    method: RewriteMethod = "none"
    carried: tuple[str, ...] = ()
    error: str = ""

    @property
    def rewritten(self) -> bool:
        return self.standalone != self.question


def _words(text: str) -> list[str]:
    return WORD.findall(text)


def leans_on_history(question: str) -> bool:
    """Whether ``question`` needs the earlier turns to be understood (module docstring)."""
    if specific_terms(question, acronyms=False) and not _CONTINUATION.search(question):
        return False  # it names an identifier of its own: "where is APIRouter defined?"
    own_terms = len(content_terms(question))
    if _CONTINUATION.search(question) or own_terms <= 1:
        return True
    words = {w.lower() for w in _words(_DUMMY.sub(" ", question))}
    return bool(words & ANAPHORS)


def _is_key_word(word: str) -> bool:
    lower = word.lower()
    return (
        len(word) > 2
        and lower not in STOP_WORDS
        and lower not in FUNCTION_WORDS
        and lower not in ANAPHORS
        and lower not in QUESTION_WORDS
    )


def _stem(word: str) -> str:
    return next(iter(content_terms(word)), word.lower())


def carried_words(question: str, earlier: str) -> list[str]:
    """The key words of ``earlier`` that ``question`` leans on, in ``earlier``'s order, each once
    (module docstring): not those ``question`` already says, nor a sibling modifier."""
    own = {_stem(w) for w in _words(question)}
    words = _words(earlier)
    siblings = {_stem(words[i - 1]) for i in range(1, len(words)) if _stem(words[i]) in own and _is_key_word(words[i])}
    carried: list[str] = []
    seen: set[str] = set()
    for word in words:
        stem = _stem(word)
        if _is_key_word(word) and stem not in own and stem not in siblings and stem not in seen:
            seen.add(stem)
            carried.append(word)
    return carried[:MAX_CARRIED]


def rule_rewrite(question: str, history: Sequence[Turn]) -> Rewrite:
    """The rule's rewrite of ``question`` given ``history`` (oldest first); the question as
    asked when there is no history or it does not lean on it."""
    if not history or not leans_on_history(question):
        return Rewrite(question=question, standalone=question)
    carried = carried_words(question, history[-1].standalone)
    if not carried:
        return Rewrite(question=question, standalone=question)
    standalone = f"{question.strip()} (about: {' '.join(carried)})"
    return Rewrite(question=question, standalone=standalone, method="rules", carried=tuple(carried))


REWRITE_PROMPT = (
    "You rewrite the last question of a conversation with a company knowledge base so that it "
    "can be understood without the conversation. Replace pronouns and elliptical phrases with what "
    "they refer to in the earlier turns; keep every word the question itself says; add nothing "
    "the conversation does not say. If the question already stands alone (a new topic), return it "
    'unchanged. Reply with JSON only: {"question": "<the standalone question>"}'
)
REWRITE_SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}},
    "required": ["question"],
    "additionalProperties": False,
}


def _rewrite_messages(question: str, history: Sequence[Turn]) -> list[dict[str, str]]:
    lines = []
    for turn in history[-HISTORY_TURNS:]:
        lines.append(f"User: {turn.standalone}")
        if turn.answer:
            answer = " ".join(turn.answer.split())
            lines.append(f"Assistant: {answer[:ANSWER_CHARS]}{'…' if len(answer) > ANSWER_CHARS else ''}")
    lines.append(f"Last question: {question}")
    return [{"role": "system", "content": REWRITE_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def llm_rewrite(question: str, history: Sequence[Turn]) -> str:
    """The LLM's standalone form of ``question`` (one call, timeout ``KB_LLM_REWRITE_TIMEOUT`` s).

    The reply passes the question check every path applies (``search.retrieval.clean_query``:
    NUL and unpaired surrogates removed, whitespace collapsed). Raises ``ValueError`` for a reply
    that is not ``{"question": <string>}``, ``InvalidQuery`` (a ``ValueError``) for a blank or too
    long one, and whatever the client raises (timeout, connection, HTTP error)."""
    from django.conf import settings

    from search.retrieval import clean_query

    response = (
        llm_client()
        .with_options(timeout=settings.KB_LLM_REWRITE_TIMEOUT)
        .chat.completions.create(
            model=settings.KB_LLM_MODEL,
            messages=_rewrite_messages(question, history),
            temperature=0,
            max_tokens=120,
            response_format={"type": "json_object", "schema": REWRITE_SCHEMA},  # type: ignore[typeddict-unknown-key]
        )
    )
    content = re.sub(r"^```(?:json)?|```$", "", (response.choices[0].message.content or "").strip())
    value = json.loads(content).get("question")
    if not isinstance(value, str):
        raise ValueError("the reply holds no question")
    return clean_query(value)


def rewrite_followup(question: str, history: Sequence[Turn]) -> Rewrite:
    """What the pipeline answers for ``question`` asked after ``history`` (oldest first).

    No history: the question as asked (``method`` ``none``). With an LLM configured:
    :func:`llm_rewrite` (``method`` ``llm``), falling back to :func:`rule_rewrite` with ``error``
    set on any failure (the exception's type and HTTP status only: a provider's message may echo
    keys or internal URLs, so it goes to the server log). Without: :func:`rule_rewrite`. Never
    raises."""
    if not history:
        return Rewrite(question=question, standalone=question)
    if llm_configured():
        try:
            standalone = llm_rewrite(question, history)
            return Rewrite(question=question, standalone=standalone, method="llm" if standalone != question else "none")
        except Exception as exc:  # the rule stands in for a failed call
            logger.warning("follow-up rewrite failed: %s", exc)
            status = getattr(exc, "status_code", None)
            http = f", HTTP {status}" if isinstance(status, int) else ""
            error = f"the rewrite failed ({type(exc).__name__}{http}); see the server log"
            return dataclasses.replace(rule_rewrite(question, history), error=error)
    return rule_rewrite(question, history)
