"""The ``openhands`` agent: the OpenHands CLI, headless, JSON events (paper, Appendix B.1).

The paper runs OpenHands' CodeActAgent (v1.6.0, V0 ``config.toml``: max_iterations 500,
temperature 0, num_retries 5, retry waits 10-60 s, sandbox timeout 900, MCP off, trajectory
persisted). What installs and runs here without Docker (agent-feasibility.md) is the ``openhands``
CLI 1.16.0 on Python 3.12:

    openhands --headless --json --override-with-envs -t <prompt>

with ``LLM_MODEL``/``LLM_BASE_URL``/``LLM_API_KEY`` in its process environment only.

Known gap: CLI 1.16 reads only those three variables (``openhands_cli/stores/agent_store.py``,
``LLMEnvOverrides.from_env``); the paper's temperature 0, retries (5, 10-60 s), max_iterations and
sandbox timeout are NOT applied to the CLI run. They are written to a per-run ``config.toml``
next to the event stream as the record of the intended configuration. The CLI also tries to
``git clone`` its public skills from github.com at start (it fails offline without stopping the
run; use a network namespace to silence it). The JSON events are parsed into the trajectory
(:class:`OpenHandsParser`, below) and kept as ``openhands_events.jsonl`` plus ``trajectory.json``
outside the workspace.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from saasbench.agents.base import Budget, register_agent
from saasbench.agents.events import (
    CLIAgent,
    StreamEvent,
    StreamParser,
    as_int,
    cap,
    cap_args,
    prompt_word,
    put_file,
    register_parser,
)

OPENHANDS_PACKAGE = "openhands"
OPENHANDS_VERSION = "1.16.0"  # the CLI verified here; needs Python 3.12
DEFAULT_VENV = "/opt/saasbench/openhands"

CONFIG = {
    "max_iterations": 500,
    "temperature": 0.0,
    "num_retries": 5,
    "retry_min_wait": 10,
    "retry_max_wait": 60,
    "sandbox_timeout": 900,
    "enable_mcp": False,
}


@register_agent("openhands")
class OpenHandsAgent(CLIAgent):
    version = OPENHANDS_VERSION
    stream_format = "openhands"
    default_model = "gpt-5"
    events_file = "openhands_events.jsonl"
    package = OPENHANDS_PACKAGE
    package_version = OPENHANDS_VERSION
    # the anti-cheat scanner reads these tools' commands and written files (agents/anticheat.py)
    shell_tools = frozenset({"terminal", "execute_bash"})
    file_tools = {"file_editor": "editor", "str_replace_editor": "editor"}

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        return {"LLM_BASE_URL": root_url + "/v1", "LLM_API_KEY": key}

    def __init__(self, *args, python: str = "python3.12", venv: str | None = DEFAULT_VENV, **kwargs):
        super().__init__(*args, **kwargs)
        self.python = python
        self.venv = venv
        if venv and not self.bin_dir:  # type: ignore[has-type]  # declared on CLIAgent; mypy loses it in the agents import cycle
            self.bin_dir = f"{venv.rstrip('/')}/bin"

    @property
    def llm_model(self) -> str:
        """LiteLLM's provider/model name: a bare name goes through the OpenAI-compatible gateway."""
        return self.model if "/" in self.model else f"openai/{self.model}"

    def command(self, prompt_file: str, model: str, workspace: str) -> list[str]:
        return ["openhands", "--headless", "--json", "--override-with-envs", "-t", prompt_word(prompt_file)]

    def install_command(self) -> str:
        spec = f"{self.package}=={self.package_version}"
        if self.venv:
            v = shlex.quote(self.venv)
            return f"{shlex.quote(self.python)} -m venv {v} && {v}/bin/pip install -q {spec}"
        return f"{shlex.quote(self.python)} -m pip install -q {spec}"

    def version_command(self) -> str:
        return "openhands --version"

    def config_toml(self, budget: Budget) -> str:
        c = CONFIG | {"max_iterations": budget.steps, "sandbox_timeout": int(budget.tool_call_s)}
        return "\n".join(
            [
                "[core]",
                f"max_iterations = {c['max_iterations']}",
                'default_agent = "CodeActAgent"',
                "enable_mcp = false",
                "",
                "[llm]",
                f'model = "{self.llm_model}"',
                f'base_url = "{self.base_url}"' if self.base_url else "# base_url from LLM_BASE_URL",
                f"temperature = {c['temperature']}",
                f"num_retries = {c['num_retries']}",
                f"retry_min_wait = {c['retry_min_wait']}",
                f"retry_max_wait = {c['retry_max_wait']}",
                "",
                "[sandbox]",
                f"timeout = {c['sandbox_timeout']}",
                "",
            ]
        )

    def prepare(self, env, run_dir: str, budget: Budget) -> None:
        put_file(env, f"{run_dir}/config.toml", self.config_toml(budget))

    def process_env(self, run_dir: str, key: str, budget: Budget) -> dict[str, str]:
        env = {
            "LLM_MODEL": self.llm_model,
            "LLM_API_KEY": key,
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no cost-map download from GitHub
            "HOME": f"{run_dir}/home",
        }
        if self.base_url:
            env["LLM_BASE_URL"] = self.base_url
        return env


