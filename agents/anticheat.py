"""Anti-cheat: find rollouts that fetched pre-existing source code, and check evaluator integrity.

The prompt (paper, Appendix C.1) forbids cloning, copying or importing an existing codebase;
a trajectory that fetches external source repositories scores 0. :func:`scan_trajectory`
looks at the shell commands of a :class:`~saasbench.agents.base.Trajectory` (events of kind
``tool_call``/``command`` whose tool is a shell: ``shell``, ``exec``, ``bash``, ...; the
command is ``data["args"]["command"]``, ``data["command"]`` or the event message) and
optionally at the content of files the agent wrote (``write_file``/``edit_file`` arguments as
recorded, i.e. capped). :func:`void_if_cheating` returns ``(voided, findings)``: voided when a
finding has severity ``void``. Findings of severity ``warn`` are for a human to look at.

Detected (severity ``void``):

- ``git clone`` of a remote repository (URL, ``git@host:``, ``*.git``), ``git submodule add``,
  ``git fetch``/``git pull`` of a URL or of a remote added with ``git remote add <url>``,
  ``gh repo clone``, ``svn checkout/export``, ``hg clone`` (also inside ``docker exec ... bash -c``);
- a downloader (``curl``, ``wget``, ``aria2c``, ``urllib``/``requests``/``httpx`` in inline code,
  ``Invoke-WebRequest``) fetching a source URL: an archive (``.tar.gz``, ``.tgz``, ``.tar.*``,
  ``.zip``, ``.7z``, ``.rar``), a GitHub/GitLab/Bitbucket archive or tarball/zipball URL,
  ``codeload.github.com``, ``raw.githubusercontent.com``, ``gist.githubusercontent.com``,
  GitHub ``/raw/`` and ``/blob/`` URLs, GitLab ``/-/raw/`` URLs, ``cdn.jsdelivr.net/gh/...``;
- container image extraction: ``docker cp <container>:...``, ``docker export``/``docker save``
  after a ``docker pull``/``docker create``/``docker run`` of an image not in ``allowed_images``.

Reported but not voiding (severity ``warn``): ``docker pull``/``docker run`` of an image not in
``allowed_images``; ``pip download``; ``npm pack``; ``pip install git+...``/``npm install`` of a
git or GitHub spec; GitHub release assets (usually binaries); ``git clone`` of a local path.

Allowed (not reported): package installs from registries (``pip install requests``, ``npm
install express``, ``apt-get install ...``), installer scripts that are not archives
(``curl -fsSL https://deb.nodesource.com/setup_20.x | bash``), archives from the toolchain
hosts in ``allowed_hosts`` (nodejs.org, python.org, go.dev, ...), any URL on localhost or a
private 10.x/192.168.x address (e.g. ``curl http://127.0.0.1:8080/api/health`` to the app itself).

Not detected: obfuscated or indirect commands (base64-encoded scripts, variables assembling a
URL, ``eval`` of built strings), code written to a file and run later unless file scanning is
on (and then only within the recorded, capped content), downloads by programs whose source
the scanner does not see, copying from a pre-populated cache or a host folder, source fetched
through a package registry (e.g. ``pip download`` of an unrelated project is only a warning),
and code reproduced from the model's memory. It is a regex heuristic over recorded text, not a
network monitor; a network policy in the environment is the real enforcement.

Integrity: :func:`hash_paths` hashes evaluator files (a dict path -> sha256, None when
missing) before and after the rollout; :func:`integrity_findings` turns differences into
``evaluator_modified`` findings (severity ``void``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SHELL_TOOLS = frozenset({"shell", "exec", "bash", "execute_bash", "run", "run_command", "terminal", "cmd", "sh"})
SHELL_EVENT_KINDS = frozenset({"tool_call", "command"})
FILE_TOOLS = frozenset({"write_file", "edit_file", "create_file", "str_replace", "file_write"})

DEFAULT_ALLOWED_HOSTS = frozenset({
    "nodejs.org", "www.python.org", "python.org", "go.dev", "golang.org", "dl.google.com", "static.rust-lang.org",
    "sh.rustup.rs", "deb.nodesource.com", "rpm.nodesource.com", "registry.npmjs.org", "registry.yarnpkg.com",
    "files.pythonhosted.org", "pypi.org", "bootstrap.pypa.io", "repo.maven.apache.org", "download.docker.com",
    "get.docker.com", "dl-cdn.alpinelinux.org", "deb.debian.org", "archive.ubuntu.com", "security.ubuntu.com",
    "github.com/nvm-sh", "unofficial-builds.nodejs.org",
})
DEFAULT_ALLOWED_IMAGES = frozenset({
    "python", "node", "postgres", "mysql", "mariadb", "redis", "mongo", "ubuntu", "debian", "alpine", "busybox", "nginx",
    "golang", "rust", "openjdk", "eclipse-temurin", "ruby", "php", "composer", "memcached", "rabbitmq", "minio/minio",
    "mailhog/mailhog", "axllent/mailpit", "elasticsearch", "opensearchproject/opensearch", "bitnami/kafka",
})

_SEGMENT_SPLIT = re.compile(r"&&|\|\||[;\n|]")
_URL = re.compile(r"""(?:https?|ftp)://[^\s'"<>`|;)\\]+""")
_GIT = re.compile(r"\bgit\s+(?:(?:-C|-c|--git-dir|--work-tree)\s+\S+\s+|--[\w-]+(?:=\S+)?\s+)*"
                  r"(clone|submodule\s+add|fetch|pull|remote\s+add)\b([^\n;&|]*)")
