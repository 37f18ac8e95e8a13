"""The trial lifecycle as stages: build env -> provision -> rollout -> freeze -> evaluate -> judge -> commit.

Each stage is one function of a :class:`TrialRun` (the in-process state of one trial) and is the body of
one Prefect task in ``flows/`` (its own module and retry policy) and of one step of the no-Prefect path
(:func:`run_stages`). A stage that finishes writes its result to the trial's **checkpoints** in the
lake's object store (:class:`Checkpoints`, keys ``stages/sweep_id=<s>/trial_id=<t>/<stage>.json``), so a
retry or a resumed sweep continues from the last finished stage:

- ``build_env``: the Docker image of the task (content-addressed cache); nothing on the local backend.
- ``provision``: load the task, a fresh environment, the agent installed in it. Live state only.
- ``rollout``: the agent's run, the integrity hashes, the anti-cheat scan. Checkpointed, but only
  useful together with ``freeze``: a rollout whose environment died before the freeze is run again
  (nothing else can bring its system back). A rollout that stopped on a model outage
  (:mod:`saasbench.runs.outages`) is discarded, never checkpointed: it raises a retryable ``ModelError``
  and the retry runs the agent again in a fresh environment (the discarded attempts are kept under
  ``rollout_attempts`` and committed with the trial).
- ``freeze``: the end state (:mod:`saasbench.runs.endstate`) stored content-addressed; from here on
  the agent never runs again for this trial.
- ``evaluate``: the app started and the DAG run, in the live environment on the first try, else in a
  fresh environment restored from the frozen end state. llm-judge nodes whose verdict no other node
  reads are deferred: their evidence is stored, not judged.
- ``judge``: the deferred requests judged (the judge's own retries, then the stage's); a judge still
  down after the stage's retries makes the trial ``judge_error`` with its evidence kept, so
  ``saasbench rescore --judge-only`` can finish it later.
- ``commit``: the lake rows of the trial (with its ``end_states`` row) in one commit; the checkpoints
  are removed afterwards.

Retries are for infrastructure only (:class:`saasbench.failures.EnvError`, ``JudgeError``,
``ModelError``, ``LakeError``); an agent outcome is recorded, never retried. Nothing here imports Prefect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from saasbench.failures import EnvError, HarnessError, JudgeError, LakeError, ModelError, TaskDefect

log = logging.getLogger(__name__)

STAGES: tuple[str, ...] = ("build_env", "provision", "rollout", "freeze", "evaluate", "judge", "commit")
#: The checkpoint (not a stage) holding the rollouts discarded for a model outage: ``{"attempts": [...]}``.
ROLLOUT_ATTEMPTS = "rollout_attempts"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _jsonable(value: Any) -> Any:
    """Pydantic models, dataclasses and datetimes as plain JSON data (checkpoints are JSON)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class Checkpoints:
    """One trial's finished stages in the lake's object store (JSON, one object per stage).

    Written only after a stage finished, read at the start of a stage to skip it. The lake's readers
    and ``lake vacuum`` never look under ``stages/``; :meth:`clear` removes them once the trial is
    committed."""

    PREFIX = "stages"

    def __init__(self, store: Any, sweep_id: str, trial_id: str):
        self.store = store
        self.base = f"{self.PREFIX}/sweep_id={sweep_id}/trial_id={trial_id}/"

    def key(self, stage: str) -> str:
        return f"{self.base}{stage}.json"

    def load(self, stage: str) -> dict[str, Any] | None:
        raw = self.store.get(self.key(stage))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            log.warning("checkpoint %s is not JSON: the stage runs again", self.key(stage))
            return None
        return data if isinstance(data, dict) else None

    def save(self, stage: str, data: dict[str, Any]) -> None:
        self.store.put(self.key(stage), json.dumps(_jsonable(data), sort_keys=True, default=str).encode())

    def drop(self, *stages: str) -> None:
        self.store.delete([self.key(s) for s in stages])

    def finished(self) -> list[str]:
        names = {k[len(self.base) :].removesuffix(".json") for k in self.store.list(self.base)}
        return [s for s in STAGES if s in names]

    def clear(self) -> None:
        self.store.delete(self.store.list(self.base))


