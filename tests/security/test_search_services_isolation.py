"""The search services on every surface (web, API, MCP): a member never sees nor has audited a
restricted section of a file they may read, another tenant reads nothing, limits and kinds are
checked by name, and who-knows counts people. Tenants ``rvw-a`` (owner ``rvw-a-admin``, member ``rvw-a-member``) and
``rvw-b``; ``rvw-a`` holds the search tests' Acme rows plus a section of ``runbook.md``
restricted to the owner (so a member's runbook block must never merge it).
"""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client, override_settings
from django.urls import reverse

from sources.selectors import scope_for_user
from tests.search.conftest import ACME_ROWS, CUSTOM
from tests.security.attack_data import onboard_attack_pair

BREAKGLASS = "pelican override code"


@pytest.fixture(scope="module")
def rv(django_db_setup, django_db_blocker):
    def rows(admin_pk):
        return ACME_ROWS + [
            {
                "external_id": "runbook#breakglass",
                "kind": "doc_section",
                "title": "Runbook > Break-glass deploy of the billing service",
                "path": "runbook.md",  # the same file as the public runbook sections
                "url": "https://wiki.acme.example/runbook#breakglass",
                "content": f"Break-glass deploy of the billing service: the {BREAKGLASS} opens the deploy gate.",
                "principals": [f"user:{admin_pk}"],
            },
        ]

    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        t, other, member, source = onboard_attack_pair(("Rvw A", "Rvw B"), ("rvw-a", "rvw-b"), "Rvw wiki", rows)
    return t, other, member


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


# -- search services: audit events, restricted and other-tenant ids, limits and kinds ----------


def _search_events(tenant_id, since_id):
    from kbportal.models import AuditEvent
    from kbportal.tenancy import tenant_context

    with tenant_context(tenant_id):
        return list(AuditEvent.objects.filter(action="search", id__gt=since_id).order_by("id"))


def _last_event_id(tenant_id):
    from kbportal.models import AuditEvent
    from kbportal.tenancy import tenant_context

    with tenant_context(tenant_id):
        last = AuditEvent.objects.order_by("-id").first()
        return last.id if last else 0


def _restricted_ids(t):
    from kbportal.tenancy import tenant_context
    from sources.models import Document

    with tenant_context(t.tenant.pk, user_id=t.admin.pk):
        return set(Document.objects.filter(external_id="runbook#breakglass").values_list("id", flat=True))


@pytest.mark.django_db
def test_a_members_search_never_shows_or_audits_a_restricted_section_of_the_same_file(rv):
    from projects.services import api_token_create
    from search.mcp_server import evidence_for_token, experts_for_token
    from search.services import evidence_search

    t, other, member = rv
    restricted = _restricted_ids(t)
    assert restricted
    q = "break-glass deploy of the billing service"
    admin_ids = {i for ev in evidence_search(scope=scope_for_user(t.admin), query=q, limit=10) for i in ev.document_ids}
    assert restricted <= admin_ids  # the admin's runbook block merges it

    since = _last_event_id(t.tenant.pk)
    shown: list[int] = []
    for ev in evidence_search(scope=scope_for_user(member), query=q, limit=10):
        shown += ev.document_ids
        assert BREAKGLASS not in ev.text + ev.body + ev.context
    client = Client()
    client.force_login(member)
    assert BREAKGLASS not in client.get(reverse("search:search"), {"q": q}).content.decode()
    assert BREAKGLASS not in client.get(reverse("search:people"), {"q": q}).content.decode()
    _, token = api_token_create(tenant=t.tenant, user=member, name="rvw-member")
    _, outsider = api_token_create(tenant=other.tenant, user=other.admin, name="rvw-outsider")
    auth = {"Authorization": f"Bearer {token}"}
    for path in ("/api/v1/search", "/api/v1/who-knows"):
        response = Client().get(path, {"q": q, "limit": 20}, headers=auth)
        assert response.status_code == 200 and BREAKGLASS not in response.content.decode()
    for tool in ("search", "search_slack", "search_code", "recent_prs"):
        results = evidence_for_token(token, tool=tool, query=q, limit=10**9, project=None)
        assert len(results.results) <= 20 and BREAKGLASS not in results.model_dump_json()
    assert BREAKGLASS not in experts_for_token(token, query=q, limit=-5, project=None).model_dump_json()
    events = _search_events(t.tenant.pk, since)
    assert len(events) >= 9
    for event in events:
        assert not restricted & set(event.data["hits"]), event.data
    # the other tenant's token reads nothing of rvw-a, and its events land in its own tenant
    response = Client().get("/api/v1/search", {"q": q}, headers={"Authorization": f"Bearer {outsider}"})
    assert response.status_code == 200 and response.json()["hits"] == []
    assert not [e for e in _search_events(t.tenant.pk, since) if e.actor_id == other.admin.pk]


@pytest.mark.django_db
def test_limits_and_kinds_at_the_service_and_on_the_api(rv):
    from projects.services import api_token_create
    from search.services import evidence_search, experts_find

    t, other, member = rv
    scope = scope_for_user(t.admin)
    assert evidence_search(scope=scope, query="invoices stuck", limit=0) == []
    assert evidence_search(scope=scope, query="invoices stuck", limit=0, kinds=["thread"]) == []
    assert evidence_search(scope=scope, query="invoices stuck", limit=5, kinds=["no-such-kind"]) == []
    assert len(evidence_search(scope=scope, query="invoices stuck", limit=10**9)) <= 10
    assert experts_find(scope=scope, query="invoices stuck", limit=0) == []
    for tool in ("search_slack", "search_code", "recent_prs"):
        with pytest.raises(ValueError, match="kinds"):
            evidence_search(scope=scope, query="invoices stuck", limit=5, tool=tool, kinds=["thread"])
    with pytest.raises(KeyError):
        evidence_search(scope=scope, query="invoices stuck", limit=5, tool="ask")
    _, token = api_token_create(tenant=t.tenant, user=t.admin, name="rvw-admin")
    auth = {"Authorization": f"Bearer {token}"}
    for params in ({"limit": 0}, {"limit": -1}, {"limit": 10**12}, {"limit": "1e3"}, {"kind": "no-such-kind"}):
        response = Client().get("/api/v1/search", {"q": "invoices stuck", **params}, headers=auth)
        assert response.status_code == 400, (params, response.status_code)
    for limit in (0, -1, 21, 10**12):
        response = Client().get("/api/v1/who-knows", {"q": "invoices stuck", "limit": limit}, headers=auth)
        assert response.status_code == 400, limit


@pytest.mark.django_db
def test_the_who_knows_audit_count_is_the_people_returned(rv):
    """``search_record``: ``count`` is the results returned; for who-knows, the people."""
    from search.services import experts_find

    t = rv[0]
    since = _last_event_id(t.tenant.pk)
    experts = experts_find(scope=scope_for_user(t.admin), query="invoices stuck in pending", limit=5)
    (event,) = _search_events(t.tenant.pk, since)
    assert experts and event.data["people"] == [e.name for e in experts]
    assert event.data["count"] == len(experts), (event.data["count"], len(experts), event.data["hits"])
