"""The same sweep id run twice at once leaves a readable, complete lake (issue #17 item 2).

Before: 2 of 3 tries corrupted the lake (one run's commit deleted the other's new files, a marker
then listed missing files and every query failed). Two real sweep processes, same spec, same lake,
started together; both write every trial, the sweep row and a compaction.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from shared_data import oracle_sweep_spec

from saasbench import lake as lakelib
from saasbench.lake.check import check_lake
from saasbench.runs import sweep as sw

REPO = Path(__file__).resolve().parents[1]


def test_two_runs_of_one_sweep_at_once_leave_a_sound_complete_lake(tmp_path):
    spec = oracle_sweep_spec(tmp_path, "s-twice", attempts=3)
    script = textwrap.dedent("""
        import json, sys
        from saasbench.runs import sweep
        spec = sweep.SweepSpec.model_validate(json.loads(sys.argv[1]))
        sweep.run_sweep_plain(spec, 2)
    """)
    arg = json.dumps(spec.model_dump(mode="json"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, arg], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    store = lakelib.lake_from_uri(spec.lake_uri)
    report = check_lake(store)
    assert report.ok, [p.line() for p in report.problems]
    rows = lakelib.query(store, "SELECT trial_id, outcome FROM trials ORDER BY trial_id", sweep_id="s-twice")
    trials = [r["trial_id"] for r in rows.to_pylist()]
    assert trials == sorted(t.trial_id for t in sw.plan(spec))
    assert {r["outcome"] for r in rows.to_pylist()} == {"completed"}
    nodes = lakelib.query(
        store, "SELECT trial_id, count(*) AS n FROM node_results GROUP BY trial_id", sweep_id="s-twice"
    )
    counts = {r["n"] for r in nodes.to_pylist()}
    assert len(nodes) == 3 and len(counts) == 1  # every trial's nodes once, none doubled
    assert lakelib.query(store, "SELECT count(*) AS n FROM sweeps WHERE sweep_id = 's-twice'").to_pylist() == [{"n": 1}]
