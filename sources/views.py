"""Web views of data sources: the tenant admins' status page, "sync now", and the git push
webhook. Each parses the request, calls a selector or service (``sources.selectors``,
``sources.scheduling``, ``sources.webhooks``) and renders its answer."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from kbportal.tenancy import tenant_context
from projects.selectors import user_is_tenant_admin, user_tenant_id
from sources.models import DataSource
from sources.scheduling import source_health_list, source_sync_queue
from sources.selectors import identity_list, source_sync_allowed
from sources.webhooks import SIGNATURE_HEADER, git_push_receive


def _admin_tenant(request: HttpRequest) -> int | None:
    """The user's tenant when they are one of its owners or admins, else ``None``."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None or not user_is_tenant_admin(request.user, tenant_id):
        return None
    return tenant_id


def _not_found(request: HttpRequest) -> HttpResponse:
    # As /audit/: members and people of other organizations are not told the page exists.
    return render(request, "search/not_found.html", {"message": "no such page"}, status=404)


@login_required
@require_GET
def status_page(request: HttpRequest) -> HttpResponse:
    """``/sources/status/``: every data source of the tenant with its schedule and health (last
    success, lag, row count, last run's counts and error, failing/backed-off state, next run).
    Owners and admins of the tenant only (404 otherwise)."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return _not_found(request)
    rows = source_health_list(tenant_id=tenant_id)
    counts = {
        "total": len(rows),
        "failing": sum(1 for r in rows if r.failing),
        "late": sum(1 for r in rows if r.late and r.source.enabled),
    }
    return render(request, "sources/status.html", {"rows": rows, "counts": counts})


@login_required
@require_GET
def identities_page(request: HttpRequest) -> HttpResponse:
    """``/manage/identities/``: the people and groups the organization's data sources expose
    (Slack users, Confluence accounts and groups, ...), each identity with the member it links to
    through a verified email, unlinked ones first with the reason. Owners and admins of the
    tenant only (404 otherwise)."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return _not_found(request)
    rows, groups = identity_list(tenant_id=tenant_id)
    counts = {"total": len(rows), "unlinked": sum(1 for r in rows if r.linked_to is None), "groups": len(groups)}
    return render(request, "sources/identities.html", {"rows": rows, "groups": groups, "counts": counts})


@login_required
@require_POST
def sync_now(request: HttpRequest, slug: str) -> HttpResponse:
    """``POST /sources/<slug>/sync``: queue a run of the tenant's source ``slug``, through the same
    path as the schedule, the admin and the API, for whoever may sync it there too (owners,
    admins, editors of one of its projects: ``sources.selectors.source_sync_allowed``); 404 for
    anyone else, so a source's existence is not told."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None:
        return _not_found(request)
    with tenant_context(tenant_id, user_id=request.user.pk):
        source = DataSource.objects.filter(slug=slug).first()
    if source is None or not source_sync_allowed(user=request.user, tenant_id=tenant_id, source=source):
        return _not_found(request)
    run = source_sync_queue(
        tenant_id=tenant_id, source_id=source.pk, via="web", actor=request.user, token_prefix=None,
        user_id=request.user.pk,
    )  # fmt: skip
    messages.success(request, f"Queued run {run.pk} of {source.name}.")
    return redirect("sources:status" if _admin_tenant(request) is not None else "search:ask")


@csrf_exempt
@require_POST
def git_push_hook(request: HttpRequest, public_id: str) -> JsonResponse:
    """``POST /hooks/git/<source public id>``: a repository host's push webhook for a git source.

    The answer is :func:`sources.webhooks.git_push_receive`'s (JSON, ``{"error", "code"}`` on
    failure), or 413 ``too_large`` for a body over Django's upload limit.
    """
    try:
        body = request.body
    except RequestDataTooBig:
        return JsonResponse(
            {"error": "the request body is larger than this server accepts", "code": "too_large"}, status=413
        )
    outcome = git_push_receive(
        public_id=public_id,
        body=body,
        signature=request.headers.get(SIGNATURE_HEADER),
        event=request.headers.get("X-GitHub-Event") or request.headers.get("X-Gitea-Event"),
        form_encoded=request.content_type == "application/x-www-form-urlencoded",
    )
    return JsonResponse(outcome.body, status=outcome.status)
