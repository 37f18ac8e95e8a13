"""The model-outage classifier (saasbench.runs.outages) over gateway call records, and the outcome's place in
the failure taxonomy: a model outage is infrastructure (model_error: retried, never a valid trial)."""

from __future__ import annotations

import pytest

from saasbench.failures import BY_OUTCOME, ModelError, is_retryable, outcome_of
from saasbench.lake import schema as S
from saasbench.runs.gateway import ModelCall
from saasbench.runs.outages import (
    attempt_calls,
    attempt_events,
    attempt_record,
    is_outage,
    rollout_outage,
    stopped_on_outage,
)
from saasbench.services.judge import classify, transient_failure


def ok(i: int = 0) -> ModelCall:
    return ModelCall(trial_id="t", call_id=f"ok{i}", status="success", prompt_tokens=10, completion_tokens=2)


def failed(error_class: str | None, status: int | None, *, retries: int = 5, error: str = "boom") -> ModelCall:
    return ModelCall(
        trial_id="t",
        call_id=f"f-{error_class}-{status}",
        status="failure",
        error_class=error_class,
        http_status=status,
        error=error,
        model_group="fake-chat",
        attempts=retries + 1,
        retried_errors=[error_class or ""] * retries,
    )


# as litellm 1.110.2 reports them through the gateway (measured; see saasbench/runs/outages.py)
OUTAGES = {
    "503 service unavailable": failed("ServiceUnavailableError", 503),
    "500 internal server error": failed("InternalServerError", 500),
    "502 bad gateway": failed("BadGatewayError", 502),
    "504 gateway timeout": failed("Timeout", 504),
    "529 overloaded": failed("APIError", 503),
    "529 as its own status": failed("APIError", 529),
    "429 rate limited": failed("RateLimitError", 429),
    "408 request timeout": failed("Timeout", 408),
    "refused or dropped connection": failed("InternalServerError", 500, error="Connection error."),
    "client connection error without a status": failed("APIConnectionError", None, retries=0),
    "client timeout without a status": failed("APITimeoutError", None, retries=0),
    "refused socket": failed("ConnectionRefusedError", None, retries=0),
    "reset socket": failed("ConnectionResetError", None, retries=0),
    "broken stream": failed("MidStreamFallbackError", 503, retries=0),
    "stalled stream (read timeout)": failed("ReadTimeout", None, retries=0),
    "timeout class with a 4xx status": failed("Timeout", 400, retries=0),
}
NOT_OUTAGES = {
    "400 bad request": failed("BadRequestError", 400, retries=0),
    "400 context window": failed("ContextWindowExceededError", 400, retries=0),
    "401 bad key": failed("AuthenticationError", 401, retries=0),
    "403 forbidden (retried by the gateway, still a configuration problem)": failed("APIError", 403),
    "404 unknown model": failed("NotFoundError", 404, retries=0),
    "413 too large": failed("APIError", 413, retries=0),
    "422 unprocessable": failed("UnprocessableEntityError", 422, retries=0),
    "an unknown failure": failed("KeyError", None, retries=0),
    "a failure without class or status": failed(None, None, retries=0),
}


@pytest.mark.parametrize("name", sorted(OUTAGES))
def test_outage_classes(name: str) -> None:
    call = OUTAGES[name]
    assert is_outage(call) and is_outage(call.model_dump(mode="json"))  # also from a checkpoint's JSON
    verdict = stopped_on_outage([ok(), call])
    assert verdict.outage and verdict.call == call and verdict.reason.startswith("model upstream failed: ")


@pytest.mark.parametrize("name", sorted(NOT_OUTAGES))
def test_request_and_configuration_failures_are_not_outages(name: str) -> None:
    call = NOT_OUTAGES[name]
    assert not is_outage(call)
    verdict = stopped_on_outage([ok(), call])
    assert not verdict.outage and "not an outage" in verdict.reason
    assert not rollout_outage("agent_error", [ok(), call]).outage


def test_the_reason_names_status_class_retries_and_error() -> None:
    verdict = stopped_on_outage([ok(), failed("ServiceUnavailableError", 503, error="litellm: upstream down\n")])
    assert verdict.reason == (
        "model upstream failed: 503 ServiceUnavailableError after 5 retries (6 attempts) for model fake-chat: "
        "litellm: upstream down"
    )
    long = stopped_on_outage([failed("InternalServerError", 500, retries=1, error="x" * 5000)]).reason
    assert "after 1 retry (2 attempts)" in long and len(long) < 500


def test_a_success_after_the_failure_means_the_agent_got_past_it() -> None:
    assert not stopped_on_outage([ok(0), OUTAGES["503 service unavailable"], ok(1)]).outage
    assert stopped_on_outage([OUTAGES["429 rate limited"], ok(1), OUTAGES["503 service unavailable"]]).outage


