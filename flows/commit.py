"""Commit stage: the trial's rows and its end_states row in one lake commit. A lake failure is retried
here, never by running the trial again."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

commit_stage = stage_task("commit", stages.commit)
