"""Model outages are infrastructure: did the agent stop because its model upstream failed?

A rollout whose model server died or hung under it says nothing about the agent: the trial is retried with
a fresh rollout like an ``env_error`` and, still failing after the retries, ends ``model_error`` (not scored,
outside the valid trials), as a judge outage ends ``judge_error``. Two sources decide it:

- the agent itself: the built-in agent ends with exit reason ``model_error`` when a transient model error
  outlives its retries (or its backoff would outlast the wall clock);
- the model gateway's records of the attempt (:class:`saasbench.runs.gateway.ModelCall`, in order), for
  agents that only report "error" (the CLI agents): :func:`stopped_on_outage`.

**The rule** (:func:`rollout_outage`): a rollout that did not complete (``agent_error``, ``agent_timeout``)
stopped on an outage when some call failed with an outage-class error and no call succeeded after it; a
rollout that completed did when its *last* call is such a failure (an agent that exits 0 after an API
error). ``agent_budget_exceeded`` (the agent used its turns) and ``voided_cheat`` (never washed out by an
outage) stay what they are.

**Outage class** (:func:`is_outage`): a failed call whose HTTP status or error class a later try can get
past, by the judge's own rule (:func:`saasbench.services.judge.transient_failure`): connection refused or
reset, timeouts, a broken or stalled stream, HTTP 408, 409, 425, 429 and every 5xx (502/503/504, 529
"overloaded"). Not an outage: 400, 401, 403, 404, 405, 413, 422 (a request or configuration problem: a
rerun would fail the same way). How litellm reports them (measured through the gateway, litellm 1.110.2):
an upstream 503 is ``ServiceUnavailableError`` 503, 500 ``InternalServerError``, 502 ``BadGatewayError``,
504 and 408 ``Timeout``, 529 ``APIError`` 503, 429 ``RateLimitError``; a refused or dropped connection and
an unparseable reply ``InternalServerError`` 500 ("Connection error."); 403 and 413 ``APIError`` with their
status; an agent's own client sees a dead gateway as ``APIConnectionError`` (status 500 or none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from saasbench.runs.gateway import ModelCall
from saasbench.services.judge import transient_failure

#: Exit reasons the call records may turn into ``model_error`` (the agent did not complete).
STOPPED = ("agent_error", "agent_timeout")
ERROR_CHARS = 300  # of a call's error text in a reason


class OutageVerdict(NamedTuple):
    """Whether the agent stopped on an upstream failure; ``reason`` says why (or why not) for a human;
    ``call`` is the failed call that decided it."""

    outage: bool
    reason: str
    call: ModelCall | None = None


def as_call(call: ModelCall | Mapping[str, Any]) -> ModelCall:
    """A :class:`ModelCall` from itself or from its JSON form (a rollout checkpoint's ``model_calls``)."""
    return call if isinstance(call, ModelCall) else ModelCall.model_validate(dict(call))


def is_outage(call: ModelCall | Mapping[str, Any]) -> bool:
    """A failed call of outage class (see the module docstring); a success is never one."""
    c = as_call(call)
    if c.status != "failure":
        return False
    return transient_failure(c.http_status, {c.error_class} if c.error_class else set())


def describe(call: ModelCall | Mapping[str, Any]) -> str:
    """``503 ServiceUnavailableError after 5 retries (6 attempts): <error>`` for one failed call."""
    c = as_call(call)
    what = " ".join(x for x in (str(c.http_status) if c.http_status else "", c.error_class or "") if x)
    out = what or "an error without a status or class"
    retries = max(c.attempts - 1, len(c.retried_errors))
    if retries:
        out += f" after {retries} retr{'y' if retries == 1 else 'ies'} ({c.attempts} attempts)"
    if c.model_group:
        out += f" for model {c.model_group}"
    if c.error:
        text = " ".join(c.error.split())
        out += ": " + (text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "...")
    return out


def stopped_on_outage(calls: Sequence[ModelCall | Mapping[str, Any]]) -> OutageVerdict:
    """Did the attempt whose requests are ``calls`` (in order) stop on an upstream failure: a failed call of
    outage class with no successful call after it? The verdict names the last such call."""
    items = [as_call(c) for c in calls]
    if not items:
        return OutageVerdict(False, "no model calls recorded")
    last_ok = max((i for i, c in enumerate(items) if c.status == "success"), default=-1)
    tail = items[last_ok + 1 :]
    outages = [c for c in tail if is_outage(c)]
    if outages:
        c = outages[-1]
        after = f" ({len(tail)} failed call(s) after the last success)" if len(tail) > 1 else ""
        return OutageVerdict(True, f"model upstream failed: {describe(c)}{after}", c)
    if tail:
        return OutageVerdict(False, f"the last failed call is not an outage: {describe(tail[-1])}", tail[-1])
    return OutageVerdict(False, "the last model call succeeded")


def rollout_outage(
    outcome: str, calls: Sequence[ModelCall | Mapping[str, Any]] = (), *, error: str | None = None
) -> OutageVerdict:
    """Whether a rollout that ended ``outcome`` (the trajectory's exit reason, or ``voided_cheat``) with the
    gateway's ``calls`` of this attempt stopped on a model outage (the rule in the module docstring).
    ``error`` is the trajectory's error text (the reason when the agent itself said ``model_error``)."""
    if outcome == "model_error":
        text = error or "the agent reported a model upstream failure"
        return OutageVerdict(
            True, text if text.startswith("model upstream failed") else f"model upstream failed: {text}"
        )
    if outcome in STOPPED:
        verdict = stopped_on_outage(calls)
        if verdict.outage:
            return verdict._replace(reason=f"{verdict.reason}; the agent stopped ({outcome})")
        return verdict
    if outcome == "completed" and calls:
        last = as_call(calls[-1])
        if is_outage(last):
            return OutageVerdict(True, f"model upstream failed: {describe(last)} (the agent's last call)", last)
        return OutageVerdict(False, "the agent completed and its last model call did not fail on an outage")
    return OutageVerdict(False, f"{outcome} is the agent's outcome whatever the model calls say")


# --- the record of discarded rollouts -------------------------------------------------------------------------
def attempt_record(
    verdict: OutageVerdict,
    *,
    exit_reason: str,
    error: str | None,
    session: str | None,
    steps: int,
    started_at: Any,
    ended_at: Any,
    model_calls: Iterable[Any],
) -> dict[str, Any]:
    """One discarded rollout as JSON data (kept in the trial's checkpoints until the commit)."""

    def iso(v: Any) -> Any:
        return v.isoformat() if hasattr(v, "isoformat") else v

    return {
        "outcome": "model_error",
        "reason": verdict.reason,
        "exit_reason": exit_reason,
        "error": error,
        "session": session,
        "steps": steps,
        "started_at": iso(started_at),
        "ended_at": iso(ended_at),
        "model_calls": [as_call(c).model_dump(mode="json") for c in model_calls],
    }


def attempt_events(attempts: Iterable[Mapping[str, Any]], *, t_s: float = 0.0) -> list[Any]:
    """One ``model_error`` trajectory event per discarded rollout (the lake's ``trajectory_events``, kind
    ``model_error``: the reason as content, the attempt's session, exit reason, steps, times and call count as
    data), at ``t_s``."""
    from saasbench.agents.base import TrajectoryEvent

    out = []
    for i, a in enumerate(attempts):
        data = {k: a.get(k) for k in ("exit_reason", "session", "steps", "started_at", "ended_at")}
        data |= {"rollout": i, "model_calls": len(a.get("model_calls") or [])}
        out.append(TrajectoryEvent(t_s=t_s, kind="model_error", message=str(a.get("reason") or ""), data=data))
    return out


def attempt_calls(attempts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The model calls of the discarded rollouts, in order (each keeps its attempt's gateway session)."""
    return [c for a in attempts for c in a.get("model_calls") or []]
