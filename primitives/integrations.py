"""Integration primitives: P24 queue_job_check, P27 webhook_delivery, P28 email_check, P_INGEST event_ingest,
and P30 totp_code (a TOTP code for an MFA flow, as task_sgdoserd's reference defines it).

Each fires a *trigger* (an HTTP request to the app, or a command in the app's environment),
then waits, bounded by the step's own limit and by the node deadline (``ctx.timeout()``), for an
effect: a background job's row (SQL) or API state, a webhook delivery, an email, ingested events.

Triggers (``trigger``: one object or a list, run in order)::

    {type: http, method: POST, path, body, headers, skip_auth, expect_status, timeout}
    {type: exec, command, expect_exit_code: 0, timeout}

An HTTP trigger is sent as the active identity (``headers`` given, even ``{}``, or ``skip_auth``
sends none, as in P04); its response becomes the last response. Without ``expect_status`` any
response is accepted and its status is reported when the check fails (the reference harness
did not look at it either). An exec trigger runs through the environment backend like P12 and
must exit with ``expect_exit_code`` (``null``: any). Legacy: ``type: rails_runner`` (family A)
runs ``bin/rails runner '<command>'``; ``cmd``/``script`` -> ``command``; ``url``/``endpoint`` -> ``path``.

Verification (``verify``, P24 and P_INGEST)::

    {strategy: db_query, sql, expected_result, max_wait_ms}
    {strategy: http, method: GET, path, body, headers, expect_status, assertions: [P07 assertion], max_wait_ms, interval_ms}

The shorthand ``{db: {sql, expected_result}}`` / ``{http: {path, assertions}}`` is the same. SQL is
checked by P08's code (``db_check``): placeholders are bound as parameters, every P08 expectation
dialect works, and the query is re-run until it holds. ``http`` polls the endpoint until the status
is as expected (default 2xx) and every P07 assertion holds on the body. Both stop at
``max_wait_ms`` (default 15000) or at the node deadline, whichever comes first.

Receivers (P27, P28) come from :mod:`saasbench.services.receivers`: one webhook receiver / SMTP sink per
run on ephemeral ports, started on first use, stopped when the run closes. Their addresses are
the run variables ``{{webhook_url}}`` (``http://host:port/hook``), ``{{webhook_port}}``,
``{{webhook_host}}``, ``{{webhook_base_url}}``, ``{{smtp_host}}``, ``{{smtp_port}}``,
``{{smtp_api_url}}``; the trigger is resolved *after* the receiver has started, so it may use them.
Only deliveries/messages that arrive after the trigger fired count (without a trigger: any since
the receiver started), so a node cannot pass on an earlier node's delivery.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from saasbench.dag import note, warn
from saasbench.dag.placeholders import UnresolvedPlaceholder
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.assertions import UNARY, Assertion, Doc, check, short
from saasbench.primitives.db import db_check
from saasbench.primitives.http import (
    HttpFields,
    Statuses,
    _method,
    excerpt,
    response_evidence,
    send,
)
from saasbench.primitives.registry import REGISTRY, PrimitiveInputs, primitive, rename_aliases
from saasbench.services.receivers import (
    Delivery,
    MailMessage,
    ensure_smtp_sink,
    ensure_webhook_receiver,
    parse_message,
)

DEFAULT_WAIT_MS = 15000
EVIDENCE_ITEMS = 10
EVIDENCE_BODY_CHARS = 500
REMOTE_POLL_S = 0.25  # polling a remote API (a task's mock-receiver or MailHog): it cannot notify us
NO_ENVIRONMENT = (
    "no environment: an exec trigger needs an exec target (pass --exec local:DIR or --exec docker:CONTAINER) "
    "or an environment backend (a trial)"
)


# --- triggers -------------------------------------------------------------------------------------
class Trigger(HttpFields):
    type: Literal["http", "exec"] = Field(
        default="http", description="http (a request to the app) or exec (a command in its environment)"
    )
    method: str = Field(default="POST", description="http: HTTP method")
    path: str | None = Field(default=None, description="http: path relative to the base URL, or an absolute URL")
    body: Any = Field(default=None, description="http: body (dict/list -> JSON, str verbatim), as in P04")
    headers: dict[str, str] | None = Field(
        default=None, description="http: headers; when given the identity's auth is not sent (as in P04)"
    )
    skip_auth: bool = Field(default=False, description="http: send no auth headers and no cookies")
    expect_status: Statuses = Field(
        default_factory=list, description="http: status code(s) the trigger must get (default: any response)"
    )
    command: str | None = Field(default=None, description="exec: shell command, run like P12")
    expect_exit_code: int | None = Field(default=0, description="exec: exit code that passes (null: any)")
    timeout: float | None = Field(
        default=None, gt=0, description="Seconds for the request/command; bounded by the node deadline"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "command", ("cmd", "script", "shell"))
        rename_aliases(data, "path", ("url", "endpoint"))
        rename_aliases(data, "expect_status", ("expected_status", "status"))
        kind = data.get("type")
        if kind is None:
            data["type"] = "exec" if data.get("command") is not None and data.get("path") is None else "http"
        elif isinstance(kind, str):
            lowered = kind.strip().lower()
            if lowered in ("rails_runner", "rails"):
                command = data.get("command")
                if isinstance(command, str) and not command.lstrip().startswith(("bin/rails", "rails ", "bundle ")):
                    data["command"] = f"bin/rails runner {shlex.quote(command)}"
                data["type"] = "exec"
                note("trigger type 'rails_runner' -> exec 'bin/rails runner <command>'")
            elif lowered in ("command", "shell", "cli", "container_exec"):
                data["type"] = "exec"
                note(f"trigger type {kind!r} -> exec")
            elif lowered in ("api", "request", "http_request"):
                data["type"] = "http"
                note(f"trigger type {kind!r} -> http")
            else:
                data["type"] = lowered
        return data

    @model_validator(mode="after")
    def _complete(self) -> Trigger:
        if self.type == "http" and not self.path:
            raise ValueError("an http trigger needs a path")
        if self.type == "exec" and not self.command:
            raise ValueError("an exec trigger needs a command")
        return self


Triggers = Trigger | list[Trigger] | None


def _trigger_list(value: Triggers) -> list[Trigger]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def fire(ctx: RunContext, triggers: Triggers, *, resolve: bool = True) -> tuple[str | None, list[dict[str, Any]], bool]:
    """Fire trigger(s) in order: (error or None, evidence per trigger, unreachable).

    ``resolve``: the triggers were validated with their placeholders unresolved (a raw field);
    resolve them now (after the receiver seeded its variables) and validate again.
    """
    evidence: list[dict[str, Any]] = []
    for trigger in _trigger_list(triggers):
        if resolve:
            try:
                raw = trigger.model_dump(exclude_unset=True)
                command = raw.pop("command", None)
                resolved = ctx.resolve(raw)
                if isinstance(command, str):  # quoted for the shell, as P12's (never pasted as shell syntax)
                    resolved["command"] = ctx.resolve_command(command)
                trigger = Trigger.model_validate(resolved)
            except UnresolvedPlaceholder as exc:  # UnsafeShellValue too
                return f"trigger: {exc}", evidence, False
            except ValueError as exc:
                return f"trigger invalid after placeholder resolution: {exc}", evidence, False
        error, ev, unreachable = _fire_one(ctx, trigger)
        evidence.append(ev)
        if error:
            return error, evidence, unreachable
    return None, evidence, False


def _fire_one(ctx: RunContext, t: Trigger) -> tuple[str | None, dict[str, Any], bool]:
    if t.type == "exec":
        env = getattr(ctx.target, "exec_target", None) or getattr(ctx.target, "environment", None)
        if env is None:
            return NO_ENVIRONMENT, {"type": "exec", "command": t.command}, False
        timeout = ctx.timeout(t.timeout or 120.0)
        result = env.exec(t.command, timeout_s=timeout, env=getattr(ctx.target, "exec_env", None) or None)
        ev = {
            "type": "exec",
            "command": t.command,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stdout": result.stdout[-1000:],
            "stderr": result.stderr[-1000:],
        }
        if result.timed_out:
            return f"trigger command timed out after {timeout:g}s", ev, False
        if t.expect_exit_code is not None and result.exit_code != t.expect_exit_code:
            last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
            hint = f" (last output line: {last[0][:200]!r})" if last else ""
            return f"trigger command exited {result.exit_code}, expected {t.expect_exit_code}{hint}", ev, False
        return None, ev, False
    plain = t.skip_auth or t.headers is not None
    sent = send(
        ctx,
        t.method,
        t.path or "",
        body=t.body,
        headers=t.headers,
        identity=None if plain else ctx.auth.active,
        timeout_s=t.timeout,
    )
    ev = {"type": "http", **response_evidence(sent)}
    if sent.response is None:
        ctx.clear_response()
        return f"trigger {t.method} {t.path}: {sent.error or 'no response'}", ev, sent.unreachable
    ctx.set_response(sent.response)
    if t.expect_status and sent.response.status not in t.expect_status:
        return (
            (
                f"trigger {t.method} {t.path} -> {sent.response.status}, expected {sorted(t.expect_status)}; "
                f"body: {excerpt(sent.response.text, 300)}"
            ),
            ev,
            False,
        )
    return None, ev, False


def _trigger_note(evidence: list[dict[str, Any]]) -> str:
    """' (trigger POST /x -> 500)' to explain a failed wait."""
    parts = [
        f"{e.get('method')} {e.get('url')} -> {e.get('status')}"
        for e in evidence
        if e.get("type") == "http" and "status" in e
    ]
    return f" (trigger {'; '.join(parts)})" if parts else ""


def _wait_s(ctx: RunContext, ms: float | None) -> float:
    wanted = (ms if ms is not None else DEFAULT_WAIT_MS) / 1000
    return max(0.0, min(wanted, ctx.remaining()))


# --- verification (P24, P_INGEST) ------------------------------------------------------------------
_STRATEGIES = {
    "db_query": "db_query",
    "db": "db_query",
    "sql": "db_query",
    "database": "db_query",
    "query": "db_query",
    "http": "http",
    "api": "http",
    "http_poll": "http",
    "poll": "http",
    "api_query": "http",
    "http_request": "http",
}


class Verify(HttpFields):
    strategy: Literal["db_query", "http"] = Field(
        description="db_query: poll SQL; http: poll an endpoint with P07 assertions"
    )
    sql: Any = Field(
        default=None, description="db_query: SQL (or a MongoDB query); placeholders are bound as parameters"
    )
    expected_result: Any = Field(
        default=None, description="db_query: any P08 expectation (absent: a SELECT returns rows)"
    )
    method: str = Field(default="GET", description="http: method")
    path: str | None = Field(default=None, description="http: path or absolute URL")
    body: Any = Field(default=None, description="http: request body (e.g. an analytics query)")
    headers: dict[str, str] | None = Field(
        default=None, description="http: headers; when given, the identity's auth is not sent"
    )
    skip_auth: bool = Field(default=False, description="http: send no auth")
    expect_status: Statuses = Field(default_factory=list, description="http: status code(s) (default 2xx)")
    assertions: list[dict[str, Any]] = Field(
        default_factory=list, description="http: P07 assertions on the body; all must hold"
    )
    max_wait_ms: int | None = Field(
        default=None, ge=0, description="Poll this long (default: the step's max_wait_ms, 15000)"
    )
    interval_ms: int = Field(default=500, ge=10, description="http: pause between polls")

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, strategy in (("db", "db_query"), ("http", "http")):
            inner = data.get(key)
            if isinstance(inner, dict) and "strategy" not in data:
                data.pop(key)
                data = {**inner, **data, "strategy": strategy}
        rename_aliases(data, "sql", ("query", "db_query"))
        rename_aliases(data, "expected_result", ("expected",))
        rename_aliases(data, "path", ("url", "endpoint"))
        rename_aliases(data, "max_wait_ms", ("timeout_ms", "wait_ms"))
        strategy = data.get("strategy")
        if strategy is None:
            data["strategy"] = "db_query" if data.get("sql") is not None else "http"
        elif isinstance(strategy, str) and strategy.strip().lower() in _STRATEGIES:
            canon = _STRATEGIES[strategy.strip().lower()]
            if canon != strategy:
                note(f"verify strategy {strategy!r} -> {canon!r}")
            data["strategy"] = canon
        if isinstance(data.get("assertions"), dict):
            data["assertions"] = [data["assertions"]]
        return data

    @model_validator(mode="after")
    def _complete(self) -> Verify:
        if self.strategy == "db_query" and (self.sql is None or (isinstance(self.sql, str) and not self.sql.strip())):
            raise ValueError("verify db_query needs sql")
        if self.strategy == "http":
            if not self.path:
                raise ValueError("verify http needs a path")
            for a in self.assertions:
                Assertion.model_validate(a)  # load-time check; resolved and parsed again when run
        return self


def run_verify(ctx: RunContext, verify: Verify, default_wait_ms: int) -> StepResult:
    """Poll the verification until it holds or the wait (bounded by the node deadline) is over."""
    wait_ms = verify.max_wait_ms if verify.max_wait_ms is not None else default_wait_ms
    if verify.strategy == "db_query":
        retry_ms = int(_wait_s(ctx, wait_ms) * 1000)
        expected = verify.expected_result if "expected_result" in verify.model_fields_set else None
        if expected is None:
            result = db_check(ctx, verify.sql, retry_ms=retry_ms)
        else:
            result = db_check(ctx, verify.sql, expected, retry_ms=retry_ms)
        result.evidence = {"strategy": "db_query", "max_wait_ms": wait_ms, **result.evidence}
        return result
    return _poll_http(ctx, verify, wait_ms)


def _poll_http(ctx: RunContext, v: Verify, wait_ms: int) -> StepResult:
    try:
        path = ctx.resolve(v.path)
        headers = ctx.resolve(v.headers) if v.headers is not None else None
        body = ctx.resolve(v.body)
        assertions = [Assertion.model_validate(ctx.resolve(a)) for a in v.assertions]
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, message=f"verify: {exc}", evidence={"placeholder": exc.placeholder})
    except ValueError as exc:
        return StepResult(passed=False, message=f"verify invalid after placeholder resolution: {exc}")
    deadline = time.monotonic() + _wait_s(ctx, wait_ms)
    plain = v.skip_auth or headers is not None
    attempts = 0
    last_problem = "not polled"
    last_ev: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    while True:
        attempts += 1
        sent = send(
            ctx,
            v.method,
            str(path),
            body=body,
            headers=headers,
            identity=None if plain else ctx.auth.active,
            timeout_s=_request_timeout(deadline),
        )
        last_ev = response_evidence(sent)
        problem: str | None
        if sent.response is None:
            problem = sent.error or "no response"
        else:
            ctx.set_response(sent.response)
            r = sent.response
            ok_status = r.status in v.expect_status if v.expect_status else 200 <= r.status < 300
            if not ok_status:
                problem = f"status {r.status}, expected {sorted(v.expect_status) or '2xx'}"
                rows = []
            else:
                doc = Doc(r.body, r.headers, r.text, f"body of {r.method} {r.url}")
                rows, failures = _assert_all(ctx, assertions, doc)
                problem = "; ".join(failures) if failures else None
        if problem is None:
            return StepResult(
                passed=True,
                value=ctx.last_document,
                message=f"verify {v.method} {path}: {len(assertions)} assertion(s) held after {attempts} poll(s)",
                evidence={"strategy": "http", "attempts": attempts, "assertions": rows, "last": last_ev},
            )
        last_problem = problem
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(v.interval_ms / 1000, remaining))
    return StepResult(
        passed=False,
        unreachable=sent.response is None and sent.unreachable,
        message=f"verify {v.method} {path}: not satisfied within {wait_ms} ms ({attempts} polls): {last_problem}",
        evidence={"strategy": "http", "attempts": attempts, "assertions": rows, "last": last_ev},
    )


def _request_timeout(deadline: float) -> float:
    """One poll request may take what is left of the wait, but at least a second."""
    return max(1.0, deadline - time.monotonic())


def _assert_all(ctx: RunContext, assertions: list[Assertion], doc: Doc) -> tuple[list[dict[str, Any]], list[str]]:
    from saasbench.dag.jsonpath import ABSENT, PathError

    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for a in assertions:
        try:
            value = doc.get(a.path)
        except PathError as exc:
            ok, why, value = False, str(exc), ABSENT
        else:
            ok, why = check(a, value, doc)
        if ok and a.save_as and value is not ABSENT:
            ctx.capture(a.save_as, value)
        rows.append({"path": a.path, "op": a.op, "expected": a.expected, "actual": short(value), "passed": ok})
        if not ok:
            what = f"{a.path} {a.op}" + ("" if a.op in UNARY else f" {short(a.expected, 80)}")
            failures.append(f"{what}: actual {short(value)} [{why}]")
    return rows, failures


# --- P24 queue_job_check -------------------------------------------------------------------------
_NOOP_TRIGGERS = frozenset({"noop", "no-op", "no_op", "none", "null", "skip"})


def _is_noop(trigger: Any) -> bool:
    """``{type: noop}`` (and only a type): a trigger that fires nothing."""
    return (
        isinstance(trigger, dict)
        and isinstance(trigger.get("type"), str)
        and trigger["type"].strip().lower() in _NOOP_TRIGGERS
        and not any(k in trigger for k in ("path", "url", "endpoint", "command", "cmd", "script"))
    )


class P24Inputs(PrimitiveInputs):
    trigger: Triggers = Field(
        default=None,
        description="What starts the job: {type: http, method, path, body} or {type: exec, command}; a list runs in order",
    )
    verify: Verify = Field(
        description="{strategy: db_query, sql, expected_result} or {strategy: http, path, assertions}; polled"
    )
    max_wait_ms: int = Field(
        default=DEFAULT_WAIT_MS, ge=0, description="Default polling budget when verify has no max_wait_ms"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "verify" not in data and any(k in data for k in ("sql", "query", "verify_sql")):
            rename_aliases(data, "sql", ("verify_sql", "query"))
            data["verify"] = {k: data.pop(k) for k in ("sql", "expected_result", "expected") if k in data}
            note("top-level sql/expected_result -> verify {strategy: db_query}")
        trigger = data.get("trigger")
        if _is_noop(trigger):
            # ididetxj: {"trigger": {"type": "noop"}, "verify": {...}}: earlier steps started the job; its
            # reference fires only 'http' triggers, so the step only polls
            data["trigger"] = None
            note(f"trigger type {trigger.get('type')!r}: nothing to fire, the step only polls 'verify'")
        elif isinstance(trigger, list) and any(_is_noop(t) for t in trigger):
            data["trigger"] = [t for t in trigger if not _is_noop(t)] or None
            note("no-op trigger(s) dropped from the trigger list")
        return data


@primitive(
    "P24", P24Inputs, raw_fields={"trigger", "verify", "sql", "query", "verify_sql", "expected_result", "expected"}
)
def queue_job_check(inputs: P24Inputs, ctx: RunContext) -> StepResult:
    """Fire the trigger, then poll (SQL or HTTP) until the background job's effect is visible."""
    error, trig_ev, unreachable = fire(ctx, inputs.trigger)  # resolved here: an exec command is quoted
    if error:
        return StepResult(passed=False, unreachable=unreachable, message=error, evidence={"triggers": trig_ev})
    result = run_verify(ctx, inputs.verify, inputs.max_wait_ms)
    result.evidence = {"triggers": trig_ev, "verify": result.evidence}
    prefix = f"{len(trig_ev)} trigger(s) fired; " if trig_ev else ""
    result.message = prefix + result.message + ("" if result.passed else _trigger_note(trig_ev))
    return result


