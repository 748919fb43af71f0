"""Follow-up questions read with the earlier turns: the rule (which questions lean on history,
which earlier words are carried) and the LLM rewrite over a loopback server, with its fallbacks."""

from __future__ import annotations

import json

import pytest

from search.pipeline.followup import Turn, carried_words, leans_on_history, rewrite_followup, rule_rewrite
from tests.llm_server import FakeOpenAIServer, ServerError

DEPLOY = Turn(question="How do I deploy the billing service?", standalone="How do I deploy the billing service?")


@pytest.mark.parametrize(
    "question",
    [
        "and how do I roll it back?",
        "what about the staging environment?",
        "same thing but for headers",
        "how do I test it?",
        "where is that class defined in the source?",
        "can I also queue them from inside a dependency?",
        "defaults?",
    ],
)
def test_a_question_pointing_back_leans_on_history(question):
    assert leans_on_history(question)


@pytest.mark.parametrize(
    "question",
    [
        "What is the vacation policy for employees?",
        "Is it possible to upload files larger than 1 GB?",
        "How do I make sure that sessions are closed after each request?",
        "where is APIRouter defined?",
        "Should my endpoint functions be declared with def or async def?",
    ],
)
def test_a_question_that_stands_alone_is_not_rewritten(question):
    assert not leans_on_history(question)
    rewrite = rule_rewrite(question, [DEPLOY])
    assert rewrite.standalone == question and rewrite.method == "none" and not rewrite.rewritten


def test_the_rule_carries_the_earlier_topic_into_a_follow_up():
    rewrite = rule_rewrite("and how do I roll it back?", [DEPLOY])
    assert rewrite.method == "rules" and rewrite.rewritten
    assert rewrite.carried == ("deploy", "billing", "service")
    assert rewrite.standalone == "and how do I roll it back? (about: deploy billing service)"


def test_a_sibling_modifier_is_replaced_not_carried():
    earlier = "How do I declare a path parameter with a default value?"
    carried = carried_words("what about query parameters?", earlier)
    assert "path" not in carried and "parameter" not in carried
    assert carried == ["declare", "default", "value"]


def test_without_history_nothing_is_rewritten_and_no_llm_is_called(settings):
    calls = []
    with FakeOpenAIServer(lambda body: calls.append(body) or "{}") as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        rewrite = rewrite_followup("and how do I roll it back?", [])
    assert rewrite.standalone == "and how do I roll it back?" and rewrite.method == "none"
    assert calls == []


def test_the_llm_rewrite_sees_the_earlier_turns_and_its_answer_is_used(settings):
    seen = []

    def responder(body):
        seen.append(body)
        return json.dumps({"question": "How do I roll back a deploy of the billing service?"})

    history = [Turn(question=DEPLOY.question, standalone=DEPLOY.standalone, answer="Run `make release` [1].")]
    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        rewrite = rewrite_followup("and how do I roll it back?", history)
    assert rewrite.method == "llm" and rewrite.error == ""
    assert rewrite.standalone == "How do I roll back a deploy of the billing service?"
    prompt = seen[0]["messages"][1]["content"]
    assert "User: How do I deploy the billing service?" in prompt
    assert "Assistant: Run `make release` [1]." in prompt
    assert prompt.endswith("Last question: and how do I roll it back?")
    assert seen[0]["response_format"]["type"] == "json_object"


@pytest.mark.parametrize(
    "reply",
    [
        ServerError(500, "model crashed"),
        "not json at all",
        json.dumps({"question": "   "}),
        json.dumps({"rewritten": "How do I roll back?"}),
        json.dumps({"question": "x" * 5000}),
        json.dumps({"question": "\u0000 \n "}),
    ],
)
def test_a_failed_llm_rewrite_falls_back_to_the_rule_and_says_why(settings, reply):
    def responder(body):
        if isinstance(reply, Exception):
            raise reply
        return reply

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        rewrite = rewrite_followup("and how do I roll it back?", [DEPLOY])
    assert rewrite.method == "rules" and rewrite.error
    assert rewrite.standalone == "and how do I roll it back? (about: deploy billing service)"


@pytest.mark.parametrize(
    "reply", ['{"question": "deploy billing\\u0000 secret"}', '{"question": "deploy \\ud800 billing"}']
)
def test_an_llm_rewrite_is_cleaned_like_any_question(settings, reply):
    with FakeOpenAIServer(lambda body: reply) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        rewrite = rewrite_followup("and how do I roll it back?", [DEPLOY])
    assert rewrite.method == "llm" and "\x00" not in rewrite.standalone and "\ud800" not in rewrite.standalone
    rewrite.standalone.encode("utf-8")  # no unpaired surrogate left


def test_a_failed_rewrite_never_shows_the_providers_message(settings):
    def responder(body):
        raise ServerError(401, "Incorrect API key provided: sk-live-SECRETKEY at http://10.0.0.5")

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY, settings.KB_LLM_MODEL = server.base_url, "t", "m"
        rewrite = rewrite_followup("and how do I roll it back?", [DEPLOY])
    assert rewrite.error == "the rewrite failed (AuthenticationError, HTTP 401); see the server log"
    assert "SECRET" not in rewrite.error and "10.0.0.5" not in rewrite.error
