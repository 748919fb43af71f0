"""Data sources, ingestion runs and the unified document table (one row per retrievable unit)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F
from django.db.models.functions import MD5
from pgvector.django import HnswIndex, VectorField

from kbportal.tenancy import TenantOwned


class DataSource(TenantOwned):
    """Where knowledge lives: a git repository, a docs folder, a Slack export, ...

    ``config`` is validated by the connector's pydantic model (see
    ``sources.connectors.registry``); ``include``/``exclude`` are path globs; ``generation``
    counts successful runs and marks which rows the last run saw.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80)
    kind = models.CharField(max_length=40)
    config = models.JSONField(default=dict, blank=True)
    include = models.JSONField(default=list, blank=True, help_text="Path globs to index (empty: all).")
    exclude = models.JSONField(default=list, blank=True, help_text="Path globs to skip.")
    sync_interval_minutes = models.PositiveIntegerField(default=60)
    projects: models.ManyToManyField = models.ManyToManyField(
        "projects.Project", through="ProjectSource", related_name="sources", blank=True
    )
    generation = models.PositiveIntegerField(default=0)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    indexed_rows = models.PositiveIntegerField(default=0, help_text="Rows after the last run (for IDF).")
    # Scheduling and health (sources.scheduling): the beat dispatcher queues an enabled source
    # when ``sync_interval_minutes`` have passed since its last attempt and ``backoff_until``
    # (set after failures, doubling per consecutive failure, capped) is in the past.
    enabled = models.BooleanField(default=True, help_text="Scheduled syncs run only for enabled sources.")
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True, help_text="Start of the last run (any outcome).")
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, help_text="Error of the last failed run (cleared on success).")
    backoff_until = models.DateTimeField(null=True, blank=True, help_text="No scheduled run before this time.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "slug"], name="datasource_unique_slug")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class ProjectSource(TenantOwned):
    """A data source's place in a project."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE)
    source = models.ForeignKey(DataSource, on_delete=models.CASCADE)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "source"], name="projectsource_unique")]

    def __str__(self) -> str:
        return f"{self.source_id} in {self.project_id}"


def _duration_label(seconds: float) -> str:
    """``"about 40 s"``, ``"about 3 min"``, ``"about 1 h 05 min"``, ``"more than a day"``: a
    remaining time rounded for people."""
    if seconds >= 86_400:
        return "more than a day"
    if seconds < 57.5:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


class IngestionRun(TenantOwned):
    """One run of a data source's connector: status, counts (rows), errors and timing."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        PARTIAL = "partial", "Succeeded with skipped items"
        FAILED = "failed", "Failed"
        SKIPPED = "skipped", "Skipped (another run of the source was in progress)"

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    generation = models.PositiveIntegerField(default=0)
    seen = models.PositiveIntegerField(default=0, help_text="Rows the connector produced.")
    created = models.PositiveIntegerField(default=0)
    updated = models.PositiveIntegerField(default=0)
    unchanged = models.PositiveIntegerField(default=0)
    deleted = models.PositiveIntegerField(default=0)
    embedded = models.PositiveIntegerField(default=0, help_text="Rows whose embedding was computed.")
    skipped = models.PositiveIntegerField(default=0)
    skipped_items = models.JSONField(default=list, blank=True, help_text="[{item, reason}] for skipped files.")
    units_done = models.PositiveIntegerField(
        default=0, help_text="Units the connector has finished (files, day files, records...), for progress."
    )
    units_total = models.PositiveIntegerField(
        null=True, blank=True, help_text="Units the connector expects in all, when it knows: progress's denominator."
    )
    units_label = models.CharField(
        max_length=20, blank=True, default="", help_text="What the units are: files, day files, records..."
    )
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.source_id}: {self.status}"

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None

    def eta_seconds(self, now: datetime) -> float | None:
        """Seconds until a running run finishes, at ``now`` (aware): the elapsed time times
        remaining/done units (linear extrapolation of the rate so far). None before the first
        unit is done, once every unit is (the run's closing work remains), without a known total,
        or when the run is not running."""
        if self.status != self.Status.RUNNING or not self.started_at or not self.units_total:
            return None
        if not 0 < self.units_done < self.units_total:
            return None
        elapsed = max((now - self.started_at).total_seconds(), 0.0)
        return elapsed * (self.units_total - self.units_done) / self.units_done

    def progress_label(self, now: datetime) -> str:
        """``"312/1,024 files (30%), about 2 min left, 1,560 rows"`` for a running run whose
        connector counts its units; ``"1,560 rows"`` otherwise."""
        rows = f"{self.seen:,} rows"
        if not self.units_total:
            return rows
        done = min(self.units_done, self.units_total)
        unit = f" {self.units_label}" if self.units_label else ""
        label = f"{done:,}/{self.units_total:,}{unit} ({100 * done // self.units_total}%)"
        eta = self.eta_seconds(now)
        if eta is not None:
            label += f", {_duration_label(eta)} left"
        return f"{label}, {rows}"


