"""Scheduling: the beat dispatcher across tenants, the per-source run lock (two real concurrent
runs), "sync now" from the admin, the API and the status page going through that lock, and the
status page and API for tenant admins only."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from kbportal.celery import app as celery_app
from kbportal.tenancy import tenant_context
from projects.models import Membership
from projects.services import api_token_create, membership_create, profile_set_default_project, tenant_onboard
from sources.models import DataSource, Document, IngestionRun
from sources.scheduling import (
    backoff_minutes,
    source_health_list,
    source_next_run_at,
    source_run_lock,
    source_run_lock_held,
    sources_dispatch_due,
)
from sources.services import source_create, source_ingest
from tests.conftest import subprocess_database_env

ROOT = Path(__file__).resolve().parent.parent.parent
CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}


def _rows(prefix: str, n: int) -> list[dict]:
    return [
        {"external_id": f"{prefix}-{i}", "kind": "doc_section", "title": f"{prefix} {i}", "content": f"text {i}"}
        for i in range(n)
    ]


@pytest.fixture
def eager_celery():
    """Queued tasks run in-process once the run row commits (Celery's own test setting)."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.fixture
def custom(settings):
    settings.KB_CUSTOM_CONNECTORS = CUSTOM


@pytest.fixture
def org(django_db_setup, django_db_blocker, custom):
    """Factory of committed tenants (unique slugs): ``org("acme")`` -> OnboardedTenant.

    Runs and locks need real commits (other threads, other sessions, on-commit queueing), and
    a transactional test's flush would TRUNCATE the append-only audit log, so the data is
    committed like the other modules' shared fixtures. On teardown every source of these
    tenants is disabled, so no later dispatcher pass picks them up.
    """
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


def _source(tenant, slug: str, n: int = 3, **options) -> DataSource:
    return source_create(
        tenant_id=tenant.tenant.pk,
        kind="test_rows",
        name=slug.title(),
        slug=slug,
        config={"rows": _rows(slug, n)},
        project_ids=[tenant.project.pk],
        **options,
    )


def _reload(tenant_id: int, source_id: int) -> DataSource:
    with tenant_context(tenant_id):
        return DataSource.objects.get(pk=source_id)


def _api(tenant) -> APIClient:
    """An API client with a token of the tenant's admin."""
    api = APIClient()
    raw = api_token_create(tenant=tenant.tenant, user=tenant.admin, name="t")[1]
    api.credentials(HTTP_AUTHORIZATION="Bearer " + raw)
    return api


def _runs(tenant_id: int, source_id: int) -> list[IngestionRun]:
    with tenant_context(tenant_id):
        return list(IngestionRun.objects.filter(source_id=source_id).order_by("id"))


# ---------- backoff arithmetic ------------------------------------------------------------------


def test_backoff_doubles_per_failure_and_is_capped(settings):
    settings.KB_SYNC_BACKOFF_MAX_MINUTES = 24 * 60
    assert [backoff_minutes(60, n) for n in range(0, 7)] == [60, 60, 120, 240, 480, 960, 1440]
    assert backoff_minutes(60, 50) == 1440
    assert backoff_minutes(5, 3) == 20
    # A source whose own interval is longer than the cap waits its interval, never less.
    assert backoff_minutes(3000, 4) == 3000


# ---------- the dispatcher ----------------------------------------------------------------------


def test_dispatcher_queues_due_sources_of_every_tenant_in_their_own_context(org, eager_celery):
    acme, globex = org("acme"), org("globex")
    a = _source(acme, "acme-wiki", sync_interval_minutes=30)
    g = _source(globex, "globex-wiki", n=2, sync_interval_minutes=120)
    off = _source(acme, "acme-off")
    with tenant_context(acme.tenant.pk):
        DataSource.objects.filter(pk=off.pk).update(enabled=False)

    mine = [acme.tenant.pk, globex.tenant.pk]
    first = sources_dispatch_due(tenant_ids=mine)
    assert {(t, s) for t, s, _ in first.queued} == {(acme.tenant.pk, a.pk), (globex.tenant.pk, g.pk)}
    assert first.errors == []
    # Eager: each queued run ran at once, in its own tenant, with the rows of its own source.
    (run_a,) = _runs(acme.tenant.pk, a.pk)
    (run_g,) = _runs(globex.tenant.pk, g.pk)
    assert (run_a.status, run_a.created, run_g.status, run_g.created) == ("succeeded", 3, "succeeded", 2)
    with tenant_context(globex.tenant.pk):
        assert set(Document.objects.values_list("external_id", flat=True)) == {"globex-wiki-0", "globex-wiki-1"}
        assert not IngestionRun.objects.filter(source_id=a.pk).exists()  # RLS: acme's run is invisible
    assert _runs(acme.tenant.pk, off.pk) == []

    # Not due again until the interval has passed: nothing queued now, acme's wiki after 30 min.
    assert sources_dispatch_due(tenant_ids=mine).queued == []
    source_a = _reload(acme.tenant.pk, a.pk)
    assert source_a.last_success_at is not None and source_a.consecutive_failures == 0
    assert source_next_run_at(source_a) == source_a.last_attempt_at + timedelta(minutes=30)
    later = sources_dispatch_due(now=timezone.now() + timedelta(minutes=31), tenant_ids=mine)
    assert [s for _, s, _ in later.queued] == [a.pk]
    assert _runs(acme.tenant.pk, a.pk)[-1].unchanged == 3


def test_dispatcher_does_not_queue_a_source_whose_run_is_queued(org):
    acme = org("acme")
    source = _source(acme, "acme-wiki")
    # Not eager: the run stays queued (no worker here).
    mine = [acme.tenant.pk]
    first = sources_dispatch_due(tenant_ids=mine)
    assert [s for _, s, _ in first.queued] == [source.pk]
    again = sources_dispatch_due(now=timezone.now() + timedelta(hours=2), tenant_ids=mine)
    assert again.queued == [] and again.busy == [source.pk]
    assert [r.status for r in _runs(acme.tenant.pk, source.pk)] == ["queued"]
    # A queued run nobody took for longer than KB_SYNC_QUEUED_STALE_MINUTES lost its message:
    # it is marked failed and the source is queued afresh.
    much_later = sources_dispatch_due(now=timezone.now() + timedelta(hours=7), tenant_ids=mine)
    assert [s for _, s, _ in much_later.queued] == [source.pk]
    lost, fresh = _runs(acme.tenant.pk, source.pk)
    assert lost.status == "failed" and "never started" in lost.error
    assert fresh.status == "queued"


# ---------- one run at a time -------------------------------------------------------------------


def _run_in_thread(tenant_id: int, source_id: int, release: threading.Event, started: threading.Event, out: dict):
    """A real run in another thread (its own database connection) that pauses after its first
    row until ``release`` is set, so another run can try to start meanwhile."""

    def progress(done: int, total: int | None) -> None:
        started.set()
        release.wait(timeout=60)

    def target() -> None:
        try:
            out["run"] = source_ingest(tenant_id=tenant_id, source_id=source_id, progress=progress)
        except BaseException as exc:  # reported to the test thread
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    assert started.wait(timeout=120), "the first run never reached its first row"
    return thread


def test_a_second_concurrent_run_of_a_source_is_skipped_with_the_reason(org):
    acme = org("acme")
    source = _source(acme, "acme-wiki", n=5)
    other = _source(acme, "acme-other", n=2)
    release, started, out = threading.Event(), threading.Event(), {}
    thread = _run_in_thread(acme.tenant.pk, source.pk, release, started, out)
    try:
        assert source_run_lock_held(source.pk) and not source_run_lock_held(other.pk)
        second = source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk)
        # Another source is not blocked by it.
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=other.pk).status == "succeeded"
    finally:
        release.set()
        thread.join(timeout=120)
    assert "error" not in out, out.get("error")
    first = out["run"]
    assert second.status == "skipped" and second.seen == 0
    assert f"run {first.pk}" in second.error and "in progress" in second.error and "acme-wiki" in second.error
    assert first.status == "succeeded" and first.created == 5
    # The first run wrote every row exactly once; the skipped run changed nothing.
    with tenant_context(acme.tenant.pk):
        ids = list(Document.objects.filter(source=source).values_list("external_id", flat=True))
    assert sorted(ids) == sorted(f"acme-wiki-{i}" for i in range(5))
    # Skipping is not a failure: the source is healthy, and the lock is free again.
    assert _reload(acme.tenant.pk, source.pk).consecutive_failures == 0
    assert not source_run_lock_held(source.pk)
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).unchanged == 5


