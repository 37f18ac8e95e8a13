"""The agent interface, budgets, trajectories, the agent registry and the task prompt.

An :class:`Agent` turns (prompt, environment) into a changed workspace. It gets an
:class:`~saasbench.environments.local.Environment` (``env.task`` is the task) and a :class:`Budget`;
it returns a :class:`Trajectory` whose ``exit_reason`` is one of the agent outcomes of the
failure taxonomy. Agents never start the evaluation or reach into the orchestrator: after the
rollout the trial starts the app with :func:`saasbench.environments.local.start_app` (the deployment
contract) and evaluates it.

Agents register by name with :func:`register_agent`; :func:`get_agent` also accepts an import
path ``package.module:ClassName`` for custom agents.
"""

from __future__ import annotations

import importlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, PrivateAttr

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task
    from saasbench.environments.local import Environment

#: ``model_error``: the agent stopped because its model upstream failed (connection refused or reset, timeout,
#: HTTP 408/429/5xx) after its retries -- an infrastructure outcome the harness retries with a fresh rollout
#: (:mod:`saasbench.runs.outages`), never the agent's score. The other four are the agent's own.
ExitReason = Literal["completed", "agent_timeout", "agent_budget_exceeded", "agent_error", "model_error"]
#: How a file-writing tool's arguments carry what it wrote (the anti-cheat scanner reads them,
#: :func:`saasbench.agents.anticheat.file_writes`): ``write`` a whole file (``path``/``file_path`` and
#: ``content``); ``edit`` part of one (``new``/``new_string``/``new_str``); ``multiedit`` (``edits[].new_string``);
#: ``notebook`` (``notebook_path``, ``new_source``); ``editor`` (``command`` create with ``file_text``,
#: str_replace/insert with ``new_str``); ``file_change`` (Codex: ``changes[].path``, no content);
#: ``apply_patch`` (``input``: a ``*** Begin Patch`` text).
WriteLayout = Literal["write", "edit", "multiedit", "notebook", "editor", "file_change", "apply_patch"]


class Budget(BaseModel):
    """Limits of one rollout (the paper's defaults)."""

    steps: int = Field(default=500, gt=0, description="Agent turns / tool calls")
    wall_s: float = Field(default=10800, gt=0, description="Wall clock of the whole rollout")
    tool_call_s: float = Field(default=900, gt=0, description="Wall clock of one tool call (one exec)")


class TrajectoryEvent(BaseModel):
    t_s: float = Field(description="Seconds since the rollout started")
    kind: str = Field(description="e.g. message, tool_call, tool_result, file_write, error, note")
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """What an agent did: events, counters and why it stopped."""

    agent: str
    version: str = ""
    model: str | None = None
    events: list[TrajectoryEvent] = Field(default_factory=list)
    steps: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    exit_reason: ExitReason = "completed"
    error: str | None = None
    _t0: float = PrivateAttr(default_factory=time.monotonic)
    _listener: Callable[[TrajectoryEvent], None] | None = PrivateAttr(default=None)

    def event(self, kind: str, message: str = "", **data: Any) -> TrajectoryEvent:
        ev = TrajectoryEvent(t_s=round(time.monotonic() - self._t0, 3), kind=kind, message=message, data=data)
        self.events.append(ev)
        if self._listener is not None:
            try:
                self._listener(ev)
            except Exception:  # noqa: BLE001, S110 - a progress display must never break the agent
                pass
        return ev

    def listen(self, callback: Callable[[TrajectoryEvent], None] | None) -> Trajectory:
        """Call ``callback(event)`` for every event recorded from now on (live progress); None stops it."""
        self._listener = callback
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def finish(self, exit_reason: ExitReason = "completed", error: str | None = None) -> Trajectory:
        self.exit_reason = exit_reason
        self.error = error
        self.wall_s = round(self.elapsed(), 3)
        if error:
            self.event("error", error)
        return self


