"""One pooled HTTP client per run, with a response size cap and timeouts.

The app under test is untrusted: every body is read with a byte cap (a 10 MB answer cannot
exhaust memory), every request has a timeout bounded by the node's deadline, redirects are
not followed (a 302 is an observation), and bodies are parsed as JSON only when they are
valid JSON (never evaluated).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import httpx

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0


class ResponseTooLarge(Exception):
    pass


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
        self._client = httpx.Client(
            follow_redirects=False,
            timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
            limits=httpx.Limits(max_connections=20, max_keepalive_connections=10),
            headers={"User-Agent": "saasbench-evaluator/0.1"},
        )

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
        """Send one request. Raises httpx.HTTPError on transport failure, ResponseTooLarge on the cap."""
        method = method.upper()
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
        url = self.url(path)
        started = time.perf_counter()
        request = self._client.build_request(method, url, **kwargs)
        response = self._client.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
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
