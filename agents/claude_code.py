"""The ``claude-code`` agent: Claude Code CLI in print mode (paper, Appendix B.1).

    claude -p --output-format stream-json --verbose --model <id> --permission-mode bypassPermissions
           --allowedTools <12 tools> --add-dir <workspace> -- <prompt>

The CLI (``@anthropic-ai/claude-code``, pinned to the version checked on this machine in
agent-feasibility.md) talks the Anthropic Messages API to ``ANTHROPIC_BASE_URL`` with
``ANTHROPIC_API_KEY``; both are set only in the CLI's own process environment. ``HOME`` is a
per-run scratch folder outside the workspace (removed afterwards), ``IS_SANDBOX=1`` lets
``bypassPermissions`` run as root, and the non-essential traffic (telemetry, auto-update,
error reports, title side calls) is switched off. The stream-json output is parsed into the
trajectory by :class:`ClaudeParser` (below) and kept as ``claude_events.jsonl`` (outside the workspace).
"""

from __future__ import annotations

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
    register_parser,
)

# The paper's fixed set of 12 core tools (Appendix B.1).
ALLOWED_TOOLS = (
    "Bash",
    "Edit",
    "Write",
    "Read",
    "Glob",
    "Grep",
    "LS",
    "WebFetch",
    "NotebookEdit",
    "NotebookRead",
    "TodoRead",
    "TodoWrite",
)
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_CODE_VERSION = "2.1.197"  # verified here (agent-feasibility.md); the paper used 2.1.126


@register_agent("claude-code")
class ClaudeCodeAgent(NpmInstalledCLI, CLIAgent):
    version = CLAUDE_CODE_VERSION
    stream_format = "claude"
    gateway_api = "anthropic"  # ANTHROPIC_BASE_URL is the gateway's root: the CLI appends /v1/messages
    default_model = "claude-sonnet-4-5"
    events_file = "claude_events.jsonl"
    package = CLAUDE_CODE_PACKAGE
    package_version = CLAUDE_CODE_VERSION
    # the anti-cheat scanner reads these tools' commands and written files (agents/anticheat.py)
    shell_tools = frozenset({"Bash"})
    file_tools = {"Write": "write", "Edit": "edit", "MultiEdit": "multiedit", "NotebookEdit": "notebook"}

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": root_url, "ANTHROPIC_API_KEY": key}  # no /v1: the CLI appends /v1/messages

    def command(self, prompt_file: str, model: str, workspace: str) -> list[str]:
        return [
            "claude",
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            model,
            "--permission-mode",
            "bypassPermissions",
            "--allowedTools",
            ",".join(ALLOWED_TOOLS),
            "--add-dir",
            workspace,
            "--",
            prompt_word(prompt_file),
        ]

    def version_command(self) -> str:
        return "claude --version"

    def process_env(self, run_dir: str, key: str, budget: Budget) -> dict[str, str]:
        env = {
            "ANTHROPIC_API_KEY": key,
            "HOME": f"{run_dir}/home",
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # one tool call may not outlive the budget's per-call limit
            "BASH_DEFAULT_TIMEOUT_MS": str(int(budget.tool_call_s * 1000)),
            "BASH_MAX_TIMEOUT_MS": str(int(budget.tool_call_s * 1000)),
        }
        if self.base_url:
            env["ANTHROPIC_BASE_URL"] = self.base_url
        return env


# --- the stream-json parser -------------------------------------------------------------------------
@register_parser
class ClaudeParser(StreamParser):
    """``claude -p --output-format stream-json --verbose``: ``system``/``assistant``/``user``/``result``
    objects; the final ``result`` carries usage, cost, turns and the outcome."""

    format = "claude"

    def __init__(self) -> None:
        super().__init__()
        self._tool_names: dict[str, str] = {}

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        typ = obj.get("type")
        if typ == "system":
            return []  # init (tools, model, cwd) and status lines: nothing the agent did
        if typ in ("assistant", "user"):
            msg = obj.get("message") or {}
            role = msg.get("role") or typ
            content = msg.get("content")
            out: list[StreamEvent] = []
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
            for block in blocks:
                if not isinstance(block, dict):
                    continue
                btype = block.get("type")
                if btype == "text" and block.get("text"):
                    out.append(StreamEvent("message", role, cap(block["text"]), raw_type=typ))
                elif btype == "thinking" and block.get("thinking"):
                    out.append(StreamEvent("message", role, cap(block["thinking"]), raw_type="thinking"))
                elif btype == "tool_use":
                    args = block.get("input")
                    self._tool_names[str(block.get("id"))] = str(block.get("name"))
                    out.append(
                        StreamEvent(
                            "tool_call",
                            "assistant",
                            cap(args),
                            tool=block.get("name"),
                            args=cap_args(args),
                            call_id=block.get("id"),
                            raw_type=typ,
                        )
                    )
                elif btype == "tool_result":
                    res = block.get("content")
                    if isinstance(res, list):
                        res = "\n".join(str(p.get("text", "")) for p in res if isinstance(p, dict))
                    out.append(
                        StreamEvent(
                            "tool_result",
                            "tool",
                            cap(res),
                            call_id=block.get("tool_use_id"),
                            tool=self._tool_names.get(str(block.get("tool_use_id"))),
                            is_error=bool(block.get("is_error")),
                            raw_type=typ,
                        )
                    )
            usage = msg.get("usage") if typ == "assistant" else None
            if isinstance(usage, dict):
                out.append(
                    StreamEvent(
                        "usage",
                        "assistant",
                        tokens_in=_claude_in(usage),
                        tokens_out=as_int(usage.get("output_tokens")),
                        raw_type="message_usage",
                    )
                )
            return out
        if typ == "result":
            self.totals.turns = as_int(obj.get("num_turns"))
            run_usage = obj.get("usage")
            if not isinstance(run_usage, dict):
                run_usage = {}
            raw_cost = obj.get("total_cost_usd")
            cost = float(raw_cost) if isinstance(raw_cost, (int, float)) else None
            tin, tout = _claude_in(run_usage), as_int(run_usage.get("output_tokens"))
            self._final_usage(tin, tout, cost)
            subtype = str(obj.get("subtype") or "")
            result = obj.get("result")
            text = result if isinstance(result, str) else ""
            self.totals.final_text = text
            out = [
                StreamEvent(
                    "usage",
                    "system",
                    f"run totals: {tin} in, {tout} out",
                    tokens_in=tin,
                    tokens_out=tout,
                    cost_usd=cost,
                    raw_type="result",
                )
            ]
            if subtype == "success" and not obj.get("is_error"):
                self.totals.exit_reason, self.totals.error = "completed", None
            elif "max_turns" in subtype or "max_budget" in subtype:
                self.totals.exit_reason = "agent_budget_exceeded"
                self.totals.error = f"claude: {subtype} after {self.totals.turns} turns"
            else:
                self.totals.exit_reason = "agent_error"
                detail = (
                    text or "; ".join(str(e) for e in obj.get("errors") or []) or str(obj.get("api_error_status") or "")
                )
                self.totals.error = cap(f"claude: {subtype or 'error'}" + (f": {detail}" if detail else ""), 500)
                out.append(StreamEvent("error", "system", self.totals.error, is_error=True, raw_type="result"))
            return out
        return []  # stream_event partials, rate-limit notices, ...: not needed for the record


def _claude_in(usage: dict[str, Any]) -> int:
    return (
        as_int(usage.get("input_tokens"))
        + as_int(usage.get("cache_creation_input_tokens"))
        + as_int(usage.get("cache_read_input_tokens"))
    )
