"""Anti-cheat: find rollouts that fetched pre-existing source code, and check evaluator integrity.

The prompt (paper, Appendix C.1) forbids cloning, copying or importing an existing codebase;
a trajectory that fetches external source repositories scores 0. :func:`scan_trajectory`
looks at what the agent *ran* and at the files it *wrote and then ran*;
:func:`void_if_cheating` returns ``(voided, findings)``: voided when a finding has severity
``void``. Findings of severity ``warn`` are for a human to look at.

What is scanned, per source (the rules below apply to each):

- **Shell commands**: events of kind ``tool_call``/``command`` whose tool is a shell: a name in
  :data:`GENERIC_SHELL_TOOLS` or in a registered agent class's ``shell_tools`` (``shell`` — the
  builtin agent and Codex ``command_execution`` —, ``Bash`` of Claude Code, ``terminal``/
  ``execute_bash`` of OpenHands, ``exec`` of the oracle); :func:`shell_tools` is the union. The command is
  ``data["args"]["command"]``, ``data["command"]`` or the event message. The whole command text
  counts (inline ``python3 -c``/``node -e`` code included), except the bodies of heredocs that
  only write a file (``cat > f <<EOF``, ``tee f <<EOF``, ``apply_patch <<EOF``): those bodies
  are file writes (next point). A heredoc fed to any other program (``bash <<EOF``,
  ``python3 - <<EOF``) is run, so its body stays part of the command.
- **Written files** (:func:`file_writes`): the file-writing tools in :data:`GENERIC_FILE_TOOLS` and in
  the registered agent classes' ``file_tools`` (:func:`file_tools`: name -> argument layout,
  :data:`saasbench.agents.base.WriteLayout`): the builtin agent's ``write_file``/``edit_file``;
  Claude Code's ``Write``, ``Edit``, ``MultiEdit``, ``NotebookEdit``; OpenHands'
  ``file_editor``/``str_replace_editor`` (``create``, ``str_replace``, ``insert``); Codex's
  ``apply_patch`` patches (as a tool or a shell heredoc; the ``+`` lines) and ``file_change``
  items (paths only: Codex's ``--json`` stream carries no content); shell heredocs as above.
  The rule: **a written file counts only when it is run afterwards**. A file is run when a later
  shell command (or the same one, after the heredoc) executes it by name — ``./f.sh``,
  ``bash f.sh``, ``sh -c '...'``, ``python3 dir/f.py``, ``python -m f``, ``node f.js``,
  ``source f``, ``docker exec C bash -c '...'``, behind ``sudo``/``env``/``timeout``/``uv run``
  /``npx`` — or by the tool that runs it: ``make`` (Makefile), ``npm``/``yarn``/``pnpm``/``bun``
  (package.json scripts), ``docker build``/``docker compose`` (Dockerfile, compose files),
  ``pip install .`` (setup.py). Files are matched by base name, and a write is in effect until
  the next whole-file write of the same name. The content is scanned line by line (backslash
  continuations joined, comment lines — ``#`` but not ``#!``, ``//``, ``/*``, ``* `` — skipped; a
  downloader and its URL must share a line; ``["git", "clone", URL]`` argument lists read as
  ``git clone URL``). Findings in a file that is run keep their severity (``void`` for a clone);
  in a script (``.sh``, ``.py``, ``.js``, ..., Makefile, package.json, Dockerfile, a ``#!`` line)
  that is never run they are downgraded to ``warn``; in any other file (README, docs, HTML, a
  ``git clone`` line in prose) they are dropped. When a run file's recorded content is missing
  (Codex) or capped (arguments are cut at a few KB per event), the trial passes ``read_file``
  and the file's final content in the workspace is scanned instead (source ``workspace:<path>``).
- **Evaluator access**: with ``forbidden_paths`` (the trial passes the task folder on the host:
  ``dag.json``, ``reference/``), any shell or tool call that names such a path is an
  ``evaluator_access`` finding (``void``). Only relevant to the local backend: the Docker
  backend mounts only the workspace, so those files do not exist in the container.

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
URL, ``eval`` of built strings); a written file run indirectly (imported by another module,
run by a test runner, a cron entry or a process manager, renamed before running, run through a
name that does not match), or a fetch split over several lines of a written file; writes made
by a program the agent ran (e.g. a generator that writes a script) unless the run script is
itself recorded; downloads by programs whose source the scanner does not see; copying from a
pre-populated cache or a host folder; source fetched through a package registry (``pip
download`` of an unrelated project is only a warning); and code reproduced from the model's
memory. A ``git clone`` written with ``echo`` or ``printf`` into a file is part of a shell
command and therefore counts even if never run (only heredoc bodies are treated as file
content). It is a regex heuristic over recorded text, not a network monitor; a network policy
in the environment is the real enforcement.

Integrity: :func:`hash_paths` hashes workspace paths (a dict path -> sha256, None when missing)
after the harness prepared the workspace and again after the rollout;
:func:`integrity_findings` turns differences into findings (``evaluator_modified``, severity
``void`` by default; the trial uses ``warn`` for the staged PRD/KB copies, see
:func:`saasbench.runs.trial.integrity_targets`).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

from saasbench.agents.base import WriteLayout, list_agents

SHELL_EVENT_KINDS = frozenset({"tool_call", "command"})
# The tool vocabulary: each agent class declares the tools it records (saasbench.agents.base.Agent
# ``shell_tools``, ``file_tools``: name -> WriteLayout); these are the common names no one agent owns.
GENERIC_SHELL_TOOLS = frozenset({"bash", "run", "run_command", "cmd", "sh"})
GENERIC_FILE_TOOLS: Mapping[str, WriteLayout] = {"create_file": "write", "file_write": "write", "str_replace": "edit"}
_LAYOUTS = frozenset(get_args(WriteLayout))


def shell_tools() -> frozenset[str]:
    """Lower-cased names of the tools that run a shell command: the common ones and every registered agent's."""
    names = set(GENERIC_SHELL_TOOLS)
    for cls in list_agents().values():
        names.update(t.lower() for t in cls.shell_tools)
    return frozenset(names)


