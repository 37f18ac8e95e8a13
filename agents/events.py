"""Parse coding-agent CLI event streams (JSON lines) into trajectory events and totals.

Three formats, one stateful parser each (feed a line at a time, so a run can be parsed while
it streams, or all at once with :func:`parse_stream`):

- ``claude``: Claude Code ``-p --output-format stream-json --verbose`` (``system``/``assistant``/
  ``user``/``result`` objects; the final ``result`` carries usage, cost, turns and the outcome).
- ``codex``: ``codex exec --json`` (``thread.started``, ``turn.*``, ``item.started``/
  ``item.completed`` with ``command_execution``/``agent_message``/... items, usage on
  ``turn.completed``, no cost).
- ``openhands``: ``openhands --headless --json`` (``MessageEvent``/``ActionEvent``/
  ``ObservationEvent``/``AgentErrorEvent``/... objects with a ``kind``).

Each parsed :class:`StreamEvent` has a role, a kind (``message`` | ``tool_call`` |
``tool_result`` | ``usage`` | ``error``), capped content, and tool name/args or token counts.
:class:`StreamTotals` sums them: ``steps`` counts tool calls, tokens come from usage events
(the CLI's final totals when it reports them), ``cost_usd`` only when the CLI reports one, and
``exit_reason`` comes from the final result event (None when the stream has none). A line that
is not a JSON object never raises: it becomes an ``error`` event with ``parse_error`` set (for
OpenHands, which prints status lines between its JSON events, a line that does not start like
JSON is kept as a ``message`` from ``system`` instead).
"""

from __future__ import annotations

import base64
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
from typing import TYPE_CHECKING, Any, ClassVar

from saasbench.agents.base import Agent, Budget
from saasbench.redaction import redact_text

if TYPE_CHECKING:
    from saasbench.agents.base import Trajectory
    from saasbench.environments.local import Environment

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CONTENT_CAP = 4000  # characters of message/tool output kept per event
ARGS_CAP = 4000  # characters of each string tool argument kept
FORMATS = ("claude", "codex", "openhands")

