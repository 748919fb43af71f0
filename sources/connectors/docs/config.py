"""Configuration of a docs folder data source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from sources.connectors.base import web_link_prefix
from sources.connectors.files import FileSourceConfig

DEFAULT_GLOBS = ["**/*.md", "**/*.markdown", "**/*.html", "**/*.htm", "**/*.rst", "**/*.txt"]


class DocsConfig(FileSourceConfig):
    """A folder of Markdown, HTML, reStructuredText or plain-text pages.

    ``incremental`` (default on): a file whose bytes are those the source stored (same settings,
    same connector code) is kept unparsed.

    ``path``: the folder; row paths are relative to it (POSIX separators). ``url_base``: web
    prefix for links (``{url_base}/{relpath}#{anchor}``); empty: links are the relative path.
    ``glob``: which files are pages, matched against the relative path (``**/`` matches zero or
    more folders). ``max_section_chars``: a longer section is split at block boundaries into
    ``-part2``, ``-part3``... rows (characters, not tokens). ``min_section_chars``: a heading
    whose body has fewer characters is merged into the section that follows it when that one is
    nested under it (its heading path already names the parent). ``text_format``: how a file
    whose suffix names no format (``.txt``) is parsed: ``"text"`` (one section), or ``"rst"`` /
    ``"markdown"`` for projects that keep their pages in ``.txt`` files (Sphinx sites such as
    Django's documentation write reStructuredText there). ``max_file_bytes``: a larger file is
    skipped with its size, never read.
    """

    path: str
    url_base: str = ""
    glob: list[str] = Field(default_factory=lambda: list(DEFAULT_GLOBS))
    max_section_chars: int = Field(default=4000, ge=200)
    min_section_chars: int = Field(default=40, ge=0)
    text_format: Literal["text", "rst", "markdown"] = "text"
    # 2 MB: about three times FastAPI's release notes (0.7 MB), the largest page seen in a real
    # docs folder. Parsing holds the page's block tokens (~100x its size for a file of a million
    # one-line blocks), so this bound is what keeps one page's parse far under 1 GB.
    max_file_bytes: int = Field(default=2_000_000, gt=0)
    incremental: bool = True

    @field_validator("url_base")
    @classmethod
    def _web_prefix(cls, value: str) -> str:
        return web_link_prefix(value)

    @field_validator("glob")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one glob pattern is needed")
        return value
