"""Unit tests of saasbench.evaluation.scoring against the paper's formulas (Appendix B.4).

Every expected number below is worked out by hand in a comment next to the assertion.
"""

from __future__ import annotations

import pytest

from saasbench.evaluation import scoring
from saasbench.evaluation.results import NodeResult, Status


def node(
    status: Status,
    score: float,
    max_score: float,
    *,
    method: str = "binary",
    category: str = "C",
    tier: str | None = None,
    node_id: str = "N",
) -> NodeResult:
    return NodeResult(
        id=node_id,
        category=category,
        method=method,
        complexity_tier=tier,
        status=status,
        score=score,
        max_score=max_score,
    )


# --- node scores ------------------------------------------------------------------------------
def test_binary_is_all_or_nothing() -> None:
    assert scoring.binary_score(True, 5) == 5
    assert scoring.binary_score(False, 5) == 0.0
    assert scoring.binary_score(True, 0) == 0  # a zero-point node scores nothing either way


@pytest.mark.parametrize(
    ("passed", "total", "max_score", "expected"),
    [
        (2, 3, 5, 3.3),  # 2/3*5 = 3.333.. -> floor to 0.1 = 3.3
        (1, 3, 2, 0.6),  # 1/3*2 = 0.666.. -> 0.6 (floor, not round: 0.7 would be wrong)
        (2, 3, 2, 1.3),  # 1.333.. -> 1.3
        (5, 6, 1, 0.8),  # 0.8333.. -> 0.8
        (3, 10, 10, 3.0),  # 0.3*10 = 3.0000000000000004 or 2.9999.. in floats -> must be 3.0, not 2.9
        (7, 10, 1, 0.7),  # 0.7 exactly (0.7*10 = 7.000000000000001)
        (3, 3, 4, 4.0),  # all steps: full marks
        (0, 4, 4, 0.0),  # none: 0
        (1, 7, 3, 0.4),  # 3/7 = 0.428.. -> 0.4
        (6, 7, 3, 2.5),  # 18/7 = 2.571.. -> 2.5
    ],
)
def test_weighted_floors_to_one_decimal(passed: int, total: int, max_score: float, expected: float) -> None:
    assert scoring.weighted_score(passed, total, max_score) == expected


def test_weighted_with_no_steps_is_zero() -> None:
    assert scoring.weighted_score(0, 0, 5) == 0.0


def test_floor_tenth() -> None:
    assert scoring.floor_tenth(3.3333) == 3.3
    assert scoring.floor_tenth(0.29999999999999993) == 0.3  # 0.1*3 in floats: the epsilon keeps it at 0.3
    assert scoring.floor_tenth(0.69) == 0.6
    assert scoring.floor_tenth(0) == 0


@pytest.mark.parametrize(
    ("judge", "score_range", "max_score", "expected"),
    [
        (4, (0, 5), 5, 4.0),  # 4*5/5
        (3, (0, 6), 4, 2.0),  # 3*4/6
        (5, (0, 10), 5, 2.5),  # 5*5/10
        (7, (0, 5), 2, 2.0),  # 7*2/5 = 2.8 -> clipped to M = 2
        (-1, (0, 5), 5, 0.0),  # negative -> clipped to 0
        (0, (0, 5), 5, 0.0),
        (3, None, 6, 3.0),  # default range [0, M]: 3*6/6
        (2, (1, 3), 6, 4.0),  # the formula uses hi only: 2*6/3
        (2, (0, 0), 6, 0.0),  # a degenerate range scores 0 rather than dividing by zero
    ],
)
def test_judge_score_is_clipped_and_scaled(
    judge: float, score_range: tuple[float, float] | None, max_score: float, expected: float
) -> None:
    assert scoring.judge_score(judge, score_range, max_score) == pytest.approx(expected)


def test_status_for() -> None:
    assert scoring.status_for(0.6, 2, False) is Status.PASSED  # partial weighted is PASSED (score > 0)
    assert scoring.status_for(0.0, 2, False) is Status.FAILED
    assert scoring.status_for(0.0, 0, True) is Status.PASSED  # zero-point fixture whose chain passed
    assert scoring.status_for(0.0, 0, False) is Status.FAILED


# --- aggregates -------------------------------------------------------------------------------
def sample() -> list[NodeResult]:
    return [
        node(Status.PASSED, 5, 5, category="API", node_id="a"),  # binary full
        node(Status.PASSED, 3.3, 5, method="weighted", category="API", node_id="b"),  # weighted 2/3
        node(Status.FAILED, 0, 4, category="Auth", node_id="c"),
        node(Status.SKIPPED_DEPENDENCY, 0, 6, category="Auth", node_id="d"),  # keeps its 6 in the denominator
        node(Status.ERROR, 0, 2, category="Auth", node_id="e"),
        node(Status.PASSED, 2, 4, method="llm-judge", category="Quality", node_id="f"),
        node(Status.SKIPPED_LLM, 0, 8, method="llm-judge", category="Quality", node_id="g"),  # dropped entirely
        node(Status.FAILED, 0, 2, method="llm-judge", category="Quality", node_id="h"),
    ]


