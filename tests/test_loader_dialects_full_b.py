"""Dialects of the 23 full public DAGs (issue #13), part B: database, integration, WebSocket, browser
primitives, the node-defect mechanism and node-level normalisations.

Each snippet reproduces a construct of a public SaaSBench dag.json (task named in the test), so CI
covers it without the public files: it must load with zero errors and its rewrite must be listed as a
normalisation; where the construct changes what is checked, a behaviour test shows the step passes on
a matching app and fails on a non-matching one.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dialects import clean, kinds, load, run
from localhttp import serve_http
from pydantic import model_validator

from saasbench.dag import DagLoadError, LoadResult, StepDefect, load_dag_data
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status, StepResult
from saasbench.primitives.registry import REGISTRY, PrimitiveInputs


# --- node level -----------------------------------------------------------------------------------
def test_numeric_complexity_tier_is_normalised() -> None:  # ididetxj RBAC_FIXTURE_SETUP: "complexity_tier": 1
    result = load({"type": "P13", "inputs": {}}, complexity_tier=1)
    assert result.dag.nodes[0].complexity_tier == "1"
    assert any(i.field == "complexity_tier" and "-> '1'" in i.message for i in result.normalisations)
    assert load({"type": "P13", "inputs": {}}, complexity_tier=2.5).dag.nodes[0].complexity_tier == "2.5"
    odd = load({"type": "P13", "inputs": {}}, complexity_tier=["deep"])
    assert odd.dag.nodes[0].complexity_tier is None and any(i.field == "complexity_tier" for i in odd.warnings)


def _engine_run(result: LoadResult, ctx: RunContext):
    report = Engine(result.dag, ctx).run()
    return report.nodes[0]


class _DefectInputs(PrimitiveInputs):
    things: list[str]

    @model_validator(mode="after")
    def _some(self) -> "_DefectInputs":
        if not self.things:
            raise StepDefect("X_DEFECT needs at least one thing: it checks nothing")
        return self


@pytest.fixture
def defect_code() -> Iterator[str]:
    """A plugin primitive whose empty input is a DAG defect (the mechanism P29's http.py proposal uses)."""
    calls: list[list[str]] = []

    def fn(inputs: _DefectInputs, ctx: RunContext) -> StepResult:
        calls.append(inputs.things)
        return StepResult(passed=True, message="ran")

    REGISTRY.register("X_DEFECT", fn, _DefectInputs, group="integration", description="test")
    try:
        yield "X_DEFECT"
    finally:
        REGISTRY.remove("X_DEFECT")


def test_step_defect_loads_with_a_warning_and_the_node_is_error_without_running(
    defect_code: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = load(
        {"type": "P12", "inputs": {"command": f"touch {marker}"}}, {"type": defect_code, "inputs": {"things": []}}
    )
    (warning,) = [i for i in result.warnings if i.field == "steps[1].inputs"]
    assert (
        warning.node == "N"
        and "X_DEFECT needs at least one thing" in warning.message
        and "DAG defect" in warning.message
    )
    assert result.dag.nodes[0].defects == ["steps[1] (X_DEFECT): X_DEFECT needs at least one thing: it checks nothing"]
    from saasbench.environments.exec_target import LocalExecTarget

    node = _engine_run(result, RunContext(Target(exec_target=LocalExecTarget(tmp_path))))
    assert node.status == Status.ERROR and node.score == 0 and not node.steps
    assert (
        node.message
        == "DAG defect, no step run: steps[1] (X_DEFECT): X_DEFECT needs at least one thing: it checks nothing"
    )
    assert not marker.exists()  # step 0 did not run either
    # the same chain without the defect runs (the mechanism is not a blanket ERROR)
    ok = load(
        {"type": "P12", "inputs": {"command": f"touch {marker}"}}, {"type": defect_code, "inputs": {"things": ["a"]}}
    )
    assert not ok.dag.nodes[0].defects
    assert (
        _engine_run(ok, RunContext(Target(exec_target=LocalExecTarget(tmp_path)))).status == Status.PASSED
        and marker.exists()
    )
    # other input errors of the same primitive still refuse the file
    with pytest.raises(DagLoadError):
        load({"type": defect_code, "inputs": {"things": "not a list"}})


def test_step_defect_after_placeholder_resolution_is_error(defect_code: str) -> None:
    result = load({"type": defect_code, "inputs": {"things": "{{wanted}}"}})
    assert not result.dag.nodes[0].defects  # a placeholder: checked at run time
    node = _engine_run(result, RunContext(Target(), variables={"wanted": []}))
    assert node.status == Status.ERROR and "X_DEFECT needs at least one thing" in node.message
    assert _engine_run(result, RunContext(Target(), variables={"wanted": ["a"]})).status == Status.PASSED


def test_p19_with_nothing_to_check_is_still_refused() -> None:
    assert any("P19 needs 'assertions'" in e for e in kinds("P19", {"url": "/"}, "error"))


# --- database (sqlite) ------------------------------------------------------------------------------
def _sqlite(tmp_path: Path) -> str:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE Booking (id INTEGER PRIMARY KEY, uid TEXT, title TEXT, "idempotencyKey" TEXT);
        CREATE UNIQUE INDEX Booking_uid_key ON Booking (uid);
        CREATE INDEX Booking_title_idx ON Booking (title);
        CREATE TABLE channels (id TEXT PRIMARY KEY, name TEXT, teamid TEXT, purpose TEXT);
        CREATE UNIQUE INDEX idx_channels_name_teamid ON channels (name, teamid);
        CREATE INDEX idx_channels_purpose ON channels (purpose, teamid);
        CREATE TABLE Response (id INTEGER PRIMARY KEY, "surveyId" TEXT, created_at TIMESTAMP);
        CREATE INDEX Response_surveyId_created_at_idx ON Response ("surveyId", created_at);
        CREATE TABLE log (id INTEGER PRIMARY KEY, log_from VARCHAR(20), claim_status TINYINT);
        CREATE TABLE users (id TEXT PRIMARY KEY, username TEXT, mfasecret TEXT);
        INSERT INTO users VALUES ('u1', 'eval_mfauser', 'JBSWY3DPEHPK3PXP');
        CREATE TABLE documents (id TEXT PRIMARY KEY, archived INTEGER);
        INSERT INTO documents VALUES ('d1', 1), ('d2', 0);
    """)
    conn.close()
    return f"sqlite:///{path}"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[RunContext]:
    ctx = RunContext(Target(db_dsn=_sqlite(tmp_path)), options=RunOptions(node_timeout_s=30))
    ctx.start_node_clock(30)
    yield ctx
    ctx.close()


IYJRUVFZ_P11 = {"table": "Booking", "column": "uid", "is_unique": True}  # DATA_BOOKING_UNIQUE_UID
SGDOSERD_P11 = {
    "table": "channels",
    "expected_columns": ["name", "teamid"],
    "unique_required": True,
}  # DB_INDEX_CHANNELS_NAME_TEAMID
KMASMNIL_P11 = {
    "table": "Response",
    "expected_indexes": [["surveyId", "created_at"], ["created_at"]],
}  # DB_INDEXES_PERFORMANCE


def test_p11_single_index_shorthands_load() -> None:
    notes = clean("P11", IYJRUVFZ_P11)
    assert "'column' -> one expected index" in notes and "'is_unique' -> the expected index's 'unique'" in notes
    assert "'expected_columns' + 'unique_required' -> one expected index covering every column (UNIQUE)" in clean(
        "P11", SGDOSERD_P11
    )
    assert "entries given as column lists -> {columns: [...]}" in clean("P11", KMASMNIL_P11)
    spec = REGISTRY.spec("P11").inputs
    (one,) = spec.model_validate(IYJRUVFZ_P11).expected_indexes
    assert (one.columns, one.unique) == (["uid"], True)
    (both,) = spec.model_validate(SGDOSERD_P11).expected_indexes
    assert (both.columns, both.unique) == (["name", "teamid"], True)
    (plain,) = spec.model_validate({**SGDOSERD_P11, "unique_required": False}).expected_indexes
    assert plain.unique is None  # not required: any index
    assert [i.columns for i in spec.model_validate(KMASMNIL_P11).expected_indexes] == [
        ["surveyId", "created_at"],
        ["created_at"],
    ]


def test_p11_single_index_shorthands_run(db: RunContext) -> None:
    assert run(db, "P11", IYJRUVFZ_P11).passed
    not_unique = run(db, "P11", {"table": "Booking", "column": "title", "is_unique": True})  # indexed, but not UNIQUE
    assert not not_unique.passed and "missing index" in not_unique.message
    assert not run(db, "P11", {"table": "Booking", "column": "idempotencyKey", "is_unique": True}).passed  # no index
    assert run(db, "P11", SGDOSERD_P11).passed
    assert not run(db, "P11", {**SGDOSERD_P11, "expected_columns": ["purpose", "teamid"]}).passed  # not unique
    assert run(db, "P11", {**SGDOSERD_P11, "expected_columns": ["purpose", "teamid"], "unique_required": False}).passed
    assert run(db, "P11", KMASMNIL_P11).passed
    assert not run(
        db, "P11", {"table": "Response", "expected_indexes": [["surveyId", "created_at"], ["deleted_at"]]}
    ).passed


LGZIVILY_P10 = {
    "table": "log",
    "expected_columns": [],
    "column_type_check": {"log_from": "varchar(20)"},
}  # BIZ_AUDIT_LOG_FROM_DEFAULT


def test_p10_column_type_check(db: RunContext) -> None:
    assert "column_type_check {column: type} -> expected_columns [{name, type}]" in clean("P10", LGZIVILY_P10)
    specs = REGISTRY.spec("P10").inputs.model_validate(LGZIVILY_P10).specs()
    assert [(s.name, s.type) for s in specs] == [("log_from", "varchar(20)")]
    merged = (
        REGISTRY.spec("P10")
        .inputs.model_validate(  # BIZ_CLAIM_STATUS_INT_TYPE: the named column gets the type
            {"table": "log", "expected_columns": ["claim_status"], "column_type_check": {"claim_status": "tinyint"}}
        )
        .specs()
    )
    assert [(s.name, s.type) for s in merged] == [("claim_status", "tinyint")]
    assert run(db, "P10", LGZIVILY_P10).passed
    wrong = run(db, "P10", {**LGZIVILY_P10, "column_type_check": {"log_from": "int"}})
    assert not wrong.passed and "does not match 'int'" in wrong.message
    assert not run(db, "P10", {**LGZIVILY_P10, "column_type_check": {"log_to": "varchar"}}).passed


def test_p08_comment_only_assertion_is_a_placeholder(db: RunContext) -> None:
    inputs = {
        "sql": "SELECT 'check' AS c",
        "assertions": [{"comment": "verify db reachability"}],
    }  # iyjruvfz SEC_APP_ENCRYPTION_KEY_LENGTH_32
    assert "assertions[0] is only a comment: a placeholder that checks nothing (dropped)" in clean("P08", inputs)
    assert run(db, "P08", inputs).passed
    empty = run(db, "P08", {**inputs, "sql": "SELECT id FROM users WHERE id = 'nobody'"})
    assert not empty.passed  # what is left: a SELECT must return rows (as the reference's 0-row rule)
    # a comment next to a real check is not a placeholder
    assert any(
        "needs a 'field'" in e
        for e in kinds("P08", {"sql": "SELECT 1", "assertions": [{"comment": "x", "expected": 1}]}, "error")
    )


def test_p08_store_field_as_and_capture_only(db: RunContext) -> None:
    inputs = {
        "sql": "SELECT mfasecret FROM users WHERE username='eval_mfauser' LIMIT 1",
        "store_field_as": "mfa_secret",
        "capture_only": True,
    }  # sgdoserd AUTH_MFA_REQUIRED_401
    notes = clean("P08", inputs)
    assert "'store_field_as' -> 'save_id'" in notes and "'capture_only: true': the step only captures" in notes
    assert run(db, "P08", inputs).passed and db.vars["mfa_secret"] == "JBSWY3DPEHPK3PXP"
    checked = {**inputs, "expected_result": {"mfasecret": "other"}}
    assert "(expected_result ignored, as in the reference)" in clean("P08", checked)
    assert run(db, "P08", checked).passed
    nothing = run(db, "P08", {**inputs, "sql": "SELECT mfasecret FROM users WHERE username='ghost'"})
    assert not nothing.passed and "nothing to capture" in nothing.message
    assert any("nothing is captured" in w for w in kinds("P08", {"sql": "SELECT 1", "capture_only": True}, "warning"))


# --- P24 no-op trigger ----------------------------------------------------------------------------
IDIDETXJ_P24 = {
    "trigger": {"type": "noop"},
    "verify": {  # BIZ_DOCUMENT_LIFECYCLE_FULL_CHAIN steps[10]
        "strategy": "db_query",
        "sql": "SELECT COUNT(*) AS c FROM documents WHERE id IN ('d1') AND archived = 1",
        "expected_result": {"c": 1},
        "max_wait_ms": 300,
    },
}


def test_p24_noop_trigger_only_polls(db: RunContext) -> None:
    assert "trigger type 'noop': nothing to fire, the step only polls 'verify'" in clean("P24", IDIDETXJ_P24)
    assert REGISTRY.spec("P24").inputs.model_validate(IDIDETXJ_P24).trigger is None
    result = run(db, "P24", IDIDETXJ_P24)
    assert result.passed, result.message
    assert not result.evidence["triggers"]
    missing = {
        **IDIDETXJ_P24,
        "verify": {
            **IDIDETXJ_P24["verify"],
            "sql": "SELECT COUNT(*) AS c FROM documents WHERE archived = 1 AND id = 'd2'",
        },
    }
    assert not run(db, "P24", missing).passed
    listed = {**IDIDETXJ_P24, "trigger": [{"type": "noop"}, {"type": "exec", "command": "true"}]}
    assert "no-op trigger(s) dropped" in clean("P24", listed)
    assert len(REGISTRY.spec("P24").inputs.model_validate(listed).trigger) == 1
    # a trigger type that is neither http, exec nor a no-op is still an error
    assert kinds("P24", {**IDIDETXJ_P24, "trigger": {"type": "carrier_pigeon"}}, "error")


# --- P30 totp_code ----------------------------------------------------------------------------------
def test_p30_totp_matches_rfc6238() -> None:
    from saasbench.primitives.integrations import totp

    secret = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"  # base32 of the RFC 6238 SHA1 key "12345678901234567890"
    assert totp(secret, at=59, digits=8) == "94287082" and totp(secret, at=1111111109, digits=8) == "07081804"
    assert (
        totp(secret.lower(), at=59) == "287082" and totp("gezd gnbv gy3t qojq gezd gnbv gy3t qojq", at=59) == "287082"
    )
    assert totp(secret, at=59 + 30, offset=-1) == "287082"


def test_p30_loads_and_captures_a_code(db: RunContext) -> None:
    inputs = {"secret_context_key": "mfa_secret", "store_as": "mfa_code"}  # sgdoserd AUTH_MFA_REQUIRED_401 steps[6]
    clean("P30", inputs)
    spec = REGISTRY.spec("P30")
    assert spec is not None and spec.name == "totp_code" and spec.status == "available"
    from saasbench.primitives.integrations import totp

    missing = run(db, "P30", inputs)
    assert not missing.passed and "nothing was captured as {{mfa_secret}}" in missing.message
    assert run(
        db, "P08", {"sql": "SELECT mfasecret FROM users LIMIT 1", "store_field_as": "mfa_secret", "capture_only": True}
    ).passed
    result = run(db, "P30", inputs)
    assert result.passed and db.vars["mfa_code"] in {totp("JBSWY3DPEHPK3PXP", offset=o) for o in (0, -1)}
    db.capture("mfa_secret", "not base32!")
    assert not run(db, "P30", inputs).passed
    assert run(db, "P30", {"secret": "JBSWY3DPEHPK3PXP", "store_as": "c2"}).passed and len(db.vars["c2"]) == 6


# --- P21 log read without a pattern ----------------------------------------------------------------
def test_p21_empty_pattern_reads_the_log_for_a_judge(tmp_path: Path) -> None:
    from saasbench.environments.exec_target import LocalExecTarget

    inputs = {"pattern": "", "tail_lines": 200}  # xayqujrv ARCH_LOG_STRUCTURE_QUALITY
    assert "empty 'pattern': the step only reads the log" in clean("P21", inputs)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "production.log").write_text("GET /health 200\nrequest_id=abc GET /api 200\n")
    ctx = RunContext(Target(exec_target=LocalExecTarget(tmp_path)))
    ctx.start_node_clock(30)
    result = run(ctx, "P21", inputs)
    assert result.passed and "no pattern" in result.message
    assert "request_id=abc" in ctx.vars["last_container_logs"]
    missing = run(ctx, "P21", {**inputs, "log_path": "log/none.log"})
    assert not missing.passed and "not found" in missing.message
    assert not run(ctx, "P21", {"pattern": "request_id=zzz"}).passed  # a pattern is still checked


# --- P21 JSON-event WebSocket dialect (sgdoserd, Mattermost) ---------------------------------------
WS_CONNECT = {"path": "/api/v4/websocket", "auth_via": "session", "expect_first_event": {"event": "hello", "seq": 0}}
WS_AUTH = {
    "path": "/api/v4/websocket",
    "send": [{"action": "authentication_challenge", "seq": 1, "data": {"token": "{{admin_token}}"}}],
    "expect_response": {"status": "OK", "seq_reply": 1},
}
WS_POSTED = {
    "path": "/api/v4/websocket",
    "trigger_after_connect": {
        "http_call": {
            "method": "POST",
            "path": "/api/v4/posts",
            "body": {"channel_id": "{{cid}}", "message": "WS test"},
        }
    },
    "expect_event": {
        "event": "posted",
        "data_keys_required": ["post", "channel_name"],
        "broadcast_channel_id": "{{cid}}",
    },
}
WS_TYPING = {"path": "/api/v4/websocket", "send": [{"action": "user_typing", "seq": 2, "data": {"channel_id": "c1"}}]}


def test_p21_json_event_dialect_loads() -> None:
    notes = clean("P21", WS_CONNECT)
    assert (
        "'auth_via: session'" in notes
        and "'expect_first_event' -> a received JSON message with {'event': 'hello', 'seq': 0} among the first 3"
        in notes
    )
    auth = REGISTRY.spec("P21").inputs.model_validate(WS_AUTH)
    assert auth.url == "/api/v4/websocket"
    assert json.loads(auth.steps[0].send) == WS_AUTH["send"][0] and auth.steps[1].expect_json == {
        "status": "OK",
        "seq_reply": 1,
    }
    assert "'send' (1 message(s)) -> one exchange step per message" in clean("P21", WS_AUTH)
    posted = REGISTRY.spec("P21").inputs.model_validate(WS_POSTED)
    assert posted.steps[0].http is not None and posted.steps[0].http.path == "/api/v4/posts"
    assert posted.steps[1].expect_json == {"event": "posted", "broadcast": {"channel_id": "{{cid}}"}}
    assert posted.steps[1].expect_json_keys == ["data.post", "data.channel_name"]
    typing = REGISTRY.spec("P21").inputs.model_validate(WS_TYPING)
    assert typing.steps[0].expect_any_message and typing.steps[1].send
    assert "no expected event: the app must send at least one message" in clean("P21", WS_TYPING)
    assert any(
        "event key 'colour'" in w
        for w in kinds("P21", {**WS_CONNECT, "expect_first_event": {"event": "hello", "colour": 1}}, "warning")
    )


class _MattermostLike:
    """A WebSocket that greets with 'hello' (unless the path is /silent), answers authentication
    challenges, and an HTTP API whose POST /api/v4/posts broadcasts a 'posted' event."""

    def __init__(self) -> None:
        self.clients: set[Any] = set()
        self.lock = threading.Lock()
        self.seq = 0

    def event(self, payload: dict[str, Any]) -> str:
        with self.lock:
            self.seq += 1
            return json.dumps({**payload, "seq": self.seq})

    def ws(self, conn: Any) -> None:
        path = conn.request.path
        if path != "/silent":
            conn.send(json.dumps({"event": "hello", "data": {"server_version": "9"}, "broadcast": {}, "seq": 0}))
        with self.lock:
            self.clients.add(conn)
        try:
            for message in conn:
                data = json.loads(message)
                if data.get("action") == "authentication_challenge":
                    ok = data.get("data", {}).get("token") == "good-token"
                    conn.send(json.dumps({"status": "OK" if ok else "FAIL", "seq_reply": data.get("seq")}))
        finally:
            with self.lock:
                self.clients.discard(conn)

    def broadcast(self, channel: str) -> None:
        message = self.event(
            {"event": "posted", "data": {"post": "{}", "channel_name": "town"}, "broadcast": {"channel_id": channel}}
        )
        with self.lock:
            clients = list(self.clients)
        for conn in clients:
            conn.send(message)


@pytest.fixture(scope="module")
def mattermost() -> Iterator[tuple[str, str]]:
    from websockets.sync.server import serve

    app = _MattermostLike()

    class Api(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/api/v4/posts":
                app.broadcast(body.get("channel_id", ""))
            data = b'{"id": "p1"}'
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    http = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    http.daemon_threads = True
    quiet = logging.getLogger("test_loader_dialects_full_b.ws")
    quiet.setLevel(logging.CRITICAL)
    ws = serve(app.ws, "127.0.0.1", 0, logger=quiet)
    threads = [
        threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True),
        threading.Thread(target=ws.serve_forever, daemon=True),
    ]
    for t in threads:
        t.start()
    yield f"http://127.0.0.1:{http.server_address[1]}", f"ws://127.0.0.1:{ws.socket.getsockname()[1]}"
    http.shutdown()
    http.server_close()
    ws.shutdown()


def _ws_ctx(base: str, **variables: Any) -> RunContext:
    ctx = RunContext(Target(base_url=base), variables=variables)
    ctx.start_node_clock(30)
    return ctx


# How long a failing expectation watches for its message: the local server answers within milliseconds
# (the runs that pass take a few), so a longer wait only adds time to each negative case.
ABSENT_MS = 300


def _at(inputs: dict[str, Any], ws: str, path: str = "/api/v4/websocket", **extra: Any) -> dict[str, Any]:
    out = {k: v for k, v in inputs.items() if k != "path"}
    return {**out, "url": ws + path, "timeout_ms": 3000, **extra}


def test_p21_json_events_run(mattermost: tuple[str, str]) -> None:
    base, ws = mattermost
    ctx = _ws_ctx(base, admin_token="good-token", cid="c1")
    hello = run(ctx, "P21", _at(WS_CONNECT, ws))
    assert hello.passed, hello.message
    silent = run(ctx, "P21", _at(WS_CONNECT, ws, "/silent", timeout_ms=ABSENT_MS))
    assert not silent.passed and "no message matching" in silent.message
    assert not run(
        ctx, "P21", _at({**WS_CONNECT, "expect_first_event": {"event": "hello", "seq": 5}}, ws, timeout_ms=ABSENT_MS)
    ).passed
    auth = run(ctx, "P21", _at(WS_AUTH, ws))
    assert auth.passed, auth.message
    sent = next(t["sent"] for t in auth.evidence["transcript"] if "sent" in t)
    assert json.loads(sent)["data"]["token"] == "good-token"  # placeholder resolved
    denied = run(_ws_ctx(base, admin_token="bad"), "P21", _at(WS_AUTH, ws, timeout_ms=ABSENT_MS))
    assert not denied.passed and "'status': 'OK'" not in denied.message and "no message matching" in denied.message
    posted = run(ctx, "P21", _at(WS_POSTED, ws))
    assert posted.passed, posted.message
    assert posted.evidence["steps"][0]["http"]["status"] == 201 and ctx.last_response.status == 201
    other = run(
        _ws_ctx(base, admin_token="good-token", cid="c2"),
        "P21",
        _at(
            {**WS_POSTED, "expect_event": {**WS_POSTED["expect_event"], "broadcast_channel_id": "c1"}},
            ws,
            timeout_ms=ABSENT_MS,
        ),
    )
    assert not other.passed  # the event went to channel c2
    keys = run(
        ctx,
        "P21",
        _at(
            {**WS_POSTED, "expect_event": {"event": "posted", "data_keys_required": ["sender_name"]}},
            ws,
            timeout_ms=ABSENT_MS,
        ),
    )
    assert not keys.passed  # the event lacks data.sender_name
    assert run(ctx, "P21", _at(WS_TYPING, ws)).passed  # any message (hello) is enough
    assert not run(ctx, "P21", _at(WS_TYPING, ws, "/silent", timeout_ms=ABSENT_MS)).passed


# --- P19 on the page a P04 fetched ------------------------------------------------------------------
PAGES = {
    "/auth/login": "<!DOCTYPE html><html><body><div id='root'><form><label>Email</label>"
    "<input name='authUser'><button>Sign in</button></form></div>"
    "<script>window.parent.postMessage({dimension: 1}, '*')</script></body></html>"
}


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = PAGES.get(self.path, "<html><body>not found</body></html>").encode()
            self.send_response(200 if self.path in PAGES else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serve_http(Handler) as url:
        yield url


def _page_ctx(site: str, tmp_path: Path) -> RunContext:
    ctx = RunContext(Target(base_url=site), options=RunOptions(node_timeout_s=60))
    ctx.vars["evidence_dir"] = str(tmp_path / "evidence")
    ctx.start_node_clock(60)
    return ctx


IYJRUVFZ_P19 = {"selector_or_text_one_of": ["Sign in", "Login", "login", "email", "Email"]}  # FRONT_AUTH_LOGIN_PAGE
SGDOSERD_P19 = {"selectors": ["#root", "html"], "all_required": False}  # FRONTEND_LOGIN_PAGE_RENDERS
LGZIVILY_P19 = {"selector": "input[name='authUser']", "expect_present": True}  # FE_LOGIN_PAGE_RENDERS


def test_p19_dialects_load() -> None:
    assert "'selector_or_text_one_of' -> 'source_contains_any'" in clean("P19", IYJRUVFZ_P19)
    notes = clean("P19", SGDOSERD_P19)
    assert "'selectors' -> one assertion per selector" in notes and "'all_required: false' -> 'require: any'" in notes
    assert "assertions[0]: 'expect_present' -> 'should_exist'" in clean("P19", LGZIVILY_P19)
    visible = clean("P19", {"selector": "[role=switch]", "assertion": "visible"})  # ididetxj FE_THEME_TOGGLE_PRESENT
    assert "'assertion: <check>' -> 'check'" in visible and "'visible: True'" in visible
    model = REGISTRY.spec("P19").inputs.model_validate(SGDOSERD_P19)
    assert [a.selector for a in model.assertions] == ["#root", "html"] and model.require == "any"


def test_p19_source_text_on_the_last_response_needs_no_browser(site: str, tmp_path: Path) -> None:
    ctx = _page_ctx(site, tmp_path)
    assert run(ctx, "P04", {"method": "GET", "path": "/auth/login"}).passed
    result = run(ctx, "P19", IYJRUVFZ_P19)
    assert result.passed and result.evidence["source"].startswith("the last response (GET")
    assert result.evidence["assertions"][0]["matched"] == "Sign in"
    assert run(ctx, "P19", {"selector_or_text_one_of": ["postMessage", "dimension"]}).passed  # in a script: the source
    missing = run(ctx, "P19", {"selector_or_text_one_of": ["Logout", "Dashboard"]})
    assert not missing.passed and "contains none of 'Logout', 'Dashboard'" in missing.message
    assert run(ctx, "P04", {"method": "GET", "path": "/nothing"}).passed  # the last response is now the 404 page
    assert not run(ctx, "P19", IYJRUVFZ_P19).passed
    empty = _page_ctx(site, tmp_path)
    assert "no 'url', no rendered page and no HTML response" in run(empty, "P19", IYJRUVFZ_P19).message


@pytest.mark.browser
def test_p19_selectors_on_the_last_response(site: str, tmp_path: Path) -> None:
    from saasbench.services.browser import find_chromium

    if not find_chromium():  # pragma: no cover - CI installs chromium (scripts/test.sh)
        pytest.fail("needs chromium (apt-get install chromium)")
    ctx = _page_ctx(site, tmp_path)
    run(ctx, "P04", {"method": "GET", "path": "/auth/login"})
    assert run(ctx, "P19", LGZIVILY_P19).passed
    absent = run(ctx, "P19", {**LGZIVILY_P19, "selector": "input[name='clearPass']"})
    assert not absent.passed and "no element matches" in absent.message
    assert run(ctx, "P19", SGDOSERD_P19).passed
    assert run(ctx, "P19", {"selectors": ["#nope", "#root"], "all_required": False}).passed  # one is enough
    both = run(ctx, "P19", {"selectors": ["#nope", "#root"], "all_required": True})
    assert not both.passed and "'#nope'" in both.message


# --- browser login with explicit credentials (aoiwqoiq SCREENSHOT login_as) -------------------------
def test_login_as_credentials_load_and_log_in_through_the_profile() -> None:
    from saasbench.primitives.browser import _identity
    from saasbench.services.auth import AuthProfile

    inputs = {
        "url": "http://localhost:8020/t/1",
        "name": "FE_TOPIC_VIEW",
        "login_as": {"username": "eval_admin", "password": "EvalPass12345!", "base_url": "http://localhost:8020"},
    }
    notes = clean("SCREENSHOT", inputs)
    assert (
        "'login_as {username, password}' -> 'login_credentials'" in notes
        and "base_url 'http://localhost:8020' is not used" in notes
    )
    model = REGISTRY.spec("SCREENSHOT").inputs.model_validate(inputs)
    assert model.login_credentials == {"username": "eval_admin", "password": "EvalPass12345!"} and model.as_role is None
    assert (
        REGISTRY.spec("SCREENSHOT").inputs.model_validate({**inputs, "login_as": "member"}).as_role == "member"
    )  # a role name

    profile = AuthProfile.model_validate(
        {
            "default_scheme": "basic",
            "schemes": {"basic": {"kind": "basic"}},
            "users": {"admin": {"username": "eval_admin", "password": "old"}},
        }
    )
    ctx = RunContext(Target(base_url="http://127.0.0.1:9"), auth_profile=profile)
    before = ctx.auth.active
    identity, problem = _identity(ctx, model)
    assert problem is None and identity is not None and identity.role == "admin"  # the profile role with that username
    import base64

    assert identity.headers["Authorization"] == "Basic " + base64.b64encode(b"eval_admin:EvalPass12345!").decode()
    assert ctx.auth.active is before  # the active identity is unchanged
    other = model.model_copy(update={"login_credentials": {"username": "guest1", "password": "pw"}})
    identity, problem = _identity(ctx, other)
    assert problem is None and identity.role == "guest1"
    incomplete = model.model_copy(update={"login_credentials": {"username": "guest1"}})
    assert _identity(ctx, incomplete) == (None, "login_credentials need a username (or email) and a password")


# --- P23 / P29 dialects of primitives/http.py (sgdoserd, xayqujrv, gavmyneb) ----------------------------
def test_p23_sgdoserd_files_form_becomes_one_upload() -> None:
    inputs = {
        "upload_path": "/api/v4/files",
        "form_fields": {"channel_id": "c1"},
        "files": [
            {"field": "files", "filename": "test.txt", "content_type": "text/plain", "content_b64": "SGVsbG8="},
            {"field": "files", "filename": "b.txt", "content_b64": "Yg=="},
        ],
    }
    assert not kinds("P23", inputs, "error")
    assert any("more file part(s) not sent" in w for w in kinds("P23", inputs, "warning"))
    model = REGISTRY.spec("P23").inputs.model_validate(inputs)
    up = model.upload
    assert (up.path, up.fields, up.file_field, up.file_name, up.content_type) == (
        "/api/v4/files",
        {"channel_id": "c1"},
        "files",
        "test.txt",
        "text/plain",
    )
    assert up.file_content == "base64:SGVsbG8=" and up.expected_status == [200, 201]


def test_p29_wait_steps_external_verify_and_workflow_defect(tmp_path: Path) -> None:
    waits = {
        "steps": [{"name": "wait_first_attempt", "_wait_seconds": 0.05}],
        "final_verify": {"_external_get": "http://localhost:9011/history?since=0", "expect_min_events": 3},
    }
    assert not kinds("P29", waits, "error")
    assert any("_external_get" in w and "not supported" in w for w in kinds("P29", waits, "warning"))
    ctx = RunContext(Target(base_url="http://127.0.0.1:9", workspace=tmp_path), options=RunOptions(node_timeout_s=10))
    result = run(ctx, "P29", waits)
    steps = {s["name"]: s for s in result.evidence["steps"]}
    assert (
        steps["step 1 'wait_first_attempt'"]["passed"]
        and "waited 0.05s" in steps["step 1 'wait_first_attempt'"]["message"]
    )
    assert not steps["final_verify"]["passed"] and "not supported" in steps["final_verify"]["message"]
    assert not result.passed  # a check we cannot make never passes

    # gavmyneb: {workflow: {trigger, poll}, expected_states, terminal}: nothing runnable -> defect, node ERROR, no step run
    flow = {
        "workflow": {"trigger": "POST /api/v1/courses/:course_id/content_migrations"},
        "expected_states": ["queued"],
        "terminal": "imported",
    }
    loaded = load({"type": "P29", "inputs": flow})
    assert any("state machine" in str(w) for w in loaded.warnings)
    node = _engine_run(loaded, RunContext(Target(base_url="http://127.0.0.1:9", workspace=tmp_path)))
    assert node.status == Status.ERROR and "DAG defect" in node.message and node.steps == []
    with pytest.raises(DagLoadError, match="needs a path"):
        load_dag_data(
            {
                "nodes": [
                    {
                        "id": "N",
                        "steps": [{"type": "P29", "inputs": {"steps": [{"name": "x"}]}}],
                        "scoring": {"method": "binary", "maxScore": 1},
                    }
                ]
            }
        )
