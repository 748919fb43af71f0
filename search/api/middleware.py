"""One ``api.call`` audit event per request under ``/api/v1/``, whatever its outcome.

A middleware rather than a DRF hook, so that requests no view answers (an unknown endpoint's
404, a 500 outside a view) are recorded too. It runs after the view, when DRF has put the
authenticated user and token identity on the request. The public OpenAPI schema and its docs
page (documentation, no data, no credentials needed) are not recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from search.api.services import API_PATH, api_call_record

UNAUDITED_VIEWS = frozenset({"api:schema", "api:docs"})


class ApiCallAuditMiddleware:
    """Records every ``/api/v1/`` request with :func:`search.api.services.api_call_record`."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        if request.path.startswith(API_PATH) and (match is None or match.view_name not in UNAUDITED_VIEWS):
            api_call_record(request=request, response=response, ms=(time.perf_counter() - started) * 1000)
        return response
