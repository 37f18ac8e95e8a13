"""Evaluate stage: a trial's app started (live environment, or restored from its frozen end state) and its
DAG run (``evaluate_stage``). ``evaluate_task``/``evaluate_flow`` score an app that is already running
(``saasbench evaluate`` as a flow, e.g. a live deployment). It goes through the one evaluation wiring
(``saasbench.evaluation.evaluate``): the workspace, the app's database and a judge model are passed on
when given (without a judge, llm-judge nodes are SKIPPED_LLM).
"""

from __future__ import annotations

from prefect import flow, task

from saasbench.failures import TaskDefect
from saasbench.flows.stage import stage_task
from saasbench.runs import stages

evaluate_stage = stage_task("evaluate", stages.evaluate)


@task(name="evaluate", retries=0)
def evaluate_task(
    task_id: str,
    base_url: str,
    node_timeout_s: float = 120.0,
    workspace: str | None = None,
    db_dsn: str | None = None,
    judge_model: str | None = None,
    judge_api_base: str | None = None,
    judge_api_key_env: str | None = None,
) -> dict:
    from pathlib import Path

    from saasbench.catalog.tasks import load_task
    from saasbench.dag import load_dag
    from saasbench.evaluation.context import RunOptions, Target
    from saasbench.evaluation.evaluate import evaluate

    try:
        t = load_task(task_id)
        dag = load_dag(t.dag_path).dag
    except Exception as exc:
        raise TaskDefect(f"cannot load task {task_id!r}: {exc}") from exc
    judge = None
    if judge_model:
        from saasbench.services.judge import Judge, JudgeConfig

        judge = Judge(JudgeConfig(model=judge_model, api_base=judge_api_base, api_key_env=judge_api_key_env))
    target = Target(
        base_url=base_url,
        workspace=Path(workspace) if workspace else None,
        db_dsn=db_dsn,
        task_id=t.id,
        origin_aliases=t.app_origins,
    )
    report = evaluate(
        dag, target, options=RunOptions(node_timeout_s=node_timeout_s), auth_profile=t.spec.auth, judge=judge
    )
    return report.summary.model_dump()


@flow(name="evaluate", flow_run_name="evaluate {task_id} @ {base_url}")
def evaluate_flow(
    task_id: str, base_url: str, workspace: str | None = None, db_dsn: str | None = None, judge_model: str | None = None
) -> dict:
    return evaluate_task(task_id, base_url, workspace=workspace, db_dsn=db_dsn, judge_model=judge_model)
