"""One trial on a local or Docker backend: fresh environment -> agent -> start the app -> evaluate.

The same function serves ``validate-reference`` (the oracle, N times) and ``saasbench demo``
(oracle and nop); the Prefect ``trial`` flow will wrap it. An agent or app failure is recorded
in the result (its nodes then fail), never raised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from saasbench.results import NodeResult, RunReport


@dataclass
class TrialResult:
    agent: str
    report: RunReport
    trajectory: object  # agents.base.Trajectory
    app_ok: bool
    app_error: str | None
    app_log_tail: str
    workspace: str
    outcome: str = "completed"  # the trajectory's exit reason, or voided_cheat
    cheat_findings: list = None  # type: ignore[assignment]


def make_environment(task, backend: str = "local", *, keep_workspace: bool = False, docker_client=None):
    """A fresh environment of the chosen backend for one trial."""
    if backend == "local":
        from saasbench.environment import LocalEnvironment

        return LocalEnvironment(task, keep=keep_workspace)
    if backend == "docker":
        from saasbench.docker_env import DockerEnvironment

        return DockerEnvironment(task, client=docker_client, keep=keep_workspace)
    raise ValueError(f"unknown backend {backend!r} (local or docker)")


def run_local_trial(task, agent_name: str, *, keep_workspace: bool = False,
                    on_node: Callable[[NodeResult], None] | None = None,
                    say: Callable[[str], None] | None = None, backend: str = "local",
                    docker_client=None) -> TrialResult:
    from saasbench.agents import build_prompt, get_agent
    from saasbench.agents.base import Budget
    from saasbench.context import RunContext, RunOptions, Target
    from saasbench.dag import load_dag
    from saasbench.engine import Engine
    from saasbench.environment import start_app

    say = say or (lambda m: None)
    dag = load_dag(task.dag_path).dag
    agent = agent_name if not isinstance(agent_name, str) else get_agent(agent_name)  # a name or an Agent
    agent_name = agent.name
    with make_environment(task, backend, keep_workspace=keep_workspace, docker_client=docker_client) as env:
        say(f"{agent_name}: installing in {env.workspace_path}")
        agent.install(env)
        trajectory = agent.run(build_prompt(task, env), env, Budget(wall_s=task.spec.timeouts.agent_s))
        from saasbench.agents.anticheat import void_if_cheating

        voided, findings = void_if_cheating(trajectory)
        outcome = "voided_cheat" if voided else (trajectory.exit_reason or "completed")
        say(f"{agent_name}: {outcome}; starting the app")
        app = start_app(task, env, command=agent.app_start_command(task))
        if not app.ok:
            say(f"{agent_name}: app not healthy: {app.error}")
        ctx = RunContext(
            Target(base_url=env.base_url, workspace=Path(env.workspace_dir), db_dsn=env.db_dsn, environment=env,
                   task_id=task.id),
            options=RunOptions(node_timeout_s=task.spec.timeouts.eval_node_s),
            auth_profile=task.spec.auth,
            env_defaults=dag.env_defaults,
        )
        say(f"{agent_name}: evaluating {len(dag.nodes)} node(s)")
        report = Engine(dag, ctx).run(on_node=on_node)
        workspace = str(env.workspace_dir)
    return TrialResult(agent=agent_name, report=report, trajectory=trajectory, app_ok=app.ok, app_error=app.error,
                       app_log_tail=app.log_tail, workspace=workspace, outcome=outcome,
                       cheat_findings=[dataclasses.asdict(f) for f in findings])
