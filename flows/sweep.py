"""Sweep stage: sweep row -> pending trials (at most ``concurrency`` at once) -> aggregate + artifacts.

Resumable: only trials not committed in the lake are submitted, so re-running a killed sweep with
the same ``sweep_id`` finishes it without duplicating rows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.task_runners import ThreadPoolTaskRunner
from saasbench.flows.aggregate import aggregate_task, publish_artifacts
from saasbench.flows.trial import record_failure_task, run_trial_task

from saasbench import sweep as core
from saasbench.failures import is_retryable

MAX_WORKERS = int(os.environ.get("SAASBENCH_MAX_WORKERS", "16"))


@task(name="write-sweep-row")
def write_sweep_row_task(spec: core.SweepSpec) -> None:
    core.write_sweep_row(spec)


@task(name="pending-trials")
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


@flow(name="sweep", flow_run_name=_run_name, task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True)
def sweep_flow(spec: dict[str, Any] | str, concurrency: int | None = None, report_dir: str | None = None) -> dict[str, Any]:
    """Run a sweep: ``spec`` is a SweepSpec dict or a YAML path. Returns outcomes and the leaderboard."""
    sw = core.SweepSpec.load(spec if isinstance(spec, dict) else Path(spec))
    if concurrency:
        sw = sw.model_copy(update={"concurrency": concurrency})
    logger = get_run_logger()
    write_sweep_row_task(sw)
    todo = pending_task(sw)
    logger.info("sweep %s: %d planned, %d pending, concurrency %d", sw.sweep_id, len(core.plan(sw)), len(todo),
                sw.concurrency)
    runner = run_trial_task.with_options(retries=sw.retries, retry_delay_seconds=list(sw.retry_delays) or 0)
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
    agg = aggregate_task(sw, report_dir=report_dir)
    publish_artifacts(sw, agg)
    return {"sweep_id": sw.sweep_id, "outcomes": outcomes, "leaderboard": agg["markdown"], "html": agg["html"]}
