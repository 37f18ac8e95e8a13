"""``saasbench run`` and ``saasbench sweep``: typer functions the CLI registers.

Wiring (in saasbench/cli/main.py)::

    from saasbench.cli.sweep import run_cmd, sweep_cmd
    app.command("run")(run_cmd)
    app.command("sweep")(sweep_cmd)

Both go through Prefect flows (``flows/``) in ephemeral mode (a temporary local server per
process, state under ``$PREFECT_HOME``) or against ``$PREFECT_API_URL`` when set; ``sweep
--no-prefect`` runs the same core in a thread pool without Prefect.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal, cast

import typer
from rich.console import Console
from rich.markup import escape

from saasbench.cli.common import (
    JudgeApiBase,
    JudgeKeyEnv,
    JudgeMaxTokens,
    JudgeModel,
    JudgeTemperature,
    JudgeTimeout,
    JudgeVotes,
    judge_options_error,
    judge_tuning,
)
from saasbench.cli.common import fail as _fail


def prefect_env() -> None:
    """Defaults for Prefect when the user set none: no telemetry, state outside ~/.prefect; this process's
    owner tag (``saasbench.environments.leftovers``) for the server Prefect starts. A log record
    Prefect writes while its temporary server stops at exit, after the console closed, would print a
    '--- Logging error ---' traceback: not actionable, so logging's own errors stay silent."""
    import logging

    from saasbench.environments.leftovers import OWNER_TAG, owner_tag

    logging.raiseExceptions = False
    os.environ[OWNER_TAG] = owner_tag()  # the ephemeral Prefect server inherits it: `env prune` reaps it after a kill
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_HOME"] = str(Path(tempfile.gettempdir()) / f"saasbench-prefect-{os.getuid()}")


GatewayFile = Annotated[
    Path | None,
    typer.Option(
        "--gateway", help="Model gateway config YAML (saasbench.runs.gateway.GatewayConfig: models, retries, ...)"
    ),
]


def _judge_and_gateway(
    judge_model: str | None,
    judge_api_base: str | None,
    judge_api_key_env: str | None,
    gateway: Path | None,
    tuning: dict | None = None,
    base_judge: dict | None = None,
) -> dict:
    """SweepSpec fields from the judge and gateway options (empty when none are given). ``tuning``:
    :func:`~saasbench.cli.common.judge_tuning` of the --judge-max-tokens/-temperature/-timeout/-votes
    options; without --judge-model they apply to ``base_judge`` (a spec file's ``judge:``), else they
    need --judge-model."""
    from saasbench.cli.common import require_extra
    from saasbench.inputs import InputError, load_yaml

    out: dict = {}
    tuning = tuning or {}
    if judge_model:
        require_extra("litellm", "judge", "--judge-model (the LLM judge)")
        out["judge"] = {
            "model": judge_model,
            **({"api_base": judge_api_base} if judge_api_base else {}),
            **({"api_key_env": judge_api_key_env} if judge_api_key_env else {}),
            **tuning,
        }
    elif judge_api_base or judge_api_key_env:
        raise _fail("--judge-api-base/--judge-api-key-env need --judge-model")
    elif tuning:
        if not base_judge:
            raise _fail(judge_options_error(tuning))
        out["judge"] = {**base_judge, **tuning}
    if gateway is not None:
        require_extra("litellm", "gateway", "--gateway (the model gateway)")
        try:
            out["gateway"] = load_yaml(gateway, what="gateway config") or {}
        except InputError as exc:
            raise _fail(str(exc)) from None
    return out


