"""Login lockout (django-axes): who a failed login counts against, and the page a locked-out
client gets.

Failures count per (client address, username) in the database (``axes.AxesAttempt``, shared by
every process); after ``AXES_FAILURE_LIMIT`` failures that pair is locked out for
``AXES_COOLOFF_TIME``, whichever login form was used (allauth's ``/accounts/login/`` or the
admin's). A success resets the count.
"""

from __future__ import annotations

from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class LockoutBackend(AxesStandaloneBackend):
    """First authentication backend: refuses a locked-out (address, username) pair.

    Every login form passes the request (allauth, the admin, DRF); a call without one (the test
    client's ``login()``, a script) has no client address to count, so it passes through to
    the password backends unchecked instead of failing.
    """

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs
    ):
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def login_username(request: HttpRequest, credentials: dict | None) -> str:
    """The name a login attempt is counted under: what the user typed (username or email),
    lower-cased, from ``authenticate()``'s credentials or else the posted form."""
    credentials = credentials or {}
    for key in ("username", "email", "login"):
        value = credentials.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip().lower()
    if request is None:
        return ""
    return (request.POST.get("login") or request.POST.get("username") or "").strip().lower()


def lockout_response(request: HttpRequest, original_response=None, credentials: dict | None = None) -> HttpResponse:
    """429 with ``Retry-After`` (seconds of the lockout period) and a page saying what happened."""
    cooloff: timedelta = settings.AXES_COOLOFF_TIME
    seconds = int(cooloff.total_seconds())
    minutes = max(1, round(seconds / 60))
    response = render(
        request,
        "security/lockout.html",
        {"failure_limit": settings.AXES_FAILURE_LIMIT, "minutes": minutes},
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response
