"""One trial on a local or Docker backend: fresh environment -> agent -> start the app -> evaluate.

A trial is two parts on one code path:

- the **rollout** (:func:`rollout_in`): install the agent, stage the task inputs and build the
  prompt, hash the integrity paths, run the agent within its :class:`~saasbench.agents.base.Budget`,
  hash again, scan the trajectory (:mod:`saasbench.agents.anticheat`); a ``void`` finding makes the
  outcome ``voided_cheat``;
- the **evaluation** (:func:`evaluate_in`): start the app with the deployment contract and run
  the task's DAG against it, on whatever state the rollout left.

:func:`run_local_trial` does both in one environment (``validate-reference``, ``saasbench demo``,
``saasbench run``/``sweep`` through :mod:`saasbench.runs.sweep`); :func:`run_rollout` does only the
rollout, keeps the workspace in an output folder and writes the trajectory there
(``saasbench rollout``). An agent or app failure is recorded in the result (its nodes then
fail), never raised.

Integrity policy (:func:`integrity_targets`): the task's ``integrity_paths`` (workspace paths the
evaluator relies on) are hashed after the harness prepared the workspace and after the rollout;
any change (modified, deleted, created) voids the trial, with an ``evaluator_modified`` finding as
evidence. A task that declares none gets its staged PRD/KB copies hashed instead, and a change
there is an ``inputs_modified`` finding of severity ``warn`` (reported, not voiding: no evaluator
reads those copies, and moving or deleting them is not cheating). The task folder itself
(``dag.json``, ``reference/``) is never copied into the workspace; on the local backend a tool
call that names its host path is an ``evaluator_access`` finding (void). Findings are kept on the
result (``cheat_findings``, ``integrity_findings``), appended to the trajectory as ``anticheat``
events (so they reach the lake's ``trajectory_events``) and summarised in ``outcome_detail``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import inspect
import json
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saasbench.evaluation.results import NodeResult, RunReport

if TYPE_CHECKING:
    from saasbench.environments.base import Environment

READ_BACK_LIMIT = 4 * 1024 * 1024  # bytes of a workspace file the anti-cheat scan reads back


@dataclass
class RolloutResult:
    """What one rollout produced (no evaluation)."""

    task_id: str
    agent: str
    trajectory: Any  # agents.base.Trajectory
    outcome: str  # the trajectory's exit reason, or voided_cheat
    budget: Any  # agents.base.Budget
    backend: str
    workspace: str
    cheat_findings: list[dict[str, Any]] = field(default_factory=list)
    integrity_findings: list[dict[str, Any]] = field(default_factory=list)
    artefacts: dict[str, str] = field(default_factory=dict)
    started_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    out_dir: str | None = None
    prompt: str = ""
    follow_up: dict[str, Any] = field(default_factory=dict)  # how to start and evaluate the workspace later

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list(self.cheat_findings) + list(self.integrity_findings)

    @property
    def outcome_detail(self) -> str | None:
        return outcome_detail(self.outcome, self.findings, self.trajectory)


@dataclass
class TrialResult:
    agent: str
    report: RunReport
    trajectory: Any  # agents.base.Trajectory
    app_ok: bool
    app_error: str | None
    app_log_tail: str
    workspace: str
    outcome: str = "completed"  # the trajectory's exit reason, or voided_cheat
    cheat_findings: list = None  # type: ignore[assignment]
    integrity_findings: list = None  # type: ignore[assignment]
    rollout: RolloutResult | None = None
    judge_calls: list = None  # type: ignore[assignment]  # saasbench.services.judge.JudgeCall, one per vote

    def __post_init__(self) -> None:
        self.cheat_findings = list(self.cheat_findings or [])
        self.integrity_findings = list(self.integrity_findings or [])
        self.judge_calls = list(self.judge_calls or [])

    @property
    def judge_failures(self) -> list[str]:
        """Errors of judge calls that failed after the judge's own retries (their nodes are
        SKIPPED_LLM): an infrastructure failure, not the agent's."""
        return [c.error for c in self.judge_calls if getattr(c, "error", None)]

    @property
    def outcome_detail(self) -> str | None:
        return outcome_detail(self.outcome, self.cheat_findings + self.integrity_findings, self.trajectory)


