"""The git push webhook: ``POST /hooks/git/<source public id>`` signed with the source's
``webhook_secret`` (GitHub's ``X-Hub-Signature-256``) queues a sync that re-embeds only what
the push changed; unsigned, badly signed, unknown or other tenants' calls are refused with JSON
errors that name nothing of any tenant."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client

from kbportal.celery import app as celery_app
from kbportal.models import AuditEvent
from kbportal.tenancy import tenant_context
from projects.services import tenant_onboard
from sources.models import DataSource, Document, IngestionRun
from sources.services import source_create, source_ingest

ACME_SECRET, GLOBEX_SECRET = "acme-hook-secret-1", "globex-hook-secret-2"
FILES = 12


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
    }
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True)
    return done.stdout


def module(i: int, body: str = "return value * {i}") -> str:
    return (
        f'"""Billing helpers, part {i}."""\n\n\n'
        f'def scale_{i}(value):\n    """Scale a charge."""\n    {body.format(i=i)}\n\n\n'
        f"def label_{i}(name):\n    return name.title() + ' {i}'\n\n\n"
        f"class Ledger{i}:\n    def total(self, items):\n        return sum(items) + {i}\n"
    )


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for i in range(FILES):
        (path / "billing").mkdir(exist_ok=True)
        (path / "billing" / f"part_{i}.py").write_text(module(i))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Initial billing code")
    return path


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Hooks:
    acme_tenant: int
    globex_tenant: int
    repo: Path
    source: DataSource
    globex_source: DataSource
    no_secret: DataSource
    docs_source: DataSource


@pytest.fixture
def hooks(django_db_setup, django_db_blocker, tmp_path, settings):
    """Committed: acme's git source (secret set, ingested once), globex's git source (its own
    secret), acme's git source without a secret, acme's docs source. Disabled on teardown."""
    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    with django_db_blocker.unblock():
        tag = uuid.uuid4().hex[:8]
        acme = tenant_onboard(
            name="Acme", slug=f"hook-acme-{tag}", admin_username=f"hook-acme-{tag}", admin_password="p" * 12
        )
        globex = tenant_onboard(
            name="Globex", slug=f"hook-globex-{tag}", admin_username=f"hook-globex-{tag}", admin_password="q" * 12
        )
        repo = make_repo(tmp_path / "billing")
        source = source_create(
            tenant_id=acme.tenant.pk,
            kind="git",
            name="Billing",
            slug="billing",
            config={"path": str(repo), "branch": "main", "webhook_secret": ACME_SECRET},
        )
        globex_source = source_create(
            tenant_id=globex.tenant.pk,
            kind="git",
            name="Globex billing",
            slug="globex-billing",
            config={"path": str(repo), "webhook_secret": GLOBEX_SECRET},
        )
        no_secret = source_create(
            tenant_id=acme.tenant.pk, kind="git", name="Plain", slug="plain", config={"path": str(repo)}
        )
        docs_source = source_create(
            tenant_id=acme.tenant.pk, kind="test_rows", name="Rows", slug="rows", config={"rows": []}
        )
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
        yield Hooks(acme.tenant.pk, globex.tenant.pk, repo, source, globex_source, no_secret, docs_source)
        for tenant_id in (acme.tenant.pk, globex.tenant.pk):
            with tenant_context(tenant_id):
                DataSource.objects.update(enabled=False)


@pytest.fixture
def eager_celery():
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def post(source_public_id, body: bytes, *, signature: str | None, event: str = "push"):
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4())}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    client = Client()
    return client.post(f"/hooks/git/{source_public_id}", data=body, content_type="application/json", headers=headers)


def runs(tenant_id: int, source: DataSource) -> list[IngestionRun]:
    with tenant_context(tenant_id):
        return list(IngestionRun.objects.filter(source=source).order_by("id"))


PUSH = json.dumps({"ref": "refs/heads/main", "after": "0" * 40}).encode()


def test_the_secret_is_stored_encrypted(hooks):
    with tenant_context(hooks.acme_tenant):
        stored = DataSource.objects.get(pk=hooks.source.pk).config["webhook_secret"]
    assert stored.startswith("enc:v1:") and ACME_SECRET not in stored


def test_a_signed_push_queues_a_sync_that_reembeds_only_the_changed_chunk(hooks, eager_celery, capsys):
    with tenant_context(hooks.acme_tenant):
        rows_before = Document.objects.filter(source=hooks.source).count()
    (hooks.repo / "billing" / "part_3.py").write_text(module(3, body="return round(value * {i}, 2)"))
    git(hooks.repo, "commit", "-q", "-am", "Round scaled charges")

    response = post(hooks.source.public_id, PUSH, signature=sign(ACME_SECRET, PUSH))
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "queued"
    run = runs(hooks.acme_tenant, hooks.source)[-1]
    assert run.pk == body["run_id"] and run.status == "succeeded", run.error
    # One function body changed in one of 12 files: that chunk and the new commit row are embedded;
    # the file row's embedded summary (path, docstring, symbols) did not change, so it is not.
    assert run.embedded == 2 and run.created == 1 and run.updated == 2 and run.deleted == 0
    assert run.unchanged == run.seen - 3 == rows_before - 2
    with tenant_context(hooks.acme_tenant):
        chunk = Document.objects.get(source=hooks.source, external_id="billing/part_3.py#scale_3")
        event = AuditEvent.objects.filter(action="source.sync", object_id=str(hooks.source.pk)).latest("id")
    assert "round(value * 3, 2)" in chunk.content
    assert event.data["via"] == "webhook" and event.data["run_id"] == run.pk and event.actor_id is None
    with capsys.disabled():
        print(
            f"\ngit push re-embedding: {rows_before} rows before; one-file change -> seen {run.seen}, "
            f"embedded {run.embedded}, updated {run.updated}, created {run.created}, unchanged {run.unchanged}"
        )


def test_pushes_while_a_run_is_queued_reuse_it(hooks):
    first = post(hooks.source.public_id, PUSH, signature=sign(ACME_SECRET, PUSH))
    second = post(hooks.source.public_id, PUSH, signature=sign(ACME_SECRET, PUSH))
    assert first.status_code == second.status_code == 202
    assert first.json()["run_id"] == second.json()["run_id"]
    assert [r.status for r in runs(hooks.acme_tenant, hooks.source)][-1] == "queued"
    with tenant_context(hooks.acme_tenant):  # leave nothing queued for other tests
        IngestionRun.objects.filter(source=hooks.source, status="queued").update(status="failed", error="test")


def _refused(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code and body["error"]
    return body


def test_bad_missing_and_foreign_signatures_are_refused_and_queue_nothing(hooks):
    before = len(runs(hooks.acme_tenant, hooks.source))
    missing = _refused(post(hooks.source.public_id, PUSH, signature=None), 401, "signature_missing")
    assert "X-Hub-Signature-256" in missing["error"] and missing["field"] == "X-Hub-Signature-256"
    _refused(post(hooks.source.public_id, PUSH, signature="sha256=" + "0" * 64), 403, "signature_invalid")
    _refused(post(hooks.source.public_id, PUSH, signature="not-a-signature"), 403, "signature_invalid")
    # Signed with another tenant's secret, or a signature of another body.
    _refused(post(hooks.source.public_id, PUSH, signature=sign(GLOBEX_SECRET, PUSH)), 403, "signature_invalid")
    _refused(post(hooks.source.public_id, PUSH + b" ", signature=sign(ACME_SECRET, PUSH)), 403, "signature_invalid")
    # Globex's source with Acme's secret: refused; the error names neither tenant nor source.
    foreign = post(hooks.globex_source.public_id, PUSH, signature=sign(ACME_SECRET, PUSH))
    body = _refused(foreign, 403, "signature_invalid")
    text = json.dumps(body).lower()
    assert "globex" not in text and "acme" not in text and "billing" not in text
    assert len(runs(hooks.acme_tenant, hooks.source)) == before
    assert runs(hooks.globex_tenant, hooks.globex_source) == []


def test_unknown_non_git_and_unconfigured_sources(hooks):
    unknown = _refused(post(uuid.uuid4(), PUSH, signature=sign(ACME_SECRET, PUSH)), 404, "not_found")
    not_git = _refused(post(hooks.docs_source.public_id, PUSH, signature=sign(ACME_SECRET, PUSH)), 404, "not_found")
    assert unknown == not_git  # the same answer: nothing tells an existing id from a made-up one
    _refused(post(hooks.no_secret.public_id, PUSH, signature=sign(ACME_SECRET, PUSH)), 403, "webhook_disabled")
    assert Client().get(f"/hooks/git/{hooks.source.public_id}").status_code == 405
    assert Client().post("/hooks/git/not-a-uuid", data=PUSH, content_type="application/json").status_code == 404
    assert runs(hooks.acme_tenant, hooks.no_secret) == [] and runs(hooks.acme_tenant, hooks.docs_source) == []


def test_ping_other_events_and_other_branches_queue_nothing(hooks):
    before = len(runs(hooks.acme_tenant, hooks.source))
    ping = post(hooks.source.public_id, b"{}", signature=sign(ACME_SECRET, b"{}"), event="ping")
    assert (ping.status_code, ping.json()) == (200, {"status": "pong"})
    issue = post(hooks.source.public_id, b"{}", signature=sign(ACME_SECRET, b"{}"), event="issues")
    assert issue.status_code == 200 and issue.json()["status"] == "ignored"
    other = json.dumps({"ref": "refs/heads/feature-x"}).encode()
    branch = post(hooks.source.public_id, other, signature=sign(ACME_SECRET, other))
    assert branch.status_code == 200 and "feature-x" in branch.json()["reason"]
    assert len(runs(hooks.acme_tenant, hooks.source)) == before
