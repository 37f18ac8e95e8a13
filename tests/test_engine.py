"""The evaluation engine against the TeamNotes example app, with every expectation worked out by hand.

tests/data/engine_dag.json is a hand-written DAG of 38 nodes that exercises every status
(PASSED, FAILED, ERROR, SKIPPED_DEPENDENCY, SKIPPED_LLM; DRY_RUN in its own test), every scoring
method, three-level gating, ``run_last``, placeholders and captures. The LLM judge (P17) is a
fake registered for these tests only, and TEST_RAISE is a test primitive that raises.

The second half feeds the running engine bad input: an unreachable app, a 10 MB answer, an
invalid JSON body and an endpoint slower than the node deadline. Those tests assert messages
and statuses, never elapsed times.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps import teamnotes

from saasbench.dag import Dag, load_dag, load_dag_data
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine, EngineOptions
from saasbench.evaluation.results import RunReport, Status, StepResult
from saasbench.primitives.registry import REGISTRY, PrimitiveInputs
from saasbench.services.auth import load_auth_profile

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DAG = ROOT / "tests" / "data" / "engine_dag.json"
AUTH_PROFILE = ROOT / "tests" / "apps" / "teamnotes_auth.yaml"


# --- test primitives -----------------------------------------------------------------------------
class FakeJudgeInputs(PrimitiveInputs):
    score: float | None = None
    score_range: tuple[float, float] | None = None
    skip: bool = False


def fake_judge(inputs: FakeJudgeInputs, ctx: RunContext) -> StepResult:
    """A judge that answers what the DAG tells it to (or is 'unavailable' with skip: true)."""
    if inputs.skip:
        return StepResult(passed=False, judge_skipped=True, message="fake judge unavailable")
    return StepResult(
        passed=True,
        judge_score=inputs.score,
        judge_range=inputs.score_range,
        message=f"fake judge says {inputs.score:g}",
    )


class RaiseInputs(PrimitiveInputs):
    message: str = "boom"


def raising_primitive(inputs: RaiseInputs, ctx: RunContext) -> StepResult:
    raise RuntimeError(inputs.message)


@pytest.fixture(scope="module")
def test_primitives() -> Iterator[None]:
    """Register the fake judge as P17 and TEST_RAISE; restore the registry afterwards."""
    old_judge = REGISTRY.spec("P17")
    REGISTRY.register("P17", fake_judge, FakeJudgeInputs)
    REGISTRY.register("TEST_RAISE", raising_primitive, RaiseInputs, group="integration")
    try:
        yield
    finally:
        REGISTRY.unregister("TEST_RAISE")
        REGISTRY.remove("TEST_RAISE")  # a test-only code: leave no pending entry behind
        if old_judge is not None and old_judge.fn is not None and old_judge.inputs is not None:
            REGISTRY.register("P17", old_judge.fn, old_judge.inputs, raw_fields=old_judge.raw_fields)
        else:
            REGISTRY.unregister("P17")


# --- helpers -------------------------------------------------------------------------------------
def closed_port_url() -> str:
    """A URL nothing listens on (a port that was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def make_ctx(
    base_url: str | None,
    *,
    workspace: Path | None = None,
    variables: dict[str, Any] | None = None,
    env_defaults: dict[str, str] | None = None,
    options: RunOptions | None = None,
) -> RunContext:
    return RunContext(
        Target(base_url=base_url, workspace=workspace),
        options=options,
        auth_profile=load_auth_profile(AUTH_PROFILE),
        variables=variables,
        env_defaults=env_defaults,
    )


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A fresh TeamNotes server and the workspace it wrote."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server, _thread, base_url = teamnotes.serve_in_thread(workspace=str(workspace))
    try:
        yield base_url, workspace
    finally:
        server.shutdown()
        server.server_close()


def mini_dag(*nodes: dict[str, Any], meta: dict[str, Any] | None = None) -> Dag:
    return load_dag_data({"meta": meta or {}, "nodes": list(nodes)}, source="<test>").dag


def mini_node(
    node_id: str,
    steps: list[dict[str, Any]],
    method: str = "binary",
    max_score: float = 1,
    prereqs: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": prereqs or [],
        "steps": steps,
        "scoring": {"category": "Test", "method": method, "maxScore": max_score},
    }


def s(code: str, **inputs: Any) -> dict[str, Any]:
    return {"type": code, "inputs": inputs}


# --- the hand-written DAG ------------------------------------------------------------------------
# id: (status, score, maxScore). Every number is derived by hand in the comment beside it.
EXPECTED: dict[str, tuple[Status, float, float]] = {
    "LOGOUT_LAST": (Status.PASSED, 3, 3),  # logout 204, then /api/me 401: 5/5 steps
    "SETUP_HEALTH": (Status.PASSED, 0, 0),  # maxScore 0, chain passed -> PASSED (it gates)
    "SETUP_FILES": (Status.PASSED, 2.0, 3),  # weighted: README yes, models.py yes, >=5 app/*.py no: floor(2/3*3) = 2.0
    "AUTH_BEARER": (Status.PASSED, 4, 4),
    "AUTH_SESSION": (Status.PASSED, 4, 4),  # POST with the CSRF header from the login body -> 201
    "AUTH_API_KEY": (Status.PASSED, 2, 2),
    "AUTH_BASIC_WRONG": (Status.FAILED, 0, 2),  # Basic with a wrong password: /api/me 401, expected 200
    "API_CREATE": (Status.PASSED, 5, 5),  # raw list and raw bool placeholders accepted by the app
    "API_READ_BACK": (Status.PASSED, 3, 3),
    "API_NOTE": (Status.PASSED, 4.0, 4),  # weighted 5/5 steps = 4.0
    "API_CRUD_ROUNDTRIP": (Status.PASSED, 3, 3),
    "API_SCHEMA": (Status.PASSED, 2, 2),
    "PH_SHELL_ENV": (Status.PASSED, 2, 2),  # ${API_PREFIX:-/nope} -> /api from meta.env_defaults
    "PH_SHELL_VAR": (Status.PASSED, 2, 2),  # ${NAME_PREFIX:-Default}: the run variable "Var" beats env "Env"
    "PH_SHELL_DEFAULT": (Status.PASSED, 1, 1),  # ${UNSET_NAME:-Fallback}
    "PH_UNRESOLVED": (Status.FAILED, 0, 2),  # {{no_such_capture}} fails step 1
    "BIN_SHORT_CIRCUIT": (Status.FAILED, 0, 5),  # P15 expects 404, gets 200; stops after 2 of 5 steps
    "WEIGHTED_2_OF_3": (Status.PASSED, 3.3, 5),  # floor(2/3*5 = 3.333.., 0.1) = 3.3
    "WEIGHTED_1_OF_3": (Status.PASSED, 0.6, 2),  # floor(1/3*2 = 0.666.., 0.1) = 0.6 (not 0.7)
    "WEIGHTED_0_OF_2": (Status.FAILED, 0, 3),  # unresolved P04 + P15 500 vs 200: 0/2
    "WEIGHTED_ALL": (Status.PASSED, 2.0, 2),  # 3/3 * 2
    "GATE_A": (Status.FAILED, 0, 2),  # expects 503
    "GATE_B": (Status.SKIPPED_DEPENDENCY, 0, 3),  # A failed
    "GATE_C": (Status.SKIPPED_DEPENDENCY, 0, 4),  # B skipped: two levels down, still skipped
    "GATE_OK_CHAIN": (Status.PASSED, 1, 1),  # two passed prereqs
    "GATE_ON_WEIGHTED_PARTIAL": (Status.PASSED, 1, 1),  # prereq scored 0.6 > 0: PASSED, so the gate opens
    "GATE_ON_ERROR": (Status.SKIPPED_DEPENDENCY, 0, 2),  # prereq ERR_RAISES ended in ERROR
    "ERR_UNAVAILABLE": (Status.ERROR, 0, 3),  # P20 has no implementation
    "ERR_RAISES": (Status.ERROR, 0, 2),  # weighted, but an exception is ERROR with 0, not 1/3
    "JUDGE_FULL": (Status.PASSED, 4.0, 5),  # clip(4 * 5 / 5, 0, 5) = 4
    "JUDGE_SCALED": (Status.PASSED, 2.0, 4),  # clip(3 * 4 / 6, 0, 4) = 2
    "JUDGE_CLIPPED": (Status.PASSED, 2.0, 2),  # 7 * 2 / 5 = 2.8 -> clipped to 2
    "JUDGE_SKIPPED": (Status.SKIPPED_LLM, 0, 6),  # judge unavailable: out of numerator and denominator
    "JUDGE_NO_EVIDENCE": (Status.FAILED, 0, 3),  # evidence page unreachable: FAILED, not SKIPPED_LLM
    "JUDGE_ZERO": (Status.FAILED, 0, 2),  # the judge answered 0
    "RBAC_VIEWER_DENIED": (Status.PASSED, 2, 2),
    "RBAC_ADMIN_ALLOWED": (Status.PASSED, 2, 2),
    "RBAC_MEMBER_WRONG": (Status.FAILED, 0, 2),  # expects the member to be allowed; 403
}

# Stable topological order: file order, except GATE_ON_ERROR waits for ERR_RAISES (later in the
# file) and LOGOUT_LAST (first in the file, run_last) goes last.
EXPECTED_ORDER = [
    "SETUP_HEALTH",
    "SETUP_FILES",
    "AUTH_BEARER",
    "AUTH_SESSION",
    "AUTH_API_KEY",
    "AUTH_BASIC_WRONG",
    "API_CREATE",
    "API_READ_BACK",
    "API_NOTE",
    "API_CRUD_ROUNDTRIP",
    "API_SCHEMA",
    "PH_SHELL_ENV",
    "PH_SHELL_VAR",
    "PH_SHELL_DEFAULT",
    "PH_UNRESOLVED",
    "BIN_SHORT_CIRCUIT",
    "WEIGHTED_2_OF_3",
    "WEIGHTED_1_OF_3",
    "WEIGHTED_0_OF_2",
    "WEIGHTED_ALL",
    "GATE_A",
    "GATE_B",
    "GATE_C",
    "GATE_OK_CHAIN",
    "GATE_ON_WEIGHTED_PARTIAL",
    "ERR_UNAVAILABLE",
    "ERR_RAISES",
    "GATE_ON_ERROR",
    "JUDGE_FULL",
    "JUDGE_SCALED",
    "JUDGE_CLIPPED",
    "JUDGE_SKIPPED",
    "JUDGE_NO_EVIDENCE",
    "JUDGE_ZERO",
    "RBAC_VIEWER_DENIED",
    "RBAC_ADMIN_ALLOWED",
    "RBAC_MEMBER_WRONG",
    "LOGOUT_LAST",
]


# Run variables, as `--var` would give them. NAME_PREFIX overrides meta.env_defaults["NAME_PREFIX"].
def run_variables(dead_url: str) -> dict[str, Any]:
    return {
        "proj": "Alpha",
        "owner": {"name": "Ann", "tags": ["red", "blue"]},
        "xs": ["first", "second"],
        "flag": True,
        "NAME_PREFIX": "Var",
        "dead_url": dead_url + "/evidence",
    }


@pytest.fixture(scope="module")
def engine_run(
    test_primitives: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunReport, RunContext]]:
    workspace = tmp_path_factory.mktemp("workspace")
    server, _thread, base_url = teamnotes.serve_in_thread(workspace=str(workspace))
    try:
        loaded = load_dag(ENGINE_DAG)
        dag = loaded.dag
        # the fake judge stands in for a configured one (without a judge llm-judge nodes do not run)
        ctx = make_ctx(
            base_url,
            workspace=workspace,
            variables=run_variables(closed_port_url()),
            env_defaults=dag.env_defaults,
            options=RunOptions(judge_enabled=True),
        )
        report = Engine(dag, ctx).run()
        yield report, ctx
    finally:
        server.shutdown()
        server.server_close()


