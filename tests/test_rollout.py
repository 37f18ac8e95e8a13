"""``saasbench rollout`` (saasbench/cli/rollout.py) and its core ``saasbench.runs.trial.run_rollout``.

The command is registered on a private Typer app here (saasbench/cli/main.py registers it with
``app.command("rollout")(rollout_cmd)``). Agents: oracle and nop on the demo task, the builtin
agent against the scripted fake LLM (tests/fake_llm.py), and the Claude Code adapter with a
stand-in CLI that prints a recorded stream-json (tests/test_agent_adapters.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from fake_llm import FakeLLM, Reply
from typer.testing import CliRunner

from saasbench import lake as lakelib
from saasbench.agents.builtin import ENV_API_BASE, ENV_BACKOFF_BASE, ENV_BACKOFF_CAP
from saasbench.agents.claude_code import ClaudeCodeAgent
from saasbench.catalog.tasks import load_task
from saasbench.cli.rollout import rollout_cmd
from saasbench.environments.local import _kill_group, free_port

TASK_DIR = Path(__file__).resolve().parents[1] / "tasks" / "timetrack"
REFERENCE = sorted(
    p.relative_to(TASK_DIR / "reference").as_posix()
    for p in (TASK_DIR / "reference").rglob("*")
    if p.is_file() and "__pycache__" not in p.parts
)


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("rollout")(rollout_cmd)
    app.command("noop")(lambda: None)  # two commands: typer keeps "rollout" as a subcommand name
    return app


def invoke(*args: str):
    result = CliRunner().invoke(cli(), ["rollout", *args], terminal_width=240)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fail the test if anything starts the app or runs the engine."""
    import saasbench.environments.base
    import saasbench.evaluation.engine

    def boom(*a, **k):
        raise AssertionError("a rollout must not start the app or evaluate")

    monkeypatch.setattr(saasbench.environments.base, "start_app", boom)
    monkeypatch.setattr(saasbench.evaluation.engine.Engine, "run", boom)


def call(name: str, args: dict, call_id: str = "c1") -> Reply:
    return Reply.with_message(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }
    )


# --- oracle and nop ---------------------------------------------------------------------------------------
def test_oracle_rollout_keeps_reference_workspace_and_trajectory_without_evaluating(tmp_path, no_evaluation) -> None:
    out = tmp_path / "ro"
    res = invoke("timetrack", "--agent", "oracle", "--out", str(out))
    assert res.exit_code == 0, res.output
    ws = out / "workspace"
    assert files_under(ws) == sorted(REFERENCE + ["task.md", "knowledge_base.json"])
    assert (ws / "app.py").read_bytes() == (TASK_DIR / "reference" / "app.py").read_bytes()
    manifest = json.loads((out / "rollout.json").read_text())
    assert manifest["outcome"] == "completed" and manifest["evaluated"] is False and manifest["steps"] == 1
    assert manifest["budget"] == {"steps": 500, "wall_s": 10800.0, "tool_call_s": 900.0}  # the task's defaults
    traj = json.loads((out / "trajectory.json").read_text())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == [e["kind"] for e in traj["events"]] == ["file_write"]
    assert (out / "prompt.md").read_text().startswith("Mandatory anti-cheat policy.")
    assert not list(out.rglob("report.json"))
    assert "outcome" in res.output and "completed" in res.output and "saasbench evaluate --dag" in res.output
    assert manifest["follow_up"]["evaluate_shell"] in res.output.replace("\n", "")


