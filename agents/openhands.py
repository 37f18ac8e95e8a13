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
run; use a network namespace to silence it). The JSON events are parsed into the trajectory and
kept as ``openhands_events.jsonl`` plus ``trajectory.json`` outside the workspace.
"""

from __future__ import annotations

import shlex

from saasbench.agents.base import Budget, register_agent
from saasbench.agents.events import CLIAgent, prompt_word, put_file

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

    def __init__(self, *args, python: str = "python3.12", venv: str | None = DEFAULT_VENV, **kwargs):
        super().__init__(*args, **kwargs)
        self.python = python
        self.venv = venv
        if venv and not self.bin_dir:
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
