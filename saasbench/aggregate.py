"""Benchmark aggregation over the lake: the paper's Table 2 and Table 3 from ``trials`` and ``node_results``.

Every number comes from :mod:`saasbench.scoring` (the one scoring module): rows are read from
DuckDB and turned back into :class:`~saasbench.results.NodeResult` objects, then scored with
``scoring.aggregate`` / ``task_score`` / ``deterministic_score`` / ``node_coverage`` /
``benchmark_score``. The numerator/denominator rule (SKIPPED_LLM out of numerator and denominator,
SKIPPED_DEPENDENCY keeps its maxScore) is scoring.py's; the breakdowns use
:func:`group_aggregate`, a one-pass equivalent of ``scoring.aggregate`` (same exclusion set, sums
and rounding) that the tests check equals it field by field, because the per-group calls dominate
the run time on a full sweep. That path (:func:`sweep_report_reference`, :func:`compute`) is the
reference; :func:`sweep_report` computes the same numbers without NodeResult objects: DuckDB applies
the rules and orders the node rows, the numerator/denominator sums are grouped sums in the reference
order (see "fast path" below), and tests check both give the same SweepReport.

Definitions (per (agent, model) "configuration"; ``scope`` is ``all`` or ``valid``):

- **Trial score** ``S`` = ``scoring.task_score`` over the trial's node rows. A trial without a
  score (no node rows, e.g. the environment never came up, or every node SKIPPED_LLM) counts as
  **0** (``effective_score``); a ``voided_cheat`` trial counts as 0 and its nodes as not passed
  (every node that was not excluded is re-scored FAILED with 0 points).
- **Scopes.** ``all``: every trial. ``valid``: trials whose outcome is agent-caused
  (``lake.schema.VALID_OUTCOMES``); infra outcomes (env_error, judge_error, task_defect) are
  excluded and counted separately (``infra_trials``, ``outcome_counts``).
- **Pass@1 (benchmark score)** = the paper's Pass@1: for each task, the mean of the trial scores
  over its attempts (mean over attempts first, so a task with more attempts does not weigh
  more), then the unweighted mean over tasks (``scoring.benchmark_score``).
- **Deterministic subscore**: the same with ``scoring.deterministic_score`` (llm-judge nodes out).
- **Node coverage** = PASSED nodes / all nodes, pooled over every node row of every trial in
  scope (the paper: "proportion of validation nodes that reach the Passed state across all
  tasks"); trials without node rows add nothing to it.
- **Breakdowns** (domain from ``trials.domain``; backbone via :mod:`saasbench.backbones`; node
  category; node complexity tier; trajectory type when ``trials.trajectory`` exists):
  ``score`` = per trial, ``scoring.aggregate`` over the trial's nodes in the group; then mean
  over attempts per task, then unweighted mean over the tasks that have nodes in the group
  (macro, like Pass@1). For domains the group is the whole trial, so ``score`` is Pass@1
  restricted to the domain's tasks. ``pooled`` is ``scoring.aggregate`` over all node rows of the
  group (micro) for reference.
- **Dropped judge maxScore** = sum of maxScore of SKIPPED_LLM nodes (``skipped_llm_max_score``).
- **pass@k**: a trial *passes* when its effective score >= ``pass_threshold`` (default 100: the
  task is fully solved). Per task with n attempts of which c pass, the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021) is the probability that the best of k attempts
  drawn without replacement passes; pass@k is its mean over tasks with n >= k. Reported for
  k = 1..max n. This is not the paper's "Pass@1" column, which is the mean task score.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from saasbench import scoring
from saasbench.backbones import BACKBONES, backbone_for, unknown_categories
from saasbench.lake.schema import INFRA_OUTCOMES  # env_error, judge_error, task_defect: not valid trials
from saasbench.results import Aggregate, Counts, NodeResult, Status

DOMAINS: tuple[str, ...] = ("CG", "PC", "CF", "DCI", "SI", "DW")
DEFAULT_PASS_THRESHOLD = 100.0
_EXCLUDED_STATUSES = {s.value for s in scoring.EXCLUDED}
MAX_ISSUES = 500
MESSAGE_CHARS = 2000

Scope = Literal["all", "valid"]

TRIAL_COLUMNS = ("sweep_id", "trial_id", "task_id", "agent", "model", "attempt", "domain", "outcome",
                 "task_score", "deterministic_score")
NODE_COLUMNS = ("sweep_id", "trial_id", "task_id", "agent", "model", "attempt", "node_id", "node_index", "category",
                "subcategory", "method", "complexity_tier", "status", "score", "max_score", "message")


# --- result models ----------------------------------------------------------------------------
class TrialScore(BaseModel):
    sweep_id: str
    trial_id: str
    task_id: str
    agent: str | None
    model: str | None
    attempt: int
    domain: str | None
    outcome: str
    valid: bool
    trajectory: str | None = None
    task_score: float | None = Field(description="scoring.task_score over the trial's node rows")
    deterministic_score: float | None
    effective_score: float = Field(description="task_score, or 0 when there is none or the trial was voided")
    effective_deterministic: float
    node_coverage: float | None
    nodes: int
    skipped_llm_max_score: float
    counts: Counts
    lake_task_score: float | None = Field(None, description="trials.task_score as stored by the writer")


class GroupScore(BaseModel):
    score: float | None = Field(description="macro: mean over tasks (mean over attempts first) of the group percent")
    pooled: Aggregate = Field(description="micro: scoring.aggregate over every node row of the group")
    tasks: int = Field(description="tasks with a score in this group")


class ScopeSummary(BaseModel):
    scope: Scope
    trials: int
    tasks: int
    pass_at_1: float | None = Field(description="paper Pass@1: mean over tasks of the mean-over-attempts task score")
    deterministic: float | None
    node_coverage: float | None
    skipped_llm_max_score: float
    status_counts: Counts
    domains: dict[str, GroupScore] = Field(default_factory=dict)
    backbones: dict[str, GroupScore] = Field(default_factory=dict)
    categories: dict[str, GroupScore] = Field(default_factory=dict)
    complexity_tiers: dict[str, GroupScore] = Field(default_factory=dict)
    trajectories: dict[str, GroupScore] = Field(default_factory=dict)
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    task_scores: dict[str, float] = Field(default_factory=dict, description="task id -> mean over attempts")


class ConfigReport(BaseModel):
    agent: str | None
    model: str | None
    outcome_counts: dict[str, int]
    valid_trials: int
    infra_trials: int
    all: ScopeSummary
    valid: ScopeSummary

    @property
    def label(self) -> str:
        return config_label(self.agent, self.model)


class ScoreMismatch(BaseModel):
    trial_id: str
    stored: float | None
    recomputed: float | None


class NodeIssue(BaseModel):
    """A node that did not pass, with its message (app text: untrusted data, escape on display)."""

    trial_id: str
    agent: str | None
    model: str | None
    task_id: str
    node_id: str
    category: str | None
    status: str
    message: str


class SweepReport(BaseModel):
    sweeps: list[str]
    pass_threshold: float
    configs: list[ConfigReport]
    trials: list[TrialScore]
    domains: list[str] = Field(description="domains present, paper order first")
    unknown_categories: list[str] = Field(description="categories the backbone mapping cannot place (defects)")
    unknown_category_nodes: int
    trajectory_available: bool
    node_issues: list[NodeIssue] = Field(
        default_factory=list, description=f"up to {MAX_ISSUES} nodes not PASSED (evaluation order), messages capped")
    orphan_node_rows: int = Field(0, description="node_results rows whose trial has no trials row (not scored)")
    score_mismatches: list[ScoreMismatch] = Field(
        default_factory=list, description="trials whose stored task_score differs from scoring.py on their node rows")


class NodeChange(BaseModel):
    agent: str | None
    model: str | None
    task_id: str
    node_id: str
    category: str | None
    status_a: str
    status_b: str
    change: Literal["gained", "lost"]


class PairedComparison(BaseModel):
    agent: str | None
    model: str | None
    tasks: int
    mean_a: float | None
    mean_b: float | None
    mean_diff: float | None = Field(description="mean over tasks of (B - A) task score")
    ci_low: float | None
    ci_high: float | None
    per_task: dict[str, tuple[float, float, float]] = Field(default_factory=dict, description="task -> (A, B, B-A)")


class CompareReport(BaseModel):
    sweep_a: str
    sweep_b: str
    resamples: int
    seed: int
    configs: list[PairedComparison]
    only_in_a: list[str]
    only_in_b: list[str]
    node_changes: list[NodeChange]


def config_label(agent: str | None, model: str | None) -> str:
    return f"{agent or '-'} / {model or '-'}"


# --- row loading ------------------------------------------------------------------------------
def connect(lake: Any, *, sweep_id: str | None = None):
    """A DuckDB connection with one view per lake table (``saasbench.lake.query.connect``);
    ``lake`` None: ``$SAASBENCH_LAKE`` or ``runs/lake``."""
    from saasbench.lake.query import connect as _connect

    return _connect(str(lake) if isinstance(lake, Path) else lake, sweep_id=sweep_id)


def _is_lake(x: Any) -> bool:
    return x is None or isinstance(x, (str, Path)) or not hasattr(x, "execute")


def _columns(con, view: str) -> set[str]:
    try:
        return {r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()}
    except Exception:  # noqa: BLE001 - a missing view means "no such column"
        return set()


def _fetch(con, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def load_rows(con, sweeps: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """Trial rows, node rows of the given sweeps and whether ``trials.trajectory`` exists."""
    if not sweeps:
        raise ValueError("no sweep given")
    marks = ", ".join("?" for _ in sweeps)
    have = _columns(con, "trials")
    traj = "trajectory" in have
    tcols = [c for c in TRIAL_COLUMNS if c in have] + (["trajectory"] if traj else [])
    trials = _fetch(con, f"SELECT {', '.join(tcols)} FROM trials WHERE sweep_id IN ({marks}) "
                         "ORDER BY sweep_id, task_id, agent, model, attempt, trial_id", sweeps)
    ncols = [c for c in NODE_COLUMNS if c in _columns(con, "node_results")]
    nodes = _fetch(con, f"SELECT {', '.join(ncols)} FROM node_results WHERE sweep_id IN ({marks}) "
                        "ORDER BY sweep_id, trial_id, node_index, node_id", sweeps)
    return trials, nodes, traj


def node_result(row: dict[str, Any], *, voided: bool = False) -> NodeResult:
    """A lake node row as the scoring module's NodeResult (message kept as data)."""
    status = Status(row.get("status") or "ERROR")
    score = float(row.get("score") or 0.0)
    if voided and status.value not in _EXCLUDED_STATUSES:
        status, score = Status.FAILED, 0.0
    return NodeResult(
        id=str(row.get("node_id")),
        category=row.get("category") or "",
        subcategory=row.get("subcategory") or "",
        method=row.get("method") or "",
        complexity_tier=row.get("complexity_tier"),
        status=status,
        score=score,
        max_score=float(row.get("max_score") or 0.0),
        message=row.get("message") or "",
    )


