"""Writes for data sources: creating them, attaching them to projects, and ingestion runs.

Ingestion is idempotent and resumable: rows are upserted by (source, external id) and compared
by content hash, so an unchanged row costs one hash and no embedding; each batch commits on its
own, so a crashed run keeps what it wrote and the next run skips it; rows the connector no
longer yields are deleted only when a run completes, so a failed run loses nothing.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify

from kbportal.audit import audit_record
from kbportal.secrets import MASK, SecretsError, decrypt_value, encrypt_fields, is_encrypted, rotate_value
from kbportal.tenancy import tenant_context
from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.registry import build_connector, secret_fields
from sources.connectors.slack_messages import ts_key, valid_ts
from sources.embeddings import Embedder, get_embedder
from sources.models import DataSource, Document, IngestionRun, ProjectSource, SlackEventSeen
from sources.scheduling import run_claim, run_refuse, source_health_record, source_run_lock
from sources.text import identifier_terms

if TYPE_CHECKING:
    from sources.connectors.slack.events import SlackChange

logger = logging.getLogger(__name__)

BATCH_SIZE = 64
MAX_CONTENT_CHARS = 400_000  # keeps one row's tsvector under PostgreSQL's 1 MB limit

ProgressCallback = Callable[[int, int | None], None]


def source_create(
    *,
    tenant_id: int,
    kind: str,
    name: str,
    config: dict[str, Any],
    slug: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    sync_interval_minutes: int = 60,
    project_ids: Iterable[int] = (),
) -> DataSource:
    """Create a data source after validating ``config`` with its connector's model.

    Secret fields (``sources.connectors.registry.secret_fields``) are stored encrypted
    (``enc:v1:...``). URL fields must reach public addresses unless ``config`` carries
    ``"allow_private_network": true`` (callers are operators: the admin, management commands).
    Raises ``ConnectorError`` naming the kind and the invalid fields or the refused address.
    Runs inside the tenant's context; attaches the source to ``project_ids`` (projects of the
    same tenant). Writes the ``source.create`` audit event in the same transaction (config field
    names only: values may be secrets).
    """
    build_connector(kind, config, include=include, exclude=exclude)  # validation only
    with tenant_context(tenant_id):
        source = DataSource.objects.create(
            tenant_id=tenant_id,
            kind=kind,
            name=name,
            slug=slug or slugify(name)[:80] or kind,
            config=encrypt_fields(config, secret_fields(kind)),
            include=list(include or []),
            exclude=list(exclude or []),
            sync_interval_minutes=sync_interval_minutes,
        )
        for project_id in project_ids:
            ProjectSource.objects.create(tenant_id=tenant_id, project_id=project_id, source=source)
        audit_record(
            action="source.create",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data={"source": source.slug, "kind": kind, "name": name, "config_keys": sorted(config),
                  "projects": list(project_ids)},
        )  # fmt: skip
    return source


def source_label(source: DataSource) -> str:
    """How errors name a source: ``data source 'slug'``."""
    return f"data source {source.slug!r}"


def config_merge_secrets(*, kind: str, old: dict[str, Any], new: dict[str, Any], label: str) -> dict[str, Any]:
    """The config to store when ``new`` replaces ``old``: a secret left as ``MASK`` (what forms
    show) or equal to the stored plaintext keeps its stored ciphertext; other secrets are
    encrypted. Raises ``ConnectorError`` when ``MASK`` names a secret that was never set."""
    secrets = secret_fields(kind)
    merged: dict[str, Any] = {}
    for key, value in new.items():
        stored = old.get(key)
        if value == MASK:
            if stored is None:
                raise ConnectorError(f"{label}: config field {key!r} is {MASK!r} but no secret is stored; enter it")
            merged[key] = stored
        elif is_encrypted(stored) and isinstance(value, str) and not is_encrypted(value):
            try:
                same = decrypt_value(str(stored), label=label, field=key) == value
            except SecretsError:
                same = False
            merged[key] = stored if same else value
        else:
            merged[key] = value
    return encrypt_fields(merged, secrets)


def source_update_config(*, tenant_id: int, source_id: int, config: dict[str, Any]) -> DataSource:
    """Replace a source's config after validating it (secrets handled as in ``source_create``;
    a secret given as ``kbportal.secrets.MASK`` keeps its stored value). Raises ``ConnectorError``.
    Writes the ``source.update`` audit event in the same transaction (the names of the fields
    that changed, never values)."""
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        label = source_label(source)
        config = config_merge_secrets(kind=source.kind, old=source.config, new=config, label=label)
        build_connector(source.kind, config, include=source.include, exclude=source.exclude, source_label=label)
        changed = sorted(k for k in set(source.config) | set(config) if source.config.get(k) != config.get(k))
        source.config = config
        source.save(update_fields=["config"])
        audit_record(
            action="source.update",
            tenant_id=tenant_id,
            object_type="sources.datasource",
            object_id=source.pk,
            data={"source": source.slug, "changed_keys": changed},
        )
    return source


def source_secrets_rotate(*, tenant_id: int) -> int:
    """Re-encrypt every stored secret of the tenant's data sources with the first
    ``KB_SECRETS_KEY`` (plaintext secrets left from before encryption are encrypted too).

    Returns the number of fields rewritten. Raises ``ConnectorError`` naming the source and field
    when no configured key opens a value; sources before it stay rotated (one transaction each).
    """
    rotated = 0
    with tenant_context(tenant_id):
        sources = list(DataSource.objects.all())
    for source in sources:
        names = secret_fields(source.kind)
        config, count = dict(source.config), 0
        for key, value in source.config.items():
            if isinstance(value, str) and value and (is_encrypted(value) or key in names):
                try:
                    config[key] = rotate_value(value, label=source_label(source), field=key)
                except SecretsError as exc:
                    raise ConnectorError(str(exc)) from exc
                count += 1
        if count:
            with tenant_context(tenant_id):
                DataSource.objects.filter(pk=source.pk).update(config=config)
            rotated += count
    return rotated


def ingestion_run_create(*, tenant_id: int, source_id: int) -> IngestionRun:
    """A queued run for the source (what "sync now" and the scheduler create before enqueuing)."""
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        return IngestionRun.objects.create(tenant_id=tenant_id, source=source)


class _Batcher:
    """Upserts rows of one run in batches, each batch one transaction in the tenant's context."""

    def __init__(
        self,
        *,
        tenant_id: int,
        source_id: int,
        generation: int,
        run: IngestionRun | None,
        report: IngestReport,
        maintain_term_stats: bool = False,
    ):
        self.tenant_id = tenant_id
        self.source_id = source_id
        self.generation = generation
        self.run = run  # None for a partial (live) update: counts stay in ``counts``
        self.report = report
        # A full run recomputes term statistics at its end; a partial update keeps them current
        # row by row, so new words are searchable (lexically) at once.
        self.maintain_term_stats = maintain_term_stats
        self.counts: dict[str, int] = {"seen": 0, "created": 0, "updated": 0, "unchanged": 0, "embedded": 0}
        self.pending: list[DocumentRow] = []
        self.seen_ids: set[str] = set()
        self.embedder: Embedder | None = None

    def add(self, row: DocumentRow, report: IngestReport) -> None:
        if not row.external_id:
            report.skip(row.title or "<untitled>", "row has no external id")
            return
        if row.external_id in self.seen_ids:
            report.skip(row.external_id, "duplicate external id in one run; kept the first")
            return
        self.seen_ids.add(row.external_id)
        if len(row.content) > MAX_CONTENT_CHARS:
            row.content = row.content[:MAX_CONTENT_CHARS]
            row.metadata = {**row.metadata, "truncated": True}
        self.pending.append(row)
        if len(self.pending) >= BATCH_SIZE:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        rows, self.pending = self.pending, []
        hashes = {r.external_id: r.content_hash() for r in rows}
        with tenant_context(self.tenant_id):
            existing = {
                d["external_id"]: d
                for d in Document.objects.filter(source_id=self.source_id, external_id__in=list(hashes)).values(
                    "id", "external_id", "content_hash", "text"
                )
            }
            unchanged_ids = [
                existing[r.external_id]["id"]
                for r in rows
                if r.external_id in existing and existing[r.external_id]["content_hash"] == hashes[r.external_id]
            ]
            changed = [
                r
                for r in rows
                if r.external_id not in existing or existing[r.external_id]["content_hash"] != hashes[r.external_id]
            ]
            # Embed only rows whose embedded text changed; a metadata-only change keeps its vector.
            need_vector = [
                r for r in changed if r.external_id not in existing or existing[r.external_id]["text"] != r.embed_text
            ]
            vectors: dict[str, list[float]] = {}
            if need_vector:
                if self.embedder is None:
                    self.embedder = get_embedder()
                for row, vector in zip(
                    need_vector, self.embedder.embed([r.embed_text for r in need_vector]), strict=False
                ):
                    vectors[row.external_id] = vector
            creates, updates = [], []
            now = timezone.now()
            for r in changed:
                fields = dict(
                    kind=r.kind,
                    title=r.title[:1000],
                    url=r.url[:2000],
                    path=r.path[:1000],
                    start_line=r.start_line,
                    end_line=r.end_line,
                    position=r.position,
                    parent_external_id=(r.parent_external_id or "")[:512],
                    content=r.content,
                    text=r.embed_text,
                    search_terms=identifier_terms(f"{r.title}\n{r.content}"),
                    metadata=r.metadata,
                    principals=r.principals,
                    content_hash=hashes[r.external_id],
                    generation=self.generation,
                    indexed_at=now,
                    created_at=r.created_at,
                    updated_at=r.updated_at or r.created_at,
                )
                if r.external_id in existing:
                    doc = Document(
                        id=existing[r.external_id]["id"],
                        external_id=r.external_id,
                        tenant_id=self.tenant_id,
                        source_id=self.source_id,
                        **fields,
                    )
                    if r.external_id in vectors:
                        doc.embedding = vectors[r.external_id]
                    updates.append((doc, r.external_id in vectors))
                else:
                    creates.append(
                        Document(
                            tenant_id=self.tenant_id,
                            source_id=self.source_id,
                            external_id=r.external_id,
                            embedding=vectors.get(r.external_id),
                            **fields,
                        )
                    )
            update_fields = [
                "kind", "title", "url", "path", "start_line", "end_line", "position", "parent_external_id",
                "content", "text", "search_terms", "metadata", "principals", "content_hash", "generation",
                "created_at", "updated_at", "indexed_at",
            ]  # fmt: skip
            writes = [(doc, "create") for doc in creates] + [
                (doc, "update+vector" if has else "update") for doc, has in updates
            ]
            replaced_ids = [doc.pk for doc, _ in updates]
            if self.maintain_term_stats:
                _term_stats_adjust(self.tenant_id, self.source_id, replaced_ids, -1)
            failed = self._write(writes, update_fields)
            creates = [d for d in creates if d.external_id not in failed]
            updates = [(d, has) for d, has in updates if d.external_id not in failed]
            if self.maintain_term_stats:
                # A refused update left the old row, whose counts come back here too.
                _term_stats_adjust(self.tenant_id, self.source_id, replaced_ids + [d.pk for d in creates], +1)
                _indexed_rows_adjust(self.source_id, len(creates))
            batch = {
                "seen": len(rows),
                "created": len(creates),
                "updated": len(updates),
                "unchanged": len(unchanged_ids),
                "embedded": len(vectors),
            }
            for key, value in batch.items():
                self.counts[key] += value
            if self.run is not None:
                run = self.run
                run.seen += batch["seen"]
                run.created += batch["created"]
                run.updated += batch["updated"]
                run.unchanged += batch["unchanged"]
                run.embedded += batch["embedded"]
                IngestionRun.objects.filter(pk=run.pk).update(
                    seen=run.seen,
                    created=run.created,
                    updated=run.updated,
                    unchanged=run.unchanged,
                    embedded=run.embedded,
                )

    def _write(self, writes: list[tuple[Document, str]], update_fields: list[str]) -> set[str]:
        """Write the batch; if PostgreSQL refuses it, write row by row and skip the bad rows.

        Returns the external ids that could not be stored (recorded on the run; an existing
        row keeps its previous version, so nothing is lost).
        """
        try:
            with transaction.atomic():
                self._write_many(writes, update_fields)
            return set()
        except DatabaseError:
            pass
        failed: set[str] = set()
        for doc, mode in writes:
            try:
                with transaction.atomic():
                    self._write_many([(doc, mode)], update_fields)
            except DatabaseError as exc:
                eid = doc.external_id or str(doc.pk)
                failed.add(eid)
                self.report.skip(eid, f"could not be stored: {str(exc).splitlines()[0][:300]}")
        return failed

    @staticmethod
    def _write_many(writes: list[tuple[Document, str]], update_fields: list[str]) -> None:
        creates = [d for d, mode in writes if mode == "create"]
        with_vec = [d for d, mode in writes if mode == "update+vector"]
        without_vec = [d for d, mode in writes if mode == "update"]
        if creates:
            Document.objects.bulk_create(creates)
        if with_vec:
            Document.objects.bulk_update(with_vec, update_fields + ["embedding"])
        if without_vec:
            Document.objects.bulk_update(without_vec, update_fields)


