"""The words asking who knows a topic or did a piece of work ("Who knows ...", "Who can I ask
about ...", "Who set up ..."), routed to the ``who_knows`` tool and set aside as question terms
once it credits people (``search.pipeline.passages.credits_people``)."""

from __future__ import annotations

import re

# "Who knows Y": a question for the people who know a topic or did a piece of work, answered by the
# people the ``who_knows`` tool credits for the documents about it (their authors, reviewers,
# repliers; a commit's author did what it says), not by a sentence stating it. ``EXPERTISE``
# routes such a question to that tool (the rule planner). ``EXPERTISE_WITHOUT_FOCUS`` is the part
# whose words no source writes of the topic ("knows", "worked on", "can I ask", "is the expert",
# "set up", "wrote"): once the tool has credited people for it, these words are no focus and no
# term the evidence must hold (``search.pipeline.gate.credits_people``). An act a document records
# of someone rather than one its author did ("Who *approved* the refund?", "Who *signed* ...") is
# not among them, nor an owner, a maintainer named as such or someone responsible: those are
# routed (``EXPERTISE``) but stay the focus, to be stated ("Owner: Dana").
_ASKING_VERBS = r"(?:ask|talk\s+to|speak\s+(?:to|with)|contact|reach\s+out\s+to|ping|go\s+to|turn\s+to)"
_WORK_VERBS = (
    r"(?:knows|knew|wrote|written|writing|built|building|implemented|implementing|added|adding|introduced|"
    r"created|designed|developed|developing|made|configured|configuring|set(?:ting)?\s+(?:(?:it|this|that|these|those|them)\s+)?up|fixed|fixing|"
    r"changed|changing|updated|updating|touched|refactored|migrated|maintains|maintained|maintaining|"
    r"(?:did|does)(?=\s*(?:[?.!,]|$|\s+(?:it|that|this|those|these|the\s+(?:work|most))\b))|doing|done|handles|handled|handling|"
    r"(?:worked|works|working|contributed|contributing)\s+(?:on|to)|"
    r"(?:familiar|experienced)\s+with|(?:experience|context|knowledge)\s+(?:with|of|on|about|in))"
)
_WHO_AUXILIARIES = r"(?:\s+(?:else|has|have|had|is|are|was|were|been|most|the\s+most))*"
EXPERTISE_WITHOUT_FOCUS = re.compile(
    rf"\bwho(?:['’]s)?{_WHO_AUXILIARIES}\s+{_WORK_VERBS}\b"
    rf"|\b(?:which|what)\s+(?:person|people|engineers?|developers?|colleagues?|teammates?){_WHO_AUXILIARIES}\s+{_WORK_VERBS}\b"
    r"|\b(?:anyone|anybody|someone|somebody)\s+(?:who\s+)?(?:is\s+|has\s+)?"
    r"(?:(?:familiar|experienced)\s+with|(?:experience|context)\s+(?:with|on|in)|worked\s+on)\b"
    r"|\bwho(?:['’]s)?\s+(?:is\s+|are\s+)?(?:the\s+|our\s+|an?\s+)?(?:experts?|go-to(?:\s+person)?|point\s+of\s+contact|"
    r"contacts?|specialists?)\b"
    rf"|\bwho\s+(?:(?:can|could|should|shall|do|would|might)\s+(?:I|we)\s+|to\s+){_ASKING_VERBS}\b"
    r"|\bwho(?:\s+else)?\s+(?:would|might|could|should|will|may)\s+know\b"
    rf"|\bwho(?:['’]s|\s+is)\s+(?:the\s+)?(?:best\s+|right\s+)?(?:person|one)\s+to\s+{_ASKING_VERBS}\b"
    r"|\b(?:experts?|specialists?)\s+(?:on|in|for)\b",
    re.I,
)
EXPERTISE = re.compile(
    EXPERTISE_WITHOUT_FOCUS.pattern + r"|\bwho\s+(?:owns|owned|(?:is|are|was|were)\s+responsible\s+for|"
    r"(?:is|are)\s+(?:the\s+|our\s+)?(?:owners?|maintainers?))\b",
    re.I,
)


def asks_for_expertise(question: str) -> bool:
    """Whether ``question`` asks who knows, owns or works on something (``EXPERTISE``)."""
    return EXPERTISE.search(question) is not None


def expertise_words(question: str) -> list[str]:
    """The words of the phrase asking for the people who know a topic or did a piece of work
    (``EXPERTISE_WITHOUT_FOCUS``: "Who *can I ask* about ...", "Who *knows* ...", "Who *set up*
    ..."), lower-cased; empty for any other question."""
    match = EXPERTISE_WITHOUT_FOCUS.search(question)
    return [w.lower() for w in re.findall(r"[\w-]+", match.group(0))] if match else []