# --- core computation -------------------------------------------------------------------------
@dataclass
class _Trial:
    row: dict[str, Any]
    nodes: list[NodeResult] = field(default_factory=list)
    score: TrialScore | None = None


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _macro(trials: list[_Trial], per_trial: Callable[[_Trial], float | None]) -> tuple[float | None, int, dict[str, float]]:
    """Mean over attempts per task (trials with no value left out), then scoring.benchmark_score over tasks."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        v = per_trial(t)
        if v is not None:
            by_task[t.row["task_id"]].append(v)
    task_means = {task: sum(v) / len(v) for task, v in by_task.items()}
    return scoring.benchmark_score(task_means.values()), len(task_means), task_means


def group_aggregate(nodes: Sequence[NodeResult]) -> Aggregate:
    """``scoring.aggregate(nodes)``, computed in one pass without pydantic attribute writes per node.

    The breakdowns call this once per (trial, group) and per group: tens of thousands of times on a
    full sweep, where ``scoring.counts`` (a validated ``setattr`` per node) dominates the run time.
    Same exclusion set (``scoring.EXCLUDED``), same sums in the same order, same rounding;
    tests/test_aggregate.py checks it equals ``scoring.aggregate`` field by field on random node sets.
    """
    score_parts: list[float] = []
    max_parts: list[float] = []
    statuses: Counter[str] = Counter()
    skipped = []
    for n in nodes:
        statuses[n.status.value] += 1
        if n.status not in scoring.EXCLUDED:
            score_parts.append(n.score)
            max_parts.append(n.max_score)
        if n.status == Status.SKIPPED_LLM:
            skipped.append(n.max_score)
    score, max_score = sum(score_parts), sum(max_parts)
    return Aggregate(
        score=round(score, 4),
        max_score=round(max_score, 4),
        percent=round(100 * score / max_score, 2) if max_score > 0 else None,
        nodes=len(nodes),
        counts=Counts(**statuses),
        skipped_llm_max_score=sum(skipped),
    )


def group_percent(nodes: Sequence[NodeResult]) -> float | None:
    """``scoring.aggregate(nodes).percent`` (see :func:`group_aggregate`)."""
    score_parts: list[float] = []
    max_parts: list[float] = []
    for n in nodes:
        if n.status not in scoring.EXCLUDED:
            score_parts.append(n.score)
            max_parts.append(n.max_score)
    score, max_score = sum(score_parts), sum(max_parts)
    return round(100 * score / max_score, 2) if max_score > 0 else None


def _group(trials: list[_Trial], key: Callable[[NodeResult], str | None]) -> dict[str, GroupScore]:
    """Per group key: macro score over tasks (per-trial group percent, mean over attempts) and pooled aggregate."""
    per_trial: list[tuple[_Trial, dict[str, list[NodeResult]]]] = []
    keys: dict[str, None] = {}
    for t in trials:
        groups: dict[str, list[NodeResult]] = {}
        for n in t.nodes:
            k = key(n)
            if k is not None:
                groups.setdefault(k, []).append(n)
                keys.setdefault(k, None)
        per_trial.append((t, groups))
    out: dict[str, GroupScore] = {}
    for k in keys:
        by_task: dict[str, list[float]] = defaultdict(list)
        pooled: list[NodeResult] = []
        for t, groups in per_trial:
            sel = groups.get(k)
            if not sel:
                continue
            pooled.extend(sel)
            pct = group_percent(sel)
            if pct is not None:
                by_task[t.row["task_id"]].append(pct)
        score = scoring.benchmark_score(sum(v) / len(v) for v in by_task.values())
        out[k] = GroupScore(score=score, pooled=group_aggregate(pooled), tasks=len(by_task))
    return out


def _by_trial_attr(trials: list[_Trial], attr: str, order: Sequence[str] = ()) -> dict[str, GroupScore]:
    present = {t.row.get(attr) for t in trials if t.row.get(attr)}
    keys = [k for k in order if k in present] + sorted(present - set(order))
    out: dict[str, GroupScore] = {}
    for k in keys:
        sel = [t for t in trials if t.row.get(attr) == k]
        score, ntasks, _ = _macro(sel, lambda t: t.score.effective_score)
        out[k] = GroupScore(score=score, pooled=group_aggregate([n for t in sel for n in t.nodes]), tasks=ntasks)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: 1 - C(n-c, k)/C(n, k) (n attempts, c passing, k <= n)."""
    if k > n or k < 1:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _pass_at_k(trials: list[_Trial], threshold: float) -> dict[int, float]:
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        by_task[t.row["task_id"]].append(t.score.effective_score)
    if not by_task:
        return {}
    out: dict[int, float] = {}
    for k in range(1, max(len(v) for v in by_task.values()) + 1):
        vals = [pass_at_k(len(v), sum(1 for s in v if s >= threshold), k) for v in by_task.values() if len(v) >= k]
        out[k] = round(100 * sum(vals) / len(vals), 2)
    return out


