"""Slack workspace export -> ``thread`` and ``conversation`` rows.

A Slack export (folder or ZIP) holds ``channels.json`` (public channels), optionally
``groups.json`` (private channels) and ``users.json``, and one folder per channel with one file
per day, ``<channel>/<YYYY-MM-DD>.json``, each a JSON list of messages. Rows:

- ``thread``: a parent message and all its replies (grouped by ``thread_ts``; replies may sit in
  later day files), ``external_id = "<channel_id>:<thread_ts>"``;
- ``conversation``: consecutive messages outside threads in one channel, each within
  ``conversation_gap_minutes`` of the previous one, ``external_id =
  "<channel_id>:conv:<first_ts>"``.

System noise (joins, leaves, topic/purpose/name changes, pins, integrations) is dropped; file
shares and file comments are kept with the file names. Everything is derived from the export
alone, so the same export gives the same ids and contents on every run.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.slack_export.config import SlackExportConfig
from sources.connectors.slack_export.export import SlackExport

TITLE_CHARS = 120
EMBED_CHARS = 1500

# Subtypes that record what happened to the channel, not what anyone said. ``file_share``,
# ``file_comment``, ``bot_message``, ``me_message`` and ``thread_broadcast`` carry real content.
NOISE_SUBTYPES = frozenset(
    {
        "channel_join",
        "channel_leave",
        "channel_topic",
        "channel_purpose",
        "channel_name",
        "channel_archive",
        "channel_unarchive",
        "channel_convert_to_private",
        "channel_convert_to_public",
        "group_join",
        "group_leave",
        "group_topic",
        "group_purpose",
        "group_name",
        "group_archive",
        "group_unarchive",
        "pinned_item",
        "unpinned_item",
        "bot_add",
        "bot_remove",
        "bot_enable",
        "bot_disable",
        "app_conversation_join",
        "app_conversation_leave",
        "reminder_add",
        "joiner_notification",
        "sh_room_created",
        "tombstone",
        "message_changed",
        "message_deleted",
        "message_replied",
    }
)

# <@U123>, <@U123|name>, <#C123|general>, <!here>, <!subteam^S1|@team>, <https://x|label>, <mailto:a|a>
MARKUP_RE = re.compile(r"<(?P<body>[@#!][^<>]*|[a-zA-Z][a-zA-Z0-9+.-]*:[^<>\s]*(?:\|[^<>]*)?)>")


@dataclass
class _Channel:
    id: str
    name: str
    private: bool
    members: list[str]


@dataclass
class _Message:
    """One kept message, already rendered: ``text`` has mentions and links resolved."""

    ts: str
    seconds: float
    author: str
    text: str
    thread_ts: str | None = None
    declared_replies: int = 0
    files: list[str] = field(default_factory=list)
    reactions: list[tuple[str, int, list[str]]] = field(default_factory=list)  # (emoji, count, names)

    @property
    def when(self) -> datetime:
        return _ts_datetime(self.ts)


def _ts_key(ts: str) -> tuple[int, int]:
    """(seconds, microseconds) of a Slack ts ("1433558319.000002"): an exact sort key, unlike float."""
    seconds, _, fraction = ts.partition(".")
    return int(seconds), int(fraction.ljust(6, "0")[:6])


def _ts_datetime(ts: str) -> datetime:
    """Aware UTC datetime of a Slack ts, built from its integer parts so no float rounding creeps in."""
    seconds, microseconds = _ts_key(ts)
    return datetime.fromtimestamp(seconds, tz=UTC) + timedelta(microseconds=microseconds)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary when one is near, with "…"."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    if space > limit * 0.8:
        head = head[:space]
    return head.rstrip() + "…"


class SlackExportConnector(Connector):
    """Rows from a Slack workspace export; see the module docstring for the row shapes.

    ``include``/``exclude`` globs match day-file paths such as ``general/2016-01-15.json``.
    """

    kind = "slack_export"
    config_model = SlackExportConfig
    config: SlackExportConfig

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield one ``thread`` row per thread and ``conversation`` rows for the other messages.

        Channels are read in name order, rows per channel in time order. Sets ``report.total``
        to the number of day files read. Raises ``ConnectorError`` when the export is missing,
        has no ``channels.json``, or a top-level JSON file is malformed; a malformed day file is
        ``report.skip``-ped and the other days are still read.
        """
        export = SlackExport(self.config.path)
        try:
            yield from self._iter_rows(export, report)
        finally:
            export.close()

    # -- reading -------------------------------------------------------------------------------

    def _load_list(self, export: SlackExport, name: str, *, required: bool) -> list[Any]:
        raw = export.read(name)
        if raw is None:
            if required:
                raise ConnectorError(f"Slack export {self.config.path!r} has no {name}")
            return []
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise ConnectorError(f"{name} in Slack export {self.config.path!r} is not valid JSON: {exc}") from exc
        if not isinstance(data, list):
            raise ConnectorError(
                f"{name} in Slack export {self.config.path!r} is not valid: expected a JSON list, "
                f"got {type(data).__name__}"
            )
        return data

    def _load_channels(self, export: SlackExport, report: IngestReport) -> list[_Channel]:
        channels: dict[str, _Channel] = {}
        for file_name, private in (("channels.json", False), ("groups.json", True)):
            for index, entry in enumerate(self._load_list(export, file_name, required=file_name == "channels.json")):
                if not isinstance(entry, dict) or not entry.get("id") or not entry.get("name"):
                    report.skip(f"{file_name}#{index}", "channel entry without an id or a name")
                    continue
                raw_members = entry.get("members")
                members = [str(m) for m in raw_members if m] if isinstance(raw_members, list) else []
                channels.setdefault(
                    str(entry["name"]),
                    _Channel(
                        id=str(entry["id"]),
                        name=str(entry["name"]),
                        private=private or bool(entry.get("is_private")),
                        members=members,
                    ),
                )
        return sorted(channels.values(), key=lambda c: c.name)

    def _load_users(self, export: SlackExport) -> dict[str, str]:
        """User id -> the name shown in transcripts: real name, else display name, else handle."""
        names: dict[str, str] = {}
        for entry in self._load_list(export, "users.json", required=False):
            if not isinstance(entry, dict) or not entry.get("id"):
                continue
            profile = entry.get("profile") or {}
            # The real name reads best in a knowledge base ("Uma Penn", not "uma.p"); fall back.
            name = (
                profile.get("real_name")
                or entry.get("real_name")
                or profile.get("display_name")
                or entry.get("name")
                or entry["id"]
            )
            names[str(entry["id"])] = str(name).strip() or str(entry["id"])
        return names

    def _iter_rows(self, export: SlackExport, report: IngestReport) -> Iterator[DocumentRow]:
        channels = self._load_channels(export, report)
        users = self._load_users(export)
        channel_names = {c.id: c.name for c in channels}
        day_files = export.day_files()
        allowed = set(self.config.channels) if self.config.channels is not None else None
        if allowed is not None:
            for name in sorted(allowed - {c.name for c in channels}):
                report.skip(name, "channel named in the config is not in the export")
            channels = [c for c in channels if c.name in allowed]
        else:
            known = {c.name for c in channels}
            for folder in sorted(set(day_files) - known):
                report.skip(f"{folder}/", "folder is not a channel listed in channels.json or groups.json; not read")

        plan = [(channel, [f"{channel.name}/{day}" for day in day_files.get(channel.name, [])]) for channel in channels]
        plan = [(channel, [p for p in paths if self.path_allowed(p)]) for channel, paths in plan]
        report.total = sum(len(paths) for _, paths in plan)

        renderer = _Renderer(users=users, channel_names=channel_names)
        for channel, paths in plan:
            messages = self._read_channel(export, paths, renderer, report)
            report.advance(len(paths))
            yield from self._channel_rows(channel, messages)

    def _read_channel(
        self, export: SlackExport, paths: list[str], renderer: _Renderer, report: IngestReport
    ) -> list[_Message]:
        """The channel's kept messages, oldest first, one per ts (a message exported twice counts once)."""
        by_ts: dict[str, _Message] = {}
        for path in paths:
            raw = export.read(path)
            try:
                data = json.loads(raw or b"")
            except ValueError as exc:
                report.skip(path, f"invalid JSON: {exc}")
                continue
            if not isinstance(data, list):
                report.skip(path, f"invalid JSON: expected a list of messages, got {type(data).__name__}")
                continue
            for index, raw_message in enumerate(data):
                if not isinstance(raw_message, dict) or not _valid_ts(raw_message.get("ts")):
                    report.skip(f"{path}#{index}", "message is not an object with a valid ts")
                    continue
                message = renderer.message(raw_message)
                if message is not None and message.ts not in by_ts:
                    by_ts[message.ts] = message
        return sorted(by_ts.values(), key=lambda m: _ts_key(m.ts))

    # -- grouping ------------------------------------------------------------------------------

    def _channel_rows(self, channel: _Channel, messages: list[_Message]) -> Iterator[DocumentRow]:
        threads: dict[str, list[_Message]] = defaultdict(list)
        for message in messages:
            if message.thread_ts:
                threads[message.thread_ts].append(message)
        thread_rows: list[tuple[str, list[_Message]]] = []
        in_threads: set[str] = set()
        for thread_ts, group in threads.items():
            # A thread_ts on a lone message with no replies (e.g. all replies deleted) is no thread.
            if any(m.ts != thread_ts for m in group) or any(m.declared_replies for m in group):
                thread_rows.append((thread_ts, group))
                in_threads.update(m.ts for m in group)

        loose = [m for m in messages if m.ts not in in_threads]
        conversations: list[list[_Message]] = []
        gap_seconds = self.config.conversation_gap_minutes * 60
        for message in loose:
            if conversations and message.seconds - conversations[-1][-1].seconds <= gap_seconds:
                conversations[-1].append(message)
            else:
                conversations.append([message])

        rows = [self._thread_row(channel, ts, group) for ts, group in thread_rows]
        rows += [self._conversation_row(channel, group) for group in conversations]
        rows.sort(key=lambda row: (_ts_key(row.metadata["first_ts"]), row.external_id))
        yield from rows

    def _thread_row(self, channel: _Channel, thread_ts: str, group: list[_Message]) -> DocumentRow:
        parent = next((m for m in group if m.ts == thread_ts), None)
        # Replies can outlive a parent cut from the export; then every message is a reply.
        replies = len(group) - (1 if parent is not None else 0)
        ordered = [parent, *[m for m in group if m is not parent]] if parent is not None else group
        return self._row(
            kind="thread",
            external_id=f"{channel.id}:{thread_ts}",
            channel=channel,
            messages=ordered,
            link_ts=thread_ts,
            thread_ts=thread_ts,
            reply_count=replies,
        )

    def _conversation_row(self, channel: _Channel, group: list[_Message]) -> DocumentRow:
        first_ts = group[0].ts
        return self._row(
            kind="conversation",
            external_id=f"{channel.id}:conv:{first_ts}",
            channel=channel,
            messages=group,
            link_ts=first_ts,
            thread_ts=None,
            reply_count=0,
        )

    def _permalink(self, channel_id: str, ts: str) -> str:
        if self.config.workspace_url:
            return f"{self.config.workspace_url}/archives/{channel_id}/p{ts.replace('.', '')}"
        return f"slack://channel?id={channel_id}&message={ts}"

    def _row(
        self,
        *,
        kind: str,
        external_id: str,
        channel: _Channel,
        messages: list[_Message],
        link_ts: str,
        thread_ts: str | None,
        reply_count: int,
    ) -> DocumentRow:
        transcript = "\n".join(_transcript_line(m) for m in messages)
        first = messages[0]
        first_line = next((line.strip() for line in first.text.splitlines() if line.strip()), "")
        if not first_line:
            first_line = ", ".join(first.files) or "(no text)"

        authors: list[str] = []
        reactors: set[str] = set()
        reactions: dict[str, int] = {}
        files: list[str] = []
        for m in messages:
            if m.author not in authors:
                authors.append(m.author)
            for name, count, reactor_names in m.reactions:
                reactions[name] = reactions.get(name, 0) + count
                reactors.update(reactor_names)
            files.extend(f for f in m.files if f not in files)
        # Reacting is taking part, so reactors count as participants but not as authors.
        participants = sorted(set(authors) | reactors, key=str.casefold)
        first_ts = min(messages, key=lambda m: _ts_key(m.ts)).ts
        last_ts = max(messages, key=lambda m: _ts_key(m.ts)).ts
        return DocumentRow(
            external_id=external_id,
            kind=kind,
            title=f"#{channel.name}: {_cut(first_line, TITLE_CHARS)}",
            content=transcript,
            text=f"#{channel.name}\n{_cut(transcript, EMBED_CHARS)}",
            url=self._permalink(channel.id, link_ts),
            path=channel.name,
            metadata={
                "channel": channel.name,
                "channel_id": channel.id,
                "private": channel.private,
                "thread_ts": thread_ts,
                "participants": participants,
                "authors": authors,
                "message_count": len(messages),
                "reply_count": reply_count,
                "reaction_count": sum(reactions.values()),
                "reactions": reactions,
                "files": files,
                "first_ts": first_ts,
                "last_ts": last_ts,
            },
            principals=_principals(channel),
            created_at=_ts_datetime(first_ts),
            updated_at=_ts_datetime(last_ts),
        )