def file_tools() -> dict[str, WriteLayout]:
    """Lower-cased file-writing tool name -> the layout of its arguments: the common ones and every
    registered agent's (a name two agents give different layouts, or an unknown layout, is an error)."""
    out: dict[str, WriteLayout] = dict(GENERIC_FILE_TOOLS)
    owner = dict.fromkeys(out, "anticheat.GENERIC_FILE_TOOLS")
    for agent, cls in list_agents().items():
        for tool, layout in cls.file_tools.items():
            name = tool.lower()
            if layout not in _LAYOUTS:
                raise ValueError(
                    f"agent {agent!r}: file tool {tool!r} has layout {layout!r}, not one of {sorted(_LAYOUTS)}"
                )
            if out.get(name, layout) != layout:
                raise ValueError(
                    f"file tool {name!r}: agent {agent!r} says layout {layout!r}, {owner[name]} says {out[name]!r}"
                )
            out[name], owner[name] = layout, f"agent {agent!r}"
    return out


def __getattr__(name: str) -> frozenset[str]:
    # SHELL_TOOLS / FILE_TOOLS: computed from the agent registry when read, so they are never stale
    if name == "SHELL_TOOLS":
        return shell_tools()
    if name == "FILE_TOOLS":
        return frozenset(file_tools())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Files that run when a build/package tool runs, not by their own name.
_RUN_BY_TOOL = {
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "npm": ("package.json",),
    "yarn": ("package.json",),
    "pnpm": ("package.json",),
    "bun": ("package.json",),
    "docker-compose": ("docker-compose.yml", "docker-compose.yaml", "compose.yml", "compose.yaml", "Dockerfile"),
    "pip": ("setup.py",),
    "pip3": ("setup.py",),
}
_SCRIPT_EXT = re.compile(r"\.(?:sh|bash|zsh|ksh|py|pyw|js|mjs|cjs|ts|mts|rb|pl|php|ps1|bat|cmd|lua|r)$", re.IGNORECASE)
_SCRIPT_NAMES = frozenset(n for names in _RUN_BY_TOOL.values() for n in names) | {"Dockerfile", "Procfile", "Rakefile"}

