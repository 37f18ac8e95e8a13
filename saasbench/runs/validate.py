"""Reference validation: does a task's DAG pass, reliably, on the task's reference implementation?

For each repeat: a fresh :class:`~saasbench.environments.local.LocalEnvironment`, the ``oracle`` agent
installs the reference, :func:`~saasbench.environments.base.start_app` starts it, the task's DAG is
evaluated against it, the environment is stopped. Per node across repeats:

- ``pass``: PASSED in every counted repeat;
- ``flaky``: PASSED in some repeats and not in others. ``flaky_cause`` is ``own`` when the node
  itself failed at least once, ``prerequisite`` when it only ever missed runs because a
  prerequisite did not pass (SKIPPED_DEPENDENCY);
- ``always_failing``: never PASSED (a DAG defect, or a reference gap);
- ``skipped_llm``: the judge never answered (SKIPPED_LLM in every repeat); such repeats are
  not counted for the other verdicts, and these nodes are listed separately.

Writes ``validation.json`` (:class:`ValidationReport`), one ``report.json`` per repeat, and a
quarantine file listing the flaky nodes whose own outcome varied (the format ``evaluate
--quarantine`` reads: one node id per line, ``#`` comments).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task
    from saasbench.evaluation.results import NodeResult

Verdict = Literal["pass", "flaky", "always_failing", "skipped_llm"]
FlakyCause = Literal["own", "prerequisite"]


class RepeatRecord(BaseModel):
    index: int
    workspace: str | None = None
    oracle_exit_reason: str
    oracle_error: str | None = None
    app_ok: bool
    app_error: str | None = None
    app_log_tail: str = ""
    task_score: float | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    report: str | None = None
    elapsed_s: float = 0.0


class NodeValidation(BaseModel):
    id: str
    category: str
    method: str
    max_score: float
    statuses: list[str] = Field(description="Status per repeat, in repeat order")
    passed: int
    counted: int = Field(description="Repeats not SKIPPED_LLM")
    pass_rate: float | None
    verdict: Verdict
    flaky_cause: FlakyCause | None = None
    last_message: str = ""


class ValidationReport(BaseModel):
    schema_version: int = 1
    task_id: str
    dag: str
    repeats: int
    started_at: str
    elapsed_s: float
    repeat_records: list[RepeatRecord]
    nodes: list[NodeValidation]
    flaky: list[str]
    quarantine: list[str] = Field(description="Flaky nodes whose own outcome varied: what the quarantine file lists")
    always_failing: list[str]
    skipped_llm: list[str]
    out_dir: str
    quarantine_path: str


Progress = Callable[[int, str], None]


def _classify(statuses: list[str]) -> tuple[int, int, Verdict, FlakyCause | None]:
    counted = [s for s in statuses if s != "SKIPPED_LLM"]
    passed = sum(1 for s in counted if s == "PASSED")
    if not counted:
        return 0, 0, "skipped_llm", None
    if passed == len(counted):
        return passed, len(counted), "pass", None
    if passed == 0:
        return passed, len(counted), "always_failing", None
    own = any(s not in ("PASSED", "SKIPPED_DEPENDENCY") for s in counted)
    return passed, len(counted), "flaky", "own" if own else "prerequisite"


def validate_reference(
    task: Task,
    repeats: int = 3,
    *,
    out_dir: str | Path | None = None,
    quarantine_path: str | Path | None = None,
    progress: Progress | None = None,
    keep_workspaces: bool = False,
) -> ValidationReport:
    """Run the oracle + DAG ``repeats`` times on fresh local environments and classify each node.

    ``out_dir`` (default ``runs/validate-<task>-<timestamp>``) receives ``validation.json``,
    ``repeat-<n>/report.json`` and, unless ``quarantine_path`` says otherwise, ``quarantine.txt``.
    ``progress(repeat, message)`` is called as work advances. Raises ``DagLoadError`` for a DAG
    that does not load and ``ValueError`` for ``repeats < 1``; an oracle or app failure is
    recorded in the repeat (its nodes then fail), never raised.
    """
    from saasbench.dag import load_dag
    from saasbench.runs.trial import run_local_trial

    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    dag = load_dag(task.dag_path).dag
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if out_dir is None:
        out_dir = Path("runs") / f"validate-{task.id}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    q_path = Path(quarantine_path) if quarantine_path is not None else out_dir / "quarantine.txt"
    say = progress or (lambda i, m: None)
    t_all = time.perf_counter()

    records: list[RepeatRecord] = []
    per_node: dict[str, list[str]] = {n.id: [] for n in dag.nodes}
    messages: dict[str, str] = {}
    for i in range(1, repeats + 1):
        t0 = time.perf_counter()

        def on_node(r: NodeResult, i: int = i) -> None:
            say(i, f"{r.id} {r.status.value}")

        def say_repeat(m: str, i: int = i) -> None:
            say(i, f"repeat {i}/{repeats}: {m}")

        trial = run_local_trial(task, "oracle", keep_workspace=keep_workspaces, on_node=on_node, say=say_repeat)
        report, traj, workspace = trial.report, trial.trajectory, trial.workspace
        app = trial
        rep_dir = out_dir / f"repeat-{i}"
        rep_dir.mkdir(parents=True, exist_ok=True)
        (rep_dir / "report.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
        (rep_dir / "trajectory.json").write_text(traj.model_dump_json(indent=2), encoding="utf-8")
        for r in report.nodes:
            per_node.setdefault(r.id, []).append(r.status.value)
            if r.status.value != "PASSED":
                messages[r.id] = r.message
        records.append(
            RepeatRecord(
                index=i,
                workspace=workspace if keep_workspaces else None,
                oracle_exit_reason=traj.exit_reason,
                oracle_error=traj.error,
                app_ok=app.app_ok,
                app_error=app.app_error,
                app_log_tail=app.app_log_tail,
                task_score=report.summary.task_score,
                counts={k: v for k, v in report.summary.counts.model_dump().items() if v},
                report=str(rep_dir / "report.json"),
                elapsed_s=round(time.perf_counter() - t0, 3),
            )
        )
        say(i, f"repeat {i}/{repeats}: task score {report.summary.task_score}")

    nodes: list[NodeValidation] = []
    for n in dag.nodes:
        statuses = per_node.get(n.id, [])
        passed, counted, verdict, cause = _classify(statuses)
        nodes.append(
            NodeValidation(
                id=n.id,
                category=n.scoring.category,
                method=n.method,
                max_score=n.max_score,
                statuses=statuses,
                passed=passed,
                counted=counted,
                pass_rate=round(passed / counted, 4) if counted else None,
                verdict=verdict,
                flaky_cause=cause,
                last_message=messages.get(n.id, ""),
            )
        )
    flaky = [v.id for v in nodes if v.verdict == "flaky"]
    quarantine = [v.id for v in nodes if v.verdict == "flaky" and v.flaky_cause == "own"]
    via_prereq = [v.id for v in nodes if v.verdict == "flaky" and v.flaky_cause == "prerequisite"]
    report_out = ValidationReport(
        task_id=task.id,
        dag=str(task.dag_path),
        repeats=repeats,
        started_at=started_at,
        elapsed_s=round(time.perf_counter() - t_all, 3),
        repeat_records=records,
        nodes=nodes,
        flaky=flaky,
        quarantine=quarantine,
        always_failing=[v.id for v in nodes if v.verdict == "always_failing"],
        skipped_llm=[v.id for v in nodes if v.verdict == "skipped_llm"],
        out_dir=str(out_dir),
        quarantine_path=str(q_path),
    )
    header = [
        f"# Quarantine for task {task.id}: nodes whose verdict on the reference implementation varied",
        f"# across {repeats} repeat(s) of `saasbench validate-reference` ({started_at}).",
        "# One node id per line; pass this file to `saasbench evaluate --quarantine`.",
    ]
    if via_prereq:
        header.append("# Flaky only through a flaky prerequisite (not listed): " + ", ".join(via_prereq))
    q_path.parent.mkdir(parents=True, exist_ok=True)
    q_path.write_text("\n".join(header + quarantine) + "\n", encoding="utf-8")
    (out_dir / "validation.json").write_text(report_out.model_dump_json(indent=2), encoding="utf-8")
    return report_out
