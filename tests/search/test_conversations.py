"""Conversations and share links on every surface: a follow-up answered as rewritten and recorded
as the next turn; a conversation reached only by its own user (service, web, stream, API); the
list, reopen and delete pages; a share link that opens only for people who may read every
document the answer cites or showed."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from kbportal.tenancy import tenant_context
from projects.services import api_token_create
from search.conversations import ConversationNotFound, conversation_list_for_user
from search.models import AnswerRecord, Conversation
from search.services import ask
from sources.selectors import scope_for_user

FIRST = "How do I deploy the billing service?"
FOLLOW_UP = "and which secret does it need?"


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    cache.clear()
    yield
    cache.clear()


def _sse(response) -> list[tuple[str, dict]]:
    body = b"".join(response.streaming_content).decode()
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.django_db
def test_a_follow_up_is_answered_as_rewritten_and_recorded_as_the_next_turn(kb):
    scope = scope_for_user(kb.acme_member)
    first = ask(FIRST, scope, start_conversation=True)
    assert first.conversation_id and first.rewrite is None
    follow = ask(FOLLOW_UP, scope, conversation_id=first.conversation_id)
    assert follow.conversation_id == first.conversation_id
    assert follow.question == FOLLOW_UP
    assert follow.rewrite is not None and follow.rewrite.method == "rules"
    assert follow.standalone_question == "and which secret does it need? (about: deploy billing service)"
    assert any("BILLING_DEPLOY_TOKEN" in ev.text for ev in follow.sources), follow.answer.text
    data = follow.as_dict()
    assert data["standalone_question"] == follow.standalone_question and data["rewrite"]["method"] == "rules"
    with tenant_context(kb.acme.tenant.pk):
        conversation = Conversation.objects.get(public_id=first.conversation_id)
        turns = list(AnswerRecord.objects.filter(conversation=conversation).order_by("created_at"))
    assert conversation.title == FIRST and conversation.user_id == kb.acme_member.pk
    assert [t.question for t in turns] == [FIRST, FOLLOW_UP]
    assert turns[0].standalone_question == "" and turns[1].standalone_question == follow.standalone_question
    assert turns[1].rewrite_method == "rules"
    assert [s["n"] for s in turns[1].cited_sources] == follow.answer.cited
    # Asked alone, the same words carry no topic, and nothing is rewritten.
    alone = ask(FOLLOW_UP, scope)
    assert alone.rewrite is None and alone.conversation_id == ""


@pytest.mark.django_db
def test_another_users_or_tenants_conversation_is_not_found_on_any_surface(kb):
    conversation_id = ask(FIRST, scope_for_user(kb.acme_member), start_conversation=True).conversation_id
    for other in (kb.acme.admin, kb.globex.admin):
        with pytest.raises(ConversationNotFound):
            ask(FOLLOW_UP, scope_for_user(other), conversation_id=conversation_id)
        client = Client()
        client.force_login(other)
        stream = client.get(reverse("search:ask_stream"), {"q": FOLLOW_UP, "conversation": conversation_id})
        assert stream.status_code == 404
        page = client.get(reverse("search:ask"), {"q": FOLLOW_UP, "conversation": conversation_id})
        assert page.status_code == 404
        assert client.get(reverse("search:ask"), {"conversation": "not-a-uuid"}).status_code == 404
        assert conversation_id not in client.get(reverse("search:conversations")).content.decode()
        delete = client.post(reverse("search:conversation_delete", args=[conversation_id]))
        assert delete.status_code == 404
        tenant = kb.acme.tenant if other == kb.acme.admin else kb.globex.tenant
        token = api_token_create(tenant=tenant, user=other, name=f"conv-{other.pk}")[1]
        headers = {"Authorization": f"Bearer {token}"}
        body = json.dumps({"question": FOLLOW_UP, "conversation_id": conversation_id})
        api = client.post("/api/v1/ask", body, content_type="application/json", headers=headers)
        assert api.status_code == 404 and api.json()["field"] == "conversation_id"
        assert client.get(f"/api/v1/conversations/{conversation_id}", headers=headers).status_code == 404
        assert client.delete(f"/api/v1/conversations/{conversation_id}", headers=headers).status_code == 404
        assert conversation_id not in json.dumps(client.get("/api/v1/conversations", headers=headers).json())
    # A service token holds no conversation and cannot continue one.
    service = api_token_create(tenant=kb.acme.tenant, user=None, name="conv-bot", project=kb.acme.project)[1]
    headers = {"Authorization": f"Bearer {service}"}
    body = json.dumps({"question": FOLLOW_UP, "conversation_id": conversation_id})
    assert Client().post("/api/v1/ask", body, content_type="application/json", headers=headers).status_code == 404
    assert Client().get("/api/v1/conversations", headers=headers).status_code == 403
    asked = Client().post(
        "/api/v1/ask", json.dumps({"question": FIRST}), content_type="application/json", headers=headers
    )
    assert asked.status_code == 200 and asked.json()["conversation_id"] is None
    with tenant_context(kb.acme.tenant.pk):
        assert Conversation.objects.filter(public_id=conversation_id, user=kb.acme_member).exists()


@pytest.mark.django_db
def test_the_web_stream_continues_a_conversation_and_the_page_reopens_it(client, kb):
    client.force_login(kb.acme_member)
    done = _sse(client.get(reverse("search:ask_stream"), {"q": FIRST}))[-1][1]
    conversation_id = done["conversation_id"]
    assert conversation_id and done["rewrite"]["method"] == "none"
    events = _sse(client.get(reverse("search:ask_stream"), {"q": FOLLOW_UP, "conversation": conversation_id}))
    plan, done = events[0][1], events[-1][1]
    assert plan["standalone_question"] == done["standalone_question"] != FOLLOW_UP
    assert done["conversation_id"] == conversation_id and done["question"] == FOLLOW_UP
    page = client.get(reverse("search:ask"), {"conversation": conversation_id}).content.decode()
    assert page.count('class="card turn"') == 2
    assert "Understood as: and which secret does it need? (about: deploy billing service)" in page
    assert f'name="conversation" id="conversation-id" value="{conversation_id}"' in page
    # Each turn's citations point at its own sources.
    assert 'href="#t1-source-1"' in page and 'id="t1-source-1"' in page
    assert 'href="#t2-source-1"' in page and 'id="t2-source-1"' in page
    listing = client.get(reverse("search:conversations")).content.decode()
    assert FIRST in listing and f"conversation={conversation_id}" in listing
    assert client.get(reverse("search:conversation_delete", args=[conversation_id])).status_code == 405
    response = client.post(reverse("search:conversation_delete", args=[conversation_id]))
    assert response.status_code == 302
    assert conversation_list_for_user(kb.acme_member) == []
    assert client.get(reverse("search:ask"), {"conversation": conversation_id}).status_code == 404
    with tenant_context(kb.acme.tenant.pk):  # the answers stay, detached
        assert AnswerRecord.objects.filter(public_id=done["answer_id"], conversation=None).exists()


@pytest.mark.django_db
def test_the_api_lists_reads_and_deletes_the_callers_conversations(kb):
    token = api_token_create(tenant=kb.acme.tenant, user=kb.acme_member, name="conv-member")[1]
    headers = {"Authorization": f"Bearer {token}"}
    client = Client()
    first = client.post(
        "/api/v1/ask", json.dumps({"question": FIRST}), content_type="application/json", headers=headers
    )
    conversation_id = first.json()["conversation_id"]
    body = json.dumps({"question": FOLLOW_UP, "conversation_id": conversation_id})
    follow = client.post("/api/v1/ask", body, content_type="application/json", headers=headers).json()
    assert follow["conversation_id"] == conversation_id and follow["rewrite"]["method"] == "rules"
    listing = client.get("/api/v1/conversations", headers=headers).json()["conversations"]
    assert [(c["id"], c["title"], c["turns"]) for c in listing] == [(conversation_id, FIRST, 2)]
    detail = client.get(f"/api/v1/conversations/{conversation_id}", headers=headers).json()
    assert [t["question"] for t in detail["turns"]] == [FIRST, FOLLOW_UP]
    assert detail["turns"][1]["standalone_question"] == follow["standalone_question"]
    assert client.delete(f"/api/v1/conversations/{conversation_id}", headers=headers).status_code == 204
    assert client.get(f"/api/v1/conversations/{conversation_id}", headers=headers).status_code == 404
    unknown = json.dumps({"question": FOLLOW_UP, "conversation_id": str(uuid.uuid4())})
    assert client.post("/api/v1/ask", unknown, content_type="application/json", headers=headers).status_code == 404


@pytest.mark.django_db
def test_a_share_link_opens_only_for_people_who_may_read_every_document_it_cites(kb):
    def share_status(user, answer_id) -> int:
        client = Client()
        if user is not None:
            client.force_login(user)
        return client.get(reverse("search:shared_answer", args=[answer_id])).status_code

    public = ask(FIRST, scope_for_user(kb.acme_member), start_conversation=True)
    assert public.answer.cited
    for reader in (kb.acme_member, kb.acme.admin):
        assert share_status(reader, public.answer_id) == 200
    assert share_status(kb.globex.admin, public.answer_id) == 404
    assert share_status(None, public.answer_id) == 302  # to the login page
    assert share_status(kb.acme_member, uuid.uuid4()) == 404

    # The admin's answer citing a page restricted to the admin: the member may not open it.
    restricted = ask(f"What are the {kb.private_marker}?", scope_for_user(kb.acme.admin))
    with tenant_context(kb.acme.tenant.pk):
        record = AnswerRecord.objects.get(public_id=restricted.answer_id)
    assert any(kb.private_marker in ev.text for ev in restricted.evidence)
    assert record.evidence_document_ids
    assert share_status(kb.acme.admin, restricted.answer_id) == 200
    assert share_status(kb.acme_member, restricted.answer_id) == 404
    assert share_status(kb.globex.admin, restricted.answer_id) == 404
    client = Client()
    client.force_login(kb.acme.admin)
    page = client.get(reverse("search:shared_answer", args=[public.answer_id])).content.decode()
    assert FIRST in page and 'id="source-' in page


@pytest.fixture
def restricted_project(kb, db):
    """An Acme project only its members may read, holding one page, with Acme's member in it."""
    from django.test import override_settings

    from projects.models import Project
    from projects.services import project_create, project_member_add
    from sources.services import source_create, source_ingest
    from tests.search.conftest import CUSTOM

    project = project_create(
        tenant_id=kb.acme.tenant.pk, name="Merger", slug="conv-merger", visibility=Project.Visibility.MEMBERS
    )
    project_member_add(project=project, user=kb.acme_member)
    row = {
        "external_id": "merger#codename",
        "kind": "doc_section",
        "title": "Merger > Codename",
        "path": "merger.md",
        "content": "The wombat merger codename is BLUEHERON; say it to nobody.",
    }
    with override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        source = source_create(
            tenant_id=kb.acme.tenant.pk,
            kind="test_rows",
            name="Merger",
            config={"rows": [row]},
            project_ids=[project.pk],
        )
        assert source_ingest(tenant_id=kb.acme.tenant.pk, source_id=source.pk).status == "succeeded"
    return project


