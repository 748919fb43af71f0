"""The JSON documents connector, end to end through ``source_ingest`` on real PostgreSQL.

Real data: the FastAPI commit log (2,500 JSONL lines) and the EnterpriseRAG-Bench documents
(92 ``.json`` files naming their own title and content fields); expected values are computed
here from the files. Small files written to ``tmp_path`` cover broken lines and other shapes.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import IngestReport
from sources.connectors.jsonl.connector import JsonDocumentsConnector, parse_timestamp
from sources.models import Document, IngestionRun
from sources.services import source_create, source_ingest

ROW_FIELDS = (
    "external_id",
    "kind",
    "title",
    "content",
    "text",
    "url",
    "path",
    "metadata",
    "created_at",
    "updated_at",
)
COMMITS_CONFIG = {
    "id_field": "sha",
    "title_field": "subject",
    "content_fields": ["body"],
    "kind": "commit",
    "url_template": "https://github.com/fastapi/fastapi/commit/{sha}",
}


def _ingest(tenant_id: int, config: dict[str, Any], name: str = "Records") -> tuple[int, IngestionRun]:
    source = source_create(tenant_id=tenant_id, kind="jsonl", name=name, config=config)
    return source.pk, source_ingest(tenant_id=tenant_id, source_id=source.pk)


def _rows(tenant_id: int, source_id: int) -> dict[str, dict[str, Any]]:
    with tenant_context(tenant_id):
        return {d["external_id"]: d for d in Document.objects.filter(source_id=source_id).values(*ROW_FIELDS)}


@pytest.fixture
def tenant_id(make_tenant) -> int:
    return make_tenant("acme").tenant.pk


@pytest.mark.slow
def test_fastapi_commits_become_commit_rows_with_pr_numbers(tenant_id, shared_dir):
    path = shared_dir / "corpora" / "fastapi-commits.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(records) == len(path.read_text().splitlines()) == 2500

    started = time.monotonic()
    source_id, run = _ingest(tenant_id, {"path": str(path), **COMMITS_CONFIG})
    seconds = time.monotonic() - started
    rows = _rows(tenant_id, source_id)
    print(f"\nfastapi commits: {len(rows)} rows, {run.embedded} embedded in {seconds:.1f} s")

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert run.seen == run.created == run.embedded == len(rows) == len(records)
    assert set(rows) == {r["sha"] for r in records}
    assert {r["kind"] for r in rows.values()} == {"commit"}
    with_pr = {r["sha"]: r["pr_number"] for r in records if r["pr_number"] is not None}
    assert {e: r["metadata"]["pr_number"] for e, r in rows.items() if "pr_number" in r["metadata"]} == with_pr
    assert len(with_pr) == 1210
    assert all(type(r["metadata"]["pr_number"]) is int for r in rows.values() if "pr_number" in r["metadata"])

    release = rows["95f8322ee1dcda7ceace7b1c4f6c9915b36d748f"]
    assert release["title"] == "🔖 Release version 0.141.1 (#16106)"
    assert release["url"] == "https://github.com/fastapi/fastapi/commit/95f8322ee1dcda7ceace7b1c4f6c9915b36d748f"
    assert release["metadata"]["pr_number"] == 16106
    assert release["metadata"]["author"] == "yul.vale.890"
    assert release["metadata"]["files"] == ["docs/en/docs/release-notes.md", "fastapi/__init__.py"]
    # Empty body: the content is the changed files, so a search for a file name finds the commit.
    assert release["content"] == "Files changed:\ndocs/en/docs/release-notes.md\nfastapi/__init__.py"
    assert release["text"] == (
        "🔖 Release version 0.141.1 (#16106)\n\nFiles changed: docs/en/docs/release-notes.md, fastapi/__init__.py"
    )
    assert release["updated_at"] == datetime(2026, 7, 29, 17, 15, 38, tzinfo=UTC)
    notes = rows["f137944c435cff4e4b30ea7d12855ea88ddb868c"]
    assert "pr_number" not in notes["metadata"]
    assert notes["content"].startswith("[skip ci]\n\nFiles changed:\n")
    # The largest commit keeps its whole file list even though it is over the metadata size cap.
    biggest = max(records, key=lambda r: len(r["files"]))
    assert rows[biggest["sha"]]["metadata"]["files"] == biggest["files"]
    assert rows[biggest["sha"]]["content"].count("\n") >= len(biggest["files"])
    assert rows[biggest["sha"]]["text"].endswith(f" and {len(biggest['files']) - 5} more")

    again = source_ingest(tenant_id=tenant_id, source_id=source_id)
    assert (again.embedded, again.created, again.updated, again.deleted) == (0, 0, 0, 0)
    assert again.unchanged == again.seen == 2500


@pytest.mark.slow
def test_erb_documents_keep_titles_content_and_metadata(tenant_id, shared_dir):
    folder = shared_dir / "eval" / "erb" / "docs"
    files = sorted(folder.glob("*/*.json"))
    docs = {json.loads(f.read_text())["dataset_doc_uuid"]: (f, json.loads(f.read_text())) for f in files}
    assert len(files) == len(docs) == 92

    started = time.monotonic()
    source_id, run = _ingest(
        tenant_id, {"path": str(folder), "id_field": "dataset_doc_uuid", "exclude_fields": ["dataset_noise_document"]}
    )
    seconds = time.monotonic() - started
    rows = _rows(tenant_id, source_id)
    print(f"\nERB docs: {len(rows)} rows, {run.embedded} embedded in {seconds:.1f} s")

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert set(rows) == set(docs)
    for doc_id, (file, doc) in docs.items():
        row = rows[doc_id]
        assert row["kind"] == "record"
        assert row["title"] == " ".join(doc[doc["title_field_name"]].split())
        assert row["path"] == file.relative_to(folder).as_posix()
        assert row["metadata"]["source_type"] == file.parent.name
        assert "dataset_noise_document" not in row["metadata"]
        assert "content_field_names" not in row["metadata"]
        first = doc[doc["content_field_names"][0]]
        first_text = first if isinstance(first, str) else "\n".join(first)
        assert row["content"].startswith(first_text.strip()[:200].replace("\\n", "\n"))
        assert row["updated_at"] is not None

    # A Slack thread: the title field is its channel; participants and times kept; the messages are the content.
    slack_id, (slack_file, slack) = next((i, d) for i, d in docs.items() if d[1].get("thread_ts") == "1711002345")
    thread = rows[slack_id]
    assert thread["title"] == slack["file_name"]
    assert thread["metadata"]["channel"] == "partnerships"
    assert thread["metadata"]["participants"] == slack["participants"]
    assert thread["metadata"]["thread_ts"] == "1711002345"
    assert thread["content"] == slack["text"]
    assert thread["updated_at"] == datetime.fromtimestamp(int(slack["last_message_ts"]), tz=UTC)
    assert thread["created_at"] == datetime.fromtimestamp(int(slack["first_message_ts"]), tz=UTC)
    channel_titled = [rows[i] for i, (_, d) in docs.items() if d["title_field_name"] == "channel"]
    assert len(channel_titled) == 14 and all(r["title"] == r["metadata"]["channel"] for r in channel_titled)

    # A Confluence page: status, confidentiality, author kept; later content fields are labelled.
    page_id, (_, page) = next((i, d) for i, d in docs.items() if d[0].parent.name == "confluence")
    assert {k: rows[page_id]["metadata"][k] for k in ("author", "status", "confidentiality", "space")} == {
        k: page[k] for k in ("author", "status", "confidentiality", "space")
    }
    jira_id, (_, jira) = next(
        (i, d) for i, d in sorted(docs.items()) if d[1]["content_field_names"] == ["description", "comments"]
    )
    assert rows[jira_id]["content"] == jira["description"].strip() + "\n\nComments:\n" + "\n".join(jira["comments"])
    assert rows[jira_id]["metadata"]["key"] == jira["key"]
    assert rows[jira_id]["updated_at"] == datetime.fromisoformat(jira["updated_at"]).replace(tzinfo=UTC)


def test_invalid_lines_are_skipped_and_recorded(tenant_id, tmp_path):
    path = tmp_path / "tickets.jsonl"
    path.write_text(
        '{"id": "T-1", "title": "Login fails", "content": "SSO loop on the admin console.", "status": "open"}\n'
        '{"id": "T-2", "title": "Slow search", "content": "p95 over two seconds"\n'
        "\n"
        '{"title": "No id here", "content": "orphan"}\n'
        '["not", "an", "object"]\n'
        '{"id": 3, "title": "Export broken", "content": "CSV export drops the last row.", "updated_at": 1711008920}\n'
    )
    source_id, run = _ingest(tenant_id, {"path": str(path), "kind": "ticket"})

    assert run.status == IngestionRun.Status.PARTIAL
    assert run.skipped_items == [
        {"item": "tickets.jsonl:2", "reason": "invalid JSON: Expecting ',' delimiter at column 72"},
        {"item": "tickets.jsonl:4", "reason": "missing id field 'id'"},
        {"item": "tickets.jsonl:5", "reason": "not a JSON object but list"},
    ]
    rows = _rows(tenant_id, source_id)
    assert sorted(rows) == ["3", "T-1"]
    assert rows["T-1"]["kind"] == "ticket"
    assert rows["T-1"]["content"] == "SSO loop on the admin console."
    assert rows["T-1"]["text"] == "Login fails\n\nSSO loop on the admin console."
    assert rows["T-1"]["metadata"] == {"title": "Login fails", "status": "open"}
    assert rows["3"]["updated_at"] == datetime(2024, 3, 21, 8, 15, 20, tzinfo=UTC)


def test_missing_path_fails_naming_it(tenant_id, tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    _, run = _ingest(tenant_id, {"path": str(missing)})
    assert run.status == IngestionRun.Status.FAILED
    assert run.error == f"JSON documents path {missing} does not exist"

    broken = tmp_path / "broken.json"
    broken.write_text('{"id": 1, ')
    _, run = _ingest(tenant_id, {"path": str(broken)}, name="Broken")
    assert run.status == IngestionRun.Status.FAILED
    assert run.error.startswith(f"cannot read JSON file {broken}: Expecting property name")


def test_json_list_file_urls_and_cleaning(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(
        json.dumps(
            [
                {
                    "key": "A-1",
                    "name": "First",
                    "body": "one\u0000two",
                    "link": "https://x.test/A-1",
                    "date": "2025-02-20",
                },
                {"key": "A-2", "name": "Second", "body": ["line one", "line two"], "meta": {"nested": True}},
                {
                    "key": "A-3",
                    "body": "Overview:\\n\\nEscaped twice.\\nEnd",
                    "timestamp": "Sun, 1 Mar 2026 08:14:00 -0700",
                },
                "stray string",
            ]
        )
    )
    report = IngestReport()
    connector = JsonDocumentsConnector(
        {"path": str(path), "id_field": "key", "title_field": "name", "content_fields": ["body"], "url_field": "link"}
    )
    rows = {r.external_id: r for r in connector.iter_rows(report)}
    assert report.skipped == [{"item": "records.json[3]", "reason": "not a JSON object but str"}]
    assert report.total == report.done == 4
    assert rows["A-1"].content == "onetwo"  # PostgreSQL text cannot hold NUL
    assert rows["A-1"].url == "https://x.test/A-1"
    assert rows["A-1"].updated_at == datetime(2025, 2, 20, tzinfo=UTC)
    assert rows["A-2"].content == "line one\nline two"
    assert rows["A-2"].url == ""
    assert "meta" not in rows["A-2"].metadata  # nested objects are not kept by default
    assert rows["A-3"].title == "A-3"  # no title field: the id
    assert rows["A-3"].content == "Overview:\n\nEscaped twice.\nEnd"
    assert rows["A-3"].updated_at == datetime(2026, 3, 1, 8, 14, tzinfo=timezone(timedelta(hours=-7)))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-07-29T19:15:38+02:00", datetime(2026, 7, 29, 17, 15, 38, tzinfo=UTC)),
        ("2025-03-18", datetime(2025, 3, 18, tzinfo=UTC)),
        ("2026-03-10T18:00:00Z", datetime(2026, 3, 10, 18, tzinfo=UTC)),
        (1711008920, datetime(2024, 3, 21, 8, 15, 20, tzinfo=UTC)),
        (1711008920123, datetime(2024, 3, 21, 8, 15, 20, 123000, tzinfo=UTC)),
        ("1711002345.000200", datetime(2024, 3, 21, 6, 25, 45, 200, tzinfo=UTC)),
        ("", None),
        ("soon", None),
        (True, None),
        (None, None),
    ],
)
def test_parse_timestamp(value, expected):
    assert parse_timestamp(value) == expected


def test_url_template_missing_field_gives_no_link(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"sha": "abc", "subject": "Fix", "body": ""}\n{"subject": "no sha"}\n')
    report = IngestReport()
    rows = list(
        JsonDocumentsConnector({"path": str(path), **COMMITS_CONFIG, "url_template": "{repo}/{sha}"}).iter_rows(report)
    )
    assert [(r.external_id, r.url, r.content) for r in rows] == [("abc", "", "Fix")]
    assert report.skipped == [{"item": "c.jsonl:2", "reason": "missing id field 'sha'"}]


def test_person_fields_become_owners_and_participants_that_who_knows_credits(tmp_path):
    """Who-knows reads a source's own person fields from its config, not from one data set's names."""
    from search.retrieval import Hit
    from search.tools.people import row_people

    path = tmp_path / "meetings.json"
    path.write_text(
        json.dumps(
            [
                {
                    "id": "m1",
                    "title": "Planning",
                    "content": "Q3 plan",
                    "host": "Maya Roberts",
                    "guests": "['Maya Roberts', 'Liam Chen']",
                    "scribe": ["Ana Lima", ""],
                },
                {"id": "m2", "title": "Retro", "content": "What went well", "host": ""},
            ]
        )
    )
    connector = JsonDocumentsConnector(
        {
            "path": str(path),
            "person_fields": {"host": "owner", "guests": "participant", "scribe": "participant"},
        }
    )
    rows = {r.external_id: r for r in connector.iter_rows(IngestReport())}
    assert rows["m1"].metadata["owners"] == ["Maya Roberts"]
    assert rows["m1"].metadata["participants"] == ["Maya Roberts", "Liam Chen", "Ana Lima"]
    assert "owners" not in rows["m2"].metadata and "participants" not in rows["m2"].metadata
    hit = Hit(
        document_id=1,
        source_id=1,
        kind="record",
        title="Planning",
        url="",
        path="",
        start_line=None,
        end_line=None,
        content="",
        text="",
        metadata=rows["m1"].metadata,
        updated_at=None,
        parent_id=None,
        external_id="m1",
    )
    credits = {(m.name, role, weight) for m, role, weight in row_people(hit)}
    assert ("Maya Roberts", "owner", 1.0) in credits and ("Liam Chen", "participant", 0.5) in credits
    with pytest.raises(Exception, match="person_fields"):
        JsonDocumentsConnector({"path": str(path), "person_fields": {"host": "boss"}})