# --- body / header matching (P27) ------------------------------------------------------------------
def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)


def _raw_views(raw: str, parsed: Any) -> list[str]:
    views = [raw]
    if parsed is not None:
        views += [json.dumps(parsed, ensure_ascii=False), json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))]
    return views


def _in_raw(expected: Any, views: list[str]) -> str | None:
    """Legacy rule: every leaf value of ``expected`` is a substring of the body (keys ignored)."""
    if isinstance(expected, dict):
        for v in expected.values():
            why = _in_raw(v, views)
            if why:
                return why
        return None
    if isinstance(expected, list):
        for v in expected:
            why = _in_raw(v, views)
            if why:
                return why
        return None
    needle = _text(expected)
    return None if any(needle in view for view in views) else f"body does not contain {short(needle, 80)}"


def _value_matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, list):
        return all(
            _value_matches(e, actual) or (isinstance(actual, list) and any(_value_matches(e, x) for x in actual))
            for e in expected
        )
    numeric = (int, float)
    if isinstance(expected, (bool, *numeric)) and isinstance(actual, (bool, *numeric)):
        return expected == actual and isinstance(expected, bool) == isinstance(actual, bool)
    return _text(expected) in _text(actual)


_NOWHERE: Any = object()


def _walk(node: Any, key: str) -> Any:
    """``node[key]``, or the value at a dotted path ``a.b.0`` when ``key`` itself is absent."""
    if isinstance(node, Mapping) and key in node:
        return node[key]
    if "." not in key:
        return _NOWHERE
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _NOWHERE
    return node


