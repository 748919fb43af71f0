"""Single sign-on end to end: a real OpenID provider (the certified `oidc-provider` npm package,
tests/oidc/server.js) on loopback, the portal on a live server thread, and a plain HTTP client
driving the authorization code flow with PKCE through both, as a browser would.

Two tenants (sso-acme with domain acme.sso.test, sso-globex with globex.sso.test), each with its
own provider app; a third app ("stray") is bound to no tenant. The data is committed (the live
server's thread has its own database connection), with unique slugs and emails; each test signs
in a different person so the tests do not depend on their order.

Why not pytest-django's ``live_server``: it forces ``transactional_db``, whose teardown flushes
every table with TRUNCATE, which the append-only audit log refuses by design.
"""

from __future__ import annotations

import io
import os
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.test.testcases import LiveServerThread

OIDC_DIR = Path(__file__).resolve().parent.parent / "oidc"
CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}
ACME_MARKER = "pangolin expense workflow"
GLOBEX_MARKER = "quokka merger dossier"
ACME_DOMAIN, GLOBEX_DOMAIN = "acme.sso.test", "globex.sso.test"
ONBOARDING = "/onboarding/?next=%2F"  # where a login lands until the person has chosen a default project

# The provider's people: accountId -> claims. email_verified is what the provider asserts.
ACCOUNTS = {
    "alice": {"email": f"alice@{ACME_DOMAIN}", "email_verified": True, "name": "Alice Acme"},
    "bob": {"email": f"bob@{ACME_DOMAIN}", "email_verified": False, "name": "Bob Unverified"},
    "carol": {"email": f"carol@{GLOBEX_DOMAIN}", "email_verified": True, "name": "Carol Globex"},
    "dave": {"email": f"dave@{ACME_DOMAIN}", "email_verified": True, "name": "Dave Existing"},
    "frank": {"email": f"frank@{ACME_DOMAIN}", "email_verified": True, "name": "Frank Logout"},
    "gina": {"email": f"gina@{ACME_DOMAIN}", "email_verified": True, "name": "Gina Reader"},
    "hank": {"email": f"hank@{GLOBEX_DOMAIN}", "email_verified": True, "name": "Hank Globex"},
    "ivy": {"email": f"ivy@{ACME_DOMAIN}", "email_verified": True, "name": "Ivy Stray"},
    "kim": {"email": f"kim@{GLOBEX_DOMAIN}", "email_verified": True, "name": "Kim Globex"},
    "olga": {"email": f"olga@{ACME_DOMAIN}", "email_verified": True, "name": "Olga Operator"},
    "mallory": {"email": "mallory@nowhere.test", "email_verified": True, "name": "Mallory"},
    "pia": {"email": f"pia@{ACME_DOMAIN}", "email_verified": True, "name": "Pia Private"},
    "quentin": {"email": f"quentin@{ACME_DOMAIN}", "email_verified": True, "name": "Quentin Outside"},
}


# ---------- the provider: npm ci (when missing) and node server.js ----------------------------------


@pytest.fixture(scope="session")
def oidc_node_modules() -> Path:
    """tests/oidc/node_modules, installed with ``npm ci`` from the committed lock file if missing."""
    marker = OIDC_DIR / "node_modules" / "oidc-provider" / "package.json"
    if marker.exists():
        return OIDC_DIR / "node_modules"
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail(
            "The SSO tests run a real OpenID provider on Node.js (>= 20.19): install node and npm "
            "(Debian: apt-get install nodejs npm), then re-run; tests/oidc/node_modules is installed "
            "by `npm ci` from the npm registry on first use."
        )
    result = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=OIDC_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0 or not marker.exists():
        pytest.fail(
            f"`npm ci` in {OIDC_DIR} failed (exit {result.returncode}), so the test OpenID provider "
            "(oidc-provider, pinned in tests/oidc/package-lock.json) is not installed. It needs the npm "
            f"registry to be reachable. npm said:\n{(result.stderr or result.stdout)[-3000:]}"
        )
    return OIDC_DIR / "node_modules"