@dataclass
class TrialRun:
    """The in-process state of one trial between its stages (what cannot be a checkpoint: live objects)."""

    trial: Any  # saasbench.runs.sweep.TrialSpec
    spec: Any  # saasbench.runs.sweep.SweepSpec
    store: Any  # saasbench.lake.store.Store
    gateway: Any = None  # the sweep's Gateway, if any
    say: Callable[[str], None] = field(default=lambda m: None)
    on_node: Callable[[Any], None] | None = None  # every NodeResult as the evaluation produces it
    on_commit: Callable[[Any, Any], None] | None = None  # (TrialResult, TrialRows) once the trial is committed
    task: Any = None
    agent: Any = None
    access: Any = None  # this trial's TrialGateway
    env: Any = None  # the live environment from provision (None once stopped)
    rollout: Any = None  # the RolloutResult of this process's rollout
    started_at: dt.datetime = field(default_factory=_now)
    counters: dict[str, int] = field(default_factory=dict)  # stage -> times run (tests, logs)
    _env_stack: contextlib.ExitStack | None = None  # the live environment and its concurrency slot

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(self.store, self.spec.sweep_id, self.trial.trial_id)

    def label(self, stage: str) -> str:
        return f"{self.trial.label} · {stage}"

    def close_env(self) -> None:
        """Stop the live environment (idempotent): after the freeze nothing needs it but a first evaluate."""
        stack, self._env_stack, self.env = self._env_stack, None, None
        if stack is not None:
            try:
                stack.close()
            except Exception as exc:  # noqa: BLE001 - a failing stop must not hide the stage's own result
                log.warning("%s: stopping the environment failed: %s", self.trial.label, exc)

    def close(self) -> None:
        self.close_env()

    def _count(self, stage: str) -> None:
        self.counters[stage] = self.counters.get(stage, 0) + 1


def _load_task(name: str) -> Any:
    from saasbench.catalog.tasks import load_task

    try:
        return load_task(name)
    except Exception as exc:
        raise TaskDefect(f"cannot load task {name!r}: {exc}") from exc


def _is_env_failure(exc: BaseException) -> bool:
    """Exceptions that mean the environment (not the agent, not the task) failed."""
    if isinstance(exc, (EnvError, OSError, TimeoutError)):  # the one EnvError (saasbench.failures)
        return True
    mod = type(exc).__module__ or ""
    return mod.startswith(("docker.", "requests.", "urllib3."))


@contextlib.contextmanager
def infra_errors(run: TrialRun, stage: str) -> Iterator[None]:
    """Turn an environment failure inside ``stage`` into a retryable :class:`EnvError`."""
    try:
        yield
    except HarnessError:
        raise
    except Exception as exc:
        if _is_env_failure(exc):
            raise EnvError(f"{stage} failed for {run.trial.label}: {type(exc).__name__}: {exc}") from exc
        raise


class CommittedElsewhere(HarnessError):
    """Another run of the same sweep committed this trial while this one ran (its checkpoints are
    cleared at that commit): this run stops and keeps that result (``record_failure`` writes nothing).
    ``outcome`` is the committed trial's."""

    retryable = False

    def __init__(self, message: str, outcome: str):
        super().__init__(message)
        self.outcome = outcome


def committed_outcome(store: Any, sweep_id: str, trial_id: str) -> str | None:
    """The outcome of the trial if the lake holds it committed, else None."""
    from saasbench import lake as lakelib

    if not lakelib.is_committed(store, sweep_id, trial_id):
        return None
    rows = lakelib.query(
        store, "SELECT outcome FROM trials WHERE trial_id = ?", [trial_id], sweep_id=sweep_id
    ).to_pylist()
    return str(rows[0]["outcome"]) if rows else None


def _missing(run: TrialRun, what: str) -> HarnessError:
    """A stage's input checkpoint is gone: another run of the sweep committed the trial, or it is an error."""
    other = committed_outcome(run.store, run.spec.sweep_id, run.trial.trial_id)
    if other is not None:
        return CommittedElsewhere(f"{run.trial.label}: committed by another run of the sweep ({other})", other)
    return EnvError(f"{run.trial.label}: {what}")


# --- the stages -------------------------------------------------------------------------------------------
def build_env(run: TrialRun) -> dict[str, Any]:
    """The task's image on a container backend (built once per content key); nothing to do on the local one."""
    done = run.checkpoints.load("build_env")
    if done is not None:
        return done
    run._count("build_env")
    run.task = run.task or _load_task(run.trial.task)
    from saasbench.environments.imagecache import BuildError
    from saasbench.runs.trial import make_environment

    with infra_errors(run, "build_env"):
        try:
            images = make_environment(run.task, run.spec.backend).prepare()
        except BuildError as exc:
            raise EnvError(f"image build for {run.task.id} failed: {exc}") from exc
    out: dict[str, Any] = {"backend": run.spec.backend, "images": images}
    run.checkpoints.save("build_env", out)
    return out