@pytest.mark.django_db
def test_answers_from_a_project_the_user_lost_are_withheld_everywhere(kb, restricted_project):
    from projects.services import project_member_remove

    client = Client()
    client.force_login(kb.acme_member)
    question = "What is the wombat merger codename?"
    done = _sse(client.get(reverse("search:ask_stream"), {"q": question, "project": "conv-merger"}))[-1][1]
    conversation_id = done["conversation_id"]
    assert "BLUEHERON" in json.dumps(done)
    page = client.get(reverse("search:ask"), {"conversation": conversation_id}).content.decode()
    assert "BLUEHERON" in page
    project_member_remove(project=restricted_project, user=kb.acme_member)

    for params in ({"conversation": conversation_id}, {"conversation": conversation_id, "project": "everything"}):
        response = client.get(reverse("search:ask"), params)
        assert response.status_code == 200  # the conversation reopens, in the user's default project
        page = response.content.decode()
        assert "BLUEHERON" not in page and question in page and "no longer shown" in page
    token = api_token_create(tenant=kb.acme.tenant, user=kb.acme_member, name="conv-lost")[1]
    detail = client.get(f"/api/v1/conversations/{conversation_id}", headers={"Authorization": f"Bearer {token}"})
    assert detail.status_code == 200 and "BLUEHERON" not in detail.content.decode()
    assert detail.json()["turns"][0]["readable"] is False
    assert client.get(reverse("search:shared_answer", args=[done["answer_id"]])).status_code == 404
    # A follow-up cannot continue it from another project, nor read its turns into a rewrite.
    stream = client.get(reverse("search:ask_stream"), {"q": "and who knows it?", "conversation": conversation_id})
    assert stream.status_code == 404


