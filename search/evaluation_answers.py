"""Answer evaluation: the whole ask pipeline on gold-labelled questions (``kb_eval --answers``).

For each question, ``search.services.ask_stream`` runs planner -> tools -> gate -> synthesizer
and the report measures, per question type and overall (``shared/eval/README.md``):

- **declines**: the answer is not counted as answered (``Answer.answered`` false: the gate
  found the evidence does not answer, or answers only in part, or a check after the answer
  marked it declined; the text then says so). For ``unanswerable`` questions the share that
  decline is the score (target >= 0.9); for the others the share that decline is the
  false-decline rate.
- **facts**: the share of the question's ``answer_facts`` the answer states, judged by the
  configured LLM (one call per fact, JSON ``{"stated": bool}``); ``None`` without an LLM.
- **citations**: every ``[n]`` the synthesizer wrote, valid or removed by the validator;
  validity = valid / all. ``cited_gold``: share of answered questions with gold items whose
  cited sources include one (``search.evaluation.gold_matches``, a merged section counting too).
- **latency**: time to first answer token and total, p50/p95 in milliseconds.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from search.evaluation import Question, gold_matches, percentile
from sources.selectors import QueryScope

logger = logging.getLogger(__name__)

UNANSWERABLE = "unanswerable"


@dataclass
class AnswerResult:
    question: Question
    text: str
    declined: bool
    synthesizer: str
    cited_gold_found: bool | None
    verdict: dict | None
    citations_valid: int
    citations_removed: int
    first_token_ms: float | None
    total_ms: float
    facts_stated: list[bool] = field(default_factory=list)
    error: str = ""

    @property
    def cited_gold(self) -> bool | None:
        return self.cited_gold_found if self.question.gold and not self.declined else None


# A rubric of what "stated" means: with the bare "strict grader" prompt, qwen-1.5b judged 5 of 8
# hand-labelled (answer, fact) pairs from ERB answers right ("Thu 18:00" was not "Thursday at
# 18:00"); with this one, 7 of 8.
JUDGE_PROMPT = (
    "You are a grader. Decide whether the ANSWER contains the key information of the FACT: the same names, "
    'numbers, dates and claims, in any wording or abbreviation ("Thu" = "Thursday"). Ignore citations like [1]. '
    'Minor details in parentheses may be missing. Reply with JSON only: {"stated": true} or {"stated": false}.'
)


def judge_fact(answer: str, fact: str) -> bool | None:
    """Ask the configured LLM whether ``answer`` states ``fact``; ``None`` when it cannot tell."""
    from django.conf import settings

    from search.llm import llm_client

    try:
        response = llm_client().chat.completions.create(
            model=settings.KB_LLM_MODEL,
            messages=[
                {"role": "system", "content": JUDGE_PROMPT},
                {"role": "user", "content": f"ANSWER:\n{answer}\n\nFACT:\n{fact}\n\nDoes the ANSWER state the FACT?"},
            ],
            temperature=0,
            max_tokens=20,
            response_format={"type": "json_object"},
        )
        return bool(json.loads(response.choices[0].message.content or "")["stated"])
    except Exception as exc:  # a judge failure leaves the fact unjudged, never fails the run
        logger.warning("fact judge failed: %s", exc)
        return None


def _cites_gold(question: Question, sources) -> bool:
    """Whether a cited block (or a section merged into it) matches one of the question's gold items."""
    from types import SimpleNamespace

    for ev in sources:
        views = [ev] + [
            SimpleNamespace(
                kind=ev.kind,
                path=ev.path,
                metadata=ev.metadata,
                external_id=ev.external_id,
                start_line=s.get("start_line"),
                end_line=s.get("end_line"),
            )
            for s in ev.sections
        ]
        if any(gold_matches(g, v) for g in question.gold for v in views):
            return True
    return False


