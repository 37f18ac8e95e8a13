"""Placeholder resolution: ``{{name}}``, ``{{a.b}}``, ``{{x[0]}}``, ``{{NODE.field}}``, ``${VAR:-default}``.

Strict by design: a name that resolves to nothing raises :class:`UnresolvedPlaceholder`, and the
step fails with a message naming it (the reference harness silently sent ``""`` or the literal
text, which turned evaluator defects into agent failures). Only ``{{identifier(.path|[n])*}}`` is
a placeholder, so template syntax that belongs to the app (Superset's
``{{ current_username() }}`` inside SQL) passes through untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Callable

MUSTACHE = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+|\[\d+\])*)\}\}")
SHELL = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SEGMENT = re.compile(r"\.?([A-Za-z0-9_-]+)|\[(\d+)\]")

_MISSING = object()


class UnresolvedPlaceholder(Exception):
    """A placeholder names nothing in the run context."""

    def __init__(self, placeholder: str, detail: str = ""):
        self.placeholder = placeholder
        super().__init__(f"unresolved placeholder {placeholder}" + (f": {detail}" if detail else ""))


class UnsafeShellValue(UnresolvedPlaceholder):
    """A value from the app sits inside a quoted string of a command and holds characters that a second
    interpreter reading that string (``sh -c '...'``, ``rails runner "..."``) could take as code."""

    def __init__(self, placeholder: str, value: str):
        self.placeholder = placeholder
        shown = value if len(value) <= 60 else value[:57] + "..."
        Exception.__init__(
            self,
            f"placeholder {placeholder} holds a value from the app ({shown!r}) with characters that are code in a "
            "quoted command string (quotes, backslash, $, `, ;, |, &, <, >, (, ), {, }, #, * or a line break); "
            "not run. Unquoted, {{x}} is passed as one shell word",
        )


# What an app-supplied value may hold when it is spliced inside quotes of a command (see quote_command).
PLAIN_IN_STRING = re.compile(r"[\w@.,:/+=%~^!? -]*")


def quote_command(text: str, value: Callable[[str], Any], trusted: Callable[[str], bool] | None = None) -> str:
    """Splice each ``{{...}}`` into a shell command so that the shell running it reads the value as data.

    The command is scanned as bash reads it (single and double quotes, backslashes, ``$(...)``
    and backquotes), and each value is quoted for where it stands:

    - unquoted (also inside ``$(...)``): ``shlex.quote(value)``, one word;
    - inside ``'...'`` or ``"..."``: as it is when nothing in it is special inside those quotes,
      else the string is closed, the quoted value added and the string reopened
      (``'a {{x}} b'`` with ``it's`` -> ``'a ''it'"'"'s'' b'``), so the value joins the same word;
    - inside backquotes: as unquoted, with backslashes and backquotes escaped for the backquotes;
    - after a ``<<`` (a here-document, whose body expands ``$(...)``): as unquoted, and the value
      must be plain unless trusted (below).

    A placeholder inside quotes usually hands its value to a second interpreter (``bash -c '...'``,
    ``rails runner "..."``, ``manage.py shell -c "..."``), which parses that text again; no
    quoting of ours can know its language. So a value that is not ``trusted`` (anything the app
    supplied: captures, responses, node outputs) must there be plain text
    (:data:`PLAIN_IN_STRING`), else :class:`UnsafeShellValue` is raised and nothing runs. The
    operator's values (auth profile users, ``--var``) are trusted. ``${VAR}`` is left to the
    shell (its value comes through the environment and is never parsed by the shell running it).
    """
    import shlex

    out: list[str] = []
    stack: list[str] = []  # open contexts: "'", '"', "$(", "(", "`"
    heredoc = False  # after a ``<<``: a here-document body expands $( ) and backquotes whatever the quotes
    i, n = 0, len(text)
    while i < n:
        m = MUSTACHE.match(text, i)
        if m:
            expr = m.group(1)
            raw = to_text(value(expr))
            inner = stack[-1] if stack else ""
            quoted_ctx = inner in ("'", '"') or "`" in stack or heredoc
            if quoted_ctx and not (trusted is not None and trusted(expr)) and not PLAIN_IN_STRING.fullmatch(raw):
                raise UnsafeShellValue("{{" + expr + "}}", raw)
            if (inner == "'" and "'" not in raw) or (inner == '"' and not any(ch in raw for ch in '"\\$`')):
                piece = raw  # nothing in it is special inside these quotes: the command reads as written
            elif inner in ("'", '"'):
                piece = inner + shlex.quote(raw) + inner
            else:
                piece = shlex.quote(raw)
            for _ in range(stack.count("`")):
                piece = piece.replace("\\", "\\\\").replace("`", "\\`")
            out.append(piece)
            i = m.end()
            continue
        c = text[i]
        inner = stack[-1] if stack else ""
        if inner == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        elif inner == '"':
            if c == '"':
                stack.pop()
            elif text.startswith("$(", i):
                stack.append("$(")
                out.append("$(")
                i += 2
                continue
            elif c == "`":
                stack.append("`")
        else:  # unquoted, or inside $( ), ( ) or backquotes
            if c in ("'", '"'):
                stack.append(c)
            elif text.startswith("$(", i):
                stack.append("$(")
                out.append("$(")
                i += 2
                continue
            elif text.startswith("<<", i):
                heredoc = True
            elif c == "(" and inner in ("$(", "("):
                stack.append("(")
            elif c == ")" and inner in ("$(", "("):
                stack.pop()
            elif c == "`":
                if inner == "`":
                    stack.pop()
                else:
                    stack.append("`")
        out.append(c)
        i += 1
    return "".join(out)


def split_path(expr: str) -> list[str | int]:
    """``a.b[0].c`` -> ['a', 'b', 0, 'c']; numeric dotted segments stay strings (resolved per container)."""
    parts: list[str | int] = []
    for m in _SEGMENT.finditer(expr):
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return parts


def walk(value: Any, parts: list[str | int]) -> Any:
    """Follow a path through dicts and lists; returns ``_MISSING`` when a segment is absent.

    Numeric dotted segments (``edges.0.node``) index lists. A response record (a dict with a
    ``body``) falls through to its body, so ``{{saved.id}}`` works as well as
    ``{{saved.body.id}}``.
    """
    for part in parts:
        if isinstance(value, Mapping):
            if part in value:
                value = value[part]
            elif str(part) in value:
                value = value[str(part)]
            elif isinstance(value.get("body"), Mapping) and str(part) in value["body"]:
                value = value["body"][str(part)]
            else:
                return _MISSING
        elif isinstance(value, (list, tuple)):
            try:
                index = int(part)
            except (TypeError, ValueError):
                return _MISSING
            if -len(value) <= index < len(value):
                value = value[index]
            else:
                return _MISSING
        else:
            return _MISSING
    return value


def lookup(expr: str, scopes: list[Mapping[str, Any]]) -> Any:
    """Resolve a dotted expression against scopes in order; the first scope holding the head wins."""
    parts = split_path(expr)
    if not parts:
        return _MISSING
    for scope in scopes:
        if expr in scope:  # flat keys such as "list_id2" or "a.b" stored literally
            return scope[expr]
        head = parts[0]
        if isinstance(head, str) and head in scope:
            found = walk(scope[head], parts[1:])
            if found is not _MISSING:
                return found
    return _MISSING


def to_text(value: Any) -> str:
    """How a non-string value is spliced into a longer string."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


class Resolver:
    """Resolves placeholders in strings, dicts and lists against the run's scopes."""

    def __init__(self, scopes: Callable[[], list[Mapping[str, Any]]], shell_vars: Callable[[str], Any]):
        self._scopes = scopes
        self._shell_vars = shell_vars

    def resolve(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._resolve_str(value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value

    def _value(self, expr: str) -> Any:
        found = lookup(expr, self._scopes())
        if found is _MISSING:
            raise UnresolvedPlaceholder("{{" + expr + "}}")
        return found

    def _shell(self, name: str, default: str | None) -> Any:
        found = self._shell_vars(name)
        if found is _MISSING or found is None or found == "":
            if default is not None:
                return default
            raise UnresolvedPlaceholder("${" + name + "}", "no value and no default")
        return found

    def _resolve_str(self, text: str) -> Any:
        if "{{" not in text and "${" not in text:
            return text
        whole = MUSTACHE.fullmatch(text)
        if whole:
            return self._value(whole.group(1))
        whole_shell = SHELL.fullmatch(text)
        if whole_shell:
            return self._shell(whole_shell.group(1), whole_shell.group(2))
        text = MUSTACHE.sub(lambda m: to_text(self._value(m.group(1))), text)
        return SHELL.sub(lambda m: to_text(self._shell(m.group(1), m.group(2))), text)

    def resolve_command(self, text: str, trusted: Callable[[str], bool] | None = None) -> str:
        """A shell command: ``{{...}}`` values quoted for where they stand (:func:`quote_command`),
        ``${VAR}`` left to the shell.

        The reference harness hands ``${TARGET_APP_CLI:-app}`` to bash, so the command's own
        environment (the exec target's variables, ``meta.env_defaults``) decides it; quoting
        keeps a value captured from the untrusted app from becoming shell syntax. ``trusted(expr)``
        says whether a placeholder's value is the operator's (None: every value is the app's).
        """
        return quote_command(text, self._value, trusted)


def placeholders_in(value: Any) -> list[str]:
    """Every placeholder expression in a value (for planning and DAG checks)."""
    out: list[str] = []
    if isinstance(value, str):
        out += ["{{" + m.group(1) + "}}" for m in MUSTACHE.finditer(value)]
        out += ["${" + m.group(1) + "}" for m in SHELL.finditer(value)]
    elif isinstance(value, dict):
        for v in value.values():
            out += placeholders_in(v)
    elif isinstance(value, list):
        for v in value:
            out += placeholders_in(v)
    return out


MISSING = _MISSING
