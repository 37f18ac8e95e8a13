"""Result records of one evaluation: step results, node results and the run report.

These are the canonical shapes written to ``report.json`` and, later, to the lake.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class Status(str, Enum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED_DEPENDENCY = "SKIPPED_DEPENDENCY"
    SKIPPED_LLM = "SKIPPED_LLM"
    DRY_RUN = "DRY_RUN"
    QUARANTINED = "QUARANTINED"  # excluded by --quarantine; reported, never silently dropped


class StepResult(BaseModel):
    """What one primitive returns. ``value`` is what later steps and placeholders may read.

    ``judge_score``/``judge_skipped`` are set only by the LLM judge; ``unreachable`` marks an
    app that did not answer (a missing page is the app's failure, not the judge's outage).
    ``judge_pending`` (with ``judge_skipped``): the evidence was stored for a later judge stage
    instead of being judged (deferred judging, :mod:`saasbench.evaluation.judging`).
    """

    passed: bool
    message: str = ""
    value: Any = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    judge_score: float | None = None
    judge_range: tuple[float, float] | None = None
    judge_skipped: bool = False
    judge_pending: bool = False
    unreachable: bool = False

    @property
    def is_judgement(self) -> bool:
        """A judge's answer (a score, a skip or a pending judgement), not an evidence step."""
        return self.judge_score is not None or self.judge_skipped

    def judge_info(self) -> dict[str, Any]:
        """What a node reports under ``judge`` for this step (``pending`` only when deferred)."""
        info: dict[str, Any] = {
            "score": self.judge_score,
            "range": self.judge_range,
            "skipped": self.judge_skipped,
            "message": self.message,
        }
        if self.judge_pending:
            info["pending"] = True
        return info


class StepRecord(BaseModel):
    """A step result as reported: code, verdict, timing, message and evidence pointers."""

    index: int
    type: str
    passed: bool
    message: str = ""
    duration_ms: float = 0.0
    evidence: dict[str, Any] = Field(default_factory=dict)
    error: bool = False


class NodeResult(BaseModel):
    id: str
    category: str
    subcategory: str = ""
    method: str
    complexity_tier: str | None = None
    status: Status
    score: float = 0.0
    max_score: float
    message: str = ""
    duration_ms: float = 0.0
    steps: list[StepRecord] = Field(default_factory=list)
    judge: dict[str, Any] | None = None
    judge_pending: bool = Field(
        default=False,
        description="SKIPPED_LLM (or QUARANTINED) because its evidence waits for the judge stage "
        "(deferred judging); judge_pending() in saasbench.evaluation.judging completes it",
    )


class Counts(BaseModel):
    PASSED: int = 0
    FAILED: int = 0
    ERROR: int = 0
    SKIPPED_DEPENDENCY: int = 0
    SKIPPED_LLM: int = 0
    DRY_RUN: int = 0
    QUARANTINED: int = 0


class Aggregate(BaseModel):
    """Score of a group of nodes under the one numerator/denominator rule."""

    score: float
    max_score: float
    percent: float | None
    nodes: int
    counts: Counts
    skipped_llm_max_score: float = 0.0


class Summary(BaseModel):
    task_score: float | None = Field(description="100 * sum(score) / sum(maxScore) over nodes not SKIPPED_LLM")
    deterministic_score: float | None = Field(description="the same over nodes whose method is not llm-judge")
    score: float
    max_score: float
    skipped_llm_max_score: float
    node_coverage: float | None = Field(description="PASSED nodes / all nodes")
    total_nodes: int
    counts: Counts
    elapsed_s: float


class RunReport(BaseModel):
    """The canonical report of one DAG evaluation (report.json)."""

    schema_version: int = 1
    dag: str
    task_id: str | None = None
    base_url: str | None = None
    compat: str = "strict"
    started_at: str
    options: dict[str, Any] = Field(default_factory=dict)
    summary: Summary
    categories: dict[str, Aggregate]
    complexity_tiers: dict[str, Aggregate] = Field(default_factory=dict)
    nodes: list[NodeResult]
    quarantined: list[str] = Field(default_factory=list)
    complete: bool = Field(
        default=True,
        description="False while the run goes on and when it was interrupted: ``saasbench evaluate`` rewrites "
        "report.json as nodes finish, so nodes, summary and aggregates then cover the nodes scored so far",
    )
    nodes_planned: int | None = Field(
        default=None, description="Nodes the run was to evaluate (of a partial report: how far it got)"
    )
