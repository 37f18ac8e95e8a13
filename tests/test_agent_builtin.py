"""The ``builtin`` agent against the scripted fake LLM server (tests/fake_llm.py).

Retry waits are shrunk to milliseconds (``backoff_base_s``/``backoff_cap_s``, or the
``SAASBENCH_AGENT_BACKOFF_*`` variables for the trial, which builds the agent by name).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llm import FakeLLM, Reply

from saasbench.agents import Budget, get_agent, list_agents
from saasbench.agents.anticheat import void_if_cheating
from saasbench.agents.builtin import (
    ENV_API_BASE,
    ENV_BACKOFF_BASE,
    ENV_BACKOFF_CAP,
    ENV_MODEL,
    BuiltinAgent,
)
from saasbench.environments.local import LocalEnvironment

TASK_DIR = Path(__file__).resolve().parents[1] / "tasks" / "timetrack"
SECRET = "sk-test-secret-0123456789"


@pytest.fixture
def llm():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def env(tmp_path: Path):
    with LocalEnvironment(workspace_root=tmp_path / "ws") as e:
        yield e


def call(name: str, args: dict, call_id: str = "c1", content: str = "") -> Reply:
    """A scripted assistant turn asking for one tool call."""
    return Reply.with_message(
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }
    )


def agent_for(llm: FakeLLM, **kw) -> BuiltinAgent:
    kw.setdefault("backoff_base_s", 0.001)
    kw.setdefault("backoff_cap_s", 0.01)
    return BuiltinAgent("openai/fake", api_base=llm.base_url, **kw)


def tool_messages(request) -> list[str]:
    return [m["content"] for m in request.messages if m.get("role") == "tool"]


def test_registered_by_name() -> None:
    assert "builtin" in list_agents()
    assert isinstance(get_agent("builtin", model="openai/x"), BuiltinAgent)


def test_tools_events_tokens_and_no_key_in_events(llm: FakeLLM, env: LocalEnvironment, monkeypatch) -> None:
    monkeypatch.setenv("SAASBENCH_TEST_AGENT_KEY", SECRET)
    llm.queue(
        call("shell", {"command": "echo hi > a.txt && cat a.txt"}, "c1", content=f"starting; my key is {SECRET}"),
        call("write_file", {"path": "src/b.txt", "content": "hello world\n"}, "c2"),
        call("edit_file", {"path": "src/b.txt", "old": "world", "new": "there"}, "c3"),
        call("read_file", {"path": "src/b.txt"}, "c4"),
        call("read_file", {"path": "../outside.txt"}, "c5"),
        call("shell", {"command": "head -c 50000 /dev/zero | tr '\\0' x"}, "c6"),
        call("finish", {"summary": "done"}, "c7"),
    )
    agent = agent_for(llm, api_key_env="SAASBENCH_TEST_AGENT_KEY")
    traj = agent.run("Build the thing.", env, Budget())
    assert traj.exit_reason == "completed", traj.error
    assert traj.steps == 7 and traj.model == "openai/fake"
    assert env.read_file("a.txt") == b"hi\n" and env.read_file("src/b.txt") == b"hello there\n"

    reqs = llm.chat_requests
    assert len(reqs) == 7
    body = reqs[0].body
    assert body["temperature"] == 0 and {t["function"]["name"] for t in body["tools"]} == {
        "shell",
        "read_file",
        "write_file",
        "edit_file",
        "finish",
    }
    system = body["messages"][0]["content"]
    assert "deadline" in system and "UTC" in system and env.workspace_path in system
    assert body["messages"][1] == {"role": "user", "content": "Build the thing."}
    assert reqs[0].headers.get("authorization") == f"Bearer {SECRET}"  # sent to the server ...
    tools = tool_messages(reqs[-1])
    assert tools[0].startswith("exit code: 0") and "hi" in tools[0]
    assert tools[3] == "hello there\n"
    assert tools[4].startswith("error: PathEscape")
    assert len(tools[5]) < 17 * 1024 and "characters truncated" in tools[5]  # capped for the model

    dumped = traj.model_dump_json()
    assert SECRET not in dumped  # ... but never recorded
    kinds = [e.kind for e in traj.events]
    assert [e.data["role"] for e in traj.events[:2]] == ["system", "user"] and traj.events[
        1
    ].message == "Build the thing."
    assert kinds.count("model_call") == 7 and kinds.count("tool_call") == 7 and kinds.count("tool_result") == 7
    first = next(e for e in traj.events if e.kind == "model_call")
    assert "[REDACTED]" in first.message and first.data["tokens_in"] > 0 and first.data["latency_ms"] >= 0
    assert traj.tokens_in == sum(e.data["tokens_in"] for e in traj.events if e.kind == "model_call") > 0
    assert traj.tokens_out > 0 and traj.wall_s > 0
    shell = next(e for e in traj.events if e.kind == "tool_call")
    assert shell.data["tool"] == "shell" and shell.data["args"]["command"].startswith("echo hi")


def test_429_and_500_bursts_are_retried(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(Reply.error(429), Reply.error(429), Reply.error(500), Reply.error(529), call("finish", {"summary": "ok"}))
    traj = agent_for(llm).run("x", env, Budget())
    assert traj.exit_reason == "completed", traj.error
    assert len(llm.chat_requests) == 5
    retries = [e for e in traj.events if e.kind == "retry"]
    assert [e.data["attempt"] for e in retries] == [1, 2, 3, 4]
    assert next(e for e in traj.events if e.kind == "model_call").data["attempts"] == 5


def test_transient_errors_give_up_after_five_retries(llm: FakeLLM, env: LocalEnvironment) -> None:
    """Still failing after the retries: the model upstream is down, an infrastructure outcome (model_error)."""
    llm.queue(*[Reply.error(500)] * 7)
    traj = agent_for(llm).run("x", env, Budget())
    assert traj.exit_reason == "model_error" and "after 6 attempt" in (traj.error or "")
    assert len(llm.chat_requests) == 6  # the first attempt and 5 retries


def test_dropped_connection_is_retried(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(Reply.drop(), call("finish", {"summary": "ok"}))
    traj = agent_for(llm).run("x", env, Budget())
    assert traj.exit_reason == "completed", traj.error
    assert len(llm.chat_requests) == 2


def test_non_transient_error_is_agent_error(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(Reply.error(401, "bad key"), call("finish", {"summary": "never"}))
    traj = agent_for(llm).run("x", env, Budget())
    assert traj.exit_reason == "agent_error" and "not retried" in (traj.error or "")
    assert len(llm.chat_requests) == 1


def test_step_budget_exceeded(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.responder = lambda req: call("shell", {"command": "echo again >> log.txt"})
    traj = agent_for(llm).run("x", env, Budget(steps=3))
    assert traj.exit_reason == "agent_budget_exceeded", traj.error
    assert traj.steps == 3 and len(llm.chat_requests) == 3
    assert env.read_file("log.txt") == b"again\n" * 3  # the state is left for the evaluation


def test_wall_clock_exceeded_during_slow_reply(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(call("write_file", {"path": "partial.txt", "content": "x"}), Reply.slow("late", 30))
    traj = agent_for(llm).run("x", env, Budget(wall_s=1.5))
    assert traj.exit_reason == "agent_timeout", traj.error
    assert env.read_file("partial.txt") == b"x"


def test_tool_call_timeout_is_reported_not_fatal(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(call("shell", {"command": "sleep 20"}), call("finish", {"summary": "ok"}))
    traj = agent_for(llm).run("x", env, Budget(tool_call_s=0.3))
    assert traj.exit_reason == "completed", traj.error
    assert "timed out" in tool_messages(llm.chat_requests[-1])[0]
    result = next(e for e in traj.events if e.kind == "tool_result")
    assert result.data["timed_out"] is True and result.data["exit_code"] == 124


def test_text_only_replies_are_nudged_then_end(llm: FakeLLM, env: LocalEnvironment) -> None:
    llm.queue(Reply.text("thinking"), call("finish", {"summary": "ok"}))
    traj = agent_for(llm).run("x", env, Budget())
    assert traj.exit_reason == "completed" and len(llm.chat_requests) == 2
    assert llm.chat_requests[1].messages[-1]["role"] == "user"  # the nudge
    llm.queue(*[Reply.text("nothing")] * 3)
    traj = agent_for(llm, max_idle_turns=2).run("x", env, Budget())
    assert traj.exit_reason == "completed" and traj.steps == 3


def test_misconfiguration_is_agent_error(env: LocalEnvironment, monkeypatch) -> None:
    monkeypatch.delenv(ENV_MODEL, raising=False)
    assert BuiltinAgent().run("x", env, Budget()).exit_reason == "agent_error"
    monkeypatch.delenv("SAASBENCH_TEST_UNSET_KEY", raising=False)
    traj = BuiltinAgent("openai/fake", api_key_env="SAASBENCH_TEST_UNSET_KEY").run("x", env, Budget())
    assert traj.exit_reason == "agent_error" and "unset" in (traj.error or "")
    with pytest.raises(ValueError):
        BuiltinAgent("openai/fake", api_key_env="sk-not-a-name!")


def test_builtin_writing_the_reference_beats_nop(llm: FakeLLM, monkeypatch) -> None:
    """A scripted rollout writes tasks/timetrack/reference into the workspace; the trial scores it above nop."""
    from saasbench.catalog.tasks import load_task_dir
    from saasbench.runs.trial import run_local_trial

    task = load_task_dir(TASK_DIR)
    ref = TASK_DIR / "reference"
    files = sorted(p for p in ref.rglob("*") if p.is_file() and "__pycache__" not in p.parts and "data" not in p.parts)
    assert any(p.name == "app.py" for p in files) and any(p.name == "run.sh" for p in files)
    turns = [call("shell", {"command": "ls -la && head -5 task.md"}, "c0")]
    turns += [
        call("write_file", {"path": p.relative_to(ref).as_posix(), "content": p.read_text(encoding="utf-8")}, f"w{i}")
        for i, p in enumerate(files)
    ]
    turns.append(call("finish", {"summary": "TimeTrack implemented"}, "fin"))
    llm.queue(*turns)
    monkeypatch.setenv(ENV_MODEL, "openai/fake")
    monkeypatch.setenv(ENV_API_BASE, llm.base_url)
    monkeypatch.setenv(ENV_BACKOFF_BASE, "0.001")
    monkeypatch.setenv(ENV_BACKOFF_CAP, "0.01")

    built = run_local_trial(task, "builtin")
    traj = built.trajectory
    assert traj.exit_reason == "completed", traj.error
    assert traj.steps == len(turns) and len(llm.chat_requests) == len(turns)
    assert "Mandatory anti-cheat policy" in llm.chat_requests[0].messages[1]["content"]  # the task prompt
    assert built.app_ok, (built.app_error, built.app_log_tail)
    nop = run_local_trial(task, "nop")
    assert not nop.app_ok
    b, n = built.report.summary.deterministic_score, nop.report.summary.deterministic_score
    print(f"deterministic_score builtin={b} nop={n}")
    assert b is not None and b > (n or 0.0) and b > 50, (b, n)
    voided, findings = void_if_cheating(traj, include_files=True)
    assert not voided, findings
