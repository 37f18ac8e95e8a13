"""The one path evaluator of the assertion primitives (P06, P07 and later ones).

Real DAGs mix several JSONPath-ish dialects, and each reference harness understood a different
subset of them. This module understands all of them at once:

- ``$`` the whole body (also a scalar or plain-text body); ``""`` means the same;
- ``$.a.b``, ``$.a[0].b``, ``$[0].x`` (bare arrays), ``$["odd key"]``, negative indices;
- numeric dotted indices ``edges.0.node`` (a list is indexed, a dict looks up the key ``"0"``);
- ``[*]`` / ``.*`` wildcards, which return a list of the matches (nested wildcards flatten;
  elements lacking the rest of the path are left out, as in standard JSONPath);
- ``.length``: the length of a list, dict or string (a dict that has a ``length`` key keeps it);
- pseudo-paths ``$._headers.<name>`` (a response header, case-insensitive),
  ``$._body_first_line`` (first line of the raw response text) and ``$._body`` (the raw
  response text; for a document that is not a response, the string itself or its JSON text);
- bare names without ``$.`` (``result.count``): a dict lookup, the whole string first;
- anything richer (filters ``[?(...)]``, slices ``[0:2]``, recursive ``..``) goes to jsonpath-ng
  and returns the list of matches.

Absence is :data:`ABSENT`, which is distinct from JSON ``null`` (``None``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ABSENT", "PathError", "evaluate", "is_absent", "parse"]


class _Absent:
    """Sentinel for "the path matched nothing" (JSON null is ``None``)."""

    _instance: "_Absent | None" = None

    def __new__(cls) -> "_Absent":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


class PathError(ValueError):
    """A path expression that cannot be parsed (a DAG defect, reported at load time)."""


def is_absent(value: Any) -> bool:
    return value is ABSENT


WILDCARD = object()  # a parsed ``[*]`` / ``.*`` segment
LENGTH = "length"
_RICH = re.compile(r"\[\s*\?|\.\.|\[[^\]]*:[^\]]*\]")  # filter, recursive descent, slice
_TOKEN = re.compile(
    r"""\.?\[\s*(?:(?P<int>-?\d+)|(?P<star>\*)|'(?P<sq>[^']*)'|"(?P<dq>[^"]*)")\s*\]"""
    r"""|\.?(?P<name>[^.\[\]]+)"""
)


def parse(path: str) -> tuple[str, list[Any]]:
    """Split a path into (root kind, segments). Root kind is ``"$"`` or ``"bare"`` or ``"rich"``.

    Segments are ``str`` (a key, or a numeric string from dotted syntax), ``int`` (bracket
    index) or :data:`WILDCARD`. Raises :class:`PathError` on text that is not a path.
    """
    text = path.strip()
    if text in ("", "$"):
        return "$", []
    if _RICH.search(text):
        return "rich", [text]
    if text.startswith("$"):
        rest, kind = text[1:], "$"
        if rest and rest[0] not in ".[":
            raise PathError(f"cannot parse path {path!r}: expected '.' or '[' after '$'")
    else:
        rest, kind = text, "bare"
    segments: list[Any] = []
    pos = 0
    while pos < len(rest):
        m = _TOKEN.match(rest, pos)
        if m is None or m.end() == pos:
            raise PathError(f"cannot parse path {path!r} at {rest[pos:]!r}")
        if m.group("int") is not None:
            segments.append(int(m.group("int")))
        elif m.group("star") is not None or m.group("name") == "*":
            segments.append(WILDCARD)
        elif m.group("sq") is not None or m.group("dq") is not None:
            segments.append(m.group("sq") if m.group("sq") is not None else m.group("dq"))
        else:
            segments.append(m.group("name").strip())
        pos = m.end()
    return kind, segments


def evaluate(path: str, document: Any, *, headers: Mapping[str, str] | None = None, text: str | None = None) -> Any:
    """Evaluate ``path`` against ``document``; :data:`ABSENT` when nothing matches.

    ``headers`` and ``text`` (of the response the document came from) feed the pseudo-paths
    ``$._headers.<name>`` and ``$._body_first_line``. Raises :class:`PathError` only for
    unparseable paths, never because of the document's shape.
    """
    kind, segments = parse(path)
    if kind == "rich":
        return _rich(segments[0], document)
    if document is ABSENT:
        return ABSENT
    if kind == "bare" and isinstance(document, Mapping) and path.strip() in document:
        return document[path.strip()]  # a flat key such as "a.b" stored literally
    if segments and segments[0] == "_headers" and headers is not None and not _has_key(document, "_headers"):
        return _header(headers, segments[1:])
    if segments == ["_body"] and not _has_key(document, "_body"):
        if text is not None:
            return text
        return document if isinstance(document, str) else _json_text(document)
    if segments == ["_body_first_line"] and not _has_key(document, "_body_first_line"):
        source = text if text is not None else (document if isinstance(document, str) else None)
        if source is None:
            return ABSENT
        return source.lstrip("\ufeff").splitlines()[0] if source.strip() else ""
    return _walk(document, segments)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _has_key(document: Any, key: str) -> bool:
    return isinstance(document, Mapping) and key in document


def _header(headers: Mapping[str, str], rest: list[Any]) -> Any:
    lowered = {str(k).lower(): v for k, v in headers.items()}
    if not rest:
        return lowered
    if len(rest) != 1 or not isinstance(rest[0], str):
        return ABSENT
    return lowered.get(rest[0].lower(), ABSENT)


def _walk(value: Any, segments: list[Any]) -> Any:
    for i, seg in enumerate(segments):
        if seg is WILDCARD:
            if isinstance(value, Mapping):
                items = list(value.values())
            elif isinstance(value, list):
                items = value
            else:
                return ABSENT
            out: list[Any] = []
            multi = any(s is WILDCARD for s in segments[i + 1 :])
            for item in items:
                found = _walk(item, segments[i + 1 :])
                if found is ABSENT:
                    continue
                if multi and isinstance(found, list):
                    out.extend(found)
                else:
                    out.append(found)
            return out
        value = _step(value, seg)
        if value is ABSENT:
            return ABSENT
    return value


def _step(value: Any, seg: Any) -> Any:
    if isinstance(value, Mapping):
        if isinstance(seg, int):
            return value.get(str(seg), ABSENT)
        if seg in value:
            return value[seg]
        if seg == LENGTH:
            return len(value)
        return ABSENT
    if isinstance(value, list):
        if seg == LENGTH:
            return len(value)
        try:
            index = int(seg)
        except (TypeError, ValueError):
            return ABSENT
        return value[index] if -len(value) <= index < len(value) else ABSENT
    if isinstance(value, str) and seg == LENGTH:
        return len(value)
    return ABSENT


def _rich(expr: str, document: Any) -> Any:
    """Filters, slices and recursive descent through jsonpath-ng; a list of matches."""
    from jsonpath_ng.ext import parse as jp_parse

    text = expr if expr.startswith("$") else "$." + expr
    try:
        compiled = jp_parse(text)
    except Exception as exc:  # jsonpath-ng raises its own errors and plain Exception for bad text
        raise PathError(f"cannot parse path {expr!r}: {exc}") from exc
    if document is ABSENT:
        return ABSENT
    try:
        return [m.value for m in compiled.find(document)]
    except Exception:  # noqa: BLE001 - a filter comparing incompatible types in the app's data: no match
        return []
