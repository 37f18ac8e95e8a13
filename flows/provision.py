"""Provision stage: the task loaded, a fresh environment started, the agent installed in it."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

provision_stage = stage_task("provision", stages.provision)