def by_id(report: RunReport) -> dict[str, Any]:
    return {r.id: r for r in report.nodes}


def test_engine_dag_loads_without_defects(test_primitives: None) -> None:
    loaded = load_dag(ENGINE_DAG)
    assert [str(i) for i in loaded.issues] == []
    assert len(loaded.dag.nodes) == 38 == loaded.dag.meta["total_nodes"]
    assert loaded.dag.total_max_score == 105 == loaded.dag.meta["total_maxScore"]


def test_every_node_status_and_score(engine_run: tuple[RunReport, RunContext]) -> None:
    report, _ = engine_run
    got = {r.id: (r.status, r.score, r.max_score) for r in report.nodes}
    assert got == EXPECTED, "\n".join(
        f"{r.id}: {r.status.value} {r.score} {r.message}" for r in report.nodes if got[r.id] != EXPECTED.get(r.id)
    )


def test_execution_order_and_run_last(engine_run: tuple[RunReport, RunContext]) -> None:
    report, _ = engine_run
    order = [r.id for r in report.nodes]
    assert order == EXPECTED_ORDER
    assert order[-1] == "LOGOUT_LAST"  # first in the file, run last: it revokes the admin token
    assert order.index("ERR_RAISES") < order.index("GATE_ON_ERROR")


def test_task_score_subscore_coverage_and_counts(engine_run: tuple[RunReport, RunContext]) -> None:
    report, _ = engine_run
    summary = report.summary
    # Denominator: all maxScores minus the SKIPPED_LLM node (JUDGE_SKIPPED, 6).
    #   Auth 3+4+4+2+2 = 15, Setup 0+3 = 3, API 5+3+4+3+2 = 17, Placeholders 2+2+1+2 = 7,
    #   Scoring 5+5+2+3+2 = 17, Gating 2+3+4+1+1+2 = 13, Errors 3+2 = 5, Judge 5+4+2+3+2 = 16 (6 dropped),
    #   RBAC 2+2+2 = 6  ->  15+3+17+7+17+13+5+16+6 = 99   (105 in the file - 6)
    # Numerator:
    #   Auth 3+4+4+2+0 = 13, Setup 0+2.0 = 2, API 5+3+4+3+2 = 17, Placeholders 2+2+1+0 = 5,
    #   Scoring 0+3.3+0.6+0+2 = 5.9, Gating 0+0+0+1+1+0 = 2, Errors 0, Judge 4+2+2+0+0 = 8, RBAC 2+2+0 = 4
    #   -> 13+2+17+5+5.9+2+0+8+4 = 56.9
    # Task score = 100 * 56.9 / 99 = 57.4747.. -> 57.47
    assert summary.score == 56.9
    assert summary.max_score == 99
    assert summary.task_score == 57.47
    assert summary.skipped_llm_max_score == 6
    # Deterministic subscore: without the llm-judge nodes (score 8 of 16 kept in the judge group)
    #   (56.9 - 8) / (99 - 16) = 48.9 / 83 = 58.9156.. -> 58.92
    assert summary.deterministic_score == 58.92
    # Node coverage: 24 PASSED of 38 nodes = 63.1578.. -> 63.16
    assert summary.node_coverage == 63.16
    assert summary.total_nodes == 38
    c = summary.counts
    # PASSED: LOGOUT_LAST SETUP_HEALTH SETUP_FILES AUTH_BEARER AUTH_SESSION AUTH_API_KEY (6)
    #         API_* (5) PH_SHELL_ENV PH_SHELL_VAR PH_SHELL_DEFAULT (3) WEIGHTED_2_OF_3 WEIGHTED_1_OF_3
    #         WEIGHTED_ALL (3) GATE_OK_CHAIN GATE_ON_WEIGHTED_PARTIAL (2) JUDGE_FULL JUDGE_SCALED
    #         JUDGE_CLIPPED (3) RBAC_VIEWER_DENIED RBAC_ADMIN_ALLOWED (2)  = 24
    # FAILED: AUTH_BASIC_WRONG PH_UNRESOLVED BIN_SHORT_CIRCUIT WEIGHTED_0_OF_2 GATE_A
    #         JUDGE_NO_EVIDENCE JUDGE_ZERO RBAC_MEMBER_WRONG = 8
    # ERROR 2, SKIPPED_DEPENDENCY 3 (GATE_B GATE_C GATE_ON_ERROR), SKIPPED_LLM 1: 24+8+2+3+1 = 38
    assert (c.PASSED, c.FAILED, c.ERROR, c.SKIPPED_DEPENDENCY, c.SKIPPED_LLM, c.DRY_RUN, c.QUARANTINED) == (
        24,
        8,
        2,
        3,
        1,
        0,
        0,
    )


