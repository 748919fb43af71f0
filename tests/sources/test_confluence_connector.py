"""The ``confluence`` connector end to end against a loopback Confluence REST API, on real PostgreSQL.

The site served by ``tests/sources/confluence_server.py`` holds the real EnterpriseRAG-Bench
Confluence pages (``shared/eval/erb/docs/confluence``, 31 pages in 10 spaces, each space with a
home page), rendered to storage format. The connector reaches it through ``requests``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model

from kbportal.tenancy import tenant_context
from projects.services import membership_create, profile_set_default_project
from search.retrieval import hybrid_search
from sources.connectors.base import ConnectorError
from sources.connectors.registry import build_connector
from sources.embeddings import get_embedder
from sources.models import Document, IngestionRun
from sources.selectors import scope_for_operator, scope_for_user
from sources.services import source_create, source_ingest
from tests.sources.confluence_server import EMAIL, TOKEN, ConfluenceWorld, FakeConfluence, world_from_documents

pytestmark = pytest.mark.slow  # loopback API servers; retries are waited out in real time

PAGES = 31 + 10  # the ERB pages and one home page per space
PARENT = "2025-11-07-us-east-streaming-degradation-postmortem"  # restricted: Rafael Mendes + group
CHILD = "2025-02-11-hosted-api-latency-fallback-activated"  # internal, listed before its new parent
NARROW = "incident-comms-roles-and-responsibilities"  # restricted on its own to Rafael Mendes and Wei Chen
DISJOINT = "incident-communication-templates"  # restricted on its own to Wei Chen only
RAFAEL, WEI = "rafael.mendes@erb.example", "wei.chen@erb.example"


@pytest.fixture
def world(shared_dir: Path) -> ConfluenceWorld:
    return world_from_documents(shared_dir / "eval" / "erb" / "docs" / "confluence")


@pytest.fixture
def wiki(world) -> Iterator[FakeConfluence]:
    server = FakeConfluence(world)
    yield server
    server.close()


@pytest.fixture
def acme(make_tenant):
    return make_tenant("acme")


def _config(server: FakeConfluence, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": server.base_url,
        "email": EMAIL,
        "token": TOKEN,
        "page_size": 10,
        "allow_private_network": True,  # the fake Confluence listens on loopback (kbportal.netcheck)
        **extra,
    }


def _source(tenant, server: FakeConfluence, name: str = "ERB wiki", **extra: Any) -> int:
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="confluence",
        name=name,
        config=_config(server, **extra),
        project_ids=[tenant.project.pk],
    ).pk


def _docs(tenant_id: int, source_id: int) -> dict[str, Document]:
    with tenant_context(tenant_id):
        return {d.external_id: d for d in Document.objects.filter(source_id=source_id)}


def _member(tenant, username: str, email: str):
    user = get_user_model().objects.create_user(username, email, "pw-" + username * 2)
    membership_create(tenant_id=tenant.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=tenant.tenant.pk, project_id=tenant.project.pk)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def test_pages_and_sections_across_listing_pages(acme, wiki, world):
    code_page = world.by_file["shadow-traffic-rollout-and-rollback-runbook"]
    world.edit(
        code_page,
        "# Rollback\n\nRun this:\n\n```bash\nkubectl rollout undo deploy/shadow-router\n```\n",
        "2026-02-24T10:00:00.000Z",
        "Sean Gallagher",
    )
    source_id = _source(acme, wiki)
    get_embedder().embed(["warm up"])  # the model's load time is not ingestion throughput

    t0 = time.perf_counter()
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    elapsed = time.perf_counter() - t0
    print(
        f"\nconfluence ingestion: {run.seen} rows ({PAGES} pages) in {elapsed:.2f} s = "
        f"{run.seen / elapsed:.1f} rows/s (embedding included), {len(wiki.requests)} requests"
    )

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    listing = wiki.log("/rest/api/content")
    assert [r.query["start"] for r in listing] == ["0", "10", "20", "30", "40"]  # followed _links.next
    assert all("restrictions.read.restrictions.group" in r.query["expand"] for r in listing)
    docs = _docs(acme.tenant.pk, source_id)
    pages = {k: d for k, d in docs.items() if d.kind == "doc_page"}
    assert sorted(pages) == sorted(world.pages) and run.seen == len(docs) > PAGES
    for page_id, page in world.pages.items():
        doc = pages[page_id]
        sections = [d for d in docs.values() if d.parent_external_id == page_id]
        assert doc.title == page["title"] and doc.metadata["sections"] == len(sections)
        assert doc.url == wiki.base_url + page["_links"]["webui"]
        assert doc.metadata["space"] == page["space"]["key"]
        assert doc.metadata["version"] == page["version"]["number"]
        assert (
            doc.metadata["author"]
            == f"{page['history']['createdBy']['displayName']} <{page['history']['createdBy']['email']}>"
        )
        assert doc.metadata["labels"] == [lb["name"] for lb in page["metadata"]["labels"]["results"]]
        assert doc.metadata["ancestors"] == [a["title"] for a in world.ancestors(page_id)]
        assert doc.updated_at == datetime.fromisoformat(page["version"]["when"].replace("Z", "+00:00"))
        assert all(s.parent_id == doc.pk and s.path == doc.path and s.principals == doc.principals for s in sections)
    adr = pages[world.by_file["adr-014-status-page-component-mapping-source-of-truth"]]
    assert adr.metadata["last_modifier"].startswith("Sean Gallagher") and adr.metadata["collaborators"]
    section_titles = [d.title for d in docs.values() if d.parent_external_id == adr.external_id]
    assert f"{adr.title} > Decision drivers" in section_titles
    # The code macro's body is text; its language parameter is a setting, not content.
    code = [d for d in docs.values() if d.parent_external_id == code_page]
    assert any("kubectl rollout undo deploy/shadow-router" in d.content for d in code)
    assert not any(d.content.strip().startswith("bash") for d in code)

    query = "status page component registry source of truth in git"
    hits = hybrid_search(query, scope_for_operator(tenant_slug="acme"), limit=5).hits
    assert adr.path in [h.path for h in hits[:3]]


def test_restricted_page_and_its_children_are_invisible_to_others(acme, make_tenant, wiki, world):
    parent, child = world.by_file[PARENT], world.by_file[CHILD]
    narrow, disjoint = world.by_file[NARROW], world.by_file[DISJOINT]
    for page in (child, narrow, disjoint):
        world.move(page, parent)
    world.restrict(narrow, ["Rafael Mendes", "Wei Chen"], [])
    world.restrict(disjoint, ["Wei Chen"], [])
    source_id = _source(acme, wiki, space="OAIR")
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    # The child is listed before its parent: the parent's restrictions were fetched, once.
    assert [r.path for r in wiki.log(f"/content/{parent}")] == [f"/wiki/rest/api/content/{parent}"]

    docs = _docs(acme.tenant.pk, source_id)
    leads = "group:oncall-and-incident-response-leads"
    assert docs[parent].principals == sorted([f"email:{RAFAEL}", leads])
    assert docs[child].principals == sorted([f"email:{RAFAEL}", leads])  # inherits the parent's
    assert docs[narrow].principals == [f"email:{RAFAEL}"]  # both levels admit only Rafael
    assert docs[disjoint].principals == [f"confluence-page:{disjoint}"]  # no one is in both: closed
    assert all(
        d.principals == docs[d.parent_external_id].principals
        for d in docs.values()
        if d.kind == "doc_section" and d.parent_external_id in (parent, child, narrow, disjoint)
    )
    assert docs[child].metadata["ancestors"] == [
        world.pages[world.parents[parent]]["title"],
        world.pages[parent]["title"],
    ]

    rafael, wei, bob = (
        _member(acme, "rafael", RAFAEL),
        _member(acme, "wei", WEI),
        _member(acme, "bob", "bob@erb.example"),
    )
    child_query = "hosted API latency fallback activated"
    parent_query = "US-East streaming degradation postmortem"

    def paths(user, query: str) -> set[str]:
        return {h.path for h in hybrid_search(query, scope_for_user(user), limit=10).hits}

    assert docs[child].path in paths(rafael, child_query) and docs[parent].path in paths(rafael, parent_query)
    for outsider in (wei, bob):
        assert docs[child].path not in paths(outsider, child_query)
        assert docs[parent].path not in paths(outsider, parent_query)
    assert docs[disjoint].path not in paths(wei, "incident communication templates")
    globex = make_tenant("globex")
    with tenant_context(globex.tenant.pk):
        assert Document.objects.filter(source_id=source_id).count() == 0


def test_second_run_is_idempotent_and_restriction_changes_reach_children(acme, wiki, world):
    source_id = _source(acme, wiki, space="ES")  # eng-sre: three pages and the home page
    first = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    second = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert (second.created, second.updated, second.embedded, second.deleted) == (0, 0, 0, 0)
    assert second.unchanged == second.seen == first.seen == len(_docs(acme.tenant.pk, source_id))

    # An edit rewrites that page's rows only; a new restriction on a parent closes its children
    # without re-embedding them (their text did not change).
    page = world.by_file["postmortem-controlled-failover-test-regression"]
    world.edit(
        page,
        "# Regression\n\nFailover tests now run per region and capability.\n",
        "2026-03-01T10:00:00.000Z",
        "Miles Thornton",
    )
    parent, child = (
        world.by_file["shadow-traffic-slos-and-guardrails"],
        world.by_file["2025-03-fallback-events-quarterly-review"],
    )
    world.move(child, parent)
    world.restrict(parent, [], ["sre"])
    third = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert third.status == IngestionRun.Status.SUCCEEDED, third.error
    docs = _docs(acme.tenant.pk, source_id)
    assert docs[child].principals == ["group:sre"] == docs[parent].principals
    assert docs[page].metadata["version"] == 4 and "per region and capability" in docs[page].content
    assert third.deleted >= 1  # the old sections of the edited page
    changed_pages = {page, parent, child}
    changed_rows = [
        d for d in docs.values() if (d.external_id if d.kind == "doc_page" else d.parent_external_id) in changed_pages
    ]
    assert third.updated + third.created == len(changed_rows)
    new_rows = [d for d in docs.values() if d.parent_external_id == page or d.external_id == page]
    assert third.embedded == len(new_rows)  # the restriction-only changes kept their vectors


def test_a_malformed_page_is_skipped_with_its_reason_and_the_rest_ingested(acme, wiki, world):
    no_body = world.by_file["office-plant-care-policy-2026"]
    no_restrictions = world.by_file["oddball-office-procedures-2024"]
    wiki.malformed[no_body] = {"id": no_body, "type": "page", "title": "Office plant care policy"}
    wiki.malformed[no_restrictions] = {**world.pages[no_restrictions], "restrictions": None}
    source_id = _source(acme, wiki, space="CH")  # company-handbook: four pages and the home page
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.PARTIAL
    assert sorted(run.skipped_items, key=lambda s: s["item"]) == sorted(
        [
            {"item": no_body, "reason": "no 'body.storage.value' (was body.storage expanded?)"},
            {"item": no_restrictions, "reason": "no 'restrictions.read' (was it expanded?)"},
        ],
        key=lambda s: s["item"],
    )
    pages = {k for k, d in _docs(acme.tenant.pk, source_id).items() if d.kind == "doc_page"}
    handbook = {k for k, p in world.pages.items() if p["space"]["key"] == "CH"}
    assert len(handbook) == 5 and pages == handbook - {no_body, no_restrictions}


def test_429_retry_after_is_honoured(acme, wiki):
    wiki.rate_limit(path_suffix="/rest/api/content", start="10", wait=1)
    source_id = _source(acme, wiki, space=["OAIR", "ES"])
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    limited = [r for r in wiki.log("/rest/api/content") if r.query.get("start") == "10"]
    assert [r.status for r in limited] == [429, 200] and limited[1].at - limited[0].at >= 0.9
    assert {r.query["spaceKey"] for r in wiki.log("/rest/api/content")} == {"OAIR", "ES"}
    assert {d.metadata["space"] for d in _docs(acme.tenant.pk, source_id).values()} == {"OAIR", "ES"}


def test_bad_config_names_the_field_and_credentials_never_appear(acme, wiki):
    for field, change in {
        "base_url": {"base_url": "wiki.example"},
        "space": {"space": ["two words"]},
        "page_size": {"page_size": 0},
        "surprise": {"surprise": True},
    }.items():
        with pytest.raises(ConnectorError) as caught:
            source_create(tenant_id=acme.tenant.pk, kind="confluence", name=field, config=_config(wiki, **change))
        assert f"{field}:" in str(caught.value), (field, str(caught.value))
    with pytest.raises(ConnectorError, match="base_url.*or path"):
        source_create(tenant_id=acme.tenant.pk, kind="confluence", name="neither", config={"space": "ENG"})

    wiki.echo_credentials = True
    wiki.auth = "bearer"
    wrong = "confluence-PAT-wrong-0123456789"
    source = source_create(
        tenant_id=acme.tenant.pk, kind="confluence", name="wrong", config=_config(wiki, email=None, token=wrong)
    )
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED and "HTTP 401" in run.error and "'Bearer ***'" in run.error
    assert wrong not in run.error and wrong not in repr(
        build_connector("confluence", _config(wiki, token=wrong)).config
    )
    unknown = source_create(
        tenant_id=acme.tenant.pk,
        kind="confluence",
        name="unknown space",
        config=_config(wiki, email=None, token=TOKEN, space="NOPE"),
    )
    failed = source_ingest(tenant_id=acme.tenant.pk, source_id=unknown.pk)
    assert "HTTP 404" in failed.error and "No space with key : NOPE" in failed.error


def _export(world: ConfluenceWorld, folder: Path, page_ids: list[str]) -> None:
    """Pages as Confluence's HTML space export writes them (breadcrumbs, page metadata, main content)."""
    for page_id in page_ids:
        page = world.pages[page_id]
        space = page["space"]["name"]
        crumbs = f'<li class="first"><span><a href="index.html">{space}</a></span></li>' + "".join(
            f'<li><span><a href="{a["title"].replace(" ", "-")}_{a["id"]}.html">{a["title"]}</a></span></li>'
            for a in world.ancestors(page_id)
        )
        when = datetime.fromisoformat(page["version"]["when"].replace("Z", "+00:00"))
        (folder / f"{page['title'][:40].replace(' ', '-').replace('/', '-')}_{page_id}.html").write_text(
            f"<!DOCTYPE html><html><head><title>{space} : {page['title']}</title></head><body>"
            f'<div id="page"><div id="main"><div id="breadcrumb-section"><ol id="breadcrumbs">{crumbs}</ol></div>'
            f'<h1 id="title-heading" class="pagetitle"><span id="title-text"> {space} : {page["title"]} </span></h1>'
            f'<div id="content" class="view"><div class="page-metadata">Created by <span class="author"> '
            f'{page["history"]["createdBy"]["displayName"]}</span>, last modified by <span class="editor"> '
            f"{page['version']['by']['displayName']}</span> on {when:%b %d, %Y}</div>"
            f'<div id="main-content" class="wiki-content group">{page["body"]["storage"]["value"]}</div>'
            "</div></div></div></body></html>",
            encoding="utf-8",
        )
    (folder / "index.html").write_text("<html><body>space index</body></html>")
    (folder / "broken_999.html").write_text("<html><body><p>no main content</p></body></html>")


