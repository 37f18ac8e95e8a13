"""Global concurrency limits: environments at once per host, LLM calls at once per provider.

Two context managers guard the expensive resources::

    from saasbench.services.limits import environment_slot, llm_slot, llm_provider

    with environment_slot():                      # one trial's environment lifetime
        ...
    with llm_slot(llm_provider("openai/gpt-4o")):  # one LLM call (judge, built-in agent)
        ...

Inside a Prefect flow or task run (ephemeral API or a server) a slot is a Prefect **global
concurrency limit** (``prefect.concurrency.sync.concurrency``), shared by every process and worker
that talks to the same Prefect API: ``saasbench-env-<host>`` and ``saasbench-llm-<provider>``.
The limits are created or updated (upsert by name) from the configuration at sweep and trial
start (:func:`ensure_prefect_limits`) and, lazily, before the first acquisition in a process.
Outside Prefect (``saasbench sweep --no-prefect``, plain Python, Prefect not installed) the same
limit is a process-local :class:`threading.BoundedSemaphore`. Prefect is imported lazily, only
when a Prefect run is already active, so this module imports without Prefect.

Configuration (:func:`configure`, called with a sweep's fields by :func:`configure_from_spec`):

- ``envs_per_host``: SweepSpec field, else ``$SAASBENCH_ENVS_PER_HOST``, else **unlimited**
  (a sweep's ``concurrency`` is then the only bound).
- ``llm_calls_per_provider``: SweepSpec field (an int for every provider, or a mapping
  ``{provider: n}`` where the key ``"*"`` is the default), else
  ``$SAASBENCH_LLM_CALLS_PER_PROVIDER`` (``"8"`` or ``"openai=8,anthropic=4,*=2"``), else
  **unlimited**.
- ``$SAASBENCH_HOST_NAME`` overrides the host part of ``saasbench-env-<host>`` (default
  :func:`socket.gethostname`): workers in containers on one Docker host set it to the Docker
  host's name so they share one limit.
- ``$SAASBENCH_LIMITS=local`` forces the process-local semaphores even inside Prefect runs.

The configuration is process-wide (last :func:`configure` wins); a Prefect limit's value is the
last value written by any process (a sweep or trial start upserts it).
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from saasbench import settings

log = logging.getLogger(__name__)

ENV_PREFIX = "saasbench-env-"
LLM_PREFIX = "saasbench-llm-"
DEFAULT_PROVIDER_KEY = "*"


class LimitUnavailable(ConnectionError):
    """A Prefect concurrency slot could not be acquired (API down, limit missing).

    A :class:`ConnectionError` on purpose: the sweep classifies it as an environment failure
    (retryable ``env_error``) and the judge as a transient failure (retried)."""


@dataclass(frozen=True)
class LimitConfig:
    envs_per_host: int | None = None
    llm_calls: Mapping[str, int] = field(default_factory=dict)  # provider or "*" -> n

    def llm_limit(self, provider: str) -> int | None:
        return self.llm_calls.get(provider, self.llm_calls.get(DEFAULT_PROVIDER_KEY))


def _positive(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "0", "none", "unlimited")):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive integer, not {value!r}") from None
    if n < 0:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")
    return n or None


def parse_llm_calls(value: int | str | Mapping[str, int] | None) -> dict[str, int]:
    """``8`` / ``"8"`` -> ``{"*": 8}``; ``"openai=8,*=2"`` or a mapping -> per provider."""
    if value is None:
        return {}
    items: list[tuple[str, Any]]  # counts as given: int or text, checked by _positive
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [(DEFAULT_PROVIDER_KEY, value)]
    else:
        text = str(value).strip()
        if not text:
            return {}
        items = []
        for part in text.split(","):
            key, sep, num = part.partition("=")
            items.append((key.strip(), num.strip()) if sep else (DEFAULT_PROVIDER_KEY, key.strip()))
    out: dict[str, int] = {}
    for key, num in items:
        n = _positive(num, f"LLM calls for {key!r}")
        if n is not None:
            out[str(key).strip().lower() or DEFAULT_PROVIDER_KEY] = n
    return out


def from_env() -> LimitConfig:
    return LimitConfig(
        envs_per_host=_positive(settings.get("SAASBENCH_ENVS_PER_HOST"), "SAASBENCH_ENVS_PER_HOST"),
        llm_calls=parse_llm_calls(settings.get("SAASBENCH_LLM_CALLS_PER_PROVIDER")),
    )


_lock = threading.Lock()
_config: LimitConfig | None = None
_semaphores: dict[str, tuple[int, threading.BoundedSemaphore]] = {}
_ensured: dict[str, int] = {}  # Prefect limits upserted by this process: name -> value


def configure(
    envs_per_host: int | None = None, llm_calls_per_provider: int | str | Mapping[str, int] | None = None
) -> LimitConfig:
    """Set this process's limits; ``None`` for a field falls back to its environment variable."""
    env = from_env()
    cfg = LimitConfig(
        envs_per_host=_positive(envs_per_host, "envs_per_host") if envs_per_host is not None else env.envs_per_host,
        llm_calls=parse_llm_calls(llm_calls_per_provider) if llm_calls_per_provider is not None else env.llm_calls,
    )
    global _config
    with _lock:
        _config = cfg
    return cfg


def configure_from_spec(spec: Any) -> LimitConfig:
    """:func:`configure` from a SweepSpec's ``envs_per_host`` / ``llm_calls_per_provider``."""
    return configure(getattr(spec, "envs_per_host", None), getattr(spec, "llm_calls_per_provider", None))


