"""Sweeps without Prefect: the spec, the trial plan, resumability and one trial's run + record.

``flows/`` wraps these functions in Prefect tasks and flows; everything here is plain Python so a
sweep also runs with ``--no-prefect`` (thread pool) and in tests without a Prefect server.

Trial ids are deterministic (``<task>.<agent>.<model or none>.<attempt>``), so a re-run of the same
sweep id plans the same trials and :func:`pending` skips those already committed in the lake: a
killed sweep loses at most the trials in flight.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saasbench import lake as lakelib
from saasbench import settings
from saasbench.failures import HarnessError, LakeError
from saasbench.inputs import load_yaml
from saasbench.runs.gateway import Gateway, GatewayConfig
from saasbench.services import limits
from saasbench.services.judge import JudgeConfig

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

DEFAULT_RETRY_DELAYS: list[float] = [10.0, 60.0]


def _no_model() -> list[str | None]:
    return [None]  # one run per agent with its default model


class AgentBudget(BaseModel):
    """The agents' budget in a sweep, overriding each task's ``timeouts`` (agent_steps, agent_s, tool_call_s)
    where given; what is left out stays the task's."""

    model_config = ConfigDict(extra="forbid")

    steps: int | None = Field(None, ge=1, description="tool calls the agent may make")
    wall_s: float | None = Field(None, gt=0, description="wall-clock seconds of the whole rollout")
    tool_call_s: float | None = Field(None, gt=0, description="seconds one tool call may take")


