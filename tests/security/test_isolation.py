"""Tenant isolation and principals: every path a user of tenant A could use to read tenant B."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from kbportal.tenancy import TenantContextMissing, tenant_context
from projects.models import Membership, Profile, Project
from projects.services import membership_create, profile_set_default_project
from search.retrieval import hybrid_search
from search.services import ask, indexed_kinds
from sources.models import DataSource, Document, IngestionRun, ProjectSource
from sources.selectors import scope_for_user
from tests.security.conftest import ADMIN_ONLY_MARKER, B_MARKER, CFO_EMAIL, CFO_MARKER

pytestmark = pytest.mark.django_db


def _html(response):
    return response.content.decode()


# ---------- web pages, ?project=, onboarding ----------------------------------------------------


@pytest.mark.parametrize("page", ["search:ask", "search:search"])
def test_pages_never_show_other_tenant_rows_even_with_its_project_slug(client, atk, page):
    client.force_login(atk.a.admin)
    for params in ({"q": B_MARKER}, {"q": B_MARKER, "project": atk.b.project.slug}, {"q": "AtkB deploys billing"}):
        html = _html(client.get(reverse(page), params))
        assert "make release twice" not in html and "atk-b.example" not in html


def test_unknown_project_slug_is_404_and_message_does_not_confirm_other_tenant(client, atk):
    client.force_login(atk.a.admin)
    r = client.get(reverse("search:ask"), {"q": "x", "project": "does-not-exist"})
    assert r.status_code == 404


def test_onboarding_post_with_other_tenants_public_id_changes_nothing(client, atk):
    client.force_login(atk.a_member)
    before = Profile.objects.get(user=atk.a_member).default_project_id
    client.post(reverse("projects:onboarding"), {"project": str(atk.b.project.public_id), "action": "choose"})
    assert Profile.objects.get(user=atk.a_member).default_project_id == before


def test_profile_forged_to_other_tenants_project_gives_no_scope(atk):
    user = get_user_model().objects.create_user("atk-forger", "f@atk-a.example", "pw-forger-123")
    from projects.services import membership_create

    membership_create(tenant_id=atk.a.tenant.pk, user=user)
    Profile.objects.filter(user=user).update(default_project_id=atk.b.project.pk)
    from projects.selectors import ScopeNotFound

    with pytest.raises(ScopeNotFound):
        scope_for_user(user)
    # and pointing the profile's tenant at B (not a member) falls back to A
    Profile.objects.filter(user=user).update(tenant_id=atk.b.tenant.pk, default_project_id=atk.b.project.pk)
    with pytest.raises(ScopeNotFound):
        scope_for_user(user)


def test_admin_is_closed_to_non_staff(client, atk):
    client.force_login(atk.a.admin)  # tenant owner, not staff
    for url in ("/admin/", "/admin/sources/document/", "/admin/projects/tenant/"):
        r = client.get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"]


# ---------- ORM / raw SQL / managers -------------------------------------------------------------


TABLES = [
    "sources_document",
    "sources_datasource",
    "sources_projectsource",
    "sources_ingestionrun",
    "projects_project",
    "projects_membership",
]


def test_raw_sql_without_tenant_sees_no_tenant_rows(atk):
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table}")
            assert cursor.fetchone()[0] == 0, table


def test_all_tenants_manager_and_related_access_without_context(atk):
    assert list(Document.all_tenants.all()) == []
    assert list(DataSource.all_tenants.all()) == []
    with pytest.raises(TenantContextMissing):
        list(Project.objects.all())
    with tenant_context(atk.a.tenant.pk):
        doc = Document.objects.filter(source_id=atk.a_source_id).first()
        project = Project.objects.get(pk=atk.a.project.pk)
    with pytest.raises(DataSource.DoesNotExist):
        doc.source  # noqa: B018  (lazy FK load outside the tenant's context sees nothing)
    # Related managers use the default (unscoped) manager: row-level security returns nothing.
    assert list(project.sources.all()) == []


def test_all_tenants_manager_in_tenant_a_never_sees_b(atk):
    with tenant_context(atk.a.tenant.pk):
        for model in (Document, DataSource, ProjectSource, IngestionRun, Project, Membership):
            tenants = set(model.all_tenants.values_list("tenant_id", flat=True))
            assert tenants <= {atk.a.tenant.pk}, model
        # related access through a row of A cannot reach B either
        assert not Document.all_tenants.filter(source_id=atk.b_source_id).exists()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM sources_document WHERE content ILIKE %s", [f"%{B_MARKER}%"])
            assert cursor.fetchone()[0] == 0


def test_app_role_cannot_flip_its_own_tenant_setting_into_b_via_orm_filter(atk):
    # The ORM filter and RLS both key on the same setting: a wrong filter is not enough.
    with tenant_context(atk.a.tenant.pk):
        assert not Document.objects.filter(tenant_id=atk.b.tenant.pk).exists()
        assert not Document.all_tenants.filter(tenant_id=atk.b.tenant.pk).exists()


def test_forged_scope_with_b_sources_but_a_tenant_returns_nothing(atk):
    forged = replace(scope_for_user(atk.a.admin), allowed_source_ids=(atk.b_source_id,))
    assert hybrid_search(B_MARKER, forged).hits == []


# ---------- principals ---------------------------------------------------------------------------


def test_member_cannot_read_restricted_rows_via_search_ask_or_pages(client, atk):
    scope = scope_for_user(atk.a_member)
    for marker in (ADMIN_ONLY_MARKER, CFO_MARKER):
        assert all(marker not in h.content for h in hybrid_search(marker, scope, limit=50).hits)
        result = ask(marker, scope)
        # The asker's own words (the question, and what was answered: the same question) are no leak.
        asked = ("question", "standalone_question", "plan", "tools_run")
        shown = {k: v for k, v in result.as_dict().items() if k not in asked}
        dumped = json.dumps(shown, default=str)
        assert marker not in dumped and "hr#payroll" not in dumped
    client.force_login(atk.a_member)
    for page in ("search:ask", "search:search"):
        for marker in (ADMIN_ONLY_MARKER, CFO_MARKER):
            html = _html(client.get(reverse(page), {"q": marker}))
            assert "finance vault" not in html and "due next quarter" not in html
            assert "Payroll (admin only)" not in html and "CFO notes" not in html


def test_admin_principal_does_see_their_restricted_row(atk):
    hits = hybrid_search(ADMIN_ONLY_MARKER, scope_for_user(atk.a.admin)).hits
    assert hits and hits[0].external_id == "hr#payroll"


def test_member_can_claim_someone_elses_email_principal_through_allauth(client, atk):
    """DEFECT: ``email:<address>`` principals trust User.email, which any user may change to any
    address (ACCOUNT_EMAIL_VERIFICATION = "none"): a plain member adds the CFO's address,
    marks it primary, and reads the CFO-only rows."""
    user = get_user_model().objects.create_user("atk-sneaky", "sneaky@atk-a.example", "pw-sneaky-123!")
    from projects.services import membership_create, profile_set_default_project

    membership_create(tenant_id=atk.a.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=atk.a.tenant.pk, project_id=atk.a.project.pk)
    assert all(CFO_MARKER not in h.content for h in hybrid_search(CFO_MARKER, scope_for_user(user)).hits)

    assert client.login(username="atk-sneaky", password="pw-sneaky-123!")
    client.post("/accounts/email/", {"action_add": "", "email": CFO_EMAIL})
    client.post("/accounts/email/", {"action_primary": "", "email": CFO_EMAIL})
    user.refresh_from_db()
    html = _html(client.get(reverse("search:search"), {"q": CFO_MARKER}))
    assert "due next quarter" not in html, f"user.email is now {user.email!r} and the CFO-only row is shown"


def test_indexed_kinds_counts_rows_the_asker_may_not_read(atk):
    """LOW: the planner's view of the project (sent to the LLM) counts restricted rows too."""
    member = indexed_kinds(scope_for_user(atk.a_member))
    # The member may read 2 of the project's 4 rows (runbook, evil); the other 2 are restricted.
    assert sum(member.values()) == 2, member