def _link_parents(source_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE sources_document AS child SET parent_id = parent.id
            FROM sources_document AS parent
            WHERE child.source_id = %s AND parent.source_id = child.source_id
              AND child.parent_external_id <> '' AND parent.external_id = child.parent_external_id
              AND child.parent_id IS DISTINCT FROM parent.id
            """,
            [source_id],
        )
        cursor.execute(
            "UPDATE sources_document SET parent_id = NULL WHERE source_id = %s AND parent_external_id = '' "
            "AND parent_id IS NOT NULL",
            [source_id],
        )


def _delete_unseen(source_id: int, seen_ids: set[str]) -> int:
    """Delete the source's rows whose external id the run did not yield; returns the count."""
    seen = list(seen_ids)
    with connection.cursor() as cursor:
        # Children that stay must not point at a parent that goes.
        cursor.execute(
            """
            UPDATE sources_document SET parent_id = NULL
            WHERE source_id = %s AND parent_id IN (
                SELECT id FROM sources_document WHERE source_id = %s AND NOT (external_id = ANY(%s))
            )
            """,
            [source_id, source_id, seen],
        )
        cursor.execute(
            "DELETE FROM sources_document WHERE source_id = %s AND NOT (external_id = ANY(%s))", [source_id, seen]
        )
        return cursor.rowcount


def source_refresh_term_stats(source_id: int) -> int:
    """Recompute the source's lexeme document frequencies and row count; returns the row count.

    Runs inside the caller's tenant context. Source: PostgreSQL ``ts_stat`` over the rows'
    generated ``search_vector``; the counts feed IDF in retrieval.
    """
    source_id = int(source_id)  # ts_stat takes SQL text: the id is an int literal, nothing else
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM sources_termstat WHERE source_id = %s", [source_id])
        cursor.execute(
            f"""
            INSERT INTO sources_termstat (tenant_id, source_id, lexeme, ndoc)
            SELECT s.tenant_id, s.id, st.word, st.ndoc
            FROM sources_datasource s,
                 ts_stat('SELECT search_vector FROM sources_document WHERE source_id = {source_id}') AS st
            WHERE s.id = %s AND length(st.word) <= 255
            """,
            [source_id],
        )
        cursor.execute(
            "UPDATE sources_datasource SET indexed_rows = "
            "(SELECT count(*) FROM sources_document WHERE source_id = %s) WHERE id = %s RETURNING indexed_rows",
            [source_id, source_id],
        )
        row = cursor.fetchone()
        # Fresh planner statistics, or the champion-list update below and the first searches
        # after a large refresh are planned as if the table were still empty
        # (bench/search_latency.py at 100k rows: term lookup median 110 ms before autovacuum's
        # ANALYZE, 2.7 ms after; the champion update ran for over 12 minutes instead of
        # seconds, see source_refresh_champions). Needs MAINTAIN (granted on PostgreSQL 17+ by
        # kbportal.apps.grant_app_role); without it PostgreSQL only warns.
        cursor.execute("ANALYZE sources_termstat")
    source_refresh_champions(source_id)
    return int(row[0]) if row else 0


CHAMPION_MIN_DF = 5000  # a lexeme in more of one source's rows than this gets a champion list (retrieval's MAX_TERM_DF)
CHAMPIONS_PER_TERM = 400  # ... of this many rows
BM25_K1, BM25_B = 1.2, 0.75


def source_refresh_champions(
    source_id: int, *, min_df: int = CHAMPION_MIN_DF, per_term: int = CHAMPIONS_PER_TERM
) -> int:
    """Store, for each of the source's common lexemes (``ndoc > min_df``), the ids of the
    ``per_term`` rows where it weighs most: ``TermStat.champions``, best first. Returns how many
    lexemes got a list. Runs inside the caller's tenant context; one pass over the source's rows.

    Weight of lexeme t in row d: the BM25 term-frequency part (Robertson & Zaragoza, "The
    Probabilistic Relevance Framework: BM25 and Beyond", 2009, eq. 3.15),
    ``tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avg|d|))`` with k1 = 1.2, b = 0.75, where tf counts
    the lexeme's positions, a title position as 10 and a path position as 4 (PostgreSQL's
    default A/B/D weights 1.0/0.4/0.1, relative to body text), and ``|d|`` is the row's number of
    distinct lexemes. These are the "champion lists" of Manning, Raghavan & Schütze,
    *Introduction to Information Retrieval*, 2008, section 7.1.3: retrieval ranks only them for a
    lexeme too common to rank every row holding it.
    """
    source_id = int(source_id)
    params: dict[str, Any] = {"s": source_id, "min_df": min_df, "n": per_term, "k1": BM25_K1, "b": BM25_B}
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE sources_termstat SET champions = NULL WHERE source_id = %s AND champions IS NOT NULL", [source_id]
        )
        # The common lexemes and the average length are computed first and passed as values: as
        # subqueries of the one statement, the planner (misjudging a freshly written term table)
        # re-ran them for every row and the update took over 12 minutes at 25k rows.
        cursor.execute(
            "SELECT coalesce(array_agg(lexeme), '{}') FROM sources_termstat "
            "WHERE source_id = %(s)s AND ndoc > %(min_df)s",
            params,
        )
        params["common"] = list(cursor.fetchone()[0])
        if not params["common"]:
            return 0
        cursor.execute(
            "SELECT greatest(avg(length(search_vector)), 1)::float8 FROM sources_document WHERE source_id = %(s)s",
            params,
        )
        params["avglen"] = float(cursor.fetchone()[0])
        cursor.execute(
            """
            WITH tf AS (
                SELECT u.lexeme, d.id, length(d.search_vector)::float8 AS len,
                       (cardinality(u.positions) + 9 * cardinality(array_positions(u.weights, 'A'))
                        + 3 * cardinality(array_positions(u.weights, 'B')))::float8 AS tf
                FROM sources_document d, unnest(d.search_vector) AS u
                WHERE d.source_id = %(s)s AND u.lexeme = ANY(%(common)s::text[])
            ), ranked AS (
                SELECT tf.lexeme, tf.id, row_number() OVER (
                    PARTITION BY tf.lexeme
                    ORDER BY tf.tf * (%(k1)s + 1)
                             / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * tf.len / %(avglen)s)) DESC,
                             tf.id
                ) AS r
                FROM tf
            )
            UPDATE sources_termstat AS t SET champions = c.ids
            FROM (SELECT lexeme, array_agg(id ORDER BY r) AS ids FROM ranked WHERE r <= %(n)s GROUP BY lexeme) AS c
            WHERE t.source_id = %(s)s AND t.lexeme = c.lexeme
            """,
            params,
        )
        return cursor.rowcount


