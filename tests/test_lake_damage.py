"""A damaged lake is loud and repairable (issue #17 item 3): garbage markers, missing and truncated files.

Before: a garbage trial marker made the trial vanish silently (and ``lake vacuum`` would then have
deleted its data), a garbage batch marker hid its whole sweep, one missing or truncated file made
every table unqueryable, and there was no repair command. Each case here damages a real lake the
way an operator or a failing disk would, then runs ``saasbench lake check`` and ``lake repair``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from saasbench import lake as L
from saasbench.cli.main import app
from saasbench.lake.check import check_lake, repair_lake
from saasbench.lake.query import LakeDamaged
from saasbench.lake.records import TrialInfo, trial_rows
from saasbench.lake.snapshot import LakeDamagedWarning
from saasbench.lake.writer import trial_marker_key

SWEEP = "sw-dmg"


def _write(store: L.Store, n: int = 3, sweep: str = SWEEP) -> None:
    for i in range(n):
        info = TrialInfo(sweep_id=sweep, trial_id=f"t{i}", task_id="task-a", agent="oracle", model="m")
        calls = [{"call_id": f"c{i}", "status": "success", "prompt_tokens": 10 + i, "completion_tokens": 1}]
        L.write_trial(store, trial_rows(info, model_calls=calls))


def _trials(store: L.Store) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LakeDamagedWarning)
        rows = L.query(store, "SELECT trial_id FROM trials WHERE sweep_id = ? ORDER BY trial_id", [SWEEP])
    return [r["trial_id"] for r in rows.to_pylist()]


def _lake_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["lake", *args], env={"COLUMNS": "250"})
    return result.exit_code, result.output


@pytest.fixture
def store(tmp_path: Path) -> L.Store:
    s = L.lake_from_uri(str(tmp_path / "lake"))
    _write(s)
    return s


def test_a_garbage_trial_marker_is_loud_blocks_vacuum_and_is_rebuilt(store, tmp_path) -> None:
    key = trial_marker_key(SWEEP, "t1")
    good = store.get(key)
    store.put(key, b"\x00garbage{")
    with pytest.warns(LakeDamagedWarning, match="trial_id=t1"):
        L.query(store, "SELECT count(*) FROM trials")
    assert _trials(store) == ["t0", "t2"]
    with pytest.raises(L.LakeStoreError, match="lake repair"):
        L.vacuum(store, older_than_s=0)  # it would delete t1's only copy
    code, out = _lake_cli("check", "--lake", str(tmp_path / "lake"))
    assert code == 1 and "bad_marker" in out and "trial_id=t1" in out
    code, out = _lake_cli("repair", "--lake", str(tmp_path / "lake"))
    assert code == 0 and f"rebuilt {key}" in out
    assert _trials(store) == ["t0", "t1", "t2"]
    assert check_lake(store).ok
    rebuilt = L.list_commits(store, sweep_id=SWEEP)
    again = next(m for m in rebuilt if m["marker"] == key)
    import json

    original = json.loads(good)
    assert again["generation"] == original["generation"] and again["task_id"] == "task-a"
    assert sorted(f["key"] for f in again["files"]) == sorted(f["key"] for f in original["files"])


def test_a_garbage_batch_marker_is_rebuilt_from_its_files(store) -> None:
    res = L.compact(store, sweep_id=SWEEP)
    assert res.batch is not None
    store.put(res.batch.marker, b'{"format": "something else"}')
    with pytest.warns(LakeDamagedWarning):
        L.query(store, "SELECT 1")
    assert _trials(store) == []  # the whole sweep hidden
    report, result = repair_lake(store)
    assert [p.kind for p in report.problems] == ["bad_marker"] and result.rebuilt == [res.batch.marker]
    assert _trials(store) == ["t0", "t1", "t2"]
    tokens = L.query(store, "SELECT sum(tokens_in) AS n FROM model_calls").to_pylist()[0]["n"]
    assert tokens == 10 + 11 + 12
    assert check_lake(store).ok


def test_a_missing_file_names_itself_and_repair_takes_only_its_trial_out(store, tmp_path) -> None:
    marker = L.list_commits(store, sweep_id=SWEEP)
    victim = next(m for m in marker if m.get("trial_id") == "t2")
    lost = next(f["key"] for f in victim["files"] if f["table"] == "model_calls")
    store.delete([lost])
    with pytest.raises(LakeDamaged, match="lake repair") as err:
        L.query(store, "SELECT count(*) FROM model_calls")
    assert "\n" not in str(err.value)
    report = check_lake(store)
    assert [(p.kind, p.key) for p in report.problems] == [("missing_file", lost)]
    code, out = _lake_cli("repair", "--lake", str(tmp_path / "lake"))
    assert code == 0 and "quarantined" in out and "t2 of sweep sw-dmg is no longer committed" in out
    assert _trials(store) == ["t0", "t1"]
    assert L.query(store, "SELECT count(*) AS n FROM model_calls").to_pylist()[0]["n"] == 2
    assert store.get("_damaged/" + victim["marker"]) is not None
    assert check_lake(store).ok and not L.committed_trials(store, SWEEP) & {"t2"}


def test_a_truncated_batch_file_is_dropped_and_the_rest_serves(store) -> None:
    res = L.compact(store, sweep_id=SWEEP)
    assert res.batch is not None
    calls_file = next(f["key"] for f in res.batch.files if f["table"] == "model_calls")
    data = store.get(calls_file)
    store.put(calls_file, data[: len(data) // 2])
    with pytest.raises(LakeDamaged):
        L.query(store, "SELECT count(*) FROM model_calls")
    report, result = repair_lake(store)
    assert [p.kind for p in report.problems] == ["damaged_file"] and result.rewritten == [res.batch.marker]
    assert _trials(store) == ["t0", "t1", "t2"]  # the trials table still serves
    assert L.query(store, "SELECT count(*) AS n FROM model_calls").to_pylist()[0]["n"] == 0
    assert check_lake(store).ok


def test_repair_of_a_sound_lake_changes_nothing(store) -> None:
    before = {k: store.get(k) for k in store.list("")}
    report, result = repair_lake(store)
    assert report.ok and result.lines() == []
    assert {k: store.get(k) for k in store.list("")} == before


def test_a_repaired_trial_is_committed_again_by_its_sweep_without_the_agent(tmp_path, monkeypatch) -> None:
    """The whole path: a sweep's trial loses a file, `lake repair` takes it out, and the next run of
    the sweep commits it again from its stage checkpoints (the oracle is not run again)."""
    from shared_data import oracle_sweep_spec

    from saasbench.agents.oracle import OracleAgent
    from saasbench.runs import sweep as sw

    trial = "timetrack.oracle.none.0"
    spec = oracle_sweep_spec(tmp_path, "s-repair", compact=False)
    assert sw.run_sweep_plain(spec) == {trial: "completed"}
    store = L.lake_from_uri(spec.lake_uri)
    before = L.query(store, "SELECT node_id, status FROM node_results ORDER BY node_id").to_pylist()
    marker = next(m for m in L.list_commits(store, sweep_id="s-repair") if m.get("trial_id") == trial)
    store.delete([next(f["key"] for f in marker["files"] if f["table"] == "node_results")])
    with pytest.raises(LakeDamaged):
        L.query(store, "SELECT count(*) FROM node_results")

    code, out = _lake_cli("repair", "--lake", spec.lake_uri)
    assert code == 0 and "seeded its stages from its frozen end state" in out, out
    runs: list[str] = []
    monkeypatch.setattr(OracleAgent, "run", lambda self, *a: runs.append("ran") or pytest.fail("agent re-run"))
    assert sw.run_sweep_plain(spec) == {trial: "completed"}
    assert runs == []
    assert L.query(store, "SELECT node_id, status FROM node_results ORDER BY node_id").to_pylist() == before
    assert check_lake(store).ok
