"""The saasbench command line: exit codes, summaries, and the report an evaluation writes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from saasbench.cli.main import app

runner = CliRunner()
WIDE = {"COLUMNS": "220", "NO_COLOR": "1", "TERM": "dumb"}


def invoke(*args: Any):
    return runner.invoke(app, [str(a) for a in args], env=WIDE)


def node(
    node_id: str,
    steps: list[dict[str, Any]],
    *,
    category: str = "Deployment",
    method: str = "binary",
    max_score: float = 1,
    prereqs: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": prereqs or [],
        "steps": steps,
        "scoring": {"category": category, "method": method, "maxScore": max_score},
        **extra,
    }


def write_dag(path: Path, nodes: list[dict[str, Any]], **meta: Any) -> Path:
    path.write_text(json.dumps({"meta": meta, "nodes": nodes}))
    return path


@pytest.fixture
def valid_dag(tmp_path: Path) -> Path:
    return write_dag(
        tmp_path / "dag.json",
        [
            node(
                "LOGIN",
                [{"type": "P13", "inputs": {"role": "admin"}}],
                category="Authentication",
                max_score=5,
                prereqs=["README"],
            ),
            node(
                "README",
                [
                    {"type": "P01", "inputs": {"path": "README.md"}},
                    {"type": "P02", "inputs": {"path": "README.md", "pattern": "hello"}},
                ],
                method="weighted",
                max_score=3,
            ),
            node(
                "NEEDS_LOGIN",
                [{"type": "P01", "inputs": {"path": "README.md"}}],
                category="Authentication",
                max_score=2,
                prereqs=["LOGIN"],
            ),
            node(
                "LOGOUT",
                [{"type": "P01", "inputs": {"path": "README.md"}}],
                category="Authentication",
                max_score=0,
                run_last=True,
            ),
            node("LEGACY", [{"primitive": "P03", "inputs": {"pattern": "*.md"}}], method="llm_judge", max_score=0),
        ],
        task_id="task_demo",
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "README.md").write_text("hello world\n")
    return ws


@pytest.fixture
def auth_profile(tmp_path: Path) -> Path:
    path = tmp_path / "auth.yaml"
    path.write_text(
        "scheme: bearer\n"
        "login: {path: /api/login, body: {username: '{{username}}', password: '{{password}}'}}\n"
        "users: {admin: {username: admin, password: pw}}\n"
    )
    return path


@pytest.fixture
def dead_url() -> str:
    """A local URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- help and version ------------------------------------------------------------------------------
def test_help_lists_commands() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("dag", "evaluate", "primitives", "demo", "version"):
        assert command in result.output


@pytest.mark.parametrize(
    "args", [["dag", "check"], ["dag", "plan"], ["evaluate"], ["primitives", "list"], ["demo"], ["version"]]
)
def test_every_command_has_help_with_an_example(args: list[str]) -> None:
    result = invoke(*args, "--help")
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