def test_task_score_excludes_skipped_llm_but_keeps_skipped_dependency() -> None:
    results = sample()
    # numerator:   5 + 3.3 + 0 + 0 + 0 + 2 + 0 = 10.3           (g excluded)
    # denominator: 5 + 5 + 4 + 6 + 2 + 4 + 2 = 28               (g's 8 excluded, d's 6 kept)
    # S_t = 100 * 10.3 / 28 = 36.7857.. -> 36.79
    agg = scoring.aggregate(results)
    assert agg.score == 10.3
    assert agg.max_score == 28
    assert agg.percent == 36.79
    assert scoring.task_score(results) == 36.79
    assert agg.skipped_llm_max_score == 8
    assert agg.nodes == 8
    c = agg.counts
    assert (c.PASSED, c.FAILED, c.ERROR, c.SKIPPED_DEPENDENCY, c.SKIPPED_LLM, c.DRY_RUN) == (3, 2, 1, 1, 1, 0)


def test_deterministic_subscore_ignores_judge_nodes() -> None:
    # non-judge nodes a..e: (5 + 3.3 + 0 + 0 + 0) / (5 + 5 + 4 + 6 + 2) = 8.3 / 22 = 37.7272.. -> 37.73
    assert scoring.deterministic_score(sample()) == 37.73


def test_node_coverage_is_passed_over_all_nodes() -> None:
    # 3 PASSED (a, b, f) of 8 nodes; SKIPPED_LLM still counts as a node: 3/8 = 37.5
    assert scoring.node_coverage(sample()) == 37.5
    assert scoring.node_coverage([]) is None


def test_group_by_category_uses_the_same_rule() -> None:
    groups = scoring.group_by(sample(), lambda r: r.category)
    assert set(groups) == {"API", "Auth", "Quality"}
    # API: (5 + 3.3) / (5 + 5) = 83.0
    assert (groups["API"].score, groups["API"].max_score, groups["API"].percent) == (8.3, 10, 83.0)
    # Auth: 0 / (4 + 6 + 2) = 0.0
    assert (groups["Auth"].score, groups["Auth"].max_score, groups["Auth"].percent) == (0, 12, 0.0)
    # Quality: 2 / (4 + 2) = 33.33 (g's 8 dropped and reported)
    assert (groups["Quality"].score, groups["Quality"].max_score, groups["Quality"].percent) == (2, 6, 33.33)
    assert groups["Quality"].skipped_llm_max_score == 8


def test_group_by_skips_nodes_without_a_key() -> None:
    results = [node(Status.PASSED, 1, 1, tier="t1"), node(Status.PASSED, 1, 1, tier=None)]
    groups = scoring.group_by(results, lambda r: r.complexity_tier)
    assert list(groups) == ["t1"] and groups["t1"].nodes == 1


def test_all_skipped_llm_has_no_score() -> None:
    results = [node(Status.SKIPPED_LLM, 0, 5, method="llm-judge")]
    assert scoring.task_score(results) is None
    assert scoring.deterministic_score(results) is None  # no non-judge nodes at all
    assert scoring.aggregate(results).skipped_llm_max_score == 5


def test_zero_point_nodes_do_not_change_the_score() -> None:
    # 4 / (4 + 0) = 100: a passing maxScore-0 fixture adds nothing to either side
    results = [node(Status.PASSED, 4, 4), node(Status.PASSED, 0, 0)]
    assert scoring.task_score(results) == 100.0
    assert scoring.node_coverage(results) == 100.0


def test_dry_run_and_quarantine_are_excluded() -> None:
    results = [node(Status.PASSED, 2, 2), node(Status.DRY_RUN, 0, 3), node(Status.QUARANTINED, 0, 5)]
    # 2 / 2 = 100; coverage over non-quarantined, non-dry-run nodes: 1/1
    assert scoring.task_score(results) == 100.0
    assert scoring.node_coverage(results) == 100.0
    assert scoring.task_score([node(Status.DRY_RUN, 0, 3)]) is None


def test_benchmark_score_is_the_unweighted_mean_of_task_scores() -> None:
    # (100 + 50 + 12.5) / 3 = 54.1666.. -> 54.17; a task of 1 node weighs as much as one of 300
    assert scoring.benchmark_score([100.0, 50.0, 12.5]) == 54.17
    # a task without a score (every node SKIPPED_LLM) is left out: (80 + 40) / 2
    assert scoring.benchmark_score([80.0, None, 40.0]) == 60.0
    assert scoring.benchmark_score([]) is None
    assert scoring.benchmark_score([None]) is None


def test_counts_cover_every_status() -> None:
    results = [node(s, 0, 1) for s in Status]
    c = scoring.counts(results)
    assert all(getattr(c, s.value) == 1 for s in Status)
