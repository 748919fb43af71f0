"""The ingestion service: idempotent upserts, deletions, failures that lose nothing, the task and command."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError
from sources.models import Document, IngestionRun
from sources.scheduling import source_health_list
from sources.services import source_create, source_ingest, source_update_config
from sources.tasks import ingest_source

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}


def _rows(*items):
    return [{"external_id": eid, "kind": "doc_section", "title": eid, "content": text} for eid, text in items]


@pytest.fixture
def tenant(make_tenant, settings):
    settings.KB_CUSTOM_CONNECTORS = CUSTOM
    return make_tenant("ingest")


def _source(tenant, rows, *, name="Rows", **config):
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="test_rows",
        name=name,
        config={"rows": rows, **config},
        project_ids=[tenant.project.pk],
    )


def _docs(tenant):
    with tenant_context(tenant.tenant.pk):
        return {d.external_id: d for d in Document.objects.all()}


def test_rerun_is_idempotent_and_only_changes_are_embedded(tenant):
    source = _source(tenant, _rows(("a", "alpha text"), ("b", "beta text"), ("c", "gamma text")))
    first = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert (first.status, first.created, first.embedded) == ("succeeded", 3, 3)
    ids_before = {k: d.pk for k, d in _docs(tenant).items()}

    again = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert (again.created, again.updated, again.unchanged, again.embedded, again.deleted) == (0, 0, 3, 0, 0)

    source_update_config(
        tenant_id=tenant.tenant.pk,
        source_id=source.pk,
        config={"rows": _rows(("a", "alpha text"), ("b", "beta text, revised"), ("d", "delta text"))},
    )
    third = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert (third.created, third.updated, third.unchanged, third.embedded, third.deleted) == (1, 1, 1, 2, 1)
    docs = _docs(tenant)
    assert set(docs) == {"a", "b", "d"}
    assert docs["a"].pk == ids_before["a"] and docs["b"].pk == ids_before["b"]
    assert docs["b"].content == "beta text, revised"


def test_failed_run_keeps_earlier_rows_and_records_the_error(tenant):
    source = _source(tenant, _rows(("a", "alpha"), ("b", "beta")))
    source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    with tenant_context(tenant.tenant.pk):
        # A config that validates but breaks the connector at run time (row without a kind).
        from sources.models import DataSource

        DataSource.objects.filter(pk=source.pk).update(config={"rows": [{"external_id": "x", "title": "t"}]})
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "failed"
    assert "kind" in run.error and "content" in run.error
    assert set(_docs(tenant)) == {"a", "b"}


def test_invalid_config_is_refused_with_the_field_named(tenant):
    with pytest.raises(ConnectorError, match=r"invalid config for a 'test_rows' data source: rows: Field required"):
        source_create(tenant_id=tenant.tenant.pk, kind="test_rows", name="Bad", config={})
    with pytest.raises(ConnectorError, match="unknown data source kind 'nope'"):
        source_create(tenant_id=tenant.tenant.pk, kind="nope", name="Bad", config={})


def test_duplicate_external_ids_are_recorded_not_silently_dropped(tenant):
    source = _source(tenant, _rows(("a", "first"), ("a", "second"), ("b", "other")))
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "partial"
    assert run.skipped_items == [{"item": "a", "reason": "duplicate external id in one run; kept the first"}]
    assert _docs(tenant)["a"].content == "first"


def test_celery_task_runs_the_same_service(tenant):
    source = _source(
        tenant,
        _rows(
            ("a", "alpha"),
        ),
    )
    result = ingest_source.apply(args=[tenant.tenant.pk, source.pk]).get()
    assert result["status"] == "succeeded" and result["seen"] == 1
    with tenant_context(tenant.tenant.pk):
        assert IngestionRun.objects.get(pk=result["run_id"]).embedded == 1


def test_ingest_command_prints_counts_and_fails_clearly(tenant, capsys):
    source = _source(tenant, _rows(("a", "alpha"), ("b", "beta")))
    call_command("ingest", f"ingest/{source.slug}", "--quiet")
    out = capsys.readouterr().out
    assert "succeeded" in out and "rows seen 2, created 2" in out
    with pytest.raises(CommandError, match="no data source 'missing' in tenant 'ingest'"):
        call_command("ingest", "missing", "--tenant", "ingest")


def test_a_row_postgresql_refuses_is_recorded_and_the_rest_of_its_batch_kept(tenant):
    rows = _rows(("good", "a fine row"), ("bad", "a row whose kind is too long"), ("also", "fine"))
    rows[1]["kind"] = "k" * 30  # varchar(20): PostgreSQL refuses this one row
    source = _source(tenant, rows)
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "partial"
    assert [item["item"] for item in run.skipped_items] == ["bad"]
    assert run.skipped_items[0]["reason"].startswith("could not be stored: value too long for type character varying")
    assert set(_docs(tenant)) == {"good", "also"}
    assert (run.created, run.embedded) == (2, 3)


def test_task_for_a_deleted_or_foreign_source_is_a_no_op(tenant, make_tenant):
    source = _source(
        tenant,
        _rows(
            ("a", "alpha"),
        ),
    )
    other = make_tenant("ingest-other")
    # Another tenant's id for this source: row-level security makes it "gone", never ingested.
    assert ingest_source.apply(args=[other.tenant.pk, source.pk]).get()["status"] == "gone"
    with tenant_context(tenant.tenant.pk):
        source.delete()
    assert ingest_source.apply(args=[tenant.tenant.pk, source.pk]).get()["status"] == "gone"


def test_a_running_run_shows_done_of_total_units_and_the_time_left(tenant, client):
    rows = _rows(*((f"r{i}", f"row number {i} of the progress test") for i in range(150)))
    source = _source(tenant, rows, name="Counted rows", count_units=True)
    client.force_login(tenant.admin)
    seen_mid_run: list[tuple[IngestionRun, str, str]] = []

    def progress(done, total):
        # After the second batch is written (64 rows a batch), look as another process would.
        if done == 130 and not seen_mid_run:
            with tenant_context(tenant.tenant.pk):
                run = IngestionRun.objects.get(source=source, status="running")
            health = {h.source.pk: h for h in source_health_list(tenant_id=tenant.tenant.pk)}[source.pk]
            page = client.get("/sources/status/").content.decode()
            seen_mid_run.append((run, health.progress, page))
            assert not health.late  # a first run still running is not late (it has not failed yet)

    finished = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk, progress=progress)
    run, label, page = seen_mid_run[0]
    # The batch is written while the 128th row is being yielded, before its unit is finished.
    assert (run.units_done, run.units_total, run.seen) == (127, 150, 128)
    assert label.startswith("127/150 records (84%), about ") and label.endswith(" left, 128 rows")
    assert f'<span data-field="progress">{label}</span>' in page
    assert (finished.units_done, finished.units_total, finished.status) == (150, 150, "succeeded")
    assert finished.eta_seconds(finished.finished_at) is None  # a finished run has nothing left


def test_the_time_left_extrapolates_the_rate_so_far():
    now = timezone.now()
    start = IngestionRun(status="running", units_done=25, units_total=100, seen=40, started_at=now)
    assert start.eta_seconds(now + timedelta(seconds=60)) == 180.0  # 25 units a minute, 75 to go
    assert start.progress_label(now + timedelta(seconds=60)) == "25/100 (25%), about 3 min left, 40 rows"
    assert start.progress_label(now + timedelta(seconds=10)) == "25/100 (25%), about 30 s left, 40 rows"
    assert start.progress_label(now + timedelta(hours=1)) == "25/100 (25%), about 3 h 00 min left, 40 rows"
    assert start.progress_label(now + timedelta(days=30)) == "25/100 (25%), more than a day left, 40 rows"
    start.units_done = 100  # every unit done, the closing work left: no estimate
    assert start.progress_label(now + timedelta(seconds=60)) == "100/100 (100%), 40 rows"
    start.units_done = 0  # nothing done yet: no estimate
    assert start.eta_seconds(now + timedelta(seconds=60)) is None
    assert start.progress_label(now) == "0/100 (0%), 40 rows"
    start.units_label = "files"  # what the connector counts, when it says
    assert start.progress_label(now) == "0/100 files (0%), 40 rows"
    start.units_total = None  # a connector that does not count: rows only
    assert start.progress_label(now) == "40 rows"


@pytest.mark.parametrize("reported", [2**40, -1])
def test_a_total_out_of_the_columns_range_is_stored_clamped_and_the_run_finishes(tenant, reported):
    """A connector's total comes from a remote API (Jira's search ``total``): a count PostgreSQL's
    integer cannot hold, or a negative one, is stored within range, never failing the run."""
    rows = _rows(("a", "alpha"), ("b", "beta"))
    source = _source(tenant, rows, name="Odd total", count_units=True, reported_total=reported)
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert (run.status, run.units_done) == ("succeeded", 2)
    assert run.units_total == (2_147_483_647 if reported > 0 else 0)
    with tenant_context(tenant.tenant.pk):
        assert IngestionRun.objects.get(pk=run.pk).units_total == run.units_total