def answer_question(question: Question, scope: QueryScope) -> AnswerResult:
    """Run one question through ``ask_stream``; times the first token and the whole answer."""
    from search.services import ask_stream

    t0 = time.perf_counter()
    first: float | None = None
    done = None
    for event in ask_stream(question.text, scope):
        if event.type == "token" and first is None:
            first = (time.perf_counter() - t0) * 1000
        if event.type == "done":
            done = event
    total = (time.perf_counter() - t0) * 1000
    assert done is not None and done.result is not None
    result = done.result
    answer = result.answer
    return AnswerResult(
        question=question,
        text=answer.text,
        declined=not answer.answered,
        synthesizer=answer.synthesizer,
        cited_gold_found=_cites_gold(question, result.sources) if question.gold else None,
        verdict=result.as_dict()["verdict"],
        citations_valid=len(answer.cited),
        citations_removed=len(answer.removed_citations),
        first_token_ms=first,
        total_ms=total,
        error=answer.error,
    )


def evaluate_answers(questions: list[Question], scope: QueryScope, *, judge: bool | None = None) -> dict[str, Any]:
    """Answer every question; returns the report dict (see the module docstring).

    ``judge`` defaults to whether an LLM is configured. ``report["by_type"][type]`` and
    ``report["overall"]`` hold n, declined share, facts share (or None), cited_gold share.
    """
    from search.llm import llm_configured

    judge = llm_configured() if judge is None else judge
    results: list[AnswerResult] = []
    for q in questions:
        r = answer_question(q, scope)
        if judge and q.type != UNANSWERABLE:
            r.facts_stated = [s for s in (judge_fact(r.text, f) for f in q.facts) if s is not None]
        results.append(r)

    def share(values: list[bool]) -> float | None:
        return round(sum(values) / len(values), 3) if values else None

    def summary(rows: list[AnswerResult]) -> dict[str, Any]:
        facts = [s for r in rows for s in r.facts_stated]
        return {
            "n": len(rows),
            "declined": share([r.declined for r in rows]),
            "facts": share(facts) if judge else None,
            "cited_gold": share([r.cited_gold for r in rows if r.cited_gold is not None]),
        }

    by_type: dict[str, list[AnswerResult]] = defaultdict(list)
    for r in results:
        by_type[r.question.type].append(r)
    unanswerable = [r for r in results if r.question.type == UNANSWERABLE]
    answerable = [r for r in results if r.question.type != UNANSWERABLE]
    valid = sum(r.citations_valid for r in results)
    removed = sum(r.citations_removed for r in results)
    firsts = sorted(r.first_token_ms for r in results if r.first_token_ms is not None)
    totals = sorted(r.total_ms for r in results)
    return {
        "overall": summary(results),
        "by_type": {t: summary(rows) for t, rows in sorted(by_type.items())},
        "unanswerable_declined": share([r.declined for r in unanswerable]),
        "answerable_declined": share([r.declined for r in answerable]),
        "citations": {
            "valid": valid,
            "removed": removed,
            "validity": round(valid / (valid + removed), 3) if valid + removed else None,
        },
        "latency_ms": {
            "first_token_p50": round(percentile(firsts, 50), 1) if firsts else None,
            "first_token_p95": round(percentile(firsts, 95), 1) if firsts else None,
            "total_p50": round(percentile(totals, 50), 1) if totals else None,
            "total_p95": round(percentile(totals, 95), 1) if totals else None,
            "total_mean": round(statistics.fmean(totals), 1) if totals else None,
        },
        "synthesizers": sorted({r.synthesizer for r in results}),
        "questions": [
            {
                "id": r.question.id,
                "type": r.question.type,
                "declined": r.declined,
                "facts": f"{sum(r.facts_stated)}/{len(r.facts_stated)}" if r.facts_stated else None,
                "cited_gold": r.cited_gold,
                "verdict": r.verdict,
                "first_token_ms": None if r.first_token_ms is None else round(r.first_token_ms, 1),
                "total_ms": round(r.total_ms, 1),
                "error": r.error,
                "answer": r.text[:600],
            }
            for r in results
        ],
    }
