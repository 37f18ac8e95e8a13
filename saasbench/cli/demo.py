"""``saasbench demo``: the oracle and nop agents on the bundled demo task, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, cast

import typer
from rich.markup import escape
from rich.table import Table

from saasbench import settings
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail
from saasbench.cli.common import fmt_num, fresh_dir, timestamp

if TYPE_CHECKING:
    from rich.progress import TaskID

    from saasbench.agents.base import Trajectory
    from saasbench.evaluation.results import NodeResult

DEMO_TASK = "timetrack"
DEMO_AGENTS = ("oracle", "nop")


def demo(
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder; default runs/demo-<timestamp>")] = None,
    task: Annotated[str, typer.Option("--task", help="Task id or folder")] = DEMO_TASK,
    lake: Annotated[
        Optional[str], typer.Option("--lake", help="Results lake URI (default $SAASBENCH_LAKE or runs/lake)")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="local (default, no engine needed) or docker")] = "local",
) -> None:
    """Run the oracle and nop agents on the bundled demo task end to end and print a leaderboard.

    Local backend, results in a local folder: no Docker engine, no API key, no server. Each
    agent gets a fresh workspace; the app is started by the task's deployment contract
    (run.sh), scored with the task's DAG, and stopped. Judge nodes are SKIPPED_LLM without a
    judge, so the deterministic score is the one to read.

    Example: saasbench demo --out /tmp/demo-run
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    from saasbench.catalog.tasks import load_task
    from saasbench.dag import DagLoadError
    from saasbench.runs.trial import run_local_trial

    console = _console()
    try:
        spec = load_task(task)
    except (FileNotFoundError, KeyError, ValueError, DagLoadError) as exc:
        raise _fail(f"cannot load demo task {task!r}: {exc}") from None
    from saasbench.environments import check_backend

    try:
        check_backend(backend)
    except ValueError as exc:
        raise _fail(f"--backend: {exc}") from None
    out_dir = out or fresh_dir(Path("runs") / f"demo-{timestamp()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    import datetime as dt

    from saasbench import lake as lakelib

    lake_uri = settings.lake_uri(lake)
    store = lakelib.lake_from_uri(lake_uri)
    sweep_id = f"demo-{timestamp()}"
    lakelib.write_sweep(
        store,
        lakelib.sweep_row(
            sweep_id,
            name="saasbench demo",
            tasks=[spec.id],
            agents=list(DEMO_AGENTS),
            config={"backend": backend, "task": spec.id},
            attempts=1,
        ),
    )
    rows = []
    for agent in DEMO_AGENTS:
        started = dt.datetime.now(dt.timezone.utc)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task(f"{agent}: preparing", total=None)

            def on_node(r: NodeResult, bar: TaskID = bar, agent: str = agent) -> None:
                progress.update(bar, advance=1, description=f"{agent}: {r.id} {r.status.value}")

            def say(m: str, bar: TaskID = bar) -> None:
                progress.update(bar, description=m, total=len(spec_nodes(spec)))

            result = run_local_trial(spec, agent, backend=backend, on_node=on_node, say=say)
        report_path = out_dir / agent / "report.json"
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(result.report.model_dump_json(indent=2), encoding="utf-8")
        trajectory = cast("Trajectory", result.trajectory)  # TrialResult types it as object
        (out_dir / agent / "trajectory.json").write_text(trajectory.model_dump_json(indent=2), encoding="utf-8")
        lakelib.write_trial(
            store,
            lakelib.from_trial_result(
                result,
                sweep_id=sweep_id,
                trial_id=f"{spec.id}.{agent}.0",
                task=spec,
                started_at=started,
                outcome=result.outcome,
                ended_at=dt.datetime.now(dt.timezone.utc),
                report_uri=str(report_path),
            ),
        )
        rows.append((agent, result, report_path))
        note = "app up" if result.app_ok else f"app down: {(result.app_error or '')[:60]}"
        console.print(f"{agent}: deterministic score {result.report.summary.deterministic_score} ({note})")
    table = Table(title=f"Leaderboard: task {spec.id} ({backend} backend)", show_edge=False)
    for col in ("agent", "deterministic", "task score", "coverage", "statuses"):
        table.add_column(col, overflow="fold")
    for agent, result, _report in sorted(rows, key=lambda r: -(r[1].report.summary.deterministic_score or 0)):
        s = result.report.summary
        statuses = ", ".join(f"{k} {v}" for k, v in s.counts.model_dump().items() if v)
        table.add_row(
            agent, fmt_num(s.deterministic_score), fmt_num(s.task_score), fmt_num(s.node_coverage, "%"), statuses
        )
    console.print()
    console.print(table)
    for agent, _, report_path in rows:
        console.print(f"{agent} report: {escape(str(report_path))}")
    console.print(
        f"Lake: {escape(lake_uri)} (sweep {sweep_id}); try: saasbench query "
        f"\"SELECT agent, deterministic_score FROM trials WHERE sweep_id = '{sweep_id}'\" --lake {escape(lake_uri)}"
    )


def spec_nodes(task) -> list:
    from saasbench.dag import load_dag

    return load_dag(task.dag_path).dag.nodes
