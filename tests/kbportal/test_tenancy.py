"""Row-level security and the scoped manager keep tenants apart, through the ORM and raw SQL."""

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction

from kbportal.tenancy import TenantContextMissing, tenant_context
from sources.models import DataSource, Document


def _doc(tenant_id, source, external_id, title):
    return Document.objects.create(
        tenant_id=tenant_id,
        source=source,
        kind="doc_section",
        external_id=external_id,
        title=title,
        content=title,
        text=title,
        content_hash=external_id,
    )


@pytest.fixture
def two_tenants(make_tenant):
    a, b = make_tenant("acme"), make_tenant("globex")
    for t in (a, b):
        with tenant_context(t.tenant.pk):
            src = DataSource.objects.create(tenant_id=t.tenant.pk, name="Docs", slug="docs", kind="docs")
            _doc(t.tenant.pk, src, f"{t.tenant.slug}-1", f"{t.tenant.slug} secret plan")
    return a, b


def test_orm_sees_only_current_tenant(two_tenants):
    a, b = two_tenants
    with tenant_context(a.tenant.pk):
        titles = list(Document.objects.values_list("title", flat=True))
        base_titles = list(Document.all_tenants.values_list("title", flat=True))
    assert titles == ["acme secret plan"]
    # Even the unscoped manager meets row-level security on the app role.
    assert base_titles == ["acme secret plan"]


def test_raw_sql_in_tenant_context_sees_no_other_tenant(two_tenants):
    a, b = two_tenants
    with tenant_context(a.tenant.pk):
        with connection.cursor() as cursor:
            cursor.execute("SELECT title FROM sources_document")
            rows = [r[0] for r in cursor.fetchall()]
            cursor.execute("SELECT count(*) FROM sources_document WHERE tenant_id = %s", [b.tenant.pk])
            other = cursor.fetchone()[0]
    assert rows == ["acme secret plan"]
    assert other == 0


def test_no_tenant_set_returns_zero_rows_and_manager_raises(two_tenants):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM sources_document")
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT count(*) FROM sources_datasource")
        assert cursor.fetchone()[0] == 0
    with pytest.raises(TenantContextMissing):
        list(Document.objects.all())


def test_insert_for_another_tenant_is_refused(two_tenants):
    a, b = two_tenants
    with tenant_context(a.tenant.pk):
        src = DataSource.objects.get(slug="docs")
    with pytest.raises(ProgrammingError, match="row-level security"):
        with tenant_context(a.tenant.pk):
            with transaction.atomic():
                _doc(b.tenant.pk, src, "smuggled", "smuggled row")


def test_app_role_cannot_bypass_or_disable_rls(two_tenants):
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone() == (False, False)
    with pytest.raises((ProgrammingError, IntegrityError)):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE sources_document DISABLE ROW LEVEL SECURITY")


def test_switching_tenant_inside_a_context_is_refused(two_tenants):
    a, b = two_tenants
    with tenant_context(a.tenant.pk):
        with pytest.raises(ValueError, match="refusing to switch"):
            with tenant_context(b.tenant.pk):
                pass