def test_rolled_out_workspace_scores_with_the_printed_follow_up(tmp_path) -> None:
    """The commands printed after a rollout start the app from the kept workspace and score it."""
    from saasbench.cli.main import app as saasbench_app

    out = tmp_path / "ro"
    assert invoke("timetrack", "--agent", "oracle", "--out", str(out)).exit_code == 0
    follow = json.loads((out / "rollout.json").read_text())["follow_up"]
    port = free_port()  # the task's port 8080 may be taken on this machine
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env |= follow["start_env"] | {"PORT": str(port), "APP_PORT": str(port)}
    proc = subprocess.Popen(
        ["bash", "-c", follow["start_command"]],
        cwd=follow["start_cwd"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = follow["health_url"].replace(":8080", f":{port}")
        for _ in range(600):
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "the app exited"
            time.sleep(0.05)
        else:
            pytest.fail(f"{url} did not answer")
        argv = [a.replace("http://127.0.0.1:8080", f"http://127.0.0.1:{port}") for a in follow["evaluate_argv"]]
        assert argv[:2] == ["saasbench", "evaluate"]
        res = CliRunner().invoke(saasbench_app, argv[1:], terminal_width=200)
        assert res.exit_code == 0, res.output
    finally:
        _kill_group(proc.pid, leader=proc)
    report = json.loads((out / "evaluation" / "report.json").read_text())
    failed = {
        n["id"]: (n["status"], n["message"]) for n in report["nodes"] if n["status"] not in ("PASSED", "SKIPPED_LLM")
    }
    # the printed command carries --exec local:<workspace> and the app's variables, so P12 runs too
    assert "--exec" in follow["evaluate_argv"]
    assert failed == {}
    assert report["summary"]["deterministic_score"] == 100


def test_nop_rollout(tmp_path, no_evaluation) -> None:
    out = tmp_path / "nop"
    res = invoke(
        "timetrack", "--agent", "nop", "--out", str(out), "--max-steps", "7", "--wall-s", "30", "--tool-timeout-s", "5"
    )
    assert res.exit_code == 0, res.output
    assert files_under(out / "workspace") == ["knowledge_base.json", "task.md"]
    manifest = json.loads((out / "rollout.json").read_text())
    assert manifest["outcome"] == "completed" and manifest["steps"] == 0 and manifest["tokens_in"] == 0
    assert manifest["budget"] == {"steps": 7, "wall_s": 30.0, "tool_call_s": 5.0}
    assert manifest["cheat_findings"] == [] and manifest["integrity_findings"] == []


def test_rollout_cannot_run(tmp_path) -> None:
    assert invoke("no-such-task", "--agent", "nop").exit_code == 2
    assert invoke("timetrack", "--agent", "no-such-agent", "--out", str(tmp_path / "a")).exit_code == 2
    assert invoke("timetrack", "--agent", "nop", "--backend", "vm").exit_code == 2
    (tmp_path / "b" / "workspace").mkdir(parents=True)
    (tmp_path / "b" / "workspace" / "old.txt").write_text("x")
    res = invoke("timetrack", "--agent", "nop", "--out", str(tmp_path / "b"))
    assert res.exit_code == 2 and "not empty" in " ".join(res.output.split())  # rich wraps at any width


# --- the builtin agent against the fake LLM ---------------------------------------------------------------
@pytest.fixture
def llm(monkeypatch):
    with FakeLLM() as server:
        monkeypatch.setenv(ENV_API_BASE, server.base_url)
        monkeypatch.setenv(ENV_BACKOFF_BASE, "0.001")
        monkeypatch.setenv(ENV_BACKOFF_CAP, "0.01")
        yield server


def test_builtin_rollout_prints_steps_and_tokens_and_records_in_lake(tmp_path, llm, no_evaluation) -> None:
    llm.queue(
        call("shell", {"command": "echo hi > hello.txt && ls"}, "c1"),
        call("write_file", {"path": "notes/plan.md", "content": "# plan\n"}, "c2"),
        call("finish", {"summary": "done"}, "c3"),
    )
    out, lake = tmp_path / "ro", tmp_path / "lake"
    # a model litellm knows the price of, served by the fake server: the cost is not zero
    res = invoke(
        "timetrack",
        "--agent",
        "builtin",
        "--model",
        "openai/gpt-4o-mini",
        "--max-steps",
        "10",
        "--out",
        str(out),
        "--lake",
        str(lake),
    )
    assert res.exit_code == 0, res.output
    assert re.search(r"step +1 shell echo hi > hello\.txt", res.output) and re.search(
        r"step +2 write_file notes/plan\.md", res.output
    )
    assert len(re.findall(r"model turn \d+: \d+ in / \d+ out", res.output)) == 3
    m = re.search(r"tokens in / out\s*│\s*(\d+) / (\d+)", res.output)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, res.output
    manifest = json.loads((out / "rollout.json").read_text())
    assert (manifest["tokens_in"], manifest["tokens_out"]) == (int(m.group(1)), int(m.group(2)))
    assert manifest["steps"] == 3 and manifest["cost_usd"] > 0 and manifest["model"] == "openai/gpt-4o-mini"
    assert f"${manifest['cost_usd']:.6f}" in res.output
    assert (out / "workspace" / "hello.txt").read_text() == "hi\n"
    assert (out / "workspace" / "notes" / "plan.md").read_text() == "# plan\n"
    assert len(llm.chat_requests) == 3

    trial = lakelib.query(str(lake), "SELECT * FROM trials").to_pylist()
    assert len(trial) == 1
    t = trial[0]
    assert (
        t["sweep_id"] == "rollout-timetrack-builtin"
        and t["outcome"] == "completed"
        and t["model"] == "openai/gpt-4o-mini"
    )
    assert (t["steps"], t["tokens_in"], t["tokens_out"]) == (3, manifest["tokens_in"], manifest["tokens_out"])
    assert t["cost_usd"] == pytest.approx(manifest["cost_usd"]) and t["task_score"] is None
    assert t["report_uri"] == str(out / "rollout.json") and "not evaluated" in t["outcome_detail"]
    events = lakelib.query(str(lake), "SELECT kind, tool, tokens_in FROM trajectory_events ORDER BY seq").to_pylist()
    assert len(events) == len(json.loads((out / "trajectory.json").read_text())["events"])
    assert [e["tool"] for e in events if e["kind"] == "tool_call"] == ["shell", "write_file", "finish"]
    assert sum(e["tokens_in"] or 0 for e in events if e["kind"] == "model_call") == manifest["tokens_in"]
    assert lakelib.query(str(lake), "SELECT count(*) AS n FROM node_results").to_pylist() == [{"n": 0}]


def test_budget_options_override_the_task(tmp_path, llm, no_evaluation) -> None:
    llm.responder = lambda req: call("shell", {"command": "sleep 30"})
    out = tmp_path / "ro"
    res = invoke(
        "timetrack",
        "--agent",
        "builtin",
        "--model",
        "openai/fake",
        "--max-steps",
        "2",
        "--tool-timeout-s",
        "0.3",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "rollout.json").read_text())
    assert manifest["outcome"] == "agent_budget_exceeded" and manifest["steps"] == 2
    assert manifest["budget"]["tool_call_s"] == 0.3 and manifest["budget"]["steps"] == 2
    results = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["timed_out"] for e in results if e["kind"] == "tool_result"] == [True, True]
    assert "agent_budget_exceeded" in res.output