def _scope(trials: list[_Trial], scope: Scope, threshold: float, traj: bool) -> ScopeSummary:
    nodes = [n for t in trials for n in t.nodes]
    p1, ntasks, task_means = _macro(trials, lambda t: t.score.effective_score)
    det, _, _ = _macro(trials, lambda t: t.score.effective_deterministic)
    bb = _group(trials, lambda n: backbone_for(n.category))
    return ScopeSummary(
        scope=scope,
        trials=len(trials),
        tasks=ntasks,
        pass_at_1=p1,
        deterministic=det,
        node_coverage=scoring.node_coverage(nodes),
        skipped_llm_max_score=round(sum(n.max_score for n in nodes if n.status == Status.SKIPPED_LLM), 4),
        status_counts=group_aggregate(nodes).counts,
        domains=_by_trial_attr(trials, "domain", DOMAINS),
        backbones={b: bb[b] for b in BACKBONES if b in bb},
        categories=dict(sorted(_group(trials, lambda n: n.category or "").items())),
        complexity_tiers=dict(sorted(_group(trials, lambda n: n.complexity_tier).items())),
        trajectories=_by_trial_attr(trials, "trajectory") if traj else {},
        pass_at_k=_pass_at_k(trials, threshold),
        task_scores={k: round(v, 4) for k, v in sorted(task_means.items())},
    )


def _score_trial(t: _Trial, traj: bool) -> TrialScore:
    r = t.row
    agg = scoring.aggregate(t.nodes)
    ts = agg.percent  # = scoring.task_score(t.nodes)
    ds = scoring.deterministic_score(t.nodes)
    outcome = r.get("outcome") or "completed"
    return TrialScore(
        sweep_id=r["sweep_id"], trial_id=r["trial_id"], task_id=r["task_id"], agent=r.get("agent"),
        model=r.get("model"), attempt=int(r.get("attempt") or 0), domain=r.get("domain"), outcome=outcome,
        valid=outcome not in INFRA_OUTCOMES, trajectory=r.get("trajectory") if traj else None,
        task_score=ts, deterministic_score=ds,
        effective_score=ts if ts is not None else 0.0,
        effective_deterministic=ds if ds is not None else 0.0,
        node_coverage=scoring.node_coverage(t.nodes), nodes=len(t.nodes),
        skipped_llm_max_score=agg.skipped_llm_max_score, counts=agg.counts,
        lake_task_score=r.get("task_score"),
    )


