"""Slack messages as the rows see them: the rendered message, Slack timestamps, transcript lines.

Shared by the row builders (``sources.connectors.slack.rows``), the distiller
(``sources.connectors.slack.distill``) and the answer pipeline, which reads transcripts back
(``TRANSCRIPT_KINDS``, ``TRANSCRIPT_STAMP``). Imports nothing of the project.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any


@dataclass
class SlackMessage:
    """One kept message, already rendered: ``text`` has mentions and links resolved.

    ``bot`` is true for integrations (``bot_message``, or a ``bot_id`` without a user).
    """

    ts: str
    seconds: float
    author: str
    text: str
    thread_ts: str | None = None
    declared_replies: int = 0
    files: list[str] = field(default_factory=list)
    reactions: list[tuple[str, int, list[str]]] = field(default_factory=list)  # (emoji, count, names)
    bot: bool = False

    @property
    def when(self) -> datetime:
        return ts_datetime(self.ts)


def ts_key(ts: str) -> tuple[int, int]:
    """(seconds, microseconds) of a Slack ts ("1433558319.000002"): an exact sort key, unlike float."""
    seconds, _, fraction = ts.partition(".")
    return int(seconds), int(fraction.ljust(6, "0")[:6])


def ts_datetime(ts: str) -> datetime:
    """Aware UTC datetime of a Slack ts, built from its integer parts so no float rounding creeps in."""
    seconds, microseconds = ts_key(ts)
    return datetime.fromtimestamp(seconds, tz=UTC) + timedelta(microseconds=microseconds)


def valid_ts(value: Any) -> bool:
    """True for a Slack timestamp string such as ``"1518040908.000101"``."""
    return isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value) is not None


TRANSCRIPT_KINDS = frozenset({"thread", "conversation", "burst"})  # rows whose content is a transcript
TRANSCRIPT_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2} ")  # how a transcript line starts


def transcript_line(message: SlackMessage) -> str:
    """``YYYY-MM-DD HH:MM Name: text`` (UTC); continuation lines indented so each message stays one entry."""
    text = message.text.replace("\n", "\n  ")
    return f"{message.when:%Y-%m-%d %H:%M} {message.author}: {text}"
