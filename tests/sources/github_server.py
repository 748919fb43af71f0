"""A local GitHub REST API on loopback, for tests.

:class:`GitHubWorld` holds one repository's issues and pull requests (issue objects as GitHub's
"List repository issues" returns them: ``number``, ``title``, ``body``, ``user.login``,
``labels``, ``assignees``, ``state``, ``comments``, ``html_url``, timestamps, and a
``pull_request`` key with ``merged_at`` for pull requests), their issue comments, reviews (with
``state`` and ``submitted_at``) and review comments. :func:`world_from_commits` builds one from
the real FastAPI commit log. :class:`FakeGitHub` serves it under a path prefix (GitHub
Enterprise's ``/api/v3``):

- ``GET /repos/{o}/{r}/issues`` (``state``, ``since`` inclusive on ``updated_at``, ``sort=updated``
  + ``direction``, ``per_page``/``page``), ``/issues/{n}/comments``, ``/pulls/{n}/reviews``,
  ``/pulls/{n}/comments``, each paginated with a ``Link`` header (``next``/``last``/``prev``/``first``);
- ``401 {"message": "Bad credentials"}`` for a wrong ``Authorization: Bearer`` token; with
  ``echo_credentials`` set the message quotes the credential it got (a careless proxy does),
  so redaction can be checked;
- armed rate limits (:meth:`FakeGitHub.rate_limit`): the next matching request answers 403 with
  ``X-RateLimit-Remaining: 0`` + ``X-RateLimit-Reset``, or 429 with ``Retry-After``.

Every request is logged as :class:`Request` (path, query, status, monotonic time).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlencode

from tests.sources.http_server import Answer, JsonServer

TOKEN = "ghp_TESTtoken0123456789abcdefSECRET"
PREFIX = "/api/v3"


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(login: str) -> dict[str, Any]:
    return {"login": login, "id": abs(hash(login)) % 10**8, "type": "Bot" if login.endswith("[bot]") else "User"}


@dataclass
class GitHubWorld:
    """One repository's issues (pull requests included) and what hangs off them."""

    owner: str
    repo: str
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    review_comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: int = 1000

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    @property
    def html(self) -> str:
        return f"https://github.com/{self.owner}/{self.repo}"

    def add_item(
        self,
        *,
        number: int,
        title: str,
        body: str,
        author: str,
        created: datetime,
        updated: datetime,
        pull: bool,
        merged: datetime | None = None,
        closed: datetime | None = None,
        labels: list[str] = (),
        assignees: list[str] = (),
    ) -> dict[str, Any]:
        kind = "pull" if pull else "issues"
        item: dict[str, Any] = {
            "id": self._next_id(),
            "node_id": f"I_{number}",
            "url": f"https://api.github.com/repos/{self.owner}/{self.repo}/issues/{number}",
            "html_url": f"{self.html}/{kind}/{number}",
            "number": number,
            "state": "closed" if closed else "open",
            "state_reason": "completed" if closed and not pull else None,
            "title": title,
            "body": body or None,
            "user": _user(author),
            "labels": [{"id": self._next_id(), "name": name, "color": "d73a4a", "default": False} for name in labels],
            "assignee": _user(assignees[0]) if assignees else None,
            "assignees": [_user(a) for a in assignees],
            "locked": False,
            "comments": 0,
            "created_at": iso(created),
            "updated_at": iso(updated),
            "closed_at": iso(closed) if closed else None,
            "author_association": "MEMBER",
        }
        if pull:
            item["draft"] = False
            item["pull_request"] = {
                "url": f"https://api.github.com/repos/{self.owner}/{self.repo}/pulls/{number}",
                "html_url": f"{self.html}/pull/{number}",
                "diff_url": f"{self.html}/pull/{number}.diff",
                "patch_url": f"{self.html}/pull/{number}.patch",
                "merged_at": iso(merged) if merged else None,
            }
        with self.lock:
            self.issues[number] = item
            self.comments.setdefault(number, [])
            if pull:
                self.reviews.setdefault(number, [])
                self.review_comments.setdefault(number, [])
        return item

    def _touch(self, number: int, when: datetime) -> None:
        item = self.issues[number]
        if iso(when) > item["updated_at"]:
            item["updated_at"] = iso(when)

    def comment(self, number: int, *, author: str, body: str, when: datetime) -> None:
        with self.lock:
            self.comments[number].append(
                {
                    "id": self._next_id(),
                    "html_url": f"{self.issues[number]['html_url']}#issuecomment-{self._ids}",
                    "user": _user(author),
                    "body": body,
                    "created_at": iso(when),
                    "updated_at": iso(when),
                    "author_association": "CONTRIBUTOR",
                }
            )
            self.issues[number]["comments"] = len(self.comments[number])
            self._touch(number, when)

    def review(self, number: int, *, author: str, state: str, body: str, when: datetime) -> None:
        with self.lock:
            self.reviews[number].append(
                {
                    "id": self._next_id(),
                    "user": _user(author),
                    "body": body,
                    "state": state,
                    "html_url": f"{self.issues[number]['html_url']}#pullrequestreview-{self._ids}",
                    "commit_id": "0" * 40,
                    "submitted_at": iso(when),
                    "author_association": "MEMBER",
                }
            )
            self._touch(number, when)

    def review_comment(self, number: int, *, author: str, path: str, body: str, when: datetime) -> None:
        with self.lock:
            self.review_comments[number].append(
                {
                    "id": self._next_id(),
                    "pull_request_review_id": None,
                    "path": path,
                    "diff_hunk": "@@ -1,3 +1,4 @@",
                    "user": _user(author),
                    "body": body,
                    "created_at": iso(when),
                    "updated_at": iso(when),
                    "html_url": f"{self.issues[number]['html_url']}#discussion_r{self._ids}",
                }
            )
            self._touch(number, when)


