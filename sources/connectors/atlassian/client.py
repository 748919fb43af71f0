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
from typing import TYPE_CHECKING, Any

import requests

from sources.connectors.http import RestClient, RestError, RestRateLimited, shown

if TYPE_CHECKING:
    from sources.connectors.atlassian.config import AtlassianConfig

DEFAULT_LIMIT_WAIT = 2.0  # seconds; doubled per limited answer when no Retry-After says how long


class AtlassianError(RestError):
    """A REST call failed; ``status`` is the HTTP status (0 when no answer came)."""


class AtlassianRateLimited(AtlassianError, RestRateLimited):
    """Still rate limited after the retries, or asked to wait longer than allowed (seconds in
    ``retry_after``)."""


class AtlassianClient(RestClient):
    """Rate-limit-aware JSON GETs against one product's root URL.

    ``base_url``: the site root (``https://acme.atlassian.net`` for Jira,
    ``https://acme.atlassian.net/wiki`` for Confluence), no trailing slash. ``email`` + ``token``:
    basic auth; ``token`` alone: bearer; neither: anonymous. ``product`` names the service in
    messages. ``sleep`` is how the client waits (seconds); ``waited_seconds`` adds up the time
    spent waiting for rate limits and ``requests_made`` counts HTTP requests sent.
    """

    error = AtlassianError
    rate_limited_error = AtlassianRateLimited
    server_error_statuses = (502, 504)

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
        headers = {"Accept": "application/json", "User-Agent": "kbportal"}
        secrets: list[str] = []
        if token and email:
            basic = base64.b64encode(f"{email}:{token}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {basic}"
            secrets += [token, basic]
        elif token:
            headers["Authorization"] = f"Bearer {token}"
            secrets.append(token)
        super().__init__(
            base_url=base_url,
            product=product,
            headers=headers,
            secrets=secrets,
            max_wait_seconds=max_wait_seconds,
            retries=retries,
            timeout=timeout,
            sleep=sleep,
        )

    @classmethod
    def from_config(cls, config: AtlassianConfig, *, product: str) -> AtlassianClient:
        """The client a Jira or Confluence source's config describes (``base_url`` "" for a file
        source, which never calls out)."""
        return cls(
            base_url=config.base_url or "",
            product=product,
            email=config.email,
            token=config.token.get_secret_value() if config.token is not None else None,
            max_wait_seconds=config.max_rate_limit_wait_seconds,
            retries=config.rate_limit_retries,
        )

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` (``/rest/api/...`` or absolute) and return the decoded JSON body.

        Waits out rate limits and retries 502/504 twice. Raises :class:`AtlassianRateLimited`,
        or :class:`AtlassianError` with the status and the service's own error message
        (``errorMessages`` / ``message``), credentials redacted.
        """
        response = self.get_response(path, params)
        try:
            return response.json()
        except ValueError:
            raise AtlassianError(f"{self.product} GET {shown(self.url(path))}: the answer is not JSON") from None

    def rate_limit_wait(self, response: requests.Response, limited_before: int) -> float | None:
        return _rate_limit_wait(response, limited_before)

    def error_message(self, response: requests.Response) -> str:
        return _message(response)


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
