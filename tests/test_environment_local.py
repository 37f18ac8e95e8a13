"""LocalEnvironment: the conformance suite, exec limits, confinement, services, start_app.

``make_task`` builds a small task (stdlib app + DAG) in a temporary folder; the agent and
validation tests import it from here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from saasbench.catalog.tasks import Task, load_task
from saasbench.environments.base import (
    MAX_OUTPUT_BYTES,
    PathEscape,
    ServiceError,
    group_members,
    pid_alive,
    self_check,
    start_app,
)
from saasbench.environments.local import LocalEnvironment

APP_PY = r"""
import json, os, sqlite3, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DB = os.environ["DATABASE_PATH"]
USERS = {"admin": "admin-pass-1"}
con = sqlite3.connect(DB)
con.execute("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, username TEXT UNIQUE)")
con.execute("INSERT OR IGNORE INTO users (username) VALUES ('admin')")
con.commit()
con.close()


class H(BaseHTTPRequestHandler):
    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, {"status": "ok"})
        if self.path == "/api/me":
            if self.headers.get("Authorization") == "Bearer tok-admin":
                return self._send(200, {"username": "admin"})
            return self._send(401, {"error": "unauthorized"})
        return self._send(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/api/login" and USERS.get(body.get("username")) == body.get("password"):
            return self._send(200, {"access_token": "tok-" + body["username"]})
        return self._send(401, {"error": "bad credentials"})

    def log_message(self, fmt, *args):
        sys.stdout.write("request " + (fmt % args) + "\n")
        sys.stdout.flush()


print("fixture app listening on", os.environ["PORT"], flush=True)
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def _node(
    node_id: str, steps: list[dict[str, Any]], prereqs: list[str] | None = None, max_score: float = 2
) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": prereqs or [],
        "steps": steps,
        "scoring": {"category": "Fixture", "method": "binary", "maxScore": max_score},
    }


def make_task(
    root: Path,
    *,
    install: list[str] | None = None,
    extra_nodes: list[dict[str, Any]] | None = None,
    reference: bool = True,
    health_s: float = 15,
) -> Task:
    """A task folder under ``root``: stdlib app in reference/, sqlite, bearer auth, a small DAG."""
    folder = root / "fixture"
    (folder / "reference").mkdir(parents=True)
    (folder / "reference" / "app.py").write_text(APP_PY)
    (folder / "reference" / "run.sh").write_text("#!/usr/bin/env bash\nexec python3 app.py\n")
    (folder / "task.md").write_text("# Fixture Tracker\n\nA tiny app.\n")
    (folder / "knowledge_base.json").write_text(
        json.dumps(
            [
                {
                    "id": "KB-1",
                    "question": "Port?",
                    "answer": "$PORT",
                    "source_reference": "task.md",
                    "confidence": "high",
                }
            ]
        )
    )
    spec = {
        "id": "fixture",
        "title": "Fixture Tracker",
        "category": "Testing",
        "domain": "CG",
        "complexity_tier": "T1",
        "stack": "python-stdlib",
        "app": {"port": 8000, "health_path": "/health", "start_command": "bash run.sh"},
        "database": {"engine": "sqlite", "path": "data/fixture.db"},
        "auth": {
            "scheme": "bearer",
            "login": {
                "path": "/api/login",
                "body": {"username": "{{username}}", "password": "{{password}}"},
                "token_path": "access_token",
            },
            "users": {"admin": {"username": "admin", "password": "admin-pass-1"}},
        },
        "timeouts": {"agent_s": 120, "eval_node_s": 20, "health_s": health_s},
        "environment": {"tools": ["python3"]},
        "custom_key": {"kept": True},
    }
    if reference:
        spec["reference"] = {"source": "reference", "install": install or []}
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    nodes = [
        _node(
            "HEALTH",
            [
                {"type": "P04", "inputs": {"method": "GET", "path": "/health"}},
                {"type": "P15", "inputs": {"expected_status": 200}},
            ],
        ),
        _node(
            "LOGIN",
            [
                {"type": "P13", "inputs": {"role": "admin"}},
                {"type": "P04", "inputs": {"method": "GET", "path": "/api/me"}},
                {"type": "P15", "inputs": {"expected_status": 200}},
                {
                    "type": "P07",
                    "inputs": {"assertions": [{"path": "$.username", "operator": "equals", "expected": "admin"}]},
                },
            ],
            ["HEALTH"],
        ),
        _node("RUN_SCRIPT", [{"type": "P01", "inputs": {"path": "run.sh"}}]),
        _node(
            "DB_FILE",
            [
                {
                    "type": "P12",
                    "inputs": {
                        "command": "test -s data/fixture.db && echo db-present",
                        "container": "fixture-app",
                        "expect_output_contains": "db-present",
                        "capture_stdout_as": "db_state",
                    },
                }
            ],
            ["HEALTH"],
        ),
        _node(
            "APP_LOG",
            [{"type": "P21", "inputs": {"log_path": "app", "pattern": "listening on", "tail_lines": 50}}],
            ["HEALTH"],
        ),
        *(extra_nodes or []),
    ]
    (folder / "dag.json").write_text(json.dumps({"meta": {"task_id": "fixture"}, "nodes": nodes}, indent=2))
    return load_task(folder)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return make_task(tmp_path / "tasks")