@pytest.mark.django_db
def test_a_token_pinned_to_a_project_reaches_only_that_projects_conversations(kb, restricted_project):
    from projects.services import project_member_remove

    default = ask(FIRST, scope_for_user(kb.acme_member), start_conversation=True).conversation_id
    pinned = api_token_create(tenant=kb.acme.tenant, user=kb.acme_member, name="conv-pin", project=restricted_project)[
        1
    ]
    headers = {"Authorization": f"Bearer {pinned}"}
    client = Client()
    merger = client.post(
        "/api/v1/ask",
        json.dumps({"question": "What is the merger codename?"}),
        content_type="application/json",
        headers=headers,
    ).json()["conversation_id"]
    ids = [c["id"] for c in client.get("/api/v1/conversations", headers=headers).json()["conversations"]]
    assert ids == [merger]
    assert client.get(f"/api/v1/conversations/{default}", headers=headers).status_code == 404
    assert client.delete(f"/api/v1/conversations/{default}", headers=headers).status_code == 404
    project_member_remove(project=restricted_project, user=kb.acme_member)
    assert client.get("/api/v1/conversations", headers=headers).status_code == 404
    assert client.get(f"/api/v1/conversations/{merger}", headers=headers).status_code == 404
    assert client.delete(f"/api/v1/conversations/{merger}", headers=headers).status_code == 404
    with tenant_context(kb.acme.tenant.pk):
        assert Conversation.objects.filter(public_id__in=[default, merger]).count() == 2


