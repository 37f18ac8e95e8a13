"""Exec targets: where P12 (container_exec) and P21 (log_content_check) run commands when
saasbench did not start the app.

Why this module: a trial owns an :class:`~saasbench.environments.base.Environment` (local workspace or
Docker containers) and P12/P21 run through it. ``saasbench evaluate`` scores an app someone else
started, so it has no environment; before this module every P12/P21 node of such a run was a
FAILED node that said nothing about the app. ``--exec`` names the place instead:

- ``local:DIR`` (:class:`LocalExecTarget`): ``bash -c`` in DIR on this host, in its own process
  group, with a minimal environment (:data:`~saasbench.environments.local.PASSTHROUGH_ENV` minus
  anything whose name looks secret, :func:`is_secret_name`) plus the exec variables.
- ``docker:CONTAINER`` (:class:`DockerExecTarget`): ``docker exec`` through the Docker SDK
  (``DOCKER_HOST`` respected) in a running container, ``bash -c`` when the container has bash,
  else ``sh -c``; the container's own environment plus the exec variables.

Both implement the ``exec(cmd, timeout_s, env=None, cwd=None) -> ExecResult`` part of the
Environment interface with the same limits, by reusing the backends' code
(:func:`saasbench.environments.local.run_group`, :func:`saasbench.environments.docker.exec_in_container`): 1 MiB per
output stream, exit 124 and everything the command started killed on timeout. They are attached
as ``Target.exec_target``; the variables go in ``Target.exec_env`` (the same field carries a task's
declared ``exec_env``/``exec_env_file`` into a trial's environment). P21 reads service logs
(``logs``) or the tail of a log file through the target (``tail_file``).

Without a target and without an environment, P12/P21 raise :class:`NoExecTarget`: the node is
ERROR (the run could not check it), not FAILED (the app did nothing wrong).

Exec variables: ``--exec-env K=V`` (literal) and ``--exec-env-file FILE`` (:func:`parse_env_file`:
``K=V`` / ``export K=V [K2=V2 ...]`` lines, shell quoting, ``$VAR``/``${VAR}`` expanded against
earlier lines and the target's base environment; the file is parsed, never executed). Only the
variable names are recorded in ``report.json``, never the values.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saasbench.environments.base import EnvError, ExecResult
from saasbench.environments.local import host_env, is_secret_name, run_group

if TYPE_CHECKING:
    from saasbench.environments.base import Environment

__all__ = [
    "DockerExecTarget",
    "ExecTarget",
    "ExecTargetError",
    "LocalExecTarget",
    "NoExecTarget",
    "environment_base_env",
    "exec_target_of",
    "is_secret_name",
    "make_exec_target",
    "parse_env_assignments",
    "parse_env_file",
    "parse_env_options",
    "task_exec_env",
]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NO_EXEC_TARGET = "{code} needs an exec target: pass --exec local:DIR or --exec docker:CONTAINER"


class NoExecTarget(RuntimeError):
    """A P12/P21 step ran without an exec target or environment (the node is ERROR)."""


class ExecTargetError(ValueError):
    """An ``--exec`` spec or exec-env input cannot be used (the run cannot start)."""


# --- the targets -------------------------------------------------------------------------------------
class ExecTarget(ABC):
    """Where commands run; the ``exec`` half of :class:`~saasbench.environments.base.Environment`."""

    kind = "exec"

    @abstractmethod
    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        """Run ``cmd`` with a shell; output capped, everything it started killed on timeout."""

    def logs(self, name: str, tail: int = 200) -> str:
        """A named log the target knows (none by default): KeyError."""
        raise KeyError(name)

    def tail_file(self, path: str, lines: int, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> str:
        """The last ``lines`` lines of a file as the target's commands see it (relative to its
        working directory). FileNotFoundError when it does not exist, EnvError when it cannot be read."""
        r = self.exec(f"tail -n {int(lines)} -- {shlex.quote(path)}", timeout_s, env=env)
        if r.timed_out:
            raise EnvError(f"reading {path!r} timed out after {timeout_s:g}s")
        if r.exit_code != 0:
            err = r.stderr.strip() or f"tail exited {r.exit_code}"
            if "No such file" in err:
                raise FileNotFoundError(path)
            raise EnvError(err.splitlines()[-1][:300])
        return r.stdout.rstrip("\n")

    def base_env(self) -> dict[str, str]:
        """What ``$VAR`` in an exec-env file expands against (after the file's earlier lines)."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        pass


class LocalExecTarget(ExecTarget):
    """``bash -c`` in a folder on this host (``--exec local:DIR``)."""

    kind = "local"

    def __init__(self, directory: str | Path):
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise ExecTargetError(f"--exec local:{directory}: {path} does not exist or is not a directory")
        self.dir = Path(os.path.realpath(path))
        self._running: dict[int, Any] = {}
        self._lock = threading.Lock()

    def command_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The minimal host environment (no secret-looking names) plus ``extra``."""
        env = host_env()
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        return env

    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        workdir = self.dir / cwd if cwd else self.dir
        if not workdir.is_dir():
            raise FileNotFoundError(f"cwd {cwd!r} does not exist under {self.dir}")
        return run_group(
            ["bash", "-c", cmd],
            timeout_s,
            cwd=workdir,
            env=self.command_env(env),
            running=self._running,
            lock=self._lock,
        )

    def base_env(self) -> dict[str, str]:
        return dict(os.environ)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "dir": str(self.dir)}


class DockerExecTarget(ExecTarget):
    """``docker exec`` in a running container (``--exec docker:CONTAINER``).

    ``client``: a ``docker.DockerClient`` (default ``docker.from_env()``, which reads
    ``DOCKER_HOST``). ``logs("app")`` or ``logs(<container name>)`` is the container's log.
    """

    kind = "docker"

    def __init__(self, container: str, client: Any = None):
        self.name = container
        self._own_client = client is None
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            if client is None:
                import docker

                client = docker.from_env()
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is one message
            raise ExecTargetError(
                f"--exec docker:{container}: cannot reach the Docker engine at {where}: {exc}"
            ) from None
        self.client = client
        try:
            self.container = client.containers.get(container)
        except Exception as exc:  # noqa: BLE001 - NotFound, APIError
            self.close()
            if type(exc).__name__ == "NotFound":
                raise ExecTargetError(
                    f"--exec docker:{container}: no container named {container!r} on the Docker engine at {where}"
                ) from None
            raise ExecTargetError(f"--exec docker:{container}: {exc}") from None
        if self.container.status != "running":
            self.close()
            raise ExecTargetError(f"--exec docker:{container}: the container is {self.container.status}, not running")
        from saasbench.environments.docker import container_shell

        self.shell = container_shell(client, self.container)
        self.workdir = (self.container.attrs.get("Config") or {}).get("WorkingDir") or "/"

    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        from saasbench.environments.docker import exec_in_container

        workdir = posixpath.join(self.workdir, cwd) if cwd else None
        return exec_in_container(self.client, self.container, [self.shell, cmd], timeout_s, env, workdir)

    def logs(self, name: str, tail: int = 200) -> str:
        if name not in ("app", self.name, self.container.name):
            raise KeyError(name)
        try:
            return self.container.logs(tail=tail).decode("utf-8", errors="replace").rstrip("\n")
        except Exception as exc:  # noqa: BLE001 - the engine's error, as an EnvError
            raise EnvError(f"cannot read the logs of {self.name}: {exc}") from None

    def base_env(self) -> dict[str, str]:
        out = {}
        for item in (self.container.attrs.get("Config") or {}).get("Env") or []:
            key, _, value = item.partition("=")
            out[key] = value
        return out

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "container": self.name, "shell": self.shell}

    def close(self) -> None:
        if self._own_client:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing never hides a result
                pass


def make_exec_target(spec: str, *, docker_client: Any = None) -> ExecTarget:
    """``local:DIR`` or ``docker:CONTAINER`` -> a target. Raises :class:`ExecTargetError`."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest or kind not in ("local", "docker"):
        raise ExecTargetError(f"--exec {spec!r}: expected local:DIR or docker:CONTAINER")
    return LocalExecTarget(rest) if kind == "local" else DockerExecTarget(rest, client=docker_client)


def exec_target_of(ctx: Any, code: str) -> Any:
    """What P12/P21 run through: the explicit exec target, else the trial's environment; raises
    :class:`NoExecTarget` (the node is ERROR) when there is neither."""
    target = ctx.target
    found = getattr(target, "exec_target", None) or getattr(target, "environment", None)
    if found is None:
        raise NoExecTarget(NO_EXEC_TARGET.format(code=code))
    return found


# --- exec variables ----------------------------------------------------------------------------------
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expand(text: str, lookup: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: lookup.get(m.group(1) or m.group(2), ""), text)


def _words(line: str, where: str) -> list[list[tuple[str, bool]]]:
    """Split a line like a shell does: words of (text, expandable) pieces; quotes removed, ``#``
    starts a comment at a word's start. Single quotes are literal; double quotes and bare text
    expand ``$VAR`` (``\\$`` does not)."""
    words: list[list[tuple[str, bool]]] = []
    cur: list[tuple[str, bool]] | None = None
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch in " \t":
            if cur is not None:
                words.append(cur)
                cur = None
            i += 1
            continue
        if ch == "#" and cur is None:
            break
        if cur is None:
            cur = []
        if ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ExecTargetError(f"{where}: unterminated single quote")
            cur.append((line[i + 1 : end], False))
            i = end + 1
        elif ch == '"':
            i += 1
            buf = ""
            while i < n and line[i] != '"':
                if line[i] == "\\" and i + 1 < n and line[i + 1] in '"\\$`':
                    cur.append((buf, True))
                    cur.append((line[i + 1], False))
                    buf = ""
                    i += 2
                    continue
                buf += line[i]
                i += 1
            if i >= n:
                raise ExecTargetError(f"{where}: unterminated double quote")
            cur.append((buf, True))
            i += 1
        elif ch == "\\" and i + 1 < n:
            cur.append((line[i + 1], False))
            i += 2
        else:
            j = i
            while j < n and line[j] not in " \t'\"\\":
                j += 1
            cur.append((line[i:j], True))
            i = j
    if cur is not None:
        words.append(cur)
    return words


def parse_env_file(path: str | Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables of a shell env file, without executing it.

    Lines: blank, ``# comment``, ``K=V`` or ``export K=V [K2=V2 ...]`` with shell quoting
    (``"..."`` expands, ``'...'`` is literal). ``$VAR``/``${VAR}`` expand against the file's
    earlier assignments, then ``base`` (an unknown name expands to empty, as in a shell). Any other
    line (a command, a function) raises :class:`ExecTargetError` naming the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExecTargetError(f"cannot read exec env file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_env_assignments(text, base, source=str(path))


def parse_env_assignments(text: str, base: Mapping[str, str] | None = None, *, source: str = "<env>") -> dict[str, str]:
    """:func:`parse_env_file` on a string."""
    out: dict[str, str] = {}
    lookup: dict[str, str] = dict(base or {})
    for number, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        words = _words(raw.strip(), where)
        if not words:
            continue
        if words[0] == [("export", True)]:
            words = words[1:]
            if not words:
                continue
        for word in words:
            first, expandable = word[0]
            if "=" not in first or not expandable:
                raise ExecTargetError(
                    f"{where}: not a K=V assignment: {raw.strip()[:120]!r} (the file is parsed, not run)"
                )
            name, _, rest = first.partition("=")
            if not NAME_RE.fullmatch(name):
                raise ExecTargetError(f"{where}: {name!r} is not a variable name")
            value = "".join(_expand(t, lookup) if exp else t for t, exp in [(rest, True), *word[1:]])
            out[name] = lookup[name] = value
    return out


def parse_env_options(items: list[str]) -> dict[str, str]:
    """``--exec-env K=V`` items (values literal). Raises :class:`ExecTargetError`."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not NAME_RE.fullmatch(name):
            raise ExecTargetError(f"--exec-env {item!r}: expected NAME=VALUE with NAME a variable name")
        out[name] = value
    return out


# --- a task's declared variables (trials) ------------------------------------------------------------
def environment_base_env(env: Environment | None) -> dict[str, str]:
    """What ``$VAR`` in a task's exec_env_file expands against in a trial: the variables the
    environment's commands inherit (:meth:`Environment.base_env`: the host allowlist for the local
    backend, the app container's own environment for Docker) plus the environment's service
    variables (PORT, DATABASE_PATH, ...)."""
    if env is None:
        return {}
    base = dict(env.base_env())
    try:
        base.update(env.service_env())
    except Exception:  # noqa: BLE001 - an environment not started
        pass
    return base


def task_exec_env(task: Any, env: Environment | None = None) -> dict[str, str]:
    """A task's declared exec variables for a trial: ``exec_env_file`` (parsed against
    :func:`environment_base_env`) overlaid with ``exec_env``. A bad file raises TaskDefect."""
    from saasbench.failures import TaskDefect

    out: dict[str, str] = {}
    path = task.exec_env_path
    if path is not None:
        try:
            out = parse_env_file(path, environment_base_env(env))
        except ExecTargetError as exc:
            raise TaskDefect(f"task {task.id}: {exc}") from None
    out.update(task.spec.exec_env)
    return out
