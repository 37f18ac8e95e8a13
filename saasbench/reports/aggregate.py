"""Benchmark aggregation over the lake: the paper's Table 2 and Table 3 from ``trials`` and ``node_results``.

Every number comes from :mod:`saasbench.evaluation.scoring` (the one scoring module): rows are read from
DuckDB and turned back into :class:`~saasbench.evaluation.results.NodeResult` objects, then scored with
``scoring.aggregate`` / ``task_score`` / ``deterministic_score`` / ``node_coverage`` /
``benchmark_score``. The numerator/denominator rule (SKIPPED_LLM out of numerator and denominator,
SKIPPED_DEPENDENCY keeps its maxScore) is scoring.py's; the breakdowns use
:func:`group_aggregate`, a one-pass equivalent of ``scoring.aggregate`` (same exclusion set, sums
and rounding) that the tests check equals it field by field, because the per-group calls dominate
the run time on a full sweep. That path (:func:`sweep_report_reference`, :func:`compute`) is the
reference; :func:`sweep_report` computes the same numbers from the lake's per-trial sums
(``node_rollups``, see :mod:`saasbench.lake.rollups` and "fast path" below) without NodeResult
objects, adding them in the same order, and tests check both give the same SweepReport.

Definitions (per (agent, model) "configuration"; ``scope`` is ``all`` or ``valid``):

- **Trial score** ``S`` = ``scoring.task_score`` over the trial's node rows. A trial without a
  score (no node rows, e.g. the environment never came up, or every node SKIPPED_LLM) counts as
  **0** (``effective_score``); a ``voided_cheat`` trial counts as 0 and its nodes as not passed
  (every node that was not excluded is re-scored FAILED with 0 points).
- **Scopes.** ``all``: every trial. ``valid``: trials whose outcome is agent-caused
  (``lake.schema.VALID_OUTCOMES``); infra outcomes (env_error, judge_error, model_error, task_defect) are
  excluded and counted separately (``infra_trials``, ``outcome_counts``).
- **Pass@1 (benchmark score)** = the paper's Pass@1: for each task, the mean of the trial scores
  over its attempts (mean over attempts first, so a task with more attempts does not weigh
  more), then the unweighted mean over tasks (``scoring.benchmark_score``).
- **Deterministic subscore**: the same with ``scoring.deterministic_score`` (llm-judge nodes out).
- **Node coverage** = PASSED nodes / all nodes, pooled over every node row of every trial in
  scope (the paper: "proportion of validation nodes that reach the Passed state across all
  tasks"); trials without node rows add nothing to it.
- **Breakdowns** (domain from ``trials.domain``; backbone via :mod:`saasbench.reports.backbones`; node
  category; node complexity tier; trajectory type when ``trials.trajectory`` exists):
  ``score`` = per trial, ``scoring.aggregate`` over the trial's nodes in the group; then mean
  over attempts per task, then unweighted mean over the tasks that have nodes in the group
  (macro, like Pass@1). For domains the group is the whole trial, so ``score`` is Pass@1
  restricted to the domain's tasks. ``pooled`` is the aggregate over all node rows of the group
  (micro) for reference: the per-trial group sums added in trial order (a trial's backbone sums
  add its categories' sums in category order; docs/dag-semantics.md fixes this order).
- **Dropped judge maxScore** = sum of maxScore of SKIPPED_LLM nodes (``skipped_llm_max_score``).
- **pass@k**: a trial *passes* when its effective score >= ``pass_threshold`` (default 100: the
  task is fully solved). Per task with n attempts of which c pass, the unbiased estimator
  ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021) is the probability that the best of k attempts
  drawn without replacement passes; pass@k is its mean over tasks with n >= k. Reported for
  k = 1..max n. This is not the paper's "Pass@1" column, which is the mean task score.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from saasbench.evaluation import scoring
from saasbench.evaluation.results import Aggregate, Counts, NodeResult, Status
from saasbench.lake.query import gc_paused
from saasbench.lake.schema import (
    INFRA_OUTCOMES,  # env_error, judge_error, model_error, task_defect: not valid trials
)
from saasbench.reports.backbones import BACKBONES, backbone_for, unknown_categories

DOMAINS: tuple[str, ...] = ("CG", "PC", "CF", "DCI", "SI", "DW")
DEFAULT_PASS_THRESHOLD = 100.0
_EXCLUDED_STATUSES = {s.value for s in scoring.EXCLUDED}
MAX_ISSUES = 500
MESSAGE_CHARS = 2000

Scope = Literal["all", "valid"]

TRIAL_COLUMNS = (
    "sweep_id",
    "trial_id",
    "task_id",
    "agent",
    "model",
    "attempt",
    "domain",
    "outcome",
    "task_score",
    "deterministic_score",
)
NODE_COLUMNS = (
    "sweep_id",
    "trial_id",
    "task_id",
    "agent",
    "model",
    "attempt",
    "node_id",
    "node_index",
    "category",
    "subcategory",
    "method",
    "complexity_tier",
    "status",
    "score",
    "max_score",
    "message",
)


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
        default_factory=list, description=f"up to {MAX_ISSUES} nodes not PASSED (evaluation order), messages capped"
    )
    orphan_node_rows: int = Field(0, description="node_results rows whose trial has no trials row (not scored)")
    score_mismatches: list[ScoreMismatch] = Field(
        default_factory=list, description="trials whose stored task_score differs from scoring.py on their node rows"
    )


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


def sweeps_label(sweeps: Sequence[str], shown: int = 3) -> str:
    """'sweep a, b' for a few sweeps; '200 sweeps (first ... last)' for many (titles stay one line)."""
    if len(sweeps) <= shown:
        return ("sweep " if len(sweeps) == 1 else "sweeps ") + ", ".join(sweeps)
    return f"{len(sweeps)} sweeps ({sweeps[0]} ... {sweeps[-1]})"


def config_label(agent: str | None, model: str | None) -> str:
    return f"{agent or '-'} / {model or '-'}"


# --- row loading ------------------------------------------------------------------------------
#: the lake tables a sweep report reads
REPORT_TABLES = ("trials", "node_results", "node_rollups")


def connect(lake: Any, *, sweep_id: str | None = None, tables: Sequence[str] | None = None):
    """A DuckDB connection with one view per lake table (``saasbench.lake.query.connect``);
    ``lake`` None: ``$SAASBENCH_LAKE`` or ``runs/lake``."""
    from saasbench.lake.query import connect as _connect

    return _connect(str(lake) if isinstance(lake, Path) else lake, sweep_id=sweep_id, tables=tables)


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
    trials = _fetch(
        con,
        f"SELECT {', '.join(tcols)} FROM trials WHERE sweep_id IN ({marks}) "
        "ORDER BY sweep_id, task_id, agent, model, attempt, trial_id",
        sweeps,
    )
    ncols = [c for c in NODE_COLUMNS if c in _columns(con, "node_results")]
    nodes = _fetch(
        con,
        f"SELECT {', '.join(ncols)} FROM node_results WHERE sweep_id IN ({marks}) "
        "ORDER BY sweep_id, trial_id, node_index, node_id",
        sweeps,
    )
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
class _Sums:
    """The sums behind an Aggregate. Per trial and group they add the group's nodes left to right
    in node order; pooled over trials they add the per-trial sums in trial order (the order
    ``node_rollups`` fixes; see :mod:`saasbench.lake.rollups`)."""

    score: float = 0.0
    max_score: float = 0.0
    skipped_llm_max_score: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)
    nodes: int = 0


def _node_sums(nodes: Iterable[NodeResult]) -> _Sums:
    s = _Sums()
    for n in nodes:
        s.counts[n.status.value] += 1
        s.nodes += 1
        if n.status not in scoring.EXCLUDED:
            s.score += n.score
            s.max_score += n.max_score
        if n.status == Status.SKIPPED_LLM:
            s.skipped_llm_max_score += n.max_score
    return s


def _add_sums(parts: Iterable[_Sums]) -> _Sums:
    out = _Sums()
    for p in parts:
        out.score += p.score
        out.max_score += p.max_score
        out.skipped_llm_max_score += p.skipped_llm_max_score
        out.counts.update(p.counts)
        out.nodes += p.nodes
    return out


def _agg(s: _Sums) -> Aggregate:
    return Aggregate(
        score=round(s.score, 4),
        max_score=round(s.max_score, 4),
        percent=_pct(s.score, s.max_score),
        nodes=s.nodes,
        counts=Counts(**s.counts),
        skipped_llm_max_score=s.skipped_llm_max_score,
    )


@dataclass
class _Trial:
    row: dict[str, Any]
    nodes: list[NodeResult] = field(default_factory=list)
    score: TrialScore = field(init=False)  # set by _score_trial before any use
    sums: _Sums = field(default_factory=_Sums)


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _macro_of(pairs: Iterable[tuple[str, float | None]]) -> tuple[float | None, int, dict[str, float]]:
    """From (task, value) pairs in trial order: the mean over attempts per task (None values left
    out), then scoring.benchmark_score over tasks in order of first appearance."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, v in pairs:
        if v is not None:
            by_task[task].append(v)
    task_means = {task: sum(v) / len(v) for task, v in by_task.items()}
    return scoring.benchmark_score(task_means.values()), len(task_means), task_means


