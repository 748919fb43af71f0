"""The ``jira`` connector end to end against a loopback Jira REST API, on real PostgreSQL.

The site served by ``tests/sources/jira_server.py`` holds the real EnterpriseRAG-Bench Jira
documents (``shared/eval/erb/docs/jira``, 29 tickets), converted to the JSON Jira's
``/rest/api/2/search`` returns. The connector reaches it through ``requests``; nothing is patched.
"""

from __future__ import annotations

import base64
import csv
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model

from kbportal.tenancy import tenant_context
from projects.services import membership_create, profile_set_default_project
from search.retrieval import hybrid_search
from search.tools.people import person_key, who_knows
from sources.connectors.base import ConnectorError
from sources.connectors.jira.security import level_principal, user_principal
from sources.connectors.registry import build_connector
from sources.embeddings import get_embedder
from sources.models import Document, ExternalGroup, IngestionRun
from sources.selectors import scope_for_operator, scope_for_user
from sources.services import source_create, source_ingest, source_update_config
from tests.sources.jira_server import EMAIL, TOKEN, FakeJira, JiraWorld, user, world_from_documents

pytestmark = pytest.mark.slow  # loopback API servers; retries are waited out in real time

ISSUES = 29
TARGET = "SUP-1911"  # "Streaming stalls" for Northwind Robotics: three comments, by Ben Carter and Elliot Price


@pytest.fixture
def world(shared_dir: Path) -> JiraWorld:
    return world_from_documents(shared_dir / "eval" / "erb" / "docs" / "jira")


@pytest.fixture
def jira(world) -> Iterator[FakeJira]:
    server = FakeJira(world)
    yield server
    server.close()


@pytest.fixture
def acme(make_tenant):
    return make_tenant("acme")


def _config(server: FakeJira, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": server.base_url,
        "email": EMAIL,
        "token": TOKEN,
        "project": ["INT", "SUP"],
        "page_size": 10,
        "allow_private_network": True,  # the fake Jira listens on loopback (kbportal.netcheck)
        **extra,
    }


def _source(tenant, server: FakeJira, name: str = "ERB Jira", **extra: Any) -> int:
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="jira",
        name=name,
        config=_config(server, **extra),
        project_ids=[tenant.project.pk],
    ).pk


def _rows(tenant_id: int, source_id: int) -> dict[str, Document]:
    with tenant_context(tenant_id):
        return {d.metadata["key"]: d for d in Document.objects.filter(source_id=source_id)}


def _jira_user(world: JiraWorld, key: str, field: str) -> str:
    user = world.issues[key]["fields"][field]
    return f"{user['displayName']} <{user['emailAddress']}>"


