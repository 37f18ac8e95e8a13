"""``saasbench rescore``: score a past sweep again from its frozen end states (saasbench.runs.rescore)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from saasbench.cli.common import (
    JudgeApiBase,
    JudgeKeyEnv,
    JudgeMaxTokens,
    JudgeModel,
    JudgeTemperature,
    JudgeTimeout,
    JudgeVotes,
    LakeOption,
    judge_tuning,
)
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail


def rescore_cmd(
    sweep: Annotated[str, typer.Argument(help="The sweep to rescore (its trials need frozen end states)")],
    dag: Annotated[
        Path | None, typer.Option("--dag", help="A DAG file to score with instead of each task's own (e.g. a fix)")
    ] = None,
    judge_model: JudgeModel = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key_env: JudgeKeyEnv = None,
    judge_max_tokens: JudgeMaxTokens = None,
    judge_temperature: JudgeTemperature = None,
    judge_timeout: JudgeTimeout = None,
    judge_votes: JudgeVotes = None,
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
    Without --judge-model the parent's judge is used; --judge-max-tokens/-temperature/-timeout/-votes
    then change only those settings of it.

    Examples: saasbench rescore s1 --dag fixed-dag.json; saasbench rescore s1 --judge-only --judge-model openai/gpt-4o
    """
    from saasbench.cli.sweep import _judge_and_gateway
    from saasbench.runs.rescore import RescoreError, rescore

    if dag is not None and judge_only:
        raise _fail("--dag changes what is evaluated: it cannot go with --judge-only")
    tuning = judge_tuning(judge_max_tokens, judge_temperature, judge_timeout, judge_votes)
    judge = _judge_and_gateway(judge_model, judge_api_base, judge_api_key_env, None, tuning if judge_model else None)
    console = _console()
    try:
        result = rescore(
            sweep,
            lake=lake,
            dag=dag,
            judge=judge.get("judge"),
            judge_settings=None if judge_model else tuning,
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
