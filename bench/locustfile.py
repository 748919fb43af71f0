"""Locust users for ``bench/load.py`` (run by it; see its docstring).

Every user is one person of the bench tenant, signed in (the session cookie ``bench/load.py``
obtained, shared by all users: one login instead of one per user keeps allauth's login rate
limit out of the measurement) and holding an API token. Each task picks a query from the
``KB_LOAD_QUERIES`` file (a JSON list of strings) and does one of, by weight: a web search
(``GET /search/?q=``), an API search (``GET /api/v1/search``), a web answer without an LLM
(``GET /?q=``, the whole answer page) and an API answer (``POST /api/v1/ask``). A response
other than 200, or a page without the expected marker, is a failure. ``KB_LOAD_THINK_SECONDS``
(default 0) is each user's pause between requests; ``KB_LOAD_PACE_SECONDS``, when set, is instead
the interval at which each user starts a request (Locust's ``constant_pacing``: a user sends one
request per interval whatever the latency, unless a request takes longer, so 20 users at 1 s ask
for 20 requests/s). ``SearchUser`` does the two searches only.
"""

from __future__ import annotations

import json
import os
import random

from locust import HttpUser, constant, constant_pacing

PACE = float(os.environ.get("KB_LOAD_PACE_SECONDS") or 0)
QUERIES: list[str] = json.loads(open(os.environ["KB_LOAD_QUERIES"]).read())
SESSION = os.environ["KB_LOAD_SESSION"]
API = {"Authorization": f"Bearer {os.environ['KB_LOAD_TOKEN']}"}


def web_search(user: HttpUser) -> None:
    with user.client.get("/search/", params={"q": random.choice(QUERIES)}, name="web search", catch_response=True) as r:
        if r.status_code == 200 and 'name="q"' not in r.text:
            r.failure("no search page (signed out?)")


def api_search(user: HttpUser) -> None:
    user.client.get("/api/v1/search", params={"q": random.choice(QUERIES)}, headers=API, name="api search")


def web_ask(user: HttpUser) -> None:
    with user.client.get("/", params={"q": random.choice(QUERIES)}, name="web ask", catch_response=True) as r:
        if r.status_code == 200 and "answer" not in r.text.lower():
            r.failure("no answer on the page")


def api_ask(user: HttpUser) -> None:
    user.client.post("/api/v1/ask", json={"question": random.choice(QUERIES)}, headers=API, name="api ask")


class _SignedIn(HttpUser):
    abstract = True
    wait_time = constant_pacing(PACE) if PACE > 0 else constant(float(os.environ.get("KB_LOAD_THINK_SECONDS", "0")))

    def on_start(self) -> None:
        self.client.cookies.set("sessionid", SESSION)


class PortalUser(_SignedIn):
    """All four requests, weights 3:3:1:1."""

    tasks = {web_search: 3, api_search: 3, web_ask: 1, api_ask: 1}


class SearchUser(_SignedIn):
    """Searches only: the web page and the API, alike."""

    tasks = {web_search: 1, api_search: 1}