def compute(trial_rows: list[dict[str, Any]], node_rows: list[dict[str, Any]], *,
            pass_threshold: float = DEFAULT_PASS_THRESHOLD, trajectory: bool = False,
            sweeps: Sequence[str] = ()) -> SweepReport:
    """The sweep report from plain rows (``trials`` and ``node_results`` columns of lake.schema)."""
    trials: dict[tuple[str, str], _Trial] = {}
    for r in trial_rows:
        trials[(r["sweep_id"], r["trial_id"])] = _Trial(dict(r))
    orphans = 0
    for r in node_rows:
        t = trials.get((r["sweep_id"], r["trial_id"]))
        if t is None:
            orphans += 1  # node rows of a trial with no trials row: not scorable (no outcome/domain)
            continue
        t.nodes.append(node_result(r, voided=(t.row.get("outcome") == "voided_cheat")))
    mismatches: list[ScoreMismatch] = []
    for t in trials.values():
        t.score = _score_trial(t, trajectory)
        stored = t.score.lake_task_score
        if t.nodes and t.row.get("outcome") != "voided_cheat" and not _close(stored, t.score.task_score):
            mismatches.append(ScoreMismatch(trial_id=t.row["trial_id"], stored=stored, recomputed=t.score.task_score))

    configs: dict[tuple[str | None, str | None], list[_Trial]] = defaultdict(list)
    for t in trials.values():
        configs[(t.row.get("agent"), t.row.get("model"))].append(t)
    reports = []
    for (agent, model), ts in sorted(configs.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
        valid = [t for t in ts if t.score.valid]
        reports.append(ConfigReport(
            agent=agent, model=model,
            outcome_counts=dict(sorted(Counter(t.score.outcome for t in ts).items())),
            valid_trials=len(valid), infra_trials=len(ts) - len(valid),
            all=_scope(ts, "all", pass_threshold, trajectory),
            valid=_scope(valid, "valid", pass_threshold, trajectory),
        ))
    all_nodes = [n for t in trials.values() for n in t.nodes]
    unknown = unknown_categories(n.category for n in all_nodes)
    present = {t.row.get("domain") for t in trials.values() if t.row.get("domain")}
    issues = [
        NodeIssue(trial_id=t.row["trial_id"], agent=t.row.get("agent"), model=t.row.get("model"),
                  task_id=t.row["task_id"], node_id=n.id, category=n.category, status=n.status.value,
                  message=n.message[:MESSAGE_CHARS])
        for t, n in islice(((t, n) for t in trials.values() for n in t.nodes if n.status != Status.PASSED), MAX_ISSUES)
    ]
    return SweepReport(
        node_issues=issues,
        orphan_node_rows=orphans,
        sweeps=list(sweeps) or sorted({t.row["sweep_id"] for t in trials.values()}),
        pass_threshold=pass_threshold,
        configs=reports,
        trials=[t.score for t in trials.values()],
        domains=[d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS)),
        unknown_categories=unknown,
        unknown_category_nodes=sum(1 for n in all_nodes if backbone_for(n.category) is None),
        trajectory_available=trajectory,
        score_mismatches=mismatches,
    )


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 0.01


def sweep_report(con_or_lake, sweeps: str | Sequence[str], *, pass_threshold: float = DEFAULT_PASS_THRESHOLD) -> SweepReport:
    """Aggregate one or more sweeps. ``con_or_lake``: a DuckDB connection with lake views, or a lake URI.

    The node-level sums run in DuckDB (:func:`_sql_report`); the result equals
    :func:`sweep_report_reference` (node rows scored in Python by :func:`compute`), which it falls
    back to for rows only the reference handles (duplicate trial rows, unknown node statuses)."""
    sweeps = [sweeps] if isinstance(sweeps, str) else list(sweeps)
    if not sweeps:
        raise ValueError("no sweep given")
    con = connect(con_or_lake, sweep_id=sweeps[0] if len(sweeps) == 1 else None) if _is_lake(con_or_lake) else con_or_lake
    report = _sql_report(con, sweeps, pass_threshold)
    if report is not None:
        return report
    trials, nodes, traj = load_rows(con, sweeps)
    return compute(trials, nodes, pass_threshold=pass_threshold, trajectory=traj, sweeps=sweeps)


def sweep_report_reference(con_or_lake, sweeps: str | Sequence[str], *,
                           pass_threshold: float = DEFAULT_PASS_THRESHOLD) -> SweepReport:
    """The reference path: node rows loaded into Python and scored with saasbench.scoring (slow)."""
    sweeps = [sweeps] if isinstance(sweeps, str) else list(sweeps)
    con = connect(con_or_lake, sweep_id=sweeps[0] if len(sweeps) == 1 else None) if _is_lake(con_or_lake) else con_or_lake
    trials, nodes, traj = load_rows(con, sweeps)
    return compute(trials, nodes, pass_threshold=pass_threshold, trajectory=traj, sweeps=sweeps)