def outcome_detail(outcome: str, findings: list[dict[str, Any]], trajectory: Any) -> str | None:
    """The evidence of a voided trial (its void findings), else the trajectory's error."""
    if outcome == "voided_cheat":
        parts = []
        for f in findings:
            if f.get("severity") == "void":
                where = f" (event {f['event_index']})" if f.get("event_index") is not None else ""
                parts.append(f"{f.get('rule')}{where}: {f.get('evidence')}")
        return "voided_cheat: " + "; ".join(parts)
    return getattr(trajectory, "error", None)


def make_environment(
    task,
    backend: str = "local",
    *,
    keep_workspace: bool = False,
    docker_client=None,
    workspace_root: str | Path | None = None,
    **options: Any,
) -> Environment:
    """A fresh environment of the chosen backend for one trial (``workspace_root``: use that folder, kept;
    ``options``: the backend's own, e.g. from :func:`saasbench.environments.connect_backend`)."""
    from saasbench.environments import create_environment

    return create_environment(
        backend,
        task,
        keep_workspace=keep_workspace,
        workspace_root=workspace_root,
        docker_client=docker_client,
        **options,
    )


def task_budget(task, *, steps: int | None = None, wall_s: float | None = None, tool_call_s: float | None = None):
    """The rollout budget: the task's ``timeouts`` (agent_steps, agent_s, tool_call_s), each overridable."""
    from saasbench.agents.base import Budget

    t = task.spec.timeouts
    return Budget(
        steps=steps if steps is not None else t.agent_steps,
        wall_s=wall_s if wall_s is not None else t.agent_s,
        tool_call_s=tool_call_s if tool_call_s is not None else t.tool_call_s,
    )


def resolve_agent(agent, model: str | None = None):
    """An Agent from an instance or a name/import path; ``model`` goes to agents whose constructor takes one."""
    from saasbench.agents import get_agent

    if not isinstance(agent, str):
        return agent
    if model is None:
        return get_agent(agent)
    probe = get_agent(agent)
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(type(probe)).parameters
    except (TypeError, ValueError):
        params = {}
    takes_model = "model" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return get_agent(agent, model=model) if takes_model else probe


def integrity_targets(task) -> list[tuple[str, str, str]]:
    """(workspace path, severity, rule) of every path hashed before and after the rollout (see the module docs)."""
    from saasbench.failures import TaskDefect
    from saasbench.services.workspace import PathEscape, confine

    declared = task.spec.integrity_paths
    if declared is None:
        staged = [p.name for p in (task.prd_path, task.kb_path) if p.is_file()]
        return [(name, "warn", "inputs_modified") for name in dict.fromkeys(staged)]
    out = []
    for raw in declared:
        try:
            rel = confine(str(raw), "integrity_paths")
        except PathEscape as exc:
            raise TaskDefect(f"task {task.id}: {exc}") from None
        out.append((rel, "void", "evaluator_modified"))
    return out


def _hash_targets(env, targets: list[tuple[str, str, str]]) -> dict[tuple[str, str], dict[str, str | None]]:
    from saasbench.agents.anticheat import hash_paths

    groups: dict[tuple[str, str], list[str]] = {}
    for path, severity, rule in targets:
        groups.setdefault((severity, rule), []).append(path)
    return {key: hash_paths(paths, root=env.workspace_dir) for key, paths in groups.items()}


def _forbidden_paths(task, env: Environment) -> list[str]:
    """The task folder as the agent could name it when its commands run on this host (local backend), unless
    the workspace lives inside it. (A container backend mounts only the workspace: the host path does not
    exist where the agent runs.)"""
    if not env.runs_on_host:
        return []
    root = Path(task.root)
    paths = list(dict.fromkeys([str(root), os.path.realpath(root)]))
    ws = os.path.realpath(env.workspace_dir)
    return [p for p in paths if not (ws == p or ws.startswith(p.rstrip("/") + "/"))]


