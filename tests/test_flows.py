"""Prefect flows (saasbench.flows) on a temporary Prefect server (prefect_test_harness)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="saasbench-prefect-test-"))

import prefect  # noqa: F401 - a hard dependency of these tests (the test extra installs it)
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.testing.utilities import prefect_test_harness

from saasbench import lake as lakelib
from saasbench.environments import base as environment_base
from saasbench.environments import local as environment
from saasbench.failures import AgentError
from saasbench.flows.aggregate import artifact_key
from saasbench.flows.sweep import sweep_flow
from saasbench.flows.trial import trial_flow
from saasbench.runs import sweep as sw
from saasbench.runs import trial as trial_mod


@pytest.fixture(autouse=True, scope="module")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=90):
        yield


def sweep_dict(tmp_path, sweep_id, **kw):
    data = {
        "sweep_id": sweep_id,
        "tasks": ["timetrack"],
        "agents": ["oracle", "nop"],
        "lake": str(tmp_path / "lake"),
        "report_dir": str(tmp_path / "reports"),
        "retry_delays": [0],
        "concurrency": 2,
    }
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
            raise environment_base.EnvError("database would not start")
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
        raise environment_base.EnvError("no disk")

    monkeypatch.setattr(environment.LocalEnvironment, "start", broken)
    spec = sweep_dict(tmp_path, "flow-envx", agents=["nop"])
    assert trial_flow(task="timetrack", agent="nop", sweep=spec, retries=2, retry_delays=[0]) == "env_error"
    assert len(calls) == 3
    rows = lakelib.query(spec["lake"], "SELECT outcome, valid FROM trials").to_pylist()
    assert rows == [{"outcome": "env_error", "valid": False}]


def test_trial_flow_agent_error_not_retried(tmp_path, monkeypatch):
    calls = []

    def crash(env, task, agent, budget, **kw):
        calls.append(agent.name)
        raise AgentError("agent crashed")

    monkeypatch.setattr(trial_mod, "rollout_in", crash)
    spec = sweep_dict(tmp_path, "flow-agent", agents=["oracle"])
    assert trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0]) == "agent_error"
    assert calls == ["oracle"]


def test_trial_flow_harness_bug_not_retried(tmp_path, monkeypatch):
    calls = []

    def bug(env, task, agent, budget, **kw):
        calls.append(agent.name)
        raise KeyError("harness bug")

    monkeypatch.setattr(trial_mod, "rollout_in", bug)
    spec = sweep_dict(tmp_path, "flow-bug", agents=["oracle"])
    with pytest.raises(KeyError):
        trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0])
    assert calls == ["oracle"]
    assert lakelib.committed_trials(spec["lake"], "flow-bug") == set()


class FakeDeployments:
    """Stand-in for run_deployment + the child runs' states (dispatch="deployment" without workers).

    ``script[agent]`` lists what each dispatch of that agent's trial does: "crash" (no commit),
    "commit-crash" (commits, then the process dies) or "ok" (commits); "fail" is a harness error."""

    def __init__(self, spec: dict, script: dict[str, list[str]]):
        from prefect.states import Completed, Crashed, Failed

        self.spec = sw.SweepSpec.model_validate(spec)
        self.script = {k: list(v) for k, v in script.items()}
        self.calls: list[dict] = []
        self.states: dict = {}
        self.kinds = {"crash": Crashed, "commit-crash": Crashed, "ok": Completed, "fail": Failed}

    def run_deployment(
        self, name, parameters=None, scheduled_time=None, timeout=None, tags=None, idempotency_key=None, **kw
    ):
        import uuid

        assert name == "trial/trial" and timeout == 0
        assert sw.SweepSpec.model_validate(parameters["sweep"]) == self.spec
        trial = sw.TrialSpec(parameters["task"], parameters["agent"], parameters["model"], parameters["attempt"])
        what = self.script[trial.agent].pop(0)
        self.calls.append({"agent": trial.agent, "key": idempotency_key, "when": scheduled_time, "what": what})
        if what in ("ok", "commit-crash"):
            sw.record_failure(trial, self.spec, AgentError(f"fake child {what}"))  # a committed trial row
        run_id = uuid.uuid4()
        self.states[run_id] = self.kinds[what](message=f"fake {what}")
        return type("Run", (), {"id": run_id, "name": f"fake-{trial.trial_id}"})()

    def read_state(self, client, run_id):
        return self.states[run_id]


def test_deployment_dispatch_crash_retry_and_record(tmp_path, monkeypatch):
    import prefect.deployments

    from saasbench.flows import sweep as sweep_flows

    spec = sweep_dict(tmp_path, "flow-dispatch", agents=["oracle", "nop", "codex"], retries=1)
    fake = FakeDeployments(spec, {"oracle": ["crash", "ok"], "nop": ["crash", "crash"], "codex": ["commit-crash"]})
    monkeypatch.setattr(prefect.deployments, "run_deployment", fake.run_deployment)
    monkeypatch.setattr(sweep_flows, "_read_state", fake.read_state)
    res = sweep_flow(spec, dispatch="deployment", poll_seconds=0.05)
    assert res["outcomes"] == {
        "timetrack.oracle.none.0": "agent_error",  # crashed once, the re-dispatch committed
        "timetrack.nop.none.0": "env_error",  # crashed twice (retries=1): recorded as an infra failure
        "timetrack.codex.none.0": "agent_error",  # crashed after its commit: not dispatched again
    }
    assert [c["agent"] for c in fake.calls].count("oracle") == 2 and [c["agent"] for c in fake.calls].count("nop") == 2
    assert [c["agent"] for c in fake.calls].count("codex") == 1
    assert len({c["key"] for c in fake.calls}) == len(fake.calls)  # a re-dispatch is a new flow run
    assert all((c["when"] is None) == c["key"].endswith(":0") for c in fake.calls)  # re-dispatches are scheduled
    rows = lakelib.query(spec["lake"], "SELECT trial_id, outcome, valid FROM trials ORDER BY 1").to_pylist()
    assert [(r["trial_id"], r["outcome"]) for r in rows] == [
        ("timetrack.codex.none.0", "agent_error"),
        ("timetrack.nop.none.0", "env_error"),
        ("timetrack.oracle.none.0", "agent_error"),
    ]
    assert artifacts(artifact_key("flow-dispatch", "leaderboard"))


def test_deployment_dispatch_failed_child_fails_the_sweep(tmp_path, monkeypatch):
    import prefect.deployments

    from saasbench.flows import sweep as sweep_flows

    spec = sweep_dict(tmp_path, "flow-dispatch-bug", agents=["oracle", "nop"], concurrency=1)
    fake = FakeDeployments(spec, {"oracle": ["fail"], "nop": ["ok"]})
    monkeypatch.setattr(prefect.deployments, "run_deployment", fake.run_deployment)
    monkeypatch.setattr(sweep_flows, "_read_state", fake.read_state)
    with pytest.raises(RuntimeError, match="harness errors"):
        sweep_flow(spec, dispatch="deployment", poll_seconds=0.05)
    assert [c["agent"] for c in fake.calls] == ["oracle"]  # dispatching stopped after the failure
    assert lakelib.committed_trials(spec["lake"], "flow-dispatch-bug") == set()  # both stay pending


class _FakeGateway:
    """Stands in for saasbench.runs.gateway.Gateway (a real one is tested in test_gateway.py): counts
    starts and the trials that got a key from it."""

    started: list["_FakeGateway"] = []

    def __init__(self, cfg):
        self.trials: list[str] = []

    def __enter__(self):
        _FakeGateway.started.append(self)
        return self

    def __exit__(self, *exc):
        return False

    def for_trial(self, trial_id):
        self.trials.append(trial_id)
        return type("Access", (), {"calls": staticmethod(lambda: [])})()

    def attach(self, agent, access):
        return agent


def test_sweep_flow_shares_one_gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(sw, "Gateway", _FakeGateway)
    _FakeGateway.started.clear()
    gateway = {"models": [{"name": "m", "litellm_model": "openai/m", "api_base": "http://127.0.0.1:9/v1"}]}
    res = sweep_flow(sweep_dict(tmp_path, "flow-gw", gateway=gateway))
    assert set(res["outcomes"].values()) == {"completed"}
    assert len(_FakeGateway.started) == 1  # one proxy for the sweep, not one per trial
    assert sorted(_FakeGateway.started[0].trials) == ["timetrack.nop.none.0", "timetrack.oracle.none.0"]
    assert sw._SHARED_GATEWAYS == {}  # stopped and forgotten with the sweep


def test_trial_flow_runs_each_stage_as_a_named_task_and_retries_only_the_failed_stage(tmp_path, monkeypatch):
    """Every stage is its own Prefect task run named task/agent/model#attempt · stage; an environment
    failure while evaluating retries the evaluate task (restored from the frozen state), not the rollout."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from saasbench.environments import base as env_base

    real_start_app = env_base.start_app
    starts: list[int] = []

    def dying_start_app(task, env, **kw):
        starts.append(1)
        if len(starts) == 1:
            raise env_base.EnvError("the environment died while the app was starting")
        return real_start_app(task, env, **kw)

    runs: list[str] = []
    real_rollout = trial_mod.rollout_in

    def counting(env, task, agent, budget, **kw):
        runs.append(agent.name)
        return real_rollout(env, task, agent, budget, **kw)

    monkeypatch.setattr(env_base, "start_app", dying_start_app)
    monkeypatch.setattr(trial_mod, "rollout_in", counting)
    spec = sweep_dict(tmp_path, "flow-stages", agents=["oracle"])
    state = trial_flow(task="timetrack", agent="oracle", sweep=spec, retry_delays=[0], return_state=True)
    assert state.result() == "completed" and runs == ["oracle"] and len(starts) == 2
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    by_name = {t.name: t for t in task_runs}
    stages_run = [n.split(" · ")[1] for n in by_name if " · " in n]
    assert sorted(stages_run) == sorted(["build_env", "provision", "rollout", "freeze", "evaluate", "judge", "commit"])
    assert all(n.startswith("timetrack/oracle/none#0 · ") for n in by_name if " · " in n)
    assert by_name["timetrack/oracle/none#0 · evaluate"].run_count == 2  # retried: one failure, one success
    assert by_name["timetrack/oracle/none#0 · rollout"].run_count == 1


