"""Freeze stage: the agent's end state captured before evaluation mutates it (saasbench.runs.endstate)."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

freeze_stage = stage_task("freeze", stages.freeze)