def _macro(
    trials: list[_Trial], per_trial: Callable[[_Trial], float | None]
) -> tuple[float | None, int, dict[str, float]]:
    """:func:`_macro_of` over trials."""
    return _macro_of((t.row["task_id"], per_trial(t)) for t in trials)


def group_aggregate(nodes: Sequence[NodeResult]) -> Aggregate:
    """``scoring.aggregate(nodes)``, computed in one pass without pydantic attribute writes per node.

    Same exclusion set (``scoring.EXCLUDED``), same sums in the same order, same rounding;
    tests/test_aggregate.py checks it equals ``scoring.aggregate`` field by field on random node sets.
    """
    return _agg(_node_sums(nodes))


def group_percent(nodes: Sequence[NodeResult]) -> float | None:
    """``scoring.aggregate(nodes).percent`` (see :func:`group_aggregate`)."""
    s = _node_sums(nodes)
    return _pct(s.score, s.max_score)


def _group(
    trials: list[_Trial], key: Callable[[str], str | None] | None, attr: str = "category"
) -> dict[str, GroupScore]:
    """Per group: macro score over tasks (per-trial group percent, mean over attempts) and the
    pooled aggregate (per-trial group sums added in trial order). ``attr``: the node attribute
    grouped on (category, complexity_tier; None values left out). ``key`` maps categories to
    coarser groups (backbones): a trial's backbone sums add its categories' sums in category order."""
    per_trial: list[tuple[_Trial, dict[str, _Sums]]] = []
    keys: dict[str, None] = {}
    for t in trials:
        groups: dict[str, list[NodeResult]] = {}
        for n in t.nodes:
            k = (n.category or "") if attr == "category" else getattr(n, attr)
            if k is not None:
                groups.setdefault(k, []).append(n)
        sums = {k: _node_sums(v) for k, v in groups.items()}
        if key is not None:
            coarse: dict[str, list[_Sums]] = {}
            for k in sorted(sums):
                c = key(k)
                if c is not None:
                    coarse.setdefault(c, []).append(sums[k])
            sums = {c: _add_sums(v) for c, v in coarse.items()}
        keys.update(dict.fromkeys(sums))
        per_trial.append((t, sums))
    out: dict[str, GroupScore] = {}
    for k in keys:
        by_task: dict[str, list[float]] = defaultdict(list)
        parts: list[_Sums] = []
        for t, sums in per_trial:
            sel = sums.get(k)
            if sel is None:
                continue
            parts.append(sel)
            pct = _pct(sel.score, sel.max_score)
            if pct is not None:
                by_task[t.row["task_id"]].append(pct)
        score = scoring.benchmark_score(sum(v) / len(v) for v in by_task.values())
        out[k] = GroupScore(score=score, pooled=_agg(_add_sums(parts)), tasks=len(by_task))
    return out