def _connector_resume(connector: Connector, *, tenant_id: int, source_id: int) -> bool:
    """Hand the connector the source's cursor, the newest ``updated_at`` among its stored rows
    (``Connector.resume_from``); true when the run is partial, so unseen rows must stay."""
    with tenant_context(tenant_id):
        cursor = Document.objects.filter(source_id=source_id).aggregate(cursor=Max("updated_at"))["cursor"]
    return connector.resume_from(cursor)


def source_ingest(
    *,
    tenant_id: int,
    source_id: int,
    run_id: int | None = None,
    progress: ProgressCallback | None = None,
) -> IngestionRun:
    """Run the source's connector under the source's run lock (``sources.scheduling``).

    Only one run of a source runs at a time, across processes: when another holds the lock,
    the run (``run_id``, or a new one) is recorded as ``skipped`` with the reason and returned
    at once. Otherwise as :func:`_source_ingest`; a ``run_id`` that already finished (a
    redelivered task message) is returned untouched. The source's health (last success,
    consecutive failures, backoff) is updated from the outcome.
    """
    with source_run_lock(source_id) as held:
        if not held:
            return run_refuse(tenant_id=tenant_id, source_id=source_id, run_id=run_id)
        return _source_ingest(tenant_id=tenant_id, source_id=source_id, run_id=run_id, progress=progress)


