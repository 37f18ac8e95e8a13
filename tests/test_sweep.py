"""Sweeps without Prefect: plan, resume, retry classification, SIGKILL resume (saasbench.runs.sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from saasbench import lake as lakelib
from saasbench.environments import base as environment_base
from saasbench.environments import local as environment
from saasbench.failures import (
    AgentError,
    AgentTimeout,
    EnvError,
    HarnessError,
    JudgeError,
    TaskDefect,
    is_retryable,
)
from saasbench.runs import sweep as sw
from saasbench.runs import trial as trial_mod

REPO = Path(__file__).resolve().parents[1]


def spec_for(tmp_path: Path, sweep_id: str = "s1", **kw) -> sw.SweepSpec:
    data = {
        "sweep_id": sweep_id,
        "tasks": ["timetrack"],
        "agents": ["oracle", "nop"],
        "lake": str(tmp_path / "lake"),
        "report_dir": str(tmp_path / "reports"),
        "retry_delays": [0],
    }
    data.update(kw)
    return sw.SweepSpec.model_validate(data)


@pytest.fixture
def count_runs(monkeypatch):
    calls: list[str] = []
    real = trial_mod.rollout_in

    def counting(env, task, agent, budget, **kw):
        calls.append(agent.name)
        return real(env, task, agent, budget, **kw)

    monkeypatch.setattr(trial_mod, "rollout_in", counting)
    return calls


def trial_rows(lake: str, sweep_id: str):
    return lakelib.query(
        lake, "SELECT trial_id, outcome, attempt FROM trials WHERE sweep_id = ? ORDER BY trial_id", [sweep_id]
    ).to_pylist()


def test_failure_taxonomy():
    assert is_retryable(EnvError("x")) and is_retryable(JudgeError("x"))
    for exc in (TaskDefect("x"), AgentError("x"), AgentTimeout("x")):
        assert not is_retryable(exc)
    assert not is_retryable(RuntimeError("x"))
    assert AgentTimeout("x").outcome == "agent_timeout" and isinstance(AgentTimeout("x"), HarnessError)
    assert EnvError.outcome == "env_error" and TaskDefect.outcome == "task_defect"


def test_plan_ids_and_yaml(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        textwrap.dedent("""\
        sweep_id: s-yaml
        tasks: [timetrack]
        agents: [oracle, llm]
        models: [null, openai/gpt-4o]
        attempts: 2
        concurrency: 3
    """)
    )
    spec = sw.SweepSpec.from_yaml(path)
    assert spec.backend == "local" and spec.concurrency == 3
    ids = [t.trial_id for t in sw.plan(spec)]
    assert len(ids) == 8 and len(set(ids)) == 8
    assert ids[:4] == [
        "timetrack.oracle.none.0",
        "timetrack.oracle.openai_gpt-4o.0",
        "timetrack.llm.none.0",
        "timetrack.llm.openai_gpt-4o.0",
    ]
    assert ids[-1] == "timetrack.llm.openai_gpt-4o.1"
    for i in ids:
        lakelib.check_id(i, "trial_id")
    assert sw.SweepSpec(sweep_id="x", tasks=["t"], agents=["a"]).models == [None]
    with pytest.raises(ValueError):
        sw.SweepSpec(sweep_id="bad id", tasks=["t"], agents=["a"])


def test_pending_after_partial_write(tmp_path, count_runs):
    spec = spec_for(tmp_path, "s-partial")
    assert [t.trial_id for t in sw.pending(spec)] == ["timetrack.oracle.none.0", "timetrack.nop.none.0"]
    assert sw.run_trial(sw.plan(spec)[0], spec) == "completed"
    assert [t.trial_id for t in sw.pending(spec)] == ["timetrack.nop.none.0"]


def test_sweep_writes_and_rerun_skips(tmp_path, count_runs):
    spec = spec_for(tmp_path, "s-two")
    outcomes = sw.run_sweep_plain(spec)
    assert outcomes == {"timetrack.oracle.none.0": "completed", "timetrack.nop.none.0": "completed"}
    assert sorted(count_runs) == ["nop", "oracle"]
    rows = trial_rows(spec.lake_uri, spec.sweep_id)
    assert [r["trial_id"] for r in rows] == ["timetrack.nop.none.0", "timetrack.oracle.none.0"]
    assert (
        lakelib.query(spec.lake_uri, "SELECT count(*) AS n FROM sweeps WHERE sweep_id = 's-two'").to_pylist()[0]["n"]
        == 1
    )
    # same sweep id again: nothing runs
    assert sw.run_sweep_plain(spec) == {}
    assert len(count_runs) == 2
    before = lakelib.query(spec.lake_uri, "SELECT * FROM node_results ORDER BY trial_id, node_id").to_pylist()
    agg = sw.aggregate(spec)
    assert "| oracle / - | 100.0 |" in agg["markdown"] and Path(agg["html"]).is_file()
    # a finished sweep is compacted: one batch marker, the same rows, still complete for resume
    markers = [m for m in lakelib.list_commits(spec.lake_uri, sweep_id=spec.sweep_id)]
    assert [m["unit"] for m in markers] == ["batch"]
    assert lakelib.query(spec.lake_uri, "SELECT * FROM node_results ORDER BY trial_id, node_id").to_pylist() == before
    assert sw.pending(spec) == [] and sw.run_sweep_plain(spec) == {}


def test_finished_sweeps_do_not_pile_up_batches(tmp_path, count_runs):
    spec = spec_for(tmp_path, "s-pile")
    for i in range(9):  # nine earlier sweeps, each compacted into its own batch
        lakelib.write_batch(
            spec.lake_uri, {"sweeps": [lakelib.sweep_row(f"old{i}", config={}, tasks=["t"], agents=["a"])]}
        )
    sw.run_sweep_plain(spec)
    sw.aggregate(spec)
    batches = [m for m in lakelib.list_commits(spec.lake_uri) if m["unit"] == "batch"]
    assert len(batches) == 2  # more than 8: all but the largest (this sweep's) merged into one
    assert lakelib.query(spec.lake_uri, "SELECT count(*) AS n FROM sweeps").to_pylist() == [{"n": 10}]
    assert sw.pending(spec) == []


def test_unfinished_sweep_is_not_compacted(tmp_path, count_runs):
    spec = spec_for(tmp_path, "s-half")
    sw.run_trial(sw.plan(spec)[0], spec)
    sw.aggregate(spec)
    assert "batch" not in {m["unit"] for m in lakelib.list_commits(spec.lake_uri, sweep_id=spec.sweep_id)}
    off = spec_for(tmp_path, "s-off", compact=False)
    sw.run_sweep_plain(off)
    sw.aggregate(off)
    assert "batch" not in {m["unit"] for m in lakelib.list_commits(off.lake_uri, sweep_id=off.sweep_id)}


def test_env_failure_is_retried(tmp_path, monkeypatch, count_runs):
    spec = spec_for(tmp_path, "s-env", agents=["oracle"])
    real_start = environment.LocalEnvironment.start
    failures = []

    def flaky_start(self):
        if not failures:
            failures.append(1)
            raise environment_base.EnvError("database would not start")
        return real_start(self)

    monkeypatch.setattr(environment.LocalEnvironment, "start", flaky_start)
    sleeps: list[float] = []
    assert sw.run_sweep_plain(spec, sleep=sleeps.append) == {"timetrack.oracle.none.0": "completed"}
    assert failures == [1] and sleeps == [0]
    assert count_runs == ["oracle"]  # the environment failed before the agent ran: one rollout
    # run_trial itself raises the classified, retryable error once the stage's retries are spent
    failures.clear()
    once = spec.model_copy(update={"retries": 0, "sweep_id": "s-env-once"})
    with pytest.raises(EnvError) as info:
        sw.run_trial(sw.plan(once)[0], once)
    # one EnvError (saasbench.failures): the environment's own error reaches the retry policy unchanged
    assert (
        info.value.retryable and environment_base.EnvError is EnvError and "database would not start" in str(info.value)
    )


def test_env_failure_exhausted_is_recorded(tmp_path, monkeypatch):
    spec = spec_for(tmp_path, "s-envx", agents=["nop"], retries=1)

    def broken(self):
        raise environment_base.EnvError("no disk")

    monkeypatch.setattr(environment.LocalEnvironment, "start", broken)
    assert sw.run_sweep_plain(spec, sleep=lambda s: None) == {"timetrack.nop.none.0": "env_error"}
    rows = trial_rows(spec.lake_uri, spec.sweep_id)
    assert rows == [{"trial_id": "timetrack.nop.none.0", "outcome": "env_error", "attempt": 0}]


def test_agent_error_not_retried(tmp_path, monkeypatch):
    spec = spec_for(tmp_path, "s-agent", agents=["oracle"])
    calls = []

    def crash(env, task, agent, budget, **kw):
        calls.append(agent.name)
        raise AgentError("agent crashed")

    monkeypatch.setattr(trial_mod, "rollout_in", crash)
    assert sw.run_sweep_plain(spec, sleep=lambda s: pytest.fail("no retry expected")) == {
        "timetrack.oracle.none.0": "agent_error"
    }
    assert calls == ["oracle"]
    assert trial_rows(spec.lake_uri, spec.sweep_id)[0]["outcome"] == "agent_error"


def test_task_defect_not_retried(tmp_path):
    spec = spec_for(tmp_path, "s-defect", tasks=["no-such-task"], agents=["oracle"])
    assert sw.run_sweep_plain(spec, sleep=lambda s: pytest.fail("no retry expected")) == {
        "no-such-task.oracle.none.0": "task_defect"
    }


def test_sigkill_resume(tmp_path):
    spec = spec_for(tmp_path, "s-kill")
    script = textwrap.dedent(f"""
        from saasbench.runs import sweep
        sweep.run_sweep_plain(sweep.SweepSpec.model_validate({spec.model_dump()!r}), 1)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=str(REPO),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = lakelib.lake_from_uri(spec.lake_uri)
    deadline = time.monotonic() + 120
    try:
        while not lakelib.committed_trials(store, spec.sweep_id):
            assert proc.poll() is None, "sweep subprocess ended before committing a trial"
            assert time.monotonic() < deadline, "no trial committed within 120 s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done_before = lakelib.committed_trials(store, spec.sweep_id)
    assert done_before == {"timetrack.oracle.none.0"}

    rerun = sw.run_sweep_plain(spec)
    assert set(rerun) == {"timetrack.nop.none.0"}
    planned = {t.trial_id for t in sw.plan(spec)}
    assert lakelib.committed_trials(store, spec.sweep_id) == planned
    from saasbench.catalog.tasks import load_task
    from saasbench.dag import load_dag

    nodes = len(load_dag(load_task("timetrack").dag_path).dag.nodes)
    counts = lakelib.query(
        store,
        "SELECT (SELECT count(*) FROM trials WHERE sweep_id = ?) AS trials, "
        "(SELECT count(*) FROM node_results WHERE sweep_id = ?) AS nodes, "
        "(SELECT count(DISTINCT (trial_id, node_id)) FROM node_results WHERE sweep_id = ?) AS uniq",
        [spec.sweep_id] * 3,
    ).to_pylist()[0]
    assert counts == {"trials": 2, "nodes": nodes * 2, "uniq": nodes * 2}


