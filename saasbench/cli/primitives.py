"""``saasbench primitives list``: the validation primitives of this build."""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import console as _console

primitives_app = typer.Typer(
    help="The validation primitives of this build.\n\nExample: saasbench primitives list", no_args_is_help=True
)


def _input_fields(spec) -> list[dict[str, Any]]:
    if spec.inputs is None:
        return []
    out = []
    for name, f in spec.inputs.model_fields.items():
        annotation = getattr(f.annotation, "__name__", None) or str(f.annotation).replace("typing.", "")
        out.append(
            {
                "name": name,
                "type": annotation,
                "required": f.is_required(),
                "default": None if f.is_required() else repr(f.get_default(call_default_factory=True)),
                "description": f.description or "",
            }
        )
    return out


@primitives_app.command("list")
def primitives_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print codes, statuses and input fields as JSON")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also describe every input field")] = False,
) -> None:
    """List every primitive code with its group, status (available/pending/reserved) and inputs.

    Example: saasbench primitives list --verbose
    """
    from saasbench.primitives.registry import REGISTRY

    specs = REGISTRY.all()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "code": s.code,
                        "name": s.name,
                        "group": s.group,
                        "status": s.status,
                        "description": s.description,
                        "inputs": _input_fields(s),
                    }
                    for s in specs
                ],
                indent=2,
            )
        )
        return
    colour = {"available": "green", "pending": "yellow", "reserved": "dim"}
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("code", no_wrap=True)
    table.add_column("group", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("name, description and inputs", overflow="fold", ratio=1)
    for s in specs:
        fields = _input_fields(s)
        if verbose:
            inputs = "".join(f"\n  {f['name']}{'*' if f['required'] else ''}: {f['description']}" for f in fields)
        else:
            inputs = " " + ", ".join(f["name"] + ("*" if f["required"] else "") for f in fields) if fields else ""
        text = f"[bold]{escape(s.name)}[/]: {escape(s.description)}"
        if fields:
            text += f"\n[dim]inputs:[/]{escape(inputs)}"
        table.add_row(s.code, s.group, f"[{colour.get(s.status, 'white')}]{s.status}[/]", text)
    console = _console()
    console.print(table)
    by_status = Counter(s.status for s in specs)
    console.print(", ".join(f"{v} {k}" for k, v in sorted(by_status.items())) + "   (* = required input)")
