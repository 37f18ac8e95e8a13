"""Batches and compaction: many units in a few files, on a local folder and on S3 (moto_server).

Every test compares what readers see (every table, every row) against what per-trial writes
showed, across each crash point of ``compact`` and writes that race with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_lake import lake, real, rows_for  # noqa: F401 - fixtures

from saasbench import lake as L
from saasbench.lake import schema as S
from saasbench.lake.batch import compact, merge_batches, write_batch
from saasbench.lake.store import LocalStore
from saasbench.reports.aggregate import sweep_report

ROOT = Path(__file__).resolve().parents[1]


def everything(store: L.Store, sweep_id: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in a stable order (the reader's whole view of the lake)."""
    con = L.connect(store, sweep_id=sweep_id)
    out = {}
    for name in S.TABLES:
        tbl = con.execute(f"SELECT * FROM {name}").arrow()
        tbl = tbl.read_all() if isinstance(tbl, pa.RecordBatchReader) else tbl
        out[name] = sorted(tbl.to_pylist(), key=repr)
    return out


def markers(store: L.Store) -> list[str]:
    return sorted(k for k in store.list("_commits/") if k.endswith(".json"))


def seed(store: L.Store, real: dict, sweeps=("s1", "s2"), n: int = 3) -> None:
    for sw in sweeps:
        L.write_sweep(store, L.sweep_row(sw, config={"k": sw}, tasks=["task0", "task1"], agents=["oracle"]))
        for i in range(n):
            L.write_trial(
                store,
                rows_for(
                    real,
                    sweep=sw,
                    trial=f"t{i}",
                    task=f"task{i % 2}",
                    messages={"README_EXISTS": f"{sw}/t{i}"},
                    with_traj=i == 0,
                ),
            )


def test_write_batch_commits_many_trials_in_few_files(lake, real):
    units = [rows_for(real, sweep="sb", trial=f"t{i}", task=f"task{i % 3}", with_traj=False) for i in range(6)]
    tables: dict[str, list] = {}
    for u in units:
        for name, rows in u.tables.items():
            tables.setdefault(name, []).extend(rows.to_pylist() if isinstance(rows, pa.Table) else list(rows))
    tables["sweeps"] = [L.sweep_row("sb", config={}, tasks=["task0"], agents=["oracle"])]
    c1 = write_batch(lake, tables)
    parquet = [k for k in lake.list("") if k.endswith(".parquet")]
    assert len(parquet) == len([t for t, r in tables.items() if r]) + 1  # one file per table, and node_rollups
    assert L.committed_trials(lake, "sb") == {f"t{i}" for i in range(6)}
    assert L.is_committed(lake, "sb", "t3") and not L.is_committed(lake, "sb", "t9")
    before = everything(lake)
    assert len(before["trials"]) == 6 and len(before["sweeps"]) == 1
    assert len(before["node_results"]) == 6 * len(real["report"].nodes)
    c2 = write_batch(lake, tables)  # idempotent: same batch id, same keys, one copy
    assert (c2.marker, c2.generation) == (c1.marker, c1.generation)
    assert everything(lake) == before
    # rows are sorted by (sweep, task, trial): row-group statistics prune other tasks
    con = L.connect(lake, sweep_id="sb")
    assert con.execute("SELECT count(*) FROM trials WHERE task_id = 'task1'").fetchone()[0] == 2


def test_write_batch_rejects_bad_rows(tmp_path, real):
    store = L.lake_from_uri(str(tmp_path / "lake"))
    rows = rows_for(real, sweep="sb", trial="t0", with_traj=False).tables["trials"]
    bad = [dict(r) for r in (rows.to_pylist() if isinstance(rows, pa.Table) else rows)]
    bad.append({**bad[0], "task_id": "other-task"})
    with pytest.raises(ValueError, match="two tasks"):
        write_batch(store, {"trials": bad})
    with pytest.raises(ValueError, match="unknown column"):
        write_batch(store, {"trials": [{**bad[0], "nope": 1}]})
    with pytest.raises(ValueError, match="no rows"):
        write_batch(store, {"trials": []})
    assert store.list("") == []  # nothing written


