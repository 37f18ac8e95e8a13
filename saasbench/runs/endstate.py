"""The frozen end state of a rollout: capture the agent's system, store it, bring it back.

After an agent's rollout and before the evaluation mutates anything, :func:`freeze` captures what
is needed to bring the agent's system back, stores every part content-addressed in the lake's
object store (``objects/sha256/<2 hex>/<hex>``, one object per distinct content, so freezing an
unchanged system twice stores nothing new but its manifest) and returns a :class:`FrozenState`
whose :class:`Manifest` (itself content-addressed) lists the parts. :func:`restore` puts them back
into a started, fresh environment of the same backend and returns the :class:`RestartRecipe`, so
the app can be started (:func:`start_restored_app`) and evaluated again: a trial resumed without
re-running the agent, or ``saasbench rescore``. The lake table ``end_states`` (one row per trial,
:func:`end_state_row`) points at the manifest. docs/endstate.md describes the format.

Components (each consistent in itself; the set is not one atomic snapshot across components, see
docs/endstate.md):

- ``workspace``: a tar of the workspace folder (modes, mtimes, numeric owners; symlinks stored as
  symlinks and never followed, so a link pointing out of the workspace brings nothing from outside;
  hard links kept; sockets and device files skipped and listed). The task's SQLite files are
  left out of it: they are their own component.
- ``sqlite``: the task's SQLite database through SQLite's online backup API (a consistent copy even
  while the app writes), wherever it lives (in the workspace, or outside it, e.g. a backend's
  state folder).
- ``postgres`` (Docker): ``pg_dumpall --clean --if-exists`` through exec in the service container
  (each database dumped from one snapshot, the server keeps running), loaded with ``psql`` into
  the fresh service before the app starts.
- ``volumes`` (Docker, any other service with data volumes: Redis, MySQL/MariaDB, MongoDB, ...,
  and the app container's own volumes): a tar of the volumes taken with the container paused (a
  crash-consistent point in time; Redis is told to ``SAVE`` first); restored into the fresh
  service stopped, its volumes emptied by a helper container, then started and waited for
  healthy (the app container is emptied and refilled by exec instead: nothing runs there yet).
- ``container_fs`` (Docker): the app container's own filesystem changes (``container.diff()``):
  the changed and added paths as one tar (``get_archive``), and the deleted ones by name.

Restart recipe: the deployment contract (the agent's ``app_start_command(task)``, else
``task.spec.app.start_command``) when there is one, else the processes the agent left running in
the environment (command line, working directory, user and environment, read from ``/proc`` on the
host or inside the app container), with secret-looking variables and their values redacted.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shlex
import sqlite3
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, Field

from saasbench.failures import EnvError
from saasbench.redaction import MARKER, redact_text

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
OBJECTS_PREFIX = "objects/sha256/"
GZIP_LEVEL = 6
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# where a Docker container's diff is not the agent's work: kernel filesystems, the harness's service
# logs, the init binary Docker injects, the files Docker manages per container
CONTAINER_FS_EXCLUDES = (
    "/proc",
    "/sys",
    "/dev",
    "/tmp/saasbench-logs",
    "/usr/sbin/docker-init",
    "/etc/hostname",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/mtab",
)
# variables a fresh environment sets itself (its port, workspace and database may differ) or that
# only mark the harness's own commands: never replayed from a recorded process
ENVIRONMENT_VARIABLES = frozenset(
    {
        "PORT",
        "APP_PORT",
        "HOST",
        "SAASBENCH_WORKSPACE",
        "DATABASE_PATH",
        "DATABASE_URL",
        "SAASBENCH_EXEC",
        "SAASBENCH_SERVICE",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "HOSTNAME",
        "TERM",
    }
)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s/]+@")
_PROBE_MARK = "SAASBENCH_ENDSTATE_PROBE"

__all__ = [
    "FORMAT_VERSION",
    "Blob",
    "BlobCorrupt",
    "BlobMissing",
    "Component",
    "EndStateError",
    "FrozenState",
    "Manifest",
    "ProcessInfo",
    "RestartRecipe",
    "end_state_row",
    "freeze",
    "load_manifest",
    "object_key",
    "restart_recipe",
    "restore",
    "start_restored_app",
]


# --- errors ----------------------------------------------------------------------------------------
class EndStateError(EnvError):
    """An end state cannot be captured or restored (retryable like every environment failure)."""


class BlobMissing(EndStateError):
    """An object the manifest names is not in the store."""


class BlobCorrupt(EndStateError):
    """An object's bytes do not hash to its key (or to the size/hash the manifest recorded)."""


# --- the manifest ------------------------------------------------------------------------------------
class Blob(BaseModel):
    """One stored object: ``key`` is ``objects/sha256/<2 hex>/<sha256>`` of the stored bytes."""

    key: str
    sha256: str
    bytes: int = Field(description="Stored size (after compression)")
    raw_bytes: int = Field(description="Size before compression")
    compression: Literal["gzip", "none"] = "gzip"


ComponentKind = Literal["workspace", "sqlite", "postgres", "volumes", "container_fs"]


class Component(BaseModel):
    """One part of an end state (see the module docstring for each kind)."""

    kind: ComponentKind
    name: str = Field(description="workspace, sqlite, or the service's name")
    service: str | None = Field(default=None, description="Docker service the part belongs to")
    blob: Blob | None = Field(default=None, description="None when the part has no bytes (e.g. only deletions)")
    method: str = Field(description="How it was taken, e.g. tar, sqlite-backup, pg_dumpall, paused-volume-tar")
    path: str | None = Field(
        default=None, description="sqlite: the file relative to the workspace, or absolute when it lives outside"
    )
    location: Literal["workspace", "outside"] | None = Field(default=None, description="sqlite: where the file lives")
    mode: int | None = Field(default=None, description="sqlite: the file's permission bits")
    uid: int | None = None
    gid: int | None = None
    entries: int | None = Field(default=None, description="Entries in the tar")
    mounts: list[str] = Field(default_factory=list, description="volumes: the volume mount points in the container")
    roots: list[str] = Field(default_factory=list, description="container_fs: the paths archived (each recursively)")
    deleted: list[str] = Field(default_factory=list, description="container_fs: paths deleted from the image")
    excluded: list[str] = Field(default_factory=list, description="Paths deliberately left out")
    skipped: list[str] = Field(default_factory=list, description="Entries that cannot be stored (sockets, devices)")
    notes: list[str] = Field(default_factory=list)


