"""What every CLI module shares: exit codes, the consoles, and the one error line."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

EXIT_NOT_VALID = 1  # the command ran and found a problem (a DAG with errors, a failed check)
EXIT_CANNOT_RUN = 2  # the command could not do its job (bad arguments, missing input)


def console() -> Console:
    return Console(highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    """Print a one-line error to stderr; ``raise fail(...)`` ends the command with ``code``."""
    err_console().print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)