def _match_keys(expected: Mapping[str, Any], node: Any, views: list[str], where: str) -> str | None:
    """Keys present in the JSON body are matched by path; absent keys fall back to the raw body."""
    for key, want in expected.items():
        label = f"{where}.{key}" if where else str(key)
        actual = _walk(node, str(key))
        if actual is not _NOWHERE:
            if isinstance(want, Mapping):
                why = _match_keys(want, actual, views, label)
                if why:
                    return why
            elif not _value_matches(want, actual):
                return f"{label} is {short(actual, 80)}, expected to contain {short(want, 80)}"
        else:
            why = _in_raw(want, views)
            if why:
                return f"{why} (key {label!r} not in the JSON body)"
    return None


def body_mismatch(expected: Any, raw: str, parsed: Any) -> str | None:
    """Why a body does not satisfy ``body_contains`` (None when it does); see P27Inputs."""
    if expected is None:
        return None
    views = _raw_views(raw, parsed)
    if isinstance(expected, Mapping):
        return _match_keys(expected, parsed, views, "")
    if isinstance(expected, list):
        for item in expected:
            why = body_mismatch(item, raw, parsed)
            if why:
                return why
        return None
    return _in_raw(expected, views)


def headers_mismatch(expected: Mapping[str, Any] | None, headers: Mapping[str, Any]) -> str | None:
    if not expected:
        return None
    lower = {str(k).lower(): _text(v) for k, v in headers.items()}
    for name, want in expected.items():
        actual = lower.get(str(name).lower())
        if actual is None:
            return f"no header {name!r}"
        if want in (None, True, "*", ""):
            continue
        if _text(want) not in actual:
            return f"header {name!r} is {short(actual, 80)}, expected to contain {short(want, 80)}"
    return None


