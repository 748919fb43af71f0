"""A local HTTP server on loopback that speaks the OpenAI chat-completions wire format.

Tests reach it through the real ``openai`` client (``OPENAI_BASE_URL``); nothing is patched.
Replies are scripted per call: a callable receives the request JSON and returns the assistant's
text (or raises ``ServerError`` to answer with an HTTP error). Streaming requests get real
server-sent events (``data: {...}`` chunks, then ``data: [DONE]``).

For streaming, the callable may instead return a list: each string is sent as one chunk exactly
as given (so a test decides where token boundaries fall), and a ``StreamError`` item sends an
error object mid-stream, as OpenAI-compatible servers do when generation fails, and ends the
response. ``FakeOpenAIServer(responder, chunk_delay=0.05)`` waits that many seconds before each
chunk (to measure time to first token).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ServerError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class StreamError:
    """In a scripted list of chunks: fail the stream here with this message."""

    def __init__(self, message: str = "generation failed"):
        self.message = message


Responder = Callable[[dict[str, Any]], "str | list[str | StreamError]"]


class FakeOpenAIServer:
    """Start with ``with FakeOpenAIServer(responder) as server: server.base_url``."""

    def __init__(self, responder: Responder, *, chunk_delay: float = 0.0):
        self.responder = responder
        self.chunk_delay = chunk_delay
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.requests.append({"path": self.path, "body": body})
                if not self.path.endswith("/chat/completions"):
                    return self._json(404, {"error": {"message": f"no route {self.path}"}})
                try:
                    reply = owner.responder(body)
                except ServerError as exc:
                    return self._json(exc.status, {"error": {"message": str(exc), "type": "server_error"}})
                created = int(time.time())
                if isinstance(reply, str):
                    text = reply
                    pieces = [text[i : i + 7] for i in range(0, len(text), 7)] or [""]
                else:
                    pieces = list(reply)
                    text = "".join(p for p in pieces if isinstance(p, str))
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for i, piece in enumerate(pieces):
                        if owner.chunk_delay:
                            time.sleep(owner.chunk_delay)
                        if isinstance(piece, StreamError):
                            error = {"error": {"message": piece.message, "type": "server_error"}}
                            self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
                            return
                        chunk = {
                            "id": "chatcmpl-test",
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": body.get("model", "test"),
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": piece},
                                    "finish_reason": None,
                                }
                            ],
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    done = {
                        "id": "chatcmpl-test",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": body.get("model", "test"),
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    }
                    self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
                    return
                return self._json(
                    200,
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": created,
                        "model": body.get("model", "test"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                    },
                )

            def _json(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