def current() -> LimitConfig:
    """The configured limits (from the environment until :func:`configure` is called)."""
    with _lock:
        cfg = _config
    return cfg if cfg is not None else from_env()


def reset() -> None:
    """Forget the configuration, the local semaphores and the upsert cache (tests)."""
    global _config
    with _lock:
        _config = None
        _semaphores.clear()
        _ensured.clear()


# --- names ---------------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _name_part(text: str) -> str:
    return _UNSAFE.sub("_", text.strip()).strip("_") or "unknown"


def host_name() -> str:
    return _name_part(settings.get("SAASBENCH_HOST_NAME") or socket.gethostname()).lower()


def env_limit_name(host: str | None = None) -> str:
    return ENV_PREFIX + (_name_part(host).lower() if host else host_name())


def llm_limit_name(provider: str) -> str:
    return LLM_PREFIX + _name_part(provider).lower()


_HEURISTICS = (
    ("claude", "anthropic"),
    ("gpt-", "openai"),
    ("chatgpt", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("text-embedding", "openai"),
    ("gemini", "gemini"),
    ("mistral", "mistral"),
    ("codestral", "mistral"),
    ("command", "cohere"),
    ("deepseek", "deepseek"),
)


def llm_provider(model: str | None) -> str:
    """The litellm provider of a model string: the prefix of ``provider/name``; for a bare name
    litellm's ``get_llm_provider`` when litellm is already imported, else a name heuristic
    (``claude-*`` -> anthropic, ``gpt-*`` -> openai, ...); ``unknown`` when nothing matches."""
    m = (model or "").strip()
    if "/" in m:
        return m.split("/", 1)[0].strip().lower() or "unknown"
    lite = sys.modules.get("litellm")
    if lite is not None and m:
        try:
            provider = lite.get_llm_provider(m)[1]
            if provider:
                return str(provider).lower()
        except Exception as exc:  # noqa: BLE001 - unknown model: fall through to the heuristic
            log.debug("litellm does not know %r: %s", m, exc)
    low = m.lower()
    for prefix, provider in _HEURISTICS:
        if low.startswith(prefix):
            return provider
    return "unknown"


# --- slots ---------------------------------------------------------------------------------------
def prefect_run_active() -> bool:
    """True inside a Prefect flow or task run (Prefect already imported, a run context set)."""
    if (settings.get("SAASBENCH_LIMITS") or "").strip().lower() == "local" or "prefect" not in sys.modules:
        return False
    try:
        from prefect.context import FlowRunContext, TaskRunContext
    except Exception:  # noqa: BLE001 - a broken Prefect install: use local semaphores
        return False
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def local_semaphore(name: str, limit: int) -> threading.BoundedSemaphore:
    """The process-local semaphore of ``name`` (a new one when the limit changed)."""
    with _lock:
        got = _semaphores.get(name)
        if got is None or got[0] != limit:
            got = (limit, threading.BoundedSemaphore(limit))
            _semaphores[name] = got
        return got[1]


def ensure_prefect_limit(name: str, limit: int, *, force: bool = False) -> None:
    """Create or update the Prefect global concurrency limit ``name`` to ``limit`` (upsert)."""
    with _lock:
        if not force and _ensured.get(name) == limit:
            return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit)
    with _lock:
        _ensured[name] = limit


def ensure_prefect_limits(config: LimitConfig | None = None) -> list[tuple[str, int]]:
    """Upsert this host's environment limit and every named provider's LLM limit (sweep/trial
    start); a default (``"*"``) LLM limit is upserted per provider on first use. Returns them."""
    cfg = config or current()
    wanted: list[tuple[str, int]] = []
    if cfg.envs_per_host:
        wanted.append((env_limit_name(), cfg.envs_per_host))
    wanted += [(llm_limit_name(p), n) for p, n in sorted(cfg.llm_calls.items()) if p != DEFAULT_PROVIDER_KEY]
    for name, n in wanted:
        ensure_prefect_limit(name, n, force=True)
    return wanted


@contextlib.contextmanager
def _prefect_slot(name: str, limit: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        try:
            ensure_prefect_limit(name, limit)
            from prefect.concurrency.sync import concurrency

            stack.enter_context(concurrency(name, occupy=1, strict=True, raise_on_lease_renewal_failure=False))
        except Exception as exc:
            with _lock:
                _ensured.pop(name, None)  # re-upsert on the next attempt (the limit may be gone)
            raise LimitUnavailable(f"concurrency limit {name}: {type(exc).__name__}: {exc}") from exc
        yield


@contextlib.contextmanager
def slot(name: str, limit: int | None) -> Iterator[str]:
    """Hold one slot of limit ``name`` (no-op when ``limit`` is None); yields the mode used:
    ``"prefect"``, ``"local"`` or ``"unlimited"``."""
    if not limit:
        yield "unlimited"
        return
    if prefect_run_active():
        with _prefect_slot(name, limit):
            yield "prefect"
        return
    with local_semaphore(name, limit):
        yield "local"


def environment_slot() -> contextlib.AbstractContextManager[str]:
    """One of this host's ``envs_per_host`` environment slots, for a trial's environment lifetime."""
    return slot(env_limit_name(), current().envs_per_host)


def llm_slot(provider: str) -> contextlib.AbstractContextManager[str]:
    """One of ``provider``'s concurrent LLM-call slots (provider as from :func:`llm_provider`)."""
    provider = (provider or "unknown").strip().lower()
    return slot(llm_limit_name(provider), current().llm_limit(provider))