def test_issues_become_ticket_rows_across_pages_with_comments_and_people(acme, jira, world):
    jira.embedded_comments = 2  # issues with more comments are completed through /issue/{key}/comment
    source_id = _source(acme, jira)
    get_embedder().embed(["warm up"])  # the model's load time is not ingestion throughput

    t0 = time.perf_counter()
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    elapsed = time.perf_counter() - t0
    print(
        f"\njira ingestion: {run.seen} rows in {elapsed:.2f} s = {run.seen / elapsed:.1f} rows/s "
        f"(embedding included), {len(jira.requests)} requests"
    )

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert (run.seen, run.created, run.deleted, run.skipped) == (ISSUES, ISSUES, 0, 0)
    searches = jira.log("/rest/api/2/search")
    assert [r.query["startAt"] for r in searches] == ["0", "10", "20"]
    assert searches[0].query["jql"] == "project in (INT, SUP) ORDER BY updated ASC, key ASC"
    assert all(r.query["maxResults"] == "10" and "comment" in r.query["fields"] for r in searches)
    many = sorted(k for k, i in world.issues.items() if len(i["fields"]["comment"]["comments"]) > 2)
    assert sorted(r.path.split("/")[-2] for r in jira.log("/comment")) == many

    rows = _rows(acme.tenant.pk, source_id)
    assert sorted(rows) == sorted(world.issues)
    for key, issue in world.issues.items():
        doc, fields = rows[key], issue["fields"]
        assert doc.kind == "ticket" and doc.external_id == issue["id"]
        assert doc.title == f"{key}: {fields['summary']}"
        assert doc.url == f"{jira.base_url}/browse/{key}"
        assert doc.metadata["status"] == fields["status"]["name"]
        assert doc.metadata["priority"] == fields["priority"]["name"]
        assert doc.metadata["issue_type"] == fields["issuetype"]["name"]
        assert doc.metadata["labels"] == fields["labels"]
        assert doc.metadata["reporter"] == _jira_user(world, key, "reporter")
        assert doc.updated_at == datetime.fromisoformat(fields["updated"])
        assert doc.principals == []
        # Every comment is in, the ones past the embedded two included.
        for comment in fields["comment"]["comments"]:
            assert " ".join(comment["body"].split())[:80] in doc.content
    target = rows[TARGET]
    assert target.metadata["assignee"] == _jira_user(world, TARGET, "assignee")
    assert target.metadata["commenters"] == []  # Ben Carter reported it, Elliot Price is its assignee
    # INT-1742: reported by Ava Martinez, assigned to Ravi Shah, Priya Desai (Finance) commented.
    assert rows["INT-1742"].metadata["commenters"] == ["Priya Desai <priya.desai@erb.example>"]
    assert "Elliot Price (2026-02-10 09:00): Asked for curl -N reproduction without proxy" in target.content
    assert target.content.index("Customer says it started") < target.content.index("Customer confirms proxy")
    assert "h3. Resolution" in target.content or "Resolution" in target.content

    # Retrieval finds it, and who_knows credits its people.
    scope = scope_for_operator(tenant_slug="acme")
    query = "SSE streaming stalls behind a corporate proxy, proxy_buffering"
    hits = hybrid_search(query, scope, limit=5).hits
    assert TARGET in [h.title.split(":")[0] for h in hits[:3]]
    experts = who_knows(query=query, scope=scope, limit=10)
    assert person_key("Elliot Price") in {person_key(e.name) for e in experts}


def test_second_run_is_incremental_and_re_embeds_only_what_changed(acme, jira, world):
    source_id = _source(acme, jira)
    first = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert first.status == IngestionRun.Status.SUCCEEDED and first.created == ISSUES
    newest = max(datetime.fromisoformat(i["fields"]["updated"]) for i in world.issues.values())
    window = newest - timedelta(days=1)  # the default overlap
    in_window = sorted(k for k, i in world.issues.items() if datetime.fromisoformat(i["fields"]["updated"]) >= window)

    later = newest + timedelta(hours=3)
    world.add_comment(TARGET, "Grace Hopper", "Seen again after the proxy upgrade; buffering was back on.", later)
    before = len(jira.requests)
    second = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert second.status == IngestionRun.Status.SUCCEEDED, second.error
    jql = [r.query["jql"] for r in jira.requests[before:] if r.path.endswith("/search")]
    assert jql == [f'project in (INT, SUP) AND updated >= "{window:%Y/%m/%d %H:%M}" ORDER BY updated ASC, key ASC']
    want = sorted({*in_window, TARGET})
    assert second.seen == len(want) and second.created == 0 and second.deleted == 0
    assert (second.updated, second.embedded, second.unchanged) == (1, 1, len(want) - 1)
    rows = _rows(acme.tenant.pk, source_id)
    assert len(rows) == ISSUES  # no duplicates, nothing outside the window dropped
    assert "Grace Hopper <grace.hopper@erb.example>" in rows[TARGET].metadata["commenters"]

    third = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    recent = [
        i for i in world.issues.values() if datetime.fromisoformat(i["fields"]["updated"]) >= later - timedelta(days=1)
    ]
    assert (third.seen, third.created, third.updated, third.embedded) == (len(recent), 0, 0, 0)

    # A full run removes an issue Jira no longer returns.
    gone = next(k for k in world.issues if k != TARGET)
    del world.issues[gone]
    source_update_config(tenant_id=acme.tenant.pk, source_id=source_id, config=_config(jira, incremental=False))
    full = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert full.status == IngestionRun.Status.SUCCEEDED and full.deleted == 1 and full.embedded == 0
    assert gone not in _rows(acme.tenant.pk, source_id)


