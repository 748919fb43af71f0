"""Reads for data sources, always scoped to a tenant."""

from __future__ import annotations

from dataclasses import dataclass

from kbportal.emails import email_key
from kbportal.tenancy import tenant_context
from projects.models import Project, Tenant
from projects.selectors import (
    ScopeNotFound,
    TokenIdentity,
    api_token_project_with_source_ids,
    project_can_edit,
    project_with_source_ids_for_user,
    source_ids_readable,
    user_is_tenant_admin,
    user_tenant_id,
)
from sources.models import DataSource, Document, ExternalGroup, ExternalIdentity, ProjectSource


class SourceNotFound(LookupError):
    """No data source with that reference in the tenant."""


def source_resolve_for_operator(reference: str, *, tenant_slug: str | None = None) -> DataSource:
    """Find a source by ``slug``, ``tenant/slug`` or numeric id, for whoever runs ``manage.py``.

    Looks in each candidate tenant inside that tenant's own context (no RLS bypass). Raises
    ``SourceNotFound`` naming the reference, or when it is ambiguous across tenants.
    """
    if "/" in reference and tenant_slug is None:
        tenant_slug, reference = reference.split("/", 1)
    tenants = list(Tenant.objects.filter(slug=tenant_slug) if tenant_slug else Tenant.objects.all())
    if tenant_slug and not tenants:
        raise SourceNotFound(f"no tenant with slug {tenant_slug!r}")
    matches: list[DataSource] = []
    for tenant in tenants:
        with tenant_context(tenant.pk):
            qs = DataSource.objects.all()
            by_id = reference.isascii() and reference.isdigit()
            found = qs.filter(pk=int(reference)) if by_id else qs.filter(slug=reference)
            matches.extend(found.select_related("tenant"))
    if not matches:
        where = f" in tenant {tenant_slug!r}" if tenant_slug else ""
        raise SourceNotFound(f"no data source {reference!r}{where}")
    if len(matches) > 1:
        raise SourceNotFound(
            f"data source {reference!r} exists in several tenants; write it as <tenant>/{reference} or pass --tenant"
        )
    return matches[0]


@dataclass(frozen=True)
class QueryScope:
    """Who asks, in which tenant and project, and which data sources they may read.

    ``allowed_source_ids`` is computed once per request and passed to retrieval as a required
    argument; retrieval never widens it.
    """

    tenant_id: int
    user_id: int | None
    project_id: int
    project_slug: str
    project_name: str
    allowed_source_ids: tuple[int, ...]
    principals: tuple[str, ...] = ()


def scope_for_user(user, project_slug: str | None = None, *, tenant_id: int | None = None) -> QueryScope:
    """The :class:`QueryScope` for ``user`` in ``project_slug`` (default: their default project),
    in ``tenant_id`` (default: the tenant they work in; the caller has checked they belong to it).

    The project and its data sources come from
    ``projects.selectors.project_with_source_ids_for_user`` (``project_get_for_user``: the
    one check of project visibility and membership; an unreadable default falls back to another
    readable project). Raises ``ScopeNotFound`` when the user has no tenant, no readable default
    project, or ``project_slug`` is not a project of their tenant they may read.
    """
    tenant_id = tenant_id if tenant_id is not None else user_tenant_id(user)
    if tenant_id is None:
        raise ScopeNotFound("you do not belong to any organization yet")
    project, source_ids = project_with_source_ids_for_user(user, project_slug, tenant_id=tenant_id)
    return QueryScope(
        tenant_id=tenant_id,
        user_id=user.pk,
        project_id=project.pk,
        project_slug=project.slug,
        project_name=project.name,
        allowed_source_ids=source_ids,
        principals=user_principals(user, tenant_id),
    )


def scope_for_token(identity: TokenIdentity, project_slug: str | None = None) -> QueryScope:
    """The :class:`QueryScope` of a call made with an authenticated API token.

    Tenant and user are the token's; the project is ``project_slug`` or the token's default
    (``projects.selectors.api_token_project``: a pinned token cannot switch); the allowed data
    sources are the project's; principals are the user's (none for a service token, which so
    never reads restricted rows). Raises ``ScopeNotFound`` (-> 404).
    """
    project, source_ids = api_token_project_with_source_ids(identity, project_slug)
    return QueryScope(
        tenant_id=identity.tenant_id,
        user_id=identity.user_id,
        project_id=project.pk,
        project_slug=project.slug,
        project_name=project.name,
        allowed_source_ids=source_ids,
        principals=user_principals(identity.user, identity.tenant_id) if identity.user is not None else (),
    )


