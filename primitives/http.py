"""HTTP primitives: P04 request, P05 CRUD round trip, P14 permission check, P15 status, P16 time.

Every response received becomes the run's *last response* (``ctx.set_response``), which later
P06/P07/P15/P16 steps read. The app under test is untrusted: transport errors, oversized bodies,
non-JSON bodies and odd statuses end in ``passed=False`` with a message, never in an exception
(exceptions are reserved for harness bugs; the engine turns them into ERROR).

Authentication follows the active identity (set by P13), with two deliberate exceptions that
real DAGs rely on to send "no token" and "invalid token" requests: a step that gives ``headers``
(even ``{}``) or ``skip_auth: true`` sends neither the identity's headers nor its cookies.
"""

from __future__ import annotations

import mimetypes
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BeforeValidator, Field, field_validator, model_validator

from saasbench.auth import LoginFailed
from saasbench.context import RunContext, extract_id
from saasbench.dag import note
from saasbench.http import HttpResponse, Identity, ResponseTooLarge
from saasbench.jsonpath import ABSENT, PathError
from saasbench.jsonpath import evaluate as path_value
from saasbench.primitives.registry import PrimitiveInputs, primitive
from saasbench.results import StepResult

EXCERPT_BYTES = 2048
_METHOD_RE = re.compile(r"^[A-Za-z]+$")
# What the reference harness's "inclusive" mode reads as "the entity already exists".
ALREADY_EXISTS_RE = re.compile(r"already\s+exist|duplicate|\btaken\b|already\s+(?:in\s+use|registered)", re.I)
COMPAT_EXISTS_STATUSES = frozenset({400, 401, 409, 422})
DENIED_DEFAULT = frozenset({401, 403, 404})
SUCCESS = frozenset(range(200, 300))