def _by_trial_attr(trials: list[_Trial], attr: str, order: Sequence[str] = ()) -> dict[str, GroupScore]:
    present = {v for t in trials if (v := t.row.get(attr))}
    keys = [k for k in order if k in present] + sorted(present - set(order))
    out: dict[str, GroupScore] = {}
    for k in keys:
        sel = [t for t in trials if t.row.get(attr) == k]
        score, ntasks, _ = _macro(sel, lambda t: t.score.effective_score)
        out[k] = GroupScore(score=score, pooled=_agg(_add_sums(t.sums for t in sel)), tasks=ntasks)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: 1 - C(n-c, k)/C(n, k) (n attempts, c passing, k <= n)."""
    if k > n or k < 1:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _pass_at_k_of(pairs: Iterable[tuple[str, float]], threshold: float) -> dict[int, float]:
    """pass@k for k = 1..max attempts from (task, effective score) pairs (see the module doc)."""
    n_c: dict[str, list[int]] = {}  # per task: [attempts, passing attempts]
    for task, score in pairs:
        nc = n_c.setdefault(task, [0, 0])
        nc[0] += 1
        nc[1] += score >= threshold
    if not n_c:
        return {}
    out: dict[int, float] = {}
    for k in range(1, max(n for n, _c in n_c.values()) + 1):
        vals = [pass_at_k(n, c, k) for n, c in n_c.values() if n >= k]
        out[k] = round(100 * sum(vals) / len(vals), 2)
    return out


def _pass_at_k(trials: list[_Trial], threshold: float) -> dict[int, float]:
    return _pass_at_k_of(((t.row["task_id"], t.score.effective_score) for t in trials), threshold)


def _scope(trials: list[_Trial], scope: Scope, threshold: float, traj: bool) -> ScopeSummary:
    nodes = [n for t in trials for n in t.nodes]
    p1, ntasks, task_means = _macro(trials, lambda t: t.score.effective_score)
    det, _, _ = _macro(trials, lambda t: t.score.effective_deterministic)
    bb = _group(trials, backbone_for)
    total = _agg(_add_sums(t.sums for t in trials))
    return ScopeSummary(
        scope=scope,
        trials=len(trials),
        tasks=ntasks,
        pass_at_1=p1,
        deterministic=det,
        node_coverage=scoring.node_coverage(nodes),
        skipped_llm_max_score=round(total.skipped_llm_max_score, 4),
        status_counts=total.counts,
        domains=_by_trial_attr(trials, "domain", DOMAINS),
        backbones={b: bb[b] for b in BACKBONES if b in bb},
        categories=dict(sorted(_group(trials, None).items())),
        complexity_tiers=dict(sorted(_group(trials, None, "complexity_tier").items())),
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
        sweep_id=r["sweep_id"],
        trial_id=r["trial_id"],
        task_id=r["task_id"],
        agent=r.get("agent"),
        model=r.get("model"),
        attempt=int(r.get("attempt") or 0),
        domain=r.get("domain"),
        outcome=outcome,
        valid=outcome not in INFRA_OUTCOMES,
        trajectory=r.get("trajectory") if traj else None,
        task_score=ts,
        deterministic_score=ds,
        effective_score=ts if ts is not None else 0.0,
        effective_deterministic=ds if ds is not None else 0.0,
        node_coverage=scoring.node_coverage(t.nodes),
        nodes=len(t.nodes),
        skipped_llm_max_score=agg.skipped_llm_max_score,
        counts=agg.counts,
        lake_task_score=r.get("task_score"),
    )


def compute(
    trial_rows: list[dict[str, Any]],
    node_rows: list[dict[str, Any]],
    *,
    pass_threshold: float = DEFAULT_PASS_THRESHOLD,
    trajectory: bool = False,
    sweeps: Sequence[str] = (),
) -> SweepReport:
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
        t.sums = _node_sums(t.nodes)
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
        reports.append(
            ConfigReport(
                agent=agent,
                model=model,
                outcome_counts=dict(sorted(Counter(t.score.outcome for t in ts).items())),
                valid_trials=len(valid),
                infra_trials=len(ts) - len(valid),
                all=_scope(ts, "all", pass_threshold, trajectory),
                valid=_scope(valid, "valid", pass_threshold, trajectory),
            )
        )
    all_nodes = [n for t in trials.values() for n in t.nodes]
    unknown = unknown_categories(n.category for n in all_nodes)
    present = {d for t in trials.values() if (d := t.row.get("domain"))}
    issues = [
        NodeIssue(
            trial_id=t.row["trial_id"],
            agent=t.row.get("agent"),
            model=t.row.get("model"),
            task_id=t.row["task_id"],
            node_id=n.id,
            category=n.category,
            status=n.status.value,
            message=n.message[:MESSAGE_CHARS],
        )
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


def sweep_report(
    con_or_lake, sweeps: str | Sequence[str], *, pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> SweepReport:
    """Aggregate one or more sweeps. ``con_or_lake``: a DuckDB connection with lake views, or a lake URI.

    Reads the lake's per-trial ``node_rollups`` (:func:`_sql_report`); the result equals
    :func:`sweep_report_reference` (node rows scored in Python by :func:`compute`), which it falls
    back to for rows only the reference handles (duplicate trial rows, unknown node statuses)."""
    sweeps = [sweeps] if isinstance(sweeps, str) else list(sweeps)
    if not sweeps:
        raise ValueError("no sweep given")
    with gc_paused():  # ~10 objects per trial, no cycles: the collector's passes cost ~20%
        con = (
            connect(con_or_lake, sweep_id=sweeps[0] if len(sweeps) == 1 else None, tables=REPORT_TABLES)
            if _is_lake(con_or_lake)
            else con_or_lake
        )
        report = _sql_report(con, sweeps, pass_threshold)
    if report is not None:
        return report
    trials, nodes, traj = load_rows(con, sweeps)
    return compute(trials, nodes, pass_threshold=pass_threshold, trajectory=traj, sweeps=sweeps)


def sweep_report_reference(
    con_or_lake, sweeps: str | Sequence[str], *, pass_threshold: float = DEFAULT_PASS_THRESHOLD
) -> SweepReport:
    """The reference path: node rows loaded into Python and scored with saasbench.evaluation.scoring (slow)."""
    sweeps = [sweeps] if isinstance(sweeps, str) else list(sweeps)
    con = (
        connect(con_or_lake, sweep_id=sweeps[0] if len(sweeps) == 1 else None) if _is_lake(con_or_lake) else con_or_lake
    )
    trials, nodes, traj = load_rows(con, sweeps)
    return compute(trials, nodes, pass_threshold=pass_threshold, trajectory=traj, sweeps=sweeps)


# --- fast path: per-trial rollups summed in the reference order -------------------------------
# ``sweep_report`` reads ``node_rollups`` (per trial, per (trial, category), per (trial, tier):
# score sums and status counts, derived by the writer; see saasbench.lake.rollups), about 20 rows
# per trial, instead of every node row. Sweeps whose rollups are missing (lakes older than them)
# are rolled up from their node rows with the same function. DuckDB joins the rollups to their
# trials and applies the voided_cheat rule (every node not excluded becomes FAILED with 0 points);
# the rest are Arrow group-bys over rows in trial order:
#
# - per trial: the trial rollup (task score, deterministic score, counts, coverage);
# - pooled per (config, group): the per-trial group sums added in trial order; a trial's backbone
#   sums add its categories' sums in category order;
# - macro per (config, group): per trial the group percent round(100 * s / m, 2), then the mean
#   over attempts per task and scoring.benchmark_score over tasks in order of first appearance.
#
# These are the reference path's definitions and order (tests check both agree). Why Arrow and
# not DuckDB's SUM for the float sums: DuckDB's ``sum(DOUBLE)`` is compensated (0.1 added ten
# times gives 1.0, Python's ``sum`` 0.9999999999999999), and a last-bit difference can flip a
# ``round(x, 2)``; Arrow's single-threaded hash ``sum`` adds each group's values in input order.
_ST = ("PASSED", "FAILED", "ERROR", "SKIPPED_DEPENDENCY", "SKIPPED_LLM", "DRY_RUN", "QUARANTINED")
_T, _R = "_saasbench_agg_trials", "_saasbench_agg_rollups"
_SUMS = ("nodes", "ks", "km", "skm") + tuple(f"c_{s}" for s in _ST)


def _pct(s: float, m: float) -> float | None:
    return round(100 * s / m, 2) if m > 0 else None


_TRIAL_SCORES = TypeAdapter(list[TrialScore])
_EMPTY_SUMS: dict[str, Any] = {"nodes": 0, "ks": 0, "km": 0, "skm": 0, **{f"c_{k}": 0 for k in _ST}}


def _agg_from(r: dict[str, Any]) -> Aggregate:
    """The Aggregate of a group from its sums (same rounding as :func:`_agg`)."""
    s, m = r["ks"], r["km"]
    return Aggregate(
        score=round(s, 4),
        max_score=round(m, 4),
        percent=_pct(s, m),
        nodes=r["nodes"],
        counts=Counts(**{k: r[f"c_{k}"] for k in _ST}),
        skipped_llm_max_score=r["skm"],
    )


def _sum_table(tbl, keys: list[str], cols: Sequence[str] = _SUMS):
    """Per key: the sums of ``cols`` in input order (single-threaded hash sum), columns renamed back."""
    res = (
        tbl.select(list(dict.fromkeys([*keys, *cols])))
        .group_by(keys, use_threads=False)
        .aggregate([(c, "sum") for c in cols])
    )
    return res.rename_columns([c.removesuffix("_sum") for c in res.column_names])


def round2(x):
    """``round(v, 2)`` for every value of a float64 Arrow array, vectorised and bit-identical: away
    from a tie, rint(v * 100) / 100 is the nearest float to the correctly rounded decimal, as
    Python's round gives; the few values within 1e-6 of a tie are rounded by Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    y = pc.multiply(x, 100.0)
    out = pc.divide(pc.round(y, 0, round_mode="half_to_even"), 100.0)
    near = pc.less(pc.abs(pc.subtract(pc.subtract(y, pc.floor(y)), 0.5)), 1e-6)
    if pc.any(near).as_py():
        exact = [round(v, 2) for v in x.filter(near).to_pylist()]
        out = pc.replace_with_mask(out, near, pa.array(exact, pa.float64()))
    return out


