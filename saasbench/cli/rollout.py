"""``saasbench rollout``: run an agent on a task without evaluating it; keep the workspace and the trajectory.

Wiring (in saasbench/cli/main.py)::

    from saasbench.cli.rollout import rollout_cmd
    app.command("rollout")(rollout_cmd)

The core is :func:`saasbench.runs.trial.run_rollout` (the same rollout code path as a full trial). The
output folder (``--out``, default ``runs/rollouts/<task>-<agent>-<timestamp>``) receives the
workspace (``workspace/``), the trajectory (``trajectory.json``, ``events.jsonl``), the prompt,
a CLI agent's raw event stream (``agent/``) and ``rollout.json``; the command prints the two
commands that start the app from that workspace and score it with ``saasbench evaluate``.

``--lake URI`` also records the rollout in the results lake as one trial of the sweep
``--sweep-id`` (default ``rollout-<task>-<agent>``): a ``trials`` row whose outcome is the
rollout's (the trajectory's exit reason, or ``voided_cheat``), its ``trajectory_events`` (with the
anti-cheat findings as ``anticheat`` events) and no node rows: ``task_score`` and the other scores
are NULL and ``report_uri`` points to ``rollout.json``. Aggregation counts a trial without node
rows as 0, so keep rollout sweeps apart from the sweeps you report on (the default sweep id does).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from saasbench import settings
from saasbench.cli.common import fail as _fail

_QUIET_KINDS = frozenset({"message", "tool_result", "usage"})


def _short(text: Any, limit: int = 110) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProgressPrinter:
    """One line per agent step (tool call) plus model turns, retries, errors and anti-cheat findings."""

    def __init__(self, console: Console):
        self.console = console
        self.tool_calls = 0

    def __call__(self, ev: Any) -> None:
        kind, data = ev.kind, ev.data or {}
        if kind in _QUIET_KINDS:
            return
        stamp = f"[dim]{ev.t_s:8.1f}s[/dim]"
        if kind == "tool_call":
            self.tool_calls += 1
            tool = data.get("tool") or "tool"
            raw_args = data.get("args")
            args = raw_args if isinstance(raw_args, dict) else {}
            what = ev.message or args.get("command") or args.get("path") or args.get("file_path") or ""
            self.console.print(
                f"{stamp} step {self.tool_calls:>3} [bold]{escape(str(tool))}[/bold] {escape(_short(what))}",
                highlight=False,
            )
        elif kind == "model_call":
            self.console.print(
                f"{stamp} [dim]model turn {data.get('step', '?')}: {data.get('tokens_in', 0)} in / "
                f"{data.get('tokens_out', 0)} out, {data.get('latency_ms', 0):.0f} ms[/dim]",
                highlight=False,
            )
        elif kind == "anticheat":
            colour = "red" if data.get("severity") == "void" else "yellow"
            self.console.print(
                f"{stamp} [{colour}]anti-cheat {escape(str(data.get('rule')))} ({data.get('severity')})"
                f"[/{colour}]: {escape(_short(ev.message, 200))}",
                highlight=False,
            )
        elif kind in ("error", "retry"):
            colour = "red" if kind == "error" else "yellow"
            self.console.print(
                f"{stamp} [{colour}]{kind}[/{colour}] {escape(_short(ev.message, 200))}", highlight=False
            )
        else:  # note, file_write, ...
            self.console.print(f"{stamp} [dim]{escape(kind)}: {escape(_short(ev.message))}[/dim]", highlight=False)


def _summary(console: Console, ro: Any) -> None:
    traj = ro.trajectory
    table = Table(title=f"Rollout: task {ro.task_id}, agent {ro.agent}", show_header=False, show_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    colour = "green" if ro.outcome == "completed" else "red"
    rows = [
        ("outcome", f"[{colour}]{ro.outcome}[/{colour}]"),
        ("exit reason", escape(str(traj.exit_reason))),
        ("model", escape(str(traj.model or "-"))),
        ("steps", f"{traj.steps} (budget {ro.budget.steps})"),
        ("tokens in / out", f"{traj.tokens_in} / {traj.tokens_out}"),
        ("cost", f"${traj.cost_usd:.6f}"),
        ("wall time", f"{traj.wall_s:.1f}s (budget {ro.budget.wall_s:g}s, {ro.budget.tool_call_s:g}s per tool call)"),
    ]
    if traj.error:
        rows.append(("error", escape(_short(traj.error, 500))))
    findings = ro.findings
    if findings:
        rows.append(
            (
                "anti-cheat",
                escape("; ".join(f"{f['rule']} ({f['severity']}): {_short(f['evidence'], 120)}" for f in findings)),
            )
        )
    else:
        rows.append(("anti-cheat", "no findings"))
    out = Path(ro.out_dir)
    rows += [
        ("workspace", escape(ro.workspace)),
        ("trajectory", escape(str(out / "events.jsonl"))),
        ("rollout record", escape(str(out / "rollout.json"))),
    ]
    if ro.artefacts.get("events"):
        rows.append(("raw stream", escape(ro.artefacts["events"])))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


def _follow_up(console: Console, ro: Any) -> None:
    f = ro.follow_up
    console.print("\nNot evaluated. To score this workspace later, start the app from it, then run saasbench evaluate:")
    if f.get("start_shell"):
        console.print(f"  ({f['start_shell']}) &", markup=False, highlight=False, soft_wrap=True)
        console.print(f"  # wait until {f['health_url']} answers", markup=False, highlight=False)
    else:
        console.print("  # the task has no start command: start the app as the agent left it", markup=False)
    console.print("  " + f["evaluate_shell"], markup=False, highlight=False, soft_wrap=True)
    console.print(
        "  # --exec local:<workspace> runs the DAG's P12/P21 commands in the workspace with the app's variables",
        markup=False,
    )
    if "--db-dsn" not in f.get("evaluate_argv", []):
        console.print("  # add --db-dsn for the task's database if its DAG reads it", markup=False)
    if ro.backend == "docker":
        console.print("  # (the agent worked in a container; these commands run the app on this host)", markup=False)


def _record(lake: str, sweep_id: str | None, task: Any, ro: Any, model: str | None) -> tuple[str, str]:
    from saasbench import lake as lakelib
    from saasbench.runs.sweep import id_part

    sweep = sweep_id or f"rollout-{id_part(task.id)}-{id_part(ro.agent)}"
    stamp = (ro.started_at or _dt.datetime.now(_dt.UTC)).strftime("%Y%m%dT%H%M%S%f")
    trial_id = f"{id_part(task.id)}.{id_part(ro.agent)}.{id_part(model or ro.trajectory.model)}.{stamp}"
    lakelib.check_id(sweep, "sweep_id")
    store = lakelib.lake_from_uri(lake)
    lakelib.write_sweep(
        store,
        lakelib.sweep_row(
            sweep,
            name="saasbench rollout",
            tasks=[task.id],
            agents=[ro.agent],
            models=[m for m in [model] if m],
            attempts=1,
            config={"kind": "rollout", "evaluated": False, "backend": ro.backend, "budget": ro.budget.model_dump()},
        ),
    )
    detail = ro.outcome_detail or f"rollout only, not evaluated (workspace {ro.workspace})"
    rows = lakelib.from_trial_result(
        ro,
        sweep_id=sweep,
        trial_id=trial_id,
        task=task,
        model=model,
        outcome_detail=detail,
        started_at=ro.started_at,
        ended_at=ro.ended_at,
        report_uri=str(Path(ro.out_dir) / "rollout.json"),
    )
    lakelib.write_trial(store, rows)
    return sweep, trial_id


def rollout_cmd(
    task: Annotated[str, typer.Argument(help="Task id or folder")],
    agent: Annotated[
        str,
        typer.Option(
            "--agent", help="Agent name (builtin, claude-code, codex, openhands, oracle, nop) or module:Class"
        ),
    ],
    model: Annotated[
        str | None, typer.Option("--model", help="Model for LLM agents (a litellm model string for builtin)")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="local or docker")] = "local",
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Step budget (default: the task's, 500)")
    ] = None,
    wall_s: Annotated[
        float | None,
        typer.Option("--wall-s", min=0.001, help="Wall-clock budget in seconds (default: the task's agent_s)"),
    ] = None,
    tool_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--tool-timeout-s", min=0.001, help="Limit of one tool call in seconds (default: the task's, 900)"
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder; default runs/rollouts/<task>-<agent>-<timestamp>")
    ] = None,
    lake: Annotated[
        str | None,
        typer.Option("--lake", help="Also record the rollout (trial row + trajectory_events, no scores) in this lake"),
    ] = None,
    sweep_id: Annotated[
        str | None, typer.Option("--sweep-id", help="Sweep id for --lake (default rollout-<task>-<agent>)")
    ] = None,
) -> None:
    """Run an agent on a task within its budget, without evaluating; keep the workspace and the trajectory.

    Prints a line per agent step and a summary (outcome, steps, tokens, cost, wall time, anti-cheat
    findings), writes workspace/, trajectory.json, events.jsonl, prompt.md, agent/ (raw stream) and
    rollout.json to the output folder, and prints the commands that score the workspace later.
    Exits 0 when the rollout ran (whatever its outcome), 2 when it could not run.

    Example: saasbench rollout timetrack --agent builtin --model openai/gpt-4o-mini --max-steps 50
    """
    from saasbench.agents import AgentNotFound
    from saasbench.catalog.tasks import TaskError, load_task
    from saasbench.environments import check_backend
    from saasbench.runs.trial import resolve_agent, run_rollout, task_budget

    try:
        check_backend(backend)
    except ValueError as exc:
        raise _fail(f"--backend: {exc}") from None
    try:
        spec = load_task(task)
    except (TaskError, OSError, ValueError) as exc:
        raise _fail(f"cannot load task {task!r}: {exc}") from None
    try:
        the_agent = resolve_agent(agent, model)
    except (AgentNotFound, TypeError, ValueError) as exc:
        raise _fail(str(exc)) from None
    try:
        budget = task_budget(spec, steps=max_steps, wall_s=wall_s, tool_call_s=tool_timeout_s)
    except ValueError as exc:
        raise _fail(f"invalid budget: {exc}") from None
    if lake is not None and sweep_id is not None:
        from saasbench.lake import check_id

        try:
            check_id(sweep_id, "sweep_id")
        except ValueError as exc:
            raise _fail(str(exc)) from None
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out if out is not None else Path("runs") / "rollouts" / f"{spec.id}-{the_agent.name}-{stamp}"
    console = Console()
    console.print(
        f"rollout of [bold]{escape(the_agent.name)}[/bold] on task [bold]{escape(spec.id)}[/bold] "
        f"({backend} backend{', model ' + escape(model) if model else ''}) -> {escape(str(out_dir))}"
    )
    try:
        ro = run_rollout(
            spec,
            the_agent,
            out_dir=out_dir,
            backend=backend,
            budget=budget,
            model=model,
            say=lambda m: console.print(f"[dim]{escape(m)}[/dim]", highlight=False),
            on_event=ProgressPrinter(console),
        )
    except FileExistsError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:  # environment or agent install failure: report, exit 2 (anything else is a bug: raise)
        from saasbench.environments.base import EnvError
        from saasbench.failures import HarnessError

        if isinstance(exc, (HarnessError, EnvError, OSError, RuntimeError)):  # RuntimeError: AgentInstallError
            raise _fail(f"the rollout could not run: {type(exc).__name__}: {exc}") from None
        raise
    console.print()
    _summary(console, ro)
    _follow_up(console, ro)
    if lake is not None:
        uri = settings.lake_uri(lake)
        sweep, trial_id = _record(uri, sweep_id, spec, ro, model)
        console.print(
            f"\nLake: {escape(uri)}, sweep {escape(sweep)}, trial {escape(trial_id)} "
            f"(outcome {ro.outcome}, trajectory_events only; no node rows)"
        )
