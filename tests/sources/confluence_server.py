"""A local Confluence REST API on loopback, for tests, fed with real wiki pages.

:func:`world_from_documents` turns the EnterpriseRAG-Bench Confluence documents
(``shared/eval/erb/docs/confluence/*.json``: ``title``, ``space``, ``author``, ``reviewers``,
``labels``, ``status``, ``confidentiality``, ``created_at``, ``last_updated`` and a Markdown
``content`` or ``body``) into content objects as ``GET /rest/api/content`` returns them with
``expand=body.storage,version,history,ancestors,space,metadata.labels,restrictions.read...``:
the body rendered to storage-format XHTML (code fences as ``ac:structured-macro`` code macros),
``version`` (``by`` = the first reviewer, else the author), ``history.createdBy``, ``space``,
``metadata.labels``, ``_links.webui``. Each space gets a home page that is every page's parent
(``ancestors``); a page whose ``confidentiality`` starts with ``restricted`` gets a read
restriction to its author and the group ``<space>-leads``. :meth:`ConfluenceWorld.move` and
:meth:`ConfluenceWorld.restrict` reshape the tree and the restrictions.

:class:`FakeConfluence` serves it:

- ``GET /rest/api/content`` (``type``, ``spaceKey``, ``status``, ``start``, ``limit`` capped at
  ``limit_cap``, ``expand``: only what is asked for is expanded), answering ``results``,
  ``start``, ``limit``, ``size`` and ``_links`` with ``next`` while more pages remain, ordered by id;
- ``GET /rest/api/content/{id}`` with ``expand``;
- ``GET /rest/api/group/member?name=`` (``start``, ``limit``): a group's members as user objects,
  paged with ``_links.next``; 404 for a group the site does not have (``ConfluenceWorld.groups``,
  where every group a restriction names exists, empty unless given members);
- auth ``Basic base64(email:token)`` or ``Bearer token``, else 401 (with ``echo_credentials``
  the message quotes the header); armed 429s with ``Retry-After`` (:meth:`FakeConfluence.rate_limit`).
"""

from __future__ import annotations

import base64
import html
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from markdown_it import MarkdownIt

from tests.sources.http_server import Answer, JsonServer

EMAIL = "kb-reader@erb.example"
TOKEN = "ATATT3xFfGF0-confluence-TEST-token-SECRET-77"
_MD = MarkdownIt("commonmark").enable("table")
_FENCE = re.compile(r'<pre><code(?: class="language-([\w+-]+)")?>(.*?)</code></pre>', re.S)


def space_key(space: str) -> str:
    return "".join(word[0] for word in space.split("-") if word).upper()


def person(name: str) -> dict[str, Any]:
    local = re.sub(r"[^a-z0-9]+", ".", name.lower()).strip(".")
    return {
        "type": "known",
        "accountId": f"712020:{abs(hash(local)) % 10**8:08d}",
        "accountType": "atlassian",
        "email": f"{local}@erb.example",
        "publicName": name,
        "displayName": name,
    }


def storage(markdown: str) -> str:
    """Markdown rendered to Confluence storage format: code fences become code macros."""

    def macro(m: re.Match[str]) -> str:
        language = m.group(1) or "none"
        code = html.unescape(m.group(2)).replace("]]>", "]]]]><![CDATA[>")
        return (
            '<ac:structured-macro ac:name="code" ac:schema-version="1">'
            f'<ac:parameter ac:name="language">{language}</ac:parameter>'
            f"<ac:plain-text-body><![CDATA[{code}]]></ac:plain-text-body></ac:structured-macro>"
        )

    return _FENCE.sub(macro, _MD.render(markdown))


