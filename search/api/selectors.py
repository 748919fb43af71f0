"""Reads for the API, each scoped to the caller (:class:`~search.api.authentication.ApiCaller`).

What a caller sees: the projects of their tenant they may read (``projects.selectors``: open
projects and restricted ones they are a member of; a pinned or service token: its one project),
the data sources attached to those projects, the runs of those sources, and answers they asked
themselves. Anything else (another tenant's project, source or answer, a source outside the
caller's projects) is "not found" (-> 404), never "forbidden". Every read runs inside the
caller's tenant context, so PostgreSQL row-level security applies on top.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from kbportal.tenancy import tenant_context
from projects.models import Project
from projects.selectors import (
    ScopeNotFound,
    project_default_for_user,
    project_queryset_for_token,
    project_queryset_readable,
    user_is_tenant_admin,
)
from search.analytics import Analytics, analytics_get
from search.api.authentication import ApiCaller
from search.models import AnswerRecord
from sources.models import DataSource, IngestionRun, ProjectSource
from sources.scheduling import source_next_run_at
from sources.selectors import (
    QueryScope,
    SourceNotFound,
    scope_for_token,
    scope_for_user,
    source_sync_allowed,
    user_principals,
)

NO_ORGANIZATION = "you do not belong to any organization yet"


def caller_scope(caller: ApiCaller, project_slug: str | None = None) -> QueryScope:
    """The :class:`QueryScope` for the caller in ``project_slug`` (default: the token's or the
    user's default project). Raises ``ScopeNotFound`` (-> 404) naming what is missing."""
    if caller.identity is not None:
        return scope_for_token(caller.identity, project_slug)
    if caller.tenant_id is None:
        raise ScopeNotFound(NO_ORGANIZATION)
    return scope_for_user(caller.user, project_slug)


@dataclass(frozen=True)
class CallerProject:
    """A project the caller may query; ``is_default`` when a call without ``project`` uses it."""

    slug: str
    name: str
    description: str
    is_default: bool


def _default_project_id(caller: ApiCaller) -> int | None:
    if caller.identity is not None:
        return caller.identity.project_id
    project = project_default_for_user(user_id=caller.user_id)
    return project.pk if project is not None else None


def _projects(caller: ApiCaller) -> list[Project]:
    """Inside the caller's tenant context: the projects they may use, by name (project
    visibility and membership from ``projects.selectors``; a pinned token: its one project)."""
    if caller.identity is not None:
        return list(project_queryset_for_token(caller.identity).order_by("name", "pk"))
    return list(project_queryset_readable(user_id=caller.user_id).order_by("name", "pk"))


def project_list_for_caller(caller: ApiCaller) -> list[CallerProject]:
    """The projects the caller may query, by name: all of the tenant's, or a pinned token's one.

    Empty for a session user without an organization.
    """
    if caller.tenant_id is None:
        return []
    with tenant_context(caller.tenant_id, user_id=caller.user_id):
        default_id = _default_project_id(caller)
        return [
            CallerProject(slug=p.slug, name=p.name, description=p.description, is_default=p.pk == default_id)
            for p in _projects(caller)
        ]


@dataclass(frozen=True)
class SourceStatus:
    """A data source as the API lists it. ``status`` is its latest run's (``never`` before the
    first run); ``projects`` are the caller's projects it is attached to (slugs)."""

    source: DataSource
    projects: list[str]
    last_run: IngestionRun | None

    @property
    def status(self) -> str:
        return self.last_run.status if self.last_run is not None else "never"

    @property
    def next_run_at(self) -> datetime | None:
        """When the scheduler queues it next (``None``: disabled); see ``sources.scheduling``."""
        return source_next_run_at(self.source)


def _visible_sources(caller: ApiCaller, project_slug: str | None) -> dict[int, list[str]]:
    """Inside the caller's tenant context: ``{source id: [project slugs]}`` of the sources
    attached to the caller's projects (or to ``project_slug``, which must be one of them)."""
    projects = _projects(caller)
    if project_slug is not None:
        projects = [p for p in projects if p.slug == project_slug]
        if not projects:
            raise ScopeNotFound(f"no project {project_slug!r} you may use")
    by_id = {p.pk: p.slug for p in projects}
    visible: dict[int, list[str]] = {}
    for source_id, project_id in ProjectSource.objects.filter(project_id__in=by_id).values_list(
        "source_id", "project_id"
    ):
        visible.setdefault(source_id, []).append(by_id[project_id])
    return {source_id: sorted(slugs) for source_id, slugs in visible.items()}


def source_list_for_caller(caller: ApiCaller, *, project_slug: str | None = None) -> list[SourceStatus]:
    """The data sources in the caller's projects (or in ``project_slug``), by name, each with its
    latest run. Raises ``ScopeNotFound`` for a ``project_slug`` the caller may not use."""
    if caller.tenant_id is None:
        if project_slug is not None:
            raise ScopeNotFound(NO_ORGANIZATION)
        return []
    with tenant_context(caller.tenant_id, user_id=caller.user_id):
        visible = _visible_sources(caller, project_slug)
        sources = list(DataSource.objects.filter(pk__in=visible).order_by("name", "slug"))
        latest = {
            run.source_id: run
            for run in IngestionRun.objects.filter(source_id__in=visible)
            .select_related("source")  # rendered after the tenant context closes: load it now
            .order_by("source_id", "-created_at", "-id")
            .distinct("source_id")
        }
    return [SourceStatus(source=s, projects=visible[s.pk], last_run=latest.get(s.pk)) for s in sources]


def source_get_for_caller(caller: ApiCaller, *, slug: str) -> DataSource:
    """The data source ``slug`` if it is attached to one of the caller's projects.

    Raises ``SourceNotFound`` (-> 404) otherwise, whichever tenant the slug may exist in.
    """
    if caller.tenant_id is None:
        raise SourceNotFound(f"no data source {slug!r} in your projects")
    with tenant_context(caller.tenant_id, user_id=caller.user_id):
        visible = _visible_sources(caller, None)
        source = DataSource.objects.filter(slug=slug, pk__in=visible).first()
    if source is None:
        raise SourceNotFound(f"no data source {slug!r} in your projects")
    return source


def ingestion_run_list_for_caller(
    caller: ApiCaller, *, source_slug: str | None = None, limit: int = 50
) -> list[IngestionRun]:
    """Ingestion runs of the sources in the caller's projects (or of ``source_slug``), newest
    first, at most ``limit``, with ``source`` loaded. Raises ``SourceNotFound`` for a
    ``source_slug`` outside the caller's projects."""
    if caller.tenant_id is None:
        if source_slug is not None:
            raise SourceNotFound(f"no data source {source_slug!r} in your projects")
        return []
    with tenant_context(caller.tenant_id, user_id=caller.user_id):
        visible = _visible_sources(caller, None)
        runs = IngestionRun.objects.filter(source_id__in=visible)
        if source_slug is not None:
            source = DataSource.objects.filter(slug=source_slug, pk__in=visible).first()
            if source is None:
                raise SourceNotFound(f"no data source {source_slug!r} in your projects")
            runs = runs.filter(source=source)
        return list(runs.select_related("source").order_by("-created_at", "-id")[:limit])


def caller_is_tenant_admin(caller: ApiCaller) -> bool:
    """True when the caller is a person who is an owner or admin of the tenant (never a service token)."""
    if caller.user_id is None or caller.tenant_id is None:
        return False
    return user_is_tenant_admin(caller.user, caller.tenant_id)


def caller_may_sync_source(caller: ApiCaller, source: DataSource) -> bool:
    """True when the caller (a person) may queue a sync of ``source``
    (``sources.selectors.source_sync_allowed``, the decision the web's Sync now takes too)."""
    if caller.user_id is None or caller.tenant_id is None:
        return False
    return source_sync_allowed(user=caller.user, tenant_id=caller.tenant_id, source=source)


def answer_asked_by_caller(caller: ApiCaller, *, answer_id: uuid.UUID) -> bool:
    """True when ``answer_id`` is an answer the caller (a person) asked in the caller's tenant."""
    if caller.user_id is None or caller.tenant_id is None:
        return False
    with tenant_context(caller.tenant_id, user_id=caller.user_id):
        return AnswerRecord.objects.filter(public_id=answer_id, user_id=caller.user_id).exists()


class AnalyticsForbidden(PermissionError):
    """The caller is not a person who is an owner or admin of the tenant (-> 403)."""


def analytics_for_caller(caller: ApiCaller, *, project_slug: str | None = None, days: int = 30) -> Analytics:
    """The tenant's analytics (``search.analytics.analytics_get``) for an owner or admin.

    Every project unless ``project_slug`` names one of the tenant's (a pinned token: its own
    project only, and by default). Raises ``AnalyticsForbidden`` (-> 403) for a member or a
    service token, then ``ScopeNotFound`` (-> 404) for a project the caller may not use.
    """
    if not caller_is_tenant_admin(caller) or caller.tenant_id is None:
        raise AnalyticsForbidden("only an owner or admin of the organization can read its analytics")
    if caller.identity is not None and caller.identity.project_pinned:
        project_slug = project_slug or caller.identity.project_slug
    project = None
    if project_slug is not None:
        with tenant_context(caller.tenant_id, user_id=caller.user_id):
            project = next((p for p in _projects(caller) if p.slug == project_slug), None)
        if project is None:
            raise ScopeNotFound(f"no project {project_slug!r} you may use")
    return analytics_get(
        tenant_id=caller.tenant_id,
        project_id=project.pk if project else None,
        project_slug=project.slug if project else None,
        days=days,
        viewer_principals=user_principals(caller.user, caller.tenant_id),
    )
