"""HTTP primitives: P04 request, P05 CRUD, P14 permission, P15 status, P16 time, P22 GraphQL, P23 upload, P26 search, P29 workflow.

Every response received becomes the run's *last response* (``ctx.set_response``), which later
P06/P07/P15/P16 steps read. The app under test is untrusted: transport errors, oversized bodies,
non-JSON bodies and odd statuses end in ``passed=False`` with a message, never in an exception
(exceptions are reserved for harness bugs; the engine turns them into ERROR).

Authentication follows the active identity (set by P13), with two deliberate exceptions that
real DAGs rely on to send "no token" and "invalid token" requests: a step that gives ``headers``
(even ``{}``) or ``skip_auth: true`` sends neither the identity's headers nor its cookies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mimetypes
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

import httpx
from pydantic import BeforeValidator, Field, field_validator, model_validator

from saasbench.dag import StepDefect, note, warn
from saasbench.dag.jsonpath import ABSENT, PathError, parse
from saasbench.dag.jsonpath import evaluate as path_value
from saasbench.dag.placeholders import MUSTACHE, SHELL, UnresolvedPlaceholder, to_text
from saasbench.evaluation.context import RunContext, extract_id
from saasbench.evaluation.results import StepResult
from saasbench.primitives.assertions import (
    MAX_REGEX_SUBJECT,
    UNARY,
    Assertion,
    Doc,
    check,
    short,
    type_name,
    values_equal,
)
from saasbench.primitives.registry import PrimitiveInputs, primitive, rename_aliases
from saasbench.services.auth import LoginFailed
from saasbench.services.http import (
    HttpResponse,
    Identity,
    RequestDeadline,
    ResponseTooLarge,
    bounded_client,
    request_deadline,
)

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


def _query_value(value: Any) -> Any:
    """A query-string value as the DAG means it: true/false lower-case, null empty, lists repeated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return [_query_value(v) for v in value]
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict) else str(value)