def test_per_category_numbers(engine_run: tuple[RunReport, RunContext]) -> None:
    report, _ = engine_run
    got = {cat: (a.score, a.max_score, a.percent, a.nodes) for cat, a in report.categories.items()}
    assert got == {
        "Auth": (13, 15, 86.67, 5),  # 100 * 13 / 15 = 86.666..
        "Setup": (2, 3, 66.67, 2),  # 100 * 2 / 3
        "API": (17, 17, 100.0, 5),
        "Placeholders": (5, 7, 71.43, 4),  # 100 * 5 / 7 = 71.428..
        "Scoring": (5.9, 17, 34.71, 5),  # 100 * 5.9 / 17 = 34.705..
        "Gating": (2, 13, 15.38, 6),  # 100 * 2 / 13 = 15.384..
        "Errors": (0, 5, 0.0, 2),
        "Judge": (8, 16, 50.0, 6),  # 6 nodes, JUDGE_SKIPPED's 6 points out of the denominator
        "RBAC": (4, 6, 66.67, 3),
    }
    assert report.categories["Judge"].skipped_llm_max_score == 6
    assert report.categories["Judge"].counts.SKIPPED_LLM == 1
    assert report.categories["Gating"].counts.SKIPPED_DEPENDENCY == 3


def test_binary_short_circuit_runs_no_step_after_the_failure(engine_run: tuple[RunReport, RunContext]) -> None:
    nodes = by_id(engine_run[0])
    short = nodes["BIN_SHORT_CIRCUIT"]
    # 5 steps declared; P04 passed, P15 failed; P07, P04, P15 never ran
    assert [(r.index, r.type, r.passed) for r in short.steps] == [(0, "P04", True), (1, "P15", False)]
    assert short.message.startswith("step 1 P15 failed:") and "200" in short.message and "404" in short.message
    # weighted chains run every step even after a failure
    assert len(nodes["WEIGHTED_2_OF_3"].steps) == 3 and len(nodes["WEIGHTED_0_OF_2"].steps) == 2
    assert [r.passed for r in nodes["WEIGHTED_1_OF_3"].steps] == [True, False, False]
    assert nodes["WEIGHTED_2_OF_3"].message.startswith("2/3 steps passed")
    # skipped nodes ran nothing
    assert nodes["GATE_B"].steps == [] and nodes["GATE_C"].steps == []