def test_the_lock_is_held_by_one_session_only(org):
    acme = org("acme")
    source = _source(acme, "acme-wiki")
    with source_run_lock(source.pk) as first:
        with source_run_lock(source.pk) as second:
            assert (first, second) == (True, False)
    with source_run_lock(source.pk) as again:
        assert again is True


# ---------- sync now: admin, API, web page all go through the lock ------------------------------


@pytest.fixture
def people(org):
    acme, globex = org("acme"), org("globex")
    member = get_user_model().objects.create_user(f"{acme.tenant.slug}-member", "", "m" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=member, role=Membership.Role.MEMBER)
    profile_set_default_project(user=member, tenant_id=acme.tenant.pk, project_id=acme.project.pk)
    return acme, globex, member


def test_sync_now_from_api_web_and_admin_is_refused_while_a_run_is_in_progress(people, client, eager_celery):
    acme, globex, member = people
    source = _source(acme, "acme-wiki", n=4)
    release, started, out = threading.Event(), threading.Event(), {}
    thread = _run_in_thread(acme.tenant.pk, source.pk, release, started, out)
    try:
        api = _api(acme)
        response = api.post("/api/v1/sources/acme-wiki/sync")
        assert response.status_code == 202, response.content
        api_run = response.json()["run_id"]

        client.force_login(acme.admin)
        page = client.post("/sources/acme-wiki/sync")
        assert page.status_code == 302 and page["Location"] == "/sources/status/"

        staff = get_user_model().objects.create_superuser(f"{acme.tenant.slug}-op", "", "o" * 12)
        client.force_login(staff)
        admin = client.post("/admin/sources/datasource/", {"action": "sync_now", "_selected_action": [source.pk]})
        assert admin.status_code == 302
    finally:
        release.set()
        thread.join(timeout=120)
    assert "error" not in out, out.get("error")
    first = out["run"]
    runs = _runs(acme.tenant.pk, source.pk)
    assert [r.pk for r in runs][0] == first.pk and first.status == "succeeded"
    queued_meanwhile = runs[1:]
    assert len(queued_meanwhile) == 3 and queued_meanwhile[0].pk == api_run
    for run in queued_meanwhile:  # API, web page, admin: each ran at once (eager) and was refused
        assert run.status == "skipped" and f"run {first.pk}" in run.error, (run.status, run.error)
    with tenant_context(acme.tenant.pk):
        assert Document.objects.filter(source=source).count() == 4