def provision(run: TrialRun) -> None:
    """A fresh, started environment with the agent installed (live state; skipped once the trial is frozen)."""
    from saasbench.runs.trial import make_environment, resolve_agent
    from saasbench.services import limits

    if run.checkpoints.load("freeze") is not None:
        return  # the agent's system is frozen: later stages restore it, no environment is needed now
    run._count("provision")
    run.task = run.task or _load_task(run.trial.task)
    run.close_env()
    limits.configure_from_spec(run.spec)
    agent = resolve_agent(run.trial.agent, run.trial.model)
    if run.gateway is not None:  # the agent reaches models through the sweep's gateway with this trial's key
        run.access = run.gateway.for_trial(run.trial.trial_id)
        agent = run.gateway.attach(agent, run.access)
    run.agent = agent
    with infra_errors(run, "provision"):
        stack = contextlib.ExitStack()
        run._env_stack = stack
        env = stack.enter_context(make_environment(run.task, run.spec.backend))
        run.env = env
        try:
            run.say(f"{agent.name}: installing in {env.workspace_path}")
            agent.install(env)
        except HarnessError:
            raise
        except Exception as exc:  # an install that fails is the environment's failure, never the agent's score
            raise EnvError(f"installing {agent.name} failed: {type(exc).__name__}: {exc}") from exc


def rollout(run: TrialRun) -> dict[str, Any]:
    """The agent's run in the provisioned environment. Never retried for an agent outcome."""
    from saasbench.runs.trial import rollout_in

    ck = run.checkpoints
    done = ck.load("rollout")
    if done is not None and (ck.load("freeze") is not None or run.rollout is not None):
        return done
    if done is not None:
        log.warning(
            "%s: rollout finished but its environment was lost before the freeze: running it again", run.trial.label
        )
        ck.drop("rollout")
    if run.env is None:  # a retry after the environment failed under the agent: a fresh one first
        provision(run)
    run._count("rollout")
    try:
        with infra_errors(run, "rollout"):
            ro = rollout_in(
                run.env, run.task, run.agent, trial_budget(run), say=run.say, backend=run.spec.backend, installed=True
            )
    except HarnessError as exc:
        if exc.retryable:
            run.close_env()  # what failed may be the environment: the retry provisions a fresh one
        raise
    calls = run.access.calls() if run.access is not None else []
    discarded = (ck.load(ROLLOUT_ATTEMPTS) or {}).get("attempts") or []
    outage = rollout_outage_of(ro, calls)
    if outage.outage:  # not the agent's doing: discard this rollout, retry it in a fresh environment
        attempt = attempt_record_of(run, ro, calls, outage)
        ck.save(ROLLOUT_ATTEMPTS, {"attempts": [*discarded, attempt]})
        run.close_env()
        raise ModelError(f"{run.trial.label}: {outage.reason}")
    run.rollout = ro
    record = rollout_record(ro, model_calls=calls)
    record["discarded"] = discarded
    ck.save("rollout", record)
    return record


def rollout_outage_of(ro: Any, calls: Any) -> Any:
    """:func:`saasbench.runs.outages.rollout_outage` of a RolloutResult and its gateway calls."""
    from saasbench.runs.outages import rollout_outage

    return rollout_outage(ro.outcome, calls, error=ro.trajectory.error)


def attempt_record_of(run: TrialRun, ro: Any, calls: Any, outage: Any) -> dict[str, Any]:
    from saasbench.runs.outages import attempt_record

    return attempt_record(
        outage,
        exit_reason=ro.trajectory.exit_reason,
        error=ro.trajectory.error,
        session=getattr(run.access, "session", None),
        steps=ro.trajectory.steps,
        started_at=ro.started_at,
        ended_at=ro.ended_at,
        model_calls=calls,
    )


def trial_budget(run: TrialRun) -> Any:
    """The rollout budget: the task's timeouts, with the sweep's ``budget`` overriding what it sets."""
    return spec_budget(run.spec, run.task)


def spec_budget(spec: Any, task: Any) -> Any:
    """The budget (``agents.base.Budget``) a trial of ``task`` in the sweep ``spec`` runs under; recorded
    in its ``trials`` row (budget_steps, budget_wall_s, budget_tool_call_s)."""
    from saasbench.runs.trial import task_budget

    b = spec.budget
    if b is None:
        return task_budget(task)
    return task_budget(task, steps=b.steps, wall_s=b.wall_s, tool_call_s=b.tool_call_s)


