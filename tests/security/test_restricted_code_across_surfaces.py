"""Restricted code stays restricted on every surface: the code rankers (symbol names of an asked
kind, the per-unit cap, the backtick-linked ranking), the MCP tools' inputs and tokens, and the
API/web ask surfaces, under attack. Every test asserts the safe behaviour (it passes when safe).

Tenant ``atk-5`` (owner ``atk-5-admin``, member ``atk-5-member``) holds public docs that name,
in backticks, code that is restricted to the owner, and a class whose one method is restricted.
"""

from __future__ import annotations

import json
import random
import string
import time
from dataclasses import dataclass

import anyio
import pytest
from django.core.cache import cache
from django.test import Client, override_settings

from kbportal.tenancy import tenant_context
from sources.selectors import scope_for_user
from tests.security.attack_data import CUSTOM, onboard_attack_pair

pytestmark = pytest.mark.django_db

SECRET = "tapir_secret_9931"
SECRET_WORDS = "TAPIR quokka escrow"
API = "/api/v1"


@dataclass
class A5:
    t: object  # OnboardedTenant
    other: object
    member: object
    source_id: int
    owner_token: str
    member_token: str
    service_token: str
    other_token: str
    hidden_project: object


def _rows(owner_pk: int) -> list[dict]:
    owner = [f"user:{owner_pk}"]
    return [
        {
            "external_id": "docs/vault.md#sealing",
            "kind": "doc_section",
            "title": "Vault > Sealing",
            "path": "docs/vault.md",
            "url": "https://wiki.atk-5.example/vault#sealing",
            "content": "When the vault is sealed the client raises `SealedVaultError`; call `reopen_vault()` "
            "to open it again. The `VaultClient` class wraps every call.",
        },
        {
            "external_id": "vault/errors.py#SealedVaultError",
            "kind": "code_chunk",
            "title": "vault/errors.py: SealedVaultError",
            "path": "vault/errors.py",
            "start_line": 1,
            "end_line": 3,
            "url": "vault/errors.py#L1-L3",
            "content": f'class SealedVaultError(Exception):\n    """{SECRET}: {SECRET_WORDS}."""\n',
            "metadata": {"symbol": "SealedVaultError", "symbol_kind": "class", "language": "python"},
            "principals": owner,
        },
        {
            "external_id": "vault/errors.py#reopen_vault",
            "kind": "code_chunk",
            "title": "vault/errors.py: reopen_vault",
            "path": "vault/errors.py",
            "start_line": 5,
            "end_line": 7,
            "url": "vault/errors.py#L5-L7",
            "content": f'def reopen_vault():\n    """{SECRET} reopen the sealed vault."""\n',
            "metadata": {"symbol": "reopen_vault", "symbol_kind": "function", "language": "python"},
            "principals": owner,
        },
        {
            "external_id": "vault/errors.py",
            "kind": "code_file",
            "title": "vault/errors.py",
            "path": "vault/errors.py",
            "start_line": 1,
            "end_line": 7,
            "content": f'class SealedVaultError(Exception):\n    """{SECRET}: {SECRET_WORDS}."""\n\n'
            f'def reopen_vault():\n    """{SECRET} reopen the sealed vault."""\n',
            "metadata": {"language": "python", "symbols": ["SealedVaultError", "reopen_vault"]},
            "principals": owner,
        },
        {
            "external_id": "vault/client.py#VaultClient",
            "kind": "code_chunk",
            "title": "vault/client.py: VaultClient",
            "path": "vault/client.py",
            "start_line": 1,
            "end_line": 4,
            "url": "vault/client.py#L1-L4",
            "content": 'class VaultClient:\n    """Wraps every call to the sealed vault."""\n',
            "metadata": {"symbol": "VaultClient", "symbol_kind": "class", "language": "python"},
        },
        {
            "external_id": "vault/client.py#VaultClient.seal",
            "kind": "code_chunk",
            "title": "vault/client.py: VaultClient.seal",
            "path": "vault/client.py",
            "start_line": 5,
            "end_line": 7,
            "url": "vault/client.py#L5-L7",
            "content": "    def seal(self):\n        return self._call('seal')\n",
            "metadata": {
                "symbol": "VaultClient.seal",
                "symbol_kind": "method",
                "language": "python",
                "enclosing_signature": "class VaultClient:",
            },
        },
        {
            "external_id": "vault/client.py#VaultClient.unseal_master",
            "kind": "code_chunk",
            "title": "vault/client.py: VaultClient.unseal_master",
            "path": "vault/client.py",
            "start_line": 8,
            "end_line": 10,
            "url": "vault/client.py#L8-L10",
            "content": f"    def unseal_master(self):\n        return '{SECRET}'  # {SECRET_WORDS}\n",
            "metadata": {
                "symbol": "VaultClient.unseal_master",
                "symbol_kind": "method",
                "part": 1,
                "language": "python",
                "enclosing_signature": "class VaultClient:",
            },
            "principals": owner,
        },
        {
            "external_id": "vault/client.py",
            "kind": "code_file",
            "title": "vault/client.py",
            "path": "vault/client.py",
            "start_line": 1,
            "end_line": 7,
            "content": 'class VaultClient:\n    """Wraps every call to the sealed vault."""\n\n'
            "    def seal(self):\n        return self._call('seal')\n",
            "metadata": {"language": "python", "symbols": ["VaultClient", "VaultClient.seal"]},
        },
        {
            "external_id": "slack#vault",
            "kind": "thread",
            "title": "#ops: vault sealed again",
            "url": "https://atk-5.slack.example/archives/C1/p1",
            "content": "2024-02-01 10:00 Ana: the vault is sealed again\n2024-02-01 10:02 Bo: which error?",
            "metadata": {"channel": "ops", "authors": ["Ana Public"]},
        },
    ]


