"""Celery tasks for ingestion: thin wrappers around ``sources.services``; payloads are ids."""

from celery import shared_task

from sources.models import DataSource, IngestionRun
from sources.services import source_ingest


@shared_task(name="sources.ingest_source", queue="ingest", acks_late=True, time_limit=4 * 3600)
def ingest_source(tenant_id: int, source_id: int, run_id: int | None = None) -> dict:
    """Run one ingestion of the source; returns ``{"run_id", "status", "seen", "embedded"}``.

    Idempotent (upsert by external id + content hash), so a redelivered message is harmless;
    a source deleted before the task runs gives ``status == "gone"``.
    """
    try:
        run = source_ingest(tenant_id=tenant_id, source_id=source_id, run_id=run_id)
    except (DataSource.DoesNotExist, IngestionRun.DoesNotExist):
        # Deleted (or never in this tenant) between enqueue and run: nothing to do.
        return {"run_id": run_id, "status": "gone", "seen": 0, "embedded": 0}
    return {"run_id": run.pk, "status": run.status, "seen": run.seen, "embedded": run.embedded}
