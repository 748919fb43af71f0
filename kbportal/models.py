"""The base floor's models: the append-only audit log (written by :mod:`kbportal.audit`) and each
tenant's single sign-on identity providers (used by :mod:`kbportal.sso`).

``kbportal`` is an installed app, so the audit table lives here, beside the code that writes it,
and every floor above can record events without the base importing any of them.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from kbportal.tenancy import TenantOwned, TenantScopedManager


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


class TenantIdentityProvider(TenantOwned):
    """A tenant's single sign-on identity provider: one django-allauth ``SocialApp`` (provider
    ``openid_connect``, its ``provider_id``, client id and secret, ``settings.server_url``) bound to
    the tenant, with the email domains it may admit (see :mod:`kbportal.sso`).

    A first login through ``social_app`` with a verified email in ``domains`` creates the user
    and a membership with ``default_role``; any other email, an unverified one, or a login
    through an app bound to no tenant (or an inactive one) is refused. ``domains`` are
    lowercase DNS names without ``@``.

    Row-level security as on every tenant-owned table, plus two narrow ways in used at login,
    before the tenant is known (migration ``0002_sso``): the rows whose ``social_app_id`` is in
    the transaction-local ``app.sso_app_ids`` setting, and the rows whose ``domains`` contain
    ``app.sso_domain``. Writes still need the tenant's context.
    """

    class Role(models.TextChoices):
        # Mirrors projects.Membership.Role (the base floor does not import projects).
        MEMBER = "member", "Member"
        ADMIN = "admin", "Admin"

    social_app = models.OneToOneField(
        "socialaccount.SocialApp", on_delete=models.CASCADE, related_name="kb_identity_provider"
    )
    domains = ArrayField(
        models.CharField(max_length=253),
        help_text="Email domains this provider admits, comma-separated (example.com, example.org).",
    )
    default_role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    is_active = models.BooleanField(default=True, help_text="Inactive: every login through it is refused.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "tenant identity provider"
        constraints = [
            models.CheckConstraint(condition=models.Q(domains__len__gt=0), name="tenantidp_has_domains"),
        ]

    def __str__(self) -> str:
        return f"{self.social_app} for tenant {self.tenant_id}"