def rollout_record(ro: Any, *, model_calls: Any = ()) -> dict[str, Any]:
    """A RolloutResult as JSON data (what the later stages and ``rescore`` need of it)."""
    return {
        "task_id": ro.task_id,
        "agent": ro.agent,
        "outcome": ro.outcome,
        "outcome_detail": ro.outcome_detail,
        "trajectory": ro.trajectory.model_dump(mode="json"),
        "budget": ro.budget.model_dump(mode="json"),
        "backend": ro.backend,
        "cheat_findings": ro.cheat_findings,
        "integrity_findings": ro.integrity_findings,
        "artefacts": ro.artefacts,
        "started_at": ro.started_at,
        "ended_at": ro.ended_at,
        "model_calls": [_jsonable(c) for c in model_calls],
    }


def freeze(run: TrialRun) -> dict[str, Any]:
    """Capture the agent's end state before anything mutates it; store it content-addressed."""
    from saasbench.runs import endstate

    ck = run.checkpoints
    done = ck.load("freeze")
    if done is not None:
        return done
    if run.env is None:
        raise EnvError(f"{run.trial.label}: the environment is gone before the freeze")
    run._count("freeze")
    with infra_errors(run, "freeze"):
        frozen = endstate.freeze(run.env, run.task, run.store, agent=run.agent)
    record = {
        "manifest_key": frozen.manifest_key,
        "total_bytes": frozen.total_bytes,
        "new_bytes": frozen.new_bytes,
        "new_objects": frozen.new_objects,
        "freeze_s": frozen.seconds,
        "backend": run.spec.backend,
    }
    ck.save("freeze", record)
    return record


def _judge_for(spec: Any) -> Any:
    if spec.judge is None:
        return None
    from saasbench.services.judge import Judge

    return Judge(spec.judge)


def evaluate(run: TrialRun, *, dag: Any = None) -> dict[str, Any]:
    """Start the app and run the DAG: in the live environment if it is still there, else restored."""
    ck = run.checkpoints
    done = ck.load("evaluate")
    if done is not None:
        return done
    frozen = ck.load("freeze")
    if frozen is None:
        raise _missing(run, "no frozen end state to evaluate")
    run._count("evaluate")
    run.task = run.task or _load_task(run.trial.task)
    if dag is None:
        from saasbench.dag import load_dag

        try:
            dag = load_dag(run.task.dag_path).dag
        except Exception as exc:
            raise TaskDefect(f"cannot load the DAG of {run.task.id}: {exc}") from exc
    judge = _judge_for(run.spec)
    try:
        with infra_errors(run, "evaluate"):
            record = evaluate_frozen(run, frozen, dag, judge)
    except HarnessError:
        run.close_env()  # a retry restores into a fresh environment: this one may be what failed
        raise
    ck.save("evaluate", record)
    run.close_env()
    return record


def evaluate_frozen(run: TrialRun, frozen: dict[str, Any], dag: Any, judge: Any) -> dict[str, Any]:
    """The evaluation record of one frozen trial (live environment when there is one, else restored)."""
    from saasbench.runs import endstate
    from saasbench.runs.trial import make_environment, resolve_agent

    agent = run.agent or resolve_agent(run.trial.agent, run.trial.model)
    if run.env is not None:
        report, app, requests = _evaluate_in(run.env, run, agent, dag, judge)
        where = "live"
    else:
        with make_environment(run.task, run.spec.backend) as env:
            recipe = endstate.restore(run.store, frozen["manifest_key"], env)
            command = recipe.shell_command() or ""  # "": nothing to start, only the health wait
            report, app, requests = _evaluate_in(env, run, agent, dag, judge, command=command)
        where = "restored"
    return {
        "where": where,
        "report": report.model_dump(mode="json"),
        "app": {"ok": app.ok, "error": app.error, "log_tail": app.log_tail},
        "judge_requests": [_jsonable(r) for r in requests],
        "judge_calls": [_jsonable(c) for c in (getattr(judge, "calls", None) or [])],
    }


def _evaluate_in(env: Any, run: TrialRun, agent: Any, dag: Any, judge: Any, *, command: str | None = None):
    from saasbench.runs.trial import evaluate_in

    return evaluate_in(
        env, run.task, agent, dag, say=run.say, on_node=run.on_node, judge=judge, defer_judge=True, command=command
    )


