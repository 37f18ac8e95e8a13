"""The base install (``pip install -e .``, no extras) in a fresh venv: every command answers ``--help``,
every documented error path exits with a one-line error (no traceback), a feature that needs an extra
names the install command, and a sweep runs through Prefect (a core dependency)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("base-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    done = subprocess.run([*pip, "-e", str(REPO)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def saasbench(venv: Path, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(
        [str(venv / "bin" / "saasbench"), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def commands(venv: Path) -> list[list[str]]:
    """Every command and subcommand of the installed CLI (read from the app itself)."""
    script = (
        "import json, typer.main; from saasbench.cli.main import app; g = typer.main.get_group(app);"
        "print(json.dumps([[n] if not hasattr(c, 'commands') else [n, s] "
        "for n, c in g.commands.items() for s in (getattr(c, 'commands', None) or [None])]))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, check=True)
    import json

    return [[p for p in cmd if p] for cmd in json.loads(out.stdout)]


def test_the_base_install_has_no_optional_extras(base_venv):
    probe = "import importlib.util as u; print([m for m in ('litellm', 'playwright') if u.find_spec(m)])"
    out = subprocess.run([str(base_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    prefect = subprocess.run([str(base_venv / "bin" / "python"), "-c", "import prefect"], capture_output=True)
    assert prefect.returncode == 0  # a core dependency


def test_every_command_answers_help(base_venv):
    cmds = commands(base_venv)
    assert ["rescore"] in cmds and ["demo"] in cmds and ["tasks", "list"] in cmds and len(cmds) >= 25
    for cmd in cmds:
        res = saasbench(base_venv, *cmd, "--help")
        assert res.returncode == 0 and "Traceback" not in res.stderr + res.stdout, (cmd, res.stderr[-2000:])


def test_documented_error_paths_exit_without_a_traceback(base_venv, tmp_path):
    lake = str(tmp_path / "lake")
    gateway = tmp_path / "gateway.yaml"
    gateway.write_text("models: []\n", encoding="utf-8")
    cases = [
        (
            ["run", "--task", "timetrack", "--agent", "oracle", "--judge-model", "openai/x", "--no-prefect"],
            "'judge' extra",
        ),
        (
            ["sweep", "--task", "timetrack", "--agent", "nop", "--gateway", str(gateway), "--no-prefect"],
            "'gateway' extra",
        ),
        (["evaluate", "--dag", str(tmp_path / "none.json"), "--base-url", "http://127.0.0.1:9"], "error"),
        (
            ["evaluate", "--dag", str(REPO / "tasks/timetrack/dag.json"), "--base-url", "http://127.0.0.1:9"]
            + ["--judge-model", "x"],
            "'judge' extra",
        ),
        (["rescore", "no-such-sweep", "--lake", lake], "not in the lake"),
        (["demo", "--task", "no-such-task", "--no-prefect"], "cannot load demo task"),
        (["run", "--task", "timetrack", "--agent", "oracle", "--backend", "podman"], "unknown backend"),
        (["sweep", "--task", "timetrack", "--agent", "nop", "--sweep-id", "bad id", "--no-prefect"], "invalid sweep"),
        (["dag", "check", str(tmp_path / "none.json")], "cannot read"),
        (["query", "SELECT * FROM nowhere", "--lake", lake], "query failed"),
    ]
    for args, expected in cases:
        res = saasbench(base_venv, *args, cwd=tmp_path)
        out = res.stdout + res.stderr
        assert res.returncode in (1, 2) and "Traceback" not in out, (args, out[-2000:])
        assert expected in " ".join(out.split()), (args, out[-2000:])  # rich wraps long lines


def test_a_sweep_runs_through_prefect_in_the_base_install(base_venv, tmp_path):
    res = saasbench(
        base_venv,
        "sweep",
        "--task",
        "timetrack",
        "--agent",
        "nop",
        "--sweep-id",
        "base-1",
        "--lake",
        str(tmp_path / "lake"),
        cwd=tmp_path,
        timeout=600,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[out.index("Traceback") - 500 :][:4000]
    assert "ran 1 trial(s)" in out
