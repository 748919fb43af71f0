"""When data sources sync, one run at a time, and how a failing source backs off.

**Schedule.** Each source carries ``sync_interval_minutes`` and ``enabled`` (edited in the
admin). Celery beat, with django-celery-beat's database scheduler, runs one entry,
``sources.dispatch_due``, every minute; it calls :func:`sources_dispatch_due`, which queues a
run of every enabled source whose next run time (:func:`source_next_run_at`) has come and
that has no run queued or running. One dispatcher reading the sources' own rows (rather than
one beat entry per source) keeps a single source of truth, survives sources being created
or deleted in any way (the admin, services, a cascading tenant delete), and lets backoff and
"already running" decide in the same query.

**Tenancy.** The dispatcher has no tenant: it lists the tenants (not a tenant-owned table)
and reads each one's sources inside that tenant's own :func:`~kbportal.tenancy.tenant_context`,
as ``manage.py`` commands do (``sources.selectors.source_resolve_for_operator``). It connects
as the app role like everything else: row-level security is never bypassed.

**One run at a time.** :func:`source_run_lock` takes a PostgreSQL session advisory lock keyed
by the source id on a connection of its own, held for the whole run; a second run of the same
source, in any process, is refused and recorded as ``skipped`` with the reason. The lock dies
with its connection, so a worker killed with SIGKILL releases it at once; the next run then
marks the dead worker's ``running`` run failed (abandoned) and starts over, skipping by
content hash what the dead run had already stored.

**Backoff.** After ``n`` consecutive failed (or abandoned) runs the next scheduled run waits
``interval * 2**(n-1)`` minutes, at most ``max(settings.KB_SYNC_BACKOFF_MAX_MINUTES,
interval)``; a success resets it. "Sync now" and a push webhook ignore the backoff (someone
asked), but never start a second concurrent run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from kbportal.audit import audit_record
from kbportal.celery import app as celery_app
from kbportal.tenancy import tenant_context
from projects.models import Tenant
from sources.models import DataSource, IngestionRun

INGEST_TASK = "sources.ingest_source"  # sources.tasks.ingest_source

logger = logging.getLogger(__name__)

# High 32 bits of the advisory lock key ("kbSY"); the low 32 bits are the source id. Advisory
# locks are per database, and the one-bigint key space does not overlap the two-int4 keys of
# ``sources.connectors.slack.live._slack_channel_lock``.
LOCK_NAMESPACE = 0x6B625359
ACTIVE = (IngestionRun.Status.QUEUED, IngestionRun.Status.RUNNING)
FINISHED = (
    IngestionRun.Status.SUCCEEDED,
    IngestionRun.Status.PARTIAL,
    IngestionRun.Status.FAILED,
    IngestionRun.Status.SKIPPED,
)
ABANDONED = (
    "abandoned: the process running it stopped (killed or crashed) before it finished; "
    "rows it stored are kept and the next run resumes past them"
)


def _lock_key(source_id: int) -> int:
    """The source's advisory lock key; raises ``DataSource.DoesNotExist`` for an id no source
    can have (``None``, not positive, beyond 32 bits)."""
    if not isinstance(source_id, int) or not 0 < source_id < 2**32:
        raise DataSource.DoesNotExist(f"no data source with id {source_id!r}")
    return (LOCK_NAMESPACE << 32) | source_id


@contextmanager
def _advisory_lock(key: int) -> Iterator[bool]:
    lock_connection = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with lock_connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
            held = bool(cursor.fetchone()[0])
        yield held
    finally:
        lock_connection.close()  # ends the session: releases the lock


def source_run_lock(source_id: int):
    """Context manager: try to take the source's run lock for the block; yields ``True`` when
    taken, ``False`` at once (never waits) when another session holds it.

    A session advisory lock (``pg_try_advisory_lock(bigint)``) on a connection opened for it,
    so the run's own transactions (one per batch) do not release it, and it is released when
    the block ends or the process dies (PostgreSQL ends the session).
    """
    return _advisory_lock(_lock_key(source_id))


def source_run_lock_held(source_id: int) -> bool:
    """True when some session (a running ingestion) holds the source's run lock. Reads
    ``pg_locks`` of the current database; takes nothing."""
    key = _lock_key(source_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1)",
            [key >> 32, key & 0xFFFFFFFF],
        )
        return bool(cursor.fetchone()[0])


# -- backoff and the next run ---------------------------------------------------------------------


def backoff_minutes(interval_minutes: int, failures: int) -> int:
    """Minutes to wait after ``failures`` consecutive failures: ``interval * 2**(failures-1)``,
    capped at ``max(settings.KB_SYNC_BACKOFF_MAX_MINUTES, interval)``; ``interval`` when
    ``failures`` is 0 or 1."""
    interval = max(1, int(interval_minutes))
    cap = max(int(settings.KB_SYNC_BACKOFF_MAX_MINUTES), interval)
    exponent = min(max(int(failures) - 1, 0), 30)
    return min(cap, interval * 2**exponent)


def source_next_run_at(source: DataSource) -> datetime | None:
    """When the dispatcher will queue the source next: ``None`` when it is disabled; its
    creation time when it never ran; else the later of last attempt + interval and the end
    of its backoff."""
    if not source.enabled:
        return None
    if source.last_attempt_at is None:
        due = source.created_at
    else:
        due = source.last_attempt_at + timedelta(minutes=max(1, source.sync_interval_minutes))
    if source.backoff_until is not None and source.backoff_until > due:
        due = source.backoff_until
    return due


def _failure_record(source_id: int, error: str, at: datetime) -> None:
    """Count one more consecutive failure and set the backoff. Runs in the tenant's context."""
    source = DataSource.objects.filter(pk=source_id).first()
    if source is None:
        return
    failures = source.consecutive_failures + 1
    DataSource.objects.filter(pk=source_id).update(
        consecutive_failures=failures,
        last_error=error[:4000],
        backoff_until=at + timedelta(minutes=backoff_minutes(source.sync_interval_minutes, failures)),
    )


