"""``saasbench run`` with the builtin agent against the fake LLM: trajectories, tokens and costs reach the lake;
a cheating trial through the sweep core is recorded as voided_cheat with its evidence."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="saasbench-prefect-test-"))

import pytest
from fake_llm import FakeLLM, Reply
from prefect.testing.utilities import prefect_test_harness

from saasbench import lake as lakelib
from saasbench.agents.builtin import ENV_API_BASE, ENV_BACKOFF_BASE, ENV_BACKOFF_CAP
from saasbench.agents.oracle import OracleAgent
from saasbench.cli.sweep import run_cmd
from saasbench.runs import sweep as sw

REF = Path(__file__).resolve().parents[1] / "tasks" / "timetrack" / "reference"
MODEL = "openai/gpt-4o-mini"  # served by the fake server; litellm's offline price list knows it, so cost > 0


def call(name: str, args: dict, call_id: str) -> Reply:
    return Reply.with_message(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }
    )


def reference_turns() -> list[Reply]:
    files = sorted(p for p in REF.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    turns = [call("shell", {"command": "ls -la && head -3 task.md"}, "c0")]
    turns += [
        call("write_file", {"path": p.relative_to(REF).as_posix(), "content": p.read_text(encoding="utf-8")}, f"w{i}")
        for i, p in enumerate(files)
    ]
    return turns + [call("finish", {"summary": "TimeTrack implemented"}, "fin")]


@pytest.fixture(scope="module")
def prefect_server():
    """One temporary Prefect server for the module (a second harness in one process recursed in
    Prefect's logging)."""
    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture
def llm(monkeypatch):
    with FakeLLM() as server:
        monkeypatch.setenv(ENV_API_BASE, server.base_url)
        monkeypatch.setenv(ENV_BACKOFF_BASE, "0.001")
        monkeypatch.setenv(ENV_BACKOFF_CAP, "0.01")
        yield server


def test_saasbench_run_builtin_records_trajectory_tokens_and_cost(tmp_path, llm, capsys, prefect_server) -> None:
    """``saasbench run --task timetrack --agent builtin --model M`` (the typer function, called directly)."""
    from saasbench.catalog.tasks import load_task
    from saasbench.dag import load_dag

    turns = reference_turns()
    llm.queue(*turns)
    lake = str(tmp_path / "lake")
    run_cmd(task="timetrack", agent="builtin", model=MODEL, backend="local", lake=lake, sweep_id="run-lake", attempt=0)
    assert "timetrack/builtin: completed (sweep run-lake" in capsys.readouterr().out
    assert len(llm.chat_requests) == len(turns) and llm.chat_requests[0].body["model"] == "gpt-4o-mini"
    [t] = lakelib.query(lake, "SELECT * FROM trials WHERE sweep_id = 'run-lake'").to_pylist()
    assert t["trial_id"] == "timetrack.builtin.openai_gpt-4o-mini.0" and t["model"] == MODEL
    assert t["outcome"] == "completed" and t["exit_reason"] == "completed" and t["app_ok"]
    assert t["steps"] == len(turns) and t["tokens_in"] > 0 and t["tokens_out"] > 0 and t["cost_usd"] > 0
    dag_nodes = len(load_dag(load_task("timetrack").dag_path).dag.nodes)
    assert t["deterministic_score"] > 50 and t["total_nodes"] == dag_nodes
    ev = lakelib.query(
        lake,
        "SELECT kind, tool, tokens_in, tokens_out, data_json FROM trajectory_events "
        "WHERE sweep_id = 'run-lake' ORDER BY seq",
    ).to_pylist()
    calls = [e for e in ev if e["kind"] == "model_call"]
    assert len(calls) == len(turns)
    assert (
        sum(e["tokens_in"] for e in calls) == t["tokens_in"] and sum(e["tokens_out"] for e in calls) == t["tokens_out"]
    )
    # the trajectory total is rounded to 6 decimals per call (agents/builtin.py)
    assert sum(json.loads(e["data_json"])["cost_usd"] for e in calls) == pytest.approx(
        t["cost_usd"], abs=1e-6 * len(calls)
    )
    assert [e["tool"] for e in ev if e["kind"] == "tool_call"] == ["shell"] + ["write_file"] * (len(turns) - 2) + [
        "finish"
    ]
    assert not [e for e in ev if e["kind"] == "anticheat"]
    n = lakelib.query(lake, "SELECT count(*) AS n FROM node_results WHERE sweep_id = 'run-lake'").to_pylist()[0]["n"]
    assert n == dag_nodes


class CloningOracle(OracleAgent):
    """Installs the reference (a perfect app), but its trajectory shows a clone of another project."""

    name = "cloning-oracle"

    def run(self, prompt, env, budget):
        traj = super().run(prompt, env, budget)
        traj.event(
            "tool_call", "", tool="shell", args={"command": "git clone https://github.com/acme/timetrack-pro /tmp/x"}
        )
        return traj


def test_voided_trial_in_the_lake_has_outcome_evidence_and_scores_zero(tmp_path) -> None:
    from saasbench.reports.aggregate import sweep_report

    spec = sw.SweepSpec(
        sweep_id="cheat",
        tasks=["timetrack"],
        agents=["test_run_lake:CloningOracle", "oracle"],
        lake=str(tmp_path / "lake"),
        retry_delays=[0],
    )
    outcomes = sw.run_sweep_plain(spec, sleep=lambda s: None)
    assert sorted(outcomes.values()) == ["completed", "voided_cheat"]
    lake = spec.lake_uri
    rows = {
        r["agent"]: r
        for r in lakelib.query(
            lake, "SELECT agent, outcome, outcome_detail, deterministic_score, valid FROM trials"
        ).to_pylist()
    }
    assert rows["oracle"]["outcome"] == "completed" and rows["oracle"]["outcome_detail"] is None
    bad = rows["cloning-oracle"]
    assert bad["outcome"] == "voided_cheat" and bad["valid"]
    assert "git_clone" in bad["outcome_detail"] and "github.com/acme/timetrack-pro" in bad["outcome_detail"]
    assert bad["deterministic_score"] == 100.0  # the evaluation ran; the aggregation zeroes it
    ac = lakelib.query(lake, "SELECT content, data_json FROM trajectory_events WHERE kind = 'anticheat'").to_pylist()
    assert len(ac) == 1 and json.loads(ac[0]["data_json"])["severity"] == "void"
    report = sweep_report(lake, "cheat")
    scores = {c.label: c.all.pass_at_1 for c in report.configs}
    assert sorted(scores.values()) == [0.0, 100.0]


def test_saasbench_sweep_with_a_judge(tmp_path, capsys, monkeypatch) -> None:
    """``saasbench sweep --judge-model M --judge-api-base URL`` (the typer function, --no-prefect):
    llm-judge nodes are scored by the judge (not SKIPPED_LLM) and every vote is a judge_calls row."""
    from saasbench.cli.sweep import sweep_cmd

    lake = str(tmp_path / "lake")
    monkeypatch.chdir(tmp_path)  # the HTML report goes to runs/reports under the working folder
    with FakeLLM(default=Reply.json({"score": 5, "reasoning": "clean"})) as judge:
        sweep_cmd(
            task=["timetrack"],
            agent=["oracle"],
            sweep_id="sweep-judge",
            lake=lake,
            no_prefect=True,
            judge_model="openai/fake",
            judge_api_base=judge.base_url,
        )
        asked = len(judge.chat_requests)
    assert "| oracle / - | 100.0 | 100.0 | 1/1 |" in capsys.readouterr().out
    nodes = lakelib.query(lake, "SELECT status FROM node_results WHERE method = 'llm-judge'").to_pylist()
    assert nodes and {n["status"] for n in nodes} == {"PASSED"}
    calls = lakelib.query(lake, "SELECT judge_model, score FROM judge_calls").to_pylist()
    assert len(calls) == len(nodes) == asked and {c["judge_model"] for c in calls} == {"openai/fake"}