# ---------- management commands -----------------------------------------------------------------


def test_ask_command_as_tenant_a_user_never_prints_b(atk, capsys):
    call_command("ask", B_MARKER, "--user", "atk-a-admin", "--json")
    out = capsys.readouterr().out
    assert "make release twice" not in out and "atk-b.example" not in out
    call_command("ask", B_MARKER, "--user", "atk-a-admin", "--project", atk.b.project.slug, "--json")
    out = capsys.readouterr().out
    assert "make release twice" not in out and "atk-b.example" not in out


def test_ask_command_operator_scope_hides_restricted_rows(atk, capsys):
    call_command("ask", ADMIN_ONLY_MARKER, "--tenant", "atk-a", "--project", atk.a.project.slug, "--json")
    out = capsys.readouterr().out
    assert "finance vault" not in out and "hr#payroll" not in out


def test_ingest_command_with_unicode_digit_reference(atk):
    """Bad input: '²'.isdigit() is True but int('²') raises -> traceback instead of CommandError."""
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("ingest", "²", "--quiet")


def test_a_verified_email_does_grant_its_restricted_rows(atk):
    from allauth.account.models import EmailAddress

    user = get_user_model().objects.create_user("atk-a-cfo", CFO_EMAIL, "q" * 12)
    membership_create(tenant_id=atk.a.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=atk.a.tenant.pk, project_id=atk.a.project.pk)
    scope = scope_for_user(user)
    assert all(CFO_MARKER not in h.content for h in hybrid_search(CFO_MARKER, scope).hits)
    EmailAddress.objects.create(user=user, email=CFO_EMAIL, verified=True, primary=True)
    hits = hybrid_search(CFO_MARKER, scope_for_user(user)).hits
    assert hits[0].external_id == "board#cfo"