# --- shared input types ------------------------------------------------------------------------
def _as_statuses(value: Any) -> Any:
    """``201`` or ``"201"`` or ``[200, "204"]`` -> a list of ints (bools are never statuses)."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple, set)) else [value]
    out: list[Any] = []
    for item in items:
        if isinstance(item, str) and item.strip().isdigit():
            item = int(item.strip())
        if isinstance(item, bool) or not isinstance(item, int) or not 100 <= item <= 599:
            raise ValueError(f"not an HTTP status code: {item!r}")
        out.append(item)
    return out


Statuses = Annotated[list[int], BeforeValidator(_as_statuses)]


def _method(value: Any) -> str:
    if not isinstance(value, str) or not _METHOD_RE.match(value.strip()):
        raise ValueError(f"not an HTTP method: {value!r}")
    return value.strip().upper()


def _string_headers(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("headers must be an object")
    return {str(k): ("" if v is None else str(v)) for k, v in value.items()}


# --- sending -----------------------------------------------------------------------------------
@dataclass
class Sent:
    """The outcome of one request: a response, or why there is none."""

    method: str
    url: str
    response: HttpResponse | None = None
    error: str | None = None
    unreachable: bool = False
    identity: str = "none"


def send(
    ctx: RunContext,
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    identity: Identity | None = None,
    timeout_s: float | None = None,
) -> Sent:
    """Send one request; transport failures and the size cap become ``Sent.error``.

    ``identity`` None sends no auth headers and no cookies. ``body`` dict/list is JSON unless a
    declared Content-Type says form or multipart; a str is sent verbatim (its Content-Type is
    whatever ``headers`` declare).
    """
    url = ctx.http.url(path)
    out = Sent(method=method, url=url, identity=identity.role if identity is not None else "none")
    timeout = ctx.timeout(timeout_s)
    try:
        kwargs = _body_kwargs(body, headers or {})
        out.response = ctx.http.request(method, path, identity=identity, headers=headers, timeout_s=timeout, **kwargs)
    except ResponseTooLarge as exc:
        out.error = f"{method} {url}: {exc}"
    except httpx.TimeoutException:
        out.error, out.unreachable = f"{method} {url}: no response within {timeout:g}s (timeout)", True
    except httpx.ConnectError as exc:
        out.error, out.unreachable = f"{method} {url}: cannot connect ({exc or 'connection refused'})", True
    except httpx.HTTPError as exc:
        out.error, out.unreachable = f"{method} {url}: transport error {type(exc).__name__}: {exc}", True
    except (httpx.InvalidURL, UnicodeError) as exc:  # unusable URL or non-ASCII header text from DAG data
        out.error = f"{method} {url}: cannot build the request: {exc}"
    return out


def _body_kwargs(body: Any, headers: dict[str, str]) -> dict[str, Any]:
    if body is None:
        return {}
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "").lower()
    if isinstance(body, (str, bytes)):
        return {"content": body}
    if isinstance(body, dict) and ctype.startswith("multipart/form-data"):
        return _multipart(body)
    if isinstance(body, dict) and ctype.startswith("application/x-www-form-urlencoded"):
        return {"data": {k: v if isinstance(v, (str, list)) else _scalar_text(v) for k, v in body.items()}}
    return {"json_body": body}


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


# 1x1 images, so an upload endpoint that decodes images (thumbnails) accepts the sample file.
_PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000005000100e2216b6b0000000049454e44ae426082"
)
_GIF_1X1 = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")
_FILENAME_RE = re.compile(r"^[\w.-]+\.[A-Za-z0-9]{1,5}$")


def _multipart(body: dict[str, Any]) -> dict[str, Any]:
    """A dict body declared multipart: filename-like strings become file parts, the rest fields.

    ``{"file": "test_image.png"}`` uploads a valid 1x1 PNG named test_image.png (the DAG names
    a file the harness never had). A value ``{"filename", "content", "content_type"}`` is an
    explicit part. If no value is a file, every entry is sent as a file part.
    """
    files: dict[str, tuple[str, bytes, str]] = {}
    data: dict[str, str] = {}
    for key, value in body.items():
        if isinstance(value, dict) and "content" in value:
            name = str(value.get("filename") or key)
            content = value["content"]
            raw = bytes(content) if isinstance(content, (bytes, bytearray)) else str(content).encode()
            files[key] = (name, raw, str(value.get("content_type") or _mime(name)))
        elif isinstance(value, str) and _FILENAME_RE.match(value):
            files[key] = (value, _sample_file(value), _mime(value))
        else:
            data[key] = value if isinstance(value, str) else _scalar_text(value)
    if not files:
        files = {k: (k, v.encode(), "text/plain") for k, v in data.items()}
        data = {}
    return {"files": files, "data": data or None}


def _mime(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _sample_file(name: str) -> bytes:
    lower = name.lower()
    if lower.endswith(".png"):
        return _PNG_1X1
    if lower.endswith(".gif"):
        return _GIF_1X1
    return b"saasbench sample file\n"


def excerpt(text: str, limit: int = EXCERPT_BYTES) -> str:
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore") + f"... [{len(raw) - limit} more bytes]"


def response_evidence(sent: Sent) -> dict[str, Any]:
    ev: dict[str, Any] = {"method": sent.method, "url": sent.url, "identity": sent.identity}
    if sent.response is not None:
        r = sent.response
        ev.update(status=r.status, elapsed_ms=round(r.elapsed_ms, 1), body_excerpt=excerpt(r.text))
        if r.json_error:
            ev["json_error"] = r.json_error
    if sent.error:
        ev["error"] = sent.error
    return ev


def forget_response(ctx: RunContext) -> None:
    """A request that got no response clears the last one, so no later step judges a stale one."""
    ctx.clear_response()


def already_exists(response: HttpResponse) -> bool:
    return response.status in COMPAT_EXISTS_STATUSES and bool(ALREADY_EXISTS_RE.search(response.text[:65536]))


def _bearer(token: str) -> dict[str, str]:
    token = token.strip()
    return {"Authorization": token if token.lower().startswith(("bearer ", "basic ", "token ")) else f"Bearer {token}"}


# --- P04 -----------------------------------------------------------------------------------------
class P04Inputs(PrimitiveInputs):
    method: str = Field(default="GET", description="HTTP method")
    path: str = Field(description="Path relative to the base URL, or an absolute http(s) URL")
    headers: dict[str, str] | None = Field(
        default=None,
        description="Request headers. When given (even {}), the active identity's auth headers and "
        "cookies are NOT sent: this is how DAGs send 'no token' or 'invalid token' requests",
    )
    body: Any = Field(
        default=None,
        description="dict/list -> JSON (form-encoded if headers declare x-www-form-urlencoded; "
        "multipart parts if they declare multipart/form-data); str -> sent verbatim",
    )
    timeout: float | None = Field(default=None, gt=0, description="Seconds; bounded by the node deadline")
    skip_auth: bool = Field(default=False, description="Send no auth headers and no cookies")
    save_as: str | None = Field(default=None, description="Capture the response record under this name")
    capture_response_as: str | None = Field(default=None, description="Same as save_as (family-A name)")

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @field_validator("headers", mode="before")
    @classmethod
    def _check_headers(cls, value: Any) -> dict[str, str] | None:
        return _string_headers(value)


@primitive("P04", P04Inputs)
def http_request(inputs: P04Inputs, ctx: RunContext) -> StepResult:
    """Send one request; passes when any response arrives (statuses are P15's business)."""
    plain = inputs.skip_auth or inputs.headers is not None
    sent = send(ctx, inputs.method, inputs.path, body=inputs.body, headers=inputs.headers,
                identity=None if plain else ctx.auth.active, timeout_s=inputs.timeout)
    evidence = response_evidence(sent)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence)
    ctx.set_response(sent.response)
    record = sent.response.record()
    for name in (inputs.save_as, inputs.capture_response_as):
        if name:
            ctx.capture(name, record)
    r = sent.response
    return StepResult(passed=True, value=record, evidence=evidence,
                      message=f"{inputs.method} {inputs.path} -> {r.status} in {r.elapsed_ms:.0f} ms")


