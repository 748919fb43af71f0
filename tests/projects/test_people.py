"""The organization's people at /manage/people/: invite by email with a role, accept the link,
change a role, remove a member (sessions ended, tokens revoked at once), each write one audit
event with its actor; and what the page refuses to members, outsiders and other organizations."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.utils import timezone

from kbportal.models import AuditEvent
from kbportal.tenancy import tenant_context
from projects.models import ApiToken, Invitation, Membership
from projects.services import api_token_create, membership_create, profile_set_default_project

pytestmark = pytest.mark.django_db

PEOPLE = "/manage/people/"


@pytest.fixture
def acme(make_tenant):
    return make_tenant("pplacme")


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _member(tenant, username: str, role: str = Membership.Role.MEMBER, email: str = ""):
    user = get_user_model().objects.create_user(username, email, "pw-" + username * 3)
    membership_create(tenant_id=tenant.tenant.pk, user=user, role=role)
    profile_set_default_project(user=user, tenant_id=tenant.tenant.pk, project_id=tenant.project.pk)
    if email:
        EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def _events(tenant_id: int, action: str) -> list[AuditEvent]:
    with tenant_context(tenant_id):
        return list(AuditEvent.objects.filter(action=action).order_by("id"))


def _invite(admin_client: Client, email: str, role: str = "member") -> str:
    """Invite through the page; the link, mailed to the address only, read from the outbox."""
    sent = len(mail.outbox)
    page = admin_client.post(PEOPLE, {"action": "invite", "email": email, "role": role}, follow=True)
    assert page.status_code == 200 and "the link was mailed" in page.content.decode(), page.content.decode()[-2000:]
    assert len(mail.outbox) == sent + 1
    link = re.search(r"http://testserver(/invite/\S+/)", mail.outbox[-1].body).group(1)
    assert link not in page.content.decode()  # never shown to the inviter
    return link


def test_an_invited_person_creates_an_account_from_the_link_and_joins_with_the_role(acme):
    admin = _client(acme.admin)
    link = _invite(admin, "New.Person@Example.test", role="admin")
    assert [m.to for m in mail.outbox] == [["new.person@example.test"]]
    visitor = Client()
    assert "You are invited as <strong>admin</strong>" in visitor.get(link).content.decode()
    joined = visitor.post(
        link, {"username": "newperson", "password1": "Long-enough-pass-42", "password2": "Long-enough-pass-42"}
    )
    assert joined.status_code == 302 and joined["Location"] == "/onboarding/"
    user = get_user_model().objects.get(username="newperson")
    with tenant_context(acme.tenant.pk):
        assert Membership.objects.get(user=user).role == "admin"
    assert EmailAddress.objects.get(user=user).verified  # the link proved the address
    assert visitor.get("/").status_code == 200  # signed in, with a default project
    [invited] = _events(acme.tenant.pk, "member.invite")
    [join] = _events(acme.tenant.pk, "member.join")
    assert invited.actor_id == acme.admin.pk and invited.data["email"] == "new.person@example.test"
    assert join.actor_id == user.pk and join.data["role"] == "admin"
    # The link works once.
    assert Client().get(link).status_code == 404


def test_an_invitation_link_is_refused_when_used_expired_withdrawn_forged_or_for_another_address(acme, make_tenant):
    admin = _client(acme.admin)
    link = _invite(admin, "late@example.test")
    with tenant_context(acme.tenant.pk):
        Invitation.objects.filter(email="late@example.test").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert "expired" in Client().get(link).content.decode()
    withdrawn = _invite(admin, "withdrawn@example.test")
    with tenant_context(acme.tenant.pk):
        pk = Invitation.objects.get(email="withdrawn@example.test").pk
    admin.post(PEOPLE, {"action": "withdraw", "invitation": pk})
    assert Client().get(withdrawn).status_code == 404
    good = _invite(admin, "pat@example.test")
    token = good.rstrip("/").rsplit("/", 1)[1]
    other = make_tenant("pplglobex")
    assert Client().get(f"/invite/{other.tenant.slug}/{token}/").status_code == 404  # another tenant's slug
    assert Client().get(f"/invite/{acme.tenant.slug}/{token[:-1]}x/").status_code == 404
    # A signed-in account that has not verified the invited address cannot take the invitation.
    mallory = get_user_model().objects.create_user("mallory", "pat@example.test", "pw-" + "m" * 12)
    EmailAddress.objects.create(user=mallory, email="pat@example.test", verified=False, primary=True)
    refused = _client(mallory).post(good)
    assert "who has not verified that address" in refused.content.decode()
    with tenant_context(acme.tenant.pk):
        assert not Membership.objects.filter(user=mallory).exists()
    # Nor can a stranger make a second account for an address an account already holds.
    taken = Client().post(
        good, {"username": "pat2", "password1": "Long-enough-pass-42", "password2": "Long-enough-pass-42"}
    )
    assert "an account with pat@example.test exists" in taken.content.decode()
    pat = get_user_model().objects.create_user("pat", "", "pw-" + "p" * 12)
    EmailAddress.objects.create(user=pat, email="PAT@example.test", verified=True, primary=True)
    assert _client(pat).post(good).status_code == 302
    with tenant_context(acme.tenant.pk):
        assert Membership.objects.get(user=pat).role == "member"


def test_roles_change_within_the_rules_and_each_change_is_audited(acme):
    owner = acme.admin
    with tenant_context(acme.tenant.pk):
        assert Membership.objects.get(user=owner).role == "owner"
    admin = _member(acme, "ada", Membership.Role.ADMIN)
    member = _member(acme, "bo")
    as_admin = _client(admin)
    page = as_admin.post(PEOPLE, {"action": "role", "user": member.pk, "role": "owner"}, follow=True)
    assert "only an owner may make someone an owner" in page.content.decode()
    page = as_admin.post(PEOPLE, {"action": "role", "user": owner.pk, "role": "member"}, follow=True)
    assert "only an owner may change or remove an owner" in page.content.decode()
    as_admin.post(PEOPLE, {"action": "role", "user": member.pk, "role": "admin"})
    as_owner = _client(owner)
    page = as_owner.post(PEOPLE, {"action": "role", "user": owner.pk, "role": "member"}, follow=True)
    assert "your own membership" in page.content.decode()
    as_owner.post(PEOPLE, {"action": "role", "user": admin.pk, "role": "owner"})
    # Now two owners: Ada (owner) may demote the first one, but not herself, the last.
    _client(admin).post(PEOPLE, {"action": "role", "user": owner.pk, "role": "admin"})
    with tenant_context(acme.tenant.pk):
        roles = dict(Membership.objects.values_list("user__username", "role"))
    assert roles == {owner.username: "admin", "ada": "owner", "bo": "admin"}
    changes = [
        (e.actor_id, e.data["user"], e.data["from"], e.data["to"]) for e in _events(acme.tenant.pk, "member.role")
    ]
    assert changes == [
        (admin.pk, "bo", "member", "admin"),
        (owner.pk, "ada", "admin", "owner"),
        (admin.pk, owner.username, "owner", "admin"),
    ]


def test_removing_a_member_ends_their_sessions_and_revokes_their_tokens_at_once(acme):
    member = _member(acme, "leaver", email="leaver@example.test")
    session = _client(member)
    assert session.get("/").status_code == 200
    _, raw = api_token_create(tenant=acme.tenant, user=member, name="laptop")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/projects").status_code == 200
    done = _client(acme.admin).post(PEOPLE, {"action": "remove", "user": member.pk}, follow=True)
    assert "1 API token(s) revoked, 1 session(s) ended" in done.content.decode()
    assert session.get("/").status_code == 302  # signed out
    assert api.get("/api/v1/projects").status_code == 401
    with tenant_context(acme.tenant.pk):
        assert not Membership.objects.filter(user=member).exists()
        assert ApiToken.objects.get(user=member).revoked_at is not None
    [removed] = _events(acme.tenant.pk, "member.remove")
    assert removed.actor_id == acme.admin.pk and removed.data["tokens_revoked"] == 1
    # The last owner cannot be removed, not even by another admin.
    admin = _member(acme, "ada", Membership.Role.ADMIN)
    page = _client(admin).post(PEOPLE, {"action": "remove", "user": acme.admin.pk}, follow=True)
    assert "only an owner may change or remove an owner" in page.content.decode()


def test_people_pages_are_closed_to_members_outsiders_and_other_organizations(acme, make_tenant):
    member = _member(acme, "plain")
    other = make_tenant("pplglobex")
    for path in ("/manage/", PEOPLE):
        assert _client(member).get(path).status_code == 404
        assert Client().get(path).status_code == 302  # to the login page
    # Another organization's admin reaches none of acme's people, by page or by forged POST.
    outsider = _client(other.admin)
    page = outsider.get(PEOPLE).content.decode()
    assert "plain" not in page and acme.admin.username not in page
    for action in ({"action": "remove", "user": member.pk}, {"action": "role", "user": member.pk, "role": "admin"}):
        answer = outsider.post(PEOPLE, action, follow=True)
        assert "no such member" in answer.content.decode()
    with tenant_context(acme.tenant.pk):
        assert Membership.objects.get(user=member).role == "member"
    # A member cannot invite (the POST is refused before any invitation exists).
    assert (
        _client(member).post(PEOPLE, {"action": "invite", "email": "x@example.test", "role": "owner"}).status_code
        == 404
    )
    with tenant_context(acme.tenant.pk):
        assert not Invitation.objects.exists()


def test_an_invitation_grants_no_more_than_its_sender_still_may(acme):
    admin = _member(acme, "ada", Membership.Role.ADMIN)
    as_admin = _client(admin)
    removed_link = _invite(as_admin, "ada.second@example.test", role="admin")
    owner_link = _invite(_client(acme.admin), "co.owner@example.test", role="owner")
    _client(acme.admin).post(PEOPLE, {"action": "remove", "user": admin.pk})
    # The removed admin's pending invitation was withdrawn with her.
    assert Client().get(removed_link).status_code == 404
    # An owner invitation whose sender is no longer an owner grants nothing.
    other_owner = _member(acme, "oscar", Membership.Role.OWNER)
    _client(other_owner).post(PEOPLE, {"action": "role", "user": acme.admin.pk, "role": "admin"})
    assert Client().get(owner_link).status_code == 404
    with tenant_context(acme.tenant.pk):
        assert not Membership.objects.filter(role="owner").exclude(user=other_owner).exists()


def test_a_lookalike_or_existing_member_cannot_take_an_invitation(acme):
    link = _invite(_client(acme.admin), "kim@example.test")
    for n, address in enumerate(("\u212aim@example.test", "k\u0131m@example.test")):
        lookalike = get_user_model().objects.create_user(f"lookalike{n}", "", "pw-" + "l" * 12)
        EmailAddress.objects.create(user=lookalike, email=address, verified=True, primary=True)
        assert "who has not verified that address" in _client(lookalike).post(link).content.decode()
    member = _member(acme, "kim", email="kim@example.test")
    assert "already a member" in _client(member).post(link).content.decode()
    with tenant_context(acme.tenant.pk):
        assert Invitation.objects.get(email="kim@example.test").accepted_at is None


@pytest.mark.parametrize("username", ["pplacme-admin\u200b", "ceo@example.test", "a b", "<b>x</b>"])
def test_an_invitation_signup_refuses_a_misleading_username(acme, username):
    link = _invite(_client(acme.admin), "fresh@example.test")
    page = Client().post(
        link, {"username": username, "password1": "Long-enough-pass-42", "password2": "Long-enough-pass-42"}
    )
    assert page.status_code == 200 and "a username may" in page.content.decode()
    assert not get_user_model().objects.filter(username=username).exists()


def test_admins_list_and_revoke_every_token_and_create_service_tokens(acme, make_tenant):
    member = _member(acme, "scripter")
    _, personal = api_token_create(tenant=acme.tenant, user=member, name="laptop")
    admin = _client(acme.admin)
    assert admin.get("/manage/").status_code == 200
    page = admin.post(
        "/manage/tokens/", {"action": "create", "name": "nightly job", "project": str(acme.project.public_id)}
    )
    assert page["Cache-Control"] == "no-store"
    secret = re.search(r'<code id="new-token">(kb_[^<]+)</code>', page.content.decode()).group(1)
    assert Client(HTTP_AUTHORIZATION=f"Bearer {secret}").get("/api/v1/projects").status_code == 200
    listing = admin.get("/manage/tokens/").content.decode()
    assert secret not in listing and "laptop" in listing and "nightly job" in listing and ">service<" in listing
    prefix = personal.split("_")[1]
    assert (
        make_tenant
        and _client(make_tenant("ppltok").admin)
        .post("/manage/tokens/", {"action": "revoke", "prefix": prefix})
        .status_code
        == 404
    )  # another organization's admin
    assert _client(member).get("/manage/tokens/").status_code == 404
    admin.post("/manage/tokens/", {"action": "revoke", "prefix": prefix})
    assert Client(HTTP_AUTHORIZATION=f"Bearer {personal}").get("/api/v1/projects").status_code == 401
    [revoked] = _events(acme.tenant.pk, "token.revoke")
    assert revoked.actor_id == acme.admin.pk and revoked.data["prefix"] == prefix


def test_a_first_password_login_leads_to_choosing_a_default_project_once(acme):
    user = get_user_model().objects.create_user("first-timer", "", "pw-" + "f" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=user)
    browser = Client()
    first = browser.post("/accounts/login/", {"login": "first-timer", "password": "pw-" + "f" * 12})
    assert first.status_code == 302 and first["Location"] == "/onboarding/?next=%2F"
    chosen = browser.post(first["Location"], {"action": "choose", "project": str(acme.project.public_id)})
    assert chosen.status_code == 302 and chosen["Location"] == "/"
    browser.post("/accounts/logout/")
    second = Client()
    again = second.post("/accounts/login/", {"login": "first-timer", "password": "pw-" + "f" * 12})
    assert again.status_code == 302 and again["Location"] == "/"
    # A next address off this site is not followed.
    evil = second.post(
        "/onboarding/?next=https://evil.example/", {"action": "choose", "project": str(acme.project.public_id)}
    )
    assert evil["Location"] == "/"


def test_the_sso_page_lists_the_organizations_own_providers_without_their_secrets(acme, make_tenant):
    from kbportal.sso import sso_provider_create

    other = make_tenant("pplsso")
    for tenant, provider_id, domain in ((acme, "ppl-acme-idp", "acme-ppl.test"), (other, "ppl-other-idp", "o.test")):
        sso_provider_create(
            tenant_id=tenant.tenant.pk,
            name=f"{provider_id} name",
            provider_id=provider_id,
            server_url="https://idp.example.test",
            client_id="cid",
            secret=f"{provider_id}-SECRET",
            domains=[domain],
        )
    page = _client(acme.admin).get("/manage/sso/").content.decode()
    assert 'data-provider="ppl-acme-idp"' in page and "acme-ppl.test" in page
    assert "SECRET" not in page and "ppl-other-idp" not in page
    assert _client(_member(acme, "plain-sso")).get("/manage/sso/").status_code == 404


def test_the_operator_creates_an_organization_whose_invited_owner_runs_it_from_manage():
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("tenant", "add", "--name", "Globex Two", "--owner-email", "Boss@Globex.test", stdout=out)
    link = re.search(r"http://127\.0\.0\.1:8000(/invite/\S+/)", out.getvalue()).group(1)
    assert [m.to for m in mail.outbox] == [["boss@globex.test"]]
    owner = Client()
    joined = owner.post(
        link, {"username": "globex-boss", "password1": "Long-enough-pass-42", "password2": "Long-enough-pass-42"}
    )
    assert joined.status_code == 302
    assert owner.get("/manage/people/").status_code == 200
    from projects.models import Tenant

    tenant = Tenant.objects.get(slug="globex-two")
    with tenant_context(tenant.pk):
        assert Membership.objects.get(user__username="globex-boss").role == "owner"
    [invite] = _events(tenant.pk, "member.invite")
    assert invite.actor_id is None and invite.data["by"] == "operator"


@pytest.mark.parametrize(
    "args, message",
    [(["--slug", "../escape"], "--slug lower-case"), (["--owner-email", "not an address"], "--owner-email")],
)
def test_tenant_add_refuses_bad_input_and_leaves_nothing_behind(args, message):
    from django.core.management import CommandError, call_command

    from projects.models import Tenant

    base = {"--name": "Half Made", "--owner-email": "boss@half.test"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    with pytest.raises(CommandError, match=message):
        call_command("tenant", "add", *[x for kv in base.items() for x in kv])
    assert not Tenant.objects.filter(name="Half Made").exists()


def test_the_invitation_page_keeps_its_token_on_the_site_without_breaking_its_form(acme):
    link = _invite(_client(acme.admin), "origin@example.test")
    page = Client(enforce_csrf_checks=True).get(link)
    # "same-origin": the browser sends a real Origin with the form (no-referrer sent "null", which
    # CSRF protection refused); the token still never leaves in a Referer.
    assert page["Referrer-Policy"] == "same-origin" and 'name="csrfmiddlewaretoken"' in page.content.decode()


def test_the_projects_page_preselects_the_users_current_default(acme):
    from projects.services import project_create

    handbook = project_create(tenant_id=acme.tenant.pk, name="A Handbook")  # sorts before "Everything"
    user = get_user_model().objects.create_user("chooser", "", "pw-" + "c" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=acme.tenant.pk, project_id=acme.project.pk)
    browser = Client()
    browser.force_login(user)
    page = browser.get("/onboarding/").content.decode()
    checked = re.findall(r'<input type="radio" name="project" value="([^"]+)" checked', page)
    assert checked == [str(acme.project.public_id)] and "(your default now)" in page
    assert str(handbook.public_id) in page  # listed first, not checked


def test_an_invitation_naming_a_project_makes_it_the_new_members_readable_default(acme, make_tenant):
    from projects.models import Project, ProjectMember
    from projects.services import project_create

    handbook = project_create(tenant_id=acme.tenant.pk, name="Handbook", visibility=Project.Visibility.MEMBERS)
    admin = _client(acme.admin)
    other = make_tenant("pplinvproj")
    forged = admin.post(
        PEOPLE, {"action": "invite", "email": "x@example.test", "role": "member", "project": str(other.project.pk)}
    )
    assert "the link was mailed" not in forged.content.decode()  # another organization's project: refused
    sent = len(mail.outbox)
    page = admin.post(
        PEOPLE,
        {"action": "invite", "email": "reader@example.test", "role": "member", "project": str(handbook.pk)},
        follow=True,
    )
    assert "the link was mailed" in page.content.decode() and len(mail.outbox) == sent + 1
    assert "Handbook" in admin.get(PEOPLE).content.decode()  # the pending invitation names it
    assert "in the project Handbook" in mail.outbox[-1].body  # so does the mail
    link = re.search(r"http://testserver(/invite/\S+/)", mail.outbox[-1].body).group(1)
    visitor = Client()
    visitor.post(link, {"username": "reader", "password1": "Long-enough-pass-42", "password2": "Long-enough-pass-42"})
    user = get_user_model().objects.get(username="reader")
    with tenant_context(acme.tenant.pk):
        assert ProjectMember.objects.get(user=user, project=handbook).role == "viewer"
    assert user.kb_profile.default_project_id == handbook.pk
