"""Verified answers: who may verify, the match shown first to a later asker of the same question
(only when they may read what it cites), and the stale flag when a cited document changes."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from kbportal.audit import AuditFilters, audit_event_page
from kbportal.tenancy import tenant_context
from search.models import VerifiedAnswer
from search.services import ask
from search.verified import VerifiedNotFound, VerifyForbidden, answer_verify, verified_answer_match
from sources.models import Document
from sources.selectors import scope_for_user

QUESTION = "How do I deploy the billing service?"
EDITED = "Run `make release` from the ops repository [1]."


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    cache.clear()
    yield
    cache.clear()


def _post_verify(user, answer_id, text=""):
    client = Client()
    client.force_login(user)
    return client.post(reverse("search:answer_verify", args=[answer_id]), {"text": text})


@pytest.mark.django_db
def test_an_admin_verifies_an_answer_and_a_later_asker_sees_it_first(kb):
    member_scope = scope_for_user(kb.acme_member)
    asked = ask(QUESTION, member_scope)
    assert asked.verified is None and asked.answer.cited
    assert _post_verify(kb.acme_member, asked.answer_id, EDITED).status_code == 403  # a member may not
    assert _post_verify(kb.globex.admin, asked.answer_id, EDITED).status_code == 404  # another organization
    client = Client()
    client.force_login(kb.acme.admin)
    share = client.get(reverse("search:shared_answer", args=[asked.answer_id])).content.decode()
    assert "Verify this answer" in share
    assert _post_verify(kb.acme.admin, asked.answer_id, EDITED).status_code == 302
    share = client.get(reverse("search:shared_answer", args=[asked.answer_id])).content.decode()
    assert "verified by " + kb.acme.admin.get_username() in share and "Save the verified answer" in share
    assert "from the ops repository" in share  # the verified text, in the page and the form

    again = ask("how do I deploy the billing service", member_scope)
    assert again.verified is not None
    assert again.verified.text == EDITED and again.verified.verified_by == kb.acme.admin.get_username()
    assert not again.verified.stale and again.verified.similarity >= 0.9
    assert again.as_dict()["verified"]["question"] == QUESTION
    assert ask("What is the vacation policy for employees?", member_scope).verified is None
    assert verified_answer_match(QUESTION, scope_for_user(kb.globex.admin)) is None

    # The page and the stream show it first, with its own citation anchors.
    member = Client()
    member.force_login(kb.acme_member)
    page = member.get(reverse("search:ask"), {"q": QUESTION}).content.decode()
    assert page.index("Verified answer") < page.index('id="answer"')
    assert 'href="#v-source-1"' in page and 'id="v-source-1"' in page
    body = b"".join(member.get(reverse("search:ask_stream"), {"q": QUESTION}).streaming_content).decode()
    done = json.loads(body.strip().split("\n\n")[-1].split("data: ", 1)[1])
    assert done["verified"]["text"] == EDITED and "v-source-1" in done["verified"]["html"]
    events = audit_event_page(tenant_id=kb.acme.tenant.pk, filters=AuditFilters(action="answer.verify")).events
    assert [e.data["answer_id"] for e in events] == [asked.answer_id]

    # A cited document that changes makes it stale.
    with tenant_context(kb.acme.tenant.pk):
        verified = VerifiedAnswer.objects.get()
        Document.objects.filter(pk__in=verified.cited_document_ids).update(content_hash="changed")
    assert verified_answer_match(QUESTION, member_scope).stale


@pytest.mark.django_db
def test_a_verified_answer_citing_a_restricted_page_reaches_only_its_readers(kb):
    question = f"What are the {kb.private_marker}?"
    asked = ask(question, scope_for_user(kb.acme.admin))
    assert any(kb.private_marker in ev.text for ev in asked.sources), asked.answer.text
    answer_verify(actor=kb.acme.admin, answer_id=asked.answer_id)
    assert verified_answer_match(question, scope_for_user(kb.acme.admin)) is not None
    member_view = ask(question, scope_for_user(kb.acme_member))
    assert member_view.verified is None
    assert kb.private_marker not in json.dumps(member_view.as_dict()["verified"])
    with pytest.raises(VerifiedNotFound):
        answer_verify(actor=kb.acme_member, answer_id=asked.answer_id)  # not readable: 404, not 403
    with pytest.raises(VerifyForbidden):
        answer_verify(actor=kb.acme_member, answer_id=ask(QUESTION, scope_for_user(kb.acme_member)).answer_id)


@pytest.mark.parametrize(
    "asked, verified, same",
    [
        ("how do I deploy the billing service", "How do I deploy the billing service?", True),
        ("How do I increase the request timeout?", "How do I decrease the request timeout?", False),
        ("Is the VPN not required when working from home?", "Is the VPN required when working from home?", False),
        ("Why can't I log in?", "Why can I log in?", False),
        ("Which port does the API use in development?", "Which port does the API use in production?", False),
        ("How do I deploy billing to production?", "How do I deploy billing?", False),
    ],
)
def test_only_a_question_asking_with_the_same_words_is_the_same_question(asked, verified, same):
    from search.verified import same_question

    assert same_question(asked, verified, 0.99) is same
    assert not same_question(asked, verified, 0.85)  # and close in meaning too


@pytest.mark.django_db
def test_a_verified_answer_fails_closed_when_a_restricted_page_it_cited_is_deleted(kb):
    question = f"What are the {kb.private_marker}?"
    asked = ask(question, scope_for_user(kb.acme.admin))
    answer_verify(actor=kb.acme.admin, answer_id=asked.answer_id)
    with tenant_context(kb.acme.tenant.pk):
        restricted = Document.objects.get(external_id="hr#salaries")
        assert restricted.pk in VerifiedAnswer.objects.get().shown_document_ids
        restricted.delete()  # a re-sync that drops the row (rolled back with the test)
    assert verified_answer_match(question, scope_for_user(kb.acme_member)) is None


@pytest.mark.django_db
def test_a_verified_answer_that_showed_a_restricted_page_uncited_reaches_only_its_readers(kb):
    from search.models import AnswerRecord

    question = "Which secret does the billing deploy need?"
    with tenant_context(kb.acme.tenant.pk):
        shown = list(
            Document.objects.filter(external_id__in=["runbook#deploy", "hr#salaries"]).values_list("pk", flat=True)
        )
        record = AnswerRecord.objects.create(
            tenant_id=kb.acme.tenant.pk,
            user=kb.acme.admin,
            project_id=kb.acme.project.pk,
            question=question,
            answer="It needs the BILLING_DEPLOY_TOKEN secret.",
            answered=True,
            evidence_document_ids=shown,
            cited_document_ids=[],
            latency_ms=1.0,
        )
    answer_verify(actor=kb.acme.admin, answer_id=record.public_id)
    assert verified_answer_match(question, scope_for_user(kb.acme.admin)) is not None
    assert verified_answer_match(question, scope_for_user(kb.acme_member)) is None