def _sql_report(con, sweeps: Sequence[str], pass_threshold: float) -> SweepReport | None:
    """The sweep report from node rollups, or None when the rows need the reference path
    (duplicate trial rows, node statuses Status() rejects, views without the lake columns)."""
    from saasbench.lake.query import _quote  # the lake's one SQL string quoting

    # sweep ids as quoted literals, not parameters: DuckDB tries to import pandas once per parameter
    in_sweeps = ", ".join(_quote(str(s)) for s in sweeps)
    want_t = ", ".join(f"'{c}'" for c in (*TRIAL_COLUMNS, "trajectory"))
    try:
        con.execute(
            f"CREATE OR REPLACE TEMPORARY TABLE {_T} AS SELECT COLUMNS(c -> c IN ({want_t})), "
            "row_number() OVER (ORDER BY sweep_id, task_id, agent, model, attempt, trial_id) - 1 AS tord "
            f"FROM trials WHERE sweep_id IN ({in_sweeps})"
        )
        have_t = _columns(con, _T)
        if not set(TRIAL_COLUMNS) <= have_t:
            return None
        traj = "trajectory" in have_t
        if con.execute(f"SELECT count(*) - count(DISTINCT (sweep_id, trial_id)) FROM {_T}").fetchone()[0]:
            return None  # the reference keeps the last row of a duplicated trial: let it
        source = _rollup_source(con, sweeps, _quote)
        if source is None:
            return None
        return _rollup_compute(con, source, sweeps, pass_threshold, traj)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_T}")
        con.execute(f"DROP TABLE IF EXISTS {_R}")
        for name in (f"{_R}_computed", f"{_R}_issues"):
            with contextlib.suppress(Exception):
                con.unregister(name)