class SweepSpec(BaseModel):
    """One sweep: every task x agent x model x attempt."""

    model_config = ConfigDict(extra="forbid")

    sweep_id: str
    name: str | None = None
    tasks: list[str] = Field(min_length=1)
    agents: list[str] = Field(min_length=1)
    models: list[str | None] = Field(default_factory=_no_model)
    attempts: int = Field(1, ge=1)
    backend: str = Field("local", description="an environment backend (saasbench.environments.backend_names())")
    judge_model: str | None = Field(None, description="shorthand for judge: {model: ...}")
    judge: JudgeConfig | None = Field(
        None,
        description="the LLM judge of llm-judge nodes (saasbench.services.judge.JudgeConfig: "
        "model, api_base, api_key_env, retries, votes, ...); none: those nodes are "
        "SKIPPED_LLM",
    )
    lake: str | None = Field(None, description="lake URI; default $SAASBENCH_LAKE or runs/lake")
    budget: AgentBudget | None = Field(
        None, description="the agents' budget {steps, wall_s, tool_call_s}; default each task's timeouts"
    )
    concurrency: int = Field(1, ge=1)
    retries: int = Field(
        2, ge=0, description="retries of infrastructure failures (env_error, judge_error, model_error)"
    )
    retry_delays: list[float] = Field(default_factory=lambda: list(DEFAULT_RETRY_DELAYS))
    report_dir: str | None = Field(None, description="where the HTML report goes; default runs/reports")
    compact: bool = Field(
        True,
        description="when every planned trial is committed, merge the sweep's per-trial "
        "files into one batch (saasbench.lake.compact) before the report",
    )
    gateway: GatewayConfig | None = Field(
        None,
        description="the model gateway (saasbench.runs.gateway): one LiteLLM proxy "
        "for the sweep; agents get its URL and a per-trial key, never a provider key",
    )
    envs_per_host: int | None = Field(
        None,
        ge=1,
        description="environments at once per host (a Prefect global "
        "concurrency limit, or a local semaphore without Prefect); default "
        "$SAASBENCH_ENVS_PER_HOST, else unlimited",
    )
    llm_calls_per_provider: int | dict[str, int] | None = Field(
        None,
        description="LLM calls at once per provider: n for every provider or {provider: n, '*': default}; "
        "default $SAASBENCH_LLM_CALLS_PER_PROVIDER, else unlimited",
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        from saasbench.environments import check_backend

        return check_backend(value)

    @field_validator("sweep_id")
    @classmethod
    def _id(cls, v: str) -> str:
        return lakelib.check_id(v, "sweep_id")

    @model_validator(mode="after")
    def _judge(self) -> SweepSpec:
        if self.judge_model and self.judge is None:
            self.judge = JudgeConfig(model=self.judge_model)
        elif self.judge_model and self.judge is not None and self.judge.model != self.judge_model:
            raise ValueError(f"judge_model {self.judge_model!r} and judge.model {self.judge.model!r} differ")
        return self

    @field_validator("llm_calls_per_provider")
    @classmethod
    def _llm_calls(cls, v: Any) -> Any:
        if isinstance(v, (dict, int)):
            if any(n < 1 for n in ([v] if isinstance(v, int) else v.values())):
                raise ValueError("LLM call limits must be >= 1")
            limits.parse_llm_calls(v)
        return v

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if v is None or v == []:
            return [None]
        return [None if m in (None, "", "none", "None") else m for m in v]

    @property
    def lake_uri(self) -> str:
        return settings.lake_uri(self.lake)

    def delay(self, retry_index: int) -> float:
        if not self.retry_delays:
            return 0.0
        return self.retry_delays[min(retry_index, len(self.retry_delays) - 1)]

    @classmethod
    def from_yaml(cls, path: str | Path) -> SweepSpec:
        data = load_yaml(path, what="sweep spec") or {}  # InputError (one line naming the file) when unusable
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a sweep spec is a mapping")  # noqa: TRY004 - bad file content
        return cls.model_validate(data)

    @classmethod
    def load(cls, spec: SweepSpec | Mapping[str, Any] | str | Path) -> SweepSpec:
        """A spec from a SweepSpec, a dict, or a YAML file path."""
        if isinstance(spec, SweepSpec):
            return spec
        if isinstance(spec, Mapping):
            return cls.model_validate(dict(spec))
        return cls.from_yaml(spec)


_UNSAFE = re.compile(r"[^A-Za-z0-9._:@+-]")


def id_part(value: str | None) -> str:
    """A model/agent/task name as a lake-id segment (``openai/gpt-4o`` -> ``openai_gpt-4o``)."""
    if value is None:
        return "none"
    part = _UNSAFE.sub("_", str(value))
    return part if part and part[0].isalnum() else f"x{part}"


@dataclass(frozen=True)
class TrialSpec:
    task: str
    agent: str
    model: str | None
    attempt: int

    @property
    def trial_id(self) -> str:
        return f"{id_part(self.task)}.{id_part(self.agent)}.{id_part(self.model)}.{self.attempt}"

    @property
    def label(self) -> str:
        return f"{self.task}/{self.agent}/{self.model or 'none'}#{self.attempt}"


def plan(spec: SweepSpec) -> list[TrialSpec]:
    """Every trial of the sweep, in a stable order (attempt-major so early results cover every config)."""
    return [
        TrialSpec(task, agent, model, attempt)
        for attempt in range(spec.attempts)
        for task in spec.tasks
        for agent in spec.agents
        for model in spec.models
    ]


def pending(spec: SweepSpec, lake: Any = None) -> list[TrialSpec]:
    """Planned trials not yet committed in the lake (the resume set)."""
    done = lakelib.committed_trials(lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri), spec.sweep_id)
    return [t for t in plan(spec) if t.trial_id not in done]


def committed_outcome(spec: SweepSpec, trial: TrialSpec, lake: Any = None) -> str | None:
    """The outcome of ``trial`` if it is committed in the lake, else None."""
    store = lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri)
    if trial.trial_id not in lakelib.committed_trials(store, spec.sweep_id):
        return None
    rows = lakelib.query(
        store,
        "SELECT outcome FROM trials WHERE sweep_id = ? AND trial_id = ?",
        [spec.sweep_id, trial.trial_id],
        sweep_id=spec.sweep_id,
    ).to_pylist()
    return rows[0]["outcome"] if rows else None


