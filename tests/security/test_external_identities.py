"""External identities and groups: restricted rows reach exactly the people they name.

A private Slack channel's rows carry ``slack:<user id>`` principals and a Confluence page
restricted to a group carries ``group:<name>``; a portal user holds those only through an email
address verified on the portal side that the source reports for the identity, or through the
members of a group the source lists. Each test tries a way in that must stay closed: a
non-member, an unverified address, the same address in another organization, a principal two
sources disagree about, a group whose members cannot be read, and removal at the next sync.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.test import Client

from kbportal.tenancy import tenant_context
from projects.services import membership_create, profile_set_default_project
from search.retrieval import hybrid_search
from sources.models import Document, ExternalGroup, ExternalIdentity
from sources.selectors import DocumentNotFound, document_get_for_user, scope_for_user, user_principals
from sources.services import source_create, source_ingest
from tests.sources.confluence_server import EMAIL, TOKEN, ConfluenceWorld, FakeConfluence, _page, person, storage
from tests.sources.slack_server import BOT_TOKEN, FakeSlack, SlackWorld

pytestmark = pytest.mark.django_db

SECRET = "The offsite budget code is WALRUS-7731, approved for the March planning week."
PUBLIC = "Lunch is at noon in the big room on Thursdays."
PAT, RAY, QUINN = "U0PAT0001", "U0RAY0002", "U0QUINN03"


def _export(root: Path, *, members: list[str], emails: dict[str, str] | None = None) -> Path:
    """A Slack export: public #general, private #exec (``members``), users with ``emails``."""
    emails = {PAT: "Pat.Member@acme.test", QUINN: "quinn@acme.test"} if emails is None else emails
    root.mkdir(parents=True, exist_ok=True)
    (root / "channels.json").write_text(json.dumps([{"id": "C0GENERAL", "name": "general", "members": []}]))
    (root / "groups.json").write_text(json.dumps([{"id": "G0EXEC001", "name": "exec", "members": members}]))
    users = [
        {"id": uid, "name": uid.lower(), "profile": {"real_name": f"User {uid}", **({"email": e} if e else {})}}
        for uid, e in {PAT: "", RAY: "", QUINN: "", **emails}.items()
    ]
    (root / "users.json").write_text(json.dumps(users))
    for channel, text, user in (("exec", SECRET, PAT), ("general", PUBLIC, QUINN)):
        (root / channel).mkdir(exist_ok=True)
        day = [{"type": "message", "user": user, "text": text, "ts": "1704880800.000100"}]
        (root / channel / "2024-01-10.json").write_text(json.dumps(day))
    return root


def _person(tenant, username: str, email: str, *, verified: bool = True):
    user = get_user_model().objects.create_user(username, "", "pw-" + username * 2)
    membership_create(tenant_id=tenant.tenant.pk, user=user)
    profile_set_default_project(user=user, tenant_id=tenant.tenant.pk, project_id=tenant.project.pk)
    EmailAddress.objects.create(user=user, email=email, verified=verified, primary=True)
    return user


def _slack_source(tenant, path: Path, name: str = "Slack") -> int:
    source = source_create(
        tenant_id=tenant.tenant.pk,
        kind="slack_export",
        name=name,
        config={"path": str(path)},
        project_ids=[tenant.project.pk],
    )
    assert source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk).status == "succeeded"
    return source.pk


def _reads(user, text: str, query: str) -> bool:
    """Does a search as ``user`` return a row holding ``text``?"""
    hits = hybrid_search(query, scope_for_user(user), limit=10, expand=False).hits
    return any(text in hit.content for hit in hits)


@pytest.fixture
def acme(make_tenant):
    return make_tenant("idacme")


@pytest.fixture
def slack(acme, tmp_path):
    path = _export(tmp_path / "export", members=[PAT, RAY])
    return path, _slack_source(acme, path)


