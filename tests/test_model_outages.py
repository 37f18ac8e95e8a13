"""Model outages are infrastructure (issue #19): a rollout the model upstream broke is run again, and a trial
whose model stays down ends ``model_error`` (not scored) while the sweep goes on.

A real LiteLLM gateway (module-scoped, small backoffs) in front of ``tests/fake_llm.py`` and of a port nobody
listens on (connections refused); the built-in agent through it and without it; a one-call agent standing in
for a CLI agent that only says "error" (or exits 0) after an API error, so the gateway's call records decide.
Retry waits of the stages go through ``sleep`` hooks (the upstream comes back there); nothing sleeps on time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llm import FakeLLM, Reply
from shared_data import oracle_sweep_spec

from saasbench import lake as lakelib
from saasbench.agents.base import Agent, Budget, Trajectory
from saasbench.runs import gateway as G
from saasbench.runs import stages
from saasbench.runs import sweep as sw

MIN_S, MAX_S, NUM_RETRIES = 0.05, 0.1, 2
PROVIDER_KEY = {"SAASBENCH_TEST_OUTAGE_PROVIDER_KEY": "sk-provider-outage-SECRET"}
REFERENCE = Path(__file__).resolve().parents[1] / "tasks" / "timetrack" / "reference"


def _dead_port() -> int:
    """A port of 127.0.0.1 nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def upstream():
    llm = FakeLLM().start()
    try:
        yield llm
    finally:
        llm.stop()


@pytest.fixture(scope="module")
def gw(upstream, tmp_path_factory):
    saved = {k: os.environ.get(k) for k in PROVIDER_KEY}
    os.environ.update(PROVIDER_KEY)
    key_env = next(iter(PROVIDER_KEY))
    config = G.GatewayConfig(
        models=[
            G.GatewayModel(
                name="fake-chat", litellm_model="openai/fake", api_base=upstream.base_url, api_key_env=key_env
            ),
            G.GatewayModel(
                name="dead-chat",
                litellm_model="openai/fake",
                api_base=f"http://127.0.0.1:{_dead_port()}/v1",
                api_key_env=key_env,
            ),
        ],
        num_retries=NUM_RETRIES,
        backoff_min_s=MIN_S,
        backoff_max_s=MAX_S,
        workdir=str(tmp_path_factory.mktemp("gateway")),
    )
    gateway = G.Gateway(config)
    t0 = time.monotonic()
    try:
        gateway.start()
        print(f"\ngateway healthy after {time.monotonic() - t0:.1f}s (pid {gateway.pid})", file=sys.stderr)
        yield gateway
    finally:
        gateway.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def spec_for(tmp_path: Path, sweep_id: str, **kw: Any) -> sw.SweepSpec:
    return oracle_sweep_spec(tmp_path, sweep_id, **kw)


def _turn(i: int, name: str, args: dict[str, Any]) -> Reply:
    return Reply.with_message(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"t{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        },
        finish_reason="tool_calls",
        usage={"prompt_tokens": 50 + i, "completion_tokens": 5},
    )


def reference_turns() -> list[Reply]:
    """The built-in agent's turns that write the timetrack reference into the workspace, then finish."""
    files = sorted(
        p for p in REFERENCE.rglob("*") if p.is_file() and "__pycache__" not in p.parts and "data" not in p.parts
    )
    turns = [
        _turn(i, "write_file", {"path": p.relative_to(REFERENCE).as_posix(), "content": p.read_text(encoding="utf-8")})
        for i, p in enumerate(files)
    ]
    return [*turns, _turn(len(files), "finish", {"summary": "done"})]


def rows(lake: str, sql: str, sweep_id: str) -> list[dict[str, Any]]:
    return lakelib.query(lake, sql, sweep_id=sweep_id).to_pylist()


