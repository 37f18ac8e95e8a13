"""What every CLI module shares: exit codes, the consoles, the one error line, and small formatters."""

from __future__ import annotations

import datetime as _dt
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from saasbench import settings

EXIT_NOT_VALID = 1  # the command ran and found a problem (a DAG with errors, a failed check)
EXIT_CANNOT_RUN = 2  # the command could not do its job (bad arguments, missing input)

LAKE_ENV = "SAASBENCH_LAKE"

LakeOption = Annotated[
    Optional[str],
    typer.Option(
        "--lake",
        envvar=LAKE_ENV,
        help=f"Lake root: folder, file:///..., s3://bucket/prefix (default ${LAKE_ENV} or {settings.DEFAULT_LAKE})",
    ),
]


class Compat(str, Enum):
    """``--compat`` of ``dag plan`` and ``evaluate``."""

    strict = "strict"
    reference = "reference"


def console() -> Console:
    return Console(highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    """Print a one-line error to stderr; ``raise fail(...)`` ends the command with ``code``."""
    err_console().print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


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
