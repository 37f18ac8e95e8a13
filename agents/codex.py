"""The ``codex`` agent: OpenAI Codex CLI in exec mode (paper, Appendix B.1).

    codex exec --model <id> --json --sandbox danger-full-access --skip-git-repo-check -- <prompt>

Codex 0.171 speaks only the Responses API and ignores ``OPENAI_BASE_URL`` (agent-feasibility.md),
so the gateway goes into a per-run ``$CODEX_HOME/config.toml`` as a custom provider
(``wire_api = "responses"``, ``env_key = "OPENAI_API_KEY"``: the file names the variable, never the
key), with analytics and plugins off. ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` are set only in the
CLI's process environment. The ``--json`` stream is parsed into the trajectory and kept as
``codex_events.jsonl`` outside the workspace.
"""

from __future__ import annotations

import json

from saasbench.agents.base import Budget, register_agent
from saasbench.agents.events import CLIAgent, NpmInstalledCLI, prompt_word, put_file

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
