"""Identical embedded texts: one copy per source, kind and principals in the HNSW index.

Identical vectors trap an HNSW search (copies link only to each other), so the dense ranker
reads one copy of each text; the copies stay searchable by full text and readable as rows."""

import pytest

from kbportal.tenancy import tenant_context
from search.retrieval import dense_ranking
from sources.connectors.base import DocumentRow, IngestReport
from sources.embeddings import get_embedder
from sources.models import Document
from sources.selectors import QueryScope
from sources.services import source_create, source_ingest, source_rows_delete, source_rows_upsert
from sources.services.ingestion import BATCH_SIZE

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}
REPEATED = "📝 Update release notes\n\n[skip ci]"
COPIES = 120


@pytest.fixture
def tenant(make_tenant, settings):
    settings.KB_CUSTOM_CONNECTORS = CUSTOM
    return make_tenant("dupes")


def _row(eid, text, kind="commit", principals=()):
    return {
        "external_id": eid,
        "kind": kind,
        "title": text.split("\n")[0],
        "content": text,
        "principals": list(principals),
    }


def _ingest(tenant, rows):
    source = source_create(
        tenant_id=tenant.tenant.pk,
        kind="test_rows",
        name="Rows",
        config={"rows": rows},
        project_ids=[tenant.project.pk],
    )
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "succeeded"
    return source


def _marks(tenant):
    with tenant_context(tenant.tenant.pk):
        return dict(Document.objects.values_list("external_id", "embedding_duplicate"))


def _dense(tenant, source, question, principals=()):
    scope = QueryScope(
        tenant_id=tenant.tenant.pk,
        user_id=None,
        project_id=tenant.project.pk,
        project_slug=tenant.project.slug,
        project_name=tenant.project.name,
        allowed_source_ids=(source.pk,),
        principals=principals,
    )
    with tenant_context(tenant.tenant.pk):
        ranked = dense_ranking(get_embedder().embed_query(question), scope, limit=20)
        titles = dict(Document.objects.filter(pk__in=[i for i, _ in ranked]).values_list("pk", "external_id"))
    return [titles[i] for i, _ in ranked]


def test_a_text_repeated_in_many_rows_is_one_dense_candidate(tenant):
    rows = [_row(f"copy-{i}", REPEATED) for i in range(COPIES)]
    rows += [
        _row("notes-page", "Release notes: 0.140.0 reduces memory use in dependencies.", kind="doc_section"),
        _row("fix", "🐛 Fix release notes rendering of nested lists (#1234)"),
    ]
    source = _ingest(tenant, rows)

    marks = _marks(tenant)
    assert [eid for eid, dup in marks.items() if eid.startswith("copy-") and not dup] == ["copy-0"]
    assert not marks["notes-page"] and not marks["fix"]
    ranked = _dense(tenant, source, "update the release notes")
    assert sum(eid.startswith("copy-") for eid in ranked) == 1
    assert {"notes-page", "fix"} <= set(ranked)
    with tenant_context(tenant.tenant.pk):  # the copies are still rows, found by full text
        assert Document.objects.filter(external_id__startswith="copy-").count() == COPIES


def test_copies_of_another_kind_or_readable_by_other_people_are_indexed_apart(tenant):
    text = "Deploys freeze on Fridays after 15:00 UTC; ask the release manager for an exception."
    source = _ingest(
        tenant,
        [
            _row("restricted", text, kind="doc_section", principals=["user:1"]),
            _row("public", text, kind="doc_section"),
            _row("page", text, kind="doc_page"),
            _row("public-copy", text, kind="doc_section"),
        ],
    )
    marks = _marks(tenant)
    # A restricted row never stands for a readable one, nor a page for its only section.
    assert marks == {"restricted": False, "public": False, "page": False, "public-copy": True}
    assert "public" in _dense(tenant, source, "When do deploys freeze?", principals=("user:2",))


def test_live_updates_keep_one_indexed_copy(tenant):
    source = _ingest(tenant, [_row("first", REPEATED), _row("other", "Bump version to 0.140.0")])
    source_rows_upsert(
        tenant_id=tenant.tenant.pk,
        source_id=source.pk,
        rows=[DocumentRow(**_row("second", REPEATED)), DocumentRow(**_row("third", REPEATED))],
    )
    assert _marks(tenant) == {"first": False, "second": True, "third": True, "other": False}

    # The indexed copy deleted: another copy takes its place in the index.
    source_rows_delete(tenant_id=tenant.tenant.pk, source_id=source.pk, external_ids=["first"])
    assert _marks(tenant) == {"second": False, "third": True, "other": False}

    # The indexed copy's text changed: it is indexed under its new text, a copy under the old one.
    source_rows_upsert(
        tenant_id=tenant.tenant.pk, source_id=source.pk, rows=[DocumentRow(**_row("second", "Revert the bump"))]
    )
    assert _marks(tenant) == {"second": False, "third": False, "other": False}
    assert "third" in _dense(tenant, source, "update release notes")


def test_a_failed_run_leaves_no_text_without_an_indexed_copy(tenant):
    """Batches written before a run fails stay written: when one moved the indexed copy's text away,
    another copy of the old text is indexed at once, not after the next successful run."""
    filler = [_row(f"filler-{i}", f"Bump dependency number {i} to its latest release") for i in range(BATCH_SIZE)]
    source = _ingest(tenant, [_row("first", REPEATED), _row("second", REPEATED), *filler])
    assert _marks(tenant)["second"] is True
    broken = [_row("first", "Revert the bump"), *filler, {"external_id": "bad", "title": "no kind, no content"}]
    with tenant_context(tenant.tenant.pk):
        from sources.models import DataSource

        DataSource.objects.filter(pk=source.pk).update(config={"rows": broken})
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "failed"
    marks = _marks(tenant)
    assert marks["first"] is False and marks["second"] is False  # "first" under its new text, "second" under the old


def test_a_copy_is_written_unindexed_and_never_enters_the_hnsw_graph(tenant):
    """A copy written after its text is indexed (in the same batch or an earlier one) is marked as
    it is inserted, before any refresh: an HNSW graph keeps the vectors it was given until a vacuum."""
    from sources.services.ingestion import _Batcher

    source = _ingest(tenant, [_row("first", REPEATED)])
    batcher = _Batcher(tenant_id=tenant.tenant.pk, source_id=source.pk, generation=1, run=None, report=IngestReport())
    for eid in ("second", "third"):
        batcher.add(DocumentRow(**_row(eid, REPEATED)), batcher.report)
    batcher.add(DocumentRow(**_row("private", REPEATED, principals=["user:7"])), batcher.report)
    batcher.flush()  # no refresh runs here
    assert _marks(tenant) == {"first": False, "second": True, "third": True, "private": False}
