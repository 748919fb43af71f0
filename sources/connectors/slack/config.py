"""Configuration of a live Slack data source (Web API backfill + Socket Mode events)."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from sources.connectors.base import ConnectorConfig
from sources.connectors.slack.rows import check_workspace_url

CHANNEL_ID_RE = re.compile(r"^[CG][A-Z0-9]{2,}$")


class SlackConfig(ConnectorConfig):
    """Which workspace and channels, and how messages are grouped.

    ``token``: the bot token (``xoxb-...``; scopes ``channels:history``, ``groups:history``,
    ``channels:read``, ``groups:read``, ``users:read``). ``app_token``: the app-level token
    (``xapp-...``, scope ``connections:write``) that ``manage.py slack_listen`` needs for Socket
    Mode; backfill runs without it. Both are secrets: shown as ``**********`` in reprs and
    redacted from errors. ``base_url``: the Web API root (``https://slack.com/api/``; a local
    server in tests). ``channels``: channel ids (``C0123ABCD``; ``G...`` for old private
    channels), not names: names change, ids do not. ``workspace_url``: e.g.
    ``https://acme.slack.com``, for real permalinks. ``conversation_gap_minutes``: messages
    outside threads further apart than this start a new conversation row. ``page_size``:
    messages per Web API page (Slack caps history at 999, recommends 200).
    ``rate_limit_retries``: HTTP 429 answers retried (each after its ``Retry-After``) before a
    call gives up.
    """

    token: SecretStr = Field(min_length=1)
    app_token: SecretStr | None = None
    base_url: str = "https://slack.com/api/"
    channels: list[str] = Field(min_length=1)
    workspace_url: str | None = None
    conversation_gap_minutes: int = Field(default=30, ge=1, le=7 * 24 * 60)
    page_size: int = Field(default=200, ge=1, le=999)
    rate_limit_retries: int = Field(default=10, ge=0, le=100)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith(("https://", "http://")):
            raise ValueError("must start with https:// (e.g. https://slack.com/api/)")
        # WebClient joins method names onto it: "https://slack.com/api" + "conversations.history" is wrong.
        return value if value.endswith("/") else value + "/"

    @field_validator("workspace_url")
    @classmethod
    def _check_workspace_url(cls, value: str | None) -> str | None:
        return check_workspace_url(value)

    @field_validator("channels")
    @classmethod
    def _check_channels(cls, value: list[str]) -> list[str]:
        ids = [item.strip() for item in value]
        bad = [item for item in ids if not CHANNEL_ID_RE.match(item)]
        if bad:
            raise ValueError(f"expected channel ids such as C0123ABCD (not names): {', '.join(bad)}")
        return list(dict.fromkeys(ids))