def _when(day: str, hour: int) -> str:
    return datetime.fromisoformat(day[:10]).replace(hour=hour, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass
class ConfluenceWorld:
    """Pages by id (content objects with every expansion), their parent ids, and the spaces."""

    pages: dict[str, dict[str, Any]] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)
    by_file: dict[str, str] = field(default_factory=dict)  # ERB file stem -> page id
    groups: dict[str, list[str]] = field(default_factory=dict)  # group name -> member names
    lock: threading.RLock = field(default_factory=threading.RLock)

    def ancestors(self, page_id: str) -> list[dict[str, Any]]:
        chain = []
        parent = self.parents.get(page_id)
        while parent:
            p = self.pages[parent]
            chain.insert(0, {"id": parent, "type": "page", "status": "current", "title": p["title"]})
            parent = self.parents.get(parent)
        return chain

    def move(self, page_id: str, parent_id: str) -> None:
        self.parents[page_id] = parent_id

    def restrict(self, page_id: str, users: list[str], groups: list[str]) -> None:
        read = self.pages[page_id]["restrictions"]["read"]["restrictions"]
        read["user"] = {"results": [person(u) for u in users], "start": 0, "limit": 200, "size": len(users)}
        for g in groups:
            self.groups.setdefault(g, [])
        read["group"] = {
            "results": [{"type": "group", "name": g, "id": f"g-{g}"} for g in groups],
            "start": 0,
            "limit": 200,
            "size": len(groups),
        }

    def edit(self, page_id: str, markdown: str, when: str, by: str) -> None:
        page = self.pages[page_id]
        page["body"]["storage"]["value"] = storage(markdown)
        page["version"] = {
            "by": person(by),
            "when": when,
            "number": page["version"]["number"] + 1,
            "minorEdit": False,
            "message": "",
        }


def _page(page_id: str, title: str, key: str, space_name: str, body: str, **extra: Any) -> dict[str, Any]:
    slug = re.sub(r"[^A-Za-z0-9]+", "+", title).strip("+")
    return {
        "id": page_id,
        "type": "page",
        "status": "current",
        "title": title,
        "space": {"id": abs(hash(key)) % 10**6, "key": key, "name": space_name, "type": "global"},
        "body": {"storage": {"value": body, "representation": "storage"}},
        "restrictions": {
            "read": {
                "operation": "read",
                "restrictions": {
                    "user": {"results": [], "start": 0, "limit": 200, "size": 0},
                    "group": {"results": [], "start": 0, "limit": 200, "size": 0},
                },
            }
        },
        "_links": {"webui": f"/spaces/{key}/pages/{page_id}/{slug}", "tinyui": f"/x/{page_id}"},
        **extra,
    }


