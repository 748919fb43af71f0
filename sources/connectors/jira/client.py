"""HTTP client for Atlassian REST APIs (Jira and Confluence), on a ``requests.Session``.

Authentication, as both products document it: ``email`` + API ``token`` is HTTP basic auth
(Atlassian Cloud); a ``token`` alone is a personal access token sent as
``Authorization: Bearer`` (Jira / Confluence Server and Data Center). A rate limit (HTTP 429,
or 503 with ``Retry-After``; "Rate limiting" in Atlassian's Cloud REST docs) is waited out for
``Retry-After`` seconds (or the HTTP date it names; without the header, 2, 4, 8... seconds) and
the same request is sent again; a wait longer than ``max_wait_seconds`` or more than ``retries``
limited answers for one request raises :class:`AtlassianRateLimited`, so the run fails and
keeps what it stored instead of dropping a page. Credentials are never part of a message: every
error text goes through :meth:`AtlassianClient.redact`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any

import requests

from sources.connectors.base import ConnectorError

SERVER_ERROR_RETRIES = 2
DEFAULT_LIMIT_WAIT = 2.0  # seconds; doubled per limited answer when no Retry-After says how long


class AtlassianError(ConnectorError):
    """A REST call failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AtlassianRateLimited(AtlassianError):
    """Still rate limited after the retries, or asked to wait longer than allowed (seconds in
    ``retry_after``)."""

    def __init__(self, message: str, *, status: int, retry_after: float) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class AtlassianClient:
    """Rate-limit-aware JSON GETs against one product's root URL.

    ``base_url``: the site root (``https://acme.atlassian.net`` for Jira,
    ``https://acme.atlassian.net/wiki`` for Confluence), no trailing slash. ``email`` + ``token``:
    basic auth; ``token`` alone: bearer; neither: anonymous. ``product`` names the service in
    messages. ``sleep`` is how the client waits (seconds); ``waited_seconds`` adds up the time
    spent waiting for rate limits and ``requests_made`` counts HTTP requests sent.
    """

    def __init__(
        self,
        *,
        base_url: str,
        product: str,
        email: str | None = None,
        token: str | None = None,
        max_wait_seconds: float = 300.0,
        retries: int = 5,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.product = product
        self.max_wait_seconds = max_wait_seconds
        self.retries = retries
        self.timeout = timeout
        self._sleep = sleep
        self.waited_seconds = 0.0
        self.requests_made = 0
        self._secrets: list[str] = []
        self.session = requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": "kbportal"})
        if token and email:
            basic = base64.b64encode(f"{email}:{token}".encode()).decode("ascii")
            self.session.headers["Authorization"] = f"Basic {basic}"
            self._secrets += [token, basic]
        elif token:
            self.session.headers["Authorization"] = f"Bearer {token}"
            self._secrets.append(token)

    def redact(self, text: str) -> str:
        """``text`` with the token and the basic-auth credential replaced by ``***``."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def url(self, path: str) -> str:
        """An absolute URL: ``path`` as is when absolute, else under ``base_url``."""
        return path if path.startswith(("https://", "http://")) else f"{self.base_url}{path}"

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` (``/rest/api/...`` or absolute) and return the decoded JSON body.

        Waits out rate limits and retries 502/504 twice. Raises :class:`AtlassianRateLimited`,
        or :class:`AtlassianError` with the status and the service's own error message
        (``errorMessages`` / ``message``), credentials redacted.
        """
        url = self.url(path)
        limited = server_errors = 0
        while True:
            try:
                self.requests_made += 1
                response = self.session.get(url, params=params or None, timeout=self.timeout)
            except requests.RequestException as exc:
                raise AtlassianError(
                    self.redact(f"{self.product} GET {_shown(url)} failed: {type(exc).__name__}: {exc}")
                ) from None
            status = response.status_code
            if status < 300:
                try:
                    return response.json()
                except ValueError:
                    raise AtlassianError(f"{self.product} GET {_shown(url)}: the answer is not JSON") from None
            wait = _rate_limit_wait(response, limited)
            if wait is not None:
                limited += 1
                if limited > self.retries or wait > self.max_wait_seconds:
                    raise AtlassianRateLimited(
                        self.redact(
                            f"{self.product} GET {_shown(url)}: rate limited (HTTP {status}) for {wait:.0f} s more "
                            f"(after {limited - 1} waits; at most {self.max_wait_seconds:.0f} s a wait)"
                        ),
                        status=status,
                        retry_after=wait,
                    )
                self._sleep(wait)
                self.waited_seconds += wait
                continue
            if status in (502, 504) and server_errors < SERVER_ERROR_RETRIES:
                server_errors += 1
                self._sleep(float(server_errors))
                continue
            raise AtlassianError(
                self.redact(f"{self.product} GET {_shown(url)} failed: HTTP {status}: {_message(response)}"),
                status=status,
            )


def _shown(url: str) -> str:
    return url.split("?", 1)[0]


def _message(response: requests.Response) -> str:
    """The error text Jira (``errorMessages``, ``errors``) or Confluence (``message``) sends."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200].strip() or response.reason or ""
    if isinstance(body, dict):
        parts = [str(m) for m in body.get("errorMessages") or [] if m]
        errors = body.get("errors")
        if isinstance(errors, dict):
            parts += [f"{k}: {v}" for k, v in errors.items()]
        if body.get("message"):
            parts.append(str(body["message"]))
        if parts:
            return "; ".join(parts)[:300]
    return response.reason or ""


def _rate_limit_wait(response: requests.Response, limited_before: int) -> float | None:
    """Seconds to wait when the answer is a rate limit (429, or 503 with ``Retry-After``), else ``None``."""
    status = response.status_code
    retry_after = response.headers.get("Retry-After")
    if status not in (429, 503) or (status == 503 and retry_after is None):
        return None
    if retry_after is not None:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            try:
                return max(0.0, parsedate_to_datetime(retry_after).timestamp() - time.time())
            except (TypeError, ValueError):
                pass
    return DEFAULT_LIMIT_WAIT * (2**limited_before)
