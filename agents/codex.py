"""The ``codex`` agent: OpenAI Codex CLI in exec mode (paper, Appendix B.1).

    codex exec --model <id> --json --sandbox danger-full-access --skip-git-repo-check -- <prompt>

Codex 0.171 speaks only the Responses API and ignores ``OPENAI_BASE_URL`` (agent-feasibility.md),
so the gateway goes into a per-run ``$CODEX_HOME/config.toml`` as a custom provider
(``wire_api = "responses"``, ``env_key = "OPENAI_API_KEY"``: the file names the variable, never the
key), with analytics and plugins off. ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` are set only in the
CLI's process environment. The ``--json`` stream is parsed into the trajectory and kept as
``codex_events.jsonl`` outside the workspace (:class:`CodexParser`, below).
"""

from __future__ import annotations

import json
from typing import Any

from saasbench.agents.base import Budget, register_agent
from saasbench.agents.events import (
    CLIAgent,
    NpmInstalledCLI,
    StreamEvent,
    StreamParser,
    as_int,
    cap,
    cap_args,
    prompt_word,
    put_file,
    register_parser,
)

CODEX_PACKAGE = "@openai/codex"
CODEX_VERSION = "0.171.0"  # verified here (agent-feasibility.md)
PROVIDER = "saasbench"


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


@register_agent("codex")
class CodexAgent(NpmInstalledCLI, CLIAgent):
    version = CODEX_VERSION
    stream_format = "codex"
    default_model = "gpt-5"
    events_file = "codex_events.jsonl"
    package = CODEX_PACKAGE
    package_version = CODEX_VERSION
    # the anti-cheat scanner reads these tools' commands and written files (agents/anticheat.py);
    # CodexParser records a command_execution item as tool "shell"
    shell_tools = frozenset({"shell"})
    file_tools = {"file_change": "file_change", "apply_patch": "apply_patch"}

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        return {"OPENAI_BASE_URL": root_url + "/v1", "OPENAI_API_KEY": key}  # config.toml names OPENAI_API_KEY

    def command(self, prompt_file: str, model: str, workspace: str) -> list[str]:
        return [
            "codex",
            "exec",
            "--model",
            model,
            "--json",
            "--sandbox",
            "danger-full-access",
            "--skip-git-repo-check",
            "--",
            prompt_word(prompt_file),
        ]

    def version_command(self) -> str:
        return "codex --version"

    def config_toml(self) -> str:
        lines = [f"model = {_toml(self.model)}"]
        if self.base_url:
            lines += [
                f"model_provider = {_toml(PROVIDER)}",
                "",
                f"[model_providers.{PROVIDER}]",
                'name = "saasbench model gateway"',
                f"base_url = {_toml(self.base_url)}",
                'wire_api = "responses"',
                'env_key = "OPENAI_API_KEY"',
                "request_max_retries = 1",
                "stream_max_retries = 1",
            ]
        lines += ["", "[analytics]", "enabled = false", "", "[features]", "plugins = false", ""]
        return "\n".join(lines)

    def prepare(self, env, run_dir: str, budget: Budget) -> None:
        put_file(env, f"{run_dir}/codex-home/config.toml", self.config_toml())

    def process_env(self, run_dir: str, key: str, budget: Budget) -> dict[str, str]:
        env = {"OPENAI_API_KEY": key, "CODEX_HOME": f"{run_dir}/codex-home", "HOME": f"{run_dir}/home"}
        if self.base_url:
            env["OPENAI_BASE_URL"] = self.base_url
        return env


# --- the --json parser ---------------------------------------------------------------------------------
@register_parser
class CodexParser(StreamParser):
    """``codex exec --json``: ``thread.started``, ``turn.*``, ``item.started``/``item.completed`` with
    ``command_execution``/``agent_message``/... items, usage on ``turn.completed``, no cost."""

    format = "codex"

    def __init__(self) -> None:
        super().__init__()
        self._started: set[str] = set()

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        typ = obj.get("type")
        if typ == "turn.started":
            self.totals.turns += 1
            return []
        if typ == "turn.completed":
            usage = obj.get("usage") or {}
            tin, tout = as_int(usage.get("input_tokens")), as_int(usage.get("output_tokens"))
            self.totals.exit_reason, self.totals.error = "completed", None
            return [
                StreamEvent(
                    "usage", "system", f"turn: {tin} in, {tout} out", tokens_in=tin, tokens_out=tout, raw_type=typ
                )
            ]
        if typ == "turn.failed":
            err = obj.get("error") or {}
            msg = err.get("message") if isinstance(err, dict) else str(err)
            self.totals.exit_reason = "agent_error"
            self.totals.error = cap(f"codex: turn failed: {msg}", 500)
            return [StreamEvent("error", "system", self.totals.error, is_error=True, raw_type=typ)]
        if typ == "error":  # a stream-level error (reconnects, fatal API errors); turn.failed decides
            return [StreamEvent("error", "system", cap(obj.get("message")), is_error=True, raw_type=typ)]
        if typ in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item") or {}
            return self._item(typ, item)
        return []  # thread.started and future types

    def _item(self, typ: str, item: dict[str, Any]) -> list[StreamEvent]:
        itype, iid = str(item.get("type") or ""), str(item.get("id") or "")
        if typ == "item.updated":
            return []
        if itype == "agent_message":
            text = item.get("text") or ""
            if typ == "item.completed":
                self.totals.final_text = text
                return [StreamEvent("message", "assistant", cap(text), raw_type=itype)]
            return []
        if itype == "reasoning":
            return (
                [StreamEvent("message", "assistant", cap(item.get("text")), raw_type=itype)]
                if typ == "item.completed"
                else []
            )
        if itype == "error":  # e.g. "Model metadata ... not found": a warning, not fatal
            return (
                [StreamEvent("error", "system", cap(item.get("message")), raw_type=itype)]
                if typ == "item.completed"
                else []
            )
        tool, args, result = _codex_tool(itype, item)
        if tool is None:
            return []
        out: list[StreamEvent] = []
        if iid not in self._started:  # item.started, or a completed item that never announced its start
            self._started.add(iid)
            out.append(
                StreamEvent(
                    "tool_call", "assistant", cap(args), tool=tool, args=cap_args(args), call_id=iid, raw_type=itype
                )
            )
        if typ == "item.completed":
            status = item.get("status")
            code = item.get("exit_code")
            failed = status == "failed" or (isinstance(code, int) and code != 0)
            out.append(
                StreamEvent("tool_result", "tool", cap(result), tool=tool, call_id=iid, is_error=failed, raw_type=itype)
            )
        return out


def _codex_tool(itype: str, item: dict[str, Any]) -> tuple[str | None, Any, Any]:
    if itype == "command_execution":
        out = item.get("aggregated_output") or ""
        code = item.get("exit_code")
        # tool "shell": a name in CodexAgent.shell_tools, so the anti-cheat scanner reads the command
        return "shell", {"command": item.get("command")}, (f"exit {code}\n" if code is not None else "") + out
    if itype == "file_change":
        changes = item.get("changes") or []
        return "file_change", {"changes": changes}, item.get("status") or ""
    if itype == "mcp_tool_call":
        return (
            f"mcp:{item.get('server')}/{item.get('tool')}",
            item.get("arguments"),
            item.get("result") or item.get("error"),
        )
    if itype == "web_search":
        return "web_search", {"query": item.get("query")}, ""
    if itype == "todo_list":
        return "todo_list", {"items": item.get("items")}, ""
    return None, None, None