# --- the built-in agent through the gateway: down mid-trial, then back ----------------------------------------
def test_upstream_down_mid_trial_then_back_reruns_the_rollout_and_the_trial_completes(gw, upstream, tmp_path):
    """The upstream answers two turns, then 503s (the gateway retries, then fails the call): the built-in agent
    stops with model_error, the rollout is discarded (no checkpoint) and, after the stage's retry wait (the
    upstream is back by then), run again from scratch in a fresh environment with a new gateway session. The
    trial is a valid ``completed`` one; the lake keeps the discarded rollout as a ``model_error`` trajectory
    event and its calls (its own session), outside the trial's metered tokens."""
    turns = reference_turns()
    state = {"down": False, "answered": 0, "refused": 0, "workspaces": []}

    def responder(request) -> Reply:
        if state["down"]:
            state["refused"] += 1
            return Reply.error(503, "upstream unavailable")
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        if state["answered"] == 2 and not state["workspaces"]:  # the first rollout, mid-way
            state["down"] = True
            state["refused"] += 1
            return Reply.error(503, "upstream unavailable")
        state["answered"] += 1
        return turns[done]

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the stage's retry wait: the upstream comes back meanwhile
        sleeps.append(seconds)
        state["workspaces"].append("retry")
        state["down"] = False

    upstream.responder = responder
    spec = spec_for(tmp_path, "s-outage-back", agents=["builtin"], models=["fake-chat"])
    trial = sw.plan(spec)[0]
    try:
        outcome = sw.run_trial(trial, spec, gateway=gw, sleep=sleep)
    finally:
        upstream.responder = None
    assert outcome == "completed"
    assert sleeps == [0] and state["refused"] == 1 + NUM_RETRIES  # one failed call: its attempt and the retries
    lake = spec.lake_uri
    (t,) = rows(lake, "SELECT outcome, valid, deterministic_score, tokens_in, steps FROM trials", spec.sweep_id)
    assert t["outcome"] == "completed" and t["valid"] and t["deterministic_score"] > 50
    assert t["steps"] == len(turns)  # the counted rollout's, from the start (a fresh conversation)
    (ev,) = rows(lake, "SELECT content, data_json FROM trajectory_events WHERE kind = 'model_error'", spec.sweep_id)
    assert ev["content"].startswith("model upstream failed") and "503" in ev["content"]
    data = json.loads(ev["data_json"])
    assert data["exit_reason"] == "model_error" and data["steps"] == 3 and data["model_calls"] == 3
    calls = rows(
        lake,
        "SELECT call_index, session, status, error_class, http_status, attempts, tokens_in FROM model_calls "
        "ORDER BY call_index",
        spec.sweep_id,
    )
    first, counted = calls[:3], calls[3:]
    assert [(c["status"], c["error_class"], c["http_status"]) for c in first] == [
        ("success", None, None),
        ("success", None, None),
        ("failure", "ServiceUnavailableError", 503),
    ]
    assert first[2]["attempts"] == 1 + NUM_RETRIES
    assert len({c["session"] for c in first}) == 1 and {c["session"] for c in counted}.isdisjoint({first[0]["session"]})
    assert len(counted) == len(turns) and all(c["status"] == "success" for c in counted)
    assert t["tokens_in"] == sum(c["tokens_in"] for c in counted)  # the discarded rollout is not metered in
    assert lakelib.lake_from_uri(lake).list("stages/") == []  # checkpoints (the discarded record too) removed


# --- an agent that only says "error": the gateway's calls decide --------------------------------------------------
class OneCallAgent(Agent):
    """Stands in for a CLI agent: one chat call through the gateway; an API error ends it ``agent_error`` (a CLI
    that only reports "error"), or ``completed`` for :class:`ExitsZeroAgent` (a CLI that exits 0 after one)."""

    name = "one-call"
    version = "1"
    gateway: Any = None
    after_error = "agent_error"

    def __init__(self, model: str | None = None):
        self.model = model

    def run(self, prompt: str, env: Any, budget: Budget) -> Trajectory:
        traj = self.new_trajectory(model=self.model)
        traj.steps = 1
        r = httpx.post(
            self.gateway.openai_base_url + "/chat/completions",
            headers={"Authorization": f"Bearer {self.gateway.api_key}"},
            json={"model": self.model, "messages": [{"role": "user", "content": prompt[:200]}]},
            timeout=60,
        )
        if r.status_code == 200:
            return traj.finish("completed")
        return traj.finish(self.after_error, f"API Error: {r.status_code}")  # type: ignore[arg-type]


