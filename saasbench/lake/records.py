"""Turn the harness's result objects into lake rows (plain dicts keyed by schema column names).

* :func:`trial_rows` — a RunReport (+ trial metadata, trajectory, judge calls, env builds) into a
  :class:`~saasbench.lake.writer.TrialRows` for every per-trial table;
* :func:`from_trial_result` — the same from a :class:`saasbench.runs.trial.TrialResult` and a task;
* :func:`model_call_rows` — ``model_calls`` rows from the model gateway's per-request records;
* :func:`sweep_row` — the ``sweeps`` row (configuration JSON with secrets removed);
* :func:`validation_rows` — ``reference_validations`` rows from a ValidationReport.

Text from apps and agents (messages, evidence, trajectory content) is stored as data, capped per
:mod:`saasbench.lake.schema`; nothing here builds SQL.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from saasbench.lake import schema as S
from saasbench.lake.writer import TrialRows

_SECRET_KEY_RE = re.compile(
    r"(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credential|auth(orization)?|private[_-]?key|dsn)$",
    re.IGNORECASE,
)
REDACTED = "***"
_URL_PASSWORD_RE = re.compile(r"(://[^:/@\s]+:)[^@\s/]+@")


def harness_version() -> str:
    from saasbench import __version__

    return __version__


def utc(value: Any) -> datetime | None:
    """A timezone-aware UTC datetime from a datetime, ISO string or epoch seconds (None stays None)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=UTC)
    if isinstance(value, str):
        value = datetime.fromisoformat(value)  # 3.11+: accepts a trailing Z
    if not isinstance(value, datetime):
        raise TypeError(f"not a timestamp: {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def cap(text: Any, limit: int) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[:limit]


def to_json(value: Any, limit: int | None = None) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)
    return cap(text, limit) if limit else text


