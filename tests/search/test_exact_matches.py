"""Exact matches dominate and a document counts once per ranked list.

The scenario: a Slack export whose thread starts on one day and gets, in a later day file, a
reply holding a unique code (``ZEBRA-4471``), in a project that also holds 30 unrelated
Markdown pages. Full-text finds the thread; nothing that only matches in meaning may outrank it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from search.retrieval import Hit, hybrid_search, merge_and_cap
from search.retrieval.exact import promote_exact
from search.services import ask
from sources.selectors import scope_for_operator

TOPICS = [
    "deploying services",
    "rotating credentials",
    "on-call handover",
    "incident reviews",
    "release trains",
    "feature flags",
    "database migrations",
    "cache invalidation",
    "log retention",
    "cost reports",
]


def _ts(dt: datetime) -> str:
    return f"{int(dt.timestamp())}.000100"


@pytest.fixture(scope="module")
def zebra(django_db_setup, django_db_blocker, tmp_path_factory):
    """Committed (the executor's tool threads open their own connections), in its own tenant."""
    with django_db_blocker.unblock():
        return _zebra_tenant(tmp_path_factory.mktemp("zebra"))


def _zebra_tenant(tmp_path):
    from projects.services import tenant_onboard
    from sources.services import source_create, source_ingest

    onboarded = tenant_onboard(name="Zebra", slug="zebra-exact", admin_username="zebra-admin", admin_password="z" * 12)
    export = tmp_path / "export"
    (export / "ops").mkdir(parents=True)
    (export / "users.json").write_text(
        json.dumps(
            [
                {"id": "U1", "name": "ana", "real_name": "Ana Lima"},
                {"id": "U2", "name": "bob", "real_name": "Bob Stone"},
            ]
        )
    )
    (export / "channels.json").write_text(json.dumps([{"id": "C1", "name": "ops", "members": ["U1", "U2"]}]))
    parent = _ts(datetime(2024, 5, 6, 16, 0, tzinfo=UTC))
    (export / "ops" / "2024-05-06.json").write_text(
        json.dumps(
            [
                {
                    "type": "message",
                    "user": "U1",
                    "text": "The nightly export job keeps timing out, anyone seen this?",
                    "ts": parent,
                    "thread_ts": parent,
                    "reply_count": 1,
                },
            ]
        )
    )
    (export / "ops" / "2024-05-07.json").write_text(
        json.dumps(
            [
                {
                    "type": "message",
                    "user": "U2",
                    "text": "Tracked as ZEBRA-4471: the export needs a bigger worker pool.",
                    "ts": _ts(datetime(2024, 5, 7, 9, 0, tzinfo=UTC)),
                    "thread_ts": parent,
                    "parent_user_id": "U1",
                },
            ]
        )
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        topic = TOPICS[i % len(TOPICS)]
        (docs / f"page-{i:02d}.md").write_text(
            f"# Guide {i}: {topic}\n\nThis page explains {topic} for team {i}. Ask in the ops channel when a job "
            f"times out or an export fails.\n\n## Details\n\nMore about {topic}: owners, schedules and checklists.\n"
        )
    for kind, name, config in (
        ("slack_export", "Slack", {"path": str(export)}),
        ("docs", "Docs", {"path": str(docs)}),
    ):
        source = source_create(
            tenant_id=onboarded.tenant.pk, kind=kind, name=name, config=config, project_ids=[onboarded.project.pk]
        )
        run = source_ingest(tenant_id=onboarded.tenant.pk, source_id=source.pk)
        assert run.status == "succeeded", run.error
    return scope_for_operator(tenant_slug="zebra-exact")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_row_holding_the_exact_code_ranks_first(zebra):
    hits = hybrid_search("What is ZEBRA-4471?", zebra, limit=10, rerank=True).hits
    assert hits[0].kind == "thread" and "ZEBRA-4471" in hits[0].content
    assert hits[0].ranks.get("exact") == 1


@pytest.mark.django_db
def test_the_answer_cites_the_thread_and_a_code_no_row_holds_is_not_answered(zebra):
    result = ask("What is ZEBRA-4471?", zebra)
    assert result.answer.answered, (result.verdict, result.answer.text)
    assert result.sources and all("ZEBRA-4471" in s.text for s in result.sources)
    assert "ZEBRA-4471" in result.answer.text

    missing = ask("What is PANGOLIN-6402?", zebra)
    assert not missing.answer.answered
    assert "PANGOLIN-6402" in " ".join(missing.verdict.missing_terms) or missing.verdict.status == "not_found"
    assert all("PANGOLIN-6402" in s.text for s in missing.sources)  # no citation of a block lacking it


def _hit(doc_id, kind, path, ranks, **kw):
    return Hit(
        document_id=doc_id,
        source_id=1,
        kind=kind,
        title=str(doc_id),
        url="",
        path=path,
        start_line=None,
        end_line=None,
        content=kw.pop("content", ""),
        text="",
        metadata={},
        updated_at=None,
        parent_id=kw.pop("parent_id", None),
        external_id=str(doc_id),
        score=sum(1 / (60 + r) for r in ranks.values()),
        ranks=ranks,
    )


def test_a_page_and_its_section_count_once_in_one_list():
    """The page and its section both in the passage-level dense list: the document counts once
    there, at the better rank; the page's vote in the document-level list adds (another list)."""
    section = _hit(1, "doc_section", "guide.md", {"lexical": 1, "dense": 4})
    page_same_list = _hit(2, "doc_page", "guide.md", {"dense": 2})
    merged = merge_and_cap([section, page_same_list])
    assert merged[0].document_id == 1
    assert merged[0].score == pytest.approx(1 / 61 + 1 / 62)  # dense once, at rank 2

    section = _hit(1, "doc_section", "guide.md", {"lexical": 1, "dense": 4})
    page_document_list = _hit(2, "doc_page", "guide.md", {"dense:document": 2})
    merged = merge_and_cap([section, page_document_list])
    assert merged[0].score == pytest.approx(1 / 61 + 1 / 64 + 1 / 62)


def test_a_thread_and_its_bursts_count_once_per_list():
    thread = _hit(10, "thread", "", {"dense:document": 3})
    burst_a = _hit(11, "burst", "", {"lexical": 1, "dense": 5}, parent_id=10)
    burst_b = _hit(12, "burst", "", {"lexical": 2, "dense": 1}, parent_id=10)
    merged = merge_and_cap([burst_a, burst_b, thread])
    assert [h.document_id for h in merged] == [10]
    assert merged[0].score == pytest.approx(1 / 63 + 1 / 61 + 1 / 61)  # each list once, at its best rank


def test_promotion_keeps_order_within_each_part():
    hits = [
        _hit(i, "doc_section", f"{i}.md", {"dense": i}, content=text)
        for i, text in enumerate(["near miss", "has zebra-4471 inside", "another near miss", "ZEBRA 4471 again"], 1)
    ]
    assert [h.document_id for h in promote_exact(hits, ["ZEBRA-4471"])] == [2, 4, 1, 3]
    assert promote_exact(hits, []) == hits
