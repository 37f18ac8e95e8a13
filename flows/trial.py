"""Trial stage: one (task, agent, model, attempt) -> a committed lake row.

The Prefect task retries only retryable :class:`saasbench.failures.HarnessError` (env_error,
judge_error) with backoff; agent outcomes and task defects are recorded at once, never retried.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import State

from saasbench.failures import is_retryable
from saasbench.runs import sweep as core
from saasbench.services import limits

RETRY_DELAYS: list[float] = [10, 60]


def retry_infra_only(task_obj: Any, task_run: Any, state: State) -> bool:
    """``retry_condition_fn``: retry only when the task raised a retryable HarnessError."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - the task's own exception is re-raised here
        return is_retryable(exc)
    return False


def _task_run_name() -> str:
    from prefect.runtime import task_run

    trial = task_run.parameters.get("trial")
    return f"run {trial.label}" if isinstance(trial, core.TrialSpec) else "run-trial"


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"trial {p.get('task')}/{p.get('agent')}/{p.get('model') or 'none'}#{p.get('attempt', 0)}"


@task(
    name="run-trial",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_infra_only,
    task_run_name=_task_run_name,
)
def run_trial_task(trial: core.TrialSpec, spec: core.SweepSpec) -> str:
    return core.run_trial(trial, spec)


@task(name="record-failure")
def record_failure_task(trial: core.TrialSpec, spec: core.SweepSpec, exc: BaseException) -> str:
    return core.record_failure(trial, spec, exc)


def _trial_spec(task: str, agent: str, model: str | None, attempt: int) -> core.TrialSpec:
    return core.TrialSpec(task=task, agent=agent, model=model, attempt=attempt)


@flow(name="trial", flow_run_name=_flow_run_name, log_prints=True)
def trial_flow(
    task: str,
    agent: str,
    model: str | None = None,
    attempt: int = 0,
    sweep: dict | None = None,
    retries: int | None = None,
    retry_delays: list[float] | None = None,
) -> str:
    """Run one trial and commit it; returns the outcome. ``sweep`` is a SweepSpec dict (sweep_id,
    backend, lake, ...); without it a one-trial sweep ``run-<task>-<agent>`` is used."""
    spec = core.SweepSpec.load(
        sweep
        or {
            "sweep_id": f"run-{core.id_part(task)}-{core.id_part(agent)}",
            "tasks": [task],
            "agents": [agent],
            "models": [model],
        }
    )
    trial = _trial_spec(task, agent, model, attempt)
    set_limits = limits.ensure_prefect_limits(limits.configure_from_spec(spec))
    get_run_logger().info(
        "trial %s of sweep %s on host %s pid %d worker %s; limits %s",
        trial.trial_id,
        spec.sweep_id,
        socket.gethostname(),
        os.getpid(),
        os.environ.get("PREFECT__WORKER_NAME") or "-",
        set_limits or "none",
    )
    return run_trial_with_retries(trial, spec, retries=retries, retry_delays=retry_delays)


def run_trial_with_retries(
    trial: core.TrialSpec, spec: core.SweepSpec, *, retries: int | None = None, retry_delays: list[float] | None = None
) -> str:
    """Call the run-trial task (inside a flow) with the spec's retry policy; record the final failure."""
    delays = retry_delays if retry_delays is not None else spec.retry_delays
    runner = run_trial_task.with_options(
        retries=spec.retries if retries is None else retries, retry_delay_seconds=list(delays) or 0
    )
    try:
        return runner(trial, spec)
    except Exception as exc:
        if not is_retryable(exc):
            raise  # a harness bug: fail the flow run, leave the trial pending for a re-run
        return record_failure_task(trial, spec, exc)