def _source_ingest(
    *,
    tenant_id: int,
    source_id: int,
    run_id: int | None = None,
    progress: ProgressCallback | None = None,
) -> IngestionRun:
    """Run the source's connector and bring its rows in the unified table up to date.

    Returns the finished :class:`IngestionRun` (status ``succeeded``, ``partial`` when items were
    skipped, or ``failed`` with the error text). Never raises for a connector or data error: the
    failure is recorded and earlier rows stay intact. ``progress(done, total)`` is called after
    each row, in the connector's units (files) when it counts them, else in rows with ``total``
    ``None``. Runs every write inside the tenant's context.
    """
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        run = run_claim(tenant_id=tenant_id, source=source, run_id=run_id)
        if run is None:  # a redelivered message of a run that already finished
            return IngestionRun.objects.get(pk=run_id)
        generation = source.generation + 1
        run.status = IngestionRun.Status.RUNNING
        run.generation = generation
        run.started_at = timezone.now()
        run.save(update_fields=["status", "generation", "started_at"])
        kind, config, include, exclude = source.kind, source.config, source.include, source.exclude
        label = source_label(source)

    report = IngestReport()
    batcher = _Batcher(tenant_id=tenant_id, source_id=source_id, generation=generation, run=run, report=report)
    status, error = IngestionRun.Status.SUCCEEDED, ""
    try:
        connector = build_connector(kind, config, include=include, exclude=exclude, source_label=label)
        connector.bind_source(tenant_id=tenant_id, source_id=source_id)
        partial = _connector_resume(connector, tenant_id=tenant_id, source_id=source_id)
        rows = 0
        for row in connector.iter_rows(report):
            batcher.add(row, report)
            rows += 1
            if progress:
                # Units the connector counts (files, day files) when it counts them, else rows.
                if report.done:
                    progress(report.done, report.total)
                else:
                    progress(rows, None)
        batcher.flush()
        with tenant_context(tenant_id):
            _link_parents(source_id)
            # Rows the connector no longer yields. Unchanged rows are not rewritten (that would
            # touch every index, the HNSW one included); the seen ids decide instead.
            # An incremental run yields only what changed: the rows it did not yield stay.
            run.deleted = 0 if partial else _delete_unseen(source_id, batcher.seen_ids)
            DataSource.objects.filter(pk=source_id).update(generation=generation, last_synced_at=timezone.now())
            source_refresh_term_stats(source_id)
        if report.skipped:
            status = IngestionRun.Status.PARTIAL
    except ConnectorError as exc:
        status, error = IngestionRun.Status.FAILED, str(exc)
    except Exception as exc:  # recorded on the run; the traceback goes to the log
        logger.exception("ingestion of source %s failed", source_id)
        status, error = IngestionRun.Status.FAILED, f"{type(exc).__name__}: {exc}"
    with tenant_context(tenant_id):
        run.status = status
        run.error = error
        run.skipped = len(report.skipped)
        run.skipped_items = report.skipped[:1000]
        run.finished_at = timezone.now()
        run.save(
            update_fields=[
                "status", "error", "skipped", "skipped_items", "finished_at", "deleted",
                "seen", "created", "updated", "unchanged", "embedded",
            ]
        )  # fmt: skip
        source_health_record(source_id=source_id, run=run)
    return run