def run_cmd(
    task: Annotated[str, typer.Option("--task", help="Task id or folder")],
    agent: Annotated[str, typer.Option("--agent", help="Agent name (oracle, nop, ...)")],
    model: Annotated[str | None, typer.Option("--model", help="Model for LLM agents")] = None,
    backend: Annotated[str, typer.Option("--backend", help="local or docker")] = "local",
    lake: Annotated[
        str | None, typer.Option("--lake", help="Results lake URI (default $SAASBENCH_LAKE or runs/lake)")
    ] = None,
    sweep_id: Annotated[
        str | None, typer.Option("--sweep-id", help="Sweep id of the trial (default run-<task>-<agent>)")
    ] = None,
    attempt: Annotated[int, typer.Option("--attempt", help="Attempt number (part of the trial id)")] = 0,
    judge_model: JudgeModel = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key_env: JudgeKeyEnv = None,
    judge_max_tokens: JudgeMaxTokens = None,
    judge_temperature: JudgeTemperature = None,
    judge_timeout: JudgeTimeout = None,
    judge_votes: JudgeVotes = None,
    gateway: GatewayFile = None,
    no_prefect: Annotated[
        bool, typer.Option("--no-prefect", help="Run the trial's stages in this process without Prefect (debugging)")
    ] = False,
) -> None:
    """Run one trial through the trial flow (its stages, on an embedded Prefect unless PREFECT_API_URL is
    set) and commit it to the lake.

    Example: saasbench run --task timetrack --agent oracle
    """
    from saasbench.environments import check_backend
    from saasbench.runs.sweep import SweepSpec, id_part

    try:
        check_backend(backend)
    except ValueError as exc:
        raise _fail(f"--backend: {exc}") from None
    tuning = judge_tuning(judge_max_tokens, judge_temperature, judge_timeout, judge_votes)
    extra = _judge_and_gateway(judge_model, judge_api_base, judge_api_key_env, gateway, tuning)
    try:
        spec = SweepSpec(
            sweep_id=sweep_id or f"run-{id_part(task)}-{id_part(agent)}",
            tasks=[task],
            agents=[agent],
            models=[model],
            backend=backend,
            lake=lake,
            **extra,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if no_prefect:
        from saasbench.runs.sweep import TrialSpec, run_trial_retrying, sweep_gateway, write_sweep_row

        write_sweep_row(spec)
        trial = TrialSpec(task=task, agent=agent, model=model, attempt=attempt)
        with sweep_gateway(spec) as gw:
            outcome = run_trial_retrying(trial, spec, gateway=gw)
    else:
        prefect_env()
        from saasbench.flows.trial import trial_flow

        outcome = trial_flow(task=task, agent=agent, model=model, attempt=attempt, sweep=spec.model_dump(mode="json"))
    Console().print(f"{escape(task)}/{escape(agent)}: {outcome} (sweep {spec.sweep_id}, lake {escape(spec.lake_uri)})")


def sweep_cmd(
    spec_yaml: Annotated[Path | None, typer.Argument(help="Sweep spec YAML (or give --task/--agent)")] = None,
    task: Annotated[list[str] | None, typer.Option("--task", help="Task id (repeatable)")] = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Agent (repeatable)")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", help="Model (repeatable)")] = None,
    attempts: Annotated[int | None, typer.Option("--attempts", help="Attempts per config")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="local or docker")] = None,
    sweep_id: Annotated[str | None, typer.Option("--sweep-id", help="Sweep id (re-use one to resume)")] = None,
    lake: Annotated[str | None, typer.Option("--lake", help="Results lake URI")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", help="Trials at once")] = None,
    no_prefect: Annotated[bool, typer.Option("--no-prefect", help="Plain thread pool, no Prefect")] = False,
    envs_per_host: Annotated[
        int | None,
        typer.Option(
            "--envs-per-host",
            help="Environments at once per host (Prefect global concurrency limit; default "
            "$SAASBENCH_ENVS_PER_HOST, else unlimited)",
        ),
    ] = None,
    llm_calls: Annotated[
        str | None,
        typer.Option(
            "--llm-calls",
            help="LLM calls at once per provider: N, or provider=N,...,*=N (default "
            "$SAASBENCH_LLM_CALLS_PER_PROVIDER, else unlimited)",
        ),
    ] = None,
    dispatch: Annotated[
        str,
        typer.Option(
            "--dispatch",
            help="local: trials in this process; deployment: each trial a flow run of the 'trial' "
            "deployment, run by the work pool's workers (needs PREFECT_API_URL)",
        ),
    ] = "local",
    judge_model: JudgeModel = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key_env: JudgeKeyEnv = None,
    judge_max_tokens: JudgeMaxTokens = None,
    judge_temperature: JudgeTemperature = None,
    judge_timeout: JudgeTimeout = None,
    judge_votes: JudgeVotes = None,
    gateway: GatewayFile = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check the spec and print the planned trials; run nothing")
    ] = False,
) -> None:
    """Run a sweep (tasks x agents x models x attempts); re-running a sweep id resumes it.

    Examples: saasbench sweep sweep.yaml; saasbench sweep --task timetrack --agent oracle --agent nop --sweep-id s1
    """
    import datetime as dt

    from saasbench.inputs import InputError, load_yaml
    from saasbench.runs.sweep import SweepSpec, aggregate, plan, run_sweep_plain
    from saasbench.services.limits import parse_llm_calls

    data: dict = {}
    if spec_yaml is not None:
        try:
            data = load_yaml(spec_yaml, what="sweep spec") or {}
        except InputError as exc:
            raise _fail(str(exc)) from None
        if not isinstance(data, dict):
            raise _fail(f"{spec_yaml}: a sweep spec is a mapping (sweep_id, tasks, agents, ...)")
    for key, value in (
        ("tasks", task),
        ("agents", agent),
        ("models", model),
        ("attempts", attempts),
        ("backend", backend),
        ("sweep_id", sweep_id),
        ("lake", lake),
        ("concurrency", concurrency),
    ):
        if value:
            data[key] = value
    if dispatch not in ("local", "deployment"):
        raise _fail(f"--dispatch must be local or deployment, not {dispatch!r}")
    if dispatch == "deployment" and no_prefect:
        raise _fail("--dispatch deployment needs Prefect (drop --no-prefect)")
    if envs_per_host is not None:
        data["envs_per_host"] = envs_per_host
    if llm_calls is not None:
        try:
            data["llm_calls_per_provider"] = parse_llm_calls(llm_calls)
        except ValueError as exc:
            raise _fail(f"--llm-calls: {exc}") from None
    tuning = judge_tuning(judge_max_tokens, judge_temperature, judge_timeout, judge_votes)
    spec_judge = data.get("judge") or ({"model": data["judge_model"]} if data.get("judge_model") else None)
    base_judge = spec_judge if isinstance(spec_judge, dict) else None
    data.update(_judge_and_gateway(judge_model, judge_api_base, judge_api_key_env, gateway, tuning, base_judge))
    data.setdefault("sweep_id", "sweep-" + dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S"))
    try:
        spec = SweepSpec.model_validate(data)
    except ValueError as exc:
        raise _fail(f"invalid sweep spec: {exc}") from None
    console = Console()
    console.print(f"sweep {spec.sweep_id}: {len(plan(spec))} trial(s), lake {escape(spec.lake_uri)}")
    if dry_run:
        for t in plan(spec):
            console.print(f"  {escape(t.label)}  ({escape(t.trial_id)})")
        return
    if no_prefect:
        from saasbench.failures import LakeError
        from saasbench.lake.store import LakeStoreError

        try:
            outcomes = run_sweep_plain(spec, on_done=lambda t, o: console.print(f"  {escape(t.label)}: {o}"))
        except (LakeError, LakeStoreError) as exc:  # the lake is down: one line, the sweep resumes later
            raise _fail(str(exc)) from None
        agg = aggregate(spec)
        board, html = agg["markdown"], agg["html"]
    else:
        prefect_env()
        from saasbench.flows.sweep import DispatchUnavailable, check_trial_deployment, sweep_flow

        if dispatch == "deployment":
            try:
                check_trial_deployment()
            except DispatchUnavailable as exc:
                raise _fail(str(exc)) from None
        res = sweep_flow(spec.model_dump(mode="json"), dispatch=cast(Literal["local", "deployment"], dispatch))
        outcomes, board, html = res["outcomes"], res["leaderboard"], res["html"]
    console.print(f"ran {len(outcomes)} trial(s) now ({len(plan(spec)) - len(outcomes)} already committed)")
    console.print(board, markup=False, highlight=False)
    if html:
        console.print(f"HTML report: {escape(html)}")
