"""``manage.py serve``: the portal under gunicorn on this run's test database, as in production.

One real server (one gthread worker, no Celery) answers: a collected static file through
WhiteNoise, compressed; an API search with a token; an answer streamed as server-sent events,
chunk by chunk, not buffered; a request of another organization's token finds nothing of this
one. SIGTERM stops it and its workers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from projects.services import api_token_create
from tests.conftest import subprocess_database_env

pytestmark = pytest.mark.slow  # starts gunicorn with its workers

ROOT = Path(__file__).resolve().parent.parent.parent
START_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str, **headers: str):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60)


@pytest.fixture(scope="module")
def served(kb, django_db_blocker):
    """(base URL, acme admin token, globex admin token) of a running ``manage.py serve``."""
    with django_db_blocker.unblock():
        acme_token = api_token_create(tenant=kb.acme.tenant, user=kb.acme.admin, name="serve-acme")[1]
        globex_token = api_token_create(tenant=kb.globex.tenant, user=kb.globex.admin, name="serve-globex")[1]
    port = _free_port()
    env = {**subprocess_database_env(), "OPENAI_BASE_URL": "", "KB_LLM_MODEL": ""}
    server = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "serve",
            "--no-worker",
            "--no-beat",
            "--workers",
            "1",
            "--threads",
            "4",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_SECONDS
    while True:
        assert server.poll() is None, server.stdout.read().decode(errors="replace")
        try:
            _get(f"{base}/accounts/login/").read()
            break
        except OSError:
            assert time.monotonic() < deadline, f"manage.py serve did not answer within {START_SECONDS}s"
            time.sleep(0.5)
    yield base, acme_token, globex_token, server
    if server.poll() is None:  # a test failed before the SIGTERM one: stop it the same way
        server.terminate()  # serve stops its gunicorn group; a KILL here would orphan the workers
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_static_files_are_served_compressed_by_the_app(served):
    base, *_ = served
    with _get(f"{base}/static/admin/css/base.css", **{"Accept-Encoding": "gzip"}) as response:
        assert response.status == 200
        assert response.headers["Content-Encoding"] == "gzip"
        assert "max-age" in response.headers["Cache-Control"]
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(f"{base}/static/no-such-file.css")
    assert missing.value.code == 404


def test_api_search_answers_with_the_tokens_own_organization_only(served):
    base, acme_token, globex_token, _ = served
    url = f"{base}/api/v1/search?q=deploy+the+billing+service"
    with _get(url, Authorization=f"Bearer {acme_token}") as response:
        hits = json.load(response)["hits"]
    assert hits[0]["external_id"] == "runbook#deploy"
    with _get(url, Authorization=f"Bearer {globex_token}") as response:
        theirs = json.load(response)["hits"]
    # Globex has its own billing page; none of Acme's rows or sources reach its token.
    assert theirs and {h["external_id"] for h in theirs}.isdisjoint({h["external_id"] for h in hits})
    assert {h["source_public_id"] for h in theirs}.isdisjoint({h["source_public_id"] for h in hits})
    with pytest.raises(urllib.error.HTTPError) as forged:
        _get(url, Authorization=f"Bearer {acme_token[:-4]}AAAA")
    assert forged.value.code == 401


def test_an_answer_streams_as_server_sent_events_chunk_by_chunk(served):
    base, acme_token, *_ = served
    request = urllib.request.Request(
        f"{base}/api/v1/ask",
        data=json.dumps({"question": "How do I deploy the billing service?"}).encode(),
        headers={
            "Authorization": f"Bearer {acme_token}",
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers.get("Content-Length") is None  # streamed, not buffered whole
        assert response.headers.get("Transfer-Encoding") == "chunked"
        events = [line.split(b":", 1)[1].strip().decode() for line in response if line.startswith(b"event:")]
    assert events[0] == "plan" and events[-1] == "done" and "token" in events


def test_sigterm_stops_the_server_and_its_workers(served):
    base, _, _, server = served
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    with pytest.raises(OSError):
        _get(f"{base}/accounts/login/").read()
