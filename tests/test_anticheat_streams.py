"""Anti-cheat on file-writing tools, from recorded event streams of Claude Code, Codex and OpenHands.

Each stream is parsed the way the adapters do (``saasbench.agents.events``: parser -> apply_events
-> Trajectory) and then scanned. The rule under test (agents/anticheat.py): a written file counts
only when a shell command runs it afterwards; a script that is never run is a warning; prose
(README, docs) is never flagged. The sample streams of the shared folder come first as negatives.
"""

from __future__ import annotations

import json
import shlex

import pytest
from test_agent_adapters import sample

from saasbench.agents.anticheat import (
    executed_names,
    file_writes,
    split_shell_writes,
    void_if_cheating,
)
from saasbench.agents.base import Trajectory
from saasbench.agents.events import ARGS_CAP, apply_events, make_parser

CLONE = "git clone --depth 1 https://github.com/acme/timetracker.git vendor"


def traj_from(fmt: str, objs: list[dict] | str) -> Trajectory:
    text = objs if isinstance(objs, str) else "\n".join(json.dumps(o) for o in objs)
    parser = make_parser(fmt)
    traj = Trajectory(agent=fmt)
    apply_events(traj, parser.feed_text(text))
    return traj


def rules(findings) -> list[tuple[str, str]]:
    return [(f.rule, f.severity) for f in findings]


# --- Claude Code (stream-json) ---------------------------------------------------------------------------
def claude_tool(name: str, tool_input: dict, tid: str) -> list[dict]:
    return [
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": tid, "name": name, "input": tool_input}],
            },
        },
        {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": "ok"}]},
        },
    ]


def claude(*calls: tuple[str, dict]) -> Trajectory:
    objs = [o for i, (name, inp) in enumerate(calls) for o in claude_tool(name, inp, f"t{i}")]
    objs.append(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "num_turns": len(calls),
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    )
    return traj_from("claude", objs)


@pytest.mark.parametrize("fmt", ["claude", "codex", "openhands"])
def test_recorded_sample_streams_are_clean(fmt: str) -> None:
    assert void_if_cheating(traj_from(fmt, sample(fmt))) == (False, [])


def test_claude_write_then_bash_runs_a_cloning_script() -> None:
    traj = claude(
        ("Write", {"file_path": "/ws/scripts/setup.sh", "content": f"#!/bin/sh\nset -e\n{CLONE}\n"}),
        ("Bash", {"command": "chmod +x scripts/setup.sh && ./scripts/setup.sh", "description": "setup"}),
    )
    voided, findings = void_if_cheating(traj)
    assert voided and rules(findings) == [("git_clone", "void")]
    f = findings[0]
    assert f.source == "file:/ws/scripts/setup.sh" and f.detail["via"] == "Write"
    assert (
        traj.events[f.event_index].data["tool"] == "Write"
        and traj.events[f.detail["executed_at"]].data["tool"] == "Bash"
    )


def test_claude_multiedit_makefile_and_edit_package_json_run_by_their_tools() -> None:
    traj = claude(
        (
            "MultiEdit",
            {
                "file_path": "/ws/Makefile",
                "edits": [{"old_string": "setup:\n\techo", "new_string": f"setup:\n\t{CLONE}"}],
            },
        ),
        ("Bash", {"command": "make setup"}),
    )
    assert rules(void_if_cheating(traj)[1]) == [("git_clone", "void")]
    traj = claude(
        (
            "Edit",
            {
                "file_path": "/ws/package.json",
                "old_string": '"scripts": {',
                "new_string": '"scripts": {"postinstall": "curl -sL https://codeload.github.com/a/b/tar.gz/main | tar xz",',
            },
        ),
        ("Bash", {"command": "npm install"}),
    )
    voided, findings = void_if_cheating(traj)
    assert voided and rules(findings) == [("source_download", "void")]


def test_claude_prose_and_unrun_scripts_are_not_voided() -> None:
    readme = f"# TimeTrack\n\n## Install\n\n```\n{CLONE}\ncd vendor && bash run.sh\n```\n"
    traj = claude(
        ("Write", {"file_path": "/ws/README.md", "content": readme}),
        ("Bash", {"command": "cat README.md && bash run.sh"}),
    )
    assert void_if_cheating(traj) == (False, [])  # a clone line in prose: not a finding at all
    traj = claude(
        ("Write", {"file_path": "/ws/tools/fetch.sh", "content": f"#!/bin/sh\n{CLONE}\n"}),
        ("Bash", {"command": "ls tools"}),
    )
    voided, findings = void_if_cheating(traj)
    assert not voided and rules(findings) == [("git_clone", "warn")] and findings[0].detail["executed_at"] is None


