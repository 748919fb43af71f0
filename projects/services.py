"""Writes for tenants, memberships, projects, profiles and API tokens. Keyword-only, one transaction each."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from kbportal.audit import audit_record
from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Membership, Profile, Project, ProjectMember, Tenant
from projects.selectors import (
    API_TOKEN_PREFIX_CHARS,
    API_TOKEN_SECRET_CHARS,
    TokenIdentity,
    api_token_hash,
    project_queryset_readable,
)

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


def project_create(
    *,
    tenant_id: int,
    name: str,
    slug: str | None = None,
    description: str = "",
    visibility: str = Project.Visibility.TENANT,
) -> Project:
    """Create a project (a named bundle of data sources) in the tenant; the slug is made unique.

    ``visibility``: ``tenant`` (every member may query it) or ``members`` (owners, admins and its
    :class:`ProjectMember` rows only). Raises ``ValueError`` naming an unknown visibility. Writes
    ``project.create`` in the same transaction (as the member and visibility changes below do).
    """
    if visibility not in Project.Visibility.values:
        raise ValueError(f"visibility must be one of {', '.join(Project.Visibility.values)}, got {visibility!r}")
    with tenant_context(tenant_id):
        base = (slug or slugify(name))[:70] or "project"
        candidate, n = base, 1
        # Two names can share a slug ("Billing!" and "billing"): number the newcomer.
        while Project.objects.filter(slug=candidate).exists():
            n += 1
            candidate = f"{base}-{n}"
        project = Project.objects.create(
            tenant_id=tenant_id, name=name, slug=candidate, description=description, visibility=visibility
        )
        audit_record(
            action="project.create",
            tenant_id=tenant_id,
            object_type="projects.project",
            object_id=project.pk,
            data={"project": project.slug, "name": name, "visibility": visibility},
        )
        return project


class ProjectMemberError(ValueError):
    """A project membership cannot be written with these arguments (the message says which one)."""


def project_member_add(*, project: Project, user, role: str = ProjectMember.Role.VIEWER) -> ProjectMember:
    """Make ``user`` a member of ``project`` with ``role`` (``viewer`` or ``editor``); idempotent,
    an existing row gets the new role. Runs in the project's tenant context.

    Raises :class:`ProjectMemberError` when the role is unknown, the project is not in its
    tenant (a forged id) or the user is not a member of the tenant.
    """
    if role not in ProjectMember.Role.values:
        raise ProjectMemberError(f"role must be one of {', '.join(ProjectMember.Role.values)}, got {role!r}")
    with tenant_context(project.tenant_id):
        if not Project.objects.filter(pk=project.pk).exists():
            raise ProjectMemberError(f"project {project.slug!r} is not in this organization")
        if not Membership.objects.filter(user=user).exists():
            raise ProjectMemberError(f"user {user.get_username()!r} is not a member of the project's organization")
        member, created = ProjectMember.objects.get_or_create(
            tenant_id=project.tenant_id, project=project, user=user, defaults={"role": role}
        )
        if not created and member.role != role:
            member.role = role
            member.save(update_fields=["role"])
        elif not created:
            return member
        audit_record(
            action="project.member_add",
            tenant_id=project.tenant_id,
            object_type="projects.projectmember",
            object_id=member.pk,
            data={"project": project.slug, "user": user.get_username(), "role": role},
        )
    return member


def project_member_remove(*, project: Project, user) -> bool:
    """Remove ``user`` from ``project``; True when a row was deleted. Their default project, if it
    was this one and it is restricted, falls back at read time (``project_default_for_user``)."""
    with tenant_context(project.tenant_id):
        deleted, _ = ProjectMember.objects.filter(project=project, user=user).delete()
        if deleted:
            audit_record(
                action="project.member_remove",
                tenant_id=project.tenant_id,
                object_type="projects.project",
                object_id=project.pk,
                data={"project": project.slug, "user": user.get_username()},
            )
    return bool(deleted)


def project_set_visibility(*, project: Project, visibility: str) -> Project:
    """Set ``project.visibility`` (``tenant`` or ``members``). Raises ``ValueError`` naming a bad value."""
    if visibility not in Project.Visibility.values:
        raise ValueError(f"visibility must be one of {', '.join(Project.Visibility.values)}, got {visibility!r}")
    with tenant_context(project.tenant_id):
        changed = Project.objects.filter(pk=project.pk).exclude(visibility=visibility).update(visibility=visibility)
        project.refresh_from_db(fields=["visibility"])
        if changed:
            audit_record(
                action="project.visibility",
                tenant_id=project.tenant_id,
                object_type="projects.project",
                object_id=project.pk,
                data={"project": project.slug, "visibility": visibility},
            )
    return project


class ProjectNotFound(LookupError):
    """The project does not exist in the user's tenant (or the user may not use it)."""


