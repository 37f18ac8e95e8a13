"""Task catalogue: task.yaml model, find/load, KB model, public-layout import, CLI commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from shared_data import CONFORMANCE_DIR  # noqa: E402
from test_environment_local import make_task
from typer import Typer
from typer.testing import CliRunner

from saasbench.catalog.tasks import (
    KBEntry,
    TaskError,
    find_tasks,
    import_public_task,
    load_task,
    parse_kb,
    tasks_root,
)
from saasbench.cli.tasks import tasks_app, validate_reference_cmd

CONFORMANCE = CONFORMANCE_DIR / "task_ubsmhopy"

COMPOSE = """
name: task-ubsmhopy
services:
  db:
    image: postgres:16-alpine
    environment:
      POSTGRES_DB: ubs
      POSTGRES_USER: ubs_user
      POSTGRES_PASSWORD: ubs_pass
    ports: ["5444:5432"]
  redis:
    image: redis:7
  app:
    image: shadetocloak/task_ubsmhopy-app:${IMAGE_TAG:-baseline}
    env_file: .env
    volumes: ["./workspace:/app"]
    ports: ["3012:3000"]
    command: tail -f /dev/null
"""


def public_layout(root: Path, *, with_prd: bool = True) -> Path:
    if not (CONFORMANCE / "dag.json").is_file():
        pytest.fail(
            f"conformance data missing: {CONFORMANCE}/dag.json (the shared folder must sit beside the checkout, or set SAASBENCH_CONFORMANCE)"
        )
    src = root / "task_ubsmhopy"
    inner = src / "tasks" / "task_ubsmhopy"
    (inner / "docker" / "workspace").mkdir(parents=True)
    (inner / "docker" / "workspace" / "leftover.txt").write_text("must not be copied")
    (inner / "docker" / "docker-compose.yml").write_text(COMPOSE)
    (inner / "docker" / "Dockerfile.model").write_text('FROM ubuntu:22.04\nCMD ["sleep", "infinity"]\n')
    (inner / "docker" / ".env").write_text("PORT=3000\nDATABASE_URL=postgres://db/ubs\n")
    if with_prd:
        (inner / "task").mkdir()
        (inner / "task" / "task.md").write_text("Intro text\n\n# Unified Billing Suite\n\n## Overview\n")
        (inner / "kb").mkdir()
        (inner / "kb" / "knowledge_base.json").write_text(
            json.dumps(
                {
                    "clarifications": [
                        {
                            "id": "KB-001",
                            "question": "Q?",
                            "answer": "A.",
                            "source_reference": "task.md#x",
                            "confidence": "high",
                        }
                    ]
                }
            )
        )
    evaluate = src / "check" / "task_ubsmhopy_e" / "evaluate"
    evaluate.mkdir(parents=True)
    shutil.copy(CONFORMANCE / "dag.json", evaluate / "dag.json")
    if (CONFORMANCE / "scoring_config.json").is_file():
        shutil.copy(CONFORMANCE / "scoring_config.json", evaluate / "scoring_config.json")
    (src / "check" / "task_ubsmhopy" / "prompt_for_model.md").parent.mkdir(parents=True)
    (src / "check" / "task_ubsmhopy" / "prompt_for_model.md").write_text("# Billing SaaS\n\n## Prompt\n...\n")
    return src


# --- model and catalogue -----------------------------------------------------------------------------
def test_task_spec_fields_and_extras(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    spec = task.spec
    assert (spec.id, spec.title, spec.domain, spec.app.port, spec.app.health_path) == (
        "fixture",
        "Fixture Tracker",
        "CG",
        8000,
        "/health",
    )
    assert spec.database.engine == "sqlite" and spec.database.path == "data/fixture.db"
    assert spec.auth is not None and spec.auth.users["admin"]["username"] == "admin"
    assert spec.timeouts.eval_node_s == 20 and spec.reference.source == "reference"
    assert spec.model_extra == {"custom_key": {"kept": True}}
    assert task.prd_path.name == "task.md" and task.dag_path.is_file() and task.reference_dir == task.root / "reference"
    assert [e.id for e in task.load_kb()] == ["KB-1"]


def test_find_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_task(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.yaml").write_text("id: broken\ndomain: XX\n")
    errors: list[str] = []
    assert [t.id for t in find_tasks(tmp_path, errors=errors)] == ["fixture"]
    assert len(errors) == 1 and "broken" in errors[0] and "domain" in errors[0]
    with pytest.raises(TaskError):
        find_tasks(tmp_path)
    monkeypatch.setenv("SAASBENCH_TASKS_DIR", str(tmp_path))
    assert tasks_root() == tmp_path
    assert load_task("fixture").id == "fixture"
    assert load_task(tmp_path / "fixture").id == "fixture"
    assert load_task(tmp_path / "fixture" / "task.yaml").id == "fixture"
    with pytest.raises(TaskError, match="no task 'nope'"):
        load_task("nope")


def test_kb_shapes() -> None:
    entry = {"id": "K1", "question": "q", "answer": "a", "source_reference": "s", "confidence": 0.9, "extra": 1}
    assert parse_kb([entry])[0] == KBEntry(**entry)
    assert parse_kb({"clarifications": [entry]})[0].confidence == 0.9
    with pytest.raises(TaskError):
        parse_kb("nope")


# --- import ------------------------------------------------------------------------------------------
def test_import_public_task(tmp_path: Path) -> None:
    src = public_layout(tmp_path / "public")
    result = import_public_task(src, tmp_path / "tasks")
    task = result.task
    root = tmp_path / "tasks" / "ubsmhopy"
    assert task.id == "ubsmhopy" and task.root == root.resolve()
    assert task.title == "Unified Billing Suite"
    assert task.spec.app.port == 3000  # the port inside the container ("3012:3000"); 3012 is the benchmark host's
    assert task.spec.app.start_command is None  # the agent starts the app itself, as the public prompt says
    db = task.spec.database
    assert (db.engine, db.version, db.name, db.user, db.password, db.port) == (
        "postgresql",
        "16-alpine",
        "ubs",
        "ubs_user",
        "ubs_pass",
        5432,
    )
    assert json.loads((root / "dag.json").read_text()) == json.loads((CONFORMANCE / "dag.json").read_text())
    assert (root / "task.md").is_file() and [e.id for e in task.load_kb()] == ["KB-001"]
    assert (root / "environment" / "docker-compose.yml").is_file() and (root / "environment" / ".env").is_file()
    assert not (root / "environment" / "workspace").exists()
    assert (root / "prompt_for_model.md").is_file()
    raw = yaml.safe_load((root / "task.yaml").read_text())
    assert raw["source"]["task"] == "task_ubsmhopy" and task.spec.model_extra["source"]["kind"] == "saasbench-public"
    assert set(raw["environment"]["services"]) == {"app", "db", "redis"}
    assert isinstance(result.dag_warnings, list)
    assert any("domain" in w for w in result.warnings)
    assert task.spec.environment["variables"] == {"IMAGE_TAG": "model", "APP_CMD": "sleep infinity"}
    with pytest.raises(TaskError, match="already exists"):
        import_public_task(src, tmp_path / "tasks")
    assert import_public_task(src, tmp_path / "tasks", overwrite=True).task.id == "ubsmhopy"


def test_import_without_prd_warns(tmp_path: Path) -> None:
    src = public_layout(tmp_path / "public", with_prd=False)
    result = import_public_task(src, tmp_path / "tasks")
    assert result.task.title == "Billing SaaS"  # from prompt_for_model.md
    assert any("task.md" in w for w in result.warnings) and any("knowledge_base" in w for w in result.warnings)


def test_import_rejects_other_layouts_and_bad_dags(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not a public SaaSBench task folder"):
        import_public_task(tmp_path, tmp_path / "tasks")
    src = public_layout(tmp_path / "public")
    (src / "check" / "task_ubsmhopy_e" / "evaluate" / "dag.json").write_text(
        '{"nodes": [{"id": "A", "prereqs": ["A"]}]}'
    )
    with pytest.raises(TaskError, match="DAG does not load"):
        import_public_task(src, tmp_path / "tasks")
    assert not (tmp_path / "tasks" / "ubsmhopy").exists()


# --- CLI -----------------------------------------------------------------------------------------------
def _cli() -> Typer:
    app = Typer()
    app.add_typer(tasks_app, name="tasks")
    app.command("validate-reference")(validate_reference_cmd)
    return app


def test_cli_tasks_list_show_import(tmp_path: Path) -> None:
    runner = CliRunner()
    make_task(tmp_path / "cat")
    r = runner.invoke(_cli(), ["tasks", "list", "--root", str(tmp_path / "cat")])
    assert r.exit_code == 0, r.output
    assert "fixture" in r.output and "1 task(s)" in r.output
    r = runner.invoke(_cli(), ["tasks", "list", "--root", str(tmp_path / "cat"), "--json"])
    assert json.loads(r.output)["tasks"][0]["reference"] is True
    r = runner.invoke(_cli(), ["tasks", "show", "fixture", "--root", str(tmp_path / "cat")])
    assert r.exit_code == 0 and "Fixture Tracker" in r.output and "5 node(s)" in r.output, r.output
    r = runner.invoke(_cli(), ["tasks", "show", "nope", "--root", str(tmp_path / "cat")])
    assert r.exit_code == 2
    src = public_layout(tmp_path / "public")
    r = runner.invoke(_cli(), ["tasks", "import", str(src), "--dest", str(tmp_path / "cat")])
    assert r.exit_code == 0, r.output
    assert "imported" in r.output and (tmp_path / "cat" / "ubsmhopy" / "task.yaml").is_file()


def test_cli_validate_reference(tmp_path: Path) -> None:
    make_task(tmp_path / "cat")
    out = tmp_path / "out"
    r = CliRunner().invoke(
        _cli(), ["validate-reference", "fixture", "--root", str(tmp_path / "cat"), "--repeats", "1", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "HEALTH" in r.output and "pass" in r.output and (out / "validation.json").is_file()
