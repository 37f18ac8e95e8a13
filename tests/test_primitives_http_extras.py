"""Tests of P22 graphql_request, P23 file_upload, P26 search_query and P29 multi_step_workflow.

Everything runs against a small stdlib HTTP server on 127.0.0.1 (a GraphQL endpoint that
understands a tiny fixed set of queries, an upload/download endpoint, a search endpoint and a
Vaultwarden-like Send endpoint that allows at most one access) and a SQLite file for P29's
final_verify. Hostile values included: a captured id carrying SQL, GraphQL values with quotes,
a GraphQL reply with thousands of errors, a download URL pointing off-origin, an oversized file.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from shared_data import CONFORMANCE_DIR

from saasbench.dag import DagLoadError, _notes, load_dag_data
from saasbench.dag.placeholders import UnresolvedPlaceholder
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status, StepResult
from saasbench.primitives.http import render_graphql
from saasbench.primitives.registry import REGISTRY
from saasbench.services.auth import AuthProfile

ADMIN_TOKEN = "T-admin"
HOSTILE_ID = "x'); DROP TABLE sends; --"
PNG_BYTES = bytes(range(256)) * 4  # every byte value: a text round trip would corrupt it


# --- the app ---------------------------------------------------------------------------------------
class AppState:
    def __init__(self, db_path: Path):
        self.db_path = db_path
        self.lock = threading.Lock()
        self.files: dict[str, tuple[bytes, str]] = {}
        self.last_graphql: dict[str, Any] = {}
        self.last_auth: dict[str, str | None] = {}
        self.last_search: dict[str, Any] = {}
        self.last_upload: dict[str, Any] = {}
        self.enforce_max_access = True
        self.counter = 0
        with sqlite3.connect(db_path) as con:
            con.execute(
                "CREATE TABLE sends (uuid TEXT PRIMARY KEY, access_id TEXT, access_count INTEGER, max_access_count INTEGER)"
            )

    def next_id(self, prefix: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{prefix}-{self.counter}"


RECORDS = [
    {"id": 1, "name": "EvalCorp", "owner": {"email": "ann@eval.test"}, "employees": 12},
    {"id": 2, "name": "Eval Two", "owner": {"email": "bob@eval.test"}, "employees": 3},
    {"id": 3, "name": "Acme", "owner": {"email": "carl@acme.test"}, "employees": 40},
    {"id": 4, "name": "a&b=c#d", "owner": {"email": "odd@eval.test"}, "employees": 1},
]


def _string_arg(query: str, name: str) -> str | None:
    m = re.search(name + r'\s*:\s*"((?:[^"\\]|\\.)*)"', query)
    return json.loads(f'"{m.group(1)}"') if m else None


class Handler(BaseHTTPRequestHandler):
    state: AppState  # set per server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # helpers
    def _send(self, status: int, payload: Any, ctype: str = "application/json", length: bool = True) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _multipart(self, raw: bytes) -> tuple[dict[str, str], dict[str, tuple[str, bytes, str]]]:
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + raw
        )
        fields, files = {}, {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            if part.get_filename():
                files[name] = (part.get_filename(), payload, part.get_content_type())
            else:
                fields[name] = payload.decode()
        return fields, files

    # routes
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/files/huge"):
            self._send(200, b"x" * 200_000, "application/octet-stream", length=False)
            return
        if url.path.startswith("/files/"):
            key = url.path[len("/files/") :]
            if key not in self.state.files:
                self._send(404, {"message": "no such file"})
                return
            data, ctype = self.state.files[key]
            if "corrupt" in url.query:
                data = data[:-1] + b"!"
            self._send(200, data, ctype)
            return
        if url.path in ("/api/search", "/api/search-nested"):
            query = parse_qs(url.query, keep_blank_values=True)
            self._search(query.get("q", [""])[0], nested=url.path.endswith("nested"), extra=query)
            return
        self._send(404, {"message": "not found"})

    def _search(self, q: str, nested: bool = False, extra: Any = None) -> None:
        self.state.last_search = {"q": q, "extra": extra}
        hits = [r for r in RECORDS if q.casefold() in r["name"].casefold()]
        if nested:
            self._send(200, {"hits": {"total": len(hits), "hits": hits}})
        else:
            self._send(200, {"data": hits, "total": len(hits)})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        raw = self._body()
        self.state.last_auth[url.path] = self.headers.get("Authorization")
        if url.path in ("/graphql", "/metadata"):
            if self.headers.get("Content-Type", "").startswith("multipart/"):
                self._graphql_upload(raw)
            else:
                self._graphql(json.loads(raw))
        elif url.path in ("/upload", "/file/upload", "/upload-evil"):
            self._upload(raw, evil=url.path == "/upload-evil")
        elif url.path == "/api/search":
            self._search(json.loads(raw).get("q", ""))
        elif url.path == "/api/sends":
            self._create_send(json.loads(raw))
        elif url.path.startswith("/api/sends/access/"):
            self._access_send(url.path.rsplit("/", 1)[1])
        elif url.path == "/api/redirecting":
            self._send(200, {"id": "r-1", "next": "http://evil.invalid/steal"})
        else:
            self._send(404, {"message": "not found"})

    def _graphql(self, payload: dict[str, Any]) -> None:
        self.state.last_graphql = payload
        query = payload.get("query", "")
        if "createPerson" in query:
            first = _string_arg(query, "firstName")
            self._send(200, {"data": {"createPerson": {"id": "p-1", "name": {"firstName": first}}}})
        elif "people" in query:
            self._send(
                200,
                {
                    "data": {
                        "people": {
                            "edges": [
                                {"node": {"id": "p-1", "name": {"firstName": "GQL"}}},
                                {"node": {"id": "p-2", "name": {"firstName": "Other"}}},
                            ]
                        }
                    }
                },
            )
        elif "whoami" in query:
            self._send(200, {"data": {"whoami": self.headers.get("Authorization")}})
        elif "echoVars" in query:
            self._send(200, {"data": {"echoVars": payload.get("variables")}})
        elif "boom" in query:
            errors = [{"message": f"failure {i} " + "x" * 500, "extensions": {"code": "INTERNAL"}} for i in range(5000)]
            self._send(200, {"data": None, "errors": errors})
        elif "deleteCurrentWorkspace" in query:
            self._send(400, {"errors": [{"message": "Forbidden", "extensions": {"code": "FORBIDDEN"}}]})
        elif "plainText" in query:
            self._send(500, b"Internal Server Error", "text/plain")
        else:
            self._send(400, {"errors": [{"message": "Cannot query field"}]})

    def _graphql_upload(self, raw: bytes) -> None:
        fields, files = self._multipart(raw)
        operations, mapping = json.loads(fields["operations"]), json.loads(fields["map"])
        name, data, ctype = files["0"]
        key = self.state.next_id("g")
        self.state.files[key] = (data, ctype)
        self.state.last_upload = {"operations": operations, "map": mapping, "name": name}
        self._send(200, {"data": {"uploadFile": key}})

    def _upload(self, raw: bytes, evil: bool) -> None:
        if self.headers.get("Authorization") != f"Bearer {ADMIN_TOKEN}":
            self._send(401, {"message": "unauthorized"})
            return
        fields, files = self._multipart(raw)
        if not files:
            self._send(400, {"message": "no file"})
            return
        field, (name, data, ctype) = next(iter(files.items()))
        key = self.state.next_id("f")
        self.state.files[key] = (data, ctype)
        self.state.last_upload = {"field": field, "name": name, "ctype": ctype, "fields": fields}
        url = "http://169.254.169.254/latest/meta-data" if evil else f"/files/{key}"
        self._send(201, {"id": key, "url": url, "name": name})

    def _create_send(self, body: dict[str, Any]) -> None:
        if self.headers.get("Authorization") != f"Bearer {ADMIN_TOKEN}":
            self._send(401, {"message": "unauthorized"})
            return
        send_id = HOSTILE_ID if body.get("name") == "hostile" else str(uuid.uuid4())
        access_id = self.state.next_id("acc")
        with sqlite3.connect(self.state.db_path) as con:
            con.execute("INSERT INTO sends VALUES (?, ?, 0, ?)", (send_id, access_id, body.get("maxAccessCount")))
        self._send(
            200,
            {
                "id": send_id,
                "accessId": access_id,
                "object": "send",
                "name": body.get("name"),
                "maxAccessCount": body.get("maxAccessCount"),
                "deletionDate": body.get("deletionDate"),
            },
        )

    def _access_send(self, access_id: str) -> None:
        with sqlite3.connect(self.state.db_path) as con:
            row = con.execute(
                "SELECT uuid, access_count, max_access_count FROM sends WHERE access_id = ?", (access_id,)
            ).fetchone()
            if row is None or (self.state.enforce_max_access and row[2] is not None and row[1] >= row[2]):
                self._send(404, {"message": "Send not found"})
                return
            con.execute("UPDATE sends SET access_count = access_count + 1 WHERE access_id = ?", (access_id,))
        self._send(
            200, {"object": "send-access", "id": row[0], "authenticated": self.headers.get("Authorization") is not None}
        )


# --- fixtures --------------------------------------------------------------------------------------
@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[str, AppState]]:
    state = AppState(tmp_path / "app.sqlite")
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def make_ctx(base_url: str, db_path: Path | None = None) -> RunContext:
    profile = AuthProfile.model_validate(
        {
            "schemes": {"key": {"kind": "api_key", "api_key_header": "Authorization"}},
            "users": {"admin": {"api_key": f"Bearer {ADMIN_TOKEN}"}},
        }
    )
    target = Target(base_url=base_url, db_dsn=f"sqlite:///{db_path}" if db_path else None)
    return RunContext(
        target,
        options=RunOptions(http_timeout_s=10.0),
        auth_profile=profile,
        variables={"admin_token": ADMIN_TOKEN, "deletion_date": "2030-01-01T00:00:00Z"},
    )


@pytest.fixture
def ctx(app: tuple[str, AppState]) -> Iterator[RunContext]:
    base, state = app
    c = make_ctx(base, state.db_path)
    assert run(c, "P13", {"role": "admin"}).passed
    yield c
    c.close()


def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


def normalisations(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    return [i.message.removeprefix(f"{code}: ") for i in load_dag_data(dag).issues if i.kind == "normalisation"]


def load_errors(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    with pytest.raises(DagLoadError) as info:
        load_dag_data(dag)
    return [str(i) for i in info.value.issues]


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# === P22 ===========================================================================================
def test_p22_placeholders_in_string_literals_are_escaped(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    hostile = 'Ann" } }) { id } evil: deleteAll { x } #\\\n'
    ctx.capture("first", hostile)
    r = run(
        ctx,
        "P22",
        {
            "endpoint": "/graphql",
            "query": 'mutation { createPerson(data: { name: { firstName: "{{first}}" } }) { id name { firstName } } }',
            "store_as": {"pid": "$.data.createPerson.id"},
            "expect_no_errors": True,
        },
    )
    assert r.passed, r.message
    assert "deleteAll" not in state.last_graphql["query"].split('"')[0]  # the value stayed inside the literal
    assert ctx.vars["pid"] == "p-1" and ctx.last_created_id == "p-1"
    p07 = run(ctx, "P07", {"assertions": [{"path": "$.data.createPerson.name.firstName", "expected": hostile}]})
    assert p07.passed, p07.message  # the server decoded exactly the captured value


def test_p22_store_as_find_form_and_missing_capture(ctx: RunContext) -> None:
    q = "{ people(first: 5) { edges { node { id name { firstName } } } } }"
    r = run(
        ctx,
        "P22",
        {
            "query": q,
            "store_as": {
                "other": {"from": "$.data.people.edges", "find": {"node.name.firstName": "Other"}, "extract": "node.id"}
            },
        },
    )
    assert r.passed, r.message
    assert ctx.vars["other"] == "p-2"
    r = run(
        ctx,
        "P22",
        {"query": q, "store_as": {"nobody": {"from": "$.data.people.edges", "find": {"node.name.firstName": "Zed"}}}},
    )
    assert not r.passed and "store_as nobody" in r.message and "no element" in r.message
    r = run(ctx, "P22", {"query": q, "store_as": {"gone": "$.data.people.pageInfo"}})
    assert not r.passed and "store_as gone" in r.message


def test_p22_huge_errors_array_is_summarised(ctx: RunContext) -> None:
    r = run(ctx, "P22", {"query": "{ boom }", "expect_no_errors": True})
    assert not r.passed
    assert "5000 GraphQL error(s)" in r.message and "(+4997 more)" in r.message
    assert len(r.message) < 1500
    assert len(json.dumps(r.evidence)) < 8000
    # without expect_no_errors a GraphQL error answer is an observation (P07 judges it)
    r = run(ctx, "P22", {"query": "{ boom }"})
    assert r.passed and "allowed" in r.message


def test_p22_400_with_errors_body(ctx: RunContext) -> None:
    """RBAC_MEMBER_CANNOT_DELETE_WORKSPACE: a 400 carrying GraphQL errors is a response to judge."""
    step = {"endpoint": "/metadata", "query": "mutation { deleteCurrentWorkspace { id } }"}
    r = run(ctx, "P22", step)
    assert r.passed, r.message
    assert ctx.last_response is not None and ctx.last_response.status == 400
    p07 = run(
        ctx,
        "P07",
        {
            "assertions": [
                {"path": "$.data", "expected": None},
                {"path": "$.errors[0].extensions.code", "expected": "FORBIDDEN"},
            ]
        },
    )
    assert p07.passed, p07.message
    r = run(ctx, "P22", {**step, "expect_no_errors": True})
    assert not r.passed and "FORBIDDEN" in r.message and "status 400" in r.message


def test_p22_non_graphql_body_and_expect_data_path(ctx: RunContext) -> None:
    assert run(ctx, "P22", {"query": "{ plainText }"}).passed  # a response arrived
    r = run(ctx, "P22", {"query": "{ plainText }", "expect_no_errors": True})
    assert not r.passed and "not a GraphQL response" in r.message
    q = "{ people { edges { node { id } } } }"
    assert run(ctx, "P22", {"query": q, "expect_data_path": "people.edges[1].node.id"}).passed
    assert run(ctx, "P22", {"query": q, "expect_data_path": "$.data.people.edges[0].node.id"}).passed
    r = run(ctx, "P22", {"query": q, "expect_data_path": "people.pageInfo"})
    assert not r.passed and "expect_data_path" in r.message


def test_p22_identity_token_and_variables(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    run(ctx, "P22", {"query": "{ whoami }"})
    assert ctx.last_response.body["data"]["whoami"] == f"Bearer {ADMIN_TOKEN}"
    run(ctx, "P22", {"query": "{ whoami }", "token": ""})
    assert ctx.last_response.body["data"]["whoami"] is None
    run(ctx, "P22", {"query": "{ whoami }", "token": "other"})
    assert ctx.last_response.body["data"]["whoami"] == "Bearer other"
    ctx.capture("n", 7)
    run(
        ctx,
        "P22",
        {
            "query": "query Q($n: Int) { echoVars(n: $n) }",
            "variables": {"n": "{{n}}", "s": 'a"b'},
            "operation_name": "Q",
        },
    )
    assert state.last_graphql["variables"] == {"n": 7, "s": 'a"b'} and state.last_graphql["operationName"] == "Q"


def test_p22_transport_error_clears_last_response() -> None:
    ctx = make_ctx(f"http://127.0.0.1:{closed_port()}")
    r = run(ctx, "P22", {"query": "{ whoami }"})
    assert not r.passed and r.unreachable and ctx.last_response is None
    ctx.close()


def test_p22_placeholder_rules(ctx: RunContext) -> None:
    r = run(ctx, "P22", {"query": 'mutation { mergeCompanies(ids: ["{{m1}}"]) { id } }'})
    assert not r.passed and "{{m1}}" in r.message  # unresolved names fail the step, naming them
    ctx.capture("evil", "1) { id } x: deleteAll(")
    r = run(ctx, "P22", {"query": "{ people(first: {{evil}}) { id } }"})
    assert not r.passed and "outside a GraphQL string literal" in r.message
    ctx.capture("limit", 5)
    ctx.capture("stage", "DRAFT")
    assert (
        render_graphql(ctx, "{ a(first: {{limit}}, s: {{stage}}, t: {{flag}}) }".replace("{{flag}}", "true"))
        == "{ a(first: 5, s: DRAFT, t: true) }"
    )


def test_render_graphql_literals_blocks_and_comments() -> None:
    ctx = RunContext(Target(), variables={"v": 'q"u\\o\nte', "b": 'x"""y'})
    assert render_graphql(ctx, 'a(s: "{{v}}")') == 'a(s: "q\\"u\\\\o\\nte")'
    assert render_graphql(ctx, 'a(s: """{{b}}""")') == 'a(s: """x\\"""y""")'
    assert (
        render_graphql(ctx, 'a(s: "x\\"{{v}}")') == 'a(s: "x\\"q\\"u\\\\o\\nte")'
    )  # an escaped quote does not end the literal
    assert render_graphql(ctx, "# {{nope}} comment\n{ a }") == "# {{nope}} comment\n{ a }"
    assert render_graphql(ctx, "query($id: ID!) { a(id: $id) }") == "query($id: ID!) { a(id: $id) }"
    with pytest.raises(UnresolvedPlaceholder):
        render_graphql(ctx, '{ a(s: "{{missing}}") }')


