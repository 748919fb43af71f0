"""``manage.py slack_listen --source <tenant>/<slug> [--answer]``: apply a live Slack source's events as
they happen; with ``--answer``, the same connection also answers mentions and direct messages
(``search.slack_bot``)."""

from __future__ import annotations

import signal
import threading
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from sources.connectors.base import ConnectorError
from sources.connectors.registry import build_connector
from sources.connectors.slack.events import SlackChange, SlackEventStream
from sources.selectors import SourceNotFound, source_resolve_for_operator
from sources.services import slack_event_apply, slack_events_prune
from sources.tasks import slack_refresh_thread

PRUNE_EVERY_SECONDS = 3600


class Command(BaseCommand):
    help = (
        "Listen to a 'slack' data source over Socket Mode: ack each event at once, apply each event id "
        "once, purge deleted messages, and queue a refresh of the thread on the Celery worker."
    )
    # Tests (and embedding code) pass a threading.Event to stop the loop instead of a signal.
    stealth_options = ("stop_event",)

    def add_arguments(self, parser):
        parser.add_argument("--source", required=True, help="data source: <tenant>/<slug>, slug, or id")
        parser.add_argument("--tenant", help="tenant slug, when the source slug is in several tenants")
        parser.add_argument("--concurrency", type=int, default=4, help="event handler threads (default 4)")
        parser.add_argument(
            "--answer",
            action="store_true",
            help="also answer mentions of the app and direct messages to it in their thread (the Slack bot)",
        )

    def handle(self, *args, source, tenant=None, concurrency=4, stop_event=None, answer=False, **options):
        try:
            ds = source_resolve_for_operator(source, tenant_slug=tenant)
        except SourceNotFound as exc:
            raise CommandError(str(exc)) from exc
        if ds.kind != "slack":
            raise CommandError(f"data source {ds.slug!r} is a {ds.kind!r} source; slack_listen needs kind 'slack'")
        try:
            connector = build_connector(ds.kind, ds.config)
        except ConnectorError as exc:
            raise CommandError(str(exc)) from exc
        tenant_id, source_id = ds.tenant_id, ds.pk

        def enqueue(tenant_id: int, source_id: int, channel: str, thread_ts: str) -> None:
            slack_refresh_thread.delay(tenant_id, source_id, channel, thread_ts)

        def handle_change(change: SlackChange) -> bool:
            try:
                return slack_event_apply(tenant_id=tenant_id, source_id=source_id, change=change, enqueue=enqueue)
            finally:
                close_old_connections()  # the handler threads are long-lived, like a worker's

        bot = None
        if answer:
            from slack_sdk import WebClient
            from slack_sdk.http_retry.builtin_handlers import (
                ConnectionErrorRetryHandler,
                RateLimitErrorRetryHandler,
            )

            from search.slack_bot import SlackBot

            web = WebClient(
                token=connector.config.token.get_secret_value(),
                base_url=connector.config.base_url,
                retry_handlers=[
                    RateLimitErrorRetryHandler(max_retry_count=connector.config.rate_limit_retries),
                    ConnectionErrorRetryHandler(max_retry_count=2),
                ],
            )
            answers = SlackBot(tenant_id=tenant_id, source_id=source_id, web=web)

            def bot(payload) -> str:
                try:
                    return answers.handle(payload)
                finally:
                    close_old_connections()

        try:
            stream = SlackEventStream(config=connector.config, handler=handle_change, concurrency=concurrency, bot=bot)
        except ConnectorError as exc:
            raise CommandError(str(exc)) from exc
        stop = stop_event or threading.Event()
        if stop_event is None and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: stop.set())
        slack_events_prune(tenant_id=tenant_id, source_id=source_id)
        try:
            stream.connect()
        except ConnectorError as exc:
            stream.close()
            raise CommandError(f"{ds.slug}: {exc}") from exc
        listening = f"{ds.slug}: listening on Socket Mode for {len(connector.config.channels)} channel(s)"
        self.stdout.write(listening + (", answering mentions and direct messages" if answer else ""))
        last_prune = time.monotonic()
        try:
            while not stop.wait(1.0):
                if time.monotonic() - last_prune > PRUNE_EVERY_SECONDS:
                    slack_events_prune(tenant_id=tenant_id, source_id=source_id)
                    close_old_connections()
                    last_prune = time.monotonic()
        finally:
            stream.close()
            close_old_connections()
        stats = stream.stats
        self.stdout.write(
            f"{ds.slug}: stopped; envelopes {stats['envelopes']}, applied {stats['handled']}, "
            f"duplicates {stats['duplicates']}, ignored {stats['ignored']}, failed {stats['failed']}"
            + (
                f", answered {stats['bot_answered']}, unlinked {stats['bot_unlinked']}, votes {stats['bot_voted']}"
                if answer
                else ""
            )
        )
