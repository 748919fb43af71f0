"""The live Slack connector end to end: Web API backfill and Socket Mode events, on real PostgreSQL.

A local Slack (``tests/sources/slack_server.py``) speaks the Web API and Socket Mode on
loopback; the connector reaches it through ``slack_sdk`` with a base URL. Its state is built
from real Events API message events of two days of the Clojurians community
(``shared/corpora/slack-events-clojurians``): the backfill sees the workspace as it was after
the first day; the second day's events are then applied to the workspace and sent, one
envelope each, over Socket Mode to ``manage.py slack_listen``. The Celery task runs eagerly,
inside the listener's handler thread, right after the event's claim commits; so the measured
latency is Socket Mode -> ack -> claim -> task (Web API re-fetch, embedding, write) -> commit.

The corpus replaced the text of every message later edited or deleted with the placeholder
"[message text edited or deleted]" (the edits carry the real new text). So edits are checked
as placeholder -> real text, the corpus deletions as "that message's line is gone", and one
deletion of a message with real text is built in the corpus's own ``message_deleted`` shape.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery.signals import task_postrun
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from kbportal.tenancy import tenant_context
from search.retrieval import hybrid_search
from sources.connectors.base import ConnectorError
from sources.connectors.slack.events import parse_event
from sources.embeddings import get_embedder
from sources.models import Document, ExternalIdentity, SlackEventSeen
from sources.selectors import QueryScope, scope_for_operator
from sources.services import source_create, source_ingest
from sources.tasks import slack_refresh_thread
from tests.sources.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack, SlackWorld

pytestmark = pytest.mark.slow

MOUNT, REFRAME, OFFTOPIC, YADA, JOBS, UNREPL = (
    "C0H7M5HFE",
    "C073DKH9P",
    "C03RZGPG3",
    "C0702A7SB",
    "C05006WDW",
    "C4C63FWP5",
)
BEGINNERS, CLOJURE = "C053AK3F9", "C03S1KBA2"
LIVE_CHANNELS = [MOUNT, REFRAME, OFFTOPIC, YADA, JOBS, UNREPL]
BACKFILL_CHANNELS = [*LIVE_CHANNELS, BEGINNERS, CLOJURE]
PRIVATE = YADA  # Clojurians channels are public; the test declares this one private
PLACEHOLDER = "[message text edited or deleted]"
# Subtypes the connector drops as channel noise (and the edit/delete/replied notifications).
NOISE = {
    "channel_join",
    "channel_leave",
    "channel_topic",
    "channel_purpose",
    "channel_name",
    "tombstone",
    "message_changed",
    "message_deleted",
    "message_replied",
    "pinned_item",
    "bot_add",
}


@dataclass
class Corpus:
    channels: dict[str, str]
    users: dict[str, dict[str, Any]]
    day1: list[tuple[str, dict[str, Any]]]  # (event_id, event), in event time order
    day2: list[tuple[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def corpus(shared_dir: Path) -> Corpus:
    root = shared_dir / "corpora" / "slack-events-clojurians"
    channels = {c["id"]: c["name"] for c in json.loads((root / "channels.json").read_text())}
    days = []
    users: dict[str, dict[str, Any]] = {}
    for day in ("2018-02-08", "2018-02-09"):
        events = []
        for number, line in enumerate((root / f"{day}.jsonl").read_text().splitlines()):
            event = json.loads(line)
            # The log has no event ids (they belong to the Events API envelope): one per line.
            events.append((f"Ev{day.replace('-', '')[4:]}{number:05d}", event))
            if event.get("user_profile") and event.get("user"):
                users[event["user"]] = event["user_profile"]
        events.sort(key=lambda item: float(item[1].get("event_ts") or item[1]["ts"]))
        days.append(events)
    return Corpus(channels=channels, users=users, day1=days[0], day2=days[1])


def _authors(corpus: Corpus, channel: str) -> list[str]:
    return sorted({e["user"] for _, e in corpus.day1 + corpus.day2 if e.get("channel") == channel and e.get("user")})


@pytest.fixture
def slack(corpus: Corpus) -> Iterator[FakeSlack]:
    world = SlackWorld(channels=corpus.channels, users=corpus.users, private={PRIVATE: _authors(corpus, PRIVATE)})
    for _, event in corpus.day1:
        world.apply(event)
    server = FakeSlack(world)
    yield server
    server.close()


@pytest.fixture
def live_db(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Database access whose writes commit, so the listener's and the handlers' threads see them.

    Like the other committed fixtures of the suite, each test writes under its own tenant and
    leaves its rows for the session's test database to take away.
    """
    with django_db_blocker.unblock():
        try:
            yield
        finally:
            connections.close_all()


