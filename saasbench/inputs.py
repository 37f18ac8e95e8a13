"""Bounded, confined reading of the files users hand saasbench: the one YAML loader, the one text
reader, the lake's id rule and the path rule of task files.

Every YAML file saasbench reads from a user (task.yaml, compose files, image maps, auth profiles,
sweep specs, gateway configs) goes through :func:`load_yaml`: at most :data:`MAX_YAML_BYTES`
bytes, UTF-8, one document, and at most :data:`MAX_YAML_NODES` nodes *counting every alias as a
full copy of what it names* (an alias bomb, ``a: &a [x, x]; b: &b [*a, *a]; ...``, is refused
while it is still a few hundred nodes, before anything walks the expanded data; recursive
aliases are refused). Errors are :class:`InputError`, one line naming the file.

:func:`check_id` is the results lake's id rule (``saasbench.lake.schema`` re-exports it), so a
task id is checked with the same rule at import and at load as when its trial is committed.
:func:`confine` resolves a path a task file names inside the task folder.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 1024 * 1024  # task.yaml, compose files, sweep specs, auth profiles: a few KB in practice
MAX_YAML_NODES = 100_000  # nodes with every alias expanded


class InputError(ValueError):
    """A user's file cannot be used; the message is one line that names the file."""


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover - the loop returns


def read_bytes(path: str | Path, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (checked before reading, and while reading)."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a {what} must be a file)")
        if st.st_size > max_bytes:
            raise InputError(
                f"{path}: {_size(st.st_size)} ({st.st_size:,} bytes) is over the {_size(max_bytes)} limit for this {what}"
            )
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{path}: over the {_size(max_bytes)} limit for this {what}")
    return data


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text (a BOM is dropped); a one-line :class:`InputError` names the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}, line {line}); "
            "save the file as UTF-8"
        ) from None


def read_text(path: str | Path, *, max_bytes: int, what: str = "file") -> str:
    """A UTF-8 text file of at most ``max_bytes`` bytes, or a one-line :class:`InputError`."""
    return decode_utf8(read_bytes(path, max_bytes=max_bytes, what=what), str(path))


# --- YAML ------------------------------------------------------------------------------------------
def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` holds with every alias expanded, capped at ``limit + 1`` (linear in the
    distinct nodes: each is sized once). Raises :class:`ValueError` on a recursive alias."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in _children(node)))
            continue
        if key in sizes:
            continue
        if key in open_:  # popped again inside its own subtree: it contains itself
            raise ValueError("a recursive alias (a node that contains itself)")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def _yaml_message(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"invalid YAML at line {mark.line + 1} column {mark.column + 1}: {exc.problem}"
    return "invalid YAML: " + " ".join(str(exc).split())


def parse_yaml(text: str, *, source: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """One YAML document of ``text`` (safe types only) within the node budget; :class:`InputError` otherwise."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            size = expanded_size(node, max_nodes)
        except ValueError as exc:
            raise InputError(f"{source}: refused: {exc}") from None
        if size > max_nodes:
            raise InputError(
                f"{source}: refused: more than {max_nodes:,} YAML nodes with its aliases expanded "
                "(an alias bomb?); write the values out or use fewer aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: {_yaml_message(exc)}") from None
    except RecursionError:
        raise InputError(f"{source}: refused: YAML nested too deeply") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{source}: invalid YAML value: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def load_yaml(
    path: str | Path, *, what: str = "YAML file", max_bytes: int = MAX_YAML_BYTES, max_nodes: int = MAX_YAML_NODES
) -> Any:
    """The one YAML loader for user files: size cap, UTF-8, one document, alias/node budget.

    Raises :class:`InputError` (one line naming the file) for every way the file can be bad."""
    return parse_yaml(read_text(path, max_bytes=max_bytes, what=what), source=str(path), max_nodes=max_nodes)


# --- ids and paths ----------------------------------------------------------------------------------
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$")


def check_id(value: str, what: str = "id") -> str:
    """Ids become object-key segments: letters, digits and ``. _ : @ + -``, not starting with a
    symbol, at most 200 characters. Anything else raises ``ValueError`` (never silently mangled)."""
    if not isinstance(value, str) or not _ID_RE.match(value) or value in (".", ".."):
        raise ValueError(
            f"{what} {value!r} is not a valid lake id (letters, digits, '._:@+-', 1-200 chars, "
            "starting with a letter or digit)"
        )
    return value


def check_relative(value: str, what: str, inside: str = "the task folder") -> str:
    """``value`` as a relative path that stays inside its folder (no absolute path, no ``..`` out)."""
    text = str(value)
    if not text.strip():
        raise InputError(f"{what} is empty")
    if text.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", text):
        raise InputError(f"{what} {value!r} is absolute; it must be a path relative to {inside}")
    norm = os.path.normpath(text)
    if norm == ".." or norm.startswith("../"):
        raise InputError(f"{what} {value!r} leads outside {inside} ('..'); it must stay inside it")
    return norm


def confine(root: str | Path, value: str, what: str) -> Path:
    """``root/value`` with symlinks resolved, when it stays inside ``root``; :class:`InputError` otherwise.

    The path need not exist (the part that exists is resolved, the rest is taken as written)."""
    rel = check_relative(value, what)
    base = Path(os.path.realpath(root))
    path = Path(os.path.realpath(base / rel))
    if path != base and base not in path.parents:
        raise InputError(f"{what} {value!r} resolves outside the task folder (to {path}): a symlink out of it?")
    return path
