"""Evaluate stage: a task's DAG against an app that is already running (``saasbench evaluate`` as a task).

Inside a sweep, evaluation runs in the trial's own environment (``saasbench.runs.trial``); this flow is
for re-scoring a live deployment. No judge here: judge nodes are SKIPPED_LLM.
"""

from __future__ import annotations

from prefect import flow, task

from saasbench.failures import TaskDefect


@task(name="evaluate", retries=0)
def evaluate_task(task_id: str, base_url: str, node_timeout_s: float = 120.0) -> dict:
    from saasbench.catalog.tasks import load_task
    from saasbench.dag import load_dag
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.evaluation.engine import Engine

    try:
        t = load_task(task_id)
        dag = load_dag(t.dag_path).dag
    except Exception as exc:
        raise TaskDefect(f"cannot load task {task_id!r}: {exc}") from exc
    ctx = RunContext(Target(base_url=base_url, task_id=t.id), options=RunOptions(node_timeout_s=node_timeout_s),
                     auth_profile=t.spec.auth, env_defaults=dag.env_defaults)
    return Engine(dag, ctx).run().summary.model_dump()


@flow(name="evaluate", flow_run_name="evaluate {task_id} @ {base_url}")
def evaluate_flow(task_id: str, base_url: str) -> dict:
    return evaluate_task(task_id, base_url)