@pytest.fixture(scope="module")
def a5(django_db_setup, django_db_blocker) -> A5:
    from projects.models import Project
    from projects.services import api_token_create, project_create, project_member_add

    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        t, other, member, source = onboard_attack_pair(("Atk5", "Atk5o"), ("atk-5", "atk-5o"), "Atk5 vault", _rows)
        hidden = project_create(tenant_id=t.tenant.pk, name="Atk5 hidden")
        with tenant_context(t.tenant.pk):
            Project.objects.filter(pk=hidden.pk).update(visibility=Project.Visibility.MEMBERS)
            hidden.refresh_from_db()
        project_member_add(project=hidden, user=member)
        owner_token = api_token_create(tenant=t.tenant, user=t.admin, name="a5-owner")[1]
        member_token = api_token_create(tenant=t.tenant, user=member, name="a5-member")[1]
        service_token = api_token_create(tenant=t.tenant, user=None, name="a5-svc", project=t.project)[1]
        other_token = api_token_create(tenant=other.tenant, user=other.admin, name="a5-other")[1]
    return A5(t, other, member, source.pk, owner_token, member_token, service_token, other_token, hidden)


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    cache.clear()
    yield


def _dump_hits(hits) -> str:
    return json.dumps([[h.title, h.content, h.context, h.metadata] for h in hits], default=str)


# ---------- retrieval: the rankers changed last -----------------------------------------------------

CODE_QUESTIONS = [
    "which error is raised when the vault is sealed",  # symbol_name:class + dense:class
    "which function reopens the sealed vault",  # symbol_name:function|method
    "where does the client handle a sealed vault",  # linked:code through the public doc's backticks
    "which class wraps every call to the vault",  # the per-unit cap over VaultClient's methods
    "which method unseals the vault master",
    f"which function holds {SECRET}",
]


