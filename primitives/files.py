"""File primitives P01-P03: checks against the candidate's workspace.

Every path a DAG names is relative to the workspace and confined to it: an absolute path, a
``..`` that climbs out, or a symlink whose target lies outside fails the step with a message.
The DAG is data, not trusted to read the evaluator's host.

All file access goes through :class:`Workspace` (``stat``, ``listdir``, ``read``), obtained
from :func:`workspace_for`. Today that is the host folder given by ``--workspace``
(``ctx.target.workspace``); an Environment backend (files inside the app container) only has
to provide the same three methods.

Limits, stated here because they change verdicts:

- directory walks skip ``node_modules``, ``.git``, ``dist``, ``build``, ``vendor`` and
  ``__pycache__`` (P03 still enters one when its glob names it), do not follow symlinked
  directories, and stop after :data:`MAX_FILES_WALKED` files (the message says so);
- P02 reads files up to :data:`MAX_FILE_BYTES` that look like text (no NUL byte in the first
  8 KiB) while walking a directory; a file named explicitly is searched in its first
  :data:`MAX_FILE_BYTES` whatever its content.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from saasbench.dag import StepDefect, note
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive
from saasbench.services import saferegex
from saasbench.services.workspace import (  # noqa: F401 - re-exported for the primitives' callers
    MAX_FILES_WALKED,
    SKIP_DIRS,
    Entry,
    PathEscape,
    Walk,
    Workspace,
    _join,
    confine,
    glob_to_regex,
)

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_EVIDENCE_FILES = 5
MAX_BRACE_EXPANSIONS = 256
_SNIFF_BYTES = 8192
NO_WORKSPACE = "no workspace: pass --workspace"


def workspace_for(ctx: RunContext) -> Workspace | str:
    """The workspace to read, or a failure message when there is none.

    An environment backend, when there is one, is asked first: it knows where its workspace
    lives on this host (a Docker container's /app is a bind-mounted host folder).
    """
    from saasbench.environments.base import Environment

    env = ctx.target.environment
    if isinstance(env, Environment):
        ws = env.workspace()
        if ws is not None:
            return ws
    root = ctx.target.workspace
    if root is None:
        return NO_WORKSPACE
    root = Path(root)
    if not root.is_dir():
        return f"workspace {str(root)!r} is not a directory"
    return Workspace(root)


def _candidates(path: str | None, any_of: list[str]) -> list[str]:
    return list(dict.fromkeys(([path] if path is not None else []) + list(any_of)))


# --- input models ----------------------------------------------------------------------------------
def _path_legacy(data: Any) -> Any:
    """Shared legacy forms of ``path``: a list, ``paths``, ``alt_paths``, ``file_path``."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for key in ("file_path", "filepath", "file"):
        if key in data and "path" not in data and isinstance(data[key], str):
            data["path"] = data.pop(key)
            note(f"'{key}' -> 'path'")
    extra: list[Any] = []
    if isinstance(data.get("path"), list):
        extra.extend(data.pop("path"))
        note("'path' given as a list -> 'path_any_of'")
    for key in ("paths", "alt_paths", "any_of"):  # rjhcjrst P01: {"any_of": [...]}: the first that exists
        if key in data:
            value = data.pop(key)
            extra.extend(value if isinstance(value, list) else [value])
            note(f"'{key}' -> 'path_any_of'")
    if extra:
        current = data.get("path_any_of") or []
        data["path_any_of"] = list(current if isinstance(current, list) else [current]) + extra
    return data


class _PathInputs(PrimitiveInputs):
    path: str | None = Field(
        default=None, description="Path relative to the workspace (absolute or escaping paths fail the step)"
    )
    path_any_of: list[str] = Field(
        default_factory=list, description="Alternative paths; the step passes if any of them (or 'path') satisfies it"
    )

    @model_validator(mode="after")
    def _need_path(self):
        if self.path is None and not self.path_any_of:
            raise ValueError("give 'path' or 'path_any_of'")
        return self


class P01Inputs(_PathInputs):
    type: Literal["file", "dir"] = Field(
        default="file", description="What must exist at the path: a regular file (default) or a directory"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        data = _path_legacy(data)
        if isinstance(data, dict):
            for key in ("kind", "file_type"):
                if key in data and "type" not in data:
                    data["type"] = data.pop(key)
                    note(f"'{key}' -> 'type'")
            kind = data.get("type")
            if isinstance(kind, str) and kind.lower() in ("directory", "folder", "d"):
                data["type"] = "dir"
                note(f"type {kind!r} -> 'dir'")
            elif isinstance(kind, str) and kind != kind.lower() and kind.lower() in ("file", "dir"):
                data["type"] = kind.lower()
                note(f"type {kind!r} -> {kind.lower()!r}")
        return data


class P02Inputs(_PathInputs):
    pattern: str | None = Field(
        default=None, min_length=1, description="Text to find (contains/icontains) or a Python regex (regex)"
    )
    patterns: list[str | list[str]] = Field(
        default_factory=list,
        description="More patterns that must all be found in the same "
        "text; an entry that is a list (legacy {any_of: [...]}) is found when any of its "
        "alternatives is (dfhjkeb)",
    )
    source: Literal["workspace", "last_response", "command_output"] = Field(
        default="workspace",
        description="What is searched: workspace files (path), the raw text of the last HTTP response "
        "(legacy: no path after a request, cvyocaao), or a field of the last command's output (legacy: output_var, sgdoserd)",
    )
    output_var: str = Field(
        default="stdout", description="command_output: the field searched (stdout, stderr or output)"
    )
    match_type: Literal["contains", "regex", "icontains"] = Field(
        default="contains",
        description="contains: case-SENSITIVE substring (one reference family was case-insensitive: use icontains); "
        "regex: Python re.search with MULTILINE; icontains: case-insensitive substring",
    )
    allowed_exts: list[str] = Field(
        default_factory=list,
        description="When walking a directory, only files with these extensions (e.g. ['.ts', '.py'])",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        data = _path_legacy(data)
        if not isinstance(data, dict):
            return data
        if "patterns" in data:  # dfhjkeb: {"patterns": ["typescript", {"any_of": ["express", "koa"]}]}
            data["patterns"] = _pattern_groups(data["patterns"])
            if "match_type" not in data:
                data["match_type"] = "icontains"  # the dfhjkeb harness lowercases pattern and text for 'contains'
                note("'patterns' without match_type -> icontains (the dfhjkeb reference matches case-insensitively)")
            note("'patterns' -> every pattern must be found; {any_of: [...]} -> any of the alternatives")
        if "output_var" in data and "source" not in data:  # sgdoserd: P12 then {"output_var": "stdout", "pattern": ...}
            data["source"] = "command_output"
            note(f"'output_var' -> source command_output (the {data['output_var']!r} of the last command)")
        if "source" not in data and not any(data.get(k) for k in ("path", "path_any_of")):
            data["source"] = (
                "last_response"  # cvyocaao: P04 then P02 {"pattern": "EntityDescriptor"} (its P02 reads the last response)
            )
            note(
                "no path -> source last_response (the raw text of the last HTTP response, as in the cvyocaao reference)"
            )
        for key, implied in (
            ("regex", "regex"),
            ("contains", "contains"),
            ("expected", "contains"),
            ("text", "contains"),
        ):
            if key in data and "pattern" not in data and isinstance(data[key], str):
                data["pattern"] = data.pop(key)
                data.setdefault("match_type", implied)
                note(f"'{key}' -> 'pattern' (match_type {data['match_type']})")
        aliases = {
            "substring": "contains",
            "string": "contains",
            "literal": "contains",
            "exact": "contains",
            "regexp": "regex",
            "re": "regex",
            "pattern": "regex",
            "contains_ci": "icontains",
            "case_insensitive": "icontains",
            "contains_i": "icontains",
            "icontain": "icontains",
            "iregex": "regex",
        }
        mtype = data.get("match_type")
        if isinstance(mtype, str):
            low = mtype.strip().lower()
            if low in aliases:
                data["match_type"] = aliases[low]
                note(f"match_type {mtype!r} -> {aliases[low]!r}")
                if low == "iregex" and isinstance(data.get("pattern"), str):
                    data["pattern"] = "(?i)" + data["pattern"]
            elif low != mtype:
                data["match_type"] = low
        if data.get("case_sensitive") is False or data.get("ignore_case") is True:
            data.pop("case_sensitive", None)
            data.pop("ignore_case", None)
            if data.get("match_type", "contains") == "contains":
                data["match_type"] = "icontains"
            elif data.get("match_type") == "regex" and isinstance(data.get("pattern"), str):
                data["pattern"] = "(?i)" + data["pattern"]
            note("case-insensitive flag -> match_type icontains / (?i)")
        elif "case_sensitive" in data and data.get("case_sensitive") is True:
            data.pop("case_sensitive")
        exts = data.get("allowed_exts")
        if isinstance(exts, str):
            data["allowed_exts"] = [exts]
        return data

    @model_validator(mode="after")
    def _need_path(self):  # overrides _PathInputs._need_path: only workspace searches need a path
        if self.source == "workspace" and self.path is None and not self.path_any_of:
            raise StepDefect("no 'path' or 'path_any_of': the step names no file")
        if self.source != "workspace" and (self.path is not None or self.path_any_of):
            raise StepDefect(f"source {self.source} searches no file, yet 'path' names one")
        if self.pattern is None and not self.patterns:
            raise StepDefect("no 'pattern' (or 'patterns'): the step searches for nothing")
        return self

    @property
    def groups(self) -> list[list[str]]:
        """Every group must be found; a group is found when any of its alternatives is."""
        return ([[self.pattern]] if self.pattern is not None else []) + [
            [p] if isinstance(p, str) else list(p) for p in self.patterns
        ]

    @property
    def label(self) -> str:
        groups = self.groups
        if len(groups) == 1 and len(groups[0]) == 1:
            return repr(groups[0][0])
        return " and ".join(repr(g[0]) if len(g) == 1 else "any of " + repr(g) for g in groups)


def _pattern_groups(value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for item in items:
        if (
            isinstance(item, dict)
            and set(item) == {"any_of"}
            and isinstance(item["any_of"], list)
            and item["any_of"]
            and all(isinstance(x, str) and x for x in item["any_of"])
        ):
            out.append(list(item["any_of"]))
        elif isinstance(item, str) and item:
            out.append(item)
        else:
            raise StepDefect(f"patterns: each entry is a string or {{any_of: [strings]}}, got {item!r}")
    if not out:
        raise StepDefect("patterns is empty: the step searches for nothing")
    return out


class P03Inputs(PrimitiveInputs):
    glob: str = Field(
        default="**/*",
        description="Glob relative to base_dir: *, ?, [..], recursive **, braces {a,b}; counts regular files only, dotfiles included",
    )
    base_dir: str | None = Field(
        default=None,
        description="Directory (relative to the workspace) the glob starts from; default the workspace root",
    )
    base_dir_any_of: list[str] = Field(
        default_factory=list, description="Alternative base directories; passes if any reaches min_expected"
    )
    min_expected: int = Field(default=1, ge=0, description="Minimum number of matching files")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "pattern" in data and "glob" not in data:
            data["glob"] = data.pop("pattern")
            note("'pattern' -> 'glob'")
        for key in ("min_count", "min", "minimum", "expected_min", "count_gte", "min_files"):
            if key in data and "min_expected" not in data:
                data["min_expected"] = data.pop(key)
                note(f"'{key}' -> 'min_expected'")
        for key in ("path", "dir", "directory", "base_path"):
            if key in data and "base_dir" not in data:
                data["base_dir"] = data.pop(key)
                note(f"'{key}' -> 'base_dir'")
        if isinstance(data.get("base_dir"), list):
            listed = data.pop("base_dir")
            data["base_dir_any_of"] = list(listed) + list(data.get("base_dir_any_of") or [])
            note("'base_dir' given as a list -> 'base_dir_any_of'")
        if isinstance(data.get("min_expected"), str) and data["min_expected"].strip().lstrip(">=").strip().isdigit():
            raw = data["min_expected"]
            data["min_expected"] = int(raw.strip().lstrip(">=").strip())
            note(f"min_expected {raw!r} -> {data['min_expected']}")
        return data


# --- P01 -------------------------------------------------------------------------------------------
@primitive("P01", P01Inputs)
def file_exists(inputs: P01Inputs, ctx: RunContext) -> StepResult:
    """A file (or, with type dir, a directory) exists at one of the given workspace paths."""
    ws = workspace_for(ctx)
    if isinstance(ws, str):
        return StepResult(passed=False, message=ws)
    wanted = inputs.type
    checked: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        candidates = [confine(raw) for raw in _candidates(inputs.path, inputs.path_any_of)]
        for rel in candidates:
            entry = ws.stat(rel)
            found = entry.kind if entry else None
            checked.append({"path": rel, "found": found})
            if found == wanted:
                return StepResult(
                    passed=True,
                    message=f"{rel} exists ({wanted})",
                    value={"path": rel, "type": wanted},
                    evidence={"matched": [rel], "checked": checked},
                )
            problems.append(f"{rel} exists but is a {found}, expected a {wanted}" if found else f"{rel} not found")
    except PathEscape as exc:
        return StepResult(passed=False, message=str(exc), evidence={"matched": [], "checked": checked})
    except OSError as exc:
        return StepResult(
            passed=False, message=f"cannot inspect the workspace: {exc.strerror or exc}", evidence={"checked": checked}
        )
    return StepResult(passed=False, message="; ".join(problems), evidence={"matched": [], "checked": checked})


# --- P02 -------------------------------------------------------------------------------------------
def _matcher(inputs: P02Inputs) -> Callable[[str, str], int | None]:
    """A function returning the offset of the first group's match in a text when every pattern group
    matches, else None. Raises re.error."""
    finders = [[_finder(p, inputs.match_type) for p in group] for group in inputs.groups]

    def find_all(text: str, what: str = "text") -> int | None:
        first: int | None = None
        for index, group in enumerate(finders):
            hit = next((pos for pos in (f(text, what) for f in group) if pos is not None), None)
            if hit is None:
                return None
            if index == 0:
                first = hit
        return first

    return find_all


def _finder(pattern: str, match_type: str) -> Callable[[str, str], int | None]:
    if match_type == "regex":
        rx = saferegex.compile(pattern, re.MULTILINE)

        def find_rx(text: str, what: str) -> int | None:
            # the text is the agent's (a file) or the app's: bounded by the node deadline (RegexTimeout)
            m = saferegex.search(rx, text, what=what)
            return m.start() if m else None

        return find_rx
    if match_type == "icontains":
        needle_ci = pattern.casefold()

        def find_ci(text: str, what: str) -> int | None:
            pos = text.casefold().find(needle_ci)  # offsets may drift for the few letters casefold expands
            return pos if pos >= 0 else None

        return find_ci
    needle = pattern

    def find(text: str, what: str) -> int | None:
        pos = text.find(needle)
        return pos if pos >= 0 else None

    return find


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _line_of(text: str, pos: int) -> tuple[int, str]:
    pos = min(max(pos, 0), len(text))
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end >= 0 else len(text)].strip()
    return text.count("\n", 0, pos) + 1, (line[:200] + "...") if len(line) > 200 else line


@primitive("P02", P02Inputs)
def file_content_match(inputs: P02Inputs, ctx: RunContext) -> StepResult:
    """A workspace file, or any text file under a workspace directory, contains a pattern (or the last
    response's text, or the last command's output, per ``source``)."""
    try:
        find = _matcher(inputs)
    except re.error as exc:
        return StepResult(passed=False, message=f"invalid regex in {inputs.label}: {exc}")
    if inputs.source != "workspace":
        return _match_text(inputs, ctx, find)
    ws = workspace_for(ctx)
    if isinstance(ws, str):
        return StepResult(passed=False, message=ws)
    exts = tuple(e if e.startswith(".") else f".{e}" for e in inputs.allowed_exts)
    walk = Walk(remaining=ctx.remaining, cap=MAX_FILES_WALKED)
    matches: list[dict[str, Any]] = []
    problems: list[str] = []
    scanned = too_large = binary = 0

    def search(rel: str, *, explicit: bool, size: int) -> None:
        nonlocal scanned, too_large, binary
        if not explicit:
            if size > MAX_FILE_BYTES:
                too_large += 1
                return
            if exts and not rel.endswith(exts):
                return
        raw = ws.read(rel, MAX_FILE_BYTES)
        if not explicit and b"\0" in raw[:_SNIFF_BYTES]:
            binary += 1
            return
        scanned += 1
        text = _decode(raw)
        hit = find(text, f"file {rel}")
        if hit is not None:
            line, snippet = _line_of(text, hit)
            matches.append({"file": rel, "line": line, "text": snippet})

    try:
        candidates = [confine(raw) for raw in _candidates(inputs.path, inputs.path_any_of)]
    except PathEscape as exc:
        return StepResult(passed=False, message=str(exc))
    for rel in candidates:
        if len(matches) >= MAX_EVIDENCE_FILES or walk.capped or walk.timed_out:
            break
        try:
            entry = ws.stat(rel)
            if entry is None:
                problems.append(f"{rel} not found")
            elif entry.kind == "file":
                search(rel, explicit=True, size=entry.size)
                if entry.size > MAX_FILE_BYTES:
                    problems.append(f"{rel} is larger than {MAX_FILE_BYTES} bytes; only its start was searched")
            elif entry.kind == "dir":
                for f in walk.files_under(ws, rel):
                    try:
                        search(f.rel, explicit=False, size=f.size)
                    except (OSError, PathEscape):
                        continue
                    if len(matches) >= MAX_EVIDENCE_FILES:
                        break
            else:
                problems.append(f"{rel} is neither a file nor a directory")
        except PathEscape as exc:
            return StepResult(passed=False, message=str(exc))
        except OSError as exc:
            problems.append(f"{rel}: cannot read: {exc.strerror or exc}")

    evidence: dict[str, Any] = {
        "pattern": inputs.pattern if not inputs.patterns else inputs.groups,
        "match_type": inputs.match_type,
        "matched": [m["file"] for m in matches],
        "matches": matches,
        "files_scanned": scanned,
        "files_walked": walk.walked,
    }
    if too_large or binary:
        evidence["skipped"] = {"larger_than_limit": too_large, "binary": binary}
    limits = walk.note_limits()
    if limits:
        evidence["limits"] = limits
    if matches:
        first = matches[0]
        return StepResult(
            passed=True,
            message=f"{inputs.match_type} {inputs.label} found in {first['file']}:{first['line']}",
            value={"file": first["file"], "line": first["line"]},
            evidence=evidence,
        )
    detail = "; ".join(p for p in problems + ([limits] if limits else []) if p)
    message = f"{inputs.match_type} {inputs.label} not found in {scanned} file(s)" + (f" ({detail})" if detail else "")
    return StepResult(passed=False, message=message, evidence=evidence)


def _match_text(inputs: P02Inputs, ctx: RunContext, find: Callable[[str, str], int | None]) -> StepResult:
    """P02 on the last HTTP response's raw text or on a field of the last command's output."""
    if inputs.source == "last_response":
        response = ctx.last_response
        if response is None:
            return StepResult(
                passed=False,
                message="no HTTP response to search: P02 without a path reads the last "
                "response, and no earlier step in this run got one",
            )
        text, where = response.text or "", f"the last response ({response.method} {response.url} -> {response.status})"
    else:
        output = ctx.last_document
        if not isinstance(output, dict) or "exit_code" not in output:
            return StepResult(
                passed=False,
                message=f"no command output to search: output_var {inputs.output_var!r} reads "
                "the last command's output (P12), and the last step did not run a command",
            )
        if inputs.output_var not in output or not isinstance(output[inputs.output_var], str):
            return StepResult(
                passed=False,
                message=f"the last command's output has no text field {inputs.output_var!r} "
                f"(fields: {', '.join(k for k, v in output.items() if isinstance(v, str))})",
            )
        text, where = output[inputs.output_var], f"the last command's {inputs.output_var}"
    hit = find(text, where)
    evidence: dict[str, Any] = {
        "pattern": inputs.pattern if not inputs.patterns else inputs.groups,
        "match_type": inputs.match_type,
        "source": inputs.source,
        "chars": len(text),
    }
    if hit is None:
        return StepResult(
            passed=False,
            message=f"{inputs.match_type} {inputs.label} not found in {where} ({len(text)} chars)",
            evidence={**evidence, "excerpt": text[:300]},
        )
    line, snippet = _line_of(text, hit)
    return StepResult(
        passed=True,
        message=f"{inputs.match_type} {inputs.label} found in {where}, line {line}",
        value={"line": line},
        evidence={**evidence, "line": line, "text": snippet},
    )


# --- P03 -------------------------------------------------------------------------------------------
def expand_braces(pattern: str, limit: int = MAX_BRACE_EXPANSIONS) -> list[str]:
    """``src/{a,b}/*.{ts,js}`` -> four patterns (nested braces work; ``{x}`` without a comma stays)."""
    depth, start = 0, -1
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                body = pattern[start + 1 : i]
                options, level, cur = [], 0, ""
                for c in body:
                    if c == "," and level == 0:
                        options.append(cur)
                        cur = ""
                        continue
                    level += c == "{"
                    level -= c == "}"
                    cur += c
                options.append(cur)
                if len(options) < 2:
                    continue  # a literal "{x}"
                out: list[str] = []
                for opt in options:
                    for tail in expand_braces(pattern[:start] + opt + pattern[i + 1 :], limit):
                        if tail not in out:
                            out.append(tail)
                        if len(out) >= limit:
                            return out
                return out
    return [pattern]


def _literal_prefix(pattern: str) -> tuple[str, str]:
    """Split ``src/app/**/*.ts`` into the wildcard-free directory ``src/app`` and the rest."""
    segments = pattern.split("/")
    prefix: list[str] = []
    for seg in segments[:-1]:
        if any(c in seg for c in "*?["):
            break
        prefix.append(seg)
    rest = segments[len(prefix) :]
    return "/".join(prefix) or ".", "/".join(rest)


@primitive("P03", P03Inputs)
def file_count(inputs: P03Inputs, ctx: RunContext) -> StepResult:
    """At least ``min_expected`` workspace files match a glob under a base directory."""
    ws = workspace_for(ctx)
    if isinstance(ws, str):
        return StepResult(passed=False, message=ws)
    patterns = expand_braces(inputs.glob.strip())
    walk = Walk(remaining=ctx.remaining, cap=MAX_FILES_WALKED)
    bases = _candidates(inputs.base_dir, inputs.base_dir_any_of) or ["."]
    per_base: list[dict[str, Any]] = []
    problems: list[str] = []
    best: dict[str, Any] | None = None
    try:
        bases = [confine(b, "base_dir") for b in bases]
        for pat in patterns:
            pat = pat[2:] if pat.startswith("./") else pat
            confine(pat or ".", "glob")  # refuses '/x' and '../x'
            for base in bases:
                confine(_join(base, pat) if pat else base, "glob")
    except PathEscape as exc:
        return StepResult(passed=False, message=str(exc))
    named = frozenset(SKIP_DIRS & set(re.split(r"[/{},]", inputs.glob)))
    roots: dict[str, list[re.Pattern[str]]] = {}
    for pat in patterns:
        pat = pat[2:] if pat.startswith("./") else pat
        root, rest = _literal_prefix(posixpath.normpath(pat) if pat else "**/*")
        roots.setdefault(root, []).append(glob_to_regex(rest))
    for base in bases:
        try:
            entry = ws.stat(base)
            if entry is None or entry.kind != "dir":
                problems.append(f"base_dir {base} " + ("not found" if entry is None else "is not a directory"))
                per_base.append({"base_dir": base, "count": 0, "found": False})
                continue
            matched: set[str] = set()
            for root, regexes in roots.items():
                start = posixpath.normpath(_join(base, root)) if root != "." else base
                if start != base:
                    st = ws.stat(start)
                    if st is None or st.kind != "dir":
                        continue
                for f in walk.files_under(ws, start, enter=named):
                    rel_to_root = f.rel[len(start) + 1 :] if start != "." else f.rel
                    if any(rx.fullmatch(rel_to_root) for rx in regexes):
                        matched.add(f.rel)
        except PathEscape as exc:
            return StepResult(passed=False, message=str(exc))
        except OSError as exc:
            problems.append(f"base_dir {base}: {exc.strerror or exc}")
            per_base.append({"base_dir": base, "count": 0, "found": False})
            continue
        count = len(matched)
        record = {"base_dir": base, "count": count, "found": True, "matched": sorted(matched)[:MAX_EVIDENCE_FILES]}
        per_base.append(record)
        if best is None or count > best["count"]:
            best = record
        if count >= inputs.min_expected:
            break
    limits = walk.note_limits()
    count = best["count"] if best else 0
    evidence: dict[str, Any] = {
        "glob": inputs.glob,
        "patterns": patterns,
        "min_expected": inputs.min_expected,
        "matched": best["matched"] if best else [],
        "bases": per_base,
        "files_walked": walk.walked,
    }
    if limits:
        evidence["limits"] = limits
    where = f" under {best['base_dir']}" if best and best["base_dir"] != "." else ""
    passed = count >= inputs.min_expected
    message = f"{count} file(s) match {inputs.glob!r}{where} (need >= {inputs.min_expected})"
    detail = "; ".join(problems + ([limits] if limits else []))
    if detail and not passed:
        message += f"; {detail}"
    elif limits:
        message += f"; {limits}"
    return StepResult(passed=passed, message=message, value=count, evidence=evidence)
