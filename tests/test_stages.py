"""The trial as stages (saasbench.runs.stages): a failure after the rollout never runs the agent again.

Each test counts the agent's runs (the oracle's ``run``) and injects one infrastructure failure at a
stage boundary: the environment dying while evaluating, the lake refusing the commit, the process
killed between freeze and evaluate, the judge down and then up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from shared_data import oracle_sweep_spec

from saasbench import lake as lakelib
from saasbench.agents.oracle import OracleAgent
from saasbench.environments import base as environment
from saasbench.runs import stages
from saasbench.runs import sweep as sw

REPO = Path(__file__).resolve().parents[1]
TRIAL = "timetrack.oracle.none.0"


@pytest.fixture
def agent_runs(monkeypatch):
    """Every run of the oracle agent (the rollout), in order."""
    runs: list[str] = []
    real = OracleAgent.run

    def counting(self, prompt, env, budget):
        runs.append(env.workspace_path)
        return real(self, prompt, env, budget)

    monkeypatch.setattr(OracleAgent, "run", counting)
    return runs


def node_statuses(lake: str, sweep_id: str) -> dict[str, str]:
    rows = lakelib.query(lake, "SELECT node_id, status FROM node_results", sweep_id=sweep_id).to_pylist()
    return {r["node_id"]: r["status"] for r in rows}


def trial_row(lake: str, sweep_id: str) -> dict:
    (row,) = lakelib.query(lake, "SELECT outcome, valid, task_score FROM trials", sweep_id=sweep_id).to_pylist()
    return row


@pytest.fixture(scope="module")
def clean_statuses(tmp_path_factory) -> dict[str, str]:
    """Node statuses of one uninterrupted oracle trial (what every recovered trial must reproduce)."""
    spec = oracle_sweep_spec(tmp_path_factory.mktemp("clean"), "s-clean")
    assert sw.run_sweep_plain(spec) == {TRIAL: "completed"}
    statuses = node_statuses(spec.lake_uri, spec.sweep_id)
    assert statuses and "PASSED" in statuses.values()
    return statuses


def test_environment_failure_while_evaluating_restores_the_frozen_state(
    tmp_path, monkeypatch, agent_runs, clean_statuses
):
    spec = oracle_sweep_spec(tmp_path, "s-evalfail")
    real_start_app = environment.start_app
    starts: list[str] = []

    def dying_start_app(task, env, **kw):
        starts.append(env.workspace_path)
        if len(starts) == 1:
            raise environment.EnvError("the environment died while the app was starting")
        return real_start_app(task, env, **kw)

    monkeypatch.setattr(environment, "start_app", dying_start_app)
    sleeps: list[float] = []
    assert sw.run_sweep_plain(spec, sleep=sleeps.append) == {TRIAL: "completed"}
    assert len(agent_runs) == 1 and sleeps == [0]
    assert len(starts) == 2 and starts[0] != starts[1]  # the retry ran in a fresh, restored environment
    assert node_statuses(spec.lake_uri, spec.sweep_id) == clean_statuses
    (es,) = lakelib.query(spec.lake_uri, "SELECT manifest_key FROM end_states", sweep_id=spec.sweep_id).to_pylist()
    assert es["manifest_key"]
    assert lakelib.lake_from_uri(spec.lake_uri).list("stages/") == []  # checkpoints removed after the commit


def test_lake_write_failure_at_commit_is_retried_from_the_commit(tmp_path, monkeypatch, agent_runs, clean_statuses):
    spec = oracle_sweep_spec(tmp_path, "s-lakefail")
    real_write = lakelib.write_trial
    writes: list[str] = []

    def failing_write(store, rows, **kw):
        writes.append(rows.trial_id)
        if len(writes) == 1:
            raise OSError("No space left on device")
        return real_write(store, rows, **kw)

    monkeypatch.setattr(lakelib, "write_trial", failing_write)
    assert sw.run_sweep_plain(spec, sleep=lambda s: None) == {TRIAL: "completed"}
    assert len(agent_runs) == 1 and writes == [TRIAL, TRIAL]
    assert node_statuses(spec.lake_uri, spec.sweep_id) == clean_statuses


def test_lake_failure_exhausted_keeps_the_checkpoints(tmp_path, monkeypatch, agent_runs):
    """The commit failing through every retry raises (nothing committed); the next run commits from the
    checkpoints without the agent."""
    spec = oracle_sweep_spec(tmp_path, "s-lakedown", retries=1)
    real_write = lakelib.write_trial
    monkeypatch.setattr(lakelib, "write_trial", lambda *a, **k: (_ for _ in ()).throw(OSError("lake down")))
    with pytest.raises(stages.LakeError):
        sw.run_trial(sw.plan(spec)[0], spec, sleep=lambda s: None)
    ck = stages.Checkpoints(lakelib.lake_from_uri(spec.lake_uri), spec.sweep_id, TRIAL)
    assert ck.finished() == ["build_env", "rollout", "freeze", "evaluate", "judge"]
    monkeypatch.setattr(lakelib, "write_trial", real_write)
    assert sw.run_trial(sw.plan(spec)[0], spec) == "completed"
    assert len(agent_runs) == 1 and ck.finished() == []


def test_kill_between_freeze_and_evaluate_resumes_without_the_agent(tmp_path, agent_runs, clean_statuses):
    spec = oracle_sweep_spec(tmp_path, "s-kill")
    script = textwrap.dedent(f"""
        import os, signal
        from saasbench.runs import stages, sweep
        real = stages.freeze
        def freeze_then_die(run):
            out = real(run)
            os.kill(os.getpid(), signal.SIGKILL)
            return out
        stages.freeze = freeze_then_die
        sweep.run_sweep_plain(sweep.SweepSpec.model_validate({spec.model_dump()!r}), 1)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(REPO), start_new_session=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    store = lakelib.lake_from_uri(spec.lake_uri)
    assert lakelib.committed_trials(store, spec.sweep_id) == set()
    ck = stages.Checkpoints(store, spec.sweep_id, TRIAL)
    assert ck.finished() == ["build_env", "rollout", "freeze"]

    assert sw.run_sweep_plain(spec) == {TRIAL: "completed"}
    assert agent_runs == []  # the rerun evaluated the frozen state: the agent did not run
    assert node_statuses(spec.lake_uri, spec.sweep_id) == clean_statuses


