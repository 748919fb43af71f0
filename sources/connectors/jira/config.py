"""Configuration of a Jira data source: the REST API of a site, or a CSV export file."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from sources.connectors.atlassian.config import AtlassianConfig, principal

PROJECT_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,49}$")


class JiraConfig(AtlassianConfig):
    """Which Jira issues to read, from the REST API (``base_url``) or a CSV export (``path``).

    ``base_url``: the site, ``https://acme.atlassian.net`` (Cloud) or
    ``https://jira.example.com`` (Server / Data Center); row links are ``{base_url}/browse/KEY``.
    ``email`` + ``token``: Cloud basic auth with an API token; ``token`` alone: a personal access
    token sent as a bearer token (Server / Data Center). ``token`` is a secret: shown as
    ``**********`` and redacted from every error. ``jql``: which issues (any JQL; a trailing
    ``ORDER BY`` is replaced); ``project``: a project key or list of keys, ANDed with ``jql``.
    ``path``: a CSV file exported from Jira's issue navigator ("Export CSV (all fields)"),
    read instead of the API (``base_url`` then only makes links). ``api_version``: ``"2"``
    (descriptions in wiki markup) or ``"3"`` (Atlassian Document Format, flattened to text).
    ``incremental``: once the source has rows, a run asks only for issues updated since the
    newest stored row, less ``overlap_minutes`` (JQL dates have minute precision and are read in
    the API user's time zone, so the default of one day covers any zone); rows found unchanged
    cost a hash, no embedding. A full run (``incremental: false``, and every CSV run) also
    removes issues that are gone. ``page_size``: ``maxResults`` per search page (Jira caps it,
    commonly at 100). ``security_principals``: issue security level name -> who may read its
    issues (emails, ``group:<name>``, ``user:<id>``); an issue with a level not listed gets a
    principal nobody holds, so it stays closed rather than falling open.
    ``max_rate_limit_wait_seconds`` / ``rate_limit_retries``: see the client.
    """

    site_example: ClassVar[str] = "https://acme.atlassian.net"
    needs_source: ClassVar[str] = "give base_url (the Jira site, read through its REST API) or path (a CSV export)"

    jql: str = ""
    project: list[str] = Field(default_factory=list)
    api_version: Literal["2", "3"] = "2"
    incremental: bool = True
    overlap_minutes: int = Field(default=1440, ge=0, le=100_000)
    page_size: int = Field(default=50, ge=1, le=1000)
    security_principals: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("project", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("project")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        keys = [v.strip().upper() for v in value]
        bad = [k for k in keys if not PROJECT_KEY_RE.match(k)]
        if bad:
            raise ValueError(f"not a Jira project key: {', '.join(map(repr, bad))} (expected e.g. 'SUP')")
        return keys

    @field_validator("security_principals")
    @classmethod
    def _check_principals(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return {level: [principal(p) for p in people] for level, people in value.items()}

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        if value is not None and not value.strip().lower().endswith(".csv"):
            raise ValueError("must be a .csv file exported from Jira")
        return value.strip() if value else value