@dataclass
class Provider:
    issuer: str
    process: subprocess.Popen
    log: Path


def _start_provider(tmp_path: Path, clients: list[dict]) -> Provider:
    import json

    log = tmp_path / "oidc-provider.log"
    env = {
        **os.environ,
        "KB_OIDC_CLIENTS": json.dumps(clients),
        "KB_OIDC_ACCOUNTS": json.dumps(ACCOUNTS),
        "KB_OIDC_HOST": "127.0.0.1",
    }
    with open(log, "wb") as err:
        process = subprocess.Popen(["node", "server.js"], cwd=OIDC_DIR, env=env, stdout=subprocess.PIPE, stderr=err)
    deadline = time.monotonic() + 30
    line = b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(process.stdout.fileno(), 1024)
            if not chunk:
                break
            line += chunk
    match = re.match(rb"listening (http://\S+)", line)
    if match is None:
        process.kill()
        pytest.fail(f"the test OpenID provider did not start: {line!r}\n{log.read_text()[-3000:]}")
    issuer = match.group(1).decode()
    for _ in range(100):
        try:
            if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                return Provider(issuer=issuer, process=process, log=log)
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"{issuer}/.well-known/openid-configuration never answered 200\n{log.read_text()[-3000:]}")


# ---------- the world: portal, provider, tenants, apps, documents -----------------------------------


@dataclass
class World:
    portal: str
    issuer: str
    acme: object  # OnboardedTenant
    globex: object
    acme_later_project: object
    dave: object


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, oidc_node_modules, tmp_path_factory):
    from allauth.socialaccount.models import SocialApp

    from kbportal.sso import sso_provider_create
    from projects.services import project_create, tenant_onboard
    from sources.services import source_create, source_ingest

    with django_db_blocker.unblock():
        server = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
        server.daemon = True
        server.start()
        server.is_ready.wait()
        if server.error:
            raise server.error
        portal = f"http://127.0.0.1:{server.port}"

        def client(client_id: str, provider_id: str, auth_method: str) -> dict:
            return {
                "client_id": client_id,
                "client_secret": f"{client_id}-secret",
                "redirect_uris": [f"{portal}/accounts/oidc/{provider_id}/login/callback/"],
                "post_logout_redirect_uris": [f"{portal}/"],
                "response_types": ["code"],
                "grant_types": ["authorization_code"],
                "token_endpoint_auth_method": auth_method,
            }

        clients = [
            client("acme-client", "acme-idp", "client_secret_post"),
            client("globex-client", "globex-idp", "client_secret_basic"),
            client("stray-client", "stray-idp", "client_secret_post"),
        ]
        provider = _start_provider(tmp_path_factory.mktemp("oidc"), clients)
        try:
            acme = tenant_onboard(
                name="SSO Acme", slug="sso-acme", admin_username="sso-acme-admin", admin_password="pw-" + "a" * 12
            )
            globex = tenant_onboard(
                name="SSO Globex", slug="sso-globex", admin_username="sso-globex-admin", admin_password="pw-" + "g" * 12
            )
            # Newer but first by name: the default project of a JIT member is the oldest one.
            later = project_create(tenant_id=acme.tenant.pk, name="Aardvark (newer)")
            dave = get_user_model().objects.create_user("dave-local", ACCOUNTS["dave"]["email"], "pw-" + "d" * 12)
            with override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
                for onboarded, marker in ((acme, ACME_MARKER), (globex, GLOBEX_MARKER)):
                    source = source_create(
                        tenant_id=onboarded.tenant.pk,
                        kind="test_rows",
                        name=f"{onboarded.tenant.slug} wiki",
                        config={
                            "rows": [
                                {
                                    "external_id": "handbook#1",
                                    "kind": "doc_section",
                                    "path": "handbook.md",
                                    "title": f"{onboarded.tenant.name} handbook",
                                    "content": f"The {marker} is described in the {onboarded.tenant.name} handbook.",
                                }
                            ]
                        },
                        project_ids=[onboarded.project.pk],
                    )
                    assert source_ingest(tenant_id=onboarded.tenant.pk, source_id=source.pk).status == "succeeded"
            sso_provider_create(
                tenant_id=acme.tenant.pk,
                name="Acme IdP",
                provider_id="acme-idp",
                server_url=provider.issuer,
                client_id="acme-client",
                secret="acme-client-secret",
                domains=[ACME_DOMAIN],
                token_auth_method="client_secret_post",
                logout_at_provider=True,
            )
            sso_provider_create(
                tenant_id=globex.tenant.pk,
                name="Globex IdP",
                provider_id="globex-idp",
                server_url=provider.issuer,
                client_id="globex-client",
                secret="globex-client-secret",
                domains=[GLOBEX_DOMAIN],
                token_auth_method="client_secret_basic",
            )
            SocialApp.objects.create(
                provider="openid_connect",
                provider_id="stray-idp",
                name="Stray IdP",
                client_id="stray-client",
                secret="stray-client-secret",
                settings={"server_url": provider.issuer},
            )
            yield World(
                portal=portal, issuer=provider.issuer, acme=acme, globex=globex, acme_later_project=later, dave=dave
            )
        finally:
            provider.process.terminate()
            try:
                provider.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                provider.process.kill()
            server.terminate()
            server.join(timeout=10)


