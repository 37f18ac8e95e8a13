"""Judge stage: the deferred llm-judge requests judged from stored evidence. A judge outage is retried here
(a delay, not a void); still down after the retries, the trial commits as ``judge_error`` with its
evidence kept for ``saasbench rescore --judge-only``."""

from __future__ import annotations

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

judge_stage = stage_task("judge", stages.judge)
