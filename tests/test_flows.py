"""Prefect flows (saasbench.flows) on a temporary Prefect server (prefect_test_harness)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="saasbench-prefect-test-"))

import pytest

prefect = pytest.importorskip("prefect")

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.testing.utilities import prefect_test_harness
from saasbench.flows.aggregate import artifact_key
from saasbench.flows.sweep import sweep_flow
from saasbench.flows.trial import trial_flow

from saasbench import environment
from saasbench import lake as lakelib
from saasbench import sweep as sw
from saasbench.failures import AgentError


@pytest.fixture(autouse=True, scope="module")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=90):
        yield


def sweep_dict(tmp_path, sweep_id, **kw):
    data = {"sweep_id": sweep_id, "tasks": ["timetrack"], "agents": ["oracle", "nop"], "lake": str(tmp_path / "lake"),
            "report_dir": str(tmp_path / "reports"), "retry_delays": [0], "concurrency": 2}
    data.update(kw)
    return data


def artifacts(key: str):
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_sweep_flow_writes_lake_and_artifacts(tmp_path):
    spec = sweep_dict(tmp_path, "flow-s1")
    res = sweep_flow(spec)
    assert res["outcomes"] == {"timetrack.oracle.none.0": "completed", "timetrack.nop.none.0": "completed"}
    lake = str(tmp_path / "lake")
    assert lakelib.committed_trials(lake, "flow-s1") == {"timetrack.oracle.none.0", "timetrack.nop.none.0"}
    md = artifacts(artifact_key("flow-s1", "leaderboard"))
    assert md and md[0].type == "markdown"
    assert "| agent/model | Pass@1 | deterministic | valid/all trials |" in md[0].data
    assert "| oracle / - | 100.0 | 100.0 | 1/1 |" in md[0].data
    link = artifacts(artifact_key("flow-s1", "report"))
    assert link and "flow-s1.html" in link[0].data  # Prefect stores link artifacts as markdown links
    assert (tmp_path / "reports" / "flow-s1.html").is_file()
    # resume: the same sweep id runs nothing
    assert sweep_flow(spec)["outcomes"] == {}


def test_trial_flow_retries_env_error(tmp_path, monkeypatch):
    real_start = environment.LocalEnvironment.start
    calls = []

    def flaky_start(self):
        calls.append(1)
        if len(calls) == 1:
            raise environment.EnvError("database would not start")
        return real_start(self)

    monkeypatch.setattr(environment.LocalEnvironment, "start", flaky_start)
    spec = sweep_dict(tmp_path, "flow-env", agents=["oracle"])
    assert trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0]) == "completed"
    assert len(calls) == 2
    assert lakelib.committed_trials(spec["lake"], "flow-env") == {"timetrack.oracle.none.0"}


def test_trial_flow_env_error_exhausted(tmp_path, monkeypatch):
    calls = []

    def broken(self):
        calls.append(1)
        raise environment.EnvError("no disk")

    monkeypatch.setattr(environment.LocalEnvironment, "start", broken)
    spec = sweep_dict(tmp_path, "flow-envx", agents=["nop"])
    assert trial_flow(task="timetrack", agent="nop", sweep=spec, retries=2, retry_delays=[0]) == "env_error"
    assert len(calls) == 3
    rows = lakelib.query(spec["lake"], "SELECT outcome, valid FROM trials").to_pylist()
    assert rows == [{"outcome": "env_error", "valid": False}]


def test_trial_flow_agent_error_not_retried(tmp_path, monkeypatch):
    calls = []

    def crash(task, agent, **kw):
        calls.append(agent)
        raise AgentError("agent crashed")

    monkeypatch.setattr(sw, "run_local_trial", crash)
    spec = sweep_dict(tmp_path, "flow-agent", agents=["oracle"])
    assert trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0]) == "agent_error"
    assert calls == ["oracle"]


def test_trial_flow_harness_bug_not_retried(tmp_path, monkeypatch):
    calls = []

    def bug(task, agent, **kw):
        calls.append(agent)
        raise KeyError("harness bug")

    monkeypatch.setattr(sw, "run_local_trial", bug)
    spec = sweep_dict(tmp_path, "flow-bug", agents=["oracle"])
    with pytest.raises(KeyError):
        trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0])
    assert calls == ["oracle"]
    assert lakelib.committed_trials(spec["lake"], "flow-bug") == set()
