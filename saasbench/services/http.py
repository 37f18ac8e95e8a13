"""One pooled HTTP client per run, with a response size cap and timeouts.

The app under test is untrusted: every body is read with a byte cap (a 10 MB answer cannot
exhaust memory), redirects are not followed (a 302 is an observation), and bodies are parsed
as JSON only when they are valid JSON (never evaluated).

**Time.** A request's ``timeout_s`` is its *total* budget (connect, send, headers and body),
which callers bound by the node deadline (``ctx.timeout()``). httpx's own timeouts are per
socket operation, so an app that trickles one byte every 2 s never trips them; here every
socket read and write is given at most what is left of the request's budget (a network backend
under httpcore's pool, :class:`_DeadlineBackend`), so a trickling header or body ends at the
budget with :class:`RequestDeadline` naming what was still arriving.

**Credentials.** The identity's headers, cookies and CSRF header go only to the app's own
origin (scheme, host and port of the base URL; loopback names are one host when the app is on
loopback). A request to another origin (an absolute URL the app returned, a URL a DAG names)
is sent without them, and cookies it sets are not kept.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0


class ResponseTooLarge(Exception):
    pass


class RequestDeadline(httpx.TimeoutException):
    """A request's total budget ran out; the message says what was still arriving.

    ``phase`` is ``"response"`` (no complete status line and headers yet) or ``"body"`` (the
    headers came, the body was still arriving); ``received`` counts the body bytes read.
    """

    def __init__(self, message: str, *, phase: str, seconds: float, received: int = 0):
        super().__init__(message)
        self.phase = phase
        self.seconds = seconds
        self.received = received


# --- the total deadline under httpx -------------------------------------------------------------
# The deadline of the request running in this thread, as a time.monotonic() instant. A context
# variable: the pool's connections are shared, the request that reads from one is the caller's.
_REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("saasbench_request_deadline", default=None)
_WRITE_CHUNK = 64 * 1024  # a slow reader of a large upload meets the deadline between chunks


@contextmanager
def request_deadline(seconds: float) -> Iterator[float]:
    """Every socket operation of requests sent inside gets at most what is left of ``seconds``."""
    at = time.monotonic() + max(0.0, seconds)
    token = _REQUEST_DEADLINE.set(at)
    try:
        yield at
    finally:
        _REQUEST_DEADLINE.reset(token)


def _clamp(timeout: float | None, error: type[Exception]) -> float | None:
    at = _REQUEST_DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("request deadline reached")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _WRITE_CHUNK):
            self._inner.write(buffer[start : start + _WRITE_CHUNK], _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        inner = self._inner.start_tls(ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with every timeout cut to what is left of the request's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, _clamp(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._inner.connect_unix_socket(path, _clamp(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over a pool whose sockets honour :func:`request_deadline`.

    httpx takes no network backend, so the pool it built is replaced by one with ours (same
    limits). No proxy: the app is reached directly, as the WebSocket and browser primitives do.
    """

    def __init__(self, limits: httpx.Limits):
        super().__init__(limits=limits, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )


def bounded_client(timeout_s: float, *, limits: httpx.Limits | None = None) -> httpx.Client:
    """An httpx client that follows no redirect and whose requests honour :func:`request_deadline`."""
    return httpx.Client(
        follow_redirects=False,
        timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
        transport=_DeadlineTransport(limits or httpx.Limits(max_connections=20, max_keepalive_connections=10)),
        headers={"User-Agent": "saasbench-evaluator/0.1"},
    )


# --- origins ------------------------------------------------------------------------------------
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an absolute URL, default ports filled in; raises ValueError."""
    parsed = httpx.URL(url)
    scheme = parsed.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    return scheme, parsed.host.lower(), parsed.port or _DEFAULT_PORTS[scheme]


def same_origin(a: str, b: str) -> bool:
    """Whether two absolute URLs share scheme, host and port; every loopback name is one host."""
    try:
        (sa, ha, pa), (sb, hb, pb) = origin_of(a), origin_of(b)
    except (ValueError, httpx.InvalidURL):
        return False
    return sa == sb and pa == pb and (ha == hb or (_is_loopback(ha) and _is_loopback(hb)))


@dataclass
class Identity:
    """Who requests are sent as: a role's headers and its own cookie jar."""

    role: str
    headers: dict[str, str] = field(default_factory=dict)
    cookies: httpx.Cookies = field(default_factory=httpx.Cookies)
    csrf_header: str | None = None
    csrf_token: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # token, user id... exposed as placeholders


ANONYMOUS = "anonymous"


@dataclass
class HttpResponse:
    """What the engine keeps of a response: status, lower-cased headers, parsed body."""

    method: str
    url: str
    status: int
    headers: dict[str, str]
    text: str
    body: Any
    is_json: bool
    elapsed_ms: float
    json_error: str | None = None
    credentials_withheld: bool = False  # the identity's credentials were not sent: the URL is another origin

    def record(self) -> dict[str, Any]:
        """A plain dict view for placeholders, captures and node outputs.

        ``created_id`` is the id of the entity the body describes (``id``, ``uuid``, or under
        ``data``/``result``/``item``; absent when there is none), so ``{{saved.created_id}}``
        resolves the way the reference harness's saved responses do.
        """

        created = extract_id(self.body)
        return {
            **({"created_id": created} if created is not None else {}),
            "status": self.status,
            "status_code": self.status,
            "headers": self.headers,
            "body": self.body,
            "elapsed_ms": self.elapsed_ms,
            "url": self.url,
            "method": self.method,
        }