class ProcessInfo(BaseModel):
    """A process the agent left running (the root of a process tree; ``descendants`` counts the rest)."""

    pid: int
    ppid: int | None = None
    argv: list[str]
    cwd: str | None = Field(default=None, description="As the process saw it")
    cwd_rel: str | None = Field(default=None, description="cwd relative to the workspace, when inside it")
    env: dict[str, str] = Field(default_factory=dict, description="Environment with secrets replaced by [REDACTED]")
    user: str | None = Field(default=None, description="Real uid")
    descendants: int = 0
    service: str | None = Field(default=None, description="The environment's service name when it started it")


class RestartRecipe(BaseModel):
    """How to start the frozen app again: the deployment contract, or the recorded processes."""

    source: Literal["contract", "processes", "none"]
    command: str | None = Field(default=None, description="The deployment contract's command (run in the workspace)")
    processes: list[ProcessInfo] = Field(default_factory=list)
    workspace_path: str = Field(description="The workspace as the frozen system's commands saw it")
    port: int | None = Field(default=None, description="The app port of the frozen environment")
    health_path: str | None = None

    def shell_command(self) -> str | None:
        """One shell command that starts the app in a fresh environment (run in its workspace with
        its variables, as :func:`~saasbench.environments.local.start_app` does): the contract's
        command, else every recorded process started in the background from its working directory
        with its non-secret variables (the old workspace path and port replaced by the new
        ``$SAASBENCH_WORKSPACE`` and ``$PORT``); None when there is nothing to start."""
        if self.source == "contract":
            return self.command
        if self.source != "processes" or not self.processes:
            return None
        parts = []
        for p in self.processes:
            if not p.argv:
                continue
            cd = (
                'cd "$SAASBENCH_WORKSPACE"' + (f"/{shlex.quote(p.cwd_rel)}" if p.cwd_rel not in (None, ".") else "")
                if p.cwd_rel is not None
                else (f"cd {shlex.quote(p.cwd)}" if p.cwd else "true")
            )
            assigns = [
                f"{k}={self._word(v)}"
                for k, v in sorted(p.env.items())
                if k not in ENVIRONMENT_VARIABLES and MARKER not in v and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
            ]
            argv = " ".join(self._word(a) for a in p.argv)
            env_prefix = ("env " + " ".join(assigns) + " ") if assigns else ""
            parts.append(f"( {cd} && exec {env_prefix}{argv} ) &")
        if not parts:
            return None
        return "\n".join(parts) + "\nwait"

    def _word(self, text: str) -> str:
        """``text`` shell-quoted, with the old workspace path and port replaced by the new ones."""
        if self.port is not None:
            port = str(self.port)
            if text == port:
                return '"$PORT"'
            m = re.fullmatch(rf"(.*[=:]){port}", text, flags=re.DOTALL)
            if m:
                return shlex.quote(m.group(1)) + '"$PORT"'
        ws = self.workspace_path.rstrip("/")
        if ws:
            pieces = re.split(rf"{re.escape(ws)}(?=[/:;]|$)", text)
            if len(pieces) > 1:
                return '"$SAASBENCH_WORKSPACE"'.join(shlex.quote(p) if p else "" for p in pieces)
        return shlex.quote(text)


class Manifest(BaseModel):
    """What one frozen end state holds (stored as canonical JSON under its own sha256 key)."""

    format_version: int = FORMAT_VERSION
    task_id: str
    backend: str
    created_at: _dt.datetime
    harness_version: str
    agent: str | None = None
    workspace_path: str = Field(description="The workspace as commands saw it (/app in a container)")
    app_port: int | None = None
    components: list[Component]
    restart: RestartRecipe
    raw_bytes: int = Field(default=0, description="Sum of the components' sizes before compression")
    total_bytes: int = Field(default=0, description="Sum of the components' stored sizes")

    def object_keys(self) -> list[str]:
        return [c.blob.key for c in self.components if c.blob is not None]

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


@dataclass
class FrozenState:
    """What :func:`freeze` stored."""

    manifest: Manifest
    manifest_key: str
    total_bytes: int  # stored size of the components and the manifest
    seconds: float
    new_objects: int = 0  # objects actually written (0 for content already in the store)
    new_bytes: int = 0

    @property
    def object_keys(self) -> list[str]:
        return [self.manifest_key, *self.manifest.object_keys()]


# --- the object store ----------------------------------------------------------------------------------
def object_key(digest: str) -> str:
    """The store key of content with this sha256 (hex)."""
    if not _HEX64.match(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return f"{OBJECTS_PREFIX}{digest[:2]}/{digest}"


def _digest_of_key(key: str) -> str:
    if not key.startswith(OBJECTS_PREFIX):
        raise EndStateError(f"{key!r} is not an object key (objects/sha256/<2 hex>/<sha256>)")
    digest = key.rsplit("/", 1)[-1]
    if not _HEX64.match(digest) or key != object_key(digest):
        raise EndStateError(f"{key!r} is not an object key (objects/sha256/<2 hex>/<sha256>)")
    return digest


class _Writer:
    """Puts objects, skipping content the store already has; counts what it wrote."""

    def __init__(self, store: Any):
        self.store = store
        self.new_objects = 0
        self.new_bytes = 0

    def put(self, data: bytes) -> tuple[str, str]:
        digest = hashlib.sha256(data).hexdigest()
        key = object_key(digest)
        if not _exists(self.store, key):
            self.store.put(key, data)
            self.new_objects += 1
            self.new_bytes += len(data)
        return key, digest

    def blob(self, raw: bytes, *, compress: bool = True) -> Blob:
        data = gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0) if compress else raw
        key, digest = self.put(data)
        return Blob(
            key=key, sha256=digest, bytes=len(data), raw_bytes=len(raw), compression="gzip" if compress else "none"
        )


