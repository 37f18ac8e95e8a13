"""The gateway bridges every client API to every upstream API (issue #19), with the provider's own usage.

Clients: the real Claude Code CLI (Anthropic Messages), the real Codex CLI (OpenAI Responses) and the
built-in agent (Chat Completions through litellm). Upstreams (tests/fake_upstreams.py): a strict
Chat-Completions-only server (refuses list-shaped system content and the ``developer`` role, as
llama-cpp-python does), a Responses-only and a Messages-only server. One gateway entry per upstream,
in the documented form ``{api: chat|responses|messages, model, api_base}``. Every pair must finish
its scripted task (one shell tool call, then the end), with each call's tokens equal to what the
upstream counted. docs/gateway.md's table is this test.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from fake_upstreams import ChatOnlyUpstream, MessagesOnlyUpstream, ResponsesOnlyUpstream
from test_agent_adapters import _claude_bin, _codex_bin

from saasbench.agents.base import Budget
from saasbench.agents.builtin import BuiltinAgent
from saasbench.agents.claude_code import ClaudeCodeAgent
from saasbench.agents.codex import CodexAgent
from saasbench.environments.local import LocalEnvironment
from saasbench.runs import gateway as G
from saasbench.runs.upstream import UsageMeter, normalise_chat_request

UPSTREAMS = {"chat": ChatOnlyUpstream, "responses": ResponsesOnlyUpstream, "messages": MessagesOnlyUpstream}
KEY_VAR = "SAASBENCH_TEST_BRIDGE_KEY"
PROVIDER_KEY = "sk-bridge-provider-SECRET-0042"


@pytest.fixture(scope="module")
def ups():
    servers = {api: cls() for api, cls in UPSTREAMS.items()}
    try:
        yield servers
    finally:
        for s in servers.values():
            s.close()


@pytest.fixture(scope="module")
def bridge(ups, tmp_path_factory):
    saved = os.environ.get(KEY_VAR)
    os.environ[KEY_VAR] = PROVIDER_KEY
    models = [
        G.GatewayModel(
            name=f"up-{api}",
            api=api,
            model="fake-upstream-model",
            api_base=s.root_url if api == "messages" else s.base_url,
            api_key_env=KEY_VAR,
            input_cost_per_token=0.000001,
            output_cost_per_token=0.000004,
        )
        for api, s in ups.items()
    ] + [
        G.GatewayModel(name=f"up-chat-{mode}", api="chat", api_base=ups["chat"].base_url, stream_usage=mode)
        for mode in ("native", "auto")
    ]
    gw = G.Gateway(
        G.GatewayConfig(
            models=models,
            backoff_min_s=0.05,
            backoff_max_s=0.1,
            num_retries=2,
            stall_timeout_s=2.0,
            workdir=str(tmp_path_factory.mktemp("bridge-gw")),
        )
    )
    try:
        yield gw.start()
    finally:
        gw.close()
        if saved is None:
            os.environ.pop(KEY_VAR, None)
        else:
            os.environ[KEY_VAR] = saved


def _agent(client: str, model: str, tmp_path: Path):
    if client == "builtin":
        return BuiltinAgent(model=model, backoff_base_s=0.01, backoff_cap_s=0.01)
    exe = _claude_bin() if client == "claude-code" else _codex_bin()
    if exe is None:
        pytest.fail(f"{client} CLI not installed (scripts/test.sh installs it)")
    cls = ClaudeCodeAgent if client == "claude-code" else CodexAgent
    return cls(model=model, bin_dir=str(Path(exe).parent), artefacts_dir=tmp_path / "a")


# --- the matrix: every client through every upstream ------------------------------------------------------------
@pytest.mark.parametrize("upstream", ["chat", "responses", "messages"])
@pytest.mark.parametrize("client", ["claude-code", "codex", "builtin"])
def test_every_client_reaches_every_upstream(bridge, ups, tmp_path, client: str, upstream: str) -> None:
    up = ups[upstream]
    name = f"{client}-{upstream}.txt"
    up.command = f"echo bridged > {name}"
    n0, served0 = len(up.requests), len(up.served)
    agent = bridge.attach(_agent(client, f"up-{upstream}", tmp_path), f"tt.{client}.{upstream}.0")
    with LocalEnvironment() as env:
        traj = agent.run(f"Create {name} containing bridged.", env, Budget(steps=6, wall_s=240))
        made = (Path(env.workspace_path) / name).read_bytes() if (Path(env.workspace_path) / name).exists() else None
    why = (traj.error, up.rejected[-1:] if up.rejected else None)
    assert traj.exit_reason == "completed", why
    assert made == b"bridged\n", why
    sent = up.requests[n0:]
    assert sent and not [r for r in up.rejected if r in sent], "the upstream refused a request shape"
    assert all(r["path"].endswith(up.route) for r in sent)
    auth = [r["headers"].get("x-api-key") or r["headers"].get("authorization", "") for r in sent]
    assert all(PROVIDER_KEY in a for a in auth)  # the provider key was added by the gateway, not the agent
    calls = agent.gateway.calls()
    ok = [c for c in calls if c.status == "success"]
    assert len(ok) == len(up.served) - served0 >= 2
    # every successful call's tokens are the upstream's own counts, in order
    assert [(c.prompt_tokens, c.completion_tokens) for c in ok] == up.served[served0:]
    assert {c.usage_source for c in ok} == {"upstream"}
    assert sum(c.cost_usd for c in ok) == pytest.approx(
        sum(p * 0.000001 + c * 0.000004 for p, c in up.served[served0:]), abs=1e-12
    )


# --- shapes and usage (no agent) ------------------------------------------------------------------------------------
def test_chat_requests_are_normalised_for_strict_servers() -> None:
    body = {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]},
            {"role": "developer", "content": [{"type": "input_text", "text": "b"}]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "out"}]},
        ],
    }
    out = normalise_chat_request(body)
    assert out["messages"][0] == {"role": "system", "content": "a\n\nb"}
    assert [m["role"] for m in out["messages"]] == ["system", "user", "user", "assistant", "tool"]
    assert out["messages"][1]["content"] == "hi" and isinstance(out["messages"][2]["content"], list)  # image kept
    assert out["messages"][4]["content"] == "out" and out["messages"][3]["content"] == ""  # null refused by llama.cpp
    assert out["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"][0]["text"] == "a"  # the input is not mutated


@pytest.mark.parametrize(
    "events, want",
    [
        ([{"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}], (11, 3)),
        (
            [
                {"type": "message_start", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 7}}},
                {"type": "message_delta", "usage": {"output_tokens": 9}},
            ],
            (12, 9),
        ),
        ([{"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 2}}}], (4, 2)),
        ([{"choices": [{"delta": {"content": "x"}}]}], (None, None)),
    ],
)
def test_the_usage_meter_reads_every_stream_dialect(events, want) -> None:
    meter = UsageMeter()
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    for i in range(0, len(raw), 7):  # in pieces that split lines, as a socket does
        meter.feed_sse(raw[i : i + 7])
    assert (meter.prompt, meter.completion) == want
    assert meter.reported == (want != (None, None))


def _chat(gw: G.Gateway, model: str, key: str, stream: bool = False) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_whose_upstream_reports_no_usage_is_flagged_an_estimate(bridge, ups, stream: bool) -> None:
    up = ups["chat"]
    access = bridge.for_trial(f"tt.estimate.{stream}")
    up.report_usage = False
    try:
        r = _chat(bridge, "up-chat", access.api_key, stream)
    finally:
        up.report_usage = True
    assert r.status_code == 200, r.text
    (call,) = access.calls()
    assert call.status == "success" and call.usage_source == "estimate"
    # the tap's count of the text sent ("hi") and received ("Done: the file was created.")
    assert 1 <= call.prompt_tokens <= 3 and 4 <= call.completion_tokens <= 10
    assert call.cost_usd == pytest.approx(call.prompt_tokens * 0.000001 + call.completion_tokens * 0.000004)


def test_a_stalled_upstream_is_cut_off_retried_and_named(bridge, ups) -> None:
    up = ups["chat"]
    access = bridge.for_trial("tt.stall")
    up.hang_next = [30.0]  # silent far past the 2 s stall limit; the retry is answered
    t0 = time.monotonic()
    r = _chat(bridge, "up-chat", access.api_key)
    waited = time.monotonic() - t0
    up.hang_next = []
    assert r.status_code == 200, r.text
    (call,) = access.calls()
    assert call.status == "success" and call.attempts == 2
    assert any(e.startswith("stalled") for e in call.upstream_errors)
    assert waited < 30  # cut off by the stall limit, not by the upstream giving up


def test_an_unreachable_upstream_is_a_named_failure(bridge) -> None:
    dead = ChatOnlyUpstream()
    url = dead.base_url
    dead.close()  # nothing listens there any more
    models = [G.GatewayModel(name="gone", api="chat", api_base=url)]
    with G.Gateway(G.GatewayConfig(models=models, backoff_min_s=0.05, backoff_max_s=0.05, num_retries=1)) as gw:
        access = gw.for_trial("tt.gone")
        r = _chat(gw, "gone", access.api_key)
        (call,) = access.calls()
    assert r.status_code >= 500
    assert call.status == "failure" and call.attempts == 2
    assert call.upstream_errors and all(e.startswith("unreachable") for e in call.upstream_errors)


def test_an_entry_names_one_route() -> None:
    with pytest.raises(ValueError, match="exactly one of api"):
        G.GatewayModel(name="x", api="chat", litellm_model="openai/x")
    with pytest.raises(ValueError, match="exactly one of api"):
        G.GatewayModel(name="x")
    assert G.GatewayModel(name="x", api="responses").provider_model == "openai/responses/x"
    assert G.GatewayModel(name="x", api="messages", model="claude").provider_model == "anthropic/claude"
    params = G.GatewayModel(name="x", api="chat", api_base="http://h/v1").litellm_params()
    assert params["use_chat_completions_api"] is True and params["model"] == "openai/x"
    assert G.GatewayModel(name="x", api="messages").tap_target() == ("https://api.anthropic.com", "messages")
    assert G.GatewayModel(name="x", litellm_model="bedrock/claude").tap_target() is None


def test_the_lake_holds_the_upstreams_counts_and_flags_estimates(bridge, ups, tmp_path) -> None:
    from saasbench import lake as lakelib
    from saasbench.lake.records import TrialInfo, trial_rows

    up = ups["chat"]
    access = bridge.for_trial("tt.builtin.up-chat.lake")
    served0 = len(up.served)
    assert _chat(bridge, "up-chat", access.api_key, stream=True).status_code == 200
    up.report_usage = False
    try:
        assert _chat(bridge, "up-chat", access.api_key, stream=True).status_code == 200
    finally:
        up.report_usage = True
    store = lakelib.lake_from_uri(str(tmp_path / "lake"))
    info = TrialInfo(
        sweep_id="sw-br", trial_id="tt.builtin.up-chat.lake", task_id="t", agent="builtin", model="up-chat"
    )
    lakelib.write_trial(store, trial_rows(info, model_calls=access.calls()))
    rows = lakelib.query(
        store,
        "SELECT tokens_in, tokens_out, usage_source, usage_estimated, api_base FROM model_calls ORDER BY call_index",
    ).to_pylist()
    assert [(r["tokens_in"], r["tokens_out"]) for r in rows[:1]] == up.served[served0:]
    assert [(r["usage_source"], r["usage_estimated"]) for r in rows] == [("upstream", False), ("estimate", True)]
    assert {r["api_base"] for r in rows} == {up.base_url}  # the provider's URL, not the tap's


def test_a_stream_that_stalls_midway_is_cut_off_and_recorded_as_failed(bridge, ups) -> None:
    up = ups["chat"]
    access = bridge.for_trial("tt.stall.mid")
    up.hang_mid_stream_next = [30.0]
    t0 = time.monotonic()
    try:
        with httpx.stream(
            "POST",
            bridge.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {access.api_key}"},
            json={"model": "up-chat-native", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        ) as r:
            body = b"".join(r.iter_raw())
    except httpx.HTTPError as exc:  # the proxy may cut the connection itself
        body = repr(exc).encode()
    finally:
        up.hang_mid_stream_next = []
    assert time.monotonic() - t0 < 30
    assert b"[DONE]" not in body or b"error" in body
    (call,) = access.calls()
    assert call.status == "failure", call
    assert any(e.startswith("stalled") for e in call.upstream_errors)


def test_streams_of_a_provider_without_stream_usage_are_buffered_for_exact_counts(bridge, ups, tmp_path) -> None:
    """llama-cpp-python 0.3.36 sends no usage on streams (it ignores include_usage): with stream_usage auto,
    the first streamed call is an estimate and the tap then asks for whole answers, which carry usage, and
    streams them to the client itself. The real Claude Code (streamed, tool calls) completes through it."""
    up = ups["chat"]
    up.stream_usage = False
    up.command = "echo buffered > buffered.txt"
    served0 = len(up.served)
    try:
        agent = bridge.attach(_agent("claude-code", "up-chat-auto", tmp_path), "tt.claude-code.buffered.0")
        with LocalEnvironment() as env:
            traj = agent.run("Create buffered.txt containing buffered.", env, Budget(steps=6, wall_s=240))
            made = (Path(env.workspace_path) / "buffered.txt").read_bytes()
    finally:
        up.stream_usage = True
    assert traj.exit_reason == "completed" and made == b"buffered\n", traj.error
    calls = [c for c in agent.gateway.calls() if c.status == "success"]
    assert len(calls) >= 2 and calls[0].usage_source == "estimate"
    assert {c.usage_source for c in calls[1:]} == {"upstream"}
    exact = [(c.prompt_tokens, c.completion_tokens) for c in calls[1:]]
    assert exact == up.served[served0:][-len(exact) :]  # what the provider counted, call by call
    assert not any(r["body"].get("stream") for r in up.requests[-len(exact) :])  # asked for whole answers
