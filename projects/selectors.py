"""Reads for tenants, projects and API tokens; every one is scoped to the asking user or token."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from kbportal.tenancy import TenantContextMissing, current_tenant_id, tenant_context, user_context
from projects.models import ApiToken, Membership, Profile, Project, ProjectMember, Tenant


class ScopeNotFound(LookupError):
    """The user has no tenant, or the project is not one they may use (-> 404, never 403)."""


def _request_memo() -> dict | None:
    """A dict living as long as the web request being handled (``kbportal.middleware.
    current_request``), where a selector keeps what it read about the signed-in user so that a
    page asking it twice (the view's scope, then the page header) reads it once; ``None``
    outside a request (commands, tasks, services called directly). Any write to a membership or
    profile empties it (:func:`forget_request_memo`, connected to their save and delete
    signals), so a request never reads its own writes stale."""
    from kbportal.middleware import current_request

    request = current_request()
    if request is None:
        return None
    depth = len(connection.atomic_blocks)
    memo = getattr(request, "_kb_selector_memo", None)
    if memo is None:
        memo = {"__depth__": depth}
        request._kb_selector_memo = memo  # type: ignore[attr-defined]
    if depth != memo["__depth__"]:
        # Inside a transaction the request opened, a read may see writes that a rollback undoes
        # (sending no signal): read afresh there and keep nothing.
        return None
    return memo


def forget_request_memo(*args, **kwargs) -> None:
    """Empty the current request's memo (:func:`_request_memo`); a signal receiver."""
    from kbportal.middleware import current_request

    memo = getattr(current_request(), "_kb_selector_memo", None)
    if memo is not None:
        depth = memo.get("__depth__")
        memo.clear()
        memo["__depth__"] = depth


def _once_per_request(key: tuple, read: Callable[[], Any]) -> Any:
    """``read()``, or what it returned earlier in this request (:func:`_request_memo`)."""
    memo = _request_memo()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    return memo[key]


def _memberships(user) -> list[Membership]:
    with user_context(user.pk):
        return list(Membership.all_tenants.filter(user=user).select_related("tenant"))


def membership_list_for_user(user) -> list[Membership]:
    """The user's memberships across tenants (read under the user's own RLS clause; once per
    request, :func:`_request_memo`)."""
    return list(_once_per_request(("memberships", user.pk), lambda: _memberships(user)))


def user_tenant_id(user) -> int | None:
    """The tenant the user works in: their profile's, if still a member, else their first."""
    return _tenant_of(user, membership_list_for_user(user))


def _tenant_of(user, memberships: list[Membership]) -> int | None:
    """:func:`user_tenant_id` from the user's memberships, read once by the caller."""
    if not memberships:
        return None
    profile = _once_per_request(("profile", user.pk), lambda: Profile.objects.filter(user=user).first())
    if profile and profile.tenant_id and any(m.tenant_id == profile.tenant_id for m in memberships):
        return profile.tenant_id
    return memberships[0].tenant_id


def user_is_tenant_admin(user, tenant_id: int) -> bool:
    """True when the user is an owner or admin of the tenant."""
    return any(m.tenant_id == tenant_id and m.is_admin for m in membership_list_for_user(user))


def user_is_admin_of_own_tenant(user) -> bool:
    """``user_is_tenant_admin(user, user_tenant_id(user))`` (False without a tenant), from one
    read of the memberships rather than two (the page header asks it on every page)."""
    memberships = membership_list_for_user(user)
    tenant_id = _tenant_of(user, memberships)
    return tenant_id is not None and any(m.tenant_id == tenant_id and m.is_admin for m in memberships)


# ---------- project membership: who may read which project and data source ------------------------
#
# The one place that decides it. Web pages, the API, API tokens, the MCP server and the document
# page all go through these functions (``sources.selectors.scope_for_user``/``scope_for_token``
# build the ``allowed_source_ids`` that retrieval takes from them).

_ADMIN_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)


