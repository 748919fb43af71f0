"""API tokens: creation, hash-only storage, authentication, revocation, expiry, tenant isolation."""

from __future__ import annotations

import hashlib
import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.utils import ProgrammingError
from django.utils import timezone

from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Membership, Profile
from projects.selectors import (
    ApiTokenRejected,
    ScopeNotFound,
    api_token_authenticate,
    api_token_list_for_tenant,
    api_token_project,
)
from projects.services import (
    ApiTokenError,
    api_token_create,
    api_token_revoke,
    api_token_touch,
    membership_create,
    profile_set_default_project,
    project_create,
)

pytestmark = pytest.mark.django_db

TOKEN_SHAPE = re.compile(r"kb_[a-z0-9]{8}_[A-Za-z0-9]{40}")


@pytest.fixture
def two(make_tenant):
    """Tenant A (admin, member) and tenant B (admin): the three people of every access test."""
    a = make_tenant("tok-a")
    b = make_tenant("tok-b")
    member = get_user_model().objects.create_user("tok-a-member", "m@tok-a.example", "pw-member-123")
    membership_create(tenant_id=a.tenant.pk, user=member)
    profile_set_default_project(user=member, tenant_id=a.tenant.pk, project_id=a.project.pk)
    return a, b, member


def _expire(token: ApiToken) -> None:
    with tenant_context(token.tenant_id):
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_create_returns_the_plain_token_once_and_stores_only_its_sha256(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="laptop")
    assert TOKEN_SHAPE.fullmatch(raw)
    assert raw.startswith(f"kb_{token.prefix}_")
    secret = raw.split("_", 2)[2]
    with tenant_context(a.tenant.pk):
        with connection.cursor() as cursor:
            cursor.execute("SELECT row_to_json(t)::text FROM projects_apitoken t WHERE id = %s", [token.pk])
            stored = cursor.fetchone()[0]
    assert hashlib.sha256(raw.encode()).hexdigest() in stored
    assert secret not in stored and raw not in stored
    # Two tokens never share a prefix or a secret.
    _, raw2 = api_token_create(tenant=a.tenant, user=a.admin, name="laptop")
    assert raw2.split("_")[1] != token.prefix and raw2.split("_", 2)[2] != secret


def test_authenticate_gives_tenant_user_and_default_project(two):
    a, _, member = two
    _, raw = api_token_create(tenant=a.tenant, user=member, name="script")
    identity = api_token_authenticate(raw)
    assert (identity.tenant_id, identity.user, identity.project_slug) == (a.tenant.pk, member, a.project.slug)
    assert identity.project_pinned is False
    # An unpinned token may name another project of its tenant, never one of another tenant.
    other = project_create(tenant_id=a.tenant.pk, name="Billing")
    assert api_token_project(identity, "billing").pk == other.pk
    assert api_token_project(identity).pk == a.project.pk
    with pytest.raises(ScopeNotFound):
        api_token_project(identity, two[1].project.slug + "-nope")


def test_token_pinned_to_a_project_cannot_switch_project(two):
    a, _, member = two
    billing = project_create(tenant_id=a.tenant.pk, name="Billing")
    _, raw = api_token_create(tenant=a.tenant, user=member, name="ci", project=billing)
    identity = api_token_authenticate(raw)
    assert (identity.project_slug, identity.project_pinned) == ("billing", True)
    assert api_token_project(identity, "billing").pk == billing.pk
    with pytest.raises(ScopeNotFound, match="limited to project 'billing'"):
        api_token_project(identity, a.project.slug)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "kb_",
        "Bearer kb_abcdefgh_" + "x" * 40,
        "kb_ABCDEFGH_" + "x" * 40,
        "kb_abcdefgh_" + "x" * 39,
        "kb_abcdefgh_" + "-" * 40,
        "kb_abcdefgh_" + "x" * 40 + "\n" + "y",
    ],
)
def test_malformed_tokens_are_rejected_as_malformed(raw):
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)
    assert exc.value.reason == "malformed"


def test_forged_token_of_the_right_shape_is_unknown(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="real")
    forged = raw[:-1] + ("A" if raw[-1] != "A" else "B")  # real prefix, one secret character changed
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(forged)
    assert exc.value.reason == "unknown"


