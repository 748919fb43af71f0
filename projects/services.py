"""Writes for tenants, memberships, projects and profiles. Keyword-only, one transaction each."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from kbportal.tenancy import tenant_context
from projects.models import Membership, Profile, Project, Tenant

User = get_user_model()


def tenant_create(*, name: str, slug: str | None = None, owner=None) -> Tenant:
    """Create a tenant; ``owner`` (a user) becomes its owner and has it as their tenant."""
    with transaction.atomic():
        tenant = Tenant.objects.create(name=name, slug=slug or slugify(name)[:80])
        if owner is not None:
            membership_create(tenant_id=tenant.pk, user=owner, role=Membership.Role.OWNER)
    return tenant


def membership_create(*, tenant_id: int, user, role: str = Membership.Role.MEMBER) -> Membership:
    """Add ``user`` to the tenant with ``role``; sets it as the user's tenant if they have none."""
    with tenant_context(tenant_id):
        membership, _ = Membership.objects.get_or_create(tenant_id=tenant_id, user=user, defaults={"role": role})
        profile, _ = Profile.objects.get_or_create(user=user)
        if profile.tenant_id is None:
            profile.tenant_id = tenant_id
            profile.save(update_fields=["tenant"])
    return membership


def project_create(*, tenant_id: int, name: str, slug: str | None = None, description: str = "") -> Project:
    """Create a project (a named bundle of data sources) in the tenant; the slug is made unique."""
    with tenant_context(tenant_id):
        base = (slug or slugify(name))[:70] or "project"
        candidate, n = base, 1
        # Two names can share a slug ("Billing!" and "billing"): number the newcomer.
        while Project.objects.filter(slug=candidate).exists():
            n += 1
            candidate = f"{base}-{n}"
        return Project.objects.create(tenant_id=tenant_id, name=name, slug=candidate, description=description)


class ProjectNotFound(LookupError):
    """The project does not exist in the user's tenant (or the user may not use it)."""


def profile_set_default_project(*, user, tenant_id: int, project_id: int) -> Profile:
    """Set the project that scopes the user's queries. Raises ``ProjectNotFound``."""
    with tenant_context(tenant_id, user_id=user.pk):
        if not Membership.objects.filter(user=user).exists():
            raise ProjectNotFound("you are not a member of this organization")
        if not Project.objects.filter(pk=project_id).exists():
            raise ProjectNotFound(f"no project {project_id} in this organization")
        profile, _ = Profile.objects.get_or_create(user=user)
        profile.tenant_id = tenant_id
        profile.default_project_id = project_id
        profile.save(update_fields=["tenant", "default_project"])
    return profile


@dataclass
class OnboardedTenant:
    tenant: Tenant
    admin: object
    project: Project


def tenant_onboard(
    *,
    name: str,
    slug: str,
    admin_username: str,
    admin_password: str,
    admin_email: str = "",
    project_name: str = "Everything",
    superuser: bool = False,
) -> OnboardedTenant:
    """Create (or reuse) a tenant, its admin user and a first project set as their default.

    Idempotent: re-running with the same slugs returns the existing rows (the password is reset
    to ``admin_password``).
    """
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
    admin = User.objects.filter(username=admin_username).first()
    if admin is None:
        admin = User.objects.create_user(username=admin_username, email=admin_email, password=admin_password)
    else:
        admin.set_password(admin_password)
    admin.is_staff = admin.is_staff or superuser
    admin.is_superuser = admin.is_superuser or superuser
    admin.save()
    membership_create(tenant_id=tenant.pk, user=admin, role=Membership.Role.OWNER)
    with tenant_context(tenant.pk):
        project = Project.objects.filter(slug=slugify(project_name)).first()
    if project is None:
        project = project_create(tenant_id=tenant.pk, name=project_name)
    profile_set_default_project(user=admin, tenant_id=tenant.pk, project_id=project.pk)
    return OnboardedTenant(tenant=tenant, admin=admin, project=project)
