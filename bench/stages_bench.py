"""What splitting the trial into stages costs: one oracle trial of the demo task three ways.

- ``single``: ``run_local_trial`` (rollout and evaluation in one environment, nothing persisted: the
  shape of the former single ``run-trial`` task, still used by validate-reference);
- ``stages``: ``saasbench.runs.sweep.run_trial`` without Prefect (every stage, its checkpoints in a
  local lake, the freeze, the commit);
- ``prefect``: the same stages as Prefect tasks (``flows.trial.trial_flow``) on a temporary server.

    .venv/bin/python bench/stages_bench.py --repeats 3 --json bench/results/stages.json

Medians are printed; ``stages - single`` is the split's cost (freeze, checkpoints, end-state records,
lake commit), ``prefect - stages`` the cost of running the stages as Prefect tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def spec(lake: str, sweep_id: str):
    from saasbench.runs.sweep import SweepSpec

    return SweepSpec(sweep_id=sweep_id, tasks=["timetrack"], agents=["oracle"], lake=lake, retry_delays=[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from saasbench.catalog.tasks import load_task
    from saasbench.runs import sweep as sw
    from saasbench.runs.trial import run_local_trial

    task = load_task("timetrack")
    times: dict[str, list[float]] = {"single": [], "stages": [], "prefect": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            t0 = time.perf_counter()
            r = run_local_trial(task, "oracle")
            times["single"].append(time.perf_counter() - t0)
            assert r.report.summary.deterministic_score == 100.0
            s = spec(f"{tmp}/lake-{i}", f"bench-{i}")
            t0 = time.perf_counter()
            assert sw.run_trial(sw.plan(s)[0], s) == "completed"
            times["stages"].append(time.perf_counter() - t0)
        from prefect.testing.utilities import prefect_test_harness

        from saasbench.flows.trial import trial_flow

        with prefect_test_harness(server_startup_timeout=90):
            for i in range(args.repeats):
                s = spec(f"{tmp}/plake-{i}", f"pbench-{i}")
                t0 = time.perf_counter()
                out = trial_flow(task="timetrack", agent="oracle", sweep=s.model_dump(mode="json"))
                times["prefect"].append(time.perf_counter() - t0)
                assert out == "completed"
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    result = {
        "repeats": args.repeats,
        "seconds": times,
        "median_s": med,
        "split_cost_s": round(med["stages"] - med["single"], 2),
        "prefect_cost_s": round(med["prefect"] - med["stages"], 2),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
