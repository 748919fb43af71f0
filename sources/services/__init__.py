"""Writes for data sources, one module per job; this package names the operations the rest of
the project calls.

- :mod:`sources.services.catalog`: creating a source (attached to projects), its configuration
  and encrypted secrets, a queued run;
- :mod:`sources.services.ingestion`: full runs and partial updates of live sources, idempotent
  and resumable (rows upserted by external id and compared by content hash);
- :mod:`sources.services.term_stats`: the lexeme statistics and champion lists retrieval reads;
- :mod:`sources.services.directory`: the people and groups a source exposes;
- :mod:`sources.connectors.slack.live` (with the rest of Slack): live Slack events applied to a
  source's rows.
"""

from sources.connectors.slack.live import (
    slack_event_apply,
    slack_event_claim,
    slack_event_release,
    slack_events_prune,
    slack_message_purge,
    slack_thread_refresh,
)
from sources.services.catalog import (
    config_merge_secrets,
    ingestion_run_create,
    source_create,
    source_label,
    source_secrets_rotate,
    source_update_config,
)
from sources.services.directory import source_directory_store
from sources.services.ingestion import (
    BATCH_SIZE,
    MAX_CONTENT_CHARS,
    ProgressCallback,
    source_ingest,
    source_rows_delete,
    source_rows_upsert,
)
from sources.services.term_stats import source_refresh_champions, source_refresh_term_stats

__all__ = [
    "BATCH_SIZE",
    "MAX_CONTENT_CHARS",
    "ProgressCallback",
    "config_merge_secrets",
    "ingestion_run_create",
    "slack_event_apply",
    "slack_event_claim",
    "slack_event_release",
    "slack_events_prune",
    "slack_message_purge",
    "slack_thread_refresh",
    "source_create",
    "source_directory_store",
    "source_ingest",
    "source_label",
    "source_refresh_champions",
    "source_refresh_term_stats",
    "source_rows_delete",
    "source_rows_upsert",
    "source_secrets_rotate",
    "source_update_config",
]
