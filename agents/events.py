"""Parse coding-agent CLI event streams (JSON lines) into trajectory events and totals; run a CLI agent.

The shared machinery of the CLI adapters. Each agent module holds its own stream parser (a
:class:`StreamParser` subclass registered with :func:`register_parser` under its format name) next to
its :class:`CLIAgent`: ``claude`` in :mod:`saasbench.agents.claude_code`, ``codex`` in
:mod:`saasbench.agents.codex`, ``openhands`` in :mod:`saasbench.agents.openhands`. A parser is
stateful (feed a line at a time, so a run can be parsed while it streams, or all at once with
:func:`parse_stream`); :func:`make_parser` finds it by format name, ``FORMATS`` lists the registered
formats.

Each parsed :class:`StreamEvent` has a role, a kind (``message`` | ``tool_call`` |
``tool_result`` | ``usage`` | ``error``), capped content, and tool name/args or token counts.
:class:`StreamTotals` sums them: ``steps`` counts tool calls, tokens come from usage events
(the CLI's final totals when it reports them), ``cost_usd`` only when the CLI reports one, and
``exit_reason`` comes from the final result event (None when the stream has none). A line that
is not a JSON object never raises: it becomes an ``error`` event with ``parse_error`` set (for a
parser with ``plain_text_ok``, e.g. OpenHands, which prints status lines between its JSON events,
a line that does not start like JSON is kept as a ``message`` from ``system`` instead).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
import secrets as _secrets
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from saasbench.agents.base import Agent, Budget
from saasbench.redaction import redact_text

if TYPE_CHECKING:
    from saasbench.agents.base import Trajectory
    from saasbench.environments.local import Environment

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CONTENT_CAP = 4000  # characters of message/tool output kept per event
ARGS_CAP = 4000  # characters of each string tool argument kept

__all__ = [
    "CONTENT_CAP",
    "FORMATS",  # noqa: F822 - from the module __getattr__ (the parser registry)
    "AgentInstallError",
    "CLIAgent",
    "NpmInstalledCLI",
    "StreamEvent",
    "StreamParser",
    "StreamTotals",
    "apply_events",
    "apply_totals",
    "as_int",
    "cap",
    "cap_args",
    "formats",
    "make_parser",
    "parse_stream",
    "prompt_word",
    "put_file",
    "read_back",
    "register_parser",
    "to_shell",
]


def cap(text: Any, limit: int = CONTENT_CAP) -> str:
    """``text`` as a string of at most ``limit`` characters (a marker says how much was cut)."""
    if text is None:
        return ""
    if not isinstance(text, str):
        try:
            text = json.dumps(text, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} chars cut]"


def cap_args(args: Any) -> Any:
    """Tool arguments with every string capped at ``ARGS_CAP`` characters (lists at 100 items)."""
    if isinstance(args, dict):
        return {str(k): cap_args(v) for k, v in args.items()}
    if isinstance(args, list):
        return [cap_args(v) for v in args[:100]]
    if isinstance(args, str):
        return cap(args, ARGS_CAP)
    return args


def as_int(value: Any) -> int:
    """``value`` as an int (0 when missing or not a number)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class StreamEvent:
    kind: str  # message | tool_call | tool_result | usage | error
    role: str = ""  # assistant | user | tool | system
    content: str = ""
    tool: str | None = None
    args: Any = None
    call_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    is_error: bool = False
    parse_error: bool = False
    raw_type: str = ""

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role}
        if self.raw_type:
            out["type"] = self.raw_type
        if self.tool is not None:
            out["tool"] = self.tool
        if self.args is not None:
            out["args"] = self.args
        if self.call_id:
            out["call_id"] = self.call_id
        if self.kind == "usage":
            out["tokens_in"] = self.tokens_in
            out["tokens_out"] = self.tokens_out
            if self.cost_usd is not None:
                out["cost_usd"] = self.cost_usd
        if self.is_error:
            out["is_error"] = True
        if self.parse_error:
            out["parse_error"] = True
        return out


@dataclass
class StreamTotals:
    steps: int = 0  # tool calls
    turns: int = 0  # model turns as the CLI reports them (0 when it does not)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    exit_reason: str | None = None  # completed | agent_error | agent_budget_exceeded; None: no final event
    error: str | None = None
    final_text: str = ""
    parse_errors: int = 0
    lines: int = 0


