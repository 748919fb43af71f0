"""One question-length limit on every path (web page, stream, API, MCP, CLI), with the same error."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from search.retrieval import MAX_QUERY_CHARS, QueryTooLong, clean_query

TOO_LONG = "why " * 600  # 2,399 characters once whitespace is collapsed
MESSAGE = f"at most {MAX_QUERY_CHARS:,} are allowed"


def test_clean_query_names_both_lengths_and_keeps_a_question_at_the_limit():
    with pytest.raises(QueryTooLong, match=r"the question is 2,399 characters long; at most 2,000 are allowed"):
        clean_query(TOO_LONG)
    assert len(clean_query("x" * MAX_QUERY_CHARS)) == MAX_QUERY_CHARS
    assert clean_query("  many   spaces  " + " " * 5000) == "many spaces"  # whitespace does not count


@pytest.mark.django_db
def test_every_surface_refuses_a_too_long_question_with_the_same_message(kb):
    web = Client()
    web.force_login(kb.acme.admin)
    page = web.get("/", {"q": TOO_LONG}, HTTP_SEC_FETCH_SITE="same-origin")
    assert page.status_code == 200 and MESSAGE in page.content.decode()
    stream = web.get("/ask/stream", {"q": TOO_LONG}, HTTP_SEC_FETCH_SITE="same-origin")
    assert stream.status_code == 400 and MESSAGE in stream.content.decode()
    from projects.services import api_token_create

    _, token = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="length")
    api = Client().post(
        "/api/v1/ask", {"question": TOO_LONG}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert api.status_code == 400 and MESSAGE in api.json()["error"] and api.json()["field"] == "question"
    with pytest.raises(CommandError, match=MESSAGE):
        call_command("ask", TOO_LONG, "--tenant", "kb-acme")
