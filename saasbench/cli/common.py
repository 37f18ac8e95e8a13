"""What every CLI module shares: exit codes, the consoles, the one error line, and small formatters."""

from __future__ import annotations

import datetime as _dt
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from saasbench import settings

EXIT_NOT_VALID = 1  # the command ran and found a problem (a DAG with errors, a failed check)
EXIT_CANNOT_RUN = 2  # the command could not do its job (bad arguments, missing input)

LAKE_ENV = "SAASBENCH_LAKE"
ENDPOINT_ENV = "SAASBENCH_S3_ENDPOINT"

LakeOption = Annotated[
    Optional[str],
    typer.Option(
        "--lake",
        envvar=LAKE_ENV,
        help=f"Lake root: folder, file:///..., s3://bucket/prefix (default ${LAKE_ENV} or {settings.DEFAULT_LAKE})",
    ),
]


# --- the LLM judge's options, the same on evaluate, run, sweep and rescore (JudgeConfig fields) ------------
JudgeModel = Annotated[
    Optional[str],
    typer.Option(
        "--judge-model", help="litellm model of the LLM judge for llm-judge nodes (without one they are SKIPPED_LLM)"
    ),
]
JudgeApiBase = Annotated[
    Optional[str],
    typer.Option("--judge-api-base", help="OpenAI-compatible base URL of the judge (a gateway or local server)"),
]
JudgeKeyEnv = Annotated[
    Optional[str], typer.Option("--judge-api-key-env", help="NAME of the environment variable holding the judge's key")
]
JudgeMaxTokens = Annotated[
    Optional[int], typer.Option("--judge-max-tokens", min=1, help="Most tokens of one judge reply (default 1024)")
]
JudgeTemperature = Annotated[
    Optional[float], typer.Option("--judge-temperature", help="Sampling temperature of the judge, 0-2 (default 0)")
]
JudgeTimeout = Annotated[
    Optional[float], typer.Option("--judge-timeout", help="Seconds one judge call may take (default 120)")
]
JudgeVotes = Annotated[
    Optional[int],
    typer.Option("--judge-votes", min=1, help="k independent judge calls per node; median score, spread recorded"),
]


def judge_tuning(
    max_tokens: int | None = None,
    temperature: float | None = None,
    timeout: float | None = None,
    votes: int | None = None,
) -> dict[str, Any]:
    """The JudgeConfig fields the --judge-max-tokens/-temperature/-timeout/-votes options set (those given)."""
    given = {"max_tokens": max_tokens, "temperature": temperature, "timeout_s": timeout, "votes": votes}
    return {k: v for k, v in given.items() if v is not None}


def judge_options_error(tuning: dict[str, Any]) -> str:
    """The message for tuning options given with no judge to apply them to."""
    names = {"max_tokens": "--judge-max-tokens", "temperature": "--judge-temperature", "timeout_s": "--judge-timeout"}
    return "/".join(names.get(k, "--judge-votes") for k in tuning) + " need a judge: pass --judge-model"


class Compat(str, Enum):
    """``--compat`` of ``dag plan`` and ``evaluate``."""

    strict = "strict"
    reference = "reference"


def console() -> Console:
    return Console(highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


_debug = False  # the global --debug flag (set by the app's callback on every invocation)


def set_debug(on: bool) -> None:
    global _debug
    _debug = on


def debug_enabled() -> bool:
    return _debug


def fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    """Print a one-line error to stderr; ``raise fail(...)`` ends the command with ``code``.

    One line whatever the terminal width (the terminal wraps it, rich does not). With ``--debug``
    the traceback of the exception being handled, if any, is printed first."""
    err = err_console()
    if _debug and sys.exc_info()[1] is not None:
        err.print_exception()
    err.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", soft_wrap=True)
    return typer.Exit(code)


_PREFECT_START_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"


def _is(exc: BaseException, module: str, name: str) -> bool:
    """``isinstance(exc, module.name)`` without importing ``module`` (not loaded: it raised nothing)."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def user_error(exc: BaseException) -> str | None:
    """The one-line message (with its fix) of an error a user can fix that reached the top of a command
    uncaught, or None for anything else (a bug: its traceback is shown)."""
    if (
        _is(exc, "saasbench.inputs", "InputError")
        or _is(exc, "saasbench.catalog.tasks", "TaskError")
        or _is(exc, "saasbench.settings", "SettingError")
    ):
        return str(exc)
    if _is(exc, "saasbench.lake.store", "LakeStoreError"):
        return (
            f"{exc} (is the store up? for s3:// lakes check {ENDPOINT_ENV}, the AWS credentials and the bucket; "
            "--lake runs/lake uses a local folder)"
        )
    if isinstance(exc, RuntimeError) and str(exc).startswith(_PREFECT_START_TIMEOUT):
        from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as timeout

        return (
            f"the embedded Prefect server did not start within {timeout.value()} s: raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (e.g. =90), point PREFECT_API_URL at a running server, "
            "or run without Prefect (--no-prefect)"
        )
    return None


def fmt_num(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:g}{suffix}" if float(value).is_integer() else f"{value:.2f}{suffix}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def timestamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def fresh_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... when it already exists (two runs in one second)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def require_extra(module: str, extra: str, what: str) -> None:
    """Exit 2 with the install command when ``module`` (of the optional extra ``extra``) is missing:
    the base install runs every command, and a feature that needs more says what to install."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise fail(f"{what} needs the '{extra}' extra: pip install 'saasbench[{extra}]' (or -e '.[{extra}]')")
