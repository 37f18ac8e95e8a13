"""``node_rollups``: per-trial sums of ``node_results``, derived at write time.

A report over 200 sweeps reads 10,000 trials and a million node rows, but needs only, per trial
and per node category and complexity tier, a handful of sums and status counts. The writer
derives them here for every unit it commits (``write_trial``, ``write_batch``, ``compact``), so
``saasbench report`` reads about 20 rollup rows per trial and never the node rows (except the first
500 non-PASSED ones it lists). Lakes written before rollups existed are rolled up at read time
with this same function, and ``saasbench lake compact`` stores them.

Summation order is part of the definition (a last-bit difference can flip a ``round(x, 2)``):
each group's sums add its node rows left to right in (node_index, node_id) order, excluded
statuses adding 0.0 (``x + 0.0 == x``). Arrow's single-threaded hash ``sum`` adds each group's
values in input order, like Python's ``sum``; the reference path in :mod:`saasbench.reports.aggregate`
adds in the same order and tests check both agree.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from saasbench.lake import schema as S

#: Statuses left out of numerator and denominator (``scoring.EXCLUDED``; tests check they agree).
EXCLUDED_STATUSES: tuple[str, ...] = ("SKIPPED_LLM", "QUARANTINED", "DRY_RUN")
#: node status -> rollup count column
COUNT_COLUMNS: dict[str, str] = {s: s.lower() for s in S.NODE_STATUSES}
SUM_COLUMNS: tuple[str, ...] = ("score", "max_score", "det_score", "det_max_score", "skipped_llm_max_score")
_KEY = ("task_id", "agent", "model", "attempt")  # constant per trial: carried along
_NODE_ORDER = [
    ("sweep_id", "ascending"),
    ("trial_id", "ascending"),
    ("node_index", "ascending"),
    ("node_id", "ascending"),
]


def node_rollups(nodes: pa.Table) -> pa.Table:
    """The ``node_rollups`` rows of some ``node_results`` rows (any number of trials).

    One row per trial (kind ``trial``, key ``''``), per (trial, category) (kind ``category``, key
    the category, ``''`` when missing) and per (trial, tier) (kind ``tier``, rows without a tier
    left out). A missing or empty status counts as ERROR; a missing score or max_score as 0.
    """
    if nodes.num_rows == 0:
        return S.NODE_ROLLUPS.empty_table()
    nodes = nodes.take(pc.sort_indices(nodes, sort_keys=_NODE_ORDER))  # stable: ties keep input order
    st = pc.fill_null(nodes.column("status"), "ERROR")
    st = pc.if_else(pc.equal(st, ""), "ERROR", st)
    excl = pc.is_in(st, value_set=pa.array(EXCLUDED_STATUSES))
    llm = pc.equal(pc.fill_null(nodes.column("method"), ""), "llm-judge")
    score = pc.fill_null(nodes.column("score").cast(pa.float64()), 0.0)
    mx = pc.fill_null(nodes.column("max_score").cast(pa.float64()), 0.0)
    zero = pa.scalar(0.0)
    det_out = pc.or_(excl, llm)
    cols: dict[str, pa.Array] = {
        "sweep_id": nodes.column("sweep_id"),
        "trial_id": nodes.column("trial_id"),
        **{k: nodes.column(k) for k in _KEY},
        "score": pc.if_else(excl, zero, score),
        "max_score": pc.if_else(excl, zero, mx),
        "det_score": pc.if_else(det_out, zero, score),
        "det_max_score": pc.if_else(det_out, zero, mx),
        "skipped_llm_max_score": pc.if_else(pc.equal(st, "SKIPPED_LLM"), mx, zero),
        **{col: pc.equal(st, status).cast(pa.int64()) for status, col in COUNT_COLUMNS.items()},
        "other_status": pc.invert(pc.is_in(st, value_set=pa.array(S.NODE_STATUSES))).cast(pa.int64()),
    }
    base = pa.table(cols)
    n = nodes.num_rows
    sums = [*SUM_COLUMNS, *COUNT_COLUMNS.values(), "other_status"]
    parts = []
    for kind, key in (
        ("trial", pa.array([""] * n, pa.string())),
        ("category", pc.fill_null(nodes.column("category"), "")),
        ("tier", nodes.column("complexity_tier")),
    ):
        g = (
            base.append_column("key", key)
            .group_by(["sweep_id", "trial_id", "key"], use_threads=False)
            .aggregate([(c, "sum") for c in sums] + [(k, "first") for k in _KEY] + [([], "count_all")])
        )
        if kind == "tier":
            g = g.filter(pc.is_valid(g.column("key")))
        out = {
            "sweep_id": g.column("sweep_id"),
            "trial_id": g.column("trial_id"),
            **{k: g.column(f"{k}_first") for k in _KEY},
            "kind": pa.array([kind] * g.num_rows, pa.string()),
            "key": g.column("key"),
            "nodes": g.column("count_all"),
            **{c: g.column(f"{c}_sum") for c in sums},
        }
        parts.append(pa.table({f.name: out[f.name].cast(f.type) for f in S.NODE_ROLLUPS}, schema=S.NODE_ROLLUPS))
    return pa.concat_tables(parts)