# --- conformance ----------------------------------------------------------------------------------
def test_local_backend_passes_self_check() -> None:
    with LocalEnvironment() as env:
        assert self_check(env) == []


def test_workspace_is_fresh_and_removed(task: Task) -> None:
    with LocalEnvironment(task) as a, LocalEnvironment(task) as b:
        assert a.workspace_path != b.workspace_path and a.app_port != b.app_port
        assert os.listdir(a.workspace_path) == ["data"]  # the sqlite folder only
        ws = a.workspace_path
        assert a.db_dsn == f"sqlite:///{ws}/data/fixture.db" and a.db_dsn.startswith("sqlite:////")
        assert a.base_url == f"http://127.0.0.1:{a.app_port}"
        env = a.service_env()
        assert env["PORT"] == str(a.app_port) and env["DATABASE_PATH"] == f"{ws}/data/fixture.db"
    assert not os.path.exists(ws)


def test_given_workspace_root_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with LocalEnvironment(workspace_root=root) as env:
        env.write_file("a.txt", "x")
        env.write_file(str(root / "abs.txt"), "y")  # absolute inside the workspace is fine
    assert (root / "a.txt").read_text() == "x" and (root / "abs.txt").read_text() == "y"


def test_exec_output_cap_and_timeout() -> None:
    with LocalEnvironment() as env:
        r = env.exec("head -c 2000000 /dev/zero | tr '\\0' 'y' >&2", timeout_s=30)
        assert r.exit_code == 0 and r.truncated and len(r.stderr) == MAX_OUTPUT_BYTES and r.stdout == ""
        t0 = time.monotonic()
        r = env.exec("echo started; sleep 20", timeout_s=0.5)
        assert r.timed_out and r.exit_code == 124 and r.stdout == "started\n" and time.monotonic() - t0 < 5


def test_exec_does_not_leak_host_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with LocalEnvironment() as env:
        assert env.exec('printf "%s" "${OPENAI_API_KEY:-unset}"', timeout_s=10).stdout == "unset"