class Agent(ABC):
    """One agent adapter. Subclasses set ``name`` and ``version`` and implement :meth:`run`."""

    name: ClassVar[str] = "agent"
    version: ClassVar[str] = "0"
    #: Set by the harness (e.g. ``saasbench rollout``) before :meth:`run`: every trajectory made
    #: by :meth:`new_trajectory` reports its events to it as they are recorded.
    on_event: Callable[[TrajectoryEvent], None] | None = None
    #: Tool names (as this agent records them on ``tool_call`` events; case does not matter) that run a
    #: shell command given as ``args["command"]``: the anti-cheat scanner reads those commands.
    shell_tools: ClassVar[frozenset[str]] = frozenset()
    #: This agent's file-writing tool names -> :data:`WriteLayout` of their arguments: the anti-cheat
    #: scanner checks the files written this way that are run afterwards.
    file_tools: ClassVar[Mapping[str, WriteLayout]] = {}
    #: Whether what this agent runs is the harness's own choice (oracle: the task's reference; nop:
    #: nothing), not a model's: only a trusted agent runs on an environment that cannot confine it (the
    #: local backend without its sandbox, :meth:`Environment.check_untrusted_agent`).
    trusted: ClassVar[bool] = False

    @classmethod
    def gateway_env(cls, root_url: str, key: str, model: str | None = None) -> dict[str, str]:
        """The variables the agent's process needs to reach the model gateway at ``root_url`` (no trailing
        slash; the OpenAI-compatible API is ``root_url + "/v1"``) with the trial's virtual ``key``;
        ``model`` is the gateway's model name. Used by :func:`saasbench.runs.gateway.agent_env_for`.
        Default: both the OpenAI and the Anthropic pair (an agent whose client reads either)."""
        return {
            "OPENAI_BASE_URL": root_url + "/v1",
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": root_url,
            "ANTHROPIC_API_KEY": key,
        }

    def install(self, env: Environment) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Put the agent's runtime into the environment (CLI binaries, config). Default: nothing."""

    @abstractmethod
    def run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        """Work in ``env`` until done or out of budget. Must not raise for the agent's own
        failures: they are ``exit_reason`` agent_error/agent_timeout/agent_budget_exceeded (model_error when the
        model upstream failed under it)."""

    def app_start_command(self, task: Task) -> str | None:
        """The command the trial starts the app with (default: the task's ``app.start_command``)."""
        return task.spec.app.start_command

    def new_trajectory(self, model: str | None = None) -> Trajectory:
        return Trajectory(agent=self.name, version=self.version, model=model).listen(self.on_event)


# --- registry ----------------------------------------------------------------------------------------
_AGENTS: dict[str, type[Agent]] = {}
_BUILTINS = ("oracle", "nop")


class AgentNotFound(KeyError):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "agent not found"


def register_agent(name: str):
    """Class decorator: ``@register_agent("oracle")`` makes the class available by name."""

    def wrap(cls: type[Agent]) -> type[Agent]:
        cls.name = name
        _AGENTS[name] = cls
        return cls

    return wrap


def _load_builtins() -> None:
    for mod in _BUILTINS:
        importlib.import_module(f"saasbench.agents.{mod}")


def list_agents() -> dict[str, type[Agent]]:
    _load_builtins()
    return dict(sorted(_AGENTS.items()))