def user_principals(user, tenant_id: int | None = None) -> tuple[str, ...]:
    """What a user is known as to ``Document.principals`` in ``tenant_id`` (default: the tenant
    they work in, ``projects.selectors.user_tenant_id``): ``user:<id>``, ``email:<address>`` for
    each address allauth has verified (an SSO sign-in stores the provider's verified address
    as verified), and what those addresses link to in the tenant's directory
    (:func:`directory_principals`). Sorted, without repeats.

    Only verified addresses count: a user-editable, unverified address would let a member claim
    someone else's restricted rows.
    """
    from allauth.account.models import EmailAddress

    verified = EmailAddress.objects.filter(user=user, verified=True).values_list("email", flat=True)
    emails = sorted({key for key in map(email_key, verified) if key})
    own = [f"user:{user.pk}", *(f"email:{e}" for e in emails)]
    if tenant_id is None:
        tenant_id = user_tenant_id(user)
    if tenant_id is None:
        return tuple(own)
    if not emails:  # nothing in the directory to link (directory_principals): no transaction for it
        return tuple(sorted(set(own)))
    with tenant_context(tenant_id):
        return tuple(sorted(set(own) | directory_principals(emails=emails, own=own)))


def directory_principals(*, emails: list[str], own: list[str]) -> set[str]:
    """The identity and group principals of the current tenant's directory that a person with
    these verified ``emails`` (lower-case) and ``own`` principals holds. Runs inside the tenant's
    ``tenant_context``.

    An identity (``ExternalIdentity``) is held when its email is one of ``emails``, and only when
    no identity with the same principal, in any of the tenant's data sources, reports another
    email or none: two people claiming ``slack:U1`` (two workspaces, a changed address), or a
    source that cannot say who ``slack:U1`` is beside one that names an address, are a conflict
    and nobody gets it. A group (``ExternalGroup``) is held when its members name one of the
    person's principals (own or identity) in every data source that exposes that group
    principal: a group name reused by two sites with different members admits only people in
    both. Either way an unsure case fails closed.
    """
    if not emails:
        return set()
    candidates = set(ExternalIdentity.objects.filter(email__in=emails).values_list("principal", flat=True))
    conflicting = set(
        ExternalIdentity.objects.filter(principal__in=candidates)
        .exclude(email__in=emails)
        .values_list("principal", flat=True)
    )
    held = candidates - conflicting
    known = [*own, *held]
    member_of = set(ExternalGroup.objects.filter(members__overlap=known).values_list("principal", flat=True))
    if member_of:
        # A group principal exposed by a source whose member list lacks the person is withheld.
        lacking = set(
            ExternalGroup.objects.filter(principal__in=member_of)
            .exclude(members__overlap=known)
            .values_list("principal", flat=True)
        )
        held |= member_of - lacking
    return held


def scope_for_operator(*, tenant_slug: str | None = None, project_slug: str | None = None) -> QueryScope:
    """A scope for whoever runs ``manage.py`` (the operator): a tenant's project, no user principals.

    With one tenant, ``tenant_slug`` may be omitted; with one project, ``project_slug`` too.
    Rows restricted to named principals stay hidden. Raises ``ScopeNotFound`` naming what is
    missing or ambiguous.
    """
    tenants = list(Tenant.objects.all() if not tenant_slug else Tenant.objects.filter(slug=tenant_slug))
    if not tenants:
        raise ScopeNotFound(f"no tenant {tenant_slug!r}" if tenant_slug else "no tenant exists yet; run make demo")
    if len(tenants) > 1:
        raise ScopeNotFound("several tenants exist; pass --tenant SLUG: " + ", ".join(t.slug for t in tenants))
    tenant = tenants[0]
    with tenant_context(tenant.pk):
        projects = list(Project.objects.filter(slug=project_slug) if project_slug else Project.objects.all())
        if not projects:
            raise ScopeNotFound(
                f"no project {project_slug!r} in tenant {tenant.slug!r}"
                if project_slug
                else f"tenant {tenant.slug!r} has no project"
            )
        if len(projects) > 1:
            raise ScopeNotFound("several projects; pass --project SLUG: " + ", ".join(p.slug for p in projects))
        project = projects[0]
        source_ids = tuple(ProjectSource.objects.filter(project=project).values_list("source_id", flat=True))
    return QueryScope(
        tenant_id=tenant.pk,
        user_id=None,
        project_id=project.pk,
        project_slug=project.slug,
        project_name=project.name,
        allowed_source_ids=source_ids,
    )