# --- P05 -----------------------------------------------------------------------------------------
class P05Inputs(PrimitiveInputs):
    resource: str = Field(description="Collection path: POST here creates, <resource>/<id> reads/updates/deletes")
    create_body: Any = Field(default_factory=dict, description="JSON body of the create request")
    update_body: Any = Field(default=None, description="JSON body of the update; no update when absent")
    identifier_field: str = Field(default="id", description="Dotted path of the id in the created object (legacy: id_field)")
    response_root: str | None = Field(default=None, description="Dotted path where the object lives in create/read bodies, e.g. 'data'")
    update_method: Literal["PUT", "PATCH", "POST"] = Field(default="PUT", description="Method of the update request")
    update_to_base: bool = Field(default=False, description="Update at <resource> instead of <resource>/<id>")
    expected_create_status: Statuses = Field(default_factory=list, description="Default: 200 or 201")
    expected_read_fields: list[str] = Field(default_factory=list, description="Every one must be present in the read object")
    expected_update_status: Statuses = Field(default_factory=list, description="Default: 200 or 204")
    expected_delete_status: Statuses = Field(default_factory=list, description="Default: 200, 202 or 204")
    keep_alive: bool = Field(default=False, description="Keep the entity for later nodes: no delete")
    skip_delete: bool = Field(default=False, description="No delete")
    token: str | None = Field(default=None, description="Explicit bearer token instead of the active identity")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "id_field" in data:
            data = dict(data)
            value = data.pop("id_field")
            data.setdefault("identifier_field", value)
            note("'id_field' -> identifier_field")
        if isinstance(data, dict) and isinstance(data.get("update_method"), str):
            data = {**data, "update_method": data["update_method"].strip().upper()}
        return data


def _object(body: Any, root: str | None) -> Any:
    """The entity inside a body: at ``root`` when it is there, else the body itself."""
    if root:
        try:
            found = path_value(root, body)
        except PathError:
            found = ABSENT
        if found is not ABSENT:
            return found
    return body


def _field_present(obj: Any, field: str) -> bool:
    try:
        for candidate in (obj, *(obj.get(w) for w in ("data", "result", "item") if isinstance(obj, dict))):
            if candidate is not None and path_value(field, candidate) is not ABSENT:
                return True
    except PathError:
        return False
    return False


