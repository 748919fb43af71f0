"""Every API error as JSON: ``{"error", "field", "code", "request_id"}`` (+ details by kind).

- ``error``: one sentence naming the input at fault (``"q: This field is required."``);
- ``field``: the request field or query parameter at fault, or ``null``;
- ``code``: machine-readable (``invalid``, ``required``, ``not_found``, ``revoked``, ``throttled``...);
- ``request_id``: the ``X-Request-ID`` response header, assigned to every request by
  ``kbportal.middleware.RequestIdMiddleware`` (a caller's own ``X-Request-ID`` of 8-64 safe
  characters is kept) and recorded on its audit events; logged with a 500;
- ``errors`` (400 only): every field's messages; ``reason`` (401 for a refused token);
  ``retry_after`` (429 only, seconds; also the ``Retry-After`` header).

:func:`api_exception_handler` is DRF's ``EXCEPTION_HANDLER``: any exception a view raises,
expected or not, becomes such a body (an unexpected one is a 500 with the request id, never
Django's HTML page). :func:`not_found` and :func:`server_error` are the site's ``handler404``
and ``handler500``: JSON under ``/api/``, Django's own pages elsewhere.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from kbportal.middleware import request_id_for

logger = logging.getLogger(__name__)

API_PATH_PREFIX = "/api/"


class FieldNotFound(exceptions.NotFound):
    """HTTP 404 for something a request named that the caller may not see (or that does not exist:
    the same answer either way), with the request ``field`` that named it."""

    def __init__(self, detail: str, *, field: str | None = None):
        super().__init__(detail)
        self.field = field


def field_error(field: str, message: str) -> exceptions.ValidationError:
    """HTTP 400 for one field's value that the serializer accepted but the service refused."""
    return exceptions.ValidationError({field: [message]})


def request_id(request: Any) -> str:
    """The request's id (``kbportal.middleware.request_id_for``): the middleware's, else the
    caller's ``X-Request-ID`` when it is 8-64 safe characters, else a new UUID (hex)."""
    return request_id_for(request)


def _first_error(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    """``(field path or None, message)`` of the first error in a DRF error detail."""
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        name = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
        return _first_error(value, name)
    if isinstance(detail, list) and detail:
        return _first_error(detail[0], prefix)
    return (prefix or None), str(detail)


def _first_code(codes: Any) -> str:
    while isinstance(codes, dict | list) and codes:
        codes = next(iter(codes.values())) if isinstance(codes, dict) else codes[0]
    return str(codes) if codes else "error"


def _body(exc: exceptions.APIException, rid: str) -> dict[str, Any]:
    field, message = _first_error(exc.detail)
    field = getattr(exc, "field", None) or field
    body: dict[str, Any] = {
        "error": f"{field}: {message}" if field and isinstance(exc, exceptions.ValidationError) else message,
        "field": field,
        "code": _first_code(exc.get_codes()),
        "request_id": rid,
    }
    if isinstance(exc, exceptions.ValidationError):
        body["errors"] = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
    if isinstance(exc, exceptions.AuthenticationFailed | exceptions.NotAuthenticated):
        body["reason"] = getattr(exc, "reason", body["code"])
    if isinstance(exc, exceptions.Throttled):
        body["retry_after"] = exc.wait  # type: ignore[attr-defined]  # set by Throttled.__init__
    return body


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "request body too large"
    default_code = "payload_too_large"


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's ``EXCEPTION_HANDLER``: a JSON error body for every exception (module docstring).

    Keeps DRF's status codes and headers (``WWW-Authenticate`` on 401, ``Retry-After`` on 429);
    anything that is not an ``APIException`` (nor ``Http404``/``PermissionDenied``) is logged
    with its request id and answered 500. Always rendered as JSON, whatever the ``Accept``.
    """
    request = context.get("request")
    rid = request_id(request)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(
            f"request body over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)"
        )
    elif isinstance(exc, exceptions.NotAuthenticated):
        exc = exceptions.NotAuthenticated(
            "authentication required: send 'Authorization: Bearer kb_<prefix>_<secret>' or log in"
        )
    response = drf_exception_handler(exc, context) if isinstance(exc, exceptions.APIException) else None
    if response is None:
        logger.error("API request %s failed", rid, exc_info=exc)
        set_rollback()
        response = Response(_server_error_body(rid), status=500)
    else:
        response.data = _body(exc, rid)  # type: ignore[arg-type]  # DRF answered it: an APIException or Http404
    response["X-Request-ID"] = rid
    if request is not None:
        # An error to an event-stream (or any other) request is still a JSON document.
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = JSONRenderer.media_type
    return response


def _server_error_body(rid: str) -> dict[str, Any]:
    return {
        "error": f"internal error; quote request id {rid} when reporting it",
        "field": None,
        "code": "server_error",
        "request_id": rid,
    }


def _json_error(body: dict[str, Any], *, status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["X-Request-ID"] = body["request_id"]
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: JSON naming the path under ``/api/``, else the portal's own "no such page"."""
    if request.path.startswith(API_PATH_PREFIX):
        body = {
            "error": f"no API endpoint {request.path!r}",
            "field": None,
            "code": "not_found",
            "request_id": request_id(request),
        }
        return _json_error(body, status=404)
    try:
        from django.shortcuts import render

        return render(request, "search/not_found.html", {"message": "no such page"}, status=404)
    except Exception:  # the styled page needs the request's context: fall back to Django's
        return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: JSON with the request id under ``/api/``, else Django's page."""
    if request.path.startswith(API_PATH_PREFIX):
        rid = request_id(request)
        logger.error("API request %s failed outside a view", rid)
        return _json_error(_server_error_body(rid), status=500)
    return defaults.server_error(request)
