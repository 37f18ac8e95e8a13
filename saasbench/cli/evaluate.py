"""``saasbench evaluate``: score a running app with a validation DAG.

``run_evaluation`` is the command's core (load, check, run, write ``report.json``; ``nodes.jsonl``
gets each node result as it is produced, and ``report.json`` is rewritten atomically during the run
with ``"complete": false`` and the nodes so far, so an interrupted run leaves a valid report of what it
scored) and
``render_summary`` prints its result. Heavy imports (httpx, the engine, the judge) happen inside
the functions, so importing this module stays light.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import (
    EXIT_CANNOT_RUN,
    Compat,
    JudgeApiBase,
    JudgeKeyEnv,
    JudgeMaxTokens,
    JudgeModel,
    JudgeTemperature,
    JudgeTimeout,
    JudgeVotes,
    fmt_num,
    fresh_dir,
    judge_options_error,
    judge_tuning,
    slug,
    timestamp,
)
from saasbench.cli.common import console as _console
from saasbench.cli.common import err_console as _err_console
from saasbench.cli.common import fail as _fail
from saasbench.cli.dag import load_dag_or_exit

if TYPE_CHECKING:
    from saasbench.evaluation.results import RunReport

EXIT_APP_DOWN = 3


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
        f"  Task score          [bold]{fmt_num(s.task_score)}[/] / 100   ({fmt_num(s.score)} of {fmt_num(s.max_score)} points)"
    )
    console.print(f"  Deterministic score {fmt_num(s.deterministic_score)}")
    passed = s.counts.PASSED
    console.print(f"  Node coverage       {fmt_num(s.node_coverage, '%')}   ({passed}/{s.total_nodes} nodes PASSED)")
    console.print("  Statuses            " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "none"))
    if s.skipped_llm_max_score:
        console.print(
            f"  [yellow]Judge skipped: {fmt_num(s.skipped_llm_max_score)} points left out of the denominator[/]"
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
                fmt_num(agg.score),
                fmt_num(agg.max_score),
                fmt_num(agg.percent),
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
    judge_votes: int | None = None,
    judge_max_tokens: int | None = None,
    judge_temperature: float | None = None,
    judge_timeout: float | None = None,
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
    tuning = judge_tuning(judge_max_tokens, judge_temperature, judge_timeout, judge_votes)
    if tuning and not judge_model:
        raise _fail(judge_options_error(tuning))
    result = load_dag_or_exit(dag_path, EXIT_CANNOT_RUN)
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

    label = slug(str(dag.meta.get("task_id") or dag_path.stem))
    if out_dir is None:
        name = f"{out_prefix}{timestamp()}" if out_prefix else f"{timestamp()}-{label}"
        out_dir = fresh_dir(Path("runs") / name)
    try:  # fail now, not after a long run
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot create output folder {out_dir}: {exc.strerror or exc}") from None
    judge = None
    if judge_model:
        from pydantic import ValidationError

        from saasbench.cli.common import require_extra

        require_extra("litellm", "judge", "--judge-model (the LLM judge)")

        from saasbench.services.judge import Judge, JudgeConfig

        try:
            judge = Judge(
                JudgeConfig(
                    model=judge_model,
                    api_base=judge_api_base,
                    api_key_env=judge_api_key_env,
                    cache_dir=judge_cache_dir,
                    **tuning,
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
    report_path = out_dir / "report.json"
    partial = _PartialReport(report_path, dag, selected, base_url=base_url, compat=compat, quarantine=quarantine)
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
        # every node result as it is produced (flushed), so an interrupted run leaves what it scored
        nodes_log = open(out_dir / "nodes.jsonl", "w", encoding="utf-8")  # closed in the finally below

        def tick(node_result) -> None:
            nodes_log.write(node_result.model_dump_json() + "\n")
            nodes_log.flush()
            partial.add(node_result)
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
        except BaseException:  # interrupted (Ctrl-C) or failed: report.json keeps every node scored so far
            partial.write()
            raise
        finally:
            nodes_log.close()
            if exec_target is not None:
                exec_target.close()
        progress.update(task, description=f"done: {len(selected)} node(s)")
    report = report.model_copy(update={"complete": True, "nodes_planned": len(selected)})
    write_atomic(report_path, report.model_dump_json(indent=2))
    return report, report_path


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, flushed to disk, then renamed over it,
    so a reader (or a run killed mid-write) never sees a half-written file."""
    import os

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class _PartialReport:
    """report.json while ``evaluate`` runs: rewritten atomically (:func:`write_atomic`) with ``complete: false``
    and the nodes scored so far, after the first node and then at most every ``every_s`` seconds (and once
    more when the run is interrupted), so a run killed at any point leaves a valid, loadable report; the
    final write marks it complete. nodes.jsonl has every node the moment it is scored."""

    def __init__(
        self,
        path: Path,
        dag,
        selected: list,
        *,
        base_url: str,
        compat: str,
        quarantine: set[str],
        every_s: float = 1.0,
    ):
        import datetime as dt
        import time

        self.path, self.dag, self.planned = path, dag, len(selected)
        self.base_url, self.compat, self.quarantine, self.every_s = base_url, compat, quarantine, every_s
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.t0 = time.perf_counter()
        self.nodes: list = []
        self.last: float | None = None

    def add(self, node_result) -> None:
        import time

        self.nodes.append(node_result)
        if self.last is None or time.perf_counter() - self.last >= self.every_s:
            self.write()

    def write(self) -> None:
        import time

        from saasbench.evaluation.engine import build_report

        report = build_report(
            self.dag,
            list(self.nodes),
            started_at=self.started_at,
            elapsed_s=time.perf_counter() - self.t0,
            quarantined=sorted(self.quarantine & {n.id for n in self.nodes}),
        ).model_copy(
            update={"base_url": self.base_url, "compat": self.compat, "complete": False, "nodes_planned": self.planned}
        )
        try:
            write_atomic(self.path, report.model_dump_json(indent=2))
        except OSError as exc:  # a full disk must not end the evaluation: nodes.jsonl and the final write remain
            _err_console().print(f"[yellow]warning:[/] cannot update {escape(str(self.path))}: {escape(str(exc))}")
        self.last = time.perf_counter()


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
    judge_model: JudgeModel = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key_env: JudgeKeyEnv = None,
    judge_cache_dir: Annotated[
        Optional[Path],
        typer.Option("--judge-cache-dir", help="Cache judge replies here (keyed by model, prompt and evidence)"),
    ] = None,
    judge_votes: JudgeVotes = None,
    judge_max_tokens: JudgeMaxTokens = None,
    judge_temperature: JudgeTemperature = None,
    judge_timeout: JudgeTimeout = None,
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
        judge_max_tokens=judge_max_tokens,
        judge_temperature=judge_temperature,
        judge_timeout=judge_timeout,
        exec_spec=exec_spec,
        exec_env=exec_vars,
        exec_env_file=exec_env_file,
        console=console,
    )
    render_summary(console, report, report_path)
