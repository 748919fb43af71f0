"""The answerability gate: does the evidence answer the question, fully, partly or not at all?

Two checks, both deterministic (no LLM), used by every surface through ``search.services``:

1. **Relevance**: at least one evidence block matched the question's words or is semantically
   close (``Evidence.is_relevant``). None → the answer declines outright.
2. **Coverage**: the question's terms that *no document the asker may read* contains at all.
   A question naming things the sources never mention ("per-request CO2e", "`kv_crc`",
   "Resizable BAR") cannot be answered from them, however on-topic the closest evidence is:
   the answer then says which terms are missing and that it may not answer fully. Each unknown
   term weighs 1, a specific one (digits, ``snake_case``, ``CamelCase``, dotted, ALL-CAPS,
   quoted or back-ticked) 2; at ``PARTIAL_WEIGHT`` or more the answer is partial.

3. **Answer type**: a question asking for a value of a recognisable form (a Slack channel, an
   email address, a link, a version, a count or amount; ``asked_answer_type``) cannot be
   answered from evidence holding no value of that form. The classic expected-answer-type check
   of QA pipelines (Moldovan et al., "The structure and performance of an open-domain question
   answering system", ACL 2000), kept to forms a pattern recognises without error. The
   synthesizer applies the same check to an LLM's answer.

The coverage check runs against the scoped rows (tenant, project sources, document
principals), never against global statistics, so the missing-terms note cannot reveal what a
restricted document contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.db import connection

from kbportal.tenancy import tenant_context
from search.pipeline.evidence import Evidence, evidence_text
from search.retrieval import scope_where_sql
from sources.selectors import QueryScope

PARTIAL_WEIGHT = 4
MAX_TERMS = 40  # a question's distinct terms considered (longer questions: the first 40)

_QUOTED = re.compile(r"`([^`]{1,200})`|\"([^\"]{1,200})\"|“([^”]{1,200})”")
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-']*[A-Za-z0-9]|[A-Za-z0-9]")
_SPECIFIC = re.compile(r"\d|_|[a-z][A-Z]|\w\.\w")


@dataclass(frozen=True)
class Coverage:
    """Question terms absent from every readable document in scope.

    ``unknown`` keeps the question's own spelling, in question order; ``weight`` is the sum of
    their weights (1 per term, 2 per specific term).
    """

    unknown: tuple[str, ...] = ()
    weight: int = 0
    checked: int = 0  # how many distinct terms were looked up

    @property
    def partial(self) -> bool:
        """The sources miss enough of what the question names that an answer can only be partial."""
        return self.weight >= PARTIAL_WEIGHT


@dataclass(frozen=True)
class AnswerType:
    """A form of answer a question asks for: ``question`` recognises the asking ("which Slack
    channel"), ``answer`` a value of that form in text ("#incidents")."""

    label: str
    question: re.Pattern[str]
    answer: re.Pattern[str]
    verbatim: bool = True  # a value sources write as it is (a channel), not one an answer derives (a count)

    def values(self, text: str) -> list[str]:
        """The values of this form in ``text``, in order, each once (citations ``[n]`` do not count)."""
        return list(dict.fromkeys(m.group(0) for m in self.answer.finditer(_CITATIONS.sub(" ", text))))

    def held_by(self, text: str) -> bool:
        """True when ``text`` holds a value of this form (citations ``[n]`` do not count)."""
        return bool(self.answer.search(_CITATIONS.sub(" ", text)))


_CITATIONS = re.compile(r"\[\d+(?:\s*,\s*\d+)*\]")


_NUMBER_WORDS = "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|dozen|hundred|thousand|million|none|no"
ANSWER_TYPES = (
    AnswerType(
        "Slack channel",
        # "channel" alone may be a Go or Kafka channel: Slack must be named
        re.compile(r"\b(?:which|what)\s+slack\s+channels?\b|\b(?:which|what)\s+channels?\b.*\bslack\b", re.I | re.S),
        re.compile(r"(?<![\w#&/])#[A-Za-z][A-Za-z0-9_-]*[A-Za-z0-9]"),
    ),
    AnswerType(
        "email address",
        re.compile(r"\b(?:which|what)\s+e-?mail(?:\s+address(?:es)?)?\b", re.I),
        re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),  # starts only at a token start: linear
    ),
    AnswerType("link", re.compile(r"\b(?:which|what)\s+(?:url|link)s?\b", re.I), re.compile(r"https?://\S+")),
    AnswerType(
        "version",
        re.compile(r"\b(?:which|what)\s+(?:[\w-]+\s+){0,2}versions?\b", re.I),
        # 2.2.3, v2, 1.x, "version 3", "Python 3"
        re.compile(r"\b\d+(?:\.(?:\d+|x))+\b|\bv\d+\b|\b(?:version|release)\s+\d+|\b[A-Z][A-Za-z]+\s+\d+\b", re.I),
    ),
    AnswerType(
        "number",
        re.compile(r"\bhow\s+(?:many|much)\b", re.I),
        re.compile(rf"\d|\b(?:{_NUMBER_WORDS})\b", re.I),
        verbatim=False,  # "how many writeups …" is counted across sources, not copied from one
    ),
)


def asked_answer_type(question: str) -> AnswerType | None:
    """The form of answer ``question`` asks for (``ANSWER_TYPES``, first match), or ``None``."""
    return next((t for t in ANSWER_TYPES if t.question.search(question)), None)