DEFAULT_ALLOWED_HOSTS = frozenset(
    {
        "nodejs.org",
        "www.python.org",
        "python.org",
        "go.dev",
        "golang.org",
        "dl.google.com",
        "static.rust-lang.org",
        "sh.rustup.rs",
        "deb.nodesource.com",
        "rpm.nodesource.com",
        "registry.npmjs.org",
        "registry.yarnpkg.com",
        "files.pythonhosted.org",
        "pypi.org",
        "bootstrap.pypa.io",
        "repo.maven.apache.org",
        "download.docker.com",
        "get.docker.com",
        "dl-cdn.alpinelinux.org",
        "deb.debian.org",
        "archive.ubuntu.com",
        "security.ubuntu.com",
        "github.com/nvm-sh",
        "unofficial-builds.nodejs.org",
    }
)
DEFAULT_ALLOWED_IMAGES = frozenset(
    {
        "python",
        "node",
        "postgres",
        "mysql",
        "mariadb",
        "redis",
        "mongo",
        "ubuntu",
        "debian",
        "alpine",
        "busybox",
        "nginx",
        "golang",
        "rust",
        "openjdk",
        "eclipse-temurin",
        "ruby",
        "php",
        "composer",
        "memcached",
        "rabbitmq",
        "minio/minio",
        "mailhog/mailhog",
        "axllent/mailpit",
        "elasticsearch",
        "opensearchproject/opensearch",
        "bitnami/kafka",
    }
)

_SEGMENT_SPLIT = re.compile(r"&&|\|\||[;\n|]")
_URL = re.compile(r"""(?:https?|ftp)://[^\s'"<>`|;)\\]+""")
_GIT = re.compile(
    r"\bgit\s+(?:(?:-C|-c|--git-dir|--work-tree)\s+\S+\s+|--[\w-]+(?:=\S+)?\s+)*"
    r"(clone|submodule\s+add|fetch|pull|remote\s+add)\b([^\n;&|]*)"
)
_GH_CLONE = re.compile(r"\bgh\s+repo\s+(clone|fork)\b([^\n;&|]*)")
_SVN_HG = re.compile(r"\b(svn\s+(?:checkout|co|export)|hg\s+clone)\b([^\n;&|]*)")
_DOWNLOADER = re.compile(
    r"\b(?:(?:curl|wget|aria2c|urllib|urlretrieve|urlopen|requests\.get|httpx\.get|Invoke-WebRequest|iwr)\b"
    r"|fetch\()",
    re.IGNORECASE,
)
_DOCKER_VALUE_FLAGS = frozenset(
    {
        "-p",
        "--publish",
        "-e",
        "--env",
        "--env-file",
        "-v",
        "--volume",
        "--mount",
        "--name",
        "--network",
        "--net",
        "-w",
        "--workdir",
        "-u",
        "--user",
        "--entrypoint",
        "--platform",
        "-m",
        "--memory",
        "--cpus",
        "-l",
        "--label",
        "-h",
        "--hostname",
        "--restart",
        "--add-host",
        "--dns",
        "--ulimit",
        "--shm-size",
        "--pull",
        "--log-driver",
        "--gpus",
        "--cidfile",
        "--device",
        "--expose",
        "--health-cmd",
        "--ip",
        "--link",
        "--tmpfs",
        "--stop-signal",
        "-a",
        "--attach",
    }
)
_DOCKER_EXTRACT = re.compile(r"\bdocker\s+(cp\s+\S+:\S*|export\b|save\b|image\s+save\b|container\s+export\b)")
_PIP_DOWNLOAD = re.compile(r"\bpip3?\s+download\b[^\n;&|]*")
_NPM_PACK = re.compile(r"\bnpm\s+pack\b[^\n;&|]*")
_PIP_GIT = re.compile(r"\bpip3?\s+install\b[^\n;&|]*\bgit\+\S+")
_NPM_GIT = re.compile(
    r"\b(?:npm|yarn|pnpm)\s+(?:install|i|add)\b[^\n;&|]*\s(?:github:|git\+|git://|https://github\.com/)\S*"
)
_ARCHIVE_EXT = re.compile(r"\.(?:tar\.gz|tgz|tar\.bz2|tbz2?|tar\.xz|txz|tar\.zst|tar|zip|7z|rar)$", re.IGNORECASE)
_ARGV_JOIN = re.compile(r"""(?<=[\w.-])['"]\s*,\s*['"](?=[\w.:/-])""")
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
    return (
        str(getattr(event, "kind", "")),
        str(getattr(event, "message", "") or ""),
        dict(getattr(event, "data", None) or {}),
    )


