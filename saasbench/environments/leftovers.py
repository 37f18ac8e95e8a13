"""What a killed harness leaves on this host, and ``saasbench env prune`` for the local backend.

A harness that is SIGKILLed (or loses its machine's power) never runs ``stop()``: app servers, the
processes they ``setsid``-ed away from their group, the model gateway's proxy and the ephemeral
Prefect server keep running, and temporary workspaces stay. Two records let a later
:func:`prune` find them:

- **Ledgers.** Each started :class:`~saasbench.environments.local.LocalEnvironment` keeps a JSON file
  under :func:`runtime_dir` naming its owner (pid and start time), its temporary workspace and state
  folder, and the process groups it started (pid, start time); ``stop()`` removes it.
- **Owner tags.** Every process the harness starts carries ``SAASBENCH_OWNER=<pid>:<start time>`` of
  the harness process in its environment (the local backend's commands and services, the gateway's
  proxy, and, through ``os.environ``, the ephemeral Prefect server of ``run``/``sweep``/``demo``), and
  the local backend's also ``SAASBENCH_ENV_ID=<id>``; children inherit them, ``setsid`` or not.

:func:`prune` acts only on owners that are gone (a pid that no longer exists, or exists with another
start time): it kills the recorded groups and every process tagged with a dead owner (SIGTERM, then
SIGKILL after a grace period), then removes the temporary workspaces and state folders and the
ledger. Live harnesses are never touched. (Inside the bubblewrap sandbox, :mod:`.sandbox`, the
processes of a killed harness die with it; their ledgers and folders are still left for prune.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from saasbench import settings
from saasbench.environments.base import group_members, pid_alive

__all__ = [
    "ENV_TAG",
    "OWNER_TAG",
    "Leftover",
    "Ledger",
    "find_leftovers",
    "kill_pids",
    "owner_alive",
    "owner_tag",
    "pid_start",
    "prune",
    "runtime_dir",
    "tagged_pids",
]

OWNER_TAG = "SAASBENCH_OWNER"
ENV_TAG = "SAASBENCH_ENV_ID"
GRACE_S = 3.0


def runtime_dir() -> Path:
    """Where the ledgers live: ``$SAASBENCH_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/saasbench``, else
    ``<temp>/saasbench-<uid>``; its ``local/`` folder holds one ledger per live environment."""
    value = settings.get("SAASBENCH_RUNTIME_DIR")
    if value:
        return Path(value)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "saasbench"
    return Path(tempfile.gettempdir()) / f"saasbench-{os.getuid()}"


def pid_start(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc): tells a reused pid apart; "" when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def owner_tag(pid: int | None = None) -> str:
    """``<pid>:<start time>`` of this process (or ``pid``): the value of :data:`OWNER_TAG`."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{pid_start(pid)}"


def owner_alive(tag: str) -> bool:
    """Whether the process a tag names still runs (same pid, same start time)."""
    pid_text, _, start = tag.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return bool(start) and pid_alive(pid) and pid_start(pid) == start


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (OWNER_TAG.encode(), ENV_TAG.encode()):
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def _tags() -> dict[int, dict[str, str]]:
    """Every live process of this host that carries an owner or environment tag -> its tags."""
    me = os.getpid()
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and int(entry) != me:
            tags = _environ(int(entry))
            if tags and pid_alive(int(entry)):
                out[int(entry)] = tags
    return out


def tagged_pids(env_id: str) -> list[int]:
    """Live processes whose environment holds ``SAASBENCH_ENV_ID=<env_id>``."""
    return sorted(pid for pid, tags in _tags().items() if tags.get(ENV_TAG) == env_id)


def kill_pids(pids: list[int], pgids: list[int] = (), grace_s: float = GRACE_S) -> None:  # type: ignore[assignment]
    """SIGTERM the groups ``pgids`` and the processes ``pids``, wait up to ``grace_s`` for them to go, then
    SIGKILL whatever is left."""

    def send(sig: int) -> None:
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def left() -> bool:
        return any(pid_alive(p) for p in pids) or any(group_members(g) for g in pgids)

    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    if left():
        send(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)


