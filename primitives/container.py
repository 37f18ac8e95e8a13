"""Container primitives P12 (container_exec) and P21 (log_content_check).

Both act through an exec target (``ctx.target.exec_target``, ``saasbench evaluate --exec
local:DIR|docker:CONTAINER``, see :mod:`saasbench.environments.exec_target`) or else the trial's Environment
backend (``ctx.target.environment``, see :mod:`saasbench.environments.base`): P12 runs a shell command
where the app runs (the app container, the local workspace, or the --exec target), P21 reads a
log. Every command gets ``ctx.target.exec_env``. With neither, the step raises
:class:`~saasbench.environments.exec_target.NoExecTarget` and the node is ERROR with a message naming ``--exec``.

Limits: each output stream is capped at 1 MiB by the environment (the evidence keeps the last
2,000 characters of each); the command's timeout is bounded by the node deadline; P21 reads log
files of at most 100 MiB from the workspace (an absolute path outside it fails the step).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from saasbench.dag import note
from saasbench.dag.placeholders import UnresolvedPlaceholder
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive, rename_aliases
from saasbench.services import saferegex

EVIDENCE_CHARS = 2000
LOG_CAPTURE_CHARS = 20000  # of a log P21 read, kept as {{last_container_logs}}


def _environment(ctx: RunContext, code: str) -> Any:
    """The exec target or environment; raises NoExecTarget (node ERROR) when there is neither."""
    from saasbench.environments.exec_target import exec_target_of

    return exec_target_of(ctx, code)


def command_env(ctx: RunContext, command: str = "") -> dict[str, str]:
    """What a P12 command's ``${VAR}`` sees: ``meta.env_defaults``, then run variables (``--var``)
    the command names as ``${VAR}``, then the exec variables (``--exec-env``, task ``exec_env``)."""
    from saasbench.dag.placeholders import SHELL

    named = {m.group(1) for m in SHELL.finditer(command)}
    run_vars = {k: str(v) for k, v in ctx.vars.items() if k in named and isinstance(v, (str, int, float))}
    return {**{k: str(v) for k, v in ctx.env_defaults.items()}, **run_vars, **(ctx.target.exec_env or {})}


def _tail_chars(text: str, n: int = EVIDENCE_CHARS) -> str:
    return text if len(text) <= n else "..." + text[-n:]


MatchType = Literal["contains", "regex", "icontains"]
_MATCH_ALIASES = {
    "substring": "contains",
    "string": "contains",
    "literal": "contains",
    "exact": "contains",
    "regexp": "regex",
    "re": "regex",
    "pattern": "regex",
    "contains_ci": "icontains",
    "case_insensitive": "icontains",
}


def _normalise_match_type(data: dict[str, Any]) -> None:
    mtype = data.get("match_type")
    if isinstance(mtype, str) and mtype.strip().lower() in _MATCH_ALIASES:
        data["match_type"] = _MATCH_ALIASES[mtype.strip().lower()]
        note(f"match_type {mtype!r} -> {data['match_type']!r}")


def _find(text: str, pattern: str, match_type: str, what: str = "the log") -> bool:
    if match_type == "regex":  # app text, DAG pattern: bounded by the node deadline (RegexTimeout)
        return saferegex.search(pattern, text, re.MULTILINE, what=what) is not None
    if match_type == "icontains":
        return pattern.casefold() in text.casefold()
    return pattern in text


# --- P12 ---------------------------------------------------------------------------------------------
class P12Inputs(PrimitiveInputs):
    command: str = Field(
        min_length=1, description="Shell command, run with bash -c in the workspace of the app's environment"
    )
    container: str | None = Field(
        default=None, description="Container name in the public harness; recorded, ignored by the local backend"
    )
    expect_exit_code: int | None = Field(
        default=None, description="Exit code that passes (default 0 unless expect_success is false)"
    )
    expect_success: bool | None = Field(
        default=None, description="true: exit code 0 passes; false: any non-zero exit code passes"
    )
    expect_output_contains: str | list[str] | None = Field(
        default=None, description="Case-sensitive substring(s) that stdout+stderr must all contain"
    )
    expect_output_regex: str | None = Field(
        default=None, description="Python regex searched (MULTILINE) in stdout+stderr"
    )
    capture_stdout_as: str | None = Field(
        default=None, description="Capture the last non-empty stdout line as {{name}}"
    )
    timeout: float = Field(default=120.0, gt=0, description="Seconds; bounded by the node deadline")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "command", ("cmd", "script", "shell"))
        rename_aliases(data, "container", ("container_name", "service"))
        rename_aliases(data, "expect_exit_code", ("expected_exit_code", "exit_code"))
        rename_aliases(
            data,
            "expect_output_contains",
            ("expected_output", "expect_output", "output_contains", "expect_stdout_contains"),
        )
        rename_aliases(data, "expect_output_regex", ("expect_output_match_regex",))  # orghjavi
        if "timeout_s" in data and "timeout" not in data:
            data["timeout"] = data.pop("timeout_s")
            note("'timeout_s' -> 'timeout'")
        return data


@primitive("P12", P12Inputs, raw_fields={"command"})
def container_exec(inputs: P12Inputs, ctx: RunContext) -> StepResult:
    """Run a command in the app's environment; pass on the expected exit code and output."""
    env = _environment(ctx, "P12")
    timeout = ctx.timeout(inputs.timeout)
    try:  # {{...}} spliced shell-quoted; ${VAR:-default} is the shell's, as in the reference harness
        command = ctx.resolve_command(inputs.command)
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, message=str(exc), evidence={"placeholder": exc.placeholder})
    result = env.exec(command, timeout_s=timeout, env=command_env(ctx, command) or None)
    output = result.stdout + ("\n" if result.stdout and result.stderr else "") + result.stderr
    evidence: dict[str, Any] = {
        "command": command,
        "container": inputs.container,
        "backend": env.kind,  # an exec target's or an environment's label
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "timeout_s": round(timeout, 3),
        "stdout": _tail_chars(result.stdout),
        "stderr": _tail_chars(result.stderr),
    }
    value: dict[str, Any] = {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "output": output,
    }
    last_line = next((ln.strip() for ln in reversed(result.stdout.splitlines()) if ln.strip()), "")
    if re.fullmatch(r"-?\d{1,18}", last_line):
        value["output_int"] = int(last_line)  # `... | wc -l` style commands, asserted as $.output_int
    ctx.last_document = value  # what a following P07 reads (mjobbzsi asserts on it), never a stale response

    problems: list[str] = []
    if result.timed_out:
        problems.append(f"timed out after {timeout:g}s")
    elif inputs.expect_exit_code is not None:
        if result.exit_code != inputs.expect_exit_code:
            problems.append(f"exit code {result.exit_code}, expected {inputs.expect_exit_code}")
    elif inputs.expect_success is False:
        if result.exit_code == 0:
            problems.append("exit code 0, expected a failure (expect_success: false)")
    elif result.exit_code != 0:
        problems.append(f"exit code {result.exit_code}, expected 0")
    wanted = inputs.expect_output_contains
    for needle in [wanted] if isinstance(wanted, str) else (wanted or []):
        if needle not in output:
            problems.append(f"output does not contain {needle!r}")
    if inputs.expect_output_regex is not None:
        try:
            if saferegex.search(inputs.expect_output_regex, output, re.MULTILINE, what="the command's output") is None:
                problems.append(f"output does not match /{inputs.expect_output_regex}/")
        except re.error as exc:
            problems.append(f"invalid expect_output_regex: {exc}")
    if inputs.capture_stdout_as:
        lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
        if lines:
            ctx.capture(inputs.capture_stdout_as, lines[-1].strip())
            evidence["captured"] = {inputs.capture_stdout_as: lines[-1].strip()}
        else:
            problems.append(f"capture_stdout_as {inputs.capture_stdout_as!r}: stdout is empty")
    if problems:
        last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] if not result.timed_out else []
        hint = f" (last output line: {last[0][:200]!r})" if last else ""
        return StepResult(passed=False, message="; ".join(problems) + hint, value=value, evidence=evidence)
    return StepResult(passed=True, message=f"exit code {result.exit_code}", value=value, evidence=evidence)


