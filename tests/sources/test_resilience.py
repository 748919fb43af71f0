"""Resilience: a broken source backs off and never blocks a good one; an ingestion killed with
SIGKILL mid-run loses nothing, duplicates nothing, and its stale run is marked abandoned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connections
from django.utils import timezone

from kbportal.celery import app as celery_app
from kbportal.tenancy import tenant_context
from projects.services import tenant_onboard
from sources.models import DataSource, Document, IngestionRun
from sources.scheduling import source_run_lock_held, sources_dispatch_due
from sources.services import source_create, source_ingest

pytestmark = pytest.mark.slow  # kills ingestion processes mid-run

ROOT = Path(__file__).resolve().parent.parent.parent
CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}
CORPUS_RECORDS = 600


@pytest.fixture
def eager_celery():
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.fixture
def org(django_db_setup, django_db_blocker, settings):
    """Committed tenants with unique slugs (runs, locks and subprocesses need real commits); their
    sources are disabled on teardown so no later dispatcher pass picks them up."""
    settings.KB_CUSTOM_CONNECTORS = CUSTOM
    made: list[int] = []
    with django_db_blocker.unblock():

        def factory(name: str):
            slug = f"{name}-{uuid.uuid4().hex[:8]}"
            tenant = tenant_onboard(
                name=name.title(), slug=slug, admin_username=f"{slug}-admin", admin_password="p" * 12
            )
            made.append(tenant.tenant.pk)
            return tenant

        yield factory
        for tenant_id in made:
            with tenant_context(tenant_id):
                DataSource.objects.update(enabled=False)


def _runs(tenant_id: int, source_id: int) -> list[IngestionRun]:
    with tenant_context(tenant_id):
        return list(IngestionRun.objects.filter(source_id=source_id).order_by("id"))


def _source(tenant_id: int, source_id: int) -> DataSource:
    with tenant_context(tenant_id):
        return DataSource.objects.get(pk=source_id)


# ---------- a broken source and a good one ------------------------------------------------------


def test_a_broken_source_backs_off_and_never_blocks_a_good_one(org, eager_celery, tmp_path):
    acme = org("acme")
    broken = source_create(
        tenant_id=acme.tenant.pk,
        kind="git",
        name="Broken",
        slug="broken",
        config={"path": str(tmp_path / "gone-repo")},
        project_ids=[acme.project.pk],
    )
    rows = [{"external_id": f"r{i}", "kind": "doc_section", "title": f"r{i}", "content": f"good {i}"} for i in range(4)]
    good = source_create(
        tenant_id=acme.tenant.pk,
        kind="test_rows",
        name="Good",
        slug="good",
        config={"rows": rows},
        project_ids=[acme.project.pk],
    )
    mine = [acme.tenant.pk]

    # The broken source comes first (lower id) and fails; the good one still ingests.
    assert broken.pk < good.pk
    first = sources_dispatch_due(tenant_ids=mine)
    assert [s for _, s, _ in first.queued] == [broken.pk, good.pk] and first.errors == []
    (broken_run,) = _runs(acme.tenant.pk, broken.pk)
    (good_run,) = _runs(acme.tenant.pk, good.pk)
    assert broken_run.status == "failed" and "gone-repo" in broken_run.error
    assert (good_run.status, good_run.created) == ("succeeded", 4)
    with tenant_context(acme.tenant.pk):
        assert Document.objects.filter(source=good).count() == 4
    state = _source(acme.tenant.pk, broken.pk)
    assert state.consecutive_failures == 1 and "gone-repo" in state.last_error
    assert state.backoff_until - broken_run.finished_at == timedelta(minutes=60)

    # Each further failure doubles the wait: 60, 120, 240 minutes after the failing run.
    for failures, wait in ((2, 120), (3, 240)):
        clock = _source(acme.tenant.pk, broken.pk).backoff_until + timedelta(seconds=1)
        report = sources_dispatch_due(now=clock, tenant_ids=mine)
        assert broken.pk in [s for _, s, _ in report.queued]
        state = _source(acme.tenant.pk, broken.pk)
        last = _runs(acme.tenant.pk, broken.pk)[-1]
        assert (state.consecutive_failures, last.status) == (failures, "failed")
        assert state.backoff_until - last.finished_at == timedelta(minutes=wait)
    # While backed off it is not queued, though its plain interval (60 min) has passed; the good
    # source, due on its interval, is.
    report = sources_dispatch_due(now=timezone.now() + timedelta(minutes=90), tenant_ids=mine)
    assert broken.pk in report.backed_off and [s for _, s, _ in report.queued] == [good.pk]

    # Fixed: the next run succeeds and the failure count and backoff are cleared.
    (tmp_path / "gone-repo").mkdir()
    subprocess.run(["git", "-C", str(tmp_path / "gone-repo"), "init", "-q", "-b", "main"], check=True)
    (tmp_path / "gone-repo" / "a.py").write_text("def a():\n    return 1\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(tmp_path / "gone-repo"), "add", "."], check=True, env=env)
    subprocess.run(
        [
            "git",
            "-C",
            str(tmp_path / "gone-repo"),
            "-c",
            "user.name=T",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-q",
            "-m",
            "init",
        ],
        check=True,
        env=env,
    )
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=broken.pk).status == "succeeded"
    state = _source(acme.tenant.pk, broken.pk)
    assert (state.consecutive_failures, state.backoff_until, state.last_error) == (0, None, "")
    assert state.last_success_at is not None


# ---------- SIGKILL mid-run ---------------------------------------------------------------------


def _url(settings: dict) -> str:
    auth = quote(settings["USER"], safe="") + (
        f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    )
    return f"postgres://{auth}@{quote(settings['HOST'] or 'localhost', safe='')}:{settings['PORT']}/{settings['NAME']}"


def _corpus(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            record = {
                "id": f"rec-{i:05d}",
                "title": f"Runbook entry {i}",
                "content": f"Entry {i}: restart the queue consumer {i % 17} after rotating credential set {i % 5}.",
            }
            out.write(json.dumps(record) + "\n")
    return path


def _stored(tenant_id: int, source_id: int) -> list[tuple[str, str]]:
    with tenant_context(tenant_id):
        return list(
            Document.objects.filter(source_id=source_id)
            .order_by("external_id")
            .values_list("external_id", "content_hash")
        )


def test_sigkill_mid_run_loses_and_duplicates_nothing_and_the_next_run_resumes(org, tmp_path, capsys):
    acme = org("acme")
    corpus = _corpus(tmp_path / "runbook.jsonl", CORPUS_RECORDS)
    config = {"path": str(corpus), "id_field": "id", "title_field": "title", "content_fields": ["content"]}
    killed = source_create(tenant_id=acme.tenant.pk, kind="jsonl", name="Runbook", slug="runbook", config=config)
    clean = source_create(tenant_id=acme.tenant.pk, kind="jsonl", name="Clean", slug="clean", config=config)

    env = dict(os.environ)
    env["DATABASE_URL"] = _url(connections["default"].settings_dict)
    env["DATABASE_OWNER_URL"] = _url(connections["owner"].settings_dict)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "ingest", f"{acme.tenant.slug}/runbook", "--quiet"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if len(_stored(acme.tenant.pk, killed.pk)) >= 128:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        # Meanwhile a second run of the same source, from this process, is refused.
        refused = source_ingest(tenant_id=acme.tenant.pk, source_id=killed.pk)
        assert refused.status == "skipped" and "in progress" in refused.error
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    before = _stored(acme.tenant.pk, killed.pk)
    dead = [r for r in _runs(acme.tenant.pk, killed.pk) if r.status == "running"]
    assert len(dead) == 1 and 0 < len(before) < CORPUS_RECORDS
    # The dead session's lock goes with it (PostgreSQL may take a moment to notice).
    deadline = time.monotonic() + 30
    while source_run_lock_held(killed.pk) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not source_run_lock_held(killed.pk)

    resumed = source_ingest(tenant_id=acme.tenant.pk, source_id=killed.pk)
    reference = source_ingest(tenant_id=acme.tenant.pk, source_id=clean.pk)
    after, expected = _stored(acme.tenant.pk, killed.pk), _stored(acme.tenant.pk, clean.pk)

    (abandoned,) = [r for r in _runs(acme.tenant.pk, killed.pk) if r.pk == dead[0].pk]
    assert abandoned.status == "failed" and abandoned.error.startswith("abandoned") and abandoned.finished_at
    assert resumed.status == "succeeded" and reference.status == "succeeded"
    # Resumed: what the killed run stored is found unchanged by hash, not embedded again.
    assert resumed.unchanged == len(before) and resumed.created == resumed.embedded == CORPUS_RECORDS - len(before)
    # Same rows as a clean full run: same count, same ids, same content, each id once.
    assert len(after) == len(expected) == reference.created == CORPUS_RECORDS
    assert len({eid for eid, _ in after}) == len(after)
    assert after == expected  # (external id, content hash) pairs
    assert _source(acme.tenant.pk, killed.pk).indexed_rows == CORPUS_RECORDS
    with capsys.disabled():
        print(
            f"\nkill -9 figures: corpus {CORPUS_RECORDS} records; stored when killed {len(before)}; "
            f"after the resumed run {len(after)} (distinct ids {len({e for e, _ in after})}); clean full run "
            f"{len(expected)}; resumed run embedded {resumed.embedded}, unchanged {resumed.unchanged}"
        )
