"""Thread distillation and bursts on the real Slack corpora, through the real ingestion service.

- Clojurians (``shared/corpora/slack-events-clojurians``), read by the live ``slack`` connector
  from the loopback Slack of ``tests/sources/slack_server.py``: a #beginners thread checked by
  hand (a project.clj dependency clash; the asker finally posts the ``:exclusions`` that fixed
  it), its distillation, its bursts, and a deletion applied through the live path.
- Houston (``shared/corpora/slack-export-houston``, no threads): bursts inside conversations,
  acknowledgements never bursts, and an idempotent second run.
- The LLM path against the loopback OpenAI-compatible server (``tests/llm_server.py``): one call
  per thread, reused on the next run, and the rules when the server answers garbage.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.slack.distill import is_acknowledgement
from sources.connectors.slack.events import parse_event
from sources.models import Document
from sources.services import slack_event_apply, slack_thread_refresh, source_create, source_ingest
from tests.llm_server import FakeOpenAIServer
from tests.sources.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack, SlackWorld
from tests.sources.test_slack_live import Corpus

pytestmark = pytest.mark.slow

BEGINNERS = "C053AK3F9"
THREAD_TS = "1518086076.000239"  # "I hava a dependency in my project.clj ... NoSuchMethodError"
FIX_TS = "1518097592.000481"  # the asker: "Fixed it finally." with the :exclusions vector
ASKER, HELPER = "U76D9RZRR", "U04V4KLKC"


@pytest.fixture(scope="module")
def corpus(shared_dir: Path) -> Corpus:
    """The two days of Clojurians events, one event id per line (as ``test_slack_live`` reads them)."""
    root = shared_dir / "corpora" / "slack-events-clojurians"
    channels = {c["id"]: c["name"] for c in json.loads((root / "channels.json").read_text())}
    users: dict[str, dict[str, Any]] = {}
    days = []
    for day in ("2018-02-08", "2018-02-09"):
        events = []
        for number, line in enumerate((root / f"{day}.jsonl").read_text().splitlines()):
            event = json.loads(line)
            events.append((f"Ev{day.replace('-', '')[4:]}{number:05d}", event))
            if event.get("user_profile") and event.get("user"):
                users[event["user"]] = event["user_profile"]
        events.sort(key=lambda item: float(item[1].get("event_ts") or item[1]["ts"]))
        days.append(events)
    return Corpus(channels=channels, users=users, day1=days[0], day2=days[1])


@pytest.fixture
def slack(corpus: Corpus) -> FakeSlack:
    world = SlackWorld(channels=corpus.channels, users=corpus.users)
    for _, event in corpus.day1:
        world.apply(event)
    server = FakeSlack(world)
    yield server
    server.close()


def _name(corpus, user: str) -> str:
    return corpus.users.get(user, {}).get("real_name") or user


def _slack_source(tenant_id: int, server: FakeSlack, channels: list[str], slug: str = "clojurians"):
    config = {
        "token": BOT_TOKEN,
        "app_token": APP_TOKEN,
        "base_url": server.base_url,
        "channels": channels,
        "workspace_url": "https://clojurians.slack.com",
        "allow_private_network": True,
    }
    return source_create(tenant_id=tenant_id, kind="slack", name=slug, slug=slug, config=config)


def _rows(tenant_id: int, source_id: int) -> dict[str, Document]:
    with tenant_context(tenant_id):
        return {d.external_id: d for d in Document.objects.filter(source_id=source_id).select_related("parent")}


def _bursts_of(rows: dict[str, Document], parent_id: str) -> dict[str, Document]:
    return {eid: d for eid, d in rows.items() if d.kind == "burst" and d.parent_external_id == parent_id}


# -- the hand-checked Clojurians thread ------------------------------------------------------------


def test_real_thread_distillation_and_bursts(make_tenant, slack, corpus):
    tenant_id = make_tenant("acme").tenant.pk
    source = _slack_source(tenant_id, slack, [BEGINNERS])
    run = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert (run.status, run.error) == ("succeeded", "")
    rows = _rows(tenant_id, source.pk)
    thread = rows[f"{BEGINNERS}:{THREAD_TS}"]
    parent = slack.world.messages[BEGINNERS][THREAD_TS]
    fix = slack.world.messages[BEGINNERS][FIX_TS]
    assert fix["user"] == parent["user"] == ASKER  # checked by hand: the asker posts the fix

    distilled = thread.metadata["distilled"]
    assert distilled["method"] == "rules" and len(distilled["key"]) == 64
    # The question is the root message, cleaned (whitespace collapsed), naming the error.
    assert distilled["question"].startswith("I hava a dependency in my project.clj: [org.clojure/clojure")
    assert "java.lang.NoSuchMethodError" in distilled["question"]
    # The resolution is the asker's own fix, not the earlier "Thanks! ... didn't quite work out".
    assert distilled["resolution"].startswith("Fixed it finally. [ring/ring-json")
    assert ":exclusions" in distilled["resolution"]
    assert (distilled["resolution_by"], distilled["resolution_ts"]) == (_name(corpus, ASKER), FIX_TS)
    assert distilled["resolution_reason"] == "the asker's own fix"
    assert distilled["summary"].startswith(
        f"{_name(corpus, ASKER)} asked in #beginners; 5 replies from {_name(corpus, HELPER)}."
    )
    assert "com.fasterxml.jackson.databind.JavaType" in distilled["systems"]
    assert "java.lang.NoSuchMethodError" in distilled["systems"]
    assert not any(s.startswith("U0") or "horns" in s for s in distilled["systems"])  # ids, emoji
    assert "lein deps :tree" in distilled["code_refs"] and "project.clj" in distilled["code_refs"]
    assert any(ref.startswith("java.lang.NoSuchMethodError: com.fasterxml") for ref in distilled["code_refs"])

    # What is embedded is the distillation; the raw transcript stays the content.
    assert thread.text.splitlines()[:2] == ["#beginners", f"Question: {distilled['question']}"]
    assert f"Resolution: {distilled['resolution']}" in thread.text
    assert "Fixed it finally." in thread.content and "Thanks! That code snippet" in thread.content
    assert "Thanks! That code snippet" not in thread.text

    # Bursts: the helper's `lein deps :tree` hint (rare token), the asker's reply and the long fix;
    # never the ":the_horns:" reaction-like reply nor the question itself (it is the distillation).
    bursts = _bursts_of(rows, thread.external_id)
    starts = sorted(d.metadata["first_ts"] for d in bursts.values())
    assert FIX_TS in starts and "1518088762.000435" in starts
    assert THREAD_TS not in starts and "1518099139.000666" not in starts
    fix_burst = bursts[f"{thread.external_id}:burst:{FIX_TS}"]
    topic = distilled["question"][:100]
    assert fix_burst.text.startswith(f"#beginners | {topic}")
    assert f"{_name(corpus, ASKER)}: Fixed it finally." in fix_burst.text
    assert fix_burst.parent_id == thread.pk and fix_burst.embedding is not None
    assert fix_burst.metadata["authors"] == [_name(corpus, ASKER)]
    assert fix_burst.url == (
        f"https://clojurians.slack.com/archives/{BEGINNERS}/p{FIX_TS.replace('.', '')}"
        f"?thread_ts={THREAD_TS}&cid={BEGINNERS}"
    )
    assert "com.fasterxml.jackson.dataformat/jackson-dataformat-cbor" in fix_burst.content

    # Every burst anywhere: a child of its thread or conversation, never acknowledgement only.
    all_bursts = [d for d in rows.values() if d.kind == "burst"]
    assert len(all_bursts) >= 20
    assert all(d.parent is not None and d.parent.kind in ("thread", "conversation") for d in all_bursts)
    assert not any(is_acknowledgement(d.content.split(": ", 1)[1]) for d in all_bursts)

    # The second run over the same workspace: nothing new, nothing rewritten, nothing embedded.
    again = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert (again.status, again.created, again.updated, again.embedded, again.deleted) == ("succeeded", 0, 0, 0, 0)
    assert again.unchanged == len(rows)
    assert set(_rows(tenant_id, source.pk)) == set(rows)


def test_deleting_a_message_in_the_live_path_removes_its_burst(
    make_tenant, slack, corpus, django_capture_on_commit_callbacks
):
    tenant_id = make_tenant("acme").tenant.pk
    source = _slack_source(tenant_id, slack, [BEGINNERS])
    assert source_ingest(tenant_id=tenant_id, source_id=source.pk).status == "succeeded"
    thread_id = f"{BEGINNERS}:{THREAD_TS}"
    before = _rows(tenant_id, source.pk)
    fix_burst_id = f"{thread_id}:burst:{FIX_TS}"
    assert fix_burst_id in before

    # A message_deleted event in the corpus's own shape, for the asker's fix.
    template = next(e for _, e in corpus.day2 if e.get("subtype") == "message_deleted")
    event = copy.deepcopy(template)
    target = slack.world.messages[BEGINNERS][FIX_TS]
    event.update(channel=BEGINNERS, deleted_ts=FIX_TS, ts="1518220000.000200", event_ts="1518220000.000200")
    event["previous_message"] = {k: target[k] for k in ("type", "user", "text", "ts", "thread_ts")}
    slack.world.apply(event)
    change = parse_event({"event_id": "EvDISTILLDEL1", "event": event}, channels=[BEGINNERS])
    assert change is not None and change.action == "delete" and change.thread_ts == THREAD_TS

    queued: list[tuple] = []
    with django_capture_on_commit_callbacks(execute=True):
        applied = slack_event_apply(
            tenant_id=tenant_id, source_id=source.pk, change=change, enqueue=lambda *args: queued.append(args)
        )
    assert applied and queued == [(tenant_id, source.pk, BEGINNERS, THREAD_TS)]
    purged = _rows(tenant_id, source.pk)
    assert thread_id not in purged and not _bursts_of(purged, thread_id)  # gone at once, bursts too

    result = slack_thread_refresh(tenant_id=tenant_id, source_id=source.pk, channel=BEGINNERS, thread_ts=THREAD_TS)
    assert result["thread"] == "written"
    after = _rows(tenant_id, source.pk)
    assert fix_burst_id not in after
    assert not any("Fixed it finally" in d.content or "Fixed it finally" in d.text for d in after.values())
    # The other bursts of the thread come back with the same ids; the resolution moved on.
    assert set(_bursts_of(after, thread_id)) == set(_bursts_of(before, thread_id)) - {fix_burst_id}
    assert after[thread_id].metadata["distilled"]["resolution_ts"] != FIX_TS
    # A refresh of an unchanged thread rewrites and embeds nothing.
    again = slack_thread_refresh(tenant_id=tenant_id, source_id=source.pk, channel=BEGINNERS, thread_ts=THREAD_TS)
    assert (again["written"], again["embedded"], again["deleted"]) == (0, 0, 0)


# -- the LLM path ----------------------------------------------------------------------------------


def test_llm_distillation_cached_by_key_and_falls_back_on_garbage(make_tenant, slack, settings):
    tenant_id = make_tenant("acme").tenant.pk

    def distil(body: dict[str, Any]) -> str:
        assert body["response_format"]["type"] == "json_schema"
        transcript = body["messages"][-1]["content"]
        first = transcript.split("\n")[2].split(": ", 1)[-1][:60]
        return json.dumps(
            {
                "question": f"LLM: {first}",
                "summary": "A summary written by the model.",
                "resolution": "Exclude jackson from amazonica" if "amazonica" in transcript else "",
                "systems": ["amazonica", "jackson"] if "amazonica" in transcript else [],
                "code_refs": [],
            }
        )

    settings.KB_LLM_MODEL, settings.OPENAI_API_KEY = "test-model", "test-key"
    with FakeOpenAIServer(distil) as server:
        settings.OPENAI_BASE_URL = server.base_url
        source = _slack_source(tenant_id, slack, [BEGINNERS])
        assert source_ingest(tenant_id=tenant_id, source_id=source.pk).status == "succeeded"
        rows = _rows(tenant_id, source.pk)
        threads = [d for d in rows.values() if d.kind == "thread"]
        assert len(server.requests) == len(threads) >= 3  # one call per thread
        thread = rows[f"{BEGINNERS}:{THREAD_TS}"]
        distilled = thread.metadata["distilled"]
        assert distilled["method"] == "llm" and distilled["question"].startswith("LLM: I hava a dependency")
        assert distilled["resolution"] == "Exclude jackson from amazonica" and distilled["systems"] == [
            "amazonica",
            "jackson",
        ]
        assert distilled["resolution_ts"] == FIX_TS  # who resolved it stays the rules' finding
        assert thread.text.startswith("#beginners\nQuestion: LLM: I hava a dependency")

        # Unchanged threads are not distilled again.
        calls = len(server.requests)
        again = source_ingest(tenant_id=tenant_id, source_id=source.pk)
        assert (again.created, again.updated, again.embedded) == (0, 0, 0)
        assert len(server.requests) == calls

    with FakeOpenAIServer(lambda body: "Sure! Here is the distillation: {question: ...") as garbage:
        settings.OPENAI_BASE_URL = garbage.base_url
        other = _slack_source(tenant_id, slack, [BEGINNERS], slug="clojurians-2")
        assert source_ingest(tenant_id=tenant_id, source_id=other.pk).status == "succeeded"
        fallback = _rows(tenant_id, other.pk)[f"{BEGINNERS}:{THREAD_TS}"]
        assert len(garbage.requests) == len(threads)
    got = fallback.metadata["distilled"]
    assert got["method"] == "rules" and got["llm_error"].startswith("ValueError: not JSON")
    assert got["resolution"].startswith("Fixed it finally.") and got["question"].startswith("I hava a dependency")
    assert fallback.text.startswith("#beginners\nQuestion: I hava a dependency")


# -- Houston: bursts inside conversations ----------------------------------------------------------


def test_houston_bursts_acknowledgements_and_idempotent_rerun(make_tenant, shared_dir, tmp_path):
    tenant_id = make_tenant("acme").tenant.pk
    root = tmp_path / "houston"
    shutil.copytree(shared_dir / "corpora" / "slack-export-houston", root)
    # A real conversation (#general, 2015-10-15) gets one more reply: "thanks, sounds good!" with
    # a reaction, which the threshold would count; acknowledgement is never a burst.
    day = root / "general" / "2015-10-15.json"
    messages = json.loads(day.read_text())
    said = [m for m in messages if not m.get("subtype") and m.get("user")]
    last = max(said, key=lambda m: float(m["ts"]))
    someone_else = next(m["user"] for m in said if m["user"] != last["user"])
    ack = {
        "type": "message",
        "user": someone_else,
        "text": "thanks, sounds good!",
        "ts": f"{float(last['ts']) + 60:.6f}",
        "reactions": [{"name": "+1", "users": ["U061A3E0G"], "count": 1}],
    }
    day.write_text(json.dumps([*messages, ack]))

    source = source_create(tenant_id=tenant_id, kind="slack_export", name="Houston", config={"path": str(root)})
    run = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert run.status == "succeeded"
    rows = _rows(tenant_id, source.pk)
    conversations = {eid: d for eid, d in rows.items() if d.kind == "conversation"}
    bursts = {eid: d for eid, d in rows.items() if d.kind == "burst"}
    assert len(conversations) == 385 and len(bursts) >= 100
    assert all(d.parent is not None and d.parent.kind == "conversation" for d in bursts.values())
    assert all(d.parent.metadata["message_count"] >= 3 for d in bursts.values())

    # The acknowledgement is in its conversation, never a burst.
    holder = next(d for d in conversations.values() if "thanks, sounds good!" in d.content)
    assert _bursts_of(rows, holder.external_id)  # its conversation does have bursts
    assert not any("thanks, sounds good!" in d.content for d in bursts.values())
    assert holder.metadata["reactions"].get("+1", 0) >= 1
    # Nor is any real acknowledgement of the export ("Sounds good!", "thanks", "thanks a lot").
    acks = {
        m["text"].strip()
        for path in (shared_dir / "corpora" / "slack-export-houston").glob("*/*.json")
        for m in json.loads(path.read_text())
        if m.get("text") and is_acknowledgement(m["text"])
    }
    assert {"Sounds good!", "thanks"} <= acks
    for burst in bursts.values():
        lines = [line.split(": ", 1)[1] for line in burst.content.splitlines() if ": " in line[:60]]
        assert not all(line.strip() in acks for line in lines), burst.content

    # A long message (>= 200 characters) inside a conversation is a burst with the topic prepended.
    long_burst = next(
        d
        for d in bursts.values()
        if len(d.content.split(": ", 1)[1]) >= 200 and d.metadata["first_ts"] != d.parent.metadata["first_ts"]
    )
    topic = long_burst.metadata["topic"]
    opening = re.sub(r"\s+", " ", long_burst.parent.content.splitlines()[0].split(": ", 1)[1])
    assert len(topic) >= 10 and re.sub(r"\s+", " ", topic[:30]) in opening
    assert long_burst.text.startswith(f"#{long_burst.metadata['channel']} | {topic}\n")
    assert long_burst.external_id == f"{long_burst.parent.external_id}:burst:{long_burst.metadata['first_ts']}"

    # The second run (now with term statistics) writes the same rows: idempotent.
    again = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert (again.created, again.updated, again.embedded, again.deleted) == (0, 0, 0, 0)
    assert again.unchanged == len(rows) and set(_rows(tenant_id, source.pk)) == set(rows)


def test_rare_token_by_source_statistics_makes_a_short_message_a_burst(make_tenant, shared_dir, tmp_path):
    """With term statistics, a short reply naming a term rare in the source becomes a burst; the
    same reply without it (only everyday words) does not."""
    tenant_id = make_tenant("acme").tenant.pk
    root = tmp_path / "houston"
    shutil.copytree(shared_dir / "corpora" / "slack-export-houston", root)
    source = source_create(tenant_id=tenant_id, kind="slack_export", name="Houston", config={"path": str(root)})
    assert source_ingest(tenant_id=tenant_id, source_id=source.pk).status == "succeeded"

    day = root / "general" / "2015-10-15.json"
    messages = json.loads(day.read_text())
    said = [m for m in messages if not m.get("subtype") and m.get("user")]
    last = max(said, key=lambda m: float(m["ts"]))
    someone_else = next(m["user"] for m in said if m["user"] != last["user"])
    added = [
        {
            "type": "message",
            "user": someone_else,
            "text": "we could try the kubernetes helm chart",
            "ts": f"{float(last['ts']) + 60:.6f}",
        },
        {
            "type": "message",
            "user": last["user"],
            "text": "maybe we could try that next time",
            "ts": f"{float(last['ts']) + 120:.6f}",
        },
    ]
    day.write_text(json.dumps([*messages, *added]))
    run = source_ingest(tenant_id=tenant_id, source_id=source.pk)
    assert run.status == "succeeded"
    rows = _rows(tenant_id, source.pk)
    holder = next(d for d in rows.values() if d.kind == "conversation" and "kubernetes helm chart" in d.content)
    bursts = _bursts_of(rows, holder.external_id)
    assert any(d.metadata["first_ts"] == added[0]["ts"] for d in bursts.values())
    assert not any(d.metadata["first_ts"] == added[1]["ts"] for d in bursts.values())
