"""The environment interface: what every backend implements and the only thing callers may use.

:class:`Environment` is the one interface of where a trial runs (the local backend,
:mod:`saasbench.environments.local`; Docker, :mod:`saasbench.environments.docker`). Agents, the
trial, the gateway, the receivers and the container primitives (P12, P21) use only what it
declares: a question a caller has about an environment ("do its commands run on this host?",
"where do its containers reach the host?") is a member here with a default, never a comparison
of :attr:`Environment.kind` (a label for the lake and reports). A new backend registers itself in
``saasbench/environments/__init__.py``, overrides the members whose default does not fit, and
passes :func:`self_check_backend` (CONTRIBUTING.md, recipe 3).

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
  those (never by name). A stopped environment is not started again (one per trial).

Also here, because they work on any backend: :class:`HostFolderFiles` (file access for a backend
whose workspace is a folder on this host), :func:`start_app` (the deployment contract) and the
conformance suite (:func:`self_check`, :func:`self_check_backend`).
"""

from __future__ import annotations

import contextlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
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

__all__ = [
    "LOG_TAIL_ON_ERROR",
    "MAX_FILE_BYTES",
    "MAX_OUTPUT_BYTES",
    "TIMEOUT_EXIT_CODE",
    "AppStart",
    "EnvError",
    "Environment",
    "ExecResult",
    "FileTooLarge",
    "HostFolderFiles",
    "INSTALL_ENV",
    "PathEscape",
    "Service",
    "ServiceError",
    "check_declared",
    "group_members",
    "install_env",
    "is_secret_name",
    "pid_alive",
    "self_check",
    "self_check_backend",
    "start_app",
]


# The one EnvError (saasbench.failures): an environment that cannot do what was asked (start, exec,
# file access) is the retryable env_error outcome wherever it surfaces.
EnvError = _failures.EnvError

# Host variables an agent's install command gets on every backend (``Agent.install``: npm, pip, uv
# behind a proxy or a private registry, with a corporate CA): proxies, CA bundles, package indexes.
# Only installs get them (the agent's own run and the app do not: a proxy would also catch their
# calls to the model gateway); provider keys never (no name here holds one, and
# :func:`install_env` drops secret-looking names anyway). On the Docker backend the values are
# used as they are: a proxy on the host's 127.0.0.1 is not reachable from a container.
INSTALL_ENV: tuple[str, ...] = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "npm_config_registry",
    "NPM_CONFIG_REGISTRY",
    "npm_config_cafile",
    "NPM_CONFIG_CAFILE",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
)
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")