def _principals(channel: _Channel) -> list[str]:
    """Who may read a channel's rows: empty (everyone with the source) for a public channel.

    A private channel lists its members; with no member list it gets a principal no user holds,
    so its rows stay closed rather than falling open to the whole source.
    """
    if not channel.private:
        return []
    return [f"slack:{member}" for member in channel.members] or [f"slack-channel:{channel.id}"]


def _valid_ts(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value) is not None


def _transcript_line(message: _Message) -> str:
    """``YYYY-MM-DD HH:MM Name: text`` (UTC); continuation lines indented so each message stays one entry."""
    text = message.text.replace("\n", "\n  ")
    return f"{message.when:%Y-%m-%d %H:%M} {message.author}: {text}"


class _Renderer:
    """Turns raw export messages into :class:`_Message` with Slack markup made readable.

    ``<@U1>`` -> ``@Name``, ``<#C1|general>`` -> ``#general``, ``<!here>`` -> ``@here``,
    ``<https://x|label>`` -> ``label (https://x)``, ``<mailto:a@b|a@b>`` -> ``a@b``; the
    ``&amp; &lt; &gt;`` escapes Slack applies to text are undone (after the markup, whose
    labels can contain them).
    """

    def __init__(self, *, users: dict[str, str], channel_names: dict[str, str]) -> None:
        self.users = users
        self.channel_names = channel_names

    def name(self, user_id: str) -> str:
        return self.users.get(user_id, user_id)

    def text(self, raw: str) -> str:
        if "<" not in raw and "&" not in raw:
            return raw
        # Slack escapes exactly these three in message text; html.unescape would also eat "&copy".
        return MARKUP_RE.sub(self._markup, raw).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    def _markup(self, match: re.Match[str]) -> str:
        target, _, label = match.group("body").partition("|")
        if target.startswith("@"):
            user_id = target[1:]
            return "@" + (self.users.get(user_id) or label.lstrip("@") or user_id)
        if target.startswith("#"):
            return "#" + (self.channel_names.get(target[1:]) or label or target[1:])
        if target.startswith("!"):
            # <!here>, <!channel>, <!subteam^S1|@team>, <!date^1392734382^{date}|Feb 18, 2014>
            return label or "@" + target[1:].split("^", 1)[0]
        if target.startswith("mailto:"):
            return label or target[len("mailto:") :]
        if not label or label == target or target.split("://", 1)[-1] == label:
            return target
        return f"{label} ({target})"

    def message(self, raw: dict[str, Any]) -> _Message | None:
        """The rendered message, or ``None`` for system noise and empty messages without files."""
        subtype = raw.get("subtype")
        if subtype in NOISE_SUBTYPES:
            return None
        files = _file_names(raw)
        text = str(raw.get("text") or "")
        user_id = raw.get("user")
        comment = raw.get("comment") if isinstance(raw.get("comment"), dict) else None
        if subtype == "file_comment" and comment is not None:
            # The export's text is "<@U1> commented on U2's file <url|name>: ..."; the comment
            # itself with the file's name reads better in a transcript.
            user_id = comment.get("user") or user_id
            text = f"[comment on {', '.join(files) or 'a file'}] {comment.get('comment') or ''}".rstrip()
        rendered = self.text(text).strip()
        initial = (raw.get("file") or {}).get("initial_comment") if isinstance(raw.get("file"), dict) else None
        if isinstance(initial, dict) and initial.get("comment"):
            rendered = f"{rendered}\n{self.text(str(initial['comment'])).strip()}".strip()
        # A bare shared link says little; its unfurled title ("Houston Data Visualization Meetup")
        # is what people search for. The unfurl's body text is left out: long and often stale.
        for attachment in raw.get("attachments") or []:
            title = attachment.get("title") if isinstance(attachment, dict) else None
            if title and str(title) not in rendered:
                rendered = f"{rendered} [link: {self.text(str(title)).strip()}]".strip()
        missing = [f for f in files if f not in rendered]
        if missing:
            rendered = f"{rendered} [file: {', '.join(missing)}]".strip()
        if not rendered:
            return None
        if user_id:
            author = self.name(str(user_id))
        else:
            # Integrations post without a user: the bot's display name, else its id.
            profile = raw.get("bot_profile") if isinstance(raw.get("bot_profile"), dict) else {}
            author = self.text(str(raw.get("username") or profile.get("name") or raw.get("bot_id") or "unknown"))
            author = author.lstrip("@")
        reactions = []
        for reaction in raw.get("reactions") or []:
            if not isinstance(reaction, dict) or not reaction.get("name"):
                continue
            reactors = [self.name(str(u)) for u in reaction.get("users") or []]
            count = reaction.get("count")
            reactions.append((str(reaction["name"]), int(count) if isinstance(count, int) else len(reactors), reactors))
        ts = str(raw["ts"])
        thread_ts = raw.get("thread_ts")
        return _Message(
            ts=ts,
            seconds=float(ts),
            author=author,
            text=rendered,
            thread_ts=str(thread_ts) if _valid_ts(thread_ts) else None,
            declared_replies=raw.get("reply_count") if isinstance(raw.get("reply_count"), int) else 0,
            files=files,
            reactions=reactions,
        )


def _file_names(raw: dict[str, Any]) -> list[str]:
    """Names of the files a message shares: old exports have ``file``, newer ones ``files``."""
    candidates = list(raw.get("files") or [])
    if isinstance(raw.get("file"), dict):
        candidates.insert(0, raw["file"])
    names: list[str] = []
    for entry in candidates:
        # Deleted or over-quota files ("tombstone", "hidden_by_limit") keep no name.
        name = entry.get("name") or entry.get("title") if isinstance(entry, dict) else None
        if name and str(name) not in names:
            names.append(str(name))
    return names
