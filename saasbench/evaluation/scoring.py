"""The one scoring module: node scores, statuses and aggregates (paper Appendix B.4).

Every score in saasbench (reports, lake, leaderboards) comes from these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from saasbench.evaluation.results import (
    Aggregate,
    Counts,
    NodeResult,
    Status,
    StepRecord,
    StepResult,
    Summary,
)

EXCLUDED = {Status.SKIPPED_LLM, Status.QUARANTINED, Status.DRY_RUN}


def floor_tenth(value: float) -> float:
    """Floor to one decimal place; the epsilon keeps 0.3*10 from flooring to 2.9."""
    return math.floor(value * 10 + 1e-9) / 10


def binary_score(all_passed: bool, max_score: float) -> float:
    return max_score if all_passed else 0.0


def weighted_score(passed: int, total: int, max_score: float) -> float:
    if total <= 0:
        return 0.0
    return floor_tenth(passed / total * max_score)


def judge_score(judge: float, score_range: tuple[float, float] | None, max_score: float) -> float:
    """clip(judge * M / hi, 0, M) with ``hi`` the top of ``score_range`` (default M)."""
    hi = score_range[1] if score_range else max_score
    if hi <= 0:
        return 0.0
    return min(max(judge * max_score / hi, 0.0), max_score)


def status_for(score: float, max_score: float, all_passed: bool) -> Status:
    """PASSED iff score > 0. A zero-point node (maxScore 0) passes when its chain passed, so it can still gate."""
    if max_score == 0:
        return Status.PASSED if all_passed else Status.FAILED
    return Status.PASSED if score > 0 else Status.FAILED


class Outcome(NamedTuple):
    """A node's score, status and message; ``judge_pending`` when its judgement was deferred."""

    score: float
    status: Status
    message: str
    judge_pending: bool = False


def llm_judge_outcome(results: Sequence[StepResult], max_score: float, fail_msg: str) -> Outcome:
    """An llm-judge node's outcome from its step results (``fail_msg``: the first failing step).

    The one implementation for the engine (inline judging) and the judge stage (deferred judging):
    a failed evidence step -> FAILED; the last judgement skipped -> SKIPPED_LLM (``judge_pending``
    when it waits for the judge stage); else ``clip(judge * M / hi, 0, M)``.
    """
    verdict = next((r for r in reversed(results) if r.is_judgement), None)
    evidence_failed = next((r for r in results if not r.passed and not r.is_judgement), None)
    if evidence_failed is not None:
        return Outcome(0.0, Status.FAILED, f"evidence step failed: {fail_msg}")
    if verdict is None:
        return Outcome(0.0, Status.FAILED, "llm-judge node produced no judge verdict")
    if verdict.judge_skipped:
        return Outcome(0.0, Status.SKIPPED_LLM, verdict.message or "judge unavailable", verdict.judge_pending)
    score = round(judge_score(verdict.judge_score or 0.0, verdict.judge_range, max_score), 4)
    return Outcome(
        score, status_for(score, max_score, score > 0), verdict.message or f"judge score {verdict.judge_score}"
    )


def first_failure_message(records: Sequence[StepRecord]) -> str:
    """``step i CODE failed: why`` for the first failing step, else ''."""
    first = next((r for r in records if not r.passed), None)
    return f"step {first.index} {first.type} failed: {first.message}" if first else ""


def judge_info(records: Sequence[StepRecord], results: Sequence[StepResult]) -> dict[str, Any] | None:
    """A node's ``judge`` field: the last P17 step's (or judgement's) info, None without one."""
    info = None
    for record, result in zip(records, results):
        if record.type == "P17" or result.is_judgement:
            info = result.judge_info()
    return info


def quarantined(outcome: Outcome) -> Outcome:
    """A quarantined node: its real verdict kept in the message, excluded from the score."""
    return outcome._replace(
        status=Status.QUARANTINED, message=f"quarantined; ran as {outcome.status.value}: {outcome.message}"
    )


def counts(results: Iterable[NodeResult]) -> Counts:
    c = Counts()
    for r in results:
        setattr(c, r.status.value, getattr(c, r.status.value) + 1)
    return c


def aggregate(results: list[NodeResult]) -> Aggregate:
    """Sum of score over sum of maxScore for nodes not SKIPPED_LLM (nor quarantined/dry-run)."""
    kept = [r for r in results if r.status not in EXCLUDED]
    score = sum(r.score for r in kept)
    max_score = sum(r.max_score for r in kept)
    return Aggregate(
        score=round(score, 4),
        max_score=round(max_score, 4),
        percent=round(100 * score / max_score, 2) if max_score > 0 else None,
        nodes=len(results),
        counts=counts(results),
        skipped_llm_max_score=sum(r.max_score for r in results if r.status == Status.SKIPPED_LLM),
    )


def task_score(results: list[NodeResult]) -> float | None:
    return aggregate(results).percent


def deterministic_score(results: list[NodeResult]) -> float | None:
    return aggregate([r for r in results if r.method != "llm-judge"]).percent


def node_coverage(results: list[NodeResult]) -> float | None:
    """PASSED nodes over all nodes (quarantined excluded), as a percentage."""
    pool = [r for r in results if r.status not in {Status.QUARANTINED, Status.DRY_RUN}]
    if not pool:
        return None
    return round(100 * sum(1 for r in pool if r.status == Status.PASSED) / len(pool), 2)


def group_by(results: list[NodeResult], key) -> dict[str, Aggregate]:
    groups: dict[str, list[NodeResult]] = {}
    for r in results:
        k = key(r)
        if k is None:
            continue
        groups.setdefault(str(k), []).append(r)
    return {k: aggregate(v) for k, v in groups.items()}


def report_totals(results: list[NodeResult], elapsed_s: float) -> dict[str, Any]:
    """A RunReport's ``summary``, ``categories`` and ``complexity_tiers`` over its node results."""
    agg = aggregate(results)
    summary = Summary(
        task_score=agg.percent,
        deterministic_score=deterministic_score(results),
        score=agg.score,
        max_score=agg.max_score,
        skipped_llm_max_score=agg.skipped_llm_max_score,
        node_coverage=node_coverage(results),
        total_nodes=len(results),
        counts=agg.counts,
        elapsed_s=round(elapsed_s, 3),
    )
    return {
        "summary": summary,
        "categories": group_by(results, lambda r: r.category),
        "complexity_tiers": group_by(results, lambda r: r.complexity_tier),
    }


def benchmark_score(task_scores: Iterable[float | None]) -> float | None:
    """Unweighted mean of task scores (tasks without a score are left out)."""
    values = [s for s in task_scores if s is not None]
    return round(sum(values) / len(values), 2) if values else None