@pytest.fixture(autouse=True)
def _db_access(django_db_blocker):
    # The live server's thread and these tests use real, committed transactions.
    with django_db_blocker.unblock():
        yield


# ---------- the browser: plain HTTP through portal and provider ------------------------------------

_CSRF_RE = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def _csrf(html: str) -> str:
    match = _CSRF_RE.search(html)
    assert match, "no CSRF token on the page"
    return match.group(1)


def sso_login(world: World, provider_id: str, login: str, session: requests.Session | None = None):
    """Sign in through ``provider_id`` as provider account ``login``; returns (session, final
    response, the authorization request's query parameters)."""
    session = session or requests.Session()
    page = session.get(f"{world.portal}/accounts/login/", timeout=10)
    assert page.status_code == 200
    start = session.post(
        f"{world.portal}/accounts/oidc/{provider_id}/login/",
        data={"csrfmiddlewaretoken": _csrf(page.text), "process": "login"},
        allow_redirects=False,
        timeout=10,
    )
    assert start.status_code == 302, start.text[:500]
    authorize = start.headers["Location"]
    assert authorize.startswith(f"{world.issuer}/auth?")
    params = {k: v[0] for k, v in parse_qs(urlsplit(authorize).query).items()}
    interaction = session.get(authorize, timeout=10)
    assert interaction.status_code == 200 and "/interaction/" in interaction.url, interaction.text[:500]
    final = session.post(interaction.url, data={"login": login}, timeout=30)
    return session, final, params


def _events(action: str, **filters):
    from kbportal.models import AuditEvent

    return list(AuditEvent.all_tenants.using("owner").filter(action=action, **filters).order_by("id"))


def _membership(tenant_id: int, user_id: int):
    from kbportal.tenancy import tenant_context
    from projects.models import Membership

    with tenant_context(tenant_id):
        return Membership.objects.filter(user_id=user_id).first()


def _users_with_email(email: str) -> list:
    return list(get_user_model().objects.filter(email__iexact=email))


# ---------- tests --------------------------------------------------------------------------------


def test_login_page_lists_tenant_providers_next_to_password_login(world):
    page = requests.get(f"{world.portal}/accounts/login/", timeout=10)
    assert page.status_code == 200
    assert 'name="login"' in page.text and 'name="password"' in page.text
    assert "Sign in with Acme IdP" in page.text and "Sign in with Globex IdP" in page.text
    assert 'action="/accounts/oidc/acme-idp/login/?process=login"' in page.text
    assert "Stray IdP" not in page.text  # bound to no tenant


