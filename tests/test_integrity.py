"""Evaluator integrity in trials (saasbench/runs/trial.py): what the agent's workspace contains, hashes of the
integrity paths before and after the rollout, and access to the task folder on the local backend."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from test_environment_local import make_task

from saasbench.agents.base import Agent, Trajectory
from saasbench.catalog.tasks import TaskError, load_task, load_task_dir
from saasbench.failures import TaskDefect
from saasbench.runs.trial import integrity_targets, run_local_trial, run_rollout

TIMETRACK = Path(__file__).resolve().parents[1] / "tasks" / "timetrack"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ScriptedAgent(Agent):
    """Runs shell commands in the workspace and records each as a shell tool call (like the builtin agent)."""

    name = "test-scripted"
    version = "0"

    def __init__(self, *commands: str):
        self.commands = commands
        self.outputs: list[str] = []

    def run(self, prompt, env, budget):
        traj = self.new_trajectory()
        for cmd in self.commands:
            traj.event("tool_call", cmd, tool="shell", args={"command": cmd})
            res = env.exec(cmd, timeout_s=30)
            self.outputs.append(res.stdout)
            traj.event("tool_result", res.stdout[-2000:], tool="shell", exit_code=res.exit_code)
            traj.steps += 1
        return traj.finish("completed")


def with_integrity_paths(task_dir: Path, paths: list[str]) -> Path:
    spec = yaml.safe_load((task_dir / "task.yaml").read_text())
    spec["integrity_paths"] = paths
    (task_dir / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return task_dir


def test_agent_workspace_has_no_evaluator_files(tmp_path: Path) -> None:
    """What the agent sees at the start of its rollout: the PRD and KB copies, nothing of dag.json or reference/."""
    agent = ScriptedAgent("find . -mindepth 1 | sort", "find . -type f -exec sha256sum {} +")
    ro = run_rollout(load_task("timetrack"), agent, out_dir=tmp_path / "ro")
    assert ro.outcome == "completed"
    assert agent.outputs[0].split() == ["./data", "./knowledge_base.json", "./task.md"]
    evaluator = {
        sha(p.read_bytes()) for p in [TIMETRACK / "dag.json", *(TIMETRACK / "reference").rglob("*")] if p.is_file()
    }
    seen = {line.split()[0] for line in agent.outputs[1].splitlines()}
    assert len(seen) == 2 and not (seen & evaluator)
    assert seen == {sha((TIMETRACK / "task.md").read_bytes()), sha((TIMETRACK / "knowledge_base.json").read_bytes())}


def test_default_integrity_targets_are_the_staged_inputs_and_only_warn(tmp_path: Path) -> None:
    task = load_task("timetrack")
    assert integrity_targets(task) == [
        ("task.md", "warn", "inputs_modified"),
        ("knowledge_base.json", "warn", "inputs_modified"),
    ]
    ro = run_rollout(
        task, ScriptedAgent("rm task.md", "echo '# notes' >> knowledge_base.json"), out_dir=tmp_path / "ro"
    )
    assert ro.outcome == "completed"  # moving or editing the PRD copy is not cheating: reported, not voided
    assert [(f["rule"], f["severity"], f["evidence"]) for f in ro.integrity_findings] == [
        ("inputs_modified", "warn", "knowledge_base.json modified"),
        ("inputs_modified", "warn", "task.md deleted"),
    ]
    assert (
        ro.integrity_findings[1]["detail"]["after"] is None and len(ro.integrity_findings[1]["detail"]["before"]) == 64
    )
    # the evidence is also on the trajectory (it reaches the lake's trajectory_events)
    assert [e.data["rule"] for e in ro.trajectory.events if e.kind == "anticheat"] == ["inputs_modified"] * 2


def test_declared_integrity_paths_void_on_any_change(tmp_path: Path) -> None:
    task_dir = with_integrity_paths(make_task(tmp_path / "tasks").root, ["task.md", "checks"])
    task = load_task_dir(task_dir)
    assert integrity_targets(task) == [
        ("task.md", "void", "evaluator_modified"),
        ("checks", "void", "evaluator_modified"),
    ]

    clean = run_rollout(
        task, ScriptedAgent("cat task.md > /dev/null", "mkdir -p src && echo x > src/a.py"), out_dir=tmp_path / "clean"
    )
    assert clean.outcome == "completed" and clean.integrity_findings == [] and clean.cheat_findings == []

    tampered = run_rollout(task, ScriptedAgent("echo 'all done' > task.md"), out_dir=tmp_path / "t1")
    assert tampered.outcome == "voided_cheat"
    assert [(f["rule"], f["severity"], f["evidence"]) for f in tampered.integrity_findings] == [
        ("evaluator_modified", "void", "task.md modified")
    ]
    assert tampered.outcome_detail == "voided_cheat: evaluator_modified: task.md modified"

    created = run_rollout(
        task, ScriptedAgent("mkdir -p checks && echo 'assert True' > checks/test_ok.py"), out_dir=tmp_path / "t2"
    )
    assert created.outcome == "voided_cheat"
    assert [f["evidence"] for f in created.integrity_findings] == ["checks/test_ok.py created"]


def test_integrity_path_outside_the_workspace_is_a_task_defect(tmp_path: Path) -> None:
    folder = with_integrity_paths(make_task(tmp_path / "tasks").root, ["../secrets"])
    with pytest.raises(TaskError, match=r"task.yaml: integrity_paths\[0\] '../secrets' leads outside the workspace"):
        load_task_dir(folder)  # refused when the task loads (docs/tasks.md "Paths in task.yaml") ...
    task = load_task_dir(make_task(tmp_path / "other").root)
    task.spec.integrity_paths = ["../secrets"]
    with pytest.raises(TaskDefect, match="integrity_paths"):  # ... and by the trial, should one get through
        integrity_targets(task)


@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_naming_the_task_folder_voids_the_trial_on_the_local_backend(tmp_path: Path, monkeypatch, sandbox) -> None:
    """The local sandbox hides the task folder (without it the agent can read it); a tool call that names it
    is evaluator_access (void) either way."""
    monkeypatch.setenv("SAASBENCH_LOCAL_SANDBOX", sandbox)
    task = load_task_dir(make_task(tmp_path / "tasks").root)
    agent = ScriptedAgent(f"cat {task.root}/dag.json | head -c 100")
    result = run_local_trial(task, agent)
    assert agent.outputs[0].startswith("{") == (sandbox == "off")  # it could read it only without the sandbox ...
    assert result.outcome == "voided_cheat"  # ... and is caught
    [finding] = result.cheat_findings
    assert finding["rule"] == "evaluator_access" and finding["detail"]["path"] == str(task.root)
    assert result.report.summary.total_nodes == 5  # the evaluation still ran on the state left


def test_trial_records_integrity_findings_in_the_result(tmp_path: Path) -> None:
    task = load_task_dir(with_integrity_paths(make_task(tmp_path / "tasks").root, ["knowledge_base.json"]))
    result = run_local_trial(task, ScriptedAgent("rm knowledge_base.json"))
    assert result.outcome == "voided_cheat" and result.cheat_findings == []
    assert [f["evidence"] for f in result.integrity_findings] == ["knowledge_base.json deleted"]
    assert result.rollout is not None and result.rollout.integrity_findings == result.integrity_findings


def test_a_trajectory_built_by_hand_still_gets_findings_appended(tmp_path: Path) -> None:
    class Cloner(Agent):
        name = "test-cloner"

        def run(self, prompt, env, budget):
            traj = Trajectory(agent=self.name)
            traj.event("tool_call", "", tool="Bash", args={"command": "git clone https://github.com/x/y app"})
            return traj.finish("completed")

    ro = run_rollout(load_task("timetrack"), Cloner(), out_dir=tmp_path / "ro")
    assert ro.outcome == "voided_cheat"
    assert [e.data["rule"] for e in ro.trajectory.events if e.kind == "anticheat"] == ["git_clone"]