@pytest.fixture
def tenant(live_db, request):
    from projects.services import tenant_onboard

    slug = "sl-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:10]
    return tenant_onboard(name=slug, slug=slug, admin_username=f"{slug}-admin", admin_password="pw-" + slug)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    conf = slack_refresh_thread.app.conf
    before = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = before


@pytest.fixture
def refreshes() -> Iterator[list[tuple[float, tuple, str]]]:
    """(monotonic time, args, state) of every finished ``sources.slack_refresh_thread`` run."""
    done: list[tuple[float, tuple, str]] = []

    def record(sender=None, task=None, args=None, state=None, **kwargs):
        if task is not None and task.name == "sources.slack_refresh_thread":
            done.append((time.monotonic(), tuple(args or ()), state))

    task_postrun.connect(record, weak=False)
    yield done
    task_postrun.disconnect(record)


def _config(server: FakeSlack, channels: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "token": BOT_TOKEN,
        "app_token": APP_TOKEN,
        "base_url": server.base_url,
        "channels": channels,
        "workspace_url": "https://clojurians.slack.com",
        "page_size": 50,
        "allow_private_network": True,  # the fake Slack listens on loopback (kbportal.netcheck)
        **extra,
    }


def _source(tenant, server: FakeSlack, channels: list[str], **extra: Any):
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="slack",
        name="Clojurians",
        slug="clojurians",
        config=_config(server, channels, **extra),
        project_ids=[tenant.project.pk],
    )


def _rows(tenant, source) -> dict[str, Document]:
    with tenant_context(tenant.tenant.pk):
        return {d.external_id: d for d in Document.objects.filter(source=source)}


def _scope(tenant, principals: tuple[str, ...] = ()) -> QueryScope:
    scope = scope_for_operator(tenant_slug=tenant.tenant.slug)
    return QueryScope(**{**scope.__dict__, "principals": principals})


def _search_contents(tenant, query: str, principals: tuple[str, ...] = ()) -> list[str]:
    result = hybrid_search(query, _scope(tenant, principals), limit=10, expand=False)
    return [hit.content for hit in result.hits]


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextmanager
def _listening(server: FakeSlack, tenant, source) -> Iterator[io.StringIO]:
    """``manage.py slack_listen`` on a thread, until the block ends."""
    stop, out, errors = threading.Event(), io.StringIO(), []

    def run() -> None:
        try:
            call_command("slack_listen", "--source", f"{tenant.tenant.slug}/{source.slug}", stop_event=stop, stdout=out)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait(lambda: "listening" in out.getvalue() or bool(errors), 30, "the listener to connect")
    assert not errors, errors
    try:
        yield out
    finally:
        stop.set()
        thread.join(30)
        assert not errors, errors


def _kept(message: dict[str, Any]) -> bool:
    if message.get("subtype") in NOISE:
        return False
    return bool(
        (message.get("text") or "").strip() or message.get("files") or message.get("file") or message.get("attachments")
    )


def _expected_rows(world: SlackWorld, channels: list[str]) -> tuple[int, int, int]:
    """(thread rows, conversation rows, kept messages) computed straight from the workspace state."""
    threads = conversations = kept = 0
    for channel in channels:
        messages = [m for m in world.messages[channel].values() if _kept(m)]
        kept += len(messages)
        thread_ids = {m["thread_ts"] for m in messages if m.get("thread_ts") and m["thread_ts"] != m["ts"]}
        threads += len(thread_ids)
        loose = sorted(
            float(m["ts"])
            for m in messages
            if not m.get("thread_ts") or (m["ts"] == m["thread_ts"] and m["ts"] not in thread_ids)
        )
        conversations += sum(1 for i, ts in enumerate(loose) if i == 0 or ts - loose[i - 1] > 30 * 60)
    return threads, conversations, kept


