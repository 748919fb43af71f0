"""Configuration of a git data source, validated before a source is saved and at every run."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator, model_validator

from sources.connectors.base import ConnectorConfig, web_link_prefix

# A clone URL: scheme://... for the transports git allows by default, or scp-like user@host:path.
# Anything else (``ext::``, ``fd::`` remote helpers included) is treated as a local path, so a
# configuration can never make git run a command.
URL_RE = re.compile(r"^(?:(?:https?|ssh|git|file)://|[\w.+-]+@[\w.-]+:)", re.IGNORECASE)


class GitConfig(ConnectorConfig):
    """Where the repository is and how to link to it.

    ``path``: the repository's address, an https:// URL that is cloned on the server and fetched on
    later runs (the operator may also name a local repository or another URL scheme). ``name``:
    kept for older configurations; unused. ``branch`` or
    ``ref`` picks the revision to index (default: ``HEAD``); ``url_base`` is the web prefix of
    links (``{url_base}/{path}#L1-L9``, ``{url_base}/commit/{sha}``); ``max_commits`` caps the
    commit rows (newest first); ``max_file_bytes`` skips larger files. ``incremental`` (default
    on): a file whose blob is the one the source stored (same links, same connector code) is kept
    unread, so a run reads and parses only the files that changed. ``webhook_secret``: the
    secret of the repository host's push webhook (``POST /hooks/git/<source public id>``,
    signed ``X-Hub-Signature-256``); unset, the webhook refuses every call.
    """

    path: str = Field(min_length=1)
    branch: str | None = None
    ref: str | None = None
    url_base: str | None = None
    max_commits: int = Field(default=2000, ge=0)
    max_file_bytes: int = Field(default=1_000_000, gt=0)
    incremental: bool = True
    name: str | None = None
    webhook_secret: SecretStr | None = None

    @field_validator("branch", "ref")
    @classmethod
    def _no_option_like_revision(cls, value: str | None) -> str | None:
        # A revision is passed to git as an argument; "-..." would be read as an option.
        if value is not None and (not value.strip() or value.startswith("-")):
            raise ValueError("must be a branch, tag or commit name (not empty, not starting with '-')")
        return value

    @field_validator("url_base")
    @classmethod
    def _web_prefix(cls, value: str | None) -> str | None:
        return web_link_prefix(value or "") or None

    @model_validator(mode="after")
    def _branch_or_ref(self) -> GitConfig:
        if self.branch and self.ref:
            raise ValueError("set either branch or ref, not both")
        return self

    @property
    def is_url(self) -> bool:
        """True when ``path`` is a URL to clone rather than a local directory."""
        return bool(URL_RE.match(self.path.strip()))

    @property
    def revision(self) -> str:
        """The revision to index: ``ref``, else ``branch``, else ``HEAD``."""
        return self.ref or self.branch or "HEAD"