def test_compact_keeps_every_row_and_removes_small_files(lake, real):
    seed(lake, real)
    L.write_validation(
        lake,
        "task0",
        "run-1",
        [{"task_id": "task0", "run_id": "run-1", "node_id": "N1", "repeats": 3, "passed": 3, "verdict": "stable"}],
    )
    before, before_s1 = everything(lake), everything(lake, "s1")
    n_markers = len(markers(lake))
    res = compact(lake)
    assert res.batch is not None and res.units == 2 + 6 + 1
    assert everything(lake) == before and everything(lake, "s1") == before_s1
    assert markers(lake) == [res.batch.marker] and len(res.markers_deleted) == n_markers
    parquet = [k for k in lake.list("") if k.endswith(".parquet")]
    assert sorted(parquet) == sorted(f["key"] for f in res.batch.files)
    assert L.committed_trials(lake, "s1") == {"t0", "t1", "t2"}
    assert not compact(lake).changed  # nothing left to do
    assert L.vacuum(lake, older_than_s=0) == []


def test_report_is_the_same_after_compaction(tmp_path, real):
    store = L.lake_from_uri(str(tmp_path / "lake"))
    seed(store, real)
    before = sweep_report(store, ["s1", "s2"]).model_dump()
    compact(store)
    assert sweep_report(store, ["s1", "s2"]).model_dump() == before


def test_trial_rewritten_after_compaction_wins_then_folds_in(lake, real):
    seed(lake, real)
    compact(lake)
    L.write_trial(
        lake, rows_for(real, sweep="s1", trial="t1", task="task1", messages={"README_EXISTS": "rerun"}, with_traj=False)
    )
    q = "SELECT message FROM node_results WHERE sweep_id = 's1' AND trial_id = 't1' AND node_id = 'README_EXISTS'"
    assert L.query(lake, q).to_pylist() == [{"message": "rerun"}]
    assert L.query(lake, q, sweep_id="s1").to_pylist() == [{"message": "rerun"}]
    assert L.query(lake, "SELECT count(*) AS n FROM trials").to_pylist() == [{"n": 6}]
    after = everything(lake)
    res = compact(lake)
    assert res.batch is not None and everything(lake) == after and len(markers(lake)) == 1


def test_delete_a_compacted_trial(lake, real):
    seed(lake, real)
    compact(lake)
    assert L.delete_trial(lake, "s2", "t0")
    assert not L.delete_trial(lake, "s2", "t0")
    assert L.committed_trials(lake, "s2") == {"t1", "t2"}
    assert L.query(lake, "SELECT count(*) AS n FROM trajectory_events WHERE sweep_id = 's2'").to_pylist() == [{"n": 0}]
    view = everything(lake)
    compact(lake)
    assert everything(lake) == view and len(markers(lake)) == 1  # the tombstone is gone with the old batch


def test_compact_one_sweep_leaves_the_others_alone(lake, real):
    seed(lake, real)
    s2_markers = [k for k in markers(lake) if "sweep_id=s2" in k]
    before = everything(lake)
    res = compact(lake, sweep_id="s1")
    assert res.units == 4  # the sweep row and three trials
    assert [k for k in markers(lake) if "sweep_id=s2" in k] == s2_markers
    assert not [k for k in markers(lake) if "sweep_id=s1" in k]
    assert everything(lake) == before
    compact(lake)  # then everything: the s1 batch is folded into the lake-wide one
    assert everything(lake) == before and len(markers(lake)) == 1


def _batches(store: L.Store) -> list[str]:
    return [k for k in markers(store) if k.startswith("_commits/_batches/")]


def test_merge_batches_keeps_the_largest_and_merges_the_rest(lake, real):
    seed(lake, real, sweeps=("big",), n=6)
    compact(lake, sweep_id="big")
    small = [f"s{i}" for i in range(5)]
    seed(lake, real, sweeps=small, n=1)
    for sw in small:
        compact(lake, sweep_id=sw)  # one batch per finished sweep, as sweeps leave them
    before, report = everything(lake), sweep_report(lake, ["big", *small]).model_dump()
    assert len(_batches(lake)) == 6
    assert merge_batches(lake, max_batches=6).batch is None  # at the limit: nothing to do
    sizes = {
        m["marker"]: sum(f["rows"] for f in m["files"]) for m in L.list_commits(lake) if m["marker"] in _batches(lake)
    }
    largest = max(sizes, key=sizes.get)
    res = merge_batches(lake, max_batches=3)
    assert res.units == 5 * 2 and len(res.markers_deleted) == 5  # five sweep rows, five trials; five old batches
    assert sorted(_batches(lake)) == sorted([largest, res.batch.marker])
    assert everything(lake) == before
    assert sweep_report(lake, ["big", *small]).model_dump() == report