def _line_prefix(ts: str, name: str) -> str:
    return f"{datetime.fromtimestamp(float(ts), tz=UTC):%Y-%m-%d %H:%M} {name}: "


def test_backfill_threads_conversations_bots_private_channel_and_429(tenant, slack, corpus, capsys):
    slack.rate_limit("conversations.history", retry_after=1)
    slack.rate_limit("conversations.replies", retry_after=1)
    # One private-channel member's profile shows an email (a token with users:read.email).
    shown = _authors(corpus, PRIVATE)[0]
    slack.world.users[shown] = {**slack.world.users.get(shown, {}), "email": "Shown.Member@clojurians.test"}
    source = _source(tenant, slack, BACKFILL_CHANNELS)
    get_embedder().embed(["load the model before the clock starts"])
    started = time.perf_counter()
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    seconds = time.perf_counter() - started
    assert (run.status, run.error) == ("succeeded", "")
    rows = _rows(tenant, source)

    # Counts computed from the workspace state, not by the connector's code.
    threads, conversations, kept = _expected_rows(slack.world, BACKFILL_CHANNELS)
    kinds = [d.kind for d in rows.values()]
    assert (kinds.count("thread"), kinds.count("conversation")) == (threads, conversations)
    assert threads >= 10 and conversations >= 30
    assert sum(d.metadata["message_count"] for d in rows.values() if d.kind != "burst") == kept
    assert run.seen == len(rows) == run.created == run.embedded

    # HTTP 429 honoured: the same call came back no sooner than Retry-After, and nothing was dropped.
    waited = 0.0
    for method in ("conversations.history", "conversations.replies"):
        calls = slack.calls_of(method)
        limited = next(i for i, c in enumerate(calls) if c.status == 429)
        retry = calls[limited + 1]
        assert retry.status == 200 and retry.params == calls[limited].params
        assert retry.at - calls[limited].at >= 1.0
        waited += retry.at - calls[limited].at

    # A thread from the first day: the whole thread in one row, parent first, with its people.
    parent_ts = "1518086076.000239"  # #beginners: a project.clj dependency question, 5 replies
    thread = rows[f"{BEGINNERS}:{parent_ts}"]
    replies = [m for m in slack.world.messages[BEGINNERS].values() if m.get("thread_ts") == parent_ts]
    parent = slack.world.messages[BEGINNERS][parent_ts]
    assert thread.kind == "thread" and thread.metadata["reply_count"] == len(replies) - 1 >= 1
    assert thread.content.splitlines()[0].endswith(parent["text"].splitlines()[0])
    names = {corpus.users.get(m["user"], {}).get("real_name") or m["user"] for m in replies}
    assert set(thread.metadata["participants"]) == names
    assert thread.url == f"https://clojurians.slack.com/archives/{BEGINNERS}/p{parent_ts.replace('.', '')}"
    last = max(replies, key=lambda m: float(m["ts"]))
    assert thread.updated_at.timestamp() == pytest.approx(float(last["ts"]), abs=1e-3)

    # Bot messages kept and marked; bots are not people; joins are not content.
    bot_rows = [d for d in rows.values() if d.metadata.get("bot_message_count")]
    assert {b for d in bot_rows for b in d.metadata["bots"]} >= {"clojurebot"}
    assert all("clojurebot" not in d.metadata["participants"] for d in bot_rows)
    assert any("1/21600" in d.content for d in bot_rows)  # clojurebot's evaluation result
    assert not any("has joined the channel" in d.content for d in rows.values())

    # The private channel's rows carry its members, in the export connector's format.
    members = [f"slack:{user}" for user in _authors(corpus, PRIVATE)]
    private_rows = [d for d in rows.values() if d.metadata["channel_id"] == PRIVATE]
    assert private_rows and all(d.principals == members for d in private_rows)
    assert all(d.principals == [] for d in rows.values() if d.metadata["channel_id"] != PRIVATE)
    # A message's burst and its conversation share their opening, and search returns one of them,
    # so the probe asks for any private row holding it (rows in a fixed order, not table order).
    probe_row = min(private_rows, key=lambda d: d.external_id)
    probe = probe_row.title.split(": ", 1)[1][:60]
    holding = {d.content for d in private_rows if probe in d.content}
    assert not holding & set(_search_contents(tenant, probe))
    assert holding & set(_search_contents(tenant, probe, principals=(members[0],)))
    # The private channel's members are the source's identities, with what users.info shows.
    with tenant_context(tenant.tenant.pk):
        identities = {i.principal: i for i in ExternalIdentity.objects.filter(source=source)}
    assert set(identities) == set(members)
    assert identities[f"slack:{shown}"].email == "shown.member@clojurians.test"
    assert all(i.email == "" for p, i in identities.items() if p != f"slack:{shown}")

    print(
        f"\nslack backfill: {len(rows)} rows ({kept} messages) from {len(BACKFILL_CHANNELS)} channels, "
        f"{len(slack.calls)} Web API calls, in {seconds:.2f} s = {len(rows) / seconds:.1f} rows/s; "
        f"without the {waited:.1f} s of Retry-After waits {len(rows) / (seconds - waited):.1f} rows/s "
        f"({kept / (seconds - waited):.0f} messages/s)"
    )


