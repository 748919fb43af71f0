"""The API's one write of its own: queue a "sync now" of a data source, as the admin action does."""

from __future__ import annotations

from django.db import transaction

from search.api.authentication import ApiCaller
from search.api.selectors import caller_is_tenant_admin, source_get_for_caller
from sources.models import IngestionRun
from sources.services import ingestion_run_create
from sources.tasks import ingest_source


class SyncForbidden(PermissionError):
    """The caller may see the data source but is not an owner or admin of its tenant (-> 403)."""


def source_sync_request(*, actor: ApiCaller, source_slug: str) -> IngestionRun:
    """Queue an ingestion run of data source ``source_slug``; returns the queued run.

    Creates the ``IngestionRun`` (status ``queued``) and, once the transaction commits, sends
    ``sources.tasks.ingest_source(tenant_id, source_id, run_id)`` to the ``ingest`` queue (the
    admin's "sync now"). Raises ``SourceNotFound`` (-> 404) for a source outside the actor's
    projects, then ``SyncForbidden`` (-> 403) unless the actor is a person who is an owner or
    admin of the tenant (a service token never is).
    """
    source = source_get_for_caller(actor, slug=source_slug)
    if not caller_is_tenant_admin(actor):
        raise SyncForbidden("only an owner or admin of the organization can sync a data source")
    run = ingestion_run_create(tenant_id=source.tenant_id, source_id=source.pk)
    transaction.on_commit(lambda: ingest_source.delay(source.tenant_id, source.pk, run.pk))
    return run
