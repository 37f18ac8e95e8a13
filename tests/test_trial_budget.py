"""The budget a trial ran under is recorded with it (issue #19): the lake's ``trials`` row has
``budget_steps``, ``budget_wall_s`` and ``budget_tool_call_s`` (the sweep spec's ``budget:`` where it
sets them, else the task's timeouts), for scored trials and for trials that failed; lakes written
before these columns existed still read (NULL)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from saasbench import lake as lakelib
from saasbench.agents.base import Budget
from saasbench.lake import schema as S
from saasbench.runs import sweep as sw


def _budgets(spec: sw.SweepSpec) -> dict[str, dict]:
    rows = lakelib.query(
        spec.lake_uri,
        "SELECT agent, outcome, budget_steps, budget_wall_s, budget_tool_call_s FROM trials",
        sweep_id=spec.sweep_id,
    ).to_pylist()
    return {r.pop("agent"): r for r in rows}


@pytest.mark.slow
def test_a_sweeps_budget_is_recorded_with_each_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nop completes and claude-code cannot be installed (a fake npm that exits 1): both rows carry the
    budget the spec set (steps, wall_s) and the task's own tool_call_s (the spec leaves it out)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text("#!/bin/sh\necho 'npm ERR! offline' >&2\nexit 1\n")
    (bin_dir / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    base = {"tasks": ["timetrack"], "lake": str(tmp_path / "lake"), "report_dir": str(tmp_path / "r")}
    spec = sw.SweepSpec.model_validate(
        {
            **base,
            "sweep_id": "s-budget",
            "agents": ["nop", "claude-code"],
            "budget": {"steps": 7, "wall_s": 321.5},
            "retries": 0,
        }
    )
    assert sw.run_sweep_plain(spec) == {
        "timetrack.nop.none.0": "completed",
        "timetrack.claude-code.none.0": "env_error",
    }
    task_tool_call_s = Budget().tool_call_s  # timetrack's task.yaml leaves tool_call_s at the default (900)
    want = {"budget_steps": 7, "budget_wall_s": 321.5, "budget_tool_call_s": task_tool_call_s}
    assert _budgets(spec) == {"nop": {"outcome": "completed", **want}, "claude-code": {"outcome": "env_error", **want}}
    # without a spec budget: the task's timeouts (agent_s 10800 in timetrack's task.yaml)
    plain = sw.SweepSpec.model_validate({**base, "sweep_id": "s-nobudget", "agents": ["nop"]})
    assert sw.run_sweep_plain(plain) == {"timetrack.nop.none.0": "completed"}
    assert _budgets(plain)["nop"] == {
        "outcome": "completed",
        "budget_steps": Budget().steps,
        "budget_wall_s": 10800.0,
        "budget_tool_call_s": task_tool_call_s,
    }


def test_budget_columns_and_a_lake_written_before_them(tmp_path: Path) -> None:
    """trial_rows records a Budget or a mapping; a trials file of schema version 1 (no budget columns)
    reads beside a current one with NULL budgets."""
    import pyarrow.parquet as pq

    store = lakelib.lake_from_uri(str(tmp_path / "lake"))
    for trial, budget in (("old", Budget(steps=3)), ("new", {"steps": 5, "wall_s": 60.0, "tool_call_s": 9.5})):
        info = lakelib.TrialInfo(sweep_id="s", trial_id=trial, task_id="t", agent="nop", budget=budget)
        lakelib.write_trial(store, lakelib.trial_rows(info))
    key = "_commits/sweep_id=s/trial_id=old.json"
    marker = json.loads(store.get(key))
    f = next(f for f in marker["files"] if f["table"] == "trials")
    old = pq.read_table(io.BytesIO(store.get(f["key"]))).drop(["budget_steps", "budget_wall_s", "budget_tool_call_s"])
    buf = io.BytesIO()
    pq.write_table(old, buf)
    store.put(f["key"], buf.getvalue())
    marker["schema_version"] = 1  # the lake before the budget columns
    store.put(key, json.dumps(marker).encode())
    assert S.SCHEMA_VERSION >= 2
    rows = {
        r.pop("trial_id"): r
        for r in lakelib.query(
            store, "SELECT trial_id, agent, budget_steps, budget_wall_s, budget_tool_call_s FROM trials"
        ).to_pylist()
    }
    assert rows == {
        "old": {"agent": "nop", "budget_steps": None, "budget_wall_s": None, "budget_tool_call_s": None},
        "new": {"agent": "nop", "budget_steps": 5, "budget_wall_s": 60.0, "budget_tool_call_s": 9.5},
    }