# --- P27 webhook_delivery ---------------------------------------------------------------------------
class DeliveryExpectation(PrimitiveInputs):
    timeout_ms: int = Field(default=DEFAULT_WAIT_MS, ge=0, description="How long to wait for a matching delivery")
    body_contains: Any = Field(
        default=None,
        description="dict: each key found in the JSON body is matched by path (nested dicts recurse) and its value "
        "substring-matched against the text of the value there; a key absent from the body (or a non-JSON body) "
        "falls back to the reference rule: the value must be a substring of the raw body. str or list: substrings of the raw body",
    )
    headers_contain: dict[str, Any] | None = Field(
        default=None, description="name (any case) -> substring of the header value; null/'*' = present"
    )
    method: str | None = Field(default="POST", description="Method of the delivery (null: any)")
    path: str | None = Field(default=None, description="Path prefix the delivery must be sent to (default: any path)")
    count: int = Field(default=1, ge=1, description="At least this many matching deliveries")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "headers_contain", ("headers", "headers_contains", "header_contains"))
        rename_aliases(data, "body_contains", ("contains", "body"))
        if "timeout_s" in data and "timeout_ms" not in data:
            data["timeout_ms"] = int(float(data.pop("timeout_s")) * 1000)
            note("expect_delivery 'timeout_s' -> timeout_ms")
        return data

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str | None:
        return None if value is None or value == "*" else _method(value)


class P27Inputs(PrimitiveInputs):
    source: Literal["receiver", "mock_receiver"] = Field(
        default="receiver",
        description="receiver: the run's own receiver ({{webhook_url}}); mock_receiver: read a task's "
        "mock-receiver service's GET /history at mock_receiver_url",
    )
    receiver: dict[str, Any] | None = Field(
        default=None, description="{path}: the delivery path to require; a legacy fixed port is ignored"
    )
    mock_receiver_url: str | None = Field(
        default=None,
        description="mock_receiver: base URL (or the /history URL) of the service; "
        "default: the run variable mock_receiver_url",
    )
    trigger: Triggers = Field(
        default=None, description="What makes the app deliver; resolved after the receiver started"
    )
    expect_delivery: DeliveryExpectation | None = Field(
        default=None, description="The delivery to wait for (default: any POST)"
    )
    verify_sql: Any = Field(
        default=None, description="SQL that must then hold (placeholders bound), polled like P08 retry_ms"
    )
    verify_expected: Any = Field(default=None, description="P08 expectation of verify_sql (default: >= 1 row)")
    verify_wait_ms: int = Field(default=DEFAULT_WAIT_MS, ge=0, description="How long verify_sql is polled")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        legacy = {
            k: data.pop(k) for k in ("trigger_path", "trigger_method", "trigger_body", "trigger_headers") if k in data
        }
        if legacy and "trigger" not in data:
            data["trigger"] = {k[len("trigger_") :]: v for k, v in legacy.items()}
            note("trigger_path/method/body/headers -> trigger {...}")
        if "wait_seconds" in data:
            seconds = data.pop("wait_seconds")
            if "verify_wait_ms" not in data and not isinstance(seconds, str):
                data["verify_wait_ms"] = int(float(seconds) * 1000)
            note("'wait_seconds' -> verify_wait_ms (polled, not slept)")
        rename_aliases(data, "mock_receiver_url", ("history_url", "mock_url", "receiver_url"))
        rename_aliases(data, "verify_expected", ("verify_expected_result", "expected_result"))
        if isinstance(data.get("source"), str):
            src = data["source"].strip().lower().replace("-", "_")
            data["source"] = {
                "mock": "mock_receiver",
                "history": "mock_receiver",
                "local": "receiver",
                "internal": "receiver",
            }.get(src, src)
        receiver = data.get("receiver")
        if isinstance(receiver, dict):
            if "port" in receiver:
                note("receiver.port ignored: the receiver uses an ephemeral port ({{webhook_port}})")
            if receiver.get("url") and "mock_receiver_url" not in data:
                data["mock_receiver_url"] = receiver["url"]
                data.setdefault("source", "mock_receiver")
        return data

    @model_validator(mode="after")
    def _default_expectation(self) -> P27Inputs:
        if self.expect_delivery is None and self.verify_sql is None:
            self.expect_delivery = DeliveryExpectation()
        return self


P27_RAW = {
    "trigger",
    "trigger_path",
    "trigger_method",
    "trigger_body",
    "trigger_headers",
    "verify_sql",
    "verify_expected",
    "verify_expected_result",
    "expected_result",
}


