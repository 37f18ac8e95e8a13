"""Sweep stage: sweep row -> pending trials (at most ``concurrency`` at once) -> aggregate + artifacts.

Resumable: only trials not committed in the lake are submitted, so re-running a killed sweep with
the same ``sweep_id`` finishes it without duplicating rows.

Two dispatch modes:

- ``local`` (default): trials are Prefect tasks in this flow run's thread pool (one process).
- ``deployment``: every trial is a flow run of the ``trial`` deployment
  (:func:`prefect.deployments.run_deployment`), so the workers of its work pool share the
  sweep. At most ``concurrency`` child runs are in flight; a child that CRASHED (its process
  died) is an infrastructure failure: it is dispatched again up to ``retries`` times (after
  ``retry_delays``) and then committed as ``env_error`` via ``record_failure``, unless the lake
  already holds the trial. A FAILED child (a harness bug) stops dispatching and fails the sweep;
  a CANCELLED child leaves its trial pending for the next run.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from prefect import flow, get_run_logger, task
from prefect.task_runners import ThreadPoolTaskRunner

from saasbench import settings
from saasbench.failures import EnvError, is_retryable
from saasbench.flows.aggregate import aggregate_task, publish_artifacts
from saasbench.flows.trial import record_failure_task, run_trial_task
from saasbench.runs import sweep as core
from saasbench.services import limits

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

MAX_WORKERS = int(settings.get("SAASBENCH_MAX_WORKERS") or "16")


@task(name="write-sweep-row", task_run_name="write-sweep-row")
def write_sweep_row_task(spec: core.SweepSpec) -> None:
    core.write_sweep_row(spec)


@task(name="concurrency-limits", task_run_name="concurrency-limits")
def limits_task(spec: core.SweepSpec) -> list[tuple[str, int]]:
    """Create/update the Prefect global concurrency limits of the sweep's config (saasbench.services.limits)."""
    return limits.ensure_prefect_limits(limits.configure_from_spec(spec))


@task(name="pending-trials", task_run_name="pending-trials")
def pending_task(spec: core.SweepSpec) -> list[core.TrialSpec]:
    return core.pending(spec)


def _finish(fut: Any, trial: core.TrialSpec, spec: core.SweepSpec, outcomes: dict[str, str]) -> None:
    try:
        outcomes[trial.trial_id] = fut.result()
    except Exception as exc:
        if not is_retryable(exc):
            raise
        outcomes[trial.trial_id] = record_failure_task(trial, spec, exc)


def _run_name() -> str:
    from prefect.runtime import flow_run

    spec = flow_run.parameters.get("spec")
    return f"sweep {spec.get('sweep_id') if isinstance(spec, dict) else spec}"


@flow(
    name="sweep",
    flow_run_name=_run_name,
    # prefect's TaskRunner is invariant in its future type, so no runner matches the parameter (prefect casts its own)
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),  # type: ignore[arg-type]
    log_prints=True,
)
def sweep_flow(
    spec: dict[str, Any] | str,
    concurrency: int | None = None,
    report_dir: str | None = None,
    dispatch: Literal["local", "deployment"] = "local",
    trial_deployment: str = "trial/trial",
    poll_seconds: float = 2.0,
) -> dict[str, Any]:
    """Run a sweep: ``spec`` is a SweepSpec dict or a YAML path. Returns outcomes and the leaderboard.

    ``dispatch="deployment"`` runs each trial as a flow run of ``trial_deployment`` (the work
    pool's workers pick them up) instead of a task in this process."""
    sw = core.SweepSpec.load(spec if isinstance(spec, dict) else Path(spec))
    if concurrency:
        sw = sw.model_copy(update={"concurrency": concurrency})
    logger = get_run_logger()
    write_sweep_row_task(sw)
    set_limits = limits_task(sw)
    todo = pending_task(sw)
    logger.info(
        "sweep %s: %d planned, %d pending, concurrency %d, dispatch %s, limits %s",
        sw.sweep_id,
        len(core.plan(sw)),
        len(todo),
        sw.concurrency,
        dispatch,
        set_limits or "none",
    )
    if dispatch == "deployment":
        outcomes = dispatch_deployments(sw, todo, trial_deployment, poll_seconds=poll_seconds)
    elif dispatch == "local":
        with core.sweep_gateway(sw, bool(todo)):  # one model gateway shared by this process's trials
            outcomes = _run_local(sw, todo)
    else:
        raise ValueError(f"dispatch must be 'local' or 'deployment', not {dispatch!r}")
    agg = aggregate_task(sw, report_dir=report_dir)
    report_url = publish_artifacts(sw, agg)
    return {
        "sweep_id": sw.sweep_id,
        "outcomes": outcomes,
        "leaderboard": agg["markdown"],
        "html": agg["html"],
        "report_url": report_url,
    }