class ExitsZeroAgent(OneCallAgent):
    after_error = "completed"


@pytest.mark.parametrize("agent", ["OneCallAgent", "ExitsZeroAgent"])
def test_a_model_that_stays_down_ends_model_error_from_the_gateway_calls(gw, tmp_path, agent):
    """Connections to the model refused through every retry: each rollout is discarded (the agent said only
    "error", or "completed", but its call failed with an outage); after the retries the trial is committed as
    ``model_error``: no node rows, not valid, the reason in outcome_detail, every rollout's calls as evidence."""
    spec = spec_for(tmp_path, f"s-down-{agent}", agents=[f"{__name__}:{agent}"], models=["dead-chat"])
    trial = sw.plan(spec)[0]
    sleeps: list[float] = []
    assert sw.run_trial_retrying(trial, spec, gateway=gw, sleep=sleeps.append) == "model_error"
    assert sleeps == [0, 0]  # the sweep's two retries, each a fresh rollout
    lake = spec.lake_uri
    (t,) = rows(lake, "SELECT outcome, valid, outcome_detail, task_score FROM trials", spec.sweep_id)
    assert t["outcome"] == "model_error" and not t["valid"] and t["task_score"] is None
    detail = t["outcome_detail"]
    # the gateway's tap answers litellm 502 for a refused connection (issue #19: named, not a bare 500)
    assert detail.startswith("ModelError: ") and "model upstream failed: 502 BadGatewayError" in detail
    assert "unreachable" in detail and "Connection refused" in detail and f"after {NUM_RETRIES} retries" in detail
    assert rows(lake, "SELECT count(*) AS n FROM node_results", spec.sweep_id) == [{"n": 0}]
    events = rows(lake, "SELECT content FROM trajectory_events WHERE kind = 'model_error'", spec.sweep_id)
    assert len(events) == 3 and all("model upstream failed" in e["content"] for e in events)
    calls = rows(
        lake, "SELECT session, status, error_class, http_status, upstream_errors FROM model_calls", spec.sweep_id
    )
    assert len(calls) == 3 and len({c["session"] for c in calls}) == 3
    assert {(c["status"], c["error_class"], c["http_status"]) for c in calls} == {("failure", "BadGatewayError", 502)}
    assert all(c["upstream_errors"] and c["upstream_errors"][0].startswith("unreachable") for c in calls)
    store = lakelib.lake_from_uri(lake)
    assert stages.Checkpoints(store, spec.sweep_id, trial.trial_id).load(stages.ROLLOUT_ATTEMPTS) is None


def test_a_request_error_is_the_agents_and_is_not_retried(gw, upstream, tmp_path):
    """A 400 (a request problem) is no outage: the agent's ``agent_error``, one rollout, evaluated, valid."""
    upstream.queue(Reply.error(400, "bad field"))
    spec = spec_for(tmp_path, "s-400", agents=[f"{__name__}:OneCallAgent"], models=["fake-chat"])
    try:
        outcome = sw.run_trial_retrying(
            sw.plan(spec)[0], spec, gateway=gw, sleep=lambda s: pytest.fail("no retry expected")
        )
    finally:
        left = upstream.pending()
        upstream._queue.clear()
    assert outcome == "agent_error" and left == 0
    (t,) = rows(spec.lake_uri, "SELECT outcome, valid FROM trials", spec.sweep_id)
    assert t == {"outcome": "agent_error", "valid": True}
    assert rows(
        spec.lake_uri, "SELECT count(*) AS n FROM trajectory_events WHERE kind = 'model_error'", spec.sweep_id
    ) == [{"n": 0}]


