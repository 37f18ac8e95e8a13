"""Agents: registry, prompt, oracle and nop on a fixture task, start_app after each."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_environment_local import make_task

from saasbench.agents import (
    Agent,
    AgentNotFound,
    Budget,
    Trajectory,
    build_prompt,
    get_agent,
    list_agents,
)
from saasbench.environments.base import pid_alive, start_app
from saasbench.environments.local import LocalEnvironment


class EchoAgent(Agent):  # a custom agent, loaded by import path
    version = "0.1"

    def run(self, prompt, env, budget):
        traj = self.new_trajectory()
        env.write_file("echo.txt", prompt[:20])
        traj.steps = 1
        return traj.finish("completed")


def test_registry_by_name_and_import_path() -> None:
    assert {"oracle", "nop"} <= set(list_agents())
    assert get_agent("nop").name == "nop"
    custom = get_agent("test_agents_basic:EchoAgent")
    assert isinstance(custom, EchoAgent)
    with pytest.raises(AgentNotFound, match="no agent 'nope'"):
        get_agent("nope")
    with pytest.raises(AgentNotFound, match="cannot import"):
        get_agent("no_such_module_xyz:Agent")
    with pytest.raises(AgentNotFound, match="not a subclass"):
        get_agent("pathlib:Path")


def test_budget_defaults() -> None:
    b = Budget()
    assert (b.steps, b.wall_s, b.tool_call_s) == (500, 10800, 900)


def test_prompt_has_four_blocks_and_stages_inputs(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with LocalEnvironment(task) as env:
        prompt = build_prompt(task, env)
        ws = env.workspace_path
        assert env.read_file("task.md").startswith(b"# Fixture Tracker")
        assert b"KB-1" in env.read_file("knowledge_base.json")
        port = env.app_port
    assert prompt.startswith("Mandatory anti-cheat policy.")
    assert "You are a senior full-stack engineer" in prompt and "Fixture Tracker" in prompt
    assert "### Requirements Document" in prompt and f"{ws}/task.md" in prompt and f"{ws}/knowledge_base.json" in prompt
    assert "### Success Condition" in prompt
    assert f"port {port}" in prompt and "bash run.sh" in prompt and "$DATABASE_PATH" in prompt
    assert "admin" in prompt and "admin-pass-1" in prompt  # evaluation users from the auth profile
    assert "[" not in prompt.split("### Requirements")[0].replace("[]", "")  # no unfilled [placeholders]


def test_oracle_makes_app_healthy(tmp_path: Path) -> None:
    task = make_task(tmp_path, install=["mkdir -p data && echo installed > data/marker"])
    oracle = get_agent("oracle")
    with LocalEnvironment(task) as env:
        traj = oracle.run(build_prompt(task, env), env, Budget())
        assert isinstance(traj, Trajectory) and traj.exit_reason == "completed", traj.error
        assert traj.steps == 2 and any(e.kind == "tool_call" for e in traj.events)
        assert env.read_file("data/marker") == b"installed\n"
        result = start_app(task, env, command=oracle.app_start_command(task))
        assert result.ok, result.error
        pid = env.services()["app"].pid
    assert not pid_alive(pid)


def test_oracle_install_failure_is_agent_error(tmp_path: Path) -> None:
    task = make_task(tmp_path, install=["echo broken >&2; exit 7"])
    with LocalEnvironment(task) as env:
        traj = get_agent("oracle").run("", env, Budget())
    assert traj.exit_reason == "agent_error" and "exited 7" in traj.error and "broken" in traj.error


def test_oracle_wall_budget(tmp_path: Path) -> None:
    task = make_task(tmp_path, install=["sleep 10"])
    with LocalEnvironment(task) as env:
        traj = get_agent("oracle").run("", env, Budget(wall_s=0.5))
    assert traj.exit_reason == "agent_timeout"


def test_oracle_without_reference(tmp_path: Path) -> None:
    task = make_task(tmp_path, reference=False)
    with LocalEnvironment(task) as env:
        traj = get_agent("oracle").run("", env, Budget())
    assert traj.exit_reason == "agent_error" and "no reference" in traj.error


def test_nop_leaves_app_down_and_start_app_reports(tmp_path: Path) -> None:
    task = make_task(tmp_path, health_s=5)
    nop = get_agent("nop")
    with LocalEnvironment(task) as env:
        traj = nop.run(build_prompt(task, env), env, Budget())
        assert traj.exit_reason == "completed" and traj.steps == 0
        result = start_app(task, env)
    assert not result.ok
    assert "exited with code" in result.error
    assert "run.sh" in result.log_tail  # bash: run.sh: No such file or directory