def test_a_private_channel_reaches_its_member_through_a_verified_email_and_nobody_else(acme, slack, make_tenant):
    path, source_id = slack
    pat = _person(acme, "pat", "pat.member@ACME.test")  # case differs from the export's address
    quinn = _person(acme, "quinn", "quinn@acme.test")  # in the workspace, not in the channel
    mallory = _person(acme, "mallory", "pat.member@acme.test", verified=False)  # claims Pat's address
    ray = _person(acme, "ray", "ray@acme.test")  # a member with no email in the export: cannot be linked
    assert f"slack:{PAT}" in user_principals(pat)
    assert _reads(pat, SECRET, "offsite budget code WALRUS-7731")
    for outsider in (quinn, mallory, ray):
        assert f"slack:{PAT}" not in user_principals(outsider)
        assert not _reads(outsider, SECRET, "offsite budget code WALRUS-7731"), outsider.username
        assert _reads(outsider, PUBLIC, "lunch at noon Thursdays")
    with tenant_context(acme.tenant.pk):
        secret_row = Document.objects.get(
            source_id=source_id, principals__contains=[f"slack:{PAT}"], kind="conversation"
        )
        public_id = str(secret_row.source.public_id)
    assert document_get_for_user(pat, source_public_id=public_id, external_id=secret_row.external_id)
    with pytest.raises(DocumentNotFound):
        document_get_for_user(quinn, source_public_id=public_id, external_id=secret_row.external_id)
    # The same verified address in another organization links to nothing there.
    globex = make_tenant("idglobex")
    twin = _person(globex, "pat-at-globex", "pat.member@acme.test")
    assert user_principals(twin, globex.tenant.pk) == ("email:pat.member@acme.test", f"user:{twin.pk}")


def test_removal_from_the_channel_closes_it_at_the_next_sync(acme, slack):
    path, source_id = slack
    pat = _person(acme, "pat", "pat.member@acme.test")
    assert _reads(pat, SECRET, "offsite budget code WALRUS-7731")
    _export(path, members=[RAY])
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == "succeeded"
    assert not _reads(pat, SECRET, "offsite budget code WALRUS-7731")
    # Gone from the workspace's users too: the identity itself is dropped at the sync.
    _export(path, members=[RAY], emails={QUINN: "quinn@acme.test"})
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == "succeeded"
    with tenant_context(acme.tenant.pk):
        stored = dict(ExternalIdentity.objects.filter(source_id=source_id).values_list("principal", "email"))
    assert stored == {f"slack:{PAT}": "", f"slack:{RAY}": "", f"slack:{QUINN}": "quinn@acme.test"}


def test_a_principal_two_sources_disagree_about_links_to_nobody(acme, slack, tmp_path):
    pat = _person(acme, "pat", "pat.member@acme.test")
    assert _reads(pat, SECRET, "offsite budget code WALRUS-7731")
    # A second workspace export where the same user id reports someone else's address.
    other = _export(tmp_path / "other", members=[QUINN], emails={PAT: "eve@elsewhere.test"})
    _slack_source(acme, other, name="Other Slack")
    assert f"slack:{PAT}" not in user_principals(pat)
    assert not _reads(pat, SECRET, "offsite budget code WALRUS-7731")
    eve = _person(acme, "eve", "eve@elsewhere.test")
    assert f"slack:{PAT}" not in user_principals(eve)
    assert not _reads(eve, SECRET, "offsite budget code WALRUS-7731")


# ---------- Slack user groups (live Web API) ---------------------------------------------------------


