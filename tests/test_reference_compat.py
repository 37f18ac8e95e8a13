"""Reference-compatible step results, each reproduced with a one-node DAG against TeamNotes.

These are the defects found by scoring a real, unmodified Apache Superset with its SaaSBench
DAG (docs/fidelity.md): a saved response without ``created_id``, a P07 after P05 reading
P05's summary instead of the created entity, ``keep_alive`` leaving the updated entity for
later nodes, P14 ``expected_status`` replacing the deny set, ties in the topological order,
and llm-judge evidence rendered when no judge will read it. Each test fails on the engine
before the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apps import teamnotes
from typer.testing import CliRunner

from saasbench.cli.main import app
from saasbench.dag import execution_order, load_dag_data
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import RunReport, Status
from saasbench.services.auth import load_auth_profile

AUTH = Path(teamnotes.__file__).with_name("teamnotes_auth.yaml")


@pytest.fixture(scope="module")
def base_url():
    server, _thread, url = teamnotes.serve_in_thread()
    yield url
    server.shutdown()
    server.server_close()


def node(
    node_id: str,
    steps: list[dict[str, Any]],
    *,
    prereqs: list[str] | None = None,
    method: str = "binary",
    max_score: float = 2,
) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": prereqs or [],
        "steps": steps,
        "scoring": {"category": "CRUD", "method": method, "maxScore": max_score},
    }


def login() -> dict[str, Any]:
    return {"type": "P13", "inputs": {"role": "admin"}}


def run(base_url: str, nodes: list[dict[str, Any]], *, compat: str = "strict", judge: bool = False) -> dict[str, Any]:
    dag = load_dag_data({"nodes": nodes}).dag
    ctx = RunContext(
        Target(base_url=base_url),
        options=RunOptions(compat=compat, judge_enabled=judge),
        auth_profile=load_auth_profile(AUTH),
    )
    report: RunReport = Engine(dag, ctx).run()
    return {r.id: r for r in report.nodes}


def explain(results: dict[str, Any]) -> str:
    return "\n".join(f"{r.id}: {r.status.value} {r.message}" for r in results.values())


def test_saved_response_exposes_created_id(base_url: str) -> None:
    out = run(
        base_url,
        [
            node(
                "SAVE",
                [
                    login(),
                    {
                        "type": "P04",
                        "inputs": {
                            "method": "POST",
                            "path": "/api/projects",
                            "body": {"name": "saved-created-id"},
                            "save_as": "proj",
                        },
                    },
                    {"type": "P04", "inputs": {"method": "GET", "path": "/api/projects/{{proj.created_id}}"}},
                    {"type": "P15", "inputs": {"expected_status": 200}},
                    {"type": "P07", "inputs": {"assertions": [{"path": "$.name", "expected": "saved-created-id"}]}},
                ],
            )
        ],
    )
    assert out["SAVE"].status is Status.PASSED, explain(out)


def test_p07_after_p05_reads_the_created_entity(base_url: str) -> None:
    out = run(
        base_url,
        [
            node(
                "CRUD",
                [
                    login(),
                    {
                        "type": "P05",
                        "inputs": {
                            "resource": "/api/projects",
                            "create_body": {"name": "p05-document"},
                            "keep_alive": True,
                        },
                    },
                    {"type": "P07", "inputs": {"assertions": [{"path": "$.name", "expected": "p05-document"}]}},
                ],
            )
        ],
    )
    assert out["CRUD"].status is Status.PASSED, explain(out)


def test_p07_after_p05_still_reads_the_summary_fields(base_url: str) -> None:
    """Family D asserts P05's own counters; the body has no such key, so the summary fills in."""
    out = run(
        base_url,
        [
            node(
                "CRUD",
                [
                    login(),
                    {"type": "P05", "inputs": {"resource": "/api/projects", "create_body": {"name": "p05-summary"}}},
                    {"type": "P07", "inputs": {"assertions": [{"path": "$.steps_passed", "expected": 3}]}},
                ],
            )
        ],
    )
    assert out["CRUD"].status is Status.PASSED, explain(out)


def test_keep_alive_recreates_the_entity_with_its_create_time_values(base_url: str) -> None:
    out = run(
        base_url,
        [
            node(
                "CRUD_KEEP",
                [
                    login(),
                    {
                        "type": "P05",
                        "inputs": {
                            "resource": "/api/projects",
                            "create_body": {"name": "kept-original"},
                            "update_body": {"name": "kept-updated"},
                            "keep_alive": True,
                        },
                    },
                ],
            ),
            node(
                "LATER",
                [
                    login(),
                    {"type": "P04", "inputs": {"method": "GET", "path": "/api/projects/{{CRUD_KEEP.created_id}}"}},
                    {"type": "P15", "inputs": {"expected_status": 200}},
                    {"type": "P07", "inputs": {"assertions": [{"path": "$.name", "expected": "kept-original"}]}},
                ],
                prereqs=["CRUD_KEEP"],
            ),
        ],
    )
    assert out["CRUD_KEEP"].status is Status.PASSED, explain(out)
    steps = out["CRUD_KEEP"].steps[1].evidence["steps"]
    assert [s["step"] for s in steps] == ["create", "read", "update", "delete", "recreate"]
    assert out["LATER"].status is Status.PASSED, explain(out)