_GH_CLONE = re.compile(r"\bgh\s+repo\s+(clone|fork)\b([^\n;&|]*)")
_SVN_HG = re.compile(r"\b(svn\s+(?:checkout|co|export)|hg\s+clone)\b([^\n;&|]*)")
_DOWNLOADER = re.compile(r"\b(curl|wget|aria2c|urllib|urlretrieve|urlopen|requests\.get|httpx\.get|Invoke-WebRequest|iwr|fetch\()",
                         re.IGNORECASE)
_DOCKER_VALUE_FLAGS = frozenset({
    "-p", "--publish", "-e", "--env", "--env-file", "-v", "--volume", "--mount", "--name", "--network", "--net", "-w",
    "--workdir", "-u", "--user", "--entrypoint", "--platform", "-m", "--memory", "--cpus", "-l", "--label", "-h",
    "--hostname", "--restart", "--add-host", "--dns", "--ulimit", "--shm-size", "--pull", "--log-driver", "--gpus",
    "--cidfile", "--device", "--expose", "--health-cmd", "--ip", "--link", "--tmpfs", "--stop-signal", "-a", "--attach"})
_DOCKER_EXTRACT = re.compile(r"\bdocker\s+(cp\s+\S+:\S*|export\b|save\b|image\s+save\b|container\s+export\b)")
_PIP_DOWNLOAD = re.compile(r"\bpip3?\s+download\b[^\n;&|]*")
_NPM_PACK = re.compile(r"\bnpm\s+pack\b[^\n;&|]*")
_PIP_GIT = re.compile(r"\bpip3?\s+install\b[^\n;&|]*\bgit\+\S+")
_NPM_GIT = re.compile(r"\b(?:npm|yarn|pnpm)\s+(?:install|i|add)\b[^\n;&|]*\s(?:github:|git\+|git://|https://github\.com/)\S*")
_ARCHIVE_EXT = re.compile(r"\.(?:tar\.gz|tgz|tar\.bz2|tbz2?|tar\.xz|txz|tar\.zst|tar|zip|7z|rar)$", re.IGNORECASE)
_REMOTE_GIT_TARGET = re.compile(r"(?:[a-z][a-z0-9+.-]*://|git@[\w.-]+:|\S+\.git\b)", re.IGNORECASE)


@dataclass
class Finding:
    rule: str
    severity: str  # void | warn
    event_index: int | None
    command: str
    evidence: str
    source: str = "shell"  # shell | file:<path> | integrity
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- commands out of a trajectory ----------------------------------------------------------------------
def _event_fields(event: Any) -> tuple[str, str, dict[str, Any]]:
    if isinstance(event, Mapping):
        return str(event.get("kind", "")), str(event.get("message", "") or ""), dict(event.get("data") or {})
    return str(getattr(event, "kind", "")), str(getattr(event, "message", "") or ""), dict(getattr(event, "data", None) or {})


def shell_commands(trajectory: Any) -> list[tuple[int, str]]:
    """(event index, command) of every shell command in a trajectory (object or dict)."""
    events = trajectory.get("events", []) if isinstance(trajectory, Mapping) else getattr(trajectory, "events", [])
    out = []
    for i, ev in enumerate(events):
        kind, message, data = _event_fields(ev)
        if kind not in SHELL_EVENT_KINDS:
            continue
        tool = str(data.get("tool", "shell" if kind == "command" else "")).lower()
        if tool not in SHELL_TOOLS:
            continue
        args = data.get("args") if isinstance(data.get("args"), Mapping) else {}
        cmd = args.get("command") or data.get("command") or message
        if isinstance(cmd, list):
            cmd = " ".join(str(c) for c in cmd)
        if cmd:
            out.append((i, str(cmd)))
    return out