def test_a_slack_user_group_is_held_by_its_linked_members_only_and_follows_the_next_sync(acme):
    world = SlackWorld(
        channels={"C0GENERAL": "general"},
        users={
            PAT: {"real_name": "Pat", "email": "pat.member@acme.test"},
            QUINN: {"real_name": "Quinn"},
            RAY: {"real_name": "Ray", "email": "ray@acme.test"},
        },
        usergroups=[
            {"id": "S0ONCALL", "handle": "oncall", "name": "On-call", "users": [PAT, QUINN]},
            {"id": "S0RETIRED", "handle": "old", "name": "Old", "users": [RAY], "date_delete": 1704880800},
        ],
    )
    world.apply({"type": "message", "channel": "C0GENERAL", "user": PAT, "text": PUBLIC, "ts": "1704880800.000100"})
    server = FakeSlack(world)
    try:
        config = {
            "token": BOT_TOKEN,
            "base_url": server.base_url,
            "channels": ["C0GENERAL"],
            "allow_private_network": True,
        }
        source = source_create(
            tenant_id=acme.tenant.pk, kind="slack", name="Live Slack", config=config, project_ids=[acme.project.pk]
        )
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
        with tenant_context(acme.tenant.pk):
            groups = dict(ExternalGroup.objects.filter(source=source).values_list("principal", "members"))
        assert groups == {"slack-group:S0ONCALL": [f"slack:{PAT}", f"slack:{QUINN}"]}  # the disabled one is left out
        pat = _person(acme, "pat", "pat.member@acme.test")
        ray = _person(acme, "ray", "ray@acme.test")  # linked, but only in the disabled group
        mallory = _person(acme, "mallory", "pat.member@acme.test", verified=False)
        assert "slack-group:S0ONCALL" in user_principals(pat)
        assert all("slack-group:S0ONCALL" not in user_principals(u) for u in (ray, mallory))
        assert "slack-group:S0RETIRED" not in user_principals(ray)

        # Pat leaves the group: gone at the next sync. A token without usergroups:read knows no group.
        world.usergroups = [{"id": "S0ONCALL", "handle": "oncall", "name": "On-call", "users": [QUINN]}]
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
        assert "slack-group:S0ONCALL" not in user_principals(pat)
        world.usergroups = [{"id": "S0ONCALL", "handle": "oncall", "name": "On-call", "users": [PAT]}]
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
        assert "slack-group:S0ONCALL" in user_principals(pat)
        world.usergroups = None
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
        assert "slack-group:S0ONCALL" not in user_principals(pat)
    finally:
        server.close()


# ---------- Confluence groups ------------------------------------------------------------------------

PLAN = "The finance plan reserves budget line HERON-5521 for the datacenter move."


def _wiki() -> ConfluenceWorld:
    world = ConfluenceWorld()
    meta = {
        "version": {"by": person("Space Admin"), "when": "2024-03-01T09:00:00.000Z", "number": 1},
        "history": {"latest": True, "createdBy": person("Space Admin"), "createdDate": "2024-03-01T09:00:00.000Z"},
        "metadata": {"labels": {"results": [], "start": 0, "limit": 200, "size": 0}},
    }
    world.pages["100"] = _page("100", "Finance Home", "FIN", "Finance", storage("Welcome to finance."), **meta)
    world.pages["200"] = _page("200", "Finance plan", "FIN", "Finance", storage(f"# Plan\n\n{PLAN}\n"), **meta)
    world.parents["200"] = "100"
    world.restrict("200", [], ["finance-leads"])
    # More members than one answer holds (the fake caps pages at 25): the connector must page.
    world.groups["finance-leads"] = ["Gail Group", *(f"Filler Person {n}" for n in range(30))]
    return world


@pytest.fixture
def wiki():
    server = FakeConfluence(_wiki())
    yield server
    server.close()


def _confluence(tenant, server: FakeConfluence, name: str = "Wiki") -> int:
    config: dict[str, Any] = {
        "base_url": server.base_url,
        "email": EMAIL,
        "token": TOKEN,
        "page_size": 10,
        "allow_private_network": True,
    }
    return source_create(
        tenant_id=tenant.tenant.pk, kind="confluence", name=name, config=config, project_ids=[tenant.project.pk]
    ).pk


