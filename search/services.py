"""The ask service: planner -> executor -> synthesizer. Web, API and CLI all call ``ask``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from kbportal.tenancy import tenant_context
from search.pipeline.evidence import Evidence
from search.pipeline.executor import execute_plan
from search.pipeline.gate import evidence_answers
from search.pipeline.planner import make_plan
from search.pipeline.synthesizer import Answer, synthesize
from search.retrieval import clean_query, scope_where_sql
from sources.selectors import QueryScope


@dataclass
class AskResult:
    question: str
    answer: Answer
    evidence: list[Evidence]
    plan: dict[str, Any]
    tools_run: list[dict]
    tool_errors: dict[str, str]
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def sources(self) -> list[Evidence]:
        """Exactly the cited evidence blocks, by number."""
        cited = set(self.answer.cited)
        return [e for e in self.evidence if e.n in cited]

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.answer.text,
            "answered": self.answer.answered,
            "synthesizer": self.answer.synthesizer,
            "cited": self.answer.cited,
            "sources": [e.as_dict() for e in self.sources],
            "evidence": [e.as_dict() for e in self.evidence],
            "plan": self.plan,
            "tools_run": self.tools_run,
            "tool_errors": self.tool_errors,
            "timings_ms": self.timings_ms,
        }


def indexed_kinds(scope: QueryScope) -> dict[str, int]:
    """``{kind: row count}`` of what the asker may read in the scope (the planner's view)."""
    where, params = scope_where_sql(scope, None)
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT d.kind, count(*) FROM sources_document d WHERE {where} GROUP BY d.kind", params)
            return {kind: n for kind, n in cursor.fetchall()}


def ask(question: str, scope: QueryScope, *, limit: int = 10) -> AskResult:
    """Answer ``question`` from the scope's sources, with ``[n]`` citations.

    Raises ``search.retrieval.EmptyQuery`` for a blank question. Timings are in milliseconds.
    """
    question = clean_query(question)
    t0 = time.perf_counter()
    plan = make_plan(question, indexed_kinds=indexed_kinds(scope))
    t_plan = time.perf_counter()
    execution = execute_plan(plan, scope, limit=limit)
    t_exec = time.perf_counter()
    relevant = evidence_answers(question, execution.evidence)
    answer = synthesize(question, execution.evidence, relevant=relevant)
    t_end = time.perf_counter()
    return AskResult(
        question=question,
        answer=answer,
        evidence=execution.evidence,
        plan={"planner": plan.planner, "tools": plan.tool_names, "errors": plan.errors},
        tools_run=execution.tools_run,
        tool_errors=execution.tool_errors,
        timings_ms={
            "plan": round((t_plan - t0) * 1000, 1),
            "tools": round((t_exec - t_plan) * 1000, 1),
            "synthesize": round((t_end - t_exec) * 1000, 1),
            "total": round((t_end - t0) * 1000, 1),
        },
    )
