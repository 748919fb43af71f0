"""Web views of data sources: the tenant admins' status page and "sync now", and the git push
webhook. Each calls one function of ``sources.scheduling``; none holds logic of its own."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from urllib.parse import parse_qs

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from kbportal.secrets import SecretsError, decrypt_value
from kbportal.tenancy import tenant_context
from projects.selectors import user_is_tenant_admin, user_tenant_id
from sources.models import DataSource
from sources.scheduling import source_find_for_webhook, source_health_list, source_sync_queue
from sources.selectors import source_sync_allowed

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"


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


def _error(status: int, code: str, text: str, field: str | None = None) -> JsonResponse:
    body = {"error": text, "code": code}
    if field:
        body["field"] = field
    return JsonResponse(body, status=status)


def signature_valid(secret: str, body: bytes, header: str) -> bool:
    """True when ``header`` is ``sha256=<hex HMAC-SHA256 of body keyed by secret>`` (GitHub's
    ``X-Hub-Signature-256``; Gitea and GitLab-compatible senders use the same form). Constant
    time comparison."""
    expected = "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode("ascii"), header.strip().lower().encode("ascii", "replace"))


def _pushed_branch(request: HttpRequest, body: bytes) -> str | None:
    """The branch a push event names (``refs/heads/<branch>``), or ``None`` when it names none."""
    try:
        if request.content_type == "application/x-www-form-urlencoded":
            payload = json.loads(parse_qs(body.decode("utf-8")).get("payload", ["{}"])[0])
        else:
            payload = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return None
    ref = payload.get("ref") if isinstance(payload, dict) else None
    if isinstance(ref, str) and ref.startswith("refs/heads/"):
        return ref[len("refs/heads/") :]
    return None


@csrf_exempt
@require_POST
def git_push_hook(request: HttpRequest, public_id: str) -> JsonResponse:
    """``POST /hooks/git/<source public id>``: a repository host's push webhook for a git source.

    Checks ``X-Hub-Signature-256`` (HMAC-SHA256 of the raw body with the source's
    ``webhook_secret``) and queues a sync of that source (a run already queued is reused).
    Responses, all JSON ``{"error", "code"}`` on failure: 202 ``{"status": "queued", "run_id"}``;
    200 ``{"status": "pong"}`` for a ``ping`` event and ``{"status": "ignored", "reason"}`` for
    another event or a push to a branch the source does not index; 404 no git source with
    that id (in any tenant: nothing else is said); 403 ``webhook_disabled`` (no secret set) or
    ``signature_invalid``; 401 ``signature_missing``; 413 a body over Django's upload limit.
    """
    source = source_find_for_webhook(public_id)
    if source is None or source.kind != "git":
        return _error(404, "not_found", "no git data source with this id")
    stored = source.config.get("webhook_secret")
    if not isinstance(stored, str) or not stored:
        return _error(403, "webhook_disabled", "webhooks are off: this data source has no webhook_secret")
    try:
        secret = decrypt_value(stored, label=f"data source {source.slug!r}", field="webhook_secret")
    except SecretsError:
        logger.exception("webhook of source %s: its webhook_secret cannot be decrypted", source.pk)
        return _error(503, "secret_unreadable", "this data source's webhook_secret cannot be read on the server")
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, "too_large", "the request body is larger than this server accepts")
    header = request.headers.get(SIGNATURE_HEADER)
    if not header:
        return _error(
            401, "signature_missing",
            f"{SIGNATURE_HEADER}: missing; send 'sha256=<hex HMAC-SHA256 of the body keyed by webhook_secret>'",
            field=SIGNATURE_HEADER,
        )  # fmt: skip
    if not signature_valid(secret, body, header):
        return _error(
            403, "signature_invalid",
            f"{SIGNATURE_HEADER}: does not match the body signed with this source's webhook_secret",
            field=SIGNATURE_HEADER,
        )  # fmt: skip
    event = request.headers.get("X-GitHub-Event") or request.headers.get("X-Gitea-Event") or "push"
    if event == "ping":
        return JsonResponse({"status": "pong"})
    if event != "push":
        return JsonResponse({"status": "ignored", "reason": f"event {event!r} is not a push"})
    branch = _pushed_branch(request, body)
    wanted = source.config.get("branch")
    if branch is not None and wanted and branch != wanted:
        return JsonResponse({"status": "ignored", "reason": f"push to {branch!r}; this source indexes {wanted!r}"})
    run = source_sync_queue(
        tenant_id=source.tenant_id, source_id=source.pk, via="webhook", actor=None, token_prefix=None,
        reuse_queued=True,
    )  # fmt: skip
    return JsonResponse({"status": "queued", "run_id": run.pk}, status=202)