# -- partial updates (live sources) -----------------------------------------------------------


def _term_stats_adjust(tenant_id: int, source_id: int, document_ids: list[int], sign: int) -> None:
    """Add (``sign`` +1) or remove (-1) the lexemes of these rows' ``search_vector`` to the source's
    ``TermStat`` counts, so IDF stays right between full runs. Runs in the caller's tenant context."""
    if not document_ids:
        return
    counts = """
        SELECT lexeme, count(*) AS n
        FROM sources_document d, unnest(tsvector_to_array(d.search_vector)) AS lexeme
        WHERE d.id = ANY(%(ids)s) AND d.source_id = %(source)s AND length(lexeme) <= 255
        GROUP BY lexeme
    """
    params: dict[str, Any] = {"ids": list(document_ids), "source": source_id, "tenant": tenant_id}
    with connection.cursor() as cursor:
        if sign > 0:
            cursor.execute(
                f"""
                INSERT INTO sources_termstat (tenant_id, source_id, lexeme, ndoc)
                SELECT %(tenant)s, %(source)s, c.lexeme, c.n FROM ({counts}) AS c
                ON CONFLICT (source_id, lexeme) DO UPDATE SET ndoc = sources_termstat.ndoc + EXCLUDED.ndoc
                """,
                params,
            )
        else:
            cursor.execute(
                f"""
                UPDATE sources_termstat AS t SET ndoc = greatest(t.ndoc - c.n, 0)
                FROM ({counts}) AS c WHERE t.source_id = %(source)s AND t.lexeme = c.lexeme
                """,
                params,
            )
            cursor.execute("DELETE FROM sources_termstat WHERE source_id = %s AND ndoc = 0", [source_id])


