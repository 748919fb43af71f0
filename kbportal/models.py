"""The base floor's one model: the append-only audit log (written by :mod:`kbportal.audit`).

``kbportal`` is an installed app, so the audit table lives here, beside the code that writes it,
and every floor above can record events without the base importing any of them.
"""

from __future__ import annotations

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from kbportal.tenancy import TenantScopedManager


class AuditEvent(models.Model):
    """One thing a person, token or the system did: asked, searched, called the API, logged in,
    changed something in the admin, created or synced a data source, created or revoked a token,
    voted on an answer.

    Append-only at the database level (migration ``0001_initial``): the app role holds INSERT and
    SELECT only, and a trigger refuses UPDATE, DELETE and TRUNCATE for every role, the owner
    included. Row-level security by ``tenant_id`` as on every tenant-owned table; a row with no
    tenant (a refused login, a call with a refused token, an operator's change to a user) can be
    written by the app role only outside any tenant context and is never readable by it: only
    the operator's admin (the table owner) sees those.

    ``tenant_id`` and ``actor`` are plain ids without a database constraint (like the document
    ids on ``search.AnswerRecord``): the record outlives a deleted tenant or user, and the base
    floor points at no app. ``actor_username`` keeps the name as it was. ``object_type`` is
    ``app_label.model_name``, ``object_id`` the row's primary key as text. ``data`` holds the
    action's details (for ``ask``: question, answer id, evidence and cited document ids).
    """

    tenant_id = models.BigIntegerField(null=True, blank=True, help_text="Empty before a tenant is known.")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_username = models.CharField(max_length=150, blank=True)
    actor_token_prefix = models.CharField(max_length=16, null=True, blank=True)
    action = models.CharField(max_length=40)
    object_type = models.CharField(max_length=80, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    data = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)

    # As on TenantOwned: the unscoped manager first (framework code, the operator's admin), and
    # ``objects`` for application code, which refuses to run outside a tenant context.
    all_tenants = models.Manager()
    objects = TenantScopedManager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant_id", "-created_at"], name="auditevent_tenant_created"),
            models.Index(fields=["tenant_id", "action", "-created_at"], name="auditevent_tenant_action"),
        ]

    def __str__(self) -> str:
        who = self.actor_username or (f"kb_{self.actor_token_prefix}_…" if self.actor_token_prefix else "-")
        return f"{self.action} by {who} at {self.created_at:%Y-%m-%d %H:%M:%S}"