def test_trial_flow_reruns_a_rollout_the_model_upstream_broke(tmp_path, monkeypatch):
    """The Prefect path of a model outage: the built-in agent's model answers 503 through the agent's own
    retries (its first six answers), so the rollout ends model_error; Prefect retries the rollout task, which
    provisions a fresh environment and runs the agent again; the model is back and the trial completes."""
    from fake_llm import FakeLLM, Reply
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    finish = {"id": "f", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "done"}'}}
    answers = {"n": 0}

    def respond(request):
        answers["n"] += 1
        if answers["n"] <= 6:  # the first call and the agent's five retries
            return Reply.error(503, "overloaded")
        return Reply.with_message(
            {"role": "assistant", "content": "", "tool_calls": [finish]}, finish_reason="tool_calls"
        )

    workspaces: list[str] = []
    real_rollout = trial_mod.rollout_in

    def counting(env, task, agent, budget, **kw):
        workspaces.append(env.workspace_path)
        return real_rollout(env, task, agent, budget, **kw)

    monkeypatch.setattr(trial_mod, "rollout_in", counting)
    monkeypatch.setenv("SAASBENCH_AGENT_BACKOFF_BASE_S", "0.01")
    monkeypatch.setenv("SAASBENCH_AGENT_BACKOFF_CAP_S", "0.02")
    with FakeLLM(responder=respond) as llm:
        monkeypatch.setenv("SAASBENCH_AGENT_API_BASE", llm.base_url)
        spec = sweep_dict(tmp_path, "flow-model", agents=["builtin"], models=["openai/fake"])
        state = trial_flow(
            task="timetrack", agent="builtin", model="openai/fake", sweep=spec, retry_delays=[0], return_state=True
        )
    assert state.result() == "completed" and answers["n"] == 7
    assert len(workspaces) == 2 and workspaces[0] != workspaces[1]  # a fresh environment for the second rollout
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    by_name = {t.name: t for t in task_runs}
    assert by_name["timetrack/builtin/openai/fake#0 · rollout"].run_count == 2
    rows = lakelib.query(spec["lake"], "SELECT outcome, valid FROM trials").to_pylist()
    assert rows == [{"outcome": "completed", "valid": True}]
    events = lakelib.query(spec["lake"], "SELECT content FROM trajectory_events WHERE kind = 'model_error'").to_pylist()
    assert len(events) == 1 and "model upstream failed after 6 attempt(s)" in events[0]["content"]


