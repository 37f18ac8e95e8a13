"""The ``saasbench`` command line (typer + rich).

Only typer and rich are imported at module load; everything heavy (the DAG loader, the engine,
httpx, the primitives) is imported inside the command that needs it, so ``saasbench --help``
answers at once.

Exit codes: 0 the command did its job (an evaluation that ran exits 0 whatever the score);
1 ``dag check``/``dag plan`` found errors in a DAG; 2 the command could not run (bad DAG,
unreadable auth profile, missing workspace, bad option); 3 ``evaluate --require-up`` found
the app down.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections import Counter
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from saasbench import settings
from saasbench.cli.common import EXIT_CANNOT_RUN
from saasbench.cli.common import console as _console
from saasbench.cli.common import err_console as _err_console
from saasbench.cli.common import fail as _fail

if TYPE_CHECKING:
    from saasbench.dag import Issue, LoadResult
    from saasbench.evaluation.results import RunReport

EXIT_DAG_ERRORS = 1
EXIT_APP_DOWN = 3

app = typer.Typer(
    name="saasbench",
    help="Run the SaaSBench benchmark: check validation DAGs and score a running SaaS app with them.\n\n"
    "Example: saasbench demo",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
dag_app = typer.Typer(
    help="Check and plan validation DAGs.\n\nExample: saasbench dag check path/to/dag.json", no_args_is_help=True
)
primitives_app = typer.Typer(
    help="The validation primitives of this build.\n\nExample: saasbench primitives list", no_args_is_help=True
)
app.add_typer(dag_app, name="dag")
app.add_typer(primitives_app, name="primitives")


@app.command()
def query(
    sql: Annotated[
        str,
        typer.Argument(
            help="SQL over the lake's views: sweeps, trials, node_results, step_results, judge_calls, env_builds, trajectory_events, reference_validations"
        ),
    ],
    lake: Annotated[
        Optional[str],
        typer.Option(
            "--lake",
            help="Lake URI: a folder, file:///..., or s3://bucket/prefix (default $SAASBENCH_LAKE or runs/lake)",
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    sweep: Annotated[Optional[str], typer.Option("--sweep", help="Read only this sweep's files")] = None,
) -> None:
    """Run SQL over the results lake with DuckDB.

    Example: saasbench query "SELECT agent, avg(deterministic_score) FROM trials GROUP BY 1"
    """
    if fmt not in ("table", "csv", "json"):
        raise _fail("--format must be table, csv or json")
    from saasbench.lake.query import query_cmd

    code = query_cmd(sql, lake, fmt, sweep_id=sweep)  # type: ignore[arg-type]
    if code:
        raise typer.Exit(code)


agents_app = typer.Typer(help="Agent adapters.\n\nExample: saasbench agents list", no_args_is_help=True)
app.add_typer(agents_app, name="agents")


@agents_app.command("list")
def agents_list() -> None:
    """List the registered agents (name, version, description); custom ones load by module:Class.

    Example: saasbench agents list
    """
    from saasbench.agents.base import list_agents

    table = Table(show_edge=False)
    for col in ("agent", "version", "description"):
        table.add_column(col)
    for name, cls in sorted(list_agents().items()):
        doc = (cls.__doc__ or "").strip().splitlines()
        table.add_row(name, str(getattr(cls, "version", "")), doc[0] if doc else "")
    _console().print(table)


def _register_task_commands() -> None:
    """tasks list/show/import and validate-reference live in cli_tasks (imports stay light)."""
    from saasbench.cli.env import env_app
    from saasbench.cli.flows import run_cmd, sweep_cmd
    from saasbench.cli.lake import compare_cmd, lake_app, report_cmd
    from saasbench.cli.rollout import rollout_cmd
    from saasbench.cli.tasks import tasks_app, validate_reference_cmd

    app.add_typer(tasks_app, name="tasks")
    app.command("report")(report_cmd)
    app.command("run")(run_cmd)
    app.command("rollout")(rollout_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("compare")(compare_cmd)
    app.add_typer(lake_app, name="lake")
    app.add_typer(env_app, name="env")
    app.command("validate-reference")(validate_reference_cmd)


_register_task_commands()


class Compat(str, Enum):
    strict = "strict"
    reference = "reference"


# --- shared helpers --------------------------------------------------------------------------------
def _issue_line(issue: "Issue", *, with_file: bool = False) -> str:
    where = []
    if with_file:
        where.append(issue.file)
    if issue.node:
        where.append(f"node {issue.node}")
    if issue.field:
        where.append(f"field {issue.field}")
    return (", ".join(where) + ": " if where else "") + issue.message


def _fmt_num(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:g}{suffix}" if float(value).is_integer() else f"{value:.2f}{suffix}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def _timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _fresh_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... when it already exists (two runs in one second)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _dag_summary(result: "LoadResult") -> dict[str, Any]:
    """Counts ``dag check`` prints and ``--json`` returns for a DAG that loaded."""
    from saasbench.primitives.registry import REGISTRY

    dag = result.dag
    methods = Counter(n.method for n in dag.nodes)
    codes = Counter(s.type for n in dag.nodes for s in n.steps)
    categories = Counter(n.scoring.category for n in dag.nodes)
    unavailable = {}
    for code in sorted(codes):
        spec = REGISTRY.spec(code)
        if spec is not None and spec.status != "available":
            unavailable[code] = spec.status
    return {
        "file": dag.source,
        "ok": True,
        "task_id": dag.meta.get("task_id"),
        "nodes": len(dag.nodes),
        "max_score": dag.total_max_score,
        "methods": dict(methods.most_common()),
        "primitives": dict(sorted(codes.items(), key=lambda kv: (-kv[1], kv[0]))),
        "categories": len(categories),
        "category_counts": dict(categories.most_common()),
        "run_last": [n.id for n in dag.nodes if n.run_last],
        "unavailable_primitives": unavailable,
        "errors": [],
        "warnings": [i.model_dump() for i in result.warnings],
        "normalisations": [i.model_dump() for i in result.normalisations],
    }


def _load_dag_or_exit(path: Path, code: int):
    """Load a DAG for a command that needs one; print every error and exit ``code`` on failure."""
    from saasbench.dag import DagLoadError, load_dag

    try:
        return load_dag(path)
    except DagLoadError as exc:
        err = _err_console()
        for issue in exc.issues:
            err.print(f"  [red]error[/] {escape(_issue_line(issue, with_file=True))}")
        first = exc.issues[0] if exc.issues else None
        more = f" (+{len(exc.issues) - 1} more)" if len(exc.issues) > 1 else ""
        raise _fail(f"cannot load DAG {path}: {_issue_line(first) if first else 'unknown error'}{more}", code) from None


def render_summary(
    console: Console, report: "RunReport", report_path: Path | None = None, *, max_failures: int = 10
) -> None:
    """Print the score lines, status counts, per-category table and report path of one run."""
    s = report.summary
    counts = {k: v for k, v in s.counts.model_dump().items() if v}
    console.print()
    title = report.task_id or Path(report.dag).stem
    console.print(f"[bold]{escape(title)}[/]  [dim]{escape(report.base_url or '')} compat={report.compat}[/]")
    console.print(
        f"  Task score          [bold]{_fmt_num(s.task_score)}[/] / 100   ({_fmt_num(s.score)} of {_fmt_num(s.max_score)} points)"
    )
    console.print(f"  Deterministic score {_fmt_num(s.deterministic_score)}")
    passed = s.counts.PASSED
    console.print(f"  Node coverage       {_fmt_num(s.node_coverage, '%')}   ({passed}/{s.total_nodes} nodes PASSED)")
    console.print("  Statuses            " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "none"))
    if s.skipped_llm_max_score:
        console.print(
            f"  [yellow]Judge skipped: {_fmt_num(s.skipped_llm_max_score)} points left out of the denominator[/]"
        )
    if report.quarantined:
        console.print(f"  Quarantined         {escape(', '.join(report.quarantined))}")
    console.print(f"  Elapsed             {s.elapsed_s:.1f}s")

    if report.categories:
        table = Table(title="Per category", title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("category", no_wrap=True)
        table.add_column("nodes", justify="right")
        table.add_column("score", justify="right")
        table.add_column("max", justify="right")
        table.add_column("%", justify="right")
        table.add_column("passed", justify="right")
        for name, agg in sorted(report.categories.items()):
            table.add_row(
                escape(name),
                str(agg.nodes),
                _fmt_num(agg.score),
                _fmt_num(agg.max_score),
                _fmt_num(agg.percent),
                str(agg.counts.PASSED),
            )
        console.print()
        console.print(table)

    # FAILED and ERROR nodes with their messages; skipped nodes only as counts (their cause is listed)
    broken = [n for n in report.nodes if n.status.value in ("FAILED", "ERROR")]
    if broken and max_failures > 0:
        table = Table(title="Failed and errored nodes", title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("node", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("message", overflow="fold")
        for n in broken[:max_failures]:
            message = n.message if len(n.message) <= 160 else n.message[:157] + "..."
            table.add_row(escape(n.id), n.status.value, escape(message))
        console.print()
        console.print(table)
        if len(broken) > max_failures:
            console.print(f"  [dim]... and {len(broken) - max_failures} more (see the report)[/]")
    skipped = s.counts.SKIPPED_DEPENDENCY
    if skipped:
        console.print(f"  [dim]{skipped} node(s) SKIPPED_DEPENDENCY: a prerequisite did not pass[/]")
    if report_path is not None:
        console.print()
        console.print(f"Report: [bold]{escape(str(report_path))}[/]")


# --- dag check / plan ------------------------------------------------------------------------------
@dag_app.command("check")
def dag_check(
    paths: Annotated[
        list[Path], typer.Argument(help="DAG files (dag.json) to check", metavar="PATH...", show_default=False)
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary instead")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every normalisation applied")] = False,
) -> None:
    """Load DAGs and report their shape, warnings and errors.

    Per file: node count, sum of maxScore, methods, primitive codes, categories, warnings and normalisations. Exit code 1 if any file has errors; warnings alone exit 0.

    Example: saasbench dag check path/to/dag.json other/dag.json --verbose
    """
    from saasbench.dag import DagLoadError, load_dag

    summaries: list[dict[str, Any]] = []
    for path in paths:
        try:
            summaries.append(_dag_summary(load_dag(path)))
        except DagLoadError as exc:
            summaries.append({"file": str(path), "ok": False, "errors": [i.model_dump() for i in exc.issues]})
    ok = all(s["ok"] for s in summaries)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "files": summaries}, indent=2, default=str))
        raise typer.Exit(0 if ok else EXIT_DAG_ERRORS)

    from saasbench.dag import Issue

    console = _console()
    for s in summaries:
        if not s["ok"]:
            console.print(f"[bold red]FAIL[/] {escape(s['file'])}: {len(s['errors'])} error(s)")
            for e in s["errors"]:
                console.print(f"  [red]error[/] {escape(_issue_line(Issue(**e), with_file=True))}")
            continue
        warnings, norms = s["warnings"], s["normalisations"]
        state = f"[yellow]{len(warnings)} warning(s)[/]" if warnings else "[green]ok[/]"
        console.print(f"[bold green]OK[/] {escape(s['file'])}: {state}")
        task = f"   task {escape(str(s['task_id']))}" if s.get("task_id") else ""
        console.print(
            f"  nodes {s['nodes']}   maxScore {_fmt_num(s['max_score'])}   categories {s['categories']}{task}"
        )
        console.print("  methods     " + ", ".join(f"{k} {v}" for k, v in s["methods"].items()))
        console.print("  primitives  " + ", ".join(f"{k} {v}" for k, v in s["primitives"].items()))
        if s["run_last"]:
            console.print("  run last    " + escape(", ".join(s["run_last"])))
        if s["unavailable_primitives"]:
            listed = ", ".join(f"{k} ({v})" for k, v in s["unavailable_primitives"].items())
            console.print(f"  [yellow]not available in this build[/] {listed}: nodes using them end in ERROR")
        hint = "" if verbose or not norms else " (--verbose lists them)"
        console.print(f"  normalisations {len(norms)}{hint}")
        if verbose:
            for n in norms:
                console.print(f"    [dim]-[/] {escape(_issue_line(Issue(**n)))}")
        if warnings:
            console.print(f"  warnings {len(warnings)}")
            for w in warnings:
                console.print(f"    [yellow]-[/] {escape(_issue_line(Issue(**w)))}")
    if len(summaries) > 1:
        bad = sum(1 for s in summaries if not s["ok"])
        console.print(f"\n{len(summaries)} file(s) checked, {bad} with errors")
    raise typer.Exit(0 if ok else EXIT_DAG_ERRORS)


@dag_app.command("plan")
def dag_plan(
    path: Annotated[Path, typer.Argument(help="DAG file", metavar="PATH", show_default=False)],
    only: Annotated[
        Optional[list[str]],
        typer.Option("--only", metavar="NODE", help="Plan only these node ids (and their prerequisites)"),
    ] = None,
    category: Annotated[
        Optional[list[str]],
        typer.Option("--category", metavar="CAT", help="Plan only nodes of these categories (and their prerequisites)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the order as JSON")] = False,
    compat: Annotated[
        Compat,
        typer.Option("--compat", help="strict (ties in file order), or reference (the reference harness's FIFO Kahn)"),
    ] = Compat.strict,
) -> None:
    """Print the execution order: index, id, category, method, maxScore, prerequisites.

    Order is a stable topological sort (ties keep file order; with --compat reference, the
    reference harness's FIFO Kahn over file order, as `evaluate --compat reference` runs it);
    run_last nodes come at the end.

    Example: saasbench dag plan path/to/dag.json --category Authentication
    """
    from saasbench.dag import execution_order
    from saasbench.evaluation.engine import select_nodes, tie_order

    result = _load_dag_or_exit(path, EXIT_DAG_ERRORS)
    try:
        nodes = execution_order(select_nodes(result.dag, only or [], category or []), ties=tie_order(compat.value))
    except KeyError as exc:
        raise _fail(str(exc.args[0]) if exc.args else str(exc)) from None
    rows = [
        {
            "index": i,
            "id": n.id,
            "category": n.scoring.category,
            "method": n.method,
            "maxScore": n.max_score,
            "prereqs": n.prereqs,
            "run_last": n.run_last,
        }
        for i, n in enumerate(nodes, 1)
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        title=f"Execution order of {escape(str(path))}", title_justify="left", show_edge=False, pad_edge=False
    )
    table.add_column("#", justify="right")
    table.add_column("id", no_wrap=True)
    table.add_column("category")
    table.add_column("method", no_wrap=True)
    table.add_column("maxScore", justify="right")
    table.add_column("prereqs", overflow="fold")
    table.add_column("last", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r["index"]),
            escape(r["id"]),
            escape(r["category"]),
            r["method"],
            _fmt_num(r["maxScore"]),
            escape(", ".join(r["prereqs"])),
            "run_last" if r["run_last"] else "",
        )
    console = _console()
    console.print(table)
    console.print(f"{len(rows)} node(s), maxScore {_fmt_num(sum(r['maxScore'] for r in rows))}")


# --- evaluate ----------------------------------------------------------------------------------------
def _parse_vars(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name.strip()):
            raise _fail(f"--var {item!r}: expected NAME=VALUE")
        out[name.strip()] = value
    return out


def _read_quarantine(path: Path) -> set[str]:
    """Node ids to quarantine: one per line (``#`` comments allowed) or a JSON list."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot read quarantine file {path}: {exc.strerror or exc}") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _fail(f"quarantine file {path}: invalid JSON: {exc.msg}") from None
        return {str(x) for x in data}
    return {line.split("#", 1)[0].strip() for line in text.splitlines()} - {""}


def probe(base_url: str, timeout_s: float = 3.0) -> str | None:
    """GET the base URL; None if anything answered (any status), else why not."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            client.get(base_url)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


def _exec_target_or_exit(spec: str | None, env: dict[str, str], env_file: Path | None):
    """``--exec``/``--exec-env``/``--exec-env-file`` -> (target or None, variables); exit 2 when unusable.

    The env file's ``$VAR`` expand against its earlier lines, then the target's base environment
    (the host's for ``local:``, the container's for ``docker:``); ``--exec-env`` values are literal
    and win."""
    from saasbench.environments.exec_target import ExecTargetError, make_exec_target, parse_env_file

    target = None
    try:
        if spec is not None:
            target = make_exec_target(spec)
        variables = parse_env_file(env_file, target.base_env() if target is not None else {}) if env_file else {}
    except ExecTargetError as exc:
        if target is not None:
            target.close()
        raise _fail(str(exc)) from None
    variables.update(env)
    return target, variables


def run_evaluation(
    *,
    dag_path: Path,
    base_url: str,
    workspace: Path | None = None,
    auth: Path | None = None,
    only: list[str] | None = None,
    categories: list[str] | None = None,
    out_dir: Path | None = None,
    out_prefix: str | None = None,
    compat: str = "strict",
    node_timeout: float = 120.0,
    http_timeout: float = 30.0,
    max_response_bytes: int = 5 * 1024 * 1024,
    variables: dict[str, str] | None = None,
    dry_run: bool = False,
    quarantine: set[str] | None = None,
    require_up: bool = False,
    db_dsn: str | None = None,
    judge_model: str | None = None,
    judge_api_base: str | None = None,
    judge_api_key_env: str | None = None,
    judge_cache_dir: Path | None = None,
    judge_votes: int = 1,
    exec_spec: str | None = None,
    exec_env: dict[str, str] | None = None,
    exec_env_file: Path | None = None,
    console: Console | None = None,
) -> tuple["RunReport", Path]:
    """Load, check, run and write ``report.json``; raises ``typer.Exit`` when it cannot run."""
    from urllib.parse import urlsplit

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from saasbench.dag import execution_order
    from saasbench.evaluation.context import RunOptions, Target
    from saasbench.evaluation.engine import EngineOptions, select_nodes, tie_order
    from saasbench.evaluation.evaluate import evaluate
    from saasbench.services.auth import AuthProfileError, load_auth_profile

    console = console or _console()
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _fail(f"--base-url {base_url!r} is not an http(s) URL")
    if node_timeout <= 0 or http_timeout <= 0 or max_response_bytes <= 0:
        raise _fail("--node-timeout, --http-timeout and --max-response-bytes must be positive")
    if workspace is not None and not workspace.is_dir():
        raise _fail(f"workspace {workspace} does not exist or is not a directory")
    result = _load_dag_or_exit(dag_path, EXIT_CANNOT_RUN)
    dag = result.dag
    profile = None
    if auth is not None:
        try:
            profile = load_auth_profile(auth)
        except AuthProfileError as exc:
            raise _fail(str(exc)) from None
    try:
        selected = execution_order(select_nodes(dag, only or [], categories or []), ties=tie_order(compat))
    except KeyError as exc:
        raise _fail(str(exc.args[0]) if exc.args else str(exc)) from None
    quarantine = set(quarantine or ())
    unknown_q = sorted(quarantine - {n.id for n in dag.nodes})
    if unknown_q:
        _err_console().print(f"[yellow]warning:[/] quarantine names unknown node(s): {escape(', '.join(unknown_q))}")

    if not dry_run:
        down = probe(base_url, timeout_s=min(3.0, http_timeout))
        if down is not None:
            if require_up:
                raise _fail(f"the app at {base_url} does not answer ({down})", EXIT_APP_DOWN)
            _err_console().print(
                f"[yellow]warning:[/] the app at {escape(base_url)} does not answer ({escape(down)}); "
                "running anyway, nodes that need it will fail"
            )

    label = _slug(str(dag.meta.get("task_id") or dag_path.stem))
    if out_dir is None:
        name = f"{out_prefix}{_timestamp()}" if out_prefix else f"{_timestamp()}-{label}"
        out_dir = _fresh_dir(Path("runs") / name)
    try:  # fail now, not after a long run
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot create output folder {out_dir}: {exc.strerror or exc}") from None
    judge = None
    if judge_model:
        from pydantic import ValidationError

        from saasbench.services.judge import Judge, JudgeConfig

        try:
            judge = Judge(
                JudgeConfig(
                    model=judge_model,
                    api_base=judge_api_base,
                    api_key_env=judge_api_key_env,
                    cache_dir=judge_cache_dir,
                    votes=judge_votes,
                )
            )
        except ValidationError as exc:
            raise _fail("invalid judge settings: " + "; ".join(e["msg"] for e in exc.errors())) from None
    exec_target, exec_vars = _exec_target_or_exit(exec_spec, exec_env or {}, exec_env_file)  # before the run: exit 2
    target = Target(
        base_url=base_url,
        workspace=workspace.resolve() if workspace else None,
        db_dsn=db_dsn,
        task_id=dag.meta.get("task_id"),
        exec_target=exec_target,
        exec_env=exec_vars,
    )
    options = RunOptions(
        compat=compat, node_timeout_s=node_timeout, http_timeout_s=http_timeout, max_response_bytes=max_response_bytes
    )
    engine_options = EngineOptions(
        only=list(only or []), categories=list(categories or []), dry_run=dry_run, quarantine=quarantine
    )
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("evaluating", total=len(selected))

        def tick(node_result) -> None:
            progress.update(task, advance=1, description=f"{node_result.id} {node_result.status.value}")

        try:
            report = evaluate(
                dag,
                target,
                options=options,
                auth_profile=profile,
                variables=variables,
                judge=judge,
                engine_options=engine_options,
                on_node=tick,
            )
        finally:
            if exec_target is not None:
                exec_target.close()
        progress.update(task, description=f"done: {len(selected)} node(s)")
    report_path = out_dir / "report.json"
    report_path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    return report, report_path


@app.command()
def evaluate(
    dag: Annotated[Path, typer.Option("--dag", help="Validation DAG (dag.json)", show_default=False)],
    base_url: Annotated[
        str,
        typer.Option("--base-url", help="Base URL of the running app, e.g. http://127.0.0.1:8000", show_default=False),
    ],
    workspace: Annotated[
        Optional[Path], typer.Option("--workspace", help="The app's source folder, for file primitives P01-P03")
    ] = None,
    auth: Annotated[
        Optional[Path], typer.Option("--auth", help="Auth profile (auth.yaml or a task.yaml with an auth block)")
    ] = None,
    only: Annotated[
        Optional[list[str]],
        typer.Option("--only", metavar="NODE", help="Run only this node id and its prerequisites (repeatable)"),
    ] = None,
    category: Annotated[
        Optional[list[str]],
        typer.Option("--category", metavar="CAT", help="Run only this category and prerequisites (repeatable)"),
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Output folder; default runs/<timestamp>-<task or DAG name>")
    ] = None,
    compat: Annotated[
        Compat, typer.Option("--compat", help="strict, or reference: the reference harness's inclusive rules")
    ] = Compat.strict,
    node_timeout: Annotated[float, typer.Option("--node-timeout", help="Seconds per node")] = 120.0,
    http_timeout: Annotated[float, typer.Option("--http-timeout", help="Seconds per HTTP request")] = 30.0,
    max_response_bytes: Annotated[int, typer.Option("--max-response-bytes", help="Cap on one response body")] = 5
    * 1024
    * 1024,
    var: Annotated[
        Optional[list[str]],
        typer.Option("--var", metavar="NAME=VALUE", help="NAME=VALUE placeholder value (repeatable)"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Plan only: every node is DRY_RUN, nothing is sent")
    ] = False,
    quarantine: Annotated[
        Optional[Path],
        typer.Option("--quarantine", help="File of node ids (one per line) run but left out of the score"),
    ] = None,
    require_up: Annotated[
        bool, typer.Option("--require-up", help="Exit 3 if the base URL does not answer, instead of running anyway")
    ] = False,
    db_dsn: Annotated[
        Optional[str],
        typer.Option(
            "--db-dsn", help="App database for P08-P11: postgresql://, sqlite:////abs/path, mysql://, mongodb://"
        ),
    ] = None,
    judge_model: Annotated[
        Optional[str],
        typer.Option("--judge-model", help="litellm model string for P17; without it judge nodes are SKIPPED_LLM"),
    ] = None,
    judge_api_base: Annotated[
        Optional[str],
        typer.Option("--judge-api-base", help="OpenAI-compatible base URL of the judge (a gateway or local server)"),
    ] = None,
    judge_api_key_env: Annotated[
        Optional[str],
        typer.Option("--judge-api-key-env", help="NAME of the environment variable holding the judge's API key"),
    ] = None,
    judge_cache_dir: Annotated[
        Optional[Path],
        typer.Option("--judge-cache-dir", help="Cache judge replies here (keyed by model, prompt and evidence)"),
    ] = None,
    judge_votes: Annotated[
        int, typer.Option("--judge-votes", min=1, help="k independent judge calls; median score, spread recorded")
    ] = 1,
    exec_spec: Annotated[
        Optional[str],
        typer.Option(
            "--exec",
            metavar="local:DIR|docker:CONTAINER",
            help="Where P12/P21 run commands: bash -c in DIR on this host, or docker exec in a running container ($DOCKER_HOST)",
        ),
    ] = None,
    exec_env: Annotated[
        Optional[list[str]],
        typer.Option(
            "--exec-env", metavar="NAME=VALUE", help="A variable for every P12/P21 command (repeatable; literal value)"
        ),
    ] = None,
    exec_env_file: Annotated[
        Optional[Path],
        typer.Option(
            "--exec-env-file",
            help="File of K=V / export K=V lines for P12/P21 commands ($VAR expanded; parsed, not run)",
        ),
    ] = None,
) -> None:
    """Score a running app with a validation DAG and write report.json.

    Exits 0 when the evaluation ran, whatever the score; 2 when it could not run (bad DAG, unreadable auth profile, missing workspace); 3 with --require-up when the app is down.

    Example: saasbench evaluate --dag path/to/dag.json --base-url http://127.0.0.1:8000 --workspace path/to/app --auth path/to/auth.yaml
    """
    variables = _parse_vars(var or [])
    from saasbench.environments.exec_target import ExecTargetError, parse_env_options

    try:
        exec_vars = parse_env_options(exec_env or [])
    except ExecTargetError as exc:
        raise _fail(str(exc)) from None
    q = _read_quarantine(quarantine) if quarantine is not None else set()
    console = _console()
    report, report_path = run_evaluation(
        dag_path=dag,
        base_url=base_url,
        workspace=workspace,
        auth=auth,
        only=only,
        categories=category,
        out_dir=out,
        compat=compat.value,
        node_timeout=node_timeout,
        http_timeout=http_timeout,
        max_response_bytes=max_response_bytes,
        variables=variables,
        dry_run=dry_run,
        quarantine=q,
        require_up=require_up,
        db_dsn=db_dsn,
        judge_model=judge_model,
        judge_api_base=judge_api_base,
        judge_api_key_env=judge_api_key_env,
        judge_cache_dir=judge_cache_dir,
        judge_votes=judge_votes,
        exec_spec=exec_spec,
        exec_env=exec_vars,
        exec_env_file=exec_env_file,
        console=console,
    )
    render_summary(console, report, report_path)


# --- primitives ------------------------------------------------------------------------------------
def _input_fields(spec) -> list[dict[str, Any]]:
    if spec.inputs is None:
        return []
    out = []
    for name, f in spec.inputs.model_fields.items():
        annotation = getattr(f.annotation, "__name__", None) or str(f.annotation).replace("typing.", "")
        out.append(
            {
                "name": name,
                "type": annotation,
                "required": f.is_required(),
                "default": None if f.is_required() else repr(f.get_default(call_default_factory=True)),
                "description": f.description or "",
            }
        )
    return out


@primitives_app.command("list")
def primitives_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print codes, statuses and input fields as JSON")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also describe every input field")] = False,
) -> None:
    """List every primitive code with its group, status (available/pending/reserved) and inputs.

    Example: saasbench primitives list --verbose
    """
    from saasbench.primitives.registry import REGISTRY

    specs = REGISTRY.all()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "code": s.code,
                        "name": s.name,
                        "group": s.group,
                        "status": s.status,
                        "description": s.description,
                        "inputs": _input_fields(s),
                    }
                    for s in specs
                ],
                indent=2,
            )
        )
        return
    colour = {"available": "green", "pending": "yellow", "reserved": "dim"}
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("code", no_wrap=True)
    table.add_column("group", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("name, description and inputs", overflow="fold", ratio=1)
    for s in specs:
        fields = _input_fields(s)
        if verbose:
            inputs = "".join(f"\n  {f['name']}{'*' if f['required'] else ''}: {f['description']}" for f in fields)
        else:
            inputs = " " + ", ".join(f["name"] + ("*" if f["required"] else "") for f in fields) if fields else ""
        text = f"[bold]{escape(s.name)}[/]: {escape(s.description)}"
        if fields:
            text += f"\n[dim]inputs:[/]{escape(inputs)}"
        table.add_row(s.code, s.group, f"[{colour.get(s.status, 'white')}]{s.status}[/]", text)
    console = _console()
    console.print(table)
    by_status = Counter(s.status for s in specs)
    console.print(", ".join(f"{v} {k}" for k, v in sorted(by_status.items())) + "   (* = required input)")


# --- demo / version ------------------------------------------------------------------------------
DEMO_TASK = "timetrack"
DEMO_AGENTS = ("oracle", "nop")


@app.command()
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
    out_dir = out or _fresh_dir(Path("runs") / f"demo-{_timestamp()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    import datetime as dt

    from saasbench import lake as lakelib

    lake_uri = settings.lake_uri(lake)
    store = lakelib.lake_from_uri(lake_uri)
    sweep_id = f"demo-{_timestamp()}"
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
            result = run_local_trial(
                spec,
                agent,
                backend=backend,
                on_node=lambda r, bar=bar, agent=agent: progress.update(
                    bar, advance=1, description=f"{agent}: {r.id} {r.status.value}"
                ),
                say=lambda m, bar=bar: progress.update(bar, description=m, total=len(spec_nodes(spec))),
            )
        report_path = out_dir / agent / "report.json"
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(result.report.model_dump_json(indent=2), encoding="utf-8")
        (out_dir / agent / "trajectory.json").write_text(result.trajectory.model_dump_json(indent=2), encoding="utf-8")
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
            agent, _fmt_num(s.deterministic_score), _fmt_num(s.task_score), _fmt_num(s.node_coverage, "%"), statuses
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


@app.command()
def version() -> None:
    """Print the saasbench version.

    Example: saasbench version
    """
    import platform

    from saasbench import __version__

    typer.echo(f"saasbench {__version__} (Python {platform.python_version()})")


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