def is_secret_name(name: str) -> bool:
    """Whether a variable name looks like it holds a secret (API keys, tokens, passwords)."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def install_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`INSTALL_ENV` variables set in ``environ`` (default: this process's environment),
    minus secret-looking names: what an install command adds to its environment's own variables."""
    source = os.environ if environ is None else environ
    return {k: source[k] for k in INSTALL_ENV if source.get(k) and not is_secret_name(k)}


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
    """One trial's environment. Use as a context manager: ``with env: ...`` starts and stops it.

    Abstract members are what every backend must do; the others have defaults that fit a backend
    whose commands run in an isolated container without extras, and a backend overrides the ones
    that do not fit it. Callers never ask :attr:`kind`: they ask the member that answers their
    question (:attr:`runs_on_host`, :attr:`gateway_ip`, :attr:`container_name`, ...).
    """

    kind: str = "abstract"
    """The backend's name as a label: the lake's ``backend`` column, reports, P12 evidence. Never
    a branch condition (ask the member that answers the question instead)."""

    task: Task | None = None
    """The task this environment was created for (None for an ad-hoc one). The oracle agent copies
    its reference implementation from it; backends read its database and declared variables."""

    runs_on_host: bool = False
    """Whether commands (:meth:`exec`) and services run as processes of this host, in its network
    and filesystem: then 127.0.0.1 reaches the model gateway and the receivers (no relay), a host
    path such as the task folder exists for the agent (the anti-cheat forbids it), and an agent's
    run folder can live on the host. False (the default) for a container backend."""

    isolated: bool = True
    """Whether the agent's commands and the app run where they cannot reach the harness, the model
    gateway, the task folder or other trials (a container; the local backend's bubblewrap sandbox).
    False for the local backend without a sandbox: see :meth:`check_untrusted_agent`."""

    trial_id: str | None = None
    """The id under which another process finds this environment's resources (``saasbench env
    exec/down TRIAL`` for Docker); None when nothing of it is reachable outside this process."""

    # --- lifecycle ---------------------------------------------------------------------------
    def prepare(self) -> dict[str, str]:
        """Build or fetch what :meth:`start` needs (container images) without starting anything: the
        trial's build-env stage, retried on its own. Returns ``{service: image}``; nothing by default."""
        return {}

    @abstractmethod
    def start(self) -> None:
        """Create the workspace and the services the task needs before the agent (databases).
        Idempotent while started. A stopped environment never becomes usable again (one per
        trial): ``start`` then raises :class:`EnvError` or does nothing."""

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
    def workspace_dir(self) -> Path:
        """The workspace as a folder on this host: the trial hashes the integrity paths in it and
        records it, the evaluator's file primitives read it. EnvError when not started."""

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

    @property
    def state_dir(self) -> Path | None:
        """A private host folder outside the workspace that lives as long as the environment (the
        CLI agents keep their run artefacts under it); None when the backend has none (the agent
        then uses a temporary folder)."""
        return None

    @property
    def container_name(self) -> str | None:
        """The name of the container the agent's commands and the app run in, as the prompt names
        it (``docker exec <name> ...``); None to let the prompt use the task's declared name."""
        return None

    @property
    def gateway_ip(self) -> str | None:
        """The host's address as this environment's containers reach it (a trial network's
        gateway): the model gateway's relay for a containerised agent listens there. None when the
        backend has none (with :attr:`runs_on_host` true, 127.0.0.1 serves instead)."""
        return None

    @property
    def receiver_bind_host(self) -> str | None:
        """Where the run's webhook receiver and SMTP sink bind so the app can call them
        (:func:`saasbench.services.receivers.receiver_hosts`); None: their default, 127.0.0.1.
        Default: :attr:`gateway_ip`."""
        return self.gateway_ip

    @property
    def receiver_advertise_host(self) -> str | None:
        """The receivers' address as the app uses it (in ``{{webhook_url}}``, ``{{smtp_host}}``);
        None: the bind address. Default: :attr:`gateway_ip`."""
        return self.gateway_ip

    def service_env(self) -> dict[str, str]:
        """Variables every started service and exec'd command receives (PORT, DATABASE_PATH, ...)."""
        return {}

    def base_env(self) -> dict[str, str]:
        """The variables a command run by :meth:`exec` inherits besides :meth:`service_env` (the host
        allowlist locally, the container's own environment in Docker): what ``$VAR`` in a task's
        ``exec_env_file`` expands against (as :meth:`ExecTarget.base_env
        <saasbench.environments.exec_target.ExecTarget.base_env>`). Never raises; {} by default."""
        return {}

    # --- isolation ----------------------------------------------------------------------------
    def check_untrusted_agent(self, agent: str) -> None:  # noqa: B027 - a hook with a no-op default
        """Raise (a non-retryable :class:`~saasbench.failures.HarnessError`) when an untrusted agent (one
        whose commands a model chooses) may not run here: the local backend without a sandbox, unless
        the operator opted out. Nothing by default (a container isolates)."""

    def expose_host_path(self, path: str | Path, *, writable: bool = False) -> None:  # noqa: B027 - a hook
        """Let later commands use a host folder at its own path (an agent CLI's install folder read-only,
        its run folder read-write), where commands run on this host behind a filter (the local sandbox).
        Nothing by default (container commands never see host paths)."""

    # --- commands and files ------------------------------------------------------------------
    def setup_exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        """A command of the harness's own that prepares the environment (installing an agent CLI), with
        :meth:`exec`'s contract. Where the agent's commands are confined on this host (the local
        sandbox) it runs outside the confinement so it can write the host's tool folders; never use it
        for anything an agent, an app or a task chose. Default: :meth:`exec`."""
        return self.exec(cmd, timeout_s, env=env, cwd=cwd)

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
                if service and code is not None:
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