def test_revoked_token_is_refused_and_revoking_twice_keeps_the_first_time(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="old")
    assert api_token_authenticate(raw).token_id == token.pk
    first = api_token_revoke(token=token).revoked_at
    assert first is not None
    assert api_token_revoke(token=token).revoked_at == first
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)
    assert exc.value.reason == "revoked"


def test_expired_token_is_refused(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="short", expires_in_days=1)
    assert timedelta(hours=23) < token.expires_at - timezone.now() <= timedelta(days=1)
    assert api_token_authenticate(raw).user == a.admin
    _expire(token)
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)
    assert exc.value.reason == "expired"


def test_token_of_a_user_who_left_the_tenant_or_was_deactivated_is_refused(two):
    a, _, member = two
    _, raw = api_token_create(tenant=a.tenant, user=member, name="script")
    member.is_active = False
    member.save(update_fields=["is_active"])
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)
    assert exc.value.reason == "not_member"
    member.is_active = True
    member.save(update_fields=["is_active"])
    assert api_token_authenticate(raw).user == member
    with tenant_context(a.tenant.pk):
        Membership.objects.filter(user=member).delete()
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)
    assert exc.value.reason == "not_member"


def test_a_default_project_in_another_tenant_is_not_the_tokens_project(two):
    a, b, member = two
    membership_create(tenant_id=b.tenant.pk, user=member)  # member of both; default project stays in A
    assert Profile.objects.get(user=member).default_project_id == a.project.pk
    _, raw = api_token_create(tenant=b.tenant, user=member, name="b-script")
    identity = api_token_authenticate(raw)
    assert (identity.tenant_id, identity.project_slug) == (b.tenant.pk, None)
    with pytest.raises(ScopeNotFound, match="no default project"):
        api_token_project(identity)
    a_only = project_create(tenant_id=a.tenant.pk, name="A only")
    with pytest.raises(ScopeNotFound):
        api_token_project(identity, a_only.slug)  # a project of A, looked up in B: not found
    assert api_token_project(identity, b.project.slug).pk == b.project.pk


def test_service_token_needs_a_project_and_speaks_for_no_user(two):
    a, _, _ = two
    with pytest.raises(ApiTokenError, match="must name its project"):
        api_token_create(tenant=a.tenant, user=None, name="bot")
    _, raw = api_token_create(tenant=a.tenant, user=None, name="bot", project=a.project)
    identity = api_token_authenticate(raw)
    assert (identity.user, identity.user_id, identity.project_slug, identity.project_pinned) == (
        None,
        None,
        a.project.slug,
        True,
    )


def test_create_refuses_outsiders_other_tenants_projects_and_bad_arguments(two):
    a, b, _ = two
    with pytest.raises(ApiTokenError, match="not a member"):
        api_token_create(tenant=a.tenant, user=b.admin, name="x")
    with pytest.raises(ApiTokenError, match="not in tenant"):
        api_token_create(tenant=a.tenant, user=a.admin, name="x", project=b.project)
    with pytest.raises(ApiTokenError, match="name"):
        api_token_create(tenant=a.tenant, user=a.admin, name="  ")
    with pytest.raises(ApiTokenError, match="days"):
        api_token_create(tenant=a.tenant, user=a.admin, name="x", expires_in_days=0)
    with tenant_context(a.tenant.pk):
        assert not ApiToken.objects.exists()


def test_no_query_lists_another_tenants_tokens(two):
    a, b, _ = two
    token_a, raw_a = api_token_create(tenant=a.tenant, user=a.admin, name="a")
    token_b, _ = api_token_create(tenant=b.tenant, user=b.admin, name="b")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM projects_apitoken")
        assert cursor.fetchone()[0] == 0  # no tenant, no hash: nothing
    assert list(ApiToken.all_tenants.all()) == []
    assert [t.pk for t in api_token_list_for_tenant(tenant_id=a.tenant.pk)] == [token_a.pk]
    with tenant_context(a.tenant.pk):
        assert set(ApiToken.all_tenants.values_list("tenant_id", flat=True)) == {a.tenant.pk}
        assert not ApiToken.all_tenants.filter(prefix=token_b.prefix).exists()
    # The authentication setting admits exactly the row whose hash it names, nothing more.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('app.token_hash', %s, true)", [hashlib.sha256(raw_a.encode()).hexdigest()])
        cursor.execute("SELECT id FROM projects_apitoken")
        assert [r[0] for r in cursor.fetchall()] == [token_a.pk]
        cursor.execute("SELECT set_config('app.token_hash', '', true)")


