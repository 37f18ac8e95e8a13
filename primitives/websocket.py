"""P21's WebSocket dialect: a scripted exchange with the app over ``ws://``/``wss://``.

The paper's P21 is ``log_content_check`` (primitives/container.py). Some public DAGs use the
code for a WebSocket probe instead (task_mjobbzsi, Jitsi's XMPP-over-WebSocket endpoint)::

    {"url": "ws://localhost:8026/xmpp-websocket", "subprotocol": "xmpp",
     "send": "<open .../>", "expect_message": {"timeout_ms": 5000, "match": {"content_contains": "<open"}}}
    {"url": "...", "subprotocol": "xmpp", "timeout_ms": 15000,
     "steps": [{"send": "<open .../>", "expect": "<open"}, {"expect": "ANONYMOUS"},
               {"send": "<iq .../>", "expect_any": ["jid", "<bind", "not-authorized"]}]}

task_sgdoserd (Mattermost) scripts JSON events instead::

    {"path": "/api/v4/websocket", "expect_first_event": {"event": "hello", "seq": 0}}
    {"path": "/api/v4/websocket", "send": [{"action": "authentication_challenge", "seq": 1, "data": {...}}],
     "expect_response": {"status": "OK", "seq_reply": 1}}
    {"path": "/api/v4/websocket", "trigger_after_connect": {"http_call": {"method": "POST", "path": "/api/v4/posts", ...}},
     "expect_event": {"event": "posted", "data_keys_required": ["post"], "broadcast_channel_id": "{{cid}}"}}

which becomes exchange steps in that order: ``expect_json`` (a received message, parsed as
JSON, contains these values; nested objects match as subsets) with ``within_first: 3`` for the
first event (the reference looks at the first 3 events), one ``send`` per message (objects are
sent as their JSON text), ``http`` (a request sent as the active identity, as a P24 trigger,
while the socket is open) and ``expect_json`` + ``expect_json_keys`` (dotted paths that must
exist, ``data.<key>``) for the event. Without any expectation the app must send at least one
message (``expect_any_message``; the reference passes when any event arrived). The reference
ignored ``seq``, ``data_keys_required``, ``broadcast_channel_id`` and ``expect_response``; they
are checked here, because the DAG states them.

The two forms cannot be confused: a step with a ``url`` is the WebSocket dialect, a step without
one is the log check (which needs ``pattern``). This module registers P21 again with one input
model that accepts both and dispatches on ``url``; the log check itself is unchanged.

Semantics (docs/dag-semantics.md, "WebSocket"): the URL may be relative (joined to the base URL,
``http`` -> ``ws``) and must point at the app's host (as for the browser: any port, every
loopback name when the app is on loopback); the active identity's auth headers are sent with the
handshake. Steps run in order: ``send`` sends one text message, then ``expect`` (substring),
``expect_any`` (any of several substrings) or ``expect_regex`` waits until the text received
since the previous match contains it, up to the step's ``timeout_ms`` (default: what is left of
the step's ``timeout_ms``, default 10 s, bounded by the node deadline). The step passes when the
connection opens and every expectation is met. A refused connection or failed handshake fails
the step as unreachable. The exchange (``received`` messages, ``text``) becomes the last
document, so a following P07 can assert on it.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from saasbench.dag import note, warn
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives import container
from saasbench.primitives.browser_steps import _alias, scoped
from saasbench.primitives.integrations import Trigger, fire
from saasbench.primitives.registry import primitive, rename_aliases
from saasbench.services import saferegex
from saasbench.services.browser import allowed_hosts_for, url_allowed

MAX_MESSAGES = 500
MAX_TEXT = 200_000  # chars of received text kept (and searched)
EVIDENCE_CHARS = 400  # per message in the evidence transcript
_STEP_KEYS = frozenset(
    {
        "send",
        "expect",
        "expect_any",
        "expect_regex",
        "timeout_ms",
        "description",
        "comment",
        "name",
        "expect_json",
        "expect_json_keys",
        "within_first",
        "expect_any_message",
        "http",
    }
)
FIRST_EVENTS = 3  # 'expect_first_event': the event must be among the first N messages (the reference reads events[:3])


def _normalise_exchange(raw: Any, where: str | None) -> Any:
    """One exchange step in any spelling -> {send, expect, expect_any, expect_regex, timeout_ms}."""
    if not isinstance(raw, dict):
        return raw
    data = dict(raw)
    at, say = scoped(where)
    _alias(data, "send", ("message", "payload", "data", "send_text"), say)
    _alias(data, "expect", ("expect_contains", "receive", "expected", "contains", "wait_for"), say)
    _alias(data, "expect_any", ("expect_any_of", "expect_one_of", "any_of"), say)
    _alias(data, "expect_regex", ("expect_pattern", "regex", "pattern"), say)
    if isinstance(data.get("send"), (dict, list)):
        data["send"] = json.dumps(data["send"])
        say("'send' given as a JSON value -> its JSON text")
    if isinstance(data.get("expect_json_keys"), str):
        data["expect_json_keys"] = [data["expect_json_keys"]]
    message = data.pop("expect_message", None)
    if isinstance(message, dict):
        say("'expect_message {timeout_ms, match}' -> an expectation step")
        if "timeout_ms" in message and "timeout_ms" not in data:
            data["timeout_ms"] = message["timeout_ms"]
        match = message.get("match", {k: v for k, v in message.items() if k != "timeout_ms"})
        for key, value in match.items() if isinstance(match, dict) else []:
            if key in ("content_contains", "contains", "text", "content"):
                data.setdefault("expect", value)
            elif key in ("content_regex", "regex", "matches", "pattern"):
                data.setdefault("expect_regex", value)
            elif key in ("content_any", "any_of", "contains_any"):
                data.setdefault("expect_any", value)
            else:
                warn(f"WebSocket match key {key!r} not understood (ignored)", at(f"expect_message.match.{key}"))
    elif message is not None:
        data.setdefault("expect", message)
        say("'expect_message: <text>' -> 'expect'")
    if isinstance(data.get("expect_any"), str):
        data["expect_any"] = [data["expect_any"]]
    if isinstance(data.get("expect"), list):
        data["expect_any"] = data.pop("expect")
        say("'expect' given as a list -> 'expect_any'")
    for key in ("timeout", "wait_ms"):
        if key in data and "timeout_ms" not in data:
            data["timeout_ms"] = data.pop(key)
            say(f"'{key}' -> 'timeout_ms' (milliseconds)")
    for key in [k for k in data if k not in _STEP_KEYS]:
        warn(f"WebSocket step key {key!r} not understood (ignored)", at(key))
        data.pop(key)
    return data


class WsStep(BaseModel):
    """Send a text message and/or wait for text from the app."""

    model_config = ConfigDict(extra="allow")

    send: str | None = Field(default=None, description="Text message to send")
    expect: str | None = Field(default=None, description="Wait until the received text contains this")
    expect_any: list[str] | None = Field(default=None, description="Wait until the received text contains one of these")
    expect_regex: str | None = Field(default=None, description="Wait until the received text matches this regex")
    timeout_ms: float | None = Field(default=None, gt=0, description="How long this expectation may wait")
    expect_json: dict[str, Any] | None = Field(
        default=None,
        description="Wait for a message that parses as a JSON "
        "object containing these values (nested objects match as subsets)",
    )
    expect_json_keys: list[str] | None = Field(
        default=None, description="Dotted paths that must exist in that JSON message (e.g. data.post)"
    )
    within_first: int | None = Field(
        default=None, ge=1, description="The JSON message must be among the first N messages received on the connection"
    )
    expect_any_message: bool = Field(default=False, description="Wait until the app has sent at least one message")
    http: Trigger | None = Field(
        default=None,
        description="Send this HTTP request (as the active identity, like a P24 "
        "trigger) at this point of the exchange; its response becomes the last response",
    )
    description: str | None = None
    comment: str | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return _normalise_exchange(data, None)

    @model_validator(mode="after")
    def _valid(self) -> WsStep:
        if self.expect_regex is not None:
            try:
                saferegex.validate(self.expect_regex, re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"invalid expect_regex {self.expect_regex!r}: {exc}") from exc
        return self

    def expects(self) -> bool:
        return bool(self.expect or self.expect_any or self.expect_regex) or self.expects_json()

    def expects_text(self) -> bool:
        return bool(self.expect or self.expect_any or self.expect_regex)

    def expects_json(self) -> bool:
        return self.expect_json is not None or bool(self.expect_json_keys) or self.expect_any_message

    def describe(self) -> Any:
        if self.expects_text():
            return self.expect or self.expect_any or self.expect_regex
        if self.expect_any_message:
            return "any message"
        wanted: dict[str, Any] = {"json": self.expect_json or {}}
        if self.expect_json_keys:
            wanted["keys"] = self.expect_json_keys
        if self.within_first:
            wanted["within_first"] = self.within_first
        return wanted


_EVENT_KEYS = ("expect_first_event", "expect_event", "expect_response", "trigger_after_connect")


def _event_match(spec: Any, where: str) -> tuple[dict[str, Any], list[str]]:
    """``{event, seq, broadcast_channel_id, data_keys_required}`` -> (expect_json, expect_json_keys)."""
    if isinstance(spec, str):
        return {"event": spec}, []
    if not isinstance(spec, dict):
        warn(f"{where} {spec!r} is not an object {{event, ...}} (ignored)", where)
        return {}, []
    match: dict[str, Any] = {}
    keys: list[str] = []
    for key, value in spec.items():
        if key in ("event", "seq", "status", "seq_reply", "action"):
            match[key] = value
        elif key == "broadcast_channel_id":
            match.setdefault("broadcast", {})["channel_id"] = value
        elif key == "data" and isinstance(value, dict):
            match["data"] = value
        elif key == "data_keys_required" and isinstance(value, list):
            keys += [f"data.{k}" for k in value]
        else:
            warn(f"WebSocket event key {key!r} not understood (ignored)", f"{where}.{key}")
    return match, keys


def _event_dialect(data: dict[str, Any]) -> list[dict[str, Any]]:
    """sgdoserd's JSON-event form (module docstring) -> exchange steps; pops the keys it reads."""
    present = {k: data.pop(k) for k in _EVENT_KEYS if k in data}
    sends = data.get("send")
    if not present and not isinstance(sends, list) and not isinstance(sends, dict):
        return []
    if "auth_via" in data:
        via = data.pop("auth_via")
        if via in ("session", "token", "bearer", "cookie", "header"):
            note(f"'auth_via: {via}': the active identity's headers and cookies go with the handshake")
        else:
            warn(
                f"auth_via {via!r} not understood (ignored): the active identity's headers and cookies go with the handshake",
                "auth_via",
            )
    steps: list[dict[str, Any]] = []
    if "expect_first_event" in present:
        match, keys = _event_match(present["expect_first_event"], "expect_first_event")
        steps.append(
            {"expect_json": match, "within_first": FIRST_EVENTS, **({"expect_json_keys": keys} if keys else {})}
        )
        note(f"'expect_first_event' -> a received JSON message with {match} among the first {FIRST_EVENTS}")
    if sends is not None:
        data.pop("send")
        messages = sends if isinstance(sends, list) else [sends]
        steps += [{"send": m} for m in messages]
        note(f"'send' ({len(messages)} message(s)) -> one exchange step per message, objects sent as JSON text")
    if "expect_response" in present:
        match, keys = _event_match(present["expect_response"], "expect_response")
        steps.append({"expect_json": match, **({"expect_json_keys": keys} if keys else {})})
        note(f"'expect_response' -> a received JSON message with {match}")
    if "trigger_after_connect" in present:
        trigger = present["trigger_after_connect"]
        call = trigger.get("http_call", trigger) if isinstance(trigger, dict) else trigger
        if isinstance(call, dict):
            steps.append({"http": {"type": "http", **call}})
            note("'trigger_after_connect.http_call' -> an HTTP request sent while the WebSocket is open")
        else:
            warn(
                f"trigger_after_connect {trigger!r} is not {{http_call: {{method, path, body}}}} (ignored)",
                "trigger_after_connect",
            )
    if "expect_event" in present:
        match, keys = _event_match(present["expect_event"], "expect_event")
        steps.append({"expect_json": match, **({"expect_json_keys": keys} if keys else {})})
        note(f"'expect_event' -> a received JSON message with {match}" + (f" and keys {keys}" if keys else ""))
    if not any("expect_json" in st or "expect_json_keys" in st for st in steps):
        steps.insert(0, {"expect_any_message": True})
        note("no expected event: the app must send at least one message (the reference passes on any event)")
    return steps