_PR_SUFFIX = re.compile(r"\s*\(#\d+\)\s*$")
ISSUES = [
    (
        "`Depends` in a router-level dependency runs twice with background tasks",
        "When a dependency with `yield` is declared both on `APIRouter(dependencies=...)` and on the path "
        "operation, the teardown runs twice and the background task sees a closed session.",
        ["bug"],
    ),
    (
        "Document how to stream Server-Sent Events with `StreamingResponse`",
        "The docs show `StreamingResponse` for files only. An example with `text/event-stream` and a "
        "keep-alive comment line would help.",
        ["docs"],
    ),
    (
        "OpenAPI schema misses `examples` for `Form` fields",
        "`Form(examples=[...])` is accepted but the generated schema drops the examples for "
        "`application/x-www-form-urlencoded` bodies.",
        ["bug", "openapi"],
    ),
    (
        "Support `lifespan` state typing in `Request.state`",
        "Typed access to what the lifespan yields would make `request.state.db` checkable by mypy.",
        ["feature"],
    ),
    (
        "Flaky test_ws_disconnect on Windows runners",
        "The websocket disconnect test times out about one run in twenty on windows-latest.",
        ["ci"],
    ),
]


def world_from_commits(commits: list[dict[str, Any]], *, owner: str = "fastapi", repo: str = "fastapi") -> GitHubWorld:
    """A repository whose pull requests are these commits (each must have a ``pr_number``).

    PR ``n``: title = the subject without ``(#n)``, body = the commit body, author = the commit
    author, opened a day before and merged at ``authored_at``. Every third PR is reviewed by the
    next commit's author (APPROVED) and every fourth gets a question from the previous one
    (issue comment) and the author's answer; plus the five issues of ``ISSUES`` (numbers after
    the last PR), opened by commit authors and commented on by others.
    """
    world = GitHubWorld(owner=owner, repo=repo)
    authors = [c["author"] for c in commits]
    for i, commit in enumerate(commits):
        number = int(commit["pr_number"])
        merged = datetime.fromisoformat(commit["authored_at"]).astimezone(UTC)
        world.add_item(
            number=number,
            title=_PR_SUFFIX.sub("", commit["subject"]),
            body=commit.get("body") or "",
            author=commit["author"],
            created=merged - timedelta(days=1),
            updated=merged,
            pull=True,
            merged=merged,
            closed=merged,
            labels=["docs"] if any(f.startswith("docs/") for f in commit.get("files") or []) else [],
        )
        other = authors[(i + 1) % len(authors)]
        if i % 3 == 0 and other != commit["author"]:
            world.review(number, author=other, state="APPROVED", body="LGTM, thanks!", when=merged - timedelta(hours=1))
            files = [f for f in commit.get("files") or [] if f.endswith(".py")]
            if files:
                world.review_comment(
                    number, author=other, path=files[0], body="Could this use a test?", when=merged - timedelta(hours=2)
                )
        if i % 4 == 0:
            asker = authors[i - 1]
            world.comment(
                number,
                author=asker,
                body="Does this need a note in the release notes?",
                when=merged - timedelta(hours=3),
            )
            answered = merged - timedelta(hours=2, minutes=30)
            world.comment(number, author=commit["author"], body="Added, thanks.", when=answered)
    last = max(int(c["pr_number"]) for c in commits)
    start = min(datetime.fromisoformat(c["authored_at"]) for c in commits).astimezone(UTC)
    for j, (title, body, labels) in enumerate(ISSUES):
        number = last + 1 + j
        opened = start + timedelta(hours=5 * j)
        world.add_item(
            number=number,
            title=title,
            body=body,
            author=authors[(2 * j + 1) % len(authors)],
            created=opened,
            updated=opened,
            pull=False,
            labels=labels,
            assignees=[authors[0]] if j % 2 == 0 else [],
        )
        world.comment(
            number,
            author=authors[(2 * j + 2) % len(authors)],
            body="I can reproduce this on 0.141.",
            when=opened + timedelta(hours=1),
        )
        if j == 0:
            world.comment(
                number,
                author="github-actions[bot]",
                body="This issue was labelled `bug`.",
                when=opened + timedelta(hours=2),
            )
    return world