def test_knowing_a_tokens_hash_does_not_allow_writing_it(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="a")
    api_token_revoke(token=token)
    with pytest.raises(ProgrammingError, match="row-level security"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('app.token_hash', %s, true)", [hashlib.sha256(raw.encode()).hexdigest()])
            cursor.execute("UPDATE projects_apitoken SET revoked_at = NULL WHERE id = %s", [token.pk])
    with pytest.raises(ApiTokenRejected):
        api_token_authenticate(raw)


def test_tenant_a_context_cannot_insert_a_token_for_tenant_b(two):
    a, b, _ = two
    with pytest.raises(ProgrammingError, match="row-level security"):
        with tenant_context(a.tenant.pk):
            ApiToken.all_tenants.create(tenant=b.tenant, user=b.admin, name="x", prefix="zzzzzzzz", token_hash="0" * 64)


def test_touch_records_use_at_most_once_a_minute(two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="a")
    identity = api_token_authenticate(raw)
    api_token_touch(identity=identity)
    with tenant_context(a.tenant.pk):
        first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None and timezone.now() - first < timedelta(seconds=5)
    api_token_touch(identity=identity)
    with tenant_context(a.tenant.pk):
        assert ApiToken.objects.get(pk=token.pk).last_used_at == first
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=5))
    api_token_touch(identity=identity)
    with tenant_context(a.tenant.pk):
        assert ApiToken.objects.get(pk=token.pk).last_used_at > first


# ---------- manage.py api_token ------------------------------------------------------------------


def test_command_creates_lists_and_revokes(two):
    a, _, member = two
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "api_token",
        "create",
        "--tenant",
        "tok-a",
        "--user",
        member.username,
        "--name",
        "ci",
        "--expires-days",
        "7",
        stdout=out,
        stderr=err,
    )
    raw = out.getvalue().strip()
    assert TOKEN_SHAPE.fullmatch(raw) and "shown once" in err.getvalue()
    identity = api_token_authenticate(raw)
    assert (identity.user, identity.project_slug) == (member, a.project.slug)

    listing = io.StringIO()
    call_command("api_token", "list", "--tenant", "tok-a", stdout=listing)
    line = listing.getvalue()
    assert f"kb_{identity.prefix}_…" in line and "ci" in line and "active" in line
    assert raw.split("_", 2)[2] not in line and hashlib.sha256(raw.encode()).hexdigest() not in line

    call_command("api_token", "revoke", f"kb_{identity.prefix}", stdout=io.StringIO())
    with pytest.raises(ApiTokenRejected):
        api_token_authenticate(raw)
    listing = io.StringIO()
    call_command("api_token", "list", "--tenant", "tok-a", stdout=listing)
    assert "revoked" in listing.getvalue()


def test_command_service_token_and_errors(two):
    a, _, _ = two
    out = io.StringIO()
    call_command(
        "api_token", "create", "--tenant", "tok-a", "--project", a.project.slug, stdout=out, stderr=io.StringIO()
    )
    assert api_token_authenticate(out.getvalue().strip()).user is None
    with pytest.raises(CommandError, match="no tenant"):
        call_command("api_token", "list", "--tenant", "nope")
    with pytest.raises(CommandError, match="no project"):
        call_command("api_token", "create", "--tenant", "tok-a", "--user", a.admin.username, "--project", "tok-b")
    with pytest.raises(CommandError, match="not a member"):
        call_command("api_token", "create", "--tenant", "tok-a", "--user", "tok-b-admin")
    with pytest.raises(CommandError, match="no API token"):
        call_command("api_token", "revoke", "zzzzzzzz")