def test_merge_batches_keeps_newer_trial_writes(lake, real):
    seed(lake, real, sweeps=("s1", "s2", "s3"), n=2)
    for sw in ("s1", "s2", "s3"):
        compact(lake, sweep_id=sw)
    L.write_trial(
        lake, rows_for(real, sweep="s1", trial="t1", task="task1", messages={"README_EXISTS": "rerun"}, with_traj=False)
    )
    before = everything(lake)
    res = merge_batches(lake, max_batches=2)
    assert res.batch is not None and everything(lake) == before
    q = "SELECT message FROM node_results WHERE sweep_id = 's1' AND trial_id = 't1' AND node_id = 'README_EXISTS'"
    assert L.query(lake, q).to_pylist() == [{"message": "rerun"}]
    assert any("trial_id=t1" in k for k in markers(lake))  # the newer write is not merged away


@pytest.mark.parametrize("same_source", [True, False])
def test_a_batch_listing_a_unit_twice_still_serves_it_once(lake, real, same_source):
    """A batch marker whose unit list names a trial twice (a hand-edited or buggy writer's marker)
    must not hide that trial: the batch is its only source."""
    seed(lake, real, sweeps=("s1",), n=2)
    compact(lake, sweep_id="s1")
    before = everything(lake)
    [key] = _batches(lake)
    m = json.loads(lake.get(key))
    dup = dict(next(e for e in m["units"] if e.get("trial_id") == "t1"))
    if not same_source:
        dup["source_generation"] = "f" * 16
    m["units"].append(dup)
    lake.put(key, json.dumps(m).encode())
    assert everything(lake) == before
    assert L.committed_trials(lake, "s1") == {"t0", "t1"}


@pytest.mark.parametrize("event", ["before_file", "before_marker", "before_cleanup"])
def test_crash_anywhere_in_merge_batches_loses_and_duplicates_nothing(lake, real, event):
    seed(lake, real, sweeps=("s1", "s2", "s3"), n=2)
    for sw in ("s1", "s2", "s3"):
        compact(lake, sweep_id=sw)
    before = everything(lake)

    def hook(ev: str, key: str) -> None:
        if ev == event:
            raise RuntimeError(f"crash {ev}")

    with pytest.raises(RuntimeError, match="crash"):
        merge_batches(lake, max_batches=2, hook=hook)
    assert everything(lake) == before
    assert L.committed_trials(lake, "s2") == {"t0", "t1"}
    merge_batches(lake, max_batches=2)
    assert everything(lake) == before and len(_batches(lake)) == 2


@pytest.mark.parametrize("event", ["before_file", "before_marker", "before_cleanup"])
def test_crash_anywhere_in_compaction_loses_and_duplicates_nothing(lake, real, event):
    seed(lake, real)
    compact(lake, sweep_id="s2")  # an older batch that the next compaction supersedes
    before = everything(lake)

    def hook(ev: str, key: str) -> None:
        if ev == event:
            raise RuntimeError(f"crash {ev}")

    with pytest.raises(RuntimeError, match="crash"):
        compact(lake, hook=hook)
    assert everything(lake) == before
    assert L.committed_trials(lake, "s1") == {"t0", "t1", "t2"}
    compact(lake)
    assert everything(lake) == before and len(markers(lake)) == 1
    L.vacuum(lake, older_than_s=0)
    assert sorted(k for k in lake.list("") if k.endswith(".parquet")) == sorted(
        f["key"] for f in L.list_commits(lake)[0]["files"]
    )


def test_trial_written_while_compacting_is_kept(lake, real):
    seed(lake, real)
    newer = rows_for(real, sweep="s1", trial="t2", task="task0", messages={"README_EXISTS": "during"}, with_traj=False)

    def hook(ev: str, key: str) -> None:
        if ev == "before_marker":  # the batch has read the old t2; a rerun commits a new t2 now
            L.write_trial(lake, newer)

    compact(lake, hook=hook)
    q = "SELECT message FROM node_results WHERE sweep_id = 's1' AND trial_id = 't2' AND node_id = 'README_EXISTS'"
    assert L.query(lake, q).to_pylist() == [{"message": "during"}]
    assert any("trial_id=t2" in k for k in markers(lake))  # newer than the batch: not deleted
    assert L.query(lake, "SELECT count(*) AS n FROM trials").to_pylist() == [{"n": 6}]