def test_first_login_creates_member_with_default_project_and_second_login_reuses_user(world):
    session, final, params = sso_login(world, "acme-idp", "alice")
    assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) >= 43  # PKCE
    assert params["client_id"] == "acme-client" and params["response_type"] == "code"
    # A first login leads to onboarding: choose the default project (the one given is preselected).
    assert final.status_code == 200 and final.url == f"{world.portal}{ONBOARDING}", final.text[:500]
    assert "Your default project" in final.text

    [alice] = _users_with_email(ACCOUNTS["alice"]["email"])
    membership = _membership(world.acme.tenant.pk, alice.pk)
    assert membership is not None and membership.role == "member"
    assert _membership(world.globex.tenant.pk, alice.pk) is None
    alice.kb_profile.refresh_from_db()
    assert alice.kb_profile.tenant_id == world.acme.tenant.pk
    assert alice.kb_profile.default_project_id == world.acme.project.pk  # the oldest, not "Aardvark"
    assert alice.socialaccount_set.get().provider == "acme-idp"
    assert not alice.has_usable_password()
    # The session is alice's: the search page answers in her tenant's project.
    search = session.get(f"{world.portal}/search/", params={"q": ACME_MARKER}, timeout=60)
    assert search.status_code == 200 and alice.username in search.text and "handbook" in search.text

    [join] = _events("sso.join", actor_id=alice.pk)
    assert join.tenant_id == world.acme.tenant.pk
    assert join.data == {"provider": "acme-idp", "email": ACCOUNTS["alice"]["email"], "role": "member"}
    [login] = _events("login", actor_id=alice.pk)
    assert login.tenant_id == world.acme.tenant.pk

    chosen = session.post(
        final.url,
        data={
            "csrfmiddlewaretoken": _csrf(final.text),
            "action": "choose",
            "project": str(world.acme.project.public_id),
        },
        timeout=30,
    )
    assert chosen.status_code == 200 and chosen.url == f"{world.portal}/"

    # Second login, fresh browser: the same user, no second join, a second login event; onboarded.
    _, again, _ = sso_login(world, "acme-idp", "alice")
    assert again.status_code == 200 and again.url == f"{world.portal}/"
    assert [u.pk for u in _users_with_email(ACCOUNTS["alice"]["email"])] == [alice.pk]
    assert len(_events("sso.join", actor_id=alice.pk)) == 1
    assert [e.tenant_id for e in _events("login", actor_id=alice.pk)] == [world.acme.tenant.pk] * 2


def _assert_refused(world, final, *, reason: str, email: str, tenant_id, text: str, domain_tenant=None):
    assert final.status_code == 403, final.text[:500]
    assert f'data-reason="{reason}"' in final.text and text in final.text
    assert _users_with_email(email) == []
    from allauth.socialaccount.models import SocialAccount

    assert not SocialAccount.objects.filter(extra_data__userinfo__email=email).exists()
    [event] = _events("login.refused", data__email=email)
    assert event.tenant_id == tenant_id and event.actor_id is None
    assert event.data["reason"] == reason and event.data["domain_tenant"] == domain_tenant
    assert _events("login", actor_username__iexact=email.split("@")[0]) == []


def test_email_of_no_tenants_domain_is_refused_and_nothing_created(world):
    session, final, _ = sso_login(world, "acme-idp", "mallory")
    _assert_refused(
        world,
        final,
        reason="domain_not_allowed",
        email="mallory@nowhere.test",
        tenant_id=world.acme.tenant.pk,
        text="nowhere.test is not an email domain",
    )
    assert (
        "sessionid" not in session.cookies
        or session.get(f"{world.portal}/search/", allow_redirects=False, timeout=10).status_code == 302
    )


def test_unverified_email_is_refused(world):
    _, final, _ = sso_login(world, "acme-idp", "bob")
    _assert_refused(
        world,
        final,
        reason="email_unverified",
        email=ACCOUNTS["bob"]["email"],
        tenant_id=world.acme.tenant.pk,
        text="has not verified your email address",
    )