def _replay(
    slack: FakeSlack, events: list[tuple[str, dict[str, Any]]], refreshes: list, channels: list[str]
) -> dict[str, float]:
    """Apply each event to the workspace, send it, and wait for every refresh it queues.

    Returns event id -> seconds from sending the envelope to its refresh's commit, for new
    thread replies (one at a time, so the figure is not queueing behind other events).
    """
    latencies: dict[str, float] = {}
    expected = len(refreshes)
    for event_id, event in events:
        slack.world.apply(event)
        if parse_event({"event_id": event_id, "event": event}, channels=channels) is None:
            slack.wait_acked(slack.push(event, event_id=event_id))
            continue
        expected += 1
        sent = time.monotonic()
        slack.wait_acked(slack.push(event, event_id=event_id))
        _wait(lambda n=expected: len(refreshes) >= n, 30, f"the refresh for {event_id}")
        if not event.get("subtype") and event.get("thread_ts") not in (None, event["ts"]):
            latencies[event_id] = refreshes[expected - 1][0] - sent
    return latencies


def test_live_events_refresh_threads_edits_and_deletions(tenant, slack, corpus, eager_celery, refreshes, capsys):
    source = _source(tenant, slack, LIVE_CHANNELS)
    assert source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk).status == "succeeded"
    before = _rows(tenant, source)
    live = [(i, e) for i, e in corpus.day2 if e.get("channel") in LIVE_CHANNELS]
    real_text_deleted = _real_text_deletion(slack.world, corpus)

    with _listening(slack, tenant, source) as out:
        latencies = _replay(slack, live + [real_text_deleted], refreshes, LIVE_CHANNELS)
    assert "applied" in out.getvalue()
    assert refreshes and all(state == "SUCCESS" for _, _, state in refreshes)
    rows = _rows(tenant, source)

    # The workspace and the rows agree after the whole day: same counts as a fresh backfill would give.
    threads, conversations, kept = _expected_rows(slack.world, LIVE_CHANNELS)
    kinds = [d.kind for d in rows.values()]
    assert (kinds.count("thread"), kinds.count("conversation")) == (threads, conversations)
    assert sum(d.metadata["message_count"] for d in rows.values() if d.kind != "burst") == kept

    # A reply on day 2 to a day-1 thread (whose parent predates the corpus): the same row now
    # holds the reply (later edited), its author and the new last activity.
    thread_id = f"{REFRAME}:1517881601.000313"
    thread_before, thread = before[thread_id], rows[thread_id]
    assert "U051MTYAB" not in thread_before.metadata["participants"]
    assert "U051MTYAB" in thread.metadata["participants"]
    assert "PR to add it to `/doc/ExternalResources.md`" in thread.content
    assert thread.metadata["message_count"] > thread_before.metadata["message_count"]
    replies = [m for m in slack.world.messages[REFRAME].values() if m.get("thread_ts") == "1517881601.000313"]
    assert thread.updated_at.timestamp() == pytest.approx(max(float(m["ts"]) for m in replies), abs=1e-3)
    assert thread.pk == thread_before.pk  # the same row, rewritten

    # A first reply turns a loose message into a thread: it leaves its conversation row.
    parent_text = "you could use `(mount/start-with-args args)`"
    mount_thread = rows[f"{MOUNT}:1518113342.000774"]
    assert f"{MOUNT}:1518113342.000774" not in before and parent_text in mount_thread.content.split("\n2018-")[0]
    assert "the motivation would be to easier see the dependencies" in mount_thread.content
    assert any(parent_text in d.content for d in before.values() if d.kind == "conversation")
    assert not any(parent_text in d.content for d in rows.values() if d.kind == "conversation")

    # An edit (placeholder -> real text): the new text is searchable, the old line is gone.
    edit = next(
        e for _, e in live if e.get("subtype") == "message_changed" and e["message"]["ts"] == "1518171654.000163"
    )
    new_text, edited = edit["message"]["text"], edit["message"]
    holder = next(d for d in rows.values() if new_text.splitlines()[0] in d.content and d.kind != "burst")
    prefix = _line_prefix(edited["ts"], corpus.users.get(edited["user"], {}).get("real_name") or edited["user"])
    assert prefix + new_text.splitlines()[0] in holder.content
    assert prefix + PLACEHOLDER not in holder.content
    assert holder.content in _search_contents(tenant, 'are you indicating "composability"')

    # Deletions from the corpus: each deleted message's line is gone from every row.
    for _, event in live:
        if event.get("subtype") == "message_deleted":
            gone = event["previous_message"]
            prefix = _line_prefix(gone["ts"], corpus.users.get(gone["user"], {}).get("real_name") or gone["user"])
            assert not any(prefix + PLACEHOLDER in d.content for d in rows.values()), prefix

    # A thread whose only reply was deleted is no thread any more; its parent is back in a conversation.
    assert f"{JOBS}:1518123776.000381" not in rows
    assert any("interested DM Me" in d.content and d.kind == "conversation" for d in rows.values())

    # A deleted message with real text is never cited again.
    deleted_text = real_text_deleted[1]["previous_message"]["text"]
    assert any(deleted_text in d.content for d in before.values())
    assert not any(deleted_text in d.content for d in rows.values())
    assert not any(deleted_text in c for c in _search_contents(tenant, deleted_text))

    # Every envelope was acked, each within a second.
    assert set(slack.acks) == set(slack.sent)
    assert max(slack.acks[e] - slack.sent[e] for e in slack.sent) < 1.0

    values = sorted(latencies.values())
    assert len(values) >= 20
    p50, p95 = statistics.median(values), values[max(0, round(0.95 * len(values)) - 1)]
    print(
        f"\nslack live: {len(live) + 1} events replayed, {len(refreshes)} thread refreshes; event -> searchable "
        f"over {len(values)} replies (Socket Mode -> ack -> eager task -> commit): p50 {p50 * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms"
    )
    assert p95 < 10.0