class Document(TenantOwned):
    """The unified table: one row per retrievable unit (thread, code chunk, doc section, commit...).

    ``content`` is the raw text (full-text search, display); ``text`` the distilled text that is
    embedded; ``search_vector`` is a generated ``tsvector`` column (GIN) over title + content,
    added by migration SQL. ``url`` is a real link (``path#Lstart-Lend`` for code, a permalink
    for a thread). ``principals`` lists who may read the row (empty: everyone who can read the
    source).
    """

    class Kind(models.TextChoices):
        CODE_FILE = "code_file", "Code file"
        CODE_CHUNK = "code_chunk", "Code chunk"
        COMMIT = "commit", "Commit"
        PR = "pr", "Pull request"
        DOC_PAGE = "doc_page", "Doc page"
        DOC_SECTION = "doc_section", "Doc section"
        THREAD = "thread", "Thread"
        CONVERSATION = "conversation", "Conversation"
        BURST = "burst", "Burst"
        TICKET = "ticket", "Ticket"
        RECORD = "record", "Record"

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="documents")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    external_id = models.CharField(max_length=512)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    parent_external_id = models.CharField(max_length=512, blank=True)
    title = models.CharField(max_length=1000)
    url = models.CharField(max_length=2000, blank=True)
    path = models.CharField(max_length=1000, blank=True, help_text="File path or page path within the source.")
    start_line = models.PositiveIntegerField(null=True, blank=True)
    end_line = models.PositiveIntegerField(null=True, blank=True)
    position = models.PositiveIntegerField(default=0, help_text="Order within the parent (neighbours).")
    content = models.TextField()
    text = models.TextField(help_text="Distilled text that is embedded.")
    search_terms = models.TextField(blank=True, default="", help_text="Identifier forms for full-text search.")
    embedding = VectorField(dimensions=settings.KB_EMBEDDING_DIM, null=True, blank=True)
    embedding_duplicate = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Another row of the source, readable by the same principals, holds the same embedded text: "
        "left out of the HNSW index (sources.services.term_stats.source_refresh_embedding_duplicates).",
    )
    metadata = models.JSONField(default=dict, blank=True)
    principals = models.JSONField(default=list, blank=True)
    content_hash = models.CharField(max_length=64)
    generation = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True, help_text="Last activity.")
    indexed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "external_id"], name="document_unique_external_id"),
        ]
        indexes = [
            models.Index(fields=["tenant", "source", "kind"], name="document_scope_idx"),
            models.Index(fields=["source", "path"], name="document_path_idx"),
            # Identical vectors trap an HNSW graph search: copies link only to each other, and a
            # search entering the group cannot leave it (pgvector#837, qdrant#10239). One copy of
            # each text is indexed (search.retrieval.rankers.dense_ranking reads only those).
            HnswIndex(
                name="document_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
                condition=models.Q(embedding_duplicate=False),
            ),
            GinIndex(fields=["metadata"], name="document_metadata_gin"),
            # The rows of a source holding one text: a live update refreshes their embedding_duplicate
            # marks (sources.services.term_stats.source_refresh_embedding_duplicates) without a scan.
            models.Index(F("source"), MD5("text"), name="document_text_md5_idx"),
        ]

    def __str__(self) -> str:
        return self.title


