"""Configuration of a Slack workspace export data source."""

from __future__ import annotations

from pydantic import Field, field_validator

from sources.connectors.files import FileSourceConfig
from sources.connectors.slack.rows import check_workspace_url


class SlackExportConfig(FileSourceConfig):
    """Where the export is and how its messages are grouped.

    ``path``: the export folder (holding ``channels.json``) or a ``.zip`` of it.
    ``workspace_url``: e.g. ``https://acme.slack.com``, for real permalinks; without it rows
    get a stable ``slack://`` pseudo-link.
    ``conversation_gap_minutes``: messages outside threads further apart than this (minutes)
    start a new conversation row.
    ``channels``: allow-list of channel names (without ``#``); ``None`` reads every channel.
    ``max_file_bytes`` (inherited): a larger day file, or ``users.json``, is skipped with its
    size; a larger ``channels.json`` or ``groups.json`` fails the run (which channels exist, and
    which are private, cannot be known without them).
    """

    path: str = Field(min_length=1)
    workspace_url: str | None = None
    conversation_gap_minutes: int = Field(default=30, ge=1, le=7 * 24 * 60)
    channels: list[str] | None = Field(default=None, min_length=1)

    @field_validator("workspace_url")
    @classmethod
    def _check_workspace_url(cls, value: str | None) -> str | None:
        return check_workspace_url(value)

    @field_validator("channels")
    @classmethod
    def _normalise_channels(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        # People paste "#general" as often as "general"; both name the same channel.
        names = [name.strip().lstrip("#") for name in value]
        if any(not name for name in names):
            raise ValueError("channel names must not be empty")
        return names
