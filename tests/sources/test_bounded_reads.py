"""Bounded memory in every file-reading connector: a file over ``max_file_bytes`` is skipped with
its size and never read; a JSONL line over ``max_line_bytes`` is skipped as ``file:line``; the
other files and lines of the same run are still ingested; a Jira CSV export is read record by
record; a dead ``running`` run is marked abandoned when its status is shown."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError, IngestReport
from sources.connectors.confluence.connector import ConfluenceConnector
from sources.connectors.docs.connector import DocsConnector
from sources.connectors.files import FileTooLarge, iter_lines_bounded, read_bounded
from sources.connectors.jira.connector import JiraConnector
from sources.connectors.jsonl.connector import JsonDocumentsConnector
from sources.connectors.slack_export.connector import SlackExportConnector
from sources.models import IngestionRun
from sources.scheduling import source_health_list, source_run_lock
from sources.services import source_create, source_ingest


def _lines(data: bytes, limit: int) -> list[tuple[int, bytes | str]]:
    return [
        (n, line if isinstance(line, bytes) else line.reason) for n, line in iter_lines_bounded(io.BytesIO(data), limit)
    ]


def test_read_bounded_refuses_a_file_over_the_limit_without_reading_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_bytes(b"x" * 100)
    assert read_bounded(page, 100) == b"x" * 100
    with pytest.raises(FileTooLarge) as refused:
        read_bounded(page, 99)
    assert refused.value.reason == "file is 100 bytes, over max_file_bytes (99)"


def test_lines_over_the_limit_are_reported_with_their_length_and_the_next_lines_still_read():
    data = b"short\n" + b"y" * 25 + b"\n" + b"z" * 10 + b"\n" + b"w" * 11
    assert _lines(data, 10) == [
        (1, b"short\n"),
        (2, "line is 25 bytes, over max_line_bytes (10)"),
        (3, b"z" * 10 + b"\n"),  # exactly the limit, its newline not counted
        (4, "line is 11 bytes, over max_line_bytes (10)"),  # the last line, with no newline
    ]
    # A line much longer than one read piece is consumed piece by piece, then reading goes on.
    big = b"a" * (3 * (1 << 20) + 5) + b"\nnext\n"
    assert _lines(big, 1000) == [(1, f"line is {3 * (1 << 20) + 5} bytes, over max_line_bytes (1000)"), (2, b"next\n")]


def test_docs_folder_skips_an_oversized_page_and_ingests_the_rest(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    (tmp_path / "guide.md").write_text("# Guide\n\nHow to deploy the service with one command.\n")
    (tmp_path / "huge.txt").write_bytes(b"log line\n" * 2000)  # 18,000 bytes
    source = source_create(
        tenant_id=tenant_id, kind="docs", name="Docs", config={"path": str(tmp_path), "max_file_bytes": 10_000}
    )
    run = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert run.status == IngestionRun.Status.PARTIAL
    assert run.skipped_items == [{"item": "huge.txt", "reason": "file is 18000 bytes, over max_file_bytes (10000)"}]
    with tenant_context(tenant_id):
        assert sorted(source.documents.values_list("external_id", flat=True)) == ["guide.md", "guide.md#guide"]


def test_docs_max_file_bytes_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="max_file_bytes"):
        DocsConnector({"path": str(tmp_path), "max_file_bytes": 0})


def test_jsonl_skips_an_overlong_record_line_and_an_oversized_json_file(tmp_path):
    records = tmp_path / "records.jsonl"
    lines = [
        json.dumps({"id": "a", "title": "First", "content": "short record"}),
        json.dumps({"id": "b", "title": "Huge", "content": "x" * 5000}),
        json.dumps({"id": "c", "title": "Third", "content": "another short record"}),
    ]
    records.write_text("\n".join(lines) + "\n")
    (tmp_path / "dump.json").write_text(json.dumps([{"id": f"d{i}", "content": "y" * 100} for i in range(100)]))
    report = IngestReport()
    connector = JsonDocumentsConnector({"path": str(tmp_path), "max_line_bytes": 1000, "max_file_bytes": 5000})
    rows = list(connector.iter_rows(report))
    assert [r.external_id for r in rows] == ["a", "c"]
    size = (tmp_path / "dump.json").stat().st_size
    assert report.skipped == [
        {"item": "dump.json", "reason": f"file is {size} bytes, over max_file_bytes (5000)"},
        {"item": "records.jsonl:2", "reason": f"line is {len(lines[1])} bytes, over max_line_bytes (1000)"},
    ]
    assert report.done == report.total == 4  # the skipped line and file count as done


def test_jsonl_single_oversized_json_file_fails_naming_it_and_the_limit(tmp_path):
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"id": "x", "content": "z" * 2000}))
    with pytest.raises(
        ConnectorError, match=r"dump\.json is not read: file is \d+ bytes, over max_file_bytes \(1000\)"
    ):
        list(JsonDocumentsConnector({"path": str(dump), "max_file_bytes": 1000}).iter_rows(IngestReport()))


def _slack_export(root: Path, *, day_padding: int = 0) -> None:
    (root / "general").mkdir(parents=True)
    (root / "channels.json").write_text(json.dumps([{"id": "C1", "name": "general"}]))
    (root / "users.json").write_text(json.dumps([{"id": "U1", "name": "ana", "profile": {"real_name": "Ana"}}]))
    day = [{"type": "message", "user": "U1", "ts": "1700000000.000100", "text": "the deploy key rotates monthly"}]
    (root / "general" / "2023-11-14.json").write_text(json.dumps(day))
    big = [{"type": "message", "user": "U1", "ts": "1700090000.000100", "text": "p" * day_padding}]
    (root / "general" / "2023-11-15.json").write_text(json.dumps(big))


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "zip"])
def test_slack_export_skips_an_oversized_day_file_from_a_folder_or_a_zip(tmp_path, packed):
    root = tmp_path / "export"
    _slack_export(root, day_padding=5000)
    path = root
    if packed:
        path = tmp_path / "export.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(root.rglob("*.json")):
                archive.write(file, file.relative_to(root).as_posix())
    report = IngestReport()
    rows = list(SlackExportConnector({"path": str(path), "max_file_bytes": 4000}).iter_rows(report))
    assert any("deploy key rotates monthly" in r.content for r in rows)
    size = (root / "general" / "2023-11-15.json").stat().st_size
    assert report.skipped == [
        {"item": "general/2023-11-15.json", "reason": f"file is {size} bytes, over max_file_bytes (4000)"}
    ]


def test_slack_export_with_an_oversized_channel_list_fails_naming_the_file(tmp_path):
    _slack_export(tmp_path)
    (tmp_path / "channels.json").write_text(json.dumps([{"id": f"C{i}", "name": f"c{i}"} for i in range(200)]))
    with pytest.raises(ConnectorError, match=r"channels\.json in Slack export .* is not read: file is \d+ bytes"):
        list(SlackExportConnector({"path": str(tmp_path), "max_file_bytes": 1000}).iter_rows(IngestReport()))


def test_confluence_export_skips_an_oversized_page(tmp_path):
    body = "<html><head><title>{t}</title></head><body><div id='main-content'>{b}</div></body></html>"
    (tmp_path / "Runbook_101.html").write_text(body.format(t="Runbook", b="<p>Restart the queue first.</p>"))
    (tmp_path / "Dump_102.html").write_text(body.format(t="Dump", b="<p>" + "q" * 6000 + "</p>"))
    report = IngestReport()
    config = {"path": str(tmp_path), "max_file_bytes": 3000}
    rows = list(ConfluenceConnector(config).iter_rows(report))
    assert [r.title for r in rows if r.kind == "doc_page"] == ["Runbook"]
    size = (tmp_path / "Dump_102.html").stat().st_size
    assert report.skipped == [{"item": "Dump_102.html", "reason": f"file is {size} bytes, over max_file_bytes (3000)"}]


def test_jira_csv_export_is_read_record_by_record_and_a_bad_byte_fails_naming_the_line(tmp_path):
    export = tmp_path / "jira.csv"
    export.write_bytes(
        b"Issue key,Summary,Description\n"
        b'OPS-1,Queue stalls,"The worker\nstops after a deploy"\n'
        b"OPS-2,Disk full,Rotate the logs\n"
        b"OPS-3,Bad \xff byte,here\n"
    )
    connector = JiraConnector({"path": str(export)})
    rows = connector.iter_rows(IngestReport())
    assert [next(rows).title, next(rows).title] == ["OPS-1: Queue stalls", "OPS-2: Disk full"]
    with pytest.raises(ConnectorError, match=r"jira\.csv line 5 is not UTF-8: invalid byte 0xff at column 11"):
        next(rows)


def test_status_page_marks_a_dead_running_run_abandoned_and_a_live_one_not(make_tenant, tmp_path):
    acme = make_tenant("acme")
    tenant_id = acme.tenant.pk
    (tmp_path / "a.md").write_text("# A\n\nSome page text for the run.\n")
    dead_source = source_create(tenant_id=tenant_id, kind="docs", name="Dead", config={"path": str(tmp_path)})
    live_source = source_create(tenant_id=tenant_id, kind="docs", name="Live", config={"path": str(tmp_path)})
    with tenant_context(tenant_id):
        dead = IngestionRun.objects.create(tenant_id=tenant_id, source=dead_source, status="running")
        live = IngestionRun.objects.create(tenant_id=tenant_id, source=live_source, status="running")
    with source_run_lock(live_source.pk) as acquired:  # a worker is running this one
        assert acquired
        health = {h.source.slug: h for h in source_health_list(tenant_id=tenant_id)}
    with tenant_context(tenant_id):
        dead.refresh_from_db()
        live.refresh_from_db()
    assert dead.status == "failed" and dead.error.startswith("abandoned") and dead.finished_at
    assert live.status == "running"
    assert health[dead_source.slug].state == "backed_off" and health[dead_source.slug].source.consecutive_failures == 1
    assert health[live_source.slug].state == "running"