def test_html_export_folder(acme, world, tmp_path):
    ids = [world.by_file[name] for name in (PARENT, NARROW, "adr-014-status-page-component-mapping-source-of-truth")]
    _export(world, tmp_path, ids)
    source = source_create(
        tenant_id=acme.tenant.pk,
        kind="confluence",
        name="export",
        project_ids=[acme.project.pk],
        config={"path": str(tmp_path), "space": "OAIR"},
    )
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.PARTIAL
    reason = "no #main-content element: not a page of a Confluence HTML export"
    assert run.skipped_items == [{"item": "broken_999.html", "reason": reason}]
    docs = _docs(acme.tenant.pk, source.pk)
    assert sorted(k for k, d in docs.items() if d.kind == "doc_page") == sorted(ids)
    page = docs[world.by_file[PARENT]]
    assert page.title == world.pages[page.external_id]["title"] and page.metadata["space"] == "OAIR"
    assert page.metadata["author"] == "Rafael Mendes" and page.metadata["ancestors"] == [
        "Oncall And Incident Response Home"
    ]
    assert (
        page.updated_at.date() == datetime.fromisoformat(world.pages[page.external_id]["version"]["when"][:10]).date()
    )
    assert sum(1 for d in docs.values() if d.parent_external_id == page.external_id) == page.metadata["sections"] > 1
