"""Environments: where one trial of one task runs (workspace, commands, services).

:class:`Environment` is the one interface every backend implements (the local backend here; a
Docker backend later). Agents, the trial and the container primitives (P12, P21) only use it.
:func:`self_check` is the conformance suite every backend must pass.

Contract (limits are part of it):

- ``exec`` runs ``bash -c <cmd>`` in the workspace. stdout and stderr are each capped at
  :data:`MAX_OUTPUT_BYTES` (1 MiB): the first 1 MiB is kept, the rest is read and discarded,
  and ``ExecResult.truncated`` says so. On timeout the whole process group is killed and
  ``timed_out`` is true, ``exit_code`` is 124 (as coreutils ``timeout``).
- File paths are relative to the workspace. An absolute path is accepted only inside the
  workspace; a path that leaves it (absolute elsewhere, ``..``, a symlink pointing out) raises
  :class:`PathEscape` (the same rule as the file primitives). Files are capped at
  :data:`MAX_FILE_BYTES` (100 MiB) on read and write (:class:`FileTooLarge`).
- ``start_service`` runs a long-lived command in its own process group with its output in a
  log file outside the workspace; ``wait_healthy`` polls a URL until it answers 2xx/3xx and
  raises :class:`ServiceError` with the service's last log lines when it does not.
- ``stop`` is idempotent and kills every process group the environment started, and only
  those (never by name).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saasbench import failures as _failures
from saasbench.services.workspace import Entry, PathEscape, Workspace, confine

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task

MAX_OUTPUT_BYTES = 1024 * 1024
MAX_FILE_BYTES = 100 * 1024 * 1024
TIMEOUT_EXIT_CODE = 124
LOG_TAIL_ON_ERROR = 30
# Host variables a local command inherits; everything else (API keys, tokens) stays out.
PASSTHROUGH_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "TERM",
    "SHELL",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_OUTPUT_BYTES",
    "AppStart",
    "EnvError",
    "Environment",
    "ExecResult",
    "FileTooLarge",
    "LocalEnvironment",
    "PathEscape",
    "Service",
    "ServiceError",
    "free_port",
    "pid_alive",
    "self_check",
    "start_app",
]


# The one EnvError (saasbench.failures): an environment that cannot do what was asked (start, exec,
# file access) is the retryable env_error outcome wherever it surfaces.
EnvError = _failures.EnvError


class ServiceError(EnvError):
    """A service did not start or did not become healthy; ``log_tail`` holds its last log lines."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- last log lines ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class FileTooLarge(EnvError):
    pass


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # stdout or stderr exceeded MAX_OUTPUT_BYTES and was cut

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class Service:
    name: str
    command: str
    pid: int
    port: int | None
    log_path: Path
    process: Any = field(default=None, repr=False)

    @property
    def pgid(self) -> int:
        return self.pid  # started with start_new_session: the leader's pid is the group id