def _reader(env) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        try:
            return env.read_file(path, limit=READ_BACK_LIMIT).decode("utf-8", errors="replace")
        except Exception:  # noqa: BLE001 - gone, outside the workspace, a folder: nothing to scan
            return None

    return read


def rollout_in(
    env: Environment,
    task,
    agent,
    budget,
    *,
    say: Callable[[str], None] | None = None,
    artefacts_dir: str | Path | None = None,
    backend: str | None = None,
    installed: bool = False,
) -> RolloutResult:
    """The rollout part of a trial in a started environment (see the module docstring); ``installed``:
    the provision stage already installed the agent."""
    from saasbench.agents import build_prompt
    from saasbench.agents.anticheat import integrity_findings, void_if_cheating

    say = say or (lambda m: None)
    if not getattr(agent, "trusted", False):  # a model's commands: only where they are confined (or trusted)
        env.check_untrusted_agent(agent.name)
    started = _dt.datetime.now(_dt.UTC)
    if artefacts_dir is not None and hasattr(agent, "artefacts_dir"):
        agent.artefacts_dir = Path(artefacts_dir)
    if not installed:
        say(f"{agent.name}: installing in {env.workspace_path}")
        agent.install(env)
    prompt = build_prompt(task, env)
    targets = integrity_targets(task)
    before = _hash_targets(env, targets)
    say(
        f"{agent.name}: running (budget {budget.steps} steps, {budget.wall_s:g}s, {budget.tool_call_s:g}s per tool call)"
    )
    trajectory = agent.run(prompt, env, budget)
    after = _hash_targets(env, targets)
    integrity = [f for key in before for f in integrity_findings(before[key], after[key], severity=key[0], rule=key[1])]
    voided, cheat = void_if_cheating(trajectory, read_file=_reader(env), forbidden_paths=_forbidden_paths(task, env))
    voided = voided or any(f.severity == "void" for f in integrity)
    for f in cheat + integrity:  # the evidence travels with the trajectory (lake: trajectory_events kind 'anticheat')
        trajectory.event("anticheat", f.evidence, **f.as_dict())
    outcome = "voided_cheat" if voided else (trajectory.exit_reason or "completed")
    artefacts = dict(getattr(agent, "last_artefacts", None) or {})
    return RolloutResult(
        task_id=task.id,
        agent=agent.name,
        trajectory=trajectory,
        outcome=outcome,
        budget=budget,
        backend=backend or env.kind,
        workspace=str(env.workspace_dir),
        cheat_findings=[dataclasses.asdict(f) for f in cheat],
        integrity_findings=[dataclasses.asdict(f) for f in integrity],
        artefacts=artefacts,
        started_at=started,
        ended_at=_dt.datetime.now(_dt.UTC),
        prompt=prompt,
    )


def evaluate_in(
    env,
    task,
    agent,
    dag,
    *,
    on_node: Callable[[NodeResult], None] | None = None,
    say: Callable[[str], None] | None = None,
    judge=None,
    defer_judge: bool = False,
    command: str | None = None,
):
    """The evaluation part of a trial: start the app (deployment contract), run the DAG. Returns
    (report, app, judge requests). ``judge``: a :class:`saasbench.services.judge.Judge` for llm-judge nodes
    (None: they are SKIPPED_LLM); its ``calls`` hold every vote afterwards. ``defer_judge``: store the
    requests of llm-judge nodes no other node reads instead of judging them (the judge stage does,
    :func:`saasbench.evaluation.judging.judge_pending`). ``command``: how to start the app (default: the
    agent's deployment contract), e.g. a frozen end state's restart recipe."""
    from saasbench.environments.base import start_app
    from saasbench.environments.exec_target import task_exec_env
    from saasbench.evaluation.context import RunOptions, Target
    from saasbench.evaluation.evaluate import evaluate

    say = say or (lambda m: None)
    app = start_app(task, env, command=command if command is not None else agent.app_start_command(task))
    if not app.ok:
        say(f"{agent.name}: app not healthy: {app.error}")
    target = Target(
        base_url=env.base_url,
        workspace=Path(env.workspace_dir),
        db_dsn=env.db_dsn,
        environment=env,
        task_id=task.id,
        exec_env=task_exec_env(task, env),
        origin_aliases=task.app_origins,
    )
    say(f"{agent.name}: evaluating {len(dag.nodes)} node(s)")
    options = RunOptions(node_timeout_s=task.spec.timeouts.eval_node_s)
    if defer_judge:
        report, requests = evaluate(
            dag, target, options=options, auth_profile=task.spec.auth, judge=judge, on_node=on_node, defer_judge=True
        )
        return report, app, list(requests)
    report = evaluate(dag, target, options=options, auth_profile=task.spec.auth, judge=judge, on_node=on_node)
    return report, app, []


