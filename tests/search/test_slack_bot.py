"""The Slack bot end to end: ``manage.py slack_listen --answer`` on one Socket Mode connection,
against the loopback Slack (``tests/sources/slack_server.py``: real Web API and Socket Mode
wire format, reached through ``slack_sdk``). A mention is answered in its thread with Slack
links; a follow-up in the thread continues the asker's conversation; a Slack user with no linked
portal account gets the how-to-link reply and nothing else; 👍/👎 from the asker is recorded;
a redelivered event is answered once. Writes commit (the listener's threads must see them),
each test under its own tenant."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from kbportal.tenancy import tenant_context
from projects.models import Membership
from projects.services import membership_create, profile_set_default_project, tenant_onboard
from search.models import AnswerFeedback, AnswerRecord, Conversation
from search.slack_bot import LINK_HELP, parse_bot_event, slack_text
from sources.models import ExternalIdentity
from sources.services import source_create, source_ingest
from tests.search.conftest import CUSTOM
from tests.sources.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack, SlackWorld

pytestmark = pytest.mark.slow

GENERAL = "C0GENERAL"
ASKER, STRANGER, ADMIN = "U0ASKER", "U0STRANGER", "U0ADMIN"
SECRET = "quokka salary bands"


@pytest.fixture
def live_db(django_db_setup, django_db_blocker) -> Iterator[None]:
    with django_db_blocker.unblock():
        try:
            yield
        finally:
            connections.close_all()


@pytest.fixture
def workspace(live_db, request):
    """A tenant with a wiki (one page restricted to its admin), a Slack source on the loopback
    Slack, the asker's and the admin's Slack identities linked by verified email, a stranger not."""
    slug = "bot-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:10]
    onboarded = tenant_onboard(name=slug, slug=slug, admin_username=f"{slug}-admin", admin_password="pw-" + slug)
    tenant_id = onboarded.tenant.pk
    asker = get_user_model().objects.create_user(f"{slug}-asker", f"asker@{slug}.example", "pw-asker-1234")
    membership_create(tenant_id=tenant_id, user=asker, role=Membership.Role.MEMBER)
    profile_set_default_project(user=asker, tenant_id=tenant_id, project_id=onboarded.project.pk)
    EmailAddress.objects.create(user=asker, email=f"asker@{slug}.example", verified=True, primary=True)
    EmailAddress.objects.create(user=onboarded.admin, email=f"admin@{slug}.example", verified=True, primary=True)
    rows = [
        {
            "external_id": "runbook#deploy",
            "kind": "doc_section",
            "title": "Runbook > Deploying the billing service",
            "path": "runbook.md",
            "url": "https://wiki.example/runbook#deploy",
            "content": "To deploy the billing service run `make release` from the ops repository. "
            "The deploy pipeline needs the BILLING_DEPLOY_TOKEN secret.",
        },
        {
            "external_id": "hr#salaries",
            "kind": "doc_section",
            "title": "HR > Salary bands",
            "path": "hr.md",
            "url": "https://wiki.example/hr#salaries",
            "content": f"Restricted page: the {SECRET} for staff engineers are 180k to 220k.",
            "principals": [f"user:{onboarded.admin.pk}"],
        },
    ]
    with override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        wiki = source_create(
            tenant_id=tenant_id,
            kind="test_rows",
            name="Wiki",
            config={"rows": rows},
            project_ids=[onboarded.project.pk],
        )
        assert source_ingest(tenant_id=tenant_id, source_id=wiki.pk).status == "succeeded"
    world = SlackWorld(channels={GENERAL: "general"}, users={ASKER: {"real_name": "Asker"}})
    server = FakeSlack(world)
    slack = source_create(
        tenant_id=tenant_id,
        kind="slack",
        name="Slack",
        slug="slack",
        config={
            "token": BOT_TOKEN,
            "app_token": APP_TOKEN,
            "base_url": server.base_url,
            "channels": [GENERAL],
            "rate_limit_retries": 2,
            "allow_private_network": True,  # the loopback Slack (kbportal.netcheck)
        },
        project_ids=[onboarded.project.pk],
    )
    with tenant_context(tenant_id):
        for user_id, email in ((ASKER, f"asker@{slug}.example"), (ADMIN, f"admin@{slug}.example")):
            ExternalIdentity.objects.create(
                tenant_id=tenant_id, source=slack, principal=f"slack:{user_id}", email=email
            )
        ExternalIdentity.objects.create(tenant_id=tenant_id, source=slack, principal=f"slack:{STRANGER}", email="")
    yield onboarded, slack, server, asker
    server.close()


@contextmanager
def listening(onboarded, slack) -> Iterator[io.StringIO]:
    stop, out, errors = threading.Event(), io.StringIO(), []

    def run() -> None:
        try:
            call_command(
                "slack_listen",
                "--source",
                f"{onboarded.tenant.slug}/{slack.slug}",
                "--answer",
                stop_event=stop,
                stdout=out,
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while "listening" not in out.getvalue() and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not errors and "answering mentions" in out.getvalue(), (errors, out.getvalue())
    try:
        yield out
    finally:
        stop.set()
        thread.join(30)
        assert not errors, errors


_TS = iter(range(1, 10_000))


def mention(user: str, text: str, *, thread_ts: str | None = None, channel: str = GENERAL, kind="app_mention"):
    ts = f"{int(time.time())}.{next(_TS):06d}"
    event = {"type": kind, "user": user, "text": f"<@U0BOT> {text}", "ts": ts, "channel": channel, "event_ts": ts}
    if thread_ts:
        event["thread_ts"] = thread_ts
    if kind == "message":
        event["channel_type"] = "im"
        event["text"] = text
    return event


def test_a_mention_is_answered_in_its_thread_and_a_follow_up_continues_the_conversation(workspace):
    onboarded, slack, server, asker = workspace
    with listening(onboarded, slack) as out:
        first = mention(ASKER, "How do I deploy the billing service?")
        server.push(first, event_id="Ev0001")
        answer = server.wait_posted(1)[0]
        assert answer["channel"] == GENERAL and answer["thread_ts"] == first["ts"]
        assert "make release" in answer["text"] and "<https://wiki.example/runbook#deploy|[1]>" in answer["text"]
        assert "*Sources*" in answer["text"]

        follow = mention(ASKER, "and which secret does it need?", thread_ts=first["ts"])
        server.push(follow, event_id="Ev0002")
        server.push(follow, event_id="Ev0002", retry_attempt=1)  # redelivered: answered once
        second = server.wait_posted(2)[1]
        assert second["thread_ts"] == first["ts"] and "BILLING_DEPLOY_TOKEN" in second["text"]

        # 👍 from the asker on the first answer is their vote; a stranger's 👎 changes nothing.
        for user, reaction, event_id in ((ASKER, "+1", "Ev0003"), (STRANGER, "-1", "Ev0004")):
            event = {
                "type": "reaction_added",
                "user": user,
                "reaction": reaction,
                "item": {"type": "message", "channel": GENERAL, "ts": answer["ts"]},
                "event_ts": answer["ts"],
            }
            server.push(event, event_id=event_id)
        deadline = time.monotonic() + 20
        while "votes" not in out.getvalue() and time.monotonic() < deadline:
            with tenant_context(onboarded.tenant.pk):
                if AnswerFeedback.objects.exists():
                    break
            time.sleep(0.05)
    assert len(server.posted) == 2
    assert "answered 2" in out.getvalue() and "votes 1" in out.getvalue()
    with tenant_context(onboarded.tenant.pk):
        conversation = Conversation.objects.get(user=asker)
        turns = list(AnswerRecord.objects.filter(conversation=conversation).order_by("created_at"))
        votes = list(AnswerFeedback.objects.values_list("user_id", "vote", "answer_record_id"))
    assert conversation.slack_thread == f"{GENERAL}:{first['ts']}"
    assert [t.question for t in turns] == ["How do I deploy the billing service?", "and which secret does it need?"]
    assert turns[1].rewrite_method == "rules"
    assert votes == [(asker.pk, 1, turns[0].pk)]


def test_an_unlinked_slack_user_gets_the_how_to_link_reply_and_no_content(workspace):
    onboarded, slack, server, asker = workspace
    with listening(onboarded, slack):
        server.push(mention(STRANGER, f"What are the {SECRET}?"), event_id="Ev0101")
        server.push(mention("U0NOBODY", "How do I deploy the billing service?"), event_id="Ev0102")
        # The linked asker, in a direct message, may not read the admin's restricted page either.
        server.push(mention(ASKER, f"What are the {SECRET}?", channel="D0ASKER", kind="message"), event_id="Ev0103")
        posted = server.wait_posted(3)
    by_channel = {p["channel"]: p for p in posted}
    replies = [p["text"] for p in posted if p["channel"] == GENERAL]
    assert replies == [LINK_HELP, LINK_HELP]
    assert "180k" not in by_channel["D0ASKER"]["text"]
    assert by_channel["D0ASKER"]["thread_ts"]
    with tenant_context(onboarded.tenant.pk):
        assert list(AnswerRecord.objects.values_list("user_id", flat=True)) == [asker.pk]


def test_a_channel_reply_holds_only_what_everyone_may_read(workspace):
    """Everyone in a channel reads the reply: the admin's channel question leaves out the page
    restricted to them, which their direct message includes; a rate-limited post is retried."""
    onboarded, slack, server, asker = workspace
    server.rate_limit("chat.postMessage", retry_after=1, times=1)
    with listening(onboarded, slack):
        server.push(mention(ADMIN, f"What are the {SECRET}?"), event_id="Ev0201")
        in_channel = server.wait_posted(1)[0]
        server.push(mention(ADMIN, f"What are the {SECRET}?", channel="D0ADMIN", kind="message"), event_id="Ev0202")
        direct = server.wait_posted(2)[1]
    assert in_channel["channel"] == GENERAL and "180k" not in in_channel["text"]
    assert direct["channel"] == "D0ADMIN" and "180k" in direct["text"]
    assert [c.status for c in server.calls_of("chat.postMessage")][:2] == [429, 200]


def test_a_verified_answer_comes_first_in_the_slack_reply(workspace):
    from search.verified import answer_verify

    onboarded, slack, server, asker = workspace
    with listening(onboarded, slack):
        server.push(mention(ASKER, "How do I deploy the billing service?"), event_id="Ev0301")
        server.wait_posted(1)
        with tenant_context(onboarded.tenant.pk):
            answer_id = AnswerRecord.objects.get(user=asker).public_id
        answer_verify(actor=onboarded.admin, answer_id=answer_id, text="Run `make release` [1].")
        server.push(mention(ASKER, "How do I deploy the billing service?"), event_id="Ev0302")
        again = server.wait_posted(2)[1]["text"]
    assert again.startswith(f"*Verified answer* (verified by {onboarded.admin.get_username()} on ")
    assert again.index("Run `make release` <https://wiki.example/runbook#deploy|[1]>") < again.index("*Fresh answer*")


def test_the_apps_own_messages_are_not_ingested():
    from sources.connectors.slack.rows import SlackRenderer

    renderer = SlackRenderer(users={}, channel_names={}, own_ids=frozenset({"U0BOT", "B0BOT"}))
    assert renderer.message({"user": "U0BOT", "text": "an earlier answer", "ts": "1.000001"}) is None
    assert renderer.message({"bot_id": "B0BOT", "text": "an earlier answer", "ts": "1.000002"}) is None
    assert renderer.message({"user": "U1", "text": "a person", "ts": "1.000003"}) is not None


def test_bot_events_are_parsed_and_answers_written_as_slack_links(settings):
    assert parse_bot_event({"event_id": "E1", "event": {"type": "message", "channel_type": "im", "user": "U1"}}) is None
    bot_talk = {"type": "message", "channel_type": "im", "user": "U1", "bot_id": "B1", "ts": "1.2", "channel": "D1"}
    assert parse_bot_event({"event_id": "E1", "event": bot_talk}) is None
    edit = {**bot_talk, "bot_id": None, "subtype": "message_changed"}
    assert parse_bot_event({"event_id": "E1", "event": edit}) is None
    smile = {
        "type": "reaction_added",
        "user": "U1",
        "reaction": "smile",
        "item": {"type": "message", "channel": "C", "ts": "1"},
    }
    assert parse_bot_event({"event_id": "E1", "event": smile}) is None
    thumbs = {**smile, "reaction": "+1::skin-tone-3"}
    assert parse_bot_event({"event_id": "E1", "event": thumbs}).vote == 1
    question = parse_bot_event(
        {
            "event_id": "E2",
            "event": {
                "type": "app_mention",
                "user": "U1",
                "text": "<@U0BOT|kb> hi <@U2> there",
                "ts": "5.6",
                "channel": "C",
            },
        }
    )
    assert question.text == "hi there" and question.thread_ts == "5.6"

    settings.KB_PUBLIC_URL = "https://kb.example"
    sources = [
        {"n": 1, "title": "Runbook <b> & co|x", "link": "https://wiki.example/r"},
        {"n": 2, "title": "Page", "link": "/documents/abc/?id=1"},
        {"n": 3, "title": "Local", "link": "javascript:alert(1)"},
    ]
    text = slack_text("Run **make** <now> [1], see [2] and [3] [9].", sources)
    assert text.splitlines()[0] == (
        "Run *make* &lt;now&gt; <https://wiki.example/r|[1]>, "
        "see <https://kb.example/documents/abc/?id=1|[2]> and [3] [9]."
    )
    assert "[1] <https://wiki.example/r|Runbook &lt;b&gt; &amp; co¦x>" in text
    assert "[3] Local" in text and "javascript" not in text
    # A document's URL cannot close the link to ping the channel or label it as something else.
    hostile = [{"n": 1, "title": "t", "link": "https://wiki.example/z> <!channel> log in <https://evil.example|HR"}]
    posted = slack_text("See [1].", hostile)
    assert "<!channel>" not in posted and "|HR" not in posted
    assert "<https://wiki.example/z%3E%20%3C!channel%3E%20log%20in%20%3Chttps://evil.example%7CHR|[1]>" in posted
    question = parse_bot_event(
        {
            "event_id": "E3",
            "event": {
                "type": "app_mention",
                "user": "U1",
                "text": "<@U0BOT> what is in <#C1|general> &amp; <https://x.example|the doc>? <!channel>",
                "ts": "7.8",
                "channel": "C1",
            },
        }
    )
    assert question.text == "what is in #general & the doc (https://x.example)?"
