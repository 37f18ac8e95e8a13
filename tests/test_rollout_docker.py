"""A rollout on the Docker backend: the agent's container holds the workspace (PRD and KB copies) and
nothing of the evaluator (dag.json, reference/); the workspace is kept on the host in the output folder."""

from __future__ import annotations

from pathlib import Path

from test_integrity import ScriptedAgent

from saasbench.catalog.tasks import load_task
from saasbench.runs.trial import run_rollout


def test_docker_rollout_sees_no_evaluator_files(tmp_path: Path, docker_client, python_image) -> None:  # noqa: F811
    task = load_task("timetrack")
    agent = ScriptedAgent(
        "pwd; find . -mindepth 1 | sort",
        "find / -xdev \\( -name dag.json -o -name reference \\) -not -path '/proc/*' 2>/dev/null | sort",
        f"test -e {task.root} && echo visible || echo absent",
        "echo built > made.txt",
    )
    ro = run_rollout(task, agent, out_dir=tmp_path / "ro", backend="docker", docker_client=docker_client)
    assert ro.outcome == "completed" and ro.backend == "docker", ro.trajectory.error
    lines = agent.outputs[0].split()
    assert lines[0] == "/app" and lines[1:] == ["./knowledge_base.json", "./task.md"]
    assert agent.outputs[1].strip() == ""  # no dag.json, no reference folder anywhere in the container
    assert agent.outputs[2].strip() == "absent"
    ws = tmp_path / "ro" / "workspace"
    assert (ws / "made.txt").read_text() == "built\n" and (ws / "task.md").is_file()
    assert ro.cheat_findings == [] and ro.integrity_findings == []