__all__ = [
    "CONTENT_CAP",
    "FORMATS",
    "AgentInstallError",
    "CLIAgent",
    "StreamEvent",
    "StreamParser",
    "StreamTotals",
    "apply_events",
    "apply_totals",
    "cap",
    "make_parser",
    "parse_stream",
    "prompt_word",
    "put_file",
    "read_back",
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


def _cap_args(args: Any) -> Any:
    if isinstance(args, dict):
        return {str(k): _cap_args(v) for k, v in args.items()}
    if isinstance(args, list):
        return [_cap_args(v) for v in args[:100]]
    if isinstance(args, str):
        return cap(args, ARGS_CAP)
    return args


def _int(value: Any) -> int:
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
        except ValueError as exc:
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


# --- Claude Code ------------------------------------------------------------------------------------
class ClaudeParser(StreamParser):
    format = "claude"

    def __init__(self) -> None:
        super().__init__()
        self._tool_names: dict[str, str] = {}

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        typ = obj.get("type")
        if typ == "system":
            return []  # init (tools, model, cwd) and status lines: nothing the agent did
        if typ in ("assistant", "user"):
            msg = obj.get("message") or {}
            role = msg.get("role") or typ
            content = msg.get("content")
            out: list[StreamEvent] = []
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
            for block in blocks:
                if not isinstance(block, dict):
                    continue
                btype = block.get("type")
                if btype == "text" and block.get("text"):
                    out.append(StreamEvent("message", role, cap(block["text"]), raw_type=typ))
                elif btype == "thinking" and block.get("thinking"):
                    out.append(StreamEvent("message", role, cap(block["thinking"]), raw_type="thinking"))
                elif btype == "tool_use":
                    args = block.get("input")
                    self._tool_names[str(block.get("id"))] = str(block.get("name"))
                    out.append(
                        StreamEvent(
                            "tool_call",
                            "assistant",
                            cap(args),
                            tool=block.get("name"),
                            args=_cap_args(args),
                            call_id=block.get("id"),
                            raw_type=typ,
                        )
                    )
                elif btype == "tool_result":
                    res = block.get("content")
                    if isinstance(res, list):
                        res = "\n".join(str(p.get("text", "")) for p in res if isinstance(p, dict))
                    out.append(
                        StreamEvent(
                            "tool_result",
                            "tool",
                            cap(res),
                            call_id=block.get("tool_use_id"),
                            tool=self._tool_names.get(str(block.get("tool_use_id"))),
                            is_error=bool(block.get("is_error")),
                            raw_type=typ,
                        )
                    )
            usage = msg.get("usage") if typ == "assistant" else None
            if isinstance(usage, dict):
                out.append(
                    StreamEvent(
                        "usage",
                        "assistant",
                        tokens_in=_claude_in(usage),
                        tokens_out=_int(usage.get("output_tokens")),
                        raw_type="message_usage",
                    )
                )
            return out
        if typ == "result":
            self.totals.turns = _int(obj.get("num_turns"))
            usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
            cost = obj.get("total_cost_usd")
            cost = float(cost) if isinstance(cost, (int, float)) else None
            tin, tout = _claude_in(usage), _int(usage.get("output_tokens"))
            self._final_usage(tin, tout, cost)
            subtype = str(obj.get("subtype") or "")
            text = obj.get("result") if isinstance(obj.get("result"), str) else ""
            self.totals.final_text = text
            out = [
                StreamEvent(
                    "usage",
                    "system",
                    f"run totals: {tin} in, {tout} out",
                    tokens_in=tin,
                    tokens_out=tout,
                    cost_usd=cost,
                    raw_type="result",
                )
            ]
            if subtype == "success" and not obj.get("is_error"):
                self.totals.exit_reason, self.totals.error = "completed", None
            elif "max_turns" in subtype or "max_budget" in subtype:
                self.totals.exit_reason = "agent_budget_exceeded"
                self.totals.error = f"claude: {subtype} after {self.totals.turns} turns"
            else:
                self.totals.exit_reason = "agent_error"
                detail = (
                    text or "; ".join(str(e) for e in obj.get("errors") or []) or str(obj.get("api_error_status") or "")
                )
                self.totals.error = cap(f"claude: {subtype or 'error'}" + (f": {detail}" if detail else ""), 500)
                out.append(StreamEvent("error", "system", self.totals.error, is_error=True, raw_type="result"))
            return out
        return []  # stream_event partials, rate-limit notices, ...: not needed for the record


def _claude_in(usage: dict[str, Any]) -> int:
    return (
        _int(usage.get("input_tokens"))
        + _int(usage.get("cache_creation_input_tokens"))
        + _int(usage.get("cache_read_input_tokens"))
    )


# --- Codex CLI ----------------------------------------------------------------------------------------
class CodexParser(StreamParser):
    format = "codex"

    def __init__(self) -> None:
        super().__init__()
        self._started: set[str] = set()

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        typ = obj.get("type")
        if typ == "turn.started":
            self.totals.turns += 1
            return []
        if typ == "turn.completed":
            usage = obj.get("usage") or {}
            tin, tout = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
            self.totals.exit_reason, self.totals.error = "completed", None
            return [
                StreamEvent(
                    "usage", "system", f"turn: {tin} in, {tout} out", tokens_in=tin, tokens_out=tout, raw_type=typ
                )
            ]
        if typ == "turn.failed":
            err = obj.get("error") or {}
            msg = err.get("message") if isinstance(err, dict) else str(err)
            self.totals.exit_reason = "agent_error"
            self.totals.error = cap(f"codex: turn failed: {msg}", 500)
            return [StreamEvent("error", "system", self.totals.error, is_error=True, raw_type=typ)]
        if typ == "error":  # a stream-level error (reconnects, fatal API errors); turn.failed decides
            return [StreamEvent("error", "system", cap(obj.get("message")), is_error=True, raw_type=typ)]
        if typ in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item") or {}
            return self._item(typ, item)
        return []  # thread.started and future types

    def _item(self, typ: str, item: dict[str, Any]) -> list[StreamEvent]:
        itype, iid = item.get("type"), str(item.get("id") or "")
        if typ == "item.updated":
            return []
        if itype == "agent_message":
            text = item.get("text") or ""
            if typ == "item.completed":
                self.totals.final_text = text
                return [StreamEvent("message", "assistant", cap(text), raw_type=itype)]
            return []
        if itype == "reasoning":
            return (
                [StreamEvent("message", "assistant", cap(item.get("text")), raw_type=itype)]
                if typ == "item.completed"
                else []
            )
        if itype == "error":  # e.g. "Model metadata ... not found": a warning, not fatal
            return (
                [StreamEvent("error", "system", cap(item.get("message")), raw_type=itype)]
                if typ == "item.completed"
                else []
            )
        tool, args, result = _codex_tool(itype, item)
        if tool is None:
            return []
        out: list[StreamEvent] = []
        if iid not in self._started:  # item.started, or a completed item that never announced its start
            self._started.add(iid)
            out.append(
                StreamEvent(
                    "tool_call", "assistant", cap(args), tool=tool, args=_cap_args(args), call_id=iid, raw_type=itype
                )
            )
        if typ == "item.completed":
            status = item.get("status")
            code = item.get("exit_code")
            failed = status == "failed" or (isinstance(code, int) and code != 0)
            out.append(
                StreamEvent("tool_result", "tool", cap(result), tool=tool, call_id=iid, is_error=failed, raw_type=itype)
            )
        return out


def _codex_tool(itype: Any, item: dict[str, Any]) -> tuple[str | None, Any, Any]:
    if itype == "command_execution":
        out = item.get("aggregated_output") or ""
        code = item.get("exit_code")
        # tool "shell": the name the anti-cheat scanner (agents/anticheat.py) reads commands from
        return "shell", {"command": item.get("command")}, (f"exit {code}\n" if code is not None else "") + out
    if itype == "file_change":
        changes = item.get("changes") or []
        return "file_change", {"changes": changes}, item.get("status") or ""
    if itype == "mcp_tool_call":
        return (
            f"mcp:{item.get('server')}/{item.get('tool')}",
            item.get("arguments"),
            item.get("result") or item.get("error"),
        )
    if itype == "web_search":
        return "web_search", {"query": item.get("query")}, ""
    if itype == "todo_list":
        return "todo_list", {"items": item.get("items")}, ""
    return None, None, None


# --- OpenHands -------------------------------------------------------------------------------------
class OpenHandsParser(StreamParser):
    format = "openhands"
    plain_text_ok = True  # `openhands --headless --json` also prints status lines and a summary box on stdout

    def handle(self, obj: dict[str, Any]) -> list[StreamEvent]:
        kind = obj.get("kind")
        source = str(obj.get("source") or "")
        out: list[StreamEvent] = []
        if kind == "MessageEvent":
            msg = obj.get("llm_message") or {}
            text = _oh_text(msg.get("content"))
            role = msg.get("role") or source
            if text:
                out.append(
                    StreamEvent("message", "assistant" if role == "assistant" else role, cap(text), raw_type=kind)
                )
            if role == "assistant":
                self.totals.turns += 1
                self.totals.final_text = text
                self.totals.exit_reason, self.totals.error = "completed", None
        elif kind == "ActionEvent":
            self.totals.turns += 1
            call = obj.get("tool_call") or {}
            args: Any = call.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            if args is None:
                args = {k: v for k, v in (obj.get("action") or {}).items() if k != "kind"}
            tool = obj.get("tool_name") or call.get("name")
            thought = _oh_text(obj.get("thought"))
            if thought:
                out.append(StreamEvent("message", "assistant", cap(thought), raw_type="thought"))
            out.append(
                StreamEvent(
                    "tool_call",
                    "assistant",
                    cap(args),
                    tool=tool,
                    args=_cap_args(args),
                    call_id=obj.get("tool_call_id"),
                    raw_type=kind,
                )
            )
            if tool == "finish":
                self.totals.exit_reason, self.totals.error = "completed", None
                self.totals.final_text = str((obj.get("action") or {}).get("message") or "")
        elif kind == "ObservationEvent":
            obs = obj.get("observation") or {}
            text = _oh_text(obs.get("content"))
            code = obs.get("exit_code")
            failed = bool(obs.get("is_error")) or (isinstance(code, int) and code not in (0, -1))
            out.append(
                StreamEvent(
                    "tool_result",
                    "tool",
                    cap((f"exit {code}\n" if code is not None else "") + text),
                    tool=obj.get("tool_name"),
                    call_id=obj.get("tool_call_id"),
                    is_error=failed,
                    raw_type=kind,
                )
            )
        elif kind in ("AgentErrorEvent", "ConversationErrorEvent"):
            msg = str(obj.get("error") or obj.get("detail") or obj.get("message") or kind)
            out.append(
                StreamEvent("error", "system", cap(msg), tool=obj.get("tool_name"), is_error=True, raw_type=kind)
            )
            if kind == "ConversationErrorEvent" or not obj.get("tool_call_id"):
                self.totals.exit_reason = _oh_error_reason(msg)
                self.totals.error = cap(f"openhands: {msg}", 500)
        elif kind == "ConversationStateUpdateEvent":
            key, value = obj.get("key"), obj.get("value")
            if key == "execution_status" and isinstance(value, str):
                status = value.lower()
                if status == "finished":
                    self.totals.exit_reason, self.totals.error = "completed", None
                elif status in ("error", "stuck"):
                    self.totals.exit_reason = "agent_error"
                    self.totals.error = f"openhands: execution status {status}"
        metrics = _find_metrics(obj)
        if metrics is not None:
            tin, tout, cost = metrics
            self._final_usage(tin, tout, cost)  # accumulated values: the latest one is the total
            out.append(
                StreamEvent(
                    "usage",
                    "system",
                    f"accumulated: {tin} in, {tout} out",
                    tokens_in=tin,
                    tokens_out=tout,
                    cost_usd=cost,
                    raw_type="metrics",
                )
            )
            self._usage_final = True
        return out


def _oh_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content).strip()
    return ""