def _real_text_deletion(world: SlackWorld, corpus: Corpus) -> tuple[str, dict[str, Any]]:
    """A ``message_deleted`` event, in the corpus's own shape, for a day-1 #off-topic message with real text."""
    template = next(e for _, e in corpus.day2 if e.get("subtype") == "message_deleted" and e["channel"] == OFFTOPIC)
    target = next(
        m
        for m in sorted(world.messages[OFFTOPIC].values(), key=lambda m: float(m["ts"]))
        if not m.get("subtype")
        and not m.get("thread_ts")
        and len(m.get("text", "")) > 40
        and "<" not in m["text"]
        and "&" not in m["text"]
        and PLACEHOLDER not in m["text"]
    )
    event = copy.deepcopy(template)
    event["deleted_ts"] = target["ts"]
    event["previous_message"] = {k: target[k] for k in ("type", "user", "text", "ts")}
    event["ts"] = event["event_ts"] = "1518220000.000100"  # after the second day's last event
    return "EvSYNTHDEL01", event


def test_duplicate_event_is_applied_once_even_after_a_restart(tenant, slack, corpus, eager_celery, refreshes):
    source = _source(tenant, slack, LIVE_CHANNELS)
    assert source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk).status == "succeeded"
    event_id, reply = next(
        (i, e) for i, e in corpus.day2 if e.get("channel") == MOUNT and e.get("thread_ts") and not e.get("subtype")
    )
    slack.world.apply(reply)
    replies_calls = lambda: len(slack.calls_of("conversations.replies", ts=reply["thread_ts"]))  # noqa: E731
    calls_before = replies_calls()

    with _listening(slack, tenant, source) as out:
        first = slack.push(reply, event_id=event_id)
        _wait(lambda: len(refreshes) == 1, 30, "the first refresh")
        again = slack.push(reply, event_id=event_id, retry_attempt=1)  # Slack's redelivery: same event id
        slack.wait_acked(first), slack.wait_acked(again)
        time.sleep(0.5)
    assert "duplicates 1" in out.getvalue()
    assert len(refreshes) == 1 and replies_calls() == calls_before + 1

    # A new listener has an empty in-memory set: the database guard refuses the event.
    with _listening(slack, tenant, source) as out:
        slack.wait_acked(slack.push(reply, event_id=event_id, retry_attempt=2))
        time.sleep(0.5)
    assert "applied 0, duplicates 1" in out.getvalue()
    assert len(refreshes) == 1 and replies_calls() == calls_before + 1
    with tenant_context(tenant.tenant.pk):
        assert list(SlackEventSeen.objects.filter(source=source).values_list("event_id", flat=True)) == [event_id]
    row = _rows(tenant, source)[f"{MOUNT}:{reply['thread_ts']}"]
    assert row.content.count(reply["text"].splitlines()[0]) == 1