def _require_tenant_context() -> int:
    tenant_id = current_tenant_id()
    if tenant_id is None:
        raise TenantContextMissing("project membership is read inside tenant_context()")
    return tenant_id


def project_queryset_readable(*, user_id: int | None) -> QuerySet[Project]:
    """The current tenant's projects that user ``user_id`` may query (runs inside ``tenant_context``).

    - not a member of the tenant (or ``None``): no project;
    - owner or admin of the tenant: every project;
    - member: projects with ``visibility = tenant``, plus ``members`` projects where the user
      has a :class:`~projects.models.ProjectMember` row.

    Returns an unevaluated queryset (one SQL statement with an ``EXISTS`` per rule), so callers
    can narrow it (``.filter(slug=...)``) or join through it (``sources``). Raises
    ``TenantContextMissing`` outside a tenant context.
    """
    _require_tenant_context()
    if user_id is None:
        return Project.objects.none()
    role = Membership.objects.filter(user_id=user_id).values_list("role", flat=True).first()
    if role is None:
        return Project.objects.none()
    if role in _ADMIN_ROLES:
        return Project.objects.all()
    member_of = ProjectMember.objects.filter(project_id=OuterRef("pk"), user_id=user_id)
    return Project.objects.filter(visibility=Project.Visibility.TENANT) | Project.objects.filter(
        Exists(member_of), visibility=Project.Visibility.MEMBERS
    )


def project_can_edit(*, user_id: int | None, project_ids: list[int]) -> bool:
    """True when the user may change (sync the sources of) one of ``project_ids``: an owner or
    admin of the tenant, or an ``editor`` :class:`ProjectMember` of a project they may read.
    Runs inside ``tenant_context``."""
    _require_tenant_context()
    if user_id is None or not project_ids:
        return False
    role = Membership.objects.filter(user_id=user_id).values_list("role", flat=True).first()
    if role in _ADMIN_ROLES:
        return True
    if role is None:
        return False
    return ProjectMember.objects.filter(
        user_id=user_id,
        role=ProjectMember.Role.EDITOR,
        project__in=project_queryset_readable(user_id=user_id).filter(pk__in=project_ids),
    ).exists()


def project_default_for_user(*, user_id: int | None) -> Project | None:
    """The project a query without one runs in (inside ``tenant_context``): the user's
    ``Profile.default_project`` while they may read it; when it is a project of this tenant they
    may no longer read (made members-only, or they were removed), the first readable project by
    name, so losing access never strands the user; ``None`` when no default was chosen in this
    tenant (or nothing is readable)."""
    profile = Profile.objects.filter(user_id=user_id).first() if user_id is not None else None
    if profile is None or profile.default_project_id is None:
        return None
    if not Project.objects.filter(pk=profile.default_project_id).exists():
        return None  # another tenant's project (row-level security) or gone: no default here
    readable = project_queryset_readable(user_id=user_id)
    project = readable.filter(pk=profile.default_project_id).first()
    return project if project is not None else readable.order_by("name", "pk").first()


def project_list_for_user(user, *, tenant_id: int | None = None) -> list[Project]:
    """The projects of the user's tenant that they may query (:func:`project_queryset_readable`),
    by name; empty when the user has no tenant. ``tenant_id``: the tenant they work in when the
    caller has it already (a scope built for them this request), else :func:`user_tenant_id`."""
    tenant_id = tenant_id if tenant_id is not None else user_tenant_id(user)
    if tenant_id is None:
        return []
    with tenant_context(tenant_id, user_id=user.pk):
        return list(project_queryset_readable(user_id=user.pk).order_by("name", "pk"))


def project_get_for_user(user, project_slug: str | None = None, *, tenant_id: int | None = None) -> Project:
    """The project ``project_slug`` (default: :func:`project_default_for_user`) if ``user`` may
    query it, in ``tenant_id`` (default: the user's tenant).

    Raises ``ScopeNotFound`` (-> 404, the same message whether the project does not exist, is
    another tenant's, or is restricted to members the user is not one of).
    """
    return project_with_source_ids_for_user(user, project_slug, tenant_id=tenant_id, with_sources=False)[0]


