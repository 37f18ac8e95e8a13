"""Every node of every public conformance DAG runs against a stub target without ERROR.

The stub answers every HTTP request with 200 and a small JSON body, the database is an empty
SQLite file, the workspace an empty folder, the environment the local backend, and no judge is
configured. Prerequisites are dropped so every node executes. Nodes may FAIL (the stub is not
the app), but none may end in ERROR: that would mean a primitive or an input form the engine
does not support.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from shared_data import CONFORMANCE_DIR

from saasbench.auth import AuthProfile
from saasbench.context import RunContext, RunOptions, Target
from saasbench.dag import load_dag
from saasbench.engine import Engine
from saasbench.environment import LocalEnvironment
from saasbench.results import Status

DAGS = sorted(CONFORMANCE_DIR.glob("*/dag.json"))


class _Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"id": 1, "data": {}, "token": "stub-token", "access_token": "stub-token"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_five_dags_are_here():
    assert len(DAGS) == 5, f"conformance DAGs missing under {CONFORMANCE_DIR}"


@pytest.mark.parametrize("dag_path", DAGS, ids=[p.parent.name for p in DAGS])
def test_no_node_errors_against_a_stub(dag_path, stub, tmp_path):
    dag = load_dag(dag_path).dag
    for node in dag.nodes:
        node.prereqs = []  # execute everything
    db = tmp_path / "app.db"
    sqlite3.connect(db).close()
    roles = ["admin", "member", "member_restricted", "apikey", "gamma", "user_b", "limited", "user", "viewer"]
    profile = AuthProfile.model_validate({
        "scheme": "bearer", "login": {"path": "/login", "token_path": "token"},
        "users": {r: {"username": r, "email": f"{r}@example.test", "password": "pw", "api_key": "k"} for r in roles},
    })
    with LocalEnvironment(workspace_root=tmp_path / "ws") as env:
        ctx = RunContext(Target(base_url=stub, workspace=tmp_path / "ws", db_dsn=f"sqlite:///{db}", environment=env),
                         options=RunOptions(node_timeout_s=20, http_timeout_s=5), auth_profile=profile,
                         env_defaults=dag.env_defaults)
        report = Engine(dag, ctx).run()
    errors = [(n.id, n.message[:200]) for n in report.nodes if n.status == Status.ERROR]
    assert errors == []
    assert len(report.nodes) == len(dag.nodes)
    # the judge is not configured, so judge nodes are skipped, never errors
    assert all(n.status in (Status.SKIPPED_LLM, Status.FAILED) for n in report.nodes if n.method == "llm-judge")