def world_from_documents(folder: Path) -> ConfluenceWorld:
    """One page per ERB document (ids in file-name order) under a home page per space."""
    world = ConfluenceWorld()
    homes: dict[str, str] = {}
    docs = [(p.stem, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
    for number, (stem, doc) in enumerate(docs):
        key, name = space_key(doc["space"]), doc["space"].replace("-", " ").title()
        if key not in homes:
            home_id = str(100 + len(homes))
            homes[key] = home_id
            world.pages[home_id] = _page(
                home_id,
                f"{name} Home",
                key,
                name,
                f"<p>Welcome to the {name} space.</p>",
                version={"by": person("Space Admin"), "when": "2024-01-01T09:00:00.000Z", "number": 1},
                history={"latest": True, "createdBy": person("Space Admin"), "createdDate": "2024-01-01T09:00:00.000Z"},
                metadata={"labels": {"results": [], "start": 0, "limit": 200, "size": 0}},
            )
        page_id = str(65536 + number)
        modifier = (doc.get("reviewers") or [doc["author"]])[0]
        labels = [{"prefix": "global", "name": lb, "id": str(k)} for k, lb in enumerate(doc.get("labels") or [])]
        world.pages[page_id] = _page(
            page_id,
            doc["title"],
            key,
            name,
            storage(doc.get("content") or doc.get("body") or ""),
            status="current" if doc["status"] == "published" else "draft" if doc["status"] == "draft" else "current",
            version={"by": person(modifier), "when": _when(doc["last_updated"], 17), "number": 3, "minorEdit": False},
            history={"latest": True, "createdBy": person(doc["author"]), "createdDate": _when(doc["created_at"], 9)},
            metadata={"labels": {"results": labels, "start": 0, "limit": 200, "size": len(labels)}},
        )
        world.parents[page_id] = homes[key]
        world.by_file[stem] = page_id
        if str(doc.get("confidentiality", "")).startswith("restricted"):
            world.restrict(page_id, [doc["author"]], [f"{doc['space']}-leads"])
    return world


class FakeConfluence(JsonServer):
    """Serves a :class:`ConfluenceWorld` on ``127.0.0.1`` under ``/wiki`` (as Cloud does)."""

    prefix = "/wiki"

    def __init__(self, world: ConfluenceWorld, *, auth: str = "basic", email: str = EMAIL, token: str = TOKEN) -> None:
        super().__init__()
        self.world = world
        self.auth, self.email, self.token = auth, email, token
        self.echo_credentials = False
        self.limit_cap = 25
        self.malformed: dict[str, Any] = {}  # page id -> what to list instead of the page

    def rate_limit(self, *, path_suffix: str, start: str | None = None, wait: int = 1) -> None:
        with self._lock:
            self._limits.append({"suffix": path_suffix, "start": start, "wait": wait})

    def _expected(self) -> str:
        if self.auth == "bearer":
            return f"Bearer {self.token}"
        return "Basic " + base64.b64encode(f"{self.email}:{self.token}".encode()).decode()

    def _view(self, page: dict[str, Any], expand: set[str]) -> dict[str, Any]:
        """The page with only the asked-for expansions (Confluence leaves the rest out)."""
        out = {k: page[k] for k in ("id", "type", "status", "title", "_links")}
        out["_expandable"] = {}
        if "body.storage" in expand:
            out["body"] = page["body"]
        for name in ("version", "history", "space"):
            if name in expand:
                out[name] = page[name]
        if "metadata.labels" in expand:
            out["metadata"] = page["metadata"]
        if "ancestors" in expand:
            out["ancestors"] = self.world.ancestors(page["id"])
        read = page["restrictions"]["read"]["restrictions"]
        parts = {k: read[k] for k in ("user", "group") if f"restrictions.read.restrictions.{k}" in expand}
        if parts:
            out["restrictions"] = {"read": {"operation": "read", "restrictions": parts}}
        return json.loads(json.dumps(out))

    def serve(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, str], answer: Answer) -> None:
        credential = handler.headers.get("Authorization", "")
        if credential != self._expected():
            message = "Current user not permitted to use Confluence"
            if self.echo_credentials:
                message += f" (got {credential!r})"
            return answer(401, {"statusCode": 401, "message": message, "data": {"authorized": False}})
        with self._lock:
            at = query.get("start", "0")
            limit = next((x for x in self._limits if path.endswith(x["suffix"]) and x["start"] in (None, at)), None)
            if limit is not None:
                self._limits.remove(limit)
        if limit is not None:
            return answer(429, {"statusCode": 429, "message": "Rate limit hit"}, {"Retry-After": str(limit["wait"])})
        expand = set(query.get("expand", "").split(",")) - {""}
        with self.world.lock:
            if path == "/wiki/rest/api/content":
                pages = sorted(self.world.pages.values(), key=lambda p: int(p["id"]))
                if "spaceKey" in query:
                    pages = [p for p in pages if p["space"]["key"] == query["spaceKey"]]
                    if not pages:
                        return answer(404, {"statusCode": 404, "message": f"No space with key : {query['spaceKey']}"})
                start, size = int(query.get("start", "0")), min(int(query.get("limit", "25")), self.limit_cap)
                chunk = [self.malformed.get(p["id"]) or self._view(p, expand) for p in pages[start : start + size]]
                links: dict[str, str] = {
                    "base": self.base_url,
                    "context": "/wiki",
                    "self": f"{self.base_url}/rest/api/content",
                }
                if start + size < len(pages):
                    links["next"] = f"/rest/api/content?{urlencode({**query, 'start': start + size, 'limit': size})}"
                body = {"results": chunk, "start": start, "limit": size, "size": len(chunk), "_links": links}
                return answer(200, body)
            if path == "/wiki/rest/api/group/member":
                group = query.get("name", "")
                if group not in self.world.groups:
                    return answer(404, {"statusCode": 404, "message": f"No group found with name : {group}"})
                members = [person(n) for n in self.world.groups[group]]
                start, size = int(query.get("start", "0")), min(int(query.get("limit", "25")), self.limit_cap)
                links = {"base": self.base_url, "context": "/wiki"}
                if start + size < len(members):
                    links["next"] = (
                        f"/rest/api/group/member?{urlencode({**query, 'start': start + size, 'limit': size})}"
                    )
                chunk = members[start : start + size]
                return answer(
                    200, {"results": chunk, "start": start, "limit": size, "size": len(chunk), "_links": links}
                )
            if m := re.fullmatch(r"/wiki/rest/api/content/(\d+)", path):
                page = self.world.pages.get(m.group(1))
                if page is None:
                    return answer(404, {"statusCode": 404, "message": f"No content found with id: {m.group(1)}"})
                return answer(200, self._view(page, expand))
        return answer(404, {"statusCode": 404, "message": "null for uri: " + path})
