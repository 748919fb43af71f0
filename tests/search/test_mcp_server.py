"""The MCP server, end to end through the official SDK's clients.

``manage.py mcp_serve`` runs as a subprocess against this run's test database (the committed
``kb`` knowledge base of tests/search/conftest.py: tenants Acme and Globex), over stdio and over
streamable HTTP on a free loopback port. Tokens are committed too, so the subprocess sees them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import anyio
import httpx2
import pytest
from django.db import connections
from django.utils import timezone
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from kbportal.tenancy import tenant_context
from projects.models import ApiToken
from projects.services import api_token_create, api_token_revoke, project_create
from tests.conftest import subprocess_database_env

pytestmark = pytest.mark.slow  # starts MCP server processes

ROOT = Path(__file__).resolve().parents[2]
TOOL_NAMES = {"search", "search_slack", "search_code", "recent_prs", "who_knows"}
CALL_TIMEOUT = 180  # seconds; the first search in a fresh process loads the embedding model


@dataclass
class Tokens:
    acme_admin: str
    acme_member: str
    acme_service: str
    globex_admin: str
    revoked: str
    expired: str
    forged: str


@pytest.fixture(scope="module")
def server_env(kb) -> dict[str, str]:
    """Environment for ``manage.py`` subprocesses: this run's test database, app role and owner."""
    env = subprocess_database_env()
    env.pop("KB_API_TOKEN", None)
    return env


@pytest.fixture(scope="module")
def tokens(kb, django_db_blocker) -> Tokens:
    with django_db_blocker.unblock():
        acme, globex = kb.acme, kb.globex
        acme_admin = api_token_create(tenant=acme.tenant, user=acme.admin, name="mcp-admin")[1]
        acme_member = api_token_create(tenant=acme.tenant, user=kb.acme_member, name="mcp-member")[1]
        acme_service = api_token_create(tenant=acme.tenant, user=None, name="mcp-bot", project=acme.project)[1]
        globex_admin = api_token_create(tenant=globex.tenant, user=globex.admin, name="mcp-globex")[1]
        revoked_row, revoked = api_token_create(tenant=acme.tenant, user=acme.admin, name="mcp-revoked")
        api_token_revoke(token=revoked_row)
        expired_row, expired = api_token_create(tenant=acme.tenant, user=acme.admin, name="mcp-expired")
        with tenant_context(acme.tenant.pk):
            ApiToken.objects.filter(pk=expired_row.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    forged = acme_admin[:-4] + ("AAAA" if not acme_admin.endswith("AAAA") else "BBBB")
    return Tokens(acme_admin, acme_member, acme_service, globex_admin, revoked, expired, forged)


def _revoke_in_thread(row: ApiToken) -> None:
    try:
        api_token_revoke(token=row)
    finally:
        connections.close_all()  # this worker thread's connection, or the test database cannot be dropped


def _structured(result) -> dict:
    assert not result.is_error, result.content
    assert result.structured_content == json.loads(result.content[0].text)
    return result.structured_content


def _error_text(result) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


# ---------- stdio --------------------------------------------------------------------------------


def test_stdio_lists_tools_searches_and_refuses_a_token_revoked_mid_session(kb, tokens, server_env, django_db_blocker):
    with django_db_blocker.unblock():
        row, raw = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="mcp-stdio")
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "mcp_serve", "--transport", "stdio"],
        env={**server_env, "KB_API_TOKEN": raw},
        cwd=str(ROOT),
    )
    outcome: dict = {}

    async def scenario():
        with tempfile.TemporaryFile("w+") as errlog, anyio.fail_after(CALL_TIMEOUT):
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                outcome["tools"] = {t.name: t for t in listed.tools}
                outcome["search"] = await session.call_tool("search", {"query": "how do I deploy the billing service"})
                outcome["code"] = await session.call_tool(
                    "search_code", {"query": "backoff for failed invoice webhooks"}
                )
                outcome["too_many"] = await session.call_tool("search", {"query": "deploy", "limit": 50})
                with django_db_blocker.unblock():
                    await anyio.to_thread.run_sync(_revoke_in_thread, row)
                outcome["after_revoke"] = await session.call_tool("search", {"query": "deploy the billing service"})

    anyio.run(scenario)
    assert set(outcome["tools"]) == TOOL_NAMES
    limit_schema = outcome["tools"]["search"].input_schema["properties"]["limit"]
    assert (limit_schema["minimum"], limit_schema["maximum"], limit_schema["default"]) == (1, 20, 10)
    assert outcome["tools"]["search"].input_schema["required"] == ["query"]

    found = _structured(outcome["search"])
    assert found["project"] == kb.acme.project.slug
    first = found["results"][0]
    assert first["n"] == 1 and first["title"] == "Runbook > Deploying the billing service"
    assert first["link"] == "https://wiki.acme.example/runbook#deploy" and "make release" in first["text"]
    assert set(first) >= {"kind", "url", "location", "path", "start_line", "end_line", "score", "updated_at"}
    assert [r["n"] for r in found["results"]] == list(range(1, len(found["results"]) + 1))
    assert not any("Globex" in r["title"] or "zebra" in r["text"] for r in found["results"])

    code = _structured(outcome["code"])["results"]
    assert code and {r["kind"] for r in code} <= {"code_chunk", "code_file"}
    assert code[0]["location"] == "billing/retry.py:10-24" and code[0]["start_line"] == 10

    assert "limit" in _error_text(outcome["too_many"])
    assert "revoked" in _error_text(outcome["after_revoke"])
    with django_db_blocker.unblock(), tenant_context(kb.acme.tenant.pk):
        assert ApiToken.objects.get(pk=row.pk).last_used_at is not None