def host_pids_running(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (a sandboxed command's own pids are its namespace's)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"bash" not in cmdline and pid_alive(int(entry)):
                out.append(int(entry))
    return out


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no-sandbox"])
def test_exec_background_children_are_killed(sandbox: bool) -> None:
    with LocalEnvironment(sandbox=sandbox) as env:
        marker = f"60.{os.getpid()}{int(time.monotonic() * 1000) % 100000}"
        r = env.exec(f"sleep {marker} & setsid sleep {marker} & echo started", timeout_s=10)
        assert r.stdout == "started\n"
        # the group is killed when the command returns; a setsid child too (sandbox: its pid namespace
        # ends; without: stop() kills what carries the environment's tag)
        if sandbox:
            assert host_pids_running(marker) == []
    assert host_pids_running(marker) == []


def test_path_confinement(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    with LocalEnvironment() as env:
        for bad in ("../x", str(outside), "a/../../x"):
            with pytest.raises(PathEscape):
                env.read_file(bad)
            with pytest.raises(PathEscape):
                env.write_file(bad, "x")
        os.symlink(tmp_path, Path(env.workspace_path) / "link")
        with pytest.raises(PathEscape):
            env.read_file("link/secret.txt")
        with pytest.raises(PathEscape):
            env.write_file("link/new.txt", "x")
        with pytest.raises(PathEscape):
            env.exec("pwd", timeout_s=5, cwd="..")
    assert not (tmp_path / "new.txt").exists()


def test_stop_kills_every_process_and_only_those(task: Task) -> None:
    bystander = LocalEnvironment()
    bystander.start()
    other = bystander.start_service("other", "sleep 60")
    env = LocalEnvironment(task)
    env.start()
    svc = env.start_service("tree", "sleep 60 & sleep 60 & (sleep 60 &) ; wait")
    deadline = time.monotonic() + 30  # a wait for the tree to exist, generous for a loaded CI machine
    while len(group_members(svc.pgid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = group_members(svc.pgid)
    assert len(pids) >= 4, pids
    env.stop()
    env.stop()  # idempotent
    assert [p for p in pids if pid_alive(p)] == []
    assert group_members(svc.pgid) == []
    assert pid_alive(other.pid), "another environment's process must survive"
    bystander.stop()
    assert not pid_alive(other.pid)


# --- start_app: the deployment contract ---------------------------------------------------------------
def test_start_app_healthy_and_logs(task: Task) -> None:
    with LocalEnvironment(task) as env:
        for f in ("app.py", "run.sh"):
            env.write_file(f, (task.root / "reference" / f).read_bytes())
        result = start_app(task, env)
        assert result.ok, result.error
        assert result.base_url == env.base_url
        assert "fixture app listening on" in env.logs("app")
        assert (Path(env.workspace_path) / "data" / "fixture.db").is_file()
        pid = env.services()["app"].pid
    assert not pid_alive(pid)


def test_start_app_reports_crash_with_log_lines(tmp_path: Path) -> None:
    task = make_task(tmp_path, health_s=10)
    with LocalEnvironment(task) as env:
        env.write_file("run.sh", "echo booting; echo 'fatal: no config' >&2; exit 3\n")
        result = start_app(task, env)
    assert not result.ok
    assert "exited with code 3" in result.error
    assert "fatal: no config" in result.log_tail and "booting" in result.log_tail


def test_wait_healthy_deadline_includes_logs() -> None:
    with LocalEnvironment() as env:
        env.start_service("quiet", "echo still-warming-up; sleep 30")
        with pytest.raises(ServiceError) as info:
            env.wait_healthy(env.base_url + "/health", 0.6, service="quiet")
    assert "not healthy after 0.6s" in str(info.value) and "still-warming-up" in info.value.log_tail


# --- P12 / P21 on the local backend ---------------------------------------------------------------------
def _step(code: str, inputs: dict[str, Any], env: LocalEnvironment | None):
    from saasbench.evaluation.context import RunContext, Target
    from saasbench.primitives.registry import REGISTRY

    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None
    ctx = RunContext(Target(workspace=Path(env.workspace_path) if env else None, environment=env))
    return spec.fn(spec.inputs.model_validate(inputs), ctx), ctx


def test_p12_without_environment_raises_naming_the_option() -> None:
    from saasbench.environments.exec_target import NoExecTarget

    # raised, so the engine makes the node ERROR (the run could not check it), not FAILED
    with pytest.raises(
        NoExecTarget, match=r"P12 needs an exec target: pass --exec local:DIR or --exec docker:CONTAINER"
    ):
        _step("P12", {"command": "true"}, None)
    with pytest.raises(NoExecTarget, match=r"P21 needs an exec target: pass --exec"):
        _step("P21", {"pattern": "x"}, None)


def test_p12_exit_codes_output_and_capture() -> None:
    with LocalEnvironment() as env:
        ok, ctx = _step(
            "P12", {"command": "echo one; echo; echo ' two '", "container": "app-1", "capture_stdout_as": "last"}, env
        )
        assert ok.passed and ctx.vars["last"] == "two" and ok.evidence["container"] == "app-1"
        bad, _ = _step("P12", {"command": "echo oops >&2; exit 4"}, env)
        assert not bad.passed and "exit code 4, expected 0" in bad.message and "oops" in bad.message
        assert _step("P12", {"command": "exit 4", "expect_exit_code": 4}, env)[0].passed
        assert _step("P12", {"command": "exit 1", "expect_success": False}, env)[0].passed
        assert not _step("P12", {"command": "true", "expect_success": False}, env)[0].passed
        assert _step("P12", {"command": "echo v1.2.3", "expect_output_regex": r"^v\d+\.\d+"}, env)[0].passed
        assert not _step("P12", {"command": "echo abc", "expect_output_contains": ["abc", "xyz"]}, env)[0].passed
        assert _step("P12", {"cmd": "echo legacy", "expected_output": "legacy"}, env)[0].passed
        slow, _ = _step("P12", {"command": "sleep 5", "timeout": 0.3}, env)
        assert not slow.passed and "timed out" in slow.message


def test_p21_service_log_and_workspace_file() -> None:
    with LocalEnvironment() as env:
        env.write_file("log/production.log", "boot\nGET /api 200\nERROR boom\n")
        assert _step("P21", {"pattern": "ERROR boom"}, env)[0].passed  # default log_path
        assert not _step("P21", {"pattern": "boot", "tail_lines": 2}, env)[0].passed
        assert _step("P21", {"log_path": "log/production.log", "pattern": r"GET /\w+ 200", "match_type": "regex"}, env)[
            0
        ].passed
        assert _step("P21", {"pattern": "panic", "expect_match": False}, env)[0].passed
        missing, _ = _step("P21", {"log_path": "log/none.log", "pattern": "x"}, env)
        assert not missing.passed and "not found" in missing.message
        escape, _ = _step("P21", {"log_path": "../../etc/passwd", "pattern": "root"}, env)
        assert not escape.passed and "cannot read log" in escape.message
        env.start_service("worker", "echo worker ready; sleep 30")
        deadline = time.monotonic() + 5
        while "ready" not in env.logs("worker") and time.monotonic() < deadline:
            time.sleep(0.05)
        result, _ = _step("P21", {"log_path": "worker", "pattern": "worker ready"}, env)
        assert result.passed and result.evidence["source"] == "service"


def test_write_file_mode() -> None:
    with LocalEnvironment() as env:
        env.write_file("bin/tool.sh", "#!/usr/bin/env bash\necho tool-ran\n", mode=0o755)
        assert env.exec("./bin/tool.sh", timeout_s=10).stdout == "tool-ran\n"
