"""Celery tasks for ingestion: thin wrappers around ``sources.services``; payloads are ids."""

import random

from celery import shared_task

from sources.connectors.slack.client import SlackError, SlackRateLimited
from sources.models import DataSource, IngestionRun
from sources.scheduling import INGEST_TASK, sources_dispatch_due
from sources.services import slack_thread_refresh, source_ingest


@shared_task(name=INGEST_TASK, queue="ingest", acks_late=True, time_limit=4 * 3600)
def ingest_source(tenant_id: int, source_id: int, run_id: int | None = None) -> dict:
    """Run one ingestion of the source; returns ``{"run_id", "status", "seen", "embedded"}``.

    Idempotent (upsert by external id + content hash), so a redelivered message is harmless
    (a run that already finished is returned as it is); a source deleted before the task runs
    gives ``status == "gone"``; a run refused because another run of the source holds its
    lock gives ``status == "skipped"``.
    """
    try:
        run = source_ingest(tenant_id=tenant_id, source_id=source_id, run_id=run_id)
    except (DataSource.DoesNotExist, IngestionRun.DoesNotExist):
        # Deleted (or never in this tenant) between enqueue and run: nothing to do.
        return {"run_id": run_id, "status": "gone", "seen": 0, "embedded": 0}
    return {"run_id": run.pk, "status": run.status, "seen": run.seen, "embedded": run.embedded}


@shared_task(name="sources.dispatch_due", queue="default", time_limit=300, ignore_result=True)
def dispatch_due() -> dict:
    """Celery beat's entry (every minute): queue a run of each enabled source that is due, in
    every tenant (``sources.scheduling.sources_dispatch_due``). Returns ``{"queued": [run ids],
    "busy": [source ids], "backed_off": [source ids], "abandoned": [run ids], "errors":
    [{"source", "error"}]}``. Passes never overlap (an advisory lock).
    """
    return sources_dispatch_due().as_dict()


@shared_task(
    name="sources.slack_refresh_thread",
    queue="ingest",
    bind=True,
    acks_late=True,
    max_retries=12,
    time_limit=600,
)
def slack_refresh_thread(self, tenant_id: int, source_id: int, channel: str, thread_ts: str) -> dict:
    """Re-fetch one Slack thread and write it back as one row (``services.slack_thread_refresh``).

    Returns ``{"status": "ok", "thread": "written"|"deleted"|"none", "written", "embedded",
    "deleted"}`` or ``{"status": "gone"}`` when the source was deleted meanwhile. Idempotent (it
    writes what Slack says now), so redelivery is harmless. Rate limited beyond the client's own
    retries: retried after Slack's ``Retry-After`` seconds plus jitter; other Web API failures
    (network, 5xx) are retried with exponential backoff (2 s, 4 s, ... at most 10 min), never
    dropped silently.
    """
    try:
        result = slack_thread_refresh(tenant_id=tenant_id, source_id=source_id, channel=channel, thread_ts=thread_ts)
    except DataSource.DoesNotExist:
        return {"status": "gone"}
    except SlackRateLimited as exc:
        raise self.retry(exc=exc, countdown=exc.retry_after + random.uniform(0, 2)) from None
    except SlackError as exc:
        if exc.error in ("channel_not_found", "not_in_channel", "invalid_auth", "account_inactive", "token_revoked"):
            raise  # permanent: recorded as the task's failure, retrying cannot help
        countdown = min(600, 2 ** (self.request.retries + 1)) + random.uniform(0, 1)
        raise self.retry(exc=exc, countdown=countdown) from None
    return {"status": "ok", **result}
