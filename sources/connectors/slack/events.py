"""Slack Socket Mode: receive Events API envelopes, ack them at once, turn messages into thread refreshes.

:class:`SlackEventStream` wraps ``slack_sdk.socket_mode.SocketModeClient`` (the built-in client:
no extra dependency). It calls ``apps.connections.open`` with the app-level token on the
configured Web API ``base_url`` to get the WebSocket URL, answers every envelope with
``{"envelope_id": ...}`` before doing anything else (Slack redelivers an envelope not acked
within 3 s), drops an ``event_id`` it has seen recently (a bounded in-memory set; the caller's
handler adds a database guard that survives restarts) and hands each message event that can
change a row to the handler as a :class:`SlackChange`. With a ``bot`` callable, the events
addressed to the app (``app_mention``, a direct message, ``reaction_added``: see
:func:`for_bot`) go to it instead, on the same connection: Slack delivers each event to one
connection of an app, so ingestion and the bot (``search.slack_bot``) must share it. Nothing
here touches the database.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.socket_mode import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from sources.connectors.base import ConnectorError, json_object
from sources.connectors.slack.client import SlackError, redact_tokens
from sources.connectors.slack.config import SlackConfig
from sources.connectors.slack.messages import valid_ts
from sources.connectors.slack.rows import NOISE_SUBTYPES

logger = logging.getLogger(__name__)

RECENT_EVENT_IDS = 10_000

# Subtypes that change what a row says. ``message_replied`` is left out: Slack sends the reply
# itself as its own event, which refreshes the same thread.
EDIT = "message_changed"
DELETE = "message_deleted"


@dataclass(frozen=True)
class SlackChange:
    """One message event reduced to what must be refreshed.

    ``ts`` is the message the event is about; ``thread_ts`` the thread to re-fetch (the
    message's own ``ts`` for a top-level message); ``action`` is ``"message"`` (new),
    ``"edit"`` or ``"delete"``; ``bot`` marks an integration's message.
    """

    event_id: str
    channel: str
    ts: str
    thread_ts: str
    action: str
    bot: bool = False


def parse_event(payload: dict[str, Any], *, channels: Collection[str]) -> SlackChange | None:
    """The change an Events API ``event_callback`` payload asks for, or ``None`` to ignore it.

    Ignored: payloads without an ``event_id``, events other than ``message``, channels not in
    ``channels``, channel noise (joins, leaves, topics, pins: ``rows.NOISE_SUBTYPES``)
    and ``message_replied`` (the reply's own event does the work).
    """
    event_id = payload.get("event_id")
    event = payload.get("event")
    if not isinstance(event_id, str) or not event_id or not isinstance(event, dict):
        return None
    if event.get("type") != "message" or event.get("channel") not in channels:
        return None
    channel = str(event["channel"])
    subtype = event.get("subtype")
    if subtype == EDIT:
        message = json_object(event.get("message"))
        ts = message.get("ts")
        thread_ts = message.get("thread_ts") or ts
        action, bot = "edit", bool(message.get("bot_id")) and not message.get("user")
    elif subtype == DELETE:
        previous = json_object(event.get("previous_message"))
        ts = event.get("deleted_ts") or previous.get("ts")
        thread_ts = previous.get("thread_ts") or ts
        action, bot = "delete", bool(previous.get("bot_id")) and not previous.get("user")
    elif subtype in NOISE_SUBTYPES:
        return None
    else:
        ts = event.get("ts")
        thread_ts = event.get("thread_ts") or ts
        action, bot = "message", subtype == "bot_message" or (bool(event.get("bot_id")) and not event.get("user"))
    if not valid_ts(ts) or not valid_ts(thread_ts):
        return None
    return SlackChange(event_id=event_id, channel=channel, ts=str(ts), thread_ts=str(thread_ts), action=action, bot=bot)


BOT_EVENT_TYPES = frozenset({"app_mention", "reaction_added"})


def for_bot(payload: dict[str, Any]) -> bool:
    """Whether an Events API payload is addressed to the app itself: a mention, a reaction, or
    a message in a direct conversation with it (``channel_type`` ``im``)."""
    event = payload.get("event")
    if not isinstance(event, dict):
        return False
    return event.get("type") in BOT_EVENT_TYPES or (
        event.get("type") == "message" and event.get("channel_type") == "im"
    )


class SlackEventStream:
    """A Socket Mode connection feeding :class:`SlackChange` objects to ``handler``.

    ``handler(change)`` runs on one of the client's worker threads (``concurrency`` of them),
    after the envelope was acked, and returns false when its own (durable) guard had already
    seen the event id (counted as a duplicate); an exception in it is logged (token-redacted) and counted in
    ``stats["failed"]``, never propagated. ``bot(payload)``, when given, takes the events
    :func:`for_bot` picks and returns what it did (counted as ``stats["bot_<outcome>"]``; its
    exceptions are logged and counted in ``failed`` too). ``stats`` counts ``envelopes``,
    ``acked``, ``duplicates``, ``ignored``, ``handled`` and ``failed``. Raises
    ``ConnectorError`` when the config has no ``app_token``.
    """

    def __init__(
        self,
        *,
        config: SlackConfig,
        handler: Callable[[SlackChange], bool],
        concurrency: int = 4,
        recent_size: int = RECENT_EVENT_IDS,
        bot: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        if config.app_token is None:
            raise ConnectorError("Socket Mode needs the app-level token: add app_token (xapp-...) to the config")
        self.config = config
        self.handler = handler
        self.bot = bot
        self.channels = frozenset(config.channels)
        self.recent_size = recent_size
        self.stats: Counter[str] = Counter()
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._secrets = [s.get_secret_value() for s in (config.app_token, config.token) if s is not None]
        web = WebClient(
            base_url=config.base_url,
            retry_handlers=[
                RateLimitErrorRetryHandler(max_retry_count=config.rate_limit_retries),
                ConnectionErrorRetryHandler(max_retry_count=2),
            ],
        )
        self.client = SocketModeClient(
            app_token=config.app_token.get_secret_value(),
            web_client=web,
            concurrency=concurrency,
            logger=logging.getLogger("sources.slack.socket_mode"),
        )
        self.client.socket_mode_request_listeners.append(self._on_request)  # type: ignore[arg-type]  # a SocketModeClient

    def connect(self) -> None:
        """Open the WebSocket (``apps.connections.open`` first). Raises ``SlackError``, token-redacted."""
        try:
            self.client.connect()
        except (SlackClientError, OSError, ValueError) as exc:
            raise SlackError(self.redact(f"Socket Mode connection failed: {type(exc).__name__}: {exc}")) from None

    def is_connected(self) -> bool:
        return self.client.is_connected()

    def close(self) -> None:
        """Close the connection and stop the client's threads (pending handlers finish first)."""
        self.client.close()

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact_tokens(text)

    def seen_recently(self, event_id: str) -> bool:
        """Record ``event_id``; true when it was already among the last ``recent_size`` ids."""
        with self._lock:
            if event_id in self._recent:
                self._recent.move_to_end(event_id)
                return True
            self._recent[event_id] = None
            while len(self._recent) > self.recent_size:
                self._recent.popitem(last=False)
            return False

    def _on_request(self, client: SocketModeClient, request: SocketModeRequest) -> None:
        # Ack first: Slack only waits 3 s, and a slow refresh must not cause redelivery.
        client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
        with self._lock:
            self.stats["envelopes"] += 1
            self.stats["acked"] += 1
        if request.type != "events_api" or not isinstance(request.payload, dict):
            self._count("ignored")
            return
        event_id = request.payload.get("event_id")
        if isinstance(event_id, str) and event_id and self.seen_recently(event_id):
            self._count("duplicates")
            return
        if self.bot is not None and for_bot(request.payload):
            try:
                outcome = self.bot(request.payload)
            except Exception as exc:  # logged and counted; the asker may ask again
                logger.error("Slack bot event %s failed: %s", event_id, self.redact(repr(exc)))
                self._count("failed")
                return
            self._count(f"bot_{outcome}")
            return
        change = parse_event(request.payload, channels=self.channels)
        if change is None:
            self._count("ignored")
            return
        try:
            applied = self.handler(change)
        except Exception as exc:  # logged and counted; the next full sync repairs what was missed
            logger.error("Slack event %s could not be applied: %s", change.event_id, self.redact(repr(exc)))
            with self._lock:
                self._recent.pop(change.event_id, None)
            self._count("failed")
            return
        self._count("handled" if applied else "duplicates")

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1