@primitive("P05", P05Inputs)
def api_crud(inputs: P05Inputs, ctx: RunContext) -> StepResult:
    """Create -> read -> update -> delete; passes when every sub-step performed answered as expected."""
    reference = ctx.options.compat == "reference"
    headers = _bearer(inputs.token) if inputs.token else None
    identity = None if inputs.token else ctx.auth.active
    item_base = inputs.resource.rstrip("/") or ""
    steps: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []

    def call(name: str, method: str, path: str, body: Any, ok: "set[int] | frozenset[int]") -> tuple[dict[str, Any], Sent]:
        sent = send(ctx, method, path, body=body, headers=headers, identity=identity)
        requests.append(response_evidence(sent))
        expected: Any = "2xx" if ok == SUCCESS else sorted(ok)
        step: dict[str, Any] = {"step": name, "method": method, "url": sent.url, "expected": expected, "passed": False}
        steps.append(step)
        if sent.response is None:
            step["message"] = sent.error
        else:
            ctx.set_response(sent.response)
            step["status"] = sent.response.status
            step["passed"] = sent.response.status in ok
        return step, sent

    create, sent = call("create", "POST", inputs.resource, inputs.create_body, set(inputs.expected_create_status or (200, 201)))
    created_id: Any = None
    if sent.response is not None:
        if not create["passed"] and reference and already_exists(sent.response):
            create.update(passed=True, compat="reference: 'already exists' answer counts as created")
        if create["passed"]:
            created_id = _created_id(sent.response.body, inputs)
            if created_id is None and "compat" not in create:
                create.update(passed=False, message=f"no {inputs.identifier_field!r} in the create response")
    if created_id is not None:
        ctx.capture("created_id", created_id)
        ctx.last_created_id = created_id
        item = f"{item_base}/{quote(str(created_id), safe='')}"
        read, sent_read = call("read", "GET", item, None, SUCCESS)
        if read["passed"] and inputs.expected_read_fields and sent_read.response is not None:
            obj = _object(sent_read.response.body, inputs.response_root)
            missing = [f for f in inputs.expected_read_fields if not _field_present(obj, f)]
            if missing:
                read.update(passed=False, message="missing fields: " + ", ".join(missing))
        if inputs.update_body is not None:
            call("update", inputs.update_method, inputs.resource if inputs.update_to_base else item,
                 inputs.update_body, set(inputs.expected_update_status or (200, 204)))
        if not (inputs.keep_alive or inputs.skip_delete):
            delete, sent_delete = call("delete", "DELETE", item, None, set(inputs.expected_delete_status or (200, 202, 204)))
            if not delete["passed"] and reference and sent_delete.response is not None and sent_delete.response.status == 404:
                delete.update(passed=True, compat="reference: DELETE answered 404 counts as deleted")

    passed_count = sum(1 for s in steps if s["passed"])
    result = {"created_id": created_id, "steps": steps, "steps_passed": passed_count, "steps_total": len(steps)}
    ctx.last_document = result
    summary = ", ".join(_step_text(s) for s in steps)
    return StepResult(passed=passed_count == len(steps), value=result, unreachable=sent.unreachable,
                      message=f"{passed_count}/{len(steps)} CRUD sub-steps as expected: {summary}",
                      evidence={"requests": requests, "steps": steps})


def _created_id(body: Any, inputs: P05Inputs) -> Any:
    """The created entity's identifier (a scalar), from the response or, failing that, the request.

    With a non-default ``identifier_field`` the client chose the value (Lago ``external_id``,
    ``code``), so the create body is an honest fallback when the response omits it.
    """
    obj = _object(body, inputs.response_root)
    try:
        found = path_value(inputs.identifier_field, obj)
    except PathError:
        found = ABSENT
    if found is ABSENT and inputs.identifier_field == "id":
        found = extract_id(obj)
    if found is ABSENT or found is None:
        found = None
        if inputs.identifier_field != "id":
            try:
                sent_value = path_value(inputs.identifier_field, _object(inputs.create_body, inputs.response_root))
            except PathError:
                sent_value = ABSENT
            found = None if sent_value is ABSENT else sent_value
    if isinstance(found, (dict, list, bool)):
        return None
    return found


