"""Ingestion: a full run of a data source (:func:`source_ingest`) and partial updates of live
sources (:func:`source_rows_upsert`, :func:`source_rows_delete`), through one batcher.

Ingestion is idempotent and resumable: rows are upserted by (source, external id) and compared
by content hash, so an unchanged row costs one hash and no embedding; each batch commits on its
own, so a crashed run keeps what it wrote and the next run skips it; rows the connector no
longer yields are deleted only when a run completes, so a failed run loses nothing."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from kbportal.tenancy import current_tenant_id, tenant_context
from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.registry import build_connector
from sources.embeddings import Embedder, get_embedder
from sources.models import DataSource, Document, IngestionRun
from sources.scheduling import run_claim, run_refuse, source_health_record, source_run_lock
from sources.services.catalog import source_label
from sources.services.directory import source_directory_store
from sources.services.term_stats import (
    indexed_rows_adjust,
    source_refresh_embedding_duplicates,
    source_refresh_term_stats,
    term_stats_adjust,
)
from sources.text import identifier_terms

logger = logging.getLogger(__name__)


BATCH_SIZE = 64
MAX_CONTENT_CHARS = 400_000  # keeps one row's tsvector under PostgreSQL's 1 MB limit

ProgressCallback = Callable[[int, int | None], None]
MAX_UNITS = 2_147_483_647  # PostgreSQL integer, the columns of IngestionRun.units_done/units_total


def _record_units(run: IngestionRun, report: IngestReport) -> None:
    """Copy ``report``'s progress onto ``run`` (not saved) as its columns hold it: done and total
    within 0..``MAX_UNITS`` (a remote API's count may be anything; a total of ``None`` stays
    unknown), the unit's label cut to its 20 characters."""
    run.units_done = min(max(report.done, 0), MAX_UNITS)
    run.units_total = None if report.total is None else min(max(report.total, 0), MAX_UNITS)
    run.units_label = report.unit[:20]


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
            indexed = _indexed_texts(self.source_id, [r for r in changed if r.external_id in vectors])
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
                    # A copy of a text the index holds never enters it (an HNSW graph keeps what it
                    # was given until a vacuum: identical vectors there trap searches meanwhile).
                    text_key = _text_key(r.kind, r.embed_text, r.principals)
                    duplicate = r.external_id in vectors and text_key in indexed
                    indexed.add(text_key)
                    creates.append(
                        Document(
                            tenant_id=self.tenant_id,
                            source_id=self.source_id,
                            external_id=r.external_id,
                            embedding=vectors.get(r.external_id),
                            embedding_duplicate=duplicate,
                            **fields,
                        )
                    )
            update_fields = [
                "kind",
                "title",
                "url",
                "path",
                "start_line",
                "end_line",
                "position",
                "parent_external_id",
                "content",
                "text",
                "search_terms",
                "metadata",
                "principals",
                "content_hash",
                "generation",
                "created_at",
                "updated_at",
                "indexed_at",
            ]
            writes = [(doc, "create") for doc in creates] + [
                (doc, "update+vector" if has else "update") for doc, has in updates
            ]
            replaced_ids = [doc.pk for doc, _ in updates]
            if self.maintain_term_stats:
                term_stats_adjust(self.tenant_id, self.source_id, replaced_ids, -1)
            failed = self._write(writes, update_fields)
            creates = [d for d in creates if d.external_id not in failed]
            updates = [(d, has) for d, has in updates if d.external_id not in failed]
            if self.maintain_term_stats:
                # A refused update left the old row, whose counts come back here too.
                term_stats_adjust(self.tenant_id, self.source_id, replaced_ids + [d.pk for d in creates], +1)
                indexed_rows_adjust(self.source_id, len(creates))
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
                _record_units(run, self.report)
                IngestionRun.objects.filter(pk=run.pk).update(
                    seen=run.seen,
                    created=run.created,
                    updated=run.updated,
                    unchanged=run.unchanged,
                    embedded=run.embedded,
                    units_done=run.units_done,
                    units_total=run.units_total,
                    units_label=run.units_label,
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


# A run changing at most this share of a maintained source's rows keeps the term statistics it
# adjusted as it wrote; a larger one recounts them (and the champion lists) from every row.
SMALL_RUN_SHARE = 0.02
_UNSEEN = (
    "source_id = %(source)s AND NOT (external_id = ANY(%(seen)s)) AND NOT (external_id = ANY(%(kept)s))"
    " AND NOT (parent_external_id = ANY(%(kept)s))"
)


def _delete_unseen(
    source_id: int, seen_ids: set[str], kept_ids: Iterable[str] = (), *, maintained: bool = False
) -> int:
    """Delete the source's rows whose external id the run did not yield, except the rows it
    kept unread (``IngestReport.keep``: those ids and their children); returns the count.
    ``maintained``: take the deleted rows out of the term statistics and the row count first."""
    params: dict[str, Any] = {"source": source_id, "seen": list(seen_ids), "kept": list(kept_ids)}
    with connection.cursor() as cursor:
        if maintained:
            cursor.execute(f"SELECT id FROM sources_document WHERE {_UNSEEN}", params)
            gone = [row[0] for row in cursor.fetchall()]
            term_stats_adjust(current_tenant_id() or 0, source_id, gone, -1)
            indexed_rows_adjust(source_id, -len(gone))
        # Children that stay must not point at a parent that goes.
        cursor.execute(
            f"""
            UPDATE sources_document SET parent_id = NULL
            WHERE source_id = %(source)s AND parent_id IN (SELECT id FROM sources_document WHERE {_UNSEEN})
            """,
            params,
        )
        cursor.execute(f"DELETE FROM sources_document WHERE {_UNSEEN}", params)
        return cursor.rowcount


def _count_kept(source_id: int, kept_ids: set[str]) -> int:
    """How many stored rows the run kept unread (``IngestReport.keep``)."""
    if not kept_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM sources_document WHERE source_id = %s"
            " AND (external_id = ANY(%s) OR parent_external_id = ANY(%s))",
            [source_id, list(kept_ids), list(kept_ids)],
        )
        return int(cursor.fetchone()[0])


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
        indexed_before = source.indexed_rows
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
    # A source with rows keeps its term statistics current batch by batch (as live updates do),
    # so a run that changes little need not recount every row at its end.
    maintained = indexed_before > 0
    batcher = _Batcher(
        tenant_id=tenant_id,
        source_id=source_id,
        generation=generation,
        run=run,
        report=report,
        maintain_term_stats=maintained,
    )
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
        if progress:  # the end, also of units kept unread (no row to report them with)
            progress(report.done or rows, report.total if report.done else None)
        batcher.flush()
        with tenant_context(tenant_id):
            _link_parents(source_id)
            # The people and groups the connector saw; a full run's replace the stored ones.
            source_directory_store(source_id=source_id, directory=connector.directory, replace=not partial)
            # Rows the connector no longer yields. Unchanged rows are not rewritten (that would
            # touch every index, the HNSW one included); the seen ids decide instead.
            # An incremental run yields only what changed: the rows it did not yield stay.
            run.deleted = (
                0 if partial else _delete_unseen(source_id, batcher.seen_ids, report.kept, maintained=maintained)
            )
            kept = _count_kept(source_id, report.kept - batcher.seen_ids)
            run.seen += kept
            run.unchanged += kept
            DataSource.objects.filter(pk=source_id).update(generation=generation, last_synced_at=timezone.now())
            changed = run.created + run.updated + run.deleted
            if not maintained or changed > SMALL_RUN_SHARE * max(indexed_before, 1):
                # Recounted from the rows, with fresh champion lists. A small run's counts were
                # kept current as it wrote; its champion lists stay as live updates leave them.
                source_refresh_term_stats(source_id)
        if report.skipped:
            status = IngestionRun.Status.PARTIAL
    except ConnectorError as exc:
        status, error = IngestionRun.Status.FAILED, str(exc)
    except Exception as exc:  # recorded on the run; the traceback goes to the log
        logger.exception("ingestion of source %s failed", source_id)
        status, error = IngestionRun.Status.FAILED, f"{type(exc).__name__}: {exc}"
    # After any run, a failed one too (its batches stay written): each text the source holds has
    # one indexed copy, another one when the run moved the indexed copy's text away or deleted it.
    try:
        with tenant_context(tenant_id):
            source_refresh_embedding_duplicates(source_id)
    except Exception:  # the run's own outcome is what gets recorded
        logger.exception("refreshing the embedding duplicates of source %s failed", source_id)
    with tenant_context(tenant_id):
        run.status = status
        run.error = error
        run.skipped = len(report.skipped)
        run.skipped_items = report.skipped[:1000]
        _record_units(run, report)
        run.finished_at = timezone.now()
        run.save(
            update_fields=[
                "status",
                "error",
                "skipped",
                "skipped_items",
                "finished_at",
                "deleted",
                "seen",
                "created",
                "updated",
                "unchanged",
                "embedded",
                "units_done",
                "units_total",
                "units_label",
            ]
        )
        source_health_record(source_id=source_id, run=run)
    return run