class StreamParser:
    """Base: ``feed(line)`` returns the events of one line; ``totals`` accumulates."""

    format = "generic"
    plain_text_ok = False  # the CLI prints human-readable lines between its JSON events

    def __init__(self) -> None:
        self.totals = StreamTotals()
        self.events: list[StreamEvent] = []
        self._usage_final = False  # the CLI reported run totals: per-message usage no longer counts

    def feed(self, line: str) -> list[StreamEvent]:
        line = line.strip()
        if not line:
            return []
        self.totals.lines += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if self.plain_text_ok and not line.startswith(("{", "[")):
                text = _ANSI.sub("", line).strip()
                return self._keep(
                    [StreamEvent("message", "system", cap(text, 500), raw_type="cli_text")] if text else []
                )
            return self._keep([self._parse_error(f"not JSON ({exc.msg}): {line}")])
        if not isinstance(obj, dict):
            return self._keep([self._parse_error(f"not a JSON object: {line}")])
        try:
            events = self.handle(obj)
        except Exception as exc:  # noqa: BLE001 - an odd event shape must not end the run's record
            events = [self._parse_error(f"unexpected {self.format} event ({type(exc).__name__}: {exc}): {line}")]
        return self._keep(events)

    def feed_text(self, text: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for line in text.splitlines():
            out += self.feed(line)
        return out

    def _keep(self, events: list[StreamEvent]) -> list[StreamEvent]:
        for ev in events:
            if ev.kind == "tool_call":
                self.totals.steps += 1
            if ev.kind == "usage" and not self._usage_final:
                self.totals.tokens_in += ev.tokens_in
                self.totals.tokens_out += ev.tokens_out
                if ev.cost_usd is not None:
                    self.totals.cost_usd = (self.totals.cost_usd or 0.0) + ev.cost_usd
        self.events += events
        return events

    def _parse_error(self, message: str) -> StreamEvent:
        self.totals.parse_errors += 1
        return StreamEvent("error", "system", cap(message, 500), parse_error=True, raw_type="parse_error")

    def _final_usage(self, tokens_in: int, tokens_out: int, cost: float | None) -> None:
        """The CLI's own run totals replace what per-message usage added up to."""
        self.totals.tokens_in, self.totals.tokens_out = tokens_in, tokens_out
        if cost is not None:
            self.totals.cost_usd = cost
        self._usage_final = True

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:  # pragma: no cover - abstract
        raise NotImplementedError


# --- the parser registry: each agent module registers its own parser ----------------------------------
_PARSERS: dict[str, type[StreamParser]] = {}
_P = TypeVar("_P", bound=type[StreamParser])


def register_parser(cls: _P) -> _P:
    """Class decorator: the parser of the stream format ``cls.format`` (one parser per format)."""
    known = _PARSERS.get(cls.format)
    if known is not None and known is not cls:
        raise ValueError(f"stream format {cls.format!r} has a parser already: {known.__module__}.{known.__name__}")
    _PARSERS[cls.format] = cls
    return cls


def formats() -> tuple[str, ...]:
    """The registered stream formats (the agent modules of ``saasbench.agents`` register theirs on import)."""
    importlib.import_module("saasbench.agents")  # the package imports every built-in agent module
    return tuple(_PARSERS)


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "FORMATS":  # computed: the registry fills while the agent modules import this one
        return formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_parser(fmt: str) -> StreamParser:
    if fmt not in _PARSERS:
        formats()
    try:
        return _PARSERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown stream format {fmt!r} (known: {', '.join(formats())})") from None


def parse_stream(fmt: str, text: str) -> tuple[list[StreamEvent], StreamTotals]:
    """All events and the totals of a whole recorded stream."""
    parser = make_parser(fmt)
    parser.feed_text(text)
    return parser.events, parser.totals


def apply_events(traj: Trajectory, events: list[StreamEvent], secrets: tuple[str, ...] = ()) -> None:
    """Append ``events`` to ``traj`` (``secrets`` replaced by ``***`` in the text)."""
    for ev in events:
        data = ev.data()
        if secrets and "args" in data:
            data["args"] = json.loads(redact_text(json.dumps(data["args"]), secrets))
        traj.event(ev.kind, redact_text(ev.content, secrets) if secrets else ev.content, **data)


def apply_totals(traj: Trajectory, totals: StreamTotals) -> None:
    traj.steps = totals.steps
    traj.tokens_in = totals.tokens_in
    traj.tokens_out = totals.tokens_out
    if totals.cost_usd is not None:
        traj.cost_usd = round(totals.cost_usd, 6)


# --- running a CLI agent inside an environment (shared by the Claude Code, Codex and OpenHands adapters) ---
INSTALL_TIMEOUT_S = 900.0
_CHUNK = 600_000  # bytes per read-back exec (base64 stays under the 1 MiB output cap)


class AgentInstallError(RuntimeError):
    """The agent CLI could not be installed in the environment (the trial's ``env_error``, retried)."""


def _install_secrets(variables: dict[str, str], api_key: str | None) -> list[str]:
    """What an install's output must not show: the agent's key, every secret-looking host variable's
    value, and passwords inside the proxy and index URLs handed to the install."""
    from urllib.parse import urlsplit

    from saasbench.environments.base import is_secret_name

    out = [v for k, v in os.environ.items() if v and is_secret_name(k)]
    out += [api_key] if api_key else []
    for value in variables.values():
        for word in value.split(","):
            if "://" in word:
                try:
                    password = urlsplit(word.strip()).password
                except ValueError:
                    password = None
                if password:
                    out.append(password)
    return out


def prompt_word(prompt_file: str) -> str:
    """The shell word that expands to the prompt file's contents (the prompt after ``--``)."""
    return f'"$(cat {shlex.quote(prompt_file)})"'


def to_shell(argv: list[str]) -> str:
    """``argv`` as one shell command; the prompt word (:func:`prompt_word`) stays unquoted."""
    return " ".join(a if a.startswith('"$(cat ') else shlex.quote(a) for a in argv)


class CLIAgent(Agent):
    """A coding-agent CLI run once inside the environment, its JSON-lines stdout parsed into the trajectory.

    Subclasses give ``stream_format`` (a format whose parser the same module registers with
    :func:`register_parser`), :meth:`command`, :meth:`install_command`, :meth:`process_env`
    (gateway URL and key: only the agent process gets them), ``gateway_env``, ``shell_tools`` and
    ``file_tools`` (see :class:`~saasbench.agents.base.Agent`) and optionally :meth:`prepare`
    (config files in the run folder). Keyword arguments: ``model``,
    ``base_url`` (the model gateway), ``api_key`` (the per-run key; default: a fresh random
    one), ``bin_dir`` (prepended to PATH, e.g. an npm prefix's ``bin``), ``artefacts_dir``
    (host folder for the raw stream; default: the environment's state folder).
    Host variables ``SAASBENCH_AGENT_MODEL``/``_BASE_URL``/``_API_KEY`` are the fallbacks.
    With a model gateway attached (``gateway``, a :class:`saasbench.runs.gateway.TrialGateway`, set by
    :meth:`saasbench.runs.gateway.Gateway.attach`), :meth:`run` uses the gateway's URL (a relay into the
    trial network for non-local environments) and the trial's virtual key instead.
    """

    stream_format: ClassVar[str] = "generic"
    gateway_api: ClassVar[str] = "openai"  # which protocol the CLI speaks to the gateway: openai | anthropic
    gateway: Any = None
    bin_dir: str | None  # set in __init__; NpmInstalledCLI and OpenHands derive it from their install prefix
    default_model: ClassVar[str] = ""
    events_file: ClassVar[str] = "events.jsonl"
    package: ClassVar[str] = ""
    package_version: ClassVar[str] = ""

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        bin_dir: str | None = None,
        artefacts_dir: str | Path | None = None,
        install_timeout_s: float = INSTALL_TIMEOUT_S,
    ):
        self.model = model or os.environ.get("SAASBENCH_AGENT_MODEL") or self.default_model
        self.base_url = base_url or os.environ.get("SAASBENCH_AGENT_BASE_URL") or ""
        self.api_key = api_key or os.environ.get("SAASBENCH_AGENT_API_KEY") or None
        self.bin_dir = bin_dir
        self.artefacts_dir = Path(artefacts_dir) if artefacts_dir is not None else None
        self.install_timeout_s = install_timeout_s
        self.last_artefacts: dict[str, str] = {}

    # --- per-CLI parts -------------------------------------------------------------------------------
    def command(self, prompt_file: str, model: str, workspace: str) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def install_command(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def version_command(self) -> str:
        return ""

    def process_env(self, run_dir: str, key: str, budget: Budget) -> dict[str, str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def prepare(self, env: Environment, run_dir: str, budget: Budget) -> None:
        """Write config files into ``run_dir`` (inside the environment, outside the workspace)."""

    # --- install -------------------------------------------------------------------------------------
    def install(self, env: Environment) -> None:
        """Run :meth:`install_command` as a setup command of the harness (:meth:`Environment.setup_exec`:
        outside the local sandbox, it may write the host's npm prefix) with the host's proxy, CA and
        package-index variables (:data:`saasbench.environments.base.INSTALL_ENV`), then
        :meth:`version_command` as the agent would run; a failure raises :class:`AgentInstallError`
        carrying the tool's own last output lines, secrets redacted."""
        from saasbench.environments.base import install_env

        cmd = self.install_command()
        variables = install_env()
        secrets = _install_secrets(variables, self.api_key)
        res = env.setup_exec(cmd, timeout_s=self.install_timeout_s, env=variables)
        if not res.ok:
            why = "timed out" if res.timed_out else f"exited {res.exit_code}"
            tail = "\n".join((res.stderr.strip() or res.stdout.strip()).splitlines()[-15:])
            raise AgentInstallError(
                redact_text(f"{self.name}: `{cmd}` {why} after at most {self.install_timeout_s:g}s\n{tail}", secrets)
            )
        check = self.version_command()
        if check:
            self._expose(env)
            res = env.exec(self._with_path(check), timeout_s=120, env=variables)
            if not res.ok:
                out = (res.stderr.strip() or res.stdout.strip())[-500:]
                raise AgentInstallError(
                    redact_text(f"{self.name}: installed, but `{check}` exited {res.exit_code}: {out}", secrets)
                )

    # --- run -------------------------------------------------------------------------------------------
    def _with_path(self, cmd: str) -> str:
        return f'PATH={shlex.quote(self.bin_dir)}:"$PATH" {cmd}' if self.bin_dir else cmd

    def _expose(self, env: Environment) -> None:
        """Show the CLI's install folder (read-only) to commands confined on this host (the local sandbox)."""
        if env.runs_on_host and self.bin_dir:
            env.expose_host_path(self.bin_dir)

    def _host_dir(self, env: Environment, run_id: str) -> Path:
        if self.artefacts_dir is not None:
            root = self.artefacts_dir
        elif env.state_dir is not None:
            root = Path(env.state_dir) / "agents"
        else:
            root = Path(tempfile.mkdtemp(prefix="saasbench-agent-"))
        path = root / f"{self.name}-{run_id}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        if self.gateway is None:
            return self._run(prompt, env, budget)
        with self.gateway.open(env) as endpoint:  # a relay into the trial network lives as long as the rollout
            self.base_url, self.api_key = endpoint.base_url(self.gateway_api), endpoint.api_key
            return self._run(prompt, env, budget)

    def _run(self, prompt: str, env: Environment, budget: Budget) -> Trajectory:
        traj = self.new_trajectory(self.model)
        run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + _secrets.token_hex(3)
        key = self.api_key or "sk-saasbench-" + _secrets.token_urlsafe(24)
        host_dir = self._host_dir(env, run_id)
        local = env.runs_on_host
        run_dir = str(host_dir) if local else f"/tmp/saasbench-agent/{self.name}-{run_id}"
        events_path, stderr_path = f"{run_dir}/{self.events_file}", f"{run_dir}/stderr.log"
        self.last_artefacts = {
            "events": str(host_dir / self.events_file),
            "stderr": str(host_dir / "stderr.log"),
            "dir": str(host_dir),
        }
        try:
            if not local:
                env.exec(f"mkdir -p {shlex.quote(run_dir)}/home", timeout_s=60)
            else:
                (host_dir / "home").mkdir(exist_ok=True)
                self._expose(env)
                env.expose_host_path(host_dir, writable=True)  # prompt, config, event stream, HOME
            prompt_file = f"{run_dir}/prompt.md"
            put_file(env, prompt_file, prompt)
            self.prepare(env, run_dir, budget)
        except Exception as exc:  # noqa: BLE001 - environment trouble before the agent started
            return traj.finish("agent_error", f"{self.name}: cannot prepare the run folder: {exc}")
        argv = self.command(prompt_file, self.model, env.workspace_path)
        shell = self._with_path(
            f"exec {to_shell(argv)} </dev/null >{shlex.quote(events_path)} 2>{shlex.quote(stderr_path)}"
        )
        agent_env = self.process_env(run_dir, key, budget)
        secrets = (key,)
        traj.event(
            "note",
            f"{self.name}: {shell}",
            command=argv,
            artefact=self.last_artefacts["events"],
            env_names=sorted(agent_env),
            base_url=self.base_url,
        )
        remaining = budget.wall_s - traj.elapsed()
        if remaining <= 0:
            return traj.finish(
                "agent_timeout", f"wall-clock budget {budget.wall_s:g}s used up before the agent started"
            )
        parser = make_parser(self.stream_format)
        lock = threading.Lock()
        tail = _Tail(Path(events_path), parser, traj, secrets, lock) if local else None
        if tail is not None:
            tail.start()
        try:
            res = env.exec(shell, timeout_s=remaining, env=agent_env)
        except Exception as exc:  # noqa: BLE001 - the environment failed, not the agent: still no raise
            if tail is not None:
                tail.stop()
            return traj.finish("agent_error", f"{self.name}: the environment could not run the CLI: {exc}")
        if tail is not None:
            tail.stop()
        else:
            try:
                text = read_back(env, events_path)
            except Exception as exc:  # noqa: BLE001
                text = ""
                traj.event("error", f"cannot read the event stream back: {exc}")
            parser_events = parser.feed_text(text)
            apply_events(traj, parser_events, secrets)
            (host_dir / self.events_file).write_text(redact_text(text, secrets), encoding="utf-8")
        stderr_text = _scrub_files(env, local, host_dir, run_dir, secrets, self.events_file)
        totals = parser.totals
        apply_totals(traj, totals)
        if parser.totals.parse_errors:
            traj.event(
                "note", f"{totals.parse_errors} stream line(s) were not parseable", parse_errors=totals.parse_errors
            )
        self._conclude(traj, totals, res, budget, stderr_text, secrets)
        _persist_trajectory(traj, host_dir, secrets)
        return traj

    def _conclude(
        self,
        traj: Trajectory,
        totals: StreamTotals,
        res: Any,
        budget: Budget,
        stderr_text: str,
        secrets: tuple[str, ...],
    ) -> None:
        """Set the exit reason: timeout first, then the stream's final event, then the exit code."""
        if res.timed_out:
            traj.finish("agent_timeout", f"{self.name} ran out of its wall-clock budget ({budget.wall_s:g}s)")
            return
        if totals.exit_reason is not None:
            if totals.exit_reason == "completed" and res.exit_code != 0:
                traj.event("note", f"{self.name} exited {res.exit_code} after a successful result")
            if totals.exit_reason == "completed" and totals.steps > budget.steps:
                traj.finish("agent_budget_exceeded", f"{totals.steps} tool calls, over the step budget {budget.steps}")
                return
            traj.finish(totals.exit_reason, totals.error)  # type: ignore[arg-type]
            return
        if res.exit_code == 0:
            traj.event("note", f"{self.name} exited 0 without a final result event")
            traj.finish("completed")
            return
        last = "\n".join(redact_text(stderr_text, secrets).strip().splitlines()[-5:])
        traj.finish("agent_error", cap(f"{self.name} exited {res.exit_code} without a result event: {last}", 1000))


class NpmInstalledCLI:
    """Mixin for a CLI agent installed from the npm registry (``package``@``package_version``);
    ``npm_prefix`` installs it under a prefix whose ``bin/`` then holds the executable."""

    package: ClassVar[str]
    package_version: ClassVar[str]
    bin_dir: str | None

    def __init__(self, *args, npm_prefix: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.npm_prefix = npm_prefix
        if npm_prefix and not self.bin_dir:
            self.bin_dir = f"{npm_prefix.rstrip('/')}/bin"

    def install_command(self) -> str:
        prefix = f" --prefix {shlex.quote(self.npm_prefix)}" if self.npm_prefix else ""
        return f"npm install -g{prefix} --no-fund --no-audit {self.package}@{self.package_version}"


class _Tail(threading.Thread):
    """Feed a growing JSON-lines file into the parser and the trajectory while the CLI runs."""

    def __init__(
        self, path: Path, parser: StreamParser, traj: Trajectory, secrets: tuple[str, ...], lock: threading.Lock
    ):
        super().__init__(daemon=True)
        self.path, self.parser, self.traj, self.secrets, self.lock = path, parser, traj, secrets, lock
        self._halt = threading.Event()
        self._buf = b""

    def run(self) -> None:
        fh = None
        try:
            while True:
                stopping = self._halt.is_set()
                if fh is None and self.path.exists():
                    fh = open(self.path, "rb")  # noqa: SIM115 - closed in finally
                if fh is not None:
                    chunk = fh.read(1 << 20)
                    while chunk:
                        self._buf += chunk
                        self._lines(final=False)
                        chunk = fh.read(1 << 20)
                if stopping:
                    break
                self._halt.wait(0.2)
            self._lines(final=True)
        finally:
            if fh is not None:
                fh.close()

    def _lines(self, final: bool) -> None:
        *lines, rest = self._buf.split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        self._buf = rest
        for raw in lines:
            evs = self.parser.feed(raw.decode("utf-8", errors="replace"))
            with self.lock:
                apply_events(self.traj, evs, self.secrets)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


def put_file(env: Environment, path: str, text: str, mode: str | None = None) -> None:
    """Write ``text`` to an absolute path inside the environment (outside the workspace too)."""
    if env.runs_on_host:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        if mode:
            os.chmod(p, int(mode, 8))
        return
    data = base64.b64encode(text.encode("utf-8")).decode()
    q = shlex.quote(path)
    env.exec(f'mkdir -p "$(dirname {q})" && : > {q}', timeout_s=60)
    for i in range(0, len(data), 64_000):
        res = env.exec(f"printf %s {data[i : i + 64_000]} | base64 -d >> {q}", timeout_s=60)
        if not res.ok:
            raise OSError(f"cannot write {path} in the environment: {res.stderr.strip()[:300]}")
    if mode:
        env.exec(f"chmod {mode} {q}", timeout_s=60)


def read_back(env: Environment, path: str) -> str:
    """A file of any size from inside the environment, in base64 chunks under the exec output cap."""
    q = shlex.quote(path)
    out = bytearray()
    i = 0
    while True:
        res = env.exec(
            f"test -f {q} || exit 0; dd if={q} bs={_CHUNK} skip={i} count=1 status=none | base64 -w0", timeout_s=120
        )
        if not res.ok:
            raise OSError(res.stderr.strip()[:300] or f"exit {res.exit_code}")
        chunk = base64.b64decode(res.stdout.strip() or b"")
        out += chunk
        if len(chunk) < _CHUNK:
            return out.decode("utf-8", errors="replace")
        i += 1


def _scrub_files(
    env: Environment, local: bool, host_dir: Path, run_dir: str, secrets: tuple[str, ...], events_file: str
) -> str:
    """Redact the key from the kept artefacts, fetch stderr, drop the run's scratch HOME; returns stderr."""
    if local:
        for name in (events_file, "stderr.log"):
            p = host_dir / name
            if p.is_file():
                text = p.read_text(encoding="utf-8", errors="replace")
                if any(s and s in text for s in secrets):
                    p.write_text(redact_text(text, secrets), encoding="utf-8")
        shutil.rmtree(host_dir / "home", ignore_errors=True)
        p = host_dir / "stderr.log"
        return p.read_text(encoding="utf-8", errors="replace")[-20000:] if p.is_file() else ""
    try:
        stderr = read_back(env, f"{run_dir}/stderr.log")
    except Exception:  # noqa: BLE001
        stderr = ""
    (host_dir / "stderr.log").write_text(redact_text(stderr, secrets), encoding="utf-8")
    env.exec(f"rm -rf {shlex.quote(run_dir)}/home", timeout_s=60)
    return stderr[-20000:]


def _persist_trajectory(traj: Trajectory, host_dir: Path, secrets: tuple[str, ...]) -> None:
    try:
        (host_dir / "trajectory.json").write_text(
            redact_text(traj.model_dump_json(indent=1), secrets), encoding="utf-8"
        )
    except OSError:
        pass
