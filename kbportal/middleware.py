"""Request ids: every request gets one, every response carries it, the audit log records it.

:class:`RequestIdMiddleware` (first in ``MIDDLEWARE``) keeps a caller's ``X-Request-ID`` when
it is 8-64 characters of ``[A-Za-z0-9._-]``, else makes a new one (32 hex digits), stores it as
``request.request_id``, answers it in the ``X-Request-ID`` response header, and makes the
request available to :func:`current_request` while the view runs and while a streamed
response produces each chunk (a server-sent answer records its audit event at the end of the
stream, after the view has returned). The API's JSON errors quote the same id.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.http import FileResponse, HttpRequest, HttpResponseBase, StreamingHttpResponse

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{8,64}")

_current_request: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar("kb_request", default=None)


def request_id_for(request: Any) -> str:
    """The id of ``request``: the one the middleware assigned, else the caller's ``X-Request-ID``
    when it is 8-64 safe characters, else a new UUID (hex). Works on Django and DRF requests."""
    assigned = getattr(request, "request_id", None) if request is not None else None
    if isinstance(assigned, str) and assigned:
        return assigned
    meta = getattr(request, "META", {}) if request is not None else {}
    given = meta.get("HTTP_X_REQUEST_ID", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def current_request() -> HttpRequest | None:
    """The request being handled in this thread (inside :class:`RequestIdMiddleware`), or ``None``
    (management commands, Celery tasks, tests calling services directly)."""
    return _current_request.get()


def _in_request(request: HttpRequest, content: Iterable[bytes]) -> Iterator[bytes]:
    """``content`` with the request current while each chunk is produced (and only then)."""
    iterator = iter(content)
    while True:
        token = _current_request.set(request)
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        finally:
            _current_request.reset(token)
        yield chunk


class RequestIdMiddleware:
    """Assigns ``request.request_id``, sets ``X-Request-ID`` on every response (module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request.request_id = request_id_for(request)  # type: ignore[attr-defined]
        token = _current_request.set(request)
        try:
            response = self.get_response(request)
        finally:
            _current_request.reset(token)
        response[REQUEST_ID_HEADER] = request.request_id  # type: ignore[attr-defined]
        if (
            isinstance(response, StreamingHttpResponse)
            and not isinstance(response, FileResponse)
            and not response.is_async
        ):
            response.streaming_content = _in_request(request, response.streaming_content)  # type: ignore[arg-type]  # not async: an iterator
        return response