# -- partial updates (live sources) -----------------------------------------------------------


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
    external_ids = [row.external_id for row in rows]
    with tenant_context(tenant_id):
        before = _text_hashes(source_id, external_ids)
    for row in rows:
        batcher.add(row, report)
    batcher.flush()
    with tenant_context(tenant_id):
        source_refresh_embedding_duplicates(source_id, before | _text_hashes(source_id, external_ids))
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
        hashes = _text_hashes(source_id, external_ids)
        term_stats_adjust(tenant_id, source_id, ids, -1)
        Document.objects.filter(source_id=source_id, parent_id__in=ids).update(parent_id=None)
        deleted, _ = Document.objects.filter(pk__in=ids).delete()
        indexed_rows_adjust(source_id, -len(ids))
        source_refresh_embedding_duplicates(source_id, hashes)  # a copy of a deleted text takes its place
    return len(ids)


def _text_key(kind: str, text: str, principals: list[str]) -> tuple[str, str, str]:
    """What makes two rows' vectors one index entry: kind, ``md5`` of the text, principals (as JSON)."""
    return kind, hashlib.md5(text.encode(), usedforsecurity=False).hexdigest(), json.dumps(list(principals))


def _indexed_texts(source_id: int, rows: list[DocumentRow]) -> set[tuple[str, str, str]]:
    """The :func:`_text_key` of the source's indexed rows (embedded, not marked duplicate) holding
    the texts of ``rows`` (in the caller's tenant context)."""
    hashes = list({_text_key(r.kind, r.embed_text, r.principals)[1] for r in rows})
    if not hashes:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, md5(text), principals::text FROM sources_document WHERE source_id = %s "
            "AND md5(text) = ANY(%s) AND embedding IS NOT NULL AND NOT embedding_duplicate",
            [source_id, hashes],
        )
        return {(kind, digest, json.dumps(json.loads(principals))) for kind, digest, principals in cursor.fetchall()}


def _text_hashes(source_id: int, external_ids: list[str]) -> set[str]:
    """``md5`` hex of the texts these rows of the source hold now (in the caller's tenant context)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT md5(text) FROM sources_document WHERE source_id = %s AND external_id = ANY(%s)",
            [source_id, external_ids],
        )
        return {row[0] for row in cursor.fetchall()}
