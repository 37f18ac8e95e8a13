"""Rollout stage: the agent's run, integrity hashes and anti-cheat scan. An agent outcome is never retried;
a retry (the environment failed under the agent) provisions a fresh environment first."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

rollout_stage = stage_task("rollout", stages.rollout)