def redact(value: Any) -> Any:
    """A copy of a config mapping with values under secret-looking keys (password, token,
    api_key, secret, dsn, ...) replaced by ``***``, and passwords in URLs (``scheme://user:***@host``)
    masked. Names of environment variables
    (keys ending in ``_env``) are kept: they are not secrets."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            ks = str(k)
            if _SECRET_KEY_RE.search(ks) and not ks.lower().endswith("_env") and v not in (None, ""):
                out[ks] = REDACTED
            else:
                out[ks] = redact(v)
        return out
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if hasattr(value, "model_dump"):
        return redact(value.model_dump(mode="json"))
    if isinstance(value, str) and "://" in value:
        return _URL_PASSWORD_RE.sub(lambda m: m.group(1) + REDACTED + "@", value)
    return value


@dataclass
class TrialInfo:
    """Trial metadata that is not in the RunReport."""

    sweep_id: str
    trial_id: str
    task_id: str
    agent: str
    model: str | None = None
    attempt: int = 0
    outcome: str = "completed"
    outcome_detail: str | None = None
    agent_version: str | None = None
    category: str | None = None
    domain: str | None = None
    complexity_tier: str | None = None
    started_at: Any = None
    ended_at: Any = None
    agent_wall_s: float | None = None
    eval_s: float | None = None
    budget: Any = None  # the agents.base.Budget (or a mapping of steps, wall_s, tool_call_s) the agent ran under
    app_ok: bool | None = None
    app_error: str | None = None
    report_uri: str | None = None
    harness_version: str = field(default_factory=harness_version)

    def __post_init__(self) -> None:
        if self.outcome not in S.OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(S.OUTCOMES)}")
        for name in ("sweep_id", "trial_id", "task_id"):
            S.check_id(getattr(self, name), name)

    def key(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "trial_id": self.trial_id,
            "task_id": self.task_id,
            "agent": self.agent,
            "model": self.model,
            "attempt": self.attempt,
        }


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _status(v: Any) -> str:
    return getattr(v, "value", v)


def trial_row(
    info: TrialInfo, report: Any = None, trajectory: Any = None, judge_calls: Sequence[Any] = ()
) -> dict[str, Any]:
    summary = _get(report, "summary")
    counts = _get(summary, "counts")
    started, ended = utc(info.started_at), utc(info.ended_at)
    if started is None and report is not None:
        started = utc(_get(report, "started_at"))
    wall = (ended - started).total_seconds() if started and ended else None
    jt_in = [c for c in (_get(c, "tokens_in") for c in judge_calls) if c is not None]
    jt_out = [c for c in (_get(c, "tokens_out") for c in judge_calls) if c is not None]
    return {
        **info.key(),
        "agent_version": info.agent_version
        if info.agent_version is not None
        else (_get(trajectory, "version") or None),
        "category": info.category,
        "domain": info.domain,
        "complexity_tier": info.complexity_tier,
        "outcome": info.outcome,
        "outcome_detail": cap(info.outcome_detail or _get(trajectory, "error"), S.MESSAGE_CAP),
        "valid": info.outcome in S.VALID_OUTCOMES,
        "started_at": started,
        "ended_at": ended,
        "wall_s": wall,
        "agent_wall_s": info.agent_wall_s if info.agent_wall_s is not None else _get(trajectory, "wall_s"),
        "eval_s": info.eval_s if info.eval_s is not None else _get(summary, "elapsed_s"),
        "steps": _get(trajectory, "steps"),
        "budget_steps": _get(info.budget, "steps"),
        "budget_wall_s": _get(info.budget, "wall_s"),
        "budget_tool_call_s": _get(info.budget, "tool_call_s"),
        "tokens_in": _get(trajectory, "tokens_in"),
        "tokens_out": _get(trajectory, "tokens_out"),
        "cost_usd": _get(trajectory, "cost_usd"),
        "judge_tokens_in": sum(jt_in) if jt_in else None,
        "judge_tokens_out": sum(jt_out) if jt_out else None,
        "task_score": _get(summary, "task_score"),
        "deterministic_score": _get(summary, "deterministic_score"),
        "node_coverage": _get(summary, "node_coverage"),
        "score": _get(summary, "score"),
        "max_score": _get(summary, "max_score"),
        "skipped_llm_max_score": _get(summary, "skipped_llm_max_score"),
        "total_nodes": _get(summary, "total_nodes"),
        "passed_nodes": _get(counts, "PASSED"),
        "failed_nodes": _get(counts, "FAILED"),
        "error_nodes": _get(counts, "ERROR"),
        "skipped_dependency_nodes": _get(counts, "SKIPPED_DEPENDENCY"),
        "skipped_llm_nodes": _get(counts, "SKIPPED_LLM"),
        "quarantined_nodes": _get(counts, "QUARANTINED"),
        "compat": _get(report, "compat"),
        "dag": _get(report, "dag"),
        "app_ok": info.app_ok,
        "app_error": cap(info.app_error, S.MESSAGE_CAP),
        "exit_reason": _get(trajectory, "exit_reason"),
        "report_uri": info.report_uri,
        "harness_version": info.harness_version,
        "schema_version": S.SCHEMA_VERSION,
    }


def node_rows(info: TrialInfo, report: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(node_results rows, step_results rows) of a RunReport."""
    nodes, steps = [], []
    key = info.key()
    for i, n in enumerate(_get(report, "nodes", []) or []):
        judge = _get(n, "judge") or {}
        node_steps = _get(n, "steps", []) or []
        nodes.append(
            {
                **key,
                "node_id": _get(n, "id"),
                "node_index": i,
                "category": _get(n, "category"),
                "subcategory": _get(n, "subcategory") or None,
                "method": _get(n, "method"),
                "complexity_tier": _get(n, "complexity_tier"),
                "status": _status(_get(n, "status")),
                "score": _get(n, "score"),
                "max_score": _get(n, "max_score"),
                "duration_ms": _get(n, "duration_ms"),
                "message": cap(_get(n, "message"), S.MESSAGE_CAP),
                "steps": len(node_steps),
                "judge_score": judge.get("score") if isinstance(judge, Mapping) else None,
                "judge_skipped": bool(judge.get("skipped")) if isinstance(judge, Mapping) and judge else None,
            }
        )
        for s in node_steps:
            steps.append(
                {
                    **key,
                    "node_id": _get(n, "id"),
                    "step_index": _get(s, "index"),
                    "code": _get(s, "type"),
                    "passed": _get(s, "passed"),
                    "error": _get(s, "error"),
                    "duration_ms": _get(s, "duration_ms"),
                    "message": cap(_get(s, "message"), S.MESSAGE_CAP),
                    "evidence_json": to_json(_get(s, "evidence") or {}, S.EVIDENCE_CAP),
                }
            )
    return nodes, steps


