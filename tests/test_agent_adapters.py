"""CLI agent adapters: stream parsing (recorded samples), command lines, and run() plumbing with stand-in CLIs.

The stand-in CLI is a small Python script named ``claude``/``codex``/``openhands`` on the
adapter's PATH inside a :class:`LocalEnvironment`: it dumps its argv and environment to files
outside the workspace, writes a file into the workspace, prints a recorded event stream and exits
(or sleeps, to hit the wall-clock budget).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from shared_data import CONFORMANCE_DIR  # noqa: E402

from saasbench.agents.base import Budget, Trajectory, get_agent
from saasbench.agents.claude_code import ALLOWED_TOOLS, ClaudeCodeAgent
from saasbench.agents.codex import CodexAgent
from saasbench.agents.events import (
    AgentInstallError,
    apply_events,
    parse_stream,
    to_shell,
)
from saasbench.agents.openhands import OpenHandsAgent
from saasbench.environments.local import LocalEnvironment

SAMPLES = CONFORMANCE_DIR.parents[1] / "reference" / "agent-samples"


def sample(fmt: str) -> str:
    path = SAMPLES / f"{fmt}_events.jsonl"
    assert path.is_file(), f"recorded sample {path} not available (the shared folder must sit beside the checkout)"
    return path.read_text(encoding="utf-8")


# --- parsing the recorded streams ---------------------------------------------------------------------
def test_parse_claude_sample() -> None:
    events, totals = parse_stream("claude", sample("claude"))
    kinds = [e.kind for e in events]
    assert kinds.count("tool_call") == 1 and kinds.count("tool_result") == 1 and kinds.count("message") == 1
    assert kinds.count("usage") == 3  # two per-message usages and the final run totals
    call = next(e for e in events if e.kind == "tool_call")
    assert call.tool == "Bash" and call.args["command"] == "echo hello > /tmp/agentfeas/ws/out.txt"
    result = next(e for e in events if e.kind == "tool_result")
    assert result.tool == "Bash" and result.call_id == call.call_id and "no output" in result.content
    assert totals.steps == 1 and totals.turns == 2
    # the final result's usage, not the sum of per-message usage (output 1 each)
    assert (totals.tokens_in, totals.tokens_out) == (246, 90)
    assert totals.cost_usd == pytest.approx(0.002088)
    assert totals.exit_reason == "completed" and totals.error is None
    assert totals.final_text == "Done: the file was created." and totals.parse_errors == 0


def test_parse_codex_sample() -> None:
    events, totals = parse_stream("codex", sample("codex"))
    kinds = [e.kind for e in events]
    assert kinds == ["error", "tool_call", "tool_result", "message", "usage"]
    assert not events[0].is_error  # the "model metadata not found" item is a warning, not fatal
    call = events[1]
    assert call.tool == "shell" and call.args == {"command": "/bin/bash -lc 'echo hi > out.txt'"}
    assert events[2].content.startswith("exit 0") and not events[2].is_error
    assert totals.steps == 1 and totals.turns == 1
    assert (totals.tokens_in, totals.tokens_out) == (246, 90)
    assert totals.cost_usd is None  # Codex reports no cost
    assert totals.exit_reason == "completed"


def test_parse_openhands_sample() -> None:
    events, totals = parse_stream("openhands", sample("openhands"))
    assert [(e.kind, e.role) for e in events] == [
        ("message", "user"),
        ("tool_call", "assistant"),
        ("tool_result", "tool"),
        ("message", "assistant"),
    ]
    call = events[1]
    assert call.tool == "terminal" and call.args == {"command": "echo hello > out.txt", "security_risk": "LOW"}
    assert events[2].tool == "terminal" and events[2].content.startswith("exit 0")
    assert totals.steps == 1 and totals.exit_reason == "completed"
    assert (totals.tokens_in, totals.tokens_out) == (0, 0)  # this CLI's stream carries no usage


def test_openhands_metrics_and_errors() -> None:
    lines = [
        {
            "kind": "ActionEvent",
            "source": "agent",
            "tool_name": "terminal",
            "tool_call": {"arguments": '{"command": "ls"}'},
            "metrics": {
                "accumulated_cost": 0.5,
                "accumulated_token_usage": {"prompt_tokens": 100, "completion_tokens": 10},
            },
        },
        {
            "kind": "ActionEvent",
            "source": "agent",
            "tool_name": "terminal",
            "tool_call": {"arguments": "not json"},
            "metrics": {
                "accumulated_cost": 0.75,
                "accumulated_token_usage": {"prompt_tokens": 300, "completion_tokens": 30},
            },
        },
        {"kind": "AgentErrorEvent", "source": "agent", "error": "Agent reached maximum iteration 500"},
    ]
    _, totals = parse_stream("openhands", "\n".join(json.dumps(x) for x in lines))
    assert totals.steps == 2 and (totals.tokens_in, totals.tokens_out) == (300, 30) and totals.cost_usd == 0.75
    assert totals.exit_reason == "agent_budget_exceeded"
    _, totals = parse_stream(
        "openhands", json.dumps({"kind": "ConversationStateUpdateEvent", "key": "execution_status", "value": "stuck"})
    )
    assert totals.exit_reason == "agent_error"


@pytest.mark.parametrize(
    ("subtype", "reason"),
    [("error_max_turns", "agent_budget_exceeded"), ("error_during_execution", "agent_error"), ("success", "completed")],
)
def test_claude_result_subtypes(subtype: str, reason: str) -> None:
    line = {
        "type": "result",
        "subtype": subtype,
        "is_error": subtype != "success",
        "num_turns": 7,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 3},
        "total_cost_usd": 0.1,
    }
    _, totals = parse_stream("claude", json.dumps(line))
    assert totals.exit_reason == reason and totals.tokens_in == 15 and totals.tokens_out == 3 and totals.turns == 7
    assert (totals.error is None) == (reason == "completed")


def test_codex_turn_failed_and_usage_over_turns() -> None:
    lines = [
        {"type": "turn.started"},
        {"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 2}},
        {"type": "turn.started"},
        {"type": "error", "message": "stream disconnected"},
        {"type": "turn.failed", "error": {"message": "unexpected status 401"}},
    ]
    events, totals = parse_stream("codex", "\n".join(json.dumps(x) for x in lines))
    assert totals.exit_reason == "agent_error" and "401" in (totals.error or "")
    assert (totals.tokens_in, totals.tokens_out, totals.turns) == (5, 2, 2)
    assert [e.kind for e in events].count("error") == 2


@pytest.mark.parametrize("fmt", ["claude", "codex", "openhands"])
def test_malformed_lines_never_crash(fmt: str) -> None:
    good = sample(fmt).splitlines()
    bad = [
        "not json at all",
        "[1, 2, 3]",
        '"a string"',
        "{truncated",
        "null",
        json.dumps({"type": "assistant", "message": "a string, not an object"}),
        json.dumps({"type": "assistant", "message": {"content": [1, None, {"type": "text"}, {"type": "tool_result"}]}}),
        json.dumps({"type": "item.completed", "item": None}),
        json.dumps({"kind": "ObservationEvent", "observation": "text"}),
        json.dumps({"type": "result", "usage": "nope"}),
        "\x00\xff garbage",
    ]
    text = "\n".join(good[:1] + bad + good[1:])
    events, totals = parse_stream(fmt, text)
    _, clean = parse_stream(fmt, "\n".join(good))
    assert totals.parse_errors >= 5
    parse_errs = [e for e in events if e.parse_error]
    assert len(parse_errs) == totals.parse_errors and all(e.kind == "error" for e in parse_errs)
    assert totals.steps == clean.steps and totals.exit_reason == clean.exit_reason
    assert (totals.tokens_in, totals.tokens_out) == (clean.tokens_in, clean.tokens_out)


def test_content_is_capped_and_secrets_redacted() -> None:
    big = "x" * 50_000
    line = {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "content": [
                {"type": "text", "text": big},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "echo sk-secret-123 " + big}},
            ],
        },
    }
    events, _ = parse_stream("claude", json.dumps(line))
    assert all(len(e.content) < 4100 for e in events)
    traj = Trajectory(agent="t")
    apply_events(traj, events, ("sk-secret-123",))
    dumped = traj.model_dump_json()
    assert "sk-secret-123" not in dumped and "[REDACTED]" in dumped
    assert traj.events[1].kind == "tool_call" and traj.events[1].data["tool"] == "Bash"


@pytest.mark.parametrize(
    ("fmt", "command"),
    [
        ("claude", "echo hello > /tmp/agentfeas/ws/out.txt"),
        ("codex", "/bin/bash -lc 'echo hi > out.txt'"),
        ("openhands", "echo hello > out.txt"),
    ],
)
def test_shell_commands_are_visible_to_the_anticheat_scan(fmt: str, command: str) -> None:
    import saasbench.agents.anticheat as anticheat

    traj = Trajectory(agent=fmt)
    apply_events(traj, parse_stream(fmt, sample(fmt))[0])
    assert [cmd for _, cmd in anticheat.shell_commands(traj)] == [command]


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown stream format"):
        parse_stream("aider", "{}")


# --- command lines ----------------------------------------------------------------------------------------
def test_claude_command_line() -> None:
    argv = ClaudeCodeAgent().command("/run/prompt.md", "claude-sonnet-4-5", "/ws")
    assert argv == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "claude-sonnet-4-5",
        "--permission-mode",
        "bypassPermissions",
        "--allowedTools",
        "Bash,Edit,Write,Read,Glob,Grep,LS,WebFetch,NotebookEdit,NotebookRead,TodoRead,TodoWrite",
        "--add-dir",
        "/ws",
        "--",
        '"$(cat /run/prompt.md)"',
    ]
    assert len(ALLOWED_TOOLS) == 12
    assert to_shell(argv).endswith('--add-dir /ws -- "$(cat /run/prompt.md)"')


def test_codex_command_line() -> None:
    argv = CodexAgent().command("/run dir/prompt.md", "gpt-5", "/ws")
    assert argv == [
        "codex",
        "exec",
        "--model",
        "gpt-5",
        "--json",
        "--sandbox",
        "danger-full-access",
        "--skip-git-repo-check",
        "--",
        "\"$(cat '/run dir/prompt.md')\"",
    ]


def test_openhands_command_line_and_config() -> None:
    agent = OpenHandsAgent(model="gpt-5", base_url="http://gw/v1")
    assert agent.command("/r/p.md", "gpt-5", "/ws") == [
        "openhands",
        "--headless",
        "--json",
        "--override-with-envs",
        "-t",
        '"$(cat /r/p.md)"',
    ]
    toml = agent.config_toml(Budget())
    for line in (
        "max_iterations = 500",
        'default_agent = "CodeActAgent"',
        "enable_mcp = false",
        "temperature = 0.0",
        "num_retries = 5",
        "retry_min_wait = 10",
        "retry_max_wait = 60",
        "timeout = 900",
        'model = "openai/gpt-5"',
    ):
        assert line in toml
    assert "max_iterations = 42" in agent.config_toml(Budget(steps=42))
    env = agent.process_env("/r", "k", Budget(steps=42))
    assert env["LLM_BASE_URL"] == "http://gw/v1" and env["LLM_MODEL"] == "openai/gpt-5" and env["LLM_API_KEY"] == "k"


def test_openhands_status_lines_are_text_not_parse_errors() -> None:
    text = "\x1b[37mInitializing agent\x1b[0m...\n" + sample("openhands") + "\nGoodbye! \U0001f44b\n{broken json"
    events, totals = parse_stream("openhands", text)
    assert totals.parse_errors == 1 and totals.exit_reason == "completed" and totals.steps == 1
    assert events[0].kind == "message" and events[0].role == "system" and events[0].content == "Initializing agent..."


def test_install_commands_are_pinned() -> None:
    assert (
        ClaudeCodeAgent().install_command() == "npm install -g --no-fund --no-audit @anthropic-ai/claude-code@2.1.197"
    )
    assert (
        CodexAgent(npm_prefix="/opt/npm").install_command()
        == "npm install -g --prefix /opt/npm --no-fund --no-audit @openai/codex@0.171.0"
    )
    assert CodexAgent(npm_prefix="/opt/npm").bin_dir == "/opt/npm/bin"
    assert (
        OpenHandsAgent(venv="/opt/oh").install_command()
        == "python3.12 -m venv /opt/oh && /opt/oh/bin/pip install -q openhands==1.16.0"
    )


def test_codex_config_names_the_key_variable_not_the_key() -> None:
    toml = CodexAgent(model="gpt-5", base_url="http://127.0.0.1:9/v1", api_key="sk-run-key").config_toml()
    assert 'base_url = "http://127.0.0.1:9/v1"' in toml and 'wire_api = "responses"' in toml
    assert 'env_key = "OPENAI_API_KEY"' in toml and "plugins = false" in toml and "sk-run-key" not in toml


def test_agents_load_by_import_path() -> None:
    for spec, cls in (
        ("saasbench.agents.claude_code:ClaudeCodeAgent", ClaudeCodeAgent),
        ("saasbench.agents.codex:CodexAgent", CodexAgent),
        ("saasbench.agents.openhands:OpenHandsAgent", OpenHandsAgent),
    ):
        agent = get_agent(spec, model="m")
        assert isinstance(agent, cls) and agent.model == "m"
    assert (ClaudeCodeAgent.name, CodexAgent.name, OpenHandsAgent.name) == ("claude-code", "codex", "openhands")


# --- run() with a stand-in CLI ----------------------------------------------------------------------------
STANDIN = r"""#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(here, "standin.json")))
json.dump({{"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}}, open(os.path.join(here, "dump.json"), "w"))
open("made_by_agent.txt", "w").write("hello from " + os.path.basename(sys.argv[0]))
sys.stderr.write("stand-in stderr line\n")
for line in open(cfg["stream"]):
    sys.stdout.write(line); sys.stdout.flush()
for line in cfg.get("extra", []):
    sys.stdout.write(line.replace("KEY", os.environ.get(cfg.get("key_var", ""), "")) + "\n"); sys.stdout.flush()
time.sleep(cfg.get("sleep", 0))
sys.exit(cfg.get("rc", 0))
"""

AGENTS = {
    "claude": (ClaudeCodeAgent, "claude", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "codex": (CodexAgent, "codex", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "openhands": (OpenHandsAgent, "openhands", "LLM_API_KEY", "LLM_BASE_URL"),
}


def standin(tmp_path: Path, fmt: str, stream: str, **cfg) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / AGENTS[fmt][1]
    exe.write_text(STANDIN.format(python=sys.executable))
    exe.chmod(0o755)
    stream_file = tmp_path / "stream.jsonl"
    stream_file.write_text(stream)
    (bin_dir / "standin.json").write_text(json.dumps({"stream": str(stream_file), "key_var": AGENTS[fmt][2]} | cfg))
    return bin_dir


@pytest.mark.parametrize("fmt", ["claude", "codex", "openhands"])
def test_run_with_standin_cli(tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_ONLY_SECRET", "host-secret-value")
    cls, exe, key_var, url_var = AGENTS[fmt]
    key = "sk-per-run-" + fmt + "-0123456789"
    # the agent echoes its key once (as if it ran `env`): it must be redacted from every record
    leak = {
        "claude": {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "key=KEY"}]},
        },
        "codex": {"type": "item.completed", "item": {"id": "x", "type": "agent_message", "text": "key=KEY"}},
        "openhands": {"kind": "MessageEvent", "source": "agent", "llm_message": {"role": "tool", "content": "key=KEY"}},
    }[fmt]
    bin_dir = standin(tmp_path, fmt, sample(fmt), extra=[json.dumps(leak), "{garbage line"])
    agent = cls(
        model="test-model",
        base_url="http://127.0.0.1:9/v1",
        api_key=key,
        bin_dir=str(bin_dir),
        artefacts_dir=tmp_path / "artefacts",
    )
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("Build the app. Prompt marker 42.", env, Budget(wall_s=60))
        assert env.read_file("made_by_agent.txt") == f"hello from {exe}".encode()
        ws = env.workspace_path
        ws_files = {e.name for e in env.list_files()}
    assert traj.exit_reason == "completed", traj.error
    _, clean = parse_stream(fmt, sample(fmt))
    assert traj.steps == clean.steps == 1
    assert (traj.tokens_in, traj.tokens_out) == (clean.tokens_in, clean.tokens_out)
    assert traj.cost_usd == pytest.approx(clean.cost_usd or 0.0)
    assert traj.model == "test-model" and traj.agent == cls.name
    assert [e.data.get("tool") for e in traj.events if e.kind == "tool_call"] == [
        {"claude": "Bash", "codex": "shell", "openhands": "terminal"}[fmt]
    ]
    assert any(e.data.get("parse_error") for e in traj.events)

    dump = json.loads((bin_dir / "dump.json").read_text())
    assert dump["env"][key_var] == key and dump["env"][url_var] == "http://127.0.0.1:9/v1"
    assert "HOST_ONLY_SECRET" not in dump["env"]
    assert dump["argv"][-1] == "Build the app. Prompt marker 42." and dump["argv"][-2] in ("--", "-t")
    assert os.path.realpath(dump["cwd"]) == os.path.realpath(ws)
    assert ws_files == {"made_by_agent.txt"}  # prompt, config, stream all live outside the workspace

    # the key: in the agent's process env only; never in the trajectory or the artefacts
    assert key not in traj.model_dump_json() and "[REDACTED]" in traj.model_dump_json()
    art = Path(agent.last_artefacts["dir"])
    assert art.parent == tmp_path / "artefacts" and not str(art).startswith(ws)
    events_file = Path(agent.last_artefacts["events"])
    assert events_file.name == f"{fmt}_events.jsonl" and sample(fmt).splitlines()[0] in events_file.read_text()
    assert "stand-in stderr line" in Path(agent.last_artefacts["stderr"]).read_text()
    kept = json.loads((art / "trajectory.json").read_text())
    assert kept["steps"] == 1 and kept["exit_reason"] == "completed" and kept["wall_s"] > 0
    for path in art.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
    assert not (art / "home").exists()


class _RemoteLikeEnvironment(LocalEnvironment):
    """A local environment that claims not to be local: run() must go through exec only (as in a container)."""

    kind = "remote-like"
    runs_on_host = False

    def __init__(self, *args, **kwargs):  # the test reads the "container's" /tmp on the host: no sandbox
        super().__init__(*args, sandbox=False, **kwargs)


def test_run_in_a_non_local_environment_goes_through_exec(tmp_path: Path) -> None:
    import shutil

    lines = sample("codex").splitlines()
    filler = [
        json.dumps({"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message", "text": "é" * 400}})
        for i in range(2000)
    ]  # ~1.6 MB: read back in several chunks, multi-byte characters across chunk edges
    bin_dir = standin(tmp_path, "codex", "\n".join(lines[:-1] + filler + lines[-1:]) + "\n")
    agent = CodexAgent(
        model="gpt-5",
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-remote-1234567890",
        bin_dir=str(bin_dir),
        artefacts_dir=tmp_path / "a",
    )
    with _RemoteLikeEnvironment() as env:
        traj = agent.run("remote prompt", env, Budget(wall_s=60))
    dump = json.loads((bin_dir / "dump.json").read_text())
    run_dir = Path(dump["env"]["CODEX_HOME"]).parent
    try:
        assert str(run_dir).startswith("/tmp/saasbench-agent/codex-")
        assert dump["argv"][-1] == "remote prompt" and (run_dir / "codex-home" / "config.toml").is_file()
        assert traj.exit_reason == "completed" and traj.steps == 1 and traj.tokens_in == 246
        assert sum(1 for e in traj.events if e.kind == "message") == 2001
        kept = Path(agent.last_artefacts["events"]).read_text(encoding="utf-8")
        assert kept == (run_dir / "codex_events.jsonl").read_text(encoding="utf-8")
        assert "stand-in stderr line" in Path(agent.last_artefacts["stderr"]).read_text()
        assert not (run_dir / "home").exists()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_codex_run_writes_provider_config(tmp_path: Path) -> None:
    bin_dir = standin(tmp_path, "codex", sample("codex"))
    agent = CodexAgent(
        model="gpt-5",
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-k-987654321",
        bin_dir=str(bin_dir),
        artefacts_dir=tmp_path / "a",
    )
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("p", env, Budget(wall_s=60))
    assert traj.exit_reason == "completed"
    dump = json.loads((bin_dir / "dump.json").read_text())
    config = Path(dump["env"]["CODEX_HOME"], "config.toml").read_text()
    assert 'base_url = "http://127.0.0.1:9/v1"' in config and "sk-k-987654321" not in config


def test_run_timeout_is_agent_timeout(tmp_path: Path) -> None:
    bin_dir = standin(tmp_path, "claude", sample("claude").splitlines()[1] + "\n", sleep=60)
    agent = ClaudeCodeAgent(api_key="sk-t-1234567890", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a")
    t0 = time.monotonic()
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("p", env, Budget(wall_s=2))
    assert time.monotonic() - t0 < 20
    assert traj.exit_reason == "agent_timeout" and "wall-clock" in (traj.error or "")
    assert (
        json.loads((Path(agent.last_artefacts["dir"]) / "trajectory.json").read_text())["exit_reason"]
        == "agent_timeout"
    )
    assert traj.steps == 1  # what streamed before the kill is kept
    assert any(e.kind == "tool_call" and e.data.get("tool") == "Bash" for e in traj.events)


def test_run_crash_without_result_is_agent_error(tmp_path: Path) -> None:
    bin_dir = standin(tmp_path, "codex", sample("codex").splitlines()[0] + "\n", rc=3)
    agent = CodexAgent(api_key="sk-c-1234567890", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a")
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("p", env, Budget(wall_s=60))
    assert traj.exit_reason == "agent_error"
    assert "exited 3" in (traj.error or "") and "stand-in stderr line" in (traj.error or "")


def test_run_error_result_is_agent_error(tmp_path: Path) -> None:
    stream = json.dumps(
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "num_turns": 1,
            "result": "API Error: 401 invalid key",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )
    bin_dir = standin(tmp_path, "claude", stream + "\n", rc=1)
    agent = ClaudeCodeAgent(api_key="sk-e-1234567890", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a")
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("p", env, Budget(wall_s=60))
    assert traj.exit_reason == "agent_error" and "401" in (traj.error or "")


def test_missing_cli_is_agent_error(tmp_path: Path) -> None:
    agent = OpenHandsAgent(
        api_key="sk-m-1234567890", bin_dir=str(tmp_path / "nothing-here"), venv=None, artefacts_dir=tmp_path / "a"
    )
    with LocalEnvironment() as env:
        traj = agent.run("p", env, Budget(wall_s=60))
    assert traj.exit_reason in ("agent_error", "completed")
    if traj.exit_reason == "completed":  # an `openhands` on the host PATH: not what this test is about
        pytest.skip("a real openhands CLI is on PATH")
    assert "exited 127" in (traj.error or "")


def test_install_runs_the_pinned_command_and_reports_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    log = tmp_path / "npm.log"
    (fake_bin / "npm").write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ -n "$NPM_FAIL" ] && exit 1\nexit 0\n')
    (fake_bin / "npm").chmod(0o755)
    (fake_bin / "codex").write_text("#!/bin/sh\necho 'codex-cli 0.171.0'\n")
    (fake_bin / "codex").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    with LocalEnvironment() as env:
        CodexAgent().install(env)
        assert log.read_text().strip() == "install -g --no-fund --no-audit @openai/codex@0.171.0"
        monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
        (fake_bin / "npm").write_text("#!/bin/sh\necho 'npm ERR! 404 not found' >&2\nexit 1\n")
        with pytest.raises(AgentInstallError, match="404 not found"):
            ClaudeCodeAgent().install(env)


# --- the real Claude Code CLI against a local fake Anthropic Messages server ---------------------------------
# tests/fake_llm.py speaks OpenAI chat completions only; Claude Code needs the Anthropic Messages API
# (streamed SSE) and Codex needs the Responses API, so this test brings its own small Messages fake.
def _claude_bin() -> str | None:
    import shutil

    for candidate in (
        os.environ.get("SAASBENCH_CLAUDE_BIN"),
        "/tmp/saasbench-npm-claude/bin/claude",
        shutil.which("claude"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class _FakeMessages:
    """``POST /v1/messages``: a Bash tool call first, the final text once a tool result came back."""

    def __init__(self, command: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.command, self.requests = command, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fake.requests.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                block = fake.reply(body)
                usage = {"input_tokens": 100, "output_tokens": 1}
                msg = {
                    "id": f"msg_{len(fake.requests)}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                }
                stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
                if not body.get("stream"):
                    data = json.dumps(
                        msg
                        | {"content": [block], "stop_reason": stop, "usage": {"input_tokens": 100, "output_tokens": 20}}
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if block["type"] == "tool_use":
                    start = block | {"input": {}}
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                else:
                    start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
                events = [
                    ("message_start", {"message": msg}),
                    ("content_block_start", {"index": 0, "content_block": start}),
                    ("ping", {}),
                    ("content_block_delta", {"index": 0, "delta": delta}),
                    ("content_block_stop", {"index": 0}),
                    (
                        "message_delta",
                        {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 20}},
                    ),
                    ("message_stop", {}),
                ]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps({'type': name} | data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def reply(self, body: dict) -> dict:
        def has_result(content) -> bool:
            return isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content
            )

        if any(has_result(m.get("content")) for m in body.get("messages") or []):
            return {"type": "text", "text": "Done: the file was created."}
        if any(t.get("name") == "Bash" for t in body.get("tools") or []):
            return {
                "type": "tool_use",
                "id": f"toolu_{len(self.requests)}",
                "name": "Bash",
                "input": {"command": self.command, "description": "create the file"},
            }
        return {"type": "text", "text": "ok"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_real_claude_code_cli_against_fake_messages_server(tmp_path: Path) -> None:
    exe = _claude_bin()
    if exe is None:
        pytest.fail(
            "Claude Code CLI not installed (scripts/test.sh installs it) (npm install -g --prefix /tmp/saasbench-npm-claude "
            "@anthropic-ai/claude-code@2.1.197, or set SAASBENCH_CLAUDE_BIN)"
        )
    fake = _FakeMessages("echo real > real_cli.txt")
    key = "sk-real-cli-run-key-0123456789"
    try:
        agent = ClaudeCodeAgent(
            model="claude-sonnet-4-5",
            base_url=fake.base_url,
            api_key=key,
            bin_dir=str(Path(exe).parent),
            artefacts_dir=tmp_path / "a",
        )
        with LocalEnvironment() as env:
            traj = agent.run("Create real_cli.txt containing the word real.", env, Budget(wall_s=120))
            made = env.read_file("real_cli.txt") if (Path(env.workspace_path) / "real_cli.txt").exists() else None
    finally:
        fake.close()
    stderr = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-2000:]
    assert traj.exit_reason == "completed", (traj.error, stderr)
    assert made == b"real\n"
    assert traj.steps == 1 and [e.data.get("tool") for e in traj.events if e.kind == "tool_call"] == ["Bash"]
    assert traj.tokens_in > 0 and traj.tokens_out > 0
    posts = [r for r in fake.requests if r["path"].startswith("/v1/messages")]
    assert len(posts) >= 2 and all(r["headers"].get("x-api-key") == key for r in posts)
    assert all(r["body"].get("model") == "claude-sonnet-4-5" for r in posts)
    assert key not in traj.model_dump_json()
    for path in Path(agent.last_artefacts["dir"]).rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path


# --- the real Codex CLI against a local fake Responses API server ---------------------------------------------
def _codex_bin() -> str | None:
    import shutil

    for candidate in (
        os.environ.get("SAASBENCH_CODEX_BIN"),
        "/tmp/saasbench-npm-codex/bin/codex",
        shutil.which("codex"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class _FakeResponses:
    """``POST /v1/responses`` (SSE): an ``exec_command`` call first, the final text once its output came back."""

    def __init__(self, command: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.command, self.requests = command, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # WebSocket probes and the rest: not here, fall back to SSE
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fake.requests.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in fake.events(body):
                    self.wfile.write(f"event: {name}\ndata: {json.dumps({'type': name} | data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def events(self, body: dict) -> list[tuple[str, dict]]:
        n = len(self.requests)
        rid = f"resp_{n}"
        items = body.get("input") if isinstance(body.get("input"), list) else []
        names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        done_tool = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
        out: list[tuple[str, dict]] = [
            ("response.created", {"response": {"id": rid, "status": "in_progress", "output": []}})
        ]
        if not done_tool and "exec_command" in names:
            args = json.dumps({"cmd": self.command})
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": "exec_command",
                "arguments": "",
            }
            out += [
                ("response.output_item.added", {"output_index": 0, "item": item}),
                ("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": 0, "delta": args}),
                (
                    "response.function_call_arguments.done",
                    {"item_id": item["id"], "output_index": 0, "arguments": args},
                ),
            ]
            item = item | {"arguments": args, "status": "completed"}
        else:
            text = "Done: the file was created."
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
            ref = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            out += [
                ("response.output_item.added", {"output_index": 0, "item": item}),
                ("response.content_part.added", ref | {"part": part}),
                ("response.output_text.delta", ref | {"delta": text}),
                ("response.output_text.done", ref | {"text": text}),
                ("response.content_part.done", ref | {"part": part | {"text": text}}),
            ]
            item = item | {"status": "completed", "content": [part | {"text": text}]}
        usage = {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 150,
        }
        out += [
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": {"id": rid, "status": "completed", "output": [item], "usage": usage}}),
        ]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_real_codex_cli_against_fake_responses_server(tmp_path: Path) -> None:
    exe = _codex_bin()
    if exe is None:
        pytest.fail(
            "Codex CLI not installed (scripts/test.sh installs it) (npm install -g --prefix /tmp/saasbench-npm-codex @openai/codex@0.171.0, "
            "or set SAASBENCH_CODEX_BIN)"
        )
    fake = _FakeResponses("echo real > real_codex.txt")
    key = "sk-real-codex-run-key-0123456789"
    try:
        agent = CodexAgent(
            model="gpt-5",
            base_url=fake.base_url,
            api_key=key,
            bin_dir=str(Path(exe).parent),
            artefacts_dir=tmp_path / "a",
        )
        with LocalEnvironment() as env:
            traj = agent.run("Create real_codex.txt containing the word real.", env, Budget(wall_s=120))
            target = Path(env.workspace_path) / "real_codex.txt"
            made = target.read_bytes() if target.exists() else None
    finally:
        fake.close()
    stderr = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-2000:]
    assert traj.exit_reason == "completed", (traj.error, stderr)
    assert made == b"real\n"
    assert traj.steps == 1 and [e.data.get("tool") for e in traj.events if e.kind == "tool_call"] == ["shell"]
    assert (traj.tokens_in, traj.tokens_out) == (240, 60)
    posts = [r for r in fake.requests if r["path"].endswith("/responses")]
    assert len(posts) == 2 and all(r["headers"].get("authorization") == f"Bearer {key}" for r in posts)
    assert key not in traj.model_dump_json()
    for path in Path(agent.last_artefacts["dir"]).rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path


# --- the real OpenHands CLI against tests/fake_llm.py (OpenAI chat completions) -------------------------------
def _openhands_bin() -> str | None:
    for candidate in (os.environ.get("SAASBENCH_OPENHANDS_BIN"), "/tmp/saasbench-openhands/bin/openhands"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_real_openhands_cli_against_fake_llm(tmp_path: Path) -> None:
    exe = _openhands_bin()
    if exe is None:
        pytest.fail(
            "OpenHands CLI not installed (scripts/test.sh installs it) (python3.12 -m venv /tmp/saasbench-openhands && "
            "/tmp/saasbench-openhands/bin/pip install openhands==1.16.0, or set SAASBENCH_OPENHANDS_BIN)"
        )
    from fake_llm import FakeLLM, Reply

    def responder(request) -> Reply:
        if any(m.get("role") == "tool" for m in request.messages):
            return Reply.text("Done: the file was created.")
        tools = {(t.get("function") or {}).get("name") for t in (request.body or {}).get("tools") or []}
        if "terminal" in tools:
            args = {"command": "echo real > real_oh.txt", "security_risk": "LOW"}
            return Reply.with_message(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "terminal", "arguments": json.dumps(args)},
                        }
                    ],
                },
                finish_reason="tool_calls",
            )
        return Reply.text("ok")

    key = "sk-real-openhands-run-key-0123456789"
    with FakeLLM(responder=responder) as llm:
        agent = OpenHandsAgent(
            model="fake-gpt",
            base_url=llm.base_url,
            api_key=key,
            bin_dir=str(Path(exe).parent),
            venv=None,
            artefacts_dir=tmp_path / "a",
        )
        with LocalEnvironment() as env:
            traj = agent.run("Create real_oh.txt containing the word real.", env, Budget(wall_s=240))
            target = Path(env.workspace_path) / "real_oh.txt"
            made = target.read_bytes() if target.exists() else None
        chats = llm.chat_requests
    stderr = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-2000:]
    assert traj.exit_reason == "completed", (traj.error, stderr)
    assert made == b"real\n", stderr
    assert traj.steps == 1 and [e.data.get("tool") for e in traj.events if e.kind == "tool_call"] == ["terminal"]
    assert not any(e.data.get("parse_error") for e in traj.events)  # status lines are text, not broken JSON
    assert len(chats) >= 2 and all(r.headers.get("authorization") == f"Bearer {key}" for r in chats)
    assert key not in traj.model_dump_json()
    for path in Path(agent.last_artefacts["dir"]).rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
