"""A counting HTTP relay: forwards every request to an upstream OpenAI-compatible server and sums the
``usage`` the server itself returns. Standard library only, independent of the harness's code.

    relay = CountingRelay("127.0.0.1", 0, "127.0.0.1", 8080, log_dir=Path("relay")).start()
    ...  # point a client at relay.url
    relay.records   # one dict per upstream request, in order
    relay.close()

What is counted, per request (``records``, also appended to ``<log_dir>/relay.jsonl``):

- a JSON reply (``Content-Type: application/json``): its top-level ``usage`` object;
- an SSE reply (``text/event-stream``): every ``data: {...}`` event that carries a ``usage`` object
  (OpenAI chat chunks with ``stream_options.include_usage``, a Responses ``response.completed``
  event's ``response.usage``); the last one seen wins (servers repeat cumulative totals);
- ``prompt_tokens``/``completion_tokens`` (Chat Completions) or ``input_tokens``/``output_tokens``
  (Responses, Messages) are read, whichever the server sent; ``usage_seen`` says whether it sent any;
- a streamed Chat Completions reply without any usage (llama-cpp-python 0.3.x never sends usage in
  a stream, ``stream_options.include_usage`` or not): the relay asks the server for the prompt's
  count itself, with the same body not streamed and ``max_tokens: 1`` (the server's KV cache still
  holds that prompt, so this costs about one token), and counts the streamed chunks that carry
  generated text or tool-call arguments as the completion's tokens (llama-cpp-python streams one
  chunk per generated token, merging a few only around multi-byte characters and stop strings);
  ``usage_source`` is then ``probe+chunks`` instead of ``server``.

A reply with status >= 400 is logged with its body, and the request body that triggered it is
saved as ``<log_dir>/rejected-<n>.json`` (the evidence a gateway fix needs). With
``keep_bodies=True`` every request body is saved (``<log_dir>/req-<n>.json``).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a ``usage`` object in any of the three APIs' spellings."""
    if not isinstance(usage, dict):
        return None
    p = usage.get("prompt_tokens", usage.get("input_tokens"))
    c = usage.get("completion_tokens", usage.get("output_tokens"))
    if not isinstance(p, int) and not isinstance(c, int):
        return None
    return int(p or 0), int(c or 0)


def _event_usage(obj: Any) -> tuple[int, int] | None:
    if not isinstance(obj, dict):
        return None
    got = usage_tokens(obj.get("usage"))
    if got is None and isinstance(obj.get("response"), dict):  # Responses: response.completed
        got = usage_tokens(obj["response"].get("usage"))
    if got is None and isinstance(obj.get("message"), dict):  # Messages: message_start
        got = usage_tokens(obj["message"].get("usage"))
    return got


class _SSEScanner:
    """Feed raw SSE bytes; remembers the last usage seen in a ``data:`` line."""

    def __init__(self) -> None:
        self.buf = b""
        self.usage: tuple[int, int] | None = None
        self.events = 0
        self.usage_events = 0
        self.token_chunks = 0  # chat chunks carrying generated text or tool-call arguments

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self._line(line)

    def close(self) -> None:
        if self.buf:
            self._line(self.buf)
            self.buf = b""

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        self.events += 1
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if isinstance(obj, dict):
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
                    self.token_chunks += 1
        got = _event_usage(obj)
        if got is not None:
            self.usage_events += 1
            self.usage = got


class CountingRelay:
    def __init__(
        self,
        host: str,
        port: int,
        upstream_host: str,
        upstream_port: int,
        *,
        log_dir: Path,
        keep_bodies: bool = False,
        timeout_s: float = 1800.0,
    ):
        self.upstream = (upstream_host, upstream_port)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / "relay.jsonl"
        self.keep_bodies = keep_bodies
        self.timeout_s = timeout_s
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._n = 0
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                relay._forward(self)

            def do_POST(self) -> None:
                relay._forward(self)

            def do_DELETE(self) -> None:
                relay._forward(self)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> CountingRelay:
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-relay", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def mark(self) -> int:
        """The number of requests recorded so far (slice ``records[mark:]`` for what came after)."""
        with self._lock:
            return len(self.records)

    def _probe_prompt_tokens(self, path: str, req: dict[str, Any], headers: dict[str, str]) -> int | str:
        body = {k: v for k, v in req.items() if k not in ("stream", "stream_options")}
        body["max_tokens"] = 1
        conn = http.client.HTTPConnection(*self.upstream, timeout=self.timeout_s)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            got = usage_tokens(json.loads(data).get("usage")) if resp.status == 200 else None
            return got[0] if got is not None else f"HTTP {resp.status}: {data[:300]!r}"
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    # --- one request ------------------------------------------------------------------------------
    def _forward(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self._n += 1
            n = self._n
        t0 = time.time()
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        req: dict[str, Any] = {}
        if body:
            try:
                req = json.loads(body)
            except ValueError:
                req = {}
        rec: dict[str, Any] = {
            "n": n,
            "method": h.command,
            "path": h.path,
            "model": req.get("model") if isinstance(req, dict) else None,
            "stream": bool(req.get("stream")) if isinstance(req, dict) else False,
            "stream_options": req.get("stream_options") if isinstance(req, dict) else None,
            "max_tokens": req.get("max_tokens") if isinstance(req, dict) else None,
            "messages": len(req.get("messages") or []) if isinstance(req, dict) else None,
            "tools": len(req.get("tools") or []) if isinstance(req, dict) else None,
            "request_bytes": len(body),
            "started": t0,
        }
        if self.keep_bodies and body:
            (self.log_dir / f"req-{n}.json").write_bytes(body)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection(*self.upstream, timeout=self.timeout_s)
        client_gone = headers_sent = False
        try:
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            ctype = resp.getheader("Content-Type") or ""
            rec["status"] = resp.status
            headers_sent = True
            h.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    h.send_header(k, v)
            is_sse = "text/event-stream" in ctype
            if is_sse:
                scanner = _SSEScanner()
                h.send_header("Transfer-Encoding", "chunked")
                h.send_header("Connection", "close")
                h.end_headers()
                received = []
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    scanner.feed(chunk)
                    if resp.status >= 400:
                        received.append(chunk)
                    if not client_gone:
                        try:
                            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            h.wfile.flush()
                        except OSError:
                            client_gone = True  # keep reading: the server still counts what it generates
                scanner.close()
                if not client_gone:
                    try:
                        h.wfile.write(b"0\r\n\r\n")
                        h.wfile.flush()
                    except OSError:
                        client_gone = True
                h.close_connection = True
                usage = scanner.usage
                rec.update(sse_events=scanner.events, sse_usage_events=scanner.usage_events,
                           token_chunks=scanner.token_chunks)  # fmt: skip
                data = b"".join(received)
                if usage is None and resp.status == 200 and isinstance(req, dict) and req.get("messages"):
                    # the server sent no usage in its stream: ask it the prompt's token count (same body,
                    # not streamed, one token; its KV cache still holds that prompt), and take the
                    # streamed chunks as the completion's tokens
                    probed = self._probe_prompt_tokens(h.path, req, headers)
                    rec["probe"] = probed
                    if isinstance(probed, int):
                        usage = (probed, scanner.token_chunks)
                        rec["usage_source"] = "probe+chunks"
                if usage is not None:
                    rec.setdefault("usage_source", "server")
            else:
                data = resp.read()
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                try:
                    h.wfile.write(data)
                    h.wfile.flush()
                except OSError:
                    client_gone = True
                usage = None
                if "json" in ctype:
                    try:
                        usage = usage_tokens(json.loads(data).get("usage"))
                    except (ValueError, AttributeError):
                        usage = None
                if usage is not None:
                    rec["usage_source"] = "server"
            rec["usage_seen"] = usage is not None
            rec["prompt_tokens"], rec["completion_tokens"] = usage if usage is not None else (0, 0)
            if resp.status >= 400:
                rec["error_body"] = data[:4000].decode("utf-8", errors="replace")
                if body:
                    (self.log_dir / f"rejected-{n}.json").write_bytes(body)
                    rec["rejected_request"] = str(self.log_dir / f"rejected-{n}.json")
        except Exception as exc:  # noqa: BLE001 - record, answer 502 if nothing was sent yet
            rec.setdefault("status", 502)
            rec["relay_error"] = f"{type(exc).__name__}: {exc}"
            rec.update(usage_seen=False, prompt_tokens=0, completion_tokens=0)
            if body:
                (self.log_dir / f"rejected-{n}.json").write_bytes(body)
            try:
                if headers_sent:
                    raise OSError("reply already started")
                msg = json.dumps({"error": {"message": rec["relay_error"], "type": "relay_error"}}).encode()
                h.send_response(502)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(msg)))
                h.end_headers()
                h.wfile.write(msg)
            except OSError:
                pass
        finally:
            conn.close()
        rec["client_gone"] = client_gone
        rec["ended"] = time.time()
        rec["latency_s"] = round(rec["ended"] - t0, 3)
        with self._lock:
            self.records.append(rec)
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