def judge(run: TrialRun) -> dict[str, Any]:
    """Judge the deferred llm-judge requests; raises a retryable JudgeError while the judge is down."""
    from saasbench.evaluation.judging import JudgeRequest, judge_pending
    from saasbench.evaluation.results import RunReport

    ck = run.checkpoints
    done = ck.load("judge")
    if done is not None:
        return done
    ev = ck.load("evaluate")
    if ev is None:
        raise _missing(run, "nothing evaluated to judge")
    run._count("judge")
    requests = [JudgeRequest.model_validate(r) for r in ev.get("judge_requests") or []]
    stage_calls = list(ev.get("judge_stage_calls") or [])  # calls of earlier tries of this stage
    report = RunReport.model_validate(ev["report"])
    if requests:
        j = _judge_for(run.spec)
        if j is None:
            raise TaskDefect("judge requests were stored but the sweep has no judge")
        judged = judge_pending(report, requests, j)
        stage_calls += [_jsonable(c) for c in judged.calls]
        report = judged.report
        if judged.pending:  # keep what was judged: a retry asks the judge only for the nodes still pending
            ck.save("evaluate", {**ev, "report": report.model_dump(mode="json"), "judge_stage_calls": stage_calls})
            first = judged.errors[0] if judged.errors else judged.pending[0]
            raise JudgeError(
                f"{len(judged.pending)} llm-judge node(s) unjudged after the judge's retries; first: {first}"
            )
    calls = list(ev.get("judge_calls") or []) + stage_calls  # inline calls (evaluate), then this stage's
    record = {"report": report.model_dump(mode="json"), "judge_calls": calls}
    ck.save("judge", record)
    return record


def commit(run: TrialRun, *, judge_failure: BaseException | None = None) -> str:
    """Write the trial's rows (and its end_states row) in one lake commit; returns the outcome."""
    from saasbench import lake as lakelib
    from saasbench.agents.base import Trajectory
    from saasbench.evaluation.results import RunReport
    from saasbench.runs.outages import attempt_calls, attempt_events
    from saasbench.runs.trial import TrialResult

    ck = run.checkpoints
    run._count("commit")
    ro = ck.load("rollout")
    frozen = ck.load("freeze")
    ev = ck.load("evaluate")
    judged = ck.load("judge")
    if ro is None or ev is None:
        raise _missing(run, "nothing to commit (rollout or evaluation missing)")
    run.task = run.task or _load_task(run.trial.task)
    source = judged or ev
    report = RunReport.model_validate(source["report"])
    trajectory = Trajectory.model_validate(ro["trajectory"])
    discarded = ro.get("discarded") or []  # rollouts discarded for a model outage before this one
    trajectory.events.extend(attempt_events(discarded, t_s=trajectory.wall_s))
    result = TrialResult(
        agent=ro["agent"],
        report=report,
        trajectory=trajectory,
        app_ok=ev["app"]["ok"],
        app_error=ev["app"]["error"],
        app_log_tail=ev["app"]["log_tail"] or "",
        workspace="",
        outcome=ro["outcome"],
        cheat_findings=ro["cheat_findings"],
        integrity_findings=ro["integrity_findings"],
        judge_calls=source.get("judge_calls") or [],
    )
    outcome = detail = None
    inline = [c.get("error") for c in ev.get("judge_calls") or [] if isinstance(c, dict) and c.get("error")]
    if ro["outcome"] == "completed" and (judge_failure is not None or inline):
        # the judge stayed down (through its own retries for an inline node, through the judge stage's
        # retries for a deferred one): an infrastructure outcome, excluded from valid trials, with its node
        # rows; the evidence of deferred nodes stays stored, so `saasbench rescore --judge-only` can finish it
        why = f"{type(judge_failure).__name__}: {judge_failure}" if judge_failure is not None else ""
        if inline:
            why = (why + "; " if why else "") + f"{len(inline)} inline judge call(s) failed; first: {inline[0]}"
        outcome, detail = "judge_error", why
    try:
        end_states = [end_state_row(run, frozen, ro, ev)] if frozen is not None else []
        rows = lakelib.from_trial_result(
            result,
            sweep_id=run.spec.sweep_id,
            trial_id=run.trial.trial_id,
            task=run.task,
            model=run.trial.model,
            attempt=run.trial.attempt,
            started_at=ro.get("started_at") or run.started_at,
            ended_at=_now(),
            outcome=outcome,
            outcome_detail=detail,
            model_calls=ro.get("model_calls") or (),
            discarded_model_calls=attempt_calls(discarded),
            end_states=end_states,
            budget=ro.get("budget"),
        )
        lakelib.write_trial(run.store, rows)
    except HarnessError:
        raise
    except Exception as exc:
        if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, OSError):
            raise  # rows the lake refuses (a bad id, a wrong type): a harness bug, not an outage to retry
        raise LakeError(f"committing {run.trial.label} failed: {type(exc).__name__}: {exc}") from exc
    if run.on_commit is not None:
        run.on_commit(result, rows)
    try:
        ck.clear()
    except Exception as exc:  # noqa: BLE001 - leftovers are harmless: a committed trial is never resumed
        log.warning("%s: removing checkpoints failed: %s", run.trial.label, exc)
    return rows.tables["trials"][0]["outcome"]


