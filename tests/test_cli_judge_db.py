"""`saasbench evaluate` wires the judge (--judge-*) and the database (--db-dsn) into a run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from apps.teamnotes import serve_in_thread
from typer.testing import CliRunner

from saasbench.cli.main import app
from tests.fake_llm import FakeLLM, Reply

runner = CliRunner()


@pytest.fixture
def teamnotes(tmp_path):
    server, thread, base_url = serve_in_thread(workspace=str(tmp_path / "ws"))
    yield base_url, tmp_path / "ws"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _dag(path: Path) -> Path:
    nodes = [
        {
            "id": "HEALTH",
            "steps": [
                {"type": "P04", "inputs": {"method": "GET", "path": "/api/health"}},
                {"type": "P15", "inputs": {"expected_status": 200}},
            ],
            "scoring": {"category": "Deployment", "method": "binary", "maxScore": 2},
        },
        {
            "id": "DB_ROW",
            "steps": [
                {
                    "type": "P08",
                    "inputs": {
                        "sql": "SELECT name FROM items WHERE name = '{{item}}'",
                        "expected_result": {"name": "{{item}}"},
                    },
                }
            ],
            "scoring": {"category": "DataModel", "method": "binary", "maxScore": 3},
        },
        {
            "id": "ARCH",
            "prereqs": ["HEALTH"],
            "steps": [
                {
                    "type": "P17",
                    "inputs": {
                        "evidence_type": "code_files",
                        "files_to_sample": ["app/"],
                        "rubric_prompt": "Judge the layout. Score 0-4.",
                        "score_range": [0, 4],
                    },
                }
            ],
            "scoring": {"category": "ArchitectureQuality", "method": "llm-judge", "maxScore": 8},
        },
    ]
    path.write_text(json.dumps({"meta": {"task_id": "cli-judge"}, "nodes": nodes}))
    return path


def test_evaluate_with_judge_and_database(teamnotes, tmp_path, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    base_url, ws = teamnotes
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE items (name TEXT)")
        con.execute("INSERT INTO items VALUES (?)", ("x'); DROP TABLE items; --",))
    out = tmp_path / "out"
    with FakeLLM() as llm:
        llm.queue(Reply.json({"score": 3, "reasoning": "clear modules"}))
        result = runner.invoke(
            app,
            [
                "evaluate",
                "--dag",
                str(_dag(tmp_path / "dag.json")),
                "--base-url",
                base_url,
                "--workspace",
                str(ws),
                "--db-dsn",
                f"sqlite:///{db}",
                "--out",
                str(out),
                "--var",
                "item=x'); DROP TABLE items; --",
                "--judge-model",
                "openai/fake",
                "--judge-api-base",
                llm.base_url,
            ],
        )
        assert result.exit_code == 0, result.output
        assert len(llm.chat_requests) == 1
    report = json.loads((out / "report.json").read_text())
    nodes = {n["id"]: n for n in report["nodes"]}
    assert nodes["DB_ROW"]["status"] == "PASSED", nodes["DB_ROW"]["message"]
    assert nodes["ARCH"]["status"] == "PASSED" and nodes["ARCH"]["score"] == 6.0  # 3 of [0, 4] -> 3 * 8 / 4
    assert report["options"]["judge_enabled"] is True and report["options"]["judge_model"] == "openai/fake"
    # 2 + 3 + 6 of 13
    assert report["summary"]["task_score"] == round(100 * 11 / 13, 2)
    with sqlite3.connect(db) as con:  # the hostile captured value was data, not SQL
        assert con.execute("SELECT count(*) FROM items").fetchone()[0] == 1


def test_evaluate_without_judge_skips_llm_nodes(teamnotes, tmp_path):
    base_url, ws = teamnotes
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--dag",
            str(_dag(tmp_path / "dag.json")),
            "--base-url",
            base_url,
            "--workspace",
            str(ws),
            "--out",
            str(out),
            "--var",
            "item=a",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    nodes = {n["id"]: n for n in report["nodes"]}
    assert nodes["ARCH"]["status"] == "SKIPPED_LLM"
    assert nodes["DB_ROW"]["status"] == "FAILED" and "no database" in nodes["DB_ROW"]["message"]
    assert report["summary"]["skipped_llm_max_score"] == 8
    assert report["summary"]["task_score"] == 40.0  # 2 of 5: the judge's 8 points left out