# --- fast path: DuckDB prepares the rows, Arrow sums them in the reference order ---------------
# ``sweep_report`` does not build NodeResult objects. DuckDB reads the node rows of the sweeps,
# joins them to their trials, applies the voided_cheat and exclusion rules (SKIPPED_LLM,
# QUARANTINED and DRY_RUN add 0 to numerator and denominator; SKIPPED_DEPENDENCY keeps its
# maxScore; deterministic = method != 'llm-judge'; PASSED / not QUARANTINED or DRY_RUN for
# coverage), maps categories to backbones and orders the rows as the reference path reads them
# (trial order, then node_index, node_id). The numerator / denominator sums per trial, per
# (trial, group) and per (scope, config, group) are then grouped sums over that ordered Arrow table;
# only the per-trial / per-task averaging and the rounding run in Python, with the reference
# path's helpers (_macro, _pass_at_k, scoring.benchmark_score).
#
# Why Arrow and not DuckDB's SUM for the float sums: the reference adds left to right (Python's
# ``sum``), and a last-bit difference can flip a ``round(x, 2)`` (100 * (0.1 + 0.2) / 240 rounds to
# 0.13, 100 * 0.3 / 240 to 0.12). DuckDB's ``sum(DOUBLE)`` is compensated (0.1 added ten times
# gives 1.0, Python gives 0.9999999999999999), so it differs; DuckDB's ordered
# ``sum(x ORDER BY ...)`` is sequential but took 0.27 s per sum over 1M rows (the report needs about ten).
# Arrow's single-threaded hash ``sum`` adds each group's values in input order, exactly like
# Python. Excluded rows add 0.0 (x + 0.0 == x). Counts are integer sums (exact in any order).
_ST = ("PASSED", "FAILED", "ERROR", "SKIPPED_DEPENDENCY", "SKIPPED_LLM", "DRY_RUN", "QUARANTINED")
_EXCL_SQL = "('" + "', '".join(sorted(_EXCLUDED_STATUSES)) + "')"
_T, _N, _BB, _C = ("_saasbench_agg_trials", "_saasbench_agg_nodes", "_saasbench_agg_backbones",
                   "_saasbench_agg_configs")
_SUMS = ("ks", "km", "skm") + tuple(f"c_{s}" for s in _ST)


def _pct(s: float, m: float) -> float | None:
    return round(100 * s / m, 2) if m > 0 else None


_EMPTY_SUMS: dict[str, Any] = {"nodes": 0, "ks": 0, "km": 0, "skm": 0, **{f"c_{k}": 0 for k in _ST}}


def _agg_from(r: dict[str, Any]) -> Aggregate:
    """``group_aggregate`` of a group from its sums (same sums, same rounding)."""
    s, m = r["ks"], r["km"]
    return Aggregate(score=round(s, 4), max_score=round(m, 4), percent=_pct(s, m), nodes=r["nodes"],
                     counts=Counts(**{k: r[f"c_{k}"] for k in _ST}), skipped_llm_max_score=r["skm"])


def _grouped(tbl, keys: list[str], cols: Sequence[str]) -> dict[tuple, dict[str, Any]]:
    """{key tuple: {col: sum, 'nodes': rows}}; sums in input order per group (use_threads=False).
    Groups whose last key is NULL are dropped (a node without a backbone, a trial without a domain):
    grouping them and dropping them after is cheaper than filtering the table first."""
    if tbl.num_rows == 0:
        return {}
    res = tbl.select(list(dict.fromkeys([*keys, *cols]))).group_by(keys, use_threads=False).aggregate(
        [(c, "sum") for c in cols] + [([], "count_all")])
    kcols = [res.column(k).to_pylist() for k in keys]
    vals = [res.column(f"{c}_sum").to_pylist() for c in cols]
    counts = res.column("count_all").to_pylist()
    out = {}
    for i, key in enumerate(zip(*kcols)):
        if key[-1] is None:
            continue
        d = dict(zip(cols, (v[i] for v in vals)))
        d["nodes"] = counts[i]
        out[key] = d
    return out


@dataclass
class _LightTrial:
    """A trial row and its TrialScore (all _macro / _pass_at_k read), without node objects."""
    row: dict[str, Any]
    score: TrialScore
    cfg: int = 0


def _sql_report(con, sweeps: Sequence[str], pass_threshold: float) -> SweepReport | None:
    """The sweep report without NodeResult objects, or None when the rows need the reference path
    (duplicate trial rows, node statuses Status() rejects, views without the lake columns)."""
    # Each query over the lake views reads their files again, so the views are read once each:
    # the columns come from the temporary tables, not from DESCRIBE.
    from saasbench.lake.query import _quote  # the lake's one SQL string quoting

    marks = ", ".join("?" for _ in sweeps)
    want_t = ", ".join(f"'{c}'" for c in (*TRIAL_COLUMNS, "trajectory"))
    want_n = ", ".join(f"'{c}'" for c in NODE_COLUMNS)
    try:
        con.execute(
            f"CREATE OR REPLACE TEMPORARY TABLE {_T} AS SELECT COLUMNS(c -> c IN ({want_t})), "
            "row_number() OVER (ORDER BY sweep_id, task_id, agent, model, attempt, trial_id) - 1 AS tord "
            f"FROM trials WHERE sweep_id IN ({marks})", list(sweeps))
        have_t = _columns(con, _T)
        if not set(TRIAL_COLUMNS) <= have_t:
            return None
        traj = "trajectory" in have_t
        if con.execute(f"SELECT count(*) - count(DISTINCT (sweep_id, trial_id)) FROM {_T}").fetchone()[0]:
            return None  # the reference keeps the last row of a duplicated trial: let it
        con.execute(f"CREATE OR REPLACE TEMPORARY VIEW {_N}_raw AS SELECT COLUMNS(c -> c IN ({want_n})) "
                    "FROM node_results LIMIT 0")
        if not set(NODE_COLUMNS) <= _columns(con, f"{_N}_raw"):
            return None
        import pyarrow as pa

        con.register(f"{_N}_sweeps", pa.table({"sweep_id": pa.array(list(sweeps), pa.string())}))
        voided = f"coalesce(t.outcome = 'voided_cheat', false) AND st0 NOT IN {_EXCL_SQL}"
        con.execute(
            f"CREATE OR REPLACE TEMPORARY TABLE {_N} AS "
            "WITH s AS (SELECT sweep_id, trial_id, node_id, node_index, category, method, complexity_tier, "
            f"score, max_score, message, coalesce(nullif(status, ''), 'ERROR') AS st0 FROM node_results "
            f"WHERE sweep_id IN ({', '.join(_quote(str(x)) for x in sweeps)})) "
            "SELECT t.tord, s.node_index, s.node_id, coalesce(s.category, '') AS cat, s.complexity_tier AS tier, "
            "coalesce(s.method, '') = 'llm-judge' AS llm, s.message, st0, "
            f"CASE WHEN {voided} THEN 'FAILED' ELSE st0 END AS st, "
            f"CASE WHEN {voided} THEN 0.0 ELSE coalesce(s.score, 0.0) END AS sc, "
            f"coalesce(s.max_score, 0.0) AS mx, st0 IN {_EXCL_SQL} AS excl "
            f"FROM s LEFT JOIN {_T} t ON t.sweep_id = s.sweep_id AND t.trial_id = s.trial_id")
        con.execute(f"DROP VIEW {_N}_raw")
        con.unregister(f"{_N}_sweeps")
        known = ", ".join(f"'{s}'" for s in _ST)
        orphans, bad = con.execute(f"SELECT count_if(tord IS NULL), count_if(st0 NOT IN ({known})) FROM {_N}").fetchone()
        if bad:
            return None  # Status(...) raises on it in the reference path: let it
        return _sql_compute(con, sweeps, pass_threshold, traj, orphans or 0)  # count_if over no rows is NULL
    finally:
        for name in (_T, _N, _BB, _C):
            con.execute(f"DROP TABLE IF EXISTS {name}")
        con.execute(f"DROP VIEW IF EXISTS {_N}_raw")