def write_sweep_row(spec: SweepSpec, lake: Any = None) -> None:
    store = lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri)
    row = lakelib.sweep_row(
        spec.sweep_id,
        config=spec.model_dump(),
        name=spec.name,
        tasks=spec.tasks,
        agents=spec.agents,
        models=[m for m in spec.models if m],
        attempts=spec.attempts,
    )
    lakelib.write_sweep(store, {**row, "judge_model": spec.judge.model if spec.judge else None})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def run_trial(
    trial: TrialSpec,
    spec: SweepSpec,
    *,
    lake: Any = None,
    say: Callable[[str], None] | None = None,
    gateway: Gateway | None = None,
    sleep: Callable[[float], None] = time.sleep,
    driver: Callable[[Any], str] | None = None,
) -> str:
    """Run one trial through its stages (:mod:`saasbench.runs.stages`) and commit it; returns its outcome.

    Each stage retries infrastructure failures with the spec's policy and continues from the trial's
    checkpoints, so the agent runs at most once per frozen end state. When a stage's retries are
    exhausted the *retryable* :class:`HarnessError` is raised with nothing committed (the checkpoints
    stay: a re-run resumes there); :func:`run_trial_retrying` then records it. A non-retryable
    HarnessError (agent outcomes, task defect) is recorded as that outcome and returned. The app not
    becoming healthy after the agent's work is the agent's result (nodes fail), not an env error.
    ``driver(run)`` runs the stages: :func:`saasbench.runs.stages.run_stages` here, Prefect tasks in
    ``flows/trial.py``.
    """
    from saasbench.runs import stages

    if gateway is None and spec.gateway is not None:
        gateway = _SHARED_GATEWAYS.get(spec.sweep_id)  # the sweep's, when this process runs the sweep
    if gateway is None and spec.gateway is not None:  # no shared gateway (e.g. a trial flow on a worker): its own
        with Gateway(spec.gateway) as own:
            return run_trial(trial, spec, lake=lake, say=say, gateway=own, sleep=sleep, driver=driver)
    store = lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri)
    done = stages.committed_outcome(store, spec.sweep_id, trial.trial_id)
    if done is not None:  # committed since the sweep planned it (another run of the same sweep)
        return done
    watch = _OBSERVERS.get(spec.sweep_id)
    run = stages.TrialRun(
        trial=trial,
        spec=spec,
        store=store,
        gateway=gateway,
        say=say or (watch.say(trial) if watch else (lambda m: None)),
        on_node=watch.node(trial) if watch else None,
        on_commit=watch.commit(trial) if watch else None,
    )
    try:
        return driver(run) if driver is not None else stages.run_stages(run, sleep=sleep)
    except HarnessError as exc:
        if exc.retryable:
            raise
        record_failure(trial, spec, exc, lake=store, started_at=run.started_at)
        return exc.outcome


def record_failure(
    trial: TrialSpec, spec: SweepSpec, exc: BaseException, *, lake: Any = None, started_at: Any = None
) -> str:
    """Commit a trial row (no node rows) for a trial that ended in a failure outcome. Rollouts discarded for
    a model outage (``model_error``, the stages' ``rollout_attempts`` checkpoint) come with it: one
    ``model_error`` trajectory event each and their model calls (the outage's evidence)."""
    from saasbench.failures import outcome_of
    from saasbench.runs import stages
    from saasbench.runs.outages import attempt_calls, attempt_events

    store = lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri)
    if isinstance(exc, stages.CommittedElsewhere):
        return exc.outcome  # never overwrite the other run's result
    outcome = outcome_of(exc)
    ck = stages.Checkpoints(store, spec.sweep_id, trial.trial_id)
    try:
        discarded = (ck.load(stages.ROLLOUT_ATTEMPTS) or {}).get("attempts") or []
    except Exception as exc_read:  # noqa: BLE001 - the failure row matters more than its evidence
        log.warning("%s: reading the discarded rollouts failed: %s", trial.label, exc_read)
        discarded = []
    task_id = trial.task
    budget = None
    try:
        from saasbench.catalog.tasks import load_task
        from saasbench.runs.stages import spec_budget

        t = load_task(trial.task)
        task_id, spec_t = t.id, t.spec
        budget = spec_budget(spec, t)  # what the agent would run (or ran) under, also for a trial that failed
    except Exception:  # noqa: BLE001
        spec_t = None
    info = lakelib.TrialInfo(
        sweep_id=spec.sweep_id,
        trial_id=trial.trial_id,
        task_id=id_part(task_id),
        agent=trial.agent,
        model=trial.model,
        attempt=trial.attempt,
        outcome=outcome,
        outcome_detail=f"{type(exc).__name__}: {exc}",
        category=getattr(spec_t, "category", None) or None,
        domain=getattr(spec_t, "domain", None),
        complexity_tier=getattr(spec_t, "complexity_tier", None),
        started_at=started_at,
        ended_at=_now(),
        budget=budget,
    )
    events = {"events": attempt_events(discarded)} if discarded else None
    rows = lakelib.trial_rows(info, trajectory=events, discarded_model_calls=attempt_calls(discarded))
    lakelib.write_trial(store, rows)
    if discarded:
        try:
            ck.drop(stages.ROLLOUT_ATTEMPTS)  # committed with the trial: a rerun of it starts a new record
        except Exception as exc_drop:  # noqa: BLE001 - a leftover is harmless: a committed trial is not resumed
            log.warning("%s: removing the discarded rollouts failed: %s", trial.label, exc_drop)
    return outcome


