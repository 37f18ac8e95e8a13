"""Failure taxonomy (ARCHITECTURE.md): exceptions that carry the trial ``outcome`` they stand for.

Raised where the failure happens, so the outcome is never guessed later. Only infrastructure
failures (:class:`EnvError`, :class:`JudgeError`, :class:`ModelError`) are ``retryable``; agent
outcomes never are (a retry would bias the score) and a :class:`TaskDefect` would fail the same way
again.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base: a trial that did not end ``completed``. ``outcome`` is a ``trials.outcome`` value."""

    outcome: str = "env_error"
    retryable: bool = False

    def __init__(self, message: str = "", *, detail: str | None = None):
        super().__init__(message)
        self.detail = detail if detail is not None else message


class EnvError(HarnessError):
    """The environment (workspace, database, container, image build) could not be set up."""

    outcome = "env_error"
    retryable = True


class JudgeError(HarnessError):
    """A transient judge / model-API failure during evaluation."""

    outcome = "judge_error"
    retryable = True


class ModelError(HarnessError):
    """The agent's model upstream failed (connection refused or reset, timeout, HTTP 408/429/5xx/529) after
    the retries of the gateway or of the agent, and the agent stopped on it: infrastructure, like a judge
    outage. Retried with a fresh rollout; still failing, the trial is ``model_error`` (not scored)."""

    outcome = "model_error"
    retryable = True


class LakeError(EnvError):
    """Writing the trial's results to the lake failed (object store down, disk full): retried from the
    commit stage, so the agent is never run again for it."""


class TaskDefect(HarnessError):
    """The task itself is broken (unloadable spec or DAG, failing reference): not retried."""

    outcome = "task_defect"
    retryable = False


class AgentError(HarnessError):
    """The agent crashed. Never retried."""

    outcome = "agent_error"
    retryable = False


class AgentTimeout(AgentError):
    outcome = "agent_timeout"


class AgentBudgetExceeded(AgentError):
    outcome = "agent_budget_exceeded"


class VoidedCheat(AgentError):
    """The agent tampered with the evaluation (e.g. read the DAG or the reference)."""

    outcome = "voided_cheat"


BY_OUTCOME: dict[str, type[HarnessError]] = {
    cls.outcome: cls
    for cls in (
        EnvError,
        JudgeError,
        ModelError,
        TaskDefect,
        AgentError,
        AgentTimeout,
        AgentBudgetExceeded,
        VoidedCheat,
    )
}


def is_retryable(exc: BaseException) -> bool:
    """True only for a retryable :class:`HarnessError` (what Prefect's ``retry_condition_fn`` asks)."""
    return isinstance(exc, HarnessError) and exc.retryable


def outcome_of(exc: BaseException) -> str:
    return exc.outcome if isinstance(exc, HarnessError) else "env_error"