def _exists(store: Any, key: str) -> bool:
    exists = getattr(store, "exists", None)
    if exists is not None:
        return bool(exists(key))
    return key in store.list(key)


def _get_verified(store: Any, key: str, sha256: str | None = None, size: int | None = None) -> bytes:
    digest = _digest_of_key(key)
    if sha256 is not None and sha256 != digest:
        raise BlobCorrupt(f"manifest names {key} with sha256 {sha256}: the key and the hash disagree")
    data = store.get(key)
    if data is None:
        raise BlobMissing(f"object {key} is missing from the store {getattr(store, 'uri', store)}")
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise BlobCorrupt(f"object {key} is corrupt: its bytes hash to {got}")
    if size is not None and len(data) != size:
        raise BlobCorrupt(f"object {key} is {len(data)} bytes, the manifest says {size}")
    return data


def _blob_bytes(store: Any, blob: Blob) -> bytes:
    data = _get_verified(store, blob.key, blob.sha256, blob.bytes)
    if blob.compression == "gzip":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise BlobCorrupt(f"object {blob.key} does not decompress: {exc}") from None
    if len(data) != blob.raw_bytes:
        raise BlobCorrupt(f"object {blob.key} holds {len(data)} bytes, the manifest says {blob.raw_bytes}")
    return data


def load_manifest(store: Any, manifest_key: str) -> Manifest:
    """The manifest stored under ``manifest_key`` (its hash checked). BlobMissing / BlobCorrupt."""
    data = _get_verified(store, manifest_key)
    try:
        manifest = Manifest.model_validate_json(data)
    except ValueError as exc:
        raise BlobCorrupt(f"object {manifest_key} is not an end-state manifest: {exc}") from None
    if manifest.format_version > FORMAT_VERSION:
        raise EndStateError(
            f"end state {manifest_key} has format {manifest.format_version}; this saasbench reads up to {FORMAT_VERSION}"
        )
    return manifest


# --- secrets in process environments --------------------------------------------------------------------
def _is_secret_name(name: str) -> bool:
    from saasbench.environments.exec_target import is_secret_name

    return is_secret_name(name)


def _host_secrets() -> list[str]:
    return [v for k, v in os.environ.items() if _is_secret_name(k) and v]


def redact_process(argv: list[str], env: Mapping[str, str], extra_secrets: Iterable[str] = ()) -> tuple[list, dict]:
    """``argv`` and ``env`` with secret-looking variables' values replaced by the redaction marker,
    and every such value (and the harness's own secrets) masked wherever else it appears, passwords
    in URLs included."""
    secrets = [v for k, v in env.items() if _is_secret_name(k) and v] + _host_secrets() + list(extra_secrets)

    def clean(text: str) -> str:
        return _URL_PASSWORD.sub(lambda m: m.group(1) + MARKER + "@", redact_text(text, secrets))

    out_env = {k: (MARKER if _is_secret_name(k) and v else clean(v)) for k, v in env.items()}
    return [clean(a) for a in argv], out_env


# --- the restart recipe ------------------------------------------------------------------------------------
def restart_recipe(env: Any, task: Any = None, agent: Any = None) -> RestartRecipe:
    """The deployment contract when the task or agent has one, else the processes left running."""
    command = agent.app_start_command(task) if agent is not None and task is not None else None
    if command is None and task is not None:  # as start_app: the agent's command, else the task's
        command = task.spec.app.start_command
    processes = _running_processes(env)
    source: Literal["contract", "processes", "none"] = "contract" if command else "processes" if processes else "none"
    return RestartRecipe(
        source=source,
        command=command or None,
        processes=processes,
        workspace_path=env.workspace_path,
        port=_app_port(env),
        health_path=task.spec.app.health_path if task is not None else None,
    )


def _app_port(env: Any) -> int | None:
    with contextlib.suppress(Exception):
        return int(env.app_port)
    return None


def _running_processes(env: Any) -> list[ProcessInfo]:
    if _is_docker(env):
        raw = _docker_processes(env)
    else:
        raw = _local_processes(env)
    return _roots(raw, env.workspace_path)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _parse_proc(pid: int, stat_b: bytes, cmdline: bytes, cwd: str | None, environ: bytes, status: bytes) -> dict:
    try:
        rest = stat_b.rsplit(b")", 1)[1].split()
        state, ppid, starttime = rest[0].decode(), int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        state, ppid, starttime = "?", None, 0
    uid = None
    for line in status.decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            uid = line.split()[1]
    env = {}
    for item in environ.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode("utf-8", "replace").partition("=")
            env[k] = v
    argv = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0")]
    if argv and argv[-1] == "":
        argv.pop()
    return {
        "pid": pid,
        "ppid": ppid,
        "state": state,
        "start": starttime,
        "argv": argv,
        "cwd": cwd,
        "env": env,
        "uid": uid,
    }


def _local_processes(env: Any) -> list[dict]:
    """Processes of this environment on the host: every process group it started as a service, and
    any process whose environment names this workspace (``SAASBENCH_WORKSPACE``: every command and
    service the environment starts has it, also those that left their process group)."""
    if not os.path.isdir("/proc"):
        return []
    from saasbench.environments.base import group_members

    ws = str(env.workspace_path)
    pids: dict[int, str | None] = {}
    services = env.services() if hasattr(env, "services") else {}
    for name, svc in services.items():
        for pid in group_members(svc.pgid):
            pids[pid] = name
    marker = f"SAASBENCH_WORKSPACE={ws}".encode()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in pids or int(entry) == me:
            continue
        environ = _read(f"/proc/{entry}/environ")
        if marker in environ.split(b"\0"):
            pids[int(entry)] = None
    out = []
    for pid, service in pids.items():
        base = f"/proc/{pid}"
        try:
            cwd = os.readlink(f"{base}/cwd")
        except OSError:
            cwd = None
        info = _parse_proc(
            pid, _read(f"{base}/stat"), _read(f"{base}/cmdline"), cwd, _read(f"{base}/environ"), _read(f"{base}/status")
        )
        if info["state"] in ("Z", "X") or not info["argv"]:
            continue
        if os.path.basename(info["argv"][0]) == "bwrap":  # the local sandbox's wrapper, not a process of the app
            continue
        info["service"] = service
        out.append(info)
    return out