# --- the built-in agent without a gateway: its own retries, then model_error; the sweep goes on --------------
def test_builtin_agent_without_gateway_whose_model_stays_down_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """The built-in agent calls its model directly (no gateway) and every connection is refused: after its own
    retries it ends ``model_error``; the trial is retried with fresh rollouts, then committed ``model_error``;
    the oracle's trial of the same sweep completes, and the leaderboard counts the builtin's trial as infra,
    outside its valid trials."""
    monkeypatch.setenv("SAASBENCH_AGENT_API_BASE", f"http://127.0.0.1:{_dead_port()}/v1")
    monkeypatch.setenv("SAASBENCH_AGENT_BACKOFF_BASE_S", "0.01")
    monkeypatch.setenv("SAASBENCH_AGENT_BACKOFF_CAP_S", "0.02")
    spec = spec_for(tmp_path, "s-direct-down", agents=["builtin", "oracle"], models=["openai/fake"], retries=1)
    sleeps: list[float] = []
    outcomes = sw.run_sweep_plain(spec, sleep=sleeps.append)
    assert outcomes == {"timetrack.builtin.openai_fake.0": "model_error", "timetrack.oracle.openai_fake.0": "completed"}
    assert sleeps == [0]  # the builtin's one retry
    (t,) = rows(
        spec.lake_uri,
        "SELECT outcome, valid, outcome_detail FROM trials WHERE agent = 'builtin'",
        spec.sweep_id,
    )
    assert t["outcome"] == "model_error" and not t["valid"]
    assert "model upstream failed after 6 attempt(s) of this agent" in t["outcome_detail"]
    assert "Connection error" in t["outcome_detail"]  # litellm reports a refused connection as a 500
    events = rows(
        spec.lake_uri,
        "SELECT data_json FROM trajectory_events WHERE kind = 'model_error' AND agent = 'builtin'",
        spec.sweep_id,
    )
    assert [json.loads(e["data_json"])["exit_reason"] for e in events] == ["model_error", "model_error"]
    agg = sw.aggregate(spec)
    by_agent = {c.agent: c for c in agg["report"].configs}
    builtin, oracle = by_agent["builtin"], by_agent["oracle"]
    assert builtin.outcome_counts == {"model_error": 1} and (builtin.valid_trials, builtin.infra_trials) == (0, 1)
    assert builtin.valid.trials == 0 and oracle.valid_trials == 1 and oracle.valid.pass_at_1 > 90
    assert "| builtin / openai/fake |" in agg["markdown"] and "| 0/1 |" in agg["markdown"]


# --- a real crash: the model server's process stops listening mid-trial and comes back ------------------------
def test_model_server_killed_mid_trial_and_restarted_the_trial_is_retried_and_valid(tmp_path):
    """The model server stops listening after its first answer (connections refused, as a crashed llama.cpp
    server) and is brought back up on the same port during the stage's retry wait: the rollout is run again
    and the trial ends valid. The gateway's tap names the refusal in the discarded call's upstream_errors."""
    import threading

    from fake_upstreams import ChatOnlyUpstream

    class Crashing(ChatOnlyUpstream):
        crashed = False

        def answer(self, handler, body, raw):
            super().answer(handler, body, raw)
            if not self.crashed:
                self.crashed = True
                threading.Thread(target=self.kill, daemon=True).start()  # after this answer went out

    up = Crashing(command="echo back > back.txt")
    config = G.GatewayConfig(
        models=[G.GatewayModel(name="crashy", api="chat", model="smol", api_base=up.base_url)],
        num_retries=NUM_RETRIES,
        backoff_min_s=MIN_S,
        backoff_max_s=MAX_S,
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the stage's retry wait: the server is restarted meanwhile
        sleeps.append(seconds)
        up.restart()

    try:
        with G.Gateway(config) as gw:
            spec = spec_for(tmp_path, "s-crash", agents=["builtin"], models=["crashy"])
            outcome = sw.run_trial(sw.plan(spec)[0], spec, gateway=gw, sleep=sleep)
    finally:
        up.close()
    assert outcome == "completed" and sleeps == [0]
    lake = spec.lake_uri
    (t,) = rows(lake, "SELECT outcome, valid FROM trials", spec.sweep_id)
    assert t == {"outcome": "completed", "valid": True}
    (ev,) = rows(lake, "SELECT content FROM trajectory_events WHERE kind = 'model_error'", spec.sweep_id)
    assert "model upstream failed" in ev["content"]
    failed = rows(lake, "SELECT upstream_errors FROM model_calls WHERE status = 'failure'", spec.sweep_id)
    assert len(failed) == 1 and all(e.startswith("unreachable") for e in failed[0]["upstream_errors"])