def test_a_group_restricted_page_reaches_the_groups_members_only(acme, wiki):
    source_id = _confluence(acme, wiki)
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == "succeeded"
    gail = _person(acme, "gail", "gail.group@erb.example")  # the address the site shows for Gail
    wei = _person(acme, "wei", "wei.chen@erb.example")
    assert "group:finance-leads" in user_principals(gail)
    assert _reads(gail, PLAN, "finance plan budget line HERON-5521")
    assert not _reads(wei, PLAN, "finance plan budget line HERON-5521")
    with tenant_context(acme.tenant.pk):
        group = ExternalGroup.objects.get(source_id=source_id, principal="group:finance-leads")
    assert len(group.members) == 31 and "email:gail.group@erb.example" in group.members

    # Gail leaves the group: at the next sync she no longer reads the page.
    wiki.world.groups["finance-leads"] = ["Wei Chen"]
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == "succeeded"
    assert not _reads(gail, PLAN, "finance plan budget line HERON-5521")
    assert _reads(wei, PLAN, "finance plan budget line HERON-5521")


def test_a_group_whose_members_cannot_be_read_admits_nobody_and_the_run_says_so(acme, wiki):
    source_id = _confluence(acme, wiki)
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source_id).status == "succeeded"
    gail = _person(acme, "gail", "gail.group@erb.example")
    assert _reads(gail, PLAN, "finance plan budget line HERON-5521")
    del wiki.world.groups["finance-leads"]  # the site no longer answers for the group (404)
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source_id)
    assert run.status == "partial"
    assert [item["item"] for item in run.skipped_items] == ["group:finance-leads"]
    assert "nobody is taken to be in it" in run.skipped_items[0]["reason"]
    assert not _reads(gail, PLAN, "finance plan budget line HERON-5521")


def test_a_group_name_two_sources_expose_admits_only_members_of_both(acme, wiki):
    first = _confluence(acme, wiki)
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=first).status == "succeeded"
    other_world = _wiki()
    other_world.groups["finance-leads"] = ["Wei Chen"]
    other = FakeConfluence(other_world)
    try:
        second = _confluence(acme, other, name="Other wiki")
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=second).status == "succeeded"
    finally:
        other.close()
    gail = _person(acme, "gail", "gail.group@erb.example")
    wei = _person(acme, "wei", "wei.chen@erb.example")
    assert "group:finance-leads" not in user_principals(gail)
    assert "group:finance-leads" not in user_principals(wei)


# ---------- the organization's identity list ----------------------------------------------------------


def test_identity_list_is_for_the_organizations_admins_and_shows_only_its_own(acme, slack, make_tenant):
    pat = _person(acme, "pat", "pat.member@acme.test")
    globex = make_tenant("idglobex")
    page = "/manage/identities/"

    admin = Client()
    admin.force_login(acme.admin)
    body = admin.get(page).content.decode()
    assert f'data-principal="slack:{PAT}"' in body and pat.get_username() in body
    assert f'data-principal="slack:{RAY}"' in body and "the source shows no email for this person" in body
    assert "no member of the organization has verified this email" in body  # Quinn has no account

    member = Client()
    member.force_login(pat)
    assert member.get(page).status_code == 404
    outsider = Client()
    outsider.force_login(globex.admin)
    other = outsider.get(page)
    assert other.status_code == 200 and PAT not in other.content.decode() and "WALRUS" not in other.content.decode()
    anonymous = Client().get(page)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_git_authors_are_listed_and_link_only_through_a_verified_address(acme, tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for author, email, name in (("Ada Author", "Ada@Acme.test", "a.py"), ("Bo Builder", "bo@acme.test", "b.py")):
        (repo / name).write_text(f"def {name[0]}():\n    return 1\n")
        subprocess.run(["git", "-C", str(repo), "add", name], check=True)
        env = {
            "GIT_AUTHOR_NAME": author,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": author,
            "GIT_COMMITTER_EMAIL": email,
            "HOME": str(tmp_path),
            "PATH": "/usr/bin:/bin",
        }
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"add {name}"], check=True, env=env)
    source = source_create(
        tenant_id=acme.tenant.pk, kind="git", name="Repo", config={"path": str(repo)}, project_ids=[acme.project.pk]
    )
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
    _person(acme, "ada", "ada@acme.test")
    _person(acme, "bo", "bo@acme.test", verified=False)
    admin = Client()
    admin.force_login(acme.admin)
    body = admin.get("/manage/identities/").content.decode()
    ada_row = body.split('data-principal="email:ada@acme.test"', 1)[1].split("</tr>", 1)[0]
    bo_row = body.split('data-principal="email:bo@acme.test"', 1)[1].split("</tr>", 1)[0]
    assert ">ada<" in ada_row and "Ada Author" in ada_row
    assert "unlinked: no member of the organization has verified this email" in bo_row


