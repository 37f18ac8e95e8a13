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
from shared_data import CONFORMANCE_DIR, MJOBBZSI_SMOKE_DAG

from saasbench.dag import load_dag
from saasbench.environments.local import LocalEnvironment
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status
from saasbench.services.auth import AuthProfile

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
    _run_against_stub(load_dag(dag_path).dag, stub, tmp_path)


def test_mjobbzsi_smoke_dag_loads_and_runs_against_a_stub(stub, tmp_path):
    """task_mjobbzsi's dag_smoke.json (Jitsi Meet; P18 browser steps, P21 WebSocket, P19 visibility,
    P07 body_contains / empty assertions): zero load errors, every DAG defect a warning, no ERROR node."""
    assert MJOBBZSI_SMOKE_DAG.is_file(), f"missing {MJOBBZSI_SMOKE_DAG} (set SAASBENCH_CONFORMANCE)"
    result = load_dag(MJOBBZSI_SMOKE_DAG)  # raises DagLoadError listing every error
    assert len(result.dag.nodes) == 68
    assert all(w.node and w.field for w in result.warnings if w.field != "meta.total_nodes")
    defects = {(w.node, w.field) for w in result.warnings}
    assert ("LOBBY_DISPLAY_NAME_REQUIRED", "steps[1].inputs.assertions") in defects  # P07 with empty assertions
    assert ("RBAC_MOD_CAN_KICK", "steps[0].inputs.action") in defects  # P14 'kickParticipant' is no HTTP route
    report = _run_against_stub(result.dag, stub, tmp_path)
    by_id = {n.id: n for n in report.nodes}
    # the stub is not Jitsi: these fail, and say why (no ERROR)
    assert by_id["XMPP_WS_CONNECT"].status == Status.FAILED and "did not open" in by_id["XMPP_WS_CONNECT"].message
    assert by_id["CONF_WELCOME_PAGE"].status == Status.FAILED
    # Without a judge the llm-judge nodes are skipped before their evidence steps run; run those steps
    # too (P18 without a url, SCREENSHOT with actions) as binary nodes without their P17.
    evidence = load_dag(MJOBBZSI_SMOKE_DAG).dag
    evidence.nodes = [
        n.model_copy(
            update={
                "steps": [s for s in n.steps if s.type != "P17"],
                "scoring": n.scoring.model_copy(update={"method": "binary"}),
            }
        )
        for n in evidence.nodes
        if n.method == "llm-judge" and any(s.type in ("P18", "SCREENSHOT") for s in n.steps)
    ]
    assert sorted(n.id for n in evidence.nodes) == ["UI_CHAT_EXPERIENCE", "UI_CONFERENCE_QUALITY", "UI_PREJOIN_QUALITY"]
    (tmp_path / "evidence").mkdir()
    shots = _run_against_stub(evidence, stub, tmp_path / "evidence")
    assert all(n.status == Status.PASSED for n in shots.nodes), [(n.id, n.message) for n in shots.nodes]


def _run_against_stub(dag, stub, tmp_path):
    for node in dag.nodes:
        node.prereqs = []  # execute everything
    db = tmp_path / "app.db"
    sqlite3.connect(db).close()
    roles = [
        "admin",
        "member",
        "member_restricted",
        "apikey",
        "gamma",
        "user_b",
        "limited",
        "user",
        "viewer",
        "moderator",
        "participant",
        "visitor",
    ]
    profile = AuthProfile.model_validate(
        {
            "scheme": "bearer",
            "login": {"path": "/login", "token_path": "token"},
            "users": {
                r: {"username": r, "email": f"{r}@example.test", "password": "pw", "api_key": "k"} for r in roles
            },
        }
    )
    with LocalEnvironment(workspace_root=tmp_path / "ws") as env:
        ctx = RunContext(
            Target(base_url=stub, workspace=tmp_path / "ws", db_dsn=f"sqlite:///{db}", environment=env),
            options=RunOptions(node_timeout_s=20, http_timeout_s=5),
            auth_profile=profile,
            env_defaults=dag.env_defaults,
        )
        report = Engine(dag, ctx).run()
    errors = [(n.id, n.message[:200]) for n in report.nodes if n.status == Status.ERROR]
    assert errors == []
    assert len(report.nodes) == len(dag.nodes)
    # the judge is not configured, so judge nodes are skipped, never errors
    assert all(n.status in (Status.SKIPPED_LLM, Status.FAILED) for n in report.nodes if n.method == "llm-judge")
    return report