def test_bad_token_is_redacted_and_an_exhausted_rate_limit_keeps_earlier_rows(tenant, slack):
    source = _source(tenant, slack, [MOUNT, JOBS], rate_limit_retries=1)
    assert source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk).status == "succeeded"
    kept = set(_rows(tenant, source))

    slack.rate_limit("conversations.history", retry_after=1, times=3)
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "failed" and "rate limited (HTTP 429)" in run.error
    assert set(_rows(tenant, source)) == kept  # a failed run deletes nothing

    with tenant_context(tenant.tenant.pk):
        from sources.models import DataSource

        DataSource.objects.filter(pk=source.pk).update(config=_config(slack, [MOUNT], token="xoxb-9-WRONGSECRET"))
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    assert run.status == "failed" and "auth.test failed: invalid_auth" in run.error
    assert "WRONGSECRET" not in run.error and set(_rows(tenant, source)) == kept

    with pytest.raises(ConnectorError, match=r"channels: Value error, expected channel ids such as C0123ABCD"):
        source_create(tenant_id=tenant.tenant.pk, kind="slack", name="Bad", config=_config(slack, ["#mount"]))
    no_app = source_create(
        tenant_id=tenant.tenant.pk,
        kind="slack",
        name="No app token",
        config={k: v for k, v in _config(slack, [MOUNT]).items() if k != "app_token"},
    )
    with pytest.raises(CommandError, match="needs the app-level token"):
        call_command("slack_listen", "--source", f"{tenant.tenant.slug}/{no_app.slug}")
    with pytest.raises(CommandError, match="slack_listen needs kind 'slack'"):
        other = source_create(
            tenant_id=tenant.tenant.pk, kind="jsonl", name="Other", config={"path": "/nonexistent.jsonl"}
        )
        call_command("slack_listen", "--source", f"{tenant.tenant.slug}/{other.slug}")