def test_429_retry_after_is_honoured_and_no_page_is_dropped(acme, jira, world):
    jira.rate_limit(path_suffix="/rest/api/2/search", start_at="10", wait=1)
    jira.embedded_comments = 1
    jira.rate_limit(path_suffix=f"/issue/{TARGET}/comment", wait=1)
    source_id = _source(acme, jira)
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert len(_rows(acme.tenant.pk, source_id)) == ISSUES
    page2 = [r for r in jira.log("/search") if r.query["startAt"] == "10"]
    assert [r.status for r in page2] == [429, 200] and page2[1].at - page2[0].at >= 0.9
    comments = jira.log(f"/issue/{TARGET}/comment")
    assert [r.status for r in comments] == [429, 200] and comments[1].at - comments[0].at >= 0.9

    # A wait longer than allowed fails the run and keeps what was stored.
    source_update_config(
        tenant_id=acme.tenant.pk,
        source_id=source_id,
        config=_config(jira, incremental=False, max_rate_limit_wait_seconds=5),
    )
    jira.rate_limit(path_suffix="/rest/api/2/search", start_at="20", wait=600)
    failed = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert failed.status == IngestionRun.Status.FAILED and "rate limited (HTTP 429)" in failed.error
    assert failed.deleted == 0 and len(_rows(acme.tenant.pk, source_id)) == ISSUES


def test_a_malformed_issue_is_skipped_with_its_reason_and_the_rest_ingested(acme, jira, world):
    broken, wrong_labels = "INT-2209", "SUP-4521"
    jira.malformed[broken] = {"id": world.issues[broken]["id"], "key": broken, "fields": {"labels": []}}
    bad = dict(world.issues[wrong_labels], fields={**world.issues[wrong_labels]["fields"], "labels": "billing"})
    jira.malformed[wrong_labels] = bad
    source_id = _source(acme, jira)
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.PARTIAL
    assert sorted(run.skipped_items, key=lambda s: s["item"]) == [
        {"item": broken, "reason": "no 'fields.summary'"},
        {"item": wrong_labels, "reason": "'fields.labels' is not a list"},
    ]
    assert sorted(_rows(acme.tenant.pk, source_id)) == sorted(set(world.issues) - {broken, wrong_labels})


def test_bad_config_names_the_field(acme, jira):
    cases = {
        "base_url": {"base_url": "ftp://jira.example"},
        "project": {"project": ["not a key"]},
        "page_size": {"page_size": 0},
        "security_principals": {"security_principals": {"Finance": ["nobody"]}},
        "path": {"base_url": None, "path": "/tmp/issues.xlsx"},
        "surprise": {"surprise": 1},
    }
    for field, change in cases.items():
        with pytest.raises(ConnectorError) as caught:
            source_create(tenant_id=acme.tenant.pk, kind="jira", name=f"bad {field}", config=_config(jira, **change))
        assert f"{field}:" in str(caught.value), (field, str(caught.value))
    with pytest.raises(ConnectorError, match="base_url.*or path"):
        source_create(tenant_id=acme.tenant.pk, kind="jira", name="neither", config={"project": "SUP"})
    with pytest.raises(ConnectorError, match="email needs token"):
        source_create(
            tenant_id=acme.tenant.pk,
            kind="jira",
            name="no token",
            config={"base_url": "https://erb.atlassian.net", "email": EMAIL},
        )
    # JQL Jira refuses fails the run with Jira's own message.
    source_id = _source(acme, jira, jql="summary ~ stall")
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.FAILED
    assert "HTTP 400" in run.error and "the clause 'summary ~ stall' is not understood" in run.error