class TermStat(TenantOwned):
    """Document frequency of one full-text lexeme in one data source, refreshed after each run.

    ``ndoc`` is the number of the source's rows whose ``search_vector`` holds ``lexeme``
    (PostgreSQL ``ts_stat``). Retrieval turns it into IDF = ln(N / df) over the sources in
    scope, to drop near-ubiquitous query terms and to rank rare ones.
    """

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="term_stats")
    lexeme = models.CharField(max_length=255)
    ndoc = models.PositiveIntegerField()
    champions = ArrayField(
        models.BigIntegerField(),
        null=True,
        blank=True,
        help_text="For a common lexeme: ids of the source's rows where it weighs most (BM25 tf part), best first.",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "lexeme"], name="termstat_unique_lexeme")]
        indexes = [models.Index(fields=["lexeme", "source"], name="termstat_lexeme_idx")]

    def __str__(self) -> str:
        return f"{self.lexeme}: {self.ndoc}"


class SlackEventSeen(TenantOwned):
    """An Events API ``event_id`` a live Slack source has already applied (the durable dedupe guard).

    Slack may deliver one event more than once (retries, reconnects, a listener restart); the
    unique constraint makes the second insert a no-op, so the event is applied once. Rows older
    than a few days are pruned by the listener (Slack retries within hours).
    """

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="+")
    event_id = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "event_id"], name="slackeventseen_unique_event")]
        indexes = [models.Index(fields=["source", "created_at"], name="slackeventseen_age_idx")]

    def __str__(self) -> str:
        return f"{self.event_id} in {self.source_id}"


class ExternalIdentity(TenantOwned):
    """A person as a data source's own system knows them (a Slack user, a Confluence account, a
    git author), stored per organization and refreshed by every full run of the source.

    ``principal`` is the string the source's rows name in ``Document.principals``
    (``slack:<user id>``, ``confluence:<account id>``, ``email:<address>``, ...); ``email`` is the
    address the source reports for the person (lower-cased; empty when it shows none). A portal
    user holds ``principal`` only through an address verified on the portal side that equals
    ``email`` (``sources.selectors.user_principals``); an identity without an email links to
    nobody.
    """

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="identities")
    principal = models.CharField(max_length=255)
    email = models.CharField(max_length=254, blank=True, default="")
    display_name = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "external identities"
        constraints = [models.UniqueConstraint(fields=["source", "principal"], name="identity_unique_principal")]
        indexes = [
            models.Index(fields=["tenant", "email"], name="identity_email_idx"),
            models.Index(fields=["tenant", "principal"], name="identity_principal_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.principal} ({self.email or 'no email'})"


class ExternalGroup(TenantOwned):
    """A group a data source exposes (a Confluence group, a Slack user group), with its members.

    ``principal`` is what the source's rows name (``group:<name>``); ``members`` lists the member
    principals as the source reports them (``email:<address>``, ``confluence:<account id>``,
    ``slack:<user id>``). Replaced by every full run of the source, so a person removed from the
    group loses it at the next sync.
    """

    source = models.ForeignKey(DataSource, on_delete=models.CASCADE, related_name="groups")
    principal = models.CharField(max_length=255)
    name = models.CharField(max_length=255, blank=True, default="")
    members = ArrayField(models.CharField(max_length=255), default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "principal"], name="group_unique_principal")]
        indexes = [
            GinIndex(fields=["members"], name="group_members_idx"),
            models.Index(fields=["tenant", "principal"], name="group_principal_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.principal} ({len(self.members)} members)"
