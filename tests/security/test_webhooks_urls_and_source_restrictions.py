"""Git push webhooks, private-address URL checks and Jira/Confluence restrictions under attack:
forged signatures queue nothing and reveal no secret, every spelling of a private address is
refused, and a restriction that cannot be read keeps the page or issue closed."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


# ---------- webhook -----------------------------------------------------------------------------------


@pytest.fixture
def git_source(make_tenant, settings):
    from sources.services import source_create

    settings.KB_ALLOW_PRIVATE_URLS = True
    t = make_tenant("atk-s3w")
    source = source_create(
        tenant_id=t.tenant.pk,
        kind="git",
        name="repo",
        slug="repo",
        project_ids=[t.project.pk],
        config={"path": "/nonexistent/repo", "webhook_secret": "s3cret-hook"},
    )
    return t, source


def _sig(secret: bytes, body: bytes, algo=hashlib.sha256, name="sha256") -> str:
    return f"{name}=" + hmac.new(secret, body, algo).hexdigest()


@pytest.mark.parametrize(
    "header",
    [
        "",
        "sha256=",
        "sha256",
        _sig(b"", b'{"ref": "refs/heads/main"}'),
        _sig(b"s3cret-hook", b'{"ref": "refs/heads/main"}', hashlib.sha1, "sha1"),
        _sig(b"s3cret-hook", b'{"ref": "refs/heads/other"}'),
        _sig(b"s3cret-hook", b'{"ref": "refs/heads/main"}') + "00",
        "sha256=" + "0" * 64,
        "sha256=é",
    ],
)
def test_webhook_forged_signatures_queue_nothing(git_source, header):
    from kbportal.tenancy import tenant_context
    from sources.models import IngestionRun

    t, source = git_source
    extra = {"HTTP_X_HUB_SIGNATURE_256": header} if header else {}
    r = Client(raise_request_exception=False).post(
        f"/hooks/git/{source.public_id}", b'{"ref": "refs/heads/main"}', content_type="application/json", **extra
    )
    assert r.status_code in (401, 403), (r.status_code, r.content)
    with tenant_context(t.tenant.pk):
        assert not IngestionRun.objects.filter(source_id=source.pk).exists()


def test_webhook_answers_reveal_no_secret(git_source):
    t, source = git_source
    r = Client(raise_request_exception=False).post(
        f"/hooks/git/{source.public_id}", b"{}", content_type="application/json", HTTP_X_HUB_SIGNATURE_256="sha256=00"
    )
    assert b"s3cret-hook" not in r.content and b"enc:v1:" not in r.content


# ---------- URL checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.1/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://0x7f.0.0.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::1]/",
        "http://[0:0:0:0:0:ffff:7f00:1]/",
        "http://localhost./",
        "http://LOCALHOST/",
        "http://[fe80::1%25eth0]/",
        "http://169.254.169.254/latest",
        "http://0/",
        "http://[::]/",
        "https://user:pw@127.0.0.1/x",
        "ssh://git@127.0.0.1/repo",
        "git@127.0.0.1:repo.git",
        "http://[64:ff9b::7f00:1]/",
        "http://[::127.0.0.1]/",
    ],
)
def test_private_url_forms_are_refused(url, settings):
    from kbportal import netcheck

    settings.KB_ALLOW_PRIVATE_URLS = False
    with pytest.raises(netcheck.PrivateAddressError):
        netcheck.check_url(url, field="base_url")


# ---------- Jira / Confluence restrictions fail closed ---------------------------------------------------


@pytest.mark.parametrize(
    "restrictions",
    [
        {"read": {"operation": "read", "_expandable": {"restrictions": "/rest/api/content/1/restriction"}}},
        {"read": {"operation": "read", "restrictions": {}}},
        {"read": {"restrictions": {"user": {"_expandable": {"results": ""}}, "group": {"results": []}}}},
        {"read": {"restrictions": {"user": [{"email": "a@x.example"}], "group": {"results": []}}}},
        {"read": {"restrictions": {"user": {"results": []}, "group": {"results": "admins"}}}},
    ],
)
def test_confluence_unreadable_restriction_is_malformed_never_open(restrictions):
    from sources.connectors.confluence.connector import MalformedPage, read_restriction

    with pytest.raises(MalformedPage):
        read_restriction(restrictions)


def test_confluence_unrestricted_and_restricted_shapes_still_read():
    from sources.connectors.confluence.connector import read_restriction

    empty = {"results": [], "start": 0, "limit": 200, "size": 0}
    assert read_restriction({"read": {"restrictions": {"user": empty, "group": empty}}}) is None
    one = {"read": {"restrictions": {"user": {"results": [{"email": "A@x.example"}]}, "group": empty}}}
    assert read_restriction(one) == frozenset({"email:a@x.example"})


@pytest.mark.parametrize("security", [{"id": "10001", "self": "https://jira.example/x"}, "10001", {"name": ""}])
def test_jira_issue_with_an_unnamed_security_level_stays_closed(security):
    from sources.connectors.jira.connector import _security_level

    assert _security_level(security), f"security {security!r} read as no level: the issue would be open"
    assert _security_level(None) == "" and _security_level({"name": "Staff"}) == "Staff"