# One record per process of the container: \x1e pid \x1f stat \x1f cmdline \x1f cwd \x1f environ \x1f status
_PS_SCRIPT = r"""
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] && continue
  printf '\036%s\037' "$p"
  cat "$d/stat" 2>/dev/null; printf '\037'
  cat "$d/cmdline" 2>/dev/null; printf '\037'
  readlink "$d/cwd" 2>/dev/null; printf '\037'
  cat "$d/environ" 2>/dev/null; printf '\037'
  cat "$d/status" 2>/dev/null
done
"""


def _docker_processes(env: Any) -> list[dict]:
    """Processes in the app container, read from its /proc by exec, without PID 1 (the init), the
    container's own main command (the image or spec starts it again) and this probe."""
    container = env.container()
    code, out, err = _docker_exec(env, container, ["/bin/sh", "-c", _PS_SCRIPT], user="0", env={_PROBE_MARK: "1"})
    if code != 0:
        raise EndStateError(f"cannot list the processes of {container.name}: exit {code}: {err.decode()[-300:]}")
    procs = []
    for rec in out.split(b"\x1e")[1:]:
        fields = rec.split(b"\x1f")
        if len(fields) < 6:
            continue
        try:
            pid = int(fields[0])
        except ValueError:
            continue
        cwd = fields[3].decode("utf-8", "replace").strip() or None
        info = _parse_proc(pid, fields[1], fields[2], cwd, fields[4], fields[5])
        if info["state"] in ("Z", "X") or not info["argv"] or _PROBE_MARK in info["env"]:
            continue
        info["service"] = None
        procs.append(info)
    excluded = {1}
    main = sorted((p for p in procs if p["ppid"] == 1), key=lambda p: (p["start"], p["pid"]))
    if main:  # the container's command under docker-init, and everything below it
        excluded.add(main[0]["pid"])
    changed = True
    while changed:
        changed = False
        for p in procs:
            if p["pid"] not in excluded and p["ppid"] in excluded and p["ppid"] != 1:
                excluded.add(p["pid"])
                changed = True
    marks = {m: name for name, m in _service_marks(env).items()}
    left: list[dict] = []
    for p in procs:
        if p["pid"] in excluded:
            continue
        p["service"] = marks.get(p["env"].get("SAASBENCH_SERVICE"))
        left.append(p)
    return left


def _is_docker(env: Any) -> bool:
    """The Docker backend's parts (service dumps, container changes) speak the Docker API."""
    from saasbench.environments.docker import DockerEnvironment

    return isinstance(env, DockerEnvironment)


def _service_marks(env: Any) -> dict[str, str]:
    return env.service_marks if _is_docker(env) else {}


def _roots(procs: list[dict], workspace: str) -> list[ProcessInfo]:
    """The roots of the process trees (a process whose parent is not among them), with their
    descendants counted and their environments redacted, in pid order."""
    pids = {p["pid"] for p in procs}
    children: dict[int, list[int]] = {}
    for p in procs:
        if p["ppid"] is not None:
            children.setdefault(p["ppid"], []).append(p["pid"])

    def count(pid: int) -> int:
        return sum(1 + count(c) for c in children.get(pid, []) if c in pids)

    out = []
    ws = workspace.rstrip("/") or "/"
    for p in sorted(procs, key=lambda p: p["pid"]):
        if p["ppid"] in pids:
            continue
        argv, env = redact_process(p["argv"], p["env"])
        cwd = p["cwd"]
        rel = None
        if cwd and (cwd == ws or cwd.startswith(ws + "/")):
            rel = posixpath.relpath(cwd, ws)
        out.append(
            ProcessInfo(
                pid=p["pid"],
                ppid=p["ppid"],
                argv=argv,
                cwd=cwd,
                cwd_rel=rel,
                env=env,
                user=p["uid"],
                descendants=count(p["pid"]),
                service=p.get("service"),
            )
        )
    return out


# --- workspace tar -----------------------------------------------------------------------------------------
def _sqlite_host_path(env: Any) -> Path | None:
    dsn = None
    with contextlib.suppress(Exception):
        dsn = env.db_dsn
    if not dsn or not dsn.startswith("sqlite:///"):
        return None
    return Path(dsn[len("sqlite:///") :])


def _sqlite_sidecars(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))]


def tar_tree(root: Path, *, exclude: Iterable[Path] = ()) -> tuple[bytes, int, list[str]]:
    """A deterministic tar (PAX) of ``root``: entries in name order, ``.`` first; modes, numeric
    owners and whole-second mtimes kept; symlinks stored as links (never followed), hard links as
    links; sockets and device files skipped. Returns (tar bytes, entries, skipped paths)."""
    root = Path(root)
    skip = {str(p if p.is_absolute() else root / p) for p in exclude}
    buf = io.BytesIO()
    entries = 0
    skipped: list[str] = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(path: str, arcname: str) -> None:
            nonlocal entries
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return  # removed while walking
            if stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                skipped.append(arcname)
                return
            info = tar.gettarinfo(path, arcname)
            if info is None:
                skipped.append(arcname)
                return
            info.uname = info.gname = ""
            info.mtime = int(st.st_mtime)
            if info.isreg():
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError:
                    skipped.append(arcname)
                    return
                info.size = len(data)  # the bytes read, even when the file changed since lstat
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
            entries += 1

        add(str(root), ".")
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            rel_dir = os.path.relpath(dirpath, root)
            names = sorted(dirnames + filenames)
            keep_dirs = []
            for name in names:
                full = os.path.join(dirpath, name)
                if full in skip:
                    continue
                arc = name if rel_dir == "." else f"{rel_dir}/{name}"
                add(full, arc)
                if name in dirnames and not os.path.islink(full):
                    keep_dirs.append(name)
            dirnames[:] = sorted(keep_dirs)
    return buf.getvalue(), entries, skipped