class P21Inputs(container.P21Inputs):
    """The log check's inputs, plus the WebSocket dialect (selected by ``url``)."""

    pattern: str | None = Field(  # type: ignore[assignment]  # optional here: the WebSocket dialect has none
        default=None,
        description="Log check: text to find (contains/icontains) or a Python "
        "regex (regex). Required unless 'url' is given",
    )
    url: str | None = Field(
        default=None,
        description="WebSocket dialect: ws(s):// URL of the app (relative URLs are joined to the base URL)",
    )
    subprotocol: list[str] | None = Field(default=None, description="WebSocket subprotocol(s) to request, e.g. 'xmpp'")
    steps: list[WsStep] = Field(default_factory=list, description="WebSocket dialect: the exchange, in order")
    timeout_ms: float = Field(
        default=10000,
        gt=0,
        description="WebSocket dialect: budget for the whole exchange (bounded by the node deadline)",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="WebSocket dialect: extra handshake headers")
    expect_connected: bool = Field(
        default=True,
        description="WebSocket dialect: false = the app must refuse the "
        "handshake (it answers, but does not open a WebSocket)",
    )

    @model_validator(mode="before")
    @classmethod
    def _ws_dialect(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "url", ("ws_url", "websocket_url", "endpoint"))
        if not data.get("url") and not any(k in data for k in ("pattern", "contains", "regex")):
            # egsszeqg: {"path": "/runners/_ws", "expect_connected": false}: no log pattern, so a WebSocket path
            for key in ("path", "log_path"):
                if isinstance(data.get(key), str) and ("expect_connected" in data or data[key].startswith("/")):
                    data["url"] = data.pop(key)
                    note(f"'{key}' without a log pattern -> WebSocket 'url' (relative to the base URL)")
                    break
        if not data.get("url"):
            return data
        rename_aliases(data, "subprotocol", ("subprotocols", "protocol", "protocols"))
        if isinstance(data.get("subprotocol"), str):
            data["subprotocol"] = [data["subprotocol"]]
        for key in ("timeout", "timeout_s"):
            if key in data and "timeout_ms" not in data:
                value = data.pop(key)
                data["timeout_ms"] = (
                    value * 1000 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
                )
                note(f"'{key}' (seconds) -> 'timeout_ms'")
        events = _event_dialect(data)
        first = {
            k: data.pop(k)
            for k in ("send", "expect", "expect_any", "expect_regex", "expect_message", "expect_contains")
            if k in data
        }
        steps = data.get("steps") or []
        if first:
            steps = [first, *steps] if isinstance(steps, list) else [first]
            note("top-level 'send'/'expect_message' -> steps[0] of the WebSocket exchange")
        if events:
            steps = [*steps, *events] if isinstance(steps, list) else events
        if isinstance(steps, list):
            data["steps"] = [_normalise_exchange(s, f"steps[{i}]") for i, s in enumerate(steps)]
        return data

    @model_validator(mode="after")
    def _one_dialect(self) -> P21Inputs:
        if self.url is None and self.pattern is None:
            raise ValueError("P21 needs 'pattern' (log check) or 'url' (WebSocket exchange)")
        if self.url is not None:
            scheme = urlsplit(self.url).scheme.lower() if "://" in self.url else ""
            if scheme not in ("", "ws", "wss", "http", "https") and "{{" not in self.url and "${" not in self.url:
                raise ValueError(f"WebSocket url must be ws(s)://, http(s):// or relative, got {self.url!r}")
        return self