def test_new_code_rankers_never_return_a_restricted_definition(a5):
    from search.retrieval import hybrid_search

    member, owner = scope_for_user(a5.member), scope_for_user(a5.t.admin)
    owner_saw = set()
    for question in CODE_QUESTIONS:
        hits = hybrid_search(question, member, limit=50, per_group=50).hits
        dumped = _dump_hits(hits)
        assert SECRET not in dumped and "quokka" not in dumped, question
        assert not {"SealedVaultError", "reopen_vault", "unseal_master"} & {
            str(h.metadata.get("symbol", "")).split(".")[-1] for h in hits
        }, question
        owner_saw |= {h.title for h in hybrid_search(question, owner, limit=50, per_group=50).hits}
    # control: the rankers do reach the restricted definitions for their principal
    assert {"vault/errors.py: SealedVaultError", "vault/errors.py: reopen_vault"} <= owner_saw


def test_compound_split_blowup_is_bounded(a5):
    """symbol_name_ranking passes one ``phraseto_tsquery`` per two-part split of *every* question
    lexeme (present in the scope or not) and ORs them into one tsquery that every code row with a
    symbol is matched and ranked against. A 1,900-character "which function ..." question of
    made-up 29-letter words plus one word the index holds makes ~1,400 phrases: measured on this
    PostgreSQL, about 3 ms per code row for the match alone (12 s per 2,000 rows with ts_rank)
    against 0.01 ms without them. The split list must stay bounded."""
    from django.db import connection

    from search.retrieval import hybrid_search

    rng = random.Random(5)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(29)) for _ in range(59)]
    question = "which function seals the vault " + " ".join(words)
    seen: list[int] = []

    def spy(execute, sql, params, many, context):
        if "phraseto_tsquery" in sql and isinstance(params, dict) and "compounds" in params:
            seen.append(len(params["compounds"]))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        t0 = time.perf_counter()
        hybrid_search(question, scope_for_user(a5.member), limit=10)
        elapsed = time.perf_counter() - t0
    assert seen, "symbol_name_ranking did not run (the question must be a code question)"
    assert max(seen) <= 200, f"{max(seen)} compound phrases from one question ({elapsed:.1f} s here)"


# ---------- MCP tools: odd inputs and tokens ----------------------------------------------------------

ODD_ARGUMENTS = [
    {"query": "\x00"},
    {"query": "\x00\x00 \t\n"},
    {"query": "vault\x00sealed"},
    {"query": "\ud800 vault \udfff"},
    {"query": "-vault -sealed"},
    {"query": '"'},
    {"query": "!!! &&& ||| :* <-> () '' \\\\ %s %(tenant_id)s"},
    {"query": "vault ' OR 1=1 --"},
    {"query": "ﬁ ＶＡＵＬＴ ｓｅａｌｅｄ \u202e\u200b"},
    {"query": "x" * 1000},
    {"query": "vault", "limit": "5"},
    {"query": "vault", "limit": True},
    {"query": "vault", "limit": 5.5},
    {"query": "vault", "limit": -1},
    {"query": "vault", "limit": 10**30},
    {"query": 12345},
    {"query": None},
    {"query": {"$ne": ""}},
    {"query": "vault", "project": ""},
    {"query": "vault", "project": 7},
    {"query": "vault", "project": "atk-5o"},
    {"query": "vault", "project": "everything\x00"},
    {"query": "vault", "tenant_id": 1, "user_id": 1, "principals": ["*"], "allowed_source_ids": [1, 2, 3]},
    {},
]


def _call(server, tool: str, args: dict):
    async def go():
        return await server.call_tool(tool, args)

    return anyio.run(go)


@pytest.mark.parametrize("tool", ["search", "search_code", "search_slack", "recent_prs", "who_knows"])
def test_mcp_odd_arguments_are_refused_or_answered_never_crash_or_widen(a5, tool, settings, tmp_path):
    from mcp.server.mcpserver.exceptions import ToolError

    from search.mcp_server import build_server

    settings.KB_WORKDIR = tmp_path / "work"
    server = build_server(stdio_token=a5.member_token)
    for args in ODD_ARGUMENTS:
        try:
            result = _call(server, tool, args)
        except ToolError as exc:
            assert "Traceback" not in str(exc) and "psycopg" not in str(exc).lower(), (args, str(exc))
            continue
        dumped = str(result)
        assert SECRET not in dumped and "quokka" not in dumped, args
        assert "atk-5o" not in dumped or args.get("project") == "atk-5o", args