def test_gating_messages(engine_run: tuple[RunReport, RunContext]) -> None:
    nodes = by_id(engine_run[0])
    assert nodes["GATE_B"].message == "prerequisite not passed: GATE_A"
    assert nodes["GATE_C"].message == "prerequisite not passed: GATE_B"
    assert nodes["GATE_ON_ERROR"].message == "prerequisite not passed: ERR_RAISES"


def test_errors_keep_their_message_and_stop_the_chain(engine_run: tuple[RunReport, RunContext]) -> None:
    nodes = by_id(engine_run[0])
    unavailable = nodes["ERR_UNAVAILABLE"]
    assert "P20" in unavailable.message and "not available" in unavailable.message
    assert [(r.type, r.passed, r.error) for r in unavailable.steps] == [("P04", True, False), ("P20", False, True)]
    raised = nodes["ERR_RAISES"]
    assert raised.message == "step 1 TEST_RAISE raised RuntimeError: boom"
    assert len(raised.steps) == 2 and raised.steps[1].error  # the P15 after it never ran
    assert "traceback" in raised.steps[1].evidence


def test_judge_nodes(engine_run: tuple[RunReport, RunContext]) -> None:
    nodes = by_id(engine_run[0])
    assert nodes["JUDGE_FULL"].judge == {
        "score": 4.0,
        "range": (0.0, 5.0),
        "skipped": False,
        "message": "fake judge says 4",
    }
    assert nodes["JUDGE_SKIPPED"].message == "fake judge unavailable"
    no_evidence = nodes["JUDGE_NO_EVIDENCE"]
    assert no_evidence.message.startswith("evidence step failed: step 0 P04 failed:")
    assert len(no_evidence.steps) == 1  # the app did not answer: the judge was never consulted


