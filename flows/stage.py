"""What every trial stage task shares: the retry policy (infrastructure only), the run name, no Prefect cache.

A stage's persisted result is its checkpoint in the lake's object store (:mod:`saasbench.runs.stages`),
written by the stage itself: it works without Prefect too, and a resumed sweep (another process,
another worker) finds it. So Prefect's own result persistence and input caching stay off: a stage's
input is the live :class:`~saasbench.runs.stages.TrialRun` (environment, agent), not data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from saasbench.failures import is_retryable


def retry_infra_only(task_obj: Any, task_run: Any, state: State) -> bool:
    """``retry_condition_fn``: retry only when the task raised a retryable HarnessError."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - the task's own exception is re-raised here
        return is_retryable(exc)
    return False


def stage_run_name(stage: str) -> Callable[[], str]:
    """Task run names say task/agent/model#attempt and the stage."""

    def name() -> str:
        from prefect.runtime import task_run

        run = task_run.parameters.get("run")
        trial = getattr(run, "trial", None)
        return f"{trial.label} · {stage}" if trial is not None else stage

    return name


def stage_task(stage: str, fn: Callable[..., Any]) -> Any:
    """``fn`` as the Prefect task of ``stage`` (retries are set per sweep with ``with_options``)."""
    return task(
        name=stage.replace("_", "-"),
        task_run_name=stage_run_name(stage),
        retry_condition_fn=retry_infra_only,
        cache_policy=NO_CACHE,
        persist_result=False,
    )(fn)