@primitive("P27", P27Inputs, raw_fields=P27_RAW)
def webhook_delivery(inputs: P27Inputs, ctx: RunContext) -> StepResult:
    """Start the run's receiver, fire the trigger, wait for a matching delivery (and verify_sql)."""
    expect = inputs.expect_delivery
    want_path = expect.path if expect and expect.path else (inputs.receiver or {}).get("path")
    evidence: dict[str, Any] = {"source": inputs.source}
    if inputs.source == "mock_receiver":
        outcome = _mock_receiver_check(inputs, ctx, want_path, evidence)
    else:
        outcome = _receiver_check(inputs, ctx, want_path, evidence)
    if outcome is not None:
        return outcome
    message = evidence.pop("_message", "")
    if inputs.verify_sql is not None:
        if inputs.verify_expected is None:
            checked = db_check(ctx, inputs.verify_sql, retry_ms=int(_wait_s(ctx, inputs.verify_wait_ms) * 1000))
        else:
            checked = db_check(
                ctx, inputs.verify_sql, inputs.verify_expected, retry_ms=int(_wait_s(ctx, inputs.verify_wait_ms) * 1000)
            )
        evidence["verify_sql"] = checked.evidence
        if not checked.passed:
            return StepResult(
                passed=False,
                evidence=evidence,
                message=f"{message + '; ' if message else ''}verify_sql: {checked.message}"
                + _trigger_note(evidence.get("triggers", [])),
            )
        message = f"{message + '; ' if message else ''}verify_sql: {checked.message}"
    return StepResult(passed=True, message=message, evidence=evidence, value=evidence.get("matched"))


def _delivery_check(
    expect: DeliveryExpectation | None,
    want_path: str | None,
    method: str,
    path: str,
    headers: Mapping[str, Any],
    raw: str,
    parsed: Any,
) -> str | None:
    if expect is None:
        return None
    if expect.method and method.upper() != expect.method:
        return f"method {method}, expected {expect.method}"
    if want_path and not path.split("?", 1)[0].startswith(want_path):
        return f"path {path}, expected {want_path}"
    why = headers_mismatch(expect.headers_contain, headers)
    if why:
        return why
    return body_mismatch(expect.body_contains, raw, parsed)


def _receiver_check(
    inputs: P27Inputs, ctx: RunContext, want_path: str | None, evidence: dict[str, Any]
) -> StepResult | None:
    receiver = ensure_webhook_receiver(ctx)
    if want_path:  # {{webhook_url}} points at the path this node requires
        ctx.vars["webhook_url"] = receiver.base_url + "/" + want_path.lstrip("/")
    evidence["receiver_url"] = ctx.vars["webhook_url"]
    baseline = receiver.last_seq if inputs.trigger is not None else 0
    error, trig_ev, unreachable = fire(ctx, inputs.trigger)
    evidence["triggers"] = trig_ev
    if error:
        return StepResult(passed=False, unreachable=unreachable, message=error, evidence=evidence)
    expect = inputs.expect_delivery
    if expect is None:
        return None
    reasons: list[str] = []
    matched: list[Delivery] = []

    def predicate(d: Delivery) -> bool:
        why = _delivery_check(expect, want_path, d.method, d.path, d.headers, d.text, d.json)
        if why is None:
            matched.append(d)
            return len(matched) >= expect.count
        reasons.append(f"#{d.seq} {d.method} {d.path}: {why}")
        return False

    wait = _wait_s(ctx, expect.timeout_ms)
    found = receiver.wait_for(predicate, wait, after_seq=baseline)
    seen = [d for d in receiver.deliveries() if d.seq > baseline]
    evidence["deliveries_total"] = len(seen)
    evidence["deliveries"] = [d.as_dict(body_chars=EVIDENCE_BODY_CHARS) for d in seen[:EVIDENCE_ITEMS]]
    if found is None:
        return StepResult(
            passed=False,
            evidence=evidence,
            message=_no_match_message(len(seen), len(matched), expect, wait, evidence["receiver_url"], reasons)
            + _trigger_note(trig_ev),
        )
    evidence["matched"] = found.as_dict(body_chars=EVIDENCE_BODY_CHARS)
    evidence["_message"] = f"webhook delivered: {found.method} {found.path} matched ({len(seen)} request(s) received)"
    return None


def _no_match_message(
    seen: int, matched: int, expect: DeliveryExpectation, wait: float, where: str, reasons: list[str]
) -> str:
    if seen == 0:
        return f"no webhook delivery within {wait:g}s (nothing received at {where})"
    text = f"{seen} request(s) received at {where} within {wait:g}s"
    if matched:
        text += f", {matched} matched, {expect.count} required"
    else:
        text += ", none matched"
    if reasons:
        text += ": " + "; ".join(reasons[:3])
    return text


def _history_entries(body: Any) -> list[Any] | None:
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        for key in ("history", "items", "requests", "deliveries", "data", "calls", "events"):
            if isinstance(body.get(key), list):
                return body[key]
    return None


def _entry_view(entry: Any) -> tuple[str, str, dict[str, Any], str, Any]:
    """(method, path, headers, raw body text, parsed body) of one mock-receiver history entry."""
    if not isinstance(entry, dict):
        return "POST", "", {}, _text(entry), entry if not isinstance(entry, str) else None
    method = str(entry.get("method") or "POST")
    path = str(entry.get("path") or entry.get("url") or "")
    headers = h if isinstance(h := entry.get("headers"), dict) else {}
    body = entry
    for key in ("body", "json", "payload", "data"):
        if key in entry:
            body = entry[key]
            break
    if isinstance(body, str):
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        return method, path, headers, body, parsed
    return method, path, headers, _text(body), body


def _mock_receiver_check(
    inputs: P27Inputs, ctx: RunContext, want_path: str | None, evidence: dict[str, Any]
) -> StepResult | None:
    base = inputs.mock_receiver_url or ctx.vars.get("mock_receiver_url")
    if not base:
        return StepResult(
            passed=False, message="source mock_receiver needs mock_receiver_url (or the run variable mock_receiver_url)"
        )
    url = str(base).rstrip("/")
    url = url if url.endswith("/history") else url + "/history"
    evidence["history_url"] = url

    def read() -> tuple[list[Any] | None, str]:
        sent = send(ctx, "GET", url, identity=None, timeout_s=10.0)
        if sent.response is None:
            return None, sent.error or "no response"
        entries = _history_entries(sent.response.body)
        if entries is None or sent.response.status != 200:
            return None, f"GET {url} -> {sent.response.status}, not a history list: {excerpt(sent.response.text, 200)}"
        return entries, ""

    baseline: Counter[str] = Counter()
    if inputs.trigger is not None:
        before, problem = read()
        if before is None:
            return StepResult(passed=False, message=f"mock receiver history unreadable: {problem}", evidence=evidence)
        baseline = Counter(_text(e) for e in before)
    error, trig_ev, unreachable = fire(ctx, inputs.trigger)
    evidence["triggers"] = trig_ev
    if error:
        return StepResult(passed=False, unreachable=unreachable, message=error, evidence=evidence)
    expect = inputs.expect_delivery
    if expect is None:
        return None
    wait = _wait_s(ctx, expect.timeout_ms)
    deadline = time.monotonic() + wait
    polls = 0
    while True:
        polls += 1
        entries, problem = read()
        new: list[Any] = []
        reasons: list[str] = []
        matched: list[Any] = []
        if entries is not None:
            left = Counter(baseline)
            for e in entries:
                key = _text(e)
                if left[key] > 0:
                    left[key] -= 1
                else:
                    new.append(e)
            for i, e in enumerate(new):
                method, path, headers, raw, parsed = _entry_view(e)
                why = _delivery_check(expect, want_path, method, path, headers, raw, parsed)
                if why is None:
                    matched.append(e)
                else:
                    reasons.append(f"entry {i}: {why}")
        if len(matched) >= expect.count:
            evidence.update(
                polls=polls,
                deliveries_total=len(new),
                matched=short(matched[0], EVIDENCE_BODY_CHARS),
                deliveries=[short(e, EVIDENCE_BODY_CHARS) for e in new[:EVIDENCE_ITEMS]],
            )
            evidence["_message"] = f"webhook delivered: matched in the mock receiver history ({len(new)} new entr(ies))"
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            evidence.update(
                polls=polls,
                deliveries_total=len(new),
                deliveries=[short(e, EVIDENCE_BODY_CHARS) for e in new[:EVIDENCE_ITEMS]],
            )
            if entries is None:
                msg = f"mock receiver history unreadable: {problem}"
            else:
                msg = _no_match_message(len(new), len(matched), expect, wait, url, reasons)
            return StepResult(passed=False, evidence=evidence, message=msg + _trigger_note(trig_ev))
        time.sleep(min(REMOTE_POLL_S, remaining))


