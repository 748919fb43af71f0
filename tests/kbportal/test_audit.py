"""The audit log: append-only in the database, one event per request type, request ids, the
tenant admins' page and CSV export, the operator's read-only admin.

Most tests run in a transaction on the app role and read the events of one request by its
``X-Request-ID`` inside the tenant's context. Events without a tenant (a refused login, a
refused token) cannot be read by the app role at all, so those tests commit their writes and
read them through the table owner (``committed``); their request ids are unique to the run.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import ProgrammingError, connection, connections, transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from kbportal.audit import AuditFilters, audit_event_iter, audit_record
from kbportal.celery import app as celery_app
from kbportal.models import AuditEvent
from kbportal.tenancy import TenantContextMissing, tenant_context
from projects.services import api_token_create, api_token_revoke, tenant_onboard
from search.models import AnswerRecord
from tests.search.conftest import ACME_ROWS, CUSTOM

DEPLOY = "How do I deploy the billing service?"


@dataclass
class Aud:
    acme: object  # OnboardedTenant: tenant, admin (owner), project
    globex: object
    member: object
    source_id: int


@pytest.fixture(scope="session")
def aud(django_db_setup, django_db_blocker) -> Aud:
    """Two committed tenants (slugs unique to this module) and Acme's ingested wiki."""
    from projects.models import Membership
    from projects.services import membership_create, profile_set_default_project
    from sources.services import source_create, source_ingest

    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        acme = tenant_onboard(
            name="Aud Acme", slug="aud-acme", admin_username="aud-acme-admin", admin_password="x" * 12
        )
        globex = tenant_onboard(
            name="Aud Globex", slug="aud-globex", admin_username="aud-globex-admin", admin_password="y" * 12
        )
        member = get_user_model().objects.create_user("aud-acme-member", "member@aud.example", "z" * 12)
        membership_create(tenant_id=acme.tenant.pk, user=member, role=Membership.Role.MEMBER)
        profile_set_default_project(user=member, tenant_id=acme.tenant.pk, project_id=acme.project.pk)
        source = source_create(
            tenant_id=acme.tenant.pk,
            kind="test_rows",
            name="Aud wiki",
            config={"rows": ACME_ROWS},
            project_ids=[acme.project.pk],
        )
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
    return Aud(acme=acme, globex=globex, member=member, source_id=source.pk)


def rid() -> str:
    return f"test-{uuid.uuid4().hex}"


def events(tenant_id: int, request_id: str) -> list[AuditEvent]:
    """The tenant's events of one request, oldest first (app role, inside the tenant's context)."""
    with tenant_context(tenant_id):
        return list(AuditEvent.objects.filter(request_id=request_id).order_by("id"))


def owner_events(request_id: str) -> list[AuditEvent]:
    """Committed events of one request in any tenant or none, read as the table owner."""
    return list(AuditEvent.all_tenants.using("owner").filter(request_id=request_id).order_by("id"))


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def committed(django_db_setup, django_db_blocker):
    """Database access without a test transaction: writes commit (for tenantless events)."""
    with django_db_blocker.unblock():
        yield
        for alias in ("default", "owner"):
            connections[alias].close()


def _event(tenant_id: int, action: str = "search") -> AuditEvent:
    return audit_record(action=action, tenant_id=tenant_id, actor=None, token_prefix=None, data={"q": "x"})


# ---------- append-only at the database level -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_app_role_may_only_insert_and_select_audit_events(make_tenant):
    tenant = make_tenant("aud-priv").tenant
    event = _event(tenant.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT has_table_privilege('kbportal_auditevent', p) FROM unnest(%s::text[]) AS p",
            [["INSERT", "SELECT", "UPDATE", "DELETE", "TRUNCATE"]],
        )
        assert [r[0] for r in cursor.fetchall()] == [True, True, False, False, False]
    for sql in (
        "UPDATE kbportal_auditevent SET action = 'tampered' WHERE id = %s",
        "DELETE FROM kbportal_auditevent WHERE id = %s",
        "TRUNCATE kbportal_auditevent",
    ):
        with pytest.raises(ProgrammingError, match="permission denied"):
            with tenant_context(tenant.pk), connection.cursor() as cursor:
                cursor.execute(sql, [event.pk] if "%s" in sql else [])
    with pytest.raises(ProgrammingError, match="permission denied"):
        with tenant_context(tenant.pk):
            AuditEvent.objects.filter(pk=event.pk).update(action="tampered")
    with tenant_context(tenant.pk):
        assert AuditEvent.objects.get(pk=event.pk).action == "search"