def run_trial_retrying(
    trial: TrialSpec,
    spec: SweepSpec,
    *,
    lake: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    gateway: Gateway | None = None,
) -> str:
    """:func:`run_trial` (whose stages retry infrastructure failures); a failure left after the last
    retry is recorded as its infra outcome (the no-Prefect path)."""
    try:
        return run_trial(trial, spec, lake=lake, gateway=gateway, sleep=sleep)
    except HarnessError as exc:  # a stage's retries are exhausted (run_trial retried it per stage)
        return record_failure(trial, spec, exc, lake=lake)


def run_sweep_plain(
    spec: SweepSpec | Mapping[str, Any] | str | Path,
    workers: int | None = None,
    *,
    lake: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    on_done: Callable[[TrialSpec, str], None] | None = None,
) -> dict[str, str]:
    """Run the pending trials of a sweep in a thread pool (``workers`` or ``spec.concurrency``).

    Returns ``{trial_id: outcome}`` for the trials run now (already committed ones are skipped)."""
    spec = SweepSpec.load(spec)
    store = lakelib.lake_from_uri(lake if lake is not None else spec.lake_uri)
    write_sweep_row(spec, store)
    todo = pending(spec, store)
    outcomes: dict[str, str] = {}
    lock = threading.Lock()
    lake_down = threading.Event()  # set by the first trial that could not reach the lake
    errors: list[BaseException] = []
    not_started: list[str] = []

    def one(t: TrialSpec) -> None:
        if lake_down.is_set():  # nothing it did could be kept: leave it pending for the next run
            with lock:
                not_started.append(t.trial_id)
            return
        try:
            outcome = run_trial_retrying(t, spec, lake=store, sleep=sleep, gateway=gw)
        except Exception as exc:  # noqa: BLE001 - kept and re-raised after the pool (a lake failure stops the rest)
            if is_lake_failure(exc):
                lake_down.set()
            with lock:
                errors.append(exc)
            return
        with lock:
            outcomes[t.trial_id] = outcome
        if on_done:
            on_done(t, outcome)

    with (
        sweep_gateway(spec, bool(todo)) as gw,
        ThreadPoolExecutor(max_workers=max(1, workers or spec.concurrency)) as pool,
    ):
        for fut in [pool.submit(one, t) for t in todo]:
            fut.result()
    if lake_down.is_set():
        first = next(e for e in errors if is_lake_failure(e))
        raise LakeError(
            f"sweep {spec.sweep_id}: the lake {store.uri} cannot be written ({first}); stopped: "
            f"{len(not_started)} trial(s) not started, {len(outcomes)} committed; run the sweep again "
            "once the lake is back (committed trials and finished stages are kept)"
        ) from first
    if errors:
        raise errors[0]
    return outcomes