def test_no_calls_and_only_successes_are_not_outages() -> None:
    assert stopped_on_outage([]) == (False, "no model calls recorded", None)
    assert not stopped_on_outage([ok(0), ok(1)]).outage
    assert not rollout_outage("agent_error", []).outage  # an agent crash without any model call


def test_an_outage_before_a_side_failure_still_counts() -> None:
    """An agent's ancillary call failing with a 404 after the main model's 503 (no success in between)."""
    verdict = stopped_on_outage([ok(), OUTAGES["503 service unavailable"], NOT_OUTAGES["404 unknown model"]])
    assert verdict.outage and verdict.call == OUTAGES["503 service unavailable"]
    assert "(2 failed call(s) after the last success)" in verdict.reason


def test_the_rollout_rule_by_exit_reason() -> None:
    down = [ok(), OUTAGES["504 gateway timeout"]]
    for outcome in ("agent_error", "agent_timeout"):
        verdict = rollout_outage(outcome, down)
        assert verdict.outage and verdict.reason.endswith(f"the agent stopped ({outcome})")
    # completed: only a last call of outage class (an agent that exits 0 after an API error)
    assert rollout_outage("completed", down).outage
    assert not rollout_outage("completed", [OUTAGES["504 gateway timeout"], ok()]).outage
    assert not rollout_outage("completed", []).outage
    # the agent's own verdict
    said = rollout_outage("model_error", [], error="model upstream failed after 6 attempt(s): 503")
    assert said.outage and said.reason == "model upstream failed after 6 attempt(s): 503"
    assert rollout_outage("model_error", []).reason.startswith("model upstream failed: ")
    # the agent's own outcomes stay, whatever the calls say; cheating is never washed out by an outage
    for outcome in ("agent_budget_exceeded", "voided_cheat"):
        assert not rollout_outage(outcome, down).outage


def test_the_judge_and_the_outage_classifier_share_one_rule() -> None:
    """A model outage means the same on both sides: the judge's retry decision (classify, from an exception)
    and the rollout's (is_outage, from the gateway's record of the same failure)."""
    import litellm

    for exc, status in [
        (litellm.ServiceUnavailableError("down", "openai", "fake"), 503),
        (litellm.InternalServerError("boom", "openai", "fake"), 500),
        (litellm.RateLimitError("slow down", "openai", "fake"), 429),
        (litellm.Timeout("timed out", "fake", "openai"), 408),
        (litellm.APIConnectionError("Connection error.", "openai", "fake"), 500),
        (litellm.BadRequestError("bad", "fake", "openai"), 400),
        (litellm.AuthenticationError("key", "openai", "fake"), 401),
        (litellm.NotFoundError("nf", "fake", "openai"), 404),
        (ConnectionRefusedError(111, "refused"), None),
    ]:
        recorded = failed(type(exc).__name__, status, retries=0)
        assert classify(exc).transient == is_outage(recorded), exc
    assert transient_failure(None, {"ConnectionRefusedError"}) and not transient_failure(None, set())
    assert transient_failure(529, set()) and not transient_failure(422, {"InternalServerError"})


def test_model_error_is_a_retryable_infrastructure_outcome() -> None:
    exc = ModelError("model upstream failed: 503")
    assert is_retryable(exc) and outcome_of(exc) == "model_error" and BY_OUTCOME["model_error"] is ModelError
    assert "model_error" in S.OUTCOMES and "model_error" in S.INFRA_OUTCOMES
    assert "model_error" not in S.VALID_OUTCOMES


def test_the_record_of_a_discarded_rollout() -> None:
    import datetime as dt

    calls = [ok(), OUTAGES["503 service unavailable"]]
    verdict = rollout_outage("agent_error", calls)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rec = attempt_record(
        verdict,
        exit_reason="agent_error",
        error="API Error: 503",
        session="s1",
        steps=3,
        started_at=t0,
        ended_at=t0,
        model_calls=calls,
    )
    assert rec["outcome"] == "model_error" and rec["reason"] == verdict.reason
    assert [c["status"] for c in rec["model_calls"]] == ["success", "failure"] and rec["started_at"] == t0.isoformat()
    (ev,) = attempt_events([rec], t_s=12.5)
    assert (ev.kind, ev.t_s, ev.message) == ("model_error", 12.5, verdict.reason)
    assert ev.data["session"] == "s1" and ev.data["model_calls"] == 2 and ev.data["rollout"] == 0
    assert attempt_calls([rec, rec]) == rec["model_calls"] * 2
