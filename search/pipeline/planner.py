"""Planner: picks the tools (and their queries) that answer a question.

With an LLM configured: one call with a strict JSON schema, retried once; if both fail, the
plan is ``search`` alone (the planner may add precision, never remove it). Without an LLM: a
deterministic rule-based planner. ``search`` is always part of the plan.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from search.llm import llm_client, llm_configured
from search.tools.base import TOOLS

logger = logging.getLogger(__name__)

PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": ["search", "search_slack", "search_code", "recent_prs"]},
                    "query": {"type": "string"},
                },
                "required": ["name", "query"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 4,
        }
    },
    "required": ["tools"],
    "additionalProperties": False,
}


@dataclass
class PlannedCall:
    tool: str
    query: str


@dataclass
class Plan:
    calls: list[PlannedCall]
    planner: str  # "llm", "rules", or "fallback"
    errors: list[str] = field(default_factory=list)

    @property
    def tool_names(self) -> list[str]:
        return [c.tool for c in self.calls]


_IDENTIFIER = re.compile(r"`[^`]+`|\b[A-Za-z_]+[A-Za-z0-9]*_[A-Za-z0-9_]+\b|\b[a-z]+[A-Z][A-Za-z0-9]+\b|\b\w+\.\w+\(")
_SLACK = re.compile(r"\b(slack|thread|channel|discuss(ed|ion)?|chat|said|mentioned)\b", re.I)
_HISTORY = re.compile(
    r"\b(what changed|changelog|recent(ly)?|commit(s|ted)?|pull request|PR|merged|release[sd]?)\b", re.I
)


def rule_plan(question: str) -> Plan:
    """Deterministic plan: always ``search``; a named identifier or quoted string adds
    ``search_code``; Slack words add ``search_slack``; history words add ``recent_prs``."""
    calls = [PlannedCall("search", question)]
    if _IDENTIFIER.search(question) or '"' in question:
        calls.append(PlannedCall("search_code", question))
    if _SLACK.search(question):
        calls.append(PlannedCall("search_slack", question))
    if _HISTORY.search(question):
        calls.append(PlannedCall("recent_prs", question))
    return Plan(calls=calls, planner="rules")


def _index_description(indexed_kinds: dict[str, int]) -> str:
    if not indexed_kinds:
        return "nothing indexed yet"
    return ", ".join(f"{count} {kind} rows" for kind, count in sorted(indexed_kinds.items()))


def llm_plan(question: str, *, indexed_kinds: dict[str, int], tries: int = 2) -> Plan:
    """Ask the LLM for a plan (strict JSON schema); ``search`` alone after ``tries`` failures."""
    tools = "\n".join(f"- {t.name}: {t.description}" for t in TOOLS.values())
    messages = [
        {
            "role": "system",
            "content": (
                "You choose retrieval tools for a company knowledge base. Reply with JSON only, matching "
                'the schema {"tools": [{"name": <tool>, "query": <search text>}]}. Always include "search".'
                f"\nTools:\n{tools}\nThe active project has indexed: {_index_description(indexed_kinds)}."
            ),
        },
        {"role": "user", "content": question},
    ]
    from django.conf import settings

    errors: list[str] = []
    # First try OpenAI's strict json_schema; the retry uses json_object with the schema attached,
    # which servers without json_schema support (llama.cpp's) accept and still constrain.
    formats = [
        {"type": "json_schema", "json_schema": {"name": "plan", "strict": True, "schema": PLAN_SCHEMA}},
        {"type": "json_object", "schema": PLAN_SCHEMA},
    ]
    for attempt in range(tries):
        try:
            response = llm_client().chat.completions.create(
                model=settings.KB_LLM_MODEL,
                messages=messages,
                temperature=0,
                max_tokens=300,
                response_format=formats[min(attempt, len(formats) - 1)],
            )
            data = json.loads(response.choices[0].message.content or "")
            calls = [
                PlannedCall(str(item["name"]), str(item.get("query") or question).strip() or question)
                for item in data["tools"]
                if item.get("name") in TOOLS
            ]
            if not calls:
                raise ValueError("plan names no known tool")
            if "search" not in [c.tool for c in calls]:
                calls.insert(0, PlannedCall("search", question))
            return Plan(calls=calls[:4], planner="llm", errors=errors)
        except Exception as exc:  # any failure -> retry, then the search-only fallback
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            logger.warning("planner attempt failed: %s", exc)
    return Plan(calls=[PlannedCall("search", question)], planner="fallback", errors=errors)


def make_plan(question: str, *, indexed_kinds: dict[str, int]) -> Plan:
    """The plan for ``question``: LLM planner when configured, else the rule-based one."""
    import search.tools.search  # noqa: F401  (registers the tools)

    if llm_configured():
        return llm_plan(question, indexed_kinds=indexed_kinds)
    return rule_plan(question)
