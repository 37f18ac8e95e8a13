"""The one wiring of an evaluation: context, judge, engine. ``saasbench evaluate``, a trial and the
evaluate flow all call :func:`evaluate`, so none of them can drop the judge, the workspace or the
database (each used to build its own context)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine, EngineOptions

if TYPE_CHECKING:
    from saasbench.dag import Dag
    from saasbench.evaluation.results import NodeResult, RunReport
    from saasbench.services.auth import AuthProfile


def evaluate(
    dag: Dag,
    target: Target,
    *,
    options: RunOptions | None = None,
    auth_profile: AuthProfile | None = None,
    variables: Mapping[str, Any] | None = None,
    judge: Any = None,
    engine_options: EngineOptions | None = None,
    on_node: Callable[[NodeResult], None] | None = None,
) -> RunReport:
    """Score the app ``target`` points at with ``dag``. ``judge`` (a :class:`saasbench.services.judge.Judge`)
    scores llm-judge nodes; without one they are SKIPPED_LLM and gather no evidence."""
    options = dataclasses.replace(options or RunOptions(), judge_enabled=judge is not None)
    ctx = RunContext(
        target, options=options, auth_profile=auth_profile, variables=variables or {}, env_defaults=dag.env_defaults
    )
    ctx.judge = judge
    return Engine(dag, ctx, engine_options).run(on_node=on_node)
