"""The executor: tools in parallel threads, each with the caller's context."""

import json

import pytest

from search.llm import without_llm
from search.pipeline.executor import execute_plan
from search.pipeline.planner import Plan, PlannedCall
from sources.selectors import scope_for_user
from tests.llm_server import FakeOpenAIServer


@pytest.mark.django_db
def test_without_llm_holds_in_the_tool_threads(kb, settings):
    """Two planned tools run in worker threads; inside ``without_llm()`` neither may call the
    configured LLM (the search tool's reranker would), as in the calling thread."""
    scores = json.dumps({"scores": [5] * 20})
    with FakeOpenAIServer(lambda body: scores) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        settings.KB_LLM_RERANK = True
        calls = [PlannedCall("search", "how do I deploy billing?"), PlannedCall("search_slack", "invoices")]
        plan = Plan(calls, "rules")
        scope = scope_for_user(kb.acme.admin)
        with without_llm():
            result = execute_plan(plan, scope)
        assert result.evidence and not result.tool_errors
        assert server.requests == []
        execute_plan(plan, scope)  # outside it, the reranker asks the LLM
        assert server.requests
