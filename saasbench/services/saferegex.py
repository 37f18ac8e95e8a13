"""Regexes a DAG or an auth profile wrote, matched on text the app or the agent controls, in bounded time.

Python's ``re`` has no timeout, and a DAG's ``(a+)+$`` on 32 agent-written bytes backtracks for
minutes. Every such match goes through :func:`search` (and friends), which uses the ``regex``
module (Python's syntax and semantics, ``VERSION0``: ``$`` still matches before a final newline,
lookarounds and backreferences still work) and bounds it by the node deadline
(:mod:`saasbench.services.deadline`; :data:`DEFAULT_TIMEOUT_S` outside a step):

- a match first runs inline with a CPU budget of :data:`INLINE_SLICE_S` (``regex``'s own
  ``timeout``, which counts the process's CPU time); nearly every real match ends there;
- one that does not is run again in a helper thread with the GIL released (``concurrent``),
  and the caller waits for it on the wall clock, at most until the deadline. At the deadline the
  caller raises :class:`RegexTimeout` and abandons the thread, which stops itself once it has
  used as much CPU time as the budget was (a thread cannot be killed; this one ends on its own).

A linear-time engine (RE2) was the alternative; it was not chosen because it changes what
existing DAG patterns mean (``$`` before a final newline, ``\\Z``, lookarounds,
backreferences), and a bounded backtracking match keeps every verdict the reference harness
would give whenever the match ends in time.

Invalid patterns raise ``re.error`` (the exception the callers already handle).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from typing import Any

import regex as _regex

from saasbench.services.deadline import DeadlineExceeded, remaining

DEFAULT_TIMEOUT_S = 30.0  # outside a node's deadline (a primitive called directly)
INLINE_SLICE_S = 0.05  # CPU seconds a match may take inline before it moves to a helper thread

_FLAGS = {
    re.IGNORECASE: _regex.IGNORECASE,
    re.MULTILINE: _regex.MULTILINE,
    re.DOTALL: _regex.DOTALL,
    re.VERBOSE: _regex.VERBOSE,
    re.ASCII: _regex.ASCII,
    re.UNICODE: _regex.UNICODE,
}

Pattern = Any  # regex.Pattern (the module ships no type information)
Match = Any  # regex.Match


class RegexTimeout(DeadlineExceeded):
    """A regex was still matching when the node's deadline came."""


def _flags(flags: int | re.RegexFlag) -> int:
    out = 0
    for py, rx in _FLAGS.items():
        if flags & py:
            out |= rx
    return out | _regex.VERSION0


@functools.lru_cache(maxsize=512)
def compile(pattern: str, flags: int = 0) -> Pattern:  # noqa: A001 - the re-module name, on purpose
    """Compile with the engine :func:`search` uses; an invalid pattern raises ``re.error``."""
    try:
        return _regex.compile(pattern, _flags(flags))
    except _regex.error as exc:
        raise re.error(getattr(exc, "msg", str(exc)), pattern, getattr(exc, "pos", None)) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise re.error(str(exc), pattern) from None


def validate(pattern: str, flags: int = 0) -> None:
    """Raise ``re.error`` when ``pattern`` does not compile (load-time checks of DAG inputs)."""
    compile(pattern, flags)


def search(pattern: str | Pattern, text: str, flags: int = 0, *, what: str = "text") -> Match | None:
    """``re.search`` within the node deadline; raises :class:`RegexTimeout` at the deadline."""
    return _run("search", pattern, text, flags, what)


def match(pattern: str | Pattern, text: str, flags: int = 0, *, what: str = "text") -> Match | None:
    """``re.match`` within the node deadline."""
    return _run("match", pattern, text, flags, what)


def fullmatch(pattern: str | Pattern, text: str, flags: int = 0, *, what: str = "text") -> Match | None:
    """``re.fullmatch`` within the node deadline."""
    return _run("fullmatch", pattern, text, flags, what)


def _budget() -> float:
    left = remaining()
    return DEFAULT_TIMEOUT_S if left is None else left


def _describe(rx: Pattern, text: str, what: str, seconds: float) -> str:
    shown = rx.pattern if len(rx.pattern) <= 80 else rx.pattern[:77] + "..."
    return f"regex /{shown}/ timed out after {seconds:.1f}s on {len(text)} chars of {what} (node deadline)"


def _run(method: str, pattern: str | Pattern, text: str, flags: int, what: str) -> Match | None:
    if isinstance(pattern, str):
        rx = compile(pattern, flags)
    elif isinstance(pattern, re.Pattern):  # a stdlib pattern: the same text and flags in the bounded engine
        rx = compile(pattern.pattern, int(pattern.flags) & ~re.UNICODE)
    else:
        rx = pattern
    started = time.monotonic()
    budget = _budget()
    if budget <= 0:
        raise RegexTimeout(_describe(rx, text, what, 0.0).replace("timed out after 0.0s", "not run: no time left"))
    try:  # the fast path: no thread for the matches that end quickly
        return getattr(rx, method)(text, timeout=min(INLINE_SLICE_S, budget))
    except TimeoutError:
        pass
    left = budget - (time.monotonic() - started)
    if left <= 0:
        raise RegexTimeout(_describe(rx, text, what, time.monotonic() - started))
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            outcome["match"] = getattr(rx, method)(text, timeout=left, concurrent=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="saasbench-regex", daemon=True).start()
    if not done.wait(left) or isinstance(outcome.get("error"), TimeoutError):
        raise RegexTimeout(_describe(rx, text, what, time.monotonic() - started))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["match"]