class Environment(ABC):
    """One trial's environment. Use as a context manager: ``with env: ...`` starts and stops it."""

    kind: str = "abstract"

    # --- lifecycle ---------------------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Create the workspace and the services the task needs before the agent (databases)."""

    @abstractmethod
    def stop(self) -> None:
        """Kill every process this environment started and release its resources. Idempotent."""

    def __enter__(self) -> Environment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- where things are --------------------------------------------------------------------
    @property
    @abstractmethod
    def workspace_path(self) -> str:
        """The workspace as commands run by :meth:`exec` see it (``/app`` in a container)."""

    @property
    @abstractmethod
    def app_port(self) -> int:
        """The port the app must listen on (what services get as ``$PORT``)."""

    @property
    @abstractmethod
    def base_url(self) -> str:
        """The URL the evaluator uses to reach the app (no trailing slash)."""

    @property
    def db_dsn(self) -> str | None:
        """The app database as the evaluator reaches it (``sqlite:////abs/path.db``, ...); None without one."""
        return None

    def service_env(self) -> dict[str, str]:
        """Variables every started service and exec'd command receives (PORT, DATABASE_PATH, ...)."""
        return {}

    # --- commands and files ------------------------------------------------------------------
    @abstractmethod
    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        """Run ``bash -c cmd`` (cwd: the workspace, or ``cwd`` relative to it) and wait at most ``timeout_s``.

        Processes the command leaves in the background are killed when it returns (start
        long-lived ones with :meth:`start_service`). Never raises for a failing command: a non-zero exit, a timeout (exit 124, ``timed_out``)
        and truncated output (each stream capped at 1 MiB) are all in the result.
        Raises :class:`PathEscape` for a ``cwd`` outside the workspace, FileNotFoundError for a
        ``cwd`` that does not exist.
        """

    @abstractmethod
    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """A workspace file's bytes (at most ``limit``). FileNotFoundError, PathEscape, FileTooLarge."""

    @abstractmethod
    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        """Create or replace a workspace file (parents created; ``mode`` e.g. 0o755 sets its
        permissions). PathEscape, FileTooLarge."""

    @abstractmethod
    def list_files(self, path: str = ".") -> list[Entry]:
        """Entries of a workspace directory in name order ([] when it does not exist)."""

    def workspace(self) -> Workspace | None:
        """A host view of the workspace for the file primitives, when the backend has one."""
        return None

    # --- services ----------------------------------------------------------------------------
    @abstractmethod
    def start_service(
        self,
        name: str,
        command: str,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        cwd: str | None = None,
    ) -> Service:
        """Start ``bash -c command`` in the background (its own process group), output to its log.

        ``port`` (default :attr:`app_port`) is given as ``$PORT``/``$APP_PORT``. Raises
        :class:`ServiceError` when a service of that name is already running.
        """

    def wait_healthy(self, url: str, deadline_s: float, service: str | None = None) -> None:
        """Poll ``url`` until it answers 2xx/3xx. Raises :class:`ServiceError` (with ``service``'s
        last log lines) when ``deadline_s`` passes or the service process exits first.

        One loop for every backend; a backend tells whether a service has exited through
        :meth:`_service_exit_code`."""
        import httpx

        end = time.monotonic() + deadline_s
        last = "no answer yet"
        with httpx.Client(timeout=2.0, follow_redirects=False, trust_env=False) as client:
            while True:
                code = self._service_exit_code(service) if service else None
                if code is not None:
                    raise ServiceError(
                        f"service {service!r} exited with code {code} before {url} answered", self._log_tail(service)
                    )
                try:
                    r = client.get(url)
                    if 200 <= r.status_code < 400:
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__ + (f": {exc}" if str(exc) else "")
                if time.monotonic() >= end:
                    break
                time.sleep(min(0.25, max(0.0, end - time.monotonic())))
        raise ServiceError(
            f"{url} not healthy after {deadline_s:g}s (last: {last})", self._log_tail(service) if service else ""
        )

    def _service_exit_code(self, name: str) -> int | None:
        """The exit code of a service started with :meth:`start_service` that has exited; None while it
        runs or when ``name`` is not such a service. Backends override it; the default knows none."""
        return None

    def _log_tail(self, name: str) -> str:
        with contextlib.suppress(KeyError, EnvError):
            return self.logs(name, LOG_TAIL_ON_ERROR)
        return ""

    @abstractmethod
    def logs(self, name: str, tail: int = 200) -> str:
        """The last ``tail`` lines of a service's log. KeyError for an unknown service."""

    @abstractmethod
    def stop_service(self, name: str) -> None:
        """Stop one service (its whole process group). Unknown or stopped: no-op."""