def _step_text(step: dict[str, Any]) -> str:
    status = step.get("status", "no response")
    text = f"{step['step']} {status}" + ("" if step["passed"] else f" (expected {step['expected']})")
    if step.get("message") and not step["passed"]:
        text += f" [{step['message']}]"
    return text


# --- P14 -----------------------------------------------------------------------------------------
class P14Inputs(PrimitiveInputs):
    method: str = Field(default="GET", description="HTTP method of the action")
    path: str = Field(description="Path of the action (or give action: 'METHOD /path')")
    role: str | None = Field(default=None, description="Log in as this role for the check; the previous identity is restored after")
    token: str | None = Field(default=None, description="Explicit bearer token (e.g. an invalid one) instead of an identity")
    body: Any = Field(default=None, description="Request body (JSON)")
    expected_result: Literal["allowed", "denied"] | None = Field(
        default=None, description="Default: denied if every given status is >= 400, else allowed")
    expected_status: Statuses = Field(default_factory=list, description="Status code(s) that pass; replace the class defaults")
    acceptable_statuses: Statuses = Field(default_factory=list, description="More status codes that pass")

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        action = data.pop("action", None)
        if action is not None:
            if not isinstance(action, str) or not action.strip():
                raise ValueError("action must be 'METHOD /path'")
            parts = action.split(None, 1)
            if len(parts) == 2 and _METHOD_RE.match(parts[0]):
                data.setdefault("method", parts[0])
                data.setdefault("path", parts[1].strip())
            else:
                data.setdefault("path", action.strip())
            note("action 'METHOD /path' -> method + path")
        result = data.get("expected_result")
        if isinstance(result, str):
            lowered = result.strip().lower()
            data["expected_result"] = {"allow": "allowed", "permitted": "allowed", "deny": "denied",
                                       "forbidden": "denied", "rejected": "denied"}.get(lowered, lowered)
        return data

    @property
    def statuses(self) -> set[int]:
        return set(self.expected_status) | set(self.acceptable_statuses)

    @property
    def outcome(self) -> str:
        if self.expected_result:
            return self.expected_result
        given = self.statuses
        return "denied" if given and all(s >= 400 for s in given) else "allowed"


@primitive("P14", P14Inputs)
def permission_check(inputs: P14Inputs, ctx: RunContext) -> StepResult:
    """Send the action as a role (or token) and check it is allowed or denied."""
    previous = ctx.auth.active
    try:
        headers = None
        identity: Identity | None = ctx.auth.active
        if inputs.token:
            headers, identity = _bearer(inputs.token), None
        elif inputs.role:
            try:
                identity = ctx.auth.login(ctx, inputs.role)
            except LoginFailed as exc:
                return StepResult(passed=False, message=f"cannot act as role {inputs.role!r}: {exc}")
            except httpx.HTTPError as exc:
                return StepResult(passed=False, unreachable=True, message=f"login as {inputs.role!r} failed: {type(exc).__name__}: {exc}")
        sent = send(ctx, inputs.method, inputs.path, body=inputs.body, headers=headers, identity=identity)
    finally:
        ctx.auth.active = previous
    evidence = response_evidence(sent)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence)
    ctx.set_response(sent.response)
    status = sent.response.status
    wanted = inputs.outcome
    if inputs.statuses:
        ok, rule = status in inputs.statuses, f"one of {sorted(inputs.statuses)}"
    elif wanted == "denied":
        ok, rule = status in DENIED_DEFAULT, f"denied ({sorted(DENIED_DEFAULT)})"
    else:
        ok, rule = 200 <= status < 400, "allowed (2xx/3xx)"
    who = f"role {inputs.role!r}" if inputs.role else ("the given token" if inputs.token else f"identity {previous.role!r}")
    verdict = "as expected" if ok else "NOT as expected"
    return StepResult(passed=ok, value=sent.response.record(), evidence={**evidence, "expected": wanted},
                      message=f"{inputs.method} {inputs.path} as {who} -> {status}; expected {wanted}: {rule}; {verdict}")


