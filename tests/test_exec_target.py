"""Exec targets: ``saasbench evaluate --exec local:DIR|docker:CONTAINER --exec-env ... --exec-env-file ...``
run P12/P21 next to an app saasbench did not start; without one, P12/P21 nodes are ERROR naming
``--exec``; a task's declared ``exec_env``/``exec_env_file`` reach P12 commands in a trial."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml
from localhttp import serve_http
from typer.testing import CliRunner

from saasbench.catalog.tasks import TaskError, load_task
from saasbench.cli.main import app
from saasbench.environments.exec_target import ExecTargetError, LocalExecTarget, parse_env_assignments

WIDE = {"COLUMNS": "220", "NO_COLOR": "1", "TERM": "dumb"}


def invoke(*args: Any, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], env=WIDE | (env or {}))


def p12(node_id: str, command: str, **expect: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": [],
        "steps": [{"type": "P12", "inputs": {"command": command, **expect}}],
        "scoring": {"category": "Deployment", "method": "binary", "maxScore": 1},
    }


def p21(node_id: str, log_path: str, pattern: str) -> dict[str, Any]:
    return {
        "id": node_id,
        "prereqs": [],
        "steps": [{"type": "P21", "inputs": {"log_path": log_path, "pattern": pattern}}],
        "scoring": {"category": "Deployment", "method": "binary", "maxScore": 1},
    }


def write_dag(path: Path, nodes: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"meta": {"task_id": "exec_fixture"}, "nodes": nodes}))
    return path


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    with serve_http(_Ok) as url:
        yield url


def evaluate(
    tmp_path: Path, base_url: str, nodes: list[dict[str, Any]], *extra: Any, env: dict[str, str] | None = None
):
    out = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
    dag = write_dag(tmp_path / f"dag-{uuid.uuid4().hex[:6]}.json", nodes)
    res = invoke("evaluate", "--dag", dag, "--base-url", base_url, "--out", out, *extra, env=env)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return res, report


def statuses(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {n["id"]: (n["status"], n["message"]) for n in report["nodes"]}


# --- local -----------------------------------------------------------------------------------------
def test_local_exec_env_cwd_and_log(tmp_path: Path, base_url: str) -> None:
    appdir = tmp_path / "appdir"
    (appdir / "log").mkdir(parents=True)
    (appdir / "log" / "app.log").write_text("booting\nserver started on 8000\n")
    real = os.path.realpath(appdir)
    res, report = evaluate(
        tmp_path,
        base_url,
        [
            p12("ECHO", "echo $FOO; pwd", expect_output_contains="bar-value-1"),
            p12("CWD", "pwd -P", expect_output_contains=real),
            p21("LOG", "log/app.log", "server started"),
            p21("LOG_MISSING", "log/none.log", "x"),
        ],
        "--exec",
        f"local:{appdir}",
        "--exec-env",
        "FOO=bar-value-1",
    )
    assert res.exit_code == 0, res.output
    got = statuses(report)
    assert {k: v[0] for k, v in got.items()} == {
        "ECHO": "PASSED",
        "CWD": "PASSED",
        "LOG": "PASSED",
        "LOG_MISSING": "FAILED",
    }, got
    assert "not found" in got["LOG_MISSING"][1]
    # the target and the variable NAMES are recorded, never the values
    assert report["options"]["exec"] == {"kind": "local", "dir": real, "env_names": ["FOO"]}
    assert "bar-value-1" not in json.dumps(report["options"])


def test_exec_env_file_export_lines_quotes_and_expansion(tmp_path: Path, base_url: str) -> None:
    appdir = tmp_path / "appdir"
    appdir.mkdir()
    env_file = tmp_path / "env.sh"
    env_file.write_text(
        "# a shell env file, parsed, never run\n"
        'export A="x y"\n'
        "export B=1 C=2\n"
        "D='$A literal'\n"
        'E="${A}-$B" # trailing comment\n'
        'export PATH="/opt/nowhere/bin:$PATH"\n'
        "\n"
    )
    res, report = evaluate(
        tmp_path,
        base_url,
        [
            p12(
                "VARS",
                'printf \'%s|%s|%s|%s|%s\' "$A" "$B" "$C" "$D" "$E"',
                expect_output_contains="x y|9|2|$A literal|x y-1",
            ),
            p12("PATH", 'printf "%s" "$PATH"', expect_output_contains="/opt/nowhere/bin:" + os.environ["PATH"]),
        ],
        "--exec",
        f"local:{appdir}",
        "--exec-env-file",
        env_file,
        "--exec-env",
        "B=9",
    )  # --exec-env wins over the file
    assert res.exit_code == 0, res.output
    assert {k: v[0] for k, v in statuses(report).items()} == {"VARS": "PASSED", "PATH": "PASSED"}, statuses(report)
    assert report["options"]["exec"]["env_names"] == ["A", "B", "C", "D", "E", "PATH"]


def test_env_file_is_parsed_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    assert parse_env_assignments('export X=1 Y=$X\nZ="a\\$b"', {}) == {"X": "1", "Y": "1", "Z": "a$b"}
    with pytest.raises(ExecTargetError, match=r"<env>:2: not a K=V assignment"):
        parse_env_assignments(f"A=1\ntouch {marker}\n")
    bad = tmp_path / "bad.env"
    bad.write_text(f"A=1\ntouch {marker}\n")
    res = invoke(
        "evaluate",
        "--dag",
        write_dag(tmp_path / "d.json", [p12("N", "true")]),
        "--base-url",
        "http://127.0.0.1:9",
        "--out",
        tmp_path / "o",
        "--exec",
        f"local:{tmp_path}",
        "--exec-env-file",
        bad,
    )
    assert res.exit_code == 2 and "not a K=V assignment" in res.output
    assert not marker.exists()


def test_without_exec_p12_and_p21_are_error_naming_the_option(tmp_path: Path, base_url: str) -> None:
    res, report = evaluate(tmp_path, base_url, [p12("EXEC", "true"), p21("LOG", "log/app.log", "x")])
    assert res.exit_code == 0, res.output
    got = statuses(report)
    assert (
        got["EXEC"][0] == "ERROR"
        and "P12 needs an exec target: pass --exec local:DIR or --exec docker:CONTAINER" in got["EXEC"][1]
    )
    assert got["LOG"][0] == "ERROR" and "--exec" in got["LOG"][1]
    assert "exec" not in report["options"]


def test_bad_exec_options_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dag = write_dag(tmp_path / "d.json", [p12("N", "true")])
    common = ["evaluate", "--dag", dag, "--base-url", "http://127.0.0.1:9", "--out", tmp_path / "o"]
    res = invoke(*common, "--exec", f"local:{tmp_path / 'missing'}")
    assert res.exit_code == 2 and "does not exist or is not a directory" in res.output
    res = invoke(*common, "--exec", "ssh:host")
    assert res.exit_code == 2 and "expected local:DIR or docker:CONTAINER" in res.output
    res = invoke(*common, "--exec", f"local:{tmp_path}", "--exec-env", "NOEQUALS")
    assert res.exit_code == 2 and "expected NAME=VALUE" in res.output
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # DOCKER_HOST is respected
    res = invoke(*common, "--exec", "docker:anything")
    assert res.exit_code == 2 and "cannot reach the Docker engine" in res.output and "no-engine.sock" in res.output
    assert not (tmp_path / "o" / "report.json").exists()


def test_harness_secrets_do_not_reach_local_commands(
    tmp_path: Path, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-harness-secret")
    monkeypatch.setenv("SOME_TOKEN", "tok-harness-secret")
    monkeypatch.setenv("UNLISTED_VAR", "harness-only")
    res, report = evaluate(
        tmp_path,
        base_url,
        [
            p12("NO_LEAK", "env", expect_output_regex=r"\AHOME=|\nHOME=|PATH="),
            p12("GIVEN", 'printf "%s" "$GIVEN_API_KEY"', expect_output_contains="explicit-value"),
        ],
        "--exec",
        f"local:{tmp_path}",
        "--exec-env",
        "GIVEN_API_KEY=explicit-value",
    )
    assert res.exit_code == 0, res.output
    assert {k: v[0] for k, v in statuses(report).items()} == {"NO_LEAK": "PASSED", "GIVEN": "PASSED"}
    printed = next(n for n in report["nodes"] if n["id"] == "NO_LEAK")["steps"][0]["evidence"]["stdout"]
    for leaked in ("sk-harness-secret", "tok-harness-secret", "harness-only", "OPENAI_API_KEY"):
        assert leaked not in printed
    assert "PATH=" in printed
    # the direct API too: only the allowlist, secret-looking names dropped even from it
    target = LocalExecTarget(tmp_path)
    assert "OPENAI_API_KEY" not in target.command_env() and target.command_env({"X": "1"})["X"] == "1"


def test_local_target_timeout_and_output_cap(tmp_path: Path) -> None:
    target = LocalExecTarget(tmp_path)
    r = target.exec("echo started; sleep 30", timeout_s=0.5)
    assert r.timed_out and r.exit_code == 124 and r.stdout == "started\n"
    r = target.exec("head -c 2000000 /dev/zero | tr '\\0' x", timeout_s=30)
    assert r.truncated and len(r.stdout) == 1024 * 1024 and r.exit_code == 0


# --- docker ----------------------------------------------------------------------------------------
def test_docker_exec_target(
    tmp_path: Path, base_url: str, docker_client, busybox_image, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_client.saasbench_base_url)
    name = f"sbexec-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        busybox_image, ["sh", "-c", "echo container-up; exec sleep 600"], detach=True, name=name
    )
    try:
        env_file = tmp_path / "env.sh"
        env_file.write_text('export PATH="/opt/x/bin:$PATH"\n')  # expands against the container's PATH (/bin)
        res, report = evaluate(
            tmp_path,
            base_url,
            [
                p12("WRITE_READ", "echo hi > /tmp/x && cat /tmp/x", expect_output_contains="hi"),
                p12("ENV", 'echo "$FOO|$PATH"', expect_output_contains="bar|/opt/x/bin:/bin"),
                p21("CONTAINER_LOG", "app", "container-up"),
                p21("FILE_LOG", "/tmp/x", "hi"),
            ],
            "--exec",
            f"docker:{name}",
            "--exec-env",
            "FOO=bar",
            "--exec-env-file",
            env_file,
        )
        assert res.exit_code == 0, res.output
        got = statuses(report)
        assert {k: v[0] for k, v in got.items()} == {
            "WRITE_READ": "PASSED",
            "ENV": "PASSED",
            "CONTAINER_LOG": "PASSED",
            "FILE_LOG": "PASSED",
        }, got
        assert report["options"]["exec"] == {
            "kind": "docker",
            "container": name,
            "shell": "sh",
            "env_names": ["FOO", "PATH"],
        }
        # the command really ran in the container: the file is there, not on this host
        assert container.exec_run(["cat", "/tmp/x"]).output == b"hi\n"

        res, _ = evaluate(tmp_path, base_url, [p12("N", "true")], "--exec", f"docker:{name}-missing")
        assert res.exit_code == 2 and f"no container named '{name}-missing'" in res.output
        container.stop(timeout=0)
        res, _ = evaluate(tmp_path, base_url, [p12("N", "true")], "--exec", f"docker:{name}")
        assert res.exit_code == 2 and "not running" in res.output
    finally:
        container.remove(force=True)


# --- a task's declared exec variables, in a trial ----------------------------------------------------
def test_task_exec_env_reaches_p12_in_a_trial(tmp_path: Path) -> None:
    from test_environment_local import make_task

    from saasbench.runs.trial import run_local_trial

    task = make_task(
        tmp_path / "tasks",
        extra_nodes=[
            p12(
                "EXEC_ENV",
                'printf \'%s|%s|%s\' "$TASK_VAR" "$FROM_FILE" "$NUM"',
                expect_output_contains="declared|file-value|5",
            ),
            # $APP_PORT in the file expands against the trial environment's variables (a free port)
            p12("EXPANDED", 'test -n "$P" && test "$P" = "port-$APP_PORT" && echo same', expect_output_contains="same"),
        ],
    )
    spec = yaml.safe_load((task.root / "task.yaml").read_text())
    spec |= {"exec_env": {"TASK_VAR": "declared", "NUM": 5}, "exec_env_file": "exec.env"}
    (task.root / "task.yaml").write_text(yaml.safe_dump(spec))
    (task.root / "exec.env").write_text('export FROM_FILE="file-value"\nexport P="port-$APP_PORT"\n')
    task = load_task(task.root)
    assert task.spec.exec_env == {"TASK_VAR": "declared", "NUM": "5"}
    result = run_local_trial(task, "oracle")
    got = {n.id: (n.status.value, n.message) for n in result.report.nodes}
    assert got["EXEC_ENV"][0] == "PASSED" and got["EXPANDED"][0] == "PASSED", got
    assert result.report.options["exec"] == {"kind": "local", "env_names": ["FROM_FILE", "NUM", "P", "TASK_VAR"]}

    spec["exec_env_file"] = "../outside.env"
    (tmp_path / "tasks" / "outside.env").write_text("A=1\n")
    (task.root / "task.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(TaskError, match="outside the task folder"):
        load_task(task.root)


def test_shell_variables_are_the_shell_s_and_placeholders_are_quoted(tmp_path: Path, base_url: str) -> None:
    """``${TARGET_APP_CLI:-app}`` (jtbxfpny) is expanded by bash from the exec variables, not by the
    engine; a ``{{value}}`` spliced into a command is shell-quoted, so it stays one argument."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "mycli").write_text('#!/bin/sh\necho "cli:$1"\n')
    (workdir / "mycli").chmod(0o755)
    nodes = [
        p12("CLI_FROM_ENV", "${TARGET_APP_CLI:-app} db-upgrade", expect_output_contains="cli:db-upgrade"),
        p12("DEFAULT_WHEN_UNSET", "echo ${UNSET_THING:-fallback}", expect_output_contains="fallback"),
        p12("QUOTED", "printf '[%s]' {{hostile}}", expect_output_contains="[a b; touch pwned]"),
    ]
    res, report = evaluate(
        tmp_path,
        base_url,
        nodes,
        "--exec",
        f"local:{workdir}",
        "--exec-env",
        f"TARGET_APP_CLI={workdir / 'mycli'}",
        "--var",
        "hostile=a b; touch pwned",
    )
    assert res.exit_code == 0, res.output
    assert {i: status for i, (status, _) in statuses(report).items()} == dict.fromkeys(
        (n["id"] for n in nodes), "PASSED"
    ), statuses(report)
    assert not (workdir / "pwned").exists()


