"""The candidate's workspace as the evaluator reads it: confined relative paths, no escapes.

Every path a DAG names is relative to the workspace and confined to it (:func:`confine`): an
absolute path, a ``..`` that climbs out, or a symlink whose target lies outside raises
:class:`PathEscape`. The file primitives (P01-P03), the judge's evidence and the environment
backends all read files through :class:`Workspace` (``stat``, ``listdir``, ``read``).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat as _stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol


class PathEscape(ValueError):
    """A DAG path points outside the workspace (absolute, ``..`` or a symlink)."""


@dataclass(frozen=True)
class Entry:
    rel: str  # posix path relative to the workspace root ("." is the root)
    kind: Literal["file", "dir", "other"]
    size: int = 0

    @property
    def name(self) -> str:
        return posixpath.basename(self.rel)


def confine(path: str, what: str = "path") -> str:
    """Normalise a DAG path to a workspace-relative posix path, or raise :class:`PathEscape`."""
    text = str(path).strip()
    if text.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", text) or text.startswith("\\"):
        raise PathEscape(f"{what} {path!r} is absolute; DAG paths must be relative to the workspace")
    norm = posixpath.normpath(text) if text else "."
    if norm == ".." or norm.startswith("../"):
        raise PathEscape(f"{what} {path!r} escapes the workspace; DAG paths must stay inside it")
    return norm


def _join(parent: str, name: str) -> str:
    return name if parent == "." else f"{parent}/{name}"


class Workspace:
    """The candidate's files on the host, rooted at one folder. Paths are confined relative paths."""

    def __init__(self, root: Path):
        self.root = Path(os.path.realpath(root))

    def _host(self, rel: str) -> Path:
        host = self.root / rel if rel != "." else self.root
        real = Path(os.path.realpath(host))
        if real != self.root and self.root not in real.parents:
            raise PathEscape(f"path {rel!r} resolves outside the workspace (symlink)")
        return host

    def stat(self, rel: str) -> Entry | None:
        """What ``rel`` is, following symlinks only inside the workspace; None when absent."""
        try:
            st = os.stat(self._host(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Entry(rel, _kind(st.st_mode), st.st_size)

    def listdir(self, rel: str) -> list[Entry]:
        """Entries of a directory in name order. Symlinked directories and escaping links are 'other'."""
        out: list[Entry] = []
        try:
            scan = list(os.scandir(self._host(rel)))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return out
        for e in sorted(scan, key=lambda e: e.name):
            child = _join(rel, e.name)
            try:
                if e.is_symlink():
                    try:
                        st = os.stat(self._host(child))
                    except (PathEscape, OSError):
                        out.append(Entry(child, "other"))
                        continue
                    kind = _kind(st.st_mode)
                    out.append(Entry(child, "file" if kind == "file" else "other", st.st_size))
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append(Entry(child, _kind(st.st_mode), st.st_size))
        return out

    def read(self, rel: str, limit: int) -> bytes:
        """The first ``limit`` bytes of a file."""
        with open(self._host(rel), "rb") as fh:
            return fh.read(limit)


def _kind(mode: int) -> Literal["file", "dir", "other"]:
    if _stat.S_ISREG(mode):
        return "file"
    if _stat.S_ISDIR(mode):
        return "dir"
    return "other"


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """A brace-free glob over posix relative paths: ``**`` spans directories, ``*``/``?`` do not.

    The one glob of the project (P03 and P17's ``files_to_sample``): ``**`` spans directories
    only as a whole path segment (``src/**/*.ts``); inside a segment it is ``*`` (``src/**.ts``
    matches ``src/a.ts``, not ``src/a/b.ts``), as in pathlib and .gitignore. Use with fullmatch."""
    segments = pattern.split("/")
    out = ""
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            out += ".*" if last else "(?:[^/]+/)*"
            continue
        j, piece = 0, ""
        while j < len(seg):
            c = seg[j]
            if c == "*":
                while j + 1 < len(seg) and seg[j + 1] == "*":
                    j += 1
                piece += "[^/]*"
            elif c == "?":
                piece += "[^/]"
            elif c == "[":
                first = j + 2 if seg[j + 1 : j + 2] in ("!", "^") else j + 1
                end = seg.find("]", first + 1)  # a ']' right after '[' (or '[!') is a member
                if end < 0:
                    piece += re.escape(c)
                else:
                    body = seg[j + 1 : end]
                    if body[:1] in ("!", "^"):
                        body = "^" + body[1:]
                    piece += "[" + body.replace("\\", "\\\\") + "]"
                    j = end
            else:
                piece += re.escape(c)
            j += 1
        out += piece + ("" if last else "/")
    return re.compile(out, re.DOTALL)


MAX_FILES_WALKED = 20_000
SKIP_DIRS = frozenset({"node_modules", ".git", "dist", "build", "vendor", "__pycache__"})


class Listing(Protocol):
    """What a walk reads: an entry's workspace-relative path, kind (file | dir | other) and size
    (Entry, or a backend's own). Read-only, so an entry with a narrower ``kind`` fits."""

    @property
    def rel(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def size(self) -> int: ...


class Lister(Protocol):
    def listdir(self, rel: str) -> Sequence[Listing]: ...


class Walk:
    """The one directory walk (P02/P03 and the judge's evidence): depth first in name order, pruning
    ``skip`` directories unless a walk names one in ``enter``, not following symlinked directories,
    with one budget for all the walks of a step: at most ``cap`` files, and a deadline (``remaining``
    is checked every 256 files)."""

    def __init__(
        self,
        *,
        skip: frozenset[str] = SKIP_DIRS,
        cap: int = MAX_FILES_WALKED,
        remaining: Callable[[], float] | None = None,
    ):
        self.skip, self.cap, self.remaining = skip, cap, remaining
        self.walked = 0
        self.capped = False
        self.timed_out = False

    def files_under(self, fs: Lister, start: str, enter: frozenset[str] = frozenset()) -> Iterator[Any]:
        """Files under ``start`` of ``fs`` (a :class:`Workspace` or any ``listdir`` source)."""
        stack = [start]
        while stack:
            current = stack.pop()
            subdirs = []
            for entry in fs.listdir(current):
                if entry.kind == "dir":
                    name = entry.rel.rsplit("/", 1)[-1]
                    if name not in self.skip or name in enter:
                        subdirs.append(entry.rel)
                elif entry.kind == "file":
                    if self.walked >= self.cap:
                        self.capped = True
                        return
                    if self.remaining is not None and self.walked % 256 == 0 and self.remaining() <= 0:
                        self.timed_out = True
                        return
                    self.walked += 1
                    yield entry
            stack.extend(reversed(subdirs))

    def note_limits(self) -> str:
        parts = []
        if self.capped:
            parts.append(f"stopped after walking {self.cap} files (cap)")
        if self.timed_out:
            parts.append("stopped at the node deadline")
        return "; ".join(parts)
