"""Issue #17 item 8: the app cannot inject shell syntax into commands nor steer credentials elsewhere.

Real components: local HTTP servers on 127.0.0.1 (the app, and a second server on another port playing
the foreign origin), a local exec target running bash, the engine. The app returns a hostile value
(``x; touch /tmp/pwned-<random>``) that a DAG captures and splices into P12 commands and exec triggers:
the file must never appear and the literal value must reach the command. The app also returns an
absolute URL (and a redirect) to the other server, which must receive no Authorization, Cookie or CSRF header.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from localhttp import serve_http

from saasbench.dag import load_dag_data
from saasbench.dag.placeholders import UnsafeShellValue, quote_command
from saasbench.environments.exec_target import LocalExecTarget
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import RunReport, Status
from saasbench.services.http import Identity, same_origin


def node(node_id: str, *steps: dict[str, Any], method: str = "binary") -> dict[str, Any]:
    return {"id": node_id, "steps": list(steps), "scoring": {"category": "T", "method": method, "maxScore": 1}}


def run(ctx: RunContext, *nodes: dict[str, Any]) -> dict[str, Any]:
    dag = load_dag_data({"nodes": list(nodes)}, source="<injection>").dag
    report: RunReport = Engine(dag, ctx).run()
    return {n.id: n for n in report.nodes}


def json_app(payload: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class App(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return App


# --- shell quoting ---------------------------------------------------------------------------------------
@pytest.fixture
def pwned() -> Iterator[Path]:
    path = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    yield path
    path.unlink(missing_ok=True)


def test_a_captured_value_reaches_p12_as_data_never_as_shell_syntax(tmp_path: Path, pwned: Path) -> None:
    hostile = f"x; touch {pwned}"
    capture = {"type": "P04", "inputs": {"path": "/item", "capture_fields": {"name": "$.name"}}}
    unquoted = {"type": "P12", "inputs": {"command": "printf '%s' {{name}}", "expect_output_contains": hostile}}
    in_single = {"type": "P12", "inputs": {"command": "printf '%s' '{{name}}'"}}
    in_double = {"type": "P12", "inputs": {"command": 'bash -c "echo {{name}}"'}}
    in_subst = {"type": "P12", "inputs": {"command": 'echo "got $(printf %s {{name}})"'}}
    trigger = {
        "type": "P24",
        "inputs": {
            "trigger": {"type": "exec", "command": "echo {{name}} && echo '{{name}}'"},
            "verify": {"strategy": "http", "path": "/item", "max_wait_ms": 200},
        },
    }
    with serve_http(json_app({"name": hostile})) as base:
        ctx = RunContext(
            Target(base_url=base, exec_target=LocalExecTarget(tmp_path)), options=RunOptions(node_timeout_s=20)
        )
        nodes = run(
            ctx,
            node("UNQUOTED", capture, unquoted),
            node("SINGLE", capture, in_single),
            node("DOUBLE", capture, in_double),
            node("SUBST", capture, in_subst),
            node("TRIGGER", capture, trigger),
        )
    assert not pwned.exists(), "the app's value ran as a command"
    # unquoted: one shell word, the literal value is what the command printed
    assert nodes["UNQUOTED"].status == Status.PASSED, nodes["UNQUOTED"].message
    out = nodes["UNQUOTED"].steps[1].evidence
    assert out["stdout"] == hostile and "'x; touch" in out["command"]
    assert nodes["SUBST"].status == Status.PASSED, nodes["SUBST"].message
    assert nodes["SUBST"].steps[1].evidence["stdout"].strip() == f"got {hostile}"
    # inside quotes the value would be code for a second interpreter (bash -c "..."): refused, nothing runs
    for name in ("SINGLE", "DOUBLE", "TRIGGER"):
        assert nodes[name].status == Status.FAILED, (name, nodes[name].message)
        assert "holds a value from the app" in nodes[name].message and "not run" in nodes[name].message


def test_operator_values_keep_working_inside_quoted_strings(tmp_path: Path) -> None:
    # the Superset / Rails DAG shapes: auth-profile values (trusted) inside nested interpreters' strings
    ctx = RunContext(
        Target(exec_target=LocalExecTarget(tmp_path)),
        variables={"admin_password": "Adm1n!$'\"`x", "admin_email": "admin@test.com"},
        options=RunOptions(node_timeout_s=20),
    )
    step = {
        "type": "P12",
        "inputs": {
            "command": "python3 -c \"print('{{admin_email}}', '''{{admin_password}}''')\"; echo '{{admin_password}}'"
        },
    }
    result = run(ctx, node("TRUSTED", step))["TRUSTED"]
    assert result.status == Status.PASSED, result.message
    assert result.steps[0].evidence["stdout"] == "admin@test.com Adm1n!$'\"`x\nAdm1n!$'\"`x\n"


@pytest.mark.parametrize(
    "command, expected",
    [
        ("echo {{v}}", "echo 'a b'"),
        ("echo '{{v}}'", "echo 'a b'"),  # plain text inside quotes reads as written
        ('echo "{{v}}"', 'echo "a b"'),
        ("echo '{{q}}'", "echo '''it'\"'\"'s'''"),  # the string closed, the quoted value, reopened
    ],
)
def test_quote_command_shapes(command: str, expected: str) -> None:
    quoted = quote_command(command, {"v": "a b", "q": "it's"}.__getitem__, lambda e: True)
    assert quoted == expected
    assert subprocess.run(["bash", "-c", quoted], capture_output=True, text=True).stdout in ("a b\n", "it's\n")


def test_untrusted_plain_values_inside_quotes_are_spliced() -> None:
    assert quote_command("runner \"User.find('{{id}}')\"", {"id": "42-abc_X"}.__getitem__) == (
        "runner \"User.find('42-abc_X')\""
    )
    with pytest.raises(UnsafeShellValue):
        quote_command("cat <<EOF\n{{id}}\nEOF", {"id": "$(id)"}.__getitem__)


# --- same-origin credentials ------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        rec = self

        class Foreign(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                with rec.lock:
                    rec.requests.append({k.lower(): v for k, v in self.headers.items()} | {"_path": self.path})
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

        return Foreign


def logged_in_ctx(base: str) -> RunContext:
    ctx = RunContext(Target(base_url=base), options=RunOptions(node_timeout_s=20))
    cookies = httpx.Cookies()
    cookies.set("session", "s3cret-session")
    ctx.auth.active = Identity(
        role="admin",
        headers={"Authorization": "Bearer s3cret-token", "X-Api-Key": "s3cret-key"},
        cookies=cookies,
        csrf_header="X-CSRFToken",
        csrf_token="s3cret-csrf",
    )
    return ctx


SECRETS = ("s3cret-token", "s3cret-key", "s3cret-session", "s3cret-csrf")


def test_p04_to_an_app_chosen_url_on_another_origin_carries_no_credentials() -> None:
    foreign = Recorder()
    own = Recorder()
    with serve_http(foreign.handler()) as other:

        class App(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/me":
                    with own.lock:
                        own.requests.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps({"next": f"{other}/steal", "self": "/me"}).encode()
                self.send_response(302 if self.path == "/bounce" else 200)
                if self.path == "/bounce":
                    self.send_header("Location", f"{other}/bounced")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        with serve_http(App) as base:
            ctx = logged_in_ctx(base)
            nodes = run(
                ctx,
                node(
                    "FOLLOW",
                    {"type": "P04", "inputs": {"path": "/links", "save_as": "links"}},
                    {"type": "P04", "inputs": {"method": "POST", "path": "{{links.next}}", "body": {"a": 1}}},
                    {"type": "P04", "inputs": {"path": base.replace("127.0.0.1", "localhost") + "/me"}},
                    {"type": "P04", "inputs": {"path": "/bounce"}},
                ),
            )
    result = nodes["FOLLOW"]
    assert result.status == Status.PASSED, result.message
    # the foreign origin got the request, without any of the user's credentials
    assert [r["_path"] for r in foreign.requests] == ["/steal"], foreign.requests  # the redirect was not followed
    leaked = [s for r in foreign.requests for s in SECRETS if s in json.dumps(r)]
    assert leaked == [], foreign.requests
    assert "credentials of 'admin' not sent" in result.steps[1].evidence["identity"]
    # the app's own origin (another loopback name, same port) still gets them
    assert own.requests and own.requests[0]["authorization"] == "Bearer s3cret-token"
    assert "session=s3cret-session" in own.requests[0]["cookie"]
    assert result.steps[3].evidence["status"] == 302


def test_same_origin_rule() -> None:
    assert same_origin("http://127.0.0.1:8000/a", "http://localhost:8000/b")
    assert same_origin("http://[::1]:8000/", "http://127.0.0.1:8000")
    assert same_origin("https://app.test/x", "https://app.test:443/y")
    assert not same_origin("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert not same_origin("http://127.0.0.1:8000", "https://127.0.0.1:8000")
    assert not same_origin("http://app.test", "http://evil.test")
    assert not same_origin("http://app.test", "not a url")