def test_email_of_another_tenants_domain_through_this_tenants_provider_is_refused(world):
    _, final, _ = sso_login(world, "acme-idp", "carol")
    _assert_refused(
        world,
        final,
        reason="domain_not_allowed",
        email=ACCOUNTS["carol"]["email"],
        tenant_id=world.acme.tenant.pk,
        text=f"{GLOBEX_DOMAIN} is not an email domain",
        domain_tenant=world.globex.tenant.pk,
    )
    assert "Globex" not in final.text  # the page does not say which organization owns the domain


def test_provider_bound_to_no_tenant_is_refused(world):
    _, final, params = sso_login(world, "stray-idp", "ivy")
    assert params["client_id"] == "stray-client"
    _assert_refused(
        world,
        final,
        reason="provider_without_tenant",
        email=ACCOUNTS["ivy"]["email"],
        tenant_id=None,
        text="not connected to any organization",
    )


def test_existing_user_with_that_verified_email_is_linked_not_duplicated(world):
    assert _membership(world.acme.tenant.pk, world.dave.pk) is None
    session, final, _ = sso_login(world, "acme-idp", "dave")
    assert final.status_code == 200 and final.url == f"{world.portal}{ONBOARDING}"
    assert [u.pk for u in _users_with_email(ACCOUNTS["dave"]["email"])] == [world.dave.pk]
    world.dave.refresh_from_db()
    assert world.dave.socialaccount_set.get().provider == "acme-idp"
    assert _membership(world.acme.tenant.pk, world.dave.pk).role == "member"
    assert "dave-local" in session.get(f"{world.portal}/search/", timeout=10).text
    # allauth: an email never verified here may have been registered by someone else, so the
    # password that came with it stops working; the provider is now how dave signs in.
    assert not world.dave.has_usable_password()
    assert [e.tenant_id for e in _events("login", actor_id=world.dave.pk)] == [world.acme.tenant.pk]


def test_an_operator_account_is_never_taken_over_by_a_tenants_provider(world):
    from allauth.socialaccount.models import SocialAccount

    olga = get_user_model().objects.create_user(
        "olga-operator", ACCOUNTS["olga"]["email"], "pw-" + "o" * 12, is_staff=True
    )
    _, final, _ = sso_login(world, "acme-idp", "olga")
    assert final.status_code == 403 and 'data-reason="operator_account"' in final.text
    olga.refresh_from_db()
    assert olga.has_usable_password() and olga.check_password("pw-" + "o" * 12)
    assert not SocialAccount.objects.filter(user=olga).exists()
    assert _membership(world.acme.tenant.pk, olga.pk) is None
    [event] = _events("login.refused", data__email=ACCOUNTS["olga"]["email"])
    assert event.tenant_id == world.acme.tenant.pk and event.data["reason"] == "operator_account"


def test_logout_ends_the_session_here_and_at_the_provider(world):
    session, final, _ = sso_login(world, "acme-idp", "frank")
    assert final.status_code == 200
    [frank] = _users_with_email(ACCOUNTS["frank"]["email"])
    assert session.get(f"{world.portal}/search/", allow_redirects=False, timeout=10).status_code == 200
    out = session.post(
        f"{world.portal}/accounts/logout/",
        data={"csrfmiddlewaretoken": _csrf(final.text)},
        allow_redirects=False,
        timeout=10,
    )
    # acme-idp has logout_at_provider: RP-initiated logout at its end_session_endpoint.
    assert out.status_code == 302
    end_session = urlsplit(out.headers["Location"])
    assert f"{end_session.scheme}://{end_session.netloc}" == world.issuer and end_session.path == "/session/end"
    assert parse_qs(end_session.query) == {
        "client_id": ["acme-client"],
        "post_logout_redirect_uri": [f"{world.portal}/"],
    }
    after = session.get(f"{world.portal}/search/", allow_redirects=False, timeout=10)
    assert after.status_code == 302 and after.headers["Location"].startswith("/accounts/login/")
    [logout] = _events("logout", actor_id=frank.pk)
    assert logout.tenant_id == world.acme.tenant.pk

    confirm = session.get(out.headers["Location"], timeout=10)  # the provider asks to confirm
    action = re.search(r'<form id="op.logoutForm" method="post" action="([^"]+)"', confirm.text).group(1)
    xsrf = re.search(r'name="xsrf" value="([^"]+)"', confirm.text).group(1)
    back = session.post(
        f"{world.issuer}{action}" if action.startswith("/") else action,
        data={"xsrf": xsrf, "logout": "yes"},
        timeout=10,
    )
    assert back.url.startswith(f"{world.portal}/accounts/login/")  # back at the portal, signed out
    # The provider's session is gone too: signing in again asks who you are (sso_login posts the form).
    _, again, _ = sso_login(world, "acme-idp", "frank", session=session)
    assert again.status_code == 200 and again.url == f"{world.portal}{ONBOARDING}"


