"""Rollout stage: agent run + app start + evaluation in one fresh environment.

Until end states are frozen (ARCHITECTURE step 4), rollout and evaluation share the trial's
environment, so the rollout task *is* the trial task (``flows.trial.run_trial_task``), with
retries for infrastructure failures only.
"""

from __future__ import annotations

from saasbench.flows.trial import run_trial_task as rollout_task

__all__ = ["rollout_task"]