def test_web_sync_now_is_404_for_members_and_outsiders(people, client):
    acme, globex, member = people
    _source(acme, "acme-wiki")
    for user in (member, globex.admin):
        client.force_login(user)
        assert client.post("/sources/acme-wiki/sync").status_code == 404
    client.force_login(acme.admin)
    assert client.post("/sources/no-such-source/sync").status_code == 404
    with tenant_context(acme.tenant.pk):
        assert not IngestionRun.objects.exists()


# ---------- the status page and the API ---------------------------------------------------------


def test_status_page_shows_health_to_tenant_admins_only(people, client, tmp_path):
    acme, globex, member = people
    good = _source(acme, "acme-wiki", n=3)
    broken = source_create(
        tenant_id=acme.tenant.pk,
        kind="git",
        name="Broken repo",
        slug="broken-repo",
        config={"path": str(tmp_path / "no-such-repo")},
        project_ids=[acme.project.pk],
    )
    _source(globex, "globex-secret-wiki")
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=good.pk).status == "succeeded"
    for _ in range(2):
        assert source_ingest(tenant_id=acme.tenant.pk, source_id=broken.pk).status == "failed"

    client.force_login(acme.admin)
    page = client.get("/sources/status/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Acme-Wiki" in html and "Broken repo" in html and "globex-secret-wiki" not in html.lower()
    assert 'data-state="ok"' in html and 'data-state="backed_off"' in html
    assert "no-such-repo" in html  # the broken source's error text
    assert 'data-field="indexed_rows">3<' in html

    health = {h.source.slug: h for h in source_health_list(tenant_id=acme.tenant.pk)}
    assert health["broken-repo"].source.consecutive_failures == 2 and health["broken-repo"].backed_off
    # Two failures: the next try waits twice the interval after the last failure.
    broken_now = health["broken-repo"].source
    last = health["broken-repo"].last_run
    assert broken_now.backoff_until - last.finished_at == timedelta(minutes=120)
    assert health["broken-repo"].next_run_at == broken_now.backoff_until
    assert health["acme-wiki"].state == "ok" and health["acme-wiki"].last_run.created == 3
    assert health["acme-wiki"].lag_seconds is not None and health["acme-wiki"].lag_seconds < 120

    client.force_login(member)
    assert client.get("/sources/status/").status_code == 404
    # Another organization's admin sees their own sources, never this one's.
    client.force_login(globex.admin)
    theirs = client.get("/sources/status/").content.decode()
    assert "Globex-Secret-Wiki" in theirs and "Broken repo" not in theirs and "Acme-Wiki" not in theirs
    client.logout()
    assert client.get("/sources/status/").status_code == 302  # to the login page

    # The API lists the same health for the admin's token.
    api = _api(acme)
    listed = {s["slug"]: s for s in api.get("/api/v1/sources").json()["sources"]}
    assert listed["broken-repo"]["consecutive_failures"] == 2 and "no-such-repo" in listed["broken-repo"]["last_error"]
    assert listed["broken-repo"]["next_run_at"] is not None and listed["acme-wiki"]["last_success_at"] is not None
    assert listed["acme-wiki"]["enabled"] is True and "globex-secret-wiki" not in listed


# ---------- Celery beat itself ------------------------------------------------------------------


@pytest.mark.slow
def test_beat_keeps_its_schedule_in_the_database_and_sends_the_dispatcher(django_db_setup, django_db_blocker):
    """A real ``celery -A kbportal beat`` (DatabaseScheduler, app role) against this run's test
    database and Redis (127.0.0.1:6379, db 14): it stores the dispatcher entry in
    django-celery-beat's table and sends ``sources.dispatch_due`` to the ``default`` queue. No
    worker consumes it here (the dispatcher itself is tested above, in-process)."""
    import redis
    from django_celery_beat.models import PeriodicTask

    broker = "redis://127.0.0.1:6379/14"
    queue = redis.Redis.from_url(broker)
    queue.delete("default")
    env = subprocess_database_env()
    env.update(
        CELERY_BROKER_URL=broker,
        KB_SYNC_DISPATCH_SECONDS="1",
    )
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "kbportal", "beat", "--loglevel=INFO"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and beat.poll() is None and not queue.llen("default"):
            time.sleep(0.5)
        assert beat.poll() is None, beat.stdout.read().decode(errors="replace")
        assert queue.llen("default") >= 1, "beat sent nothing within 90 s"
        message = json.loads(queue.lindex("default", 0))
        assert message["headers"]["task"] == "sources.dispatch_due"
        with django_db_blocker.unblock():
            entry = PeriodicTask.objects.select_related("interval").get(name="sources: queue due data sources")
        assert entry.task == "sources.dispatch_due" and entry.enabled
        assert (entry.interval.every, entry.interval.period) == (1, "seconds")  # KB_SYNC_DISPATCH_SECONDS
    finally:
        beat.terminate()
        try:
            beat.wait(timeout=20)
        except subprocess.TimeoutExpired:
            beat.kill()
            beat.wait()
        queue.delete("default")
