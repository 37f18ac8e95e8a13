"""Bad input is refused with one line (issue #17, items 6, 7, 11, 12).

The corpus is ``tests/adversarial/`` (its README lists the files); what git keeps badly (symlinks,
FIFOs, sparse and big files) is made here. :func:`test_every_loader_refuses_bad_input_with_one_line`
runs every loader (DAG, task.yaml, sweep spec, auth profile, ``tasks import``) through the command
line over it: exit code 2, one line, naming the file, no traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from saasbench import inputs
from saasbench.catalog.tasks import TaskError, load_task_dir
from saasbench.cli.main import app
from saasbench.dag import MAX_DAG_BYTES

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "adversarial"
runner = CliRunner()


def invoke(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def good_dag(folder: Path) -> Path:
    path = folder / "good-dag.json"
    node = {
        "id": "A",
        "steps": [{"type": "P01", "inputs": {"path": "README.md"}}],
        "scoring": {"category": "Docs", "method": "binary", "maxScore": 1},
    }
    path.write_text(json.dumps({"nodes": [node]}))
    return path


# --- the corpus: (name, make(tmp) -> (argv, the file the error must name)) ------------------------------------
Case = Callable[[Path], tuple[list[object], Path]]


def _deep(tmp: Path, name: str, opener: str, closer: str) -> Path:
    path = tmp / name
    path.write_text(opener * 100_000 + closer * 100_000)
    return path


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # no disk used; a loader that read it would read it all
    return path


DAG_FILES: dict[str, Callable[[Path], Path]] = {
    **{p.stem: (lambda tmp, p=p: p) for p in sorted((CORPUS / "dags").glob("*.json"))},
    "huge": lambda tmp: _sparse(tmp / "huge-dag.json", MAX_DAG_BYTES + 1),
    "deep": lambda tmp: _deep(tmp, "deep-dag.json", "[", "]"),
}
YAML_FILES: dict[str, Callable[[Path], Path]] = {
    **{p.stem: (lambda tmp, p=p: p) for p in sorted((CORPUS / "yaml").glob("*.yaml"))},
    "too-big": lambda tmp: _too_big_yaml(tmp),
    "deep": lambda tmp: _deep(tmp, "deep.yaml", "[", "]"),
}


def _too_big_yaml(tmp: Path) -> Path:
    path = tmp / "too-big.yaml"
    path.write_text("values:\n" + "  - 0123456789abcdef\n" * (inputs.MAX_YAML_BYTES // 20 + 10))
    return path


def _task_folder(tmp: Path, text: str | None = None, source: Path | None = None) -> Path:
    folder = tmp / "task"
    if source is not None:
        shutil.copytree(source, folder)
    else:
        folder.mkdir()
        (folder / "task.yaml").write_text(text or "")
    return folder


def _symlinked_prd(tmp: Path) -> Path:
    folder = _task_folder(tmp, "id: symlinked-prd\nprd: task.md\n")
    (folder / "task.md").symlink_to("/etc/passwd")
    return folder


TASK_FOLDERS: dict[str, Callable[[Path], Path]] = {
    **{p.name: (lambda tmp, p=p: _task_folder(tmp, source=p)) for p in sorted((CORPUS / "tasks").iterdir())},
    "symlink-to-etc-passwd": _symlinked_prd,
}


def _public(tmp: Path, spoil: Callable[[Path], Path] | None = None) -> tuple[Path, Path]:
    """A copy of the good public folder, spoiled: (the folder, the file the error must name)."""
    folder = tmp / "task_goodbase"
    shutil.copytree(CORPUS / "public" / "task_goodbase", folder)
    return folder, spoil(folder / "tasks" / "task_goodbase") if spoil else folder


def _link(path: Path, target: str) -> Path:
    path.symlink_to(target)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


IMPORT_FOLDERS: dict[str, Callable[[Path], tuple[Path, Path]]] = {
    "lake-refuses-id": lambda tmp: (CORPUS / "public" / "task_-bad", CORPUS / "public" / "task_-bad"),
    "symlink-to-etc-passwd": lambda tmp: _public(tmp, lambda t: _link(t / "docker" / "passwd", "/etc/passwd")),
    "symlinked-folder-to-etc": lambda tmp: _public(tmp, lambda t: _link(t / "docker" / "etc", "/etc")),
    "prd-symlink-out": lambda tmp: _public(tmp, lambda t: _swap_for_link(t / "task" / "task.md", "/etc/hostname")),
    "fifo": lambda tmp: _public(tmp, lambda t: _fifo(t / "docker" / "pipe")),
    "sparse-2gb": lambda tmp: _public(tmp, lambda t: _sparse(t / "docker" / "data.bin", 2 * 1024**3)),
}


def _swap_for_link(path: Path, target: str) -> Path:
    path.unlink()
    return _link(path, target)


def _dag_case(make: Callable[[Path], Path]) -> Case:
    def case(tmp: Path) -> tuple[list[object], Path]:
        dag = make(tmp)
        return ["evaluate", "--dag", dag, "--base-url", dead_url(), "--dry-run", "--out", tmp / "out"], dag

    return case


def _yaml_cases(name: str, make: Callable[[Path], Path]) -> dict[str, Case]:
    def sweep(tmp: Path) -> tuple[list[object], Path]:
        path = make(tmp)
        return ["sweep", path, "--dry-run"], path

    def auth(tmp: Path) -> tuple[list[object], Path]:
        path = make(tmp)
        return ["evaluate", "--dag", good_dag(tmp), "--base-url", dead_url(), "--dry-run", "--auth", path], path

    def task_yaml(tmp: Path) -> tuple[list[object], Path]:
        folder = tmp / "task"
        folder.mkdir()
        shutil.copyfile(make(tmp), folder / "task.yaml")
        return ["tasks", "show", folder], folder / "task.yaml"

    return {f"sweep-spec/{name}": sweep, f"auth-profile/{name}": auth, f"task.yaml/{name}": task_yaml}


def _task_case(make: Callable[[Path], Path]) -> Case:
    def case(tmp: Path) -> tuple[list[object], Path]:
        folder = make(tmp)
        return ["tasks", "show", folder], folder / "task.yaml"

    return case


def _import_case(make: Callable[[Path], tuple[Path, Path]]) -> Case:
    def case(tmp: Path) -> tuple[list[object], Path]:
        folder, named = make(tmp)
        return ["tasks", "import", folder, "--dest", tmp / "catalogue"], named

    return case


CASES: dict[str, Case] = {
    **{f"dag/{name}": _dag_case(make) for name, make in DAG_FILES.items()},
    **{k: v for name, make in YAML_FILES.items() for k, v in _yaml_cases(name, make).items()},
    **{f"task/{name}": _task_case(make) for name, make in TASK_FOLDERS.items()},
    **{f"import/{name}": _import_case(make) for name, make in IMPORT_FOLDERS.items()},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_loader_refuses_bad_input_with_one_line(tmp_path: Path, case: str) -> None:
    argv, named = CASES[case](tmp_path)
    result = invoke(*argv, env={"COLUMNS": "60"})  # narrow: the error line must not wrap anyway
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, (case, result.output, result.exception)
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    if case.startswith("import/"):  # the source folder is resolved, the offending entry named as found in it
        named = Path(os.path.realpath(named.parent)) / named.name
    assert str(named) in lines[0]
    if case.startswith("import/"):
        assert not (tmp_path / "catalogue").exists() or not any((tmp_path / "catalogue").iterdir())
    if case.startswith("dag/"):  # `dag check` reports the same file as a DAG with errors (its exit code 1)
        checked = invoke("dag", "check", argv[2])
        assert checked.exit_code == 1 and "Traceback" not in checked.output
        assert f"FAIL {argv[2]}" in checked.output


def test_alias_bomb_is_refused_but_anchors_and_merge_keys_load() -> None:
    with pytest.raises(inputs.InputError, match="alias-bomb.yaml: refused: more than 100,000 YAML nodes"):
        inputs.load_yaml(CORPUS / "yaml" / "alias-bomb.yaml")
    compose = "x-env: &env {A: '1', B: '2'}\nservices:\n  app:\n    environment:\n      <<: *env\n      C: '3'\n"
    data = inputs.parse_yaml(compose, source="compose.yaml")
    assert data["services"]["app"]["environment"] == {"A": "1", "B": "2", "C": "3"}
    assert inputs.parse_yaml("", source="empty.yaml") is None


def test_every_yaml_read_goes_through_the_one_loader() -> None:
    found = []
    for folder in ("saasbench", "agents", "primitives", "flows"):
        for path in (REPO / folder).rglob("*.py"):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents) or path.name == "inputs.py":
                continue
            text = path.read_text(encoding="utf-8")
            found += [
                f"{path.relative_to(REPO)}: {m}" for m in re.findall(r"yaml\.(?:safe_|full_|unsafe_)?load\w*\(", text)
            ]
    assert found == [], "read user YAML with saasbench.inputs.load_yaml (size cap, alias budget, one-line errors)"


def test_task_ids_follow_the_lakes_rule(tmp_path: Path) -> None:
    from saasbench import lake

    assert lake.check_id is inputs.check_id
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "task.yaml").write_text("id: a.b_c-1\n")
    assert load_task_dir(tmp_path / "ok").id == "a.b_c-1"
    (tmp_path / "bad folder").mkdir()
    (tmp_path / "bad folder" / "task.yaml").write_text("title: without an id the folder name is the id\n")
    with pytest.raises(TaskError, match="not a valid lake id"):
        load_task_dir(tmp_path / "bad folder")


def test_tasks_list_reports_each_broken_task_on_its_own_line(tmp_path: Path) -> None:
    catalogue = tmp_path / "catalogue"
    (catalogue / "good").mkdir(parents=True)
    (catalogue / "good" / "task.yaml").write_text("id: good\ntitle: A good task\n")
    for p in (CORPUS / "tasks").iterdir():
        shutil.copytree(p, catalogue / p.name)
    (catalogue / "bomb").mkdir()
    shutil.copyfile(CORPUS / "yaml" / "alias-bomb.yaml", catalogue / "bomb" / "task.yaml")
    broken = len(list((CORPUS / "tasks").iterdir())) + 1
    result = invoke("tasks", "list", "--root", catalogue, "--no-images")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "A good task" in result.output and "1 task(s)" in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("broken task: ")]
    assert len(lines) == broken and all(str(catalogue) in line for line in lines)
    data = json.loads(invoke("tasks", "list", "--root", catalogue, "--no-images", "--json").output)
    assert [t["id"] for t in data["tasks"]] == ["good"] and len(data["errors"]) == broken


def test_import_follows_links_inside_the_task_and_writes_regular_files(tmp_path: Path) -> None:
    folder, docker = _public(tmp_path, lambda t: t / "docker")
    (docker / "Dockerfile.link").symlink_to("Dockerfile")
    (docker / "sub").symlink_to("../task")
    (docker / "workspace").mkdir()
    (docker / "workspace" / "big.bin").write_bytes(b"x")
    result = invoke("tasks", "import", folder, "--dest", tmp_path / "catalogue")
    assert result.exit_code == 0, result.output
    env = tmp_path / "catalogue" / "goodbase" / "environment"
    assert (env / "Dockerfile.link").read_text() == (docker / "Dockerfile").read_text()
    assert (env / "sub" / "task.md").is_file() and not (env / "workspace").exists()
    assert not [p for p in (tmp_path / "catalogue").rglob("*") if p.is_symlink()]


def test_oracle_refuses_a_reference_file_linked_out_of_the_task(tmp_path: Path) -> None:
    from test_environment_local import make_task

    from saasbench.agents import Budget, get_agent
    from saasbench.environments.local import LocalEnvironment

    task = make_task(tmp_path)
    (task.root / "reference" / "secrets.txt").symlink_to("/etc/hostname")
    with LocalEnvironment(task) as env:
        traj = get_agent("oracle").run("", env, Budget())
        assert traj.exit_reason == "agent_error" and "outside the task folder" in (traj.error or "")
        assert not (env.workspace_dir / "secrets.txt").exists()


def test_unreachable_lake_is_one_line_and_debug_shows_the_traceback(tmp_path: Path, monkeypatch) -> None:
    import botocore.endpoint

    from saasbench.lake import LakeStoreError

    monkeypatch.setattr(botocore.endpoint.time, "sleep", lambda s: None)  # the store's 5 attempts, without backoff
    env = {
        "SAASBENCH_S3_ENDPOINT": dead_url(),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "COLUMNS": "60",
    }
    result = invoke("rescore", "s1", "--lake", "s3://bucket/lake", env=env)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "s3://bucket/lake" in lines[0] and "SAASBENCH_S3_ENDPOINT" in lines[0] and "--debug" in lines[0]
    result = invoke("--debug", "rescore", "s1", "--lake", "s3://bucket/lake", env=env)
    assert isinstance(result.exception, LakeStoreError)  # uncaught: the console script prints its traceback
    # --debug also shows the traceback behind an error a command reports itself
    bad = CORPUS / "yaml" / "not-utf8.yaml"
    result = invoke("--debug", "evaluate", "--dag", good_dag(tmp_path), "--base-url", dead_url(), "--auth", bad)
    assert result.exit_code == 2 and "Traceback" in result.output and "not UTF-8" in result.output


def test_error_lines_do_not_depend_on_terminal_width_or_path_length(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 8)
    for columns in ("20", "80", "500"):
        result = invoke("tasks", "show", deep, env={"COLUMNS": columns})
        assert result.exit_code == 2
        assert result.output.count("\n") == 1 and str(deep) in result.output


def test_embedded_prefect_not_starting_names_the_setting_and_no_prefect(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0",  # the server cannot be up in no time
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "saasbench.cli.main", "sweep", "--task", "timetrack", "--agent", "nop"]
        + ["--lake", str(tmp_path / "lake"), "--sweep-id", "prefect-timeout"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)  # our own process group: the CLI and the server it started
            proc.wait()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert len(errors) == 1 and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in errors[0]
    assert "--no-prefect" in errors[0]