def _rollup_source(con, sweeps: Sequence[str], quote: Callable[[str], str]) -> str | None:
    """SQL for the node_rollups rows of ``sweeps``: the lake's, and for sweeps whose rollups are
    missing (or a connection that cannot tell), rolled up now from their node rows."""
    from saasbench.lake import schema as LS
    from saasbench.lake.query import ROLLUPS_MISSING, _arrow
    from saasbench.lake.rollups import node_rollups

    try:
        missing = {r[0] for r in con.execute(f"SELECT sweep_id FROM {ROLLUPS_MISSING}").fetchall()}
    except Exception:  # noqa: BLE001 - not a lake connection: roll everything up from the node rows
        missing = set(sweeps)
    cols = ", ".join(LS.NODE_ROLLUPS.names)
    if not set(LS.NODE_ROLLUPS.names) <= _columns(con, "node_rollups"):
        missing = set(sweeps)
    stored = [s for s in sweeps if s not in missing]
    parts = (
        [f"SELECT {cols} FROM node_rollups WHERE sweep_id IN ({', '.join(quote(s) for s in stored)})"] if stored else []
    )
    redo = [s for s in sweeps if s in missing]
    if redo:
        need = (
            "sweep_id",
            "trial_id",
            "task_id",
            "agent",
            "model",
            "attempt",
            "node_id",
            "node_index",
            "category",
            "method",
            "complexity_tier",
            "status",
            "score",
            "max_score",
        )
        if not set(need) <= _columns(con, "node_results"):
            return None
        nodes = _arrow(
            con.execute(
                f"SELECT {', '.join(need)} FROM node_results WHERE sweep_id IN ({', '.join(quote(s) for s in redo)})"
            )
        )
        con.register(f"{_R}_computed", node_rollups(nodes))
        parts.append(f"SELECT {cols} FROM {_R}_computed")
    return " UNION ALL ".join(parts) if parts else f"SELECT {cols} FROM node_rollups WHERE false"


@dataclass
class _TrialCols:
    """The trials of a report in trial order (index = ``tord``), as plain columns."""

    col: dict[str, list[Any]]  # sweep_id, trial_id, task_id, agent, model, domain, outcome, task_score, nodes
    outcomes: list[str]
    valid: list[bool]
    trajs: list[str | None]
    eff: list[float]  # effective score (0 without one)
    effd: list[float]  # effective deterministic score
    passed: list[int]
    cfg_index: dict[tuple[str | None, str | None], int]
    cfgs: list[int]
    tasks: list[int]


def _rollup_compute(con, source: str, sweeps: Sequence[str], pass_threshold: float, traj: bool) -> SweepReport | None:
    from saasbench.lake.query import _arrow, _quote

    v = "coalesce(t.outcome = 'voided_cheat', false)"
    con.execute(
        f"CREATE OR REPLACE TEMPORARY TABLE {_R} AS SELECT t.tord, "
        "CASE r.kind WHEN 'trial' THEN 0 WHEN 'category' THEN 1 WHEN 'tier' THEN 2 END::TINYINT AS kind, "
        f"r.key, r.nodes, CASE WHEN {v} THEN 0.0 ELSE r.score END AS ks, r.max_score AS km, "
        f"CASE WHEN {v} THEN 0.0 ELSE r.det_score END AS dks, r.det_max_score AS dkm, r.skipped_llm_max_score AS skm, "
        f"CASE WHEN {v} THEN 0 ELSE r.passed END AS c_PASSED, "
        f"CASE WHEN {v} THEN r.nodes - r.skipped_llm - r.dry_run - r.quarantined - r.other_status ELSE r.failed END "
        f"AS c_FAILED, CASE WHEN {v} THEN 0 ELSE r.error END AS c_ERROR, "
        f"CASE WHEN {v} THEN 0 ELSE r.skipped_dependency END AS c_SKIPPED_DEPENDENCY, r.skipped_llm AS c_SKIPPED_LLM, "
        "r.dry_run AS c_DRY_RUN, r.quarantined AS c_QUARANTINED, r.other_status AS other "
        f"FROM ({source}) r LEFT JOIN {_T} t ON t.sweep_id = r.sweep_id AND t.trial_id = r.trial_id"
    )
    orphans, other = con.execute(
        f"SELECT coalesce(sum(nodes) FILTER (tord IS NULL AND kind = 0), 0), "
        f"coalesce(sum(other) FILTER (tord IS NOT NULL AND kind = 0), 0) FROM {_R}"
    ).fetchone()
    if other:
        return None  # Status(...) raises on it in the reference path: let it

    # one row per trial in trial order, its rollup sums (0 without node rows)
    sums = ", ".join(f"coalesce(r.{c}, 0) AS {c}" for c in (*_SUMS, "dks", "dkm"))
    tt = _arrow(
        con.execute(
            f"SELECT t.*, {sums} FROM {_T} t LEFT JOIN {_R} r ON r.tord = t.tord AND r.kind = 0 ORDER BY t.tord"
        )
    )
    trial_scores, mismatches, tc = _trial_scores(tt, traj)
    # per (trial, group) rows in trial order: categories, tiers
    rows = _arrow(
        con.execute(
            f"SELECT * EXCLUDE (dks, dkm, other) FROM {_R} WHERE tord IS NOT NULL AND kind > 0 ORDER BY tord, kind, key"
        )
    )
    pooled, macro, cats, unknown_nodes = _group_sums(tt, rows, tc)

    by_kind: dict[tuple[str, int, str], list[Any]] = defaultdict(list)
    for scope, cfg, kind, key in pooled:
        by_kind[(scope, cfg, kind)].append(key)

    def node_groups(scope: str, cfg: int, kind: str) -> dict[str, GroupScore]:
        out = {}
        for key in by_kind.get((scope, cfg, kind), []):
            means = macro.get((scope, cfg, kind, key), [])
            out[key] = GroupScore(
                score=scoring.benchmark_score(means),
                pooled=_agg_from(pooled[(scope, cfg, kind, key)]),
                tasks=len(means),
            )
        return out

    task_ids = tc.col["task_id"]

    def by_attr(
        idx: list[int], scope: str, cfg: int, values: list[Any], kind: str, order: Sequence[str] = ()
    ) -> dict[str, GroupScore]:
        split: dict[str, list[int]] = {}
        for i in idx:
            if values[i]:
                split.setdefault(values[i], []).append(i)
        out = {}
        for k in [k for k in order if k in split] + sorted(set(split) - set(order)):
            score, ntasks, _ = _macro_of((task_ids[i], tc.eff[i]) for i in split[k])
            out[k] = GroupScore(
                score=score, pooled=_agg_from(pooled.get((scope, cfg, kind, k), _EMPTY_SUMS)), tasks=ntasks
            )
        return out

    def summary(idx: list[int], scope: Scope, cfg: int) -> ScopeSummary:
        p1, ntasks, task_means = _macro_of((task_ids[i], tc.eff[i]) for i in idx)
        det, _, _ = _macro_of((task_ids[i], tc.effd[i]) for i in idx)
        total = pooled.get((scope, cfg, "total", ""), _EMPTY_SUMS)
        pool = total["nodes"] - total["c_QUARANTINED"] - total["c_DRY_RUN"]
        bb = node_groups(scope, cfg, "backbones")
        return ScopeSummary(
            scope=scope,
            trials=len(idx),
            tasks=ntasks,
            pass_at_1=p1,
            deterministic=det,
            node_coverage=round(100 * total["c_PASSED"] / pool, 2) if pool else None,
            skipped_llm_max_score=round(total["skm"], 4),
            status_counts=Counts(**{k: total[f"c_{k}"] for k in _ST}),
            domains=by_attr(idx, scope, cfg, tc.col["domain"], "domains", DOMAINS),
            backbones={b: bb[b] for b in BACKBONES if b in bb},
            categories=dict(sorted(node_groups(scope, cfg, "categories").items())),
            complexity_tiers=dict(sorted(node_groups(scope, cfg, "complexity_tiers").items())),
            trajectories=by_attr(idx, scope, cfg, tc.trajs, "trajectories") if traj else {},
            pass_at_k=_pass_at_k_of(((task_ids[i], tc.eff[i]) for i in idx), pass_threshold),
            task_scores={k: round(v, 4) for k, v in sorted(task_means.items())},
        )

    by_cfg: dict[int, list[int]] = defaultdict(list)
    for i, cfg in enumerate(tc.cfgs):
        by_cfg[cfg].append(i)
    reports = []
    for (agent, model), cfg in sorted(tc.cfg_index.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
        idx = by_cfg[cfg]
        vidx = [i for i in idx if tc.valid[i]]
        reports.append(
            ConfigReport(
                agent=agent,
                model=model,
                outcome_counts=dict(sorted(Counter(tc.outcomes[i] for i in idx).items())),
                valid_trials=len(vidx),
                infra_trials=len(idx) - len(vidx),
                all=summary(idx, "all", cfg),
                valid=summary(vidx, "valid", cfg),
            )
        )

    present = {d for d in tc.col["domain"] if d}
    return SweepReport(
        node_issues=_node_issues(con, tc.col, [n - p for n, p in zip(tc.col["nodes"], tc.passed)], _quote),
        orphan_node_rows=orphans,
        sweeps=list(sweeps) or sorted(set(tc.col["sweep_id"])),
        pass_threshold=pass_threshold,
        configs=reports,
        trials=trial_scores,
        domains=[d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS)),
        unknown_categories=unknown_categories(cats),
        unknown_category_nodes=unknown_nodes,
        trajectory_available=traj,
        score_mismatches=mismatches,
    )