def shell_commands(trajectory: Any) -> list[tuple[int, str]]:
    """(event index, command) of every shell command in a trajectory (object or dict)."""
    events = trajectory.get("events", []) if isinstance(trajectory, Mapping) else getattr(trajectory, "events", [])
    shells = shell_tools()
    out = []
    for i, ev in enumerate(events):
        kind, message, data = _event_fields(ev)
        if kind not in SHELL_EVENT_KINDS:
            continue
        tool = str(data.get("tool", "shell" if kind == "command" else "")).lower()
        if tool not in shells:
            continue
        args = _args(data)
        cmd = args.get("command") or data.get("command") or message
        if isinstance(cmd, list):
            cmd = " ".join(str(c) for c in cmd)
        if cmd:
            out.append((i, str(cmd)))
    return out


@dataclass
class FileWrite:
    """One write of a file by the agent, as recorded in its trajectory."""

    index: int  # event index
    path: str
    text: str | None  # what was written (a whole file or an edit's new text); None: not in the stream (Codex)
    full: bool  # replaces the whole file (Write, create, heredoc ``>``) rather than editing part of it
    via: str  # the tool, ``heredoc`` or ``apply_patch``

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.replace("\\", "/").rstrip("/"))


def _args(data: Mapping[str, Any]) -> Mapping[str, Any]:
    args = data.get("args")
    return args if isinstance(args, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _patch_writes(index: int, patch: str, via: str) -> list[FileWrite]:
    """Files of a Codex ``*** Begin Patch`` text: the ``+`` lines of each added or updated file."""
    out: list[FileWrite] = []
    path: str | None = None
    full = False
    lines: list[str] = []

    def flush() -> None:
        if path is not None:
            out.append(FileWrite(index, path, "\n".join(lines), full, via))

    for line in patch.splitlines():
        m = re.match(r"\*\*\* (Add|Update|Delete) File:\s*(.+?)\s*$", line)
        if m:
            flush()
            path, full, lines = (None if m.group(1) == "Delete" else m.group(2)), m.group(1) == "Add", []
        elif line.startswith("*** Move to:") and path is not None:
            path = line.split(":", 1)[1].strip()
        elif line.startswith("+") and not line.startswith("+++"):
            lines.append(line[1:])
    flush()
    return out


def _diff_added(diff: str) -> str:
    return "\n".join(line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))


def _call_writes(index: int, tool: str, args: Mapping[str, Any], layout: WriteLayout) -> list[FileWrite]:
    path = str(args.get("path") or args.get("file_path") or args.get("notebook_path") or "")
    if layout == "write":
        return [FileWrite(index, path, _text(args.get("content")), True, tool)]
    if layout == "edit":
        new = next((args[k] for k in ("new", "new_string", "new_str") if k in args), None)
        return [FileWrite(index, path, _text(new), False, tool)]
    if layout == "multiedit":
        edits = args.get("edits")
        edit_list: list[Any] = edits if isinstance(edits, list) else []
        new = "\n".join(str(e.get("new_string") or "") for e in edit_list if isinstance(e, Mapping))
        return [FileWrite(index, path, new, False, tool)]
    if layout == "notebook":
        return [FileWrite(index, path, _text(args.get("new_source")), False, tool)]
    if layout == "editor":
        command = str(args.get("command") or "")
        if command == "create":
            return [FileWrite(index, path, _text(args.get("file_text")), True, tool)]
        if command in ("str_replace", "insert"):
            return [FileWrite(index, path, _text(args.get("new_str")), False, tool)]
        return []  # view, undo_edit
    if layout == "file_change":
        out = []
        for change in args.get("changes") or []:
            if not isinstance(change, Mapping) or change.get("kind") == "delete" or not change.get("path"):
                continue
            diff = next(
                (change[k] for k in ("diff", "unified_diff", "content") if isinstance(change.get(k), str)), None
            )
            text = (_diff_added(diff) if change.get("content") is None else diff) if diff else None
            out.append(FileWrite(index, str(change["path"]), text, change.get("kind") == "add", tool))
        return out
    if layout == "apply_patch":
        patch = args.get("input") or args.get("patch") or args.get("content") or ""
        return _patch_writes(index, str(patch), tool)
    return []


