"""Rollout stage: the agent's run, integrity hashes and anti-cheat scan. An agent outcome is never retried;
a retry (the environment failed under the agent, or the model upstream did: ``ModelError``, see
``saasbench.runs.outages``) provisions a fresh environment first and runs the agent again."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

rollout_stage = stage_task("rollout", stages.rollout)