def test_skip_delete_keeps_the_entity_without_recreating_it(base_url: str) -> None:
    out = run(
        base_url,
        [
            node(
                "CRUD_SKIP",
                [
                    login(),
                    {
                        "type": "P05",
                        "inputs": {
                            "resource": "/api/projects",
                            "create_body": {"name": "skip-delete"},
                            "skip_delete": True,
                        },
                    },
                ],
            )
        ],
    )
    steps = out["CRUD_SKIP"].steps[1].evidence["steps"]
    assert [s["step"] for s in steps] == ["create", "read"]


def test_p14_expected_status_widens_the_deny_set(base_url: str) -> None:
    """A 404 for a record the caller may not see is a denial, even when the DAG names 403."""
    out = run(
        base_url,
        [
            node(
                "HIDDEN",
                [
                    login(),
                    {
                        "type": "P14",
                        "inputs": {
                            "method": "GET",
                            "path": "/api/projects/987654",
                            "expected_result": "denied",
                            "expected_status": 403,
                        },
                    },
                ],
            )
        ],
    )
    assert out["HIDDEN"].status is Status.PASSED, explain(out)


def test_p14_expected_status_without_denied_still_replaces_the_defaults(base_url: str) -> None:
    out = run(
        base_url,
        [
            node(
                "EXACT",
                [
                    login(),
                    {
                        "type": "P14",
                        "inputs": {"method": "GET", "path": "/api/projects/987654", "expected_status": 403},
                    },
                ],
            )
        ],
    )
    assert out["EXACT"].status is Status.FAILED, explain(out)


# --- order ------------------------------------------------------------------------------------------
ORDER_NODES = [
    node("ROOT", [{"type": "P15", "inputs": {}}]),
    node("CHILD", [{"type": "P15", "inputs": {}}], prereqs=["ROOT"]),
    node("LATE_ROOT", [{"type": "P15", "inputs": {}}]),
]


def test_fifo_ties_follow_the_reference_kahn() -> None:
    nodes = load_dag_data({"nodes": ORDER_NODES}).dag.nodes
    assert [n.id for n in execution_order(nodes)] == ["ROOT", "CHILD", "LATE_ROOT"]
    # the reference's queue holds both roots before CHILD becomes ready
    assert [n.id for n in execution_order(nodes, ties="fifo")] == ["ROOT", "LATE_ROOT", "CHILD"]


def test_order_decides_shared_state_and_compat_reference_runs_fifo(base_url: str) -> None:
    """DROP uses MAKE's project without declaring it (a real-DAG defect): the order decides READ."""
    for compat, read_status in (("strict", Status.PASSED), ("reference", Status.FAILED)):
        nodes = [
            node(
                "MAKE",
                [
                    login(),
                    {
                        "type": "P04",
                        "inputs": {
                            "method": "POST",
                            "path": "/api/projects",
                            "body": {"name": f"order-{compat}"},
                            "save_as": "shared",
                        },
                    },
                ],
            ),
            node(
                "READ",
                [
                    login(),
                    {"type": "P04", "inputs": {"method": "GET", "path": "/api/projects/{{shared.created_id}}"}},
                    {"type": "P15", "inputs": {"expected_status": 200}},
                ],
                prereqs=["MAKE"],
            ),
            node(
                "DROP",
                [
                    login(),
                    {"type": "P04", "inputs": {"method": "DELETE", "path": "/api/projects/{{shared.created_id}}"}},
                ],
            ),
        ]
        out = run(base_url, nodes, compat=compat)
        assert list(out) == (["MAKE", "READ", "DROP"] if compat == "strict" else ["MAKE", "DROP", "READ"])
        assert out["READ"].status is read_status, explain(out)


def test_dag_plan_prints_the_reference_order(tmp_path: Path) -> None:
    path = tmp_path / "dag.json"
    path.write_text(json.dumps({"nodes": ORDER_NODES}))
    runner = CliRunner()
    strict = runner.invoke(app, ["dag", "plan", str(path), "--json"])
    reference = runner.invoke(app, ["dag", "plan", str(path), "--json", "--compat", "reference"])
    assert strict.exit_code == 0 and reference.exit_code == 0, strict.output + reference.output
    assert [r["id"] for r in json.loads(strict.output)] == ["ROOT", "CHILD", "LATE_ROOT"]
    assert [r["id"] for r in json.loads(reference.output)] == ["ROOT", "LATE_ROOT", "CHILD"]


# --- judge-less runs --------------------------------------------------------------------------------
JUDGE_NODES = [
    node(
        "GATE",
        [
            {"type": "P04", "inputs": {"method": "GET", "path": "/no-such-page"}},
            {"type": "P15", "inputs": {"expected_status": 200}},
        ],
    ),
    node(
        "LOOKS",
        [
            {"type": "P04", "inputs": {"method": "GET", "path": "/"}},
            {
                "type": "P17",
                "inputs": {"rubric_prompt": "Is the home page good?", "evidence_type": "http_response_html"},
            },
        ],
        prereqs=["GATE"],
        method="llm-judge",
        max_score=5,
    ),
]


def test_without_a_judge_llm_nodes_are_skipped_before_gating_and_run_no_evidence(base_url: str) -> None:
    out = run(base_url, JUDGE_NODES)
    assert out["GATE"].status is Status.FAILED
    looks = out["LOOKS"]
    assert looks.status is Status.SKIPPED_LLM, explain(out)  # not SKIPPED_DEPENDENCY: no judge either way
    assert looks.steps == []  # the evidence request was never sent
    assert "--judge-model" in looks.message


def test_with_a_judge_llm_nodes_are_still_gated(base_url: str) -> None:
    out = run(base_url, JUDGE_NODES, judge=True)
    assert out["LOOKS"].status is Status.SKIPPED_DEPENDENCY, explain(out)