def _ws_url(ctx: RunContext, url: str) -> str:
    """Relative -> joined to the base URL; http(s) -> ws(s)."""
    url = url.strip()
    if "://" not in url:
        base = ctx.target.base_url or ctx.vars.get("base_url") or ""
        url = urljoin(str(base).rstrip("/") + "/", url.lstrip("/"))
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme.lower(), parts.scheme.lower())
    return urlunsplit((scheme, parts.netloc, parts.path or "/", parts.query, ""))


def _short(text: str, n: int = EVIDENCE_CHARS) -> str:
    return text if len(text) <= n else text[:n] + f"...(+{len(text) - n} chars)"


def _find(buffer: str, step: WsStep) -> tuple[int, str] | None:
    """End offset of the earliest match of the step's expectation in ``buffer``, and what matched."""
    hits: list[tuple[int, str]] = []
    for needle in ([step.expect] if step.expect else []) + list(step.expect_any or []):
        at = buffer.find(needle)
        if at >= 0:
            hits.append((at, needle))
    if step.expect_regex:
        # the app's messages, a DAG pattern: bounded by the node deadline (RegexTimeout)
        m = saferegex.search(step.expect_regex, buffer, re.MULTILINE, what="the WebSocket messages")
        if m:
            hits.append((m.start(), m.group(0)))
    if not hits:
        return None
    at, what = min(hits)
    return at + len(what), what