def test_credentials_never_appear_in_errors(acme, jira):
    jira.echo_credentials = True  # the 401 quotes the Authorization header it got
    wrong = "ATATT3xWRONG-wrong-token-0123456789"
    source = source_create(tenant_id=acme.tenant.pk, kind="jira", name="Wrong token", config=_config(jira, token=wrong))
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED
    assert "HTTP 401" in run.error and "You are not authenticated" in run.error and "'Basic ***'" in run.error
    basic = base64.b64encode(f"{EMAIL}:{wrong}".encode()).decode()
    with tenant_context(acme.tenant.pk):
        stored = IngestionRun.objects.get(pk=run.pk).error
    assert wrong not in stored and basic not in stored and "WRONG" not in stored
    connector = build_connector("jira", _config(jira, token=wrong))
    assert wrong not in repr(connector.config) and wrong not in str(connector.config)

    # Bearer (Server / Data Center personal access token).
    jira.auth = "bearer"
    source = source_create(
        tenant_id=acme.tenant.pk, kind="jira", name="Bearer", config=_config(jira, email=None, token=wrong)
    )
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED and "'Bearer ***'" in run.error and wrong not in run.error
    source = source_create(tenant_id=acme.tenant.pk, kind="jira", name="Bearer ok", config=_config(jira, email=None))
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).created == ISSUES


def _member(tenant, username: str, email: str | None):
    user = get_user_model().objects.create_user(username, email or "", "pw-" + username * 2)
    membership_create(tenant_id=tenant.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=tenant.tenant.pk, project_id=tenant.project.pk)
    if email:
        EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def test_security_level_restricts_an_issue_to_its_principals(acme, make_tenant, jira, world):
    secret, unmapped = "INT-1842", "SUP-9152"  # a log-retention exception; a billing overage
    world.issues[secret]["fields"]["security"] = {"id": "10100", "name": "Security team", "description": "sec"}
    world.issues[unmapped]["fields"]["security"] = {"id": "10101", "name": "Finance", "description": "fin"}
    source_id = _source(acme, jira, security_principals={"Security team": ["Hannah.Schmitt@erb.example"]})
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == IngestionRun.Status.SUCCEEDED
    rows = _rows(acme.tenant.pk, source_id)
    assert rows[secret].principals == ["email:hannah.schmitt@erb.example"]
    assert rows[secret].metadata["security_level"] == "Security team"
    # Not listed, and Jira names nobody at the level: a level principal nobody holds, closed.
    assert rows[unmapped].principals == [level_principal(jira.base_url, "10101")]
    with tenant_context(acme.tenant.pk):
        assert ExternalGroup.objects.get(source_id=source_id, principal=rows[unmapped].principals[0]).members == []

    query = "log retention exception Northstar Bank payload logging"
    hannah = _member(acme, "hannah", "hannah.schmitt@erb.example")
    other = _member(acme, "bob", "bob@erb.example")
    assert secret in [h.title.split(":")[0] for h in hybrid_search(query, scope_for_user(hannah)).hits]
    assert secret not in [h.title.split(":")[0] for h in hybrid_search(query, scope_for_user(other)).hits]
    billing = "inference billing overage march"
    for person in (hannah, other):
        assert all(
            h.external_id != rows[unmapped].external_id for h in hybrid_search(billing, scope_for_user(person)).hits
        )
    # Another tenant sees none of the source's rows.
    globex = make_tenant("globex")
    with tenant_context(globex.tenant.pk):
        assert Document.objects.filter(source_id=source_id).count() == 0


def _unverified(tenant, username: str, email: str):
    user = _member(tenant, username, None)
    EmailAddress.objects.create(user=user, email=email, verified=False, primary=True)
    return user


