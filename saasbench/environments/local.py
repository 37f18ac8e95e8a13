"""The local backend: a trial on this host, in a fresh workspace folder, with processes in their own groups.

:class:`LocalEnvironment` implements :class:`~saasbench.environments.base.Environment` (the interface,
its contract and the conformance suite live in :mod:`saasbench.environments.base`): a separate
folder, a free port on 127.0.0.1, a filtered environment, and every command and service inside a
bubblewrap sandbox (:mod:`saasbench.environments.sandbox`: its own pid namespace, private /tmp and
$HOME, only the system folders, the toolchains and the workspace visible) when bwrap works here.
Without one (``SAASBENCH_LOCAL_SANDBOX=off``, or bwrap missing) nothing isolates the commands, and
an untrusted agent is refused unless the operator opted out (:meth:`LocalEnvironment.check_untrusted_agent`).
Each environment keeps a ledger for ``saasbench env prune`` (:mod:`saasbench.environments.leftovers`).
Its process machinery (:func:`run_group`, the allowlist :data:`PASSTHROUGH_ENV`) is reused by the
local exec target (:mod:`saasbench.environments.exec_target`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

# Environment stays importable from here for the agents' annotations (agents/*.py)
from saasbench.environments.base import (
    MAX_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    EnvError,
    Environment,
    ExecResult,
    HostFolderFiles,
    PathEscape,
    Service,
    ServiceError,
    group_members,
    is_secret_name,
)
from saasbench.environments.leftovers import ENV_TAG, OWNER_TAG, Ledger, kill_pids, owner_tag, tagged_pids
from saasbench.environments.sandbox import SETTING as SETTING_NAME
from saasbench.environments.sandbox import Sandbox, SandboxUnavailable, probe, refusal, sandbox_mode
from saasbench.services.workspace import confine

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task

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

__all__ = ["PASSTHROUGH_ENV", "LocalEnvironment", "free_port", "host_env", "is_secret_name", "run_group"]


def host_env() -> dict[str, str]:
    """The host variables a local command inherits: the allowlist, minus secret-looking names."""
    return {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ and not is_secret_name(k)}


# --- helpers -------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    watch: Callable[[int, bool], None] | None = None,
) -> ExecResult:
    """Run ``argv`` in its own process group with the :meth:`Environment.exec` contract: each
    stream capped at :data:`MAX_OUTPUT_BYTES`, exit 124 and the whole group killed on timeout,
    whatever the command left in the background killed when it returns. ``running`` (guarded by
    ``lock``) holds the process while it runs, so an owner's ``stop()`` can kill it; ``watch(pgid,
    started)`` is told when the group starts and when it is gone (the environment's ledger)."""
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
    if watch is not None:
        watch(proc.pid, True)
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
            if stream is not None:
                stream.close()
        except OSError:
            pass
    if running is not None:
        with guard:
            running.pop(proc.pid, None)
    if watch is not None:
        watch(proc.pid, False)
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
class LocalEnvironment(HostFolderFiles, Environment):
    """A trial on this host: a fresh workspace folder, processes in their own groups, SQLite.

    Commands (:meth:`exec`) and services run inside the bubblewrap sandbox when it works here
    (:mod:`saasbench.environments.sandbox`): they see the workspace, the system and toolchain
    folders and a private /tmp and $HOME, not the harness, the gateway, the task folder or other
    trials. Only :data:`PASSTHROUGH_ENV` host variables are inherited either way. ``sandbox``: True
    requires it (EnvError-like :class:`SandboxUnavailable` at start when bwrap does not work), False
    runs without it and trusts every agent, None (default) follows ``SAASBENCH_LOCAL_SANDBOX``
    (``auto``: the sandbox when bwrap works, else none, and untrusted agents are refused).
    ``share``: host folders the commands may also read and write (tests, trusted setups).

    ``workspace_root``: use this folder (created if missing, kept on stop) instead of a fresh
    temporary one (removed on stop unless ``keep``). Logs live in a separate temporary state
    folder, outside the workspace, so the file primitives never see them.
    """

    kind = "local"
    runs_on_host = True

    def __init__(
        self,
        task: Task | None = None,
        workspace_root: str | Path | None = None,
        *,
        keep: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
        sandbox: bool | None = None,
        share: Iterable[str | Path] = (),
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
        self._sandbox_choice = sandbox
        self._share = [Path(p) for p in share]
        self._sandbox: Sandbox | None = None
        self._trust_all = False  # the operator opted out of the sandbox: every agent is trusted here
        self._no_sandbox_reason = ""
        self.env_id = secrets.token_hex(6)
        self._ledger: Ledger | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def _sandbox_mode(self) -> str:
        if self._sandbox_choice is not None:
            return "on" if self._sandbox_choice else "off"
        try:
            return sandbox_mode()
        except ValueError as exc:
            raise SandboxUnavailable(str(exc)) from None

    def start(self) -> None:
        if self._started:
            return
        if self._stopped:
            raise EnvError("this environment was stopped; create a new one per trial")
        mode = self._sandbox_mode()
        found = probe() if mode != "off" else None
        if mode == "on" and found is not None and not found.usable:
            raise SandboxUnavailable(
                f"the local sandbox is required but {found.reason}: install bubblewrap (apt-get install "
                "bubblewrap) or use --backend docker"
            )
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
        state = self.state_dir
        if found is not None and found.usable and found.bwrap is not None:
            self._sandbox = Sandbox(
                found.bwrap,
                private=state / "sandbox",
                workspace=self._ws,
                home=os.environ.get("HOME"),
                path_var=os.environ.get("PATH"),
            )
            for folder in self._share:
                self._sandbox.expose(folder, writable=True)
        else:
            self._trust_all = mode == "off"
            self._no_sandbox_reason = f"{SETTING_NAME}=off" if mode == "off" else (found.reason if found else "")
        self._ledger = Ledger(
            self.env_id,
            workspace=self._ws if self._tmp_ws and not self.keep else None,
            state_dir=state if not self.keep else None,
            sandboxed=self._sandbox is not None,
        )

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
        if self._started:  # what left its group (setsid) but kept the environment's tag
            stray = tagged_pids(self.env_id)
            if stray:
                kill_pids(stray, grace_s=1.0)
        if self._tmp_ws and not self.keep and self._ws is not None:
            shutil.rmtree(self._ws, ignore_errors=True)
        if self._state is not None and not self.keep:
            shutil.rmtree(self._state, ignore_errors=True)
        if self._ledger is not None:
            self._ledger.close()

    # --- isolation -----------------------------------------------------------------------------
    @property
    def isolated(self) -> bool:  # type: ignore[override]
        """Whether commands and services run in the sandbox (known once started)."""
        return self._sandbox is not None

    def check_untrusted_agent(self, agent: str) -> None:
        """Refuse (:class:`SandboxUnavailable`) an untrusted agent when the commands run unconfined and the
        operator did not opt out (``SAASBENCH_LOCAL_SANDBOX=off`` or ``sandbox=False``)."""
        self._require()
        if self._sandbox is None and not self._trust_all:
            raise SandboxUnavailable(refusal(agent, self._no_sandbox_reason or "no sandbox"))

    def expose_host_path(self, path: str | Path, *, writable: bool = False) -> None:
        self._require()
        if self._sandbox is not None:
            self._sandbox.expose(path, writable=writable)

    def _watch(self, pgid: int, started: bool) -> None:
        if self._ledger is not None:
            if started:
                self._ledger.add_group(pgid, "exec")
            else:
                self._ledger.drop_group(pgid)

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

    def base_env(self) -> dict[str, str]:
        return host_env()

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        env.update(self.service_env())
        if self._sandbox is not None:
            env["TMPDIR"] = "/tmp"  # the sandbox's private /tmp; the host's TMPDIR is not there
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        env.update({OWNER_TAG: owner_tag(), ENV_TAG: self.env_id})  # what prune looks for after a kill
        return env

    def _argv(self, cmd: str, workdir: Path) -> list[str]:
        argv = ["bash", "-c", cmd]
        return self._sandbox.argv(argv, cwd=workdir) if self._sandbox is not None else argv

    def _host_path(self, path: str, what: str = "path") -> Path:
        ws = self._require()
        text = str(path)
        if text.startswith("/"):
            given = os.path.realpath(text)
            if given != str(ws) and not given.startswith(str(ws) + os.sep):
                raise PathEscape(f"{what} {path!r} is outside the workspace {ws}")
            text = os.path.relpath(given, ws)
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
        if not workdir.is_dir():
            raise FileNotFoundError(f"cwd {cwd!r} does not exist in the workspace")
        return run_group(
            self._argv(cmd, workdir),
            timeout_s,
            cwd=workdir,
            env=self._env(env),
            running=self._running_execs,
            lock=self._lock,
            watch=self._watch,
        )

    def setup_exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        """The harness's own setup command (installing an agent CLI) outside the sandbox: it may write the
        host's tool folders. Never for anything an agent or an app chose."""
        workdir = self._host_path(cwd or ".", "cwd")
        merged = self._env(env)
        if "TMPDIR" in os.environ:
            merged["TMPDIR"] = os.environ["TMPDIR"]
        elif self._sandbox is not None:
            merged.pop("TMPDIR", None)
        return run_group(
            ["bash", "-c", cmd],
            timeout_s,
            cwd=workdir,
            env=merged,
            running=self._running_execs,
            lock=self._lock,
            watch=self._watch,
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
                self._argv(command, workdir),
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
        if self._ledger is not None:
            self._ledger.add_group(proc.pid, f"service {name}")
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
            if self._ledger is not None:
                self._ledger.drop_group(svc.pgid)


def _safe(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "service"