def test_sweep_cmd_no_prefect(tmp_path, count_runs):
    import typer
    from typer.testing import CliRunner

    from saasbench.cli.sweep import sweep_cmd

    app = typer.Typer()
    app.command("sweep")(sweep_cmd)
    app.command("noop")(lambda: None)  # two commands: typer keeps the sub-command name
    spec = tmp_path / "s.yaml"
    spec.write_text(f"sweep_id: cli-s\ntasks: [timetrack]\nagents: [nop]\nreport_dir: {tmp_path / 'rep'}\n")
    args = ["sweep", str(spec), "--lake", str(tmp_path / "lake"), "--no-prefect"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "ran 1 trial(s) now" in res.output and "| nop / - |" in res.output
    res = CliRunner().invoke(app, args + ["--agent", "oracle"])  # --agent replaces the YAML's agents
    assert res.exit_code == 0, res.output
    assert "ran 1 trial(s) now (0 already committed)" in res.output and count_runs == ["nop", "oracle"]
    res = CliRunner().invoke(
        app, ["sweep", "--task", "timetrack", "--agent", "nop", "--sweep-id", "bad id", "--no-prefect"]
    )
    assert res.exit_code == 2 and "invalid sweep spec" in res.output


def _judge(llm, **kw):
    return {
        "model": "openai/fake",
        "api_base": llm.base_url,
        "retries": 2,
        "backoff_base_s": 0.01,
        "backoff_cap_s": 0.02,
        **kw,
    }


def test_sweep_judges_llm_nodes(tmp_path):
    """The sweep's judge scores the demo task's llm-judge nodes; its calls land in judge_calls."""
    from fake_llm import FakeLLM, Reply

    with FakeLLM(default=Reply.json({"score": 4, "reasoning": "fine"})) as llm:
        spec = spec_for(tmp_path, "s-judge", agents=["oracle"], judge=_judge(llm))
        assert sw.run_sweep_plain(spec) == {"timetrack.oracle.none.0": "completed"}
        asked = len(llm.chat_requests)
    nodes = lakelib.query(
        spec.lake_uri,
        "SELECT status, score, max_score FROM node_results WHERE method = 'llm-judge'",
        sweep_id="s-judge",
    ).to_pylist()
    assert nodes and all(n["status"] == "PASSED" and 0 < n["score"] <= n["max_score"] for n in nodes)
    calls = lakelib.query(spec.lake_uri, "SELECT count(*) AS n FROM judge_calls", sweep_id="s-judge").to_pylist()
    assert calls == [{"n": len(nodes)}] and asked == len(nodes)


def test_judge_500s_are_retried_then_the_trial_is_a_judge_error(tmp_path, count_runs):
    """A judge answering 500 is retried by the judge (2 retries here, 5 by default), then by the judge
    stage (the sweep's retries); still down, the trial is recorded as judge_error with its node rows
    (llm-judge nodes SKIPPED_LLM) and the agent ran once: a rerun would resample the agent."""
    from fake_llm import FakeLLM, Reply

    sleeps: list[float] = []
    with FakeLLM(default=Reply.error(500)) as llm:
        spec = spec_for(tmp_path, "s-judge500", agents=["oracle"], judge=_judge(llm))
        assert sw.run_sweep_plain(spec, sleep=sleeps.append) == {"timetrack.oracle.none.0": "judge_error"}
        asked = len(llm.chat_requests)
    assert count_runs == ["oracle"] and sleeps == [0, 0]  # the judge stage's two retries
    (trial,) = lakelib.query(
        spec.lake_uri, "SELECT outcome, outcome_detail, valid FROM trials", sweep_id="s-judge500"
    ).to_pylist()
    assert trial["outcome"] == "judge_error" and not trial["valid"] and "500" in trial["outcome_detail"]
    statuses = lakelib.query(
        spec.lake_uri, "SELECT DISTINCT status FROM node_results WHERE method = 'llm-judge'", sweep_id="s-judge500"
    ).to_pylist()
    assert statuses == [{"status": "SKIPPED_LLM"}]
    n_judge_nodes = lakelib.query(
        spec.lake_uri, "SELECT count(*) AS n FROM node_results WHERE method = 'llm-judge'", sweep_id="s-judge500"
    ).to_pylist()[0]["n"]
    # each node: 3 tries per judging; deferred nodes are judged again by each retry of the judge stage
    assert 3 * n_judge_nodes <= asked <= 3 * 3 * n_judge_nodes
    det = lakelib.query(spec.lake_uri, "SELECT deterministic_score FROM trials", sweep_id="s-judge500").to_pylist()
    assert det == [{"deterministic_score": 100.0}]  # the deterministic nodes still scored


def test_judge_model_shorthand():
    spec = sw.SweepSpec(sweep_id="j", tasks=["t"], agents=["a"], judge_model="openai/x")
    assert spec.judge is not None and spec.judge.model == "openai/x" and spec.judge.retries == 5
    with pytest.raises(ValueError, match="differ"):
        sw.SweepSpec(sweep_id="j", tasks=["t"], agents=["a"], judge_model="openai/x", judge={"model": "openai/y"})
