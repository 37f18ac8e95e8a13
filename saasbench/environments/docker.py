"""The Docker backend: one trial's services as containers on a private network (docker SDK only).

:class:`DockerEnvironment` implements :class:`~saasbench.environments.base.Environment` for an
:class:`~saasbench.catalog.envspec.EnvSpec` (from a task's compose file or built by hand):

- **Isolation.** One bridge network per trial (``saasbench-<trial>``); services reach each other by
  service name (network alias). No fixed host port is ever published, so two trials of one task
  run side by side. The evaluator reaches the app through a host proxy on an ephemeral
  ``127.0.0.1`` port that connects *inside* the app container's network namespace (so an app
  bound to ``127.0.0.1`` or ``0.0.0.0`` both work; needs a local engine and root), or, with
  ``reach="ip"``, at the app container's address on the trial network (the app must bind ``0.0.0.0``).
  Other services: :meth:`DockerEnvironment.service_ip`.
- **Start.** Services start in dependency order (``depends_on`` conditions ``service_started``,
  ``service_healthy``, ``service_completed_successfully``). A service with a healthcheck is probed
  by exec (every ``min(interval, 1 s)``, each probe bounded by its timeout) until it passes or the
  deadline passes; then :class:`~saasbench.environments.base.ServiceError` carries its last log lines.
  A failed start removes everything it created before raising.
- **Labels.** Every container, network and volume carries ``saasbench.runs.trial``, ``saasbench.task``,
  ``saasbench.created`` (UTC ISO time) and the owner (``saasbench.host``, ``saasbench.pid``,
  ``saasbench.pid_start``); :func:`prune` removes what a dead owner left behind.
- **Workspace.** A host folder bind-mounted into the app service (``/app`` unless the spec says
  otherwise); file reads and writes go through the host folder with the same confinement rules
  as the local backend (a container path under the mount point is accepted, any other absolute
  path raises PathEscape). The engine must therefore run on this host.
- **Commands.** ``exec`` runs ``bash -c`` (``sh -c`` when the image has no bash) in the app
  container with the same contract as the local backend: 1 MiB cap per stream, exit 124 and
  ``timed_out`` on timeout, and every process the command started (found by a per-command
  marker variable, ``SAASBENCH_EXEC``) is killed when it returns or times out.
- **Teardown.** ``stop()`` (and leaving the ``with`` block, also on an exception) force-removes the
  trial's containers, volumes and network, found by label, so a half-started trial is cleaned too.
  Ctrl-C: SIGINT raises KeyboardInterrupt in the main thread, the ``with`` block exits and tears
  down; a second Ctrl-C during teardown is held back until teardown is done. SIGKILL, or SIGTERM
  without a handler, leaves the containers behind: ``saasbench env prune`` (:func:`prune`) removes
  them once the owner process is gone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import datetime as _dt
import os
import posixpath
import queue
import re
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from saasbench.catalog.envspec import (  # noqa: F401 - re-exported
    DEFAULT_IMAGE,
    EnvSpec,
    ServiceSpec,
    compose_variables,
    env_spec_for_task,
    import_compose,
    read_env_file,
)
from saasbench.environments.base import (
    LOG_TAIL_ON_ERROR,
    MAX_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    EnvError,
    Environment,
    ExecResult,
    HostFolderFiles,
    PathEscape,
    Service,
    ServiceError,
    pid_alive,
)
from saasbench.services.net import pump
from saasbench.services.workspace import confine

if TYPE_CHECKING:
    import docker

    from saasbench.catalog.tasks import Task

__all__ = [
    "DEFAULT_IMAGE",
    "LABEL_PREFIX",
    "DockerEnvironment",
    "connect_engine",
    "env_spec_for_task",
    "list_trials",
    "prune",
]

LABEL_PREFIX = "saasbench."
L_TRIAL, L_TASK, L_CREATED = "saasbench.trial", "saasbench.task", "saasbench.created"
L_HOST, L_PID, L_PID_START, L_SERVICE = "saasbench.host", "saasbench.pid", "saasbench.pid_start", "saasbench.service"
# PID 1 of a service without its own command: exits at once on SIGTERM, reaps nothing (init=True does)
KEEP_ALIVE = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
SERVICE_LOG_DIR = "/tmp/saasbench-logs"  # in the app container, outside the workspace

# Kill every process whose environment holds the marker $1 (except the shell running this).
_KILL_MARKED = (
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] && continue; '
    'grep -qs -- "$1" "$d/environ" 2>/dev/null && kill -9 "$p" 2>/dev/null; done; true'
)
# Run "$2" -c "$3" with the marker in the environment; afterwards kill what it left running.
_EXEC_WRAPPER = (
    '"$1" -c "$2"; rc=$?; set -- "SAASBENCH_EXEC=$SAASBENCH_EXEC"; '
    "command -v grep >/dev/null 2>&1 && { " + _KILL_MARKED + "; }; exit $rc"
)


def connect_engine() -> docker.DockerClient:
    """A client of the Docker engine (``DOCKER_HOST``, else the default socket) that answered a ping;
    EnvError saying what to set when none answers (the registry's ``connect`` for this backend)."""
    import docker as docker_sdk

    try:
        client = docker_sdk.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any connection failure means: no engine
        raise EnvError(f"no Docker engine reachable ({type(exc).__name__}: {exc}); set DOCKER_HOST") from None
    return client


def _now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pid_start(pid: int) -> str:
    """The process start time (clock ticks since boot) from /proc: tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def _safe_name(text: str) -> str:
    out = re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.") or "x"
    return out if out[0].isalnum() else "x" + out


# --- host proxy into a container's network namespace ----------------------------------------------
_CLONE_NEWNET = 0x40000000


class _LoopbackProxy:
    """Listen on 127.0.0.1:<ephemeral>; connect each client to 127.0.0.1:<port> inside a network namespace.

    One helper thread joins the namespace (setns) and opens the upstream sockets; a socket keeps
    the namespace it was created in, so relaying happens in ordinary threads.
    """

    def __init__(self, netns_path: str, target_port: int):
        self.target_port = target_port
        self._nsfd = os.open(netns_path, os.O_RDONLY)
        self._requests: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        threading.Thread(target=self._ns_loop, args=(ready,), daemon=True, name="saasbench-netns").start()
        try:
            ready.result(timeout=10)
        except BaseException:
            os.close(self._nsfd)
            raise
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, daemon=True, name="saasbench-proxy").start()

    def _ns_loop(self, ready: concurrent.futures.Future) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(self._nsfd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            ready.set_exception(OSError(err, f"setns into the app container's network namespace: {os.strerror(err)}"))
            return
        ready.set_result(None)
        while True:
            item = self._requests.get()
            if item is None:
                return
            fut = item
            try:
                fut.set_result(socket.create_connection(("127.0.0.1", self.target_port), timeout=5))
            except OSError as exc:
                fut.set_exception(exc)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put(fut)
        try:
            upstream = fut.result(timeout=10)
        except Exception:  # noqa: BLE001 - nothing listens: close the client, like a refused connection
            client.close()
            return
        upstream.settimeout(None)

        t = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        t.start()
        pump(client, upstream)
        t.join()
        client.close()
        upstream.close()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._requests.put(None)
        with contextlib.suppress(OSError):
            os.close(self._nsfd)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold back SIGINT (re-raised as KeyboardInterrupt afterwards) so teardown is not cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    try:
        old = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got and callable(old):
            old(signal.SIGINT, None)


class _CappedStreams:
    def __init__(self, cap: int):
        self.cap = cap
        self.parts: dict[int, list[bytes]] = {0: [], 1: []}
        self.kept = {0: 0, 1: 0}
        self.truncated = False

    def add(self, which: int, chunk: bytes | None) -> None:
        if not chunk:
            return
        room = self.cap - self.kept[which]
        if room > 0:
            self.parts[which].append(chunk[:room])
            self.kept[which] += min(room, len(chunk))
        if len(chunk) > room:
            self.truncated = True

    def text(self, which: int) -> str:
        return b"".join(self.parts[which]).decode("utf-8", errors="replace")


def exec_in_container(
    client: docker.DockerClient,
    container: Any,
    argv: list[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    *,
    marker_kill: bool = True,
) -> ExecResult:
    """Run ``argv`` in ``container`` with the :meth:`Environment.exec` contract (1 MiB per stream,
    exit 124 on timeout). With ``marker_kill`` it runs under the marker wrapper (``argv`` is then
    ``[shell, command]``) and everything it started dies when it ends or times out."""
    api = client.api
    mark = uuid.uuid4().hex
    environment = {str(k): str(v) for k, v in (env or {}).items()}
    if marker_kill:
        environment["SAASBENCH_EXEC"] = mark
        argv = ["/bin/sh", "-c", _EXEC_WRAPPER, "saasbench-exec", *argv]
    try:
        exec_id = api.exec_create(container.id, argv, environment=environment, workdir=workdir)["Id"]
        stream = api.exec_start(exec_id, stream=True, demux=True)
    except Exception as exc:
        raise EnvError(f"cannot exec in {container.name}: {exc}") from exc
    streams = _CappedStreams(MAX_OUTPUT_BYTES)

    def read() -> None:
        with contextlib.suppress(Exception):  # the connection went away (container removed)
            for out, err in stream:
                streams.add(0, out)
                streams.add(1, err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=max(0.01, timeout_s))
    timed_out = reader.is_alive()
    if timed_out:
        if marker_kill:
            kill_marked(container, "SAASBENCH_EXEC=" + mark)
        else:
            with contextlib.suppress(Exception):
                pid = api.exec_inspect(exec_id).get("Pid")
                if pid:
                    os.kill(int(pid), signal.SIGKILL)
        reader.join(timeout=5)
    code = -1
    with contextlib.suppress(Exception):
        info = api.exec_inspect(exec_id)
        code = info.get("ExitCode") if info.get("ExitCode") is not None else -1
    if timed_out:
        code = TIMEOUT_EXIT_CODE
    return ExecResult(
        exit_code=code, stdout=streams.text(0), stderr=streams.text(1), timed_out=timed_out, truncated=streams.truncated
    )


def kill_marked(container: Any, marker: str) -> None:
    """Kill every process in ``container`` whose environment holds ``marker`` (NAME=value)."""
    with contextlib.suppress(Exception):
        container.exec_run(["/bin/sh", "-c", _KILL_MARKED, "saasbench-kill", marker])


def container_shell(client: docker.DockerClient, container: Any) -> str:
    """``bash`` when the container has it, else ``sh``."""
    probe = exec_in_container(
        client, container, ["/bin/sh", "-c", "command -v bash >/dev/null 2>&1"], 30, marker_kill=False
    )
    return "bash" if probe.exit_code == 0 else "sh"


# --- the backend ---------------------------------------------------------------------------------
class DockerEnvironment(HostFolderFiles, Environment):
    """One trial's containers. ``with DockerEnvironment(task=task, client=client) as env: ...``.

    ``spec``: the services (default: :func:`env_spec_for_task`, or one ``app`` service on
    ``image``). ``client``: a ``docker.DockerClient`` (default ``docker.from_env()``).
    ``trial_id``: the label value (default: a fresh id). ``health_deadline_s``: how long each
    service may take to pass its healthcheck (default: the task's ``timeouts.health_s``, else 60).
    ``reach``: how :attr:`base_url` reaches the app, ``"proxy"`` (host proxy into the container's
    network namespace), ``"ip"`` (container address) or ``"auto"`` (proxy when possible).
    ``image_cache_dir``: where build logs and locks of built services live (see
    :mod:`saasbench.environments.imagecache`). ``keep``: leave the workspace folder on stop.
    """

    kind = "docker"
    trial_id: str  # always set: the label that finds this trial's containers, network and volumes

    def __init__(
        self,
        task: Task | None = None,
        *,
        spec: EnvSpec | None = None,
        client: docker.DockerClient | None = None,
        trial_id: str | None = None,
        image: str = DEFAULT_IMAGE,
        workspace_root: str | Path | None = None,
        health_deadline_s: float | None = None,
        reach: Literal["auto", "proxy", "ip"] = "auto",
        image_cache_dir: str | Path | None = None,
        keep: bool = False,
        port: int | None = None,
    ):
        self.task = task
        self.spec = (
            spec
            if spec is not None
            else (
                env_spec_for_task(task, image=image)
                if task is not None
                else EnvSpec(services={"app": ServiceSpec(image=image)})
            )
        )
        self._client = client
        self.task_id = task.id if task is not None else "adhoc"
        self.trial_id = _safe_name(trial_id or uuid.uuid4().hex[:12])
        self.health_deadline_s = (
            health_deadline_s
            if health_deadline_s is not None
            else (task.spec.timeouts.health_s if task is not None else 60.0)
        )
        self.reach = reach
        self.image_cache_dir = image_cache_dir
        self.keep = keep
        self._given_root = Path(workspace_root) if workspace_root is not None else None
        self._port = port if port is not None else (task.spec.app.port if task is not None else 8000)
        self.app_name = self.spec.app()
        self._ws: Path | None = None
        self._tmp_ws = False
        self._network: str | None = None
        self._containers: dict[str, Any] = {}  # service -> Container
        self._services: dict[str, Service] = {}
        self._service_marks: dict[str, tuple[str, str]] = {}  # name -> (exec id, marker)
        self._proxy: _LoopbackProxy | None = None
        self._shell = "bash"
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()

    # --- labels ----------------------------------------------------------------------------------
    def labels(self, service: str | None = None) -> dict[str, str]:
        out = {
            L_TRIAL: self.trial_id,
            L_TASK: self.task_id,
            L_CREATED: self._created,
            L_HOST: socket.gethostname(),
            L_PID: str(os.getpid()),
            L_PID_START: _pid_start(os.getpid()),
        }
        if service is not None:
            out[L_SERVICE] = service
        return out

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            import docker

            self._client = docker.from_env()
        return self._client

    # --- lifecycle -------------------------------------------------------------------------------
    def prepare(self) -> dict[str, str]:
        """Every service's image built (content-addressed cache) or present, nothing started."""
        return {name: self._image_for(name, self.spec.services[name]) for name in self.spec.start_order()}

    def start(self) -> None:
        if self._started:
            return
        if self._stopped:
            raise EnvError("this environment was stopped; create a new one per trial")
        self._created = _now_iso()
        self._started = True
        # safety net for an environment dropped without stop() (also at interpreter exit)
        weakref.finalize(self, _remove_trial_quietly, self.client, self.trial_id, os.getpid())
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        import docker.errors

        if self._given_root is not None:
            self._given_root.mkdir(parents=True, exist_ok=True)
            self._ws = Path(os.path.realpath(self._given_root))
        else:
            self._ws = Path(os.path.realpath(tempfile.mkdtemp(prefix=f"saasbench-{_safe_name(self.task_id)}-ws-")))
            self._tmp_ws = True
            os.chmod(self._ws, 0o755)
            if not self.keep:
                weakref.finalize(self, _rmtree_if_owner, str(self._ws), os.getpid())
        api = self.client.api
        self._network = f"saasbench-{self.trial_id}"
        try:
            self.client.networks.create(self._network, driver="bridge", labels=self.labels(), check_duplicate=True)
        except docker.errors.APIError as exc:
            raise EnvError(f"cannot create the trial network {self._network}: {exc}") from exc
        for name in self.spec.start_order():
            svc = self.spec.services[name]
            for dep, cond in svc.depends_on.items():
                if cond.condition == "service_completed_successfully":
                    self._wait_completed(dep)
                # service_healthy: every service with a healthcheck was waited for right after it started
            image = self._image_for(name, svc)
            self._containers[name] = self._run_service(api, name, svc, image)
            if svc.healthcheck is not None:
                self._wait_service_healthy(name, svc)
            else:
                self._check_running(name)
        app = self._containers[self.app_name]
        self._shell = container_shell(self.client, app)
        self._setup_reach()

    def _setup_reach(self) -> None:
        if self.reach == "ip":
            return
        app = self._containers[self.app_name]
        app.reload()
        pid = app.attrs["State"].get("Pid") or 0
        path = f"/proc/{pid}/ns/net"
        try:
            self._proxy = _LoopbackProxy(path, self.app_port)
        except OSError as exc:
            if self.reach == "proxy":
                raise EnvError(
                    f"cannot reach the app container's loopback ({exc}); use reach='ip' with a remote engine"
                ) from exc
            self.reach = "ip"

    def _image_for(self, name: str, svc: ServiceSpec) -> str:
        import docker.errors

        if svc.build is not None:
            from saasbench.environments.imagecache import ImageCache

            context = self.spec.path(svc.build.context)
            ref = ImageCache(self.client, cache_dir=self.image_cache_dir).ensure(
                context, dockerfile=svc.build.dockerfile, buildargs=svc.build.args
            )
            return ref.tag
        assert svc.image is not None
        try:
            self.client.images.get(svc.image)
        except docker.errors.ImageNotFound:
            try:
                self.client.images.pull(svc.image)
            except docker.errors.APIError as exc:
                raise EnvError(
                    f"service {name!r}: image {svc.image} is not present and cannot be pulled "
                    f"({str(exc).splitlines()[0]}); build or import it first"
                ) from None
        return svc.image

    def _run_service(self, api: Any, name: str, svc: ServiceSpec, image: str) -> Any:
        import docker.errors
        import docker.types

        env: dict[str, str] = {}
        for f in svc.env_file:
            env.update(read_env_file(self.spec.path(f)))
        env.update(svc.environment)
        if name == self.app_name:
            env.update(self.service_env())
        binds: dict[str, dict[str, str]] = {}
        for v in svc.volumes:
            mode = "ro" if v.read_only else "rw"
            if v.kind == "workspace":
                binds[str(self._ws)] = {"bind": v.target, "mode": mode}
            elif v.kind == "bind":
                src = self.spec.path(os.path.expanduser(v.source))
                if not src.exists():
                    raise EnvError(f"service {name!r}: bind mount source {src} does not exist")
                binds[str(src.resolve())] = {"bind": v.target, "mode": mode}
            else:
                vol = f"saasbench-{self.trial_id}-{_safe_name(v.source)}"
                with contextlib.suppress(docker.errors.APIError):  # shared between services: create once
                    self.client.volumes.create(vol, labels=self.labels())
                binds[vol] = {"bind": v.target, "mode": mode}
        if svc.init_sql:
            src = self.spec.path(svc.init_sql)
            binds[str(src.resolve())] = {
                "bind": svc.init_sql_target or f"/docker-entrypoint-initdb.d/{src.name}",
                "mode": "ro",
            }
        command = svc.command
        if command is None and svc.entrypoint is None and name == self.app_name:
            command = KEEP_ALIVE
        elif isinstance(command, str):
            command = shlex.split(command)  # as compose does: words, no shell
        entrypoint = shlex.split(svc.entrypoint) if isinstance(svc.entrypoint, str) else svc.entrypoint
        if entrypoint == []:  # compose's `entrypoint: []` / "" clears the image's entrypoint, as `--entrypoint ""` does
            entrypoint = [""]
        host_config = api.create_host_config(
            binds=binds,
            init=True,
            network_mode=self._network,
            dns=svc.dns or None,
            extra_hosts=svc.extra_hosts or None,
            ulimits=[docker.types.Ulimit(name=k, soft=soft, hard=hard) for k, (soft, hard) in svc.ulimits.items()]
            or None,
            shm_size=svc.shm_size,
        )
        net_config = api.create_networking_config(
            {self._network: api.create_endpoint_config(aliases=[name, *svc.aliases])}
        )
        workdir = svc.working_dir or svc.workspace_target()
        try:
            created = api.create_container(
                image,
                command=command,
                entrypoint=entrypoint,
                name=f"saasbench-{self.trial_id}-{_safe_name(name)}",
                hostname=(svc.hostname or _safe_name(name))[:63],
                user=svc.user,
                stdin_open=svc.stdin_open,
                tty=svc.tty,
                environment=env,
                labels={**svc.labels, **self.labels(name)},
                host_config=host_config,
                networking_config=net_config,
                working_dir=workdir,
                detach=True,
            )
            api.start(created["Id"])
        except docker.errors.APIError as exc:
            raise EnvError(f"service {name!r}: cannot start a container from {image}: {exc}") from exc
        return self.client.containers.get(created["Id"])

    def _container_tail(self, name: str, tail: int = LOG_TAIL_ON_ERROR) -> str:
        try:
            return self._containers[name].logs(tail=tail).decode("utf-8", errors="replace").rstrip("\n")
        except Exception:  # noqa: BLE001 - the logs are a courtesy in an error message
            return ""

    def _state(self, name: str) -> dict[str, Any]:
        c = self._containers[name]
        c.reload()
        return c.attrs.get("State") or {}

    def _check_running(self, name: str) -> None:
        """A service that already died (the app: at all; others: with a non-zero code) fails the start.
        One look right after start: a service without a healthcheck has no better signal."""
        state = self._state(name)
        if state.get("Status") in ("exited", "dead") and (name == self.app_name or state.get("ExitCode") != 0):
            raise ServiceError(
                f"service {name!r} exited with code {state.get('ExitCode')} right after start",
                self._container_tail(name),
            )

    def _wait_completed(self, name: str) -> None:
        end = time.monotonic() + self.health_deadline_s
        while time.monotonic() < end:
            state = self._state(name)
            if state.get("Status") in ("exited", "dead"):
                if state.get("ExitCode") == 0:
                    return
                raise ServiceError(
                    f"service {name!r} exited with code {state.get('ExitCode')} (expected 0)",
                    self._container_tail(name),
                )
            time.sleep(0.25)
        raise ServiceError(
            f"service {name!r} did not complete within {self.health_deadline_s:g}s", self._container_tail(name)
        )

    def _wait_service_healthy(self, name: str, svc: ServiceSpec) -> None:
        hc = svc.healthcheck
        assert hc is not None
        container = self._containers[name]
        deadline = max(self.health_deadline_s, hc.start_period)
        end = time.monotonic() + deadline
        last = "no probe yet"
        while True:
            state = self._state(name)
            if state.get("Status") in ("exited", "dead"):
                raise ServiceError(
                    f"service {name!r} exited with code {state.get('ExitCode')} before it was healthy",
                    self._container_tail(name),
                )
            try:
                r = self._exec_in(
                    container, hc.argv(), min(hc.timeout, max(0.5, end - time.monotonic())), marker_kill=False
                )
            except EnvError:
                # the service may exit between the state check and the probe (Docker answers 409);
                # report that as the service's failure, with its logs, not as an exec error
                state = self._state(name)
                if state.get("Status") in ("exited", "dead"):
                    raise ServiceError(
                        f"service {name!r} exited with code {state.get('ExitCode')} before it was healthy",
                        self._container_tail(name),
                    ) from None
                raise
            if r.ok:
                return
            last = (
                f"exit {r.exit_code}"
                + (" (timed out)" if r.timed_out else "")
                + (f": {(r.stdout + r.stderr).strip()[-300:]}" if (r.stdout + r.stderr).strip() else "")
            )
            if time.monotonic() >= end:
                break
            time.sleep(min(hc.interval, 1.0, max(0.0, end - time.monotonic())))
        raise ServiceError(
            f"service {name!r} not healthy after {deadline:g}s (last probe: {last})", self._container_tail(name)
        )

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with _sigint_deferred():
            if self._proxy is not None:
                self._proxy.close()
            try:
                if self._started:
                    _remove_trial(self.client, self.trial_id)
            except Exception as exc:
                raise EnvError(
                    f"teardown of trial {self.trial_id} failed ({exc}); `saasbench env prune` removes the leftovers"
                ) from exc
            finally:
                if self._tmp_ws and not self.keep and self._ws is not None:
                    shutil.rmtree(self._ws, ignore_errors=True)

    def _require(self) -> Path:
        if not self._started or self._ws is None or self.app_name not in self._containers:
            raise EnvError("environment not started (call start() or use it as a context manager)")
        if self._stopped:
            raise EnvError("environment already stopped")
        return self._ws

    # --- where things are ------------------------------------------------------------------------
    @property
    def workspace_path(self) -> str:
        return self.spec.services[self.app_name].workspace_target() or "/app"

    @property
    def gateway_ip(self) -> str | None:
        """The host's address on this trial's network: where containers reach host-side services."""
        import docker.errors

        if self._network is None:
            return None
        try:
            net = self.client.networks.get(self._network)
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Gateway"):
                    return str(cfg["Gateway"])
        except docker.errors.APIError:
            return None
        return None

    # Webhook receivers and SMTP sinks of a run bind the gateway, so the app container can call them:
    # Environment.receiver_bind_host / receiver_advertise_host default to gateway_ip.

    @property
    def workspace_dir(self) -> Path:
        """The workspace on the host."""
        return self._require()

    @property
    def app_port(self) -> int:
        return self._port

    @property
    def network(self) -> str | None:
        return self._network

    @property
    def service_marks(self) -> dict[str, str]:
        """``{service: marker}`` of the commands started with :meth:`start_service` (the marker tags
        their processes, so a frozen end state can tell the harness's services from the agent's)."""
        return {name: mark for name, (_exec_id, mark) in self._service_marks.items()}

    @property
    def container_name(self) -> str | None:
        """The app container's real name (``saasbench-<trial>-app``): what the agent's ``docker exec`` needs."""
        c = self._containers.get(self.app_name) if self._started else None
        return c.name if c is not None else None

    def container(self, service: str | None = None) -> Any:
        """The docker SDK Container of a service (default: the app)."""
        self._require()
        return self._containers[service or self.app_name]

    def service_ip(self, service: str) -> str:
        """A service's address on the trial network (reachable from this host on Linux)."""
        c = self.container(service)
        c.reload()
        return c.attrs["NetworkSettings"]["Networks"][self._network]["IPAddress"]

    @property
    def base_url(self) -> str:
        self._require()
        if self._proxy is not None:
            return f"http://127.0.0.1:{self._proxy.port}"
        return f"http://{self.service_ip(self.app_name)}:{self.app_port}"

    def service_env(self) -> dict[str, str]:
        declared = (self.task.spec.environment.get("env") if self.task is not None else None) or {}
        out = {str(k): str(v) for k, v in declared.items()} if isinstance(declared, dict) else {}
        out |= {
            "PORT": str(self.app_port),
            "APP_PORT": str(self.app_port),
            "HOST": "0.0.0.0",
            "SAASBENCH_WORKSPACE": self.workspace_path,
        }
        rel = self._sqlite_rel()
        if rel is not None:
            path = posixpath.join(self.workspace_path, rel)
            out["DATABASE_PATH"] = path
            out["DATABASE_URL"] = f"sqlite:///{path}"
        return out

    def base_env(self) -> dict[str, str]:
        """The app container's own environment (its image's and the spec's variables); {} before it runs."""
        out: dict[str, str] = {}
        try:
            for item in (self.container().attrs.get("Config") or {}).get("Env") or []:
                key, _, value = item.partition("=")
                out[key] = value
        except Exception:  # noqa: BLE001 - no container yet: nothing inherited
            pass
        return out

    def _sqlite_rel(self) -> str | None:
        db = self.task.spec.database if self.task is not None else None
        if db is None or db.engine.lower() not in ("sqlite", "sqlite3"):
            return None
        return confine(db.path or "data/app.db", "database.path")

    @property
    def db_dsn(self) -> str | None:
        """SQLite: the file in the host workspace. A server engine: the ``db`` service (or
        ``environment.db_service``) at its address on the trial network, with the task's credentials."""
        task = self.task
        db = task.spec.database if task is not None else None
        if task is None or db is None:
            return None
        rel = self._sqlite_rel()
        if rel is not None:
            return f"sqlite:///{self._require() / rel}"
        engine = db.engine.lower()
        service = str((task.spec.environment or {}).get("db_service") or "db")
        if service not in self._containers:
            return None
        default_port = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mariadb": 3306, "mongodb": 27017}.get(
            engine
        )
        ports = self.spec.services[service].ports
        port = ports[0] if len(ports) == 1 else default_port
        scheme = {"postgres": "postgresql", "mariadb": "mysql"}.get(engine, engine)
        auth = ""
        if db.user:
            auth = db.user + (f":{db.password}" if db.password else "") + "@"
        return f"{scheme}://{auth}{self.service_ip(service)}:{port}/{db.name or ''}"

    # --- paths -----------------------------------------------------------------------------------
    def _host_path(self, path: str, what: str = "path") -> Path:
        ws = self._require()
        text = str(path)
        if text.startswith("/"):
            mount = self.workspace_path.rstrip("/")
            norm = posixpath.normpath(text)
            if norm != mount and not norm.startswith(mount + "/"):
                raise PathEscape(f"{what} {path!r} is outside the workspace {mount}")
            text = posixpath.relpath(norm, mount)
        rel = confine(text, what)
        host = ws / rel if rel != "." else ws
        real = Path(os.path.realpath(host))
        if real != ws and ws not in real.parents:
            raise PathEscape(f"{what} {path!r} resolves outside the workspace (symlink)")
        return host

    def _container_dir(self, host: Path) -> str:
        rel = os.path.relpath(host, self._require())
        return self.workspace_path if rel == "." else posixpath.join(self.workspace_path, rel)

    # --- commands and files ----------------------------------------------------------------------
    def _exec_in(
        self,
        container: Any,
        argv: list[str],
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        marker_kill: bool = True,
    ) -> ExecResult:
        return exec_in_container(self.client, container, argv, timeout_s, env, workdir, marker_kill=marker_kill)

    def _kill_marked(self, container: Any, marker: str) -> None:
        kill_marked(container, marker)

    def exec(
        self, cmd: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> ExecResult:
        host = self._host_path(cwd or ".", "cwd")
        if not host.is_dir():
            raise FileNotFoundError(f"cwd {cwd!r} does not exist in the workspace")
        merged = self.service_env()
        merged.update({str(k): str(v) for k, v in (env or {}).items()})
        return self._exec_in(
            self._containers[self.app_name], [self._shell, cmd], timeout_s, merged, self._container_dir(host)
        )

    # --- services (long-lived commands in the app container) -------------------------------------
    def start_service(
        self,
        name: str,
        command: str,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        cwd: str | None = None,
    ) -> Service:
        host = self._host_path(cwd or ".", "cwd")
        api = self.client.api
        with self._lock:
            old = self._service_marks.get(name)
        if old is not None and api.exec_inspect(old[0]).get("Running"):
            raise ServiceError(f"service {name!r} is already running (pid {self._services[name].pid})")
        port = port if port is not None else self.app_port
        merged = self.service_env()
        merged.update({str(k): str(v) for k, v in (env or {}).items()})
        merged.update({"PORT": str(port), "APP_PORT": str(port)})
        mark = uuid.uuid4().hex
        merged["SAASBENCH_SERVICE"] = mark
        log = f"{SERVICE_LOG_DIR}/{_safe_name(name)}.log"
        script = 'mkdir -p "$(dirname "$3")" && exec "$1" -c "$2" >>"$3" 2>&1'
        container = self._containers[self.app_name]
        exec_id = api.exec_create(
            container.id,
            ["/bin/sh", "-c", script, "saasbench-service", self._shell, command, log],
            environment=merged,
            workdir=self._container_dir(host),
        )["Id"]
        api.exec_start(exec_id, detach=True)
        pid = 0
        for _ in range(50):  # the pid is known once the process runs
            info = api.exec_inspect(exec_id)
            pid = int(info.get("Pid") or 0)
            if pid or not info.get("Running"):
                break
            time.sleep(0.02)
        svc = Service(name=name, command=command, pid=pid, port=port, log_path=Path(log))
        with self._lock:
            self._services[name] = svc
            self._service_marks[name] = (exec_id, mark)
        return svc

    def services(self) -> dict[str, Service]:
        with self._lock:
            return dict(self._services)

    def _service_exit(self, name: str) -> int | None:
        exec_id = self._service_marks[name][0]
        info = self.client.api.exec_inspect(exec_id)
        return None if info.get("Running") else info.get("ExitCode")

    def _service_exit_code(self, name: str) -> int | None:
        return self._service_exit(name) if name in self._service_marks else None

    def logs(self, name: str, tail: int = 200) -> str:
        """A service started with :meth:`start_service` (its log file), else a spec service (container logs)."""
        if name in self._services:
            r = self._exec_in(
                self._containers[self.app_name],
                [
                    "/bin/sh",
                    "-c",
                    'tail -c 262144 "$1" 2>/dev/null',
                    "saasbench-logs",
                    str(self._services[name].log_path),
                ],
                30,
                marker_kill=False,
            )
            lines = r.stdout.splitlines()
            return "\n".join(lines[-tail:]) if tail > 0 else ""
        if name in self._containers:
            return self._container_tail(name, tail)
        raise KeyError(
            f"no service {name!r} (known: {', '.join(sorted(set(self._services) | set(self._containers))) or 'none'})"
        )

    def stop_service(self, name: str) -> None:
        entry = self._service_marks.get(name)
        if entry is None or self._stopped:
            return
        container = self._containers[self.app_name]
        self._kill_marked(container, "SAASBENCH_SERVICE=" + entry[1])
        end = time.monotonic() + 5
        while time.monotonic() < end and self._service_exit(name) is None:
            time.sleep(0.05)


# --- finding and removing trials by label ----------------------------------------------------------
def _remove_trial(client: docker.DockerClient, trial_id: str) -> dict[str, int]:
    """Force-remove a trial's containers, then its volumes and networks. Counts what went."""
    import docker.errors

    flt = {"label": f"{L_TRIAL}={trial_id}"}
    counts = {"containers": 0, "volumes": 0, "networks": 0}
    for c in client.containers.list(all=True, filters=flt):
        with contextlib.suppress(docker.errors.NotFound):
            try:
                c.remove(force=True, v=True)
                counts["containers"] += 1
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise
    for v in client.volumes.list(filters=flt):
        with contextlib.suppress(docker.errors.NotFound):
            v.remove(force=True)
            counts["volumes"] += 1
    for n in client.networks.list(filters=flt):
        with contextlib.suppress(docker.errors.NotFound):
            n.remove()
            counts["networks"] += 1
    return counts


def _rmtree_if_owner(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


def _remove_trial_quietly(client: docker.DockerClient, trial_id: str, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child exiting must not tear down its parent's trial
        return
    with contextlib.suppress(Exception):
        _remove_trial(client, trial_id)


def list_trials(client: docker.DockerClient) -> dict[str, dict[str, str]]:
    """Trials that have anything on this engine: trial id -> labels (of one of its resources)."""
    out: dict[str, dict[str, str]] = {}
    flt = {"label": L_TRIAL}
    resources: list[dict[str, str]] = [c.labels for c in client.containers.list(all=True, filters=flt)]
    resources += [n.attrs.get("Labels") or {} for n in client.networks.list(filters=flt)]
    resources += [v.attrs.get("Labels") or {} for v in client.volumes.list(filters=flt)]
    for labels in resources:
        if labels.get(L_TRIAL):
            out.setdefault(labels[L_TRIAL], labels)
    return out


def _owner_gone(labels: Mapping[str, str]) -> bool:
    if labels.get(L_HOST) != socket.gethostname():
        return False  # another machine's trial: only older_than removes it
    try:
        pid = int(labels.get(L_PID, ""))
    except ValueError:
        return True
    if not pid_alive(pid):
        return True
    start = labels.get(L_PID_START)
    return bool(start) and _pid_start(pid) not in ("", start)  # the pid was reused by another process


def prune(
    client: docker.DockerClient, older_than: _dt.timedelta | float | None = None, *, dry_run: bool = False
) -> list[str]:
    """Remove the leftovers of trials whose owner process is gone; returns their trial ids.

    A trial is removed when its resources were made on this host by a process that no longer
    exists (``saasbench.host`` / ``saasbench.pid`` / ``saasbench.pid_start``). With ``older_than``
    (a timedelta or seconds), trials created longer ago than that are removed too, whoever owns
    them (for leftovers of other machines, or a stuck owner). ``dry_run`` only lists them.
    """
    if older_than is not None and not isinstance(older_than, _dt.timedelta):
        older_than = _dt.timedelta(seconds=float(older_than))
    now = _dt.datetime.now(_dt.UTC)
    doomed = []
    for trial, labels in sorted(list_trials(client).items()):
        stale = False
        if older_than is not None:
            try:
                created = _dt.datetime.strptime(labels.get(L_CREATED, ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
                stale = now - created > older_than
            except ValueError:
                stale = True
        if stale or _owner_gone(labels):
            doomed.append(trial)
    if not dry_run:
        for trial in doomed:
            _remove_trial(client, trial)
    return doomed
