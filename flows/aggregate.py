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


@task(name="aggregate", task_run_name="aggregate")
def aggregate_task(spec: core.SweepSpec, report_dir: str | None = None) -> dict[str, Any]:
    agg = core.aggregate(spec, report_dir=report_dir)
    return {"markdown": agg["markdown"], "html": agg["html"]}


def report_key(sweep_id: str) -> str:
    """Where a sweep's HTML report is kept in the lake's object store."""
    return f"reports/{sweep_id}/{sweep_id}.html"


def upload_report(spec: core.SweepSpec, html_path: str) -> str:
    """Copy the HTML report written on this worker's disk into the sweep's lake store under
    ``reports/<sweep_id>/`` and return its address there: ``s3://bucket/prefix/reports/...`` for an
    S3 lake, a ``file://`` URI inside the (shared) lake folder for a local one."""
    from saasbench import lake as lakelib

    store = lakelib.lake_from_uri(spec.lake_uri)
    key = report_key(spec.sweep_id)
    store.put(key, Path(html_path).read_bytes())
    url = store.url(key)
    return url if "://" in url else Path(url).resolve().as_uri()


def publish_artifacts(spec: core.SweepSpec, agg: dict[str, Any]) -> str | None:
    """Markdown leaderboard (+ a link to the HTML report in the lake's object store when one was
    written); call inside a flow or task. Returns the report's address in the store."""
    create_markdown_artifact(
        key=artifact_key(spec.sweep_id, "leaderboard"),
        markdown=f"# Leaderboard: sweep `{spec.sweep_id}`\n\n{agg['markdown']}",
        description=f"SaaSBench sweep {spec.sweep_id}: Pass@1 and deterministic score per agent/model",
    )
    if not agg.get("html"):
        return None
    link = upload_report(spec, agg["html"])
    create_link_artifact(
        key=artifact_key(spec.sweep_id, "report"),
        link=link,
        link_text=f"HTML report of sweep {spec.sweep_id}",
        description=f"SaaSBench sweep {spec.sweep_id}: the HTML report in the results lake's object store",
    )
    return link


@flow(name="aggregate", flow_run_name="aggregate {sweep_id}")
def aggregate_flow(sweep_id: str, lake: str | None = None, report_dir: str | None = None) -> str:
    """Re-aggregate a finished sweep (e.g. after a re-run) and republish its artifacts."""
    spec = core.SweepSpec(sweep_id=sweep_id, tasks=["-"], agents=["-"], lake=lake, compact=False)  # plan unknown
    agg = aggregate_task(spec, report_dir=report_dir)
    publish_artifacts(spec, agg)
    return agg["markdown"]
