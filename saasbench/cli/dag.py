"""``saasbench dag check`` and ``saasbench dag plan``, and the DAG loading the other commands share.

Heavy imports (the DAG loader, the engine, the primitive registry) happen inside the commands.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import EXIT_NOT_VALID, Compat, fmt_num
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail

if TYPE_CHECKING:
    from saasbench.dag import Issue, LoadResult

EXIT_DAG_ERRORS = EXIT_NOT_VALID

dag_app = typer.Typer(
    help="Check and plan validation DAGs.\n\nExample: saasbench dag check path/to/dag.json", no_args_is_help=True
)


def _issue_line(issue: "Issue", *, with_file: bool = False) -> str:
    where = []
    if with_file:
        where.append(issue.file)
    if issue.node:
        where.append(f"node {issue.node}")
    if issue.field:
        where.append(f"field {issue.field}")
    return (", ".join(where) + ": " if where else "") + issue.message


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


def load_dag_or_exit(path: Path, code: int):
    """Load a DAG for a command that needs one; on failure one error line (the first error, and how many more:
    ``saasbench dag check`` lists them all) and exit ``code``."""
    from saasbench.dag import DagLoadError, load_dag

    try:
        return load_dag(path)
    except DagLoadError as exc:
        first = exc.issues[0] if exc.issues else None
        more = f" (+{len(exc.issues) - 1} more: saasbench dag check {path} lists them)" if len(exc.issues) > 1 else ""
        raise _fail(f"cannot load DAG {path}: {_issue_line(first) if first else 'unknown error'}{more}", code) from None


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
        console.print(f"  nodes {s['nodes']}   maxScore {fmt_num(s['max_score'])}   categories {s['categories']}{task}")
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

    result = load_dag_or_exit(path, EXIT_DAG_ERRORS)
    try:
        nodes = execution_order(select_nodes(result.dag, only or [], category or []), ties=tie_order(compat.value))
    except KeyError as exc:
        raise _fail(str(exc.args[0]) if exc.args else str(exc)) from None
    rows: list[dict[str, Any]] = [
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
            fmt_num(r["maxScore"]),
            escape(", ".join(r["prereqs"])),
            "run_last" if r["run_last"] else "",
        )
    console = _console()
    console.print(table)
    console.print(f"{len(rows)} node(s), maxScore {fmt_num(sum(r['maxScore'] for r in rows))}")