def _trial_scores(tt, traj: bool) -> tuple[list[TrialScore], list[ScoreMismatch], _TrialCols]:
    """Per trial (``tt``: trial rows with their rollup sums, in trial order): its TrialScore,
    vectorised; the stored task scores that disagree; the columns the rest of the report needs."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = tt.num_rows
    col = {
        c: tt.column(c).to_pylist()
        for c in ("sweep_id", "trial_id", "task_id", "agent", "model", "domain", "outcome", "task_score", "nodes")
    }
    outcomes = [o or "completed" for o in col["outcome"]]
    valid = [o not in INFRA_OUTCOMES for o in outcomes]
    trajs = tt.column("trajectory").to_pylist() if traj else [None] * n
    ts_arr, ds_arr = _pct_array(tt.column("ks"), tt.column("km")), _pct_array(tt.column("dks"), tt.column("dkm"))
    pool = pc.subtract(pc.subtract(tt.column("nodes"), tt.column("c_QUARANTINED")), tt.column("c_DRY_RUN"))
    ts = ts_arr.to_pylist()
    eff = pc.fill_null(ts_arr, 0.0).to_pylist()
    effd = pc.fill_null(ds_arr, 0.0).to_pylist()
    counts = pa.StructArray.from_arrays([tt.column(f"c_{k}").combine_chunks() for k in _ST], names=list(_ST))
    trial_table = pa.table(
        {
            "sweep_id": tt.column("sweep_id"),
            "trial_id": tt.column("trial_id"),
            "task_id": tt.column("task_id"),
            "agent": tt.column("agent"),
            "model": tt.column("model"),
            "attempt": pc.fill_null(tt.column("attempt"), 0),
            "domain": tt.column("domain"),
            "outcome": pa.array(outcomes, pa.string()),
            "valid": pa.array(valid, pa.bool_()),
            "trajectory": pa.array(trajs, pa.string()),
            "task_score": ts_arr,
            "deterministic_score": ds_arr,
            "effective_score": pa.array(eff, pa.float64()),
            "effective_deterministic": pa.array(effd, pa.float64()),
            "node_coverage": _pct_array(tt.column("c_PASSED"), pool),
            "nodes": tt.column("nodes"),
            "skipped_llm_max_score": tt.column("skm"),
            "counts": counts,
            "lake_task_score": tt.column("task_score"),
        }
    )
    trial_scores = _TRIAL_SCORES.validate_python(trial_table.to_pylist())  # one Rust-side validation of all rows
    mismatches = [
        ScoreMismatch(trial_id=col["trial_id"][i], stored=col["task_score"][i], recomputed=ts[i])
        for i in range(n)
        if col["nodes"][i] and col["outcome"][i] != "voided_cheat" and not _close(col["task_score"][i], ts[i])
    ]
    cfg_index: dict[tuple[str | None, str | None], int] = {}
    cfgs = [cfg_index.setdefault(am, len(cfg_index)) for am in zip(col["agent"], col["model"])]
    task_index: dict[str, int] = {}
    tasks = [task_index.setdefault(t, len(task_index)) for t in col["task_id"]]
    return (
        trial_scores,
        mismatches,
        _TrialCols(
            col=col,
            outcomes=outcomes,
            valid=valid,
            trajs=trajs,
            eff=eff,
            effd=effd,
            passed=tt.column("c_PASSED").to_pylist(),
            cfg_index=cfg_index,
            cfgs=cfgs,
            tasks=tasks,
        ),
    )


_Key = tuple[str, int, str, Any]  # (scope, config, kind, group key)


def _group_sums(tt, rows, tc: _TrialCols) -> tuple[dict[_Key, dict[str, Any]], dict[_Key, list[float]], list[str], int]:
    """Pooled sums per (scope, config, kind, key) and the macro means per task of every group, from
    the per-trial rows (``tt``) and the per-(trial, category|tier) rows in trial and key order
    (``rows``). Also the categories seen and the nodes of categories no backbone takes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    attrs = {
        "cfg": pa.array(tc.cfgs, pa.int32()),
        "task": pa.array(tc.tasks, pa.int32()),
        "is_valid": pa.array(tc.valid, pa.bool_()),
        "domain": pa.array([d or None for d in tc.col["domain"]], pa.string()),
        "traj": pa.array([x or None for x in tc.trajs], pa.string()),
    }

    def with_attrs(tbl, names: Sequence[str]):
        idx = tbl.column("tord")
        for name in names:
            tbl = tbl.append_column(name, attrs[name].take(idx) if tbl.num_rows else pa.array([], attrs[name].type))
        return tbl

    # group keys become small integer codes (group-bys on strings cost several times more)
    key_codes, key_names = _codes(rows.column("key"))
    rows = rows.drop_columns(["key"]).append_column("kc", key_codes)
    cat_rows = rows.filter(pc.equal(rows.column("kind"), 1))
    tier_rows = rows.filter(pc.equal(rows.column("kind"), 2))
    cats = sorted({key_names[c] for c in pc.unique(cat_rows.column("kc")).to_pylist()})
    bb_names = list(BACKBONES) + sorted({b for c in cats if (b := backbone_for(c)) and b not in BACKBONES})
    bb_code = pa.array([bb_names.index(b) if (b := backbone_for(k)) else None for k in key_names], pa.int32())
    cat_bb = bb_code.take(cat_rows.column("kc"))
    unknown_nodes = pc.sum(cat_rows.filter(pc.is_null(cat_bb)).column("nodes")).as_py() or 0
    # per trial: its categories' sums added in category order (the rows are in key order)
    bb_rows = _sum_table(cat_rows.append_column("bc", cat_bb).filter(pc.is_valid(cat_bb)), ["tord", "bc"])
    bb_rows = bb_rows.take(pc.sort_indices(bb_rows, [("tord", "ascending")]))
    per_trial = tt.filter(pc.greater(tt.column("nodes"), 0))
    dom_codes, dom_names = _codes(attrs["domain"])
    traj_codes, traj_names = _codes(attrs["traj"])
    # every group of every kind in one table, each kind's rows in trial order; the 'valid' scope's
    # sums are the same sums with 0 added for infra trials (x + 0.0 == x: the order is kept)
    kinds = {
        "total": (per_trial, pa.array([0] * per_trial.num_rows, pa.int32()), [""]),
        "domains": (per_trial, dom_codes.take(per_trial.column("tord")), dom_names),
        "trajectories": (per_trial, traj_codes.take(per_trial.column("tord")), traj_names),
        "categories": (cat_rows, cat_rows.column("kc"), key_names),
        "complexity_tiers": (tier_rows, tier_rows.column("kc"), key_names),
        "backbones": (bb_rows, bb_rows.column("bc"), bb_names),
    }
    kind_names = list(kinds)
    names = [kn for _tbl, _code, kn in kinds.values()]
    parts = []
    for i, (tbl, code, _names) in enumerate(kinds.values()):
        cols = {"tord": tbl.column("tord"), "kind": pa.array([i] * tbl.num_rows, pa.int8()), "kc": code}
        parts.append(pa.table({**cols, **{c: tbl.column(c) for c in _SUMS}}))
    every = with_attrs(pa.concat_tables(parts), ["cfg", "task", "is_valid"])
    is_valid = every.column("is_valid")
    for c in _SUMS:
        every = every.append_column(
            f"{c}_v", pc.if_else(is_valid, every.column(c), pa.scalar(0, every.schema.field(c).type))
        )
    every = every.append_column("n_v", pc.cast(is_valid, pa.int64()))
    both = [*_SUMS, *(f"{c}_v" for c in _SUMS)]
    res = every.group_by(["cfg", "kind", "kc"], use_threads=False).aggregate([(c, "sum") for c in [*both, "n_v"]])
    pooled: dict[_Key, dict[str, Any]] = {}
    out_cols = {c: res.column(f"{c}_sum").to_pylist() for c in [*both, "n_v"]}
    for i, (cfg, kind, kc) in enumerate(zip(*(res.column(c).to_pylist() for c in ("cfg", "kind", "kc")))):
        if kc is None:
            continue  # a trial without a domain or trajectory
        key = names[kind][kc]
        pooled[("all", cfg, kind_names[kind], key)] = {c: out_cols[c][i] for c in _SUMS}
        if out_cols["n_v"][i]:
            pooled[("valid", cfg, kind_names[kind], key)] = {c: out_cols[f"{c}_v"][i] for c in _SUMS}

    # macro: per trial the group percent, mean over attempts per task, tasks in order of first appearance
    macro: dict[_Key, list[float]] = {}
    node_kinds = pa.array([kind_names.index(k) for k in ("categories", "complexity_tiers", "backbones")], pa.int8())
    m = every.select(["cfg", "kind", "kc", "task", "tord", "is_valid", "n_v", "ks", "km"])
    m = m.filter(pc.and_(pc.is_in(m.column("kind"), value_set=node_kinds), pc.greater(m.column("km"), 0)))
    if m.num_rows:
        pct = round2(pc.divide(pc.multiply(m.column("ks"), 100.0), m.column("km")))
        m = (
            m.select(["cfg", "kind", "kc", "task", "tord", "n_v"])
            .append_column("pct", pct)
            .append_column("pct_v", pc.if_else(m.column("is_valid"), pct, 0.0))
            .append_column(
                "tord_v",
                pc.if_else(m.column("is_valid"), m.column("tord"), pa.scalar(None, m.schema.field("tord").type)),
            )
        )
        res = m.group_by(["cfg", "kind", "kc", "task"], use_threads=False).aggregate(
            [("pct", "sum"), ("pct", "count"), ("tord", "min"), ("pct_v", "sum"), ("n_v", "sum"), ("tord_v", "min")]
        )
        for scope, order, total, cnt in (
            ("all", "tord_min", "pct_sum", "pct_count"),
            ("valid", "tord_v_min", "pct_v_sum", "n_v_sum"),
        ):
            sel = res.take(pc.sort_indices(res, [(order, "ascending")]))
            for cfg, kind, kc, t, n, first in zip(
                *(sel.column(c).to_pylist() for c in ("cfg", "kind", "kc", total, cnt, order))
            ):
                if first is not None:
                    macro.setdefault((scope, cfg, kind_names[kind], names[kind][kc]), []).append(t / n)
    return pooled, macro, cats, unknown_nodes