def project_with_source_ids_for_user(
    user, project_slug: str | None = None, *, tenant_id: int | None = None, with_sources: bool = True
) -> tuple[Project, tuple[int, ...]]:
    """:func:`project_get_for_user` and the project's :func:`project_source_ids`, read in one
    transaction (a query's scope needs both; ``with_sources=False`` reads the project only, ``()``).
    Raises ``ScopeNotFound`` as :func:`project_get_for_user` does."""
    tenant_id = tenant_id if tenant_id is not None else user_tenant_id(user)
    if tenant_id is None:
        raise ScopeNotFound("you do not belong to any organization yet")
    source_ids: tuple[int, ...] = ()
    with tenant_context(tenant_id, user_id=user.pk):
        if project_slug:
            project = project_queryset_readable(user_id=user.pk).filter(slug=project_slug).first()
        else:
            project = project_default_for_user(user_id=user.pk)
        if project is not None and with_sources:
            source_ids = _source_ids(project.pk)
    if project is None:
        raise ScopeNotFound(
            f"no project {project_slug!r} in your organization" if project_slug else "no default project chosen"
        )
    return project, source_ids


def _source_ids(project_id: int) -> tuple[int, ...]:
    """Ids of the data sources attached to project ``project_id``, ascending (inside its
    tenant's context)."""
    ids = Project.objects.filter(pk=project_id).values_list("sources", flat=True)
    return tuple(sorted({i for i in ids if i is not None}))


def project_source_ids(project: Project) -> tuple[int, ...]:
    """Ids of the data sources attached to ``project`` (inside its tenant's context, RLS on),
    ascending. The caller has already checked that the project is readable."""
    with tenant_context(project.tenant_id):
        return _source_ids(project.pk)


def source_ids_readable(*, user_id: int | None) -> set[int]:
    """Ids of the current tenant's data sources the user may read (inside ``tenant_context``): a
    source is readable only through a project the user may read (:func:`project_queryset_readable`);
    a source in no project, or only in restricted projects the user is not in, is not."""
    ids = project_queryset_readable(user_id=user_id).values_list("sources", flat=True)
    return {i for i in ids if i is not None}


# ---------- API tokens ---------------------------------------------------------------------------

API_TOKEN_PREFIX_CHARS = 8  # lowercase letters and digits: public, shown in lists
API_TOKEN_SECRET_CHARS = 40  # letters and digits: ~238 bits of entropy
_API_TOKEN_RE = re.compile(
    rf"kb_(?P<prefix>[a-z0-9]{{{API_TOKEN_PREFIX_CHARS}}})_(?P<secret>[A-Za-z0-9]{{{API_TOKEN_SECRET_CHARS}}})"
)


