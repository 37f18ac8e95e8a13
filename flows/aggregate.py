"""Aggregate stage: the sweep report, a markdown leaderboard artifact and a link to the HTML report."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from saasbench.runs import sweep as core


def artifact_key(sweep_id: str, kind: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{sweep_id}".lower()).strip("-")


@task(name="aggregate")
def aggregate_task(spec: core.SweepSpec, report_dir: str | None = None) -> dict[str, Any]:
    agg = core.aggregate(spec, report_dir=report_dir)
    return {"markdown": agg["markdown"], "html": agg["html"]}


def publish_artifacts(spec: core.SweepSpec, agg: dict[str, Any]) -> None:
    """Markdown leaderboard (+ link to the HTML report when written); call inside a flow or task."""
    create_markdown_artifact(
        key=artifact_key(spec.sweep_id, "leaderboard"),
        markdown=f"# Leaderboard: sweep `{spec.sweep_id}`\n\n{agg['markdown']}",
        description=f"SaaSBench sweep {spec.sweep_id}: Pass@1 and deterministic score per agent/model",
    )
    if agg.get("html"):
        create_link_artifact(
            key=artifact_key(spec.sweep_id, "report"),
            link=Path(agg["html"]).as_uri(),
            link_text=f"HTML report of sweep {spec.sweep_id}",
        )


@flow(name="aggregate", flow_run_name="aggregate {sweep_id}")
def aggregate_flow(sweep_id: str, lake: str | None = None, report_dir: str | None = None) -> str:
    """Re-aggregate a finished sweep (e.g. after a re-run) and republish its artifacts."""
    spec = core.SweepSpec(sweep_id=sweep_id, tasks=["-"], agents=["-"], lake=lake, compact=False)  # plan unknown
    agg = aggregate_task(spec, report_dir=report_dir)
    publish_artifacts(spec, agg)
    return agg["markdown"]
