"""The distributed path against a real Prefect server (``prefect server start`` on 127.0.0.1).

One server per module (SQLite under a temporary PREFECT_HOME, analytics off), the process work pool
``saasbench``, the deployments of ``infra/prefect.yaml`` registered with ``prefect deploy`` (the
documented way), and two ``prefect worker start`` processes. Then:

- a sweep run of the ``sweep`` deployment with ``dispatch="deployment"``: every trial is a flow run
  of the ``trial`` deployment, the two workers share them, every planned trial is committed exactly
  once, the oracle scores 100, the leaderboard artifact exists, the per-host environment limit
  exists on the server with the sweep's value;
- configuration belongs to the worker: ``prefect deploy`` runs with another ``SAASBENCH_LAKE`` and
  an empty ``SAASBENCH_S3_ENDPOINT``; the sweep names no lake, and everything lands in the lake of
  the workers' environment (nothing in the deploying shell's);
- deterministic names: the sweep run's dispatch steps and the trial flow runs are named after the
  trials;
- a schedule: an interval schedule on the ``sweep`` deployment that the server's scheduler turns
  into a flow run, which a worker runs to COMPLETED.

Every process started here is stopped by PID (process groups from start_new_session=True, plus the
flow-run processes the workers started, found as their descendants).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from shared_data import sigint_default

from saasbench import lake as lakelib
from saasbench.runs import sweep as sw
from saasbench.services import limits

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "saasbench"  # the pool infra/prefect.yaml deploys to
WORKERS = ("saasbench-test-w1", "saasbench-test-w2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout: float, what: str, interval: float = 0.5, alive=()):
    """Poll ``cond()`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for proc, name in alive:
            assert proc.poll() is None, f"{name} exited with {proc.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)


def children_of(pids: set[int]) -> set[int]:
    """Every live descendant of ``pids`` (from /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = set(pids)
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group we created, then SIGKILL what is left, including descendants
    that moved to their own sessions (the workers' flow-run processes and their apps)."""
    descendants = children_of({p.pid for p in procs if p.poll() is None})
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    descendants |= children_of({p.pid for p in procs if p.poll() is None})
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
    for pid in descendants:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SAASBENCH_"))}
    env.update(
        {
            "PREFECT_HOME": str(root / "home"),
            "PREFECT_API_URL": url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",  # scheduled runs appear within seconds
            "PREFECT_WORKER_QUERY_SECONDS": "1",  # workers poll the pool every second
            "PREFECT_CLI_PROMPT": "false",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "SAASBENCH_REPO": str(REPO),  # the pull step's working directory (infra/prefect.yaml)
            "SAASBENCH_LAKE": str(root / "lake"),
        }
    )
    procs: list[subprocess.Popen] = []
    logs = root / "logs"
    logs.mkdir()

    def start(name: str, args: list[str]) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args,
            cwd=str(root),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_default,  # Prefect's SIGTERM handling goes through SIGINT: never start it ignored
        )
        out.close()
        procs.append(proc)
        return proc

    def health() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def run(args: list[str], run_env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run(args, env=run_env or env, capture_output=True, text=True, check=False, timeout=180, **kw)
        assert res.returncode == 0, f"{' '.join(args)}:\n{res.stdout}\n{res.stderr}"
        return res

    try:
        server = start("server", [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)])
        wait_until(health, 120, "the Prefect server's /api/health", alive=[(server, "prefect server")])
        run([PREFECT, "work-pool", "create", POOL, "--type", "process"], cwd=str(root))
        # the deploying shell's configuration must not reach the flow runs (infra/README.md "Worker configuration")
        deploy_env = {**env, "SAASBENCH_LAKE": str(root / "deployer-lake"), "SAASBENCH_S3_ENDPOINT": ""}
        deployed = run(
            [PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml"],
            run_env=deploy_env,
            cwd=str(REPO),
        )
        workers = [
            start(
                name, [PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--name", name, "--limit", "2"]
            )
            for name in WORKERS
        ]
        with temporary_settings({PREFECT_API_URL: url}):
            from prefect.client.orchestration import get_client

            def online() -> bool:
                with get_client(sync_client=True) as c:
                    return {w.name for w in c.read_workers_for_work_pool(POOL) if w.status.value == "ONLINE"} >= set(
                        WORKERS
                    )

            wait_until(online, 90, "both workers online", alive=[(w, n) for w, n in zip(workers, WORKERS)])
            yield SimpleNamespace(
                url=url,
                root=root,
                lake=str(root / "lake"),
                deployer_lake=str(root / "deployer-lake"),
                reports=str(root / "reports"),
                workers=workers,
                server=server,
                deploy_output=deployed.stdout,
                logs=logs,
            )
    finally:
        stop_all(procs[1:])  # workers first (and the flow-run processes they started) ...
        stop_all(procs[:1])  # ... then the server
        for p in procs:
            assert p.poll() is not None


def client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def wait_final(flow_run_id, timeout: float):
    def final():
        with client() as c:
            run = c.read_flow_run(flow_run_id)
        return run if run.state is not None and run.state.is_final() else None

    return wait_until(final, timeout, f"flow run {flow_run_id} to finish", interval=1)


def test_deployments_registered_from_prefect_yaml(stack):
    with client() as c:
        names = {f"{c.read_flow(d.flow_id).name}/{d.name}" for d in c.read_deployments()}
        sweep_dep = c.read_deployment_by_name("sweep/sweep")
    assert {"sweep/sweep", "trial/trial", "aggregate/aggregate"} <= names
    assert sweep_dep.work_pool_name == POOL
    assert sweep_dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert [(s.schedule.cron, s.active, s.parameters) for s in sweep_dep.schedules] == [
        ("0 3 * * *", False, {"dispatch": "deployment"})
    ]  # the yaml's nightly example
    assert sweep_dep.parameters["spec"]["envs_per_host"] == 2
    # no deploy-time configuration: no env in any deployment, nothing naming the deploying shell's lake
    with client() as c:
        trial_dep = c.read_deployment_by_name("trial/trial")
    for dep in (sweep_dep, trial_dep):
        assert "env" not in (dep.job_variables or {}), dep.job_variables
        assert "deployer-lake" not in repr((dep.parameters, dep.job_variables, dep.pull_steps))
    assert "lake" not in trial_dep.parameters and "lake" not in sweep_dep.parameters["spec"]


def test_sweep_split_across_two_workers(stack):
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        DeploymentFilter,
        DeploymentFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.deployments import run_deployment

    from saasbench.catalog.tasks import load_task
    from saasbench.dag import load_dag
    from saasbench.flows.aggregate import artifact_key

    spec = {
        "sweep_id": "dist-e2e",
        "tasks": ["timetrack"],
        "agents": ["oracle", "nop"],
        "attempts": 2,
        # no lake: the sweep's worker's SAASBENCH_LAKE (stack.lake), not the deploying shell's
        "report_dir": stack.reports,
        "concurrency": 4,
        "envs_per_host": 2,
        "retry_delays": [0],
    }
    planned_specs = sw.plan(sw.SweepSpec.model_validate(spec))
    planned = {t.trial_id for t in planned_specs}
    assert len(planned) == 4
    parent = run_deployment(
        "sweep/sweep", parameters={"spec": spec, "dispatch": "deployment", "poll_seconds": 1}, timeout=0
    )
    parent = wait_final(parent.id, 170)
    assert parent.state.is_completed(), parent.state

    # the lake: every planned trial committed exactly once, no duplicated node rows
    assert lakelib.committed_trials(stack.lake, "dist-e2e") == planned
    assert not Path(stack.deployer_lake).exists()  # the lake fixed at deploy time got nothing
    per_trial = lakelib.query(
        stack.lake, "SELECT trial_id, count(*) AS n FROM trials WHERE sweep_id = ? GROUP BY 1", ["dist-e2e"]
    ).to_pylist()
    assert sorted(r["trial_id"] for r in per_trial) == sorted(planned) and {r["n"] for r in per_trial} == {1}
    nodes = len(load_dag(load_task("timetrack").dag_path).dag.nodes)
    node_rows = lakelib.query(
        stack.lake,
        "SELECT trial_id, count(*) AS n, count(DISTINCT node_id) AS u FROM node_results WHERE sweep_id = ? GROUP BY 1",
        ["dist-e2e"],
    ).to_pylist()
    assert {r["trial_id"]: (r["n"], r["u"]) for r in node_rows} == {t: (nodes, nodes) for t in planned}
    scores = lakelib.query(
        stack.lake, "SELECT agent, outcome, task_score FROM trials WHERE sweep_id = ? ORDER BY 1", ["dist-e2e"]
    ).to_pylist()
    assert [(r["agent"], r["outcome"]) for r in scores] == [("nop", "completed")] * 2 + [("oracle", "completed")] * 2
    assert [r["task_score"] for r in scores if r["agent"] == "oracle"] == [100.0, 100.0]
    assert all(r["task_score"] < 100.0 for r in scores if r["agent"] == "nop")

    # the trials were flow runs of the trial deployment, children of the sweep run, one per trial
    with client() as c:
        trial_dep = c.read_deployment_by_name("trial/trial")
        runs = [
            r
            for r in c.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[trial_dep.id])), limit=200
            )
            if (r.parameters.get("sweep") or {}).get("sweep_id") == "dist-e2e"
        ]
        assert len(runs) == 4 and all(r.state.is_completed() for r in runs)
        assert {(r.parameters["agent"], r.parameters["attempt"]) for r in runs} == {
            ("oracle", 0),
            ("nop", 0),
            ("oracle", 1),
            ("nop", 1),
        }
        parent_tasks = {r.parent_task_run_id for r in runs}
        assert None not in parent_tasks
        assert {c.read_task_run(t).flow_run_id for t in parent_tasks} == {parent.id}
        # deterministic names: each trial's dispatch step in the sweep run and its flow run say which trial
        labels = {f"trial {t.label}" for t in planned_specs}
        assert {r.name for r in runs} == labels
        assert {c.read_task_run(t).name for t in parent_tasks} == labels
        assert all((r.parameters["sweep"] or {}).get("lake") == stack.lake for r in runs)  # the sweep's lake

        # the report link points at the HTML report in the lake's store, not at a worker's disk
        (link,) = c.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("dist-e2e", "report")]))
        )
        in_lake = Path(stack.lake, "reports", "dist-e2e", "dist-e2e.html")
        assert in_lake.as_uri() in link.data and in_lake.is_file()
        assert Path(stack.reports).as_uri() not in link.data

        # ... and both workers ran some: each trial flow run logs the worker that started it
        def workers_of_runs():
            logs = c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs])), limit=200)
            found = {}
            for log in logs:
                m = re.search(r"^trial (\S+) of sweep dist-e2e on host \S+ pid \d+ worker (\S+);", log.message)
                if m:
                    found[m.group(1)] = m.group(2)
            return found if set(found) == planned else None

        ran_on = wait_until(workers_of_runs, 30, "the trial flow runs' worker log lines")
        assert set(ran_on.values()) == set(WORKERS), ran_on

        # the leaderboard artifact of the sweep, written by the sweep flow run on a worker
        arts = c.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("dist-e2e", "leaderboard")]))
        )
        assert arts and arts[0].type == "markdown" and arts[0].flow_run_id == parent.id
        assert "| oracle / - | 100.0 | 100.0 | 2/2 |" in arts[0].data

        # the per-host environment limit exists on the server with the sweep's value, all released
        lim = c.read_global_concurrency_limit_by_name(limits.env_limit_name())
        assert lim.limit == 2 and lim.active_slots == 0


def test_scheduled_sweep_run(stack):
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.schedules import IntervalSchedule

    spec = {
        "sweep_id": "sched-nop",
        "tasks": ["timetrack"],
        "agents": ["nop"],
        "lake": stack.lake,
        "report_dir": stack.reports,
        "retry_delays": [0],
    }
    with client() as c:
        dep = c.read_deployment_by_name("sweep/sweep")
        created = c.create_deployment_schedules(
            dep.id,
            [(IntervalSchedule(interval=dt.timedelta(seconds=5)), True)],
            max_scheduled_runs=1,
            parameters={"spec": spec},
            slug="test-every-5s",
        )
        try:

            def completed_scheduled_run():
                runs = c.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                    flow_run_filter=FlowRunFilter(
                        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))
                    ),
                    limit=50,
                )
                return [r for r in runs if r.auto_scheduled and r.parameters["spec"]["sweep_id"] == "sched-nop"]

            done = wait_until(
                completed_scheduled_run,
                120,
                "a scheduled sweep run to complete",
                interval=1,
                alive=[(w, n) for w, n in zip(stack.workers, WORKERS)],
            )
        finally:
            for s in created:
                c.delete_deployment_schedule(dep.id, s.id)
        assert "auto-scheduled" in done[0].tags and done[0].work_pool_name == POOL
        assert lakelib.committed_trials(stack.lake, "sched-nop") == {"timetrack.nop.none.0"}
        # nothing left scheduled from the test schedule (it was deleted)
        left = [
            r
            for r in c.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
                ),
            )
            if r.parameters.get("spec", {}).get("sweep_id") == "sched-nop"
        ]
        for r in left:
            c.delete_flow_run(r.id)


def test_an_idle_worker_stops_on_one_sigterm(stack):
    """Prefect's worker handler: the first SIGTERM stops taking runs and exits once its flow runs are
    done; with none running that is at once (no second SIGTERM needed). Runs last: it stops a worker."""
    worker = stack.workers[-1]
    assert worker.poll() is None
    os.kill(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the idle worker did not stop within 30 s of one SIGTERM")