# --- configuration belongs to the worker (issue #18 item 3) ------------------------------------


def test_flow_run_reads_the_lake_of_its_environment_at_run_time(tmp_path, monkeypatch):
    """The deployment is built while SAASBENCH_LAKE names one lake; the flow run starts where it names
    another: rows and the report land in the run-time lake, the deploy-time one gets nothing, and the
    report link artifact points at the report in that lake's store (not at the worker's disk)."""
    deploy_lake, run_lake = tmp_path / "deploy-lake", tmp_path / "run-lake"
    monkeypatch.setenv("SAASBENCH_LAKE", str(deploy_lake))
    spec = sweep_dict(tmp_path, "flow-env-lake", agents=["oracle"])
    del spec["lake"]
    deployment = sweep_flow.to_deployment(name="sweep", parameters={"spec": spec})
    assert str(deploy_lake) not in repr((deployment.parameters, deployment.job_variables))

    monkeypatch.setenv("SAASBENCH_LAKE", str(run_lake))  # the worker's environment when the run starts
    res = sweep_flow(**deployment.parameters)
    assert res["outcomes"] == {"timetrack.oracle.none.0": "completed"}
    assert lakelib.committed_trials(str(run_lake), "flow-env-lake") == {"timetrack.oracle.none.0"}
    assert not deploy_lake.exists()
    in_lake = run_lake / "reports" / "flow-env-lake" / "flow-env-lake.html"
    assert in_lake.is_file() and in_lake.read_bytes() == (tmp_path / "reports" / "flow-env-lake.html").read_bytes()
    assert res["report_url"] == in_lake.resolve().as_uri()
    (link,) = artifacts(artifact_key("flow-env-lake", "report"))
    assert in_lake.resolve().as_uri() in link.data and (tmp_path / "reports").as_uri() not in link.data