def test_logout_through_a_provider_without_logout_at_provider_stays_on_the_portal(world):
    session, final, _ = sso_login(world, "globex-idp", "kim")
    assert final.status_code == 200 and final.url == f"{world.portal}{ONBOARDING}"
    out = session.post(
        f"{world.portal}/accounts/logout/",
        data={"csrfmiddlewaretoken": _csrf(final.text)},
        allow_redirects=False,
        timeout=10,
    )
    assert out.status_code == 302 and out.headers["Location"] == "/"
    assert session.get(f"{world.portal}/search/", allow_redirects=False, timeout=10).status_code == 302


def test_sso_users_read_only_their_own_tenants_documents(world):
    acme_session, _, _ = sso_login(world, "acme-idp", "gina")
    globex_session, final, _ = sso_login(world, "globex-idp", "hank")  # client_secret_basic at the token endpoint
    assert final.status_code == 200
    [hank] = _users_with_email(ACCOUNTS["hank"]["email"])
    assert _membership(world.globex.tenant.pk, hank.pk).role == "member"

    def search(session, q):
        page = session.get(f"{world.portal}/search/", params={"q": q}, timeout=60)
        assert page.status_code == 200
        return page.text

    # A hit shows its document's title; the query itself is echoed in the search box.
    assert "SSO Acme handbook" in search(acme_session, ACME_MARKER)
    assert "SSO Globex handbook" not in search(acme_session, GLOBEX_MARKER)
    assert "SSO Globex handbook" not in search(acme_session, "handbook")
    assert "SSO Globex handbook" in search(globex_session, GLOBEX_MARKER)
    assert "SSO Acme handbook" not in search(globex_session, ACME_MARKER)
    assert "SSO Acme handbook" not in search(globex_session, "handbook")


def test_a_private_slack_channel_reaches_its_member_after_sso_sign_in_until_removed(world, tmp_path):
    """The Slack export names Pia's Slack user with the address her provider verifies: after signing
    in through SSO she reads the private channel's messages; Quentin, in the workspace but not the
    channel, does not; after a sync that no longer lists her in the channel, neither does she."""
    import json

    from sources.services import source_create, source_ingest

    marker = "NARWHAL-3141 is the offsite budget code"

    def export(members: list[str]) -> None:
        (tmp_path / "channels.json").write_text(json.dumps([{"id": "C0SSOGEN1", "name": "general", "members": []}]))
        (tmp_path / "groups.json").write_text(json.dumps([{"id": "G0SSOEXEC", "name": "exec", "members": members}]))
        users = [
            {
                "id": uid,
                "name": login,
                "profile": {"real_name": ACCOUNTS[login]["name"], "email": ACCOUNTS[login]["email"]},
            }
            for uid, login in (("U0SSOPIA1", "pia"), ("U0SSOQUE1", "quentin"))
        ]
        (tmp_path / "users.json").write_text(json.dumps(users))
        for channel, text in (("exec", f"{marker}, keep it in this channel."), ("general", "Welcome, everyone.")):
            (tmp_path / channel).mkdir(exist_ok=True)
            message = {"type": "message", "user": "U0SSOPIA1", "text": text, "ts": "1704880800.000100"}
            (tmp_path / channel / "2024-01-10.json").write_text(json.dumps([message]))

    export(["U0SSOPIA1"])
    source = source_create(
        tenant_id=world.acme.tenant.pk,
        kind="slack_export",
        name="Acme Slack (SSO test)",
        config={"path": str(tmp_path)},
        project_ids=[world.acme.project.pk],
    )
    assert source_ingest(tenant_id=world.acme.tenant.pk, source_id=source.pk).status == "succeeded"

    def reads(session) -> bool:
        page = session.get(f"{world.portal}/search/", params={"q": "NARWHAL-3141 offsite budget"}, timeout=60)
        assert page.status_code == 200
        return "keep it in this channel" in page.text

    pia, final, _ = sso_login(world, "acme-idp", "pia")
    assert final.status_code == 200
    quentin, final, _ = sso_login(world, "acme-idp", "quentin")
    assert final.status_code == 200
    assert reads(pia)
    assert not reads(quentin)

    export([])
    assert source_ingest(tenant_id=world.acme.tenant.pk, source_id=source.pk).status == "succeeded"
    assert not reads(pia)


