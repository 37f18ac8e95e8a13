"""Validate-reference stage: the oracle + DAG N times; a node that does not pass is a task defect."""

from __future__ import annotations

from prefect import flow, task

from saasbench.failures import TaskDefect


@task(name="validate-reference")
def validate_reference_task(task_id: str, repeats: int = 3, out_dir: str | None = None) -> dict:
    from saasbench.catalog.tasks import load_task
    from saasbench.runs.validate import validate_reference

    try:
        t = load_task(task_id)
    except Exception as exc:
        raise TaskDefect(f"cannot load task {task_id!r}: {exc}") from exc
    return validate_reference(t, repeats, out_dir=out_dir).model_dump(mode="json")


@flow(name="validate-reference", flow_run_name="validate-reference {task_id} x{repeats}")
def validate_reference_flow(task_id: str, repeats: int = 3, out_dir: str | None = None) -> dict:
    return validate_reference_task(task_id, repeats, out_dir)
