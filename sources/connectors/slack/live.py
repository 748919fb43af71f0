"""Live Slack: a thread refreshed, a deleted message purged, each Events API event applied once.

The Slack package's writes (services; ``sources.services`` names them for the rest of the
project): the connector fetches a thread (``SlackConnector.refresh_thread``), and these
functions write it through the ingestion service's row upserts and deletes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError
from sources.connectors.registry import build_connector
from sources.connectors.slack.messages import ts_key, valid_ts
from sources.models import DataSource, Document, SlackEventSeen
from sources.services.catalog import source_label
from sources.services.ingestion import source_rows_delete, source_rows_upsert

if TYPE_CHECKING:
    from sources.connectors.slack.events import SlackChange


def _slack_channel_lock(source_id: int, channel: str) -> None:
    """Serialise refreshes of one channel of one source until the current transaction ends.

    Two workers refreshing the same thread could otherwise write an older fetch over a newer
    one (and a purge could be undone by a refresh that fetched before the deletion).
    """
    key = zlib.crc32(channel.encode()) - 2**31  # int4 range for the two-key advisory lock
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [int(source_id) % 2**31, key])


def _stale_conversations(source_id: int, channel: str, lo_ts: str, hi_ts: str, keep: set[str]) -> list[str]:
    """External ids of the channel's stored conversation rows overlapping ``[lo_ts, hi_ts]``, not in ``keep``."""
    lo, hi = ts_key(lo_ts), ts_key(hi_ts)
    stored = Document.objects.filter(
        source_id=source_id, kind="conversation", metadata__contains={"channel_id": channel}
    ).values_list("external_id", "metadata__first_ts", "metadata__last_ts")
    return [
        external_id
        for external_id, first_ts, last_ts in stored
        if external_id not in keep
        and valid_ts(first_ts)
        and valid_ts(last_ts)
        and ts_key(first_ts) <= hi
        and ts_key(last_ts) >= lo
    ]


def _stale_bursts(source_id: int, parents: set[str], keep: set[str]) -> list[str]:
    """External ids of the stored ``burst`` rows whose parent is in ``parents``, not in ``keep``."""
    return list(
        Document.objects.filter(source_id=source_id, kind="burst", parent_external_id__in=sorted(parents))
        .exclude(external_id__in=sorted(keep))
        .values_list("external_id", flat=True)
    )


def slack_thread_refresh(*, tenant_id: int, source_id: int, channel: str, thread_ts: str) -> dict[str, Any]:
    """Re-fetch one Slack thread (``conversations.replies``) and write it back as one row.

    The thread row is replaced whole (parent, replies, participants, last activity), or deleted
    when Slack has no thread there any more; when the parent is or becomes a loose message the
    conversation rows around it are rebuilt too (stale ones deleted). Burst rows of the thread
    and of those conversations that the refresh no longer yields are deleted. Holds a per-channel
    advisory lock from fetch to write. Returns ``{"thread": "written"|"deleted"|"none",
    "written", "embedded", "deleted"}`` (row counts). Raises ``DataSource.DoesNotExist``,
    ``ConnectorError`` for a source that is not ``slack``, and ``SlackError``/``SlackRateLimited``
    (with ``retry_after`` seconds) from the Web API.
    """
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
    if source.kind != "slack":
        raise ConnectorError(f"data source {source.slug!r} is a {source.kind!r} source, not 'slack'")
    connector: Any = build_connector(  # a SlackConnector (checked above), which refreshes threads
        source.kind, source.config, include=source.include, exclude=source.exclude, source_label=source_label(source)
    )
    connector.bind_source(tenant_id=tenant_id, source_id=source_id)
    thread_id = f"{channel}:{thread_ts}"
    with transaction.atomic():
        _slack_channel_lock(source_id, channel)
        with tenant_context(tenant_id):
            had_thread = Document.objects.filter(source_id=source_id, external_id=thread_id).exists()
        refresh = connector.refresh_thread(channel, thread_ts, had_thread_row=had_thread)
        rows = [refresh.thread_row, *refresh.burst_rows] if refresh.thread_row is not None else []
        stale: list[str] = [] if refresh.thread_row is not None or not had_thread else [thread_id]
        if refresh.window is not None:
            rows += refresh.window.rows
            with tenant_context(tenant_id):
                stale += _stale_conversations(
                    source_id,
                    channel,
                    refresh.window.lo_ts,
                    refresh.window.hi_ts,
                    keep={row.external_id for row in refresh.window.rows},
                )
        # Bursts of every parent rewritten or deleted here that the refresh did not yield again.
        parents = {thread_id, *stale, *(row.external_id for row in rows if row.kind != "burst")}
        with tenant_context(tenant_id):
            stale += _stale_bursts(source_id, parents, keep={row.external_id for row in rows})
        deleted = source_rows_delete(tenant_id=tenant_id, source_id=source_id, external_ids=stale)
        counts = source_rows_upsert(tenant_id=tenant_id, source_id=source_id, rows=rows)
    state = "written" if refresh.thread_row is not None else ("deleted" if had_thread else "none")
    return {
        "thread": state,
        "written": counts["created"] + counts["updated"],
        "embedded": counts["embedded"],
        "deleted": deleted,
    }


