"""``saasbench rescore``: a past sweep scored again from its frozen end states, into a linked sweep.

Equality first: the oracle's frozen end state, restored and evaluated, gives node for node the
statuses of the live evaluation (local and Docker). Then a changed DAG changes exactly the changed
node, and ``--judge-only`` finishes a judge_error trial from its stored evidence without an environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_data import oracle_sweep_spec
from typer.testing import CliRunner

from saasbench import lake as lakelib
from saasbench.agents.oracle import OracleAgent
from saasbench.catalog.tasks import load_task
from saasbench.cli.main import app
from saasbench.runs import rescore as rs
from saasbench.runs import sweep as sw

TRIAL = "timetrack.oracle.none.0"


def statuses(lake: str, sweep_id: str) -> dict[str, str]:
    rows = lakelib.query(lake, "SELECT node_id, status FROM node_results", sweep_id=sweep_id).to_pylist()
    return {r["node_id"]: r["status"] for r in rows}


@pytest.fixture
def no_agent(monkeypatch):
    """A rescore never runs an agent."""

    def refuse(self, prompt, env, budget):
        raise AssertionError("the agent ran during a rescore")

    monkeypatch.setattr(OracleAgent, "run", refuse)


@pytest.fixture(scope="module")
def oracle_sweep(tmp_path_factory) -> sw.SweepSpec:
    spec = oracle_sweep_spec(tmp_path_factory.mktemp("rescore"), "s-parent")
    assert sw.run_sweep_plain(spec) == {TRIAL: "completed"}
    return spec


def test_rescore_of_the_oracle_equals_the_live_evaluation(oracle_sweep, no_agent):
    lake = oracle_sweep.lake_uri
    result = rs.rescore("s-parent", lake=lake, sweep_id="s-again")
    assert result.outcomes == {TRIAL: "completed"} and not result.skipped and not result.failed
    live = statuses(lake, "s-parent")
    assert live and statuses(lake, "s-again") == live
    (row,) = lakelib.query(
        lake,
        "SELECT parent_sweep_id, dag_hash, judge_model, rescore_mode, harness_version FROM sweeps "
        "WHERE sweep_id = 's-again'",
    ).to_pylist()
    assert row["parent_sweep_id"] == "s-parent" and row["dag_hash"] is None and row["rescore_mode"] == "full"
    assert row["harness_version"]
    # the rescored trial keeps the rollout's trajectory and carries the same end state
    (es,) = lakelib.query(
        lake,
        "SELECT (SELECT manifest_key FROM end_states WHERE sweep_id = 's-parent') = "
        "(SELECT manifest_key FROM end_states WHERE sweep_id = 's-again') AS same",
    ).to_pylist()
    assert es["same"]
    events = lakelib.query(
        lake, "SELECT sweep_id, count(*) AS n FROM trajectory_events GROUP BY sweep_id ORDER BY sweep_id"
    ).to_pylist()
    assert len(events) == 2 and events[0]["n"] == events[1]["n"] > 0


def test_rescore_with_a_changed_dag_differs_exactly_in_the_changed_node(oracle_sweep, tmp_path, no_agent):
    dag = json.loads(Path(load_task("timetrack").dag_path).read_text(encoding="utf-8"))
    node = next(n for n in dag["nodes"] if n["id"] == "DEPLOY_README_PRODUCT")
    node["steps"][0]["inputs"]["pattern"] = "this text is in no README"
    fixed = tmp_path / "dag.json"
    fixed.write_text(json.dumps(dag), encoding="utf-8")
    lake = oracle_sweep.lake_uri
    result = rs.rescore("s-parent", lake=lake, dag=fixed, sweep_id="s-newdag")
    assert result.outcomes == {TRIAL: "completed"}
    before, after = statuses(lake, "s-parent"), statuses(lake, "s-newdag")
    changed = {n for n in before if before[n] != after.get(n)}
    assert changed == {"DEPLOY_README_PRODUCT"} and after["DEPLOY_README_PRODUCT"] == "FAILED"
    (row,) = lakelib.query(lake, "SELECT dag_hash FROM sweeps WHERE sweep_id = 's-newdag'").to_pylist()
    assert row["dag_hash"] and len(row["dag_hash"]) == 64


def test_judge_only_finishes_a_judge_error_trial_without_an_environment(tmp_path, monkeypatch):
    from fake_llm import FakeLLM, Reply

    judge = {"model": "openai/fake", "retries": 0, "backoff_base_s": 0.01, "backoff_cap_s": 0.02}
    with FakeLLM(default=Reply.error(503, "down")) as down:
        spec = oracle_sweep_spec(tmp_path, "s-judgedown", judge={**judge, "api_base": down.base_url}, retries=1)
        assert sw.run_sweep_plain(spec, sleep=lambda s: None) == {TRIAL: "judge_error"}
    lake = spec.lake_uri

    def no_environment(*a, **k):
        raise AssertionError("--judge-only started an environment")

    monkeypatch.setattr("saasbench.runs.trial.make_environment", no_environment)
    with FakeLLM(default=Reply.json({"score": 4, "reasoning": "fine"})) as up:
        result = rs.rescore(
            "s-judgedown", lake=lake, judge={**judge, "api_base": up.base_url}, judge_only=True, sweep_id="s-rejudged"
        )
        asked = len(up.chat_requests)
    assert result.outcomes == {TRIAL: "completed"}
    before, after = statuses(lake, "s-judgedown"), statuses(lake, "s-rejudged")
    judged = {n for n in before if before[n] == "SKIPPED_LLM"}
    assert judged and asked == len(judged) and all(after[n] == "PASSED" for n in judged)
    assert {n: s for n, s in after.items() if n not in judged} == {n: s for n, s in before.items() if n not in judged}
    (row,) = lakelib.query(
        lake, "SELECT parent_sweep_id, judge_model, rescore_mode FROM sweeps WHERE sweep_id = 's-rejudged'"
    ).to_pylist()
    assert row == {"parent_sweep_id": "s-judgedown", "judge_model": "openai/fake", "rescore_mode": "judge-only"}


def test_rescore_command_errors_and_output(oracle_sweep, no_agent):
    lake = oracle_sweep.lake_uri
    res = CliRunner().invoke(app, ["rescore", "no-such-sweep", "--lake", lake])
    assert res.exit_code == 2 and "not in the lake" in res.output
    res = CliRunner().invoke(app, ["rescore", "s-parent", "--lake", lake, "--judge-only"])
    assert res.exit_code == 2 and "needs a judge" in res.output
    res = CliRunner().invoke(app, ["rescore", "s-parent", "--lake", lake, "--sweep-id", "s-cli"])
    assert res.exit_code == 0, res.output
    assert "saasbench compare s-parent s-cli" in res.output and "completed" in res.output
    assert statuses(lake, "s-cli") == statuses(lake, "s-parent")


def test_rescore_in_docker_equals_the_live_evaluation(tmp_path, monkeypatch, docker_client, python_image):  # noqa: F811
    monkeypatch.setenv("DOCKER_HOST", docker_client.saasbench_base_url)
    spec = oracle_sweep_spec(tmp_path, "s-docker", backend="docker")
    assert sw.run_sweep_plain(spec) == {TRIAL: "completed"}
    monkeypatch.setattr(OracleAgent, "run", lambda *a: pytest.fail("the agent ran during a rescore"))
    result = rs.rescore("s-docker", lake=spec.lake_uri, sweep_id="s-docker-again")
    assert result.outcomes == {TRIAL: "completed"}
    live = statuses(spec.lake_uri, "s-docker")
    assert live and statuses(spec.lake_uri, "s-docker-again") == live
    (es,) = lakelib.query(spec.lake_uri, "SELECT DISTINCT backend FROM end_states").to_pylist()
    assert es == {"backend": "docker"}