def _json_contains(actual: Any, expected: Any) -> bool:
    """``expected`` holds in ``actual``: objects as subsets (recursively), anything else equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _json_contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return actual == expected


def _has_path(value: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _find_json(received: list[str], start: int, step: WsStep) -> int | None:
    """Index of the first message from ``start`` that satisfies the step's JSON expectation."""
    limit = len(received) if step.within_first is None else min(len(received), step.within_first)
    for index in range(start, limit):
        if step.expect_any_message and step.expect_json is None and not step.expect_json_keys:
            return index
        try:
            message = json.loads(received[index])
        except ValueError:
            continue
        if step.expect_json is not None and not _json_contains(message, step.expect_json):
            continue
        if all(_has_path(message, p) for p in step.expect_json_keys or []):
            return index
    return None


def _cookie_header(identity: Any, url: str) -> str | None:
    """The identity's cookies for the URL's host as one ``Cookie`` header value."""
    jar = getattr(getattr(identity, "cookies", None), "jar", None)
    if not jar:
        return None
    host = (urlsplit(url).hostname or "").lower()
    pairs = [
        f"{c.name}={c.value}"
        for c in jar
        if not c.domain
        or host == c.domain.lstrip(".").lower()
        or host.endswith("." + c.domain.lstrip(".").lower())
        or c.domain.lower() in ("localhost", "localhost.local")
    ]
    return "; ".join(pairs) or None