@pytest.mark.parametrize("tool", ["search", "search_code", "who_knows"])
def test_mcp_member_and_service_tokens_never_read_restricted_code(a5, tool, settings, tmp_path):
    from search.mcp_server import evidence_for_token, experts_for_token

    settings.KB_WORKDIR = tmp_path / "work"
    for question in [*CODE_QUESTIONS, f"`{SECRET}`", f'"{SECRET}"', "SealedVaultError reopen_vault unseal_master"]:
        for token in (a5.member_token, a5.service_token):
            if tool == "who_knows":
                found = experts_for_token(token, query=question, limit=20, project=None)
            else:
                found = evidence_for_token(token, tool=tool, query=question, limit=20, project=None)
            dumped = found.model_dump_json()
            assert SECRET not in dumped and "quokka" not in dumped, (tool, question)
    if tool != "who_knows":  # control: the owner's token reads the restricted code
        found = evidence_for_token(a5.owner_token, tool=tool, query=f"`{SECRET}`", limit=20, project=None)
        assert SECRET in found.model_dump_json()


def test_mcp_and_api_refuse_a_project_the_token_owner_was_removed_from(a5, django_db_blocker):
    from mcp.server.mcpserver.exceptions import ToolError

    from projects.services import api_token_create, project_member_add, project_member_remove
    from search.mcp_server import evidence_for_token

    slug = a5.hidden_project.slug
    with django_db_blocker.unblock():
        pinned = api_token_create(tenant=a5.t.tenant, user=a5.member, name="a5-pinned", project=a5.hidden_project)[1]
    assert evidence_for_token(a5.member_token, tool="search", query="vault", limit=5, project=slug).project == slug
    assert evidence_for_token(pinned, tool="search", query="vault", limit=5, project=None).project == slug
    with django_db_blocker.unblock():
        project_member_remove(project=a5.hidden_project, user=a5.member)
    try:
        for token in (a5.member_token, pinned):
            with pytest.raises(ToolError):
                evidence_for_token(token, tool="search", query="vault", limit=5, project=slug)
            r = Client(raise_request_exception=False).get(
                f"{API}/search", {"q": "vault", "project": slug}, HTTP_AUTHORIZATION=f"Bearer {token}"
            )
            assert r.status_code in (401, 404), (token[:8], r.status_code)
        with pytest.raises(ToolError):
            evidence_for_token(pinned, tool="search", query="vault", limit=5, project=None)
        # the unpinned token still works in the projects the member may read
        assert evidence_for_token(a5.member_token, tool="search", query="vault", limit=5, project=None).project != slug
    finally:
        with django_db_blocker.unblock():
            project_member_add(project=a5.hidden_project, user=a5.member)


# ---------- API and web: the whole answer pipeline over the new rankers ---------------------------


def _bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.mark.slow
def test_api_ask_stream_search_and_who_knows_keep_restricted_code_out(a5, settings, tmp_path):
    settings.KB_WORKDIR = tmp_path / "work"
    client = Client(raise_request_exception=False)
    for question in CODE_QUESTIONS[:4]:
        for token in (a5.member_token, a5.service_token):
            body = json.dumps({"question": question})
            answer = client.post(f"{API}/ask", body, content_type="application/json", **_bearer(token))
            stream = client.post(f"{API}/ask?stream=1", body, content_type="application/json", **_bearer(token))
            search = client.get(
                f"{API}/search", {"q": question, "kind": ["code_chunk", "code_file"], "limit": 50}, **_bearer(token)
            )
            people = client.get(f"{API}/who-knows", {"q": question}, **_bearer(token))
            assert (answer.status_code, stream.status_code, search.status_code, people.status_code) == (200,) * 4
            streamed = b"".join(stream.streaming_content).decode()
            assert "event: done" in streamed and "event: failed" not in streamed
            for text in (answer.content.decode(), streamed, search.content.decode(), people.content.decode()):
                assert SECRET not in text and "quokka" not in text and "SealedVaultError(Exception)" not in text
    # control: the owner's API search finds it
    owner = client.get(f"{API}/search", {"q": CODE_QUESTIONS[0], "limit": 50}, **_bearer(a5.owner_token))
    assert SECRET in owner.content.decode()