# --- helpers -------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid`` (Linux /proc; elsewhere the group leader probe)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                rest = fh.read().rsplit(b")", 1)[1].split()
            if int(rest[2]) == pgid and rest[0] not in (b"Z", b"X"):
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _kill_group(pgid: int, grace_s: float = 3.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM the group, wait up to ``grace_s``, then SIGKILL whatever is left; reap the leader."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not group_members(pgid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if leader is not None:
        try:
            leader.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _CappedReader(threading.Thread):
    """Drain a pipe, keep the first ``cap`` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def run(self) -> None:
        try:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                room = self.cap - self.kept
                if room > 0:
                    self.chunks.append(chunk[:room])
                    self.kept += min(room, len(chunk))
                if len(chunk) > room:
                    self.truncated = True
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def run_group(
    argv: list[str],
    timeout_s: float,
    *,
    cwd: str | Path,
    env: Mapping[str, str],
    running: dict[int, subprocess.Popen] | None = None,
    lock: threading.Lock | None = None,
) -> ExecResult:
    """Run ``argv`` in its own process group with the :meth:`Environment.exec` contract: each
    stream capped at :data:`MAX_OUTPUT_BYTES`, exit 124 and the whole group killed on timeout,
    whatever the command left in the background killed when it returns. ``running`` (guarded by
    ``lock``) holds the process while it runs, so an owner's ``stop()`` can kill it."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    guard = lock if lock is not None else contextlib.nullcontext()
    if running is not None:
        with guard:
            running[proc.pid] = proc
    out, err = _CappedReader(proc.stdout, MAX_OUTPUT_BYTES), _CappedReader(proc.stderr, MAX_OUTPUT_BYTES)
    out.start()
    err.start()
    timed_out = False
    try:
        proc.wait(timeout=max(0.01, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
    # the group may outlive the leader (a backgrounded child): it is the command's, so it goes too
    if timed_out or group_members(proc.pid):
        _kill_group(proc.pid, grace_s=0.0 if timed_out else 0.2, leader=proc)
    for reader in (out, err):
        reader.join(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass
    if running is not None:
        with guard:
            running.pop(proc.pid, None)
    code = TIMEOUT_EXIT_CODE if timed_out else (proc.returncode if proc.returncode is not None else -1)
    return ExecResult(
        exit_code=code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:]) if lines > 0 else ""


# --- the local backend -------------------------------------------------------------------------------
class HostFolderFiles:
    """File access for backends whose workspace is a folder on this host (local, Docker bind mount).

    Subclasses provide ``_require()`` (the workspace folder) and ``_host_path(path)`` (the path
    confined to it, raising PathEscape otherwise); the limits are those of :class:`Environment`.
    """

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        host = self._host_path(path)
        size = os.stat(host).st_size
        cap = MAX_FILE_BYTES if limit is None else min(limit, MAX_FILE_BYTES)
        if limit is None and size > MAX_FILE_BYTES:
            raise FileTooLarge(f"{path}: {size} bytes is over the {MAX_FILE_BYTES}-byte limit")
        with open(host, "rb") as fh:
            return fh.read(cap)

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if len(payload) > MAX_FILE_BYTES:
            raise FileTooLarge(f"{path}: {len(payload)} bytes is over the {MAX_FILE_BYTES}-byte limit")
        host = self._host_path(path)
        if host == self._require():
            raise IsADirectoryError(f"{path!r} is the workspace itself")
        host.parent.mkdir(parents=True, exist_ok=True)
        host = self._host_path(path)  # again: a parent created just now must not lead out either
        tmp = host.with_name(f".{host.name}.saasbench-tmp")
        tmp.write_bytes(payload)
        if mode is not None:
            os.chmod(tmp, mode & 0o7777)
        os.replace(tmp, host)

    def list_files(self, path: str = ".") -> list[Entry]:
        ws = self._require()
        rel = os.path.relpath(os.path.realpath(self._host_path(path)), ws)
        return Workspace(ws).listdir(confine(rel))

    def workspace(self) -> Workspace:  # type: ignore[override]
        return Workspace(self._require())


class LocalEnvironment(HostFolderFiles, Environment):
    """A trial on this host: a fresh workspace folder, processes in their own groups, SQLite.

    No isolation beyond a separate folder, a free port on 127.0.0.1 and a filtered environment
    (only :data:`PASSTHROUGH_ENV` host variables are inherited): use it for tasks and agents you
    trust (oracle, nop, the demo task), a container backend otherwise.

    ``workspace_root``: use this folder (created if missing, kept on stop) instead of a fresh
    temporary one (removed on stop unless ``keep``). Logs live in a separate temporary state
    folder, outside the workspace, so the file primitives never see them.
    """

    kind = "local"

    def __init__(
        self,
        task: Task | None = None,
        workspace_root: str | Path | None = None,
        *,
        keep: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
    ):
        self.task = task
        self._given_root = Path(workspace_root) if workspace_root is not None else None
        self.keep = keep
        self.host = host
        self._port = port
        self._ws: Path | None = None
        self._state: Path | None = None
        self._tmp_ws = False
        self._services: dict[str, Service] = {}
        self._running_execs: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        if self._stopped:
            raise EnvError("this environment was stopped; create a new one per trial")
        if self._given_root is not None:
            self._given_root.mkdir(parents=True, exist_ok=True)
            self._ws = Path(os.path.realpath(self._given_root))
        else:
            prefix = f"saasbench-{self.task.id}-" if self.task is not None else "saasbench-"
            self._ws = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix + "ws-")))
            self._tmp_ws = True
        if self._tmp_ws and not self.keep:  # safety net for an environment that is never stopped
            weakref.finalize(self, shutil.rmtree, str(self._ws), True)
        if self._port is None:
            self._port = free_port(self.host)
        db = self._sqlite_path()
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        self._started = True

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with self._lock:
            services = list(self._services.values())
            execs = list(self._running_execs.items())
        for svc in services:
            _kill_group(svc.pgid, leader=svc.process)
        for pgid, proc in execs:
            _kill_group(pgid, grace_s=0.5, leader=proc)
        if self._tmp_ws and not self.keep and self._ws is not None:
            shutil.rmtree(self._ws, ignore_errors=True)
        if self._state is not None and not self.keep:
            shutil.rmtree(self._state, ignore_errors=True)

    def _require(self) -> Path:
        if not self._started or self._ws is None:
            raise EnvError("environment not started (call start() or use it as a context manager)")
        if self._stopped:
            raise EnvError("environment already stopped")
        return self._ws

    # --- where things are ------------------------------------------------------------------------
    @property
    def workspace_path(self) -> str:
        return str(self._require())

    @property
    def workspace_dir(self) -> Path:
        return self._require()

    @property
    def state_dir(self) -> Path:
        """A private folder outside the workspace (service logs), created on first use."""
        self._require()
        if self._state is None:
            self._state = Path(tempfile.mkdtemp(prefix="saasbench-state-"))
            (self._state / "logs").mkdir()
            if not self.keep:
                weakref.finalize(self, shutil.rmtree, str(self._state), True)
        return self._state

    @property
    def app_port(self) -> int:
        self._require()
        assert self._port is not None
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.app_port}"

    def _sqlite_path(self) -> Path | None:
        db = self.task.spec.database if self.task is not None else None
        if db is None or db.engine.lower() not in ("sqlite", "sqlite3"):
            return None
        assert self._ws is not None
        rel = confine(db.path or "data/app.db", "database.path")
        return self._ws / rel

    @property
    def db_path(self) -> Path | None:
        self._require()
        return self._sqlite_path()

    @property
    def db_dsn(self) -> str | None:
        path = self.db_path
        return f"sqlite:///{path}" if path is not None else None

    def service_env(self) -> dict[str, str]:
        declared = (self.task.spec.environment.get("env") if self.task is not None else None) or {}
        out = {str(k): str(v) for k, v in declared.items()} if isinstance(declared, dict) else {}
        out |= {
            "PORT": str(self.app_port),
            "APP_PORT": str(self.app_port),
            "HOST": self.host,
            "SAASBENCH_WORKSPACE": self.workspace_path,
        }
        db = self.db_path
        if db is not None:
            out["DATABASE_PATH"] = str(db)
            out["DATABASE_URL"] = f"sqlite:///{db}"
        return out

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        env.update(self.service_env())
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        return env

    def _host_path(self, path: str, what: str = "path") -> Path:
        ws = self._require()
        text = str(path)
        if text.startswith("/"):
            real = os.path.realpath(text)
            if real != str(ws) and not real.startswith(str(ws) + os.sep):
                raise PathEscape(f"{what} {path!r} is outside the workspace {ws}")
            text = os.path.relpath(real, ws)
        rel = confine(text, what)
        host = ws / rel if rel != "." else ws
        real = Path(os.path.realpath(host))
        if real != ws and ws not in real.parents:
            raise PathEscape(f"{what} {path!r} resolves outside the workspace (symlink)")
        return host

    # --- commands and files ------------------------------------------------------------------------
    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        workdir = self._host_path(cwd or ".", "cwd")
        return run_group(
            ["bash", "-c", cmd],
            timeout_s,
            cwd=workdir,
            env=self._env(env),
            running=self._running_execs,
            lock=self._lock,
        )

    # --- services ---------------------------------------------------------------------------------
    def start_service(
        self,
        name: str,
        command: str,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        cwd: str | None = None,
    ) -> Service:
        workdir = self._host_path(cwd or ".", "cwd")
        with self._lock:
            old = self._services.get(name)
        if old is not None and old.process is not None and old.process.poll() is None:
            raise ServiceError(f"service {name!r} is already running (pid {old.pid})")
        port = port if port is not None else self.app_port
        merged = self._env(env)
        merged.update({"PORT": str(port), "APP_PORT": str(port)})
        log_path = self.state_dir / "logs" / f"{_safe(name)}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=workdir,
                env=merged,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        svc = Service(name=name, command=command, pid=proc.pid, port=port, log_path=log_path, process=proc)
        with self._lock:
            self._services[name] = svc
        return svc

    def services(self) -> dict[str, Service]:
        with self._lock:
            return dict(self._services)

    def _service_exit_code(self, name: str) -> int | None:
        svc = self._services.get(name)
        if svc is None or svc.process is None:
            return None
        return svc.process.poll()

    def logs(self, name: str, tail: int = 200) -> str:
        svc = self._services.get(name)
        if svc is None:
            raise KeyError(f"no service {name!r} (known: {', '.join(sorted(self._services)) or 'none'})")
        return _tail(svc.log_path, tail)

    def stop_service(self, name: str) -> None:
        svc = self._services.get(name)
        if svc is not None:
            _kill_group(svc.pgid, leader=svc.process)


