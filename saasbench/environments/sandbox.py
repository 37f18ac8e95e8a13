"""The local backend's sandbox: bubblewrap (``bwrap``) around every command an agent or its app runs.

On the local backend the agent's commands, the app it built and the evaluator's commands in the
workspace (P12) run as processes of this host. Without a sandbox they could read the harness's and
the model gateway's ``/proc/<pid>/environ`` (provider keys, the gateway's master key and signing
secret), the gateway's work folder, the task folder with its reference implementation and DAG, and
other trials' workspaces. :class:`Sandbox` wraps each command in ``bwrap`` so that it sees:

- its own pid namespace (``/proc`` shows only the sandbox's processes) and IPC/UTS namespaces;
  every capability dropped and ``no_new_privs`` (bwrap sets it), so setuid programs gain nothing;
- the system folders read-only (``/usr``, ``/etc``, ``/opt`` and the ``/bin``, ``/lib*`` links),
  the toolchains of ``PATH`` read-only (each folder on it; for a ``bin``/``sbin``/``shims`` folder
  whose parent holds ``lib``, ``libexec`` or ``versions``, that parent: a venv, pyenv, nvm, an npm
  prefix), the interpreter the harness runs on, and what the agent adapter exposes (its CLI's
  install folder read-only, its run folder read-write: :meth:`Sandbox.expose`);
- the trial's workspace read-write, at its host path;
- a private ``/tmp`` and ``$HOME`` (folders of the environment's state folder, so they last as long
  as the trial and vanish with it);
- the host's network (the agent reaches the model gateway on 127.0.0.1 and the app it starts).

Not visible: the harness's and every other process (so no ``environ``), ``$HOME`` of the harness
(``~/.aws``, ``~/.ssh``, ...), the repository's ``tasks/`` (never exposed, even when a toolchain
lives in the repository), every other folder of ``/tmp`` (other workspaces, the gateway's work
folder, state folders), ``/run``, ``/var``, ``/sys``. Not isolated: the network (loopback services
of the host, other trials' apps, the Prefect API), CPU/memory, and the uid (the same user, without
capabilities). ``--die-with-parent`` plus the pid namespace make every process of a command,
``setsid`` children included, die with it, and with the harness when the harness is killed.

:func:`probe` checks once per process that bwrap exists and can build such a sandbox here;
:func:`sandbox_mode` reads ``SAASBENCH_LOCAL_SANDBOX`` (``auto``: sandbox when bwrap works, refuse
untrusted agents otherwise; ``on``: refuse to start without it; ``off``: no sandbox, the operator
trusts the agents with this host).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from saasbench import settings
from saasbench.failures import HarnessError

__all__ = [
    "MODES",
    "Probe",
    "Sandbox",
    "SandboxUnavailable",
    "probe",
    "refusal",
    "sandbox_mode",
    "toolchain_root",
]

SETTING = "SAASBENCH_LOCAL_SANDBOX"
MODES = ("auto", "on", "off")
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
_TOOLCHAIN_MARKERS = ("lib", "libexec", "versions")  # a bin/ folder's parent that is a whole toolchain
_NAMESPACES = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
)


class SandboxUnavailable(HarnessError):
    """The local backend cannot confine an untrusted agent here (no usable bubblewrap) and the operator
    did not opt out. Not retryable: a retry fails the same way."""

    outcome = "env_error"
    retryable = False


@dataclass(frozen=True)
class Probe:
    """Whether bwrap can build the sandbox on this host (``reason`` says why not)."""

    usable: bool
    bwrap: str | None
    reason: str = ""


_PROBE: Probe | None = None
_PROBE_LOCK = threading.Lock()


def sandbox_mode() -> str:
    """``SAASBENCH_LOCAL_SANDBOX``: auto (default), on or off; ValueError for anything else."""
    value = (settings.get(SETTING) or "auto").strip().lower()
    aliases = {"1": "on", "true": "on", "yes": "on", "require": "on", "0": "off", "false": "off", "no": "off"}
    value = aliases.get(value, value)
    if value not in MODES:
        raise ValueError(f"{SETTING}={value!r}: choose auto, on or off")
    return value


def system_args() -> list[str]:
    """The read-only system folders (and the host's /bin, /lib* symlinks as symlinks)."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    resolv = os.path.realpath("/etc/resolv.conf")  # systemd-resolved points it into /run
    if os.path.isfile(resolv) and not resolv.startswith(("/etc/", "/usr/")):
        args += ["--ro-bind", resolv, resolv]
    return args


def probe(*, refresh: bool = False) -> Probe:
    """Whether bwrap exists and builds a sandbox (pid namespace, no capabilities) here; checked once per
    process (``refresh`` checks again)."""
    global _PROBE
    with _PROBE_LOCK:
        if _PROBE is not None and not refresh:
            return _PROBE
        exe = shutil.which("bwrap") or next(
            (p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None
        )
        if exe is None:
            _PROBE = Probe(False, None, "bubblewrap (bwrap) is not installed")
            return _PROBE
        argv = [exe, *system_args(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *_NAMESPACES, "true"]
        try:
            res = subprocess.run(
                argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _PROBE = Probe(False, exe, f"{exe} does not run: {exc}")
            return _PROBE
        if res.returncode != 0:
            why = (res.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {res.returncode}"])[-1]
            _PROBE = Probe(False, exe, f"{exe} cannot build a sandbox here: {why}")
        else:
            _PROBE = Probe(True, exe)
        return _PROBE


def refusal(agent: str, reason: str) -> str:
    """The one-line error for an untrusted agent the local backend cannot confine."""
    return (
        f"refusing to run agent {agent!r} on the local backend without a sandbox ({reason}): its commands could "
        "read the harness's keys and the task's reference. Install bubblewrap (apt-get install bubblewrap), use "
        f"--backend docker, or set {SETTING}=off to trust this agent with this host"
    )


# --- what the sandbox shows ----------------------------------------------------------------------------
def _overlaps(a: str, b: str) -> bool:
    """``a`` and ``b`` are the same folder or one holds the other."""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b if b == "/" else b + "/") or b.startswith(a if a == "/" else a + "/")


def _forbidden() -> list[str]:
    """Folders never exposed, not even inside a toolchain: the task catalogue (reference apps, DAGs)."""
    out = []
    for p in (settings.tasks_dir(), Path(__file__).resolve().parents[2] / "tasks"):
        out += [str(p), os.path.realpath(p)]
    return list(dict.fromkeys(out))


def _too_wide() -> list[str]:
    """Folders a toolchain root may not be nor hold: /, $HOME, the temporary folder."""
    out = ["/", tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())]
    home = os.environ.get("HOME")
    if home:
        out += [home, os.path.realpath(home)]
    return list(dict.fromkeys(out))


def _is_system(path: str) -> bool:
    return any(path == "/" + d or path.startswith("/" + d + "/") for d in SYSTEM_DIRS)


def toolchain_root(path: str | Path) -> str | None:
    """The folder to expose for an executable folder: its parent when the folder is a ``bin``, ``sbin`` or
    ``shims`` of a toolchain (the parent holds ``lib``, ``libexec`` or ``versions``), else the folder
    itself; None for a folder that must not be exposed (a system folder needs nothing; /, $HOME, the
    temporary folder or the task catalogue are refused)."""
    real = os.path.realpath(path)
    if not os.path.isabs(real) or not os.path.isdir(real) or _is_system(real):
        return None
    root = real
    parent = os.path.dirname(real)
    if os.path.basename(real) in ("bin", "sbin", "shims") and any(
        os.path.isdir(os.path.join(parent, m)) for m in _TOOLCHAIN_MARKERS
    ):
        root = parent
    if any(_overlaps(root, f) for f in _forbidden()):
        return None
    if any(root.rstrip("/") == w.rstrip("/") or w.startswith(root.rstrip("/") + "/") for w in _too_wide()):
        return None
    return root


def _venv_base(root: str) -> str | None:
    """The base interpreter's prefix of a venv (its pyvenv.cfg ``home`` is the base's bin folder)."""
    try:
        text = Path(root, "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return toolchain_root(value.strip())
    return None


def toolchains(path_var: str | None) -> list[str]:
    """The toolchain folders of a PATH value and of the interpreter the harness runs on (read-only)."""
    roots: list[str] = []

    def add(folder: str | None) -> None:
        root = toolchain_root(folder) if folder else None
        if root and root not in roots:
            roots.append(root)
            add(_venv_base(root))

    for entry in (path_var or "").split(os.pathsep):
        if entry and os.path.isabs(entry):
            add(entry)
    for prefix in (sys.prefix, sys.base_prefix):
        add(os.path.join(prefix, "bin"))
    return roots


class Sandbox:
    """The bwrap command line of one environment's commands (see the module docstring).

    ``private``: a host folder of the environment's own (its ``tmp/`` and ``home/`` become the
    commands' ``/tmp`` and ``$HOME``); ``workspace``: the trial's workspace (read-write);
    ``home``: ``$HOME`` as the commands see it (None: no home folder is bound).
    """

    def __init__(self, bwrap: str, *, private: Path, workspace: Path, home: str | None, path_var: str | None):
        self.bwrap = bwrap
        self.workspace = Path(workspace)
        self.tmp = Path(private) / "tmp"
        self.home_dir = Path(private) / "home"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.home_dir.mkdir(parents=True, exist_ok=True)
        self.home = home if home and os.path.isabs(home) and home.rstrip("/") else None
        self.toolchains = toolchains(path_var)
        self._exposed: dict[str, bool] = {}  # host folder -> writable
        self._lock = threading.Lock()

    def expose(self, path: str | Path, *, writable: bool = False) -> str | None:
        """Show a host folder to later commands at its own path: read-only (an executable folder brings
        its toolchain, :func:`toolchain_root`) or read-write (exactly that folder). Returns the folder
        exposed, None when nothing was (a system folder, or one that must stay hidden)."""
        if writable:
            real = os.path.realpath(path)
            if not os.path.isdir(real) or any(_overlaps(real, f) for f in _forbidden()) or real in _too_wide():
                return None
            root: str | None = real
        else:
            root = toolchain_root(path)
        if root is None:
            return None
        with self._lock:
            self._exposed[root] = self._exposed.get(root, False) or writable
            if not writable:
                base = _venv_base(root)
                if base is not None:
                    self._exposed.setdefault(base, False)
        return root

    def argv(self, command: list[str], *, cwd: str | Path) -> list[str]:
        """``command`` wrapped in bwrap, run in ``cwd`` (a folder of the workspace)."""
        args = [self.bwrap, *system_args(), "--proc", "/proc", "--dev", "/dev", "--bind", str(self.tmp), "/tmp"]
        if self.home is not None:
            args += ["--bind", str(self.home_dir), self.home]
        for root in self.toolchains:
            args += ["--ro-bind-try", root, root]
        with self._lock:
            exposed = sorted(
                self._exposed.items(), key=lambda kv: (kv[1], len(kv[0]))
            )  # read-only first, parents first
        for root, writable in exposed:
            args += ["--bind-try" if writable else "--ro-bind-try", root, root]
        ws = str(self.workspace)
        args += ["--bind", ws, ws, "--chdir", str(cwd), *_NAMESPACES, "--", *command]
        return args
