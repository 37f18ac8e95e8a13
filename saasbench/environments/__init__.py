"""Where a trial runs: the Environment interface, the local and Docker backends, exec targets, image cache.

The backend registry is the one place that knows backend names: the CLI, sweep specs and the trial
runner ask it (``backend_names()``, ``check_backend()``, ``create_environment()``), so a new backend
is one ``register_backend`` call plus its module (CONTRIBUTING.md, recipe 3).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# name -> factory(task, *, keep_workspace, workspace_root, options) -> Environment; modules load lazily
_BACKENDS: dict[str, Callable[..., Any]] = {}


def register_backend(name: str, factory: Callable[..., Any]) -> None:
    """Make ``name`` a backend: ``factory(task, keep_workspace=..., workspace_root=..., **options)``."""
    _BACKENDS[name] = factory


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def check_backend(name: str) -> str:
    """``name`` if it is a registered backend; ValueError naming the choices otherwise."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose {' or '.join(backend_names())})")
    return name


def create_environment(
    backend: str, task: Any, *, keep_workspace: bool = False, workspace_root: str | Path | None = None, **options: Any
) -> Any:
    """A fresh environment of ``backend`` for one trial of ``task`` (not started: use it as a context manager)."""
    return _BACKENDS[check_backend(backend)](
        task, keep_workspace=keep_workspace, workspace_root=workspace_root, **options
    )


def _local(task: Any, *, keep_workspace: bool, workspace_root: str | Path | None, **_: Any) -> Any:
    from saasbench.environments.local import LocalEnvironment

    return LocalEnvironment(task, workspace_root=workspace_root, keep=keep_workspace)


def _docker(
    task: Any, *, keep_workspace: bool, workspace_root: str | Path | None, docker_client: Any = None, **_: Any
) -> Any:
    from saasbench.environments.docker import DockerEnvironment

    return DockerEnvironment(task, client=docker_client, keep=keep_workspace, workspace_root=workspace_root)


register_backend("local", _local)
register_backend("docker", _docker)