def _indexed_rows_adjust(source_id: int, delta: int) -> None:
    if delta:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE sources_datasource SET indexed_rows = greatest(indexed_rows + %s, 0) WHERE id = %s",
                [delta, source_id],
            )


def source_rows_upsert(*, tenant_id: int, source_id: int, rows: Iterable[DocumentRow]) -> dict[str, Any]:
    """Write these rows of a source (a partial update: rows not given are left alone).

    The same path as a full run: upsert by external id, compare by content hash, embed only
    rows whose embedded text changed; term statistics and the source's row count are adjusted
    in the same transaction, so new words are searchable at once. Returns ``{"seen", "created",
    "updated", "unchanged", "embedded", "skipped": [{item, reason}]}`` (rows). Raises
    ``DataSource.DoesNotExist`` when the source is gone. Runs inside the tenant's context.
    """
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
        generation = source.generation
    report = IngestReport()
    batcher = _Batcher(
        tenant_id=tenant_id,
        source_id=source_id,
        generation=generation,
        run=None,
        report=report,
        maintain_term_stats=True,
    )
    rows = list(rows)
    for row in rows:
        batcher.add(row, report)
    batcher.flush()
    if any(row.parent_external_id for row in rows):
        with tenant_context(tenant_id):
            _link_parents(source_id)
    for item in report.skipped:
        logger.warning("source %s: row %s not written: %s", source_id, item["item"], item["reason"])
    return {**batcher.counts, "skipped": report.skipped}


