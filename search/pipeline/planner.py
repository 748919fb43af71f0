"""Planner: picks the tools (and their queries) that answer a question.

With an LLM configured: one call with a strict JSON schema, retried once; if both fail, the
plan is ``search`` alone (the planner may add precision, never remove it: the question itself
is always the first ``search``, whatever queries the model writes). Without an LLM: a
deterministic rule-based planner. ``search`` is always part of the plan.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from search.llm import llm_client, llm_configured
from search.pipeline.expertise import asks_for_expertise
from search.tools.base import TOOLS, load_tools

logger = logging.getLogger(__name__)

# Every tool the planner may pick (each registered by a module in ``search.tools``).
PLANNED_TOOLS = ("search", "search_slack", "search_code", "recent_prs", "who_knows", "subsystem_index")

PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": list(PLANNED_TOOLS)},
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


_SUBSYSTEM = re.compile(
    r"\bwhich\s+(module|file|package|component|subsystem|part\s+of\s+the\s+code)s?\b|"
    r"\bwhere\s+(is|are)\b.{1,80}?\bimplemented\b|"
    r"\bwhat\s+(does|do)\s+(the\s+)?([\w./-]+\s+)?(module|file|package|subsystem)\b|"
    r"\bwhat\s+(does|do)\s+[\w-]+(\.\w+)+\s+do\b|"
    r"\boverview\s+of\b",
    re.I,
)


def rule_plan(question: str) -> Plan:
    """Deterministic plan: always ``search``; a named identifier or quoted string adds
    ``search_code``; Slack words add ``search_slack``; history words add ``recent_prs``; asking who knows, owns or
    worked on something ("who can I ask about", "who is the expert", "expert on":
    ``expertise.EXPERTISE``) adds ``who_knows``; "which
    module/file", "where is X implemented", "what does module/file X do", "overview of" add
    ``subsystem_index``. Tools come in that order, each once."""
    calls = [PlannedCall("search", question)]
    if _IDENTIFIER.search(question) or '"' in question:
        calls.append(PlannedCall("search_code", question))
    if _SLACK.search(question):
        calls.append(PlannedCall("search_slack", question))
    if _HISTORY.search(question):
        calls.append(PlannedCall("recent_prs", question))
    if asks_for_expertise(question):
        calls.append(PlannedCall("who_knows", question))
    if _SUBSYSTEM.search(question):
        calls.append(PlannedCall("subsystem_index", question))
    return Plan(calls=calls, planner="rules")


def _index_description(indexed_kinds: dict[str, int]) -> str:
    if not indexed_kinds:
        return "nothing indexed yet"
    return ", ".join(f"{count} {kind} rows" for kind, count in sorted(indexed_kinds.items()))


def llm_plan(question: str, *, indexed_kinds: dict[str, int], tries: int = 2) -> Plan:
    """Ask the LLM for a plan (strict JSON schema); ``search`` alone after ``tries`` failures."""
    tools = "\n".join(f"- {t.name}: {t.description}" for t in load_tools().values() if t.name in PLANNED_TOOLS)
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
                if item.get("name") in TOOLS and item.get("name") in PLANNED_TOOLS
            ]
            if not calls:
                raise ValueError("plan names no known tool")
            # The question itself is always searched: a model's rewrite may add a search, never
            # replace it (a small local model rewrote questions into unrelated queries).
            calls = [PlannedCall("search", question)] + [
                c for c in calls if not (c.tool == "search" and c.query == question)
            ]
            return Plan(calls=calls[:4], planner="llm", errors=errors)
        except Exception as exc:  # any failure -> retry, then the search-only fallback
            # The provider's own message may echo keys or internal URLs: logged, not shown.
            status = getattr(exc, "status_code", None)
            http = f", HTTP {status}" if isinstance(status, int) else ""
            errors.append(f"the planner failed ({type(exc).__name__}{http}); see the server log")
            logger.warning("planner attempt failed: %s", exc)
    return Plan(calls=[PlannedCall("search", question)], planner="fallback", errors=errors)


def make_plan(question: str, *, indexed_kinds: dict[str, int]) -> Plan:
    """The plan for ``question``: the LLM planner's when one is configured, with every tool the
    rule-based plan calls that it lacks added after its own calls (querying the question), else
    the rule-based one. The rules read the question's form (an identifier, "who knows",
    "what changed"), which a small model's plan often misses, and a failed LLM plan (``search``
    alone) keeps them too: "Who can I ask about X?" needs the people the ``who_knows`` tool credits,
    whoever planned."""
    load_tools()
    rules = rule_plan(question)
    if not llm_configured():
        return rules
    plan = llm_plan(question, indexed_kinds=indexed_kinds)
    planned = set(plan.tool_names)
    missing = [c for c in rules.calls if c.tool not in planned]
    if not missing:
        return plan
    return Plan(calls=[*plan.calls, *missing], planner=plan.planner, errors=plan.errors)
