"""Hardening: connector secrets encrypted at rest, connector URLs kept off private networks,
login lockout, the web ask rate limit, GET asks only from the portal's own pages, security
headers and ``check --deploy``.

Real components throughout: the fake GitHub on loopback speaks the REST API to the real
``requests`` client; rows are read back with raw SQL; the login goes through allauth's form.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
import requests
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.forms import CheckboxInput
from django.test import override_settings
from django.urls import reverse

from kbportal import netcheck
from kbportal.secrets import MASK, decrypt_value, is_encrypted
from kbportal.tenancy import tenant_context
from search.models import AnswerRecord
from sources.connectors.base import ConnectorError
from sources.connectors.registry import build_connector
from sources.models import DataSource, Document, IngestionRun
from sources.services import source_create, source_ingest, source_secrets_rotate, source_update_config
from tests.sources.github_server import TOKEN, FakeGitHub, GitHubWorld

ROOT = Path(__file__).resolve().parents[2]
KEY_1, KEY_2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()


# -- fixtures ----------------------------------------------------------------------------------


def _world() -> GitHubWorld:
    world = GitHubWorld(owner="acme", repo="api")
    start = datetime(2025, 3, 1, tzinfo=UTC)
    for n in (1, 2):
        world.add_item(
            number=n,
            title=f"Billing deploy fails #{n}",
            body="The billing deploy times out on step 3.",
            author="alice",
            created=start + timedelta(days=n),
            updated=start + timedelta(days=n, hours=2),
            pull=n == 2,
            merged=start + timedelta(days=n, hours=3) if n == 2 else None,
        )
    return world


@pytest.fixture
def github():
    server = FakeGitHub(_world())
    yield server
    server.close()


@pytest.fixture
def acme(make_tenant):
    return make_tenant("hard-acme")


def _config(server: FakeGitHub, **extra) -> dict:
    return {
        "owner": "acme",
        "repo": "api",
        "token": TOKEN,
        "base_url": server.base_url,
        "allow_private_network": True,
        **extra,
    }


def _raw_config(tenant_id: int, source_id: int) -> str:
    """The config column as PostgreSQL stores it (raw SQL, no model code in between)."""
    with tenant_context(tenant_id), connection.cursor() as cursor:
        cursor.execute("SELECT config::text FROM sources_datasource WHERE id = %s", [source_id])
        return cursor.fetchone()[0]


# -- secrets at rest ---------------------------------------------------------------------------


def test_secret_is_stored_encrypted_and_ingestion_still_authenticates(acme, github):
    source = source_create(tenant_id=acme.tenant.pk, kind="github", name="API issues", config=_config(github))
    raw = _raw_config(acme.tenant.pk, source.pk)
    assert TOKEN not in raw and "TESTtoken" not in raw
    stored = json.loads(raw)
    assert stored["token"].startswith("enc:v1:") and stored["owner"] == "acme"  # only secrets are encrypted
    assert decrypt_value(stored["token"], label="x", field="token") == TOKEN

    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    # The fake GitHub answers 401 to any other token, so rows prove the decrypted token was sent.
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    with tenant_context(acme.tenant.pk):
        assert sorted(Document.objects.filter(source=source).values_list("kind", flat=True)) == ["pr", "ticket"]
    assert all(r.status == 200 for r in github.requests)


def test_update_keeps_a_masked_secret_and_encrypts_a_new_one(acme, github):
    source = source_create(tenant_id=acme.tenant.pk, kind="github", name="API issues", config=_config(github))
    before = json.loads(_raw_config(acme.tenant.pk, source.pk))["token"]
    source_update_config(tenant_id=acme.tenant.pk, source_id=source.pk, config={**_config(github), "token": MASK})
    assert json.loads(_raw_config(acme.tenant.pk, source.pk))["token"] == before
    # The same plaintext again keeps the ciphertext (Fernet is randomised, so this is a real check).
    source_update_config(tenant_id=acme.tenant.pk, source_id=source.pk, config=_config(github))
    assert json.loads(_raw_config(acme.tenant.pk, source.pk))["token"] == before
    source_update_config(tenant_id=acme.tenant.pk, source_id=source.pk, config=_config(github, token="ghp_NEWone"))
    raw = _raw_config(acme.tenant.pk, source.pk)
    assert "ghp_NEWone" not in raw
    assert decrypt_value(json.loads(raw)["token"], label="x", field="token") == "ghp_NEWone"


def test_rotation_re_encrypts_with_the_new_key_and_the_old_key_can_go(acme, github):
    with override_settings(KB_SECRETS_KEYS=[KEY_1]):
        source = source_create(tenant_id=acme.tenant.pk, kind="github", name="API issues", config=_config(github))
    old_value = json.loads(_raw_config(acme.tenant.pk, source.pk))["token"]
    with override_settings(KB_SECRETS_KEYS=[KEY_2, KEY_1]):
        assert build_connector("github", json.loads(_raw_config(acme.tenant.pk, source.pk))).config.token
        assert source_secrets_rotate(tenant_id=acme.tenant.pk) == 1
    new_value = json.loads(_raw_config(acme.tenant.pk, source.pk))["token"]
    assert new_value != old_value and is_encrypted(new_value)
    with override_settings(KB_SECRETS_KEYS=[KEY_2]):  # old key dropped: still ingests
        run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
        assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    with override_settings(KB_SECRETS_KEYS=[KEY_1]):  # the old key alone no longer opens it
        with pytest.raises(ConnectorError, match="'token'"):
            build_connector("github", json.loads(_raw_config(acme.tenant.pk, source.pk)))


def test_a_wrong_key_fails_the_run_naming_the_source_and_field(acme, github):
    with override_settings(KB_SECRETS_KEYS=[KEY_1]):
        source = source_create(
            tenant_id=acme.tenant.pk, kind="github", name="API issues", slug="api-issues", config=_config(github)
        )
    with override_settings(KB_SECRETS_KEYS=[KEY_2]):
        run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED
    assert "data source 'api-issues'" in run.error and "config field 'token'" in run.error
    assert "KB_SECRETS_KEY" in run.error and TOKEN not in run.error
    assert github.requests == []  # nothing was sent with a token it could not read


def test_an_invalid_key_is_named():
    with (
        override_settings(KB_SECRETS_KEYS=["not-a-key"]),
        pytest.raises(ConnectorError, match="key #1 is not a Fernet"),
    ):
        build_connector("github", {"owner": "a", "repo": "b", "token": "enc:v1:gAAAA"})


def test_migration_0010_encrypts_plaintext_secrets_under_row_level_security(acme):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("sources.migrations.0010_encrypt_connector_secrets")
    with tenant_context(acme.tenant.pk):  # a row written before secrets were encrypted
        legacy = DataSource.objects.create(
            tenant_id=acme.tenant.pk,
            name="Legacy",
            slug="legacy",
            kind="slack",
            config={"token": "xoxb-legacy-plain", "app_token": "xapp-legacy", "channels": ["C0123ABCD"]},
        )
    # The app role (not a superuser) runs it: rows are visible only because it sets app.tenant_id.
    with connection.schema_editor() as editor:
        migration.encrypt_secrets(apps, editor)
    raw = _raw_config(acme.tenant.pk, legacy.pk)
    assert "xoxb-legacy-plain" not in raw and "xapp-legacy" not in raw
    stored = json.loads(raw)
    assert stored["channels"] == ["C0123ABCD"]
    assert decrypt_value(stored["token"], label="x", field="token") == "xoxb-legacy-plain"
    with connection.schema_editor() as editor:
        migration.decrypt_secrets(apps, editor)  # the reverse restores plaintext
    assert json.loads(_raw_config(acme.tenant.pk, legacy.pk))["token"] == "xoxb-legacy-plain"


@pytest.fixture(scope="module")
def committed_source(django_db_setup, django_db_blocker):
    """A committed tenant, github source and operator (the admin reads through the owner connection)."""
    from projects.services import tenant_onboard

    with django_db_blocker.unblock():
        tenant = tenant_onboard(
            name="HardAdm", slug="hard-adm", admin_username="hard-adm-admin", admin_password="w" * 12
        )
        source = source_create(
            tenant_id=tenant.tenant.pk,
            kind="github",
            name="Admin GH",
            slug="admin-gh",
            config={
                "owner": "acme",
                "repo": "api",
                "token": "ghp_ADMINsecret123",
                "base_url": "http://127.0.0.1:9/api",
                "allow_private_network": True,
            },
        )
        operator = get_user_model().objects.create_superuser("hard-operator", "op@hard.example", "pw-operator-123")
    return tenant, source, operator


def _owner_raw_config(tenant_id: int, source_id: int) -> str:
    """The stored config read through the table owner's connection (raw SQL)."""
    with connections["owner"].cursor() as cursor:
        cursor.execute("SELECT set_config('app.tenant_id', %s, true)", [str(tenant_id)])
        cursor.execute("SELECT config::text FROM sources_datasource WHERE id = %s", [source_id])
        return cursor.fetchone()[0]


