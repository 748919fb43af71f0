"""Attacks on authorization and isolation across the web pages, the API, the MCP tools and the
answer pipeline's tools. Every test asserts the safe behaviour; each attack that worked when
this suite was written is reported separately, not here.

Three people per test where it matters: the tenant-X owner (who holds the restricted rows'
principal), the tenant-X member, and the tenant-Y outsider (``tests/security/attack_data.py``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

import anyio
import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Membership
from projects.services import api_token_create, api_token_revoke, membership_create, profile_set_default_project
from search.mcp_server import build_server, evidence_for_token, experts_for_token
from search.models import AnswerRecord
from search.pipeline.gate import readable_document_frequencies
from search.services import ask
from search.tools.code import search_code
from search.tools.people import who_knows
from search.tools.subsystems import subsystem_index
from sources.models import Document
from sources.selectors import scope_for_user
from tests.security.attack_data import (
    ATKX,
    HIDDEN_AUTHOR,
    NEIGHBOUR_MARKER,
    SECRET_CODE_MARKER,
    atkx_load,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def atkx(django_db_setup, django_db_blocker) -> ATKX:
    return atkx_load(django_db_blocker)


API = "/api/v1"


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    cache.clear()  # the API's throttle counts live in the local-memory cache
    yield


@dataclass
class Tokens:
    admin: str
    member: str
    service: str
    outsider: str
    revoked: str
    expired: str
    removed: str


@pytest.fixture(scope="module")
def tokens(atkx, django_db_blocker) -> Tokens:
    """Committed tokens (the MCP tools read them on their own connections)."""
    with django_db_blocker.unblock():
        x = atkx.x
        admin = api_token_create(tenant=x.tenant, user=x.admin, name="atk-admin")[1]
        member = api_token_create(tenant=x.tenant, user=atkx.member, name="atk-member")[1]
        service = api_token_create(tenant=x.tenant, user=None, name="atk-svc", project=x.project)[1]
        outsider = api_token_create(tenant=atkx.y.tenant, user=atkx.y.admin, name="atk-y")[1]
        revoked_row, revoked = api_token_create(tenant=x.tenant, user=x.admin, name="atk-revoked")
        api_token_revoke(token=revoked_row)
        expired_row, expired = api_token_create(tenant=x.tenant, user=x.admin, name="atk-expired", expires_in_days=1)
        with tenant_context(x.tenant.pk):
            ApiToken.objects.filter(pk=expired_row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
        leaver = get_user_model().objects.create_user("atk-x-leaver", "leaver@atk-x.example", "l" * 12)
        membership_create(tenant_id=x.tenant.pk, user=leaver)
        profile_set_default_project(user=leaver, tenant_id=x.tenant.pk, project_id=x.project.pk)
        removed = api_token_create(tenant=x.tenant, user=leaver, name="atk-leaver")[1]
        with tenant_context(x.tenant.pk):
            Membership.objects.filter(user=leaver).delete()  # left the organization; the token stays
    return Tokens(admin, member, service, outsider, revoked, expired, removed)


def _api(method: str, path: str, token: str | None = None, **kwargs):
    client = Client(raise_request_exception=False)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    if method == "post" and "data" in kwargs:
        kwargs["data"] = json.dumps(kwargs["data"])
        kwargs["content_type"] = "application/json"
    return getattr(client, method)(f"{API}{path}", **headers, **kwargs)


def _web(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


# ---------- forged, refused and misplaced tokens --------------------------------------------------


ENDPOINTS = [
    ("post", "/ask", {"data": {"question": "walrus migration"}}),
    ("get", "/search", {"data": {"q": "walrus migration"}}),
    ("get", "/who-knows", {"data": {"q": "walrus migration"}}),
    ("get", "/projects", {}),
    ("get", "/sources", {}),
    ("post", "/sources/atkx-wiki/sync", {}),
    ("get", "/runs", {}),
    ("post", "/answers/5f0c6f43-0c1e-4d5e-9a53-7c1f2b8e4d10/feedback", {"data": {"vote": 1}}),
    ("get", "/analytics", {}),
]


def _forgeries(real: str) -> dict[str, str]:
    from projects.selectors import api_token_hash

    prefix = real.split("_")[1]
    return {
        "right prefix, wrong secret": f"kb_{prefix}_{'A' * 40}",
        "right secret, other prefix": f"kb_{'0' * 8}_{real.split('_')[2]}",
        "the stored hash as the token": api_token_hash(real),
        "upper-cased token": real.upper(),
        "token plus one character": real + "A",
        "token minus one character": real[:-1],
        "token with a percent-encoded NUL": real[:10] + "%00" + real[10:],
    }


@pytest.mark.parametrize(("method", "path", "kwargs"), ENDPOINTS)
def test_forged_tokens_are_refused_on_every_endpoint(tokens, method, path, kwargs):
    for label, forged in _forgeries(tokens.admin).items():
        r = _api(method, path, forged, **kwargs)
        assert r.status_code == 401, (label, r.status_code)
        body = r.json()
        assert body["reason"] in {"unknown", "malformed"}, (label, body)
        assert "atk-x" not in r.content.decode() and "walrus" not in r.content.decode()


@pytest.mark.parametrize(("method", "path", "kwargs"), ENDPOINTS)
def test_revoked_expired_and_departed_users_tokens_are_refused_everywhere(tokens, method, path, kwargs):
    for token, reason in ((tokens.revoked, "revoked"), (tokens.expired, "expired"), (tokens.removed, "not_member")):
        r = _api(method, path, token, **kwargs)
        assert r.status_code == 401 and r.json()["reason"] == reason, (reason, r.status_code, r.content[:200])


def test_tokens_in_other_places_than_the_bearer_header_are_ignored(tokens):
    client = Client(raise_request_exception=False)
    for kwargs in (
        {"data": {"token": tokens.admin}},
        {"data": {"access_token": tokens.admin}},
        {"HTTP_AUTHORIZATION": f"Token {tokens.admin}"},
        {"HTTP_AUTHORIZATION": f"Basic {tokens.admin}"},
        {"HTTP_X_API_KEY": tokens.admin},
        {"HTTP_COOKIE": f"sessionid={tokens.admin}"},
    ):
        r = client.get(f"{API}/projects", **kwargs)
        assert r.status_code == 401, (kwargs, r.status_code)


def test_malformed_authorization_headers_are_401_not_500(tokens):
    client = Client(raise_request_exception=False)
    for header in (
        "Bearer",
        "Bearer ",
        "Bearer  " + tokens.admin + "  x",
        "Bearer kb_",
        "Bearer kb__",
        "Bearer " + "kb_" + "a" * 100_000,
        "Bearer kb_abcdefgh_" + "é" * 40,
        "bEaReR kb_zzzzzzzz_" + "A" * 40,
    ):
        r = client.get(f"{API}/projects", HTTP_AUTHORIZATION=header)
        assert r.status_code == 401, (header[:40], r.status_code)


# ---------- tenant walls through the API ----------------------------------------------------------


def test_outsider_token_gets_404_for_every_object_named_in_tenant_x(atkx, tokens):
    x_slug = atkx.x.project.slug  # both tenants call their first project "everything"
    with tenant_context(atkx.x.tenant.pk):
        answer = AnswerRecord.objects.create(
            tenant_id=atkx.x.tenant.pk, user=atkx.x.admin, question="q", answer="a", answered=True, latency_ms=1
        )
    from sources.models import DataSource

    with tenant_context(atkx.x.tenant.pk):
        x_source_slug = DataSource.objects.get(pk=atkx.source_id).slug
    r = _api("post", f"/sources/{x_source_slug}/sync", tokens.outsider)
    assert r.status_code == 404
    r = _api("get", "/runs", tokens.outsider, data={"source": x_source_slug})
    assert r.status_code == 404
    r = _api("post", f"/answers/{answer.public_id}/feedback", tokens.outsider, data={"vote": -1})
    assert r.status_code == 404
    # The outsider's "everything" is its own project: same slug, other tenant, its own rows only.
    r = _api("get", "/search", tokens.outsider, data={"q": "walrus migration", "project": x_slug})
    assert r.status_code == 200
    assert {h["title"] for h in r.json()["hits"]} == {"AtkY walrus migration"}


def test_service_token_cannot_vote_sync_or_read_analytics(atkx, tokens):
    from sources.models import DataSource

    with tenant_context(atkx.x.tenant.pk):
        slug = DataSource.objects.get(pk=atkx.source_id).slug
        answer = AnswerRecord.objects.create(
            tenant_id=atkx.x.tenant.pk, user=None, question="q", answer="a", answered=True, latency_ms=1
        )
    assert _api("post", f"/answers/{answer.public_id}/feedback", tokens.service, data={"vote": 1}).status_code == 403
    assert _api("post", f"/sources/{slug}/sync", tokens.service).status_code == 403
    assert _api("get", "/analytics", tokens.service).status_code == 403


def test_member_token_and_session_cannot_do_admin_things(atkx, tokens):
    from sources.models import DataSource, IngestionRun

    with tenant_context(atkx.x.tenant.pk):
        slug = DataSource.objects.get(pk=atkx.source_id).slug
        runs_before = IngestionRun.objects.filter(source_id=atkx.source_id).count()
    assert _api("post", f"/sources/{slug}/sync", tokens.member).status_code == 403
    assert _api("get", "/analytics", tokens.member).status_code == 403
    web = _web(atkx.member)
    for name in ("search:audit", "search:audit_export", "search:analytics"):
        assert web.get(reverse(name)).status_code == 404, name
    r = web.post(reverse("projects:onboarding"), {"action": "create", "name": "Member's own project"})
    assert r.status_code == 403
    for url in ("/admin/", "/admin/sources/datasource/", "/admin/kbportal/auditevent/"):
        r = web.get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"], url
    with tenant_context(atkx.x.tenant.pk):
        assert IngestionRun.objects.filter(source_id=atkx.source_id).count() == runs_before


def test_an_admin_demoted_to_member_loses_admin_rights_at_once(atkx):
    user = get_user_model().objects.create_user("atk-x-demoted", "demoted@atk-x.example", "d" * 12)
    membership_create(tenant_id=atkx.x.tenant.pk, user=user, role=Membership.Role.ADMIN)
    profile_set_default_project(user=user, tenant_id=atkx.x.tenant.pk, project_id=atkx.x.project.pk)
    raw = api_token_create(tenant=atkx.x.tenant, user=user, name="demoted")[1]
    web = _web(user)
    assert web.get(reverse("search:audit")).status_code == 200
    assert _api("get", "/analytics", raw).status_code == 200
    with tenant_context(atkx.x.tenant.pk):
        Membership.objects.filter(user=user).update(role=Membership.Role.MEMBER)
    assert web.get(reverse("search:audit")).status_code == 404
    assert _api("get", "/analytics", raw).status_code == 403


def test_pinned_token_cannot_widen_to_other_projects(atkx, tokens):
    from projects.services import project_create

    other = project_create(tenant_id=atkx.x.tenant.pk, name="Pinned other")
    for path, params in (
        ("/search", {"q": "walrus", "project": other.slug}),
        ("/who-knows", {"q": "walrus", "project": other.slug}),
        ("/sources", {"project": other.slug}),
    ):
        assert _api("get", path, tokens.service, data=params).status_code == 404, path
    r = _api("post", "/ask", tokens.service, data={"question": "walrus", "project": other.slug})
    assert r.status_code == 404
    assert [p["slug"] for p in _api("get", "/projects", tokens.service).json()["projects"]] == [atkx.x.project.slug]


# ---------- answers and their feedback ------------------------------------------------------------


def test_nobody_but_the_asker_votes_on_an_answer(atkx, tokens):
    result = ask("walrus migration runbook", scope_for_user(atkx.x.admin))
    url = reverse("search:answer_feedback", args=[result.answer_id])
    # another member of the same tenant, on the web (with CSRF) and through the API
    member_web = Client(enforce_csrf_checks=False, raise_request_exception=False)
    member_web.force_login(atkx.member)
    assert member_web.post(url, {"vote": "down", "comment": "hijack"}).status_code == 404
    assert _api("post", f"/answers/{result.answer_id}/feedback", tokens.member, data={"vote": -1}).status_code == 404
    # the outsider, on the web
    assert _web(atkx.y.admin).post(url, {"vote": "down"}).status_code == 404
    from search.models import AnswerFeedback

    with tenant_context(atkx.x.tenant.pk):
        assert not AnswerFeedback.objects.filter(answer_record__public_id=result.answer_id).exists()
    # the asker may
    assert _api("post", f"/answers/{result.answer_id}/feedback", tokens.admin, data={"vote": 1}).status_code == 200


def test_web_feedback_without_the_csrf_token_is_refused(atkx):
    result = ask("walrus migration runbook", scope_for_user(atkx.x.admin))
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(atkx.x.admin)
    r = client.post(reverse("search:answer_feedback", args=[result.answer_id]), {"vote": "up"})
    assert r.status_code == 403


# ---------- restricted rows: documents, people, code, module index ----------------------------------


def test_document_page_refuses_restricted_foreign_and_unknown_rows(atkx):
    page = f"/documents/{atkx.source_public_id}/"
    assert _web(atkx.member).get(page, {"id": "wiki#intro"}).status_code == 200  # control
    assert _web(atkx.x.admin).get(page, {"id": "wiki#secret"}).status_code == 200  # the principal
    assert _web(atkx.member).get(page, {"id": "wiki#secret"}).status_code == 404
    assert _web(atkx.member).get(page, {"id": "app/secret_keys.py"}).status_code == 404
    for external_id in ("wiki#intro", "wiki#secret"):
        assert _web(atkx.y.admin).get(page, {"id": external_id}).status_code == 404
    for probe in ("' OR '1'='1", "wiki#%", "wiki#_ntro", "*", "", "../wiki#secret", "wiki#secret "):
        r = _web(atkx.member).get(page, {"id": probe})
        assert r.status_code == 404, probe
        assert NEIGHBOUR_MARKER not in r.content.decode()
    assert _web(atkx.member).get(f"/documents/{uuid.uuid4()}/", {"id": "wiki#intro"}).status_code == 404


def test_who_knows_never_names_the_author_of_a_restricted_thread(atkx, tokens):
    admin_names = {e.name for e in who_knows(query="walrus migration", scope=scope_for_user(atkx.x.admin))}
    assert HIDDEN_AUTHOR in admin_names  # control: the principal sees them
    member_names = {e.name for e in who_knows(query="walrus migration", scope=scope_for_user(atkx.member))}
    assert member_names and HIDDEN_AUTHOR not in member_names
    html = _web(atkx.member).get(reverse("search:people"), {"q": "walrus migration"}).content.decode()
    assert "Ana Public" in html and HIDDEN_AUTHOR not in html and "layoffs" not in html
    r = _api("get", "/who-knows", tokens.member, data={"q": "walrus migration"})
    assert r.status_code == 200 and HIDDEN_AUTHOR not in r.content.decode() and "layoffs" not in r.content.decode()
    for token in (tokens.member, tokens.service):
        found = experts_for_token(token, query="walrus migration", limit=20, project=None)
        assert HIDDEN_AUTHOR not in found.model_dump_json() and "night shift" not in found.model_dump_json()
    r = _api("get", "/who-knows", tokens.outsider, data={"q": "walrus migration Ana Public"})
    assert r.status_code == 200 and r.json()["experts"] == []


def test_search_code_and_subsystem_index_hide_restricted_code(atkx, tmp_path, settings):
    settings.KB_WORKDIR = tmp_path / "work"
    admin, member = scope_for_user(atkx.x.admin), scope_for_user(atkx.member)
    query = f"where is {SECRET_CODE_MARKER} defined in secret_keys"
    assert any(ev.path == "app/secret_keys.py" for ev in search_code(query=query, scope=admin))  # control
    for ev in search_code(query=query, scope=member):
        assert ev.path != "app/secret_keys.py" and SECRET_CODE_MARKER not in ev.text
    assert any(m.path == "app/secret_keys.py" for m in subsystem_index(query=query, scope=admin))  # control
    for module in subsystem_index(query=query, scope=member):
        assert module.path != "app/secret_keys.py" and SECRET_CODE_MARKER not in json.dumps(module.as_dict())


def test_mcp_tools_keep_tenant_principals_and_project_walls(atkx, tokens, tmp_path, settings):
    from mcp.server.mcpserver.exceptions import ToolError

    settings.KB_WORKDIR = tmp_path / "work"
    for tool in ("search", "search_code", "search_slack", "recent_prs"):
        found = evidence_for_token(
            tokens.member, tool=tool, query=f"walrus migration {SECRET_CODE_MARKER}", limit=20, project=None
        )
        dumped = found.model_dump_json()
        assert "night shift" not in dumped and SECRET_CODE_MARKER not in dumped and "okapi" not in dumped, tool
    found = evidence_for_token(tokens.outsider, tool="search", query="walrus migration", limit=20, project=None)
    assert [r.title for r in found.results] == ["AtkY walrus migration"]
    hashed = _forgeries(tokens.admin)["the stored hash as the token"]
    for bad in (tokens.revoked, tokens.expired, tokens.removed, hashed):
        with pytest.raises(ToolError):
            evidence_for_token(bad, tool="search", query="walrus", limit=5, project=None)
    with pytest.raises(ToolError):
        evidence_for_token(tokens.service, tool="search", query="walrus", limit=5, project="some-other-project")


def test_mcp_server_validates_tool_arguments_before_running(atkx, tokens):
    from mcp.server.mcpserver.exceptions import ToolError

    server = build_server(stdio_token=tokens.member)

    async def call(args: dict) -> object:
        return await server.call_tool("search", args)

    result = anyio.run(call, {"query": "walrus migration"})  # control: valid arguments run
    assert "walrus migration" in str(result) and "okapi" not in str(result)
    for args in (
        {"query": ""},
        {"query": "walrus", "limit": 0},
        {"query": "walrus", "limit": 21},
        {"query": "walrus", "project": "../atk-y"},
        {"query": "walrus", "project": "x" * 81},
        {"query": "walrus", "project": "everything' OR '1'='1"},
        {"query": ["walrus"]},
    ):
        with pytest.raises(ToolError, match="validation error"):
            anyio.run(call, args)
    # The question-length limit is the one every path applies, with the same message.
    with pytest.raises(ToolError, match="at most 2,000 are allowed"):
        anyio.run(call, {"query": "x " * 1001})


# ---------- side channels ---------------------------------------------------------------------------


def test_the_gate_weighs_restricted_words_like_words_nobody_wrote(atkx):
    """The gate weighs a question's words by how many rows the asker may read hold them: for a
    member, the words of a restricted page count as often as invented ones (zero), so neither
    the verdict nor its features tell that a page they may not read holds them."""
    restricted_words = "ibex onboarding marmot merger codename bluefin"
    nonsense_words = "ibex onboarding zorblax quibbit frobnik wuzzle"
    member, admin = scope_for_user(atkx.member), scope_for_user(atkx.x.admin)
    with tenant_context(atkx.x.tenant.pk, user_id=atkx.x.admin.pk):
        assert readable_document_frequencies(restricted_words, admin)["marmot"] == 1  # control: the principal
    with tenant_context(atkx.x.tenant.pk, user_id=atkx.member.pk):
        restricted = readable_document_frequencies(restricted_words, member)
        nonsense = readable_document_frequencies(nonsense_words, member)
    assert [restricted[w] for w in ("marmot", "merger", "codenam", "bluefin")] == [0, 0, 0, 0]
    assert restricted["ibex"] == nonsense["ibex"]
    r, n = ask(restricted_words, member), ask(nonsense_words, member)
    assert r.verdict.status == n.verdict.status and not r.answer.answered
    assert r.verdict.features.get("missing") == n.verdict.features.get("missing")
    assert "closes in March" not in r.answer.text and "marmot" not in r.answer.text.lower()


def test_analytics_withholds_titles_of_cited_rows_the_viewer_may_not_read(atkx):
    with tenant_context(atkx.x.tenant.pk):
        secret_id = Document.objects.get(source_id=atkx.source_id, external_id="wiki#secret").pk
        AnswerRecord.objects.create(
            tenant_id=atkx.x.tenant.pk,
            user=atkx.x.admin,
            project=atkx.x.project,
            question="merger date?",
            answer="[1]",
            answered=True,
            latency_ms=5,
            evidence_document_ids=[secret_id],
            cited_document_ids=[secret_id],
        )
    other_admin = get_user_model().objects.create_user("atk-x-admin2", "admin2@atk-x.example", "a" * 12)
    membership_create(tenant_id=atkx.x.tenant.pk, user=other_admin, role=Membership.Role.ADMIN)
    profile_set_default_project(user=other_admin, tenant_id=atkx.x.tenant.pk, project_id=atkx.x.project.pk)
    owner_page = _web(atkx.x.admin).get(reverse("search:analytics")).content.decode()
    assert "Merger (restricted)" in owner_page  # control: the principal sees the title
    page = _web(other_admin).get(reverse("search:analytics"))
    assert page.status_code == 200 and "Merger (restricted)" not in page.content.decode()
    api = _web(other_admin).get(f"{API}/analytics")
    assert api.status_code == 200
    cited = [d for d in api.json()["cited_documents"] if d["document_id"] == secret_id]
    assert cited and cited[0]["readable"] is False and cited[0]["title"] == "" and cited[0]["url"] == ""
    assert "wiki#secret" not in api.content.decode() and "Merger" not in api.content.decode()


def test_planner_view_of_the_project_counts_only_readable_rows(atkx):
    from search.services import indexed_kinds

    member = indexed_kinds(scope_for_user(atkx.member))
    admin = indexed_kinds(scope_for_user(atkx.x.admin))
    assert admin["thread"] == member["thread"] + 1 and admin["doc_section"] == member["doc_section"] + 1
    assert admin["code_file"] == member["code_file"] + 1


def test_the_answer_pipeline_never_names_a_restricted_author(atkx):
    result = ask("who knows about the walrus migration", scope_for_user(atkx.member))
    assert "who_knows" in result.plan["tools"]  # control: the people tool ran
    dumped = json.dumps(result.as_dict(), default=str)
    assert HIDDEN_AUTHOR not in dumped and "night shift" not in dumped
    admin = ask("who knows about the walrus migration", scope_for_user(atkx.x.admin))
    assert HIDDEN_AUTHOR in json.dumps(admin.as_dict(), default=str)  # control: the principal is told


def test_login_never_redirects_off_site(atkx):
    user = get_user_model().objects.create_user("atk-x-redirect", "redirect@atk-x.example", "pw-redirect-123!")
    membership_create(tenant_id=atkx.x.tenant.pk, user=user)
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example/", "http:evil.example", "javascript:x"):
        client = Client(raise_request_exception=False)
        r = client.post(f"/accounts/login/?next={target}", {"login": "atk-x-redirect", "password": "pw-redirect-123!"})
        assert r.status_code == 302, target
        assert "evil.example" not in r["Location"] and not r["Location"].startswith("javascript"), r["Location"]


def test_a_session_of_someone_who_left_the_tenant_reads_nothing(atkx):
    user = get_user_model().objects.create_user("atk-x-gone", "gone@atk-x.example", "g" * 12)
    membership_create(tenant_id=atkx.x.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=atkx.x.tenant.pk, project_id=atkx.x.project.pk)
    web = _web(user)
    assert "walrus migration runbook" in web.get(reverse("search:search"), {"q": "walrus migration"}).content.decode()
    with tenant_context(atkx.x.tenant.pk):
        Membership.objects.filter(user=user).delete()
    r = web.get(reverse("search:search"), {"q": "walrus migration"})
    assert r.status_code == 302 and "onboarding" in r["Location"]
    page = f"/documents/{atkx.source_public_id}/"
    assert web.get(page, {"id": "wiki#intro"}).status_code == 404
    assert web.get(reverse("search:ask_stream"), {"q": "walrus"}).status_code == 404
    r = web.get(f"{API}/search", {"q": "walrus migration"})
    assert r.status_code == 404 and "walrus migration runbook" not in r.content.decode()
    assert web.get(f"{API}/projects").json() == {"projects": []}