def test_placeholders_and_captures(engine_run: tuple[RunReport, RunContext]) -> None:
    report, ctx = engine_run
    nodes = by_id(report)
    # save_as stored the response record run-wide; the node's outputs carry created_id/id for {{NODE.field}}
    assert ctx.vars["created"]["body"]["name"] == "Alpha"
    assert ctx.vars["created"]["body"]["tags"] == ["red", "blue"]  # "{{owner.tags}}" went out as a list
    assert ctx.vars["created"]["body"]["archived"] is True  # "{{flag}}" went out as a bool
    # AUTH_SESSION created project 1, so API_CREATE's project is 2
    assert ctx.nodes["API_CREATE"]["created_id"] == 2 and ctx.nodes["API_CREATE"]["id"] == 2
    assert ctx.nodes["API_CREATE"]["status"] == "PASSED"
    assert ctx.nodes["API_CREATE"]["created"]["status"] == 201
    # the unresolved placeholder fails its step and names it
    unresolved = nodes["PH_UNRESOLVED"]
    assert [(r.type, r.passed) for r in unresolved.steps] == [("P13", True), ("P04", False)]
    assert unresolved.steps[1].message == "unresolved placeholder {{no_such_capture}}"
    assert "{{no_such_capture}}" in unresolved.message
    assert nodes["WEIGHTED_0_OF_2"].steps[0].message == "unresolved placeholder {{missing_thing}}"


