"""Configuration of a Confluence data source: the REST API of a site, or an HTML space export."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from sources.connectors.atlassian.config import AtlassianConfig

SPACE_KEY_RE = re.compile(r"^~?[A-Za-z0-9_-]{1,255}$")


class ConfluenceConfig(AtlassianConfig):
    """Which Confluence pages to read, from the REST API (``base_url``) or an export (``path``).

    ``base_url``: the site's Confluence root, ``https://acme.atlassian.net/wiki`` (Cloud) or
    ``https://confluence.example.com`` (Server / Data Center). ``email`` + ``token``: Cloud basic
    auth with an API token; ``token`` alone: a personal access token (bearer). ``token`` is a
    secret, never shown or logged. ``space``: a space key or list of keys (empty: every page the
    account can read). ``path``: a folder holding an HTML space export (``Space tools -> Export ->
    HTML``): one ``Title_<id>.html`` per page with breadcrumbs; an export carries no page
    restrictions, so its rows are readable by everyone who may read the source. ``page_size``:
    ``limit`` per content page (Confluence caps expanded bodies, commonly at 25-100).
    ``max_section_chars`` / ``min_section_chars``: as for ``docs`` sources.
    ``max_rate_limit_wait_seconds`` / ``rate_limit_retries``: how long a 429 is waited out.
    """

    site_example: ClassVar[str] = "https://acme.atlassian.net/wiki"
    needs_source: ClassVar[str] = (
        "give base_url (the Confluence site, read through its REST API) or path (an HTML export)"
    )

    space: list[str] = Field(default_factory=list)
    page_size: int = Field(default=25, ge=1, le=200)
    max_section_chars: int = Field(default=4000, ge=200)
    min_section_chars: int = Field(default=40, ge=0)

    @field_validator("space", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("space")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        keys = [v.strip() for v in value]
        bad = [k for k in keys if not SPACE_KEY_RE.match(k)]
        if bad:
            raise ValueError(f"not a Confluence space key: {', '.join(map(repr, bad))} (expected e.g. 'ENG')")
        return keys
