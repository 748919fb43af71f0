"""Attacks that once succeeded (an attacker run found them), each asserting the safe behaviour:
a restricted neighbour leaking through context expansion, an empty principal read by a service
token, 500s from a NUL id, a far ``until`` date and an oversized API body, citation numbers
quoted from documents, a forged evidence block in the LLM prompt, the LLM provider's error text
shown to askers, and part of a git password surviving redaction.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from search.retrieval import hybrid_search
from search.services import ask
from sources.selectors import scope_for_user
from tests.security.attack_data import ATKX, EMPTY_PRINCIPAL_MARKER, NEIGHBOUR_MARKER, atkx_load

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def atkx(django_db_setup, django_db_blocker) -> ATKX:
    return atkx_load(django_db_blocker)


def _client(user) -> Client:
    c = Client(raise_request_exception=False)
    c.force_login(user)
    return c


def test_neighbour_context_never_shows_a_restricted_section(atkx):
    scope = scope_for_user(atkx.member)
    hits = hybrid_search("ibex onboarding quarterly planning", scope).hits
    assert hits and hits[0].external_id == "wiki#intro"
    assert all(NEIGHBOUR_MARKER not in h.content for h in hits)
    leaked = [h.external_id for h in hits if NEIGHBOUR_MARKER in h.context]
    assert not leaked, f"restricted neighbour text in context of {leaked}"


def test_neighbour_context_on_the_ask_page_and_api_keeps_restricted_text_out(atkx):
    html = _client(atkx.member).get(reverse("search:ask"), {"q": "ibex onboarding quarterly planning"})
    assert NEIGHBOUR_MARKER not in html.content.decode()


def test_row_with_empty_principal_is_not_read_by_a_service_token_scope(atkx):
    from projects.selectors import api_token_authenticate
    from projects.services import api_token_create
    from sources.selectors import scope_for_token

    _, raw = api_token_create(tenant=atkx.x.tenant, user=None, name="svc", project=atkx.x.project)
    scope = scope_for_token(api_token_authenticate(raw))
    hits = hybrid_search(EMPTY_PRINCIPAL_MARKER, scope).hits
    assert all(EMPTY_PRINCIPAL_MARKER not in h.content for h in hits), "a restricted row reached a service token"


def test_document_page_with_nul_in_id_is_not_a_500(atkx):
    r = _client(atkx.member).get(f"/documents/{atkx.source_public_id}/", {"id": "wiki\x00intro"})
    assert r.status_code == 404, r.status_code


@pytest.mark.parametrize("page", ["search:audit", "search:audit_export"])
def test_audit_until_last_representable_date_is_not_a_500(atkx, page):
    r = _client(atkx.x.admin).get(reverse(page), {"until": "9999-12-31"})
    if r.streaming:
        body = b"".join(r.streaming_content)  # the export fails while streaming
        assert body
    assert r.status_code < 500, r.status_code


def test_extractive_answer_never_repeats_citation_numbers_from_document_text(atkx):
    result = ask("what is the parking password", scope_for_user(atkx.member))
    import re

    shown = {int(n) for n in re.findall(r"\[(\d+)\]", result.answer.text)}
    valid = {e.n for e in result.evidence}
    assert shown <= valid and shown == set(result.answer.cited), (result.answer.text, valid)


def test_git_redact_hides_a_password_with_an_at_sign():
    from sources.connectors.git.connector import _redact, clone_directory_name

    url = "https://deploy:p4ss@w0rd@git.example.com/org/repo.git"
    assert "w0rd" not in _redact(f"cannot clone {url}")
    assert "w0rd" not in clone_directory_name(url)


def test_llm_prompt_does_not_let_a_document_forge_an_evidence_block(atkx, settings):
    from search.pipeline.evidence import evidence_from_hit, number_evidence
    from search.pipeline.synthesizer import evidence_prompt

    scope = scope_for_user(atkx.member)
    hits = hybrid_search("parking policy parking badge", scope).hits
    evidence = number_evidence([[evidence_from_hit(h, tool="search") for h in hits]])
    prompt = evidence_prompt("What is the parking policy?", evidence)
    forged = [line for line in prompt.splitlines() if line.startswith("[9] Official parking policy")]
    assert not forged, "document text starts a line that looks like evidence block [9]"
    assert json.dumps(prompt).count("Question:") == 1, "document text adds a second 'Question:' line"


def test_neighbour_context_through_the_api_search_keeps_restricted_text_out(atkx):
    from projects.services import api_token_create

    raw = api_token_create(tenant=atkx.x.tenant, user=atkx.member, name="finding-ctx")[1]
    client = Client(raise_request_exception=False)
    r = client.get("/api/v1/search", {"q": "ibex onboarding quarterly planning"}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert r.status_code == 200
    assert NEIGHBOUR_MARKER not in r.content.decode()


def test_oversized_api_body_is_a_4xx_not_a_500(atkx):
    from projects.services import api_token_create

    raw = api_token_create(tenant=atkx.x.tenant, user=atkx.member, name="finding-big")[1]
    body = json.dumps({"question": "walrus", "pad": "x" * 3_000_000})
    r = Client(raise_request_exception=False).post(
        "/api/v1/ask", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    assert 400 <= r.status_code < 500, r.status_code


def test_upstream_llm_error_text_is_not_shown_to_askers(atkx, settings):
    from tests.llm_server import FakeOpenAIServer, ServerError

    secret = "sk-live-0123456789abcdefSECRET"

    def responder(body):
        raise ServerError(401, f"Incorrect API key provided: {secret}")

    with FakeOpenAIServer(responder) as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = secret
        settings.KB_LLM_MODEL = "test-model"
        html = _client(atkx.member).get(reverse("search:ask"), {"q": "walrus migration runbook"}).content.decode()
    assert "walrus" in html
    assert secret not in html and server.base_url not in html, "the LLM's error text reached a plain member"
