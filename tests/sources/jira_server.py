"""A local Jira REST API (v2) on loopback, for tests, fed with real ticket documents.

:func:`world_from_documents` turns the EnterpriseRAG-Bench Jira documents
(``shared/eval/erb/docs/jira/*.json``: ``key``, ``summary``, ``description``, ``status``,
``priority``, ``reporter``, ``assignee``, ``labels``, ``components``, ``comments`` as
``"2025-03-18 09:12 - Name: text"`` strings...) into issues shaped as Jira's
``GET /rest/api/2/search`` returns them: ``id``, ``key``, ``self`` and ``fields`` with
``summary``, ``description`` (wiki markup: the document's other text fields become ``h3.``
sections), ``environment``, ``status``/``priority``/``issuetype``/``resolution`` objects, user
objects (``accountId``, ``displayName``, ``emailAddress``), ``labels``, ``components``,
``project``, ``created``/``updated`` (``2025-03-18T09:00:00.000+0000``), ``security`` and
``comment`` (``comments``, ``total``...). Keys that repeat across documents get the next free
number, as Jira would never hand out one key twice.

:class:`FakeJira` serves it:

- ``GET /rest/api/2/search`` with ``jql`` (``project in (...)``/``project = X``,
  ``labels = x``, ``updated >= "yyyy/MM/dd HH:mm"``, ``AND``, ``ORDER BY updated ASC, key ASC``;
  anything else is a 400 with Jira's ``errorMessages``), ``startAt``, ``maxResults`` (capped at
  ``max_results_cap``, as Jira caps it); each issue embeds at most ``embedded_comments`` comments;
- ``GET /rest/api/2/issue/{key}/comment`` with ``startAt``/``maxResults``;
- ``GET /rest/api/2/issuesecurityschemes/level/member?levelId=`` (a 403 unless ``world.admin``),
  ``GET /rest/api/2/project/{key}/role/{id}`` and ``GET /rest/api/2/group/member?groupname=``,
  paged as Jira pages them (``values``, ``isLast``, ``total``);
- auth: ``Basic base64(email:token)`` (``auth="basic"``) or ``Bearer token`` (``auth="bearer"``);
  anything else is a 401 (with ``echo_credentials`` the message quotes the header it got);
- armed rate limits (:meth:`FakeJira.rate_limit`): the next matching request is a 429 with
  ``Retry-After``.

Every request is logged as :class:`Request` (path, query, status, monotonic time).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.sources.http_server import Answer, JsonServer

EMAIL = "kb-reader@erb.example"
TOKEN = "ATATT3xFfGF0-jira-TEST-token-SECRET-4242"
CONTENT_SKIP = {
    "key",
    "project",
    "issue_type",
    "summary",
    "status",
    "priority",
    "created_at",
    "updated_at",
    "reporter",
    "assignee",
    "components",
    "labels",
    "environment",
    "description",
    "comments",
    "title_field_name",
    "content_field_names",
    "dataset_doc_uuid",
    "dataset_noise_document",
    "has_attachments",
}
_COMMENT_FORMS = [
    # "2025-04-29 09:12 UTC — Liam O'Rourke (Reporter, TAM)\ntext"
    re.compile(
        r"^(?P<d>\d{4}-\d{2}-\d{2})(?:[ T](?P<t>\d{2}:\d{2}))?\s*(?:UTC|PT)?\s*[-–—]\s*(?P<a>[^\n]{2,80})\n(?P<b>.+)$",
        re.S,
    ),
    # "2025-03-18 09:12 - Ava Martinez: text", "2026-02-06 10:12 PT — Allison Grant (Support/Obs): text"
    re.compile(
        r"^(?P<d>\d{4}-\d{2}-\d{2})(?:[ T](?P<t>\d{2}:\d{2})(?::\d{2})?)?\s*(?:UTC|PT|Z)?\s*[-–—]?\s*"
        r"(?P<a>[^:\n]{2,80}?):\s*(?P<b>.+)$",
        re.S,
    ),
    # "Aisha Rahman (2025-02-10): text"
    re.compile(r"^(?P<a>[^()\n]{2,80}?) \((?P<d>\d{4}-\d{2}-\d{2})\):\s*(?P<b>.+)$", re.S),
    # "Ben Carter: text"
    re.compile(r"^(?P<a>[A-Z][^:\n]{1,60}?):\s*(?P<b>.+)$", re.S),
]
_PAREN = re.compile(r"\s*\([^)]*\)\s*$")


def jira_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")


def user(name: str) -> dict[str, Any] | None:
    """A Jira Cloud user object; people get an ``emailAddress`` at erb.example."""
    name = _PAREN.sub("", name).strip()
    if not name:
        return None
    local = re.sub(r"[^a-z0-9]+", ".", name.lower()).strip(".")
    return {
        "accountId": f"5b10ac8d82e05b22cc7d{abs(hash(local)) % 10**6:06d}",
        "accountType": "atlassian",
        "displayName": name,
        "emailAddress": f"{local}@erb.example",
        "active": True,
        "timeZone": "UTC",
    }


def _day(value: str, hour: int) -> datetime:
    return datetime.fromisoformat(value[:10]).replace(hour=hour, tzinfo=UTC)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(f"* {_text(v)}" for v in value)
    if isinstance(value, dict):
        return "\n".join(f"{k}: {_text(v)}" for k, v in value.items())
    return str(value)


def comment_from(raw: str, *, fallback_author: str, fallback_time: datetime, number: int) -> dict[str, Any]:
    """A Jira comment object from one ERB comment string (its author, time and text when it says them)."""
    raw = raw.strip()
    author, when, body = fallback_author, fallback_time, raw
    for form in _COMMENT_FORMS:
        m = form.match(raw)
        if m:
            author = m.group("a").strip().lstrip("-—– ").strip()
            body = m.group("b").strip()
            if "d" in m.groupdict() and m.group("d"):
                t = m.groupdict().get("t") or "12:00"
                when = datetime.fromisoformat(f"{m.group('d')}T{t}").replace(tzinfo=UTC)
            break
    return {
        "id": str(20000 + number),
        "author": user(author),
        "updateAuthor": user(author),
        "body": body,
        "created": jira_time(when),
        "updated": jira_time(when),
        "jsdPublic": True,
    }


@dataclass
class JiraWorld:
    """Issues by key, in a site at ``site``; the site's permission holders: ``level_holders``
    (security level id -> holders as Jira shows them, ``{"type", "parameter", "user"?, "group"?}``),
    ``roles`` ((project key, role id) -> actors), ``groups`` (name -> user objects).
    ``admin``: whether the credential holds *Administer Jira* (level members are shown only then).
    """

    site: str = "https://erb.atlassian.net"
    issues: dict[str, dict[str, Any]] = field(default_factory=dict)
    level_holders: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    roles: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    admin: bool = True
    lock: threading.RLock = field(default_factory=threading.RLock)

    def touch(self, key: str, when: datetime) -> None:
        self.issues[key]["fields"]["updated"] = jira_time(when)

    def add_comment(self, key: str, author: str, body: str, when: datetime) -> None:
        block = self.issues[key]["fields"]["comment"]
        block["comments"].append(
            comment_from(
                f"{author} ({when:%Y-%m-%d}): {body}",
                fallback_author=author,
                fallback_time=when,
                number=len(block["comments"]) + 900,
            )
        )
        block["comments"][-1]["created"] = jira_time(when)
        block["total"] = len(block["comments"])
        self.touch(key, when)


def world_from_documents(folder: Path) -> JiraWorld:
    """One issue per ERB Jira document (sorted by file name; see the module docstring)."""
    world = JiraWorld()
    used: set[str] = set()
    for number, path in enumerate(sorted(folder.glob("*.json"))):
        doc = json.loads(path.read_text())
        project_key, num = doc["key"].rsplit("-", 1)
        key = doc["key"]
        while key in used:  # INT-4821 names three documents
            num = str(int(num) + 1)
            key = f"{project_key}-{num}"
        used.add(key)
        created, updated = _day(doc["created_at"], 9), _day(doc["updated_at"], 17)
        extra = [
            f"h3. {name.replace('_', ' ').capitalize()}\n{_text(value)}"
            for name, value in doc.items()
            if name not in CONTENT_SKIP and value not in (None, "", [], {})
        ]
        comments = [
            comment_from(c, fallback_author=doc["reporter"], fallback_time=created, number=number * 100 + k)
            for k, c in enumerate(doc.get("comments") or [])
            if isinstance(c, str) and c.strip()
        ]
        issue_id = str(10000 + number)
        world.issues[key] = {
            "expand": "operations,versionedRepresentations,editmeta,changelog,renderedFields",
            "id": issue_id,
            "self": f"{world.site}/rest/api/2/issue/{issue_id}",
            "key": key,
            "fields": {
                "summary": doc["summary"],
                "description": "\n\n".join([doc.get("description") or "", *extra]).strip(),
                "environment": doc.get("environment") or None,
                "status": {
                    "name": doc["status"],
                    "id": str(abs(hash(doc["status"])) % 100),
                    "statusCategory": {
                        "key": "done" if doc["status"].lower() in ("done", "resolved", "closed") else "indeterminate"
                    },
                },
                "priority": {"name": doc["priority"], "id": "3"},
                "issuetype": {"name": doc["issue_type"], "subtask": False},
                "project": {"key": project_key, "name": doc["project"], "id": str(100 + len(project_key))},
                "reporter": user(doc["reporter"]),
                "assignee": user(doc["assignee"]) if doc.get("assignee") else None,
                "labels": list(doc.get("labels") or []),
                "components": [{"name": c, "id": str(k)} for k, c in enumerate(doc.get("components") or [])],
                "created": jira_time(created),
                "updated": jira_time(updated),
                "resolution": {"name": "Done"} if doc["status"].lower() in ("done", "resolved", "closed") else None,
                "security": None,
                "comment": {"comments": comments, "maxResults": len(comments), "total": len(comments), "startAt": 0},
            },
        }
    return world


class JqlError(ValueError):
    pass


def _jql_filter(jql: str) -> tuple[list[Any], list[tuple[str, bool]]]:
    """Predicates and the ORDER BY of the JQL subset the fake understands."""
    order: list[tuple[str, bool]] = []
    m = re.search(r"\border\s+by\b(.*)$", jql, re.I | re.S)
    if m:
        for part in m.group(1).split(","):
            words = part.split()
            order.append((words[0].lower(), len(words) > 1 and words[1].lower() == "desc"))
        jql = jql[: m.start()]
    preds: list[Any] = []
    for clause in [c.strip() for c in re.split(r"\s+AND\s+", jql.strip(), flags=re.I) if c.strip()]:
        if clause.startswith("(") and clause.endswith(")"):
            clause = clause[1:-1].strip()
        if m := re.fullmatch(r"project\s+in\s+\(([^)]*)\)|project\s*=\s*(\S+)", clause, re.I):
            keys = {k.strip().strip('"') for k in (m.group(1) or m.group(2)).split(",")}
            preds.append(lambda i, keys=keys: i["fields"]["project"]["key"] in keys)
        elif m := re.fullmatch(r'updated\s*>=\s*"(\d{4})/(\d{2})/(\d{2}) (\d{2}):(\d{2})"', clause, re.I):
            bound = jira_time(datetime(*map(int, m.groups()), tzinfo=UTC))
            preds.append(lambda i, bound=bound: i["fields"]["updated"] >= bound)
        elif m := re.fullmatch(r'labels\s*=\s*"?([\w-]+)"?', clause, re.I):
            label = m.group(1)
            preds.append(lambda i, lb=label: lb in i["fields"]["labels"])
        else:
            raise JqlError(f"Error in the JQL Query: the clause '{clause}' is not understood.")
    return preds, order


class FakeJira(JsonServer):
    """Serves a :class:`JiraWorld` on ``127.0.0.1`` (a free port); ``base_url`` is the site root."""

    def __init__(self, world: JiraWorld, *, auth: str = "basic", email: str = EMAIL, token: str = TOKEN) -> None:
        super().__init__()
        self.world = world
        self.auth = auth
        self.email, self.token = email, token
        self.echo_credentials = False
        self.max_results_cap = 50
        self.embedded_comments = 20
        self.malformed: dict[str, Any] = {}  # key -> what to serve instead of the issue

    def rate_limit(self, *, path_suffix: str, start_at: str | None = None, wait: int = 1) -> None:
        """Answer the next GET whose path ends with ``path_suffix`` (and ``startAt``) with 429 + ``Retry-After``."""
        with self._lock:
            self._limits.append({"suffix": path_suffix, "start": start_at, "wait": wait})

    def _expected(self) -> str:
        if self.auth == "bearer":
            return f"Bearer {self.token}"
        return "Basic " + base64.b64encode(f"{self.email}:{self.token}".encode()).decode()

    def serve(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, str], answer: Answer) -> None:
        credential = handler.headers.get("Authorization", "")
        if credential != self._expected():
            message = "You are not authenticated. Authentication required to perform this operation."
            if self.echo_credentials:
                message += f" (got {credential!r})"
            return answer(401, {"errorMessages": [message], "errors": {}})
        with self._lock:
            at = query.get("startAt", "0")
            limit = next(
                (lim for lim in self._limits if path.endswith(lim["suffix"]) and lim["start"] in (None, at)), None
            )
            if limit is not None:
                self._limits.remove(limit)
        if limit is not None:
            return answer(429, {"errorMessages": ["Rate limit exceeded."]}, {"Retry-After": str(limit["wait"])})
        start = int(query.get("startAt", "0"))
        size = min(int(query.get("maxResults", "50")), self.max_results_cap)
        with self.world.lock:
            if path == "/rest/api/2/search":
                try:
                    preds, order = _jql_filter(query.get("jql", ""))
                except JqlError as exc:
                    return answer(400, {"errorMessages": [str(exc)], "warningMessages": []})
                items = [i for i in self.world.issues.values() if all(p(i) for p in preds)]
                for name, desc in reversed(order or [("key", True)]):
                    items.sort(key=lambda i, n=name: i["key"] if n == "key" else i["fields"].get(n) or "", reverse=desc)
                chunk = json.loads(json.dumps(items[start : start + size]))
                for k, issue in enumerate(chunk):
                    if issue["key"] in self.malformed:
                        chunk[k] = self.malformed[issue["key"]]
                        continue
                    block = issue["fields"]["comment"]
                    block["comments"] = block["comments"][: self.embedded_comments]
                    block["maxResults"] = len(block["comments"])
                body = {
                    "expand": "schema,names",
                    "startAt": start,
                    "maxResults": size,
                    "total": len(items),
                    "issues": chunk,
                }
                return answer(200, body)
            if m := re.fullmatch(r"/rest/api/2/issue/([A-Z][A-Z0-9_]*-\d+)/comment", path):
                issue = self.world.issues.get(m.group(1))
                if issue is None:
                    missing = "Issue does not exist or you do not have permission to see it."
                    return answer(404, {"errorMessages": [missing], "errors": {}})
                comments = issue["fields"]["comment"]["comments"]
                body = {
                    "startAt": start,
                    "maxResults": size,
                    "total": len(comments),
                    "comments": json.loads(json.dumps(comments[start : start + size])),
                }
                return answer(200, body)
            if path == "/rest/api/2/issuesecurityschemes/level/member":
                if not self.world.admin:
                    refused = "You are not authorized to perform this action. Administrator privileges are required."
                    return answer(403, {"errorMessages": [refused], "errors": {}})
                level = query.get("levelId", "")
                members = [
                    {
                        "id": str(10000 + n),
                        "issueSecurityLevelId": level,
                        "issueSecuritySchemeId": "10010",
                        "holder": holder,
                    }
                    for n, holder in enumerate(self.world.level_holders.get(level, []))
                ]
                return answer(200, _page_bean(members, start, size))
            if m := re.fullmatch(r"/rest/api/2/project/([A-Z][A-Z0-9_]*)/role/(\d+)", path):
                actors = self.world.roles.get((m.group(1), m.group(2)))
                if actors is None:
                    return answer(404, {"errorMessages": ["Can not retrieve a role actor for a null project."]})
                return answer(
                    200,
                    {
                        "self": f"{self.base_url}{path}",
                        "name": f"role {m.group(2)}",
                        "id": int(m.group(2)),
                        "actors": actors,
                    },
                )
            if path == "/rest/api/2/group/member":
                users = self.world.groups.get(query.get("groupname", ""))
                if users is None:
                    return answer(404, {"errorMessages": ["Specified group does not exist."], "errors": {}})
                return answer(200, _page_bean(users, start, size))
        return answer(404, {"errorMessages": ["Not Found"], "errors": {}})


def _page_bean(values: list[Any], start: int, size: int) -> dict[str, Any]:
    """Jira's ``PageBean`` shape for ``values[start:start + size]``."""
    chunk = json.loads(json.dumps(values[start : start + size]))
    return {
        "startAt": start,
        "maxResults": size,
        "total": len(values),
        "isLast": start + size >= len(values),
        "values": chunk,
    }