def test_security_level_members_read_from_jira_reach_exactly_those_people(acme, jira, world):
    secret = "INT-1842"  # a log-retention exception
    world.issues[secret]["fields"]["security"] = {"id": "10200", "name": "Responders", "description": "r"}
    reporter = world.issues[secret]["fields"]["reporter"]
    hannah, bob, carol = (user(n) for n in ("Hannah Schmitt", "Bob Stone", "Carol Diaz"))
    assert hannah and bob and carol and reporter
    world.level_holders["10200"] = [
        {"type": "user", "parameter": hannah["accountId"], "user": hannah},
        {"type": "group", "parameter": "sre-oncall", "group": {"name": "sre-oncall"}},
        {"type": "projectRole", "parameter": "10002"},
        {"type": "reporter"},
        {"type": "anyone"},  # names no list of people: admits nobody
    ]
    world.groups["sre-oncall"] = [bob]
    # A role's user actors come with an account id only; Carol's address is known from the group.
    world.roles[("INT", "10002")] = [
        {
            "id": 1,
            "type": "atlassian-user-role-actor",
            "displayName": "Carol Diaz",
            "actorUser": {"accountId": carol["accountId"]},
        },
        {
            "id": 2,
            "type": "atlassian-group-role-actor",
            "name": "incident-leads",
            "actorGroup": {"name": "incident-leads", "displayName": "incident-leads"},
        },
    ]
    world.groups["incident-leads"] = [carol]
    source_id = _source(acme, jira)
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.PARTIAL, run.error
    assert [s["item"] for s in run.skipped_items] == ["security level Responders"]
    assert "'anyone'" in run.skipped_items[0]["reason"]
    # One principal for the level (per project: it names a project role), one for the reporter.
    level = level_principal(jira.base_url, "10200", "INT")
    row = _rows(acme.tenant.pk, source_id)[secret]
    assert row.principals == sorted([level, f"jira:{reporter['accountId']}"])
    with tenant_context(acme.tenant.pk):
        stored = ExternalGroup.objects.get(source_id=source_id, principal=level).members
    assert sorted(stored) == sorted(f"jira:{u['accountId']}" for u in (hannah, bob, carol))

    query = "log retention exception Northstar Bank payload logging"
    readers = {
        "hannah": _member(acme, "hannah", hannah["emailAddress"]),  # named as a user
        "bob": _member(acme, "bob", bob["emailAddress"]),  # in a group the level names
        "carol": _member(acme, "carol", carol["emailAddress"]),  # in the project role
        "reporter": _member(acme, "rep", reporter["emailAddress"]),  # the issue's reporter
    }
    outsiders = {
        "dave": _member(acme, "dave", "dave@erb.example"),
        "claims hannah's address unverified": _unverified(acme, "mallory", hannah["emailAddress"]),
    }

    def sees(person) -> bool:
        return secret in [h.title.split(":")[0] for h in hybrid_search(query, scope_for_user(person)).hits]

    assert {name: sees(p) for name, p in readers.items()} == dict.fromkeys(readers, True)
    assert {name: sees(p) for name, p in outsiders.items()} == dict.fromkeys(outsiders, False)

    # Bob leaves the group: the next run, an incremental one that re-reads no issue, takes his
    # access away; so does Hannah's removal from the level.
    world.groups["sre-oncall"] = []
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.created == run.updated == 0  # no issue changed
    assert not sees(readers["bob"]) and sees(readers["hannah"]) and sees(readers["carol"])
    world.level_holders["10200"] = world.level_holders["10200"][1:]
    source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert not sees(readers["hannah"]) and sees(readers["carol"])

    # A credential Jira will not show level members to: the issue closes, and the run says why.
    world.admin = False
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert "Administer Jira" in run.skipped_items[0]["reason"]
    assert not any(sees(p) for p in readers.values() if p is not readers["reporter"])
    # ... and a full run stores it as a level with nobody in it (the reporter is named per issue).
    source_update_config(tenant_id=acme.tenant.pk, source_id=source_id, config=_config(jira, incremental=False))
    source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert _rows(acme.tenant.pk, source_id)[secret].principals == [level_principal(jira.base_url, "10200")]
    assert not any(sees(p) for p in readers.values())


