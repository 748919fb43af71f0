"""The GitHub REST API calls the connector makes, on a ``requests.Session`` with a base URL.

Every list is read page by page through the ``Link: <...>; rel="next"`` header GitHub sends
(the next URL already carries the query), so no page is skipped and none is guessed. A rate
limit (HTTP 403 or 429 with ``Retry-After``, or with ``X-RateLimit-Remaining: 0`` and
``X-RateLimit-Reset``, as in GitHub's "Rate limits for the REST API" page) is waited out and the
same request is sent again; a wait longer than ``max_wait_seconds``, or more than ``retries``
rate-limited answers for one request, raises :class:`GitHubRateLimited` instead: the run fails
and keeps what it had rather than dropping a page. The token is never part of a message: every
error text is passed through :meth:`GitHubClient.redact`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import requests

from sources.connectors.http import RestClient, RestError, RestRateLimited, shown

API_VERSION = "2022-11-28"
SECONDARY_LIMIT_DEFAULT_WAIT = 60.0  # GitHub: "wait for at least one minute" when no header says how long


class GitHubError(RestError):
    """A REST call failed; ``status`` is the HTTP status (0 when no answer came)."""


class GitHubRateLimited(GitHubError, RestRateLimited):
    """Still rate limited after the retries, or the reset is further away than allowed;
    ``retry_after`` is GitHub's wait in seconds."""


class GitHubClient(RestClient):
    """Paginated, rate-limit-aware GETs against one GitHub REST API root.

    ``base_url``: ``https://api.github.com`` or ``https://ghe.example/api/v3`` (no trailing
    slash). ``token``: sent as ``Authorization: Bearer``; ``None`` for anonymous reads.
    ``page_size``: ``per_page`` of every list call. ``max_wait_seconds``: the longest single
    rate-limit wait; ``retries``: rate-limited answers one request absorbs. ``sleep`` is how the
    client waits (seconds). ``waited_seconds`` adds up the time spent waiting for rate limits.
    """

    error = GitHubError
    rate_limited_error = GitHubRateLimited
    server_error_statuses = (502, 503, 504)

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        page_size: int = 100,
        max_wait_seconds: float = 900.0,
        retries: int = 5,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "kbportal",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        super().__init__(
            base_url=base_url,
            product="GitHub",
            headers=headers,
            secrets=[token or ""],
            max_wait_seconds=max_wait_seconds,
            retries=retries,
            timeout=timeout,
            sleep=sleep,
        )
        self.page_size = page_size

    def redact(self, text: str) -> str:
        """``text`` with the token (and anything shaped like a GitHub token) replaced by ``***``."""
        return redact_tokens(super().redact(text))

    def get(self, path: str, **params: Any) -> requests.Response:
        """One GET of ``path`` (``/repos/...``, or an absolute URL from a ``Link`` header).

        Waits out rate limits and retries 502/503/504 twice. Returns the 2xx response. Raises
        :class:`GitHubRateLimited`, or :class:`GitHubError` with the status and GitHub's
        ``message`` (token redacted).
        """
        return self.get_response(path, params)

    def rate_limit_wait(self, response: requests.Response, limited_before: int) -> float | None:
        """Seconds to wait when the answer is a rate limit, else ``None``.

        A 403 counts only with ``Retry-After`` or ``X-RateLimit-Remaining: 0`` (any other 403 is a
        permission error, unless its message speaks of a rate limit); a 429 always does.
        """
        if response.status_code not in (403, 429):
            return None
        headers = response.headers
        retry_after = headers.get("Retry-After")
        if retry_after is not None:
            try:
                return max(0.0, float(retry_after))
            except ValueError:
                pass
        if headers.get("X-RateLimit-Remaining") == "0" and headers.get("X-RateLimit-Reset"):
            try:
                # Reset is an epoch second; +1 s because the window closes during that second.
                return max(1.0, float(headers["X-RateLimit-Reset"]) - time.time() + 1.0)
            except ValueError:
                pass
        if response.status_code == 429 or "rate limit" in self.error_message(response).lower():
            return SECONDARY_LIMIT_DEFAULT_WAIT
        return None

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a list endpoint, following ``Link: rel="next"`` until there is none.

        Raises :class:`GitHubError` when an answer is not a JSON list.
        """
        response = self.get(path, per_page=self.page_size, **params)
        while True:
            try:
                items = response.json()
            except ValueError:
                raise GitHubError(f"GitHub GET {shown(response.url)}: the answer is not JSON") from None
            if not isinstance(items, list):
                raise GitHubError(f"GitHub GET {shown(response.url)}: expected a JSON list")
            yield from items
            following = (response.links.get("next") or {}).get("url")
            if not following:
                return
            response = self.get(following)


def redact_tokens(text: str) -> str:
    """Replace anything shaped like a GitHub token (``ghp_``, ``gho_``, ``ghs_``, ``github_pat_``...) with ``***``."""
    return re.sub(r"\b(gh[pousr]_|github_pat_)[A-Za-z0-9_]+", r"\1***", text)