# --- ledgers -----------------------------------------------------------------------------------------
class Ledger:
    """One live environment's record on disk (see the module docstring). Thread-safe; every change is
    written at once (atomically), so a SIGKILL at any moment leaves a readable ledger."""

    def __init__(self, env_id: str, *, workspace: Path | None, state_dir: Path | None, sandboxed: bool):
        self.env_id = env_id
        self.path = runtime_dir() / "local" / f"{env_id}.json"
        self._lock = threading.Lock()
        self._data = {
            "env_id": env_id,
            "owner": owner_tag(),
            "created": time.time(),
            "workspace": str(workspace) if workspace is not None else None,  # removed by prune (temporary only)
            "state_dir": str(state_dir) if state_dir is not None else None,
            "sandboxed": sandboxed,
            "groups": {},
        }
        self._write()

    def _write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(self._data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # a ledger is a help for prune, never a reason to fail a trial

    def add_group(self, pgid: int, what: str) -> None:
        with self._lock:
            self._data["groups"][str(pgid)] = {"start": pid_start(pgid), "what": what}  # type: ignore[index]
            self._write()

    def drop_group(self, pgid: int) -> None:
        with self._lock:
            if self._data["groups"].pop(str(pgid), None) is not None:  # type: ignore[attr-defined]
                self._write()

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(OSError):
                self.path.unlink()


@dataclass
class Leftover:
    """What a dead owner left: ``env_id`` (a ledger's, or "" for tagged processes without one)."""

    env_id: str
    owner: str
    pids: list[int] = field(default_factory=list)
    pgids: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    ledger: Path | None = None

    def describe(self) -> str:
        what = []
        if self.pids or self.pgids:
            what.append(
                f"{len(set(self.pids) | set(self.pgids))} process(es) {sorted(set(self.pids) | set(self.pgids))}"
            )
        what += self.paths
        label = f"local env {self.env_id}" if self.env_id else "processes"
        return f"{label} of dead pid {self.owner.partition(':')[0]}: " + (", ".join(what) or "its ledger")


def _read_ledger(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("owner"), str) else None


def find_leftovers() -> list[Leftover]:
    """The leftovers of every owner that is gone: ledgers of dead owners (their live groups, tagged
    processes and folders) and tagged processes of dead owners without a ledger (a gateway proxy, an
    ephemeral Prefect server, a ``setsid`` child)."""
    tags = _tags()
    out: list[Leftover] = []
    claimed: set[int] = set()
    folder = runtime_dir() / "local"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = _read_ledger(path)
        if data is None:
            if time.time() - path.stat().st_mtime > 60:  # a half-written or foreign file, not a fresh one
                out.append(Leftover(path.stem, "?:", ledger=path))
            continue
        if owner_alive(data["owner"]):
            continue
        env_id = str(data.get("env_id") or path.stem)
        item = Leftover(env_id, data["owner"], ledger=path)
        for pgid_text, info in (data.get("groups") or {}).items():
            with contextlib.suppress(ValueError, TypeError):
                pgid = int(pgid_text)
                start = (info or {}).get("start")
                if group_members(pgid) and (not pid_alive(pgid) or pid_start(pgid) == start):
                    item.pgids.append(pgid)
        item.pids = sorted(p for p, t in tags.items() if t.get(ENV_TAG) == env_id)
        claimed.update(item.pids)
        for key in ("workspace", "state_dir"):
            value = data.get(key)
            if isinstance(value, str) and value and os.path.exists(value):
                item.paths.append(value)
        out.append(item)
    orphans: dict[str, list[int]] = {}
    for pid, t in tags.items():
        owner = t.get(OWNER_TAG)
        if pid in claimed or not owner or owner_alive(owner):
            continue
        orphans.setdefault(owner, []).append(pid)
    out += [Leftover("", owner, pids=sorted(pids)) for owner, pids in sorted(orphans.items())]
    return out


def prune(*, dry_run: bool = False) -> list[Leftover]:
    """Kill and remove what dead owners left (see :func:`find_leftovers`); ``dry_run`` only lists it."""
    found = find_leftovers()
    if dry_run:
        return found
    for item in found:
        kill_pids(item.pids, item.pgids)
        for path in item.paths:
            shutil.rmtree(path, ignore_errors=True)
        if item.ledger is not None:
            with contextlib.suppress(OSError):
                item.ledger.unlink()
    return found