@pytest.mark.django_db(databases=["default", "owner"])
def test_trigger_refuses_update_delete_and_truncate_even_for_the_owner():
    owner = connections["owner"]
    with owner.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone() == (True,)  # the owner bypasses row-level security and privileges
        cursor.execute(
            "INSERT INTO kbportal_auditevent (tenant_id, actor_username, action, object_type, object_id, "
            "request_id, created_at, data) VALUES (NULL, '', 'login.failed', '', '', 'owner-test', now(), '{}') "
            "RETURNING id"
        )
        (event_id,) = cursor.fetchone()
    for sql in (
        f"UPDATE kbportal_auditevent SET action = 'tampered' WHERE id = {event_id}",
        f"DELETE FROM kbportal_auditevent WHERE id = {event_id}",
        "TRUNCATE kbportal_auditevent",
    ):
        with pytest.raises(ProgrammingError, match="audit events are append-only"):
            with transaction.atomic(using="owner"), owner.cursor() as cursor:
                cursor.execute(sql)
    with owner.cursor() as cursor:
        cursor.execute("SELECT action FROM kbportal_auditevent WHERE id = %s", [event_id])
        assert cursor.fetchone() == ("login.failed",)


@pytest.mark.django_db
def test_events_are_kept_apart_by_tenant(make_tenant):
    a, b = make_tenant("aud-a").tenant, make_tenant("aud-b").tenant
    mine, theirs = _event(a.pk, "ask"), _event(b.pk, "ask")
    with tenant_context(a.pk):
        assert list(AuditEvent.objects.filter(action="ask").values_list("pk", flat=True)) == [mine.pk]
        assert {e.tenant_id for e in AuditEvent.objects.all()} == {a.pk}  # its project.create too
        assert list(AuditEvent.all_tenants.filter(action="ask").values_list("pk", flat=True)) == [mine.pk]
        with pytest.raises(ProgrammingError, match="row-level security"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO kbportal_auditevent (tenant_id, actor_username, action, object_type, object_id, "
                    "request_id, created_at, data) VALUES (%s, '', 'ask', '', '', '', now(), '{}')",
                    [b.pk],
                )
    assert theirs.pk != mine.pk
    with pytest.raises(TenantContextMissing):
        list(AuditEvent.objects.all())
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM kbportal_auditevent")
        assert cursor.fetchone() == (0,)


@pytest.mark.django_db
def test_an_event_without_a_tenant_is_refused_inside_a_tenant_context(make_tenant):
    tenant = make_tenant("aud-none").tenant
    with tenant_context(tenant.pk):
        with pytest.raises(ValueError, match="has no tenant"):
            audit_record(action="login.failed", tenant_id=None)
        with pytest.raises(ProgrammingError, match="row-level security"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO kbportal_auditevent (tenant_id, actor_username, action, object_type, object_id, "
                    "request_id, created_at, data) VALUES (NULL, '', 'login.failed', '', '', '', now(), '{}')"
                )


def test_an_event_without_a_tenant_is_written_but_never_readable_by_the_app_role(committed):
    request_id = rid()
    response = Client().post(
        reverse("account_login"),
        {"login": "nobody-at-all", "password": "wrong-password-1"},
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 200 and response["X-Request-ID"] == request_id
    (event,) = owner_events(request_id)
    assert (event.action, event.tenant_id, event.actor_id) == ("login.failed", None, None)
    assert event.data == {"username": "nobody-at-all"} and event.ip == "127.0.0.1"
    assert "wrong-password" not in json.dumps(event.data)
    assert not AuditEvent.all_tenants.filter(request_id=request_id).exists()  # the app role sees nothing


# ---------- request ids ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_response_carries_a_request_id_and_a_callers_valid_one_is_kept(aud):
    client = Client()
    generated = client.get(reverse("account_login"))["X-Request-ID"]
    assert len(generated) == 32 and int(generated, 16) >= 0
    assert client.get(reverse("account_login"))["X-Request-ID"] != generated
    assert client.get(reverse("account_login"), headers={"X-Request-ID": "abc.DEF_123-x"})["X-Request-ID"] == (
        "abc.DEF_123-x"
    )
    for bad in ("short", "has spaces in it", "x" * 65, "<script>alert(1)</script>"):
        assert client.get(reverse("account_login"), headers={"X-Request-ID": bad})["X-Request-ID"] != bad
    # An API error quotes the same id in its body, and its api.call event records it.
    token = api_token_create(tenant=aud.acme.tenant, user=aud.acme.admin, name="rid")[1]
    request_id = rid()
    response = client.get("/api/v1/search", headers={"Authorization": f"Bearer {token}", "X-Request-ID": request_id})
    assert response.status_code == 400
    assert response["X-Request-ID"] == response.json()["request_id"] == request_id
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert event.action == "api.call" and event.data["status"] == 400 and event.data["code"] == "required"


# ---------- one event per request type ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_web_question_writes_one_ask_event_with_the_answers_evidence(client, aud):
    client.force_login(aud.acme.admin)
    request_id = rid()
    response = client.get(reverse("search:ask"), {"q": DEPLOY}, headers={"X-Request-ID": request_id})
    assert response.status_code == 200
    (event,) = events(aud.acme.tenant.pk, request_id)
    with tenant_context(aud.acme.tenant.pk):
        record = AnswerRecord.objects.get(public_id=event.data["answer_id"])
    assert (event.action, event.actor_id, event.actor_username) == ("ask", aud.acme.admin.pk, "aud-acme-admin")
    assert (event.object_type, event.object_id) == ("search.answerrecord", str(record.pk))
    assert event.actor_token_prefix is None and event.ip == "127.0.0.1"
    assert event.data["question"] == DEPLOY and event.data["project"] == aud.acme.project.slug
    assert event.data["evidence_ids"] == record.evidence_document_ids and len(record.evidence_document_ids) >= 2
    assert event.data["cited_ids"] == record.cited_document_ids and record.cited_document_ids
    assert event.data["answered"] is True and "search" in event.data["tools"]


@pytest.mark.django_db
def test_a_streamed_question_records_its_request_id_at_the_end_of_the_stream(client, aud):
    client.force_login(aud.member)
    request_id = rid()
    response = client.get(reverse("search:ask_stream"), {"q": DEPLOY}, headers={"X-Request-ID": request_id})
    assert response["X-Request-ID"] == request_id
    assert events(aud.acme.tenant.pk, request_id) == []  # nothing asked until the stream is read
    body = b"".join(response.streaming_content).decode()
    assert "event: done" in body
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.action, event.actor_id, event.data["question"]) == ("ask", aud.member.pk, DEPLOY)


def _api(client: Client, method: str, path: str, token: str, request_id: str, **kwargs):
    headers = {"Authorization": f"Bearer {token}", "X-Request-ID": request_id}
    if "json" in kwargs:
        kwargs["data"] = json.dumps(kwargs.pop("json"))
        kwargs["content_type"] = "application/json"
    return getattr(client, method)(f"/api/v1{path}", headers=headers, **kwargs)


@pytest.mark.django_db
def test_an_api_question_writes_an_ask_and_an_api_call_event_with_the_token_prefix(aud):
    token_row, token = api_token_create(tenant=aud.acme.tenant, user=aud.acme.admin, name="aud-ask")
    request_id = rid()
    response = _api(Client(), "post", "/ask", token, request_id, json={"question": DEPLOY})
    assert response.status_code == 200
    ask_event, call_event = events(aud.acme.tenant.pk, request_id)
    assert ask_event.action == "ask" and ask_event.data["answer_id"] == response.json()["answer_id"]
    evidence = response.json()["evidence"]  # each block's row and the sections merged into it
    assert ask_event.data["evidence_ids"] == [
        i for e in evidence for i in [e["document_id"], *(s["document_id"] for s in e["sections"])]
    ]
    assert call_event.action == "api.call"
    assert call_event.data == {
        "method": "POST",
        "path": "/api/v1/ask",
        "status": 200,
        "ms": call_event.data["ms"],
        "view": "api:ask",
    }
    for event in (ask_event, call_event):
        assert (event.actor_id, event.actor_token_prefix) == (aud.acme.admin.pk, token_row.prefix)


@pytest.mark.django_db
def test_searches_write_one_search_event_on_the_web_and_two_events_through_the_api(client, aud):
    client.force_login(aud.acme.admin)
    request_id = rid()
    response = client.get(reverse("search:search"), {"q": "compute_backoff"}, headers={"X-Request-ID": request_id})
    (event,) = events(aud.acme.tenant.pk, request_id)
    shown = response.context["hits"]
    hits = [i for h in shown for i in h.document_ids]  # each result's row and the sections merged into it
    assert event.action == "search" and event.actor_id == aud.acme.admin.pk
    assert event.data == {
        "tool": "search",
        "query": "compute_backoff",
        "project": aud.acme.project.slug,
        "hits": hits,
        "count": len(shown),
    }

    token_row, token = api_token_create(tenant=aud.acme.tenant, user=None, name="aud-bot", project=aud.acme.project)
    request_id = rid()
    response = _api(Client(), "get", "/search", token, request_id, data={"q": "deploy", "kind": "doc_section"})
    assert response.status_code == 200
    search_event, call_event = events(aud.acme.tenant.pk, request_id)
    shown = response.json()["hits"]
    assert search_event.data["hits"] == [
        i for h in shown for i in [h["document_id"], *(s["document_id"] for s in h["sections"])]
    ]
    assert search_event.data["count"] == len(shown)
    assert search_event.data["kinds"] == ["doc_section"]
    # A service token has no person behind it: the token prefix is the actor.
    assert (search_event.actor_id, search_event.actor_token_prefix) == (None, token_row.prefix)
    assert call_event.action == "api.call" and call_event.data["view"] == "api:search"

    request_id = rid()
    client.get(reverse("search:people"), {"q": "billing reconcile"}, headers={"X-Request-ID": request_id})
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert event.action == "search" and event.data["tool"] == "who_knows" and "people" in event.data


@pytest.mark.django_db
def test_every_api_request_writes_exactly_one_api_call_event(aud):
    token_row, token = api_token_create(tenant=aud.acme.tenant, user=aud.member, name="aud-calls")
    client = Client()
    for method, path, status, view in [
        ("get", "/projects", 200, "api:projects"),
        ("get", "/sources", 200, "api:sources"),
        ("get", "/runs", 200, "api:runs"),
        ("post", "/sources/aud-wiki/sync", 403, "api:source_sync"),
        ("get", "/analytics", 403, "api:analytics"),
    ]:
        request_id = rid()
        response = _api(client, method, path, token, request_id)
        assert response.status_code == status, path
        (event,) = events(aud.acme.tenant.pk, request_id)
        assert (event.action, event.actor_id, event.actor_token_prefix) == (
            "api.call",
            aud.member.pk,
            token_row.prefix,
        )
        assert (event.data["method"], event.data["path"], event.data["status"]) == (
            method.upper(),
            f"/api/v1{path}",
            status,
        )
        assert event.data["view"] == view
    # The browser session counts too (no token prefix).
    client.force_login(aud.acme.admin)
    request_id = rid()
    assert client.get("/api/v1/projects", headers={"X-Request-ID": request_id}).status_code == 200
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.actor_id, event.actor_token_prefix) == (aud.acme.admin.pk, None)


def test_a_refused_token_is_an_api_call_without_a_tenant_keeping_the_prefix(committed):
    org = tenant_onboard(
        name="Aud refused", slug="aud-refused", admin_username="aud-refused-admin", admin_password="pw-refused-123"
    )
    token_row, token = api_token_create(tenant=org.tenant, user=org.admin, name="aud-revoked")
    api_token_revoke(token=token_row)
    request_id = rid()
    response = _api(Client(), "get", "/projects", token, request_id)
    assert response.status_code == 401
    (event,) = owner_events(request_id)
    assert (event.action, event.tenant_id, event.actor_id) == ("api.call", None, None)
    assert event.actor_token_prefix == token_row.prefix
    assert event.data["status"] == 401 and event.data["code"] == "revoked"
    request_id = rid()
    _api(Client(), "get", "/projects", "not-a-token", request_id)
    (event,) = owner_events(request_id)
    assert (event.actor_token_prefix, event.data["code"]) == (None, "malformed")
    # No view answers an unknown endpoint, so nobody authenticated the (valid) token: no tenant.
    live_row, live = api_token_create(tenant=org.tenant, user=org.admin, name="aud-live")
    request_id = rid()
    assert _api(Client(), "get", "/no-such-endpoint", live, request_id).status_code == 404
    (event,) = owner_events(request_id)
    assert (event.tenant_id, event.actor_token_prefix, event.data["status"]) == (None, live_row.prefix, 404)
    assert "view" not in event.data


@pytest.mark.django_db
def test_feedback_writes_a_feedback_event_on_the_web_and_through_the_api(client, aud):
    client.force_login(aud.acme.admin)
    asked = client.get(reverse("search:ask"), {"q": DEPLOY}).context["result"]
    request_id = rid()
    response = client.post(
        reverse("search:answer_feedback", args=[asked.answer_id]),
        {"vote": "down", "comment": "missing the rollback step"},
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 302
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.action, event.actor_id) == ("feedback", aud.acme.admin.pk)
    assert event.data == {"answer_id": asked.answer_id, "vote": -1, "comment": "missing the rollback step"}

    token = api_token_create(tenant=aud.acme.tenant, user=aud.acme.admin, name="aud-vote")[1]
    request_id = rid()
    response = _api(Client(), "post", f"/answers/{asked.answer_id}/feedback", token, request_id, json={"vote": 1})
    assert response.status_code == 200
    assert [(e.action, e.data.get("vote")) for e in events(aud.acme.tenant.pk, request_id)] == [
        ("feedback", 1),
        ("api.call", None),
    ]


@pytest.fixture
def eager_celery():
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.mark.django_db
def test_an_api_sync_writes_a_source_sync_event_with_the_run(aud, django_capture_on_commit_callbacks):
    token = api_token_create(tenant=aud.acme.tenant, user=aud.acme.admin, name="aud-sync")[1]
    request_id = rid()
    with django_capture_on_commit_callbacks(execute=False):
        response = _api(Client(), "post", "/sources/aud-wiki/sync", token, request_id)
    assert response.status_code == 202
    sync_event, call_event = events(aud.acme.tenant.pk, request_id)
    assert (sync_event.action, sync_event.object_type, sync_event.object_id) == (
        "source.sync",
        "sources.datasource",
        str(aud.source_id),
    )
    assert sync_event.data == {"source": "aud-wiki", "run_id": response.json()["run_id"], "via": "api"}
    assert call_event.data["status"] == 202


@pytest.mark.django_db
@override_settings(KB_CUSTOM_CONNECTORS=CUSTOM)
def test_source_create_and_config_update_write_one_event_each_without_config_values(make_tenant):
    from sources.services import source_create, source_update_config

    org = make_tenant("aud-src")
    rows = [{"external_id": "a", "kind": "doc_section", "title": "A", "content": "private-config-value"}]
    source = source_create(
        tenant_id=org.tenant.pk,
        kind="test_rows",
        name="Audited rows",
        config={"rows": rows},
        project_ids=[org.project.pk],
    )
    source_update_config(tenant_id=org.tenant.pk, source_id=source.pk, config={"rows": []})
    with tenant_context(org.tenant.pk):
        created, updated = AuditEvent.objects.filter(object_type="sources.datasource").order_by("id")
    assert (created.action, created.object_id) == ("source.create", str(source.pk))
    assert created.data == {
        "source": "audited-rows",
        "kind": "test_rows",
        "name": "Audited rows",
        "config_keys": ["rows"],
        "projects": [org.project.pk],
    }
    assert (updated.action, updated.data) == ("source.update", {"source": "audited-rows", "changed_keys": ["rows"]})
    assert "private-config-value" not in json.dumps(created.data) + json.dumps(updated.data)


@pytest.mark.django_db
def test_token_create_and_revoke_write_one_event_each(aud):
    token, _ = api_token_create(tenant=aud.acme.tenant, user=aud.member, name="aud-token", expires_in_days=7)
    api_token_revoke(token=token)
    api_token_revoke(token=token)  # already revoked: no second event
    with tenant_context(aud.acme.tenant.pk):
        rows = list(AuditEvent.objects.filter(object_type="projects.apitoken", object_id=str(token.pk)).order_by("id"))
    assert [e.action for e in rows] == ["token.create", "token.revoke"]
    assert rows[0].data["prefix"] == token.prefix and rows[0].data["user"] == "aud-acme-member"
    assert rows[0].data["name"] == "aud-token" and rows[0].data["expires_at"]
    assert rows[1].data == {"prefix": token.prefix, "name": "aud-token"}
    assert rows[0].actor_id is None  # made by manage.py-style code, outside any request


@pytest.mark.django_db
def test_login_and_logout_write_events_in_the_users_tenant(aud):
    client = Client()
    request_id = rid()
    response = client.post(
        reverse("account_login"),
        {"login": "aud-acme-member", "password": "z" * 12},
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 302
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.action, event.actor_id, event.actor_username) == ("login", aud.member.pk, "aud-acme-member")
    request_id = rid()
    assert client.post(reverse("account_logout"), headers={"X-Request-ID": request_id}).status_code == 302
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.action, event.actor_id) == ("logout", aud.member.pk)


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_changes_write_events_and_the_audit_admin_is_read_only(client, aud):
    staff = get_user_model().objects.create_superuser("aud-operator", "op@example.com", "pw-operator-123")
    client.force_login(staff)
    project, tenant_id = aud.acme.project, aud.acme.tenant.pk  # committed: the admin reads as the owner
    request_id = rid()
    response = client.post(
        f"/admin/projects/project/{project.pk}/change/",
        {
            "tenant": tenant_id,
            "name": "Renamed",
            "slug": project.slug,
            "description": "new",
            "visibility": project.visibility,
            "_save": "Save",
            # The ProjectMember inline's management form (prefix: the foreign key's related_name).
            "members-TOTAL_FORMS": 0,
            "members-INITIAL_FORMS": 0,
            "members-MIN_NUM_FORMS": 0,
            "members-MAX_NUM_FORMS": 1000,
        },
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 302, response.context and response.context["errors"]
    (event,) = events(tenant_id, request_id)
    assert (event.action, event.actor_id, event.object_type, event.object_id) == (
        "admin.change",
        staff.pk,
        "projects.project",
        str(project.pk),
    )
    assert event.data["operation"] == "change" and event.data["object"] == "Renamed"
    assert event.data["message"] == [{"changed": {"fields": ["Name", "Description"]}}]

    # A data source added in the admin is one source.create event (not also an admin.change).
    request_id = rid()
    with override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        response = client.post(
            "/admin/sources/datasource/add/",
            {
                "tenant": tenant_id,
                "name": "Admin rows",
                "slug": "admin-rows",
                "kind": "test_rows",
                "config": '{"rows": []}',
                "include": "[]",
                "exclude": "[]",
                "sync_interval_minutes": 60,
                "generation": 0,
                "indexed_rows": 0,
                "projectsource_set-TOTAL_FORMS": 0,
                "projectsource_set-INITIAL_FORMS": 0,
            },
            headers={"X-Request-ID": request_id},
        )
    assert response.status_code == 302, response.context["adminform"].form.errors
    (event,) = events(tenant_id, request_id)
    assert (event.action, event.object_type, event.data["operation"], event.data["via"]) == (
        "source.create",
        "sources.datasource",
        "add",
        "admin",
    )

    # The operator reads every event (as the owner), and can change or delete none.
    with connections["owner"].cursor() as cursor:
        cursor.execute(
            "INSERT INTO kbportal_auditevent (tenant_id, actor_username, action, object_type, object_id, "
            "request_id, created_at, data) VALUES (NULL, '', 'login.failed', '', '', 'admin-view', now(), '{}') "
            "RETURNING id"
        )
        (event_id,) = cursor.fetchone()
    listing = client.get("/admin/kbportal/auditevent/")
    assert listing.status_code == 200 and b"admin-view" in listing.content
    assert client.get("/admin/kbportal/auditevent/add/").status_code == 403
    page = client.get(f"/admin/kbportal/auditevent/{event_id}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    response = client.post(f"/admin/kbportal/auditevent/{event_id}/delete/", {"post": "yes"})
    assert response.status_code == 403


@pytest.mark.django_db(databases=["default", "owner"])
@override_settings(KB_CUSTOM_CONNECTORS=CUSTOM)
def test_the_admins_sync_now_writes_a_source_sync_event(client, aud, eager_celery):
    staff = get_user_model().objects.create_superuser("aud-operator2", "op2@example.com", "pw-operator-123")
    client.force_login(staff)
    request_id = rid()
    response = client.post(
        "/admin/sources/datasource/",
        {"action": "sync_now", "_selected_action": [aud.source_id]},
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 302
    (event,) = events(aud.acme.tenant.pk, request_id)
    assert (event.action, event.actor_id, event.object_id) == ("source.sync", staff.pk, str(aud.source_id))
    assert event.data["via"] == "admin" and event.data["source"] == "aud-wiki"


# ---------- the tenant admins' audit page and CSV export -----------------------------------------


@pytest.mark.django_db
def test_members_outsiders_and_people_without_an_organization_get_404(client, aud):
    loner = get_user_model().objects.create_user("aud-loner", "loner@example.com", "pw-loner-12345")
    for user in (aud.member, loner):
        client.force_login(user)
        assert client.get(reverse("search:audit")).status_code == 404
        assert client.get(reverse("search:audit_export")).status_code == 404
    client.logout()
    assert client.get(reverse("search:audit")).status_code == 302  # to the login page
    # The outsider (Globex's owner) sees Globex's log only.
    audit_record(action="ask", tenant_id=aud.acme.tenant.pk, actor=None, data={"question": "acme-only-marker"})
    client.force_login(aud.globex.admin)
    assert client.get(reverse("search:audit")).status_code == 200
    assert "acme-only-marker" not in client.get(reverse("search:audit")).content.decode()
    csv_body = b"".join(client.get(reverse("search:audit_export")).streaming_content).decode()
    assert csv_body.startswith("time,action") and "acme-only-marker" not in csv_body
    client.force_login(aud.acme.admin)
    assert "acme-only-marker" in client.get(reverse("search:audit")).content.decode()


def _seed(tenant_id: int, actor, *, request_id: str = "seed", rows=None) -> None:
    """Known events, back-dated (the writer stamps "now"; nobody may UPDATE an event later, so
    the seed inserts its rows directly, as the app role inside the tenant's context):
    object ids 0..5 = 3 asks by ``actor`` (0, 1 and 10 days old), 2 anonymous searches, a token event."""
    now = timezone.now()
    username = actor.get_username() if actor is not None else ""
    rows = rows or [
        ("ask", username, {"question": "where is the runbook"}, 0),
        ("ask", username, {"question": "how do I deploy <b>billing</b>"}, 1),
        ("ask", username, {"question": "old question"}, 10),
        ("search", "", {"query": "deploy"}, 0),
        ("search", "", {"query": "vacation"}, 2),
        ("token.create", "", {"prefix": "abcd1234"}, 0),
    ]
    with tenant_context(tenant_id), connection.cursor() as cursor:
        for n, (action, who, data, age) in enumerate(rows):
            cursor.execute(
                "INSERT INTO kbportal_auditevent (tenant_id, actor_id, actor_username, action, object_type, "
                "object_id, request_id, created_at, data) VALUES (%s, %s, %s, %s, '', %s, %s, %s, %s::jsonb)",
                [
                    tenant_id,
                    actor.pk if who and actor is not None else None,
                    who,
                    action,
                    str(n),
                    request_id,
                    now - timedelta(days=age),
                    json.dumps(data),
                ],
            )


@pytest.mark.django_db
def test_the_audit_page_filters_by_action_actor_dates_and_text_and_paginates(client, make_tenant):
    org = make_tenant("aud-page")
    _seed(org.tenant.pk, org.admin)
    client.force_login(org.admin)

    def shown(**params) -> list[str]:
        response = client.get(reverse("search:audit"), {**params, "text": params.get("text", "")})
        assert response.status_code == 200
        return [e.object_id for e, _ in response.context["rows"] if e.request_id == "seed"]

    assert shown() == ["5", "3", "0", "1", "4", "2"]  # newest first
    assert shown(action="ask") == ["0", "1", "2"]
    assert shown(actor=org.admin.username.upper()) == ["0", "1", "2"]
    today = timezone.now().date()
    assert shown(since=(today - timedelta(days=1)).isoformat()) == ["5", "3", "0", "1"]
    assert shown(until=(today - timedelta(days=2)).isoformat()) == ["4", "2"]
    assert shown(text="BILLING") == ["1"]
    page = client.get(reverse("search:audit"), {"text": "<b>billing</b>"}).content.decode()
    assert "<b>billing</b>" not in page and "&lt;b&gt;billing&lt;/b&gt;" in page
    bad = client.get(reverse("search:audit"), {"since": "yesterday", "action": "ask"})
    assert bad.status_code == 200 and "Enter a valid date" in bad.content.decode()
    assert [e.object_id for e, _ in bad.context["rows"] if e.request_id == "seed"] == ["0", "1", "2"]

    for n in range(60):
        audit_record(action="search", tenant_id=org.tenant.pk, actor=None, data={"query": f"filler {n}"})
    first = client.get(reverse("search:audit"), {"text": "filler"})
    assert first.context["page"].count == 60 and len(first.context["rows"]) == 50
    second = client.get(reverse("search:audit"), {"text": "filler", "page": 2})
    assert len(second.context["rows"]) == 10 and second.context["rows"][-1][0].data == {"query": "filler 0"}
    assert "text=filler&amp;page=2" in first.content.decode()


@pytest.mark.django_db
def test_the_csv_export_streams_the_filtered_events(client, make_tenant):
    org = make_tenant("aud-csv")
    _seed(org.tenant.pk, org.admin)
    _seed(org.tenant.pk, None, request_id="formula", rows=[("ask", '=HYPERLINK("http://x")', {"question": "q"}, 0)])
    client.force_login(org.admin)
    since = (timezone.now().date() - timedelta(days=3)).isoformat()
    response = client.get(reverse("search:audit_export"), {"action": "ask", "since": since})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == [
        "time",
        "action",
        "actor",
        "token_prefix",
        "object_type",
        "object_id",
        "request_id",
        "ip",
        "data",
    ]
    seeded = [r for r in rows[1:] if r[6] == "seed"]
    assert [r[5] for r in seeded] == ["0", "1"]  # asks since 3 days ago, newest first; the 10-day-old one is out
    assert {r[1] for r in rows[1:]} == {"ask"} and {r[2] for r in seeded} == {org.admin.username}
    assert json.loads(seeded[1][8]) == {"question": "how do I deploy <b>billing</b>"}
    assert seeded[0][0].endswith("+00:00")
    # A cell a spreadsheet would run as a formula is defused.
    (formula,) = [r for r in rows[1:] if r[6] == "formula"]
    assert formula[2] == '\'=HYPERLINK("http://x")'
    response = client.get(reverse("search:audit_export"), {"text": "vacation"})
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r[1], r[5]) for r in rows[1:]] == [("search", "4")]
    assert client.get(reverse("search:audit_export"), {"since": "not-a-date"}).status_code == 400


@pytest.mark.django_db
def test_the_export_reads_every_matching_row_in_keyset_chunks(make_tenant):
    org = make_tenant("aud-chunk")
    for n in range(10):
        audit_record(action="search", tenant_id=org.tenant.pk, actor=None, data={"query": f"chunk {n}"})
    rows = list(audit_event_iter(tenant_id=org.tenant.pk, filters=AuditFilters(text="chunk"), chunk_size=4))
    assert [e.data["query"] for e in rows] == [f"chunk {n}" for n in range(9, -1, -1)]
