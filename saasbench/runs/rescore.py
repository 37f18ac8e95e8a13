"""``saasbench rescore``: score a past sweep again from its frozen end states, into a new, linked sweep.

For each committed trial of the parent sweep that has an ``end_states`` row, the trial's stored records
seed the new trial's checkpoints (:mod:`saasbench.runs.stages`): its rollout (trajectory, findings, model
calls) and its frozen end state. Then the usual stages run: **evaluate** restores the end state into a
fresh environment of the recorded backend and runs the DAG (the task's, or ``--dag``), **judge** judges
the deferred llm-judge nodes (the sweep's judge, or ``--judge-model``) and **commit** writes the trial
into the new sweep. The agent never runs.

``judge_only`` starts no environment: the stored evaluation record (the report with its llm-judge nodes
pending and their evidence) seeds the evaluate checkpoint, so only the judge stage runs. It re-judges the
deferred nodes; a node judged inline during the evaluation (another node reads its verdict) keeps its
verdict, since changing it would change its dependents too: that needs a full rescore.

The new sweep's row records the lineage: ``parent_sweep_id``, ``dag_hash`` (of ``--dag``; None: each
task's own DAG), ``judge_model`` and ``harness_version``; ``saasbench compare PARENT NEW`` shows what
changed, node by node.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saasbench.failures import HarnessError

if TYPE_CHECKING:
    from saasbench.runs.stages import Checkpoints

log = logging.getLogger(__name__)


class RescoreError(ValueError):
    """The parent sweep cannot be rescored as asked (unknown sweep, no end states, bad DAG)."""


@dataclass
class RescoreResult:
    sweep_id: str
    parent_sweep_id: str
    outcomes: dict[str, str] = field(default_factory=dict)  # trial_id -> committed outcome
    skipped: dict[str, str] = field(default_factory=dict)  # trial_id -> why it was not rescored
    failed: dict[str, str] = field(default_factory=dict)  # trial_id -> infrastructure failure left after retries


def _rows(store: Any, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    from saasbench import lake as lakelib

    return lakelib.query(store, sql, params).to_pylist()


def default_sweep_id(parent: str, *, judge_only: bool) -> str:
    return f"{parent}-{'rejudge' if judge_only else 'rescore'}-{time.strftime('%Y%m%dT%H%M%S')}"


def rescore(
    parent_sweep_id: str,
    *,
    lake: str | None = None,
    dag: str | Path | None = None,
    judge: Any = None,
    judge_settings: Mapping[str, Any] | None = None,
    sweep_id: str | None = None,
    judge_only: bool = False,
    say: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RescoreResult:
    """Rescore ``parent_sweep_id`` into a new sweep (see the module docstring). ``judge``: a JudgeConfig
    (or mapping) replacing the parent's judge; ``judge_settings``: JudgeConfig fields (max_tokens,
    temperature, timeout_s, votes, ...) changed on the judge used (``judge``, else the parent's);
    ``dag``: a DAG file replacing each task's DAG."""
    from saasbench import lake as lakelib
    from saasbench import settings
    from saasbench.runs import stages
    from saasbench.runs.sweep import SweepSpec, TrialSpec, id_part, record_failure
    from saasbench.services import limits

    say = say or (lambda m: None)
    store = lakelib.lake_from_uri(settings.lake_uri(lake))
    parents = _rows(store, "SELECT config_json FROM sweeps WHERE sweep_id = ?", [parent_sweep_id])
    if not parents:
        raise RescoreError(f"sweep {parent_sweep_id!r} is not in the lake {store.uri}")
    config = json.loads(parents[0]["config_json"] or "{}")
    trials = _rows(
        store,
        "SELECT trial_id, task_id, agent, model, attempt, outcome FROM trials WHERE sweep_id = ? ORDER BY trial_id",
        [parent_sweep_id],
    )
    ends = {
        r["trial_id"]: r
        for r in _rows(
            store,
            "SELECT trial_id, manifest_key, rollout_key, evaluation_key, backend FROM end_states WHERE sweep_id = ?",
            [parent_sweep_id],
        )
    }
    dag_obj, dag_hash = _load_dag(dag)
    new_id = sweep_id or default_sweep_id(parent_sweep_id, judge_only=judge_only)
    if new_id == parent_sweep_id:
        raise RescoreError("the rescore needs a new sweep id (--sweep-id), not the parent's")
    data = {k: v for k, v in config.items() if k in SweepSpec.model_fields}
    data.update(sweep_id=new_id, lake=store.uri, name=f"rescore of {parent_sweep_id}")
    data.pop("judge_model", None)
    if judge is not None:
        data["judge"] = judge if isinstance(judge, dict) else judge.model_dump(mode="json")
    if judge_settings:
        if not data.get("judge"):
            raise RescoreError(
                f"judge settings ({', '.join(judge_settings)}) need a judge: the parent sweep has none, pass --judge-model"
            )
        data["judge"] = {**data["judge"], **judge_settings}
    if data.get("gateway"):  # rescoring never runs an agent: no model gateway
        data["gateway"] = None
    try:
        spec = SweepSpec.model_validate(data)
    except ValueError as exc:
        raise RescoreError(f"cannot build the rescore sweep from {parent_sweep_id}'s configuration: {exc}") from exc
    limits.configure_from_spec(spec)
    if judge_only and spec.judge is None:
        raise RescoreError("--judge-only needs a judge (the parent sweep has none: pass --judge-model)")
    lakelib.write_sweep(
        store,
        {
            **lakelib.sweep_row(
                spec.sweep_id,
                config=spec,
                name=spec.name,
                tasks=sorted({t["task_id"] for t in trials}),
                agents=sorted({t["agent"] for t in trials if t["agent"]}),
                models=sorted({t["model"] for t in trials if t["model"]}),
                attempts=spec.attempts,
            ),
            "parent_sweep_id": parent_sweep_id,
            "dag_hash": dag_hash,
            "judge_model": spec.judge.model if spec.judge else None,
            "rescore_mode": "judge-only" if judge_only else "full",
        },
    )
    names = {id_part(n): n for n in config.get("tasks") or []}
    result = RescoreResult(sweep_id=new_id, parent_sweep_id=parent_sweep_id)
    for row in trials:
        tid = row["trial_id"]
        es = ends.get(tid)
        if es is None or not es.get("rollout_key") or (judge_only and not es.get("evaluation_key")):
            result.skipped[tid] = (
                f"no frozen end state (parent outcome {row['outcome']}: failed before the freeze, or committed "
                "before end states existed)"
            )
            continue
        trial = TrialSpec(
            task=names.get(row["task_id"], row["task_id"]),
            agent=row["agent"],
            model=row["model"],
            attempt=row["attempt"] or 0,
        )
        run = stages.TrialRun(trial=trial, spec=spec, store=store, say=say)
        seed_checkpoints(run.checkpoints, store, es, with_evaluation=judge_only, origin={"rescore_of": parent_sweep_id})
        say(f"{trial.label}: {'judging' if judge_only else 'restoring and evaluating'}")
        try:
            with limits.environment_slot():
                result.outcomes[tid] = stages.finish_frozen(run, dag=dag_obj, sleep=sleep)
        except HarnessError as exc:
            if exc.retryable:
                result.failed[tid] = f"{type(exc).__name__}: {exc}"
            result.outcomes[tid] = record_failure(trial, spec, exc, lake=store)
        finally:
            run.close()
    return result


def _load_dag(path: str | Path | None) -> tuple[Any, str | None]:
    if path is None:
        return None, None
    from saasbench.dag import DagLoadError, load_dag

    p = Path(path)
    try:
        raw = p.read_bytes()
        loaded = load_dag(p)
    except (OSError, DagLoadError) as exc:
        raise RescoreError(f"--dag {p}: {exc}") from exc
    return loaded.dag, hashlib.sha256(raw).hexdigest()


def seed_checkpoints(
    ck: Checkpoints, store: Any, es: dict[str, Any], *, with_evaluation: bool, origin: dict[str, Any] | None = None
) -> None:
    """Seed a trial's stage checkpoints from its frozen end state (its ``end_states`` row): the built
    environment, the rollout record, the freeze and, ``with_evaluation``, the evaluation record. The
    stages then go on from there without running the agent (a rescore; a trial `lake repair` took out)."""
    from saasbench.runs import endstate

    ck.clear()  # whatever a half-finished earlier attempt left
    ck.save("build_env", {"backend": es["backend"], "images": {}, **(origin or {"seeded_from": es["manifest_key"]})})
    ck.save("rollout", endstate.load_record(store, es["rollout_key"]))
    ck.save("freeze", {"manifest_key": es["manifest_key"], "backend": es["backend"]})
    if with_evaluation and es.get("evaluation_key"):
        ck.save("evaluate", endstate.load_record(store, es["evaluation_key"]))


def reseed_repaired(store: Any, restorable: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """After ``lake repair`` took trials out: seed each one whose end state survives so the next run of
    its sweep commits it again from its records. Returns the (sweep_id, trial_id) seeded."""
    from saasbench.runs import stages

    done = []
    for sweep_id, trial_id, es in restorable:
        try:
            seed_checkpoints(stages.Checkpoints(store, sweep_id, trial_id), store, es, with_evaluation=True)
        except Exception as exc:  # noqa: BLE001 - a missing record: the trial is simply run again
            log.warning("cannot seed %s of %s from its end state: %s", trial_id, sweep_id, exc)
            continue
        done.append((sweep_id, trial_id))
    return done
