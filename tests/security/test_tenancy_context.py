"""tenant_context / user_context misuse: nesting, exceptions, settings outliving the block."""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection, transaction

from kbportal.tenancy import TenantContextMissing, current_tenant_id, tenant_context, user_context
from search.retrieval import hybrid_search
from sources.models import Document
from sources.selectors import scope_for_user

pytestmark = pytest.mark.django_db  # every test runs inside an outer transaction (the test's)


def _visible(table: str = "sources_document") -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


def _settings() -> tuple[str | None, str | None]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('app.tenant_id', true), current_setting('app.user_id', true)")
        return cursor.fetchone()


def test_setting_does_not_outlive_the_block_in_an_outer_transaction(atk):
    with transaction.atomic():
        with tenant_context(atk.a.tenant.pk, user_id=atk.a.admin.pk):
            assert _visible() > 0
        assert _visible() == 0
        assert _settings() in {("", ""), (None, None)}


def test_setting_does_not_outlive_a_block_that_raised(atk):
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            with tenant_context(atk.a.tenant.pk):
                assert _visible() > 0
                raise RuntimeError("boom")
        assert _visible() == 0
        assert current_tenant_id() is None


def test_block_with_a_swallowed_database_error(atk):
    """Holds (fail-closed), with a quirk: a raw-SQL error swallowed inside the block does not set
    needs_rollback, so the restore statement itself fails (InternalError) on exit; the savepoint
    rollback then drops the tenant setting anyway."""
    with transaction.atomic():
        with pytest.raises(DatabaseError):
            with tenant_context(atk.a.tenant.pk):
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT 1/0")
                except DatabaseError:
                    pass
        assert current_tenant_id() is None
        assert _visible() == 0


def test_nested_same_tenant_restores_outer_user(atk):
    with tenant_context(atk.a.tenant.pk):
        with tenant_context(atk.a.tenant.pk, user_id=atk.a.admin.pk):
            assert _settings()[1] == str(atk.a.admin.pk)
        assert _settings() == (str(atk.a.tenant.pk), "")
        assert _visible() > 0
    assert _visible() == 0


def test_nested_other_tenant_refused_and_outer_intact(atk):
    with tenant_context(atk.a.tenant.pk):
        with pytest.raises(ValueError):
            with tenant_context(atk.b.tenant.pk):
                pass
        assert _settings()[0] == str(atk.a.tenant.pk)
        with pytest.raises(ValueError):
            hybrid_search("billing", scope_for_user(atk.b.admin))


def test_context_does_not_leak_into_a_new_thread(atk):
    seen = {}

    def worker():
        try:
            list(Document.objects.all())
        except TenantContextMissing:
            seen["raised"] = True

    with tenant_context(atk.a.tenant.pk):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen.get("raised")


def test_user_context_setting_outlives_the_block_in_an_outer_transaction(atk):
    """LOW: user_context never restores app.user_id; inside an outer transaction the membership
    policy keeps admitting that user's rows after the block ends."""
    with transaction.atomic():
        with user_context(atk.a.admin.pk):
            assert _visible("projects_membership") >= 1
        assert _visible("projects_membership") == 0, "membership rows still visible after user_context"


def test_tenant_context_with_bool_or_str_tenant(atk):
    with pytest.raises((TypeError, ValueError)):
        with tenant_context("1; SELECT 1"):
            pass
