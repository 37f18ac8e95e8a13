"""The ``saasbench`` command line (typer + rich): the app, and where every command is registered.

Each noun has its own module in ``saasbench/cli/`` (``dag.py``, ``evaluate.py``, ``results.py``,
...); this one only builds the app and registers their commands and groups. Those modules import
only typer, rich and ``saasbench.cli.common`` at load; everything heavy (the DAG loader, the
engine, httpx, the primitives) is imported inside the command that needs it, so ``saasbench
--help`` answers at once.

Exit codes: 0 the command did its job (an evaluation that ran exits 0 whatever the score);
1 ``dag check``/``dag plan`` found errors in a DAG; 2 the command could not run (bad DAG,
unreadable auth profile, missing workspace, bad option); 3 ``evaluate --require-up`` found
the app down.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from saasbench.cli.agents import agents_app
from saasbench.cli.common import fail, set_debug, user_error
from saasbench.cli.dag import dag_app
from saasbench.cli.demo import demo
from saasbench.cli.env import env_app
from saasbench.cli.evaluate import evaluate
from saasbench.cli.lake import lake_app
from saasbench.cli.primitives import primitives_app
from saasbench.cli.rescore import rescore_cmd
from saasbench.cli.results import compare_cmd, query, report_cmd
from saasbench.cli.rollout import rollout_cmd
from saasbench.cli.sweep import run_cmd, sweep_cmd
from saasbench.cli.tasks import tasks_app, validate_reference_cmd
from saasbench.cli.version import version


class _App(TyperGroup):
    """The top-level group: an error a user can fix that no command caught (an unreadable input file, a lake
    store that does not answer, the embedded Prefect server not starting) ends the command with one line and
    exit 2 (:func:`saasbench.cli.common.user_error`); ``--debug`` shows its traceback instead."""

    def invoke(self, ctx: Any) -> Any:  # a click Context (typer's vendored click)
        try:
            return super().invoke(ctx)
        except Exception as exc:
            message = None if ctx.params.get("debug") else user_error(exc)
            if message is None:
                raise
            raise fail(message + " (--debug shows the traceback)") from None


app = typer.Typer(
    cls=_App,
    name="saasbench",
    help="Run the SaaSBench benchmark: check validation DAGs and score a running SaaS app with them.\n\n"
    "Example: saasbench demo",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback behind an error (put it before the command)")
    ] = False,
) -> None:
    set_debug(debug)


# `saasbench --help` lists the commands, then the groups, each in the order registered here.
app.command("query")(query)
app.command("report")(report_cmd)
app.command("run")(run_cmd)
app.command("rollout")(rollout_cmd)
app.command("sweep")(sweep_cmd)
app.command("compare")(compare_cmd)
app.command("rescore")(rescore_cmd)
app.command("validate-reference")(validate_reference_cmd)
app.command("evaluate")(evaluate)
app.command("demo")(demo)
app.command("version")(version)

app.add_typer(dag_app, name="dag")
app.add_typer(primitives_app, name="primitives")
app.add_typer(agents_app, name="agents")
app.add_typer(tasks_app, name="tasks")
app.add_typer(lake_app, name="lake")
app.add_typer(env_app, name="env")


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
