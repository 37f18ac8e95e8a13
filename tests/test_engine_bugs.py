"""The demo DAG against the correct TeamNotes app and against its deliberate bugs.

On the correct app every node passes (task score 100). Each bug must flip exactly the nodes
that check the behaviour it breaks (and the nodes gated on them), nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apps import teamnotes

from saasbench.dag import load_dag
from saasbench.evaluation.context import RunContext, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import RunReport, Status
from saasbench.services.auth import load_auth_profile

EXAMPLES = Path(__file__).resolve().parent / "apps"
DEMO_DAG = EXAMPLES / "teamnotes_dag.json"
AUTH_PROFILE = EXAMPLES / "teamnotes_auth.yaml"
TOTAL = 107  # sum of the demo DAG's maxScores (also meta.total_maxScore)


def run_demo(tmp_path: Path, bugs: frozenset[str] = frozenset()) -> RunReport:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server, _thread, base_url = teamnotes.serve_in_thread(bugs=bugs, workspace=str(workspace))
    try:
        dag = load_dag(DEMO_DAG).dag
        ctx = RunContext(
            Target(base_url=base_url, workspace=workspace),
            auth_profile=load_auth_profile(AUTH_PROFILE),
            env_defaults=dag.env_defaults,
        )
        return Engine(dag, ctx).run()
    finally:
        server.shutdown()
        server.server_close()


def not_passed(report: RunReport) -> dict[str, Status]:
    return {r.id: r.status for r in report.nodes if r.status is not Status.PASSED}


def explain(report: RunReport) -> str:
    return "\n".join(f"{r.id}: {r.status.value} {r.message}" for r in report.nodes if r.status is not Status.PASSED)


def test_demo_dag_scores_100_on_the_correct_app(tmp_path: Path) -> None:
    report = run_demo(tmp_path)
    assert not_passed(report) == {}, explain(report)
    assert report.summary.task_score == 100.0
    assert report.summary.deterministic_score == 100.0
    assert report.summary.node_coverage == 100.0
    assert (report.summary.score, report.summary.max_score) == (TOTAL, TOTAL)
    assert report.summary.counts.PASSED == len(report.nodes) == 39
    assert report.nodes[-1].id == "CRUD_PROJECT_DELETE"  # last: everything reading the project ran first
    assert {c: a.percent for c, a in report.categories.items()} == {
        "Deployment": 100.0,
        "Authentication": 100.0,
        "API_CRUD": 100.0,
        "RBAC": 100.0,
        "Validation": 100.0,
        "EdgeCases": 100.0,
    }


@pytest.mark.parametrize(
    ("bug", "flipped", "score"),
    [
        # member may delete and list users: the two "member cannot" checks fail; the admin delete that is
        # gated on them is skipped (the member already deleted its project).
        # (107 - 4 - 3 - 3) / 107 = 97 / 107 = 90.654.. -> 90.65
        (
            "no_rbac",
            {
                "RBAC_MEMBER_CANNOT_DELETE": Status.FAILED,
                "RBAC_MEMBER_NO_ADMIN_USERS": Status.FAILED,
                "RBAC_ADMIN_CAN_DELETE": Status.SKIPPED_DEPENDENCY,
            },
            90.65,
        ),
        # the default page size is 50: the default check fails and the paging check gated on it is skipped.
        # (107 - 3 - 2) / 107 = 102 / 107 = 95.327.. -> 95.33
        (
            "page_size",
            {"EDGE_PAGINATION_DEFAULT": Status.FAILED, "EDGE_PAGINATION_PAGES": Status.SKIPPED_DEPENDENCY},
            95.33,
        ),
        # a project without a name is accepted: only the missing-name check fails.
        # (107 - 3) / 107 = 104 / 107 = 97.196.. -> 97.2
        ("no_validation", {"VALID_MISSING_NAME": Status.FAILED}, 97.2),
    ],
)
def test_each_bug_flips_exactly_its_nodes(tmp_path: Path, bug: str, flipped: dict[str, Status], score: float) -> None:
    report = run_demo(tmp_path, frozenset({bug}))
    assert not_passed(report) == flipped, explain(report)
    assert report.summary.task_score == score
    assert report.summary.counts.ERROR == 0
    for r in report.nodes:
        if r.status is Status.FAILED:
            assert r.message and r.score == 0