class FakeGitHub(JsonServer):
    """Serves a :class:`GitHubWorld` on ``127.0.0.1`` (a free port) under ``PREFIX``.

    ``base_url`` is what a ``github`` source's config takes. ``requests`` logs every request.
    """

    prefix = PREFIX
    content_type = "application/json; charset=utf-8"
    extra_headers = {"X-GitHub-Media-Type": "github.v3; format=json"}

    def __init__(self, world: GitHubWorld, *, token: str = TOKEN) -> None:
        super().__init__()
        self.world = world
        self.token = token
        self.echo_credentials = False

    def rate_limit(self, *, path_suffix: str, page: str | None = None, status: int = 403, wait: int = 1) -> None:
        """Answer the next GET whose path ends with ``path_suffix`` (and ``page``, if given) with a
        rate limit: 403 + ``X-RateLimit-Remaining: 0`` / ``X-RateLimit-Reset`` ``wait`` s ahead,
        or (``status=429``) ``Retry-After: wait``."""
        with self._lock:
            self._limits.append({"suffix": path_suffix, "page": page, "status": status, "wait": wait})

    # -- serving ---------------------------------------------------------------------------------

    def serve(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, str], answer: Answer) -> None:
        credential = handler.headers.get("Authorization", "")
        if credential != f"Bearer {self.token}":
            message = "Bad credentials" + (f" (got {credential!r})" if self.echo_credentials else "")
            return answer(
                401, {"message": message, "documentation_url": "https://docs.github.com/rest", "status": "401"}
            )
        with self._lock:
            limit = next(
                (
                    lim
                    for lim in self._limits
                    if path.endswith(lim["suffix"]) and (lim["page"] is None or query.get("page", "1") == lim["page"])
                ),
                None,
            )
            if limit is not None:
                self._limits.remove(limit)
        if limit is not None:
            if limit["status"] == 429:
                headers = {"Retry-After": str(limit["wait"])}
            else:
                headers = {
                    "X-RateLimit-Limit": "5000",
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Used": "5000",
                    "X-RateLimit-Reset": str(int(time.time()) + limit["wait"]),
                    "X-RateLimit-Resource": "core",
                }
            message = "API rate limit exceeded for user ID 1."
            return answer(
                limit["status"], {"message": message, "documentation_url": "https://docs.github.com/rest"}, headers
            )
        base = f"{PREFIX}/repos/{self.world.owner}/{self.world.repo}"
        not_found = {"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"}
        if not path.startswith(base + "/"):
            return answer(404, not_found)
        rest = path[len(base) :]
        with self.world.lock:
            if rest == "/issues":
                items = list(self.world.issues.values())
                state = query.get("state", "open")
                if state != "all":
                    items = [i for i in items if i["state"] == state]
                if "since" in query:
                    items = [i for i in items if i["updated_at"] >= query["since"]]
                key = {"updated": "updated_at", "created": "created_at", "comments": "comments"}[
                    query.get("sort", "created")
                ]
                items.sort(key=lambda i: (i[key], i["number"]), reverse=query.get("direction", "desc") == "desc")
            elif m := re.fullmatch(r"/issues/(\d+)/comments", rest):
                items = self.world.comments.get(int(m.group(1)))
            elif m := re.fullmatch(r"/pulls/(\d+)/reviews", rest):
                items = self.world.reviews.get(int(m.group(1)))
            elif m := re.fullmatch(r"/pulls/(\d+)/comments", rest):
                items = self.world.review_comments.get(int(m.group(1)))
            else:
                items = None
            items = None if items is None else json.loads(json.dumps(items))
        if items is None:
            return answer(404, not_found)
        per_page = min(100, int(query.get("per_page", "30")))
        page = int(query.get("page", "1"))
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]
        host = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

        def link(n: int) -> str:
            return f"{host}?{urlencode({**query, 'page': n})}"

        rels = []
        if page < last:
            rels += [f'<{link(page + 1)}>; rel="next"', f'<{link(last)}>; rel="last"']
        if page > 1:
            rels += [f'<{link(page - 1)}>; rel="prev"', f'<{link(1)}>; rel="first"']
        answer(200, chunk, {"Link": ", ".join(rels)} if rels else {})