class ApiTokenRejected(PermissionError):
    """The presented API token does not authenticate anyone.

    ``reason`` is one of ``malformed``, ``unknown``, ``revoked``, ``expired``, ``not_member``
    (the token's user left the tenant or was deactivated). The message never names a tenant.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TokenIdentity:
    """Who an authenticated API token speaks for.

    ``project_slug`` is the project that scopes a call made without one: the token's own
    (``project_pinned``: no other project may be used) or the user's default project when that
    lies in the token's tenant (else ``None``, and a call must name a project).
    """

    token_id: int
    prefix: str
    name: str
    tenant_id: int
    user: Any  # the user model instance, or None for a service token
    project_id: int | None
    project_slug: str | None
    project_pinned: bool
    expires_at: datetime | None

    @property
    def user_id(self) -> int | None:
        return self.user.pk if self.user is not None else None


def api_token_hash(raw: str) -> str:
    """SHA-256 hex digest (64 characters) of the whole plain token; what the table stores."""
    return hashlib.sha256(raw.encode()).hexdigest()


def api_token_parse(raw: str) -> tuple[str, str]:
    """``(prefix, secret)`` of a ``kb_<prefix>_<secret>`` token. Raises ``ApiTokenRejected``."""
    match = _API_TOKEN_RE.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise ApiTokenRejected("malformed", "malformed API token (expected kb_<prefix>_<secret>)")
    return match["prefix"], match["secret"]


def api_token_authenticate(raw: str) -> TokenIdentity:
    """The :class:`TokenIdentity` of the plain token ``raw``, checked against the table.

    Looks the row up by the token's SHA-256 under the transaction-local ``app.token_hash``
    setting, which row-level security admits for that one row only (no tenant is known yet, and
    no other tenant's token is visible), then compares digests with ``hmac.compare_digest``.
    Raises :class:`ApiTokenRejected` with ``reason`` ``malformed``, ``unknown``, ``revoked``,
    ``expired`` or ``not_member``. Reads only; ``projects.services.api_token_touch`` records use.
    """
    raw = raw.strip() if isinstance(raw, str) else raw
    prefix, _ = api_token_parse(raw)
    digest = api_token_hash(raw)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('app.token_hash', true), set_config('app.token_hash', %s, true)", [digest]
            )
            previous = cursor.fetchone()[0]
        row = (
            ApiToken.all_tenants.filter(token_hash=digest)
            .values(
                "id", "name", "prefix", "token_hash", "tenant_id", "user_id", "project_id", "expires_at", "revoked_at"
            )
            .first()
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('app.token_hash', %s, true)", [previous or ""])
    if row is None or not hmac.compare_digest(row["token_hash"], digest):
        raise ApiTokenRejected("unknown", "unknown API token")
    if row["revoked_at"] is not None:
        raise ApiTokenRejected("revoked", f"API token kb_{prefix}_… was revoked")
    if row["expires_at"] is not None and row["expires_at"] <= timezone.now():
        raise ApiTokenRejected("expired", f"API token kb_{prefix}_… expired at {row['expires_at'].isoformat()}")
    user = None
    if row["user_id"] is not None:
        user = get_user_model().objects.filter(pk=row["user_id"], is_active=True).first()
    with tenant_context(row["tenant_id"], user_id=row["user_id"]):
        if row["user_id"] is not None and (user is None or not Membership.objects.filter(user_id=user.pk).exists()):
            raise ApiTokenRejected("not_member", f"the user of API token kb_{prefix}_… is no longer a member")
        if row["project_id"] is not None:
            # Pinned: kept as named; api_token_project refuses it once the user may not read it.
            project = Project.objects.filter(pk=row["project_id"]).first()
        else:
            # The user's default while readable, else another readable project (inside the
            # tenant's context: a default project of another tenant is simply not found).
            project = project_default_for_user(user_id=row["user_id"])
    return TokenIdentity(
        token_id=row["id"],
        prefix=row["prefix"],
        name=row["name"],
        tenant_id=row["tenant_id"],
        user=user,
        project_id=project.pk if project else None,
        project_slug=project.slug if project else None,
        project_pinned=row["project_id"] is not None,
        expires_at=row["expires_at"],
    )


def project_queryset_for_token(identity: TokenIdentity) -> QuerySet[Project]:
    """The projects a call with ``identity`` may use (inside the token's ``tenant_context``).

    A pinned user token: its project while its user may read it (:func:`project_queryset_readable`);
    a service token (always pinned): its project; an unpinned user token: what its user may read.
    """
    _require_tenant_context()
    if identity.user is None:
        return (
            Project.objects.filter(pk=identity.project_id)
            if identity.project_id is not None
            else Project.objects.none()
        )
    readable = project_queryset_readable(user_id=identity.user.pk)
    if identity.project_pinned:
        return readable.filter(pk=identity.project_id) if identity.project_id is not None else readable.none()
    return readable


def api_token_project(identity: TokenIdentity, project_slug: str | None = None) -> Project:
    """The project a call made with ``identity`` runs in: ``project_slug`` or the token's default.

    A token that names its project is pinned to it. Raises ``ScopeNotFound`` (-> 404) when the
    slug is not a project of the token's tenant that the token's user may read
    (:func:`project_queryset_for_token`; a pinned token whose user lost access to its project
    is refused on every call), differs from a pinned token's project, or no project is named
    and the token has no default.
    """
    return api_token_project_with_source_ids(identity, project_slug, with_sources=False)[0]


def api_token_project_with_source_ids(
    identity: TokenIdentity, project_slug: str | None = None, *, with_sources: bool = True
) -> tuple[Project, tuple[int, ...]]:
    """:func:`api_token_project` and the project's :func:`project_source_ids`, read in one
    transaction (``with_sources=False``: the project only, ``()``). Raises ``ScopeNotFound`` as
    :func:`api_token_project` does."""
    slug = project_slug or identity.project_slug
    if not slug:
        raise ScopeNotFound("this token has no default project; pass a project slug")
    if identity.project_pinned and slug != identity.project_slug:
        raise ScopeNotFound(f"this token is limited to project {identity.project_slug!r}")
    source_ids: tuple[int, ...] = ()
    with tenant_context(identity.tenant_id, user_id=identity.user_id):
        project = project_queryset_for_token(identity).filter(slug=slug).first()
        if project is not None and with_sources:
            source_ids = _source_ids(project.pk)
    if project is None:
        raise ScopeNotFound(f"no project {slug!r} in this token's organization")
    return project, source_ids


def api_token_list_for_tenant(*, tenant_id: int) -> list[ApiToken]:
    """The tenant's tokens, newest first, with user and project loaded (hashes stay in the row)."""
    with tenant_context(tenant_id):
        return list(ApiToken.objects.select_related("user", "project"))


def api_token_list_for_user(*, user, tenant_id: int) -> list[ApiToken]:
    """``user``'s own tokens in ``tenant_id``, newest first, with their project loaded (service
    tokens and other people's tokens are not listed)."""
    with tenant_context(tenant_id, user_id=user.pk):
        return list(ApiToken.objects.filter(user=user).select_related("project"))


def api_token_get_for_user(*, user, tenant_id: int, prefix: str) -> ApiToken | None:
    """``user``'s own token with public ``prefix`` in ``tenant_id``, or ``None`` (another user's,
    a service token or another tenant's token: the same)."""
    with tenant_context(tenant_id, user_id=user.pk):
        return ApiToken.objects.filter(user=user, prefix=prefix).first()


def api_token_get_for_operator(prefix: str) -> ApiToken:
    """The token with public ``prefix`` (with or without ``kb_``), for whoever runs ``manage.py``.

    Looks in each tenant inside that tenant's own context (no bypass of row-level security).
    Raises ``ApiTokenRejected("unknown", ...)`` when no tenant has it.
    """
    prefix = prefix.strip().removeprefix("kb_").split("_", 1)[0]
    for tenant in Tenant.objects.all():
        with tenant_context(tenant.pk):
            token = ApiToken.objects.filter(prefix=prefix).select_related("tenant").first()
        if token is not None:
            return token
    raise ApiTokenRejected("unknown", f"no API token with prefix {prefix!r}")


def api_token_get_for_tenant(*, tenant_id: int, prefix: str) -> ApiToken | None:
    """The tenant's token with public ``prefix``, or ``None`` (another tenant's: the same)."""
    with tenant_context(tenant_id):
        return ApiToken.objects.filter(prefix=prefix).first()


def form_int(value: str | None) -> int:
    """A posted object id as an int; ``ValueError("no such member or source")`` for anything else
    (the manage pages' forms name objects by id)."""
    try:
        return int(value or "")
    except ValueError:
        raise ValueError("no such member or source") from None