def test_a_person_block_shows_the_documents_it_names():
    from search.pipeline.evidence import Evidence
    from search.services import shown_document_ids

    person = Evidence(
        n=1,
        document_id=-42,
        kind="person",
        title="Riley",
        url="",
        text="Author: doc_section “Layoff list”.",
        score=1.0,
        tool="who_knows",
        metadata={
            "documents": [{"document_id": 7, "title": "Layoff list"}, {"document_id": "x"}, "junk"],
            # every row that named the person (their name and aliases come from these), cut or not
            "named_in": [7, 11, -3, "y"],
        },
    )
    page = Evidence(n=2, document_id=9, kind="doc_section", title="t", url="", text="x", score=0.0, tool="search")
    assert shown_document_ids(person) == [7, 11]
    assert shown_document_ids(page) == [9]
    # A stored turn keeps the documents the person block lists (what a later page shows under
    # them), and only their title, link, role and location; other blocks keep no metadata.
    from search.services import _stored_source

    stored = _stored_source(person)
    assert stored["metadata"] == {"documents": [{"title": "Layoff list", "link": None, "role": None, "location": None}]}
    assert "metadata" not in _stored_source(page)


@pytest.mark.django_db
def test_a_rule_rewrite_past_the_length_limit_is_not_reported_as_used(kb):
    scope = scope_for_user(kb.acme_member)
    conversation_id = ask(FIRST, scope, start_conversation=True).conversation_id
    long_follow_up = "and " + "x" * 1985 + " for it?"
    from search.services import ask_stream

    events = list(ask_stream(long_follow_up, scope, conversation_id=conversation_id))
    plan, done = events[0].data, events[-1].data
    assert plan["rewrite"]["method"] == "none" and plan["standalone_question"] == long_follow_up
    assert done["rewrite"]["method"] == "none" and done["standalone_question"] == long_follow_up