def test_report_link_is_the_s3_url_of_the_report(tmp_path, monkeypatch):
    from saasbench.flows.aggregate import upload_report

    class FakeS3:
        uri = "s3://results/saasbench"

        def __init__(self):
            self.put_keys = []

        def put(self, key, data):
            self.put_keys.append((key, data))

        def url(self, key):
            return f"s3://results/saasbench/{key}"

    store = FakeS3()
    monkeypatch.setattr(lakelib, "lake_from_uri", lambda uri: store)
    html = tmp_path / "r.html"
    html.write_text("<html>report</html>")
    spec = sw.SweepSpec.model_validate(sweep_dict(tmp_path, "s3-report", lake="s3://results/saasbench"))
    assert upload_report(spec, str(html)) == "s3://results/saasbench/reports/s3-report/s3-report.html"
    assert store.put_keys == [("reports/s3-report/s3-report.html", b"<html>report</html>")]


def test_empty_s3_endpoint_is_a_clear_error(tmp_path, monkeypatch):
    from saasbench.settings import SettingError

    monkeypatch.setenv("SAASBENCH_S3_ENDPOINT", "")
    spec = sweep_dict(tmp_path, "flow-empty-endpoint", agents=["nop"], lake="s3://results/saasbench")
    with pytest.raises(SettingError, match=r"^SAASBENCH_S3_ENDPOINT is set but empty") as info:
        sweep_flow(spec)
    assert "\n" not in str(info.value)


def test_empty_settings_are_one_line_cli_errors(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from saasbench.cli.main import app

    runner = CliRunner()
    res = runner.invoke(
        app,
        ["query", "SELECT 1", "--lake", "s3://results/saasbench"],
        env={"SAASBENCH_S3_ENDPOINT": "", "COLUMNS": "400"},
    )
    assert res.exit_code == 1, res.output  # query's own convention: 1 when the query could not run
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "SAASBENCH_S3_ENDPOINT is set but empty" in lines[0]
    res = runner.invoke(
        app,
        ["sweep", "--task", "timetrack", "--agent", "nop", "--dry-run"],
        env={"SAASBENCH_LAKE": "", "COLUMNS": "400"},
    )
    assert res.exit_code == 2 and "SAASBENCH_LAKE is set but empty" in res.output, res.output


# --- friction (issue #18 item 5) ---------------------------------------------------------------


def test_dispatch_deployment_without_server_or_deployment_is_one_line(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from saasbench.cli.main import app
    from saasbench.flows.sweep import DispatchUnavailable, check_trial_deployment

    args = ["sweep", "--task", "timetrack", "--agent", "nop", "--lake", str(tmp_path / "lake")]
    args += ["--sweep-id", "no-dep", "--dispatch", "deployment"]
    # this module's test server has no 'trial' deployment
    res = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip() and not ln.startswith("sweep no-dep:")]
    assert len(lines) == 1 and "has no deployment 'trial/trial'" in lines[0] and "prefect deploy" in lines[0]
    assert "ObjectNotFound" not in res.output
    assert lakelib.committed_trials(str(tmp_path / "lake"), "no-dep") == set()
    # no server at all
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(DispatchUnavailable, match=r"^no Prefect server: --dispatch deployment needs a Prefect"):
            check_trial_deployment()


def test_dispatch_names_each_trial_run_after_the_trial(tmp_path, monkeypatch):
    import prefect.deployments

    from saasbench.flows import sweep as sweep_flows

    spec = sweep_dict(tmp_path, "flow-dispatch-names", agents=["oracle", "nop"], retries=1)
    fake = FakeDeployments(spec, {"oracle": ["crash", "ok"], "nop": ["ok"]})
    names = []

    def run_deployment(name, flow_run_name=None, **kw):
        names.append(flow_run_name)
        return fake.run_deployment(name, **kw)

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    monkeypatch.setattr(sweep_flows, "_read_state", fake.read_state)
    sweep_flow(spec, dispatch="deployment", poll_seconds=0.05)
    assert sorted(names) == [
        "trial timetrack/nop/none#0",
        "trial timetrack/oracle/none#0",
        "trial timetrack/oracle/none#0 (dispatch 2)",
    ]