def end_state_row(run: TrialRun, frozen: dict[str, Any], ro: dict[str, Any], ev: dict[str, Any]) -> dict[str, Any]:
    """The ``end_states`` row: the frozen end state, plus the rollout record and the evaluation record
    before judging (what ``saasbench rescore`` needs), stored content-addressed beside it."""
    from saasbench.runs import endstate

    state = endstate.FrozenState(
        manifest=endstate.load_manifest(run.store, frozen["manifest_key"]),
        manifest_key=frozen["manifest_key"],
        total_bytes=frozen.get("total_bytes") or 0,
        seconds=frozen.get("freeze_s") or 0.0,
        new_objects=frozen.get("new_objects") or 0,
        new_bytes=frozen.get("new_bytes") or 0,
    )
    return endstate.end_state_row(
        state,
        sweep_id=run.spec.sweep_id,
        trial_id=run.trial.trial_id,
        model=run.trial.model,
        attempt=run.trial.attempt,
        rollout_key=endstate.store_record(run.store, ro),
        evaluation_key=endstate.store_record(run.store, ev),
    )


# --- the no-Prefect driver ---------------------------------------------------------------------------------
def with_retries(
    fn: Callable[[], Any], *, retries: int, delays: list[float], label: str, sleep: Callable[[float], None] = time.sleep
) -> Any:
    """Call ``fn`` and retry a retryable HarnessError ``retries`` times (the no-Prefect twin of a task's policy)."""
    for i in range(retries + 1):
        try:
            return fn()
        except HarnessError as exc:
            if not exc.retryable or i == retries:
                raise
            delay = delays[min(i, len(delays) - 1)] if delays else 0.0
            log.warning("%s: %s (retry %d/%d in %gs)", label, exc, i + 1, retries, delay)
            sleep(delay)
    raise AssertionError("unreachable")


def run_stages(run: TrialRun, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """Every stage of one trial in order, each with the spec's retry policy; returns the committed outcome.

    Provision and rollout are retried together (a rollout's environment that failed is replaced);
    from the freeze on, a stage's retry never runs the agent again."""
    from saasbench.services import limits

    spec = run.spec
    limits.configure_from_spec(spec)
    # one environment slot for the whole trial: its live environment and a restored one never overlap
    with limits.environment_slot(), contextlib.closing(run):
        with_retries(
            lambda: build_env(run),
            retries=spec.retries,
            delays=list(spec.retry_delays),
            label=run.label("build_env"),
            sleep=sleep,
        )

        def provision_and_rollout() -> None:
            provision(run)
            if run.checkpoints.load("freeze") is None:
                rollout(run)
                freeze(run)

        with_retries(
            provision_and_rollout,
            retries=spec.retries,
            delays=list(spec.retry_delays),
            label=run.label("rollout"),
            sleep=sleep,
        )
        return finish_frozen(run, sleep=sleep)


def finish_frozen(run: TrialRun, *, dag: Any = None, sleep: Callable[[float], None] = time.sleep) -> str:
    """Evaluate (skipped when its checkpoint exists), judge and commit a frozen trial, each with the spec's
    retries: the tail of :func:`run_stages`, and all of ``saasbench rescore``. ``dag`` replaces the task's."""
    retry: dict[str, Any] = dict(retries=run.spec.retries, delays=list(run.spec.retry_delays), sleep=sleep)
    with_retries(lambda: evaluate(run, dag=dag), label=run.label("evaluate"), **retry)
    judge_failure: JudgeError | None = None
    try:
        with_retries(lambda: judge(run), label=run.label("judge"), **retry)
    except JudgeError as exc:
        judge_failure = exc
    return with_retries(lambda: commit(run, judge_failure=judge_failure), label=run.label("commit"), **retry)