def is_lake_failure(exc: BaseException) -> bool:
    """A failure to write or read the lake (its object store), however deep in the cause chain."""
    from saasbench.lake.store import LakeStoreError

    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, (LakeError, LakeStoreError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_SHARED_GATEWAYS: dict[str, Gateway] = {}


@dataclass
class Observer:
    """Callbacks a front end (``saasbench demo``) gets for the trials of one sweep run by this process:
    progress lines, every node result, the committed result. Prefect parameters stay plain data, so
    :func:`run_trial` finds the observer by sweep id (like the shared gateway)."""

    on_say: Callable[[TrialSpec, str], None] | None = None
    on_node: Callable[[TrialSpec, Any], None] | None = None
    on_commit: Callable[[TrialSpec, Any, Any], None] | None = None

    def say(self, trial: TrialSpec) -> Callable[[str], None]:
        on_say = self.on_say
        return (lambda m: on_say(trial, m)) if on_say else (lambda m: None)

    def node(self, trial: TrialSpec) -> Callable[[Any], None] | None:
        on_node = self.on_node
        return (lambda r: on_node(trial, r)) if on_node else None

    def commit(self, trial: TrialSpec) -> Callable[[Any, Any], None] | None:
        on_commit = self.on_commit
        return (lambda result, rows: on_commit(trial, result, rows)) if on_commit else None


_OBSERVERS: dict[str, Observer] = {}


@contextlib.contextmanager
def observe(sweep_id: str, observer: Observer) -> Iterator[Observer]:
    """Route the callbacks of ``sweep_id``'s trials run in this process to ``observer``."""
    _OBSERVERS[sweep_id] = observer
    try:
        yield observer
    finally:
        _OBSERVERS.pop(sweep_id, None)


@contextlib.contextmanager
def sweep_gateway(spec: SweepSpec, needed: bool = True) -> Iterator[Gateway | None]:
    """One gateway for the sweep's trials run by this process (None when the spec has none or
    nothing is pending). :func:`run_trial` finds it by sweep id, so Prefect tasks, whose
    parameters must stay hashable data, need not carry it."""
    if spec.gateway is None or not needed:
        yield None
        return
    with Gateway(spec.gateway) as gw:
        _SHARED_GATEWAYS[spec.sweep_id] = gw
        try:
            yield gw
        finally:
            _SHARED_GATEWAYS.pop(spec.sweep_id, None)


def leaderboard_markdown(report: Any) -> str:
    """Markdown leaderboard of a :class:`saasbench.reports.aggregate.SweepReport`."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = ["| agent/model | Pass@1 | deterministic | valid/all trials |", "|---|---:|---:|---:|"]
    configs = sorted(report.configs, key=lambda c: -(c.all.pass_at_1 or 0))
    for c in configs:
        lines.append(
            f"| {c.label} | {pct(c.all.pass_at_1)} | {pct(c.all.deterministic)} | {c.valid_trials}/{c.all.trials} |"
        )
    return "\n".join(lines) + "\n"


def aggregate(spec: SweepSpec, *, lake: Any = None, report_dir: str | Path | None = None) -> dict[str, Any]:
    """Aggregate the sweep: ``{"report": SweepReport, "markdown": str, "html": path or None}``."""
    from saasbench.reports.aggregate import sweep_report

    uri = lake if lake is not None else spec.lake_uri
    store = lakelib.lake_from_uri(uri)
    if spec.compact:
        try:  # a finished sweep becomes a few large files: cheap to read for every later report
            if not pending(spec, store):
                lakelib.compact(store, sweep_id=spec.sweep_id)
                lakelib.merge_batches(store)  # one batch per finished sweep would pile up: merge the small ones
        except Exception as exc:  # noqa: BLE001 - the per-trial files stay valid; compaction can be rerun
            log.warning("sweep %s: compaction failed, files left as written: %s", spec.sweep_id, exc)
    report = sweep_report(store, spec.sweep_id)
    html = None
    try:
        from saasbench.reports.report_html import write_html

        out = Path(report_dir or spec.report_dir or "runs/reports") / f"{spec.sweep_id}.html"
        out.parent.mkdir(parents=True, exist_ok=True)
        html = str(write_html(report, out).resolve())
    except ImportError:  # pragma: no cover - report_html is optional
        pass
    return {"report": report, "markdown": leaderboard_markdown(report), "html": html}