def test_env_defaults_apply_when_no_variable_overrides(app: tuple[str, Path]) -> None:
    base_url, _ = app
    dag = mini_dag(
        mini_node(
            "ENV",
            [
                s("P13", role="admin"),
                s(
                    "P04",
                    method="POST",
                    path="${API_PREFIX:-/nope}/projects",
                    body={"name": "${NAME_PREFIX:-Default} project"},
                ),
                s("P15", expected_status=201),
            ],
        ),
        meta={"env_defaults": {"API_PREFIX": "/api", "NAME_PREFIX": "Env"}},
    )
    ctx = make_ctx(base_url, env_defaults=dag.env_defaults)
    report = Engine(dag, ctx).run()
    assert report.nodes[0].status is Status.PASSED, report.nodes[0].message
    assert ctx.last_response is not None and ctx.last_response.body["name"] == "Env project"


def test_dry_run_plans_without_executing(test_primitives: None) -> None:
    dag = load_dag(ENGINE_DAG).dag
    dead = closed_port_url()  # nothing may be contacted: a dry run sends no request
    ctx = make_ctx(dead, variables=run_variables(dead), env_defaults=dag.env_defaults)
    report = Engine(dag, ctx, EngineOptions(dry_run=True)).run()
    assert [r.id for r in report.nodes] == EXPECTED_ORDER
    assert {r.status for r in report.nodes} == {Status.DRY_RUN}
    assert all(r.steps == [] and r.score == 0 for r in report.nodes)
    assert report.summary.counts.DRY_RUN == 38
    # nothing ran, so there is no score at all (not 0)
    assert report.summary.task_score is None and report.summary.node_coverage is None
    assert report.summary.max_score == 0


def test_only_runs_the_selection_and_its_prerequisites(test_primitives: None, app: tuple[str, Path]) -> None:
    base_url, _ = app
    dag = load_dag(ENGINE_DAG).dag
    ctx = make_ctx(base_url, env_defaults=dag.env_defaults)
    report = Engine(dag, ctx, EngineOptions(only=["GATE_C"])).run()
    assert [(r.id, r.status) for r in report.nodes] == [
        ("GATE_A", Status.FAILED),
        ("GATE_B", Status.SKIPPED_DEPENDENCY),
        ("GATE_C", Status.SKIPPED_DEPENDENCY),
    ]
    # 0 / (2 + 3 + 4)
    assert (report.summary.score, report.summary.max_score, report.summary.task_score) == (0, 9, 0.0)


