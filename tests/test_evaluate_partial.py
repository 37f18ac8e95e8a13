"""report.json is written incrementally (issue #19): ``saasbench evaluate`` rewrites it atomically while
it runs, marked ``"complete": false`` with the nodes scored so far, so an interrupted run (Ctrl-C or
SIGKILL) leaves a valid report that loads through the model; the final write marks it complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from shared_data import sigint_default

from saasbench.evaluation.results import RunReport

REPO = Path(__file__).resolve().parents[1]
NODES = 40


class _SlowApp:
    """An app on 127.0.0.1 whose every answer takes ``delay_s``: a run of NODES nodes lasts a few seconds."""

    def __init__(self, delay_s: float):
        delay = delay_s

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def do_GET(self):
                time.sleep(delay)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the evaluator was killed mid-request
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def slow_app():
    app = _SlowApp(0.15)
    yield app
    app.close()


def _dag(path: Path) -> Path:
    nodes = [
        {
            "id": f"N{i:02d}",
            "steps": [
                {"type": "P04", "inputs": {"method": "GET", "path": f"/item/{i}"}},
                {"type": "P15", "inputs": {"expected_status": 200}},
            ],
            "scoring": {"category": "API", "method": "binary", "maxScore": 1},
        }
        for i in range(NODES)
    ]
    path.write_text(json.dumps({"meta": {"task_id": "partial"}, "nodes": nodes}))
    return path


def _start(tmp_path: Path, base_url: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "saasbench.cli.main",
        "evaluate",
        "--dag",
        str(_dag(tmp_path / "dag.json")),
        "--base-url",
        base_url,
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default
    )
    return proc, out


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for_nodes(proc: subprocess.Popen, nodes_log: Path, n: int, deadline_s: float = 60) -> None:
    """Until nodes.jsonl holds ``n`` complete lines (the run's own progress, not a sleep)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        text = nodes_log.read_text() if nodes_log.is_file() else ""
        if text.count("\n") >= n:
            return
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"fewer than {n} nodes in {nodes_log} after {deadline_s}s: {proc.communicate()}")


def _partial(out: Path) -> tuple[RunReport, list[dict]]:
    assert not list(out.glob(".report.json.*")), "a temporary file was left behind"
    data = json.loads((out / "report.json").read_text())  # valid JSON
    report = RunReport.model_validate(data)  # and the model loads it
    return report, _lines(out / "nodes.jsonl")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_an_interrupted_evaluate_leaves_a_valid_partial_report(tmp_path, slow_app, sig):
    proc, out = _start(tmp_path, slow_app.base_url)
    try:
        _wait_for_nodes(proc, out / "nodes.jsonl", 5)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report, scored = _partial(out)
    assert report.complete is False and report.nodes_planned == NODES
    ids = [n.id for n in report.nodes]
    assert 1 <= len(ids) < NODES and ids == [n["id"] for n in scored][: len(ids)]  # a prefix of what was scored
    if sig == signal.SIGINT:  # Ctrl-C: the report is written once more with every node scored
        assert len(ids) == len(scored)
    assert all(n.status.value == "PASSED" for n in report.nodes)
    s = report.summary  # the summary covers the nodes in the report
    assert s.total_nodes == len(ids) and s.counts.PASSED == len(ids) and s.max_score == len(ids)
    assert s.task_score == 100.0 and report.base_url == slow_app.base_url and report.task_id == "partial"


def test_a_finished_evaluate_marks_its_report_complete(tmp_path, slow_app):
    proc, out = _start(tmp_path, slow_app.base_url)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    report, scored = _partial(out)
    assert report.complete is True and report.nodes_planned == NODES == len(report.nodes) == len(scored)
    # an old report (before these fields) loads as complete
    old = json.loads((out / "report.json").read_text())
    del old["complete"], old["nodes_planned"]
    assert RunReport.model_validate(old).complete is True
