"""``saasbench rescore``: score a past sweep again from its frozen end states (saasbench.runs.rescore)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import LakeOption
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail
from saasbench.cli.sweep import JudgeApiBase, JudgeKeyEnv, JudgeModel


def rescore_cmd(
    sweep: Annotated[str, typer.Argument(help="The sweep to rescore (its trials need frozen end states)")],
    dag: Annotated[
        Path | None, typer.Option("--dag", help="A DAG file to score with instead of each task's own (e.g. a fix)")
    ] = None,
    judge_model: JudgeModel = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key_env: JudgeKeyEnv = None,
    new_sweep_id: Annotated[
        str | None, typer.Option("--sweep-id", help="Id of the new sweep (default <sweep>-rescore-<time>)")
    ] = None,
    judge_only: Annotated[
        bool,
        typer.Option(
            "--judge-only", help="Re-judge the stored evidence of the deferred llm-judge nodes; start no environment"
        ),
    ] = False,
    lake: LakeOption = None,
) -> None:
    """Restore each trial's frozen end state, evaluate and judge it again, and write a new sweep linked
    to the original (parent sweep, DAG hash, judge model, harness version). The agents never run.

    Examples: saasbench rescore s1 --dag fixed-dag.json; saasbench rescore s1 --judge-only --judge-model openai/gpt-4o
    """
    from saasbench.cli.sweep import _judge_and_gateway
    from saasbench.runs.rescore import RescoreError, rescore

    if dag is not None and judge_only:
        raise _fail("--dag changes what is evaluated: it cannot go with --judge-only")
    judge = _judge_and_gateway(judge_model, judge_api_base, judge_api_key_env, None).get("judge")
    console = _console()
    try:
        result = rescore(
            sweep,
            lake=lake,
            dag=dag,
            judge=judge,
            sweep_id=new_sweep_id,
            judge_only=judge_only,
            say=lambda m: console.print(escape(m)),
        )
    except (RescoreError, ValueError) as exc:
        raise _fail(str(exc)) from None
    table = Table(title=f"Rescore of {sweep} -> {result.sweep_id}", show_edge=False)
    table.add_column("trial")
    table.add_column("outcome")
    for tid, outcome in sorted(result.outcomes.items()):
        table.add_row(tid, outcome + (f" ({result.failed[tid]})" if tid in result.failed else ""))
    for tid, why in sorted(result.skipped.items()):
        table.add_row(tid, f"skipped: {why}")
    console.print(table)
    console.print(f"Compare: saasbench compare {sweep} {result.sweep_id}" + (f" --lake {lake}" if lake else ""))
    if not result.outcomes:
        raise _fail(f"nothing rescored: no trial of {sweep} has a frozen end state")