# --- host processes (the local backend's groups; self_check; Docker's prune asks about owners) ----------
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


# --- backends whose workspace is a host folder ---------------------------------------------------
class HostFolderFiles:
    """File access for backends whose workspace is a folder on this host (local, Docker bind mount).

    Subclasses provide ``_require()`` (the workspace folder) and ``_host_path(path)`` (the path
    confined to it, raising PathEscape otherwise); the limits are those of :class:`Environment`.
    """

    def _require(self) -> Path:
        """The workspace folder; EnvError when the environment is not started or already stopped."""
        raise NotImplementedError

    def _host_path(self, path: str, what: str = "path") -> Path:
        """``path`` (relative, or absolute as commands see it) on the host; PathEscape when it leaves the workspace."""
        raise NotImplementedError

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
    the declared members (:func:`check_declared`), exec exit codes, stdout/stderr separation, env
    and cwd, the 1 MiB output cap, timeouts, file round trip (text and binary) and the host view of
    the workspace (:attr:`Environment.workspace_dir`), path confinement, list_files, and a service
    that starts, becomes healthy, logs, and leaves no process behind once stopped.
    :func:`self_check_backend` adds the lifecycle (start, stop, use after stop).
    """
    failures: list[str] = check_declared(env)

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
    try:
        host = env.workspace_dir
        same = (host / "selfcheck" / "a.txt").read_bytes() == "héllo\n".encode() and (
            host / "selfcheck" / "made" / "c.txt"
        ).read_bytes() == b"made\n"
    except (OSError, EnvError) as exc:
        host, same = None, False
        failures.append(f"workspace_dir: {type(exc).__name__}: {exc}")
    check(same, f"workspace_dir {host} holds what write_file and exec wrote")
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
        url = f"http://127.0.0.1:{svc.port}/health" if env.runs_on_host else env.base_url + "/health"
        env.wait_healthy(url, 20, service="selfcheck")
        check("self-check server on" in env.logs("selfcheck", 10), "service log captured")
    except ServiceError as exc:
        failures.append(f"service did not become healthy: {exc}")
    members_before = group_members(svc.pgid) if env.runs_on_host else []  # host process groups
    env.stop_service("selfcheck")
    if env.runs_on_host:
        check(len(members_before) >= 2, f"service group should hold bash and its child: {members_before}")
        left = [p for p in members_before if pid_alive(p)]
        check(not left and not group_members(svc.pgid), f"processes left after stop_service: {left}")
    try:
        env.wait_healthy(f"http://127.0.0.1:{svc.port}/" if env.runs_on_host else env.base_url, 0.5)
        failures.append("service still answers after stop_service")
    except ServiceError:
        pass
    env.exec("rm -rf selfcheck", timeout_s=30)
    return failures


def _optional(cls: type) -> Callable[[Any], bool]:
    return lambda v: v is None or isinstance(v, cls)


def _str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


# (member, test of its value, what it must be): every member of Environment a caller reads
_DECLARED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("kind", lambda v: isinstance(v, str) and v not in ("", "abstract"), "a backend name"),
    ("runs_on_host", lambda v: isinstance(v, bool), "a bool"),
    ("isolated", lambda v: isinstance(v, bool), "a bool"),
    ("task", lambda v: v is None or hasattr(v, "spec"), "a Task or None"),
    ("trial_id", _optional(str), "a str or None"),
    ("workspace_path", lambda v: isinstance(v, str) and v != "", "a path"),
    ("workspace_dir", lambda v: isinstance(v, Path) and v.is_dir(), "an existing host folder"),
    ("app_port", lambda v: isinstance(v, int) and 0 < v < 65536, "a TCP port"),
    (
        "base_url",
        lambda v: isinstance(v, str) and v.startswith(("http://", "https://")) and not v.endswith("/"),
        "an http(s) URL without a trailing slash",
    ),
    ("db_dsn", _optional(str), "a str or None"),
    ("state_dir", lambda v: v is None or (isinstance(v, Path) and v.is_dir()), "an existing host folder or None"),
    ("container_name", _optional(str), "a str or None"),
    ("gateway_ip", _optional(str), "a str or None"),
    ("receiver_bind_host", _optional(str), "a str or None"),
    ("receiver_advertise_host", _optional(str), "a str or None"),
)


def check_declared(env: Environment) -> list[str]:
    """Failures of the members callers read from a started ``env`` (attributes, properties,
    ``service_env()``, ``base_env()``, ``workspace()``): each must be readable and of its declared type."""
    failures: list[str] = []
    if not isinstance(env, Environment):
        return [f"{type(env).__name__} is not an Environment"]
    for name, ok, what in _DECLARED:
        try:
            value = getattr(env, name)
        except Exception as exc:  # noqa: BLE001 - a member that raises on a started environment is a failure
            failures.append(f"{name} raised {type(exc).__name__}: {exc}")
            continue
        if not ok(value):
            failures.append(f"{name} = {value!r} is not {what}")
    for method in ("service_env", "base_env"):
        try:
            value = getattr(env, method)()
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{method}() raised {type(exc).__name__}: {exc}")
            continue
        if not _str_map(value):
            failures.append(f"{method}() is not a dict of str to str: {value!r}"[:300])
    with contextlib.suppress(Exception):
        if env.service_env().get("PORT") != str(env.app_port):
            failures.append(f"service_env()['PORT'] is not app_port {env.app_port}")
    try:
        ws = env.workspace()
        if ws is not None and (not isinstance(ws, Workspace) or ws.root != Path(os.path.realpath(env.workspace_dir))):
            failures.append(f"workspace() is not a Workspace over workspace_dir: {ws!r}")
    except Exception as exc:  # noqa: BLE001
        failures.append(f"workspace() raised {type(exc).__name__}: {exc}")
    return failures


def self_check_backend(make: Callable[[], Environment], *, python: str = "python3") -> list[str]:
    """Conformance of a backend, from creation to teardown; returns failures (empty list = conforming).

    ``make()`` returns a fresh, not started environment (e.g. ``lambda: create_environment("podman",
    None)``); it is called twice. Checks: it is an :class:`Environment`; no command runs before
    :meth:`~Environment.start`; ``start`` is idempotent; :func:`self_check` on the started
    environment; ``stop`` is idempotent; exec and file access after ``stop`` raise :class:`EnvError`,
    also after another ``start``; ``start`` after a ``stop`` before any start raises EnvError.
    """
    failures: list[str] = []
    env = make()
    if not isinstance(env, Environment):
        return [f"make() returned {type(env).__name__}, not an Environment"]

    def raises_env_error(what: str, call: Callable[[], object]) -> None:
        try:
            call()
            failures.append(f"{what} must raise EnvError")
        except EnvError:
            pass
        except Exception as exc:  # noqa: BLE001 - the wrong exception is a failure too
            failures.append(f"{what} raised {type(exc).__name__}, not EnvError: {exc}")

    raises_env_error("exec before start", lambda: env.exec("true", timeout_s=30))
    with env as entered:
        if entered is not env:
            failures.append("__enter__ must return the environment")
        env.start()  # idempotent while started
        failures += self_check(env, python=python)
    env.stop()  # idempotent
    raises_env_error("exec after stop", lambda: env.exec("true", timeout_s=30))
    raises_env_error("read_file after stop", lambda: env.read_file("x"))
    raises_env_error("write_file after stop", lambda: env.write_file("x", "x"))
    with contextlib.suppress(EnvError):
        env.start()  # refused, or a no-op: a stopped environment never comes back
    raises_env_error("exec after stop and start", lambda: env.exec("true", timeout_s=30))
    never = make()
    never.stop()
    never.stop()
    raises_env_error("start after a stop before start", never.start)
    return failures
