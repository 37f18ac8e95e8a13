"""``saasbench agents list``: the registered agent adapters."""

from __future__ import annotations

import typer
from rich.table import Table

from saasbench.cli.common import console as _console

agents_app = typer.Typer(help="Agent adapters.\n\nExample: saasbench agents list", no_args_is_help=True)


@agents_app.command("list")
def agents_list() -> None:
    """List the registered agents (name, version, description); custom ones load by module:Class.

    Example: saasbench agents list
    """
    from saasbench.agents.base import list_agents

    table = Table(show_edge=False)
    for col in ("agent", "version", "description"):
        table.add_column(col)
    for name, cls in sorted(list_agents().items()):
        doc = (cls.__doc__ or "").strip().splitlines()
        table.add_row(name, str(getattr(cls, "version", "")), doc[0] if doc else "")
    _console().print(table)
