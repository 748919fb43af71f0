"""The review list: a thumbs-down with a comment reaches the organization's admins only; a review
names documents the answer showed (and the reviewer may read), or says the sources do not answer
it; the reviewed questions export in the kb_eval question format."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from kbportal.tenancy import tenant_context
from search.evaluation import load_questions
from search.models import AnswerFeedback
from search.reviews import review_submit
from search.services import answer_feedback_submit, ask
from sources.selectors import scope_for_user


@pytest.mark.django_db
def test_a_thumbs_down_is_reviewed_by_an_admin_and_exported_as_an_evaluation_case(kb, tmp_path):
    asked = ask("How do I deploy the billing service?", scope_for_user(kb.acme_member))
    answer_feedback_submit(actor=kb.acme_member, answer_id=asked.answer_id, vote=-1, comment="it missed the token")
    silent = ask("What is the vacation policy?", scope_for_user(kb.acme_member))
    answer_feedback_submit(actor=kb.acme_member, answer_id=silent.answer_id, vote=-1)  # no comment: not listed

    member, admin, outsider = Client(), Client(), Client()
    member.force_login(kb.acme_member)
    admin.force_login(kb.acme.admin)
    outsider.force_login(kb.globex.admin)
    assert member.get(reverse("search:reviews")).status_code == 404
    assert member.get(reverse("search:review_export")).status_code == 404
    # Globex's admin sees Globex's list: none of Acme's.
    assert "it missed the token" not in outsider.get(reverse("search:reviews")).content.decode()
    page = admin.get(reverse("search:reviews")).content.decode()
    assert "it missed the token" in page and "What is the vacation policy?" not in page
    assert "Runbook &gt; Deploying the billing service" in page

    with tenant_context(kb.acme.tenant.pk):
        feedback = AnswerFeedback.objects.get(answer_record__public_id=asked.answer_id)
    deploy_doc = next(ev.document_id for ev in asked.evidence if "Deploying the billing" in ev.title)
    with pytest.raises(ValueError):  # neither documents nor "unanswerable"
        review_submit(
            tenant_id=kb.acme.tenant.pk,
            reviewer=kb.acme.admin,
            feedback_id=feedback.pk,
            document_ids=[],
            unanswerable=False,
        )
    response = admin.post(
        reverse("search:reviews"),
        {
            "feedback": feedback.pk,
            "documents": [str(deploy_doc), "999999"],
            "expected_answer": "Run make release; it needs BILLING_DEPLOY_TOKEN.",
        },
    )
    assert response.status_code == 302
    with tenant_context(kb.acme.tenant.pk):
        feedback.refresh_from_db()
    assert feedback.reviewed_by == kb.acme.admin and feedback.expected_document_ids == [deploy_doc]
    assert outsider.post(reverse("search:reviews"), {"feedback": feedback.pk, "unanswerable": "1"}).status_code == 404

    export = b"".join(admin.get(reverse("search:review_export")).streaming_content).decode()
    lines = [json.loads(line) for line in export.splitlines()]
    assert b"".join(outsider.get(reverse("search:review_export")).streaming_content) == b""
    assert lines == [
        {
            "id": f"feedback-{feedback.pk}",
            "type": "feedback",
            "question": "How do I deploy the billing service?",
            "gold": [{"kind": "doc_id", "id": "runbook#deploy"}],
            "answer_facts": ["Run make release; it needs BILLING_DEPLOY_TOKEN."],
        }
    ]
    path = tmp_path / "reviewed.jsonl"
    path.write_text(export)
    assert [q.gold for q in load_questions(path)] == [[{"kind": "doc_id", "id": "runbook#deploy"}]]


@pytest.mark.django_db
def test_an_admin_who_may_not_read_an_answer_sees_only_its_question_and_cannot_review_or_export_it(kb):
    from django.contrib.auth import get_user_model

    from projects.models import Membership
    from projects.services import membership_create

    second = get_user_model().objects.create_user("kb-acme-admin2", "admin2@acme.example", "pw-admin2-xyz")
    membership_create(tenant_id=kb.acme.tenant.pk, user=second, role=Membership.Role.ADMIN)
    asked = ask(f"What are the {kb.private_marker}?", scope_for_user(kb.acme.admin))
    assert any(kb.private_marker in ev.text for ev in asked.sources)
    answer_feedback_submit(actor=kb.acme.admin, answer_id=asked.answer_id, vote=-1, comment="too short")
    with tenant_context(kb.acme.tenant.pk):
        feedback = AnswerFeedback.objects.get(answer_record__public_id=asked.answer_id)
    restricted = next(ev.document_id for ev in asked.sources if kb.private_marker in ev.text)
    review_submit(
        tenant_id=kb.acme.tenant.pk,
        reviewer=kb.acme.admin,
        feedback_id=feedback.pk,
        document_ids=[restricted],
        unanswerable=False,
        expected_answer=f"the {kb.private_marker} are 3 bands",
    )
    client = Client()
    client.force_login(second)
    page = client.get(reverse("search:reviews")).content.decode()
    assert "too short" in page and "may not read" in page
    assert kb.private_marker not in page.replace(f"What are the {kb.private_marker}?", "")
    export = b"".join(client.get(reverse("search:review_export")).streaming_content).decode()
    assert export == ""
    assert client.post(reverse("search:reviews"), {"feedback": feedback.pk, "unanswerable": "1"}).status_code == 404
    assert client.post(reverse("search:reviews"), {"feedback": "abc", "unanswerable": "1"}).status_code == 404
    with tenant_context(kb.acme.tenant.pk):
        feedback.refresh_from_db()
    assert feedback.expected_document_ids == [restricted] and not feedback.unanswerable
    owner = Client()
    owner.force_login(kb.acme.admin)
    assert "hr#salaries" in b"".join(owner.get(reverse("search:review_export")).streaming_content).decode()
