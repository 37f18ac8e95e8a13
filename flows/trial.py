"""Trial flow: one (task, agent, model, attempt) through its stages to a committed lake row.

build env -> provision -> rollout -> freeze -> evaluate -> judge -> commit, each a Prefect task in its
own module of ``flows/`` with the sweep's retry policy for infrastructure failures only
(:func:`saasbench.flows.stage.retry_infra_only`); agent outcomes and task defects are recorded at once,
never retried. Each stage continues from the trial's checkpoints (:mod:`saasbench.runs.stages`), so a
retried stage or a resumed sweep never runs the agent of a frozen trial again.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from saasbench.failures import JudgeError, is_retryable
from saasbench.flows.build_env import build_env_stage
from saasbench.flows.commit import commit_stage
from saasbench.flows.evaluate import evaluate_stage
from saasbench.flows.freeze import freeze_stage
from saasbench.flows.judge import judge_stage
from saasbench.flows.provision import provision_stage
from saasbench.flows.rollout import rollout_stage
from saasbench.flows.stage import retry_infra_only
from saasbench.runs import stages
from saasbench.runs import sweep as core
from saasbench.services import limits

__all__ = ["retry_infra_only", "run_stage_tasks", "run_trial_task", "trial_flow"]


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"trial {p.get('task')}/{p.get('agent')}/{p.get('model') or 'none'}#{p.get('attempt', 0)}"


def _task_run_name() -> str:
    from prefect.runtime import task_run

    trial = task_run.parameters.get("trial")
    return f"trial {trial.label}" if isinstance(trial, core.TrialSpec) else "trial"


def run_stage_tasks(run: stages.TrialRun, *, retries: int | None = None, delays: list[float] | None = None) -> str:
    """The stages of ``run`` as Prefect tasks, in order, with the retry policy; returns the committed outcome.

    A retryable failure left after a stage's retries is raised (nothing committed, checkpoints kept);
    a non-retryable HarnessError (agent outcome, task defect) is raised for the caller to record."""
    spec = run.spec
    opts: dict[str, Any] = dict(
        retries=spec.retries if retries is None else retries,
        retry_delay_seconds=list(spec.retry_delays if delays is None else delays) or 0,
    )
    # one environment slot for the whole trial: its live environment and a restored one never overlap
    with limits.environment_slot(), contextlib.closing(run):
        build_env_stage.with_options(**opts)(run)
        if run.checkpoints.load("freeze") is None:
            provision_stage.with_options(**opts)(run)
            rollout_stage.with_options(**opts)(run)
            freeze_stage.with_options(**opts)(run)
        evaluate_stage.with_options(**opts)(run)
        judge_failure = None
        try:
            judge_stage.with_options(**opts)(run)
        except JudgeError as exc:
            judge_failure = exc
        return commit_stage.with_options(**opts)(run, judge_failure=judge_failure)


@task(name="trial", task_run_name=_task_run_name, cache_policy=NO_CACHE, persist_result=False)
def run_trial_task(trial: core.TrialSpec, spec: core.SweepSpec) -> str:
    """One trial of a sweep run in this process: its stages are nested task runs of this one."""
    return run_trial_stages(trial, spec)


def run_trial_stages(trial: core.TrialSpec, spec: core.SweepSpec, **retry: Any) -> str:
    """The trial's stages as Prefect tasks (:func:`saasbench.runs.sweep.run_trial` with this driver): agent
    outcomes and task defects are recorded at once; a retryable failure left after the retries is raised."""
    return core.run_trial(trial, spec, driver=lambda run: run_stage_tasks(run, **retry))


def _record_failure_name() -> str:
    from prefect.runtime import task_run

    trial = task_run.parameters.get("trial")
    return f"record-failure {trial.label}" if isinstance(trial, core.TrialSpec) else "record-failure"


@task(name="record-failure", task_run_name=_record_failure_name, cache_policy=NO_CACHE, persist_result=False)
def record_failure_task(trial: core.TrialSpec, spec: core.SweepSpec, exc: BaseException) -> str:
    return core.record_failure(trial, spec, exc)


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
    trial = core.TrialSpec(task=task, agent=agent, model=model, attempt=attempt)
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
    """The trial's stages (inside a flow) with the spec's retry policy; record the final failure."""
    try:
        return run_trial_stages(trial, spec, retries=retries, delays=retry_delays)
    except Exception as exc:
        if not is_retryable(exc):
            raise  # a harness bug: fail the flow run, leave the trial pending for a re-run
        return record_failure_task(trial, spec, exc)