def source_health_record(*, source_id: int, run: IngestionRun) -> None:
    """After a finished run, update the source's health: a success (``succeeded``/``partial``)
    sets ``last_success_at`` and clears failures, error and backoff; a failure counts one more
    consecutive failure and backs off; ``skipped`` changes nothing. Runs inside the tenant's
    context."""
    at = run.finished_at or timezone.now()
    if run.status in (IngestionRun.Status.SUCCEEDED, IngestionRun.Status.PARTIAL):
        DataSource.objects.filter(pk=source_id).update(
            last_success_at=at, consecutive_failures=0, last_error="", backoff_until=None
        )
    elif run.status == IngestionRun.Status.FAILED:
        _failure_record(source_id, run.error or "failed", at)


# -- claiming a run under the lock ---------------------------------------------------------------


def runs_abandon(*, source_id: int, now: datetime | None = None) -> list[int]:
    """Mark the source's ``running`` runs failed (abandoned); returns their ids.

    Call only while holding the source's run lock: then no process is running them. Each counts as a failure of the
    source (a source that kills its worker backs off too). Runs in the tenant's context.
    """
    now = now or timezone.now()
    # One UPDATE that returns what it changed: two callers that saw the same dead run (the status
    # page and the dispatcher) mark it, and count it as a failure, once.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {IngestionRun._meta.db_table} SET status = %s, error = %s, finished_at = %s "
            "WHERE source_id = %s AND status = %s RETURNING id",
            [IngestionRun.Status.FAILED, ABANDONED, now, source_id, IngestionRun.Status.RUNNING],
        )
        ids = sorted(row[0] for row in cursor.fetchall())
    if ids:
        for run_id in ids:
            logger.warning("ingestion run %s of source %s was abandoned; marked failed", run_id, source_id)
        _failure_record(source_id, f"run {ids[-1]} {ABANDONED}", now)
    return ids


def run_claim(*, tenant_id: int, source: DataSource, run_id: int | None) -> IngestionRun | None:
    """The run a locked ingestion should use, or ``None`` when ``run_id`` names a run that had
    already finished (a redelivered task message: nothing to do).

    Holding the source's lock, so first abandons dead ``running`` runs (:func:`runs_abandon`).
    ``run_id`` ``None``: a new run. A queued ``run_id``: that run. A ``run_id`` that was itself
    running in a dead process: a new run (the old one stays failed, so history is honest).
    Records the attempt time on the source. Runs in the tenant's context; raises
    ``IngestionRun.DoesNotExist`` for a ``run_id`` not of this source.
    """
    abandoned = runs_abandon(source_id=source.pk)
    run = None
    if run_id is not None:
        run = IngestionRun.objects.get(pk=run_id, source=source)
        if run.status != IngestionRun.Status.QUEUED:
            if run.pk not in abandoned:
                return None
            run = None
    if run is None:
        run = IngestionRun.objects.create(tenant_id=tenant_id, source=source)
    DataSource.objects.filter(pk=source.pk).update(last_attempt_at=timezone.now())
    return run