def _oh_error_reason(msg: str) -> str:
    low = msg.lower()
    if "maximum iteration" in low or "max_iterations" in low or "budget" in low:
        return "agent_budget_exceeded"
    return "agent_error"


def _find_metrics(obj: Any, depth: int = 0) -> tuple[int, int, float | None] | None:
    """OpenHands accumulated metrics ({accumulated_cost, accumulated_token_usage}) anywhere in an event."""
    if depth > 4:
        return None
    if isinstance(obj, dict):
        usage = obj.get("accumulated_token_usage")
        if isinstance(usage, dict):
            cost = obj.get("accumulated_cost")
            return (
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
                float(cost) if isinstance(cost, (int, float)) else None,
            )
        for value in obj.values():
            if isinstance(value, (dict, list)):
                found = _find_metrics(value, depth + 1)
                if found is not None:
                    return found
    elif isinstance(obj, list):
        for value in obj[:50]:
            found = _find_metrics(value, depth + 1)
            if found is not None:
                return found
    return None


_PARSERS: dict[str, type[StreamParser]] = {"claude": ClaudeParser, "codex": CodexParser, "openhands": OpenHandsParser}


def make_parser(fmt: str) -> StreamParser:
    try:
        return _PARSERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown stream format {fmt!r} (known: {', '.join(FORMATS)})") from None


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
    """The agent CLI could not be installed in the environment."""


