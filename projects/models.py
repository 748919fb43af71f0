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
    """A named bundle of data sources; scopes every query. Sources attach via ``sources``."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="project_unique_slug")]

    def __str__(self) -> str:
        return self.name


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

    def __str__(self) -> str:
        return f"profile of {self.user}"