def missing_type_note(label: str) -> str:
    """The sentence that opens an answer whose evidence holds no value of the asked form."""
    return f"The sources found do not state a {label}, which the question asks for."


def ungrounded_values_note(values: list[str], label: str) -> str:
    """The sentence that opens an LLM answer giving values of the asked form its cited blocks lack."""
    listed = ", ".join(f"“{v}”" for v in values[:8])
    return f"The cited sources do not state {listed}, the {label} this answer gives: treat it as unverified."


def unstated_type_note(label: str) -> str:
    """The sentence that opens an LLM answer naming no value of the asked form."""
    return f"This answer does not state the {label} the question asks for: the sources found may not hold it."


@dataclass(frozen=True)
class Verdict:
    """What the gate decided: ``relevant`` (some evidence matched), the question's coverage, and
    ``missing_type``: the label of the asked answer type when no relevant block holds one."""

    relevant: bool
    coverage: Coverage = field(default_factory=Coverage)
    missing_type: str = ""

    @property
    def partial(self) -> bool:
        """Relevant evidence that cannot answer fully: unknown terms or no value of the asked form."""
        return self.coverage.partial or bool(self.missing_type)

    @property
    def declines(self) -> bool:
        """The answer must say the sources do not (fully) answer the question."""
        return not self.relevant or self.partial


def _is_specific(term: str, quoted: bool) -> bool:
    if quoted or _SPECIFIC.search(term):
        return True
    letters = [c for c in term if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters)


def question_terms(question: str) -> list[tuple[str, bool]]:
    """``[(term, specific)]``: quoted/back-ticked spans whole, other words split on ``/``.

    Deduplicated case-insensitively, in question order, at most ``MAX_TERMS``.
    """
    terms: list[tuple[str, bool]] = []
    seen: set[str] = set()

    def add(term: str, quoted: bool) -> None:
        term = term.strip(" .,;:!?()[]{}'\"")
        if term and term.lower() not in seen and len(terms) < MAX_TERMS:
            seen.add(term.lower())
            terms.append((term, _is_specific(term, quoted)))

    for match in _QUOTED.finditer(question):
        add(next(g for g in match.groups() if g is not None), True)
    rest = _QUOTED.sub(" ", question)
    for token in _TOKEN.findall(rest.replace("/", " ")):
        add(token, False)
    return terms


def question_coverage(question: str, scope: QueryScope) -> Coverage:
    """Which of the question's terms no document readable in ``scope`` contains.

    A term is present when one readable row's full-text vector holds all of its parts
    (``plainto_tsquery('english', term)``, hyphens and underscores split into parts); stop
    words are skipped. One SQL statement of indexed (GIN) lookups; runs in the scope's tenant
    context.
    """
    terms = question_terms(question)
    if not terms:
        return Coverage()
    where, params = scope_where_sql(scope, None)
    params["terms"] = [t for t, _ in terms]
    sql = f"""
        SELECT t.i, EXISTS (
            SELECT 1 FROM sources_document d
            WHERE d.search_vector @@ plainto_tsquery('english', translate(t.term, '_-', '  ')) AND {where}
        )
        FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, i)
        WHERE numnode(plainto_tsquery('english', translate(t.term, '_-', '  '))) > 0
    """
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    unknown = [terms[i - 1] for i, present in sorted(rows) if not present]
    return Coverage(
        unknown=tuple(t for t, _ in unknown),
        weight=sum(2 if specific else 1 for _, specific in unknown),
        checked=len(rows),
    )


_DECLINE = re.compile(
    r"\b(?:do(?:es)?\s+not|don't|doesn't|cannot|can't|could\s+not|couldn't|unable\s+to)\b[^.\n]{0,60}?"
    r"\b(?:contain|mention|answer|say|specify|specified|include|find|found|provide|cover|describe|state)"
    r"|\bnot\s+(?:fully\s+)?(?:mentioned|specified|found|covered|available|provided|described|answerable)\b"
    r"|\bno\s+(?:information|mention|details?|evidence)\b",
    re.I,
)


def text_declines(text: str) -> bool:
    """True when an answer's text says the sources do not (fully) answer the question."""
    return bool(_DECLINE.search(text))


def missing_terms_note(coverage: Coverage) -> str:
    """The sentence that opens a partial answer, naming what the sources never mention."""
    names = ", ".join(f"“{t}”" for t in coverage.unknown[:8])
    return f"The sources do not mention {names}, so they may not answer this fully."


def evidence_answers(question: str, evidence: list[Evidence]) -> bool:
    """True when at least one evidence block is relevant to ``question`` (see ``Evidence.is_relevant``)."""
    return any(e.is_relevant for e in evidence)


def judge(question: str, evidence: list[Evidence], scope: QueryScope) -> Verdict:
    """The gate's verdict for ``question`` given the tools' ``evidence`` in ``scope``."""
    relevant = evidence_answers(question, evidence)
    if not relevant:
        return Verdict(relevant=False)
    asked = asked_answer_type(question)
    held = asked is None or asked.held_by(evidence_text(ev for ev in evidence if ev.is_relevant))
    return Verdict(
        relevant=True,
        coverage=question_coverage(question, scope),
        missing_type="" if held else asked.label,
    )