def written_files(trajectory: Any) -> list[tuple[int, str, str]]:
    """(event index, path, text) of file contents the agent wrote, as recorded."""
    events = trajectory.get("events", []) if isinstance(trajectory, Mapping) else getattr(trajectory, "events", [])
    out = []
    for i, ev in enumerate(events):
        kind, _message, data = _event_fields(ev)
        if kind != "tool_call" or str(data.get("tool", "")).lower() not in FILE_TOOLS:
            continue
        args = data.get("args") if isinstance(data.get("args"), Mapping) else {}
        text = args.get("content") if args.get("content") is not None else args.get("new")
        if isinstance(text, str) and text:
            out.append((i, str(args.get("path", "")), text))
    return out


# --- classification -------------------------------------------------------------------------------------
def _host_allowed(url: str, allowed_hosts: Iterable[str]) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    hostpath = host + parts.path
    for allowed in allowed_hosts:
        allowed = allowed.lower()
        if "/" in allowed:
            if hostpath.startswith(allowed):
                return True
        elif host == allowed or host.endswith("." + allowed):
            return True
    return False


def classify_url(url: str, allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS) -> str | None:
    """``void`` for a source-code URL, ``warn`` for a release asset, None otherwise."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    path = parts.path
    if host in ("127.0.0.1", "localhost", "0.0.0.0") or host.startswith(("192.168.", "10.")):
        return None
    if host in ("raw.githubusercontent.com", "gist.githubusercontent.com", "codeload.github.com"):
        return "void"
    if host == "cdn.jsdelivr.net" and path.startswith("/gh/"):  # GitHub repository files through the CDN
        return "void"
    if host in ("github.com", "www.github.com", "gitlab.com", "bitbucket.org"):
        if "/releases/download/" in path:
            return "warn"
        if re.search(r"/(archive|tarball|zipball|raw|blob|get)/|/-/(archive|raw)/", path):
            return "void"
    if host == "api.github.com" and re.search(r"/repos/[^/]+/[^/]+/(tarball|zipball|contents)", path):
        return "void"
    if _ARCHIVE_EXT.search(path.rstrip("/")):
        return None if _host_allowed(url, allowed_hosts) else "void"
    return None


def _image_name(ref: str) -> str:
    ref = ref.split("@", 1)[0]
    if ":" in ref.rsplit("/", 1)[-1]:
        ref = ref.rsplit(":", 1)[0]
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        ref = ref.removeprefix(prefix)
    return ref.lower()


def _docker_images(cmd: str) -> list[tuple[str, str, str]]:
    """(verb, image, evidence) of each ``docker pull|run|create`` in ``cmd``."""
    out = []
    for segment in _SEGMENT_SPLIT.split(cmd):
        try:
            tokens = shlex.split(segment)
        except ValueError:
            tokens = segment.split()
        for i, tok in enumerate(tokens[:-1]):
            if os.path.basename(tok) != "docker" or tokens[i + 1] not in ("pull", "run", "create"):
                continue
            verb, j = tokens[i + 1], i + 2
            while j < len(tokens) and tokens[j].startswith("-"):
                flag = tokens[j]
                j += 2 if (flag in _DOCKER_VALUE_FLAGS and "=" not in flag) else 1
            if j < len(tokens):
                out.append((verb, tokens[j], " ".join(tokens[i:j + 1])))
    return out


def scan_command(cmd: str, index: int | None = None, *, source: str = "shell",
                 allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS, allowed_images: Iterable[str] = DEFAULT_ALLOWED_IMAGES,
                 state: dict[str, Any] | None = None) -> list[Finding]:
    """Findings in one shell command (``state`` carries git remotes / pulled images across commands)."""
    state = state if state is not None else {}
    remotes: set[str] = state.setdefault("remotes", set())
    foreign_images: set[str] = state.setdefault("images", set())
    allowed_images = {_image_name(i) for i in allowed_images}
    found: list[Finding] = []
    short = cmd if len(cmd) <= 2000 else cmd[:2000] + " ..."

    def add(rule: str, severity: str, evidence: str, **detail: Any) -> None:
        found.append(Finding(rule, severity, index, short, evidence.strip()[:500], source, detail))

    for m in _GIT.finditer(cmd):
        verb, rest = re.sub(r"\s+", " ", m.group(1)), m.group(2)
        remote_target = _REMOTE_GIT_TARGET.search(rest)
        if verb == "clone":
            add("git_clone", "void" if remote_target else "warn", m.group(0), target=remote_target.group(0) if remote_target else rest.strip())
        elif verb == "submodule add":
            add("git_submodule_add", "void", m.group(0))
        elif verb == "remote add":
            if remote_target:
                remotes.add(rest.split()[0] if rest.split() else "")
                add("git_remote_add", "warn", m.group(0))
        elif remote_target or remotes:  # fetch / pull
            add(f"git_{verb}", "void", m.group(0))
    for m in _GH_CLONE.finditer(cmd):
        add("gh_repo_clone", "void", m.group(0))
    for m in _SVN_HG.finditer(cmd):
        add("vcs_checkout", "void", m.group(0))
    if _DOWNLOADER.search(cmd):
        for url in _URL.findall(cmd):
            verdict = classify_url(url, allowed_hosts)
            if verdict is not None:
                add("source_download" if verdict == "void" else "release_download", verdict, url, url=url)
    for verb, image_ref, evidence in _docker_images(cmd):
        image = _image_name(image_ref)
        if image not in allowed_images and image.split("/")[-1] not in allowed_images:
            foreign_images.add(image)
            add(f"docker_{verb}", "warn", evidence, image=image)
    for m in _DOCKER_EXTRACT.finditer(cmd):
        if foreign_images:
            add("image_extraction", "void", m.group(0), images=sorted(foreign_images))
    for rx, rule in ((_PIP_DOWNLOAD, "pip_download"), (_NPM_PACK, "npm_pack"), (_PIP_GIT, "pip_install_git"),
                     (_NPM_GIT, "npm_install_git")):
        for m in rx.finditer(cmd):
            add(rule, "warn", m.group(0))
    return found


def scan_trajectory(trajectory: Any, *, include_files: bool = False, allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS,
                    allowed_images: Iterable[str] = DEFAULT_ALLOWED_IMAGES) -> list[Finding]:
    """Every finding in a trajectory's shell commands (and, with ``include_files``, written files)."""
    state: dict[str, Any] = {}
    findings: list[Finding] = []
    for index, cmd in shell_commands(trajectory):
        findings += scan_command(cmd, index, allowed_hosts=allowed_hosts, allowed_images=allowed_images, state=state)
    if include_files:
        for index, path, text in written_files(trajectory):
            findings += scan_command(text, index, source=f"file:{path}", allowed_hosts=allowed_hosts,
                                     allowed_images=allowed_images, state={})
    return findings