def judge_call_rows(info: TrialInfo, calls: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        tags = _get(c, "tags") or {}
        rng = _get(c, "score_range") or (None, None)
        out.append(
            {
                **info.key(),
                "call_index": i,
                "node_id": tags.get("node_id"),
                "rubric_id": _opt_str(tags.get("rubric_id")),
                "at": utc(_get(c, "at")),
                "judge_model": _get(c, "model"),
                "prompt_hash": _get(c, "prompt_hash"),
                "evidence_digest": _get(c, "evidence_digest"),
                "cache_key": _get(c, "cache_key"),
                "vote": _get(c, "vote"),
                "rubric": cap(_get(c, "rubric"), S.JUDGE_TEXT_CAP),
                "score_min": rng[0],
                "score_max": rng[1],
                "evidence_chars": _get(c, "evidence_chars"),
                "images": _get(c, "images"),
                "raw_reply": cap(_get(c, "raw_reply"), S.JUDGE_TEXT_CAP),
                "score": _get(c, "score"),
                "parsed_score": _get(c, "parsed_score"),
                "reply_form": _get(c, "reply_form"),
                "reasoning": cap(_get(c, "reasoning"), S.JUDGE_TEXT_CAP),
                "latency_ms": _get(c, "latency_ms"),
                "tokens_in": _get(c, "tokens_in"),
                "tokens_out": _get(c, "tokens_out"),
                "cached": _get(c, "cached"),
                "attempts": _get(c, "attempts"),
                "error": cap(_get(c, "error"), S.MESSAGE_CAP),
                "tags_json": to_json(tags),
            }
        )
    return out


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def trajectory_rows(info: TrialInfo, trajectory: Any) -> list[dict[str, Any]]:
    out = []
    start = utc(info.started_at)
    for seq, ev in enumerate(_get(trajectory, "events", []) or []):
        data = dict(_get(ev, "data") or {})
        text = _get(ev, "message") or ""
        role = data.pop("role", None)
        tool = data.pop("tool", None) or data.pop("tool_name", None)
        t_in, t_out = data.pop("tokens_in", None), data.pop("tokens_out", None)
        t_s = _get(ev, "t_s")
        out.append(
            {
                **info.key(),
                "seq": seq,
                "t_s": t_s,
                "ts": start + timedelta(seconds=t_s) if start is not None and t_s is not None else None,
                "kind": _get(ev, "kind"),
                "role": _opt_str(role),
                "content": cap(text, S.CONTENT_CAP),
                "content_chars": len(text),
                "truncated": len(text) > S.CONTENT_CAP,
                "tool": _opt_str(tool),
                "tokens_in": t_in if isinstance(t_in, int) else None,
                "tokens_out": t_out if isinstance(t_out, int) else None,
                "data_json": to_json(data, S.DATA_CAP) if data else None,
            }
        )
    return out


def env_build_rows(info: TrialInfo, builds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``env_builds`` rows from build records (dicts with the schema's column names)."""
    cols = set(S.ENV_BUILDS.names) - set(info.key()) - {"build_index"}
    out = []
    for i, b in enumerate(builds):
        row = {**info.key(), "build_index": i, **{k: v for k, v in dict(b).items() if k in cols}}
        if "started_at" in row:
            row["started_at"] = utc(row["started_at"])
        for k in ("error", "log_tail"):
            if k in row:
                row[k] = cap(row[k], S.CONTENT_CAP)
        out.append(row)
    return out


def model_call_rows(info: TrialInfo, calls: Iterable[Any]) -> list[dict[str, Any]]:
    """``model_calls`` rows from the gateway's :class:`saasbench.runs.gateway.ModelCall` records (or dicts
    with the same fields), one per agent request, in order."""
    out = []
    for i, c in enumerate(calls):
        waits = _get(c, "retry_wait_s") or []
        out.append(
            {
                **info.key(),
                "call_index": i,
                "call_id": _get(c, "call_id"),
                "session": _get(c, "session"),
                "model_group": _get(c, "model_group"),
                "provider_model": _get(c, "provider_model"),
                "api_base": _get(c, "api_base"),
                "call_type": _get(c, "call_type"),
                "stream": _get(c, "stream"),
                "status": _get(c, "status"),
                "error_class": _get(c, "error_class"),
                "error": cap(_get(c, "error"), S.CONTENT_CAP),
                "http_status": _get(c, "http_status"),
                "tokens_in": _get(c, "prompt_tokens"),
                "tokens_out": _get(c, "completion_tokens"),
                "cost_usd": _get(c, "cost_usd"),
                "started_at": utc(_get(c, "started_at")),
                "ended_at": utc(_get(c, "ended_at")),
                "latency_ms": _get(c, "latency_ms"),
                "attempts": _get(c, "attempts"),
                "retry_wait_s": float(sum(waits)),
                "retried_errors": [str(e) for e in _get(c, "retried_errors") or []],
                "usage_source": _get(c, "usage_source"),
                "usage_estimated": _get(c, "usage_source") == "estimate" if _get(c, "usage_source") else None,
                "upstream_errors": [str(e)[:500] for e in _get(c, "upstream_errors") or []],
            }
        )
    return out


def end_state_rows(info: TrialInfo, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``end_states`` rows (from ``saasbench.runs.endstate.end_state_row``) with this trial's key columns."""
    cols = set(S.END_STATES.names)
    out = []
    for r in rows:
        row = {k: v for k, v in dict(r).items() if k in cols} | info.key()
        if "created_at" in row:
            row["created_at"] = utc(row["created_at"])
        out.append(row)
    return out


def trial_rows(
    info: TrialInfo,
    report: Any = None,
    *,
    trajectory: Any = None,
    judge_calls: Sequence[Any] = (),
    env_builds: Iterable[Mapping[str, Any]] = (),
    model_calls: Iterable[Any] = (),
    discarded_model_calls: Iterable[Any] = (),
    end_states: Iterable[Mapping[str, Any]] = (),
) -> TrialRows:
    """All rows of one trial. ``report`` may be None (the trial failed before evaluation);
    ``model_calls`` are the trial's requests through the model gateway (``Gateway.calls``);
    ``discarded_model_calls`` those of rollouts discarded for a model outage before it (``model_error``,
    saasbench.runs.outages): rows too (``call_index`` first, each with its attempt's ``session``), so the
    table holds the whole spend, but not metered into the trial's tokens and cost, which are the counted
    rollout's; ``end_states`` the row of its frozen end state (``saasbench.runs.endstate.end_state_row``)."""
    judge_calls = list(judge_calls)
    nodes, steps = node_rows(info, report) if report is not None else ([], [])
    discarded = list(discarded_model_calls)
    calls = model_call_rows(info, [*discarded, *model_calls])
    trial = trial_row(info, report, trajectory, judge_calls)
    for col in ("tokens_in", "tokens_out", "cost_usd"):  # metered by the gateway: the figures to trust
        metered = [c[col] for c in calls[len(discarded) :] if c[col] is not None]
        if metered:
            trial[col] = sum(metered)
    return TrialRows(
        info.sweep_id,
        info.trial_id,
        info.task_id,
        {
            "trials": [trial],
            "node_results": nodes,
            "step_results": steps,
            "judge_calls": judge_call_rows(info, judge_calls),
            "env_builds": env_build_rows(info, env_builds),
            "trajectory_events": trajectory_rows(info, trajectory) if trajectory is not None else [],
            "model_calls": calls,
            "end_states": end_state_rows(info, end_states),
        },
    )


def from_trial_result(
    result: Any,
    *,
    sweep_id: str,
    trial_id: str,
    task: Any = None,
    model: str | None = None,
    attempt: int = 0,
    outcome: str | None = None,
    outcome_detail: str | None = None,
    started_at: Any = None,
    ended_at: Any = None,
    judge_calls: Sequence[Any] = (),
    env_builds: Iterable[Mapping[str, Any]] = (),
    report_uri: str | None = None,
    model_calls: Iterable[Any] = (),
    discarded_model_calls: Iterable[Any] = (),
    end_states: Iterable[Mapping[str, Any]] = (),
    budget: Any = None,
) -> TrialRows:
    """Rows of a :class:`saasbench.runs.trial.TrialResult`. ``budget``: the rollout's budget (default the
    result's ``budget``, which a RolloutResult has). ``task`` is a Task or TaskSpec (for category,
    domain, tier); ``outcome`` defaults to ``voided_cheat`` when the trial voided the rollout, else to
    the trajectory's exit reason (agent outcomes only: infra outcomes are decided by whoever raised
    them and passed in); ``outcome_detail`` to the result's (the evidence of a voided trial)."""
    spec = getattr(task, "spec", task)
    traj = result.trajectory
    report = getattr(result, "report", None)
    task_id = _get(spec, "id") or _get(report, "task_id")
    voided = getattr(result, "outcome", None) == "voided_cheat"
    info = TrialInfo(
        sweep_id=sweep_id,
        trial_id=trial_id,
        task_id=task_id,
        agent=result.agent,
        model=model if model is not None else _get(traj, "model"),
        attempt=attempt,
        outcome=outcome or ("voided_cheat" if voided else None) or _get(traj, "exit_reason") or "completed",
        outcome_detail=outcome_detail if outcome_detail is not None else getattr(result, "outcome_detail", None),
        category=_get(spec, "category") or None,
        domain=_get(spec, "domain"),
        complexity_tier=_get(spec, "complexity_tier"),
        started_at=started_at,
        ended_at=ended_at,
        budget=budget if budget is not None else getattr(result, "budget", None),
        app_ok=getattr(result, "app_ok", None),
        app_error=getattr(result, "app_error", None),
        report_uri=report_uri,
    )
    return trial_rows(
        info,
        report,
        trajectory=traj,
        judge_calls=judge_calls or getattr(result, "judge_calls", None) or (),
        env_builds=env_builds,
        model_calls=model_calls,
        discarded_model_calls=discarded_model_calls,
        end_states=end_states,
    )


def sweep_row(
    sweep_id: str,
    *,
    config: Any = None,
    name: str | None = None,
    created_at: Any = None,
    tasks: Sequence[str] = (),
    agents: Sequence[str] = (),
    models: Sequence[str] = (),
    attempts: int | None = None,
) -> dict[str, Any]:
    """The ``sweeps`` row. ``config`` (mapping or pydantic model) is stored as JSON with values
    under secret-looking keys replaced by ``***``."""
    return {
        "sweep_id": S.check_id(sweep_id, "sweep_id"),
        "name": name,
        "created_at": utc(created_at) or datetime.now(UTC),
        "config_json": to_json(redact(config)) if config is not None else None,
        "tasks": list(tasks),
        "agents": list(agents),
        "models": [m for m in models if m is not None],
        "attempts": attempts,
        "harness_version": harness_version(),
        "host": socket.gethostname(),
        "schema_version": S.SCHEMA_VERSION,
    }


def validation_rows(report: Any, run_id: str) -> list[dict[str, Any]]:
    """``reference_validations`` rows (one per node) of a :class:`saasbench.runs.validate.ValidationReport`."""
    task_id = S.check_id(_get(report, "task_id"), "task_id")
    S.check_id(run_id, "run_id")
    started = utc(_get(report, "started_at"))
    return [
        {
            "task_id": task_id,
            "run_id": run_id,
            "dag": _get(report, "dag"),
            "started_at": started,
            "node_id": _get(n, "id"),
            "category": _get(n, "category"),
            "method": _get(n, "method"),
            "max_score": _get(n, "max_score"),
            "repeats": _get(report, "repeats"),
            "passed": _get(n, "passed"),
            "counted": _get(n, "counted"),
            "pass_rate": _get(n, "pass_rate"),
            "verdict": _get(n, "verdict"),
            "flaky_cause": _get(n, "flaky_cause"),
            "statuses": [_status(s) for s in _get(n, "statuses", [])],
            "last_message": cap(_get(n, "last_message"), S.MESSAGE_CAP),
            "harness_version": harness_version(),
            "schema_version": S.SCHEMA_VERSION,
        }
        for n in _get(report, "nodes", [])
    ]