def websocket_exchange(inputs: P21Inputs, ctx: RunContext) -> StepResult:
    """Connect, run the exchange, pass when every expectation is met."""
    try:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
        from websockets.sync.client import connect
        from websockets.typing import Subprotocol
    except ImportError as exc:  # an environment problem: ERROR, with the fix
        raise RuntimeError("P21's WebSocket dialect needs the 'websockets' package (pip install websockets)") from exc
    url = _ws_url(ctx, inputs.url or "")
    base = ctx.target.base_url or ctx.vars.get("base_url")
    allowed = allowed_hosts_for(base, url)
    if not url_allowed(url, allowed):
        return StepResult(
            passed=False,
            message=f"refusing to connect to {url!r}: host {urlsplit(url).hostname!r} is not "
            f"the app's host ({', '.join(sorted(allowed))})",
        )
    budget = ctx.timeout(inputs.timeout_ms / 1000)
    end = time.monotonic() + budget
    headers = dict(inputs.headers)
    identity = getattr(getattr(ctx, "auth", None), "active", None)
    if identity is not None and getattr(identity, "headers", None):
        headers = {**identity.headers, **headers}
    cookie = _cookie_header(identity, url)
    if cookie and not any(k.lower() == "cookie" for k in headers):
        headers["Cookie"] = cookie  # a session-cookie identity (the handshake is an HTTP request of its own)
    transcript: list[dict[str, str]] = []
    received: list[str] = []
    results: list[dict[str, Any]] = []
    evidence: dict[str, Any] = {
        "url": url,
        "subprotocol": inputs.subprotocol,
        "steps": results,
        "transcript": transcript,
    }

    def finish(passed: bool, message: str, *, unreachable: bool = False) -> StepResult:
        document = {"url": url, "received": received, "text": "".join(received), "passed": passed}
        ctx.last_document = document
        return StepResult(passed=passed, unreachable=unreachable, message=message, value=document, evidence=evidence)

    try:
        ws = connect(
            url,
            subprotocols=[Subprotocol(p) for p in inputs.subprotocol or []] or None,
            additional_headers=headers or None,
            open_timeout=max(0.1, min(10.0, end - time.monotonic())),
            close_timeout=0.5,  # closing after the deadline stays within its 1 s grace
            proxy=None,
            max_size=2**20,
            compression=None,
        )
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        no_server = isinstance(exc, (OSError, TimeoutError))
        if not inputs.expect_connected and not no_server:  # the app answered and refused the upgrade, as required
            return finish(True, f"WebSocket {url} did not open, as expected: {type(exc).__name__}: {detail}")
        return finish(False, f"WebSocket {url} did not open: {type(exc).__name__}: {detail}", unreachable=no_server)
    if not inputs.expect_connected:
        ws.close()
        return finish(False, f"WebSocket {url} opened; expected the app to refuse it (expect_connected: false)")
    evidence["negotiated_subprotocol"] = ws.subprotocol
    buffer = ""
    total = 0
    json_from = 0  # JSON expectations look at messages after the previous JSON match
    try:
        for index, step in enumerate(inputs.steps):
            row: dict[str, Any] = {"index": index}
            results.append(row)
            if step.send is not None:
                ws.send(step.send)
                transcript.append({"sent": _short(step.send)})
            if step.http is not None:
                error, fired, unreachable = fire(ctx, step.http, resolve=False)  # the engine resolved the inputs
                row["http"] = fired[0] if fired else None
                transcript.append(
                    {
                        "http": f"{step.http.method} {step.http.path}"
                        + (f" -> {fired[0].get('status')}" if fired and "status" in fired[0] else "")
                    }
                )
                if error:
                    row["passed"] = False
                    return finish(False, f"step {index}: {error}", unreachable=unreachable)
            if not step.expects():
                row["passed"] = True
                continue
            wanted = step.describe()
            row["expect"] = wanted
            step_end = min(end, time.monotonic() + step.timeout_ms / 1000) if step.timeout_ms else end
            while True:
                hit = _find(buffer, step) if step.expects_text() else (0, "")
                found = _find_json(received, json_from, step) if step.expects_json() else None
                if hit is not None and (found is not None or not step.expects_json()):
                    if step.expects_text():
                        buffer = buffer[hit[0] :]
                    matched = hit[1] if step.expects_text() or found is None else _short(received[found])
                    row.update(passed=True, matched=matched)
                    if found is not None:
                        json_from = found + 1
                    break
                left = step_end - time.monotonic()
                too_late = step.within_first is not None and len(received) >= step.within_first
                if left <= 0 or too_late or len(received) >= MAX_MESSAGES or total >= MAX_TEXT:
                    row.update(passed=False)
                    seen = _short(buffer[-EVIDENCE_CHARS:]) if buffer else "nothing"
                    if step.expects_json() and not step.expects_text():
                        where = f" among the first {step.within_first} messages" if step.within_first else ""
                        return finish(
                            False,
                            f"step {index}: no message matching {_short(json.dumps(wanted, default=str))} "
                            f"received{where} within {(step.timeout_ms or inputs.timeout_ms) / 1000:g}s "
                            f"({len(received)} message(s) received; last: {_short(received[-1]) if received else 'none'!r})",
                        )
                    return finish(
                        False,
                        f"step {index}: {wanted!r} not received within "
                        f"{(step.timeout_ms or inputs.timeout_ms) / 1000:g}s (unmatched text: {seen!r})",
                    )
                try:
                    message = ws.recv(timeout=left)
                except TimeoutError:
                    continue
                text = message.decode("utf-8", errors="replace") if isinstance(message, bytes) else str(message)
                text = text[: max(0, MAX_TEXT - total)]
                total += len(text)
                received.append(text)
                buffer += text
                transcript.append({"received": _short(text)})
    except ConnectionClosed as exc:
        if results:
            results[-1].setdefault("passed", False)
        rcvd = getattr(exc, "rcvd", None)
        reason = f"{rcvd.code} {rcvd.reason}".strip() if rcvd else "no close frame"
        return finish(False, f"step {len(results) - 1}: the app closed the WebSocket ({reason})")
    finally:
        try:
            ws.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
    met = sum(1 for r in results if r.get("passed"))
    return finish(
        True,
        f"WebSocket {url}: connected, {met}/{len(results)} exchange step(s) done, {len(received)} message(s) received",
    )


@primitive(
    "P21",
    P21Inputs,
    description="A log in the app's environment contains a pattern; with 'url', a scripted "
    "WebSocket exchange with the app (send / expect)",
)
def log_content_or_websocket(inputs: P21Inputs, ctx: RunContext) -> StepResult:
    """P21: the WebSocket dialect when a ``url`` is given, else the log check of primitives/container.py."""
    if inputs.url is not None:
        return websocket_exchange(inputs, ctx)
    return container.log_content_check(inputs, ctx)