# --- a CLI agent: raw stream kept, a cheating stream voided ------------------------------------------------
CHEAT_STREAM = [
    {"type": "system", "subtype": "init", "cwd": "/ws", "model": "claude-sonnet-4-5"},
    {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "Write",
                    "input": {
                        "file_path": "WS/setup.sh",
                        "content": "#!/bin/sh\nset -e\ngit clone --depth 1 https://github.com/acme/timetracker vendor\ncp -r vendor/* .\n",
                    },
                }
            ],
            "usage": {"input_tokens": 100, "output_tokens": 1},
        },
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "File created"}],
        },
    },
    {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "t2",
                    "name": "Bash",
                    "input": {"command": "cd WS && bash setup.sh", "description": "set up"},
                }
            ],
            "usage": {"input_tokens": 120, "output_tokens": 1},
        },
    },
    {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "Cloning..."}]},
    },
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 3,
        "result": "done",
        "usage": {"input_tokens": 300, "output_tokens": 40},
        "total_cost_usd": 0.0015,
    },
]

STANDIN = r"""#!{python}
import os, sys
ws = os.getcwd()
for line in open({stream!r}):
    sys.stdout.write(line.replace("WS", ws))
"""


class StandinClaude(ClaudeCodeAgent):
    """Claude Code with a stand-in ``claude`` that prints a recorded stream (no npm install)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, bin_dir=os.environ["TEST_STANDIN_BIN"], **kwargs)

    def install_command(self) -> str:
        return "true"

    def version_command(self) -> str:
        return ""


def test_cli_agent_rollout_keeps_raw_stream_and_voids_a_cloning_script(tmp_path, monkeypatch, no_evaluation) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stream = bin_dir / "stream.jsonl"  # beside the CLI: the local sandbox shows the agent's install folder only
    stream.write_text("".join(json.dumps(o) + "\n" for o in CHEAT_STREAM))
    exe = bin_dir / "claude"
    exe.write_text(STANDIN.format(python=sys.executable, stream=str(stream)))
    exe.chmod(0o755)
    monkeypatch.setenv("TEST_STANDIN_BIN", str(bin_dir))
    out, lake = tmp_path / "ro", tmp_path / "lake"
    res = invoke(
        "timetrack",
        "--agent",
        "test_rollout:StandinClaude",
        "--model",
        "claude-sonnet-4-5",
        "--out",
        str(out),
        "--lake",
        str(lake),
        "--sweep-id",
        "my-rollouts",
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "rollout.json").read_text())
    assert manifest["outcome"] == "voided_cheat" and manifest["exit_reason"] == "completed"
    assert (manifest["tokens_in"], manifest["tokens_out"], manifest["cost_usd"]) == (300, 40, 0.0015)
    [finding] = [f for f in manifest["cheat_findings"] if f["severity"] == "void"]
    assert finding["rule"] == "git_clone" and finding["source"].endswith("/workspace/setup.sh")
    assert "github.com/acme/timetracker" in finding["evidence"] and finding["detail"]["via"] == "Write"
    raw = Path(manifest["artefacts"]["events"])
    assert raw.is_file() and raw.parent.parent == out / "agent" and raw.name == "claude_events.jsonl"
    assert '"name": "Write"' in raw.read_text()  # the raw stream as the CLI printed it
    assert re.search(r"anti-cheat git_clone \(void\)", res.output) and "voided_cheat" in res.output
    t = lakelib.query(
        str(lake), "SELECT outcome, outcome_detail, valid FROM trials WHERE sweep_id = 'my-rollouts'"
    ).to_pylist()
    assert t[0]["outcome"] == "voided_cheat" and "git_clone" in t[0]["outcome_detail"]
    ac = lakelib.query(
        str(lake), "SELECT content, data_json FROM trajectory_events WHERE kind = 'anticheat'"
    ).to_pylist()
    assert len(ac) == 1 and "git clone" in ac[0]["content"] and json.loads(ac[0]["data_json"])["rule"] == "git_clone"


def test_run_rollout_core_writes_and_reuses_the_trial_path(tmp_path) -> None:
    """run_rollout is the first half of run_local_trial: same prompt staging, same budget, same scan."""
    from saasbench.runs.trial import run_rollout, task_budget

    task = load_task("timetrack")
    seen = []
    ro = run_rollout(task, "oracle", out_dir=tmp_path / "ro", budget=task_budget(task, steps=3), on_event=seen.append)
    assert ro.outcome == "completed" and ro.budget.steps == 3 and ro.out_dir == str((tmp_path / "ro").resolve())
    assert [e.kind for e in seen] == ["file_write"]  # live events
    assert Path(ro.workspace) == (tmp_path / "ro" / "workspace").resolve() and (Path(ro.workspace) / "run.sh").is_file()
    assert ro.follow_up["start_command"] == "bash run.sh"


def test_model_reaches_every_agent_that_takes_one() -> None:
    """``--model`` of rollout/run/sweep: given to the builtin and CLI agents, ignored by oracle/nop."""
    from saasbench.runs.trial import resolve_agent

    for name in ("builtin", "claude-code", "codex", "openhands"):
        assert resolve_agent(name, "provider/m-1").model == "provider/m-1", name
    assert resolve_agent("oracle", "provider/m-1").name == "oracle" and resolve_agent("nop", None).name == "nop"
    assert resolve_agent("claude-code").model == ClaudeCodeAgent.default_model
