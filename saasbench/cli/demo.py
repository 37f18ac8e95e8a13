"""``saasbench demo``: the oracle and nop agents on the bundled demo task, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, cast

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
    no_prefect: Annotated[
        bool, typer.Option("--no-prefect", help="Run the stages in this process without Prefect (debugging)")
    ] = False,
) -> None:
    """Run the oracle and nop agents on the bundled demo task end to end and print a leaderboard.

    The same trial flow as `saasbench sweep` (build env, provision, rollout, freeze, evaluate, judge,
    commit), on an embedded Prefect unless PREFECT_API_URL is set. Local backend, results in a local
    folder: no Docker engine, no API key, no server. Each agent gets a fresh workspace; the app is
    started by the task's deployment contract (run.sh), scored with the task's DAG, and stopped.
    Judge nodes are SKIPPED_LLM without a judge, so the deterministic score is the one to read.

    Example: saasbench demo --out /tmp/demo-run
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    from saasbench.catalog.tasks import load_task
    from saasbench.dag import DagLoadError
    from saasbench.environments import check_backend
    from saasbench.runs import sweep as core

    console = _console()
    try:
        spec = load_task(task)
    except (FileNotFoundError, KeyError, ValueError, DagLoadError) as exc:
        raise _fail(f"cannot load demo task {task!r}: {exc}") from None
    try:
        check_backend(backend)
    except ValueError as exc:
        raise _fail(f"--backend: {exc}") from None
    out_dir = out or fresh_dir(Path("runs") / f"demo-{timestamp()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    lake_uri = settings.lake_uri(lake)
    sweep = core.SweepSpec(
        sweep_id=f"demo-{timestamp()}",
        name="saasbench demo",
        tasks=[task],
        agents=list(DEMO_AGENTS),
        backend=backend,
        lake=lake_uri,
        report_dir=str(out_dir),
        retry_delays=[1],
    )
    n_nodes = len(spec_nodes(spec))
    rows: list[tuple[str, Any, Path]] = []
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as progress:
        bars: dict[str, TaskID] = {}

        def bar(trial: Any) -> TaskID:
            if trial.agent not in bars:
                bars[trial.agent] = progress.add_task(f"{trial.agent}: preparing", total=n_nodes)
            return bars[trial.agent]

        def on_say(trial: Any, message: str) -> None:
            progress.update(bar(trial), description=message)

        def on_node(trial: Any, r: NodeResult) -> None:
            progress.update(bar(trial), advance=1, description=f"{trial.agent}: {r.id} {r.status.value}")

        def on_commit(trial: Any, result: Any, _rows: Any) -> None:
            folder = out_dir / trial.agent
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "report.json").write_text(result.report.model_dump_json(indent=2), encoding="utf-8")
            trajectory = cast("Trajectory", result.trajectory)  # TrialResult types it as object
            (folder / "trajectory.json").write_text(trajectory.model_dump_json(indent=2), encoding="utf-8")
            rows.append((trial.agent, result, folder / "report.json"))
            progress.update(bar(trial), description=f"{trial.agent}: committed")

        with core.observe(sweep.sweep_id, core.Observer(on_say=on_say, on_node=on_node, on_commit=on_commit)):
            flow_run_id = _run_demo_sweep(sweep, out_dir, no_prefect)
    for agent, result, _ in rows:
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
    if flow_run_id:
        console.print(f"Prefect flow run: {flow_run_id} (sweep flow; trials and their stages are its task runs)")
    console.print(
        f"Lake: {escape(lake_uri)} (sweep {sweep.sweep_id}); try: saasbench query "
        f"\"SELECT agent, deterministic_score FROM trials WHERE sweep_id = '{sweep.sweep_id}'\" --lake {escape(lake_uri)}"
    )
    if len(rows) != len(DEMO_AGENTS):
        raise _fail(f"{len(DEMO_AGENTS) - len(rows)} demo trial(s) did not commit a result (see the log above)")


def _run_demo_sweep(sweep: Any, out_dir: Path, no_prefect: bool) -> str | None:
    """The demo's sweep through the trial flow (embedded Prefect) or, with --no-prefect, in this process."""
    from saasbench.runs import sweep as core

    if no_prefect:
        core.run_sweep_plain(sweep, workers=1)
        core.aggregate(sweep, report_dir=out_dir)
        return None
    from saasbench.cli.sweep import prefect_env

    prefect_env()
    from saasbench.flows.sweep import sweep_flow

    state = sweep_flow(spec=sweep.model_dump(mode="json"), report_dir=str(out_dir), return_state=True)
    state.result()  # raises what failed the flow
    return str(state.state_details.flow_run_id)


def spec_nodes(task) -> list:
    from saasbench.dag import load_dag

    return load_dag(task.dag_path).dag.nodes
