"""The GET loop the REST connectors share (GitHub, Jira, Confluence), on a ``requests.Session``.

:class:`RestClient` sends one GET, waits out a rate limit for the seconds its subclass reads
from the answer (:meth:`RestClient.rate_limit_wait`) and sends the same request again; a wait
longer than ``max_wait_seconds``, or more than ``retries`` rate-limited answers for one request,
raises the subclass's ``rate_limited_error`` so the run fails and keeps what it stored instead of
dropping a page. A 5xx in ``server_error_statuses`` is retried twice (1 s, then 2 s). Credentials
are never part of a message: every error text goes through :meth:`RestClient.redact`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import requests

from sources.connectors.base import ConnectorError

SERVER_ERROR_RETRIES = 2


class RestError(ConnectorError):
    """A REST call failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class RestRateLimited(RestError):
    """Still rate limited after the retries, or asked to wait longer than allowed (seconds in
    ``retry_after``)."""

    def __init__(self, message: str, *, status: int, retry_after: float) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class RestClient:
    """Rate-limit-aware GETs against one REST root; subclasses name the service and its rules.

    ``base_url``: the root, trailing slash dropped. ``headers``: sent with every request (the
    ``Authorization`` header among them); ``secrets``: the strings :meth:`redact` hides.
    ``max_wait_seconds``: the longest single rate-limit wait; ``retries``: rate-limited answers
    one request absorbs; ``timeout``: seconds per request. ``sleep`` is how the client waits
    (seconds); ``waited_seconds`` adds up the time spent waiting for rate limits and
    ``requests_made`` counts HTTP requests sent.
    """

    error: ClassVar[type[RestError]] = RestError
    rate_limited_error: ClassVar[type[RestRateLimited]] = RestRateLimited
    server_error_statuses: ClassVar[tuple[int, ...]] = (502, 504)

    def __init__(
        self,
        *,
        base_url: str,
        product: str,
        headers: dict[str, str],
        secrets: list[str],
        max_wait_seconds: float,
        retries: int,
        timeout: float,
        sleep: Callable[[float], None],
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.product = product
        self.max_wait_seconds = max_wait_seconds
        self.retries = retries
        self.timeout = timeout
        self._sleep = sleep
        self.waited_seconds = 0.0
        self.requests_made = 0
        self._secrets = [s for s in secrets if s]
        self.session = requests.Session()
        self.session.headers.update(headers)

    def redact(self, text: str) -> str:
        """``text`` with every credential the client holds replaced by ``***``."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def url(self, path: str) -> str:
        """An absolute URL: ``path`` as is when absolute, else under ``base_url``."""
        return path if path.startswith(("https://", "http://")) else f"{self.base_url}{path}"

    def rate_limit_wait(self, response: requests.Response, limited_before: int) -> float | None:
        """Seconds to wait when ``response`` is a rate limit, else ``None`` (none by default)."""
        return None

    def error_message(self, response: requests.Response) -> str:
        """The service's own error text in a failed answer (``message``), else the reason phrase."""
        try:
            body = response.json()
        except ValueError:
            return response.text[:200].strip() or response.reason or ""
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])[:300]
        return response.reason or ""

    def get_response(self, path: str, params: dict[str, Any] | None = None) -> requests.Response:
        """One GET of ``path`` (under ``base_url``, or absolute); returns the 2xx response.

        Raises ``rate_limited_error``, or ``error`` with the status and the service's message
        (credentials redacted).
        """
        url = self.url(path)
        limited = server_errors = 0
        while True:
            try:
                self.requests_made += 1
                response = self.session.get(url, params=params or None, timeout=self.timeout)
            except requests.RequestException as exc:
                raise self.error(
                    self.redact(f"{self.product} GET {shown(url)} failed: {type(exc).__name__}: {exc}")
                ) from None
            status = response.status_code
            if status < 300:
                return response
            wait = self.rate_limit_wait(response, limited)
            if wait is not None:
                limited += 1
                if limited > self.retries or wait > self.max_wait_seconds:
                    raise self.rate_limited_error(
                        self.redact(
                            f"{self.product} GET {shown(url)}: rate limited (HTTP {status}) for {wait:.0f} s more "
                            f"(after {limited - 1} waits; at most {self.max_wait_seconds:.0f} s a wait)"
                        ),
                        status=status,
                        retry_after=wait,
                    )
                self._sleep(wait)
                self.waited_seconds += wait
                continue
            if status in self.server_error_statuses and server_errors < SERVER_ERROR_RETRIES:
                server_errors += 1
                self._sleep(float(server_errors))
                continue
            raise self.error(
                self.redact(f"{self.product} GET {shown(url)} failed: HTTP {status}: {self.error_message(response)}"),
                status=status,
            )


def shown(url: str) -> str:
    """``url`` without its query string, as messages show it."""
    return url.split("?", 1)[0]
