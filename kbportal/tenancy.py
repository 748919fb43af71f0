"""Tenant context: the one way code reads or writes tenant-owned rows.

Two walls, both fail closed:

1. PostgreSQL row-level security on every tenant-owned table (policy
   ``tenant_id = current_setting('app.tenant_id', true)::bigint``, ``FORCE``d, see
   :func:`enable_rls_sql`). The app role has no ``BYPASSRLS`` and does not own the tables, so a
   query with no tenant set sees 0 rows and an insert for another tenant is refused.
2. :class:`TenantScopedManager`, the default manager of tenant-owned models, filters by the
   current tenant and raises :class:`TenantContextMissing` when none is set.

:func:`tenant_context` sets both: a context variable for the manager and the transaction-local
``app.tenant_id`` setting (``set_config(..., true)``) inside ``transaction.atomic``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, models, transaction

_current_tenant: contextvars.ContextVar[int | None] = contextvars.ContextVar("kb_tenant", default=None)
_current_user: contextvars.ContextVar[int | None] = contextvars.ContextVar("kb_user", default=None)


class TenantContextMissing(RuntimeError):
    """A tenant-scoped query ran outside :func:`tenant_context`."""


def current_tenant_id() -> int | None:
    """The tenant id set by the innermost :func:`tenant_context`, or ``None``."""
    return _current_tenant.get()


@contextmanager
def tenant_context(tenant_id: int, *, user_id: int | None = None, using: str = "default") -> Iterator[None]:
    """Run the block in one transaction scoped to ``tenant_id`` (and optionally ``user_id``).

    Sets the transaction-local PostgreSQL settings ``app.tenant_id`` / ``app.user_id`` that the
    row-level-security policies read, and the context variable the scoped manager reads.
    Nesting with another tenant raises ``ValueError`` (no silent tenant switch inside a
    transaction). Querysets must be evaluated inside the block.
    """
    if tenant_id is None:
        raise TenantContextMissing("tenant_context() needs a tenant id, got None")
    outer = _current_tenant.get()
    if outer is not None and outer != int(tenant_id):
        raise ValueError(f"already in tenant {outer}'s context; refusing to switch to {tenant_id}")
    token = _current_tenant.set(int(tenant_id))
    user_token = _current_user.set(user_id)
    try:
        with transaction.atomic(using=using):
            with connections[using].cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('app.tenant_id', true), current_setting('app.user_id', true), "
                    "set_config('app.tenant_id', %s, true), set_config('app.user_id', %s, true)",
                    [str(int(tenant_id)), "" if user_id is None else str(int(user_id))],
                )
                previous = cursor.fetchone()[:2]
            yield
            # Inside an outer transaction the setting would outlive this block: put back what
            # was there so a later query outside any context sees nothing again. (On an
            # exception the savepoint rollback already undoes set_config.)
            if len(connections[using].atomic_blocks) > 1 and not connections[using].needs_rollback:
                with connections[using].cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('app.tenant_id', %s, true), set_config('app.user_id', %s, true)",
                        [previous[0] or "", previous[1] or ""],
                    )
    finally:
        _current_user.reset(user_token)
        _current_tenant.reset(token)


@contextmanager
def user_context(user_id: int, *, using: str = "default") -> Iterator[None]:
    """Run the block in one transaction where only ``user_id``'s own membership rows are visible.

    Used before the tenant is known (login, onboarding) to read the user's memberships.
    """
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('app.user_id', true), set_config('app.user_id', %s, true)",
                [str(int(user_id))],
            )
            previous = cursor.fetchone()[0]
        yield
        # As in tenant_context: inside an outer transaction, put back what was there.
        if len(connections[using].atomic_blocks) > 1 and not connections[using].needs_rollback:
            with connections[using].cursor() as cursor:
                cursor.execute("SELECT set_config('app.user_id', %s, true)", [previous or ""])


class TenantScopedQuerySet(models.QuerySet):
    pass


class TenantScopedManager(models.Manager.from_queryset(TenantScopedQuerySet)):  # type: ignore[misc]
    """Default manager of tenant-owned models: filters by the current tenant, raises without one.

    Raises :class:`TenantContextMissing` when used outside :func:`tenant_context`. Django uses
    the plain base manager for related-object access; row-level security still applies there.
    """

    def get_queryset(self) -> TenantScopedQuerySet:
        tenant_id = _current_tenant.get()
        if tenant_id is None:
            raise TenantContextMissing(
                f"{self.model.__name__}.objects used outside tenant_context(); "
                "wrap the call in kbportal.tenancy.tenant_context(tenant_id)"
            )
        return super().get_queryset().filter(tenant_id=tenant_id)


class TenantOwned(models.Model):
    """Abstract base of every tenant-owned model: a ``tenant`` FK and the scoped manager.

    ``all_tenants`` is the unscoped (default) manager for framework code and the platform
    operator's admin (which connects as the table owner); on the app role it still meets
    row-level security, so outside a tenant context it returns nothing.
    """

    tenant = models.ForeignKey("projects.Tenant", on_delete=models.CASCADE, related_name="+")

    # ``all_tenants`` is declared first so it is Django's default manager: forms, the admin and
    # other framework code build querysets eagerly (before any tenant is known) and then meet
    # row-level security. Application code uses ``objects``, which refuses to run unscoped.
    all_tenants = models.Manager()
    objects = TenantScopedManager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if self.tenant_id is None and _current_tenant.get() is not None:
            self.tenant_id = _current_tenant.get()
        super().save(*args, **kwargs)


def enable_rls_sql(table: str, *, user_column: str | None = None) -> tuple[str, str]:
    """SQL pair ``(forward, reverse)`` enabling and forcing row-level security on ``table``.

    The policy admits a row when its ``tenant_id`` equals the transaction's ``app.tenant_id``
    setting; with ``user_column`` it also admits the rows of the current ``app.user_id`` (a
    user's own memberships, read before a tenant is chosen). Unset settings compare as NULL, so
    no row matches: fail closed.
    """
    tenant_clause = "tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::bigint"
    using = tenant_clause
    if user_column:
        using = f"({tenant_clause}) OR ({user_column} = NULLIF(current_setting('app.user_id', true), '')::bigint)"
    forward = (
        f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY; '
        f'ALTER TABLE "{table}" FORCE ROW LEVEL SECURITY; '
        f'CREATE POLICY tenant_isolation ON "{table}" USING ({using}) WITH CHECK ({tenant_clause});'
    )
    reverse = (
        f'DROP POLICY IF EXISTS tenant_isolation ON "{table}"; '
        f'ALTER TABLE "{table}" NO FORCE ROW LEVEL SECURITY; '
        f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY;'
    )
    return forward, reverse