def _sql_compute(con, sweeps: Sequence[str], pass_threshold: float, traj: bool, orphans: int) -> SweepReport:
    import pyarrow as pa
    import pyarrow.compute as pc

    from saasbench.lake.query import _arrow

    trial_rows = _fetch(con, f"SELECT * FROM {_T} ORDER BY tord", [])
    cfg_index: dict[tuple[str | None, str | None], int] = {}
    cfgs = [cfg_index.setdefault((r.get("agent"), r.get("model")), len(cfg_index)) for r in trial_rows]
    valid = [(r.get("outcome") or "completed") not in INFRA_OUTCOMES for r in trial_rows]
    con.register(f"{_C}_arrow", pa.table({
        "tord": pa.array([r["tord"] for r in trial_rows], pa.int64()),
        "cfg": pa.array(cfgs, pa.int32()),
        "is_valid": pa.array(valid, pa.bool_()),
        "domain": pa.array([r.get("domain") or None for r in trial_rows], pa.string()),
        "traj": pa.array([(r.get("trajectory") or None) if traj else None for r in trial_rows], pa.string()),
    }))
    con.execute(f"CREATE OR REPLACE TEMPORARY TABLE {_C} AS SELECT * FROM {_C}_arrow")
    con.unregister(f"{_C}_arrow")
    cats = [c for (c,) in con.execute(f"SELECT DISTINCT cat FROM {_N} WHERE tord IS NOT NULL").fetchall()]
    con.register(f"{_BB}_arrow", pa.table({"cat": pa.array(cats, pa.string()),
                                           "backbone": pa.array([backbone_for(c) for c in cats], pa.string())}))
    con.execute(f"CREATE OR REPLACE TEMPORARY TABLE {_BB} AS SELECT * FROM {_BB}_arrow WHERE backbone IS NOT NULL")
    con.unregister(f"{_BB}_arrow")

    # every node row of a trial, in the reference order, with the addends of every sum
    counts = ", ".join(f"(st = '{s}')::INTEGER AS c_{s}" for s in _ST)
    nodes = _arrow(con.execute(
        "SELECT n.tord, c.cfg, c.is_valid, c.domain, c.traj, n.cat, n.tier, b.backbone, "
        "CASE WHEN excl THEN 0.0 ELSE sc END AS ks, CASE WHEN excl THEN 0.0 ELSE mx END AS km, "
        "CASE WHEN excl OR llm THEN 0.0 ELSE sc END AS dks, CASE WHEN excl OR llm THEN 0.0 ELSE mx END AS dkm, "
        f"CASE WHEN st = 'SKIPPED_LLM' THEN mx ELSE 0.0 END AS skm, {counts} "
        f"FROM {_N} n JOIN {_C} c USING (tord) LEFT JOIN {_BB} b USING (cat) "
        "ORDER BY n.tord, n.node_index, n.node_id"))

    per_trial = _grouped(nodes, ["tord"], _SUMS + ("dks", "dkm"))
    trials: list[_LightTrial] = []
    mismatches: list[ScoreMismatch] = []
    for r, cfg in zip(trial_rows, cfgs):
        a = per_trial.get((r["tord"],), _EMPTY_SUMS)
        ts = _pct(a["ks"], a["km"])
        ds = _pct(a.get("dks", 0), a.get("dkm", 0))
        pool = a["nodes"] - a["c_QUARANTINED"] - a["c_DRY_RUN"]
        outcome = r.get("outcome") or "completed"
        score = TrialScore(
            sweep_id=r["sweep_id"], trial_id=r["trial_id"], task_id=r["task_id"], agent=r.get("agent"),
            model=r.get("model"), attempt=int(r.get("attempt") or 0), domain=r.get("domain"), outcome=outcome,
            valid=outcome not in INFRA_OUTCOMES, trajectory=r.get("trajectory") if traj else None,
            task_score=ts, deterministic_score=ds,
            effective_score=ts if ts is not None else 0.0,
            effective_deterministic=ds if ds is not None else 0.0,
            node_coverage=round(100 * a["c_PASSED"] / pool, 2) if pool else None, nodes=a["nodes"],
            skipped_llm_max_score=a["skm"], counts=Counts(**{k: a[f"c_{k}"] for k in _ST}),
            lake_task_score=r.get("task_score"),
        )
        trials.append(_LightTrial(r, score, cfg))
        if a["nodes"] and r.get("outcome") != "voided_cheat" and not _close(score.lake_task_score, ts):
            mismatches.append(ScoreMismatch(trial_id=r["trial_id"], stored=score.lake_task_score, recomputed=ts))

    # node groups: (column, kind); domain and trajectory are trial attributes
    kinds = [("cat", "categories"), ("tier", "complexity_tiers"), ("backbone", "backbones"), ("domain", "domains")]
    if traj:
        kinds.append(("traj", "trajectories"))
    # 'valid' pools other node rows than 'all' only in configs where an infra trial has node rows
    split = sorted({t.cfg for t in trials if not t.score.valid and t.score.nodes})
    scopes = [("all", nodes)]
    if split:
        scopes.append(("valid", nodes.filter(pc.and_(nodes.column("is_valid"),
                                                     pc.is_in(nodes.column("cfg"), pa.array(split, pa.int32()))))))
    pooled: dict[tuple[str, int, str, Any], dict[str, Any]] = {}
    for scope, tbl in scopes:
        for (cfg,), v in _grouped(tbl, ["cfg"], _SUMS).items():
            pooled[(scope, cfg, "total", "")] = v
        for col, kind in kinds:
            for (cfg, key), v in _grouped(tbl, ["cfg", col], _SUMS).items():
                pooled[(scope, cfg, kind, key)] = v
    for (scope, cfg, kind, key), v in list(pooled.items()):
        if scope == "all" and cfg not in split:
            pooled[("valid", cfg, kind, key)] = v

    # per (trial, group): the trial's group percent, appended in trial order (macro breakdowns)
    macro: dict[tuple[str, int, str, Any], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for col, kind in kinds[:3]:
        res = nodes.select(["tord", col, "ks", "km"]).group_by(["tord", col], use_threads=False).aggregate(
            [("ks", "sum"), ("km", "sum")])
        res = res.filter(pc.and_(pc.is_valid(res.column(col)), pc.greater(res.column("km_sum"), 0)))
        res = res.take(pc.sort_indices(res, [("tord", "ascending")]))  # trial order; stable within a trial
        for tord, key, ks, km in zip(*(res.column(c).to_pylist() for c in ("tord", col, "ks_sum", "km_sum"))):
            pct = round(100 * ks / km, 2)
            t = trials[tord]
            macro[("all", t.cfg, kind, key)][t.row["task_id"]].append(pct)
            if t.score.valid:
                macro[("valid", t.cfg, kind, key)][t.row["task_id"]].append(pct)

    by_kind: dict[tuple[str, int, str], list[Any]] = defaultdict(list)
    for (scope, cfg, kind, key) in pooled:
        by_kind[(scope, cfg, kind)].append(key)

    def groups(scope: str, cfg: int, kind: str) -> dict[str, GroupScore]:
        out = {}
        for key in by_kind.get((scope, cfg, kind), []):
            by_task = macro.get((scope, cfg, kind, key), {})
            out[key] = GroupScore(score=scoring.benchmark_score(sum(v) / len(v) for v in by_task.values()),
                                  pooled=_agg_from(pooled[(scope, cfg, kind, key)]), tasks=len(by_task))
        return out

    def by_attr(sel: list[_LightTrial], scope: str, cfg: int, attr: str, kind: str,
                order: Sequence[str] = ()) -> dict[str, GroupScore]:
        present = {t.row.get(attr) for t in sel if t.row.get(attr)}
        out = {}
        for k in [k for k in order if k in present] + sorted(present - set(order)):
            score, ntasks, _ = _macro([t for t in sel if t.row.get(attr) == k],  # type: ignore[arg-type]
                                      lambda t: t.score.effective_score)
            out[k] = GroupScore(score=score, pooled=_agg_from(pooled.get((scope, cfg, kind, k), _EMPTY_SUMS)),
                                tasks=ntasks)
        return out

    def summary(sel: list[_LightTrial], scope: Scope, cfg: int) -> ScopeSummary:
        p1, ntasks, task_means = _macro(sel, lambda t: t.score.effective_score)  # type: ignore[arg-type]
        det, _, _ = _macro(sel, lambda t: t.score.effective_deterministic)  # type: ignore[arg-type]
        total = pooled.get((scope, cfg, "total", ""), _EMPTY_SUMS)
        pool = total["nodes"] - total["c_QUARANTINED"] - total["c_DRY_RUN"]
        bb = groups(scope, cfg, "backbones")
        return ScopeSummary(
            scope=scope, trials=len(sel), tasks=ntasks, pass_at_1=p1, deterministic=det,
            node_coverage=round(100 * total["c_PASSED"] / pool, 2) if pool else None,
            skipped_llm_max_score=round(total["skm"], 4),
            status_counts=Counts(**{k: total[f"c_{k}"] for k in _ST}),
            domains=by_attr(sel, scope, cfg, "domain", "domains", DOMAINS),
            backbones={b: bb[b] for b in BACKBONES if b in bb},
            categories=dict(sorted(groups(scope, cfg, "categories").items())),
            complexity_tiers=dict(sorted(groups(scope, cfg, "complexity_tiers").items())),
            trajectories=by_attr(sel, scope, cfg, "trajectory", "trajectories") if traj else {},
            pass_at_k=_pass_at_k(sel, pass_threshold),  # type: ignore[arg-type]
            task_scores={k: round(v, 4) for k, v in sorted(task_means.items())},
        )

    by_cfg: dict[int, list[_LightTrial]] = defaultdict(list)
    for t in trials:
        by_cfg[t.cfg].append(t)
    reports = []
    for (agent, model), cfg in sorted(cfg_index.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
        ts = by_cfg[cfg]
        vs = [t for t in ts if t.score.valid]
        reports.append(ConfigReport(
            agent=agent, model=model,
            outcome_counts=dict(sorted(Counter(t.score.outcome for t in ts).items())),
            valid_trials=len(vs), infra_trials=len(ts) - len(vs),
            all=summary(ts, "all", cfg), valid=summary(vs, "valid", cfg),
        ))

    unknown_nodes = nodes.num_rows - pc.count(nodes.column("backbone")).as_py()
    issues = []
    for tord, node_id, cat, st, message in con.execute(
            f"SELECT tord, node_id, cat, st, message FROM {_N} WHERE tord IS NOT NULL AND st <> 'PASSED' "
            f"ORDER BY tord, node_index, node_id LIMIT {MAX_ISSUES}").fetchall():
        r = trials[tord].row
        issues.append(NodeIssue(trial_id=r["trial_id"], agent=r.get("agent"), model=r.get("model"),
                                task_id=r["task_id"], node_id=str(node_id), category=cat, status=st,
                                message=(message or "")[:MESSAGE_CHARS]))
    present = {t.row.get("domain") for t in trials if t.row.get("domain")}
    return SweepReport(
        node_issues=issues,
        orphan_node_rows=orphans,
        sweeps=list(sweeps) or sorted({t.row["sweep_id"] for t in trials}),
        pass_threshold=pass_threshold,
        configs=reports,
        trials=[t.score for t in trials],
        domains=[d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS)),
        unknown_categories=unknown_categories(cats),
        unknown_category_nodes=unknown_nodes,
        trajectory_available=traj,
        score_mismatches=mismatches,
    )


# --- paired comparison of two sweeps ----------------------------------------------------------
def bootstrap_ci(diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean (resample tasks with replacement; fixed seed: reproducible)."""
    if not diffs:
        return None
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    alpha = (1 - level) / 2

    def q(p: float) -> float:  # linear interpolation between order statistics (numpy's default)
        pos = p * (len(means) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (means[hi] - means[lo]) * (pos - lo)

    return q(alpha), q(1 - alpha)


def _node_status_by_cell(nodes: list[dict[str, Any]], valid_trials: set[str],
                         voided: set[str]) -> dict[tuple, tuple[str, str | None, float]]:
    """(agent, model, task, node) -> (most common status, category, fraction of valid attempts PASSED).
    Nodes of voided_cheat trials count as FAILED (as in the scores)."""
    cells: dict[tuple, list[str]] = defaultdict(list)
    cats: dict[tuple, str | None] = {}
    for r in nodes:
        if r["trial_id"] not in valid_trials:
            continue
        key = (r.get("agent"), r.get("model"), r["task_id"], r["node_id"])
        status = r.get("status") or "ERROR"
        if r["trial_id"] in voided and status not in _EXCLUDED_STATUSES:
            status = "FAILED"
        cells[key].append(status)
        cats[key] = r.get("category")
    out = {}
    for key, sts in cells.items():
        most = Counter(sts).most_common(1)[0][0]
        out[key] = (most, cats[key], sum(1 for s in sts if s == "PASSED") / len(sts))
    return out


def compare(con_or_lake, sweep_a: str, sweep_b: str, *, resamples: int = 10_000, seed: int = 0) -> CompareReport:
    """Paired per-task differences B - A of the valid-trial task score (mean over attempts), per
    (agent, model) present in both sweeps, with a percentile bootstrap 95% CI over tasks; and the
    nodes whose status changed PASSED <-> not PASSED. A node counts as PASSED in a sweep when it
    PASSED in at least half of the valid attempts (with one attempt: its status)."""
    con = connect(con_or_lake) if _is_lake(con_or_lake) else con_or_lake
    ta, na, _ = load_rows(con, [sweep_a])
    tb, nb, _ = load_rows(con, [sweep_b])
    ra, rb = compute(ta, na), compute(tb, nb)
    ca = {(c.agent, c.model): c for c in ra.configs}
    cb = {(c.agent, c.model): c for c in rb.configs}
    out: list[PairedComparison] = []
    for key in sorted(set(ca) & set(cb), key=lambda k: (k[0] or "", k[1] or "")):
        sa, sb = ca[key].valid.task_scores, cb[key].valid.task_scores
        tasks = sorted(set(sa) & set(sb))
        diffs = [sb[t] - sa[t] for t in tasks]
        ci = bootstrap_ci(diffs, resamples=resamples, seed=seed)
        out.append(PairedComparison(
            agent=key[0], model=key[1], tasks=len(tasks),
            mean_a=_round(_mean(sa[t] for t in tasks)), mean_b=_round(_mean(sb[t] for t in tasks)),
            mean_diff=_round(_mean(diffs)), ci_low=_round(ci[0]) if ci else None, ci_high=_round(ci[1]) if ci else None,
            per_task={t: (round(sa[t], 4), round(sb[t], 4), round(sb[t] - sa[t], 4)) for t in tasks},
        ))
    valid_a = {t.trial_id for t in ra.trials if t.valid}
    valid_b = {t.trial_id for t in rb.trials if t.valid}
    st_a = _node_status_by_cell(na, valid_a, {t.trial_id for t in ra.trials if t.outcome == "voided_cheat"})
    st_b = _node_status_by_cell(nb, valid_b, {t.trial_id for t in rb.trials if t.outcome == "voided_cheat"})
    changes: list[NodeChange] = []
    for key in sorted(set(st_a) & set(st_b), key=lambda k: tuple(x or "" for x in k)):
        if (key[0], key[1]) not in ca or (key[0], key[1]) not in cb:
            continue
        pa_, pb_ = st_a[key][2] >= 0.5, st_b[key][2] >= 0.5
        if pa_ != pb_:
            changes.append(NodeChange(agent=key[0], model=key[1], task_id=key[2], node_id=key[3],
                                      category=st_b[key][1] or st_a[key][1], status_a=st_a[key][0],
                                      status_b=st_b[key][0], change="gained" if pb_ else "lost"))
    return CompareReport(
        sweep_a=sweep_a, sweep_b=sweep_b, resamples=resamples, seed=seed, configs=out,
        only_in_a=[config_label(*k) for k in sorted(set(ca) - set(cb), key=lambda k: (k[0] or "", k[1] or ""))],
        only_in_b=[config_label(*k) for k in sorted(set(cb) - set(ca), key=lambda k: (k[0] or "", k[1] or ""))],
        node_changes=changes,
    )


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)
