"""The loopback HTTP plumbing the fake REST services of the tests share (GitHub, Jira, Confluence).

:class:`JsonServer` runs a threaded ``http.server`` on ``127.0.0.1`` (a free port), parses each
GET's path and query (the last value of a repeated key wins) and hands them to the subclass's
:meth:`JsonServer.serve` with an ``answer(status, body, headers=None)`` callable that logs the
request as a :class:`Request` (path, query, status, monotonic time) and sends ``body`` as JSON.
Subclasses set ``prefix`` (the path of ``base_url``), ``content_type`` and ``extra_headers``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

Answer = Callable[..., None]  # answer(status: int, body: Any, headers: dict[str, str] | None = None)


@dataclass
class Request:
    path: str
    query: dict[str, str]
    status: int
    at: float


class JsonServer:
    """A fake REST service on loopback; ``requests`` logs every request, ``close()`` stops it."""

    prefix: ClassVar[str] = ""
    content_type: ClassVar[str] = "application/json;charset=UTF-8"
    extra_headers: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._limits: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{self.prefix}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def log(self, path_suffix: str) -> list[Request]:
        return [r for r in self.requests if r.path.endswith(path_suffix)]

    def serve(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, str], answer: Answer) -> None:
        """Answer one GET (subclasses): call ``answer`` exactly once."""
        raise NotImplementedError

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urlparse(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        path = parsed.path

        def answer(status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            with self._lock:
                self.requests.append(Request(path=path, query=query, status=status, at=time.monotonic()))
            data = json.dumps(body).encode()
            handler.send_response(status)
            handler.send_header("Content-Type", self.content_type)
            handler.send_header("Content-Length", str(len(data)))
            for key, value in {**self.extra_headers, **(headers or {})}.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(data)

        self.serve(handler, path, query, answer)