def _run_local(sw: core.SweepSpec, todo: list[core.TrialSpec]) -> dict[str, str]:
    runner = run_trial_task  # each stage inside retries on its own (flows/trial.py)
    outcomes: dict[str, str] = {}
    inflight: list[tuple[Any, core.TrialSpec]] = []
    for trial in todo:
        while len(inflight) >= sw.concurrency:  # a window: never more than `concurrency` trials at once
            for item in list(inflight):
                item[0].wait(0.2)
                if item[0].state.is_final():
                    inflight.remove(item)
                    _finish(item[0], item[1], sw, outcomes)
        inflight.append((runner.submit(trial, sw), trial))
    for fut, trial in inflight:
        _finish(fut, trial, sw, outcomes)
    return outcomes


def trial_parameters(trial: core.TrialSpec, sw: core.SweepSpec) -> dict[str, Any]:
    """Parameters of the ``trial`` flow for one trial of the sweep.

    The sweep's lake is the one this sweep run resolved (its spec's ``lake``, else this worker's
    ``$SAASBENCH_LAKE`` read now, at run time): the sweep reads its trials' outcomes back from it, so
    every child commits there. How to reach it (S3 endpoint, credentials) stays each worker's own."""
    return {
        "task": trial.task,
        "agent": trial.agent,
        "model": trial.model,
        "attempt": trial.attempt,
        "sweep": {**sw.model_dump(mode="json"), "lake": sw.lake_uri},
    }


def dispatch_name(trial: core.TrialSpec, crashes: int = 0) -> str:
    """The name of a trial's dispatch step in the sweep run (and of its flow run): the trial label,
    plus the dispatch number of a re-dispatch."""
    return f"trial {trial.label}" + (f" (dispatch {crashes + 1})" if crashes else "")


def _name_dispatch_step(client: Any, run: Any, name: str) -> None:
    """Give the task run Prefect creates in this sweep run for a dispatched child (named after the
    deployment, with a random suffix) the trial's name."""
    parent = getattr(run, "parent_task_run_id", None)
    if parent is None:
        return
    try:
        client._client.patch(f"/task_runs/{parent}", json={"name": name}).raise_for_status()
    except Exception as exc:  # noqa: BLE001 - a cosmetic name; the dispatch itself succeeded
        get_run_logger().debug("could not name the dispatch step %s: %s", parent, exc)


class DispatchUnavailable(RuntimeError):
    """``dispatch="deployment"`` cannot work here: no Prefect server, or the trial deployment is missing."""


DEPLOY_HINT = (
    "--dispatch deployment needs a Prefect server (PREFECT_API_URL) with the flows deployed "
    "(prefect deploy --all --prefect-file infra/prefect.yaml) and workers on the 'saasbench' pool; "
    "see infra/README.md, or use --dispatch local"
)