def test_console_script_help_is_light() -> None:
    """`saasbench --help` works as a process and loads neither httpx nor the engine."""
    code = (
        "import sys; from saasbench.cli.main import main; sys.argv = ['saasbench', '--help']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = [m for m in ('httpx', 'saasbench.evaluation.engine', 'saasbench.dag', 'saasbench.primitives.files') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **WIDE}
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "evaluate" in out.stdout


def test_version() -> None:
    from saasbench import __version__

    result = invoke("version")
    assert result.exit_code == 0 and __version__ in result.output


# --- dag check / plan ------------------------------------------------------------------------------
def test_dag_check_valid(valid_dag: Path) -> None:
    result = invoke("dag", "check", valid_dag)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "nodes 5" in out and "maxScore 10" in out
    assert "binary 3" in out and "weighted 1" in out and "llm-judge 1" in out
    assert "P01 3" in out and "categories 2" in out
    assert "normalisations 3" in out  # step key primitive -> type, llm_judge -> llm-judge, P03 pattern -> glob
    verbose = invoke("dag", "check", valid_dag, "--verbose")
    assert "legacy step key 'primitive' -> 'type'" in verbose.output
    assert "'pattern' -> 'glob'" in verbose.output


def test_dag_check_json(valid_dag: Path) -> None:
    result = invoke("dag", "check", valid_dag, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["ok"] is True
    (summary,) = data["files"]
    assert summary["nodes"] == 5 and summary["max_score"] == 10
    assert summary["methods"] == {"binary": 3, "weighted": 1, "llm-judge": 1}
    assert summary["primitives"]["P01"] == 3 and summary["categories"] == 2
    assert summary["run_last"] == ["LOGOUT"]


def test_dag_check_malformed_json(tmp_path: Path, valid_dag: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"nodes": [ {"id": "A",')
    result = invoke("dag", "check", valid_dag, bad)
    assert result.exit_code == 1
    assert "broken.json" in result.output and "invalid JSON" in result.output
    assert "nodes 5" in result.output  # the good file is still summarised
    data = json.loads(invoke("dag", "check", bad, "--json").stdout)
    assert data["ok"] is False and data["files"][0]["errors"][0]["file"].endswith("broken.json")


def test_dag_check_names_node_and_field(tmp_path: Path) -> None:
    path = write_dag(tmp_path / "bad.json", [node("A", [{"type": "P01", "inputs": {"path": "x"}}], method="vibes")])
    result = invoke("dag", "check", path)
    assert result.exit_code == 1
    assert "node A" in result.output and "scoring.method" in result.output


def test_dag_check_warnings_alone_exit_zero(tmp_path: Path) -> None:
    path = write_dag(tmp_path / "warn.json", [node("A", [{"type": "P01", "inputs": {"path": "x"}}], prereqs=["GHOST"])])
    result = invoke("dag", "check", path)
    assert result.exit_code == 0
    assert "warnings 1" in result.output and "GHOST" in result.output


def test_dag_check_missing_file(tmp_path: Path) -> None:
    result = invoke("dag", "check", tmp_path / "nope.json")
    assert result.exit_code == 1 and "nope.json" in result.output


def test_dag_plan_order(valid_dag: Path) -> None:
    data = json.loads(invoke("dag", "plan", valid_dag, "--json").stdout)
    assert [r["id"] for r in data] == ["README", "LOGIN", "NEEDS_LOGIN", "LEGACY", "LOGOUT"]
    assert data[-1]["run_last"] is True and data[1]["prereqs"] == ["README"]
    result = invoke("dag", "plan", valid_dag)
    assert result.exit_code == 0
    rows = [re.match(r"\s*\d+\W+([A-Z_]+)\b", line) for line in result.output.splitlines()]
    order = [m.group(1) for m in rows if m]
    assert order == ["README", "LOGIN", "NEEDS_LOGIN", "LEGACY", "LOGOUT"]
    assert "run_last" in result.output


def test_dag_plan_selection(valid_dag: Path) -> None:
    data = json.loads(invoke("dag", "plan", valid_dag, "--only", "NEEDS_LOGIN", "--json").stdout)
    assert [r["id"] for r in data] == ["README", "LOGIN", "NEEDS_LOGIN"]
    result = invoke("dag", "plan", valid_dag, "--only", "NOPE")
    assert result.exit_code == 2 and "NOPE" in result.output


# --- primitives ------------------------------------------------------------------------------------
def test_primitives_list() -> None:
    result = invoke("primitives", "list")
    assert result.exit_code == 0
    assert "P01" in result.output and "RENDER_DOM" in result.output
    assert "available" in result.output and "reserved" in result.output
    assert "path_any_of" in result.output  # input fields come from the pydantic model
    data = json.loads(invoke("primitives", "list", "--json").stdout)
    p01 = next(p for p in data if p["code"] == "P01")
    assert p01["status"] == "available" and p01["group"] == "file"
    assert {f["name"] for f in p01["inputs"]} >= {"path", "path_any_of", "type"}
    assert next(p for p in data if p["code"] == "P20")["status"] == "reserved"


# --- evaluate ----------------------------------------------------------------------------------------
def test_evaluate_unreachable_app_still_writes_a_report(
    tmp_path: Path, valid_dag: Path, workspace: Path, auth_profile: Path, dead_url: str
) -> None:
    out = tmp_path / "out"
    result = invoke(
        "evaluate",
        "--dag",
        valid_dag,
        "--base-url",
        dead_url,
        "--workspace",
        workspace,
        "--auth",
        auth_profile,
        "--out",
        out,
        "--http-timeout",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert "does not answer" in result.output  # the pre-flight warning
    report = json.loads((out / "report.json").read_text())
    status = {n["id"]: n["status"] for n in report["nodes"]}
    assert status["LOGIN"] == "FAILED"
    assert status["NEEDS_LOGIN"] == "SKIPPED_DEPENDENCY"
    assert status["README"] == "PASSED"
    assert report["summary"]["counts"]["FAILED"] >= 1
    assert report["base_url"] == dead_url and report["task_id"] == "task_demo"
    assert "Task score" in result.output and "Node coverage" in result.output
    assert str(out / "report.json") in result.output.replace("\n", "")
    # each node result was also written as it was produced (what an interrupted run leaves behind)
    logged = [json.loads(line) for line in (out / "nodes.jsonl").read_text().splitlines()]
    assert sorted((n["id"], n["status"]) for n in logged) == sorted(status.items())


def test_evaluate_require_up_exits_3(tmp_path: Path, valid_dag: Path, dead_url: str) -> None:
    result = invoke("evaluate", "--dag", valid_dag, "--base-url", dead_url, "--require-up", "--out", tmp_path / "o")
    assert result.exit_code == 3
    assert "does not answer" in result.output
    assert not (tmp_path / "o" / "report.json").exists()


def test_evaluate_missing_dag(tmp_path: Path, dead_url: str) -> None:
    result = invoke("evaluate", "--dag", tmp_path / "missing.json", "--base-url", dead_url)
    assert result.exit_code == 2
    assert "cannot load DAG" in result.output and "missing.json" in result.output


def test_evaluate_invalid_dag(tmp_path: Path, dead_url: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    result = invoke("evaluate", "--dag", bad, "--base-url", dead_url)
    assert result.exit_code == 2 and "invalid JSON" in result.output


def test_evaluate_missing_workspace(tmp_path: Path, valid_dag: Path, dead_url: str) -> None:
    result = invoke("evaluate", "--dag", valid_dag, "--base-url", dead_url, "--workspace", tmp_path / "nope")
    assert result.exit_code == 2 and "workspace" in result.output


def test_evaluate_bad_auth_profile(tmp_path: Path, valid_dag: Path, dead_url: str) -> None:
    bad = tmp_path / "auth.yaml"
    bad.write_text("scheme: bearer\n")  # a bearer scheme needs a login block
    result = invoke("evaluate", "--dag", valid_dag, "--base-url", dead_url, "--auth", bad)
    assert result.exit_code == 2 and "auth" in result.output
    result = invoke("evaluate", "--dag", valid_dag, "--base-url", dead_url, "--auth", tmp_path / "none.yaml")
    assert result.exit_code == 2 and "cannot read auth profile" in result.output


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--base-url", "localhost:8000"], "not an http(s) URL"),
        (["--base-url", "http://127.0.0.1:1", "--var", "novalue"], "NAME=VALUE"),
        (["--base-url", "http://127.0.0.1:1", "--only", "NOPE"], "NOPE"),
        (["--base-url", "http://127.0.0.1:1", "--compat", "lenient"], "lenient"),
    ],
)
def test_evaluate_bad_options(valid_dag: Path, args: list[str], needle: str) -> None:
    result = invoke("evaluate", "--dag", valid_dag, *args)
    assert result.exit_code == 2 and needle in result.output


def test_evaluate_dry_run_sends_nothing(tmp_path: Path, valid_dag: Path, dead_url: str) -> None:
    result = invoke("evaluate", "--dag", valid_dag, "--base-url", dead_url, "--dry-run", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert "does not answer" not in result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert {n["status"] for n in report["nodes"]} == {"DRY_RUN"}


def test_evaluate_default_out_dir(
    tmp_path: Path, valid_dag: Path, workspace: Path, dead_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(
        "evaluate", "--dag", valid_dag, "--base-url", dead_url, "--workspace", workspace, "--only", "README"
    )
    assert result.exit_code == 0, result.output
    (report,) = list((tmp_path / "runs").glob("*-task_demo/report.json"))
    assert [n["id"] for n in json.loads(report.read_text())["nodes"]] == ["README"]


@pytest.fixture
def teamnotes(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    from apps.teamnotes import serve_in_thread

    ws = tmp_path / "tn-workspace"
    ws.mkdir()
    server, thread, base_url = serve_in_thread(workspace=str(ws))
    try:
        yield base_url, ws
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_evaluate_against_a_live_app_with_vars_and_quarantine(tmp_path: Path, teamnotes: tuple[str, Path]) -> None:
    base_url, ws = teamnotes
    dag = write_dag(
        tmp_path / "dag.json",
        [
            node("README", [{"type": "P01", "inputs": {"path": "{{readme_name}}"}}], max_score=2),
            node("MISSING", [{"type": "P01", "inputs": {"path": "does-not-exist.txt"}}], max_score=3, category="Other"),
            node("AFTER", [{"type": "P01", "inputs": {"path": "README.md"}}], max_score=1, prereqs=["MISSING"]),
        ],
    )
    qfile = tmp_path / "quarantine.txt"
    qfile.write_text("# flaky\nMISSING\n")
    out = tmp_path / "o"
    result = invoke(
        "evaluate",
        "--dag",
        dag,
        "--base-url",
        base_url,
        "--workspace",
        ws,
        "--var",
        "readme_name=README.md",
        "--quarantine",
        qfile,
        "--out",
        out,
        "--require-up",
    )
    assert result.exit_code == 0, result.output
    assert "does not answer" not in result.output
    report = json.loads((out / "report.json").read_text())
    status = {n["id"]: n["status"] for n in report["nodes"]}
    assert status == {"README": "PASSED", "MISSING": "QUARANTINED", "AFTER": "PASSED"}
    assert report["quarantined"] == ["MISSING"]
    assert report["summary"]["task_score"] == 100.0
    assert "Per category" in result.output and "Deployment" in result.output


@pytest.mark.parametrize("prefect", [True, False], ids=["prefect", "no-prefect"])
def test_demo_runs_oracle_and_nop_on_the_demo_task(tmp_path: Path, prefect: bool) -> None:
    """The demo goes through the trial stages: on an embedded Prefect (it prints the flow run id), or
    in-process with --no-prefect."""
    extra = () if prefect else ("--no-prefect",)
    result = invoke("demo", "--out", tmp_path / "demo", "--lake", tmp_path / "lake", *extra)
    assert result.exit_code == 0, result.output
    assert ("Prefect flow run:" in result.output) is prefect
    from saasbench.lake import query

    rows = query(str(tmp_path / "lake"), "SELECT agent, deterministic_score FROM trials ORDER BY agent").to_pylist()
    assert [r["agent"] for r in rows] == ["nop", "oracle"]
    counts = query(str(tmp_path / "lake"), "SELECT count(*) AS n FROM node_results").to_pylist()[0]["n"]
    assert counts == 2 * len(json.loads((tmp_path / "demo" / "oracle" / "report.json").read_text())["nodes"])
    oracle = json.loads((tmp_path / "demo" / "oracle" / "report.json").read_text())
    nop = json.loads((tmp_path / "demo" / "nop" / "report.json").read_text())
    assert oracle["task_id"] == nop["task_id"] == "timetrack"
    # the bar: oracle >= 95 and nop <= 5 on the deterministic score
    assert oracle["summary"]["deterministic_score"] >= 95
    assert nop["summary"]["deterministic_score"] <= 5
    assert (tmp_path / "demo" / "oracle" / "trajectory.json").is_file()
    assert "Leaderboard" in result.output