def prompt_word(prompt_file: str) -> str:
    """The shell word that expands to the prompt file's contents (the prompt after ``--``)."""
    return f'"$(cat {shlex.quote(prompt_file)})"'


def to_shell(argv: list[str]) -> str:
    """``argv`` as one shell command; the prompt word (:func:`prompt_word`) stays unquoted."""
    return " ".join(a if a.startswith('"$(cat ') else shlex.quote(a) for a in argv)


class CLIAgent(Agent):
    """A coding-agent CLI run once inside the environment, its JSON-lines stdout parsed into the trajectory.

    Subclasses give ``stream_format``, :meth:`command`, :meth:`install_command`,
    :meth:`process_env` (gateway URL and key: only the agent process gets them) and optionally
    :meth:`prepare` (config files in the run folder). Keyword arguments: ``model``,
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
        cmd = self.install_command()
        res = env.exec(cmd, timeout_s=self.install_timeout_s)
        if not res.ok:
            why = "timed out" if res.timed_out else f"exited {res.exit_code}"
            tail = "\n".join((res.stderr.strip() or res.stdout.strip()).splitlines()[-15:])
            raise AgentInstallError(f"{self.name}: `{cmd}` {why} after at most {self.install_timeout_s:g}s\n{tail}")
        check = self.version_command()
        if check:
            res = env.exec(self._with_path(check), timeout_s=120)
            if not res.ok:
                raise AgentInstallError(f"{self.name}: installed, but `{check}` failed: {res.stderr.strip()[-500:]}")

    # --- run -------------------------------------------------------------------------------------------
    def _with_path(self, cmd: str) -> str:
        return f'PATH={shlex.quote(self.bin_dir)}:"$PATH" {cmd}' if self.bin_dir else cmd

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
        local = env.kind == "local"
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

    package: str
    package_version: str
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
    if env.kind == "local":
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