# --- the --json parser ---------------------------------------------------------------------------------
@register_parser
class OpenHandsParser(StreamParser):
    """``openhands --headless --json``: ``MessageEvent``/``ActionEvent``/``ObservationEvent``/
    ``AgentErrorEvent``/... objects with a ``kind``; accumulated metrics anywhere in an event."""

    format = "openhands"
    plain_text_ok = True  # `openhands --headless --json` also prints status lines and a summary box on stdout

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        kind = obj.get("kind")
        source = str(obj.get("source") or "")
        out: list[StreamEvent] = []
        if kind == "MessageEvent":
            msg = obj.get("llm_message") or {}
            text = _oh_text(msg.get("content"))
            role = msg.get("role") or source
            if text:
                out.append(
                    StreamEvent("message", "assistant" if role == "assistant" else role, cap(text), raw_type=kind)
                )
            if role == "assistant":
                self.totals.turns += 1
                self.totals.final_text = text
                self.totals.exit_reason, self.totals.error = "completed", None
        elif kind == "ActionEvent":
            self.totals.turns += 1
            call = obj.get("tool_call") or {}
            args: Any = call.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            if args is None:
                args = {k: v for k, v in (obj.get("action") or {}).items() if k != "kind"}
            tool = obj.get("tool_name") or call.get("name")
            thought = _oh_text(obj.get("thought"))
            if thought:
                out.append(StreamEvent("message", "assistant", cap(thought), raw_type="thought"))
            out.append(
                StreamEvent(
                    "tool_call",
                    "assistant",
                    cap(args),
                    tool=tool,
                    args=cap_args(args),
                    call_id=obj.get("tool_call_id"),
                    raw_type=kind,
                )
            )
            if tool == "finish":
                self.totals.exit_reason, self.totals.error = "completed", None
                self.totals.final_text = str((obj.get("action") or {}).get("message") or "")
        elif kind == "ObservationEvent":
            obs = obj.get("observation") or {}
            text = _oh_text(obs.get("content"))
            code = obs.get("exit_code")
            failed = bool(obs.get("is_error")) or (isinstance(code, int) and code not in (0, -1))
            out.append(
                StreamEvent(
                    "tool_result",
                    "tool",
                    cap((f"exit {code}\n" if code is not None else "") + text),
                    tool=obj.get("tool_name"),
                    call_id=obj.get("tool_call_id"),
                    is_error=failed,
                    raw_type=kind,
                )
            )
        elif kind in ("AgentErrorEvent", "ConversationErrorEvent"):
            msg = str(obj.get("error") or obj.get("detail") or obj.get("message") or kind)
            out.append(
                StreamEvent("error", "system", cap(msg), tool=obj.get("tool_name"), is_error=True, raw_type=kind)
            )
            if kind == "ConversationErrorEvent" or not obj.get("tool_call_id"):
                self.totals.exit_reason = _oh_error_reason(msg)
                self.totals.error = cap(f"openhands: {msg}", 500)
        elif kind == "ConversationStateUpdateEvent":
            key, value = obj.get("key"), obj.get("value")
            if key == "execution_status" and isinstance(value, str):
                status = value.lower()
                if status == "finished":
                    self.totals.exit_reason, self.totals.error = "completed", None
                elif status in ("error", "stuck"):
                    self.totals.exit_reason = "agent_error"
                    self.totals.error = f"openhands: execution status {status}"
        metrics = _find_metrics(obj)
        if metrics is not None:
            tin, tout, cost = metrics
            self._final_usage(tin, tout, cost)  # accumulated values: the latest one is the total
            out.append(
                StreamEvent(
                    "usage",
                    "system",
                    f"accumulated: {tin} in, {tout} out",
                    tokens_in=tin,
                    tokens_out=tout,
                    cost_usd=cost,
                    raw_type="metrics",
                )
            )
            self._usage_final = True
        return out


def _oh_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content).strip()
    return ""


def _oh_error_reason(msg: str) -> str:
    low = msg.lower()
    if "maximum iteration" in low or "max_iterations" in low or "budget" in low:
        return "agent_budget_exceeded"
    return "agent_error"


def _find_metrics(obj: Any, depth: int = 0) -> tuple[int, int, float | None] | None:
    """OpenHands accumulated metrics ({accumulated_cost, accumulated_token_usage}) anywhere in an event."""
    if depth > 4:
        return None
    if isinstance(obj, dict):
        usage = obj.get("accumulated_token_usage")
        if isinstance(usage, dict):
            cost = obj.get("accumulated_cost")
            return (
                as_int(usage.get("prompt_tokens")),
                as_int(usage.get("completion_tokens")),
                float(cost) if isinstance(cost, (int, float)) else None,
            )
        for value in obj.values():
            if isinstance(value, (dict, list)):
                found = _find_metrics(value, depth + 1)
                if found is not None:
                    return found
    elif isinstance(obj, list):
        for value in obj[:50]:
            found = _find_metrics(value, depth + 1)
            if found is not None:
                return found
    return None
