"""The planner: the rule-based routes (people, modules, code, Slack, history) and the LLM plan's
tool vocabulary (every planned tool is registered, and the LLM may pick the new ones)."""

from __future__ import annotations

import json

import pytest

from search.pipeline.planner import PLAN_SCHEMA, PLANNED_TOOLS, llm_plan, rule_plan
from search.tools.base import load_tools
from tests.llm_server import FakeOpenAIServer


@pytest.mark.parametrize(
    "question",
    [
        "Who did the March outage affect?",  # "who" is the object of did/does: nobody's work is asked for
        "Who does the refund policy apply to?",
        "Who did we send the invoice to?",
        "Who does Maria report to?",
        "Who did the CEO thank in the all-hands?",
        "Who approved the refund?",  # an act a document records: the search answers it
    ],
)
def test_questions_about_someone_other_than_an_author_do_not_add_who_knows(question):
    from search.pipeline.expertise import asks_for_expertise

    assert not asks_for_expertise(question)
    assert "who_knows" not in rule_plan(question).tool_names


@pytest.mark.parametrize(
    "question",
    [
        "Who knows about the billing retry logic?",
        "who owns the deploy pipeline",
        "Who is the expert on OAuth2 scopes?",
        "who are our experts in Kubernetes networking",
        "I need an expert on log retention",
        "who worked on the Northstar Bank exception?",
        "who has worked on websockets",
        "who maintains the docs site?",
        "Who can I ask about the billing retries?",
        "who is familiar with the Slack connector?",
        "Who should we talk to about SSO?",
        "experts on OAuth2 scopes?",
        "Who would know about the billing retries?",
        "Who's the person to ask about SSO?",
        "Who did that?",
    ],
)
def test_people_questions_add_who_knows_after_search(question):
    names = rule_plan(question).tool_names
    assert names[0] == "search" and "who_knows" in names
    assert "subsystem_index" not in names


@pytest.mark.parametrize(
    "question",
    [
        "Which module handles OAuth2 password forms?",
        "which files deal with background tasks",
        "Where is request validation implemented?",
        "what does the encoders module do?",
        "What does module security do",
        "what does fastapi.routing do?",
        "what does routing.py do",
        "Give me an overview of the security package",
    ],
)
def test_module_questions_add_subsystem_index(question):
    names = rule_plan(question).tool_names
    assert names[0] == "search" and "subsystem_index" in names
    assert "who_knows" not in names


@pytest.mark.parametrize(
    ("question", "tools"),
    [
        ("how do vacations work", ["search"]),
        ("where is compute_backoff defined", ["search", "search_code"]),
        ("what did the team discuss in the billing channel", ["search", "search_slack"]),
        ("what changed recently in billing", ["search", "recent_prs"]),
        ("who knows why jsonable_encoder changed recently?", ["search", "search_code", "recent_prs", "who_knows"]),
        ("which file defines get_authorization_scheme_param?", ["search", "search_code", "subsystem_index"]),
        ("who is the owner of the vacation policy", ["search", "who_knows"]),
        ("what is the file size limit for uploads?", ["search"]),
        ("whose turn is it to do the standup?", ["search"]),
    ],
)
def test_existing_rules_are_kept_and_tools_come_once_in_order(question, tools):
    assert rule_plan(question).tool_names == tools
    assert rule_plan(question).planner == "rules"


def test_the_schema_names_exactly_the_registered_planned_tools():
    registered = load_tools()
    enum = PLAN_SCHEMA["properties"]["tools"]["items"]["properties"]["name"]["enum"]
    assert enum == list(PLANNED_TOOLS)
    assert set(PLANNED_TOOLS) <= set(registered)
    assert {"who_knows", "subsystem_index"} <= set(enum)


def test_llm_plan_may_pick_who_knows_and_subsystem_index(settings):
    seen: list[dict] = []

    def responder(body):
        seen.append(body)
        return json.dumps(
            {
                "tools": [
                    {"name": "who_knows", "query": "retry logic owner"},
                    {"name": "subsystem_index", "query": "retry module"},
                    {"name": "drop_tables", "query": "x"},
                ]
            }
        )

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "test"
        settings.KB_LLM_MODEL = "test-model"
        plan = llm_plan("who owns the retry module?", indexed_kinds={"code_file": 3})
    assert plan.planner == "llm"
    assert [(c.tool, c.query) for c in plan.calls] == [
        ("search", "who owns the retry module?"),
        ("who_knows", "retry logic owner"),
        ("subsystem_index", "retry module"),
    ]
    sent = seen[0]["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["tools"]["items"]["properties"]["name"]["enum"] == list(PLANNED_TOOLS)
    system = seen[0]["messages"][0]["content"]
    assert "- who_knows:" in system and "- subsystem_index:" in system


@pytest.mark.parametrize("reply", ['{"tools": [{"name": "search", "query": "billing retries"}]}', "not json"])
def test_with_an_llm_the_plan_keeps_the_tools_the_rules_add(settings, reply):
    """A model's plan (or its failure: search alone) that leaves out the tool the question's form
    calls for gets it added after its own calls: "who can I ask" needs who_knows whoever planned."""
    from search.pipeline.planner import make_plan

    with FakeOpenAIServer(lambda body: reply) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "test", "m"
        plan = make_plan("Who can I ask about the billing retries?", indexed_kinds={})
    assert plan.tool_names[0] == "search" and plan.tool_names.count("who_knows") == 1
    assert ("who_knows", "Who can I ask about the billing retries?") in [(c.tool, c.query) for c in plan.calls]


def test_llm_plan_searches_the_question_itself_whatever_the_model_rewrites(settings):
    """A small model rewrote questions into unrelated queries ("python programming"): its
    search queries are added after the question's own search, never instead of it."""
    reply = {"tools": [{"name": "search", "query": "python programming"}, {"name": "recent_prs", "query": "deploys"}]}
    with FakeOpenAIServer(lambda body: json.dumps(reply)) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "test"
        settings.KB_LLM_MODEL = "test-model"
        plan = llm_plan("how do we ship billing?", indexed_kinds={"doc_section": 3})
    assert [(c.tool, c.query) for c in plan.calls] == [
        ("search", "how do we ship billing?"),
        ("search", "python programming"),
        ("recent_prs", "deploys"),
    ]