# --- bad input to the running engine --------------------------------------------------------------
def test_unreachable_app_fails_every_http_node_with_a_message() -> None:
    dead = closed_port_url()
    dag = mini_dag(
        mini_node("GET", [s("P04", path="/api/health"), s("P15", expected_status=200)]),
        mini_node("LOGIN", [s("P13", role="admin")]),
        mini_node("PERM", [s("P14", role="viewer", method="GET", path="/api/admin/users", expected_result="denied")]),
        mini_node("CRUD", [s("P05", resource="/api/projects", create_body={"name": "x"})]),
        mini_node("TIME", [s("P16", path="/api/health", max_ms=1000)]),
        mini_node("WEIGHTED", [s("P04", path="/api/health"), s("P15", expected_status=200)], method="weighted"),
        mini_node("DEPENDENT", [s("P04", path="/api/health")], prereqs=["GET"]),
    )
    report = Engine(dag, make_ctx(dead)).run()
    statuses = {r.id: r.status for r in report.nodes}
    assert statuses == {
        "GET": Status.FAILED,
        "LOGIN": Status.FAILED,
        "PERM": Status.FAILED,
        "CRUD": Status.FAILED,
        "TIME": Status.FAILED,
        "WEIGHTED": Status.FAILED,
        "DEPENDENT": Status.SKIPPED_DEPENDENCY,
    }
    for r in report.nodes:
        if r.status is Status.FAILED:
            assert r.message, r.id
    assert "cannot connect" in report.nodes[0].message
    assert dead.split("//")[1] in report.nodes[0].message  # names where it tried
    assert report.summary.task_score == 0.0


def test_unreachable_app_with_the_demo_dag_does_not_crash(tmp_path: Path) -> None:
    dag = load_dag(ROOT / "tests" / "apps" / "teamnotes_dag.json").dag
    report = Engine(dag, make_ctx(closed_port_url(), workspace=tmp_path, env_defaults=dag.env_defaults)).run()
    assert report.summary.counts.ERROR == 0
    assert {r.status for r in report.nodes} <= {Status.FAILED, Status.SKIPPED_DEPENDENCY}
    assert report.summary.task_score == 0.0


def test_a_10_mb_answer_is_refused_at_the_cap(app: tuple[str, Path]) -> None:
    base_url, _ = app
    dag = mini_dag(
        mini_node("BIG", [s("P04", path="/api/debug/big?mb=10"), s("P15", expected_status=200)]),
        mini_node("AFTER", [s("P04", path="/api/health"), s("P15", expected_status=200)]),
    )
    report = Engine(dag, make_ctx(base_url)).run()
    big, after = report.nodes
    assert big.status is Status.FAILED
    assert "exceeds" in big.message and "5242880-byte cap" in big.message
    assert after.status is Status.PASSED  # the run goes on, the connection is still usable


def test_invalid_json_body_then_p07(app: tuple[str, Path]) -> None:
    base_url, _ = app
    dag = mini_dag(
        mini_node(
            "BADJSON",
            [
                s("P04", path="/api/debug/badjson"),
                s("P15", expected_status=200),
                s("P07", assertions=[{"path": "$.broken", "operator": "exists"}]),
            ],
            method="weighted",
            max_score=3,
        )
    )
    report = Engine(dag, make_ctx(base_url)).run()
    (node,) = report.nodes
    # the answer arrived (P04, P15 pass) but is not JSON, so the assertion cannot hold: floor(2/3*3) = 2.0
    assert [r.passed for r in node.steps] == [True, True, False]
    assert (node.status, node.score) == (Status.PASSED, 2.0)
    assert node.steps[0].evidence.get("json_error", "").startswith("invalid JSON body")
    # the body is kept as text, so the JSON path finds nothing; the P04 evidence says why
    assert "$.broken" in node.steps[2].message and "absent" in node.steps[2].message


def test_slow_endpoint_hits_the_node_deadline(app: tuple[str, Path]) -> None:
    base_url, _ = app
    dag = mini_dag(
        mini_node("SLOW", [s("P04", path="/api/debug/slow?ms=3000"), s("P15", expected_status=200)]),
        mini_node("NEXT", [s("P04", path="/api/health"), s("P15", expected_status=200)]),
    )
    report = Engine(dag, make_ctx(base_url, options=RunOptions(node_timeout_s=0.5))).run()
    slow, nxt = report.nodes
    assert slow.status is Status.FAILED
    assert "timeout" in slow.message and "/api/debug/slow" in slow.message
    assert [r.type for r in slow.steps] == ["P04"]  # binary: P15 never ran
    assert nxt.status is Status.PASSED  # each node has its own deadline