# ---------- admin --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed_token(django_db_setup, django_db_blocker):
    """A committed token (the admin reads through the owner connection, outside the test transaction)."""
    from projects.services import tenant_onboard

    with django_db_blocker.unblock():
        onboarded = tenant_onboard(
            name="TokAdm", slug="tok-adm", admin_username="tok-adm-admin", admin_password="p" * 12
        )
        token, raw = api_token_create(tenant=onboarded.tenant, user=onboarded.admin, name="admin-visible")
    return token, raw


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_shows_the_prefix_never_the_hash(client, committed_token):
    token, raw = committed_token
    staff = get_user_model().objects.create_superuser("tok-operator", "op@tok.example", "pw-operator-123")
    client.force_login(staff)
    for url in ("/admin/projects/apitoken/", f"/admin/projects/apitoken/{token.pk}/change/"):
        html = client.get(url).content.decode()
        assert f"kb_{token.prefix}_" in html, url
        assert token.token_hash not in html and raw.split("_", 2)[2] not in html, url
    assert client.get("/admin/projects/apitoken/add/").status_code == 403


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_revoke_action_revokes(client, committed_token):
    token, raw = committed_token
    staff = get_user_model().objects.create_superuser("tok-operator2", "op2@tok.example", "pw-operator-123")
    client.force_login(staff)
    response = client.post("/admin/projects/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert response.status_code == 302
    with pytest.raises(ApiTokenRejected) as exc:
        api_token_authenticate(raw)  # rolled back with the test: the committed token stays usable elsewhere
    assert exc.value.reason == "revoked"


# -- the signed-in user's own tokens page (/tokens/) -------------------------------------------


def _secret_in(html: str) -> list[str]:
    return TOKEN_SHAPE.findall(html)


def test_a_user_creates_a_token_on_the_tokens_page_and_sees_its_secret_once(client, two):
    a, _, member = two
    client.force_login(member)
    response = client.post("/tokens/", {"name": "laptop scripts", "project": "", "expires_in_days": "30"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    (raw,) = _secret_in(response.content.decode())
    identity = api_token_authenticate(raw)
    assert (identity.tenant_id, identity.user_id) == (a.tenant.pk, member.pk)
    listing = client.get("/tokens/").content.decode()
    assert "laptop scripts" in listing and f"kb_{identity.prefix}" in listing
    assert not _secret_in(listing)  # shown once, never again


def test_a_token_created_on_the_page_may_be_pinned_only_to_a_readable_project(client, two):
    a, b, member = two
    client.force_login(member)
    response = client.post("/tokens/", {"name": "pinned", "project": str(a.project.public_id)})
    (raw,) = _secret_in(response.content.decode())
    assert api_token_authenticate(raw).project_pinned
    refused = client.post("/tokens/", {"name": "foreign", "project": str(b.project.public_id)})
    assert refused.status_code == 200 and not _secret_in(refused.content.decode())
    assert "Select a valid choice" in refused.content.decode()
    blank = client.post("/tokens/", {"name": "  "})
    assert not _secret_in(blank.content.decode()) and "This field is required" in blank.content.decode()


def test_the_tokens_page_lists_only_the_users_own_tokens(client, two):
    a, b, member = two
    mine, _ = api_token_create(tenant=a.tenant, user=member, name="mine")
    admins, _ = api_token_create(tenant=a.tenant, user=a.admin, name="the-admins")
    service, _ = api_token_create(tenant=a.tenant, user=None, name="the-service", project=a.project)
    foreign, _ = api_token_create(tenant=b.tenant, user=b.admin, name="the-foreigners")
    client.force_login(member)
    html = client.get("/tokens/").content.decode()
    assert f"kb_{mine.prefix}" in html
    for other in (admins, service, foreign):
        assert other.name not in html and other.prefix not in html


def test_a_user_revokes_only_their_own_tokens(client, two):
    a, b, member = two
    mine, raw = api_token_create(tenant=a.tenant, user=member, name="mine")
    admins, admins_raw = api_token_create(tenant=a.tenant, user=a.admin, name="the-admins")
    foreign, foreign_raw = api_token_create(tenant=b.tenant, user=b.admin, name="the-foreigners")
    client.force_login(member)
    assert client.get(f"/tokens/{mine.prefix}/revoke/").status_code == 405  # a GET changes nothing
    for other in (admins, foreign):
        assert client.post(f"/tokens/{other.prefix}/revoke/").status_code == 404
    api_token_authenticate(admins_raw), api_token_authenticate(foreign_raw)  # both still valid
    assert client.post(f"/tokens/{mine.prefix}/revoke/").status_code == 302
    with pytest.raises(ApiTokenRejected):
        api_token_authenticate(raw)


def test_the_tokens_page_needs_a_signed_in_user(client, two):
    a, _, _ = two
    token, raw = api_token_create(tenant=a.tenant, user=a.admin, name="kept")
    response = client.get("/tokens/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert client.post(f"/tokens/{token.prefix}/revoke/").status_code == 302
    assert api_token_authenticate(raw).user_id == a.admin.pk
