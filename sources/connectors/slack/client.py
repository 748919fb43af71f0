"""The Slack Web API calls the connector makes, on ``slack_sdk.WebClient``.

Every call goes through one ``WebClient`` built with the configured ``base_url`` and two retry
handlers: ``RateLimitErrorRetryHandler`` (an HTTP 429 is retried after its ``Retry-After``
seconds plus up to 1 s of jitter, ``rate_limit_retries`` times) and
``ConnectionErrorRetryHandler`` (a reset connection is retried twice). A call that still fails
raises :class:`SlackError` (or :class:`SlackRateLimited`, which carries ``retry_after`` so the
caller can come back later instead of dropping the work). The bot token is never part of a
message: every error text is passed through :meth:`SlackClient.redact`.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler

from sources.connectors.base import ConnectorError

USER_CACHE_SECONDS = 3600
USER_CACHE_SIZE = 20_000


class SlackError(ConnectorError):
    """A Web API call failed; ``error`` is Slack's error code (``channel_not_found``) or ``""``."""

    def __init__(self, message: str, *, error: str = "") -> None:
        super().__init__(message)
        self.error = error


class SlackRateLimited(SlackError):
    """Still HTTP 429 after the configured retries; ``retry_after`` is Slack's wait in seconds."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, error="ratelimited")
        self.retry_after = retry_after


class _UserNames:
    """Process-wide cache of user id -> (display name or ``None`` for unknown, profile email or
    ``""``), with a TTL.

    Each live refresh builds a new client, so names are cached across clients by token digest
    and base URL: a thread's authors cost one ``users.info`` each per hour, not per event.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], tuple[float, tuple[str | None, str]]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> tuple[bool, tuple[str | None, str]]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] < time.monotonic():
                return False, (None, "")
            self._entries.move_to_end(key)
            return True, entry[1]

    def put(self, key: tuple[str, str], profile: tuple[str | None, str]) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic() + USER_CACHE_SECONDS, profile)
            self._entries.move_to_end(key)
            while len(self._entries) > USER_CACHE_SIZE:
                self._entries.popitem(last=False)


_USER_NAMES = _UserNames()