def source_rows_delete(*, tenant_id: int, source_id: int, external_ids: Iterable[str]) -> int:
    """Delete these rows of a source (a partial update); returns how many existed.

    Children pointing at a deleted row are unlinked; term statistics and the row count are
    adjusted in the same transaction. Runs inside the tenant's context.
    """
    external_ids = [str(e) for e in external_ids if e]
    if not external_ids:
        return 0
    with tenant_context(tenant_id):
        ids = list(
            Document.objects.filter(source_id=source_id, external_id__in=external_ids).values_list("id", flat=True)
        )
        if not ids:
            return 0
        _term_stats_adjust(tenant_id, source_id, ids, -1)
        Document.objects.filter(source_id=source_id, parent_id__in=ids).update(parent_id=None)
        deleted, _ = Document.objects.filter(pk__in=ids).delete()
        _indexed_rows_adjust(source_id, -len(ids))
    return len(ids)


# -- live Slack -------------------------------------------------------------------------------


def _slack_channel_lock(source_id: int, channel: str) -> None:
    """Serialise refreshes of one channel of one source until the current transaction ends.

    Two workers refreshing the same thread could otherwise write an older fetch over a newer
    one (and a purge could be undone by a refresh that fetched before the deletion).
    """
    key = zlib.crc32(channel.encode()) - 2**31  # int4 range for the two-key advisory lock
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [int(source_id) % 2**31, key])


def _stale_conversations(source_id: int, channel: str, lo_ts: str, hi_ts: str, keep: set[str]) -> list[str]:
    """External ids of the channel's stored conversation rows overlapping ``[lo_ts, hi_ts]``, not in ``keep``."""
    lo, hi = ts_key(lo_ts), ts_key(hi_ts)
    stored = Document.objects.filter(
        source_id=source_id, kind="conversation", metadata__contains={"channel_id": channel}
    ).values_list("external_id", "metadata__first_ts", "metadata__last_ts")
    return [
        external_id
        for external_id, first_ts, last_ts in stored
        if external_id not in keep
        and valid_ts(first_ts)
        and valid_ts(last_ts)
        and ts_key(first_ts) <= hi
        and ts_key(last_ts) >= lo
    ]


def _stale_bursts(source_id: int, parents: set[str], keep: set[str]) -> list[str]:
    """External ids of the stored ``burst`` rows whose parent is in ``parents``, not in ``keep``."""
    return list(
        Document.objects.filter(source_id=source_id, kind="burst", parent_external_id__in=sorted(parents))
        .exclude(external_id__in=sorted(keep))
        .values_list("external_id", flat=True)
    )


def slack_thread_refresh(*, tenant_id: int, source_id: int, channel: str, thread_ts: str) -> dict[str, Any]:
    """Re-fetch one Slack thread (``conversations.replies``) and write it back as one row.

    The thread row is replaced whole (parent, replies, participants, last activity), or deleted
    when Slack has no thread there any more; when the parent is or becomes a loose message the
    conversation rows around it are rebuilt too (stale ones deleted). Burst rows of the thread
    and of those conversations that the refresh no longer yields are deleted. Holds a per-channel
    advisory lock from fetch to write. Returns ``{"thread": "written"|"deleted"|"none",
    "written", "embedded", "deleted"}`` (row counts). Raises ``DataSource.DoesNotExist``,
    ``ConnectorError`` for a source that is not ``slack``, and ``SlackError``/``SlackRateLimited``
    (with ``retry_after`` seconds) from the Web API.
    """
    with tenant_context(tenant_id):
        source = DataSource.objects.get(pk=source_id)
    if source.kind != "slack":
        raise ConnectorError(f"data source {source.slug!r} is a {source.kind!r} source, not 'slack'")
    connector: Any = build_connector(  # a SlackConnector (checked above), which refreshes threads
        source.kind, source.config, include=source.include, exclude=source.exclude, source_label=source_label(source)
    )
    connector.bind_source(tenant_id=tenant_id, source_id=source_id)
    thread_id = f"{channel}:{thread_ts}"
    with transaction.atomic():
        _slack_channel_lock(source_id, channel)
        with tenant_context(tenant_id):
            had_thread = Document.objects.filter(source_id=source_id, external_id=thread_id).exists()
        refresh = connector.refresh_thread(channel, thread_ts, had_thread_row=had_thread)
        rows = [refresh.thread_row, *refresh.burst_rows] if refresh.thread_row is not None else []
        stale: list[str] = [] if refresh.thread_row is not None or not had_thread else [thread_id]
        if refresh.window is not None:
            rows += refresh.window.rows
            with tenant_context(tenant_id):
                stale += _stale_conversations(
                    source_id,
                    channel,
                    refresh.window.lo_ts,
                    refresh.window.hi_ts,
                    keep={row.external_id for row in refresh.window.rows},
                )
        # Bursts of every parent rewritten or deleted here that the refresh did not yield again.
        parents = {thread_id, *stale, *(row.external_id for row in rows if row.kind != "burst")}
        with tenant_context(tenant_id):
            stale += _stale_bursts(source_id, parents, keep={row.external_id for row in rows})
        deleted = source_rows_delete(tenant_id=tenant_id, source_id=source_id, external_ids=stale)
        counts = source_rows_upsert(tenant_id=tenant_id, source_id=source_id, rows=rows)
    state = "written" if refresh.thread_row is not None else ("deleted" if had_thread else "none")
    return {
        "thread": state,
        "written": counts["created"] + counts["updated"],
        "embedded": counts["embedded"],
        "deleted": deleted,
    }