def test_a_group_one_source_cannot_read_stays_closed_whatever_another_source_lists(acme):
    """Wiki A restricts its page to a group whose members it cannot read; wiki B lists Wei in a
    group of the same name. B's list does not open A's page."""
    a_world, b_world = _wiki(), _wiki()
    del a_world.groups["finance-leads"]
    b_world.groups["finance-leads"] = ["Wei Chen"]
    a, b = FakeConfluence(a_world), FakeConfluence(b_world)
    try:
        a_id = _confluence(acme, a, name="Wiki A")
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=a_id).status == "partial"
        b_id = _confluence(acme, b, name="Wiki B")
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=b_id).status == "succeeded"
    finally:
        a.close()
        b.close()
    wei = _person(acme, "wei", "wei.chen@erb.example")
    assert "group:finance-leads" not in user_principals(wei)
    assert not _reads(wei, PLAN, "finance plan budget line HERON-5521")


def test_an_identity_a_source_shows_no_email_for_is_not_claimed_through_another_source(acme, tmp_path):
    """Export A (no profile emails) has Pat in #exec; export B names Pat's user id with Eve's address."""
    _slack_source(acme, _export(tmp_path / "a", members=[PAT], emails={}), name="Slack A")
    _slack_source(acme, _export(tmp_path / "b", members=[QUINN], emails={PAT: "eve@elsewhere.test"}), name="Slack B")
    eve = _person(acme, "eve", "eve@elsewhere.test")
    assert f"slack:{PAT}" not in user_principals(eve)
    assert not _reads(eve, SECRET, "offsite budget code WALRUS-7731")


def test_a_lookalike_address_does_not_fold_into_the_identitys(acme, tmp_path):
    """U+212A KELVIN SIGN lower-cases to ASCII k in Python: a different mailbox, never a match."""
    _slack_source(acme, _export(tmp_path / "k", members=[PAT], emails={PAT: "kim@acme.test"}), name="Slack K")
    kelvin = _person(acme, "kelvin", "\u212aim@acme.test")
    assert f"slack:{PAT}" not in user_principals(kelvin)
    assert not _reads(kelvin, SECRET, "offsite budget code WALRUS-7731")
    kim = _person(acme, "kim", "KIM@acme.test")
    assert f"slack:{PAT}" in user_principals(kim)


def test_the_identity_list_agrees_with_who_holds_the_principal(acme, tmp_path):
    from sources.selectors import identity_list

    _slack_source(acme, _export(tmp_path / "p1", members=[PAT], emails={PAT: "pat@acme.test"}), name="Slack P1")
    _slack_source(acme, _export(tmp_path / "p2", members=[PAT], emails={PAT: "pat@home.test"}), name="Slack P2")
    pat = _person(acme, "pat", "pat@acme.test")
    EmailAddress.objects.create(user=pat, email="pat@home.test", verified=True)
    assert f"slack:{PAT}" in user_principals(pat)
    rows, _ = identity_list(tenant_id=acme.tenant.pk)
    assert {(r.source_name, r.linked_to) for r in rows if r.identity.principal == f"slack:{PAT}"} == {
        ("Slack P1", "pat"),
        ("Slack P2", "pat"),
    }
