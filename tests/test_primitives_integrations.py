"""Tests of the integration primitives (P24, P27, P28, P_INGEST) and saasbench.services.receivers.

Everything runs on real sockets on 127.0.0.1 against a small app defined here that, when asked,
delivers a webhook to the URL it is given, sends mail with smtplib, finishes a background job in a
thread (then writes SQLite) and ingests analytics events. No assertion depends on timing: waits
are bounded by the primitives' own timeouts, and "nothing arrived" cases use short ones.
"""

from __future__ import annotations

import json
import smtplib
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from saasbench.dag import load_dag_data
from saasbench.environments.base import ExecResult
from saasbench.evaluation.context import RunContext, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status, StepResult
from saasbench.primitives.integrations import body_mismatch, headers_mismatch
from saasbench.primitives.registry import REGISTRY
from saasbench.services.receivers import MockReceiver, SmtpSink, WebhookReceiver, parse_message


# --- the app under test ---------------------------------------------------------------------------
class App:
    """A tiny SaaS app: webhooks, mail, background jobs, analytics ingestion, on 127.0.0.1."""

    def __init__(self, db_path: Path):
        self.db_path = str(db_path)
        with sqlite3.connect(self.db_path) as conn:
            conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT)")
            conn.execute("CREATE TABLE events (name TEXT, url TEXT)")
        self.threads: list[threading.Thread] = []
        app = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, payload: Any) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw.strip() else None

            def do_POST(self) -> None:
                body = self._body()
                route = urlsplit(self.path).path
                if route == "/orders":
                    event = body.get("event", "order.created")
                    app.later(
                        app.deliver,
                        body["webhook_url"],
                        {"event": event, "data": {"id": body["order_id"], "total": 42}},
                    )
                    self._json(201, {"id": body["order_id"]})
                elif route == "/orders-silent":
                    self._json(201, {"id": body.get("order_id")})
                elif route == "/invite":
                    app.later(app.mail, body["smtp_host"], int(body["smtp_port"]), body["email"])
                    self._json(202, {"invited": body["email"]})
                elif route == "/jobs":
                    timer = threading.Timer(0.2, app.finish_job, args=(body["id"],))
                    app.threads.append(timer)
                    timer.start()
                    self._json(202, {"queued": body["id"]})
                elif route == "/api/event":
                    events = (
                        body
                        if isinstance(body, list)
                        else body.get("events", [body])
                        if isinstance(body, dict) and "events" in body
                        else [body]
                    )
                    with sqlite3.connect(app.db_path) as conn:
                        conn.executemany(
                            "INSERT INTO events VALUES (?, ?)", [(e["name"], e.get("url", "")) for e in events]
                        )
                    self._json(202, {"accepted": len(events)})
                elif route == "/broken-ingest":
                    self._json(500, {"error": "ingestion down"})
                else:
                    self._json(404, {"error": "not found"})

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path.startswith("/jobs/"):
                    with sqlite3.connect(app.db_path) as conn:
                        row = conn.execute(
                            "SELECT status FROM jobs WHERE id = ?", (parts.path.rsplit("/", 1)[1],)
                        ).fetchone()
                    self._json(200, {"status": row[0] if row else "pending"})
                elif parts.path == "/api/stats":
                    name = parse_qs(parts.query).get("name", [""])[0]
                    with sqlite3.connect(app.db_path) as conn:
                        (count,) = conn.execute("SELECT COUNT(*) FROM events WHERE name = ?", (name,)).fetchone()
                    self._json(200, {"name": name, "count": count})
                else:
                    self._json(404, {"error": "not found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def later(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        self.threads.append(t)
        t.start()

    @staticmethod
    def deliver(url: str, payload: dict[str, Any]) -> None:
        request = urllib.request.Request(
            url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "X-Webhook-Signature": "sha256=deadbeef"},
        )
        try:
            urllib.request.urlopen(request, timeout=5).read()
        except OSError:
            pass

    @staticmethod
    def mail(host: str, port: int, to: str) -> None:
        msg = EmailMessage()
        msg["From"] = "Acme <noreply@acme.test>"
        msg["To"] = to
        msg["Subject"] = "You're invited to Acme – welcome"
        msg.set_content("Hello!\nJoin here: https://acme.test/join/abc123\n")
        msg.add_alternative("<p>Hello! <a href='https://acme.test/join/abc123'>Join</a></p>", subtype="html")
        with smtplib.SMTP(host, port, timeout=5) as smtp:
            smtp.login("app", "secret")
            smtp.send_message(msg)

    def finish_job(self, job_id: str) -> None:
        with sqlite3.connect(self.db_path) as conn:
            conn.execute("INSERT OR REPLACE INTO jobs VALUES (?, 'done')", (job_id,))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for t in self.threads:
            t.join(timeout=5)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = App(tmp_path / "app.db")
    yield a
    a.close()


@pytest.fixture
def ctx(app: App) -> Iterator[RunContext]:
    c = RunContext(Target(base_url=app.url, db_dsn=f"sqlite:///{app.db_path}"))
    yield c
    c.close()


def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def normalisations(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    return [i.message for i in load_dag_data(dag).issues if i.kind == "normalisation"]


ORDER_TRIGGER = {"method": "POST", "path": "/orders", "body": {"webhook_url": "{{webhook_url}}", "order_id": "o-1"}}


# --- receivers ------------------------------------------------------------------------------------
def test_receiver_records_requests_and_serves_mock_routes() -> None:
    with WebhookReceiver() as r:
        assert r.port > 0 and r.url == f"http://127.0.0.1:{r.port}/hook"
        assert http("POST", r.url, {"a": 1}) == (200, {"ok": True, "status": 200})
        status, _ = http("POST", r.base_url + "/always-500", {"b": 2})
        assert status == 500
        status, history = http("GET", r.base_url + "/history")
        assert status == 200 and [h["path"] for h in history] == ["/hook", "/always-500"]
        assert history[0]["body"] == {"a": 1} and history[0]["headers"]["content-type"] == "application/json"
        assert http("DELETE", r.base_url + "/history")[0] == 200
        assert http("GET", r.base_url + "/history") == (200, [])
        assert r.deliveries() == []


def test_receiver_caps_bodies_and_reads_chunked() -> None:
    with WebhookReceiver() as r:
        big = b"x" * (1024 * 1024 + 10)
        urllib.request.urlopen(urllib.request.Request(r.url, data=big, method="POST"), timeout=5).read()
        d = r.wait_for(lambda d: True, 5)
        assert d is not None and len(d.body) == 1024 * 1024 and d.truncated
        with socket.create_connection(("127.0.0.1", r.port), timeout=5) as s:
            s.sendall(
                b"POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            assert b"200" in s.recv(1024)
        d = r.wait_for(lambda d: d.body == b"hello world", 5)
        assert d is not None and not d.truncated


def test_wait_for_wakes_on_delivery_and_times_out() -> None:
    with WebhookReceiver() as r:
        baseline = r.last_seq
        threading.Thread(target=http, args=("POST", r.url, {"n": 1}), daemon=True).start()
        got = r.wait_for(lambda d: d.json == {"n": 1}, 10, after_seq=baseline)
        assert got is not None and got.method == "POST"
        assert r.wait_for(lambda d: True, 0.05, after_seq=r.last_seq) is None


def test_smtp_sink_captures_and_serves_mailhog_api() -> None:
    with SmtpSink() as sink:
        App.mail("127.0.0.1", sink.port, "alice@example.com")
        msg = sink.wait_for(lambda m: True, 5)
        assert msg is not None
        assert msg.recipients == ["alice@example.com"] and msg.subject == "You're invited to Acme – welcome"
        assert "join/abc123" in msg.text and msg.mail_from == "noreply@acme.test"
        status, body = http("GET", sink.api_url)
        assert status == 200 and body["total"] == 1
        item = body["items"][0]
        assert item["Raw"]["To"] == ["alice@example.com"] and item["Content"]["Headers"]["To"] == ["alice@example.com"]
        assert http("DELETE", sink.api_url.replace("/api/v2/", "/api/v1/"))[0] == 200
        assert sink.messages() == []


def test_smtp_sink_dot_stuffing_and_plain_message() -> None:
    with SmtpSink(api_port=None) as sink:
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
            smtp.sendmail("a@x.test", ["b@y.test", "c@y.test"], "Subject: hi\r\n\r\nline\r\n.starts with dot\r\n")
        msg = sink.wait_for(lambda m: True, 5)
        assert msg is not None and msg.rcpt_to == ["b@y.test", "c@y.test"]
        assert ".starts with dot" in msg.text and msg.subject == "hi"
        assert sink.api_url is None


def test_parse_message_without_headers_never_raises() -> None:
    parsed = parse_message(b"garbage without headers")
    assert parsed["subject"] == "" and parsed["recipients"] == []


def test_cli_mock_receiver_service(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "saasbench.services.receivers", "mock", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        base = f"http://127.0.0.1:{info['port']}"
        assert http("POST", base + "/hook", {"x": 1})[0] == 200
        assert http("POST", base + "/always-500", {"x": 2})[0] == 500
        _, history = http("GET", base + "/history")
        assert [h["body"] for h in history] == [{"x": 1}, {"x": 2}]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


# --- matching -------------------------------------------------------------------------------------
def test_body_matching_rules() -> None:
    body = {"event": "order.created", "data": {"id": "o-1", "total": 42, "tags": ["a", "b"]}}
    raw = json.dumps(body)
    assert body_mismatch({"event": "order.created"}, raw, body) is None
    assert body_mismatch({"event": "created"}, raw, body) is None  # values are substring-matched
    assert body_mismatch({"data": {"id": "o-1", "total": 42}}, raw, body) is None  # nested: by path
    assert body_mismatch({"data.id": "o-1"}, raw, body) is None  # dotted path
    assert "data.total" in body_mismatch({"data": {"total": 41}}, raw, body)
    assert "event" in body_mismatch({"event": "order.deleted"}, raw, body)  # key present: its value decides
    assert body_mismatch({"type": "order.created"}, raw, body) is None  # key absent: reference rule, raw substring
    assert body_mismatch({"type": "refund"}, raw, body) is not None
    assert body_mismatch("order.created", raw, body) is None and body_mismatch(["o-1", "42"], raw, body) is None
    assert body_mismatch({"data": {"tags": ["b"]}}, raw, body) is None
    assert body_mismatch({"x": "hello"}, "form=hello", None) is None  # non-JSON body: raw substring
    assert headers_mismatch({"X-Webhook-Signature": "sha256="}, {"x-webhook-signature": "sha256=ab"}) is None
    assert headers_mismatch({"X-Missing": "*"}, {}) == "no header 'X-Missing'"


# --- P27 ------------------------------------------------------------------------------------------
def test_p27_delivery_passes(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P27",
        {
            "trigger": ORDER_TRIGGER,
            "expect_delivery": {
                "timeout_ms": 10000,
                "body_contains": {"event": "order.created", "data": {"id": "o-1"}},
                "headers_contain": {"x-webhook-signature": "sha256="},
            },
        },
    )
    assert r.passed, r.message
    assert r.evidence["deliveries_total"] == 1 and r.evidence["matched"]["path"] == "/hook"
    assert ctx.vars["webhook_url"] == r.evidence["receiver_url"] and isinstance(ctx.vars["webhook_port"], int)
    assert ctx.last_response is not None and ctx.last_response.status == 201  # the trigger's response


def test_p27_no_delivery_fails_with_message(ctx: RunContext) -> None:
    r = run(
        ctx, "P27", {"trigger": {**ORDER_TRIGGER, "path": "/orders-silent"}, "expect_delivery": {"timeout_ms": 200}}
    )
    assert not r.passed
    assert r.message.startswith("no webhook delivery within 0.2s") and "-> 201" in r.message


def test_p27_wrong_body_fails_with_reason(ctx: RunContext) -> None:
    trigger = {**ORDER_TRIGGER, "body": {**ORDER_TRIGGER["body"], "event": "order.cancelled"}}
    r = run(
        ctx,
        "P27",
        {"trigger": trigger, "expect_delivery": {"timeout_ms": 1500, "body_contains": {"event": "order.created"}}},
    )
    assert not r.passed
    assert "1 request(s) received" in r.message and "none matched" in r.message and "order.cancelled" in r.message
    assert r.evidence["deliveries"][0]["body"].startswith('{"event": "order.cancelled"')


def test_p27_wrong_header_fails(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P27",
        {
            "trigger": ORDER_TRIGGER,
            "expect_delivery": {"timeout_ms": 1500, "headers_contain": {"X-Hub-Signature": "*"}},
        },
    )
    assert not r.passed and "no header 'X-Hub-Signature'" in r.message


def test_p27_earlier_deliveries_do_not_count(ctx: RunContext) -> None:
    assert run(ctx, "P27", {"trigger": ORDER_TRIGGER}).passed
    r = run(
        ctx, "P27", {"trigger": {**ORDER_TRIGGER, "path": "/orders-silent"}, "expect_delivery": {"timeout_ms": 200}}
    )
    assert not r.passed and "nothing received" in r.message


def test_p27_verify_sql_and_legacy_family_b(ctx: RunContext, app: App) -> None:
    # family B: trigger_* keys and verify_sql; the app records the job that sends the hook
    r = run(
        ctx,
        "P27",
        {
            "trigger_path": "/jobs",
            "trigger_method": "POST",
            "trigger_body": {"id": "hook-job"},
            "wait_seconds": 10,
            "verify_sql": "SELECT * FROM jobs WHERE id = 'hook-job'",
        },
    )
    assert r.passed, r.message
    r = run(
        ctx,
        "P27",
        {"trigger": ORDER_TRIGGER, "verify_sql": "SELECT * FROM jobs WHERE id = 'never'", "verify_wait_ms": 100},
    )
    assert not r.passed and "verify_sql" in r.message


def test_p27_unreachable_trigger(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    c = RunContext(Target(base_url=f"http://127.0.0.1:{dead}"))
    try:
        r = run(c, "P27", {"trigger": ORDER_TRIGGER})
        assert not r.passed and r.unreachable and "cannot connect" in r.message
    finally:
        c.close()


def test_p27_mock_receiver_source(ctx: RunContext) -> None:
    with MockReceiver() as mock:
        http("POST", mock.url, {"event": "old"})  # history before the trigger is not counted
        trigger = {"method": "POST", "path": "/orders", "body": {"webhook_url": mock.url, "order_id": "m-1"}}
        r = run(
            ctx,
            "P27",
            {
                "source": "mock_receiver",
                "mock_receiver_url": mock.base_url,
                "trigger": trigger,
                "expect_delivery": {"timeout_ms": 10000, "body_contains": {"data": {"id": "m-1"}}},
            },
        )
        assert r.passed, r.message
        assert WebhookReceiver.__name__ and "webhook_receiver" not in ctx.resources  # no own receiver needed
        r = run(
            ctx,
            "P27",
            {
                "source": "mock_receiver",
                "mock_receiver_url": mock.base_url + "/history",
                "trigger": {**trigger, "path": "/orders-silent"},
                "expect_delivery": {"timeout_ms": 300},
            },
        )
        assert not r.passed and "no webhook delivery" in r.message


def test_parallel_runs_get_their_own_receivers(app: App) -> None:
    ctxs = [RunContext(Target(base_url=app.url)) for _ in range(2)]
    results: dict[int, StepResult] = {}

    def go(i: int) -> None:
        trigger = {
            "method": "POST",
            "path": "/orders",
            "body": {"webhook_url": "{{webhook_url}}", "order_id": f"p-{i}"},
        }
        results[i] = run(
            ctxs[i],
            "P27",
            {"trigger": trigger, "expect_delivery": {"timeout_ms": 10000, "body_contains": {"data": {"id": f"p-{i}"}}}},
        )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    try:
        assert all(results[i].passed for i in range(2)), [results[i].message for i in results]
        receivers = [c.resources["webhook_receiver"] for c in ctxs]
        ports = [r.port for r in receivers]
        assert ports[0] != ports[1]
        for i, receiver in enumerate(receivers):
            assert [d.json["data"]["id"] for d in receiver.deliveries()] == [f"p-{i}"]
    finally:
        for c in ctxs:
            c.close()
    assert not any(port_open(p) for p in ports)


def test_close_stops_receivers(app: App) -> None:
    c = RunContext(Target(base_url=app.url))
    assert run(c, "P27", {"trigger": ORDER_TRIGGER}).passed
    invite = {
        "method": "POST",
        "path": "/invite",
        "body": {"email": "bob@example.com", "smtp_host": "{{smtp_host}}", "smtp_port": "{{smtp_port}}"},
    }
    assert run(c, "P28", {"trigger": invite, "expect": {"to": "bob@example.com"}}).passed
    ports = [c.vars["webhook_port"], c.vars["smtp_port"], c.resources["smtp_sink"].api_port]
    assert all(port_open(p) for p in ports)
    c.close()
    assert c.resources == {}
    assert not any(port_open(p) for p in ports)


# --- P28 ------------------------------------------------------------------------------------------
INVITE = {
    "method": "POST",
    "path": "/invite",
    "body": {"email": "alice@example.com", "smtp_host": "{{smtp_host}}", "smtp_port": "{{smtp_port}}"},
}


def test_p28_email_to_sink(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P28",
        {
            "trigger": INVITE,
            "expect": {
                "to": "Alice@Example.com",
                "subject_contains": "invited",
                "body_contains": "join/abc123",
                "from": "acme.test",
                "timeout_ms": 10000,
            },
        },
    )
    assert r.passed, r.message
    assert r.evidence["matched"]["subject"] == "You're invited to Acme – welcome"


def test_p28_wrong_subject_and_no_mail(ctx: RunContext) -> None:
    r = run(ctx, "P28", {"trigger": INVITE, "expect": {"subject_contains": "Password reset", "timeout_ms": 1500}})
    assert not r.passed and "none matched" in r.message and "Password reset" in r.message
    r = run(ctx, "P28", {"trigger": {"method": "GET", "path": "/jobs/x"}, "expect": {"timeout_ms": 200}})
    assert not r.passed and r.message.startswith("no email within 0.2s")


def test_p28_reads_a_task_mailhog(ctx: RunContext) -> None:
    with SmtpSink() as mailhog:  # stands in for the task's MailHog: same API
        App.mail("127.0.0.1", mailhog.port, "old@example.com")  # there before the trigger: ignored
        assert mailhog.wait_for(lambda m: True, 5) is not None
        trigger = {
            "method": "POST",
            "path": "/invite",
            "body": {"email": "carol@example.com", "smtp_host": "127.0.0.1", "smtp_port": mailhog.port},
        }
        r = run(
            ctx,
            "P28",
            {
                "trigger": trigger,
                "mailserver_api": mailhog.api_url,
                "to": "carol@example.com",
                "subject_contains": "invited",
                "timeout_ms": 10000,
            },
        )
        assert r.passed, r.message
        assert "smtp_sink" not in ctx.resources
        r = run(
            ctx,
            "P28",
            {
                "trigger": trigger,
                "mailserver_api": mailhog.api_url,
                "expect": {"to": "old@example.com", "timeout_ms": 1000},
            },
        )
        assert not r.passed and "none matched" in r.message


# --- P24 ------------------------------------------------------------------------------------------
def test_p24_http_trigger_db_verify(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P24",
        {
            "trigger": {"type": "http", "method": "POST", "path": "/jobs", "body": {"id": "j1"}},
            "verify": {
                "strategy": "db_query",
                "sql": "SELECT status FROM jobs WHERE id = '{{job}}'",
                "expected_result": {"status": "done"},
                "max_wait_ms": 10000,
            },
        },
    )
    assert not r.passed and "{{job}}" in r.message  # unresolved placeholder named
    ctx.vars["job"] = "j1"
    r = run(
        ctx,
        "P24",
        {
            "trigger": {"type": "http", "method": "POST", "path": "/jobs", "body": {"id": "{{job}}"}},
            "verify": {
                "strategy": "db_query",
                "sql": "SELECT status FROM jobs WHERE id = '{{job}}'",
                "expected_result": {"status": "done"},
                "max_wait_ms": 10000,
            },
        },
    )
    assert r.passed, r.message
    assert r.evidence["verify"]["bound_parameters"] == 1  # the captured value went in as a parameter


def test_p24_http_verify_polls_until_assertion(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P24",
        {
            "trigger": {"method": "POST", "path": "/jobs", "body": {"id": "j2"}},
            "verify": {
                "http": {"path": "/jobs/j2", "assertions": [{"path": "$.status", "expected": "done"}]},
                "max_wait_ms": 10000,
                "interval_ms": 50,
            },
        },
    )
    assert r.passed, r.message
    assert r.evidence["verify"]["attempts"] >= 1


def test_p24_job_never_done_fails(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P24",
        {
            "trigger": {"path": "/orders-silent", "body": {}},
            "verify": {"sql": "SELECT * FROM jobs WHERE id = 'nope'", "max_wait_ms": 200},
        },
    )
    assert not r.passed and "0 row(s)" in r.message and "trigger POST" in r.message
    r = run(
        ctx,
        "P24",
        {
            "verify": {
                "strategy": "http",
                "path": "/jobs/nope",
                "assertions": [{"path": "$.status", "expected": "done"}],
                "max_wait_ms": 200,
                "interval_ms": 50,
            }
        },
    )
    assert not r.passed and "not satisfied within 200 ms" in r.message and '"pending"' in r.message


def test_p24_trigger_status_expectation(ctx: RunContext) -> None:
    r = run(ctx, "P24", {"trigger": {"path": "/nowhere", "expect_status": 202}, "verify": {"sql": "SELECT 1"}})
    assert not r.passed and "-> 404, expected [202]" in r.message


class FakeEnv:
    """An environment backend whose exec runs a local shell command."""

    kind = "fake"

    def exec(self, cmd: str, timeout_s: float, env: Any = None, cwd: Any = None) -> ExecResult:
        p = subprocess.run(["bash", "-c", cmd], check=False, capture_output=True, text=True, timeout=timeout_s)
        return ExecResult(p.returncode, p.stdout, p.stderr)


def test_p24_exec_trigger(app: App, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.execute(\"INSERT INTO jobs VALUES (?, 'done')\", (sys.argv[2],))\nc.commit()\n"
    )
    c = RunContext(Target(base_url=app.url, db_dsn=f"sqlite:///{app.db_path}", environment=FakeEnv()))
    try:
        r = run(
            c,
            "P24",
            {
                "trigger": {"type": "exec", "command": f"{sys.executable} {script} {app.db_path} e1"},
                "verify": {
                    "strategy": "db_query",
                    "sql": "SELECT COUNT(*) AS n FROM jobs WHERE id = 'e1'",
                    "expected_result": 1,
                },
            },
        )
        assert r.passed, r.message
        r = run(c, "P24", {"trigger": {"command": "exit 3"}, "verify": {"sql": "SELECT 1"}})
        assert not r.passed and "exited 3, expected 0" in r.message
    finally:
        c.close()
    r = run(
        RunContext(Target(base_url=app.url)), "P24", {"trigger": {"command": "true"}, "verify": {"sql": "SELECT 1"}}
    )
    assert not r.passed and r.message.startswith("no environment")


# --- P_INGEST -------------------------------------------------------------------------------------
def test_ingest_events_counted_via_api_and_sql(ctx: RunContext) -> None:
    events = [{"name": "signup-{{ingest_id}}", "url": "/a"}, {"name": "signup-{{ingest_id}}", "url": "/b"}]
    r = run(
        ctx,
        "P_INGEST",
        {
            "endpoint": "/api/event",
            "events": events,
            "repeat": 2,
            "skip_auth": True,
            "verify": {
                "strategy": "http",
                "path": "/api/stats?name=signup-{{ingest_id}}",
                "assertions": [{"path": "$.count", "op": "gte", "expected": "{{ingest_count}}"}],
            },
        },
    )
    assert r.passed, r.message
    assert r.evidence["accepted"] == 4 and ctx.vars["ingest_count"] == 4
    marker = ctx.vars["ingest_id"]
    r = run(
        ctx,
        "P_INGEST",
        {
            "endpoint": "/api/event",
            "events": [{"name": "view-{{ingest_id}}"}] * 3,
            "batch": True,
            "batch_key": "events",
            "verify": {
                "db": {"sql": "SELECT COUNT(*) FROM events WHERE name = 'view-{{ingest_id}}'", "expected_result": 3}
            },
        },
    )
    assert r.passed, r.message
    assert ctx.vars["ingest_id"] != marker  # a fresh id per step isolates the count


def test_ingest_failures(ctx: RunContext) -> None:
    r = run(ctx, "P_INGEST", {"endpoint": "/broken-ingest", "events": [{"name": "x"}]})
    assert not r.passed and "0/1 events accepted" in r.message and "-> 500" in r.message
    r = run(
        ctx,
        "P_INGEST",
        {
            "endpoint": "/api/event",
            "events": [{"name": "y-{{ingest_id}}"}],
            "verify": {
                "strategy": "http",
                "path": "/api/stats?name=y-{{ingest_id}}",
                "assertions": [{"path": "$.count", "op": "gte", "expected": 5}],
                "max_wait_ms": 200,
                "interval_ms": 50,
            },
        },
    )
    assert not r.passed and "not satisfied" in r.message and "$.count gte 5" in r.message


# --- loader and engine ----------------------------------------------------------------------------
def test_legacy_forms_are_normalised_and_noted() -> None:
    notes = normalisations(
        "P27",
        {"trigger_path": "/x", "trigger_body": {"u": "{{webhook_url}}"}, "wait_seconds": 5, "verify_sql": "SELECT 1"},
    )
    assert any("trigger_path" in n for n in notes) and any("wait_seconds" in n for n in notes)
    notes = normalisations(
        "P24",
        {
            "trigger": {"type": "rails_runner", "command": "Job.perform_now"},
            "verify": {"strategy": "db", "sql": "SELECT 1", "expected": 1},
        },
    )
    assert any("rails_runner" in n for n in notes) and any("'db' -> 'db_query'" in n for n in notes)
    notes = normalisations("P28", {"to": "a@b.c", "subject": "Hi", "trigger": {"path": "/x"}})
    assert any("expect" in n for n in notes) and any("'subject' -> 'subject_contains'" in n for n in notes)
    notes = normalisations("P27", {"receiver": {"port": 18900}, "trigger": {"path": "/x"}})
    assert any("ephemeral" in n for n in notes)
    notes = normalisations("P_INGEST", {"path": "/api/event", "event": {"name": "x"}})
    assert any("'path' -> 'endpoint'" in n for n in notes) and any("'event'" in n for n in notes)


def test_rails_runner_command_is_wrapped() -> None:
    from saasbench.primitives.integrations import Trigger

    t = Trigger.model_validate({"type": "rails_runner", "command": "Job.perform_now('a b')"})
    assert t.type == "exec" and t.command == "bin/rails runner 'Job.perform_now('\"'\"'a b'\"'\"')'"


def test_engine_runs_integration_nodes(app: App) -> None:
    order_id = uuid.uuid4().hex[:8]
    dag = {
        "nodes": [
            {
                "id": "HOOK",
                "steps": [
                    {
                        "type": "P27",
                        "inputs": {
                            "trigger": {
                                "method": "POST",
                                "path": "/orders",
                                "body": {"webhook_url": "{{webhook_url}}", "order_id": order_id},
                            },
                            "expect_delivery": {"timeout_ms": 10000, "body_contains": {"data": {"id": order_id}}},
                        },
                    }
                ],
                "scoring": {"category": "Webhook", "method": "binary", "maxScore": 2},
            },
            {
                "id": "MAIL",
                "prereqs": ["HOOK"],
                "steps": [
                    {
                        "type": "P28",
                        "inputs": {"trigger": INVITE, "expect": {"to": "alice@example.com", "timeout_ms": 10000}},
                    }
                ],
                "scoring": {"category": "TransactionalEmail", "method": "binary", "maxScore": 1},
            },
            {
                "id": "JOB",
                "prereqs": ["HOOK"],
                "steps": [  # it reads HOOK.created_id
                    {
                        "type": "P24",
                        "inputs": {
                            "trigger": {"type": "http", "path": "/jobs", "body": {"id": "{{HOOK.created_id}}"}},
                            "verify": {
                                "strategy": "db_query",
                                "sql": "SELECT status FROM jobs WHERE id = '{{HOOK.created_id}}'",
                                "expected_result": {"status": "done"},
                                "max_wait_ms": 10000,
                            },
                        },
                    },
                    {"type": "P15", "inputs": {"expected_status": 202}},
                ],
                "scoring": {"category": "BackgroundJobs", "method": "binary", "maxScore": 1},
            },
            {
                "id": "INGEST",
                "steps": [
                    {
                        "type": "P_INGEST",
                        "inputs": {
                            "endpoint": "/api/event",
                            "events": [{"name": "e-{{ingest_id}}"}],
                            "verify": {
                                "db": {
                                    "sql": "SELECT COUNT(*) FROM events WHERE name = 'e-{{ingest_id}}'",
                                    "expected_result": 1,
                                }
                            },
                        },
                    }
                ],
                "scoring": {"category": "EventProcessing", "method": "binary", "maxScore": 1},
            },
        ]
    }
    loaded = load_dag_data(dag)
    assert not [i for i in loaded.issues if i.kind in ("error", "warning")], loaded.issues
    ctx = RunContext(Target(base_url=app.url, db_dsn=f"sqlite:///{app.db_path}"))
    report = Engine(loaded.dag, ctx).run()
    statuses = {n.id: (n.status, n.message) for n in report.nodes}
    assert all(s == Status.PASSED for s, _ in statuses.values()), statuses
    assert ctx.resources == {}  # the engine closed the run, and the receivers with it


def test_prestart_receivers_for_earlier_steps(app: App) -> None:
    from saasbench.services.receivers import prestart_receivers

    c = RunContext(Target(base_url=app.url))
    try:
        steps = [{"type": "P04", "inputs": {"path": "/subscriptions", "body": {"url": "{{webhook_url}}"}}}]
        assert prestart_receivers(c, steps) == ["webhook_receiver"]
        assert c.resolve("{{webhook_url}}") == c.resources["webhook_receiver"].url
        assert prestart_receivers(c, {"x": "{{smtp_port}}"}) == ["smtp_sink"]
        assert prestart_receivers(c, {"x": "{{base_url}}"}) == []
    finally:
        c.close()


def test_p27_receiver_path_sets_webhook_url(ctx: RunContext) -> None:
    r = run(
        ctx,
        "P27",
        {"receiver": {"path": "/webhooks/orders"}, "trigger": ORDER_TRIGGER, "expect_delivery": {"timeout_ms": 10000}},
    )
    assert r.passed, r.message
    assert ctx.vars["webhook_url"].endswith("/webhooks/orders") and r.evidence["matched"]["path"] == "/webhooks/orders"
