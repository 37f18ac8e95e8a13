"""The one scoring module: node scores, statuses and aggregates (paper Appendix B.4).

Every score in saasbench (reports, lake, leaderboards) comes from these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from saasbench.evaluation.results import Aggregate, Counts, NodeResult, Status

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


def benchmark_score(task_scores: Iterable[float | None]) -> float | None:
    """Unweighted mean of task scores (tasks without a score are left out)."""
    values = [s for s in task_scores if s is not None]
    return round(sum(values) / len(values), 2) if values else None