def profile_set_default_project(*, user, tenant_id: int, project_id: int, chosen: bool = True) -> Profile:
    """Set the project that scopes the user's queries. ``chosen``: the user (or the operator for
    them) picked it, which completes onboarding, so later logins no longer lead there; a default
    given automatically (an SSO first login) passes ``False``. Raises ``ProjectNotFound`` unless
    the user may read it (``projects.selectors.project_queryset_readable``)."""
    with tenant_context(tenant_id, user_id=user.pk):
        if not Membership.objects.filter(user=user).exists():
            raise ProjectNotFound("you are not a member of this organization")
        if not project_queryset_readable(user_id=user.pk).filter(pk=project_id).exists():
            raise ProjectNotFound(f"no project {project_id} in this organization")
        profile, _ = Profile.objects.get_or_create(user=user)
        profile.tenant_id = tenant_id
        profile.default_project_id = project_id
        if chosen:
            profile.onboarded_at = profile.onboarded_at or timezone.now()
        profile.save(update_fields=["tenant", "default_project", "onboarded_at"])
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


# ---------- API tokens ---------------------------------------------------------------------------

_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits
API_TOKEN_TOUCH_SECONDS = 60  # last_used_at is written at most once a minute per token


class ApiTokenError(ValueError):
    """An API token cannot be created with these arguments (the message says which one)."""


def api_token_create(
    *, tenant: Tenant, user, name: str, project: Project | None = None, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Create an API token; returns ``(token row, plain token)``. The plain token is not kept.

    The plain token is ``kb_<8 lowercase letters/digits>_<40 letters/digits>`` (~238 bits of
    secret); the row stores its SHA-256 only. ``user`` must be a member of ``tenant``; ``None``
    makes a service token, which must name a ``project``. ``project`` (of ``tenant``) pins the
    token to it; without one the token follows the user's default project. ``expires_in_days``
    (>= 1) sets ``expires_at``; ``None`` never expires. Raises :class:`ApiTokenError`. Writes
    the ``token.create`` audit event (prefix, name, user, project) in the same transaction; its
    actor is the current request's user (none from ``manage.py``).
    """
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ApiTokenError("a token needs a name of 1 to 100 characters")
    if expires_in_days is not None and (isinstance(expires_in_days, bool) or int(expires_in_days) < 1):
        raise ApiTokenError("expires_in_days must be a whole number of days >= 1")
    if user is None and project is None:
        raise ApiTokenError("a service token (no user) must name its project")
    with tenant_context(tenant.pk, user_id=user.pk if user else None):
        if user is not None and not Membership.objects.filter(user=user).exists():
            raise ApiTokenError(f"user {user.get_username()!r} is not a member of tenant {tenant.slug!r}")
        if project is not None and not Project.objects.filter(pk=project.pk).exists():
            raise ApiTokenError(f"project {project.slug!r} is not in tenant {tenant.slug!r}")
        if (
            project is not None
            and user is not None
            and not project_queryset_readable(user_id=user.pk).filter(pk=project.pk).exists()
        ):
            raise ApiTokenError(f"user {user.get_username()!r} may not read project {project.slug!r}")
        prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(API_TOKEN_PREFIX_CHARS))
        secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(API_TOKEN_SECRET_CHARS))
        raw = f"kb_{prefix}_{secret}"
        expires_at = timezone.now() + timedelta(days=int(expires_in_days)) if expires_in_days else None
        token = ApiToken.objects.create(
            tenant=tenant,
            user=user,
            name=name,
            prefix=prefix,
            token_hash=api_token_hash(raw),
            project=project,
            expires_at=expires_at,
        )
        audit_record(
            action="token.create",
            tenant_id=tenant.pk,
            object_type="projects.apitoken",
            object_id=token.pk,
            data={
                "prefix": prefix,
                "name": name,
                "user": user.get_username() if user is not None else None,
                "project": project.slug if project is not None else None,
                "expires_at": expires_at,
            },
        )
    return token, raw


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke ``token`` now (in its tenant's context); revoking again keeps the first time.

    The ``token.revoke`` audit event is written in the same transaction, only when this call
    revoked it (its actor is the current request's user; none from ``manage.py``).
    """
    with tenant_context(token.tenant_id):
        revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        token.refresh_from_db(fields=["revoked_at"])
        if revoked:
            audit_record(
                action="token.revoke",
                tenant_id=token.tenant_id,
                object_type="projects.apitoken",
                object_id=token.pk,
                data={"prefix": token.prefix, "name": token.name},
            )
    return token


def api_token_touch(*, identity: TokenIdentity) -> None:
    """Record that the token was used: ``last_used_at = now``, at most once a minute.

    One conditional UPDATE in the token's tenant context, so a burst of calls writes once.
    """
    now = timezone.now()
    with tenant_context(identity.tenant_id):
        ApiToken.objects.filter(pk=identity.token_id).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - timedelta(seconds=API_TOKEN_TOUCH_SECONDS))
        ).update(last_used_at=now)