def check_trial_deployment(trial_deployment: str = "trial/trial") -> None:
    """Raise :class:`DispatchUnavailable` (one line, with the fix) unless a Prefect server is
    configured, answers and has ``trial_deployment``."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise DispatchUnavailable(f"no Prefect server: {DEPLOY_HINT}")
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(trial_deployment)
    except ObjectNotFound:
        raise DispatchUnavailable(
            f"the Prefect server at {url} has no deployment {trial_deployment!r}: {DEPLOY_HINT}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure to ask the server means the same thing here
        raise DispatchUnavailable(
            f"the Prefect server at {url} did not answer ({type(exc).__name__}: {exc}): {DEPLOY_HINT}"
        ) from None


def _read_state(client: Any, flow_run_id: Any) -> Any:
    return client.read_flow_run(flow_run_id).state


def dispatch_deployments(
    sw: core.SweepSpec, todo: list[core.TrialSpec], trial_deployment: str = "trial/trial", *, poll_seconds: float = 2.0
) -> dict[str, str]:
    """Run ``todo`` as flow runs of ``trial_deployment`` (at most ``sw.concurrency`` at once) and
    wait for them; returns ``{trial_id: outcome}`` (outcomes read back from the lake)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.runtime import flow_run as this_run

    logger = get_run_logger()
    parent = this_run.get_id() or "no-parent"
    queue: list[tuple[core.TrialSpec, int]] = [(t, 0) for t in todo]  # (trial, crashes so far)
    inflight: dict[Any, tuple[core.TrialSpec, int]] = {}
    outcomes: dict[str, str] = {}
    failed: list[str] = []
    with get_client(sync_client=True) as client:
        while queue or inflight:
            while queue and not failed and len(inflight) < sw.concurrency:
                trial, crashes = queue.pop(0)
                when = None
                if crashes:
                    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=sw.delay(crashes - 1))
                try:
                    run = cast(  # called from sync code, prefect's async_dispatch returns the FlowRun itself
                        "FlowRun",
                        run_deployment(
                            trial_deployment,
                            parameters=trial_parameters(trial, sw),
                            flow_run_name=dispatch_name(trial, crashes),
                            scheduled_time=when,
                            timeout=0,
                            tags=["saasbench", f"sweep:{sw.sweep_id}"],
                            idempotency_key=f"{parent}:{trial.trial_id}:{crashes}",
                        ),
                    )
                except ObjectNotFound:
                    raise DispatchUnavailable(
                        f"no deployment {trial_deployment!r} on this Prefect server: {DEPLOY_HINT}"
                    ) from None
                _name_dispatch_step(client, run, dispatch_name(trial, crashes))
                logger.info(
                    "%s: flow run %s (%s)%s",
                    trial.label,
                    run.name,
                    run.id,
                    f", dispatch {crashes + 1}" if crashes else "",
                )
                inflight[run.id] = (trial, crashes)
            if not inflight:
                break
            time.sleep(poll_seconds)
            for run_id, (trial, crashes) in list(inflight.items()):
                state = _read_state(client, run_id)
                if state is None or not state.is_final():
                    continue
                del inflight[run_id]
                committed = core.committed_outcome(sw, trial)
                if state.is_completed() and committed is not None:
                    outcomes[trial.trial_id] = committed
                elif state.is_crashed():
                    if committed is not None:  # crashed after its commit: the trial is done
                        outcomes[trial.trial_id] = committed
                    elif crashes < sw.retries:
                        logger.warning(
                            "%s: flow run %s crashed (%s); dispatching again (%d/%d)",
                            trial.label,
                            run_id,
                            state.message,
                            crashes + 1,
                            sw.retries,
                        )
                        queue.append((trial, crashes + 1))
                    else:
                        exc = EnvError(f"trial flow run {run_id} crashed {crashes + 1} time(s): {state.message}")
                        outcomes[trial.trial_id] = record_failure_task(trial, sw, exc)
                elif state.is_cancelled():
                    logger.warning("%s: flow run %s was cancelled; the trial stays pending", trial.label, run_id)
                else:
                    failed.append(f"{trial.label}: flow run {run_id} {state.type.value}: {state.message}")
    if failed:
        raise RuntimeError("trial flow runs failed (harness errors; the trials stay pending):\n" + "\n".join(failed))
    return outcomes