def test_failed_round_trip_is_a_failed_login_in_the_providers_tenant(world):
    session = requests.Session()
    before = len(_events("login.failed", tenant_id=world.acme.tenant.pk))
    page = session.get(
        f"{world.portal}/accounts/oidc/acme-idp/login/callback/",
        params={"code": "forged", "state": "forged"},
        timeout=10,
    )
    assert page.status_code == 401 and "Sign-in failed" in page.text
    events = _events("login.failed", tenant_id=world.acme.tenant.pk)
    assert len(events) == before + 1 and events[-1].data["provider"] == "acme-idp"


def test_bindings_are_tenant_owned_rows_under_row_level_security(world):
    from kbportal.models import TenantIdentityProvider
    from kbportal.sso import identity_providers_for_apps, tenant_ids_claiming_domain
    from kbportal.tenancy import tenant_context

    assert TenantIdentityProvider.all_tenants.count() == 0  # no tenant, no lookup setting: nothing
    with tenant_context(world.acme.tenant.pk):
        assert [r.social_app.provider_id for r in TenantIdentityProvider.objects.all()] == ["acme-idp"]
        assert TenantIdentityProvider.all_tenants.count() == 1
    from allauth.socialaccount.models import SocialApp

    apps = {a.provider_id: a.pk for a in SocialApp.objects.all()}
    found = identity_providers_for_apps([apps["globex-idp"]])
    assert [r.tenant_id for r in found.values()] == [world.globex.tenant.pk]  # that one row only
    assert identity_providers_for_apps([apps["stray-idp"]]) == {}
    assert tenant_ids_claiming_domain(GLOBEX_DOMAIN) == [world.globex.tenant.pk]
    assert tenant_ids_claiming_domain("nowhere.test") == []
    assert TenantIdentityProvider.all_tenants.count() == 0  # the lookup settings did not outlive the lookups


