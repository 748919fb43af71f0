"""The audit log: one append-only :class:`~kbportal.models.AuditEvent` per thing someone did.

Where it lives: ``kbportal`` is an installed app, so the model is ``kbportal.models.AuditEvent``
and the writer is here, on the base floor. Every floor above calls :func:`audit_record` inside
the transaction of the write it records (the ask service where the answer record is written,
the token services, feedback, source services, the admin); the base imports no app. The one
thing the base cannot know, which tenant a user works in (for login and logout events), comes
from a resolver the ``projects`` app registers (:func:`audit_register_user_tenant`).

Append-only: the app role may INSERT and SELECT only, a trigger refuses UPDATE, DELETE and
TRUNCATE for every role, and row-level security keeps tenants apart (see the model and its
migration). Events with no tenant (a refused login, a call with a refused token) are written
outside any tenant context and readable only by the table owner (the operator's admin).

Request details come from :func:`kbportal.middleware.current_request`: the request id, the
client address (``REMOTE_ADDR``; a proxy's ``X-Forwarded-For`` is not trusted), the logged-in
user and, for an API call, the token's public prefix. Explicit arguments win over them.

Actions: ``ask``, ``search``, ``api.call``, ``login``, ``login.failed``, ``login.refused`` and
``sso.join`` (single sign-on, :mod:`kbportal.sso`), ``logout``,
``admin.change``, ``source.create``, ``source.update``, ``source.delete``, ``source.sync``, ``token.create``,
``token.revoke``, ``feedback``.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from kbportal.middleware import current_request
from kbportal.models import AuditEvent
from kbportal.tenancy import current_tenant_id, tenant_context

ACTIONS = (
    "ask",
    "search",
    "api.call",
    "login",
    "login.failed",
    "login.refused",
    "sso.join",
    "logout",
    "admin.change",
    "source.create",
    "source.update",
    "source.delete",
    "source.sync",
    "token.create",
    "token.revoke",
    "feedback",
    "conversation.delete",
    "answer.verify",
    "feedback.review",
    "member.invite",
    "member.invite_revoke",
    "member.join",
    "member.role",
    "member.remove",
    "project.create",
    "project.visibility",
    "project.member_add",
    "project.member_remove",
    "project.sources",
)

FROM_REQUEST: Any = object()  # "not given": take it from the current request
_UserTenantResolver = Callable[[Any], "int | None"]
_user_tenant_resolver: _UserTenantResolver | None = None


def audit_register_user_tenant(resolver: _UserTenantResolver) -> None:
    """Register ``resolver(user) -> tenant id | None``, the tenant a user works in.

    The ``projects`` app registers ``projects.selectors.user_tenant_id`` when it is ready; login
    and logout events use it (an unregistered resolver leaves those events without a tenant).
    """
    global _user_tenant_resolver
    _user_tenant_resolver = resolver


def _clean(value: Any) -> Any:
    """``value`` with NUL characters removed from every string (PostgreSQL cannot store them)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_clean(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    return value


def _client_ip(request: Any) -> str | None:
    addr = (getattr(request, "META", None) or {}).get("REMOTE_ADDR", "")
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return None


def _actor_fields(actor: Any, request: Any) -> tuple[int | None, str]:
    """``(user id, username)`` of a user instance, a user id or ``None``."""
    if actor is None:
        return None, ""
    if isinstance(actor, int) and not isinstance(actor, bool):
        user = _request_actor(request)
        if user is None or user.pk != actor:
            user = get_user_model().objects.filter(pk=actor).first()
        return actor, (user.get_username() if user is not None else "")
    pk = getattr(actor, "pk", None)
    if pk is None:  # a service token's stand-in user: the token prefix says who
        return None, ""
    return pk, actor.get_username()


def _request_actor(request: Any) -> Any:
    user = getattr(request, "user", None) if request is not None else None
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def _request_token_prefix(request: Any) -> str | None:
    # DRF copies the authenticated ``auth`` (an API token's identity) onto the Django request.
    prefix = getattr(getattr(request, "auth", None), "prefix", None) if request is not None else None
    return prefix if isinstance(prefix, str) else None


def audit_record(
    *,
    action: str,
    tenant_id: int | None,
    actor: Any = FROM_REQUEST,
    token_prefix: str | None = FROM_REQUEST,
    object_type: str = "",
    object_id: Any = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event; returns it (unsaved-looking, ``pk`` ``None``, when it has no tenant).

    ``actor`` is a user, a user id or ``None`` (default: the current request's logged-in user);
    ``token_prefix`` the public prefix of the API token used (default: the current request's).
    ``object_type`` is ``app_label.model_name``, ``object_id`` the primary key. ``data`` is a
    JSON-serialisable dict (UUIDs and datetimes allowed). The request id and client address
    come from the current request (empty outside one).

    With a ``tenant_id`` the event is written inside ``tenant_context(tenant_id)``: in the
    caller's transaction when one is open (so it commits or rolls back with the action it
    records), in its own otherwise. ``tenant_id=None`` is for events before a tenant is known;
    raises ``ValueError`` inside a tenant context (such an event belongs to that tenant).
    """
    request = current_request()
    if actor is FROM_REQUEST:
        actor = _request_actor(request)
    if token_prefix is FROM_REQUEST:
        token_prefix = _request_token_prefix(request)
    actor_id, username = _actor_fields(actor, request)
    event = AuditEvent(
        tenant_id=tenant_id,
        actor_id=actor_id,
        actor_username=_clean(username)[:150],
        actor_token_prefix=token_prefix or None,
        action=action,
        object_type=object_type[:80],
        object_id=str(object_id)[:64] if object_id is not None else "",
        request_id=getattr(request, "request_id", "") or "",
        ip=_client_ip(request),
        created_at=timezone.now(),
        data=_clean(dict(data or {})),
    )
    if tenant_id is not None:
        with tenant_context(tenant_id):
            event.save(force_insert=True)
        return event
    if current_tenant_id() is not None:
        raise ValueError(f"audit event {action!r} has no tenant but runs inside tenant {current_tenant_id()}'s context")
    # No RETURNING: the row passes the policy's WITH CHECK (no tenant, none set) but not its
    # USING clause, so the app role may write it and never read it back.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO kbportal_auditevent (tenant_id, actor_id, actor_username, actor_token_prefix, action, "
            "object_type, object_id, request_id, ip, created_at, data) "
            "VALUES (NULL, %s, %s, %s, %s, %s, %s, %s, %s::inet, %s, %s::jsonb)",
            [
                event.actor_id,
                event.actor_username,
                event.actor_token_prefix,
                event.action,
                event.object_type,
                event.object_id,
                event.request_id,
                event.ip,
                event.created_at,
                json.dumps(event.data, cls=DjangoJSONEncoder),
            ],
        )
    return event


# ---------- login, failed login, logout ----------------------------------------------------------

_LOGIN_FIELDS = ("username", "email", "login")  # what a person typed as their name; never the password


def _user_tenant(user: Any) -> int | None:
    return _user_tenant_resolver(user) if _user_tenant_resolver is not None and user is not None else None


def _on_logged_in(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    audit_record(action="login", tenant_id=_user_tenant(user), actor=user, token_prefix=None)


def _on_login_failed(
    sender: Any, credentials: dict[str, Any] | None = None, request: Any = None, **kwargs: Any
) -> None:
    # django-allauth names the fields with its LoginMethod enum (a str enum): compare by value.
    tried = {
        str(getattr(k, "value", k)): str(v)[:150]
        for k, v in (credentials or {}).items()
        if str(getattr(k, "value", k)) in _LOGIN_FIELDS
    }
    audit_record(action="login.failed", tenant_id=None, actor=None, token_prefix=None, data=tried)


def _on_logged_out(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    audit_record(action="logout", tenant_id=_user_tenant(user), actor=user, token_prefix=None)


def audit_connect_signals() -> None:
    """Record ``login``, ``login.failed`` and ``logout`` from Django's auth signals (which
    django-allauth's login and logout send too). Called once from ``KbportalConfig.ready``."""
    user_logged_in.connect(_on_logged_in, dispatch_uid="kbportal.audit.login")
    user_login_failed.connect(_on_login_failed, dispatch_uid="kbportal.audit.login_failed")
    user_logged_out.connect(_on_logged_out, dispatch_uid="kbportal.audit.logout")


# ---------- reading: the tenant's log, filtered ----------------------------------------------------

AUDIT_PAGE_SIZE = 50
AUDIT_EXPORT_CHUNK = 500


@dataclass(frozen=True)
class AuditFilters:
    """What a tenant admin narrows the log by; empty values do not filter.

    ``action``: one of :data:`ACTIONS`; ``actor``: a username (case-insensitive) or an API
    token prefix (``kb_1a2b3c4d`` or ``1a2b3c4d``); ``since``/``until``: UTC dates, both
    inclusive; ``text``: a case-insensitive substring of the event's ``data`` as JSON text.
    """

    action: str = ""
    actor: str = ""
    since: date | None = None
    until: date | None = None
    text: str = ""

    def as_query(self) -> dict[str, str]:
        """The filters as query-string parameters (for pagination and export links)."""
        values = {
            "action": self.action,
            "actor": self.actor,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
            "text": self.text,
        }
        return {k: v for k, v in values.items() if v}


def _filtered(filters: AuditFilters) -> QuerySet[AuditEvent]:
    """Inside a tenant context: the tenant's events matching ``filters``, newest first."""
    events = AuditEvent.objects.all()
    if filters.action:
        events = events.filter(action=filters.action)
    if filters.actor:
        prefix = filters.actor.strip().removeprefix("kb_").split("_", 1)[0]
        events = events.filter(Q(actor_username__iexact=filters.actor.strip()) | Q(actor_token_prefix=prefix))
    if filters.since:
        events = events.filter(created_at__gte=datetime.combine(filters.since, time.min, tzinfo=UTC))
    if filters.until and filters.until < date.max:  # until the last date: no upper bound
        end = datetime.combine(filters.until + timedelta(days=1), time.min, tzinfo=UTC)
        events = events.filter(created_at__lt=end)
    if filters.text:
        events = events.annotate(data_text=Cast("data", TextField())).filter(data_text__icontains=filters.text)
    return events.order_by("-created_at", "-id")


@dataclass(frozen=True)
class AuditPage:
    """One page of a tenant's log: ``events`` (at most ``AUDIT_PAGE_SIZE``), 1-based ``number``."""

    events: list[AuditEvent]
    number: int
    num_pages: int
    count: int

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.num_pages


def audit_event_page(*, tenant_id: int, filters: AuditFilters, page: int = 1) -> AuditPage:
    """Page ``page`` (clamped to the existing pages) of the tenant's events matching ``filters``,
    newest first. Reads inside the tenant's context; the caller checks that the reader is one of
    the tenant's admins."""
    with tenant_context(tenant_id):
        paginator = Paginator(_filtered(filters), AUDIT_PAGE_SIZE)
        current = paginator.get_page(page)
        return AuditPage(
            events=list(current.object_list),
            number=current.number,
            num_pages=paginator.num_pages,
            count=paginator.count,
        )


def audit_event_iter(
    *, tenant_id: int, filters: AuditFilters, chunk_size: int = AUDIT_EXPORT_CHUNK
) -> Iterator[AuditEvent]:
    """Every event of the tenant matching ``filters``, newest first, read ``chunk_size`` rows at
    a time by keyset (one short tenant-context transaction each, none held open between chunks,
    so a slow download holds no transaction)."""
    after: tuple[datetime, int] | None = None
    while True:
        with tenant_context(tenant_id):
            events = _filtered(filters)
            if after is not None:
                events = events.filter(Q(created_at__lt=after[0]) | Q(created_at=after[0], id__lt=after[1]))
            chunk = list(events[:chunk_size])
        yield from chunk
        if len(chunk) < chunk_size:
            return
        after = (chunk[-1].created_at, chunk[-1].pk)


AUDIT_CSV_HEADER = [
    "time",
    "action",
    "actor",
    "token_prefix",
    "object_type",
    "object_id",
    "request_id",
    "ip",
    "data",
]


def _csv_cell(value: str) -> str:
    # A spreadsheet would run a cell starting with = + - @ as a formula (CSV injection).
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def audit_event_csv_row(event: AuditEvent) -> list[str]:
    """The event as a CSV row in :data:`AUDIT_CSV_HEADER` order (time in ISO 8601 UTC, ``data``
    as JSON; a cell a spreadsheet would read as a formula starts with ``'``)."""
    values = [
        event.created_at.astimezone(UTC).isoformat(),
        event.action,
        event.actor_username,
        f"kb_{event.actor_token_prefix}" if event.actor_token_prefix else "",
        event.object_type,
        event.object_id,
        event.request_id,
        event.ip or "",
        json.dumps(event.data, cls=DjangoJSONEncoder, ensure_ascii=False, sort_keys=True),
    ]
    return [_csv_cell(v) for v in values]