# --- P21 ---------------------------------------------------------------------------------------------
class P21Inputs(PrimitiveInputs):
    log_path: str = Field(
        default="log/production.log",
        description="A log file relative to the workspace, or the name of a service the environment started (e.g. 'app')",
    )
    pattern: str = Field(
        description="Text to find (contains/icontains) or a Python regex (regex); empty: only read "
        "the log (evidence for a judge) and pass when it could be read"
    )
    match_type: MatchType = Field(
        default="contains", description="contains (case-sensitive), icontains, or regex (MULTILINE)"
    )
    tail_lines: int = Field(default=200, ge=1, description="Search only the last N lines")
    expect_match: bool = Field(default=True, description="false: pass when the pattern is absent")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "log_path", ("path", "log_file", "file", "service"))
        rename_aliases(data, "tail_lines", ("tail", "lines"))
        for key in ("contains", "regex"):
            if key in data and "pattern" not in data:
                data["pattern"] = data.pop(key)
                data.setdefault("match_type", "regex" if key == "regex" else "contains")
                note(f"'{key}' -> 'pattern'")
        if data.get("pattern") == "":
            # xayqujrv: {"pattern": "", "tail_lines": 200} before a P17 that judges the logs; its reference
            # tails the log, keeps it for the judge and passes ("no pattern")
            note("empty 'pattern': the step only reads the log (kept as {{last_container_logs}} for a judge)")
        _normalise_match_type(data)
        return data


