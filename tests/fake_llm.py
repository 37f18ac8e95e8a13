"""A local OpenAI-compatible chat server with scripted replies, for tests of the judge and agents.

Stdlib only: a ``ThreadingHTTPServer`` on 127.0.0.1 (ephemeral port) answering

- ``GET  /v1/models``            -> one model, ``fake``;
- ``POST /v1/chat/completions``  -> the next scripted :class:`Reply` (plain or SSE streaming).

Script replies per test, in order; when the queue is empty the ``default`` reply (or the
``responder`` callable, given the parsed request) answers. Every request is recorded
(path, headers, parsed JSON body) so a test can assert what the client sent.

    with FakeLLM() as llm:
        llm.queue(Reply.error(500), Reply.text('{"score": 4, "reasoning": "ok"}'))
        ... client with api_base=llm.base_url, model="openai/fake" ...
        assert len(llm.chat_requests) == 2

Reply kinds: ``text`` (assistant content), ``message`` (a raw assistant message dict, e.g.
with ``tool_calls``), ``error`` (an HTTP status with an OpenAI-style error body), ``raw``
(any status/body/content type, e.g. non-JSON garbage), ``slow`` (answer after a delay, to
exceed a client timeout) and ``drop`` (read the request, close the socket without answering).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    kind: str = "text"  # text | message | error | raw | drop
    content: str = ""
    message: dict[str, Any] | None = None
    status: int = 200
    body: bytes | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"

    @classmethod
    def text(cls, content: str, **kw: Any) -> Reply:
        return cls(kind="text", content=content, **kw)

    @classmethod
    def json(cls, obj: Any, **kw: Any) -> Reply:
        """An assistant reply whose content is ``obj`` serialised as JSON."""
        return cls(kind="text", content=json.dumps(obj), **kw)

    @classmethod
    def with_message(cls, message: dict[str, Any], **kw: Any) -> Reply:
        return cls(kind="message", message=message, **kw)

    @classmethod
    def error(cls, status: int, message: str = "scripted error", *, retry_after: float | None = None) -> Reply:
        err_type = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_error",
        }.get(status, "server_error")
        headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
        body = json.dumps({"error": {"message": message, "type": err_type, "code": status}}).encode()
        return cls(kind="error", status=status, body=body, headers=headers)

    @classmethod
    def raw(cls, status: int, body: bytes | str, content_type: str = "text/plain") -> Reply:
        return cls(
            kind="raw", status=status, body=body.encode() if isinstance(body, str) else body, content_type=content_type
        )

    @classmethod
    def slow(cls, content: str, delay_s: float) -> Reply:
        return cls(kind="text", content=content, delay_s=delay_s)

    @classmethod
    def drop(cls) -> Reply:
        return cls(kind="drop")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or the raw text when it was not JSON
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or []) if isinstance(self.body, dict) else []


class FakeLLM:
    """The server. Use as a context manager or call :meth:`start`/:meth:`stop`."""

    model_id = "fake"

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        default: Reply | None = None,
        responder: Callable[[Request], Reply] | None = None,
    ):
        self._queue: deque[Reply] = deque(replies)
        self.default = default or Reply.error(500, "fake LLM: no scripted reply left")
        self.responder = responder
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeLLM:
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes slow replies
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # --- script -----------------------------------------------------------------------------------
    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def chat_requests(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            return self.responder(request)
        return self.default


def _headers(message: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in message.items()}


def _make_handler(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _send(
            self,
            status: int,
            body: bytes,
            content_type: str = "application/json",
            headers: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            llm.requests.append(Request("GET", self.path, _headers(self.headers), None, time.time()))
            if self.path.rstrip("/").endswith("/models"):
                body = {"object": "list", "data": [{"id": llm.model_id, "object": "model", "owned_by": "fake"}]}
                return self._send(200, json.dumps(body).encode())
            self._send(404, json.dumps({"error": {"message": "not found"}}).encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                parsed: Any = json.loads(raw or b"{}")
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            request = Request("POST", self.path, _headers(self.headers), parsed, time.time())
            if not self.path.rstrip("/").endswith("/chat/completions"):
                llm.requests.append(request)
                return self._send(404, json.dumps({"error": {"message": "not found"}}).encode())
            reply = llm._next(request)
            if reply.delay_s and llm._stopping.wait(reply.delay_s):
                return
            try:
                self._answer(reply, parsed if isinstance(parsed, dict) else {})
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

        def _answer(self, reply: Reply, req: dict[str, Any]) -> None:
            if reply.kind == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if reply.kind in ("error", "raw"):
                return self._send(reply.status, reply.body or b"", reply.content_type, reply.headers)
            message = reply.message if reply.kind == "message" else {"role": "assistant", "content": reply.content}
            message = dict(message or {})
            message.setdefault("role", "assistant")
            content = message.get("content") or ""
            prompt_chars = sum(len(json.dumps(m.get("content"))) for m in req.get("messages") or [])
            usage = reply.usage or {
                "prompt_tokens": max(1, prompt_chars // 4),
                "completion_tokens": max(1, len(content) // 4),
            }
            usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
            base = {
                "id": f"chatcmpl-fake-{len(llm.requests)}",
                "created": int(time.time()),
                "model": req.get("model", llm.model_id),
            }
            if req.get("stream"):
                return self._stream(base, message, reply.finish_reason, usage)
            body = {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
                "usage": usage,
            }
            self._send(reply.status, json.dumps(body).encode(), headers=reply.headers)

        def _stream(self, base: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, int]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def chunk(delta: dict[str, Any], finish_reason: str | None, extra: dict[str, Any] | None = None) -> None:
                obj = {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                    **(extra or {}),
                }
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

            content = message.get("content") or ""
            first = {"role": "assistant", "content": ""}
            if message.get("tool_calls"):
                first["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]
            chunk(first, None)
            for i, piece in enumerate(content.split(" ") if content else []):
                chunk({"content": (" " if i else "") + piece}, None)
            chunk({}, finish, {"usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler
