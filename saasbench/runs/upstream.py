"""The gateway's upstream tap: an HTTP relay between the LiteLLM proxy and each model provider.

LiteLLM bridges the client APIs to one another (an Anthropic Messages client to a Chat Completions
provider and so on), but three things it cannot do are done here, at the HTTP boundary, where they
do not depend on litellm's internals:

- **Shapes a strict Chat Completions server accepts.** litellm's translations hand a Chat-Completions
  upstream list-shaped ``content`` (Claude Code's system blocks, Codex's ``developer`` input) that
  servers such as llama-cpp-python refuse (HTTP 500). For an upstream declared ``api: chat`` the tap
  rewrites each request: text-only content lists become strings, ``developer`` becomes ``system``,
  the system messages become one leading system message, and a streamed request asks for usage
  (``stream_options.include_usage``).
- **Usage from the upstream.** The tap reads the provider's own ``usage`` (JSON bodies and every
  SSE dialect: chat chunks, Responses ``response.completed``, Messages ``message_start`` /
  ``message_delta``) and writes one JSON line per attempt to ``upstream.jsonl``, keyed by the
  ``x-saasbench-call`` header the gateway's hooks put on every provider request (litellm's call
  id). :meth:`saasbench.runs.gateway.Gateway.calls` prefers these counts; a call whose upstream
  reported none keeps litellm's estimate and is flagged ``usage_estimated``.
- **Stalls.** A provider that sends no byte for ``stall_timeout_s`` is cut off: before the response
  started the tap answers 504 (litellm retries it like any 5xx), after it started the stream is
  aborted; an unreachable provider is a 502. Either way the attempt's line names the cause, so a
  trial whose agent stopped on it is a model outage, not the agent's failure.

The tap binds 127.0.0.1 only; litellm adds the provider key to each request as before (the tap
never logs headers or bodies). Each upstream is addressed as ``/u/<index>/<path>``, which maps to
``<api_base>/<path>``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["CALL_HEADER", "UpstreamTap", "UpstreamTarget", "UsageMeter", "normalise_chat_request"]

CALL_HEADER = "x-saasbench-call"
Api = Literal["chat", "responses", "messages"]
MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_BUFFERED_RESPONSE = 64 * 1024 * 1024
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
}
_TEXT_PARTS = ("text", "input_text", "output_text")
_TEXT_KEYS = ("content", "text", "arguments", "partial_json", "delta", "instructions", "system", "input", "thinking")
MAX_ESTIMATE_CHARS = 4 * 1024 * 1024


def estimate_tokens(texts: list[str]) -> int:
    """Tokens of ``texts`` by litellm's offline tokenizer (its default, cl100k), else 4 characters a token:
    only for a provider that reported no usage, and flagged as an estimate wherever it is used."""
    text = "".join(texts)
    if not text:
        return 0
    try:
        from litellm import token_counter

        return int(token_counter(text=text))
    except Exception:  # noqa: BLE001 - no litellm or a tokenizer failure: the rough rule
        return max(1, len(text) // 4)


def request_texts(body: bytes) -> list[str]:
    """The text a request sends (messages, input, system, instructions, tool definitions)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return []
    meter = UsageMeter()
    if isinstance(obj, dict):
        meter._collect({k: v for k, v in obj.items() if k in ("messages", "input", "system", "instructions")})
        if obj.get("tools"):
            meter.text.append(json.dumps(obj["tools"]))
    return meter.text


@dataclass(frozen=True)
class UpstreamTarget:
    """One provider behind the tap: its real base URL and the API it speaks (None: unknown, no rewrite)."""

    base_url: str
    api: Api | None = None
    # a Chat Completions stream: "native" passes it through; "buffer" asks the provider for the whole
    # answer (which carries usage) and streams it to the client itself; "auto" passes streams through
    # until one ends without usage (llama-cpp-python ignores stream_options), then buffers
    stream_usage: Literal["auto", "native", "buffer"] = "auto"


# --- request shapes ------------------------------------------------------------------------------------------
def _flatten(content: Any) -> Any:
    """A list of text parts as one string; anything else (a string, a list with an image) unchanged."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            return content
    return "\n\n".join(texts)


def normalise_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request a strict server accepts (see the module docstring). Pure."""
    out = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        system: list[str] = []
        rest: list[Any] = []
        for m in messages:
            if not isinstance(m, dict):
                rest.append(m)
                continue
            m = dict(m)
            if m.get("role") == "developer":
                m["role"] = "system"
            if "content" in m:
                m["content"] = _flatten(m["content"])
            if m.get("role") == "assistant" and m.get("content") is None:
                m["content"] = ""  # llama-cpp-python refuses null content beside tool_calls (HTTP 500)
            if m.get("role") == "system" and isinstance(m.get("content"), str):
                system.append(m["content"])
            else:
                rest.append(m)
        out["messages"] = ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest
    if body.get("stream"):
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return out


# --- usage -----------------------------------------------------------------------------------------------------
class UsageMeter:
    """The provider's own token counts, fed the JSON objects of a body or of SSE ``data:`` lines."""

    def __init__(self) -> None:
        self.prompt: int | None = None
        self.completion: int | None = None
        self.text: list[str] = []  # the answer's text, for an estimate when no usage comes
        self._text_chars = 0
        self._buf = b""

    @property
    def reported(self) -> bool:
        return self.prompt is not None or self.completion is not None

    def feed_object(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        if not self.reported:
            self._collect(obj)
        kind = obj.get("type")
        if kind == "message_start" and isinstance(obj.get("message"), dict):  # Anthropic stream
            self._anthropic(obj["message"].get("usage"))
            return
        if kind == "message_delta":
            self._anthropic(obj.get("usage"))
            return
        if isinstance(obj.get("response"), dict) and kind in ("response.completed", "response.incomplete"):
            obj = obj["response"]  # Responses stream: the final response carries the usage
        usage = obj.get("usage")
        if not isinstance(usage, dict):
            return
        if obj.get("type") == "message":  # an Anthropic JSON body
            self._anthropic(usage)
        elif "prompt_tokens" in usage or "completion_tokens" in usage:  # chat completions
            self.prompt = _int(usage.get("prompt_tokens"), self.prompt)
            self.completion = _int(usage.get("completion_tokens"), self.completion)
        elif "input_tokens" in usage or "output_tokens" in usage:  # responses
            self.prompt = _int(usage.get("input_tokens"), self.prompt)
            self.completion = _int(usage.get("output_tokens"), self.completion)

    def _anthropic(self, usage: Any) -> None:
        """Anthropic counts cached input apart; the prompt is input + cache writes + cache reads (as litellm)."""
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("input_tokens"), int):
            keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            self.prompt = sum(v for k in keys if isinstance(v := usage.get(k), int))
        self.completion = _int(usage.get("output_tokens"), self.completion)  # cumulative in message_delta

    def _collect(self, obj: Any, depth: int = 0) -> None:
        if depth > 12 or self._text_chars > MAX_ESTIMATE_CHARS:
            return
        if isinstance(obj, dict):
            for key, value in obj.items():
                if isinstance(value, str) and key in _TEXT_KEYS:
                    self.text.append(value)
                    self._text_chars += len(value)
                elif isinstance(value, (dict, list)) and key != "usage":
                    self._collect(value, depth + 1)
        elif isinstance(obj, list):
            for item in obj:
                self._collect(item, depth + 1)

    def feed_body(self, data: bytes) -> None:
        try:
            self.feed_object(json.loads(data))
        except ValueError:
            pass

    def feed_sse(self, chunk: bytes) -> None:
        self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    self.feed_body(payload)
        if len(self._buf) > 8 * 1024 * 1024:  # a line without end: never buffer it whole
            self._buf = b""


def _int(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# --- the relay -------------------------------------------------------------------------------------------------
class UpstreamTap:
    """A threaded relay on 127.0.0.1: ``/u/<i>/<path>`` -> ``targets[i].base_url/<path>``."""

    def __init__(
        self,
        targets: list[UpstreamTarget],
        log_path: Path,
        *,
        stall_timeout_s: float = 300.0,
        connect_timeout_s: float = 30.0,
    ):
        self.targets = list(targets)
        self.log_path = Path(log_path)
        self.stall_timeout_s = stall_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._clients: dict[bool, Any] = {}
        self._no_stream_usage: set[int] = set()  # upstreams whose streams came without usage

    @property
    def port(self) -> int:
        assert self._server is not None, "tap not started"
        return self._server.server_address[1]

    def url_for(self, index: int) -> str:
        return f"http://127.0.0.1:{self.port}/u/{index}"

    def start(self) -> UpstreamTap:
        import httpx

        timeout = httpx.Timeout(self.stall_timeout_s, connect=self.connect_timeout_s)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=32)
        # loopback upstreams never go through the host's HTTP proxy; remote ones honour it
        self._clients = {
            True: httpx.Client(timeout=timeout, limits=limits, trust_env=False),
            False: httpx.Client(timeout=timeout, limits=limits, trust_env=True),
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="gateway-tap", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for client in self._clients.values():
            client.close()
        self._clients = {}

    def buffers(self, index: int) -> bool:
        """Whether streams to upstream ``index`` are asked for whole (see :class:`UpstreamTarget`)."""
        mode = self.targets[index].stream_usage
        return mode == "buffer" or (mode == "auto" and index in self._no_stream_usage)

    def learn_no_stream_usage(self, index: int) -> None:
        with self._lock:
            self._no_stream_usage.add(index)

    def client_for(self, url: str) -> Any:
        host = urlsplit(url).hostname or ""
        return self._clients[host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")]

    def record(self, **fields: Any) -> None:
        line = json.dumps({"kind": "upstream", "t": time.time(), **fields}, default=str)
        with self._lock, open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def sse_from_completion(data: bytes) -> bytes | None:
    """A Chat Completions answer (JSON) as the SSE stream the client asked for: a role chunk, the content,
    the tool calls, the finish reason, the usage chunk, ``[DONE]``. None if ``data`` is no such answer."""
    try:
        answer = json.loads(data)
        choice = answer["choices"][0]
        message = choice.get("message") or {}
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    base = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint") if k in answer}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        obj = base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} | extra
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(chunk({"content": message["content"]}))
    for i, tc in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **tc}]}))
    out.append(chunk({}, choice.get("finish_reason") or "stop"))
    if isinstance(answer.get("usage"), dict):
        out.append(b"data: " + json.dumps(base | {"choices": [], "usage": answer["usage"]}).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The tap's records (a line being written is skipped)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.split(b"\n"):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _handler(tap: UpstreamTap) -> type[BaseHTTPRequestHandler]:
    import httpx

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, message: str, kind: str) -> None:
            data = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._relay("GET")

        def do_POST(self) -> None:
            self._relay("POST")

        def do_HEAD(self) -> None:
            self._relay("HEAD")

        def _relay(self, method: str) -> None:
            parts = self.path.split("/", 3)  # "", "u", "<i>", "<rest>"
            if len(parts) < 3 or parts[1] != "u" or not parts[2].isdigit() or int(parts[2]) >= len(tap.targets):
                return self._json(404, "saasbench gateway tap: unknown upstream", "not_found")
            target = tap.targets[int(parts[2])]
            url = target.base_url.rstrip("/") + "/" + (parts[3] if len(parts) > 3 else "")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                return self._json(413, "saasbench gateway tap: request too large", "invalid_request_error")
            body = self.rfile.read(length) if length else b""
            call_id = self.headers.get(CALL_HEADER)
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != CALL_HEADER
            }
            headers["Accept-Encoding"] = "identity"  # the usage is read from the bytes as they pass
            path = urlsplit(url).path
            rewritten = False
            buffered = False  # a stream the tap asked for whole and streams to the client itself
            upstream_index = int(parts[2])
            if method == "POST" and target.api == "chat" and path.rstrip("/").endswith("/chat/completions"):
                try:
                    parsed = json.loads(body)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    new = normalise_chat_request(parsed)
                    if new.get("stream") and tap.buffers(upstream_index):
                        new = {k: v for k, v in new.items() if k != "stream_options"} | {"stream": False}
                        buffered = True
                    if new != parsed:
                        body, rewritten = json.dumps(new).encode(), True
            started = time.time()
            meter = UsageMeter()
            fields: dict[str, Any] = {"call_id": call_id, "upstream": int(parts[2]), "path": path, "start": started}
            client = tap.client_for(url)
            try:
                request = client.build_request(method, url, headers=headers, content=body)
                response = client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                why = "stalled" if isinstance(exc, httpx.ReadTimeout) else "unreachable"
                tap.record(**fields, status=504 if why == "stalled" else 502, error=f"{why}: {exc!r}", end=time.time())
                msg = (
                    f"model upstream stalled: no response within {tap.stall_timeout_s:g}s"
                    if why == "stalled"
                    else f"model upstream unreachable: {exc}"
                )
                return self._json(504 if why == "stalled" else 502, msg, "upstream_" + why)
            except httpx.HTTPError as exc:
                tap.record(**fields, status=502, error=f"unreachable: {exc!r}", end=time.time())
                return self._json(502, f"model upstream unreachable: {exc}", "upstream_unreachable")
            fields["status"] = response.status_code
            error: str | None = None
            streamed = 0
            sent = False  # the response head went to litellm: an error can only cut the stream now
            sse = False
            try:
                sse = "event-stream" in response.headers.get("content-type", "")
                if not sse and method != "HEAD":
                    data = b""
                    for chunk in response.iter_raw():
                        data += chunk
                        if len(data) > MAX_BUFFERED_RESPONSE:
                            raise httpx.DecodingError("upstream response larger than the tap's limit")
                    meter.feed_body(data)
                    if buffered and response.status_code == 200:
                        events = sse_from_completion(data)
                        if events is not None:
                            self.send_response(200)
                            self.send_header("Content-Type", "text/event-stream")
                            self.send_header("Connection", "close")
                            self.close_connection = True
                            self.end_headers()
                            sent = True
                            self.wfile.write(events)
                            self.wfile.flush()
                            streamed = len(events)
                            return
                self.send_response(response.status_code)
                for k, v in response.headers.items():
                    if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding":
                        self.send_header(k, v)
                if sse or method == "HEAD":
                    self.send_header("Connection", "close")
                    self.close_connection = True
                    self.end_headers()
                    sent = True
                    for chunk in response.iter_raw() if sse else ():
                        meter.feed_sse(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        streamed += len(chunk)
                else:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    sent = True
                    self.wfile.write(data)
                    streamed = len(data)
            except httpx.ReadTimeout:
                error = f"stalled: no byte for {tap.stall_timeout_s:g}s after {streamed} bytes"
                self.close_connection = True
                if not sent:
                    fields["status"] = 504
                    self._json(504, f"model upstream stalled: no byte for {tap.stall_timeout_s:g}s", "upstream_stalled")
            except httpx.HTTPError as exc:
                error = f"upstream broke: {exc!r}"
                self.close_connection = True
                if not sent:
                    fields["status"] = 502
                    self._json(502, f"model upstream broke: {exc}", "upstream_unreachable")
            except (BrokenPipeError, ConnectionResetError):
                error = "client went away"
                self.close_connection = True
            finally:
                response.close()
                if sse and not meter.reported and not error and target.api == "chat":
                    tap.learn_no_stream_usage(upstream_index)
                tap.record(
                    **fields,
                    end=time.time(),
                    bytes=streamed,
                    rewritten=rewritten,
                    buffered=buffered,
                    usage_reported=meter.reported,
                    prompt_tokens=meter.prompt,
                    completion_tokens=meter.completion,
                    **(
                        {}
                        if meter.reported or error
                        else {
                            "estimated_prompt_tokens": estimate_tokens(request_texts(body)),
                            "estimated_completion_tokens": estimate_tokens(meter.text),
                        }
                    ),
                    error=error,
                )

    return Handler