# Heredocs in shell commands: ``cat > f <<'EOF'`` / ``tee f <<EOF`` write a file (data until run),
# ``apply_patch <<'EOF'`` applies a Codex patch; any other consumer (``bash <<EOF``, ``python3 - <<EOF``,
# ``psql <<EOF``) runs the body, which then stays part of the scanned command.
_HEREDOC = re.compile(r"<<(-?)\s*['\"\\]*([A-Za-z_][\w.-]*)")
_CAT_TO_FILE = re.compile(r"(?:^|[;&(]\s*|\s)cat\b[^|;&]*?(?<![0-9&<])>{1,2}\s*['\"]?([^\s;&|<>'\"]+)")
_TEE_TO_FILE = re.compile(r"\btee\s+(?:-a\s+|--append\s+)?['\"]?([^\s;&|<>'\"]+)")


def _heredoc_target(line: str) -> str | None:
    """The file a heredoc on ``line`` is written to (``cat >``/``tee``), or None when it is fed to a program."""
    tee = _TEE_TO_FILE.search(line)
    if tee and "|" not in line[tee.end() :]:
        return tee.group(1)
    cat = _CAT_TO_FILE.search(line)
    if cat and "|" not in line:
        return cat.group(1)
    return None


def split_shell_writes(cmd: str, index: int = 0) -> tuple[str, list[FileWrite]]:
    """(the command without the bodies of heredocs that only write files, those writes)."""
    if "<<" not in cmd:
        return cmd, []
    lines = cmd.split("\n")
    code: list[str] = []
    writes: list[FileWrite] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _HEREDOC.search(line)
        if not m or m.group(0).startswith("<<<"):
            code.append(line)
            i += 1
            continue
        delim, strip_tabs = m.group(2), m.group(1) == "-"
        j = i + 1
        while j < len(lines):
            end = lines[j].lstrip("\t") if strip_tabs else lines[j]
            if end.strip().rstrip("'\")") == delim:
                break
            j += 1
        body = "\n".join(lines[i + 1 : j])
        if re.search(r"\bapply_patch\b", line) or body.lstrip().startswith("*** Begin Patch"):
            writes += _patch_writes(index, body, "apply_patch")
            code.append(line)
        elif (target := _heredoc_target(line)) is not None:
            writes.append(FileWrite(index, target, body, ">>" not in line, "heredoc"))
            code.append(line)
        else:
            code.extend(lines[i : j + 1])
            i = j + 1
            continue
        if j < len(lines):
            code.append(lines[j])
        i = j + 1
    return "\n".join(code), writes


def file_writes(trajectory: Any) -> list[FileWrite]:
    """Every file write of a trajectory: file-writing tool calls, heredocs and ``apply_patch`` in shell commands."""
    events = trajectory.get("events", []) if isinstance(trajectory, Mapping) else getattr(trajectory, "events", [])
    layouts = file_tools()
    out: list[FileWrite] = []
    for i, ev in enumerate(events):
        kind, _message, data = _event_fields(ev)
        if kind != "tool_call":
            continue
        tool = str(data.get("tool", ""))
        layout = layouts.get(tool.lower())
        if layout is not None:
            out += _call_writes(i, tool, _args(data), layout)
    for i, cmd in shell_commands(trajectory):
        out += split_shell_writes(cmd, i)[1]
    return sorted(out, key=lambda w: w.index)


def written_files(trajectory: Any) -> list[tuple[int, str, str]]:
    """(event index, path, text) of file contents the agent wrote, as recorded (writes without content left out)."""
    return [(w.index, w.path, w.text) for w in file_writes(trajectory) if w.text]


