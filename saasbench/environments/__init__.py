"""Where a trial runs: the Environment interface, the local and Docker backends, exec targets, image cache.

The interface is :class:`saasbench.environments.base.Environment` (with its conformance suite,
``self_check_backend``). The backend registry here is the one place that knows backend names: the
CLI, sweep specs and the trial runner ask it (``backend_names()``, ``check_backend()``,
``connect_backend()``, ``create_environment()``), so a new backend is one ``register_backend``
call plus its module (CONTRIBUTING.md, recipe 3).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saasbench.environments.base import Environment

# name -> factory(task, *, keep_workspace, workspace_root, options) -> Environment; modules load lazily
_BACKENDS: dict[str, Callable[..., Environment]] = {}
# name -> connect() -> options for the factory (a client of the backend's engine); EnvError when unreachable
_CONNECT: dict[str, Callable[[], dict[str, Any]]] = {}


def register_backend(
    name: str, factory: Callable[..., Environment], connect: Callable[[], dict[str, Any]] | None = None
) -> None:
    """Make ``name`` a backend: ``factory(task, keep_workspace=..., workspace_root=..., **options)``.

    ``connect()`` (optional): check the backend's engine answers and return the options ``factory``
    takes to use that connection (Docker: ``{"docker_client": client}``); raise
    :class:`~saasbench.failures.EnvError` saying what to fix when it does not.
    """
    _BACKENDS[name] = factory
    if connect is not None:
        _CONNECT[name] = connect
    else:
        _CONNECT.pop(name, None)


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def check_backend(name: str) -> str:
    """``name`` if it is a registered backend; ValueError naming the choices otherwise."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose {' or '.join(backend_names())})")
    return name


def connect_backend(name: str) -> dict[str, Any]:
    """The options for :func:`create_environment` that reuse one checked connection to ``name``'s
    engine ({} for a backend without one). ValueError for an unknown backend, EnvError when its
    engine does not answer (the message says what to set)."""
    connect = _CONNECT.get(check_backend(name))
    return connect() if connect is not None else {}


def create_environment(
    backend: str, task: Any, *, keep_workspace: bool = False, workspace_root: str | Path | None = None, **options: Any
) -> Environment:
    """A fresh environment of ``backend`` for one trial of ``task`` (not started: use it as a context manager)."""
    return _BACKENDS[check_backend(backend)](
        task, keep_workspace=keep_workspace, workspace_root=workspace_root, **options
    )


def _local(task: Any, *, keep_workspace: bool, workspace_root: str | Path | None, **_: Any) -> Environment:
    from saasbench.environments.local import LocalEnvironment

    return LocalEnvironment(task, workspace_root=workspace_root, keep=keep_workspace)


def _docker(
    task: Any, *, keep_workspace: bool, workspace_root: str | Path | None, docker_client: Any = None, **_: Any
) -> Environment:
    from saasbench.environments.docker import DockerEnvironment

    return DockerEnvironment(task, client=docker_client, keep=keep_workspace, workspace_root=workspace_root)


def _docker_connect() -> dict[str, Any]:
    from saasbench.environments.docker import connect_engine

    return {"docker_client": connect_engine()}


register_backend("local", _local)
register_backend("docker", _docker, _docker_connect)
