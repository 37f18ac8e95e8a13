"""The ``oracle`` agent: installs the task's reference implementation.

It proves a task is solvable and its DAG sound (``saasbench validate-reference``): copy the
task's ``reference.source`` folder into the workspace (through ``env.write_file``, so it works
for every backend), then run ``reference.install`` commands in the workspace, each bounded by
the budget's per-tool-call and remaining wall-clock time. The app is started afterwards by the
trial with ``reference.start_command`` (or the task's ``app.start_command``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from saasbench.agents.base import Agent, Budget, ExitReason, Trajectory, register_agent

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task
    from saasbench.environments.local import Environment

SKIP_DIRS = frozenset({"__pycache__", ".git", "node_modules", ".venv", ".pytest_cache"})


@register_agent("oracle")
class OracleAgent(Agent):
    """Installs the task's reference implementation: proves the task and its DAG are valid."""

    version = "1"
    trusted = True  # it runs the task's own reference install commands
    shell_tools = frozenset({"exec"})  # its install commands, for the anti-cheat scanner (agents/anticheat.py)

    def app_start_command(self, task: Task) -> str | None:
        ref = task.spec.reference
        return (ref.start_command if ref is not None and ref.start_command else None) or task.spec.app.start_command

    def run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        traj = self.new_trajectory()
        task = env.task
        if task is None:
            return traj.finish("agent_error", "the oracle needs env.task (an environment created for a task)")
        ref = task.spec.reference
        source = task.reference_dir
        if ref is None or source is None:
            return traj.finish(
                "agent_error", f"task {task.id} has no reference implementation (task.yaml reference.source)"
            )
        copied = 0
        root = Path(os.path.realpath(task.root))
        for path in _files(source):
            rel = path.relative_to(source).as_posix()
            real = Path(os.path.realpath(path))
            if root not in real.parents:  # a symlink out of the task folder never pulls host files in
                return traj.finish(
                    "agent_error", f"reference file {rel} is a symlink to {real}, outside the task folder: refused"
                )
            executable = os.access(path, os.X_OK)
            env.write_file(rel, path.read_bytes(), mode=0o755 if executable else None)
            copied += 1
        traj.steps += 1
        traj.event("file_write", f"copied {copied} reference file(s) from {source.name}/", files=copied)
        for cmd in ref.install:
            if traj.steps >= budget.steps:
                return traj.finish("agent_budget_exceeded", f"step budget {budget.steps} used up before {cmd!r}")
            remaining = budget.wall_s - traj.elapsed()
            if remaining <= 0:
                return traj.finish("agent_timeout", f"wall-clock budget {budget.wall_s:g}s used up before {cmd!r}")
            timeout = min(budget.tool_call_s, remaining)
            traj.steps += 1
            traj.event("tool_call", cmd, tool="exec", timeout_s=round(timeout, 3))
            result = env.exec(cmd, timeout_s=timeout)
            traj.event(
                "tool_result",
                f"exit {result.exit_code}",
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                stdout=result.stdout[-2000:],
                stderr=result.stderr[-2000:],
            )
            if result.timed_out:
                reason: ExitReason = "agent_timeout" if timeout < budget.tool_call_s else "agent_error"
                return traj.finish(reason, f"install command {cmd!r} timed out after {timeout:g}s")
            if result.exit_code != 0:
                last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or [""]
                return traj.finish("agent_error", f"install command {cmd!r} exited {result.exit_code}: {last[0][:300]}")
        return traj.finish("completed")


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file():
                out.append(path)
    return out