def _safe(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "service"


# --- the deployment contract ------------------------------------------------------------------------
@dataclass
class AppStart:
    """What :func:`start_app` found: the base URL when healthy, else the error and log tail."""

    ok: bool
    base_url: str
    error: str | None = None
    log_tail: str = ""
    elapsed_s: float = 0.0


def start_app(task: Task, env: Environment, *, command: str | None = None, deadline_s: float | None = None) -> AppStart:
    """Start the app the agent built: ``app.start_command`` in the workspace, then wait for health.

    The command (default: the task's ``app.start_command``, e.g. ``bash run.sh``) runs as the
    service ``app`` with ``$PORT``/``$DATABASE_PATH`` set; a task whose start_command is None
    expects the agent to leave the app running, so only the health wait happens. Never raises
    for the app's failure: the result carries the error and the last log lines.
    """
    t0 = time.monotonic()
    command = command if command is not None else task.spec.app.start_command
    deadline = deadline_s if deadline_s is not None else task.spec.timeouts.health_s
    url = env.base_url.rstrip("/") + "/" + task.spec.app.health_path.lstrip("/")
    service = None
    if command:
        try:
            env.start_service("app", command)
            service = "app"
        except (ServiceError, OSError) as exc:
            return AppStart(
                False, env.base_url, f"cannot start the app with {command!r}: {exc}", elapsed_s=time.monotonic() - t0
            )
    try:
        env.wait_healthy(url, deadline, service=service)
    except ServiceError as exc:
        first = str(exc).split("\n--- last log lines ---", 1)[0]
        return AppStart(False, env.base_url, first, exc.log_tail, elapsed_s=time.monotonic() - t0)
    return AppStart(True, env.base_url, elapsed_s=time.monotonic() - t0)


# --- conformance suite -------------------------------------------------------------------------------
_HEALTH_SERVER = r"""
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
print("self-check server on", os.environ["PORT"], flush=True)
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def self_check(env: Environment, *, python: str = "python3") -> list[str]:
    """Conformance suite every backend must pass; returns failures (empty list = conforming).

    ``env`` must be started and its workspace empty enough to write ``selfcheck/`` into. Checks:
    exec exit codes, stdout/stderr separation, env and cwd, the 1 MiB output cap, timeouts,
    file round trip (text and binary), path confinement, list_files, and a service that starts,
    becomes healthy, logs, and leaves no process behind once stopped.
    """
    failures: list[str] = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)

    r = env.exec("echo out; echo err >&2; exit 3", timeout_s=30)
    check(
        r.exit_code == 3 and r.stdout == "out\n" and r.stderr == "err\n" and not r.timed_out,
        f"exec exit code/streams: {r!r}",
    )
    check(env.exec("true", timeout_s=30).ok, "exec true is ok")
    r = env.exec('printf "%s" "$SELFCHECK_VAR"', timeout_s=30, env={"SELFCHECK_VAR": "v1"})
    check(r.stdout == "v1", f"exec env var: {r.stdout!r}")
    r = env.exec("pwd -P", timeout_s=30)
    check(
        os.path.realpath(r.stdout.strip()) == os.path.realpath(env.workspace_path),
        f"exec cwd is the workspace: {r.stdout!r}",
    )
    r = env.exec("head -c 3000000 /dev/zero | tr '\\0' 'x'", timeout_s=60)
    check(
        r.truncated and len(r.stdout.encode()) == MAX_OUTPUT_BYTES and r.exit_code == 0,
        f"output cap: {len(r.stdout)} bytes, truncated={r.truncated}",
    )
    t0 = time.monotonic()
    r = env.exec("sleep 30", timeout_s=0.5)
    check(r.timed_out and r.exit_code == TIMEOUT_EXIT_CODE and time.monotonic() - t0 < 10, f"timeout: {r!r}")

    env.write_file("selfcheck/a.txt", "héllo\n")
    check(env.read_file("selfcheck/a.txt") == "héllo\n".encode(), "text round trip")
    blob = bytes(range(256)) * 10
    env.write_file("selfcheck/bin/b.dat", blob)
    check(env.read_file("selfcheck/bin/b.dat") == blob, "binary round trip")
    check(env.read_file("selfcheck/bin/b.dat", limit=10) == blob[:10], "read limit")
    check(env.exec("cat selfcheck/a.txt", timeout_s=30).stdout == "héllo\n", "exec sees written files")
    env.exec("mkdir -p selfcheck/made && echo made > selfcheck/made/c.txt", timeout_s=30)
    check(env.read_file("selfcheck/made/c.txt") == b"made\n", "read sees files made by exec")
    names = [e.name for e in env.list_files("selfcheck")]
    check(names == ["a.txt", "bin", "made"], f"list_files: {names}")
    try:
        env.read_file("selfcheck/missing.txt")
        failures.append("reading a missing file must raise FileNotFoundError")
    except FileNotFoundError:
        pass
    for bad in ("../escape.txt", "/etc/passwd", "selfcheck/../../x"):
        for op in ("read", "write"):
            try:
                env.read_file(bad) if op == "read" else env.write_file(bad, "x")
                failures.append(f"{op} {bad!r} must raise PathEscape")
            except PathEscape:
                pass
            except Exception as exc:  # noqa: BLE001 - the wrong exception is a failure too
                failures.append(f"{op} {bad!r} raised {type(exc).__name__}, not PathEscape")
    env.exec("ln -s / selfcheck/rootlink", timeout_s=30)
    try:
        env.read_file("selfcheck/rootlink/etc/hostname")
        failures.append("reading through a symlink out of the workspace must raise PathEscape")
    except PathEscape:
        pass
    except FileNotFoundError:
        failures.append("symlink escape raised FileNotFoundError, not PathEscape")

    env.write_file("selfcheck/server.py", _HEALTH_SERVER)
    svc = env.start_service("selfcheck", f"{python} selfcheck/server.py & wait")
    try:
        url = f"http://127.0.0.1:{svc.port}/health" if env.kind == "local" else env.base_url + "/health"
        env.wait_healthy(url, 20, service="selfcheck")
        check("self-check server on" in env.logs("selfcheck", 10), "service log captured")
    except ServiceError as exc:
        failures.append(f"service did not become healthy: {exc}")
    members_before = group_members(svc.pgid) if env.kind == "local" else []
    env.stop_service("selfcheck")
    if env.kind == "local":
        check(len(members_before) >= 2, f"service group should hold bash and its child: {members_before}")
        left = [p for p in members_before if pid_alive(p)]
        check(not left and not group_members(svc.pgid), f"processes left after stop_service: {left}")
    try:
        env.wait_healthy(f"http://127.0.0.1:{svc.port}/" if env.kind == "local" else env.base_url, 0.5)
        failures.append("service still answers after stop_service")
    except ServiceError:
        pass
    env.exec("rm -rf selfcheck", timeout_s=30)
    return failures
