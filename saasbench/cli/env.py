"""`saasbench env ...`: bring a task's stack up by hand, poke at it, tear it down, reap leftovers.

`env up` holds the environment in the foreground (Ctrl-C tears it down); from another terminal
`env exec TRIAL CMD` runs a command in a Docker trial's app container and `env down TRIAL`
removes it. `env prune` reaps leftovers of dead harness runs (local processes and workspaces,
Docker trials); `env images` lists and prunes the content-addressed image cache.
"""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

env_app = typer.Typer(
    help="Task environments by hand: up, exec, down, prune, images.\n\nExample: saasbench env up timetrack --backend docker",
    no_args_is_help=True,
)


def _client():
    """A Docker client for the Docker-only commands (exec, down, prune, images); exit 2 without an engine."""
    from saasbench.environments.docker import connect_engine
    from saasbench.failures import EnvError

    try:
        return connect_engine()
    except EnvError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@env_app.command("up")
def env_up(
    task: Annotated[str, typer.Argument(help="Task id or folder")],
    backend: Annotated[str, typer.Option("--backend", help="local or docker")] = "local",
    agent: Annotated[
        str, typer.Option("--agent", help="Agent to run first (oracle installs the reference; nop leaves it empty)")
    ] = "oracle",
    start: Annotated[
        bool, typer.Option("--start/--no-start", help="Start the app with the task's deployment contract")
    ] = True,
) -> None:
    """Start a task's environment, run an agent, start the app, and hold it until Ctrl-C.

    Example: saasbench env up timetrack --backend docker
    """
    from saasbench.agents import build_prompt, get_agent
    from saasbench.agents.base import Budget
    from saasbench.catalog.tasks import load_task
    from saasbench.environments import connect_backend
    from saasbench.environments.base import start_app
    from saasbench.failures import EnvError, HarnessError
    from saasbench.runs.trial import make_environment

    console = Console()
    spec = load_task(task)
    try:
        options = connect_backend(backend)  # the backend's engine answers (Docker: one checked client)
        env = make_environment(spec, backend, keep_workspace=True, **options)
    except (ValueError, EnvError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        env.start()  # a required sandbox that cannot be built here fails now, as one line
    except HarnessError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with env:
        a = get_agent(agent)
        if not a.trusted:
            try:
                env.check_untrusted_agent(a.name)
            except HarnessError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
        a.install(env)
        a.run(build_prompt(spec, env), env, Budget(wall_s=spec.spec.timeouts.agent_s))
        console.print(f"task [bold]{spec.id}[/] on {backend}; workspace {escape(str(env.workspace_dir))}")
        if env.trial_id is not None:  # reachable from another terminal
            console.print(
                f"trial id [bold]{env.trial_id}[/]  (saasbench env exec {env.trial_id} 'ls'; saasbench env down {env.trial_id})"
            )
        if start:
            app = start_app(spec, env, command=a.app_start_command(spec))
            if app.ok:
                console.print(f"app up at [bold]{app.base_url}[/]")
            else:
                console.print(f"[red]app not healthy:[/] {escape(app.error or '')}\n{escape(app.log_tail or '')}")
        console.print("holding the environment; Ctrl-C tears it down")
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    signal.signal(signal.SIGTERM, previous)
    console.print("environment stopped")


def _app_container(client, trial: str):
    from saasbench.environments.docker import L_SERVICE, L_TRIAL

    containers = client.containers.list(filters={"label": f"{L_TRIAL}={trial}"})
    if not containers:
        typer.echo(f"error: no running container for trial {trial!r} (saasbench env up ... --backend docker)", err=True)
        raise typer.Exit(2)
    apps = [c for c in containers if c.labels.get(L_SERVICE) == "app"]
    return (apps or containers)[0]


@env_app.command("exec")
def env_exec(
    trial: Annotated[str, typer.Argument(help="Trial id printed by env up")],
    command: Annotated[str, typer.Argument(help="Shell command run with sh -c in the app container")],
) -> None:
    """Run a command in a Docker trial's app container and print its output; exits with its code.

    Example: saasbench env exec 3f2a9c1b0d4e 'ls /app'
    """
    container = _app_container(_client(), trial)
    result = container.exec_run(["sh", "-c", command], demux=False)
    output = result.output or b""
    typer.echo(output[: 1024 * 1024].decode("utf-8", errors="replace"), nl=False)
    raise typer.Exit(result.exit_code or 0)


@env_app.command("down")
def env_down(trial: Annotated[str, typer.Argument(help="Trial id printed by env up")]) -> None:
    """Remove every container, network and volume of a Docker trial.

    Example: saasbench env down 3f2a9c1b0d4e
    """
    from saasbench.environments.docker import _remove_trial

    removed = _remove_trial(_client(), trial)
    typer.echo(f"removed {removed}")


@env_app.command("prune")
def env_prune(
    older_than: Annotated[
        Optional[float],
        typer.Option("--older-than", help="Docker: also remove any trial older than this many seconds"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed")] = False,
    backend: Annotated[
        str, typer.Option("--backend", help="local, docker, or all (Docker skipped when no engine answers)")
    ] = "all",
) -> None:
    """Reap what dead harness runs left: local processes (app servers, their setsid children, a gateway
    proxy, an ephemeral Prefect server) and temporary workspaces, and Docker trials, whose owner is gone.

    Example: saasbench env prune --dry-run
    """
    if backend not in ("local", "docker", "all"):
        typer.echo(f"error: --backend must be local, docker or all, not {backend!r}", err=True)
        raise typer.Exit(2)
    verb = "would remove" if dry_run else "removed"
    if backend in ("local", "all"):
        from saasbench.environments.leftovers import prune as prune_local

        found = prune_local(dry_run=dry_run)
        typer.echo(f"local: {verb}: " + ("nothing" if not found else ""))
        for item in found:
            typer.echo(f"  {item.describe()}")
    if backend in ("docker", "all"):
        from saasbench.failures import EnvError

        try:
            from saasbench.environments.docker import connect_engine, prune

            client = connect_engine()
        except (EnvError, ImportError) as exc:
            if backend == "docker":
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
            typer.echo("docker: no engine answers, skipped")
            return
        doomed = prune(client, older_than=older_than, dry_run=dry_run)
        typer.echo(f"docker: {verb}: " + (", ".join(doomed) or "nothing"))


@env_app.command("images")
def env_images(
    prune_age: Annotated[
        Optional[float], typer.Option("--prune-age", help="Remove cached images unused for this many seconds")
    ] = None,
    prune_bytes: Annotated[
        Optional[int], typer.Option("--prune-bytes", help="Then remove least recently used images until the rest fit")
    ] = None,
) -> None:
    """List the content-addressed image cache (least recently used first), optionally pruning it.

    Example: saasbench env images --prune-age 604800
    """
    from saasbench.environments.imagecache import ImageCache

    cache = ImageCache(_client())
    if prune_age is not None or prune_bytes is not None:
        removed = cache.prune(max_age_s=prune_age, max_bytes=prune_bytes)
        typer.echo(f"pruned {len(removed)} image(s)")
    table = Table(show_edge=False)
    for col in ("tag", "size MB", "last used"):
        table.add_column(col)
    import datetime as dt

    for img in cache.list_images():
        used = dt.datetime.fromtimestamp(img.last_used, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        table.add_row(img.tag, f"{img.size / 1e6:.1f}", used)
    Console().print(table)