class DocumentNotFound(LookupError):
    """No such document, or the user may not read it (-> 404)."""


def document_get_for_user(user, *, source_public_id: str, external_id: str) -> tuple[Document, DataSource]:
    """The document and its source, if ``user`` may read it; else ``DocumentNotFound``.

    Readable means: in the user's tenant (row-level security), in a source attached to a project
    the user may read (``projects.selectors.source_ids_readable``), and its principals empty or
    naming the user.
    """
    tenant_id = user_tenant_id(user)
    if tenant_id is None or "\x00" in external_id:  # PostgreSQL text cannot hold NUL: no such row
        raise DocumentNotFound("no such document")
    principals = set(user_principals(user, tenant_id))
    with tenant_context(tenant_id, user_id=user.pk):
        source = DataSource.objects.filter(public_id=source_public_id).first()
        if source is None or source.pk not in source_ids_readable(user_id=user.pk):
            raise DocumentNotFound("no such document")
        document = Document.objects.filter(source=source, external_id=external_id).first()
        if document is None or (document.principals and not principals.intersection(document.principals)):
            raise DocumentNotFound("no such document")
    return document, source


def source_sync_allowed(*, user, tenant_id: int, source: DataSource) -> bool:
    """The one answer to "may this person queue a sync of ``source``", for the web's Sync now and
    the API alike: an owner or admin of the tenant (any of its sources), or an ``editor`` of a
    project the source is attached to (``projects.selectors.project_can_edit``). A user without
    a primary key (a service token's stand-in) or ``None`` never may."""
    user_id = getattr(user, "pk", None)
    if user_id is None:
        return False
    if user_is_tenant_admin(user, tenant_id):
        return True
    with tenant_context(tenant_id, user_id=user_id):
        project_ids = list(ProjectSource.objects.filter(source=source).values_list("project_id", flat=True))
        return project_can_edit(user_id=user_id, project_ids=project_ids)


@dataclass(frozen=True)
class IdentityListing:
    """One row of the organization's identity list: the identity, the tenant member it links to
    (``None``: unlinked) and why not when unlinked."""

    identity: ExternalIdentity
    source_name: str
    linked_to: str | None
    reason: str


def identity_list(*, tenant_id: int) -> tuple[list[IdentityListing], list[ExternalGroup]]:
    """The tenant's external identities (unlinked first, then by source and principal) and groups.

    An identity is linked when a member of the tenant has verified its email and no other
    identity with its principal reports a different email (as :func:`directory_principals`
    grants it). For the organization's owners and admins (the caller checks).
    """
    from allauth.account.models import EmailAddress

    from projects.models import Membership

    with tenant_context(tenant_id):
        identities = list(ExternalIdentity.objects.select_related("source").order_by("source__name", "principal"))
        groups = list(ExternalGroup.objects.select_related("source").order_by("principal", "source__name"))
        member_ids = list(Membership.objects.values_list("user_id", flat=True))
    verified_by: dict[int, set[str]] = {}
    names: dict[int, str] = {}
    for address in EmailAddress.objects.filter(user_id__in=member_ids, verified=True).select_related("user"):
        key = email_key(address.email)
        if key:
            verified_by.setdefault(address.user_id, set()).add(key)
            names[address.user_id] = address.user.get_username()
    emails_by_principal: dict[str, set[str]] = {}
    for identity in identities:
        emails_by_principal.setdefault(identity.principal, set()).add(identity.email)
    rows = []
    for identity in identities:
        emails = emails_by_principal[identity.principal]
        # As directory_principals grants it: a member who verified every email the principal has.
        holders = [uid for uid, keys in verified_by.items() if "" not in emails and emails <= keys]
        linked_to, reason = (names[holders[0]], "") if len(holders) == 1 else (None, "")
        if linked_to is None:
            if not identity.email:
                reason = "the source shows no email for this person"
            elif len(emails) > 1:
                reason = "another source reports a different email, or none, for " + identity.principal
            elif len(holders) > 1:
                reason = "several members have verified this email"
            else:
                reason = "no member of the organization has verified this email"
        rows.append(IdentityListing(identity, identity.source.name, linked_to, reason))
    rows.sort(key=lambda r: (r.linked_to is not None, r.source_name, r.identity.principal))
    return rows, groups
