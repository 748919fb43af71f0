"""A local Slack on loopback: the Web API (HTTP JSON) and Socket Mode (WebSocket), for tests.

:class:`SlackWorld` is a workspace's state built by applying real Events API message events
(new messages, thread replies, ``message_changed``, ``message_deleted``, bot messages) the way
Slack does: a reply bumps its parent's ``reply_count``/``reply_users``/``latest_reply``, a
deleted parent with replies becomes a ``tombstone``, an edit replaces the text and keeps the
thread fields. :class:`FakeSlack` serves that state:

- ``POST|GET /api/<method>`` for ``auth.test``, ``conversations.history`` (newest first,
  ``oldest``/``latest``/``inclusive``, cursor pages), ``conversations.replies`` (parent then
  replies, cursor pages, ``thread_not_found``), ``conversations.info``, ``conversations.members``
  (cursor pages), ``users.info``, ``usergroups.list`` (``missing_scope`` while the world has
  none), ``chat.postMessage`` (recorded in ``posted``, answered with a new ``ts``; the message
  is not added to the world) and ``apps.connections.open`` (app-level token only), answering
  ``invalid_auth`` to a wrong bearer token, and HTTP 429 with ``Retry-After`` when a rate limit
  is armed (:meth:`FakeSlack.rate_limit`). Every request is logged with its time and status.
- a WebSocket server (the ``websockets`` library) at the URL ``apps.connections.open`` hands
  out: it sends ``hello``, then each :meth:`FakeSlack.push`-ed event as an ``events_api``
  envelope, and records each ``{"envelope_id": ...}`` ack with its arrival time.
"""

from __future__ import annotations

import base64
import copy
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

BOT_TOKEN = "xoxb-1111-2222-TESTBOTSECRET"
APP_TOKEN = "xapp-1-A0TEST-3333-TESTAPPSECRET"
TEAM_ID = "T03RZGPFR"


def _key(ts: str) -> tuple[int, int]:
    seconds, _, fraction = ts.partition(".")
    return int(seconds), int(fraction.ljust(6, "0")[:6])