def _codes(arr) -> tuple[Any, list[Any]]:
    """(int32 codes, names): a string column dictionary-encoded; nulls stay null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    enc = pc.dictionary_encode(arr)
    return enc.indices.cast(pa.int32()), enc.dictionary.to_pylist()


def _pct_array(s, m):
    """``_pct`` over Arrow arrays: round(100 * s / m, 2) where m > 0, else null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    s, m = pc.cast(s, pa.float64()), pc.cast(m, pa.float64())
    positive = pc.greater(m, 0.0)
    pct = round2(pc.divide(pc.multiply(s, 100.0), pc.if_else(positive, m, 1.0)))
    return pc.if_else(positive, pct, pa.scalar(None, pa.float64()))


def _node_issues(con, col: dict[str, list[Any]], bad: list[int], quote: Callable[[str], str]) -> list[NodeIssue]:
    """The first MAX_ISSUES node rows that did not pass, in trial and node order: the rollups say
    which trials hold them (``bad``: per trial, nodes not PASSED), so only those trials' node rows are read."""
    import pyarrow as pa

    need: list[int] = []
    count = 0
    for tord, b in enumerate(bad):
        if b > 0:
            need.append(tord)
            count += b
            if count >= MAX_ISSUES:
                break
    if not need:
        return []
    con.register(
        f"{_R}_issues",
        pa.table(
            {
                "tord": pa.array(need, pa.int64()),
                "sweep_id": pa.array([col["sweep_id"][i] for i in need], pa.string()),
                "trial_id": pa.array([col["trial_id"][i] for i in need], pa.string()),
                "voided": pa.array([col["outcome"][i] == "voided_cheat" for i in need], pa.bool_()),
            }
        ),
    )
    sweeps = ", ".join(quote(s) for s in sorted({col["sweep_id"][i] for i in need}))
    trial_ids = ", ".join(quote(s) for s in sorted({col["trial_id"][i] for i in need}))
    st0 = "coalesce(nullif(n.status, ''), 'ERROR')"
    st = f"CASE WHEN sel.voided AND {st0} NOT IN {_EXCL_SQL} THEN 'FAILED' ELSE {st0} END"
    out = []
    for tord, node_id, cat, status, message in con.execute(
        f"SELECT sel.tord, n.node_id, coalesce(n.category, '') AS cat, {st} AS st, n.message "
        f"FROM node_results n JOIN {_R}_issues sel ON n.sweep_id = sel.sweep_id AND n.trial_id = sel.trial_id "
        f"WHERE n.sweep_id IN ({sweeps}) AND n.trial_id IN ({trial_ids}) AND {st} <> 'PASSED' "
        f"ORDER BY sel.tord, n.node_index, n.node_id LIMIT {MAX_ISSUES}"
    ).fetchall():
        out.append(
            NodeIssue(
                trial_id=col["trial_id"][tord],
                agent=col["agent"][tord],
                model=col["model"][tord],
                task_id=col["task_id"][tord],
                node_id=str(node_id),
                category=cat,
                status=status,
                message=(message or "")[:MESSAGE_CHARS],
            )
        )
    return out


