"""Site and credential configuration Jira and Confluence data sources share."""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from sources.connectors.base import ConnectorConfig


def check_base_url(value: str | None, example: str) -> str | None:
    """A site URL: ``http(s)://host[/path]``, no credentials, query or fragment; trailing ``/`` dropped."""
    if value is None:
        return None
    value = value.strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"must be an http(s) URL such as {example}")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials; put them in the token (and email) fields")
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query or fragment")
    return value


def principal(value: str) -> str:
    """A principal as ``Document.principals`` stores it: an address -> ``email:<address>``;
    ``email:``/``user:``/``group:`` values kept (email lower-cased)."""
    value = value.strip()
    if value.startswith("email:") or ("@" in value and ":" not in value):
        return "email:" + value.removeprefix("email:").lower()
    if value.startswith(("user:", "group:")) and len(value.split(":", 1)[1]) > 0:
        return value
    raise ValueError(f"{value!r} is not a principal: use an email address, 'group:<name>' or 'user:<id>'")


class AtlassianConfig(ConnectorConfig):
    """The site and credential fields Jira and Confluence sources share.

    ``base_url``: the product's site root (checked by :func:`check_base_url`; the subclass's
    ``site_example`` shows the expected form). ``email`` + ``token``: Cloud basic auth with an API
    token; ``token`` alone: a personal access token (bearer); a blank token counts as none.
    ``token`` is a secret, never shown or logged. ``max_rate_limit_wait_seconds`` /
    ``rate_limit_retries``: how long a 429 is waited out (see the client). Either ``base_url`` or
    ``path`` must be given (``needs_source`` is the error otherwise), and ``email`` needs ``token``.
    ``max_file_bytes``: an exported page larger than this (bytes) is skipped with its size, never
    read; a Jira CSV export of any size is read record by record, and fails on a line over it.
    """

    site_example: ClassVar[str] = "https://acme.atlassian.net"
    needs_source: ClassVar[str] = "give base_url or path"

    base_url: str | None = None
    email: str | None = None
    token: SecretStr | None = None
    path: str | None = None
    max_rate_limit_wait_seconds: float = Field(default=300.0, ge=0, le=3600)
    rate_limit_retries: int = Field(default=5, ge=0, le=50)
    # 5 MB of HTML: the parsed tree of a page takes several times its size.
    max_file_bytes: int = Field(default=5_000_000, gt=0)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        return check_base_url(value, cls.site_example)

    @field_validator("token")
    @classmethod
    def _blank_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            return None
        return value

    @model_validator(mode="after")
    def _api_or_file(self) -> AtlassianConfig:
        if not self.base_url and not self.path:
            raise ValueError(self.needs_source)
        if self.email and not self.token:
            raise ValueError("email needs token (an Atlassian API token) for basic auth")
        return self
