"""`saasbench tasks fetch` against local stand-ins: a git repository in the public layout and an HTTP dataset host."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from localhttp import serve_http
from shared_data import PUBLIC_TASKS_DIR
from typer import Typer
from typer.testing import CliRunner

from saasbench.catalog.fetch import FetchError, checkout, fetch_tasks
from saasbench.catalog.tasks import load_task, readiness
from saasbench.cli.tasks import tasks_app

KB = [
    {"id": "KB-001", "question": "Which port?", "answer": "8021", "source_reference": "task.md#8", "confidence": "high"}
]


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def public_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository laid out like the public one (eval/task_<id>/...), with two tasks; returns (path, commit)."""
    repo = tmp_path / "SaaSbench"
    for task in ("task_cqfnbfay", "task_mjobbzsi"):
        shutil.copytree(PUBLIC_TASKS_DIR / task, repo / "eval" / task)
    git("init", "-q", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tasks", cwd=repo)
    sha = git("rev-parse", "HEAD", cwd=repo)
    # a later commit the pinned fetch must not see
    (repo / "eval" / "task_cqfnbfay" / "LATER").write_text("after the pinned commit")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "later", cwd=repo)
    return repo, sha


@pytest.fixture
def dataset_host(tmp_path: Path) -> Iterator[tuple[str, list[dict]]]:
    """An HTTP server on 127.0.0.1 serving <root>/datasets/SaaSBench/SaaSBench/resolve/main/tasks/...; records headers."""
    root = tmp_path / "hf"
    base = root / "datasets" / "SaaSBench" / "SaaSBench" / "resolve" / "main" / "tasks"
    (base / "task_cqfnbfay").mkdir(parents=True)
    (base / "task_cqfnbfay" / "task.md").write_text("# Document Signing Platform\n\n## 1. Overview\n")
    (base / "task_cqfnbfay" / "knowledge_base.json").write_text(json.dumps(KB))
    (base / "task_mjobbzsi").mkdir(parents=True)
    (base / "task_mjobbzsi" / "task.md").write_text("# Video Conferencing\n")  # no KB: a 404 the fetch must report
    seen: list[dict] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            super().do_GET()

        def log_message(self, *args):
            pass

    with serve_http(Handler) as url:
        yield url, seen


def test_fetch_imports_downloads_and_reports(tmp_path, public_repo, dataset_host, monkeypatch) -> None:
    repo, sha = public_repo
    url, seen = dataset_host
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    results = fetch_tasks(
        ["cqfnbfay", "task_mjobbzsi", "task_nope"],
        repo=str(repo),
        commit=sha,
        endpoint=url,
        dest_root=tmp_path / "cat",
        cache_dir=tmp_path / "cache",
    )
    by = {r.task: r for r in results}
    cq = by["task_cqfnbfay"]
    assert cq.imported and cq.errors == [] and cq.downloaded == ["task.md", "knowledge_base.json"]
    task = load_task("cqfnbfay", tmp_path / "cat")
    assert [e.id for e in task.load_kb()] == ["KB-001"] and task.prd_path.read_text().startswith("# Document Signing")
    state = readiness(task)
    assert "PRD" not in state.needs and "DAG" in state.needs  # the repository ships no dag.json for it
    assert not (tmp_path / "cache" / sha / "eval" / "task_cqfnbfay" / "LATER").exists()  # pinned commit

    mj = by["task_mjobbzsi"]
    assert mj.imported and mj.downloaded == ["task.md"]
    assert len(mj.errors) == 1 and "knowledge_base.json" in mj.errors[0] and "HTTP 404" in mj.errors[0]
    mj_state = readiness(load_task("mjobbzsi", tmp_path / "cat"))
    assert "DAG" not in mj_state.needs and "PRD" in mj_state.needs  # smoke DAG present, KB missing
    assert any("smoke DAG only" in n for n in mj_state.notes)

    assert not by["task_nope"].imported and "not in" in by["task_nope"].errors[0]
    assert seen and all(s["authorization"] == "Bearer hf_secret_token" for s in seen)
    assert all("hf_secret_token" not in e for r in results for e in r.errors)


def test_fetch_cli_and_bad_commits(tmp_path, public_repo, dataset_host) -> None:
    repo, sha = public_repo
    url, _ = dataset_host
    app = Typer()
    app.add_typer(tasks_app, name="tasks")
    r = CliRunner().invoke(
        app,
        [
            "tasks",
            "fetch",
            "cqfnbfay",
            "--repo",
            str(repo),
            "--commit",
            sha,
            "--endpoint",
            url,
            "--dest",
            str(tmp_path / "cat"),
            "--cache",
            str(tmp_path / "cache"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "task_cqfnbfay" in r.output and "needs DAG" in r.output and "1 of 1 task(s)" in r.output
    r = CliRunner().invoke(
        app,
        [
            "tasks",
            "fetch",
            "mjobbzsi",
            "--repo",
            str(repo),
            "--commit",
            sha,
            "--endpoint",
            url,
            "--dest",
            str(tmp_path / "cat"),
            "--cache",
            str(tmp_path / "cache"),
        ],
    )
    assert r.exit_code == 1 and "HTTP 404" in r.output
    with pytest.raises(FetchError, match="commit id"):
        checkout(str(repo), "main", tmp_path / "cache")
    with pytest.raises(FetchError, match="is not in|cannot fetch"):
        checkout(str(repo), "0" * 40, tmp_path / "cache")
    assert not (tmp_path / "cache" / ("0" * 40)).exists()
