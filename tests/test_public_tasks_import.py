"""All 15 real public task folders import: readiness, declared facts, auth users, the prompt built from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from shared_data import MJOBBZSI_SMOKE_DAG, PUBLIC_TASK_IDS, PUBLIC_TASKS_DIR
from typer import Typer
from typer.testing import CliRunner

from agents.base import build_prompt
from saasbench.catalog.tasks import import_public_task, load_task, readiness
from saasbench.cli.tasks import tasks_app
from saasbench.services.http import HttpClient

# task -> (title, app port, database engine, number of evaluation users, what it needs)
EXPECTED = {
    "aoiwqoiq": ("Community Forum Platform", 8020, "postgresql", 3, ["DAG", "PRD", "files"]),
    "cqfnbfay": ("Document Signing & Form Filling Platform", 8021, "postgresql", 1, ["DAG", "PRD", "files"]),
    "cvyocaao": ("Identity and Access Management Platform", 8027, "postgresql", 1, ["DAG", "PRD", "files"]),
    "dfhjkeb": ("Full-Featured E-Commerce Platform", 8003, "postgresql", 7, ["DAG", "PRD", "files"]),
    "gavmyneb": ("Learning Management System", 80, "postgresql", 6, ["DAG", "PRD", "files"]),
    "hhrdixum": ("Inventory Management & Light-MRP", 8000, "postgresql", 2, ["DAG", "PRD", "files"]),
    "ididetxj": ("Collaborative Knowledge Base & Wiki Platform", 8031, "postgresql", 5, ["DAG", "PRD", "files"]),
    "iyjruvfz": ("Scheduling / Booking Platform", 3000, "postgresql", 3, ["DAG", "PRD", "files"]),
    "jzssnoqp": ("Omnichannel Customer Communication Platform", 8018, "postgresql", 5, ["DAG", "PRD", "files"]),
    "kmasmnil": ("Experience Management Platform", 8024, "postgresql", 2, ["DAG", "PRD"]),
    "lgzivily": ("Clinical Practice Management Suite", 80, "mariadb", 7, ["DAG", "PRD", "files"]),
    "mjobbzsi": ("Real-Time Video Conferencing Platform", 80, None, 0, ["PRD", "files"]),
    "orghjavi": ("Privacy-friendly Web Analytics", 8000, "postgresql", 5, ["DAG", "PRD", "files"]),
    "qmjfeopc": ("Gamified Habit-Tracking RPG", 8002, "mongodb", 3, ["DAG", "PRD"]),
    "rjhcjrst": ("Personal Finance Manager", 80, "mysql", 2, ["DAG", "PRD", "files"]),
}


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("catalogue")
    for public in PUBLIC_TASK_IDS:
        import_public_task(PUBLIC_TASKS_DIR / public, dest)
    return dest


def test_fifteen_folders() -> None:
    assert [f"task_{t}" for t in sorted(EXPECTED)] == PUBLIC_TASK_IDS


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_public_task_imports_with_readiness_and_facts(catalogue: Path, task_id: str) -> None:
    title, port, engine, n_users, needs = EXPECTED[task_id]
    task = load_task(task_id, catalogue)
    assert task.title == title and task.spec.app.port == port
    assert (task.spec.database.engine if task.spec.database else None) == engine
    assert len(task.spec.auth.users if task.spec.auth else {}) == n_users
    state = readiness(task)
    assert state.needs == needs, state.notes
    assert state.status == "needs " + ", ".join(needs)
    raw = yaml.safe_load((task.root / "task.yaml").read_text())
    assert raw["facts"]["product"] == title and raw["facts"]["app_port"] == port  # declared data, re-read from disk
    assert "prompt_text" not in raw["facts"]
    assert raw["environment"]["compose"] == "environment/docker-compose.yml"
    assert (task.root / "scoring_config.json").is_file() and (task.root / "prompt_for_model.md").is_file()


def test_users_and_db_credentials_reach_the_auth_profile_and_prompt(catalogue: Path) -> None:
    task = load_task("aoiwqoiq", catalogue)
    users = task.spec.auth.users
    assert users["admin"] == {
        "username": "eval_admin",
        "email": "eval_admin@eval.test",
        "password": "EvalPass12345!",
        **{k: v for k, v in users["admin"].items() if k not in ("username", "email", "password")},
    }
    assert task.spec.auth.default_role == "admin"

    class DockerLike:  # the attributes build_prompt reads from an environment
        kind, workspace_path, app_port, container_name = "docker", "/app", 8020, "saasbench-t1-app"
        runs_on_host = False

        def service_env(self) -> dict:
            return {}

    prompt = build_prompt(task, DockerLike(), stage=False)
    assert "build a complete Community Forum Platform from scratch" in prompt
    assert "docker exec saasbench-t1-app" in prompt and "task_aoiwqoiq-app" not in prompt  # the trial's container
    assert "Tools pre-installed (Ubuntu 22.04):" in prompt
    assert "host db, port 5432, database app_aoiwqoiq, username appaoiwqoiq, password app123aoiwqoiq" in prompt
    assert "eval_moderator" in prompt and "EvalPass12345!" in prompt
    assert "listening on 0.0.0.0:8020" in prompt and "bash run.sh" not in prompt
    iy = load_task("iyjruvfz", catalogue)
    assert iy.spec.environment["db_host"] == "postgres"
    assert sorted(iy.spec.environment["secrets"]) == [
        "APP_ENCRYPTION_KEY",
        "CRON_API_KEY",
        "JWT_SECRET",
        "NEXTAUTH_SECRET",
    ]


def test_missing_env_file_warning_names_the_documented_variables(tmp_path: Path) -> None:
    result = import_public_task(PUBLIC_TASKS_DIR / "task_cqfnbfay", tmp_path)
    [warning] = [w for w in result.warnings if "env_file" in w]
    assert ".env does not exist" in warning
    assert "variables the prompt documents: DATABASE_URL, REDIS_URL, SECRET_KEY_BASE, PORT" in warning


def test_smoke_dag_and_attaching_a_dag_later(catalogue: Path, tmp_path: Path) -> None:
    mj = readiness(load_task("mjobbzsi", catalogue))
    assert "DAG" not in mj.needs and any("smoke DAG only" in n for n in mj.notes)
    app = Typer()
    app.add_typer(tasks_app, name="tasks")
    runner = CliRunner()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [{"id": "A", "prereqs": ["A"]}]}))
    r = runner.invoke(app, ["tasks", "import", "cqfnbfay", "--dag", str(bad), "--dest", str(catalogue)])
    assert r.exit_code == 2 and "does not load" in r.output
    assert "DAG" in readiness(load_task("cqfnbfay", catalogue)).needs  # nothing attached
    r = runner.invoke(app, ["tasks", "import", "cqfnbfay", "--dag", str(MJOBBZSI_SMOKE_DAG), "--dest", str(catalogue)])
    assert r.exit_code == 0, r.output
    assert "attached" in r.output
    assert "DAG" not in readiness(load_task("cqfnbfay", catalogue)).needs
    r = runner.invoke(app, ["tasks", "list", "--root", str(catalogue), "--no-images"])
    assert r.exit_code == 0 and "15 task(s)" in r.output and "readiness" in r.output
    r = runner.invoke(app, ["tasks", "list", "--root", str(catalogue), "--no-images", "--json"])
    rows = {row["id"]: row for row in json.loads(r.output)["tasks"]}
    assert rows["cqfnbfay"]["readiness"] == "needs PRD, files" and rows["kmasmnil"]["needs"] == ["DAG", "PRD"]
    r = runner.invoke(app, ["tasks", "show", "aoiwqoiq", "--root", str(catalogue)])
    assert r.exit_code == 0 and "facts from prompt_for_model.md" in r.output and "eval_admin@eval.test" in r.output
    assert "readiness   needs DAG, PRD, files" in r.output


def test_dag_urls_for_the_benchmark_machine_reach_the_trial_app(catalogue: Path) -> None:
    gav = load_task("gavmyneb", catalogue)
    assert "http://localhost:8017" in gav.app_origins and "http://127.0.0.1:80" in gav.app_origins
    client = HttpClient("http://127.0.0.1:45678", origin_aliases=gav.app_origins)
    assert client.url("http://localhost:8017/api/v1/courses?x=1") == "http://127.0.0.1:45678/api/v1/courses?x=1"
    assert client.url("http://localhost:9999/x") == "http://localhost:9999/x"  # another service stays itself
    assert client.url("/health_check") == "http://127.0.0.1:45678/health_check"
