"""who_knows over real corpora: EnterpriseRAG-Bench documents, the Houston Slack export, and
FastAPI's code with its real commit history; identities, scoring, the pipeline tool, access."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import override_settings

from search.pipeline.executor import execute_plan
from search.pipeline.planner import Plan, PlannedCall
from search.retrieval import hybrid_search
from search.tools.people import (
    Expert,
    parse_mention,
    person_key,
    who_knows,
    who_knows_tool,
)
from sources.selectors import QueryScope, scope_for_user

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}
ENCODERS = "fastapi/encoders.py"
HOUSTON_CHANNELS = ["datajam", "meetup", "sponsors"]


@dataclass
class PeopleKB:
    erb: QueryScope
    houston: QueryScope
    fastapi: QueryScope
    commits: list[dict]


def _fastapi_commits(shared_dir: Path) -> list[dict]:
    """Real commits: every one that touched encoders.py or security/, plus the 200 newest."""
    rows = [json.loads(line) for line in (shared_dir / "corpora/fastapi-commits.jsonl").read_text().splitlines()]
    touching = [r for r in rows if any(f == ENCODERS or f.startswith("fastapi/security/") for f in r["files"])]
    return touching + [r for r in rows[:200] if r not in touching]


@pytest.fixture(scope="module")
def people_kb(django_db_setup, django_db_blocker, shared_dir, tmp_path_factory) -> PeopleKB:
    """One tenant, three projects: ERB documents; three Houston channels; FastAPI's encoders.py
    and security/ package (git, no commit rows of its own) with real commits touching them."""
    from projects.services import project_create, tenant_onboard
    from search.evaluation import fastapi_source_checkout
    from sources.services import source_create, source_ingest

    commits = _fastapi_commits(shared_dir)
    history = tmp_path_factory.mktemp("history") / "fastapi-commits.jsonl"
    history.write_text("".join(json.dumps(c) + "\n" for c in commits))
    with django_db_blocker.unblock():
        t = tenant_onboard(name="Who", slug="wk-people", admin_username="wk-people-admin", admin_password="w" * 12)
        tid = t.tenant.pk
        houston = project_create(tenant_id=tid, name="Houston", slug="wk-houston")
        fastapi = project_create(tenant_id=tid, name="FastAPI", slug="wk-fastapi")
        houston_config = {"path": str(shared_dir / "corpora/slack-export-houston"), "channels": HOUSTON_CHANNELS}
        sources = [
            (
                "jsonl",
                "ERB",
                {"path": str(shared_dir / "eval/erb/docs"), "id_field": "dataset_doc_uuid"},
                {},
                t.project,
            ),
            ("slack_export", "Houston", houston_config, {}, houston),
            (
                "git",
                "FastAPI code",
                {"path": str(fastapi_source_checkout()), "max_commits": 0},
                {"include": [ENCODERS, "fastapi/security/*"]},
                fastapi,
            ),
            (
                "jsonl",
                "FastAPI history",
                {
                    "path": str(history),
                    "id_field": "sha",
                    "kind": "commit",
                    "title_field": "subject",
                    "content_fields": ["body"],
                },
                {},
                fastapi,
            ),
        ]
        for kind, name, config, globs, project in sources:
            source = source_create(
                tenant_id=tid, kind=kind, name=name, config=config, project_ids=[project.pk], **globs
            )
            run = source_ingest(tenant_id=tid, source_id=source.pk)
            assert run.status in {"succeeded", "partial"}, run.error
        return PeopleKB(
            erb=scope_for_user(t.admin, t.project.slug),
            houston=scope_for_user(t.admin, "wk-houston"),
            fastapi=scope_for_user(t.admin, "wk-fastapi"),
            commits=commits,
        )


def _credits(expert: Expert) -> dict[str, tuple[str, float]]:
    return {ev.external_id: (ev.metadata["role"], ev.metadata["credit"]) for ev in expert.documents}


@pytest.mark.slow
@pytest.mark.django_db
def test_ticket_reporter_and_assignee_lead_commenters_get_half(people_kb, shared_dir):
    ticket = json.loads(
        (shared_dir / "eval/erb/docs/jira/INT-1842-log-retention-exception-northstar-bank.json").read_text()
    )
    question = "who handled the Northstar Bank log retention exception?"
    assert hybrid_search(question, people_kb.erb).hits[0].external_id == ticket["dataset_doc_uuid"]

    experts = who_knows(query=question, scope=people_kb.erb, limit=10)
    by_name = {e.name: e for e in experts}
    assert {experts[0].name, experts[1].name} == {ticket["reporter"], ticket["assignee"]}
    # Rank 1 at full weight is worth exactly 1.0; a commenter on it ("Name (date): ...") 0.5.
    assert _credits(by_name[ticket["assignee"]])[ticket["dataset_doc_uuid"]] == ("assignee", 1.0)
    assert _credits(by_name[ticket["reporter"]])[ticket["dataset_doc_uuid"]] == ("reporter", 1.0)
    commenter = next(c.split(" (")[0] for c in ticket["comments"] if not c.startswith(ticket["reporter"]))
    assert _credits(by_name[commenter])[ticket["dataset_doc_uuid"]] == ("commenter", 0.5)
    for expert in experts:
        # The score is the sum of the documents' credits; documents are best first.
        assert expert.score == pytest.approx(sum(ev.metadata["credit"] for ev in expert.documents), abs=1e-3)
        credits = [ev.metadata["credit"] for ev in expert.documents]
        assert credits == sorted(credits, reverse=True)
    assert [e.score for e in experts] == sorted((e.score for e in experts), reverse=True)
    json.dumps([e.as_dict() for e in experts])  # JSON-safe


@pytest.mark.slow
@pytest.mark.django_db
def test_slack_conversation_starter_leads(people_kb, shared_dir):
    root = shared_dir / "corpora/slack-export-houston"
    users = {u["id"]: u.get("real_name") or u["name"] for u in json.loads((root / "users.json").read_text())}
    starter = next(
        users[m["user"]]
        for day in sorted((root / "datajam").glob("*.json"))
        for m in json.loads(day.read_text())
        if "next datajam is scheduled" in m.get("text", "")
    )
    experts = who_knows(query="who knows about the next datajam meetup?", scope=people_kb.houston)
    assert experts[0].name == starter
    best = experts[0].documents[0]
    assert best.kind == "conversation" and "next datajam is scheduled" in best.title
    assert (best.metadata["role"], best.metadata["credit"]) == ("author", 1.0)


@pytest.mark.slow
@pytest.mark.django_db
def test_file_authors_share_by_files_touched(people_kb):
    question = "who knows jsonable_encoder?"
    hits = hybrid_search(question, people_kb.fastapi, limit=20).hits
    rank = next(i for i, h in enumerate(hits, start=1) if h.path == ENCODERS)
    # Expected from the raw commit log: commit weight 1 / files changed, shared per author.
    weights: dict[str, float] = defaultdict(float)
    for c in people_kb.commits:
        if ENCODERS in c["files"]:
            weights[c["author"]] += 1 / len(c["files"])
    total = sum(weights.values())
    t0 = time.perf_counter()
    experts = {e.name: e for e in who_knows(query=question, scope=people_kb.fastapi, limit=50)}
    print(f"\nwho_knows on FastAPI code + history: {(time.perf_counter() - t0) * 1000:.0f} ms")
    for author, weight in weights.items():
        file_credits = [ev for ev in experts[author].documents if ev.metadata["role"] == "file author"]
        assert file_credits[0].path == ENCODERS
        assert file_credits[0].metadata["credit"] == pytest.approx(weight / total / rank, abs=1e-4)
        # Their commits to the file are among their documents: as hits themselves, or as support.
        theirs = {c["sha"] for c in people_kb.commits if c["author"] == author and ENCODERS in c["files"]}
        assert theirs & {ev.external_id for ev in experts[author].documents}
        for ev in experts[author].documents:
            if ev.metadata["role"] == f"committed to {ENCODERS}":
                assert ev.external_id in theirs and ev.metadata["credit"] == 0.0 and ev.metadata["share"] > 0
    for expert in experts.values():
        assert expert.score == pytest.approx(sum(ev.metadata["credit"] for ev in expert.documents), abs=1e-3)
    top = max(weights, key=weights.get)
    assert next(iter(experts)) == top


def test_identities_normalise_case_accents_separators_and_emails():
    assert person_key("Alex  Martinez") == person_key("alex.martinez") == person_key("ALEX_MARTINEZ") == "alex martinez"
    assert person_key("Sebastián Ramírez") == "sebastian ramirez"
    assert person_key("Priya Rao (Candidate)") == "priya rao"
    mention = parse_mention("Marta Lopez <Marta.Lopez@acmecloud.com>")
    assert (mention.name, mention.email) == ("Marta Lopez", "marta.lopez@acmecloud.com")
    assert parse_mention("dependabot[bot]") is None
    assert parse_mention("marketplace-bot") is None
    assert parse_mention("") is None and parse_mention(["x"]) is None


@pytest.mark.django_db
def test_merged_identities_and_only_readable_rows(make_tenant):
    from sources.services import source_create, source_ingest

    acme, globex = make_tenant("wkacme"), make_tenant("wkglobex")
    rows = [
        {
            "external_id": "T-1",
            "kind": "ticket",
            "title": "Walrus cache evictions spike",
            "content": "The walrus cache evicts hot keys under load.",
            "metadata": {"reporter": "Dana Whitfield"},
        },
        {
            "external_id": "commit:abc",
            "kind": "commit",
            "title": "Tune walrus cache eviction",
            "content": "Tune walrus cache eviction thresholds",
            "metadata": {
                "author_name": "dana whitfield",
                "author_email": "Dana.Whitfield@acme.example",
                "files": ["walrus/cache.py"],
            },
        },
        {
            "external_id": "T-2",
            "kind": "ticket",
            "title": "Walrus cache sizing",
            "content": "Sizing the walrus cache for the eviction policy.",
            "metadata": {"assignee": "dana.whitfield@acme.example"},
        },
        {
            "external_id": "C9:1",
            "kind": "thread",
            "title": "#private: walrus cache eviction incident",
            "content": "Quinn Hollis: the walrus cache eviction incident postmortem",
            "metadata": {"authors": ["Quinn Hollis"]},
            "principals": [f"user:{acme.admin.pk}"],
        },
    ]
    foreign = [
        {
            "external_id": "G-1",
            "kind": "ticket",
            "title": "Walrus cache eviction at Globex",
            "content": "walrus cache eviction",
            "metadata": {"reporter": "Gale Outsider"},
        },
    ]
    with override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        for t, data in ((acme, rows), (globex, foreign)):
            source = source_create(
                tenant_id=t.tenant.pk, kind="test_rows", name="Rows", config={"rows": data}, project_ids=[t.project.pk]
            )
            assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    from django.contrib.auth import get_user_model

    from projects.models import Membership
    from projects.services import membership_create, profile_set_default_project

    member = get_user_model().objects.create_user("wk-member", "m@acme.example", "p" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=member, role=Membership.Role.MEMBER)
    profile_set_default_project(user=member, tenant_id=acme.tenant.pk, project_id=acme.project.pk)

    admin_experts = who_knows(query="walrus cache eviction", scope=scope_for_user(acme.admin))
    dana = next(e for e in admin_experts if e.name == "Dana Whitfield")
    assert "dana.whitfield@acme.example" in dana.aliases
    assert {ev.external_id for ev in dana.documents} == {"T-1", "T-2", "commit:abc"}
    assert "Quinn Hollis" in {e.name for e in admin_experts}

    member_experts = who_knows(query="walrus cache eviction", scope=scope_for_user(member))
    names = {e.name for e in member_experts}
    assert "Dana Whitfield" in names
    assert "Quinn Hollis" not in names  # only from a row restricted to the admin
    assert "Gale Outsider" not in names | {e.name for e in admin_experts}  # another tenant
    assert all(ev.external_id != "C9:1" for e in member_experts for ev in e.documents)


@pytest.mark.slow
@pytest.mark.django_db
def test_pipeline_tool_puts_people_first_then_their_documents(people_kb):
    question = "who handled the Northstar Bank log retention exception?"
    experts = who_knows(query=question, scope=people_kb.erb)
    rows = who_knows_tool(query=question, scope=people_kb.erb, limit=8)
    people = [r for r in rows if r.kind == "person"]
    assert [r.title for r in people] == [e.name for e in experts[:3]]
    assert rows[: len(people)] == people
    assert len({r.document_id for r in people}) == 3 and all(r.document_id < 0 for r in people)
    assert people[0].metadata["documents"][0]["external_id"] == experts[0].documents[0].external_id
    assert experts[0].documents[0].title in people[0].text
    assert all(r.is_relevant for r in people)
    documents = [r.document_id for r in rows[len(people) :]]
    assert len(documents) == len(set(documents)) == 5 and all(d > 0 for d in documents)

    result = execute_plan(
        Plan([PlannedCall("search", question), PlannedCall("who_knows", question)], "rules"), people_kb.erb
    )
    assert not result.tool_errors
    numbered = [(ev.n, ev.kind, ev.title) for ev in result.evidence]
    assert (2, "person", experts[0].name) in numbered