def run_local_trial(
    task,
    agent_name,
    *,
    keep_workspace: bool = False,
    on_node: Callable[[NodeResult], None] | None = None,
    say: Callable[[str], None] | None = None,
    backend: str = "local",
    docker_client=None,
    model: str | None = None,
    budget=None,
    judge=None,
) -> TrialResult:
    """Rollout then evaluation in one fresh environment. ``agent_name``: a name, import path or Agent;
    ``model`` goes to agents that take one; ``budget`` defaults to :func:`task_budget`; ``judge``: a
    :class:`saasbench.services.judge.JudgeConfig` (or Judge) for llm-judge nodes, None leaves them SKIPPED_LLM."""
    from saasbench.dag import load_dag
    from saasbench.services.judge import Judge, JudgeConfig

    say = say or (lambda m: None)
    dag = load_dag(task.dag_path).dag
    agent = resolve_agent(agent_name, model)
    with make_environment(task, backend, keep_workspace=keep_workspace, docker_client=docker_client) as env:
        ro = rollout_in(env, task, agent, budget or task_budget(task), say=say, backend=backend)
        say(f"{agent.name}: {ro.outcome}; starting the app")
        judge = Judge(judge) if isinstance(judge, JudgeConfig) else judge
        report, app, _ = evaluate_in(env, task, agent, dag, on_node=on_node, say=say, judge=judge)
    return TrialResult(
        agent=agent.name,
        report=report,
        trajectory=ro.trajectory,
        app_ok=app.ok,
        app_error=app.error,
        app_log_tail=app.log_tail,
        workspace=ro.workspace,
        outcome=ro.outcome,
        cheat_findings=ro.cheat_findings,
        integrity_findings=ro.integrity_findings,
        rollout=ro,
        judge_calls=list(judge.calls) if judge is not None else [],
    )


# --- rollout only ---------------------------------------------------------------------------------------
def run_rollout(
    task,
    agent,
    *,
    out_dir: str | Path,
    backend: str = "local",
    budget=None,
    model: str | None = None,
    say: Callable[[str], None] | None = None,
    on_event: Callable[[Any], None] | None = None,
    docker_client=None,
) -> RolloutResult:
    """Rollout without evaluation; the workspace stays in ``out_dir/workspace``.

    ``out_dir`` receives ``workspace/`` (the agent's work), ``trajectory.json`` (the whole
    Trajectory), ``events.jsonl`` (one event per line), ``prompt.md``, ``agent/`` (a CLI agent's
    raw event stream, stderr and its own trajectory copy) and ``rollout.json`` (task, agent, budget,
    outcome, totals, findings, artefacts and the follow-up commands to evaluate the workspace
    later). ``on_event(event)`` is called for every trajectory event as it is recorded.
    """
    out = Path(out_dir).resolve()
    ws = out / "workspace"
    if ws.exists() and any(ws.iterdir()):
        raise FileExistsError(f"{ws} is not empty: a rollout starts from an empty workspace (choose another --out)")
    out.mkdir(parents=True, exist_ok=True)
    agent = resolve_agent(agent, model)
    if on_event is not None:
        agent.on_event = on_event
    budget = budget or task_budget(task)
    with make_environment(task, backend, keep_workspace=True, docker_client=docker_client, workspace_root=ws) as env:
        ro = rollout_in(env, task, agent, budget, say=say, artefacts_dir=out / "agent", backend=backend)
        ro.follow_up = follow_up_commands(task, agent, ws, out)
    ro.out_dir = str(out)
    write_rollout(ro, out, model=model)
    return ro


