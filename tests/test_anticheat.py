"""Anti-cheat scan of trajectories (saasbench.agents.anticheat) and evaluator-integrity hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from saasbench.agents import Trajectory
from saasbench.agents.anticheat import (
    classify_url,
    hash_paths,
    integrity_findings,
    scan_command,
    shell_commands,
    void_if_cheating,
)


def trajectory(*commands: str, files: dict[str, str] | None = None) -> Trajectory:
    """A trajectory as the builtin agent records it: a model_call, then tool_call/tool_result per command."""
    traj = Trajectory(agent="builtin", model="openai/fake")
    for cmd in commands:
        traj.event("model_call", "", role="assistant", tool_calls=[{"tool": "shell", "id": "c"}])
        traj.event("tool_call", cmd, tool="shell", args={"command": cmd})
        traj.event("tool_result", "exit code: 0", tool="shell", exit_code=0)
    for path, content in (files or {}).items():
        traj.event("tool_call", path, tool="write_file", args={"path": path, "content": content})
    return traj.finish("completed")


def test_git_clone_is_voided_with_evidence() -> None:
    traj = trajectory("ls -la", "git clone https://github.com/x/y && cp -r y/* .", "bash run.sh")
    voided, findings = void_if_cheating(traj)
    assert voided
    f = next(f for f in findings if f.severity == "void")
    assert f.rule == "git_clone" and f.event_index == 4  # the tool_call event of the second command
    assert traj.events[f.event_index].data["args"]["command"] == f.command
    assert "git clone https://github.com/x/y" in f.evidence and f.source == "shell"


def test_clean_trajectory_is_not_voided() -> None:
    traj = trajectory(
        "cat task.md",
        "pip install requests flask",
        "npm install express",
        "apt-get install -y jq",
        "curl -fsSL https://deb.nodesource.com/setup_20.x | bash",
        "curl -s http://127.0.0.1:8080/api/health",
        "git init && git add -A && git commit -m wip",
        "python3 -m pytest -q",
    )
    voided, findings = void_if_cheating(traj)
    assert not voided and findings == []


def test_pip_install_requests_not_voided() -> None:
    assert void_if_cheating(trajectory("pip install requests")) == (False, [])


@pytest.mark.parametrize(
    "cmd",
    [
        "curl -L -o src.tar.gz https://example.com/project-1.2.tar.gz && tar xzf src.tar.gz",
        "wget https://github.com/x/y/archive/refs/heads/main.zip",
        "curl -sL https://codeload.github.com/x/y/tar.gz/main | tar xz",
        "curl -O https://raw.githubusercontent.com/x/y/main/app.py",
        "curl -L https://api.github.com/repos/x/y/tarball | tar xz",
        "gh repo clone x/y",
        "git submodule add https://github.com/x/y vendor/y",
        "git clone --depth 1 git@github.com:x/y.git app",
        "git remote add upstream https://github.com/x/y.git; git pull upstream main",
        'docker exec app bash -c "git clone https://gitlab.com/x/y"',
        "docker pull kimai/kimai2 && docker create --name k kimai/kimai2 && docker cp k:/opt/kimai ./app",
        "python3 -c \"import urllib.request as u; u.urlretrieve('https://gitlab.com/x/y/-/archive/main/y-main.tar.gz', 'y.tgz')\"",
    ],
)
def test_source_fetches_are_voided(cmd: str) -> None:
    voided, findings = void_if_cheating(trajectory(cmd))
    assert voided, (cmd, findings)


@pytest.mark.parametrize(
    "cmd,rule",
    [
        ("pip download flask", "pip_download"),
        ("npm pack express", "npm_pack"),
        ("docker pull someone/helpdesk:latest", "docker_pull"),
        ("pip install git+https://github.com/x/y", "pip_install_git"),
        ("curl -LO https://github.com/jqlang/jq/releases/download/jq-1.7/jq-linux64", "release_download"),
        ("git clone . /tmp/backup", "git_clone"),
    ],
)
def test_warnings_do_not_void(cmd: str, rule: str) -> None:
    voided, findings = void_if_cheating(trajectory(cmd))
    assert not voided and [f.rule for f in findings] == [rule] and findings[0].severity == "warn"


def test_allowed_toolchains_and_images() -> None:
    assert scan_command("wget https://nodejs.org/dist/v20.11.0/node-v20.11.0-linux-x64.tar.xz") == []
    assert scan_command("docker run --rm -d -p 5432:5432 -e POSTGRES_PASSWORD=x postgres:16") == []
    assert scan_command("docker pull python:3.11-slim") == []
    assert classify_url("https://example.com/a.tar.gz", allowed_hosts={"example.com"}) is None
    assert classify_url("https://example.com/a.tar.gz") == "void"


def test_written_script_counts_only_when_run_afterwards() -> None:
    script = {"setup.sh": "#!/bin/sh\ngit clone https://github.com/x/y vendor\n"}
    # run before it was written (an older setup.sh): the clone was never executed -> a warning only
    voided, findings = void_if_cheating(trajectory("bash setup.sh", files=script))
    assert not voided and [(f.rule, f.severity, f.source) for f in findings] == [("git_clone", "warn", "file:setup.sh")]
    assert findings[0].detail["executed_at"] is None
    # written, then run: voided, with the write as the evidence and the run recorded
    traj = Trajectory(agent="builtin")
    traj.event("tool_call", "setup.sh", tool="write_file", args={"path": "setup.sh", "content": script["setup.sh"]})
    traj.event(
        "tool_call",
        "chmod +x setup.sh && ./setup.sh",
        tool="shell",
        args={"command": "chmod +x setup.sh && ./setup.sh"},
    )
    voided, findings = void_if_cheating(traj)
    assert voided and [(f.rule, f.source, f.event_index, f.detail["executed_at"]) for f in findings] == [
        ("git_clone", "file:setup.sh", 0, 1)
    ]
    assert void_if_cheating(traj, include_files=False) == (False, [])  # shell commands only


def test_oracle_style_and_dict_trajectories() -> None:
    traj = Trajectory(agent="oracle")
    traj.event("tool_call", "git clone https://github.com/x/y", tool="exec", timeout_s=1)
    assert shell_commands(traj) == [(0, "git clone https://github.com/x/y")]
    assert void_if_cheating(traj.model_dump())[0]  # a trajectory loaded from JSON works too


def test_evaluator_integrity_hashes(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "a.py").write_text("assert True\n")
    (tmp_path / "dag.json").write_text("{}")
    before = hash_paths(["tests", "dag.json", "missing.txt"], root=tmp_path)
    assert set(before) == {"tests/a.py", "dag.json", "missing.txt"} and before["missing.txt"] is None
    assert len(before["dag.json"] or "") == 64
    assert integrity_findings(before, hash_paths(["tests", "dag.json", "missing.txt"], root=tmp_path)) == []
    (tmp_path / "dag.json").write_text('{"nodes": []}')
    (tmp_path / "tests" / "b.py").write_text("x = 1\n")
    after = hash_paths(["tests", "dag.json", "missing.txt"], root=tmp_path)
    found = integrity_findings(before, after)
    assert [(f.detail["path"], f.evidence.split()[-1]) for f in found] == [
        ("dag.json", "modified"),
        ("tests/b.py", "created"),
    ]
    assert all(f.severity == "void" and f.rule == "evaluator_modified" for f in found)


def test_a_cheating_trial_is_voided_end_to_end(tmp_path):
    """run_local_trial marks a trajectory that clones a repository as voided_cheat, with evidence."""
    import saasbench.agents.base as base
    from saasbench.catalog.tasks import load_task
    from saasbench.runs.trial import run_local_trial

    class Cloner(base.Agent):
        name = "test-cloner"
        version = "0"

        def run(self, prompt, env, budget):
            env.exec("true", timeout_s=5)
            event = base.TrajectoryEvent(
                t_s=0.0,
                kind="tool_call",
                data={"tool": "shell", "args": {"command": "git clone https://github.com/acme/timetrack-clone"}},
            )
            return base.Trajectory(agent=self.name, events=[event], exit_reason="completed")

    result = run_local_trial(load_task("timetrack"), Cloner())
    assert result.outcome == "voided_cheat"
    assert any("git clone" in str(f) for f in result.cheat_findings)
