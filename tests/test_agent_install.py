"""Agent installs per trial (issue #19): proxy, CA and package-index variables reach the install
command on every backend while provider keys do not; an install that fails is the trial's
env_error carrying the tool's own message (redacted), retried, and the sweep goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saasbench import lake as lakelib
from saasbench.agents.claude_code import ClaudeCodeAgent
from saasbench.agents.events import AgentInstallError
from saasbench.agents.openhands import OpenHandsAgent
from saasbench.environments.base import INSTALL_ENV, install_env
from saasbench.environments.local import LocalEnvironment
from saasbench.runs import sweep as sw

# what a harness behind a corporate proxy with a private registry sets (and a provider key beside them)
PROXY_VARS = {
    "HTTPS_PROXY": "http://proxy.invalid:3128",
    "https_proxy": "http://proxy.invalid:3128",
    "HTTP_PROXY": "http://proxy.invalid:3128",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "ALL_PROXY": "socks5://proxy.invalid:1080",
    "SSL_CERT_FILE": "/etc/corp/ca.pem",
    "REQUESTS_CA_BUNDLE": "/etc/corp/ca.pem",
    "CURL_CA_BUNDLE": "/etc/corp/ca.pem",
    "NODE_EXTRA_CA_CERTS": "/etc/corp/ca.pem",
    "PIP_INDEX_URL": "https://pypi.corp.invalid/simple",
    "PIP_EXTRA_INDEX_URL": "https://extra.corp.invalid/simple",
    "PIP_TRUSTED_HOST": "pypi.corp.invalid",
    "npm_config_registry": "https://npm.corp.invalid/",
    "NPM_CONFIG_REGISTRY": "https://npm.corp.invalid/",
    "UV_INDEX_URL": "https://pypi.corp.invalid/simple",
}
PROVIDER_KEYS = {"ANTHROPIC_API_KEY": "sk-ant-provider-secret-123", "OPENAI_API_KEY": "sk-openai-provider-secret-456"}


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _read_env(path: Path | str) -> dict[str, str]:
    out = {}
    text = path if isinstance(path, str) else path.read_text()
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name] = value
    return out


@pytest.fixture
def harness_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**PROXY_VARS, **PROVIDER_KEYS}.items():
        monkeypatch.setenv(name, value)


def test_the_install_variables_are_one_documented_list_without_secrets() -> None:
    assert set(PROXY_VARS) <= set(INSTALL_ENV)
    assert not set(PROVIDER_KEYS) & set(INSTALL_ENV)
    env = {**PROXY_VARS, **PROVIDER_KEYS, "MY_TOKEN": "t", "PATH": "/bin"}
    assert install_env(env) == PROXY_VARS  # only the list; secret-looking names never
    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    assert all(name in doc for name in ("INSTALL_ENV", "HTTPS_PROXY", "NODE_EXTRA_CA_CERTS", "PIP_INDEX_URL"))


def test_npm_and_pip_installs_get_proxy_and_ca_variables_not_provider_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harness_env: None
) -> None:
    """The real install path (CLIAgent.install on the local backend): a fake npm and a fake python on PATH
    record the environment they were started with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "npm", f'env > {tmp_path}/npm.env\necho "$@" > {tmp_path}/npm.args\n')
    _script(bin_dir / "claude", "echo 2.1.197\n")
    _script(bin_dir / "python-fake", f'env > {tmp_path}/pip.env\necho "$@" > {tmp_path}/pip.args\n')
    _script(bin_dir / "openhands", "echo 1.16.0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with LocalEnvironment() as env:
        ClaudeCodeAgent(api_key="sk-trial-key-789").install(env)
        OpenHandsAgent(python="python-fake", venv=None).install(env)
    assert "@anthropic-ai/claude-code@" in (tmp_path / "npm.args").read_text()
    assert "-m pip install -q openhands==" in (tmp_path / "pip.args").read_text()
    for tool in ("npm", "pip"):
        seen = _read_env(tmp_path / f"{tool}.env")
        assert {k: seen.get(k) for k in PROXY_VARS} == PROXY_VARS, tool
        assert not set(PROVIDER_KEYS) & set(seen), tool
        assert not any(v in "\n".join(seen.values()) for v in [*PROVIDER_KEYS.values(), "sk-trial-key-789"])


def test_docker_install_gets_the_variables_in_its_exec_environment(
    docker_client, busybox_image, harness_env: None
) -> None:
    """On the Docker backend the install is a `docker exec` whose environment is the container's plus
    the install variables (the host's environment is never inherited, so provider keys cannot leak)."""
    from saasbench.catalog.envspec import EnvSpec, ServiceSpec
    from saasbench.environments.docker import DockerEnvironment

    class EnvDumpAgent(ClaudeCodeAgent):
        def install_command(self) -> str:
            return "env > install.env"

        def version_command(self) -> str:
            return ""

    spec = EnvSpec(services={"app": ServiceSpec(image=busybox_image, command=["sleep", "3600"])})
    with DockerEnvironment(spec=spec, client=docker_client) as env:
        EnvDumpAgent().install(env)
        seen = _read_env(env.read_file("install.env").decode())
    assert {k: seen.get(k) for k in PROXY_VARS} == PROXY_VARS
    assert not set(PROVIDER_KEYS) & set(seen)


def test_install_failures_carry_the_tools_message_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(
        bin_dir / "npm",
        "echo 'npm ERR! code ECONNREFUSED' >&2\n"
        'echo "npm ERR! proxy $HTTPS_PROXY refused; key $ANTHROPIC_API_KEY" >&2\nexit 1\n',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HTTPS_PROXY", "http://me:hunter2pw@proxy.invalid:3128")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-provider-secret-123")
    with LocalEnvironment() as env:
        with pytest.raises(AgentInstallError) as info:
            ClaudeCodeAgent().install(env)
        text = str(info.value)
        assert "exited 1" in text and "npm ERR! code ECONNREFUSED" in text and "proxy.invalid" in text
        assert "hunter2pw" not in text and "sk-ant-provider-secret-123" not in text and "[REDACTED]" in text
        # a missing binary: the shell's own message
        with pytest.raises(AgentInstallError, match=r"exited 127[\s\S]*no-such-python3\.99.*not found"):
            OpenHandsAgent(python="no-such-python3.99", venv=None).install(env)


@pytest.mark.slow
def test_a_failed_install_is_that_trials_env_error_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of nop and claude-code on the demo task where npm cannot install Claude Code: the
    claude-code trial is retried (2 retries) and recorded as env_error with npm's message; the nop
    trial completes and is scored."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "npm.calls"
    _script(
        bin_dir / "npm",
        f'echo "$@" >> {calls}\n'
        "echo 'npm ERR! code E404' >&2\n"
        "echo 'npm ERR! 404 Not Found - GET https://registry.npmjs.org/@anthropic-ai%2fclaude-code' >&2\nexit 1\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = sw.SweepSpec.model_validate(
        {
            "sweep_id": "s-install",
            "tasks": ["timetrack"],
            "agents": ["claude-code", "nop"],
            "lake": str(tmp_path / "lake"),
            "report_dir": str(tmp_path / "reports"),
            "retry_delays": [0],
        }
    )
    sleeps: list[float] = []
    outcomes = sw.run_sweep_plain(spec, sleep=sleeps.append)
    assert outcomes == {"timetrack.claude-code.none.0": "env_error", "timetrack.nop.none.0": "completed"}
    assert len(calls.read_text().splitlines()) == 3 and sleeps == [0, 0]  # first try + the spec's 2 retries
    rows = {
        r["agent"]: r
        for r in lakelib.query(
            spec.lake_uri, "SELECT agent, outcome, outcome_detail, valid, total_nodes FROM trials", sweep_id="s-install"
        ).to_pylist()
    }
    failed = rows["claude-code"]
    assert failed["outcome"] == "env_error" and not failed["valid"] and failed["total_nodes"] is None
    detail = failed["outcome_detail"]
    assert "installing claude-code failed" in detail and "npm install -g" in detail and "exited 1" in detail
    assert "npm ERR! code E404" in detail and "404 Not Found" in detail
    assert rows["nop"]["outcome"] == "completed" and rows["nop"]["valid"] and rows["nop"]["total_nodes"] > 0
    assert not sw.pending(spec)  # both trials are committed: a rerun of the sweep runs nothing