class SlackWorld:
    """Channels, users and messages of one workspace, updated by :meth:`apply`.

    ``channels``: id -> name; ``private``: id -> member ids for private channels; ``users``:
    id -> profile (``real_name``, ``display_name``, ``name``); ``usergroups``: user groups as
    ``usergroups.list`` shows them (``id``, ``handle``, ``users``...), ``None`` for a token
    without ``usergroups:read``.
    """

    def __init__(
        self,
        *,
        channels: dict[str, str],
        users: dict[str, dict[str, Any]] | None = None,
        private: dict[str, list[str]] | None = None,
        usergroups: list[dict[str, Any]] | None = None,
    ) -> None:
        self.channels = dict(channels)
        self.usergroups = usergroups  # None: the token lacks usergroups:read
        self.users = dict(users or {})
        self.private = dict(private or {})
        self.messages: dict[str, dict[str, dict[str, Any]]] = {cid: {} for cid in channels}
        self.lock = threading.RLock()

    # -- applying events -----------------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> None:
        """Change the state as Slack would on this message event."""
        if event.get("type") != "message" or event.get("channel") not in self.messages:
            return
        with self.lock:
            channel = self.messages[event["channel"]]
            subtype = event.get("subtype")
            if subtype == "message_replied":
                return  # the reply's own event already changed the parent
            if subtype == "message_changed":
                self._change(channel, event["message"])
            elif subtype == "message_deleted":
                self._delete(channel, event.get("deleted_ts") or event["previous_message"]["ts"])
            else:
                self._add(channel, event)

    def _add(self, channel: dict[str, dict[str, Any]], event: dict[str, Any]) -> None:
        message = {
            k: v for k, v in event.items() if k not in ("channel", "event_ts", "source_team", "user_profile", "hidden")
        }
        ts = message["ts"]
        thread_ts = message.get("thread_ts")
        channel[ts] = message
        if thread_ts and thread_ts != ts:
            parent = channel.get(thread_ts)
            if parent is None:
                # The thread started before the events we have: Slack still holds its parent.
                # Its text is unknown, so it stands as a deleted parent does: a tombstone.
                parent = channel[thread_ts] = {
                    "type": "message",
                    "subtype": "tombstone",
                    "text": "This message was deleted.",
                    "ts": thread_ts,
                    "user": "USLACKBOT",
                    "hidden": True,
                }
            parent["thread_ts"] = thread_ts
            parent["reply_count"] = parent.get("reply_count", 0) + 1
            users = parent.setdefault("reply_users", [])
            if message.get("user") and message["user"] not in users:
                users.append(message["user"])
            parent["reply_users_count"] = len(users)
            parent["latest_reply"] = max(parent.get("latest_reply", ts), ts, key=_key)

    def _change(self, channel: dict[str, dict[str, Any]], changed: dict[str, Any]) -> None:
        ts = changed["ts"]
        current = channel.get(ts)
        if current is None:
            channel[ts] = {k: v for k, v in changed.items() if k != "replies"}
            return
        keep = {
            k: current[k] for k in ("reply_count", "reply_users", "reply_users_count", "latest_reply") if k in current
        }
        current.update({k: v for k, v in changed.items() if k not in ("replies", "reply_count", "unread_count")})
        current.update(keep)

    def _delete(self, channel: dict[str, dict[str, Any]], ts: str) -> None:
        message = channel.get(ts)
        if message is None:
            return
        thread_ts = message.get("thread_ts")
        if thread_ts and thread_ts != ts:  # a reply
            del channel[ts]
            parent = channel.get(thread_ts)
            if parent is not None:
                remaining = [m for m in channel.values() if m.get("thread_ts") == thread_ts and m["ts"] != thread_ts]
                parent["reply_count"] = len(remaining)
                parent["reply_users"] = list(dict.fromkeys(m["user"] for m in remaining if m.get("user")))
                parent["reply_users_count"] = len(parent["reply_users"])
                if not remaining:
                    for field in ("reply_count", "reply_users", "reply_users_count", "latest_reply", "thread_ts"):
                        parent.pop(field, None)
                    if parent.get("subtype") == "tombstone":
                        del channel[thread_ts]
                else:
                    parent["latest_reply"] = max((m["ts"] for m in remaining), key=_key)
            return
        if message.get("reply_count"):
            # A parent with replies leaves a tombstone, so the thread stays readable.
            channel[ts] = {
                "type": "message",
                "subtype": "tombstone",
                "text": "This message was deleted.",
                "ts": ts,
                "user": "USLACKBOT",
                "hidden": True,
                **{
                    k: message[k]
                    for k in ("thread_ts", "reply_count", "reply_users", "reply_users_count", "latest_reply")
                    if k in message
                },
            }
        else:
            del channel[ts]

    # -- reading -------------------------------------------------------------------------------

    def top_level(self, channel_id: str) -> list[dict[str, Any]]:
        """What ``conversations.history`` lists: messages that are not thread replies (broadcasts are)."""
        with self.lock:
            return sorted(
                (
                    copy.deepcopy(m)
                    for m in self.messages[channel_id].values()
                    if not m.get("thread_ts") or m["thread_ts"] == m["ts"] or m.get("subtype") == "thread_broadcast"
                ),
                key=lambda m: _key(m["ts"]),
                reverse=True,
            )

    def thread(self, channel_id: str, ts: str) -> list[dict[str, Any]] | None:
        """What ``conversations.replies`` returns: the parent then its replies; ``None`` if unknown."""
        with self.lock:
            channel = self.messages[channel_id]
            parent = channel.get(ts)
            if parent is None:
                return None
            if parent.get("thread_ts") and parent["thread_ts"] != ts:
                return [copy.deepcopy(parent)]  # a reply's ts: Slack answers with that reply alone
            replies = sorted(
                (m for m in channel.values() if m.get("thread_ts") == ts and m["ts"] != ts),
                key=lambda m: _key(m["ts"]),
            )
            return [copy.deepcopy(parent), *(copy.deepcopy(m) for m in replies)]


