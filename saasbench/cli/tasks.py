"""CLI commands for the task catalogue (``saasbench tasks ...``) and ``saasbench validate-reference``.

Wired into :mod:`saasbench.cli.main` with::

    from saasbench.cli.tasks import tasks_app, validate_reference_cmd
    app.add_typer(tasks_app, name="tasks")
    app.command("validate-reference")(validate_reference_cmd)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import EXIT_CANNOT_RUN, EXIT_NOT_VALID
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail

tasks_app = typer.Typer(
    help="The task catalogue: list, show and import tasks.\n\nExample: saasbench tasks list", no_args_is_help=True
)


def _load(task: str, root: Optional[Path]):
    from saasbench.catalog.tasks import TaskError, load_task

    try:
        return load_task(task, root)
    except TaskError as exc:
        raise _fail(str(exc)) from None


RootOption = Annotated[
    Optional[Path],
    typer.Option("--root", help="Task catalogue folder; default $SAASBENCH_TASKS_DIR or the repository's tasks/"),
]


@tasks_app.command("list")
def tasks_list(
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the catalogue as JSON")] = False,
    images: Annotated[
        bool, typer.Option("--images/--no-images", help="Ask the Docker engine which images are present")
    ] = True,
) -> None:
    """List the tasks of the catalogue: id, title, domain, database, port, readiness (ready / needs DAG, PRD, images).

    A task that does not load is reported on its own line (the others are listed); exit 1 when there is one.

    Example: saasbench tasks list --root tasks/
    """
    from saasbench.catalog.tasks import docker_client_or_none, find_tasks, readiness, tasks_root

    errors: list[str] = []
    tasks = find_tasks(root, errors=errors)
    client = docker_client_or_none() if images else None
    rows: list[dict[str, Any]] = []
    for t in tasks:
        try:
            ready = readiness(t, docker_client=client)
        except Exception as exc:  # noqa: BLE001 - one broken task never hides the others
            errors.append(f"{t.root}: {' '.join(str(exc).split()) or type(exc).__name__}")
            continue
        rows.append(
            {
                "id": t.id,
                "title": t.title,
                "domain": t.spec.domain,
                "category": t.spec.category,
                "stack": t.spec.stack
                if isinstance(t.spec.stack, str)
                else (json.dumps(t.spec.stack) if t.spec.stack else ""),
                "database": t.spec.database.engine if t.spec.database else None,
                "port": t.spec.app.port,
                "prd": t.prd_path.is_file(),
                "kb": t.kb_path.is_file(),
                "dag": t.dag_path.is_file(),
                "reference": t.reference_dir is not None,
                "path": str(t.root),
                "readiness": ready.status,
                "needs": ready.needs,
            }
        )
    if as_json:
        typer.echo(json.dumps({"tasks": rows, "errors": errors}, indent=2))
        raise typer.Exit(EXIT_NOT_VALID if errors else 0)
    console = _console()
    if not rows and not errors:
        console.print(f"no tasks under {escape(str(root or tasks_root()))}")
        return
    table = Table(show_edge=False, pad_edge=False)
    for col in ("id", "title", "domain", "db", "port", "files", "readiness"):
        table.add_column(col, no_wrap=col in ("id", "port"), overflow="fold")
    for r in rows:
        files = " ".join(
            name for name, ok in (("prd", r["prd"]), ("kb", r["kb"]), ("dag", r["dag"]), ("ref", r["reference"])) if ok
        )
        state = "[green]ready[/]" if not r["needs"] else f"[yellow]{escape(r['readiness'])}[/]"
        table.add_row(
            escape(r["id"]), escape(r["title"]), r["domain"] or "", r["database"] or "", str(r["port"]), files, state
        )
    console.print(table)
    console.print(f"{len(rows)} task(s)")
    for e in errors:
        console.print(f"[red]broken task:[/] {escape(' '.join(e.split()))}", soft_wrap=True)
    if errors:
        raise typer.Exit(EXIT_NOT_VALID)


@tasks_app.command("show")
def tasks_show(
    task: Annotated[str, typer.Argument(help="Task id or folder", show_default=False)],
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print task.yaml (normalised) as JSON")] = False,
) -> None:
    """Show one task: its metadata, files, DAG size and reference recipe.

    Example: saasbench tasks show timetrack
    """
    from saasbench.catalog.tasks import docker_client_or_none, readiness

    t = _load(task, root)
    spec = t.spec.model_dump(mode="json", exclude_none=True)
    ready = readiness(t, docker_client=docker_client_or_none())
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "path": str(t.root),
                    "spec": spec,
                    "readiness": {
                        "status": ready.status,
                        "needs": ready.needs,
                        "notes": ready.notes,
                        "images": [n.model_dump(mode="json") for n in ready.images],
                    },
                },
                indent=2,
            )
        )
        return
    console = _console()
    console.print(f"[bold]{escape(t.id)}[/]  {escape(t.title)}")
    console.print(f"  folder      {escape(str(t.root))}")
    for label, value in (
        ("category", t.spec.category),
        ("domain", t.spec.domain),
        ("tier", t.spec.complexity_tier),
        ("stack", t.spec.stack),
    ):
        if value:
            console.print(f"  {label:<11} {escape(str(value))}")
    app = t.spec.app
    console.print(
        f"  app         port {app.port}, health {escape(app.health_path)}, start {escape(str(app.start_command))}"
    )
    if t.spec.database:
        db = t.spec.database
        console.print(
            f"  database    {escape(db.engine)}{' ' + escape(db.version) if db.version else ''}"
            f"{' at ' + escape(db.path) if db.path else ''}"
        )
    if t.spec.auth:
        console.print(
            f"  auth        schemes {', '.join(t.spec.auth.schemes) or 'none'}; users {', '.join(t.spec.auth.users) or 'none'}"
        )
    to = t.spec.timeouts
    console.print(f"  timeouts    agent {to.agent_s:g}s, node {to.eval_node_s:g}s, health {to.health_s:g}s")
    ref = t.spec.reference
    if ref is not None:
        state = "present" if t.reference_dir else "[red]missing[/]"
        console.print(f"  reference   {escape(ref.source)}/ ({state}); install {len(ref.install)} command(s)")
    for name, path in (("task.md", t.prd_path), ("knowledge_base.json", t.kb_path), ("dag.json", t.dag_path)):
        console.print(f"  {name:<20} {'[green]yes[/]' if path.is_file() else '[red]missing[/]'}")
    if t.dag_path.is_file():
        from saasbench.dag import DagLoadError, load_dag

        try:
            result = load_dag(t.dag_path)
            console.print(
                f"  DAG         {len(result.dag.nodes)} node(s), maxScore {result.dag.total_max_score:g}, "
                f"{len(result.warnings)} warning(s)"
            )
        except DagLoadError as exc:
            console.print(
                f"  DAG         [red]{len(exc.issues)} error(s)[/] (saasbench dag check {escape(str(t.dag_path))})"
            )
    try:
        kb = t.load_kb()
        if kb:
            console.print(f"  KB          {len(kb)} entr{'y' if len(kb) == 1 else 'ies'}")
    except Exception as exc:  # noqa: BLE001 - show, not crash
        console.print(f"  KB          [red]{escape(str(exc))}[/]")
    _show_facts(console, t)
    for n in ready.images:
        have = {True: "[green]present[/]", False: "[red]absent[/]", None: "[dim]unchecked[/]"}[n.available]
        sub = f" (map: {escape(n.substitute)})" if n.substitute else ""
        console.print(f"  image       {escape(n.service)}: {escape(n.image or n.declared)} {have}{sub}")
    colour = "green" if not ready.needs else "yellow"
    console.print(f"  readiness   [{colour}]{escape(ready.status)}[/]")
    for note in ready.notes:
        console.print(f"    - {escape(note)}")


def _show_facts(console: Console, t) -> None:
    """The facts read from prompt_for_model.md at import (task.yaml ``facts``), one line each."""
    facts = t.spec.facts
    if facts is None:
        return
    console.print("  [bold]facts from prompt_for_model.md[/]")
    for label, value in (
        ("product", facts.product),
        ("container", facts.container),
        ("workdir", facts.workdir),
        ("base OS", facts.base_os),
        ("app port", facts.app_port),
        ("host port", facts.host_port),
    ):
        if value:
            console.print(f"    {label:<10} {escape(str(value))}")
    if facts.tools:
        console.print(f"    {'tools':<10} {escape('; '.join(facts.tools))}")
    db = facts.database
    if db is not None:
        console.print(
            f"    {'database':<10} {escape(' '.join(str(x) for x in (db.engine, db.version) if x))} at "
            f"{escape(str(db.host))}:{db.port}, db {escape(str(db.name))}, user {escape(str(db.user))}, "
            f"password {escape(str(db.password))}"
        )
    for svc in facts.services:
        console.print(f"    {'service':<10} {escape(svc.name)} at {escape(str(svc.host))}:{svc.port}")
    for u in facts.users:
        who = ", ".join(
            f"{k} {v}" for k, v in (("username", u.username), ("email", u.email), ("password", u.password)) if v
        )
        console.print(f"    {'user':<10} {escape(u.role)}: {escape(who)}")
    if facts.env_vars:
        console.print(f"    {'env vars':<10} {escape(', '.join(facts.env_vars))}")


@tasks_app.command("import")
def tasks_import(
    path: Annotated[
        str,
        typer.Argument(
            help="A public SaaSBench task folder (task_<id>/ with tasks/ and check/), or with "
            "--dag the id of a task already in the catalogue",
            show_default=False,
        ),
    ],
    dest: Annotated[
        Optional[Path], typer.Option("--dest", help="Catalogue folder to import into; default the task catalogue")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing task folder")] = False,
    dag: Annotated[
        Optional[Path],
        typer.Option(
            "--dag",
            help="Use this DAG file (checked with the loader); with a catalogue task id, attach it to that task",
        ),
    ] = None,
) -> None:
    """Import a task from the public SaaSBench layout into the catalogue as <dest>/<id>/, or attach a DAG.

    Copies what the folder has (task.md, knowledge_base.json, dag.json or dag_smoke.json, scoring_config.json, the docker files under environment/), reads prompt_for_model.md into the task's facts (product, container, tools, database, port, evaluation users) and writes task.yaml. What is missing is reported as readiness, not refused.

    Examples: saasbench tasks import ~/SaaSbench/eval/task_ubsmhopy --dest tasks/
              saasbench tasks import ubsmhopy --dag ~/dags/ubsmhopy/dag.json
    """
    from saasbench.catalog.tasks import TaskError, attach_dag, import_public_task, load_task, readiness

    console = _console()
    folder = Path(path)
    try:
        if dag is not None and not (folder / "check").is_dir() and not (folder / "tasks").is_dir():
            task = load_task(path, dest)
            warnings = attach_dag(task, dag)
            console.print(
                f"[bold green]attached[/] {escape(str(dag))} to {escape(task.id)} ({len(warnings)} DAG warning(s))"
            )
            console.print(f"  readiness   {escape(readiness(task).status)}")
            return
        result = import_public_task(folder, dest, overwrite=overwrite, dag=dag)
    except TaskError as exc:
        raise _fail(str(exc)) from None
    console.print(f"[bold green]imported[/] {escape(result.task.id)} -> {escape(str(result.task.root))}")
    for w in result.warnings:
        console.print(f"  [yellow]note[/] {escape(w)}")
    if result.dag_warnings:
        console.print(
            f"  DAG warnings {len(result.dag_warnings)} (saasbench dag check {escape(str(result.task.dag_path))})"
        )
    console.print(f"  readiness   {escape(readiness(result.task).status)}")


@tasks_app.command("fetch")
def tasks_fetch(
    tasks: Annotated[
        Optional[list[str]],
        typer.Argument(help="Task ids (task_<id> or <id>); default: every task", show_default=False),
    ] = None,
    dest: Annotated[
        Optional[Path], typer.Option("--dest", help="Catalogue folder to import into; default the task catalogue")
    ] = None,
    repo: Annotated[
        Optional[str],
        typer.Option("--repo", help="Git repository (URL or path); default the public SaaSBench repository"),
    ] = None,
    commit: Annotated[
        Optional[str], typer.Option("--commit", help="Commit id to check out (pinned by default)")
    ] = None,
    dataset: Annotated[
        Optional[str], typer.Option("--dataset", help="Dataset holding task.md and knowledge_base.json")
    ] = None,
    endpoint: Annotated[
        Optional[str], typer.Option("--endpoint", help="Dataset host; default $HF_ENDPOINT or https://huggingface.co")
    ] = None,
    revision: Annotated[str, typer.Option("--revision", help="Dataset revision")] = "main",
    no_inputs: Annotated[bool, typer.Option("--no-inputs", help="Skip the PRD/KB downloads")] = False,
    cache: Annotated[
        Optional[Path],
        typer.Option("--cache", help="Where the repository is checked out; default ~/.cache/saasbench/public"),
    ] = None,
) -> None:
    """Clone the public repository at a pinned commit, import its tasks, download their PRD and KB, report readiness.

    Needs network (or --repo/--endpoint pointing at local copies). A task that fails is reported; the others go on. Exit 1 when any task failed.

    Example: saasbench tasks fetch task_cqfnbfay task_jtbxfpny --dest tasks/
    """
    from saasbench.catalog import fetch as f
    from saasbench.catalog.tasks import docker_client_or_none, load_task_dir, readiness

    console = _console()
    try:
        with console.status("cloning the task repository and importing"):
            results = f.fetch_tasks(
                tasks or None,
                repo=repo or f.DEFAULT_REPO,
                commit=commit or f.DEFAULT_COMMIT,
                dataset=None if no_inputs else (dataset or f.DEFAULT_DATASET),
                endpoint=endpoint,
                revision=revision,
                dest_root=dest,
                cache_dir=cache,
            )
    except f.FetchError as exc:
        raise _fail(str(exc)) from None
    client = docker_client_or_none()
    table = Table(show_edge=False, pad_edge=False)
    for col in ("task", "imported", "downloaded", "readiness", "errors"):
        table.add_column(col, overflow="fold")
    for r in results:
        state = readiness(load_task_dir(Path(r.path)), docker_client=client).status if r.path else ""
        table.add_row(
            escape(r.task),
            "yes" if r.imported else "[red]no[/]",
            " ".join(r.downloaded),
            escape(state),
            escape("; ".join(r.errors)),
        )
    console.print(table)
    failed = [r for r in results if r.errors]
    console.print(f"{len(results) - len(failed)} of {len(results)} task(s) fetched without errors")
    if failed:
        raise typer.Exit(EXIT_NOT_VALID)


@tasks_app.command("images")
def tasks_images(
    task: Annotated[str, typer.Argument(help="Task id or folder", show_default=False)],
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON")] = False,
) -> None:
    """Which images a task needs, which substitutes the image map applies, and which the Docker engine has.

    Image maps: image-map.yaml in the task folder, environment.image_map in task.yaml, then $SAASBENCH_IMAGE_MAP or ~/.config/saasbench/image-map.yaml (see docs/tasks.md). Exit 1 when an image is absent, 2 when no engine answers.

    Example: saasbench tasks images cqfnbfay
    """
    from saasbench.catalog.envspec import SpecError, env_spec_for_task
    from saasbench.catalog.imagemap import image_needs
    from saasbench.catalog.tasks import docker_client_or_none

    t = _load(task, root)
    try:
        spec = env_spec_for_task(t)
    except SpecError as exc:
        raise _fail(str(exc)) from None
    client = docker_client_or_none()
    needs = image_needs(spec, client)
    if as_json:
        typer.echo(
            json.dumps(
                {"task": t.id, "engine": client is not None, "images": [n.model_dump(mode="json") for n in needs]},
                indent=2,
            )
        )
    else:
        console = _console()
        table = Table(show_edge=False, pad_edge=False)
        for col in ("service", "declared", "runs", "present"):
            table.add_column(col, overflow="fold")
        for n in needs:
            present = {True: "[green]yes[/]", False: "[red]no[/]", None: "[dim]-[/]"}[n.available]
            table.add_row(escape(n.service), escape(n.declared), escape(n.image or "(built)"), present)
        console.print(table)
        if client is None:
            console.print("[yellow]no Docker engine answered: availability not checked[/]")
    if client is None:
        raise typer.Exit(EXIT_CANNOT_RUN)
    if any(n.available is False for n in needs):
        raise typer.Exit(EXIT_NOT_VALID)


_SHORT = {
    "PASSED": "pass",
    "FAILED": "FAIL",
    "ERROR": "ERR",
    "SKIPPED_DEPENDENCY": "dep",
    "SKIPPED_LLM": "llm",
    "QUARANTINED": "quar",
    "DRY_RUN": "dry",
}


def render_validation(console: Console, report) -> None:
    """The per-node table (node, pass rate, verdict) and the summary of a validation."""
    colour = {"pass": "green", "flaky": "yellow", "always_failing": "red", "skipped_llm": "dim"}
    table = Table(
        title=f"Reference validation of {escape(report.task_id)} ({report.repeats} repeat(s))",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("node", no_wrap=True)
    table.add_column("pass rate", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("statuses / last message", overflow="fold")
    for n in report.nodes:
        rate = f"{n.passed}/{n.counted}" if n.counted else "n/a"
        verdict = n.verdict + (f" ({n.flaky_cause})" if n.flaky_cause else "")
        detail = " ".join(_SHORT.get(s, s) for s in n.statuses)
        if n.verdict != "pass" and n.last_message:
            detail += f"  {n.last_message[:160]}"
        table.add_row(escape(n.id), rate, f"[{colour[n.verdict]}]{escape(verdict)}[/]", escape(detail))
    console.print(table)
    for r in report.repeat_records:
        app = "app up" if r.app_ok else f"[red]app down[/]: {escape(r.app_error or '')}"
        console.print(f"  repeat {r.index}: oracle {r.oracle_exit_reason}, {app}, task score {r.task_score}")
    counts = {v: sum(1 for n in report.nodes if n.verdict == v) for v in colour}
    console.print("  verdicts   " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    if report.skipped_llm:
        console.print(f"  [dim]judge skipped (SKIPPED_LLM in every repeat): {escape(', '.join(report.skipped_llm))}[/]")
    console.print(f"  quarantine {escape(report.quarantine_path)} ({len(report.quarantine)} node(s))")
    console.print(f"  report     {escape(str(Path(report.out_dir) / 'validation.json'))}")


def validate_reference_cmd(
    task: Annotated[str, typer.Argument(help="Task id or folder", show_default=False)],
    repeats: Annotated[
        int, typer.Option("--repeats", "-n", min=1, help="How many fresh environments to run the reference in")
    ] = 3,
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Output folder; default runs/validate-<task>-<timestamp>")
    ] = None,
    quarantine: Annotated[
        Optional[Path],
        typer.Option("--quarantine", help="Where to write the quarantine file; default <out>/quarantine.txt"),
    ] = None,
    root: RootOption = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the workspaces (their paths go into validation.json)")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when any node is flaky or always failing")] = False,
) -> None:
    """Validate a task: run its reference implementation (oracle agent) N times and its DAG on each.

    Per node: pass rate and verdict (pass, flaky, always_failing, skipped_llm). Writes validation.json, a report.json per repeat and a quarantine file of flaky nodes. Runs on the local backend (this host).

    Example: saasbench validate-reference timetrack --repeats 3 --out runs/validate-timetrack
    """
    from saasbench.dag import DagLoadError
    from saasbench.runs.validate import validate_reference

    t = _load(task, root)
    if not t.dag_path.is_file():
        raise _fail(f"task {t.id} has no dag.json")
    if t.reference_dir is None:
        raise _fail(f"task {t.id} has no reference implementation (task.yaml reference.source)")
    console = _console()
    try:
        with console.status(f"validating {t.id}") as status:
            report = validate_reference(
                t,
                repeats,
                out_dir=out,
                quarantine_path=quarantine,
                keep_workspaces=keep,
                progress=lambda i, msg: status.update(escape(msg)),
            )
    except DagLoadError as exc:
        raise _fail(f"DAG of {t.id} does not load: {exc.issues[0] if exc.issues else exc}") from None
    render_validation(console, report)
    if strict and (report.flaky or report.always_failing):
        raise typer.Exit(EXIT_NOT_VALID)
