"""The ``builtin`` agent: a small tool-using loop on ``litellm.completion``.

Any litellm model string works (``anthropic/claude-...``, or ``openai/<name>`` with an
OpenAI-compatible ``api_base``); temperature 0. The model gets five tools, all run through the
:class:`~saasbench.environments.local.Environment` (so they are confined to the workspace):

- ``shell(command, timeout?)``  -> ``env.exec`` (``bash -c`` in the workspace);
- ``read_file(path)``, ``write_file(path, content)``, ``edit_file(path, old, new)`` (``old``
  must occur exactly once);
- ``finish(summary)``           -> ends the rollout (exit_reason ``completed``).

What the model sees of a tool's output is capped at ``output_limit`` characters (16 KB by
default; head and tail kept, the middle replaced by a marker); the environment's own caps
(1 MiB per stream, 100 MiB per file) apply underneath.

Budgets (:class:`~saasbench.agents.base.Budget`): one step is one model turn; the loop stops
with ``agent_budget_exceeded`` when ``budget.steps`` turns are used up without ``finish``, and
with ``agent_timeout`` when the wall clock runs out (the system prompt tells the model its
deadline; model calls are given at most the remaining time). Each shell call is bounded by
``budget.tool_call_s`` (and the remaining wall clock); a timed-out command is reported to the
model, not fatal. The evaluation runs on whatever state the workspace is left in.

Transient model errors (HTTP 408/409/425/429/5xx incl. 529, timeouts, connection resets and
dropped connections) are retried up to ``retries`` (5) times with exponential backoff
``backoff_base_s * 2**i`` capped at ``backoff_cap_s`` (10 s and 60 s by default, the paper's
Appendix B.1; a larger ``Retry-After`` wins, still capped); through the model gateway the agent
does not retry (the gateway did). A transient error that outlives its retries, or whose backoff
would outlast the wall clock, ends the rollout with ``model_error``: the model upstream failed, an
infrastructure outcome the harness retries with a fresh rollout (:mod:`saasbench.runs.outages`). A
non-transient error (400, 401, 403, 404, 413, 422: the request or the configuration) ends it with
``agent_error``; a wall clock that runs out during a model call with ``agent_timeout``.

A reply without tool calls is answered with a nudge (use the tools, call ``finish``); after
``max_idle_turns`` such replies in a row the rollout ends ``completed``.

Every model call and tool call is a trajectory event: ``message`` (the system prompt and the
task prompt, capped), ``model_call`` (content capped, the tool
calls asked for, tokens in/out from ``usage``, latency, attempts), ``retry``, ``tool_call``
(tool, arguments capped) and ``tool_result`` (result excerpt, exit code, latency). Totals
(steps, tokens, cost from litellm's offline cost map when it knows the model) are on the
:class:`Trajectory`. The API key is read from the environment variable NAMED by
``api_key_env`` at call time and never written to events (it is also redacted from any text
that is recorded).

Configuration: constructor keywords (``saasbench.runs.trial.resolve_agent`` passes the trial's
``--model``), else these environment variables:

===================================  ==========================================================
``SAASBENCH_AGENT_MODEL``            litellm model string (required)
``SAASBENCH_AGENT_API_BASE``         OpenAI-compatible base URL (optional)
``SAASBENCH_AGENT_API_KEY_ENV``      NAME of the variable holding the API key (optional; with an
                                     api_base and no name a dummy key is sent, without one
                                     litellm's provider default variable is used)
``SAASBENCH_AGENT_BACKOFF_BASE_S``   first retry wait (default 10)
``SAASBENCH_AGENT_BACKOFF_CAP_S``    longest retry wait (default 60)
``SAASBENCH_AGENT_MAX_TOKENS``       max tokens per model reply (default 8192)
===================================  ==========================================================
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saasbench.agents.base import Agent, Budget, Trajectory, register_agent
from saasbench.redaction import redact_text

if TYPE_CHECKING:
    from saasbench.environments.local import Environment

ENV_MODEL = "SAASBENCH_AGENT_MODEL"
ENV_API_BASE = "SAASBENCH_AGENT_API_BASE"
ENV_API_KEY_ENV = "SAASBENCH_AGENT_API_KEY_ENV"
ENV_BACKOFF_BASE = "SAASBENCH_AGENT_BACKOFF_BASE_S"
ENV_BACKOFF_CAP = "SAASBENCH_AGENT_BACKOFF_CAP_S"
ENV_MAX_TOKENS = "SAASBENCH_AGENT_MAX_TOKENS"

OUTPUT_LIMIT = 16 * 1024  # characters of a tool result the model sees
EVENT_TEXT_LIMIT = 4000  # characters of model content / tool results kept in events
EVENT_ARG_LIMIT = 16 * 1024  # characters of one tool argument kept in events (file contents)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a bash command in the workspace (the working directory). Returns the exit code, stdout and "
            "stderr (long output is truncated). Background processes are killed when the command returns.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The bash command"},
                    "timeout": {
                        "type": "number",
                        "description": "Seconds before the command is killed (capped by the harness)",
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the workspace (path relative to it). Long files are truncated.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or replace a workspace file with the given content (parent folders are created).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace the text `old` (which must occur exactly once) by `new` in a workspace file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Declare the task done. The harness then starts the app with its start command and evaluates it.",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
        },
    },
]

NUDGE = (
    "You replied without calling a tool. Continue the task with the tools (shell, read_file, write_file, "
    "edit_file); call finish(summary) when the application is complete."
)


class _Stop(Exception):
    """Ends the loop: ``reason`` is the trajectory's exit_reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: head and tail kept, a marker in between."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters truncated ...]\n"
    head = max(0, (limit * 2) // 3)
    tail = max(0, limit - head)
    return text[:head] + marker + (text[-tail:] if tail else "")


@register_agent("builtin")
class BuiltinAgent(Agent):
    """A tool-using loop on litellm (shell, read/write/edit file, finish) for any model, with budgets."""

    version = "1"
    #: A :class:`saasbench.runs.gateway.TrialGateway` (set by ``Gateway.attach``): then every call goes to the
    #: gateway's OpenAI-compatible ``/v1`` as ``openai/<model>`` with the trial's virtual key, and the
    #: agent does not retry itself (the gateway retried already).
    gateway: Any = None
    # the anti-cheat scanner reads these tools' commands and written files (agents/anticheat.py)
    shell_tools = frozenset({"shell"})
    file_tools = {"write_file": "write", "edit_file": "edit"}

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        """The gateway's OpenAI-compatible ``/v1``, the key in a variable the agent is told the name of
        (never the key itself in a setting), and the model as ``openai/<model>``."""
        env = {ENV_API_BASE: root_url + "/v1", ENV_API_KEY_ENV: "SAASBENCH_GATEWAY_KEY", "SAASBENCH_GATEWAY_KEY": key}
        if model:
            env[ENV_MODEL] = f"openai/{model}"
        return env

    def __init__(
        self,
        model: str | None = None,
        *,
        api_base: str | None = None,
        api_key_env: str | None = None,
        retries: int = 5,
        backoff_base_s: float | None = None,
        backoff_cap_s: float | None = None,
        max_tokens: int | None = None,
        request_timeout_s: float = 600.0,
        output_limit: int = OUTPUT_LIMIT,
        max_idle_turns: int = 2,
        completion: Callable[..., Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.model = model or os.environ.get(ENV_MODEL) or None
        self.api_base = api_base or os.environ.get(ENV_API_BASE) or None
        self.api_key_env = api_key_env or os.environ.get(ENV_API_KEY_ENV) or None
        if self.api_key_env is not None and not _ENV_NAME_RE.match(self.api_key_env):
            raise ValueError("api_key_env must be the NAME of an environment variable, not a key")
        self.retries = max(0, int(retries))
        self.backoff_base_s = backoff_base_s if backoff_base_s is not None else _env_float(ENV_BACKOFF_BASE, 10.0)
        self.backoff_cap_s = backoff_cap_s if backoff_cap_s is not None else _env_float(ENV_BACKOFF_CAP, 60.0)
        self.max_tokens = int(max_tokens if max_tokens is not None else _env_float(ENV_MAX_TOKENS, 8192))
        self.request_timeout_s = request_timeout_s
        self.output_limit = output_limit
        self.max_idle_turns = max_idle_turns
        self._completion = completion
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"BuiltinAgent(model={self.model!r}, api_base={self.api_base!r}, api_key_env={self.api_key_env!r})"

    # --- the loop -------------------------------------------------------------------------------------
    def system_prompt(self, env: Environment, budget: Budget, deadline_utc: _dt.datetime) -> str:
        return (
            "You are an autonomous software engineer working in a sandboxed workspace at "
            f"{env.workspace_path}. Use the tools to inspect, write and run code there; every path is relative to the "
            "workspace. Work without asking questions: nobody will answer.\n"
            f"Budget: at most {budget.steps} turns; a wall-clock deadline of {deadline_utc.isoformat(timespec='seconds')} "
            f"(UTC, {budget.wall_s:g}s from the start); each shell command is killed after {budget.tool_call_s:g}s. "
            "When the deadline or the turn budget is reached you are stopped and the workspace is evaluated as it is.\n"
            "Long-running servers must not be left running from the shell tool (background processes are killed); "
            "the harness starts the application itself with its start command after you call finish.\n"
            "When the task is complete, call finish(summary)."
        )

    def run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        traj = self.new_trajectory(model=self.model)
        if not self.model:
            return traj.finish("agent_error", f"no model configured (give model= or set {ENV_MODEL})")
        secret = self._api_key()
        if isinstance(secret, _Stop):
            return traj.finish("agent_error", str(secret))
        deadline_utc = _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=budget.wall_s)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt(env, budget, deadline_utc)},
            {"role": "user", "content": prompt},
        ]
        traj.event("message", cap_text(messages[0]["content"], EVENT_TEXT_LIMIT), role="system")
        traj.event("message", redact_text(cap_text(prompt, EVENT_TEXT_LIMIT), secret), role="user")
        idle = 0
        try:
            while True:
                if traj.steps >= budget.steps:
                    raise _Stop(
                        "agent_budget_exceeded", f"step budget of {budget.steps} turn(s) used up without finish"
                    )
                if budget.wall_s - traj.elapsed() <= 0:
                    raise _Stop("agent_timeout", f"wall-clock budget of {budget.wall_s:g}s used up")
                traj.steps += 1
                message = self._model_turn(traj, messages, budget, secret)
                tool_calls = message.get("tool_calls") or []
                messages.append(message)
                if not tool_calls:
                    idle += 1
                    if idle > self.max_idle_turns:
                        traj.event("note", "the model stopped calling tools; rollout ends")
                        return traj.finish("completed")
                    messages.append({"role": "user", "content": NUDGE})
                    continue
                idle = 0
                finished = None
                for call in tool_calls:
                    result, done = self._run_tool(traj, env, budget, call, secret)
                    messages.append({"role": "tool", "tool_call_id": call.get("id") or "", "content": result})
                    if done is not None:
                        finished = done
                if finished is not None:
                    return traj.finish("completed")
        except _Stop as stop:
            return traj.finish(stop.reason, redact_text(str(stop), secret))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - an agent never raises for its own failures
            return traj.finish("agent_error", redact_text(f"{type(exc).__name__}: {exc}", secret)[:2000])

    # --- model calls ------------------------------------------------------------------------------------
    def _api_key(self) -> str | None | _Stop:
        if self.gateway is not None:
            return self.gateway.api_key
        name = self.api_key_env
        if name is None:
            return "no-key" if self.api_base else None
        value = os.environ.get(name, "")
        if not value.strip():
            return _Stop("agent_error", f"API key variable {name} is unset or empty")
        return value

    def _call_model(self) -> str | None:
        """The model string for litellm: through a gateway, its OpenAI-compatible provider and the model's name."""
        return f"openai/{self.model}" if self.gateway is not None else self.model

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = self.backoff_base_s * (2**attempt)
        if retry_after is not None and retry_after > wait:
            wait = retry_after
        return min(wait, self.backoff_cap_s)

    def _model_turn(
        self, traj: Trajectory, messages: list[dict[str, Any]], budget: Budget, secret: str | None
    ) -> dict[str, Any]:
        from saasbench.services.judge import _litellm, classify
        from saasbench.services.limits import llm_provider, llm_slot

        completion = self._completion or _litellm().completion
        attempts = 0
        t0 = time.perf_counter()
        while True:
            remaining = budget.wall_s - traj.elapsed()
            if remaining <= 0:
                raise _Stop("agent_timeout", f"wall-clock budget of {budget.wall_s:g}s used up during a model call")
            kwargs: dict[str, Any] = {
                "model": self._call_model(),
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "auto",
                "temperature": 0,
                "max_tokens": self.max_tokens,
                "timeout": min(self.request_timeout_s, remaining),
                "num_retries": 0,
                "max_retries": 0,
                "drop_params": True,
            }
            if self.gateway is not None:
                kwargs["api_base"] = self.gateway.openai_base_url
            elif self.api_base:
                kwargs["api_base"] = self.api_base
            if secret is not None:
                kwargs["api_key"] = secret
            attempts += 1
            try:
                with llm_slot(llm_provider(self.model)):  # LLM calls at once per provider (saasbench.services.limits)
                    response = completion(**kwargs)
            except Exception as exc:  # noqa: BLE001 - litellm maps provider errors onto openai-style exceptions
                err = classify(exc)
                text = redact_text(str(err), secret)
                if budget.wall_s - traj.elapsed() <= 0:
                    raise _Stop(
                        "agent_timeout", f"wall-clock budget of {budget.wall_s:g}s used up during a model call ({text})"
                    ) from None
                if not err.transient:
                    raise _Stop("agent_error", f"model call failed (not retried): {text}") from None
                if attempts > (0 if self.gateway is not None else self.retries):
                    # an outage, not the agent's doing: the harness reruns the rollout (saasbench.runs.outages)
                    raise _Stop(
                        "model_error", f"model upstream failed after {attempts} attempt(s) of this agent: {text}"
                    ) from None
                wait = self._backoff(attempts - 1, err.retry_after)
                traj.event("retry", text[:EVENT_TEXT_LIMIT], attempt=attempts, wait_s=round(wait, 3))
                if traj.elapsed() + wait >= budget.wall_s:
                    raise _Stop(
                        "model_error",
                        f"model upstream failed and the wall-clock budget of {budget.wall_s:g}s would run out "
                        f"while backing off ({text})",
                    ) from None
                self._sleep(wait)
                continue
            break
        latency_ms = round((time.perf_counter() - t0) * 1000, 3)
        message = _message_dict(response)
        usage = getattr(response, "usage", None)
        t_in = _int(getattr(usage, "prompt_tokens", None))
        t_out = _int(getattr(usage, "completion_tokens", None))
        traj.tokens_in += t_in
        traj.tokens_out += t_out
        cost = _cost(response)
        traj.cost_usd = round(traj.cost_usd + cost, 6)
        content = message.get("content") or ""
        asked = [{"tool": tc["function"]["name"], "id": tc.get("id")} for tc in message.get("tool_calls") or []]
        traj.event(
            "model_call",
            redact_text(cap_text(content, EVENT_TEXT_LIMIT), secret),
            role="assistant",
            step=traj.steps,
            tool_calls=asked,
            tokens_in=t_in,
            tokens_out=t_out,
            latency_ms=latency_ms,
            attempts=attempts,
            cost_usd=cost,
        )
        return message

    # --- tools ------------------------------------------------------------------------------------------
    def _run_tool(
        self, traj: Trajectory, env: Environment, budget: Budget, call: dict[str, Any], secret: str | None
    ) -> tuple[str, str | None]:
        """(text for the model, summary when the tool was finish)."""
        fn = call.get("function") or {}
        name = str(fn.get("name") or "")
        raw_args = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
            if not isinstance(args, dict):
                raise TypeError("arguments are not a JSON object")
        except (ValueError, TypeError) as exc:
            args = {}
            parse_error: str | None = f"error: the arguments of {name} are not valid JSON ({exc})"
        else:
            parse_error = None
        recorded = {
            k: redact_text(cap_text(str(v), EVENT_ARG_LIMIT), secret) if isinstance(v, str) else v
            for k, v in args.items()
        }
        message = (
            recorded.get("command", "")
            if name == "shell"
            else str(recorded.get("path", recorded.get("summary", "")))[:300]
        )
        traj.event("tool_call", str(message), tool=name, args=recorded, call_id=call.get("id"))
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        done = None
        if parse_error:
            text = parse_error
        else:
            try:
                text, extra, done = self._dispatch(name, args, env, budget, traj)
            except _Stop:
                raise
            except Exception as exc:  # noqa: BLE001 - tool failures go back to the model
                text = f"error: {type(exc).__name__}: {exc}"
        text = redact_text(cap_text(text, self.output_limit), secret)
        traj.event(
            "tool_result",
            cap_text(text, EVENT_TEXT_LIMIT),
            tool=name,
            call_id=call.get("id"),
            latency_ms=round((time.perf_counter() - t0) * 1000, 3),
            **extra,
        )
        return text, done

    def _dispatch(
        self, name: str, args: dict[str, Any], env: Environment, budget: Budget, traj: Trajectory
    ) -> tuple[str, dict[str, Any], str | None]:
        if name == "shell":
            command = str(args.get("command") or "")
            if not command.strip():
                return "error: empty command", {}, None
            limit = budget.tool_call_s
            asked = args.get("timeout")
            if isinstance(asked, (int, float)) and asked > 0:
                limit = min(limit, float(asked))
            remaining = budget.wall_s - traj.elapsed()
            if remaining <= 0:
                raise _Stop("agent_timeout", f"wall-clock budget of {budget.wall_s:g}s used up")
            timeout = max(0.01, min(limit, remaining))
            result = env.exec(command, timeout_s=timeout)
            parts = [
                f"exit code: {result.exit_code}" + (f" (timed out after {timeout:g}s)" if result.timed_out else "")
            ]
            if result.stdout:
                parts.append("stdout:\n" + result.stdout)
            if result.stderr:
                parts.append("stderr:\n" + result.stderr)
            if result.truncated:
                parts.append("(output over 1 MiB was cut by the environment)")
            return "\n".join(parts), {"exit_code": result.exit_code, "timed_out": result.timed_out}, None
        if name == "read_file":
            data = env.read_file(str(args.get("path") or ""), limit=self.output_limit * 4 + 1)
            return data.decode("utf-8", errors="replace"), {}, None
        if name == "write_file":
            path, content = str(args.get("path") or ""), args.get("content")
            if not isinstance(content, str):
                return "error: content must be a string", {}, None
            mode = 0o755 if content.startswith("#!") else None
            env.write_file(path, content, mode=mode)
            return f"wrote {len(content.encode('utf-8'))} bytes to {path}", {}, None
        if name == "edit_file":
            path = str(args.get("path") or "")
            old, new = args.get("old"), args.get("new")
            if not isinstance(old, str) or not isinstance(new, str) or not old:
                return "error: old (non-empty) and new must be strings", {}, None
            text = env.read_file(path).decode("utf-8")
            count = text.count(old)
            if count != 1:
                return f"error: `old` occurs {count} times in {path} (it must occur exactly once)", {}, None
            env.write_file(path, text.replace(old, new, 1))
            return f"edited {path}", {}, None
        if name == "finish":
            summary = str(args.get("summary") or "")
            return "finished", {}, summary or "done"
        return f"error: unknown tool {name!r} (tools: shell, read_file, write_file, edit_file, finish)", {}, None


# --- helpers ----------------------------------------------------------------------------------------------
def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _message_dict(response: Any) -> dict[str, Any]:
    """The assistant message of a completion as a plain dict (to append to the conversation)."""
    try:
        msg = _get(response, "choices")[0]
        msg = _get(msg, "message")
    except (TypeError, IndexError, KeyError) as exc:
        raise _Stop("agent_error", f"malformed completion response: {exc}") from None
    content = _get(msg, "content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    out: dict[str, Any] = {"role": "assistant", "content": content or ""}
    calls = []
    for i, tc in enumerate(_get(msg, "tool_calls") or []):
        fn = _get(tc, "function") or {}
        args = _get(fn, "arguments")
        calls.append(
            {
                "id": _get(tc, "id") or f"call_{i}",
                "type": "function",
                "function": {
                    "name": _get(fn, "name") or "",
                    "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                },
            }
        )
    if calls:
        out["tool_calls"] = calls
    return out


def _cost(response: Any) -> float:
    try:
        from saasbench.services.judge import _litellm

        return float(_litellm().completion_cost(completion_response=response) or 0.0)
    except Exception:  # noqa: BLE001 - unknown models (local servers) have no price
        return 0.0
