"""Slack workspace export -> ``thread``, ``conversation`` and ``burst`` rows.

A Slack export (folder or ZIP) holds ``channels.json`` (public channels), optionally
``groups.json`` (private channels) and ``users.json``, and one folder per channel with one file
per day, ``<channel>/<YYYY-MM-DD>.json``, each a JSON list of messages. Rows:

- ``thread``: a parent message and all its replies (grouped by ``thread_ts``; replies may sit in
  later day files), ``external_id = "<channel_id>:<thread_ts>"``;
- ``conversation``: consecutive messages outside threads in one channel, each within
  ``conversation_gap_minutes`` of the previous one, ``external_id =
  "<channel_id>:conv:<first_ts>"``;
- ``burst``: a run of one author's messages inside either that passes the weighted threshold,
  ``external_id = "<parent external id>:burst:<first_ts>"`` (``sources.connectors.slack.distill``).

A thread's embedded text is its distillation (``metadata["distilled"]``). System noise (joins,
leaves, topic/purpose/name changes, pins, integrations) is dropped; file shares and file
comments are kept with the file names. Everything is derived from the export
alone, so the same export gives the same ids and contents on every run. Rendering and grouping
are shared with the live ``slack`` connector (``sources.connectors.slack.rows``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sources.connectors.base import Connector, ConnectorError, DocumentRow, IngestReport
from sources.connectors.files import FileRefused
from sources.connectors.slack.distill import Distiller, source_distiller
from sources.connectors.slack.export import SlackExport
from sources.connectors.slack.export_config import SlackExportConfig
from sources.connectors.slack.messages import SlackMessage, ts_key
from sources.connectors.slack.rows import (
    SlackChannel,
    SlackRenderer,
    channel_rows,
    collect_messages,
)


class SlackExportConnector(Connector):
    """Rows from a Slack workspace export; see the module docstring for the row shapes.

    ``include``/``exclude`` globs match day-file paths such as ``general/2016-01-15.json``.
    """

    kind = "slack_export"
    config_model = SlackExportConfig
    config: SlackExportConfig

    def __init__(self, config: dict[str, Any], *, include=None, exclude=None) -> None:
        super().__init__(config, include=include, exclude=exclude)
        self.distiller = Distiller()

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:
        """Use the data source's term statistics and stored distillations (the ingestion service
        calls this before a run; unbound, bursts use the no-statistics heuristic and every thread
        is distilled afresh)."""
        self.distiller = source_distiller(tenant_id=tenant_id, source_id=source_id)

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield one ``thread`` row per thread and ``conversation`` rows for the other messages.

        Channels are read in name order, rows per channel in time order. Sets ``report.total``
        to the number of day files read. Raises ``ConnectorError`` when the export is missing,
        has no ``channels.json``, or a top-level JSON file is malformed; a malformed day file is
        ``report.skip``-ped and the other days are still read.
        """
        export = SlackExport(self.config.path, max_file_bytes=self.config.max_file_bytes)
        try:
            yield from self._iter_rows(export, report)
        finally:
            export.close()

    # -- reading -------------------------------------------------------------------------------

    def _load_list(
        self, export: SlackExport, name: str, *, required: bool, report: IngestReport | None = None
    ) -> list[Any]:
        """The JSON list in top-level file ``name``; ``[]`` when absent and not ``required``.

        Raises ``ConnectorError`` when it is malformed, or over ``max_file_bytes`` unless a
        ``report`` is given to record the skip on (then ``[]``).
        """
        try:
            raw = export.read(name)
        except FileRefused as exc:
            if report is None:
                raise ConnectorError(f"{name} in Slack export {self.config.path!r} is not read: {exc.reason}") from exc
            report.skip(name, exc.reason)
            return []
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

    def _load_channels(self, export: SlackExport, report: IngestReport) -> list[SlackChannel]:
        channels: dict[str, SlackChannel] = {}
        for file_name, private in (("channels.json", False), ("groups.json", True)):
            for index, entry in enumerate(self._load_list(export, file_name, required=file_name == "channels.json")):
                if not isinstance(entry, dict) or not entry.get("id") or not entry.get("name"):
                    report.skip(f"{file_name}#{index}", "channel entry without an id or a name")
                    continue
                raw_members = entry.get("members")
                members = [str(m) for m in raw_members if m] if isinstance(raw_members, list) else []
                channels.setdefault(
                    str(entry["name"]),
                    SlackChannel(
                        id=str(entry["id"]),
                        name=str(entry["name"]),
                        private=private or bool(entry.get("is_private")),
                        members=members,
                    ),
                )
        return sorted(channels.values(), key=lambda c: c.name)

    def _load_users(self, export: SlackExport, report: IngestReport) -> dict[str, str]:
        """User id -> the name shown in transcripts: real name, else display name, else handle.

        Each user is also recorded in ``self.directory`` as ``slack:<id>`` with its profile email."""
        names: dict[str, str] = {}
        for entry in self._load_list(export, "users.json", required=False, report=report):
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
            # The profile email (present when the export was made with it) links this Slack user
            # to a portal user with the same verified address (``ExternalIdentity``).
            user_id = str(entry["id"])
            self.directory.person(f"slack:{user_id}", email=str(profile.get("email") or ""), name=names[user_id])
        return names

    def _iter_rows(self, export: SlackExport, report: IngestReport) -> Iterator[DocumentRow]:
        channels = self._load_channels(export, report)
        users = self._load_users(export, report)
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
        report.unit = "day files"

        renderer = SlackRenderer(users=users, channel_names=channel_names)
        for channel, paths in plan:
            messages = self._read_channel(export, paths, renderer, report)
            report.advance(len(paths))
            yield from self._channel_rows(channel, messages)

    def _read_channel(
        self, export: SlackExport, paths: list[str], renderer: SlackRenderer, report: IngestReport
    ) -> list[SlackMessage]:
        """The channel's kept messages, oldest first, one per ts (a message exported twice counts once)."""
        by_ts: dict[str, SlackMessage] = {}
        for path in paths:
            try:
                raw = export.read(path)
            except FileRefused as exc:
                report.skip(path, exc.reason)
                continue
            try:
                data = json.loads(raw or b"")
            except ValueError as exc:
                report.skip(path, f"invalid JSON: {exc}")
                continue
            if not isinstance(data, list):
                report.skip(path, f"invalid JSON: expected a list of messages, got {type(data).__name__}")
                continue
            collect_messages(renderer, data, path, report, by_ts)
        return sorted(by_ts.values(), key=lambda m: ts_key(m.ts))

    # -- grouping ------------------------------------------------------------------------------

    def _channel_rows(self, channel: SlackChannel, messages: list[SlackMessage]) -> Iterator[DocumentRow]:
        yield from channel_rows(
            channel,
            messages,
            gap_minutes=self.config.conversation_gap_minutes,
            workspace_url=self.config.workspace_url,
            distiller=self.distiller,
        )