def slack_message_purge(*, tenant_id: int, source_id: int, channel: str, ts: str, thread_ts: str) -> int:
    """Delete at once every row of the source that holds the Slack message ``ts``; returns the count.

    That is its thread's row (``<channel>:<thread_ts>``), the thread it started
    (``<channel>:<ts>``), the conversation row spanning it, and the ``burst`` rows of all of
    these. Called on ``message_deleted`` before the refresh is queued, so a deleted message is
    never cited again even while the refresh waits; the refresh then writes back what remains.
    """
    with transaction.atomic():
        _slack_channel_lock(source_id, channel)
        with tenant_context(tenant_id):
            holders = _stale_conversations(source_id, channel, ts, ts, keep=set())
        ids = {f"{channel}:{thread_ts}", f"{channel}:{ts}", *holders}
        with tenant_context(tenant_id):
            ids.update(_stale_bursts(source_id, ids, keep=set()))
        return source_rows_delete(tenant_id=tenant_id, source_id=source_id, external_ids=sorted(ids))


def slack_event_claim(*, tenant_id: int, source_id: int, event_id: str) -> bool:
    """Record an Events API ``event_id`` for the source; false when it was already recorded.

    The durable half of the listener's dedupe (a unique constraint), so a redelivery after a
    restart is still applied once. Runs inside the tenant's context.
    """
    with tenant_context(tenant_id):
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO sources_slackeventseen (tenant_id, source_id, event_id, created_at) "
                "VALUES (%s, %s, %s, now()) ON CONFLICT (source_id, event_id) DO NOTHING RETURNING id",
                [tenant_id, source_id, event_id[:64]],
            )
            return cursor.fetchone() is not None


def slack_event_apply(
    *,
    tenant_id: int,
    source_id: int,
    change: SlackChange,
    enqueue: Callable[[int, int, str, str], Any],
) -> bool:
    """Apply one Slack message event: claim its id, purge a deleted message's rows, queue the refresh.

    ``enqueue(tenant_id, source_id, channel, thread_ts)`` queues the thread refresh (the
    ``sources.slack_refresh_thread`` task); it runs after the claim commits. Returns false (and
    does nothing) for an event id already claimed. Raises what the database raises; then the
    claim is rolled back and a redelivery is applied.
    """
    with transaction.atomic():
        if not slack_event_claim(tenant_id=tenant_id, source_id=source_id, event_id=change.event_id):
            return False
        if change.action == "delete":
            slack_message_purge(
                tenant_id=tenant_id, source_id=source_id, channel=change.channel, ts=change.ts,
                thread_ts=change.thread_ts,
            )  # fmt: skip
        transaction.on_commit(lambda: enqueue(tenant_id, source_id, change.channel, change.thread_ts))
    return True


def slack_events_prune(*, tenant_id: int, source_id: int, older_than_hours: float = 72.0) -> int:
    """Forget claimed event ids older than ``older_than_hours`` (Slack retries within hours); returns the count."""
    cutoff = timezone.now() - timedelta(hours=older_than_hours)
    with tenant_context(tenant_id):
        deleted, _ = SlackEventSeen.objects.filter(source_id=source_id, created_at__lt=cutoff).delete()
    return deleted