def _admin_post_data(response) -> dict:
    """What a browser would submit from an admin change page: each field's shown value, and the
    inlines' management forms."""
    form = response.context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if value is None or (isinstance(field.widget, CheckboxInput) and not value):
            continue
        data[name] = value
    for inline in response.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        for name in management.fields:
            data[f"{management.prefix}-{name}"] = management[name].value()
    return data


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_never_shows_a_secret_and_keeps_it_when_left_masked(client, committed_source):
    tenant, source, operator = committed_source
    client.force_login(operator)
    url = f"/admin/sources/datasource/{source.pk}/change/"
    page = client.get(url)
    html = page.content.decode()
    assert "ghp_ADMINsecret123" not in html and "enc:v1:" not in html
    assert MASK in html
    stored = json.loads(_owner_raw_config(tenant.tenant.pk, source.pk))["token"]

    data = _admin_post_data(page)
    assert json.loads(data["config"])["token"] == MASK
    response = client.post(url, {**data, "name": "Admin GH renamed"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    raw = _owner_raw_config(tenant.tenant.pk, source.pk)
    assert json.loads(raw)["token"] == stored and "Admin GH renamed" not in raw  # kept as it was

    data["config"] = json.dumps({**json.loads(data["config"]), "token": "ghp_REPLACED"})
    assert client.post(url, data).status_code == 302
    raw = _owner_raw_config(tenant.tenant.pk, source.pk)
    assert "ghp_REPLACED" not in raw
    assert decrypt_value(json.loads(raw)["token"], label="x", field="token") == "ghp_REPLACED"


def test_sources_api_returns_no_config(client, acme, github):
    from projects.services import api_token_create

    source_create(
        tenant_id=acme.tenant.pk,
        kind="github",
        name="API issues",
        config=_config(github),
        project_ids=[acme.project.pk],
    )
    _, token = api_token_create(tenant=acme.tenant, user=acme.admin, name="t")
    body = client.get("/api/v1/sources", headers={"Authorization": f"Bearer {token}"}).content.decode()
    assert "API issues" in body
    assert TOKEN not in body and "enc:v1:" not in body and "config" not in body


# -- connector URLs and private networks -------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "address", "problem"),
    [
        ("http://127.0.0.1:9/api", "127.0.0.1", "loopback"),
        ("http://localhost:9/api", "127.0.0.1", "loopback"),
        ("https://10.1.2.3/api/v3", "10.1.2.3", "private"),
        ("https://192.168.0.7/api", "192.168.0.7", "private"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254", "link-local"),
        ("http://[::1]:8080/", "::1", "loopback"),
        ("http://[fd12:3456::1]/", "fd12:3456::1", "unique-local"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1", "loopback"),
        ("http://0.0.0.0/", "0.0.0.0", "unspecified"),
        ("http://224.0.0.1/", "224.0.0.1", "multicast"),
    ],
)
def test_private_base_url_is_refused_when_saving(acme, url, address, problem):
    with pytest.raises(ConnectorError) as exc:
        source_create(
            tenant_id=acme.tenant.pk, kind="github", name="Bad", config={"owner": "a", "repo": "b", "base_url": url}
        )
    message = str(exc.value)
    assert "'base_url'" in message and f"resolves to {address}" in message and f"a {problem} address" in message
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.filter(name="Bad").exists()


def test_git_url_path_is_checked_but_local_paths_are_not(acme, tmp_path):
    with pytest.raises(ConnectorError, match=r"'path'.*127\.0\.0\.1"):
        build_connector("git", {"path": "https://127.0.0.1/org/repo.git"})
    with pytest.raises(ConnectorError, match=r"'path'.*10\.0\.0\.8"):
        build_connector("git", {"path": "git@10.0.0.8:org/repo.git"})
    assert build_connector("git", {"path": str(tmp_path)}).config.path == str(tmp_path)
    assert netcheck.check_url(f"file://{tmp_path}", field="path") == []


def test_public_addresses_pass_and_the_opt_ins_work(acme, settings):
    assert netcheck.address_problem("93.184.215.14") is None and netcheck.address_problem("2606:4700::1111") is None
    assert netcheck.check_url("https://93.184.215.14/api", field="base_url") == ["93.184.215.14"]
    cfg = {"owner": "a", "repo": "b", "base_url": "http://127.0.0.1:9/api"}
    assert build_connector("github", {**cfg, "allow_private_network": True}).config.base_url == cfg["base_url"]
    with pytest.raises(ConnectorError, match="allow_private_network: must be true or false"):
        build_connector("github", {**cfg, "allow_private_network": "yes"})
    settings.KB_ALLOW_PRIVATE_URLS = True
    assert build_connector("github", cfg).config.base_url == cfg["base_url"]


def test_connection_time_check_refuses_a_stored_private_url(acme, github):
    """A row whose URL turned private after it was saved (DNS rebinding, an edit in the
    database) is refused when the run connects, before any request leaves."""
    with tenant_context(acme.tenant.pk):
        source = DataSource.objects.create(
            tenant_id=acme.tenant.pk,
            name="Rebound",
            slug="rebound",
            kind="github",
            config={"owner": "acme", "repo": "api", "token": TOKEN, "base_url": github.base_url},
        )
    run = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
    assert run.status == IngestionRun.Status.FAILED
    assert "data source 'rebound'" in run.error and "'base_url'" in run.error and "127.0.0.1" in run.error
    assert github.requests == []


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args):
        pass


def test_guarded_session_checks_the_address_actually_connected_to():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://localhost:{httpd.server_address[1]}/"
        assert requests.get(url, timeout=5).text == "hello"  # the server answers an unguarded client
        session = requests.Session()
        netcheck.guard_session(session)
        with pytest.raises(requests.ConnectionError, match=r"refused to connect to 'localhost'.*127\.0\.0\.1"):
            session.get(url, timeout=5)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_http_connectors_get_the_guarded_session_unless_allowed():
    public = {"owner": "a", "repo": "b", "token": "t", "base_url": "https://93.184.215.14/api"}
    session = build_connector("github", public).client.session
    assert isinstance(session.get_adapter("https://93.184.215.14/api"), netcheck.PublicOnlyAdapter)
    allowed = build_connector("github", {**public, "allow_private_network": True}).client.session
    assert not isinstance(allowed.get_adapter("https://93.184.215.14/api"), netcheck.PublicOnlyAdapter)


# -- login lockout -----------------------------------------------------------------------------


def test_failed_logins_lock_out_that_username_from_that_address(client, acme, settings):
    login = reverse("account_login")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        r = client.post(login, {"login": "hard-acme-admin", "password": "wrong-password"})
        assert r.status_code == 200  # the form again, with its error
    r = client.post(login, {"login": "hard-acme-admin", "password": "wrong-password"})
    assert r.status_code == 429  # the failure that reaches the limit locks
    # Now even the right password is refused, with a page and Retry-After.
    r = client.post(login, {"login": "hard-acme-admin", "password": "pw-" + "hard-acme" * 2})
    assert r.status_code == 429
    assert int(r["Retry-After"]) == int(settings.AXES_COOLOFF_TIME.total_seconds())
    assert "Too many failed logins" in r.content.decode()
    assert "_auth_user_id" not in client.session
    # Another account from the same address still logs in (the lock is per address + username).
    other = get_user_model().objects.create_user("hard-other", "other@hard.example", "pw-other-12345")
    r = client.post(login, {"login": other.username, "password": "pw-other-12345"})
    assert r.status_code == 302 and client.session["_auth_user_id"] == str(other.pk)


def test_a_successful_login_resets_the_count(client, acme, settings):
    login = reverse("account_login")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post(login, {"login": "hard-acme-admin", "password": "wrong-password"})
    assert client.post(login, {"login": "hard-acme-admin", "password": "pw-" + "hard-acme" * 2}).status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post(login, {"login": "hard-acme-admin", "password": "wrong-password"})
    assert client.post(login, {"login": "hard-acme-admin", "password": "pw-" + "hard-acme" * 2}).status_code == 302


# -- asking: rate limit and cross-site GETs ----------------------------------------------------


def _answers(tenant_id: int) -> int:
    with tenant_context(tenant_id):
        return AnswerRecord.objects.count()


SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@override_settings(KB_ASK_RATE="2/h")
def test_ask_rate_limit_per_user_on_the_page_and_the_stream(client, acme, make_tenant):
    client.force_login(acme.admin)
    for _ in range(2):
        assert client.get(reverse("search:ask"), {"q": "billing deploy"}, headers=SAME_ORIGIN).status_code == 200
    r = client.get(reverse("search:ask"), {"q": "billing deploy"}, headers=SAME_ORIGIN)
    assert r.status_code == 429 and 0 < int(r["Retry-After"]) <= 3600
    assert "Too many questions" in r.content.decode() and "2 per h" in r.content.decode()
    r = client.get(reverse("search:ask_stream"), {"q": "billing deploy"}, headers=SAME_ORIGIN)
    assert r.status_code == 429 and r["Content-Type"] == "text/event-stream" and int(r["Retry-After"]) > 0
    event, data = r.content.decode().strip().split("\n")
    assert event == "event: failed" and "too many questions" in json.loads(data[len("data: ") :])["message"]
    assert _answers(acme.tenant.pk) == 2
    # Another user has their own count.
    other = make_tenant("hard-other")
    client.force_login(other.admin)
    assert client.get(reverse("search:ask"), {"q": "billing deploy"}, headers=SAME_ORIGIN).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Referer": "https://evil.example/page"},
        {"Origin": "null"},
    ],
)
def test_a_cross_site_get_does_not_ask(client, acme, headers):
    client.force_login(acme.admin)
    r = client.get(reverse("search:ask"), {"q": "billing deploy secrets"}, headers=headers)
    assert r.status_code == 200
    html = r.content.decode()
    assert "came from a link on another site, so it was not asked" in html
    assert 'value="billing deploy secrets"' in html and "result" not in r.context
    r = client.get(reverse("search:ask_stream"), {"q": "billing deploy secrets"}, headers=headers)
    assert r.status_code == 403
    assert _answers(acme.tenant.pk) == 0


