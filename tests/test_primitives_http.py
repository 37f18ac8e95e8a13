"""Tests of the path evaluator and the HTTP/assertion primitives P04-P07 and P14-P16.

Pure tests (jsonpath, P07 operators) need no network. HTTP tests run against the bundled
TeamNotes app and a tiny echo server, both on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from apps.teamnotes import serve_in_thread

from saasbench.dag import DagLoadError, load_dag_data
from saasbench.dag.jsonpath import ABSENT, PathError, evaluate, parse
from saasbench.dag.placeholders import MISSING
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import REGISTRY
from saasbench.services.auth import AuthProfile, load_auth_profile

AUTH_YAML = Path(__file__).resolve().parent / "apps" / "teamnotes_auth.yaml"


# --- helpers ---------------------------------------------------------------------------------------
def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


def doc_ctx(document: Any) -> RunContext:
    ctx = RunContext(Target())
    ctx.last_document = document
    return ctx


def p07(document: Any, *assertions: dict[str, Any]) -> StepResult:
    return run(doc_ctx(document), "P07", {"assertions": list(assertions)})


def normalisations(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    return [i.message for i in load_dag_data(dag).issues if i.kind == "normalisation"]


def load_errors(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    with pytest.raises(DagLoadError) as info:
        load_dag_data(dag)
    return [str(i) for i in info.value.issues]


def jwt(payload: dict[str, Any], alg: str = "HS256") -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': alg, 'typ': 'JWT'})}.{part(payload)}.c2lnbmF0dXJl"


def free_port() -> int:
    """A port nobody listens on: bind an ephemeral port, then close it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fixtures --------------------------------------------------------------------------------------
@pytest.fixture
def app() -> Iterator[str]:
    server, _thread, base = serve_in_thread()
    yield base
    server.shutdown()
    server.server_close()


def make_ctx(base_url: str, compat: str = "strict", http_timeout_s: float = 10.0) -> RunContext:
    return RunContext(
        Target(base_url=base_url),
        options=RunOptions(compat=compat, http_timeout_s=http_timeout_s),
        auth_profile=load_auth_profile(AUTH_YAML),
    )


@pytest.fixture
def ctx(app: str) -> Iterator[RunContext]:
    c = make_ctx(app)
    yield c
    c.close()


@pytest.fixture
def admin(ctx: RunContext) -> RunContext:
    assert run(ctx, "P13", {"role": "admin"}).passed
    return ctx