def _drop_pseudo_statuses(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Integers outside 100-599 next to real status codes (gmdnohlg ``[401, 403, 404, 997]``, a
    harness sentinel) can never match a response: dropped with a warning. If nothing real is
    left, the list is kept so the step is refused (dropping all would silently mean 2xx)."""

    def fake(item: Any) -> bool:
        n = int(item.strip()) if isinstance(item, str) and item.strip().isdigit() else item
        return isinstance(n, int) and not isinstance(n, bool) and not 100 <= n <= 599

    def items(value: Any) -> list[Any]:
        return list(value) if isinstance(value, (list, tuple, set)) else [] if value is None else [value]

    present = [k for k in keys if k in data]
    everything = [x for k in present for x in items(data[k])]
    if not any(fake(x) for x in everything) or all(fake(x) for x in everything):
        return data
    data = dict(data)
    for key in present:
        bad = [x for x in items(data[key]) if fake(x)]
        if bad:
            data[key] = [x for x in items(data[key]) if not fake(x)]
            warn(
                f"{', '.join(map(str, bad))} is not an HTTP status code and can never match (dropped; a DAG defect)",
                key,
            )
    return data


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
    return _dispatch(
        ctx,
        method,
        path,
        lambda: _body_kwargs(body, headers or {}),
        headers=headers,
        identity=identity,
        timeout_s=timeout_s,
    )


def _dispatch(
    ctx: RunContext,
    method: str,
    path: str,
    kwargs_fn: Any,
    *,
    headers: dict[str, str] | None,
    identity: Identity | None,
    timeout_s: float | None,
) -> Sent:
    """Send with request kwargs from ``kwargs_fn()``; the one mapping of transport errors to ``Sent``."""
    url = ctx.http.url(path)
    out = Sent(method=method, url=url, identity=identity.role if identity is not None else "none")
    if identity is not None and not ctx.http.is_app_origin(url):  # the client withholds them (services/http.py)
        out.identity = f"none: another origin than the app's, credentials of {identity.role!r} not sent"
    timeout = ctx.timeout(timeout_s)
    try:
        kwargs = kwargs_fn()
        out.response = ctx.http.request(method, path, identity=identity, headers=headers, timeout_s=timeout, **kwargs)
    except ResponseTooLarge as exc:
        out.error = f"{method} {url}: {exc}"
    except RequestDeadline as exc:
        out.error, out.unreachable = deadline_message(ctx, f"{method} {url}", exc), True
    except httpx.TimeoutException:
        out.error, out.unreachable = f"{method} {url}: no response within {timeout:g}s (timeout)", True
    except httpx.ConnectError as exc:
        out.error, out.unreachable = f"{method} {url}: cannot connect ({exc or 'connection refused'})", True
    except httpx.HTTPError as exc:
        out.error, out.unreachable = f"{method} {url}: transport error {type(exc).__name__}: {exc}", True
    except (httpx.InvalidURL, UnicodeError) as exc:  # unusable URL or non-ASCII header text from DAG data
        out.error = f"{method} {url}: cannot build the request: {exc}"
    return out


def deadline_message(ctx: RunContext, what: str, exc: RequestDeadline) -> str:
    """``deadline: response body still arriving after 120s, the node's timeout (GET url: 37 bytes read)`` when the node's
    deadline cut the request, else the request's own timeout: ``GET url: no complete response within 5s (timeout)``."""
    if ctx.cut_by_deadline(exc.seconds):
        budget = ctx.node_budget_s if ctx.node_budget_s is not None else exc.seconds
        if exc.phase == "body":
            return (
                f"deadline: response body still arriving after {budget:g}s, the node's timeout "
                f"({what}: {exc.received} bytes read)"
            )
        return f"deadline: no complete response after {budget:g}s, the node's timeout ({what})"
    return f"{what}: {exc} (timeout)"


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
def _capture_aliases(data: dict[str, Any]) -> None:
    """hhrdixum: ``save_response_id_as: "var"`` and ``save_response_field_as`` (``{field, var}`` or ``{var: field}``)."""
    rename_aliases(data, "save_id_as", ("save_response_id_as",))
    fields = data.pop("save_response_field_as", None)
    if fields is None:
        return
    if isinstance(fields, dict) and set(fields) == {"field", "var"}:
        fields = {fields["var"]: fields["field"]}
    if isinstance(fields, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        data["capture_fields"] = {**fields, **(data.get("capture_fields") or {})}
        note("save_response_field_as -> capture_fields {var: field}")
    else:
        warn(
            f"save_response_field_as {fields!r} is neither {{field, var}} nor {{var: field}} (ignored; a DAG defect)",
            "save_response_field_as",
        )


def _capture_fields(
    ctx: RunContext, body: Any, save_id_as: str | None, fields: Mapping[str, str], created: Any = None
) -> list[str]:
    """Capture the response id / fields named by save_id_as and capture_fields; the failures."""
    failures: list[str] = []
    if save_id_as:
        found = created if created is not None else extract_id(body)
        if (
            found is None
            and isinstance(body, dict)
            and isinstance(body.get("pk"), (str, int))
            and not isinstance(body["pk"], bool)
        ):
            found = body["pk"]  # Django REST framework's primary key
        if found is None:
            failures.append(f"save_id_as {save_id_as}: the response has no id")
        else:
            ctx.capture(save_id_as, found)
    for var, field in fields.items():
        try:
            value = path_value(field if field.startswith("$") else "$." + field, body)
        except PathError as exc:
            value, why = ABSENT, str(exc)
        else:
            why = "absent from the response"
        if value is ABSENT:
            failures.append(f"capture {var}: field {field!r} {why}")
        else:
            ctx.capture(var, value)
    return failures


class HttpFields(PrimitiveInputs):
    """Base of inputs that carry an HTTP ``method`` and ``headers``: one normalisation for both."""

    @field_validator("method", mode="before", check_fields=False)
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @field_validator("headers", mode="before", check_fields=False)
    @classmethod
    def _check_headers(cls, value: Any) -> dict[str, str] | None:
        return _string_headers(value)


class P04Inputs(HttpFields):
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
    save_id_as: str | None = Field(
        default=None,
        description="Capture the id of the entity in the response body (id, uuid, "
        "pk, or under data/result/item) as {{name}} (legacy: save_response_id_as); none fails the step",
    )
    capture_fields: dict[str, str] = Field(
        default_factory=dict,
        description="{{var}} -> field of the response body (dotted or "
        "'$.path'; legacy: save_response_field_as); a field that is absent fails the step",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            _capture_aliases(data)
            rename_aliases(data, "path", ("url",))  # ychlukjm: {"url": "http://localhost:9201/..."}
            rename_aliases(
                data, "body", ("raw_body",)
            )  # orghjavi: "raw_body": "{not_valid_json" (a string is sent verbatim)
            for key in ("query", "params", "query_params"):  # egsszeqg "query", orghjavi "params": the query string
                if isinstance(data.get(key), dict) and isinstance(data.get("path"), str):
                    query = urlencode({k: _query_value(v) for k, v in data.pop(key).items()}, doseq=True)
                    if query:
                        data["path"] += ("&" if "?" in data["path"] else "?") + query
                    note(f"'{key}' -> query string of the path")
            if data.get("no_auth") is True and "skip_auth" not in data:  # gmdnohlg
                data.pop("no_auth")
                data["skip_auth"] = True
                note("'no_auth' -> 'skip_auth'")
        return data


@primitive("P04", P04Inputs)
def http_request(inputs: P04Inputs, ctx: RunContext) -> StepResult:
    """Send one request; passes when any response arrives (statuses are P15's business)."""
    plain = inputs.skip_auth or inputs.headers is not None
    sent = send(
        ctx,
        inputs.method,
        inputs.path,
        body=inputs.body,
        headers=inputs.headers,
        identity=None if plain else ctx.auth.active,
        timeout_s=inputs.timeout,
    )
    evidence = response_evidence(sent)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(
            passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence
        )
    ctx.set_response(sent.response)
    record = sent.response.record()
    for name in (inputs.save_as, inputs.capture_response_as):
        if name:
            ctx.capture(name, record)
    r = sent.response
    message = f"{inputs.method} {inputs.path} -> {r.status} in {r.elapsed_ms:.0f} ms"
    failures = _capture_fields(ctx, r.body, inputs.save_id_as, inputs.capture_fields)
    if failures:
        return StepResult(passed=False, value=record, evidence=evidence, message=f"{message}; " + "; ".join(failures))
    return StepResult(passed=True, value=record, evidence=evidence, message=message)


# --- P05 -----------------------------------------------------------------------------------------
class P05Inputs(PrimitiveInputs):
    resource: str = Field(description="Collection path: POST here creates, <resource>/<id> reads/updates/deletes")
    create_body: Any = Field(default_factory=dict, description="JSON body of the create request")
    update_body: Any = Field(default=None, description="JSON body of the update; no update when absent")
    identifier_field: str = Field(
        default="id", description="Dotted path of the id in the created object (legacy: id_field)"
    )
    response_root: str | None = Field(
        default=None, description="Dotted path where the object lives in create/read bodies, e.g. 'data'"
    )
    update_method: Literal["PUT", "PATCH", "POST"] = Field(default="PUT", description="Method of the update request")
    update_to_base: bool = Field(default=False, description="Update at <resource> instead of <resource>/<id>")
    expected_create_status: Statuses = Field(default_factory=list, description="Default: 200 or 201")
    expected_read_fields: list[str] = Field(
        default_factory=list, description="Every one must be present in the read object"
    )
    expected_update_status: Statuses = Field(default_factory=list, description="Default: 200 or 204")
    expected_delete_status: Statuses = Field(default_factory=list, description="Default: 200, 202 or 204")
    keep_alive: bool = Field(
        default=False,
        description="Keep the entity for later nodes: after the delete, re-create it from "
        "create_body (new created_id), so later nodes find its create-time values",
    )
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

    def call(
        name: str, method: str, path: str, body: Any, ok: "set[int] | frozenset[int]"
    ) -> tuple[dict[str, Any], Sent]:
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

    create, sent = call(
        "create", "POST", inputs.resource, inputs.create_body, set(inputs.expected_create_status or (200, 201))
    )
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
            call(
                "update",
                inputs.update_method,
                inputs.resource if inputs.update_to_base else item,
                inputs.update_body,
                set(inputs.expected_update_status or (200, 204)),
            )
        if not inputs.skip_delete:
            delete, sent_delete = call(
                "delete", "DELETE", item, None, set(inputs.expected_delete_status or (200, 202, 204))
            )
            if (
                not delete["passed"]
                and reference
                and sent_delete.response is not None
                and sent_delete.response.status == 404
            ):
                delete.update(passed=True, compat="reference: DELETE answered 404 counts as deleted")
            if inputs.keep_alive:
                # later nodes need the entity with its create-time values: re-create it (family C)
                recreate, sent = call(
                    "recreate",
                    "POST",
                    inputs.resource,
                    inputs.create_body,
                    set(inputs.expected_create_status or (200, 201)),
                )
                new_id = (
                    _created_id(sent.response.body, inputs)
                    if recreate["passed"] and sent.response is not None
                    else None
                )
                if recreate["passed"] and new_id is None:
                    recreate.update(passed=False, message=f"no {inputs.identifier_field!r} in the re-create response")
                if new_id is not None:
                    created_id = new_id
                    ctx.capture("created_id", created_id)
                    ctx.last_created_id = created_id

    passed_count = sum(1 for s in steps if s["passed"])
    result = {"created_id": created_id, "steps": steps, "steps_passed": passed_count, "steps_total": len(steps)}
    # What a following P07 reads: the create (or re-create) response body, as family C does; the
    # summary's keys fill in only where the body has no such key (family D asserts $.steps_passed).
    body = sent.response.body if sent.response is not None and sent.response.method == "POST" else None
    ctx.last_document = {**result, **body} if isinstance(body, dict) else (body if body is not None else result)
    summary = ", ".join(_step_text(s) for s in steps)
    return StepResult(
        passed=passed_count == len(steps),
        value=result,
        unreachable=sent.unreachable,
        message=f"{passed_count}/{len(steps)} CRUD sub-steps as expected: {summary}",
        evidence={"requests": requests, "steps": steps},
    )


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
NOT_DENIED_REFUSALS = frozenset({401, 403})  # expected_result not_denied: any other status passes (sgdoserd)


class P14Inputs(PrimitiveInputs):
    method: str = Field(default="GET", description="HTTP method of the action")
    path: str = Field(description="Path of the action (or give action: 'METHOD /path')")
    role: str | None = Field(
        default=None, description="Log in as this role for the check; the previous identity is restored after"
    )
    token: str | None = Field(
        default=None, description="Explicit bearer token (e.g. an invalid one) instead of an identity"
    )
    body: Any = Field(default=None, description="Request body (JSON)")
    expected_result: Literal["allowed", "denied", "not_denied"] | None = Field(
        default=None,
        description="Default: denied if every given status is >= 400, else allowed; not_denied (sgdoserd): "
        "any status but 401/403 passes",
    )
    expected_status: Statuses = Field(
        default_factory=list,
        description="Status code(s) that pass; with expected_result: denied they "
        "are added to the deny set, otherwise they replace the class defaults",
    )
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
                if not action.strip().startswith(("/", "http://", "https://", "{{", "${")):
                    warn(
                        f"action {action.strip()!r} is not 'METHOD /path' (a capability name, not an HTTP route): it is "
                        f"requested as {data.get('method', 'GET')} /{action.strip()}",
                        "action",
                    )
            note("action 'METHOD /path' -> method + path")
        rename_aliases(
            data, "expected_status", ("expected_statuses",)
        )  # hhrdixum: "expected_statuses": [400, 401, 403]
        result = data.get("expected_result")
        if isinstance(result, str):
            lowered = result.strip().lower()
            data["expected_result"] = {
                "allow": "allowed",
                "permitted": "allowed",
                "deny": "denied",
                "forbidden": "denied",
                "rejected": "denied",
            }.get(lowered, lowered)
            if lowered in ("denied_or_allowed", "allowed_or_denied", "either", "any"):
                # orghjavi dag_source: a "relaxed" check whose listed statuses decide, whichever class they are
                data.pop("expected_result")
                if _as_statuses(data.get("expected_status")) or _as_statuses(data.get("acceptable_statuses")):
                    note(f"expected_result {result!r} -> no allow/deny class: the listed statuses decide")
                else:
                    warn(
                        f"expected_result {result!r} with no statuses: nothing decides between allowed and denied, "
                        "so the default (allowed = 2xx/3xx) applies (a DAG defect)",
                        "expected_result",
                    )
            elif lowered in ("not_denied", "not denied", "notdenied"):
                data["expected_result"] = "not_denied"  # sgdoserd: passed = actual not in (401, 403)
                if _as_statuses(data.get("expected_status")) or _as_statuses(data.get("acceptable_statuses")):
                    warn(
                        "expected_result 'not_denied' ignores expected_status/acceptable_statuses (any status but "
                        "401/403 passes, as in the sgdoserd reference; a DAG defect)",
                        "expected_result",
                    )
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
                return StepResult(
                    passed=False,
                    unreachable=True,
                    message=f"login as {inputs.role!r} failed: {type(exc).__name__}: {exc}",
                )
        sent = send(ctx, inputs.method, inputs.path, body=inputs.body, headers=headers, identity=identity)
    finally:
        ctx.auth.active = previous
    evidence = response_evidence(sent)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(
            passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence
        )
    ctx.set_response(sent.response)
    status = sent.response.status
    wanted = inputs.outcome
    if wanted == "not_denied":
        ok, rule = status not in NOT_DENIED_REFUSALS, f"not denied (not {sorted(NOT_DENIED_REFUSALS)})"
    elif inputs.statuses and inputs.expected_result == "denied":
        # a declared status widens the deny set (a 404 for a hidden record is a denial too)
        allowed_set = inputs.statuses | DENIED_DEFAULT
        ok, rule = status in allowed_set, f"denied ({sorted(allowed_set)})"
    elif inputs.statuses:
        ok, rule = status in inputs.statuses, f"one of {sorted(inputs.statuses)}"
    elif wanted == "denied":
        ok, rule = status in DENIED_DEFAULT, f"denied ({sorted(DENIED_DEFAULT)})"
    else:
        ok, rule = 200 <= status < 400, "allowed (2xx/3xx)"
    who = (
        f"role {inputs.role!r}"
        if inputs.role
        else ("the given token" if inputs.token else f"identity {previous.role!r}")
    )
    verdict = "as expected" if ok else "NOT as expected"
    return StepResult(
        passed=ok,
        value=sent.response.record(),
        evidence={**evidence, "expected": wanted},
        message=f"{inputs.method} {inputs.path} as {who} -> {status}; expected {wanted}: {rule}; {verdict}",
    )


# --- P15 -----------------------------------------------------------------------------------------
class P15Inputs(PrimitiveInputs):
    expected_status: Statuses = Field(default_factory=list, description="Status code(s) that pass (int or list)")
    acceptable_statuses: Statuses = Field(
        default_factory=list, description="More codes that pass (legacy: acceptable, expected)"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = _drop_pseudo_statuses(data, ("expected_status", "acceptable_statuses", "acceptable", "expected"))
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
            return StepResult(
                passed=True,
                evidence={**evidence, "compat": "already-exists"},
                message=f"status {status} (expected {rule}) accepted by compat reference: body says the entity already exists",
            )
        if response.method == "DELETE" and status == 404:
            return StepResult(
                passed=True,
                evidence={**evidence, "compat": "delete-404"},
                message=f"DELETE answered 404 (expected {rule}) accepted by compat reference",
            )
    message = f"{response.method} {response.url} -> {status}; expected {rule}"
    if not ok:
        message += f"; body: {excerpt(response.text, 300)}"
    return StepResult(passed=ok, message=message, evidence=evidence, value=status)


# --- P16 -----------------------------------------------------------------------------------------
class P16Inputs(PrimitiveInputs):
    max_ms: float = Field(
        default=5000.0, gt=0, description="Budget in milliseconds (legacy: threshold_ms, max_response_time_ms)"
    )
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
        sent = send(
            ctx, inputs.method, inputs.path, identity=ctx.auth.active, timeout_s=max(inputs.max_ms / 1000 * 2, 1.0)
        )
        evidence.update(response_evidence(sent))
        if sent.response is None:
            forget_response(ctx)
            return StepResult(
                passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence
            )
        ctx.set_response(sent.response)
    response = ctx.last_response
    if response is None:
        return StepResult(
            passed=False,
            message="no HTTP response to time (no earlier request in this run answered)",
            evidence=evidence,
        )
    elapsed = response.elapsed_ms
    evidence.update(elapsed_ms=round(elapsed, 1), url=response.url)
    ok = elapsed <= inputs.max_ms
    return StepResult(
        passed=ok,
        evidence=evidence,
        value=elapsed,
        message=f"{response.method} {response.url} took {elapsed:.0f} ms; budget {inputs.max_ms:g} ms",
    )


# =================================================================================================
# P22 graphql_request, P23 file_upload, P26 search_query, P29 multi_step_workflow
# =================================================================================================
# Shared rules: every response received becomes the last response; transport errors fail the step
# with ``unreachable``; values captured from the app are untrusted (spliced into GraphQL text only
# as escaped string content, bound as SQL parameters, and never allowed to move a request to
# another origin).
_CAPTURE_NAME = re.compile(r"^[A-Za-z_][\w-]*$")
_ANY_PLACEHOLDER = re.compile(f"{MUSTACHE.pattern}|{SHELL.pattern}")  # the resolver's own grammar
_GQL_BARE_TOKEN = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)$")
MAX_LISTED_ERRORS = 3
MAX_SCANNED_RESULTS = 1000
MAX_SCANNED_SCALARS = 5000
DEFAULT_MAX_DOWNLOAD_BYTES = 10 * 1024 * 1024
MAX_UPLOAD_BYTES = 20 * 1024 * 1024


def _identity_for(
    ctx: RunContext, token: Any, token_given: bool, skip_auth: bool = False
) -> tuple[Identity | None, dict[str, str], str]:
    """(identity, extra headers, label): no ``token`` -> the active identity; ``""``/null -> anonymous;
    any other token -> ``Authorization: Bearer <token>`` and no identity (no cookies either)."""
    if skip_auth:
        return None, {}, "anonymous"
    if not token_given:
        return ctx.auth.active, {}, f"identity {ctx.auth.active.role!r}"
    if token is None or (isinstance(token, str) and not token.strip()):
        return None, {}, "anonymous"
    return None, _bearer(str(token)), "the given token"


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = httpx.URL(url)
    return parsed.scheme, parsed.host, parsed.port


def _same_origin(ctx: RunContext, url: str) -> bool:
    try:
        return _origin(url) == _origin(ctx.http.url("/"))
    except (httpx.InvalidURL, ValueError):
        return False


def _is_absolute(text: Any) -> bool:
    return isinstance(text, str) and text.strip().lower().startswith(("http://", "https://"))


def _origin_error(ctx: RunContext, template: Any, resolved: str) -> str | None:
    """A path whose placeholders resolved to another origin (a captured absolute URL) is refused:
    the active identity's credentials must never be sent to a host the DAG did not name."""
    if _is_absolute(template) or _same_origin(ctx, ctx.http.url(resolved)):
        return None
    return f"{resolved!r} leads outside the app's origin after placeholder resolution; not requested"


# --- P22 -----------------------------------------------------------------------------------------
class GraphQLFind(PrimitiveInputs):
    """``{from: "$.list", find: {dotted: value}, extract: "dotted"}``: pick a list element and capture part of it."""

    from_: str = Field(alias="from", description="Path (from the response body) of the list to search")
    find: dict[str, Any] = Field(
        default_factory=dict, description="Dotted field -> value every one must equal; {} = first element"
    )
    extract: str | None = Field(
        default=None, description="Dotted path inside the found element; absent = the whole element"
    )


def _check_path(value: str) -> str:
    if not _ANY_PLACEHOLDER.search(value):
        try:
            parse(value)
        except PathError as exc:
            raise ValueError(str(exc)) from exc
    return value


class P22Inputs(PrimitiveInputs):
    endpoint: str = Field(
        default="/graphql", description="GraphQL endpoint path (legacy: path, url), e.g. /graphql or /metadata"
    )
    query: str = Field(
        min_length=1,
        description="GraphQL document. Placeholders inside string literals are spliced "
        "escaped; outside literals only names/numbers/booleans/null are allowed (prefer variables)",
    )
    variables: dict[str, Any] | None = Field(
        default=None, description="GraphQL variables (JSON; placeholders keep their raw type)"
    )
    operation_name: str | None = Field(
        default=None, description="operationName, for documents with several operations (legacy: operationName)"
    )
    expect_no_errors: bool = Field(
        default=False,
        description="Fail on a non-empty 'errors' array, a non-2xx status or a body that is not a GraphQL response",
    )
    expect_data_path: str | None = Field(
        default=None, description="Path that must be present and non-null: '$.…' from the body, else relative to 'data'"
    )
    store_as: dict[str, str | GraphQLFind] = Field(
        default_factory=dict,
        description="ctx key -> '$.path', or -> {from, find, extract}; a capture that finds nothing fails the step",
    )
    token: str | None = Field(
        default=None, description="Explicit bearer token; '' = anonymous; absent = the active identity"
    )
    skip_auth: bool = Field(default=False, description="Send no auth headers and no cookies")
    timeout: float | None = Field(default=None, gt=0, description="Seconds; bounded by the node deadline")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "endpoint", ("path", "url"))
            rename_aliases(data, "operation_name", ("operationName",))
            if isinstance(data.get("store_as"), str):  # ychlukjm: "store_as": "revoke_token" -> the whole body
                name = data["store_as"]
                data["store_as"] = {name: "$"}
                note(f"store_as {name!r} (a name) -> {{{name!r}: '$'}} (the whole response body)")
        return data

    @field_validator("store_as")
    @classmethod
    def _store_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, spec in value.items():
            if not _CAPTURE_NAME.match(name):
                raise ValueError(f"store_as name {name!r} is not an identifier")
            for path in [spec] if isinstance(spec, str) else [spec.from_] + ([spec.extract] if spec.extract else []):
                _check_path(path)
        return value

    @field_validator("expect_data_path")
    @classmethod
    def _data_path(cls, value: str | None) -> str | None:
        return None if value is None else _check_path(value)


def render_graphql(ctx: RunContext, query: str) -> str:
    """Resolve the placeholders of a GraphQL document without letting a value change its structure.

    Inside ``"…"`` a value is spliced with JSON escaping (valid GraphQL escapes); inside ``\"\"\"…\"\"\"``
    only ``\"\"\"`` is escaped; outside literals a value must be a number, boolean, null, list of
    those, or a bare name/number (enum values, ids without quotes); anything else raises ValueError.
    Comments are copied untouched. Raises UnresolvedPlaceholder for unknown names.
    """
    out: list[str] = []
    i, n, state = 0, len(query), None  # None | "str" | "block"
    while i < n:
        m = _ANY_PLACEHOLDER.match(query, i)
        if m:
            out.append(_gql_splice(ctx.resolve(m.group(0)), state, m.group(0)))
            i = m.end()
            continue
        ch = query[i]
        if state is None:
            if query.startswith('"""', i):
                state, step = "block", 3
            elif ch == '"':
                state, step = "str", 1
            elif ch == "#":
                end = query.find("\n", i)
                step = (n if end < 0 else end) - i
            else:
                step = 1
        elif state == "str":
            step = 2 if ch == "\\" else 1
            if ch in '"\n':
                state = None
        else:
            if query.startswith('\\"""', i):
                step = 4
            elif query.startswith('"""', i):
                state, step = None, 3
            else:
                step = 1
        out.append(query[i : i + step])
        i += step
    return "".join(out)


def _gql_splice(value: Any, state: str | None, placeholder: str) -> str:
    if state == "str":
        return json.dumps(to_text(value), ensure_ascii=False)[1:-1]
    if state == "block":
        return to_text(value).replace('"""', '\\"""')
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, list) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and _GQL_BARE_TOKEN.match(value):
        return value
    raise ValueError(
        f"{placeholder} is outside a GraphQL string literal and its value {short(value, 60)} is not a "
        "name, number, boolean or null; quote it in the query or pass it in variables"
    )


def graphql_errors(body: Any) -> list[Any]:
    """The ``errors`` entries of a GraphQL body ([] when none; a non-list ``errors`` counts as one)."""
    if not isinstance(body, dict) or body.get("errors") in (None, [], {}):
        return []
    errors = body["errors"]
    return errors if isinstance(errors, list) else [errors]


def _error_text(errors: list[Any]) -> str:
    shown = []
    for err in errors[:MAX_LISTED_ERRORS]:
        msg = err.get("message") if isinstance(err, dict) else err
        code = (
            err.get("extensions", {}).get("code")
            if isinstance(err, dict) and isinstance(err.get("extensions"), dict)
            else None
        )
        shown.append(short(msg, 160).strip('"') + (f" [{short(code, 40).strip(chr(34))}]" if code is not None else ""))
    more = f" (+{len(errors) - MAX_LISTED_ERRORS} more)" if len(errors) > MAX_LISTED_ERRORS else ""
    return f"{len(errors)} GraphQL error(s): " + "; ".join(shown) + more


def _gql_capture(spec: str | GraphQLFind, body: Any) -> tuple[Any, str]:
    """The value a store_as entry names, or ABSENT and why."""
    if isinstance(spec, str):
        try:
            value = path_value(spec, body)
        except PathError as exc:
            return ABSENT, str(exc)
        return value, f"{spec} matched nothing"
    try:
        items = path_value(spec.from_, body)
    except PathError as exc:
        return ABSENT, str(exc)
    if not isinstance(items, list):
        return ABSENT, f"{spec.from_} is {type_name(items)}, not a list"
    for item in items[:MAX_SCANNED_RESULTS]:
        try:
            if all(values_equal(path_value(k, item), v) for k, v in spec.find.items()):
                if spec.extract is None:
                    return item, ""
                return path_value(spec.extract, item), f"found element has no {spec.extract}"
        except PathError as exc:
            return ABSENT, str(exc)
    capped = f" (first {MAX_SCANNED_RESULTS} of {len(items)} scanned)" if len(items) > MAX_SCANNED_RESULTS else ""
    return ABSENT, f"no element of {spec.from_} matches {short(spec.find, 120)}{capped}"


def _gql_created_id(query: str, body: Any) -> Any:
    """The id a mutation returned: ``{data: {createX: {id}}}`` (one root field) or a scalar root field."""
    if (
        not query.lstrip().startswith("mutation")
        or not isinstance(body, dict)
        or not isinstance(body.get("data"), dict)
    ):
        return None
    fields = list(body["data"].values())
    if len(fields) != 1:
        return None
    return extract_id(fields[0])


@primitive("P22", P22Inputs, raw_fields={"query"})
def graphql_request(inputs: P22Inputs, ctx: RunContext) -> StepResult:
    """POST {query, variables, operationName} as the active identity; the response becomes the last response."""
    try:
        query = render_graphql(ctx, inputs.query)
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, message=f"query: {exc}", evidence={"placeholder": exc.placeholder})
    except ValueError as exc:
        return StepResult(passed=False, message=f"query: {exc}")
    payload: dict[str, Any] = {"query": query}
    if inputs.variables is not None:
        payload["variables"] = inputs.variables
    if inputs.operation_name:
        payload["operationName"] = inputs.operation_name
    identity, headers, who = _identity_for(ctx, inputs.token, "token" in inputs.model_fields_set, inputs.skip_auth)
    sent = send(
        ctx, "POST", inputs.endpoint, body=payload, headers=headers or None, identity=identity, timeout_s=inputs.timeout
    )
    evidence = response_evidence(sent)
    evidence["query_excerpt"] = excerpt(query, 500)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(
            passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence
        )
    response = sent.response
    ctx.set_response(response)
    body = response.body
    created = _gql_created_id(query, body)
    if created is not None:
        ctx.last_created_id = created
        ctx.node_scope.setdefault("created_id", created)
    errors = graphql_errors(body)
    is_graphql = isinstance(body, dict) and ("data" in body or "errors" in body)
    evidence.update(graphql_errors=len(errors), graphql_response=is_graphql)
    head = f"POST {inputs.endpoint} as {who} -> {response.status}"
    failures: list[str] = []
    if inputs.expect_no_errors:
        if errors:
            failures.append(_error_text(errors))
        if not 200 <= response.status < 300:
            failures.append(f"status {response.status}, expected 2xx")
        if not is_graphql:
            failures.append(f"not a GraphQL response (no data/errors object): {excerpt(response.text, 200)}")
    if inputs.expect_data_path:
        base = (
            body if inputs.expect_data_path.lstrip().startswith("$") or not isinstance(body, dict) else body.get("data")
        )
        try:
            found = path_value(inputs.expect_data_path, base) if base is not None else ABSENT
        except PathError as exc:
            found, failures = ABSENT, failures + [str(exc)]
        if found is ABSENT or found is None:
            failures.append(f"expect_data_path {inputs.expect_data_path}: {short(found)}")
    captured: dict[str, str] = {}
    for name, spec in inputs.store_as.items():
        value, why = _gql_capture(spec, body)
        if value is ABSENT or value is None:
            failures.append(f"store_as {name}: {why if value is ABSENT else 'value is null'}")
        else:
            ctx.capture(name, value)
            captured[name] = short(value, 80)
    if captured:
        evidence["captured"] = captured
    if failures:
        return StepResult(
            passed=False, value=response.record(), evidence=evidence, message=f"{head}; " + "; ".join(failures)
        )
    note_errors = f"; {_error_text(errors)} (allowed: expect_no_errors is false)" if errors else ""
    return StepResult(passed=True, value=response.record(), evidence=evidence, message=head + note_errors)