@pytest.mark.parametrize(
    "headers",
    [{"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {"Referer": "http://testserver/?q=x"}, {}],
)
def test_own_pages_and_typed_urls_still_ask(client, acme, headers):
    client.force_login(acme.admin)
    r = client.get(reverse("search:ask"), {"q": "billing deploy"}, headers=headers)
    assert r.status_code == 200 and r.context["result"].answer_id
    r = client.get(reverse("search:ask_stream"), {"q": "billing deploy"}, headers=headers)
    assert r.status_code == 200 and "event: done" in b"".join(r.streaming_content).decode()
    assert _answers(acme.tenant.pk) == 2


# -- headers and deployment checks -------------------------------------------------------------


def test_security_headers_and_a_csp_without_inline_script(client, acme):
    client.force_login(acme.admin)
    r = client.get(reverse("search:ask"))
    csp = dict(part.strip().split(" ", 1) for part in r["Content-Security-Policy"].split(";") if part.strip())
    assert csp["script-src"] == "'self'" and csp["object-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
    assert r["X-Frame-Options"] == "DENY" and r["Referrer-Policy"] == "same-origin"
    assert r["X-Content-Type-Options"] == "nosniff"
    html = r.content.decode()
    # Every script on the page is a file (an inline one would be blocked by script-src 'self').
    assert html.count("<script") == html.count("<script src=") >= 1
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200 and "<script>" not in docs.content.decode()


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KB_PUBLIC_URL", "DJANGO_"))}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env={**base, "DJANGO_SECRET_KEY": "k" * 20 + Fernet.generate_key().decode(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_check_deploy_is_clean_for_an_https_configuration():
    https = _check_deploy({"KB_PUBLIC_URL": "https://kb.example.com", "DJANGO_ALLOWED_HOSTS": "kb.example.com"})
    assert https.returncode == 0, https.stderr
    assert "System check identified no issues" in https.stdout + https.stderr, https.stderr
    plain = _check_deploy({"DJANGO_ALLOWED_HOSTS": "kb.example.com"})  # http: the same check has findings
    for code in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert code in plain.stdout + plain.stderr
