"""Reads for tenants and projects; every one is scoped to the asking user."""

from __future__ import annotations

from kbportal.tenancy import tenant_context, user_context
from projects.models import Membership, Profile, Project


class ScopeNotFound(LookupError):
    """The user has no tenant, or the project is not one they may use (-> 404, never 403)."""


def membership_list_for_user(user) -> list[Membership]:
    """The user's memberships across tenants (read under the user's own RLS clause)."""
    with user_context(user.pk):
        return list(Membership.all_tenants.filter(user=user).select_related("tenant"))


def user_tenant_id(user) -> int | None:
    """The tenant the user works in: their profile's, if still a member, else their first."""
    memberships = membership_list_for_user(user)
    if not memberships:
        return None
    profile = Profile.objects.filter(user=user).first()
    if profile and profile.tenant_id and any(m.tenant_id == profile.tenant_id for m in memberships):
        return profile.tenant_id
    return memberships[0].tenant_id


def project_list_for_user(user) -> list[Project]:
    """Projects of the user's tenant; empty when the user has no tenant."""
    tenant_id = user_tenant_id(user)
    if tenant_id is None:
        return []
    with tenant_context(tenant_id, user_id=user.pk):
        return list(Project.objects.all())


def user_is_tenant_admin(user, tenant_id: int) -> bool:
    """True when the user is an owner or admin of the tenant."""
    return any(m.tenant_id == tenant_id and m.is_admin for m in membership_list_for_user(user))
