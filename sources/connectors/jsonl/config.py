"""Configuration of a JSON documents data source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from sources.connectors.files import FileSourceConfig

# The first five are the generic names; the rest are the names exports of chat, wiki, drive,
# mail and meeting tools commonly use, so such records get a last-activity time without extra
# configuration.
DEFAULT_TIMESTAMP_FIELDS = [
    "updated_at",
    "last_message_time",
    "authored_at",
    "created_at",
    "date",
    "timestamp",
    "last_message_ts",
    "last_updated",
    "last_modified",
    "last_email_at",
    "recorded_at",
]
DEFAULT_CREATED_FIELDS = ["created_at", "authored_at", "first_message_time", "first_message_ts", "first_email_at"]

DEFAULT_MAX_LINE_BYTES = 1_000_000  # one record; a line is parsed whole, so it is bounded too

ROW_KINDS = {
    "code_file",
    "code_chunk",
    "commit",
    "pr",
    "doc_page",
    "doc_section",
    "thread",
    "conversation",
    "burst",
    "ticket",
    "record",
}  # (the values of sources.models.Document.Kind)


class JsonDocumentsConfig(FileSourceConfig):
    """JSON records -> rows of one kind.

    ``path``: a ``.jsonl`` file (one object per line), a ``.json`` file (one object or a list
    of objects), or a folder searched recursively for ``*.json`` / ``*.jsonl`` / ``*.ndjson``.
    ``id_field``: the record's stable id (external id). ``title_field`` / ``content_fields``:
    where the title and the body are; a record that names its own (``title_field_name``,
    ``content_field_names``, as some exports write them) wins. ``url_field`` or ``url_template``
    (``str.format`` over the record, e.g. ``https://github.com/o/r/commit/{sha}``) give the
    link. ``timestamp_fields``: first parseable one is the row's last activity (ISO 8601,
    RFC 2822, or unix epoch seconds/milliseconds); ``created_fields`` likewise for creation.
    ``metadata_fields``: fields kept as metadata (``None``: every other top-level scalar or
    list under ``max_metadata_chars`` serialised); ``exclude_fields`` are never kept.
    ``person_fields``: fields naming people, each as ``"owner"`` (who wrote or owns the record:
    full credit in who-knows) or ``"participant"`` (who took part: half); a field may hold one
    name, a list, or a list written as text (``"['Ana', 'Lee']"``). Their names are gathered in
    the row's ``owners`` and ``participants`` metadata, which who-knows reads (it also reads the
    generic ``author``, ``reporter``, ``assignee``, ``creator``, ``owner``, ``reviewers``,
    ``collaborators`` and ``commenters`` of any row).
    ``max_file_bytes`` (inherited): a ``.json`` file, read whole, larger than this is skipped
    with its size; ``max_line_bytes``: a JSONL line (one record) longer than this is skipped
    as ``{file}:{line}`` with its length; a JSONL file of any size is read line by line.
    """

    path: str
    id_field: str = "id"
    title_field: str = "title"
    content_fields: list[str] = Field(default_factory=lambda: ["content"])
    kind: str = "record"
    url_field: str | None = None
    url_template: str | None = None
    timestamp_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_TIMESTAMP_FIELDS))
    created_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_CREATED_FIELDS))
    metadata_fields: list[str] | None = None
    exclude_fields: list[str] = Field(default_factory=list)
    max_metadata_chars: int = Field(default=2000, ge=0)
    person_fields: dict[str, Literal["owner", "participant"]] = Field(default_factory=dict)
    max_line_bytes: int = Field(default=DEFAULT_MAX_LINE_BYTES, gt=0)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in ROW_KINDS:
            raise ValueError(f"unknown row kind {value!r}; one of {', '.join(sorted(ROW_KINDS))}")
        return value
