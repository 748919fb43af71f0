"""Bounded memory in every file-reading connector: a file over ``max_file_bytes`` is skipped with
its size and never read; a JSONL line over ``max_line_bytes`` is skipped as ``file:line``; the
other files and lines of the same run are still ingested; a Jira CSV export is read record by
record; a dead ``running`` run is marked abandoned when its status is shown."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError, IngestReport
from sources.connectors.confluence.connector import ConfluenceConnector
from sources.connectors.docs.connector import DocsConnector
from sources.connectors.files import FileRefused, FileTooLarge, iter_lines_bounded, read_bounded
from sources.connectors.jira.connector import JiraConnector
from sources.connectors.jsonl.connector import JsonDocumentsConnector
from sources.connectors.slack.export_connector import SlackExportConnector
from sources.models import IngestionRun
from sources.scheduling import runs_abandon, source_health_list, source_run_lock
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


def test_a_pipe_a_device_link_and_a_link_are_refused_without_reading(tmp_path):
    os.mkfifo(tmp_path / "pipe.md")  # open() on it would wait for a writer forever
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")  # reading it would never end
    (tmp_path / "page.md").write_text("# Page\n\nA real page.\n")
    (tmp_path / "link.md").symlink_to(tmp_path / "page.md")
    with pytest.raises(FileRefused, match=r"not a regular file \(a pipe\)"):
        read_bounded(tmp_path / "pipe.md", 1000)
    with pytest.raises(FileRefused, match="symbolic link; not followed"):
        read_bounded(tmp_path / "link.md", 1000)
    assert read_bounded(tmp_path / "link.md", 1000, follow_symlinks=True) == b"# Page\n\nA real page.\n"
    with pytest.raises(FileRefused, match=r"not a regular file \(a device or socket\)"):
        read_bounded(tmp_path / "zero.jsonl", 1000, follow_symlinks=True)
    report = IngestReport()
    assert list(JsonDocumentsConnector({"path": str(tmp_path)}).iter_rows(report)) == []
    assert report.skipped == [{"item": "zero.jsonl", "reason": "symbolic link; not followed"}]
    report = IngestReport()
    rows = list(DocsConnector({"path": str(tmp_path)}).iter_rows(report))
    assert {r.external_id for r in rows} == {"page.md", "page.md#page"}
    assert report.skipped == [
        {"item": "link.md", "reason": "symbolic link; not followed"},
        {"item": "pipe.md", "reason": "not a regular file (a pipe); not read"},
    ]


def test_lines_over_the_limit_are_reported_with_their_length_and_the_next_lines_still_read():
    data = b"short\n" + b"y" * 25 + b"\n" + b"z" * 10 + b"\n" + b"w" * 11
    assert _lines(data, 10) == [
        (1, b"short\n"),
        (2, "line is 25 bytes, over max_line_bytes (10)"),
        (3, b"z" * 10 + b"\n"),  # exactly the limit, its newline not counted
        (4, "line is 11 bytes, over max_line_bytes (10)"),  # the last line, with no newline
    ]
    # The newline is not counted, \r\n included; a long line's length excludes it too.
    assert _lines(b"abc\r\nabcd\r\n", 3) == [(1, b"abc\r\n"), (2, "line is 4 bytes, over max_line_bytes (3)")]
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


def test_slack_export_skips_a_corrupt_zip_member_and_reads_the_other_days(tmp_path):
    root = tmp_path / "export"
    _slack_export(root, day_padding=100)
    path = tmp_path / "export.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for file in sorted(root.rglob("*.json")):
            archive.write(file, file.relative_to(root).as_posix())
    data = bytearray(path.read_bytes())
    at = data.find(b"pppp")  # inside the stored day file of 2023-11-15: its CRC no longer matches
    data[at : at + 4] = b"qqqq"
    path.write_bytes(bytes(data))
    report = IngestReport()
    rows = list(SlackExportConnector({"path": str(path)}).iter_rows(report))
    assert any("deploy key rotates monthly" in r.content for r in rows)
    assert [s["item"] for s in report.skipped] == ["general/2023-11-15.json"]
    assert report.skipped[0]["reason"].startswith("unreadable ZIP member: Bad CRC-32")


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


def test_jira_csv_with_bare_cr_lines_a_bom_and_a_large_cell(tmp_path):
    export = tmp_path / "jira.csv"
    big = "x" * 200_000  # over csv's own 128 KiB cell limit, under max_file_bytes
    export.write_bytes(
        f"\ufeffIssue key,Summary,Description\rOPS-1,Old Mac line ends,{big}\rOPS-2,Second,ok\r".encode()
    )
    rows = list(JiraConnector({"path": str(export)}).iter_rows(IngestReport()))
    assert [r.title for r in rows] == ["OPS-1: Old Mac line ends", "OPS-2: Second"]
    assert big in rows[0].content
    export.write_bytes(b"\xef\xbb\xbfIssue key,Summ\xffary\n")
    with pytest.raises(ConnectorError, match=r"line 1 is not UTF-8: invalid byte 0xff at column 15"):
        list(JiraConnector({"path": str(export)}).iter_rows(IngestReport()))
    export.write_bytes(b"Issue key,Summary\n" + b"OPS-1," + b"y" * 300 + b"\n")
    with pytest.raises(ConnectorError, match=r"line 2 is not read: it is 306 bytes, over max_file_bytes \(100\)"):
        list(JiraConnector({"path": str(export), "max_file_bytes": 100}).iter_rows(IngestReport()))


def test_a_dead_run_is_marked_abandoned_and_counted_as_a_failure_once(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    source = source_create(tenant_id=tenant_id, kind="docs", name="Docs", config={"path": str(tmp_path)})
    with tenant_context(tenant_id):
        dead = IngestionRun.objects.create(tenant_id=tenant_id, source=source, status="running")
        assert runs_abandon(source_id=source.pk) == [dead.pk]
        assert runs_abandon(source_id=source.pk) == []  # a second caller that saw the same run
        source.refresh_from_db()
    assert source.consecutive_failures == 1


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