def test_p22_load_time_model() -> None:
    assert "'path' -> 'endpoint'" in normalisations("P22", {"path": "/graphql", "query": "{ a }"})
    assert any("store_as" in e for e in load_errors("P22", {"query": "{ a }", "store_as": {"x": "$.a["}}))
    assert any("query" in e for e in load_errors("P22", {"endpoint": "/graphql"}))


# === P23 ===========================================================================================
def test_p23_real_dag_upload_runs(ctx: RunContext, app: tuple[str, AppState]) -> None:
    """fpumriig FILE_UPLOAD inputs, verbatim."""
    _, state = app
    inputs = {
        "upload": {
            "method": "POST",
            "path": "/file/upload",
            "file_name": "test.txt",
            "file_content": "base64:dGVzdA==",
            "content_type": "text/plain",
        }
    }
    r = run(ctx, "P23", inputs)
    assert r.passed, r.message
    assert state.last_upload["name"] == "test.txt" and state.last_upload["field"] == "file"
    assert state.files[ctx.vars["created_id"]] == (b"test", "text/plain")


def test_p23_upload_then_download_same_bytes(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    import base64

    inputs = {
        "upload": {
            "path": "/upload",
            "file_name": "pic.bin",
            "file_content": "base64:" + base64.b64encode(PNG_BYTES).decode(),
            "content_type": "application/octet-stream",
            "file_field": "attachment",
            "fields": {"folder": "eval", "n": 3},
        },
        "download": {"path": "/files/{{id}}", "expect_same_content": True},
    }
    r = run(ctx, "P23", inputs)
    assert r.passed, r.message
    assert state.last_upload["field"] == "attachment" and state.last_upload["fields"] == {"folder": "eval", "n": "3"}
    assert r.evidence["download"]["sha256"] == r.evidence["sha256"]
    # P07 after P23 reads the upload response
    assert run(ctx, "P07", {"assertions": [{"path": "$.name", "expected": "pic.bin"}]}).passed
    # the url of the upload response when no path is given; {{upload.<field>}} also works
    assert run(ctx, "P23", {**inputs, "download": {}}).passed
    assert run(ctx, "P23", {**inputs, "download": {"path": "{{upload.url}}"}}).passed


def test_p23_download_mismatch_cap_and_off_origin(ctx: RunContext) -> None:
    up = {"path": "/upload", "file_name": "a.txt", "file_content": "hello world"}
    r = run(ctx, "P23", {"upload": up, "download": {"path": "/files/{{id}}?corrupt=1"}})
    assert not r.passed and "differ from the uploaded" in r.message
    r = run(ctx, "P23", {"upload": up, "download": {"path": "/files/{{id}}?corrupt=1", "expect_same_content": False}})
    assert r.passed, r.message
    r = run(ctx, "P23", {"upload": up, "download": {"path": "/files/huge", "max_bytes": 1024}})
    assert not r.passed and "1024-byte cap" in r.message
    r = run(ctx, "P23", {"upload": up, "download": {"path": "/files/nope-{{id}}", "expect_status": 200}})
    assert not r.passed and "-> 404" in r.message
    r = run(ctx, "P23", {"upload": {**up, "path": "/upload-evil"}, "download": {}})
    assert not r.passed and "outside the app's origin" in r.message
    r = run(ctx, "P23", {"upload": {**up, "path": "/upload-evil"}, "download": {"path": "{{upload.url}}"}})
    assert not r.passed and "outside the app's origin" in r.message


def test_p23_status_anonymous_and_graphql_upload(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    r = run(ctx, "P23", {"upload": {"path": "/upload", "file_name": "a.txt"}, "token": ""})
    assert not r.passed and "-> 401" in r.message and "expected 2xx" in r.message
    assert run(
        ctx, "P23", {"upload": {"path": "/upload", "file_name": "a.txt", "expected_status": [401]}, "token": ""}
    ).passed
    gql = {
        "upload": {
            "file_name": "logo.png",
            "graphql": {"endpoint": "/metadata", "query": "mutation($file: Upload!) { uploadFile(file: $file) }"},
        },
        "download": {"path": "/files/{{id}}"},
    }
    r = run(ctx, "P23", gql)
    assert r.passed, r.message
    assert state.last_upload["map"] == {"0": ["variables.file"]} and state.last_upload["operations"]["variables"] == {
        "file": None
    }
    assert state.files[ctx.vars["created_id"]][0].startswith(b"\x89PNG")  # a real sample image for an image name


def test_p23_inputs_normalisation_and_validation() -> None:
    notes = normalisations(
        "P23", {"method": "POST", "path": "/up", "filename": "x.txt", "field_name": "f", "extra_fields": {"a": 1}}
    )
    assert "flat upload keys -> upload: {...}" in notes
    assert {"'filename' -> 'file_name'", "'field_name' -> 'file_field'", "'extra_fields' -> 'fields'"} <= set(notes)
    assert any("base64" in e for e in load_errors("P23", {"upload": {"path": "/u", "file_content": "base64:!!!"}}))


# === P26 ===========================================================================================
def test_p26_counts_contains_and_absent(ctx: RunContext, app: tuple[str, AppState]) -> None:
    r = run(
        ctx,
        "P26",
        {
            "path": "/api/search",
            "query": "eval",
            "expect_min_results": 2,
            "expect_contains": ["EVALCORP", {"owner.email": "bob@eval.test"}, 12],
            "expect_absent": ["Acme"],
        },
    )
    assert r.passed, r.message
    assert r.evidence["results_path"] == "$.data" and r.evidence["result_count"] == 2
    r = run(
        ctx,
        "P26",
        {
            "path": "/api/search",
            "query": "eval",
            "expect_absent": ["Two"],
            "expect_contains": ["Acme"],
            "expect_max_results": 1,
        },
    )
    assert not r.passed
    assert 'no result contains "Acme"' in r.message and "must be absent" in r.message and "at most 1" in r.message
    assert run(
        ctx, "P07", {"assertions": [{"path": "$.total", "expected": 2}]}
    ).passed  # the response is the last response


def test_p26_query_is_encoded_and_other_shapes(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    r = run(
        ctx,
        "P26",
        {
            "endpoint": "/api/search",
            "query": "a&b=c#d",
            "params": {"page": 1},
            "expect_min_results": 1,
            "expect_first_contains": [{"id": 4}],
        },
    )
    assert r.passed, r.message
    assert state.last_search["q"] == "a&b=c#d" and state.last_search["extra"]["page"] == ["1"]
    assert (
        run(ctx, "P26", {"path": "/api/search-nested", "query": "eval", "expect_min_results": 2}).evidence[
            "results_path"
        ]
        == "$.hits.hits"
    )
    assert run(
        ctx,
        "P26",
        {"path": "/api/search-nested", "query": "eval", "results_path": "$.hits.hits", "expect_contains": ["Two"]},
    ).passed
    assert run(
        ctx, "P26", {"path": "/api/search", "method": "POST", "query": "acme", "expect_first_contains": ["carl@"]}
    ).passed
    r = run(ctx, "P26", {"path": "/api/search-nested", "query": "eval", "results_path": "$.hits.total"})
    assert not r.passed and "not a list" in r.message
    r = run(ctx, "P26", {"path": "/api/nothing", "query": "x"})
    assert not r.passed and "-> 404" in r.message


def test_p26_legacy_expected_results() -> None:
    notes = normalisations(
        "P26",
        {
            "path": "/api/search",
            "params": {"q": "x"},
            "expected_results": {"min_count": 1, "first_result_contains": "x"},
        },
    )
    assert any("expected_results" in n for n in notes)
    assert any("not understood" in e for e in load_errors("P26", {"expected_results": {"nonsense": 1}}))


# === P29 ===========================================================================================
def _real_p29_inputs() -> dict[str, Any]:
    """ubsmhopy BIZ_SEND_MAX_ACCESS, read from the conformance DAG (verbatim)."""
    path = CONFORMANCE_DIR / "task_ubsmhopy" / "dag.json"
    if not path.is_file():
        pytest.skip("conformance data not available")
    raw = json.loads(path.read_text(encoding="utf-8-sig"))
    node = next(n for n in raw["nodes"] if n["id"] == "BIZ_SEND_MAX_ACCESS")
    chain = node.get("steps") or node["primitive_chain"]
    return next(s["inputs"] for s in chain if s["type"] == "P29")


def test_p29_real_dag_send_max_access(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    r = run(ctx, "P29", _real_p29_inputs())
    assert r.passed, r.message
    assert r.value["steps_passed"] == r.value["steps_total"] == 4 and r.value["ratio"] == 1.0
    assert state.last_auth["/api/sends"] == f"Bearer {ADMIN_TOKEN}"
    assert not any(k.startswith("/api/sends/access/") and v for k, v in state.last_auth.items())  # token "" = anonymous
    with sqlite3.connect(state.db_path) as con:
        assert con.execute("SELECT access_count FROM sends").fetchall() == [(1,)]


def test_p29_broken_app_names_the_failing_steps(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    state.enforce_max_access = False
    r = run(ctx, "P29", _real_p29_inputs())
    assert not r.passed
    assert r.value["steps_passed"] == 2 and r.value["steps_total"] == 4 and r.evidence["ratio"] == 0.5
    assert "step 2 'second_access'" in r.message and "status 200, expected [404]" in r.message
    assert "final_verify" in r.message


def test_p29_hostile_captured_id_is_bound_not_spliced(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    inputs = _real_p29_inputs()
    inputs = {
        **inputs,
        "entity_setup": {**inputs["entity_setup"], "body": {**inputs["entity_setup"]["body"], "name": "hostile"}},
    }
    r = run(ctx, "P29", inputs)
    assert r.passed, r.message
    assert r.value["id"] == HOSTILE_ID
    with sqlite3.connect(state.db_path) as con:  # the table survived and holds the hostile id as data
        assert con.execute("SELECT uuid, access_count FROM sends").fetchall() == [(HOSTILE_ID, 1)]
    assert ctx.vars["created_id"] == HOSTILE_ID
    assert "id" not in ctx.node_scope or ctx.node_scope["id"] != HOSTILE_ID  # the per-step scope did not leak


def test_p29_step_features(ctx: RunContext, app: tuple[str, AppState]) -> None:
    _, state = app
    setup = {
        "method": "POST",
        "path": "/api/sends",
        "body": {"name": "s", "maxAccessCount": 5},
        "token": "{{admin_token}}",
    }
    r = run(
        ctx,
        "P29",
        {
            "entity_setup": setup,
            "steps": [
                {
                    "name": "one",
                    "method": "POST",
                    "path": "/api/sends/access/{{accessId}}",
                    "expect_state": [
                        {"path": "$.object", "value": "send-access"},
                        {"path": "$.id", "value": "{{id}}"},
                        {"path": "$.authenticated", "op": "equals", "expected": True},
                    ],
                },
                {
                    "name": "two",
                    "method": "POST",
                    "path": "/api/sends/access/{{setup.accessId}}",
                    "token": "explicit",
                    "expected_status": [200],
                    "expect_state": {"path": "$.id", "value": "{{one.body.id}}"},
                },
                {"name": "three", "method": "POST", "path": "/api/sends/access/{{nowhere}}", "expect_status": 200},
            ],
        },
    )
    assert not r.passed
    assert r.value["steps_passed"] == 3 and r.value["steps_total"] == 4
    assert "step 3 'three'" in r.message and "{{nowhere}}" in r.message
    access_paths = [k for k in state.last_auth if k.startswith("/api/sends/access/")]
    assert len(access_paths) == 1 and state.last_auth[access_paths[0]] == "Bearer explicit"  # step two's explicit token


def test_p29_refuses_captured_off_origin_urls_and_bad_setup(ctx: RunContext) -> None:
    r = run(
        ctx, "P29", {"entity_setup": {"path": "/api/redirecting"}, "steps": [{"method": "GET", "path": "{{next}}"}]}
    )
    assert not r.passed and "outside the app's origin" in r.message
    r = run(
        ctx, "P29", {"entity_setup": {"path": "/api/sends", "body": {}, "token": ""}, "steps": [{"path": "/x/{{id}}"}]}
    )
    assert not r.passed and "entity_setup" in r.message and "expected [200, 201]" in r.message and "{{id}}" in r.message


def test_p29_final_verify_without_database(app: tuple[str, AppState]) -> None:
    base, _ = app
    ctx = make_ctx(base)  # no DSN
    run(ctx, "P13", {"role": "admin"})
    r = run(ctx, "P29", {"steps": [{"method": "GET", "path": "/api/search?q=x"}], "final_verify": {"sql": "SELECT 1"}})
    assert not r.passed and "final_verify" in r.message and r.value["steps_passed"] == 1
    ctx.close()


def test_p29_inputs_validation() -> None:
    inputs = _real_p29_inputs()
    bucket: list[str] = []
    token = _notes.set(bucket)
    try:
        model = REGISTRY.spec("P29").inputs.model_validate(inputs)
    finally:
        _notes.reset(token)
    assert model.entity_setup is not None and not model.entity_setup.model_extra
    for step in model.steps:
        assert not step.model_extra, step.model_extra  # every nested key of the real DAG is understood
    assert not model.final_verify.model_extra and model.final_verify.db_query.startswith("SELECT")
    assert model.steps[0].expect_state[0].expected == "send-access" and model.steps[0].expect_state[0].op == "equals"
    literal = REGISTRY.spec("P29").inputs.model_validate(
        {"steps": [{"path": "/x", "expect_state": {"path": "$.kind", "value": "array"}}]}
    )
    assert literal.steps[0].expect_state[0].op == "equals"  # not P07's magic "array" -> is_array
    # nothing to run is a DAG defect (gavmyneb has one): the file loads, a warning names it, the node will be ERROR
    empty = {
        "nodes": [
            {
                "id": "N",
                "steps": [{"type": "P29", "inputs": {"steps": []}}],
                "scoring": {"method": "binary", "maxScore": 1},
            }
        ]
    }
    loaded = load_dag_data(empty)
    assert any("checks nothing" in str(w) for w in loaded.warnings) and loaded.dag.nodes[0].steps[0].defect
    assert any("expect_status" in e for e in load_errors("P29", {"steps": [{"path": "/x", "expect_status": 99}]}))
    assert "'sql' -> 'db_query'" in normalisations(
        "P29", {"steps": [{"path": "/x"}], "final_verify": {"sql": "SELECT 1"}}
    )


def test_nested_keys_of_real_p22_p23_inputs_are_understood() -> None:
    path = CONFORMANCE_DIR / "task_fpumriig" / "dag.json"
    if not path.is_file():
        pytest.skip("conformance data not available")
    raw = json.loads(path.read_text(encoding="utf-8-sig"))
    seen = set()
    for node in raw["nodes"]:
        for step in node.get("steps") or node.get("primitive_chain") or []:
            if step["type"] in ("P22", "P23"):
                seen.add(step["type"])
                model = REGISTRY.spec(step["type"]).inputs.model_validate(step["inputs"])
                assert not model.model_extra
                if step["type"] == "P23":
                    assert not model.upload.model_extra and model.upload.file_content == "base64:dGVzdA=="
    assert seen == {"P22", "P23"}


# === through the engine ===========================================================================
def test_engine_runs_p29_and_p22_nodes(app: tuple[str, AppState]) -> None:
    base, state = app
    inputs = _real_p29_inputs()
    dag = load_dag_data(
        {
            "nodes": [
                {
                    "id": "LOGIN",
                    "steps": [{"type": "P13", "inputs": {"role": "admin"}}],
                    "scoring": {"method": "binary", "maxScore": 0},
                },
                {
                    "id": "SEND",
                    "prereqs": ["LOGIN"],
                    "steps": [{"type": "P29", "inputs": inputs}],
                    "scoring": {"method": "binary", "maxScore": 5},
                },
                {
                    "id": "GQL",
                    "prereqs": ["LOGIN"],
                    "steps": [
                        {
                            "type": "P22",
                            "inputs": {
                                "query": "{ people { edges { node { id } } } }",
                                "store_as": {"pid": "$.data.people.edges[0].node.id"},
                            },
                        },
                        {
                            "type": "P22",
                            "inputs": {
                                "query": 'mutation { createPerson(data: { name: { firstName: "{{pid}}" } }) { id } }',
                                "expect_no_errors": True,
                            },
                        },
                        {
                            "type": "P07",
                            "inputs": {
                                "assertions": [{"path": "$.data.createPerson.name.firstName", "expected": "p-1"}]
                            },
                        },
                    ],
                    "scoring": {"method": "weighted", "maxScore": 3},
                },
            ]
        }
    ).dag
    ctx = make_ctx(base, state.db_path)
    report = Engine(dag, ctx).run()
    ctx.close()
    by_id = {n.id: n for n in report.nodes}
    assert by_id["SEND"].status == Status.PASSED, by_id["SEND"].message
    assert by_id["GQL"].status == Status.PASSED and by_id["GQL"].score == 3, by_id["GQL"].message
