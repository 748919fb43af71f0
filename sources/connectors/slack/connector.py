"""Live Slack: channels read through the Web API -> ``thread``, ``conversation`` and ``burst`` rows.

A full run (:meth:`SlackConnector.iter_rows`) backfills each configured channel: every page of
``conversations.history``, and ``conversations.replies`` for each message that has replies.
Rows are the export connector's (``sources.connectors.slack.rows``): one ``thread`` row per
thread (``<channel_id>:<thread_ts>``), other messages grouped into ``conversation`` rows
(``<channel_id>:conv:<first_ts>``), and ``burst`` rows inside either (``sources.connectors.slack.distill``); a
thread's embedded text is its distillation. A private channel (``conversations.info``
``is_private``) gives its rows the principals ``slack:<user id>`` of its members
(``conversations.members``). The workspace's user groups (``usergroups.list``, with the
``usergroups:read`` scope) are stored with their members as ``slack-group:<id>``.

Live updates (:meth:`SlackConnector.refresh_thread`) re-fetch one whole thread and, when a
message is or becomes a loose one, the conversations around it; the ingestion service writes
what comes back (``sources.connectors.slack.live.slack_thread_refresh``).

Bot messages are kept (integrations post build results, issue comments, evaluations) and
marked: their names go to ``metadata["bots"]`` and ``bot_message_count``, not to ``authors`` or
``participants``. A bot message whose text is empty reads its attachments' pretext, title and
text. Joins, leaves and other channel events are skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sources.connectors.base import Connector, DocumentRow, IngestReport
from sources.connectors.slack.client import LazyUserNames, SlackClient, SlackError
from sources.connectors.slack.config import SlackConfig
from sources.connectors.slack.distill import Distiller, source_distiller
from sources.connectors.slack.messages import SlackMessage, ts_key, valid_ts
from sources.connectors.slack.rows import (
    SlackChannel,
    SlackRenderer,
    channel_rows,
    collect_messages,
    conversation_rows,
    group_conversations,
    is_thread,
    split_threads,
    thread_rows,
)

CHANNEL_CACHE_SECONDS = 60.0
MAX_WINDOW_SECONDS = 14 * 24 * 3600  # the widest history window a live refresh reads around a message

_channel_cache: dict[tuple[str, str], tuple[float, SlackChannel]] = {}
_channel_cache_lock = threading.Lock()


@dataclass
class ConversationWindow:
    """The conversation rows between ``lo_ts`` and ``hi_ts`` (inclusive) of one channel, as they are now.

    ``rows`` holds the conversation rows and their ``burst`` rows. Stored conversation rows of
    the channel overlapping that range and not among ``rows`` are stale (and so are their bursts).
    """

    channel_id: str
    lo_ts: str
    hi_ts: str
    rows: list[DocumentRow] = field(default_factory=list)


@dataclass
class ThreadRefresh:
    """What one live refresh found: the thread's row (``None``: no thread any more) with its
    ``burst_rows``, and, when the thread's parent is or became a loose message, the conversation
    window around it. Stored bursts of the thread not among ``burst_rows`` are stale."""

    thread_external_id: str
    thread_row: DocumentRow | None
    window: ConversationWindow | None
    burst_rows: list[DocumentRow] = field(default_factory=list)


class SlackConnector(Connector):
    """Rows from Slack's Web API; see the module docstring for the row shapes and live refreshes."""

    kind = "slack"
    config_model = SlackConfig
    config: SlackConfig

    def __init__(self, config: dict[str, Any], *, include=None, exclude=None) -> None:
        super().__init__(config, include=include, exclude=exclude)
        self._client: SlackClient | None = None
        self._own_ids: frozenset[str] | None = None  # the app's user and bot ids (auth.test), read once
        self.distiller = Distiller()

    def bind_source(self, *, tenant_id: int, source_id: int) -> None:
        """Use the data source's term statistics and stored distillations (called by the
        ingestion service before a run or a live refresh)."""
        self.distiller = source_distiller(tenant_id=tenant_id, source_id=source_id)

    @property
    def client(self) -> SlackClient:
        if self._client is None:
            self._client = SlackClient(
                token=self.config.token.get_secret_value(),
                base_url=self.config.base_url,
                page_size=self.config.page_size,
                rate_limit_retries=self.config.rate_limit_retries,
            )
        return self._client

    # -- full run ------------------------------------------------------------------------------

    def iter_rows(self, report: IngestReport) -> Iterator[DocumentRow]:
        """Yield every configured channel's rows, channel by channel in config order.

        Sets ``report.total`` to the number of channels. A channel Slack says does not exist
        (``channel_not_found``) is ``report.skip``-ped (its rows then vanish with the run). Any
        other failure (bad token, rate limit outlasting the retries, network) raises
        ``ConnectorError`` with the token redacted: the run fails and earlier rows stay.
        """
        self._own_ids = self._identity(self.client.auth_test())
        report.total = len(self.config.channels)
        report.unit = "channels"
        for channel_id in self.config.channels:
            try:
                channel = self.channel(channel_id, fresh=True)
            except SlackError as exc:
                if exc.error != "channel_not_found":
                    raise
                report.skip(channel_id, "Slack says the channel does not exist (channel_not_found)")
                report.advance()
                continue
            messages = self._backfill_messages(channel, report)
            self._record_members(channel)
            report.advance()
            yield from channel_rows(
                channel,
                messages,
                gap_minutes=self.config.conversation_gap_minutes,
                workspace_url=self.config.workspace_url,
                mark_bots=True,
                distiller=self.distiller,
            )
        self._record_user_groups()

    def _record_members(self, channel: SlackChannel) -> None:
        """Put a private channel's members in ``self.directory`` as ``slack:<id>`` with the name
        and email ``users.info`` gives (cached), so the people its rows name can be linked to
        portal users. Public channels' rows name nobody, so their members are not looked up."""
        self._record_people(channel.members)

    def _record_people(self, user_ids: list[str]) -> None:
        for member in user_ids:
            name, email = self.client.user_profile(member)
            self.directory.person(f"slack:{member}", email=email, name=name or "")

    def _record_user_groups(self) -> None:
        """Put the workspace's user groups in ``self.directory`` as ``slack-group:<id>`` (named by
        their handle) with their members ``slack:<user id>``, and the members as people, so a row
        of any source restricted to a Slack user group reaches its members once they are linked.
        A disabled group (``date_delete`` set) is left out; a token that may not list groups
        leaves every group out (nobody is taken to be in one)."""
        for group in self.client.user_groups() or []:
            ident = str(group.get("id") or "").strip()
            if not ident or group.get("date_delete"):
                continue
            members = [str(u).strip() for u in group.get("users") or [] if str(u).strip()]
            self._record_people(members)
            name = str(group.get("handle") or group.get("name") or ident)
            self.directory.group(f"slack-group:{ident}", name=name, members=[f"slack:{m}" for m in members])

    def _backfill_messages(self, channel: SlackChannel, report: IngestReport) -> list[SlackMessage]:
        renderer = self._renderer()
        by_ts: dict[str, SlackMessage] = {}
        raw_messages = list(self.client.history(channel.id))
        for raw in list(raw_messages):
            if isinstance(raw, dict) and _has_replies(raw):
                raw_messages.extend(self.client.replies(channel.id, str(raw["ts"])) or [])
        collect_messages(renderer, raw_messages, channel.id, report, by_ts)
        return sorted(by_ts.values(), key=lambda m: ts_key(m.ts))

    # -- live refresh --------------------------------------------------------------------------

    def refresh_thread(self, channel_id: str, thread_ts: str, *, had_thread_row: bool) -> ThreadRefresh:
        """Re-fetch the whole thread ``thread_ts`` (``conversations.replies``) and say what to write.

        ``thread_row`` is the thread as it is now, or ``None`` when Slack has no thread there
        (``thread_not_found``, parent deleted with no replies left, or a message without
        replies). ``window`` is set when the parent is loose now or was loose before
        (``had_thread_row`` false: a first reply moves it out of its conversation), and then
        holds the conversation rows around ``thread_ts``. Raises ``SlackError``.
        """
        channel = self.channel(channel_id)
        raw_messages = self.client.replies(channel_id, thread_ts)
        renderer = self._renderer()
        group: list[SlackMessage] = []
        seen: set[str] = set()
        for raw in raw_messages or []:
            if not isinstance(raw, dict) or not valid_ts(raw.get("ts")):
                continue
            message = renderer.message(raw)
            if message is None or message.ts in seen:
                continue
            if message.ts == thread_ts or message.thread_ts == thread_ts:
                seen.add(message.ts)
                group.append(message)
        external_id = f"{channel_id}:{thread_ts}"
        row, bursts = None, []
        if group and is_thread(thread_ts, group):
            row, *bursts = thread_rows(
                channel,
                thread_ts,
                group,
                workspace_url=self.config.workspace_url,
                mark_bots=True,
                distiller=self.distiller,
            )
        window = None
        if row is None or not had_thread_row:
            window = self.conversation_window(channel, thread_ts)
        return ThreadRefresh(thread_external_id=external_id, thread_row=row, window=window, burst_rows=bursts)

    def conversation_window(self, channel: SlackChannel, ts: str) -> ConversationWindow:
        """The conversation rows around ``ts``, read from ``conversations.history``.

        Reads ``ts`` ± a span (4 gaps, at least an hour), doubling it while the conversation
        before or after ``ts`` may continue past the span's edge (up to ``MAX_WINDOW_SECONDS``).
        The window runs from the start of the last conversation beginning at or before ``ts``
        to the end of the first one beginning after it: every stored conversation row that held
        a message at ``ts`` lies inside, whether that message was added, edited or deleted.
        """
        gap = self.config.conversation_gap_minutes * 60
        center = float(ts)
        span = max(4 * gap, 3600.0)
        while True:
            lo_bound, hi_bound = center - span, center + span
            renderer = self._renderer()
            messages: dict[str, SlackMessage] = {}
            for raw in self.client.history(channel.id, oldest=f"{lo_bound:.6f}", latest=f"{hi_bound:.6f}"):
                if isinstance(raw, dict) and valid_ts(raw.get("ts")):
                    message = renderer.message(raw)
                    if message is not None:
                        messages.setdefault(message.ts, message)
            _, loose = split_threads(list(messages.values()))
            groups = group_conversations(loose, gap_seconds=gap)
            before = [g for g in groups if g[0].seconds <= center]
            after = [g for g in groups if g[0].seconds > center]
            first = before[-1] if before else (after[0] if after else None)
            last = after[0] if after else first
            open_below = first is not None and first[0].seconds - lo_bound <= gap
            open_above = last is not None and hi_bound - last[-1].seconds <= gap and hi_bound < time.time()
            if not (open_below or open_above) or span >= MAX_WINDOW_SECONDS:
                break
            span *= 2
        if first is None or last is None:
            return ConversationWindow(channel_id=channel.id, lo_ts=ts, hi_ts=ts)
        chosen = groups[groups.index(first) : groups.index(last) + 1]
        rows = [
            row
            for g in chosen
            for row in conversation_rows(
                channel, g, workspace_url=self.config.workspace_url, mark_bots=True, distiller=self.distiller
            )
        ]
        lo_ts = min(first[0].ts, ts, key=ts_key)
        hi_ts = max(last[-1].ts, ts, key=ts_key)
        return ConversationWindow(channel_id=channel.id, lo_ts=lo_ts, hi_ts=hi_ts, rows=rows)

    # -- shared --------------------------------------------------------------------------------

    def channel(self, channel_id: str, *, fresh: bool = False) -> SlackChannel:
        """The channel's name, privacy and (private only) members; cached for a minute per process.

        ``fresh`` skips the cache (full runs). Raises ``SlackError`` (``channel_not_found``...).
        """
        key = (self.client._cache_scope, channel_id)
        now = time.monotonic()
        if not fresh:
            with _channel_cache_lock:
                cached = _channel_cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        info = self.client.channel(channel_id)
        private = bool(info.get("is_private") or info.get("is_group"))
        members = self.client.members(channel_id) if private else []
        channel = SlackChannel(
            id=channel_id, name=str(info.get("name") or channel_id), private=private, members=members
        )
        with _channel_cache_lock:
            _channel_cache[key] = (now + CHANNEL_CACHE_SECONDS, channel)
        return channel

    @staticmethod
    def _identity(auth: Any) -> frozenset[str]:
        """The app's own ids from ``auth.test`` (``user_id``, ``bot_id``): its messages are skipped."""
        data = auth if isinstance(auth, dict) else {}
        return frozenset(str(data[k]) for k in ("user_id", "bot_id") if data.get(k))

    def _renderer(self) -> SlackRenderer:
        users = LazyUserNames(self.client)  # looks names up on first use, as a Mapping would
        if self._own_ids is None:
            self._own_ids = self._identity(self.client.auth_test())
        return SlackRenderer(
            users=users,  # type: ignore[arg-type]
            channel_names={},
            attachment_text=True,
            own_ids=self._own_ids,
        )


def _has_replies(raw: dict[str, Any]) -> bool:
    count = raw.get("reply_count")
    return isinstance(count, int) and count > 0 and valid_ts(raw.get("ts"))
