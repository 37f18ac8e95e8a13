"""The Environment interface: every member a caller reads is declared, backends conform, callers ask it.

The interface is ``saasbench/environments/base.py``; the backend registry is
``saasbench/environments/__init__.py``. ``tests/test_docker_env.py`` runs the same conformance
suite on the Docker backend; ``tests/test_architecture.py`` checks that no caller compares ``kind``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from saasbench.environments import (
    _BACKENDS,
    _CONNECT,
    connect_backend,
    create_environment,
    register_backend,
)
from saasbench.environments.base import EnvError, Environment, check_declared, self_check_backend
from saasbench.environments.exec_target import environment_base_env
from saasbench.environments.local import LocalEnvironment, host_env

REPO = Path(__file__).resolve().parents[1]

# member -> who reads it (a new backend overrides these, never a caller's `kind` comparison)
CALLERS = {
    "kind": "the lake's backend column (saasbench/runs/trial.py), P12 evidence (primitives/container.py)",
    "task": "agents/oracle.py (the reference to install)",
    "runs_on_host": "saasbench/runs/gateway.py (relay or loopback), saasbench/runs/trial.py (forbidden host paths)",
    "trial_id": "saasbench/cli/env.py (env up prints how to reach the trial)",
    "workspace_dir": "saasbench/runs/trial.py (integrity hashes, the result's workspace), saasbench/cli/env.py",
    "state_dir": "agents/events.py (the CLI agents' run artefacts)",
    "container_name": "agents/base.py build_prompt (docker exec <name>)",
    "gateway_ip": "saasbench/runs/gateway.py (where the relay for a containerised agent listens)",
    "receiver_bind_host": "saasbench/services/receivers.py receiver_hosts",
    "receiver_advertise_host": "saasbench/services/receivers.py receiver_hosts",
    "base_env": "saasbench/environments/exec_target.py environment_base_env (a task's exec_env_file)",
    "workspace": "primitives/files.py workspace_for",
    "service_env": "start_app, the backends' own exec and services",
}


def _documented_members() -> dict[str, bool]:
    """Members defined in Environment's class body -> whether each carries a docstring."""
    tree = ast.parse((REPO / "saasbench" / "environments" / "base.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Environment")
    out: dict[str, bool] = {}
    for i, node in enumerate(cls.body):
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_docstring(node) is not None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = cls.body[i + 1] if i + 1 < len(cls.body) else None
            out[node.target.id] = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
    return out


def test_every_member_callers_use_is_declared_and_documented() -> None:
    documented = _documented_members()
    missing = [name for name in CALLERS if name not in documented]
    undocumented = [name for name in CALLERS if not documented.get(name, True)]
    assert missing == [] and undocumented == [], (missing, undocumented)
    for name in CALLERS:
        assert hasattr(Environment, name)


def test_defaults_fit_an_isolated_backend() -> None:
    class Bare(Environment):  # only the abstract members
        kind = "bare"
        start = stop = exec = read_file = write_file = list_files = start_service = logs = stop_service = (
            lambda self, *a, **k: None
        )
        workspace_path = "/w"  # type: ignore[assignment]
        workspace_dir = Path("/")  # type: ignore[assignment]
        app_port = 8000  # type: ignore[assignment]
        base_url = "http://x:8000"  # type: ignore[assignment]

    env = Bare()
    assert env.task is None and env.runs_on_host is False and env.trial_id is None
    assert env.state_dir is None and env.container_name is None and env.gateway_ip is None
    assert env.receiver_bind_host is None and env.receiver_advertise_host is None
    assert env.base_env() == {} and env.service_env() == {} and env.workspace() is None and env.db_dsn is None

    class WithGateway(Bare):
        gateway_ip = "10.9.0.1"  # type: ignore[assignment]

    g = WithGateway()
    assert g.receiver_bind_host == g.receiver_advertise_host == "10.9.0.1"  # the receivers follow the gateway


def test_local_backend_answers_the_interface() -> None:
    with LocalEnvironment() as env:
        assert env.kind == "local" and env.runs_on_host is True and env.trial_id is None and env.task is None
        assert env.gateway_ip is None and env.receiver_bind_host is None and env.receiver_advertise_host is None
        assert env.container_name is None and env.state_dir is not None and env.state_dir.is_dir()
        assert env.workspace_dir == Path(env.workspace_path)
        assert env.base_env() == host_env()
        assert environment_base_env(env) == {**host_env(), **env.service_env()}
        assert check_declared(env) == []
    assert environment_base_env(None) == {}


# --- conformance ---------------------------------------------------------------------------------
def test_local_backend_conforms_from_creation_to_teardown(tmp_path: Path) -> None:
    from test_environment_local import make_task

    assert self_check_backend(lambda: create_environment("local", None)) == []
    task = make_task(tmp_path / "tasks")
    assert self_check_backend(lambda: create_environment("local", task)) == []


class _Misdeclared(LocalEnvironment):
    """A backend that gets its declared members wrong: the suite must name each one."""

    kind = "misdeclared"
    runs_on_host = "yes"  # type: ignore[assignment]

    @property
    def base_url(self) -> str:
        return super().base_url + "/"

    @property
    def gateway_ip(self) -> str | None:
        return 5  # type: ignore[return-value]

    @property
    def workspace_dir(self) -> Path:
        return self._require() / "not-there"

    def base_env(self) -> dict[str, str]:
        raise RuntimeError("engine gone")


def test_self_check_backend_names_what_does_not_conform() -> None:
    failures = self_check_backend(_Misdeclared)
    text = "\n".join(failures)
    for name in ("runs_on_host", "base_url", "gateway_ip", "receiver_bind_host", "workspace_dir", "base_env()"):
        assert name in text, (name, failures)
    not_an_environment: Any = object
    assert self_check_backend(not_an_environment) == ["make() returned object, not an Environment"]


def test_self_check_backend_catches_use_after_stop(tmp_path: Path) -> None:
    class Undying(LocalEnvironment):
        def _require(self) -> Path:
            if self._ws is None:
                raise EnvError("not started")
            return self._ws  # ignores stop: commands still run afterwards

    failures = self_check_backend(lambda: Undying(workspace_root=tmp_path / "ws"))
    assert "exec after stop must raise EnvError" in failures and "exec before start raised" not in str(failures)


# --- the registry ----------------------------------------------------------------------------------
def test_connect_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect_backend("local") == {}
    with pytest.raises(ValueError, match="unknown backend 'podman'"):
        connect_backend("podman")
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # nothing listens: refused at once
    with pytest.raises(EnvError, match=r"no Docker engine reachable .*; set DOCKER_HOST"):
        connect_backend("docker")
    seen: dict = {}

    def factory(task, **kw):
        seen.update(kw)
        return LocalEnvironment(task)

    register_backend("podman", factory, connect=lambda: {"socket": "/run/podman.sock"})
    try:
        env = create_environment("podman", None, **connect_backend("podman"))
        assert isinstance(env, LocalEnvironment) and seen["socket"] == "/run/podman.sock"
        register_backend("podman", factory)  # re-registered without a connect step
        assert connect_backend("podman") == {}
    finally:
        _BACKENDS.pop("podman", None)
        _CONNECT.pop("podman", None)


def test_env_up_reports_an_unknown_backend_and_a_missing_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from saasbench.cli.env import env_app

    runner = CliRunner()
    r = runner.invoke(env_app, ["up", "timetrack", "--backend", "podman"])
    assert r.exit_code == 2 and "unknown backend 'podman'" in r.output
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    r = runner.invoke(env_app, ["up", "timetrack", "--backend", "docker"])
    assert r.exit_code == 2 and "no Docker engine reachable" in r.output and "set DOCKER_HOST" in r.output


# --- callers ask the interface -----------------------------------------------------------------------
class _OnANetwork(LocalEnvironment):
    """Commands 'in a container' whose trial network reaches the host at 127.0.0.1 (a relay can bind it)."""

    kind = "on-a-network"
    runs_on_host = False
    gateway_ip = "127.0.0.1"  # type: ignore[assignment]


def test_receiver_hosts_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from saasbench.evaluation.context import RunContext, Target
    from saasbench.services.receivers import receiver_hosts

    monkeypatch.delenv("SAASBENCH_RECEIVER_BIND_HOST", raising=False)
    monkeypatch.delenv("SAASBENCH_RECEIVER_ADVERTISE_HOST", raising=False)
    assert receiver_hosts(RunContext(Target())) == ("127.0.0.1", None)
    with LocalEnvironment() as local:
        assert receiver_hosts(RunContext(Target(environment=local))) == ("127.0.0.1", None)
    with _OnANetwork() as env:
        assert receiver_hosts(RunContext(Target(environment=env))) == ("127.0.0.1", "127.0.0.1")
        ctx = RunContext(Target(environment=env))
        ctx.vars["receiver_advertise_host"] = "host.docker.internal"  # a run variable wins
        assert receiver_hosts(ctx) == ("127.0.0.1", "host.docker.internal")


def test_gateway_endpoint_follows_runs_on_host_and_gateway_ip() -> None:
    from saasbench.runs.gateway import GatewayError, TrialGateway

    gw = SimpleNamespace(
        advertised_url="http://127.0.0.1:4000", config=SimpleNamespace(advertise_host=None, host="127.0.0.1"), port=4000
    )
    trial = TrialGateway(gw, "t", "s", "sk-virtual")  # type: ignore[arg-type]
    with LocalEnvironment() as local:
        endpoint = trial.open(local)
        assert endpoint.root_url == "http://127.0.0.1:4000" and endpoint.relay is None
    with _OnANetwork() as env, trial.open(env) as endpoint:
        assert endpoint.relay is not None and endpoint.root_url == f"http://127.0.0.1:{endpoint.relay.port}"

    class NoGateway(_OnANetwork):
        gateway_ip = None  # type: ignore[assignment]

    with NoGateway() as env, pytest.raises(GatewayError, match="no host-side address"):
        trial.open(env)
