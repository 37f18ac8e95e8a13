"""The ``claude-code`` agent: Claude Code CLI in print mode (paper, Appendix B.1).

    claude -p --output-format stream-json --verbose --model <id> --permission-mode bypassPermissions
           --allowedTools <12 tools> --add-dir <workspace> -- <prompt>

The CLI (``@anthropic-ai/claude-code``, pinned to the version checked on this machine in
agent-feasibility.md) talks the Anthropic Messages API to ``ANTHROPIC_BASE_URL`` with
``ANTHROPIC_API_KEY``; both are set only in the CLI's own process environment. ``HOME`` is a
per-run scratch folder outside the workspace (removed afterwards), ``IS_SANDBOX=1`` lets
``bypassPermissions`` run as root, and the non-essential traffic (telemetry, auto-update,
error reports, title side calls) is switched off. The stream-json output is parsed into the
trajectory by :mod:`saasbench.agents.events` and kept as ``claude_events.jsonl`` (outside the workspace).
"""

from __future__ import annotations

from saasbench.agents.base import Budget, register_agent
from saasbench.agents.events import CLIAgent, NpmInstalledCLI, prompt_word

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