def run_refuse(*, tenant_id: int, source_id: int, run_id: int | None) -> IngestionRun:
    """Record that a run of the source was refused because another holds its lock: the queued
    ``run_id`` (or a new run) becomes ``skipped`` with the reason naming the run in progress.
    Returns that run. Raises ``DataSource.DoesNotExist`` / ``IngestionRun.DoesNotExist``."""
    now = timezone.now()
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        holder = (
            IngestionRun.objects.filter(source=source, status=IngestionRun.Status.RUNNING)
            .exclude(pk=run_id)
            .order_by("-started_at")
            .first()
        )
        if holder is not None and holder.started_at is not None:
            busy = f"run {holder.pk} (started {holder.started_at:%Y-%m-%d %H:%M:%S} UTC) is in progress"
        else:
            busy = "another process holds its run lock"
        reason = f"skipped: another run of data source {source.slug!r} is in progress: {busy}; runs never overlap"
        run = IngestionRun.objects.get(pk=run_id, source=source) if run_id is not None else None
        if run is not None and run.status != IngestionRun.Status.QUEUED:
            return run  # a redelivered message of a run that already finished
        if run is None:
            run = IngestionRun(tenant_id=tenant_id, source=source)
        run.status = IngestionRun.Status.SKIPPED
        run.error = reason
        run.started_at = run.finished_at = now
        run.save()
    logger.info("source %s: %s", source_id, reason)
    return run


# -- queueing: the one path for the schedule, "sync now" and webhooks -----------------------------


def _enqueue(tenant_id: int, source_id: int, run_id: int) -> None:
    """Send ``sources.ingest_source`` (by its registered name: ``sources.tasks`` imports the
    services, which import this module, and ``SourcesConfig.ready`` registers it in every process);
    a broker failure marks the run failed (not left queued)."""
    try:
        celery_app.tasks[INGEST_TASK].delay(tenant_id, source_id, run_id)
    except Exception as exc:  # the broker is down or refused the message
        logger.exception("could not queue ingestion run %s of source %s", run_id, source_id)
        with tenant_context(tenant_id):
            IngestionRun.objects.filter(pk=run_id, status=IngestionRun.Status.QUEUED).update(
                status=IngestionRun.Status.FAILED,
                error=f"could not be queued: {type(exc).__name__}: {exc}"[:4000],
                finished_at=timezone.now(),
            )


def source_sync_queue(
    *,
    tenant_id: int,
    source_id: int,
    via: str,
    actor: Any = None,
    token_prefix: str | None = None,
    user_id: int | None = None,
    reuse_queued: bool = False,
) -> IngestionRun:
    """Queue one ingestion run of the source; returns the ``queued`` run.

    The one path of the scheduler (``via="schedule"``), the admin's and the API's "sync now"
    (``"admin"``, ``"api"``) and push webhooks (``"webhook"``). Creates the run and, except for
    the schedule, its ``source.sync`` audit event (``data``: source, run_id, via) in one
    transaction; sends ``sources.ingest_source(tenant_id, source_id, run_id)`` once it commits.
    With ``reuse_queued`` an already queued run of the source is returned instead of a second
    one (webhook bursts). Whether the run may start is decided by the worker under the
    source's lock. Raises ``DataSource.DoesNotExist``.
    """
    with tenant_context(tenant_id, user_id=user_id):
        source = DataSource.objects.get(pk=source_id)
        if reuse_queued:
            queued = IngestionRun.objects.filter(source=source, status=IngestionRun.Status.QUEUED).first()
            if queued is not None:
                return queued
        run = IngestionRun.objects.create(tenant_id=tenant_id, source=source)
        if via != "schedule":
            audit_record(
                action="source.sync",
                tenant_id=tenant_id,
                actor=actor,
                token_prefix=token_prefix,
                object_type="sources.datasource",
                object_id=source.pk,
                data={"source": source.slug, "run_id": run.pk, "via": via},
            )
        run_pk = run.pk
        transaction.on_commit(lambda: _enqueue(tenant_id, source_id, run_pk))
    return run