_EXCL_SQL = "('" + "', '".join(sorted(_EXCLUDED_STATUSES)) + "')"


# --- paired comparison of two sweeps ----------------------------------------------------------
def bootstrap_ci(
    diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float] | None:
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


def _node_status_by_cell(
    nodes: list[dict[str, Any]], valid_trials: set[str], voided: set[str]
) -> dict[tuple, tuple[str, str | None, float]]:
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
        out.append(
            PairedComparison(
                agent=key[0],
                model=key[1],
                tasks=len(tasks),
                mean_a=_round(_mean(sa[t] for t in tasks)),
                mean_b=_round(_mean(sb[t] for t in tasks)),
                mean_diff=_round(_mean(diffs)),
                ci_low=_round(ci[0]) if ci else None,
                ci_high=_round(ci[1]) if ci else None,
                per_task={t: (round(sa[t], 4), round(sb[t], 4), round(sb[t] - sa[t], 4)) for t in tasks},
            )
        )
    valid_a = {t.trial_id for t in ra.trials if t.valid}
    valid_b = {t.trial_id for t in rb.trials if t.valid}
    st_a = _node_status_by_cell(na, valid_a, {t.trial_id for t in ra.trials if t.outcome == "voided_cheat"})
    st_b = _node_status_by_cell(nb, valid_b, {t.trial_id for t in rb.trials if t.outcome == "voided_cheat"})
    changes: list[NodeChange] = []
    for cell in sorted(set(st_a) & set(st_b), key=lambda k: tuple(x or "" for x in k)):
        if (cell[0], cell[1]) not in ca or (cell[0], cell[1]) not in cb:
            continue
        pa_, pb_ = st_a[cell][2] >= 0.5, st_b[cell][2] >= 0.5
        if pa_ != pb_:
            changes.append(
                NodeChange(
                    agent=cell[0],
                    model=cell[1],
                    task_id=cell[2],
                    node_id=cell[3],
                    category=st_b[cell][1] or st_a[cell][1],
                    status_a=st_a[cell][0],
                    status_b=st_b[cell][0],
                    change="gained" if pb_ else "lost",
                )
            )
    return CompareReport(
        sweep_a=sweep_a,
        sweep_b=sweep_b,
        resamples=resamples,
        seed=seed,
        configs=out,
        only_in_a=[config_label(*k) for k in sorted(set(ca) - set(cb), key=lambda k: (k[0] or "", k[1] or ""))],
        only_in_b=[config_label(*k) for k in sorted(set(cb) - set(ca), key=lambda k: (k[0] or "", k[1] or ""))],
        node_changes=changes,
    )


def _round(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)