def agent_class(spec: str) -> type[Agent]:
    """The agent class of a registered name or a ``module:Class`` import path (:class:`AgentNotFound` if none)."""
    _load_builtins()
    if spec in _AGENTS:
        return _AGENTS[spec]
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise AgentNotFound(f"cannot import agent {spec!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Agent)):
            raise AgentNotFound(f"{spec!r} is not a subclass of saasbench.agents.base.Agent")
        return cls
    raise AgentNotFound(f"no agent {spec!r} (known: {', '.join(sorted(_AGENTS))}; or give module:Class)")


def get_agent(spec: str, **kwargs: Any) -> Agent:
    """An agent instance by registered name or ``module:Class`` import path."""
    return agent_class(spec)(**kwargs)


# --- the task prompt (paper, Appendix C.1) --------------------------------------------------------------
ANTI_CHEAT = (
    "Mandatory anti-cheat policy. You MUST implement the platform from scratch within this {where}. Cloning, copying, "
    "or otherwise importing any pre-existing open-source codebase (via git clone, wget, curl, container image "
    "extraction, package downloads of unrelated projects, etc.) is strictly forbidden and will be detected by the "
    "harness. Trajectories that fetch external source repositories receive a score of 0 regardless of the resulting "
    "test outcomes."
)

SUCCESS = (
    "### Success Condition\n"
    "The application server must be reachable on the designated port by the time you consider the task done. "
    "Anything that needs to happen before that — dependency install, schema migration, fixture creation, process "
    "supervision — is part of what is being evaluated; the harness will not enumerate the steps for you."
)


def stage_task_inputs(task: Task, env: Environment) -> list[str]:
    """Copy ``task.md`` and ``knowledge_base.json`` into the workspace; returns the files copied."""
    copied = []
    for path in (task.prd_path, task.kb_path):
        if path.is_file():
            env.write_file(path.name, path.read_bytes())
            copied.append(path.name)
    return copied


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _database_line(task: Task, env: Environment) -> str:
    db = task.spec.database
    if db is None:
        return ""
    if db.engine.lower() in ("sqlite", "sqlite3"):
        path = env.service_env().get("DATABASE_PATH", db.path or "")
        return (
            f"Database (SQLite{' ' + db.version if db.version else ''}, a file): use the path in $DATABASE_PATH "
            f"(currently {path}); create it if it does not exist."
        )
    parts = [f"host {task.spec.environment.get('db_host', 'db')}"]
    for label, value in (("port", db.port), ("database", db.name), ("username", db.user), ("password", db.password)):
        if value not in (None, ""):
            parts.append(f"{label} {value}")
    if db.extensions:
        parts.append("extensions " + ", ".join(db.extensions))
    return f"Database ({db.engine}{' ' + db.version if db.version else ''}, already running): " + ", ".join(parts) + "."


def build_prompt(task: Task, env: Environment, *, stage: bool = True) -> str:
    """The paper's four-block prompt for ``task`` in ``env``; with ``stage``, PRD and KB are copied in.

    Per-task text comes from ``task.yaml``: ``title``/``environment.product`` (product
    description), ``stack``, ``environment.tools``/``base_os``/``requirements``, the database
    (host ``environment.db_host``), the auth profile's evaluation users, and the app's start
    command (our deployment contract: the harness runs it after the agent, with ``$PORT`` and
    ``$DATABASE_PATH`` set). ``tasks import`` fills these from a public task's
    ``prompt_for_model.md`` (``facts`` in task.yaml).
    """
    if stage:
        stage_task_inputs(task, env)
    spec = task.spec
    extra = spec.environment or {}
    ws = env.workspace_path
    product = extra.get("product") or (spec.facts.product if spec.facts else None) or spec.title or spec.id
    stack = spec.stack if isinstance(spec.stack, str) else (json.dumps(spec.stack) if spec.stack else "")
    port = env.app_port

    if env.runs_on_host:
        where = "environment"
        env_text = (
            f"Environment. You work on a prepared machine in the folder {ws} (the working directory, currently "
            f"empty apart from the requirements files). Run commands with your shell tool from that folder."
        )
    else:
        where = "Docker environment"
        # the trial's real container name (per trial); the name the public prompt gives is another machine's
        container = env.container_name or extra.get("container") or "app"
        env_text = (
            "Environment. The Docker environment is already up and running — you do not need to pull images or "
            f"start containers. You work inside the container {container}, with {ws} as the working directory "
            f"(currently empty). Run commands inside the container like this: docker exec {container} bash -c "
            '"your command".'
        )
    role = (
        f"You are a senior full-stack engineer. Your task is to build a complete {product} from scratch inside an "
        f"already-running {where}."
    )
    lines = [role, "", env_text]
    tools = _as_list(extra.get("tools"))
    if tools:
        base_os = f" ({extra['base_os']})" if extra.get("base_os") else ""
        lines.append(f"Tools pre-installed{base_os}: " + "; ".join(tools) + ".")
    db_line = _database_line(task, env)
    if db_line:
        lines.append(db_line)
    lines.append(f"The application MUST listen on port {port}.")
    users = spec.auth.users if spec.auth is not None else {}
    if users:
        described = "; ".join(
            f"{role}: " + ", ".join(f"{k} {v}" for k, v in fields.items() if k in ("username", "email", "password"))
            for role, fields in users.items()
        )
        users_text = (
            f"create the following evaluation user{'s' if len(users) > 1 else ''} ({', '.join(users)}): {described}"
        )
    else:
        users_text = "create the evaluation users with the credentials specified in the PRD"
    start = spec.app.start_command
    if start:
        serve = (
            f"provide `{start}` in the working directory: the harness runs it there after you finish, with $PORT "
            f"({port}) and $DATABASE_PATH set, and it must start the application server listening on 0.0.0.0:$PORT"
        )
    else:
        serve = f"start the application server, listening on 0.0.0.0:{port}"
    todo = (
        f"What you need to do: (1) create a complete {stack + ' ' if stack else ''}project inside {ws}; "
        f"(2) install dependencies; (3) run database migrations; (4) {users_text}; (5) {serve}."
    )
    lines += ["", todo]
    reqs = _as_list(extra.get("requirements"))
    if not env.runs_on_host and extra.get("container") and extra["container"] != container:
        # requirements copied from a public prompt name the benchmark machine's container; this trial's is another
        reqs = [r.replace(str(extra["container"]), container) for r in reqs]
    if reqs:
        lines += ["", "Key technical requirements. " + " ".join(reqs)]

    jq_path = ".[]"
    try:
        raw_kb = json.loads(task.kb_path.read_text(encoding="utf-8-sig")) if task.kb_path.is_file() else None
        if isinstance(raw_kb, dict):
            jq_path = "." + next((k for k, v in raw_kb.items() if isinstance(v, list)), "clarifications") + "[]"
    except (OSError, ValueError):
        pass
    block3 = (
        "### Requirements Document\n"
        f"The complete product requirements document has been placed in the working directory at {ws}/task.md. Read it "
        "carefully and implement everything it describes. In addition, the working directory contains a supplementary "
        f"knowledge base at {ws}/knowledge_base.json that clarifies ambiguous points in the PRD. Each entry has the shape "
        "{id, question, answer, source_reference, confidence}. Consult it as a reference when task.md is unclear on "
        "details such as field semantics, state transitions, serialization, filtering, or permissions. You can read it on "
        f"demand with jq, cat, or grep (e.g. jq '{jq_path} | {{id, question, answer}}' {ws}/knowledge_base.json); you do not "
        "have to read the whole file at once."
    )
    return "\n\n".join([ANTI_CHEAT.format(where=where), "\n".join(lines), block3, SUCCESS]) + "\n"
