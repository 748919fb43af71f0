"""The Slack export connector, end to end through ``source_ingest`` on real PostgreSQL.

The houston export (real data, 16 channels, 1,382 messages, no threads) checks grouping, name
resolution and noise filtering against counts computed here from the files; small synthetic
exports written to ``tmp_path`` cover threads, private channels and broken input.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import IngestReport
from sources.connectors.slack.export_connector import SlackExportConnector
from sources.models import Document, IngestionRun
from sources.services import source_create, source_ingest, source_update_config

# Subtypes present in the houston export that record channel events, not conversation.
HOUSTON_NOISE = {
    "channel_join",
    "channel_leave",
    "channel_purpose",
    "channel_topic",
    "channel_name",
    "channel_archive",
    "pinned_item",
    "bot_add",
}
ROW_FIELDS = ("kind", "title", "content", "text", "url", "path", "metadata", "principals", "created_at", "updated_at")


def _houston(shared_dir: Path) -> Path:
    return shared_dir / "corpora" / "slack-export-houston"


def _ingest(tenant_id: int, config: dict[str, Any], name: str = "Slack") -> tuple[int, IngestionRun]:
    source = source_create(tenant_id=tenant_id, kind="slack_export", name=name, config=config)
    return source.pk, source_ingest(tenant_id=tenant_id, source_id=source.pk)


def _rows(tenant_id: int, source_id: int) -> dict[str, dict[str, Any]]:
    with tenant_context(tenant_id):
        return {
            d["external_id"]: d
            for d in Document.objects.filter(source_id=source_id).values("external_id", "embedding", *ROW_FIELDS)
        }


def _kept_houston_messages(root: Path) -> list[tuple[str, str, str]]:
    """(channel, ts, text) of every message the connector should keep, read straight from the files."""
    kept = []
    for day_file in sorted(root.glob("*/*.json")):
        for message in json.loads(day_file.read_text()):
            if message.get("subtype") in HOUSTON_NOISE:
                continue
            if not message.get("text", "").strip() and "file" not in message:
                continue
            kept.append((day_file.parent.name, message["ts"], message["text"]))
    return kept


def _ts(dt: datetime, seq: int = 1) -> str:
    return f"{int(dt.timestamp())}.{seq:06d}"


def _write_export(
    root: Path,
    days: dict[str, list[dict[str, Any]] | str],
    *,
    channels: list[dict[str, Any]] | None = None,
    groups: list[dict[str, Any]] | None = None,
) -> Path:
    """A Slack export under ``root``; ``days`` maps "<channel>/<date>" to messages (or raw text)."""
    root.mkdir(parents=True, exist_ok=True)
    users = [
        {"id": "U1", "name": "ana", "real_name": "Ana Lima", "profile": {"real_name": "Ana Lima"}},
        {"id": "U2", "name": "bob", "real_name": "Bob Stone", "profile": {"real_name": "Bob Stone"}},
        {"id": "U3", "name": "cy", "profile": {"display_name": "cy.w", "real_name": ""}},
    ]
    (root / "users.json").write_text(json.dumps(users))
    channels = channels if channels is not None else [{"id": "C1", "name": "eng", "members": ["U1", "U2", "U3"]}]
    (root / "channels.json").write_text(json.dumps(channels))
    if groups is not None:
        (root / "groups.json").write_text(json.dumps(groups))
    for key, messages in days.items():
        day_file = root / f"{key}.json"
        day_file.parent.mkdir(parents=True, exist_ok=True)
        day_file.write_text(messages if isinstance(messages, str) else json.dumps(messages))
    return root


def _zip(folder: Path, zip_path: Path) -> Path:
    """Zip ``folder`` the way "Compress" does: everything under one top-level folder name."""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                archive.write(file, f"{folder.name}/{file.relative_to(folder)}")
    return zip_path


# -- the real houston export -----------------------------------------------------------------------


@pytest.mark.slow
def test_houston_export_rows_names_reactions_and_coverage(make_tenant, shared_dir):
    tenant_id = make_tenant("acme").tenant.pk
    root = _houston(shared_dir)
    started = time.monotonic()
    source_id, run = _ingest(tenant_id, {"path": str(root), "workspace_url": "https://houstondatavis.slack.com"})
    elapsed = time.monotonic() - started
    rows = _rows(tenant_id, source_id)

    kept = _kept_houston_messages(root)
    assert len(kept) == 1031  # 1,382 messages minus 351 channel events
    # Conversations recomputed from the files: a new one wherever the gap exceeds 30 minutes.
    expected_conversations = 0
    for channel in {c for c, _, _ in kept}:
        times = sorted(float(ts) for c, ts, _ in kept if c == channel)
        expected_conversations += 1 + sum(1 for a, b in zip(times, times[1:], strict=False) if b - a > 30 * 60)

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    assert run.skipped_items == []
    # Burst rows (sources.connectors.slack.distill) sit beside the conversations; the counts below are the parents'.
    every = rows
    rows = {eid: r for eid, r in every.items() if r["kind"] != "burst"}
    assert len(rows) == expected_conversations == 385
    assert run.seen == run.created == run.embedded == len(every) > 385
    assert {r["kind"] for r in rows.values()} == {"conversation"}
    assert all(r["embedding"] is not None for r in rows.values())

    # datajam 2015-11-03: Zed Nash (U065ETZEC) posts, Ray Hale (U066MTL5U) replies mentioning
    # him; Ivy Lind (U061A1R2R) and Bo Penn (U061A5N1G) react with clap and ok_hand.
    conv = rows["C061A0WJG:conv:1446567461.000002"]
    assert conv["metadata"]["authors"] == ["Zed Nash 957", "Ray Hale 775"]
    assert conv["metadata"]["participants"] == ["Bo Penn 469", "Ivy Lind 960", "Ray Hale 775", "Zed Nash 957"]
    assert conv["metadata"]["reactions"] == {"clap::skin-tone-3": 1, "ok_hand": 1}
    assert conv["metadata"]["reaction_count"] == 2
    assert conv["content"].splitlines()[1] == (
        "2015-11-03 16:23 Ray Hale 775: Cool! Thanks @Zed Nash 957. We'll take a look at it :simple_smile:"
    )
    assert conv["url"] == "https://houstondatavis.slack.com/archives/C061A0WJG/p1446567461000002"
    assert conv["created_at"] == datetime(2015, 11, 3, 16, 17, 41, 2, tzinfo=UTC)
    assert conv["updated_at"] == datetime(2015, 11, 3, 16, 23, 59, 4, tzinfo=UTC)
    assert conv["title"].startswith("#datajam: Met Les Becker of Harris County Public Health")
    assert len(conv["title"]) <= len("#datajam: ") + 120

    # datajam 2016-01-13: "our next datajam is scheduled!" got three +1 reactions; the bare
    # meetup link after it is rendered with its unfurled title.
    scheduled = rows["C061A0WJG:conv:1452745569.000002"]
    assert scheduled["metadata"]["reactions"] == {"+1": 3}
    assert scheduled["metadata"]["reaction_count"] == 3
    assert "[link: Houston Data Visualization Meetup]" in scheduled["content"]

    # A file share keeps its file name.
    fritz = rows["C061A0WJG:conv:1433562832.000005"]
    assert fritz["metadata"]["files"] == ["Fritz.jpg"]
    assert fritz["metadata"]["authors"] == ["Yul Thorn 506", "Bo Penn 469"]

    for row in rows.values():
        assert "has joined the channel" not in row["content"]
        assert "has left the channel" not in row["content"]
        assert "set the channel purpose" not in row["content"]
        assert "<@U" not in row["content"]  # every mention resolved
        assert row["text"].startswith(f"#{row['metadata']['channel']}\n")
        assert len(row["text"]) <= len(row["metadata"]["channel"]) + 2 + 1500

    # Every kept message lies in exactly one row of its channel, and the counts add up.
    assert sum(r["metadata"]["message_count"] for r in rows.values()) == len(kept)
    by_channel: dict[str, list[dict[str, Any]]] = {}
    for row in rows.values():
        by_channel.setdefault(row["metadata"]["channel"], []).append(row)
    for channel, ts, text in kept:
        holders = [
            r
            for r in by_channel[channel]
            if float(r["metadata"]["first_ts"]) <= float(ts) <= float(r["metadata"]["last_ts"])
        ]
        assert len(holders) == 1, (channel, ts)
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        if first_line and "<" not in first_line and "&" not in first_line:
            assert first_line in holders[0]["content"], (channel, ts)
    print(f"houston export: {len(rows)} rows in {elapsed:.1f} s")

    # Search finds the conversation a question describes.
    from search.retrieval import hybrid_search
    from sources.selectors import QueryScope

    scope = QueryScope(tenant_id, None, 0, "slack", "Slack", (source_id,))
    top = hybrid_search("when is the next datajam meetup scheduled?", scope, limit=3).hits
    assert any("our next datajam is scheduled!" in h.content for h in top), [h.title for h in top]


@pytest.mark.slow
def test_houston_zip_gives_identical_rows_and_rerun_embeds_nothing(make_tenant, shared_dir, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    folder = shutil.copytree(_houston(shared_dir), tmp_path / "houston-export")
    archive = _zip(folder, tmp_path / "houston-export.zip")

    folder_id, folder_run = _ingest(tenant_id, {"path": str(folder)}, name="Folder")
    zip_id, zip_run = _ingest(tenant_id, {"path": str(archive)}, name="Zip")
    assert folder_run.status == zip_run.status == IngestionRun.Status.SUCCEEDED

    folder_rows, zip_rows = _rows(tenant_id, folder_id), _rows(tenant_id, zip_id)
    assert sum(1 for r in zip_rows.values() if r["kind"] == "conversation") == 385  # + their bursts
    assert set(zip_rows) == set(folder_rows)
    for external_id, row in zip_rows.items():
        assert {f: row[f] for f in ROW_FIELDS} == {f: folder_rows[external_id][f] for f in ROW_FIELDS}
    # Without a workspace URL the link is a stable pseudo-link.
    assert zip_rows["C061A0WJG:conv:1446567461.000002"]["url"] == (
        "slack://channel?id=C061A0WJG&message=1446567461.000002"
    )

    rerun = source_ingest(tenant_id=tenant_id, source_id=zip_id)
    assert rerun.status == IngestionRun.Status.SUCCEEDED
    assert (rerun.embedded, rerun.created, rerun.updated, rerun.deleted) == (0, 0, 0, 0)
    assert rerun.unchanged == len(zip_rows)
    assert _rows(tenant_id, zip_id).keys() == zip_rows.keys()


# -- synthetic exports -----------------------------------------------------------------------------


def test_thread_with_replies_in_two_day_files_is_one_row(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    parent = _ts(datetime(2024, 3, 4, 23, 50, tzinfo=UTC))
    reply1 = _ts(datetime(2024, 3, 4, 23, 55, tzinfo=UTC))
    loose = _ts(datetime(2024, 3, 4, 23, 58, tzinfo=UTC))
    reply2 = _ts(datetime(2024, 3, 5, 0, 10, tzinfo=UTC))
    reply3 = _ts(datetime(2024, 3, 5, 9, 0, 30, tzinfo=UTC), seq=7)
    root = _write_export(
        tmp_path / "export",
        {
            "eng/2024-03-04": [
                {
                    "type": "message",
                    "subtype": "channel_join",
                    "user": "U3",
                    "text": "<@U3> has joined the channel",
                    "ts": _ts(datetime(2024, 3, 4, 23, 40, tzinfo=UTC)),
                },
                {
                    "type": "message",
                    "user": "U1",
                    "text": "Deploy is failing on staging\nlogs attached",
                    "ts": parent,
                    "thread_ts": parent,
                    "reply_count": 3,
                    "reactions": [{"name": "eyes", "users": ["U2", "U3"], "count": 2}],
                },
                {
                    "type": "message",
                    "user": "U2",
                    "text": "<@U1> see <https://ci.example.com/run/9|the CI run>",
                    "ts": reply1,
                    "thread_ts": parent,
                    "parent_user_id": "U1",
                },
                {"type": "message", "user": "U3", "text": "lunch anyone?", "ts": loose},
            ],
            "eng/2024-03-05": [
                {
                    "type": "message",
                    "user": "U1",
                    "text": "fixed by &lt;pinning&gt; the image",
                    "ts": reply2,
                    "thread_ts": parent,
                    "parent_user_id": "U1",
                },
                {
                    "type": "message",
                    "user": "U3",
                    "text": "",
                    "ts": reply3,
                    "thread_ts": parent,
                    "files": [{"id": "F1", "name": "postmortem.md"}],
                    "reactions": [{"name": "+1", "users": ["U1"], "count": 1}],
                },
                {"type": "message", "user": "U2", "text": "", "ts": _ts(datetime(2024, 3, 5, 9, 5, tzinfo=UTC))},
            ],
        },
    )
    source_id, run = _ingest(tenant_id, {"path": str(root), "workspace_url": "https://acme.slack.com/"})
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    rows = {eid: r for eid, r in _rows(tenant_id, source_id).items() if r["kind"] != "burst"}
    assert set(rows) == {f"C1:{parent}", f"C1:conv:{loose}"}  # the empty, file-less message is dropped

    thread = rows[f"C1:{parent}"]
    assert thread["kind"] == "thread"
    assert thread["title"] == "#eng: Deploy is failing on staging"
    assert thread["url"] == f"https://acme.slack.com/archives/C1/p{parent.replace('.', '')}"
    assert thread["content"].splitlines() == [
        "2024-03-04 23:50 Ana Lima: Deploy is failing on staging",
        "  logs attached",
        "2024-03-04 23:55 Bob Stone: @Ana Lima see the CI run (https://ci.example.com/run/9)",
        "2024-03-05 00:10 Ana Lima: fixed by <pinning> the image",
        "2024-03-05 09:00 cy.w: [file: postmortem.md]",
    ]
    # What is embedded is the thread's distillation (sources.connectors.slack.distill): the asker's own fix resolves it.
    assert thread["text"].startswith("#eng\nQuestion: Deploy is failing on staging logs attached\n")
    assert "Resolution: fixed by <pinning> the image" in thread["text"]
    assert thread["metadata"]["distilled"]["resolution_by"] == "Ana Lima"
    meta = thread["metadata"]
    assert meta["reply_count"] == 3
    assert meta["message_count"] == 4
    assert meta["thread_ts"] == parent
    assert meta["authors"] == ["Ana Lima", "Bob Stone", "cy.w"]
    assert meta["participants"] == ["Ana Lima", "Bob Stone", "cy.w"]
    assert meta["reactions"] == {"eyes": 2, "+1": 1}
    assert meta["reaction_count"] == 3
    assert meta["files"] == ["postmortem.md"]
    assert (meta["first_ts"], meta["last_ts"]) == (parent, reply3)
    assert thread["created_at"] == datetime(2024, 3, 4, 23, 50, 0, 1, tzinfo=UTC)  # ts .000001
    assert thread["updated_at"] == datetime(2024, 3, 5, 9, 0, 30, 7, tzinfo=UTC)
    assert thread["principals"] == []

    # The message posted between replies is not part of the thread.
    conversation = rows[f"C1:conv:{loose}"]
    assert conversation["content"] == "2024-03-04 23:58 cy.w: lunch anyone?"
    assert conversation["metadata"]["reply_count"] == 0
    assert conversation["metadata"]["thread_ts"] is None


def test_conversation_gap_splits_and_merges(tmp_path):
    start = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
    minutes = [0, 10, 40, 71, 200]  # gaps 10, 30, 31, 129 minutes
    messages = [
        {"type": "message", "user": "U1", "text": f"message {i}", "ts": _ts(start + timedelta(minutes=m))}
        for i, m in enumerate(minutes)
    ]
    root = _write_export(tmp_path / "export", {"eng/2024-05-01": messages})

    def groups(config: dict[str, Any]) -> list[int]:
        report = IngestReport()
        rows = list(SlackExportConnector({"path": str(root), **config}).iter_rows(report))
        assert report.total == 1 and report.skipped == []
        return [r.metadata["message_count"] for r in rows]

    assert groups({}) == [3, 1, 1]  # a gap of exactly 30 minutes stays in one conversation
    assert groups({"conversation_gap_minutes": 31}) == [4, 1]
    assert groups({"conversation_gap_minutes": 180}) == [5]
    # Same input, same rows: ids and hashes are stable across runs.
    first = list(SlackExportConnector({"path": str(root)}).iter_rows(IngestReport()))
    second = list(SlackExportConnector({"path": str(root)}).iter_rows(IngestReport()))
    assert [(r.external_id, r.content_hash()) for r in first] == [(r.external_id, r.content_hash()) for r in second]


def test_private_channel_principals_and_channel_allow_list(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    ts = _ts(datetime(2024, 6, 1, 12, 0, tzinfo=UTC))
    root = _write_export(
        tmp_path / "export",
        {
            "eng/2024-06-01": [{"type": "message", "user": "U1", "text": "public hello", "ts": ts}],
            "secret/2024-06-01": [{"type": "message", "user": "U2", "text": "see <#C1|eng>", "ts": ts}],
            "random/2024-06-01": [{"type": "message", "user": "U2", "text": "not wanted", "ts": ts}],
        },
        channels=[{"id": "C1", "name": "eng", "members": ["U1"]}, {"id": "C3", "name": "random", "members": []}],
        groups=[{"id": "G9", "name": "secret", "is_private": True, "members": ["U1", "U2"]}],
    )
    source_id, run = _ingest(tenant_id, {"path": str(root), "channels": ["#eng", "secret"]})
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    rows = _rows(tenant_id, source_id)
    assert set(rows) == {f"C1:conv:{ts}", f"G9:conv:{ts}"}
    assert rows[f"C1:conv:{ts}"]["principals"] == []
    assert rows[f"G9:conv:{ts}"]["principals"] == ["slack:U1", "slack:U2"]
    assert rows[f"G9:conv:{ts}"]["metadata"]["private"] is True
    assert rows[f"G9:conv:{ts}"]["content"] == "2024-06-01 12:00 Bob Stone: see #eng"


# -- bad input -------------------------------------------------------------------------------------


def test_missing_path_fails_naming_the_path(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    missing = tmp_path / "no-such-export.zip"
    _, run = _ingest(tenant_id, {"path": str(missing)})
    assert run.status == IngestionRun.Status.FAILED
    assert str(missing) in run.error
    assert "does not exist" in run.error


def test_folder_without_channels_json_fails(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    (tmp_path / "not-an-export").mkdir()
    _, run = _ingest(tenant_id, {"path": str(tmp_path / "not-an-export")})
    assert run.status == IngestionRun.Status.FAILED
    assert str(tmp_path / "not-an-export") in run.error
    assert "channels.json" in run.error


def test_malformed_day_files_are_skipped_and_other_days_ingested(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    good = _ts(datetime(2024, 3, 1, 10, 0, tzinfo=UTC))
    root = _write_export(
        tmp_path / "export",
        {
            "eng/2024-03-01": [{"type": "message", "user": "U1", "text": "still here", "ts": good}],
            "eng/2024-03-02": '[{"type": "message", "text": "cut off',
            "eng/2024-03-03": '{"type": "message"}',
        },
    )
    source_id, run = _ingest(tenant_id, {"path": str(root)})
    assert run.status == IngestionRun.Status.PARTIAL
    assert [item["item"] for item in run.skipped_items] == ["eng/2024-03-02.json", "eng/2024-03-03.json"]
    assert all(item["reason"].startswith("invalid JSON: ") for item in run.skipped_items)
    assert "expected a list of messages, got dict" in run.skipped_items[1]["reason"]
    rows = _rows(tenant_id, source_id)
    assert list(rows) == [f"C1:conv:{good}"]
    assert rows[f"C1:conv:{good}"]["content"] == "2024-03-01 10:00 Ana Lima: still here"


@pytest.mark.parametrize(
    ("broken_file", "broken_text"),
    [("channels.json", '[{"id": "C1", "name": "eng"'), ("users.json", "not json at all")],
)
def test_malformed_top_level_file_fails_and_keeps_earlier_rows(make_tenant, tmp_path, broken_file, broken_text):
    tenant_id = make_tenant("acme").tenant.pk
    messages = [
        {"type": "message", "user": "U1", "text": "first", "ts": _ts(datetime(2024, 3, 1, 10, 0, tzinfo=UTC))},
        {"type": "message", "user": "U2", "text": "second", "ts": _ts(datetime(2024, 3, 1, 15, 0, tzinfo=UTC))},
    ]
    good = _write_export(tmp_path / "good", {"eng/2024-03-01": messages})
    source_id, run = _ingest(tenant_id, {"path": str(good)})
    assert run.status == IngestionRun.Status.SUCCEEDED
    before = _rows(tenant_id, source_id)
    assert len(before) == 2

    broken = shutil.copytree(good, tmp_path / "broken")
    (broken / broken_file).write_text(broken_text)
    source_update_config(tenant_id=tenant_id, source_id=source_id, config={"path": str(broken)})
    failed = source_ingest(tenant_id=tenant_id, source_id=source_id)
    assert failed.status == IngestionRun.Status.FAILED
    assert broken_file in failed.error and "not valid JSON" in failed.error
    assert str(broken) in failed.error
    assert _rows(tenant_id, source_id).keys() == before.keys()


def test_file_that_is_not_a_zip_fails(make_tenant, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    bogus = tmp_path / "export.zip"
    bogus.write_text("this is not a zip archive")
    _, run = _ingest(tenant_id, {"path": str(bogus)})
    assert run.status == IngestionRun.Status.FAILED
    assert str(bogus) in run.error and "ZIP" in run.error
