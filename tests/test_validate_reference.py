"""validate_reference on a fixture task: stable, flaky (own and via prerequisite), always failing."""

from __future__ import annotations

import json
from pathlib import Path

from test_environment_local import make_task

from saasbench.runs.validate import _classify, validate_reference


def flaky_install(counter: Path) -> str:
    """Writes state.txt = ok on odd repeats, bad on even ones (the counter lives outside the workspace)."""
    return (
        f"n=$(cat '{counter}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{counter}'; "
        "if [ $((n % 2)) -eq 1 ]; then echo ok > state.txt; else echo bad > state.txt; fi"
    )


def test_validate_reference_reports_flaky_and_writes_quarantine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SAASBENCH_LOCAL_SANDBOX", "off")  # the flaky install keeps its counter on the host
    extra = [
        {
            "id": "FLAKY_STATE",
            "prereqs": [],
            "steps": [{"type": "P02", "inputs": {"path": "state.txt", "pattern": "ok"}}],
            "scoring": {"category": "Fixture", "method": "binary", "maxScore": 1},
        },
        {
            "id": "AFTER_FLAKY",
            "prereqs": ["FLAKY_STATE"],
            "steps": [{"type": "P01", "inputs": {"path": "run.sh"}}],
            "scoring": {"category": "Fixture", "method": "binary", "maxScore": 1},
        },
        {
            "id": "NEVER",
            "prereqs": [],
            "steps": [{"type": "P01", "inputs": {"path": "missing.txt"}}],
            "scoring": {"category": "Fixture", "method": "binary", "maxScore": 1},
        },
    ]
    task = make_task(tmp_path / "tasks", install=[flaky_install(tmp_path / "counter")], extra_nodes=extra)
    seen: list[str] = []
    out = tmp_path / "out"
    report = validate_reference(task, repeats=3, out_dir=out, progress=lambda i, m: seen.append(m))

    verdicts = {n.id: n for n in report.nodes}
    for stable in ("HEALTH", "LOGIN", "RUN_SCRIPT", "DB_FILE", "APP_LOG"):
        assert verdicts[stable].verdict == "pass", (stable, verdicts[stable])
        assert verdicts[stable].pass_rate == 1.0
    assert verdicts["FLAKY_STATE"].verdict == "flaky" and verdicts["FLAKY_STATE"].flaky_cause == "own"
    assert verdicts["FLAKY_STATE"].statuses == ["PASSED", "FAILED", "PASSED"]
    assert verdicts["FLAKY_STATE"].pass_rate == round(2 / 3, 4)
    assert verdicts["AFTER_FLAKY"].verdict == "flaky" and verdicts["AFTER_FLAKY"].flaky_cause == "prerequisite"
    assert verdicts["NEVER"].verdict == "always_failing" and "missing.txt" in verdicts["NEVER"].last_message
    assert report.flaky == ["FLAKY_STATE", "AFTER_FLAKY"]
    assert report.quarantine == ["FLAKY_STATE"] and report.always_failing == ["NEVER"] and report.skipped_llm == []
    assert all(r.app_ok and r.oracle_exit_reason == "completed" for r in report.repeat_records)

    q_lines = (out / "quarantine.txt").read_text().splitlines()
    assert q_lines[0].startswith("# Quarantine for task fixture")
    assert [ln for ln in q_lines if not ln.startswith("#")] == ["FLAKY_STATE"]
    assert any("AFTER_FLAKY" in ln for ln in q_lines if ln.startswith("#"))
    data = json.loads((out / "validation.json").read_text())
    assert data["task_id"] == "fixture" and data["repeats"] == 3 and data["quarantine"] == ["FLAKY_STATE"]
    for i in (1, 2, 3):
        assert (out / f"repeat-{i}" / "report.json").is_file() and (out / f"repeat-{i}" / "trajectory.json").is_file()
    assert any("HEALTH PASSED" in m for m in seen)


def test_quarantine_file_is_read_by_evaluate_format(tmp_path: Path) -> None:
    """The quarantine file is the format `saasbench evaluate --quarantine` reads."""
    from saasbench.cli.evaluate import _read_quarantine

    path = tmp_path / "q.txt"
    path.write_text("# header\n# Flaky only through a flaky prerequisite (not listed): X\nA\nB\n")
    assert _read_quarantine(path) == {"A", "B"}


def test_validate_reference_app_down_is_recorded(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", install=["rm run.sh"], health_s=3)
    report = validate_reference(task, repeats=1, out_dir=tmp_path / "out")
    rec = report.repeat_records[0]
    assert not rec.app_ok and "exited with code" in rec.app_error
    assert {n.id: n.verdict for n in report.nodes}["HEALTH"] == "always_failing"


def test_classify() -> None:
    assert _classify(["SKIPPED_LLM", "SKIPPED_LLM"])[2] == "skipped_llm"
    assert _classify(["PASSED", "SKIPPED_LLM"])[:3] == (1, 1, "pass")
    assert _classify(["PASSED", "ERROR"])[2:] == ("flaky", "own")
    assert _classify(["PASSED", "SKIPPED_DEPENDENCY"])[2:] == ("flaky", "prerequisite")
    assert _classify(["FAILED", "FAILED"])[2] == "always_failing"


def test_timetrack_reference_is_stable_over_three_repeats(tmp_path):
    """The issue's gate: the bundled demo task's reference has no flaky and no failing node."""
    from saasbench.catalog.tasks import load_task
    from saasbench.runs.validate import validate_reference

    report = validate_reference(load_task("timetrack"), repeats=3, out_dir=tmp_path / "v")
    assert report.flaky == [] and report.always_failing == []
    assert all(r.app_ok for r in report.repeat_records)
    assert all(r.task_score == 100.0 for r in report.repeat_records)
    quarantine = (tmp_path / "v" / "quarantine.txt").read_text().splitlines()
    assert [line for line in quarantine if line and not line.startswith("#")] == []
