"""node_rollups: derived at write time, read by the report instead of the node rows.

Checks the rollup rows against hand-computed sums, that every writer (write_trial, write_batch,
compact) derives them and refuses them from callers, that a lake written before rollups existed
reports the same numbers (rolled up at read time) and gains rollups when compacted, and that the
report over stored rollups equals the Python reference path on random trials.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from test_aggregate import _assert_same, _random_rows
from test_lake import lake  # noqa: F401 - fixture: a folder and moto S3

from saasbench.evaluation.scoring import EXCLUDED
from saasbench.lake import TrialRows, connect, write_trial
from saasbench.lake import writer as lake_writer
from saasbench.lake.batch import compact, write_batch
from saasbench.lake.rollups import EXCLUDED_STATUSES, node_rollups
from saasbench.lake.snapshot import snapshot
from saasbench.reports import aggregate


def _node(i: int, **kw):
    row = {
        "sweep_id": "s",
        "trial_id": "t",
        "task_id": "k",
        "agent": "a",
        "model": "m",
        "attempt": 0,
        "node_id": f"n{i}",
        "node_index": i,
        "category": "RBAC",
        "method": "weighted",
        "complexity_tier": "linear_crud",
        "status": "PASSED",
        "score": 1.0,
        "max_score": 1.0,
    }
    row.update(kw)
    return row


def test_excluded_statuses_are_the_scoring_modules() -> None:
    assert set(EXCLUDED_STATUSES) == {s.value for s in EXCLUDED}


def test_rollup_rows_by_hand() -> None:
    nodes = [
        _node(0, score=2.0, max_score=4.0),
        _node(1, status="FAILED", score=0.0, max_score=3.0, category=None),
        _node(2, status="SKIPPED_LLM", score=None, max_score=5.0, method="llm-judge", complexity_tier=None),
        _node(3, status=None, score=None, max_score=None, category="Deployment"),  # missing status: ERROR
        _node(4, status="", score=0.5, max_score=1.0, method="llm-judge"),  # empty status: ERROR
        _node(5, status="QUARANTINED", score=9.0, max_score=9.0),  # excluded: adds 0
        _node(6, status="BOGUS", score=1.0, max_score=1.0, trial_id="u"),
    ]
    tbl = lake_writer.to_table("node_results", nodes)
    got = {(r["trial_id"], r["kind"], r["key"]): r for r in node_rollups(tbl).to_pylist()}
    assert set(got) == {
        ("t", "trial", ""),
        ("t", "category", "RBAC"),
        ("t", "category", ""),
        ("t", "category", "Deployment"),
        ("t", "tier", "linear_crud"),
        ("u", "trial", ""),
        ("u", "category", "RBAC"),
        ("u", "tier", "linear_crud"),
    }
    t = got[("t", "trial", "")]
    assert (t["nodes"], t["score"], t["max_score"]) == (6, 2.5, 8.0)
    assert (t["det_score"], t["det_max_score"], t["skipped_llm_max_score"]) == (2.0, 7.0, 5.0)
    assert (t["passed"], t["failed"], t["error"], t["skipped_llm"], t["quarantined"], t["other_status"]) == (
        1,
        1,
        2,
        1,
        1,
        0,
    )
    rbac = got[("t", "category", "RBAC")]
    assert (rbac["nodes"], rbac["score"], rbac["max_score"], rbac["error"]) == (4, 2.5, 5.0, 1)
    assert got[("t", "category", "")]["max_score"] == 3.0
    assert got[("t", "tier", "linear_crud")]["nodes"] == 5  # the SKIPPED_LLM node has no tier
    assert got[("u", "trial", "")]["other_status"] == 1
    assert all(r["task_id"] == "k" and r["agent"] == "a" and r["attempt"] == 0 for r in got.values())


def test_rollup_sums_add_in_node_order() -> None:
    """0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1 in floats: the node_index order decides, not the row order."""
    vals = [0.1, 0.2, 0.3]
    rows = [_node(i, score=v, max_score=1.0) for i, v in enumerate(vals)]
    got = node_rollups(lake_writer.to_table("node_results", list(reversed(rows)))).to_pylist()
    assert [r["score"] for r in got if r["kind"] == "trial"] == [(0.1 + 0.2) + 0.3]
    assert (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1


def test_round2_equals_python_round() -> None:
    rng = random.Random(7)
    xs = [rng.uniform(0, 100) for _ in range(20_000)]
    xs += [k / 1000 for k in range(0, 100_001, 5)]  # ties in decimal, not in binary
    xs += [100 * (0.1 + 0.2) / 240, 100 * 0.3 / 240, 2.675, 1.005, 0.125, 0.375]
    assert aggregate.round2(pa.array(xs, pa.float64())).to_pylist() == [round(x, 2) for x in xs]
    ties = [0.005, 0.015, 2.675, 1.005]
    assert aggregate.round2(pa.chunked_array([xs[:10], ties], pa.float64())).to_pylist() == [
        round(x, 2) for x in xs[:10] + ties
    ]


def test_writers_derive_rollups_and_refuse_them(tmp_path: Path) -> None:
    uri = str(tmp_path / "lake")
    rows = TrialRows("s", "t", "k", {"node_results": [_node(0), _node(1, status="FAILED", score=0.0)]})
    commit = write_trial(uri, rows)
    assert commit.rows("node_rollups") == 3  # trial, one category, one tier
    with pytest.raises(ValueError, match="node_rollups: derived"):
        write_trial(uri, TrialRows("s", "t2", "k", {"node_rollups": []}))
    with pytest.raises(ValueError, match="node_rollups: derived"):
        write_batch(uri, {"node_rollups": []})
    b = write_batch(uri, {"node_results": [_node(0, trial_id="t3"), _node(0, trial_id="t4", sweep_id="s2")]})
    assert b.rows("node_rollups") == 6
    con = connect(uri)
    assert con.execute(
        "SELECT count(*), count(DISTINCT trial_id) FROM node_rollups WHERE kind = 'trial'"
    ).fetchone() == (3, 3)
    assert snapshot(lake_writer.lake_from_uri(uri)).rollups_missing == set()


def _lake_rows(seed: int, n: int):
    trials, nodes = _random_rows(seed, n)
    for t in trials:
        t.pop("trajectory")
        t["outcome"] = t["outcome"] or "completed"  # the lake requires one
    return trials, nodes


def test_report_over_stored_rollups_equals_reference(lake) -> None:  # noqa: F811 - the fixture
    trials, nodes = _lake_rows(11, 200)
    write_batch(lake, {"trials": trials, "node_results": nodes})
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM _saasbench_rollups_missing").fetchone()[0] == 0
    for sweeps in (["s1"], ["s1", "s2"]):
        for threshold in (100.0, 40.0):
            fast = aggregate._sql_report(con, sweeps, threshold)
            assert fast is not None
            _assert_same(
                fast.model_dump(), aggregate.sweep_report_reference(con, sweeps, pass_threshold=threshold).model_dump()
            )
    assert fast.orphan_node_rows == 3 and fast.node_issues


def test_lake_without_rollups_reports_the_same_and_compact_adds_them(tmp_path: Path, monkeypatch) -> None:
    trials, nodes = _lake_rows(12, 120)
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    write_batch(new, {"trials": trials, "node_results": nodes})
    with monkeypatch.context() as m:  # the writer as it was before rollups existed
        m.setattr(lake_writer, "with_derived", lambda tables: dict(tables))
        m.setattr("saasbench.lake.batch.with_derived", lambda tables: dict(tables))
        write_batch(
            old,
            {
                "trials": [t for t in trials if t["sweep_id"] == "s1"],
                "node_results": [n for n in nodes if n["sweep_id"] == "s1"],
            },
        )
        s2 = {n["trial_id"]: n["task_id"] for n in nodes if n["sweep_id"] == "s2"}  # orphan node rows too
        s2.update({t["trial_id"]: t["task_id"] for t in trials if t["sweep_id"] == "s2"})
        for trial_id, task_id in s2.items():
            write_trial(
                old,
                TrialRows(
                    "s2",
                    trial_id,
                    task_id,
                    {
                        "trials": [t for t in trials if t["trial_id"] == trial_id],
                        "node_results": [n for n in nodes if n["trial_id"] == trial_id and n["sweep_id"] == "s2"],
                    },
                ),
            )
    store = lake_writer.lake_from_uri(old)
    assert snapshot(store).rollups_missing == {"s1", "s2"}
    assert connect(old).execute("SELECT count(*) FROM node_rollups").fetchone()[0] == 0
    want = aggregate.sweep_report(new, ["s1", "s2"])
    _assert_same(aggregate.sweep_report(old, ["s1", "s2"]).model_dump(), want.model_dump())
    # one sweep rewritten by today's writer: the other is still rolled up at read time
    t = next(t for t in trials if t["sweep_id"] == "s2" and any(n["trial_id"] == t["trial_id"] for n in nodes))
    write_trial(
        old,
        TrialRows(
            "s2",
            t["trial_id"],
            t["task_id"],
            {"trials": [t], "node_results": [n for n in nodes if n["trial_id"] == t["trial_id"]]},
        ),
    )
    assert snapshot(store).rollups_missing == {"s1", "s2"}  # s2's other trials still lack them
    compact(old, sweep_id="s2")
    assert snapshot(store).rollups_missing == {"s1"}
    _assert_same(aggregate.sweep_report(old, ["s1", "s2"]).model_dump(), want.model_dump())
    compact(old)
    assert snapshot(store).rollups_missing == set()
    con = connect(old)
    assert (
        con.execute("SELECT count(*) FROM node_rollups").fetchone()[0]
        == connect(new).execute("SELECT count(*) FROM node_rollups").fetchone()[0]
        > 0
    )
    _assert_same(aggregate.sweep_report(old, ["s1", "s2"]).model_dump(), want.model_dump())


class _Recording:
    """A DuckDB connection that records the SQL run through it."""

    def __init__(self, con) -> None:
        self.con, self.sql = con, []

    def execute(self, sql, *args):
        self.sql.append(sql)
        return self.con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_report_reads_node_rows_only_for_the_failures_it_lists(tmp_path: Path) -> None:
    """With rollups stored, the report reads no node rows when every node passed, and only the
    failing trials' node rows otherwise."""
    uri = str(tmp_path / "lake")
    trials = [
        {
            "sweep_id": "s",
            "trial_id": f"t{i}",
            "task_id": f"k{i % 3}",
            "agent": "a",
            "model": "m",
            "attempt": i // 3,
            "domain": "CF",
            "outcome": "completed",
        }
        for i in range(9)
    ]
    nodes = [
        _node(
            j,
            trial_id=f"t{i}",
            task_id=f"k{i % 3}",
            attempt=i // 3,
            score=0.1 * (j + 1),
            max_score=1.0,
            category=["RBAC", "Deployment"][j % 2],
        )
        for i in range(9)
        for j in range(5)
    ]
    write_batch(uri, {"trials": trials, "node_results": nodes})
    con = _Recording(connect(uri))
    got = aggregate.sweep_report(con, ["s"])
    assert got.node_issues == [] and got.configs[0].all.pass_at_1 == round(
        100 * sum(0.1 * (j + 1) for j in range(5)) / 5, 2
    )
    assert not [q for q in con.sql if "node_results" in q]
    assert got == aggregate.sweep_report_reference(uri, ["s"])

    nodes[7]["status"], nodes[7]["score"] = "FAILED", 0.0  # t1's third node
    write_batch(uri, {"trials": trials, "node_results": nodes})
    con = _Recording(connect(uri))
    got = aggregate.sweep_report(con, ["s"])
    assert [(i.trial_id, i.node_id, i.status) for i in got.node_issues] == [("t1", "n2", "FAILED")]
    reads = [q for q in con.sql if "node_results" in q]
    assert len(reads) == 1 and "'t1'" in reads[0] and "'t0'" not in reads[0]
    _assert_same(got.model_dump(), aggregate.sweep_report_reference(uri, ["s"]).model_dump())


def test_connect_builds_only_the_views_asked_for(tmp_path: Path) -> None:
    uri = str(tmp_path / "lake")
    write_batch(
        uri,
        {
            "trials": [{"sweep_id": "s", "trial_id": "t", "task_id": "k", "outcome": "completed"}],
            "node_results": [_node(0)],
        },
    )
    con = connect(uri, tables=aggregate.REPORT_TABLES)
    assert con.execute("SELECT count(*) FROM node_rollups").fetchone() == (3,)
    with pytest.raises(Exception, match="sweeps"):
        con.execute("SELECT count(*) FROM sweeps")
    with pytest.raises(ValueError, match="no lake table"):
        connect(uri, tables=("trials", "nodes"))