def _check_member(member: tarfile.TarInfo, links: set[str]) -> None:
    def below_link(parts: tuple[str, ...]) -> str | None:
        return next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in links), None)

    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts:
        raise BlobCorrupt(f"end-state tar entry {name!r} leaves the destination")
    link = below_link(parts)
    if link is not None:
        raise BlobCorrupt(f"end-state tar entry {name!r} lies below the symlink {link!r}")
    if member.islnk():
        target = PurePosixPath(member.linkname).parts
        if member.linkname.startswith("/") or ".." in target or below_link(target) or member.linkname in links:
            raise BlobCorrupt(f"end-state tar hard link {name!r} -> {member.linkname!r} leaves the destination")
    if member.issym():
        links.add(name.rstrip("/"))


def untar_tree(data: bytes, dest: Path) -> int:
    """Unpack a :func:`tar_tree` archive into ``dest`` exactly (modes, links, owners when root).
    Every entry is checked first: one that would land outside ``dest``, below a symlink of the
    archive, or a hard link to something outside raises BlobCorrupt and nothing is written.
    Symlinks are made as recorded, wherever they point (they are the agent's; never followed here)."""
    links: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, links)
        keep = [m for m in members if not m.isdev()]
        # checked above; "fully_trusted" keeps modes and out-pointing symlinks exactly (Python >= 3.12
        # warns without a filter and 3.14 defaults to "data", which would refuse those symlinks)
        if hasattr(tarfile, "fully_trusted_filter"):
            tar.extractall(dest, members=keep, numeric_owner=True, filter="fully_trusted")
        else:  # Python 3.11 before 3.11.4: no filters, the same behaviour
            tar.extractall(dest, members=keep, numeric_owner=True)
    return len(members)


# --- SQLite -------------------------------------------------------------------------------------------------
def sqlite_snapshot(path: Path) -> bytes:
    """A consistent copy of the SQLite database at ``path`` (online backup API: safe while another
    process writes; WAL content included). Opened read-only when possible, so nothing is checkpointed."""
    with tempfile.TemporaryDirectory(prefix="saasbench-endstate-") as tmp:
        out = Path(tmp) / "copy.db"
        src = None
        try:
            try:
                src = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=30)
                src.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.Error:
                if src is not None:
                    src.close()
                src = sqlite3.connect(str(path), timeout=30)
            dst = sqlite3.connect(str(out))
            try:
                src.backup(dst)
            finally:
                dst.close()
        except sqlite3.Error as exc:
            raise EndStateError(f"cannot copy the SQLite database {path}: {exc}") from None
        finally:
            if src is not None:
                src.close()
        return out.read_bytes()


