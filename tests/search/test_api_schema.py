"""The OpenAPI schema (drf-spectacular) and property-based calls of every operation (schemathesis).

schemathesis loads ``/api/v1/schema`` from the WSGI application and calls each operation in
process with generated valid and invalid inputs (an Acme admin's token, the committed ``kb``
data), asserting that no response is a server error. Each operation's calls share one test
transaction:
the runs a sync creates and the answers ``ask`` records are rolled back, and the Celery task a
sync would send on commit is never sent. Examples are bounded (``MAX_EXAMPLES`` per operation
and phase) so the whole run takes well under two minutes on two cores. Beyond "no 5xx", the
responses must match the schema (see ``CHECKS``).
"""

from __future__ import annotations

import collections
import time

import pytest
import schemathesis
import yaml
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kbportal.wsgi import application
from projects.services import api_token_create

pytestmark = pytest.mark.slow  # calls every API operation with generated inputs

MAX_EXAMPLES = 25
# No 5xx, and every response (errors and server-sent events included) matches the schema in
# status code, content type and body. Left out: negative_data_rejection (DRF coerces a number
# sent for a string field, and reads an empty query parameter as an omitted one, by design) and
# ignored_auth (it would flag our own valid bearer header next to its generated session cookie).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Each operation and the status that shows a generated valid input got through to its view
# (generated slugs and answer ids name nothing the token may see: 404 from the view's lookup).
REACHED = {
    "POST /api/v1/ask": 200,
    "GET /api/v1/search": 200,
    "GET /api/v1/who-knows": 200,
    "GET /api/v1/projects": 200,
    "GET /api/v1/sources": 200,
    "POST /api/v1/sources/{slug}/sync": 404,
    "GET /api/v1/runs": 200,
    "POST /api/v1/answers/{answer_id}/feedback": 404,
    "GET /api/v1/conversations": 200,
    "GET /api/v1/conversations/{conversation_id}": 404,
    "DELETE /api/v1/conversations/{conversation_id}": 404,
    "GET /api/v1/analytics": 200,
}
OPERATIONS = set(REACHED)


def test_the_schema_documents_every_operation_with_bearer_auth_and_error_shapes():
    response = Client().get("/api/v1/schema")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    assert schema["openapi"].startswith("3.")
    operations = {f"{method.upper()} {path}" for path, item in schema["paths"].items() for method in item}
    assert operations == OPERATIONS
    bearer = schema["components"]["securitySchemes"]["bearerAuth"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    ask = schema["paths"]["/api/v1/ask"]["post"]
    assert {"bearerAuth": []} in ask["security"]
    assert ask["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AskRequest"}
    assert set(ask["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert ask["responses"]["429"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    search_params = {p["name"]: p for p in schema["paths"]["/api/v1/search"]["get"]["parameters"]}
    assert search_params["q"]["required"] is True
    assert (search_params["limit"]["schema"]["minimum"], search_params["limit"]["schema"]["maximum"]) == (1, 50)
    assert "thread" in search_params["kind"]["schema"]["items"]["enum"]
    sync = schema["paths"]["/api/v1/sources/{slug}/sync"]["post"]
    assert "202" in sync["responses"] and "403" in sync["responses"]
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"error", "field", "code", "request_id"}


def test_the_docs_page_serves_swagger_ui_from_local_static_files():
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn.jsdelivr.net" not in html
    # The split view serves its init script as a file (no inline script under the CSP).
    assert '<script src="/api/v1/docs?script="></script>' in html
    script = Client().get("/api/v1/docs?script=").content.decode()
    assert "/api/v1/schema" in script and "cdn.jsdelivr.net" not in script


@pytest.fixture
def wsgi_calls(settings):
    """Throttles out of the way, and requests that keep the test transaction's connection."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"ask": "100000/min", "api": "100000/min"},
    }
    # As Django's test client does: a request must not close the connection the test runs in.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def admin_token(kb, db) -> str:
    return api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="schemathesis")[1]


@pytest.fixture(scope="module")
def summary():
    """Calls per operation and status code over the module; printed at its end (``pytest -s``)."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    started = time.perf_counter()
    yield counts
    total = sum(sum(c.values()) for c in counts.values())
    print(f"\nschemathesis: {total} calls in {time.perf_counter() - started:.1f} s")
    for label, statuses in sorted(counts.items()):
        print(f"  {label}: {sum(statuses.values())} calls, statuses {dict(sorted(statuses.items()))}")


@pytest.fixture
def calls(summary):
    """One operation's calls by status; afterwards, proof that valid input reached the view."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    yield counts
    assert counts, "schemathesis made no call"
    for label, statuses in counts.items():
        summary[label].update(statuses)
        # Without this, a broken token (every call 401) would pass "no 5xx" as well.
        assert statuses[REACHED[label]] >= 1, f"{label}: no {REACHED[label]} among {dict(statuses)}"


# Loaded when the module is collected (the schema view reads no database). pytest 9 removed the
# node attribute that schemathesis.pytest.from_fixture (the lazy loader) relies on.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_a_server_error(case, kb, db, wsgi_calls, admin_token, calls):
    response = case.call(headers={"Authorization": f"Bearer {admin_token}"})
    calls[case.operation.label][response.status_code] += 1
    case.validate_response(response, checks=CHECKS)