# --- P23 -----------------------------------------------------------------------------------------
class UploadGraphQL(PrimitiveInputs):
    """GraphQL multipart request spec: operations + map + file part '0'."""

    endpoint: str = Field(default="/graphql", description="GraphQL endpoint receiving the multipart request")
    query: str = Field(
        min_length=1, description="The upload mutation, e.g. mutation($file: Upload!) { uploadFile(file: $file) }"
    )
    variables: dict[str, Any] = Field(default_factory=dict, description="Other variables of the mutation")
    file_variable: str = Field(
        default="file", description="Variable that receives the file (mapped as variables.<name>)"
    )
    operation_name: str | None = Field(default=None, description="operationName")


class UploadSpec(PrimitiveInputs):
    method: str = Field(default="POST", description="HTTP method of the upload")
    path: str = Field(
        default="/upload", description="Upload path (for a GraphQL upload, graphql.endpoint is used instead)"
    )
    file_name: str = Field(default="saasbench-upload.txt", description="File name of the part (legacy: filename)")
    file_content: str | None = Field(
        default=None, description="'base64:<data>' or text (UTF-8); absent = a sample file for the name"
    )
    file_size_kb: int | None = Field(
        default=None,
        gt=0,
        le=MAX_UPLOAD_BYTES // 1024,
        description="Generate a deterministic file of this size instead",
    )
    content_type: str | None = Field(default=None, description="Part content type; default guessed from the name")
    file_field: str = Field(default="file", description="Form field of the file part (legacy: field_name)")
    fields: dict[str, Any] = Field(default_factory=dict, description="Extra form fields (legacy: extra_fields)")
    expected_status: Statuses = Field(
        default_factory=list, description="Statuses that pass (legacy: acceptable_statuses merged); default 2xx"
    )
    id_path: str | None = Field(
        default=None,
        description="Path of the created id in the upload response; default id/uuid (also under data/result/item)",
    )
    graphql: UploadGraphQL | None = Field(
        default=None, description="Upload through a GraphQL multipart mutation instead of a form"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "file_name", ("filename",))
            rename_aliases(data, "file_field", ("field_name",))
            rename_aliases(data, "fields", ("extra_fields",))
            if "acceptable_statuses" in data:
                data["expected_status"] = _as_statuses(data.get("expected_status")) + _as_statuses(
                    data.pop("acceptable_statuses")
                )
                note("upload 'acceptable_statuses' -> expected_status")
        return data

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @field_validator("file_content")
    @classmethod
    def _decodable(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("base64:"):
            try:
                raw = base64.b64decode(value[len("base64:") :], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"file_content is not valid base64: {exc}") from exc
            if len(raw) > MAX_UPLOAD_BYTES:
                raise ValueError(f"file_content exceeds {MAX_UPLOAD_BYTES} bytes")
        return value

    def content(self) -> bytes:
        if self.file_content is not None:
            if self.file_content.startswith("base64:"):
                return base64.b64decode(self.file_content[len("base64:") :])
            return self.file_content.encode("utf-8")
        if self.file_size_kb:
            pattern = hashlib.sha256(self.file_name.encode()).digest()
            return (pattern * (self.file_size_kb * 1024 // len(pattern) + 1))[: self.file_size_kb * 1024]
        return _sample_file(self.file_name)


class DownloadSpec(PrimitiveInputs):
    path: str | None = Field(
        default=None,
        description="Download path; {{id}}/{{created_id}} is the uploaded id, {{upload.<field>}} a field of "
        "the upload response; absent = the response's url/short_url/short_path/download_url",
    )
    method: str = Field(default="GET", description="HTTP method of the download")
    expect_status: Statuses = Field(default_factory=list, description="Statuses that pass; default 200")
    expect_same_content: bool = Field(default=True, description="The downloaded bytes equal the uploaded ones (sha256)")
    max_bytes: int = Field(
        default=DEFAULT_MAX_DOWNLOAD_BYTES, gt=0, description="Stop reading (and fail) past this size"
    )

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)


class P23Inputs(PrimitiveInputs):
    upload: UploadSpec = Field(description="The multipart upload (the flat legacy form is moved here)")
    download: DownloadSpec | None = Field(
        default=None, description="Then download it and compare (placeholders resolved after the upload)"
    )
    token: str | None = Field(
        default=None, description="Explicit bearer token; '' = anonymous; absent = the active identity"
    )
    save_as: str | None = Field(default=None, description="Capture the upload response record under this name")
    save_id_as: str | None = Field(
        default=None, description="Capture the created id as {{name}} (as P04; legacy: save_response_id_as)"
    )
    capture_fields: dict[str, str] = Field(
        default_factory=dict, description="{{var}} -> field of the upload response (as P04)"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        _capture_aliases(data)
        if "upload" not in data and ("upload_path" in data or isinstance(data.get("files"), list)):
            # sgdoserd: {upload_path, form_fields, files: [{field, filename, content_type, content_b64}]}
            files = data.pop("files", None) or [{}]
            first = files[0] if isinstance(files[0], dict) else {}
            upload: dict[str, Any] = {
                "path": data.pop("upload_path", "/upload"),
                "fields": data.pop("form_fields", None) or {},
            }
            for src, dst in (("field", "file_field"), ("filename", "file_name"), ("content_type", "content_type")):
                if src in first:
                    upload[dst] = first[src]
            if "content_b64" in first:
                upload["file_content"] = "base64:" + str(first["content_b64"])
            upload["expected_status"] = [200, 201]
            data["upload"] = upload
            note("upload_path/form_fields/files[0] -> upload: {...} (one file part; passes on 200/201)")
            if len(files) > 1:
                warn(f"{len(files) - 1} more file part(s) not sent (one file per upload)", "files")
        flat = [
            k
            for k in (
                "method",
                "path",
                "file_name",
                "filename",
                "file_content",
                "file_size_kb",
                "content_type",
                "file_field",
                "field_name",
                "fields",
                "extra_fields",
                "expected_status",
                "acceptable_statuses",
                "id_path",
                "graphql",
            )
            if k in data
        ]
        if flat and "upload" not in data:
            data["upload"] = {k: data.pop(k) for k in flat}
            note("flat upload keys -> upload: {...}")
        return data


_DOWNLOAD_KEYS = ("url", "short_url", "short_path", "download_url", "downloadUrl", "path")


def _download(
    ctx: RunContext, method: str, url: str, identity: Identity | None, headers: dict[str, str], cap: int, timeout: float
) -> tuple[int | None, bytes | None, str | None, bool]:
    """Stream a download with its own byte cap, as the identity; (status, bytes, error, unreachable).

    Separate from the run's text-decoding client because the bytes themselves are compared.
    Redirects are not followed (a 302 is an observation). ``timeout`` is the total budget, as for
    every request (services/http.py); credentials go only to the app's origin.
    """
    if identity is not None and not ctx.http.is_app_origin(url):
        identity = None
    merged = dict(identity.headers) if identity is not None else {}
    merged.update(headers)
    if identity is not None and identity.cookies:
        cookie = "; ".join(f"{c.name}={c.value}" for c in identity.cookies.jar)
        if cookie:
            merged.setdefault("Cookie", cookie)
    size = 0
    try:
        with (
            bounded_client(timeout) as client,
            request_deadline(timeout),
            client.stream(method, url, headers=merged) as response,
        ):
            declared = response.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > cap:
                return (
                    response.status_code,
                    None,
                    f"download of {int(declared)} bytes exceeds the {cap}-byte cap; not read",
                    False,
                )
            chunks: list[bytes] = []
            try:
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > cap:
                        return (
                            response.status_code,
                            None,
                            f"download exceeds the {cap}-byte cap; reading stopped",
                            False,
                        )
                    chunks.append(chunk)
            except httpx.TimeoutException as exc:
                late = RequestDeadline(
                    f"download still arriving after {timeout:g}s ({size} bytes read)",
                    phase="body",
                    seconds=timeout,
                    received=size,
                )
                raise late from exc
            return response.status_code, b"".join(chunks), None, False
    except RequestDeadline as exc:
        return None, None, deadline_message(ctx, f"{method} {url}", exc), True
    except httpx.TimeoutException:
        return None, None, f"{method} {url}: no response within {timeout:g}s (timeout)", True
    except httpx.HTTPError as exc:
        return None, None, f"{method} {url}: {type(exc).__name__}: {exc}", True
    except (httpx.InvalidURL, UnicodeError) as exc:
        return None, None, f"{method} {url}: cannot build the request: {exc}", False


@primitive("P23", P23Inputs, raw_fields={"download"})
def file_upload(inputs: P23Inputs, ctx: RunContext) -> StepResult:
    """Multipart upload (form or GraphQL multipart), capture the created id, then optionally download and compare."""
    up = inputs.upload
    content = up.content()
    ctype = up.content_type or _mime(up.file_name)
    identity, headers, who = _identity_for(ctx, inputs.token, "token" in inputs.model_fields_set)
    if up.graphql is not None:
        gql = up.graphql
        variables = {**gql.variables, gql.file_variable: None}
        operations: dict[str, Any] = {"query": gql.query, "variables": variables}
        if gql.operation_name:
            operations["operationName"] = gql.operation_name
        data = {"operations": json.dumps(operations), "map": json.dumps({"0": [f"variables.{gql.file_variable}"]})}
        files = {"0": (up.file_name, content, ctype)}
        method, path = "POST", gql.endpoint
        headers = {**headers, "Apollo-Require-Preflight": "true"}  # CSRF guard of Apollo-style servers
    else:
        data = {k: v if isinstance(v, str) else _scalar_text(v) for k, v in up.fields.items()}
        files = {up.file_field: (up.file_name, content, ctype)}
        method, path = up.method, up.path
    sent = _dispatch(
        ctx,
        method,
        path,
        lambda: {"files": files, "data": data or None},
        headers=headers or None,
        identity=identity,
        timeout_s=None,
    )
    evidence: dict[str, Any] = {
        "upload": response_evidence(sent),
        "file_name": up.file_name,
        "bytes": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
    }
    if sent.response is None:
        forget_response(ctx)
        return StepResult(
            passed=False,
            unreachable=sent.unreachable,
            message=f"upload: {sent.error or 'no response'}",
            evidence=evidence,
        )
    response = sent.response
    ctx.set_response(response)
    if inputs.save_as:
        ctx.capture(inputs.save_as, response.record())
    head = f"upload {up.file_name} ({len(content)} bytes) {method} {path} as {who} -> {response.status}"
    ok_status = response.status in up.expected_status if up.expected_status else 200 <= response.status < 300
    if not ok_status:
        rule = sorted(up.expected_status) if up.expected_status else "2xx"
        return StepResult(
            passed=False,
            evidence=evidence,
            value=response.record(),
            message=f"{head}; expected {rule}; body: {excerpt(response.text, 300)}",
        )
    errors = graphql_errors(response.body) if up.graphql is not None else []
    if errors:
        return StepResult(
            passed=False, evidence=evidence, value=response.record(), message=f"{head}; {_error_text(errors)}"
        )
    created = _upload_id(response.body, up)
    if created is not None:
        ctx.capture("created_id", created)
        ctx.last_created_id = created
        evidence["created_id"] = created
    failures = _capture_fields(ctx, response.body, inputs.save_id_as, inputs.capture_fields, created)
    if failures:
        return StepResult(
            passed=False, evidence=evidence, value=response.record(), message=f"{head}; " + "; ".join(failures)
        )
    if inputs.download is None:
        return StepResult(
            passed=True,
            evidence=evidence,
            value=response.record(),
            message=head + (f"; created id {short(created, 80)}" if created is not None else ""),
        )
    return _check_download(
        ctx,
        inputs.download.model_dump(exclude_unset=True),
        response,
        created,
        content,
        identity,
        headers,
        head,
        evidence,
    )


def _upload_id(body: Any, up: UploadSpec) -> Any:
    if up.id_path:
        try:
            found = path_value(up.id_path, body)
        except PathError:
            found = ABSENT
        return None if found is ABSENT or isinstance(found, (dict, list, bool)) else found
    if (
        up.graphql is not None
        and isinstance(body, dict)
        and isinstance(body.get("data"), dict)
        and len(body["data"]) == 1
    ):
        inner = next(iter(body["data"].values()))
        return inner if isinstance(inner, (str, int)) and not isinstance(inner, bool) else extract_id(inner)
    return extract_id(body)


def _check_download(
    ctx: RunContext,
    raw: dict[str, Any],
    response: HttpResponse,
    created: Any,
    content: bytes,
    identity: Identity | None,
    headers: dict[str, str],
    head: str,
    evidence: dict[str, Any],
) -> StepResult:
    extra: dict[str, Any] = {"upload": response.body if isinstance(response.body, dict) else {}}
    if created is not None:
        extra.update(id=created, created_id=created)
    try:
        resolved = ctx.resolver_with(extra).resolve(raw)
        spec = DownloadSpec.model_validate(resolved)
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, evidence=evidence, message=f"{head}; download: {exc}")
    except ValueError as exc:
        return StepResult(passed=False, evidence=evidence, message=f"{head}; download inputs invalid: {exc}")
    template = raw.get("path")
    path = spec.path
    if path is None and isinstance(response.body, dict):
        path = next(
            (response.body[k] for k in _DOWNLOAD_KEYS if isinstance(response.body.get(k), str) and response.body[k]),
            None,
        )
        template = None  # chosen by the app: must stay on the app's origin
    if not path:
        return StepResult(
            passed=False,
            evidence=evidence,
            message=f"{head}; download: no path given and no url in the upload response",
        )
    url = ctx.http.url(path)
    refused = _origin_error(ctx, template, path)
    if refused:
        return StepResult(passed=False, evidence=evidence, message=f"{head}; download: {refused}")
    cap = min(spec.max_bytes, DEFAULT_MAX_DOWNLOAD_BYTES * 10)
    status, data, error, unreachable = _download(ctx, spec.method, url, identity, headers, cap, ctx.timeout())
    dl: dict[str, Any] = {"method": spec.method, "url": url, "status": status}
    evidence["download"] = dl
    if error is not None:
        dl["error"] = error
        return StepResult(
            passed=False,
            unreachable=unreachable and status is None,
            evidence=evidence,
            message=f"{head}; download: {error}",
        )
    assert data is not None
    dl.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    wanted = set(spec.expect_status or (200,))
    failures = []
    if status not in wanted:
        failures.append(f"download {spec.method} {path} -> {status}, expected {sorted(wanted)}")
    elif spec.expect_same_content and data != content:
        failures.append(
            f"downloaded {len(data)} bytes (sha256 {dl['sha256'][:12]}) differ from the uploaded {len(content)} bytes "
            f"(sha256 {evidence['sha256'][:12]})"
        )
    if failures:
        return StepResult(passed=False, evidence=evidence, message=f"{head}; " + "; ".join(failures))
    same = "; same content" if spec.expect_same_content else ""
    return StepResult(
        passed=True, evidence=evidence, message=f"{head}; download {path} -> {status}, {len(data)} bytes{same}"
    )


# --- P26 -----------------------------------------------------------------------------------------
_RESULT_KEYS = ("items", "results", "data", "hits", "records", "rows", "entries", "edges", "nodes")


def _as_list(value: Any) -> Any:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


class P26Inputs(PrimitiveInputs):
    path: str = Field(default="/api/search", description="Search endpoint (legacy: endpoint, url)")
    method: str = Field(default="GET", description="GET sends the query string; POST sends a JSON body")
    query: Any = Field(default=None, description="The search term, sent as parameter `param` (legacy: q, term, search)")
    param: str = Field(default="q", description="Name of the query parameter (or JSON key for POST)")
    params: dict[str, Any] = Field(default_factory=dict, description="More query parameters (GET) or body keys (POST)")
    body: Any = Field(
        default=None, description="Explicit POST body; the query is added under `param` when it is an object"
    )
    results_path: str | None = Field(
        default=None,
        description="Path of the results list; default: the body when it is a list, "
        "else the first list under items/results/data/hits/records/rows/entries/edges/nodes (one level deep too)",
    )
    expect_min_results: int | None = Field(
        default=None,
        ge=0,
        description="At least this many results (legacy: min_results, min_count, expected_results.min_count)",
    )
    expect_max_results: int | None = Field(
        default=None, ge=0, description="At most this many results (0: the search must find nothing)"
    )
    expect_contains: list[Any] = Field(
        default_factory=list,
        description="Each must appear in some result: a string is a case-insensitive "
        "substring of a field, a number/bool equals a field, an object {dotted: value} must all match one result",
    )
    expect_first_contains: list[Any] = Field(
        default_factory=list,
        description="The same, for the first result (legacy: expected_results.first_result_contains)",
    )
    expect_absent: list[Any] = Field(
        default_factory=list, description="No result may match any of these (tenant isolation, deleted records)"
    )
    expected_status: Statuses = Field(default_factory=list, description="Statuses that pass; default 2xx")
    token: str | None = Field(
        default=None, description="Explicit bearer token; '' = anonymous; absent = the active identity"
    )
    skip_auth: bool = Field(default=False, description="Send no auth headers and no cookies")
    timeout: float | None = Field(default=None, gt=0, description="Seconds; bounded by the node deadline")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "path", ("endpoint", "url"))
        rename_aliases(data, "query", ("q", "term", "search"))
        rename_aliases(data, "expect_min_results", ("min_results", "min_count", "expected_count_min"))
        rename_aliases(data, "expect_contains", ("contains", "expected_contains"))
        expected = data.pop("expected_results", None)
        if isinstance(expected, dict):
            expected = dict(expected)
            for old, new in (
                ("min_count", "expect_min_results"),
                ("max_count", "expect_max_results"),
                ("first_result_contains", "expect_first_contains"),
                ("contains", "expect_contains"),
            ):
                if old in expected:
                    data.setdefault(new, expected.pop(old))
            if expected:
                raise ValueError(f"expected_results keys not understood: {sorted(expected)}")
            note("'expected_results' {min_count, first_result_contains} -> expect_* fields")
        elif expected is not None:
            raise ValueError("expected_results must be an object")
        for key in ("expect_contains", "expect_first_contains", "expect_absent"):
            if key in data and not isinstance(data[key], list):
                data[key] = _as_list(data[key])
        return data

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, value: Any) -> str:
        return _method(value)

    @field_validator("results_path")
    @classmethod
    def _results_path(cls, value: str | None) -> str | None:
        return None if value is None else _check_path(value)


