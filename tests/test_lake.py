"""The results lake on a local folder and on a real S3 endpoint (moto_server subprocess).

A trial is built from a real RunReport (a small DAG run by the engine against a workspace, with
a stubbed LLM judge so judge_calls are real JudgeCall records), written, and read back through
DuckDB. Then: idempotency, crashes mid-write (a raising hook and a SIGKILLed writer process),
hostile strings as data, the CLI function, URIs and secrets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from saasbench import lake as L
from saasbench.lake import schema as S
from saasbench.lake.store import LocalStore, S3Store

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = [
    'it\'s "quoted" `back` \\ slash',
    "'); DROP TABLE trials; --",
    "\"; DELETE FROM node_results WHERE '1'='1",
    "unicode: ünïcødé — 日本語 — 🦆🔥 — \u202e RTL \u0000 nul \x1b[31m ansi",
    "{{placeholder}} ${VAR} $1 ? %s :name",
    "x" * (1024 * 1024) + "'end",
]


# --- a real report -------------------------------------------------------------------------------
def _fake_completion(**kwargs: Any) -> Any:
    msg = SimpleNamespace(content='{"score": 4, "reasoning": "decent; it\'s fine"}')
    return SimpleNamespace(
        choices=[SimpleNamespace(message=msg)], usage=SimpleNamespace(prompt_tokens=120, completion_tokens=12)
    )


def run_real_report(workspace: Path) -> tuple[Any, list[Any]]:
    """A RunReport from the engine: PASSED, FAILED, SKIPPED_DEPENDENCY and an llm-judge node."""
    from saasbench.dag import load_dag_data
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.evaluation.engine import Engine
    from saasbench.primitives import judge as p17
    from saasbench.primitives.registry import REGISTRY
    from saasbench.services.judge import Judge, JudgeConfig

    if REGISTRY.spec("P17").fn is not p17.llm_judge:
        REGISTRY.register("P17", p17.llm_judge, p17.P17Inputs, raw_fields=p17.RAW_FIELDS)
    (workspace / "src").mkdir(parents=True, exist_ok=True)
    (workspace / "README.md").write_text("# App\n")
    (workspace / "src" / "app.py").write_text("print('hi')\n")
    nodes = [
        {
            "id": "README_EXISTS",
            "steps": [{"type": "P01", "inputs": {"path": "README.md"}}],
            "scoring": {"category": "Deployment", "method": "binary", "maxScore": 5},
        },
        {
            "id": "LICENSE_EXISTS",
            "steps": [{"type": "P01", "inputs": {"path": "LICENSE"}}],
            "scoring": {"category": "Deployment", "subcategory": "legal", "method": "binary", "maxScore": 2},
        },
        {
            "id": "NEEDS_LICENSE",
            "prereqs": ["LICENSE_EXISTS"],
            "steps": [{"type": "P01", "inputs": {"path": "README.md"}}],
            "scoring": {"category": "Deployment", "method": "binary", "maxScore": 1},
        },
        {
            "id": "CODE_QUALITY",
            "prereqs": ["README_EXISTS"],
            "steps": [
                {
                    "type": "P17",
                    "inputs": {
                        "rubric_prompt": "Score 0-5.",
                        "score_range": [0, 5],
                        "files_to_sample": ["src"],
                        "rubric_id": "R1",
                    },
                }
            ],
            "scoring": {"category": "ArchitectureQuality", "method": "llm-judge", "maxScore": 10},
        },
    ]
    dag = load_dag_data({"meta": {"task_id": "lake-test"}, "nodes": nodes}, source="<lake test>").dag
    ctx = RunContext(Target(workspace=workspace, task_id="lake-test"), options=RunOptions(judge_enabled=True))
    judge = Judge(
        JudgeConfig(model="openai/fake", api_base="http://127.0.0.1:9/v1", retries=0), completion=_fake_completion
    )
    ctx.judge = judge
    report = Engine(dag, ctx).run()
    return report, list(judge.calls)


def make_trajectory() -> Any:
    from saasbench.agents.base import Trajectory

    t = Trajectory(agent="oracle", version="1.2", model="fake/model")
    t.event("message", "I will write the app", role="assistant", tokens_in=10, tokens_out=5)
    t.event("tool_call", "write README.md", tool="write_file", path="README.md")
    t.event("tool_result", "y" * (S.CONTENT_CAP + 10), tool="write_file")
    t.steps, t.tokens_in, t.tokens_out, t.cost_usd = 3, 1000, 200, 0.0123
    return t.finish("completed")


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, Any]:
    ws = tmp_path_factory.mktemp("ws")
    report, calls = run_real_report(ws)
    return {"report": report, "calls": calls, "trajectory": make_trajectory()}


def rows_for(
    real: dict[str, Any],
    *,
    sweep: str = "sw-1",
    trial: str = "tr-1",
    task: str = "lake-test",
    messages: dict[str, str] | None = None,
    with_traj: bool = True,
    attempt: int = 0,
) -> L.TrialRows:
    report = real["report"].model_copy(deep=True)
    for n in report.nodes:
        if messages and n.id in messages:
            n.message = messages[n.id]
    info = L.TrialInfo(
        sweep_id=sweep,
        trial_id=trial,
        task_id=task,
        agent="oracle",
        model="fake/model",
        attempt=attempt,
        category="backend",
        domain="CG",
        complexity_tier="T2",
        started_at="2026-12-02T10:00:00+00:00",
        ended_at="2026-12-02T10:05:30+00:00",
        app_ok=True,
    )
    return L.trial_rows(
        info,
        report,
        trajectory=real["trajectory"] if with_traj else None,
        judge_calls=real["calls"],
        env_builds=[
            {
                "service": "app",
                "backend": "local",
                "image_tag": "sb/app:abc",
                "cache_hit": True,
                "ok": True,
                "duration_s": 0.1,
                "started_at": "2026-12-02T09:59:00Z",
            }
        ],
    )


# --- lakes: a folder and S3 ----------------------------------------------------------------------
@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path) -> L.Store:
    if request.param == "local":
        return L.lake_from_uri(str(tmp_path / "lake"))
    server = request.getfixturevalue("s3_server")
    return L.lake_from_uri(
        server.uri(f"t/{request.node.name.replace('[', '_').replace(']', '')}"), endpoint_url=server.endpoint_url
    )


def _counts(lake: L.Store) -> dict[str, int]:
    con = L.connect(lake)
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in S.TABLES}


# --- schema ----------------------------------------------------------------------------------------
def test_schema_has_the_issue_columns():
    want = {
        "sweeps": {"sweep_id", "created_at", "config_json"},
        "trials": {
            "sweep_id",
            "trial_id",
            "task_id",
            "domain",
            "agent",
            "model",
            "attempt",
            "outcome",
            "started_at",
            "ended_at",
            "wall_s",
            "steps",
            "tokens_in",
            "tokens_out",
            "cost_usd",
            "task_score",
            "deterministic_score",
            "node_coverage",
            "max_score",
            "skipped_llm_max_score",
            "compat",
            "harness_version",
        },
        "node_results": {
            "sweep_id",
            "trial_id",
            "task_id",
            "agent",
            "model",
            "attempt",
            "node_id",
            "category",
            "subcategory",
            "method",
            "complexity_tier",
            "status",
            "score",
            "max_score",
            "duration_ms",
            "message",
        },
        "step_results": {"node_id", "step_index", "code", "passed", "error", "duration_ms", "message", "evidence_json"},
        "trajectory_events": {"trial_id", "seq", "ts", "kind", "role", "content", "tool", "tokens_in", "tokens_out"},
        "reference_validations": {"task_id", "run_id", "node_id", "repeats", "passed", "pass_rate", "verdict"},
        "judge_calls": {"trial_id", "judge_model", "prompt_hash", "raw_reply", "score"},
        "env_builds": {"task_id", "image_tag", "cache_hit"},
        "model_calls": {
            "trial_id",
            "model_group",
            "status",
            "tokens_in",
            "tokens_out",
            "cost_usd",
            "latency_ms",
            "attempts",
            "error_class",
        },
        "node_rollups": {"trial_id", "kind", "key", "nodes", "score", "max_score", "passed", "skipped_llm"},
        "end_states": {
            "sweep_id",
            "trial_id",
            "task_id",
            "manifest_key",
            "backend",
            "total_bytes",
            "components_json",
            "freeze_s",
            "created_at",
        },
    }
    assert set(S.TABLES) == set(want)
    for name, cols in want.items():
        assert cols <= set(S.table(name).columns), (name, cols - set(S.table(name).columns))
    assert S.SCHEMA_VERSION >= 1 and set(S.OUTCOMES) == set(S.AGENT_OUTCOMES) | set(S.INFRA_OUTCOMES)


@pytest.mark.parametrize("bad", ["", "a/b", "..", "../x", "a b", "x'y", "-lead", "é", "a" * 201])
def test_ids_must_be_path_safe(bad):
    with pytest.raises(ValueError):
        S.check_id(bad)


def test_empty_lake_has_typed_views(tmp_path):
    con = L.connect(str(tmp_path / "nothing-here"))
    for name, t in S.TABLES.items():
        desc = con.execute(f"DESCRIBE {name}").fetchall()
        assert [r[0] for r in desc] == t.columns
        assert [r[1] for r in desc] == [S.duckdb_type(f.type) for f in t.schema]
        assert con.execute(f"SELECT count(*) FROM {name}").fetchone()[0] == 0


# --- write + read ------------------------------------------------------------------------------------
def test_write_and_query_a_real_trial(lake, real):
    report = real["report"]
    statuses = {n.id: n.status.value for n in report.nodes}
    assert statuses == {
        "README_EXISTS": "PASSED",
        "LICENSE_EXISTS": "FAILED",
        "NEEDS_LICENSE": "SKIPPED_DEPENDENCY",
        "CODE_QUALITY": "PASSED",
    }
    assert real["calls"], "the judge stub was called"

    L.write_sweep(
        lake,
        L.sweep_row(
            "sw-1",
            name="test sweep",
            config={"agents": ["oracle"], "judge": {"api_key": "sk-LEAK"}},
            tasks=["lake-test"],
            agents=["oracle"],
            models=["fake/model"],
            attempts=1,
        ),
    )
    commit = L.write_trial(lake, rows_for(real))
    assert commit.rows("node_results") == 4 and commit.rows("trials") == 1

    con = L.connect(lake)
    trial = con.execute("SELECT * FROM trials").to_arrow_table().to_pylist()
    assert len(trial) == 1
    t = trial[0]
    assert (t["sweep_id"], t["trial_id"], t["task_id"], t["agent"], t["model"], t["attempt"]) == (
        "sw-1",
        "tr-1",
        "lake-test",
        "oracle",
        "fake/model",
        0,
    )
    assert t["outcome"] == "completed" and t["valid"] is True
    assert t["task_score"] == pytest.approx(report.summary.task_score)
    assert t["deterministic_score"] == pytest.approx(report.summary.deterministic_score)
    assert t["max_score"] == report.summary.max_score and t["wall_s"] == 330.0
    assert (t["steps"], t["tokens_in"], t["tokens_out"], t["cost_usd"]) == (3, 1000, 200, 0.0123)
    assert t["judge_tokens_in"] == 120 and t["passed_nodes"] == 2 and t["skipped_dependency_nodes"] == 1
    assert t["started_at"].isoformat() == "2026-12-02T10:00:00+00:00"

    got = dict(con.execute("SELECT node_id, status FROM node_results").fetchall())
    assert got == statuses
    assert con.execute("SELECT score FROM node_results WHERE node_id = 'CODE_QUALITY'").fetchone()[0] == 8.0
    steps = con.execute("SELECT node_id, step_index, code, passed FROM step_results ORDER BY node_id").fetchall()
    assert ("README_EXISTS", 0, "P01", True) in steps and any(s[2] == "P17" for s in steps)
    jc = con.execute("SELECT judge_model, score, rubric_id, tokens_in, raw_reply FROM judge_calls").fetchall()
    assert jc == [("openai/fake", 4.0, "R1", 120, '{"score": 4, "reasoning": "decent; it\'s fine"}')]
    ev = con.execute(
        "SELECT seq, kind, role, tool, truncated, content_chars, length(content) FROM trajectory_events ORDER BY seq"
    ).fetchall()
    assert ev[0][:4] == (0, "message", "assistant", None) and ev[1][3] == "write_file"
    assert ev[2][4] is True and ev[2][5] == S.CONTENT_CAP + 10 and ev[2][6] == S.CONTENT_CAP
    assert con.execute("SELECT image_tag, cache_hit FROM env_builds").fetchall() == [("sb/app:abc", True)]
    sweep = con.execute("SELECT name, config_json, tasks FROM sweeps").fetchone()
    assert sweep[0] == "test sweep" and "sk-LEAK" not in sweep[1] and sweep[2] == ["lake-test"]
    # partitions: one-sweep and one-task layouts
    keys = [f["key"] for f in commit.files]
    assert all(k.split("/")[1:3] == ["sweep_id=sw-1", "task_id=lake-test"] for k in keys)
    assert con.execute("SELECT unit, trial_id, rows FROM commits WHERE unit = 'trial'").fetchall() == [
        ("trial", "tr-1", sum(f["rows"] for f in commit.files))
    ]
    # query() with parameters
    tbl = L.query(
        lake,
        "SELECT count(*) AS n FROM node_results WHERE status = ? AND sweep_id = $1".replace("$1", "?"),
        ["PASSED", "sw-1"],
    )
    assert tbl.to_pylist() == [{"n": 2}]
    assert L.committed_trials(lake, "sw-1") == {"tr-1"} and L.is_committed(lake, "sw-1", "tr-1")


def test_sweep_filter_and_many_trials(lake, real):
    for sweep in ("a", "b"):
        for i in range(3):
            L.write_trial(lake, rows_for(real, sweep=sweep, trial=f"t{i}", task=f"task{i % 2}", with_traj=False))
    assert L.query(lake, "SELECT count(*) AS n FROM trials").to_pylist() == [{"n": 6}]
    con = L.connect(lake, sweep_id="b")
    assert con.execute("SELECT DISTINCT sweep_id FROM node_results").fetchall() == [("b",)]
    assert con.execute("SELECT count(*) FROM trials").fetchone()[0] == 3
    by_task = dict(con.execute("SELECT task_id, count(*) FROM trials GROUP BY 1").fetchall())
    assert by_task == {"task0": 2, "task1": 1}


def test_ids_that_look_like_numbers_stay_strings(tmp_path, real):
    store = L.lake_from_uri(str(tmp_path / "lake"))
    L.write_trial(store, rows_for(real, sweep="001", trial="002", task="003", with_traj=False))
    assert L.query(store, "SELECT sweep_id, trial_id, task_id FROM trials").to_pylist() == [
        {"sweep_id": "001", "trial_id": "002", "task_id": "003"}
    ]


def test_validation_rows(lake):
    from saasbench.runs.validate import NodeValidation, ValidationReport

    rep = ValidationReport(
        task_id="lake-test",
        dag="dag.json",
        repeats=3,
        started_at="2026-12-02T09:00:00+00:00",
        elapsed_s=1.0,
        repeat_records=[],
        flaky=["B"],
        quarantine=["B"],
        always_failing=[],
        skipped_llm=[],
        out_dir="/tmp/x",
        quarantine_path="/tmp/x/q",
        nodes=[
            NodeValidation(
                id="A",
                category="C",
                method="binary",
                max_score=1,
                statuses=["PASSED"] * 3,
                passed=3,
                counted=3,
                pass_rate=1.0,
                verdict="pass",
            ),
            NodeValidation(
                id="B",
                category="C",
                method="binary",
                max_score=2,
                statuses=["PASSED", "FAILED", "PASSED"],
                passed=2,
                counted=3,
                pass_rate=2 / 3,
                verdict="flaky",
                flaky_cause="own",
                last_message="it's flaky",
            ),
        ],
    )
    L.write_validation(lake, "lake-test", "run-1", L.validation_rows(rep, "run-1"))
    L.write_validation(lake, "lake-test", "run-1", L.validation_rows(rep, "run-1"))
    got = L.query(
        lake, "SELECT node_id, repeats, passed, verdict, statuses FROM reference_validations ORDER BY node_id"
    )
    assert got.to_pylist() == [
        {"node_id": "A", "repeats": 3, "passed": 3, "verdict": "pass", "statuses": ["PASSED"] * 3},
        {"node_id": "B", "repeats": 3, "passed": 2, "verdict": "flaky", "statuses": ["PASSED", "FAILED", "PASSED"]},
    ]


# --- idempotency ---------------------------------------------------------------------------------------
def test_write_twice_leaves_one_copy(lake, real):
    c1 = L.write_trial(lake, rows_for(real))
    before = _counts(lake)
    objects = lake.list("")
    c2 = L.write_trial(lake, rows_for(real))
    assert c2.generation == c1.generation and [f["key"] for f in c2.files] == [f["key"] for f in c1.files]
    assert _counts(lake) == before and lake.list("") == objects
    assert before["trials"] == 1 and before["node_results"] == 4

    # a rewrite with other rows (a re-run): replaced, not appended; a table it no longer has is gone
    c3 = L.write_trial(lake, rows_for(real, with_traj=False, messages={"README_EXISTS": "second run"}))
    assert c3.generation != c1.generation
    after = _counts(lake)
    assert after["trials"] == 1 and after["node_results"] == 4 and after["trajectory_events"] == 0
    assert L.query(lake, "SELECT message FROM node_results WHERE node_id = 'README_EXISTS'").to_pylist() == [
        {"message": "second run"}
    ]
    # the superseded files stay until they are old (a concurrent writer's files look the same), and
    # are never read: vacuum collects them
    parts = {k for k in lake.list("") if k.endswith(".parquet")}
    assert parts == {f["key"] for f in c3.files + c1.files} and c3.deleted == []
    assert set(L.vacuum(lake, older_than_s=0)) == {f["key"] for f in c1.files}
    assert {k for k in lake.list("") if k.endswith(".parquet")} == {f["key"] for f in c3.files}


def test_two_writers_of_one_trial_at_once_leave_every_listed_file(lake, real):
    """The same sweep run twice at once: writer A has put its files and not yet its marker when
    writer B commits the same trial with other rows. B's clean-up used to delete A's files, and A's
    marker then listed missing files (issue #17: every query of the lake failed)."""
    import threading

    at_marker, go_on = threading.Event(), threading.Event()

    def pause(event: str, key: str) -> None:
        if event == "before_marker":
            at_marker.set()
            assert go_on.wait(30)

    errors: list[BaseException] = []

    def writer_a() -> None:
        try:
            L.write_trial(lake, rows_for(real, messages={"README_EXISTS": "run A"}), hook=pause)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    a = threading.Thread(target=writer_a)
    a.start()
    assert at_marker.wait(30)
    L.write_trial(lake, rows_for(real, messages={"README_EXISTS": "run B"}))  # B: files, marker, clean-up
    go_on.set()
    a.join(30)
    assert not errors
    from saasbench.lake.writer import read_marker, trial_marker_key

    marker = read_marker(lake, trial_marker_key("sw-1", "tr-1"))
    present = set(lake.list(""))
    assert all(f["key"] in present for f in marker["files"])  # A's marker won and its files are all there
    rows = L.query(lake, "SELECT message FROM node_results WHERE node_id = 'README_EXISTS'").to_pylist()
    assert rows == [{"message": "run A"}]


# --- crashes ---------------------------------------------------------------------------------------------
class Crash(Exception):
    pass


def _crash_at(event: str, nth: int = 1):
    seen = {"n": 0}

    def hook(ev: str, key: str) -> None:
        if ev == event:
            seen["n"] += 1
            if seen["n"] == nth:
                raise Crash(key)

    return hook


def test_crash_before_marker_of_a_new_trial_shows_nothing(lake, real):
    with pytest.raises(Crash):
        L.write_trial(lake, rows_for(real), hook=_crash_at("before_marker"))
    assert any(k.endswith(".parquet") for k in lake.list(""))  # the files are there ...
    assert all(v == 0 for v in _counts(lake).values())  # ... and invisible
    assert not L.is_committed(lake, "sw-1", "tr-1")
    # a later complete write cleans the orphans up
    c = L.write_trial(lake, rows_for(real))
    assert sorted(k for k in lake.list("") if k.endswith(".parquet")) == sorted(f["key"] for f in c.files)


def test_vacuum_removes_orphans_of_crashed_writes_only(lake, real):
    kept = L.write_trial(lake, rows_for(real, trial="kept"))
    with pytest.raises(Crash):
        L.write_trial(lake, rows_for(real, trial="crashed"), hook=_crash_at("before_marker"))

    def parts() -> list[str]:
        return sorted(k for k in lake.list("") if k.endswith(".parquet"))

    assert len(parts()) == 2 * len(kept.files)
    assert L.vacuum(lake) == []  # young orphans may belong to a write in flight
    orphans = L.vacuum(lake, older_than_s=0, dry_run=True)
    assert len(orphans) == len(kept.files) and all("part-crashed." in k for k in orphans)
    assert len(parts()) == 2 * len(kept.files)
    assert sorted(L.vacuum(lake, older_than_s=0)) == sorted(orphans)
    assert parts() == sorted(f["key"] for f in kept.files)
    assert _counts(lake)["trials"] == 1


@pytest.mark.parametrize("event,nth", [("before_file", 2), ("before_file", 4), ("before_marker", 1)])
def test_crash_mid_rewrite_keeps_the_old_trial(lake, real, event, nth):
    L.write_trial(lake, rows_for(real, messages={"README_EXISTS": "old"}))
    old = L.query(lake, "SELECT node_id, message FROM node_results ORDER BY node_id").to_pylist()
    old_counts = _counts(lake)
    with pytest.raises(Crash):
        L.write_trial(
            lake, rows_for(real, messages={"README_EXISTS": "new"}, with_traj=False), hook=_crash_at(event, nth)
        )
    assert L.query(lake, "SELECT node_id, message FROM node_results ORDER BY node_id").to_pylist() == old
    assert _counts(lake) == old_counts
    L.write_trial(lake, rows_for(real, messages={"README_EXISTS": "new"}, with_traj=False))
    assert L.query(lake, "SELECT message FROM node_results WHERE node_id = 'README_EXISTS'").to_pylist() == [
        {"message": "new"}
    ]
    assert _counts(lake)["trajectory_events"] == 0


WRITER_SCRIPT = textwrap.dedent("""
    import pickle, sys, time
    from saasbench import lake as L
    rows = pickle.load(open(sys.argv[1], "rb"))
    stop_at = int(sys.argv[2])
    store = L.lake_from_uri(sys.argv[3], endpoint_url=sys.argv[4] or None)
    n = {"files": 0}
    def hook(ev, key):
        if ev == "before_file":
            n["files"] += 1
            if n["files"] == stop_at:
                print("PAUSED", key, flush=True)
                time.sleep(60)   # killed here with SIGKILL
    L.write_trial(store, rows, hook=hook)
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("stop_at", [2, 5])
def test_sigkill_mid_write_shows_old_or_new_never_partial(lake, real, tmp_path, stop_at):
    import pickle

    L.write_trial(lake, rows_for(real, messages={"README_EXISTS": "old"}))
    old = _counts(lake), L.query(lake, "SELECT node_id, message FROM node_results ORDER BY 1").to_pylist()
    new_rows = rows_for(real, messages={"README_EXISTS": "new"}, with_traj=False)
    endpoint = "" if isinstance(lake, LocalStore) else lake.endpoint_url
    payload = tmp_path / "job.pkl"
    payload.write_bytes(pickle.dumps(new_rows))
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(payload), str(stop_at), lake.uri, endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("PAUSED"), (line, proc.stderr.read() if proc.poll() is not None else "")
        # the writer has put stop_at-1 new part files and is paused before the next: readers see the old trial
        assert (_counts(lake), L.query(lake, "SELECT node_id, message FROM node_results ORDER BY 1").to_pylist()) == old
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert (_counts(lake), L.query(lake, "SELECT node_id, message FROM node_results ORDER BY 1").to_pylist()) == old
    L.write_trial(lake, new_rows)
    assert L.query(lake, "SELECT message FROM node_results WHERE node_id = 'README_EXISTS'").to_pylist() == [
        {"message": "new"}
    ]


# --- hostile strings ---------------------------------------------------------------------------------
def test_hostile_messages_round_trip_as_data(lake, real):
    node_ids = [n.id for n in real["report"].nodes]
    hostile = HOSTILE[: len(node_ids)]
    L.write_trial(lake, rows_for(real, messages=dict(zip(node_ids, hostile))))
    big = HOSTILE[-1]
    L.write_trial(lake, rows_for(real, trial="tr-big", messages={node_ids[0]: big}))
    con = L.connect(lake)
    got = dict(con.execute("SELECT node_id, message FROM node_results WHERE trial_id = 'tr-1'").fetchall())
    assert [got[i] for i in node_ids] == hostile
    assert (
        con.execute(
            "SELECT message FROM node_results WHERE trial_id = 'tr-big' AND node_id = ?", [node_ids[0]]
        ).fetchone()[0]
        == big
    )
    for h in hostile:  # as a bound parameter it is a value, never SQL
        assert con.execute("SELECT count(*) FROM node_results WHERE message = ?", [h]).fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM trials").fetchone()[0] == 2  # nothing was dropped


def test_hostile_strings_in_every_text_column(tmp_path):
    store = L.lake_from_uri(str(tmp_path / "lake"))
    info = L.TrialInfo(
        sweep_id="s",
        trial_id="t",
        task_id="k",
        agent=HOSTILE[1],
        model=HOSTILE[3],
        outcome="agent_error",
        outcome_detail=HOSTILE[2],
        app_error=HOSTILE[0],
    )
    L.write_trial(store, L.trial_rows(info, None))
    row = L.query(store, "SELECT agent, model, outcome, outcome_detail, app_error, valid FROM trials").to_pylist()[0]
    assert row == {
        "agent": HOSTILE[1],
        "model": HOSTILE[3],
        "outcome": "agent_error",
        "outcome_detail": HOSTILE[2],
        "app_error": HOSTILE[0],
        "valid": True,
    }


# --- validation of input ----------------------------------------------------------------------------
def test_rows_are_checked(tmp_path, real):
    store = L.lake_from_uri(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="outcome"):
        L.TrialInfo(sweep_id="s", trial_id="t", task_id="k", agent="a", outcome="crashed")
    rows = rows_for(real)
    rows.tables["node_results"][0]["trial_id"] = "other"
    with pytest.raises(ValueError, match="trial_id"):
        L.write_trial(store, rows)
    rows = rows_for(real)
    rows.tables["trials"][0]["typo_column"] = 1
    with pytest.raises(ValueError, match="typo_column"):
        L.write_trial(store, rows)
    with pytest.raises(ValueError):
        L.write_trial(store, L.TrialRows("s", "../etc", "k", {}))
    assert store.list("") == []


def test_from_trial_result(tmp_path, real):
    from saasbench.catalog.tasks import TaskSpec
    from saasbench.runs.trial import TrialResult

    tr = TrialResult(
        agent="oracle",
        report=real["report"],
        trajectory=real["trajectory"],
        app_ok=False,
        app_error="port busy",
        app_log_tail="",
        workspace=str(tmp_path),
    )
    spec = TaskSpec(id="lake-test", category="backend", domain="PC", complexity_tier="T1")
    rows = L.from_trial_result(tr, sweep_id="s", trial_id="t", task=spec, attempt=2, judge_calls=real["calls"])
    store = L.lake_from_uri(str(tmp_path / "lake"))
    L.write_trial(store, rows)
    row = L.query(
        store, "SELECT domain, attempt, model, app_ok, app_error, exit_reason, agent_version FROM trials"
    ).to_pylist()[0]
    assert row == {
        "domain": "PC",
        "attempt": 2,
        "model": "fake/model",
        "app_ok": False,
        "app_error": "port busy",
        "exit_reason": "completed",
        "agent_version": "1.2",
    }


# --- CLI, URIs, secrets ------------------------------------------------------------------------------
def test_query_cmd_formats(tmp_path, real, capsys, monkeypatch):
    import io

    path = str(tmp_path / "lake")
    L.write_trial(path, rows_for(real, messages={"README_EXISTS": 'a,b "c" [red]x[/red]'}))
    out = io.StringIO()
    assert (
        L.query_cmd("SELECT node_id, message FROM node_results WHERE node_id = 'README_EXISTS'", path, "json", out=out)
        == 0
    )
    assert json.loads(out.getvalue()) == [{"node_id": "README_EXISTS", "message": 'a,b "c" [red]x[/red]'}]
    out = io.StringIO()
    assert (
        L.query_cmd("SELECT node_id, message FROM node_results WHERE node_id = 'README_EXISTS'", path, "csv", out=out)
        == 0
    )
    assert out.getvalue() == 'node_id,message\nREADME_EXISTS,"a,b ""c"" [red]x[/red]"\n'
    out = io.StringIO()
    assert L.query_cmd("SELECT node_id, message FROM node_results ORDER BY 1", path, "table", out=out) == 0
    assert "[red]x[/red]" in out.getvalue() and "4 row(s)" in out.getvalue()
    monkeypatch.setenv("SAASBENCH_LAKE", path)
    assert L.query_cmd("SELECT count(*) AS n FROM trials", format="json", out=(o := io.StringIO())) == 0
    assert json.loads(o.getvalue()) == [{"n": 1}]
    assert L.query_cmd("SELEC nonsense", path) == 1
    assert "query failed" in capsys.readouterr().err


def test_lake_from_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("SAASBENCH_LAKE", raising=False)
    for k in ("SAASBENCH_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    assert isinstance(L.lake_from_uri(str(tmp_path)), LocalStore)
    assert L.lake_from_uri(tmp_path.as_uri()).root == tmp_path.resolve()
    assert L.lake_from_uri(None).root == Path("runs/lake").resolve()
    monkeypatch.setenv("SAASBENCH_LAKE", str(tmp_path / "x"))
    assert L.lake_from_uri(None).root == (tmp_path / "x").resolve()
    s = L.lake_from_uri("s3://bkt/some/prefix/")
    assert isinstance(s, S3Store) and (s.bucket, s.prefix, s.endpoint_url) == ("bkt", "some/prefix", None)
    assert s.url("a/b.parquet") == "s3://bkt/some/prefix/a/b.parquet"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert L.lake_from_uri("s3://bkt").endpoint_url == "http://127.0.0.1:1"
    monkeypatch.setenv("SAASBENCH_S3_ENDPOINT", "http://127.0.0.1:2")
    assert L.lake_from_uri("s3://bkt").endpoint_url == "http://127.0.0.1:2"
    with pytest.raises(ValueError, match="credentials"):
        L.lake_from_uri("s3://AKIA:secret@bkt/x")
    with pytest.raises(ValueError):
        L.lake_from_uri("gs://bkt/x")


def test_secrets_stay_out_of_the_lake(s3_server, real, monkeypatch):
    secret = "SeCrEt-key-that-must-not-leak-42"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = L.lake_from_uri(s3_server.uri("secrets"), endpoint_url=s3_server.endpoint_url)
    assert secret not in repr(store) and secret not in store.uri
    L.write_sweep(
        store,
        L.sweep_row(
            "s",
            config={
                "judge": {"api_key": secret, "api_key_env": "JUDGE_KEY"},
                "db": {"password": secret},
                "note": "ok",
                "url": f"postgresql://bench:{secret}@db:5432/x",
            },
        ),
    )
    L.write_trial(store, rows_for(real, sweep="s"))
    con = L.connect(store)
    assert json.loads(con.execute("SELECT config_json FROM sweeps").fetchone()[0]) == {
        "judge": {"api_key": "***", "api_key_env": "JUDGE_KEY"},
        "db": {"password": "***"},
        "note": "ok",
        "url": "postgresql://bench:***@db:5432/x",
    }
    for key in store.list(""):
        assert secret.encode() not in store.get(key), key
    secrets = con.execute("SELECT * FROM duckdb_secrets()").to_arrow_table().to_pylist()
    assert secrets and all(secret not in str(s) for s in secrets)  # DuckDB redacts it


def test_s3_objects_are_where_the_layout_says(s3_server, real):
    store = L.lake_from_uri(s3_server.uri("layout"), endpoint_url=s3_server.endpoint_url)
    c = L.write_trial(store, rows_for(real))
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix="layout/")["Contents"]]
    assert "layout/_commits/sweep_id=sw-1/trial_id=tr-1.json" in keys
    assert f"layout/trials/sweep_id=sw-1/task_id=lake-test/part-tr-1.{c.generation}.parquet" in keys
    assert len(keys) == len(c.files) + 1


def test_gateway_metered_usage_wins_over_the_agents_own(tmp_path, real):
    """With model_calls (the gateway's meter), the trial row's tokens and cost are their sums; the
    agent's own figures (a list-price estimate for Claude behind a proxy) are not trusted."""
    info = L.TrialInfo(sweep_id="sg", trial_id="t", task_id="lake-test", agent="claude-code", model="m")
    calls = [
        {"status": "success", "prompt_tokens": 100, "completion_tokens": 10, "cost_usd": 0.25},
        {"status": "failure", "prompt_tokens": None, "completion_tokens": None, "cost_usd": None},
        {"status": "success", "prompt_tokens": 50, "completion_tokens": 5, "cost_usd": 0.5},
    ]
    rows = L.trial_rows(info, real["report"], trajectory=real["trajectory"], model_calls=calls)
    trial = rows.tables["trials"][0]
    assert (trial["tokens_in"], trial["tokens_out"], trial["cost_usd"]) == (150, 15, 0.75)
    plain = L.trial_rows(info, real["report"], trajectory=real["trajectory"]).tables["trials"][0]
    assert (plain["tokens_in"], plain["tokens_out"], plain["cost_usd"]) == (1000, 200, 0.0123)


def test_connect_pauses_garbage_collection_and_restores_it(tmp_path, monkeypatch):
    """connect parses every commit marker (10,000 dicts for a 10,000-trial batch) with the cyclic
    collector off, and leaves the collector as it found it, also when it fails."""
    import gc
    import sys as _sys

    q = _sys.modules["saasbench.lake.query"]
    seen: list[bool] = []
    real_snapshot = q.snapshot
    monkeypatch.setattr(q, "snapshot", lambda *a, **k: seen.append(gc.isenabled()) or real_snapshot(*a, **k))
    assert gc.isenabled()
    L.connect(str(tmp_path / "lake")).close()
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(q, "snapshot", lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        L.connect(str(tmp_path / "lake"))
    assert gc.isenabled()
    gc.disable()
    try:  # nested inside a caller's pause: stays off
        monkeypatch.setattr(q, "snapshot", real_snapshot)
        L.connect(str(tmp_path / "lake")).close()
        assert not gc.isenabled()
    finally:
        gc.enable()


# the columns of every table, per SCHEMA_VERSION: a change of columns without a version bump fails here
SCHEMA_FINGERPRINTS = {2: "e45aa1f669e3e307"}


def test_a_change_of_columns_bumps_the_schema_version() -> None:
    """Readers read one footer per schema version: files of one version must have the same columns, or
    a lake holding files from before and after the change cannot be queried ("schema mismatch in glob").
    Changed a table's columns? Bump SCHEMA_VERSION, note it in the schema docstring, add the new
    fingerprint here."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(S.TABLES.items()):
        for f in t.schema:
            h.update(f"{name}.{f.name}:{f.type};".encode())
    assert SCHEMA_FINGERPRINTS.get(S.SCHEMA_VERSION) == h.hexdigest()[:16], "bump SCHEMA_VERSION (see the docstring)"
