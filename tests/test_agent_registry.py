"""What each agent module declares for the rest of the harness: its stream parser, its tool vocabulary
(for the anti-cheat scanner) and its gateway environment (issue #15: one module per CLI agent).

The pinned sets and environments are the values from before the move; the registry-built ones must
keep containing them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from saasbench.agents import anticheat, base, events
from saasbench.agents.base import Trajectory, list_agents
from saasbench.agents.events import (
    FORMATS,
    CLIAgent,
    StreamEvent,
    StreamParser,
    apply_events,
    make_parser,
    parse_stream,
)
from saasbench.runs.gateway import agent_env_for

# anticheat.SHELL_TOOLS / FILE_TOOLS as they were written out by hand before each agent declared its own
PINNED_SHELL_TOOLS = {"shell", "exec", "bash", "execute_bash", "run", "run_command", "terminal", "cmd", "sh"}
PINNED_FILE_TOOLS = {
    "write_file",
    "edit_file",
    "create_file",
    "str_replace",
    "file_write",
    "write",
    "edit",
    "multiedit",
    "notebookedit",
    "file_editor",
    "str_replace_editor",
    "file_change",
    "apply_patch",
}


def test_anticheat_tool_sets_keep_every_name_they_had() -> None:
    assert PINNED_SHELL_TOOLS <= set(anticheat.SHELL_TOOLS)
    assert PINNED_FILE_TOOLS <= set(anticheat.FILE_TOOLS)
    assert not set(anticheat.SHELL_TOOLS) & set(anticheat.FILE_TOOLS)


ROOT, KEY = "http://127.0.0.1:4000", "sk-sbgw-abc.def"
PINNED_ENV = {
    "builtin": {
        "SAASBENCH_AGENT_API_BASE": ROOT + "/v1",
        "SAASBENCH_AGENT_API_KEY_ENV": "SAASBENCH_GATEWAY_KEY",
        "SAASBENCH_GATEWAY_KEY": KEY,
        "SAASBENCH_AGENT_MODEL": "openai/gpt-5",
    },
    "claude-code": {"ANTHROPIC_BASE_URL": ROOT, "ANTHROPIC_API_KEY": KEY},
    "codex": {"OPENAI_BASE_URL": ROOT + "/v1", "OPENAI_API_KEY": KEY},
    "openhands": {"LLM_BASE_URL": ROOT + "/v1", "LLM_API_KEY": KEY},
}
BOTH_PAIRS = {
    "OPENAI_BASE_URL": ROOT + "/v1",
    "OPENAI_API_KEY": KEY,
    "ANTHROPIC_BASE_URL": ROOT,
    "ANTHROPIC_API_KEY": KEY,
}


@pytest.mark.parametrize("name", [*PINNED_ENV, "oracle", "nop", "no-such-agent", "my.module:Agent"])
@pytest.mark.parametrize("root", [ROOT, ROOT + "/"])
def test_agent_env_for_is_what_it_was(name: str, root: str) -> None:
    assert agent_env_for(name, root, KEY, "gpt-5") == PINNED_ENV.get(name, BOTH_PAIRS)


def test_builtin_agent_env_without_a_model_names_none() -> None:
    env = agent_env_for("builtin", ROOT, KEY)
    assert "SAASBENCH_AGENT_MODEL" not in env and env["SAASBENCH_GATEWAY_KEY"] == KEY


def test_every_cli_agent_has_a_registered_parser() -> None:
    assert set(FORMATS) >= {"claude", "codex", "openhands"}
    for name, cls in list_agents().items():
        if issubclass(cls, CLIAgent):
            assert cls.stream_format in FORMATS, name
            assert make_parser(cls.stream_format).format == cls.stream_format


def test_parse_stream_of_each_format_and_an_unknown_one() -> None:
    for fmt in FORMATS:
        events, totals = parse_stream(fmt, "not json\n")
        assert totals.lines == 1 and len(events) == 1
    with pytest.raises(ValueError, match="unknown stream format 'gemini'"):
        make_parser("gemini")


# --- a new agent needs nothing outside its own module -------------------------------------------------------
class _GeminiLikeParser(StreamParser):
    format = "gemini-like"

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        if obj.get("type") == "tool_use":
            return [StreamEvent("tool_call", "assistant", tool=obj["name"], args=obj["args"])]
        return []


class _GeminiLikeAgent(CLIAgent):
    stream_format = "gemini-like"
    shell_tools = frozenset({"run_shell_command"})
    file_tools = {"write_file": "write", "replace": "edit"}

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": root_url, "GEMINI_API_KEY": key}


@pytest.fixture
def gemini_like(monkeypatch: pytest.MonkeyPatch) -> type[CLIAgent]:
    monkeypatch.setitem(base._AGENTS, "gemini-like", _GeminiLikeAgent)
    monkeypatch.setitem(events._PARSERS, "gemini-like", _GeminiLikeParser)
    return _GeminiLikeAgent


def test_a_registered_agent_brings_its_parser_tools_and_gateway_env(gemini_like: type[CLIAgent]) -> None:
    assert "gemini-like" in events.FORMATS
    assert {"run_shell_command"} <= anticheat.SHELL_TOOLS and {"write_file", "replace"} <= anticheat.FILE_TOOLS
    assert agent_env_for("gemini-like", ROOT + "/", KEY) == {"GOOGLE_GEMINI_BASE_URL": ROOT, "GEMINI_API_KEY": KEY}
    stream = "\n".join(
        json.dumps({"type": "tool_use", "name": name, "args": args})
        for name, args in [
            ("write_file", {"file_path": "get.sh", "content": "curl -L https://github.com/o/r/archive/main.tar.gz"}),
            ("run_shell_command", {"command": "bash get.sh"}),
            ("run_shell_command", {"command": "git clone https://github.com/o/r"}),
        ]
    )
    traj = Trajectory(agent="gemini-like")
    apply_events(traj, parse_stream("gemini-like", stream)[0])
    voided, findings = anticheat.void_if_cheating(traj)
    assert voided and {f.rule for f in findings} == {"git_clone", "source_download"}
    assert any(f.source == "file:get.sh" and f.severity == "void" for f in findings)


def test_the_vocabulary_rejects_unknown_layouts_and_conflicts(monkeypatch: pytest.MonkeyPatch) -> None:
    class Odd(_GeminiLikeAgent):
        file_tools = {"write_file": "edit"}  # the builtin agent's write_file writes whole files

    monkeypatch.setitem(base._AGENTS, "odd", Odd)
    with pytest.raises(ValueError, match="file tool 'write_file'"):
        anticheat.file_tools()
    Odd.file_tools = {"scribble": "scribble"}  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="layout 'scribble'"):
        anticheat.file_tools()


def test_a_format_has_one_parser() -> None:
    class Another(StreamParser):
        format = "codex"

    with pytest.raises(ValueError, match="stream format 'codex' has a parser already"):
        events.register_parser(Another)
    assert type(make_parser("codex")).__module__ == "saasbench.agents.codex"