@dataclass
class DispatchReport:
    """What one dispatcher pass did: ``queued`` ``[(tenant id, source id, run id)]``, ``busy``
    and ``backed_off`` source ids, ``abandoned`` run ids, ``errors`` ``[(source id or None,
    text)]``."""

    queued: list[tuple[int, int, int]] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    backed_off: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)
    errors: list[tuple[int | None, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "queued": [run_id for _, _, run_id in self.queued],
            "busy": self.busy,
            "backed_off": self.backed_off,
            "abandoned": self.abandoned,
            "errors": [{"source": s, "error": e} for s, e in self.errors],
        }


def _source_busy(source: DataSource, now: datetime, report: DispatchReport) -> bool:
    """True when a live run of the source is queued or running. Clears dead ones: a ``running``
    run while nobody holds the lock (abandoned), a ``queued`` one older than
    ``settings.KB_SYNC_QUEUED_STALE_MINUTES`` (its message was lost). In the tenant's context."""
    active = list(IngestionRun.objects.filter(source=source, status__in=ACTIVE))
    if not active:
        return False
    if any(r.status == IngestionRun.Status.RUNNING for r in active):
        # Holding the lock (never waiting for it): a run that starts meanwhile is never touched.
        with source_run_lock(source.pk) as nobody_running:
            if nobody_running:
                report.abandoned += runs_abandon(source_id=source.pk, now=now)
    stale_before = now - timedelta(minutes=settings.KB_SYNC_QUEUED_STALE_MINUTES)
    lost = [r.pk for r in active if r.status == IngestionRun.Status.QUEUED and r.created_at < stale_before]
    if lost:
        IngestionRun.objects.filter(pk__in=lost, status=IngestionRun.Status.QUEUED).update(
            status=IngestionRun.Status.FAILED,
            error="never started: its queue message was lost (no worker took it within "
            f"{settings.KB_SYNC_QUEUED_STALE_MINUTES} minutes)",
            finished_at=now,
        )
    return IngestionRun.objects.filter(source=source, status__in=ACTIVE).exists()


def sources_dispatch_due(*, now: datetime | None = None, tenant_ids: list[int] | None = None) -> DispatchReport:
    """Queue a run of every enabled source, in every tenant, whose next run time has come.

    Reads each tenant's sources inside that tenant's context (no row-level-security bypass).
    A source with a live queued or running run is skipped (``busy``), one still in backoff is
    ``backed_off``. Each source is handled in its own transaction and its own ``try``: an error
    with one source (or tenant) is logged and reported, and the others are still queued.
    ``now`` (aware datetime) defaults to the current time; ``tenant_ids`` limits the pass to
    those tenants (default: all). Passes are serialised by an
    advisory lock: a pass that finds another running does nothing (and says so in ``errors``).
    """
    now = now or timezone.now()
    report = DispatchReport()
    with _advisory_lock(LOCK_NAMESPACE << 32) as held:  # one pass at a time (key 0: no source)
        if not held:
            report.errors.append((None, "another dispatcher pass is running; this one did nothing"))
            return report
        _dispatch(now, report, tenant_ids)
    return report


def _dispatch(now: datetime, report: DispatchReport, tenant_ids: list[int] | None) -> None:
    tenants = Tenant.objects.order_by("pk")
    if tenant_ids is not None:
        tenants = tenants.filter(pk__in=tenant_ids)
    for tenant_id in list(tenants.values_list("pk", flat=True)):
        try:
            with tenant_context(tenant_id):
                candidates = list(DataSource.objects.filter(enabled=True).order_by("pk"))
        except Exception as exc:
            logger.exception("dispatcher: could not list the sources of tenant %s", tenant_id)
            report.errors.append((None, f"tenant {tenant_id}: {type(exc).__name__}: {exc}"))
            continue
        for source in candidates:
            try:
                due = source_next_run_at(source)
                if due is None or due > now:
                    if source.backoff_until is not None and source.backoff_until > now:
                        report.backed_off.append(source.pk)
                    continue
                with tenant_context(tenant_id):
                    if _source_busy(source, now, report):
                        report.busy.append(source.pk)
                        continue
                run = source_sync_queue(tenant_id=tenant_id, source_id=source.pk, via="schedule")
                report.queued.append((tenant_id, source.pk, run.pk))
            except Exception as exc:
                logger.exception("dispatcher: could not queue source %s", source.pk)
                report.errors.append((source.pk, f"{type(exc).__name__}: {exc}"))


# -- reads for the status page and the API --------------------------------------------------------


@dataclass(frozen=True)
class SourceHealth:
    """One source's schedule and health at ``now``.

    ``lag_seconds``: now - last success (``None`` before the first success); ``late``: the lag
    passed twice the interval (or never succeeded after its first attempt, once that attempt
    ended); ``state``: ``disabled``, ``running``, ``queued``, ``failing`` (the last run failed; ``backed_off``
    while the backoff lasts), ``never`` (no run yet) or ``ok``; ``last_run`` the newest
    finished run (counts, error), ``active_run`` a queued or running one, ``progress`` the
    running one's done/total units with an estimate of the time left
    (:meth:`IngestionRun.progress_label`), else ``""``.
    """

    source: DataSource
    last_run: IngestionRun | None
    active_run: IngestionRun | None
    next_run_at: datetime | None
    lag_seconds: float | None
    late: bool
    backed_off: bool
    state: str
    progress: str = ""

    @property
    def failing(self) -> bool:
        return self.source.consecutive_failures > 0


def source_health_list(*, tenant_id: int, source_ids: list[int] | None = None) -> list[SourceHealth]:
    """Every source of the tenant (or those of ``source_ids``), by name, with its health. Runs
    inside the tenant's context.

    A ``running`` run whose source's run lock nobody holds is dead (its worker was killed): it is
    marked failed (abandoned) here first (:func:`runs_abandon`), so no page shows it running. The
    lock is taken for that (never waited for), so a run that starts meanwhile is never touched.
    """
    now = timezone.now()
    with tenant_context(tenant_id):
        sources = DataSource.objects.order_by("name", "slug")
        if source_ids is not None:
            sources = sources.filter(pk__in=source_ids)
        sources = list(sources)
        ids = [s.pk for s in sources]
        running = IngestionRun.objects.filter(source_id__in=ids, status=IngestionRun.Status.RUNNING)
        dead = []
        for source_id in sorted(set(running.values_list("source_id", flat=True))):
            with source_run_lock(source_id) as nobody_running:
                if nobody_running and runs_abandon(source_id=source_id, now=now):
                    dead.append(source_id)
        if dead:  # their failure counts changed
            sources = list(DataSource.objects.filter(pk__in=ids).order_by("name", "slug"))
        finished = {
            r.source_id: r
            for r in IngestionRun.objects.filter(source_id__in=ids, status__in=FINISHED)
            .exclude(status=IngestionRun.Status.SKIPPED)
            .order_by("source_id", "-created_at", "-id")
            .distinct("source_id")
        }
        active = {
            r.source_id: r
            for r in IngestionRun.objects.filter(source_id__in=ids, status__in=ACTIVE)
            .order_by("source_id", "-created_at", "-id")
            .distinct("source_id")
        }
    rows = []
    for source in sources:
        interval = timedelta(minutes=max(1, source.sync_interval_minutes))
        lag = (now - source.last_success_at).total_seconds() if source.last_success_at else None
        # Never succeeded after an attempt: late, unless that first attempt is still queued or running.
        late = (lag is not None and lag > 2 * interval.total_seconds()) or (
            lag is None and source.last_attempt_at is not None and source.pk not in active
        )
        backed_off = source.backoff_until is not None and source.backoff_until > now and source.consecutive_failures > 0
        run = active.get(source.pk)
        if not source.enabled:
            state = "disabled"
        elif run is not None:
            state = run.status
        elif source.consecutive_failures:
            state = "backed_off" if backed_off else "failing"
        elif source.last_success_at is None and source.pk not in finished:
            state = "never"
        else:
            state = "ok"
        rows.append(
            SourceHealth(
                source=source,
                last_run=finished.get(source.pk),
                active_run=run,
                next_run_at=source_next_run_at(source),
                lag_seconds=lag,
                late=late,
                backed_off=backed_off,
                state=state,
                progress=run.progress_label(now) if run is not None and run.started_at else "",
            )
        )
    return rows


def source_find_for_webhook(public_id: str) -> DataSource | None:
    """The data source with this public id in whichever tenant holds it, or ``None``.

    For unauthenticated webhook calls (the signature is checked next, with the source's own
    secret): looks in each tenant inside that tenant's context, no row-level-security bypass.
    """
    for tenant_id in Tenant.objects.order_by("pk").values_list("pk", flat=True):
        with tenant_context(tenant_id):
            source = DataSource.objects.filter(public_id=public_id).first()
        if source is not None:
            return source
    return None
