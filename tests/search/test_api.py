"""The DRF API under /api/v1/, through Django's test client against the committed ``kb`` data.

Three people on every endpoint: Acme's admin, Acme's member and Globex's admin (the outsider),
plus Acme's service token (no user). Tokens are created inside each test's transaction: the
request runs on the test's connection; only the executor's tool threads open their own, and
they read the committed documents.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone
from rest_framework.request import Request

from kbportal.celery import app as celery_app
from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Membership
from projects.services import api_token_create, api_token_revoke, membership_create, project_create
from search.api.errors import api_exception_handler, not_found
from search.models import AnswerFeedback
from sources.models import IngestionRun
from tests.search.conftest import CUSTOM

API = "/api/v1"
DEPLOY = "How do I deploy the billing service?"


@dataclass
class People:
    admin: str  # Acme's owner
    member: str  # Acme's member
    outsider: str  # Globex's owner
    service: str  # Acme's service token, pinned to Acme's project


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Throttle counts live in the cache; each test starts with none."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def people(kb, db) -> People:
    acme, globex = kb.acme, kb.globex
    return People(
        admin=api_token_create(tenant=acme.tenant, user=acme.admin, name="api-admin")[1],
        member=api_token_create(tenant=acme.tenant, user=kb.acme_member, name="api-member")[1],
        outsider=api_token_create(tenant=globex.tenant, user=globex.admin, name="api-outsider")[1],
        service=api_token_create(tenant=acme.tenant, user=None, name="api-bot", project=acme.project)[1],
    )


@pytest.fixture
def acme_only_project(kb, db):
    """A project whose slug exists in Acme only (both tenants have an ``everything`` project)."""
    return project_create(tenant_id=kb.acme.tenant.pk, name="Acme billing API", slug="acme-billing-api")


def call(method: str, path: str, token: str | None = None, *, client: Client | None = None, **kwargs):
    """One API request; ``json=`` sends a JSON body, ``data=`` a query string (GET)."""
    client = client or Client()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers.update(kwargs.pop("headers", {}))
    if "json" in kwargs:
        kwargs["data"] = json.dumps(kwargs.pop("json"))
        kwargs["content_type"] = "application/json"
    return getattr(client, method)(f"{API}{path}", headers=headers, **kwargs)


def assert_error(response, status: int, *, code: str | None = None, field: str | None = None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) >= {"error", "field", "code", "request_id"}
    assert body["error"] and body["request_id"] == response["X-Request-ID"]
    if code is not None:
        assert body["code"] == code
    assert body["field"] == field
    return body


def titles(rows: list[dict]) -> set[str]:
    return {r["title"] for r in rows}


def sse(response) -> list[tuple[str, dict]]:
    body = b"".join(response.streaming_content).decode()
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


# ---------- ask ----------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["admin", "member", "service"])
def test_ask_answers_acme_people_with_citations_from_acme_rows(people, who):
    response = call("post", "/ask", getattr(people, who), json={"question": DEPLOY})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answered"] is True and body["cited"]
    assert "[1]" in body["answer"]
    assert body["sources"][0]["title"] == "Runbook > Deploying the billing service"
    assert body["sources"][0]["link"] == "https://wiki.acme.example/runbook#deploy"
    assert uuid.UUID(body["answer_id"])
    assert "Globex" not in json.dumps(body)


def test_ask_as_the_outsider_reads_only_globex_and_acme_projects_are_404(people, acme_only_project):
    response = call("post", "/ask", people.outsider, json={"question": DEPLOY})
    assert response.status_code == 200
    body = response.json()
    assert titles(body["evidence"]) == {"Deploying the billing service at Globex"}
    response = call("post", "/ask", people.outsider, json={"question": DEPLOY, "project": acme_only_project.slug})
    err = assert_error(response, 404, code="not_found", field="project")
    assert acme_only_project.slug in err["error"]


def test_ask_validates_the_body_naming_the_field(people):
    response = call("post", "/ask", people.admin, json={"question": "   "})
    err = assert_error(response, 400, code="blank", field="question")
    assert err["error"].startswith("question: ")
    assert_error(call("post", "/ask", people.admin, json={}), 400, code="required", field="question")
    assert_error(call("post", "/ask", people.admin, json={"question": "x" * 2001}), 400, field="question")
    assert_error(
        call("post", "/ask", people.admin, json={"question": DEPLOY, "project": "no spaces"}), 400, field="project"
    )
    assert_error(call("post", "/ask", people.admin, json=["a list"]), 400, code="invalid", field=None)
    response = call("post", "/ask", people.admin, data="{not json", content_type="application/json")
    err = assert_error(response, 400, code="parse_error", field=None)
    assert "JSON parse error" in err["error"]
    response = call("post", "/ask", people.admin, data="question=hi", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, code="unsupported_media_type")


def test_ask_streams_server_sent_events_with_stream_1_or_the_accept_header(people):
    for kwargs in ({"path": "/ask?stream=1"}, {"path": "/ask", "headers": {"Accept": "text/event-stream"}}):
        path = kwargs.pop("path")
        response = call("post", path, people.member, json={"question": DEPLOY}, **kwargs)
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/event-stream")
        assert response["Cache-Control"] == "no-cache"
        events = sse(response)
        types = [t for t, _ in events]
        assert types[:3] == ["plan", "tools", "evidence"] and types[-1] == "done" and "token" in types
        done = events[-1][1]
        assert "".join(d["text"] for t, d in events if t == "token") == done["text"]
        assert done["sources"][0]["link"] == "https://wiki.acme.example/runbook#deploy"
        assert uuid.UUID(done["answer_id"])


def test_a_refused_stream_is_a_json_error_not_an_event_stream(people, acme_only_project):
    response = call("post", "/ask?stream=1", people.admin, json={"question": " "})
    assert_error(response, 400, field="question")
    response = call(
        "post",
        "/ask",
        people.outsider,
        json={"question": DEPLOY, "project": acme_only_project.slug},
        headers={"Accept": "text/event-stream"},
    )
    assert_error(response, 404, field="project")


# ---------- search and who-knows -----------------------------------------------------------------


def test_search_ranks_hits_with_locations_and_filters_by_kind(people):
    response = call("get", "/search", people.member, data={"q": "compute_backoff"})
    assert response.status_code == 200
    body = response.json()
    assert body["project"] == "everything" and body["query"] == "compute_backoff"
    first = body["hits"][0]
    assert first["title"] == "billing/retry.py: compute_backoff"
    assert first["location"] == "billing/retry.py:10-24" and first["n"] == 1
    assert [h["n"] for h in body["hits"]] == list(range(1, len(body["hits"]) + 1))

    response = call("get", "/search", people.member, data={"q": "billing invoices", "kind": ["thread"], "limit": 3})
    hits = response.json()["hits"]
    assert hits and {h["kind"] for h in hits} == {"thread"}
    response = call("get", "/search", people.member, data={"q": "billing", "kind": ["thread", "code_chunk"]})
    assert {h["kind"] for h in response.json()["hits"]} == {"thread", "code_chunk"}


def test_search_restricted_rows_reach_only_their_principal(people, kb):
    def found(token: str) -> bool:
        response = call("get", "/search", token, data={"q": kb.private_marker})
        assert response.status_code == 200
        return any(kb.private_marker in h["text"] for h in response.json()["hits"])

    assert found(people.admin)
    assert not found(people.member)
    assert not found(people.service)
    assert not found(people.outsider)


def test_search_as_the_outsider_never_sees_acme(people, acme_only_project):
    response = call("get", "/search", people.outsider, data={"q": "deploy the billing service make release"})
    assert titles(response.json()["hits"]) == {"Deploying the billing service at Globex"}
    response = call("get", "/search", people.outsider, data={"q": "deploy", "project": acme_only_project.slug})
    assert_error(response, 404, code="not_found", field="project")


def test_search_validates_query_parameters(people):
    assert_error(call("get", "/search", people.admin), 400, code="required", field="q")
    response = call("get", "/search", people.admin, data={"q": "x", "limit": 0})
    assert_error(response, 400, code="min_value", field="limit")
    assert_error(call("get", "/search", people.admin, data={"q": "x", "limit": "ten"}), 400, field="limit")
    err = assert_error(call("get", "/search", people.admin, data={"q": "x", "kind": "spreadsheet"}), 400, field="kind")
    assert "spreadsheet" in err["error"]
    assert_error(call("get", "/search", people.admin, data={"q": "\x00"}), 400, field="q")


def test_who_knows_names_the_people_of_the_thread_for_acme_only(people):
    response = call("get", "/who-knows", people.member, data={"q": "invoices stuck in pending webhook outage"})
    assert response.status_code == 200
    experts = response.json()["experts"]
    names = {e["name"] for e in experts}
    assert {"Dana", "Lee"} <= names
    dana = next(e for e in experts if e["name"] == "Dana")
    assert dana["score"] > 0 and dana["documents"][0]["title"] == "#billing: invoices stuck in pending"

    response = call("get", "/who-knows", people.outsider, data={"q": "invoices stuck in pending webhook outage"})
    assert response.status_code == 200
    assert not {"Dana", "Lee"} & {e["name"] for e in response.json()["experts"]}
    assert_error(call("get", "/who-knows", people.member, data={"q": "x", "limit": 21}), 400, field="limit")


# ---------- projects, sources, runs, sync --------------------------------------------------------


def test_projects_lists_the_callers_projects_with_the_default(people, kb, acme_only_project):
    def slugs(token: str) -> dict[str, bool]:
        response = call("get", "/projects", token)
        assert response.status_code == 200
        return {p["slug"]: p["is_default"] for p in response.json()["projects"]}

    assert slugs(people.admin) == {"everything": True, acme_only_project.slug: False}
    assert slugs(people.member) == {"everything": True, acme_only_project.slug: False}
    assert slugs(people.outsider) == {"everything": True}
    assert slugs(people.service) == {"everything": True}  # pinned: its one project
    pinned = api_token_create(tenant=kb.acme.tenant, user=kb.acme_member, name="pinned", project=acme_only_project)
    assert slugs(pinned[1]) == {acme_only_project.slug: True}


def test_sources_lists_the_tenants_sources_in_the_callers_projects(people, acme_only_project):
    for who in ("admin", "member", "service"):
        response = call("get", "/sources", getattr(people, who))
        assert response.status_code == 200
        (source,) = response.json()["sources"]
        assert (source["slug"], source["kind"], source["name"]) == ("acme-wiki", "test_rows", "Acme wiki")
        assert source["status"] == "succeeded" and source["projects"] == ["everything"]
        assert source["last_run"]["source"] == "acme-wiki"
        assert source["last_run"]["seen"] == 6 and source["last_run"]["error"] == ""
        assert source["indexed_rows"] == 6
    (outsider_source,) = call("get", "/sources", people.outsider).json()["sources"]
    assert outsider_source["slug"] == "globex-wiki"
    # A project with no source lists none; one of another tenant is 404.
    response = call("get", "/sources", people.admin, data={"project": acme_only_project.slug})
    assert response.json() == {"sources": []}
    response = call("get", "/sources", people.outsider, data={"project": acme_only_project.slug})
    assert_error(response, 404, field="project")


def test_runs_lists_status_counts_and_errors_per_source(people):
    response = call("get", "/runs", people.member, data={"source": "acme-wiki"})
    assert response.status_code == 200
    (run,) = response.json()["runs"]
    assert run["source"] == "acme-wiki" and run["status"] == "succeeded"
    assert (run["seen"], run["created"], run["error"]) == (6, 6, "")
    assert run["duration_seconds"] is not None and run["duration_seconds"] >= 0
    # Progress: this connector counts no units, and a finished run has no time left.
    assert (run["units_done"], run["units_total"], run["units_label"], run["eta_seconds"]) == (0, None, "", None)
    assert [r["source"] for r in call("get", "/runs", people.outsider).json()["runs"]] == ["globex-wiki"]
    response = call("get", "/runs", people.outsider, data={"source": "acme-wiki"})
    err = assert_error(response, 404, code="not_found", field="source")
    assert "acme-wiki" in err["error"]


@pytest.fixture
def eager_celery():
    """Run queued tasks in-process (Celery's own test setting) instead of sending them to a broker."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@override_settings(KB_CUSTOM_CONNECTORS=CUSTOM)
def test_sync_queues_an_ingestion_run_for_a_tenant_admin(people, kb, eager_celery, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = call("post", "/sources/acme-wiki/sync", people.admin)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["source"] == "acme-wiki" and body["status"] == "queued"
    assert len(callbacks) == 1  # the task is sent only once the run row is committed
    with tenant_context(kb.acme.tenant.pk):
        run = IngestionRun.objects.get(pk=body["run_id"])
    # The queued task ran (eagerly) on that very run: the connector saw the six rows again.
    assert run.source_id == kb.acme_source_id and run.status == "succeeded" and run.seen == 6
    assert run.unchanged == 6 and run.embedded == 0
    latest = call("get", "/runs", people.admin, data={"source": "acme-wiki", "limit": 1}).json()["runs"][0]
    assert latest["id"] == body["run_id"] and latest["status"] == "succeeded"


def test_sync_is_refused_to_members_service_tokens_and_outsiders(people, kb, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        err = assert_error(call("post", "/sources/acme-wiki/sync", people.member), 403, code="permission_denied")
        assert "owner or admin" in err["error"]
        assert_error(call("post", "/sources/acme-wiki/sync", people.service), 403, code="permission_denied")
        err = assert_error(call("post", "/sources/acme-wiki/sync", people.outsider), 404, field="slug")
        assert "acme-wiki" in err["error"]
        assert_error(call("post", "/sources/no-such-source/sync", people.admin), 404, field="slug")
    assert callbacks == []
    with tenant_context(kb.acme.tenant.pk):
        assert not IngestionRun.objects.filter(status=IngestionRun.Status.QUEUED).exists()


# ---------- feedback -----------------------------------------------------------------------------


def _ask(token: str) -> str:
    response = call("post", "/ask", token, json={"question": DEPLOY})
    assert response.status_code == 200
    return response.json()["answer_id"]


def test_feedback_only_by_the_asker_and_a_second_vote_replaces_the_first(people, kb):
    answer_id = _ask(people.admin)
    path = f"/answers/{answer_id}/feedback"
    assert_error(call("post", path, people.member, json={"vote": 1}), 404, code="not_found", field="answer_id")
    assert_error(call("post", path, people.outsider, json={"vote": 1}), 404, field="answer_id")
    err = assert_error(call("post", path, people.service, json={"vote": 1}), 403, code="permission_denied")
    assert "service token" in err["error"]
    assert_error(call("post", path, people.admin, json={"vote": 2}), 400, code="invalid_choice", field="vote")
    assert_error(call("post", path, people.admin, json={}), 400, code="required", field="vote")
    assert_error(
        call("post", f"/answers/{uuid.uuid4()}/feedback", people.admin, json={"vote": 1}), 404, field="answer_id"
    )

    response = call("post", path, people.admin, json={"vote": 1, "comment": "spot on"})
    assert response.status_code == 200
    assert response.json() == {"answer_id": answer_id, "vote": 1, "comment": "spot on"}
    response = call("post", path, people.admin, json={"vote": -1})
    assert response.json()["vote"] == -1
    with tenant_context(kb.acme.tenant.pk):
        (feedback,) = AnswerFeedback.objects.filter(answer_record__public_id=answer_id)
    assert (feedback.vote, feedback.comment, feedback.user_id) == (-1, "", kb.acme.admin.pk)


def test_a_token_of_another_tenant_cannot_vote_on_its_users_answer_there(people, kb):
    """The admin of Acme also joins Globex: a token for Globex never reaches an Acme answer."""
    answer_id = _ask(people.admin)
    membership_create(tenant_id=kb.globex.tenant.pk, user=kb.acme.admin, role=Membership.Role.MEMBER)
    globex_token = api_token_create(
        tenant=kb.globex.tenant, user=kb.acme.admin, name="second-tenant", project=kb.globex.project
    )[1]
    response = call("post", f"/answers/{answer_id}/feedback", globex_token, json={"vote": 1})
    assert_error(response, 404, field="answer_id")
    assert call("post", f"/answers/{answer_id}/feedback", people.admin, json={"vote": 1}).status_code == 200


# ---------- authentication -----------------------------------------------------------------------


def test_refused_tokens_are_401_naming_the_reason(people, kb):
    revoked_row, revoked = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="api-revoked")
    api_token_revoke(token=revoked_row)
    expired_row, expired = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="api-expired")
    with tenant_context(kb.acme.tenant.pk):
        ApiToken.objects.filter(pk=expired_row.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    leaver = get_user_model().objects.create_user("api-leaver", "leaver@acme.example", "l" * 12)
    membership_create(tenant_id=kb.acme.tenant.pk, user=leaver)
    left = api_token_create(tenant=kb.acme.tenant, user=leaver, name="api-leaver")[1]
    leaver.is_active = False
    leaver.save(update_fields=["is_active"])
    forged = people.admin[:-4] + ("AAAA" if not people.admin.endswith("AAAA") else "BBBB")

    cases = {
        revoked: ("revoked", "was revoked"),
        expired: ("expired", "expired at"),
        forged: ("unknown", "unknown API token"),
        "kb_nope": ("malformed", "malformed API token"),
        left: ("not_member", "no longer a member"),
    }
    for token, (reason, words) in cases.items():
        response = call("get", "/projects", token)
        body = assert_error(response, 401, code=reason)
        assert body["reason"] == reason and words in body["error"] and f"({reason})" in body["error"]
        assert response["WWW-Authenticate"].startswith("Bearer")
    response = call("get", "/projects", headers={"Authorization": f"Bearer {people.admin} extra"})
    assert assert_error(response, 401)["reason"] == "malformed"
    body = assert_error(call("get", "/projects"), 401, code="not_authenticated")
    assert "Authorization: Bearer" in body["error"]


def test_every_endpoint_refuses_anonymous_callers(kb, db):
    for method, path in [
        ("post", "/ask"),
        ("get", "/search?q=deploy"),
        ("get", "/who-knows?q=deploy"),
        ("get", "/projects"),
        ("get", "/sources"),
        ("post", "/sources/acme-wiki/sync"),
        ("get", "/runs"),
        ("post", f"/answers/{uuid.uuid4()}/feedback"),
    ]:
        assert_error(call(method, path), 401, code="not_authenticated")


def test_a_logged_in_browser_session_works_and_csrf_is_enforced(kb, db):
    client = Client(enforce_csrf_checks=True)
    client.force_login(kb.acme_member)
    response = call("get", "/projects", client=client)
    assert response.status_code == 200 and response.json()["projects"][0]["slug"] == "everything"
    response = call("get", "/search", client=client, data={"q": "compute_backoff"})
    assert response.json()["hits"][0]["title"] == "billing/retry.py: compute_backoff"

    err = assert_error(call("post", "/ask", client=client, json={"question": DEPLOY}), 403, code="permission_denied")
    assert "CSRF" in err["error"]
    client.get("/")  # the ask page sets the CSRF cookie
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    response = call("post", "/ask", client=client, json={"question": DEPLOY}, headers={"X-CSRFToken": token})
    assert response.status_code == 200 and response.json()["answered"] is True
    answer_id = response.json()["answer_id"]
    response = call(
        "post", f"/answers/{answer_id}/feedback", client=client, json={"vote": 1}, headers={"X-CSRFToken": token}
    )
    assert response.status_code == 200 and response.json()["vote"] == 1


def test_a_session_user_without_an_organization_sees_nothing(db):
    client = Client()
    client.force_login(get_user_model().objects.create_user("api-loner", "loner@example.com", "n" * 12))
    assert call("get", "/projects", client=client).json() == {"projects": []}
    assert call("get", "/sources", client=client).json() == {"sources": []}
    assert call("get", "/runs", client=client).json() == {"runs": []}
    err = assert_error(call("get", "/search", client=client, data={"q": "deploy"}), 404, field="project")
    assert "organization" in err["error"]


# ---------- throttling and errors ----------------------------------------------------------------


def _rates(**rates: str) -> dict:
    return {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"ask": "30/min", "api": "120/min", **rates}}


def test_throttling_is_per_token_and_answers_429_with_retry_after(people):
    with override_settings(REST_FRAMEWORK=_rates(api="2/min")):
        assert call("get", "/projects", people.admin).status_code == 200
        assert call("get", "/sources", people.admin).status_code == 200
        response = call("get", "/projects", people.admin)
        body = assert_error(response, 429, code="throttled")
        assert 0 < int(response["Retry-After"]) <= 60 and body["retry_after"] == int(response["Retry-After"])
        assert call("get", "/projects", people.member).status_code == 200  # another token, its own count


def test_ask_has_its_own_lower_rate(people):
    with override_settings(REST_FRAMEWORK=_rates(ask="1/min")):
        assert call("post", "/ask", people.member, json={"question": ""}).status_code == 400  # counted all the same
        assert_error(call("post", "/ask", people.member, json={"question": DEPLOY}), 429, code="throttled")
        assert call("get", "/projects", people.member).status_code == 200  # the other scope is not spent


def test_errors_outside_views_are_json_too(people):
    body = assert_error(call("get", "/no-such-endpoint", people.admin), 404, code="not_found")
    assert "/api/v1/no-such-endpoint" in body["error"]
    assert_error(call("get", "/answers/not-a-uuid/feedback", people.admin), 404)
    assert_error(call("get", "/ask", people.admin), 405, code="method_not_allowed")
    response = call("get", "/projects", people.admin, headers={"X-Request-ID": "trace-12345678"})
    assert response["X-Request-ID"] == "trace-12345678"
    # Outside /api/ the site's own 404 page stays.
    page = not_found(RequestFactory().get("/nowhere/"), None)
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def test_an_unexpected_exception_is_a_json_500_with_a_request_id():
    request = Request(RequestFactory().get(f"{API}/projects", HTTP_X_REQUEST_ID="req-abcdef12"))
    response = api_exception_handler(ZeroDivisionError("boom"), {"request": request, "view": None})
    assert response.status_code == 500 and response["X-Request-ID"] == "req-abcdef12"
    assert response.data == {
        "error": "internal error; quote request id req-abcdef12 when reporting it",
        "field": None,
        "code": "server_error",
        "request_id": "req-abcdef12",
    }
    assert "boom" not in json.dumps(response.data)