def test_web_stream_and_pages_keep_restricted_code_out(a5, settings, tmp_path):
    from django.urls import reverse

    settings.KB_WORKDIR = tmp_path / "work"
    web = Client(raise_request_exception=False)
    web.force_login(a5.member)
    for question in CODE_QUESTIONS[:3]:
        stream = web.get(reverse("search:ask_stream"), {"q": question}, HTTP_SEC_FETCH_SITE="same-origin")
        assert stream.status_code == 200
        streamed = b"".join(stream.streaming_content).decode()
        assert "event: done" in streamed and SECRET not in streamed and "quokka" not in streamed
        for name in ("search:search", "search:people"):
            page = web.get(reverse(name), {"q": question})
            assert page.status_code == 200 and SECRET not in page.content.decode(), name
    # another tenant's project slug on the member's pages: not found, nothing of atk-5o
    r = web.get(
        reverse("search:ask_stream"), {"q": "vault", "project": "atk-5o-project"}, HTTP_SEC_FETCH_SITE="same-origin"
    )
    assert r.status_code == 404


WEIRD_CODE_QUESTIONS = [
    "which function vault a\\\\b c\\'d",
    "which function vault it's ab''cd 'vault'",
    "which function vault:* a:b !x (y | z) <-> w",
    "which function vault ŝŝŝŝŝŝŝŝ ǅǅǅǅǅǅǅǅ",
    "which function vault " + "a" * 1975,
    "which function vault " + "ab" * 985,
    "which function vault " + "é" * 1975,
    "which class vault " + " ".join(["abcdefghijklmnopqrstuvwxyz"] * 70),
]


@pytest.mark.parametrize("question", WEIRD_CODE_QUESTIONS, ids=range(len(WEIRD_CODE_QUESTIONS)))
def test_weird_code_questions_are_not_server_errors(a5, question):
    client = Client(raise_request_exception=False)
    t0 = time.perf_counter()
    r = client.get(f"{API}/search", {"q": question}, **_bearer(a5.member_token))
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200, (r.status_code, r.content[:300])
    assert elapsed < 20, elapsed


def test_a_failing_tool_does_not_hand_database_errors_to_the_asker(a5, settings, tmp_path):
    """When a tool's SQL fails (here the oversized compound tsquery above), the asker sees that the
    tool failed, not PostgreSQL's error text (which quotes the generated query)."""

    settings.KB_WORKDIR = tmp_path / "work"
    question = "which function vault " + "a" * 1975
    r = Client(raise_request_exception=False).post(
        f"{API}/ask",
        json.dumps({"question": question}),
        content_type="application/json",
        **_bearer(a5.member_token),
    )
    assert r.status_code == 200, r.status_code
    body = r.content.decode()
    at = max(body.find("tsquery"), body.find("OperationalError"))
    assert at < 0, body[max(0, at - 200) : at + 100]


def test_mcp_search_does_not_hand_database_errors_to_the_client(a5):
    from search.mcp_server import build_server

    server = build_server(stdio_token=a5.member_token)
    try:
        result = str(_call(server, "search", {"query": "which function vault " + "a" * 975}))
    except Exception as exc:  # noqa: BLE001 - a ToolError is fine, its text is checked
        result = str(exc)
    at = max(result.find("tsquery"), result.find("OperationalError"))
    assert at < 0, result[max(0, at - 200) : at + 100]