# --- Docker helpers -----------------------------------------------------------------------------------------
def _docker_exec(
    denv: Any, container: Any, argv: list[str], *, user: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` in ``container`` and return (exit code, stdout, stderr), output uncapped (dumps)."""
    api = denv.client.api
    try:
        exec_id = api.exec_create(container.id, argv, user=user or "", environment=dict(env or {}))["Id"]
        stream = api.exec_start(exec_id, stream=True, demux=True)
        out, err = io.BytesIO(), io.BytesIO()
        for o, e in stream:
            if o:
                out.write(o)
            if e:
                err.write(e)
        code = api.exec_inspect(exec_id).get("ExitCode")
    except Exception as exc:  # noqa: BLE001 - any docker error: an environment failure naming the container
        raise EndStateError(f"cannot exec {argv[0]} in {getattr(container, 'name', container)}: {exc}") from exc
    return (code if code is not None else -1), out.getvalue(), err.getvalue()


def _archive(container: Any, path: str) -> bytes:
    try:
        stream, _stat = container.get_archive(path)
        return b"".join(stream)
    except Exception as exc:  # noqa: BLE001 - any docker error, re-raised with the path
        raise EndStateError(f"cannot read {path} from {container.name}: {exc}") from exc


def _excluded(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def _repack(out: tarfile.TarFile, data: bytes, root: str, excludes: Iterable[str], seen: set[str] | None = None) -> int:
    """Add the members of a ``get_archive(root)`` tar to ``out`` under their absolute paths
    (without the leading /), dropping those under ``excludes``."""
    base = posixpath.dirname(root.rstrip("/")) or "/"
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            full = posixpath.normpath(posixpath.join(base, m.name))
            if _excluded(full, excludes):
                continue
            name = full.lstrip("/")
            if not name or (seen is not None and name in seen):
                continue
            if seen is not None:
                seen.add(name)
            m.name = name
            if m.islnk():
                m.linkname = posixpath.normpath(posixpath.join(base, m.linkname)).lstrip("/")
            m.uname = m.gname = ""
            out.addfile(m, tar.extractfile(m) if m.isreg() else None)
            n += 1
    return n


def _mounts(container: Any) -> list[dict]:
    container.reload()
    return list(container.attrs.get("Mounts") or [])


def _container_fs(env: Any, writer: _Writer, service: str) -> Component:
    container = env.container(service)
    mounts = [m["Destination"] for m in _mounts(container)]
    excludes = [*CONTAINER_FS_EXCLUDES, *mounts]
    diff = container.diff() or []
    changed = [(d["Path"], d["Kind"]) for d in diff]
    ancestors = set()
    for path, _kind in changed:
        p = posixpath.dirname(path)
        while p not in ("/", "") and p not in ancestors:
            ancestors.add(p)
            p = posixpath.dirname(p)
    keep = [(p, k) for p, k in changed if not _excluded(p, excludes)]
    added = {p for p, k in keep if k == 1}
    modified = {p for p, k in keep if k == 0}
    deleted = {p for p, k in keep if k == 2}
    roots = sorted(
        [p for p in added if posixpath.dirname(p) not in added] + [p for p in modified if p not in ancestors]
    )
    deleted_roots = sorted(p for p in deleted if posixpath.dirname(p) not in deleted)
    buf = io.BytesIO()
    entries = 0
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for root in roots:
            entries += _repack(out, _archive(container, root), root, excludes, seen)
    blob = writer.blob(buf.getvalue()) if entries else None
    return Component(
        kind="container_fs",
        name=service,
        service=service,
        blob=blob,
        method="diff+get_archive",
        entries=entries,
        roots=roots,
        deleted=deleted_roots,
        excluded=sorted(set(excludes)),
    )


def _probe(env: Any, container: Any, script: str) -> tuple[int, str]:
    code, out, err = _docker_exec(env, container, ["/bin/sh", "-c", script])
    return code, (out + err).decode("utf-8", "replace")


_PG_ENV = 'export PGPASSWORD="${POSTGRES_PASSWORD:-}"; U="${POSTGRES_USER:-postgres}"; '


# What a service container runs, in one exec: "postgres [postgres]" (a PostgreSQL server answers on
# its local socket; the OS user postgres exists), "redis" (redis-cli ping answers PONG), else "other"
_DETECT = (
    "if command -v pg_dumpall >/dev/null 2>&1 && command -v psql >/dev/null 2>&1 && pg_isready -q 2>/dev/null; "
    'then if id postgres >/dev/null 2>&1; then echo "postgres postgres"; else echo postgres; fi; '
    "elif command -v redis-cli >/dev/null 2>&1 && redis-cli ping 2>/dev/null | grep -q PONG; then echo redis; "
    "else echo other; fi"
)


def _detect(env: Any, container: Any) -> tuple[str, str | None]:
    """(kind, OS user to exec as): postgres (as user postgres when the image has one: local socket
    with trust or peer authentication), redis, or other."""
    code, out = _probe(env, container, _DETECT)
    words = out.split() if code == 0 else []
    if not words:
        return "other", None
    return words[0], (words[1] if len(words) > 1 else None)


def _service_component(env: Any, writer: _Writer, service: str) -> Component | None:
    container = env.container(service)
    container.reload()
    if (container.attrs.get("State") or {}).get("Status") != "running":
        return None  # a one-shot service that completed: the fresh environment runs it again
    app = service == env.app_name
    kind, user = ("other", None) if app else _detect(env, container)
    if kind == "postgres":
        code, out, err = _docker_exec(
            env,
            container,
            ["/bin/sh", "-c", _PG_ENV + 'exec pg_dumpall -U "$U" --clean --if-exists'],
            user=user,
        )
        if code != 0:
            raise EndStateError(f"pg_dumpall in service {service!r} failed ({code}): {err.decode()[-500:]}")
        return Component(
            kind="postgres",
            name=service,
            service=service,
            blob=writer.blob(out),
            method="pg_dumpall --clean --if-exists",
        )
    volumes = [m for m in _mounts(container) if m.get("Type") == "volume"]
    if not volumes:
        return None
    notes = []
    if kind == "redis":
        code, said = _probe(env, container, "redis-cli SAVE")
        notes.append(f"redis-cli SAVE: {said.strip()[:200]}")
        if code != 0 or "OK" not in said:
            raise EndStateError(f"redis-cli SAVE in service {service!r} failed: {said.strip()[:300]}")
    dests = sorted(m["Destination"] for m in volumes)
    buf = io.BytesIO()
    entries = 0
    container.pause()
    try:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out_tar:
            for dest in dests:
                entries += _repack(out_tar, _archive(container, dest), dest, ())
    finally:
        container.unpause()
    return Component(
        kind="volumes",
        name=service,
        service=service,
        blob=writer.blob(buf.getvalue()),
        method="paused-volume-tar",
        entries=entries,
        mounts=dests,
        notes=notes,
    )


# --- freeze ------------------------------------------------------------------------------------------------
def freeze(env: Any, task: Any, store: Any, *, agent: Any = None) -> FrozenState:
    """Capture the end state of a started environment (after the rollout, before the evaluation)
    into ``store`` (a lake :class:`~saasbench.lake.store.Store` or a lake URI)."""
    from saasbench import __version__
    from saasbench.lake.store import lake_from_uri

    t0 = time.monotonic()
    store = lake_from_uri(store)
    writer = _Writer(store)
    backend = env.kind  # a label for the manifest: restore needs the same backend
    recipe = restart_recipe(env, task, agent)  # first: what runs now, before anything is touched
    components: list[Component] = []
    ws = Path(env.workspace_dir)
    exclude: list[Path] = []
    db = _sqlite_host_path(env)
    if db is not None and db.is_file():
        inside = db.parent == ws or ws in db.parents
        raw = sqlite_snapshot(db)
        st = os.stat(db)
        components.append(
            Component(
                kind="sqlite",
                name="sqlite",
                blob=writer.blob(raw),
                method="sqlite-backup",
                path=db.relative_to(ws).as_posix() if inside else str(db),
                location="workspace" if inside else "outside",
                mode=stat.S_IMODE(st.st_mode),
                uid=st.st_uid,
                gid=st.st_gid,
            )
        )
        if inside:
            exclude += [p.relative_to(ws) for p in _sqlite_sidecars(db)]
    data, entries, skipped = tar_tree(ws, exclude=exclude)
    components.insert(
        0,
        Component(
            kind="workspace",
            name="workspace",
            blob=writer.blob(data),
            method="tar",
            entries=entries,
            excluded=[p.as_posix() for p in exclude],
            skipped=skipped,
        ),
    )
    if _is_docker(env):
        # one service after another: side by side measured no faster on a 2-CPU host (docs/benchmarks.md)
        for name in env.spec.start_order():
            comp = _service_component(env, writer, name)
            if comp is not None:
                components.append(comp)
        components.append(_container_fs(env, writer, env.app_name))
    manifest = Manifest(
        task_id=(task or env.task).id if (task or env.task) is not None else "adhoc",
        backend=backend,
        created_at=_dt.datetime.now(_dt.UTC),
        harness_version=__version__,
        agent=getattr(agent, "name", None),
        workspace_path=env.workspace_path,
        app_port=_app_port(env),
        components=components,
        restart=recipe,
        raw_bytes=sum(c.blob.raw_bytes for c in components if c.blob),
        total_bytes=sum(c.blob.bytes for c in components if c.blob),
    )
    body = manifest.to_bytes()
    manifest_key, _ = writer.put(body)
    return FrozenState(
        manifest=manifest,
        manifest_key=manifest_key,
        total_bytes=manifest.total_bytes + len(body),
        seconds=time.monotonic() - t0,
        new_objects=writer.new_objects,
        new_bytes=writer.new_bytes,
    )


# --- restore ------------------------------------------------------------------------------------------------
def restore(store: Any, manifest: str | Manifest | FrozenState, env: Any) -> RestartRecipe:
    """Put a frozen end state back into ``env``: a started, fresh environment of the same backend
    (same task, nothing run in it yet). Every object is fetched and checked before anything is
    written, so a missing (:class:`BlobMissing`) or damaged (:class:`BlobCorrupt`) object leaves
    the environment untouched. Returns the restart recipe (start it with :func:`start_restored_app`)."""
    from saasbench.lake.store import lake_from_uri

    store = lake_from_uri(store)
    if isinstance(manifest, FrozenState):
        manifest = manifest.manifest_key
    if isinstance(manifest, str):
        manifest = load_manifest(store, manifest)
    backend = env.kind
    if manifest.backend != backend:
        raise EndStateError(f"end state of backend {manifest.backend!r} cannot be restored into {backend!r}")
    blobs = {c.blob.key: _blob_bytes(store, c.blob) for c in manifest.components if c.blob is not None}
    ws = Path(env.workspace_dir)
    for comp in manifest.components:
        data = blobs.get(comp.blob.key) if comp.blob is not None else None
        if comp.kind == "workspace" and data is not None:
            untar_tree(data, ws)
        elif comp.kind == "sqlite" and data is not None:
            _restore_sqlite(env, comp, data, ws)
    if _is_docker(env):
        by_service = {c.service: c for c in manifest.components if c.kind in ("postgres", "volumes")}
        unknown = set(by_service) - set(env.spec.services)
        if unknown:
            raise EndStateError(f"the fresh environment has no service {', '.join(sorted(map(str, unknown)))}")
        for service in env.spec.start_order():  # dependencies first
            part = by_service.get(service)
            if part is None:
                continue
            data = blobs[part.blob.key] if part.blob is not None else b""
            if part.kind == "postgres":
                _restore_postgres(env, service, data)
            else:
                _restore_volumes(env, service, part, data)
        for comp in manifest.components:
            if comp.kind == "container_fs":
                _restore_container_fs(env, comp, blobs.get(comp.blob.key) if comp.blob else None)
    return manifest.restart


def _restore_sqlite(env: Any, comp: Component, data: bytes, ws: Path) -> None:
    target = ws / (comp.path or "") if comp.location == "workspace" else _sqlite_host_path(env)
    if target is None:
        raise EndStateError("the end state has a SQLite database but the fresh environment has none")
    for side in _sqlite_sidecars(target)[1:]:
        with contextlib.suppress(FileNotFoundError):
            side.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.endstate-tmp")
    tmp.write_bytes(data)
    if comp.mode is not None:
        os.chmod(tmp, comp.mode)
    if os.geteuid() == 0 and comp.uid is not None:
        with contextlib.suppress(OSError):
            os.chown(tmp, comp.uid, comp.gid if comp.gid is not None else -1)
    os.replace(tmp, target)


def _put_archive(container: Any, path: str, data: bytes) -> None:
    try:
        ok = container.put_archive(path, data)
    except Exception as exc:  # noqa: BLE001 - any docker error, re-raised with the container
        raise EndStateError(f"cannot write into {container.name}: {exc}") from exc
    if not ok:
        raise EndStateError(f"cannot write into {container.name} at {path}")


_EXPECTED_PG_ERRORS = ("cannot be dropped", "already exists")


def _restore_postgres(env: Any, service: str, sql: bytes) -> None:
    container = env.container(service)
    kind, user = _detect(env, container)
    if kind != "postgres":
        raise EndStateError(f"service {service!r} of the fresh environment is not a running PostgreSQL")
    name = f"saasbench-endstate-{os.getpid()}-{time.monotonic_ns()}.sql"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(sql), 0o644
        tar.addfile(info, io.BytesIO(sql))
    _put_archive(container, "/tmp", buf.getvalue())
    # the dump restores every role's password as frozen; the fresh container's own superuser
    # password (POSTGRES_PASSWORD, which a task may generate per environment) is set again after it
    script = (
        _PG_ENV
        + f'psql -X -q -o /dev/null -U "$U" -d postgres -f /tmp/{name} 2>&1; rc=$?; rm -f /tmp/{name}; '
        + 'if [ -n "$PGPASSWORD" ]; then echo "ALTER ROLE :\\"u\\" PASSWORD :\'p\';" | psql -X -q -o /dev/null '
        + '-U "$U" -d postgres -v u="$U" -v p="$PGPASSWORD" -v ON_ERROR_STOP=1 2>&1 || rc=$?; fi; exit $rc'
    )
    code, out, _ = _docker_exec(env, container, ["/bin/sh", "-c", script], user=user)
    text = out.decode("utf-8", "replace")
    errors = [
        line for line in text.splitlines() if "ERROR:" in line and not any(e in line for e in _EXPECTED_PG_ERRORS)
    ]
    if code != 0:
        raise EndStateError(f"loading the dump into service {service!r} failed ({code}): {text[-800:]}")
    for line in errors:
        log.warning("end-state restore, service %s: %s", service, line)


_CLEAR_SCRIPT = 'for d in "$@"; do [ -d "$d" ] && find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} +; done; true'


def _restore_volumes(env: Any, service: str, comp: Component, data: bytes) -> None:
    """Stop the fresh service, empty its volumes (a helper container sharing them), unpack the
    frozen files, start it again and wait until it is healthy."""
    import docker.errors

    container = env.container(service)
    fresh = sorted(m["Destination"] for m in _mounts(container) if m.get("Type") == "volume")
    missing = set(comp.mounts) - set(fresh)
    if missing:
        raise EndStateError(f"service {service!r} of the fresh environment has no volume at {sorted(missing)}")
    if service == env.app_name:  # nothing runs there yet; a restart would cut the evaluator's proxy
        code, _out, err = _docker_exec(
            env, container, ["/bin/sh", "-c", _CLEAR_SCRIPT, "clear", *comp.mounts], user="0"
        )
        if code != 0:
            raise EndStateError(f"emptying the volumes of service {service!r} failed: {err.decode()[-500:]}")
        _put_archive(container, "/", data)
        return
    client = env.client
    try:
        container.stop(timeout=30)
        helper = client.containers.run(
            container.attrs["Image"],
            ["saasbench-endstate-clear", *comp.mounts],
            entrypoint=["/bin/sh", "-c", _CLEAR_SCRIPT],
            volumes_from=[container.id],
            network_mode="none",
            user="0",
            labels=env.labels(f"{service}-endstate"),
            detach=True,
        )
        try:
            result = helper.wait(timeout=120)
            if result.get("StatusCode") != 0:
                raise EndStateError(
                    f"emptying the volumes of service {service!r} failed: {helper.logs().decode()[-500:]}"
                )
        finally:
            with contextlib.suppress(docker.errors.APIError):
                helper.remove(force=True)
        _put_archive(container, "/", data)
        container.start()
    except docker.errors.APIError as exc:
        raise EndStateError(f"cannot restore the volumes of service {service!r}: {exc}") from exc
    _wait_service(env, service)


def _wait_service(env: Any, service: str) -> None:
    svc = env.spec.services[service]
    container = env.container(service)
    deadline = time.monotonic() + max(float(env.health_deadline_s or 60.0), 1.0)
    while True:
        container.reload()
        state = container.attrs.get("State") or {}
        if state.get("Status") in ("exited", "dead"):
            raise EndStateError(
                f"service {service!r} exited with code {state.get('ExitCode')} after its data was restored: "
                + container.logs(tail=20).decode("utf-8", "replace")
            )
        if svc.healthcheck is None:
            if state.get("Status") == "running":
                return
        else:
            code, _out, _err = _docker_exec(env, container, svc.healthcheck.argv())
            if code == 0:
                return
        if time.monotonic() >= deadline:
            raise EndStateError(f"service {service!r} not healthy after its data was restored")
        time.sleep(0.25)


def _restore_container_fs(env: Any, comp: Component, data: bytes | None) -> None:
    container = env.container(comp.service or env.app_name)
    if comp.deleted:
        code, _out, err = _docker_exec(env, container, ["rm", "-rf", "--", *comp.deleted], user="0")
        if code != 0:
            raise EndStateError(f"cannot delete {comp.deleted[:5]} in {container.name}: {err.decode()[-300:]}")
    if data:
        _put_archive(container, "/", data)


# --- after restore ------------------------------------------------------------------------------------------
def start_restored_app(recipe: RestartRecipe, task: Any, env: Any, *, deadline_s: float | None = None) -> Any:
    """Start the restored app by its recipe (:func:`~saasbench.environments.local.start_app` with
    :meth:`RestartRecipe.shell_command`) and wait for health. Returns the AppStart."""
    from saasbench.environments.base import start_app

    return start_app(task, env, command=recipe.shell_command() or "", deadline_s=deadline_s)


# --- trial records ------------------------------------------------------------------------------------------
def store_record(store: Any, record: Mapping[str, Any]) -> str:
    """A JSON record of a trial (its rollout, its evaluation before judging) stored content-addressed
    (gzip): ``saasbench rescore`` seeds a new trial's stages with it. Returns its object key."""
    from saasbench.lake.store import lake_from_uri

    raw = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()
    return _Writer(lake_from_uri(store)).blob(raw).key


def load_record(store: Any, key: str) -> dict[str, Any]:
    """A record stored by :func:`store_record`, checked against its key's hash."""
    from saasbench.lake.store import lake_from_uri

    data = _get_verified(lake_from_uri(store), key)
    try:
        out = json.loads(gzip.decompress(data))
    except (OSError, EOFError, ValueError) as exc:
        raise BlobCorrupt(f"record {key} is not gzip JSON: {exc}") from None
    if not isinstance(out, dict):
        raise BlobCorrupt(f"record {key} is not a JSON object")
    return out


# --- the lake row -------------------------------------------------------------------------------------------
def end_state_row(
    frozen: FrozenState,
    *,
    sweep_id: str,
    trial_id: str,
    task_id: str | None = None,
    agent: str | None = None,
    model: str | None = None,
    attempt: int | None = None,
    rollout_key: str | None = None,
    evaluation_key: str | None = None,
) -> dict[str, Any]:
    """The ``end_states`` row of a trial (write it with the trial's other rows: ``write_trial``
    replaces a trial's unit as a whole). ``rollout_key``/``evaluation_key``: the trial's records
    (:func:`store_record`) that ``saasbench rescore`` needs besides the state itself."""
    m = frozen.manifest
    components = [
        {
            "kind": c.kind,
            "name": c.name,
            "service": c.service,
            "method": c.method,
            "key": c.blob.key if c.blob else None,
            "bytes": c.blob.bytes if c.blob else 0,
            "raw_bytes": c.blob.raw_bytes if c.blob else 0,
        }
        for c in m.components
    ]
    return {
        "sweep_id": sweep_id,
        "trial_id": trial_id,
        "task_id": task_id or m.task_id,
        "agent": agent if agent is not None else m.agent,
        "model": model,
        "attempt": attempt,
        "manifest_key": frozen.manifest_key,
        "backend": m.backend,
        "format_version": m.format_version,
        "total_bytes": frozen.total_bytes,
        "raw_bytes": m.raw_bytes,
        "new_bytes": frozen.new_bytes,
        "components_json": json.dumps(components, sort_keys=True),
        "object_keys": [*frozen.object_keys, *(k for k in (rollout_key, evaluation_key) if k)],
        "rollout_key": rollout_key,
        "evaluation_key": evaluation_key,
        "restart_source": m.restart.source,
        "freeze_s": frozen.seconds,
        "created_at": m.created_at,
        "harness_version": m.harness_version,
    }
