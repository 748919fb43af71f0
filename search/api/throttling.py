"""Request rates per API token (or per logged-in user): ``ask`` and everything else (``api``).

Rates are ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (settings: ``KB_API_THROTTLE_ASK``,
``KB_API_THROTTLE``; e.g. ``30/min``), read on each request, so a settings change applies at
once. Counts live in Django's default cache (per process with the default local-memory cache;
configure a shared cache such as Redis to count across processes). Over the rate: HTTP 429
with ``Retry-After`` (seconds).
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from projects.selectors import TokenIdentity


class CallerRateThrottle(SimpleRateThrottle):
    """DRF's sliding-window throttle (request times kept per key), keyed by token, else user, else address."""

    def get_rate(self) -> str | None:
        # DRF binds THROTTLE_RATES when the class is defined; read the live settings instead.
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope or "")
        return str(rate) if rate is not None else None

    def get_cache_key(self, request: Request, view) -> str:
        if isinstance(request.auth, TokenIdentity):
            ident = f"token-{request.auth.token_id}"
        elif request.user is not None and request.user.is_authenticated and request.user.pk is not None:
            ident = f"user-{request.user.pk}"
        else:
            ident = f"addr-{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AskThrottle(CallerRateThrottle):
    """``POST /api/v1/ask``: each call runs the whole answer pipeline."""

    scope = "ask"


class ApiThrottle(CallerRateThrottle):
    """Every other endpoint."""

    scope = "api"