# --- P28 email_check ------------------------------------------------------------------------------
class MailExpectation(PrimitiveInputs):
    to: str | None = Field(
        default=None, description="A recipient (To/Cc/Bcc header or envelope) contains this, case-insensitively"
    )
    from_: str | None = Field(
        default=None, alias="from", description="The From address contains this, case-insensitively"
    )
    subject_contains: str | None = Field(default=None, description="Substring of the decoded subject")
    body_contains: str | list[str] | None = Field(default=None, description="Substring(s) of the text (or HTML) body")
    timeout_ms: int = Field(default=DEFAULT_WAIT_MS, ge=0, description="How long to wait for the message")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "subject_contains", ("subject",))
        rename_aliases(data, "body_contains", ("body", "contains", "text_contains"))
        rename_aliases(data, "to", ("recipient", "to_contains"))
        return data


class P28Inputs(PrimitiveInputs):
    trigger: Triggers = Field(
        default=None, description="What makes the app send the mail; resolved after the sink started"
    )
    mailserver_api: str | None = Field(
        default=None,
        description="MailHog messages URL (…/api/v2/messages) to read instead of the run's SMTP sink; default: "
        "the run variable mailserver_api, else the sink ({{smtp_host}}:{{smtp_port}})",
    )
    expect: MailExpectation = Field(
        default_factory=MailExpectation, description="{to, from, subject_contains, body_contains, timeout_ms}"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        legacy = [k for k in ("to", "subject_contains", "subject", "body_contains", "timeout_ms") if k in data]
        if legacy:
            expect = dict(data.get("expect") or {})
            for k in legacy:
                expect.setdefault(k, data.pop(k))
            data["expect"] = expect
            note("top-level to/subject/timeout_ms -> expect {...}")
        rename_aliases(data, "mailserver_api", ("mailhog_url", "mailhog_api", "mail_api"))
        legacy_trigger = {
            k: data.pop(k) for k in ("trigger_path", "trigger_method", "trigger_body", "trigger_headers") if k in data
        }
        if legacy_trigger and "trigger" not in data:
            data["trigger"] = {k[len("trigger_") :]: v for k, v in legacy_trigger.items()}
            note("trigger_path/method/body/headers -> trigger {...}")
        return data


def _mail_mismatch(expect: MailExpectation, parsed: Mapping[str, Any]) -> str | None:
    if expect.to and not any(expect.to.lower() in r.lower() for r in parsed["recipients"]):
        return f"recipients {parsed['recipients']} lack {expect.to!r}"
    if expect.from_ and expect.from_.lower() not in str(parsed["from"]).lower():
        return f"from {parsed['from']!r} lacks {expect.from_!r}"
    if expect.subject_contains and expect.subject_contains not in parsed["subject"]:
        return f"subject {parsed['subject']!r} lacks {expect.subject_contains!r}"
    needles = [expect.body_contains] if isinstance(expect.body_contains, str) else (expect.body_contains or [])
    for needle in needles:
        if needle not in parsed["text"] and needle not in parsed["html"]:
            return f"body lacks {needle!r}"
    return None


def _mail_summary(parsed: Mapping[str, Any]) -> dict[str, Any]:
    body = parsed["text"] or parsed["html"]
    return {
        "from": parsed["from"],
        "recipients": parsed["recipients"],
        "subject": parsed["subject"],
        "body": body[:EVIDENCE_BODY_CHARS] + ("..." if len(body) > EVIDENCE_BODY_CHARS else ""),
    }


def mailhog_parsed(item: Mapping[str, Any]) -> dict[str, Any]:
    """A MailHog v2 item as parse_message's dict (from its Raw data when present)."""
    raw = r if isinstance(r := item.get("Raw"), Mapping) else {}
    data = raw.get("Data")
    envelope_to = [str(x) for x in (raw.get("To") or [])]
    if isinstance(data, str) and data:
        return parse_message(data.encode("utf-8", errors="replace"), str(raw.get("From") or ""), envelope_to)
    content = c if isinstance(c := item.get("Content"), Mapping) else {}
    headers = h if isinstance(h := content.get("Headers"), Mapping) else {}
    text_headers = "".join(
        f"{k}: {v}\r\n" for k, vals in headers.items() for v in (vals if isinstance(vals, list) else [vals])
    )
    return parse_message(
        (text_headers + "\r\n" + str(content.get("Body") or "")).encode("utf-8", errors="replace"), "", envelope_to
    )


@primitive(
    "P28", P28Inputs, raw_fields={"trigger", "trigger_path", "trigger_method", "trigger_body", "trigger_headers"}
)
def email_check(inputs: P28Inputs, ctx: RunContext) -> StepResult:
    """Start the SMTP sink (or read MailHog), fire the trigger, wait for a matching message."""
    api = inputs.mailserver_api or ctx.vars.get("mailserver_api")
    expect = inputs.expect
    evidence: dict[str, Any] = {}
    if api:
        return _mailhog_check(ctx, str(api), inputs, evidence)
    sink = ensure_smtp_sink(ctx)
    evidence["smtp"] = f"{sink.advertise_host}:{sink.port}"
    baseline = sink.last_seq if inputs.trigger is not None else 0
    error, trig_ev, unreachable = fire(ctx, inputs.trigger)
    evidence["triggers"] = trig_ev
    if error:
        return StepResult(passed=False, unreachable=unreachable, message=error, evidence=evidence)
    reasons: list[str] = []

    def predicate(m: MailMessage) -> bool:
        why = _mail_mismatch(expect, m.parsed())
        if why:
            reasons.append(f"#{m.seq}: {why}")
        return why is None

    wait = _wait_s(ctx, expect.timeout_ms)
    found = sink.wait_for(predicate, wait, after_seq=baseline)
    seen = [m for m in sink.messages() if m.seq > baseline]
    evidence["messages_total"] = len(seen)
    evidence["messages"] = [_mail_summary(m.parsed()) for m in seen[:EVIDENCE_ITEMS]]
    if found is None:
        where = f"the SMTP sink {sink.advertise_host}:{sink.port}"
        msg = (
            f"no email within {wait:g}s at {where}"
            if not seen
            else f"{len(seen)} email(s) at {where} within {wait:g}s, none matched: " + "; ".join(reasons[:3])
        )
        return StepResult(passed=False, evidence=evidence, message=msg + _trigger_note(trig_ev))
    summary = _mail_summary(found.parsed())
    evidence["matched"] = summary
    return StepResult(
        passed=True,
        evidence=evidence,
        value=summary,
        message=f"email to {', '.join(summary['recipients'])} with subject {summary['subject']!r} received",
    )


def _mailhog_check(ctx: RunContext, api: str, inputs: P28Inputs, evidence: dict[str, Any]) -> StepResult:
    evidence["mailserver_api"] = api

    def read() -> tuple[list[Mapping[str, Any]] | None, str]:
        sent = send(ctx, "GET", api, identity=None, timeout_s=10.0)
        if sent.response is None:
            return None, sent.error or "no response"
        body = sent.response.body
        items = body.get("items") if isinstance(body, dict) else body if isinstance(body, list) else None
        if sent.response.status != 200 or not isinstance(items, list):
            return (
                None,
                f"GET {api} -> {sent.response.status}, not a MailHog message list: {excerpt(sent.response.text, 200)}",
            )
        return [i for i in items if isinstance(i, Mapping)], ""

    def key(item: Mapping[str, Any]) -> str:
        return str(item.get("ID") or _text(item))

    seen_before: set[str] = set()
    if inputs.trigger is not None:
        before, problem = read()
        if before is None:
            return StepResult(passed=False, message=f"mail server API unreadable: {problem}", evidence=evidence)
        seen_before = {key(i) for i in before}
    error, trig_ev, unreachable = fire(ctx, inputs.trigger)
    evidence["triggers"] = trig_ev
    if error:
        return StepResult(passed=False, unreachable=unreachable, message=error, evidence=evidence)
    expect = inputs.expect
    wait = _wait_s(ctx, expect.timeout_ms)
    deadline = time.monotonic() + wait
    polls = 0
    while True:
        polls += 1
        items, problem = read()
        new = [mailhog_parsed(i) for i in (items or []) if key(i) not in seen_before]
        reasons = []
        for i, parsed in enumerate(new):
            why = _mail_mismatch(expect, parsed)
            if why is None:
                summary = _mail_summary(parsed)
                evidence.update(polls=polls, messages_total=len(new), matched=summary)
                return StepResult(
                    passed=True,
                    evidence=evidence,
                    value=summary,
                    message=f"email to {', '.join(summary['recipients'])} with subject {summary['subject']!r} found in {api}",
                )
            reasons.append(f"message {i}: {why}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            evidence.update(
                polls=polls, messages_total=len(new), messages=[_mail_summary(p) for p in new[:EVIDENCE_ITEMS]]
            )
            if items is None:
                msg = f"mail server API unreadable: {problem}"
            elif not new:
                msg = f"no email within {wait:g}s in {api}"
            else:
                msg = f"{len(new)} email(s) in {api} within {wait:g}s, none matched: " + "; ".join(reasons[:3])
            return StepResult(passed=False, evidence=evidence, message=msg + _trigger_note(trig_ev))
        time.sleep(min(REMOTE_POLL_S, remaining))


# --- P_INGEST event_ingest ------------------------------------------------------------------------
MCP_KEYS = (
    "entityType",
    "entityUrn",
    "aspectName",
    "changeType",
    "aspectValue",
    "aspect",
    "entityKeyAspect",
    "systemMetadata",
)


class IngestInputs(HttpFields):
    """Analytics ingestion (the paper's P_INGEST: "event ingestion (analytics tasks)").

    Model: send ``events`` to the app's ingestion ``endpoint`` (each event its own request, or all
    in one when ``batch``), each ``repeat`` times; every send must answer ``expect_status``
    (default 2xx); then, if ``verify`` is given, poll it until the events are counted -- through
    the app's stats API (``{strategy: http, path, assertions}``) or SQL
    (``{strategy: db_query, sql, expected_result}``).

    Before ``events`` and ``verify`` are resolved the step seeds ``{{ingest_id}}`` (a fresh
    12-hex-digit id per step: put it in an event name/URL/property so the verification counts only
    this step's events), ``{{ingest_ts}}`` (epoch seconds), ``{{ingest_ts_ms}}`` and
    ``{{ingest_time}}`` (ISO 8601 UTC); after sending, ``{{ingest_count}}`` is the number of events
    accepted (events x repeat), for assertions such as ``{"path": "$.count", "op": "gte",
    "expected": "{{ingest_count}}"}``.
    """

    endpoint: str | None = Field(
        description="Ingestion path (e.g. /api/event, /api/send, /capture) or absolute URL; "
        "null only for a metadata-change proposal that names none (fails at run time)"
    )
    method: str = Field(default="POST", description="HTTP method of each send")
    events: list[Any] = Field(
        min_length=1, description="Event payloads (objects -> JSON, strings verbatim); placeholders allowed"
    )
    batch: bool = Field(
        default=False,
        description="Send all events in one request: a JSON array (or {batch_key: [...]}); strings as NDJSON",
    )
    batch_key: str | None = Field(
        default=None, description="With batch: wrap the list as {batch_key: [...]}, e.g. 'batch' or 'events'"
    )
    repeat: int = Field(default=1, ge=1, le=10000, description="Send the events (or the batch) this many times")
    headers: dict[str, str] | None = Field(
        default=None,
        description="Request headers (e.g. User-Agent, X-Forwarded-For); when given the identity's auth is not sent",
    )
    skip_auth: bool = Field(default=False, description="Send no auth (trackers are usually public)")
    expect_status: Statuses = Field(default_factory=list, description="Status code(s) each send must get (default 2xx)")
    verify: Verify | None = Field(
        default=None,
        description="Check the events were counted: {strategy: http, path, assertions} or {strategy: db_query, sql, expected_result}",
    )
    max_wait_ms: int = Field(
        default=DEFAULT_WAIT_MS, ge=0, description="Polling budget of verify (aggregation may lag)"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "endpoint", ("path", "url", "ingest_path", "ingest_endpoint"))
        rename_aliases(data, "events", ("payloads", "payload", "body", "data"))
        if "event" in data and "events" not in data:
            data["events"] = [data.pop("event")]
            note("'event' -> events: [event]")
        if "events" in data and not isinstance(data["events"], list):
            data["events"] = [data["events"]]
        rename_aliases(data, "repeat", ("times",))
        rename_aliases(data, "expect_status", ("expected_status",))
        proposal = {k: data.pop(k) for k in list(data) if k in MCP_KEYS}
        if proposal and "events" not in data:
            # ychlukjm (DataHub): {entityType, entityUrn, aspectName, changeType, aspectValue} -> one event
            data["events"] = [proposal]
            note(f"metadata-change proposal ({', '.join(proposal)}) -> events: [proposal]")
            if "endpoint" not in data:
                data["endpoint"] = None
                warn(
                    "a metadata-change proposal without an ingestion endpoint: the DAG does not say where to send it "
                    "(the reference harness's task code did), so the step fails at run time",
                    "endpoint",
                )
        else:
            data.update(proposal)  # next to events: left for the unknown-key warning
        return data


@primitive("P_INGEST", IngestInputs, raw_fields={"events", "event", "payloads", "payload", "body", "data", "verify"})
def event_ingest(inputs: IngestInputs, ctx: RunContext) -> StepResult:
    """Send analytics events to the ingestion endpoint, then verify they were counted (API or SQL)."""
    if inputs.endpoint is None:
        return StepResult(
            passed=False,
            message="no ingestion endpoint: the DAG gives a metadata-change proposal but not "
            "where to send it (see the loader warning)",
            evidence={"events": inputs.events},
        )
    now = time.time()
    ctx.capture("ingest_id", uuid.uuid4().hex[:12])
    ctx.capture("ingest_ts", int(now))
    ctx.capture("ingest_ts_ms", int(now * 1000))
    ctx.capture("ingest_time", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    try:
        events = ctx.resolve(inputs.events)
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, message=f"events: {exc}", evidence={"placeholder": exc.placeholder})
    if inputs.batch:
        if all(isinstance(e, str) for e in events):
            payloads: list[Any] = ["\n".join(events) + "\n"]
        else:
            payloads = [{inputs.batch_key: events} if inputs.batch_key else events]
    else:
        payloads = list(events)
    plain = inputs.skip_auth or inputs.headers is not None
    identity = None if plain else ctx.auth.active
    sends: list[dict[str, Any]] = []
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    accepted = 0
    unreachable = False
    for _ in range(inputs.repeat):
        for payload in payloads:
            sent = send(ctx, inputs.method, inputs.endpoint, body=payload, headers=inputs.headers, identity=identity)
            if len(sends) < EVIDENCE_ITEMS:
                sends.append(response_evidence(sent))
            if sent.response is None:
                unreachable = sent.unreachable
                failures.append(sent.error or "no response")
                break
            ctx.set_response(sent.response)
            status = sent.response.status
            statuses[status] += 1
            ok = status in inputs.expect_status if inputs.expect_status else 200 <= status < 300
            if ok:
                accepted += len(events) if inputs.batch else 1
            elif len(failures) < 3:
                failures.append(f"{inputs.method} {inputs.endpoint} -> {status}: {excerpt(sent.response.text, 200)}")
        if failures and unreachable:
            break
    ctx.capture("ingest_count", accepted)
    evidence: dict[str, Any] = {
        "ingest_id": ctx.vars["ingest_id"],
        "events": len(events),
        "repeat": inputs.repeat,
        "batch": inputs.batch,
        "accepted": accepted,
        "statuses": dict(statuses),
        "sends": sends,
    }
    expected_count = len(events) * inputs.repeat
    if failures:
        return StepResult(
            passed=False,
            unreachable=unreachable,
            evidence=evidence,
            message=f"{accepted}/{expected_count} events accepted; expected {sorted(inputs.expect_status) or '2xx'}: "
            + "; ".join(failures[:3]),
        )
    if inputs.verify is None:
        return StepResult(
            passed=True,
            evidence=evidence,
            value={"accepted": accepted},
            message=f"{accepted} event(s) accepted by {inputs.endpoint}",
        )
    checked = run_verify(ctx, inputs.verify, inputs.max_wait_ms)
    evidence["verify"] = checked.evidence
    return StepResult(
        passed=checked.passed,
        unreachable=checked.unreachable,
        evidence=evidence,
        value=checked.value,
        message=f"{accepted} event(s) accepted by {inputs.endpoint}; verify: {checked.message}",
    )


# --- P30 totp_code -----------------------------------------------------------------------------------
class P30Inputs(PrimitiveInputs):
    """sgdoserd's P30 (defined in its reference primitives.py, not in the paper's table): compute the
    current TOTP code of a secret, e.g. one a previous P08 captured after enrolling a user in MFA."""

    secret: str | None = Field(
        default=None,
        description="Base32 TOTP secret ({{placeholders}} allowed); default: the "
        "captured value named by secret_context_key",
    )
    secret_context_key: str = Field(
        default="mfa_secret",
        min_length=1,
        description="Name of the captured value that holds the secret (read as {{name}}) when 'secret' is not given",
    )
    store_as: str = Field(default="mfa_code", min_length=1, description="Capture the code as {{store_as}}")
    step: int = Field(default=30, ge=1, le=3600, description="Time step in seconds (RFC 6238 X)")
    digits: int = Field(default=6, ge=6, le=10, description="Code length")
    offset: int = Field(
        default=0, ge=-10, le=10, description="Time steps added to the current one (-1: the previous code)"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "secret_context_key", ("secret_from", "secret_var", "secret_key"))
            rename_aliases(data, "store_as", ("save_as", "capture_as"))
            rename_aliases(data, "step", ("period", "interval"))
        return data


def totp(secret: str, *, at: float | None = None, step: int = 30, digits: int = 6, offset: int = 0) -> str:
    """RFC 6238 TOTP (HMAC-SHA1) of a base32 secret; spaces, case and missing padding are tolerated."""
    import base64
    import hashlib
    import hmac
    import struct

    text = "".join(secret.split()).upper().rstrip("=")
    key = base64.b32decode(text + "=" * (-len(text) % 8))
    counter = int((time.time() if at is None else at) // step) + offset
    digest = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    start = digest[-1] & 0x0F
    code = (struct.unpack(">I", digest[start : start + 4])[0] & 0x7FFFFFFF) % (10**digits)
    return str(code).zfill(digits)


def totp_code(inputs: P30Inputs, ctx: RunContext) -> StepResult:
    """Compute the current TOTP code of a secret and capture it as ``{{store_as}}``."""
    source = "secret"
    secret: Any = inputs.secret
    if secret is None:
        source = inputs.secret_context_key
        try:
            secret = ctx.resolve("{{" + inputs.secret_context_key + "}}")
        except UnresolvedPlaceholder:
            return StepResult(
                passed=False, message=f"no TOTP secret: nothing was captured as {{{{{inputs.secret_context_key}}}}}"
            )
    if not isinstance(secret, str) or not secret.strip():
        return StepResult(passed=False, message=f"no TOTP secret: {source} is {short(secret)}")
    try:
        code = totp(secret, step=inputs.step, digits=inputs.digits, offset=inputs.offset)
    except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
        return StepResult(passed=False, message=f"TOTP secret from {source} is not base32: {exc}")
    ctx.capture(inputs.store_as, code)
    return StepResult(
        passed=True,
        message=f"TOTP code captured as {{{{{inputs.store_as}}}}} ({inputs.digits} digits)",
        value={"store_as": inputs.store_as, "digits": inputs.digits},
        evidence={"secret_from": source, "store_as": inputs.store_as, "step": inputs.step, "digits": inputs.digits},
    )


# P30 is not in the paper's table (no catalogue entry): registered with its name and group
REGISTRY.register(
    "P30",
    totp_code,
    P30Inputs,
    name="totp_code",
    group="auth",
    description="Compute the current TOTP code (RFC 6238) of a secret and capture it (sgdoserd)",
)
