"""Push webhooks of repository hosts: verify a push to a git data source and queue its sync.

The view (``sources.views.git_push_hook``) reads the request and writes the response; this
module decides. GitHub's ``X-Hub-Signature-256`` form (Gitea and GitLab-compatible senders use
the same) is an HMAC-SHA256 of the raw body keyed by the source's ``webhook_secret``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from kbportal.secrets import SecretsError, decrypt_value
from sources.scheduling import source_find_for_webhook, source_sync_queue

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"


@dataclass(frozen=True)
class WebhookOutcome:
    """What to answer a webhook call: an HTTP ``status`` and its JSON ``body``."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


def _error(status: int, code: str, text: str, field_name: str | None = None) -> WebhookOutcome:
    body = {"error": text, "code": code}
    if field_name:
        body["field"] = field_name
    return WebhookOutcome(status, body)


def signature_valid(secret: str, body: bytes, header: str) -> bool:
    """True when ``header`` is ``sha256=<hex HMAC-SHA256 of body keyed by secret>``. Constant
    time comparison."""
    expected = "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode("ascii"), header.strip().lower().encode("ascii", "replace"))


def pushed_branch(body: bytes, *, form_encoded: bool) -> str | None:
    """The branch a push event names (``refs/heads/<branch>``), or ``None`` when it names none.
    ``form_encoded``: the body is ``application/x-www-form-urlencoded`` with a ``payload`` field."""
    try:
        if form_encoded:
            payload = json.loads(parse_qs(body.decode("utf-8")).get("payload", ["{}"])[0])
        else:
            payload = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return None
    ref = payload.get("ref") if isinstance(payload, dict) else None
    if isinstance(ref, str) and ref.startswith("refs/heads/"):
        return ref[len("refs/heads/") :]
    return None


def git_push_receive(
    *, public_id: str, body: bytes, signature: str | None, event: str | None, form_encoded: bool = False
) -> WebhookOutcome:
    """Verify one webhook call for git source ``public_id`` and, for a push to the branch it
    indexes, queue its sync (a run already queued is reused; audit event ``source.sync`` via
    ``webhook``).

    Outcomes: 202 ``{"status": "queued", "run_id"}``; 200 ``{"status": "pong"}`` for a ``ping``
    event and ``{"status": "ignored", "reason"}`` for another event or a push to another branch;
    404 no git source with that id (in any tenant: nothing else is said); 403 ``webhook_disabled``
    (no secret set) or ``signature_invalid``; 401 ``signature_missing``; 503
    ``secret_unreadable`` (the stored secret cannot be decrypted). ``event`` defaults to push.
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
    if not signature:
        return _error(
            401,
            "signature_missing",
            f"{SIGNATURE_HEADER}: missing; send 'sha256=<hex HMAC-SHA256 of the body keyed by webhook_secret>'",
            SIGNATURE_HEADER,
        )
    if not signature_valid(secret, body, signature):
        return _error(
            403,
            "signature_invalid",
            f"{SIGNATURE_HEADER}: does not match the body signed with this source's webhook_secret",
            SIGNATURE_HEADER,
        )
    event = event or "push"
    if event == "ping":
        return WebhookOutcome(200, {"status": "pong"})
    if event != "push":
        return WebhookOutcome(200, {"status": "ignored", "reason": f"event {event!r} is not a push"})
    branch = pushed_branch(body, form_encoded=form_encoded)
    wanted = source.config.get("branch")
    if branch is not None and wanted and branch != wanted:
        return WebhookOutcome(
            200, {"status": "ignored", "reason": f"push to {branch!r}; this source indexes {wanted!r}"}
        )
    run = source_sync_queue(
        tenant_id=source.tenant_id,
        source_id=source.pk,
        via="webhook",
        actor=None,
        token_prefix=None,
        reuse_queued=True,
    )
    return WebhookOutcome(202, {"status": "queued", "run_id": run.pk})