class _Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received: method, path, headers, body."""

    def _echo(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        payload = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("latin-1"),
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Echo", "yes")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _echo

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[RunContext]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    profile = AuthProfile.model_validate(
        {"schemes": {"key": {"kind": "api_key"}}, "users": {"admin": {"api_key": "K1"}}}
    )
    c = RunContext(Target(base_url=f"http://127.0.0.1:{server.server_address[1]}"), auth_profile=profile)
    yield c
    c.close()
    server.shutdown()
    server.server_close()


# === jsonpath ======================================================================================
DOC = {
    "a": {"b": [{"c": 1}, {"c": 2}, {"d": None}]},
    "edges": [{"node": {"name": "x"}}],
    "s": "abc",
    "obj": {"length": 7},
    "flat.key": 5,
    "n": None,
}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("$", DOC),
        ("", DOC),
        ("$.a.b[0].c", 1),
        ("$.a.b[-1].d", None),
        ("$.a.b.1.c", 2),
        ("edges.0.node.name", "x"),
        ("$.edges[0].node.name", "x"),
        ("$.a.b[*].c", [1, 2]),
        ("$.a.b.length", 3),
        ("$.s.length", 3),
        ("$.a.length", 1),
        ("$.obj.length", 7),
        ("$['a']['b'][1]['c']", 2),
        ("flat.key", 5),
        ("s", "abc"),
        ("$.n", None),
        ("$.a.b[?(@.c == 2)].c", [2]),
        ("$..c", [1, 2]),
    ],
)
def test_jsonpath_dialects(path: str, expected: Any) -> None:
    assert evaluate(path, DOC) == expected


@pytest.mark.parametrize("path", ["$.zz", "$.a.b[9]", "$.a.b[0].zz", "$.s.x", "$.a.b.x", "nope"])
def test_jsonpath_absent_is_not_null(path: str) -> None:
    assert evaluate(path, DOC) is ABSENT
    assert evaluate("$.n", DOC) is None and ABSENT is not None and not ABSENT


def test_jsonpath_bare_arrays_scalars_wildcards_and_pseudo_paths() -> None:
    assert evaluate("$[0].x", [{"x": 5}]) == 5
    assert evaluate("$[1]", [{"x": 5}]) is ABSENT
    assert evaluate("$", "2024-01-01T00:00:00Z") == "2024-01-01T00:00:00Z"
    assert evaluate("$", True) is True
    nested = {"g": [{"h": [1, 2]}, {"h": [3]}, {"x": 0}]}
    assert evaluate("$.g[*].h[*]", nested) == [1, 2, 3]
    assert evaluate("$.g.*.h", nested) == [[1, 2], [3]]
    headers = {"content-type": "text/csv", "content-disposition": "attachment; filename=subscribers.csv"}
    assert evaluate("$._headers.Content-Disposition", {}, headers=headers).endswith("subscribers.csv")
    assert evaluate("$._headers.x-missing", {}, headers=headers) is ABSENT
    assert evaluate("$._body_first_line", None, text="uuid,email\r\n1,a@b\n") == "uuid,email"
    assert evaluate("$._headers", {"_headers": 1}, headers=headers) == 1  # a real key wins
    assert parse("$.result[*].published")[0] == "$"


@pytest.mark.parametrize("bad", ["$x", "$.", "$.a[", "$.a[?(@.x ==]"])
def test_jsonpath_parse_errors(bad: str) -> None:
    with pytest.raises(PathError):
        evaluate(bad, {})


# === P07 operators (pure) ==========================================================================
BODY = {
    "id": 7,
    "name": "Eval",
    "price": "5",
    "ratio": 1.0,
    "flag": True,
    "zero": 0,
    "none": None,
    "tags": ["a", "b"],
    "items": [{"id": 1, "ok": True}, {"id": 2, "ok": True}],
    "empty": "",
    "obj": {"k": 1},
    "msg": "Name already EXISTS here",
    "count": 3,
}


@pytest.mark.parametrize(
    "assertion",
    [
        {"path": "$.id", "expected": 7},
        {"path": "$.id", "expected": 7.0},
        {"path": "$.ratio", "expected": 1},
        {"path": "$.price", "expected": 5},  # a numeric string equals the number
        {"path": "$.id", "expected": "7"},
        {"path": "$.flag", "expected": True},
        {"path": "$.none", "expected": None},
        {"path": "$.missing", "expected": None},
        {"path": "$.name", "op": "==", "expected": "Eval"},
        {"path": "$.name", "operator": "not_equals", "expected": "Other"},
        {"path": "$.count", "expected": 3.4, "tolerance": 0.5},
        {"path": "$.name", "match_type": "contains", "expected": "va"},
        {"path": "$.tags", "operator": "contains", "expected": "b"},
        {"path": "$.obj", "op": "contains", "expected": "k"},
        {"path": "$.msg", "operator": "contains_text", "expected": "already exists"},
        {"path": "$.items", "operator": "not_contains_id", "expected": 3},
        {"path": "$.id", "match_type": "exists"},
        {"path": "$.id", "operator": "not_null"},
        {"path": "$.none", "operator": "is_null"},
        {"path": "$.missing", "operator": "is_null"},
        {"path": "$.name", "match_type": "not_empty", "expected": ""},
        {"path": "$.zero", "expected": "not_empty"},
        {"path": "$.tags", "operator": "is_array"},
        {"path": "$.tags", "expected": "array"},
        {"path": "$.count", "op": ">=", "expected": 3},
        {"path": "$.count", "operator": "gte", "expected": 2},
        {"path": "$.count", "op": "<=", "expected": 3},
        {"path": "$.count", "operator": "lte", "expected": 4},
        {"path": "$.count", "match_type": "greater_than", "expected": 0},
        {"path": "$.count", "op": "gt", "expected": 2},
        {"path": "$.count", "op": "lt", "expected": 4},
        {"path": "$.count", "op": "less_than", "expected": 4},
        {"path": "$.count", "match_type": "less_than_or_equal", "expected": 3},
        {"path": "$.count", "op": "greater_than_or_equal", "expected": 3},
        {"path": "$.name", "op": "in", "expected": ["x", "Eval"]},
        {"path": "$.name", "expected_in": ["Eval"]},
        {"path": "$.items[*].ok", "match_type": "all_equal", "expected": True},
        {"path": "$.name", "operator": "matches_regex", "expected": "^E.a"},
        {"path": "$.name", "op": "regex", "expected": "val$"},
        {"path": "$.id", "exists": True},
        {"path": "$.missing", "exists": False},
        {"path": "$.flag", "type": "boolean"},
        {"path": "$.obj", "type": "object"},
        {"path": "$.id", "expected_type": "integer"},
        {"path": "$.ratio", "expected_type": "integer"},  # 1.0 is an integer, as in JSON Schema
        {"path": "$.ratio", "expected_type": "number"},
        {"path": "$.tags", "expected_type": "array"},
        {"path": "$.name", "expected_type": "string", "match_type": "not_empty"},
        {"path": "$.msg", "expected": "contains:already"},
        {"path": "$.missing", "expected": "undefined"},
        {"path": "$.tags[0]", "contains": "a"},
        {"path": "$.tags.length", "expected": 2},
    ],
)
def test_p07_operators_pass(assertion: dict[str, Any]) -> None:
    result = p07(BODY, assertion)
    assert result.passed, result.message


@pytest.mark.parametrize(
    "assertion",
    [
        {"path": "$.id", "expected": 8},
        {"path": "$.flag", "expected": 1},  # booleans are not numbers
        {"path": "$.id", "expected": True},
        {"path": "$.flag", "expected": "true"},
        {"path": "$.name", "expected": "eval"},
        {"path": "$.count", "expected": 3.6, "tolerance": 0.5},
        {"path": "$.missing", "expected": 1},
        {"path": "$.none", "match_type": "exists"},
        {"path": "$.missing", "operator": "not_null"},
        {"path": "$.id", "operator": "is_null"},
        {"path": "$.empty", "match_type": "not_empty"},
        {"path": "$.name", "operator": "is_array"},
        {"path": "$.flag", "expected_type": "number"},
        {"path": "$.flag", "expected_type": "integer"},
        {"path": "$.id", "expected_type": "string"},
        {"path": "$.flag", "op": ">=", "expected": 0},  # booleans do not compare as numbers
        {"path": "$.name", "op": "gt", "expected": 1},
        {"path": "$.count", "op": "gt", "expected": 3},
        {"path": "$.name", "expected_in": ["x"]},
        {"path": "$.items", "operator": "not_contains_id", "expected": "2"},
        {"path": "$.msg", "match_type": "contains", "expected": "already exists"},  # contains is case-sensitive
        {"path": "$.items[*].id", "op": "all_equal", "expected": 1},
        {"path": "$.none[*]", "op": "all_equal", "expected": 1},
        {"path": "$.name", "op": "matches_regex", "expected": "^x"},
        {"path": "$.id", "expected": "undefined"},
        {"path": "$.id", "exists": False},
        {"path": "$.obj", "expected": "array"},
    ],
)
def test_p07_operators_fail(assertion: dict[str, Any]) -> None:
    result = p07(BODY, assertion)
    assert not result.passed, assertion
    assert "actual" in result.message and assertion["path"] in result.message


def test_p07_message_lists_every_failure_with_truncated_actuals() -> None:
    big = {"blob": "x" * 5000, "a": 1}
    result = p07(
        big, {"path": "$.blob", "expected": "y"}, {"path": "$.a", "expected": 1}, {"path": "$.zz", "op": "exists"}
    )
    assert not result.passed
    assert result.message.startswith("1/3 assertions passed")
    assert "$.blob equals" in result.message and "$.zz exists" in result.message and "<absent>" in result.message
    assert len(result.message) < 1000


def test_p07_single_assertion_forms_and_regex_subject_limit() -> None:
    doc = {"data": {"loginUser": {"token": jwt({"sub": str(uuid.uuid4()), "exp": int(time.time()) + 7200})}}}
    ctx = doc_ctx(doc)
    assert run(ctx, "P07", {"assertion": "json_path_exists", "path": "$.data.loginUser.token"}).passed
    assert run(
        ctx,
        "P07",
        {
            "assertion": "regex_match",
            "path": "$.data.loginUser.token",
            "pattern": r"^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$",
        },
    ).passed
    assert run(ctx, "P07", {"path": "$.data.loginUser.token", "match_type": "not_empty"}).passed
    assert not run(ctx, "P07", {"path": "$.data.nope", "expected": 1}).passed
    huge = doc_ctx({"t": "a" * 300_000 + "END"})
    assert not run(huge, "P07", {"assertions": [{"path": "$.t", "op": "matches_regex", "expected": "END$"}]}).passed


def test_p07_jwt_decode_without_verification() -> None:
    now = int(time.time())
    good = {"token": jwt({"sub": str(uuid.uuid4()), "exp": now + 3 * 3600})}
    claims = {"sub": "uuid_format", "exp": "future_timestamp_3h"}
    single = {"assertion": "jwt_decode", "algorithm": "HS256", "claims": claims}
    assert run(doc_ctx(good), "P07", single).passed  # no path: the first JWT in the document
    assert run(doc_ctx(good), "P07", {**single, "path": "$.token"}).passed
    too_far = {"token": jwt({"sub": str(uuid.uuid4()), "exp": now + 5 * 3600})}
    assert "more than" in run(doc_ctx(too_far), "P07", single).message
    expired = {"token": jwt({"sub": str(uuid.uuid4()), "exp": now - 10})}
    assert "not in the future" in run(doc_ctx(expired), "P07", single).message
    not_uuid = {"token": jwt({"sub": "42", "exp": now + 60})}
    assert "not a UUID" in run(doc_ctx(not_uuid), "P07", single).message
    wrong_alg = {"token": jwt({"sub": str(uuid.uuid4()), "exp": now + 60}, alg="RS256")}
    assert "alg" in run(doc_ctx(wrong_alg), "P07", single).message
    assert not run(doc_ctx({"token": "not-a-jwt"}), "P07", single).passed
    assert not run(doc_ctx({"token": "eyJ!!!.x.y"}), "P07", single).passed


def test_p07_captures_and_sources() -> None:
    ctx = doc_ctx({"result": [{"id": 11}]})
    result = run(
        ctx,
        "P07",
        {
            "assertions": [
                {"path": "$.result[0].id", "match_type": "exists", "save_as": "db_id"},
                {"path": "$.result", "op": "is_array", "capture_as": "rows"},
            ]
        },
    )
    assert result.passed and ctx.vars["db_id"] == 11 and ctx.vars["rows"] == [{"id": 11}]
    assert ctx.resolve("{{db_id}}") == 11
    ctx.capture("saved", {"status": 201, "headers": {"x-a": "1"}, "body": {"id": 5}, "elapsed_ms": 1.0})
    assert run(
        ctx,
        "P07",
        {
            "source": "saved",
            "assertions": [{"path": "$.id", "expected": 5}, {"path": "$._headers.X-A", "expected": "1"}],
        },
    ).passed
    assert run(ctx, "P07", {"response": "{{saved}}", "assertions": [{"path": "$.id", "expected": 5}]}).passed
    assert run(
        ctx, "P07", {"response": {"inline": "{{db_id}}"}, "assertions": [{"path": "$.inline", "expected": 11}]}
    ).passed
    assert run(
        ctx, "P07", {"response": "{{from_P04}}", "assertions": [{"path": "$.result[0].id", "expected": 11}]}
    ).passed
    missing = run(ctx, "P07", {"response": "{{nope}}", "assertions": [{"path": "$", "op": "exists"}]})
    assert not missing.passed and "{{nope}}" in missing.message
    empty = run(RunContext(Target()), "P07", {"assertions": [{"path": "$", "op": "exists"}]})
    assert not empty.passed and "no document" in empty.message


def test_p07_normalisations_are_noted_and_bad_inputs_rejected_at_load() -> None:
    notes = normalisations(
        "P07",
        {
            "assertions": [
                {"path": "$.a", "match_type": "not_empty"},
                {"path": "$.b", "expected": "not_empty"},
                {"path": "$.c", "exists": True},
                {"path": "$.d", "type": "boolean"},
                {"path": "$.e", "contains": "x"},
                {"path": "$.f", "expected_in": [1]},
                {"path": "$.g", "expected": "contains:x"},
                {"path": "$.h", "op": "exists", "capture_as": "h"},
            ]
        },
    )
    text = "\n".join(notes)
    for fragment in (
        "'match_type' -> op",
        "magic expected string 'not_empty'",
        "exists",
        "'type' -> expected_type",
        "'contains' without expected",
        "'expected_in'",
        "contains:<text>",
        "'capture_as' -> save_as",
    ):
        assert fragment in text, fragment
    assert any("single-assertion form" in n for n in normalisations("P07", {"path": "$.a", "expected": 1}))
    assert not normalisations("P07", {"assertions": [{"path": "$.a", "operator": "equals", "expected": 1}]})
    assert any(
        "unknown operator" in e for e in load_errors("P07", {"assertions": [{"path": "$.a", "op": "approximately"}]})
    )
    assert any(
        "invalid regex" in e
        for e in load_errors("P07", {"assertions": [{"path": "$.a", "op": "regex", "expected": "("}]})
    )
    assert any("cannot parse path" in e for e in load_errors("P07", {"assertions": [{"path": "$.a[", "expected": 1}]}))
    # empty assertions load with a warning (a DAG defect: the step checks nothing); tests/test_loader_dialects.py
    empty = load_dag_data(
        {
            "nodes": [
                {
                    "id": "N",
                    "steps": [{"type": "P07", "inputs": {"assertions": []}}],
                    "scoring": {"method": "binary", "maxScore": 1},
                }
            ]
        }
    )
    assert any("checks nothing" in w.message and w.field == "steps[0].inputs.assertions" for w in empty.warnings)
    assert any(
        "not expected and contains" in e
        for e in load_errors("P07", {"assertions": [{"path": "$.a", "expected": 1, "contains": 2}]})
    )
    assert any(
        "conflicting operators" in e
        for e in load_errors("P07", {"assertions": [{"path": "$.a", "op": "gt", "operator": "lt"}]})
    )
    assert any(
        "unknown type" in e for e in load_errors("P07", {"assertions": [{"path": "$.a", "expected_type": "uuid"}]})
    )


def test_p07_non_json_and_wrong_shapes_never_raise() -> None:
    for document in ("plain text", None, 42, [1, 2], {"a": [1]}):
        result = p07(
            document,
            {"path": "$.a.b[3].c", "op": "gte", "expected": 1},
            {"path": "$.a", "op": "contains_text", "expected": "x"},
            {"path": "$", "op": "all_equal", "expected": 1},
        )
        assert isinstance(result, StepResult) and not result.passed
    assert p07(
        "2024-05-01T10:00:00Z", {"path": "$", "operator": "matches_regex", "expected": r"\d{4}-\d{2}-\d{2}T"}
    ).passed
    assert p07(
        {"m": "deletion date cannot exceed 31 days"}, {"path": "$", "operator": "contains_text", "expected": "31 DAYS"}
    ).passed


# === P04 ===========================================================================================
def test_p04_get_sets_last_response_and_captures(ctx: RunContext) -> None:
    result = run(ctx, "P04", {"method": "get", "path": "/api/health", "save_as": "health", "capture_response_as": "h2"})
    assert result.passed and "200" in result.message
    assert ctx.last_response is not None and ctx.last_response.status == 200
    assert ctx.last_document == {"status": "ok", "version": ctx.last_document["version"]}
    assert ctx.resolve("{{health.body.status}}") == "ok" and ctx.resolve("{{h2.status}}") == 200
    ev = result.evidence
    assert ev["method"] == "GET" and ev["url"].endswith("/api/health") and ev["status"] == 200
    assert ev["elapsed_ms"] >= 0 and '"ok"' in ev["body_excerpt"]
    absolute = run(ctx, "P04", {"path": ctx.target.base_url + "/api/public/ping"})
    assert absolute.passed and ctx.last_document == "pong"


def test_p04_any_status_passes_and_identity_rules(admin: RunContext) -> None:
    ctx = admin
    assert run(ctx, "P04", {"path": "/api/me"}).passed and ctx.last_document["username"] == "admin"
    # explicit headers (even {}) -> no auth headers, no cookies
    assert run(ctx, "P04", {"path": "/api/me", "headers": {}}).passed
    assert ctx.last_response.status == 401
    run(ctx, "P04", {"path": "/api/me", "headers": {"Authorization": "Bearer invalid-token"}})
    assert ctx.last_response.status == 401
    run(ctx, "P04", {"path": "/api/me", "skip_auth": True})
    assert ctx.last_response.status == 401
    run(ctx, "P04", {"path": "/api/me"})
    assert ctx.last_response.status == 200  # the identity is still active
    created = run(ctx, "P04", {"method": "POST", "path": "/api/projects", "body": {"name": "P04 project"}})
    assert (
        created.passed and ctx.last_response.status == 201 and ctx.resolve("{{created_id}}") == ctx.last_document["id"]
    )
    form = run(
        ctx,
        "P04",
        {
            "method": "POST",
            "path": "/admin/login",
            "body": "username=admin&password=admin-pass-1",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        },
    )
    assert form.passed and ctx.last_response.status == 303  # redirects are observations, not followed


def test_p04_body_encodings(echo: RunContext) -> None:
    ctx = echo
    assert run(ctx, "P13", {"role": "admin"}).passed
    run(ctx, "P04", {"method": "POST", "path": "/j", "body": {"a": 1}})
    seen = ctx.last_document
    assert seen["headers"]["content-type"] == "application/json" and json.loads(seen["body"]) == {"a": 1}
    assert seen["headers"]["x-api-key"] == "K1"
    run(ctx, "P04", {"method": "POST", "path": "/l", "body": [1, 2]})
    assert json.loads(ctx.last_document["body"]) == [1, 2]
    run(
        ctx,
        "P04",
        {
            "method": "POST",
            "path": "/s",
            "body": "a=1&b=2",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        },
    )
    seen = ctx.last_document
    assert seen["body"] == "a=1&b=2" and seen["headers"]["content-type"] == "application/x-www-form-urlencoded"
    assert "x-api-key" not in seen["headers"]
    run(
        ctx,
        "P04",
        {
            "method": "POST",
            "path": "/f",
            "body": {"a": 1, "b": True},
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        },
    )
    assert ctx.last_document["body"] == "a=1&b=true"
    run(
        ctx,
        "P04",
        {
            "method": "POST",
            "path": "/m",
            "headers": {"Content-Type": "multipart/form-data"},
            "body": {"file": "test_image.png", "title": "T"},
        },
    )
    seen = ctx.last_document
    assert seen["headers"]["content-type"].startswith("multipart/form-data; boundary=")
    assert 'name="file"; filename="test_image.png"' in seen["body"] and "\x89PNG" in seen["body"]
    assert 'name="title"' in seen["body"]
    assert run(ctx, "P04", {"path": "/h", "headers": {"X-Request-Email": "e"}}).passed
    assert ctx.last_document["headers"]["x-request-email"] == "e"
    bad_header = run(ctx, "P04", {"path": "/h", "headers": {"X-Name": "Zoë"}})
    assert not bad_header.passed and "cannot build the request" in bad_header.message


def test_p04_connection_refused_is_unreachable() -> None:
    ctx = make_ctx(f"http://127.0.0.1:{free_port()}")
    ctx.last_document = {"stale": True}
    result = run(ctx, "P04", {"path": "/api/health"})
    assert not result.passed and result.unreachable and "cannot connect" in result.message
    assert ctx.last_response is None and ctx.last_document is MISSING
    assert not run(ctx, "P15", {"expected_status": 200}).passed
    ctx.close()


def test_p04_timeout_and_size_cap(ctx: RunContext) -> None:
    t0 = time.perf_counter()
    slow = run(ctx, "P04", {"path": "/api/debug/slow?ms=3000", "timeout": 0.3})
    assert not slow.passed and slow.unreachable and "timeout" in slow.message
    assert time.perf_counter() - t0 < 2.5
    big = run(ctx, "P04", {"path": "/api/debug/big?mb=10"})
    assert not big.passed and not big.unreachable
    assert str(ctx.options.max_response_bytes) in big.message and "cap" in big.message
    assert ctx.last_response is None


def test_p04_invalid_json_body_is_kept_as_text(ctx: RunContext) -> None:
    assert run(ctx, "P04", {"path": "/api/debug/badjson"}).passed
    assert ctx.last_response.json_error and ctx.last_document == '{"broken": '
    p06 = run(ctx, "P06", {"required_fields": ["broken"]})
    assert not p06.passed and "not a JSON object" in p06.message and "invalid JSON" in p06.message
    p07r = run(ctx, "P07", {"assertions": [{"path": "$.broken", "op": "exists"}]})
    assert not p07r.passed


def test_p04_inputs_validation() -> None:
    assert any("method" in e for e in load_errors("P04", {"method": "GET /x", "path": "/x"}))
    assert any("path" in e for e in load_errors("P04", {"method": "GET"}))
    assert any("timeout" in e for e in load_errors("P04", {"path": "/x", "timeout": -1}))


# === P05 ===========================================================================================
def test_p05_full_round_trip(admin: RunContext) -> None:
    ctx = admin
    result = run(
        ctx,
        "P05",
        {
            "resource": "/api/projects",
            "create_body": {"name": "crud-1"},
            "update_body": {"name": "crud-1b", "description": "", "tags": [], "archived": False},
            "expected_read_fields": ["id", "name", "tags"],
            "expected_create_status": 201,
        },
    )
    assert result.passed, result.message
    value = result.value
    assert value["steps_total"] == 4 and value["steps_passed"] == 4
    assert [s["step"] for s in value["steps"]] == ["create", "read", "update", "delete"]
    pid = value["created_id"]
    assert ctx.resolve("{{created_id}}") == pid and ctx.last_created_id == pid
    assert ctx.node_scope["created_id"] == pid
    assert run(ctx, "P07", {"assertions": [{"path": "$.steps_passed", "expected": 4}]}).passed
    run(ctx, "P04", {"path": f"/api/projects/{pid}"})
    assert ctx.last_response.status == 404  # deleted


def test_p05_keep_alive_patch_and_missing_fields(admin: RunContext) -> None:
    ctx = admin
    kept = run(
        ctx,
        "P05",
        {
            "resource": "/api/projects/",
            "create_body": {"name": "kept"},
            "update_body": {"name": "kept2"},
            "update_method": "patch",
            "keep_alive": True,
        },
    )
    # keep_alive: delete, then re-create from create_body, so later nodes see the create-time values
    assert kept.passed and [s["step"] for s in kept.value["steps"]] == [
        "create",
        "read",
        "update",
        "delete",
        "recreate",
    ]
    assert ctx.last_document["name"] == "kept" and ctx.last_document["id"] == kept.value["created_id"]
    run(ctx, "P04", {"path": f"/api/projects/{kept.value['created_id']}"})
    assert ctx.last_response.status == 200 and ctx.last_document["name"] == "kept"
    missing = run(
        ctx,
        "P05",
        {
            "resource": "/api/projects",
            "create_body": {"name": "m"},
            "skip_delete": True,
            "expected_read_fields": ["id", "nonexistent_field"],
        },
    )
    assert not missing.passed and "nonexistent_field" in missing.message
    wrapped = run(
        ctx,
        "P05",
        {
            "resource": "/api/projects",
            "create_body": {"name": "w"},
            "identifier_field": "id",
            "response_root": "not_there",
            "expected_read_fields": ["name"],
        },
    )
    assert wrapped.passed  # a response_root absent from the body falls back to the body


def test_p05_failures_and_compat_reference(app: str) -> None:
    strict = make_ctx(app)
    assert run(strict, "P13", {"role": "member"}).passed
    denied_delete = run(strict, "P05", {"resource": "/api/projects", "create_body": {"name": "dup"}})
    assert not denied_delete.passed and "delete 403" in denied_delete.message
    dup = run(strict, "P05", {"resource": "/api/projects", "create_body": {"name": "dup"}})
    assert not dup.passed and "create 409" in dup.message and dup.value["steps_total"] == 1
    bad_token = run(strict, "P05", {"resource": "/api/projects", "create_body": {"name": "t"}, "token": "nope"})
    assert not bad_token.passed and "create 401" in bad_token.message
    reference = make_ctx(app, compat="reference")
    assert run(reference, "P13", {"role": "admin"}).passed
    inclusive = run(reference, "P05", {"resource": "/api/projects", "create_body": {"name": "dup"}})
    assert inclusive.passed and inclusive.value["steps"][0]["compat"]
    refused = run(make_ctx(f"http://127.0.0.1:{free_port()}"), "P05", {"resource": "/x", "create_body": {}})
    assert not refused.passed and refused.unreachable
    strict.close()
    reference.close()


# === P14 ===========================================================================================
def test_p14_roles_actions_and_restore(admin: RunContext) -> None:
    ctx = admin
    denied = run(
        ctx,
        "P14",
        {"role": "viewer", "action": "POST /api/projects", "body": {"name": "nope"}, "expected_result": "denied"},
    )
    assert denied.passed and "-> 403" in denied.message
    assert ctx.auth.active.role == "admin"  # previous identity restored
    assert ctx.last_response.status == 403
    allowed = run(
        ctx, "P14", {"role": "member", "method": "GET", "path": "/api/projects", "expected_result": "allowed"}
    )
    assert allowed.passed
    wrong = run(ctx, "P14", {"role": "member", "action": "GET /api/projects", "expected_result": "denied"})
    assert not wrong.passed and "NOT as expected" in wrong.message
    token = run(ctx, "P14", {"token": "invalid", "action": "GET /api/me", "expected_result": "denied"})
    assert token.passed and "-> 401" in token.message
    not_found = run(ctx, "P14", {"action": "GET /api/projects/999999", "expected_result": "denied"})
    assert not_found.passed  # 404 is a denial by default (hiding existence)
    widened = run(
        ctx, "P14", {"token": "invalid", "action": "GET /api/me", "expected_result": "denied", "expected_status": 403}
    )
    assert widened.passed  # with expected_result: denied, given statuses add to the deny set (401 still denies)
    still_allowed = run(
        ctx,
        "P14",
        {"role": "member", "action": "GET /api/projects", "expected_result": "denied", "expected_status": 403},
    )
    assert not still_allowed.passed  # a 200 is never a denial
    exact = run(ctx, "P14", {"token": "invalid", "action": "GET /api/me", "expected_status": 403})
    assert not exact.passed  # without expected_result, given statuses replace the default set
    listed = run(ctx, "P14", {"role": "viewer", "action": "POST /api/projects", "acceptable_statuses": [403, 404]})
    assert listed.passed and "expected denied" in listed.message  # default class from the statuses
    admin_ok = run(ctx, "P14", {"role": "admin", "action": "GET /api/admin/users", "expected_status": 200})
    assert admin_ok.passed and "expected allowed" in admin_ok.message
    unknown_role = run(ctx, "P14", {"role": "ghost", "action": "GET /api/me"})
    assert not unknown_role.passed and ctx.auth.active.role == "admin"
    assert any("action" in n for n in normalisations("P14", {"action": "GET /x", "expected_result": "denied"}))


# === P15 ===========================================================================================
def test_p15_status_sets(admin: RunContext) -> None:
    ctx = admin
    assert "no HTTP response" in run(RunContext(Target()), "P15", {}).message
    run(ctx, "P04", {"path": "/api/health"})
    assert run(ctx, "P15", {}).passed
    assert run(ctx, "P15", {"expected_status": 200}).passed
    assert run(ctx, "P15", {"expected_status": [201, 200]}).passed
    assert run(ctx, "P15", {"acceptable_statuses": [200, 304]}).passed
    assert run(ctx, "P15", {"acceptable": [200]}).passed and run(ctx, "P15", {"expected": "200"}).passed
    failed = run(ctx, "P15", {"expected_status": 201, "acceptable_statuses": [204]})
    assert not failed.passed and "[201, 204]" in failed.message
    run(ctx, "P04", {"path": "/api/me", "headers": {}})
    assert not run(ctx, "P15", {}).passed and run(ctx, "P15", {"expected_status": 401}).passed
    notes = normalisations("P15", {"acceptable": [200], "expected": 201})
    assert any("'acceptable'" in n for n in notes) and any("'expected'" in n for n in notes)
    assert any("status" in e for e in load_errors("P15", {"expected_status": "abc"}))


def test_p15_compat_reference_rules(app: str) -> None:
    for compat, should_pass in (("strict", False), ("reference", True)):
        ctx = make_ctx(app, compat=compat)
        assert run(ctx, "P13", {"role": "admin"}).passed
        run(ctx, "P04", {"method": "POST", "path": "/api/projects", "body": {"name": "twice"}})
        run(ctx, "P04", {"method": "POST", "path": "/api/projects", "body": {"name": "twice"}})
        assert ctx.last_response.status == 409
        assert run(ctx, "P15", {"expected_status": 201}).passed is should_pass
        assert not run(ctx, "P15", {"expected_status": 409 + 1}).passed  # no 2xx expected: no inclusivity
        run(ctx, "P04", {"method": "DELETE", "path": "/api/projects/999999"})
        assert run(ctx, "P15", {"acceptable_statuses": [200, 204]}).passed is should_pass
        run(ctx, "P04", {"path": "/api/projects/999999"})
        assert not run(ctx, "P15", {}).passed  # a GET 404 is never inclusive
        run(ctx, "P04", {"method": "DELETE", "path": "/api/projects/1"})  # cleanup of "twice"
        ctx.close()


# === P16 ===========================================================================================
def test_p16_response_time(ctx: RunContext) -> None:
    assert not run(ctx, "P16", {"max_ms": 100}).passed  # no response yet
    run(ctx, "P04", {"path": "/api/health"})
    assert run(ctx, "P16", {}).passed and run(ctx, "P16", {"max_ms": 5000}).passed
    slow = run(ctx, "P16", {"path": "/api/debug/slow?ms=300", "threshold_ms": 100})
    assert not slow.passed and ctx.last_response.url.endswith("ms=300") and slow.value >= 300
    assert run(ctx, "P16", {"path": "/api/health", "max_response_time_ms": 3000}).passed
    assert any("'threshold_ms' -> max_ms" in n for n in normalisations("P16", {"threshold_ms": 5}))


# === P06 ===========================================================================================
def test_p06_required_fields_types_and_sources(admin: RunContext) -> None:
    ctx = admin
    run(
        ctx,
        "P04",
        {"method": "POST", "path": "/api/projects", "body": {"name": "p06", "tags": ["x"]}, "save_as": "proj"},
    )
    ok = run(
        ctx,
        "P06",
        {
            "required_fields": ["id", "name", "$.tags"],
            "field_types": {"id": "integer", "tags": "array", "archived": "boolean"},
        },
    )
    assert ok.passed, ok.message
    bad = run(
        ctx, "P06", {"required_fields": ["id", "missing.deep"], "field_types": {"name": "number", "id": "number"}}
    )
    assert not bad.passed and "missing.deep" in bad.message and "name: string, expected number" in bad.message
    run(ctx, "P04", {"path": "/api/admin/users"})  # a list body: its first element is checked
    assert isinstance(ctx.last_document, list)
    assert run(ctx, "P06", {"required_fields": ["username", "role"]}).passed
    assert run(ctx, "P06", {"response": "{{from_P04}}", "required_fields": ["username"], "field_types": {}}).passed
    assert run(ctx, "P06", {"response": "{{proj}}", "required_fields": ["name"]}).passed
    assert run(ctx, "P06", {"response": "proj", "required_fields": ["owner_id"]}).passed
    unresolved = run(ctx, "P06", {"response": "{{never_captured}}", "required_fields": ["x"]})
    assert not unresolved.passed and "never_captured" in unresolved.message
    run(ctx, "P04", {"path": "/api/public/ping"})
    text = run(ctx, "P06", {"required_fields": ["x"]})
    assert not text.passed and "not a JSON object" in text.message
    assert any(
        "from_Pnn" in n
        for n in normalisations("P06", {"response": "{{from_P04}}", "required_fields": ["a"], "field_types": {}})
    )
    empty = load_dag_data(
        {
            "nodes": [
                {
                    "id": "N",
                    "steps": [{"type": "P06", "inputs": {"required_fields": []}}],
                    "scoring": {"method": "binary", "maxScore": 1},
                }
            ]
        }
    )  # ychlukjm: loads, with a warning
    assert [i.message for i in empty.issues if i.kind == "warning"] == [
        "P06: no required_fields or field_types: this step checks nothing and passes (a DAG defect)"
    ]
