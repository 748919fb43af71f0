"""The ``github`` connector end to end against a loopback GitHub REST API, on real PostgreSQL.

The repository served by ``tests/sources/github_server.py`` is built from the real FastAPI
commit log (``shared/corpora/fastapi-commits.jsonl``): its first 30 commits with a PR number
become merged pull requests (with reviews, review comments and comments), plus five issues.
The connector reaches it through ``requests`` with a GitHub Enterprise style base URL
(``.../api/v3``); nothing is patched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kbportal.tenancy import tenant_context
from search.tools.people import person_key, who_knows
from search.tools.search import recent_prs
from sources.connectors.registry import build_connector
from sources.models import Document, IngestionRun
from sources.selectors import scope_for_operator
from sources.services import source_create, source_ingest, source_update_config
from tests.sources.github_server import TOKEN, FakeGitHub, iso, world_from_commits

pytestmark = pytest.mark.slow  # loopback API servers; retries are waited out in real time

PRS = 30
ISSUES = 5
TARGET_PR = 16043  # ray.york.755's only PR among the 30: "Fix `exclude_defaults` not propagated ..."


@pytest.fixture(scope="module")
def commits(shared_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (shared_dir / "corpora" / "fastapi-commits.jsonl").read_text().splitlines()]
    return [c for c in rows if c.get("pr_number")][:PRS]


@pytest.fixture
def github(commits) -> Iterator[FakeGitHub]:
    server = FakeGitHub(world_from_commits(commits))
    yield server
    server.close()


@pytest.fixture
def acme(make_tenant):
    return make_tenant("acme")


def _config(server: FakeGitHub, **extra: Any) -> dict[str, Any]:
    return {
        "owner": "fastapi",
        "repo": "fastapi",
        "token": TOKEN,
        "base_url": server.base_url,
        "allow_private_network": True,  # the fake GitHub listens on loopback (kbportal.netcheck)
        "page_size": 10,
        **extra,
    }


def _source(tenant, server: FakeGitHub, name: str = "FastAPI GitHub", **extra: Any) -> int:
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="github",
        name=name,
        config=_config(server, **extra),
        project_ids=[tenant.project.pk],
    ).pk


def _rows(tenant_id: int, source_id: int) -> dict[str, Document]:
    with tenant_context(tenant_id):
        return {d.external_id: d for d in Document.objects.filter(source_id=source_id)}


def test_issues_and_prs_become_rows_with_people_across_pages(acme, github, commits):
    world = github.world
    first = int(commits[0]["pr_number"])
    start = datetime.fromisoformat(commits[0]["authored_at"]) - timedelta(hours=12)
    for k in range(12):  # two pages of comments at page_size 10
        world.comment(
            first, author=commits[6]["author"], body=f"Checked on CI run {k}.", when=start + timedelta(minutes=k)
        )
    source_id = _source(acme, github)

    t0 = time.perf_counter()
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    elapsed = time.perf_counter() - t0
    print(
        f"\ngithub ingestion: {run.seen} rows in {elapsed:.2f} s = {run.seen / elapsed:.1f} rows/s "
        f"(embedding included), {len(github.requests)} requests"
    )

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert (run.seen, run.created, run.deleted) == (PRS + ISSUES, PRS + ISSUES, 0)
    rows = _rows(acme.tenant.pk, source_id)
    assert sorted(d.kind for d in rows.values()).count("pr") == PRS
    assert sorted(d.kind for d in rows.values()).count("ticket") == ISSUES
    # Four pages of issues (35 at 10 a page), each asked once, following Link headers.
    pages = [r.query.get("page", "1") for r in github.log("/repos/fastapi/fastapi/issues")]
    assert pages == ["1", "2", "3", "4"]
    assert all(r.query["state"] == "all" and "since" not in r.query for r in github.log("/issues"))

    for commit in commits:
        number = int(commit["pr_number"])
        doc = rows[f"fastapi/fastapi#{number}"]
        item = world.issues[number]
        assert doc.kind == "pr"
        assert doc.metadata["pr_number"] == number and doc.metadata["number"] == number
        assert doc.metadata["author"] == commit["author"]
        assert doc.metadata["state"] == "closed"
        assert doc.metadata["merged_at"] == item["pull_request"]["merged_at"]
        assert doc.url == f"https://github.com/fastapi/fastapi/pull/{number}"
        assert doc.updated_at == datetime.fromisoformat(item["updated_at"])
        want_reviewers = sorted({r["user"]["login"] for r in world.reviews[number]} - {commit["author"]})
        assert sorted(doc.metadata["reviewers"]) == want_reviewers
        want_commenters = {c["user"]["login"] for c in world.comments[number] + world.review_comments[number]}
        assert sorted(doc.metadata["commenters"]) == sorted(want_commenters - {commit["author"]})
        assert doc.content.startswith(item["title"])
    reviewed = rows[f"fastapi/fastapi#{commits[6]['pr_number']}"]  # quin.irwin.664's PR, reviewed by oz.ennis.988
    assert reviewed.metadata["reviewers"] == [commits[7]["author"]] != [commits[6]["author"]]
    assert f"{commits[7]['author']} (" in reviewed.content and "): approved: LGTM, thanks!" in reviewed.content
    assert "): on fastapi/" in reviewed.content and "Could this use a test?" in reviewed.content
    # Both pages of the busy PR's comments are in, in time order.
    busy = rows[f"fastapi/fastapi#{first}"]
    assert [f"Checked on CI run {k}." in busy.content for k in range(12)] == [True] * 12
    assert busy.content.index("CI run 0.") < busy.content.index("CI run 11.")
    assert [r.query.get("page", "1") for r in github.log(f"/issues/{first}/comments")] == ["1", "2"]

    issue = rows[f"fastapi/fastapi#{max(world.issues) - ISSUES + 1}"]
    assert issue.kind == "ticket" and "pr_number" not in issue.metadata
    assert issue.metadata["type"] == "issue" and issue.metadata["labels"] == ["bug"]
    assert issue.metadata["assignees"] == [commits[0]["author"]]
    assert "github-actions[bot]" in issue.metadata["commenters"]
    assert issue.url.endswith(f"/issues/{issue.metadata['number']}")
    assert "I can reproduce this on 0.141." in issue.content


def test_incremental_run_fetches_only_updated_items_and_keeps_the_rest(acme, github, commits):
    world = github.world
    source_id = _source(acme, github)
    first = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert first.status == IngestionRun.Status.SUCCEEDED and first.created == PRS + ISSUES
    newest = max(i["updated_at"] for i in world.issues.values())

    later = datetime.fromisoformat(newest) + timedelta(days=2)
    world.comment(TARGET_PR, author="ada.lovelace", body="This broke `exclude_unset` for us, see #99.", when=later)
    new_number = max(world.issues) + 1
    world.add_item(
        number=new_number,
        title="Crash with `exclude_defaults` on nested dicts",
        body="Traceback...",
        author="grace.hopper",
        created=later,
        updated=later,
        pull=False,
    )
    before = len(github.requests)

    second = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert second.status == IngestionRun.Status.SUCCEEDED, second.error
    issue_calls = [r for r in github.requests[before:] if r.path.endswith("/repos/fastapi/fastapi/issues")]
    assert [r.query.get("since") for r in issue_calls] == [newest]  # the cursor: newest stored updated_at
    # Only the two items updated at/after the cursor come back (plus the one at the cursor itself).
    assert second.seen == 3 and second.created == 1 and second.updated == 1 and second.deleted == 0
    rows = _rows(acme.tenant.pk, source_id)
    assert len(rows) == PRS + ISSUES + 1
    target = rows[f"fastapi/fastapi#{TARGET_PR}"]
    assert "ada.lovelace (" in target.content and "ada.lovelace" in target.metadata["commenters"]
    assert target.updated_at == later.replace(microsecond=0)
    assert rows[f"fastapi/fastapi#{new_number}"].metadata["author"] == "grace.hopper"

    # A configured ``since`` on a new source: only what was updated since then, nothing else.
    since = datetime.fromisoformat(newest) + timedelta(days=1)
    other = _source(acme, github, name="FastAPI since", since=iso(since))
    third = source_ingest(tenant_id=acme.tenant.pk, source_id=other)
    assert third.status == IngestionRun.Status.SUCCEEDED
    assert sorted(_rows(acme.tenant.pk, other)) == sorted(
        [f"fastapi/fastapi#{TARGET_PR}", f"fastapi/fastapi#{new_number}"]
    )

    # With incremental off, a run is full again and deletes what GitHub no longer lists.
    del world.issues[new_number]
    source_update_config(tenant_id=acme.tenant.pk, source_id=source_id, config=_config(github, incremental=False))
    full = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert full.status == IngestionRun.Status.SUCCEEDED and full.deleted == 1 and full.seen == PRS + ISSUES
    assert f"fastapi/fastapi#{new_number}" not in _rows(acme.tenant.pk, source_id)


def test_rate_limits_are_waited_out_and_no_page_is_dropped(acme, github, commits):
    github.rate_limit(path_suffix="/repos/fastapi/fastapi/issues", page="2", status=403, wait=1)
    reviewed = int(commits[6]["pr_number"])  # has a review by commits[7]'s author
    github.rate_limit(path_suffix=f"/pulls/{reviewed}/reviews", status=429, wait=1)
    source_id = _source(acme, github)

    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert run.seen == PRS + ISSUES and len(_rows(acme.tenant.pk, source_id)) == PRS + ISSUES
    page2 = [r for r in github.log("/repos/fastapi/fastapi/issues") if r.query.get("page") == "2"]
    assert [r.status for r in page2] == [403, 200]
    assert page2[1].at - page2[0].at >= 0.9  # waited for X-RateLimit-Reset, not retried at once
    reviews = github.log(f"/pulls/{reviewed}/reviews")
    assert [r.status for r in reviews] == [429, 200] and reviews[1].at - reviews[0].at >= 0.9
    assert _rows(acme.tenant.pk, source_id)[f"fastapi/fastapi#{reviewed}"].metadata["reviewers"] == [
        commits[7]["author"]
    ]

    # A reset further away than allowed fails the run; the rows already stored stay.
    config = _config(github, incremental=False, max_rate_limit_wait_seconds=5)
    source_update_config(tenant_id=acme.tenant.pk, source_id=source_id, config=config)
    github.rate_limit(path_suffix="/repos/fastapi/fastapi/issues", page="3", status=403, wait=600)
    failed = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert failed.status == IngestionRun.Status.FAILED
    assert "rate limited (HTTP 403)" in failed.error and failed.deleted == 0
    assert len(_rows(acme.tenant.pk, source_id)) == PRS + ISSUES


def test_token_never_appears_in_errors_or_the_run(acme, github):
    wrong = "ghp_WRONGwrongWRONG0123456789abcdef"
    github.echo_credentials = True  # the 401 quotes the Authorization header it got
    source = source_create(
        tenant_id=acme.tenant.pk, kind="github", name="Wrong token", config={**_config(github), "token": wrong}
    )
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED
    assert "HTTP 401" in run.error and "Bad credentials" in run.error and "'Bearer ***'" in run.error
    with tenant_context(acme.tenant.pk):
        stored = IngestionRun.objects.get(pk=run.pk).error
    assert wrong not in stored and "WRONGwrong" not in stored
    connector = build_connector("github", {**_config(github), "token": wrong})
    assert wrong not in repr(connector.config) and wrong not in str(connector.config)


def test_other_tenant_sees_none_and_tools_find_the_pr_and_its_author(acme, make_tenant, github, commits):
    globex = make_tenant("globex")
    source_id = _source(acme, github)
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.SUCCEEDED
    with tenant_context(globex.tenant.pk):
        assert Document.objects.filter(source_id=source_id).count() == 0
        assert Document.objects.filter(metadata__repo="fastapi/fastapi").count() == 0

    target = next(c for c in commits if c["pr_number"] == TARGET_PR)
    query = "exclude_defaults not propagated to dict keys and values in jsonable_encoder"
    scope = scope_for_operator(tenant_slug="acme")
    evidence = recent_prs(query=query, scope=scope, limit=5)
    # recent_prs orders its relevant hits newest first, so the PR is among them, not necessarily first.
    found = [ev for ev in evidence if ev.metadata.get("pr_number") == TARGET_PR]
    assert found and found[0].kind == "pr" and found[0].url.endswith(f"/pull/{TARGET_PR}")
    experts = who_knows(query=query, scope=scope, limit=5)
    # The PR's author is credited in full for it (yul.vale.890, behind most of the other 29 PRs, may lead).
    author = next(e for e in experts if person_key(e.name) == person_key(target["author"]))
    credited = [d for d in author.documents if d.metadata.get("pr_number") == TARGET_PR]
    assert credited and credited[0].metadata["role"] == "author" and credited[0].metadata["credit"] > 0
    other_scope = scope_for_operator(tenant_slug="globex")
    assert recent_prs(query=query, scope=other_scope, limit=5) == []
