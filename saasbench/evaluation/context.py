"""The run context every primitive receives: target, identities, last response, captures.

One context per evaluation run. It owns the pooled HTTP client (created lazily, so a DAG of
file checks never opens a socket) and closes it at the end.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from saasbench.dag.placeholders import MISSING, Resolver, split_path
from saasbench.services.http import extract_id  # noqa: F401 - re-exported for primitives

if TYPE_CHECKING:
    from saasbench.services.auth import AuthManager, AuthProfile
    from saasbench.services.http import HttpClient, HttpResponse


RESPONSE_LOG_MAX = 200  # responses kept for P17 http_exchanges
RESPONSE_LOG_TEXT = 4_000  # chars of each response's text kept in the log


@dataclass
class Target:
    """What is being evaluated. Any field may be None; primitives that need it fail clearly."""

    base_url: str | None = None
    workspace: Path | None = None
    db_dsn: str | None = None
    environment: Any = None  # an Environment backend (exec, logs), when one exists
    task_id: str | None = None
    # where P12/P21 run commands when saasbench did not start the app (saasbench.environments.exec_target;
    # --exec local:DIR / docker:CONTAINER); it wins over ``environment`` for P12/P21
    exec_target: Any = None
    exec_env: dict[str, str] = field(default_factory=dict)  # variables every P12/P21 command gets
    # absolute URLs on these origins (the app's address on the benchmark's own machine) go to base_url
    origin_aliases: list[str] = field(default_factory=list)


@dataclass
class RunOptions:
    compat: str = "strict"  # or "reference": the reference harness's inclusive rules
    node_timeout_s: float = 120.0
    judge_node_timeout_s: float = 900.0  # llm-judge nodes: room for the judge's own retries
    http_timeout_s: float = 30.0
    max_response_bytes: int = 5 * 1024 * 1024
    judge_enabled: bool = False


class RunContext:
    def __init__(
        self,
        target: Target,
        *,
        options: RunOptions | None = None,
        auth_profile: "AuthProfile | None" = None,
        variables: Mapping[str, Any] | None = None,
        env_defaults: Mapping[str, str] | None = None,
    ):
        from saasbench.services.auth import AuthManager

        self.target = target
        self.options = options or RunOptions()
        self.auth: AuthManager = AuthManager(auth_profile)
        self.vars: dict[str, Any] = {}
        self.vars.update(self.auth.profile.context_vars())
        if target.base_url:
            self.vars["base_url"] = target.base_url.rstrip("/")
        self.vars.update(variables or {})
        # the operator's values (auth profile users, base_url, --var, task config): trusted in commands, as
        # long as nothing the app sent replaced them (captures, a login's token)
        self._operator_vars: dict[str, Any] = dict(self.vars)
        self.env_defaults = dict(env_defaults or {})
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> outputs, for {{NODE.field}}
        self.node_scope: dict[str, Any] = {}  # captures made by the node running now
        self.last_response: HttpResponse | None = None
        # every response of the run, oldest first (P17 evidence http_exchanges: cvyocaao api_responses,
        # ghmkznee http_responses, xayqujrv http_response_payload); bounded so a long run stays small
        self.response_log: deque[HttpResponse] = deque(maxlen=RESPONSE_LOG_MAX)
        self.last_document: Any = MISSING  # what P07/P06 read: last body, P08 rows, P05 result
        self.last_created_id: Any = None
        self._http: HttpClient | None = None
        self.node_max_score: float | None = None  # maxScore of the node running now (P17's default range)
        self.node_id: str | None = None  # the node running now and its step (P17's judge request, deferred judging)
        self.step_index: int | None = None
        self.judge: Any = None  # a saasbench.services.judge.Judge when an LLM judge is configured
        self.resources: dict[str, Any] = {}  # per-run handles (database connection, browser, ...)
        self._closers: list[Callable[[], None]] = []
        self._deadline: float | None = None
        self.node_budget_s: float | None = None  # the running node's wall-clock budget (messages name it)
        self._resolver = Resolver(self._scopes, self._shell_var)

    # --- placeholders ---------------------------------------------------------------------------
    def _scopes(self) -> list[Mapping[str, Any]]:
        return [self.node_scope, self.vars, self.nodes, self._builtins()]

    def _builtins(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.last_created_id is not None:
            out["_last_created_id"] = out["last_created_id"] = self.last_created_id
        if self.last_response is not None:
            out["_last_response_body"] = self.last_response.body
            out["_last_status"] = self.last_response.status
        return out

    def _shell_var(self, name: str) -> Any:
        if name in self.vars:
            return self.vars[name]
        if name in self.env_defaults:
            return self.env_defaults[name]
        return MISSING

    def resolve(self, value: Any) -> Any:
        """Resolve placeholders; raises UnresolvedPlaceholder naming the first unknown one."""
        return self._resolver.resolve(value)

    def resolve_command(self, text: str) -> str:
        """Resolve a shell command's ``{{...}}`` placeholders, each quoted for where it stands
        (``saasbench.dag.placeholders.quote_command``); ``${VAR}`` stays for the shell. Raises
        UnresolvedPlaceholder, or UnsafeShellValue for an app-supplied value inside a quoted string."""
        return self._resolver.resolve_command(text, self.operator_value)

    def operator_value(self, expr: str) -> bool:
        """Whether ``{{expr}}`` resolves to a value the operator gave (not one the app supplied)."""
        parts = split_path(expr)
        head = expr if expr in self.vars or expr in self.node_scope else (parts[0] if parts else expr)
        if not isinstance(head, str) or head in self.node_scope or head not in self.vars:
            return False  # this node's captures, node outputs, the last response: the app's
        return head in self._operator_vars and self.vars[head] == self._operator_vars[head]

    def resolver_with(self, extra: Mapping[str, Any]) -> Resolver:
        """A resolver that looks in ``extra`` first (auth login bodies templated with user fields)."""
        return Resolver(lambda: [extra, *self._scopes()], self._shell_var)

    def capture(self, name: str, value: Any) -> None:
        """Store a captured value for later ``{{name}}`` (run-wide and in the node's outputs)."""
        self.vars[name] = value
        self.node_scope[name] = value

    # --- responses ------------------------------------------------------------------------------
    def set_response(self, response: "HttpResponse") -> None:
        self.last_response = response
        # a light copy: the evidence shows the first 1,500 chars of each body, never the parsed body
        self.response_log.append(
            dataclasses.replace(response, text=(response.text or "")[:RESPONSE_LOG_TEXT], body=None)
        )
        self.last_document = response.body
        created = (
            extract_id(response.body) if response.status in (200, 201) and response.method in ("POST", "PUT") else None
        )
        if created is not None:
            self.last_created_id = created
            self.node_scope.setdefault("created_id", created)

    def clear_response(self) -> None:
        """Forget the last response (a request that got none must not leave a stale one to judge)."""
        self.last_response = None
        self.last_document = MISSING

    # --- HTTP and time --------------------------------------------------------------------------
    @property
    def http(self) -> "HttpClient":
        if self._http is None:
            from saasbench.services.http import HttpClient

            if not self.target.base_url:
                raise RuntimeError("no base URL: this primitive needs --base-url")
            self._http = HttpClient(
                self.target.base_url,
                max_bytes=self.options.max_response_bytes,
                timeout_s=self.options.http_timeout_s,
                origin_aliases=self.target.origin_aliases,
            )
        return self._http

    def start_node_clock(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self.node_budget_s = seconds

    @property
    def deadline_at(self) -> float | None:
        """The running node's deadline as a ``time.monotonic()`` instant (None before the first node)."""
        return self._deadline

    def cut_by_deadline(self, timeout: float) -> bool:
        """Whether an operation given ``timeout`` (from :meth:`timeout`) ends at the node deadline."""
        return self._deadline is not None and self.remaining() <= timeout + 0.01

    def remaining(self) -> float:
        if self._deadline is None:
            return float("inf")
        return self._deadline - time.monotonic()

    def timeout(self, requested: float | None = None) -> float:
        """A timeout for one operation: the requested or default one, bounded by the node deadline."""
        wanted = requested if requested and requested > 0 else self.options.http_timeout_s
        return max(0.05, min(wanted, self.remaining()))

    def add_closer(self, fn: "Callable[[], None]") -> None:
        """Run ``fn`` when the run ends (close a DB connection, a browser...); errors are swallowed."""
        self._closers.append(fn)

    def close(self) -> None:
        while self._closers:
            try:
                self._closers.pop()()
            except Exception:  # noqa: BLE001 - closing must never hide the run's results
                pass
        self.resources.clear()
        if self._http is not None:
            self._http.close()
            self._http = None


def describe_exec(target: Any) -> dict[str, Any] | None:
    """The exec target and the NAMES of its variables for ``report.json`` (values may be secrets)."""
    exec_target = getattr(target, "exec_target", None)
    names = sorted(getattr(target, "exec_env", None) or {})
    if exec_target is None and not names:
        return None
    out = exec_target.describe() if exec_target is not None else {"kind": getattr(target.environment, "kind", None)}
    out["env_names"] = names
    return out
