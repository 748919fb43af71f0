"""Configuration of a GitHub data source (issues and pull requests through the REST API)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import Field, SecretStr, field_validator

from sources.connectors.base import ConnectorConfig

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class GitHubConfig(ConnectorConfig):
    """Which repository, and what of it to read.

    ``owner``/``repo``: ``fastapi``/``fastapi``. ``token``: a personal access token or app
    installation token (read access to issues and pull requests); a secret: shown as
    ``**********`` in reprs and redacted from every error; optional for public repositories
    (then GitHub allows 60 requests an hour). ``base_url``: the REST API root,
    ``https://api.github.com`` or GitHub Enterprise Server's ``https://ghe.example/api/v3``.
    ``since``: only issues and pull requests updated at or after this time (ISO 8601; naive
    means UTC); a run with a ``since`` never deletes rows. ``incremental``: once the source has
    rows, a run asks only for what was updated since the newest stored row's last activity and
    keeps the rest (a full run, which also drops deleted issues, needs ``incremental: false``).
    ``include_issues``/``include_pull_requests``: which of the two to read. ``page_size``: items
    per page (``per_page``, GitHub's maximum is 100). ``max_rate_limit_wait_seconds``: the
    longest single wait for a rate limit to reset (HTTP 403/429 with ``Retry-After`` or
    ``X-RateLimit-Reset``); a longer one fails the run instead of dropping a page.
    ``rate_limit_retries``: rate-limited answers one request absorbs before the run fails.
    """

    owner: str
    repo: str
    token: SecretStr | None = None
    base_url: str = "https://api.github.com"
    since: datetime | None = None
    incremental: bool = True
    include_issues: bool = True
    include_pull_requests: bool = True
    page_size: int = Field(default=100, ge=1, le=100)
    max_rate_limit_wait_seconds: float = Field(default=900.0, ge=0, le=3600)
    rate_limit_retries: int = Field(default=5, ge=0, le=50)

    @field_validator("owner", "repo")
    @classmethod
    def _check_name(cls, value: str) -> str:
        value = value.strip()
        if not NAME_RE.match(value):
            raise ValueError("expected a GitHub owner or repository name (letters, digits, '-', '_', '.')")
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("https://", "http://")):
            raise ValueError("must start with https:// (e.g. https://api.github.com or https://ghe.example/api/v3)")
        return value

    @field_validator("since")
    @classmethod
    def _check_since(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            return None
        return value