class SlackClient:
    """Paginated, rate-limit-aware reads of channels, messages, threads and users.

    ``base_url`` is the Web API root (``https://slack.com/api/``); ``page_size`` the ``limit``
    sent with each paginated call; ``rate_limit_retries`` how many HTTP 429 answers one call
    absorbs (each after ``Retry-After``). All methods raise :class:`SlackError` on failure.
    """

    def __init__(
        self,
        *,
        token: str,
        base_url: str,
        page_size: int = 200,
        rate_limit_retries: int = 10,
        timeout: int = 30,
    ) -> None:
        self._token = token
        self.base_url = base_url
        self.page_size = page_size
        self.web = WebClient(
            token=token,
            base_url=base_url,
            timeout=timeout,
            retry_handlers=[
                RateLimitErrorRetryHandler(max_retry_count=rate_limit_retries),
                ConnectionErrorRetryHandler(max_retry_count=2),
            ],
        )
        self._cache_scope = hashlib.sha256(f"{base_url}\0{token}".encode()).hexdigest()[:16]

    def redact(self, text: str) -> str:
        """``text`` with the bot token (and any ``xox*-``/``xapp-`` token shape) replaced by ``***``."""
        if self._token:
            text = text.replace(self._token, "***")
        return redact_tokens(text)

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        """One Web API call (``method`` is the WebClient method name); the parsed JSON body."""
        api = method.replace("_", ".", 1)
        try:
            response = getattr(self.web, method)(**params)
        except SlackApiError as exc:
            status = getattr(exc.response, "status_code", None)
            error = ""
            try:
                error = str(exc.response.get("error") or "")
            except (AttributeError, TypeError):
                pass
            if status == 429:
                retry_after = _retry_after(exc.response)
                raise SlackRateLimited(
                    f"Slack {api}: still rate limited (HTTP 429) after the retries; retry after {retry_after} s",
                    retry_after=retry_after,
                ) from None
            raise SlackError(self.redact(f"Slack {api} failed: {error or f'HTTP {status}'}"), error=error) from None
        except (SlackClientError, OSError, ValueError) as exc:
            raise SlackError(self.redact(f"Slack {api} failed: {type(exc).__name__}: {exc}")) from None
        return dict(response.data) if isinstance(response.data, dict) else {}

    def _pages(self, method: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of ``key`` across cursor pages (``response_metadata.next_cursor``)."""
        cursor = None
        while True:
            data = self._call(method, limit=self.page_size, **params, **({"cursor": cursor} if cursor else {}))
            yield from data.get(key) or []
            cursor = (data.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return

    def auth_test(self) -> dict[str, Any]:
        """``auth.test``: who the token is (``team``, ``user_id``, ``url``)."""
        return self._call("auth_test")

    def channel(self, channel_id: str) -> dict[str, Any]:
        """``conversations.info``: the channel object (``name``, ``is_private``, ...)."""
        return self._call("conversations_info", channel=channel_id).get("channel") or {}

    def members(self, channel_id: str) -> list[str]:
        """``conversations.members``: every member's user id, across pages."""
        return [str(m) for m in self._pages("conversations_members", "members", channel=channel_id)]

    def history(
        self, channel_id: str, *, oldest: str | None = None, latest: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """``conversations.history``: the channel's top-level messages, newest first, across pages.

        ``oldest``/``latest`` (Slack ts strings) bound the range, both inclusive.
        """
        bounds: dict[str, Any] = {}
        if oldest is not None:
            bounds["oldest"] = oldest
        if latest is not None:
            bounds["latest"] = latest
        if bounds:
            bounds["inclusive"] = True
        yield from self._pages("conversations_history", "messages", channel=channel_id, **bounds)

    def replies(self, channel_id: str, thread_ts: str) -> list[dict[str, Any]] | None:
        """``conversations.replies``: the parent then its replies, across pages.

        ``None`` when Slack answers ``thread_not_found`` or ``message_not_found`` (the parent
        and thread are gone).
        """
        try:
            return list(self._pages("conversations_replies", "messages", channel=channel_id, ts=thread_ts))
        except SlackError as exc:
            if exc.error in ("thread_not_found", "message_not_found"):
                return None
            raise

    def user_groups(self) -> list[dict[str, Any]] | None:
        """``usergroups.list`` with ``include_users``: the workspace's user groups (``id``,
        ``handle``, ``name``, ``users``, ``date_delete``). ``None`` when the token may not read
        them (``missing_scope``: it lacks ``usergroups:read``; ``not_allowed_token_type``; a plan
        without user groups, ``paid_teams_only``): no group is then known, so nobody is in one."""
        try:
            data = self._call("usergroups_list", include_users=True)
        except SlackRateLimited:
            raise
        except SlackError as exc:
            if exc.error in ("missing_scope", "not_allowed_token_type", "paid_teams_only", "no_permission"):
                return None
            raise
        return [g for g in data.get("usergroups") or [] if isinstance(g, dict)]

    def user_name(self, user_id: str) -> str | None:
        """The user's real name (else display name, else handle) from ``users.info``, cached.

        ``None`` for a user Slack does not know (``user_not_found``, another workspace) or when
        the token lacks ``users:read``: the transcript then shows the id.
        """
        return self.user_profile(user_id)[0]

    def user_profile(self, user_id: str) -> tuple[str | None, str]:
        """``(name, email)`` of a user from ``users.info``, cached as :meth:`user_name` says.

        ``email`` is the profile's address (lower-cased), ``""`` when Slack shows none (the token
        lacks ``users:read.email``, a bot) or does not know the user.
        """
        key = (self._cache_scope, user_id)
        found, profile = _USER_NAMES.get(key)
        if found:
            return profile
        try:
            user = self._call("users_info", user=user_id).get("user") or {}
        except SlackRateLimited:
            raise
        except SlackError as exc:
            if exc.error in ("user_not_found", "missing_scope", "not_allowed_token_type", "bot_not_found"):
                _USER_NAMES.put(key, (None, ""))
                return None, ""
            raise
        fields = user.get("profile") or {}
        name = (
            fields.get("real_name") or user.get("real_name") or fields.get("display_name") or user.get("name") or None
        )
        name = str(name).strip() if name else None
        email = str(fields.get("email") or "").strip().lower()
        _USER_NAMES.put(key, (name or None, email))
        return name or None, email


class LazyUserNames:
    """A read-only mapping user id -> name that asks :meth:`SlackClient.user_name` on first use."""

    def __init__(self, client: SlackClient) -> None:
        self._client = client

    def get(self, user_id: str, default: str | None = None) -> str | None:
        return self._client.user_name(user_id) or default

    def __getitem__(self, user_id: str) -> str:
        name = self.get(user_id)
        if name is None:
            raise KeyError(user_id)
        return name


def redact_tokens(text: str) -> str:
    """Replace anything shaped like a Slack token (``xoxb-``, ``xoxp-``, ``xapp-``...) with ``xox*-***``."""
    return re.sub(r"\b(xox[abposr]|xapp)-[A-Za-z0-9-]+", r"\1-***", text)


def _retry_after(response: Any) -> int:
    try:
        headers = {k.lower(): v for k, v in (response.headers or {}).items()}
        value = headers.get("retry-after")
        if isinstance(value, list):
            value = value[0]
        return max(1, int(value))  # type: ignore[arg-type]  # a None or odd header: the except below
    except (AttributeError, TypeError, ValueError):
        return 30