def follow_up_commands(task, agent, workspace: Path, out: Path) -> dict[str, Any]:
    """How to start the rolled-out app by hand and score it with ``saasbench evaluate`` (SQLite tasks)."""
    spec = task.spec
    port = spec.app.port
    declared = spec.environment.get("env") if isinstance(spec.environment.get("env"), dict) else {}
    env = {str(k): str(v) for k, v in declared.items()} | {"PORT": str(port), "APP_PORT": str(port)}
    db = spec.database
    dsn = None
    if db is not None and db.engine.lower() in ("sqlite", "sqlite3"):
        db_path = workspace / (db.path or "data/app.db")
        env |= {"DATABASE_PATH": str(db_path), "DATABASE_URL": f"sqlite:///{db_path}"}
        dsn = f"sqlite:///{db_path}"
    command = agent.app_start_command(task) or ""
    base_url = f"http://127.0.0.1:{port}"
    argv = [
        "saasbench",
        "evaluate",
        "--dag",
        str(task.dag_path),
        "--base-url",
        base_url,
        "--workspace",
        str(workspace),
        "--node-timeout",
        f"{spec.timeouts.eval_node_s:g}",
        "--out",
        str(out / "evaluation"),
    ]
    if spec.auth is not None:
        argv += ["--auth", str(task.root / "task.yaml")]
    if dsn:
        argv += ["--db-dsn", dsn]
    # P12/P21 steps run their commands in the workspace with the app's variables, as in a trial
    argv += ["--exec", f"local:{workspace}"]
    if task.exec_env_path is not None:
        argv += ["--exec-env-file", str(task.exec_env_path)]
    for key, value in (env | dict(spec.exec_env)).items():
        argv += ["--exec-env", f"{key}={value}"]
    start = (
        (
            "cd "
            + shlex.quote(str(workspace))
            + " && "
            + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            + " "
            + command
        )
        if command
        else ""
    )
    return {
        "start_cwd": str(workspace),
        "start_env": env,
        "start_command": command,
        "start_shell": start,
        "health_url": base_url + "/" + spec.app.health_path.lstrip("/"),
        "evaluate_argv": argv,
        "evaluate_shell": " ".join(shlex.quote(a) for a in argv),
    }


def write_rollout(ro: RolloutResult, out: Path, *, model: str | None = None) -> None:
    traj = ro.trajectory
    (out / "trajectory.json").write_text(traj.model_dump_json(indent=1), encoding="utf-8")
    with open(out / "events.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(ev.model_dump_json() + "\n" for ev in traj.events)
    (out / "prompt.md").write_text(ro.prompt, encoding="utf-8")
    manifest = {
        "task": ro.task_id,
        "agent": ro.agent,
        "agent_version": traj.version,
        "model": traj.model or model,
        "backend": ro.backend,
        "budget": ro.budget.model_dump(),
        "outcome": ro.outcome,
        "outcome_detail": ro.outcome_detail,
        "exit_reason": traj.exit_reason,
        "error": traj.error,
        "steps": traj.steps,
        "tokens_in": traj.tokens_in,
        "tokens_out": traj.tokens_out,
        "cost_usd": traj.cost_usd,
        "wall_s": traj.wall_s,
        "started_at": ro.started_at.isoformat() if ro.started_at else None,
        "ended_at": ro.ended_at.isoformat() if ro.ended_at else None,
        "workspace": ro.workspace,
        "trajectory": str(out / "trajectory.json"),
        "events": str(out / "events.jsonl"),
        "artefacts": ro.artefacts,
        "cheat_findings": ro.cheat_findings,
        "integrity_findings": ro.integrity_findings,
        "evaluated": False,
        "follow_up": ro.follow_up,
    }
    (out / "rollout.json").write_text(json.dumps(manifest, indent=1, default=str), encoding="utf-8")
