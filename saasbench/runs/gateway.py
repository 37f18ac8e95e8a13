"""The model gateway: one LiteLLM proxy per sweep between the agents and the model providers.

Agents never hold a provider key. A :class:`Gateway` starts ``litellm --config <cfg.yaml>`` as a
subprocess on ``host:port`` (127.0.0.1 and a free port by default) whose environment holds the
provider keys named by the configuration (``api_key_env``: the config file says
``os.environ/NAME``, never the key), and hands each trial a *virtual key*. The proxy serves the
OpenAI (``/v1/chat/completions``, ``/v1/responses``) and Anthropic (``/v1/messages``) protocols
for any provider litellm knows, so Claude Code, Codex, OpenHands and the built-in agent all talk to
the same endpoint.

Virtual keys. ``sk-sbgw-<base64url(trial_id|session)>.<hmac>``: the proxy runs a custom auth
function (``general_settings.custom_auth``) that checks the HMAC with a per-gateway secret and
authenticates the request as ``user_id = trial_id``; no database, no key table. Other keys get
401. The litellm master key (random, per gateway) is accepted too but never given to an agent.
Choice: a key per trial (rather than a custom header such as ``x-saasbench-trial``) because every
agent CLI already sends a key and none has to learn a header; a trial cannot pass as another
trial without that trial's key.

Counting. A ``CustomLogger`` (``litellm_settings.callbacks``) appends JSON lines to
``<workdir>/calls.jsonl``: the success of each request (model group, provider model, api_base,
call type, prompt/completion tokens, ``response_cost`` from the configured per-token prices or
litellm's offline cost map, start/end time, trial and session from the key), the failure of an
attempt, the final failure of a request (``async_post_call_failure_hook``: after the retries) and
each retry (wait, error class). :meth:`Gateway.calls` folds them into one :class:`ModelCall` per
request (``status`` success/failure, ``attempts``, ``retry_wait_s``), and
:func:`saasbench.lake.records.model_call_rows` turns those into rows of the lake's
``model_calls`` table.

Retries. The proxy's router retries a failed attempt ``num_retries`` (5) times. Which errors: the
router's own rule in litellm 1.110.2 (verified against a fake server): HTTP 408, 409, 429, 403
and every 5xx including 529 (overloaded), dropped connections / resets and unparseable replies;
never 400, 401, 404, 413, 422. How long: litellm's router computes ``0.5 s * 2**n`` plus jitter,
capped at 8 s, in its compiled core, with no setting to raise the cap, so the hooks module
replaces each retry sleep (``PythonHost.sleep`` inside ``RustCore._run_steps``) by
``min(backoff_max_s, backoff_min_s * 2**n)`` -- 10, 20, 40, 60, 60 s by default -- or the
provider's ``Retry-After`` when that is longer, still capped at ``backoff_max_s``. The gateway
refuses to start when that patch cannot be installed (a litellm upgrade that moved the
internals), rather than silently retrying on litellm's schedule. A retry happens before any byte
of the answer reached the agent; a stream that breaks after it started is not retried.

Reachability from containers. The proxy binds ``config.host`` (127.0.0.1). An agent whose commands
do not run on this host (``Environment.runs_on_host`` false: a Docker trial) cannot reach the host's
loopback: :meth:`TrialGateway.open` then starts a small TCP relay on the host's address as the
trial's containers reach it (``Environment.gateway_ip``, the host side of the trial's bridge) to
the proxy, for the duration of the rollout, and gives the agent that URL. Alternatively set
``host`` to an address containers can reach (e.g. the default bridge's ``172.17.0.1``; ``0.0.0.0``
exposes it on every interface: every request still needs a valid key) and ``advertise_host`` to
the address agents should use.

    with Gateway(GatewayConfig(models=[GatewayModel(name="gpt-5", litellm_model="openai/gpt-5",
                                                    api_key_env="OPENAI_API_KEY")])) as gw:
        agent = gw.attach(get_agent("codex", model="gpt-5"), trial_id)
        ...  # agent.run(...)
        calls = gw.calls(trial_id)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saasbench import settings
from saasbench.failures import EnvError
from saasbench.services.net import pump

if TYPE_CHECKING:
    from saasbench.agents.base import Agent
    from saasbench.environments.base import Environment

__all__ = [
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_BACKOFF_MIN_S",
    "Gateway",
    "GatewayConfig",
    "GatewayEndpoint",
    "GatewayError",
    "GatewayModel",
    "ModelCall",
    "TcpRelay",
    "TrialGateway",
    "agent_env_for",
    "key_trial",
]

DEFAULT_BACKOFF_MIN_S = 10.0
DEFAULT_BACKOFF_MAX_S = 60.0
KEY_PREFIX = "sk-sbgw-"
HOOKS_MODULE = "saasbench_gateway_hooks"
DEFAULT_BASES = {
    "chat": "https://api.openai.com/v1",
    "responses": "https://api.openai.com/v1",
    "openai": "https://api.openai.com/v1",
    "messages": "https://api.anthropic.com",
    "anthropic": "https://api.anthropic.com",
}
TAPPABLE_PROVIDERS = ("openai", "anthropic", "hosted_vllm", "custom_openai", "lm_studio", "llamafile")
LLM_ROUTES = ("/chat/completions", "/completions", "/messages", "/responses", "/embeddings")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# host variables the proxy process inherits (besides the provider keys the config names)
PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


class GatewayError(EnvError):
    """The gateway could not start or answer: infrastructure, so an ``env_error`` (retryable) for a trial."""


# --- configuration -------------------------------------------------------------------------------------
class GatewayModel(BaseModel):
    """One model the agents may ask for, and how the proxy reaches it.

    The simple form names the API the provider speaks and the gateway bridges every client to it::

        GatewayModel(name="smollm2", api="chat", model="SmolLM2-135M-Instruct", api_base="http://127.0.0.1:8080/v1")

    ``api``: ``chat`` (an OpenAI-compatible server with Chat Completions only: llama.cpp, vLLM, Ollama,
    LM Studio...), ``responses`` (OpenAI's Responses API), ``messages`` (Anthropic's Messages API).
    Otherwise ``litellm_model`` gives any litellm provider/model (Bedrock, Vertex...)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The model name agents send (the sweep's model string, e.g. claude-sonnet-4-5)")
    api: Literal["chat", "responses", "messages"] | None = Field(
        None, description="The API the provider speaks: chat | responses | messages (instead of litellm_model)"
    )
    model: str | None = Field(None, description="With api: the provider's model id (default: name)")
    litellm_model: str | None = Field(
        None, description="litellm's provider/model, e.g. bedrock/anthropic.claude-3-5-sonnet (instead of api)"
    )
    api_base: str | None = Field(None, description="Provider base URL (default: the provider's public one)")
    api_key_env: str | None = Field(None, description="NAME of the host variable holding the provider key")
    input_cost_per_token: float | None = Field(None, ge=0, description="USD per prompt token (overrides the cost map)")
    output_cost_per_token: float | None = Field(None, ge=0, description="USD per completion token")
    aliases: list[str] = Field(
        default_factory=list,
        description="More names served by the same deployment (e.g. the small/fast model Claude Code asks for)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Other litellm_params")
    stream_usage: Literal["auto", "native", "buffer"] = Field(
        "auto",
        description="api: chat only. A provider that sends no usage on streamed answers (llama-cpp-python) is "
        "asked for whole answers, which the tap streams to the client with the provider's usage: buffer "
        "always, auto after the first stream without usage (that call is an estimate), native never",
    )

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError("api_key_env is the NAME of an environment variable, not a key")
        return v

    @field_validator("params")
    @classmethod
    def _no_inline_key(cls, v: dict[str, Any]) -> dict[str, Any]:
        key = v.get("api_key")
        if key is not None and not (isinstance(key, str) and key.startswith("os.environ/")):
            raise ValueError("give provider keys with api_key_env (a variable name), never inline")
        return v

    @model_validator(mode="after")
    def _one_route(self) -> GatewayModel:
        if (self.api is None) == (self.litellm_model is None):
            raise ValueError(f"model {self.name!r}: give exactly one of api (chat|responses|messages) or litellm_model")
        if self.model is not None and self.api is None:
            raise ValueError(f"model {self.name!r}: model goes with api; with litellm_model name the provider there")
        return self

    @property
    def provider_model(self) -> str:
        """litellm's provider/model: the ``api`` form picks the litellm route that bridges every client to it
        (Chat Completions forced for ``chat``, ``openai/responses/`` for ``responses``, ``anthropic/`` for
        ``messages``; table in docs/gateway.md)."""
        if self.litellm_model is not None:
            return self.litellm_model
        upstream = self.model or self.name
        return {"chat": "openai/", "responses": "openai/responses/", "messages": "anthropic/"}[
            self.api or "chat"
        ] + upstream

    def tap_target(self) -> tuple[str, str | None] | None:
        """(base URL, api) of the provider when the gateway's tap can sit in front of it (an HTTP base it
        knows), else None: the call goes straight from litellm to the provider."""
        provider = self.provider_model.split("/", 1)[0]
        base = self.api_base or DEFAULT_BASES.get(self.api or provider)
        if base is None or (
            self.litellm_model is not None and provider not in TAPPABLE_PROVIDERS and not self.api_base
        ):
            return None
        return base, self.api

    def litellm_params(self, api_base: str | None = None) -> dict[str, Any]:
        """The deployment's litellm_params; ``api_base`` replaces the provider's (the tap's URL for it)."""
        params: dict[str, Any] = {"model": self.provider_model, **self.params}
        if self.api == "chat":
            params.setdefault("use_chat_completions_api", True)  # Messages/Responses clients bridge to chat
        if api_base or self.api_base:
            params["api_base"] = api_base or self.api_base
        if self.api_key_env:
            params["api_key"] = f"os.environ/{self.api_key_env}"
        elif self.api is not None and (api_base or self.api_base):
            params["api_key"] = "sk-none"  # a local server without keys: litellm's clients still want one
        if self.input_cost_per_token is not None:
            params["input_cost_per_token"] = self.input_cost_per_token
        if self.output_cost_per_token is not None:
            params["output_cost_per_token"] = self.output_cost_per_token
        return params


class GatewayConfig(BaseModel):
    """One sweep's gateway. ``models`` may also be given as a mapping ``name -> GatewayModel fields``."""

    model_config = ConfigDict(extra="forbid")

    models: list[GatewayModel] = Field(min_length=1)
    host: str = Field("127.0.0.1", description="Address the proxy binds")
    port: int | None = Field(None, ge=1, le=65535, description="Port (default: a free one)")
    advertise_host: str | None = Field(None, description="Address agents use when it is not `host` (no relay then)")
    num_retries: int = Field(5, ge=0, description="Retries of a transient failure per request")
    backoff_min_s: float = Field(DEFAULT_BACKOFF_MIN_S, gt=0, description="First retry wait")
    backoff_max_s: float = Field(DEFAULT_BACKOFF_MAX_S, gt=0, description="Longest retry wait")
    request_timeout_s: float = Field(600.0, gt=0, description="Timeout of one upstream attempt")
    startup_timeout_s: float = Field(180.0, gt=0, description="How long to wait for /health/liveliness")
    stall_timeout_s: float = Field(
        300.0, gt=0, description="A provider silent this long (no byte) is cut off: a model outage, retried"
    )
    tap: bool = Field(
        True, description="Relay provider traffic through the upstream tap (shapes, usage, stalls); off: direct"
    )
    workdir: str | None = Field(
        None, description="Folder for cfg.yaml, hooks, calls.jsonl, proxy.log (default: a fresh temporary folder)"
    )

    @model_validator(mode="before")
    @classmethod
    def _models_mapping(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("models"), Mapping):
            data = dict(data)
            data["models"] = [{"name": k, **(v or {})} for k, v in data["models"].items()]
        return data

    @model_validator(mode="after")
    def _check(self) -> GatewayConfig:
        if self.backoff_max_s < self.backoff_min_s:
            raise ValueError("backoff_max_s must be >= backoff_min_s")
        names = [n for m in self.models for n in (m.name, *m.aliases)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names served twice: {', '.join(dupes)}")
        return self

    def proxy_config(self, tap_urls: Mapping[int, str] | None = None) -> dict[str, Any]:
        """The LiteLLM proxy's config.yaml (no secrets: keys are ``os.environ/NAME`` references).
        ``tap_urls``: model index -> the upstream tap's URL standing in for that model's provider."""
        tap_urls = tap_urls or {}
        model_list = [
            {"model_name": name, "litellm_params": m.litellm_params(tap_urls.get(i))}
            for i, m in enumerate(self.models)
            for name in (m.name, *m.aliases)
        ]
        return {
            "model_list": model_list,
            "litellm_settings": {
                "telemetry": False,
                "callbacks": f"{HOOKS_MODULE}.logger",
                "turn_off_message_logging": True,
                "drop_params": True,
                "request_timeout": self.request_timeout_s,
            },
            "router_settings": {
                "num_retries": self.num_retries,
                "disable_cooldowns": True,
                "timeout": self.request_timeout_s,
            },
            "general_settings": {
                "master_key": "os.environ/SAASBENCH_GATEWAY_MASTER_KEY",
                "custom_auth": f"{HOOKS_MODULE}.user_api_key_auth",
            },
        }


# --- what is counted -------------------------------------------------------------------------------------
class ModelCall(BaseModel):
    """One request an agent made through the gateway (its retries folded in)."""

    trial_id: str | None
    session: str | None = None
    call_id: str
    model_group: str | None = Field(None, description="The model name the agent asked for")
    provider_model: str | None = Field(None, description="litellm's provider/model that served it")
    api_base: str | None = None
    call_type: str | None = None
    stream: bool | None = None
    status: Literal["success", "failure"]
    error_class: str | None = None
    error: str | None = None
    http_status: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_source: Literal["upstream", "estimate", "proxy"] = Field(
        "proxy",
        description="upstream: the provider's own usage, read by the tap; estimate: the provider reported none "
        "(litellm counted the text); proxy: untapped, litellm's figure",
    )
    cost_usd: float = 0.0
    upstream_errors: list[str] = Field(
        default_factory=list, description="What the tap saw go wrong per failed attempt (stalled, unreachable)"
    )
    started_at: datetime | None = None
    ended_at: datetime | None = None
    latency_ms: float | None = None
    attempts: int = 1
    retry_wait_s: list[float] = Field(default_factory=list)
    retried_errors: list[str] = Field(default_factory=list)


def _ts(value: Any) -> datetime | None:
    return datetime.fromtimestamp(float(value), tz=UTC) if isinstance(value, (int, float)) else None


def fold_calls(lines: list[dict[str, Any]]) -> list[ModelCall]:
    """One :class:`ModelCall` per request from the hooks' JSON lines, in order of first appearance."""
    order: list[str] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        cid = line.get("call_id")
        if line.get("kind") not in ("success", "attempt_failure", "final_failure", "retry") or not cid:
            continue
        if cid not in groups:
            order.append(cid)
            groups[cid] = []
        groups[cid].append(line)
    out = []
    for cid in order:
        evs = groups[cid]
        retries = [e for e in evs if e["kind"] == "retry"]
        success = next((e for e in evs if e["kind"] == "success"), None)
        failures = [e for e in evs if e["kind"] in ("attempt_failure", "final_failure")]
        if success is None and not failures:
            continue  # only retries so far: the request is still in flight
        first = next((e for e in evs if e["kind"] != "retry"), evs[0])
        base = success or first
        final = success or next((e for e in reversed(failures) if e["kind"] == "final_failure"), failures[-1])
        starts = [e["start"] for e in evs if isinstance(e.get("start"), (int, float))]
        ends = [e["end"] for e in evs if isinstance(e.get("end"), (int, float))]
        start, end = (min(starts) if starts else None), (max(ends) if ends else None)
        order_of_trust = (final, base, *evs)

        def pick(key: str, among: tuple[dict[str, Any], ...] = order_of_trust) -> Any:
            return next((e.get(key) for e in among if e.get(key) is not None), None)

        out.append(
            ModelCall(
                trial_id=pick("trial_id"),
                session=pick("session"),
                call_id=cid,
                model_group=pick("model_group"),
                provider_model=pick("model"),
                api_base=pick("api_base"),
                call_type=pick("call_type"),
                stream=pick("stream"),
                status="success" if success is not None else "failure",
                error_class=None if success is not None else pick("error_class"),
                error=None if success is not None else pick("error"),
                http_status=None if success is not None else pick("http_status"),
                prompt_tokens=int((success or {}).get("prompt_tokens") or 0),
                completion_tokens=int((success or {}).get("completion_tokens") or 0),
                cost_usd=float((success or {}).get("response_cost") or 0.0),
                started_at=_ts(start),
                ended_at=_ts(end),
                latency_ms=round((end - start) * 1000, 3) if start is not None and end is not None else None,
                attempts=len(retries) + 1,
                retry_wait_s=[float(r.get("wait_s") or 0.0) for r in retries],
                retried_errors=[str(r.get("error_class") or "") for r in retries],
            )
        )
    return out


# --- keys ------------------------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_key(secret: bytes, trial_id: str, session: str) -> str:
    payload = _b64(f"{trial_id}|{session}".encode())
    mac = hmac.new(secret, payload.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{KEY_PREFIX}{payload}.{mac}"


def key_trial(secret: bytes, key: str) -> tuple[str, str] | None:
    """(trial_id, session) of a valid virtual key, else None. Mirrored in the hooks module."""
    if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or "." not in key:
        return None
    payload, _, mac = key[len(KEY_PREFIX) :].rpartition(".")
    want = hmac.new(secret, payload.encode(), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(mac, want):
        return None
    try:
        trial, _, session = _unb64(payload).decode().rpartition("|")
    except ValueError:
        return None
    return trial, session


# --- the module the proxy loads: auth, counting, backoff ---------------------------------------------------------
# LiteLLM loads hooks by file path next to its config: this shim imports the real module
# (saasbench/runs/gateway_hooks.py) into the proxy process, from the same saasbench the harness runs.
HOOKS_SHIM = (
    "# written by saasbench.runs.gateway\nimport sys\nsys.path.insert(0, {root!r})\n"
    "from saasbench.runs.gateway_hooks import *  # noqa: E402,F403\n"
)


# --- agents -----------------------------------------------------------------------------------------------------
def agent_env_for(agent_name: str, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
    """The variables an agent process needs to reach the gateway at ``root_url`` with ``key``: what the
    agent's class says (:meth:`saasbench.agents.base.Agent.gateway_env`; ``agent_name`` is a registered
    name or a ``module:Class`` path). E.g. ``claude-code``: ``ANTHROPIC_BASE_URL`` (no ``/v1``: the CLI
    appends ``/v1/messages``) and ``ANTHROPIC_API_KEY``; ``codex``: ``OPENAI_BASE_URL`` (``/v1``) and
    ``OPENAI_API_KEY``; an agent that says nothing, or that cannot be found, gets both the OpenAI and
    the Anthropic pair. Never a provider key."""
    from saasbench.agents.base import Agent, AgentNotFound, agent_class

    try:
        cls = agent_class(agent_name)
    except AgentNotFound:
        cls = Agent
    return cls.gateway_env(root_url.rstrip("/"), key, model)


class GatewayEndpoint:
    """Where one agent reaches the gateway: a URL (the proxy, or a relay into a trial network) and a key."""

    def __init__(self, root_url: str, api_key: str, relay: TcpRelay | None = None):
        self.root_url = root_url.rstrip("/")
        self.api_key = api_key
        self.relay = relay

    @property
    def openai_base_url(self) -> str:
        return self.root_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.root_url

    def base_url(self, api: str) -> str:
        """``api`` ``openai`` (``.../v1``) or ``anthropic`` (the root: clients append ``/v1/messages``)."""
        return self.anthropic_base_url if api == "anthropic" else self.openai_base_url

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None

    def __enter__(self) -> GatewayEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrialGateway:
    """One trial's (one attempt's) access to the gateway: its virtual key and its calls."""

    def __init__(self, gateway: Gateway, trial_id: str, session: str, key: str):
        self.gateway, self.trial_id, self.session, self.api_key = gateway, trial_id, session, key

    @property
    def openai_base_url(self) -> str:
        """The gateway as seen from the host (the built-in agent calls from the harness process)."""
        return self.gateway.url + "/v1"

    def open(self, env: Environment | None = None) -> GatewayEndpoint:
        """The endpoint for an agent running in ``env``: the proxy's own URL when the agent runs on this
        host (:attr:`Environment.runs_on_host`) or with ``advertise_host``, else a relay on the host's
        address as the environment's containers reach it (:attr:`Environment.gateway_ip`). Close it
        after the rollout (it is a context manager)."""
        gw = self.gateway
        if env is None or env.runs_on_host:
            return GatewayEndpoint(gw.advertised_url, self.api_key)
        if gw.config.advertise_host:
            return GatewayEndpoint(gw.advertised_url, self.api_key)
        host = env.gateway_ip or env.receiver_bind_host
        if not host:
            raise GatewayError(
                f"environment {env!r} has no host-side address (gateway_ip) for the model gateway relay; "
                "set GatewayConfig.host/advertise_host to an address its containers reach"
            )
        relay = TcpRelay(host, 0, gw.config.host if gw.config.host not in ("0.0.0.0", "::") else "127.0.0.1", gw.port)
        return GatewayEndpoint(f"http://{relay.host}:{relay.port}", self.api_key, relay.start())

    def agent_env(
        self, agent_name: str, endpoint: GatewayEndpoint | None = None, model: str | None = None
    ) -> dict[str, str]:
        """:func:`agent_env_for` this trial's key, at ``endpoint`` (from :meth:`open`, e.g. a relay into a
        Docker trial's network) or else the gateway's own (advertised) URL."""
        root = endpoint.root_url if endpoint is not None else self.gateway.advertised_url
        return agent_env_for(agent_name, root, self.api_key, model)

    def calls(self, settle_timeout_s: float = 10.0) -> list[ModelCall]:
        return self.gateway.calls(self.trial_id, session=self.session, settle_timeout_s=settle_timeout_s)


# --- the gateway ---------------------------------------------------------------------------------------------
def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
        return s.getsockname()[1]


def litellm_command() -> list[str]:
    """The proxy's command: the ``litellm`` script next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / "litellm"
    if here.is_file():
        return [str(here)]
    found = shutil.which("litellm")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from litellm_cli.main import proxy_server; sys.exit(proxy_server())"]


class Gateway:
    """The LiteLLM proxy subprocess of one sweep. A context manager; :meth:`close` stops it by PID."""

    def __init__(self, config: GatewayConfig | Mapping[str, Any], *, keep_workdir: bool = False):
        """``keep_workdir``: keep the temporary work folder (calls.jsonl, proxy.log) after :meth:`close`;
        a ``config.workdir`` is always kept."""
        self.config = config if isinstance(config, GatewayConfig) else GatewayConfig.model_validate(dict(config))
        self.keep_workdir = keep_workdir
        self.master_key = "sk-" + secrets.token_hex(32)
        self._secret = secrets.token_hex(32).encode()  # the hooks module reads the same bytes
        self._own_workdir = self.config.workdir is None
        self.workdir = Path(self.config.workdir or tempfile.mkdtemp(prefix="saasbench-gateway-"))
        self.calls_path = self.workdir / "calls.jsonl"
        self.log_path = self.workdir / "proxy.log"
        self.config_path = self.workdir / "cfg.yaml"
        self.port = self.config.port or 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.tap: Any = None  # saasbench.runs.upstream.UpstreamTap once started
        self._tapped: set[str] = set()  # model names whose provider traffic goes through the tap
        self._tap_bases: dict[str, str] = {}  # the tap's URL for a provider -> the provider's base URL
        self.startup_s: float | None = None
        self._log_fh: Any = None

    # --- lifecycle ------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def upstream_log(self) -> Path:
        return self.workdir / "upstream.jsonl"

    def _start_tap(self) -> dict[int, str]:
        """Start the upstream tap for every model whose provider it can front; model index -> tap URL."""
        from saasbench.runs.upstream import UpstreamTap, UpstreamTarget

        if not self.config.tap:
            return {}
        fronted = [(i, t) for i, m in enumerate(self.config.models) if (t := m.tap_target()) is not None]
        if not fronted:
            return {}
        targets = [
            UpstreamTarget(base, api, self.config.models[i].stream_usage)  # type: ignore[arg-type]
            for i, (base, api) in fronted
        ]
        self._tapped = {n for i, _ in fronted for n in (self.config.models[i].name, *self.config.models[i].aliases)}
        self.tap = UpstreamTap(targets, self.upstream_log, stall_timeout_s=self.config.stall_timeout_s).start()
        self._tap_bases = {self.tap.url_for(k): base for k, (_, (base, _)) in enumerate(fronted)}
        return {i: self.tap.url_for(k) for k, (i, _) in enumerate(fronted)}

    @property
    def url(self) -> str:
        """The proxy as the host reaches it."""
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def advertised_url(self) -> str:
        return f"http://{self.config.advertise_host}:{self.port}" if self.config.advertise_host else self.url

    def proxy_env(self) -> dict[str, str]:
        """The proxy process's environment: a few host variables, the named provider keys, the gateway's own."""
        env = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
        missing = []
        for m in self.config.models:
            if m.api_key_env:
                if os.environ.get(m.api_key_env):
                    env[m.api_key_env] = os.environ[m.api_key_env]
                else:
                    missing.append(m.api_key_env)
        if missing:
            raise GatewayError(f"provider key variable(s) unset: {', '.join(sorted(set(missing)))}")
        env.update(
            {
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no cost-map download
                "LITELLM_LOG": settings.get("SAASBENCH_GATEWAY_LOG_LEVEL") or "ERROR",
                "SAASBENCH_GATEWAY_CALLS": str(self.calls_path),
                "SAASBENCH_GATEWAY_SECRET": self._secret.decode(),
                "SAASBENCH_GATEWAY_MASTER_KEY": self.master_key,
                "SAASBENCH_GATEWAY_BACKOFF_MIN_S": repr(self.config.backoff_min_s),
                "SAASBENCH_GATEWAY_BACKOFF_MAX_S": repr(self.config.backoff_max_s),
                "SAASBENCH_GATEWAY_NUM_RETRIES": str(self.config.num_retries),
                "PYTHONUNBUFFERED": "1",
            }
        )
        from saasbench.environments.leftovers import OWNER_TAG, owner_tag

        env[OWNER_TAG] = owner_tag()  # `saasbench env prune` reaps a proxy whose harness was killed
        return env

    def start(self) -> Gateway:
        if self.proc is not None:
            return self
        import httpx

        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            tap_urls = self._start_tap()
        except OSError as exc:
            self.close()
            raise GatewayError(f"cannot start the gateway's upstream tap: {exc}") from exc
        self.config_path.write_text(
            yaml.safe_dump(self.config.proxy_config(tap_urls), sort_keys=False), encoding="utf-8"
        )
        (self.workdir / f"{HOOKS_MODULE}.py").write_text(
            HOOKS_SHIM.format(root=str(Path(__file__).resolve().parents[2])), encoding="utf-8"
        )
        self.calls_path.touch()
        env = self.proxy_env()
        if not self.port:
            try:
                self.port = _free_port(self.config.host)
            except OSError as exc:
                raise GatewayError(f"cannot bind the gateway to {self.config.host}: {exc}") from exc
        cmd = [
            *litellm_command(),
            "--config",
            str(self.config_path),
            "--host",
            self.config.host,
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = t0 + self.config.startup_timeout_s
        try:
            with httpx.Client(timeout=2.0, trust_env=False) as client:
                while True:
                    if self.proc.poll() is not None:
                        raise GatewayError(
                            f"litellm proxy exited {self.proc.returncode} during startup:\n{self.log_tail()}"
                        )
                    try:
                        if client.get(self.url + "/health/liveliness").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise GatewayError(
                            f"litellm proxy not healthy after {self.config.startup_timeout_s:g}s:\n{self.log_tail()}"
                        )
                    time.sleep(0.2)
            loaded = [x for x in self._lines() if x.get("kind") == "hooks_loaded"]
            if not loaded or not all(x.get("backoff_patched") for x in loaded):
                why = loaded[-1].get("error") if loaded else "the hooks module was not loaded"
                raise GatewayError(
                    f"the gateway's retry backoff could not be installed in litellm ({why}); refusing to "
                    "run with litellm's own 0.5-8 s schedule"
                )
        except BaseException:
            self.close()
            raise
        self.startup_s = round(time.monotonic() - t0, 3)
        return self

    def close(self) -> None:
        """Stop the proxy (SIGTERM to its process group, SIGKILL after 10 s). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        if self.tap is not None:
            self.tap.close()
            self.tap = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- trials ------------------------------------------------------------------------------------------
    def key_for(self, trial_id: str, session: str | None = None) -> str:
        """The virtual key of ``trial_id`` (a new session unless one is given)."""
        return make_key(self._secret, trial_id, session or secrets.token_hex(4))

    def for_trial(self, trial_id: str) -> TrialGateway:
        """A new session of ``trial_id``: its own key, so a retried trial's calls are told apart."""
        session = secrets.token_hex(4)
        return TrialGateway(self, trial_id, session, make_key(self._secret, trial_id, session))

    def agent_env(self, agent_name: str, trial_id: str, model: str | None = None) -> dict[str, str]:
        """The environment variables that point ``agent_name`` (running on this host) at this gateway for
        ``trial_id`` (a new session). For an agent in a container use ``for_trial(...).open(env)`` and
        ``TrialGateway.agent_env(name, endpoint)``."""
        return self.for_trial(trial_id).agent_env(agent_name, model=model)

    def attach(self, agent: Agent, trial_id: str | TrialGateway) -> Agent:
        """Point ``agent`` at the gateway: the adapters then use its URL and the trial's key in ``run``."""
        access = trial_id if isinstance(trial_id, TrialGateway) else self.for_trial(trial_id)
        agent.gateway = access  # type: ignore[attr-defined]
        return agent

    # --- counting ---------------------------------------------------------------------------------------
    def _lines(self) -> list[dict[str, Any]]:
        try:
            raw = self.calls_path.read_bytes()
        except OSError:
            return []
        out = []
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def calls(
        self, trial_id: str | None = None, *, session: str | None = None, settle_timeout_s: float = 10.0
    ) -> list[ModelCall]:
        """The requests of ``trial_id`` (and ``session``), one :class:`ModelCall` each, in order.

        Waits (at most ``settle_timeout_s``) until every request the proxy authenticated for it has
        its outcome logged: litellm logs a success after the answer (a stream: after its last chunk).
        A request still without an outcome then (a client that hung up mid-stream) is returned as a
        failure if one of its attempts failed, and left out otherwise."""
        deadline = time.monotonic() + settle_timeout_s
        while True:
            lines = self._lines()
            mine = [
                x
                for x in lines
                if (trial_id is None or x.get("trial_id") == trial_id)
                and (session is None or x.get("session") in (session, None))
            ]
            folded = [
                c
                for c in fold_calls(mine)
                if (trial_id is None or c.trial_id == trial_id) and (session is None or c.session in (session, None))
            ]
            requests = sum(
                1 for x in mine if x.get("kind") == "request" and (session is None or x.get("session") == session)
            )
            # a request is over once its success or its final failure (after the retries) is logged
            over = {x.get("call_id") for x in mine if x.get("kind") in ("success", "final_failure")}
            if len(over) >= requests or time.monotonic() >= deadline:
                return self._with_upstream_usage(folded, deadline)
            time.sleep(0.05)

    def _with_upstream_usage(self, calls: list[ModelCall], deadline: float) -> list[ModelCall]:
        """Each call's tokens as its provider counted them (the tap's records), cost re-priced on them.
        The tap writes its record as the stream ends, just after litellm may have logged the success:
        wait (until ``deadline``) for the record of every successful call to a tapped model."""
        from saasbench.runs.upstream import read_lines

        while True:
            by_call: dict[str, list[dict[str, Any]]] = {}
            for line in read_lines(self.upstream_log):
                if line.get("call_id"):
                    by_call.setdefault(str(line["call_id"]), []).append(line)
            waiting = [
                c
                for c in calls
                if c.status == "success"
                and c.model_group in self._tapped
                and not any(isinstance(x.get("status"), int) and x["status"] < 400 for x in by_call.get(c.call_id, []))
            ]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        out = []
        for call in calls:
            if call.api_base:  # the provider's URL, not the tap's
                base = call.api_base.rstrip("/")
                for tap_url, real in self._tap_bases.items():
                    if base == tap_url or base.startswith(tap_url + "/"):
                        call = call.model_copy(update={"api_base": real.rstrip("/") + base[len(tap_url) :]})
                        break
            seen = by_call.get(call.call_id)
            if not seen:
                out.append(call)
                continue
            errors = [str(x["error"]) for x in seen if x.get("error")]
            ok = [x for x in seen if isinstance(x.get("status"), int) and x["status"] < 400 and not x.get("error")]
            update: dict[str, Any] = {"upstream_errors": errors}
            if call.status == "success" and ok:
                last = ok[-1]
                if last.get("usage_reported"):
                    prompt, completion = int(last.get("prompt_tokens") or 0), int(last.get("completion_tokens") or 0)
                    if (prompt, completion) != (call.prompt_tokens, call.completion_tokens):
                        update["cost_usd"] = self._price(call, prompt, completion)
                    update.update(prompt_tokens=prompt, completion_tokens=completion, usage_source="upstream")
                else:  # the provider reported none: the tap's count of the text, flagged
                    prompt = int(last.get("estimated_prompt_tokens") or call.prompt_tokens)
                    completion = int(last.get("estimated_completion_tokens") or call.completion_tokens)
                    if (prompt, completion) != (call.prompt_tokens, call.completion_tokens):
                        update["cost_usd"] = self._price(call, prompt, completion)
                    update.update(prompt_tokens=prompt, completion_tokens=completion, usage_source="estimate")
            out.append(call.model_copy(update=update))
        return out

    def _price(self, call: ModelCall, prompt: int, completion: int) -> float:
        """The call's cost on the provider's token counts: the configured prices, else litellm's cost map,
        else litellm's figure scaled by the token ratio."""
        model = next((m for m in self.config.models if call.model_group in (m.name, *m.aliases)), None)
        if model is not None and model.input_cost_per_token is not None and model.output_cost_per_token is not None:
            return prompt * model.input_cost_per_token + completion * model.output_cost_per_token
        try:
            import litellm

            p, c = litellm.cost_per_token(
                model=call.provider_model or "", prompt_tokens=prompt, completion_tokens=completion
            )
            return float(p + c)
        except Exception:  # noqa: BLE001 - a model the offline cost map does not know
            total = call.prompt_tokens + call.completion_tokens
            return call.cost_usd * (prompt + completion) / total if total else call.cost_usd


# --- a TCP relay: containers reach the proxy through the trial network's gateway address ---------------------
class TcpRelay:
    """Accepts on ``host:port`` and pipes every connection to ``target_host:target_port``."""

    def __init__(self, host: str, port: int, target_host: str, target_port: int):
        self.host, self.target = host, (target_host, target_port)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TcpRelay:
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name=f"gateway-relay-{self.port}", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            self.connections += 1
            with self._lock:
                self._conns.update((client, upstream))
            done = [0]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst, client, upstream, done), daemon=True).start()

    def _pipe(
        self, src: socket.socket, dst: socket.socket, client: socket.socket, upstream: socket.socket, done: list[int]
    ) -> None:
        pump(src, dst)
        with self._lock:
            done[0] += 1
            last = done[0] == 2
            if last:
                self._conns.difference_update((client, upstream))
        if last:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
