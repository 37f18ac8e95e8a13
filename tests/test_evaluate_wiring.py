"""The one evaluation wiring (saasbench/evaluation/evaluate.py) as the CLI, a trial and the evaluate flow use it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from apps.teamnotes import serve_in_thread

from flows.evaluate import evaluate_task
from saasbench.dag import load_dag
from saasbench.evaluation.context import RunOptions, Target
from saasbench.evaluation.evaluate import evaluate
from saasbench.evaluation.results import Status

APPS = Path(__file__).resolve().parent / "apps"


def make_task(root: Path) -> Path:
    folder = root / "teamnotes"
    folder.mkdir(parents=True)
    shutil.copy(APPS / "teamnotes_dag.json", folder / "dag.json")
    auth = yaml.safe_load((APPS / "teamnotes_auth.yaml").read_text())
    (folder / "task.yaml").write_text(yaml.safe_dump({"id": "teamnotes", "auth": auth}))
    return folder


def fresh_app(run):
    """Run ``run(url)`` against a fresh teamnotes (the app keeps state between evaluations)."""
    server, _thread, url = serve_in_thread()
    try:
        return run(url)
    finally:
        server.shutdown()
        server.server_close()


def test_the_evaluate_flow_passes_workspace_and_gets_the_same_report_as_evaluate(tmp_path: Path) -> None:
    from saasbench.catalog.tasks import load_task

    folder = make_task(tmp_path)
    workspace = tmp_path / "ws"  # what the DAG's file nodes read (DEPLOY_WORKSPACE_README)
    workspace.mkdir()
    (workspace / "README.md").write_text("# TeamNotes\n")
    dag = load_dag(folder / "dag.json").dag
    summary = fresh_app(lambda url: evaluate_task.fn(str(folder), url, workspace=str(workspace)))
    direct = fresh_app(
        lambda url: evaluate(
            dag,
            Target(base_url=url, workspace=workspace),
            options=RunOptions(),
            auth_profile=load_task(folder).spec.auth,
        )
    )
    without = fresh_app(lambda url: evaluate_task.fn(str(folder), url))  # no workspace: its file nodes cannot pass
    assert summary["deterministic_score"] == direct.summary.deterministic_score
    assert summary["deterministic_score"] > without["deterministic_score"]
    assert summary["counts"]["SKIPPED_LLM"] == direct.summary.counts.SKIPPED_LLM  # no judge given: skipped, no evidence
    assert json.dumps(summary)  # plain data for Prefect
    assert any(n.status == Status.PASSED for n in direct.nodes)