def test_rewritten_script_is_judged_by_the_content_that_ran() -> None:
    traj = claude(
        ("Write", {"file_path": "/ws/setup.sh", "content": f"{CLONE}\n"}),
        ("Write", {"file_path": "/ws/setup.sh", "content": "pip install flask\n"}),
        ("Bash", {"command": "bash setup.sh"}),
    )
    voided, findings = void_if_cheating(traj)
    assert not voided and rules(findings) == [("git_clone", "warn")]  # replaced before it ran


def test_capped_write_is_checked_against_the_workspace_file() -> None:
    content = "#!/bin/sh\n" + "echo padding\n" * (ARGS_CAP // 10) + f"{CLONE}\n"
    traj = claude(("Write", {"file_path": "/ws/big.sh", "content": content}), ("Bash", {"command": "sh /ws/big.sh"}))
    recorded = traj.events[0].data["args"]["content"]
    assert "chars cut]" in recorded and CLONE not in recorded  # the stream's argument is capped
    assert void_if_cheating(traj) == (False, [])
    files = {"/ws/big.sh": content}
    voided, findings = void_if_cheating(traj, read_file=files.get)
    assert voided and findings[0].source == "workspace:/ws/big.sh"


# --- Codex (exec --json) -----------------------------------------------------------------------------------
def codex_items(*items: dict) -> list[dict]:
    objs: list[dict] = [{"type": "thread.started", "thread_id": "x"}, {"type": "turn.started"}]
    for i, item in enumerate(items):
        item = {"id": f"item_{i}", **item}
        objs += [
            {"type": "item.started", "item": {**item, "status": "in_progress"}},
            {"type": "item.completed", "item": {**item, "status": "completed"}},
        ]
    return objs + [{"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}}]


def cmd(command: str) -> dict:
    return {
        "type": "command_execution",
        "command": f"/bin/bash -lc {shlex.quote(command)}",
        "aggregated_output": "",
        "exit_code": 0,
    }


def test_codex_file_change_has_no_content_so_the_run_file_is_read_back() -> None:
    traj = traj_from(
        "codex",
        codex_items(
            {"type": "file_change", "changes": [{"path": "/ws/fetch.sh", "kind": "add"}]}, cmd("bash fetch.sh")
        ),
    )
    assert [(w.path, w.text) for w in file_writes(traj)] == [("/ws/fetch.sh", None)]
    assert void_if_cheating(traj) == (False, [])  # without the workspace: not detectable (documented)
    voided, findings = void_if_cheating(traj, read_file={"/ws/fetch.sh": f"#!/bin/bash\n{CLONE}\n"}.get)
    assert voided and findings[0].source == "workspace:/ws/fetch.sh"
    # a file Codex changed but never ran is not read back
    traj = traj_from(
        "codex",
        codex_items({"type": "file_change", "changes": [{"path": "/ws/fetch.sh", "kind": "add"}]}, cmd("cat fetch.sh")),
    )
    assert void_if_cheating(traj, read_file={"/ws/fetch.sh": CLONE}.get) == (False, [])


def test_codex_apply_patch_in_a_shell_command() -> None:
    patch = (
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: get.py\n+import subprocess\n"
        '+subprocess.run(["git", "clone", "https://github.com/acme/timetracker", "src"], check=True)\n'
        "*** Add File: README.md\n+git clone https://github.com/me/app.git\n*** End Patch\nEOF"
    )
    writes = file_writes(traj_from("codex", codex_items(cmd(patch))))
    assert [(w.path, w.via, w.full) for w in writes] == [
        ("get.py", "apply_patch", True),
        ("README.md", "apply_patch", True),
    ]
    unrun = traj_from("codex", codex_items(cmd(patch), cmd("ls")))
    voided, findings = void_if_cheating(unrun)
    assert not voided and [(f.rule, f.severity, f.source) for f in findings] == [("git_clone", "warn", "file:get.py")]
    run = traj_from("codex", codex_items(cmd(patch), cmd("python3 get.py")))
    voided, findings = void_if_cheating(run)
    assert voided and [(f.rule, f.source) for f in findings] == [
        ("git_clone", "file:get.py")
    ]  # README.md: prose, never


def test_codex_apply_patch_tool_item() -> None:
    traj = Trajectory(agent="codex")
    traj.event(
        "tool_call",
        "",
        tool="apply_patch",
        args={"input": f"*** Begin Patch\n*** Update File: Makefile\n@@\n-all:\n+all:\n+\t{CLONE}\n*** End Patch"},
    )
    traj.event("tool_call", "", tool="shell", args={"command": "make"})
    voided, findings = void_if_cheating(traj)
    assert voided and findings[0].source == "file:Makefile"


# --- OpenHands (headless --json) -------------------------------------------------------------------------------
def oh_action(tool: str, args: dict, cid: str) -> list[dict]:
    return [
        {
            "kind": "ActionEvent",
            "source": "agent",
            "tool_name": tool,
            "tool_call_id": cid,
            "tool_call": {"id": cid, "name": tool, "arguments": json.dumps({**args, "security_risk": "LOW"})},
            "action": {**args, "kind": "X"},
        },
        {
            "kind": "ObservationEvent",
            "source": "environment",
            "tool_name": tool,
            "tool_call_id": cid,
            "observation": {"content": [{"type": "text", "text": "ok"}], "is_error": False, "kind": "Y"},
        },
    ]


def openhands(*actions: tuple[str, dict]) -> Trajectory:
    return traj_from("openhands", [o for i, (tool, args) in enumerate(actions) for o in oh_action(tool, args, f"c{i}")])


def test_openhands_file_editor_create_then_terminal_run() -> None:
    code = f'import os\nos.system("{CLONE}")\n'
    traj = openhands(
        ("file_editor", {"command": "create", "path": "/ws/bootstrap.py", "file_text": code}),
        ("terminal", {"command": "cd /ws && python3 bootstrap.py"}),
    )
    voided, findings = void_if_cheating(traj)
    assert voided and [(f.rule, f.source, f.detail["via"]) for f in findings] == [
        ("git_clone", "file:/ws/bootstrap.py", "file_editor")
    ]


def test_openhands_docs_and_unrun_edits() -> None:
    traj = openhands(
        ("file_editor", {"command": "create", "path": "/ws/docs/SETUP.md", "file_text": f"Run `{CLONE}`.\n"}),
        (
            "str_replace_editor",
            {
                "command": "str_replace",
                "path": "/ws/app.py",
                "old_str": "pass",
                "new_str": 'requests.get("https://github.com/a/b/archive/main.zip")',
            },
        ),
        ("terminal", {"command": "python3 -m pytest -q"}),
    )
    voided, findings = void_if_cheating(traj)
    assert not voided and [(f.rule, f.severity, f.source) for f in findings] == [
        ("source_download", "warn", "file:/ws/app.py")
    ]


# --- shell heredocs and the execution parser -------------------------------------------------------------------
@pytest.mark.parametrize(
    "command,voided",
    [
        (f"cat > README.md <<'EOF'\n## Install\n{CLONE}\nEOF", False),
        (f"cat > fetch.sh <<'EOF'\n{CLONE}\nEOF\nbash fetch.sh", True),
        (f"bash <<'EOF'\n{CLONE}\nEOF", True),
        (f"cat <<EOF | sh\n{CLONE}\nEOF", True),
        (f"tee docs/notes.md > /dev/null <<EOF\n{CLONE}\nEOF", False),
        (f"echo '{CLONE}' >> README.md", True),  # not a heredoc: the command text itself counts (documented)
    ],
)
def test_heredocs(command: str, voided: bool) -> None:
    traj = Trajectory(agent="builtin")
    traj.event("tool_call", command, tool="shell", args={"command": command})
    assert void_if_cheating(traj)[0] is voided


def test_split_shell_writes() -> None:
    code, writes = split_shell_writes("cd app\ncat >> setup.sh <<-EOF\n\tgit pull\n\tEOF\nbash setup.sh", 3)
    assert code == "cd app\ncat >> setup.sh <<-EOF\n\tEOF\nbash setup.sh"
    assert [(w.index, w.path, w.text, w.full, w.via) for w in writes] == [
        (3, "setup.sh", "\tgit pull", False, "heredoc")
    ]


@pytest.mark.parametrize(
    "command,names",
    [
        ("./setup.sh", {"setup.sh"}),
        ("cd x && bash -e scripts/a.sh arg", {"cd", "bash", "a.sh"}),
        ("sudo -E env FOO=1 timeout 30 python3 -u tools/fetch.py", {"python3", "fetch.py"}),
        ("/bin/bash -lc 'source .env.sh; node server.js'", {"bash", "source", ".env.sh", "node", "server.js"}),
        ("docker exec -w /app app-1 sh -c 'sh boot.sh'", {"sh", "boot.sh"}),
        ("python -m pkg.loader", {"python", "loader.py"}),
        (
            "npm ci && make -f build.mk",
            {"npm", "package.json", "make", "Makefile", "makefile", "GNUmakefile", "build.mk"},
        ),
        ("python3 -c 'print(1)'", {"python3"}),
        ("uv run python manage.py migrate", {"python", "manage.py"}),
    ],
)
def test_executed_names(command: str, names: set[str]) -> None:
    assert executed_names(command) == names
