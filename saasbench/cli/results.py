"""``saasbench query``, ``saasbench report`` and ``saasbench compare``: reading results from the lake.

Plain typer command functions; main.py registers them (``app.command("report")(report_cmd)``).
Heavy imports (DuckDB, the aggregation) happen inside the commands. Every string read from the
lake is escaped before rich sees it (an agent or category name must never be parsed as markup).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from saasbench import settings
from saasbench.cli.common import LakeOption
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail

if TYPE_CHECKING:
    from saasbench.reports.aggregate import CompareReport, SweepReport


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


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def render_report(console: Console, report: SweepReport) -> None:
    """Table 2 (Pass@1, node coverage, six domains) and Table 3 (six backbones) as rich tables."""
    from saasbench.reports.aggregate import DOMAINS, sweeps_label
    from saasbench.reports.backbones import BACKBONES

    domains = list(DOMAINS) + [d for d in report.domains if d not in DOMAINS]
    t2 = Table(title=f"Table 2: main results, {escape(sweeps_label(report.sweeps))} (valid trials)")
    t2.add_column("Agent / model", no_wrap=True)
    for col in ["Pass@1", "Node cov.", *domains]:
        t2.add_column(escape(col), justify="right")
    for c in report.configs:
        v = c.valid
        t2.add_row(
            escape(c.label),
            _n(v.pass_at_1),
            _n(v.node_coverage),
            *[_n(v.domains[d].score) if d in v.domains else "n/a" for d in domains],
        )
    console.print(t2)

    t3 = Table(title="Table 3: engineering capability backbones (valid trials)")
    t3.add_column("Agent / model", no_wrap=True)
    for b in BACKBONES:
        t3.add_column(b, justify="right")
    for c in report.configs:
        t3.add_row(
            escape(c.label), *[_n(c.valid.backbones[b].score) if b in c.valid.backbones else "n/a" for b in BACKBONES]
        )
    console.print(t3)

    outcomes = sorted({o for c in report.configs for o in c.outcome_counts})
    tt = Table(title="Trials: denominators, all-trials score, deterministic subscore, dropped judge maxScore")
    tt.add_column("Agent / model", no_wrap=True)
    for col in ["Valid/all", "Tasks", "Pass@1 (all)", "Determ.", "Judge max dropped", *outcomes]:
        tt.add_column(escape(col), justify="right")
    for c in report.configs:
        tt.add_row(
            escape(c.label),
            f"{c.valid_trials}/{c.all.trials}",
            str(c.valid.tasks),
            _n(c.all.pass_at_1),
            _n(c.valid.deterministic),
            _n(c.valid.skipped_llm_max_score),
            *[str(c.outcome_counts.get(o, 0)) for o in outcomes],
        )
    console.print(tt)

    kmax = max((len(c.valid.pass_at_k) for c in report.configs), default=0)
    if kmax > 1:
        tk = Table(
            title=f"pass@k (a trial passes when its task score >= {report.pass_threshold:g}; unbiased estimator)"
        )
        tk.add_column("Agent / model", no_wrap=True)
        for k in range(1, kmax + 1):
            tk.add_column(f"pass@{k}", justify="right")
        for c in report.configs:
            tk.add_row(escape(c.label), *[_n(c.valid.pass_at_k.get(k)) for k in range(1, kmax + 1)])
        console.print(tk)

    console.print(
        "[dim]Pass@1 = mean over tasks of the task score (mean over attempts first); valid trials exclude "
        "env_error, judge_error, model_error, task_defect; 'all' counts those as 0.[/]"
    )
    if report.unknown_categories:
        console.print(
            f"[yellow]unknown categories[/] (no backbone; {report.unknown_category_nodes} node rows, counted in "
            f"task scores, absent from Table 3): {escape(', '.join(report.unknown_categories))}"
        )
    else:
        console.print("unknown categories: none")
    if report.orphan_node_rows:
        console.print(f"[yellow]{report.orphan_node_rows} node_results row(s) belong to no trials row (not scored)[/]")
    if report.score_mismatches:
        console.print(
            f"[yellow]{len(report.score_mismatches)} trial(s) whose stored task_score differs from the "
            "recomputation from node rows[/]: "
            + escape(
                ", ".join(f"{m.trial_id} ({_n(m.stored)} vs {_n(m.recomputed)})" for m in report.score_mismatches[:10])
            )
        )


def render_compare(console: Console, cmp: CompareReport, *, max_nodes: int = 50) -> None:
    t = Table(
        title=f"Paired task-score differences {escape(cmp.sweep_b)} - {escape(cmp.sweep_a)} "
        f"(valid trials; bootstrap 95% CI, {cmp.resamples} resamples, seed {cmp.seed})"
    )
    t.add_column("Agent / model", no_wrap=True)
    for col in ["Tasks", f"Mean {cmp.sweep_a}", f"Mean {cmp.sweep_b}", "Mean diff", "95% CI"]:
        t.add_column(escape(col), justify="right")
    for c in cmp.configs:
        ci = "n/a" if c.ci_low is None else f"[{_signed(c.ci_low)}, {_signed(c.ci_high)}]"
        t.add_row(
            escape(f"{c.agent or '-'} / {c.model or '-'}"),
            str(c.tasks),
            _n(c.mean_a),
            _n(c.mean_b),
            _signed(c.mean_diff),
            escape(ci),
        )
    console.print(t)
    if cmp.only_in_a or cmp.only_in_b:
        console.print(
            f"only in {escape(cmp.sweep_a)}: {escape(', '.join(cmp.only_in_a) or '-')}; "
            f"only in {escape(cmp.sweep_b)}: {escape(', '.join(cmp.only_in_b) or '-')}"
        )
    nt = Table(title=f"Nodes whose status changed PASSED <-> not PASSED ({len(cmp.node_changes)})")
    for col in ["Agent / model", "Task", "Node", "Category", escape(cmp.sweep_a), escape(cmp.sweep_b), "Change"]:
        nt.add_column(col)
    for ch in cmp.node_changes[:max_nodes]:
        nt.add_row(
            escape(f"{ch.agent or '-'} / {ch.model or '-'}"),
            escape(ch.task_id),
            escape(ch.node_id),
            escape(ch.category or ""),
            escape(ch.status_a),
            escape(ch.status_b),
            "[green]gained[/]" if ch.change == "gained" else "[red]lost[/]",
        )
    console.print(nt)
    if len(cmp.node_changes) > max_nodes:
        console.print(f"... {len(cmp.node_changes) - max_nodes} more (use --max-nodes)")


def report_cmd(
    sweep: Annotated[
        Optional[list[str]],
        typer.Option(
            "--sweep", help="Sweep id to aggregate (repeatable); default: every sweep in the lake", show_default=False
        ),
    ] = None,
    lake: LakeOption = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write a self-contained HTML report here")] = None,
    pass_threshold: Annotated[
        float,
        typer.Option("--pass-threshold", min=0, max=100, help="Task score a trial needs to count as a pass for pass@k"),
    ] = 100.0,
    json_out: Annotated[
        Optional[Path], typer.Option("--json", help="Also write the full aggregation as JSON here")
    ] = None,
) -> None:
    """Print the paper's Table 2 (Pass@1, node coverage, six domains) and Table 3 (six backbones) for a sweep.

    Scores come from the lake's node_rollups (per-trial sums of node_results, in saasbench.evaluation.scoring's
    rules); valid trials exclude infra
    outcomes (env_error, judge_error, model_error, task_defect), whose counts are printed separately.

    Example: saasbench report --sweep sweep-2026-12-01 --lake runs/lake --html runs/report.html
    """
    from saasbench.reports.aggregate import REPORT_TABLES, sweep_report

    lake = settings.lake_uri(lake)
    report: SweepReport | None
    try:
        if sweep:
            report = sweep_report(lake, sweep, pass_threshold=pass_threshold)
        else:  # every sweep, over one connection (one read of the commit markers)
            from saasbench.lake import connect

            con = connect(lake, tables=REPORT_TABLES)
            try:
                sweep = [r[0] for r in con.execute("SELECT DISTINCT sweep_id FROM trials ORDER BY 1").fetchall()]
                report = sweep_report(con, sweep, pass_threshold=pass_threshold) if sweep else None
            finally:
                con.close()
    except Exception as exc:  # noqa: BLE001 - store/DuckDB errors become one line, exit 2
        raise _fail(f"cannot read the lake {lake}: {type(exc).__name__}: {exc}") from None
    if report is None or not report.trials:
        raise _fail(f"no trials of sweep {', '.join(sweep or []) or '(any)'} in the lake {lake}")
    console = _console()
    render_report(console, report)
    if html is not None:
        from saasbench.reports.report_html import write_html

        write_html(report, html)
        console.print(f"HTML report: {escape(str(html))}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report.model_dump_json(indent=1), encoding="utf-8")
        console.print(f"JSON: {escape(str(json_out))}")


def compare_cmd(
    sweep_a: Annotated[str, typer.Argument(help="Baseline sweep id", show_default=False)],
    sweep_b: Annotated[str, typer.Argument(help="Sweep id compared with the baseline", show_default=False)],
    lake: LakeOption = None,
    resamples: Annotated[int, typer.Option("--resamples", min=100, help="Bootstrap resamples")] = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed (fixed: the CI is reproducible)")] = 0,
    max_nodes: Annotated[int, typer.Option("--max-nodes", min=0, help="Changed nodes to print")] = 50,
) -> None:
    """Compare two sweeps: per-task paired differences (B - A) of the task score per agent/model, with a
    bootstrap 95% CI of the mean difference, and the nodes whose status changed PASSED <-> not PASSED.

    Example: saasbench compare sweep-a sweep-b --lake runs/lake
    """
    from saasbench.reports.aggregate import compare

    lake = settings.lake_uri(lake)
    try:
        cmp = compare(lake, sweep_a, sweep_b, resamples=resamples, seed=seed)
    except Exception as exc:  # noqa: BLE001
        raise _fail(f"cannot read the lake {lake}: {type(exc).__name__}: {exc}") from None
    if not cmp.configs and not cmp.only_in_a and not cmp.only_in_b:
        raise _fail(f"no trials of sweep {sweep_a} or {sweep_b} in the lake {lake}")
    render_compare(_console(), cmp, max_nodes=max_nodes)