def test_meta_env_defaults_reach_the_command(tmp_path: Path, base_url: str) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    dag = tmp_path / "dag.json"
    dag.write_text(
        json.dumps(
            {
                "meta": {"env_defaults": {"GREETING": "from-meta"}},
                "nodes": [p12("META", "echo $GREETING", expect_output_contains="from-meta")],
            }
        )
    )
    out = tmp_path / "out"
    res = invoke("evaluate", "--dag", dag, "--base-url", base_url, "--out", out, "--exec", f"local:{workdir}")
    assert res.exit_code == 0, res.output
    node = json.loads((out / "report.json").read_text())["nodes"][0]
    assert node["status"] == "PASSED", node["message"]


def test_p12_result_is_the_document_a_following_p07_reads(tmp_path: Path, base_url: str) -> None:
    """mjobbzsi asserts ``$.output_int`` after ``... | wc -l``: P12's result, not a stale response."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    node = {
        "id": "COUNT",
        "prereqs": [],
        "scoring": {"category": "Deployment", "method": "binary", "maxScore": 1},
        "steps": [
            {"type": "P04", "inputs": {"method": "GET", "path": "/"}},
            {"type": "P12", "inputs": {"command": "printf 'a\\nb\\nc\\n' | wc -l"}},
            {
                "type": "P07",
                "inputs": {
                    "assertions": [{"path": "$.output_int", "expected": 3}, {"path": "$.exit_code", "expected": 0}]
                },
            },
        ],
    }
    res, report = evaluate(tmp_path, base_url, [node], "--exec", f"local:{workdir}")
    assert res.exit_code == 0, res.output
    assert statuses(report)["COUNT"][0] == "PASSED", statuses(report)