@dataclass
class Call:
    """One Web API request: when (``time.monotonic()``), which method, its parameters, the HTTP status."""

    at: float
    method: str
    params: dict[str, str]
    status: int


def _cursor(ts: str) -> str:
    return base64.b64encode(f"next_ts:{ts}".encode()).decode()


def _uncursor(cursor: str) -> str:
    return base64.b64decode(cursor.encode()).decode().split(":", 1)[1]


class FakeSlack:
    """The Web API and the Socket Mode WebSocket of :class:`SlackWorld`, on 127.0.0.1 ephemeral ports."""

    def __init__(self, world: SlackWorld, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN) -> None:
        self.world = world
        self.bot_token = bot_token
        self.app_token = app_token
        self.calls: list[Call] = []
        self.acks: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        self.posted: list[dict[str, Any]] = []  # chat.postMessage calls: params plus "ts" and "at" (monotonic)
        self._next_post = 0
        self._rate_limits: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._outbox: queue.Queue[str] = queue.Queue()
        self._connections: list[ServerConnection] = []
        self.connected = threading.Event()

        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                fake._handle(self)

            def do_POST(self) -> None:  # noqa: N802
                fake._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.ws = serve(self._ws_session, "127.0.0.1", 0)
        self._threads = [
            threading.Thread(target=self.http.serve_forever, daemon=True),
            threading.Thread(target=self.ws.serve_forever, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/api/"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws.socket.getsockname()[1]}/link/?ticket={uuid.uuid4()}&app_id=A0TEST"

    def close(self) -> None:
        for connection in list(self._connections):
            connection.close()
        self.ws.shutdown()
        self.http.shutdown()
        self.http.server_close()

    # -- test controls -------------------------------------------------------------------------

    def rate_limit(self, method: str, *, retry_after: int = 1, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with HTTP 429 and ``Retry-After: retry_after``."""
        with self._lock:
            self._rate_limits.setdefault(method, []).extend([retry_after] * times)

    def calls_of(self, method: str, **params: str) -> list[Call]:
        """Logged calls of ``method`` whose parameters include ``params``."""
        with self._lock:
            return [
                c for c in self.calls if c.method == method and all(c.params.get(k) == v for k, v in params.items())
            ]

    def push(self, event: dict[str, Any], *, event_id: str, retry_attempt: int = 0) -> str:
        """Send ``event`` as an ``events_api`` envelope; returns its ``envelope_id``."""
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
            "payload": {
                "token": "verification-token-unused-in-socket-mode",
                "team_id": TEAM_ID,
                "api_app_id": "A0TEST",
                "event": event,
                "type": "event_callback",
                "event_id": event_id,
                "event_time": int(float(event.get("event_ts") or event["ts"])),
                "authorizations": [{"team_id": TEAM_ID, "user_id": "U0BOT", "is_bot": True}],
                "is_ext_shared_channel": False,
            },
        }
        self.sent[envelope_id] = time.monotonic()
        self._outbox.put(json.dumps(envelope))
        return envelope_id

    def wait_acked(self, envelope_id: str, timeout: float = 10.0) -> float:
        """Seconds from sending the envelope to its ack; raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if envelope_id in self.acks:
                return self.acks[envelope_id] - self.sent[envelope_id]
            time.sleep(0.002)
        raise TimeoutError(f"envelope {envelope_id} was not acked within {timeout} s")

    # -- Socket Mode ---------------------------------------------------------------------------

    def _ws_session(self, connection: ServerConnection) -> None:
        self._connections.append(connection)
        connection.send(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": len(self._connections),
                    "debug_info": {"host": "applink-test", "approximate_connection_time": 18060},
                    "connection_info": {"app_id": "A0TEST"},
                }
            )
        )
        self.connected.set()
        reader = threading.Thread(target=self._read_acks, args=(connection,), daemon=True)
        reader.start()
        try:
            while reader.is_alive():
                try:
                    message = self._outbox.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    connection.send(message)
                except ConnectionClosed:
                    self._outbox.put(message)  # the next connection gets it, as Slack redelivers
                    break
        finally:
            if connection in self._connections:
                self._connections.remove(connection)
            if not self._connections:
                self.connected.clear()

    def _read_acks(self, connection: ServerConnection) -> None:
        try:
            for message in connection:
                data = json.loads(message)
                if isinstance(data, dict) and data.get("envelope_id"):
                    self.acks.setdefault(data["envelope_id"], time.monotonic())
        except ConnectionClosed:
            pass

    # -- Web API -------------------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        url = urlparse(request.path)
        method = url.path.rsplit("/", 1)[-1]
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        if body:
            if "json" in (request.headers.get("Content-Type") or ""):
                params.update({k: str(v) for k, v in json.loads(body).items()})
            else:
                params.update({k: v[-1] for k, v in parse_qs(body.decode()).items()})
        token = (request.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        with self._lock:
            pending = self._rate_limits.get(method)
            retry_after = pending.pop(0) if pending else None
        if retry_after is not None:
            self._log(method, params, 429)
            self._send(request, 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after)})
            return
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token != expected:
            self._log(method, params, 200)
            self._send(request, 200, {"ok": False, "error": "invalid_auth"})
            return
        handler = getattr(self, "_api_" + method.replace(".", "_"), None)
        data = handler(params) if handler else {"ok": False, "error": "unknown_method"}
        self._log(method, params, 200)
        self._send(request, 200, data)

    def _log(self, method: str, params: dict[str, str], status: int) -> None:
        with self._lock:
            self.calls.append(Call(at=time.monotonic(), method=method, params=params, status=status))

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, data: dict[str, Any], headers=None) -> None:
        body = json.dumps(data).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json; charset=utf-8")
        request.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            request.send_header(name, value)
        request.end_headers()
        request.wfile.write(body)

    def _page(self, items: list[Any], params: dict[str, str], key, default_limit: int = 100) -> tuple[list, str]:
        limit = max(1, min(int(params.get("limit") or default_limit), 1000))
        start = 0
        if params.get("cursor"):
            after = _uncursor(params["cursor"])
            start = next((i for i, item in enumerate(items) if key(item) == after), len(items))
        page = items[start : start + limit]
        rest = items[start + limit :]
        return page, (_cursor(key(rest[0])) if rest else "")

    def _api_auth_test(self, params: dict[str, str]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://clojurians.slack.com/",
            "team": "Clojurians",
            "user": "kbportal",
            "team_id": TEAM_ID,
            "user_id": "U0BOT",
            "bot_id": "B0BOT",
            "is_enterprise_install": False,
        }

    def _api_apps_connections_open(self, params: dict[str, str]) -> dict[str, Any]:
        return {"ok": True, "url": self.ws_url}

    def _channel_or_error(self, params: dict[str, str]) -> tuple[str | None, dict[str, Any] | None]:
        channel_id = params.get("channel", "")
        if channel_id not in self.world.channels:
            return None, {"ok": False, "error": "channel_not_found"}
        return channel_id, None

    def _api_conversations_info(self, params: dict[str, str]) -> dict[str, Any]:
        channel_id, error = self._channel_or_error(params)
        if error:
            return error
        private = channel_id in self.world.private
        return {
            "ok": True,
            "channel": {
                "id": channel_id,
                "name": self.world.channels[channel_id],
                "is_channel": not private,
                "is_group": False,
                "is_private": private,
                "is_archived": False,
                "is_member": True,
                "created": 1449252889,
                "creator": "U03RZGPFV",
            },
        }

    def _api_conversations_members(self, params: dict[str, str]) -> dict[str, Any]:
        channel_id, error = self._channel_or_error(params)
        if error:
            return error
        members = self.world.private.get(channel_id) or sorted(
            {m["user"] for m in self.world.messages[channel_id].values() if m.get("user")}
        )
        page, cursor = self._page(list(members), params, key=lambda m: m)
        return {"ok": True, "members": page, "response_metadata": {"next_cursor": cursor}}

    def _api_conversations_history(self, params: dict[str, str]) -> dict[str, Any]:
        channel_id, error = self._channel_or_error(params)
        if error:
            return error
        inclusive = params.get("inclusive") in ("1", "true", "True")
        messages = self.world.top_level(channel_id)
        if params.get("oldest"):
            low = _key(f"{float(params['oldest']):.6f}")
            messages = [m for m in messages if _key(m["ts"]) > low or (inclusive and _key(m["ts"]) == low)]
        if params.get("latest"):
            high = _key(f"{float(params['latest']):.6f}")
            messages = [m for m in messages if _key(m["ts"]) < high or (inclusive and _key(m["ts"]) == high)]
        page, cursor = self._page(messages, params, key=lambda m: m["ts"])
        return {
            "ok": True,
            "messages": page,
            "has_more": bool(cursor),
            "pin_count": 0,
            "response_metadata": {"next_cursor": cursor},
        }

    def _api_conversations_replies(self, params: dict[str, str]) -> dict[str, Any]:
        channel_id, error = self._channel_or_error(params)
        if error:
            return error
        thread = self.world.thread(channel_id, params.get("ts", ""))
        if thread is None:
            return {"ok": False, "error": "thread_not_found"}
        page, cursor = self._page(thread, params, key=lambda m: m["ts"], default_limit=1000)
        return {"ok": True, "messages": page, "has_more": bool(cursor), "response_metadata": {"next_cursor": cursor}}

    def _api_usergroups_list(self, params: dict[str, str]) -> dict[str, Any]:
        if self.world.usergroups is None:
            return {"ok": False, "error": "missing_scope", "needed": "usergroups:read", "provided": "channels:history"}
        with_users = params.get("include_users", "").lower() in ("1", "true")
        groups = [
            {
                "team_id": TEAM_ID,
                "is_usergroup": True,
                "description": "",
                "date_delete": 0,
                **{k: v for k, v in group.items() if with_users or k != "users"},
                "user_count": len(group.get("users", [])),
            }
            for group in copy.deepcopy(self.world.usergroups)
        ]
        return {"ok": True, "usergroups": groups}

    def _api_chat_postMessage(self, params: dict[str, str]) -> dict[str, Any]:  # noqa: N802 (Slack's name)
        channel, text = params.get("channel", ""), params.get("text", "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not text.strip():
            return {"ok": False, "error": "no_text"}
        with self._lock:
            self._next_post += 1
            ts = f"{int(time.time())}.{self._next_post:06d}"
            self.posted.append({**params, "ts": ts, "at": time.monotonic()})
        message = {"type": "message", "text": text, "user": "U0BOT", "bot_id": "B0BOT", "ts": ts}
        if params.get("thread_ts"):
            message["thread_ts"] = params["thread_ts"]
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    def wait_posted(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The ``chat.postMessage`` calls once there are at least ``count``; raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.posted) >= count:
                    return list(self.posted)
            time.sleep(0.01)
        raise TimeoutError(f"{len(self.posted)} of {count} messages posted within {timeout} s")

    def _api_users_info(self, params: dict[str, str]) -> dict[str, Any]:
        user_id = params.get("user", "")
        profile = self.world.users.get(user_id)
        if profile is None:
            return {"ok": False, "error": "user_not_found"}
        return {
            "ok": True,
            "user": {
                "id": user_id,
                "team_id": TEAM_ID,
                "name": profile.get("name") or user_id,
                "deleted": False,
                "real_name": profile.get("real_name") or "",
                "is_bot": False,
                "profile": {
                    "real_name": profile.get("real_name") or "",
                    "display_name": profile.get("display_name") or "",
                    **({"email": profile["email"]} if profile.get("email") else {}),  # with users:read.email
                },
            },
        }
