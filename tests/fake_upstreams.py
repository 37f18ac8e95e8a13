"""Fake model providers that speak exactly one API each, as real servers do, for the gateway's bridging tests.

- :class:`ChatOnlyUpstream`: ``POST /v1/chat/completions`` only (404 elsewhere, as llama-cpp-python's and
  most local servers). Strict like llama-cpp-python's request model: a ``system``, ``assistant`` or ``tool``
  message whose ``content`` is a list, or a role it does not know (``developer``), is refused with a 500.
  Streams usage only when the client asks with ``stream_options.include_usage``.
- :class:`ResponsesOnlyUpstream`: ``POST /v1/responses`` only (JSON or SSE).
- :class:`MessagesOnlyUpstream`: ``POST /v1/messages`` only (JSON or SSE), Anthropic-style.

Each plays one scripted agent turn pair, whatever client is behind the gateway: while no tool result is in
the conversation it calls the client's shell tool (``Bash``, ``exec_command``, ``shell``) with
``command``; afterwards it calls ``finish`` when offered (the built-in agent) or answers with text. Every
answer carries usage the server made up (``prompt_tokens`` from the request size, completion tokens
fixed per reply) and adds it to :attr:`served`, so a test can compare what the lake recorded with what
the server counted.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SHELL_TOOLS = ("Bash", "exec_command", "shell")


def _shell_args(name: str, command: str) -> dict[str, Any]:
    if name == "Bash":
        return {"command": command, "description": "run it"}
    if name == "exec_command":
        return {"cmd": command}
    return {"command": command}


class _Upstream:
    """The shared server: request log, usage ledger, the scripted decision; subclasses speak the API."""

    route = ""
    name = ""

    def __init__(self, command: str = "echo bridged > bridged.txt", *, completion_tokens: int = 7):
        self.command = command
        self.completion_tokens = completion_tokens
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []
        self.served: list[tuple[int, int]] = []  # (prompt, completion) per answered request
        self.fail_next: list[int] = []  # HTTP statuses to answer the next requests with
        self.down = False  # refuse every request with a 503
        self.hang_next: list[float] = []  # seconds to stay silent before answering the next requests
        self.hang_mid_stream_next: list[float] = []  # seconds to stay silent after a stream's first event
        self.report_usage = True  # False: answers carry no usage (as some local servers' streams)
        self._closing = threading.Event()
        self._dead = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    # --- lifecycle
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        """Stop listening, as a crashed server: connections to the port are refused until :meth:`restart`, and a
        request on a connection kept alive from before is dropped unanswered."""
        self._dead = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def restart(self) -> None:
        """Listen again on the same port (a server brought back up)."""
        port = self.port
        self._dead = False
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> _Upstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return sum(p for p, _ in self.served), sum(c for _, c in self.served)

    # --- the script
    def decide(self, tool_names: list[str], has_result: bool) -> tuple[str, Any]:
        """``("tool", (name, args))`` or ``("text", str)``."""
        if not has_result:
            shell = next((t for t in SHELL_TOOLS if t in tool_names), None)
            if shell is not None:
                return "tool", (shell, _shell_args(shell, self.command))
        elif "finish" in tool_names:
            return "tool", ("finish", {"summary": "done"})
        return "text", "Done: the file was created."

    def usage_for(self, raw: bytes) -> tuple[int, int]:
        prompt = max(1, len(raw) // 10)
        with self._lock:
            if self.report_usage:
                self.served.append((prompt, self.completion_tokens))
        return prompt, self.completion_tokens

    def check(self, body: dict[str, Any]) -> str | None:
        """Why the server refuses ``body`` (None: it accepts it)."""
        return None

    def answer(self, handler: Any, body: dict[str, Any], raw: bytes) -> None:
        raise NotImplementedError

    # --- HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def send_json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def send_sse(self, events: list[tuple[str | None, dict[str, Any] | str]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, (name, data) in enumerate(events):
                    payload = data if isinstance(data, str) else json.dumps(data)
                    head = f"event: {name}\n" if name else ""
                    self.wfile.write(f"{head}data: {payload}\n\n".encode())
                    if i == 0 and getattr(self, "mid_hang", 0.0):
                        self.wfile.flush()
                        if up._closing.wait(self.mid_hang):
                            return
                self.wfile.flush()
                self.close_connection = True

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    return self.send_json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
                self.send_json(404, {"error": {"message": f"{up.name}: no route {self.path}"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if up._dead:  # crashed: the kept-alive connection dies with the process
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                entry = {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                    "at": time.time(),
                }
                with up._lock:
                    up.requests.append(entry)
                    fail = up.fail_next.pop(0) if up.fail_next else (503 if up.down else None)
                    hang = up.hang_next.pop(0) if up.hang_next else 0.0
                    self.mid_hang = up.hang_mid_stream_next.pop(0) if up.hang_mid_stream_next else 0.0
                if hang and up._closing.wait(hang):
                    return
                if not self.path.split("?")[0].rstrip("/").endswith(up.route):
                    return self.send_json(404, {"error": {"message": f"{up.name}: no route {self.path}"}})
                if fail is not None:
                    return self.send_json(
                        fail, {"error": {"message": f"{up.name}: scripted {fail}", "type": "server_error"}}
                    )
                why = up.check(body)
                if why is not None:
                    up.rejected.append(entry | {"why": why})
                    return self.send_json(500, {"error": {"message": why, "type": "server_error"}})
                try:
                    up.answer(self, body, raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


class ChatOnlyUpstream(_Upstream):
    route = "/chat/completions"
    name = "chat-only"
    stream_usage = True  # False: streams never carry usage, include_usage or not (llama-cpp-python 0.3.36)
    ROLES = ("system", "user", "assistant", "tool", "function")

    def check(self, body: dict[str, Any]) -> str | None:
        for i, m in enumerate(body.get("messages") or []):
            role = m.get("role")
            if role not in self.ROLES:
                return f"messages[{i}].role: {role!r} is not one of {self.ROLES}"
            if role in ("system", "assistant", "tool") and isinstance(m.get("content"), list):
                return f"messages[{i}].content: a {role} message's content must be a string"
            if role == "assistant" and m.get("content") is None:
                return f"messages[{i}].content: Input should be a valid string"
        return None

    def answer(self, handler: Any, body: dict[str, Any], raw: bytes) -> None:
        msgs = body.get("messages") or []
        names = [(t.get("function") or {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        kind, what = self.decide(names, any(m.get("role") == "tool" for m in msgs))
        prompt, completion = self.usage_for(raw)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        n = len(self.requests)
        if kind == "tool":
            tc = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": what[0], "arguments": json.dumps(what[1])},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [tc]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": what}, "stop"
        base = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": body.get("model", "fake")}
        if not body.get("stream"):
            answer = base | {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
            return handler.send_json(200, answer | ({"usage": usage} if self.report_usage else {}))

        def chunk(delta: dict[str, Any], reason: str | None) -> tuple[None, dict[str, Any]]:
            return None, base | {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }

        events: list[tuple[str | None, dict[str, Any] | str]] = [chunk({"role": "assistant", "content": ""}, None)]
        if kind == "tool":
            events.append(chunk({"tool_calls": [{"index": 0, **tc}]}, None))
        else:
            events.append(chunk({"content": what}, None))
        events.append(chunk({}, finish))
        if self.report_usage and self.stream_usage and (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, base | {"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        handler.send_sse(events)


class ResponsesOnlyUpstream(_Upstream):
    route = "/responses"
    name = "responses-only"

    def answer(self, handler: Any, body: dict[str, Any], raw: bytes) -> None:
        items = body.get("input") if isinstance(body.get("input"), list) else []
        names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        done = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
        kind, what = self.decide(names, done)
        prompt, completion = self.usage_for(raw)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        n = len(self.requests)
        rid = f"resp_{n}"
        if kind == "tool":
            args = json.dumps(what[1])
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": what[0],
                "arguments": args,
            }
        else:
            part = {"type": "output_text", "text": what, "annotations": []}
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed", "content": [part]}
        item = item | {"status": "completed"}
        response = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model", "fake"),
            "status": "completed",
            "output": [item],
            "usage": usage,
        }
        if not body.get("stream"):
            return handler.send_json(200, response)
        events: list[tuple[str | None, dict[str, Any] | str]] = [
            (
                "response.created",
                {"type": "response.created", "response": response | {"status": "in_progress", "output": []}},
            ),
        ]
        if kind == "tool":
            added = item | {"arguments": "", "status": "in_progress"}
            ref = {"item_id": item["id"], "output_index": 0}
            events += [
                (
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": 0, "item": added},
                ),
                (
                    "response.function_call_arguments.delta",
                    {"type": "response.function_call_arguments.delta", **ref, "delta": item["arguments"]},
                ),
                (
                    "response.function_call_arguments.done",
                    {"type": "response.function_call_arguments.done", **ref, "arguments": item["arguments"]},
                ),
            ]
        else:
            ref = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": []}
            events += [
                (
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": 0,
                        "item": item | {"status": "in_progress", "content": []},
                    },
                ),
                ("response.content_part.added", {"type": "response.content_part.added", **ref, "part": empty}),
                ("response.output_text.delta", {"type": "response.output_text.delta", **ref, "delta": what}),
                ("response.output_text.done", {"type": "response.output_text.done", **ref, "text": what}),
                (
                    "response.content_part.done",
                    {"type": "response.content_part.done", **ref, "part": empty | {"text": what}},
                ),
            ]
        events += [
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]
        handler.send_sse(events)


class MessagesOnlyUpstream(_Upstream):
    route = "/messages"
    name = "messages-only"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, handler: Any, body: dict[str, Any], raw: bytes) -> None:
        def has_result(content: Any) -> bool:
            return isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content
            )

        names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        kind, what = self.decide(names, any(has_result(m.get("content")) for m in body.get("messages") or []))
        prompt, completion = self.usage_for(raw)
        n = len(self.requests)
        if kind == "tool":
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n}", "name": what[0], "input": what[1]}
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": what}, "end_turn"
        msg = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 1},
        }
        if not body.get("stream"):
            return handler.send_json(
                200,
                msg
                | {
                    "content": [block],
                    "stop_reason": stop,
                    "usage": {"input_tokens": prompt, "output_tokens": completion},
                },
            )
        if kind == "tool":
            start = block | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        events = [
            ("message_start", {"message": msg}),
            ("content_block_start", {"index": 0, "content_block": start}),
            ("ping", {}),
            ("content_block_delta", {"index": 0, "delta": delta}),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": completion}},
            ),
            ("message_stop", {}),
        ]
        handler.send_sse([(name, {"type": name} | data) for name, data in events])