@pytest.mark.parametrize("which", ["forged", "revoked", "expired"])
def test_stdio_refuses_to_start_with_a_bad_token(tokens, server_env, which):
    raw = getattr(tokens, which)
    reason = {"forged": "unknown API token", "revoked": "was revoked", "expired": "expired"}[which]
    proc = subprocess.run(
        [sys.executable, "manage.py", "mcp_serve", "--transport", "stdio"],
        cwd=ROOT,
        env={**server_env, "KB_API_TOKEN": raw},
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "KB_API_TOKEN refused" in proc.stderr and reason in proc.stderr
    assert proc.stdout == ""


# ---------- streamable HTTP ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server(server_env, tokens):
    """``manage.py mcp_serve --transport http`` on a free loopback port; yields the endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "mcp_serve", "--transport", "http", "--port", str(port)],
        cwd=ROOT,
        env=server_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"mcp_serve exited with {proc.returncode}: {log.read()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("mcp_serve did not listen within 120 s")
            time.sleep(0.3)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@asynccontextmanager
async def _session(url: str, token: str, statuses: list[int] | None = None):
    """An initialized MCP client session over streamable HTTP; ``statuses`` collects HTTP status codes."""

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(30, read=CALL_TIMEOUT)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks={"response": [record]}) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def _http_calls(url: str, token: str, calls: list[tuple[str, dict]]) -> list:
    """Open one MCP session with ``token`` and make ``calls``; returns their ``CallToolResult``s."""

    async def scenario():
        results = []
        with anyio.fail_after(CALL_TIMEOUT):
            async with _session(url, token) as session:
                for name, arguments in calls:
                    results.append(await session.call_tool(name, arguments))
        return results

    return anyio.run(scenario)


def test_http_search_with_a_bearer_token_reads_its_tenant_and_its_users_principals(kb, tokens, http_server):
    admin_search, admin_private = _http_calls(
        http_server,
        tokens.acme_admin,
        [("search", {"query": "invoices stuck in pending", "limit": 3}), ("search", {"query": kb.private_marker})],
    )
    rows = _structured(admin_search)["results"]
    assert 1 <= len(rows) <= 3
    assert rows[0]["title"] == "#billing: invoices stuck in pending" and rows[0]["kind"] == "thread"
    assert any(kb.private_marker in r["text"] for r in _structured(admin_private)["results"])
    # The member's token reads the same project but never the admin-only page.
    (member_private,) = _http_calls(http_server, tokens.acme_member, [("search", {"query": kb.private_marker})])
    assert not any(kb.private_marker in r["text"] for r in _structured(member_private)["results"])
    # A service token speaks for no user: restricted rows stay hidden from it too.
    (bot_private,) = _http_calls(http_server, tokens.acme_service, [("search", {"query": kb.private_marker})])
    assert not any(kb.private_marker in r["text"] for r in _structured(bot_private)["results"])


def test_http_token_of_tenant_b_gets_nothing_of_tenant_a(kb, tokens, http_server):
    questions = ["how do I deploy the billing service", "invoices stuck in pending reconciliation", kb.private_marker]
    calls = [(tool, {"query": q, "limit": 20}) for q in questions for tool in ("search", "search_slack", "recent_prs")]
    # Tenant A's project slug, named by tenant B's token, resolves inside B (both are "everything").
    calls.append(("search", {"query": "deploy the billing service", "project": kb.acme.project.slug}))
    calls.append(("who_knows", {"query": "invoices stuck in pending"}))
    results = _http_calls(http_server, tokens.globex_admin, calls)
    dumped = json.dumps([_structured(r) for r in results])
    for acme_text in ("acme.example", "Runbook", "reconcile", "Dana", kb.private_marker):
        assert acme_text not in dumped, acme_text
    assert _structured(results[0])["results"][0]["title"] == "Deploying the billing service at Globex"


def test_http_refuses_missing_forged_revoked_and_expired_tokens_with_401(tokens, http_server):
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    bad = {
        "missing": None,
        "malformed": "not-a-token",
        "forged": tokens.forged,
        "revoked": tokens.revoked,
        "expired": tokens.expired,
    }
    for label, token in bad.items():
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx2.post(http_server, json=initialize, headers={**headers, **auth}, timeout=60)
        assert response.status_code == 401, label
        assert response.json()["error"] == "invalid_token", label
    good = httpx2.post(
        http_server, json=initialize, headers={**headers, "Authorization": f"Bearer {tokens.acme_admin}"}, timeout=60
    )
    assert good.status_code == 200

    # Through the SDK's client the session never opens: initialize fails on the 401.
    statuses: list[int] = []

    async def scenario():
        async with _session(http_server, tokens.revoked, statuses):
            pass

    with pytest.raises(ExceptionGroup) as exc:
        anyio.run(scenario)
    assert statuses == [401]
    assert exc.group_contains(MCPError, match="error response", depth=2)


def test_http_token_revoked_mid_session_is_refused_on_the_next_request(kb, tokens, http_server, django_db_blocker):
    with django_db_blocker.unblock():
        row, raw = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="mcp-http-revoke")
    outcome: dict = {}
    statuses: list[int] = []

    async def scenario():
        with anyio.fail_after(CALL_TIMEOUT):
            async with _session(http_server, raw, statuses) as session:
                outcome["before"] = await session.call_tool("search", {"query": "deploy the billing service"})
                with django_db_blocker.unblock():
                    await anyio.to_thread.run_sync(_revoke_in_thread, row)
                outcome["statuses_before_revoke"] = list(statuses)
                await session.call_tool("search", {"query": "deploy the billing service"})

    with pytest.raises(ExceptionGroup) as exc:
        anyio.run(scenario)
    assert _structured(outcome["before"])["results"]
    assert outcome["statuses_before_revoke"] and set(outcome["statuses_before_revoke"]) <= {200, 202}
    assert 401 in statuses[len(outcome["statuses_before_revoke"]) :]
    assert exc.group_contains(MCPError, match="error response", depth=2)


def test_http_project_argument_is_checked_against_the_token(kb, tokens, http_server, django_db_blocker):
    with django_db_blocker.unblock():
        other = project_create(tenant_id=kb.acme.tenant.pk, name="MCP empty project")
    unknown, switched, other_result = _http_calls(
        http_server,
        tokens.acme_admin,
        [
            ("search", {"query": "deploy", "project": "no-such-project"}),
            ("search", {"query": "deploy", "project": kb.acme.project.slug}),
            ("search", {"query": "deploy the billing service", "project": other.slug}),
        ],
    )
    assert "no project 'no-such-project'" in _error_text(unknown)
    assert _structured(switched)["project"] == kb.acme.project.slug
    assert _structured(other_result) == {"project": other.slug, "results": []}  # no sources attached
    # The service token is pinned to its project.
    (pinned,) = _http_calls(http_server, tokens.acme_service, [("search", {"query": "deploy", "project": other.slug})])
    assert "limited to project" in _error_text(pinned)
    # Tenant B's token naming a project that exists only in tenant A: not found, nothing read.
    (foreign,) = _http_calls(http_server, tokens.globex_admin, [("search", {"query": "deploy", "project": other.slug})])
    assert f"no project '{other.slug}'" in _error_text(foreign)


def test_http_who_knows_names_the_people_behind_the_best_evidence(kb, tokens, http_server):
    (result,) = _http_calls(
        http_server, tokens.acme_admin, [("who_knows", {"query": "invoices stuck in pending webhook", "limit": 5})]
    )
    data = _structured(result)
    names = [e["name"] for e in data["experts"]]
    assert {"Dana", "Lee"} <= set(names)
    dana = next(e for e in data["experts"] if e["name"] == "Dana")
    assert dana["score"] > 0
    assert dana["documents"][0]["title"] == "#billing: invoices stuck in pending"
    assert dana["documents"][0]["link"].startswith("https://acme.slack.com/")


def test_mcp_searches_and_who_knows_write_audit_events_with_the_tokens_prefix(
    kb, tokens, http_server, django_db_blocker
):
    """As on the web page and the API, every MCP tool call that searched leaves one ``search``
    audit event in the token's tenant, naming the tool, the query, the documents returned and the
    token that asked."""
    from kbportal.models import AuditEvent
    from projects.selectors import api_token_parse

    query = "invoices stuck in pending audit trail"
    search, experts = _http_calls(
        http_server, tokens.acme_admin, [("search_slack", {"query": query}), ("who_knows", {"query": query})]
    )
    hits = _structured(search)["results"]
    people = [e["name"] for e in _structured(experts)["experts"]]
    with django_db_blocker.unblock(), tenant_context(kb.acme.tenant.pk):
        events = list(AuditEvent.objects.filter(action="search", data__query=query).order_by("id"))
    assert [e.data["tool"] for e in events] == ["search_slack", "who_knows"]
    assert {e.actor_token_prefix for e in events} == {api_token_parse(tokens.acme_admin)[0]}
    assert {e.actor_id for e in events} == {kb.acme.admin.pk}
    assert events[0].data["count"] == len(hits) == len(events[0].data["hits"]) and hits
    assert events[1].data["people"] == people and people
    with django_db_blocker.unblock(), tenant_context(kb.globex.tenant.pk):
        assert not AuditEvent.objects.filter(action="search", data__query=query).exists()
