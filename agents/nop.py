"""The ``nop`` agent: does nothing. A task's DAG run against it should score (close to) zero."""

from __future__ import annotations

from typing import TYPE_CHECKING

from saasbench.agents.base import Agent, Budget, Trajectory, register_agent

if TYPE_CHECKING:
    from saasbench.environments.local import Environment


@register_agent("nop")
class NopAgent(Agent):
    """Does nothing: the floor every task must score near zero on."""

    version = "1"
    trusted = True  # it runs nothing

    def run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        traj = self.new_trajectory()
        traj.event("note", "nop agent: no action taken")
        return traj.finish("completed")