# --- which files a shell command runs ---------------------------------------------------------------------
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "ash", "fish"})
_INTERPRETER = re.compile(
    r"^(?:python[\d.]*|pypy[\d.]*|node|nodejs|deno|bun|ruby|perl|php|tsx|ts-node|lua|Rscript|pwsh|"
    r"powershell|source|\.)$"
)
_WRAPPERS = frozenset(
    {
        "sudo",
        "env",
        "time",
        "nohup",
        "exec",
        "command",
        "nice",
        "stdbuf",
        "setsid",
        "xargs",
        "strace",
        "uv",
        "poetry",
        "pipenv",
        "npx",
        "pnpx",
        "bunx",
        "run",
        "gosu",
        "su-exec",
        "timeout",
    }
)
_INLINE_FLAGS = frozenset({"-c", "-e", "--eval", "-p", "--print", "-r", "--command", "-Command"})


_OPERATOR_CHARS = ";&|()\n"


def _command_segments(cmd: str) -> list[list[str]]:
    """The simple commands of a shell command line as token lists (quotes respected; split at ; & | ( ) and newlines)."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=_OPERATOR_CHARS)
    lex.whitespace, lex.whitespace_split, lex.commenters = " \t\r", True, ""
    out: list[list[str]] = [[]]
    try:
        for tok in lex:
            if tok and set(tok) <= set(_OPERATOR_CHARS):
                out.append([])
            else:
                out[-1].append(tok)
    except ValueError:  # unbalanced quotes: split naively, drop stray quote characters
        out = [[t.strip("'\"") for t in seg.split()] for seg in _SEGMENT_SPLIT.split(cmd)]
    return [seg for seg in out if seg]


def executed_names(cmd: str, _depth: int = 0) -> set[str]:
    """File names a shell command runs: ``./x.sh``, ``bash x.sh``, ``python3 dir/x.py``, ``bash -c '...'`` (recursively),
    ``docker exec C bash -c ...``, ``make`` (Makefile), ``npm install``/``yarn``/``pnpm`` (package.json), ``docker
    build``/``compose`` (Dockerfile, compose files), ``pip install .`` (setup.py). Base names only."""
    names: set[str] = set()
    for tokens in _command_segments(cmd):
        i = 0
        while i < len(tokens):  # wrappers, assignments, their flags; docker exec <container>
            tok, base = tokens[i], os.path.basename(tokens[i])
            if re.match(r"^[A-Za-z_]\w*=", tok) or tok.startswith("-"):
                i += 1
            elif base in _WRAPPERS:
                i += 1
                if base == "timeout":
                    while i < len(tokens) and tokens[i].startswith("-"):
                        i += 1
                    i += 1  # the duration
            elif base == "docker" and i + 1 < len(tokens) and tokens[i + 1] == "exec":
                i += 2
                while i < len(tokens) and tokens[i].startswith("-"):
                    i += 2 if tokens[i] in ("-e", "--env", "-w", "--workdir", "-u", "--user", "--env-file") else 1
                i += 1  # the container
            else:
                break
        if i >= len(tokens):
            continue
        head, rest = os.path.basename(tokens[i]), tokens[i + 1 :]
        names.add(head)  # a file run by its own path (./setup.sh, /app/bin/fetch)
        if head in _SHELLS or _INTERPRETER.match(head):
            for j, arg in enumerate(rest):
                if head in _SHELLS and re.match(r"^-[a-zA-Z]*c[a-zA-Z]*$", arg):
                    if j + 1 < len(rest) and _depth < 4:
                        names |= executed_names(rest[j + 1], _depth + 1)
                    break
                if head not in _SHELLS and arg in _INLINE_FLAGS:
                    break  # inline code: part of the scanned command text already
                if arg == "-m" and j + 1 < len(rest):
                    names.add(rest[j + 1].rsplit(".", 1)[-1] + ".py")
                    break
                if arg.startswith("-") or arg == "-":
                    continue
                names.add(os.path.basename(arg))
                break
        elif head == "docker" and rest[:1] in (["build"], ["compose"], ["buildx"]):
            names.update(_RUN_BY_TOOL["docker-compose"])
        elif head in _RUN_BY_TOOL and (
            head not in ("pip", "pip3") or (rest[:1] == ["install"] and any(a in (".", "./") for a in rest))
        ):
            names.update(_RUN_BY_TOOL[head])
        for j, arg in enumerate(rest[:-1]):  # make -f FILE, docker build -f FILE
            if arg in ("-f", "--file") and head in ("make", "docker", "docker-compose"):
                names.add(os.path.basename(rest[j + 1]))
    return names


def _executions(trajectory: Any) -> list[tuple[int, set[str]]]:
    return [(i, executed_names(split_shell_writes(cmd, i)[0])) for i, cmd in shell_commands(trajectory)]


def _looks_like_script(path: str, text: str | None) -> bool:
    name = posixpath.basename(path.replace("\\", "/"))
    return bool(_SCRIPT_EXT.search(name)) or name in _SCRIPT_NAMES or (text or "").startswith("#!")


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
                out.append((verb, tokens[j], " ".join(tokens[i : j + 1])))
    return out


def scan_command(
    cmd: str,
    index: int | None = None,
    *,
    source: str = "shell",
    allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS,
    allowed_images: Iterable[str] = DEFAULT_ALLOWED_IMAGES,
    state: dict[str, Any] | None = None,
) -> list[Finding]:
    """Findings in one shell command (``state`` carries git remotes / pulled images across commands)."""
    state = state if state is not None else {}
    remotes: set[str] = state.setdefault("remotes", set())
    foreign_images: set[str] = state.setdefault("images", set())
    allowed_images = {_image_name(i) for i in allowed_images}
    found: list[Finding] = []
    short = cmd if len(cmd) <= 2000 else cmd[:2000] + " ..."
    cmd = _ARGV_JOIN.sub(" ", cmd)  # ["git", "clone", "URL"] in code reads as git clone URL

    def add(rule: str, severity: str, evidence: str, **detail: Any) -> None:
        found.append(Finding(rule, severity, index, short, evidence.strip()[:500], source, detail))

    for m in _GIT.finditer(cmd):
        verb, rest = re.sub(r"\s+", " ", m.group(1)), m.group(2)
        remote_target = _REMOTE_GIT_TARGET.search(rest)
        if verb == "clone":
            add(
                "git_clone",
                "void" if remote_target else "warn",
                m.group(0),
                target=remote_target.group(0) if remote_target else rest.strip(),
            )
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
    for rx, rule in (
        (_PIP_DOWNLOAD, "pip_download"),
        (_NPM_PACK, "npm_pack"),
        (_PIP_GIT, "pip_install_git"),
        (_NPM_GIT, "npm_install_git"),
    ):
        for m in rx.finditer(cmd):
            add(rule, "warn", m.group(0))
    return found


_CAPPED = re.compile(r"\[\d+ chars cut\]$|\[\.\.\. \d+ characters truncated \.\.\.\]")


def _scan_text(text: str, index: int, source: str, state: dict[str, Any], **kw: Any) -> list[Finding]:
    """A written file's findings, line by line (backslash continuations joined; a downloader word and its URL
    must share a line); comment lines (``#`` but not ``#!``, ``//``, ``/*``, ``* ``) are skipped."""
    out: list[Finding] = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        stripped = line.strip()
        if stripped and not (stripped.startswith(("#", "//", "* ", "/*")) and not stripped.startswith("#!")):
            out += scan_command(line, index, source=source, state=state, **kw)
    return out


def _access_findings(trajectory: Any, forbidden_paths: Iterable[str]) -> list[Finding]:
    pats = [re.compile(re.escape(str(p).rstrip("/")) + r"(?![\w.-])") for p in forbidden_paths if str(p).strip("/")]
    if not pats:
        return []
    events = trajectory.get("events", []) if isinstance(trajectory, Mapping) else getattr(trajectory, "events", [])
    shells = shell_tools()
    out = []
    for i, ev in enumerate(events):
        kind, message, data = _event_fields(ev)
        if kind not in SHELL_EVENT_KINDS:
            continue
        text = message + " " + json.dumps(data.get("args"), default=str) + " " + str(data.get("command") or "")
        for rx in pats:
            m = rx.search(text)
            if m:
                out.append(
                    Finding(
                        "evaluator_access",
                        "void",
                        i,
                        text[:2000],
                        text[max(0, m.start() - 100) : m.end() + 100],
                        "shell" if str(data.get("tool", "")).lower() in shells else f"tool:{data.get('tool')}",
                        {"path": m.group(0)},
                    )
                )
                break
    return out


def scan_trajectory(
    trajectory: Any,
    *,
    include_files: bool = True,
    read_file: Callable[[str], str | None] | None = None,
    forbidden_paths: Iterable[str] = (),
    allowed_hosts: Iterable[str] = DEFAULT_ALLOWED_HOSTS,
    allowed_images: Iterable[str] = DEFAULT_ALLOWED_IMAGES,
) -> list[Finding]:
    """Every finding in a trajectory (see the module docstring for the rules).

    Shell commands are scanned whole, except the bodies of heredocs that only write a file. Written
    files (``include_files``) are scanned line by line; their findings keep their severity when a
    later shell command runs the file (matched by base name, see :func:`executed_names`), become
    ``warn`` when the file is a script that is never run, and are dropped for other files (prose:
    README, docs, HTML). ``read_file(path)`` (the workspace after the rollout) supplies the content
    of a file that was run but whose write is not recorded in full (Codex ``file_change`` carries no
    content; recorded arguments are capped). ``forbidden_paths`` (the task folder on the host): any
    tool call that names one is an ``evaluator_access`` finding.
    """
    kw: dict[str, Any] = {"allowed_hosts": allowed_hosts, "allowed_images": allowed_images}
    state: dict[str, Any] = {}
    findings: list[Finding] = []
    for index, cmd in shell_commands(trajectory):
        code = split_shell_writes(cmd, index)[0] if include_files else cmd
        findings += scan_command(code, index, state=state, **kw)
    findings += _access_findings(trajectory, forbidden_paths)
    if not include_files:
        return findings
    runs = _executions(trajectory)
    writes = file_writes(trajectory)
    verified: set[str] = set()
    for n, w in enumerate(writes):
        # the content of this write is in effect until the next full write of the same file
        until = next((v.index for v in writes[n + 1 :] if v.full and v.name == w.name and v.index > w.index), None)
        run_at = next(
            (i for i, names in runs if i >= w.index and (until is None or i < until) and w.name in names), None
        )
        text = w.text
        source = f"file:{w.path}"
        if (
            run_at is not None
            and read_file is not None
            and (text is None or _CAPPED.search(text))
            and w.path not in verified
        ):
            verified.add(w.path)
            try:
                text, source = read_file(w.path), f"workspace:{w.path}"
            except Exception:  # noqa: BLE001 - the file may be gone
                text = None
        if not text:
            continue
        found = _scan_text(text, w.index, source, {}, **kw)
        for f in found:
            f.detail.update(path=w.path, via=w.via, executed_at=run_at)
            if run_at is None:
                f.severity = "warn"
        if run_at is not None or _looks_like_script(w.path, text):
            findings += found
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for f in findings:
        key = (f.rule, f.severity, f.event_index, f.evidence, f.source)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def void_if_cheating(trajectory: Any, *, include_files: bool = True, **kw: Any) -> tuple[bool, list[Finding]]:
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


def hash_paths(
    paths: Iterable[str | os.PathLike[str]], root: str | os.PathLike[str] | None = None
) -> dict[str, str | None]:
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


def integrity_findings(
    before: Mapping[str, str | None],
    after: Mapping[str, str | None],
    *,
    severity: str = "void",
    rule: str = "evaluator_modified",
) -> list[Finding]:
    """A finding (``rule``, ``severity``) per path created, deleted or modified between two :func:`hash_paths`;
    ``detail`` has the path, the change and both hashes."""
    findings = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old != new:
            what = "created" if old is None else "deleted" if new is None else "modified"
            findings.append(
                Finding(
                    rule,
                    severity,
                    None,
                    "",
                    f"{key} {what}",
                    "integrity",
                    {"path": key, "change": what, "before": old, "after": new},
                )
            )
    return findings