def test_judge_down_then_up_delays_the_trial_instead_of_voiding_it(tmp_path, agent_runs):
    from fake_llm import FakeLLM, Reply

    state = {"up": False}

    def respond(request):
        return Reply.json({"score": 4, "reasoning": "fine"}) if state["up"] else Reply.error(503, "overloaded")

    def sleep(seconds: float) -> None:  # the stage waits between retries: the judge comes back meanwhile
        state["up"] = True

    judge = {"model": "openai/fake", "retries": 1, "backoff_base_s": 0.01, "backoff_cap_s": 0.02}
    with FakeLLM(responder=respond) as llm:
        spec = oracle_sweep_spec(tmp_path, "s-judgeback", judge={**judge, "api_base": llm.base_url})
        assert sw.run_sweep_plain(spec, sleep=sleep) == {TRIAL: "completed"}
    assert state["up"] and len(agent_runs) == 1
    row = trial_row(spec.lake_uri, spec.sweep_id)
    assert row["outcome"] == "completed" and row["valid"]
    judged = lakelib.query(
        spec.lake_uri, "SELECT status FROM node_results WHERE method = 'llm-judge'", sweep_id=spec.sweep_id
    ).to_pylist()
    assert judged and all(r["status"] == "PASSED" for r in judged)


def test_checkpoints_are_json_in_the_object_store(tmp_path):
    store = lakelib.lake_from_uri(str(tmp_path / "lake"))
    ck = stages.Checkpoints(store, "s", "t.a.none.0")
    assert ck.load("rollout") is None and ck.finished() == []
    ck.save("rollout", {"outcome": "completed"})
    ck.save("build_env", {"image": None})
    assert ck.finished() == ["build_env", "rollout"]
    assert json.loads(store.get(ck.key("rollout"))) == {"outcome": "completed"}
    store.put(ck.key("freeze"), b"\xff not json")  # a damaged checkpoint: the stage runs again
    assert ck.load("freeze") is None
    ck.clear()
    assert ck.finished() == [] and store.list("stages/") == []
    assert os.path.isdir(tmp_path / "lake")


def test_docker_environment_failure_while_evaluating_restores_the_frozen_state(
    tmp_path,
    monkeypatch,
    agent_runs,
    docker_client,  # noqa: F811
    python_image,  # noqa: F811
):
    """The same recovery on the Docker backend: the retry restores the frozen container state."""
    monkeypatch.setenv("DOCKER_HOST", docker_client.saasbench_base_url)
    spec = oracle_sweep_spec(tmp_path, "s-docker-evalfail", backend="docker")
    real_start_app = environment.start_app
    starts: list[str] = []

    def dying_start_app(task, env, **kw):
        starts.append(env.trial_id)
        if len(starts) == 1:
            raise environment.EnvError("the container died while the app was starting")
        return real_start_app(task, env, **kw)

    monkeypatch.setattr(environment, "start_app", dying_start_app)
    assert sw.run_sweep_plain(spec, sleep=lambda s: None) == {TRIAL: "completed"}
    assert len(agent_runs) == 1 and len(starts) == 2 and starts[0] != starts[1]
    statuses = node_statuses(spec.lake_uri, spec.sweep_id)
    assert statuses and all(s in ("PASSED", "SKIPPED_LLM") for s in statuses.values())


def test_the_sweep_budget_overrides_the_task_budget(tmp_path, monkeypatch):
    """A sweep spec sets the agents' budget; what it leaves out stays the task's timeouts."""
    from saasbench.catalog.tasks import load_task
    from saasbench.runs import trial as trial_mod

    budgets = []
    real = trial_mod.rollout_in

    def capture(env, task, agent, budget, **kw):
        budgets.append(budget)
        return real(env, task, agent, budget, **kw)

    monkeypatch.setattr(trial_mod, "rollout_in", capture)
    spec = oracle_sweep_spec(tmp_path, "s-budget", budget={"steps": 7, "wall_s": 600})
    assert sw.run_sweep_plain(spec) == {TRIAL: "completed"}
    timeouts = load_task("timetrack").spec.timeouts
    assert [(b.steps, b.wall_s, b.tool_call_s) for b in budgets] == [(7, 600, timeouts.tool_call_s)]
    with pytest.raises(ValueError, match="budget"):
        oracle_sweep_spec(tmp_path, "s-bad", budget={"steps": 0})
