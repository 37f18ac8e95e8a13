"""The model gateway (saasbench/runs/gateway.py): one real LiteLLM proxy for the module, fake providers behind it.

Behind the proxy: ``tests/fake_llm.py`` (OpenAI chat completions, scripted 429/529 bursts and dropped
connections), and the scripted Anthropic Messages / OpenAI Responses fakes of test_agent_adapters.py
for the real Claude Code and Codex CLIs. The provider keys live only in the proxy's environment;
agents get the gateway URL and a per-trial virtual key. Retry waits are configured small
(0.05-0.2 s) here; only lower bounds of the waits are asserted.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fake_llm import FakeLLM, Reply
from test_agent_adapters import (
    _claude_bin,
    _codex_bin,
    _FakeMessages,
    _FakeResponses,
    sample,
    standin,
)

from saasbench.agents.base import Budget
from saasbench.agents.builtin import BuiltinAgent
from saasbench.agents.claude_code import ClaudeCodeAgent
from saasbench.agents.codex import CodexAgent
from saasbench.agents.openhands import OpenHandsAgent
from saasbench.environments.local import LocalEnvironment
from saasbench.runs import gateway as G

MIN_S, MAX_S = 0.05, 0.2
IN_COST, OUT_COST = 0.000002, 0.000010  # USD per token, configured for every model
PROVIDER_KEYS = {
    "SAASBENCH_TEST_PROVIDER_KEY": "sk-provider-chat-SECRET-0001",
    "SAASBENCH_TEST_ANTHROPIC_KEY": "sk-ant-provider-SECRET-0002",
    "SAASBENCH_TEST_OPENAI_KEY": "sk-openai-provider-SECRET-0003",
}
CLAUDE_CMD, CODEX_CMD = "echo via-gateway > claude_gw.txt", "echo via-gateway > codex_gw.txt"


@pytest.fixture(scope="module")
def upstream():
    """The fake providers: chat completions (scripted), Anthropic Messages, OpenAI Responses."""
    llm = FakeLLM().start()
    messages, responses = _FakeMessages(CLAUDE_CMD), _FakeResponses(CODEX_CMD)
    try:
        yield SimpleNamespace(llm=llm, messages=messages, responses=responses)
    finally:
        llm.stop()
        messages.close()
        responses.close()


@pytest.fixture(scope="module")
def gw(upstream, tmp_path_factory):
    saved = {k: os.environ.get(k) for k in PROVIDER_KEYS}
    os.environ.update(PROVIDER_KEYS)
    costs = {"input_cost_per_token": IN_COST, "output_cost_per_token": OUT_COST}
    config = G.GatewayConfig(
        models=[
            G.GatewayModel(
                name="fake-chat",
                litellm_model="openai/fake",
                api_base=upstream.llm.base_url,
                api_key_env="SAASBENCH_TEST_PROVIDER_KEY",
                **costs,
            ),
            G.GatewayModel(
                name="claude-sonnet-4-5",
                litellm_model="anthropic/claude-sonnet-4-5",
                api_base=upstream.messages.base_url,
                api_key_env="SAASBENCH_TEST_ANTHROPIC_KEY",
                **costs,
            ),
            G.GatewayModel(
                name="gpt-5",
                litellm_model="openai/gpt-5",
                api_base=upstream.responses.base_url,
                api_key_env="SAASBENCH_TEST_OPENAI_KEY",
                **costs,
            ),
        ],
        backoff_min_s=MIN_S,
        backoff_max_s=MAX_S,
        workdir=str(tmp_path_factory.mktemp("gateway")),
    )
    gateway = G.Gateway(config)
    t0 = time.monotonic()
    try:
        gateway.start()
        print(
            f"\ngateway: litellm proxy healthy after {time.monotonic() - t0:.1f}s (pid {gateway.pid})", file=sys.stderr
        )
        yield gateway
    finally:
        pid = gateway.pid
        gateway.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if pid is not None:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # stopped (and reaped) by close()


def chat(gateway_url: str, key: str, model: str = "fake-chat", **body) -> httpx.Response:
    return httpx.post(
        f"{gateway_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], **body},
        timeout=60,
    )


def new_requests(llm: FakeLLM, since: int) -> list:
    return llm.chat_requests[since:]


# --- configuration (no proxy) ------------------------------------------------------------------------------
def test_defaults_are_five_retries_between_10_and_60_seconds() -> None:
    config = G.GatewayConfig(models={"gpt-5": {"litellm_model": "openai/gpt-5", "api_key_env": "OPENAI_API_KEY"}})
    assert (config.num_retries, config.backoff_min_s, config.backoff_max_s) == (5, 10.0, 60.0)
    assert (G.DEFAULT_BACKOFF_MIN_S, G.DEFAULT_BACKOFF_MAX_S) == (10.0, 60.0)
    proxy = config.proxy_config()
    assert proxy["router_settings"]["num_retries"] == 5
    assert proxy["litellm_settings"]["telemetry"] is False
    # the config names the key's variable, never a key
    assert proxy["model_list"] == [
        {"model_name": "gpt-5", "litellm_params": {"model": "openai/gpt-5", "api_key": "os.environ/OPENAI_API_KEY"}}
    ]
    assert proxy["general_settings"]["master_key"].startswith("os.environ/")
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        G.GatewayModel(name="m", litellm_model="openai/m", api_key_env="sk-live-123")
    with pytest.raises(ValueError, match="never inline"):
        G.GatewayModel(name="m", litellm_model="openai/m", params={"api_key": "sk-live-123"})
    with pytest.raises(ValueError, match="backoff_max_s"):
        G.GatewayConfig(models=[G.GatewayModel(name="m", litellm_model="openai/m")], backoff_min_s=5, backoff_max_s=1)


def test_virtual_keys_name_the_trial_and_cannot_be_forged() -> None:
    secret = b"a" * 64
    key = G.make_key(secret, "timetrack.codex.gpt-5.0", "s1")
    assert G.key_trial(secret, key) == ("timetrack.codex.gpt-5.0", "s1")
    mac = key.rpartition(".")[2]
    other = G.make_key(secret, "other.trial", "s1")
    forged = other.rpartition(".")[0] + "." + mac  # another trial's payload with this key's signature
    assert G.key_trial(secret, forged) is None
    assert G.key_trial(b"b" * 64, key) is None
    assert G.key_trial(secret, "sk-provider-real-key") is None


def test_sweep_spec_takes_a_gateway_and_keeps_key_names_only() -> None:
    from saasbench.lake.records import sweep_row
    from saasbench.runs.sweep import SweepSpec

    spec = SweepSpec.load(
        {
            "sweep_id": "gw1",
            "tasks": ["timetrack"],
            "agents": ["codex"],
            "models": ["gpt-5"],
            "gateway": {"models": {"gpt-5": {"litellm_model": "openai/gpt-5", "api_key_env": "OPENAI_API_KEY"}}},
        }
    )
    assert isinstance(spec.gateway, G.GatewayConfig) and spec.gateway.models[0].name == "gpt-5"
    config = json.loads(sweep_row("gw1", config=spec.model_dump())["config_json"])
    assert config["gateway"]["models"][0]["api_key_env"] == "OPENAI_API_KEY"


# --- calls through the proxy ------------------------------------------------------------------------------------
def test_a_call_is_counted_with_tokens_exact_cost_and_latency(gw, upstream) -> None:
    access = gw.for_trial("tt.builtin.fake-chat.0")
    n0 = len(upstream.llm.chat_requests)
    upstream.llm.queue(Reply.text("hello from upstream", usage={"prompt_tokens": 123, "completion_tokens": 45}))
    t0 = time.time()
    r = chat(gw.url, access.api_key)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello from upstream"
    sent = new_requests(upstream.llm, n0)
    assert len(sent) == 1
    # the provider key is used by the proxy; the agent's key never leaves the gateway
    assert sent[0].headers["authorization"] == "Bearer " + PROVIDER_KEYS["SAASBENCH_TEST_PROVIDER_KEY"]
    assert access.api_key not in json.dumps(sent[0].headers)
    calls = access.calls()
    assert len(calls) == 1
    c = calls[0]
    assert (c.trial_id, c.status, c.model_group, c.provider_model) == (
        "tt.builtin.fake-chat.0",
        "success",
        "fake-chat",
        "openai/fake",
    )
    assert (c.prompt_tokens, c.completion_tokens, c.attempts) == (123, 45, 1)
    assert c.cost_usd == pytest.approx(123 * IN_COST + 45 * OUT_COST, abs=1e-12)
    assert c.api_base == upstream.llm.base_url and c.call_type == "acompletion"
    assert c.latency_ms is not None and c.latency_ms > 0
    assert t0 - 1 <= c.started_at.timestamp() <= c.ended_at.timestamp() <= time.time() + 1
    assert gw.calls("some.other.trial") == []


def test_a_streamed_call_is_counted(gw, upstream) -> None:
    access = gw.for_trial("tt.builtin.fake-chat.stream")
    upstream.llm.queue(Reply.text("one two three", usage={"prompt_tokens": 10, "completion_tokens": 3}))
    r = chat(gw.url, access.api_key, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and "data: [DONE]" in r.text
    (c,) = access.calls()
    assert c.status == "success" and c.stream is True and (c.prompt_tokens, c.completion_tokens) == (10, 3)
    assert c.cost_usd == pytest.approx(10 * IN_COST + 3 * OUT_COST, abs=1e-12)


def test_an_unknown_key_is_refused_before_any_provider_call(gw, upstream) -> None:
    n0 = len(upstream.llm.chat_requests)
    for key in (PROVIDER_KEYS["SAASBENCH_TEST_PROVIDER_KEY"], "sk-sbgw-dGVzdHxz.0000", "nonsense"):
        r = chat(gw.url, key)
        assert r.status_code == 401, r.text
    assert new_requests(upstream.llm, n0) == []


@pytest.mark.parametrize("burst", ["429", "529", "drop"])
def test_a_transient_burst_of_three_is_retried_with_backoff(gw, upstream, burst: str) -> None:
    fail = {"429": Reply.error(429, "rate limited"), "529": Reply.error(529, "Overloaded"), "drop": Reply.drop()}[burst]
    access = gw.for_trial(f"tt.builtin.fake-chat.burst-{burst}")
    n0 = len(upstream.llm.chat_requests)
    upstream.llm.queue(fail, fail, fail, Reply.text("made it", usage={"prompt_tokens": 7, "completion_tokens": 2}))
    r = chat(gw.url, access.api_key)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "made it"
    sent = new_requests(upstream.llm, n0)
    assert len(sent) == 4
    # waits between attempts: at least MIN_S * 2**i, capped at MAX_S (lower bounds only)
    gaps = [b.at - a.at for a, b in itertools.pairwise(sent)]
    for i, gap in enumerate(gaps):
        assert gap >= min(MAX_S, MIN_S * 2**i) - 0.002, (i, gaps)
    (c,) = access.calls()
    assert c.status == "success" and c.attempts == 4 and len(c.retried_errors) == 3
    assert c.retry_wait_s == [pytest.approx(0.05), pytest.approx(0.1), pytest.approx(0.2)]
    assert (c.prompt_tokens, c.completion_tokens) == (7, 2)


def test_six_failures_exhaust_the_five_retries_and_are_a_failed_call(gw, upstream) -> None:
    access = gw.for_trial("tt.builtin.fake-chat.exhaust")
    n0 = len(upstream.llm.chat_requests)
    upstream.llm.queue(*[Reply.error(429, "still limited")] * 6, Reply.text("too late"))
    t0 = time.monotonic()
    r = chat(gw.url, access.api_key)
    elapsed = time.monotonic() - t0
    assert r.status_code == 429, r.text
    assert len(new_requests(upstream.llm, n0)) == 6
    assert upstream.llm.pending() == 1  # the success after the sixth failure was never asked for
    upstream.llm._queue.clear()
    assert elapsed >= MIN_S + 2 * MIN_S + 3 * MAX_S  # 0.05 + 0.1 + 0.2 + 0.2 + 0.2 waited
    (c,) = access.calls()
    assert (c.status, c.error_class, c.http_status, c.attempts) == ("failure", "RateLimitError", 429, 6)
    assert c.retry_wait_s == [pytest.approx(w) for w in (0.05, 0.1, 0.2, 0.2, 0.2)]
    assert "still limited" in (c.error or "") and c.prompt_tokens == 0 and c.cost_usd == 0


def test_a_bad_request_is_not_retried(gw, upstream) -> None:
    access = gw.for_trial("tt.builtin.fake-chat.400")
    n0 = len(upstream.llm.chat_requests)
    upstream.llm.queue(Reply.error(400, "bad field"), Reply.text("never"))
    r = chat(gw.url, access.api_key)
    assert r.status_code == 400
    assert len(new_requests(upstream.llm, n0)) == 1
    upstream.llm._queue.clear()
    (c,) = access.calls()
    assert (c.status, c.error_class, c.attempts) == ("failure", "BadRequestError", 1)


def test_a_relay_on_another_address_reaches_the_gateway(gw, upstream) -> None:
    """A Docker trial's agent reaches the proxy through a relay on the trial network's gateway address;
    127.0.0.2 (another loopback address) stands in for it."""
    access = gw.for_trial("tt.codex.fake-chat.relay")
    env = SimpleNamespace(kind="docker", runs_on_host=False, gateway_ip="127.0.0.2", receiver_bind_host="127.0.0.2")
    upstream.llm.queue(Reply.text("via relay", usage={"prompt_tokens": 5, "completion_tokens": 2}))
    with access.open(env) as endpoint:
        assert endpoint.root_url.startswith("http://127.0.0.2:") and endpoint.api_key == access.api_key
        assert endpoint.openai_base_url == endpoint.root_url + "/v1"
        r = chat(endpoint.root_url, access.api_key)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "via relay"
        assert endpoint.relay is not None and endpoint.relay.connections >= 1
        url = endpoint.root_url
        assert access.agent_env("codex", endpoint)["OPENAI_BASE_URL"] == url + "/v1"
    with pytest.raises(httpx.ConnectError):
        chat(url, access.api_key)  # the relay lives as long as the rollout
    (c,) = access.calls()
    assert c.status == "success" and c.prompt_tokens == 5
    with pytest.raises(G.GatewayError, match="gateway_ip"):
        access.open(SimpleNamespace(kind="docker", runs_on_host=False, gateway_ip=None, receiver_bind_host=None))


# --- agents ----------------------------------------------------------------------------------------------------
def test_builtin_agent_runs_through_the_gateway_and_its_calls_are_counted(gw, upstream, monkeypatch) -> None:
    for name, value in PROVIDER_KEYS.items():  # as a careless host would have them
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OPENAI_API_KEY", PROVIDER_KEYS["SAASBENCH_TEST_OPENAI_KEY"])

    def responder(request) -> Reply:
        if any(m.get("role") == "tool" for m in request.messages):
            return Reply.with_message(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "finish", "arguments": '{"summary": "done"}'},
                        }
                    ],
                },
                finish_reason="tool_calls",
                usage={"prompt_tokens": 200, "completion_tokens": 10},
            )
        args = json.dumps({"command": "env > env_seen.txt; echo built > out.txt"})
        return Reply.with_message(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": args}}],
            },
            finish_reason="tool_calls",
            usage={"prompt_tokens": 100, "completion_tokens": 20},
        )

    agent = gw.attach(
        BuiltinAgent(model="fake-chat", backoff_base_s=0.01, backoff_cap_s=0.01), "tt.builtin.fake-chat.agent"
    )
    n0 = len(upstream.llm.chat_requests)
    upstream.llm.responder = responder
    try:
        with LocalEnvironment() as env:
            traj = agent.run("Build it.", env, Budget(steps=5, wall_s=60))
            out = env.read_file("out.txt")
            seen = env.read_file("env_seen.txt").decode()
    finally:
        upstream.llm.responder = None
    assert traj.exit_reason == "completed", traj.error
    assert out == b"built\n"
    sent = new_requests(upstream.llm, n0)
    assert len(sent) == 2 and all(r.body["model"] == "fake" for r in sent)
    assert all(r.headers["authorization"] == "Bearer " + PROVIDER_KEYS["SAASBENCH_TEST_PROVIDER_KEY"] for r in sent)
    for secret in PROVIDER_KEYS.values():
        assert secret not in seen and secret not in traj.model_dump_json()
    calls = agent.gateway.calls()
    assert [c.status for c in calls] == ["success", "success"]
    assert [(c.prompt_tokens, c.completion_tokens) for c in calls] == [(100, 20), (200, 10)]
    assert (traj.tokens_in, traj.tokens_out) == (300, 30)
    assert sum(c.cost_usd for c in calls) == pytest.approx(300 * IN_COST + 30 * OUT_COST, abs=1e-12)


@pytest.mark.parametrize("fmt", ["claude", "codex", "openhands"])
def test_cli_agents_get_the_gateway_and_a_virtual_key_never_a_provider_key(gw, tmp_path, monkeypatch, fmt) -> None:
    for name, value in PROVIDER_KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEYS["SAASBENCH_TEST_ANTHROPIC_KEY"])
    monkeypatch.setenv("OPENAI_API_KEY", PROVIDER_KEYS["SAASBENCH_TEST_OPENAI_KEY"])
    monkeypatch.setenv(
        "SAASBENCH_AGENT_API_KEY", PROVIDER_KEYS["SAASBENCH_TEST_OPENAI_KEY"]
    )  # a misconfigured fallback
    cls, key_var, url_var = {
        "claude": (ClaudeCodeAgent, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
        "codex": (CodexAgent, "OPENAI_API_KEY", "OPENAI_BASE_URL"),
        "openhands": (OpenHandsAgent, "LLM_API_KEY", "LLM_BASE_URL"),
    }[fmt]
    bin_dir = standin(tmp_path, fmt, sample(fmt))
    kwargs = {"venv": None} if fmt == "openhands" else {}
    agent = gw.attach(
        cls(model="gpt-5", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a", **kwargs), f"tt.{fmt}.gpt-5.env"
    )
    with LocalEnvironment(share=[tmp_path]) as env:  # the stand-in writes its dump next to itself
        traj = agent.run("p", env, Budget(wall_s=60))
    assert traj.exit_reason == "completed", traj.error
    seen = json.loads((bin_dir / "dump.json").read_text())["env"]
    want_url = gw.url if fmt == "claude" else gw.url + "/v1"
    assert seen[key_var] == agent.gateway.api_key and seen[url_var] == want_url
    assert G.key_trial(gw._secret, seen[key_var]) == (f"tt.{fmt}.gpt-5.env", agent.gateway.session)
    leaked = [k for k, v in seen.items() if any(s in v for s in PROVIDER_KEYS.values())]
    assert leaked == []
    expected = agent.gateway.agent_env({"claude": "claude-code"}.get(fmt, fmt))
    assert {k: seen[k] for k in expected} == expected


class _ContainerLikeEnvironment(LocalEnvironment):
    """A local environment that claims to be a container on a trial network whose host side is 127.0.0.2."""

    kind = "container-like"
    runs_on_host = False
    gateway_ip = "127.0.0.2"

    def __init__(self, *args, **kwargs):  # the test reads the "container's" /tmp on the host: no sandbox
        super().__init__(*args, sandbox=False, **kwargs)


def test_a_cli_agent_in_a_container_gets_a_relay_for_the_rollout(gw, upstream, tmp_path) -> None:
    bin_dir = standin(tmp_path, "codex", sample("codex"))
    agent = gw.attach(
        CodexAgent(model="gpt-5", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a"), "tt.codex.gpt-5.box"
    )
    with _ContainerLikeEnvironment() as env:
        traj = agent.run("p", env, Budget(wall_s=60))
    seen = json.loads((bin_dir / "dump.json").read_text())["env"]
    try:
        config = Path(seen["CODEX_HOME"], "config.toml").read_text()
    finally:
        shutil.rmtree(Path(seen["CODEX_HOME"]).parent, ignore_errors=True)
    assert traj.exit_reason == "completed", traj.error
    url = seen["OPENAI_BASE_URL"]
    assert (
        url.startswith("http://127.0.0.2:") and url.endswith("/v1") and seen["OPENAI_API_KEY"] == agent.gateway.api_key
    )
    assert f'base_url = "{url}"' in config and agent.gateway.api_key not in config
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.removesuffix("/v1") + "/health/liveliness", timeout=5)  # the relay ended with the rollout


def test_agent_env_of_every_agent_holds_only_the_virtual_key(gw) -> None:
    for name in ("builtin", "claude-code", "codex", "openhands", "my.module:Agent"):
        env = gw.agent_env(name, "tt.x.fake-chat.0", model="fake-chat")
        keys = [v for v in env.values() if v.startswith(G.KEY_PREFIX)]
        assert keys and all(G.key_trial(gw._secret, k)[0] == "tt.x.fake-chat.0" for k in keys)
        assert not any(s in v for v in env.values() for s in PROVIDER_KEYS.values())
        assert gw.master_key not in env.values()
    builtin = gw.agent_env("builtin", "tt.x.fake-chat.0", model="fake-chat")
    assert (
        builtin["SAASBENCH_AGENT_API_BASE"] == gw.url + "/v1" and builtin["SAASBENCH_AGENT_MODEL"] == "openai/fake-chat"
    )
    assert builtin["SAASBENCH_AGENT_API_KEY_ENV"] == "SAASBENCH_GATEWAY_KEY"
    assert gw.agent_env("claude-code", "t")["ANTHROPIC_BASE_URL"] == gw.url


def test_real_claude_code_cli_through_the_gateway(gw, upstream, tmp_path) -> None:
    exe = _claude_bin()
    if exe is None:
        pytest.fail("Claude Code CLI not installed (scripts/test.sh installs it; or set SAASBENCH_CLAUDE_BIN)")
    n0 = len(upstream.messages.requests)
    agent = gw.attach(
        ClaudeCodeAgent(model="claude-sonnet-4-5", bin_dir=str(Path(exe).parent), artefacts_dir=tmp_path / "a"),
        "tt.claude-code.claude-sonnet-4-5.0",
    )
    with LocalEnvironment() as env:
        traj = agent.run("Create claude_gw.txt containing via-gateway.", env, Budget(wall_s=180))
        target = Path(env.workspace_path) / "claude_gw.txt"
        made = target.read_bytes() if target.exists() else None
    stderr = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-2000:]
    assert traj.exit_reason == "completed", (traj.error, stderr)
    assert made == b"via-gateway\n"
    posts = [r for r in upstream.messages.requests[n0:] if r["path"].startswith("/v1/messages")]
    assert len(posts) >= 2
    assert all(r["headers"].get("x-api-key") == PROVIDER_KEYS["SAASBENCH_TEST_ANTHROPIC_KEY"] for r in posts)
    calls = agent.gateway.calls()
    assert len(calls) == len(posts) and all(c.status == "success" for c in calls)
    assert {c.model_group for c in calls} == {"claude-sonnet-4-5"}
    assert all(c.provider_model == "anthropic/claude-sonnet-4-5" for c in calls)
    assert all((c.prompt_tokens, c.completion_tokens) == (100, 20) for c in calls)
    assert sum(c.cost_usd for c in calls) == pytest.approx(len(calls) * (100 * IN_COST + 20 * OUT_COST), abs=1e-12)
    assert agent.gateway.api_key not in traj.model_dump_json()


def test_real_codex_cli_through_the_gateway(gw, upstream, tmp_path) -> None:
    exe = _codex_bin()
    if exe is None:
        pytest.fail("Codex CLI not installed (scripts/test.sh installs it; or set SAASBENCH_CODEX_BIN)")
    n0 = len(upstream.responses.requests)
    agent = gw.attach(
        CodexAgent(model="gpt-5", bin_dir=str(Path(exe).parent), artefacts_dir=tmp_path / "a"), "tt.codex.gpt-5.0"
    )
    with LocalEnvironment() as env:
        traj = agent.run("Create codex_gw.txt containing via-gateway.", env, Budget(wall_s=180))
        target = Path(env.workspace_path) / "codex_gw.txt"
        made = target.read_bytes() if target.exists() else None
    stderr = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-2000:]
    assert traj.exit_reason == "completed", (traj.error, stderr)
    assert made == b"via-gateway\n"
    posts = [r for r in upstream.responses.requests[n0:] if r["path"].endswith("/responses")]
    assert len(posts) == 2
    assert all(
        r["headers"].get("authorization") == "Bearer " + PROVIDER_KEYS["SAASBENCH_TEST_OPENAI_KEY"] for r in posts
    )
    calls = agent.gateway.calls()
    assert len(calls) == 2 and all(c.status == "success" and c.model_group == "gpt-5" for c in calls)
    assert [(c.prompt_tokens, c.completion_tokens) for c in calls] == [(120, 30), (120, 30)]
    assert sum(c.cost_usd for c in calls) == pytest.approx(2 * (120 * IN_COST + 30 * OUT_COST), abs=1e-12)


# --- the lake ---------------------------------------------------------------------------------------------------
def test_calls_land_in_the_lake_model_calls_table(gw, upstream, tmp_path) -> None:
    from saasbench import lake as lakelib
    from saasbench.lake.records import TrialInfo, trial_rows

    access = gw.for_trial("tt.builtin.fake-chat.lake")
    upstream.llm.queue(
        Reply.text("a", usage={"prompt_tokens": 11, "completion_tokens": 3}),
        Reply.error(529, "Overloaded"),
        Reply.text("b", usage={"prompt_tokens": 13, "completion_tokens": 4}),
        Reply.error(401, "bad provider key"),
    )
    assert chat(gw.url, access.api_key).status_code == 200
    assert chat(gw.url, access.api_key).status_code == 200
    assert chat(gw.url, access.api_key).status_code == 401
    calls = access.calls()
    store = lakelib.lake_from_uri(str(tmp_path / "lake"))
    info = TrialInfo(
        sweep_id="sw-gw", trial_id="tt.builtin.fake-chat.lake", task_id="timetrack", agent="builtin", model="fake-chat"
    )
    lakelib.write_trial(store, trial_rows(info, model_calls=calls))
    rows = lakelib.query(
        store,
        "SELECT trial_id, call_index, status, tokens_in, tokens_out, cost_usd, attempts, "
        "retry_wait_s, retried_errors, error_class, http_status, latency_ms, model_group "
        "FROM model_calls WHERE sweep_id = ? ORDER BY call_index",
        ["sw-gw"],
    ).to_pylist()
    assert [(r["call_index"], r["status"], r["tokens_in"], r["tokens_out"], r["attempts"]) for r in rows] == [
        (0, "success", 11, 3, 1),
        (1, "success", 13, 4, 2),
        (2, "failure", 0, 0, 1),
    ]
    assert rows[0]["cost_usd"] == pytest.approx(11 * IN_COST + 3 * OUT_COST, abs=1e-12)
    assert rows[1]["retried_errors"] == ["APIError"] and rows[1]["retry_wait_s"] == pytest.approx(MIN_S)
    assert (rows[2]["error_class"], rows[2]["http_status"]) == ("AuthenticationError", 401)
    assert all(r["trial_id"] == "tt.builtin.fake-chat.lake" and r["model_group"] == "fake-chat" for r in rows)
    assert all(r["latency_ms"] > 0 for r in rows)
    total = lakelib.query(store, "SELECT sum(cost_usd) AS c FROM model_calls").to_pylist()[0]["c"]
    assert total == pytest.approx((11 + 13) * IN_COST + (3 + 4) * OUT_COST, abs=1e-12)


def test_a_failed_start_is_reported_and_leaves_no_process(tmp_path, monkeypatch) -> None:
    """A missing provider key or an unusable address is refused before anything starts; a proxy that dies
    during startup is reported with its log."""
    config = G.GatewayConfig(
        models=[G.GatewayModel(name="m", litellm_model="openai/m", api_key_env="SAASBENCH_TEST_SURELY_UNSET_KEY")],
        workdir=str(tmp_path / "w"),
    )
    with pytest.raises(G.GatewayError, match="SAASBENCH_TEST_SURELY_UNSET_KEY"):
        G.Gateway(config).start()
    unroutable = G.GatewayConfig(
        models=[G.GatewayModel(name="m", litellm_model="openai/m")], workdir=str(tmp_path / "w2"), host="203.0.113.1"
    )  # not an address of this machine
    with pytest.raises(G.GatewayError, match="cannot bind"):
        G.Gateway(unroutable).start()
    monkeypatch.setattr(
        G, "litellm_command", lambda: [sys.executable, "-c", "import sys; print('proxy boom'); sys.exit(3)"]
    )
    gateway = G.Gateway(
        G.GatewayConfig(models=[G.GatewayModel(name="m", litellm_model="openai/m")], workdir=str(tmp_path / "w3"))
    )
    with pytest.raises(G.GatewayError, match="exited 3") as err:
        gateway.start()
    assert "proxy boom" in str(err.value) and gateway.pid is None
    # what was written for the proxy holds no secret
    written = (tmp_path / "w3" / "cfg.yaml").read_text()
    assert gateway.master_key not in written and "os.environ/SAASBENCH_GATEWAY_MASTER_KEY" in written


def test_a_sweep_trial_through_the_gateway_commits_its_model_calls(gw, upstream, tmp_path) -> None:
    """saasbench.runs.sweep.run_trial with the gateway: the built-in agent (model fake-chat) writes the timetrack
    reference through scripted turns; the trial and one model_calls row per turn land in the lake."""
    from saasbench import lake as lakelib
    from saasbench.runs import sweep as sw

    ref = Path(__file__).resolve().parents[1] / "tasks" / "timetrack" / "reference"
    files = sorted(p for p in ref.rglob("*") if p.is_file() and "__pycache__" not in p.parts and "data" not in p.parts)

    def turn(i: int, name: str, args: dict) -> Reply:
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

    turns = [
        turn(i, "write_file", {"path": p.relative_to(ref).as_posix(), "content": p.read_text(encoding="utf-8")})
        for i, p in enumerate(files)
    ]
    turns.append(turn(len(files), "finish", {"summary": "done"}))
    upstream.llm.queue(*turns)
    spec = sw.SweepSpec.model_validate(
        {
            "sweep_id": "gw-sweep",
            "tasks": ["timetrack"],
            "agents": ["builtin"],
            "models": ["fake-chat"],
            "lake": str(tmp_path / "lake"),
            "report_dir": str(tmp_path / "reports"),
            "retry_delays": [0],
        }
    )
    trial = sw.plan(spec)[0]
    try:
        outcome = sw.run_trial(trial, spec, gateway=gw)
    finally:
        left = upstream.llm.pending()
        upstream.llm._queue.clear()
    assert outcome == "completed" and left == 0
    lake = str(tmp_path / "lake")
    (row,) = lakelib.query(
        lake, "SELECT trial_id, tokens_in, tokens_out, deterministic_score FROM trials WHERE sweep_id = 'gw-sweep'"
    ).to_pylist()
    assert row["trial_id"] == trial.trial_id and row["deterministic_score"] > 50
    calls = lakelib.query(
        lake,
        "SELECT call_index, status, model_group, tokens_in, tokens_out, cost_usd "
        "FROM model_calls WHERE trial_id = ? ORDER BY call_index",
        [trial.trial_id],
    ).to_pylist()
    assert len(calls) == len(turns) and all(c["status"] == "success" and c["model_group"] == "fake-chat" for c in calls)
    assert [c["tokens_in"] for c in calls] == [50 + i for i in range(len(turns))]
    assert (
        sum(c["tokens_in"] for c in calls) == row["tokens_in"]
        and sum(c["tokens_out"] for c in calls) == row["tokens_out"]
    )
    assert sum(c["cost_usd"] for c in calls) == pytest.approx(
        sum(50 + i for i in range(len(turns))) * IN_COST + 5 * len(turns) * OUT_COST, abs=1e-12
    )