def void_if_cheating(trajectory: Any, *, include_files: bool = False, **kw: Any) -> tuple[bool, list[Finding]]:
    """(voided, findings): voided when any finding has severity ``void`` (the trial then scores 0)."""
    findings = scan_trajectory(trajectory, include_files=include_files, **kw)
    return any(f.severity == "void" for f in findings), findings


# --- evaluator integrity ----------------------------------------------------------------------------------
def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_paths(paths: Iterable[str | os.PathLike[str]], root: str | os.PathLike[str] | None = None) -> dict[str, str | None]:
    """path -> sha256 of each file (folders are walked, files in sorted order); None for a missing path.

    Relative paths are taken under ``root`` (keys stay as given, folder members as ``folder/rel``).
    Hash before the rollout and after it, then compare with :func:`integrity_findings`.
    """
    base = Path(root) if root is not None else None
    out: dict[str, str | None] = {}
    for given in paths:
        key = os.fspath(given)
        path = Path(key)
        if base is not None and not path.is_absolute():
            path = base / path
        if path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in sorted(filenames):
                    member = Path(dirpath) / name
                    out[f"{key.rstrip('/')}/{member.relative_to(path).as_posix()}"] = _sha256_file(member)
        elif path.is_file():
            out[key] = _sha256_file(path)
        else:
            out[key] = None
    return out


def integrity_findings(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[Finding]:
    """An ``evaluator_modified`` finding per path added, removed or changed between two :func:`hash_paths`."""
    findings = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old != new:
            what = "created" if old is None else "deleted" if new is None else "modified"
            findings.append(Finding("evaluator_modified", "void", None, "", f"{key} {what}", "integrity",
                                    {"path": key, "before": old, "after": new}))
    return findings