def log_content_check(inputs: P21Inputs, ctx: RunContext) -> StepResult:
    """The last lines of a log (workspace file or service log) contain (or do not contain) a pattern.

    P21 is registered once, in primitives/websocket.py, whose inputs extend these with the
    WebSocket dialect (``url``); without a ``url`` it calls this function.
    """
    from saasbench.environments.exec_target import ExecTarget

    env = _environment(ctx, "P21")
    source = "file"
    text: str | None = None
    try:
        text = env.logs(inputs.log_path, inputs.tail_lines)
        source = "service"
    except KeyError:
        pass
    if text is None and isinstance(env, ExecTarget):  # no workspace files: tail where its commands run
        from saasbench.environments.base import EnvError

        source = "exec"
        try:
            text = env.tail_file(
                inputs.log_path, inputs.tail_lines, env=ctx.target.exec_env or None, timeout_s=ctx.timeout(30.0)
            )
        except FileNotFoundError:
            return StepResult(
                passed=False,
                message=f"log {inputs.log_path!r} not found where the exec target runs commands",
                evidence={"log_path": inputs.log_path, "source": source},
            )
        except (EnvError, OSError) as exc:
            return StepResult(
                passed=False,
                message=f"cannot read log {inputs.log_path!r}: {exc}",
                evidence={"log_path": inputs.log_path, "source": source},
            )
    if text is None:
        from saasbench.environments.base import EnvError, PathEscape

        try:
            raw = env.read_file(inputs.log_path)
        except FileNotFoundError:
            return StepResult(
                passed=False,
                message=f"log {inputs.log_path!r} not found (no such workspace file or service)",
                evidence={"log_path": inputs.log_path},
            )
        except (PathEscape, EnvError, IsADirectoryError, OSError) as exc:
            return StepResult(
                passed=False,
                message=f"cannot read log {inputs.log_path!r}: {exc}",
                evidence={"log_path": inputs.log_path},
            )
        text = "\n".join(raw.decode("utf-8", errors="replace").splitlines()[-inputs.tail_lines :])
    ctx.capture("last_container_logs", text[-LOG_CAPTURE_CHARS:])  # what a judge of the logs reads
    if inputs.pattern == "":
        lines = len(text.splitlines())
        return StepResult(
            passed=True,
            message=f"read {lines} line(s) of {inputs.log_path} (no pattern: nothing checked)",
            value={"found": None, "lines": lines},
            evidence={
                "log_path": inputs.log_path,
                "source": source,
                "tail_lines": inputs.tail_lines,
                "excerpt": _tail_chars(text, 1000),
            },
        )
    if inputs.match_type == "regex":
        try:
            saferegex.validate(inputs.pattern)
        except re.error as exc:
            return StepResult(passed=False, message=f"invalid regex {inputs.pattern!r}: {exc}")
    found = bool(_find(text, inputs.pattern, inputs.match_type, f"log {inputs.log_path}"))
    evidence = {
        "log_path": inputs.log_path,
        "source": source,
        "pattern": inputs.pattern,
        "match_type": inputs.match_type,
        "tail_lines": inputs.tail_lines,
        "found": found,
        "excerpt": _tail_chars(text, 1000),
    }
    passed = found == inputs.expect_match
    if passed:
        msg = f"{inputs.pattern!r} {'found' if found else 'absent'} in the last {inputs.tail_lines} lines of {inputs.log_path}"
    elif found:
        msg = f"{inputs.pattern!r} found in {inputs.log_path}, expected absent"
    else:
        msg = f"{inputs.pattern!r} not found in the last {inputs.tail_lines} lines of {inputs.log_path}"
    return StepResult(passed=passed, message=msg, value={"found": found}, evidence=evidence)
