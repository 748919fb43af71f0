"""Tenants (organizations), memberships, projects and each user's default project."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from kbportal.tenancy import TenantOwned


class Tenant(models.Model):
    """An organization. Every tenant-owned row carries its id; RLS keys on it."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(TenantOwned):
    """A user's role in a tenant."""

    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} ({self.role})"

    @property
    def is_admin(self) -> bool:
        return self.role in {self.Role.OWNER, self.Role.ADMIN}


class Project(TenantOwned):
    """A named bundle of data sources; scopes every query. Sources attach via ``sources``.

    ``visibility`` says who may query it: ``tenant`` (every member of the organization, the
    default) or ``members`` (owners and admins of the organization, plus its
    :class:`ProjectMember` rows). ``projects.selectors.project_queryset_readable`` applies it.
    """

    class Visibility(models.TextChoices):
        TENANT = "tenant", "Everyone in the organization"
        MEMBERS = "members", "Project members only"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80)
    description = models.TextField(blank=True)
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.TENANT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="project_unique_slug")]

    def __str__(self) -> str:
        return self.name


class ProjectMember(TenantOwned):
    """A user's membership of one project: what makes a ``members``-only project readable.

    ``viewer`` may query the project; ``editor`` may also sync its data sources. Owners and
    admins of the organization read every project without a row here. The user must be a
    member of the tenant (``projects.services.project_member_add`` checks; a user who leaves
    the tenant reads nothing, whatever rows remain).
    """

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer"
        EDITOR = "editor", "Editor"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="projectmember_unique_user")]

    def __str__(self) -> str:
        return f"{self.user} in project {self.project_id} ({self.role})"


class Profile(models.Model):
    """Per-user settings: the tenant and project that scope queries unless the user picks another.

    Set at onboarding. Not tenant-owned (it belongs to the user); the project it points at is
    read through the tenant's row-level security like any other.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="kb_profile")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    default_project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=True
    )
    onboarded_at = models.DateTimeField(
        null=True, blank=True, help_text="When the user chose their default project; until then a login leads there."
    )

    def __str__(self) -> str:
        return f"profile of {self.user}"


class ApiToken(TenantOwned):
    """A per-user (or, with no user, per-service) API token for scripts, the API and MCP clients.

    The plain token ``kb_<prefix>_<secret>`` is shown once at creation; only its SHA-256 hex
    digest is stored. ``prefix`` is public (shown in lists, used to revoke). Row-level security
    admits a row by tenant, or the one row whose ``token_hash`` equals the transaction-local
    ``app.token_hash`` setting (authentication, before the tenant is known): a caller must hold
    the token to see its row. A token with no ``project`` uses its user's default project; a
    service token (no user) must name one.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # CASCADE, not SET_NULL: a token pinned to a deleted project must not widen to the default one.
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False) | models.Q(project__isnull=False),
                name="apitoken_service_token_has_project",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} (kb_{self.prefix}_…)"


class Invitation(TenantOwned):
    """An invitation to join the organization with a role, sent to an email address.

    The link ``/invite/<tenant slug>/<token>/`` carries a secret token; only its SHA-256 hex digest
    is stored. It is accepted once, before ``expires_at``, by a signed-in user who has verified
    ``email``, or by a new account created from the link (holding the link proves the address,
    so that account's address is stored as verified).
    """

    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    sent_by_operator = models.BooleanField(
        default=False, help_text="Sent by the platform operator (manage.py tenant add), not by a member."
    )
    project = models.ForeignKey(
        "Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="On accepting, the new member joins this project as a viewer and it becomes their default.",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} as {self.role}"