def test_sso_provider_command_adds_lists_and_removes(world, capsys, monkeypatch):
    from allauth.socialaccount.models import SocialApp

    with pytest.raises(CommandError, match="already admitted by another organization's provider"):
        call_command(
            "sso_provider",
            "add",
            "--tenant",
            "sso-acme",
            "--name",
            "Dup",
            "--provider-id",
            "dup",
            "--server-url",
            world.issuer,
            "--client-id",
            "x",
            "--secret",
            "y",
            "--domain",
            GLOBEX_DOMAIN,
        )
    with pytest.raises(CommandError, match=r"domain 'bad_domain!\.com' is not a DNS name"):
        call_command(
            "sso_provider",
            "add",
            "--tenant",
            "sso-acme",
            "--name",
            "Bad",
            "--provider-id",
            "bad",
            "--server-url",
            world.issuer,
            "--client-id",
            "x",
            "--secret",
            "y",
            "--domain",
            "bad_domain!.com",
        )
    with pytest.raises(CommandError, match="no tenant 'nope'"):
        call_command("sso_provider", "list", "--tenant", "nope")
    call_command(
        "sso_provider",
        "add",
        "--tenant",
        "sso-acme",
        "--name",
        "Acme Second",
        "--provider-id",
        "acme-second",
        "--server-url",
        world.issuer,
        "--client-id",
        "second",
        "--secret",
        "s2",
        "--domain",
        "Acme2.SSO.test",
        "--domain",
        "@acme3.sso.test",
    )
    assert "/accounts/oidc/acme-second/login/callback/" in capsys.readouterr().out
    call_command("sso_provider", "list", "--tenant", "sso-acme")
    listed = capsys.readouterr().out
    assert "acme-second\tAcme Second" in listed and "acme2.sso.test,acme3.sso.test\tmember\tactive" in listed
    assert "acme-idp" in listed and "globex-idp" not in listed
    assert "Sign in with Acme Second" in requests.get(f"{world.portal}/accounts/login/", timeout=10).text
    call_command("sso_provider", "remove", "acme-second")
    assert capsys.readouterr().out == "Removed acme-second.\n"
    # --secret - reads the secret from standard input (kept out of the shell history).
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin-secret\n"))
    call_command(
        "sso_provider",
        "add",
        "--tenant",
        "sso-globex",
        "--name",
        "Globex Stdin",
        "--provider-id",
        "globex-stdin",
        "--server-url",
        world.issuer,
        "--client-id",
        "stdin",
        "--secret",
        "-",
        "--domain",
        "stdin.globex.test",
        "--logout-at-provider",
    )
    app = SocialApp.objects.get(provider_id="globex-stdin")
    assert app.secret == "from-stdin-secret" and app.settings["logout_at_provider"] is True
    call_command("sso_provider", "remove", "globex-stdin")
    assert not SocialApp.objects.filter(provider_id="globex-stdin").exists()
    call_command("sso_provider", "list", "--tenant", "sso-acme")
    assert "acme-second" not in capsys.readouterr().out
    assert "Acme Second" not in requests.get(f"{world.portal}/accounts/login/", timeout=10).text


def test_operator_admin_lists_and_adds_bindings_and_refuses_a_claimed_domain(world):
    from allauth.socialaccount.models import SocialApp
    from django.test import Client

    from kbportal.models import TenantIdentityProvider
    from kbportal.tenancy import tenant_context

    operator = get_user_model().objects.create_superuser("sso-operator", "op@ops.test", "pw-" + "o" * 12)
    client = Client()
    client.force_login(operator)
    listing = client.get("/admin/kbportal/tenantidentityprovider/")
    assert listing.status_code == 200 and ACME_DOMAIN in listing.content.decode()
    assert GLOBEX_DOMAIN in listing.content.decode()  # the operator sees every tenant's bindings
    app = SocialApp.objects.create(
        provider="openid_connect",
        provider_id="acme-admin-added",
        name="Acme Admin",
        client_id="c",
        secret="s",
        settings={"server_url": world.issuer},
    )
    form = {"tenant": world.acme.tenant.pk, "social_app": app.pk, "default_role": "member", "is_active": "on"}
    clash = client.post(
        "/admin/kbportal/tenantidentityprovider/add/", {**form, "domains": f"x.acme.test,{GLOBEX_DOMAIN}"}
    )
    assert clash.status_code == 200
    assert f"already admitted by another organization&#x27;s provider: {GLOBEX_DOMAIN}" in clash.content.decode()
    added = client.post("/admin/kbportal/tenantidentityprovider/add/", {**form, "domains": "Admin.Acme.test"})
    assert added.status_code == 302, added.content.decode()[:2000]
    with tenant_context(world.acme.tenant.pk):
        row = TenantIdentityProvider.objects.get(social_app=app)
    assert row.domains == ["admin.acme.test"] and row.default_role == "member"
    assert "Sign in with Acme Admin" in requests.get(f"{world.portal}/accounts/login/", timeout=10).text
    # Deleting the app in allauth's admin (through the owner's connection) removes its binding too.
    deleted = client.post(f"/admin/socialaccount/socialapp/{app.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302, deleted.content.decode()[:2000]
    assert not SocialApp.objects.filter(pk=app.pk).exists()
    assert not TenantIdentityProvider.all_tenants.using("owner").filter(social_app_id=app.pk).exists()