# --- P15 -----------------------------------------------------------------------------------------
class P15Inputs(PrimitiveInputs):
    expected_status: Statuses = Field(default_factory=list, description="Status code(s) that pass (int or list)")
    acceptable_statuses: Statuses = Field(default_factory=list, description="More codes that pass (legacy: acceptable, expected)")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("acceptable" in data or "expected" in data):
            data = dict(data)
            extra: list[Any] = []
            for key in ("acceptable", "expected"):
                if key in data:
                    value = data.pop(key)
                    extra += _as_statuses(value)
                    note(f"'{key}' -> acceptable_statuses")
            data["acceptable_statuses"] = _as_statuses(data.get("acceptable_statuses")) + extra
        return data

    @property
    def statuses(self) -> set[int]:
        return set(self.expected_status) | set(self.acceptable_statuses)


@primitive("P15", P15Inputs)
def status_code_assert(inputs: P15Inputs, ctx: RunContext) -> StepResult:
    """The last response's status is one of the expected codes (2xx when none are given)."""
    response = ctx.last_response
    if response is None:
        return StepResult(passed=False, message="no HTTP response to check (no earlier request in this run answered)")
    status = response.status
    wanted = inputs.statuses
    expects_2xx = not wanted or any(200 <= s < 300 for s in wanted)
    rule = f"one of {sorted(wanted)}" if wanted else "2xx"
    ok = status in wanted if wanted else 200 <= status < 300
    evidence = {"status": status, "expected": sorted(wanted) or "2xx", "method": response.method, "url": response.url}
    if not ok and ctx.options.compat == "reference" and expects_2xx:
        if already_exists(response):
            return StepResult(passed=True, evidence={**evidence, "compat": "already-exists"},
                              message=f"status {status} (expected {rule}) accepted by compat reference: body says the entity already exists")
        if response.method == "DELETE" and status == 404:
            return StepResult(passed=True, evidence={**evidence, "compat": "delete-404"},
                              message=f"DELETE answered 404 (expected {rule}) accepted by compat reference")
    message = f"{response.method} {response.url} -> {status}; expected {rule}"
    if not ok:
        message += f"; body: {excerpt(response.text, 300)}"
    return StepResult(passed=ok, message=message, evidence=evidence, value=status)


# --- P16 -----------------------------------------------------------------------------------------
class P16Inputs(PrimitiveInputs):
    max_ms: float = Field(default=5000.0, gt=0, description="Budget in milliseconds (legacy: threshold_ms, max_response_time_ms)")
    method: str = Field(default="GET", description="Method of the fresh request, when path is given")
    path: str | None = Field(default=None, description="Send a fresh request (as the active identity) and time it")

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("threshold_ms", "max_response_time_ms"):
                if key in data:
                    data = dict(data)
                    value = data.pop(key)
                    data.setdefault("max_ms", value)
                    note(f"'{key}' -> max_ms")
        return data


@primitive("P16", P16Inputs)
def response_time_check(inputs: P16Inputs, ctx: RunContext) -> StepResult:
    """The last (or a fresh) response arrived within ``max_ms`` (time to the full body)."""
    evidence: dict[str, Any] = {"max_ms": inputs.max_ms}
    if inputs.path is not None:
        sent = send(ctx, inputs.method, inputs.path, identity=ctx.auth.active,
                    timeout_s=max(inputs.max_ms / 1000 * 2, 1.0))
        evidence.update(response_evidence(sent))
        if sent.response is None:
            forget_response(ctx)
            return StepResult(passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence)
        ctx.set_response(sent.response)
    response = ctx.last_response
    if response is None:
        return StepResult(passed=False, message="no HTTP response to time (no earlier request in this run answered)", evidence=evidence)
    elapsed = response.elapsed_ms
    evidence.update(elapsed_ms=round(elapsed, 1), url=response.url)
    ok = elapsed <= inputs.max_ms
    return StepResult(passed=ok, evidence=evidence, value=elapsed,
                      message=f"{response.method} {response.url} took {elapsed:.0f} ms; budget {inputs.max_ms:g} ms")