def find_results(body: Any, results_path: str | None) -> tuple[list[Any] | None, str]:
    """(results list or None, where it was found / why not)."""
    if results_path:
        try:
            found = path_value(results_path, body)
        except PathError as exc:
            return None, str(exc)
        return (
            (found, results_path)
            if isinstance(found, list)
            else (None, f"{results_path} is {type_name(found)}, not a list")
        )
    if isinstance(body, list):
        return body, "$"
    if isinstance(body, dict):
        for key in _RESULT_KEYS:
            if isinstance(body.get(key), list):
                return body[key], f"$.{key}"
        for key in _RESULT_KEYS:
            inner = body.get(key)
            if isinstance(inner, dict):
                for key2 in _RESULT_KEYS:
                    if isinstance(inner.get(key2), list):
                        return inner[key2], f"$.{key}.{key2}"
    return None, f"no results list in the body ({type_name(body)}); give results_path"


def _scalars(value: Any, budget: list[int], depth: int = 0) -> Iterator[Any]:
    if budget[0] <= 0 or depth > 8:
        return
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _scalars(v, budget, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _scalars(v, budget, depth + 1)
    else:
        budget[0] -= 1
        yield value


def result_matches(item: Any, needle: Any) -> bool:
    """Does one search result mention ``needle`` (see P26Inputs.expect_contains)?"""
    if isinstance(needle, Mapping):
        try:
            return bool(needle) and all(values_equal(path_value(str(k), item), v) for k, v in needle.items())
        except PathError:
            return False
    budget = [MAX_SCANNED_SCALARS]
    if isinstance(needle, str):
        wanted = needle.casefold()
        return any(isinstance(s, str) and wanted in s[:MAX_REGEX_SUBJECT].casefold() for s in _scalars(item, budget))
    return any(values_equal(s, needle) for s in _scalars(item, budget))


@primitive("P26", P26Inputs)
def search_query(inputs: P26Inputs, ctx: RunContext) -> StepResult:
    """Run a search and check the count and content of its results; the response becomes the last response."""
    params = {k: v for k, v in inputs.params.items()}
    if inputs.query is not None:
        params[inputs.param] = inputs.query
    path, body = inputs.path, inputs.body
    if inputs.method in ("GET", "DELETE", "HEAD"):
        if params:
            query_string = urlencode(
                {k: (v if isinstance(v, (str, list)) else _scalar_text(v)) for k, v in params.items()}, doseq=True
            )
            path = f"{path}{'&' if '?' in path else '?'}{query_string}"
    elif body is None:
        body = params
    elif isinstance(body, dict) and inputs.query is not None:
        body = {**body, inputs.param: inputs.query}
    identity, headers, who = _identity_for(ctx, inputs.token, "token" in inputs.model_fields_set, inputs.skip_auth)
    sent = send(
        ctx, inputs.method, path, body=body, headers=headers or None, identity=identity, timeout_s=inputs.timeout
    )
    evidence = response_evidence(sent)
    if sent.response is None:
        forget_response(ctx)
        return StepResult(
            passed=False, unreachable=sent.unreachable, message=sent.error or "no response", evidence=evidence
        )
    response = sent.response
    ctx.set_response(response)
    head = f"{inputs.method} {path} as {who} -> {response.status}"
    ok_status = response.status in inputs.expected_status if inputs.expected_status else 200 <= response.status < 300
    if not ok_status:
        rule = sorted(inputs.expected_status) if inputs.expected_status else "2xx"
        return StepResult(
            passed=False,
            evidence=evidence,
            value=response.record(),
            message=f"{head}; expected {rule}; body: {excerpt(response.text, 300)}",
        )
    results, where = find_results(response.body, inputs.results_path)
    if results is None:
        return StepResult(passed=False, evidence=evidence, value=response.record(), message=f"{head}; {where}")
    scanned = results[:MAX_SCANNED_RESULTS]
    evidence.update(results_path=where, result_count=len(results))
    failures: list[str] = []
    if inputs.expect_min_results is not None and len(results) < inputs.expect_min_results:
        failures.append(f"{len(results)} result(s), expected at least {inputs.expect_min_results}")
    if inputs.expect_max_results is not None and len(results) > inputs.expect_max_results:
        failures.append(f"{len(results)} result(s), expected at most {inputs.expect_max_results}")
    for needle in inputs.expect_contains:
        if not any(result_matches(item, needle) for item in scanned):
            failures.append(f"no result contains {short(needle, 80)}")
    for needle in inputs.expect_first_contains:
        if not scanned or not result_matches(scanned[0], needle):
            failures.append(f"first result does not contain {short(needle, 80)}")
    for needle in inputs.expect_absent:
        hit = next((i for i, item in enumerate(scanned) if result_matches(item, needle)), None)
        if hit is not None:
            failures.append(f"result {hit} contains {short(needle, 80)}, which must be absent")
    capped = f" (first {MAX_SCANNED_RESULTS} scanned)" if len(results) > MAX_SCANNED_RESULTS else ""
    summary = f"{head}; {len(results)} result(s) at {where}{capped}"
    if failures:
        return StepResult(
            passed=False, evidence=evidence, value=response.record(), message=f"{summary}; " + "; ".join(failures)
        )
    return StepResult(passed=True, evidence=evidence, value=response.record(), message=summary)


# --- P29 -----------------------------------------------------------------------------------------
class WorkflowSetup(HttpFields):
    method: str = Field(default="POST", description="HTTP method creating the entity")
    path: str = Field(description="Path creating the entity")
    body: Any = Field(default=None, description="JSON body")
    headers: dict[str, str] | None = Field(default=None, description="Extra headers (added to the identity's)")
    token: str | None = Field(
        default=None, description="Explicit bearer token; '' = anonymous; absent = the active identity"
    )
    expect_status: Statuses = Field(default_factory=list, description="Default 200 or 201 (legacy: expected_status)")
    id_path: str | None = Field(
        default=None, description="Path of the entity id in the response; default id/uuid (also under data/result/item)"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "expect_status", ("expected_status",))
        return data


def _state_assertions(value: Any) -> Any:
    """``expect_state`` {path, value} (or a list, or P07 assertion forms) -> canonical assertions."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict) and "value" in item and "expected" not in item:
            # {path, value} is literal equality: P07's magic strings ("array", "not_empty") do not apply
            op_given = any(k in item for k in ("op", "operator", "match_type", "assertion"))
            item = {
                **{k: v for k, v in item.items() if k != "value"},
                "expected": item["value"],
                **({} if op_given else {"op": "equals"}),
            }
        out.append(item)
    return out


class WorkflowStep(HttpFields):
    name: str | None = Field(
        default=None, description="Named in messages; its response record is {{<name>}} for later steps"
    )
    method: str = Field(default="PUT", description="HTTP method (default PUT, as in the reference)")
    path: str | None = Field(
        default=None,
        description="Path; {{id}}, {{<setup field>}}, {{setup.a.b}}, {{ids[0]}} and "
        "{{<earlier step>.body.x}} resolve. Required unless wait_s is set",
    )
    wait_s: float | None = Field(
        default=None,
        ge=0,
        description="A wait step: pause this long (bounded by the node deadline) "
        "and send nothing (legacy: _wait_seconds)",
    )
    body: Any = Field(default=None, description="JSON body")
    headers: dict[str, str] | None = Field(default=None, description="Extra headers (added to the identity's)")
    token: str | None = Field(
        default=None, description="Explicit bearer token; '' = anonymous; absent = the active identity"
    )
    expect_status: Statuses = Field(
        default_factory=list, description="Statuses that pass; default 2xx (legacy: expected_status)"
    )
    expect_state: list[Assertion] = Field(
        default_factory=list, description="{path, value} (or P07 assertions) on the step's response body"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "expect_status", ("expected_status",))
            rename_aliases(data, "wait_s", ("_wait_seconds",))
            if "expect_state" in data:
                data["expect_state"] = _state_assertions(data["expect_state"])
        return data

    @model_validator(mode="after")
    def _path_or_wait(self) -> WorkflowStep:
        if self.path is None and self.wait_s is None:
            raise ValueError("a workflow step needs a path (or wait_s for a wait step)")
        return self


class FinalVerify(PrimitiveInputs):
    db_query: str = Field(
        min_length=1,
        description="SQL; {{placeholders}} (setup captures included) are bound as parameters (legacy: sql)",
    )
    expected: Any = Field(
        default=None, description="P08 expectation (legacy: expected_result); absent = a SELECT returns rows"
    )
    retry_ms: int | None = Field(default=None, ge=0, description="Re-run until the expectation holds (P08 retry_ms)")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "db_query", ("sql", "query"))
            rename_aliases(data, "expected", ("expected_result",))
        return data


class ExternalVerify(PrimitiveInputs):
    """xayqujrv's ``{_external_get: URL on the task's machine, expect_min_events, expect_signature_header_regex}``:
    the task's own mock receiver, which a trial does not run at that address. Loads with a warning and
    fails at run time with that reason (a harness limitation, not the app's)."""

    external_get: str = Field(description="URL the reference GETs (legacy: _external_get)")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("_external_get" in data or "external_get" in data):
            data = dict(data)
            rename_aliases(data, "external_get", ("_external_get",))
            for key in ("expect_min_events", "expect_signature_header_regex"):
                data.pop(key, None)
            warn(
                "final_verify _external_get reads the task machine's own mock receiver; not supported here: the "
                "step fails at run time"
            )
        return data


class P29Inputs(PrimitiveInputs):
    entity_setup: WorkflowSetup | None = Field(
        default=None, description="Create the entity; its id and every scalar field become placeholders of the steps"
    )
    steps: list[WorkflowStep] = Field(
        default_factory=list, description="Run in order (all of them); each checks expect_status and expect_state"
    )
    final_verify: FinalVerify | ExternalVerify | list[FinalVerify | ExternalVerify] | None = Field(
        default=None, description="{db_query, expected} checked like P08 after the steps"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "workflow" in data and not data.get("steps"):
            # gavmyneb: {workflow: {trigger: "POST .../:course_id/...", poll: ...}, expected_states, terminal}
            raise StepDefect(
                "P29 'workflow' {trigger, poll} with expected_states describes a state machine whose routes "
                "have unbound :params; nothing runnable (the reference ran nothing and passed)"
            )
        return data

    @model_validator(mode="after")
    def _something_to_run(self) -> P29Inputs:
        if not self.steps and self.entity_setup is None and not self.final_verify:
            raise StepDefect("P29 has no steps, entity_setup or final_verify: it checks nothing")
        return self


def _setup_scope(body: Any, id_path: str | None) -> tuple[dict[str, Any], Any]:
    """Placeholders a created entity offers to the steps, and its id."""
    scope: dict[str, Any] = {"setup": body}
    if isinstance(body, list):
        ids = [extract_id(item) for item in body if isinstance(item, dict)]
        ids = [i for i in ids if i is not None]
        scope.update(ids=ids, submitter_ids=ids)  # submitter_ids: the reference's name for list bodies
        return scope, (ids[0] if ids else None)
    obj = body
    if isinstance(body, dict) and not any(k in body for k in ("id", "uuid")):
        obj = next((body[w] for w in ("data", "result", "item") if isinstance(body.get(w), dict)), body)
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and (value is None or isinstance(value, (str, int, float, bool))):
                scope[key] = value
    created = None
    if id_path:
        try:
            found = path_value(id_path, body)
        except PathError:
            found = ABSENT
        created = None if found is ABSENT or isinstance(found, (dict, list, bool)) else found
    else:
        created = extract_id(body)
    if created is not None:
        scope.update(id=created, created_id=created)
    return scope, created


class _Scoped:
    """Expose a workflow's local placeholders to code that resolves through the context (db_check)."""

    def __init__(self, ctx: RunContext, scope: dict[str, Any]):
        self.ctx, self.scope = ctx, scope
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        missing = object()
        self.saved = {k: self.ctx.node_scope.get(k, missing) for k in self.scope}
        self._missing = missing
        self.ctx.node_scope.update(self.scope)

    def __exit__(self, *exc: object) -> None:
        for key, old in self.saved.items():
            if old is self._missing:
                self.ctx.node_scope.pop(key, None)
            else:
                self.ctx.node_scope[key] = old


@primitive("P29", P29Inputs, raw_fields={"steps", "final_verify"})
def multi_step_workflow(inputs: P29Inputs, ctx: RunContext) -> StepResult:
    """entity_setup -> steps (status + state) -> final_verify (SQL); passes when every sub-step did."""
    # imported here so that database drivers load only when a workflow runs
    from saasbench.primitives.db import db_check

    scope: dict[str, Any] = {}
    subs: list[dict[str, Any]] = []
    unreachable = False

    def record(name: str, passed: bool, message: str, **extra: Any) -> None:
        subs.append({"name": name, "passed": passed, "message": message, **extra})

    setup = inputs.entity_setup
    if setup is not None:
        identity, headers, who = _identity_for(ctx, setup.token, "token" in setup.model_fields_set)
        sent = send(
            ctx,
            setup.method,
            setup.path,
            body=setup.body,
            headers={**(setup.headers or {}), **headers} or None,
            identity=identity,
        )
        if sent.response is None:
            forget_response(ctx)
            unreachable = sent.unreachable
            record("entity_setup", False, sent.error or "no response", request=response_evidence(sent))
        else:
            r = sent.response
            ctx.set_response(r)
            setup_ok = set(setup.expect_status or (200, 201))
            scope, created = _setup_scope(r.body, setup.id_path)
            text = f"{setup.method} {setup.path} as {who} -> {r.status}"
            if r.status not in setup_ok:
                record(
                    "entity_setup",
                    False,
                    f"{text}, expected {sorted(setup_ok)}; body: {excerpt(r.text, 200)}",
                    status=r.status,
                )
            elif created is None:
                record("entity_setup", False, f"{text}, but no entity id in the response", status=r.status)
            else:
                record("entity_setup", True, f"{text}, id {short(created, 60)}", status=r.status)
                ctx.capture("created_id", created)
                ctx.last_created_id = created

    resolver = ctx.resolver_with(scope)
    for index, step in enumerate(inputs.steps, 1):
        label = f"step {index}" + (f" {step.name!r}" if step.name else "")
        if step.path is None and step.wait_s is not None:  # xayqujrv: {_wait_seconds: 3}
            waited = max(0.0, min(step.wait_s, ctx.remaining() - 1.0))
            time.sleep(waited)
            record(
                label,
                True,
                f"waited {waited:g}s" + ("" if waited == step.wait_s else f" of {step.wait_s:g}s (node deadline)"),
            )
            continue
        try:
            raw = step.model_dump(exclude_unset=True)
            live = WorkflowStep.model_validate(resolver.resolve(raw))
            path = live.path
            if path is None:  # a step with both path and wait_s whose path placeholder resolved to null
                raise ValueError("the path resolved to null")
        except UnresolvedPlaceholder as exc:
            record(label, False, str(exc))
            continue
        except ValueError as exc:
            record(label, False, f"inputs invalid after placeholder resolution: {exc}")
            continue
        refused = _origin_error(ctx, step.path, path)
        if refused:
            record(label, False, refused)
            continue
        identity, headers, who = _identity_for(ctx, live.token, "token" in live.model_fields_set)
        sent = send(
            ctx,
            live.method,
            path,
            body=live.body,
            headers={**(live.headers or {}), **headers} or None,
            identity=identity,
        )
        if sent.response is None:
            forget_response(ctx)
            unreachable = unreachable or sent.unreachable
            record(label, False, sent.error or "no response")
            continue
        r = sent.response
        ctx.set_response(r)
        if step.name and _CAPTURE_NAME.match(step.name):
            scope[step.name] = r.record()
        problems = []
        wanted: Any = set(live.expect_status) if live.expect_status else None
        if (r.status not in wanted) if wanted else not 200 <= r.status < 300:
            problems.append(f"status {r.status}, expected {sorted(wanted) if wanted else '2xx'}")
        doc = Doc(r.body, r.headers, r.text, f"body of {live.method} {live.path}")
        for a in live.expect_state:
            try:
                value = doc.get(a.path)
            except PathError as exc:
                problems.append(str(exc))
                continue
            ok, why = check(a, value, doc)
            if not ok:
                expected = "" if a.op in UNARY else f" {short(a.expected, 60)}"
                problems.append(f"state {a.path} {a.op}{expected}: actual {short(value, 80)} [{why}]")
        text = f"{live.method} {live.path} as {who} -> {r.status}"
        record(label, not problems, text + (f"; {'; '.join(problems)}" if problems else ""), status=r.status)

    checks = (
        inputs.final_verify
        if isinstance(inputs.final_verify, list)
        else [inputs.final_verify]
        if inputs.final_verify
        else []
    )
    for index, raw_check in enumerate(checks, 1):
        label = "final_verify" + (f" {index}" if len(checks) > 1 else "")
        external = (
            raw_check.external_get
            if isinstance(raw_check, ExternalVerify)
            else (raw_check.get("_external_get") or raw_check.get("external_get"))
            if isinstance(raw_check, dict)
            else None
        )
        if external:
            record(
                label,
                False,
                f"not supported: GET {external} reads the task machine's own mock receiver, which a trial "
                "does not run at that address (a harness limitation)",
            )
            continue
        verify = raw_check if isinstance(raw_check, FinalVerify) else FinalVerify.model_validate(raw_check)
        with _Scoped(ctx, scope):  # {{id}} & co. are bound as SQL parameters by db_check, never spliced
            kwargs: dict[str, Any] = {"retry_ms": verify.retry_ms} if verify.retry_ms is not None else {}
            if "expected" in verify.model_fields_set:
                kwargs["expected_result"] = verify.expected
            result = db_check(ctx, verify.db_query, **kwargs)
        record(label, result.passed, result.message, statement=result.evidence.get("statement"))

    passed = sum(1 for s in subs if s["passed"])
    total = len(subs)
    ratio = round(passed / total, 4) if total else 0.0
    document = {"id": scope.get("id"), "steps": subs, "steps_passed": passed, "steps_total": total, "ratio": ratio}
    ctx.last_document = document
    failed = [s for s in subs if not s["passed"]]
    message = f"{passed}/{total} workflow sub-steps as expected"
    if failed:
        message += "; failed: " + "; ".join(f"{s['name']}: {s['message']}" for s in failed[:4])
        if len(failed) > 4:
            message += f"; (+{len(failed) - 4} more)"
    return StepResult(
        passed=total > 0 and passed == total,
        value=document,
        unreachable=unreachable and passed == 0,
        message=message,
        evidence={"ratio": ratio, "steps": subs},
    )