COMPACT_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from saasbench.lake import lake_from_uri
    from saasbench.lake.batch import compact
    stage, uri, endpoint = sys.argv[1], sys.argv[2], sys.argv[3] or None
    store = lake_from_uri(uri, endpoint_url=endpoint)
    def hook(ev, key):
        if ev == stage:
            print("AT", ev, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    compact(store, hook=hook)
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("stage", ["before_marker", "before_cleanup"])
def test_sigkill_during_compaction(lake, real, tmp_path, stage):
    seed(lake, real, sweeps=("s1",))
    before = everything(lake)
    script = tmp_path / "compactor.py"
    script.write_text(COMPACT_SCRIPT)
    endpoint = "" if isinstance(lake, LocalStore) else lake.endpoint_url
    proc = subprocess.run(
        [sys.executable, str(script), stage, lake.uri, endpoint],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.startswith("AT " + stage)
    assert everything(lake) == before
    compact(lake)
    assert everything(lake) == before and len(markers(lake)) == 1


def test_files_of_an_older_schema_version_read_with_nulls(lake, real):
    """A trial written before a column existed (marker schema_version 0, file without the column)
    reads beside a current one: the missing column is NULL, every other value intact."""
    import io
    import json

    import pyarrow.parquet as pq

    L.write_trial(lake, rows_for(real, sweep="sv", trial="old"))
    L.write_trial(lake, rows_for(real, sweep="sv", trial="new"))
    key = "_commits/sweep_id=sv/trial_id=old.json"
    marker = json.loads(lake.get(key))
    f = next(f for f in marker["files"] if f["table"] == "trials")
    old = pq.read_table(io.BytesIO(lake.get(f["key"]))).drop(["cost_usd"])
    buf = io.BytesIO()
    pq.write_table(old, buf)
    lake.put(f["key"], buf.getvalue())
    marker["schema_version"] = 0
    lake.put(key, json.dumps(marker).encode())
    rows = {
        r["trial_id"]: r for r in L.query(lake, "SELECT trial_id, cost_usd, tokens_in, agent FROM trials").to_pylist()
    }
    assert rows["old"]["cost_usd"] is None and rows["new"]["cost_usd"] == pytest.approx(0.0123)
    assert rows["old"]["tokens_in"] == rows["new"]["tokens_in"] == 1000 and rows["old"]["agent"] == "oracle"
    compact(lake)  # compaction rewrites it in the current schema
    assert L.list_commits(lake)[0]["schema_version"] == S.SCHEMA_VERSION
    assert {
        r["trial_id"]: r["cost_usd"] for r in L.query(lake, "SELECT trial_id, cost_usd FROM trials").to_pylist()
    } == {"old": None, "new": pytest.approx(0.0123)}


def test_cli_lake_compact_and_report(tmp_path, real):
    from typer.testing import CliRunner

    from saasbench.cli.main import app

    store = L.lake_from_uri(str(tmp_path / "lake"))
    seed(store, real)
    runner = CliRunner()
    res = runner.invoke(app, ["lake", "compact", "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0, res.output
    assert "compacted 8 unit(s)" in res.output and len(markers(store)) == 1
    res = runner.invoke(app, ["lake", "compact", "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0 and "nothing to compact" in res.output
    res = runner.invoke(app, ["report", "--lake", str(tmp_path / "lake")])  # every sweep, one connection
    assert res.exit_code == 0, res.output
    assert "oracle" in res.output
    res = runner.invoke(app, ["lake", "vacuum", "--lake", str(tmp_path / "lake"), "--older-than", "0"])
    assert res.exit_code == 0 and "0 orphan file(s) deleted" in res.output


def test_cli_lake_merge(tmp_path, real):
    from typer.testing import CliRunner

    from saasbench.cli.main import app

    uri = str(tmp_path / "lake")
    store = L.lake_from_uri(uri)
    seed(store, real, sweeps=("s1", "s2", "s3"), n=1)
    for sw in ("s1", "s2", "s3"):
        compact(store, sweep_id=sw)
    before = everything(store)
    runner = CliRunner()
    res = runner.invoke(app, ["lake", "merge", "--lake", uri, "--max-batches", "3"])
    assert res.exit_code == 0 and "nothing to merge" in res.output, res.output
    res = runner.invoke(app, ["lake", "merge", "--lake", uri, "--max-batches", "2"])
    assert res.exit_code == 0, res.output
    assert "merged 4 unit(s)" in res.output and "deleted 2 batch marker(s)" in res.output
    assert len(_batches(store)) == 2 and everything(store) == before
    res = runner.invoke(app, ["lake", "merge", "--lake", uri, "--max-batches", "1"])
    assert res.exit_code != 0  # the largest batch is never merged: 2 is the least