def _csv_export(world: JiraWorld, path: Path) -> None:
    """The issues as Jira's "Export CSV (all fields)" writes them: repeated Labels and Comment columns."""
    issues = list(world.issues.values())
    labels = max(len(i["fields"]["labels"]) for i in issues)
    comments = max(len(i["fields"]["comment"]["comments"]) for i in issues)
    header = [
        "Summary",
        "Issue key",
        "Issue id",
        "Issue Type",
        "Status",
        "Project key",
        "Project name",
        "Priority",
        "Assignee",
        "Reporter",
        "Created",
        "Updated",
        "Description",
        "Environment",
        "Security Level",
    ]
    header += ["Labels"] * labels + ["Comment"] * comments

    def when(value: str) -> str:
        return datetime.fromisoformat(value).astimezone(UTC).strftime("%d/%b/%y %-I:%M %p")

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for issue in issues:
            f = issue["fields"]
            cells = [
                f["summary"],
                issue["key"],
                issue["id"],
                f["issuetype"]["name"],
                f["status"]["name"],
                f["project"]["key"],
                f["project"]["name"],
                f["priority"]["name"],
                (f["assignee"] or {}).get("displayName", ""),
                f["reporter"]["displayName"],
                when(f["created"]),
                when(f["updated"]),
                f["description"],
                f["environment"] or "",
                "",
            ]
            cells += (f["labels"] + [""] * labels)[:labels]
            notes = [f"{when(c['created'])};{c['author']['accountId']};{c['body']}" for c in f["comment"]["comments"]]
            writer.writerow(cells + (notes + [""] * comments)[:comments])
        writer.writerow(["", "SUP-999", "99999"] + [""] * (len(header) - 3))  # no summary


def test_csv_export_is_read_as_the_same_tickets(acme, world, tmp_path):
    export = tmp_path / "jira-export.csv"
    _csv_export(world, export)
    source = source_create(
        tenant_id=acme.tenant.pk,
        kind="jira",
        name="CSV",
        project_ids=[acme.project.pk],
        config={"path": str(export), "base_url": "https://erb.atlassian.net", "allow_private_network": True},
    )  # no DNS in the test sandbox
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.PARTIAL and run.created == ISSUES
    line = 1 + next(n for n, text in enumerate(export.read_text().splitlines()) if ",SUP-999," in text)
    assert run.skipped_items == [{"item": "SUP-999", "reason": f"line {line}: no 'Summary'"}]
    rows = _rows(acme.tenant.pk, source.pk)
    assert sorted(rows) == sorted(world.issues)
    target, fields = rows[TARGET], world.issues[TARGET]["fields"]
    assert (
        target.url == f"https://erb.atlassian.net/browse/{TARGET}" and target.external_id == world.issues[TARGET]["id"]
    )
    assert target.metadata["labels"] == fields["labels"] and target.metadata["reporter"] == "Ben Carter"
    assert target.updated_at == datetime.fromisoformat(fields["updated"])
    first = fields["comment"]["comments"][0]
    assert f"({first['created'][:10]} {first['created'][11:16]}): Customer says it started" in target.content
    # A CSV comment names its author by account id, as Jira Cloud's export does.
    assert target.metadata["commenters"] == list(
        dict.fromkeys(c["author"]["accountId"] for c in fields["comment"]["comments"])
    )
    second = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert (second.created, second.updated, second.embedded, second.unchanged) == (0, 0, 0, ISSUES)
    missing = source_create(
        tenant_id=acme.tenant.pk, kind="jira", name="gone", config={"path": str(tmp_path / "x.csv")}
    )
    failed = source_ingest(tenant_id=acme.tenant.pk, source_id=missing.pk)
    assert failed.status == IngestionRun.Status.FAILED and "x.csv does not exist" in failed.error


def test_a_look_alike_address_never_folds_into_another_persons_principal():
    # U+212A KELVIN SIGN lower-cases to "k" in Python; addresses fold ASCII letters only.
    from sources.connectors.base import Directory
    from sources.connectors.confluence.rows import user_principal as confluence_principal

    directory = Directory()
    assert user_principal({"emailAddress": "\u212aim@Corp.test"}, directory) == "email:\u212aim@corp.test"
    assert user_principal({"accountId": "a1", "emailAddress": "\u212aim@corp.test"}, directory) == "jira:a1"
    assert "email:kim@corp.test" not in directory.people
    assert directory.people["jira:a1"].email == "\u212aim@corp.test"
    assert confluence_principal({"email": "\u212aIM@corp.test"}) == "email:\u212aim@corp.test"
