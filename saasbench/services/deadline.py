"""The node deadline where blocking work cannot see the run context.

The engine gives every node a wall-clock budget (``RunOptions.node_timeout_s``). Code that
holds the :class:`~saasbench.evaluation.context.RunContext` bounds its own waits with
``ctx.timeout()``; code deep inside an expectation language (P07 assertions, P08 row
expectations) does not hold it, so the engine runs each step inside :func:`within`, and such
code asks :func:`remaining`. Work that hits the deadline raises :class:`DeadlineExceeded`,
which the engine records as a FAILED node naming what was still running.

A context variable rather than a global: evaluations in other threads (a sweep's trials) each
see their own deadline, and outside a step there is none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("saasbench_node_deadline", default=None)


class DeadlineExceeded(Exception):
    """Work inside a step ran into its node's deadline; the message says what was still running."""


@contextmanager
def within(deadline_at: float | None) -> Iterator[None]:
    """Run the body with ``deadline_at`` (a ``time.monotonic()`` instant, or None: no deadline)."""
    token = _DEADLINE.set(deadline_at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the current deadline (may be <= 0), or None outside a deadline."""
    deadline_at = _DEADLINE.get()
    return None if deadline_at is None else deadline_at - time.monotonic()
