"""The API's writes of its own: queue a "sync now" of a data source (as the admin action does),
and the ``api.call`` audit event of each request."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase
from rest_framework.authentication import get_authorization_header

from kbportal.audit import audit_record
from projects.selectors import ApiTokenRejected, TokenIdentity, api_token_parse, user_tenant_id
from search.api.authentication import ApiCaller
from search.api.selectors import caller_may_sync_source, source_get_for_caller
from sources.models import IngestionRun
from sources.scheduling import source_sync_queue

API_PATH = "/api/v1/"


class SyncForbidden(PermissionError):
    """The caller may see the data source but is neither an owner or admin of its tenant nor an
    editor of a project it is attached to (-> 403)."""


def source_sync_request(*, actor: ApiCaller, source_slug: str) -> IngestionRun:
    """Queue an ingestion run of data source ``source_slug``; returns the queued run.

    Creates the ``IngestionRun`` (status ``queued``) and its ``source.sync`` audit event in one
    transaction and, once it commits, sends ``sources.tasks.ingest_source(tenant_id, source_id,
    run_id)`` to the ``ingest`` queue (the admin's "sync now"). Raises ``SourceNotFound``
    (-> 404) for a source outside the actor's projects, then ``SyncForbidden`` (-> 403) unless
    the actor is a person who is an owner or admin of the tenant or an ``editor`` of one of the
    source's projects (a service token never is).
    """
    source = source_get_for_caller(actor, slug=source_slug)
    if not caller_may_sync_source(actor, source):
        raise SyncForbidden("only an owner or admin of the organization, or an editor of the project, can sync it")
    # The one queueing path (the schedule, the admin, webhooks): the worker's per-source lock
    # refuses (records as skipped) a run while another run of the source is in progress.
    return source_sync_queue(
        tenant_id=source.tenant_id,
        source_id=source.pk,
        via="api",
        actor=actor.user,
        token_prefix=actor.identity.prefix if actor.identity is not None else None,
        user_id=actor.user_id,
    )


def _presented_prefix(request: HttpRequest) -> str | None:
    """The public prefix of a bearer token the request presented, even a refused one."""
    header = get_authorization_header(request).split()  # type: ignore[arg-type]  # reads request.META only
    if len(header) != 2 or header[0].lower() != b"bearer":
        return None
    try:
        return api_token_parse(header[1].decode("ascii"))[0]
    except (ApiTokenRejected, UnicodeError):
        return None


def api_call_record(*, request: HttpRequest, response: HttpResponseBase, ms: float) -> None:
    """Write the ``api.call`` audit event of one finished ``/api/v1/`` request.

    ``data``: ``method``, ``path``, ``status`` (HTTP), ``ms`` (wall time of the view, in
    milliseconds, rounded to 0.1), ``view`` (the URL name, when one matched) and, for an error,
    its ``code`` (``not_found``, ``revoked``, ``throttled``...). The tenant and actor are the API
    token's (with its prefix), else the logged-in user's; a request nobody authenticated (no
    credentials, a refused token) has no tenant, and keeps the refused token's prefix.
    """
    auth = getattr(request, "auth", None)
    user = getattr(request, "user", None)
    tenant_id: int | None
    if isinstance(auth, TokenIdentity):
        tenant_id, actor, prefix = auth.tenant_id, auth.user, auth.prefix
    elif user is not None and user.is_authenticated and user.pk is not None:
        tenant_id, actor, prefix = user_tenant_id(user), user, None
    else:
        tenant_id, actor, prefix = None, None, _presented_prefix(request)
    data: dict[str, Any] = {
        "method": request.method,
        "path": request.path,
        "status": response.status_code,
        "ms": round(ms, 1),
    }
    match = getattr(request, "resolver_match", None)
    if match is not None and match.view_name:
        data["view"] = match.view_name
    body = getattr(response, "data", None)
    if response.status_code >= 400 and isinstance(body, dict) and isinstance(body.get("code"), str):
        data["code"] = body["code"]
    audit_record(
        action="api.call",
        tenant_id=tenant_id,
        actor=actor,
        token_prefix=prefix,
        object_type="",
        object_id="",
        data=data,
    )