def slack_message_purge(*, tenant_id: int, source_id: int, channel: str, ts: str, thread_ts: str) -> int:
    """Delete at once every row of the source that holds the Slack message ``ts``; returns the count.

    That is its thread's row (``<channel>:<thread_ts>``), the thread it started
    (``<channel>:<ts>``), the conversation row spanning it, and the ``burst`` rows of all of
    these. Called on ``message_deleted`` before the refresh is queued, so a deleted message is
    never cited again even while the refresh waits; the refresh then writes back what remains.
    """
    with transaction.atomic():
        _slack_channel_lock(source_id, channel)
        with tenant_context(tenant_id):
            holders = _stale_conversations(source_id, channel, ts, ts, keep=set())
        ids = {f"{channel}:{thread_ts}", f"{channel}:{ts}", *holders}
        with tenant_context(tenant_id):
            ids.update(_stale_bursts(source_id, ids, keep=set()))
        return source_rows_delete(tenant_id=tenant_id, source_id=source_id, external_ids=sorted(ids))


def slack_event_claim(*, tenant_id: int, source_id: int, event_id: str) -> bool:
    """Record an Events API ``event_id`` for the source; false when it was already recorded.

    The durable half of the listener's dedupe (a unique constraint), so a redelivery after a
    restart is still applied once. Runs inside the tenant's context.
    """
    with tenant_context(tenant_id):
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO sources_slackeventseen (tenant_id, source_id, event_id, created_at) "
                "VALUES (%s, %s, %s, now()) ON CONFLICT (source_id, event_id) DO NOTHING RETURNING id",
                [tenant_id, source_id, event_id[:64]],
            )
            return cursor.fetchone() is not None


def slack_event_release(*, tenant_id: int, source_id: int, event_id: str) -> None:
    """Forget a claimed ``event_id`` (its work failed after the claim), so that Slack's
    redelivery of the event is applied."""
    with tenant_context(tenant_id):
        SlackEventSeen.objects.filter(source_id=source_id, event_id=event_id[:64]).delete()


def slack_event_apply(
    *,
    tenant_id: int,
    source_id: int,
    change: SlackChange,
    enqueue: Callable[[int, int, str, str], Any],
) -> bool:
    """Apply one Slack message event: claim its id, purge a deleted message's rows, queue the refresh.

    ``enqueue(tenant_id, source_id, channel, thread_ts)`` queues the thread refresh (the
    ``sources.slack_refresh_thread`` task); it runs after the claim commits. Returns false (and
    does nothing) for an event id already claimed. Raises what the database raises; then the
    claim is rolled back and a redelivery is applied.
    """
    with transaction.atomic():
        if not slack_event_claim(tenant_id=tenant_id, source_id=source_id, event_id=change.event_id):
            return False
        if change.action == "delete":
            slack_message_purge(
                tenant_id=tenant_id,
                source_id=source_id,
                channel=change.channel,
                ts=change.ts,
                thread_ts=change.thread_ts,
            )
        transaction.on_commit(lambda: enqueue(tenant_id, source_id, change.channel, change.thread_ts))
    return True


def slack_events_prune(*, tenant_id: int, source_id: int, older_than_hours: float = 72.0) -> int:
    """Forget claimed event ids older than ``older_than_hours`` (Slack retries within hours); returns the count."""
    cutoff = timezone.now() - timedelta(hours=older_than_hours)
    with tenant_context(tenant_id):
        deleted, _ = SlackEventSeen.objects.filter(source_id=source_id, created_at__lt=cutoff).delete()
    return deleted