class HttpClient:
    def __init__(
        self,
        base_url: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        origin_aliases: list[str] | tuple[str, ...] = (),
    ):
        self.base_url = base_url.rstrip("/") + "/"
        # Origins that mean "the app" in a DAG written for another machine (http://localhost:8021 on the
        # benchmark's host): absolute URLs on them are sent to base_url instead.
        self.origin_aliases = {a.rstrip("/").lower() for a in origin_aliases}
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._client = bounded_client(timeout_s)

    def is_app_origin(self, url: str) -> bool:
        """Whether ``url`` (absolute) is on the app's origin: where credentials may go."""
        return same_origin(url, self.base_url)

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            m = re.match(r"(https?://[^/?#]+)(.*)", path, re.S)
            if m and m.group(1).lower() in self.origin_aliases:
                return urljoin(self.base_url, m.group(2).lstrip("/"))
            return path
        return urljoin(self.base_url, path.lstrip("/"))

    def request(
        self,
        method: str,
        path: str,
        *,
        identity: Identity | None = None,
        headers: dict[str, str] | None = None,
        send_identity_headers: bool = True,
        json_body: Any = None,
        content: str | bytes | None = None,
        data: dict[str, Any] | None = None,
        files: Any = None,
        timeout_s: float | None = None,
    ) -> HttpResponse:
        """Send one request. Raises httpx.HTTPError on transport failure (:class:`RequestDeadline` when
        ``timeout_s``, the request's total budget, runs out), ResponseTooLarge on the cap.

        The identity's credentials go only to the app's origin (:meth:`is_app_origin`).
        """
        method = method.upper()
        url = self.url(path)
        withheld = identity is not None and send_identity_headers and not self.is_app_origin(url)
        if withheld:
            identity = None  # never the token, cookies or CSRF header of an app user to another origin
        merged: dict[str, str] = {}
        if identity is not None and send_identity_headers:
            merged.update(identity.headers)
            if identity.csrf_header and identity.csrf_token and method not in {"GET", "HEAD", "OPTIONS"}:
                merged[identity.csrf_header] = identity.csrf_token
        if headers:
            merged.update({str(k): str(v) for k, v in headers.items()})
        if identity is not None and send_identity_headers and identity.cookies:
            cookie_header = "; ".join(f"{c.name}={c.value}" for c in identity.cookies.jar)
            if cookie_header:
                merged.setdefault("Cookie", cookie_header)
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        kwargs: dict[str, Any] = {"headers": merged, "timeout": httpx.Timeout(timeout, connect=min(5.0, timeout))}
        if files is not None:
            kwargs["files"] = files
            if data is not None:
                kwargs["data"] = data
            # multipart boundary must come from the client, never from a DAG-declared header
            kwargs["headers"] = {k: v for k, v in merged.items() if k.lower() != "content-type"}
        elif json_body is not None:
            kwargs["json"] = json_body
        elif content is not None:
            kwargs["content"] = content
        elif data is not None:
            kwargs["data"] = data
        started = time.perf_counter()
        request = self._client.build_request(method, url, **kwargs)
        chunks: list[bytes] = []
        size = 0
        with request_deadline(timeout):
            try:
                response = self._client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                if time.perf_counter() - started >= timeout - 0.01:
                    raise RequestDeadline(
                        f"no complete response within {timeout:g}s", phase="response", seconds=timeout
                    ) from exc
                raise
            try:
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > self.max_bytes:
                    raise ResponseTooLarge(
                        f"response body of {int(declared)} bytes exceeds the {self.max_bytes}-byte cap; not read"
                    )
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ResponseTooLarge(f"response body exceeds the {self.max_bytes}-byte cap; reading stopped")
                    chunks.append(chunk)
            except httpx.TimeoutException as exc:
                raise RequestDeadline(
                    f"response body still arriving after {timeout:g}s ({response.status_code}, {size} bytes read)",
                    phase="body",
                    seconds=timeout,
                    received=size,
                ) from exc
            finally:
                response.close()
                self._client.cookies.clear()  # cookies live per identity, never in the shared client
        elapsed_ms = (time.perf_counter() - started) * 1000
        if identity is not None and "set-cookie" in response.headers:
            identity.cookies.extract_cookies(response)
        raw = b"".join(chunks)
        text = raw.decode(response.encoding or "utf-8", errors="replace")
        body, is_json, json_error = parse_body(text, response.headers.get("content-type", ""))
        return HttpResponse(
            method=method,
            url=url,
            status=response.status_code,
            headers={k.lower(): v for k, v in response.headers.items()},
            text=text,
            body=body,
            is_json=is_json,
            elapsed_ms=elapsed_ms,
            json_error=json_error,
            credentials_withheld=withheld,
        )

    def close(self) -> None:
        self._client.close()


def parse_body(text: str, content_type: str) -> tuple[Any, bool, str | None]:
    """JSON when it parses (whatever the declared type), else the text. Never evaluates anything."""
    stripped = text.strip()
    if not stripped:
        return None, False, None
    looks_json = "json" in content_type.lower() or stripped[0] in '[{"' or stripped in {"true", "false", "null"}
    if looks_json:
        try:
            return json.loads(stripped), True, None
        except (ValueError, RecursionError) as exc:
            return text, False, f"invalid JSON body: {exc}"
    return text, False, None


def extract_id(body: Any) -> Any:
    """The id of a created entity in common response shapes: {id}, {data: {id}}, {result: {id}}."""
    if isinstance(body, dict):
        for key in ("id", "uuid"):
            if key in body and isinstance(body[key], (str, int)) and not isinstance(body[key], bool):
                return body[key]
        for wrapper in ("data", "result", "item"):
            inner = body.get(wrapper)
            if isinstance(inner, dict):
                found = extract_id(inner)
                if found is not None:
                    return found
    return None
